"""qk_norm_rope: per-head Q/K RMSNorm, then RoPE (sliding-window layers) or the SSMax query scale
(global layers), then the write of k' and v into the KV cache.

Optimizations #2 and #6 of BEAM.md §6. Reference: ops.qk_norm_rope. Rounding points: q_n, k_n
after the norms, then q', k' after RoPE/SSMax; v is copied. Two variants (shape param "variant"):
  sliding  RoPE through the FP32 cos|sin table (ops.rope_table), ssmax_scale_P = None
  global   SSMax scale of the queries through ops.ssmax_table, rope_cos_sin_PD = None
The caches are inputs the op writes in place (`mutated`); every row it does not address must come
back untouched, and they hold realistic earlier contents (N(0, 1)) so that stray writes show.

Batches (shape params "seqs" sequences of T/seqs new tokens each, at about 100K context):
  decode   T = 1, 3, 8, 64: one token per sequence.
  prefill  sliding T = 16384: 32 sequences x 512 tokens; global T = 16384: 8 x 2048 (BEAM.md §7).
           T = 1000: sliding 2 x 500, global 1 x 1000.
  Sliding prefill uses chunks of at most one window: the model writes a longer chunk through its
  last `window` tokens only (slot -1 for the others), and task inputs keep every slot valid and
  distinct, so that every token's cache write is exercised and judged.
Slot mappings ("region" rows per sequence, sequence b owning rows b*region .. b*region+region-1):
  sliding  the ring: region = window (512), slot = b*512 + pos % 512, exactly as the model.
  global   a sequence region: the model gives each sequence its whole context (slot = b*capacity
           + pos), GiBs at 100K tokens; here each sequence owns region = 256*ceil(n/256) + 256
           rows for its n new tokens and slot = b*region + pos % region: the same addressing, a
           realistic cache size (64 MiB per cache for 64 decode sequences), no row written twice.
  The cache's last row is the discard row of slot -1; task inputs never address it.

Inputs: q, k the projection outputs (unit variance with per-channel spread, log-normal sigma 0.5:
RoPE'd heads have a few large dims); v unit variance; norm weights 1 + 0.1 N(0, 1); positions
near 100K on GPU shapes (tiny: near 3/4 of the preset's 4096 table positions).

Cost floor: read q and write q'; read k, write k' twice (returned and cached); read v and write it
to the cache; gather one table row per token (Dh FP32 cos|sin, or one FP32 SSMax scale); read
both norm weights, the positions and the slots:
    bytes = 2*T*H*Dh*2 + T*K*Dh*2*3 + T*K*Dh*2*2 + T*row_bytes + 2*Dh*2 + 2*T*8
    flops = 4*T*(H+K)*Dh (norms) + sliding 3*T*(H+K)*Dh (rotation) | global T*H*Dh (scale)

Baseline `flashinfer_norm_rope` (no library fuses norm + RoPE + cache write, or does SSMax):
flashinfer.norm.rmsnorm per head, then for sliding apply_rope_with_cos_sin_cache_inplace
(NeoX layout, the same FP32 cos|sin table), for global the SSMax scale in torch; then the cache
write by torch indexing. Same rounding points (rmsnorm rounds q_n and k_n to BF16, RoPE reads them
and rounds its output); flashinfer's FP32 arithmetic may contract into FMAs, so up to 1 ulp apart.

Shape legend: T tokens, H query heads, K kv heads, Dh head dim, S cache rows, P table positions.
"""

from __future__ import annotations

import functools

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.libraries import flashinfer_module
from tasks.task import Cost, Goal, OutputCheck, Shape, Task

VARIANTS = ("sliding", "global")
CHANNEL_SCALE_LOG_STD = 0.5


