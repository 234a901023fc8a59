"""router_gemm at T = 16..64, second sweep: what the FP32-reduction fixup's protocol costs. router_red_sweep.py
measured first_store (the first split to arrive stores, the rest wait for its flag and add) at 6.42 us at T = 64
against 5.37 for reductions into an unzeroed output (timing only) and 7.80 for vector_width. Two protocols that
zero each output tile at the start of the launch instead, so that the adds at the end rarely wait; one 64-bit word
per tile: bits 0-47 count arrivals (every launch adds 64 in all, whatever its split), bits 48-63 the generation
mod 2^16 whose zeros are in place:
  zero_early  the split-0 program of each tile zeroes it before its K loop and raises the generation; the others
              count their arrival at the end, and add once they see it (waits only on programs dispatched earlier
              when dispatch follows the linear program id, which CUDA does not promise);
  zero_first  every program takes a ticket at its start (a round trip before its loads); the first zeroes the
              tile and raises the generation; the others add at the end once they see it (deadlock-free).
Beside them: vector_width (main) autotuned and forced, first_store and red_nozero from the first sweep, with
the shipped split configs and 2-warp ones whose split divides 64. Timed as in router_red_sweep.py.
Usage (repository root): python router_red_sweep2.py OUT.jsonl"""
import runpy, statistics, sys

import torch
import triton

lib = runpy.run_path(sys.argv[0].replace("router_red_sweep2.py", "router_red_sweep.py"), run_name="lib")
emit, graph_us, load, EDITS = lib["emit"], lib["graph_us"], lib["load"], lib["EDITS"]

HEAD = "    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * stride_we\n"
WORD = """    # this launch's tile word (see the sweep's docstring); out_ptrs as at the end
    if SPLIT_K > 1:
        tl.static_assert(64 % SPLIT_K == 0, "SPLIT_K must divide 64")
        z_tile = pid_t * tl.num_programs(0) + pid_e
        z_ptrs = out_ptr + offs_t.to(tl.int64)[None, :] * E + offs_e[:, None]
        z_mask = e_ok[:, None] & t_ok[None, :]
"""
EARLY_HEAD = WORD + """        if pid_s == 0:
            tl.store(z_ptrs, tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32), mask=z_mask)
            tl.debug_barrier()
            tl.atomic_add(sem_ptr + z_tile, (1 << 48) + 64 // SPLIT_K, sem="release", scope="gpu")
"""
FIRST_HEAD = WORD + """        ticket = tl.atomic_add(sem_ptr + z_tile, 64 // SPLIT_K, sem="relaxed", scope="gpu")
        if (ticket & ((1 << 48) - 1)) % 64 == 0:
            tl.store(z_ptrs, tl.zeros((BLOCK_E, BLOCK_T), dtype=tl.float32), mask=z_mask)
            tl.debug_barrier()
            tl.atomic_add(sem_ptr + z_tile, 1 << 48, sem="release", scope="gpu")
"""
WAIT = """            gen = ((old & ((1 << 48) - 1)) // 64 + 1) & 0xFFFF
            never = gen * 0 - 1
            seen = old
            while ((seen >> 48) & 0xFFFF) != gen:
                seen = tl.atomic_cas(sem_ptr + z_tile, never, never, sem="acquire", scope="gpu")
        tl.atomic_add(out_ptrs, acc_ET, mask=out_mask, sem="relaxed", scope="gpu")
"""
EARLY_TAIL = """        if pid_s != 0:
            old = tl.atomic_add(sem_ptr + z_tile, 64 // SPLIT_K, sem="acquire", scope="gpu")
""" + WAIT
FIRST_TAIL = """        if (ticket & ((1 << 48) - 1)) % 64 != 0:
            old = ticket
""" + WAIT
SEM64 = ("sems = _semaphores(x_TD.device, tiles)", "sems = _ws(x_TD.device, 1 << 16, torch.int64, 'sem')")
EDITS["zero_early"] = [(None, EARLY_TAIL), (HEAD, HEAD + EARLY_HEAD), SEM64]
EDITS["zero_first"] = [(None, FIRST_TAIL), (HEAD, HEAD + FIRST_HEAD), SEM64]
VARIANTS = ("main", "first_store", "red_nozero", "zero_early", "zero_first")


def mma(e, k, s, w, st):
    return triton.Config({"USE_MMA": True, "BLOCK_E": e, "BLOCK_K": k, "SPLIT_K": s}, num_warps=w, num_stages=st)


EXTRA = [mma(16, 64, 16, 2, 2), mma(16, 64, 16, 2, 4), mma(16, 64, 16, 2, 5), mma(32, 64, 16, 2, 3),
         mma(16, 128, 16, 2, 3), mma(16, 64, 8, 2, 3), mma(16, 64, 32, 1, 3), mma(32, 64, 32, 2, 3)]

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    E, D, NX = 256, 5120, 16
    ws = [torch.randn(E, D, device=dev) / D**0.5 for _ in range(NX)]
    mods = {v: load(v) for v in VARIANTS}
    shipped = mods["main"]._router_kernel.configs
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    for T in (64, 32, 16):
        xs = [torch.randn(T, D, device=dev).to(torch.bfloat16) for _ in range(NX)]
        ref = xs[0].double() @ ws[0].double().T
        cub_err = ((xs[0].float() @ ws[0].T).double() - ref).norm() / ref.norm()
        kept = mods["main"]._prune(shipped, {"t_bucket": mods["main"]._t_bucket(T), "E": E}, D=D)
        split = [c for c in kept if c.kwargs["SPLIT_K"] > 1 and 64 % c.kwargs["SPLIT_K"] == 0] + EXTRA
        for variant, mod in mods.items():
            i = [0]

            def cand():
                i[0] = (i[0] + 1) % NX
                mod.router_logits(xs[i[0]], ws[i[0]])

            if variant == "main":
                mod._router_kernel.configs = shipped
                mod.router_logits(xs[0], ws[0])
                emit(T=T, what="autotuned", config=str(mod._router_kernel.best_config),
                     us=statistics.median(graph_us(cand) for _ in range(3)), cublas_rel_err_fp64=cub_err.item())
            rows = []
            for c in split:
                mod._router_kernel.configs = [c]
                try:
                    errs = []
                    for _ in range(3):
                        got = mod.router_logits(xs[0], ws[0]).double()
                        errs.append(((got - ref).norm() / ref.norm()).item())
                    us = statistics.median(graph_us(cand) for _ in range(3))
                    got = mod.router_logits(xs[0], ws[0]).double()
                    errs.append(((got - ref).norm() / ref.norm()).item())
                    rows.append((us, str(c), max(errs)))
                except Exception as e:
                    emit(T=T, variant=variant, what="failed", config=str(c), error=f"{type(e).__name__}: {str(e)[:200]}")
            for us, c, err in sorted(rows):
                emit(T=T, variant=variant, what="config", us=round(us, 3),
                     config=c.replace(", num_ctas: 1", "").replace(", maxnreg: None", ""), max_rel_err_fp64=err)
            mod._router_kernel.configs = shipped
