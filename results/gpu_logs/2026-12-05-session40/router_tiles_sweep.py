"""router_gemm at T = 8: tiles of several expert rows over a slice of K, all 8 tokens, partials added into the output.

Why. The kernel in force (upfront_row; at T > 1 its parent's unsplit FMA row) runs 256 programs, one expert row each,
and every program reads all of x (8 x 5120 BF16 = 80 KB) from L2 beside its 20 KB row of W: 20 MB through the SMs'
L2 ports for 5.2 MB of weight. Its 4.40 us against one launch moving the same bytes in about 3.05 suggest those reads.
Here a program takes BLOCK_E rows and a 1/SPLIT_K slice of K: x is read E / BLOCK_E times instead of E times. The
SPLIT_K partial tiles [BLOCK_E, 8] are added into the output with red.global.add.f32, which must start from zero:
  zero_first  (the candidate's protocol) each program takes a ticket on its tile's word right after issuing its loads;
              the first of a launch stores the tile's zeros and publishes (release) the launch's number on a second
              word, the others wait to see it (acquire) before their FMAs, so the round trips overlap the loads;
  memset      the output made by torch.zeros (a memset node before the kernel), no protocol;
  unzeroed    no zeros at all (wrong on purpose: what the adds alone cost; its logits are not checked).
FMA forms: acc3 keeps a [BLOCK_E, 8, BLOCK_K] accumulator summed once at the end; chunk_sum sums each K chunk at once.
dot: the same tile through tl.dot with input_precision="ieee" (FP32 FMAs, the tokens padded to 16).
Every config's logits are compared with FP64 (normwise relative error, the task's 1e-6), and all are timed by the
harness's timer (bench.time_shape: CUDA-graph replays of rotated input sets, interleaved, the same-bytes copy beside
them) in groups, each beside upfront_row as shipped, every kernel launched as a programmatic dependent.
Usage (repository root): python router_tiles_sweep.py OUT.jsonl [T]"""

import importlib.util
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
PDL = tl.constexpr(not INTERPRET)
MODES = {"acc3": 0, "chunk_sum": 1, "dot": 2}
PROTOCOLS = {"zero_first": 0, "memset": 1, "unzeroed": 1}


@triton.jit
def _tiles(x_ptr, w_ptr, out_ptr, ticket_ptr, landed_ptr, T, E, D: tl.constexpr, BLOCK_T: tl.constexpr,
           BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, MODE: tl.constexpr,
           ZERO_FIRST: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
    pid_e = tl.program_id(0)
    pid_s = tl.program_id(1)
    KS: tl.constexpr = D // SPLIT_K
    CHUNKS: tl.constexpr = KS // BLOCK_K
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_t = tl.arange(0, BLOCK_T)
    t_ok = offs_t < T
    ws = ()
    xs = ()
    for i in tl.static_range(CHUNKS):
        cols = pid_s * KS + i * BLOCK_K + tl.arange(0, BLOCK_K)
        ws = ws + (tl.load(w_ptr + offs_e[:, None] * D + cols[None, :]),)
        xs = xs + (tl.load(x_ptr + offs_t[:, None] * D + cols[None, :], mask=t_ok[:, None], other=0.0),)
    tile = out_ptr + offs_t[None, :] * E + offs_e[:, None]  # [BLOCK_E, BLOCK_T]
    tile_ok = t_ok[None, :] & (offs_e[:, None] < E)
    if ZERO_FIRST:
        old = tl.atomic_add(ticket_ptr + pid_e, 1, sem="relaxed", scope="gpu")
        launch = old // SPLIT_K + 1
        if old % SPLIT_K == 0:
            tl.store(tile, tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32), mask=tile_ok)
            tl.debug_barrier()
            tl.atomic_xchg(landed_ptr + pid_e, launch, sem="release", scope="gpu")
        else:
            never = launch * 0 - 1
            seen = tl.atomic_cas(landed_ptr + pid_e, never, never, sem="acquire", scope="gpu")
            while seen != launch:
                seen = tl.atomic_cas(landed_ptr + pid_e, never, never, sem="acquire", scope="gpu")
    if MODE == 0:
        acc3 = tl.zeros((BLOCK_E, BLOCK_T, BLOCK_K), dtype=tl.float32)
        for i in tl.static_range(CHUNKS):
            acc3 += ws[i][:, None, :] * xs[i].to(tl.float32)[None, :, :]
        acc = tl.sum(acc3, axis=2)
    elif MODE == 1:
        acc = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)
        for i in tl.static_range(CHUNKS):
            acc += tl.sum(ws[i][:, None, :] * xs[i].to(tl.float32)[None, :, :], axis=2)
    else:
        acc = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)
        for i in tl.static_range(CHUNKS):
            acc = tl.dot(ws[i], tl.trans(xs[i].to(tl.float32)), acc, input_precision="ieee")
    tl.atomic_add(tile, acc, mask=tile_ok, sem="relaxed", scope="gpu")


_words: dict = {}


