"""Every op that a task may replace, as a pure function, with the numerics contract of BEAM.md §5.

The contract: an op reads BF16 tensors, upcasts to FP32, computes in FP32 and rounds its output
to BF16 exactly once (the router and its logits stay FP32). Where the unfused model would round
between two steps (the post-norm output before the residual add, the new residual stream before
the next pre-norm, the normalized q/k before RoPE), the op rounds there too: a fused kernel must
keep these rounding points, or it computes a different function.

Positional factors (RoPE cos/sin, the SSMax scale) are not computed inside the ops: they are
tables built once in FP64 and rounded to FP32 (`rope_table`, `ssmax_table`), indexed by position.
That makes them bit-identical for every implementation, instead of depending on which sin/pow a
kernel library links.

The model calls these functions and nothing else for the math they cover; each task imports the
very same function as its reference.

Shape legend: T tokens, D hidden, H query heads, K kv heads, Dh head dim, F d_ff, E experts,
k top-k, P table positions, S cache slots, N packed projection rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16
FP32 = torch.float32


# ---- norms and the residual stream ----------------------------------------------------------
def _rms_norm_fp32(x32: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, all FP32: x * rsqrt(mean(x^2) + eps) * w."""
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x32 * inv_rms * weight.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """BF16 in, FP32 math, BF16 out. Normalizes over the last dim (per head when x is [T, H, Dh])."""
    return _rms_norm_fp32(x.float(), weight, eps).to(BF16)


def residual_coefficients(n: int) -> tuple[float, float]:
    """The n-th residual addition is h <- sqrt((n-1)/n) * h + x / sqrt(n) (n >= 2; the embedding is n = 1)."""
    if n < 2:
        raise ValueError(f"residual addition index n must be >= 2 (the embedding is n = 1); got {n}")
    return math.sqrt((n - 1) / n), 1.0 / math.sqrt(n)


