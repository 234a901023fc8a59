"""qkv_gate_gemm at T = 1, 3, 8: swap_ab's decode kernel (plain loads, cp.async ring, W rows on the MMA's
M side) with a cache policy on the weight's loads, forced over swap_ab's ten decode configs and three more.
Policies: 0 none (swap_ab as shipped), 1 evict_first (what the flat GEMV's T = 1 sweep preferred by 0.2 us),
2 evict_first with .cg (L2 only). Beside them: swap_ab's autotuned pick, cuBLAS and a plain read of the
weight. Timed by the harness's own timer (harness/bench.py: CUDA-graph windows of 100 calls, all
implementations of a T interleaved, p20/p50/p80 over the samples) over 3 rotated 147 MB weights.
Usage (repository root): python qkv_evict_sweep.py OUT.jsonl"""

import importlib.util
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from harness import bench

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


@triton.jit
def _read(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(part_ptr + tl.program_id(0), tl.sum(v.to(tl.float32)))


@triton.jit
def _decode(x_ptr, w_ptr, out_ptr, T, N, D, num_sms, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
            BLOCK_K: tl.constexpr, PROGRAMS_PER_SM: tl.constexpr, POLICY: tl.constexpr):
    # swap_ab's plain-load decode path (GROUP_T = 1, one token tile), W's loads under POLICY.
    pid = tl.program_id(0)
    if PROGRAMS_PER_SM == 0:
        rows = BLOCK_N
    else:
        rows = tl.minimum(tl.cdiv(N, PROGRAMS_PER_SM * num_sms), BLOCK_N)
    n0 = pid * rows
    n_end = tl.minimum(n0 + rows, N)
    acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * D
    x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * D
    for k0 in range(0, D, BLOCK_K):
        k = k0 + offs_k
        w_mask = (offs_n < n_end)[:, None] & (k < D)[None, :]
        if POLICY == 0:
            w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0)
        elif POLICY == 1:
            w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first",
                        cache_modifier=".cg")
        x = tl.load(x_rows + k[None, :], mask=(offs_t < T)[:, None] & (k < D)[None, :], other=0.0)
        acc = tl.dot(w, x.T, acc)
    out_ptrs = out_ptr + offs_t.to(tl.int64)[None, :] * N + offs_n[:, None]
    tl.store(out_ptrs, acc.to(tl.bfloat16), mask=(offs_n < n_end)[:, None] & (offs_t < T)[None, :])


SMS = torch.cuda.get_device_properties(0).multi_processor_count


def decode(x, w, cfg, policy):
    n, k, s, warps, p = cfg
    T, D = x.shape
    N = w.shape[0]
    o = torch.empty((T, N), device=x.device, dtype=torch.bfloat16)
    rows = min(triton.cdiv(N, p * SMS), n) if p else n
    _decode[(triton.cdiv(N, rows),)](x, w, o, T, N, D, SMS, BLOCK_N=n, BLOCK_T=8, BLOCK_K=k, PROGRAMS_PER_SM=p,
                                     POLICY=policy, num_stages=s, num_warps=warps)
    return o


spec = importlib.util.spec_from_file_location("swap_ab", "candidate_kernels/qkv_gate_gemm/swap_ab.py")
sab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sab)
DECODE = [(64, 128, 4, 4, 0), (128, 128, 4, 4, 0), (128, 128, 5, 4, 0), (128, 128, 4, 8, 0), (128, 256, 3, 4, 0),
          (128, 64, 6, 4, 0), (128, 128, 4, 4, 1), (128, 128, 4, 8, 1), (128, 256, 3, 4, 1), (64, 128, 4, 4, 2),
          (64, 128, 6, 4, 0), (64, 64, 8, 4, 0), (64, 128, 5, 4, 2)]

dev = torch.device("cuda")
N, D, NW = 14336, 5120, 3
SETTINGS = bench.BenchSettings(samples=15, min_samples=5, max_seconds=1.0)
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
parts = torch.empty(triton.cdiv(N * D, 4096), device=dev)


def read(x, w):
    _read[(parts.numel(),)](w, parts, N * D, BLOCK=4096, num_warps=4)
    return parts


for T in (8, 3, 1):
    sets = [{"x": torch.randn(T, D, device=dev).to(torch.bfloat16), "w": w} for w in ws]
    want = F.linear(sets[0]["x"], ws[0]).float()
    impls = {"read": read, "cublas": lambda x, w: F.linear(x, w), "swap_ab": lambda x, w: sab.qkv_gate_proj(x, w)}
    for cfg in DECODE:
        for policy in (0, 1, 2):
            impls[f"{cfg}/{policy}"] = lambda x, w, cfg=cfg, policy=policy: decode(x, w, cfg, policy)
    timers, diffs = [], {}
    for name, fn in impls.items():
        try:
            if name != "read":
                diffs[name] = (fn(**sets[0]).float() - want).abs().max().item()
            timers.append(bench.make_timer(name, fn, sets, True, SETTINGS, None))
        except Exception as ex:
            emit(T=T, what="failed", impl=name, error=f"{type(ex).__name__}: {str(ex)[:200]}")
    emit(T=T, what="swap_ab_pick", config=str(sab._qkv_kernel.best_config))
    results = bench.time_interleaved(timers, SETTINGS)
    rows = sorted(((r.p50_us, name, r) for name, r in results.items() if not isinstance(r, str)))
    for p50, name, r in rows:
        emit(T=T, impl=name, p20=round(r.p20_us, 3), p50=round(p50, 3), p80=round(r.p80_us, 3),
             max_abs_diff_vs_cublas=diffs.get(name))
    for name, r in results.items():
        if isinstance(r, str):
            emit(T=T, impl=name, failed=r)
