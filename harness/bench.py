"""Benchmark methodology, in one place: how a time is measured, summarized and compared to a floor.

Runs in a child process on the GPU (harness/child.py). Every implementation of a task (candidate,
reference, torch.compile of the reference, library baselines) is timed in the SAME process,
interleaved round-robin (sample i times every implementation once, starting from a rotating one),
so that clock and thermal drift hit them alike and their ratio means something.

- Inputs rotate: ROTATIONS distinct input sets (from distinct seeds), enough to cover
  `l2_cover` x the L2 cache when they are small, so a call does not find its inputs L2-hot from
  the previous call (small decode activations stay L2-hot, as they are in a real decode step).
- Every timed window holds at least `window_us` of GPU work, sized from the last warm-up window,
  so that what a window cannot help timing (the GPU's start after the hold, the end event) is
  spread over many calls. On the H200, windows of three ~20 us calls (T=1000), which then ended
  with a host synchronization, timed one flashinfer top-k at 17.0, 26.7 and 33.5 us in three
  children of one moe_route run, and fuse_norm/persistent_prefetch at 23.66 us (p20-p80
  21.9-25.4), then 13.93 us (13.8-14.2) with 2 ms windows and the reading sweep below.
- Decode-size shapes (T <= decode_max_tokens): `graph_calls` calls, each on the next input set,
  captured in one CUDA graph; a timed window replays it back to back (up to `graph_replays_max`
  times); per-call time = window / calls. Graph replay removes the Python/launch overhead that
  would otherwise be most of a 3 us kernel. If capture fails (a host synchronization in the
  implementation), events are used instead and the timing says so.
- Larger shapes: CUDA events around a window of calls on the real stream, at least `event_calls`
  and at most `event_calls_max` of them.
- Before each event window, outside it, the L2 is swept by READING a buffer twice its size: the
  dirty lines the previous window left are written back during the sweep, and the window's first
  call finds a cold L2 of clean lines. The first sweep wrote the buffer, which left up to one L2
  of dirty lines to be written back inside the window (for a 50 MB L2, about 12 us at the copy
  rate: an upper bound from the sizes, not profiled).
- A spin kernel then holds the GPU while the host enqueues the window's calls (GpuHold), so the
  window starts with every call queued: what it times is the GPU's work, not the host's launch
  path, as a graph replay does. Without the hold, on the H200, fuse_norm/row_per_program timed
  83 us at T=1000 in the sandboxed benchmark child against 57 us in a plain process with this
  module's timers (the same autotuned launch), and 239 against 207 us at T=16384 (Nsight Compute:
  178 us, cold), while its graph replays, which time no launch, were no slower in the child (T=1
  3.60 against 3.94 us, T=64 5.28 against 5.17): the child's slower launches were inside the
  windows (inferred from these figures, not profiled).
- A window ends with its end event, recorded on the timed stream right after the last call (or
  replay): no host round trip is timed. A graph replay is done when every captured node is
  (capture joins side streams back). Eager calls may leave work on another stream: the benchmark
  child remembers every stream made through torch.cuda.Stream once it starts watching, before it
  imports a candidate (watch_streams), and the end event waits for them all; parity's
  `async_work` check catches outputs still being written after a call returns.
- Until the thirteenth session, every window synchronized the device BEFORE its end event, so
  that side streams were inside it. That round trip varied by process: on the H200, two plain
  processes timed the same windows both ways (results/gpu_logs/2026-12-02-session13d, -13e, 30
  windows each way, twice): qk_norm_rope/head_groups at global T=16384 148.0-150.7 us against
  144.9-146.2 closed by the end event, fuse_norm/tma_ring at T=16384 173.7-174.7 against
  171.3-172.1; in graph replays of 800 calls, tma_ring at T=1 2.909-2.997 against 2.894-2.904 and
  head_groups at sliding T=1 1.716-1.799 against 1.696-1.718: 1-5% more in these four. A
  host-timed check after the end event in its place (charge a window whose device synchronization
  took over 50 us; commit aa612da) flagged 25 of 44 windows of head_groups, which uses no other
  stream, and 36-37 of 44 of each baseline at fuse_norm T=1000: the round trip itself varies that
  much. With the end event, the harness's windows read 144.9 and 171.4 us for the first two.
- Warm-up windows first (compilation, autotuning, allocator), then `samples` windows per
  implementation (fewer if a window is slow: `max_seconds` bounds each implementation per shape).
  Summary: p20 / p50 / p80 of the per-call times; (p80 - p20) / p50 is the noise band.
- Roofline: the floor of a shape is max(bytes / copy bandwidth, flops / GEMM rate), both measured
  in the same process (a large device-to-device copy, read + write counted; a large BF16 GEMM),
  between events on the stream with the GPU held while the call is queued (the first sessions
  synchronized before the end event and measured 4013-4081 GB/s, where an 8.6 GB copy measured
  about 4.3 TB/s on these machines; launch and synchronization inside a 250 us window are the
  presumed difference).
  floor_fraction = floor / p50 (1.0 is at the roofline). A p50 below SUSPICIOUS_FRACTION of the
  floor is suspicious: a kernel that mostly reads can beat a copy's rate somewhat (on the H200,
  moe_experts/routed_slots streamed expert weights at 104-108% of the copy bandwidth measured
  beside it), a kernel that skips work beats it by far.
- At decode sizes that roofline is a sliver of any call (fuse_norm moves 60 KB at T = 1: 0.01 us
  at the copy rate, in calls of 2-3 us): a call is launch and latency. So each decode-size shape
  also times one elementwise kernel that moves the shape's bytes (torch.neg: half read, half
  written, over as many rotated buffer pairs as the inputs), the same way and in the same rotation
  as the implementations: what one launch takes to move those bytes. It is reported beside the
  roofline (`copy_floor_us`, `copy_floor_fraction` = copy_floor_us / p50), not used to judge
  suspicion (a kernel may beat torch's at these sizes). On the H200, a graph node that stores one
  float took 1.06 us per call, and the best of 30 layouts of a Triton kernel that reads the router's
  5.2 MB weight 3.12 us (results/gpu_logs/2026-12-02-session14c). The first version (commit
  7aef336, the records of 2026-12-02) timed `dst.copy_(src)`, which a graph captures as a memcpy
  node: 1.08-3.67 us at 37 KB-7.9 MB, but 55.7 us for qkv_gate_gemm's 147 MB at T = 1 and 3 against
  36.5 us at T = 8 and 64 in the same children, where the roofline is 34.6 us.
- Larger shapes time that copy too (from the thirtieth session; decode sizes only before), in event
  windows after the same L2 flush, one buffer pair where the inputs are one set: what torch's
  elementwise copy reaches on the shape's bytes in this process, which a one-pass kernel can be held
  to where the roofline's large memcpy rate is out of reach. On the H200, torch copies of fuse_norm's
  T = 16384 traffic took 162.6 us where 4275 GB/s gives 157.0, and copies of q, k and v (32 of
  qk_norm_rope's 35 KB per token) 135.6-135.7 us where the rate gives 125.6
  (results/gpu_logs/2026-12-04-session30/ring_warps_sweep.log); in the harness's runs of that session
  160.5 us (fuse_norm) and 138.6 / 136.7 us (qk_norm_rope sliding / global), while at T = 1000 the
  fused kernels ran 11-18% faster than it (seen, not profiled). It is skipped, with a note in the
  records, where its buffers would take more than COPY_MEMORY_SHARE of the GPU memory still free.
- Launches: after a shape is timed, each implementation's call on its first input set is captured
  once more in a CUDA graph, and the graph's nodes are counted by kind through the CUDA driver
  (kernels, memsets, memcpys, ...; child graphs are walked, the empty nodes that join streams are not
  work): what one call puts on the GPU, wherever it launched it from (a library, torch's own ops, a
  side stream). Issue 4's "one kernel" goals are judged by it (tasks/task.py Goal.max_launches). A
  call that cannot be captured (a host synchronization) is not counted, and the record says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.records import Timing, error_line

QUANTILES = (0.2, 0.5, 0.8)
# Bound when this module is imported, before any candidate: a candidate that rebinds the module
# attributes later does not change what the harness calls (and is caught: harness/child.py).
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter
_spin = torch.cuda._sleep  # a one-thread kernel that spins for a number of GPU clock cycles
_CUDAGraph = torch.cuda.CUDAGraph


# BenchSettings fields that count something: each must be >= 1
_COUNTS = ("warmup_windows", "samples", "min_samples", "graph_calls", "graph_replays_max", "event_calls",
           "rotations_max")  # fmt: skip


@dataclass(frozen=True)
class BenchSettings:
    warmup_windows: int = 3  # untimed windows first (compilation, autotuning, allocator)
    samples: int = 40  # timed windows per implementation and shape (p20 / p50 / p80 over them)
    min_samples: int = 10  # taken even when max_seconds runs out first
    max_seconds: float = 8.0  # per implementation and shape, over all samples
    decode_max_tokens: int = 64  # T <= this: CUDA-graph replay
    window_us: float = 2000.0  # GPU work per timed window, at least (sized in the warm-up; bounds below)
    graph_calls: int = 100  # calls captured per graph; a window replays it back to back
    graph_replays_max: int = 50  # replays per graph window, at most
    event_calls: int = 3  # calls per event window (larger shapes), at least
    event_calls_max: int = 100  # ... at most
    rotations_max: int = 64  # input sets rotated through at most
    l2_cover: float = 2.0  # rotate enough input sets to cover this multiple of the L2 cache
    rotation_bytes_max: int = 16 << 30  # memory the rotated input sets may take
    copy_bytes: int = 1 << 30  # buffer of the bandwidth measurement
    gemm_size: int = 8192  # M = N = K of the GEMM-rate measurement

    def __post_init__(self) -> None:
        problems = [f"{name}={getattr(self, name)} must be >= 1" for name in _COUNTS if getattr(self, name) < 1]
        if self.event_calls_max < self.event_calls:
            problems.append(f"event_calls_max={self.event_calls_max} is below event_calls={self.event_calls}")
        if self.window_us < 0:
            problems.append(f"window_us={self.window_us} must be >= 0")
        if self.min_samples > self.samples:
            problems.append(f"min_samples={self.min_samples} exceeds samples={self.samples}")
        if self.max_seconds <= 0 or self.l2_cover < 0:
            problems.append(f"max_seconds={self.max_seconds} must be > 0 and l2_cover={self.l2_cover} >= 0")
        if problems:
            raise ValueError("invalid bench settings: " + "; ".join(problems))


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(per_call_us: list[float], method: str, calls_per_window: int, note: str | None) -> Timing:
    p20, p50, p80 = (quantile(per_call_us, q) for q in QUANTILES)
    return Timing(p20, p50, p80, method, len(per_call_us), calls_per_window, note)


SUSPICIOUS_FRACTION = 0.8  # of the floor; see the module docstring


def is_suspicious(p50_us: float, floor_us_: float) -> bool:
    """Faster than the roofline allows beyond a read-over-copy margin: a measurement or a cheat to look at."""
    return p50_us < SUSPICIOUS_FRACTION * floor_us_


def floor_us(bytes_: int, flops: int, copy_gbps: float, gemm_tflops: float | None) -> float:
    """The roofline floor of one call in microseconds."""
    memory_us = bytes_ / (copy_gbps * 1e3)
    compute_us = flops / (gemm_tflops * 1e6) if flops and gemm_tflops else 0.0
    return max(memory_us, compute_us)


def rotation_count(set_bytes: int, l2_bytes: int, settings: BenchSettings) -> int:
    wanted = math.ceil(settings.l2_cover * l2_bytes / max(set_bytes, 1))
    fits = max(1, settings.rotation_bytes_max // max(set_bytes, 1))
    return max(1, min(settings.rotations_max, wanted, fits))


# ---- the device measurements (CUDA only) --------------------------------------------------------
def _events_ms(fn: Callable[[], None], repeats: int) -> list[float]:
    """Times of the harness's own ceiling measurements (no candidate code: no side streams to wait
    for), each between events on the stream, with the GPU held while the call is queued: neither
    the launch nor a synchronization is timed."""
    gpu_hold, times = GpuHold(), []
    for _ in range(repeats):
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        with gpu_hold.queued():
            start.record()
            fn()
            end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def measure_copy_gbps(settings: BenchSettings) -> float:
    """Device-to-device copy bandwidth, read + write counted, median of 10."""
    n = settings.copy_bytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = quantile(_events_ms(lambda: dst.copy_(src), 10), 0.5)
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def measure_gemm_tflops(settings: BenchSettings) -> float:
    """BF16 GEMM rate at M = N = K = gemm_size, median of 10."""
    n = settings.gemm_size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b, out=out)
    ms = quantile(_events_ms(lambda: torch.mm(a, b, out=out), 10), 0.5)
    return 2 * n**3 / (ms * 1e-3) / 1e12


# ---- timing one shape ------------------------------------------------------------------------------
@dataclass
class _Timer:
    """One implementation's timed window, CUDA graph or events."""

    name: str
    window: Callable[[], float]  # runs one timed window, returns per-call microseconds
    method: str
    calls: int
    note: str | None = None
    keep: Any = None  # what must outlive the timer (a graph and its static outputs)
    resize: Callable[[float], int] | None = None  # per-call us of a warm-up window -> calls per window


