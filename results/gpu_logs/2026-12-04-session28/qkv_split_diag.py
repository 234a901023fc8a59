"""Where qkv_split_sweep.py's split-K MMA tiles lose their time, at T = 8: its two fastest configs, each as
  full       the sweep's kernel: W and x loaded up front, one MMA, partial stored, arrival, last arriver's sum
  partials   the same without the arrival and the sum: each program only stores its FP32 partial
  dot_only   each program stores its MMA's result as BF16 into its rows (the splits overwrite each other)
  load_only  no MMA: each program stores the column sums of its W tile (the loads and a reduction)
beside cuBLAS, timed as the sweep times (CUDA-graph replays, 3 rotated weights). Only `full` computes the GEMM.
Usage (repository root): python qkv_split_diag.py OUT.jsonl"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MODES = ("full", "partials", "dot_only", "load_only")


@triton.jit
def _diag_kernel(x_ptr, w_ptr, out_ptr, part_ptr, sem_ptr, T, N, stride_xt, stride_wn, stride_ot,
                 D: tl.constexpr, ROWS: tl.constexpr, KSPLIT: tl.constexpr, SPLITS: tl.constexpr,
                 BLOCK_T: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    tile = pid // SPLITS
    s = pid % SPLITS
    offs_n = tile * ROWS + tl.arange(0, ROWS)
    offs_k = s * KSPLIT + tl.arange(0, KSPLIT)
    offs_t = tl.arange(0, BLOCK_T)
    n_ok, k_ok, t_ok = offs_n < N, offs_k < D, offs_t < T
    w_NK = tl.load(w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                   mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first")  # fmt: skip
    out_ptrs = out_ptr + offs_t[None, :] * stride_ot + offs_n[:, None]
    out_mask = n_ok[:, None] & t_ok[None, :]
    if MODE == 3:  # load_only
        col_N = tl.sum(w_NK.to(tl.float32), axis=1)
        tl.store(out_ptrs, (col_N[:, None] + tl.zeros((ROWS, BLOCK_T), tl.float32)).to(tl.bfloat16), mask=out_mask)
    else:
        x_TK = tl.load(x_ptr + offs_t[:, None] * stride_xt + offs_k[None, :], mask=t_ok[:, None] & k_ok[None, :],
                       other=0.0)  # fmt: skip
        acc_NT = tl.trans(tl.dot(x_TK, tl.trans(w_NK)))
        if MODE == 2:  # dot_only
            tl.store(out_ptrs, acc_NT.to(tl.bfloat16), mask=out_mask)
        else:
            elems = tl.arange(0, ROWS)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
            tile_ws = part_ptr + tile.to(tl.int64) * (SPLITS * ROWS * BLOCK_T)
            tl.store(tile_ws + s * (ROWS * BLOCK_T) + elems, acc_NT)
            if MODE == 0:  # full
                tl.debug_barrier()
                arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
                if arrived == SPLITS - 1:
                    total_NT = tl.zeros((ROWS, BLOCK_T), dtype=tl.float32)
                    for i in tl.static_range(SPLITS):
                        total_NT += tl.load(tile_ws + i * (ROWS * BLOCK_T) + elems, cache_modifier=".cg")
                    tl.store(out_ptrs, total_NT.to(tl.bfloat16), mask=out_mask)
                    tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")


_WS = {}


def run(x, w, rows, ksplit, warps, mode):
    T, D = x.shape
    N = w.shape[0]
    block_t = max(8, triton.next_power_of_2(T))
    splits, tiles = triton.cdiv(D, ksplit), triton.cdiv(N, rows)
    key = (tiles * splits * rows * block_t, tiles)
    if key not in _WS:
        _WS[key] = (torch.empty(key[0], dtype=torch.float32, device=x.device),
                    torch.zeros(tiles, dtype=torch.int32, device=x.device))
    part, sem = _WS[key]
    out = torch.empty(T, N, dtype=torch.bfloat16, device=x.device)
    _diag_kernel[(tiles * splits,)](x, w, out, part, sem, T, N, x.stride(0), w.stride(0), out.stride(0), D=D,
                                    ROWS=rows, KSPLIT=ksplit, SPLITS=splits, BLOCK_T=block_t,
                                    MODE=MODES.index(mode), num_warps=warps)  # fmt: skip
    return out


out_file = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out_file.write(json.dumps(kw) + "\n")
    out_file.flush()


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


dev = torch.device("cuda")
N, D, NW, T = 14336, 5120, 3, 8
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NW)]
i = [0]


def rot():
    i[0] = (i[0] + 1) % NW
    return i[0]


ref = xs[0].double() @ ws[0].double().T
emit(T=T, what="cublas", us=timed(lambda: F.linear(xs[i[0]], ws[rot()])))
for rows, ksplit, warps in ((64, 256, 4), (32, 512, 4)):
    for mode in MODES:
        y = run(xs[0], ws[0], rows, ksplit, warps, mode)
        err = round(((y.double() - ref).norm() / ref.norm()).item(), 7) if mode == "full" else None
        emit(T=T, what=mode, rows_ksplit_warps=(rows, ksplit, warps), rel_err_fp64=err,
             us=timed(lambda rows=rows, ksplit=ksplit, warps=warps, mode=mode: run(xs[i[0]], ws[rot()], rows, ksplit,
                                                                                   warps, mode)))  # fmt: skip
emit(T=T, what="cublas_again", us=timed(lambda: F.linear(xs[i[0]], ws[rot()])))
