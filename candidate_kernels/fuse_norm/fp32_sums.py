"""fuse_norm: row_warps.py plus plain configs whose sums of squares are FP32, for decode sizes.

Author: human (kernels team, issue 4), hand-written. Parent: row_warps.py (the promoted kernel), whose
persistent programs, TMA ring, plain register-prefetch path, configs, launcher and rounding points
it keeps. The one change: a config may sum a row's squares in FP32 (EXACT = False), in the order of
Triton's reduction tree, where every config of the parent sums them exactly in FP64. Two configs do:
the parent's folded 4-warp plain configs, its picks at T <= 64.

Why. At T = 1 a 4-warp program holds the row, 40 values per thread, and each of the two norms
waits on its sum of squares: in FP64, 40 conversions F2F.F64.F32 per thread (a quarter of the FP64
rate on sm_90), FP64 adds and shuffles of 64-bit halves. The twenty-second session's sweep
(results/gpu_logs/2026-12-03-session22/square_sweep.py, the harness's interleaved graph timer)
measured what that costs, the parent's kernel beside the same kernel with FP32 sums: T=1 2.85 against
2.41 us, T=8 3.44 against 2.85, where the goal at T=1 is 2.3; at T=16384 the FP32 sums ran slower
(ring 182.9-184.3 against 171.1-171.5 us), so there the parent's exact configs stay. Building each
FP64 square from the BF16 bits instead of converting it (bit_squares, removed) did not help: 2.89-3.06
us at T=1, 172.9-182.9 at T=16384.

Floor (bytes / 4275 GB/s, bytes = 4*T*D*2 + 2*D*2, D = 5120):
  T=1      41 KB   -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  671 MB  -> 157.0 us (goal <= 165 us, >= 95% of the copy ceiling)

Numerics: those of persistent_prefetch.py (reference_model/ops.py norm_residual_norm):
  post = bf16((y * rsqrt(mean(y^2) + eps)) * w_post)        rounding point 1
  h'   = bf16(f32(h) * a + f32(post) * b)                   rounding point 2
  x    = bf16((f32(h') * rsqrt(mean(h'^2) + eps)) * w_pre)  rounding point 3
torch's operation order, no FMA contraction (enable_fp_fusion=False), mean(x^2) from the exact
sum of squares (FP64 sums of the exact FP32 squares of BF16 values: order-independent, correctly
rounded) or, EXACT = False, from an FP32 sum in the order of Triton's reduction tree: BEAM.md §5
leaves an FP32 reduction's order free (bit for bit but 1-ulp differences on a small fraction of
elements: parity's bit_exact check), and for a given config the result is deterministic. a and b
rounded from double to FP32 like torch's scalar, libdevice rsqrt on the GPU (tl.rsqrt under the
interpreter, which has no libdevice). Out-of-bounds columns of a TMA tile
arrive as zeros, so they add nothing to the sums, as the masked lanes of the plain path.

Launch: grid = min(T, PROGRAMS_PER_SM x #SMs). A row is a head of HEAD_ROWS x WIDTH (the largest
power of two <= D) and, when D is not a power of two, a tail of WIDTH = next_pow2(D - head)
columns (D = 5120 = 4 x 1024 + 1024: no padded lane). The ring reads the head through a 3-D view
[T, HEAD_ROWS, WIDTH] and the tail through [T, D]; TMA needs 16-byte aligned bases and row
strides (D % 8 == 0 for BF16), else only the plain configs run. (PROGRAMS_PER_SM, STAGES,
num_warps, RING, FOLD, EXACT) are autotuned per (D, T bucket, TMA allowed), decode-size buckets
timed as CUDA-graph replays (_time_config), the winner kept in Triton's cache.

Shape legend: T tokens, D hidden.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "row_warps",
    "idea": "row_warps plus its folded 4-warp plain configs with FP32 sums of squares (order free per "
    "BEAM.md section 5), for decode sizes",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if _INTERPRET:

    @triton.jit
    def _rsqrt(x):
        return tl.rsqrt(x)

    @triton.jit
    def _to_bf16_in_pairs(x):
        return x.to(tl.bfloat16)  # the interpreter runs no PTX; the same rounding

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)

    @triton.jit
    def _to_bf16_in_pairs(x):
        """x rounded to BF16 (to nearest even, as x.to(tl.bfloat16)) two elements per instruction:
        cvt.rn.bf16x2.f32 puts its first source in the upper half, so element 0 ($1) goes second, as
        in Triton's own lowering of the stores' conversions."""
        return tl.inline_asm_elementwise(
            "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2
        )


# On the CPU there are no SMs; two "SMs" give the CPU shapes (T = 1..5) a row loop of several
# iterations per program, so the ring's and the prefetch's ends of rows are exercised.
_CPU_SMS = 2
SMEM_PER_SM = 227 * 1024  # H100/H200: the most shared memory the CTAs of one SM may take


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"PROGRAMS_PER_SM": 1, "STAGES": 3, "RING": True, "FOLD": False, "EXACT": True},
                              num_warps=4)]  # fmt: skip
    # Ring: (programs per SM, stages, warps), reduced apart (folding cost persistent_prefetch 19 us at
    # T = 16384). 2 programs of 3-4 stages led both forced sweeps of the eleventh session at T = 16384
    # (their eager windows counted the host's launch too, so only the order was used); one program
    # per SM ran 1.4-2.4x slower. Plain: persistent_prefetch's configs that its autotuner took on the
    # H200 (registers capped at 168 for 3 programs per SM; folded at small T, apart at T = 16384).
    # The 8-warp ring program takes 142 registers (`harness inspect`), one program per SM: capped at 128.
    # Plain, new here: one program of 16 warps or two of 8 per SM, capped at 128 registers (65536 per SM).
    ring = ((2, 3, 4, None), (2, 4, 4, None), (2, 3, 8, 128), (2, 4, 8, 128))
    plain = ((2, 4, None, True), (3, 4, 168, True), (2, 4, None, False), (1, 16, 128, True), (2, 8, 128, True))
    # New here: row_warps' two folded 4-warp plain configs (its picks at T <= 64) with FP32 sums of squares.
    fp32 = ((2, 4, None, True), (3, 4, 168, True))
    configs = [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, "EXACT": True},
                             num_warps=w, maxnreg=r) for p, s, w, r in ring]  # fmt: skip
    configs += [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": 1, "RING": False, "FOLD": f, "EXACT": True},
                              num_warps=w, maxnreg=r) for p, w, r, f in plain]  # fmt: skip
    configs += [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": 1, "RING": False, "FOLD": f, "EXACT": False},
                              num_warps=w, maxnreg=r) for p, w, r, f in fp32]  # fmt: skip
    return configs


def _smem_estimate(c: triton.Config, n_cols: int) -> int:
    """Shared memory of one ring program: STAGES - 1 buffers of a y and an h row (BF16)."""
    return (c.kwargs["STAGES"] - 1) * 2 * n_cols * 2 if c.kwargs["RING"] else 0


def _prune(configs, named_args, **kwargs):
    """Ring configs only where TMA can read the inputs; the programs of an SM must fit its shared memory
    together; warp counts that give each thread 8..64 elements of a row, or the fewest for a tiny row."""
    n_cols, tma_ok = kwargs["N_COLS"], kwargs["TMA_OK"]
    usable = [
        c
        for c in configs
        if (tma_ok or not c.kwargs["RING"]) and c.kwargs["PROGRAMS_PER_SM"] * _smem_estimate(c, n_cols) <= SMEM_PER_SM
    ]
    fit = [c for c in usable if 8 <= n_cols // (32 * c.num_warps) <= 64]
    fewest = min(c.num_warps for c in usable)
    return fit or [c for c in usable if c.num_warps == fewest]


# How the autotuner times a config. Few rows: as a CUDA-graph replay, the way a decode step runs it
# and the harness times it (Triton's default event pair counts the launch there and ranked
# persistent_prefetch's configs wrongly at T = 1, 3 and 64). Many rows: the default.
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
    (D = 5120 = 4 x 1024 + 1024: no padded lane)."""
    head = 1 << (D.bit_length() - 1)
    if head == D:
        width = min(D, 1024)
        return D // width, width, False
    width = triton.next_power_of_2(D - head)
    return head // width, width, True


