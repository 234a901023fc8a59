"""qkv_gate_gemm/flat_gemv at T = 3 and 8 (swap_ab's MMA path): narrow row tiles (16-32 rows of W per
program on 1-2 warps, 448-896 programs, the GEMV's many-programs shape) and wider K blocks, forced in turn
beside the shipped configs, the autotuned pick and cuBLAS, timed as CUDA-graph replays (20 calls x 10
replays, median of 3 rounds, 3 rotated 147 MB weights) in one process.
Usage (repository root): python qkv_tile_sweep.py OUT.jsonl"""
import importlib.util
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

out = open(sys.argv[1], "w")


def emit(**kw):
    print(json.dumps(kw), flush=True)
    out.write(json.dumps(kw) + "\n")
    out.flush()


def graph_us(fn, calls=20, replays=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


spec = importlib.util.spec_from_file_location("flat_gemv", "candidate_kernels/qkv_gate_gemm/flat_gemv.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
shipped = m._qkv_kernel.configs
TILES = [  # (BLOCK_N, BLOCK_K, stages, warps)
    (64, 128, 4, 4), (128, 128, 4, 4),  # the shipped picks at T = 1..3 and 8
    (16, 128, 4, 1), (16, 256, 3, 1), (16, 256, 4, 1), (16, 512, 2, 1), (16, 512, 3, 1), (16, 1024, 2, 1),
    (32, 128, 4, 1), (32, 256, 3, 1), (32, 256, 4, 2), (32, 512, 2, 2), (32, 512, 3, 2), (32, 1024, 2, 2),
    (64, 256, 3, 2), (64, 256, 4, 4), (64, 512, 2, 4), (64, 512, 3, 4),
]
dev = torch.device("cuda")
N, D, NW = 14336, 5120, 3
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
i = [0]


def rot():
    i[0] = (i[0] + 1) % NW
    return i[0]


for T in (3, 8):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NW)]
    ref = xs[0].double() @ ws[0].double().T
    m._qkv_kernel.configs = shipped
    m.qkv_gate_proj(xs[0], ws[0])
    emit(T=T, what="baselines", autotuned=str(m._qkv_kernel.best_config),
         autotuned_us=statistics.median(graph_us(lambda xs=xs: m.qkv_gate_proj(xs[i[0]], ws[rot()])) for _ in range(3)),
         cublas_us=statistics.median(graph_us(lambda xs=xs: F.linear(xs[i[0]], ws[rot()])) for _ in range(3)))
    rows = []
    for n, k, s, w in TILES:
        cfg = triton.Config({"BLOCK_N": n, "BLOCK_T": 8, "BLOCK_K": k, "GROUP_T": 1, "TMA": False, "PROGRAMS_PER_SM": 0},
                            num_stages=s, num_warps=w)
        m._qkv_kernel.configs = [cfg]
        try:
            err = ((m.qkv_gate_proj(xs[0], ws[0]).double() - ref).norm() / ref.norm()).item()
            us = statistics.median(graph_us(lambda xs=xs: m.qkv_gate_proj(xs[i[0]], ws[rot()])) for _ in range(3))
            rows.append((us, (n, k, s, w), err))
        except Exception as ex:
            emit(T=T, what="failed", tile=(n, k, s, w), error=f"{type(ex).__name__}: {str(ex)[:200]}")
    for us, tile, err in sorted(rows):
        emit(T=T, what="tile", us=round(us, 3), n_k_stages_warps=tile, rel_err_fp64=err)
    m._qkv_kernel.configs = shipped
