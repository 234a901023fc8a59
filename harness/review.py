"""`harness review`: evaluate the candidates a change adds or edits, and report as a PR comment and a page.

    harness review base=main head=HEAD            candidates changed on HEAD since it left main
    harness review candidates=[candidate_kernels/fuse_norm/mine.py]     given files
    harness review candidates=[/tmp/k.py] task=fuse_norm                a file outside the tree

A revision range is read as a PR shows it: `git diff base...head` over candidate_kernels/<task>/
*.py, and each file is evaluated as it is at `head` (uncommitted edits are not reviewed). Each
task's changed candidates run through the runner exactly as `harness run` runs them, with the
promoted kernel beside them (its bytes from its path, or from git history by content hash), so
that a change to it is timed against the version it replaces. A review never promotes.

Writes <out_dir>/review.md (paste as a PR comment) and review.html (self-contained), and prints
a line per candidate, then the gate on the LAST line. Exit status: 0 when every changed candidate
passes parity (and the contract checks) on every shape and none regresses a promoted kernel
(deletes it, or is slower than the promoted version it replaces beyond noise); 1 otherwise,
and for bad input (an unknown revision or task, a missing file).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import candidates as candidate_files
from harness import environment, goals, promote, promoted_source, review_git, runner
from harness.environment import REPO_ROOT
from harness.records import EvaluationRecord, PromotionRecord, Status, now_utc
from harness.regression import Thresholds
from harness.report import Change, Gate, Review, TaskReview, Verdict, review_html, review_markdown

REVIEW_DIR = "review"  # <results_dir>/review/<stamp>/ unless out_dir is given


@dataclass(frozen=True, kw_only=True)
class ReviewSettings(runner.EvaluationSettings):
    base: str = ""  # a git revision: review what head changed since it left base (base...head)
    head: str = "HEAD"  # the revision whose candidates are judged (against base)
    candidates: tuple[str, ...] = ()  # or: these files (instead of a revision range)
    task: str = ""  # the task of `candidates` that are not in candidate_kernels/<task>/
    out_dir: str | None = None  # default: <results_dir>/review/<UTC stamp>
    repo_dir: str | None = None  # the repository under review; default: this one
    # Inherited `promote` and `promote_fix` are ignored: a review never writes a promotion. Inherited
    # `max_regression_pct` is also the threshold of its regression verdicts against the promoted kernel.


# ---- verdicts: a pure function of the run's records ---------------------------------------------------
def _first_problem(rows: Sequence[EvaluationRecord]) -> str | None:
    bad = [r for r in rows if r.status is not Status.PASSED]
    if bad:
        more = f" (and {len(bad) - 1} more shape(s))" if len(bad) > 1 else ""
        return f"{bad[0].status.value} on `{bad[0].shape_label}`: {bad[0].detail}{more}"
    low = [r for r in rows if r.suspicious]
    if low:
        return (f"p50 implausibly far below the roofline floor on `{low[0].shape_label}` ({low[0].timing.p50_us:.2f} "
                f"us, floor {low[0].floor_us:.2f} us): a measurement error or a cheat")  # fmt: skip
    return None


def _replaces_promoted(c: Change, promoted: PromotionRecord | None) -> bool:
    return promoted is not None and promoted.path in (c.path, c.old_path)


def judge(
    changes: Sequence[Change],
    records: Sequence[EvaluationRecord],
    promoted: PromotionRecord | None,
    promoted_name: str | None,
    task_shapes: Sequence[str],
    max_regression_pct: float = Thresholds.min_pct,
) -> tuple[dict[str, Verdict], str]:
    """Every change's verdict, and what `harness run` would decide on these records."""
    decision, assessments, reason = None, [], "nothing was evaluated"
    if records:
        env = records[0].environment
        decision, assessments, reason = promote.decide(records, task_shapes, promoted, env, max_regression_pct)
    by_hash = {a.content_hash: a for a in assessments}
    verdicts = {}
    for c in changes:
        verdicts[c.path] = _verdict(c, records, promoted, promoted_name, decision, by_hash, reason, max_regression_pct)
    return verdicts, reason