def region_rows(variant: str, cfg: BeamConfig, tokens_per_seq: int) -> int:
    """Cache rows each sequence owns (see the module docstring)."""
    if variant == "sliding":
        if tokens_per_seq > cfg.sliding_window:
            raise ValueError(
                f"sliding chunks must fit the window for distinct slots: {tokens_per_seq} > {cfg.sliding_window}"
            )
        return cfg.sliding_window
    return 256 * -(-tokens_per_seq // 256) + 256


def _context(cfg: BeamConfig, tokens_per_seq: int) -> tuple[int, int]:
    """Mean and half-spread of the cached-token counts: about 100K where the preset's tables reach
    that far (beam), else 3/4 of its table (beam-tiny); every position stays inside the table."""
    if cfg.max_positions >= inputs.CONTEXT + inputs.CONTEXT_SPREAD + tokens_per_seq:
        return inputs.CONTEXT, inputs.CONTEXT_SPREAD
    context = 3 * cfg.max_positions // 4
    spread = context // 8
    if context + spread + tokens_per_seq > cfg.max_positions:
        raise ValueError(f"{tokens_per_seq} new tokens at context {context} overrun {cfg.max_positions} positions")
    return context, spread


def _shape(variant: str, cfg: BeamConfig, seqs: int, tokens_per_seq: int, prefix: str = "") -> Shape:
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} unknown; known: {list(VARIANTS)}")
    T = seqs * tokens_per_seq
    region = region_rows(variant, cfg, tokens_per_seq)
    context, spread = _context(cfg, tokens_per_seq)
    params = {
        "preset": cfg.name,
        "variant": variant,
        "T": T,
        "seqs": seqs,
        "H": cfg.n_heads,
        "K": cfg.n_kv_heads,
        "Dh": cfg.head_dim,
        "region": region,
        "S": seqs * region + 1,
        "P": cfg.max_positions,
        "context": context,
        "spread": spread,
    }
    return Shape(f"{prefix}{variant} T={T}", params)


def _projection(T: int, heads: int, Dh: int, gen: torch.Generator) -> torch.Tensor:
    scale_HD = torch.exp(CHANNEL_SCALE_LOG_STD * torch.randn((heads, Dh), generator=gen, device=gen.device))
    return (torch.randn((T, heads, Dh), generator=gen, device=gen.device) * scale_HD).to(inputs.BF16)


