"""Promotion: which candidate the optimized model uses for a task. A pure function of records.

A candidate is eligible when, in one GPU run over ALL of the task's GPU shapes, on every shape:
it passed parity, it was timed, its time is not implausibly far below the roofline floor
(bench.is_suspicious), and it beats every baseline timed in its own process beyond the noise: its
p80 is below the baseline's p20 (the two p20..p80 bands do not overlap), for the reference,
torch.compile of the reference and every library baseline that could run (an unavailable library
is recorded, not required; nor is torch.compile on a shape where dynamo falls back to eager).
Among eligible candidates the one with the best geometric mean, over shapes, of its smallest
speedup over any baseline (p50 ratio) is promoted.

A baseline is timed in several processes of a run: the trusted baselines child and every candidate's
benchmark child. Where it ran faster in another of them than beside the candidate, beyond the noise
(its p80 there below its p20 beside it) and by more than ELSEWHERE_MIN_PCT at the median, the
candidate is judged against that faster showing (`bars`): a baseline's speed is what it showed it can
do in the run. torch.compile's peers are the case: in qk_norm_rope's runs on the H200 their times differ
between the processes of one run by up to 41% (global T=16384: 141.00 us beside one candidate, 178.85
beside the other, 141.47 in the baselines child, run 20261205T014911-ba3c81), where the reference's and
flashinfer's agree within 5% (a different pick of Inductor's autotuning in each process would explain
it; not verified). Smaller differences between processes (a percent or two, with bands a fraction of
a percent wide) are process conditions, and the timing beside the candidate stands.

The promotion in force changes only when the candidate in force was evaluated in the same run
(so the two were compared on the same machine, same process conditions), or when none is in force.
A challenger then also must not be slower than the candidate in force on any shape by what
`harness review` calls a regression (regression.compare_same_run: disjoint p20..p80 bands and a p50
more than `max_regression_pct` slower): a better geomean does not buy a slower shape in the optimized
model. And it must be faster than the candidate in force on at least one shape by the same measure
(bands apart, p50 more than `max_regression_pct` faster): a geomean a fraction of a percent higher
on times within each other's noise is a tie, and a tie does not replace the kernel in force. A
blocked challenger gives way to the next eligible one by score; when none is left, the promotion in
force stays. A promoted candidate that fails parity in a later run is withdrawn.

Promotions are per GPU model (`promoted`): each decision is recorded with its run's environment and
replaces or withdraws only the promotion of the GPU it ran on, which is the kernel in force a run is
judged against. A GPU with no promotions of its own runs with the newest one proven on another GPU,
which its first run must therefore evaluate before it can promote anything of its own.

A kernel in force can itself miss a bar of eligibility in a later run (a baseline it no longer beats beyond
noise on some shape: qk_norm_rope's, behind a torch.compile that fails parity, at one prefill shape). It stays
promoted, and a challenger that misses only the bars it misses too (on each shape, no baseline it does not
beat beyond noise that the kernel in force beats) may replace it by the same rule: slower on no shape, faster
on one. Such a replacement leaves the optimized model faster and no further behind any baseline; the
promotion's reason names the bars both miss. Any other shortfall (parity, timing, the roofline, a baseline
the kernel in force beats) still rules a challenger out.

A fix of the kernel in force (a correctness or robustness change that is not meant to be faster) would
never pass the faster-on-one-shape rule. A run may name one candidate as such a fix (`promote_fix=`, a
human's call, recorded in the run's settings and the promotion's reason): if its CANDIDATE parent names
the kernel in force, it may replace it at equal speed: eligible as any candidate, slower on no shape, the
faster-on-one-shape rule waived for it alone. A named candidate whose parent is another kernel is judged
by the usual rule (below the kernel in force by score, it is not considered), and the reason says why its
claim was refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records import (
    DEFAULT_RESULTS_DIR,
    EAGER_FALLBACK,
    PROMOTIONS_FILE,
    EvaluationRecord,
    PromotionRecord,
    Status,
    autotune_changes,
    read,
    task_results_dir,
)
from harness.regression import Comparison, Thresholds, compare_same_run

REQUIRED_BASELINES = ("reference", "torch_compile")
ELSEWHERE_MIN_PCT = Thresholds.min_pct  # how much faster at the median a baseline's showing elsewhere must be


@dataclass(frozen=True)
class Showing:
    """One timing of a baseline on one shape in a run, and where it was taken."""

    p20_us: float
    p50_us: float
    p80_us: float
    where: str  # "beside it", "beside <candidate>" or "in the baselines child"

    @classmethod
    def of(cls, band: dict[str, float], where: str) -> Showing:
        """From a record's `baselines_us` entry."""
        return cls(band["p20_us"], band["p50_us"], band["p80_us"], where)

    @property
    def band(self) -> dict[str, float]:
        return {"p20_us": self.p20_us, "p50_us": self.p50_us, "p80_us": self.p80_us}


