"""The T = 16384 rings of fuse_norm and qk_norm_rope with more warps per SM: programs of 8, 16 and 32 warps.
Why: Nsight Compute (twenty-ninth session) found both promoted rings at 8 warps per SM (fuse_norm: 2 programs
of 4 warps, 226 registers; qk_norm_rope sliding: 2 of 4, 110 registers) with the warps waiting on their own
instruction chains, not on DRAM; no ring of more than 8 warps per program (fuse_norm) or 4 (qk_norm_rope) was
ever timed. `harness inspect` (offline, sm_90a) compiles the wider programs without spills: fuse_norm 16 warps
92 registers, 32 warps 64; qk_norm_rope whole-token rings of 8 and 16 warps 58-64.
fuse_norm runs candidate_kernels/fuse_norm/lean_ring.py (mixed_squares with WEIGHTS_PER_ROW: the ring may load
the norm weights per row instead of holding them; refuted by this sweep and removed, so the script needs the
tree of 6bc3e40); qk_norm_rope runs pdl_token_ring.py. Each config runs in
its own copy of the module (its own autotuner, that one config, no prune); every output is compared bit for
bit with the promoted file's (autotuned) output. Timed by the harness's own timer (bench.time_shape:
interleaved, event windows after an L2 flush, rotated input sets, p20/p50/p80), with torch elementwise copies
of the op's main traffic beside them. ptxas' registers and spills of each compiled ring kernel are printed.
Usage (repository root): python ring_warps_sweep.py OUT.jsonl"""

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


def load(task, stem, name):
    spec = importlib.util.spec_from_file_location(f"{stem}_{name}", f"candidate_kernels/{task}/{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forced(task, stem, kernel, name, kwargs, warps, maxnreg=None):
    m = load(task, stem, name)
    autotuner = getattr(m, kernel)
    autotuner.configs = [triton.Config({**kwargs, "launch_pdl": True}, num_warps=warps, maxnreg=maxnreg)]
    autotuner.early_config_prune = None
    return m


def registers(module, kernel):
    return [
        {"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
        for attr, _, k in compiled_kernels(module)
        if attr == kernel
    ]


def sweep(task_name, op, kernel, modules, labels, copies):
    task = get_task(task_name)
    dev = torch.device("cuda")
    settings = bench.BenchSettings(max_seconds=3.0)
    flush = bench.l2_flush_buffer()
    for label in labels:
        shape = task.shape(label, dev)
        inputs = task.make_inputs(shape, 0, dev)
        want = getattr(modules["promoted"], op)(**inputs)
        emit(task=task_name, T=label, what="pick", config=str(getattr(modules["promoted"], kernel).best_config))
        impls = {"torch copies": copies}
        for name, m in modules.items():
            try:
                got = getattr(m, op)(**inputs)
                emit(
                    task=task_name,
                    T=label,
                    impl=name,
                    bit_exact=[bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)],
                    compiled=registers(m, kernel),
                )
                impls[name] = getattr(m, op)
            except Exception as ex:
                emit(task=task_name, T=label, impl=name, error=f"{type(ex).__name__}: {str(ex)[:300]}")
        del inputs, want
        results = bench.time_shape(task, shape, impls, settings, 1, flush)
        for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(task=task_name, T=label, impl=name, failed=r)
            else:
                emit(task=task_name, T=label, impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2),
                     p80=round(r.p80_us, 2), method=r.method)  # fmt: skip


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)

# fuse_norm: (programs per SM, stages, warps, maxnreg, weights per row)
FUSE = (
    (2, 3, 4, None, False),  # the promoted pick at T = 16384
    (2, 3, 4, None, True),
    (1, 3, 8, None, False),
    (2, 3, 8, 128, False),
    (3, 2, 8, 80, False),
    (1, 3, 16, 128, False),
    (1, 4, 16, 128, False),
    (1, 3, 16, 128, True),
    (2, 2, 16, 64, False),
    (2, 3, 16, 64, False),
    (1, 3, 32, 64, False),
    (1, 4, 32, 64, False),
    (1, 5, 32, 64, False),
    (1, 5, 32, 64, True),
)
fuse = {"promoted": load("fuse_norm", "mixed_squares", "promoted")}
for p, s, w, r, per_row in FUSE:
    kwargs = {"PROGRAMS_PER_SM": p, "STAGES": s, "RING": True, "FOLD": False, "MIXED": 0, "WEIGHTS_PER_ROW": per_row}
    fuse[f"ring p={p} stages={s} warps={w} maxnreg={r} per_row={per_row}"] = forced(
        "fuse_norm", "lean_ring", "_fuse_norm_ring_kernel", f"{p}_{s}_{w}_{per_row}", kwargs, w, r
    )
sweep("fuse_norm", "norm_residual_norm", "_fuse_norm_ring_kernel", fuse, ("T=16384", "T=1000"),
      lambda y_TD, h_TD, **_: (torch.neg(y_TD), torch.neg(h_TD)))  # fmt: skip

# qk_norm_rope: (split, programs per SM, stages, warps); all rings, PACKED, GROUP_HEADS 16 (read by the grid only)
QK = (
    (False, 2, 3, 4),  # the promoted pick at sliding T = 16384
    (False, 2, 3, 8),
    (False, 3, 3, 8),
    (False, 4, 2, 8),
    (False, 1, 4, 8),
    (False, 2, 3, 16),
    (False, 1, 4, 16),
    (True, 4, 3, 4),
    (True, 6, 3, 4),
    (True, 8, 2, 4),
    (True, 8, 3, 2),
)
qk = {"promoted": load("qk_norm_rope", "pdl_token_ring", "promoted")}
qk["grid split (global pick)"] = forced(
    "qk_norm_rope", "pdl_token_ring", "_qk_norm_rope_ring_kernel", "grid",
    {"GROUPS": False, "GROUP_HEADS": 16, "SPLIT": True, "RING": False, "PROGRAMS_PER_SM": 0, "STAGES": 1,
     "PACKED": True}, 2)  # fmt: skip
for split, p, s, w in QK:
    kwargs = {"GROUPS": False, "GROUP_HEADS": 16, "SPLIT": split, "RING": True, "PROGRAMS_PER_SM": p, "STAGES": s,
              "PACKED": True}  # fmt: skip
    qk[f"ring split={split} p={p} stages={s} warps={w}"] = forced(
        "qk_norm_rope", "pdl_token_ring", "_qk_norm_rope_ring_kernel", f"{split}_{p}_{s}_{w}", kwargs, w
    )
sweep("qk_norm_rope", "qk_norm_rope", "_qk_norm_rope_ring_kernel", qk, ("sliding T=16384", "global T=16384"),
      lambda q_THD, k_TKD, v_TKD, **_: (torch.neg(q_THD), torch.neg(k_TKD), torch.neg(v_TKD)))  # fmt: skip
