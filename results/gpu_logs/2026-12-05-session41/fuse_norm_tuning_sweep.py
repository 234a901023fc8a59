"""fuse_norm at 256..4096 rows: each of loads_first's configs as Triton's two timers and the harness's timer rank it.

Why. At T = 1000 loads_first's and mixed_squares' figures in the harness followed their autotuners' picks over three
sessions (plain configs 11.45-12.08 us, the ring config 14.31), each kernel taking one or the other from session to
session. Their autotuners time a config there with triton.testing.do_bench (each call alone between two events,
after the L2 is cleared by writing 256 MB); the harness times windows of calls back to back on rotated input sets
after the L2 is swept by reading. Two children of loads_first change only how the autotuner chooses:
replay_tuned times up to 1024 rows with triton.testing.do_bench_cudagraph (calls back to back in a CUDA graph, one
input set), ring_over_1024 weighs no ring config up to 1024 rows. Here, for each row count:
  default   loads_first's autotuner as shipped, three fresh modules (Triton's cache of picks off): every config's
            [p50, p20, p80] ms as it measured them, and its pick;
  graph     the same with every bucket timed as CUDA-graph replays (replay_tuned's timer), two fresh modules;
  harness   every config forced in a module of its own, all timed by the harness's timer (bench.time_shape: event
            windows of calls back to back on rotated seeded inputs, interleaved, the L2 swept by reading before
            each window, the same-bytes copy beside them), each output compared bit for bit with the first's.
Usage (repository root): python fuse_norm_tuning_sweep.py OUT.jsonl"""

import importlib.util
import itertools
import json
import sys

import torch
import triton

ROWS = (256, 1000, 2048, 4096)
_serial = itertools.count()


def load(name):
    path = f"candidate_kernels/fuse_norm/{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_{next(_serial)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._fuse_norm_ring_kernel.cache_results = False  # tune in this process, not from an earlier one's pick
    return module


def config_name(c):
    k = c.kwargs
    kind = "ring" if k["RING"] else "plain"
    return (f"{kind} p{k['PROGRAMS_PER_SM']} s{k['STAGES']} w{c.num_warps} r{c.maxnreg} fold{int(k['FOLD'])} "
            f"mixed{k['MIXED']}")  # fmt: skip


def main():
    from harness import bench
    from tasks import get_task
    from tasks.fuse_norm import _BEAM, _shape

    out = open(sys.argv[1], "w")

    def emit(**kw):
        print(json.dumps(kw), flush=True)
        out.write(json.dumps(kw) + "\n")
        out.flush()

    task = get_task("fuse_norm")
    dev = torch.device("cuda")
    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    flush = bench.l2_flush_buffer()
    settings = bench.BenchSettings(max_seconds=1.5)
    for T in ROWS:
        shape = _shape(f"T={T}", _BEAM, T)
        inputs = task.make_inputs(shape, 0, dev)
        for timer, repeats in (("default", 3), ("graph", 2)):
            for _ in range(repeats):
                module = load("loads_first")
                if timer == "graph":
                    module._GRAPH_TIMED_ROWS = 1 << 30
                module.norm_residual_norm(**inputs)
                torch.cuda.synchronize()
                kernel = module._fuse_norm_ring_kernel
                emit(T=T, timer=timer, pick=config_name(kernel.best_config),
                     ms={config_name(c): [round(v, 5) for v in t] for c, t in kernel.configs_timings.items()})  # fmt: skip
        impls, first = {}, None
        for c in load("loads_first")._fuse_norm_ring_kernel.configs:
            module = load("loads_first")
            module._fuse_norm_ring_kernel.configs = [c]
            got = module.norm_residual_norm(**inputs)
            first = first or got
            same = all(torch.equal(g.view(torch.int16), f.view(torch.int16)) for g, f in zip(got, first, strict=True))
            emit(T=T, config=config_name(c), bit_exact_with_first=same)
            impls[config_name(c)] = module.norm_residual_norm
        results = bench.time_shape(task, shape, impls, settings, 1, flush)
        for n, r in sorted(results.items(), key=lambda kv: kv[1].p50_us if not isinstance(kv[1], str) else 1e9):
            if isinstance(r, str):
                emit(T=T, timer="harness", impl=n, failed=r)
            else:
                emit(T=T, timer="harness", impl=n, p20=round(r.p20_us, 2), p50=round(r.p50_us, 2),
                     p80=round(r.p80_us, 2))  # fmt: skip


if __name__ == "__main__":
    main()
