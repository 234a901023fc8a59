"""moe_experts' decode path (two GEMV kernels) under programmatic dependent launch: does chaining its second
kernel to its first hide the gap between them? routed_slots (promoted) loaded four ways from its own source:
  shipped   as committed;
  pdl       griddepcontrol.wait as the first statement of both kernels, every config launched with launch_pdl
            (what the other promoted decode kernels do: nothing read before the previous kernel completed);
  chain     pdl, and the gate/up kernel calls griddepcontrol.launch_dependents right after its wait: the
            down kernel of the SAME call may be dispatched once every gate/up program has started, its
            programs filling the SMs that the gate/up kernel's last wave leaves idle, waiting in their own
            griddepcontrol.wait until the gate/up kernel has completed. The down kernel does not trigger,
            so the next call's first kernel still starts after this call's last kernel has ended;
  chain_l2  chain, and before its wait each down program asks L2 for its rows of slot 0's down weights
            (cp.async.bulk.prefetch.L2, one instruction per row: 26 MB in all at T = 1): weights and ids are
            inputs of the call, not the gate/up kernel's outputs.
Every variant autotunes itself; outputs are compared with the shipped kernel's (the same arithmetic: bit for
bit) and with the reference op. Timed by the harness's own timer (harness/bench.py: interleaved, p20/p50/p80,
CUDA-graph windows over 16 input sets that share one set of expert weights, 20 GB, and rotate x and routing).
Usage (repository root): python moe_pdl_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys
import tempfile

import torch
import triton

from harness import bench
from reference_model import ops
from tasks import get_task, inputs
from tasks.moe_experts import routing

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


PREFETCH = '''

@triton.jit
def _prefetch_rows_l2(row0_ptr, rows, row_stride_bytes, nbytes):
    """Thread i asks L2 for bytes [row0 + r * row_stride_bytes, + nbytes) of row r = i (i < rows)."""
    tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        .reg .b32 t;
        .reg .b64 a;
        mov.u32 t, %tid.x;
        setp.lt.u32 p, t, $2;
        mad.wide.u32 a, t, $3, $1;
        @p cp.async.bulk.prefetch.L2.global [a], $4;
        mov.u32 $0, 0;
        }""",
        "=r,l,r,r,r",
        [row0_ptr, rows, row_stride_bytes, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )

'''

DOWN_HEAD = '''    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < D
'''


def load(variant):
    src = open("candidate_kernels/moe_experts/routed_slots.py").read()
    if variant != "shipped":
        src = src.replace("import triton.language as tl\n", "import triton.language as tl\n"
                          "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait\n", 1)
        up_head = "    pair = tl.program_id(0)\n"
        assert src.count(up_head) == 1 and src.count(DOWN_HEAD) == 1
        trigger = "    gdc_launch_dependents()\n" if variant in ("chain", "chain_l2") else ""
        src = src.replace(up_head, "    gdc_wait()\n" + trigger + up_head, 1)
        if variant == "chain_l2":
            first = ("    e0 = tl.load(ids_ptr + t * stride_it).to(tl.int64)\n"
                     "    row0 = wd_ptr + e0 * stride_de + (tl.program_id(1) * BLOCK_N).to(tl.int64) * stride_dd\n"
                     "    rows = tl.minimum(BLOCK_N, D - tl.program_id(1) * BLOCK_N)\n"
                     "    _prefetch_rows_l2(row0, rows, stride_dd * 2, Fe * 2)\n")
            src = src.replace(DOWN_HEAD, DOWN_HEAD + first + "    gdc_wait()\n", 1)
            src = src.replace("\n# ---- GEMV schedule", PREFETCH + "\n# ---- GEMV schedule", 1)
        else:
            src = src.replace(DOWN_HEAD, DOWN_HEAD + "    gdc_wait()\n", 1)
    path = f"{tempfile.mkdtemp()}/routed_slots_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"moe_routed_slots_{variant}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if variant != "shipped":
        for tuner in ("_gate_up_gemv_kernel", "_down_combine_gemv_kernel"):
            for c in getattr(module, tuner).configs:
                c.kwargs["launch_pdl"] = True
    return module


task = get_task("moe_experts")
dev = torch.device("cuda")
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
settings = bench.BenchSettings(samples=40, min_samples=10, max_seconds=4.0)
variants = ("shipped", "pdl", "chain", "chain_l2")
modules = {v: load(v) for v in variants}
base = None
for label in ("T=1", "T=3"):
    shape = task.shape(label, dev)
    if base is None:
        base = task.make_inputs(shape, 0, dev)
    T, D, E, k = shape["T"], shape["D"], shape["E"], shape["k"]
    sets = []
    for seed in range(16):
        w, ids = routing(T, E, k, seed)
        gen = inputs.generator(seed, dev)
        sets.append({**base, "x_TD": inputs.normalized_activation(T, D, gen), "ids_Tk": ids.to(dev),
                     "weights_Tk": (w * 2.5).to(dev)})
    want = ops.moe_experts(**sets[0])
    shipped = modules["shipped"].moe_experts(**sets[0])
    timers = []
    for v, module in modules.items():
        try:
            got = module.moe_experts(**sets[0])
            tuners = ("_gate_up_gemv_kernel", "_down_combine_gemv_kernel")
            picks = {t: str(getattr(module, t).best_config) for t in tuners}
            emit(shape=label, what="check", impl=v, configs=picks, equal_to_shipped=bool(torch.equal(got, shipped)),
                 max_abs_vs_reference=(got.float() - want.float()).abs().max().item())
            timers.append(bench.make_timer(v, module.moe_experts, sets, True, settings, None))
        except Exception as ex:
            emit(shape=label, what="failed", impl=v, error=f"{type(ex).__name__}: {str(ex)[:400]}")
    copy, copy_sets = bench.same_bytes_copy(task.cost(shape).bytes, 4)
    timers.append(bench.make_timer("same_bytes_copy", copy, copy_sets, True, settings, None))
    for name, r in bench.time_interleaved(timers, settings).items():
        if isinstance(r, str):
            emit(shape=label, impl=name, failed=r)
        else:
            emit(shape=label, impl=name, p20=round(r.p20_us, 3), p50=round(r.p50_us, 3), p80=round(r.p80_us, 3),
                 method=r.method)
    del sets, timers
    torch.cuda.empty_cache()
