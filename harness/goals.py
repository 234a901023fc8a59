"""Where a task's candidates stand against its goals (tasks/<task>.py `goals`), from the records.

A goal is judged on GPU records only: a candidate that passed parity under the GPU policy and was
timed. On one record its time bar is either the goal's `max_us` or, for `not_slower_than`, the p50 of
that baseline timed beside the candidate in its own benchmark child (the record's `baselines_us`),
or of its faster showing elsewhere in the same run where promotion judges by that one (promote.bars);
a record without that baseline's timing has no standing on the goal. A goal is met on a shape when
p50 <= bar: the p50 alone, as issue 4 states its goals, not the noise band promotion uses; and,
where the goal has `max_launches`, when the record's count of GPU operations per call (its
`launches`) is at most that. A record without the count (timed before it was counted, or a call
that could not be captured) keeps its time in the cell and meets no such goal. Where the goal asks for
bit-exactness (`bit_exact`, with a time bar or alone), also when no element of the task's bit-exact
outputs is off the reference the record's parity judged it against (its `n_mismatched`; the parity
check itself lets 1-ulp flips pass on a small fraction of the elements). A goal set on one GPU
(`Goal.gpu`: issue 4's bars in microseconds are the H200's) is judged on that GPU's records alone: a
newer record from another GPU does not replace the newest one from it, and in one run's table another
GPU's time stands beside the goal as not judged.

Who reads it: `harness results` and an agent's task statement (the newest record of a kernel in force,
each GPU's records judged by the kernel promoted on that GPU, and the best newest record of any
candidate, per goal and shape); the end of a `harness run` on a GPU and each task's section of the
nightly summary (that run's candidates side by side). Promotion never reads goals.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import promote
from harness.records import EvaluationRecord, Status
from tasks.task import Goal, Task


@dataclass(frozen=True)
class Standing:
    """One candidate record against one goal on one shape."""

    implementation: str
    p50_us: float
    bar_us: float | None  # the goal's max_us, or the named baseline's p50 beside this record; None: no time bar
    run_id: str
    max_launches: int | None = None  # the goal's, if it has one
    launches: int | None = None  # GPU operations of one call, where the goal counts them and the record has them
    bit_exact: bool = False  # the goal's
    elements_off: int | None = None  # elements of the bit-exact outputs off the reference, where the goal asks
    elements: int | None = None  # elements of those outputs compared

    @property
    def fast_enough(self) -> bool:
        return self.bar_us is None or self.p50_us <= self.bar_us

    @property
    def few_enough_launches(self) -> bool:
        return self.max_launches is None or (self.launches is not None and self.launches <= self.max_launches)

    @property
    def exact_enough(self) -> bool:
        return not self.bit_exact or self.elements_off == 0

    @property
    def met(self) -> bool:
        return self.fast_enough and self.few_enough_launches and self.exact_enough

    @property
    def margin_us(self) -> float:
        """How far under the bar (positive) or over it (negative); 0 without a time bar."""
        return 0.0 if self.bar_us is None else self.bar_us - self.p50_us

    def cell(self) -> str:
        """'2.19 us, met by 0.11', '170.73 us, missed by 5.73 (3.5%)'; where the goal counts launches, the
        count follows the time: '1.40 us in 1 launch, met by 1.40', '1.40 us in 2 launches, missed: 2 launches,
        goal 1' or '1.40 us, launches not counted, missed'; where it asks for bit-exactness, so does the
        count of elements off: 'bit-exact, met', '2 of 983040 elements off, missed', '2.25 us, bit-exact, met
        by 0.05' or '2.25 us, 2 of 15360 elements off, missed: not bit-exact'."""
        parts = []
        if self.bar_us is not None:
            time = f"{self.p50_us:.2f} us"
            if self.max_launches is not None:
                n = self.launches
                time += ", launches not counted" if n is None else f" in {n} launch{'es' if n != 1 else ''}"
            parts.append(time)
        if self.bit_exact:
            off = self.elements_off
            parts.append("bit-exactness not recorded" if off is None else "bit-exact" if off == 0
                         else f"{off} of {self.elements} elements off")  # fmt: skip
        text = ", ".join(parts)
        if self.met:
            return text + (f", met by {self.margin_us:.2f}" if self.bar_us is not None else ", met")
        text += ", missed"
        reasons = []
        if not self.fast_enough:
            text += f" by {-self.margin_us:.2f} ({-self.margin_us / self.bar_us:.1%})"
        if not self.few_enough_launches and self.launches is not None:
            reasons.append(f"{self.launches} launches, goal {self.max_launches}")
        if not self.exact_enough and self.bar_us is not None:
            reasons.append("not bit-exact")
        if reasons:
            text += ("; " if not self.fast_enough else ": ") + "; ".join(reasons)
        return text


