"""qk_norm_rope: head_groups with every gather issued before the first reduction (one latency, not two).

Author: human (kernels team, issue 4), hand-written. Child of head_groups.py: the same kernel, the
same programs, the same arithmetic in the same order; only where the loads stand changes.

Why it should be faster at T = 16384: head_groups' programs are small (one token's 8-32 heads, a few
KB in and out), its occupancy is held at 37.5% by 80 registers (Nsight Compute, sixth session), so
the kernel's bandwidth is the bytes each resident program has in flight divided by how long it
waits. In head_groups a sliding-layer program loads q (or k and v), reduces each head's sum of
squares, and only then loads the RoPE row cos|sin of its position (`_norm_and_position`): two
memory latencies in a row, the second one a gather from a 64 MB table that misses L2 for the first
of the token's programs. The global variant, whose one SSMax scale is loaded next to q, ran 148.70
us against the sliding one's 169.09 on nearly the same bytes (571 against 579 MB; tenth session).
Here every program issues all of its loads first (q or k and v, the norm weights, the position's
table row or scale; the row address needs the position, itself loaded first), then reduces: the
gather's latency overlaps q's.

Floor (bytes / 4275 GB/s; per token q 2x12 KB, k 3x2 KB, v 2x2 KB, one table row 512 B or 4 B):
  T=1      35 KB  -> 0.01 us: latency bound, the floor is the launch
  T=16384  sliding 579 MB -> 135.4 us (goal <= 140 us); global 571 MB -> 133.5 us (goal <= 135 us)
Not yet measured on a GPU.

Numerics: identical to head_groups.py, whose header gives them in full (reference_model/ops.py
qk_norm_rope, BEAM.md §3): q_n = bf16((q * rsqrt(mean(q^2) + eps)) * w_q), k_n likewise (rounding
point 1), mean(x^2) the correctly rounded FP32 mean of the exact FP64 sum of the exact FP32 squares;
sliding q' = bf16(rope(f32(q_n))) with rotate-half [x1*cos - x2*sin, x2*cos + x1*sin], each product
rounded to FP32 before the add (enable_fp_fusion=False); global q' = bf16(f32(q_n) * ssmax[pos]),
k' = k_n (rounding point 2); libdevice rsqrt on the GPU, tl.rsqrt under the interpreter. The caches
receive exactly the returned k' and the input v; slot -1 skips a token's cache write.

Launch: as head_groups: a 1-D grid of T x (cdiv(H, Q_HEADS) + 1) programs, token-major; the last
program of a token does the K heads, the V copy and the cache writes; heads as rotate-half halves
([heads, Dh/2] tiles), so a head's norm is a reduction inside one warp. Q_HEADS and num_warps are
autotuned per (H, K, Dh, variant, T bucket), buckets of T <= 64 timed as CUDA-graph replays.

Shape legend: T tokens, H query heads, K kv heads, Dh head dim, S cache slots, P table positions.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CANDIDATE = {
    "author": "human",
    "model": None,
    "parent": "head_groups",
    "idea": "head_groups with every gather (RoPE row, SSMax scale, norm weights) issued before the first "
    "reduction, so the table's latency overlaps q's",
}

# TRITON_INTERPRET is read when kernels are decorated; the interpreter has no libdevice and runs
# one config only (no autotuning), so both choices are made here, once, at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if _INTERPRET:

    @triton.jit
    def _rsqrt(x):
        return tl.rsqrt(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        # Beam's 48 heads in two groups (the second half masked), beam-tiny's 4 in one masked group.
        return [triton.Config({"Q_HEADS": 32}, num_warps=1)]
    shapes = ((8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8))
    return [triton.Config({"Q_HEADS": heads}, num_warps=warps) for heads, warps in shapes]


def _prune(configs, named_args, **kwargs):
    """Drop head groups larger than next_pow2(H): they would only add masked heads."""
    n_heads = kwargs["N_Q_HEADS"]
    fit = [c for c in configs if c.kwargs["Q_HEADS"] <= triton.next_power_of_2(n_heads)]
    return fit or [min(configs, key=lambda c: c.kwargs["Q_HEADS"])]


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


@triton.jit
def _table_and_weights(w_ptr, d, d_mask, cos_sin_row_ptr, stride_cs_d, HALF: tl.constexpr, IS_ROPE: tl.constexpr):
    """The norm weight halves and, on sliding layers, the position's cos and sin halves (FP32), loaded
    by the caller before it reduces anything. On global layers cos and sin are unused zeros."""
    # The norm weights are re-read by every program on the SM: keep them in L1 (evict_last).
    w1 = tl.load(w_ptr + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    w2 = tl.load(w_ptr + HALF + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    cos = tl.zeros_like(w1)
    sin = tl.zeros_like(w1)
    if IS_ROPE:
        cos = tl.load(cos_sin_row_ptr + d * stride_cs_d, mask=d_mask, other=0.0)
        sin = tl.load(cos_sin_row_ptr + (HALF + d) * stride_cs_d, mask=d_mask, other=0.0)
    return w1, w2, cos, sin


@triton.jit
def _norm_and_position(
    x1, x2, w1, w2, cos, sin, scale, eps, HALF: tl.constexpr, IS_ROPE: tl.constexpr, SCALE: tl.constexpr
):  # fmt: skip
    """One tile of heads given as their halves x1 = x[..., :Dh/2], x2 = x[..., Dh/2:] (FP32), with
    the weight, cos and sin halves already loaded: RMSNorm per head (rounding point 1), then RoPE,
    the SSMax scale (SCALE) or nothing (rounding point 2). Returns the two BF16 halves."""
    # Masked lanes (d >= Dh/2, or heads past the last) hold 0 and add nothing to the sums.
    # mean(x^2) from the EXACT sum of squares (BF16 squares are exact in FP32, their sum exact in
    # FP64): the correctly rounded FP32 mean, the same bits in any summation order.
    sum_sq = tl.sum((x1 * x1).to(tl.float64), axis=1) + tl.sum((x2 * x2).to(tl.float64), axis=1)
    inv_rms = _rsqrt((sum_sq / (2 * HALF)).to(tl.float32) + eps)[:, None]
    n1 = (x1 * inv_rms * w1[None, :]).to(tl.bfloat16)
    n2 = (x2 * inv_rms * w2[None, :]).to(tl.bfloat16)
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
def _query_program(
    q_ptr, q_w_ptr, ssmax_ptr, q_out_ptr, cos_sin_row_ptr, stride_cs_d, token, pos, group,
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
    # Every other load now, before the first reduction waits for q.
    if IS_ROPE:
        scale = 1.0
    else:
        scale = tl.load(ssmax_ptr + pos)  # SSMax scales queries only: (1 + p/2048)^0.1 from the table
    w1, w2, cos, sin = _table_and_weights(q_w_ptr, d, d_mask, cos_sin_row_ptr, stride_cs_d, HALF, IS_ROPE)
    o1, o2 = _norm_and_position(q1, q2, w1, w2, cos, sin, scale, eps, HALF, IS_ROPE, True)
    out_row = q_out_ptr + (token * N_Q_HEADS + heads[:, None]) * HEAD_DIM
    tl.store(out_row + d[None, :], o1, mask=mask)
    tl.store(out_row + HALF + d[None, :], o2, mask=mask)


@triton.jit
def _key_value_program(
    k_ptr, v_ptr, k_w_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, k_out_ptr, cos_sin_row_ptr, stride_cs_d,
    token, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d,
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
    v1 = tl.load(v_row + d[None, :] * stride_v_d, mask=keep, other=0.0, eviction_policy="evict_first")
    v2 = tl.load(v_row + (HALF + d[None, :]) * stride_v_d, mask=keep, other=0.0, eviction_policy="evict_first")
    # Every other load now, before the first reduction waits for k.
    w1, w2, cos, sin = _table_and_weights(k_w_ptr, d, d_mask, cos_sin_row_ptr, stride_cs_d, HALF, IS_ROPE)
    # Keys are rotated on sliding layers and never scaled (SSMax scales queries only).
    o1, o2 = _norm_and_position(k1, k2, w1, w2, cos, sin, 1.0, eps, HALF, IS_ROPE, False)
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
    key=["N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM", "IS_ROPE", "rows_bucket"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_w_ptr,
    k_w_ptr,
    pos_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cos_sin_ptr,
    ssmax_ptr,
    q_out_ptr,
    k_out_ptr,
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
    HALF_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    IS_ROPE: tl.constexpr,
    Q_HEADS: tl.constexpr,
):
    N_Q_GROUPS: tl.constexpr = (N_Q_HEADS + Q_HEADS - 1) // Q_HEADS
    pid = tl.program_id(0)
    token = (pid // (N_Q_GROUPS + 1)).to(tl.int64)
    group = pid % (N_Q_GROUPS + 1)

    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos_sin_row_ptr = cos_sin_ptr
    if IS_ROPE:
        cos_sin_row_ptr = cos_sin_ptr + pos * stride_cs_p

    if group < N_Q_GROUPS:
        _query_program(
            q_ptr, q_w_ptr, ssmax_ptr, q_out_ptr, cos_sin_row_ptr, stride_cs_d, token, pos, group,
            stride_q_t, stride_q_h, stride_q_d, eps,
            N_Q_HEADS, HEAD_DIM, HALF_BLOCK, Q_HEADS, IS_ROPE,
        )  # fmt: skip
    else:
        _key_value_program(
            k_ptr, v_ptr, k_w_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, k_out_ptr, cos_sin_row_ptr, stride_cs_d,
            token, stride_k_t, stride_k_h, stride_k_d, stride_v_t, stride_v_h, stride_v_d,
            stride_kc_s, stride_kc_h, stride_kc_d, stride_vc_s, stride_vc_h, stride_vc_d, eps,
            N_KV_HEADS, HEAD_DIM, HALF_BLOCK, KV_BLOCK, IS_ROPE,
        )  # fmt: skip


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
    table = rope_cos_sin_PD if is_rope else ssmax_scale_P

    def grid(meta):
        return (T * (triton.cdiv(H, meta["Q_HEADS"]) + 1),)

    _tuning_rows[0] = _rows_bucket(T)
    _qk_norm_rope_kernel[grid](
        q_THD,
        k_TKD,
        v_TKD,
        q_norm_weight.contiguous(),
        k_norm_weight.contiguous(),
        positions_T,
        slot_mapping_T,
        k_cache_SKD,
        v_cache_SKD,
        table if is_rope else None,
        None if is_rope else table.contiguous(),
        q_out_THD,
        k_out_TKD,
        *q_THD.stride(),
        *k_TKD.stride(),
        *v_TKD.stride(),
        *k_cache_SKD.stride(),
        *v_cache_SKD.stride(),
        *(rope_cos_sin_PD.stride() if is_rope else (0, 0)),
        eps,
        _rows_bucket(T),
        N_Q_HEADS=H,
        N_KV_HEADS=K,
        HEAD_DIM=Dh,
        HALF_BLOCK=triton.next_power_of_2(Dh // 2),
        KV_BLOCK=triton.next_power_of_2(K),
        IS_ROPE=is_rope,
        enable_fp_fusion=False,
    )
    return q_out_THD, k_out_TKD