def norm_residual_norm(
    y_TD: torch.Tensor,
    h_TD: torch.Tensor,
    post_weight_D: torch.Tensor,
    pre_weight_D: torch.Tensor,
    n: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The boundary between sublayer k and k+1 (task `fuse_norm`).

    post = bf16(rmsnorm(y) * post_weight)                       rounding point 1
    h'   = bf16(a * f32(h) + b * f32(post)), (a, b) = residual_coefficients(n)   rounding point 2
    x    = bf16(rmsnorm(f32(h')) * pre_weight)                   rounding point 3
    Returns (h', x): the new residual stream and the next sublayer's normalized input.
    """
    post_TD = rms_norm(y_TD, post_weight_D, eps)
    a, b = residual_coefficients(n)
    h_new_TD = (h_TD.float() * a + post_TD.float() * b).to(BF16)
    x_TD = rms_norm(h_new_TD, pre_weight_D, eps)
    return h_new_TD, x_TD


# ---- attention: projections, per-head norms, positions, cache write, gate -------------------
def rope_table(max_positions: int, head_dim: int, theta: float) -> torch.Tensor:
    """[P, Dh] FP32: cos of the Dh/2 frequencies in the first half, sin in the second (FP64, rounded once)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles_PD2 = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles_PD2.cos(), angles_PD2.sin()], dim=-1).to(FP32)


def ssmax_table(max_positions: int, base: float, exponent: float) -> torch.Tensor:
    """[P] FP32: the SSMax query scale (1 + p/base)^exponent, p the 1-based position of token at index p-1."""
    p = torch.arange(1, max_positions + 1, dtype=torch.float64)
    return (1.0 + p / base).pow(exponent).to(FP32)


def _rotate_half_rope(x32_THD: torch.Tensor, cos_sin_TD: torch.Tensor) -> torch.Tensor:
    half = x32_THD.shape[-1] // 2
    cos, sin = cos_sin_TD[:, None, :half], cos_sin_TD[:, None, half:]
    x1, x2 = x32_THD[..., :half], x32_THD[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def qk_norm_rope(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    positions_T: torch.Tensor,
    slot_mapping_T: torch.Tensor,
    k_cache_SKD: torch.Tensor,
    v_cache_SKD: torch.Tensor,
    rope_cos_sin_PD: torch.Tensor | None,
    ssmax_scale_P: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head Q/K RMSNorm, then RoPE (sliding-window layers) or SSMax (global layers), then the KV write.

    Exactly one of `rope_cos_sin_PD` (sliding-window layer) and `ssmax_scale_P` (global layer) is given.
    q_n = bf16(rmsnorm_Dh(q) * q_norm_weight), k_n likewise            rounding point 1
    sliding: q' = bf16(rope(f32(q_n))), k' = bf16(rope(f32(k_n)))     rounding point 2
    global:  q' = bf16(f32(q_n) * ssmax[pos]),  k' = k_n               (keys are not scaled)
    Writes k' and v into the caches at rows slot_mapping_T (in place). Returns (q', k'): the queries
    for attention and the keys just written, which prefill attention needs because a window's ring
    may already have been overwritten.
    """
    if (rope_cos_sin_PD is None) == (ssmax_scale_P is None):
        raise ValueError("qk_norm_rope needs exactly one of rope_cos_sin_PD (sliding) and ssmax_scale_P (global)")
    q_n = rms_norm(q_THD, q_norm_weight, eps)
    k_n = rms_norm(k_TKD, k_norm_weight, eps)
    if rope_cos_sin_PD is not None:
        cos_sin_TD = rope_cos_sin_PD[positions_T]
        q_out = _rotate_half_rope(q_n.float(), cos_sin_TD).to(BF16)
        k_out = _rotate_half_rope(k_n.float(), cos_sin_TD).to(BF16)
    else:
        q_out = (q_n.float() * ssmax_scale_P[positions_T][:, None, None]).to(BF16)
        k_out = k_n
    write_kv_cache(k_out, v_TKD, slot_mapping_T, k_cache_SKD, v_cache_SKD)
    return q_out, k_out


def write_kv_cache(
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    slot_mapping_T: torch.Tensor,
    k_cache_SKD: torch.Tensor,
    v_cache_SKD: torch.Tensor,
) -> None:
    """k_cache[slot_mapping[t]] = k[t] and likewise v, in place, without host synchronization.

    Valid slots within one call are distinct. A slot of -1 means "do not keep this token" (a
    sliding-window prefill chunk longer than the window keeps only its last `window` tokens):
    the cache's last row is a discard row that is never read, and -1 indexes it, so an
    implementation may write such tokens there or skip them.
    """
    k_cache_SKD[slot_mapping_T] = k_TKD
    v_cache_SKD[slot_mapping_T] = v_TKD


def attention(
    q_THD: torch.Tensor,
    k_SKD: torch.Tensor,
    v_SKD: torch.Tensor,
    q_positions_T: torch.Tensor,
    k_positions_S: torch.Tensor,
    window: int | None,
    query_chunk: int = 256,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v with GQA, FP32 scores and softmax, BF16 out [T, H, Dh].

    A query at position p sees keys at positions j with j <= p, and j > p - window on
    sliding-window layers. Keys with a negative position are empty slots and never seen.
    One sequence per call; queries are processed `query_chunk` at a time to bound memory.
    """
    T, H, Dh = q_THD.shape
    K = k_SKD.shape[1]
    scale = 1.0 / math.sqrt(Dh)
    k32_KSD = k_SKD.float().permute(1, 0, 2)
    v32_KSD = v_SKD.float().permute(1, 0, 2)
    out = []
    for start in range(0, T, query_chunk):
        q32_KGtD = q_THD[start : start + query_chunk].float().view(-1, K, H // K, Dh).permute(1, 2, 0, 3)
        scores_KGtS = torch.matmul(q32_KGtD, k32_KSD[:, None].transpose(-1, -2)) * scale
        qp_t1 = q_positions_T[start : start + query_chunk, None]
        kp_1S = k_positions_S[None, :]
        visible_tS = (kp_1S <= qp_t1) & (kp_1S >= 0)
        if window is not None:
            visible_tS &= kp_1S > qp_t1 - window
        scores_KGtS = scores_KGtS.masked_fill(~visible_tS, float("-inf"))
        probs_KGtS = torch.softmax(scores_KGtS, dim=-1)
        o_KGtD = torch.matmul(probs_KGtS, v32_KSD[:, None])
        out.append(o_KGtD.permute(2, 0, 1, 3).reshape(-1, H, Dh))
    return torch.cat(out).to(BF16)


def output_gate(o_THD: torch.Tensor, g_THD: torch.Tensor, bias_H: torch.Tensor) -> torch.Tensor:
    """o * sigmoid(g + b[h]) in FP32, one rounding to BF16 (task `output_gate`)."""
    gate = torch.sigmoid(g_THD.float() + bias_H.float()[None, :, None])
    return (o_THD.float() * gate).to(BF16)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """BF16 GEMM with FP32 accumulation, BF16 out: x @ weight^T."""
    return F.linear(x, weight)


def qkv_gate_proj(x_TD: torch.Tensor, w_qkvg_ND: torch.Tensor) -> torch.Tensor:
    """The packed q | k | v | gate projection as one GEMM [T, N] (task `qkv_gate_gemm`)."""
    return linear(x_TD, w_qkvg_ND)


def pack_qkv_gate(wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
    """Load-time transformation: the four projection weights as one [N, D] matrix, rows q | k | v | gate."""
    return torch.cat([wq, wk, wv, wg], dim=0).contiguous()


# ---- MLP and MoE ----------------------------------------------------------------------------
def swiglu(gate_TF: torch.Tensor, up_TF: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in FP32, one rounding to BF16 (task `dense_act`)."""
    g = gate_TF.float()
    return (g * torch.sigmoid(g) * up_TF.float()).to(BF16)


def router_logits(x_TD: torch.Tensor, w_router_ED: torch.Tensor) -> torch.Tensor:
    """FP32 router: BF16 input upcast, FP32 weights, FP32 accumulation without TF32, FP32 logits [T, E]."""
    if x_TD.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        raise RuntimeError("router_logits must not run with TF32 enabled (torch.backends.cuda.matmul.allow_tf32)")
    return torch.matmul(x_TD.float(), w_router_ED.t())


def moe_route(
    logits_TE: torch.Tensor,
    correction_bias_E: torch.Tensor,
    n_groups: int,
    topk_groups: int,
    top_k: int,
    group_score_topk: int,
    routed_scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 grouped top-k routing (task `moe_route`). Returns (weights_Tk FP32, ids_Tk int64).

    s = sigmoid(logits); b = s + correction_bias (selection only). A group's score is the sum of
    its best `group_score_topk` b; the best `topk_groups` groups stay; among their experts the
    `top_k` largest b are chosen (ids in descending b). Weights are the chosen s, normalized to
    sum 1, times `routed_scaling`.
    """
    T, E = logits_TE.shape
    s_TE = torch.sigmoid(logits_TE.float())
    b_TE = s_TE + correction_bias_E.float()
    group_scores_TG = b_TE.view(T, n_groups, -1).topk(group_score_topk, dim=-1).values.sum(dim=-1)
    kept_groups_Tg = group_scores_TG.topk(topk_groups, dim=-1).indices
    group_mask_TG = torch.zeros_like(group_scores_TG, dtype=torch.bool).scatter_(1, kept_groups_Tg, True)
    expert_mask_TE = group_mask_TG[:, :, None].expand(T, n_groups, E // n_groups).reshape(T, E)
    ids_Tk = b_TE.masked_fill(~expert_mask_TE, float("-inf")).topk(top_k, dim=-1).indices
    w_Tk = s_TE.gather(1, ids_Tk)
    w_Tk = w_Tk / w_Tk.sum(dim=-1, keepdim=True) * routed_scaling
    return w_Tk, ids_Tk


def expert_mlp(
    x_TD: torch.Tensor,
    w_gate_FD: torch.Tensor,
    w_up_FD: torch.Tensor,
    w_down_DF: torch.Tensor,
    act: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = swiglu,
) -> torch.Tensor:
    """down(act(x Wgate, x Wup)): one SwiGLU MLP, dense layer or single expert. BF16 out."""
    return linear(act(linear(x_TD, w_gate_FD), linear(x_TD, w_up_FD)), w_down_DF)


def moe_experts(
    x_TD: torch.Tensor,
    weights_Tk: torch.Tensor,
    ids_Tk: torch.Tensor,
    w_gate_EFD: torch.Tensor,
    w_up_EFD: torch.Tensor,
    w_down_EDF: torch.Tensor,
) -> torch.Tensor:
    """sum_j w_j * expert_{ids_j}(x): each expert's BF16 output weighted and summed in FP32, rounded once.

    Two formulations of the same function. Few (token, expert) pairs (decode): gather the chosen
    experts' weights and run batched GEMMs: no host synchronization, so it replays in a CUDA
    graph, and only the chosen experts are read. Many pairs (prefill): group tokens by expert on
    the host and run one GEMM per used expert. They agree up to BF16 GEMM accumulation order.
    """
    T, D = x_TD.shape
    k = ids_Tk.shape[1]
    if T * k <= w_gate_EFD.shape[0]:
        x_Pk1D = x_TD.repeat_interleave(k, dim=0)[:, None, :]
        ids_P = ids_Tk.reshape(-1)
        gate_P1F = torch.bmm(x_Pk1D, w_gate_EFD[ids_P].transpose(1, 2))
        up_P1F = torch.bmm(x_Pk1D, w_up_EFD[ids_P].transpose(1, 2))
        y_PD = torch.bmm(swiglu(gate_P1F, up_P1F), w_down_EDF[ids_P].transpose(1, 2))[:, 0]
        return (y_PD.float().view(T, k, D) * weights_Tk[:, :, None]).sum(dim=1).to(BF16)
    out32_TD = torch.zeros(T, D, dtype=FP32, device=x_TD.device)
    for e in ids_Tk.unique().tolist():
        token_T, slot_T = (ids_Tk == e).nonzero(as_tuple=True)
        y_TD = expert_mlp(x_TD[token_T], w_gate_EFD[e], w_up_EFD[e], w_down_EDF[e])
        out32_TD.index_add_(0, token_T, y_TD.float() * weights_Tk[token_T, slot_T, None])
    return out32_TD.to(BF16)


def lm_head_logits(x_TD: torch.Tensor, w_VD: torch.Tensor) -> torch.Tensor:
    """FP32 logits [T, V] from BF16 activations and weights: FP32 accumulation, FP32 output.

    On CUDA, one GEMM with an FP32 output (no BF16 rounding of the logits, no FP32 copy of the
    weights); on CPU, where that GEMM does not exist, an FP32 product of the upcast operands.
    """
    if x_TD.is_cuda:
        return torch.mm(x_TD, w_VD.t(), out_dtype=FP32)
    return torch.matmul(x_TD.float(), w_VD.float().t())


# ---- the ops the model takes as an argument -------------------------------------------------
@dataclass(frozen=True)
class ModelOps:
    """The replaceable ops. The reference model uses the defaults; the optimized model fills the
    fields from promotion records. Each field's signature is that of the reference function."""

    norm_residual_norm: Callable = norm_residual_norm
    rms_norm: Callable = rms_norm
    qkv_gate_proj: Callable = qkv_gate_proj
    qk_norm_rope: Callable = qk_norm_rope
    attention: Callable = attention
    output_gate: Callable = output_gate
    linear: Callable = linear
    swiglu: Callable = swiglu
    router_logits: Callable = router_logits
    moe_route: Callable = moe_route
    moe_experts: Callable = moe_experts
    lm_head_logits: Callable = lm_head_logits


REFERENCE_OPS = ModelOps()
