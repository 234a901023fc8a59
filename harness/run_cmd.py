"""`harness run` and `harness results`: evaluate a task's candidates, and show what was recorded.

    harness run task=fuse_norm                       every candidate of the task, every shape
    harness run task=fuse_norm candidates=[row_per_program] "shapes=['T=1','T=8']" seeds=[1]
    harness run -m task=fuse_norm,output_gate        one run per task
    harness run task=fuse_norm agent=anthropic agent.rounds=8   an agent proposes candidates first (harness/agents/)
    harness results task=fuse_norm last=5
    harness results                                  every task: promotion in force, goals met or missed

`run` prints a table per shape (status, error figures, times, speedups over each baseline with
that baseline's time beside the candidate, roofline fraction, verdict), on a GPU the candidates
against the task's goals (harness/goals.py), and its wall time; the records land in
results/<task>/. Exit status: 0 when the run completed, whatever the candidates
did; 1 for bad input (unknown task, shape or candidate, a candidate file that breaks the
contract), or when an agent's session ended on an error (the API gave up; its transcript in
results/<task>/agents/ says how far it got).

Shape labels contain `=` (and some spaces), which Hydra's override grammar reads as syntax: quote
them inside the list, and quote the whole override for the shell, as above.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import candidates as candidate_files
from harness import goals, promote, runner
from harness.agents.settings import AgentSettings
from harness.records import (
    DEFAULT_RESULTS_DIR,
    MEMCPY_COPY_FLOOR_COMMIT,
    RECORDS_FILE,
    RUNS_FILE,
    EvaluationRecord,
    RunRecord,
    Status,
    launches_cell,
    load_frame,
    read,
    unrecorded_window_end,
)
from harness.records import task_results_dir as results_dir_of


@dataclass(frozen=True, kw_only=True)
class RunSettings(runner.EvaluationSettings):
    task: str = ""  # required: a name in tasks.TASKS
    candidates: tuple[str, ...] = ()  # file stems in candidate_kernels/<task>/ or paths; empty: all
    agent: AgentSettings = field(default_factory=AgentSettings)  # agent=anthropic|command|replay (harness/agents/)


@dataclass(frozen=True)
class ResultsSettings:
    task: str = ""  # a name in tasks.TASKS; empty: every task's promotion in force and goals
    last: int = 5  # how many runs to list
    results_dir: str | None = None  # default: <repo>/results


def _task_or_error(name: str):
    from tasks import TASKS, get_task

    if not name:
        raise ValueError(f"task is required, e.g. `harness run task=fuse_norm`; known: {sorted(TASKS)}")
    return get_task(name)  # ValueError naming the known tasks


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def run(settings: RunSettings) -> int:
    try:
        task = _task_or_error(settings.task)
        outcome = None
        if settings.agent.kind != "none":  # the agent's submissions join the usual evaluation below
            from harness.agents import loop

            outcome = loop.run_agent(task, settings)
        found = candidate_files.resolve(task.name, task.op_name, settings.candidates)
        found = found if outcome is None else loop.with_submissions(found, outcome)
        if not found and not settings.candidates:
            print(f"{task.name}: no candidates in {candidate_files.task_dir(task.name)}; evaluating baselines only")
        result = runner.evaluate(task, found, settings)
    except ValueError as e:  # CandidateError, UsageError, unknown task: bad input
        return _error(str(e))
    print(format_run(result))
    if outcome is not None:
        print(outcome.summary())
        return 1 if outcome.error else 0
    return 0


# ---- the run table ---------------------------------------------------------------------------------
def _ms_or_us(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1e4 else f"{us:.2f} us"


def _parity_cells(r: EvaluationRecord) -> tuple[str, str, str]:
    if not r.parity:
        return "-", "-", "-"
    max_ulp = max((o.get("max_ulp") or 0) for o in r.parity.values())
    mismatched = sum(o.get("n_mismatched", 0) for o in r.parity.values())
    total = sum(o.get("n_elements", 0) for o in r.parity.values())
    ratios = [o["fp64_ratio"] for o in r.parity.values() if o.get("fp64_ratio") is not None]
    return str(max_ulp), f"{mismatched}/{total}", f"{max(ratios):.3f}" if ratios else "-"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _verdict(r: EvaluationRecord, promoted_hash: str | None, assessment: promote.Assessment | None,
             bars: dict[str, promote.Showing]) -> str:  # fmt: skip
    if r.status is not Status.PASSED:
        return f"FAIL {r.status.value}: {r.detail}"[:160]
    if r.kind != "candidate":
        return "baseline"
    if r.timing is None:
        forced = f", {_count(r.configs_checked, 'forced config')} too" if r.configs_checked else ""
        forced += f", {r.configs_idle} idle at this shape" if r.configs_idle else ""
        forced += f", {_count(len(r.configs_unchecked), 'config')} unchecked" if r.configs_unchecked else ""
        return f"parity ok{forced}" + (f"; {r.timing_skipped}" if r.device == "cuda" else " (timing skipped: no GPU)")
    if r.suspicious:
        return "SUSPICIOUS: faster than the roofline floor"
    slower = [b for b, bar in bars.items() if not r.timing.p80_us < bar.p20_us]
    if slower:
        return f"not faster beyond noise than {', '.join(slower)}"
    if promoted_hash == r.candidate_hash:
        return "PROMOTED"
    return "beats every baseline" + ("" if assessment is None or assessment.eligible else " here")


def format_run(result: runner.RunResult) -> str:
    records = result.records
    baselines = sorted({b for r in records for b in r.baselines_us} | {r.implementation for r in records
                                                                        if r.kind != "candidate"})  # fmt: skip
    promoted_hash = result.run.promoted
    assessments = {a.content_hash: a for a in result.assessments}
    run_showings = promote.showings(records)
    elsewhere = False
    counted = any(r.launches is not None for r in records)
    lines = []
    for label in dict.fromkeys(r.shape_label for r in records):
        rows = []
        for r in (r for r in records if r.shape_label == label):
            max_ulp, mismatched, ratio = _parity_cells(r)
            row = {
                "implementation": r.implementation, "status": r.status.value, "max ulp": max_ulp,
                "ulp>0": mismatched, "fp64 ratio": ratio,
                "p50 (p20-p80)": (f"{_ms_or_us(r.timing.p50_us)} ({r.timing.p20_us:.2f}-{r.timing.p80_us:.2f})"
                                  if r.timing else "-"),
            }  # fmt: skip
            bars = promote.bars(r, run_showings) if r.timing is not None else {}
            for b in baselines:  # the baseline as timed beside this candidate, or faster elsewhere (promote.bars)
                bar = bars.get(b)
                where = "" if bar is None or bar.where == "beside it" else f" {bar.where}*"
                elsewhere = elsewhere or bool(where)
                row[f"vs {b}"] = f"{bar.p50_us / r.timing.p50_us:.2f}x ({_ms_or_us(bar.p50_us)}{where})" if bar else "-"
            row["floor"] = f"{r.floor_fraction:.0%}" if r.floor_fraction is not None else "-"
            row["copy floor"] = f"{r.copy_floor_fraction:.0%}" if r.copy_floor_fraction is not None else "-"
            if counted:
                row["launches"] = launches_cell(r)
            row["verdict"] = _verdict(r, promoted_hash, assessments.get(r.candidate_hash), bars)
            rows.append(row)
        if not any(r.timing for r in records if r.shape_label == label):  # CPU: no timing columns
            timing_columns = ("p50", "vs ", "floor", "copy floor", "launches")
            rows = [{k: v for k, v in row.items() if not k.startswith(timing_columns)} for row in rows]
        r0 = next(r for r in records if r.shape_label == label)
        lines.append(f"\n== {r0.task} | {label} | {r0.device}, {r0.policy} policy, seeds {r0.seeds} ==")
        lines.append(pd.DataFrame(rows).to_string(index=False))
    run = result.run
    if any(r.speedups for r in records):
        lines.append(
            "\nBaseline rows: timed in the trusted baselines child. A candidate's 'vs' cells and verdict use "
            "the baselines timed again beside it, in its own benchmark child (their p50 in parentheses)."
        )
    if elsewhere:
        lines.append(
            f"*: the baseline ran more than {promote.ELSEWHERE_MIN_PCT:g}% faster, beyond noise, elsewhere in this run "
            "than beside the candidate; the verdict and the promotion judge the candidate against that showing "
            "(harness/promote.py bars)."
        )
    if any(r.copy_floor_fraction is not None for r in records):
        lines.append(
            "floor: the roofline (bytes over the copy bandwidth, or flops over the GEMM rate) over p50; copy floor: "
            "one kernel moving the same bytes, timed the same way in the same child, over p50."
        )
    if counted:
        lines.append("launches: what one call puts on the GPU (the nodes of a CUDA graph of one call, by kind).")
    if run.timing_skipped:
        lines.append(f"\nTimings: {run.timing_skipped}.")
    goal_table = goals.run_goals_table(_task_or_error(run.task), records)
    if goal_table:
        lines += ["", goal_table]
    lines.append(f"Promotion: {result.promotion_reason}")
    if result.promotion is not None:
        p = result.promotion
        lines.append(f"  -> {p.action} {p.candidate} ({p.content_hash[:12]}, {p.path})")
    isolation = next((r.isolation for r in records if r.kind == "candidate" and r.isolation), None)
    if isolation:
        lines.append("Sandbox: " + ", ".join(f"{k} {v}" for k, v in isolation.items()))
    where = results_dir_of(run.settings.get("results_dir") or DEFAULT_RESULTS_DIR, run.task)
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in run.phases_s.items())
    lines.append(f"Run {run.run_id}: {run.wall_s:.1f} s wall ({phases}); records in {where}/")
    return "\n".join(lines)


# ---- results -----------------------------------------------------------------------------------------
def _label_key(label: str) -> tuple:
    """Shape labels in numeric order: 'T=8' before 'T=64' before 'T=1000' ('sliding T=3' before 'sliding T=16384')."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label))


