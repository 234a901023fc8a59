"""The parity gate: its figures on constructed outputs, and its verdicts on planted numerical bugs."""

from __future__ import annotations

import math

import pytest
import torch

from harness import parity
from harness.records import Status
from tasks import get_task
from tasks.task import OutputCheck

BF16 = torch.bfloat16
FUSE_NORM = get_task("fuse_norm")


def _inputs(label: str = "tiny T=5", seed: int = 1) -> dict:
    return FUSE_NORM.make_inputs(FUSE_NORM.shape(label, "cpu"), seed, torch.device("cpu"))


def _next_ulp(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int16) + 1).view(BF16)


# ---- figures ------------------------------------------------------------------------------------------
def test_ulp_distance_counts_representable_values_between():
    one = torch.tensor([1.0], dtype=BF16)
    assert parity.ulp_distance(one, _next_ulp(one)).item() == 1
    assert parity.ulp_distance(-one, _next_ulp(-one)).item() == 1  # magnitude +1 on a negative value
    assert parity.ulp_distance(torch.tensor([0.0], dtype=BF16), torch.tensor([-0.0], dtype=BF16)).item() == 0
    tiny = torch.tensor([0], dtype=torch.int16).add(1).view(BF16)  # the smallest positive subnormal
    assert parity.ulp_distance(tiny, -tiny).item() == 2  # across zero: -tiny, 0, tiny
    assert parity.ulp_distance(one, torch.tensor([2.0], dtype=BF16)).item() == 128  # 7 mantissa bits


def test_fp64_evaluation_removes_the_rounding_points():
    inputs = _inputs()
    ref = parity.run_reference(FUSE_NORM, inputs)
    exact = parity.fp64_evaluation(FUSE_NORM, inputs)
    assert [t.dtype for t in exact] == [torch.float64, torch.float64]
    for r, e in zip(ref, exact, strict=True):
        own = parity.normwise_error(r, e)
        assert 0 < own < 2**-8  # BF16 rounding: nonzero, below one ulp of relative error
        # the FP64 result is not the BF16 one upcast: it is finer than BF16 spacing somewhere
        assert not torch.equal(e.to(BF16).double(), e)


def test_rounding_emulation_finds_the_three_rounding_points_of_fuse_norm():
    counter = parity.RoundingEmulation(lambda i: False)
    nearest = parity.run_reference(FUSE_NORM, _inputs(), counter)
    assert counter.count == 3
    assert all(torch.equal(a, b) for a, b in zip(nearest, parity.run_reference(FUSE_NORM, _inputs()), strict=True))
    refs = parity.admissible_references(FUSE_NORM, _inputs(), emulate_truncation=True)
    assert [r.rounding for r in refs][:2] == ["nearest", "truncate"]
    assert len(refs) == 8  # nearest, truncate, and the 6 mixtures of three rounding points
    assert len(parity.admissible_references(FUSE_NORM, _inputs(), emulate_truncation=False)) == 1


def test_truncation_drops_low_bits_toward_zero():
    x = torch.randn(4096)
    t = parity._truncate_to_bf16(x)
    assert (t.float().abs() <= x.abs()).all()
    assert (parity.ulp_distance(t, x.to(BF16)) <= 1).all()
    assert (t.float().view(torch.int32) & 0xFFFF).eq(0).all()


