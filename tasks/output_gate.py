"""output_gate: the sigmoid output gate of attention, o * sigmoid(g + b[h]), before o_proj.

Part of optimization #2 of BEAM.md §6. Reference: ops.output_gate, FP32 math, one BF16 rounding.

Inputs: o the attention output (a softmax-weighted average of unit-variance values, so each head
has its own spread: N(0, 1) times a per-head scale uniform in [0.1, 1]); g the gate projection
(unit variance: a pre-norm output times an N(0, 1/D) weight); b a small per-head bias N(0, 0.1^2)
(BF16, like every weight), so that a kernel that drops the bias fails parity.

Cost floor: read o and g, read the bias once, write the gated output:
    bytes = 2*T*H*Dh*2 + H*2 + T*H*Dh*2
    flops = 6*T*H*Dh  (add bias, sigmoid as neg/exp/add/div, multiply)

Baselines: none. No library ships a sigmoid gate with a per-head bias; torch.compile of the
reference (added by the harness) is the peer to beat.

Shape legend: T tokens, H query heads, Dh head dim.
"""

from __future__ import annotations

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.task import Cost, Goal, OutputCheck, Shape, Task


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    return Shape(label, {"preset": cfg.name, "T": T, "H": cfg.n_heads, "Dh": cfg.head_dim})


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    T, H, Dh = shape["T"], shape["H"], shape["Dh"]
    gen = inputs.generator(seed, device)
    head_scale_H = inputs.uniform((H,), gen, 0.1, 1.0)
    o_THD = (torch.randn((T, H, Dh), generator=gen, device=gen.device) * head_scale_H[None, :, None]).to(inputs.BF16)
    return {
        "o_THD": o_THD,
        "g_THD": inputs.normal((T, H, Dh), gen),
        "bias_H": inputs.model_weight("gate_bias", (H,), gen),
    }


def cost(shape: Shape) -> Cost:
    T, H, Dh = shape["T"], shape["H"], shape["Dh"]
    return Cost(bytes=2 * T * H * Dh * 2 + H * 2 + T * H * Dh * 2, flops=6 * T * H * Dh)


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="output_gate",
    reference=ops.output_gate,
    make_inputs=make_inputs,
    outputs=(OutputCheck("o_gated_THD", "bf16"),),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 16384, 3, 1000)),
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=5", _TINY, 5),
        _shape("T=2", _BEAM, 2),
    ),
    cost=cost,
    description="attention output gate o * sigmoid(g + b[h]) with a per-head bias (BEAM.md §3.6, §6 #2)",
    goals=(
        Goal(not_slower_than="torch_compile", source="issue 4"),
        Goal(max_us=143.0, shapes=("T=16384",), source="issue 4", gpu="H200"),
    ),
)
