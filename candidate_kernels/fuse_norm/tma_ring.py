"""fuse_norm, persistent programs fed by a TMA ring of rows in shared memory.

Author: human (kernels team, issue 4), hand-written. Child of persistent_prefetch.py (same math,
same rounding points); this one changes where the rows in flight live.

Why it should be faster at large T: Nsight Compute put the row kernel's gap to the copy floor on
bytes in flight, held down by registers (row_per_program.py: 75% of DRAM peak, 4 programs per SM;
capped registers spilled). persistent_prefetch keeps one prefetched row per program in registers,
so an SM has two rows (40 KB) in flight and reaches 84-86% of the copy floor at T = 16384. Here
the rows in flight sit in shared memory: each persistent program walks rows pid, pid + grid, ...
in a `tl.range` loop with num_stages = STAGES, and Triton's pipeliner turns the loop's TMA loads of
y and h into a ring of STAGES - 1 row buffers filled by the copy engine (checked in an offline
sm_90 compile: cp.async.bulk.tensor copies and mbarrier waits, STAGES - 1 buffers of each tile).
With 2 programs of 4 stages an SM keeps 6 rows (120 KB) in flight, the registers hold the row
being computed and the weights only, and no thread spends instructions on loads. At T = 1 there
is nothing to prefetch: the autotuner may take the plain-load configs (no descriptor to build).

Floor (bytes / 4275 GB/s, bytes = 4*T*D*2 + 2*D*2, D = 5120):
  T=1      41 KB   -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  671 MB  -> 157.0 us (goal <= 165 us, >= 95% of the copy ceiling)
Not yet measured on a GPU.

Numerics: those of persistent_prefetch.py (reference_model/ops.py norm_residual_norm):
  post = bf16((y * rsqrt(mean(y^2) + eps)) * w_post)        rounding point 1
  h'   = bf16(f32(h) * a + f32(post) * b)                   rounding point 2
  x    = bf16((f32(h') * rsqrt(mean(h'^2) + eps)) * w_pre)  rounding point 3
torch's operation order, no FMA contraction (enable_fp_fusion=False), mean(x^2) from the exact
sum of squares (FP64 sums of the exact FP32 squares of BF16 values: order-independent, correctly
rounded), a and b rounded from double to FP32 like torch's scalar, libdevice rsqrt on the GPU
(tl.rsqrt under the interpreter, which has no libdevice). Out-of-bounds columns of a TMA tile
arrive as zeros, so they add nothing to the sums, as the masked lanes of the plain path.

Launch: grid = min(T, PROGRAMS_PER_SM x #SMs). A row is a [1, HEAD] tile (the largest power of
two <= D) and, when D is not a power of two, a [1, TAIL] tile after it (TAIL = next_pow2(D -
HEAD); D = 5120 = 4096 + 1024, no padded lane). TMA needs 16-byte aligned rows (D % 8 == 0 for
BF16, aligned base pointers); other inputs take the plain-load configs, whose loop is not
pipelined. (PROGRAMS_PER_SM, STAGES, num_warps, TMA) are autotuned per (D, T bucket, TMA allowed),
decode-size buckets timed as CUDA-graph replays (_time_config), the winner kept in Triton's cache.
The in-kernel descriptors need global scratch, which the launcher takes from torch's allocator
(graph-capture safe).

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
    "parent": "persistent_prefetch",
    "idea": "persistent programs, the rows in flight in a TMA ring in shared memory instead of registers",
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
# iterations per program.
_CPU_SMS = 2
SMEM_PER_SM = 227 * 1024  # H100/H200: the most shared memory the CTAs of one SM may take


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"PROGRAMS_PER_SM": 1, "STAGES": 3, "TMA": True}, num_warps=4)]  # CI forces the GPU ones
    # (programs per SM, stages, warps, TMA). Registers: the 4-warp program holds 40 FP32 weights of
    # each norm and a 40-element row per thread, so two fit in an SM (persistent_prefetch, which
    # also holds the prefetched row: 242 registers); 8 warps hold half of that per thread.
    shapes = ((1, 4, 4, True), (2, 3, 4, True), (2, 4, 4, True), (1, 6, 8, True), (2, 4, 8, True),
              (1, 1, 4, False), (2, 1, 4, False))  # fmt: skip
    return [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": s, "TMA": t}, num_warps=w) for p, s, w, t in shapes]


def _smem_estimate(c: triton.Config, n_cols: int) -> int:
    """Shared memory of one program: STAGES - 1 ring buffers of a y and an h row (BF16)."""
    return (c.kwargs["STAGES"] - 1) * 2 * n_cols * 2 if c.kwargs["TMA"] else 0


def _prune(configs, named_args, **kwargs):
    """TMA configs only where TMA can read the inputs; the programs of an SM must fit its shared memory
    together; warp counts that give each thread 8..64 elements of a row, or the fewest for a tiny row."""
    n_cols, tma_ok = kwargs["N_COLS"], kwargs["TMA_OK"]
    usable = [
        c
        for c in configs
        if (tma_ok or not c.kwargs["TMA"]) and c.kwargs["PROGRAMS_PER_SM"] * _smem_estimate(c, n_cols) <= SMEM_PER_SM
    ]
    if not usable:
        raise ValueError(f"no config for D = {n_cols} with tma_ok={tma_ok} among {len(configs)} offered")
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
    """(HEAD, TAIL, HAS_TAIL): the largest power of two <= D, and the rest's width rounded up to a
    power of two (no tail when D is a power of two)."""
    head = 1 << (D.bit_length() - 1)
    return head, triton.next_power_of_2(max(D - head, 1)), D > head


@triton.jit
def _squares_sum(x):
    """The EXACT sum of squares of a [1, W] FP32 tile holding BF16 values: each square is exact in
    FP32, and a few thousand of them sum exactly in FP64, whatever the order."""
    return tl.sum(tl.sum((x * x).to(tl.float64), axis=1), axis=0)


@triton.jit
def _load_row(ptr, desc, row, stride_t, cols, mask, col0, TMA: tl.constexpr):
    """[1, W] BF16 values of one row from col0 on: a TMA tile, or plain loads (masked lanes 0)."""
    if TMA:
        return desc.load([row, col0])
    return tl.load(ptr + tl.cast(row, tl.int64) * stride_t + cols, mask=mask, other=0.0, eviction_policy="evict_first")


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
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,  # the tail tile's width (1 when there is no tail)
    HAS_TAIL: tl.constexpr,  # False: D is a power of two, the head is the whole row
    PROGRAMS_PER_SM: tl.constexpr,  # read by the launcher's grid
    STAGES: tl.constexpr,
    TMA: tl.constexpr,  # the config's load path; taken only where the inputs allow it (TMA_OK)
    TMA_OK: tl.constexpr,
):
    USE_TMA: tl.constexpr = TMA and TMA_OK  # the prune drops TMA configs otherwise; one config runs untuned
    head_cols = tl.arange(0, HEAD)[None, :]
    tail_cols = HEAD + tl.arange(0, TAIL)[None, :]
    tail_mask = tail_cols < N_COLS
    head_mask = head_cols < N_COLS  # all true: the plain loads of a head and a tail take one form

    # The weights, once per program; they stay in registers for every row it handles.
    post_w_head = tl.load(post_w_ptr + head_cols).to(tl.float32)
    pre_w_head = tl.load(pre_w_ptr + head_cols).to(tl.float32)
    post_w_tail = post_w_head  # placeholders; only read when HAS_TAIL
    pre_w_tail = pre_w_head
    if HAS_TAIL:
        post_w_tail = tl.load(post_w_ptr + tail_cols, mask=tail_mask, other=0.0).to(tl.float32)
        pre_w_tail = tl.load(pre_w_ptr + tail_cols, mask=tail_mask, other=0.0).to(tl.float32)

    # Placeholders for the plain path, which ignores them.
    y_head_desc, y_tail_desc, h_head_desc, h_tail_desc = y_ptr, y_ptr, h_ptr, h_ptr
    if USE_TMA:
        # Rows in [0, n_rows) only are ever asked for; columns past D arrive as zeros.
        y_head_desc = tl.make_tensor_descriptor(y_ptr, [n_rows, N_COLS], [stride_y_t, 1], [1, HEAD])
        h_head_desc = tl.make_tensor_descriptor(h_ptr, [n_rows, N_COLS], [stride_h_t, 1], [1, HEAD])
        if HAS_TAIL:
            y_tail_desc = tl.make_tensor_descriptor(y_ptr, [n_rows, N_COLS], [stride_y_t, 1], [1, TAIL])
            h_tail_desc = tl.make_tensor_descriptor(h_ptr, [n_rows, N_COLS], [stride_h_t, 1], [1, TAIL])

    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        out_offset = tl.cast(row, tl.int64) * N_COLS
        y_head = _load_row(y_ptr, y_head_desc, row, stride_y_t, head_cols, head_mask, 0, USE_TMA).to(tl.float32)
        h_head = _load_row(h_ptr, h_head_desc, row, stride_h_t, head_cols, head_mask, 0, USE_TMA).to(tl.float32)
        y_tail = y_head  # placeholders; only read when HAS_TAIL
        h_tail = h_head
        sum_y = _squares_sum(y_head)
        if HAS_TAIL:
            y_tail = _load_row(y_ptr, y_tail_desc, row, stride_y_t, tail_cols, tail_mask, HEAD, USE_TMA).to(tl.float32)
            h_tail = _load_row(h_ptr, h_tail_desc, row, stride_h_t, tail_cols, tail_mask, HEAD, USE_TMA).to(tl.float32)
            sum_y += _squares_sum(y_tail)

        # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1).
        inv_rms_y = _rsqrt((sum_y / N_COLS).to(tl.float32) + eps)
        post_head = (y_head * inv_rms_y * post_w_head).to(tl.bfloat16)
        # Depth-scaled residual: h*a and post*b each rounded to FP32, then the add (rounding point 2).
        h_new_head = (h_head * coef_h + post_head.to(tl.float32) * coef_post).to(tl.bfloat16)
        tl.store(h_out_ptr + out_offset + head_cols, h_new_head)
        h_new_head32 = h_new_head.to(tl.float32)
        sum_h = _squares_sum(h_new_head32)
        h_new_tail32 = h_new_head32
        if HAS_TAIL:
            post_tail = (y_tail * inv_rms_y * post_w_tail).to(tl.bfloat16)
            h_new_tail = (h_tail * coef_h + post_tail.to(tl.float32) * coef_post).to(tl.bfloat16)
            tl.store(h_out_ptr + out_offset + tail_cols, h_new_tail, mask=tail_mask)
            h_new_tail32 = h_new_tail.to(tl.float32)
            sum_h += _squares_sum(h_new_tail32)

        # Pre-norm of sublayer k+1 on the rounded stream (rounding point 3).
        inv_rms_h = _rsqrt((sum_h / N_COLS).to(tl.float32) + eps)
        tl.store(x_out_ptr + out_offset + head_cols, (h_new_head32 * inv_rms_h * pre_w_head).to(tl.bfloat16))
        if HAS_TAIL:
            x_tail = (h_new_tail32 * inv_rms_h * pre_w_tail).to(tl.bfloat16)
            tl.store(x_out_ptr + out_offset + tail_cols, x_tail, mask=tail_mask)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for in-kernel TMA descriptors, from torch's allocator (graph-capture safe)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA's rules: a 16-byte aligned base, unit stride on the last dim, 16-byte multiple row strides."""
    return all(
        t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors
    )


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
    head, tail, has_tail = _row_split(D)

    h_new_TD = torch.empty((T, D), dtype=torch.bfloat16, device=y_TD.device)
    x_TD = torch.empty((T, D), dtype=torch.bfloat16, device=y_TD.device)
    if T == 0:
        return h_new_TD, x_TD
    # Both load paths index a row with unit stride.
    y_TD = y_TD if y_TD.stride(1) == 1 else y_TD.contiguous()
    h_TD = h_TD if h_TD.stride(1) == 1 else h_TD.contiguous()
    tma_ok = _tma_ok(y_TD, h_TD)
    if tma_ok and y_TD.is_cuda:
        triton.set_allocator(_scratch)  # a context variable of this thread; cheap to set per call
    n_sms = _sm_count(y_TD.device)

    def grid(meta):
        return (min(T, meta["PROGRAMS_PER_SM"] * n_sms),)

    _tuning_rows[0] = _rows_bucket(T)
    _fuse_norm_ring_kernel[grid](
        y_TD,
        h_TD,
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
        HEAD=head,
        TAIL=tail,
        HAS_TAIL=has_tail,
        TMA_OK=tma_ok,
        enable_fp_fusion=False,
    )
    return h_new_TD, x_TD
