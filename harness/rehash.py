"""`harness rehash task=<t>`: keep a promotion through an edit of the promoted kernel's docstrings or comments.

A promotion names the promoted file's bytes (its content hash), and the optimized model refuses other
bytes at that path. After an edit that leaves the code alone (a header brought up to date with the
figures measured since, a comment corrected), this command compares the file's code with the promoted
bytes' code (candidates.code_hash: the syntax tree without docstrings; comments and layout never
reach it), the promoted bytes read from the path's git history when the file no longer holds them.
When the code is the same, it appends a promotion record naming the new bytes, with the evidence,
speedups and environment of the promotion it carries and `same_code_as` set to the hash it replaces
(`harness nightly` then counts the older hash's timings as the kernel's history). Any other change is
refused, naming the definitions whose code changed: a code change is a new candidate, judged by
`harness run`. Promotions are per GPU (harness/promote.py `promoted`): each GPU whose own promotion in
force is the edited file gets its record, with its own evidence.

    harness rehash task=fuse_norm                 check, then append the record
    harness rehash task=fuse_norm dry_run=true    check and print the record, append nothing
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import candidates, promote, promoted_source
from harness.environment import REPO_ROOT
from harness.records import DEFAULT_RESULTS_DIR, PROMOTIONS_FILE, PromotionRecord, append, task_results_dir


@dataclass(frozen=True)
class RehashSettings:
    task: str = ""  # required: a task with a promotion in force
    results_dir: str | None = None  # default: <repo>/results
    dry_run: bool = False  # check and print the record; append nothing


class RehashError(ValueError):
    """Why the file at the promoted path cannot carry the promotion (the command exits 1 with it)."""


def _nothing_in_force(task: str, results_dir: Path | str) -> RehashError:
    where = task_results_dir(Path(results_dir), task) / PROMOTIONS_FILE
    return RehashError(f"task {task!r} has no promotion in force ({where}): nothing to carry")


def carried_promotions(task: str, results_dir: Path | str, repo: Path = REPO_ROOT) -> list[PromotionRecord]:
    """`carried_promotion` of every GPU with a promotion of its own in force (none where all hold their bytes).
    Raises RehashError where no GPU has one."""
    in_force = [r for r in promote.latest_by_gpu(task, results_dir).values() if r.action == "promote"]
    if not in_force:
        raise _nothing_in_force(task, results_dir)
    return [r for current in in_force if (r := carried_promotion(task, current, results_dir, repo)) is not None]


def carried_promotion(task: str, current: PromotionRecord, results_dir: Path | str, repo: Path = REPO_ROOT
                      ) -> PromotionRecord | None:  # fmt: skip
    """The record that moves the promotion `current` (in force on its GPU) to the bytes now at its path (None: they
    are the promoted bytes already). Raises RehashError when there is no file, no promoted bytes to compare with,
    or code that differs."""
    path = promoted_source.full_path(repo, current)
    if not path.is_file():
        raise RehashError(f"the promoted kernel's file `{current.path}` does not exist")
    data = path.read_bytes()
    new_hash = candidates.content_hash(data)
    if new_hash == current.content_hash:
        return None
    found = promoted_source.find_bytes(repo, current)
    if found is None:
        raise RehashError(
            f"`{current.path}` holds other bytes ({new_hash[:12]}) than the promoted {current.candidate} "
            f"({current.content_hash[:12]}), whose bytes are in none of the last revisions of its git history: "
            "there is nothing to compare the code with"
        )
    old, where = found
    try:
        same = candidates.code_hash(data) == candidates.code_hash(old)
    except SyntaxError as e:
        raise RehashError(f"`{current.path}` is not valid Python: {e.msg} (line {e.lineno})") from e
    if not same:
        changed = ", ".join(f"`{name}`" for name in candidates.code_differences(old, data))
        raise RehashError(
            f"`{current.path}` changes code, not only docstrings or comments, against the promoted bytes "
            f"({where}): {changed}. A code change is a new candidate: `harness run task={task}` evaluates it "
            "(and promotes it if it wins)"
        )
    root = promote.same_code_chain(task, current, results_dir)[-1]
    reason = (
        f"documentation-only edit of {current.content_hash[:12]} (promotion {current.promotion_id}): the same code "
        f"as the kernel promoted in run {root.run_id}: {root.reason}"
    )
    return PromotionRecord(
        task=task, action="promote", candidate=current.candidate, path=current.path, content_hash=new_hash,
        run_id=current.run_id, evidence=list(current.evidence), reason=reason, speedups=current.speedups,
        environment=current.environment, same_code_as=current.content_hash,
    )  # fmt: skip


def main(settings: RehashSettings) -> int:
    from tasks import TASKS, get_task

    try:
        if not settings.task:
            raise ValueError(f"task is required, e.g. `harness rehash task=fuse_norm`; known: {sorted(TASKS)}")
        task = get_task(settings.task)
        results_dir = Path(settings.results_dir) if settings.results_dir else DEFAULT_RESULTS_DIR
        records = carried_promotions(task.name, results_dir)
    except ValueError as e:  # RehashError, or an unknown task
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not records:
        print(f"{task.name}: the file at the promoted path holds the promoted bytes: nothing to record")
        return 0
    if settings.dry_run:
        for record in records:
            print(json.dumps(record.to_dict(), indent=2, sort_keys=True))
        print(f"{task.name}: dry run: nothing appended", file=sys.stderr)
        return 0
    target = task_results_dir(results_dir, task.name) / PROMOTIONS_FILE
    for record in records:
        append(target, record)
        on = promote.on_gpu(promote.gpu_of(record))
        print(f"{task.name}: {record.candidate} now in force{on} as {record.content_hash[:12]} "
              f"(same code as {record.same_code_as[:12]}); appended to {target}")  # fmt: skip
    return 0
