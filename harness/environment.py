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


@functools.cache
def capture() -> Environment:
    """Read once per process: the environment does not change while a harness command runs."""
    on_gpu = torch.cuda.is_available()
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    if not commit:
        # A tree shipped without its .git (the GPU machine gets a copy of the working tree): the
        # shipper names the commit it copied; whether the copy was dirty is then unknown.
        commit = os.environ.get("BEAM_GIT_COMMIT") or None
    return Environment(
        device=torch.cuda.get_device_name(0) if on_gpu else "cpu (Triton interpreter)",
        driver=_nvidia_driver() if on_gpu else None,
        cuda=torch.version.cuda if on_gpu else None,
        torch=torch.__version__,
        triton=_package_version("triton"),
        flashinfer=_package_version("flashinfer-python"),
        python=platform.python_version(),
        host=platform.node(),
        git_commit=commit,
        git_dirty=None if status is None else bool(status),
    )
