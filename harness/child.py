"""The child process: one implementation, imported inside the sandbox, run on fresh seeded inputs.

`python -P -m harness.child <job>/request.json`, started by harness/sandbox.py:run_child. It
reports JSON lines to a file the parent owns (opened before any isolation), and saves outputs in
its scratch directory. It judges nothing numerically: the parent regenerates the inputs from the
seeds, runs the reference and the FP64 evaluation, and compares (harness/parity.py).

Modes:
  parity  import the implementation (a candidate: after the audit hook), then for every shape and
          seed: fresh inputs, poisoned allocator, one call under the cheat checks, outputs saved.
          The reference never runs here, so no stale reference output exists to be found. Then
          the same again for each config in force_configs, alone in its kernel's autotuner, at
          the shapes where the candidate's own call launched that kernel. A child given a later
          part of a candidate's configs (own_call false) runs the own call on the first seed only,
          as "probe", to learn where each kernel launches.
  configs import the candidate without the interpreter and report every config its Triton
          autotuners may choose on a GPU (the parent forces them in the parity child).
  bench   (GPU) warm the baselines (reference, torch.compile of it, library kernels; their outputs
          are saved for parity when the child is the trusted baseline child), then import the
          candidate if any, measure the roofline ceilings and time everything interleaved
          (harness/bench.py), noting which autotuning keys the candidate's calls read at each shape
          (KeyLog); finally re-check the watched functions and report the autotuners' picks.

Cheat checks around every candidate call (names as recorded):
  non_tensor_output         an output that is not exactly a torch.Tensor (a subclass, a list, ...)
  output_aliases_input      an output sharing storage with an input (or outputs sharing storage)
  cached_result             an output whose storage an earlier call already returned (the parent
                            also flags outputs equal to the previous call's on different inputs)
  inputs_mutated            a tensor input changed, other than the task's `mutated` ones
  async_work                an output that changes after return, once the device is synchronized
                            and threads had `settle_s` to finish (side streams, threads)
  background_thread         a Python thread started by the call still alive when it returns
  patched_function          timers, torch.cuda.Event/Stream/synchronize, torch.equal, builtins,
                            harness or task functions rebound (identities snapshot before import)
  fallback_to_reference     a reference_model code object executed during the call (sys.setprofile;
                            the first seed's call at each shape, see parity_loop)
  profile_hook_removed      the call removed the profile hook that watches for the fallback
  stale_memory              (parent) an output holding the allocator poison pattern: it was never
                            written, and would have shown whatever an earlier op left there
  early_launch_trigger      (benchmark child) a Triton kernel of the candidate, compiled in the child,
                            that lets the kernel after it launch before it ends (programmatic dependent
                            launch's griddepcontrol.launch_dependents): back to back, each timed call
                            would start the next one early, which a model step gets only where the
                            kernel before it does the same. Launching as a dependent and waiting for
                            the previous kernel (launch_pdl, griddepcontrol.wait) is not flagged: any
                            previous kernel gives that.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import sandbox
from harness.records import EAGER_FALLBACK

POISON_WORD = 0x7FA1  # as int16: NaN in BF16 and FP16; 0x7FA17FA1 is NaN in FP32
POISON_COPIES = 8  # same-size buffers poisoned per input size (malloc and the caching allocator reuse them)
POISON_COPY_MAX_BYTES = 64 << 20  # larger inputs (expert weights) get no copies: the big block covers them
POISON_BIG_BYTES = (256 << 20, 2 << 30)  # on CUDA: one block, 2x the largest input within these bounds


class Reporter:
    """JSON lines to the parent's report file; the fd is opened before the sandbox closes in."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._start = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        """One event, stamped with `t`: seconds since the reporter opened (where a slow child spent its time)."""
        stamped = {"event": event, "t": round(time.monotonic() - self._start, 3), **fields}
        line = json.dumps(stamped, default=str) + "\n"
        os.write(self._fd, line.encode())


# ---- watched identities -------------------------------------------------------------------------
def _watched_namespaces(task_module: types.ModuleType) -> dict[str, Any]:
    import torch

    from reference_model import ops

    spaces = {
        "torch": torch, "torch.Tensor": torch.Tensor, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Stream": torch.cuda.Stream, "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
        "torch.testing": torch.testing, "time": time,
        "threading": threading, "builtins": builtins, "sys": sys, "harness.child": sys.modules[__name__],
        "harness.sandbox": sandbox, "reference_model.ops": ops, task_module.__name__: task_module,
    }  # fmt: skip
    if "harness.bench" in sys.modules:
        spaces["harness.bench"] = sys.modules["harness.bench"]
    return spaces


def snapshot_identities(task_module: types.ModuleType) -> dict[tuple[str, str], Any]:
    snap = {}
    for space, obj in _watched_namespaces(task_module).items():
        for name, value in list(vars(obj).items()):
            if callable(value) or isinstance(value, staticmethod | classmethod | property):
                snap[(space, name)] = value
    return snap


def changed_identities(snap: dict[tuple[str, str], Any], task_module: types.ModuleType) -> list[str]:
    spaces = _watched_namespaces(task_module)
    missing = object()
    return [
        f"patched_function: {space}.{name}"
        for (space, name), value in snap.items()
        if vars(spaces[space]).get(name, missing) is not value
    ]


