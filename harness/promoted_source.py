"""The promoted kernel's bytes, to evaluate it again beside other candidates (review, nightly).

A promotion names a path and a content hash. The bytes are the file at that path when it still
hashes to it; else a revision in the path's git history that held them (an edited or deleted
promoted file can still be re-timed against its successor); else they are gone, and whoever asked
is told why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness import candidates as candidate_files
from harness import review_git
from harness.candidates import Candidate
from harness.records import PromotionRecord
from tasks.task import Task


def full_path(repo: Path, promotion: PromotionRecord) -> Path:
    """Records keep repository-relative paths for files inside the repository, absolute ones otherwise."""
    path = Path(promotion.path)
    return path if path.is_absolute() else repo / path


def loadable_problem(repo: Path, promotion: PromotionRecord) -> str | None:
    """Why the optimized model could not load the promoted kernel (None: it can): the file is gone or changed."""
    path = full_path(repo, promotion)
    if not path.is_file():
        return f"the promoted kernel's file `{promotion.path}` does not exist"
    data = path.read_bytes()
    actual = candidate_files.content_hash(data)
    if actual == promotion.content_hash:
        return None
    problem = (f"`{promotion.path}` holds other bytes (`{actual[:12]}`) than the promoted `{promotion.candidate}` "
               f"(`{promotion.content_hash[:12]}`)")  # fmt: skip
    if same_code(repo, promotion, data):
        problem += f"; only docstrings or comments differ: `harness rehash task={promotion.task}` records the new bytes"
    return problem


def find_bytes(repo: Path, promotion: PromotionRecord) -> tuple[bytes, str] | None:
    """(bytes, where they were found) for the promoted kernel, or None when they are gone."""
    path = full_path(repo, promotion)
    if path.is_file() and candidate_files.content_hash(path.read_bytes()) == promotion.content_hash:
        return path.read_bytes(), f"`{promotion.path}`"
    if path.is_relative_to(repo):
        found = review_git.find_by_hash(repo, str(path.relative_to(repo)), promotion.content_hash)
        if found is not None:
            return found[1], f"`{promotion.path}` at `{found[0][:12]}` (the file has changed since)"
    return None


def same_code(repo: Path, promotion: PromotionRecord, data: bytes) -> bool:
    """Whether `data` is the promoted kernel's code, docstrings and comments aside (candidates.code_hash);
    False when the promoted bytes are gone or either version does not parse."""
    found = find_bytes(repo, promotion)
    return found is not None and candidate_files.same_code(data, found[0])


def beside(
    repo: Path, task: Task, promotion: PromotionRecord | None, loaded: Sequence[Candidate], scratch: Path
) -> tuple[Candidate | None, str | None, str]:
    """The promoted kernel to evaluate beside `loaded`: (an extra candidate or None, its name in the run, a note).

    None and its name when one of `loaded` has its bytes already; None, None and why when its
    bytes are gone or no longer meet the candidate contract."""
    if promotion is None:
        return None, None, ""
    for c in loaded:
        if c.content_hash == promotion.content_hash:
            return None, c.name, ""
    found = find_bytes(repo, promotion)
    if found is None:
        return None, None, (f"The promoted kernel's bytes (`{promotion.content_hash[:12]}`) are neither at "
                            f"`{promotion.path}` nor in its git history: it could not be evaluated again.")  # fmt: skip
    data, origin = found
    stem = Path(promotion.path).stem
    name = stem if stem not in {c.name for c in loaded} else f"{stem}@promoted"
    copy = scratch / "promoted" / task.name / f"{name}.py"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(data)
    try:
        candidate = candidate_files.load(copy, task.name, task.op_name)
    except candidate_files.CandidateError as e:
        return None, None, f"The promoted kernel (from {origin}) no longer meets the candidate contract: {e}"
    return candidate, name, f"The promoted kernel was read from {origin}."