def _verdict(c, records, promoted, promoted_name, decision, by_hash, decide_reason, max_regression_pct) -> Verdict:
    if c.kind == "deleted":
        if _replaces_promoted(c, promoted):
            why = (f"deletes the promoted kernel of `{c.task}` (`{promoted.candidate}`): the optimized model would "
                   "fall back to the reference; promote a successor first")  # fmt: skip
            return Verdict(c.path, why, gate_ok=False)
        return Verdict(c.path, "deleted: nothing to evaluate")
    if c.contract_error:
        why = f"breaks the candidate contract: {c.contract_error}"
        return Verdict(c.path, why, gate_ok=False)
    rows = [r for r in records if r.implementation == c.candidate]
    if not rows:
        why = "was not evaluated (no record in the run)"
        return Verdict(c.path, why, gate_ok=False)
    problem = _first_problem(rows)
    if problem:
        return Verdict(c.path, problem, gate_ok=False)
    against: dict[str, Any] = {}
    old: list = []  # the promoted version's records, where it ran beside this edit of it
    if _replaces_promoted(c, promoted) and promoted_name and promoted_name != c.candidate:
        old = [r for r in records if r.implementation == promoted_name]
        against = promote.same_run_comparisons(rows, old, max_regression_pct)
    unchecked = ""
    if _replaces_promoted(c, promoted) and not promoted_name:
        unchecked = "; the promoted version it replaces was not evaluated beside it, so no regression check ran"
    slower = {s: cmp for s, cmp in against.items() if cmp.verdict == "regression"}
    if slower:
        shape, cmp = next(iter(slower.items()))
        more = f" (and {len(slower) - 1} more shape(s))" if len(slower) > 1 else ""
        picks = promote.picks_note(rows, old, shape)
        why = f"regresses the promoted `{promoted.candidate}` it replaces on `{shape}`: {cmp.reason}{more}{picks}"
        return Verdict(c.path, why, gate_ok=False, against_promoted=against)
    if all(r.timing is None for r in rows):
        skipped = rows[0].timing_skipped or "no timing"
        why = f"parity passed on every shape ({rows[0].policy} policy); not promotable without GPU timings ({skipped})"
        return Verdict(c.path, why + unchecked, against_promoted=against)
    if decision is not None and decision.action == "promote" and decision.content_hash == c.content_hash:
        return Verdict(c.path, decision.reason + unchecked, promoted=True, against_promoted=against)
    a = by_hash.get(c.content_hash)
    if a is not None and not a.eligible:
        more = f" (and {len(a.reasons) - 3} more)" if len(a.reasons) > 3 else ""
        return Verdict(c.path, "; ".join(a.reasons[:3]) + more + unchecked, against_promoted=against)
    score = f" (geomean of worst speedups {a.score:.3f}x)" if a is not None and a.score else ""
    why = f"eligible{score}, but not promoted: {decide_reason}"
    return Verdict(c.path, why + unchecked, against_promoted=against)


def gate_of(tasks: Sequence[TaskReview]) -> Gate:
    reasons = tuple(f"{t.task}/{c.label}: {t.verdicts[c.path].reason}" for t in tasks for c in t.changes
                    if not t.verdicts[c.path].gate_ok)  # fmt: skip
    return Gate(not reasons, reasons)


# ---- what the report needs besides records -----------------------------------------------------------
def cheat_checks() -> tuple[tuple[str, str], ...]:
    """The contract checks the child runs around every call, as harness/child.py documents them."""
    from harness import child

    marker = "Cheat checks around every candidate call (names as recorded):"
    doc = child.__doc__ or ""
    if marker not in doc:
        raise RuntimeError(f"harness/child.py's docstring no longer lists its checks under {marker!r}")
    checks: list[list[str]] = []
    for line in doc.split(marker, 1)[1].splitlines():
        entry = re.match(r"^  ([a-z_]+)\s{2,}(.+)$", line)
        if entry:
            checks.append([entry.group(1), entry.group(2).strip()])
        elif checks and line.startswith("    ") and line.strip():
            checks[-1][1] += " " + line.strip()
        elif checks and not line.strip():
            break
    return tuple((name, text) for name, text in checks)


def unified_diff(old: bytes, new: bytes, old_name: str, new_name: str) -> str:
    a = old.decode(errors="replace").splitlines(keepends=True)
    b = new.decode(errors="replace").splitlines(keepends=True)
    return "".join(line if line.endswith("\n") else line + "\n" for line in
                   difflib.unified_diff(a, b, old_name, new_name, n=3)).rstrip("\n")  # fmt: skip


