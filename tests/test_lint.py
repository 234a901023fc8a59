"""The repository passes its own linter and formatter (pyproject.toml [tool.ruff]): what is checked before a
commit is checked in CI too, so a kernel docstring or a test cannot land over the line length unnoticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_finds_nothing_to_fix(args):
    done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
