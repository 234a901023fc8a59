"""Where a measurement ran: GPU, driver, library versions, git commit. Every record carries one."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Environment:
    device: str  # "NVIDIA H200" or "cpu (Triton interpreter)"
    driver: str | None
    cuda: str | None
    torch: str
    triton: str | None
    flashinfer: str | None
    python: str
    host: str
    git_commit: str | None
    git_dirty: bool | None

    def to_dict(self) -> dict:
        return asdict(self)


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _commit() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the tree that runs. A tree copied to another machine (the GPU machine gets
    a copy of the working tree) may come with no .git, or with a .git older than the tree, which
    would name the wrong commit: there the shipper names the commit it copied in BEAM_GIT_COMMIT,
    which wins, and whether the copy was dirty is unknown (None)."""
    shipped = os.environ.get("BEAM_GIT_COMMIT", "").strip()
    if shipped:
        return shipped, None
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


@functools.cache
def capture() -> Environment:
    """Read once per process: the environment does not change while a harness command runs."""
    on_gpu = torch.cuda.is_available()
    commit, dirty = _commit()
    return Environment(
        device=gpu() or "cpu (Triton interpreter)",
        driver=_nvidia_driver() if on_gpu else None,
        cuda=torch.version.cuda if on_gpu else None,
        torch=torch.__version__,
        triton=_package_version("triton"),
        flashinfer=_package_version("flashinfer-python"),
        python=platform.python_version(),
        host=platform.node(),
        git_commit=commit,
        git_dirty=dirty,
    )


def gpu() -> str | None:
    """This machine's GPU as records name it (`Environment.device`), None without one: the GPU whose
    promotions are in force here (harness/promote.py `promoted`)."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
