"""moe_route: either_selection launched as a programmatic dependent of the kernel before it (PDL), waiting for it first.

Author: human (kernels team, issue 4), hand-written. Parent: either_selection.py, whose code this is
but for the launch.

What changes, and why: pdl_row_warps.py's (fuse_norm) and pdl_red_fixup.py's (router_gemm) change, made
here. Its kernel starts with griddepcontrol.wait: none of its programs reads or writes anything before the
kernel ahead of it in the stream has completed and its writes are visible, exactly as after an ordinary
launch. Every GPU config launches with launch_pdl, so the GPU may start dispatching its programs as the
previous kernel's programs exit, before that kernel's completion is processed: a fraction of a microsecond
per call, which counts where a call is mostly launch and latency. Nothing triggers the next kernel early
(no griddepcontrol.launch_dependents, a cheat the harness's benchmark child flags). Results, numerics and
configs are the parent's; the Triton interpreter (no griddepcontrol) runs the parent's code. Programmatic
dependent launch needs Hopper or later.

Measured on the H200 (twenty-fifth session, `harness run task=moe_route
"candidates=[pdl_either_selection,either_selection]"`, run 20261203T224314-bdb0c7, 1679003), p50 us against
either_selection beside it: T=1 **3.10** / 3.30, T=3 3.15 / 3.37, T=8 3.17 / 3.40, T=64 **3.20** / 3.43, T=1000
4.53 / 6.32, T=16384 **27.37** / 29.00 (flashinfer's fused DeepSeek routing, which fails the task's parity:
4.71, 4.82, 4.81, 5.84, 8.47, 46.09; in-child torch.compile 34.60 at T=1, 596.18 at T=16384); expert ids
identical to the reference's at every shape. Goals (4 / 5 / 40 us at T = 1 / 64 / 16384, one kernel) met
by 0.90 / 1.80 / 12.63 us. Promoted; the GPU tests of the optimized model passed with it (9 of 9).

either_selection.py's header, unchanged (its figures are the parent's):

moe_route in one kernel, both selection methods: the autotuner picks one per T bucket.

Author: human (kernels team, issue 4), hand-written. Child of packed_keys.py and
value_then_index.py (same kernel, same numerics, same inputs and outputs), which each beat every
baseline on the H200 on every shape and each missed one goal (fourth session, commit 0133681,
results/README.md): packed_keys took 3.69 / 3.76 / 48.95 us at T = 1 / 64 / 16384,
value_then_index 4.05 / 4.16 / 38.91 us; the goals are <= 4 / 5 / 40 us in one kernel.

Selection (PACKED, a config parameter):
- PACKED: each top-k step is one row-wide max over 64-bit keys (high word the biased score b made
  order-preserving as an int32, low word 2^31 - 1 - expert id): the largest b and, among equal b,
  the lowest id, in one reduction. Fewer dependent reductions: faster where latency counts (T <= 64).
- not PACKED: an FP32 max over the row, then a min over the ids that hold it. Two reductions per
  step, but every element op is one 32-bit instruction instead of a pair (about 1100 warp
  instructions per row against 1430, sm_90 SASS): faster where throughput counts (T = 16384).

Floor (bytes / 4275 GB/s, bytes = T*E*4 + E*4 + T*k*12, E = 256, k = 8):
  T=1, 8, 64  <= 82 KB -> < 0.02 us: latency bound, the floor is one launch (~2 us graph replay)
  T=16384     18.4 MB  -> 4.3 us (goal <= 40 us: the selection arithmetic, not bytes, bounds it)
Measured on the H200 (sixth session, commit 17c0f30, results/README.md): T=1 3.63 us, T=3 3.58,
  T=8 3.60, T=64 3.65, T=16384 39.91 (PACKED at T <= 1024, not PACKED at T=16384): the three goals
  met by one kernel; packed_keys beside it 4.27 / 3.57 / 3.89 / 3.68 / 50.39 us. T=1000 read
  34.05 us against packed_keys' 14.78 with the same (packed) path chosen: the 3-call event windows
  of that run, since replaced (1062fb4). Not promoted there.
Promoted in the seventh session (9a3c8c6): T=1 3.54, T=3 3.53, T=8 3.60, T=64 3.61, T=1000 8.31,
  T=16384 31.61 us. Newest (fifteenth session, c370ca5, end-event windows; `harness run
  task=moe_route "candidates=[either_selection]" bench.max_seconds=3`): T=1 3.30, T=3 3.33, T=8 3.37,
  T=64 3.42, T=1000 5.99, T=16384 28.98 us, against flashinfer's fused DeepSeek top-k at 4.73 / 4.74
  / 4.75 / 5.83 / 8.51 / 46.05 and the in-child torch.compile at 34.45 (T=1) and 595.50 (T=16384)
  in its child; expert ids identical to the reference everywhere. The goals (4 / 5 / 40 us) are met.
  One launch moving the same bytes took 1.13-1.33 us at T <= 64: the rest is the selection's chain
  of dependent reductions (8 top-k steps after the group step).

Numerics (reference_model/ops.py moe_route, BEAM.md §4), for both methods:
- s = 1 / (1 + exp(-x)) in FP32, the formula of torch's CUDA sigmoid, with libdevice's __nv_expf
  and an IEEE division (div_rn): s is bit-identical to torch's on the GPU. The interpreter has no
  libdevice and torch's CPU sigmoid (SLEEF) is not reproducible there, so on CPU s is the FP64
  sigmoid rounded once: within an ulp of torch's, never further from FP64.
- b = s + bias (FP32, selection only). A group's score is the sum of its group_score_topk largest
  b, added largest first.
- Ties: the group with the lower index, then the expert with the lower id wins, which is what
  torch.topk returns in practice; the task's inputs have no near-ties, so expert sets are
  identical to the reference's.
- Weights: the chosen experts' s, recomputed from their logits, summed in FP64 and rounded once to
  FP32 (the correctly rounded sum), then w = (s / sum) * routed_scaling with an IEEE division.
  ids are int64 in descending b, as torch.topk returns them.

Launch: grid = cdiv(T, ROWS); ROWS rows per program as a [ROWS, G, E/G] tile (groups and experts
padded to powers of two and masked). (PACKED, ROWS, num_warps) autotuned per T bucket, buckets of
T <= 64 timed as CUDA-graph replays (_time_config). One warp per program keeps every reduction
inside the warp.

Shape legend: T tokens, E experts, G groups, J experts per group, k top-k, R rows per program.
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
    "parent": "either_selection",
    "idea": "either_selection as a programmatic dependent (PDL): griddepcontrol.wait first, launch_pdl on GPU configs",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs one
# config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)

if _INTERPRET:

    @triton.jit
    def _sigmoid(x):
        """CPU stand-in: the sigmoid in FP64, rounded once (torch's CPU sigmoid is not reproducible here)."""
        return (1.0 / (1.0 + tl.exp(-x.to(tl.float64)))).to(tl.float32)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _sigmoid(x):
        """torch's CUDA sigmoid in FP32, bit for bit: 1 / (1 + __nv_expf(-x)), IEEE division."""
        return tl.math.div_rn(1.0, 1.0 + libdevice.exp(-x))


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"ROWS": 2, "PACKED": True}, num_warps=1)]  # CI forces the GPU configs too
    return [
        triton.Config({"ROWS": rows, "PACKED": packed, "launch_pdl": True}, num_warps=warps)
        for rows, warps in ((1, 1), (1, 2), (2, 1), (4, 1), (8, 1), (8, 2), (16, 4))
        for packed in (True, False)
    ]


