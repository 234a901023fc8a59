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
