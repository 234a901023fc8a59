"""The task files: registry, input generators (determinism, realism), references on CPU shapes,
declared outputs, cost formulas, GPU shapes derived from the `beam` preset."""

from __future__ import annotations

import itertools

import pytest
import torch

from reference_model.config import get_config
from tasks import TASKS, get_task
from tasks.task import BaselineUnavailable, Task

CPU = torch.device("cpu")
BEAM = get_config("beam")
EXPECTED_TASKS = {"fuse_norm"}

ALL_TASKS = sorted(TASKS)


def _tensors(inputs: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


# ---- registry -----------------------------------------------------------------------------------
def test_registry_lists_the_tasks_under_their_own_names():
    assert set(TASKS) == EXPECTED_TASKS
    for name, task in TASKS.items():
        assert isinstance(task, Task)
        assert task.name == name
        assert get_task(name) is task


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_task("fuse_norms")
    assert str(err.value) == f"task 'fuse_norms' unknown; known: {sorted(TASKS)}"


# ---- generic properties of every task --------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_TASKS)
def test_make_inputs_is_deterministic_per_seed_and_differs_across_seeds(name):
    task = TASKS[name]
    shape = task.cpu_shapes[-1]
    first, again, other = (task.make_inputs(shape, seed, CPU) for seed in (0, 0, 1))
    assert first.keys() == again.keys() == other.keys()
    differs = []
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again[key]), f"{name}: input {key!r} differs between two calls with seed 0"
            differs.append(not torch.equal(value, other[key]))
        else:
            assert value == again[key] == other[key], f"{name}: non-tensor input {key!r} depends on the seed"
    assert any(differs), f"{name}: seeds 0 and 1 give identical inputs"


@pytest.mark.parametrize("name", ALL_TASKS)
def test_reference_runs_on_every_cpu_shape_and_matches_the_declared_outputs(name):
    task = TASKS[name]
    n_returned = len(task.outputs) - len(task.mutated)
    for shape in task.cpu_shapes:
        inputs = task.make_inputs(shape, 0, CPU)
        assert set(task.mutated) <= set(inputs), f"{name}: mutated {task.mutated} not all among {sorted(inputs)}"
        before = {k: v.clone() for k, v in _tensors(inputs).items()}
        returned = _as_tuple(task.reference(**inputs))
        assert len(returned) == n_returned, f"{name} {shape.label}: {len(returned)} outputs, declared {n_returned}"
        produced = list(returned) + [inputs[m] for m in task.mutated]
        for check, tensor in zip(task.outputs, produced, strict=True):
            expected_dtypes = {"bf16": (torch.bfloat16,), "fp32": (torch.float32,), "index_set": (torch.int64,)}
            assert tensor.dtype in expected_dtypes[check.kind], f"{name} {shape.label} {check.name}: {tensor.dtype}"
            assert torch.isfinite(tensor.float()).all(), f"{name} {shape.label} {check.name}: non-finite output"
        for key, value in before.items():
            if key in task.mutated:
                assert not torch.equal(value, inputs[key]), f"{name} {shape.label}: mutated {key!r} left unchanged"
            else:
                assert torch.equal(value, inputs[key]), f"{name} {shape.label}: reference modified input {key!r}"


@pytest.mark.parametrize("name", ALL_TASKS)
def test_output_checks_are_consistent(name):
    task = TASKS[name]
    names = [c.name for c in task.outputs]
    assert len(set(names)) == len(names)
    for check in task.outputs:
        if check.paired_with is not None:
            partner = next(c for c in task.outputs if c.name == check.paired_with)
            assert partner.kind == "index_set"
        if check.kind == "fp32":
            assert check.rel_tol is not None and 0 < check.rel_tol < 1e-3


@pytest.mark.parametrize("name", ALL_TASKS)
def test_cost_is_positive_and_grows_with_tokens(name):
    task = TASKS[name]
    for shape in task.shapes + task.cpu_shapes:
        c = task.cost(shape)
        assert c.bytes > 0 and c.flops >= 0, f"{name} {shape.label}: {c}"
    # among shapes that differ only in T, more tokens cost strictly more bytes (and no fewer flops)
    groups: dict[tuple, list] = {}
    for shape in task.shapes:
        key = tuple(sorted((k, str(v)) for k, v in shape.params.items() if k not in ("T", "seqs")))
        groups.setdefault(key, []).append(shape)
    for shapes in groups.values():
        shapes.sort(key=lambda s: s["T"])
        for small, large in itertools.pairwise(shapes):
            cs, cl = task.cost(small), task.cost(large)
            assert cl.bytes > cs.bytes and cl.flops >= cs.flops, f"{name}: {small.label} {cs} vs {large.label} {cl}"


@pytest.mark.parametrize("name", ALL_TASKS)
def test_gpu_shapes_come_from_the_beam_preset_and_include_odd_sizes(name):
    task = TASKS[name]
    labels = [s.label for s in task.shapes]
    assert len(set(labels)) == len(labels), f"{name}: duplicate labels {labels}"
    assert len({s.label for s in task.cpu_shapes}) == len(task.cpu_shapes)
    for shape in task.shapes:
        assert shape["preset"] == "beam"
        for key, value in shape.params.items():
            if key in ("D", "hidden"):
                assert value == BEAM.hidden
    token_counts = {s["T"] for s in task.shapes}
    assert {1, 3, 1000} <= token_counts, f"{name}: T values {sorted(token_counts)} lack 1, 3 or 1000"


@pytest.mark.parametrize("name", ALL_TASKS)
def test_library_baselines_are_unavailable_without_a_gpu(name):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for baseline, factory in TASKS[name].baselines.items():
        with pytest.raises(BaselineUnavailable, match=baseline):
            factory()


# ---- realism of the inputs -----------------------------------------------------------------------
def test_fuse_norm_inputs_are_unit_variance_with_a_few_large_channels():
    task = get_task("fuse_norm")
    shape = task.shape("T=3", CPU)
    x = task.make_inputs(shape, 0, CPU)
    assert shape["D"] == BEAM.hidden and x["n"] == 60 and x["eps"] == BEAM.norm_eps
    y, h = x["y_TD"].float(), x["h_TD"].float()
    assert y.var().item() == pytest.approx(1.0, abs=0.05)
    assert h.var().item() == pytest.approx(1.0, abs=0.1)
    channel_max_D = h.abs().amax(dim=0)
    n_large = int((channel_max_D > 5 * channel_max_D.median()).sum())
    assert 1 <= n_large <= BEAM.hidden // 256, f"{n_large} large channels"
    for w in ("post_weight_D", "pre_weight_D"):
        weight = x[w].float()
        assert weight.mean().item() == pytest.approx(1.0, abs=0.02)
        assert weight.std().item() == pytest.approx(0.1, abs=0.02)
    assert not torch.equal(x["post_weight_D"], x["pre_weight_D"])
