"""Evaluates candidates for one task: parity children, verdicts, benchmark children, records, promotion.

    result = runner.evaluate(task, candidates, EvaluationSettings(...))   # -> RunResult

1. Parity: each candidate runs in its own sandboxed child (harness/child.py), in parallel, on
   every shape and seed; the child saves outputs and reports what its checks saw. With
   `configs=all` (what the default, `auto`, means on the interpreter) a first child lists every
   config the candidate's GPU autotuners may choose, and the parity child then runs each alone on
   one seed, at the shapes where the candidate's own call launched its kernel (elsewhere it would
   run the same code again: "idle" there): a candidate passes a shape only if every config run
   there does. On the interpreter, a candidate with more than its share of the run's work gets
   several parity children, its configs dealt among them (plan_parity_children).
2. Baselines (GPU): one trusted child (no candidate code) runs torch.compile of the reference and
   the task's library kernels on the same seeds, then times reference, torch.compile and
   libraries interleaved: the history of the baselines, and their own parity.
3. Verdicts, in this process, shape by shape: regenerate each seed's inputs, run the reference
   (and on the interpreter its truncating variants) and the FP64 evaluation once, judge every
   implementation's saved outputs (harness/parity.py), look for the poison pattern and for
   results repeated across seeds.
4. Benchmark (GPU): each candidate that passed somewhere is timed in its own sandboxed child
   against the baselines, interleaved, on the shapes it passed (harness/bench.py).
5. Records appended to results/<task>/records.jsonl, the promotion decision (harness/promote.py,
   against the kernel in force on this run's GPU) to promotions.jsonl, and a RunRecord with the wall
   time to runs.jsonl.

Compiled kernels are kept between runs under `cache_dir`: each candidate's Triton cache (by content
hash: only that candidate's children write it), the baselines child's per task
(`triton/baselines-<task>`, copied into every benchmark child for its torch.compile peers), and
Inductor's and flashinfer's, used in place by the trusted child only. The baselines child also
saves torch.compile's compile artifacts (PEER_ARTIFACTS, kept as `peers/<task>.bin`), and each
benchmark child loads a copy before it compiles its peers: it traces each graph again but does not
lower it again. A benchmark child loads flashinfer's modules as the baselines child built them, from
its copy of the workspace (harness/child.py use_prebuilt_flashinfer). Its progress line says how
many peer graphs it loaded and compiled, why a load failed, and which flashinfer modules it loaded.

This module is where the failures of candidates become data: a child's exit, report and saved
outputs become a Status with its detail. A failure of the harness itself (a trusted child that
dies, a child that fails before its sandbox is up) raises HarnessError.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from harness import bench, child, environment, parity, promote, sandbox
from harness.candidates import Candidate
from harness.records import (
    DEFAULT_RESULTS_DIR,
    PROMOTIONS_FILE,
    RECORDS_FILE,
    RUNS_FILE,
    EvaluationRecord,
    PromotionRecord,
    RunRecord,
    Status,
    Timing,
    append,
    task_results_dir,
)
from harness.regression import Thresholds
from tasks.task import Shape, Task

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "beam-harness"
BENCH_SEED = 1000  # input sets of the benchmark: seeds 1000, 1001, ...
CONFIGS_TIMEOUT_S = 120.0  # for the child that lists a candidate's autotuner configs (an import, no kernel)
MIN_BENCH_S = 30.0  # a benchmark child needs about this much to warm its peers and time anything
# The trusted baselines child writes torch.compile's compile artifacts here (its scratch); each
# benchmark child gets a copy in its job directory (harness/child.py load_compile_artifacts).
PEER_ARTIFACTS = "peer-compile-artifacts.bin"
# The worst status first: a shape gets the first that applies.
SEVERITY = (Status.SANDBOX_VIOLATION, Status.IMPORT_ERROR, Status.COMPILE_ERROR, Status.CUDA_FAULT, Status.CRASH,
            Status.TIMEOUT, Status.RUNTIME_ERROR, Status.CHEAT_DETECTED, Status.MISMATCH, Status.NOT_RUN,
            Status.BASELINE_UNAVAILABLE, Status.PASSED)  # fmt: skip


class HarnessError(RuntimeError):
    """The harness itself failed (not a candidate): a bug or a broken machine, never data."""


class UsageError(ValueError):
    """Bad input to an evaluation (unknown shape, no GPU for device=cuda): the CLI exits 1."""


@dataclass(frozen=True)
class EvaluationSettings:
    device: str = "auto"  # "auto" (cuda when available), "cuda" or "cpu"
    shapes: tuple[str, ...] = ()  # shape labels; empty: every shape of the device
    seeds: tuple[int, ...] = (1, 2, 3)  # fresh inputs per seed; parity is checked on every call
    jobs: int = 0  # parity children in parallel; 0: one per CPU core (CPU), 2 (GPU)
    parity_timeout_s: float = 600.0  # per parity child (all its shapes and seeds)
    bench_timeout_s: float = 600.0  # per benchmark child
    # Parity and baselines always finish (a cut there would read as the candidate's hang); a benchmark
    # child gets what is left, or is skipped and its candidate recorded untimed, saying why.
    budget_s: float = 0.0  # wall-time budget of the run, bounding its benchmark phase (0: none)
    # "chosen": the configs the candidate's autotuners pick in this run; "all": also every config a
    # GPU autotuner of it may choose, each forced alone on one seed where its kernel launches (one
    # picked on another machine or shape must compute the same function too); "auto": all on the
    # interpreter, chosen on a GPU.
    configs: str = "auto"  # which autotuner configs parity checks: auto, chosen or all
    benchmark: bool = True  # time on the GPU (never on CPU)
    baselines: bool = True  # evaluate torch.compile and library baselines beside the candidates (GPU)
    promote: bool = True  # write the promotion decision
    # A challenger replaces the promoted kernel only if slower on no shape and faster on one, bands
    # apart and by more than this percentage of its p50 (harness/promote.py).
    max_regression_pct: float = Thresholds.min_pct
    # A candidate of this run that fixes the promoted kernel (its CANDIDATE parent names it): it may replace
    # it at equal speed, slower on no shape (harness/promote.py). Empty: none.
    promote_fix: str = ""
    settle_s: float = 0.05  # wait after each call before re-reading outputs (async work check)
    results_dir: str | None = None  # default: <repo>/results
    cache_dir: str | None = None  # default: ~/.cache/beam-harness (Triton per candidate, Inductor, peers, flashinfer)
    keep_scratch: bool = False  # keep the children's job directories (their logs) after the run
    progress: bool = True  # progress bar, where stderr is a terminal (never in a log or a pipe)
    # CUDA_VISIBLE_DEVICES for this evaluation's children, e.g. "1" or "0,1" (None: inherit the parent's).
    # The parent's own GPU work (reference, FP64 judging) stays on its current device.
    cuda_devices: str | None = None
    bench: bench.BenchSettings = field(default_factory=bench.BenchSettings)  # how timing is sampled (harness/bench.py)

    def __post_init__(self) -> None:
        problems = []
        if self.device not in ("auto", "cuda", "cpu"):
            problems.append(f"device must be auto, cuda or cpu; got {self.device!r}")
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            problems.append(f"seeds must be non-negative ints, at least one; got {list(self.seeds)}")
        elif len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds must be distinct; got {list(self.seeds)}")
        if self.jobs < 0:
            problems.append(f"jobs must be >= 0 (0: automatic); got {self.jobs}")
        if self.configs not in ("auto", "chosen", "all"):
            problems.append(f"configs must be auto, chosen or all; got {self.configs!r}")
        if self.budget_s < 0:
            problems.append(f"budget_s must be >= 0 (0: no budget); got {self.budget_s}")
        if self.max_regression_pct < 0:
            problems.append(f"max_regression_pct must be >= 0; got {self.max_regression_pct}")
        if self.parity_timeout_s <= 0 or self.bench_timeout_s <= 0 or self.settle_s < 0:
            problems.append(f"timeouts must be > 0 and settle_s >= 0; got parity_timeout_s={self.parity_timeout_s}, "
                            f"bench_timeout_s={self.bench_timeout_s}, settle_s={self.settle_s}")  # fmt: skip
        if self.cuda_devices is not None and (problem := sandbox.cuda_devices_problem(self.cuda_devices)):
            problems.append(f"cuda_devices: {problem}")
        if problems:
            raise UsageError("invalid evaluation settings: " + "; ".join(problems))

    @property
    def results_path(self) -> Path:
        return Path(self.results_dir) if self.results_dir else DEFAULT_RESULTS_DIR


@dataclass(frozen=True)
class RunResult:
    run: RunRecord
    records: tuple[EvaluationRecord, ...]
    promotion: PromotionRecord | None  # appended by this run (a promotion or a withdrawal), if any
    promotion_reason: str
    assessments: tuple[promote.Assessment, ...]

    def for_implementation(self, name: str) -> list[EvaluationRecord]:
        return [r for r in self.records if r.implementation == name]

    def statuses(self, name: str) -> dict[str, Status]:
        return {r.shape_label: r.status for r in self.for_implementation(name)}


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("device=cuda requested but torch.cuda.is_available() is False on this machine")
    return requested


def select_shapes(task: Task, device: str, labels: Sequence[str]) -> list[Shape]:
    available = task.shapes_for(device)
    if not labels:
        return list(available)
    known = [s.label for s in available]
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise UsageError(f"task {task.name!r} has no shapes {unknown} on {device}; known: {known}")
    return [s for s in available if s.label in labels]


# ---- one implementation in one child ----------------------------------------------------------------
@dataclass
class _Unit:
    """An implementation as evaluated: where it ran, what it reported, per-shape verdict material."""

    name: str
    kind: str  # candidate, reference, torch_compile, library
    candidate: Candidate | None
    run: sandbox.ChildRun | None = None
    job: sandbox.Job | None = None
    child_impl: str = "candidate"  # its name inside the child's report
    calls: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (shape, seed) -> call event
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape -> call_error event
    status: dict[str, tuple[Status, str]] = field(default_factory=dict)  # shape -> decided (status, detail)
    cheats: dict[str, list[str]] = field(default_factory=dict)  # shape -> cheats
    verdicts: dict[str, list[parity.CallParity]] = field(default_factory=dict)  # shape -> per seed
    violations: list[str] = field(default_factory=list)
    isolation: dict[str, str] = field(default_factory=dict)
    global_status: tuple[Status, str] | None = None  # applies to every shape (import error, violation)
    global_cheats: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    timing: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape -> results of its bench child
    launches: dict[str, Any] = field(default_factory=dict)  # shape -> its call's GPU operations by kind, or why not
    roofline: dict[str, float | None] = field(default_factory=dict)
    baseline_notes: dict[str, str] = field(default_factory=dict)  # baseline -> why it has no timing
    shape_notes: dict[str, dict[str, str]] = field(default_factory=dict)  # shape -> the same, for that shape
    autotuned: dict[str, dict[str, str]] = field(default_factory=dict)  # its bench child's autotuning choices
    # shape -> the choices its calls at that shape read (child.KeyLog); a shape missing: the child's, all of them
    autotuned_at: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    bench_skipped: str | None = None  # why its benchmark child never ran (the run's budget)
    seeds: tuple[int, ...] | None = None  # the seeds its child ran (None: the run's)
    forced: list[str] = field(default_factory=list)  # the configs forced in its parity child, described
    config_units: list[tuple[str, _Unit]] = field(default_factory=list)  # (config, its calls), judged like it
    configs_unchecked: list[str] = field(default_factory=list)  # why a listed config was not forced
    idle_shapes: set[str] = field(default_factory=set)  # a forced config's: its kernel did not launch there


class _Evaluation:
    """The state of one run: settings, directories, units, and the steps that fill them. A context
    manager: leaving it removes the run's scratch root (the children's job directories) unless
    `keep_scratch`."""

    def __init__(self, task: Task, candidates: Sequence[Candidate], settings: EvaluationSettings,
                 echo: Callable[[str], None] = print):  # fmt: skip
        self.task, self.settings, self.echo = task, settings, echo
        self.device = resolve_device(settings.device)
        self.shapes = select_shapes(task, self.device, settings.shapes)
        self.on_gpu = self.device == "cuda"
        # The child rounds the interpreter's casts to nearest when harness/interpreter_patches exists.
        self.emulate_truncation = not self.on_gpu and importlib.util.find_spec("harness.interpreter_patches") is None
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.cache_dir = Path(settings.cache_dir) if settings.cache_dir else DEFAULT_CACHE_DIR
        drop = sandbox.drop_target()
        self.drop, self.drop_reason = (list(drop), None) if isinstance(drop, tuple) else (None, drop)
        self.units = [_Unit(c.name, "candidate", c) for c in candidates]
        names = [u.name for u in self.units]
        if len(set(names)) != len(names):
            raise UsageError(f"candidate names must be distinct within a run; got {names}")
        # GPU parity children share the device's memory (a moe_experts child holds ~40 GB): two at a time.
        self.jobs = max(1, settings.jobs or (2 if self.on_gpu else (os.cpu_count() or 1)))
        self.root = Path(tempfile.mkdtemp(prefix=f"beam-harness-{task.name}-"))
        os.chmod(self.root, 0o711)
        self.peer_artifacts: Path | None = None  # the baselines child's torch.compile artifacts, once written
        self.started = time.monotonic()  # the run's budget counts from here

    def __enter__(self) -> _Evaluation:
        return self

    def __exit__(self, *exc_info) -> None:
        if not self.settings.keep_scratch:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- children --
    def _request(self, job: sandbox.Job, mode: str, unit: _Unit | None, baselines: list[str], shapes: list[str],
                 isolate: bool) -> dict[str, Any]:  # fmt: skip
        return {
            "mode": mode, "task": self.task.name, "device": self.device, "shapes": shapes,
            "seeds": list(self.settings.seeds), "scratch": str(job.scratch), "report_path": str(job.report_path),
            "drop": self.drop if isolate else None,
            "drop_reason": self.drop_reason if isolate else "trusted child: no candidate code",
            "candidate": None if unit is None else {"copy": str(job.candidate_copy),
                                                    "hash": unit.candidate.content_hash},
            "baselines": baselines, "settle_s": self.settings.settle_s, "bench": self.settings.bench.__dict__,
            "bench_seed": BENCH_SEED, "timing": self.settings.benchmark,
            "needs_gemm_rate": any(self.task.cost(s).flops and self._compute_bound(s) for s in self.shapes),
        }  # fmt: skip

    def _compute_bound(self, shape: Shape) -> bool:
        cost = self.task.cost(shape)
        return cost.flops / max(cost.bytes, 1) > 50  # arithmetic intensity where a GEMM rate could bind

    def _shared_caches(self) -> dict[str, Path]:
        return {"TORCHINDUCTOR_CACHE_DIR": self.cache_dir / "inductor",
                "FLASHINFER_WORKSPACE_BASE": self.cache_dir / "flashinfer"}  # fmt: skip

    def _spawn(
        self, name: str, mode: str, unit: _Unit | None, baselines: list[str], shapes: list[str], timeout_s: float,
        extra: dict[str, Any] | None = None, threads: int | None = None,
    ) -> tuple[sandbox.ChildRun, sandbox.Job]:  # fmt: skip
        """Run one child. `threads`: its CPU threads; parity children share the CPUs and pass their share,
        the baselines child and each benchmark child run alone and get them all (None)."""
        isolate = unit is not None
        baselines_cache = self.cache_dir / "triton" / f"baselines-{self.task.name}"
        triton_cache = self.cache_dir / "triton" / unit.candidate.content_hash if unit is not None else baselines_cache
        job = sandbox.prepare_job(self.root, name, isolate, unit.candidate.path if unit else None, triton_cache,
                                  self._shared_caches() if mode != "parity" else {})  # fmt: skip
        request = {**self._request(job, mode, unit, baselines, shapes, isolate), **(extra or {})}
        if mode == "baselines":
            request["peer_artifacts"] = str(job.scratch / PEER_ARTIFACTS)
        if mode == "bench":
            sandbox.seed_peer_triton_cache(job, baselines_cache)
            if self.peer_artifacts is not None:  # a copy per child, read before its candidate is imported
                copy = job.job_dir / PEER_ARTIFACTS
                shutil.copyfile(self.peer_artifacts, copy)
                os.chmod(copy, 0o644)
                request["peer_artifacts"] = str(copy)
        threads = threads or max(1, os.cpu_count() or 1)
        run = sandbox.run_child(job, request, timeout_s, self.device, threads, self.settings.cuda_devices)
        ended = "timed out" if run.timed_out else "ended"
        self.echo(f"{self.task.name}: {mode} child {name} {ended} after {run.wall_s:.1f} s{_compile_note(mode, run)}")
        if mode == "baselines":  # kept for later runs too, in case a warm cache leaves nothing to save
            saved, kept = job.scratch / PEER_ARTIFACTS, self.cache_dir / "peers" / f"{self.task.name}.bin"
            if saved.is_file() and saved.stat().st_size:
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(saved, kept)
            self.peer_artifacts = kept if kept.is_file() else None
        # Parity children share the GPU (self.jobs at a time): their autotuning choices are not kept.
        sandbox.persist_triton_cache(job, triton_cache, autotuning=mode != "parity")
        return run, job

    @property
    def all_configs(self) -> bool:
        return self.settings.configs == "all" or (self.settings.configs == "auto" and not self.on_gpu)

    def run_parity_children(self, bar: tqdm) -> None:
        labels = [s.label for s in self.shapes]

        def listed(unit: _Unit) -> list[dict[str, Any]]:
            # A file that never names triton has no Triton autotuner: no child to list them.
            uses_triton = b"triton" in unit.candidate.path.read_bytes()
            return self._list_configs(unit) if self.all_configs and uses_triton else []

        with ThreadPoolExecutor(max_workers=min(self.jobs, len(self.units) or 1)) as pool:
            forced = list(pool.map(listed, self.units))
        for unit, configs in zip(self.units, forced, strict=True):
            unit.forced = [_describe_config(f) for f in configs]
        # On a GPU every child of a candidate would autotune it again: one child per candidate there.
        plan = plan_parity_children([len(f) for f in forced], len(self.settings.seeds),
                                    1 if self.on_gpu else self.jobs)  # fmt: skip
        workers = min(self.jobs, len(plan) or 1)
        threads = max(1, (os.cpu_count() or 1) // workers)
        children: dict[tuple[int, int], tuple[sandbox.ChildRun, sandbox.Job]] = {}
        parts = {u: [c for c in plan if c.unit == u] for u in range(len(self.units))}
        unfinished = {u: len(mine) for u, mine in parts.items()}
        lock = threading.Lock()

        def one(child: ParityChild) -> None:
            unit = self.units[child.unit]
            name = f"parity-{unit.candidate.short_hash}" + (f"-{child.part}" if child.part else "")
            extra = {"force_configs": [{**forced[child.unit][i], "index": i} for i in child.configs],
                     "own_call": child.part == 0}  # fmt: skip
            children[(child.unit, child.part)] = self._spawn(
                name, "parity", unit, [], labels, self.settings.parity_timeout_s, extra, threads
            )
            with lock:
                unfinished[child.unit] -= 1
                if not unfinished[child.unit]:
                    bar.update(1)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, plan))
        for u, unit in enumerate(self.units):
            unit.run, unit.job = children[(u, 0)]
            self._read_events(unit, self.settings.parity_timeout_s)
            ran_by = {i: children[(u, c.part)] for c in parts[u] for i in c.configs}
            events = [e for c in parts[u] for e in children[(u, c.part)][0].events]
            not_forced = {e["index"]: e["reason"] for e in events if e["event"] == "config_not_forced"}
            idle = {e["index"]: set(e["shapes"]) for e in events if e["event"] == "config_idle"}
            unit.configs_unchecked = [f"{unit.forced[i]}: {why}" for i, why in sorted(not_forced.items())]
            for i, described in enumerate(unit.forced):
                if i in not_forced:
                    continue
                run, job = ran_by[i]
                config_unit = _Unit(f"{unit.name}@{i}", "candidate", unit.candidate, run, job,
                                    child_impl=f"candidate@{i}", seeds=self.settings.seeds[:1],
                                    idle_shapes=idle.get(i, set()))  # fmt: skip
                self._read_events(config_unit, self.settings.parity_timeout_s)
                unit.config_units.append((described, config_unit))

    def _list_configs(self, unit: _Unit) -> list[dict[str, Any]]:
        """Every config the candidate's GPU autotuners may choose, from a sandboxed child that imports it
        without the interpreter; distinct ones only (on the interpreter, distinct constexprs: warps and
        register caps change nothing there). A candidate that does not import lists none: its parity
        child reports why."""
        # An import compiles nothing: the child starts with an empty Triton cache, not a copy of one.
        job = sandbox.prepare_job(self.root, f"configs-{unit.candidate.short_hash}", True, unit.candidate.path,
                                  self.root / "no-triton-cache", {})  # fmt: skip
        request = {**self._request(job, "configs", unit, [], [], True), "device": "cpu"}
        run = sandbox.run_child(job, request, CONFIGS_TIMEOUT_S, "cpu", 1, interpret=False)
        listed = next((e["kernels"] for e in run.events if e["event"] == "configs"), None)
        if listed is None:
            return []
        forced, seen = [], set()
        for kernel, configs in listed.items():
            for config in configs:
                key = json.dumps([kernel, config if self.on_gpu else config["kwargs"]], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    forced.append({"kernel": kernel, "config": config})
        return forced

    def run_baselines_child(self, bar: tqdm) -> None:
        """The trusted child: torch.compile and library outputs for parity, then baseline timings. A
        library that crashes it is recorded (crash, on the baselines), not fatal."""
        names = ["reference", "torch_compile", *self.task.baselines]
        run, job = self._spawn("baselines", "baselines", None, names, [s.label for s in self.shapes],
                               self.settings.bench_timeout_s)  # fmt: skip
        bar.update(1)
        for e in run.events:
            if e["event"] == "child_error":  # a Python exception in the harness's own code: a bug
                raise HarnessError(f"the trusted baselines child failed:\n{e['traceback']}")
        unavailable = {e["impl"]: e["message"] for e in run.events if e["event"] == "baseline_unavailable"}
        broken = {e["impl"]: e["message"] for e in run.events if e["event"] == "baseline_error"}
        for name in names:
            kind = name if name in ("reference", "torch_compile") else "library"
            unit = _Unit(name, kind, None, run, job, child_impl=name)
            if name in unavailable:
                unit.global_status = (Status.BASELINE_UNAVAILABLE, unavailable[name])
            elif name in broken:
                unit.global_status = (Status.RUNTIME_ERROR, f"the baseline factory raised: {broken[name]}")
            self._read_events(unit, self.settings.bench_timeout_s)
            self._read_timing(unit, run, name)
            self.units.append(unit)

    def run_bench_children(self, bar: tqdm) -> None:
        names = ["reference", "torch_compile", *self.task.baselines] if self.settings.baselines else ["reference"]
        budget = self.settings.budget_s
        for unit in [u for u in self.units if u.kind == "candidate"]:
            shapes = [s.label for s in self.shapes if unit.status.get(s.label, (None,))[0] is Status.PASSED]
            left = budget - (time.monotonic() - self.started) if budget else math.inf
            if shapes and left < MIN_BENCH_S:
                unit.bench_skipped = (
                    f"skipped: the run's budget of {budget:g} s was spent before its benchmark child could start "
                    f"({max(left, 0.0):.0f} s left, {MIN_BENCH_S:g} s needed)"
                )
                self.echo(f"{self.task.name}: {unit.name}: benchmark {unit.bench_skipped}")
            if not shapes or unit.bench_skipped:
                bar.update(1)
                continue
            limit = min(self.settings.bench_timeout_s, left)
            run, unit.job = self._spawn(f"bench-{unit.candidate.short_hash}", "bench", unit, names, shapes, limit)
            bar.update(1)
            if run.timed_out and limit < self.settings.bench_timeout_s:
                unit.baseline_notes["benchmark child"] = f"stopped at the end of the run's budget ({budget:g} s)"
            self._read_bench(unit, run, shapes)

    # -- reading what children reported --
    def _read_events(self, unit: _Unit, limit_s: float) -> None:
        run = unit.run
        unit.wall_s = run.wall_s
        started: list[tuple[str, int]] = []
        finished: set[tuple[str, int]] = set()
        isolated = False
        for e in run.events:
            kind = e["event"]
            unit.violations = sorted(set(unit.violations) | set(e.get("violations") or []))
            if kind == "isolation":
                unit.isolation, isolated = e["layers"], True
            elif kind == "import_error":
                unit.global_status = (Status(e["status"]), e["message"])
            elif kind == "imported":
                unit.global_cheats += e.get("cheats", [])
            elif kind == "child_error":
                if not isolated or unit.kind != "candidate":
                    raise HarnessError(f"child {unit.job.name} failed before the candidate ran:\n{e['traceback']}")
                unit.global_status = (Status.CRASH, f"the child failed outside a call: {e['message']}")
            elif e.get("impl") != unit.child_impl:
                continue
            elif kind == "call_start":
                started.append((e["shape"], e["seed"]))
            elif kind == "call":
                unit.calls[(e["shape"], e["seed"])] = e
                finished.add((e["shape"], e["seed"]))
            elif kind == "call_error":
                unit.errors.setdefault(e["shape"], e)
                finished.add((e["shape"], e["seed"]))
        done = any(e["event"] == "done" for e in run.events)
        if not isolated and unit.kind == "candidate" and not run.timed_out:
            raise HarnessError(f"child {unit.job.name} exited {run.returncode} before its sandbox was up; "
                               f"its log ends:\n{run.log_tail}")  # fmt: skip
        if not done and unit.global_status is None:
            # The call in flight when the child died gets the blame; shapes it never reached, not_run;
            # shapes whose every call finished keep their verdicts.
            in_flight = [k for k in started if k not in finished]
            cut = in_flight[-1][0] if in_flight else None
            if run.timed_out:
                total = len(self.shapes) * len(unit.seeds or self.settings.seeds)
                where = f"; it had finished {len(finished)} of {total} calls"
                if in_flight:
                    where += f", the last started at {_started_at(run.events, in_flight[-1]):.1f} s"
                why = (Status.TIMEOUT, f"killed after {limit_s:g} s (the limit){where}")
            else:
                sig = run.signal_name
                why = (Status.CRASH, f"the child died ({sig or f'exit {run.returncode}'}) without reporting")
            for label in (s.label for s in self.shapes):
                if label in unit.errors or label in unit.status:
                    continue
                if label == cut:
                    unit.status[label] = why
                elif any((label, seed) not in unit.calls for seed in unit.seeds or self.settings.seeds):
                    unit.status[label] = (Status.NOT_RUN, f"not run: the child stopped earlier ({why[0].value})")
        if unit.violations and unit.kind == "candidate":
            unit.global_status = (Status.SANDBOX_VIOLATION, "; ".join(unit.violations[:5]))

    def _read_timing(self, unit: _Unit, run: sandbox.ChildRun, impl: str) -> None:
        roofline = next((e for e in run.events if e["event"] == "roofline"), None)
        if roofline is not None:
            unit.roofline = {"copy_gbps": roofline["copy_gbps"], "gemm_tflops": roofline["gemm_tflops"]}
        for e in run.events:
            if e["event"] == "timing":
                unit.timing[e["shape"]] = {"self": e["results"].get(impl), "all": e["results"]}
            elif e["event"] == "launches" and impl in e["results"]:
                unit.launches[e["shape"]] = e["results"][impl]

    def _read_bench(self, unit: _Unit, run: sandbox.ChildRun, shapes: list[str]) -> None:
        """Timings of a candidate's benchmark child; what it did wrong there overrides its parity verdict."""
        overriding: tuple[Status, str] | None = None
        for e in run.events:
            kind = e["event"]
            unit.violations = sorted(set(unit.violations) | set(e.get("violations") or []))
            if kind in ("baseline_unavailable", "baseline_error") and "shape" in e:  # that shape only
                unit.shape_notes.setdefault(e["shape"], {})[e["impl"]] = e["message"]
            elif kind in ("baseline_unavailable", "baseline_error"):
                unit.baseline_notes[e["impl"]] = e["message"]
            elif kind == "bench_checks" and e["cheats"]:
                overriding = (Status.CHEAT_DETECTED, f"in the benchmark child: {e['cheats'][0]}")
                for label in shapes:
                    unit.cheats[label] = list(dict.fromkeys(unit.cheats.get(label, []) + e["cheats"]))
            elif kind == "import_error":
                overriding = (Status(e["status"]), f"in the benchmark child: {e['message']}")
            elif kind == "autotuned":
                unit.autotuned, unit.autotuned_at = e["kernels"], e.get("by_shape") or {}
            elif kind == "child_error":
                unit.baseline_notes["benchmark child"] = e["message"]
        if unit.violations:
            overriding = (Status.SANDBOX_VIOLATION, "; ".join(unit.violations[:5]))
        if overriding is not None:
            for label in shapes:
                unit.status[label] = overriding
            return
        self._read_timing(unit, run, "candidate")
        if not any(e["event"] == "done" for e in run.events):
            why = "timed out" if run.timed_out else f"died ({run.signal_name or f'exit {run.returncode}'})"
            for label in shapes:
                unit.timing.setdefault(label, {"self": f"the benchmark child {why}; log: {run.log_tail[-300:]}"})

    # -- verdicts --
    def judge(self) -> None:
        """Shape by shape, seed by seed: references once, every implementation's outputs judged."""
        device = torch.device(self.device)
        every = [*self.units, *(c for u in self.units for _, c in u.config_units)]
        judged = [u for u in every if u.kind != "reference" and u.global_status is None]
        for shape in self.shapes:
            previous: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
            for seed in self.settings.seeds:
                pending = [u for u in judged if (shape.label, seed) in u.calls and shape.label not in u.errors]
                if not pending:
                    continue
                inputs = self.task.make_inputs(shape, seed, device)
                refs = parity.admissible_references(self.task, inputs, emulate_truncation=self.emulate_truncation)
                expected = parity.Expected(self.task, refs, parity.fp64_evaluation(self.task, inputs))
                for unit in pending:
                    self._judge_call(unit, shape.label, seed, expected, previous, device)
                del inputs, refs, expected
        if self.on_gpu:
            torch.cuda.empty_cache()  # the benchmark children that follow need the device's memory
        for unit in every:
            for shape in self.shapes:
                self._decide(unit, shape.label)
        for unit in self.units:  # a candidate passes a shape only if every forced config run there passed too
            for label in (s.label for s in self.shapes if unit.status[s.label][0] is Status.PASSED):
                ran = [(d, c) for d, c in unit.config_units if label not in c.idle_shapes]
                failed = [(d, c) for d, c in ran if c.status[label][0] is not Status.PASSED]
                if failed:
                    described, config_unit = failed[0]
                    status, detail = config_unit.status[label]
                    unit.status[label] = (status, f"config {described}: {detail}")
                    unit.cheats[label] = config_unit.cheats.get(label, [])

    def _judge_call(self, unit, label, seed, expected: parity.Expected, previous, device) -> None:
        event = unit.calls[(label, seed)]
        cheats = unit.cheats.setdefault(label, [])
        cheats += [c for c in event.get("cheats", []) if c not in cheats]
        if event.get("file") is None:
            return  # non-tensor outputs: nothing to compare; the cheat says why
        path = unit.job.scratch / "outputs" / event["file"]
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != event["sha256"]:
            cheats.append(f"outputs_tampered: {event['file']} changed after the child saved it")
            return
        saved = torch.load(path, map_location=device, weights_only=True)
        got = [saved[str(i)] for i in range(len(saved))]
        for i, t in enumerate(got[: len(got) - len(self.task.mutated)]):
            if _has_poison(t):
                cheats.append(f"stale_memory: output {i} holds allocator poison (seed {seed}): never written")
        verdict = expected.judge(got)
        unit.verdicts.setdefault(label, []).append(verdict)
        before, reference = previous.get(unit.name), expected.references[0].outputs
        if before is not None and _same_outputs(got, before[0]) and not _same_outputs(reference, before[1]):
            cheats.append(f"cached_result: seed {seed} returned the previous seed's outputs for different inputs")
        previous[unit.name] = (got, reference)

    def _decide(self, unit: _Unit, label: str) -> None:
        if unit.global_status is not None:
            unit.status[label] = unit.global_status
            return
        if label in unit.errors:
            e = unit.errors[label]
            unit.status[label] = (Status(e["status"]), f"seed {e['seed']}: {e['message']}")
            return
        cheats = unit.global_cheats + unit.cheats.get(label, [])
        if cheats:
            unit.status[label] = (Status.CHEAT_DETECTED, cheats[0])
            unit.cheats[label] = list(dict.fromkeys(cheats))
            return
        if label in unit.status:
            return  # timeout, crash or not run, decided from the child's exit
        if unit.kind == "reference":
            unit.status[label] = (Status.PASSED, "")
            return
        verdicts, seeds = unit.verdicts.get(label, []), unit.seeds or self.settings.seeds
        missing = [s for s in seeds if (label, s) not in unit.calls]
        failed = [v for v in verdicts if not v.passed]
        if failed:
            unit.status[label] = (Status.MISMATCH, failed[0].reason)
        elif missing or len(verdicts) != len(seeds):
            unit.status[label] = (Status.NOT_RUN, f"no outputs for seeds {missing}")
        else:
            unit.status[label] = (Status.PASSED, "")

    # -- records --
    def records(self, env: dict[str, Any], timing_skipped: str | None) -> list[EvaluationRecord]:
        out = []
        for unit in self.units:
            for shape in self.shapes:
                out.append(self._record(unit, shape, env, timing_skipped))
        return out

    def _record(self, unit: _Unit, shape: Shape, env: dict[str, Any], timing_skipped: str | None) -> EvaluationRecord:
        status, detail = unit.status.get(shape.label, (Status.NOT_RUN, "not evaluated"))
        timing, baselines_us, speedups = None, {}, {}
        notes = {**unit.baseline_notes, **unit.shape_notes.get(shape.label, {})}
        floor = fraction = copy_floor = None
        suspicious = False
        result = unit.timing.get(shape.label)
        # A baseline that misses the parity gate keeps its timing, labelled by its status: a user could
        # still reach for it (torch.compile of fuse_norm is not bit-exact), so its time stays in view.
        timed_anyway = unit.kind != "candidate" and status is Status.MISMATCH
        if status is not Status.PASSED and not timed_anyway:
            skipped = f"not timed: {status.value}"
        elif timing_skipped is not None:
            skipped = timing_skipped
        elif unit.bench_skipped is not None:
            skipped = unit.bench_skipped
        elif result is None or not isinstance(result.get("self"), dict):
            skipped = f"timing failed: {result.get('self') if result else 'no timing reported'}"
        else:
            skipped = None
            timing = Timing(**result["self"])
            for name, r in result["all"].items():
                if name == bench.SAME_BYTES_COPY and isinstance(r, dict):
                    copy_floor = r["p50_us"]
                    continue
                if name == unit.child_impl:
                    continue
                if isinstance(r, dict):
                    baselines_us[name] = {k: r[k] for k in ("p20_us", "p50_us", "p80_us")}
                    speedups[name] = r["p50_us"] / timing.p50_us
                else:
                    notes[name] = r
            if unit.roofline.get("copy_gbps"):
                cost = self.task.cost(shape)
                floor = bench.floor_us(cost.bytes, cost.flops, unit.roofline["copy_gbps"], unit.roofline["gemm_tflops"])
                fraction, suspicious = floor / timing.p50_us, bench.is_suspicious(timing.p50_us, floor)
        if unit.kind != "candidate":
            baselines_us, speedups = {}, {}  # a baseline's record carries its own timing only
        checked = sum(shape.label not in config_unit.idle_shapes for _, config_unit in unit.config_units)
        counted = unit.launches.get(shape.label) if timing is not None else None  # GPU operations of one call
        c = unit.candidate
        return EvaluationRecord(
            run_id=self.run_id, task=self.task.name, implementation=unit.name, kind=unit.kind,
            shape_label=shape.label, shape=dict(shape.params), device=self.device,
            policy="gpu" if self.on_gpu else "interpreter", seeds=list(self.settings.seeds), status=status,
            detail=detail, environment=env, candidate_hash=c.content_hash if c else None,
            candidate_path=c.display_path if c else None, candidate_meta=c.meta.to_dict() if c else None,
            cheats=unit.cheats.get(shape.label, []) if status is Status.CHEAT_DETECTED else [],
            sandbox_events=unit.violations if status is Status.SANDBOX_VIOLATION else [],
            isolation=unit.isolation, parity=parity.summarize(unit.verdicts.get(shape.label, [])),
            timing=timing, timing_skipped=skipped, baselines_us=baselines_us, speedups=speedups,
            floor_us=floor, floor_fraction=fraction, suspicious=suspicious, copy_floor_us=copy_floor,
            copy_floor_fraction=copy_floor / timing.p50_us if copy_floor and timing else None,
            copy_gbps=unit.roofline.get("copy_gbps"), gemm_tflops=unit.roofline.get("gemm_tflops"),
            child_wall_s=unit.wall_s, log_tail=_log_tail(unit, status), baseline_notes=notes,
            autotuned=unit.autotuned_at.get(shape.label, unit.autotuned) if timing is not None else {},
            launches=counted if isinstance(counted, dict) else None,
            launches_note=counted if isinstance(counted, str) else None,
            configs_checked=checked if status is Status.PASSED else 0,  # all of them passed
            configs_idle=len(unit.config_units) - checked, configs_unchecked=unit.configs_unchecked,
        )  # fmt: skip