def _prune(configs, named_args, **kwargs):
    """A program never holds more rows than there are (T = 1 runs only the one-row configs)."""
    t_bucket = named_args["t_bucket"]
    fit = [c for c in configs if c.kwargs["ROWS"] <= t_bucket]
    return fit or [min(configs, key=lambda c: c.kwargs["ROWS"])]


def _t_bucket(T: int) -> int:
    """Autotuning key for the row count: the next power of two, capped at 16384."""
    return min(triton.next_power_of_2(T), 16384)


# How the autotuner times a config. Few rows: as a CUDA-graph replay, the way a decode step runs it
# and the harness times it. Triton's default (an event pair around each launch) counts the launch
# there, and ranked configs wrongly on the H200 (fuse_norm/persistent_prefetch picked 16 warps at
# T = 1: 3.63 us in a graph, where 4 warps took 3.41). Many rows: the default.
_GRAPH_TIMED_ROWS = 64
_tuning_rows = [0]  # the T bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_rows[0] <= _GRAPH_TIMED_ROWS:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


# ---- selection by packed (value, index) keys ----------------------------------------------------------
@triton.jit
def _sortable(x):
    """FP32 -> int32 whose signed order is the float order (negative floats: magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _unsortable(key_hi):
    """Inverse of _sortable (the transform is its own inverse: the sign bit is unchanged)."""
    bits = key_hi ^ ((key_hi >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pack(value, index):
    """int64 key: order-preserving value in the high word, (2^31 - 1 - index) in the low word, so that
    max() picks the largest value and, among equal values, the lowest index."""
    return (_sortable(value).to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _key_index(key):
    return (0x7FFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def _key_value(key):
    return _unsortable((key >> 32).to(tl.int32))


@triton.jit
def _top_experts_by_keys(b_RGJ, valid_1GJ, expert_1GJ, g_G, slot_K, ROWS: tl.constexpr, N_GROUPS: tl.constexpr,
                         TOPK_GROUPS: tl.constexpr, TOP_K: tl.constexpr, GROUP_SCORE_TOPK: tl.constexpr,
                         G_PAD: tl.constexpr, K_PAD: tl.constexpr):  # fmt: skip
    """ids [ROWS, K_PAD] of the top-k experts of the kept groups, in descending b (lowest id first on ties)."""
    MIN_KEY: tl.constexpr = -(2**63)
    # Padding lanes get the smallest key: never a group's top entry while real experts remain.
    key_RGJ = tl.where(valid_1GJ, _pack(b_RGJ, expert_1GJ), MIN_KEY)
    # Group scores: the sum of each group's GROUP_SCORE_TOPK largest b, largest first.
    work_RGJ = key_RGJ
    score_RG = tl.zeros((ROWS, G_PAD), dtype=tl.float32)
    for i in tl.static_range(GROUP_SCORE_TOPK):
        top_RG = tl.max(work_RGJ, axis=2)
        if i == 0:
            score_RG = _key_value(top_RG)
        else:
            score_RG = score_RG + _key_value(top_RG)
        work_RGJ = tl.where(work_RGJ == top_RG[:, :, None], MIN_KEY, work_RGJ)
    group_key_RG = tl.where((g_G < N_GROUPS)[None, :], _pack(score_RG, g_G[None, :]), MIN_KEY)
    # Keep the TOPK_GROUPS best groups (lower group index first on equal scores).
    kept_RG = g_G[None, :] < 0
    for _ in tl.static_range(TOPK_GROUPS):
        best_R = tl.max(group_key_RG, axis=1)
        won_RG = group_key_RG == best_R[:, None]
        kept_RG = kept_RG | won_RG
        group_key_RG = tl.where(won_RG, MIN_KEY, group_key_RG)
    # Top-k experts of the kept groups: one row-wide key max per step.
    cand_RGJ = tl.where(kept_RG[:, :, None], key_RGJ, MIN_KEY)
    ids_RK = tl.zeros((ROWS, K_PAD), dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best_R = tl.max(tl.max(cand_RGJ, axis=2), axis=1)
        ids_RK = tl.where(slot_K[None, :] == i, _key_index(best_R)[:, None], ids_RK)
        cand_RGJ = tl.where(cand_RGJ == best_R[:, None, None], MIN_KEY, cand_RGJ)
    return ids_RK


# ---- selection by FP32 max, then the lowest index holding it ----------------------------------------
@triton.jit
def _top_experts_by_values(b_RGJ, valid_1GJ, expert_1GJ, g_G, j_J, slot_K, ROWS: tl.constexpr,
                           N_GROUPS: tl.constexpr, TOPK_GROUPS: tl.constexpr, TOP_K: tl.constexpr,
                           GROUP_SCORE_TOPK: tl.constexpr, G_PAD: tl.constexpr, J_PAD: tl.constexpr,
                           K_PAD: tl.constexpr):  # fmt: skip
    """As _top_experts_by_keys, on 32-bit values."""
    g_1G = g_G[None, :]
    j_11J = j_J[None, None, :]
    # Padding lanes hold -inf: never a group's top entry while real experts remain.
    b_RGJ = tl.where(valid_1GJ, b_RGJ, float("-inf"))
    # Group scores. Only the winner's slot is removed between steps (the lowest j among equal
    # values), so equal b count twice.
    work_RGJ = b_RGJ
    score_RG = tl.max(work_RGJ, axis=2)
    for _ in tl.static_range(GROUP_SCORE_TOPK - 1):
        top_RG = tl.max(work_RGJ, axis=2)
        first_j_RG = tl.min(tl.where(work_RGJ == top_RG[:, :, None], j_11J, J_PAD), axis=2)
        work_RGJ = tl.where(j_11J == first_j_RG[:, :, None], float("-inf"), work_RGJ)
        score_RG = score_RG + tl.max(work_RGJ, axis=2)
    score_RG = tl.where(g_1G < N_GROUPS, score_RG, float("-inf"))
    kept_RG = g_1G < 0
    for _ in tl.static_range(TOPK_GROUPS):
        best_R = tl.max(score_RG, axis=1)
        won_R = tl.min(tl.where(score_RG == best_R[:, None], g_1G, G_PAD), axis=1)
        won_RG = g_1G == won_R[:, None]
        kept_RG = kept_RG | won_RG
        score_RG = tl.where(won_RG, float("-inf"), score_RG)
    cand_RGJ = tl.where(kept_RG[:, :, None], b_RGJ, float("-inf"))
    ids_RK = tl.zeros((ROWS, K_PAD), dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best_R = tl.max(tl.max(cand_RGJ, axis=2), axis=1)
        hit_RGJ = cand_RGJ == best_R[:, None, None]
        won_R = tl.min(tl.min(tl.where(hit_RGJ, expert_1GJ, G_PAD * J_PAD), axis=2), axis=1)
        ids_RK = tl.where(slot_K[None, :] == i, won_R[:, None], ids_RK)
        cand_RGJ = tl.where(expert_1GJ == won_R[:, None, None], float("-inf"), cand_RGJ)
    return ids_RK


# cache_results: the winner is stored in Triton's cache, so later processes on this machine (the
# harness's parity and benchmark children, a model run) use the config that was checked, untuned.
@triton.autotune(
    configs=_configs(),
    key=["t_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _moe_route_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    T,
    stride_lt,
    stride_le,
    routed_scaling,
    t_bucket,  # read only by the autotuner's key
    N_GROUPS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    GROUP_SCORE_TOPK: tl.constexpr,
    G_PAD: tl.constexpr,
    J_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    PACKED: tl.constexpr,
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    rows_R = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok_R = rows_R < T
    g_G = tl.arange(0, G_PAD)
    j_J = tl.arange(0, J_PAD)
    expert_1GJ = g_G[None, :, None] * GROUP_SIZE + j_J[None, None, :]
    valid_1GJ = (g_G < N_GROUPS)[None, :, None] & (j_J < GROUP_SIZE)[None, None, :]
    load_RGJ = row_ok_R[:, None, None] & valid_1GJ
    row_off_R = rows_R.to(tl.int64) * stride_lt

    logits_RGJ = tl.load(logits_ptr + row_off_R[:, None, None] + expert_1GJ * stride_le, mask=load_RGJ, other=0.0)
    bias_1GJ = tl.load(bias_ptr + expert_1GJ, mask=valid_1GJ, other=0.0)
    b_RGJ = _sigmoid(logits_RGJ) + bias_1GJ
    slot_K = tl.arange(0, K_PAD)
    if PACKED:
        ids_RK = _top_experts_by_keys(b_RGJ, valid_1GJ, expert_1GJ, g_G, slot_K, ROWS, N_GROUPS, TOPK_GROUPS, TOP_K,
                                      GROUP_SCORE_TOPK, G_PAD, K_PAD)  # fmt: skip
    else:
        ids_RK = _top_experts_by_values(b_RGJ, valid_1GJ, expert_1GJ, g_G, j_J, slot_K, ROWS, N_GROUPS, TOPK_GROUPS,
                                        TOP_K, GROUP_SCORE_TOPK, G_PAD, J_PAD, K_PAD)  # fmt: skip

    # Weights from the chosen experts' s (recomputed from their logits: same function, same bits).
    # (ids_RK < E only fails for NaN logits, where no b equals the max: never read past the row.)
    out_RK = row_ok_R[:, None] & (slot_K < TOP_K)[None, :]
    read_RK = out_RK & (ids_RK < N_GROUPS * GROUP_SIZE)
    chosen_logits_RK = tl.load(logits_ptr + row_off_R[:, None] + ids_RK * stride_le, mask=read_RK, other=0.0)
    s_RK = tl.where(out_RK, _sigmoid(chosen_logits_RK), 0.0)
    # The sum in FP64, rounded once: the correctly rounded FP32 sum, which any FP32 order can only
    # match or miss by an ulp (8 adds per row: free). Rows past T get 1, not 0/0.
    total_R = tl.where(row_ok_R, tl.sum(s_RK.to(tl.float64), axis=1).to(tl.float32), 1.0)
    w_RK = tl.math.div_rn(s_RK, total_R[:, None]) * routed_scaling
    out_off_RK = rows_R[:, None].to(tl.int64) * TOP_K + slot_K[None, :]
    tl.store(weights_ptr + out_off_RK, w_RK, mask=out_RK)
    tl.store(ids_ptr + out_off_RK, ids_RK.to(tl.int64), mask=out_RK)


def moe_route(
    logits_TE: torch.Tensor,
    correction_bias_E: torch.Tensor,
    n_groups: int,
    topk_groups: int,
    top_k: int,
    group_score_topk: int,
    routed_scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weights_Tk FP32, ids_Tk int64) as ops.moe_route does; ids in descending biased score."""
    if logits_TE.dim() != 2:
        raise ValueError(f"logits_TE must be [T, E]; got shape {tuple(logits_TE.shape)}")
    T, E = logits_TE.shape
    if logits_TE.dtype != torch.float32 or correction_bias_E.dtype != torch.float32:
        raise ValueError(
            f"logits_TE and correction_bias_E must be float32; got {logits_TE.dtype} and {correction_bias_E.dtype}"
        )
    if correction_bias_E.shape != (E,):
        raise ValueError(f"correction_bias_E must be [{E}]; got {tuple(correction_bias_E.shape)}")
    if n_groups < 1 or E % n_groups:
        raise ValueError(f"E={E} experts must split into n_groups={n_groups} equal groups")
    group_size = E // n_groups
    if not (0 < topk_groups <= n_groups and 0 < group_score_topk <= group_size):
        raise ValueError(
            f"need 0 < topk_groups <= n_groups and 0 < group_score_topk <= experts per group; got "
            f"topk_groups={topk_groups}, n_groups={n_groups}, group_score_topk={group_score_topk}, "
            f"experts per group={group_size}"
        )
    if not 0 < top_k <= topk_groups * group_size:
        raise ValueError(f"top_k={top_k} outside 1..{topk_groups * group_size} (experts in the kept groups)")

    weights_Tk = torch.empty((T, top_k), dtype=torch.float32, device=logits_TE.device)
    ids_Tk = torch.empty((T, top_k), dtype=torch.int64, device=logits_TE.device)
    if T == 0:
        return weights_Tk, ids_Tk
    bias_E = correction_bias_E.contiguous()
    _tuning_rows[0] = _t_bucket(T)
    _moe_route_kernel[lambda meta: (triton.cdiv(T, meta["ROWS"]),)](
        logits_TE,
        bias_E,
        weights_Tk,
        ids_Tk,
        T,
        logits_TE.stride(0),
        logits_TE.stride(1),
        routed_scaling,
        _t_bucket(T),
        N_GROUPS=n_groups,
        GROUP_SIZE=group_size,
        TOPK_GROUPS=topk_groups,
        TOP_K=top_k,
        GROUP_SCORE_TOPK=group_score_topk,
        G_PAD=triton.next_power_of_2(n_groups),
        J_PAD=triton.next_power_of_2(group_size),
        K_PAD=triton.next_power_of_2(top_k),
    )
    return weights_Tk, ids_Tk
