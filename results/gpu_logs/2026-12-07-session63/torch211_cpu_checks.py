"""For the next device call (CUDA hidden): torch 2.11's CPU-only profiler names, looked at.

    CUDA_VISIBLE_DEVICES= python results/gpu_logs/2026-12-07-session63/torch211_cpu_checks.py

The range names of beam-tiny's layers over three decode steps: torch 2.11 gave `.moe` for `L4.moe` once
(test_model's profiler test, in an xdist worker), and bench_model's CPU kernel count found 5 layers of 6; torch
2.13 gives all twelve layer names each time.
"""

import torch

from reference_model.cache import KVCache
from reference_model.config import get_config
from reference_model.weights import random_model

TINY, CAPACITY = get_config("beam-tiny"), 64
print("torch", torch.__version__)

model = random_model("beam-tiny", seed=0)
for rep in range(3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model.decode(KVCache(TINY, 1, CAPACITY, "cpu"), torch.tensor([1]))
    layers = sorted({e.name for e in prof.events() if e.name.endswith((".attention", ".mlp", ".moe"))})
    print(f"profile {rep}: {len(layers)} layer ranges: {layers}")
