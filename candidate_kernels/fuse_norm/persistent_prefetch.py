"""fuse_norm, persistent programs: weights held in registers, the next row prefetched.

Author: human (kernels team, issue 4), hand-written. Sibling of row_per_program.py (same math,
same exact head + tail row split); this one changes the schedule.

Why it should be faster than one program per row at T = 16384: a program per row re-reads both
norm weights (20 KB) from L1/L2 for every row and, between issuing its loads and its last store,
keeps the SM's memory pipe busy only through other programs. Here a fixed grid of
PROGRAMS_PER_SM x #SMs programs each walks rows pid, pid + grid, ...: the weights are loaded once
per program and stay in registers, and the loads of the next row are issued before the current
row is normalized, so every program always has a row in flight while it computes. At T = 1 it
degenerates to the row kernel (one program, nothing to prefetch).

Floor (bytes / 4275 GB/s, bytes = 4*T*D*2 + 2*D*2, D = 5120):
  T=1      41 KB   -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  671 MB  -> 157.0 us (goal <= 165 us, >= 95% of the copy ceiling)
Measured on the H200 (first session, commit 000ef05; results/README.md): p50 T=1 3.08 us, T=3 7.92, T=8 4.02,
  T=64 13.75, T=1000 98.3, T=16384 245.6 us (68% of the copy floor); reference 39.4 / 3387 us.
  Goals missed: 2.3 us at T=1 (by 0.8 us), 165 us at T=16384 (by 81 us). The single-bucket
  outliers (T=3, T=64) most likely came from autotuning choices cached by parity children that
  share the GPU (inferred, not measured); the harness no longer keeps those (aa5ef49).
Third session (commit 73ee016, bench.max_seconds=3): T=1 3.13, T=3 3.51, T=8 3.83, T=64 4.54,
  T=1000 98.4, T=16384 243.0 us; beyond noise faster than every baseline at T <= 64 (torch.compile
  3.29 us at T=1), not at T=1000 / 16384 (compile 92.9 / 235.4 us; event windows then included the
  benchmark child's launch time, removed since 2ba66b8). The outliers of the first session are gone.
  Config sweep (plain process): PROGRAMS_PER_SM=2 with 4 warps is the fastest config at every shape
  (T=16384: 204 us; 1 program of 8 / 16 warps: 808 / 1436 us).
Fourth session (GPU held during event windows; results/README.md), against torch.compile timed in
  the same child: commit 0133681 T=1 3.63 / 3.28 us (the autotuner picked 16 warps), T=8 3.91 /
  4.23, T=64 4.57 / 5.29, T=1000 23.08 / 23.42, T=16384 188.7 / 197.2 us (84% of the copy floor;
  goal 165 us missed by 24 us). With decode-size configs tuned as graph replays (commit 8769800):
  T=1 3.41 / 3.40 us with 4 warps (goal 2.3 us missed by 1.1 us; a tie with compile), T=3 3.55 /
  3.65, T=1000 22.81 / 22.98 (ties), T=8, 64, 16384 faster beyond noise. Not promoted.
Fifth session (commit d73d845, the 4-warp configs folding their reductions again as at 73ee016):
  the autotuner took (2 programs per SM, 4 warps, folded) for every bucket. Against the in-child
  compile: T=1 3.41 / 3.61 us, T=8 4.15 / 4.60, T=64 4.89 / 5.81 (faster beyond noise); T=3 3.80 /
  3.89, T=1000 35.87 / 35.10, T=16384 207.0 / 214.0 (not). Folding cost T=16384 19 us (187.7
  unfolded at 8769800), so the 4-warp config is offered both ways now; not yet run on a GPU.
Sixth session (commit 1062fb4, event windows of >= 2 ms): the autotuner took the unfolded 4-warp
  config at T=16384 and the folded one elsewhere. Against the in-child compile: T=1 3.17 / 3.32 us,
  T=8 4.03 / 4.31, T=64 4.71 / 5.65, T=1000 13.93 / 14.73, T=16384 183.32 / 189.89 (86% of the copy
  floor; goal 165 us missed by 18 us) faster beyond noise; T=3 3.48 / 3.57 not (1.03x). Not promoted.

Numerics: identical to row_per_program.py (reference_model/ops.py norm_residual_norm):
  post = bf16((y * rsqrt(mean(y^2) + eps)) * w_post)        rounding point 1
  h'   = bf16(f32(h) * a + f32(post) * b)                   rounding point 2
  x    = bf16((f32(h') * rsqrt(mean(h'^2) + eps)) * w_pre)  rounding point 3
torch's operation order, no FMA contraction (enable_fp_fusion=False), mean(x^2) from the exact
sum of squares (FP64 accumulation of the exact FP32 squares of BF16 values: order-independent,
correctly rounded), a and b rounded from double to FP32 like torch's scalar, libdevice rsqrt on
the GPU (tl.rsqrt under the interpreter, which has no libdevice).

Launch: grid = min(T, PROGRAMS_PER_SM x #SMs); (PROGRAMS_PER_SM, num_warps, FOLD) autotuned per
(D, T bucket), decode-size buckets timed as CUDA-graph replays (_time_config). Registers per
program hold the weights, the current row and the prefetched one (as BF16), so fewer programs
fit per SM than for the row kernel: the autotuner weighs that against the saved weight traffic.

Shape legend: T tokens, D hidden.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "row_per_program",
    "idea": "persistent programs walk rows with a stride: norm weights kept in registers, next row prefetched",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if _INTERPRET:

    @triton.jit
    def _rsqrt(x):
        return tl.rsqrt(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)


# On the CPU there are no SMs; two "SMs" give the CPU shapes (T = 1..5) a row loop of several
# iterations per program, so the prefetch and its end-of-rows mask are exercised.
_CPU_SMS = 2


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"PROGRAMS_PER_SM": 1, "FOLD": True}, num_warps=4)]  # CI forces the GPU configs too
    # Registers per thread at D = 5120 (`harness inspect`, T=16384): 4 warps 242, 8: 158, 16: 100. Only the
    # 4-warp program fits twice in an SM's 64K registers; a program that is not resident at once
    # would run its rows late, so no config asks for more programs per SM than fit. Two capped
    # configs trade spills for more rows in flight (T = 1000 ran at 42% of the copy floor, 16384 at
    # 84%): 8 warps at 128 registers spill 28 bytes per thread and fit twice; 4 warps at 168 spill
    # 168 bytes and fit three times (4 at 128 would spill 324: left out).
    # The fold of _mean_of_squares only at 4 warps, where its layouts meet without shared memory; both
    # ways there: folded, every bucket took it on the H200 (d73d845), and T = 16384 went from 187.7 us
    # unfolded (8769800) to 207.0.
    shapes = ((1, 8, None, False), (1, 16, None, False), (2, 4, None, True), (2, 4, None, False),
              (2, 8, 128, False), (3, 4, 168, True))  # fmt: skip
    return [triton.Config({"PROGRAMS_PER_SM": p, "FOLD": f}, num_warps=w, maxnreg=r) for p, w, r, f in shapes]


def _prune(configs, named_args, **kwargs):
    """Keep the warp counts that give each thread 8..64 elements of a row; for a tiny row, the fewest."""
    n_cols = kwargs["N_COLS"]
    fit = [c for c in configs if 8 <= n_cols // (32 * c.num_warps) <= 64]
    return fit or [min(configs, key=lambda c: c.num_warps)]


# How the autotuner times a config. Few rows: as a CUDA-graph replay, the way a decode step runs it
# and the harness times it. Triton's default (an event pair around each launch) counts the launch
# there: on the H200 it ranked 16 and 8 warps first at T = 1, 3 and 64 (fourth session), where
# 4 warps replay faster (T = 1: 3.63 us at 16 warps, 3.41 at 4 timed this way). Many rows: the default.
_GRAPH_TIMED_ROWS = 64
_tuning_rows = [0]  # the rows bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_rows[0] <= _GRAPH_TIMED_ROWS:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def _rows_bucket(T: int) -> int:
    """Autotuning key for the row count: the next power of two, capped (1, 4, 8, 64, 1024, 16384)."""
    return min(triton.next_power_of_2(T), 16384)


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a cached host-side query: no sync, graph-safe)."""
    if device.type != "cuda":
        return _CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _row_split(D: int) -> tuple[int, int, bool]:
    """Split a row of D into a head of HEAD_ROWS x WIDTH (the largest power of two <= D) and, when D
    is not a power of two, a masked tail of WIDTH = next_pow2(D - head) columns
    (D = 5120 = 4 x 1024 + 1024: no padded lane; see row_per_program.py)."""
    head = 1 << (D.bit_length() - 1)
    if head == D:
        width = min(D, 1024)
        return D // width, width, False
    width = triton.next_power_of_2(D - head)
    return head // width, width, True