def kernel_profiles(results_dir: Path, task: str, hashes: set[str]) -> tuple[dict[str, Any], ...]:
    """The Nsight Compute records (`harness profile`) of these candidates; none when that module is absent."""
    try:
        from harness.profile_kernel_records import load_profiles
    except ImportError:
        return ()
    rows, _skipped = load_profiles(results_dir, task)
    return tuple(r.to_dict() for r in rows if r.candidate_hash in hashes)


# ---- gathering the changes -----------------------------------------------------------------------------
def _load(path: Path, task) -> tuple[candidate_files.Candidate | None, str | None]:
    try:
        return candidate_files.load(path, task.name, task.op_name), None
    except candidate_files.CandidateError as e:
        return None, str(e)


def _materialize(repo: Path, rel: str, data: bytes, tmp: Path) -> Path:
    """The file as it is at head: the working tree's when identical (readable paths), else a copy."""
    local = repo / rel
    if local.is_file() and local.read_bytes() == data:
        return local
    copy = tmp / "head" / Path(rel).parent.name / Path(rel).name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(data)
    return copy


def _parent_source(repo: Path, base: str | None, task: str, parent: str) -> tuple[str, str, bytes] | None:
    """The parent a CANDIDATE dict names (a file stem, or a content-hash prefix), at base, else in the
    tree: (a label for the report, its repository path, its bytes), or None."""
    folder = f"{review_git.CANDIDATES_FOLDER}/{task}"
    stem = parent.removesuffix(".py")
    if "/" not in stem:
        rel = f"{folder}/{stem}.py"
        if base is not None and (data := review_git.show(repo, base, rel)) is not None:
            return f"`{stem}.py` (its parent) at `{base}`", rel, data
        if (repo / rel).is_file():
            return f"`{stem}.py` (its parent, working tree)", rel, (repo / rel).read_bytes()
    if re.fullmatch(r"[0-9a-f]{8,64}", parent):
        if base is not None:
            for name in review_git.files_at(repo, base, folder):
                data = review_git.show(repo, base, f"{folder}/{name}")
                if data is not None and candidate_files.content_hash(data).startswith(parent):
                    return f"`{name}` (its parent, by hash) at `{base}`", f"{folder}/{name}", data
        for p in sorted((repo / folder).glob("*.py")):
            if candidate_files.content_hash(p.read_bytes()).startswith(parent):
                return f"`{p.name}` (its parent, by hash, working tree)", f"{folder}/{p.name}", p.read_bytes()
    return None


def _diff_fields(repo: Path, base: str | None, task: str, rel: str, data: bytes, old: tuple[str, bytes] | None,
                 meta: dict | None) -> dict[str, str]:  # fmt: skip
    """diff_against / diff / diff_note of a change: against the file at base, else its parent, else nothing."""
    if old is not None:
        label, old_data = old
        return {"diff_against": label, "diff": unified_diff(old_data, data, f"a/{rel}", f"b/{rel}")}
    parent = (meta or {}).get("parent")
    if parent:
        found = _parent_source(repo, base, task, parent)
        if found is not None:
            label, parent_rel, parent_data = found
            return {"diff_against": label, "diff": unified_diff(parent_data, data, f"a/{parent_rel}", f"b/{rel}")}
        note = f"Its parent `{parent}` was found neither at {f'`{base}`' if base else 'git HEAD'} nor in the " \
               "working tree; the whole file is shown."  # fmt: skip
    else:
        note = "A new file without a parent (CANDIDATE['parent'] is None): the whole file is shown."
    return {"diff_against": "nothing (a new file)", "diff": unified_diff(b"", data, "/dev/null", f"b/{rel}"),
            "diff_note": note}  # fmt: skip


def _code_changes(old: bytes | None, new: bytes) -> tuple[str, ...] | None:
    """What an edit changed in the code (candidates.code_differences; () for docstrings and comments only), or
    None where there is no earlier version or either version does not parse."""
    if old is None:
        return None
    try:
        return tuple(candidate_files.code_differences(old, new))
    except SyntaxError:
        return None


