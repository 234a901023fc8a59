"""fuse_norm: fuse_norm/mixed_squares (pdl_row_warps with MIXED of every 8 columns' squares made FP64 by
integer operations instead of F2F.F64.F32, the conversion pipe's 16 per clock per SM) with MIXED forced to
0 (pdl_row_warps' code), 2, 3, 4, 5, 6 and 8, on pdl_row_warps' picks: the folded plain config of 4 warps at
T = 1, 8 and 64, the 2-program ring at T = 16384; beside pdl_row_warps autotuned. Each variant runs in its
own copy of the module (one config); each output is compared bit for bit with the reference op's. Timed by
the harness's own timer (bench.time_shape: interleaved; CUDA-graph windows over rotated inputs at T <= 64
with one launch moving the same bytes, events after an L2 flush at T = 16384).
Usage (repository root): python mixed_squares_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys

import torch
import triton

from harness import bench
from reference_model import ops
from tasks import get_task

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


def load(stem, name):
    spec = importlib.util.spec_from_file_location(f"{stem}_{name}", f"candidate_kernels/fuse_norm/{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("fuse_norm")
dev = torch.device("cuda")
settings = bench.BenchSettings(max_seconds=2.0)
flush = bench.l2_flush_buffer()
PLAIN = {"PROGRAMS_PER_SM": 2, "STAGES": 1, "RING": False, "FOLD": True, "launch_pdl": True}
RING = {"PROGRAMS_PER_SM": 2, "STAGES": 3, "RING": True, "FOLD": False, "launch_pdl": True}
SWEEP = {"T=1": (PLAIN, (0, 2, 3, 4, 5, 6, 8)), "T=8": (PLAIN, (0, 4, 5, 6)), "T=64": (PLAIN, (0, 4, 5, 6)),
         "T=16384": (RING, (0, 4, 8))}  # fmt: skip

for label, (config, mixes) in SWEEP.items():
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    want = ops.norm_residual_norm(**inputs)
    shipped = load("pdl_row_warps", f"shipped_{label}")
    impls = {"pdl_row_warps autotuned": shipped.norm_residual_norm}
    for mixed in mixes:
        m = load("mixed_squares", f"{label}_{mixed}")
        m._fuse_norm_ring_kernel.configs = [triton.Config({**config, "MIXED": mixed}, num_warps=4)]
        m._fuse_norm_ring_kernel.early_config_prune = None
        name = f"mixed_squares MIXED={mixed}"
        try:
            got = m.norm_residual_norm(**inputs)
            emit(T=label, impl=name, bit_exact_h_x=[bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)])
            impls[name] = m.norm_residual_norm
        except Exception as ex:
            emit(T=label, impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
    got = shipped.norm_residual_norm(**inputs)
    emit(
        T=label,
        impl="pdl_row_warps autotuned",
        config=str(shipped._fuse_norm_ring_kernel.best_config),
        bit_exact_h_x=[bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)],
    )
    del inputs, want, got
    results = bench.time_shape(task, shape, impls, settings, 1, flush)
    for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
        if isinstance(r, str):
            emit(T=label, impl=name, failed=r)
        else:
            emit(
                T=label,
                impl=name,
                p20=round(r.p20_us, 3),
                p50=round(r.p50_us, 3),
                p80=round(r.p80_us, 3),
                method=r.method,
            )