# ---- the fallback watch --------------------------------------------------------------------------
def _code_objects(module: types.ModuleType) -> set[types.CodeType]:
    codes: set[types.CodeType] = set()

    def add(code: types.CodeType) -> None:
        codes.add(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    for value in vars(module).values():
        fn = getattr(value, "__wrapped__", value)
        if isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__:
            add(fn.__code__)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for attr in vars(value).values():
                if isinstance(attr, types.FunctionType):
                    add(attr.__code__)
    return codes


class FallbackWatch:
    """sys.setprofile hook: records any reference_model function executed while it is on. Disabled, it
    installs nothing: the hook runs on every Python and C call, which under the Triton interpreter is
    about half of a forced config's time (py-spy on a qk_norm_rope parity child)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.codes: set[types.CodeType] = set()
        for name, module in list(sys.modules.items()):
            if enabled and (name == "reference_model" or name.startswith("reference_model.")):
                self.codes |= _code_objects(module)
        self.hits: list[str] = []
        self.removed = False

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
            if where not in self.hits:
                self.hits.append(where)

    def __enter__(self):
        if self.enabled:
            threading.setprofile(self._profile)
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        still_ours = sys.getprofile() == self._profile
        sys.setprofile(None)
        threading.setprofile(None)
        self.removed = not still_ours
        return False


# ---- the parity loop ---------------------------------------------------------------------------------
def _poison(torch, device, inputs: dict[str, Any]) -> None:
    """Fill and free buffers the sizes of the inputs (and a large one on CUDA) with a NaN pattern, so
    that an output the implementation never writes shows the pattern instead of stale data."""
    sizes = sorted({v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor)})
    buffers = []
    if device.type == "cuda":
        low, high = POISON_BIG_BYTES
        big = min(max(low, 2 * max(sizes, default=0)), high)
        buffers.append(torch.full((big // 2,), POISON_WORD, dtype=torch.int16, device=device))
    for nbytes in sizes:
        if nbytes <= POISON_COPY_MAX_BYTES:
            for _ in range(POISON_COPIES):
                buffers.append(torch.full(((nbytes + 1) // 2,), POISON_WORD, dtype=torch.int16, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    del buffers


def _items(returned: Any) -> list[Any]:
    """What a launcher returned, as a list of outputs (None: an op that only writes its inputs)."""
    if returned is None:
        return []
    return list(returned) if isinstance(returned, tuple | list) else [returned]


def _storage_ptr(t) -> int:
    return t.untyped_storage().data_ptr()


def _bit_equal(torch, a, b) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def compile_fallback(exc: BaseException) -> str | None:
    """The note for the torch.compile peer when `exc` is dynamo refusing to recompile again; else None."""
    if type(exc).__name__ != "FailOnRecompileLimitHit":
        return None
    return (f"{EAGER_FALLBACK}: dynamo's recompile limit was hit (data-dependent shapes recompile per size); "
            f"past it dynamo runs the reference eagerly, which is timed as `reference` ({exc})")[:1000]  # fmt: skip


def error_text(error: BaseException, limit: int = 2000) -> str:
    """An exception as a record's detail: its type and message; for Triton's CompilationError, its innermost cause
    first, in one line. Triton raises an error in a called @jit function as a CompilationError at each call site up
    the chain, each the cause of the next: the outermost names only the line where the kernel calls the first
    helper, and what went wrong is in the innermost. Each prints its location, the function's source up to the line
    it marks with a caret, and then (the innermost) the error; here a site is its location and that line, and the
    call sites follow the innermost, innermost first."""
    chain = [error]
    while type(chain[-1]).__name__ == "CompilationError" and chain[-1].__cause__ not in (None, *chain):
        chain.append(chain[-1].__cause__)
    innermost = chain[-1]
    text = f"{type(innermost).__name__}: {innermost}".strip()
    if type(innermost).__name__ == "CompilationError" and (site := _call_site(str(innermost)))[1]:
        text = f"{type(innermost).__name__}: {site[0]}: {site[1]}"
    sites = [site[0] for e in reversed(chain[:-1]) if (site := _call_site(str(e)))[0]]
    text += ("\nraised through: " + "; ".join(sites)) if sites else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_site(message: str) -> tuple[str, str]:
    """('at 55:12: _fuse_row(y_head, ...', what follows the caret) from a CompilationError's text: its location and
    the source line its caret marks, and the error message printed after it (empty at an outer call site)."""
    lines = message.strip().splitlines()
    caret = next((i for i, line in enumerate(lines) if line.strip() == "^"), None)
    if not lines or not caret:
        return (lines[0] if lines else "", "")
    return f"{lines[0]} {lines[caret - 1].strip()}", " ".join(line.strip() for line in lines[caret + 1 :]).strip()


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "CUDA error" in text or type(exc).__name__ == "AcceleratorError" or "cudaError" in text:
        return "cuda_fault"
    compile_errors = tuple(
        cls
        for mod, name in (("triton.compiler.errors", "CompilationError"), ("triton.runtime.errors", "OutOfResources"))
        if (cls := getattr(sys.modules.get(mod), name, None)) is not None
    )
    if compile_errors and isinstance(exc, compile_errors):
        return "compile_error"
    return "runtime_error"


def checked_call(torch, task, launcher, inputs, device, settle_s, earlier_ptrs, guard, watch_fallback, trusted=False):
    """Call the launcher once under every in-process check. Returns (what it returned, cheats found).

    `trusted` (the baselines: torch.compile keeps its compile-worker threads alive, legitimately)
    skips only the lingering-thread check; outputs changing after return are still caught."""
    snapshot = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in task.mutated}
    input_ptrs = {_storage_ptr(v): k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.numel()}
    _poison(torch, device, inputs)
    threads_before = set(threading.enumerate())
    watch = FallbackWatch(enabled=watch_fallback)
    with watch:
        returned = launcher(**inputs)
    new_threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    cheats: list[str] = []
    items = _items(returned)
    tensors = [t for t in items if type(t) is torch.Tensor]
    for i, t in enumerate(items):
        if type(t) is not torch.Tensor:
            cheats.append(f"non_tensor_output: output {i} is {type(t).__module__}.{type(t).__qualname__}")
    immediate = [t.clone() for t in tensors]
    if device.type == "cuda":
        torch.cuda.synchronize()
    time.sleep(settle_s)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if new_threads and not trusted:
        cheats.append(f"background_thread: {len(new_threads)} thread(s) still running after return "
                      f"({', '.join(t.name for t in new_threads[:3])})")  # fmt: skip
    for i, (t, first) in enumerate(zip(tensors, immediate, strict=True)):
        if not _bit_equal(torch, t, first):
            cheats.append(f"async_work: output {i} changed after the call returned (side stream or thread)")
    seen: dict[int, int] = {}
    for i, t in enumerate(tensors):
        if not t.numel():
            continue
        ptr = _storage_ptr(t)
        if ptr in input_ptrs:
            cheats.append(f"output_aliases_input: output {i} shares storage with input {input_ptrs[ptr]!r}")
        elif ptr in seen:
            cheats.append(f"output_aliases_input: outputs {seen[ptr]} and {i} share storage")
        elif ptr in earlier_ptrs:
            cheats.append(f"cached_result: output {i} is storage an earlier call returned ({earlier_ptrs[ptr]})")
        seen[ptr] = i
    for name, before in snapshot.items():
        if not _bit_equal(torch, inputs[name], before):
            cheats.append(f"inputs_mutated: input {name!r} was written (only {list(task.mutated)} may be)")
    if watch.hits:
        cheats.append(f"fallback_to_reference: executed {', '.join(watch.hits[:5])}")
    if watch.removed:
        cheats.append("profile_hook_removed: the call replaced the harness's profile hook")
    cheats += changed_identities(guard, sys.modules[task.make_inputs.__module__])
    return returned, cheats


def _save_outputs(torch, task, returned, inputs, out_dir: Path, stem: str) -> dict[str, Any]:
    """The returned tensors, then the mutated inputs, saved on the host for the parent to judge."""
    items = _items(returned)
    if not all(type(t) is torch.Tensor for t in items):
        return {"file": None}  # non_tensor_output is already among the cheats
    outputs = items + [inputs[name] for name in task.mutated]
    path = out_dir / (stem.replace("/", "_").replace(" ", "_") + ".pt")
    torch.save({str(i): t.detach().to("cpu") for i, t in enumerate(outputs)}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"file": path.name, "sha256": digest, "n_outputs": len(outputs)}


class LaunchLog:
    """Which of the candidate's Triton autotuners launched in each (shape, seed) call of its parity loop.
    A config forced into a kernel that did not launch at a shape would run the very code the candidate's
    own call ran there: forced_configs_loop skips those shapes instead of asking them again."""

    def __init__(self, autotuners: dict[str, Any]):
        self.current: tuple[str, int] | None = None  # the call in progress (`call`), while the log records
        self.launched: dict[tuple[str, int], set[str]] = {}
        self.completed: set[tuple[str, int]] = set()  # calls that returned: only they say what did not run
        for name, tuner in autotuners.items():
            tuner.run = self._recording(name, tuner.run)  # an instance attribute: kernel[grid](...) calls it

    def _recording(self, name: str, run: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args, **kwargs):
            if self.current is not None:
                self.launched.setdefault(self.current, set()).add(name)
            return run(*args, **kwargs)

        return recorded

    @contextlib.contextmanager
    def call(self, shape: str, seed: int):
        """Records the launches of the call at (shape, seed) made inside; a call that returns is completed."""
        self.current = (shape, seed)
        try:
            yield
            self.completed.add((shape, seed))
        finally:
            self.current = None

    def idle_at(self, kernel: str, shape: str, seed: int) -> bool:
        """Whether the candidate's call at (shape, seed) returned without launching `kernel`."""
        return (shape, seed) in self.completed and kernel not in self.launched.get((shape, seed), set())


class _NotingCache(dict):
    """An autotuner's cache (key -> config) that tells `note` every key read from it."""

    def __init__(self, entries: dict, note: Callable[[Any], None]):
        super().__init__(entries)
        self._note = note

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)


