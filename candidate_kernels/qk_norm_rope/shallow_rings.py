"""qk_norm_rope: loads_first whose autotuner is also offered the whole-token ring of 3 programs per SM on 2 stages.

Author: human (kernels team, issue 4), hand-written. Parent: loads_first.py (the promoted kernel), whose kernels,
launch, autotuner timing and numerics this is; only the ring kernel's configs differ, by two.

What changes, and why. At sliding T = 16384 the parent's autotuner takes a whole-token TMA ring of 2 programs of 4
warps per SM on 3 stages on the H200 (150.53 us against 137.88 for one kernel moving the same bytes, thirty-sixth
session), a ring that Nsight Compute found running each token's serial chain on 8 warps per SM (12.5% occupancy,
25% would fit; the parent's header). The configs offered 3 programs per SM only on 3 stages, and 4 only of 2 warps.
Forced one at a time on an H100 under the harness's timer (fifty-first session,
results/gpu_logs/2026-12-06-session51/qk_ring_sweep.py, every output and both caches bit-exact with the parent's),
p50 us at sliding / global T = 16384:
  2 programs x 4 warps, 3 stages (the H200's sliding pick)    225.97 / 220.53
  3 x 4, 3 stages                                              222.80 / 215.55
  3 x 4, 2 stages (new here)                                   **205.72** / 207.83
  3 x 4, 2 stages, packed (new here)                           207.32 / 208.81
  4 x 4, 2 or 3 stages; 5 x 4, 2 stages                        218.40-221.52 / 213.32-215.80; 234.49 / 211.17
  4-8 x 2 warps, 2 stages                                      214.95-218.40 / 212.22-215.63
  rings split into parts, 4 or 6 x 4, 2 stages                238.61 / 233.68, 210.96 / 206.11
  the parent, autotuned (head_groups' grid on the H100)        201.94 / 197.19
  one kernel moving the same bytes                             193.53 / 190.90
The 3-program ring on 2 stages is 9% faster than the 2-program ring on 3 and the fastest ring at sliding T = 16384,
though not faster than the head-group grid that the H100's autotuner takes. Its 4-warp programs take 110 registers
without spilling, so 3 of them use 42 K of an SM's 64 K registers, and about 17 KB of shared memory each (one token
in flight). On the H200, where the parent's sliding pick is the 2-program ring, the same gain would bring sliding
T = 16384 near its goal (140 us); whether it does is for an H200 to show (3-program rings on 3 stages ran slower
there in the twelfth session's sweeps: the parent's header). Offered as PACKED and not: the H100 ranked them 1.6 us
apart.

Floor, goals, numerics, tiling and launch: loads_first.py's header (T=16384: sliding 579 MB -> 135.4 us, global 571
MB -> 133.5 us at 4275 GB/s; goals T = 1 <= 2.8 us, T = 16384 <= 140 / 135 us, one kernel).

Shape legend: T tokens, H query heads, K kv heads, Dh head dim, S cache slots, P table positions.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "loads_first",
    "idea": "loads_first with the whole-token ring of 3 programs of 4 warps per SM on 2 stages offered to its "
    "autotuner (one token in flight per program, three per SM)",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not _INTERPRET)  # griddepcontrol is the GPU's (see the header)

if _INTERPRET:

    @triton.jit
    def _rsqrt(x):
        return tl.rsqrt(x)

    @triton.jit
    def _to_bf16_in_pairs(x):
        return x.to(tl.bfloat16)  # the interpreter runs no PTX; the same rounding

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)

    @triton.jit
    def _to_bf16_in_pairs(x):
        """x rounded to BF16 (to nearest even, as x.to(tl.bfloat16)) two elements per instruction:
        cvt.rn.bf16x2.f32 puts its first source in the upper half, so element 0 ($1) goes second, as
        in Triton's own lowering of the stores' conversions."""
        return tl.inline_asm_elementwise(
            "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.bfloat16, is_pure=True, pack=2
        )


# On the CPU there are no SMs; two "SMs" give the CPU shapes (T = 1..6) loops of several tokens per
# program, so the ring's ends are exercised.
_CPU_SMS = 2
SMEM_PER_SM = 227 * 1024  # H100/H200: the most shared memory the CTAs of one SM may take
# The ring kernel only from this many tokens per SM on; below, _qk_norm_rope_kernel (the header says why). On
# the CPU, 2 tokens per "SM": the CPU shapes (T = 1..6) run both kernels.
RING_MIN_TOKENS_PER_SM = 2 if _INTERPRET else 16
MAX_GROUP_HEADS = 16


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"GROUPS": False, "GROUP_HEADS": MAX_GROUP_HEADS, "PROGRAMS_PER_SM": 1, "STAGES": 3,
                               "RING": True, "SPLIT": False, "PACKED": False}, num_warps=4)]  # fmt: skip
    # (grid, group heads, split, ring, programs per SM, stages, warps, packed). head_groups' grid: its six
    # configs (query heads per program, warps); its picks were 16 heads of 4 warps at T <= 64, 8 of 2 or
    # 32 of 4 at T = 1000, 16 of 2 at T = 16384. Then the configs token_ring's autotuner took in the
    # H200 runs of the twelfth to fourteenth sessions: its grid split into parts with packed conversions
    # (global T = 16384), whole-token rings (sliding T >= 1000). GROUP_HEADS is read by the grid only.
    shapes = (
        (True, 8, True, False, 0, 1, 2, False),
        (True, 16, True, False, 0, 1, 2, False),
        (True, 16, True, False, 0, 1, 4, False),
        (True, 32, True, False, 0, 1, 4, False),
        (True, 32, True, False, 0, 1, 8, False),
        (True, 64, True, False, 0, 1, 8, False),
        (False, 16, True, False, 0, 1, 2, True),
        (False, 16, False, True, 2, 3, 4, False),
        (False, 16, False, True, 2, 3, 4, True),
        (False, 16, False, True, 3, 3, 4, False),
        (False, 16, False, True, 3, 2, 4, False),  # new here (header)
        (False, 16, False, True, 3, 2, 4, True),  # new here
        (False, 16, False, True, 4, 2, 2, False),
        (False, 16, False, True, 4, 2, 2, True),
    )
    names = ("GROUPS", "GROUP_HEADS", "SPLIT", "RING", "PROGRAMS_PER_SM", "STAGES")
    return [
        triton.Config(
            {**dict(zip(names, shape[:6], strict=True)), "PACKED": shape[7], "launch_pdl": True}, num_warps=shape[6]
        )
        for shape in shapes
    ]


def _prune(configs, named_args, **kwargs):
    """Ring configs only where TMA can read the inputs, and only those whose rings fit the shared
    memory of an SM with its other programs (STAGES - 1 buffers of a program's loads per token);
    grid configs only with head groups up to next_pow2(H) (larger ones would only add masked heads)."""
    tma_ok = kwargs["TMA_OK"]
    heads_cap = triton.next_power_of_2(kwargs["N_Q_HEADS"])
    dh, q_heads, n_kv = kwargs["HEAD_DIM"], kwargs["Q_HEADS"], kwargs["N_KV_HEADS"]
    table = dh * 4 if kwargs["IS_ROPE"] else 0
    whole = kwargs["N_Q_HEADS"] * dh * 2 + 2 * n_kv * dh * 2 + table  # q, k, v and the table row (BF16, FP32)
    part = max(q_heads * dh * 2, 2 * n_kv * dh * 2) + table  # a query group, or all key and value heads

    def smem(c):
        if not c.kwargs["RING"]:
            return 0
        return c.kwargs["PROGRAMS_PER_SM"] * (c.kwargs["STAGES"] - 1) * (part if c.kwargs["SPLIT"] else whole)

    def fits(c):
        if c.kwargs["GROUPS"]:
            return c.kwargs["GROUP_HEADS"] <= heads_cap
        return (tma_ok or not c.kwargs["RING"]) and smem(c) <= SMEM_PER_SM

    usable = [c for c in configs if fits(c)]
    return usable or [c for c in configs if not c.kwargs["RING"] and not c.kwargs["GROUPS"]]


# How the autotuner times a config. Few tokens: as a CUDA-graph replay, the way a decode step runs
# it and the harness times it (Triton's default event pair counts the launch there, and ranked
# head_groups' configs 10-18% off at T = 3 and 8). Many tokens: the default.
_GRAPH_TIMED_ROWS = 64
_tuning_rows = [0]  # the rows bucket of the launch being tuned (set by the launcher)


def _time_config(kernel_call, quantiles):
    if _tuning_rows[0] <= _GRAPH_TIMED_ROWS:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def _rows_bucket(T: int) -> int:
    """Autotuning key for the token count: the next power of two, capped (1, 4, 8, 64, 1024, 16384)."""
    return min(triton.next_power_of_2(T), 16384)


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a cached host-side query: no sync, graph-safe)."""
    if device.type != "cuda":
        return _CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _group_heads(n: int) -> int:
    """Heads per tile: the largest power of two that divides n, at most MAX_GROUP_HEADS."""
    return min(n & -n, MAX_GROUP_HEADS)


@triton.jit
def _head_halves(desc, ptr, token, head0, d, d_mask, stride_t, stride_h, stride_d, HALF: tl.constexpr,
                 HEADS: tl.constexpr, RING: tl.constexpr):  # fmt: skip
    """Heads head0 .. head0 + HEADS - 1 of one token as their halves x[..., :Dh/2], x[..., Dh/2:]
    ([HEADS, HALF_BLOCK] each, in the input's dtype): two TMA tiles, or plain loads (read once)."""
    if RING:
        x1 = desc.load([token, head0, 0, 0]).reshape(HEADS, HALF)
        x2 = desc.load([token, head0, 1, 0]).reshape(HEADS, HALF)
    else:
        rows = ptr + tl.cast(token, tl.int64) * stride_t + (head0 + tl.arange(0, HEADS))[:, None] * stride_h
        mask = d_mask[None, :]
        x1 = tl.load(rows + d[None, :] * stride_d, mask=mask, other=0.0, eviction_policy="evict_first")
        x2 = tl.load(rows + (HALF + d[None, :]) * stride_d, mask=mask, other=0.0, eviction_policy="evict_first")
    return x1, x2


@triton.jit
def _weight_halves(w_ptr, d, d_mask, HALF: tl.constexpr, ROW: tl.constexpr = False):
    """A norm weight's two halves in FP32, as [1, HALF_BLOCK] rows. Every program of an SM reads them: evict_last
    keeps them in L1. ROW: loaded as such rows, in the layout of the heads' plain [heads, HALF_BLOCK] loads; else
    (the ring's, loaded once per program) as vectors, expanded."""
    if ROW:
        w1 = tl.load(w_ptr + d[None, :], mask=d_mask[None, :], other=0.0, eviction_policy="evict_last")
        w2 = tl.load(w_ptr + HALF + d[None, :], mask=d_mask[None, :], other=0.0, eviction_policy="evict_last")
        return w1.to(tl.float32), w2.to(tl.float32)
    w1 = tl.load(w_ptr + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    w2 = tl.load(w_ptr + HALF + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return w1[None, :], w2[None, :]


@triton.jit
def _position(cs_desc, cs_ptr, ssmax_ptr, pos_ptr, token, d, d_mask, stride_cs_p, stride_cs_d,
              HALF: tl.constexpr, IS_ROPE: tl.constexpr, RING: tl.constexpr):  # fmt: skip
    """The token's position data: its cos and sin halves (sliding) or its SSMax scale (global)."""
    pos = tl.load(pos_ptr + token).to(tl.int64)
    if IS_ROPE:
        if RING:
            row = pos.to(tl.int32)  # TMA coordinates are 32-bit
            cos = cs_desc.load([row, 0, 0]).reshape(HALF)
            sin = cs_desc.load([row, 1, 0]).reshape(HALF)
        else:
            row = cs_ptr + pos * stride_cs_p
            cos = tl.load(row + d * stride_cs_d, mask=d_mask, other=0.0)
            sin = tl.load(row + (HALF + d) * stride_cs_d, mask=d_mask, other=0.0)
        scale = 1.0
    else:
        cos = tl.zeros_like(d).to(tl.float32)  # unused on global layers
        sin = cos
        scale = tl.load(ssmax_ptr + pos)  # SSMax scales queries only: (1 + p/2048)^0.1 from the table
    return cos, sin, scale


@triton.jit
def _norm_and_position(x1, x2, w1, w2, cos, sin, scale, eps, HALF: tl.constexpr, IS_ROPE: tl.constexpr,
                       SCALE: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """One tile of heads given as their halves (any float dtype): RMSNorm per head (rounding point
    1), then RoPE, the SSMax scale (SCALE) or nothing (rounding point 2). Returns the BF16 halves.
    PACKED: rounding point 1 in packed conversions (_to_bf16_in_pairs), the same bits."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # Masked lanes hold 0 and add nothing. mean(x^2) from the EXACT sum of squares (BF16 squares are
    # exact in FP32, their sum exact in FP64): the correctly rounded FP32 mean, in any order.
    sum_sq = tl.sum((x1 * x1).to(tl.float64), axis=1) + tl.sum((x2 * x2).to(tl.float64), axis=1)
    inv_rms = _rsqrt((sum_sq / (2 * HALF)).to(tl.float32) + eps)[:, None]
    if PACKED:
        n1 = _to_bf16_in_pairs(x1 * inv_rms * w1)
        n2 = _to_bf16_in_pairs(x2 * inv_rms * w2)
    else:
        n1 = (x1 * inv_rms * w1).to(tl.bfloat16)
        n2 = (x2 * inv_rms * w2).to(tl.bfloat16)
    if IS_ROPE:
        a = n1.to(tl.float32)
        b = n2.to(tl.float32)
        # rotate-half: each product rounded to FP32, then the add (no FMA: enable_fp_fusion=False).
        return (a * cos[None, :] - b * sin[None, :]).to(tl.bfloat16), (b * cos[None, :] + a * sin[None, :]).to(
            tl.bfloat16
        )
    if SCALE:
        return (n1.to(tl.float32) * scale).to(tl.bfloat16), (n2.to(tl.float32) * scale).to(tl.bfloat16)
    return n1, n2


@triton.jit
def _query_group(q1, q2, q_out_ptr, token, head0, w1, w2, cos, sin, scale, d, d_mask, eps, N_Q_HEADS: tl.constexpr,
                 HEAD_DIM: tl.constexpr, HALF: tl.constexpr, Q_HEADS: tl.constexpr, IS_ROPE: tl.constexpr,
                 PACKED: tl.constexpr):  # fmt: skip
    """Loaded query heads head0 .. head0 + Q_HEADS - 1 of one token -> q'."""
    o1, o2 = _norm_and_position(q1, q2, w1, w2, cos, sin, scale, eps, HALF, IS_ROPE, True, PACKED)
    out = q_out_ptr + (tl.cast(token, tl.int64) * N_Q_HEADS + head0 + tl.arange(0, Q_HEADS))[:, None] * HEAD_DIM
    mask = d_mask[None, :]
    tl.store(out + d[None, :], o1, mask=mask)
    tl.store(out + HALF + d[None, :], o2, mask=mask)


@triton.jit
def _key_value_group(k1, k2, v1, v2, slot, k_cache_ptr, v_cache_ptr, k_out_ptr, token, head0, w1, w2, cos, sin, d,
                     d_mask, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, eps,
                     N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, K_HEADS: tl.constexpr,
                     IS_ROPE: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """Loaded key and value heads head0 .. head0 + K_HEADS - 1 of one token -> k', then k' and v into the
    cache row `slot` (slot -1: a token the cache does not keep; its writes are skipped)."""
    heads = (head0 + tl.arange(0, K_HEADS))[:, None]
    mask = d_mask[None, :]
    keep = mask & (slot >= 0)
    # Keys are rotated on sliding layers and never scaled (SSMax scales queries only).
    o1, o2 = _norm_and_position(k1, k2, w1, w2, cos, sin, 1.0, eps, HALF, IS_ROPE, False, PACKED)
    out = k_out_ptr + (tl.cast(token, tl.int64) * N_KV_HEADS + heads) * HEAD_DIM
    tl.store(out + d[None, :], o1, mask=mask)
    tl.store(out + HALF + d[None, :], o2, mask=mask)
    # The cache gets exactly the returned k' and the input v, in the cache's dtype.
    kc = k_cache_ptr + slot * stride_kc_s + heads * stride_kc_h
    tl.store(kc + d[None, :] * stride_kc_d, o1.to(k_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(kc + (HALF + d[None, :]) * stride_kc_d, o2.to(k_cache_ptr.dtype.element_ty), mask=keep)
    vc = v_cache_ptr + slot * stride_vc_s + heads * stride_vc_h
    tl.store(vc + d[None, :] * stride_vc_d, v1.to(v_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(vc + (HALF + d[None, :]) * stride_vc_d, v2.to(v_cache_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _grid_norm_and_position(
    x1,
    x2,
    w1,
    w2,
    cos,
    sin,
    scale,
    eps,
    HALF: tl.constexpr,
    IS_ROPE: tl.constexpr,
    SCALE: tl.constexpr,
):
    """One tile of heads given as their halves x1 = x[..., :Dh/2], x2 = x[..., Dh/2:] (FP32):
    RMSNorm per head (rounding point 1), then RoPE, the SSMax scale (SCALE) or nothing
    (rounding point 2). Returns the two BF16 halves. The weights (FP32), cos and sin ([1, HALF_BLOCK]) were
    loaded by the caller, with its heads (_grid_loads_first)."""
    # Masked lanes (d >= Dh/2, or heads past the last) hold 0 and add nothing to the sums.
    # mean(x^2) from the EXACT sum of squares (BF16 squares are exact in FP32, their sum exact in
    # FP64): the correctly rounded FP32 mean, the same bits in any summation order.
    sum_sq = tl.sum((x1 * x1).to(tl.float64), axis=1) + tl.sum((x2 * x2).to(tl.float64), axis=1)
    inv_rms = _rsqrt((sum_sq / (2 * HALF)).to(tl.float32) + eps)[:, None]
    n1 = (x1 * inv_rms * w1).to(tl.bfloat16)
    n2 = (x2 * inv_rms * w2).to(tl.bfloat16)
    if IS_ROPE:
        a = n1.to(tl.float32)
        b = n2.to(tl.float32)
        # rotate-half: each product rounded to FP32, then the add (no FMA: enable_fp_fusion=False).
        return (a * cos - b * sin).to(tl.bfloat16), (b * cos + a * sin).to(tl.bfloat16)
    if SCALE:
        return (n1.to(tl.float32) * scale).to(tl.bfloat16), (n2.to(tl.float32) * scale).to(tl.bfloat16)
    return n1, n2


@triton.jit
def _grid_weights_and_position(w_ptr, pos_ptr, cos_sin_ptr, ssmax_ptr, token, d, d_mask, stride_cs_p, stride_cs_d,
                               HALF: tl.constexpr, IS_ROPE: tl.constexpr, SCALE: tl.constexpr):  # fmt: skip
    """The norm weights (FP32 halves) and the token's position data (cos and sin as [1, HALF_BLOCK], or the SSMax
    scale), for a caller that has issued its heads' loads already: the weights and the position go out in the
    heads' round trip, and only the cos|sin row (or SSMax entry), which needs the position, waits for it."""
    # The norm weights are re-read by every program on the SM: keep them in L1 (evict_last).
    w1, w2 = _weight_halves(w_ptr, d, d_mask, HALF, True)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.zeros_like(w1)  # unused unless IS_ROPE
    sin = cos
    scale = 1.0
    if IS_ROPE:
        row = cos_sin_ptr + pos * stride_cs_p
        cos = tl.load(row + d * stride_cs_d, mask=d_mask, other=0.0)[None, :]
        sin = tl.load(row + (HALF + d) * stride_cs_d, mask=d_mask, other=0.0)[None, :]
    elif SCALE:
        scale = tl.load(ssmax_ptr + pos)  # SSMax scales queries only: (1 + p/2048)^0.1 from the table
    return w1, w2, cos, sin, scale


@triton.jit
def _grid_query_program(
    q_ptr, q_w_ptr, ssmax_ptr, q_out_ptr, pos_ptr, cos_sin_ptr, stride_cs_p, stride_cs_d, token, group,
    stride_q_t, stride_q_h, stride_q_d, eps,
    N_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr, Q_HEADS: tl.constexpr,
    IS_ROPE: tl.constexpr,
):  # fmt: skip
    """Query heads group*Q_HEADS .. group*Q_HEADS + Q_HEADS - 1 of one token -> q'."""
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HALF_BLOCK)
    d_mask = d < HALF
    heads = group * Q_HEADS + tl.arange(0, Q_HEADS)
    mask = (heads < N_Q_HEADS)[:, None] & d_mask[None, :]
    q_row = q_ptr + token * stride_q_t + heads[:, None] * stride_q_h
    q1 = tl.load(q_row + d[None, :] * stride_q_d, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    q2 = tl.load(q_row + (HALF + d[None, :]) * stride_q_d, mask=mask, other=0.0, eviction_policy="evict_first").to(
        tl.float32
    )
    w1, w2, cos, sin, scale = _grid_weights_and_position(q_w_ptr, pos_ptr, cos_sin_ptr, ssmax_ptr, token, d, d_mask,
                                                         stride_cs_p, stride_cs_d, HALF, IS_ROPE, True)  # fmt: skip
    o1, o2 = _grid_norm_and_position(q1, q2, w1, w2, cos, sin, scale, eps, HALF, IS_ROPE, True)
    out_row = q_out_ptr + (token * N_Q_HEADS + heads[:, None]) * HEAD_DIM
    tl.store(out_row + d[None, :], o1, mask=mask)
    tl.store(out_row + HALF + d[None, :], o2, mask=mask)


@triton.jit
def _grid_key_value_program(
    k_ptr, v_ptr, k_w_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, k_out_ptr, pos_ptr, cos_sin_ptr, stride_cs_p,
    stride_cs_d, token, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d,
    stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, eps,
    N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr,
    IS_ROPE: tl.constexpr,
):  # fmt: skip
    """All K heads of one token -> k', then k' and v into the cache row slot_mapping[token]."""
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HALF_BLOCK)
    d_mask = d < HALF
    heads = tl.arange(0, KV_BLOCK)
    mask = (heads < N_KV_HEADS)[:, None] & d_mask[None, :]
    slot = tl.load(slot_ptr + token).to(tl.int64)
    keep = mask & (slot >= 0)  # slot -1: a token the cache does not keep; its writes are skipped
    k_row = k_ptr + token * stride_k_t + heads[:, None] * stride_k_h
    v_row = v_ptr + token * stride_v_t + heads[:, None] * stride_v_h
    k1 = tl.load(k_row + d[None, :] * stride_k_d, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    k2 = tl.load(k_row + (HALF + d[None, :]) * stride_k_d, mask=mask, other=0.0, eviction_policy="evict_first").to(
        tl.float32
    )
    # v read whatever the slot (masked by it, its loads would wait for the slot's); only its writes are skipped.
    v1 = tl.load(v_row + d[None, :] * stride_v_d, mask=mask, other=0.0, eviction_policy="evict_first")
    v2 = tl.load(v_row + (HALF + d[None, :]) * stride_v_d, mask=mask, other=0.0, eviction_policy="evict_first")
    # Keys are rotated on sliding layers and never scaled (SSMax scales queries only).
    # (no SSMax table here: SCALE is False, so the table pointer in its place is never read)
    w1, w2, cos, sin, _ = _grid_weights_and_position(k_w_ptr, pos_ptr, cos_sin_ptr, cos_sin_ptr, token, d, d_mask,
                                                     stride_cs_p, stride_cs_d, HALF, IS_ROPE, False)  # fmt: skip
    o1, o2 = _grid_norm_and_position(k1, k2, w1, w2, cos, sin, 1.0, eps, HALF, IS_ROPE, False)
    out_row = k_out_ptr + (token * N_KV_HEADS + heads[:, None]) * HEAD_DIM
    tl.store(out_row + d[None, :], o1, mask=mask)
    tl.store(out_row + HALF + d[None, :], o2, mask=mask)
    # The cache gets exactly the returned k' and the input v, in the cache's dtype.
    kc_row = k_cache_ptr + slot * stride_kc_s + heads[:, None] * stride_kc_h
    tl.store(kc_row + d[None, :] * stride_kc_d, o1.to(k_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(kc_row + (HALF + d[None, :]) * stride_kc_d, o2.to(k_cache_ptr.dtype.element_ty), mask=keep)
    vc_row = v_cache_ptr + slot * stride_vc_s + heads[:, None] * stride_vc_h
    tl.store(vc_row + d[None, :] * stride_vc_d, v1.to(v_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(vc_row + (HALF + d[None, :]) * stride_vc_d, v2.to(v_cache_ptr.dtype.element_ty), mask=keep)


# cache_results: the winning config is stored in Triton's cache, so later processes on this machine
# (the harness's parity and benchmark children, a model run) use the config that was checked.
@triton.autotune(
    configs=_configs(),
    key=["N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM", "IS_ROPE", "TMA_OK", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _qk_norm_rope_ring_kernel(
    q_desc,  # TMA descriptors of q, k, v as [T, heads, 2, Dh/2] and of the cos|sin table as [P, 2, Dh/2]
    k_desc,  # (the tensors themselves where TMA cannot read them: the ring is not compiled then)
    v_desc,
    cs_desc,
    q_ptr,
    k_ptr,
    v_ptr,
    cs_ptr,
    q_w_ptr,
    k_w_ptr,
    pos_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    ssmax_ptr,
    q_out_ptr,
    k_out_ptr,
    n_tokens,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_k_t,
    stride_k_h,
    stride_k_d,
    stride_v_t,
    stride_v_h,
    stride_v_d,
    stride_kc_s,
    stride_kc_h,
    stride_kc_d,
    stride_vc_s,
    stride_vc_h,
    stride_vc_d,
    stride_cs_p,
    stride_cs_d,
    eps,
    rows_bucket,  # read only by the autotuner's key
    N_Q_HEADS: tl.constexpr,
    N_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_BLOCK: tl.constexpr,  # next_pow2(Dh / 2): the plain path masks the rest; TMA needs it equal
    Q_HEADS: tl.constexpr,
    K_HEADS: tl.constexpr,
    IS_ROPE: tl.constexpr,
    TMA_OK: tl.constexpr,  # whether the descriptors are real (the prune drops ring configs otherwise)
    PROGRAMS_PER_SM: tl.constexpr,  # read by the launcher's grid
    STAGES: tl.constexpr,  # the ring's depth: STAGES - 1 tokens in flight per program
    RING: tl.constexpr,
    SPLIT: tl.constexpr,
    PACKED: tl.constexpr,  # rounding point 1 in packed conversions (_norm_and_position)
    KV_BLOCK: tl.constexpr,  # next_pow2(K): the grid's key/value program takes all key heads in one tile
    GROUPS: tl.constexpr,  # head_groups' grid: one program per (token, query head group) or per token's keys
    GROUP_HEADS: tl.constexpr,  # query heads per grid program
):
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    if GROUPS:
        _grid_program(q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, cs_ptr,
                      ssmax_ptr, q_out_ptr, k_out_ptr, stride_q_t, stride_q_h, stride_q_d, stride_k_t, stride_k_h,
                      stride_k_d, stride_v_t, stride_v_h, stride_v_d, stride_kc_s, stride_kc_h, stride_kc_d,
                      stride_vc_s, stride_vc_h, stride_vc_d, stride_cs_p, stride_cs_d, eps, N_Q_HEADS, N_KV_HEADS,
                      HEAD_DIM, HALF_BLOCK, KV_BLOCK, IS_ROPE, GROUP_HEADS)  # fmt: skip
    else:
        _ring_program(q_desc, k_desc, v_desc, cs_desc, q_ptr, k_ptr, v_ptr, cs_ptr, q_w_ptr, k_w_ptr, pos_ptr,
                      slot_ptr, k_cache_ptr, v_cache_ptr, ssmax_ptr, q_out_ptr, k_out_ptr, n_tokens, stride_q_t,
                      stride_q_h, stride_q_d, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d,
                      stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, stride_cs_p,
                      stride_cs_d, eps, N_Q_HEADS, N_KV_HEADS, HEAD_DIM, HALF_BLOCK, Q_HEADS, K_HEADS, IS_ROPE,
                      TMA_OK, STAGES, RING, SPLIT, PACKED)  # fmt: skip


def _grid_configs() -> list[triton.Config]:
    if _INTERPRET:
        # Beam's 48 heads in two groups (the second half masked), beam-tiny's 4 in one masked group.
        return [triton.Config({"Q_HEADS": 32}, num_warps=1)]
    shapes = ((8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8))
    return [triton.Config({"Q_HEADS": heads, "launch_pdl": True}, num_warps=warps) for heads, warps in shapes]


def _grid_prune(configs, named_args, **kwargs):
    """Drop head groups larger than next_pow2(H): they would only add masked heads."""
    n_heads = kwargs["N_Q_HEADS"]
    fit = [c for c in configs if c.kwargs["Q_HEADS"] <= triton.next_power_of_2(n_heads)]
    return fit or [min(configs, key=lambda c: c.kwargs["Q_HEADS"])]


@triton.autotune(
    configs=_grid_configs(),
    key=["N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM", "IS_ROPE", "rows_bucket"],
    prune_configs_by={"early_config_prune": _grid_prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, cos_sin_ptr, ssmax_ptr,
    q_out_ptr, k_out_ptr, stride_q_t, stride_q_h, stride_q_d, stride_k_t, stride_k_h, stride_k_d, stride_v_t,
    stride_v_h, stride_v_d, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d,
    stride_cs_p, stride_cs_d, eps,
    rows_bucket,  # read only by the autotuner's key
    N_Q_HEADS: tl.constexpr, N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr, IS_ROPE: tl.constexpr, Q_HEADS: tl.constexpr,
):  # fmt: skip
    """pdl_head_groups' kernel: its parameters, configs, autotuning key and code."""
    if PDL:
        gdc_wait()  # the previous kernel complete, its writes visible: before any load or store
    _grid_program(q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, cos_sin_ptr,
                  ssmax_ptr, q_out_ptr, k_out_ptr, stride_q_t, stride_q_h, stride_q_d, stride_k_t, stride_k_h,
                  stride_k_d, stride_v_t, stride_v_h, stride_v_d, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s,
                  stride_vc_h, stride_vc_d, stride_cs_p, stride_cs_d, eps, N_Q_HEADS, N_KV_HEADS, HEAD_DIM,
                  HALF_BLOCK, KV_BLOCK, IS_ROPE, Q_HEADS)  # fmt: skip


@triton.jit
def _grid_program(q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, cos_sin_ptr,
                  ssmax_ptr, q_out_ptr, k_out_ptr, stride_q_t, stride_q_h, stride_q_d, stride_k_t, stride_k_h,
                  stride_k_d, stride_v_t, stride_v_h, stride_v_d, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s,
                  stride_vc_h, stride_vc_d, stride_cs_p, stride_cs_d, eps, N_Q_HEADS: tl.constexpr,
                  N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr,
                  IS_ROPE: tl.constexpr, Q_HEADS: tl.constexpr):  # fmt: skip
    """head_groups' program, its code: (token, query head group) or (token, key/value heads) from the program id."""
    N_Q_GROUPS: tl.constexpr = (N_Q_HEADS + Q_HEADS - 1) // Q_HEADS
    pid = tl.program_id(0)
    token = (pid // (N_Q_GROUPS + 1)).to(tl.int64)
    group = pid % (N_Q_GROUPS + 1)

    # Each program's loads that need only its id (heads, weights, position) first: the position is read inside
    # the programs, after their heads (_grid_weights_and_position).
    if group < N_Q_GROUPS:
        _grid_query_program(
            q_ptr, q_w_ptr, ssmax_ptr, q_out_ptr, pos_ptr, cos_sin_ptr, stride_cs_p, stride_cs_d, token, group,
            stride_q_t, stride_q_h, stride_q_d, eps,
            N_Q_HEADS, HEAD_DIM, HALF_BLOCK, Q_HEADS, IS_ROPE,
        )  # fmt: skip
    else:
        _grid_key_value_program(
            k_ptr, v_ptr, k_w_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, k_out_ptr, pos_ptr, cos_sin_ptr, stride_cs_p,
            stride_cs_d, token, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d,
            stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, eps,
            N_KV_HEADS, HEAD_DIM, HALF_BLOCK, KV_BLOCK, IS_ROPE,
        )  # fmt: skip


@triton.jit
def _ring_program(q_desc, k_desc, v_desc, cs_desc, q_ptr, k_ptr, v_ptr, cs_ptr, q_w_ptr, k_w_ptr, pos_ptr, slot_ptr,
                  k_cache_ptr, v_cache_ptr, ssmax_ptr, q_out_ptr, k_out_ptr, n_tokens, stride_q_t, stride_q_h,
                  stride_q_d, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d, stride_kc_s,
                  stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, stride_cs_p, stride_cs_d, eps,
                  N_Q_HEADS: tl.constexpr, N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  HALF_BLOCK: tl.constexpr, Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, IS_ROPE: tl.constexpr,
                  TMA_OK: tl.constexpr, STAGES: tl.constexpr, RING: tl.constexpr, SPLIT: tl.constexpr,
                  PACKED: tl.constexpr):  # fmt: skip
    """token_ring's programs, its code: lanes of persistent programs over the tokens."""
    HALF: tl.constexpr = HEAD_DIM // 2
    N_Q_GROUPS: tl.constexpr = N_Q_HEADS // Q_HEADS
    N_KV_GROUPS: tl.constexpr = N_KV_HEADS // K_HEADS
    PARTS: tl.constexpr = N_Q_GROUPS + 1 if SPLIT else 1
    USE_TMA: tl.constexpr = RING and TMA_OK
    d = tl.arange(0, HALF_BLOCK)
    d_mask = d < HALF

    # A lane is PARTS programs side by side (token-major); lanes stride over the tokens. Each branch is
    # one loop whose TMA loads Triton's pipeliner issues STAGES - 1 tokens ahead. Without the ring, a
    # part loads its heads before its position, so that they are in flight while the position and its
    # cos|sin row (two dependent round trips) arrive.
    pid = tl.program_id(0)
    part = pid % PARTS
    lane = pid // PARTS
    n_lanes = tl.num_programs(0) // PARTS
    # Each branch reads the norm weights it uses once; they stay in registers for all its tokens.
    if SPLIT:
        if part < N_Q_GROUPS:
            if USE_TMA:
                qw1, qw2 = _weight_halves(q_w_ptr, d, d_mask, HALF)
            for token in tl.range(lane, n_tokens, n_lanes, num_stages=STAGES):
                q1, q2 = _head_halves(q_desc, q_ptr, token, part * Q_HEADS, d, d_mask, stride_q_t, stride_q_h,
                                      stride_q_d, HALF, Q_HEADS, USE_TMA)  # fmt: skip
                if not USE_TMA:  # plain loads: the weights after this token's heads, in their round trip
                    qw1, qw2 = _weight_halves(q_w_ptr, d, d_mask, HALF, True)
                cos, sin, scale = _position(cs_desc, cs_ptr, ssmax_ptr, pos_ptr, token, d, d_mask, stride_cs_p,
                                            stride_cs_d, HALF, IS_ROPE, USE_TMA)  # fmt: skip
                _query_group(q1, q2, q_out_ptr, token, part * Q_HEADS, qw1, qw2, cos, sin, scale, d, d_mask, eps,
                             N_Q_HEADS, HEAD_DIM, HALF, Q_HEADS, IS_ROPE, PACKED)  # fmt: skip
        else:
            if USE_TMA:
                kw1, kw2 = _weight_halves(k_w_ptr, d, d_mask, HALF)
            for token in tl.range(lane, n_tokens, n_lanes, num_stages=STAGES):
                slot = tl.load(slot_ptr + token).to(tl.int64)
                for group in tl.static_range(N_KV_GROUPS):  # one group for Beam (8 kv heads)
                    k1, k2 = _head_halves(k_desc, k_ptr, token, group * K_HEADS, d, d_mask, stride_k_t, stride_k_h,
                                          stride_k_d, HALF, K_HEADS, USE_TMA)  # fmt: skip
                    v1, v2 = _head_halves(v_desc, v_ptr, token, group * K_HEADS, d, d_mask, stride_v_t, stride_v_h,
                                          stride_v_d, HALF, K_HEADS, USE_TMA)  # fmt: skip
                    if not USE_TMA:  # plain loads: the weights after this token's heads, in their round trip
                        kw1, kw2 = _weight_halves(k_w_ptr, d, d_mask, HALF, True)
                    cos, sin, _ = _position(cs_desc, cs_ptr, ssmax_ptr, pos_ptr, token, d, d_mask, stride_cs_p,
                                            stride_cs_d, HALF, IS_ROPE, USE_TMA)  # fmt: skip
                    _key_value_group(k1, k2, v1, v2, slot, k_cache_ptr, v_cache_ptr, k_out_ptr, token, group * K_HEADS,
                                     kw1, kw2, cos, sin, d, d_mask, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s,
                                     stride_vc_h, stride_vc_d, eps, N_KV_HEADS, HEAD_DIM, HALF, K_HEADS,
                                     IS_ROPE, PACKED)  # fmt: skip
    else:
        qw1, qw2 = _weight_halves(q_w_ptr, d, d_mask, HALF)
        kw1, kw2 = _weight_halves(k_w_ptr, d, d_mask, HALF)
        for token in tl.range(lane, n_tokens, n_lanes, num_stages=STAGES):
            cos, sin, scale = _position(cs_desc, cs_ptr, ssmax_ptr, pos_ptr, token, d, d_mask, stride_cs_p,
                                        stride_cs_d, HALF, IS_ROPE, USE_TMA)  # fmt: skip
            for group in tl.static_range(N_Q_GROUPS):
                q1, q2 = _head_halves(q_desc, q_ptr, token, group * Q_HEADS, d, d_mask, stride_q_t, stride_q_h,
                                      stride_q_d, HALF, Q_HEADS, USE_TMA)  # fmt: skip
                _query_group(q1, q2, q_out_ptr, token, group * Q_HEADS, qw1, qw2, cos, sin, scale, d, d_mask, eps,
                             N_Q_HEADS, HEAD_DIM, HALF, Q_HEADS, IS_ROPE, PACKED)  # fmt: skip
            slot = tl.load(slot_ptr + token).to(tl.int64)
            for group in tl.static_range(N_KV_GROUPS):
                k1, k2 = _head_halves(k_desc, k_ptr, token, group * K_HEADS, d, d_mask, stride_k_t, stride_k_h,
                                      stride_k_d, HALF, K_HEADS, USE_TMA)  # fmt: skip
                v1, v2 = _head_halves(v_desc, v_ptr, token, group * K_HEADS, d, d_mask, stride_v_t, stride_v_h,
                                      stride_v_d, HALF, K_HEADS, USE_TMA)  # fmt: skip
                _key_value_group(k1, k2, v1, v2, slot, k_cache_ptr, v_cache_ptr, k_out_ptr, token, group * K_HEADS,
                                 kw1, kw2, cos, sin, d, d_mask, stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s,
                                 stride_vc_h, stride_vc_d, eps, N_KV_HEADS, HEAD_DIM, HALF, K_HEADS,
                                 IS_ROPE, PACKED)  # fmt: skip


def _tma_ok(half: int, *tensors: torch.Tensor) -> bool:
    """TMA's rules for the [.., 2, Dh/2] views: Dh/2 a power of two spanning at least 16 bytes,
    16-byte aligned bases, unit stride along Dh, 16-byte multiples for every other stride."""
    if half & (half - 1) or any(half * t.element_size() < 16 for t in tensors):
        return False
    return all(
        t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])
        for t in tensors
    )


def _heads_descriptor(x: torch.Tensor, heads: int, half: int) -> TensorDescriptor:
    """x [T, n, Dh] as [T, n, 2, Dh/2], one tile = `heads` heads' first or second halves."""
    T, n, _ = x.shape
    return TensorDescriptor(x, [T, n, 2, half], [x.stride(0), x.stride(1), half, 1], [1, heads, 1, half])


def qk_norm_rope(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    positions_T: torch.Tensor,
    slot_mapping_T: torch.Tensor,
    k_cache_SKD: torch.Tensor,
    v_cache_SKD: torch.Tensor,
    rope_cos_sin_PD: torch.Tensor | None,
    ssmax_scale_P: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (q', k') as ops.qk_norm_rope and writes k', v into the caches at slot_mapping rows."""
    if (rope_cos_sin_PD is None) == (ssmax_scale_P is None):
        raise ValueError("qk_norm_rope needs exactly one of rope_cos_sin_PD (sliding) and ssmax_scale_P (global)")
    if q_THD.dim() != 3 or k_TKD.dim() != 3 or v_TKD.shape != k_TKD.shape:
        raise ValueError(
            f"expected q [T, H, Dh], k and v [T, K, Dh]; got {tuple(q_THD.shape)}, {tuple(k_TKD.shape)}, "
            f"{tuple(v_TKD.shape)}"
        )
    T, H, Dh = q_THD.shape
    K = k_TKD.shape[1]
    if k_TKD.shape[0] != T or k_TKD.shape[2] != Dh or Dh % 2:
        raise ValueError(f"q {tuple(q_THD.shape)} and k {tuple(k_TKD.shape)} must share T and an even Dh")
    if positions_T.shape != (T,) or slot_mapping_T.shape != (T,):
        raise ValueError(
            f"positions_T and slot_mapping_T must be [{T}]; got {tuple(positions_T.shape)}, "
            f"{tuple(slot_mapping_T.shape)}"
        )
    if k_cache_SKD.shape[1:] != (K, Dh) or v_cache_SKD.shape != k_cache_SKD.shape:
        raise ValueError(
            f"caches must be [S, {K}, {Dh}]; got {tuple(k_cache_SKD.shape)} and {tuple(v_cache_SKD.shape)}"
        )
    is_rope = rope_cos_sin_PD is not None
    if is_rope and rope_cos_sin_PD.shape[1] != Dh:
        raise ValueError(f"rope_cos_sin_PD must be [P, {Dh}]; got {tuple(rope_cos_sin_PD.shape)}")

    q_out_THD = torch.empty((T, H, Dh), dtype=torch.bfloat16, device=q_THD.device)
    k_out_TKD = torch.empty((T, K, Dh), dtype=torch.bfloat16, device=q_THD.device)
    if T == 0:
        return q_out_THD, k_out_TKD
    n_sms = _sm_count(q_THD.device)
    _tuning_rows[0] = _rows_bucket(T)
    if T < RING_MIN_TOKENS_PER_SM * n_sms:
        table = rope_cos_sin_PD if is_rope else ssmax_scale_P

        def groups(meta):
            return (T * (triton.cdiv(H, meta["Q_HEADS"]) + 1),)

        _qk_norm_rope_kernel[groups](
            q_THD, k_TKD, v_TKD, q_norm_weight.contiguous(), k_norm_weight.contiguous(), positions_T, slot_mapping_T,
            k_cache_SKD, v_cache_SKD, table if is_rope else None, None if is_rope else table.contiguous(), q_out_THD,
            k_out_TKD, *q_THD.stride(), *k_TKD.stride(), *v_TKD.stride(), *k_cache_SKD.stride(),
            *v_cache_SKD.stride(), *(rope_cos_sin_PD.stride() if is_rope else (0, 0)), eps, _rows_bucket(T),
            N_Q_HEADS=H, N_KV_HEADS=K, HEAD_DIM=Dh, HALF_BLOCK=triton.next_power_of_2(Dh // 2),
            KV_BLOCK=triton.next_power_of_2(K), IS_ROPE=is_rope, enable_fp_fusion=False,
        )  # fmt: skip
        return q_out_THD, k_out_TKD

    half = Dh // 2
    q_heads, k_heads = _group_heads(H), _group_heads(K)
    ssmax_P = None if is_rope else ssmax_scale_P.contiguous()
    table_PD = rope_cos_sin_PD if is_rope else q_THD.new_empty((1, Dh), dtype=torch.float32)  # unread on global
    tma_ok = _tma_ok(half, q_THD, k_TKD, v_TKD, table_PD)
    if tma_ok:
        P = table_PD.shape[0]
        descriptors = (
            _heads_descriptor(q_THD, q_heads, half),
            _heads_descriptor(k_TKD, k_heads, half),
            _heads_descriptor(v_TKD, k_heads, half),
            TensorDescriptor(table_PD, [P, 2, half], [table_PD.stride(0), half, 1], [1, 1, half]),
        )
    else:
        descriptors = (q_THD, k_TKD, v_TKD, table_PD)

    def grid(meta):
        if meta["GROUPS"]:
            return (T * (triton.cdiv(H, meta["GROUP_HEADS"]) + 1),)
        parts = H // q_heads + 1 if meta["SPLIT"] else 1
        per_sm = meta["PROGRAMS_PER_SM"]
        lanes = T if per_sm == 0 else min(T, max(1, per_sm * n_sms // parts))  # 0: a lane per token
        return (lanes * parts,)

    _qk_norm_rope_ring_kernel[grid](
        *descriptors,
        q_THD,
        k_TKD,
        v_TKD,
        table_PD,
        q_norm_weight.contiguous(),
        k_norm_weight.contiguous(),
        positions_T,
        slot_mapping_T,
        k_cache_SKD,
        v_cache_SKD,
        ssmax_P,
        q_out_THD,
        k_out_TKD,
        T,
        *q_THD.stride(),
        *k_TKD.stride(),
        *v_TKD.stride(),
        *k_cache_SKD.stride(),
        *v_cache_SKD.stride(),
        *table_PD.stride(),
        eps,
        _rows_bucket(T),
        N_Q_HEADS=H,
        N_KV_HEADS=K,
        HEAD_DIM=Dh,
        HALF_BLOCK=triton.next_power_of_2(half),
        Q_HEADS=q_heads,
        K_HEADS=k_heads,
        IS_ROPE=is_rope,
        TMA_OK=tma_ok,
        KV_BLOCK=triton.next_power_of_2(K),
        enable_fp_fusion=False,
    )
    return q_out_THD, k_out_TKD
