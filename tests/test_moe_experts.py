"""The moe_experts task (routing with an exact distinct-expert count, the floor it implies), its
library path (torch._grouped_mm) and its Triton candidate (both schedules, on the interpreter)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from harness import interpreter_patches
from reference_model.config import get_config
from tasks import get_task
from tasks.moe_experts import distinct_experts, grouped_mm_experts, routing

CPU = torch.device("cpu")
TASK = get_task("moe_experts")
CANDIDATE = Path(__file__).resolve().parent.parent / "candidate_kernels" / "moe_experts" / "routed_slots.py"


@pytest.fixture(scope="module")
def candidate():
    interpreter_patches.apply()  # BF16 tl.dot is garbage in the bare interpreter (TOOLCHAIN.md)
    spec = importlib.util.spec_from_file_location("routed_slots_under_test", CANDIDATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fp64_moe_experts(x_TD, weights_Tk, ids_Tk, w_gate_EFD, w_up_EFD, w_down_EDF) -> torch.Tensor:
    """The op in FP64 with no rounding point: sum_j w_j * down(silu(x Wg^T) * (x Wu^T))."""
    x = x_TD.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t, j in torch.cartesian_prod(torch.arange(ids_Tk.shape[0]), torch.arange(ids_Tk.shape[1])).tolist():
        e = int(ids_Tk[t, j])
        g, u = x[t] @ w_gate_EFD[e].double().T, x[t] @ w_up_EFD[e].double().T
        out[t] += float(weights_Tk[t, j]) * ((g * torch.sigmoid(g) * u) @ w_down_EDF[e].double().T)
    return out


def _fp64_error(out: torch.Tensor, inputs: dict) -> tuple[float, float]:
    """(error of `out`, error of the reference) against the FP64 evaluation, normwise."""
    exact = fp64_moe_experts(**inputs)
    want = TASK.reference(**inputs).double()
    err = float((out.double() - exact).norm() / exact.norm())
    return err, float((want - exact).norm() / exact.norm())


def _poison_unchosen(inputs: dict) -> dict:
    """NaN in every weight of the experts no token is routed to: an implementation that reads one
    (or multiplies it by a zero weight) returns NaN."""
    unused = torch.ones(inputs["w_gate_EFD"].shape[0], dtype=torch.bool)
    unused[inputs["ids_Tk"].unique()] = False
    poisoned = dict(inputs)
    for key in ("w_gate_EFD", "w_up_EFD", "w_down_EDF"):
        w = inputs[key].clone()
        w[unused] = float("nan")
        poisoned[key] = w
    return poisoned


# ---- the task ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 2, 3, 8, 33, 64, 1000])
def test_routing_uses_exactly_the_distinct_expert_count_of_the_cost_formula(T):
    E, k = 256, 8
    weights_Tk, ids_Tk = routing(T, E, k, seed=5)
    assert ids_Tk.shape == (T, k) and weights_Tk.shape == (T, k)
    assert all(len(set(row)) == k for row in ids_Tk.tolist()), "an expert repeats within a token"
    assert ids_Tk.unique().numel() == distinct_experts(T, E, k)
    torch.testing.assert_close(weights_Tk.sum(dim=-1), torch.ones(T))
    assert (weights_Tk > 0).all()


def test_distinct_expert_counts_at_beam():
    assert [distinct_experts(T, 256, 8) for T in (1, 3, 8, 64, 1000)] == [8, 23, 57, 222, 256]


def test_cost_at_one_decode_token_is_the_eight_experts_weight_read():
    beam = get_config("beam")
    cost = TASK.cost(TASK.shape("T=1", "cuda"))
    experts = 8 * 3 * beam.expert_ff * beam.hidden * 2
    assert experts == 629_145_600
    assert experts < cost.bytes < experts + 64 * 1024  # x, routing and the output are a few KB


def test_inputs_route_exactly_as_the_shape_says():
    shape = TASK.shape("tiny T=9", CPU)
    x = TASK.make_inputs(shape, 3, CPU)
    cfg = get_config("beam-tiny")
    assert x["ids_Tk"].unique().numel() == distinct_experts(9, cfg.n_experts, cfg.top_k)
    torch.testing.assert_close(x["weights_Tk"].sum(-1), torch.full((9,), cfg.routed_scaling))
    assert x["w_gate_EFD"].shape == (cfg.n_experts, cfg.expert_ff, cfg.hidden)


# ---- the library path ---------------------------------------------------------------------------------
@pytest.mark.parametrize("label", [s.label for s in TASK.cpu_shapes])
def test_grouped_mm_path_computes_the_reference_and_reads_only_chosen_experts(label):
    inputs = TASK.make_inputs(TASK.shape(label, CPU), 1, CPU)
    got = grouped_mm_experts()(**_poison_unchosen(inputs))
    assert torch.isfinite(got.float()).all()
    err, ref_err = _fp64_error(got, inputs)
    assert err <= 1.05 * ref_err, f"{label}: error {err:.3g} vs the reference's {ref_err:.3g}"


# ---- the candidate ------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", [s.label for s in TASK.cpu_shapes])
def test_candidate_matches_the_reference_on_every_cpu_shape(candidate, label):
    inputs = TASK.make_inputs(TASK.shape(label, CPU), 2, CPU)
    got = candidate.moe_experts(**_poison_unchosen(inputs))
    assert got.dtype == torch.bfloat16 and got.shape == inputs["x_TD"].shape
    assert torch.isfinite(got.float()).all(), f"{label}: read an expert no token is routed to"
    err, ref_err = _fp64_error(got, inputs)
    assert err <= 1.05 * ref_err, f"{label}: error {err:.3g} vs the reference's {ref_err:.3g}"
    assert torch.equal(got, candidate.moe_experts(**inputs)), f"{label}: not deterministic"


def test_candidate_schedules_agree_and_take_strided_routing(candidate):
    """The GEMV and the grouped schedule on the same call (shared experts, a token count where both
    are legal), and routing tensors given as strided views."""
    inputs = TASK.make_inputs(TASK.shape("tiny T=3", CPU), 4, CPU)
    T, D = inputs["x_TD"].shape
    outs = []
    for schedule in (candidate._gemv, candidate._grouped):
        out = torch.empty((T, D), dtype=torch.bfloat16)
        schedule(*(inputs[k] for k in ("x_TD", "weights_Tk", "ids_Tk", "w_gate_EFD", "w_up_EFD", "w_down_EDF")), out)
        outs.append(out)
    err = float((outs[0].double() - outs[1].double()).norm() / outs[1].double().norm())
    assert err < 2**-8, f"schedules differ by {err:.3g} normwise"
    wide = {
        k: torch.stack([v, v], dim=2).reshape(T, -1)[:, ::2] for k, v in inputs.items() if k in ("weights_Tk", "ids_Tk")
    }
    assert not wide["ids_Tk"].is_contiguous()
    assert torch.equal(candidate.moe_experts(**{**inputs, **wide}), candidate.moe_experts(**inputs))


def test_candidate_rejects_bad_inputs_with_the_shapes_it_got(candidate):
    inputs = TASK.make_inputs(TASK.shape("tiny T=1", CPU), 0, CPU)
    with pytest.raises(ValueError, match=r"expected w_gate/w_up \[E, Fe, 96\]"):
        candidate.moe_experts(**{**inputs, "w_down_EDF": inputs["w_down_EDF"][:, :, :5]})
    with pytest.raises(ValueError, match="FP32 weights_Tk"):
        candidate.moe_experts(**{**inputs, "weights_Tk": inputs["weights_Tk"].double()})


# ---- on the GPU machine ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("label", ["T=1", "T=8", "T=64"])
def test_candidate_and_grouped_mm_on_beam_shapes_on_cuda(candidate, label):
    """Both schedules at Beam's sizes (T=1 and 8: GEMV / grouped at 64 pairs; T=64: grouped),
    error against FP64 no worse than the reference's, and no read of an unchosen expert."""
    cuda = torch.device("cuda")
    inputs = TASK.make_inputs(TASK.shape(label, cuda), 0, cuda)
    want = TASK.reference(**inputs).double()
    for name, impl in (("candidate", candidate.moe_experts), ("torch_grouped_mm", grouped_mm_experts())):
        got = impl(**_poison_unchosen(inputs))
        assert torch.isfinite(got.float()).all(), f"{name} {label}: read an unchosen expert"
        err = float((got.double() - want).norm() / want.norm())
        assert err < 2**-7, f"{name} {label}: {err:.3g} normwise from the reference"
    del inputs
    torch.cuda.empty_cache()