def results(settings: ResultsSettings) -> int:
    try:
        task = _task_or_error(settings.task) if settings.task else None
    except ValueError as e:
        return _error(str(e))
    if settings.last < 1:
        return _error(f"last must be >= 1; got {settings.last}")
    root = DEFAULT_RESULTS_DIR if settings.results_dir is None else settings.results_dir
    print(format_results(task.name, root, settings.last) if task else format_overview(root))
    return 0


def _standing_lines(task: str, root: Path, why: bool) -> list[str]:
    """The promotion in force on each GPU that has one of its own (with its reason when `why`) and the task's
    goals against its records."""
    lines = []
    for gpu, latest in promote.latest_by_gpu(task, root).items():
        on = promote.on_gpu(gpu)
        if latest.action == "promote":
            lines.append(f"Promoted{on}: {latest.candidate} ({latest.content_hash[:12]}, {latest.path}) since run "
                         f"{latest.run_id}" + (f": {latest.reason}" if why else ""))  # fmt: skip
        else:
            lines.append(f"Promoted{on}: none, {latest.candidate} withdrawn in run {latest.run_id}"
                         + (f": {latest.reason}" if why else ""))  # fmt: skip
    evaluations = read(results_dir_of(root, task) / RECORDS_FILE, EvaluationRecord)[0]
    in_force = goals.in_force_on(task, evaluations, root)
    return [*(lines or ["Promoted: none"]), "", goals.goals_table(_task_or_error(task), evaluations, in_force)]


