"""qkv_gate_gemm at decode sizes: a flat GEMV (ROWS whole weight rows per program, every load of the row
issued up front, one FP32 tree per row and token, one BF16 rounding) forced over configs at T = 1, 2, 4, 8,
beside the plain read of the weight (the read ceiling), swap_ab's autotuned pick and cuBLAS, all timed as
CUDA-graph replays (20 calls x 10 replays, median of 3 rounds, 3 rotated 147 MB weights) in one process.
Usage (repository root): python qkv_gemv_sweep.py OUT.jsonl"""
import importlib.util, json, statistics, sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

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


@triton.jit
def _read(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(part_ptr + tl.program_id(0), tl.sum(v.to(tl.float32)))


@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, T, N, D: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
          ROWS: tl.constexpr, EVICT: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * D
    offs_h = tl.arange(0, HEAD)
    policy: tl.constexpr = "evict_first" if EVICT else ""
    w_h = tl.load(w_rows + offs_h[None, :], mask=row_ok[:, None], other=0.0, eviction_policy=policy).to(tl.float32)
    if TAIL > 0:
        offs_t = HEAD + tl.arange(0, TAIL)
        t_ok = offs_t < D
        w_t = tl.load(w_rows + offs_t[None, :], mask=row_ok[:, None] & t_ok[None, :], other=0.0,
                      eviction_policy=policy).to(tl.float32)
    for t in range(T):
        x_h = tl.load(x_ptr + t * D + offs_h).to(tl.float32)
        y = tl.sum(w_h * x_h[None, :], axis=1)
        if TAIL > 0:
            x_t = tl.load(x_ptr + t * D + offs_t, mask=t_ok, other=0.0).to(tl.float32)
            y += tl.sum(w_t * x_t[None, :], axis=1)
        tl.store(out_ptr + t * N + rows, y.to(tl.bfloat16), mask=row_ok)


def gemv(x, w, rows, warps, evict):
    T, D = x.shape
    N = w.shape[0]
    head = 1 << (D.bit_length() - 1)
    tail = triton.next_power_of_2(D - head) if D > head else 0
    o = torch.empty((T, N), device=x.device, dtype=torch.bfloat16)
    _gemv[(triton.cdiv(N, rows),)](x, w, o, T, N, D=D, HEAD=head, TAIL=tail, ROWS=rows, EVICT=evict, num_warps=warps)
    return o


spec = importlib.util.spec_from_file_location("swap_ab", "candidate_kernels/qkv_gate_gemm/swap_ab.py")
sab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sab)

dev = torch.device("cuda")
N, D, NW = 14336, 5120, 3
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
parts = torch.empty(triton.cdiv(N * D, 4096), device=dev)
i = [0]


def rot():
    i[0] = (i[0] + 1) % NW
    return i[0]


emit(what="read_ceiling", us=statistics.median(
    graph_us(lambda: _read[(parts.numel(),)](ws[rot()], parts, N * D, BLOCK=4096, num_warps=4)) for _ in range(3)))
CONFIGS = [(r, w, e) for r in (1, 2, 4) for w in (4, 8) for e in (False, True)]
for T in (1, 2, 4, 8):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NW)]
    ref = xs[0].double() @ ws[0].double().T
    sab.qkv_gate_proj(xs[0], ws[0])
    emit(T=T, what="baselines",
         swap_ab_us=statistics.median(graph_us(lambda: sab.qkv_gate_proj(xs[i[0]], ws[rot()])) for _ in range(3)),
         swap_ab_config=str(sab._qkv_kernel.best_config),
         cublas_us=statistics.median(graph_us(lambda: F.linear(xs[i[0]], ws[rot()])) for _ in range(3)),
         cublas_err=((F.linear(xs[0], ws[0]).double() - ref).norm() / ref.norm()).item())
    rows = []
    for r, w, e in CONFIGS:
        try:
            err = ((gemv(xs[0], ws[0], r, w, e).double() - ref).norm() / ref.norm()).item()
            us = statistics.median(graph_us(lambda: gemv(xs[i[0]], ws[rot()], r, w, e)) for _ in range(3))
            rows.append((us, (r, w, e), err))
        except Exception as ex:
            emit(T=T, what="failed", config=(r, w, e), error=f"{type(ex).__name__}: {str(ex)[:200]}")
    for us, c, err in sorted(rows):
        emit(T=T, what="gemv", us=round(us, 3), rows_warps_evict=c, rel_err_fp64=err)
