"""moe_experts: the routed experts of a MoE layer for few tokens: gather, SwiGLU GEMMs, weighted sum.

Beyond the published account (BEAM.md §6). Reference: ops.moe_experts:
    out[t] = bf16( sum_j w[t, j] * f32(expert_{ids[t, j]}(x[t])) ),
    expert_e(x) = bf16( bf16(swiglu(bf16(x Wg_e^T), bf16(x Wu_e^T))) Wd_e^T )
i.e. the rounding points of three BF16 GEMMs and the SwiGLU, and one FP32 weighted combine.

The task covers the small-T regime where the MoE layer is a weight stream: one decode token reads
its 8 experts (8 x 3 x 2560 x 5120 BF16 = 629 MB, 147 us at 4275 GB/s), batched decode (8, 64)
and the odd sizes 3 and 1000. Prefill-size expert GEMMs (16384 tokens, compute bound) are the
library's job: the optimized model runs `grouped_mm_experts` there (harness/optimized_model.py).

Inputs: x a pre-norm output (unit variance, a few large channels); the expert weights as the
model initializes them, N(0, 1/fan_in), ALL E experts of the preset (at beam: 3 x 6.7 GB, so
that the chosen experts come from HBM as in the model, not from a small, L2-resident set).
Routing: each token gets top_k distinct experts, and the number of distinct experts over the
call is fixed by the shape: U(T) = round(E (1 - (1 - k/E)^T)), the expected count under uniform
routing (T=1: 8, T=8: 57, T=64: 222, T=1000: 256 at beam). Fixing it makes the cost formula
exact, so the floor is a true lower bound for every seed. Routing weights are the model's: the
chosen sigmoid scores (logits N(-1, 1.5^2)) normalized to sum 1 and scaled by routed_scaling.
The routing is drawn on the host from its own generator seeded by the seed (same ids on every
device); x and the weights come from the device generator (tasks/inputs.py).

Parity: BF16 output, not bit-exact (three GEMMs whose accumulation order is the kernel's choice):
the error against FP64 no worse than the reference's own by the margin.

Cost floor: read the U distinct experts' three matrices once, x, the routing, write the output:
    bytes = U*3*Fe*D*2 + T*D*2 + T*k*(4 + 8) + T*D*2
    flops = 2*T*k*3*Fe*D

Baseline: torch_grouped_mm, the library path (torch._grouped_mm, CUTLASS grouped GEMM on sm90):
pairs sorted by expert on the device (a stable sort, group ends by searchsorted), two grouped
GEMMs, the SwiGLU, one grouped GEMM, the pairs put back in order and combined in FP32 (no
atomics: deterministic; no host sync: capturable in a graph). flashinfer's cutlass_fused_moe is
not used: its fused finalize sums with atomics (TOOLCHAIN.md).

Shape legend: T tokens, D hidden, Fe expert d_ff, E experts, k top-k, P = T*k (token, expert) pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reference_model import ops
from reference_model.config import BeamConfig, get_config
from tasks import inputs
from tasks.task import BaselineUnavailable, Cost, OutputCheck, Shape, Task

ROUTING_LOGIT_MEAN, ROUTING_LOGIT_STD = -1.0, 1.5


def _shape(label: str, cfg: BeamConfig, T: int) -> Shape:
    params = {"preset": cfg.name, "T": T, "D": cfg.hidden, "Fe": cfg.expert_ff, "E": cfg.n_experts, "k": cfg.top_k}
    return Shape(label, params)


def distinct_experts(T: int, E: int, k: int) -> int:
    """U(T): the distinct experts a call of T tokens routes to, the uniform-routing expectation,
    rounded, within [k, min(E, T*k)]."""
    expected = E * (1.0 - (1.0 - k / E) ** T)
    return max(k, min(E, T * k, round(expected)))


def routing(T: int, E: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights_Tk FP32, ids_Tk int64) on the host: k distinct experts per token, exactly
    distinct_experts(T, E, k) distinct experts in all (every one of them used by some token)."""
    gen = torch.Generator().manual_seed(seed)
    U = distinct_experts(T, E, k)
    chosen_U = torch.randperm(E, generator=gen)[:U]
    # The first tokens take consecutive runs of a permutation of the chosen experts, so every one
    # is used; a token whose run is short, and every later token, draws the rest of its k from
    # the chosen set without repeating an expert within the token.
    cover_U = chosen_U[torch.randperm(U, generator=gen)].tolist()
    ids = []
    for t in range(T):
        row = cover_U[t * k : (t + 1) * k]
        if len(row) < k:
            taken = set(row)
            rest = [e for e in chosen_U[torch.randperm(U, generator=gen)].tolist() if e not in taken]
            row = row + rest[: k - len(row)]
        ids.append(row)
    ids_Tk = torch.tensor(ids, dtype=torch.int64)
    scores_Tk = torch.sigmoid(ROUTING_LOGIT_MEAN + ROUTING_LOGIT_STD * torch.randn((T, k), generator=gen))
    return scores_Tk / scores_Tk.sum(dim=-1, keepdim=True), ids_Tk


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict:
    cfg = get_config(shape["preset"])
    T, D, Fe, E, k = shape["T"], shape["D"], shape["Fe"], shape["E"], shape["k"]
    gen = inputs.generator(seed, device)
    weights_Tk, ids_Tk = routing(T, E, k, seed)
    return {
        "x_TD": inputs.normalized_activation(T, D, gen),
        "weights_Tk": (weights_Tk * cfg.routed_scaling).to(device),
        "ids_Tk": ids_Tk.to(device),
        "w_gate_EFD": inputs.model_weight("w_gate", (E, Fe, D), gen),
        "w_up_EFD": inputs.model_weight("w_up", (E, Fe, D), gen),
        "w_down_EDF": inputs.model_weight("w_down", (E, D, Fe), gen),
    }


