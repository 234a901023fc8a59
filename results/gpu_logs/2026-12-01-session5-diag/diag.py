"""Diagnose torch.compile artifact reuse between two processes (GPU). usage: diag.py A|B DIR"""
import os, sys, time, traceback, shutil
phase, d = sys.argv[1], sys.argv[2]
t0 = time.time()
import torch
from torch._dynamo.utils import counters
from harness import child
from tasks import get_task
if phase == "B":
    from torch._inductor import codecache
    orig = codecache.PyCodeCache.load_by_key_path.__func__
    def wrapped(cls, *a, **k):
        try:
            return orig(cls, *a, **k)
        except BaseException:
            print("LOAD FAILED:\n" + traceback.format_exc(), flush=True)
            raise
    codecache.PyCodeCache.load_by_key_path = classmethod(wrapped)
class R:
    def emit(self, *a, **k): print("emit", a, k)
task = get_task("qk_norm_rope")
labels = ["sliding T=1", "global T=1", "sliding T=16384"]
dev = torch.device("cuda")
torch.empty(1, device=dev)
impls = child.baseline_impls(task, torch, ["torch_compile"], len(labels), R())
if phase == "B":
    print("load:", child.load_compile_artifacts(torch, f"{d}/art.bin"), flush=True)
t1 = time.time()
for lab in labels:
    inputs = task.make_inputs(task.shape(lab, dev), 1, dev)
    ts = time.time(); impls["torch_compile"](**inputs); torch.cuda.synchronize()
    print(phase, lab, f"{time.time()-ts:.2f} s", flush=True)
print(phase, "import", f"{t1-t0:.1f}", "compile total", f"{time.time()-t1:.1f}", dict(counters["inductor"]), flush=True)
if phase == "A":
    print(child.save_compile_artifacts(torch, f"{d}/art.bin"))