@triton.jit
def _mean_of_squares(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr, FOLD: tl.constexpr,
                     EXACT: tl.constexpr):  # fmt: skip
    """mean(x^2) over the row of FP32 x holding BF16 values. EXACT: from the exact sum (their squares
    are exact in FP32, the sum of a few thousand of them exact in FP64), so the result is the
    correctly rounded mean, whatever the summation order. Else summed in FP32, in the order of
    Triton's reduction tree: BEAM.md §5 leaves an FP32 reduction's order free. FOLD: the head's rows
    fold onto the tail's columns first, one block-wide reduction (faster at few rows:
    persistent_prefetch T = 1 3.13 against 3.41 us); else head and tail are reduced to a scalar each
    (faster at T = 16384: 187.7 against 207.0 us)."""
    squares_head = head * head
    squares_tail = tail * tail
    if EXACT:
        squares_head = squares_head.to(tl.float64)
        squares_tail = squares_tail.to(tl.float64)
    if FOLD:
        partial = tl.sum(squares_head, axis=0)
        if HAS_TAIL:
            partial += squares_tail
        total = tl.sum(partial, axis=0)
    else:
        total = tl.sum(tl.sum(squares_head, axis=1), axis=0)
        if HAS_TAIL:
            total += tl.sum(squares_tail, axis=0)
    return (total / N_COLS).to(tl.float32)