def showings(records: Sequence[EvaluationRecord]) -> dict[tuple[str, str], list[Showing]]:
    """(shape, baseline) -> every timing of that baseline in these records (one run): the trusted baselines
    child's and the ones beside each candidate."""
    out: dict[tuple[str, str], list[Showing]] = {}
    for r in records:
        if r.kind != "candidate" and r.timing is not None:
            t = r.timing
            out.setdefault((r.shape_label, r.implementation), []).append(
                Showing(t.p20_us, t.p50_us, t.p80_us, "in the baselines child")
            )
        elif r.kind == "candidate":
            for baseline, t in r.baselines_us.items():
                out.setdefault((r.shape_label, baseline), []).append(Showing.of(t, f"beside {r.implementation}"))
    return out


def showings_by_run(records: Sequence[EvaluationRecord]) -> dict[str, dict[tuple[str, str], list[Showing]]]:
    """run id -> `showings` of that run's records."""
    runs: dict[str, list[EvaluationRecord]] = {}
    for r in records:
        runs.setdefault(r.run_id, []).append(r)
    return {run_id: showings(rs) for run_id, rs in runs.items()}


def bars(r: EvaluationRecord, run_showings: dict[tuple[str, str], list[Showing]]) -> dict[str, Showing]:
    """The timing each baseline timed beside candidate record `r` is judged by: its timing beside it, or
    its fastest showing elsewhere in the run (`showings`) when one is faster beyond the noise and by more
    than ELSEWHERE_MIN_PCT (module docstring)."""
    out = {}
    for baseline, t in r.baselines_us.items():
        beside = Showing.of(t, "beside it")
        limit = beside.p50_us * (1 - ELSEWHERE_MIN_PCT / 100)
        faster = [s for s in run_showings.get((r.shape_label, baseline), ())
                  if s.p80_us < beside.p20_us and s.p50_us < limit]  # fmt: skip
        out[baseline] = min(faster, key=lambda s: s.p50_us, default=beside)
    return out


@dataclass(frozen=True)
class Assessment:
    """One candidate's case for promotion, shape by shape."""

    candidate: str
    content_hash: str
    path: str
    eligible: bool
    reasons: list[str]  # why not eligible (empty when eligible)
    speedups: dict[str, dict[str, float]] = field(default_factory=dict)  # shape -> baseline -> p50 ratio (bars)
    score: float | None = None  # geomean over shapes of the smallest speedup
    short_of: dict[str, list[str]] = field(default_factory=dict)  # shape -> baselines not beaten beyond noise
    evidence: list[str] = field(default_factory=list)
    elsewhere: dict[str, dict[str, Showing]] = field(default_factory=dict)  # shape -> baseline -> a faster
    # showing it was judged against instead of the one beside it (bars)


