"""qkv_gate_gemm: swap_ab.py with one token as a flat GEMV: whole weight rows per program, every load up front.

Author: human (kernels team, issue 4), hand-written. Parent: swap_ab.py, whose kernel (W rows as the
MMA's M side, a cp.async ring at T = 2..64, TMA tiles for prefill), configs and launcher it keeps
unchanged for every T but 1.

What changes, and why. At T = 1 swap_ab streams W through a 4-stage cp.async ring in 224 programs of
64 rows (one or two per SM), 36.2-36.5 us, where a plain Triton read of the same 146.8 MB, one program
per 8 KB with all of its loads in flight at once, replays in 33.7-34.0 us. Here one token is that
read plus a multiply: a program owns ROWS (1 or 2) whole rows of W, issues every load of them at once
(5120 columns as a 4096-wide block and a 1024-wide tail: no masked lane, no K loop), multiplies by x
(10 KB that every program reads again, from L1 or L2) and sums each row in one FP32 tree. 14336
programs of 4 warps, many per SM: the GPU's block scheduler keeps the loads in flight that the ring
had to keep by hand.
Measured before this file (twentieth session, `qkv_gemv_sweep.py`, graph replays, 3 rotated weights,
one process): one row per program, 4 warps, W loads marked evict_first: 34.64 us at T = 1, against
swap_ab's autotuned 36.50, cuBLAS's 37.54 and the plain read's 34.00; the same kernel at T = 2, 4, 8
(a loop over tokens, each a block-wide tree) took 43-105 us, so T >= 2 stays on swap_ab's MMA path.

Floor (bytes / 4275 GB/s, bytes = N*D*2 + T*D*2 + T*N*2, N = 14336, D = 5120):
  T=1   146.8 MB -> 34.35 us (goal <= 35.5 us, >= 97% of it)
  T=8   147.0 MB -> 34.39 us (goal <= 35.5 us)
  T=64  149.3 MB -> 34.93 us
  Measured read ceiling: a plain Triton read of one 146.8 MB weight replays in 33.7 us (tenth
  session) and 34.0 us (twentieth).
Measured on the H200 (twentieth session, 922f81e, results/README.md; `harness run task=qkv_gate_gemm
"candidates=[flat_gemv,swap_ab]" bench.max_seconds=3`), p50 us, swap_ab and the packed cuBLAS
reference timed in this file's child:
  T=1 **34.45** / 35.62 / 36.57 (100% of the floor, 105% of the same-bytes launch: goal met by 1.05 us),
  T=3 35.34 / 35.52 / 37.05, T=8 35.85 / 35.84 / 35.82, T=64 37.54 / 37.51 / 39.32, T=1000 230.30 /
  229.42 / 185.08 (T >= 2 is swap_ab's code: the differences there are the run's noise). Its
  autotuner took (1 row, evict_first, 4 warps), the sweep's winner. Nsight Compute, one cold call at
  T=1: 35.7 us, 86.8% of DRAM peak, 148.9 MB from DRAM (the floor's 146.8 plus 1.4%), 31 registers,
  93.1% achieved occupancy, issue slots 52.2% used.
  Again on a later loan, where cuBLAS ran 0.3-0.8 us slower (60cceb9, `"candidates=[flat_gemv]"`):
  T=1 **34.91** against 37.15 (99% of the floor), T=3 35.97 / 37.38, T=8 36.47 / 36.50, T=64 38.09 /
  40.08, T=1000 231.07 / 193.04. Goal at T=1 met in both runs (by 1.05 and 0.59 us).
  Again (fifty-fourth session, 635d834, `"candidates=[flat_gemv,swap_ab]"`, run 20261206T203809-75225f), this
  file / swap_ab / cuBLAS: T=1 **34.44** / 35.33 / 36.73 (met by 1.06), T=8 35.65 / 35.63 / 36.03, T=1000
  229.09 / 228.70 / 186.96. One kernel moving the same bytes took 36.42 / 36.39 us at T = 1 / 8 in this file's
  child: at T = 8 swap_ab's ring already runs at 102% of it and misses the goal by 0.13-0.15 us (0.4%).
  Goal missed at T=8 by 0.13-0.97 us over the three runs: there swap_ab's ring ties cuBLAS or beats it
  by a percent (35.85 / 35.82, 36.47 / 36.50, 35.63 / 36.03). Narrower MMA tiles for T = 3 and 8 (16-32
  rows of W per program on 1-2 warps, 448-896 programs, the GEMV's many-programs shape;
  `qkv_tile_sweep.py`, graph replays) did not beat the
  shipped ones: at T = 8 the best, (16 rows, 128-wide K, 4 stages, 1 warp), took 36.99 us against
  the shipped (128, 128, 4, 4)'s 36.57 and cuBLAS's 36.78 in one process. Nor does a cache policy on
  W's loads, which gained the GEMV 0.2 us at T = 1: swap_ab's 13 decode tiles forced with plain,
  evict_first and evict_first + .cg loads of W (twenty-first session, `qkv_evict_sweep.py`, the
  harness's interleaved graph timer) took 36.15-38.66 us at T = 8, the three policies of a tile within
  0.03 us of each other; the best, (64, 128, 4, 4) in 2 equal runs per SM, against swap_ab's autotuned
  36.29, cuBLAS's 36.57 and the plain read's 33.96. Nor the GEMV's shape with MMAs (twenty-eighth session,
  results/gpu_logs/2026-12-04-session28/): split-K tiles of 16-128 rows x 256-2048 columns of W, every load of
  a program up front and no K loop, the partials summed in K order by the last to arrive, took 43.13 us at
  best at T = 8 (42.70 launched as a programmatic dependent; qkv_split_sweep.py, beside this file's 35.97 and
  cuBLAS's 36.21); the loads of its two fastest tiles alone, with a row sum, took 37.76 and 41.54
  (qkv_split_diag.py): slower than cuBLAS's whole GEMM, and than this file's GEMV reading whole rows at T = 1
  (34.47 in the same sweep).
  Nor this file's ring forced to 8-32 rows with 512-2048-wide K blocks: 38.47 at best against the shipped
  36.23 (qkv_rows_sweep.py). Not promotable: T=1000 is 0.80-0.84x cuBLAS,
  swap_ab's prefill tiles.
  Under Nsight Compute with warp stall reasons (twenty-ninth session, `harness profile
  task=qkv_gate_gemm candidate=flat_gemv`, one cold call per shape): T=1 35.8 us, 14336 programs of 4
  warps, 93% occupancy, DRAM 86.5% of peak, a warp waiting 28.9 cycles per issued instruction, 21.8 of
  them on its loads: the GEMV streams W with every SM full. T=8 38.8 us: 224 programs of 4 warps on 132 SMs
  (so some SMs stream two tiles of W and the others one), 10.6% occupancy, DRAM 80.1%, issue slots 11.3%;
  15.0 cycles per issue, 6.0 on loads, 4.0 at barriers (the ring's stages) and 2.6 on fixed latencies.

Numerics (reference_model/ops.py qkv_gate_proj = F.linear: BF16 in, FP32 accumulation, BF16 out):
- T = 1: each product of two BF16 values is exact in FP32; every lane adds its products over the row's
  4096-wide blocks in K order, the lanes and the tail block are summed in FP32 trees (tl.sum), and the
  total is rounded to BF16 once (round to nearest even): the single rounding point of the reference.
- T >= 2: swap_ab's: BF16 MMAs accumulate in FP32 over K block by block in order, each output is
  rounded to BF16 once. Padding rows, tokens and K columns are zeros (masked loads; TMA fills
  out-of-bounds boxes with zeros), which add exact zeros.
Deterministic run to run; the order differs from cuBLAS's, as any two GEMMs' do: the task judges this
output against FP64 only.

Launch: T = 1: cdiv(N, ROWS) programs; (ROWS, warps, evict_first on W) autotuned per (N, D), timed
as CUDA-graph replays, the winner `_gemv_kernel.best_config`. T >= 2: swap_ab's (one program per
token tile and BLOCK_N rows of W, or per equal run of rows with PROGRAMS_PER_SM > 0; T <= 64 is one
token tile; prefill takes 64-128 token tiles in grouped order, through TMA where the inputs allow),
autotuned per token bucket, decode buckets timed as CUDA-graph replays, the winner
`_qkv_kernel.best_config`. The first call per bucket benchmarks every config (it synchronizes): call
once before capturing a CUDA graph. In-kernel TMA descriptors need a scratch allocation per launch
(128 bytes per descriptor and program): the launcher sets Triton's allocator (a context variable) to
one that takes it from torch's caching allocator on the current stream, so CUDA graph capture works.

Shape legend: T tokens, D hidden (the reduction, K), N packed output rows (q | k | v | gate).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "swap_ab",
    "idea": "swap_ab with one token as a flat GEMV: whole W rows per program, all loads up front, many programs per SM",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config (no autotuning).
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

DECODE_MAX_T = 64  # up to here one token tile covers T and W is read exactly once
SMEM_PER_CTA = 227 * 1024  # H100/H200: the most shared memory one CTA may take
INTERPRETER_SMS = 5  # CPU stand-in for the SM count: N = 192 rows in runs of 39
MIN_TOKEN_TILE = 8  # wgmma's smallest N


def _t_bucket(T: int) -> int:
    """Autotuning key for the token count: T rounded up to a power of two, capped at 1024. Each decode
    bucket is tuned on its own; its token tile is the bucket, at least MIN_TOKEN_TILE."""
    return min(triton.next_power_of_2(T), 1024)


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        # tiny: N = 192, D = 96: a full and a partial row tile, a full and a partial K block.
        return [triton.Config({"BLOCK_N": 128, "BLOCK_T": 16, "BLOCK_K": 64, "GROUP_T": 1, "TMA": True,
                               "PROGRAMS_PER_SM": 0}, num_warps=4)]  # fmt: skip
    # Decode: (BLOCK_N, BLOCK_K, stages, warps, PROGRAMS_PER_SM), plain loads, per token tile: the five
    # fastest of 21 in a graph-timed sweep on the H200 (T = 1, 8, 64) and (128, 64, 6, 4), as row
    # tiles (0), and four of them as equal row runs (1 or 2 programs per SM).
    decode = [
        (64, 128, 4, 4, 0),
        (128, 128, 4, 4, 0),
        (128, 128, 5, 4, 0),
        (128, 128, 4, 8, 0),
        (128, 256, 3, 4, 0),
        (128, 64, 6, 4, 0),
        (128, 128, 4, 4, 1),
        (128, 128, 4, 8, 1),
        (128, 256, 3, 4, 1),
        (64, 128, 4, 4, 2),
    ]
    # Prefill: (BLOCK_N, BLOCK_T, BLOCK_K, stages, warps, TMA), grouped token tiles. TMA won there;
    # the plain one serves inputs TMA cannot take.
    prefill = [(128, 128, 64, 4, 8, True), (256, 128, 64, 3, 8, True), (128, 128, 64, 4, 8, False)]
    configs = [
        triton.Config(
            {"BLOCK_N": n, "BLOCK_T": t, "BLOCK_K": k, "GROUP_T": 1, "TMA": False, "PROGRAMS_PER_SM": p},
            num_stages=s,
            num_warps=w,
        )
        for t in (8, 16, 32, 64)
        for n, k, s, w, p in decode
    ]
    configs += [
        triton.Config(
            {"BLOCK_N": n, "BLOCK_T": t, "BLOCK_K": k, "GROUP_T": 8, "TMA": tma, "PROGRAMS_PER_SM": 0},
            num_stages=s,
            num_warps=w,
        )
        for n, t, k, s, w, tma in prefill
    ]
    return configs


def _smem_estimate(c: triton.Config) -> int:
    """Shared memory of one CTA: num_stages buffers of a W tile and a token tile."""
    return c.num_stages * (c.kwargs["BLOCK_N"] + c.kwargs["BLOCK_T"]) * c.kwargs["BLOCK_K"] * 2


def _equal_run(programs_per_sm: int, N: int, num_sms: int) -> int:
    """Rows in each of programs_per_sm x num_sms equal runs of N rows."""
    return triton.cdiv(N, programs_per_sm * num_sms)


def _rows_per_program(programs_per_sm: int, block_n: int, N: int, num_sms: int) -> int:
    """Rows of W per program (the kernel computes the same): BLOCK_N, or an equal run of at most that."""
    return min(_equal_run(programs_per_sm, N, num_sms), block_n) if programs_per_sm else block_n


def _prune(configs, named_args, **kwargs):
    """A decode bucket keeps the configs whose token tile is the bucket, a prefill bucket the grouped
    ones; TMA configs only where the inputs allow TMA; equal row runs only where a run fits in BLOCK_N
    rows; no CTA beyond the shared memory of an SM."""
    t_bucket, tma_ok, N, num_sms = (named_args[k] for k in ("t_bucket", "tma_ok", "N", "num_sms"))
    prefill = t_bucket > DECODE_MAX_T
    kept = [
        c
        for c in configs
        if (
            (c.kwargs["GROUP_T"] > 1)
            if prefill
            else (c.kwargs["GROUP_T"] == 1 and c.kwargs["BLOCK_T"] == max(MIN_TOKEN_TILE, t_bucket))
        )
        and (tma_ok or not c.kwargs["TMA"])
        and (
            c.kwargs["PROGRAMS_PER_SM"] == 0
            or _equal_run(c.kwargs["PROGRAMS_PER_SM"], N, num_sms) <= c.kwargs["BLOCK_N"]
        )
        and _smem_estimate(c) <= SMEM_PER_CTA
    ]
    if not kept:
        raise ValueError(f"no config for token bucket {t_bucket} with tma_ok={tma_ok} among {len(configs)} offered")
    return kept


# How the autotuner times a config. Decode buckets: as CUDA-graph replays, the way a decode step
# runs the kernel and the harness times it (Triton's default, an event pair around each launch after
# an L2 flush, read the T = 1 configs at 46-48 us where graph replays read 35.5-37.5). Prefill: the
# default.
_tuning_bucket = [0]  # the token bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_bucket[0] <= DECODE_MAX_T:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


# cache_results: the winner is stored in Triton's cache, so later processes on this machine (the
# harness's parity and benchmark children, a model run) use the config that was checked, untuned.
@triton.autotune(
    configs=_configs(),
    key=["t_bucket", "N", "D", "tma_ok"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _qkv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    T,
    N,
    D,
    stride_xt,
    stride_wn,
    stride_ot,
    num_sms,
    t_bucket,  # read only by the autotuner's key and prune
    tma_ok,  # likewise
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr,
    TMA: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,  # 0: a program per BLOCK_N rows; k: k x SMs equal runs of rows
):
    pid = tl.program_id(0)
    t_tiles = tl.cdiv(T, BLOCK_T)
    if PROGRAMS_PER_SM == 0:
        rows = BLOCK_N
    else:
        # Equal runs (the prune keeps configs where one fits in BLOCK_N rows; else more, clamped runs).
        rows = tl.minimum(tl.cdiv(N, PROGRAMS_PER_SM * num_sms), BLOCK_N)
    n_runs = tl.cdiv(N, rows)
    # Grouped order: GROUP_T token tiles take each W row run in turn (one token tile in decode).
    per_group = GROUP_T * n_runs
    first_t = (pid // per_group) * GROUP_T
    group_rows = tl.minimum(t_tiles - first_t, GROUP_T)
    t0 = (first_t + (pid % per_group) % group_rows) * BLOCK_T
    n0 = ((pid % per_group) // group_rows) * rows
    n_end = tl.minimum(n0 + rows, N)

    acc_NT = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
    if TMA:  # prefill configs only (PROGRAMS_PER_SM == 0): a box is BLOCK_N whole rows
        # Out-of-bounds parts of a box (rows past N, tokens past T, columns past D) arrive as zeros.
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, D], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[T, D], strides=[stride_xt, 1], block_shape=[BLOCK_T, BLOCK_K])
        for k0 in range(0, D, BLOCK_K):
            w_NK = w_desc.load([n0, k0])
            x_TK = x_desc.load([t0, k0])
            acc_NT = tl.dot(w_NK, x_TK.T, acc_NT)  # BF16 MMA, FP32 accumulator
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_t = t0 + tl.arange(0, BLOCK_T)
        offs_k = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
        x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt
        for k0 in range(0, D, BLOCK_K):
            k = k0 + offs_k
            w_NK = tl.load(w_rows + k[None, :], mask=(offs_n < n_end)[:, None] & (k < D)[None, :], other=0.0)
            x_TK = tl.load(x_rows + k[None, :], mask=(offs_t < T)[:, None] & (k < D)[None, :], other=0.0)
            acc_NT = tl.dot(w_NK, x_TK.T, acc_NT)

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_t = t0 + tl.arange(0, BLOCK_T)
    out_ptrs = out_ptr + offs_t.to(tl.int64)[None, :] * stride_ot + offs_n[:, None]
    tl.store(out_ptrs, acc_NT.to(tl.bfloat16), mask=(offs_n < n_end)[:, None] & (offs_t < T)[None, :])  # one rounding


GEMV_MAX_T = 1  # the flat GEMV takes one token; from two, a loop of block-wide trees lost to the MMAs
GEMV_BLOCK_K = 4096  # the widest block of a row: 32 FP32 lanes per thread at 4 warps


def _gemv_configs() -> list[triton.Config]:
    """(ROWS, warps, evict_first on W): the sweep's fastest three and their neighbours."""
    if _INTERPRET:
        # two rows per program: the beam-tiny N (a multiple of 2) plus a masked row in the tests
        return [triton.Config({"ROWS": 2, "EVICT": True}, num_warps=4)]
    return [
        triton.Config({"ROWS": rows, "EVICT": evict}, num_warps=warps)
        for rows, warps, evict in ((1, 4, True), (1, 4, False), (2, 4, True), (1, 2, True), (2, 8, True))
    ]


