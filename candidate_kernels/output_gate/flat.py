"""output_gate: o * sigmoid(g + b[h]) over flat blocks of elements, 32-bit offsets, unmasked when even.

Author: human (kernels team, issue 4), hand-written. Parent: approx_sigmoid.py (same arithmetic).

Why this file exists: the fast sigmoid alone did not close the gap to torch.compile (eighth
session, commit acfa724, same child: approx_sigmoid T=1 1.23 / 1.19 us, T=8 1.61 / 1.34, T=64
2.61 / 2.46, T=16384 148.99 / 142.31 us, with the very same 1-ulp counts as compile: 0/18432 at
T=1, 822/301989888 at T=16384). So the arithmetic is not what differs. What still does is the
work around it: head_rows and approx_sigmoid compute 64-bit row indices, two runtime strides per
tensor and a 2-D mask on every element, where Inductor's kernel, compiled for one shape, runs
32-bit offsets over a flat range and drops the mask when the blocks divide it. At T = 1 the whole
kernel is a few hundred nanoseconds of dependent work; every instruction before the loads is on
the critical path. This file does as Inductor does, for any shape:
- one flat range of T*H*Dh elements, BLOCK per program; token, head and column come from the
  element index by divisions by compile-time constants (multiply-shift); where o and g hold each
  token's heads contiguously (the task's inputs and the model's), an element's offset is its
  token's row offset plus its index within the token;
- offsets in 32 bits unless an offset can reach 2^31 (WIDE, decided on the host);
- no mask when BLOCK divides T*H*Dh (EVEN, a heuristic on the chosen BLOCK);
- the bias gathered per element from the head index (48 values: L1 hits).

Numerics: exactly approx_sigmoid.py's (reference_model/ops.py output_gate, BEAM.md §3.6):
  out = bf16(f32(o) * sigmoid(f32(g) + f32(b[h])))     one rounding point
  sigmoid(z) = 1 / (1 + exp(-z)) with ex2.approx.f32 and div.full.f32, the arithmetic torch.compile
  emits: a few FP32 ulps from torch's accurate sigmoid, which the BF16 rounding hides except on
  about 2^-18 of the elements, there by one BF16 ulp (approx_sigmoid's measured counts, above). The
  interpreter computes tl.exp and `/` exactly (numpy): CPU parity checks the indexing, not that.

Floor (bytes / 4275 GB/s, bytes = 3*T*H*Dh*2 + H*bias bytes, H*Dh = 6144): T=1 37 KB -> 0.01 us,
latency bound (the launch); T=16384 604 MB -> 141.3 us (goal <= 143 us).
Measured on the H200 (eighth session, commit 4dd1b96, results/gpu_logs/2026-12-01-session8c), against
  the torch.compile timed in the same child, with the autotuner's choice (BLOCK / warps, from the
  records): T=1 1.23 / 1.23 us (256 / 4: a tie), T=3 1.28 / 1.34 (256 / 4: faster), T=8 1.55 / 1.33
  (1024 / 8: slower), T=64 2.51 / 2.58 (1024 / 8: faster), T=1000 11.84 / 12.49 (2048 / 8: bands
  overlap), T=16384 152.98 / 145.38 us (1024 / 4: 92% of the floor; compile 97%). Goal missed at
  T = 8 by 0.22 us and at T = 16384 by 10 us (143). At T = 8 the autotuner, timing graph replays,
  chose 8 elements per thread over 48 programs where T = 1 and 3 ran best with 2 per thread; why
  this layout streams slower than Inductor's at T = 16384 was not profiled.

Launch: grid = cdiv(T*H*Dh, BLOCK); (BLOCK, num_warps) autotuned per (H, Dh, T bucket) over 1-16
elements per thread, decode-size buckets timed as CUDA-graph replays.

Shape legend: T tokens, H query heads, Dh head dim, N = T*H*Dh elements.
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
    "idea": "flat element blocks, 32-bit offsets, compile-time divisors, no mask when even; fast FP32 sigmoid",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_INT32_LIMIT = 2**31


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK": 256}, num_warps=1)]  # CPU shapes: 1 x 4 x 16 = 64 elements up
    # (BLOCK, warps): 1 to 16 elements per thread. At T = 1 (6144 elements) Inductor ran 48 programs
    # of 128 threads with one element each (seventh session, PyTorch profiler); at T = 16384, 8 each.
    shapes = ((128, 4), (256, 4), (128, 1), (512, 4), (256, 1), (1024, 8), (1024, 4), (2048, 8), (2048, 4),
              (4096, 8))  # fmt: skip
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
    key=["N_HEADS", "HEAD_DIM", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.heuristics({"EVEN": lambda args: args["n_elements"] % args["BLOCK"] == 0})
@triton.jit
def _output_gate_kernel(
    o_ptr,
    g_ptr,
    bias_ptr,
    out_ptr,
    n_elements,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_g_t,
    stride_g_h,
    stride_g_d,
    rows_bucket,  # read only by the autotuner's key
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    WIDE: tl.constexpr,  # some offset reaches 2^31: 64-bit index math
    INNER: tl.constexpr,  # both o and g have strides (., Dh, 1)
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # BLOCK divides n_elements: no mask
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    i_N = pid * BLOCK + tl.arange(0, BLOCK)
    # Compile-time divisors: multiply-shift, no division instruction.
    token_N = i_N // (N_HEADS * HEAD_DIM)
    within_N = i_N - token_N * (N_HEADS * HEAD_DIM)  # (head, column) of the token, flat
    head_N = within_N // HEAD_DIM
    if INNER:  # o and g hold each token's [H, Dh] contiguously (the model's g: a slice of packed rows)
        o_offs = token_N * stride_o_t + within_N
        g_offs = token_N * stride_g_t + within_N
    else:
        d_N = within_N - head_N * HEAD_DIM
        o_offs = token_N * stride_o_t + head_N * stride_o_h + d_N * stride_o_d
        g_offs = token_N * stride_g_t + head_N * stride_g_h + d_N * stride_g_d
    if EVEN:
        o = tl.load(o_ptr + o_offs, eviction_policy="evict_first")
        g = tl.load(g_ptr + g_offs, eviction_policy="evict_first")
        b = tl.load(bias_ptr + head_N, eviction_policy="evict_last")
    else:
        mask = i_N < n_elements
        o = tl.load(o_ptr + o_offs, mask=mask, other=0.0, eviction_policy="evict_first")
        g = tl.load(g_ptr + g_offs, mask=mask, other=0.0, eviction_policy="evict_first")
        b = tl.load(bias_ptr + head_N, mask=mask, other=0.0, eviction_policy="evict_last")

    # sigmoid(z) = 1 / (1 + exp(-z)) in FP32, torch's formula: ex2.approx and div.full on the GPU.
    z = g.to(tl.float32) + b.to(tl.float32)
    out = (o.to(tl.float32) * (1.0 / (1.0 + tl.exp(-z)))).to(tl.bfloat16)  # the one rounding point
    if EVEN:
        tl.store(out_ptr + i_N, out)
    else:
        tl.store(out_ptr + i_N, out, mask=mask)


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset a tensor's strides reach (0 for an empty one)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def output_gate(o_THD: torch.Tensor, g_THD: torch.Tensor, bias_H: torch.Tensor) -> torch.Tensor:
    """o * sigmoid(g + b[h]), BF16 out [T, H, Dh] (contiguous), as ops.output_gate."""
    if o_THD.dim() != 3 or o_THD.shape != g_THD.shape:
        raise ValueError(f"o_THD and g_THD must both be [T, H, Dh]; got {tuple(o_THD.shape)} and {tuple(g_THD.shape)}")
    T, H, Dh = o_THD.shape
    if bias_H.shape != (H,):
        raise ValueError(f"bias_H must be [{H}] (one per head); got {tuple(bias_H.shape)}")
    out_THD = torch.empty((T, H, Dh), dtype=torch.bfloat16, device=o_THD.device)
    n_elements = T * H * Dh
    if n_elements == 0:
        return out_THD
    wide = max(n_elements, _max_offset(o_THD) + 1, _max_offset(g_THD) + 1) >= _INT32_LIMIT

    def grid(meta):
        return (triton.cdiv(n_elements, meta["BLOCK"]),)

    _tuning_rows[0] = _rows_bucket(T)
    _output_gate_kernel[grid](
        o_THD,
        g_THD,
        bias_H.contiguous(),
        out_THD,
        n_elements,
        *o_THD.stride(),
        *g_THD.stride(),
        _rows_bucket(T),
        N_HEADS=H,
        HEAD_DIM=Dh,
        WIDE=wide,
        INNER=o_THD.stride()[1:] == g_THD.stride()[1:] == (Dh, 1),
        enable_fp_fusion=False,
    )
    return out_THD
