"""output_gate: o * sigmoid(g + b[h]) over tiles of (token, head) rows, with the fast FP32 sigmoid.

Author: human (kernels team, issue 4), hand-written. Parent: head_rows.py (same tiles and launch).

Why this file exists: head_rows.py computes torch's sigmoid exactly (libdevice expf, IEEE division)
and is not faster than torch.compile anywhere on the H200 (seventh session, commit ed3e762, same
child: T=1 1.26 / 1.19 us, T=8 1.75 / 1.42, T=16384 153.1 / 147.2 us). At T=1 both kernels give a
thread one element (48 programs of 128 threads); what is left is the arithmetic: the accurate expf
(range reduction, then ex2) and the IEEE division (a Newton step with a slow-path branch) form a
dependent chain per element. Inductor's kernel, which the harness accepts as a passing baseline,
computes the sigmoid as Triton's `tl.sigmoid` does: 1 / (1 + exp(-z)) with exp as one
ex2.approx.f32 of z * log2(e) and `/` as div.full.f32. This candidate uses that arithmetic, and
only that differs from head_rows.py.

Numerics (reference_model/ops.py output_gate, BEAM.md §3.6):
  out = bf16(f32(o) * sigmoid(f32(g) + f32(b[h])))     one rounding point
- sigmoid(z) = 1 / (1 + exp(-z)): ex2.approx.f32 (relative error about 2^-22, plus the rounding of
  z * log2(e)) and the approximate division (up to 2 ulps). The FP32 gate is a few FP32 ulps from
  torch's; the one BF16 rounding hides that except for products within those ulps of a BF16
  rounding boundary (about 2^-14 of them), which then differ by exactly one BF16 ulp. The task's
  rule (bit_exact: 1-ulp differences on at most 1% of the elements, FP64 error within 5% of the
  reference's) judges it on every GPU shape.
- Saturation as torch's: exp(-z) overflows to inf for z < -88.7 (gate 1 / inf = 0), and exp(-z)
  -> 0 for large z (gate 1).
- The interpreter (CPU) computes tl.exp and `/` with numpy, exactly: CPU parity checks the tiles,
  the bias gather and the masks, not the approximation; the GPU run checks that.

Floor (bytes / 4275 GB/s, bytes = 3*T*H*Dh*2 + H*bias bytes, H*Dh = 6144): T=1 37 KB -> 0.01 us,
latency bound (the launch); T=16384 604 MB -> 141.3 us (goal <= 143 us).
Measured on the H200 (eighth session, commit acfa724, results/gpu_logs/2026-12-01-session8b), against
  the torch.compile timed in the same child: T=1 1.23 / 1.19 us, T=3 1.28 / 1.25, T=8 1.61 / 1.32,
  T=64 2.61 / 2.46, T=1000 10.98 / 11.40 (faster), T=16384 148.99 / 142.47 us (95% of the floor).
  1-ulp differences: none at T <= 64, 43 of 18432000 at T=1000, 822 of 301989888 at T=16384, the
  very counts of torch.compile's output. Against head_rows.py (ed3e762: T=1 1.26, T=8 1.75) the
  fast sigmoid saved 0.03-0.14 us: the arithmetic is not what keeps it behind compile.

Launch: as head_rows.py: grid = cdiv(T*H, BLOCK_R) programs over the flattened (token, head) rows,
autotuned per (H, Dh, T bucket), decode-size buckets timed as CUDA-graph replays.

Shape legend: T tokens, H query heads, Dh head dim, R flattened (token, head) rows.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "head_rows",
    "idea": "head_rows.py with the fast FP32 sigmoid (ex2.approx, div.full), the arithmetic torch.compile emits",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK_R": 4}, num_warps=1)]
    # (rows, warps) give a thread 1 to 32 elements of o and of g (Dh = 128). Few elements per thread
    # for decode: in head_rows.py each element was a dependent chain (expf, then the IEEE division),
    # and at T = 1 16 elements per thread took 1.73 us of kernel time where torch.compile's
    # one element per thread took 1.02 (seventh session, PyTorch profiler). More than 32
    # (128 rows x 8 warps: ~195 registers) leaves one program per SM.
    tiles = ((1, 4), (2, 4), (4, 4), (4, 1), (8, 4), (8, 2), (16, 8), (16, 4), (32, 8), (16, 2), (32, 4), (64, 8))
    return [triton.Config({"BLOCK_R": block_r}, num_warps=warps) for block_r, warps in tiles]


def _prune(configs, named_args, **kwargs):
    """Drop tiles far larger than the problem (T = 1 has 48 rows): they only add masked lanes."""
    n_rows = named_args["n_rows"]
    fit = [c for c in configs if c.kwargs["BLOCK_R"] <= max(4, triton.next_power_of_2(n_rows))]
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
@triton.jit
def _output_gate_kernel(
    o_ptr,
    g_ptr,
    bias_ptr,
    out_ptr,
    n_rows,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_g_t,
    stride_g_h,
    stride_g_d,
    rows_bucket,  # read only by the autotuner's key
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows_R = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    token_R = rows_R // N_HEADS  # N_HEADS is a compile-time constant: a multiply-shift, no division
    head_R = rows_R % N_HEADS
    d = tl.arange(0, BLOCK_DH)
    mask = (rows_R < n_rows)[:, None] & (d < HEAD_DIM)[None, :]

    o_offs = token_R[:, None] * stride_o_t + head_R[:, None] * stride_o_h + d[None, :] * stride_o_d
    g_offs = token_R[:, None] * stride_g_t + head_R[:, None] * stride_g_h + d[None, :] * stride_g_d
    # o and g are read once (evict_first); the 48 biases are re-read by every program (L1).
    o = tl.load(o_ptr + o_offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g = tl.load(g_ptr + g_offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    bias_R = tl.load(bias_ptr + head_R, mask=rows_R < n_rows, other=0.0).to(tl.float32)

    # sigmoid(z) = 1 / (1 + exp(-z)) in FP32, torch's formula: ex2.approx and div.full on the GPU.
    z = g + bias_R[:, None]
    gate = 1.0 / (1.0 + tl.exp(-z))
    out = (o * gate).to(tl.bfloat16)  # the one rounding point
    tl.store(out_ptr + rows_R[:, None] * HEAD_DIM + d[None, :], out, mask=mask)


def output_gate(o_THD: torch.Tensor, g_THD: torch.Tensor, bias_H: torch.Tensor) -> torch.Tensor:
    """o * sigmoid(g + b[h]), BF16 out [T, H, Dh] (contiguous), as ops.output_gate."""
    if o_THD.dim() != 3 or o_THD.shape != g_THD.shape:
        raise ValueError(f"o_THD and g_THD must both be [T, H, Dh]; got {tuple(o_THD.shape)} and {tuple(g_THD.shape)}")
    T, H, Dh = o_THD.shape
    if bias_H.shape != (H,):
        raise ValueError(f"bias_H must be [{H}] (one per head); got {tuple(bias_H.shape)}")
    out_THD = torch.empty((T, H, Dh), dtype=torch.bfloat16, device=o_THD.device)
    n_rows = T * H
    if n_rows == 0 or Dh == 0:
        return out_THD

    def grid(meta):
        return (triton.cdiv(n_rows, meta["BLOCK_R"]),)

    _tuning_rows[0] = _rows_bucket(T)
    _output_gate_kernel[grid](
        o_THD,
        g_THD,
        bias_H.contiguous(),
        out_THD,
        n_rows,
        *o_THD.stride(),
        *g_THD.stride(),
        _rows_bucket(T),
        N_HEADS=H,
        HEAD_DIM=Dh,
        BLOCK_DH=triton.next_power_of_2(Dh),
        enable_fp_fusion=False,
    )
    return out_THD
