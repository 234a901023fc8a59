"""router_gemm: red_fixup whose output is zeroed by a fill launch the GEMM overlaps (programmatic dependent launch).

Author: human (kernels team, issue 4), hand-written. Parent: red_fixup.py (promoted before it), whose FMA and BF16x3
paths, configs and autotuning it keeps unchanged; only how the split-K partials meet differs.

What changes, and why. red_fixup's splits add their partials into the output with red.global.add.f32; the output
is fresh memory, so the first split to arrive at a tile stores instead and the others wait to see it: one atomic
round trip on a tile word per program, after its K loop. At T = 64 the adds alone (into an unzeroed output,
wrong on purpose) took 5.37-5.47 us against red_fixup's 6.13-6.20 (twenty-third session), and a plain zero-fill
launch before the kernel cost more than the words (6.53 us: a launch the GPU runs first, then the kernel's).
Here a split config's call launches that fill, whose programs signal at once that their dependents may start
(griddepcontrol.launch_dependents), and then the GEMM with launch_pdl (CUDA's programmatic stream
serialization): the GEMM's programs load and multiply while the fill is still launching or running, and each
waits for it (griddepcontrol.wait: the fill complete, its stores visible) only before its first add. Every
split then adds; nobody stores first, nobody polls, no state outlives a call, and calls on several streams
no longer share anything (red_fixup's tile words did). Unsplit configs store as before, with no fill and a
plain launch. Safe inputs: the fill itself is an ordinary launch, so everything before it in the stream had
completed when it started, and x was final when the GEMM (started after it) loaded it.

Floor (bytes / 4275 GB/s, bytes = T*D*2 + E*D*4 + T*E*4, D = 5120, E = 256):
  T=1   5.25 MB -> 1.23 us (goal <= 3.0 us); one read of W alone: 3.12 us at best of 30 layouts
  T=8   5.33 MB -> 1.25 us (goal <= 3.5 us)
  T=64  6.03 MB -> 1.41 us (goal <= 6.0 us)
One launch moving the same bytes (the harness's copy floor) replayed in 3.03-3.09 us at T <= 8 and
3.22-3.28 at T = 64 (fifteenth and sixteenth sessions). The fill adds T*E*4 bytes of stores (64 KB at T = 64).

Numerics: vector_width's within each split (reference_model/ops.py router_logits, BEAM.md §4.1: FMA
rows or BF16x3 MMAs on an exact truncating split of W, blocks added compensated). The SPLIT_K
partials are then added in FP32 onto zero in arrival order, one rounding each, not compensated in K
order: the result is not bitwise deterministic across runs of a split config (unsplit configs are).
red_fixup's error against FP64 at T = 64 was 1.16e-07 normwise (vector_width 9.2e-08, cuBLAS FP32
2.24e-07; the task allows 1e-6 and 1.05x the reference's own). red.global.add.f32 flushes subnormal
sums to zero (logits are O(1)).

Launch: grid (cdiv(E, BLOCK_E), SPLIT_K, cdiv(T, BLOCK_T)); configs autotuned per T bucket (prune
below), every bucket timed as CUDA-graph replays (a split config with its fill), the winner in
`_router_kernel.best_config`. The first call per T bucket benchmarks every config (it synchronizes)
and runs its pick once into scratch, so that the launcher knows whether its call needs the fill: call
once before capturing a CUDA graph; replays never tune. Programmatic dependent launch needs Hopper or
later (griddepcontrol); the Triton interpreter runs the fill, then the GEMM.

Shape legend: T tokens, D hidden, E experts, K the reduction (= D).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "red_fixup",
    "idea": "red_fixup with the output zeroed by a fill launch the split GEMM overlaps (programmatic dependent launch)",
}

# TRITON_INTERPRET is read when kernels are decorated. The interpreter runs one config, no
# autotuning: there the config is a function of T (below), so that the task's CPU shapes exercise
# both paths and the split-K fixup.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

FMA_MAX_T = 16  # the FMA path's register tile [BLOCK_T, BLOCK_K] grows with T (at most 64 per thread)
MMA_MIN_T = 2  # one token: the FMA row is a plain read of W, nothing for the tensor cores to save
MMA_MIN_BLOCK_T, MMA_MAX_BLOCK_T = 8, 64  # the token side is the MMA's N: a multiple of 8
GRAPH_TIMED_T = 1024  # buckets timed as CUDA-graph replays while tuning: all of them (see header)
# Programmatic dependent launch (griddepcontrol, Hopper's grid dependency control): the GPU's, not the
# interpreter's. Without it the split GEMM simply runs after the fill.
PDL = tl.constexpr(not _INTERPRET)
FILL_BLOCK = 2048  # elements of the output one fill program zeroes


def _t_bucket(T: int) -> int:
    """Autotuning key for the token count: the next power of two, capped at 1024."""
    return min(triton.next_power_of_2(T), 1024)


def _block_t(use_mma: bool, t_bucket: int) -> int:
    return min(max(t_bucket, MMA_MIN_BLOCK_T), MMA_MAX_BLOCK_T) if use_mma else t_bucket


def _gpu_configs() -> list[triton.Config]:
    # FMA: (BLOCK_E, BLOCK_K, SPLIT_K, warps), one expert row per program (row_vector's configs).
    fma = [
        (1, 1024, 1, 4),
        (1, 1024, 1, 8),
        (1, 512, 2, 4),
        (1, 256, 4, 2),
        (1, 256, 4, 4),
        # New here: 256 one-row programs with other K blocks and warps (the 4-warp 1024-wide block won
        # at T = 8 in row_groups' sweep), and 512 of them
        (1, 512, 1, 4),
        (1, 2048, 1, 8),
        (1, 1024, 2, 4),
    ]
    # BF16x3: (BLOCK_E, BLOCK_K, SPLIT_K, warps, stages). BLOCK_E = 64 fills one warpgroup MMA's M;
    # 16 and 32 give more, smaller tiles (and fixups) for the same 128-160 programs at T <= 64.
    mma = [
        (64, 64, 32, 4, 3),  # 4 x 32 = 128 programs, 2-3 K blocks each
        (64, 32, 32, 4, 3),  # 5 K blocks each
        (64, 64, 16, 4, 3),  # 64 programs, 5 K blocks
        (32, 64, 16, 4, 3),  # 8 x 16 = 128
        (32, 32, 16, 4, 3),
        (16, 64, 8, 4, 3),  # 16 x 8 = 128, 10 K blocks
        (16, 64, 16, 4, 3),  # 256
        (64, 64, 2, 4, 4),  # T = 1000: 4 x 2 x 16 token tiles = 128 programs
        (32, 64, 2, 4, 4),  # 256
        (32, 64, 1, 4, 4),  # 128, no fixup
        (16, 64, 1, 4, 4),  # 256, no fixup
    ]
    configs = [_config(False, e, k, s, w, 1) for e, k, s, w in fma]
    configs += [_config(True, e, k, s, w, st) for e, k, s, w, st in mma]
    # New here: 16-row tiles on 1-2 warps (more programs per SM, no cross-warp MMA sync), and with
    # 32-way splits or other K blocks and pipeline depths. (BLOCK_E, BLOCK_K, SPLIT_K, warps, stages)
    narrow = [
        (16, 64, 16, 2, 3),
        (16, 64, 16, 1, 3),
        (16, 64, 32, 2, 3),
        (16, 32, 32, 4, 3),
        (16, 32, 32, 2, 3),
        (16, 128, 8, 4, 3),
        (16, 128, 8, 2, 3),
        (16, 64, 16, 4, 2),
        (16, 64, 16, 4, 4),
    ]
    configs += [_config(True, e, k, s, w, st) for e, k, s, w, st in narrow]
    return configs


def _config(use_mma: bool, block_e: int, block_k: int, split_k: int, warps: int, stages: int) -> triton.Config:
    """A split config launches as the fill's programmatic dependent (launch_pdl, a launch option)."""
    kwargs = {"USE_MMA": use_mma, "BLOCK_E": block_e, "BLOCK_K": block_k, "SPLIT_K": split_k}
    if split_k > 1:
        kwargs["launch_pdl"] = True
    return triton.Config(kwargs, num_warps=warps, num_stages=stages)


