"""What `harness review` asks git: which candidate files a revision range changed, and their bytes.

All through the `git` command line (no library), in the repository under review. A revision or
repository git does not know is bad input (GitError, a ValueError: the CLI exits 1 naming it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.candidates import content_hash

CANDIDATES_FOLDER = "candidate_kernels"
HISTORY_SEARCH_LIMIT = 200  # revisions of one path searched for a promoted kernel's bytes


class GitError(ValueError):
    """git refused: not a repository, an unknown revision (bad input, not a harness failure)."""


@dataclass(frozen=True)
class FileChange:
    status: str  # "A" added, "M" modified, "D" deleted, "R" renamed (a copy "C" counts as added)
    path: str  # repository-relative, at head (deleted: at base)
    old_path: str | None = None  # renamed: at base

    @property
    def task(self) -> str:
        return PurePosixPath(self.path).parts[1]


def git(repo: Path, *args: str) -> bytes:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60, check=False)
    except OSError as e:
        raise GitError(f"cannot run git: {e}") from e
    if out.returncode != 0:
        raise GitError(f"`git {' '.join(args)}` failed in {repo}: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout


def resolve(repo: Path, revision: str) -> str:
    """The commit a revision names; GitError naming it when git does not know it."""
    if not revision or revision.startswith("-"):
        raise GitError(f"a git revision is required (e.g. main, HEAD~3, a commit); got {revision!r}")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").decode().strip()
    except GitError:
        raise GitError(f"revision {revision!r} is not a commit of the repository at {repo}") from None


def is_candidate_path(path: str) -> bool:
    """candidate_kernels/<task>/<name>.py, where the runner would find it (not `_`-prefixed)."""
    parts = PurePosixPath(path).parts
    return len(parts) == 3 and parts[0] == CANDIDATES_FOLDER and parts[2].endswith(".py") and \
        not parts[2].startswith("_")  # fmt: skip


def changed_candidates(repo: Path, base: str, head: str) -> list[FileChange]:
    """Candidate files changed on `head` since it left `base` (`git diff base...head`, as a PR shows)."""
    raw = git(repo, "diff", "--name-status", "-z", "-M", f"{base}...{head}", "--", CANDIDATES_FOLDER)
    fields = raw.decode().split("\0")
    changes, i = [], 0
    while i < len(fields) and fields[i]:
        status = fields[i][0]
        if status in "RC":
            old, new = fields[i + 1], fields[i + 2]
            i += 3
            if is_candidate_path(new):
                changes.append(FileChange("R", new, old) if status == "R" else FileChange("A", new))
            elif status == "R" and is_candidate_path(old):  # moved out of the candidate folders
                changes.append(FileChange("D", old))
            continue
        path = fields[i + 1]
        i += 2
        if is_candidate_path(path):
            changes.append(FileChange({"A": "A", "M": "M", "D": "D", "T": "M"}.get(status, "M"), path))
    return sorted(changes, key=lambda c: c.path)


def show(repo: Path, revision: str, path: str) -> bytes | None:
    """The bytes of `path` at `revision`, or None when it does not exist there."""
    try:
        return git(repo, "show", f"{revision}:{path}")
    except GitError:
        return None


def files_at(repo: Path, revision: str, folder: str) -> list[str]:
    try:
        return git(repo, "ls-tree", "--name-only", f"{revision}:{folder}").decode().split()
    except GitError:
        return []


def history(repo: Path, path: str) -> Iterator[tuple[str, bytes]]:
    """(revision, bytes) of `path` in the newest HISTORY_SEARCH_LIMIT revisions that touched it, newest first
    (none outside a git repository)."""
    try:
        revisions = git(repo, "rev-list", f"--max-count={HISTORY_SEARCH_LIMIT}", "--all", "--", path).decode().split()
    except GitError:
        return
    for rev in revisions:
        data = show(repo, rev, path)
        if data is not None:
            yield rev, data


def find_by_hash(repo: Path, path: str, wanted: str) -> tuple[str, bytes] | None:
    """A revision where `path` held bytes of SHA-256 `wanted` (a promoted kernel edited since), newest first."""
    return next(((rev, data) for rev, data in history(repo, path) if content_hash(data) == wanted), None)
