"""qkv_gate_gemm at T = 1, 3 and 8: flat split-K MMA tiles (every load of a program up front, no K loop, many programs
per SM; the SPLITS partials of a row tile summed in K order by the last to arrive), forced config by config
beside flat_gemv's autotuned kernel (swap_ab's MMA ring at T >= 2, the flat GEMV at T = 1) and cuBLAS, timed
as CUDA-graph replays (20 calls x 10 replays, median of 3 rounds, 3 rotated 147 MB weights) in one process.
Usage (repository root): python qkv_split_sweep.py OUT.jsonl  (TRITON_INTERPRET=1: a tiny CPU check only)"""
import importlib.util
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _split_kernel(x_ptr, w_ptr, out_ptr, part_ptr, sem_ptr, T, N, stride_xt, stride_wn, stride_ot,
                  D: tl.constexpr, ROWS: tl.constexpr, KSPLIT: tl.constexpr, SPLITS: tl.constexpr,
                  BLOCK_T: tl.constexpr, SWAP: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()  # launched as a programmatic dependent: nothing is read before the previous kernel completes
    pid = tl.program_id(0)
    tile = pid // SPLITS  # the splits of one row tile are neighbours: together they read whole rows
    s = pid % SPLITS
    offs_n = tile * ROWS + tl.arange(0, ROWS)
    offs_k = s * KSPLIT + tl.arange(0, KSPLIT)
    offs_t = tl.arange(0, BLOCK_T)
    n_ok, k_ok, t_ok = offs_n < N, offs_k < D, offs_t < T
    policy: tl.constexpr = "evict_first" if EVICT else ""
    w_NK = tl.load(w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                   mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy=policy)  # fmt: skip
    x_TK = tl.load(x_ptr + offs_t[:, None] * stride_xt + offs_k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
    if SWAP:
        acc_NT = tl.trans(tl.dot(x_TK, tl.trans(w_NK)))
    else:
        acc_NT = tl.dot(w_NK, tl.trans(x_TK))
    out_ptrs = out_ptr + offs_t[None, :] * stride_ot + offs_n[:, None]
    out_mask = n_ok[:, None] & t_ok[None, :]
    if SPLITS == 1:
        tl.store(out_ptrs, acc_NT.to(tl.bfloat16), mask=out_mask)
    else:
        elems = tl.arange(0, ROWS)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        tile_ws = part_ptr + tile.to(tl.int64) * (SPLITS * ROWS * BLOCK_T)
        tl.store(tile_ws + s * (ROWS * BLOCK_T) + elems, acc_NT)
        tl.debug_barrier()  # every thread's partial precedes the single-thread release
        arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            total_NT = tl.zeros((ROWS, BLOCK_T), dtype=tl.float32)
            for i in tl.static_range(SPLITS):  # K order: the same sum whatever the arrival order
                total_NT += tl.load(tile_ws + i * (ROWS * BLOCK_T) + elems, cache_modifier=".cg")
            tl.store(out_ptrs, total_NT.to(tl.bfloat16), mask=out_mask)
            tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")


_WS = {}


def split_gemm(x, w, rows, ksplit, warps, swap, evict, pdl=False):
    T, D = x.shape
    N = w.shape[0]
    block_t = max(8, triton.next_power_of_2(T))
    splits = triton.cdiv(D, ksplit)
    tiles = triton.cdiv(N, rows)
    key = (x.device, tiles * splits * rows * block_t, tiles)
    if key not in _WS:
        _WS[key] = (torch.empty(key[1], dtype=torch.float32, device=x.device),
                    torch.zeros(tiles, dtype=torch.int32, device=x.device))
    part, sem = _WS[key]
    out = torch.empty(T, N, dtype=torch.bfloat16, device=x.device)
    _split_kernel[(tiles * splits,)](x, w, out, part, sem, T, N, x.stride(0), w.stride(0), out.stride(0), D=D,
                                     ROWS=rows, KSPLIT=ksplit, SPLITS=splits, BLOCK_T=block_t, SWAP=swap,
                                     EVICT=evict, PDL=pdl, num_warps=warps, launch_pdl=pdl)  # fmt: skip
    return out


# (ROWS, KSPLIT, warps): 16-64 KB of W per program; KSPLIT 5120 / 5, / 10, / 20 and a ragged 2048.
CONFIGS = [(16, 1024, 4), (16, 1024, 2), (16, 512, 2), (16, 512, 4), (32, 512, 4), (32, 1024, 4), (32, 256, 4),
           (64, 256, 4), (64, 512, 4), (64, 512, 8), (16, 2048, 4), (32, 1024, 8), (128, 256, 8)]

if INTERPRET:
    from harness import interpreter_patches

    interpreter_patches.apply()  # the stock interpreter multiplies BF16 operands' raw bits
    torch.manual_seed(0)
    for T, N, D in ((1, 40, 96), (3, 40, 96), (8, 33, 160)):
        x, w = torch.randn(T, D).bfloat16(), torch.randn(N, D).bfloat16()
        ref = x.double() @ w.double().T
        for rows, ksplit, warps in ((16, 32, 4), (32, 64, 4), (16, 256, 4)):
            for swap in (False, True):
                for _ in range(2):  # the second call finds the counters left zeroed
                    got = split_gemm(x, w, rows, ksplit, warps, swap, True).double()
                    err = ((got - ref).norm() / ref.norm()).item()
                    assert err < 5e-3, (T, N, D, rows, ksplit, swap, err)
    print("interpreter check passed")
    sys.exit(0)

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


def timed(fn):
    return round(statistics.median(graph_us(fn) for _ in range(3)), 3)


spec = importlib.util.spec_from_file_location("flat_gemv", "candidate_kernels/qkv_gate_gemm/flat_gemv.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
dev = torch.device("cuda")
N, D, NW = 14336, 5120, 3
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
i = [0]


def rot():
    i[0] = (i[0] + 1) % NW
    return i[0]


for T in (8, 3, 1):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NW)]
    ref = xs[0].double() @ ws[0].double().T

    def err(y):
        return round(((y.double() - ref).norm() / ref.norm()).item(), 7)

    m.qkv_gate_proj(xs[0], ws[0])
    emit(T=T, what="baselines", cublas_us=timed(lambda xs=xs: F.linear(xs[i[0]], ws[rot()])),
         flat_gemv_us=timed(lambda xs=xs: m.qkv_gate_proj(xs[i[0]], ws[rot()])),
         cublas_err=err(F.linear(xs[0], ws[0])), flat_gemv_err=err(m.qkv_gate_proj(xs[0], ws[0])))  # fmt: skip
    rows = []
    for r, k, nw in CONFIGS:
        for swap in (False, True):
            for evict in (True, False) if (r, k, nw) == (16, 1024, 4) else (True,):
                try:
                    e = err(split_gemm(xs[0], ws[0], r, k, nw, swap, evict))
                    us = timed(lambda xs=xs: split_gemm(xs[i[0]], ws[rot()], r, k, nw, swap, evict))
                    rows.append((us, (r, k, nw, swap, evict), e))
                except Exception as ex:
                    emit(T=T, what="failed", config=(r, k, nw, swap, evict), error=f"{type(ex).__name__}: {str(ex)[:300]}")
    for us, cfg, e in sorted(rows):
        emit(T=T, what="split", us=us, rows_ksplit_warps_swap_evict=cfg, rel_err_fp64=e)
    for us, cfg, e in sorted(rows)[:4]:  # the four fastest again, launched as programmatic dependents
        try:
            e = err(split_gemm(xs[0], ws[0], *cfg, pdl=True))
            emit(T=T, what="split_pdl", us=timed(lambda xs=xs, cfg=cfg: split_gemm(xs[i[0]], ws[rot()], *cfg, pdl=True)),
                 without_pdl_us=us, rows_ksplit_warps_swap_evict=cfg, rel_err_fp64=e)  # fmt: skip
        except Exception as ex:
            emit(T=T, what="failed_pdl", config=cfg, error=f"{type(ex).__name__}: {str(ex)[:300]}")
    emit(T=T, what="baselines_again", cublas_us=timed(lambda xs=xs: F.linear(xs[i[0]], ws[rot()])),
         flat_gemv_us=timed(lambda xs=xs: m.qkv_gate_proj(xs[i[0]], ws[rot()])))  # fmt: skip