@triton.jit
def _load_row(row_ptr, head_cols, tail_cols, tail_mask, valid, HAS_TAIL: tl.constexpr):
    """One row's head and tail by plain loads (BF16), all lanes masked off when `valid` is false (the
    prefetch past the last row). Read once: evict_first keeps the weights' L1 lines."""
    head = tl.load(row_ptr + head_cols, mask=valid, other=0.0, eviction_policy="evict_first")
    tail = head  # placeholder; only read when HAS_TAIL
    if HAS_TAIL:
        tail = tl.load(row_ptr + tail_cols, mask=tail_mask & valid, other=0.0, eviction_policy="evict_first")
    return head, tail


@triton.jit
def _ring_row(head_desc, tail_desc, row, HEAD_ROWS: tl.constexpr, WIDTH: tl.constexpr, HAS_TAIL: tl.constexpr):
    """One row's head and tail as TMA tiles (BF16); columns past D arrive as zeros."""
    head = head_desc.load([row, 0, 0]).reshape(HEAD_ROWS, WIDTH)
    tail = head  # placeholder; only read when HAS_TAIL
    if HAS_TAIL:
        tail = tail_desc.load([row, HEAD_ROWS * WIDTH]).reshape(WIDTH)
    return head, tail


@triton.jit
def _to_bf16(x, PACKED: tl.constexpr):
    """x rounded to BF16, in pairs (PACKED) or element by element, as Triton lowers x.to(tl.bfloat16)."""
    rounded = x.to(tl.bfloat16)
    if PACKED:
        rounded = _to_bf16_in_pairs(x)
    return rounded


