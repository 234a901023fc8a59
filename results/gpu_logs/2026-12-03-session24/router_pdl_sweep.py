"""router_gemm/pdl_fill against red_fixup: split-K by FP32 reductions into an output zeroed by a fill launch whose
programmatic dependent the GEMM is (launch_pdl: its K loop overlaps the fill; griddepcontrol.wait before the adds).
Per T, every split config that pdl_fill's prune keeps, forced in turn:
  pdl     as shipped (the fill, then the GEMM launched as its programmatic dependent);
  serial  the same config without launch_pdl (the GEMM starts after the fill completes): what the overlap saves;
  nofill  the best pdl config with the fill skipped: timing only, its output is wrong on purpose (the adds alone).
Beside them the autotuned picks of pdl_fill and red_fixup and cuBLAS FP32, all timed as CUDA-graph replays (20 calls
x 10 replays, median of 3 rounds, 16 rotated inputs) in one process; each forced config's output checked against
FP64 (normwise), three calls before and one after its replays.
Usage (repository root): python router_pdl_sweep.py OUT.jsonl"""
import importlib.util, json, statistics, sys

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


def load(name):
    spec = importlib.util.spec_from_file_location(name, f"candidate_kernels/router_gemm/{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def force(mod, config):
    mod._router_kernel.configs = [config]
    mod._router_kernel.cache.clear()


def short(c):
    return str(c).replace(", num_ctas: 1", "").replace(", maxnreg: None", "")


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    E, D, NX = 256, 5120, 16
    ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
    pdl, red = load("pdl_fill"), load("red_fixup")
    shipped = {m: m._router_kernel.configs for m in (pdl, red)}
    real_fill = pdl._zero_fill
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    for T in (64, 32, 16, 8, 3, 1):
        xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
        ref = xs[0].double() @ ws[0].double().T

        def err(mod):
            return ((mod.router_logits(xs[0], ws[0]).double() - ref).norm() / ref.norm()).item()

        def timer(mod):
            i = [0]

            def call():
                i[0] = (i[0] + 1) % NX
                mod.router_logits(xs[i[0]], ws[i[0]])

            return statistics.median(graph_us(call) for _ in range(3))

        def cub():
            cub.i = (getattr(cub, "i", 0) + 1) % NX
            torch.matmul(xs[cub.i].float(), ws[cub.i].T)

        for name, mod in (("pdl_fill", pdl), ("red_fixup", red)):
            mod._router_kernel.configs = shipped[mod]
            mod._router_kernel.cache.clear()
            e = err(mod)
            emit(T=T, what="autotuned", impl=name, config=short(mod._router_kernel.best_config), us=round(timer(mod), 3),
                 rel_err_fp64=e)
        cub_err = ((xs[0].float() @ ws[0].T).double() - ref).norm() / ref.norm()
        emit(T=T, what="cublas", us=round(statistics.median(graph_us(cub) for _ in range(3)), 3),
             rel_err_fp64=cub_err.item())
        kept = pdl._prune(shipped[pdl], {"t_bucket": pdl._t_bucket(T), "E": E}, D=D)
        rows = []
        for c in (c for c in kept if c.kwargs["SPLIT_K"] > 1):
            variants = [("pdl", c)]
            if T >= 16:
                plain = {k: v for k, v in c.kwargs.items() if k != "launch_pdl"}
                variants.append(("serial", triton.Config(plain, num_warps=c.num_warps, num_stages=c.num_stages)))
            for variant, config in variants:
                force(pdl, config)
                try:
                    errs = [err(pdl) for _ in range(3)]
                    us = timer(pdl)
                    errs.append(err(pdl))
                    rows.append((us, variant, config, max(errs)))
                except Exception as ex:
                    emit(T=T, variant=variant, what="failed", config=short(config),
                         error=f"{type(ex).__name__}: {str(ex)[:300]}")
        for us, variant, config, e in sorted(rows, key=lambda r: r[0]):
            emit(T=T, what="config", variant=variant, us=round(us, 3), config=short(config), max_rel_err_fp64=e)
        best = min((r for r in rows if r[1] == "pdl"), key=lambda r: r[0], default=None)
        if best is not None:
            force(pdl, best[2])
            pdl._zero_fill = lambda out: None
            try:
                emit(T=T, what="config", variant="nofill", us=round(timer(pdl), 3), config=short(best[2]))
            finally:
                pdl._zero_fill = real_fill
        pdl._router_kernel.configs = shipped[pdl]
        pdl._router_kernel.cache.clear()
