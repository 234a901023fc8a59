"""Candidate files: discovery, identity and metadata, read WITHOUT importing them.

A candidate is `candidate_kernels/<task>/<name>.py` (the contract: candidate_kernels/README.md).
The parent process never imports candidate code: it parses the file (`ast`), checks that a
top-level function named like the reference op (`Task.op_name`) exists, and reads the top-level
`CANDIDATE = {...}` literal with `ast.literal_eval`. Only a sandboxed child process imports it.

Identity is the content hash (SHA-256 of the file's bytes): two files with the same bytes are one
candidate, and an edited file is a new candidate. Beside it, `code_hash` hashes what runs: the
syntax tree without docstrings (comments and layout never reach it), so that an edit of a promoted
kernel's header or comments can be told apart from a change of its code (`harness rehash`).
"""

from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.environment import REPO_ROOT

CANDIDATES_ROOT = REPO_ROOT / "candidate_kernels"
AUTHOR_KINDS = ("human", "agent")
METADATA_KEYS = ("author", "model", "parent", "idea")
MAX_IDEA_CHARS = 200


class CandidateError(ValueError):
    """A candidate file breaks the contract (bad input: the CLI exits 1 with this message)."""


@dataclass(frozen=True)
class CandidateMeta:
    """The `CANDIDATE` dict of a candidate file. `parent` names the candidate it was derived from
    (a file name in the same folder or a content hash), `model` the model that wrote it (agents)."""

    author: Literal["human", "agent"]
    model: str | None
    parent: str | None
    idea: str

    def __post_init__(self) -> None:
        if self.author not in AUTHOR_KINDS:
            raise ValueError(f"author must be one of {AUTHOR_KINDS}; got {self.author!r}")
        if self.author == "agent" and not (isinstance(self.model, str) and self.model.strip()):
            raise ValueError(f"an agent-written candidate must name its model (a non-empty str); got {self.model!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"model must be a str or None; got {self.model!r}")
        if self.parent is not None and not (isinstance(self.parent, str) and self.parent.strip()):
            raise ValueError(f"parent must be a non-empty str or None; got {self.parent!r}")
        if not isinstance(self.idea, str) or not self.idea.strip():
            raise ValueError(f"idea must be a non-empty one-line str; got {self.idea!r}")
        if "\n" in self.idea or len(self.idea) > MAX_IDEA_CHARS:
            raise ValueError(f"idea must be one line of at most {MAX_IDEA_CHARS} characters; got {self.idea!r}")

    def to_dict(self) -> dict[str, str | None]:
        return {"author": self.author, "model": self.model, "parent": self.parent, "idea": self.idea}


@dataclass(frozen=True)
class Candidate:
    """A validated candidate file. `name` is the file stem; `content_hash` its identity."""

    task: str
    name: str
    path: Path
    content_hash: str
    meta: CandidateMeta

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]

    @property
    def display_path(self) -> str:
        """Repository-relative when inside the repository, else absolute."""
        try:
            return str(self.path.relative_to(REPO_ROOT))
        except ValueError:
            return str(self.path)


_PARSE_LOCK = threading.Lock()


