"""Beam, the reference model in pure PyTorch: one file, read top to bottom.

attention -> dense MLP -> MoE -> layer -> model (prefill, decode) -> parameter counts.

The math of every replaceable op lives in reference_model/ops.py; this file only wires it up and
calls `self.ops.<op>(...)`, so a model built with other ops (promoted kernels) runs those kernels
and nothing else changes. Everything here follows BEAM.md: sandwich norms around each of the
2 x n_layers sublayers, depth-scaled residuals (the embedding is addition n = 1, sublayer k is
added with n = k + 1), and the boundary "post-norm of k -> scaled residual -> pre-norm of k+1"
computed by ONE call of ops.norm_residual_norm (the last one with the final norm's weight).

Weights are allocated uninitialized on the target device; fill them with reference_model.weights
(`init_weights` for a seeded random model, `load_safetensors` for a checkpoint). Build on the
device you run on: never `.to()` a model (the packed projection's views would come apart).

Profiler ranges: "embedding", "L{l}.attention", "L{l}.mlp" (dense) or "L{l}.moe", "lm_head".
A sublayer's range covers the sublayer and the boundary after it (its post-norm, the residual
addition, the next sublayer's pre-norm).

Shape legend: T tokens of a step (all sequences concatenated), B sequences, D hidden, H query
heads, K kv heads, Dh head dim, Q = H*Dh, F dense d_ff, Fe expert d_ff, E experts, k top-k,
V vocabulary, N packed projection rows, S cache rows, P table positions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from reference_model import ops as reference_ops
from reference_model.cache import KVCache, Step
from reference_model.config import BeamConfig
from reference_model.ops import REFERENCE_OPS, ModelOps

BF16, FP32 = torch.bfloat16, torch.float32


def _param(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype = BF16) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)


# ---- attention -------------------------------------------------------------------------------
class Attention(nn.Module):
    """GQA attention with per-head q/k RMSNorm, RoPE + 512-window (sliding) or SSMax (global),
    and a sigmoid output gate with a per-head bias (BEAM.md §3)."""

    def __init__(self, cfg: BeamConfig, layer: int, ops: ModelOps, pack_qkv_gate: bool, device: torch.device):
        super().__init__()
        self.cfg, self.layer, self.ops = cfg, layer, ops
        self.is_global = cfg.is_global(layer)
        self.window = None if self.is_global else cfg.sliding_window
        D, Q, KV, H, Dh = cfg.hidden, cfg.q_size, cfg.kv_size, cfg.n_heads, cfg.head_dim
        self.pre_norm = _param((D,), device)
        self.post_norm = _param((D,), device)
        if pack_qkv_gate:
            # Optimization #5: one [N, D] weight, rows q | k | v | gate, exactly as
            # ops.pack_qkv_gate lays them out. The checkpoint keeps four matrices: here they are
            # views of the packed row blocks, so loading or initializing wq..wg fills the packed
            # weight, nothing is stored twice, and the two can never disagree.
            w_qkvg_ND = torch.empty((cfg.qkv_gate_size, D), device=device, dtype=BF16)
            self.register_buffer("w_qkvg", w_qkvg_ND, persistent=False)
            wq, wk, wv, wg = w_qkvg_ND.split([Q, KV, KV, Q])
            self.wq, self.wk = nn.Parameter(wq, requires_grad=False), nn.Parameter(wk, requires_grad=False)
            self.wv, self.wg = nn.Parameter(wv, requires_grad=False), nn.Parameter(wg, requires_grad=False)
        else:
            self.register_buffer("w_qkvg", None, persistent=False)
            self.wq, self.wk, self.wv, self.wg = (_param(s, device) for s in ((Q, D), (KV, D), (KV, D), (Q, D)))
        self.wo = _param((D, Q), device)
        self.q_norm = _param((Dh,), device)  # shared by all query heads
        self.k_norm = _param((Dh,), device)  # shared by all kv heads
        self.gate_bias = _param((H,), device)

    def _project(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ops, cfg = self.ops, self.cfg
        if self.w_qkvg is None:
            return tuple(ops.linear(x_TD, w) for w in (self.wq, self.wk, self.wv, self.wg))
        if self.wq.data_ptr() != self.w_qkvg.data_ptr():
            raise RuntimeError(f"L{self.layer}: wq no longer views the packed w_qkvg (was the model moved with .to()?)")
        qkvg_TN = ops.qkv_gate_proj(x_TD, self.w_qkvg)
        # Column slices of the packed output: the ops below get strided views (row stride N).
        return qkvg_TN.split([cfg.q_size, cfg.kv_size, cfg.kv_size, cfg.q_size], dim=1)

    def forward(
        self,
        x_TD: torch.Tensor,
        step: Step,
        cache: KVCache,
        rope_cos_sin_PD: torch.Tensor,
        ssmax_scale_P: torch.Tensor,
    ) -> torch.Tensor:
        ops, cfg = self.ops, self.cfg
        T, H, K, Dh = x_TD.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_TQ, k_TKv, v_TKv, g_TQ = self._project(x_TD)
        q_THD, k_TKD, v_TKD, g_THD = (
            q_TQ.view(T, H, Dh),
            k_TKv.view(T, K, Dh),
            v_TKv.view(T, K, Dh),
            g_TQ.view(T, H, Dh),
        )
        layer_kv = cache.layers[self.layer]

        # A sliding layer's prefill sees the ring's past keys as they were before this chunk's
        # write (which may overwrite slots its first queries still need), plus the chunk's own.
        sliding_prefill = self.window is not None and not step.is_decode
        past_rings = [cache.ring_copy(self.layer, span.seq) for span in step.spans] if sliding_prefill else []

        q_THD, k_TKD = ops.qk_norm_rope(
            q_THD,
            k_TKD,
            v_TKD,
            self.q_norm,
            self.k_norm,
            step.positions_T,
            step.slots_for(layer_kv),
            layer_kv.k_SKD,
            layer_kv.v_SKD,
            None if self.is_global else rope_cos_sin_PD,
            ssmax_scale_P if self.is_global else None,
            cfg.norm_eps,
        )

        o_per_seq = []
        for i, span in enumerate(step.spans):
            rows = slice(span.start, span.stop)
            q_pos_T = step.positions_T[rows]
            if sliding_prefill:
                past_k_WKD, past_v_WKD = past_rings[i]
                keys_SKD = torch.cat([past_k_WKD, k_TKD[rows]])
                values_SKD = torch.cat([past_v_WKD, v_TKD[rows]])
                key_pos_S = torch.cat([span.past_ring_positions_W, q_pos_T])
            else:  # global layers, and every decode step: the cache region, masked by slot positions
                keys_SKD, values_SKD, key_pos_S = cache.region(self.layer, span)
            o_per_seq.append(ops.attention(q_THD[rows], keys_SKD, values_SKD, q_pos_T, key_pos_S, self.window))
        o_THD = o_per_seq[0] if len(o_per_seq) == 1 else torch.cat(o_per_seq)

        o_THD = ops.output_gate(o_THD, g_THD, self.gate_bias)
        return ops.linear(o_THD.reshape(T, H * Dh), self.wo)


# ---- dense MLP and MoE -----------------------------------------------------------------------
class DenseMLP(nn.Module):
    """down(silu(x Wgate) * (x Wup)), d_ff = cfg.dense_ff."""

    kind = "mlp"

    def __init__(self, cfg: BeamConfig, ops: ModelOps, device: torch.device):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        D, Fd = cfg.hidden, cfg.dense_ff
        self.pre_norm, self.post_norm = _param((D,), device), _param((D,), device)
        self.w_gate, self.w_up, self.w_down = _param((Fd, D), device), _param((Fd, D), device), _param((D, Fd), device)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        act_TF = ops.swiglu(ops.linear(x_TD, self.w_gate), ops.linear(x_TD, self.w_up))
        return ops.linear(act_TF, self.w_down)


class MoE(nn.Module):
    """DeepSeek-V3 routed experts, no shared expert: FP32 router, grouped top-k, weighted sum in FP32."""

    kind = "moe"

    def __init__(self, cfg: BeamConfig, ops: ModelOps, device: torch.device):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        D, E, Fe = cfg.hidden, cfg.n_experts, cfg.expert_ff
        self.pre_norm, self.post_norm = _param((D,), device), _param((D,), device)
        self.router = _param((E, D), device, FP32)
        self.correction_bias = _param((E,), device, FP32)  # selection only, never in the weights
        self.w_gate, self.w_up = _param((E, Fe, D), device), _param((E, Fe, D), device)
        self.w_down = _param((E, D, Fe), device)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        ops, cfg = self.ops, self.cfg
        logits_TE = ops.router_logits(x_TD, self.router)
        weights_Tk, ids_Tk = ops.moe_route(
            logits_TE,
            self.correction_bias,
            cfg.n_groups,
            cfg.topk_groups,
            cfg.top_k,
            cfg.group_score_topk,
            cfg.routed_scaling,
        )
        return ops.moe_experts(x_TD, weights_Tk, ids_Tk, self.w_gate, self.w_up, self.w_down)


class Layer(nn.Module):
    def __init__(self, cfg: BeamConfig, layer: int, ops: ModelOps, pack_qkv_gate: bool, device: torch.device):
        super().__init__()
        self.attention = Attention(cfg, layer, ops, pack_qkv_gate, device)
        if cfg.is_moe(layer):
            self.moe = MoE(cfg, ops, device)
        else:
            self.mlp = DenseMLP(cfg, ops, device)

    @property
    def ffn(self) -> DenseMLP | MoE:
        return self.moe if "moe" in self._modules else self.mlp


# ---- the model -------------------------------------------------------------------------------
def _positional_tables(cfg: BeamConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos|sin [P, Dh] and the SSMax scale [P], built in FP64 on the host and rounded to FP32
    once (bit-identical on every device); on the meta device only their shapes exist."""
    if device.type == "meta":
        return (
            torch.empty((cfg.max_positions, cfg.head_dim), device=device, dtype=FP32),
            torch.empty((cfg.max_positions,), device=device, dtype=FP32),
        )
    rope = reference_ops.rope_table(cfg.max_positions, cfg.head_dim, cfg.rope_theta)
    ssmax = reference_ops.ssmax_table(cfg.max_positions, cfg.ssmax_base, cfg.ssmax_exponent)
    return rope.to(device), ssmax.to(device)


