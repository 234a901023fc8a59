"""router_gemm at T = 8: whole-K programs of 1, 2 or 4 expert rows, every load of W and x issued up front.

Why. At T = 8 the kernel in force (upfront_row; its parent's unsplit FMA row there) runs 256 one-row programs that
loop over K, each reading all of x (8 x 5120 BF16 = 80 KB) beside its 20 KB row of W: about 20 MB through the SMs'
L2 ports for a 5.2 MB weight, and one round trip per K block. The T = 1 row kernel (upfront_row's own) reached 2.85 us
by issuing every load of a program before its first FMA. Here a program owns ROWS whole rows of W and all T tokens,
issues every load of both (no K loop: D // BLOCK_K blocks unrolled), and keeps one [BLOCK_T, BLOCK_K] FP32
accumulator per row (MODE acc), or sums each block at once (MODE block: fewer registers, a tree per block). ROWS = 2
halves x's reads from L2 (128 programs, about one per SM), ROWS = 4 quarters them (64 programs). The unsplit sums need
no fixup between programs. x is loaded in 4-element vectors, W's 16-byte width, so both load into one layout.
Every config's logits are compared with FP64 (normwise relative error, the task's 1e-6), and all are timed by the
harness's timer (bench.time_shape: CUDA-graph replays of rotated input sets, interleaved, the same-bytes copy beside
them) in groups, each beside upfront_row as shipped; every kernel is launched as a programmatic dependent.
A second plan (PLAN=warps in the environment) keeps one row per program and spreads it over 4-32 warps.
Usage (repository root): [PLAN=warps] python router_rows_sweep.py OUT.jsonl [T ...]"""

import importlib.util
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not INTERPRET)
MODES = {"acc": 0, "block": 1}


@triton.jit
def _block_dot(x_ptr, w_ptr, row, tokens, t_ok, cols, D: tl.constexpr):
    """x[tokens, cols] (BF16 -> FP32) times W[row, cols] (FP32), elementwise: [BLOCK_T, BLOCK_K]."""
    x = tl.load(x_ptr + tokens[:, None] * D + tl.max_contiguous(cols, 4)[None, :], mask=t_ok[:, None], other=0.0)
    w = tl.load(w_ptr + row * D + cols)
    return x.to(tl.float32) * w[None, :]


