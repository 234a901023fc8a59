"""`harness inspect`: a candidate's Triton kernels compiled for the H200 on this machine, no GPU needed.

    harness inspect task=fuse_norm candidate=row_per_program                 the task's first GPU shape
    harness inspect task=qk_norm_rope candidate=head_groups "shapes=['sliding T=1','sliding T=16384']"

For every kernel the candidate launches on a shape, and every config its autotuner could choose
(harness/inspect_child.py, in the sandbox: candidate code), the table gives what the compiler made
of it for sm_90a: registers per thread, spilled bytes, shared memory, barriers, global loads and
stores by bytes per instruction (16 = 128-bit vectors; 2 = one BF16 at a time), the programs an
SM can hold with the binding limit, the SASS instruction mix (static counts: all instructions,
then the conversions, FP64 arithmetic and MUFU among them), and the global load round trips a thread
makes on its worst path (inspect_child.load_round_trips: loads into registers, in straight-line code and
its branches; a loop body read once).
It is the cheap first look before GPU time: a config that spills, loads a BF16 at a time, fits one
program per SM, converts every element through Hopper's slow conversion path, or waits on some of
its loads before issuing the rest (ptxas fitting the registers it allowed itself: router_gemm's
lean_row at T = 1, 2 round trips without a register cap, 1 with one) shows here. Nsight Compute on the GPU (`harness
profile task=... candidate=...`: issue slots and pipe utilizations among its figures) measures what
these figures predict.

The distinct compilations are shared out over `jobs` sandboxed children side by side (0, the default: one per
core, at most MAX_JOBS = 8); a child that dies or times out leaves a crash or timeout record on each shape where it
left configs unreported.
One InspectionRecord per (shape, kernel, config) is appended to results/<task>/inspections.jsonl, in the order of
the launches' configs.
Exit status: 0 when at least one kernel compiled; 1 for bad input, or when nothing compiled (the
table and the records say why).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import candidates as candidate_files
from harness import environment, sandbox
from harness.records import DEFAULT_RESULTS_DIR, append, new_id, now_utc, task_results_dir

INSPECTIONS_FILE = "inspections.jsonl"
CHILD_MODULE = "harness.inspect_child"
MAX_JOBS = 8  # children compiling side by side by default: the cores of a GPU runner, within reason
STATUSES = ("compiled", "compile_error", "no_launch", "import_error", "timeout", "crash", "sandbox_violation")


@dataclass(frozen=True)
class InspectSettings:
    task: str = ""  # required: a name in tasks.TASKS
    candidate: str = ""  # required: a file stem in candidate_kernels/<task>/, or a path
    shapes: tuple[str, ...] = ()  # the task's GPU shape labels; empty: its first GPU shape
    seed: int = 0  # the inputs the launcher is called on (made on the CPU; no kernel runs)
    timeout_s: float = 900.0  # the child, every config's compilation included
    results_dir: str | None = None  # default: <repo>/results
    keep_scratch: bool = False  # keep the children's job directories (request, report, log)
    jobs: int = 0  # children sharing the compilations out, side by side; 0: one per core, at most 8


@dataclass(frozen=True)
class InspectionRecord:
    """What the compiler made of one config of one kernel of a candidate, on one shape (sm_90a)."""

    run_id: str
    task: str
    candidate: str
    candidate_hash: str
    candidate_path: str
    shape_label: str
    status: str  # STATUSES
    kernel: str | None = None
    config: str | None = None
    figures: dict[str, Any] | None = None  # harness/inspect_child.py Figures; None unless compiled
    signature: dict[str, str] | None = None  # the specialized argument types it was compiled for
    detail: str = ""  # why, when not compiled; what the launcher raised after its launches, if it did
    arch: str = "sm_90a"
    environment: dict[str, Any] = field(default_factory=dict)
    record_id: str = field(default_factory=new_id)
    created_utc: str = field(default_factory=now_utc)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}; got {self.status!r}")
        if (self.status == "compiled") != (self.figures is not None):
            raise ValueError(f"figures come with status compiled only; got status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _records(parts: list[sandbox.ChildRun], base: dict[str, Any], shapes: tuple[str, ...]) -> list[InspectionRecord]:
    """The children's reports as the records of one inspection, in the order of the launches' configs; how a
    child ended decides the configs it owned and never reported."""
    events = [e for run in parts for e in run.events]
    violations = sorted({v for e in events for v in e.get("violations") or []})
    if violations:
        detail = "; ".join(violations[:5])
        return [InspectionRecord(**base, shape_label=s, status="sandbox_violation", detail=detail) for s in shapes]
    import_error = next((e for e in events if e["event"] == "import_error"), None)
    if import_error is not None:
        return [InspectionRecord(**base, shape_label=s, status="import_error", detail=import_error["message"])
                for s in shapes]  # fmt: skip
    order = {s: i for i, s in enumerate(shapes)}
    placed = sorted((e for e in events if e["event"] in ("compiled", "compile_error", "no_launch")),
                    key=lambda e: (order[e["shape"]], e["index"]))  # fmt: skip
    out: list[InspectionRecord] = []
    for e in placed:
        kind = e["event"]
        if kind == "compiled":
            out.append(InspectionRecord(**base, shape_label=e["shape"], status="compiled", kernel=e["kernel"],
                                        config=e["config"], figures=e["figures"], signature=e["signature"],
                                        detail=e.get("after_launch") or ""))  # fmt: skip
        elif kind == "compile_error":
            out.append(InspectionRecord(**base, shape_label=e["shape"], status="compile_error", kernel=e["kernel"],
                                        config=e["config"], detail=e["message"]))  # fmt: skip
        else:
            out.append(InspectionRecord(**base, shape_label=e["shape"], status="no_launch", detail=e["message"]))
    lost: dict[str, InspectionRecord] = {}
    for k, run in enumerate(parts):
        if any(e["event"] == "done" for e in run.events):
            continue
        owned = {e["shape"]: set(e["indices"]) for e in run.events if e["event"] == "owned"}
        for e in run.events:
            if e["event"] in ("compiled", "compile_error"):
                owned[e["shape"]].discard(e["index"])
        status = "timeout" if run.timed_out else "crash"
        child = "the child" if len(parts) == 1 else f"the child of part {k + 1} of {len(parts)}"
        why = (f"{child} {'ran past its time limit' if run.timed_out else f'died (exit {run.returncode})'} with "
               f"configs of this shape unreported; its log ends: {run.log_tail[-500:]}")  # fmt: skip
        for s in shapes:
            if (s not in owned or owned[s]) and s not in lost:  # never reached, or some of its configs lost
                lost[s] = InspectionRecord(**base, shape_label=s, status=status, detail=why)
    return sorted(out + list(lost.values()), key=lambda r: order[r.shape_label])  # stable: a shape's losses last


def _bytes_per_instruction(counts: dict[str, int]) -> str:
    """Instructions x bytes each, widest first (8x16B 2x2B); copies to shared memory as 3x cp.async."""
    sized = sorted(((int(k), n) for k, n in counts.items() if k.isdigit()), reverse=True)
    other = [f"{n}x {k}" for k, n in counts.items() if not k.isdigit()]
    return " ".join([f"{n}x{size}B" for size, n in sized] + other) or "-"


def _sass_cell(mix: dict[str, int] | None) -> str:
    """'2725 (231 / 217 / 15)': static SASS instructions, then conversions, FP64 and MUFU among them
    (records from before the SASS mix was counted: '-')."""
    if not mix:
        return "-"
    return f"{mix['instructions']} ({mix['conversions']} / {mix['fp64']} / {mix['mufu']})"


def table(records: list[InspectionRecord]) -> str:
    """One row per (kernel, config, figures), its shapes joined; then whatever did not compile."""
    rows: dict[tuple, list[str]] = {}
    for r in records:
        if r.status == "compiled":
            f = r.figures
            key = (r.kernel, r.config, str(f["registers"]), f"{f['spill_store_bytes']}/{f['spill_load_bytes']}",
                   str(f["shared_bytes"]), str(f["barriers"]), _bytes_per_instruction(f["loads"]),
                   _bytes_per_instruction(f["stores"]), f"{f['programs_per_sm']} ({f['limited_by']})",
                   f"{f['occupancy_pct']:.1f}", _sass_cell(f.get("sass")),
                   str((f.get("sass") or {}).get("load_round_trips", "-")))  # fmt: skip
            rows.setdefault(key, []).append(r.shape_label)
    header = ("kernel", "config", "shapes", "registers", "spill st/ld B", "shared B", "barriers", "global loads",
              "global stores", "programs/SM (limit)", "occupancy %", "SASS: all (cvt / fp64 / mufu)",
              "load round trips")  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, shapes in rows.items():
        lines.append("| " + " | ".join([key[0], key[1], ", ".join(shapes), *key[2:]]) + " |")
    failed = [f"- {r.shape_label}: {r.status}" + (f" {r.kernel} [{r.config}]" if r.kernel else "") + f": {r.detail}"
              for r in records if r.status != "compiled"]  # fmt: skip
    return "\n".join(lines + ([""] + failed if failed else []))


class InspectError(RuntimeError):
    """The inspecting child failed outside the candidate (a harness failure)."""


def inspect_candidate(task: Any, c: Any, shapes: tuple[str, ...], seed: int = 0, timeout_s: float = 900.0,
                      keep_scratch: bool = False, jobs: int = 0) -> list[InspectionRecord]:  # fmt: skip
    """Compile every config of the kernels `c` launches on `shapes` (GPU shape labels) in the sandbox, the
    distinct compilations shared out over `jobs` children side by side (0: one per core, at most MAX_JOBS)."""
    parts = jobs if jobs > 0 else min(os.cpu_count() or 1, MAX_JOBS)
    threads = max(1, (os.cpu_count() or 1) // parts)
    root = Path(tempfile.mkdtemp(prefix="beam-inspect-"))
    os.chmod(root, 0o711)
    drop = sandbox.drop_target()

    def one(part: int) -> sandbox.ChildRun:
        name = f"inspect-{c.short_hash}" + (f"-{part}" if part else "")
        job = sandbox.prepare_job(root, name, True, c.path, root / "empty-triton-cache", {})
        request = {"task": task.name, "shapes": list(shapes), "seed": seed, "scratch": str(job.scratch),
                   "report_path": str(job.report_path), "drop": list(drop) if isinstance(drop, tuple) else None,
                   "drop_reason": None if isinstance(drop, tuple) else drop, "part": part, "parts": parts,
                   "candidate": {"copy": str(job.candidate_copy), "hash": c.content_hash}}  # fmt: skip
        return sandbox.run_child(job, request, timeout_s, "cpu", threads, module=CHILD_MODULE, interpret=False)

    try:
        with ThreadPoolExecutor(max_workers=parts) as pool:
            runs = list(pool.map(one, range(parts)))
        for run in runs:
            child_error = next((e for e in run.events if e["event"] == "child_error"), None)
            if child_error is not None or not any(e["event"] == "isolation" for e in run.events):
                raise InspectError(f"the inspecting child failed outside the candidate:\n"
                                   f"{child_error['traceback'] if child_error else run.log_tail}")  # fmt: skip
        env = environment.capture().to_dict()
        base = {"run_id": new_id()[:12], "task": task.name, "candidate": c.name, "candidate_hash": c.content_hash,
                "candidate_path": c.display_path, "environment": {"triton": env["triton"], "torch": env["torch"],
                                                                   "git_commit": env["git_commit"]}}  # fmt: skip
        return _records(runs, base, shapes)
    finally:
        if keep_scratch:
            print(f"job directories kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def gpu_shapes(task: Any, labels: tuple[str, ...]) -> tuple[str, ...]:
    """`labels` checked against the task's GPU shapes (ValueError naming them); none: the first."""
    known = [s.label for s in task.shapes]
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"task {task.name!r} has no GPU shapes {unknown}; known: {known}")
    return tuple(labels) or (known[0],)


