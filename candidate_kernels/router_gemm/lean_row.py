"""router_gemm: pdl_stream_words with one token as a lean row kernel: no masks, no split words, every load up front.

Author: human (kernels team, issue 4), hand-written. Parent: pdl_stream_words.py (the promoted kernel), whose
code, configs and numerics this is for every T but 1.

Why. At T = 1 the parent's autotuner takes its unsplit FMA row (one expert row per program, 256 programs of 8
warps, 1024-wide K blocks), 3.43-3.44 us in graph replays. In one process on the H200 (thirtieth session,
results/gpu_logs/2026-12-04-session30/router_dot_sweep.py: the harness's timer, CUDA-graph replays of rotated
input sets, launched as a programmatic dependent like the parent), a kernel of the same layout and the same
arithmetic written as plainly as Triton allows (_row_dot_kernel: no masks, no split-K machinery, no tile words,
compile-time shape) took 3.07 us against the parent's 3.44, with bit-identical logits, and its loads alone
3.08 us; one launch moving the same bytes (no PDL) 3.09. The parent's extra 0.37 us were not traced to a line:
`harness inspect` (sm_90a) finds the same loads (5 x 16 B of W, 5 x 8 B of x per thread) and 32 registers in
both, and 129 SASS instructions here against the parent's 161 (its masks, program-id arithmetic and int64
offsets). _row_dot_kernel is the sweep's kernel as it ran (its STEP 2), token axis of length 1 included.
router_read_floor.py (the same session) timed PDL reads of the weight alone at 2.63-2.78 us: the T = 1 goal
(3.0 us) is above the read under PDL. So T = 1 runs _row_dot_kernel here wherever its preconditions hold (D at
most 16 blocks of the largest power of two <= 1024 dividing it, x and W with unit stride along D, W rows D apart
and under 2^31 elements), the parent's kernel otherwise and at every other T (at T = 8 the same lean shape with
all 8 tokens ran 4.78-4.87 against the parent's 4.46).

Measured on the H200 (thirty-first session, `harness run task=router_gemm "candidates=[lean_row,pdl_stream_words]"
bench.max_seconds=3`, run 20261204T192636-3cd53b, 7965e50), p50 us against pdl_stream_words beside it: T=1 3.06 /
3.40, T=3 3.66 / 3.66, T=8 4.40 / 4.39, T=64 5.86 / 5.82, T=1000 31.61 / 31.50; promoted (beats every baseline
beyond noise at every shape; the run's pick by geomean of worst speedups, 3.234x). Floor at T = 1: 5.24 MB of W
over 4275 GB/s, 1.23 us (40%); one launch moving the same bytes 3.03 us beside it (99%). Goals: T = 1 missed
by 0.06 us (a PDL read of W alone ran 2.63-2.78), T = 8 by 0.90 (the parent's kernel), T = 64 met.
Where the 0.26 us over that read go (thirty-first session): not into many programs asking for the same lines of
x. With x read from replicas, 64 or 16 programs to each instead of all 256, the kernel took 3.05 / 3.07 us against
3.04 with the one x and 2.79 for W's loads alone (router_x_sweep.py, bit-identical logits); x's own loads (5 x
8 B per thread beside W's 5 x 16 B) cost them, not traced further. Nsight Compute, one cold call (cache flushed):
4.4 us, 24.9% of DRAM peak, long scoreboard 20.3 of 31.6 warp cycles per issue: each warp waits out one round trip.

Numerics: the parent's unsplit FMA row (below): per thread, x (BF16 upcast) times W's FP32 values accumulated
over the K blocks in FP32 (FMA contraction allowed, as in the parent), then one FP32 tree over the row; the same
bits as the parent's (1, 1024, 1) config at 8 warps on the H200. On the interpreter the same code without the
PDL wait.

pdl_stream_words.py's header, unchanged (its figures are the parent's):

router_gemm: pdl_red_fixup with its split-K tile words per stream and two generation bits (a fix, not a speedup).

Author: human (kernels team, issue 4), hand-written. Parent: pdl_red_fixup.py (promoted), whose code this is
but for the words of its split-K protocol (_tile_words and the four constants that lay a word out).

What changes, and why. pdl_red_fixup (like red_fixup before it) keeps one int64 word per output tile per
device, arrivals in bits 0-47 and the landed generation in bits 48-63. Two hazards:
- Two calls on two streams of one device, running at once, counted their arrivals on the same words: a
  tile's "first arriver" could belong to the other call, and its waiters would add onto a partial that is
  not there yet, or wait for a generation that is not theirs. The words are now per (device, stream).
- After 2^42 split launches in one process the arrival count carried into the generation bits (310 days
  of back-to-back launches). The generation now takes two bits (62-63) and the arrivals 62: 2^56
  launches. Two bits are enough because a stream's launches run one after the other: a waiter only ever
  sees its own launch's generation or the one before it.
Neither changes what a launch computes or how long it takes; it is promoted by name as a fix of the
kernel in force (`harness run ... promote_fix=pdl_stream_words`, harness/promote.py), which needs it to be
slower on no shape.
Measured on the H200 (twenty-fourth session, `harness run task=router_gemm
"candidates=[pdl_stream_words,pdl_red_fixup]" promote_fix=pdl_stream_words`, run 20261203T195658-f9a420,
b9c5ea4), p50 us against pdl_red_fixup beside it: T=1 3.43 / 3.43, T=3 3.67 / 3.67, T=8 4.44 / 4.46,
T=64 5.86 / 5.84, T=1000 31.53 / 31.48: within each other's noise everywhere, promoted as the fix. Then
40 calls queued on each of two streams behind a spin, so that both ran at once, a 32-way split at T = 64:
every output the task function (tests/test_candidates.py, GPU). Goals as pdl_red_fixup's: T = 64 met,
T = 1 and 8 missed by 0.43 / 0.94 us.

pdl_red_fixup.py's header, unchanged (its figures, and its words shared by the streams of a device, are the parent's):

router_gemm: red_fixup launched as a programmatic dependent of the kernel before it (PDL), waiting for it first.

Author: human (kernels team, issue 4), hand-written. Parent: red_fixup.py, whose code this is
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
  T=1  3.72 -> 3.46 (3.07);  T=8  4.71 -> 4.50 (4.07);  T=64  6.15 -> 5.90 (5.53)
  one launch moving the same bytes, timed beside them: 3.12 / 3.13 / 3.27
The autotuners took the same configs with and without it at T = 1 and 64 (an 8-warp FMA row; 16 x 64 tiles,
32-way split, 2 warps) and the same errors against FP64 came out (9.2e-08, 1.35e-07 normwise).
In the harness (`harness run task=router_gemm "candidates=[pdl_red_fixup,red_fixup]"`, run
20261203T192349-4632be, 97de06c), p50 us against red_fixup beside it: T=1 3.39 / 3.65, T=3 3.65 / 3.88,
T=8 4.42 / 4.63, T=64 **5.86** / 6.12, T=1000 31.60 / 33.19 (in-child torch.compile 6.56, 15.97, 19.99,
19.14, 79.57). Promoted; the GPU tests of the optimized model passed with it (9 of 9).
Goals (3.0 / 3.5 / 6.0 us at T = 1 / 8 / 64): T = 64 met, by 0.14 us. T = 1 and 8 missed by 0.39 / 0.92 us,
for red_fixup's reasons (below): at T = 1 the goal is below every plain launch that read the weight
(3.12 us at best); T = 8 runs unsplit FMA rows.
Under Nsight Compute with warp stall reasons (twenty-ninth session, `harness profile task=router_gemm
candidate=pdl_stream_words`, one cold call per shape: caches flushed, so slower than the graph replays
above): T=1 5.02 us, 256 programs of 8 warps, 23% occupancy, a warp waiting 28.3 cycles per issued
instruction, 18.1 of them on its loads of W (long scoreboard): one load round trip, nothing to overlap it
with. T=8 5.92 and T=64 7.52 us: 218 / 209 registers, 12% occupancy, 5.1-5.2 cycles per issue, 1.3-2.1
of them on loads: with few warps, the FMA chains per thread.

red_fixup.py's header, unchanged (its figures are the parent's):

router_gemm: vector_width whose split-K partials go into the output by FP32 reductions, not one program's sum.

Author: human (kernels team, issue 4), hand-written. Parent: vector_width.py (promoted before it), whose FMA and
BF16x3 paths, configs and autotuning it keeps unchanged; only the split-K fixup differs.

What changes, and why. vector_width publishes every split's partial tile to a workspace and counts
arrivals; the last to arrive sums the SPLIT_K partials in K order (compensated) and stores the tile.
At T = 64 (its pick: BF16x3, 16 x 64 tiles, 16-way split) that tail cost 1.94 of 7.66 us (twentieth
session): 0.63 the acq_rel arrivals, 1.31 one program reading 16 partials of 4 KB from L2. Here every
split adds its partial straight into the output with red.global.add.f32 (no workspace, nothing read
back), spread over all the programs. The output is fresh memory, so one split must store before the
others add: the first to arrive at the tile's word stores its partial and raises the word's
generation (release); the others add theirs once their arrival (acquire) or a poll shows it. A
program only ever waits on one that has already arrived, so the protocol cannot deadlock whatever
the scheduling. The words (see _tile_words) are never reset: each launch moves them one generation
on, so consecutive launches with any split need no cleanup.
Measured on the H200 (twenty-third session, `router_red_sweep.py`, graph replays, every shipped split
config forced beside vector_width's in one process), best config of each, us:
  T=64  7.80 (vector_width, autotuned 7.81) -> 6.42 (this protocol, 16 x 64 tiles, 16-way, 2 warps);
        adding into an output zeroed by a fill launch first 6.53; into a workspace the last arriver
        copies out 6.85; the adds alone, into an unzeroed output (wrong on purpose) 5.37
  T=32  6.95 -> 5.67;  T=16  6.50 -> 5.29 (a 64 x 64 tile, 32-way split)
  T=1, 3, 8: no gain (the unsplit FMA picks, 3.65 / 4.02 / 4.82, stay faster than any split config).
Two protocols that zero each output tile at the launch's start instead (`router_red_sweep2.py`, same
process, best config each, T = 64): the split-0 program zeroing before its K loop 6.25 us, which
waits on programs not yet started when dispatch does not follow the program id (CUDA does not
promise it); every program taking a ticket first 6.55 (a round trip before its loads); this one
6.38. Not worth the first's hazard: not used.
In the harness (`harness run task=router_gemm "candidates=[red_fixup,vector_width]"`, run
20261203T174455-861100, 2f9a1ce), p50 us against vector_width beside it: T=1 3.65 / 3.68, T=3 3.90 /
3.91, T=8 4.64 / 4.70, T=64 **6.16** / 7.71, T=1000 33.07 / 33.72; in-child torch.compile 6.57, 15.84,
19.98, 19.18, 79.65. Promoted. Again beside red_stages (its configs plus the sweep's 2-warp 4-5 stage
and 1-2 warp 32-way tiles; run 20261203T174944-d5b5e8, removed): T=64 6.13 / 6.13, both autotuners
picking the 16 x 64 tile with a 32-way split on 2 warps, 3 stages. Alone at 44d11fb (run
20261203T180312-6741b5): T=1 3.66, T=3 3.91, T=8 4.65, T=64 6.20, T=1000 33.25.
Goals (3.0 / 3.5 / 6.0 us at T = 1 / 8 / 64) missed by 0.65 / 1.14 / 0.13-0.20 us: T = 1 and 8 for
vector_width's reasons (its header: the goal at T = 1 is below every read of the weight measured, and
T = 8 runs unsplit FMA rows whose chains no unit limits); at T = 64 the adds alone took 5.37-5.47 us
and the protocol costs the rest.

Floor (bytes / 4275 GB/s, bytes = T*D*2 + E*D*4 + T*E*4, D = 5120, E = 256):
  T=1   5.25 MB -> 1.23 us (goal <= 3.0 us); one read of W alone: 3.12 us at best of 30 layouts
  T=8   5.33 MB -> 1.25 us (goal <= 3.5 us)
  T=64  6.03 MB -> 1.41 us (goal <= 6.0 us)
One launch moving the same bytes (the harness's copy floor) replayed in 3.03-3.09 us at T <= 8 and
3.22-3.28 at T = 64 (fifteenth and sixteenth sessions).

Numerics: vector_width's within each split (reference_model/ops.py router_logits, BEAM.md §4.1: FMA
rows or BF16x3 MMAs on an exact truncating split of W, blocks added compensated). The SPLIT_K
partials are then added in FP32 in arrival order, one rounding each, not compensated in K order:
the result is not bitwise deterministic across runs of a split config (unsplit configs are). The
error this adds is about one FP32 rounding of the logit (measured against FP64, normwise: 1.16e-07
at T = 64 against vector_width's 9.2e-08 and cuBLAS FP32's 2.24e-07; the task allows 1e-6 and 1.05x
the reference's own). red.global.add.f32 flushes subnormal sums to zero (logits are O(1)).

Launch: grid (cdiv(E, BLOCK_E), SPLIT_K, cdiv(T, BLOCK_T)); configs autotuned per T bucket (prune
below), every bucket timed as CUDA-graph replays, the winner in
`_router_kernel.best_config`. The first call per T bucket benchmarks every config (it
synchronizes): call once before capturing a CUDA graph; replays never tune. Not reentrant across
streams: two concurrent calls on one device share the tile words.

Shape legend: T tokens, D hidden, E experts, K the reduction (= D).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "pdl_stream_words",
    "idea": "pdl_stream_words with one token as a lean row kernel (no masks, no split words, compile-time shape), "
    "launched as a programmatic dependent",
}

# TRITON_INTERPRET is read when kernels are decorated. The interpreter runs one config, no
# autotuning: there the config is a function of T (below), so that the task's CPU shapes exercise
# both paths and the split-K fixup.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)

FMA_MAX_T = 16  # the FMA path's register tile [BLOCK_T, BLOCK_K] grows with T (at most 64 per thread)
MMA_MIN_T = 2  # one token: the FMA row is a plain read of W, nothing for the tensor cores to save
MMA_MIN_BLOCK_T, MMA_MAX_BLOCK_T = 8, 64  # the token side is the MMA's N: a multiple of 8
GRAPH_TIMED_T = 1024  # buckets timed as CUDA-graph replays while tuning: all of them (see header)
# Split-K tile words (see _tile_words): arrivals in the low bits, the landed generation above them.
ARRIVALS_PER_LAUNCH = tl.constexpr(64)  # every split in the configs divides it
GENERATION_SHIFT = tl.constexpr(62)
GENERATION_ONE = tl.constexpr(1 << 62)  # one generation, added to a word (it wraps through the sign bit)
ARRIVAL_MASK = tl.constexpr((1 << 62) - 1)
GENERATION_MASK = tl.constexpr(0x3)


def _t_bucket(T: int) -> int:
    """Autotuning key for the token count: the next power of two, capped at 1024."""
    return min(triton.next_power_of_2(T), 1024)


def _block_t(use_mma: bool, t_bucket: int) -> int:
    return min(max(t_bucket, MMA_MIN_BLOCK_T), MMA_MAX_BLOCK_T) if use_mma else t_bucket


def _gpu_configs() -> list[triton.Config]:
    # FMA: (BLOCK_E, BLOCK_K, SPLIT_K, warps), one expert row per program (row_vector's configs).
    fma = [
        (1, 1024, 1, 4),
        (1, 1024, 1, 8),
        (1, 512, 2, 4),
        (1, 256, 4, 2),
        (1, 256, 4, 4),
        # New here: 256 one-row programs with other K blocks and warps (the 4-warp 1024-wide block won
        # at T = 8 in row_groups' sweep), and 512 of them
        (1, 512, 1, 4),
        (1, 2048, 1, 8),
        (1, 1024, 2, 4),
    ]
    # BF16x3: (BLOCK_E, BLOCK_K, SPLIT_K, warps, stages). BLOCK_E = 64 fills one warpgroup MMA's M;
    # 16 and 32 give more, smaller tiles (and fixups) for the same 128-160 programs at T <= 64.
    mma = [
        (64, 64, 32, 4, 3),  # 4 x 32 = 128 programs, 2-3 K blocks each
        (64, 32, 32, 4, 3),  # 5 K blocks each
        (64, 64, 16, 4, 3),  # 64 programs, 5 K blocks
        (32, 64, 16, 4, 3),  # 8 x 16 = 128
        (32, 32, 16, 4, 3),
        (16, 64, 8, 4, 3),  # 16 x 8 = 128, 10 K blocks
        (16, 64, 16, 4, 3),  # 256
        (64, 64, 2, 4, 4),  # T = 1000: 4 x 2 x 16 token tiles = 128 programs
        (32, 64, 2, 4, 4),  # 256
        (32, 64, 1, 4, 4),  # 128, no fixup
        (16, 64, 1, 4, 4),  # 256, no fixup
    ]
    configs = [
        triton.Config(
            {"USE_MMA": False, "BLOCK_E": e, "BLOCK_K": k, "SPLIT_K": s, "launch_pdl": True}, num_warps=w, num_stages=1
        )
        for e, k, s, w in fma
    ]
    configs += [
        triton.Config(
            {"USE_MMA": True, "BLOCK_E": e, "BLOCK_K": k, "SPLIT_K": s, "launch_pdl": True}, num_warps=w, num_stages=st
        )
        for e, k, s, w, st in mma
    ]
    # New here: 16-row tiles on 1-2 warps (more programs per SM, no cross-warp MMA sync), and with
    # 32-way splits or other K blocks and pipeline depths. (BLOCK_E, BLOCK_K, SPLIT_K, warps, stages)
    narrow = [
        (16, 64, 16, 2, 3),
        (16, 64, 16, 1, 3),
        (16, 64, 32, 2, 3),
        (16, 32, 32, 4, 3),
        (16, 32, 32, 2, 3),
        (16, 128, 8, 4, 3),
        (16, 128, 8, 2, 3),
        (16, 64, 16, 4, 2),
        (16, 64, 16, 4, 4),
    ]
    configs += [
        triton.Config(
            {"USE_MMA": True, "BLOCK_E": e, "BLOCK_K": k, "SPLIT_K": s, "launch_pdl": True}, num_warps=w, num_stages=st
        )
        for e, k, s, w, st in narrow
    ]
    return configs


def _interpreter_config(T: int, D: int) -> dict:
    """CPU: FMA below 8 tokens (one expert row per program: the task's T = 1 shape runs the 1-D path,
    T = 5 the 2-D one), BF16x3 from 8, all with a 2-way split so that the fixup runs too; wide blocks
    at full width, where the interpreter's cost is per program and per loop step."""
    block_k = 32 if D <= 256 else 512
    if T < MMA_MIN_BLOCK_T:
        return {"USE_MMA": False, "BLOCK_E": 1, "BLOCK_K": block_k, "SPLIT_K": 2}
    return {"USE_MMA": True, "BLOCK_E": 16 if D <= 256 else 64, "BLOCK_K": block_k, "SPLIT_K": 2}