@triton.jit
def _mean_of_squares(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr, FOLD: tl.constexpr):
    """mean(x^2) over the row, FP32, from the EXACT sum: x holds BF16 values, whose squares are exact
    in FP32 and whose sum of a few thousand is exact in FP64, so the result is the correctly rounded
    mean, whatever the summation order (warps, configs, devices). Two orders, chosen per config:
    FOLD: the head's rows fold onto the tail's columns first, so the row costs one block-wide
    reduction: at 4 warps, 32 bytes of shared memory and 6 barriers per program (`harness inspect`);
    on the H200 T = 1 took 3.13 us folded (commit 73ee016) and 3.41 us reduced apart (8769800).
    Not FOLD: head and tail are reduced to a scalar each. At 8 and 16 warps the fold made Triton
    move the [WIDTH] FP64 partials between their two layouts through shared memory (16 KB and 19
    barriers per program at 8 warps, by an offline sm_90 compile), and those configs ran 3.7x and
    7x slower than 4 warps; reduced apart they need 128 bytes of shared memory."""
    if FOLD:
        partial = tl.sum((head * head).to(tl.float64), axis=0)
        if HAS_TAIL:
            partial += (tail * tail).to(tl.float64)
        total = tl.sum(partial, axis=0)
    else:
        total = tl.sum(tl.sum((head * head).to(tl.float64), axis=1), axis=0)
        if HAS_TAIL:
            total += tl.sum((tail * tail).to(tl.float64), axis=0)
    return (total / N_COLS).to(tl.float32)


