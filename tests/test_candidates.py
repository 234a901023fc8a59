"""Every committed candidate passes parity through the harness on the CPU shapes (Triton interpreter).

One runner call per task evaluates every file under candidate_kernels/<task>/, sandboxed, over two
seeds; a candidate that breaks the file contract fails here as bad input.
"""

from __future__ import annotations

import pytest

from harness import candidates, runner
from harness.records import Status
from tasks import TASKS

WITH_CANDIDATES = sorted(name for name in TASKS if candidates.discover(name, TASKS[name].op_name))


def test_some_task_has_candidates():
    assert WITH_CANDIDATES, "no candidate files under candidate_kernels/<task>/"


@pytest.mark.parametrize("task_name", WITH_CANDIDATES)
def test_every_candidate_passes_parity(task_name, tmp_path):
    task = TASKS[task_name]
    found = candidates.discover(task_name, task.op_name)
    settings = runner.EvaluationSettings(device="cpu", seeds=(1, 2), results_dir=str(tmp_path / "results"),
                                         cache_dir=str(tmp_path / "cache"), progress=False)  # fmt: skip
    result = runner.evaluate(task, found, settings, echo=lambda _: None)
    failures = [
        f"{r.implementation} on {r.shape_label}: {r.status.value}: {r.detail}\n{r.log_tail[-1500:]}"
        for r in result.records
        if r.status is not Status.PASSED
    ]
    assert not failures, "\n\n".join(failures)
    assert {r.implementation for r in result.records} == {c.name for c in found}
    assert len(result.records) == len(found) * len(task.cpu_shapes)


def _load_candidate(task_name: str, stem: str):
    import importlib.util

    from harness.environment import REPO_ROOT

    path = REPO_ROOT / "candidate_kernels" / task_name / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"{stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs_under_each_setting(module, kernel, key: str, task_name: str) -> list[tuple]:
    """The launcher's outputs on every CPU shape with the interpreter's config as is, and with `key`
    (a boolean config parameter) flipped: pairs (as shipped, flipped)."""
    import torch
    import triton

    task, shipped = TASKS[task_name], kernel.configs
    assert [c.kwargs[key] for c in shipped] == [True]
    flipped = [triton.Config({**c.kwargs, key: False}, num_warps=c.num_warps) for c in shipped]
    pairs = []
    for shape in task.cpu_shapes:
        inputs = task.make_inputs(shape, 1, torch.device("cpu"))
        try:
            kernel.configs = flipped
            other = getattr(module, task.op_name)(**inputs)
        finally:
            kernel.configs = shipped
        pairs.append((getattr(module, task.op_name)(**inputs), other, shape.label))
    return pairs


def test_moe_route_either_selection_selects_the_same_way_by_keys_and_by_values():
    """Its two selections (PACKED per config on the GPU; the interpreter runs PACKED=True): the same
    experts in the same order and bit-identical weights on every CPU shape."""
    import torch

    module = _load_candidate("moe_route", "either_selection")
    for (w_keys, ids_keys), (w_values, ids_values), label in _outputs_under_each_setting(
        module, module._moe_route_kernel, "PACKED", "moe_route"
    ):
        assert torch.equal(ids_keys, ids_values) and torch.equal(w_keys, w_values), label


def test_fuse_norm_persistent_prefetch_reduces_a_row_the_same_either_way():
    """Its two reduction orders (FOLD: per config on the GPU, the interpreter runs FOLD=True) sum
    the same exact squares: outputs bit-identical on every CPU shape, with and without a tail."""
    import torch

    module = _load_candidate("fuse_norm", "persistent_prefetch")
    for folded, apart, label in _outputs_under_each_setting(
        module, module._fuse_norm_persistent_kernel, "FOLD", "fuse_norm"
    ):
        for a, b in zip(folded, apart, strict=True):
            assert torch.equal(a, b), label
