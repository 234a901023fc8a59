"""qk_norm_rope: head_groups (promoted) against early_gather in one process, alternating, on the task's
own inputs: per-call time over 20 back-to-back calls between CUDA events (T >= 1000) or in a CUDA
graph (T <= 64), 15 rounds, median; two input sets rotated. Usage: qk_ab.py OUT.jsonl"""
import json, sys, statistics, importlib.util
import torch
from tasks import TASKS

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

def load(name):
    spec = importlib.util.spec_from_file_location(name, f"candidate_kernels/qk_norm_rope/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

def event_us(fn, calls=20):
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    a.record()
    for _ in range(calls): fn()
    b.record(); b.synchronize()
    return a.elapsed_time(b) * 1000 / calls

def graph_timer(fn, calls=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    return lambda: event_us(g.replay, 1) / calls

mods = {n: load(n) for n in ("head_groups", "early_gather")}
task = TASKS["qk_norm_rope"]
dev = torch.device("cuda")
for label in ("sliding T=16384", "global T=16384", "sliding T=1000", "global T=1000", "sliding T=1", "global T=64"):
    shape = task.shape(label, dev)
    sets = [task.make_inputs(shape, seed, dev) for seed in (1, 2)]
    timers = {}
    for name, m in mods.items():
        i = [0]
        def call(m=m, i=i):
            i[0] ^= 1; m.qk_norm_rope(**sets[i[0]])
        call(); call(); torch.cuda.synchronize()  # autotune both buckets' configs, compile
        timers[name] = graph_timer(call) if shape["T"] <= 64 else (lambda call=call: event_us(call))
        emit(label=label, impl=name, config=str(m._qk_norm_rope_kernel.best_config))
    rounds = {name: [] for name in mods}
    for _ in range(15):
        for name, t in timers.items():
            rounds[name].append(t())
    emit(label=label, **{name: round(statistics.median(v), 3) for name, v in rounds.items()},
         ratio=round(statistics.median(a / b for a, b in zip(rounds["head_groups"], rounds["early_gather"])), 4))
