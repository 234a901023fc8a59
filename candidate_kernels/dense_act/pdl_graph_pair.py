"""dense_act: graph_pair launched as a programmatic dependent of the kernel before it (PDL), waiting for it first.

Author: human (kernels team, issue 4), hand-written. Parent: graph_pair.py, whose code this is
but for the launch.

What changes, and why: pdl_row_warps.py's (fuse_norm) and pdl_red_fixup.py's (router_gemm) change, made
here. Its kernel starts with griddepcontrol.wait: none of its programs reads or writes anything before the
kernel ahead of it in the stream has completed and its writes are visible, exactly as after an ordinary
launch. Every GPU config launches with launch_pdl, so the GPU may start dispatching its programs as the
previous kernel's programs exit, before that kernel's completion is processed: a fraction of a microsecond
per call, which counts where a call is mostly launch and latency. Nothing triggers the next kernel early
(no griddepcontrol.launch_dependents, a cheat the harness's benchmark child flags). Results, numerics and
configs are the parent's; the Triton interpreter (no griddepcontrol) runs the parent's code. Programmatic
dependent launch needs Hopper or later.

Measured on the H200 (twenty-fifth session, `harness run task=dense_act "candidates=[pdl_graph_pair,graph_pair]"`,
run 20261203T210603-b4ce43, bb309cc), p50 us against graph_pair beside it, in brackets the in-child torch.compile:
T=1 **0.97** / 1.20 (1.20), T=3 1.10 / 1.30 (1.29), T=8 1.83 / 2.02 (2.03), T=64 3.45 / 3.68 (4.21), T=1000
29.65 / 31.66 (31.64), T=16384 458.68 / 459.82 (459.83); outputs as the parent's (bit-exact at T <= 8).
Faster than the compile beyond noise at every shape (the p20-p80 bands apart): the goal "not slower than
compile anywhere" met with a margin, 120% of one launch moving the same bytes at T = 1. Promoted, the
task's first promotion; the GPU tests of the optimized model passed with it (9 of 9), and the whole model's
decode step took 1.913 ms with it (results/model_bench/2026-12-03T225931Z-8a4073.md).

graph_pair.py's header, unchanged (its figures are the parent's):

dense_act: sized_blocks with its pair of configs timed as CUDA-graph replays at decode sizes.

Author: human (kernels team, issue 4), hand-written. Parent: sized_blocks.py (same kernel, same pair).

Why this file exists: sized_blocks times its two configs (Inductor's pair for the element count)
with Triton's default, an event pair around each launch. At decode sizes the kernel takes 1-4 us
and the launch counts in that timing, so the pick can differ from what a graph replay (a decode
step, the harness's timer) would choose. Its two H200 runs at T = 64: 3.739 us against an
in-child compile of 3.746 (27eedfb), then 4.28 against 3.72 (7aef336, fourteenth session), while
that run's baselines child timed the compile at 4.29: Inductor's own pick of the same pair moved
between processes by the same 0.56 us. Here element counts up to 64 rows of 32768 (2^21) time
the pair as graph replays (Triton's do_bench_cudagraph); larger ones keep the default, where a
launch is small against the kernel. Nothing else changes: the kernel, the pair and the numerics
are sized_blocks'.
Measured on the H200 (fifteenth session, commit f947493, results/gpu_logs/2026-12-02-session15b),
  `harness run task=dense_act "candidates=[graph_pair,sized_blocks]" bench.max_seconds=3`, p50 us
  (p20-p80) against the torch.compile timed in the same child:
  T=1      1.20 (1.20-1.20) / 1.20 (1.20-1.20)        tie
  T=3      1.30 (1.30-1.30) / 1.29 (1.29-1.31)        tie
  T=8      2.02 (2.01-2.02) / 2.04                    faster
  T=64     3.68 (3.67-3.69) / 3.69                    tie (sized_blocks' child: its compile 4.20)
  T=1000   31.64 (31.61-31.67) / 31.66                tie
  T=16384  459.76 (459.49-460.00) / 459.94            tie, at the copy bandwidth
  One launch moving the same bytes took 1.17 / 1.26 / 1.91 / 3.62 us at T = 1 / 3 / 8 / 64 (95-98%).
  Goal (not slower than compile anywhere): met in this one run. sized_blocks ran 3.68 us at T=64
  too; the compile's own time there moved between 3.69 and 4.20 us from child to child. Not
  promoted: no speedup beyond noise on every shape.

Numerics: exactly sized_blocks' (reference_model/ops.py swiglu):
  out = bf16((g * sigmoid(g)) * u),  g = f32(gate), u = f32(up)      one rounding point
  sigmoid(g) = 1 / (1 + exp(-g)) with ex2.approx.f32 and div.full.f32, the arithmetic torch.compile
  emits; products in torch's order; enable_fp_fusion=False. The interpreter computes tl.exp and
  `/` exactly (numpy): CPU parity checks the indexing, not the approximation.

Floor (bytes / 4275 GB/s, bytes = 3*T*F*2, F = 20480): T=1 123 KB -> 0.03 us, latency bound (the
launch); T=64 7.9 MB -> 1.84 us; T=16384 2.01 GB -> 470.9 us.

Launch: grid = cdiv(T*F, BLOCK); the two configs of the element count autotuned per (F, size
bucket), graph-timed up to 2^21 elements. Inputs whose rows are not contiguous (a strided view)
take the general index path.

Shape legend: T tokens (rows), F dense d_ff, N = T*F elements.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "graph_pair",
    "idea": "graph_pair as a programmatic dependent (PDL): griddepcontrol.wait first, launch_pdl on GPU configs",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)
_INT32_LIMIT = 2**31


def _pair(n_elements: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two (BLOCK, warps) tried for n elements: Inductor's sizing rule for a 1-D pointwise kernel."""
    block = max(256, min(triton.next_power_of_2(n_elements) // 128, 1024))
    half = block // 2
    return (block, 4), (half, max(4, min(half // 64, 8)))


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK": 256}, num_warps=1)]
    shapes = sorted({c for n in (1 << k for k in range(8, 31)) for c in _pair(n)})
    return [triton.Config({"BLOCK": block, "launch_pdl": True}, num_warps=warps) for block, warps in shapes]


def _prune(configs, named_args, **kwargs):
    """Keep the pair of the element count."""
    pair = set(_pair(named_args["n_elements"]))
    return [c for c in configs if (c.kwargs["BLOCK"], c.num_warps) in pair] or configs[:1]


def _size_bucket(n_elements: int) -> int:
    """Autotuning key for the element count: its power of two (the pair depends on nothing else)."""
    return triton.next_power_of_2(n_elements)


GRAPH_TIMED_ELEMENTS = 1 << 21  # 64 rows of up to 32768: decode sizes
_tuning_bucket = [0]  # the size bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    """How the autotuner times a config: as a CUDA-graph replay at decode sizes, the way a decode
    step runs it and the harness times it; Triton's default (event pairs) above."""
    if _tuning_bucket[0] <= GRAPH_TIMED_ELEMENTS:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "size_bucket"],
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
    size_bucket,  # read only by the autotuner's key
    N_COLS: tl.constexpr,
    WIDE: tl.constexpr,  # some offset reaches 2^31: 64-bit index math
    CONTIGUOUS: tl.constexpr,  # gate and up both have strides (F, 1): an element's offset is its index
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # BLOCK divides n_elements: no mask
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    i_N = pid * BLOCK + tl.arange(0, BLOCK)
    if CONTIGUOUS:
        gate_offs = i_N
        up_offs = i_N
    else:
        row_N = i_N // N_COLS  # a compile-time divisor: multiply-shift
        col_N = i_N - row_N * N_COLS
        gate_offs = row_N * stride_gate_t + col_N * stride_gate_f
        up_offs = row_N * stride_up_t + col_N * stride_up_f
    if EVEN:
        g = tl.load(gate_ptr + gate_offs)
        u = tl.load(up_ptr + up_offs)
    else:
        mask = i_N < n_elements
        g = tl.load(gate_ptr + gate_offs, mask=mask, other=0.0)
        u = tl.load(up_ptr + up_offs, mask=mask, other=0.0)
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
    n_elements = gate_2d.shape[0] * F
    wide = max(n_elements, _max_offset(gate_2d) + 1, _max_offset(up_2d) + 1) >= _INT32_LIMIT
    dense = (F, 1)

    size_bucket = _size_bucket(n_elements)
    _tuning_bucket[0] = size_bucket

    def grid(meta):
        return (triton.cdiv(n_elements, meta["BLOCK"]),)

    _swiglu_kernel[grid](
        gate_2d,
        up_2d,
        out,
        n_elements,
        *gate_2d.stride(),
        *up_2d.stride(),
        size_bucket,
        N_COLS=F,
        WIDE=wide,
        CONTIGUOUS=gate_2d.stride() == up_2d.stride() == dense,
        enable_fp_fusion=False,
    )
    return out