class Beam(nn.Module):
    """The whole model. `ops` supplies every replaceable op; `pack_qkv_gate` selects one packed
    q|k|v|gate GEMM per layer (optimization #5) instead of four projections."""

    def __init__(
        self,
        cfg: BeamConfig,
        ops: ModelOps = REFERENCE_OPS,
        pack_qkv_gate: bool = False,
        device: torch.device | str = "cpu",
    ):
        super().__init__()
        if not isinstance(ops, ModelOps):
            raise TypeError(f"ops must be a ModelOps; got {type(ops).__name__}")
        device = torch.device(device)
        self.cfg, self.ops, self.pack_qkv_gate = cfg, ops, pack_qkv_gate
        self.embedding = _param((cfg.vocab_size, cfg.hidden), device)
        self.layers = nn.ModuleList(Layer(cfg, layer, ops, pack_qkv_gate, device) for layer in range(cfg.n_layers))
        self.final_norm = _param((cfg.hidden,), device)
        self.lm_head = _param((cfg.vocab_size, cfg.hidden), device)
        rope_cos_sin_PD, ssmax_scale_P = _positional_tables(cfg, device)
        self.register_buffer("rope_cos_sin_PD", rope_cos_sin_PD, persistent=False)
        self.register_buffer("ssmax_scale_P", ssmax_scale_P, persistent=False)
        # The 2 x n_layers sublayers in order, with their profiler names.
        self._sublayers: list[tuple[str, Attention | DenseMLP | MoE]] = []
        for i, layer in enumerate(self.layers):
            self._sublayers += [(f"L{i}.attention", layer.attention), (f"L{i}.{layer.ffn.kind}", layer.ffn)]

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def _forward(
        self, tokens_T: torch.Tensor, step: Step, cache: KVCache, logit_rows: torch.Tensor | None
    ) -> torch.Tensor:
        ops, eps = self.ops, self.cfg.norm_eps
        with record_function("embedding"):
            h_TD = F.embedding(tokens_T, self.embedding)  # the residual stream: addition n = 1
            x_TD = ops.rms_norm(h_TD, self._sublayers[0][1].pre_norm, eps)
        for k, (name, sublayer) in enumerate(self._sublayers, start=1):
            is_last = k == len(self._sublayers)
            next_pre_norm = self.final_norm if is_last else self._sublayers[k][1].pre_norm
            with record_function(name):
                if isinstance(sublayer, Attention):
                    y_TD = sublayer(x_TD, step, cache, self.rope_cos_sin_PD, self.ssmax_scale_P)
                else:
                    y_TD = sublayer(x_TD)
                # Sublayer k is residual addition n = k + 1; after the last one, x is final_norm(h).
                h_TD, x_TD = ops.norm_residual_norm(y_TD, h_TD, sublayer.post_norm, next_pre_norm, k + 1, eps)
        with record_function("lm_head"):
            if logit_rows is not None:
                x_TD = x_TD[logit_rows]
            return ops.lm_head_logits(x_TD, self.lm_head)

    @torch.no_grad()
    def prefill(
        self,
        cache: KVCache,
        tokens: Sequence[torch.Tensor | Sequence[int]],
        seq_ids: Sequence[int] | None = None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Append tokens[i] to cache sequence seq_ids[i] (default i), on top of what it holds.

        Returns FP32 logits [len(tokens), V] of each sequence's last new token, or with
        `all_logits` the logits [T, V] of every new token, sequences concatenated in order.
        Synchronizes with the host (it reads lengths and groups MoE tokens by expert).
        """
        self._check_cache(cache)
        seq_ids = list(range(len(tokens))) if seq_ids is None else list(seq_ids)
        if len(seq_ids) != len(tokens):
            raise ValueError(f"got {len(tokens)} token sequences but {len(seq_ids)} seq_ids")
        token_list = [torch.as_tensor(t, dtype=torch.int64, device=self.device).reshape(-1) for t in tokens]
        tokens_T = torch.cat(token_list) if token_list else torch.empty(0, dtype=torch.int64)
        if tokens_T.numel() and not 0 <= int(tokens_T.min()) <= int(tokens_T.max()) < self.cfg.vocab_size:
            raise ValueError(
                f"token ids must be in 0..{self.cfg.vocab_size - 1}; got {int(tokens_T.min())}..{int(tokens_T.max())}"
            )
        step = cache.begin_prefill(seq_ids, [len(t) for t in token_list])
        logit_rows = None
        if not all_logits:
            logit_rows = torch.tensor([span.stop - 1 for span in step.spans], device=self.device)
        return self._forward(tokens_T, step, cache, logit_rows)

    @torch.no_grad()
    def decode(self, cache: KVCache, token_ids_B: torch.Tensor) -> torch.Tensor:
        """One new token for every cache sequence; FP32 logits [B, V].

        No host synchronization: positions and slots come from the cache's device tensors and are
        advanced there, so the step can be captured in a CUDA graph and replayed. Token ids are
        not range-checked (that would synchronize); call cache.ensure_room before a decode loop.
        """
        self._check_cache(cache)
        if token_ids_B.shape != (cache.n_seqs,) or token_ids_B.dtype != torch.int64:
            raise ValueError(
                f"decode needs int64 token ids of shape ({cache.n_seqs},), one per cache sequence; "
                f"got {token_ids_B.dtype} {tuple(token_ids_B.shape)}"
            )
        if token_ids_B.device != self.device:
            raise ValueError(f"token ids are on {token_ids_B.device}, the model on {self.device}")
        return self._forward(token_ids_B, cache.begin_decode(), cache, None)

    def _check_cache(self, cache: KVCache) -> None:
        if cache.cfg != self.cfg:
            raise ValueError(f"cache was built for preset {cache.cfg.name!r}, the model is {self.cfg.name!r}")
        if cache.device != self.device:
            raise ValueError(f"cache is on {cache.device}, the model on {self.device}")


# ---- parameter counts ------------------------------------------------------------------------
NORM_LEAVES = frozenset({"pre_norm", "post_norm", "final_norm", "q_norm", "k_norm"})


@dataclass(frozen=True)
class ParameterCounts:
    """total: every parameter. embedding: the input table. active: what one token's forward reads
    besides the embedding: everything except the experts it is not routed to (top_k of E)."""

    total: int
    active: int
    embedding: int
    by_part: Mapping[str, int]  # embedding, lm_head, attention, mlp, experts, router, norms


def _part_of(name: str) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in NORM_LEAVES:
        return "norms"
    if leaf in ("embedding", "lm_head"):
        return leaf
    if ".attention." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if ".moe." in name:
        return "router" if leaf in ("router", "correction_bias") else "experts"
    raise ValueError(f"parameter {name!r} belongs to no known part of the model")


def parameter_counts(model: Beam) -> ParameterCounts:
    """Counted from the instance (works on the meta device), so the model's shapes are what is checked."""
    by_part = Counter({part: 0 for part in ("embedding", "lm_head", "attention", "mlp", "experts", "router", "norms")})
    for name, param in model.named_parameters():
        by_part[_part_of(name)] += param.numel()
    total = sum(by_part.values())
    cfg = model.cfg
    inactive_experts = by_part["experts"] - by_part["experts"] * cfg.top_k // cfg.n_experts
    return ParameterCounts(
        total=total,
        active=total - by_part["embedding"] - inactive_experts,
        embedding=by_part["embedding"],
        by_part=dict(by_part),
    )
