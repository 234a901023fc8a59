import os, sys, time, traceback
from harness import child

def wrap_loader():
    from torch._inductor import codecache
    orig = codecache.PyCodeCache.load_by_key_path.__func__
    def wrapped(cls, *a, **k):
        try:
            return orig(cls, *a, **k)
        except BaseException:
            print("LOAD FAILED:\n" + traceback.format_exc(), flush=True)
            raise
    codecache.PyCodeCache.load_by_key_path = classmethod(wrapped)

def compile_qk(torch, art, tri):
    from torch._dynamo.utils import counters
    from tasks import get_task
    wrap_loader()
    class R:
        def emit(self, *a, **k): pass
    task = get_task("qk_norm_rope")
    labels = ["sliding T=1", "global T=1", "sliding T=16384"]
    dev = torch.device("cuda"); torch.empty(1, device=dev)
    impls = child.baseline_impls(task, torch, ["torch_compile"], len(labels), R())
    with child.triton_cache_dir(tri):
        print("load:", child.load_compile_artifacts(torch, art), flush=True)
        t1 = time.time()
        for lab in labels:
            impls["torch_compile"](**task.make_inputs(task.shape(lab, dev), 1, dev))
        torch.cuda.synchronize()
    print("compile total", f"{time.time()-t1:.1f}", dict(counters["inductor"]), flush=True)

def run(request, report, layers):
    import torch
    print("uid", os.getuid(), "umask", oct(os.umask(0o077)), flush=True)
    compile_qk(torch, request["art"], request["tri"])
    report.emit("done", violations=[])

if __name__ == "__main__":
    if sys.argv[1] == "plain":
        import torch
        compile_qk(torch, sys.argv[2], sys.argv[3])
    else:
        child.main(sys.argv, run)