class KeyLog:
    """Which autotuning keys each of the candidate's Triton autotuners read while a shape was timed in its benchmark
    child: its picks at that shape (a record holds those, not every key the child tuned). triton 3.6's
    Autotuner.run reads `self.cache[key]` for the config of each launch; each cache becomes a _NotingCache."""

    def __init__(self, autotuners: dict[str, Any]):
        self.shape: str | None = None  # the shape being timed (`timing`)
        self._autotuners = autotuners
        self._read: dict[str, dict[str, dict]] = {}  # shape -> kernel -> keys (dict keys: first-read order)
        for name, tuner in autotuners.items():
            tuner.cache = _NotingCache(tuner.cache, functools.partial(self._note, name))

    def _note(self, kernel: str, key: Any) -> None:
        if self.shape is not None:
            self._read.setdefault(self.shape, {}).setdefault(kernel, {})[key] = None

    @contextlib.contextmanager
    def timing(self, shape: str):
        self.shape = shape
        try:
            yield
        finally:
            self.shape = None

    def picks(self) -> dict[str, dict[str, dict[str, str]]]:
        """{shape: {kernel: {key: config}}}, as autotuned_choices writes them, for the keys read at each shape
        (called outside any shape's timing: its own reads are not noted)."""
        return {shape: {kernel: {repr(key): str(self._autotuners[kernel].cache[key]) for key in keys}
                        for kernel, keys in kernels.items()}
                for shape, kernels in self._read.items()}  # fmt: skip


