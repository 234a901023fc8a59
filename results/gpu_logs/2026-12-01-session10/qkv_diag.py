"""qkv_gate_gemm/tma_swap on the H200: read-bandwidth ceiling, autotuner timings per config, graph-replay
time of the winner against F.linear (cuBLAS) in one process. Usage: python qkv_diag.py OUT.jsonl"""
import json, sys, statistics, importlib.util
import torch, triton, triton.language as tl
import torch.nn.functional as F

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

@triton.jit
def _read(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(part_ptr + tl.program_id(0), tl.sum(v.to(tl.float32)))

def graph_us(fn, calls=20, replays=30):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    for _ in range(3): g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)

dev = torch.device("cuda")
# 1. ceilings: copy and read-only on 1 GiB, and read-only of one 146.8 MB weight
big = torch.randn(512 * 1024 * 1024, device=dev, dtype=torch.bfloat16)
dst = torch.empty_like(big)
emit(what="copy_gbps_1GiB", gbps=2 * big.numel() * 2 / graph_us(lambda: dst.copy_(big), 5, 10) / 1e3)
for block in (4096, 8192, 16384):
    for warps in (4, 8):
        for numel, name in ((big.numel(), "1GiB"), (14336 * 5120, "147MB")):
            parts = torch.empty(triton.cdiv(numel, block), device=dev)
            us = graph_us(lambda: _read[(parts.numel(),)](big, parts, numel, BLOCK=block, num_warps=warps), 10, 10)
            emit(what="read_gbps", size=name, block=block, warps=warps, us=us, gbps=numel * 2 / us / 1e3)
del big, dst
torch.cuda.empty_cache()

spec = importlib.util.spec_from_file_location("tma_swap", "candidate_kernels/qkv_gate_gemm/tma_swap.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
N, D = 14336, 5120
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(3)]
for T in (1, 3, 8, 16, 64, 1000):
    xs = [torch.randn(T, D, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    got = m.qkv_gate_proj(xs[0], ws[0]); ref = F.linear(xs[0], ws[0])
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    timings = sorted((v[0], str(c)) for c, v in (m._qkv_kernel.configs_timings or {}).items())
    emit(what="autotune", T=T, best=str(m._qkv_kernel.best_config), rel_err_vs_cublas=err, timings_us=[(round(t * 1e3, 2), c) for t, c in timings])
    i = [0]
    def cand():
        i[0] = (i[0] + 1) % 3; m.qkv_gate_proj(xs[i[0]], ws[i[0]])
    def cub():
        i[0] = (i[0] + 1) % 3; F.linear(xs[i[0]], ws[i[0]])
    rounds = [(graph_us(cand), graph_us(cub)) for _ in range(3)]
    c_us = statistics.median(r[0] for r in rounds); b_us = statistics.median(r[1] for r in rounds)
    floor = (N * D * 2 + T * D * 2 + T * N * 2) / 4275e3
    emit(what="graph_time", T=T, tma_swap_us=c_us, cublas_us=b_us, floor_us=floor, rounds=rounds)