def _interpreter_config(T: int, D: int) -> dict:
    """CPU: FMA below 8 tokens (one expert row per program: the task's T = 1 shape runs the 1-D path,
    T = 5 the 2-D one), BF16x3 from 8, all with a 2-way split so that the fixup runs too; wide blocks
    at full width, where the interpreter's cost is per program and per loop step."""
    block_k = 32 if D <= 256 else 512
    if T < MMA_MIN_BLOCK_T:
        return {"USE_MMA": False, "BLOCK_E": 1, "BLOCK_K": block_k, "SPLIT_K": 2}
    return {"USE_MMA": True, "BLOCK_E": 16 if D <= 256 else 64, "BLOCK_K": block_k, "SPLIT_K": 2}


def _prune(configs, named_args, **kwargs):
    """FMA configs for small T only, with a register tile of at most 64 FP32 per thread; BF16x3
    from 2 tokens; at least 64 programs (the weight read needs the SMs), split-K only up to 1024."""
    t_bucket, E, D = named_args["t_bucket"], named_args["E"], kwargs["D"]
    kept = []
    for c in configs:
        use_mma, block_e, block_k, split_k = (c.kwargs[k] for k in ("USE_MMA", "BLOCK_E", "BLOCK_K", "SPLIT_K"))
        block_t = _block_t(use_mma, t_bucket)
        if block_e > triton.next_power_of_2(E) or split_k > triton.cdiv(D, block_k):
            continue
        if not use_mma and (t_bucket > FMA_MAX_T or block_t * block_k // (32 * c.num_warps) > 64):
            continue
        if use_mma and t_bucket < MMA_MIN_T:
            continue
        programs = triton.cdiv(E, block_e) * split_k * triton.cdiv(t_bucket, block_t)
        if (split_k > 1 and programs > 1024) or programs < 64:  # < 64: half the SMs idle
            continue
        kept.append(c)
    return kept or [min(configs, key=lambda c: c.kwargs["SPLIT_K"])]


_tuning_t_bucket = [0]  # the T bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    """How the autotuner times a config: as a CUDA-graph replay at every T bucket (GRAPH_TIMED_T), the
    way a decode step runs it; Triton's default (each call after an L2 flush by writing) above."""
    if _tuning_t_bucket[0] <= GRAPH_TIMED_T:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


@triton.jit
def _bf16_head(x):
    """(head, x - head): head = x's upper 16 bits as a BF16 (x truncated toward zero to 8 significant
    bits), and the FP32 remainder, exact (at most 16 significant bits, the same exponent range).
    Integer shifts and one FP32 subtraction: no rounding conversion."""
    bits = x.to(tl.uint32, bitcast=True)
    head = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return head, x - ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _kahan_add(total, comp, x):
    """Compensated FP32 sum: total + x with the rounding error carried in comp (no FMA to contract:
    the error term is exact). Keeps the sum over blocks and splits near one rounding."""
    y = x - comp
    t = total + y
    return t, (t - total) - y


def _router_kernel_fn(
    x_ptr,
    w_ptr,
    out_ptr,
    T,
    E,
    stride_xt,
    stride_xd,
    stride_we,
    stride_wd,
    t_bucket,  # read by the autotuner's key and the BLOCK_T heuristic
    D: tl.constexpr,
    USE_MMA: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_e = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_t = tl.program_id(2)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    t_ok = offs_t < T
    e_ok = offs_e < E
    # This split's K blocks: SPLIT_K near-equal runs of whole BLOCK_K blocks.
    K_BLOCKS: tl.constexpr = (D + BLOCK_K - 1) // BLOCK_K
    KB_PER_SPLIT: tl.constexpr = (K_BLOCKS + SPLIT_K - 1) // SPLIT_K
    kb_lo = pid_s * K_BLOCKS // SPLIT_K
    kb_hi = (pid_s + 1) * K_BLOCKS // SPLIT_K
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt
    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * stride_we

    if USE_MMA:
        # logits^T tile [BLOCK_E, BLOCK_T] = W [BLOCK_E, K] @ x^T [K, BLOCK_T]: the split weight is
        # the A operand (registers), x^T the B operand (shared memory).
        acc_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)
        comp_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)  # Kahan compensation of acc_ET
        for kb in range(kb_lo, kb_hi):
            offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = offs_k < D
            w_EK = tl.load(w_rows + offs_k[None, :] * stride_wd, mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            x_TK = tl.load(x_rows + offs_k[None, :] * stride_xd, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            # Exact three-way split of the FP32 weights by truncation (see header); x is BF16 already.
            hi_EK, rest_EK = _bf16_head(w_EK)
            mid_EK, lo_f32_EK = _bf16_head(rest_EK)
            lo_EK, _ = _bf16_head(lo_f32_EK)  # exact: lo_f32 has at most 8 significant bits
            block_ET = tl.dot(lo_EK, x_TK.T)
            block_ET = tl.dot(mid_EK, x_TK.T, block_ET)
            block_ET = tl.dot(hi_EK, x_TK.T, block_ET)
            # The tensor cores accumulate one block only; blocks are added in IEEE FP32, compensated.
            acc_ET, comp_ET = _kahan_add(acc_ET, comp_ET, block_ET)
    else:
        # FMA, one expert row per program, in the layout of a [BLOCK_K] vector (or [BLOCK_T, BLOCK_K]
        # tile); unrolled, so all loads issue up front.
        tl.static_assert(BLOCK_E == 1, "the FMA path computes one expert row per program")
        w_row = w_ptr + pid_e.to(tl.int64) * stride_we
        row_ok = pid_e < E
        if BLOCK_T == 1:
            x_row = x_ptr + pid_t.to(tl.int64) * stride_xt
            row_ok = row_ok & (pid_t < T)
            acc_K = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for i in tl.static_range(KB_PER_SPLIT):
                offs_k = (kb_lo + i) * BLOCK_K + tl.arange(0, BLOCK_K)
                k_ok = (offs_k < D) & (kb_lo + i < kb_hi) & row_ok
                x_K = tl.load(x_row + offs_k * stride_xd, mask=k_ok, other=0.0)
                w_K = tl.load(w_row + offs_k * stride_wd, mask=k_ok, other=0.0)
                acc_K += x_K.to(tl.float32) * w_K
            acc_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32) + tl.sum(acc_K, axis=0)
        else:
            acc_TK = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
            for i in tl.static_range(KB_PER_SPLIT):
                offs_k = (kb_lo + i) * BLOCK_K + tl.arange(0, BLOCK_K)
                k_ok = (offs_k < D) & (kb_lo + i < kb_hi)
                # x in 4-element (8-byte) vectors, the width of W's 16-byte ones, so that both load
                # into one register layout: W's row needs no trip through shared memory.
                offs_kx = tl.max_contiguous(offs_k, 4)
                x_TK = tl.load(x_rows + offs_kx[None, :] * stride_xd, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
                w_K = tl.load(w_row + offs_k * stride_wd, mask=k_ok & row_ok, other=0.0)
                acc_TK += x_TK.to(tl.float32) * w_K[None, :]
            acc_ET = tl.sum(acc_TK, axis=1)[None, :]

    out_ptrs = out_ptr + offs_t.to(tl.int64)[None, :] * E + offs_e[:, None]
    out_mask = e_ok[:, None] & t_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc_ET, mask=out_mask)
    else:
        # Split-K by FP32 reductions (red.global.add.f32) into the output, which _zero_fill zeroed in the
        # launch before this one. Launched as its programmatic dependent, this grid ran its K loop while
        # the fill was still starting or running: wait for the fill to complete (and its stores to be
        # visible) only now, before the first add. Everything before the fill in the stream had
        # completed when the fill started, so x was final when this grid loaded it.
        if PDL:
            gdc_wait()
        tl.atomic_add(out_ptrs, acc_ET, mask=out_mask, sem="relaxed", scope="gpu")


@triton.jit
def _zero_fill_kernel(out_ptr, n, BLOCK: tl.constexpr):
    """out[:n] = 0. Lets the split GEMM launched after it (programmatic dependent launch) start at once."""
    if PDL:
        gdc_launch_dependents()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=offs < n)


