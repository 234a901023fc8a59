"""fuse_norm: row_warps launched as a programmatic dependent of the kernel before it (PDL), waiting for it first.

Author: human (kernels team, issue 4), hand-written. Parent: row_warps.py, whose code this is
but for the launch.

What changes, and why. The parent's kernel starts with griddepcontrol.wait: none of its programs reads or
writes anything before the kernel ahead of it in the stream has completed and its writes are visible,
exactly as after an ordinary launch. Every GPU config launches with launch_pdl (CUDA's programmatic
stream serialization), so the GPU may start dispatching this kernel's programs as the previous kernel's
programs exit, before that kernel's completion is processed; at decode sizes, where a call is mostly
launch and latency, that is a fraction of a microsecond per call. Nothing here triggers the next kernel
early (no griddepcontrol.launch_dependents): what the previous kernel gives this one, any previous
kernel gives it, so the harness's back-to-back calls time what a decode step gets. Results, numerics
and configs are the parent's; the Triton interpreter (no griddepcontrol) runs the parent's code.
Programmatic dependent launch needs Hopper or later.

Measured on the H200 (twenty-fourth session, results/gpu_logs/2026-12-03-session24/pdl_sweep.py: the harness's
timer, CUDA-graph windows over 64 rotated input sets, interleaved; each variant autotuned itself in the one
process), p50 us, the parent as committed -> with this launch; in brackets the same plus
griddepcontrol.launch_dependents after the wait, not used: back to back it lets each call start the next
one early, which a decode step gets only where the kernel before this one triggers too:
  T=1  2.59 -> 2.32 (2.16);  T=8  3.49 -> 3.21 (3.01)
  one launch moving the same bytes, timed beside them: 1.14 / 1.25
Both outputs bit-exact with the reference op at both shapes, every variant.
In the harness (`harness run task=fuse_norm "candidates=[pdl_row_warps,row_warps]"`, run
20261203T192659-3c9d8a, 97de06c), p50 us against row_warps beside it: T=1 **2.37** (p20-p80 2.30-2.41) / 2.65,
T=3 2.80 / 3.08, T=8 3.01 / 3.28, T=64 3.86 / 4.09, T=1000 11.54 / 12.82, T=16384 169.75 / 171.12 (in-child
torch.compile 3.03, 3.55, 3.87, 4.86, 14.32, 184.89); bit-exact at every shape. Promoted; the GPU tests of
the optimized model passed with it (9 of 9).
Goals: T = 1 <= 2.3 us missed by 0.07 us (its p20 reached 2.30); the exact sums of squares cost 0.35 us
there (twenty-second session), so FP32 sums would meet it but fail parity (row_warps' header, below).
T = 16384 <= 165 us missed by 4.75 us: 93% of the copy floor, where PDL hides only the launches between
calls of a window. Replaced in force by mixed_squares.py (twenty-ninth session: T = 1 2.25 against 2.38 us,
this code elsewhere).
Where T = 16384's time goes (twenty-ninth session; `harness profile task=fuse_norm candidate=pdl_row_warps`,
Nsight Compute with warp stall reasons, one cold call: 173.8 us). The pick, 2 ring programs of 4 warps per
SM at 226 registers, keeps 8 warps on an SM (12.4% occupancy); DRAM ran at 77.3% of peak and the
schedulers issued in 47.5% of cycles (XU pipe 51%: the FP64 and BF16 conversions). A warp waited 4.19
cycles per issued instruction: 1.06 on fixed-latency dependencies (wait), 0.87 on shared memory (short
scoreboard: the ring's tiles, the block reductions) and only 0.37 on DRAM (long scoreboard). The ring
hides DRAM's latency; what is left is each row's serial chain with two warps per scheduler to issue
from. More programs per SM lose: 3 or 4 ring programs of 4 warps (registers capped at 168 / 128 to fit,
32 / 70-74 spills) ran 210.8-285.5 us against the pick's 170.8, and two torch elementwise copies of
the same traffic took 162.8 us, in one process (results/gpu_logs/2026-12-04-session29/fuse_programs_sweep.py);
programs of 8 warps lost in the eleventh session (a longer block reduction per row). The goal is 2.2 us
above torch's copies of the bytes. T = 1's cold call (5.1 us) waits on its loads and on instruction and
constant cache misses (long_scoreboard 1.55, no_instruction 0.95, imc_miss 0.54 of 4.68 cycles), which
the graph replays the harness times (2.37 us) do not pay.

row_warps.py's header, unchanged (its figures are the parent's):

fuse_norm, packed_ring.py with plain configs of 8 and 16 warps: more threads on the one row of a decode step.

Author: human (kernels team, issue 4), hand-written. Child of packed_ring.py (the promoted kernel):
the same persistent programs, TMA ring of rows, plain register-prefetch path with rounding points 1
and 2 converted in pairs, numerics and bits. The one change: two more plain configs, a program of
16 warps (10 elements of the row per thread) and programs of 8 warps (20), registers capped at 128
so that they fit an SM.

Why it might be faster at T <= 64: there, each row is one program of 4 warps (packed_ring's plain
configs), one warp per scheduler, every thread holding 40 of the row's 5120 values of each input.
Its SASS (`harness inspect task=fuse_norm candidate=packed_ring`) has 1312 instructions at 4 warps,
82 of them conversions and 122 FP64, and at T = 1 each thread runs them once: a serial chain per
thread, with no other warp on its scheduler to hide its latencies, between one load round trip and
the stores. 16 warps give each thread a quarter of that and each scheduler four warps; the price is a
block-wide reduction across 16 warps instead of 4, twice per row.

Floor (bytes / 4275 GB/s, bytes = 4*T*D*2 + 2*D*2, D = 5120):
  T=1      41 KB   -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  671 MB  -> 157.0 us (goal <= 165 us, >= 95% of the copy ceiling)
packed_ring on the H200 (thirteenth session, 4d58156, results/README.md): T=1 2.63 us (goal <= 2.3),
T=16384 171.12 us.

Measured on the H200 (fourteenth session, results/README.md; `harness run task=fuse_norm
"candidates=[row_warps,packed_ring]"` at 8d10065, then beside the same-bytes copy at 7aef336), p50 us,
bit-exact with the reference at every shape:
  T=1 2.63 / 2.61, T=3 2.93 / 3.04, T=8 3.22 / 3.31, T=64 4.01 / 4.16, T=1000 12.96 / 12.79,
  T=16384 171.20 / 171.86 (92% of the floor); in-child torch.compile (which fails parity) 3.06 /
  3.04 at T=1 and 184.93 / 187.23 at T=16384. Promoted over packed_ring on an autotuner pick at
  T=1000 (12.96 against packed_ring's 19.50, which ran 12.92 with the same config before).
  Its autotuner took none of the new 8- and 16-warp plain configs: at T <= 64 this file ran
  packed_ring's configs, and the same figures within 0.03 us. Forced one at a time at T=1 (twenty-first
  session, `fuse_norm_t1_sweep.py`, the harness's interleaved graph timer, all bit-exact): plain 4
  warps 2.80 (folded) / 2.92 us, 8 warps 7.46 / 3.21, 16 warps 12.44 / 3.31, 32 warps (the prune's
  limit lifted) 12.93 / 4.29, the ring 3.22 (4 warps) / 3.49 (8); the file's own pick (4 warps,
  folded, 168 registers) 2.75 and the same-bytes launch 1.15 in the same process. More threads per
  row cost more than the shorter chain per thread saves: T=1 waits on the 4-warp chain.
Goals missed:
  - T=1 <= 2.3 us, by 0.31-0.33 us. One launch moving the same bytes took 1.09 us in the same child
    (7aef336): the kernel's own chain (one row per program; two block-wide reductions of exact FP64
    sums, three rounding points) takes the rest. Offline SASS of the winning 4-warp plain config:
    1312 instructions (122 FP64, 82 conversions), 6 barriers, no spills. The exact sums cost 0.35
    us of it (twenty-second session, results/README.md): this file with its two folded plain configs
    summing in FP32 (fp32_sums, removed) ran T=1 in 2.33 against 2.68 us beside it, but failed parity
    at T=64 and 16384, where a one-ulp flip of the post-norm grew to 66 ulps of h' through the
    cancellation at rounding point 2; building each FP64 square from the BF16 bits instead of a
    conversion (bit_squares, removed) was slower (T=1 2.88, T=16384 182.58 against 171.17).
  - T=16384 <= 165 us, by 6.2-6.9 us: 92% of the 157.0 us floor; Nsight Compute read 78.2% of DRAM
    peak for the ring (tma_ring, 171.4 us); two torch copies of the same traffic took 164.8-167.2 us
    in one process (eleventh session).

Numerics: those of persistent_prefetch.py (reference_model/ops.py norm_residual_norm):
  post = bf16((y * rsqrt(mean(y^2) + eps)) * w_post)        rounding point 1
  h'   = bf16(f32(h) * a + f32(post) * b)                   rounding point 2
  x    = bf16((f32(h') * rsqrt(mean(h'^2) + eps)) * w_pre)  rounding point 3
torch's operation order, no FMA contraction (enable_fp_fusion=False), mean(x^2) from the exact
sum of squares (FP64 sums of the exact FP32 squares of BF16 values: order-independent, correctly
rounded), a and b rounded from double to FP32 like torch's scalar, libdevice rsqrt on the GPU
(tl.rsqrt under the interpreter, which has no libdevice). Out-of-bounds columns of a TMA tile
arrive as zeros, so they add nothing to the sums, as the masked lanes of the plain path.

Launch: grid = min(T, PROGRAMS_PER_SM x #SMs). A row is a head of HEAD_ROWS x WIDTH (the largest
power of two <= D) and, when D is not a power of two, a tail of WIDTH = next_pow2(D - head)
columns (D = 5120 = 4 x 1024 + 1024: no padded lane). The ring reads the head through a 3-D view
[T, HEAD_ROWS, WIDTH] and the tail through [T, D]; TMA needs 16-byte aligned bases and row
strides (D % 8 == 0 for BF16), else only the plain configs run. (PROGRAMS_PER_SM, STAGES,
num_warps, RING, FOLD) are autotuned per (D, T bucket, TMA allowed), decode-size buckets timed as
CUDA-graph replays (_time_config), the winner kept in Triton's cache.

Shape legend: T tokens, D hidden.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "row_warps",
    "idea": "row_warps launched as a programmatic dependent of the previous kernel, waiting for it before any load",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)

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
        return [triton.Config({"PROGRAMS_PER_SM": 1, "STAGES": 3, "RING": True, "FOLD": False}, num_warps=4)]
    # Ring: (programs per SM, stages, warps), reduced apart (folding cost persistent_prefetch 19 us at
    # T = 16384). 2 programs of 3-4 stages led both forced sweeps of the eleventh session at T = 16384
    # (their eager windows counted the host's launch too, so only the order was used); one program
    # per SM ran 1.4-2.4x slower. Plain: persistent_prefetch's configs that its autotuner took on the
    # H200 (registers capped at 168 for 3 programs per SM; folded at small T, apart at T = 16384).
    # The 8-warp ring program takes 142 registers (`harness inspect`), one program per SM: capped at 128.
    # Plain, new here: one program of 16 warps or two of 8 per SM, capped at 128 registers (65536 per SM).
    ring = ((2, 3, 4, None), (2, 4, 4, None), (2, 3, 8, 128), (2, 4, 8, 128))
    plain = ((2, 4, None, True), (3, 4, 168, True), (2, 4, None, False), (1, 16, 128, True), (2, 8, 128, True))
    pdl = {"launch_pdl": True}  # every GPU config (see the header)
    configs = [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, **pdl}, num_warps=w,
                             maxnreg=r) for p, s, w, r in ring]  # fmt: skip
    configs += [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": 1, "RING": False, "FOLD": f, **pdl}, num_warps=w,
                              maxnreg=r) for p, w, r, f in plain]  # fmt: skip
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
def _mean_of_squares(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr, FOLD: tl.constexpr):
    """mean(x^2) over the row, FP32, from the EXACT sum: x holds BF16 values, whose squares are exact
    in FP32 and whose sum of a few thousand is exact in FP64, so the result is the correctly rounded
    mean, whatever the summation order. FOLD: the head's rows fold onto the tail's columns first, one
    block-wide reduction (faster at few rows: persistent_prefetch T = 1 3.13 against 3.41 us); else
    head and tail are reduced to a scalar each (faster at T = 16384: 187.7 against 207.0 us)."""
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
              HAS_TAIL: tl.constexpr, FOLD: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """The op on one loaded row (BF16 y and h): stores h' and x. Masked lanes hold 0. PACKED: rounding
    points 1 and 2 in pairs (_to_bf16)."""
    # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1).
    y_head32 = y_head.to(tl.float32)
    y_tail32 = y_tail.to(tl.float32)
    inv_rms_y = _rsqrt(_mean_of_squares(y_head32, y_tail32, N_COLS, HAS_TAIL, FOLD) + eps)
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
    inv_rms_h = _rsqrt(_mean_of_squares(h_new_head32, h_new_tail32, N_COLS, HAS_TAIL, FOLD) + eps)
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
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
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
                      eps, N_COLS, HAS_TAIL, FOLD, False)  # fmt: skip
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
                      eps, N_COLS, HAS_TAIL, FOLD, True)  # fmt: skip
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