def main(settings: InspectSettings) -> int:
    from tasks import TASKS, get_task

    try:
        if not settings.task or not settings.candidate:
            raise ValueError(f"task and candidate are required, e.g. `harness inspect task=fuse_norm "
                             f"candidate=row_per_program`; known tasks: {sorted(TASKS)}")  # fmt: skip
        task = get_task(settings.task)
        (c,) = candidate_files.resolve(task.name, task.op_name, (settings.candidate,))
        shapes = gpu_shapes(task, tuple(settings.shapes))
        if settings.jobs < 0:
            raise ValueError(f"jobs must be 0 (one child per core, at most {MAX_JOBS}) or more; got {settings.jobs}")
    except ValueError as e:  # CandidateError is one
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"inspect: {task.name}/{c.name} ({c.short_hash}) on {list(shapes)}, every config compiled for sm_90a here")
    try:
        records = inspect_candidate(
            task, c, shapes, settings.seed, settings.timeout_s, settings.keep_scratch, settings.jobs
        )
    except InspectError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    path = task_results_dir(Path(settings.results_dir or DEFAULT_RESULTS_DIR), task.name) / INSPECTIONS_FILE
    for r in records:
        append(path, r)
    print(table(records))
    print(f"records: {path}")
    return 0 if any(r.status == "compiled" for r in records) else 1
