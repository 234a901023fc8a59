"""Dump Inductor's Triton code for qk_norm_rope's reference at T = 16384 (both layer kinds), as the harness's
compile baseline builds it, and time each as graph replays of 10 calls on one input set (indicative)."""
import os, time
from pathlib import Path
import torch
import torch._inductor.config as inductor_config
from torch._inductor.utils import run_and_get_code
from tasks import get_task

inductor_config.emulate_precision_casts = True
inductor_config.autotune_local_cache = False
torch._dynamo.config.recompile_limit = 64
out = Path(os.environ["L"]) / "inductor"
out.mkdir(parents=True, exist_ok=True)
task = get_task("qk_norm_rope")
for shape in task.shapes:
    if shape.label not in ("sliding T=16384", "global T=16384"):
        continue
    args = task.make_inputs(shape, 1, torch.device("cuda"))
    fn = torch.compile(task.reference, dynamic=False)
    t = time.time()
    _, codes = run_and_get_code(fn, **args)
    fn(**args); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn(**args)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    g.replay(); torch.cuda.synchronize()
    s.record(); g.replay(); e.record(); torch.cuda.synchronize()
    us = s.elapsed_time(e) * 1e3 / 10
    (out / f"qk_norm_rope_{shape.label.replace('=', '').replace(' ', '_')}.py").write_text("\n\n# ====\n".join(codes))
    print(f"{shape.label}: {len(codes)} code(s), {time.time()-t:.1f}s, {us:.2f} us/call (graph, warm, one input set)", flush=True)
