"""router_gemm: a candidate's FMA configs, each forced in turn, at T = 1, 3, 8, 16 (every config its own
prune keeps for the T bucket), timed as CUDA-graph replays (20 calls x 10 replays, median of 3 rounds,
16 rotated inputs), beside the autotuned picks of the candidate and of the promoted kernel and cuBLAS
FP32 (T = 1, 3, 8, 16, 64), all in one process. Each forced config's error against FP64 is recorded.
Usage: router_sweep4.py OUT.jsonl CANDIDATE PROMOTED"""
import json, sys, statistics, importlib.util
import torch, triton

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

def graph_us(fn, calls=20, replays=10):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)

def load(name):
    spec = importlib.util.spec_from_file_location(name, f"candidate_kernels/router_gemm/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

torch.backends.cuda.matmul.allow_tf32 = False
m, pm = load(sys.argv[2]), load(sys.argv[3])
dev = torch.device("cuda")
E, D = 256, 5120
NX = 16  # rotated inputs: 16 x 5.2 MB of weights, past the 60 MB L2
ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
shipped = m._router_kernel.configs
for T in (1, 3, 8, 16, 64):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
    ref = (xs[0].double() @ ws[0].double().T)
    i = [0]
    def cub():
        i[0] = (i[0] + 1) % NX; torch.matmul(xs[i[0]].float(), ws[i[0]].T)
    def cand():
        i[0] = (i[0] + 1) % NX; m.router_logits(xs[i[0]], ws[i[0]])
    def promoted():
        i[0] = (i[0] + 1) % NX; pm.router_logits(xs[i[0]], ws[i[0]])
    m._router_kernel.configs = shipped
    m.router_logits(xs[0], ws[0]); pm.router_logits(xs[0], ws[0])
    emit(T=T, what="autotuned", config=str(m._router_kernel.best_config), us=statistics.median(graph_us(cand) for _ in range(3)),
         promoted_config=str(pm._router_kernel.best_config), promoted_us=statistics.median(graph_us(promoted) for _ in range(3)),
         cublas_us=statistics.median(graph_us(cub) for _ in range(3)))
    if T > 16:
        continue
    kept = m._prune(shipped, {"t_bucket": m._t_bucket(T), "E": E}, D=D)
    rows = []
    for c in kept:
        if c.kwargs["USE_MMA"]:
            continue
        m._router_kernel.configs = [c]
        try:
            got = m.router_logits(xs[0], ws[0]).double()
            err = ((got - ref).norm() / ref.norm()).item()
            us = statistics.median(graph_us(cand) for _ in range(3))
            rows.append((us, str(c), err))
        except Exception as e:
            emit(T=T, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
    for us, c, err in sorted(rows):
        emit(T=T, what="config", us=round(us, 3), config=c.replace(", num_ctas: 1", "").replace(", maxnreg: None", ""), rel_err_fp64=err)
    m._router_kernel.configs = shipped
