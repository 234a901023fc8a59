"""qk_norm_rope at T = 16384: what token_ring's exact FP64 sums of squares cost. token_ring's kernel with
its sliding and global picks forced, beside the same kernel with each head's sum of squares in FP32
(a diagnostic: BEAM.md §5 leaves an FP32 reduction's order free, but this is not a candidate yet).
Outputs compared with the reference op bit for bit; timed by the harness's own timer (harness/bench.py:
interleaved event windows, p20/p50/p80) over 3 rotated input sets.
Usage (repository root): python qk_fp32_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys

import torch
import triton
import triton.language as tl

from harness import bench
from reference_model import ops
from tasks import get_task

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


def load(tag):
    spec = importlib.util.spec_from_file_location(f"token_ring_{tag}", "candidate_kernels/qk_norm_rope/token_ring.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exact, fp32 = load("exact"), load("fp32")
_to_bf16_in_pairs = fp32._to_bf16_in_pairs
_rsqrt = fp32._rsqrt


@triton.jit
def _norm_and_position_fp32(x1, x2, w1, w2, cos, sin, scale, eps, HALF: tl.constexpr, IS_ROPE: tl.constexpr,
                            SCALE: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """token_ring's _norm_and_position with the sum of squares in FP32."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    inv_rms = _rsqrt(sum_sq / (2 * HALF) + eps)[:, None]
    if PACKED:
        n1 = _to_bf16_in_pairs(x1 * inv_rms * w1[None, :])
        n2 = _to_bf16_in_pairs(x2 * inv_rms * w2[None, :])
    else:
        n1 = (x1 * inv_rms * w1[None, :]).to(tl.bfloat16)
        n2 = (x2 * inv_rms * w2[None, :]).to(tl.bfloat16)
    if IS_ROPE:
        a = n1.to(tl.float32)
        b = n2.to(tl.float32)
        return (a * cos[None, :] - b * sin[None, :]).to(tl.bfloat16), (b * cos[None, :] + a * sin[None, :]).to(
            tl.bfloat16
        )
    if SCALE:
        return (n1.to(tl.float32) * scale).to(tl.bfloat16), (n2.to(tl.float32) * scale).to(tl.bfloat16)
    return n1, n2


fp32._norm_and_position = _norm_and_position_fp32


def config(split, ring, p, stages, warps, packed):
    return triton.Config({"PROGRAMS_PER_SM": p, "STAGES": stages, "RING": ring, "SPLIT": split, "PACKED": packed},
                         num_warps=warps)  # fmt: skip


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("qk_norm_rope")
dev = torch.device("cuda")
settings = bench.BenchSettings(samples=30, min_samples=10, max_seconds=2.0)
cases = [
    ("sliding T=16384", [("ring whole 2x3 4w packed", config(False, True, 2, 3, 4, True)),
                         ("ring whole 4x2 2w packed", config(False, True, 4, 2, 2, True))]),
    ("global T=16384", [("split grid 2w packed", config(True, False, 0, 1, 2, True)),
                        ("ring whole 2x3 4w packed", config(False, True, 2, 3, 4, True))]),
]  # fmt: skip


def fresh(inputs):
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in inputs.items()}


for label, configs in cases:
    shape = task.shape(label, dev)
    sets = [task.make_inputs(shape, seed, dev) for seed in range(3)]
    want = ops.qk_norm_rope(**fresh(sets[0]))
    timers = []
    for vname, module in (("exact", exact), ("fp32", fp32)):
        kernel = module._qk_norm_rope_ring_kernel
        shipped, prune = kernel.configs, kernel.early_config_prune
        for cname, c in configs:
            name = f"{vname} {cname}"
            kernel.configs, kernel.early_config_prune = [c], None
            kernel.cache.clear()
            got = module.qk_norm_rope(**fresh(sets[0]))
            pairs = zip(got, want, strict=True)
            differing = [int((g.view(torch.int16) != w.view(torch.int16)).sum()) for g, w in pairs]
            emit(shape=label, what="config", impl=name, elements_differing_q_k=differing)
            timers.append(bench.make_timer(name, module.qk_norm_rope, sets, False, settings, None))
            kernel.configs, kernel.early_config_prune = shipped, prune
    copy, copy_sets = bench.same_bytes_copy(task.cost(shape).bytes, 3)
    timers.append(bench.make_timer("same_bytes_copy", copy, copy_sets, False, settings, None))
    for name, r in sorted(bench.time_interleaved(timers, settings).items(),
                          key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):  # fmt: skip
        if isinstance(r, str):
            emit(shape=label, impl=name, failed=r)
        else:
            emit(shape=label, impl=name, p20=round(r.p20_us, 3), p50=round(r.p50_us, 3), p80=round(r.p80_us, 3))
    del sets, timers
    torch.cuda.empty_cache()
