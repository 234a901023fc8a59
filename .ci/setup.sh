#!/usr/bin/env bash
# Sets up .venv with everything the harness and its tests need on a CPU machine (idempotent).
# torch is pinned first to the CPU build 2.13.0 (any other spec pulls a multi-GB CUDA build);
# the project's own range then installs nothing more (see ../shared/TOOLCHAIN.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