@triton.jit
def _load_row(row_ptr, stride_d, head_cols, tail_cols, tail_mask, valid, HAS_TAIL: tl.constexpr):
    """One row's head and tail as loaded (BF16), all lanes masked off when `valid` is false (the
    prefetch past the last row). Read once: evict_first keeps the weights' L1 lines."""
    head = tl.load(row_ptr + head_cols * stride_d, mask=valid, other=0.0, eviction_policy="evict_first")
    tail = head  # placeholder; only read when HAS_TAIL
    if HAS_TAIL:
        tail = tl.load(row_ptr + tail_cols * stride_d, mask=tail_mask & valid, other=0.0, eviction_policy="evict_first")
    return head, tail


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _fuse_norm_persistent_kernel(
    y_ptr,
    h_ptr,
    post_w_ptr,
    pre_w_ptr,
    h_out_ptr,
    x_out_ptr,
    n_rows,
    stride_y_t,
    stride_y_d,
    stride_h_t,
    stride_h_d,
    coef_h,
    coef_post,
    eps,
    rows_bucket,  # read only by the autotuner's key
    N_COLS: tl.constexpr,
    HEAD_ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,  # read by the launcher's grid
    FOLD: tl.constexpr,  # how a row's sum of squares is reduced (_mean_of_squares)
):
    head_cols = tl.arange(0, HEAD_ROWS)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    tail_cols = HEAD_ROWS * WIDTH + tl.arange(0, WIDTH)
    tail_mask = tail_cols < N_COLS

    # The weights, once per program; they stay in registers for every row it handles.
    post_w_head = tl.load(post_w_ptr + head_cols).to(tl.float32)
    pre_w_head = tl.load(pre_w_ptr + head_cols).to(tl.float32)
    post_w_tail = post_w_head  # placeholders; only read when HAS_TAIL
    pre_w_tail = pre_w_head
    if HAS_TAIL:
        post_w_tail = tl.load(post_w_ptr + tail_cols, mask=tail_mask, other=0.0).to(tl.float32)
        pre_w_tail = tl.load(pre_w_ptr + tail_cols, mask=tail_mask, other=0.0).to(tl.float32)

    first = tl.program_id(0)
    step = tl.num_programs(0)
    y_head, y_tail = _load_row(
        y_ptr + first.to(tl.int64) * stride_y_t, stride_y_d, head_cols, tail_cols, tail_mask, first < n_rows, HAS_TAIL
    )
    h_head, h_tail = _load_row(
        h_ptr + first.to(tl.int64) * stride_h_t, stride_h_d, head_cols, tail_cols, tail_mask, first < n_rows, HAS_TAIL
    )
    for row in range(first, n_rows, step):
        # Prefetch the next row of this program before touching the current one.
        nxt = row + step
        nxt64 = tl.cast(nxt, tl.int64)
        y_head_next, y_tail_next = _load_row(
            y_ptr + nxt64 * stride_y_t, stride_y_d, head_cols, tail_cols, tail_mask, nxt < n_rows, HAS_TAIL
        )
        h_head_next, h_tail_next = _load_row(
            h_ptr + nxt64 * stride_h_t, stride_h_d, head_cols, tail_cols, tail_mask, nxt < n_rows, HAS_TAIL
        )
        out_offset = tl.cast(row, tl.int64) * N_COLS

        # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1); masked lanes are 0.
        y_head32 = y_head.to(tl.float32)
        y_tail32 = y_tail.to(tl.float32)
        inv_rms_y = _rsqrt(_mean_of_squares(y_head32, y_tail32, N_COLS, HAS_TAIL, FOLD) + eps)
        post_head = (y_head32 * inv_rms_y * post_w_head).to(tl.bfloat16)
        # Depth-scaled residual: h*a and post*b each rounded to FP32, then the add (rounding point 2).
        h_new_head = (h_head.to(tl.float32) * coef_h + post_head.to(tl.float32) * coef_post).to(tl.bfloat16)
        tl.store(h_out_ptr + out_offset + head_cols, h_new_head)
        h_new_tail = h_new_head
        if HAS_TAIL:
            post_tail = (y_tail32 * inv_rms_y * post_w_tail).to(tl.bfloat16)
            h_new_tail = (h_tail.to(tl.float32) * coef_h + post_tail.to(tl.float32) * coef_post).to(tl.bfloat16)
            tl.store(h_out_ptr + out_offset + tail_cols, h_new_tail, mask=tail_mask)

        # Pre-norm of sublayer k+1 on the rounded stream (rounding point 3).
        h_new_head32 = h_new_head.to(tl.float32)
        h_new_tail32 = h_new_tail.to(tl.float32)
        inv_rms_h = _rsqrt(_mean_of_squares(h_new_head32, h_new_tail32, N_COLS, HAS_TAIL, FOLD) + eps)
        tl.store(x_out_ptr + out_offset + head_cols, (h_new_head32 * inv_rms_h * pre_w_head).to(tl.bfloat16))
        if HAS_TAIL:
            x_tail = (h_new_tail32 * inv_rms_h * pre_w_tail).to(tl.bfloat16)
            tl.store(x_out_ptr + out_offset + tail_cols, x_tail, mask=tail_mask)

        y_head, y_tail, h_head, h_tail = y_head_next, y_tail_next, h_head_next, h_tail_next


