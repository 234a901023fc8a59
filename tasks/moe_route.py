"""moe_route: DeepSeek-V3 grouped top-k routing of the MoE layers in one pass.

Beyond the published account (BEAM.md §6). Reference: ops.moe_route: s = sigmoid(logits),
b = s + correction_bias; group score = sum of its best 2 b; keep the best 4 of 8 groups; the 8
largest b among their 128 experts; weights = chosen s / their sum * 2.5 (FP32), ids int64.

Inputs: FP32 router logits with a realistic spread: a per-expert popularity offset N(-1, 0.5^2)
(shared by the tokens of one call) plus N(0, 1.5^2) per token, so s spans about 0.02 .. 0.95;
the correction bias as the model initializes it, N(0, 0.05^2) in FP32, which changes the
selection of many tokens (the median gap at a selection boundary is a few thousandths).

No near-ties, by construction. A selection boundary with a near-tie would make the expert set
depend on the last ulp of sigmoid (which differs between exp implementations), parity judges the
id sets exactly, and the FP64 evaluation of the weights must select the same experts as FP32.
So make_inputs computes, per token, the margins at every boundary, in FP32 with the reference's
formulas:
  - within each group, between its group_score_topk-th and next largest b (which b enter the sum),
  - between the topk_groups-th and the next group score (which groups stay),
  - among the kept groups' experts, between the top_k-th and the next b (which experts are chosen),
and redraws the logits of every token whose smallest margin is below MIN_MARGIN, until none is.
MIN_MARGIN = 16 FP32 epsilons = 1.9e-6, absolute: b < 2 (ulp <= 1.2e-7, so >= 16 ulps) and group
scores < 4 (ulp <= 2.4e-7, so >= 8 ulps). Redrawing changes the distribution only by conditioning
on margins that small, which occur for a few tokens in ten thousand.

Parity: ids as sets per token (identical to the reference's); weights FP32, paired with the ids
(compared after sorting each row by id), normwise relative error against FP64 at most 1e-6.

Cost floor: read the logits and the bias, write the weights (FP32) and the ids (int64):
    bytes = T*E*4 + E*4 + T*k*4 + T*k*8
    flops = 5*T*E  (sigmoid as neg/exp/add/div, bias add; the selection is comparisons)

Baseline: flashinfer.fused_moe.fused_topk_deepseek, Beam's routing exactly (sigmoid inside, group
score = sum of the top 2; at most 32 experts per group and 128 experts in the kept groups). It
writes int32 ids (it refuses int64: seen on the H200); their widening to int64 is timed with it.

Shape legend: T tokens, E experts, G groups, k top-k.
"""

from __future__ import annotations

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.libraries import flashinfer_module
from tasks.task import BaselineUnavailable, Cost, Goal, OutputCheck, Shape, Task

MIN_MARGIN = 16 * torch.finfo(torch.float32).eps
MAX_REDRAWS = 64
LOGIT_STD = 1.5
EXPERT_OFFSET_MEAN, EXPERT_OFFSET_STD = -1.0, 0.5


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    params = {
        "preset": cfg.name,
        "T": T,
        "E": cfg.n_experts,
        "n_groups": cfg.n_groups,
        "topk_groups": cfg.topk_groups,
        "top_k": cfg.top_k,
        "group_score_topk": cfg.group_score_topk,
    }
    return Shape(label, params)


