"""fuse_norm: loads_first whose autotuner times 65..1024 rows as CUDA-graph replays, as it times fewer rows.

Author: human (kernels team, issue 4), hand-written. Parent: loads_first.py (the promoted kernel), whose kernel,
configs, launch and numerics this is bit for bit; only how its autotuner times a config at 65..1024 rows differs.

Why. At T = 1000 the harness's figures of loads_first and of its parent mixed_squares (the same configs there)
followed their autotuners' picks over three sessions: plain configs 11.45-12.08 us, the ring config (RING, 4
stages, 4 warps) 14.31 us, 23% slower, each kernel taking one or the other from session to session
(loads_first.py's header has the runs). Those picks were timed Triton's way (triton.testing.do_bench: each call
alone between two events, after the L2 is cleared by writing 256 MB), whereas the harness times 1000 rows as
windows of calls back to back on rotated inputs, and a prefill runs them back to back too, each launched as a
programmatic dependent of the one before. A CUDA-graph replay of calls back to back
(triton.testing.do_bench_cudagraph, what _time_config already used up to 64 rows) is the nearer of Triton's two
timers. From 1025 rows on, the default stays (the ring's bucket, T = 16384, is settled by it).

Measured on an H100 80GB HBM3 (forty-first session: every call asked for the H200 and got an H100;
results/gpu_logs/2026-12-05-session41/). fuse_norm_tuning_sweep.py ranked loads_first's ten configs three ways at
256, 1000, 2048 and 4096 rows, every output bit-exact with the others. On the H100 the plain folded 4-warp configs
lead all three rankings and Triton's default timer took one of them in all 12 of its tunings, so the H200's ring
picks did not recur. What the sweep does show is how far apart each timer puts the ring from the plain configs
at T = 1000 (best of each, us):
  harness timer (event windows, rotated inputs)  plain 13.28, ring 15.93 (+20%)
  CUDA-graph replays (this file's timer)         plain 12.1,  ring 14.3-14.6 (+18-21%)
  Triton's default (each call alone)             plain 20.0-20.2, ring 21.1-21.7 (+5-8%)
and at T = 256 (harness +19%, graph +14-17%, default +7-11%): the default timer squeezes the gap to a few percent,
about as wide as its run-to-run spread, which is how the H200's picks could swing to the ring. The graph timer
keeps the harness's gap. Both rank the best plain configs within 2% of each other (MIXED = 0 and 6 swap places
between them).
In the harness (`harness run task=fuse_norm "candidates=[loads_first,replay_tuned,ring_over_1024]"
bench.max_seconds=3`, run 20261205T162203-ce7d22 at 087b38d, on the H100) this file ran p50 T=1 2.23, T=3 2.63,
T=8 2.82, T=64 3.78, T=1000 13.34, T=16384 236.87 us. loads_first ran 2.23 / 2.61 / 2.81 / 3.79 / 13.34 / 236.57
beside it, with the same autotuned picks at every shape. ring_over_1024 (the same kernel, no ring configs up to
1024 rows) ran T=1000 at 13.00. None was promoted (not faster than loads_first anywhere), and ring_over_1024 was
removed afterwards: the harness timed the ring behind the plain configs at 2048 and 4096 rows too (33.87 against
32.05, 68.05 against 61.83), so a fixed row bound has no measurement behind it.

Measured on the H200 (forty-second session, `harness run task=fuse_norm "candidates=[loads_first,replay_tuned]"
bench.max_seconds=3`, run 20261205T181701-032f14 at 12443c0; results/gpu_logs/2026-12-05-session42/), p50 us
against loads_first beside it: T=1 2.25 / 2.24, T=3 2.65 / 2.65, T=8 2.81 / 2.81, T=64 3.58 / 3.57, T=1000
**12.06** / 17.55, T=16384 170.20 / 170.08 (one kernel moving the same bytes 159.57, 94%). At T = 1000 Triton's
default timer gave loads_first a third pick, neither of the two seen before: a plain config of 3 programs per SM
(MIXED = 0, maxnreg 168), 46% slower than this file's graph-timed pick of 2 programs per SM (MIXED = 0), which ran
at 106% of the same-bytes launch (12.84 us). Every other shape took the same config in both. Promoted (faster than
loads_first beyond noise at T = 1000 and slower nowhere; geomean of worst speedups 1.275x). Goals: T = 1 met by
0.05 us; T = 16384 missed by 5.20 us (the ring's pick, loads_first's kernel; loads_first.py says why).
Again on the H200 (fifty-fourth session, run 20261206T202536-cc8bf7 at 635d834): T=1 2.24, T=3 2.63, T=8
2.81, T=64 3.58, T=1000 12.06, T=16384 170.07 us (one kernel moving the same bytes 159.44, 94%; missed by 5.07
us), bit-exact at every shape. Its 4-warp rings forced one at a time
(results/gpu_logs/2026-12-06-session51/narrow_ring_sweep.py): 2 programs per SM on 3 / 4 stages 171.50 / 170.89.
narrow_weights (this file with the weights held as BF16, removed) fitted 3 ring programs per SM without spilling:
183.14 us on 3 stages, 192.81 on 2 (the H100's fastest ring). A third program per SM does not hide the ring's
instruction chains on the H200.

Floor, goals, numerics and launch: loads_first.py's header, whose code this is (T=16384: 671 MB -> 157.0 us at
4275 GB/s; goals T = 1 <= 2.3 us bit-exact, T = 16384 <= 165 us).

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
    "parent": "loads_first",
    "idea": "loads_first with its autotuner timing 65..1024 rows as CUDA-graph replays of calls back to back (as the "
    "harness and a prefill run them), not each call alone after an L2 clear",
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
        return [triton.Config({"PROGRAMS_PER_SM": 1, "STAGES": 3, "RING": True, "FOLD": False, "MIXED": 4},
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
    pdl = {"launch_pdl": True}  # every GPU config (see the header)
    configs = [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, "MIXED": 0, **pdl},
                             num_warps=w, maxnreg=r) for p, s, w, r in ring]  # fmt: skip
    configs += [triton.Config({"PROGRAMS_PER_SM": p, "STAGES": 1, "RING": False, "FOLD": f, "MIXED": 0, **pdl},
                              num_warps=w, maxnreg=r) for p, w, r, f in plain]  # fmt: skip
    # New here: pdl_row_warps' pick at T = 1 (folded, 4 warps) with 6 of every 8 columns squared the integer
    # way (mixed_squares_sweep.py, twenty-ninth session: MIXED 2-8 ran 2.41-2.47 us against 2.56 at T = 1, no
    # faster at T = 8 or 64, slower at T = 16384 in the ring); the autotuner weighs it beside the rest.
    configs.append(triton.Config({"PROGRAMS_PER_SM": 2, "STAGES": 1, "RING": False, "FOLD": True, "MIXED": 6, **pdl},
                                 num_warps=4))  # fmt: skip
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


# How the autotuner times a config. Up to 1024 rows: as a CUDA-graph replay of calls back to back, the
# way a decode step or a prefill runs them and the harness times them (Triton's default event pair counts
# the launch at decode sizes and ranked persistent_prefetch's configs wrongly at T = 1, 3 and 64; at
# T = 1000 it ranked the ring close to the plain configs, 23% slower in the harness: the header). Many
# rows: the default.
_GRAPH_TIMED_ROWS = 1024
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


# The integer way is exact only where the junk of zero squares cannot reach a result (module header).
MIXED_EPS_MIN = 2.0**-40


@triton.jit
def _squares64(x, cols, MIXED: tl.constexpr):
    """x^2 in FP64 for x in FP32 holding BF16 values (exact FP32 squares): columns with cols % 8 < MIXED
    the integer way (module header), the others by conversion (F2F.F64.F32). Integer-way values are
    2^896 times the square; _unscale takes that back."""
    magnitude = tl.abs(x)  # a NaN's sign too: NaN squares must keep a clear sign bit (below); free on the GPU
    sq = magnitude * magnitude  # (FMUL's operand modifiers)
    converted = sq.to(tl.float64)
    if MIXED == 0:
        return converted
    upper = (sq.to(tl.int32, bitcast=True) >> 3) + 0x70000000  # FP32 exponent e -> FP64 exponent e + 1792
    assembled = (upper.to(tl.int64) << 32).to(tl.float64, bitcast=True)
    return tl.where((cols % 8) < MIXED, assembled, converted)


@triton.jit
def _unscale(v, cols, MIXED: tl.constexpr):
    """v back to the squares' scale where it sums integer-way values only (cols % 8 < MIXED)."""
    if MIXED == 0:
        return v
    return tl.where((cols % 8) < MIXED, v * tl.full([], 2.0**-896, tl.float64), v)


