"""dense_act: SwiGLU silu(gate) * up over flat blocks of elements, 32-bit offsets, unmasked when even.

Author: human (kernels team, issue 4), hand-written. Parent: approx_sigmoid.py (same arithmetic).

Why this file exists: the fast sigmoid alone did not close the gap to torch.compile at T <= 8
(eighth session, commit acfa724, same child: approx_sigmoid T=1 1.36 / 1.29 us, T=3 1.48 / 1.39,
T=8 2.22 / 2.10; T=64 3.97 / 4.37 and T=1000 33.29 / 34.25 faster; T=16384 480.0 / 481.4 a tie),
with the very same 1-ulp counts as compile (22/3932160 at T=64, 6481/1006632960 at T=16384). So
the arithmetic is not what differs. What still does is the work around it: tiles.py and
approx_sigmoid.py find a program's tile with a runtime division (pid by the number of column
tiles), compute 64-bit row indices and a 2-D mask on every element, where Inductor's kernel,
compiled for one shape, runs 32-bit offsets over a flat range and drops the mask when the blocks
divide it. At T = 1 the kernel is a few hundred nanoseconds of dependent work; every instruction
before the loads is on the critical path. This file does as Inductor does, for any shape:
- one flat range of T*F elements, BLOCK per program; row and column from the element index by a
  division by the compile-time F (multiply-shift); the output's offset is the index itself;
- offsets in 32 bits unless an offset can reach 2^31 (WIDE, decided on the host);
- no mask when BLOCK divides T*F (EVEN, a heuristic on the chosen BLOCK).
F is a compile-time constant: one compile per width (20480 in the dense layers, 2560 when the
experts call it).

Numerics: exactly approx_sigmoid.py's (reference_model/ops.py swiglu):
  out = bf16((g * sigmoid(g)) * u),  g = f32(gate), u = f32(up)      one rounding point
  sigmoid(g) = 1 / (1 + exp(-g)) with ex2.approx.f32 and div.full.f32, the arithmetic torch.compile
  emits; products in torch's order; enable_fp_fusion=False. The interpreter computes tl.exp and
  `/` exactly (numpy): CPU parity checks the indexing, not the approximation.

Floor (bytes / 4275 GB/s, bytes = 3*T*F*2, F = 20480): T=1 123 KB -> 0.03 us, latency bound (the
launch); T=16384 2.01 GB -> 470.9 us.
Measured on the H200 (eighth session, commit 4dd1b96, results/gpu_logs/2026-12-01-session8c), against
  the torch.compile timed in the same child, with the autotuner's choice (BLOCK / warps, from the
  records): T=1 1.22 / 1.22 us (512 / 4: a tie, from 1.36 for approx_sigmoid), T=8 1.94 / 2.10
  (1024 / 8: faster), T=3 1.68 / 1.36 (1024 / 8: slower; approx_sigmoid's 512 x 4-warp tiles took
  1.48), T=64 3.99 / 3.86, T=1000 35.19 / 34.15, T=16384 489.7 / 466.1 us (1024 / 4: 96% of the
  floor; the 2-D tiles of 1 x 2048 over 8 warps took 467-480). Goal (not slower than compile) still
  missed at T = 3 and from T = 64 up. What the runs point to: the flat indexing wins at decode
  sizes, the 2-D tiles at T >= 64; one kernel choosing its layout by size would take both.

Launch: grid = cdiv(T*F, BLOCK); (BLOCK, num_warps) autotuned per (F, T bucket) over 1-16
elements per thread, decode-size buckets timed as CUDA-graph replays.

Shape legend: T tokens (rows), F dense d_ff, N = T*F elements.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "approx_sigmoid",
    "idea": "flat element blocks, 32-bit offsets, compile-time width, no mask when even; fast FP32 sigmoid",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_INT32_LIMIT = 2**31


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK": 256}, num_warps=1)]
    # (BLOCK, warps): 1 to 16 elements per thread. At T = 1 (20480 elements) Inductor ran 80 programs
    # of 128 threads with two elements each (seventh session, PyTorch profiler).
    shapes = ((256, 4), (128, 4), (512, 4), (256, 1), (1024, 4), (1024, 8), (2048, 8), (2048, 4), (4096, 8),
              (4096, 4))  # fmt: skip
    return [triton.Config({"BLOCK": block}, num_warps=warps) for block, warps in shapes]


def _prune(configs, named_args, **kwargs):
    """Drop blocks larger than the problem: they only add masked lanes."""
    n = named_args["n_elements"]
    fit = [c for c in configs if c.kwargs["BLOCK"] <= max(128, triton.next_power_of_2(n))]
    return fit or configs[:1]


def _rows_bucket(T: int) -> int:
    """Autotuning key for the token count: the next power of two, capped (1, 4, 8, 64, 1024, 16384)."""
    return min(triton.next_power_of_2(T), 16384)


# How the autotuner times a config. Few rows: as a CUDA-graph replay, the way a decode step runs it
# and the harness times it. Triton's default (an event pair around each launch) counts the launch
# there, and ranked configs wrongly on the H200 (fuse_norm/persistent_prefetch picked 16 warps at
# T = 1: 3.63 us in a graph, where 4 warps took 3.41). Many rows: the default.
_GRAPH_TIMED_ROWS = 64
_tuning_rows = [0]  # the rows bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_rows[0] <= _GRAPH_TIMED_ROWS:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.heuristics({"EVEN": lambda args: args["n_elements"] % args["BLOCK"] == 0})
@triton.jit
def _swiglu_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    n_elements,
    stride_gate_t,
    stride_gate_f,
    stride_up_t,
    stride_up_f,
    rows_bucket,  # read only by the autotuner's key
    N_COLS: tl.constexpr,
    WIDE: tl.constexpr,  # some offset reaches 2^31: 64-bit index math
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # BLOCK divides n_elements: no mask
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    i_N = pid * BLOCK + tl.arange(0, BLOCK)
    row_N = i_N // N_COLS  # a compile-time divisor: multiply-shift
    col_N = i_N - row_N * N_COLS
    gate_offs = row_N * stride_gate_t + col_N * stride_gate_f
    up_offs = row_N * stride_up_t + col_N * stride_up_f
    if EVEN:
        g = tl.load(gate_ptr + gate_offs, eviction_policy="evict_first")
        u = tl.load(up_ptr + up_offs, eviction_policy="evict_first")
    else:
        mask = i_N < n_elements
        g = tl.load(gate_ptr + gate_offs, mask=mask, other=0.0, eviction_policy="evict_first")
        u = tl.load(up_ptr + up_offs, mask=mask, other=0.0, eviction_policy="evict_first")
    g = g.to(tl.float32)
    # silu(g) = g * sigmoid(g), sigmoid = 1 / (1 + exp(-g)): ex2.approx and div.full on the GPU.
    out = ((g * (1.0 / (1.0 + tl.exp(-g)))) * u.to(tl.float32)).to(tl.bfloat16)  # the one rounding point
    if EVEN:
        tl.store(out_ptr + i_N, out)
    else:
        tl.store(out_ptr + i_N, out, mask=mask)


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset a tensor's strides reach (0 for an empty one)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def swiglu(gate_TF: torch.Tensor, up_TF: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, BF16 out of the inputs' shape (contiguous), as ops.swiglu.

    [T, F] in the dense MLP; leading dims (the experts' [P, 1, F]) are flattened into rows when
    that is a view: the launcher never copies an input.
    """
    if gate_TF.shape != up_TF.shape or gate_TF.dim() == 0:
        raise ValueError(
            f"gate and up must have one shape [..., F]; got {tuple(gate_TF.shape)} and {tuple(up_TF.shape)}"
        )
    F = gate_TF.shape[-1]
    out = torch.empty(gate_TF.shape, dtype=torch.bfloat16, device=gate_TF.device)
    if out.numel() == 0:
        return out
    try:
        gate_2d, up_2d = gate_TF.view(-1, F), up_TF.view(-1, F)
    except RuntimeError as e:
        raise ValueError(
            f"gate and up leading dims must flatten without a copy; got strides {gate_TF.stride()} and {up_TF.stride()}"
        ) from e
    T = gate_2d.shape[0]
    n_elements = T * F
    wide = max(n_elements, _max_offset(gate_2d) + 1, _max_offset(up_2d) + 1) >= _INT32_LIMIT

    def grid(meta):
        return (triton.cdiv(n_elements, meta["BLOCK"]),)

    _tuning_rows[0] = _rows_bucket(T)
    _swiglu_kernel[grid](
        gate_2d,
        up_2d,
        out,
        n_elements,
        *gate_2d.stride(),
        *up_2d.stride(),
        _rows_bucket(T),
        N_COLS=F,
        WIDE=wide,
        enable_fp_fusion=False,
    )
    return out
