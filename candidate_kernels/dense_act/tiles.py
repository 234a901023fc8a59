"""dense_act: SwiGLU activation silu(gate) * up in one pass over [T, F] tiles.

Author: human (kernels team, issue 4), hand-written.

Why it is faster: the reference runs six kernels (two upcasts, the sigmoid, two multiplies, the
downcast), each a round trip of [T, F] through HBM, four of them in FP32. Here each program reads
a [BLOCK_T, BLOCK_F] tile of gate and up once in 16-byte vectors and writes the BF16 product
once: 6 bytes per element, the least the op can move. Row strides are arguments, so gate and up
may be the two halves of one packed [T, 2F] GEMM output without a copy.

Floor (bytes / 4275 GB/s, bytes = 3*T*F*2, F = 20480):
  T=1      123 KB -> 0.03 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  2.01 GB -> 470.9 us at the copy ceiling; torch.compile measured 462 us (a 2:1
           read:write mix streams a little faster than a copy), the goal is not slower than it.
Measured on the H200 (first session, commit 000ef05; results/README.md): p50 T=1 2.36 us, T=8 2.84, T=64 4.55,
  T=1000 75.2, T=16384 538.8 us (98% of the copy floor); torch.compile 1.61 / 2.47 / 4.73 / 161.0 /
  602.3 us. Goal met from T=64 up; missed at T <= 8 (2.36 against 1.61 us at T=1).
Config sweep (third session, plain process): T=1 1.88 us at best (1 x 512, 2 warps and 1 x 1024,
  4 warps), T=8 2.83, T=16384 520 us (1 x 2048, 4 warps). The one-warp tiles added after it
  (1 x 128, 1 x 256) are not measured yet.
Fifth session (commit d73d845, decode-size configs autotuned as graph replays), against the
  torch.compile timed in the same child: T=1 1.83 / 1.59 us, T=3 2.23 / 2.04, T=8 2.92 / 2.56,
  T=64 4.56 / 4.30 (slower), T=1000 43.98 / 53.82 (faster), T=16384 483.1 / 487.8 us (a tie; 98% of
  the copy floor). Goal still missed at T <= 64, by 0.24 us at T=1: the kernel is one load round
  trip and one store, like Inductor's; what costs the rest is not measured (Nsight Compute not run).
Seventh session (commit 9a3c8c6, PyTorch profiler inside graph replays): at T=1 the kernel takes
  1.28 us against compile's 1.06 (160 programs x 32 threads, 4 elements each, against 80 x 128
  with 2 each); each element is a dependent expf + IEEE-division chain. Tiles of 1-4 elements per
  thread were added (commit ed3e762); their run reached its step limit before the benchmark
  finished.
Eighth session (commit f2b93ac, results/gpu_logs/2026-12-01-session8), those tiles against the
  torch.compile timed in the same child: T=1 1.37 / 1.23 us, T=3 1.52 / 1.35, T=8 2.32 / 2.13,
  T=64 4.20 / 4.67 (faster), T=1000 34.95 / 33.91, T=16384 467.28 / 467.93 us (a tie, 101% of the
  copy floor). Goal still missed at T <= 8 and T = 1000; see approx_sigmoid.py and flat.py.

Numerics (reference_model/ops.py swiglu):
  out = bf16((g * sigmoid(g)) * u),  g = f32(gate), u = f32(up)      one rounding point
- sigmoid as torch's CUDA kernel computes it: 1 / (1 + expf(-g)) with the accurate expf and an
  IEEE division: libdevice's __nv_expf and tl.math.div_rn on the GPU (Triton's `/` is the
  approximate div.full.f32). The interpreter has no libdevice: tl.exp there, chosen at import.
- Products in torch's order, (g * s) * u, each rounded to FP32; no multiply feeds an add, and the
  kernel is launched with enable_fp_fusion=False like its siblings.

Launch: a 1-D grid over [BLOCK_T, BLOCK_F] tiles, F-tiles fastest so that neighbouring programs
stream neighbouring memory. Autotuned per (F, T bucket): at T = 1 narrow tiles over 4 warps (1 x
128 .. 1 x 512: 160-40 programs, 1-4 elements per thread) keep each thread's dependent chain
short; at T = 16384 larger tiles (up to 32 KB of input per program) keep more bytes in flight per
SM and amortize the index math.

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
    "parent": None,
    "idea": "2-D tiles of gate/up in 16-byte vectors, sigmoid as 1/(1+expf(-g)) with IEEE division, strided rows",
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
        # Several row and column tiles on the CPU shapes (masked edges in both), few programs to interpret.
        return [triton.Config({"BLOCK_T": 2, "BLOCK_F": 256}, num_warps=1)]
    # (BLOCK_T, BLOCK_F, warps) give a thread 1 to 16 elements. Few for the latency-bound T <= 64:
    # each element is a dependent chain (expf, then the IEEE division and its slow-path branch); at
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
    # silu(g) = g * sigmoid(g), sigmoid = 1 / (1 + expf(-g)) as torch computes it (div_rn: IEEE).
    silu = g * tl.math.div_rn(1.0, 1.0 + _expf(-g))
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