def assess(
    candidate_records: Sequence[EvaluationRecord],
    shapes: Sequence[str],
    run_showings: dict[tuple[str, str], list[Showing]] | None = None,
) -> Assessment:
    """The case of one candidate (its records from one run) over the task's GPU shapes, each baseline's
    bar taken from `run_showings` (`showings` of the run's records; None: the timings beside it only)."""
    first = candidate_records[0]
    elsewhere: dict[str, dict[str, Showing]] = {}
    by_shape = {r.shape_label: r for r in candidate_records}
    reasons: list[str] = []
    speedups: dict[str, dict[str, float]] = {}
    worst: list[float] = []
    short_of: dict[str, list[str]] = {}
    for label in shapes:
        r = by_shape.get(label)
        if r is None:
            reasons.append(f"{label}: not evaluated")
            continue
        if r.status is not Status.PASSED:
            reasons.append(f"{label}: {r.status.value} ({r.detail})")
            continue
        if r.timing is None:
            reasons.append(f"{label}: not timed ({r.timing_skipped})")
            continue
        if r.suspicious:
            reasons.append(
                f"{label}: p50 {r.timing.p50_us:.2f} us is implausibly far below the roofline floor {r.floor_us:.2f} us"
            )
        # A torch.compile that falls back to eager on this shape is the reference, timed beside it.
        excused = {b for b, note in r.baseline_notes.items() if note.startswith(EAGER_FALLBACK)}
        missing = [b for b in REQUIRED_BASELINES if b not in r.baselines_us and b not in excused]
        if missing:
            reasons.append(f"{label}: baselines {missing} were not timed beside it")
        speedups[label] = {}
        for baseline, bar in sorted(bars(r, run_showings or {}).items()):
            speedups[label][baseline] = bar.p50_us / r.timing.p50_us
            where = ""
            if bar.where != "beside it":
                elsewhere.setdefault(label, {})[baseline] = bar
                where = f" {bar.where}, {r.baselines_us[baseline]['p20_us']:.2f} us beside it"
            if not r.timing.p80_us < bar.p20_us:
                short_of.setdefault(label, []).append(baseline)
                reasons.append(
                    f"{label}: not beyond noise against {baseline} (candidate p80 {r.timing.p80_us:.2f} us, "
                    f"{baseline} p20 {bar.p20_us:.2f} us{where})"
                )
        if speedups[label]:
            worst.append(min(speedups[label].values()))
    score = math.exp(sum(map(math.log, worst)) / len(worst)) if worst and len(worst) == len(shapes) else None
    return Assessment(
        candidate=first.implementation,
        content_hash=first.candidate_hash or "",
        path=first.candidate_path or "",
        eligible=not reasons,
        reasons=reasons,
        speedups=speedups,
        score=score,
        evidence=[r.record_id for r in candidate_records],
        short_of=short_of,
        elsewhere=elsewhere,
    )


def _misses_only_what_it_misses(challenger: Assessment, incumbent: Assessment) -> bool:
    """Whether every reason the challenger is not eligible is a baseline it does not beat beyond noise on a
    shape where the kernel in force (`incumbent`, same run) does not beat that baseline beyond noise either."""
    noise_only = sum(map(len, challenger.short_of.values())) == len(challenger.reasons)
    return noise_only and all(set(b) <= set(incumbent.short_of.get(s, ())) for s, b in challenger.short_of.items())


def same_run_comparisons(challenger: Sequence[EvaluationRecord], incumbent: Sequence[EvaluationRecord],
                         max_regression_pct: float = Thresholds.min_pct) -> dict[str, Comparison]:  # fmt: skip
    """`challenger` against `incumbent` (records of one run) on every shape both were timed on."""
    theirs = {r.shape_label: r.timing for r in incumbent if r.timing is not None}
    return {r.shape_label: compare_same_run(r.timing, theirs[r.shape_label], max_regression_pct)
            for r in challenger if r.timing is not None and r.shape_label in theirs}  # fmt: skip