def _gemv_blocks(D: int) -> tuple[int, int]:
    """(BLOCK_K, TAIL): D as whole BLOCK_K blocks (the largest power of two <= D, at most GEMV_BLOCK_K)
    and a masked tail block of the next power of two >= the rest (0 when nothing is left)."""
    block_k = min(1 << (D.bit_length() - 1), GEMV_BLOCK_K)
    rest = D % block_k
    return block_k, triton.next_power_of_2(rest) if rest else 0


# One token is a decode bucket: _time_config times it as CUDA-graph replays, as a decode step runs it.
@triton.autotune(configs=_gemv_configs(), key=["N", "D"], do_bench=_time_config, cache_results=True)
@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    N,
    stride_wn,
    D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TAIL: tl.constexpr,
    ROWS: tl.constexpr,
    EVICT: tl.constexpr,
):
    offs_n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n_ok = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    policy: tl.constexpr = "evict_first" if EVICT else ""  # W is read once: leave L2 to x and the rest
    # Unrolled: every load of the row is issued before the first multiply.
    FULL: tl.constexpr = D // BLOCK_K * BLOCK_K
    acc_NK = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    for k0 in tl.static_range(0, FULL, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w_NK = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0, eviction_policy=policy)
        x_K = tl.load(x_ptr + k)
        acc_NK += w_NK.to(tl.float32) * x_K.to(tl.float32)[None, :]  # exact products, FP32 sums
    y_N = tl.sum(acc_NK, axis=1)
    if TAIL > 0:
        k = FULL + tl.arange(0, TAIL)
        k_ok = k < D
        w_NK = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy=policy)
        x_K = tl.load(x_ptr + k, mask=k_ok, other=0.0)
        y_N += tl.sum(w_NK.to(tl.float32) * x_K.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + offs_n, y_N.to(tl.bfloat16), mask=n_ok)  # one rounding


