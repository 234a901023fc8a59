"""router_gemm: does lean_row's row kernel pay a second round trip because ptxas splits its loads, and what would
loading W before the PDL wait add? Compiled for sm_90a without a register cap, lean_row's _row_dot_kernel gets 32
registers and ptxas issues 6 of a thread's 10 loads, then FMAs that wait for them, then the other 4; with .maxnreg
(any cap >= 40) it takes 40 registers and issues all 10 first (`harness inspect`, cuobjdump). Here, at T = 1: lean_row
and upfront_row (lean_row launched with maxnreg) as shipped; the same dot written with W's loads before
griddepcontrol.wait (W is a weight: no kernel ahead of it writes it, which is this variant's precondition; x comes
from that kernel and is read after the wait), with and without the cap; and W's loads alone on either side of the
wait. At T = 8, lean_row (its parent's kernel there) beside the same row layout with all 8 tokens, W before and after
the wait. Logits checked against lean_row's (bit-identical where the arithmetic order is the same). Timed by the
harness's timer (bench.time_shape: CUDA-graph replays of rotated input sets, interleaved, the same-bytes copy beside
them), every kernel launched as a programmatic dependent.
Usage (repository root): python router_issue_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from harness import bench
from tasks import get_task

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


@triton.jit
def _row(x_ptr, w_ptr, out_ptr, E, D: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
         W_FIRST: tl.constexpr, READ_X: tl.constexpr):  # fmt: skip
    """lean_row's row (one expert row per program, D // BLOCK_K blocks, all loads up front), W's loads before the
    wait when W_FIRST; READ_X False: W's loads alone, summed."""
    row = tl.program_id(0)
    tokens = tl.arange(0, BLOCK_T)
    if not W_FIRST:
        gdc_wait()
    ws = ()
    for i in tl.static_range(D // BLOCK_K):
        ws = ws + (tl.load(w_ptr + row * D + i * BLOCK_K + tl.arange(0, BLOCK_K)),)
    if W_FIRST:
        gdc_wait()
    acc = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    if READ_X:
        xs = ()
        for i in tl.static_range(D // BLOCK_K):
            cols = tl.max_contiguous(i * BLOCK_K + tl.arange(0, BLOCK_K), 4)
            xs = xs + (tl.load(x_ptr + tokens[:, None] * D + cols[None, :]),)
        for i in tl.static_range(D // BLOCK_K):
            acc += xs[i].to(tl.float32) * ws[i][None, :]
    else:
        for i in tl.static_range(D // BLOCK_K):
            acc += ws[i][None, :]
    tl.store(out_ptr + tokens * E + row, tl.sum(acc, axis=1))


def row(w_first, read_x=True, maxnreg=None):
    def run(x_TD, w_router_ED):
        T, D = x_TD.shape
        E = w_router_ED.shape[0]
        out = torch.empty((T, E), dtype=torch.float32, device=x_TD.device)
        cap = {"maxnreg": maxnreg} if maxnreg else {}
        _row[(E,)](x_TD, w_router_ED, out, E, D, 1024, T, w_first, read_x, num_warps=8, launch_pdl=True, **cap)
        return out

    return run


def load(name):
    spec = importlib.util.spec_from_file_location(name, f"candidate_kernels/router_gemm/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lean_row, upfront_row = load("lean_row"), load("upfront_row")
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("router_gemm")
dev = torch.device("cuda")
settings = bench.BenchSettings(max_seconds=3.0)
plans = {
    "T=1": {
        "lean_row (in force)": lean_row.router_logits,
        "upfront_row (lean_row, maxnreg=128)": upfront_row.router_logits,
        "dot, wait first, no cap": row(False),
        "dot, wait first, maxnreg=128": row(False, maxnreg=128),
        "dot, W before the wait, no cap": row(True),
        "dot, W before the wait, maxnreg=128": row(True, maxnreg=128),
        "W read alone, wait first": row(False, read_x=False),
        "W read alone, before the wait": row(True, read_x=False),
    },
    "T=8": {
        "lean_row (its parent's kernel)": lean_row.router_logits,
        "dot of 8 tokens, wait first": row(False),
        "dot of 8 tokens, W before the wait": row(True),
    },
}
for label, impls in plans.items():
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    want = lean_row.router_logits(**inputs)
    for name, fn in impls.items():
        if "alone" in name:
            continue
        got = fn(**inputs)
        rel = float(((got - want).abs() / want.abs().clamp_min(1e-3)).max())
        emit(T=label, impl=name, bit_identical=bool(torch.equal(got, want)), max_rel_diff=rel)
    torch.cuda.synchronize()
    results = bench.time_shape(task, shape, impls, settings, 1, None)
    for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
        if isinstance(r, str):
            emit(T=label, impl=name, failed=r)
        else:
            emit(T=label, impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2), p80=round(r.p80_us, 2),
                 method=r.method)  # fmt: skip
