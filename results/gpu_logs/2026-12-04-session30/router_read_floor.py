"""router_gemm at T = 1 and 8: how long does a read of the FP32 weight alone take when launched as a programmatic
dependent (PDL), the launch the router kernel in force uses?
Why: the T = 1 goal (3.0 us) was found below every plain launch that read the 5.24 MB weight (3.12 us at best of 30
layouts, fourteenth session), but those launches did not use PDL, which took 0.26 us off the router kernel itself
(twenty-fourth session). Here Triton kernels that only read W (each program SPLIT-th of a row, or ROWS rows, every
load up front, one FP32 sum per row stored), with and without PDL, are timed beside pdl_stream_words (the kernel in
force, autotuned) by the harness's own timer (bench.time_shape: CUDA-graph replays of rotated input sets, with the
harness's same-bytes copy beside them).
Usage (repository root): python router_read_floor.py OUT.jsonl"""

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
def _read_rows(w_ptr, out_ptr, D: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr, SPLIT: tl.constexpr,
               PDL: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    row0 = (pid // SPLIT) * ROWS
    part = pid % SPLIT
    PART: tl.constexpr = D // SPLIT
    total = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    rows = row0 + tl.arange(0, ROWS)
    for i in tl.static_range(PART // BLOCK_K):
        cols = part * PART + i * BLOCK_K + tl.arange(0, BLOCK_K)
        total += tl.load(w_ptr + rows[:, None] * D + cols[None, :])
    tl.store(out_ptr + rows * SPLIT + part, tl.sum(total, axis=1))


def reader(rows, split, block_k, warps, pdl):
    def read(x_TD, w_router_ED):
        E, D = w_router_ED.shape
        out = torch.empty(E * split, dtype=torch.float32, device=w_router_ED.device)
        _read_rows[(E // rows * split,)](w_router_ED, out, D, block_k, rows, split, pdl, num_warps=warps,
                                          launch_pdl=pdl)  # fmt: skip
        return out

    return read


spec = importlib.util.spec_from_file_location("pdl_stream_words", "candidate_kernels/router_gemm/pdl_stream_words.py")
router = importlib.util.module_from_spec(spec)
spec.loader.exec_module(router)

emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("router_gemm")
dev = torch.device("cuda")
settings = bench.BenchSettings(max_seconds=3.0)
# (rows per program, split of a row, K block, warps)
LAYOUTS = ((1, 1, 1024, 8), (1, 1, 1024, 4), (1, 1, 512, 4), (1, 2, 512, 4), (1, 2, 1024, 8), (1, 4, 256, 2),
           (1, 4, 512, 4), (2, 1, 1024, 8), (2, 1, 512, 4))  # fmt: skip
impls = {"pdl_stream_words (autotuned)": router.router_logits}
for r, s, k, w in LAYOUTS:
    for pdl in (True, False):
        impls[f"read W: {256 // r * s} programs, rows={r} split={s} block_k={k} warps={w} pdl={pdl}"] = reader(
            r, s, k, w, pdl
        )
for label in ("T=1", "T=8"):
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    for fn in impls.values():
        fn(**inputs)  # compile (and autotune) before timing
    torch.cuda.synchronize()
    emit(T=label, what="pick", config=str(router._router_kernel.best_config))
    results = bench.time_shape(task, shape, impls, settings, 1, None)
    for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
        if isinstance(r, str):
            emit(T=label, impl=name, failed=r)
        else:
            emit(T=label, impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2), p80=round(r.p80_us, 2),
                 method=r.method)  # fmt: skip