def picks_note(challenger: Sequence[EvaluationRecord], incumbent: Sequence[EvaluationRecord], shape: str) -> str:
    """A clause for a reason: where kernels of the same name in both (a child of the kernel in force) took other
    configs in their benchmark children (records.autotune_changes of their records on `shape`), which; else ""."""
    mine, theirs = (next((r for r in rows if r.shape_label == shape), None) for rows in (challenger, incumbent))
    picks = autotune_changes(mine, theirs) if mine is not None and theirs is not None else []
    return f" (their autotuners picked differently, promoted -> challenger: {'; '.join(picks)})" if picks else ""


def _why_not_replace(challenger: Sequence[EvaluationRecord], incumbent: Sequence[EvaluationRecord], incumbent_name: str,
                     max_regression_pct: float, tie_allowed: bool = False) -> str | None:  # fmt: skip
    """Why `challenger` may not replace the kernel in force (same run; None: it may): a shape slower
    beyond noise, or no shape faster beyond it (unless `tie_allowed`: a declared fix)."""
    compared = same_run_comparisons(challenger, incumbent, max_regression_pct)
    if not compared:
        return f"no shape was timed for both it and the promoted {incumbent_name}"
    slower = [shape for shape, c in compared.items() if c.verdict == "regression"]
    if slower:
        why = f"slower than the promoted {incumbent_name} on {'; '.join(f'{s}: {compared[s].reason}' for s in slower)}"
        return why + picks_note(challenger, incumbent, slower[0])
    if tie_allowed or any(c.verdict == "faster" for c in compared.values()):
        return None
    best_shape, best = min(compared.items(), key=lambda item: item[1].change_pct)
    return f"not faster than the promoted {incumbent_name} on any shape (its best, {best_shape}: {best.reason})"


def _not_a_fix_of(fix: Sequence[EvaluationRecord], current: PromotionRecord) -> str | None:
    """Why a candidate named as a fix is not one of the kernel in force (None: it is): its CANDIDATE parent
    must name it, by file stem or by a prefix (8+ hex digits) of its content hash."""
    parent = ((fix[0].candidate_meta or {}).get("parent") or "").removesuffix(".py")
    if parent == current.candidate or (len(parent) >= 8 and current.content_hash.startswith(parent)):
        return None
    return f"its CANDIDATE parent is {parent or None!r}, not the promoted {current.candidate}"


def _where_promoted(current: PromotionRecord | None, environment: dict[str, Any]) -> str:
    """'' for a kernel in force promoted on the run's own GPU; else a clause naming the GPU it stands in from."""
    if current is None or gpu_of(current) == str(environment.get("device", "")):
        return ""
    return f" on the {gpu_of(current) or 'GPU of its run'} (standing in: this GPU has no promotion of its own)"


