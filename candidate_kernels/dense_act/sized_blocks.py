"""dense_act: SwiGLU silu(gate) * up over flat blocks sized from the element count, as Inductor sizes them.

Author: human (kernels team, issue 4), hand-written. Parent: flat.py (same arithmetic, same flat range).

Why this file exists: flat.py tied torch.compile at T = 1 and beat it at T = 8, but lost at T = 3
(1.68 / 1.36 us) and T = 16384 (489.7 / 466.1 us) (eighth session, commit 4dd1b96). Inductor's own
kernel for this op, read on the H200 (ninth session, `run_and_get_code` at every task shape), differs
from flat.py in three ways, and this file takes all three:
- its block comes from the element count N: B = max(256, min(next_pow2(N) / 128, 1024)), and it
  tries exactly two configs, (B, 4 warps) and (B / 2, max(4, B / 128) warps). flat.py's autotuner
  picked (1024, 8) at T = 3, timing warm-L2 graph replays of one input set; Inductor's pair for
  T = 3 is (512, 4) and (256, 4), over 120-240 programs;
- contiguous inputs are read at the element's own index, with no row/column arithmetic (flat.py
  recomputes row * stride + column for every element, even when the strides are F and 1);
- no eviction hints on the streaming loads (flat.py asked for evict_first).
The two configs are timed by Triton's do_bench (CUDA events, L2 flushed before each call), as
Inductor times its pair. What remains a choice is the pair, and both of its configs are sound: a
kernel that can only tie is the aim here, since the goal is "not slower than compile anywhere".

Numerics: exactly flat.py's (reference_model/ops.py swiglu):
  out = bf16((g * sigmoid(g)) * u),  g = f32(gate), u = f32(up)      one rounding point
  sigmoid(g) = 1 / (1 + exp(-g)) with ex2.approx.f32 and div.full.f32, the arithmetic torch.compile
  emits; products in torch's order; enable_fp_fusion=False. The interpreter computes tl.exp and
  `/` exactly (numpy): CPU parity checks the indexing, not the approximation.

Floor (bytes / 4275 GB/s, bytes = 3*T*F*2, F = 20480): T=1 123 KB -> 0.03 us, latency bound (the
launch); T=16384 2.01 GB -> 470.9 us.
Measured on the H200 (ninth session, commit 27eedfb, results/gpu_logs/2026-12-01-session9b), p50
  (p20-p80) against the torch.compile timed in the same child, and the autotuner's pick:
  T=1      1.218 (1.217-1.222) / 1.250 (1.247-1.252) us  faster   (256, 4)
  T=3      1.345 (1.329-1.357) / 1.336 (1.332-1.343) us  tie      (256, 4)
  T=8      2.026 (2.021-2.031) / 2.050 (2.045-2.055) us  faster   (512, 8)
  T=64     3.739 (3.726-3.766) / 3.746 (3.730-3.776) us  tie      (1024, 4)
  T=1000   33.31 (32.70-33.97) / 33.64 (32.62-34.06) us  tie      (1024, 4)
  T=16384  472.4 (467.8-476.4) / 472.7 (468.5-477.3) us  tie      (1024, 4), 100% of the copy floor
  Goal (not slower than compile anywhere): met, as ties within the p20-p80 bands where it is not
  faster. Not promoted: promotion needs a speedup beyond noise over every baseline on every shape.
  At T = 16384 both run at the copy floor, so that is out of reach for any kernel of this op.

Launch: grid = cdiv(T*F, BLOCK); the two configs of the element count autotuned per (F, size
bucket). Inputs whose rows are not contiguous (a strided view) take the general index path.

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
    "parent": "flat",
    "idea": "flat blocks sized from the element count (Inductor's pair), direct index when contiguous, no hints",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
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
    return [triton.Config({"BLOCK": block}, num_warps=warps) for block, warps in shapes]


def _prune(configs, named_args, **kwargs):
    """Keep the pair of the element count."""
    pair = set(_pair(named_args["n_elements"]))
    return [c for c in configs if (c.kwargs["BLOCK"], c.num_warps) in pair] or configs[:1]


def _size_bucket(n_elements: int) -> int:
    """Autotuning key for the element count: its power of two (the pair depends on nothing else)."""
    return triton.next_power_of_2(n_elements)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_COLS", "size_bucket"],
    prune_configs_by={"early_config_prune": _prune},
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

    def grid(meta):
        return (triton.cdiv(n_elements, meta["BLOCK"]),)

    _swiglu_kernel[grid](
        gate_2d,
        up_2d,
        out,
        n_elements,
        *gate_2d.stride(),
        *up_2d.stride(),
        _size_bucket(n_elements),
        N_COLS=F,
        WIDE=wide,
        CONTIGUOUS=gate_2d.stride() == up_2d.stride() == dense,
        enable_fp_fusion=False,
    )
    return out