@dataclass(frozen=True)
class ParityChild:
    """One parity child of a run: `part` 0 runs its candidate's own call on every seed, a later part
    the own call on the first seed only (to learn where each kernel launches); then each runs the
    forced configs `configs` (indices into the candidate's list)."""

    unit: int
    part: int
    configs: tuple[int, ...]


PART_OVERHEAD = 2  # a later part's cost beyond its configs, in configs: its start and its one-seed own call


def plan_parity_children(forced: Sequence[int], seeds: int, jobs: int) -> list[ParityChild]:
    """The parity children for candidates with `forced[u]` forced configs each, longest first.

    A config run costs one unit (one seed), the own call one per seed. A candidate whose cost is more
    than an even share of `jobs` children gets up to `jobs` parts, its configs dealt round-robin
    among them (neighbouring configs of one kernel cost alike), so that one heavy candidate no longer
    holds a core while the others idle; everyone else gets one child."""
    share = sum(seeds + n for n in forced) / max(jobs, 1)
    children = []
    for u, n in enumerate(forced):
        parts = max(1, min(jobs, n, math.ceil((seeds + n) / share))) if n else 1
        children += [ParityChild(u, p, tuple(range(p, n, parts))) for p in range(parts)]
    return sorted(children, key=lambda c: -(len(c.configs) + (seeds if c.part == 0 else PART_OVERHEAD)))


