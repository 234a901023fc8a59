#!/usr/bin/env bash
# Sets up .venv with everything the harness and its tests need on a CPU machine (idempotent).
# torch is pinned first to the CPU build 2.13.0 (any other spec pulls a multi-GB CUDA build);
# the project's own range then installs nothing more (see ../shared/TOOLCHAIN.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# Chromium from Debian's packages: tests/test_review.py renders the review page in it (headless).
# Installed when missing and apt-get can run (as root, or through passwordless sudo); a machine
# without apt still gets everything above, and that one test then skips, saying why.
if [ ! -x /usr/bin/chromium ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here: chromium not installed; the browser test will skip" >&2
  else
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
      if sudo -n true 2>/dev/null; then as_root=(sudo -n); else as_root=(false); fi
    fi
    log="${TMPDIR:-/tmp}/beam-setup-chromium.log"
    if "${as_root[@]}" apt-get update -q >"$log" 2>&1 &&
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$log" 2>&1; then
      echo "setup: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
    else
      echo "setup: could not install chromium (not root, or apt failed: see $log); the browser test will skip" >&2
    fi
  fi
fi
