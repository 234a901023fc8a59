"""How much the FP64 conversion of each square costs: fuse_norm and qk_norm_rope kernels with one config
forced at a time, the parent (FP32 square converted to FP64, F2F.F64.F32) beside bit_squares (the FP64
value assembled from the BF16 bits, squared by a DMUL), bit_squares without its zero/subnormal select
("nowhere": zeros come out as 2^-254), and, for fuse_norm, row_warps with the sum of squares in FP32
(a diagnostic, not exact: how much of the time the FP64 path takes at all). Each output is compared
with the reference op bit for bit. Timed by the harness's own timer (harness/bench.py: interleaved,
p20/p50/p80; CUDA-graph windows at T = 1, events at T = 16384) over rotated input sets.
Usage (repository root): python square_sweep.py OUT.jsonl"""

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


def load(task, stem, patch=None):
    spec = importlib.util.spec_from_file_location(f"{task}_{stem}_{id(patch)}", f"candidate_kernels/{task}/{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if patch:
        patch(module)
    return module


@triton.jit
def _square64_nowhere(x):
    upper = ((x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF) << 13) + 0x38000000
    value = (upper.to(tl.int64) << 32).to(tl.float64, bitcast=True)
    return value * value


@triton.jit
def _mean_of_squares_fp32(head, tail, N_COLS: tl.constexpr, HAS_TAIL: tl.constexpr, FOLD: tl.constexpr):
    if FOLD:
        partial = tl.sum(head * head, axis=0)
        if HAS_TAIL:
            partial += tail * tail
        total = tl.sum(partial, axis=0)
    else:
        total = tl.sum(tl.sum(head * head, axis=1), axis=0)
        if HAS_TAIL:
            total += tl.sum(tail * tail, axis=0)
    return total / N_COLS


def nowhere(m):
    m._square64 = _square64_nowhere


def fp32_sum(m):
    m._mean_of_squares = _mean_of_squares_fp32


def sweep(task_name, entry, kernel_name, variants, cases):
    """cases: (shape label, decode timing, input sets, [(config name, triton.Config or None = autotuned)])."""
    task = get_task(task_name)
    dev = torch.device("cuda")
    settings = bench.BenchSettings(samples=30, min_samples=10, max_seconds=2.0)
    for label, decode, n_sets, configs in cases:
        shape = task.shape(label, dev)
        sets = [task.make_inputs(shape, seed, dev) for seed in range(n_sets)]
        want = getattr(ops, entry)(**{k: (v.clone() if torch.is_tensor(v) else v) for k, v in sets[0].items()})
        timers = []
        for vname, module in variants:
            kernel = getattr(module, kernel_name)
            shipped, prune = kernel.configs, kernel.early_config_prune
            fn = getattr(module, entry)
            for cname, config in configs:
                name = f"{vname} {cname}"
                if config is not None:
                    kernel.configs, kernel.early_config_prune = [config], None
                kernel.cache.clear()
                try:
                    got = fn(**{k: (v.clone() if torch.is_tensor(v) else v) for k, v in sets[0].items()})
                    exact = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
                    emit(
                        task=task_name,
                        shape=label,
                        what="config",
                        impl=name,
                        config=str(kernel.best_config),
                        bit_exact=exact,
                    )
                    timers.append(bench.make_timer(name, fn, sets, decode, settings, None))
                except Exception as ex:
                    emit(
                        task=task_name,
                        shape=label,
                        what="failed",
                        impl=name,
                        error=f"{type(ex).__name__}: {str(ex)[:300]}",
                    )
                kernel.configs, kernel.early_config_prune = shipped, prune
        copy, copy_sets = bench.same_bytes_copy(task.cost(shape).bytes, n_sets)
        timers.append(bench.make_timer("same_bytes_copy", copy, copy_sets, decode, settings, None))
        results = bench.time_interleaved(timers, settings)
        for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(task=task_name, shape=label, impl=name, failed=r)
            else:
                emit(
                    task=task_name,
                    shape=label,
                    impl=name,
                    p20=round(r.p20_us, 3),
                    p50=round(r.p50_us, 3),
                    p80=round(r.p80_us, 3),
                    method=r.method,
                )
        del sets, timers
        torch.cuda.empty_cache()


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)

FN = "fuse_norm"
fn_variants = [
    ("row_warps", load(FN, "row_warps")),
    ("bit_squares", load(FN, "bit_squares")),
    ("nowhere", load(FN, "bit_squares", nowhere)),
    ("fp32_sum", load(FN, "row_warps", fp32_sum)),
]


def fn_config(p, stages, warps, ring, fold, maxnreg=None):
    return triton.Config(
        {"PROGRAMS_PER_SM": p, "STAGES": stages, "RING": ring, "FOLD": fold}, num_warps=warps, maxnreg=maxnreg
    )


sweep(
    FN,
    "norm_residual_norm",
    "_fuse_norm_ring_kernel",
    fn_variants,
    [
        (
            "T=1",
            True,
            64,
            [
                ("autotuned", None),
                ("plain 4w fold", fn_config(2, 1, 4, False, True)),
                ("plain 4w apart", fn_config(2, 1, 4, False, False)),
            ],
        ),
        ("T=8", True, 64, [("autotuned", None)]),
        (
            "T=16384",
            False,
            3,
            [
                ("ring 2x3 4w", fn_config(2, 3, 4, True, False)),
                ("ring 2x4 4w", fn_config(2, 4, 4, True, False)),
                ("plain 2 4w apart", fn_config(2, 1, 4, False, False)),
            ],
        ),
    ],
)

QK = "qk_norm_rope"
qk_variants = [
    ("token_ring", load(QK, "token_ring")),
    ("bit_squares", load(QK, "bit_squares")),
    ("nowhere", load(QK, "bit_squares", nowhere)),
]


def qk_config(split, ring, p, stages, warps, packed):
    return triton.Config(
        {"PROGRAMS_PER_SM": p, "STAGES": stages, "RING": ring, "SPLIT": split, "PACKED": packed}, num_warps=warps
    )


sweep(
    QK,
    "qk_norm_rope",
    "_qk_norm_rope_ring_kernel",
    qk_variants,
    [
        ("sliding T=1", True, 64, [("autotuned", None)]),
        (
            "sliding T=16384",
            False,
            3,
            [
                ("ring whole 2x3 4w packed", qk_config(False, True, 2, 3, 4, True)),
                ("ring whole 4x2 2w packed", qk_config(False, True, 4, 2, 2, True)),
            ],
        ),
        (
            "global T=16384",
            False,
            3,
            [
                ("split grid 2w packed", qk_config(True, False, 0, 1, 2, True)),
                ("ring whole 2x3 4w packed", qk_config(False, True, 2, 3, 4, True)),
            ],
        ),
    ],
)
