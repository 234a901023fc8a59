"""router_gemm, vector_width's BF16x3 MMA path at T = 8..64: the shipped configs and new ones (one or two
K blocks per program, all loads up front; deeper pipelines; 10- and 20-way splits) forced in turn, timed as
CUDA-graph replays (20 calls x 10 replays, median of 3 rounds, 16 rotated inputs of 5.2 MB each), beside
the autotuned pick and cuBLAS FP32, in one process. At T = 64 two diagnostic copies of the kernel, whose
outputs are wrong on purpose and only timed, split the split-K tail's cost: `noatomic` publishes the
partials and stops (no arrival counter, no fixup), `nofixup` counts arrivals and never sums.
Usage (repository root): python router_sweep5.py OUT.jsonl"""
import importlib.util, json, statistics, sys, tempfile

import torch
import triton

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


def graph_us(fn, calls=20, replays=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


SRC = open("candidate_kernels/router_gemm/vector_width.py").read()
EDITS = {
    "main": [],
    "noatomic": [('arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")', "arrived = pid_s - SPLIT_K")],
    "nofixup": [("if arrived == SPLIT_K - 1:", "if arrived == -7:")],
}


def load(variant):
    src = SRC
    for a, b in EDITS[variant]:
        assert a in src, a
        src = src.replace(a, b)
    path = f"{tempfile.mkdtemp()}/vw_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"vw_{variant}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def mma(e, k, s, w, st):
    return triton.Config({"USE_MMA": True, "BLOCK_E": e, "BLOCK_K": k, "SPLIT_K": s}, num_warps=w, num_stages=st)


NEW = [
    mma(16, 64, 16, 4, 3), mma(16, 64, 16, 4, 4),  # the shipped T = 64 pick and its 4-stage twin
    mma(16, 64, 16, 4, 5), mma(16, 64, 16, 4, 6), mma(16, 64, 16, 8, 4),
    mma(16, 64, 10, 4, 4), mma(16, 64, 10, 4, 6), mma(16, 64, 20, 4, 4), mma(16, 64, 20, 4, 5),
    mma(16, 128, 20, 4, 2), mma(16, 128, 20, 4, 3), mma(32, 128, 20, 4, 3),
    mma(16, 256, 20, 4, 1), mma(16, 256, 20, 8, 1), mma(32, 256, 20, 4, 1), mma(32, 256, 20, 8, 1),
    mma(16, 512, 10, 4, 1), mma(16, 512, 10, 8, 1),
    mma(16, 128, 40, 2, 1), mma(16, 128, 40, 4, 1), mma(32, 128, 40, 4, 1),
]

torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
E, D, NX = 256, 5120, 16
ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
mods = {v: load(v) for v in EDITS}
m = mods["main"]
shipped = m._router_kernel.configs
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
for T in (8, 16, 32, 64):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
    ref = xs[0].double() @ ws[0].double().T
    for variant in ("main", "noatomic", "nofixup") if T == 64 else ("main",):
        mod = mods[variant]
        i = [0]

        def cand():
            i[0] = (i[0] + 1) % NX
            mod.router_logits(xs[i[0]], ws[i[0]])

        if variant == "main":

            def cub():
                i[0] = (i[0] + 1) % NX
                torch.matmul(xs[i[0]].float(), ws[i[0]].T)

            mod._router_kernel.configs = shipped
            mod.router_logits(xs[0], ws[0])
            emit(T=T, what="autotuned", config=str(mod._router_kernel.best_config),
                 us=statistics.median(graph_us(cand) for _ in range(3)),
                 cublas_us=statistics.median(graph_us(cub) for _ in range(3)))
        rows = []
        for c in NEW:
            mod._router_kernel.configs = [c]
            try:
                got = mod.router_logits(xs[0], ws[0]).double()
                err = ((got - ref).norm() / ref.norm()).item()
                us = statistics.median(graph_us(cand) for _ in range(3))
                rows.append((us, str(c), err))
            except Exception as e:
                emit(T=T, variant=variant, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
        for us, c, err in sorted(rows):
            emit(T=T, variant=variant, what="config", us=round(us, 3),
                 config=c.replace(", num_ctas: 1", "").replace(", maxnreg: None", ""), rel_err_fp64=err)
        mod._router_kernel.configs = shipped
