"""output_gate: sized_blocks launched as a programmatic dependent of the kernel before it (PDL), waiting for it first.

Author: human (kernels team, issue 4), hand-written. Parent: sized_blocks.py, whose code this is
but for the launch.

What changes, and why. The parent's kernel starts with griddepcontrol.wait: none of its programs reads or
writes anything before the kernel ahead of it in the stream has completed and its writes are visible,
exactly as after an ordinary launch. Every GPU config launches with launch_pdl (CUDA's programmatic
stream serialization), so the GPU may start dispatching this kernel's programs as the previous kernel's
programs exit, before that kernel's completion is processed; at decode sizes, where a call is mostly
launch and latency, that is a fraction of a microsecond per call. Nothing here triggers the next kernel
early (no griddepcontrol.launch_dependents): what the previous kernel gives this one, any previous
kernel gives it, so the harness's back-to-back calls time what a decode step gets. Results, numerics
and configs are the parent's; the Triton interpreter (no griddepcontrol) runs the parent's code.
Programmatic dependent launch needs Hopper or later.

Measured on the H200 (twenty-fourth session, results/gpu_logs/2026-12-03-session24/pdl_sweep.py: the harness's
timer, CUDA-graph windows over 64 rotated input sets, interleaved; each variant autotuned itself in the one
process), p50 us, the parent as committed -> with this launch; in brackets the same plus
griddepcontrol.launch_dependents after the wait, not used: back to back it lets each call start the next
one early, which a decode step gets only where the kernel before this one triggers too:
  T=1  1.19 -> 0.97 (0.74);  T=8  1.34 -> 1.07 (0.82)
  one launch moving the same bytes, timed beside them: 1.17 / 1.26
Bit-exact with the reference op at both shapes, every variant.
In the harness (`harness run task=output_gate "candidates=[pdl_sized_blocks,sized_blocks]"`, run
20261203T192538-9b04eb, 97de06c), p50 us, this / sized_blocks / torch.compile in this file's own child:
T=1 0.97 / 1.19 / 1.17, T=3 1.01 / 1.24 / 1.23, T=8 1.08 / 1.32 / 1.33, T=64 2.21 / 2.48 / 2.48,
T=1000 9.34 / 11.06 / 11.00, T=16384 **138.48** / 140.12 / 140.07; bit-exact at T <= 64, at most one ulp
elsewhere, as the compile. It beats every baseline beyond noise at every shape: promoted, the task's
first promotion (the optimized model's output gate had been Inductor's kernel); the GPU tests of the
optimized model passed with it (9 of 9).
Goals: not slower than the compile anywhere, met (1.1% less time at T = 16384, 11-19% at T <= 1000);
T = 16384 <= 143 us met. At T <= 8 it takes 83-87% of the time of one plain launch moving the same
bytes, timed beside it (the records' copy floor, 115-120%).

sized_blocks.py's header, unchanged (its figures are the parent's):

output_gate: o * sigmoid(g + b[h]) over flat blocks sized from the element count, as Inductor sizes them.

Author: human (kernels team, issue 4), hand-written. Parent: flat.py (same arithmetic, same flat range).

Why this file exists: flat.py tied torch.compile at T = 1 and beat it at T = 3 and 64, but lost at
T = 8 (1.55 / 1.33 us) and T = 16384 (152.98 / 145.38 us) (eighth session, commit 4dd1b96).
Inductor's own kernel for this op, read on the H200 (ninth session, `run_and_get_code` at every
task shape), differs from flat.py in three ways, and this file takes all three:
- its block comes from the element count N: B = max(256, min(next_pow2(N) / 128, 1024)), and it
  tries exactly two configs, (B, 4 warps) and (B / 2, max(4, B / 128) warps). flat.py's autotuner
  picked (1024, 8) at T = 8, timing warm-L2 graph replays of one input set; Inductor's pair for
  T = 8 is (512, 4) and (256, 4);
- when o and g are contiguous, an element is read at its own index, with no token/head arithmetic
  (flat.py recomputes token * stride + offset-in-token for every element);
- no eviction hints on the streaming loads (flat.py asked for evict_first; the 96-byte bias keeps
  evict_last, as in Inductor's kernel).
The two configs are timed by Triton's do_bench (CUDA events, L2 flushed before each call), as
Inductor times its pair, except at decode sizes up to T = 5 (below). A kernel that can only tie is
the aim here: the goal is "not slower than compile anywhere" (and <= 143 us at T = 16384, where
compile took 142.5-145.4 us).

Numerics: exactly flat.py's (reference_model/ops.py output_gate, BEAM.md §3.6):
  out = bf16(f32(o) * sigmoid(f32(g) + f32(b[h])))     one rounding point
  sigmoid(z) = 1 / (1 + exp(-z)) with ex2.approx.f32 and div.full.f32, the arithmetic torch.compile
  emits; enable_fp_fusion=False. The interpreter computes tl.exp and `/` exactly (numpy): CPU parity
  checks the indexing, not the approximation.

Floor (bytes / 4275 GB/s, bytes = 3*T*H*Dh*2 + H*bias bytes, H*Dh = 6144): T=1 37 KB -> 0.01 us,
latency bound (the launch); T=16384 604 MB -> 141.3 us (goal <= 143 us).
Measured on the H200 (ninth session), p50 (p20-p80) against the torch.compile timed in the same
  child, and the autotuner's pick; two runs on two loans of the machine:
           commit 27eedfb, do_bench tuning everywhere         commit 29b3d52 (this kernel)
  T=1      1.214 / 1.185 us  slower 2.4%  (128, 4)           1.284 / 1.285 us  tie          (256, 4)
  T=3      1.316 / 1.250 us  slower 5%    (128, 4)           1.339 / 1.339 us  tie          (256, 4)
  T=8      1.333 / 1.337 us  tie          (256, 4)           1.426 / 1.464 us  faster 2.7%  (256, 4)
  T=64     2.461 / 2.519 us  faster 2.4%  (1024, 4)          2.691 / 2.666 us  slower 0.9%  (512, 8)
  T=1000   11.50 / 11.49 us  tie          (1024, 4)          13.84 / 12.86 us  slower 7%    (1024, 4)
  T=16384  142.17 / 142.19 us tie, 100% of the copy floor    148.90 / 148.10 us tie         (1024, 4)
  (results/gpu_logs/2026-12-01-session9b and -session9c). Goal (not slower than compile anywhere,
  <= 143 us at T = 16384): missed. Each run has a shape behind compile beyond its p20-p80 band, and
  not the same one: T = 1000 tied in the first run and lost 7% in the second with the same config.
  The second run's benchmark child ran both implementations slower than its baselines child did
  (compile 148.10 against 141.76 us at T = 16384, 12.86 against 11.55 at T = 1000). Ties with
  Inductor's own kernel are what this design can reach; the verdict of a shape then turns on run
  to run variation.

Launch: grid = cdiv(T*H*Dh, BLOCK); the two configs of the element count autotuned per (H, Dh, size
bucket). Inputs whose heads are not contiguous within a token take the general index path; the
model's g (a slice of the packed projection's rows) takes the per-token path.

Shape legend: T tokens, H query heads, Dh head dim, N = T*H*Dh elements.
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
    "parent": "sized_blocks",
    "idea": "sized_blocks launched as a programmatic dependent of the previous kernel, waiting for it before any load",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter runs one config only (no
# autotuning), so that choice is made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)
_INT32_LIMIT = 2**31
_DENSE, _INNER, _GENERAL = 0, 1, 2  # o and g layouts: contiguous; each token's [H, Dh] contiguous; any


def _pair(n_elements: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two (BLOCK, warps) tried for n elements: Inductor's sizing rule for a 1-D pointwise kernel."""
    block = max(256, min(triton.next_power_of_2(n_elements) // 128, 1024))
    half = block // 2
    return (block, 4), (half, max(4, min(half // 64, 8)))


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK": 256}, num_warps=1)]  # CPU shapes: 1 x 4 x 16 = 64 elements up
    shapes = sorted({c for n in (1 << k for k in range(8, 31)) for c in _pair(n)})
    return [triton.Config({"BLOCK": block, "launch_pdl": True}, num_warps=warps) for block, warps in shapes]


def _prune(configs, named_args, **kwargs):
    """Keep the pair of the element count."""
    pair = set(_pair(named_args["n_elements"]))
    return [c for c in configs if (c.kwargs["BLOCK"], c.num_warps) in pair] or configs[:1]


def _size_bucket(n_elements: int) -> int:
    """Autotuning key for the element count: its power of two (the pair depends on nothing else)."""
    return triton.next_power_of_2(n_elements)


# How the autotuner times the pair. Up to 32768 elements (T <= 5): as CUDA-graph replays, the way a
# decode step runs the kernel and the harness times it. There do_bench's event pair around each
# launch ranked (128, 4) over (256, 4) at T = 1 and 3, and (128, 4) then ran 2-5% behind compile in
# the harness (ninth session, the first version of this file); flat.py's graph-timed tuning had
# taken (256, 4) at both and tied or beat compile. Larger: do_bench, as Inductor times its pair.
_GRAPH_TIMED_BUCKET = 32768
_tuning_bucket = [0]  # the size bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_bucket[0] <= _GRAPH_TIMED_BUCKET:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_HEADS", "HEAD_DIM", "size_bucket"],
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
    size_bucket,  # read only by the autotuner's key
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    WIDE: tl.constexpr,  # some offset reaches 2^31: 64-bit index math
    LAYOUT: tl.constexpr,  # _DENSE, _INNER or _GENERAL (above)
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # BLOCK divides n_elements: no mask
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    i_N = pid * BLOCK + tl.arange(0, BLOCK)
    head_N = (i_N // HEAD_DIM) % N_HEADS  # compile-time divisors: multiply-shift
    if LAYOUT == 0:
        o_offs = i_N
        g_offs = i_N
    elif LAYOUT == 1:
        token_N = i_N // (N_HEADS * HEAD_DIM)
        within_N = i_N - token_N * (N_HEADS * HEAD_DIM)
        o_offs = token_N * stride_o_t + within_N
        g_offs = token_N * stride_g_t + within_N
    else:
        token_N = i_N // (N_HEADS * HEAD_DIM)
        d_N = i_N % HEAD_DIM
        o_offs = token_N * stride_o_t + head_N * stride_o_h + d_N * stride_o_d
        g_offs = token_N * stride_g_t + head_N * stride_g_h + d_N * stride_g_d
    if EVEN:
        o = tl.load(o_ptr + o_offs)
        g = tl.load(g_ptr + g_offs)
        b = tl.load(bias_ptr + head_N, eviction_policy="evict_last")
    else:
        mask = i_N < n_elements
        o = tl.load(o_ptr + o_offs, mask=mask, other=0.0)
        g = tl.load(g_ptr + g_offs, mask=mask, other=0.0)
        b = tl.load(bias_ptr + head_N, mask=mask, other=0.0, eviction_policy="evict_last")
    # sigmoid(z) = 1 / (1 + exp(-z)): ex2.approx and div.full on the GPU.
    z = g.to(tl.float32) + b.to(tl.float32)
    out = (o.to(tl.float32) * (1.0 / (1.0 + tl.exp(-z)))).to(tl.bfloat16)  # the one rounding point
    if EVEN:
        tl.store(out_ptr + i_N, out)
    else:
        tl.store(out_ptr + i_N, out, mask=mask)


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset a tensor's strides reach (0 for an empty one)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def _layout(o_THD: torch.Tensor, g_THD: torch.Tensor) -> int:
    T, H, Dh = o_THD.shape
    inner = o_THD.stride()[1:] == g_THD.stride()[1:] == (Dh, 1)
    if inner and (T == 1 or o_THD.stride(0) == g_THD.stride(0) == H * Dh):
        return _DENSE
    return _INNER if inner else _GENERAL


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

    _tuning_bucket[0] = _size_bucket(n_elements)
    _output_gate_kernel[grid](
        o_THD,
        g_THD,
        bias_H.contiguous(),
        out_THD,
        n_elements,
        *o_THD.stride(),
        *g_THD.stride(),
        _size_bucket(n_elements),
        N_HEADS=H,
        HEAD_DIM=Dh,
        WIDE=wide,
        LAYOUT=_layout(o_THD, g_THD),
        enable_fp_fusion=False,
    )
    return out_THD
