"""The harness's timers after the change that drops the device synchronization before a window's end event,
against the old windows, in one plain process on the H200. Per implementation:
  harness       harness.bench as committed (make_timer + time_interleaved, default settings): events for T=16384,
                CUDA graph (graph_calls=100) for T=1
  old_sync      the windows before this change: the same calls, then a device synchronization, then the end
                event (events: L2 swept by reading and GPU held first, 13 calls; graphs: 13 calls per graph, 20 replays)
  end_event     the same windows closed by the end event right after the calls, no synchronization
  empty_gap     (once per shape) an empty window: start, device synchronization, end; median of 50 (the old cost)
Usage: timing_diag2.py OUT.jsonl"""
import json, sys, statistics, importlib.util, time
import torch
from tasks import TASKS
from harness import bench

out = open(sys.argv[1], "w")
def emit(**kw):
    print(json.dumps(kw), flush=True); out.write(json.dumps(kw) + "\n"); out.flush()

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

dev = torch.device("cuda")
flush = bench.l2_flush_buffer()
hold = bench.GpuHold()

def ev_windows(fn, calls, sync_first, n=30):
    ts = []
    for _ in range(n):
        flush.sum()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        with hold.queued():
            a.record()
            for _ in range(calls): fn()
            if not sync_first: b.record()
        if sync_first:
            torch.cuda.synchronize(); b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(ts)

def graph_windows(fn, calls, replays, sync_first, n=30):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(replays): g.replay()
        if sync_first: torch.cuda.synchronize()
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / (calls * replays))
    del g
    return statistics.median(ts)

def empty_gap_us(n=50):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); torch.cuda.synchronize(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)

def study(task_name, label, impls):
    task = TASKS[task_name]
    shape = next(s for s in task.shapes if s.label == label)
    decode = shape["T"] <= 64
    sets = [task.make_inputs(shape, seed, dev) for seed in (1, 2, 3)] if decode else [task.make_inputs(shape, 1, dev)]
    for fn in impls.values():
        fn(**sets[0]); torch.cuda.synchronize()  # autotune outside every timing
    settings = bench.BenchSettings()
    timers = [bench.make_timer(n, fn, sets, decode, settings, None if decode else flush) for n, fn in impls.items()]
    for name, timing in bench.time_interleaved(timers, settings).items():
        emit(task=task_name, shape=label, impl=name, method="harness", p50=timing.p50_us, p20=timing.p20_us,
             p80=timing.p80_us, calls=timing.calls_per_window, timer=timing.method, note=timing.note)
    del timers
    emit(task=task_name, shape=label, method="empty_gap", us=empty_gap_us())
    for name, fn in impls.items():
        i = [0]
        def call(fn=fn):
            i[0] = (i[0] + 1) % len(sets); return fn(**sets[i[0]])
        for sync_first, method in ((True, "old_sync"), (False, "end_event"), (True, "old_sync"), (False, "end_event")):
            us = graph_windows(call, 100, 8, sync_first) if decode else ev_windows(call, 13, sync_first)
            emit(task=task_name, shape=label, impl=name, method=method, p50=us)
    del sets
    torch.cuda.empty_cache()

hg = load("hg", "candidate_kernels/qk_norm_rope/head_groups.py")
tma = load("tma", "candidate_kernels/fuse_norm/tma_ring.py")
study("qk_norm_rope", "global T=16384", {"head_groups": hg.qk_norm_rope})
study("fuse_norm", "T=16384", {"tma_ring": tma.norm_residual_norm})
study("fuse_norm", "T=1", {"tma_ring": tma.norm_residual_norm})
study("qk_norm_rope", "sliding T=1", {"head_groups": hg.qk_norm_rope})
