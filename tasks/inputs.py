"""Seeded generators of realistic activations, weights and positions, shared by the task files.

Every generator draws from one `torch.Generator` living on the target device, so inputs are a
pure function of (shape, seed, device) and large GPU inputs (a 16384 x 20480 pre-activation) are
drawn on the GPU in milliseconds instead of seconds on the host. The same seed gives different
values on CPU and CUDA; the harness always regenerates inputs on the device that judges them.

Weights are drawn by the model's own initializer rules (reference_model.weights.INIT_RULES, one
N(mean, std^2) per kind of parameter): norm weights 1 + 0.1 N(0, 1) and small random biases, never
the trivial 1 or 0, so that a kernel that ignores a weight or a bias fails parity; projection
weights N(0, 1/fan_in), so that unit-variance inputs give unit-variance outputs.

Shape legend: T tokens, D hidden, S sequences (in this module; cache slots elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from reference_model.weights import INIT_RULES

BF16 = torch.bfloat16
FP32 = torch.float32

# Decode and prefill run at "about 100K context" (BEAM.md §7): 100352 = 98 x 1024 cached tokens,
# the context TOOLCHAIN.md's attention measurements use. Contexts vary by sequence around it.
CONTEXT = 100_352
CONTEXT_SPREAD = 4096

# A residual stream after many additions has unit variance overall but a few channels that are much
# larger than the rest (the "massive activation" channels of trained LLMs): one channel in 512, at
# 8x the typical size. They dominate the sum of squares of an RMSNorm, so a kernel that reduces in
# BF16, or drops or double-counts a lane of the reduction, misses by far more than an ulp.
OUTLIER_CHANNEL_FRACTION = 1 / 512
OUTLIER_CHANNEL_SCALE = 8.0


def generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The one source of randomness for a task's inputs: seeded, on the device that gets them."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def normal(shape: tuple[int, ...], gen: torch.Generator, std: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    """N(0, std^2) drawn in FP32 and rounded once to `dtype`."""
    return (torch.randn(shape, generator=gen, device=gen.device, dtype=FP32) * std).to(dtype)


def uniform(shape: tuple[int, ...], gen: torch.Generator, low: float, high: float) -> torch.Tensor:
    """U(low, high) in FP32."""
    return torch.rand(shape, generator=gen, device=gen.device, dtype=FP32) * (high - low) + low


def sublayer_output(T: int, D: int, gen: torch.Generator) -> torch.Tensor:
    """[T, D] BF16, unit variance: the raw output of an attention or MLP sublayer."""
    return normal((T, D), gen)


def residual_stream(T: int, D: int, gen: torch.Generator) -> torch.Tensor:
    """[T, D] BF16 residual stream after many depth-scaled additions.

    Unit variance overall (the depth scaling keeps it there, BEAM.md §2); max(1, D/512) channels,
    chosen at random, are OUTLIER_CHANNEL_SCALE times larger than the others, and every channel is
    rescaled so that the mean variance over channels stays exactly 1.
    """
    n_outliers = max(1, round(D * OUTLIER_CHANNEL_FRACTION))
    scale_D = torch.ones(D, device=gen.device, dtype=FP32)
    outlier_idx = torch.randperm(D, generator=gen, device=gen.device)[:n_outliers]
    scale_D[outlier_idx] = OUTLIER_CHANNEL_SCALE
    scale_D /= scale_D.pow(2).mean().sqrt()
    x_TD = torch.randn((T, D), generator=gen, device=gen.device, dtype=FP32) * scale_D
    return x_TD.to(BF16)


def normalized_activation(T: int, D: int, gen: torch.Generator) -> torch.Tensor:
    """[T, D] BF16: a pre-norm output (RMS-normalized residual stream times a pre-norm weight), the
    input of every projection (QKV/gate, router)."""
    h_TD = residual_stream(T, D, gen).float()
    inv_rms_T1 = torch.rsqrt(h_TD.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return (h_TD * inv_rms_T1 * model_weight("pre_norm", (D,), gen).float()).to(BF16)


_weights_unfilled = False


@contextmanager
def unfilled_weights() -> Iterator[None]:
    """Within it, model_weight gives each parameter its shape, dtype and device but draws no values
    (torch.empty: memory the process never writes, so a large one costs address space, not RAM).

    For `harness inspect` (harness/inspect_child.py), which calls a launcher on a GPU shape's inputs
    made on the CPU only to see what it compiles: a compiler sees a weight's dtype, shape, strides and
    alignment, never its values, and moe_experts' expert weights at beam are 20 GB of BF16 drawn
    through 12.5 GiB FP32 buffers. A launcher or activation that reads a weight's values reads
    whatever the memory held; nothing that judges numbers may run in here.
    """
    global _weights_unfilled
    before, _weights_unfilled = _weights_unfilled, True
    try:
        yield
    finally:
        _weights_unfilled = before


def model_weight(kind: str, shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype = BF16) -> torch.Tensor:
    """A parameter of `kind` (a name in reference_model.weights.INIT_RULES: "q_norm", "router",
    "gate_bias", ...) drawn as the model initializes it: N(mean, std^2), std None meaning
    1/sqrt(fan_in), fan_in the last dim. Under unfilled_weights(), not drawn."""
    if kind not in INIT_RULES:
        raise ValueError(f"weight kind {kind!r} unknown; known: {sorted(INIT_RULES)}")
    if _weights_unfilled:
        return torch.empty(shape, device=gen.device, dtype=dtype)
    rule = INIT_RULES[kind]
    std = rule.std if rule.std is not None else shape[-1] ** -0.5
    # In place: one FP32 buffer at a time, not two (moe_experts draws all of a preset's experts: 12.5 GiB each).
    return torch.randn(shape, generator=gen, device=gen.device, dtype=FP32).mul_(std).add_(rule.mean).to(dtype)


def context_lengths(n_seqs: int, gen: torch.Generator, context: int, spread: int) -> torch.Tensor:
    """[S] int64 cached-token counts, uniform in [context - spread, context + spread)."""
    if spread < 0 or context - spread < 0:
        raise ValueError(f"need 0 <= spread <= context; got context={context}, spread={spread}")
    low, high = context - spread, context + max(spread, 1)
    return torch.randint(low, high, (n_seqs,), generator=gen, device=gen.device, dtype=torch.int64)


def chunk_positions(context_S: torch.Tensor, tokens_per_seq: int) -> torch.Tensor:
    """[S * tokens_per_seq] int64 absolute 0-based positions: sequence s appends tokens_per_seq
    new tokens after its context_S[s] cached ones (decode: tokens_per_seq = 1)."""
    offsets = torch.arange(tokens_per_seq, device=context_S.device, dtype=torch.int64)
    return (context_S[:, None] + offsets[None, :]).reshape(-1)