def parity_loop(
    torch, request, task, fn, impl, report, monitor, guard, keep_alive, watch_fallback, trusted=False,
    launches: LaunchLog | None = None,
) -> None:  # fmt: skip
    """Every shape and seed through `checked_call`; outputs saved for the parent to judge. A shape whose
    inputs do not fit in GPU memory is reported not run, and the next one runs. `launches`, if given,
    records which autotuners each call launched. `watch_fallback` watches the first seed's call at each
    shape: the shape picks a launcher's code path, the seed only the values (and under the Triton
    interpreter a watched call takes 2.5-4 times as long as the same call unwatched)."""
    from harness.bench import drawn_or_unfit

    device = torch.device(request["device"])
    out_dir = Path(request["scratch"]) / "outputs"
    out_dir.mkdir(exist_ok=True)
    earlier_ptrs: dict[int, str] = {}
    violations = (lambda: list(monitor.violations)) if monitor else list
    for shape_label in request["shapes"]:
        shape = task.shape(shape_label, device)
        for seed in request["seeds"]:
            report.emit("call_start", impl=impl, shape=shape_label, seed=seed)
            inputs, unfit = drawn_or_unfit(lambda shape=shape, seed=seed: task.make_inputs(shape, seed, device))
            if unfit is not None:  # the harness's failure, not the implementation's: that shape is not run
                report.emit("call_error", impl=impl, shape=shape_label, seed=seed, status="not_run",
                            message=f"not run: {unfit}", traceback="", violations=violations())  # fmt: skip
                break
            try:
                with launches.call(shape_label, seed) if launches else contextlib.nullcontext():
                    watched = watch_fallback and seed == request["seeds"][0]
                    returned, cheats = checked_call(torch, task, fn, inputs, device, request["settle_s"],
                                                    earlier_ptrs, guard, watched, trusted)  # fmt: skip
                file_info = _save_outputs(torch, task, returned, inputs, out_dir, f"{impl}-{shape_label}-{seed}")
            except BaseException as e:  # the implementation's failure is data: recorded, the next shape runs
                fallback = compile_fallback(e) if trusted else None
                status = "baseline_unavailable" if fallback else _classify(e)
                report.emit("call_error", impl=impl, shape=shape_label, seed=seed, status=status,
                            message=fallback or error_text(e),
                            traceback=traceback.format_exc()[-6000:], violations=violations())  # fmt: skip
                if status == "cuda_fault":
                    return  # the CUDA context is dead: nothing more can run in this process
                break  # the remaining seeds of this shape would fail alike
            if file_info["file"] is not None:
                for i, t in enumerate(_items(returned)):
                    earlier_ptrs.setdefault(_storage_ptr(t), f"shape {shape_label} seed {seed} output {i}")
            keep_alive.append(returned)  # alive, so that a new allocation cannot reuse an earlier output's storage
            report.emit("call", impl=impl, shape=shape_label, seed=seed, cheats=cheats, violations=violations(),
                        **file_info)  # fmt: skip


