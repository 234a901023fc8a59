"""Dump Inductor's Triton code for task references at their GPU shapes (as the harness's compile baseline)."""
import os, sys, time
from pathlib import Path
import torch
import torch._inductor.config as inductor_config
from torch._inductor.utils import run_and_get_code
from tasks import get_task

inductor_config.emulate_precision_casts = True
inductor_config.autotune_local_cache = False
torch._dynamo.config.recompile_limit = 64
out = Path(os.environ["OUT"]) / "inductor"
out.mkdir(parents=True, exist_ok=True)
for name, labels in [("dense_act", None), ("output_gate", None), ("fuse_norm", ["T=1", "T=16384"])]:
    task = get_task(name)
    for shape in task.shapes:
        if labels and shape.label not in labels:
            continue
        args = task.make_inputs(shape, 1, torch.device("cuda"))
        fn = torch.compile(task.reference, dynamic=False)
        t = time.time()
        _, codes = run_and_get_code(fn, **args)
        # time it: graph replay of 50 calls, one input set (indicative only)
        fn(**args); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(50):
                fn(**args)
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        g.replay(); torch.cuda.synchronize()
        s.record(); g.replay(); e.record(); torch.cuda.synchronize()
        us = s.elapsed_time(e) * 1e3 / 50
        label = shape.label.replace("=", "")
        (out / f"{name}_{label}.py").write_text("\n\n# ====\n".join(codes))
        print(f"{name} {shape.label}: {len(codes)} code(s), {time.time()-t:.1f}s, {us:.2f} us/call (graph, warm)", flush=True)