def decide(
    records: Sequence[EvaluationRecord],
    task_shapes: Sequence[str],
    current: PromotionRecord | None,
    environment: dict[str, Any],
    max_regression_pct: float = Thresholds.min_pct,
    fix: str | None = None,
) -> tuple[PromotionRecord | None, list[Assessment], str]:
    """The promotion record this run's records call for (None: no change), the assessments, and why.
    `fix`: the candidate the run names as a fix of the kernel in force (module docstring)."""
    candidates: dict[str, list[EvaluationRecord]] = {}
    for r in records:
        if r.kind == "candidate":
            candidates.setdefault(r.candidate_hash, []).append(r)
    if not candidates:
        return None, [], "no candidates evaluated"
    run_id = records[0].run_id
    run_shapes = {r.shape_label for r in records}
    if records[0].device != "cuda":
        return None, [], "no promotion without GPU timings"
    run_showings = showings(records)
    assessments = [assess(rs, task_shapes, run_showings) for rs in candidates.values()]
    if current is not None and current.action == "promote" and current.content_hash in candidates:
        failed = [r for r in candidates[current.content_hash] if r.status is not Status.PASSED]
        if failed:
            reason = "; ".join(f"{r.shape_label}: {r.status.value} ({r.detail})" for r in failed)
            withdrawal = PromotionRecord(
                task=current.task, action="withdraw", candidate=current.candidate, path=current.path,
                content_hash=current.content_hash, run_id=run_id, evidence=[r.record_id for r in failed],
                reason=f"the promoted candidate failed in run {run_id}: {reason}", speedups={},
                environment=environment,
            )  # fmt: skip
            return withdrawal, assessments, withdrawal.reason
    if set(task_shapes) - run_shapes:
        return None, assessments, f"the run covered {sorted(run_shapes)}, not every GPU shape {list(task_shapes)}"
    where = _where_promoted(current, environment)
    if current is not None and current.action == "promote" and current.content_hash not in candidates:
        return (
            None,
            assessments,
            (
                f"{current.candidate} ({current.content_hash[:12]}) is promoted{where} and was not evaluated in this "
                "run; evaluate it beside the others to change the promotion"
            ),
        )
    in_force = current.content_hash if current is not None and current.action == "promote" else None
    incumbent = next((a for a in assessments if a.content_hash == in_force), None)
    # Challengers held to the bars the kernel in force clears, where it misses some (module docstring).
    on_par = [] if incumbent is None or incumbent.eligible else [
        a for a in assessments if a is not incumbent and not a.eligible and _misses_only_what_it_misses(a, incumbent)
    ]  # fmt: skip
    on_par_hashes = {a.content_hash for a in on_par}
    eligible = sorted((a for a in assessments if a.eligible or a.content_hash in on_par_hashes),
                      key=lambda a: a.score or 0.0, reverse=True)  # fmt: skip
    if not eligible:
        return None, assessments, "no candidate beats every baseline beyond noise on every shape"
    # A named fix is judged even below the kernel in force by score (within its noise, it may be a hair slower).
    fix_named = in_force is not None and any(a.candidate == fix for a in eligible)
    blocked: list[str] = []
    stays: list[str] = []
    as_fix = False
    for best in eligible:
        if best.content_hash == in_force:
            again = "best again" if not blocked else "the best of the others"
            stays = [f"{best.candidate} stays promoted{where} ({again}, geomean speedup {best.score:.3f}x)"]
            if not fix_named:
                return None, assessments, "; ".join([*stays, *blocked])
            continue
        if in_force is None:
            break
        if stays and best.candidate != fix:
            continue  # below the kernel in force: only the named fix may still replace it
        as_fix = best.candidate == fix
        if as_fix and (refused := _not_a_fix_of(candidates[best.content_hash], current)):
            blocked.append(f"{best.candidate} is named as a fix (promote_fix) but is not one: {refused}")
            as_fix = False
            if stays:
                continue  # below the kernel in force by score, and no fix of it: the usual rule keeps it
        why = _why_not_replace(candidates[best.content_hash], candidates[in_force], current.candidate,
                               max_regression_pct, tie_allowed=as_fix)  # fmt: skip
        if why is None:
            break
        blocked.append(f"{best.candidate} (geomean {best.score:.3f}x) not promoted: {why}")
    else:
        if not stays and incumbent is not None:  # the kernel in force misses a bar, and no challenger replaced it
            stays = [f"{current.candidate} stays promoted{where} (it is itself not eligible in this run)"]
        return None, assessments, "; ".join([*stays, *blocked])
    fixed = [f"a fix of the promoted {current.candidate} (promote_fix): it may replace it at equal speed, "
             "and is slower on no shape"] if as_fix else []  # fmt: skip
    bars = "beats every baseline beyond noise on every shape"
    if best.content_hash in on_par_hashes:
        shared = "; ".join(f"{shape}: {', '.join(b)}" for shape, b in best.short_of.items())
        bars += (f" but where the promoted {current.candidate} does not either ({shared}), and replaces it: "
                 "faster on a shape, slower on none")  # fmt: skip
    record = PromotionRecord(
        task=records[0].task, action="promote", candidate=best.candidate, path=best.path,
        content_hash=best.content_hash, run_id=run_id, evidence=best.evidence,
        reason="; ".join([f"{bars}; geomean of worst speedups {best.score:.3f}x", *fixed, *blocked]),
        speedups=best.speedups, environment=environment,
    )  # fmt: skip
    return record, assessments, record.reason