# ---- one output ---------------------------------------------------------------------------------------
def _bf16_pair(n: int = 1000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(n, generator=g, dtype=torch.float64)
    return exact.to(BF16), exact


def _flip_near_midpoints(ref: torch.Tensor, exact: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What another FP32 reduction order does: the k elements nearest a rounding midpoint go to the
    other neighbour (their error stays about half an ulp). Returns (flipped, indices)."""
    up = (ref.view(torch.int16) + torch.where(ref.double().abs() < exact.abs(), 1, -1).to(torch.int16)).view(BF16)
    spacing = (up.double() - ref.double()).abs()
    idx = ((exact - ref.double()).abs() / spacing).topk(k).indices.sort().values
    flipped = ref.clone()
    flipped[idx] = up[idx]
    return flipped, idx


def test_the_ulp_histogram_puts_each_distance_in_its_bucket():
    """Distances at both edges of every bucket, and a non-finite value where the reference is finite (counted
    as more than 256 ulps off)."""
    want = torch.ones(13, dtype=torch.float32)
    ulps = torch.tensor([0, 0, 1, 2, 3, 4, 5, 16, 17, 256, 257, 5000], dtype=torch.int32)
    got = torch.cat([(want[:12].view(torch.int32) + ulps).view(torch.float32), torch.tensor([float("inf")])])
    result = parity.compare_output(OutputCheck("x", "fp32", rel_tol=1.0), got, want, want.double(), want)
    assert result.ulp_hist == {"0": 2, "1": 1, "2": 1, "3-4": 2, "5-16": 2, "17-256": 2, ">256": 3}
    assert result.nonfinite == 1 and result.max_ulp == 5000


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("case", ["values", "signed_zeros", "infinities", "empty"])
def test_equal_outputs_take_the_short_path_with_the_element_wise_figures(dtype, case, monkeypatch):
    """Outputs equal to the reference in value are judged without the element-wise pass; the record is the
    same as that pass gives, signed zeros and infinities included (a NaN is equal to nothing: it takes the pass)."""
    want = torch.linspace(-3, 3, 64).to(dtype)
    got = want.clone()
    if case == "signed_zeros":
        want[10], got[10] = 0.0, -0.0
    elif case == "infinities":
        want[[3, 40]] = got[[3, 40]] = torch.tensor([float("inf"), -float("inf")], dtype=dtype)
    elif case == "empty":
        want, got = want[:0], got[:0]
    check = OutputCheck("x", "bf16" if dtype == BF16 else "fp32", rel_tol=None)
    exact = torch.where(want.isfinite(), want.double() + 1e-3, 1e30)  # the reference overflowed there
    element_wise = parity._elementwise_figures(check, got, want)
    monkeypatch.setattr(parity, "_elementwise_figures", None)  # not called
    result = parity.compare_output(check, got, want, exact, want)
    assert {k: getattr(result, k) for k in element_wise} == element_wise
    assert result.fp64_err == parity.normwise_error(got, exact) and result.ref_fp64_err == result.fp64_err
    assert result.passed, result.reason


def test_one_ulp_differences_pass_within_the_budget_and_fail_beyond_it():
    check = OutputCheck("x", "bf16", max_ulp_fraction=0.01)
    ref, exact = _bf16_pair()
    within, _ = _flip_near_midpoints(ref, exact, 10)  # 10 of 1000 = the 1% budget
    result = parity.compare_output(check, within, ref, exact, ref)
    assert result.passed, result.reason
    assert result.n_mismatched == 10 and result.max_ulp == 1 and result.ulp_hist["1"] == 10
    assert result.fp64_ratio < 1.01  # flips at midpoints cost no accuracy
    beyond, idx = _flip_near_midpoints(ref, exact, 11)
    result = parity.compare_output(check, beyond, ref, exact, ref)
    assert not result.passed and "11 of 1000 elements differ by 1 ulp" in result.reason
    assert result.first_mismatch_indices == [[i] for i in idx[:5].tolist()]


def test_random_one_ulp_errors_fail_on_accuracy_even_within_the_count():
    check = OutputCheck("x", "bf16", max_ulp_fraction=0.01)
    ref, exact = _bf16_pair()
    got = ref.clone()
    got[:10] = _next_ulp(got[:10])  # away from zero, wherever the exact value lies
    result = parity.compare_output(check, got, ref, exact, ref)
    assert result.n_mismatched == 10 and not result.passed and "reference's own" in result.reason


def test_two_ulps_anywhere_fail_a_bit_exact_output():
    check = OutputCheck("x", "bf16")
    ref, exact = _bf16_pair()
    got = ref.clone()
    got[500] = _next_ulp(_next_ulp(got[500:501]))[0]
    result = parity.compare_output(check, got, ref, exact, ref)
    assert not result.passed and result.n_over_tolerance == 1 and result.first_mismatch_indices == [[500]]


def test_fp64_margin_decides_a_non_bit_exact_output():
    check = OutputCheck("x", "bf16", bit_exact=False, fp64_margin=0.05)
    ref, exact = _bf16_pair()
    close, _ = _flip_near_midpoints(ref, exact, 50)  # 5% differ: more than the bit-exact budget
    r = parity.compare_output(check, close, ref, exact, ref)
    assert r.passed and r.n_mismatched == 50 and r.fp64_ratio == pytest.approx(r.fp64_err / r.ref_fp64_err)
    everywhere = _next_ulp(ref)
    r = parity.compare_output(check, everywhere, ref, exact, ref)
    assert not r.passed and r.fp64_ratio > 3 and "reference's own" in r.reason


@pytest.mark.parametrize(
    ("got", "reason"),
    [
        (torch.zeros(999, dtype=BF16), "shape (999,) expected (1000,)"),
        (torch.zeros(1000, dtype=torch.float32), "dtype torch.float32 expected torch.bfloat16"),
        ([0.0] * 1000, "expected a torch.Tensor; got list"),
    ],
)
def test_structure_is_checked_before_values(got, reason):
    ref, exact = _bf16_pair()
    result = parity.compare_output(OutputCheck("x", "bf16"), got, ref, exact, ref)
    assert not result.passed and result.reason == reason


def test_non_finite_values_fail_with_their_count():
    ref, exact = _bf16_pair()
    got = ref.clone()
    got[[3, 7]] = float("nan")
    result = parity.compare_output(OutputCheck("x", "bf16"), got, ref, exact, ref)
    assert not result.passed and result.nonfinite == 2 and "2 non-finite" in result.reason


def test_fp32_outputs_have_a_relative_tolerance():
    check = OutputCheck("logits", "fp32", rel_tol=1e-6)
    exact = torch.randn(256, dtype=torch.float64)
    ref = exact.float()
    assert parity.compare_output(check, ref.clone(), ref, exact, ref).passed
    off = ref * (1 + 1e-4)
    result = parity.compare_output(check, off, ref, exact, ref)
    assert not result.passed and "above rel_tol" in result.reason


def test_index_sets_ignore_order_and_paired_weights_follow_their_ids():
    task = get_task("moe_route")
    ids = torch.tensor([[3, 1, 2], [0, 5, 4]])
    weights = torch.tensor([[0.3, 0.1, 0.2], [0.0, 0.5, 0.4]])
    checks = {c.name: c for c in task.outputs}
    id_check = next(c for c in checks.values() if c.kind == "index_set")
    w_check = next(c for c in checks.values() if c.paired_with == id_check.name)
    order = [task.outputs.index(w_check), task.outputs.index(id_check)]
    ref = [None, None]
    ref[order[0]], ref[order[1]] = weights, ids
    perm = torch.tensor([[2, 0, 1], [1, 2, 0]])
    got = [None, None]
    got[order[0]], got[order[1]] = weights.gather(1, perm), ids.gather(1, perm)
    exact = [t.double() if t.is_floating_point() else t for t in ref]
    verdict = parity.judge(task, got, [parity.AdmissibleReference("nearest", ref)], exact)
    assert verdict.passed, verdict.reason
    wrong = [t.clone() for t in got]
    wrong[order[1]][0, 0] = 7  # a different expert in row 0
    verdict = parity.judge(task, wrong, [parity.AdmissibleReference("nearest", ref)], exact)
    assert not verdict.passed and "1 of 2 rows" in verdict.outputs[id_check.name].reason


def test_a_truncating_kernel_passes_only_against_the_emulated_references():
    inputs = _inputs()
    truncated = parity.run_reference(FUSE_NORM, inputs, parity.RoundingEmulation(lambda i: True))
    exact = parity.fp64_evaluation(FUSE_NORM, inputs)
    nearest_only = parity.admissible_references(FUSE_NORM, inputs, emulate_truncation=False)
    assert not parity.judge(FUSE_NORM, truncated, nearest_only, exact).passed
    verdict = parity.judge(FUSE_NORM, truncated, parity.admissible_references(FUSE_NORM, inputs, True), exact)
    assert verdict.passed and verdict.rounding == "truncate"
    # ... and its own FP64 error is about twice the nearest reference's (the interpreter widening)
    o = verdict.outputs["h_new_TD"]
    assert 1.3 < o.ref_fp64_err / o.nearest_ref_fp64_err < 2.3


def test_a_kernel_bit_exact_with_one_admissible_reference_is_judged_against_it():
    """A kernel whose reductions are exact passes against the reference as written with a few 1-ulp flips, and
    matches the exact-reduction reference bit for bit: its verdict (and record) is the bit-exact one."""
    inputs = _inputs()
    (nearest,) = parity.admissible_references(FUSE_NORM, inputs, emulate_truncation=False)
    exact = parity.fp64_evaluation(FUSE_NORM, inputs)
    h_new, x = nearest.outputs
    flipped, _ = _flip_near_midpoints(x.flatten(), exact[1].flatten(), 3)
    other_order = parity.AdmissibleReference("exact_reductions", [h_new, flipped.view_as(x)])
    verdict = parity.judge(FUSE_NORM, other_order.outputs, [nearest, other_order], exact)
    assert verdict.passed and verdict.rounding == "exact_reductions"
    assert {name: o.n_mismatched for name, o in verdict.outputs.items()} == {"h_new_TD": 0, "x_TD": 0}
    # against the reference as written alone it passes too, on the 1-ulp budget, with the flips counted
    verdict = parity.judge(FUSE_NORM, other_order.outputs, [nearest], exact)
    assert verdict.passed and verdict.rounding == "nearest" and verdict.outputs["x_TD"].n_mismatched == 3
    # a kernel equal to the reference as written keeps that verdict, the first of two as close
    verdict = parity.judge(FUSE_NORM, nearest.outputs, [nearest, other_order], exact)
    assert verdict.passed and verdict.rounding == "nearest" and verdict.outputs["x_TD"].n_mismatched == 0


@pytest.mark.parametrize("task_name", ["moe_route", "fuse_norm"])
def test_one_expected_judges_every_implementation_as_a_fresh_judge_does(task_name, monkeypatch):
    """The runner judges every implementation's outputs for one (shape, seed) with one `Expected`: the verdicts
    are a fresh judge's, call after call, and the references' own FP64 errors are computed once, not per call.
    moe_route: paired weights re-ordered by ids; fuse_norm: several admissible (truncating) references."""
    task = get_task(task_name)
    shape = task.cpu_shapes[-1]
    inputs = task.make_inputs(shape, 1, torch.device("cpu"))
    refs = parity.admissible_references(task, inputs, emulate_truncation=True)
    exact = parity.fp64_evaluation(task, inputs)
    assert len(refs) > 1 or any(c.paired_with for c in task.outputs)
    nearest = refs[0].outputs
    ids_at = next((i for i, c in enumerate(task.outputs) if c.kind == "index_set"), None)
    float_at = next(i for i, c in enumerate(task.outputs) if c.kind != "index_set")
    off = [t.clone() for t in nearest]
    flat = off[float_at].view(-1)
    flat[:3] = torch.nextafter(flat[:3], torch.full_like(flat[:3], math.inf))
    # equal, 3 elements 1 ulp off, the last admissible reference's, one output missing, equal again after those
    implementations = [nearest, off, [t.clone() for t in refs[-1].outputs], nearest[:1], nearest]
    if ids_at is not None:  # the same choices in another order within each row, then a wrong choice
        rows, k = nearest[ids_at].shape
        g = torch.Generator().manual_seed(0)
        perm = torch.stack([torch.randperm(k, generator=g) for _ in range(rows)])
        implementations.append([t.gather(-1, perm) for t in nearest])
        wrong = [t.clone() for t in nearest]
        wrong[ids_at][0, 0] = wrong[ids_at][0].max() + 1  # an id not in row 0
        implementations.append(wrong)

    calls = []
    real = parity.normwise_error
    monkeypatch.setattr(parity, "normwise_error", lambda x, e: calls.append(1) or real(x, e))
    shared = parity.Expected(task, refs, exact)
    first = shared.judge(nearest)
    n_first = len(calls)
    assert shared.judge(nearest) == first
    own = len(calls) - n_first  # the candidate's own errors, against the references it differs from
    assert n_first - own == 2 * len(refs) * sum(c.kind != "index_set" for c in task.outputs)
    for got in implementations:
        assert shared.judge(got) == parity.Expected(task, refs, exact).judge(got)
    verdicts = [shared.judge(got) for got in implementations]
    assert [v.passed for v in verdicts][:4] == [True, True, True, False]
    if ids_at is not None:
        assert verdicts[5].passed and not verdicts[6].passed


def test_the_wrong_number_of_outputs_is_a_mismatch():
    inputs = _inputs()
    ref = parity.admissible_references(FUSE_NORM, inputs, False)
    verdict = parity.judge(FUSE_NORM, ref[0].outputs[:1], ref, parity.fp64_evaluation(FUSE_NORM, inputs))
    assert not verdict.passed and "expected 2 outputs" in verdict.reason


def test_summary_keeps_the_worst_figures_over_seeds():
    ref, exact = _bf16_pair()
    check = OutputCheck("x", "bf16")
    got, _ = _flip_near_midpoints(ref, exact, 3)
    calls = [
        parity.CallParity(True, "nearest", {"x": parity.compare_output(check, ref, ref, exact, ref)}),
        parity.CallParity(True, "nearest", {"x": parity.compare_output(check, got, ref, exact, ref)}),
    ]
    s = parity.summarize(calls)["x"]
    assert s["passed"] and s["calls"] == 2 and s["n_mismatched"] == 3 and s["max_ulp"] == 1
    assert s["n_elements"] == 2000 and math.isclose(s["fp64_ratio"], calls[1].outputs["x"].fp64_ratio)


# ---- planted numerical bugs, through the whole harness (tests/fixtures/fuse_norm) ---------------------
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("one_ulp_everywhere", "15360 of 15360 elements differ by 1 ulp"),
        ("skipped_rounding", "differ by more than 1 ulp"),
        ("nan_output", "non-finite"),
        ("wrong_shape", "shape (3, 5119) expected (3, 5120)"),
        ("wrong_dtype", "dtype torch.float32 expected torch.bfloat16"),
        ("first_call_only", "call 2:"),
    ],
)
def test_planted_numerical_bugs_are_mismatches(planted, name, reason):
    record = planted(name)
    assert record.status is Status.MISMATCH, (record.status, record.detail)
    assert reason in record.detail or any(reason in o.get("reason", "") for o in record.parity.values()), record
    assert not record.cheats


def test_first_call_only_passes_its_first_call(planted):
    record = planted("first_call_only")
    for figures in record.parity.values():
        assert figures["calls"] == 2 and figures["reason"].startswith("call 2:")


def test_the_honest_control_passes_with_its_figures(planted):
    record = planted("correct")
    assert record.status is Status.PASSED, record.detail
    assert set(record.parity) == {"h_new_TD", "x_TD"}
    for figures in record.parity.values():
        assert figures["passed"] and figures["max_ulp"] == 0 and figures["fp64_ratio"] == 1.0
        assert figures["roundings"] == ["nearest"] and figures["calls"] == 2
