"""qkv_gate_gemm/swap_ab: every decode config it offers, forced in turn, timed as CUDA-graph replays
(20 calls x 10 replays, median of 3 rounds) at T = 1, 8, 64, each round beside F.linear (cuBLAS) timed
the same way. Usage: qkv_sweep2.py OUT.jsonl"""
import json, sys, statistics, importlib.util
import torch, triton
import torch.nn.functional as F

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

spec = importlib.util.spec_from_file_location("swap_ab", "candidate_kernels/qkv_gate_gemm/swap_ab.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
dev = torch.device("cuda")
N, D = 14336, 5120
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(2)]
offered = m._qkv_kernel.configs
for T in (1, 8, 64):
    bucket = m._t_bucket(T)
    xs = [torch.randn(T, D, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    ref = F.linear(xs[0], ws[0]).float()
    i = [0]
    def cub():
        i[0] ^= 1; F.linear(xs[i[0]], ws[i[0]])
    def cand():
        i[0] ^= 1; m.qkv_gate_proj(xs[i[0]], ws[i[0]])
    rows = []
    for c in m._prune(offered, {"t_bucket": bucket, "tma_ok": 1, "N": N, "num_sms": m._sm_count(dev)}):
        m._qkv_kernel.configs = [c]
        got = m.qkv_gate_proj(xs[0], ws[0]).float()
        err = ((got - ref).norm() / ref.norm()).item()
        rounds = [(graph_us(cand), graph_us(cub)) for _ in range(3)]
        rows.append((statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds), str(c), err))
    for us, cub_us, c, err in sorted(rows):
        emit(T=T, us=round(us, 3), cublas_us=round(cub_us, 3), config=c, rel_err_vs_cublas=err)
    m._qkv_kernel.configs = offered