def selection_margins(
    logits_TE: torch.Tensor,
    correction_bias_E: torch.Tensor,
    n_groups: int,
    topk_groups: int,
    top_k: int,
    group_score_topk: int,
) -> torch.Tensor:
    """[T] FP32: per token, the smallest gap at any selection boundary of ops.moe_route (see above).
    A boundary that does not exist (e.g. every group kept) contributes +inf."""
    T, E = logits_TE.shape
    b_TGe = (torch.sigmoid(logits_TE.float()) + correction_bias_E.float()).view(T, n_groups, E // n_groups)
    inf_T = torch.full((T,), float("inf"), device=logits_TE.device)
    sorted_TGe = b_TGe.sort(dim=-1, descending=True).values
    within_T = inf_T
    if group_score_topk < E // n_groups:
        gaps_TG = sorted_TGe[..., group_score_topk - 1] - sorted_TGe[..., group_score_topk]
        within_T = gaps_TG.amin(dim=-1)
    group_scores_TG = sorted_TGe[..., :group_score_topk].sum(dim=-1)
    scores_sorted_TG, order_TG = group_scores_TG.sort(dim=-1, descending=True)
    group_cut_T = inf_T
    if topk_groups < n_groups:
        group_cut_T = scores_sorted_TG[:, topk_groups - 1] - scores_sorted_TG[:, topk_groups]
    kept_b_T_ = b_TGe.gather(1, order_TG[:, :topk_groups, None].expand(-1, -1, E // n_groups)).reshape(T, -1)
    expert_cut_T = inf_T
    if top_k < kept_b_T_.shape[1]:
        kept_sorted = kept_b_T_.sort(dim=-1, descending=True).values
        expert_cut_T = kept_sorted[:, top_k - 1] - kept_sorted[:, top_k]
    return torch.minimum(torch.minimum(within_T, group_cut_T), expert_cut_T)


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    cfg = get_config(shape["preset"])
    T, E = shape["T"], shape["E"]
    routing = {k: shape[k] for k in ("n_groups", "topk_groups", "top_k", "group_score_topk")}
    gen = inputs.generator(seed, device)
    offset_E = EXPERT_OFFSET_MEAN + EXPERT_OFFSET_STD * torch.randn(E, generator=gen, device=gen.device)
    correction_bias_E = inputs.model_weight("correction_bias", (E,), gen, dtype=inputs.FP32)

    def draw(rows: int) -> torch.Tensor:
        return offset_E + LOGIT_STD * torch.randn((rows, E), generator=gen, device=gen.device)

    logits_TE = draw(T)
    for _ in range(MAX_REDRAWS):
        close_t = (selection_margins(logits_TE, correction_bias_E, **routing) < MIN_MARGIN).nonzero().flatten()
        if close_t.numel() == 0:
            break
        logits_TE[close_t] = draw(close_t.numel())
    else:
        raise RuntimeError(
            f"moe_route inputs: tokens still within {MIN_MARGIN:.2g} of a tie after {MAX_REDRAWS} redraws"
        )
    return {
        "logits_TE": logits_TE,
        "correction_bias_E": correction_bias_E,
        **routing,
        "routed_scaling": cfg.routed_scaling,
    }


def cost(shape: Shape) -> Cost:
    T, E, k = shape["T"], shape["E"], shape["top_k"]
    return Cost(bytes=T * E * 4 + E * 4 + T * k * 4 + T * k * 8, flops=5 * T * E)


def _flashinfer_fused_topk_deepseek():
    fused_moe = flashinfer_module("flashinfer.fused_moe", "flashinfer_fused_topk_deepseek")

    def moe_route(logits_TE, correction_bias_E, n_groups, topk_groups, top_k, group_score_topk, routed_scaling):
        if group_score_topk != 2:
            raise BaselineUnavailable(
                f"fused_topk_deepseek sums the top 2 of a group; got group_score_topk={group_score_topk}"
            )
        T = logits_TE.shape[0]
        weights_Tk = torch.empty(T, top_k, dtype=torch.float32, device=logits_TE.device)
        ids_Tk = torch.empty(T, top_k, dtype=torch.int32, device=logits_TE.device)  # the kernel writes int32 only
        try:
            fused_moe.fused_topk_deepseek(
                logits_TE, correction_bias_E, n_groups, topk_groups, top_k, routed_scaling, weights_Tk, ids_Tk
            )
        except ValueError as e:  # its admission check refuses the configuration (limits above)
            raise BaselineUnavailable(f"fused_topk_deepseek refuses this configuration: {e}") from e
        return weights_Tk, ids_Tk.long()  # the op's int64 ids: one more small kernel, part of its time

    return moe_route


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="moe_route",
    reference=ops.moe_route,
    make_inputs=make_inputs,
    outputs=(
        OutputCheck("weights_Tk", "fp32", rel_tol=1e-6, paired_with="ids_Tk"),
        OutputCheck("ids_Tk", "index_set"),
    ),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 16384, 3, 1000)),
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=7", _TINY, 7),
        _shape("T=4", _BEAM, 4),
    ),
    cost=cost,
    description="grouped top-k MoE routing: sigmoid, bias, 4 of 8 groups, top-8, normalized weights (BEAM.md §4)",
    baselines={"flashinfer_fused_topk_deepseek": _flashinfer_fused_topk_deepseek},
    goals=(
        Goal(max_us=4.0, shapes=("T=1",), max_launches=1, source="issue 4", gpu="H200"),
        Goal(max_us=5.0, shapes=("T=64",), max_launches=1, source="issue 4", gpu="H200"),
        Goal(max_us=40.0, shapes=("T=16384",), max_launches=1, source="issue 4", gpu="H200"),
    ),
)
