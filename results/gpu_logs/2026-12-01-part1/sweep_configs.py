"""Time every config of every autotuned Triton kernel of every candidate, per GPU shape.

usage: python .gpu/sweep.py OUT.jsonl [task ...]
Each config is forced (autotuner.configs = [config]) and timed with the harness's own timers
(graph replay T <= 64, events + L2 flush above), interleaved with the others of that kernel.
Also times what the autotuner picks on its own (do_bench), and whether each config's output is
bit-identical to the first config's.
"""

import importlib.util
import json
import sys
import time

import torch
from triton.runtime.autotuner import Autotuner

from harness import bench
from harness import candidates as cand_files
from tasks import TASKS, get_task

out_path = sys.argv[1]
names = sys.argv[2:] or sorted(TASKS)
settings = bench.BenchSettings(samples=15, min_samples=8, max_seconds=1.0, warmup_windows=2, graph_calls=50)
DRY = not torch.cuda.is_available()  # CPU dry run of this script (TRITON_INTERPRET=1): calls each impl once
DEVICE = torch.device("cpu" if DRY else "cuda")
if DRY:
    torch.cuda.synchronize = lambda: None

    def _dry_time_shape(task, shape, impls, settings, seed, flush):
        inputs = task.make_inputs(shape, seed, DEVICE)
        return {k: (f(**inputs), 1.0)[1] for k, f in impls.items()}

    bench.time_shape = _dry_time_shape
flush = None if DRY else bench.l2_flush_buffer()
out = open(out_path, "a")


def load(path):
    spec = importlib.util.spec_from_file_location(f"sweep_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def outputs(res):
    return [r for r in (res if isinstance(res, (tuple, list)) else (res,)) if isinstance(r, torch.Tensor)]


for name in names:
    task = get_task(name)
    for cand in cand_files.discover(name, task.op_name):
        mod = load(cand.path)
        launcher = getattr(mod, task.op_name)
        tuners = [(k, v) for k, v in vars(mod).items() if isinstance(v, Autotuner)]
        for shape in task.shapes_for(DEVICE):
            t0 = time.time()
            try:
                inputs = task.make_inputs(shape, 1, DEVICE)
                for tname, at in tuners:
                    all_cfgs = list(at.configs)
                    at.cache_results = False
                    impls = {}
                    ref_out = None
                    same = {}
                    for i, cfg in enumerate(all_cfgs):

                        def fn(_cfg=cfg, _at=at, **kw):
                            _at.configs = [_cfg]
                            return launcher(**kw)

                        try:
                            o = [x.clone() for x in outputs(fn(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}))]
                            torch.cuda.synchronize()
                            if ref_out is None:
                                ref_out = o
                            same[str(cfg)] = all(torch.equal(a, b) for a, b in zip(o, ref_out))
                            impls[str(cfg)] = fn
                        except Exception as e:
                            torch.cuda.synchronize()
                            same[str(cfg)] = f"error {type(e).__name__}: {str(e)[:200]}"
                    # the autotuner's own pick
                    at.configs = all_cfgs
                    at.cache.clear()

                    def auto(_at=at, _all=all_cfgs, **kw):
                        _at.configs = _all
                        return launcher(**kw)

                    auto(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
                    torch.cuda.synchronize()
                    picked = str(at.best_config)
                    impls["autotune"] = auto
                    timings = bench.time_shape(task, shape, impls, settings, 1, flush)
                    row = {
                        "task": name, "candidate": cand.path.stem, "kernel": tname, "shape": shape.label,
                        "picked": picked,
                        "p50_us": {k: (v.p50_us if hasattr(v, "p50_us") else str(v)[:200]) for k, v in timings.items()},
                        "same": same, "seconds": round(time.time() - t0, 1),
                    }
                    at.configs = all_cfgs
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    best = min(((k, v) for k, v in row["p50_us"].items() if isinstance(v, float)), key=lambda kv: kv[1], default=None)
                    print(f"{name}/{cand.path.stem}/{tname} {shape.label}: best {best}, autotune {row['p50_us'].get('autotune')} picked {picked} ({row['seconds']} s)", flush=True)
            except Exception as e:
                torch.cuda.synchronize()
                print(f"{name}/{cand.path.stem} {shape.label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            finally:
                None if DRY else torch.cuda.empty_cache()
