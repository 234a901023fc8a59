"""Append-only records in results/<task>/: what was measured, where, and what was decided.

Three files per task, one JSON object per line (pandas: `load_frame`):
  records.jsonl     one EvaluationRecord per (run, implementation, shape)
  runs.jsonl        one RunRecord per `harness run` of the task (settings, wall time, outcome)
  promotions.jsonl  PromotionRecords (harness/promote.py); the last one is in force

Records are validated at construction, so a malformed record is a harness bug that crashes at the
point where it is made, not a surprise for the reader. Units are in field names (`p50_us`,
`copy_gbps`). Appending takes an exclusive lock (flock) and writes the whole line with one write()
and an fsync: two processes appending at once never interleave, and an interrupted write can only
leave a torn LAST line. A later append starts on a fresh line, and readers skip (and report) any
line that does not parse, so a torn line never corrupts the records before or after it.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import enum
import fcntl
import json
import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.environment import REPO_ROOT

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_RESULTS_DIR = REPO_ROOT / "results"
RECORDS_FILE, RUNS_FILE, PROMOTIONS_FILE = "records.jsonl", "runs.jsonl", "promotions.jsonl"


class Status(enum.StrEnum):
    """What happened to one implementation on one shape. Only PASSED may be timed and promoted."""

    PASSED = "passed"
    MISMATCH = "mismatch"  # ran, outputs wrong (shape, dtype, non-finite, values, FP64 error)
    CHEAT_DETECTED = "cheat_detected"  # ran, and did something the contract forbids (see `cheats`)
    SANDBOX_VIOLATION = "sandbox_violation"  # tried to read secrets, write outside scratch, use the network
    IMPORT_ERROR = "import_error"  # the module failed to import, or has no launcher
    COMPILE_ERROR = "compile_error"  # Triton refused to compile a kernel
    RUNTIME_ERROR = "runtime_error"  # the launcher raised
    CUDA_FAULT = "cuda_fault"  # a CUDA error (illegal address, launch failure): the context is dead
    CRASH = "crash"  # the child process died (signal, abort) without reporting
    TIMEOUT = "timeout"  # the child exceeded its time limit and was killed
    NOT_RUN = "not_run"  # an earlier shape of the same child crashed or hung before this one ran
    BASELINE_UNAVAILABLE = "baseline_unavailable"  # a library baseline cannot run here (not fatal)


# The note of a torch.compile peer that dynamo could not compile for a shape within its recompile
# limit (data-dependent shapes): past the limit dynamo runs the function eagerly, which is the
# reference, already timed. harness/child.py writes it, harness/promote.py reads it.
EAGER_FALLBACK = "torch.compile falls back to eager here"

IMPLEMENTATION_KINDS = ("candidate", "reference", "torch_compile", "library")


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def new_id() -> str:
    return uuid.uuid4().hex


def error_line(e: BaseException, limit: int = 200) -> str:
    """An exception as records and notes carry it: its type and the first line of its message."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0][:limit] if text else ''}"


def launches_text(launches: dict[str, int]) -> str:
    """'1 kernel', '3 (2 kernels, 1 memset)': a count for tables."""
    total = sum(launches.values())
    parts = [f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in sorted(launches.items(), key=lambda kv: -kv[1])]
    if len(parts) == 1:
        return parts[0]
    return f"{total} ({', '.join(parts)})" if parts else "0 (no GPU work)"


def launches_cell(record: EvaluationRecord | None) -> str:
    """A record's GPU operations per call for tables: launches_text's count, 'not counted' where its call could
    not be captured, '-' where nothing was counted (no record, no timing, or timed before counting)."""
    if record is None or (record.launches is None and not record.launches_note):
        return "-"
    return launches_text(record.launches) if record.launches is not None else "not counted"


_CONFIG_DEFAULTS = ("num_ctas: 1", "maxnreg: None")  # parts of a config's text that every config shows


def autotune_key_text(key: str) -> str:
    """An autotuning key as `EvaluationRecord.autotuned` stores it ("(5120, 16, True, 'torch.bfloat16')") with its
    dtypes left out: "5120, 16, True"."""
    try:
        values = ast.literal_eval(key)
    except (ValueError, SyntaxError):
        return key
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(str(v) for v in values if not str(v).startswith("torch."))


def config_parts(config: str) -> list[str]:
    """A chosen config's text ("BLOCK: 64, num_warps: 4, num_ctas: 1, ...") as its "name: value" parts, the
    defaults every config shows left out."""
    return [part for part in config.split(", ") if part not in _CONFIG_DEFAULTS]


