"""The tools an API agent can call, and the read-only view of the project they give.

TOOLS are the definitions sent with every request (JSON schemas; harness/agents/prompt.py shows them
with `harness agent prompt`). `ToolBox` executes calls: submissions, parity checks and benchmarks go
to the session (harness/agents/loop.py), which writes and evaluates candidates; reads are served
here, confined to the repository, never from .git, virtual environments, caches or anything that
looks like a secret. Nothing a tool does can change the harness, the reference or the tests.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.environment import REPO_ROOT
from harness.sandbox import SECRET_PATH

if TYPE_CHECKING:
    from harness.agents.loop import Session

_SHAPES = {"type": "array", "items": {"type": "string"},
           "description": "Shape labels from the task statement; omit for every shape of this session."}  # fmt: skip
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "submit_candidate",
        "description": (
            "Submit a complete candidate file for this task: one round of your budget. The harness adds the "
            "CANDIDATE metadata (author, model, parent, idea) itself, writes the file to the task's candidate "
            "folder under a unique name, and evaluates it exactly as every other candidate: sandboxed parity on "
            "every shape and seed, then (on a GPU) timing interleaved with every baseline. Returns the verdict: "
            "status per shape, parity figures, timings and speedups, floor fraction, and the error text of a "
            "failed compile or run."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "source": {
                    "type": "string",
                    "description": "The whole Python file: imports (torch, triton, "
                    "triton.language and the standard library only), private @triton.jit kernels, and "
                    "the public launcher named and typed like the reference op.",
                },
                "idea": {
                    "type": "string",
                    "description": "One line (at most 200 characters): what this "
                    "candidate does differently and why it should be faster.",
                },
                "parent": {
                    "type": "string",
                    "description": "The candidate this one derives from: a file name "
                    "from the task statement or an earlier verdict (e.g. 'row_per_program' or "
                    "'agent_r02_1a2b3c4d5e6f'). Omit for a fresh design.",
                },
            },
            "required": ["source", "idea"],
        },
    },
    {
        "name": "check_parity",
        "description": (
            "Check a file's parity without submitting it (no round spent, nothing recorded, no timing): the "
            "same sandboxed parity evaluation as a submission, on the shapes you name. Use it to catch compile "
            "errors and numerical mismatches cheaply before you submit."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "The whole Python file, as for submit_candidate."},
                "shapes": _SHAPES,
            },
            "required": ["source"],
        },
    },
    {
        "name": "benchmark",
        "description": (
            "Time an existing candidate again (a submission of this session or a file of the candidate folder) "
            "against every baseline, on the shapes you name; parity is re-checked first. Only on a GPU: without "
            "one the answer says so and nothing runs. The result is recorded like any evaluation."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "candidate": {
                    "type": "string",
                    "description": "The candidate's file name (stem), "
                    "e.g. 'agent_r02_1a2b3c4d5e6f' or 'row_per_program'.",
                },
                "shapes": _SHAPES,
            },
            "required": ["candidate"],
        },
    },
    {
        "name": "inspect_kernels",
        "description": (
            "Compile a file's Triton kernels for the H200 (sm_90a) without running them: no GPU needed, no round "
            "spent, nothing recorded. For every config its autotuner could choose, on the GPU shapes you name: "
            "registers per thread, spilled bytes, shared memory, barriers, global loads and stores by bytes per "
            "instruction (16B = 128-bit vectors; 2B = one BF16 at a time), and the programs an SM can hold with "
            "the limit that binds. Use it to catch spills, unvectorized loads and low occupancy before a submission."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "The whole Python file, as for submit_candidate."},
                "shapes": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "GPU shape labels of the task (e.g. 'T=1', 'T=16384'); omit for the "
                    "first GPU shape.",
                },
            },
            "required": ["source"],
        },
    },
    {
        "name": "read_file",
        "description": (
            "Read a text file of the project (read-only), by path relative to the repository root, e.g. "
            "'reference_model/ops.py', 'tasks/fuse_norm.py', 'candidate_kernels/fuse_norm/row_per_program.py', "
            "'harness/parity.py'. Lines are numbered; long files come in pieces (offset, limit)."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "offset": {"type": "integer", "description": "First line to return (1-based); default 1."},
                "limit": {"type": "integer", "description": "Lines to return at most; default: as many as fit."},
            },
            "required": ["path"],
        },
    },
    {
        "name": "list_files",
        "description": "List a directory of the project (relative to the repository root; '.' for the root).",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
)
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
# Never readable: version control, environments, caches, wheels (and anything SECRET_PATH matches).
HIDDEN_PARTS = frozenset({".git", ".venv", "venv", ".whl", "__pycache__", ".pytest_cache", ".ruff_cache",
                          ".mypy_cache", "node_modules", ".cache"})  # fmt: skip


class ToolError(ValueError):
    """A tool call the harness refuses (bad path, unknown shape, budget spent): returned as is_error."""


def readable_path(root: Path, relative: str) -> Path:
    """`relative` resolved inside `root` (symlinks followed), or ToolError saying why not."""
    if not isinstance(relative, str) or not relative.strip():
        raise ToolError(f"path must be a non-empty string relative to the repository root; got {relative!r}")
    root = root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ToolError(f"{relative!r} is outside the repository; only files under it can be read")
    hidden = [part for part in path.relative_to(root).parts if part in HIDDEN_PARTS or part.startswith(".env")]
    if hidden:
        raise ToolError(f"{relative!r} is not readable: {hidden[0]!r} is never shown (version control, "
                        "environments, caches)")  # fmt: skip
    if SECRET_PATH.search(str(path)):
        raise ToolError(f"{relative!r} looks like a secret (keys, tokens, credentials): not readable")
    if not path.exists():
        raise ToolError(f"{relative!r} does not exist")
    return path


def read_file(root: Path, relative: str, offset: int = 1, limit: int | None = None, max_chars: int = 30000) -> str:
    path = readable_path(root, relative)
    if path.is_dir():
        raise ToolError(f"{relative!r} is a directory; use list_files")
    if not isinstance(offset, int) or offset < 1 or (limit is not None and (not isinstance(limit, int) or limit < 1)):
        raise ToolError(f"offset must be an int >= 1 and limit an int >= 1; got offset={offset!r}, limit={limit!r}")
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise ToolError(f"{relative!r} is a binary file ({len(data):,} bytes)")
    lines = data.decode("utf-8", errors="replace").splitlines()
    if offset > max(len(lines), 1):
        raise ToolError(f"{relative!r} has {len(lines)} lines; offset {offset} is past the end")
    end = len(lines) if limit is None else min(len(lines), offset - 1 + limit)
    out, size = [], 0
    for number in range(offset, end + 1):
        line = f"{number:5d}  {lines[number - 1]}" if lines else ""
        if size + len(line) + 1 > max_chars and out:
            end = number - 1
            break
        out.append(line)
        size += len(line) + 1
    header = f"{relative} (lines {offset}-{end} of {len(lines)})"
    if end < len(lines):
        header += f"; continue with offset={end + 1}"
    return header + "\n" + "\n".join(out)


def list_files(root: Path, relative: str) -> str:
    path = readable_path(root, relative)
    if not path.is_dir():
        raise ToolError(f"{relative!r} is a file; use read_file")
    rows = []
    for entry in sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name)):
        if entry.name in HIDDEN_PARTS or entry.name.startswith(".env") or SECRET_PATH.search(str(entry)):
            continue
        rows.append(f"{entry.name}/" if entry.is_dir() else f"{entry.name}  ({entry.stat().st_size:,} bytes)")
    return f"{relative}: {len(rows)} entries\n" + "\n".join(rows)


class ToolBox:
    """Executes one response's tool calls; evaluations run in parallel up to the session's workers."""

    def __init__(self, session: Session, root: Path = REPO_ROOT):
        self.session, self.root = session, root

    def run_all(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """tool_use blocks -> tool_result blocks, in the same order. Rounds are numbered in call order
        before anything runs, so parallel evaluation never changes which submission is which round."""
        plans = [self._plan(call) for call in calls]
        with ThreadPoolExecutor(max_workers=max(1, len(plans))) as pool:
            results = list(pool.map(lambda plan: plan(), plans))
        return [{"type": "tool_result", "tool_use_id": call["id"], "content": text, "is_error": is_error}
                for call, (text, is_error) in zip(calls, results, strict=True)]  # fmt: skip

    def _plan(self, call: dict[str, Any]):
        name, args = call.get("name"), call.get("input") or {}

        def refused(message: str):
            return lambda: (message, True)

        if not isinstance(args, dict):
            return refused(f"tool input must be a JSON object; got {type(args).__name__}")
        try:
            if name == "submit_candidate":
                draft = self.session.draft(args.get("source"), args.get("idea"), args.get("parent"))
                ticket = self.session.reserve_round()  # after the checks: a refused call spends no round
                return lambda: _as_result(lambda: self.session.submit(draft, ticket))
            if name == "check_parity":
                return lambda: _as_result(lambda: self.session.check_parity(args.get("source"), args.get("shapes")))
            if name == "inspect_kernels":
                return lambda: _as_result(lambda: self.session.inspect(args.get("source"), args.get("shapes")))
            if name == "benchmark":
                return lambda: _as_result(lambda: self.session.benchmark(args.get("candidate"), args.get("shapes")))
            if name == "read_file":
                limit = self.session.settings.agent.read_max_chars
                return lambda: _as_result(lambda: read_file(self.root, args.get("path"), args.get("offset", 1),
                                                            args.get("limit"), limit))  # fmt: skip
            if name == "list_files":
                return lambda: _as_result(lambda: list_files(self.root, args.get("path", ".")))
        except ToolError as e:
            return refused(str(e))
        return refused(f"tool {name!r} unknown; known: {list(TOOL_NAMES)}")


def _as_result(fn) -> tuple[str, bool]:
    """(text, is_error): a verdict dict as JSON, a string as is; ToolError becomes an error result."""
    try:
        out = fn()
    except ToolError as e:
        return str(e), True
    if isinstance(out, str):
        return out, False
    return json.dumps(out), False  # a verdict, even a failing one, is the tool working; compact: fewer tokens
