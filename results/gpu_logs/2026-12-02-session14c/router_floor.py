"""router_gemm floor study: what the H200 gives for one pass over the router's FP32 weight (256 x 5120,
5.24 MB) as CUDA-graph replays (20 calls per graph, 10 replays, median of 3 rounds; 16 rotated weights,
84 MB, past the L2), beside the promoted splitk_bf16x3 (autotuned), cuBLAS FP32 GEMM (the reference's
op) and cuBLAS GEMV, all in one process.
  - empty: one program that stores one float (the per-call cost of a graph node that does nothing);
  - read P/BLOCK/warps: P programs, each summing a contiguous 1/P of W with every load issued up
    front (static unroll), one float out per program: the read a GEMV at T = 1 cannot beat.
Usage: router_floor.py OUT.jsonl"""
import importlib.util
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

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
    return statistics.median(graph_us(fn) for _ in range(3))


@triton.jit
def _empty(out_ptr):
    tl.store(out_ptr, 1.0)


@triton.jit
def _read(w_ptr, out_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = w_ptr + pid.to(tl.int64) * CHUNK
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(CHUNK // BLOCK):
        acc += tl.load(base + i * BLOCK + offs)
    tl.store(out_ptr + pid, tl.sum(acc))


torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
E, D, NX = 256, 5120, 16
N = E * D
ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
sink = torch.empty(4096, device=dev)
i = [0]


def nxt():
    i[0] = (i[0] + 1) % NX
    return i[0]


emit(what="empty", us=timed(lambda: _empty[(1,)](sink)))
emit(what="torch.sum", us=timed(lambda: torch.sum(ws[nxt()])))
for P in (128, 160, 256, 320, 512, 640, 1024, 1280, 2560):
    chunk = N // P
    for block in (512, 1024, 2048):
        if chunk % block or chunk // block > 20:
            continue
        for warps in (4, 8):
            if block // (32 * warps) < 4:
                continue
            us = timed(lambda: _read[(P,)](ws[nxt()], sink, CHUNK=chunk, BLOCK=block, num_warps=warps))
            emit(what="read", P=P, BLOCK=block, warps=warps, us=us, gbps=N * 4 / us / 1e3)

spec = importlib.util.spec_from_file_location("splitk", "candidate_kernels/router_gemm/splitk_bf16x3.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
for T in (1, 8, 64):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
    m.router_logits(xs[0], ws[0])
    row = dict(T=T, splitk_config=str(m._router_kernel.best_config))
    row["splitk_us"] = timed(lambda: m.router_logits(xs[nxt()], ws[i[0]]))
    row["cublas_gemm_us"] = timed(lambda: torch.matmul(xs[nxt()].float(), ws[i[0]].T))
    if T == 1:
        xv = [x[0].float() for x in xs]
        row["cublas_gemv_us"] = timed(lambda: torch.mv(ws[nxt()], xv[i[0]]))
    emit(what="router", **row)
