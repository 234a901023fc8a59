"""fuse_norm at T = 1 (one row of 5120): row_warps' kernel with one config forced at a time, plain loads
with 4, 8, 16 and 32 warps (5-40 elements of the row per thread), the head's rows folded first or not,
and its two ring configs, beside the file's own autotuned pick. Its prune (8..64 elements per thread)
is lifted for the sweep, so 32 warps run too. Each output is compared with the reference op bit for bit.
Timed by the harness's own timer (harness/bench.py: CUDA-graph windows of 100 calls, all of them
interleaved, p20/p50/p80) over 64 rotated input sets.
Usage (repository root): python fuse_norm_t1_sweep.py OUT.jsonl"""

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


spec = importlib.util.spec_from_file_location("row_warps", "candidate_kernels/fuse_norm/row_warps.py")
rw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rw)
kernel = rw._fuse_norm_ring_kernel
shipped, shipped_prune = kernel.configs, kernel.early_config_prune

emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("fuse_norm")
dev = torch.device("cuda")
shape = task.shape("T=1", dev)
sets = [task.make_inputs(shape, seed, dev) for seed in range(64)]
want = ops.norm_residual_norm(**sets[0])
SETTINGS = bench.BenchSettings(samples=30, min_samples=10, max_seconds=2.0)

forced = [("plain", w, fold) for w in (4, 8, 16, 32) for fold in (True, False)]
forced += [("ring", 4, False), ("ring", 8, False)]
timers = []
rw.norm_residual_norm(**sets[0])  # the file's own pick, autotuned over its shipped configs
emit(what="pick", config=str(kernel.best_config))
timers.append(bench.make_timer("autotuned", rw.norm_residual_norm, sets, True, SETTINGS, None))
for path, warps, fold in forced:
    name = f"{path} warps={warps} fold={fold}"
    ring = path == "ring"
    kernel.configs = [triton.Config({"PROGRAMS_PER_SM": 1, "STAGES": 3 if ring else 1, "RING": ring, "FOLD": fold},
                                    num_warps=warps)]
    kernel.early_config_prune = None
    kernel.cache.clear()
    try:
        got = rw.norm_residual_norm(**sets[0])
        exact = [bool(torch.equal(g, w)) for g, w in zip(got, want)]
        timers.append(bench.make_timer(name, rw.norm_residual_norm, sets, True, SETTINGS, None))
        emit(what="forced", impl=name, bit_exact_h_x=exact)
    except Exception as ex:
        emit(what="failed", impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
kernel.configs, kernel.early_config_prune = shipped, shipped_prune
copy, copy_sets = bench.same_bytes_copy(task.cost(shape).bytes, len(sets))
timers.append(bench.make_timer("same_bytes_copy", copy, copy_sets, True, SETTINGS, None))
results = bench.time_interleaved(timers, SETTINGS)
for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
    if isinstance(r, str):
        emit(impl=name, failed=r)
    else:
        emit(impl=name, p20=round(r.p20_us, 3), p50=round(r.p50_us, 3), p80=round(r.p80_us, 3), method=r.method)