def tiles(block_e, split_k, block_k, warps, mode, protocol):
    """logits [T, E] by _tiles with one config; the ticket words are this config's own (one launch adds SPLIT_K)."""

    def run(x_TD, w_router_ED):
        T, D = x_TD.shape
        E = w_router_ED.shape[0]
        assert D % (split_k * block_k) == 0 and E % block_e == 0
        key = (block_e, split_k, block_k, warps, mode, protocol, str(x_TD.device))
        if key not in _words:
            _words[key] = torch.zeros((2, E // block_e), dtype=torch.int64, device=x_TD.device)
        words = _words[key]
        make = torch.zeros if protocol == "memset" else torch.empty
        out = make((T, E), dtype=torch.float32, device=x_TD.device)
        block_t = 16 if mode == "dot" else triton.next_power_of_2(T)
        launch = {} if INTERPRET else {"launch_pdl": True}
        _tiles[(E // block_e, split_k)](
            x_TD, w_router_ED, out, words[0], words[1], T, E, D=D, BLOCK_T=block_t, BLOCK_E=block_e,
            BLOCK_K=block_k, SPLIT_K=split_k, MODE=MODES[mode], ZERO_FIRST=protocol == "zero_first",
            num_warps=warps, **launch,
        )  # fmt: skip
        return out

    return run


def name(block_e, split_k, block_k, warps, mode, protocol):
    return f"{mode} {block_e}x{split_k}-way k{block_k} w{warps} {protocol}"


FMA = [  # (BLOCK_E, SPLIT_K, BLOCK_K, warps): (E / BLOCK_E) x SPLIT_K programs
    (4, 4, 64, 4), (4, 8, 64, 2), (4, 8, 64, 4),
    (8, 4, 64, 4), (8, 5, 64, 4), (8, 8, 32, 4), (8, 8, 64, 2), (8, 8, 64, 4), (8, 8, 128, 4), (8, 10, 64, 4),
    (8, 16, 64, 2), (8, 16, 64, 4),
    (16, 8, 32, 4), (16, 8, 64, 4), (16, 10, 64, 4), (16, 16, 32, 4), (16, 16, 64, 4), (16, 16, 64, 8),
    (16, 20, 64, 4), (32, 16, 64, 8), (32, 20, 64, 8), (32, 40, 32, 4),
]  # fmt: skip
DOT = [(16, 8, 64, 4), (16, 16, 64, 4), (16, 16, 32, 4), (32, 16, 64, 4), (32, 20, 64, 4), (64, 40, 32, 4)]


def plan():
    configs = [(e, s, k, w, m, "zero_first") for m in ("acc3", "chunk_sum") for e, s, k, w in FMA]
    configs += [(e, s, k, w, "dot", "zero_first") for e, s, k, w in DOT]
    configs += [(e, s, k, w, "acc3", p) for p in ("memset", "unzeroed") for e, s, k, w in
                [(8, 8, 64, 4), (16, 16, 64, 4), (8, 16, 64, 4)]]  # fmt: skip
    return configs


def load(module_name):
    spec = importlib.util.spec_from_file_location(module_name, f"candidate_kernels/router_gemm/{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_vs_fp64(got, x_TD, w_router_ED):
    want = x_TD.double() @ w_router_ED.double().T
    return float((got.double() - want).norm() / want.norm())


def main():
    from harness import bench
    from tasks import get_task

    out = open(sys.argv[1], "w")
    label = f"T={sys.argv[2] if len(sys.argv) > 2 else 8}"

    def emit(**kw):
        print(json.dumps(kw), flush=True)
        out.write(json.dumps(kw) + "\n")
        out.flush()

    upfront_row = load("upfront_row")
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    task = get_task("router_gemm")
    dev = torch.device("cuda")
    shape = task.shape(label, dev)
    inputs = task.make_inputs(shape, 0, dev)
    emit(T=label, impl="upfront_row (in force)", rel_err=error_vs_fp64(upfront_row.router_logits(**inputs), **inputs))
    impls = {}
    for c in plan():
        fn = tiles(*c)
        try:
            for _ in range(3):  # three launches: the ticket words move on, the zeros must follow
                got = fn(**inputs)
            torch.cuda.synchronize()
        except Exception as e:
            emit(T=label, impl=name(*c), failed=f"{type(e).__name__}: {e}"[:300])
            continue
        err = error_vs_fp64(got, **inputs) if c[5] != "unzeroed" else None
        emit(T=label, impl=name(*c), rel_err=err)
        if err is None or err <= 1e-6:
            impls[name(*c)] = fn
    settings = bench.BenchSettings(max_seconds=2.0)
    names = list(impls)
    for g in range(0, len(names), 12):
        group = {"upfront_row (in force)": upfront_row.router_logits} | {n: impls[n] for n in names[g : g + 12]}
        results = bench.time_shape(task, shape, group, settings, 1, None)
        for n, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(T=label, group=g // 12, impl=n, failed=r)
            else:
                emit(T=label, group=g // 12, impl=n, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2),
                     p80=round(r.p80_us, 2))  # fmt: skip


if __name__ == "__main__":
    main()
