"""router_gemm: the FP32 MoE router, logits = x W_r^T with FP32 weights, accumulation and logits.

Optimization #4 of BEAM.md §6: a small-batch GEMM specialized for the router. Reference:
ops.router_logits (BF16 input upcast, FP32 weights, FP32 accumulation without TF32, FP32 out).
The task covers decode batch sizes (T = 1, 8, 64) and the odd T = 3 and 1000, where cuBLAS's FP32
GEMM is latency-bound; prefill-size routing is left to cuBLAS.

Inputs: x a pre-norm output (RMS-normalized residual stream times a norm weight: unit variance,
a few large channels); W_r FP32 N(0, 1/D), so that the logits have unit variance.

Parity: FP32 output, normwise relative error against FP64 at most 1e-6 (FP32 accumulation over
D = 5120 terms in any order stays near 1e-7), and no worse than the reference's own by the margin.
TF32 would fail it (about 1e-3).

Cost floor: read x (BF16) and W_r (FP32) once, write the logits:
    bytes = T*D*2 + E*D*4 + T*E*4
    flops = 2*T*D*E

Baselines: none listed. cuBLAS FP32 with TF32 off IS the reference; no library kernel keeps FP32
weights at this shape (TOOLCHAIN.md).

Shape legend: T tokens, D hidden, E experts.
"""

from __future__ import annotations

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.task import Cost, Goal, OutputCheck, Shape, Task


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    return Shape(label, {"preset": cfg.name, "T": T, "D": cfg.hidden, "E": cfg.n_experts})


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    T, D, E = shape["T"], shape["D"], shape["E"]
    gen = inputs.generator(seed, device)
    return {
        "x_TD": inputs.normalized_activation(T, D, gen),
        "w_router_ED": inputs.model_weight("router", (E, D), gen, dtype=inputs.FP32),
    }


def cost(shape: Shape) -> Cost:
    T, D, E = shape["T"], shape["D"], shape["E"]
    return Cost(bytes=T * D * 2 + E * D * 4 + T * E * 4, flops=2 * T * D * E)


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="router_gemm",
    reference=ops.router_logits,
    make_inputs=make_inputs,
    outputs=(OutputCheck("logits_TE", "fp32", rel_tol=1e-6),),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 3, 1000)),
    # beam-tiny only: a full-width [*, 5120] x [256, 5120] GEMM takes the Triton interpreter over
    # ten seconds a call with a split-K kernel (one program per K block and expert block)
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=5", _TINY, 5),
        _shape("tiny T=8", _TINY, 8),
    ),
    cost=cost,
    description="FP32 MoE router GEMM x[T, 5120] @ W[256, 5120]^T, no TF32 (BEAM.md §4.1, §6 #4)",
    goals=(
        Goal(max_us=3.0, shapes=("T=1",), source="issue 4", gpu="H200"),
        Goal(max_us=3.5, shapes=("T=8",), source="issue 4", gpu="H200"),
        Goal(max_us=6.0, shapes=("T=64",), source="issue 4", gpu="H200"),
    ),
)
