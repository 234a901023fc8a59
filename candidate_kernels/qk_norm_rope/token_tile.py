"""qk_norm_rope: one program per token, its query AND key heads stacked in one tile, ONE kernel.

Author: human (kernels team, issue 4), hand-written. Alternative to head_groups.py (which spreads
a token over several programs, queries and keys in separate code paths).

Why it should be fast: a token's H + K = 56 heads (48 query, 8 key) fit one [64, Dh/2] x 2 tile
with 12.5% padding, so one program per token normalizes and rotates all of them in the same
instructions, reads the token's position, slot and cos|sin row once, and writes q', k', and the
cache rows of k' and v. There is no role branch, and every program does the same work: at
T = 16384 the 16384 programs are uniform; at T = 1 one program is one load round trip deep.
Rows past H select the key pointers, the key norm weight and (global layers) a scale of exactly
1, so keys come out as k_n bit for bit.

Floor (bytes / 4275 GB/s; per token q 2x12 KB, k 3x2 KB, v 2x2 KB, one table row 512 B or 4 B):
  T=1      35 KB  -> 0.01 us: latency bound, the floor is the launch (~2 us graph replay)
  T=16384  sliding 579 MB -> 135.4 us (goal <= 140 us); global 571 MB -> 133.5 us (goal <= 135 us)
Measured on the H200 (second session, commit 2a30055): parity clean on every shape (0-1 ulp), but recorded as a sandbox
  violation before its benchmark: it read its own compiled kernel through a Triton group file that
  named the parity child's path (a harness fault, fixed in 37efa3e). Not timed yet.

Numerics (reference_model/ops.py qk_norm_rope), identical to head_groups.py:
  q_n = bf16((q * rsqrt(mean(q^2) + eps)) * w_q), k_n likewise          rounding point 1
  sliding: q' = bf16(rope(f32(q_n))), k' = bf16(rope(f32(k_n)))        rounding point 2
  global:  q' = bf16(f32(q_n) * ssmax[pos]), k' = bf16(f32(k_n) * 1) = k_n
torch's operation order (each rotation product rounded to FP32, then the add: the kernel is
launched with enable_fp_fusion=False); mean(x^2) from the exact sum of squares (FP64:
order-independent, correctly rounded; head_groups.py says why); libdevice rsqrt on the GPU
(tl.rsqrt under the interpreter). Slot -1: the token's cache writes are skipped.

Launch: grid = T programs; num_warps autotuned per (H, K, Dh, variant, T bucket; T <= 64 timed as
CUDA-graph replays, _time_config). The tile is
[next_pow2(H + K), Dh/2] per half; a half-row of 64 BF16 spans 8 threads, so each head's norm
reduces inside a warp. Requires unit stride along Dh for q and k (true of projection outputs and
their views), so that rows from either tensor are 16-byte vectors.

Shape legend: T tokens, H query heads, K kv heads, Dh head dim, R stacked head rows (H + K, padded).
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
    "idea": "one program per token: query and key heads stacked in one tile, one code path, cache written in place",
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
        return [triton.Config({}, num_warps=4)]
    # 2 warps would hold 64 elements of the stacked tile per thread: 255 registers and spills.
    return [triton.Config({}, num_warps=w) for w in (4, 8, 16)]


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
    key=["N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM", "IS_ROPE", "rows_bucket"],
    do_bench=_time_config,
    cache_results=True,
)
@triton.jit
def _qk_token_kernel(
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
    stride_k_t,
    stride_k_h,
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
    ROWS: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    IS_ROPE: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    token = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF_BLOCK)
    d_mask = d < HALF

    # Stacked rows: 0..H-1 the query heads, H..H+K-1 the key heads, the rest padding.
    r = tl.arange(0, ROWS)
    is_q = r < N_Q_HEADS
    kh = tl.where(is_q, 0, r - N_Q_HEADS)  # key head of a key row (0 elsewhere, never used)
    is_k = (r >= N_Q_HEADS) & (r < N_Q_HEADS + N_KV_HEADS)
    mask = (is_q | is_k)[:, None] & d_mask[None, :]
    src = tl.where(is_q, q_ptr + token * stride_q_t + r * stride_q_h, k_ptr + token * stride_k_t + kh * stride_k_h)
    x1 = tl.load(src[:, None] + d[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    x2 = tl.load(src[:, None] + HALF + d[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    x2 = x2.to(tl.float32)

    pos = tl.load(pos_ptr + token).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)

    # Per-head RMSNorm with the query or the key weight (rounding point 1). Masked lanes hold 0.
    qw1 = tl.load(q_w_ptr + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    qw2 = tl.load(q_w_ptr + HALF + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    kw1 = tl.load(k_w_ptr + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    kw2 = tl.load(k_w_ptr + HALF + d, mask=d_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    w1 = tl.where(is_q[:, None], qw1[None, :], kw1[None, :])
    w2 = tl.where(is_q[:, None], qw2[None, :], kw2[None, :])
    # mean(x^2) from the EXACT sum of squares (BF16 squares are exact in FP32, their sum exact in
    # FP64): the correctly rounded FP32 mean, the same bits in any summation order.
    sum_sq = tl.sum((x1 * x1).to(tl.float64), axis=1) + tl.sum((x2 * x2).to(tl.float64), axis=1)
    inv_rms = _rsqrt((sum_sq / HEAD_DIM).to(tl.float32) + eps)[:, None]
    a = (x1 * inv_rms * w1).to(tl.bfloat16).to(tl.float32)
    b = (x2 * inv_rms * w2).to(tl.bfloat16).to(tl.float32)

    if IS_ROPE:
        # rotate-half RoPE on queries and keys alike; products rounded to FP32 before the add.
        row_ptr = cos_sin_ptr + pos * stride_cs_p
        cos = tl.load(row_ptr + d * stride_cs_d, mask=d_mask, other=0.0)[None, :]
        sin = tl.load(row_ptr + (HALF + d) * stride_cs_d, mask=d_mask, other=0.0)[None, :]
        o1 = (a * cos - b * sin).to(tl.bfloat16)  # rounding point 2
        o2 = (b * cos + a * sin).to(tl.bfloat16)
    else:
        # SSMax scales the queries; keys get a factor of exactly 1 (bf16(f32(k_n) * 1) == k_n).
        factor = tl.where(is_q, tl.load(ssmax_ptr + pos), 1.0)[:, None]
        o1 = (a * factor).to(tl.bfloat16)
        o2 = (b * factor).to(tl.bfloat16)

    dst = tl.where(
        is_q,
        q_out_ptr + (token * N_Q_HEADS + r) * HEAD_DIM,
        k_out_ptr + (token * N_KV_HEADS + kh) * HEAD_DIM,
    )
    tl.store(dst[:, None] + d[None, :], o1, mask=mask)
    tl.store(dst[:, None] + HALF + d[None, :], o2, mask=mask)

    # k' into the cache row of this token's slot (slot -1: not kept, skipped).
    keep_k = is_k[:, None] & d_mask[None, :] & (slot >= 0)
    kc = k_cache_ptr + slot * stride_kc_s + kh[:, None] * stride_kc_h
    tl.store(kc + d[None, :] * stride_kc_d, o1.to(k_cache_ptr.dtype.element_ty), mask=keep_k)
    tl.store(kc + (HALF + d[None, :]) * stride_kc_d, o2.to(k_cache_ptr.dtype.element_ty), mask=keep_k)

    # v copied into its cache row.
    vh = tl.arange(0, KV_BLOCK)
    dv = tl.arange(0, 2 * HALF_BLOCK)
    keep_v = (vh < N_KV_HEADS)[:, None] & (dv < HEAD_DIM)[None, :] & (slot >= 0)
    v = tl.load(
        v_ptr + token * stride_v_t + vh[:, None] * stride_v_h + dv[None, :] * stride_v_d,
        mask=keep_v,
        other=0.0,
        eviction_policy="evict_first",
    )
    vc = v_cache_ptr + slot * stride_vc_s + vh[:, None] * stride_vc_h + dv[None, :] * stride_vc_d
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=keep_v)


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
    if q_THD.stride(2) != 1 or k_TKD.stride(2) != 1:
        raise ValueError(
            f"q and k need unit stride along Dh (this kernel stacks their rows); got strides "
            f"{q_THD.stride()} and {k_TKD.stride()}"
        )
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
    _tuning_rows[0] = _rows_bucket(T)
    _qk_token_kernel[(T,)](
        q_THD,
        k_TKD,
        v_TKD,
        q_norm_weight.contiguous(),
        k_norm_weight.contiguous(),
        positions_T,
        slot_mapping_T,
        k_cache_SKD,
        v_cache_SKD,
        rope_cos_sin_PD if is_rope else None,
        None if is_rope else ssmax_scale_P.contiguous(),
        q_out_THD,
        k_out_TKD,
        q_THD.stride(0),
        q_THD.stride(1),
        k_TKD.stride(0),
        k_TKD.stride(1),
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
        ROWS=triton.next_power_of_2(H + K),
        KV_BLOCK=triton.next_power_of_2(K),
        IS_ROPE=is_rope,
        enable_fp_fusion=False,
    )
    return q_out_THD, k_out_TKD