def _describe_config(forced: dict[str, Any]) -> str:
    """'kernel(BLOCK=64, warps=4)': a forced config as the records and the table name it."""
    c = forced["config"]
    parts = [f"{k}={v}" for k, v in c["kwargs"].items()] + [f"warps={c['num_warps']}"]
    parts += [f"maxnreg={c['maxnreg']}"] if c.get("maxnreg") else []
    return f"{forced['kernel']}({', '.join(parts)})"


def _compile_note(mode: str, run: sandbox.ChildRun) -> str:
    """How a child got its peers, for its progress line: the baselines child saved its compile
    artifacts (or could not); a benchmark child loaded them, spent the time up to its 'isolation'
    event compiling and warming the peers, and reported its 'peer_warm' event: torch.compile graphs
    loaded and compiled, the first failed load, flashinfer's prebuilt modules (harness/child.py)."""
    event = next((e for e in run.events if e.get("event") == "peer_artifacts"), None)
    if mode == "baselines" and event is not None:
        n = event.get("saved_bytes") or 0
        if event.get("problem") or not n:
            return f" (no torch.compile artifacts saved: {event.get('problem') or 'nothing was compiled'})"
        size = f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} bytes"
        return f" (saved {size} of torch.compile artifacts)"
    warmed = next((e["t"] for e in run.events if e.get("event") == "isolation"), None)
    if mode != "bench" or not isinstance(warmed, (int, float)):
        return ""
    notes = []
    if event is not None and not event.get("loaded"):
        notes.append(f"compile artifacts unusable: {event.get('problem')}")
    warm = next((e for e in run.events if e.get("event") == "peer_warm"), None)
    if warm is not None:
        loaded, compiled = warm.get("graphs_loaded") or 0, warm.get("graphs_compiled") or 0
        if loaded or compiled:
            source = "from the baselines child's artifacts" if event is not None and event.get("loaded") else "cached"
            notes.append(f"torch.compile graphs: {loaded} {source}, {compiled} compiled")
        if warm.get("load_failure"):
            notes.append(f"first failed load: {warm['load_failure']}")
        if warm.get("flashinfer_prebuilt"):
            notes.append(f"flashinfer modules prebuilt: {', '.join(warm['flashinfer_prebuilt'])}")
    return f" ({warmed:.1f} s of it compiling and warming the peers{': ' if notes else ''}{'; '.join(notes)})"


