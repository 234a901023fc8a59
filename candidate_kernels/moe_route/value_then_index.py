"""moe_route in one kernel: sigmoid, bias, grouped top-k and the weights; FP32 max, then lowest id.

Author: human (kernels team, issue 4), hand-written.

Why it is faster: the reference runs about 15 kernels per call (sigmoid, add, view/topk/sum for
the group scores, topk of the groups, a scatter for the mask, masked_fill, topk, gather, sum,
two divisions), each a launch and a pass over [T, 256]. Here one program reads ROWS rows of
logits once and writes the 8 ids and 8 weights of each: at T = 1 the cost is one launch, at
T = 16384 it is the 16.8 MB read plus the per-row selection arithmetic.

Floor (bytes / 4275 GB/s, bytes = T*E*4 + E*4 + T*k*12, E = 256, k = 8):
  T=1, 8, 64  <= 82 KB -> < 0.02 us: latency bound, the floor is one launch (~2 us graph replay)
  T=16384     18.4 MB  -> 4.3 us (goal <= 40 us: the selection arithmetic, not bytes, bounds it)
Measured on the H200 (second session, commit 2a30055; results/README.md): p50 T=1 4.79 us, T=3 3.86, T=8 3.90,
  T=64 4.91, T=1000 63.8, T=16384 80.4 us; torch.compile 35.0 / 36.6 / 37.7 / 40.9 / 221 / 638 us.
  Goals met at T=64 (<= 5); missed at T=1 (by 0.8 us) and T=16384 (by 40 us, as packed_keys).
Fourth session (commit 0133681, GPU held during event windows): T=1 4.05 us, T=3 3.92, T=8 5.07,
  T=64 4.16, T=1000 14.82, T=16384 38.91 us (goal <= 40 met; packed_keys 48.95); beats every
  baseline beyond noise on every shape, but packed_keys (faster at T <= 64) was promoted.

Sibling of packed_keys.py (same kernel, same numerics), with the selection on 32-bit values: each
top-k step is an FP32 max over the row, then a min over the ids that hold it (ties: lowest id),
then the winner's slot set to -inf. Two reductions per step where packed_keys has one 64-bit one,
but every element op is one 32-bit instruction instead of a pair: about 1100 warp instructions per
row against 1430 (sm_90 SASS, 4 rows per 1-warp program), so it should win where throughput
counts (T = 16384) and may lose where the dependent chain of shuffles does (T = 1).

Numerics (reference_model/ops.py moe_route, BEAM.md §4):
- s = 1 / (1 + exp(-x)) in FP32, the formula of torch's CUDA sigmoid, with libdevice's __nv_expf
  (what its std::exp calls) and an IEEE division (div_rn; Triton's `/` on FP32 is div.full, an
  approximation): s is bit-identical to torch's on the GPU. The interpreter has no libdevice and
  torch's CPU sigmoid (SLEEF) is not reproducible there, so on CPU s is the FP64 sigmoid rounded
  once (chosen at import time): within an ulp of torch's, never further from FP64.
- b = s + bias (FP32, selection only). A group's score is the sum of its group_score_topk largest
  b, added largest first (for the default 2 the order cannot matter: a + b == b + a).
- Ties: the group with the lower index, then the expert with the lower id wins, which is what
  torch.topk returns in practice (it does not promise an order); the task's inputs have no
  near-ties, so expert sets are identical to the reference's.
- Weights: the chosen experts' s are recomputed from their logits (same function, same bits) and
  summed in FP64, rounded once to FP32: the correctly rounded sum, where torch's FP32 sum (its own
  tree order) may be an ulp or two off. Then w = (s / sum) * routed_scaling, the reference's
  operation order, with an IEEE division. So w is never further from FP64 than the reference's
  by more than the sum's rounding, usually closer.
  ids are int64 in descending b, as torch.topk returns them.

Launch: grid = cdiv(T, ROWS); ROWS rows per program as a [ROWS, G, E/G] tile (groups and experts
padded to powers of two and masked, so any n_groups / experts per group works). ROWS and warps are
autotuned per T bucket. One warp per program keeps every reduction inside the warp (shuffles, no
bar.sync; with 2+ warps per row sm_90 code has ~40 barriers); decode wants one row per program
(its latency is the load plus ~20 dependent reductions), prefill several rows per 1-warp program:
independent chains for the scheduler and the address arithmetic paid once per program.

Shape legend: T tokens, E experts, G groups, J experts per group, k top-k, R rows per program.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "packed_keys.py",
    "idea": "one kernel: sigmoid+bias, group top-2 scores, top groups, top-k by FP32 max then lowest id (32-bit ops)",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs one
# config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

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
        return [triton.Config({"ROWS": 2}, num_warps=1)]
    return [
        triton.Config({"ROWS": rows}, num_warps=warps)
        for rows, warps in ((1, 1), (1, 2), (2, 1), (4, 1), (8, 1), (8, 2), (16, 4))
    ]


def _prune(configs, named_args, **kwargs):
    """A program never holds more rows than there are (T = 1 runs only the one-row configs)."""
    t_bucket = named_args["t_bucket"]
    fit = [c for c in configs if c.kwargs["ROWS"] <= t_bucket]
    return fit or [min(configs, key=lambda c: c.kwargs["ROWS"])]


def _t_bucket(T: int) -> int:
    """Autotuning key for the row count: the next power of two, capped at 16384."""
    return min(triton.next_power_of_2(T), 16384)


# cache_results: the winner is stored in Triton's cache, so later processes on this machine (the
# harness's parity and benchmark children, a model run) use the config that was checked, untuned.
@triton.autotune(
    configs=_configs(),
    key=["t_bucket"],
    prune_configs_by={"early_config_prune": _prune},
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
):
    rows_R = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok_R = rows_R < T
    g_G = tl.arange(0, G_PAD)
    j_J = tl.arange(0, J_PAD)
    g_1G = g_G[None, :]
    j_11J = j_J[None, None, :]
    expert_1GJ = g_G[None, :, None] * GROUP_SIZE + j_11J
    valid_1GJ = (g_G < N_GROUPS)[None, :, None] & (j_J < GROUP_SIZE)[None, None, :]
    load_RGJ = row_ok_R[:, None, None] & valid_1GJ
    row_off_R = rows_R.to(tl.int64) * stride_lt

    logits_RGJ = tl.load(logits_ptr + row_off_R[:, None, None] + expert_1GJ * stride_le, mask=load_RGJ, other=0.0)
    bias_1GJ = tl.load(bias_ptr + expert_1GJ, mask=valid_1GJ, other=0.0)
    # Padding lanes hold -inf: never a group's top entry while real experts remain.
    b_RGJ = tl.where(valid_1GJ, _sigmoid(logits_RGJ) + bias_1GJ, float("-inf"))

    # Group scores: the sum of each group's GROUP_SCORE_TOPK largest b, largest first. Only the
    # winner's slot is removed between steps (the lowest j among equal values), so equal b count twice.
    work_RGJ = b_RGJ
    score_RG = tl.max(work_RGJ, axis=2)
    for _ in tl.static_range(GROUP_SCORE_TOPK - 1):
        top_RG = tl.max(work_RGJ, axis=2)
        first_j_RG = tl.min(tl.where(work_RGJ == top_RG[:, :, None], j_11J, J_PAD), axis=2)
        work_RGJ = tl.where(j_11J == first_j_RG[:, :, None], float("-inf"), work_RGJ)
        score_RG = score_RG + tl.max(work_RGJ, axis=2)
    score_RG = tl.where(g_1G < N_GROUPS, score_RG, float("-inf"))

    # Keep the TOPK_GROUPS best groups (lower group index first on equal scores).
    kept_RG = g_1G < 0
    for _ in tl.static_range(TOPK_GROUPS):
        best_R = tl.max(score_RG, axis=1)
        won_R = tl.min(tl.where(score_RG == best_R[:, None], g_1G, G_PAD), axis=1)
        won_RG = g_1G == won_R[:, None]
        kept_RG = kept_RG | won_RG
        score_RG = tl.where(won_RG, float("-inf"), score_RG)

    # Top-k experts of the kept groups, in descending b (the lowest id first among equal b).
    cand_RGJ = tl.where(kept_RG[:, :, None], b_RGJ, float("-inf"))
    slot_K = tl.arange(0, K_PAD)
    ids_RK = tl.zeros((ROWS, K_PAD), dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best_R = tl.max(tl.max(cand_RGJ, axis=2), axis=1)
        hit_RGJ = cand_RGJ == best_R[:, None, None]
        won_R = tl.min(tl.min(tl.where(hit_RGJ, expert_1GJ, G_PAD * J_PAD), axis=2), axis=1)
        ids_RK = tl.where(slot_K[None, :] == i, won_R[:, None], ids_RK)
        cand_RGJ = tl.where(expert_1GJ == won_R[:, None, None], float("-inf"), cand_RGJ)

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
