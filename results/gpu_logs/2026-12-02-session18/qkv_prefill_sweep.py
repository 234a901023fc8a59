"""qkv_gate_gemm prefill sweep: Triton TMA GEMMs in the plain orientation (tokens as M, W rows as N)
against cuBLAS (F.linear) at Beam's T = 1000 (and 512, 2048), timed as CUDA-graph replays of 10
launches on 4 rotating input sets, median of 30 replays. Prints one JSON line per measurement.

    python .gpu/qkv_prefill_sweep.py [T ...]          (CPU: TRITON_INTERPRET=1, tiny shapes, parity only)
"""

import json
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tile_of(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % group) % rows, (tile % group) // rows


@triton.jit
def _gemm(x_ptr, w_ptr, out_ptr, M, N, K, NUM_PROGRAMS, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          GROUP_M: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in tl.range(0, k_tiles, num_stages=STAGES):
            a = a_desc.load([pid_m * BM, kt * BK])
            b = b_desc.load([pid_n * BN, kt * BK])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def _scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def gemm(x, w, out, cfg, num_sms):
    BM, BN, BK, stages, warps, group_m, persistent = cfg
    M, K = x.shape
    N = w.shape[0]
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    programs = min(tiles, num_sms * persistent) if persistent else tiles
    _gemm[(programs,)](x, w, out, M, N, K, programs, BM=BM, BN=BN, BK=BK, GROUP_M=group_m, STAGES=stages,
                       num_warps=warps, num_stages=stages)  # fmt: skip
    return out


CONFIGS = [  # (BM, BN, BK, stages, warps, GROUP_M, persistent programs per SM or 0)
    (128, 256, 64, 3, 8, 8, 0),
    (128, 128, 64, 4, 4, 8, 0),
    (128, 256, 64, 3, 8, 8, 1),
    (128, 256, 64, 3, 8, 16, 1),
    (128, 256, 64, 3, 8, 4, 1),
    (128, 256, 64, 3, 8, 1, 1),
    (128, 256, 32, 5, 8, 8, 1),
    (128, 128, 64, 4, 4, 8, 1),
    (128, 128, 64, 4, 4, 16, 1),
    (128, 128, 64, 3, 4, 8, 1),
    (128, 128, 64, 5, 4, 8, 1),
    (128, 128, 64, 6, 4, 8, 1),
    (128, 128, 64, 4, 8, 8, 1),
    (128, 128, 64, 4, 8, 16, 1),
    (256, 128, 64, 3, 8, 8, 1),
    (64, 256, 64, 4, 4, 8, 1),
    (128, 64, 64, 4, 4, 8, 1),
    (128, 128, 64, 3, 4, 8, 2),
]


def capture(fn_list):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fn_list:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fn_list:
            f()
    return g, len(fn_list)


def interleaved_us(graphs, rounds=25):
    """Replays each graph in turn, `rounds` times (the clocks drift under a sustained GEMM: every
    implementation sees the same drift); median and min per launch of each."""
    for g, _ in graphs:
        g.replay()
    torch.cuda.synchronize()
    times = [[] for _ in graphs]
    for _ in range(rounds):
        for (g, n), t in zip(graphs, times):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            t.append(e0.elapsed_time(e1) * 1000 / n)
    return [(statistics.median(t), min(t)) for t in times]


def main():
    if INTERPRET:
        from harness import interpreter_patches  # the interpreter's BF16 dot needs the harness's patch

        interpreter_patches.apply()
        torch.manual_seed(0)
        for M, N, K in ((70, 192, 96), (130, 320, 200)):
            x = torch.randn(M, K).bfloat16()
            w = (torch.randn(N, K) / K**0.5).bfloat16()
            want = (x.double() @ w.double().T)
            for cfg in [(64, 64, 32, 2, 4, 2, 0), (64, 128, 64, 2, 4, 1, 1), (32, 64, 32, 2, 4, 3, 2)]:
                out = torch.empty(M, N, dtype=torch.bfloat16)
                gemm(x, w, out, cfg, num_sms=3)
                err = (out.double() - want).abs().max().item()
                print(json.dumps({"M": M, "cfg": cfg, "max_abs_err": err}))
                assert err < 0.05, err
        return
    triton.set_allocator(_scratch)
    Ts = [int(t) for t in sys.argv[1:]] or [1000]
    dev = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    N, K = 14336, 5120
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [(torch.randn(N, K, device=dev, generator=gen) / K**0.5).bfloat16() for _ in range(4)]
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(json.dumps(info), flush=True)
    for T in Ts:
        xs = [torch.randn(T, K, device=dev, generator=gen).bfloat16() for _ in range(4)]
        outs = [torch.empty(T, N, dtype=torch.bfloat16, device=dev) for _ in range(4)]
        ref = torch.nn.functional.linear(xs[0], ws[0]).float()
        flops = 2 * T * N * K
        cublas = capture([(lambda i=i: torch.nn.functional.linear(xs[i % 4], ws[i % 4])) for i in range(10)])
        (c1, _), (c2, _) = interleaved_us([cublas, capture([(lambda i=i: torch.nn.functional.linear(xs[i % 4], ws[i % 4]))
                                                             for i in range(10)])])
        print(json.dumps({"T": T, "impl": "cublas_vs_cublas", "p50_us": [round(c1, 2), round(c2, 2)]}), flush=True)
        for cfg in CONFIGS:
            t0 = time.time()
            try:
                gemm(xs[0], ws[0], outs[0], cfg, num_sms)
                torch.cuda.synchronize()
                err = (outs[0].float() - ref).abs().max().item()
                mine = capture([(lambda i=i: gemm(xs[i % 4], ws[i % 4], outs[i % 4], cfg, num_sms)) for i in range(10)])
                (cb, _), (p50, mn) = interleaved_us([cublas, mine])
                row = {"T": T, "cfg": cfg, "p50_us": round(p50, 2), "min_us": round(mn, 2), "cublas_p50_us": round(cb, 2),
                       "tflops": round(flops / p50 / 1e6, 1), "vs_cublas": round(cb / p50, 3),
                       "max_abs_diff_vs_cublas": err, "wall_s": round(time.time() - t0, 1)}  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not the end
                row = {"T": T, "cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