@triton.jit
def _rows(x_ptr, w_ptr, out_ptr, T, E, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
          ROWS: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
    row0 = tl.program_id(0) * ROWS
    tokens = tl.arange(0, BLOCK_T)
    t_ok = tokens < T
    zero = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    a0, a1, a2, a3 = zero, zero, zero, zero
    s0 = tl.sum(zero, axis=1)
    s1, s2, s3 = s0, s0, s0
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        p0 = _block_dot(x_ptr, w_ptr, row0, tokens, t_ok, cols, D)
        if MODE == 0:
            a0 += p0
        else:
            s0 += tl.sum(p0, axis=1)
        if ROWS > 1:
            p1 = _block_dot(x_ptr, w_ptr, row0 + 1, tokens, t_ok, cols, D)
            if MODE == 0:
                a1 += p1
            else:
                s1 += tl.sum(p1, axis=1)
        if ROWS > 2:
            p2 = _block_dot(x_ptr, w_ptr, row0 + 2, tokens, t_ok, cols, D)
            p3 = _block_dot(x_ptr, w_ptr, row0 + 3, tokens, t_ok, cols, D)
            if MODE == 0:
                a2 += p2
                a3 += p3
            else:
                s2 += tl.sum(p2, axis=1)
                s3 += tl.sum(p3, axis=1)
    if MODE == 0:
        s0, s1, s2, s3 = tl.sum(a0, axis=1), tl.sum(a1, axis=1), tl.sum(a2, axis=1), tl.sum(a3, axis=1)
    out = out_ptr + tokens * E + row0
    tl.store(out, s0, mask=t_ok)
    if ROWS > 1:
        tl.store(out + 1, s1, mask=t_ok)
    if ROWS > 2:
        tl.store(out + 2, s2, mask=t_ok)
        tl.store(out + 3, s3, mask=t_ok)


def rows(n_rows, block_k, warps, mode, maxnreg):
    def run(x_TD, w_router_ED):
        T, D = x_TD.shape
        E = w_router_ED.shape[0]
        assert D % block_k == 0 and E % n_rows == 0 and x_TD.is_contiguous() and w_router_ED.is_contiguous()
        out = torch.empty((T, E), dtype=torch.float32, device=x_TD.device)
        launch = {} if INTERPRET else {"launch_pdl": True, "maxnreg": maxnreg}
        _rows[(E // n_rows,)](x_TD, w_router_ED, out, T, E, D=D, BLOCK_T=triton.next_power_of_2(T), BLOCK_K=block_k,
                              ROWS=n_rows, MODE=MODES[mode], num_warps=warps, **launch)  # fmt: skip
        return out

    return run


def name(n_rows, block_k, warps, mode, maxnreg):
    return f"{mode} rows={n_rows} k{block_k} w{warps} maxnreg={maxnreg}"


PLAN = [  # (ROWS, BLOCK_K, warps, MODE, maxnreg)
    (1, 1024, 8, "acc", None), (1, 1024, 8, "acc", 128), (1, 512, 4, "acc", 128), (1, 1024, 8, "block", 128),
    (2, 1024, 8, "acc", None), (2, 1024, 16, "acc", None), (2, 512, 8, "acc", None), (2, 1024, 8, "block", None),
    (2, 1024, 16, "block", None), (2, 512, 4, "acc", None),
    (4, 1024, 8, "acc", None), (4, 1024, 16, "acc", None), (4, 1024, 16, "block", None), (4, 512, 8, "acc", None),
    (4, 1024, 32, "acc", None), (4, 1024, 32, "block", None),
]  # fmt: skip
# Second call: one row per program, its K blocks spread over more warps (a shorter serial share per thread).
WARPS_PLAN = [
    (1, 1024, 4, "acc", None), (1, 1024, 8, "acc", 128), (1, 1024, 16, "acc", None), (1, 1024, 16, "acc", 64),
    (1, 1024, 16, "acc", 80), (1, 1024, 32, "acc", None), (1, 512, 8, "acc", None), (1, 512, 16, "acc", None),
]  # fmt: skip


def load(module_name):
    spec = importlib.util.spec_from_file_location(module_name, f"candidate_kernels/router_gemm/{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_vs_fp64(got, x_TD, w_router_ED):
    want = x_TD.double() @ w_router_ED.double().T
    return float((got.double() - want).norm() / want.norm())


def main():
    from harness import bench
    from harness.child import compiled_kernels
    from tasks import get_task

    out = open(sys.argv[1], "w")
    labels = [f"T={t}" for t in (sys.argv[2:] or ["8"])]

    def emit(**kw):
        print(json.dumps(kw), flush=True)
        out.write(json.dumps(kw) + "\n")
        out.flush()

    upfront_row = load("upfront_row")
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    task = get_task("router_gemm")
    dev = torch.device("cuda")
    module = sys.modules[__name__]
    for label in labels:
        shape = task.shape(label, dev)
        inputs = task.make_inputs(shape, 0, dev)
        emit(T=label, impl="upfront_row (in force)", rel_err=error_vs_fp64(upfront_row.router_logits(**inputs),
                                                                          **inputs))  # fmt: skip
        impls = {}
        for c in WARPS_PLAN if os.environ.get("PLAN") == "warps" else PLAN:
            fn = rows(*c)
            try:
                got = fn(**inputs)
                torch.cuda.synchronize()
            except Exception as e:
                emit(T=label, impl=name(*c), failed=f"{type(e).__name__}: {e}"[:300])
                continue
            err = error_vs_fp64(got, **inputs)
            emit(T=label, impl=name(*c), rel_err=err)
            if err <= 1e-6:
                impls[name(*c)] = fn
        emit(T=label, compiled=[{"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None),
                                 "warps": k.metadata.num_warps} for _, _, k in compiled_kernels(module)])  # fmt: skip
        settings = bench.BenchSettings(max_seconds=2.0)
        names = list(impls)
        for g in range(0, len(names), 8):
            group = {"upfront_row (in force)": upfront_row.router_logits} | {n: impls[n] for n in names[g : g + 8]}
            results = bench.time_shape(task, shape, group, settings, 1, None)
            for n, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
                if isinstance(r, str):
                    emit(T=label, group=g // 8, impl=n, failed=r)
                else:
                    emit(T=label, group=g // 8, impl=n, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2),
                         p80=round(r.p80_us, 2))  # fmt: skip


if __name__ == "__main__":
    main()
