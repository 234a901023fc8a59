"""Why do the harness's event windows read qk_norm_rope global T=16384 above Nsight Compute (156 vs 144 us)?
One plain process, T=16384 shapes of qk_norm_rope (both variants) and fuse_norm: each implementation timed by
  harness_events  harness.bench's own event timer and interleaving (make_timer + time_interleaved, default settings)
  graph           a CUDA graph of 13 calls replayed back to back, median of 30 replays
  events_noflush  13 calls between events after a GPU hold, no L2 sweep, median of 30 windows
  single_cold     one call between events after an L2 sweep and a GPU hold, median of 40 (what ncu times)
with nvidia-smi sampling SM clock, power and throttle reasons every 50 ms in the background (markers with
time.time() in the output line up the samples). Usage: timing_diag.py OUT.jsonl SMI.csv"""
import json, sys, statistics, importlib.util, subprocess, time
import torch
from tasks import TASKS
from harness import bench

out = open(sys.argv[1], "w")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
                        "clocks_event_reasons.active", "--format=csv", "-lms", "50"],
                       stdout=open(sys.argv[2], "w"), stderr=subprocess.STDOUT)
def emit(**kw):
    kw["t"] = round(time.time(), 3)
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

dev = torch.device("cuda")
flush = bench.l2_flush_buffer()
hold = bench.GpuHold()
CALLS = 13

def graph_us(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS): fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(30):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / CALLS)
    del g
    return statistics.median(ts), min(ts)

def window_us(fn, calls, sweep, n):
    ts = []
    for _ in range(n):
        if sweep: flush.sum()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        with hold.queued():
            a.record()
            for _ in range(calls): fn()
            b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(ts), min(ts)

def study(task_name, label, impls):
    task = TASKS[task_name]
    shape = next(s for s in task.shapes if s.label == label)
    inputs = task.make_inputs(shape, 1, dev)
    floor = task.cost(shape).bytes / 4275e3
    emit(task=task_name, shape=label, what="start", floor_us=floor)
    for name, fn in impls.items():
        fn(**inputs); torch.cuda.synchronize()  # autotune outside every timing
    timers = [bench.make_timer(name, fn, [inputs], False, bench.BenchSettings(), flush) for name, fn in impls.items()]
    t0 = time.time()
    got = bench.time_interleaved(timers, bench.BenchSettings())
    for name, timing in got.items():
        emit(task=task_name, shape=label, impl=name, method="harness_events", p50=timing.p50_us, p20=timing.p20_us,
             p80=timing.p80_us, calls=timing.calls_per_window, began=t0)
    for name, fn in impls.items():
        call = lambda fn=fn: fn(**inputs)
        t0 = time.time(); med, lo = graph_us(call)
        emit(task=task_name, shape=label, impl=name, method="graph", p50=med, min=lo, began=t0)
        t0 = time.time(); med, lo = window_us(call, CALLS, False, 30)
        emit(task=task_name, shape=label, impl=name, method="events_noflush", p50=med, min=lo, began=t0)
        t0 = time.time(); med, lo = window_us(call, 1, True, 40)
        emit(task=task_name, shape=label, impl=name, method="single_cold", p50=med, min=lo, began=t0)
    del inputs
    torch.cuda.empty_cache()

hg = load("hg", "candidate_kernels/qk_norm_rope/head_groups.py")
ring = load("ring", "candidate_kernels/qk_norm_rope/token_ring.py")
for label in ("global T=16384", "sliding T=16384"):
    q_outs = {}
    def copies(q_THD, k_TKD, v_TKD, **_):
        if not q_outs:
            q_outs.update(q=torch.empty_like(q_THD), k=torch.empty_like(k_TKD), v=torch.empty_like(v_TKD))
        q_outs["q"].copy_(q_THD); q_outs["k"].copy_(k_TKD); q_outs["v"].copy_(v_TKD)
    study("qk_norm_rope", label, {"token_ring": ring.qk_norm_rope, "head_groups": hg.qk_norm_rope, "copy_qkv": copies})
    emit(shape=label, token_ring_config=str(ring._qk_norm_rope_ring_kernel.best_config),
         head_groups_config=str(hg._qk_norm_rope_kernel.best_config))
tma = load("tma", "candidate_kernels/fuse_norm/tma_ring.py")
packed = load("packed", "candidate_kernels/fuse_norm/packed_ring.py")
study("fuse_norm", "T=16384", {"tma_ring": tma.norm_residual_norm, "packed_ring": packed.norm_residual_norm})
emit(tma_config=str(tma._fuse_norm_ring_kernel.best_config), packed_config=str(packed._fuse_norm_ring_kernel.best_config))
smi.terminate()
