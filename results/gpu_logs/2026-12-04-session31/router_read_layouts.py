"""Why did router_dot_sweep.py's read of W alone (thirtieth session, STEP 0) take 4.08 us where
router_read_floor.py's read took 2.78, in the same layout (256 programs of 8 warps, 1024-wide blocks)?
Compiled for sm_90a on a machine without a GPU, through the compile path of `harness inspect`
(harness/inspect_child.compile_figures): the two reads as those scripts ran them, and lean_row's row kernel.
Usage (repository root, no GPU): python router_read_layouts.py"""

import importlib.util

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from harness.inspect_child import compile_figures


@triton.jit
def read_floor(x_ptr, w_ptr, out_ptr, E, D: tl.constexpr, BLOCK_K: tl.constexpr):
    """router_read_floor.py's _read_rows at rows=1, split=1: W's blocks loaded as [1, BLOCK_K] tiles."""
    gdc_wait()
    rows = tl.program_id(0) + tl.arange(0, 1)
    total = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        total += tl.load(w_ptr + rows[:, None] * D + cols[None, :])
    tl.store(out_ptr + rows, tl.sum(total, axis=1))


@triton.jit
def dot_sweep_read(x_ptr, w_ptr, out_ptr, E, D: tl.constexpr, BLOCK_K: tl.constexpr):
    """router_dot_sweep.py's _row_dot at STEP 0, T = 1: W's blocks loaded as [BLOCK_K], added as w[None, :]."""
    gdc_wait()
    row = tl.program_id(0)
    tokens = tl.arange(0, 1)
    acc = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(D // BLOCK_K):
        cols = i * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + row * D + cols)
        acc += w[None, :]
    tl.store(out_ptr + tokens * E + row, tl.sum(acc, axis=1))


spec = importlib.util.spec_from_file_location("lean_row", "candidate_kernels/router_gemm/lean_row.py")
lean_row = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lean_row)

SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*fp32", "out_ptr": "*fp32", "E": "i32", "D": "constexpr",
             "BLOCK_K": "constexpr"}  # fmt: skip
OPTIONS = {"num_warps": 8, "launch_pdl": True}
for name, fn in (("read_floor", read_floor), ("dot_sweep_read", dot_sweep_read),
                 ("lean_row._row_dot_kernel", lean_row._row_dot_kernel)):  # fmt: skip
    f = compile_figures(fn, SIGNATURE, {"D": 5120, "BLOCK_K": 1024}, ["x_ptr", "w_ptr", "out_ptr", "E"], OPTIONS)
    print(f"{name}: {f.registers} registers, {f.shared_bytes} B shared, {f.barriers} bar.sync, global loads by "
          f"bytes {f.loads}, SASS {f.sass}")  # fmt: skip