def _warm_on_side_stream(fn: Callable[..., Any], input_sets: list[dict]) -> None:
    side = _own_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs require
        for i in range(3):
            fn(**input_sets[i % len(input_sets)])
    torch.cuda.current_stream().wait_stream(side)
    _synchronize()


def _graph_timer(name: str, fn: Callable[..., Any], input_sets: list[dict], settings: BenchSettings) -> _Timer:
    graph = torch.cuda.CUDAGraph()
    keep = []
    with torch.cuda.graph(graph):
        for i in range(settings.graph_calls):
            keep.append(fn(**input_sets[i % len(input_sets)]))
    return _replay_timer(name, graph.replay, settings, keep=(graph, keep))


def _units_to_fill(window_us: float, unit_us: float, least: int, most: int) -> int:
    """How many units of `unit_us` of GPU work a window needs to hold `window_us`, within [least, most]."""
    wanted = math.ceil(window_us / unit_us) if unit_us > 0 else most
    return max(least, min(most, wanted))


def _replay_timer(name: str, replay: Callable[[], None], settings: BenchSettings, keep: Any = None) -> _Timer:
    """Windows of back-to-back replays of a graph of `graph_calls` calls (one until resized). A replay
    is one operation of the stream, done when every captured node is (capture joins side streams
    back), so the end event right after the last replay closes the window."""
    calls = settings.graph_calls
    replays = [1]
    gpu_hold = GpuHold()

    def window() -> float:
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        with gpu_hold.queued():
            start.record()
            for _ in range(replays[0]):
                replay()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (calls * replays[0])

    def resize(per_call_us: float) -> int:
        replays[0] = _units_to_fill(settings.window_us, per_call_us * calls, 1, settings.graph_replays_max)
        return calls * replays[0]

    return _Timer(name, window, "cuda_graph", calls, keep=keep, resize=resize)


