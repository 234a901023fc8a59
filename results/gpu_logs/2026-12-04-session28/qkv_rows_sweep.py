"""qkv_gate_gemm at T = 8: flat_gemv's MMA ring (swap_ab's kernel) forced to few rows of W per program and long
K blocks, so that each program streams whole rows in 1-2 KB pieces (qkv_split_diag.py: loads of 32-64 rows x
512-1024 bytes, one-shot, took 37.8-41.5 us where the flat GEMV's whole rows take 34.4), beside the autotuned pick
and cuBLAS, timed as CUDA-graph replays (20 calls x 10 replays, median of 3 rounds, 3 rotated 147 MB weights).
Usage (repository root): python qkv_rows_sweep.py OUT.jsonl"""
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


def timed(fn):
    return round(statistics.median(graph_us(fn) for _ in range(3)), 3)


spec = importlib.util.spec_from_file_location("flat_gemv", "candidate_kernels/qkv_gate_gemm/flat_gemv.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
shipped = m._qkv_kernel.configs
TILES = [  # (BLOCK_N, BLOCK_K, stages, warps)
    (128, 128, 4, 4),  # the shipped pick at T = 8
    (16, 512, 3, 4), (16, 512, 4, 4), (16, 1024, 2, 4), (16, 1024, 3, 4), (16, 1024, 2, 8), (16, 2048, 2, 4),
    (16, 512, 4, 2), (16, 1024, 3, 2),
    (8, 1024, 3, 4), (8, 1024, 4, 4), (8, 2048, 2, 4), (8, 2048, 3, 4), (8, 1024, 3, 2),
    (32, 512, 3, 4), (32, 512, 4, 4), (32, 1024, 2, 4), (32, 1024, 3, 8),
]
dev = torch.device("cuda")
N, D, NW, T = 14336, 5120, 3, 8
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
ws = [torch.randn(N, D, device=dev, dtype=torch.bfloat16) / D**0.5 for _ in range(NW)]
xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NW)]
i = [0]


def rot():
    i[0] = (i[0] + 1) % NW
    return i[0]


ref = xs[0].double() @ ws[0].double().T
m.qkv_gate_proj(xs[0], ws[0])
emit(T=T, what="baselines", autotuned=str(m._qkv_kernel.best_config),
     autotuned_us=timed(lambda: m.qkv_gate_proj(xs[i[0]], ws[rot()])),
     cublas_us=timed(lambda: F.linear(xs[i[0]], ws[rot()])))  # fmt: skip
rows = []
for n, k, s, w in TILES:
    cfg = triton.Config({"BLOCK_N": n, "BLOCK_T": 8, "BLOCK_K": k, "GROUP_T": 1, "TMA": False, "PROGRAMS_PER_SM": 0},
                        num_stages=s, num_warps=w)  # fmt: skip
    m._qkv_kernel.configs = [cfg]
    try:
        err = ((m.qkv_gate_proj(xs[0], ws[0]).double() - ref).norm() / ref.norm()).item()
        rows.append((timed(lambda: m.qkv_gate_proj(xs[i[0]], ws[rot()])), (n, k, s, w), round(err, 7)))
    except Exception as ex:
        emit(T=T, what="failed", tile=(n, k, s, w), error=f"{type(ex).__name__}: {str(ex)[:200]}")
for us, tile, err in sorted(rows):
    emit(T=T, what="tile", us=us, n_k_stages_warps=tile, rel_err_fp64=err)
m._qkv_kernel.configs = shipped
emit(T=T, what="baselines_again", cublas_us=timed(lambda: F.linear(xs[i[0]], ws[rot()])))