@triton.jit
def _mean_of_squares(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr, FOLD: tl.constexpr,
                     MIXED: tl.constexpr):  # fmt: skip
    """mean(x^2) over the row, FP32, from the EXACT sum: x holds BF16 values, whose squares are exact
    in FP32 and whose sum of a few thousand is exact in FP64, so the result is the correctly rounded
    mean, whatever the summation order. FOLD: the head's rows fold onto the tail's columns first, one
    block-wide reduction, the integer-way columns unscaled once each after the fold (faster at few rows:
    persistent_prefetch T = 1 3.13 against 3.41 us); else head and tail are reduced to a scalar each, each
    integer-way value unscaled first (faster at T = 16384: 187.7 against 207.0 us). MIXED: _squares64."""
    cols = tl.arange(0, head.shape[1])
    if FOLD:
        partial = tl.sum(_squares64(head, cols[None, :], MIXED), axis=0)
        if HAS_TAIL:
            partial += _squares64(tail, cols, MIXED)
        total = tl.sum(_unscale(partial, cols, MIXED), axis=0)
    else:
        head64 = _unscale(_squares64(head, cols[None, :], MIXED), cols[None, :], MIXED)
        total = tl.sum(tl.sum(head64, axis=1), axis=0)
        if HAS_TAIL:
            total += tl.sum(_unscale(_squares64(tail, cols, MIXED), cols, MIXED), axis=0)
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
              HAS_TAIL: tl.constexpr, FOLD: tl.constexpr, PACKED: tl.constexpr, MIXED: tl.constexpr):  # fmt: skip
    """The op on one loaded row (BF16 y and h): stores h' and x. Masked lanes hold 0. PACKED: rounding
    points 1 and 2 in pairs (_to_bf16)."""
    # Post-norm of sublayer k: (y * inv_rms) * w, rounded (rounding point 1).
    y_head32 = y_head.to(tl.float32)
    y_tail32 = y_tail.to(tl.float32)
    inv_rms_y = _rsqrt(_mean_of_squares(y_head32, y_tail32, N_COLS, HAS_TAIL, FOLD, MIXED) + eps)
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
    inv_rms_h = _rsqrt(_mean_of_squares(h_new_head32, h_new_tail32, N_COLS, HAS_TAIL, FOLD, MIXED) + eps)
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
    MIXED: tl.constexpr,  # squares the integer way, of every 8 columns (_squares64)
    MIXED_OK: tl.constexpr,  # eps >= MIXED_EPS_MIN: else every square is converted (module header)
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
                      eps, N_COLS, HAS_TAIL, FOLD, False, MIXED if MIXED_OK else 0)  # fmt: skip
    else:
        # persistent_prefetch's loop: the next row's loads are issued before this row is normalized.
        # Rounding in pairs: 0.3 us faster than element by element at T = 1 and 8 (header).
        y_head, y_tail = _load_row(y_ptr + first.to(tl.int64) * stride_y_t, head_cols, tail_cols, tail_mask,
                                   first < n_rows, HAS_TAIL)  # fmt: skip
        h_head, h_tail = _load_row(h_ptr + first.to(tl.int64) * stride_h_t, head_cols, tail_cols, tail_mask,
                                   first < n_rows, HAS_TAIL)  # fmt: skip
        # No load moves below a barrier: without it ptxas issues the weights' and h's loads after y's sum of
        # squares, a second round trip (header).
        tl.debug_barrier()
        for row in range(first, n_rows, step):
            nxt = row + step
            nxt64 = tl.cast(nxt, tl.int64)
            y_head_next, y_tail_next = _load_row(y_ptr + nxt64 * stride_y_t, head_cols, tail_cols, tail_mask,
                                                 nxt < n_rows, HAS_TAIL)  # fmt: skip
            h_head_next, h_tail_next = _load_row(h_ptr + nxt64 * stride_h_t, head_cols, tail_cols, tail_mask,
                                                 nxt < n_rows, HAS_TAIL)  # fmt: skip
            _fuse_row(y_head, y_tail, h_head, h_tail, post_w_head, post_w_tail, pre_w_head, pre_w_tail, h_out_ptr,
                      x_out_ptr, tl.cast(row, tl.int64) * N_COLS, head_cols, tail_cols, tail_mask, coef_h, coef_post,
                      eps, N_COLS, HAS_TAIL, FOLD, True, MIXED if MIXED_OK else 0)  # fmt: skip
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
        MIXED_OK=eps >= MIXED_EPS_MIN,
        enable_fp_fusion=False,
    )
    return h_new_TD, x_TD
