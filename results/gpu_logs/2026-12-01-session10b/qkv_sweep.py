"""Every qkv_gate_gemm/tma_swap config forced in turn and timed as CUDA-graph replays (20 calls x 10
replays, median of 3) at T = 1, 8, 64, with F.linear (cuBLAS) timed beside. Usage: qkv_sweep.py OUT.jsonl"""
import json, sys, statistics, importlib.util, itertools
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

spec = importlib.util.spec_from_file_location("tma_swap", "candidate_kernels/qkv_gate_gemm/tma_swap.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
dev = torch.device("cuda")
N, D = 14336, 5120
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(2)]
decode = [(128,128,3,4),(128,128,4,4),(128,128,5,4),(128,128,6,4),(128,64,6,4),(128,64,8,4),(128,64,10,4),
          (128,256,2,4),(128,256,3,4),(64,128,4,4),(64,128,6,4),(64,128,8,4),(64,256,3,4),(64,256,4,4),
          (64,512,2,4),(128,128,4,8),(128,128,6,8),(256,64,4,8),(256,128,3,8),(32,256,4,4),(32,512,3,4)]
for T in (1, 8, 64):
    bt = max(16, T)
    xs = [torch.randn(T, D, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    ref = F.linear(xs[0], ws[0]).float()
    i = [0]
    def cub():
        i[0] ^= 1; F.linear(xs[i[0]], ws[i[0]])
    def cand():
        i[0] ^= 1; m.qkv_gate_proj(xs[i[0]], ws[i[0]])
    emit(T=T, what="cublas", us=statistics.median(graph_us(cub) for _ in range(3)))
    rows = []
    for (n, k, s, w), tma in itertools.product(decode, (True, False)):
        c = triton.Config({"BLOCK_N": n, "BLOCK_T": bt, "BLOCK_K": k, "GROUP_T": 1, "TMA": tma}, num_stages=s, num_warps=w)
        m._qkv_kernel.configs = [c]
        try:
            got = m.qkv_gate_proj(xs[0], ws[0]).float()
            err = ((got - ref).norm() / ref.norm()).item()
            us = statistics.median(graph_us(cand) for _ in range(3))
            rows.append((us, str(c), err))
        except Exception as e:
            emit(T=T, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
    rows.sort()
    for us, c, err in rows:
        emit(T=T, what="config", us=round(us, 3), config=c, rel_err_vs_cublas=err)
    emit(T=T, what="cublas_again", us=statistics.median(graph_us(cub) for _ in range(3)))
