"""router_gemm at T = 1: do the 256 programs' reads of the one shared x cost lean_row its 0.3 us over a read of W?
lean_row's row kernel (_row_dot_kernel: 256 programs of 8 warps, one expert row each, every load up front) ran 3.06
us in the harness, and a PDL read of W alone in the same layout 2.78 (thirtieth session). The two compile to the
same W loads; the dot adds one 8-byte load of x per thread and K block. Every program reads all of x (10 KB, 80
lines of 128 B), so each line of x is asked for by 256 programs at once. Here the same dot reads x from a buffer of
replicas instead, G programs per replica (G = 256: the one x, as lean_row; G = 1: a private copy per program): if the
time falls with G, the shared lines are the cost. Beside them lean_row itself and the read of W alone. Each replica
holds x's values, so every variant's logits must equal lean_row's bit for bit (checked). Timed by the harness's
timer (bench.make_timer / time_interleaved: CUDA-graph replays of rotated input sets), launched as programmatic
dependents like lean_row. A diagnosis, not a kernel: the replicas are made outside the timed calls.
Usage (repository root): python router_x_sweep.py OUT.jsonl"""

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
def _dot_from_replicas(x_rep_ptr, w_ptr, out_ptr, D: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr,
                       READ_X: tl.constexpr):  # fmt: skip
    """lean_row's _row_dot_kernel with x read from replica row // G (READ_X False: W's loads alone, summed)."""
    gdc_wait()
    row = tl.program_id(0)
    rows = row + tl.arange(0, 1)
    acc = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows[:, None] * D + cols[None, :])
        if READ_X:
            x = tl.load(x_rep_ptr + (rows[:, None] // G) * D + tl.max_contiguous(cols, 4)[None, :]).to(tl.float32)
            acc += x * w
        else:
            acc += w
    tl.store(out_ptr + rows, tl.sum(acc, axis=1))


def dot(g, read_x=True):
    def run(x_TD, w_router_ED, x_rep):
        E, D = w_router_ED.shape
        out = torch.empty((1, E), dtype=torch.float32, device=x_TD.device)
        _dot_from_replicas[(E,)](x_rep, w_router_ED, out, D, 1024, g, read_x, num_warps=8, launch_pdl=True)
        return out

    return run


spec = importlib.util.spec_from_file_location("lean_row", "candidate_kernels/router_gemm/lean_row.py")
lean_row = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lean_row)

emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("router_gemm")
shape = task.shape("T=1", torch.device("cuda"))
settings = bench.BenchSettings(max_seconds=3.0)
plain_sets = bench._input_sets(task, shape, 1, settings)
E = plain_sets[0]["w_router_ED"].shape[0]
GROUPS = (256, 64, 16, 4, 1)
sets = {g: [{**s, "x_rep": s["x_TD"].expand(E // g, -1).contiguous()} for s in plain_sets] for g in GROUPS}
emit(what="input sets", count=len(plain_sets))
want = lean_row.router_logits(**plain_sets[0])
runs = [("lean_row", lean_row.router_logits, plain_sets), ("W read alone", dot(256, False), sets[256])]
for g in GROUPS:
    fn = dot(g)
    got = fn(**sets[g][0])
    emit(impl=f"x: {E // g} replicas, {g} programs each", bit_identical=bool(torch.equal(got, want)))
    runs.append((f"x: {E // g} replicas, {g} programs each", fn, sets[g]))
torch.cuda.synchronize()
timers = [bench.make_timer(name, fn, s, True, settings, None) for name, fn, s in runs]
results = bench.time_interleaved(timers, settings)
for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
    if isinstance(r, str):
        emit(impl=name, failed=r)
    else:
        emit(impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2), p80=round(r.p80_us, 2), method=r.method)
