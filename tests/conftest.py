"""Test-wide setup. TRITON_INTERPRET must be set before any @triton.jit kernel is decorated, so it
is set here, before test modules import candidate kernels (TOOLCHAIN.md)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