def autotune_changes(now: EvaluationRecord, before: EvaluationRecord) -> list[str]:
    """Every autotuning key of a kernel (by name) both records' benchmark children tuned whose pick differs, as
    "`kernel` (key): name old -> new, ...", old being `before`'s. A record before the fortieth session holds its
    child's picks for every key it tuned, so a change listed on its shape may be another shape's key: the key's
    values tell which."""
    out = []
    for kernel, choices in now.autotuned.items():
        earlier = before.autotuned.get(kernel, {})
        for key, config in choices.items():
            if key not in earlier or earlier[key] == config:
                continue
            old, new = (dict(part.partition(": ")[::2] for part in config_parts(c)) for c in (earlier[key], config))
            moved = [f"{name} {old.get(name, '-')} -> {new.get(name, '-')}"
                     for name in dict.fromkeys([*old, *new]) if old.get(name) != new.get(name)]  # fmt: skip
            out.append(f"`{kernel}` ({autotune_key_text(key)}): {', '.join(moved)}")
    return sorted(out)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_finite_numbers(obj: Any, where: str) -> None:
    """Records are JSON: a NaN or inf would not round-trip. Producers store None (with a reason)."""
    if isinstance(obj, float):
        _require(math.isfinite(obj), f"{where}: non-finite number {obj!r}; store None and say why")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _check_finite_numbers(v, f"{where}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _check_finite_numbers(v, f"{where}[{i}]")


# How a timed window ended (harness/bench.py). "device_sync": the device was synchronized before the
# end event, as every window was until the thirteenth session; that host round trip read figures 1-5%
# above the GPU's time, so a timing is compared only with timings whose windows ended alike.
WINDOW_ENDS = ("end_event", "device_sync")
# The two commits whose records were timed with end-event windows before timings said so.
_END_EVENT_BEFORE_THE_FIELD = ("aa612da641bf7e057d6b16aa7bd37dccf529e02f", "4d58156c88204696384a35579840559f9b128986")


def unrecorded_window_end(git_commit: str | None) -> str:
    """How the windows of a timing written without window_end ended, from the commit that timed it."""
    return "end_event" if git_commit in _END_EVENT_BEFORE_THE_FIELD else "device_sync"


# The commit whose copy floors timed `dst.copy_(src)`, a memcpy node in a graph, not a kernel (bench.py).
MEMCPY_COPY_FLOOR_COMMIT = "7aef336f306d9d04d7f2131d5b91d04e725cbc06"


@dataclass(frozen=True)
class Timing:
    """Quantiles of per-call time of one implementation on one shape (harness/bench.py)."""

    p20_us: float
    p50_us: float
    p80_us: float
    method: str  # "cuda_graph" or "events"
    samples: int
    calls_per_window: int
    note: str | None = None  # e.g. why graph capture failed and events were used instead
    window_end: str = "end_event"  # one of WINDOW_ENDS: how each timed window ended

    def __post_init__(self) -> None:
        _require(
            0 < self.p20_us <= self.p50_us <= self.p80_us,
            f"timing quantiles must satisfy 0 < p20 <= p50 <= p80; got {self.p20_us}, {self.p50_us}, {self.p80_us}",
        )
        _require(self.method in ("cuda_graph", "events"), f"timing method {self.method!r} not in cuda_graph/events")
        _require(self.window_end in WINDOW_ENDS, f"timing window_end {self.window_end!r} not in {WINDOW_ENDS}")
        _require(self.samples > 0 and self.calls_per_window > 0, "timing needs samples > 0 and calls_per_window > 0")

    @property
    def noise(self) -> float:
        """Relative spread (p80 - p20) / p50: the run-to-run noise band of this measurement."""
        return (self.p80_us - self.p20_us) / self.p50_us


@dataclass(frozen=True)
class EvaluationRecord:
    """One implementation on one shape in one run: parity verdict, figures, timings, environment."""

    run_id: str
    task: str
    implementation: str  # candidate name, "reference", "torch_compile" or a library baseline's name
    kind: str  # one of IMPLEMENTATION_KINDS
    shape_label: str
    shape: dict[str, Any]
    device: str  # "cuda" or "cpu"
    policy: str  # parity policy: "gpu" (bit-exact) or "interpreter" (see harness/parity.py)
    seeds: list[int]
    status: Status
    detail: str  # one line: why this status (empty when passed)
    environment: dict[str, Any]
    candidate_hash: str | None = None
    candidate_path: str | None = None
    candidate_meta: dict[str, Any] | None = None
    cheats: list[str] = field(default_factory=list)
    sandbox_events: list[str] = field(default_factory=list)
    isolation: dict[str, str] = field(default_factory=dict)
    parity: dict[str, dict[str, Any]] = field(default_factory=dict)  # output name -> figures (parity.py)
    timing: Timing | None = None
    timing_skipped: str | None = None  # why there is no timing (no GPU, failed parity, ...)
    baselines_us: dict[str, dict[str, float]] = field(default_factory=dict)  # same-process baseline timings
    baseline_notes: dict[str, str] = field(default_factory=dict)  # baseline -> why it has no timing here
    speedups: dict[str, float] = field(default_factory=dict)  # baseline p50 / this p50
    floor_us: float | None = None
    floor_fraction: float | None = None  # floor_us / p50_us: 1.0 is the roofline
    suspicious: bool = False  # faster than the roofline floor allows (harness/bench.py is_suspicious)
    # p50 of one kernel moving the same bytes, timed beside this implementation the same way (harness/bench.py
    # SAME_BYTES_COPY): what one launch takes to move them. None where its buffers did not fit (a baseline note
    # says so) and in records written before it was measured: event-timed shapes have it from the thirtieth
    # session on, decode sizes from the fourteenth; those of MEMCPY_COPY_FLOOR_COMMIT timed a memcpy node.
    copy_floor_us: float | None = None
    copy_floor_fraction: float | None = None  # copy_floor_us / p50_us
    copy_gbps: float | None = None
    gemm_tflops: float | None = None
    child_wall_s: float | None = None
    # Triton autotuners of the candidate -> {autotuning key: chosen config}, as its benchmark child
    # (alone on the GPU) chose them; the configs that were timed above. From the fortieth session on, only the
    # keys its calls at this shape read (harness/child.py KeyLog); before, every key the child tuned.
    autotuned: dict[str, dict[str, str]] = field(default_factory=dict)
    # What one call puts on the GPU, by kind ({"kernel": 1}, {"kernel": 9, "memset": 1}): the nodes of a CUDA graph
    # of one call, counted in the same child after timing (harness/bench.py launches_per_call). None before the
    # thirty-sixth session, or where the call could not be captured: launches_note says why.
    launches: dict[str, int] | None = None
    launches_note: str | None = None
    # Parity of every config its GPU autotuners may choose, each forced alone (`configs=all`): how
    # many were checked on this shape, how many were idle here (their kernel did not launch at this
    # shape, so the candidate's own call already ran what they would), and why any were not forced at
    # all (a kernel not autotuned on the interpreter, or one that launched at no shape).
    configs_checked: int = 0
    configs_idle: int = 0
    configs_unchecked: list[str] = field(default_factory=list)
    log_tail: str = ""
    record_id: str = field(default_factory=new_id)
    created_utc: str = field(default_factory=now_utc)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        if isinstance(self.timing, dict):
            unrecorded = unrecorded_window_end(self.environment.get("git_commit"))
            object.__setattr__(self, "timing", Timing(**{"window_end": unrecorded, **self.timing}))
        _require(self.kind in IMPLEMENTATION_KINDS, f"kind must be one of {IMPLEMENTATION_KINDS}; got {self.kind!r}")
        _require(self.device in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu'; got {self.device!r}")
        _require(self.policy in ("gpu", "interpreter"), f"policy must be 'gpu' or 'interpreter'; got {self.policy!r}")
        _require(bool(self.run_id and self.task and self.implementation), "run_id, task, implementation required")
        if self.kind == "candidate":
            _require(
                self.candidate_hash is not None and len(self.candidate_hash) == 64,
                f"a candidate record needs its 64-hex content hash; got {self.candidate_hash!r}",
            )
        if self.status is Status.PASSED:
            _require(bool(self.parity) or self.kind == "reference", "a passed record must carry its parity figures")
            _require(not self.cheats and not self.sandbox_events, "a passed record cannot list cheats or violations")
        else:
            _require(bool(self.detail), f"status {self.status.value} needs a detail saying why")
        if self.status is Status.CHEAT_DETECTED:
            _require(bool(self.cheats), "status cheat_detected must name the cheats")
        if self.timing is not None:
            # A baseline that misses the parity gate keeps its time in view (harness/runner.py); a
            # candidate is timed only when it passed.
            timed = self.status is Status.PASSED or (self.kind != "candidate" and self.status is Status.MISMATCH)
            _require(timed, f"only passed implementations (and mismatching baselines) are timed; got {self.kind} "
                            f"with status {self.status.value}")  # fmt: skip
        for name, speedup in self.speedups.items():
            _require(speedup > 0, f"speedup over {name!r} must be > 0; got {speedup}")
        _check_finite_numbers(self.to_dict(), f"record {self.implementation}/{self.shape_label}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d


@dataclass(frozen=True)
class RunRecord:
    """One `harness run` of one task: what was asked, how long it took, what came out."""

    run_id: str
    task: str
    device: str
    settings: dict[str, Any]
    candidates: dict[str, str]  # name -> content hash
    statuses: dict[str, str]  # implementation -> worst status over shapes
    wall_s: float
    environment: dict[str, Any]
    promoted: str | None = None  # content hash of the candidate promoted by this run
    phases_s: dict[str, float] = field(default_factory=dict)  # parity / baselines / judge / bench wall time
    timing_skipped: str | None = None
    created_utc: str = field(default_factory=now_utc)

    def __post_init__(self) -> None:
        _require(self.wall_s >= 0, f"wall_s must be >= 0; got {self.wall_s}")
        _check_finite_numbers(self.to_dict(), f"run {self.run_id}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PromotionRecord:
    """The candidate the optimized model should use for a task, and the evidence for it.

    action "promote" puts `content_hash` in force; "withdraw" retracts the promotion in force
    (it failed parity in a later run). The last record of promotions.jsonl is in force.
    `same_code_as` is set by `harness rehash`: the file was edited in its docstrings or comments
    only, and this record moves the promotion of `same_code_as` (the same code, candidates.code_hash)
    to the new bytes, with its evidence.
    """

    task: str
    action: str  # "promote" or "withdraw"
    candidate: str
    path: str
    content_hash: str
    run_id: str
    evidence: list[str]  # record_ids of the EvaluationRecords that justify the decision
    reason: str
    speedups: dict[str, dict[str, float]]  # shape label -> baseline -> speedup (p50 ratio)
    environment: dict[str, Any]
    promotion_id: str = field(default_factory=new_id)
    created_utc: str = field(default_factory=now_utc)
    same_code_as: str = ""  # a content hash: this record moves its promotion to new bytes of the same code

    def __post_init__(self) -> None:
        _require(self.action in ("promote", "withdraw"), f"action must be promote or withdraw; got {self.action!r}")
        _require(len(self.content_hash) == 64, f"content_hash must be 64 hex chars; got {self.content_hash!r}")
        _require(not self.same_code_as or len(self.same_code_as) == 64,
                 f"same_code_as must be empty or 64 hex chars; got {self.same_code_as!r}")  # fmt: skip
        _require(bool(self.evidence), "a promotion record must cite the records it rests on")
        _check_finite_numbers(self.to_dict(), f"promotion {self.task}/{self.candidate}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Record = EvaluationRecord | RunRecord | PromotionRecord
R = TypeVar("R", EvaluationRecord, RunRecord, PromotionRecord)


def task_results_dir(results_dir: Path, task: str) -> Path:
    return Path(results_dir) / task


def append(path: Path, record: Record) -> None:
    """Append one record as one line: exclusive lock, one write, fsync."""
    data = (json.dumps(record.to_dict(), sort_keys=True, allow_nan=False) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a torn line from an interrupted writer: start ours on a fresh line
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class ReadResult:
    rows: list[dict[str, Any]]
    skipped: list[str]  # "line N: why", one per line that did not parse (torn or corrupt)


def read_lines(path: Path) -> ReadResult:
    """Every parseable line of a JSONL file; unparseable lines are skipped and reported."""
    if not path.exists():
        return ReadResult([], [])
    with open(path, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # never read a line while it is being written
        raw = f.read()
    rows, skipped = [], []
    lines = raw.split(b"\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            torn = i == len(lines)  # no newline after it: the writer was interrupted
            kind = "torn last line" if torn else "corrupt line"
            skipped.append(f"{path}:{i}: {kind} skipped ({e})")
            continue
        if not isinstance(obj, dict):
            skipped.append(f"{path}:{i}: not a JSON object, skipped")
            continue
        rows.append(obj)
    return ReadResult(rows, skipped)


def read(path: Path, cls: type[R]) -> tuple[list[R], list[str]]:
    """Typed records of one file (validated again on the way in), plus the skipped-line reports."""
    result = read_lines(path)
    names = {f.name for f in dataclasses.fields(cls)}
    records, skipped = [], list(result.skipped)
    for row in result.rows:
        try:
            records.append(cls(**{k: v for k, v in row.items() if k in names}))
        except (TypeError, ValueError) as e:
            skipped.append(f"{path}: record {row.get('record_id', row.get('run_id', '?'))} invalid, skipped: {e}")
    return records, skipped


def load_frame(results_dir: Path, task: str, file: str = RECORDS_FILE) -> tuple[pd.DataFrame, list[str]]:
    """A task's records as a flat DataFrame (nested dicts become dotted columns: `timing.p50_us`,
    `parity.x_TD.max_ulp`), plus the skipped-line reports. pandas is imported here, not with the module:
    every child imports this module, and pandas brings pyarrow, whose jemalloc starts a thread (the fork
    server forks only while it is one thread: harness/forkserver.py)."""
    import pandas as pd

    result = read_lines(task_results_dir(results_dir, task) / file)
    if not result.rows:
        return pd.DataFrame(), result.skipped
    return pd.json_normalize(result.rows), result.skipped