def _revision_changes(repo: Path, base: str, head: str, tmp: Path) -> dict[str, list[tuple[Change, Any]]]:
    from tasks import TASKS

    by_task: dict[str, list[tuple[Change, Any]]] = {}
    for fc in review_git.changed_candidates(repo, base, head):
        entries = by_task.setdefault(fc.task, [])
        kind = {"A": "added", "M": "modified", "R": "renamed", "D": "deleted"}[fc.status]
        if fc.status == "D":
            entries.append((Change(fc.task, fc.path, kind, diff_note=f"Deleted at `{head}`."), None))
            continue
        if fc.task not in TASKS:
            error = f"candidate_kernels/{fc.task}/ is not a task's folder; known tasks: {sorted(TASKS)}"
            entries.append((Change(fc.task, fc.path, kind, old_path=fc.old_path, contract_error=error), None))
            continue
        data = review_git.show(repo, head, fc.path)
        candidate, error = _load(_materialize(repo, fc.path, data, tmp), TASKS[fc.task])
        meta = candidate.meta.to_dict() if candidate else None
        old_data = review_git.show(repo, base, fc.old_path or fc.path) if fc.status in "MR" else None
        old = (f"`{fc.old_path or fc.path}` at `{base}`", old_data) if old_data is not None else None
        change = Change(fc.task, fc.path, kind, candidate=candidate.name if candidate else None,
                        content_hash=candidate_files.content_hash(data), meta=meta, old_path=fc.old_path,
                        contract_error=error, code_changes=_code_changes(old_data, data),
                        **_diff_fields(repo, base, fc.task, fc.path, data, old, meta))  # fmt: skip
        entries.append((change, candidate))
    return by_task


def _given_changes(repo: Path, paths: Sequence[str], task_name: str) -> dict[str, list[tuple[Change, Any]]]:
    from tasks import TASKS, get_task

    by_task: dict[str, list[tuple[Change, Any]]] = {}
    for given in paths:
        path = Path(given).resolve()
        if not path.is_file():
            raise runner.UsageError(f"candidate file {given!r} does not exist (resolved to {path})")
        name = task_name or path.parent.name
        if name not in TASKS:
            raise runner.UsageError(f"cannot tell the task of {given!r}: its folder {path.parent.name!r} is not a "
                                    f"task; give task=<one of {sorted(TASKS)}>")  # fmt: skip
        task = get_task(name)
        rel = str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)
        data = path.read_bytes()
        candidate, error = _load(path, task)
        meta = candidate.meta.to_dict() if candidate else None
        at_head = review_git.show(repo, "HEAD", rel) if path.is_relative_to(repo) and not (meta or {}).get("parent") \
            else None  # fmt: skip
        old = (f"`{rel}` at `HEAD`", at_head) if at_head is not None and at_head != data else None
        change = Change(name, rel, "given", candidate=candidate.name if candidate else None,
                        content_hash=candidate_files.content_hash(data), meta=meta, contract_error=error,
                        code_changes=_code_changes(old[1], data) if old else None,
                        **_diff_fields(repo, None, name, rel, data, old, meta))  # fmt: skip
        by_task.setdefault(name, []).append((change, candidate))
    return by_task


def _promoted_relation(
    repo: Path, c: Change, cand: candidate_files.Candidate | None, promoted: PromotionRecord | None
) -> str:
    """How `c` stands to the kernel in force: "" (another file, or one that did not load), "bytes" (the
    promoted bytes), "code" (its code, documentation edits apart: candidates.code_hash) or "edit" (other
    code). One look at the promoted bytes in git history per file."""
    if cand is None or not _replaces_promoted(c, promoted):
        return ""
    if cand.content_hash == promoted.content_hash:
        return "bytes"
    return "code" if promoted_source.same_code(repo, promoted, cand.path.read_bytes()) else "edit"


def _promoted_edit_note(c: Change, relation: str) -> str:
    """What merging an edit of the promoted kernel's file does to the optimized model, which loads only the
    promoted bytes (empty when `c` is not such an edit, or the promotion names its bytes already)."""
    if relation == "code":
        return (f"; a documentation-only edit of the promoted kernel (the same code): the optimized model refuses "
                f"the new bytes until `harness rehash task={c.task}` records them")  # fmt: skip
    if relation == "edit":
        return (f"; edits the promoted kernel's code: the optimized model refuses the new bytes until they are "
                f"promoted (`harness run task={c.task}` on a GPU, where they must also be faster than the version "
                "in force beyond noise on one shape; after a tie, restore the promoted bytes)")  # fmt: skip
    return ""


def _same_code_hashes(c: Change, relation: str, promoted: PromotionRecord | None, results_dir: Path) -> tuple[str, ...]:
    """Earlier content hashes whose kernel profiles stand for `c`: where its bytes are the promoted kernel's
    code (documentation edits apart), the promotion's and those it carries (`harness rehash`); else none."""
    if relation not in ("bytes", "code"):
        return ()
    return tuple(r.content_hash for r in promote.same_code_chain(c.task, promoted, results_dir)
                 if r.content_hash != c.content_hash)  # fmt: skip


