"""output_gate: o * sigmoid(g + b[h]) over tiles of (token, head) rows, one pass.

Author: human (kernels team, issue 4), hand-written.

Why it is faster: the reference runs five kernels (two upcasts, the bias add, the sigmoid, the
multiply and the downcast), each a round trip of [T, H, Dh] through HBM in FP32. Here each
program reads a tile of BLOCK_R (token, head) rows of o and g once in 16-byte vectors, loads the
BLOCK_R biases it needs, and writes the gated BF16 tile once: 6 bytes per element, the least the
op can move. There is no library kernel for this op (tasks/output_gate.py).

Floor (bytes / 4275 GB/s, bytes = 3*T*H*Dh*2 + H*bias bytes, H*Dh = 6144):
  T=1      37 KB  -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  604 MB -> 141.3 us (goal <= 143 us; torch.compile measured 144 us)
Measured on the H200 (first session, commit 000ef05; results/README.md): p50 T=1 2.28 us, T=8 2.33, T=64 3.17,
  T=1000 88.9, T=16384 195.7 us (77% of the copy floor); torch.compile 1.37 / 1.51 / 2.64 / 71.4 /
  168.2 us. Goal missed: slower than compile on every shape (by 0.9 us at T=1, 28 us at T=16384).
Config sweep (third session, plain process): T=1 2.09 us (4 rows, 1 warp .. 16 rows, 4 warps
  alike), T=16384 168.9 us at best (16 rows, 4 warps; 170-189 us for the others), as fast as
  torch.compile's 168 us of the first session. The goal of 143 us is 101% of the copy floor at
  4275 GB/s (141.3 us, above); 169 us is 84% of it.
Fifth session (commit d73d845, decode-size configs autotuned as graph replays), against the
  torch.compile timed in the same child: T=1 2.10 / 1.49 us, T=8 2.38 / 1.80, T=64 3.13 / 2.68,
  T=1000 23.67 / 23.57 (a tie), T=16384 157.1 / 153.1 us (90% of the copy floor; goal 143 us
  missed by 14 us). Not faster than compile anywhere; the 0.6 us at T=1 is not explained (Nsight
  Compute not run on it).
Sixth session (commit 1062fb4, event windows of >= 2 ms): T=1 1.99 / 1.34 us, T=64 3.14 / 2.73,
  T=1000 11.06 / 11.51 (faster beyond noise), T=16384 147.69 / 141.65 us (96% of the copy floor;
  compile 98%). Nsight Compute (40282b2, one cold call): T=16384 146.1 us at 82% of DRAM peak,
  occupancy 35% of a theoretical 37.5% (79 registers); T=1 3.1 us on 3 programs of 4 warps. What
  compile's T=1 kernel does differently was not profiled.
Seventh session: the PyTorch profiler inside graph replays (commit 9a3c8c6) put the T=1 gap in the
  kernel itself, 1.73 us against compile's 1.02 (3 programs x 128 threads, 16 elements each,
  against 48 x 128 with one element each); each element is a dependent expf + IEEE-division chain.
  With tiles of 1-8 elements per thread (commit ed3e762), against the compile in the same child:
  T=1 1.26 / 1.19 us, T=3 1.40 / 1.39, T=8 1.75 / 1.42, T=64 2.76 / 2.58, T=1000 12.77 / 12.59,
  T=16384 153.1 / 147.2 us (the autotuner kept 16-element tiles there). Still not faster than
  compile anywhere: goal missed by 0.07 us at T=1 and by 10 us (143 us) at T=16384.

Numerics (reference_model/ops.py output_gate, BEAM.md §3.6):
  out = bf16(f32(o) * sigmoid(f32(g) + f32(b[h])))     one rounding point
- sigmoid is computed as torch's CUDA kernel does: 1 / (1 + expf(-z)), the accurate expf and an
  IEEE division. On the GPU: libdevice's __nv_expf (what CUDA's expf is) and tl.math.div_rn
  (div.rn.f32; Triton's `/` is the approximate div.full.f32, up to 2 ulp off). The interpreter
  has no libdevice: there the exp is tl.exp (numpy's expf), chosen at import time.
- No multiply feeds an add here, so FMA contraction cannot change a result; the kernel is still
  launched with enable_fp_fusion=False so that the file reads like its siblings' contract.

Launch: grid = cdiv(T*H, BLOCK_R) programs over the flattened (token, head) rows; a row is one
head of Dh = 128 contiguous elements (16 threads x 8 BF16), so every load is a 16-byte vector and
the bias is one scalar per row. Autotuned per (H, Dh, T bucket) over BLOCK_R x num_warps: at T = 1
(48 rows) tiles of 1-2 rows over 4 warps give a thread 1-2 elements, so its dependent chain is
short and the work spreads over 24-48 SMs; at T = 16384 (786432 rows) larger tiles amortize the
per-program index math and keep more bytes in flight per SM.

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
    "parent": None,
    "idea": "tiles of (token, head) rows, bias gathered per row, sigmoid as 1/(1+expf(-z)) with IEEE division",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if _INTERPRET:

    @triton.jit
    def _expf(x):
        return tl.exp(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _expf(x):
        return libdevice.exp(x)


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK_R": 4}, num_warps=1)]
    # (rows, warps) give a thread 1 to 32 elements of o and of g (Dh = 128). Few elements per thread
    # for decode: each element is a dependent chain (expf, then the IEEE division and its slow-path
    # branch), so at T = 1 16 elements per thread took 1.73 us of kernel time where torch.compile's
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

    # sigmoid(z) = 1 / (1 + expf(-z)) in FP32, torch's formula; div_rn is the IEEE division.
    z = g + bias_R[:, None]
    gate = tl.math.div_rn(1.0, 1.0 + _expf(-z))
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
