"""router_gemm, vector_width's BF16x3 MMA path at T = 8..64: the three MMAs of a K block (lo, mid, hi
pieces of W) chained through one accumulator (`main`, as shipped: 12 dependent mma.sync per 64-wide block)
against two copies of the kernel with independent chains: `split_acc` (three MMAs from zero per block,
added lo + mid, then hi, then Kahan across blocks as shipped) and `piece_acc` (one accumulator per piece
across the program's blocks, added lo + mid, then hi, at the end; no Kahan inside a split). Each with the
shipped MMA configs forced in turn, timed as CUDA-graph replays (20 calls x 10 replays, median of 3 rounds,
16 rotated inputs of 5.2 MB each), beside the autotuned pick and cuBLAS FP32, in one process; the error is
normwise against FP64 (the task's bound: 1e-6).
Usage (repository root): python router_sweep6.py OUT.jsonl"""
import importlib.util, json, statistics, sys, tempfile

import torch
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


SRC = open("candidate_kernels/router_gemm/vector_width.py").read()
CHAIN = """            block_ET = tl.dot(lo_EK, x_TK.T)
            block_ET = tl.dot(mid_EK, x_TK.T, block_ET)
            block_ET = tl.dot(hi_EK, x_TK.T, block_ET)
"""
EDITS = {
    "main": [],
    "split_acc": [(CHAIN, "            block_ET = (tl.dot(lo_EK, x_TK.T) + tl.dot(mid_EK, x_TK.T)) + tl.dot(hi_EK, x_TK.T)\n")],
    "piece_acc": [
        ("        comp_ET = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)  # Kahan compensation of acc_ET\n",
         "        acc_lo = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)\n"
         "        acc_mid = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)\n"
         "        acc_hi = tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32)\n"),
        (CHAIN + "            # The tensor cores accumulate one block only; blocks are added in IEEE FP32, compensated.\n"
         "            acc_ET, comp_ET = _kahan_add(acc_ET, comp_ET, block_ET)\n    else:\n",
         "            acc_lo = tl.dot(lo_EK, x_TK.T, acc_lo)\n"
         "            acc_mid = tl.dot(mid_EK, x_TK.T, acc_mid)\n"
         "            acc_hi = tl.dot(hi_EK, x_TK.T, acc_hi)\n"
         "        acc_ET = (acc_lo + acc_mid) + acc_hi\n    else:\n"),
    ],
}


def load(variant):
    src = SRC
    for a, b in EDITS[variant]:
        assert a in src, a
        src = src.replace(a, b)
    path = f"{tempfile.mkdtemp()}/vw_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"vw_{variant}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
E, D, NX = 256, 5120, 16
ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
mods = {v: load(v) for v in EDITS}
m = mods["main"]
shipped = m._router_kernel.configs
NEW = [c for c in shipped if c.kwargs["USE_MMA"] and c.kwargs["SPLIT_K"] > 2 and c.kwargs["BLOCK_E"] <= 32]
emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
for T in (8, 16, 32, 64):
    xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
    ref = xs[0].double() @ ws[0].double().T
    for variant in EDITS:
        mod = mods[variant]
        i = [0]

        def cand():
            i[0] = (i[0] + 1) % NX
            mod.router_logits(xs[i[0]], ws[i[0]])

        if variant == "main":

            def cub():
                i[0] = (i[0] + 1) % NX
                torch.matmul(xs[i[0]].float(), ws[i[0]].T)

            mod._router_kernel.configs = shipped
            mod.router_logits(xs[0], ws[0])
            emit(T=T, what="autotuned", config=str(mod._router_kernel.best_config),
                 us=statistics.median(graph_us(cand) for _ in range(3)),
                 cublas_us=statistics.median(graph_us(cub) for _ in range(3)))
        rows = []
        for c in NEW:
            mod._router_kernel.configs = [c]
            try:
                got = mod.router_logits(xs[0], ws[0]).double()
                err = ((got - ref).norm() / ref.norm()).item()
                us = statistics.median(graph_us(cand) for _ in range(3))
                rows.append((us, str(c), err))
            except Exception as e:
                emit(T=T, variant=variant, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
        for us, c, err in sorted(rows):
            emit(T=T, variant=variant, what="config", us=round(us, 3),
                 config=c.replace(", num_ctas: 1", "").replace(", maxnreg: None", ""), rel_err_fp64=err)
        mod._router_kernel.configs = shipped
