"""Why are small Triton candidates 0.2-0.6 us slower than torch.compile's kernels at T <= 64?

usage: python .gpu/diag_small.py OUTDIR
For each (task, candidate, shape): per-call us of a 100-call CUDA graph (candidate and compile,
alternating, 15 windows each), then the kernels of one eager call and of one graph replay under the
PyTorch profiler (CUPTI: device durations, grid, block, registers), chrome traces saved to OUTDIR.
"""

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tasks import get_task

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
CASES = [
    ("output_gate", "head_rows", ["T=1", "T=64"]),
    ("dense_act", "tiles", ["T=1"]),
    ("fuse_norm", "persistent_prefetch", ["T=1"]),
]


def load(task, stem):
    path = Path("candidate_kernels") / task / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"diag_{task}_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_of(fn, inputs, calls=100):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(**inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    keep = []
    with torch.cuda.graph(g):
        for _ in range(calls):
            keep.append(fn(**inputs))
    return g, keep


def window_us(g, calls=100, replays=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(replays):
        g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / (calls * replays)


def kernels(trace_path):
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    rows = []
    for ev in events:
        if ev.get("cat") == "kernel":
            a = ev.get("args", {})
            rows.append(
                (ev["name"][:70], ev["dur"], a.get("grid"), a.get("block"), a.get("registers per thread"),
                 a.get("shared memory"), a.get("est. achieved occupancy %"))
            )
    return rows


for task_name, stem, labels in CASES:
    task = get_task(task_name)
    fn = getattr(load(task_name, stem), task.op_name)
    comp = torch.compile(task.reference, dynamic=False)
    for shape in task.shapes:
        if shape.label not in labels:
            continue
        inputs = task.make_inputs(shape, 1, torch.device("cuda"))
        graphs = {name: graph_of(f, inputs) for name, f in (("candidate", fn), ("compile", comp))}
        times = {name: [] for name in graphs}
        for _ in range(15):
            for name, (g, _) in graphs.items():
                times[name].append(window_us(g))
        print(f"\n=== {task_name} {stem} {shape.label}")
        for name, ts in times.items():
            print(f"  graph per-call us {name}: median {statistics.median(ts):.3f} min {min(ts):.3f}")
        for name, f in (("candidate", fn), ("compile", comp)):
            for mode in ("eager", "graph"):
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(5):
                        if mode == "eager":
                            f(**inputs)
                        else:
                            graphs[name][0].replay()
                    torch.cuda.synchronize()
                path = out_dir / f"{task_name}-{shape.label}-{name}-{mode}.json".replace("=", "")
                prof.export_chrome_trace(str(path))
                rows = kernels(path)
                durs = {}
                for r in rows:
                    durs.setdefault(r[0], []).append(r[1])
                print(f"  {name} {mode}: {len(rows)} kernels in 5 calls/replays")
                for k, d in durs.items():
                    meta = next(r for r in rows if r[0] == k)[2:]
                    print(f"    {k}: n={len(d)} median dur {statistics.median(d):.3f} us  grid/block/regs/smem/occ {meta}")
        sys.stdout.flush()
