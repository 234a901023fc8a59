"""Beam's configuration: one frozen dataclass, three presets, and the arithmetic derived from it.

Shape legend used across the project:
  T tokens, D hidden, H query heads, K kv heads, Dh head dim, F dense d_ff, Fe expert d_ff,
  E experts, G expert groups, V vocabulary, L layers, P positions, S cache slots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BF16_BYTES = 2
FP8_BYTES = 1


@dataclass(frozen=True)
class BeamConfig:
    name: str
    n_layers: int
    hidden: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_dense_layers: int  # layers 0..n_dense_layers-1 are dense SwiGLU, the rest MoE
    dense_ff: int
    n_experts: int
    n_groups: int
    topk_groups: int
    top_k: int
    expert_ff: int
    global_every: int  # layer l is global when (l + 1) % global_every == 0, or when it is the last
    sliding_window: int  # a query at p attends to keys p-window+1..p
    max_positions: int  # size of the positional tables (RoPE cos/sin, SSMax scale)
    group_score_topk: int = 2  # a group's score is the sum of its best this-many biased scores
    routed_scaling: float = 2.5
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    ssmax_base: float = 2048.0
    ssmax_exponent: float = 0.1

    def __post_init__(self) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for rotate-half RoPE")
        if self.n_experts % self.n_groups:
            problems.append(f"n_experts={self.n_experts} not a multiple of n_groups={self.n_groups}")
        if not 0 < self.topk_groups <= self.n_groups:
            problems.append(f"topk_groups={self.topk_groups} outside 1..n_groups={self.n_groups}")
        if not 0 < self.top_k <= self.topk_groups * self.experts_per_group:
            problems.append(
                f"top_k={self.top_k} outside 1..{self.topk_groups * self.experts_per_group} "
                f"(topk_groups x experts per group)"
            )
        if not 0 < self.group_score_topk <= self.experts_per_group:
            problems.append(f"group_score_topk={self.group_score_topk} outside 1..{self.experts_per_group}")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            problems.append(f"n_dense_layers={self.n_dense_layers} outside 0..n_layers={self.n_layers}")
        if self.sliding_window < 1 or self.max_positions < 1:
            problems.append(f"sliding_window={self.sliding_window}, max_positions={self.max_positions} must be >= 1")
        if problems:
            raise ValueError(f"invalid BeamConfig {self.name!r}: " + "; ".join(problems))

    # ---- derived values -------------------------------------------------------------------
    @property
    def experts_per_group(self) -> int:
        return self.n_experts // self.n_groups

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def qkv_gate_size(self) -> int:
        """Rows of the packed projection: q | k | v | gate."""
        return 2 * self.q_size + 2 * self.kv_size

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1

    def is_moe(self, layer: int) -> bool:
        return layer >= self.n_dense_layers

    @property
    def global_layers(self) -> tuple[int, ...]:
        return tuple(layer for layer in range(self.n_layers) if self.is_global(layer))

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(layer for layer in range(self.n_layers) if not self.is_global(layer))

    def replace(self, **changes) -> BeamConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, BeamConfig] = {
    "beam": BeamConfig(
        name="beam",
        n_layers=52,
        hidden=5120,
        vocab_size=131072,
        n_heads=48,
        n_kv_heads=8,
        head_dim=128,
        n_dense_layers=3,
        dense_ff=20480,
        n_experts=256,
        n_groups=8,
        topk_groups=4,
        top_k=8,
        expert_ff=2560,
        global_every=6,
        sliding_window=512,
        max_positions=131072,
    ),
}
# Layers 0..5 at full width: 3 dense, 3 MoE with all 256 experts, layer 5 global (the last).
PRESETS["beam-slice"] = PRESETS["beam"].replace(name="beam-slice", n_layers=6)
# Same structure, small sizes, every feature present: three dense and three MoE layers as in
# beam-slice, global layers 2 and 5 (one dense, one MoE), a window of 8 so that tests cross it,
# GQA groups of 2, grouped routing with 4 groups of 4 experts. Widths are deliberately not powers
# of two (except head_dim, which Triton's block shapes need) so that kernels must mask.
PRESETS["beam-tiny"] = BeamConfig(
    name="beam-tiny",
    n_layers=6,
    hidden=96,
    vocab_size=384,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    n_dense_layers=3,
    dense_ff=160,
    n_experts=16,
    n_groups=4,
    topk_groups=2,
    top_k=4,
    expert_ff=48,
    global_every=3,
    sliding_window=8,
    max_positions=4096,
)


def get_config(name: str) -> BeamConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r} unknown; known: {sorted(PRESETS)}") from None


# ---- arithmetic that needs no model instance -----------------------------------------------
def kv_bytes_per_token(cfg: BeamConfig, bytes_per_value: int = BF16_BYTES) -> int:
    """KV-cache bytes a token costs for the whole context: only global layers keep every token."""
    return len(cfg.global_layers) * 2 * cfg.n_kv_heads * cfg.head_dim * bytes_per_value


def sliding_kv_bytes_per_sequence(cfg: BeamConfig, bytes_per_value: int = BF16_BYTES) -> int:
    """Fixed cost of the sliding-window rings of one sequence, whatever its length."""
    return len(cfg.sliding_layers) * 2 * cfg.sliding_window * cfg.n_kv_heads * cfg.head_dim * bytes_per_value