# BLOCK_T follows from the path and T (not tuned). On the GPU the rest is autotuned; cache_results
# stores the winner in Triton's cache, so later processes on this machine (the harness's parity and
# benchmark children, a model run) use the config that was checked, untuned.
_router_jit = triton.heuristics({"BLOCK_T": lambda args: _block_t(args["USE_MMA"], args["t_bucket"])})(
    triton.jit(_router_kernel_fn)
)


def _zero_fill(out: torch.Tensor) -> None:
    n = out.numel()
    _zero_fill_kernel[(triton.cdiv(n, FILL_BLOCK),)](out, n, BLOCK=FILL_BLOCK)


def _fill_before_split_configs(nargs: dict, reset_only: bool = False) -> None:
    """The autotuner's pre-hook, run before each launch it times: a split config is timed with the fill
    it needs. (Outside tuning the launcher launches the fill: a pre-hook of the config itself would keep
    the autotuner from caching its pick on disk.)"""
    if not reset_only and nargs["SPLIT_K"] > 1:
        _zero_fill(nargs["out_ptr"])


if _INTERPRET:
    _router_kernel = _router_jit
else:
    _router_kernel = triton.autotune(
        configs=_gpu_configs(),
        key=["t_bucket", "E", "D"],
        prune_configs_by={"early_config_prune": _prune},
        do_bench=_time_config,
        cache_results=True,
        pre_hook=_fill_before_split_configs,
    )(_router_jit)


