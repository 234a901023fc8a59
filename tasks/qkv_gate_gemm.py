"""qkv_gate_gemm: the q | k | v | gate projections as ONE GEMM against a weight packed at load time.

Optimization #5 of BEAM.md §6. Reference: ops.qkv_gate_proj, which is already the packed GEMM
through cuBLAS (x [T, D] @ W [N, D]^T, BF16 in and out, FP32 accumulation); the unpacked model's
four separate GEMMs are the `four_linears` baseline. At decode sizes the GEMM is a weight stream:
at T = 1 the floor is reading W, 14336 x 5120 BF16 = 146.8 MB, 34.4 us at 4275 GB/s.

Inputs: x a pre-norm output (unit variance, a few large channels); W built as the model builds it,
ops.pack_qkv_gate of four N(0, 1/D) weights (rows q | k | v | gate), so that outputs have unit
variance.

Parity: BF16 output, not bit-exact (the accumulation order of a GEMM is the library's choice):
only the error against FP64, no worse than the reference's own by the margin.

Cost floor: read W and x once, write the output:
    bytes = N*D*2 + T*D*2 + T*N*2
    flops = 2*T*D*N

Shape legend: T tokens, D hidden, N packed rows (2*H*Dh + 2*K*Dh).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_model import ops
from reference_model.config import PRESETS, BeamConfig, get_config
from tasks import inputs
from tasks.task import BaselineUnavailable, Cost, Goal, OutputCheck, Shape, Task


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    return Shape(
        label,
        {"preset": cfg.name, "T": T, "D": cfg.hidden, "N": cfg.qkv_gate_size, "Nq": cfg.q_size, "Nkv": cfg.kv_size},
    )


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    T, D, Nq, Nkv = shape["T"], shape["D"], shape["Nq"], shape["Nkv"]
    gen = inputs.generator(seed, device)
    x_TD = inputs.normalized_activation(T, D, gen)
    kinds_rows = (("wq", Nq), ("wk", Nkv), ("wv", Nkv), ("wg", Nq))
    wq, wk, wv, wg = (inputs.model_weight(kind, (rows, D), gen) for kind, rows in kinds_rows)
    return {"x_TD": x_TD, "w_qkvg_ND": ops.pack_qkv_gate(wq, wk, wv, wg)}


def cost(shape: Shape) -> Cost:
    T, D, N = shape["T"], shape["D"], shape["N"]
    return Cost(bytes=N * D * 2 + T * D * 2 + T * N * 2, flops=2 * T * D * N)


def _split_rows(N: int, D: int) -> tuple[int, int, int, int]:
    """Rows of q, k, v, gate in a packed [N, D] weight, from the preset with these dimensions."""
    splits = {
        (c.q_size, c.kv_size, c.kv_size, c.q_size) for c in PRESETS.values() if (c.qkv_gate_size, c.hidden) == (N, D)
    }
    if len(splits) != 1:
        known = sorted({(c.qkv_gate_size, c.hidden) for c in PRESETS.values()})
        raise BaselineUnavailable(
            f"four_linears: no unique preset with packed weight [{N}, {D}]; known (N, D): {known}"
        )
    return splits.pop()


def _four_linears():
    """The unpacked model's cost: four GEMMs on the four weights (row blocks of the packed one, which
    are contiguous, so each F.linear is exactly the GEMM of a separate weight), then one concatenation
    to return the reference's [T, N] layout (a small extra copy, T*N*2 bytes read and written)."""

    def qkv_gate_proj(x_TD, w_qkvg_ND):
        rows = _split_rows(*w_qkvg_ND.shape)
        return torch.cat([F.linear(x_TD, w) for w in torch.split(w_qkvg_ND, rows, dim=0)], dim=-1)

    return qkv_gate_proj


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="qkv_gate_gemm",
    reference=ops.qkv_gate_proj,
    make_inputs=make_inputs,
    outputs=(OutputCheck("qkvg_TN", "bf16", bit_exact=False),),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 3, 1000)),
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=3", _TINY, 3),
        _shape("tiny T=8", _TINY, 8),
        _shape("tiny T=70", _TINY, 70),  # past both candidates' decode limits (8, 64): their prefill kernels too
    ),
    cost=cost,
    description="packed q|k|v|gate projection, one BF16 GEMM 5120 -> 14336 (BEAM.md §3.1, §6 #5)",
    baselines={"four_linears": _four_linears},
    goals=(Goal(max_us=35.5, shapes=("T=1", "T=8"), source="issue 4", gpu="H200"),),
)
