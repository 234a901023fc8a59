"""fuse_norm at T = 16384 and 1000: pdl_row_warps' ring with 3 and 4 programs per SM (registers capped
so that they fit: 168 and 128 per thread), beside its shipped pick and the 2-program rings it ships.
Why: Nsight Compute (this session, call 1) found its T = 16384 pick, 2 ring programs of 4 warps per SM,
at 12.4% occupancy (8 warps per SM, 226 registers) with the schedulers issuing in 47.5% of cycles and
the warps waiting mostly on their own instructions (wait, short_scoreboard), not on DRAM; the
eleventh session's forced sweep tried the ring with 1 and 2 programs per SM only (2 of 8 warps: slower).
Each config runs in its own copy of the module (its own autotuner, one config); each output is compared
bit for bit with the shipped pick's. Timed by the harness's own timer (bench.time_shape: interleaved,
event windows after an L2 flush, rotated input sets, p20/p50/p80), with two torch elementwise copies
of the same traffic (y -> out, h -> out) beside them. ptxas' registers and spills of each compiled kernel
are printed.
Usage (repository root): python fuse_programs_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys

import torch
import triton

from harness import bench
from harness.child import compiled_kernels
from tasks import get_task

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


def load(name):
    path = "candidate_kernels/fuse_norm/pdl_row_warps.py"
    spec = importlib.util.spec_from_file_location(f"pdl_row_warps_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled(module):
    return [
        {"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
        for attr, _, k in compiled_kernels(module)
        if attr == "_fuse_norm_ring_kernel"
    ]


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("fuse_norm")
dev = torch.device("cuda")
settings = bench.BenchSettings(max_seconds=3.0)
flush = bench.l2_flush_buffer()
# (programs per SM, stages, warps, maxnreg)
FORCED = (
    (2, 3, 4, None),
    (2, 4, 4, None),
    (3, 2, 4, 168),
    (3, 3, 4, 168),
    (3, 4, 4, 168),
    (4, 2, 4, 128),
    (4, 3, 4, 128),
)
modules = {"shipped": load("shipped")}
for p, s, w, r in FORCED:
    m = load(f"p{p}s{s}w{w}r{r}")
    m._fuse_norm_ring_kernel.configs = [
        triton.Config(
            {"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, "launch_pdl": True}, num_warps=w, maxnreg=r
        )
    ]
    m._fuse_norm_ring_kernel.early_config_prune = None
    modules[f"ring p={p} stages={s} warps={w} maxnreg={r}"] = m


def copies(y_TD, h_TD, **_):
    return torch.neg(y_TD), torch.neg(h_TD)


for label in ("T=16384", "T=1000"):
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    want = modules["shipped"].norm_residual_norm(**inputs)
    emit(T=label, what="pick", config=str(modules["shipped"]._fuse_norm_ring_kernel.best_config))
    impls = {"two torch copies": copies}
    for name, m in modules.items():
        try:
            got = m.norm_residual_norm(**inputs)
            emit(
                T=label,
                impl=name,
                bit_exact_h_x=[bool(torch.equal(g, x)) for g, x in zip(got, want, strict=True)],
                compiled=compiled(m),
            )
            impls[name] = m.norm_residual_norm
        except Exception as ex:
            emit(T=label, impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
    del inputs, want
    results = bench.time_shape(task, shape, impls, settings, 1, flush)
    for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
        if isinstance(r, str):
            emit(T=label, impl=name, failed=r)
        else:
            emit(
                T=label,
                impl=name,
                p20=round(r.p20_us, 2),
                p50=round(r.p50_us, 2),
                p80=round(r.p80_us, 2),
                method=r.method,
            )