@dataclass(frozen=True)
class GoalShape:
    """One goal on one of its shapes: the promoted kernel's standing and the best candidate's."""

    goal: Goal
    shape: str
    in_force: Standing | None  # the promoted kernel's newest GPU record on this shape
    best: Standing | None  # the candidate record nearest under (or least over) the bar, one per candidate


def timed_on_gpu(records: Iterable[EvaluationRecord]) -> list[EvaluationRecord]:
    """The records a goal can judge: candidates that passed parity on the GPU and were timed, and whose time
    is not below what the roofline allows (`suspicious`: work skipped or a broken measurement meets nothing)."""
    return [r for r in records if r.kind == "candidate" and r.device == "cuda" and r.policy == "gpu"
            and r.status is Status.PASSED and r.timing is not None and not r.suspicious]  # fmt: skip


def device_name(record: EvaluationRecord) -> str:
    """The GPU a record ran on, as its environment names it ('' where it does not)."""
    return str(record.environment.get("device", ""))


def standing(
    goal: Goal,
    record: EvaluationRecord,
    run_showings: dict[tuple[str, str], list[promote.Showing]] | None = None,
    *,
    exact_outputs: Sequence[str],
) -> Standing | None:
    """`record` against `goal`, a baseline's bar taken as promotion takes it (promote.bars, from `run_showings`
    of the record's run), the elements off the reference counted over `exact_outputs` (Task.exact_outputs) where
    the goal asks for bit-exactness; None when that baseline was not timed beside it, or when the record ran on
    another GPU than the goal was set on."""
    assert record.timing is not None
    if not goal.judges_on(device_name(record)):
        return None
    if not goal.timed or goal.max_us is not None:
        bar = goal.max_us
    else:
        showing = promote.bars(record, run_showings or {}).get(goal.not_slower_than)
        if showing is None:
            return None
        bar = showing.p50_us
    launches = sum(record.launches.values()) if goal.max_launches is not None and record.launches is not None else None
    off = elements = None
    if goal.bit_exact:
        figures = [record.parity.get(name) or {} for name in exact_outputs]
        if figures and all("n_mismatched" in f and "n_elements" in f for f in figures):
            off, elements = sum(f["n_mismatched"] for f in figures), sum(f["n_elements"] for f in figures)
    return Standing(record.implementation, record.timing.p50_us, bar, record.run_id, goal.max_launches, launches,
                    goal.bit_exact, off, elements)  # fmt: skip


def _newest_per_candidate(records: Sequence[EvaluationRecord]) -> dict[tuple[str, str], EvaluationRecord]:
    """(implementation, shape) -> its newest record by creation time."""
    newest: dict[tuple[str, str], EvaluationRecord] = {}
    for r in sorted(records, key=lambda r: r.created_utc):
        newest[(r.implementation, r.shape_label)] = r
    return newest


def _best(standings: Iterable[Standing]) -> Standing | None:
    """The standing that meets its goal with the least p50 over its bar (ratios, so that bars of different
    baselines compare), or, when none meets it, the one nearest its bar: for bit-exactness, the fewest elements
    off (a record without the count last). Of standings as near, the newest run's (then by name): a goal of
    bit-exactness alone names the latest evidence among the candidates that meet it."""

    def distance(s: Standing) -> tuple[bool, float, float]:
        off = (s.elements_off if s.elements_off is not None else float("inf")) if s.bit_exact else 0
        return not s.met, off, 0.0 if s.bar_us is None else s.p50_us / s.bar_us

    newest_first = sorted(sorted(standings, key=lambda s: s.implementation), key=lambda s: s.run_id, reverse=True)
    return min(newest_first, key=distance, default=None)


def in_force_on(task: str, records: Iterable[EvaluationRecord], results_dir: Path | str | None = None
                ) -> dict[str, tuple[str, ...]]:  # fmt: skip
    """GPU -> the content hashes of `task`'s promotion in force on it (promote.promoted, same_code_hashes), for
    every GPU these records were timed on."""
    gpus = {device_name(r) for r in timed_on_gpu(records)}
    return {gpu: promote.same_code_hashes(task, promote.promoted(task, results_dir, gpu), results_dir) for gpu in gpus}