def _log_tail(unit: _Unit, status: Status) -> str:
    if unit.run is None or status in (Status.PASSED, Status.BASELINE_UNAVAILABLE):
        return ""
    tb = next((e.get("traceback", "") for e in unit.run.events if e.get("traceback")), "")
    return (tb + "\n" + unit.run.log_tail)[-sandbox.LOG_TAIL_CHARS :]


def _started_at(events: Sequence[dict[str, Any]], key: tuple[str, int]) -> float:
    """When (seconds into the child) the call for (shape, seed) started."""
    return next(e.get("t", math.nan) for e in reversed(events)
                if e["event"] == "call_start" and (e["shape"], e["seed"]) == key)  # fmt: skip


def _has_poison(t: torch.Tensor) -> bool:
    patterns = {2: (torch.int16, child.POISON_WORD), 4: (torch.int32, (child.POISON_WORD << 16) | child.POISON_WORD)}
    if t.element_size() not in patterns or not t.numel():
        return False
    dtype, word = patterns[t.element_size()]
    return bool((t.contiguous().view(dtype) == word).any())


def _same_outputs(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        type(x) is torch.Tensor and type(y) is torch.Tensor and x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b, strict=True)
    )  # fmt: skip


def _worst(statuses: Sequence[Status]) -> Status:
    return min(statuses, key=SEVERITY.index) if statuses else Status.NOT_RUN


