"""dense_act: the SwiGLU activation of the dense MLP layers, silu(gate) * up, 20480 wide.

Optimization #7 of BEAM.md §6. Reference: ops.swiglu, FP32 math, one BF16 rounding.

Inputs: gate and up, the outputs of the two dense-MLP GEMMs, as two separate contiguous [T, F]
tensors: that is what the model passes (ops.expert_mlp runs two linears). Realistic pre-activation
ranges: N(0, 1) times a per-channel scale drawn log-normally (sigma 0.5), so most |gate| < 4 but
every full-width call has tails beyond +-10, where silu saturates (sigmoid -> 0 or 1) and a
careless exp or division loses precision.

Cost floor: read gate and up, write the activation:
    bytes = 3*T*F*2
    flops = 6*T*F  (sigmoid as neg/exp/add/div, two multiplies)

Baseline: flashinfer.activation.silu_and_mul, which needs gate|up as ONE [T, 2F] buffer (gate half
first). Decision: when gate and up are the two halves of one such buffer (a packed gate|up weight
produces that layout) the baseline passes the buffer without a copy; with the model's layout (two
tensors, as here) it concatenates them first, and its time includes that copy (2*T*F*2 bytes more
traffic): it is what a user of silu_and_mul pays unless the GEMM is changed too.

Shape legend: T tokens, F dense d_ff.
"""

from __future__ import annotations

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.libraries import flashinfer_module
from tasks.task import Cost, Goal, OutputCheck, Shape, Task

CHANNEL_SCALE_LOG_STD = 0.5


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    return Shape(label, {"preset": cfg.name, "T": T, "F": cfg.dense_ff})


def pre_activation(T: int, F: int, gen: torch.Generator) -> torch.Tensor:
    """[T, F] BF16 GEMM output with per-channel spread: N(0, 1) * exp(N(0, 0.5^2)) per channel."""
    scale_F = torch.exp(CHANNEL_SCALE_LOG_STD * torch.randn(F, generator=gen, device=gen.device))
    return (torch.randn((T, F), generator=gen, device=gen.device) * scale_F).to(inputs.BF16)


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    T, F = shape["T"], shape["F"]
    gen = inputs.generator(seed, device)
    return {"gate_TF": pre_activation(T, F, gen), "up_TF": pre_activation(T, F, gen)}


def cost(shape: Shape) -> Cost:
    T, F = shape["T"], shape["F"]
    return Cost(bytes=3 * T * F * 2, flops=6 * T * F)


def _packed_gate_up(gate_TF: torch.Tensor, up_TF: torch.Tensor) -> torch.Tensor | None:
    """The [T, 2F] buffer whose halves are gate and up, if they are exactly that; else None."""
    T, F = gate_TF.shape
    same_storage = up_TF.untyped_storage().data_ptr() == gate_TF.untyped_storage().data_ptr()
    halves = gate_TF.stride() == up_TF.stride() == (2 * F, 1)
    if not (same_storage and halves and up_TF.storage_offset() == gate_TF.storage_offset() + F):
        return None
    return gate_TF.as_strided((T, 2 * F), (2 * F, 1))


def _flashinfer_silu_and_mul():
    activation = flashinfer_module("flashinfer.activation", "flashinfer_silu_and_mul")

    def swiglu(gate_TF, up_TF):
        gate_up_T2F = _packed_gate_up(gate_TF, up_TF)
        if gate_up_T2F is None:
            gate_up_T2F = torch.cat([gate_TF, up_TF], dim=-1)
        return activation.silu_and_mul(gate_up_T2F)

    return swiglu


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="dense_act",
    reference=ops.swiglu,
    make_inputs=make_inputs,
    outputs=(OutputCheck("act_TF", "bf16"),),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 16384, 3, 1000)),
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=5", _TINY, 5),
        _shape("T=1", _BEAM, 1),
    ),
    cost=cost,
    description="dense-MLP SwiGLU activation silu(gate) * up, 20480 wide (BEAM.md §4, §6 #7)",
    baselines={"flashinfer_silu_and_mul": _flashinfer_silu_and_mul},
    goals=(Goal(not_slower_than="torch_compile", source="issue 4"),),
)
