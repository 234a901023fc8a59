"""router_gemm at T = 1 and 8: where do the 0.65 us between the kernel in force and a PDL read of its weight go?
router_read_floor.py (this session) timed a PDL read of the FP32 weight alone in pdl_stream_words' layout (256
programs of 8 warps, one row each, 1024-wide blocks) at 2.78 us, and that kernel at 3.43 (T = 1) and 4.42 (T = 8).
Here the read grows step by step toward the router's work, in the simplest Triton: + x's loads, + the FP32 products
summed (one row's dot product, every load up front, no masks: D a multiple of the block), + all T tokens; each
with PDL, beside pdl_stream_words (autotuned) and the read alone. Outputs of the dot kernels are checked against
pdl_stream_words' (max relative difference). Timed by the harness's own timer (bench.time_shape, CUDA-graph
replays of rotated input sets, the same-bytes copy beside them).
Usage (repository root): python router_dot_sweep.py OUT.jsonl"""

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
def _row_dot(x_ptr, w_ptr, out_ptr, E, D: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
             STEP: tl.constexpr):  # fmt: skip
    """STEP 0: read W's row; 1: + read x; 2: + the products summed (the logits)."""
    gdc_wait()
    row = tl.program_id(0)
    tokens = tl.arange(0, BLOCK_T)
    acc = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + row * D + cols)
        if STEP == 0:
            acc += w[None, :]
        else:
            x = tl.load(x_ptr + tokens[:, None] * D + tl.max_contiguous(cols, 4)[None, :]).to(tl.float32)
            if STEP == 1:
                acc += x + w[None, :]
            else:
                acc += x * w[None, :]
    tl.store(out_ptr + tokens * E + row, tl.sum(acc, axis=1))


def dot(step, block_k, warps):
    def run(x_TD, w_router_ED):
        T, D = x_TD.shape
        E = w_router_ED.shape[0]
        out = torch.empty((T, E), dtype=torch.float32, device=x_TD.device)
        _row_dot[(E,)](x_TD, w_router_ED, out, E, D, block_k, T, step, num_warps=warps, launch_pdl=True)
        return out

    return run


spec = importlib.util.spec_from_file_location("pdl_stream_words", "candidate_kernels/router_gemm/pdl_stream_words.py")
router = importlib.util.module_from_spec(spec)
spec.loader.exec_module(router)

emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
task = get_task("router_gemm")
dev = torch.device("cuda")
settings = bench.BenchSettings(max_seconds=3.0)
for label in ("T=1", "T=8"):
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    T = shape["T"]
    impls = {"pdl_stream_words (autotuned)": router.router_logits}
    for step, what in ((0, "read W"), (1, "read W and x"), (2, "dot")):
        for block_k, warps in ((1024, 8), (1024, 4), (512, 4), (2048, 8)):
            if block_k * T // (32 * warps) > 64:  # the parent's register budget per thread
                continue
            impls[f"{what}: block_k={block_k} warps={warps}"] = dot(step, block_k, warps)
    want = router.router_logits(**inputs)
    for name, fn in impls.items():
        got = fn(**inputs)
        if name.startswith("dot"):
            emit(T=label, impl=name, max_rel_diff=float(((got - want).abs() / want.abs().clamp_min(1e-3)).max()))
    torch.cuda.synchronize()
    emit(T=label, what="pick", config=str(router._router_kernel.best_config))
    results = bench.time_shape(task, shape, impls, settings, 1, None)
    for name, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
        if isinstance(r, str):
            emit(T=label, impl=name, failed=r)
        else:
            emit(T=label, impl=name, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2), p80=round(r.p80_us, 2),
                 method=r.method)  # fmt: skip