@triton.jit
def _fuse_row(y_head, y_tail, h_head, h_tail, post_w_head, post_w_tail, pre_w_head, pre_w_tail, h_out_ptr, x_out_ptr,
              out_offset, head_cols, tail_cols, tail_mask, coef_h, coef_post, eps, N_COLS: tl.constexpr,
              HAS_TAIL: tl.constexpr, FOLD: tl.constexpr, PACKED: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """The op on one loaded row (BF16 y and h): stores h' and x. Masked lanes hold 0. PACKED: rounding
    points 1 and 2 in pairs (_to_bf16)."""
    # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1).
    y_head32 = y_head.to(tl.float32)
    y_tail32 = y_tail.to(tl.float32)
    inv_rms_y = _rsqrt(_mean_of_squares(y_head32, y_tail32, N_COLS, HAS_TAIL, FOLD, EXACT) + eps)
    post_head = _to_bf16(y_head32 * inv_rms_y * post_w_head, PACKED)
    # Depth-scaled residual: h*a and post*b each rounded to FP32, then the add (rounding point 2).
    h_new_head = _to_bf16(h_head.to(tl.float32) * coef_h + post_head.to(tl.float32) * coef_post, PACKED)
    tl.store(h_out_ptr + out_offset + head_cols, h_new_head)
    h_new_tail = h_new_head
    if HAS_TAIL:
        post_tail = _to_bf16(y_tail32 * inv_rms_y * post_w_tail, PACKED)
        h_new_tail = _to_bf16(h_tail.to(tl.float32) * coef_h + post_tail.to(tl.float32) * coef_post, PACKED)
        tl.store(h_out_ptr + out_offset + tail_cols, h_new_tail, mask=tail_mask)

    # Pre-norm of sublayer k+1 on the rounded stream (rounding point 3).
    h_new_head32 = h_new_head.to(tl.float32)
    h_new_tail32 = h_new_tail.to(tl.float32)
    inv_rms_h = _rsqrt(_mean_of_squares(h_new_head32, h_new_tail32, N_COLS, HAS_TAIL, FOLD, EXACT) + eps)
    tl.store(x_out_ptr + out_offset + head_cols, (h_new_head32 * inv_rms_h * pre_w_head).to(tl.bfloat16))
    if HAS_TAIL:
        x_tail = (h_new_tail32 * inv_rms_h * pre_w_tail).to(tl.bfloat16)
        tl.store(x_out_ptr + out_offset + tail_cols, x_tail, mask=tail_mask)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "rows_bucket", "TMA_OK"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _fuse_norm_ring_kernel(
    y_ptr,
    h_ptr,
    y_head_desc,  # TMA descriptors of y's and h's row heads [T, HEAD_ROWS, WIDTH] and tails [T, D]
    y_tail_desc,  # (the tensors themselves where TMA cannot read them: the ring is not compiled then)
    h_head_desc,
    h_tail_desc,
    post_w_ptr,
    pre_w_ptr,
    h_out_ptr,
    x_out_ptr,
    n_rows,
    stride_y_t,
    stride_h_t,
    coef_h,
    coef_post,
    eps,
    rows_bucket,  # read only by the autotuner's key
    N_COLS: tl.constexpr,
    HEAD_ROWS: tl.constexpr,
    WIDTH: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,  # read by the launcher's grid
    STAGES: tl.constexpr,  # the ring's depth: STAGES - 1 rows in flight per program
    RING: tl.constexpr,  # the config's load path: the TMA ring, or plain loads with a register prefetch
    TMA_OK: tl.constexpr,  # whether the descriptors are real (the prune drops ring configs otherwise)
    FOLD: tl.constexpr,  # how a row's sum of squares is reduced (_mean_of_squares)
    EXACT: tl.constexpr,  # the sum of squares exact (FP64) or in FP32 (_mean_of_squares)
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
    if RING and TMA_OK:
        # Triton's pipeliner issues the TMA loads of the next STAGES - 1 rows ahead of this one. Rounding
        # element by element: packed, the 4-warp ring ran 5-13 us slower at T = 16384 (header).
        for row in tl.range(first, n_rows, step, num_stages=STAGES):
            y_head, y_tail = _ring_row(y_head_desc, y_tail_desc, row, HEAD_ROWS, WIDTH, HAS_TAIL)
            h_head, h_tail = _ring_row(h_head_desc, h_tail_desc, row, HEAD_ROWS, WIDTH, HAS_TAIL)
            _fuse_row(y_head, y_tail, h_head, h_tail, post_w_head, post_w_tail, pre_w_head, pre_w_tail, h_out_ptr,
                      x_out_ptr, tl.cast(row, tl.int64) * N_COLS, head_cols, tail_cols, tail_mask, coef_h, coef_post,
                      eps, N_COLS, HAS_TAIL, FOLD, False, EXACT)  # fmt: skip
    else:
        # persistent_prefetch's loop: the next row's loads are issued before this row is normalized.
        # Rounding in pairs: 0.3 us faster than element by element at T = 1 and 8 (header).
        y_head, y_tail = _load_row(y_ptr + first.to(tl.int64) * stride_y_t, head_cols, tail_cols, tail_mask,
                                   first < n_rows, HAS_TAIL)  # fmt: skip
        h_head, h_tail = _load_row(h_ptr + first.to(tl.int64) * stride_h_t, head_cols, tail_cols, tail_mask,
                                   first < n_rows, HAS_TAIL)  # fmt: skip
        for row in range(first, n_rows, step):
            nxt = row + step
            nxt64 = tl.cast(nxt, tl.int64)
            y_head_next, y_tail_next = _load_row(y_ptr + nxt64 * stride_y_t, head_cols, tail_cols, tail_mask,
                                                 nxt < n_rows, HAS_TAIL)  # fmt: skip
            h_head_next, h_tail_next = _load_row(h_ptr + nxt64 * stride_h_t, head_cols, tail_cols, tail_mask,
                                                 nxt < n_rows, HAS_TAIL)  # fmt: skip
            _fuse_row(y_head, y_tail, h_head, h_tail, post_w_head, post_w_tail, pre_w_head, pre_w_tail, h_out_ptr,
                      x_out_ptr, tl.cast(row, tl.int64) * N_COLS, head_cols, tail_cols, tail_mask, coef_h, coef_post,
                      eps, N_COLS, HAS_TAIL, FOLD, True, EXACT)  # fmt: skip
            y_head, y_tail, h_head, h_tail = y_head_next, y_tail_next, h_head_next, h_tail_next


def _tma_ok(width: int, *tensors: torch.Tensor) -> bool:
    """TMA's rules: 16-byte aligned bases, unit stride on the last dim, 16-byte multiple row strides
    (the head's WIDTH columns are a row of its 3-D view)."""
    return (width * 2) % 16 == 0 and all(
        t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors
    )


def _descriptors(x_TD: torch.Tensor, head_rows: int, width: int, tma_ok: bool) -> tuple:
    """(head, tail) TMA descriptors of x's rows, built on the host (no descriptor work in the kernel);
    the tensor itself twice where TMA cannot read it."""
    if not tma_ok:
        return x_TD, x_TD
    T, D = x_TD.shape
    head = TensorDescriptor(x_TD, [T, head_rows, width], [x_TD.stride(0), width, 1], [1, head_rows, width])
    return head, TensorDescriptor(x_TD, [T, D], [x_TD.stride(0), 1], [1, width])


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
    if y_TD.dtype != torch.bfloat16 or h_TD.dtype != torch.bfloat16:
        raise ValueError(f"expected bfloat16 y_TD and h_TD; got {y_TD.dtype} and {h_TD.dtype}")
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
    # Both load paths index a row with unit stride.
    y_TD = y_TD if y_TD.stride(1) == 1 else y_TD.contiguous()
    h_TD = h_TD if h_TD.stride(1) == 1 else h_TD.contiguous()
    tma_ok = _tma_ok(width, y_TD, h_TD)
    n_sms = _sm_count(y_TD.device)

    def grid(meta):
        return (min(T, meta["PROGRAMS_PER_SM"] * n_sms),)

    _tuning_rows[0] = _rows_bucket(T)
    _fuse_norm_ring_kernel[grid](
        y_TD,
        h_TD,
        *_descriptors(y_TD, head_rows, width, tma_ok),
        *_descriptors(h_TD, head_rows, width, tma_ok),
        post_weight_D.contiguous(),
        pre_weight_D.contiguous(),
        h_new_TD,
        x_TD,
        T,
        y_TD.stride(0),
        h_TD.stride(0),
        coef_h,
        coef_post,
        eps,
        _rows_bucket(T),
        N_COLS=D,
        HEAD_ROWS=head_rows,
        WIDTH=width,
        HAS_TAIL=has_tail,
        TMA_OK=tma_ok,
        enable_fp_fusion=False,
    )
    return h_new_TD, x_TD