_SM_COUNT: dict[torch.device, int] = {}


def _sm_count(device: torch.device) -> int:
    """SMs of the device; on the interpreter a small odd stand-in, so that row runs are ragged."""
    if _INTERPRET:
        return INTERPRETER_SMS
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device]


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for in-kernel TMA descriptors, from torch's allocator (graph-capture safe)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA's rules: a 16-byte aligned base, unit stride on the last dim, 16-byte multiple row strides."""
    return all(
        t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors
    )


def qkv_gate_proj(x_TD: torch.Tensor, w_qkvg_ND: torch.Tensor) -> torch.Tensor:
    """[T, N] BF16 = x @ W^T with FP32 accumulation, as ops.qkv_gate_proj (F.linear) computes it."""
    if x_TD.dim() != 2 or w_qkvg_ND.dim() != 2 or x_TD.shape[1] != w_qkvg_ND.shape[1]:
        raise ValueError(
            f"expected x_TD [T, D] and w_qkvg_ND [N, D]; got {tuple(x_TD.shape)} and {tuple(w_qkvg_ND.shape)}"
        )
    if x_TD.dtype != torch.bfloat16 or w_qkvg_ND.dtype != torch.bfloat16:
        raise ValueError(f"expected bfloat16 x_TD and w_qkvg_ND; got {x_TD.dtype} and {w_qkvg_ND.dtype}")
    T, D = x_TD.shape
    N = w_qkvg_ND.shape[0]
    out_TN = torch.empty((T, N), dtype=torch.bfloat16, device=x_TD.device)
    if T == 0 or N == 0:
        return out_TN
    if D == 0:
        return out_TN.zero_()
    # Both load paths index the last dim with unit stride.
    x_TD = x_TD if x_TD.stride(1) == 1 else x_TD.contiguous()
    w_qkvg_ND = w_qkvg_ND if w_qkvg_ND.stride(1) == 1 else w_qkvg_ND.contiguous()
    t_bucket = _tuning_bucket[0] = _t_bucket(T)
    if T <= GEMV_MAX_T:
        block_k, tail = _gemv_blocks(D)
        _gemv_kernel[lambda meta: (triton.cdiv(N, meta["ROWS"]),)](
            x_TD, w_qkvg_ND, out_TN, N, w_qkvg_ND.stride(0), D=D, BLOCK_K=block_k, TAIL=tail
        )
        return out_TN
    tma_ok = _tma_ok(x_TD, w_qkvg_ND)
    if tma_ok and x_TD.is_cuda:
        triton.set_allocator(_scratch)  # a context variable of this thread; cheap to set per call
    num_sms = _sm_count(x_TD.device)

    def grid(meta):
        rows = _rows_per_program(meta["PROGRAMS_PER_SM"], meta["BLOCK_N"], N, num_sms)
        return (triton.cdiv(T, meta["BLOCK_T"]) * triton.cdiv(N, rows),)

    _qkv_kernel[grid](x_TD, w_qkvg_ND, out_TN, T, N, D, x_TD.stride(0), w_qkvg_ND.stride(0), out_TN.stride(0),
                      num_sms, t_bucket, int(tma_ok))  # fmt: skip
    return out_TN
