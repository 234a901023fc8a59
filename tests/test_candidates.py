"""Every committed candidate passes parity through the harness on the CPU shapes (Triton interpreter).

One runner call per task evaluates every file under candidate_kernels/<task>/, sandboxed, over two
seeds; a candidate that breaks the file contract fails here as bad input. Then every config its
GPU autotuners may choose is forced in turn, here, on the same shapes.
"""

from __future__ import annotations

import functools
import json
import os

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


# ---- every config a GPU autotuner may pick, forced one at a time on the interpreter ---------------------
# On the GPU the harness checks only the configs the autotuners chose there; the interpreter runs
# the one each candidate names for it. A config the autotuner never chose in a session is still one
# it may choose on another shape or machine, so each must compute the task's function too.
LIST_GPU_CONFIGS = """
import importlib.util, json, sys
import triton
spec = importlib.util.spec_from_file_location("listed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({name: [c.kwargs for c in obj.configs] for name, obj in vars(module).items()
                  if isinstance(obj, triton.runtime.Autotuner)}))
"""


def _gpu_configs(path) -> dict[str, list[dict]]:
    """{kernel name: [constexpr kwargs of each config]} as the module declares them on a GPU (imported
    without the interpreter: the candidates choose their configs at import)."""
    import json
    import subprocess
    import sys

    from harness.environment import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", LIST_GPU_CONFIGS, str(path)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load_candidate(path):
    """The candidate module, imported here (on the interpreter)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AUTOTUNED = [(name, c.path) for name in WITH_CANDIDATES for c in candidates.discover(name, TASKS[name].op_name)]


@pytest.mark.parametrize(("task_name", "path"), AUTOTUNED, ids=[f"{t}/{p.stem}" for t, p in AUTOTUNED])
def test_every_gpu_config_computes_the_task_function(task_name, path):
    """Each distinct set of constexpr parameters among a kernel's GPU configs, forced alone (warps
    and register caps mean nothing to the interpreter), passes parity on every CPU shape."""
    import torch
    import triton

    from harness import interpreter_patches, parity

    gpu = _gpu_configs(path)
    module = _load_candidate(path)
    assert gpu, f"{path.name}: no autotuned kernel on the GPU"
    interpreter_patches.apply()
    task, failures, checked = TASKS[task_name], [], 0
    for name in gpu:
        kernel = getattr(module, name)
        distinct = list({json.dumps(kw, sort_keys=True): kw for kw in gpu[name]}.values())
        for kwargs in distinct:
            if isinstance(kernel, triton.runtime.Autotuner):  # its one interpreter config, replaced
                shipped, kernel.configs = kernel.configs, [triton.Config(kwargs)]
                restore = functools.partial(setattr, kernel, "configs", shipped)
            else:  # a launcher that passes the interpreter's config itself (router_gemm: _interpreter_config)
                shipped = module._interpreter_config
                module._interpreter_config = lambda *_, kw=kwargs: dict(kw)
                restore = functools.partial(setattr, module, "_interpreter_config", shipped)
            try:
                for shape in task.cpu_shapes:
                    inputs = task.make_inputs(shape, 1, torch.device("cpu"))
                    mine = parity.clone_inputs(inputs)
                    got = parity.output_tensors(task, getattr(module, task.op_name)(**mine), mine)
                    refs = parity.admissible_references(task, inputs, emulate_truncation=False)
                    verdict = parity.judge(task, got, refs, parity.fp64_evaluation(task, inputs))
                    if not verdict.passed:
                        failures.append(f"{name} {kwargs} on {shape.label}: {verdict.reason}")
                checked += 1
            finally:
                restore()
    assert checked and not failures, "\n".join(failures)
