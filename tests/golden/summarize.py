"""Summarize the reference's greedy run on beam-tiny with CPU numerics pinned, so that the numbers
depend on torch's version (CI installs 2.13.0's CPU build) and not on the x86-64 CPU it runs on,
given AVX2 (tests/test_optimized_model.py compares them with beam_tiny_reference.json).

    python tests/golden/summarize.py '{"preset": "beam-tiny", "seed": 0, "chunks": [[...], ...], "decode_steps": 32}'

prints the run's summary as JSON. Left to itself, torch picks its CPU kernels by the CPU: ATen's
vectorized reductions are as wide as the widest ISA found (AVX2 or AVX-512), MKL's FP32 GEMMs take
a per-CPU code path, BF16 GEMMs go through oneDNN where the CPU has AVX-512 (with AMX kernels on
Sapphire Rapids and later) and through ATen elsewhere, and reductions split by thread count. Each
choice accumulates in its own order, a BF16 rounding flips now and then, and the greedy run drifts
from there on (measured: an AMD EPYC with AVX2 alone first parted from a summary written with
AVX-512 at decode step 25). Pinned here, before torch is imported: ATen's AVX2 kernels, MKL's
COMPATIBLE branch (Intel's conditional numerical reproducibility: SSE2 code on any x86-64), oneDNN
off, one thread. Checked on that AMD EPYC only: the GPU machine's torch 2.11 draws other random
weights for the same seed, so its CPU cannot check the summary.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


HAS_AVX2 = "avx2" in _cpu_flags()
if HAS_AVX2:
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
os.environ["MKL_CBWR"] = "COMPATIBLE"  # read when MKL loads; the thread count is set in main()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from harness import model_parity  # noqa: E402
from reference_model.config import get_config  # noqa: E402
from reference_model.weights import random_model  # noqa: E402

INDICES = (0, 1, 191, 383)  # vocabulary entries whose logits are kept as they are


def summary(logits_V: torch.Tensor) -> dict:
    x = logits_V.double()
    top2 = x.topk(2).values
    return {"argmax": int(x.argmax()), "mean": float(x.mean()), "std": float(x.std()),
            "logsumexp": float(x.logsumexp(0)), "top2_gap": float(top2[0] - top2[1]),
            "values": [float(x[i]) for i in INDICES]}  # fmt: skip


def main(spec: dict) -> dict:
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    model = random_model(get_config(spec["preset"]), spec["seed"], torch.device("cpu"))
    run = model_parity.greedy_run(model, spec["chunks"], spec["decode_steps"])
    return {
        **spec,
        "torch": torch.__version__.partition("+")[0],
        "cpu": {"has_avx2": HAS_AVX2, "aten_capability": torch.backends.cpu.get_cpu_capability()},
        "tokens": run.tokens,
        "chunk_logits": [summary(x) for x in run.chunk_logits],
        "step_logits": [summary(x) for x in run.step_logits],
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