class GpuHold:
    """Holds the GPU with a spin kernel while the host enqueues a timed window.

    The hold lasts HOLD_MARGIN x the longest enqueue seen so far (the warm-up windows calibrate
    it), at least HOLD_MIN_US; the spin kernel's cycles per microsecond are measured once."""

    HOLD_MARGIN = 1.5
    HOLD_MIN_US = 50.0
    HOLD_MAX_US = 200_000.0

    def __init__(self) -> None:
        self.hold_us = self.HOLD_MIN_US
        self.cycles_per_us: float | None = None

    def next_hold_us(self, enqueue_s: float) -> float:
        """The hold for the next window, after one whose calls took `enqueue_s` to enqueue."""
        self.hold_us = min(self.HOLD_MAX_US, max(self.hold_us, self.HOLD_MARGIN * enqueue_s * 1e6))
        return self.hold_us

    def _calibrate(self) -> float:
        cycles = 1_000_000
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _spin(cycles // 10)  # first launch out of the way
        start.record()
        _spin(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def hold(self) -> None:
        if self.cycles_per_us is None:
            self.cycles_per_us = self._calibrate()
        _spin(int(self.hold_us * self.cycles_per_us))

    @contextlib.contextmanager
    def queued(self) -> Iterator[None]:
        """Hold the GPU, let the block queue its work, and size the next hold by how long that took."""
        self.hold()
        began = _perf_counter()
        yield
        self.next_hold_us(_perf_counter() - began)


def _event_timer(
    name: str, fn: Callable[..., Any], input_sets: list[dict], settings: BenchSettings, flush: torch.Tensor | None,
    note: str | None,
) -> _Timer:  # fmt: skip
    calls = [settings.event_calls]
    counter = [0]
    gpu_hold = GpuHold()

    def window() -> float:
        if flush is not None:
            flush.sum()  # sweep the L2 by reading, outside the window (module docstring)
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        with gpu_hold.queued():  # the calls are queued before the GPU reaches `start`
            start.record()
            for _ in range(calls[0]):
                fn(**input_sets[counter[0] % len(input_sets)])
                counter[0] += 1
            _join_made_streams()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls[0]

    def resize(per_call_us: float) -> int:
        calls[0] = _units_to_fill(settings.window_us, per_call_us, settings.event_calls, settings.event_calls_max)
        return calls[0]

    return _Timer(name, window, "events", calls[0], note, resize=resize)


# ---- streams made by the code being timed ----------------------------------------------------------
_made_streams: dict[int, Any] = {}  # by CUDA handle: the streams made through torch.cuda.Stream since watch_streams()


def watch_streams(stream_cls: Any = None) -> None:
    """Remember every stream made through torch.cuda.Stream from now on (a pool stream, or an external
    handle through ExternalStream), so that an event window's end event waits for the work its calls
    left there (_join_made_streams). The benchmark child calls this before it imports a candidate.
    Not remembered: torch's wrappers of existing streams (current_stream(), default_stream() pass
    stream_id), which are the timed stream or wait for nothing; streams made below torch (a raw
    handle through ctypes), which the sandbox does not claim to stop either (harness/sandbox.py)."""
    stream_cls = stream_cls or torch.cuda.Stream
    make = stream_cls.__new__

    def remembered(cls: type, *args: Any, **kwargs: Any) -> Any:
        stream = make(cls, *args, **kwargs)
        if "stream_id" not in kwargs:
            _made_streams[stream.cuda_stream] = stream
        return stream

    stream_cls.__new__ = remembered


def _join_made_streams() -> None:
    """Make the current stream wait for the work queued so far on every remembered stream."""
    if not _made_streams:
        return
    current = torch.cuda.current_stream()
    for stream in _made_streams.values():
        if stream.cuda_stream != current.cuda_stream:
            current.wait_stream(stream)


def _own_stream() -> Any:
    """A side stream for the harness's own work, not joined by the timed windows unless the code being
    timed made the same stream too (torch hands out a pool's streams in turn)."""
    known = set(_made_streams)
    stream = torch.cuda.Stream()
    if stream.cuda_stream not in known:
        _made_streams.pop(stream.cuda_stream, None)
    return stream


def make_timer(
    name: str, fn: Callable[..., Any], input_sets: list[dict], decode: bool, settings: BenchSettings,
    flush: torch.Tensor | None,
) -> _Timer:  # fmt: skip
    """A graph timer for decode-size shapes (events, with the reason, if capture fails)."""
    _warm_on_side_stream(fn, input_sets)  # an implementation that fails here fails, whatever the method
    if not decode:
        return _event_timer(name, fn, input_sets, settings, flush, None)
    try:
        return _graph_timer(name, fn, input_sets, settings)
    except Exception as e:  # capture refused (host sync, allocation, ...): fall back, and say so
        _synchronize()
        note = f"graph capture failed ({error_line(e)}); events"
        return _event_timer(name, fn, input_sets, settings, None, note)


def time_interleaved(timers: list[_Timer], settings: BenchSettings) -> dict[str, Timing | str]:
    """Warm up every timer, then sample them round-robin; bounded by max_seconds per timer.

    An implementation that raises is dropped from the rotation and reported by its error message
    (a string in place of its Timing); the others go on."""
    failed: dict[str, str] = {}

    def run(t: _Timer) -> float | None:
        try:
            return t.window()
        except Exception as e:  # the implementation's failure is data: the others keep their samples
            _synchronize()
            failed[t.name] = f"{type(e).__name__}: {e}"[:500]
            return None

    slowest_window_s = 0.0
    last_us: dict[str, float] = {}

    def warm(t: _Timer) -> None:
        nonlocal slowest_window_s
        began = _perf_counter()
        if (us := run(t)) is not None:
            last_us[t.name] = us
        slowest_window_s = max(slowest_window_s, _perf_counter() - began)

    for _ in range(settings.warmup_windows):
        for t in timers:
            if t.name not in failed:
                warm(t)
    for t in timers:  # windows grow to window_us of GPU work; one more untimed window at the new size
        if t.resize is not None and t.name in last_us and (calls := t.resize(last_us[t.name])) != t.calls:
            t.calls = calls
            warm(t)  # for event windows, this also sizes the GPU hold for the longer enqueue
    affordable = int(settings.max_seconds / slowest_window_s) if slowest_window_s > 0 else settings.samples
    samples = max(settings.min_samples, min(settings.samples, affordable))
    per_call: dict[str, list[float]] = {t.name: [] for t in timers}
    for i in range(samples):
        k = i % len(timers)
        for t in timers[k:] + timers[:k]:
            if t.name not in failed and (us := run(t)) is not None:
                per_call[t.name].append(us)
    return {
        t.name: failed[t.name] if t.name in failed else summarize(per_call[t.name], t.method, t.calls, t.note)
        for t in timers
    }


def l2_flush_buffer() -> torch.Tensor:
    """Twice the L2 of clean data, read before each event window (see the module docstring)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return torch.ones(2 * l2 // 4, dtype=torch.float32, device="cuda")


SAME_BYTES_COPY = "(a copy of the same bytes)"  # its key in time_shape's results: no implementation's name
COPY_MEMORY_SHARE = 0.5  # the same-bytes copy's buffers may take at most this share of the free GPU memory


def same_bytes_copy_unfit(copy_bytes: int, free_bytes: int) -> str | None:
    """Why the same-bytes copy is not timed beside a shape (its buffers, `copy_bytes` in all, would take more
    than COPY_MEMORY_SHARE of the GPU memory still free, which the implementations' outputs and workspaces
    need), or None when it fits."""
    if copy_bytes <= COPY_MEMORY_SHARE * free_bytes:
        return None
    return (
        f"not timed: its buffers ({copy_bytes / 2**30:.2f} GiB) would take more than {COPY_MEMORY_SHARE:.0%} "
        f"of the {free_bytes / 2**30:.2f} GiB of GPU memory left free by the inputs"
    )


def same_bytes_copy(nbytes: int, n_sets: int) -> tuple[Callable[..., Any], list[dict]]:
    """An elementwise kernel that moves `nbytes` (half read, half written), and `n_sets` buffer pairs to
    rotate. A kernel, not `dst.copy_(src)`: a graph captures that as a memcpy node (module docstring)."""
    n = max(1, nbytes // 4)  # BF16 elements per buffer

    def copy(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return torch.neg(src, out=dst)

    sets = [{"src": torch.ones(n, dtype=torch.bfloat16, device="cuda"),
             "dst": torch.empty(n, dtype=torch.bfloat16, device="cuda")} for _ in range(n_sets)]  # fmt: skip
    return copy, sets


def _release_cached_memory() -> None:
    """Free what only reference cycles still hold, then return the allocator's cached blocks to the driver."""
    gc.collect()
    torch.cuda.empty_cache()


def drawn_or_unfit(draw: Callable[[], Any]) -> tuple[Any, str | None]:
    """(draw(), None), or (None, why) when what it draws (a shape's inputs) does not fit in GPU memory: the
    shape fails, not the process. What was drawn is released before returning."""
    try:
        return draw(), None
    except torch.cuda.OutOfMemoryError as e:
        failure = f"the shape's inputs did not fit in GPU memory: {error_line(e, 600)}"
    _release_cached_memory()  # outside the handler: the traceback no longer holds what was drawn
    return None, failure


def _input_sets(task: Any, shape: Any, seed_base: int, settings: BenchSettings) -> list[dict]:
    """The shape's seeded input sets on the GPU, as many as rotation_count asks for."""
    device = torch.device("cuda")
    first = task.make_inputs(shape, seed_base, device)
    set_bytes = sum(v.numel() * v.element_size() for v in first.values() if isinstance(v, torch.Tensor))
    n_sets = rotation_count(set_bytes, torch.cuda.get_device_properties(device).L2_cache_size, settings)
    return [first] + [task.make_inputs(shape, seed_base + i, device) for i in range(1, n_sets)]


def time_shape(
    task: Any, shape: Any, impls: dict[str, Callable[..., Any]], settings: BenchSettings, seed_base: int,
    flush: torch.Tensor | None,
) -> dict[str, Timing | str]:  # fmt: skip
    """Time every implementation on one shape, interleaved, on rotating seeded inputs, and beside them a
    copy of the shape's bytes (SAME_BYTES_COPY, module docstring) where its buffers fit. Inputs that do not
    fit in GPU memory fail the shape for every implementation (each result says so), not the process: the
    next shape still runs."""
    _release_cached_memory()  # what earlier shapes left: GBs where a task's inputs are large (moe_experts)
    input_sets, failure = drawn_or_unfit(lambda: _input_sets(task, shape, seed_base, settings))
    if failure is not None:
        return dict.fromkeys(impls, failure)
    decode = shape.params.get("T", math.inf) <= settings.decode_max_tokens
    runs = [(name, fn, input_sets) for name, fn in impls.items()]
    failed: dict[str, str] = {}
    copy_bytes = task.cost(shape).bytes
    unfit = same_bytes_copy_unfit(copy_bytes * len(input_sets), torch.cuda.mem_get_info()[0])
    if unfit is not None:
        failed[SAME_BYTES_COPY] = unfit
    else:
        try:
            runs.append((SAME_BYTES_COPY, *same_bytes_copy(copy_bytes, len(input_sets))))
        except torch.cuda.OutOfMemoryError as e:  # the implementations are still timed
            failed[SAME_BYTES_COPY] = error_line(e)
    timers = []
    for name, fn, sets in runs:
        try:
            timers.append(make_timer(name, fn, sets, decode, settings, flush))
        except Exception as e:  # an implementation that cannot even warm up: reported, the others go on
            _synchronize()
            failed[name] = f"{type(e).__name__}: {e}"[:500]
    return {**failed, **time_interleaved(timers, settings)}


# ---- launches per call -----------------------------------------------------------------------------------
# CUgraphNodeType (cuda.h) -> the name a count goes under. CHILD_GRAPH nodes are walked; EMPTY nodes (made
# where a capture joins streams) carry no work and are not counted.
NODE_KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 6: "event_wait", 7: "event_record",
              8: "semaphore_signal", 9: "semaphore_wait", 10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op",
              13: "conditional"}  # fmt: skip
_CHILD_GRAPH, _EMPTY = 4, 5


class _GraphNodes:
    """The CUDA driver's graph queries (libcuda: cuGraphGetNodes, cuGraphNodeGetType,
    cuGraphChildGraphNodeGetGraph), loaded when first needed."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        p, size = ctypes.c_void_p, ctypes.c_size_t
        self.get_nodes = lib.cuGraphGetNodes
        self.get_nodes.argtypes = [p, ctypes.POINTER(p), ctypes.POINTER(size)]
        self.node_type = lib.cuGraphNodeGetType
        self.node_type.argtypes = [p, ctypes.POINTER(ctypes.c_int)]
        self.child_graph = lib.cuGraphChildGraphNodeGetGraph
        self.child_graph.argtypes = [p, ctypes.POINTER(p)]
        for fn in (self.get_nodes, self.node_type, self.child_graph):
            fn.restype = ctypes.c_int

    @staticmethod
    def _check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} returned CUresult {result}")

    def kinds(self, graph: int, counts: dict[str, int] | None = None) -> dict[str, int]:
        """How many nodes of each kind `graph` (a CUgraph handle) holds, its child graphs' included."""
        counts = {} if counts is None else counts
        n = ctypes.c_size_t(0)
        self._check(self.get_nodes(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (ctypes.c_void_p * n.value)()
        self._check(self.get_nodes(graph, nodes, ctypes.byref(n)), "cuGraphGetNodes")
        for node in nodes[: n.value]:
            kind = ctypes.c_int(-1)
            self._check(self.node_type(node, ctypes.byref(kind)), "cuGraphNodeGetType")
            if kind.value == _CHILD_GRAPH:
                child = ctypes.c_void_p()
                self._check(self.child_graph(node, ctypes.byref(child)), "cuGraphChildGraphNodeGetGraph")
                self.kinds(child.value, counts)
            elif kind.value != _EMPTY:
                name = NODE_KINDS.get(kind.value, f"node type {kind.value}")
                counts[name] = counts.get(name, 0) + 1
        return counts


@functools.cache
def _counting() -> tuple[_GraphNodes, Any]:
    """The driver's graph queries and the stream counts are captured on, made by the first count."""
    return _GraphNodes(), _own_stream()


def call_launches(fn: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, int]:
    """What one call of `fn` on `inputs` puts on the GPU: its nodes by kind, from a CUDA graph of that call
    (module docstring). The call must have run before (compiled, autotuned). It runs once more, uncaptured,
    on the stream the graph is captured on: what an implementation sets up once per stream (a workspace it
    zeroes) is not its call's work."""
    nodes, stream = _counting()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(**inputs)
    graph = _CUDAGraph(keep_graph=True)  # not instantiated: its nodes are read, never replayed
    with torch.cuda.graph(graph, stream=stream):
        out = fn(**inputs)
    try:
        return nodes.kinds(graph.raw_cuda_graph())
    finally:
        del out
        graph.reset()


def launches_per_call(impls: dict[str, Callable[..., Any]], inputs: dict[str, Any]) -> dict[str, dict[str, int] | str]:
    """call_launches of every implementation, or why it could not be counted (a string); one that fails to
    capture leaves the others counted."""
    counted: dict[str, dict[str, int] | str] = {}
    for name, fn in impls.items():
        try:
            counted[name] = call_launches(fn, inputs)
        except Exception as e:  # capture refused (a host synchronization), or no driver to ask
            _synchronize()
            counted[name] = f"not counted: {error_line(e)}"
    return counted
