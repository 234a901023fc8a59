"""fuse_norm at T = 16384: narrow_weights' ring configs, and replay_tuned's, forced one at a time.

Why. narrow_weights (replay_tuned with the norm weights held as BF16 and widened per row) exists so that three
4-warp ring programs fit an SM under 168 registers; its autotuner on the H200 (forty-ninth session, Triton's event
timer at this size) took the 2-program ring instead, 179.80 us against replay_tuned's 171.16. Whether the
3-program ring is slower or was only ranked so by that timer was not measured. Here each config runs in its own
copy of its module (its own autotuner holding that one config, no prune), every output is compared bit for bit
with replay_tuned's (autotuned, the promoted kernel), ptxas' registers and spills of each ring kernel are printed,
and all are timed together by the harness's timer (bench.time_shape: interleaved event windows after an L2 flush,
rotated input sets, p20/p50/p80, the same-bytes copy beside them), with replay_tuned as shipped among them.
Usage (repository root): [PLAN=more] python narrow_ring_sweep.py OUT.jsonl [shape ...]   (shapes default to T=16384)"""

import importlib.util
import json
import os
import sys

import torch
import triton

from harness import bench
from harness.child import compiled_kernels
from tasks import get_task

KERNEL = "_fuse_norm_ring_kernel"
# (programs per SM, stages, warps, maxnreg): narrow_weights' ring configs, and the 3-program ring on 2 stages
NARROW = ((3, 3, 4, 168), (3, 4, 4, 168), (3, 2, 4, 168), (2, 3, 4, None), (2, 4, 4, None), (2, 3, 8, 128),
          (2, 4, 8, 128))  # fmt: skip
REPLAY = ((2, 3, 4, None), (2, 4, 4, None))  # replay_tuned's 4-warp ring configs, the H200's picks
# PLAN=more: 4 programs per SM (capped at 128 registers, which spills) beside the 3-program rings of 2 stages
MORE = ((3, 2, 4, 168), (3, 2, 4, None), (4, 2, 4, 128), (4, 3, 4, 128))


def load(stem, name):
    spec = importlib.util.spec_from_file_location(f"{stem}_{name}", f"candidate_kernels/fuse_norm/{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forced(stem, p, s, w, r):
    m = load(stem, f"{p}_{s}_{w}_{r}")
    autotuner = getattr(m, KERNEL)
    kwargs = {"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, "MIXED": 0, "launch_pdl": True}
    autotuner.configs = [triton.Config(kwargs, num_warps=w, maxnreg=r)]
    autotuner.early_config_prune = None
    return m


def main():
    out = open(sys.argv[1], "w")
    labels = sys.argv[2:] or ["T=16384"]

    def emit(**kw):
        print(json.dumps(kw), flush=True)
        out.write(json.dumps(kw) + "\n")
        out.flush()

    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    modules = {"replay_tuned (in force)": load("replay_tuned", "promoted")}
    more = os.environ.get("PLAN") == "more"
    for c in MORE if more else NARROW:
        modules["narrow_weights p={} stages={} warps={} maxnreg={}".format(*c)] = forced("narrow_weights", *c)
    for c in () if more else REPLAY:
        modules["replay_tuned p={} stages={} warps={} maxnreg={}".format(*c)] = forced("replay_tuned", *c)
    task = get_task("fuse_norm")
    dev = torch.device("cuda")
    settings = bench.BenchSettings(max_seconds=3.0)
    flush = bench.l2_flush_buffer()
    promoted = modules["replay_tuned (in force)"]
    for label in labels:
        shape = task.shape(label, dev)
        inputs = task.make_inputs(shape, 0, dev)
        want = promoted.norm_residual_norm(**inputs)
        emit(T=label, what="pick", config=str(getattr(getattr(promoted, KERNEL), "best_config", None)))
        impls = {}
        for name, m in modules.items():
            try:
                got = m.norm_residual_norm(**inputs)
                torch.cuda.synchronize()
            except Exception as ex:
                emit(T=label, impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
                continue
            exact = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
            compiled = [{"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
                        for attr, _, k in compiled_kernels(m) if attr == KERNEL]  # fmt: skip
            emit(T=label, impl=name, bit_exact=exact, compiled=compiled)
            if all(exact):
                impls[name] = m.norm_residual_norm
        del inputs, want
        results = bench.time_shape(task, shape, impls, settings, 1, flush)
        for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(T=label, impl=name, failed=r)
            else:
                emit(T=label, impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2), p80=round(r.p80_us, 2),
                     method=r.method)  # fmt: skip


if __name__ == "__main__":
    main()