# ---- the command -----------------------------------------------------------------------------------------
def run_review(settings: ReviewSettings, echo=print) -> Review:
    """Evaluate what changed and build the Review (nothing written but the runner's records)."""
    from tasks import TASKS

    repo = Path(settings.repo_dir).resolve() if settings.repo_dir else REPO_ROOT
    if bool(settings.base) == bool(settings.candidates):
        raise runner.UsageError("give either base=<revision> (and head=, default HEAD) or candidates=[<file>, ...]; "
                                f"got base={settings.base!r}, candidates={list(settings.candidates)}")  # fmt: skip
    evaluation = dataclasses.replace(settings, promote=False, promote_fix="")
    tasks = []
    with tempfile.TemporaryDirectory(prefix="beam-review-") as scratch:
        tmp = Path(scratch)
        if settings.base:
            base, head = review_git.resolve(repo, settings.base), review_git.resolve(repo, settings.head)
            title = f"`{settings.base}...{settings.head}` (`{base[:10]}...{head[:10]}`)"
            by_task = _revision_changes(repo, settings.base, settings.head, tmp)
        else:
            title = ", ".join(f"`{p}`" for p in settings.candidates)
            by_task = _given_changes(repo, settings.candidates, settings.task)
        for name, entries in sorted(by_task.items()):
            changes = tuple(c for c, _ in entries)
            loaded = [cand for _, cand in entries if cand is not None]
            if name not in TASKS:
                verdicts, _ = judge(changes, [], None, None, [])
                tasks.append(TaskReview(name, changes, verdicts))
                continue
            task = TASKS[name]
            promoted = promote.promoted(name, settings.results_path, environment.gpu())
            extra, promoted_name, note = promoted_source.beside(repo, task, promoted, loaded, tmp)
            to_run = loaded + ([extra] if extra is not None else [])
            result = runner.evaluate(task, to_run, evaluation, echo=echo) if loaded else None
            records = result.records if result else ()
            verdicts, reason = judge(changes, records, promoted, promoted_name if result else None,
                                     [s.label for s in task.shapes], settings.max_regression_pct)  # fmt: skip
            reviewed = []
            for c, cand in entries:
                relation = _promoted_relation(repo, c, cand, promoted)
                edit_note = _promoted_edit_note(c, relation)
                if edit_note:
                    verdicts[c.path] = dataclasses.replace(verdicts[c.path], reason=verdicts[c.path].reason + edit_note)
                same = _same_code_hashes(c, relation, promoted, settings.results_path)
                reviewed.append(dataclasses.replace(c, same_code_hashes=same))
            changes = tuple(reviewed)
            hashes = {h for c in changes for h in (c.content_hash, *c.same_code_hashes) if h}
            tasks.append(TaskReview(
                name, changes, verdicts, records, result.run.run_id if result else None, promoted,
                promoted_name if result else None, note, reason if result else "",
                kernel_profiles(settings.results_path, name, hashes), tuple(goals.side_by_side(task, records)),
            ))  # fmt: skip
    return Review(title, now_utc(), tuple(tasks), gate_of(tasks), cheat_checks())


def write_review(review: Review, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / "review.md", out_dir / "review.html"
    md.write_text(review_markdown(review))
    page.write_text(review_html(review))
    return md, page


def main(settings: ReviewSettings) -> int:
    try:
        review = run_review(settings)
    except ValueError as e:  # UsageError, GitError, an unknown task: bad input
        sys.stdout.flush()
        print(f"error: harness review: {e}", file=sys.stderr)
        return 1
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    out_dir = Path(settings.out_dir) if settings.out_dir else settings.results_path / REVIEW_DIR / stamp
    md, page = write_review(review, out_dir)
    for t in review.tasks:
        for c in t.changes:
            v = t.verdicts[c.path]
            print(f"{t.task}/{c.label}, {c.kind_text}: {v.action} [gate {'pass' if v.gate_ok else 'FAIL'}]: {v.reason}")
    print(f"report: {md}\n        {page}")
    if not review.tasks:
        print(f"review: PASS: no candidate file changed in {review.title}")
    else:
        print(review.gate.line)
    sys.stdout.flush()
    return 0 if review.gate.ok else 1