def _config_in_force(t_bucket: int, E: int, D: int) -> dict | None:
    """The config the autotuner launches for this key: its only one (the harness forces configs so), or
    its pick for the key (the key's values lead the autotuner's cache keys); None before it has tuned."""
    if len(_router_kernel.configs) == 1:
        return _router_kernel.configs[0].all_kwargs()
    for key, config in _router_kernel.cache.items():
        if tuple(key[:3]) == (t_bucket, E, D):
            return config.all_kwargs()
    return None


def router_logits(x_TD: torch.Tensor, w_router_ED: torch.Tensor) -> torch.Tensor:
    """FP32 logits [T, E] = f32(x) @ W^T, as ops.router_logits computes them (no TF32)."""
    if x_TD.dim() != 2 or w_router_ED.dim() != 2 or x_TD.shape[1] != w_router_ED.shape[1]:
        raise ValueError(
            f"expected x_TD [T, D] and w_router_ED [E, D]; got {tuple(x_TD.shape)} and {tuple(w_router_ED.shape)}"
        )
    if x_TD.dtype != torch.bfloat16 or w_router_ED.dtype != torch.float32:
        raise ValueError(f"expected x_TD bfloat16 and w_router_ED float32; got {x_TD.dtype} and {w_router_ED.dtype}")
    T, D = x_TD.shape
    E = w_router_ED.shape[0]
    logits_TE = torch.empty((T, E), dtype=torch.float32, device=x_TD.device)
    if T == 0:
        return logits_TE
    t_bucket = _t_bucket(T)

    def grid(meta):
        return (triton.cdiv(E, meta["BLOCK_E"]), meta["SPLIT_K"], triton.cdiv(T, meta["BLOCK_T"]))

    def launch(out: torch.Tensor, **fixed) -> None:
        _router_kernel[grid](
            x_TD,
            w_router_ED,
            out,
            T,
            E,
            x_TD.stride(0),
            x_TD.stride(1),
            w_router_ED.stride(0),
            w_router_ED.stride(1),
            t_bucket,
            D=D,
            **fixed,
        )

    if _INTERPRET:
        fixed = config = _interpreter_config(T, D)
    else:
        fixed = {}
        config = _config_in_force(t_bucket, E, D)
        if config is None:
            # The bucket's first call: the autotuner times every config (each split one after its fill)
            # and launches its pick, here into scratch; then the call proper, with the fill its pick needs.
            _tuning_t_bucket[0] = t_bucket
            launch(torch.empty_like(logits_TE))
            config = _config_in_force(t_bucket, E, D)
    if config["SPLIT_K"] > 1:
        _zero_fill(logits_TE)
    launch(logits_TE, **fixed)
    return logits_TE
