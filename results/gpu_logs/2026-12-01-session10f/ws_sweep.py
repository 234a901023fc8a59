"""Experiment: the swap-AB TMA loop of qkv_gate_gemm/swap_ab with Triton's warp specialization
(tl.range(..., warp_specialize=True): producer warps issue TMA, consumers run wgmma) on the H200, at
decode (T = 1, 8; graph replays) and prefill (T = 1000; events over 20 back-to-back calls), against
F.linear (cuBLAS). Each config compiled and timed in turn; failures are printed, not fatal.
Usage: ws_sweep.py OUT.jsonl"""
import json, sys, statistics
import torch, triton, triton.language as tl
import torch.nn.functional as F

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

@triton.jit
def _k(x_ptr, w_ptr, out_ptr, T, N, D, stride_xt, stride_wn, stride_ot,
       BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
       STAGES: tl.constexpr, WS: tl.constexpr):
    pid = tl.program_id(0)
    t_tiles = tl.cdiv(T, BLOCK_T)
    n_tiles = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_T * n_tiles
    first_t = (pid // per_group) * GROUP_T
    group_rows = tl.minimum(t_tiles - first_t, GROUP_T)
    t0 = (first_t + (pid % per_group) % group_rows) * BLOCK_T
    n0 = ((pid % per_group) // group_rows) * BLOCK_N
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, D], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[T, D], strides=[stride_xt, 1], block_shape=[BLOCK_T, BLOCK_K])
    acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
    for k0 in tl.range(0, D, BLOCK_K, num_stages=STAGES, warp_specialize=WS):
        acc = tl.dot(w_desc.load([n0, k0]), x_desc.load([t0, k0]).T, acc)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_t = t0 + tl.arange(0, BLOCK_T)
    tl.store(out_ptr + offs_t.to(tl.int64)[None, :] * stride_ot + offs_n[:, None], acc.to(tl.bfloat16),
             mask=(offs_n < N)[:, None] & (offs_t < T)[None, :])

def run(x, w, c):
    T, D = x.shape; N = w.shape[0]
    out = torch.empty((T, N), dtype=torch.bfloat16, device=x.device)
    grid = (triton.cdiv(T, c["BLOCK_T"]) * triton.cdiv(N, c["BLOCK_N"]),)
    _k[grid](x, w, out, T, N, D, x.stride(0), w.stride(0), out.stride(0), BLOCK_N=c["BLOCK_N"], BLOCK_T=c["BLOCK_T"],
             BLOCK_K=c["BLOCK_K"], GROUP_T=c["GROUP_T"], STAGES=c["STAGES"], WS=c["WS"], num_warps=c["warps"])
    return out

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

dev = torch.device("cuda")
N, D = 14336, 5120
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(2)]
plans = {
    1: [dict(BLOCK_N=n, BLOCK_T=16, BLOCK_K=k, GROUP_T=1, STAGES=s, warps=w, WS=ws_)
        for n, k, s, w in ((64, 128, 4, 4), (128, 128, 4, 4), (128, 128, 6, 4), (128, 64, 8, 4), (64, 128, 6, 4))
        for ws_ in (False, True)],
    1000: [dict(BLOCK_N=n, BLOCK_T=t, BLOCK_K=k, GROUP_T=8, STAGES=s, warps=w, WS=ws_)
           for n, t, k, s, w in ((128, 128, 64, 4, 8), (128, 128, 64, 4, 4), (256, 128, 64, 3, 8), (128, 256, 64, 3, 8))
           for ws_ in (False, True)],
}
plans[8] = plans[1]
for T in (1, 8, 1000):
    xs = [torch.randn(T, D, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    ref = F.linear(xs[0], ws[0]).float()
    i = [0]
    def cub():
        i[0] ^= 1; F.linear(xs[i[0]], ws[i[0]])
    for c in plans[T]:
        try:
            err = ((run(xs[0], ws[0], c).float() - ref).norm() / ref.norm()).item()
            def cand(c=c):
                i[0] ^= 1; run(xs[i[0]], ws[i[0]], c)
            rounds = [(graph_us(cand), graph_us(cub)) for _ in range(3)]
            emit(T=T, config=c, us=round(statistics.median(r[0] for r in rounds), 3),
                 cublas_us=round(statistics.median(r[1] for r in rounds), 3), rel_err_vs_cublas=err)
        except Exception as e:
            emit(T=T, config=c, error=f"{type(e).__name__}: {str(e)[:300]}")