def format_overview(results_dir) -> str:
    """Every task's promotion in force and goals: `harness results` without a task."""
    from tasks import TASKS

    root = Path(results_dir)
    lines = [f"Every task's promotion and goals, from {root} (`harness results task=<task>` for one task's runs):"]
    for task in TASKS:
        lines += ["", f"== {task} ==", *_standing_lines(task, root, why=False)]
    return "\n".join(lines)


def format_results(task: str, results_dir, last: int) -> str:
    root = Path(results_dir)
    runs, skipped_runs = read(results_dir_of(root, task) / RUNS_FILE, RunRecord)
    frame, skipped = load_frame(root, task)
    lines = [f"== {task}: results in {results_dir_of(root, task)} ==", *_standing_lines(task, root, why=True)]
    if not runs and frame.empty:
        lines.append("No runs recorded yet: `harness run task=" + task + "`.")
    if runs:
        table = pd.DataFrame(
            [{"run": r.run_id, "when (UTC)": r.created_utc, "device": r.environment.get("device") or r.device,
              "wall s": f"{r.wall_s:.1f}",
              "candidates": len(r.candidates), "statuses": ", ".join(f"{k}={v}" for k, v in r.statuses.items()),
              "promoted": (r.promoted or "")[:12]} for r in runs[-last:]]
        )  # fmt: skip
        lines += [f"\nLast {min(last, len(runs))} of {len(runs)} runs:", table.to_string(index=False)]
    if not frame.empty:
        # newest per GPU model: an H100 run's records stand beside the H200's, not in their place
        if "environment.device" in frame.columns:
            named = frame["environment.device"].notna() & (frame["device"] == "cuda")
            frame = frame.assign(device=frame["environment.device"].where(named, frame["device"]))
        latest = frame.sort_values("created_utc").groupby(["implementation", "shape_label", "device"]).tail(1)

        def column(name: str) -> pd.Series:  # empty where no record has the field
            return latest.get(name, pd.Series(None, index=latest.index, dtype=object))

        commits = column("environment.git_commit")
        if "timing.p50_us" in latest.columns:  # timings written before window_end: from the commit
            timed = latest["timing.p50_us"].notna()
            ends = column("timing.window_end")
            unrecorded = commits.map(unrecorded_window_end)
            latest = latest.assign(**{"timing.window_end": ends.where(~timed | ends.notna(), unrecorded)})
        cols = {"implementation": "implementation", "shape_label": "shape", "device": "device", "status": "status",
                "timing.p50_us": "p50 us", "timing.window_end": "window end", "speedups.reference": "vs reference",
                "speedups.torch_compile": "vs torch_compile", "floor_fraction": "floor",
                "copy_floor_fraction": "copy floor", "run_id": "run"}  # fmt: skip
        counts = [c for c in latest.columns if c.startswith("launches.")]  # one column per kind of GPU operation
        notes = column("launches_note")  # why a record's call could not be counted
        if counts or notes.notna().any():  # launches per call over kinds, as the run table counts them

            def cell(total: float, note: object) -> str:
                if not pd.isna(total):
                    return str(int(total))
                return "not counted" if isinstance(note, str) and note else "-"

            totals = latest[counts].sum(axis=1, min_count=1) if counts else pd.Series(None, index=latest.index)
            latest = latest.assign(launches=[cell(n, note) for n, note in zip(totals, notes, strict=True)])
            cols["launches"] = "launches"
        present = {k: v for k, v in cols.items() if k in latest.columns}
        view = latest[list(present)].rename(columns=present)
        shapes, names = view["shape"].tolist(), view["implementation"].tolist()
        view = view.iloc[sorted(range(len(view)), key=lambda i: (_label_key(shapes[i]), names[i]))]
        view = view.round({"p50 us": 2, "vs reference": 2, "vs torch_compile": 2, "floor": 3, "copy floor": 3})
        view = view.astype(object).where(view.notna(), "-")
        lines += ["\nLatest record per implementation and shape:", view.to_string(index=False, na_rep="-")]
        if (column("timing.window_end") == "device_sync").any():
            lines.append(
                "window end device_sync: the device was synchronized inside each timed window, which read "
                "1-5% above the GPU's time (harness/bench.py); compare such rows with each other only."
            )
        memcpy = column("copy_floor_fraction").notna() & (commits == MEMCPY_COPY_FLOOR_COMMIT)
        if memcpy.any():
            runs = ", ".join(sorted(set(latest.loc[memcpy, "run_id"])))
            lines.append(
                f"copy floor of commit {MEMCPY_COPY_FLOOR_COMMIT[:7]} (runs {runs}): a memcpy node, slower than "
                "a kernel at some sizes (harness/bench.py); the other rows' copy floor is a kernel."
            )
    for problem in skipped_runs + skipped:
        lines.append(f"warning: {problem}")
    return "\n".join(lines)
