"""dense_act: SwiGLU silu(gate) * up in one pass over [T, F] tiles, with the fast FP32 sigmoid.

Author: human (kernels team, issue 4), hand-written. Parent: tiles.py (same tiles and launch).

Why this file exists: tiles.py computes torch's sigmoid exactly (libdevice expf, IEEE division) and,
on the H200, stays behind torch.compile at T <= 8 (eighth session, commit f2b93ac, same child:
T=1 1.37 / 1.23 us, T=3 1.52 / 1.35, T=8 2.32 / 2.13). The seventh session's profiler put that
gap inside the kernel: each element is a dependent chain of the accurate expf (range reduction,
then ex2) and the IEEE division (a Newton step with a slow-path branch). Inductor's kernel, which
the harness accepts as a passing baseline, computes the sigmoid as Triton's `tl.sigmoid` does:
1 / (1 + exp(-g)) with exp as one ex2.approx.f32 of g * log2(e) and `/` as div.full.f32. This
candidate uses that arithmetic, and only that differs from tiles.py.

Numerics (reference_model/ops.py swiglu):
  out = bf16((g * sigmoid(g)) * u),  g = f32(gate), u = f32(up)      one rounding point
- sigmoid(g) = 1 / (1 + exp(-g)): ex2.approx.f32 (relative error about 2^-22, plus the rounding
  of g * log2(e), a few FP32 ulps at |g| ~ 10) and the approximate division (up to 2 ulps). The
  FP32 silu is then a few FP32 ulps from torch's; the BF16 rounding hides that except for values
  within those ulps of a BF16 rounding boundary (about 2^-14 of them), which then differ by
  exactly one BF16 ulp. The task's rule (bit_exact: 1-ulp differences on at most 1% of the
  elements, FP64 error within 5% of the reference's) is what judges it, on every GPU shape.
- Saturation is as torch's: exp(-g) overflows to inf for g < -88.7, so 1 / inf = 0 and silu = -0;
  exp(-g) -> 0 for large g, so sigmoid = 1.
- Products in torch's order, (g * s) * u; enable_fp_fusion=False, like tiles.py.
- The interpreter (CPU) computes tl.exp and `/` with numpy, exactly: CPU parity checks the tiles
  and masks, not the approximation; the GPU run checks that.

Floor (bytes / 4275 GB/s, bytes = 3*T*F*2, F = 20480): T=1 123 KB -> 0.03 us, latency bound (the
launch); T=16384 2.01 GB -> 470.9 us.
Measured on the H200 (eighth session, commit acfa724, results/gpu_logs/2026-12-01-session8b), against
  the torch.compile timed in the same child: T=1 1.36 / 1.29 us, T=3 1.48 / 1.39, T=8 2.22 / 2.10,
  T=64 3.97 / 4.37, T=1000 33.29 / 34.25, T=16384 480.0 / 481.4 us (98% of the floor). 1-ulp
  differences: 0 at T <= 8, 22 of 3932160 at T=64, 6481 of 1006632960 at T=16384, the very counts
  of torch.compile's output. Against tiles.py in the previous run (f2b93ac: T=1 1.37, T=8 2.32) the
  fast sigmoid saved 0.01-0.1 us: the arithmetic is not what keeps it behind compile at T <= 8
  (flat.py takes up the index work).

Launch: as tiles.py: a 1-D grid over [BLOCK_T, BLOCK_F] tiles, F-tiles fastest, autotuned per
(F, T bucket), decode-size buckets timed as CUDA-graph replays.

Shape legend: T tokens, F dense d_ff.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "tiles",
    "idea": "tiles.py with the fast FP32 sigmoid (ex2.approx, div.full), the arithmetic torch.compile emits",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        # Several row and column tiles on the CPU shapes (masked edges in both), few programs to interpret.
        return [triton.Config({"BLOCK_T": 2, "BLOCK_F": 256}, num_warps=1)]
    # (BLOCK_T, BLOCK_F, warps) give a thread 1 to 16 elements. Few for the latency-bound T <= 64:
    # in tiles.py each element was a dependent chain (expf, then the IEEE division); there, at
    # T = 1 the one-warp 1 x 128 tiles (4 per thread) took 1.28 us of kernel time where
    # torch.compile's 2 per thread took 1.06 (seventh session, PyTorch profiler).
    shapes = ((1, 128, 4), (1, 256, 4), (1, 512, 4), (1, 128, 1), (1, 1024, 8), (1, 256, 1), (1, 512, 2),
              (1, 1024, 4), (1, 2048, 8), (1, 2048, 4), (1, 4096, 8), (2, 2048, 8), (4, 1024, 8))  # fmt: skip
    return [triton.Config({"BLOCK_T": bt, "BLOCK_F": bf}, num_warps=w) for bt, bf, w in shapes]


def _prune(configs, named_args, **kwargs):
    """Drop tiles much wider or taller than the problem: they only add masked lanes."""
    n_rows, n_cols = named_args["n_rows"], named_args["n_cols"]
    fit = [
        c
        for c in configs
        if c.kwargs["BLOCK_F"] <= max(512, triton.next_power_of_2(n_cols))
        and c.kwargs["BLOCK_T"] <= triton.next_power_of_2(n_rows)
    ]
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
    key=["n_cols", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _swiglu_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_gate_t,
    stride_gate_f,
    stride_up_t,
    stride_up_f,
    rows_bucket,  # read only by the autotuner's key
    BLOCK_T: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    pid = tl.program_id(0)
    n_col_tiles = tl.cdiv(n_cols, BLOCK_F)
    rows = (pid // n_col_tiles).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (pid % n_col_tiles) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]

    g = tl.load(gate_ptr + rows[:, None] * stride_gate_t + cols[None, :] * stride_gate_f, mask=mask, other=0.0)
    u = tl.load(up_ptr + rows[:, None] * stride_up_t + cols[None, :] * stride_up_f, mask=mask, other=0.0)
    g = g.to(tl.float32)
    # silu(g) = g * sigmoid(g), sigmoid = 1 / (1 + exp(-g)): ex2.approx and div.full on the GPU.
    silu = g * (1.0 / (1.0 + tl.exp(-g)))
    out = (silu * u.to(tl.float32)).to(tl.bfloat16)  # the one rounding point
    tl.store(out_ptr + rows[:, None] * n_cols + cols[None, :], out, mask=mask)


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

    def grid(meta):
        return (triton.cdiv(T, meta["BLOCK_T"]) * triton.cdiv(F, meta["BLOCK_F"]),)

    _tuning_rows[0] = _rows_bucket(T)
    _swiglu_kernel[grid](
        gate_2d,
        up_2d,
        out,
        T,
        F,
        *gate_2d.stride(),
        *up_2d.stride(),
        _rows_bucket(T),
        enable_fp_fusion=False,
    )
    return out