def assess(task: Task, records: Iterable[EvaluationRecord], in_force: Mapping[str, Collection[str]] | None = None
           ) -> list[GoalShape]:  # fmt: skip
    """Every goal of `task` on each of its shapes, from the newest GPU record of each candidate.

    `in_force`: GPU -> the content hashes of the kernel promoted on it (`in_force_on`); the newest record of
    a GPU the goal judges on, under the hashes in force on that GPU, is the in-force standing."""
    in_force = in_force or {}
    records = list(records)
    by_run = promote.showings_by_run(records)
    judged = timed_on_gpu(records)
    exact = task.exact_outputs
    rows = []
    for goal in task.goals:
        timed = [r for r in judged if goal.judges_on(device_name(r))]
        newest = _newest_per_candidate(timed)
        for shape in task.goal_shapes(goal):
            here = [r for (_, label), r in newest.items() if label == shape]
            ours = [r for r in timed if r.shape_label == shape and r.candidate_hash in in_force.get(device_name(r), ())]
            promoted = max(ours, key=lambda r: r.created_utc, default=None)
            now = standing(goal, promoted, by_run[promoted.run_id], exact_outputs=exact) if promoted else None
            each = [standing(goal, r, by_run[r.run_id], exact_outputs=exact) for r in here]
            rows.append(GoalShape(goal, shape, now, _best(s for s in each if s is not None)))
    return rows


def _status(row: GoalShape, promoted: bool) -> str:
    if row.in_force is not None and row.in_force.met:
        return "met"
    if row.best is not None and row.best.met:
        return f"met by {row.best.implementation} only ({'not in force' if promoted else 'none promoted'})"
    if row.best is None:
        return f"not measured on the {row.goal.gpu}" if row.goal.gpu else "not measured on a GPU"
    ours = row.in_force
    if ours is not None and ours.fast_enough and ours.max_launches is not None and ours.launches is None:
        return "time met, launches not counted"
    return "missed"


def goals_table(task: Task, records: Iterable[EvaluationRecord],
                in_force: Mapping[str, Collection[str]] | None = None) -> str:  # fmt: skip
    """The goals of `task` as `harness results` prints them: one row per goal and shape."""
    if not task.goals:
        return f"Goals: none declared for {task.name} (tasks/{task.name}.py)."
    rows = [
        {"shape": r.shape, "goal": r.goal.bar,
         "set by": f"{r.goal.source or '-'}{f' ({r.goal.gpu})' if r.goal.gpu else ''}",
         "promoted (newest)": f"{r.in_force.cell()} [{r.in_force.run_id}]" if r.in_force else "-",
         "best candidate (newest each)": (f"{r.best.implementation} {r.best.cell()} [{r.best.run_id}]"
                                          if r.best else "-"),
         "status": _status(r, any((in_force or {}).values()))}
        for r in assess(task, records, in_force)
    ]  # fmt: skip
    met = sum(row["status"] == "met" for row in rows)
    head = f"Goals ({met} of {len(rows)} met by the promoted kernel; p50 on the GPU, newest record of each candidate):"
    return head + "\n" + pd.DataFrame(rows).to_string(index=False)


def side_by_side(task: Task, records: Iterable[EvaluationRecord]) -> list[dict[str, Any]]:
    """One run's candidates against every goal of `task` on the shapes the run timed, as JSON rows: {"shape",
    "goal", "cells", "met"}, where `cells` and `met` map each timed candidate to its cell text and verdict (None:
    no standing there; a time from another GPU than the goal's is shown, marked not judged)."""
    records = list(records)
    run_showings = promote.showings(records)
    timed = timed_on_gpu(records)
    names = sorted({r.implementation for r in timed})
    by_key = {(r.implementation, r.shape_label): r for r in timed}
    rows = []
    for goal in task.goals if names else ():
        for shape in task.goal_shapes(goal):
            if not any((name, shape) in by_key for name in names):
                continue  # a shape this run did not time
            here = {name: standing(goal, by_key[(name, shape)], run_showings, exact_outputs=task.exact_outputs)
                    if (name, shape) in by_key else None
                    for name in names}  # fmt: skip
            cells = {n: s.cell() if s else _unjudged(goal, by_key.get((n, shape))) for n, s in here.items()}
            rows.append({"shape": shape, "goal": goal.bar, "cells": cells,
                         "met": {n: s.met if s else None for n, s in here.items()}})  # fmt: skip
    return rows


def _unjudged(goal: Goal, record: EvaluationRecord | None) -> str:
    """The cell of a timed record without a standing: its time, where it ran on another GPU than the goal's."""
    if record is None or goal.judges_on(device_name(record)):
        return "-"
    assert record.timing is not None
    return f"{record.timing.p50_us:.2f} us, not judged (goal set on the {goal.gpu})"


def run_goals_table(task: Task, records: Iterable[EvaluationRecord]) -> str | None:
    """The goals of `task` for one run's records, every candidate side by side; None when nothing to judge."""
    rows = side_by_side(task, records)
    if not rows:
        return None
    table = pd.DataFrame([{"shape": r["shape"], "goal": r["goal"], **r["cells"]} for r in rows])
    return f"Goals (p50 in this run; tasks/{task.name}.py):\n" + table.to_string(index=False)