def positions_and_slots(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] int64 positions (sequence-major) and their distinct, valid cache slots."""
    seqs, T, region = shape["seqs"], shape["T"], shape["region"]
    context_S = inputs.context_lengths(seqs, gen, shape["context"], shape["spread"])
    positions_T = inputs.chunk_positions(context_S, T // seqs)
    seq_T = torch.arange(seqs, device=gen.device).repeat_interleave(T // seqs)
    return positions_T, seq_T * region + positions_T % region


@functools.lru_cache(maxsize=4)
def _host_table(variant: str, preset: str, P: int, Dh: int) -> torch.Tensor:
    """The model's positional table, built once per process on the host (the [131072, 128] RoPE
    table takes about a second in FP64); callers get a copy, never this tensor."""
    cfg = get_config(preset)
    if variant == "sliding":
        return ops.rope_table(P, Dh, cfg.rope_theta)
    return ops.ssmax_table(P, cfg.ssmax_base, cfg.ssmax_exponent)


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    cfg = get_config(shape["preset"])
    T, H, K, Dh, S, P = (shape[k] for k in ("T", "H", "K", "Dh", "S", "P"))
    gen = inputs.generator(seed, device)
    positions_T, slot_mapping_T = positions_and_slots(shape, gen)
    sliding = shape["variant"] == "sliding"
    table = _host_table(shape["variant"], shape["preset"], P, Dh).to(device, copy=True)
    return {
        "q_THD": _projection(T, H, Dh, gen),
        "k_TKD": _projection(T, K, Dh, gen),
        "v_TKD": inputs.normal((T, K, Dh), gen),
        "q_norm_weight": inputs.model_weight("q_norm", (Dh,), gen),
        "k_norm_weight": inputs.model_weight("k_norm", (Dh,), gen),
        "positions_T": positions_T,
        "slot_mapping_T": slot_mapping_T,
        "k_cache_SKD": inputs.normal((S, K, Dh), gen),
        "v_cache_SKD": inputs.normal((S, K, Dh), gen),
        "rope_cos_sin_PD": table if sliding else None,
        "ssmax_scale_P": None if sliding else table,
        "eps": cfg.norm_eps,
    }


def cost(shape: Shape) -> Cost:
    T, H, K, Dh = shape["T"], shape["H"], shape["K"], shape["Dh"]
    sliding = shape["variant"] == "sliding"
    row_bytes = Dh * 4 if sliding else 4
    n_bytes = (
        2 * T * H * Dh * 2  # q read, q' written
        + 3 * T * K * Dh * 2  # k read, k' returned and cached
        + 2 * T * K * Dh * 2  # v read and cached
        + T * row_bytes  # one cos|sin row or one SSMax scale per token
        + 2 * Dh * 2  # the two norm weights
        + 2 * T * 8  # positions and slots
    )
    flops = 4 * T * (H + K) * Dh + (3 * T * (H + K) * Dh if sliding else T * H * Dh)
    return Cost(bytes=n_bytes, flops=flops)


def _flashinfer_norm_rope():
    norm = flashinfer_module("flashinfer.norm", "flashinfer_norm_rope")
    rope = flashinfer_module("flashinfer.rope", "flashinfer_norm_rope")

    def qk_norm_rope(
        q_THD,
        k_TKD,
        v_TKD,
        q_norm_weight,
        k_norm_weight,
        positions_T,
        slot_mapping_T,
        k_cache_SKD,
        v_cache_SKD,
        rope_cos_sin_PD,
        ssmax_scale_P,
        eps,
    ):
        T, H, Dh = q_THD.shape
        K = k_TKD.shape[1]
        q_n = norm.rmsnorm(q_THD.reshape(T * H, Dh), q_norm_weight, eps).view(T, H, Dh)
        k_n = norm.rmsnorm(k_TKD.reshape(T * K, Dh), k_norm_weight, eps).view(T, K, Dh)
        if rope_cos_sin_PD is not None:
            # in place on the fresh q_n, k_n: reads the BF16 norm outputs, writes BF16 rotated ones
            rope.apply_rope_with_cos_sin_cache_inplace(
                positions_T, q_n.view(T, H * Dh), k_n.view(T, K * Dh), Dh, rope_cos_sin_PD, is_neox=True
            )
            q_out = q_n
        else:
            q_out = (q_n.float() * ssmax_scale_P[positions_T][:, None, None]).to(torch.bfloat16)
        k_cache_SKD[slot_mapping_T] = k_n
        v_cache_SKD[slot_mapping_T] = v_TKD
        return q_out, k_n

    return qk_norm_rope


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")


def _gpu_shapes() -> tuple[Shape, ...]:
    batches = {
        "sliding": ((1, 1), (8, 1), (64, 1), (32, 512), (3, 1), (2, 500)),
        "global": ((1, 1), (8, 1), (64, 1), (8, 2048), (3, 1), (1, 1000)),
    }
    return tuple(_shape(v, _BEAM, seqs, n) for v in VARIANTS for seqs, n in batches[v])


TASK = Task(
    name="qk_norm_rope",
    reference=ops.qk_norm_rope,
    make_inputs=make_inputs,
    outputs=(
        OutputCheck("q_out_THD", "bf16"),
        OutputCheck("k_out_TKD", "bf16"),
        OutputCheck("k_cache_SKD", "bf16"),
        OutputCheck("v_cache_SKD", "bf16"),
    ),
    mutated=("k_cache_SKD", "v_cache_SKD"),
    shapes=_gpu_shapes(),
    cpu_shapes=(
        _shape("sliding", _TINY, 1, 1, prefix="tiny "),
        _shape("sliding", _TINY, 2, 3, prefix="tiny "),
        _shape("global", _TINY, 1, 5, prefix="tiny "),
        _shape("sliding", _BEAM, 2, 1),
        _shape("global", _BEAM, 2, 1),
    ),
    cost=cost,
    description="per-head Q/K RMSNorm + RoPE (sliding) or SSMax (global) + K/V cache write (BEAM.md §3, §6 #2 #6)",
    baselines={"flashinfer_norm_rope": _flashinfer_norm_rope},
    goals=(
        Goal(max_us=2.8, shapes=("sliding T=1", "global T=1"), max_launches=1, source="issue 4", gpu="H200"),
        Goal(max_us=140.0, shapes=("sliding T=16384",), max_launches=1, source="issue 4", gpu="H200"),
        Goal(max_us=135.0, shapes=("global T=16384",), max_launches=1, source="issue 4", gpu="H200"),
    ),
)