def bench_loop(torch, request, task, impls, report, skip: dict[str, set[str]] | None = None,
               keys: KeyLog | None = None) -> None:  # fmt: skip
    """Ceilings, then every shape timed with every implementation interleaved (harness/bench.py),
    but those in skip[shape] (they failed to warm up on that shape); then what one call of each that was
    timed puts on the GPU (bench.launches_per_call). `keys`, if given, notes the autotuning keys read at
    each shape."""
    from harness import bench

    settings = bench.BenchSettings(**request["bench"])
    report.emit("roofline", copy_gbps=bench.measure_copy_gbps(settings),
                gemm_tflops=bench.measure_gemm_tflops(settings) if request["needs_gemm_rate"] else None)  # fmt: skip
    flush = bench.l2_flush_buffer()
    for shape_label in request["shapes"]:
        shape = task.shape(shape_label, torch.device("cuda"))
        timed = {name: fn for name, fn in impls.items() if name not in (skip or {}).get(shape_label, ())}
        with keys.timing(shape_label) if keys else contextlib.nullcontext():
            results = bench.time_shape(task, shape, timed, settings, request["bench_seed"], flush)
            report.emit("timing", shape=shape_label, results={
                name: r if isinstance(r, str) else r.__dict__ for name, r in results.items()
            })  # fmt: skip
            report.emit("launches", shape=shape_label, results=_launches(torch, task, shape, request["bench_seed"], {
                name: fn for name, fn in timed.items() if not isinstance(results.get(name), str)
            }))  # fmt: skip


def _launches(torch, task, shape, seed: int, impls: dict[str, Any]) -> dict[str, Any]:
    """bench.launches_per_call of `impls` on the shape's first input set (a new draw: the timed sets are gone)."""
    from harness import bench

    inputs, failure = bench.drawn_or_unfit(lambda: task.make_inputs(shape, seed, torch.device("cuda")))
    if failure is not None:
        return dict.fromkeys(impls, f"not counted: {failure}")
    return bench.launches_per_call(impls, inputs)


def _autotuners(module: Any) -> dict[str, Any]:
    """The module's Triton autotuners by name (none without Triton)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return {}
    return {name: obj for name, obj in vars(module).items() if isinstance(obj, Autotuner)}


PDL_TRIGGER = "griddepcontrol.launch_dependents"


def compiled_kernels(module: Any) -> Iterator[tuple[str, Any, Any]]:
    """(module global's name, its JIT function, one compiled kernel) for every Triton kernel this process
    compiled from the module: each global is unwrapped through autotuners and heuristics (`.fn`) to an
    object with Triton's per-device kernel caches (triton 3.6: JITFunction.device_caches[device][0]); a
    pending asynchronous compile is awaited. Two globals wrapping one function yield its kernels twice."""
    for attr, value in list(vars(module).items()):
        fn, depth = value, 0
        while fn is not None and not hasattr(fn, "device_caches") and depth < 8:
            fn, depth = getattr(fn, "fn", None), depth + 1
        caches = getattr(fn, "device_caches", None)
        if not isinstance(caches, dict):
            continue
        for per_device in list(caches.values()):
            for kernel in list(per_device[0].values()):  # (kernel cache, key cache, target, backend, binder)
                yield attr, fn, (kernel.result() if hasattr(kernel, "result") else kernel)


def early_launch_triggers(module: Any) -> list[str]:
    """`early_launch_trigger` cheats: the module's compiled kernels whose PTX triggers the next launch."""
    triggering = {
        getattr(fn, "__name__", repr(fn))
        for _, fn, kernel in compiled_kernels(module)
        if PDL_TRIGGER in (getattr(kernel, "asm", None) or {}).get("ptx", "")
    }
    return [
        f"early_launch_trigger: {name} ({PDL_TRIGGER}: back-to-back timed calls of it would overlap)"
        for name in sorted(triggering)
    ]


def autotuned_choices(module: Any) -> dict[str, dict[str, str]]:
    """What each Triton autotuner of the module chose in this process: {kernel: {key: config}}
    (the key is the autotuner's: its key arguments' values, then the tensors' dtypes)."""
    return {
        name: {repr(key): str(config) for key, config in obj.cache.items()}
        for name, obj in _autotuners(module).items()
        if obj.cache
    }


def autotuned_configs(module: Any) -> dict[str, list[dict[str, Any]]]:
    """Every config each Triton autotuner of the module may choose: {kernel: [config, ...]}, a config
    as {"kwargs", "num_warps", "num_stages", "maxnreg"} (JSON, for the parent)."""
    return {
        name: [{"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages,
                "maxnreg": getattr(c, "maxnreg", None)} for c in obj.configs]
        for name, obj in _autotuners(module).items()
    }  # fmt: skip


def forced_configs_loop(torch, request, task, launcher, report, monitor, guard, launches: LaunchLog) -> None:
    """The parity loop again for each config in request["force_configs"], that config alone in its
    kernel's autotuner (impl "candidate@<i>", i its index in the candidate's list, which this child may
    run a part of); the autotuner's own configs come back after each. Only
    at the shapes where the candidate's own call on the first seed launched that kernel: elsewhere
    the config changes nothing ("config_idle"), and one whose kernel ran nowhere is not forced."""
    import triton

    autotuners = _autotuners(sys.modules[launcher.__module__])
    seed = request["seeds"][0]
    for forced in request.get("force_configs") or []:
        i = forced["index"]  # in the candidate's list (a child may run a part of it)
        kernel = autotuners.get(forced["kernel"])
        if kernel is None:
            report.emit("config_not_forced", index=i, reason=f"{forced['kernel']} is not a Triton autotuner here")
            continue
        idle = [s for s in request["shapes"] if launches.idle_at(forced["kernel"], s, seed)]
        if len(idle) == len(request["shapes"]):
            why = f"{forced['kernel']} did not launch at any shape (seed {seed}): nothing to check"
            report.emit("config_not_forced", index=i, reason=why)
            continue
        if idle:
            report.emit("config_idle", index=i, shapes=idle)
        config = forced["config"]
        shipped = kernel.configs
        kernel.configs = [triton.Config(config["kwargs"], num_warps=config["num_warps"],
                                        num_stages=config["num_stages"], maxnreg=config["maxnreg"])]  # fmt: skip
        # One seed: a config is a question of arithmetic, which every shape asks; the seeds' cheat
        # checks ran on the candidate's own config above, as did the fallback watch, which traces
        # every Python call (the interpreter makes some per Triton op: minutes per config). Outputs
        # are kept alive per config only: every config's at once could fill a GPU.
        one_seed = {**request, "seeds": [seed], "shapes": [s for s in request["shapes"] if s not in idle]}
        try:
            parity_loop(torch, one_seed, task, launcher, f"candidate@{i}", report, monitor, guard, [],
                        watch_fallback=False)  # fmt: skip
        finally:
            kernel.configs = shipped
        if request["device"] == "cuda":
            torch.cuda.empty_cache()


# ---- setup ---------------------------------------------------------------------------------------------
def import_candidate(path: str, expected_hash: str, op_name: str):
    source = Path(path).read_bytes()
    if hashlib.sha256(source).hexdigest() != expected_hash:
        raise RuntimeError(f"candidate copy {path} does not have the content hash {expected_hash}")
    name = f"beam_candidate_{expected_hash[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    launcher = getattr(module, op_name, None)
    if not callable(launcher):
        raise AttributeError(f"the module has no callable launcher {op_name!r} after import")
    return launcher


def library_roots_of(torch) -> tuple[str, ...]:
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"],
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             os.path.dirname(os.path.dirname(torch.__file__))}  # fmt: skip
    return tuple(sorted(os.path.realpath(r) for r in roots))