def history(task: str, results_dir: Path | str | None = None) -> list[PromotionRecord]:
    path = task_results_dir(Path(results_dir or DEFAULT_RESULTS_DIR), task) / PROMOTIONS_FILE
    return read(path, PromotionRecord)[0]


def gpu_of(record: PromotionRecord) -> str:
    """The GPU a promotion or withdrawal was decided on: its run's environment names it ('' where it does not)."""
    return str(record.environment.get("device", ""))


def on_gpu(gpu: str | None) -> str:
    """' on the <gpu>' for a line naming where a promotion was decided; '' where no GPU is named."""
    return f" on the {gpu}" if gpu else ""


def latest_by_gpu(task: str, results_dir: Path | str | None = None) -> dict[str, PromotionRecord]:
    """Every GPU with a promotion history of its own for `task` -> its newest record: the promotion in force
    there, or the withdrawal that left none. Ordered by those records, oldest first (`promoted`)."""
    latest: dict[str, PromotionRecord] = {}
    for record in history(task, results_dir):
        latest.pop(gpu_of(record), None)  # re-inserted at the end: the order is that of each GPU's newest record
        latest[gpu_of(record)] = record
    return latest


def promoted(task: str, results_dir: Path | str | None = None, gpu: str | None = None) -> PromotionRecord | None:
    """The promotion in force for `task` on `gpu` (a GPU as records name it, environment.gpu(); None: no GPU
    named), None when there is none.

    Promotions are kept per GPU model: a run's decision is recorded with its environment and moves only the
    promotion of the GPU it ran on, so a runner of another GPU never replaces, nor withdraws, the kernel an
    H200 proved itself on. On a GPU with a history of its own, its newest record is in force (None after a
    withdrawal). A GPU without one, and no GPU at all (a CPU build), takes the newest of the promotions in
    force on the others: a kernel proven on one GPU stands in for the reference on another until that one's
    own runs decide (gpu_of the record says where it was proven).

    The record names a file and its content hash: a reader should load the file only if its bytes
    still hash to `content_hash` (harness.candidates.content_hash)."""
    latest = latest_by_gpu(task, results_dir)
    if gpu is not None and gpu in latest:
        return latest[gpu] if latest[gpu].action == "promote" else None
    return next((r for r in reversed(latest.values()) if r.action == "promote"), None)


def same_code_hashes(
    task: str, record: PromotionRecord | None, results_dir: Path | str | None = None
) -> tuple[str, ...]:
    """The content hashes of `record`'s same-code chain, newest first (none for no record): every bytes the
    promoted kernel's evidence may have been measured under."""
    return tuple(r.content_hash for r in same_code_chain(task, record, results_dir)) if record else ()


def same_code_chain(task: str, record: PromotionRecord, results_dir: Path | str | None = None) -> list[PromotionRecord]:
    """`record` and the promotions it carries through documentation-only edits (`same_code_as`, harness
    rehash), newest first: the last one is the promotion the evidence was measured for."""
    by_hash = {r.content_hash: r for r in history(task, results_dir)
               if r.action == "promote" and gpu_of(r) == gpu_of(record)}  # fmt: skip
    chain = [record]
    while chain[-1].same_code_as and chain[-1].same_code_as in by_hash and len(chain) <= len(by_hash):
        chain.append(by_hash[chain[-1].same_code_as])
    return chain
