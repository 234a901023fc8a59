"""What a nightly run of one task found: a pure function of records (harness nightly, tested on its own).

    findings, details = assess(TaskEvidence(...), Thresholds(...))

Gating findings (the nightly exits non-zero):
  failure     the promoted kernel (by content hash) no longer passes on some shape; the file at the
              promoted kernel's path fails or breaks the contract; the promoted bytes are gone; or
              after the run the promotion in force cannot be loaded by the optimized model
  regression  the promoted kernel's p50 on a shape is slower than its history on this GPU model
              beyond the noise-aware threshold (harness/regression.py); where its Triton autotuners
              picked other configs than in the last run of that history, it says which
Informational: promotion / withdrawal (this run changed the promotion), faster (the promoted
kernel got faster than its history), drift (a baseline's time moved beyond the threshold: a
library or driver change), and failures of candidates that are not promoted.

History is the task's earlier records from COMPLETE runs (a run record exists: a run killed half
way leaves records without one, and they are ignored), on the same GPU model, passed and timed with
windows that ended alike (records.WINDOW_ENDS: the harness's older windows read 1-5% slower). The
promoted kernel's history also holds the timings of the bytes it replaced through documentation-only
edits (`harness rehash`: the same code).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness import promote
from harness.records import EvaluationRecord, PromotionRecord, Status, Timing, autotune_changes
from harness.regression import Thresholds, compare_to_history

FINDING_KINDS = ("failure", "regression", "promotion", "withdrawal", "faster", "drift")


@dataclass(frozen=True)
class Finding:
    kind: str  # one of FINDING_KINDS
    task: str
    subject: str  # the kernel or implementation it is about
    message: str
    gating: bool
    shape: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FINDING_KINDS:
            raise ValueError(f"finding kind must be one of {FINDING_KINDS}; got {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TaskEvidence:
    task: str
    records: tuple[EvaluationRecord, ...]  # this run's
    promoted_before: PromotionRecord | None  # in force when the run started
    promoted_name: str | None  # the promoted kernel's implementation name in `records`
    promoted_note: str  # why it was not evaluated, when it was not
    promotion: PromotionRecord | None  # appended by this run
    promotion_reason: str
    history: tuple[EvaluationRecord, ...]  # earlier records of complete runs
    contract_failures: tuple[tuple[str, str], ...] = ()  # (path, why) of files that break the contract
    in_force_after: PromotionRecord | None = None
    loadable_problem: str | None = None  # why the optimized model cannot load `in_force_after`
    # Content hashes whose timings are the promoted kernel's history: its own and those of the same code
    # that it carries through documentation-only edits (promote.same_code_chain).
    promoted_lineage: tuple[str, ...] = ()


def history_records(
    history: Sequence[EvaluationRecord],
    shape: str,
    gpu: str,
    window_end: str,
    *,
    candidate_hashes: Collection[str] = (),
    implementation: str | None = None,
) -> list[EvaluationRecord]:
    """Passed, timed records of one kernel (by its hashes) or baseline (by name) on one shape and GPU, with
    windows that ended alike (records.WINDOW_ENDS), oldest first."""
    rows = [r for r in history
            if r.shape_label == shape and r.device == "cuda" and r.environment.get("device") == gpu
            and r.status is Status.PASSED and r.timing is not None and r.timing.window_end == window_end
            and (r.candidate_hash in candidate_hashes if candidate_hashes else
                 r.implementation == implementation)]  # fmt: skip
    return sorted(rows, key=lambda r: r.created_utc)


def _worst(rows: Sequence[EvaluationRecord]) -> str:
    bad = [r for r in rows if r.status is not Status.PASSED]
    return bad[0].status.value if bad else "passed"


def _failures(e: TaskEvidence) -> list[Finding]:
    out = []
    before = e.promoted_before
    promoted_path = before.path if before else None
    for path, why in e.contract_failures:
        gating = path == promoted_path
        out.append(Finding("failure", e.task, path, f"breaks the candidate contract: {why}", gating))
    failed: dict[str, list[EvaluationRecord]] = {}
    for r in e.records:
        if r.kind == "candidate" and r.status is not Status.PASSED:
            failed.setdefault(r.implementation, []).append(r)
    for name, rows in failed.items():
        r = rows[0]
        is_promoted = before is not None and r.candidate_hash == before.content_hash
        at_path = before is not None and r.candidate_path == promoted_path
        what = ("the promoted kernel no longer passes" if is_promoted else
                "the file at the promoted kernel's path fails" if at_path else "fails")  # fmt: skip
        more = f" (and {len(rows) - 1} more shape(s))" if len(rows) > 1 else ""
        out.append(Finding("failure", e.task, name, f"{what} on `{r.shape_label}`: {r.status.value}: {r.detail}{more}",
                           is_promoted or at_path, r.shape_label))  # fmt: skip
    if before is not None and e.promoted_name is None:
        out.append(Finding("failure", e.task, before.candidate, e.promoted_note or "not evaluated again", True))
    if e.in_force_after is not None and e.loadable_problem:
        why = f"the optimized model cannot load the promotion in force: {e.loadable_problem}"
        out.append(Finding("failure", e.task, e.in_force_after.candidate, why, True))
    return out


def _timing_dict(t: Timing | None) -> dict[str, float] | None:
    return None if t is None else {"p20_us": t.p20_us, "p50_us": t.p50_us, "p80_us": t.p80_us}


def assess(e: TaskEvidence, thresholds: Thresholds) -> tuple[list[Finding], dict[str, Any]]:
    """Findings (gating or not) and the figures the summary shows for one task's nightly run."""
    findings = _failures(e)
    if e.promotion is not None:
        kind = "promotion" if e.promotion.action == "promote" else "withdrawal"
        findings.append(Finding(kind, e.task, e.promotion.candidate, e.promotion.reason, False))
    gpu = e.records[0].environment.get("device", "") if e.records else ""
    revalidation, drift = [], []
    for r in e.records:
        if r.implementation == e.promoted_name:
            row = {"kernel": r.implementation, "shape": r.shape_label, "status": r.status.value, "detail": r.detail,
                   "timing": _timing_dict(r.timing), "speedups": dict(r.speedups), "timing_skipped": r.timing_skipped,
                   "comparison": None}  # fmt: skip
            if r.timing is not None:
                same_code = e.promoted_lineage if r.candidate_hash in e.promoted_lineage else ()
                past = history_records(e.history, r.shape_label, gpu, r.timing.window_end,
                                       candidate_hashes={r.candidate_hash, *same_code})  # fmt: skip
                cmp = compare_to_history(r.timing, [p.timing for p in past], thresholds)
                changes = autotune_changes(r, past[-1]) if past else []
                row["comparison"] = cmp.to_dict()
                row["autotune_changes"] = changes
                if cmp.verdict in ("regression", "faster"):
                    why = cmp.reason
                    if changes:
                        why += f"; its autotuners picked differently from run {past[-1].run_id}: {'; '.join(changes)}"
                    findings.append(Finding(cmp.verdict, e.task, r.implementation, why, cmp.verdict == "regression",
                                            r.shape_label, cmp.to_dict() | {"autotune_changes": changes}))  # fmt: skip
            revalidation.append(row)
        elif r.kind != "candidate" and r.timing is not None:
            past = history_records(e.history, r.shape_label, gpu, r.timing.window_end, implementation=r.implementation)
            cmp = compare_to_history(r.timing, [p.timing for p in past], thresholds)
            drift.append({"implementation": r.implementation, "shape": r.shape_label, "comparison": cmp.to_dict()})
            if cmp.verdict in ("regression", "faster"):
                word = "slower" if cmp.verdict == "regression" else "faster"
                findings.append(Finding("drift", e.task, r.implementation, f"{word} than its history: {cmp.reason}",
                                        False, r.shape_label, cmp.to_dict()))  # fmt: skip
    candidates: dict[str, list[EvaluationRecord]] = {}
    for r in e.records:
        if r.kind == "candidate":
            candidates.setdefault(r.implementation, []).append(r)
    first = e.records[0] if e.records else None
    before = e.promoted_before
    promoted_before = None
    if before is not None:
        promoted_before = {"candidate": before.candidate, "hash": before.content_hash, "path": before.path,
                           "run_id": before.run_id, "gpu": promote.gpu_of(before)}  # fmt: skip
    details = {
        "evaluation_run": first.run_id if first else None,
        "device": first.device if first else None,
        "policy": first.policy if first else None,
        "environment": first.environment if first else {},
        "shapes": list(dict.fromkeys(r.shape_label for r in e.records)),
        "statuses": {name: _worst(rows) for name, rows in candidates.items()},
        "promoted_before": promoted_before,
        "promoted_name": e.promoted_name,
        "promoted_note": e.promoted_note,
        "promotion_reason": e.promotion_reason,
        "revalidation": revalidation,
        "drift": drift,
    }
    return findings, details