@contextlib.contextmanager
def triton_cache_dir(path: str):
    """Triton compiles into, and loads from, `path` inside the block (Triton and Inductor read
    TRITON_CACHE_DIR at each compile); the previous setting is restored after it."""
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved


def save_compile_artifacts(torch, path: str) -> tuple[int, str | None]:
    """Write what torch.compile compiled or loaded in this process (its Mega-Cache: Inductor's
    graphs with their Triton kernels and autotuning choices) to `path`. Returns the bytes written
    (0: nothing was compiled) and why nothing could be written, or None."""
    try:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return 0, None
        Path(path).write_bytes(saved[0])
    except Exception as e:  # the benchmark children then compile their peers cold
        return 0, f"{type(e).__name__}: {e}"[:500]
    return len(saved[0]), None


def load_compile_artifacts(torch, path: str) -> str | None:
    """Fill this process's compile caches from `path` (written by save_compile_artifacts), so that
    torch.compile finds each graph already lowered: it still traces, it no longer compiles. Returns
    why it could not, or None. (An entry made by other torch or Triton versions or another GPU is
    not used: that graph compiles cold.)"""
    try:
        info = torch.compiler.load_cache_artifacts(Path(path).read_bytes())
    except Exception as e:  # a stale or unreadable file costs a cold compile, nothing else
        return f"{type(e).__name__}: {e}"[:500]
    return None if info is not None else f"{path} did not deserialize (torch's warning is in the child's log)"


