"""qk_norm_rope/token_ring on the H200: every shipped config forced in turn (bit-checked against head_groups), against
head_groups' and token_ring's autotuned picks and a copy ceiling of q, k, v, in one process.
Timing: CUDA-graph replays of calls over 3 rotated input sets (T=16384: 3 calls per graph, about 1.8 GB of
traffic per replay; T<=64: 30 calls), median of 3 rounds of 10 replays. Usage: qk_ring_sweep.py OUT.jsonl"""
import json, sys, statistics, importlib.util
import torch, triton
from tasks import TASKS

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

ring = load("ring", "candidate_kernels/qk_norm_rope/token_ring.py")
hg = load("hg", "candidate_kernels/qk_norm_rope/head_groups.py")
task = TASKS["qk_norm_rope"]
dev = torch.device("cuda")
NSETS = 3

def graph_us(fn, calls):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    g.replay(); torch.cuda.synchronize()
    rounds = []
    for _ in range(3):
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record(); g.replay(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) * 1000 / calls)
        rounds.append(statistics.median(ts))
    return statistics.median(rounds)

shipped = ring._qk_norm_rope_ring_kernel.configs
for label in ("sliding T=16384", "global T=16384", "sliding T=1", "global T=1", "sliding T=64"):
    shape = next(s for s in task.shapes if s.label == label)
    sets = [task.make_inputs(shape, seed, dev) for seed in range(1, NSETS + 1)]
    T = shape["T"]
    calls = 3 if T > 64 else 30
    floor = task.cost(shape).bytes / 4275e3
    i = [0]
    def call(fn):
        def f():
            i[0] = (i[0] + 1) % NSETS; return fn(**sets[i[0]])
        return f
    def outputs(fn):
        kw = dict(sets[0]); kw["k_cache_SKD"] = kw["k_cache_SKD"].clone(); kw["v_cache_SKD"] = kw["v_cache_SKD"].clone()
        q, k = fn(**kw)
        return q, k, kw["k_cache_SKD"], kw["v_cache_SKD"]
    want = outputs(hg.qk_norm_rope)
    emit(shape=label, what="head_groups", config=str(hg._qk_norm_rope_kernel.best_config),
         us=graph_us(call(hg.qk_norm_rope), calls), floor_us=floor)
    ring._qk_norm_rope_ring_kernel.configs = shipped
    got = outputs(ring.qk_norm_rope)
    emit(shape=label, what="token_ring_autotuned", config=str(ring._qk_norm_rope_ring_kernel.best_config),
         equal=all(torch.equal(a, b) for a, b in zip(got, want)), us=graph_us(call(ring.qk_norm_rope), calls),
         floor_us=floor)
    outs = [[torch.empty_like(s[n]) for n in ("q_THD", "k_TKD", "v_TKD")] for s in sets]
    def copies(q_THD, k_TKD, v_TKD, **_):
        o = outs[i[0]]; o[0].copy_(q_THD); o[1].copy_(k_TKD); o[2].copy_(v_TKD)
    copy_bytes = 2 * sum(sets[0][n].numel() * 2 for n in ("q_THD", "k_TKD", "v_TKD"))
    us = graph_us(call(copies), calls)
    emit(shape=label, what="copy_q_k_v_torch", us=us, gbps=copy_bytes / us / 1e3, op_bytes_at_that_rate_us=task.cost(shape).bytes / (copy_bytes / us))
    for c in shipped:
        ring._qk_norm_rope_ring_kernel.configs = [c]
        try:
            got = outputs(ring.qk_norm_rope)
            eq = all(torch.equal(a, b) for a, b in zip(got, want))
            emit(shape=label, what="token_ring_forced", config=str(c), equal=eq,
                 us=graph_us(call(ring.qk_norm_rope), calls), floor_us=floor)
        except Exception as e:
            emit(shape=label, what="token_ring_forced", config=str(c), error=repr(e)[:300])
    del sets, outs
    torch.cuda.empty_cache()
