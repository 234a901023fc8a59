"""qk_norm_rope at T = 16384: the promoted whole-token ring with more programs per SM on fewer stages, forced.

Why. fuse_norm's ring ran 14 us faster on an H100 with 3 programs of 4 warps per SM on 2 stages than with 2 on 3
(narrow_ring_sweep.py, this session), a config its autotuner had never been offered. qk_norm_rope's promoted kernel
(loads_first) runs the same kind of ring at sliding T = 16384 (2 programs of 4 warps, 3 stages: 150.53 us on the
H200 against 137.88 for one kernel moving the same bytes), and offers 3 programs only on 3 stages and 4 only of 2
warps; its 4-warp ring takes about 110 registers, so up to 4 programs of 4 warps fit an SM. Here each config runs
in its own copy of loads_first.py (its own autotuner holding that one config, no prune); q', k' and both caches are
compared bit for bit with the promoted file's (autotuned) outputs, ptxas' registers and spills of each ring kernel
are printed, and all are timed together by the harness's timer (bench.time_shape: interleaved event windows after
an L2 flush, rotated input sets, p20/p50/p80, the same-bytes copy beside them), the promoted file among them.
Usage (repository root): python qk_ring_sweep.py OUT.jsonl [shape ...]   (default: sliding and global T=16384)"""

import importlib.util
import json
import sys

import torch
import triton

from harness import bench
from harness.child import compiled_kernels
from tasks import get_task

KERNEL = "_qk_norm_rope_ring_kernel"
# (split, programs per SM, stages, warps, packed); whole-token rings but the last two (split into parts)
RINGS = ((False, 2, 3, 4, False), (False, 3, 3, 4, False), (False, 3, 2, 4, False), (False, 4, 2, 4, False),
         (False, 4, 3, 4, False), (False, 5, 2, 4, False), (False, 3, 2, 4, True), (False, 4, 2, 4, True),
         (False, 4, 2, 2, False), (False, 6, 2, 2, False), (False, 8, 2, 2, False), (True, 4, 2, 4, False),
         (True, 6, 2, 4, False))  # fmt: skip


def load(name):
    path = "candidate_kernels/qk_norm_rope/loads_first.py"
    spec = importlib.util.spec_from_file_location(f"loads_first_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forced(split, p, s, w, packed):
    m = load(f"{split}_{p}_{s}_{w}_{packed}")
    autotuner = getattr(m, KERNEL)
    kwargs = {"GROUPS": False, "GROUP_HEADS": 16, "SPLIT": split, "RING": True, "PROGRAMS_PER_SM": p, "STAGES": s,
              "PACKED": packed, "launch_pdl": True}  # fmt: skip
    autotuner.configs = [triton.Config(kwargs, num_warps=w)]
    autotuner.early_config_prune = None
    return m


def run(module, inputs):
    """(q', k', k cache, v cache), on caches of its own (the op writes k' and v into them)."""
    caches = {name: inputs[name].clone() for name in ("k_cache_SKD", "v_cache_SKD")}
    q, k = module.qk_norm_rope(**(inputs | caches))
    return q, k, caches["k_cache_SKD"], caches["v_cache_SKD"]


def main():
    out = open(sys.argv[1], "w")
    labels = sys.argv[2:] or ["sliding T=16384", "global T=16384"]

    def emit(**kw):
        print(json.dumps(kw), flush=True)
        out.write(json.dumps(kw) + "\n")
        out.flush()

    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    modules = {"loads_first (in force)": load("promoted")}
    for c in RINGS:
        modules["ring split={} p={} stages={} warps={} packed={}".format(*c)] = forced(*c)
    task = get_task("qk_norm_rope")
    dev = torch.device("cuda")
    settings = bench.BenchSettings(max_seconds=2.0)
    flush = bench.l2_flush_buffer()
    promoted = modules["loads_first (in force)"]
    for label in labels:
        shape = task.shape(label, dev)
        inputs = task.make_inputs(shape, 0, dev)
        want = run(promoted, inputs)
        emit(T=label, what="pick", config=str(getattr(getattr(promoted, KERNEL), "best_config", None)))
        impls = {}
        for name, m in modules.items():
            try:
                got = run(m, inputs)
                torch.cuda.synchronize()
            except Exception as ex:
                emit(T=label, impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
                continue
            exact = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
            compiled = [{"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
                        for attr, _, k in compiled_kernels(m) if attr == KERNEL]  # fmt: skip
            emit(T=label, impl=name, bit_exact=exact, compiled=compiled)
            if all(exact):
                impls[name] = m.qk_norm_rope
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
