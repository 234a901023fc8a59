"""fuse_norm, one row per program with the whole row in registers.

Author: human (kernels team, issue 4), hand-written.

Why it is faster: the reference makes ~10 passes over [T, D] (two RMSNorms of four kernels each,
the scaled add, the casts), each a kernel launch and a round trip through HBM. Here one program
reads its row of y and h once (16-byte vectors), keeps them in registers through both norms and
the residual add, and writes h' and x once: 8 bytes per element, the least the op can move.

Floor (bytes / 4275 GB/s, bytes = 4*T*D*2 + 2*D*2, D = 5120):
  T=1      41 KB   -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  671 MB  -> 157.0 us (goal <= 165 us, >= 95% of the copy ceiling)
Measured on the H200 (first session, commit 000ef05; results/README.md): p50 T=1 13.35 us, T=3 3.86, T=8 13.31,
  T=64 5.25, T=1000 121.5, T=16384 234.9 us (74% of the copy floor); reference 39.4 / 3387 us,
  flashinfer's RMSNorm pair 14.3 us at T=1. Goals missed: 2.3 us at T=1, 165 us at T=16384.
  The single-bucket outliers most likely came from autotuning choices cached by parity children
  that share the GPU (inferred, not measured); the harness no longer keeps those (aa5ef49).
Third session (commits b4e39ae / 73ee016; results/README.md): config sweep in a plain process,
  T=16384: 1 warp 343 us, 2: 226, 4: 201, 8: 745, 16: 1388 (4 warps fastest at every shape; T=1
  3.9 us). Nsight Compute at T=16384 (4 warps): 177.6 us cold, DRAM 75.4% of peak, 120 registers,
  occupancy 24% (4 programs per SM): the gap to the floor is bytes in flight, held down by
  registers. Capped at 96 registers (73ee016's configs, chosen by the autotuner there): 171.9 us,
  DRAM 78.6%, occupancy 30%, but 6 registers spill (84 MB of local-memory traffic). In the harness
  (bench.max_seconds=3): T=1 3.60, T=8 4.25, T=64 5.28, T=1000 83.4, T=16384 239.2 us, the last two
  with the benchmark child's launch time inside the window (removed since 2ba66b8).

Numerics (reference_model/ops.py norm_residual_norm, BEAM.md §5), FP32 throughout:
  post = bf16((y * rsqrt(mean(y^2) + eps)) * w_post)        rounding point 1
  h'   = bf16(f32(h) * a + f32(post) * b)                   rounding point 2
  x    = bf16((f32(h') * rsqrt(mean(h'^2) + eps)) * w_pre)  rounding point 3
- The same operation order as torch: (x * inv_rms) * w, and h*a and post*b rounded separately
  before the add. LLVM would contract `h*a + post*b` into an FMA, which
  torch's separate kernels never do, so the kernel is launched with enable_fp_fusion=False.
- mean(x^2) is the correctly rounded FP32 mean of the EXACT sum of squares: x holds BF16 values,
  so each square is exact in FP32 (as torch's pow(2) leaves it) and the sum of 5120 of them is
  exact in FP64; the result is the same bits whatever the summation order (warp count, config,
  GPU or interpreter). torch's FP32 sum depends on its order and misses the correctly rounded
  value in the last bit on some rows; such a row's inv_rms differs by an ulp, which flips a few
  BF16 roundings of post. Where h*a and post*b nearly cancel, one flipped post is several ulps
  of h' (measured against torch's CPU order: 4 such elements in 20 calls at T = 64, 57 in one
  call at T = 16384). The 1-ulp policy can only admit that through a reference whose reductions
  are exact (proposed in the report of issue 4); this kernel matches such a reference bit for bit.
- a = sqrt((n-1)/n), b = 1/sqrt(n) are computed in double on the host exactly as
  ops.residual_coefficients does, then rounded to FP32 when passed to the kernel, which is what
  torch does with a Python float scalar multiplying an FP32 tensor.
- rsqrt: libdevice's __nv_rsqrtf on the GPU (the function torch's CUDA rsqrt calls); the
  interpreter has no libdevice, so there it is tl.rsqrt (chosen at import time).

Launch: grid = T programs, one row each, held exactly: a [4, 1024] head plus a [1024] tail for
D = 5120 (see _row_split), so no register holds a padded lane. num_warps is autotuned per
(D, T bucket): T = 1 is one program whose latency is the load plus two block-wide reductions (more
warps = shorter per-thread chains); T = 16384 is 16384 programs, where registers per program
decide how many rows each SM keeps in flight. Configs give each thread 8..64 elements of the row.

Shape legend: T tokens, D hidden.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": None,
    "idea": "one program per row, row held in registers through both RMSNorms and the scaled residual add",
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


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({}, num_warps=4)]
    # Registers per thread (`harness inspect`, D = 5120) and programs per SM they allow: 4 warps 120 (4;
    # Nsight Compute on the H200 agreed: 24% occupancy, DRAM at 75% of peak at T = 16384), 8 warps 77
    # (3), 16 warps 53 (2). Capped: 4 warps at 96 (5 programs; 24 bytes spilled: 171.9 us against
    # 177.6 uncapped under Nsight Compute), 8 warps at 64 (4 programs; 12 bytes spilled).
    capped = [triton.Config({}, num_warps=4, maxnreg=96), triton.Config({}, num_warps=8, maxnreg=64)]
    return [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)] + capped


def _prune(configs, named_args, **kwargs):
    """Keep the warp counts that give each thread 8..64 elements of a row (one to eight 16-byte
    vectors per tensor: fewer wastes lanes, more spills y, h and h'); for a tiny row, the fewest."""
    n_cols = kwargs["N_COLS"]
    fit = [c for c in configs if 8 <= n_cols // (32 * c.num_warps) <= 64]
    return fit or [min(configs, key=lambda c: c.num_warps)]


def _rows_bucket(T: int) -> int:
    """Autotuning key for the row count: the next power of two, capped (1, 4, 8, 64, 1024, 16384)."""
    return min(triton.next_power_of_2(T), 16384)


def _row_split(D: int) -> tuple[int, int, bool]:
    """Split a row of D into a head of HEAD_ROWS x WIDTH (the largest power of two <= D) and, when D
    is not a power of two, a masked tail of WIDTH = next_pow2(D - head) columns.

    D = 5120 = 4 x 1024 + 1024: no padded lane at all, where one next_pow2(D) = 8192 block would
    spend 37.5% of its registers on masked lanes (and registers per row decide how many rows an SM
    keeps in flight at T = 16384).
    """
    head = 1 << (D.bit_length() - 1)
    if head == D:
        width = min(D, 1024)
        return D // width, width, False
    width = triton.next_power_of_2(D - head)
    return head // width, width, True


@triton.jit
def _mean_of_squares(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr):
    """mean(x^2) over the row, FP32, from the EXACT sum: x holds BF16 values, whose squares are exact
    in FP32 and whose sum of a few thousand is exact in FP64, so the result is the correctly rounded
    mean, whatever the summation order (warps, configs, devices). Head and tail are reduced to a
    scalar each: folding the head onto the tail's columns first made Triton move the [WIDTH] FP64
    partials between their two layouts through shared memory (16 KB and 19 barriers per program
    at 8 warps, by `harness inspect`; 8 and 16 warps ran 3.7x and 7x slower than 4 on the
    H200). Reduced separately: 128 bytes of shared memory at any warp count."""
    total = tl.sum(tl.sum((head * head).to(tl.float64), axis=1), axis=0)
    if HAS_TAIL:
        total += tl.sum((tail * tail).to(tl.float64), axis=0)
    return (total / N_COLS).to(tl.float32)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    cache_results=True,
)
@triton.jit
def _fuse_norm_kernel(
    y_ptr,
    h_ptr,
    post_w_ptr,
    pre_w_ptr,
    h_out_ptr,
    x_out_ptr,
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
):
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_y_t
    h_row = h_ptr + row * stride_h_t
    # Head: columns [0, HEAD_ROWS * WIDTH) as a [HEAD_ROWS, WIDTH] tile, always in range: no mask.
    head_cols = tl.arange(0, HEAD_ROWS)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    # Tail: the remaining D - HEAD_ROWS * WIDTH columns, masked (only when D is not a power of two).
    tail_cols = HEAD_ROWS * WIDTH + tl.arange(0, WIDTH)
    tail_mask = tail_cols < N_COLS

    # Every load of the row is issued before any arithmetic so that they overlap. y and h are read
    # once (evict_first); the weights are re-read by every row on the SM and should stay in L1.
    y_head = tl.load(y_row + head_cols * stride_y_d, eviction_policy="evict_first").to(tl.float32)
    h_head = tl.load(h_row + head_cols * stride_h_d, eviction_policy="evict_first").to(tl.float32)
    y_tail = y_head  # placeholders; only read when HAS_TAIL
    h_tail = h_head
    if HAS_TAIL:
        y_tail = tl.load(y_row + tail_cols * stride_y_d, mask=tail_mask, other=0.0, eviction_policy="evict_first")
        h_tail = tl.load(h_row + tail_cols * stride_h_d, mask=tail_mask, other=0.0, eviction_policy="evict_first")
        y_tail = y_tail.to(tl.float32)
        h_tail = h_tail.to(tl.float32)

    # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1). Masked lanes hold 0.
    inv_rms_y = _rsqrt(_mean_of_squares(y_head, y_tail, N_COLS, HAS_TAIL) + eps)
    post_head = (y_head * inv_rms_y * tl.load(post_w_ptr + head_cols, eviction_policy="evict_last").to(tl.float32)).to(
        tl.bfloat16
    )
    # Depth-scaled residual: h*a and post*b each rounded to FP32 before the add (no FMA, see header),
    # the sum rounded to BF16 (rounding point 2) and stored at once.
    h_new_head = (h_head * coef_h + post_head.to(tl.float32) * coef_post).to(tl.bfloat16)
    tl.store(h_out_ptr + row * N_COLS + head_cols, h_new_head)
    h_new_tail = h_new_head
    if HAS_TAIL:
        post_w_tail = tl.load(post_w_ptr + tail_cols, mask=tail_mask, other=0.0, eviction_policy="evict_last")
        post_tail = (y_tail * inv_rms_y * post_w_tail.to(tl.float32)).to(tl.bfloat16)
        h_new_tail = (h_tail * coef_h + post_tail.to(tl.float32) * coef_post).to(tl.bfloat16)
        tl.store(h_out_ptr + row * N_COLS + tail_cols, h_new_tail, mask=tail_mask)

    # Pre-norm of sublayer k+1 reads the rounded stream, as the unfused model does. The tail's
    # masked lanes are 0 (y, h and the weight were loaded as 0 there), so they add nothing.
    h_new_head32 = h_new_head.to(tl.float32)
    h_new_tail32 = h_new_tail.to(tl.float32)
    inv_rms_h = _rsqrt(_mean_of_squares(h_new_head32, h_new_tail32, N_COLS, HAS_TAIL) + eps)
    x_head = (
        h_new_head32 * inv_rms_h * tl.load(pre_w_ptr + head_cols, eviction_policy="evict_last").to(tl.float32)
    ).to(tl.bfloat16)
    tl.store(x_out_ptr + row * N_COLS + head_cols, x_head)  # rounding point 3
    if HAS_TAIL:
        pre_w_tail = tl.load(pre_w_ptr + tail_cols, mask=tail_mask, other=0.0, eviction_policy="evict_last")
        x_tail = (h_new_tail32 * inv_rms_h * pre_w_tail.to(tl.float32)).to(tl.bfloat16)
        tl.store(x_out_ptr + row * N_COLS + tail_cols, x_tail, mask=tail_mask)


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
    _fuse_norm_kernel[(T,)](
        y_TD,
        h_TD,
        post_weight_D.contiguous(),
        pre_weight_D.contiguous(),
        h_new_TD,
        x_TD,
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
