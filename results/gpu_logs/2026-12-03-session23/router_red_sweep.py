"""router_gemm: vector_width's split-K fixup done with FP32 reductions (red.global.add) instead of the last
arriver's compensated sum of every split's partial (1.31 of its 7.66 us at T = 64, twentieth session).
Variants, each a copy of vector_width.py with its fixup block replaced (outputs checked against FP64):
  main        vector_width as shipped (partials in a workspace; the last arriver sums them in K order);
  red_out     every split adds its partial into a zeroed output (torch.zeros: a fill launch before the kernel);
  red_nozero  red_out without the fill: timing only, its output is wrong on purpose (what the fill costs);
  red_ws      every split adds into a persistent, zeroed per-tile workspace, then arrives; the last arriver
              copies the tile out and zeroes it again (reads 4 KB, not SPLIT_K x 4 KB);
  first_store the first split to arrive stores its partial into the output and raises the tile's flag to
              this launch's generation; the others wait for it and add theirs (no fill, no workspace).
Shipped configs with SPLIT_K > 1 that vector_width's prune keeps at each T, forced in turn, timed as CUDA-graph
replays (20 calls x 10 replays, median of 3 rounds, 16 rotated inputs), beside the autotuned pick and cuBLAS
FP32 (whose own error against FP64 is printed: the parity margin is 1.05x it), in one process.
Usage (repository root): python router_red_sweep.py OUT.jsonl"""
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
FIX_START = "        # Publish this split's partial, then count arrivals on the tile."
FIX_END = '            tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")  # leave the counter zeroed\n'
RED_OUT = """        tl.atomic_add(out_ptrs, acc_ET, mask=out_mask, sem="relaxed", scope="gpu")
"""
RED_WS = """        tile = pid_t * tl.num_programs(0) + pid_e
        tile_elems = tl.arange(0, BLOCK_E)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        tile_ws = partial_ptr + tile.to(tl.int64) * (BLOCK_E * BLOCK_T)
        tl.atomic_add(tile_ws + tile_elems, acc_ET, sem="relaxed", scope="gpu")
        tl.debug_barrier()
        arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total_ET = tl.load(tile_ws + tile_elems, cache_modifier=".cg")
            tl.store(out_ptrs, total_ET, mask=out_mask)
            tl.store(tile_ws + tile_elems, tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32))
            tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")
"""
FIRST_STORE = """        tile = pid_t * tl.num_programs(0) + pid_e
        # every launch adds 64 to the tile's counter whatever its split (so configs may follow each other)
        tl.static_assert(64 % SPLIT_K == 0, "SPLIT_K must divide 64")
        arrived = tl.atomic_add(sem_ptr + tile, 64 // SPLIT_K, sem="relaxed", scope="gpu")
        gen = arrived // 64 + 1
        if arrived % 64 == 0:
            tl.store(out_ptrs, acc_ET, mask=out_mask)
            tl.debug_barrier()
            tl.atomic_xchg(partial_ptr + tile, gen, sem="release", scope="gpu")
        else:
            # poll with a compare-and-swap that never swaps (flags are >= 0): an atomic add of 0 is folded away
            never = gen * 0 - 1  # an int64 -1, the flag's type
            seen = tl.atomic_cas(partial_ptr + tile, never, never, sem="acquire", scope="gpu")
            while seen != gen:
                seen = tl.atomic_cas(partial_ptr + tile, never, never, sem="acquire", scope="gpu")
            tl.atomic_add(out_ptrs, acc_ET, mask=out_mask, sem="relaxed", scope="gpu")
"""
ZEROS = ("logits_TE = torch.empty((T, E)", "logits_TE = torch.zeros((T, E)")
# persistent zeroed workspace (red_ws) and int64 counters and flags (first_store), never freed
WS_RED = ("partial = torch.empty(elems, dtype=torch.float32, device=x_TD.device)",
          "partial = _ws(x_TD.device, elems, torch.float32)")
WS_FIRST = ("partial = torch.empty(elems, dtype=torch.float32, device=x_TD.device)",
            "partial = _ws(x_TD.device, 1 << 16, torch.int64)")
SEM64 = ("sems = _semaphores(x_TD.device, tiles)", "sems = _ws(x_TD.device, 1 << 16, torch.int64, 'sem')")
WS_FN = '''
_WS = {}


def _ws(device, n, dtype, tag="ws"):
    key = (device, dtype, tag)
    if key not in _WS or _WS[key].numel() < n:
        _WS[key] = torch.zeros(n, dtype=dtype, device=device)
    return _WS[key]
'''
EDITS = {
    "main": [],
    "red_out": [(None, RED_OUT), ZEROS],
    "red_nozero": [(None, RED_OUT)],
    "red_ws": [(None, RED_WS), WS_RED],
    "first_store": [(None, FIRST_STORE), WS_FIRST, SEM64],
}


def load(variant):
    src = SRC
    for a, b in EDITS[variant]:
        if a is None:
            i, j = src.index(FIX_START), src.index(FIX_END) + len(FIX_END)
            src = src[:i] + b + src[j:]
        else:
            assert a in src, a
            src = src.replace(a, b)
    src = src.replace("\ndef router_logits(", WS_FN + "\n\ndef router_logits(")
    path = f"{tempfile.mkdtemp()}/vw_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"vw_{variant}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    E, D, NX = 256, 5120, 16
    ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
    mods = {v: load(v) for v in EDITS}
    shipped = mods["main"]._router_kernel.configs
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    for T in (64, 8, 1, 16, 3, 32):
        xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
        ref = xs[0].double() @ ws[0].double().T
        cub_err = ((xs[0].float() @ ws[0].T).double() - ref).norm() / ref.norm()
        kept = mods["main"]._prune(shipped, {"t_bucket": mods["main"]._t_bucket(T), "E": E}, D=D)
        split = [c for c in kept if c.kwargs["SPLIT_K"] > 1]
        for variant, mod in mods.items():
            if variant == "red_nozero" and T != 64:
                continue
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
                     cublas_us=statistics.median(graph_us(cub) for _ in range(3)), cublas_rel_err_fp64=cub_err.item())
            rows = []
            for c in split:
                mod._router_kernel.configs = [c]
                try:
                    errs = []
                    for _ in range(3):  # the red variants add in arrival order: the error varies by call
                        got = mod.router_logits(xs[0], ws[0]).double()
                        errs.append(((got - ref).norm() / ref.norm()).item())
                    us = statistics.median(graph_us(cand) for _ in range(3))
                    got = mod.router_logits(xs[0], ws[0]).double()  # after 600+ replays: flags and counters
                    errs.append(((got - ref).norm() / ref.norm()).item())
                    rows.append((us, str(c), max(errs)))
                except Exception as e:
                    emit(T=T, variant=variant, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
            for us, c, err in sorted(rows):
                emit(T=T, variant=variant, what="config", us=round(us, 3),
                     config=c.replace(", num_ctas: 1", "").replace(", maxnreg: None", ""), max_rel_err_fp64=err)
            mod._router_kernel.configs = shipped
