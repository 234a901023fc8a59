"""Programmatic dependent launch (PDL) on the decode-size kernels: does hiding the launch behind the previous kernel
take the per-call time below one launch moving the same bytes? Each candidate in force (or best at decode sizes)
is loaded three ways from its own source:
  shipped   as committed;
  pdl       griddepcontrol.wait as the kernel's first statement (nothing is read before the previous grid has
            completed and its writes are visible: safe after any producer) and every config launched with
            launch_pdl, so that its programs may be dispatched before the previous kernel ends;
  pdl_trig  pdl plus griddepcontrol.launch_dependents right after the wait: the next call may be dispatched
            while this one runs (what a chain of PDL-aware kernels gives; back to back here, the next call
            is the same kernel, so this reads what a model would get only if its neighbours trigger too).
Every variant autotunes itself (its own timing of each config) and is checked against the task's reference op
(bit-exact tasks: torch.equal; router_gemm: normwise error against FP64). Timed by the harness's own timer
(harness/bench.py: interleaved, p20/p50/p80, CUDA-graph windows over 64 rotated input sets) beside the
harness's same-bytes launch.
Usage (repository root): python pdl_sweep.py OUT.jsonl"""

import importlib.util
import json
import re
import sys
import tempfile

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


def load(task, stem, kernels, variant):
    """The candidate's module; for the PDL variants each kernel function in `kernels` gets the wait (and the
    trigger) as its first statements and each of its autotuner's configs launch_pdl."""
    src = open(f"candidate_kernels/{task}/{stem}.py").read()
    if variant != "shipped":
        src = src.replace("import triton.language as tl\n", "import triton.language as tl\n"
                          "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait\n", 1)
        first = "    gdc_wait()\n" + ("    gdc_launch_dependents()\n" if variant == "pdl_trig" else "")
        for fn_name, _ in kernels:
            m = re.search(rf"\ndef {fn_name}\((.|\n)*?\n\):\n", src)
            assert m, fn_name
            src = src[: m.end()] + first + src[m.end():]
    path = f"{tempfile.mkdtemp()}/{stem}_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"{task}_{stem}_{variant}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if variant != "shipped":
        for _, tuner in kernels:
            for c in getattr(module, tuner).configs:
                c.kwargs["launch_pdl"] = True
    return module


def check(task_name, entry, got, want, inputs):
    if task_name == "router_gemm":
        ref = inputs["x_TD"].double() @ inputs["w_router_ED"].double().T
        return {"rel_err_fp64": ((got[0].double() - ref).norm() / ref.norm()).item()}
    return {"bit_exact": [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]}


def outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def sweep(task_name, stem, entry, kernels, labels):
    task = get_task(task_name)
    dev = torch.device("cuda")
    settings = bench.BenchSettings(samples=30, min_samples=10, max_seconds=2.0)
    modules = {v: load(task_name, stem, kernels, v) for v in ("shipped", "pdl", "pdl_trig")}
    for label in labels:
        shape = task.shape(label, dev)
        sets = [task.make_inputs(shape, seed, dev) for seed in range(64)]

        def fresh(inputs):
            return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in inputs.items()}

        want = outputs(getattr(ops, entry)(**fresh(sets[0])))
        timers = []
        for variant, module in modules.items():
            fn = getattr(module, entry)
            name = f"{stem} {variant}"
            try:
                got = outputs(fn(**fresh(sets[0])))
                picks = {t: str(getattr(module, t).best_config) for _, t in kernels if getattr(module, t).cache}
                emit(task=task_name, shape=label, what="check", impl=name, configs=picks,
                     **check(task_name, entry, got, want, sets[0]))
                timers.append(bench.make_timer(name, fn, sets, True, settings, None))
            except Exception as ex:
                emit(task=task_name, shape=label, what="failed", impl=name, error=f"{type(ex).__name__}: {str(ex)[:400]}")
        copy, copy_sets = bench.same_bytes_copy(task.cost(shape).bytes, 64)
        timers.append(bench.make_timer("same_bytes_copy", copy, copy_sets, True, settings, None))
        results = bench.time_interleaved(timers, settings)
        for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(task=task_name, shape=label, impl=name, failed=r)
            else:
                emit(task=task_name, shape=label, impl=name, p20=round(r.p20_us, 3), p50=round(r.p50_us, 3),
                     p80=round(r.p80_us, 3), method=r.method)
        del sets, timers
        torch.cuda.empty_cache()


emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
sweep("router_gemm", "red_fixup", "router_logits", [("_router_kernel_fn", "_router_kernel")], ["T=1", "T=8", "T=64"])
sweep("fuse_norm", "row_warps", "norm_residual_norm", [("_fuse_norm_ring_kernel", "_fuse_norm_ring_kernel")],
      ["T=1", "T=8"])
sweep("output_gate", "sized_blocks", "output_gate", [("_output_gate_kernel", "_output_gate_kernel")], ["T=1", "T=8"])
sweep("qkv_gate_gemm", "flat_gemv", "qkv_gate_proj", [("_qkv_kernel", "_qkv_kernel"), ("_gemv_kernel", "_gemv_kernel")],
      ["T=1", "T=8"])
sweep("qk_norm_rope", "head_groups", "qk_norm_rope", [("_qk_norm_rope_kernel", "_qk_norm_rope_kernel")],
      ["sliding T=1", "global T=1"])