def norm_residual_norm(
    y_TD: torch.Tensor,
    h_TD: torch.Tensor,
    post_weight_D: torch.Tensor,
    pre_weight_D: torch.Tensor,
    n: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (h', x) as the reference does: the new residual stream and the next sublayer's input."""
    if n < 2:
        raise ValueError(f"residual addition index n must be >= 2 (the embedding is n = 1); got {n}")
    if y_TD.dim() != 2 or y_TD.shape != h_TD.shape:
        raise ValueError(f"y_TD and h_TD must both be [T, D]; got {tuple(y_TD.shape)} and {tuple(h_TD.shape)}")
    T, D = y_TD.shape
    if post_weight_D.shape != (D,) or pre_weight_D.shape != (D,):
        raise ValueError(
            f"norm weights must be [{D}]; got {tuple(post_weight_D.shape)} and {tuple(pre_weight_D.shape)}"
        )
    # ops.residual_coefficients, in double; the kernel argument rounds them to FP32 like torch.
    coef_h, coef_post = math.sqrt((n - 1) / n), 1.0 / math.sqrt(n)
    head_rows, width, has_tail = _row_split(D)

    h_new_TD = torch.empty((T, D), dtype=torch.bfloat16, device=y_TD.device)
    x_TD = torch.empty((T, D), dtype=torch.bfloat16, device=y_TD.device)
    if T == 0:
        return h_new_TD, x_TD
    n_sms = _sm_count(y_TD.device)

    def grid(meta):
        return (min(T, meta["PROGRAMS_PER_SM"] * n_sms),)

    _tuning_rows[0] = _rows_bucket(T)
    _fuse_norm_persistent_kernel[grid](
        y_TD,
        h_TD,
        post_weight_D.contiguous(),
        pre_weight_D.contiguous(),
        h_new_TD,
        x_TD,
        T,
        y_TD.stride(0),
        y_TD.stride(1),
        h_TD.stride(0),
        h_TD.stride(1),
        coef_h,
        coef_post,
        eps,
        _rows_bucket(T),
        N_COLS=D,
        HEAD_ROWS=head_rows,
        WIDTH=width,
        HAS_TAIL=has_tail,
        enable_fp_fusion=False,
    )
    return h_new_TD, x_TD