def _prune(configs, named_args, **kwargs):
    """FMA configs for small T only, with a register tile of at most 64 FP32 per thread; BF16x3
    from 2 tokens; at least 64 programs (the weight read needs the SMs), split-K only up to 1024."""
    t_bucket, E, D = named_args["t_bucket"], named_args["E"], kwargs["D"]
    kept = []
    for c in configs:
        use_mma, block_e, block_k, split_k = (c.kwargs[k] for k in ("USE_MMA", "BLOCK_E", "BLOCK_K", "SPLIT_K"))
        block_t = _block_t(use_mma, t_bucket)
        if block_e > triton.next_power_of_2(E) or split_k > triton.cdiv(D, block_k):
            continue
        if not use_mma and (t_bucket > FMA_MAX_T or block_t * block_k // (32 * c.num_warps) > 64):
            continue
        if use_mma and t_bucket < MMA_MIN_T:
            continue
        programs = triton.cdiv(E, block_e) * split_k * triton.cdiv(t_bucket, block_t)
        if (split_k > 1 and programs > 1024) or programs < 64:  # < 64: half the SMs idle
            continue
        kept.append(c)
    return kept or [min(configs, key=lambda c: c.kwargs["SPLIT_K"])]


_tuning_t_bucket = [0]  # the T bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    """How the autotuner times a config: as a CUDA-graph replay at every T bucket (GRAPH_TIMED_T), the
    way a decode step runs it; Triton's default (each call after an L2 flush by writing) above."""
    if _tuning_t_bucket[0] <= GRAPH_TIMED_T:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


@triton.jit
def _bf16_head(x):
    """(head, x - head): head = x's upper 16 bits as a BF16 (x truncated toward zero to 8 significant
    bits), and the FP32 remainder, exact (at most 16 significant bits, the same exponent range).
    Integer shifts and one FP32 subtraction: no rounding conversion."""
    bits = x.to(tl.uint32, bitcast=True)
    head = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return head, x - ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _kahan_add(total, comp, x):
    """Compensated FP32 sum: total + x with the rounding error carried in comp (no FMA to contract:
    the error term is exact). Keeps the sum over blocks and splits near one rounding."""
    y = x - comp
    t = total + y
    return t, (t - total) - y


def _router_kernel_fn(
    x_ptr,
    w_ptr,
    out_ptr,
    word_ptr_base,  # int64 tile words (see _tile_words)
    T,
    E,
    stride_xt,
    stride_xd,
    stride_we,
    stride_wd,
    t_bucket,  # read by the autotuner's key and the BLOCK_T heuristic
    D: tl.constexpr,
    USE_MMA: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    pid_e = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_t = tl.program_id(2)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    t_ok = offs_t < T
    e_ok = offs_e < E
    # This split's K blocks: SPLIT_K near-equal runs of whole BLOCK_K blocks.
    K_BLOCKS: tl.constexpr = (D + BLOCK_K - 1) // BLOCK_K
    KB_PER_SPLIT: tl.constexpr = (K_BLOCKS + SPLIT_K - 1) // SPLIT_K
    kb_lo = pid_s * K_BLOCKS // SPLIT_K
    kb_hi = (pid_s + 1) * K_BLOCKS // SPLIT_K
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt
    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * stride_we

    if USE_MMA:
        # logits^T tile [BLOCK_E, BLOCK_T] = W [BLOCK_E, K] @ x^T [K, BLOCK_T]: the split weight is
        # the A operand (registers), x^T the B operand (shared memory).
        acc_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)
        comp_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)  # Kahan compensation of acc_ET
        for kb in range(kb_lo, kb_hi):
            offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = offs_k < D
            w_EK = tl.load(w_rows + offs_k[None, :] * stride_wd, mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            x_TK = tl.load(x_rows + offs_k[None, :] * stride_xd, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            # Exact three-way split of the FP32 weights by truncation (see header); x is BF16 already.
            hi_EK, rest_EK = _bf16_head(w_EK)
            mid_EK, lo_f32_EK = _bf16_head(rest_EK)
            lo_EK, _ = _bf16_head(lo_f32_EK)  # exact: lo_f32 has at most 8 significant bits
            block_ET = tl.dot(lo_EK, x_TK.T)
            block_ET = tl.dot(mid_EK, x_TK.T, block_ET)
            block_ET = tl.dot(hi_EK, x_TK.T, block_ET)
            # The tensor cores accumulate one block only; blocks are added in IEEE FP32, compensated.
            acc_ET, comp_ET = _kahan_add(acc_ET, comp_ET, block_ET)
    else:
        # FMA, one expert row per program, in the layout of a [BLOCK_K] vector (or [BLOCK_T, BLOCK_K]
        # tile); unrolled, so all loads issue up front.
        tl.static_assert(BLOCK_E == 1, "the FMA path computes one expert row per program")
        w_row = w_ptr + pid_e.to(tl.int64) * stride_we
        row_ok = pid_e < E
        if BLOCK_T == 1:
            x_row = x_ptr + pid_t.to(tl.int64) * stride_xt
            row_ok = row_ok & (pid_t < T)
            acc_K = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for i in tl.static_range(KB_PER_SPLIT):
                offs_k = (kb_lo + i) * BLOCK_K + tl.arange(0, BLOCK_K)
                k_ok = (offs_k < D) & (kb_lo + i < kb_hi) & row_ok
                x_K = tl.load(x_row + offs_k * stride_xd, mask=k_ok, other=0.0)
                w_K = tl.load(w_row + offs_k * stride_wd, mask=k_ok, other=0.0)
                acc_K += x_K.to(tl.float32) * w_K
            acc_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32) + tl.sum(acc_K, axis=0)
        else:
            acc_TK = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
            for i in tl.static_range(KB_PER_SPLIT):
                offs_k = (kb_lo + i) * BLOCK_K + tl.arange(0, BLOCK_K)
                k_ok = (offs_k < D) & (kb_lo + i < kb_hi)
                # x in 4-element (8-byte) vectors, the width of W's 16-byte ones, so that both load
                # into one register layout: W's row needs no trip through shared memory.
                offs_kx = tl.max_contiguous(offs_k, 4)
                x_TK = tl.load(x_rows + offs_kx[None, :] * stride_xd, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
                w_K = tl.load(w_row + offs_k * stride_wd, mask=k_ok & row_ok, other=0.0)
                acc_TK += x_TK.to(tl.float32) * w_K[None, :]
            acc_ET = tl.sum(acc_TK, axis=1)[None, :]

    out_ptrs = out_ptr + offs_t.to(tl.int64)[None, :] * E + offs_e[:, None]
    out_mask = e_ok[:, None] & t_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc_ET, mask=out_mask)
    else:
        # Split-K by FP32 reductions (red.global.add.f32) into the output, no workspace and no sum by
        # one program. The output is fresh memory, so one split stores before the rest add: the first to
        # arrive stores its partial and raises the tile word's generation; the others add theirs once
        # they see it. Nobody waits on a program that has not started.
        tl.static_assert(ARRIVALS_PER_LAUNCH % SPLIT_K == 0, "SPLIT_K must divide ARRIVALS_PER_LAUNCH")
        word_ptr = word_ptr_base + pid_t * tl.num_programs(0) + pid_e
        old = tl.atomic_add(word_ptr, ARRIVALS_PER_LAUNCH // SPLIT_K, sem="acquire", scope="gpu")
        arrivals = old & ARRIVAL_MASK
        gen = (arrivals // ARRIVALS_PER_LAUNCH + 1) & GENERATION_MASK  # this launch's generation
        if arrivals % ARRIVALS_PER_LAUNCH == 0:
            tl.store(out_ptrs, acc_ET, mask=out_mask)
            tl.debug_barrier()  # every thread's store precedes the (single-thread) release
            tl.atomic_add(word_ptr, GENERATION_ONE, sem="release", scope="gpu")
        else:
            # Poll with a compare-and-swap that never swaps (no word is ever -1): Triton folds an
            # atomic add of 0 away, which would leave this loop spinning on a stale value.
            never = gen.to(tl.int64) * 0 - 1
            seen = old
            while ((seen >> GENERATION_SHIFT) & GENERATION_MASK) != gen:
                seen = tl.atomic_cas(word_ptr, never, never, sem="acquire", scope="gpu")
            tl.atomic_add(out_ptrs, acc_ET, mask=out_mask, sem="relaxed", scope="gpu")


# BLOCK_T follows from the path and T (not tuned). On the GPU the rest is autotuned; cache_results
# stores the winner in Triton's cache, so later processes on this machine (the harness's parity and
# benchmark children, a model run) use the config that was checked, untuned.
_router_jit = triton.heuristics({"BLOCK_T": lambda args: _block_t(args["USE_MMA"], args["t_bucket"])})(
    triton.jit(_router_kernel_fn)
)
if _INTERPRET:
    _router_kernel = _router_jit
else:
    _router_kernel = triton.autotune(
        configs=_gpu_configs(),
        key=["t_bucket", "E", "D"],
        prune_configs_by={"early_config_prune": _prune},
        do_bench=_time_config,
        cache_results=True,
    )(_router_jit)

# One int64 word per output tile, per device and stream: bits 0-61 count arrivals, ARRIVALS_PER_LAUNCH per
# launch whatever its split (so configs of any split may follow each other on the same words); bits 62-63
# hold the generation (the launch's number mod 4) whose first store has landed. Two bits are enough: the
# launches on one stream's words run one after the other, so a waiter only ever sees its own launch's
# generation or the one before it. Zeroed once and never reset: each launch leaves its tiles' words one
# generation on; the arrivals reach bit 62 after 2^56 launches. Per stream, because calls on two streams
# may run at once and would otherwise count their arrivals on the same words. A stream's buffer made
# while a CUDA graph is being captured comes from the graph's pool and is zeroed by a captured fill at
# each replay, between complete launches, which leaves every word consistent. Buffers are never freed:
# a captured graph keeps pointing at the one it was captured with.
_TILE_WORDS: dict[tuple[torch.device, int], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []
_MIN_TILE_WORDS = 4096


def _stream_key(device: torch.device) -> int:
    """The current stream of a CUDA device (its handle); 0 elsewhere (the CPU runs one call at a time)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def _tile_words(device: torch.device, count: int) -> torch.Tensor:
    key = (device, _stream_key(device))
    buf = _TILE_WORDS.get(key)
    if buf is None or buf.numel() < count:
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(count, _MIN_TILE_WORDS), dtype=torch.int64, device=device)
        _TILE_WORDS[key] = buf
    return buf


def _tile_bound(T: int, E: int, configs: list[dict]) -> int:
    """Output tiles of the split configs among this call's candidates (words needed)."""
    tiles = 1
    for c in configs:
        if c["SPLIT_K"] > 1:
            block_t = _block_t(c["USE_MMA"], _t_bucket(T))
            tiles = max(tiles, triton.cdiv(E, c["BLOCK_E"]) * triton.cdiv(T, block_t))
    return tiles


LEAN_BLOCK_K_MAX = 1024
LEAN_MAX_BLOCKS = 16  # the K blocks _row_dot_kernel unrolls, at most (Beam: 5120 = 5 x 1024)
LEAN_WARPS = 8  # the parent's T = 1 pick (one expert row per program of 8 warps)


@triton.jit
def _row_dot_kernel(x_ptr, w_ptr, out_ptr, E, D: tl.constexpr, BLOCK_K: tl.constexpr):
    """logits[0, row] = sum over D of f32(x) * W[row]: one expert row per program, its D // BLOCK_K blocks of W
    and x all loaded up front (D a multiple of BLOCK_K: no mask), one FP32 tree at the end. The code
    router_dot_sweep.py timed (its token axis of length 1 kept: the layouts are the measured ones)."""
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    row = tl.program_id(0)
    token = tl.arange(0, 1)
    acc = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + row * D + cols)
        x = tl.load(x_ptr + token[:, None] * D + tl.max_contiguous(cols, 4)[None, :]).to(tl.float32)
        acc += x * w[None, :]
    tl.store(out_ptr + token * E + row, tl.sum(acc, axis=1))


def _lean_block_k(x_TD: torch.Tensor, w_router_ED: torch.Tensor) -> int:
    """The K block of _row_dot_kernel for this call (the largest power of two <= LEAN_BLOCK_K_MAX dividing D),
    or 0 where it does not run: more than one token, more than LEAN_MAX_BLOCKS blocks, strides it does not take
    (x and W with unit stride along D, W's rows D apart), or a weight too large for its 32-bit offsets."""
    T, D = x_TD.shape
    block_k = min(D & -D, LEAN_BLOCK_K_MAX) if D else 0
    plain = x_TD.stride(1) == 1 and w_router_ED.stride(1) == 1 and w_router_ED.stride(0) == D
    fits = w_router_ED.numel() < 2**31
    return block_k if T == 1 and plain and fits and block_k and D // block_k <= LEAN_MAX_BLOCKS else 0


def router_logits(x_TD: torch.Tensor, w_router_ED: torch.Tensor) -> torch.Tensor:
    """FP32 logits [T, E] = f32(x) @ W^T, as ops.router_logits computes them (no TF32)."""
    if x_TD.dim() != 2 or w_router_ED.dim() != 2 or x_TD.shape[1] != w_router_ED.shape[1]:
        raise ValueError(
            f"expected x_TD [T, D] and w_router_ED [E, D]; got {tuple(x_TD.shape)} and {tuple(w_router_ED.shape)}"
        )
    if x_TD.dtype != torch.bfloat16 or w_router_ED.dtype != torch.float32:
        raise ValueError(f"expected x_TD bfloat16 and w_router_ED float32; got {x_TD.dtype} and {w_router_ED.dtype}")
    T, D = x_TD.shape
    E = w_router_ED.shape[0]
    logits_TE = torch.empty((T, E), dtype=torch.float32, device=x_TD.device)
    if T == 0:
        return logits_TE
    lean_block_k = _lean_block_k(x_TD, w_router_ED)
    if lean_block_k:
        launch = {} if _INTERPRET else {"launch_pdl": True}
        _row_dot_kernel[(E,)](
            x_TD, w_router_ED, logits_TE, E, D=D, BLOCK_K=lean_block_k, num_warps=LEAN_WARPS, **launch
        )
        return logits_TE
    t_bucket = _t_bucket(T)
    if _INTERPRET:
        fixed = _interpreter_config(T, D)
        candidates = [fixed]
    else:
        fixed = {}
        candidates = [c.all_kwargs() for c in _router_kernel.configs]
        _tuning_t_bucket[0] = t_bucket
    words = _tile_words(x_TD.device, _tile_bound(T, E, candidates))

    def grid(meta):
        return (triton.cdiv(E, meta["BLOCK_E"]), meta["SPLIT_K"], triton.cdiv(T, meta["BLOCK_T"]))

    try:
        _router_kernel[grid](
            x_TD,
            w_router_ED,
            logits_TE,
            words,
            T,
            E,
            x_TD.stride(0),
            x_TD.stride(1),
            w_router_ED.stride(0),
            w_router_ED.stride(1),
            t_bucket,
            D=D,
            **fixed,
        )
    except BaseException:
        # A launch that stopped part-way (under the CPU interpreter, an exception in one program) leaves
        # its tiles' arrivals counted and no generation raised: every later launch would wait forever.
        # On the GPU a launch raises before any program runs, and zeroing is then harmless.
        words.zero_()
        raise
    return logits_TE