def evaluate(
    task: Task,
    candidates: Sequence[Candidate],
    settings: EvaluationSettings,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Evaluate `candidates` (validated, harness/candidates.py) for `task`; append the records."""
    started = time.monotonic()
    names = [c.name for c in candidates]
    if settings.promote_fix and settings.promote_fix not in names:
        raise UsageError(f"promote_fix names {settings.promote_fix!r}, which is not a candidate of this run: {names}")
    with _Evaluation(task, candidates, settings, echo) as ev:  # leaving it removes the scratch root
        env = environment.capture().to_dict()
        timing_skipped = None
        if not ev.on_gpu:
            timing_skipped = ("no CUDA GPU: parity ran through the Triton interpreter on CPU shapes; "
                              "timings there are not meaningful and were skipped")  # fmt: skip
        elif not settings.benchmark:
            timing_skipped = "benchmark=false"
        with_baselines = ev.on_gpu and settings.baselines
        n_children = len(ev.units) * (2 if ev.on_gpu and settings.benchmark else 1) + int(with_baselines)
        echo(f"{task.name}: {len(ev.units)} candidate(s) x {len(ev.shapes)} shape(s) x {len(settings.seeds)} seed(s) "
             f"on {ev.device}; run {ev.run_id}")  # fmt: skip
        phases_s: dict[str, float] = {}

        def phase(name: str, work: Callable[[], None]) -> None:
            """Time one phase and say so as soon as it ends (a run killed later still shows where its time went)."""
            t0 = time.monotonic()
            work()
            phases_s[name] = time.monotonic() - t0
            echo(f"{task.name}: {name} phase took {phases_s[name]:.1f} s")

        with progress_bar(n_children, f"{task.name} children", settings.progress) as bar:
            ev.echo = echo = clear_of(bar, echo)
            phase("parity", lambda: ev.run_parity_children(bar))
            if with_baselines:
                phase("baselines", lambda: ev.run_baselines_child(bar))
            phase("judge", ev.judge)
            if ev.on_gpu and settings.benchmark:
                phase("bench", lambda: ev.run_bench_children(bar))
        records = ev.records(env, timing_skipped)
    results = task_results_dir(settings.results_path, task.name)
    for r in records:
        append(results / RECORDS_FILE, r)
    promotion, assessments, reason = None, [], "promotion disabled (promote=false)"
    if settings.promote:
        current = promote.promoted(task.name, settings.results_path, env["device"] if ev.on_gpu else None)
        all_shapes = [s.label for s in task.shapes]
        promotion, assessments, reason = promote.decide(records, all_shapes, current, env, settings.max_regression_pct,
                                                        settings.promote_fix or None)  # fmt: skip
        if promotion is not None:
            append(results / PROMOTIONS_FILE, promotion)
    statuses = {}
    for unit in ev.units:
        statuses[unit.name] = _worst([r.status for r in records if r.implementation == unit.name]).value
    run = RunRecord(
        run_id=ev.run_id, task=task.name, device=ev.device, settings=_jsonable(settings),
        candidates={c.name: c.content_hash for c in candidates}, statuses=statuses,
        wall_s=time.monotonic() - started, phases_s=phases_s, environment=env,
        promoted=promotion.content_hash if promotion is not None and promotion.action == "promote" else None,
        timing_skipped=timing_skipped,
    )  # fmt: skip
    append(results / RUNS_FILE, run)
    return RunResult(run, tuple(records), promotion, reason, tuple(assessments))


def progress_bar(total: int, desc: str, wanted: bool) -> tqdm:
    """A bar of `total` children on stderr where it is a terminal and `wanted`; off in a log or a pipe, whose
    lines would otherwise hold every redraw of it."""
    return tqdm(total=total, desc=desc, unit="child", file=sys.stderr, disable=not (wanted and sys.stderr.isatty()))


def clear_of(bar: tqdm, echo: Callable[[str], None]) -> Callable[[str], None]:
    """`echo` that prints its line with the bar cleared and then draws the bar again below it, instead of
    on the bar's line; `echo` itself where the bar is off."""
    if bar.disable:
        return echo

    def say(line: str) -> None:
        with tqdm.external_write_mode(file=sys.stderr):
            echo(line)

    return say


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _jsonable(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, tuple | list):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
