"""Lazy access to the optional kernel libraries that tasks name as baselines.

flashinfer exists only on the GPU machine, and even there its kernels JIT-compile on first use;
importing it must never be a side effect of importing a task. A baseline factory calls
`flashinfer_module(...)` when the harness asks for it, and gets either the module or a
`BaselineUnavailable` saying why not.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from tasks.task import BaselineUnavailable


def require_cuda(baseline: str) -> None:
    if not torch.cuda.is_available():
        raise BaselineUnavailable(f"baseline {baseline!r} needs a CUDA GPU; torch.cuda.is_available() is False")


def flashinfer_module(name: str, baseline: str) -> ModuleType:
    """Import `name` (e.g. "flashinfer.norm") for `baseline`, or raise BaselineUnavailable."""
    require_cuda(baseline)
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise BaselineUnavailable(f"baseline {baseline!r} needs {name!r}, which does not import here: {e}") from e
