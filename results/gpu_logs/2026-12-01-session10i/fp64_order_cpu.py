"""CPU check (no GPU needed): on qk_norm_rope's sliding T=16384 inputs (generated on the CPU, seeds 1-3),
how many heads' FP64 sums of squares depend on the summation order, and how many of their FP32 means.
Run from the repository root: python results/gpu_logs/2026-12-01-session10i/fp64_order_cpu.py"""
import torch

from tasks import TASKS

task = TASKS["qk_norm_rope"]
shape = next(s for s in task.shapes if s.label == "sliding T=16384")
for seed in (1, 2, 3):
    inputs = task.make_inputs(shape, seed, torch.device("cpu"))
    for name in ("q_THD", "k_TKD"):
        x = inputs[name].float()
        heads = (x * x).reshape(-1, x.shape[-1]).double()  # BF16 squares: exact in FP32
        orders = (
            heads.sum(-1),
            heads.reshape(heads.shape[0], 8, -1).sum(-1).sum(-1),
            heads.flip(-1).sum(-1),
            heads.reshape(heads.shape[0], -1, 2).sum(-1).sum(-1),
        )
        sums_differ = torch.zeros(heads.shape[0], dtype=torch.bool)
        means_differ = torch.zeros(heads.shape[0], dtype=torch.bool)
        for other in orders[1:]:
            sums_differ |= orders[0] != other
            means_differ |= (orders[0] / x.shape[-1]).float() != (other / x.shape[-1]).float()
        positive = torch.where(heads > 0, heads, torch.full_like(heads, float("inf")))
        span = torch.log2(heads.amax(-1)) - torch.log2(positive.amin(-1))
        print(seed, name, "heads", heads.shape[0], "order-dependent FP64 sums:", int(sums_differ.sum()),
              "FP32 means differing:", int(means_differ.sum()), "max span (bits):", round(float(span.max()), 1))