def parse_source(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one call at a time in this process. CPython 3.11 keeps the AST constructor's recursion
    depth in interpreter-wide state, so two threads building trees at once can fail with a spurious
    "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905); the agent loop
    parses submissions on one thread per GPU. Raises SyntaxError as ast.parse does."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def content_hash(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def _code_tree(source: bytes) -> ast.Module:
    """The syntax tree of `source` with the docstrings of the module, its classes and functions removed."""
    tree = parse_source(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def code_hash(source: bytes) -> str:
    """SHA-256 of the code of `source`: its syntax tree without docstrings, comments, layout or line numbers.
    Raises SyntaxError for a file that does not parse."""
    return hashlib.sha256(ast.dump(_code_tree(source)).encode()).hexdigest()


def same_code(a: bytes, b: bytes) -> bool:
    """Whether two versions of a file hold the same code, docstrings, comments and layout aside (code_hash);
    False when either does not parse."""
    try:
        return code_hash(a) == code_hash(b)
    except SyntaxError:
        return False


def code_differences(old: bytes, new: bytes) -> list[str]:
    """The top-level statements whose code differs between two versions of a file, by name where they have
    one (functions, classes, assigned names), in `new`'s order; removed ones last."""

    def named(source: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for i, node in enumerate(_code_tree(source).body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                key = node.name
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                key = ", ".join(ast.unparse(t) for t in targets)
            else:
                key = f"statement {i + 1} ({type(node).__name__})"
            out[key] = out.get(key, "") + ast.dump(node)
        return out

    before, after = named(old), named(new)
    changed = [k for k, dump in after.items() if before.get(k) != dump]
    return changed + [f"{k} (removed)" for k in before if k not in after]


def task_dir(task: str) -> Path:
    return CANDIDATES_ROOT / task


def _metadata(tree: ast.Module, path: Path) -> CandidateMeta:
    assigns = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CANDIDATE" for t in node.targets)
    ]
    if len(assigns) != 1:
        raise CandidateError(
            f"{path}: expected exactly one top-level `CANDIDATE = {{...}}` assignment; found {len(assigns)}"
        )
    try:
        raw = ast.literal_eval(assigns[0].value)
    except ValueError as e:
        raise CandidateError(f"{path}: CANDIDATE must be a literal dict (read without importing the file): {e}") from e
    if not isinstance(raw, dict):
        raise CandidateError(f"{path}: CANDIDATE must be a dict; got {type(raw).__name__}")
    if set(raw) != set(METADATA_KEYS):
        missing, extra = sorted(set(METADATA_KEYS) - set(raw)), sorted(set(raw) - set(METADATA_KEYS))
        raise CandidateError(
            f"{path}: CANDIDATE keys must be exactly {list(METADATA_KEYS)}; missing {missing}, unexpected {extra}"
        )
    try:
        return CandidateMeta(**raw)
    except ValueError as e:
        raise CandidateError(f"{path}: CANDIDATE metadata invalid: {e}") from e


def _check_launcher(tree: ast.Module, path: Path, op_name: str) -> None:
    defs = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    if op_name not in defs:
        public = sorted(d for d in defs if not d.startswith("_"))
        raise CandidateError(
            f"{path}: no top-level launcher `def {op_name}(...)` (the reference op's name); "
            f"public functions found: {public}"
        )


def load(path: Path | str, task: str, op_name: str) -> Candidate:
    """Validate one candidate file for `task` (launcher `op_name`) without importing it."""
    path = Path(path).resolve()
    if not path.is_file():
        raise CandidateError(f"candidate file {str(path)!r} does not exist")
    if path.suffix != ".py":
        raise CandidateError(f"candidate {str(path)!r} must be a .py file")
    source = path.read_bytes()
    try:
        tree = parse_source(source, filename=str(path))
    except SyntaxError as e:
        raise CandidateError(f"{path}: not valid Python: {e.msg} (line {e.lineno})") from e
    _check_launcher(tree, path, op_name)
    return Candidate(
        task=task, name=path.stem, path=path, content_hash=content_hash(source), meta=_metadata(tree, path)
    )


def discover(task: str, op_name: str, root: Path = CANDIDATES_ROOT) -> list[Candidate]:
    """Every `<root>/<task>/*.py` except `_`-prefixed helpers (e.g. `__init__.py`), sorted by name."""
    folder = root / task
    if not folder.is_dir():
        return []
    return [load(p, task, op_name) for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]


def resolve(task: str, op_name: str, selectors: tuple[str, ...], root: Path = CANDIDATES_ROOT) -> list[Candidate]:
    """Candidates named by `selectors` (a file stem in `<root>/<task>/`, or a path); all of them when empty.

    Problems with every selector are collected and raised together, so a typo in one of five
    names does not hide a broken metadata dict in another.
    """
    if not selectors:
        return discover(task, op_name, root)
    folder = root / task
    known = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []
    found: list[Candidate] = []
    problems: list[str] = []
    for sel in selectors:
        as_path = Path(sel)
        path = as_path if as_path.suffix == ".py" else folder / f"{sel}.py"
        if not path.is_file():
            problems.append(f"candidate {sel!r} not found for task {task!r} (looked for {path}); known: {known}")
            continue
        try:
            found.append(load(path, task, op_name))
        except CandidateError as e:
            problems.append(str(e))
    if problems:
        raise CandidateError("\n".join(problems))
    seen: dict[str, Candidate] = {}
    for c in found:
        seen.setdefault(c.content_hash, c)  # the same bytes twice is one candidate
    return list(seen.values())