class _LoadFailure(logging.Handler):
    """Keeps the first 'Failed to load' record's message and the exception being handled then."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.first is None and "Failed to load" in str(record.msg):
            error = sys.exc_info()[1]
            cause = f"{type(error).__name__}: {error}" if error is not None else "no exception given"
            self.first = f"{record.getMessage()}: {cause}"[:500]


class PeerCompileWatch(contextlib.AbstractContextManager):
    """Counts, while active, the torch.compile graphs loaded from Inductor's caches (the baselines
    child's artifacts, in a benchmark child) and those compiled, and keeps the first reason a
    cached graph failed to load: Inductor logs that failure and compiles instead, silently slower."""

    LOGGER = "torch._inductor.output_code"  # logs "Failed to load artifact" inside its except block

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self.counters = counters  # looked up at each count: its entries may be replaced
        self.failure = _LoadFailure()

    def __enter__(self) -> PeerCompileWatch:
        self.before = self._counts()
        logging.getLogger(self.LOGGER).addHandler(self.failure)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self.failure)
        self.after = self._counts()

    def _counts(self) -> tuple[int, int]:
        # graphs lowered (each once through AOTAutograd), and those Inductor found in its cache; a
        # failed load counts as misses, twice per graph (AOTAutograd's and Inductor's lookups)
        return self.counters["aot_autograd"]["total"], self.counters["inductor"]["fxgraph_cache_hit"]

    def summary(self) -> dict[str, Any]:
        graphs, loaded = (self.after[i] - self.before[i] for i in range(2))
        return {"graphs_loaded": loaded, "graphs_compiled": graphs - loaded, "load_failure": self.failure.first}


def use_prebuilt_flashinfer() -> list[str]:
    """Let flashinfer load the modules the trusted baselines child built, instead of building them
    again. An isolated child's flashinfer workspace is a copy of the trusted one at another path, and
    flashinfer's ninja files name their outputs by absolute path: ninja finds none of them in its log
    and rebuilds every module with nvcc, in every benchmark child. flashinfer loads `<name>/<name>.so`
    as it is from its AOT directory (the layout of the flashinfer-jit-cache package); pointed at the
    copy's built modules, it does. Left alone when flashinfer is not imported or ships AOT modules of
    its own. Returns the modules so provided."""
    env = sys.modules.get("flashinfer.jit.env")
    if env is None:
        return []
    built = Path(env.FLASHINFER_JIT_DIR)
    modules = sorted(so.parent.name for so in built.glob("*/*.so") if so.stem == so.parent.name)
    own = Path(env.FLASHINFER_AOT_DIR)
    if not modules or (own.is_dir() and any(own.iterdir())):
        return []
    env.FLASHINFER_AOT_DIR = built
    return modules


def baseline_impls(task, torch, names: list[str], n_shapes: int, report) -> dict[str, Any]:
    """reference, torch_compile (compiled once per shape, `n_shapes` of them) and the requested
    library baselines; unavailable ones are reported."""
    from tasks.task import BaselineUnavailable

    impls: dict[str, Any] = {}
    for name in names:
        if name == "reference":
            impls[name] = task.reference
        elif name == "torch_compile":
            # Inductor keeps fused intermediates in FP32 unless told to emulate the casts: without
            # this it would skip the reference's BF16 rounding points and compute another function.
            import torch._dynamo.config as dynamo_config
            import torch._inductor.config as inductor_config

            inductor_config.emulate_precision_casts = True
            # A lowered Triton kernel keeps the path of its source in the compiling process's Inductor
            # cache, and looks for its autotuning choice beside it. In a benchmark child that loaded
            # the baselines child's artifacts, that path is in the trusted child's cache, which the
            # sandbox's user may not read. On the H200 every loaded graph failed to load and compiled
            # again (results/gpu_logs/2026-12-01-session5-diag), and qk_norm_rope's peer failed
            # outright: "PermissionError: [Errno 13] Permission denied: '/root/.cache/beam-harness/
            # inductor/m4/<hash>.best_config'" (its records' baseline_notes, d73d845). Without the
            # local autotuning cache a loaded kernel opens nothing outside its child; it autotunes
            # its few configs on its first call, in the warm-up. Set in every child alike: it is
            # part of the cache key.
            inductor_config.autotune_local_cache = False
            # One compiled graph per shape (dynamic=False): past dynamo's recompile limit (8) it would
            # quietly run the reference eagerly (seen on the H200: qk_norm_rope's 12 shapes, the last
            # ones timed as eager under the compile name). Room for every shape, and an error otherwise.
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 4 * n_shapes + 8)
            dynamo_config.fail_on_recompile_limit_hit = True
            impls[name] = torch.compile(task.reference, dynamic=False)
        else:
            try:
                impls[name] = task.baselines[name]()
            except BaselineUnavailable as e:
                report.emit("baseline_unavailable", impl=name, message=str(e)[:1000])
            except Exception as e:  # a library that fails to load: recorded against it, the rest goes on
                report.emit("baseline_error", impl=name, message=f"{type(e).__name__}: {e}"[:1000])
    return impls


def run(request: dict[str, Any], report: Reporter, layers: dict[str, str]) -> None:
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            from harness import interpreter_patches
        except ImportError:
            layers["interpreter_patches"] = "absent"
        else:
            interpreter_patches.apply()
            layers["interpreter_patches"] = "applied"
    from tasks import get_task

    task = get_task(request["task"])
    device = torch.device(request["device"])
    torch.empty(1, device=device)  # initialize the device before the watched identities are taken
    mode, keep_alive = request["mode"], []
    skip: dict[str, set[str]] = {}  # shape -> baselines that failed to warm up there (bench mode)
    impls = baseline_impls(task, torch, request["baselines"], len(request["shapes"]), report)
    if mode == "baselines":  # trusted: no candidate code in this process
        report.emit("isolation", layers=layers)
        guard: dict = {}  # trusted code: torch.compile may rebind torch functions as it traces, legitimately
        for name, fn in impls.items():
            if name != "reference":
                parity_loop(
                    torch, request, task, fn, name, report, None, guard, keep_alive, watch_fallback=False, trusted=True
                )
        if request.get("peer_artifacts") and "torch_compile" in impls:  # every shape's peer is compiled now
            saved_bytes, problem = save_compile_artifacts(torch, request["peer_artifacts"])
            report.emit("peer_artifacts", saved_bytes=saved_bytes, problem=problem)
        if request["timing"]:
            bench_loop(torch, request, task, impls, report)
        report.emit("done", violations=[])
        return
    if mode == "bench":  # compile and warm the baselines before the watched identities are taken
        from harness import bench  # noqa: F401  (binds the timing functions before any candidate code)

        # The peers' Triton kernels (torch.compile's) go to a cache of their own in scratch, never
        # persisted: in the candidate's cache, which is kept for its later runs, a planted file
        # under a peer kernel's key could slow that peer down in every later run. It starts as a
        # copy of the trusted baselines child's cache (sandbox.seed_peer_triton_cache), and the
        # peers' graphs come lowered from that child's compile artifacts (read before any
        # candidate code runs, from a copy in this job's directory).
        # A baseline that fails on a shape is left out of that shape only (torch.compile hits its
        # recompile limit at moe_experts' larger shapes, and still runs the smaller ones).
        prebuilt = use_prebuilt_flashinfer()  # the library baselines' modules, as the baselines child built them
        with (
            triton_cache_dir(os.path.join(request["scratch"], sandbox.PEER_TRITON_CACHE)),
            PeerCompileWatch() as watch,
        ):
            if request.get("peer_artifacts") and "torch_compile" in impls:  # the baselines child's compiles
                problem = load_compile_artifacts(torch, request["peer_artifacts"])
                report.emit("peer_artifacts", loaded=problem is None, problem=problem)
            for shape_label in request["shapes"]:
                inputs = task.make_inputs(task.shape(shape_label, device), request["bench_seed"], device)
                for name in impls:
                    try:
                        impls[name](**inputs)
                    except Exception as e:  # reported; the candidate is timed against the baselines that run
                        note = compile_fallback(e)
                        report.emit("baseline_unavailable" if note else "baseline_error", impl=name,
                                    shape=shape_label, message=note or f"{type(e).__name__}: {e}"[:1000])  # fmt: skip
                        skip.setdefault(shape_label, set()).add(name)
            torch.cuda.synchronize()
        report.emit("peer_warm", **watch.summary(), flashinfer_prebuilt=prebuilt)
    task_module = sys.modules[task.make_inputs.__module__]
    monitor = sandbox.Monitor(
        writable=(os.path.realpath(request["scratch"]),),
        own=os.path.realpath(Path(request["scratch"]).parent),
        library_roots=library_roots_of(torch),
    )
    monitor.install()
    layers.update(audit_hook="active", secret_env="active")
    report.emit("isolation", layers=layers)
    if mode == "bench":  # every stream the candidate makes is joined by the timed windows' end events
        from harness import bench

        bench.watch_streams()
    guard = snapshot_identities(task_module)
    candidate = request["candidate"]
    try:
        launcher = import_candidate(candidate["copy"], candidate["hash"], task.op_name)
    except BaseException as e:  # the candidate's failure is data
        status = "compile_error" if _classify(e) == "compile_error" else "import_error"
        report.emit("import_error", status=status, message=f"{type(e).__name__}: {e}"[:2000],
                    traceback=traceback.format_exc()[-6000:], violations=list(monitor.violations))  # fmt: skip
        return
    report.emit("imported", cheats=changed_identities(guard, task_module), violations=list(monitor.violations))
    if mode == "parity":
        launches = LaunchLog(_autotuners(sys.modules[launcher.__module__]))
        if request.get("own_call", True):
            parity_loop(torch, request, task, launcher, "candidate", report, monitor, guard, keep_alive,
                        watch_fallback=True, launches=launches)  # fmt: skip
        else:  # a later part of the candidate's forced configs: where its kernels launch, on the first seed
            probe = {**request, "seeds": request["seeds"][:1]}
            parity_loop(torch, probe, task, launcher, "probe", report, monitor, guard, keep_alive,
                        watch_fallback=False, launches=launches)  # fmt: skip
        forced_configs_loop(torch, request, task, launcher, report, monitor, guard, launches)
    elif mode == "configs":  # imported without the interpreter: the configs a GPU autotuner may choose
        report.emit("configs", kernels=autotuned_configs(sys.modules[launcher.__module__]))
    else:
        module = sys.modules[launcher.__module__]
        keys = KeyLog(_autotuners(module))
        bench_loop(torch, request, task, {"candidate": launcher, **impls}, report, skip, keys)
        triggers = early_launch_triggers(module)
        report.emit("bench_checks", cheats=changed_identities(guard, task_module) + triggers)
        report.emit("autotuned", kernels=autotuned_choices(module), by_shape=keys.picks())
    report.emit("done", violations=list(monitor.violations))


def main(argv: list[str], run_in_sandbox: Callable[[dict[str, Any], Reporter, dict[str, str]], None] = run) -> None:
    """Enter the sandbox, then `run_in_sandbox(request, report, layers)` (this module's `run`, or
    another child's: harness/inspect_child.py); exit without running anything a candidate left behind."""
    request = json.loads(Path(argv[1]).read_text())
    report = Reporter(request["report_path"])
    code = 0
    try:
        layers = sandbox.enter(Path(request["scratch"]), request.get("drop"), request.get("drop_reason"))
        run_in_sandbox(request, report, layers)
    except BaseException as e:  # reported, then the parent decides whose failure it was
        report.emit("child_error", message=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-6000:])
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit handlers: nothing a candidate registered runs after the report


if __name__ == "__main__":
    main(sys.argv)