def cost(shape: Shape) -> Cost:
    T, D, Fe, E, k = shape["T"], shape["D"], shape["Fe"], shape["E"], shape["k"]
    U = distinct_experts(T, E, k)
    return Cost(bytes=U * 3 * Fe * D * 2 + 2 * T * D * 2 + T * k * (4 + 8), flops=2 * T * k * 3 * Fe * D)


# ---- the library path -----------------------------------------------------------------------------
def grouped_mm_experts(swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = ops.swiglu) -> Callable:
    """ops.moe_experts through torch._grouped_mm, any T: the optimized model's library expert path.

    `swiglu` is the activation op (the reference, or a promoted dense_act candidate). Sync-free and
    deterministic: pairs are sorted by expert with a stable sort, one offsets vector feeds the
    three grouped GEMMs, and the expert outputs are put back in pair order by a scatter of a
    permutation before the FP32 weighted sum over k, in slot order as the reference sums.
    """

    def moe_experts(x_TD, weights_Tk, ids_Tk, w_gate_EFD, w_up_EFD, w_down_EDF):
        T, D = x_TD.shape
        k, E = ids_Tk.shape[1], w_gate_EFD.shape[0]
        # Group ends by searchsorted on the sorted ids (CUDA's bincount reads the largest id on the host).
        sorted_ids_P, order_P = torch.sort(ids_Tk.reshape(-1), stable=True)
        experts_E = torch.arange(E, device=ids_Tk.device, dtype=sorted_ids_P.dtype)
        offs_E = torch.searchsorted(sorted_ids_P, experts_E, right=True).to(torch.int32)
        x_PD = x_TD.index_select(0, order_P // k)
        gate_PF = torch._grouped_mm(x_PD, w_gate_EFD.transpose(-2, -1), offs=offs_E)
        up_PF = torch._grouped_mm(x_PD, w_up_EFD.transpose(-2, -1), offs=offs_E)
        y_sorted_PD = torch._grouped_mm(swiglu(gate_PF, up_PF), w_down_EDF.transpose(-2, -1), offs=offs_E)
        y_PD = torch.empty_like(y_sorted_PD).index_copy_(0, order_P, y_sorted_PD)
        return (y_PD.float().view(T, k, D) * weights_Tk[:, :, None]).sum(dim=1).to(ops.BF16)

    return moe_experts


def _torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        raise BaselineUnavailable(f"torch_grouped_mm needs torch._grouped_mm, absent in torch {torch.__version__}")
    return grouped_mm_experts()


_BEAM, _TINY = get_config("beam"), get_config("beam-tiny")

TASK = Task(
    name="moe_experts",
    reference=ops.moe_experts,
    make_inputs=make_inputs,
    outputs=(OutputCheck("out_TD", "bf16", bit_exact=False),),
    shapes=tuple(_shape(f"T={T}", _BEAM, T) for T in (1, 8, 64, 3, 1000)),
    # beam-tiny only: a full-width call carries 20 GB of expert weights
    cpu_shapes=(
        _shape("tiny T=1", _TINY, 1),
        _shape("tiny T=3", _TINY, 3),
        _shape("tiny T=9", _TINY, 9),  # 36 pairs > 16 experts: the reference's grouped (host) path
    ),
    cost=cost,
    description="routed-expert SwiGLU GEMMs over the chosen experts + FP32 weighted combine, small T (BEAM.md §4.5)",
    baselines={"torch_grouped_mm": _torch_grouped_mm},
)
