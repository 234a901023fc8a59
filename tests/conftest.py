"""Test-wide setup. TRITON_INTERPRET must be set before any @triton.jit kernel is decorated, so it
is set here, before test modules import candidate kernels (TOOLCHAIN.md)."""

import contextlib
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def working_tree_env(**extra: str) -> dict[str, str]:
    """This process's environment for a `python -m harness` subprocess run from the working tree, as the GPU
    machine runs it: the repository first on PYTHONPATH, then whatever PYTHONPATH already held (the GPU
    machine's packages are installed into a folder named there, not into a venv)."""
    from harness.environment import REPO_ROOT

    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ---- the planted candidates, evaluated once per session (tests/fixtures/README.md) -------------------
# One runner call for every planted file: the children run in parallel, and each test reads the
# records it is about. The secret the sandbox fixtures look for is planted here, in the parent.
PLANTED_DIR = os.path.join(os.path.dirname(__file__), "fixtures", "fuse_norm")
PLANTED_SECRET_ENV = ("BEAM_TEST_SECRET_TOKEN", "hunter2-env-secret")
PLANTED_SECRET_FILE = ("/tmp/beam-harness-test-secret/credentials", "hunter2-file-secret")
PLANTED_SHAPE = "T=3"  # beam width: the allocator reuses poisoned blocks of this size reliably
PLANTED_TIMEOUT_S = 10.0  # the hanging fixture costs this much; honest children take 0.4-1 s forked, ~4 s exec'd


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory):
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    files = sorted(f for f in os.listdir(PLANTED_DIR) if f.endswith(".py"))
    planted = [candidates.load(os.path.join(PLANTED_DIR, f), task.name, task.op_name) for f in files]
    secret_dir = os.path.dirname(PLANTED_SECRET_FILE[0])
    os.makedirs(secret_dir, exist_ok=True)
    with open(PLANTED_SECRET_FILE[0], "w") as f:
        f.write(PLANTED_SECRET_FILE[1])
    os.chmod(PLANTED_SECRET_FILE[0], 0o644)  # readable by anyone: only the sandbox stands in the way
    os.environ[PLANTED_SECRET_ENV[0]] = PLANTED_SECRET_ENV[1]
    results = tmp_path_factory.mktemp("planted-results")
    settings = runner.EvaluationSettings(
        device="cpu", shapes=(PLANTED_SHAPE,), seeds=(1, 2), parity_timeout_s=PLANTED_TIMEOUT_S,
        results_dir=str(results), cache_dir=str(tmp_path_factory.mktemp("planted-cache")), progress=False,
    )  # fmt: skip
    try:
        result = runner.evaluate(task, planted, settings, echo=lambda _: None)
    finally:
        del os.environ[PLANTED_SECRET_ENV[0]]
        # Another test session on this machine may have removed it already (the path is fixed:
        # the planted candidate, which sees no environment, must know where to look).
        with contextlib.suppress(FileNotFoundError):
            os.remove(PLANTED_SECRET_FILE[0])
    return result


@pytest.fixture
def planted(planted_run):
    """The record of one planted candidate (by file stem) on the planted shape."""

    def get(name: str):
        (record,) = planted_run.for_implementation(name)
        return record

    return get


@pytest.fixture
def demangled_as_on_the_gpu_machine(monkeypatch):
    """torch._C._demangle, which torch's profiler applies to every event name, made to behave as libstdc++
    6.0.33's __cxa_demangle does on the GPU machine (sixty-fourth session,
    results/gpu_logs/2026-12-07-session64/demangle_probe.py): "L", a length n and n characters read as an
    internal-linkage name, so "L4.moe" gives ".moe" and "L10.attention" ".attention"; "L3.moe" and
    "L4.attention" stay. This machine's libstdc++ 6.0.30 leaves them all be."""
    real = torch._C._demangle

    def demangle(name: str) -> str:
        match = re.fullmatch(r"L(\d+)(.+)", name, flags=re.DOTALL)
        return match[2] if match and int(match[1]) == len(match[2]) else real(name)

    monkeypatch.setattr(torch._C, "_demangle", demangle)
