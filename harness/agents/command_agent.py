"""agent=command: any coding-agent CLI proposes candidates, one run of it per round.

    harness run task=fuse_norm agent=command \
        agent.cmd='mycli --prompt {prompt_file} --workdir {workdir} --out {candidate_path}' \
        agent.pass_env=[ANTHROPIC_API_KEY] agent.rounds=3 agent.time_limit_s=1200

Each round writes the prompt file (the same prompt as the API agent's, harness/agents/prompt.py,
with a file protocol instead of tools and the verdicts of the earlier rounds), runs the command in
its own session with a minimal environment (PATH, HOME and TMPDIR in the scratch working directory,
LANG, TERM, plus exactly the variables of `agent.pass_env`: pass HOME too for a CLI that keeps its
configuration there), kills its process group at the time limit, and evaluates the file it left at
{candidate_path}, like any submission.

The repository is the agent's to read, not to change: its tracked and untracked (not ignored) files
are snapshotted before each round and compared after; whatever the command created, changed or
deleted there is put back and reported in the transcript. Files outside the repository (other than
its working directory) and ignored files are outside the snapshot; the command is not sandboxed,
because a coding CLI needs its network and its own configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import sandbox
from harness.agents import prompt as prompt_module
from harness.agents import submissions
from harness.agents.loop import Session
from harness.agents.tools import HIDDEN_PARTS, ToolError
from harness.environment import REPO_ROOT
from tasks.task import Task

OUTPUT_TAIL_CHARS = 3000
HISTORY_VERDICT_CHARS = 6000
MAX_RESTORABLE_BYTES = 16 << 20
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Prepared:
    model: str
    priced: bool
    argv: tuple[str, ...]  # the template, split like a shell would; placeholders filled per round
    passed_env: dict[str, str]  # the values of agent.pass_env (never written anywhere)


def preflight(task: Task, settings: Any) -> Prepared:
    agent = settings.agent
    if not agent.cmd.strip():
        raise ValueError(
            "agent=command needs agent.cmd='<command template>', e.g. "
            "agent.cmd='mycli --prompt {prompt_file} --workdir {workdir} --out {candidate_path}'"
        )
    try:
        argv = tuple(shlex.split(agent.cmd))
    except ValueError as e:
        raise ValueError(f"agent.cmd {agent.cmd!r} does not split into words: {e}") from e
    if "{" not in argv[0] and shutil.which(argv[0]) is None:
        raise ValueError(f"agent.cmd runs {argv[0]!r}, which is not an executable on PATH")
    missing = [name for name in agent.pass_env if name not in os.environ]
    if missing:
        raise ValueError(f"agent.pass_env names {missing}, which are not set in this environment")
    model = agent.model or f"command:{Path(argv[0]).name}"
    return Prepared(model, False, argv, {name: os.environ[name] for name in agent.pass_env})


def command_env(workdir: Path, passed: dict[str, str]) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": str(workdir),
           "TMPDIR": str(workdir / "tmp"), "LANG": os.environ.get("LANG", "C.UTF-8"), "TERM": "dumb"}  # fmt: skip
    env.update(passed)
    return env


# ---- the repository snapshot -----------------------------------------------------------------------
def repository_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files (git); without git, every file outside HIDDEN_PARTS."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=60).stdout  # fmt: skip
        return sorted({p for p in out.decode(errors="surrogateescape").split("\0") if p})
    except (OSError, subprocess.SubprocessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in HIDDEN_PARTS]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
        return sorted(files)


def snapshot(root: Path) -> dict[str, bytes | str]:
    """path -> its bytes (or, beyond MAX_RESTORABLE_BYTES, its sha256 only); absent files are left out."""
    snap: dict[str, bytes | str] = {}
    for rel in repository_files(root):
        path = root / rel
        if not path.is_file() or path.is_symlink():
            continue
        if path.stat().st_size > MAX_RESTORABLE_BYTES:
            snap[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            snap[rel] = path.read_bytes()
    return snap


def _same(a: bytes | str, b: bytes | str) -> bool:
    digest = lambda v: v if isinstance(v, str) else hashlib.sha256(v).hexdigest()
    return digest(a) == digest(b)


def undo_changes(root: Path, before: dict[str, bytes | str], after: dict[str, bytes | str]) -> list[dict[str, Any]]:
    """Put back what changed between the snapshots; one entry per file: what changed, whether undone."""
    changes = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old is not None and new is not None and _same(old, new):
            continue
        change = "created" if old is None else "deleted" if new is None else "modified"
        path, restored, note = root / rel, True, ""
        if old is None:
            path.unlink(missing_ok=True)
        elif isinstance(old, bytes):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(old)
        else:
            restored, note = False, f"larger than {MAX_RESTORABLE_BYTES >> 20} MiB: not kept, not restored"
        changes.append({"path": rel, "change": change, "restored": restored, **({"note": note} if note else {})})
    return changes


# ---- one run of the command ------------------------------------------------------------------------
def run_command(argv: list[str], workdir: Path, env: dict[str, str], limit_s: float, logs: Path) -> dict[str, Any]:
    started = time.monotonic()
    out_path, err_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    returncode, timed_out, error = None, False, None
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = sandbox.start_session(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as e:
            error = f"could not start {argv[0]!r}: {e}"
        else:
            try:
                returncode = proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                sandbox.signal_session(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=KILL_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            finally:
                sandbox.end_session(proc)  # whatever it left running in its session
    tail = lambda p: p.read_text(errors="replace")[-OUTPUT_TAIL_CHARS:]
    return {"argv": argv, "returncode": returncode, "timed_out": timed_out, "error": error,
            "wall_s": round(time.monotonic() - started, 3), "stdout_tail": tail(out_path),
            "stderr_tail": tail(err_path)}  # fmt: skip


def _history_entry(round_: int, verdict: dict[str, Any]) -> str:
    text = json.dumps(verdict, indent=1)
    if len(text) > HISTORY_VERDICT_CHARS:
        text = text[:HISTORY_VERDICT_CHARS] + "\n... (cut)"
    return f"### Round {round_}: {verdict.get('summary', '')}\n\n```json\n{text}\n```"


def _submission(session: Session, source: str, round_: int, program: str) -> dict[str, Any]:
    """Submit what the command left; its own CANDIDATE dict may state the idea and the parent."""
    own = submissions.own_metadata(source)
    idea = own.get("idea") if isinstance(own.get("idea"), str) and own["idea"].strip() else None
    idea = idea or f"written by {program} in round {round_} (its file states no idea)"
    parent, note = own.get("parent") if isinstance(own.get("parent"), str) else None, None
    if parent is not None and not session.is_candidate(parent):
        parent, note = None, f"its CANDIDATE names parent {own['parent']!r}, not a candidate of this task: dropped"
    try:
        draft = session.draft(source, idea, parent, session.model)
    except ToolError as e:
        return {"round": round_, "passed": False, "status": "rejected", "summary": str(e)}
    verdict = session.submit(draft, round_)
    return {**verdict, "note": note} if note else verdict


def run(session: Session, prepared: Prepared, repo_root: Path = REPO_ROOT, **_: Any) -> str:
    agent, task = session.agent, session.task
    workdir = Path(tempfile.mkdtemp(prefix=f"beam-agent-{task.name}-"))
    logs = Path(tempfile.mkdtemp(prefix=f"beam-agent-logs-{task.name}-"))
    (workdir / "tmp").mkdir()
    program = Path(prepared.argv[0]).name
    log: dict[str, Any] = {"template": agent.cmd, "pass_env": list(agent.pass_env), "workdir": str(workdir),
                           "repo": str(repo_root), "rounds": []}  # fmt: skip
    session.record["command"] = log
    history: list[str] = []
    try:
        while session.budget.rounds_left:
            round_ = session.reserve_round()
            candidate_path = workdir / "candidate.py"
            candidate_path.unlink(missing_ok=True)
            delivery = prompt_module.command_delivery(task.name, agent, str(candidate_path), str(workdir), round_,
                                                      "\n\n".join(history))  # fmt: skip
            prompt = prompt_module.build(task, session.settings, agent, "command", delivery)
            prompt_file = workdir / f"prompt_r{round_:02d}.md"
            prompt_file.write_text(prompt.render())
            if session.record["prompt"] is None:
                session.record["prompt"] = prompt.to_dict()
            values = {"prompt_file": prompt_file, "workdir": workdir, "candidate_path": candidate_path,
                      "task": task.name, "round": round_, "repo": repo_root}  # fmt: skip
            argv = [word.format(**values) for word in prepared.argv]
            session.echo(f"[agent] round {round_}: running {shlex.join(argv)} (limit {agent.time_limit_s:g} s)")
            before = snapshot(repo_root)
            ran = run_command(argv, workdir, command_env(workdir, prepared.passed_env), agent.time_limit_s,
                              logs / f"round_{round_:02d}")  # fmt: skip
            ignored = undo_changes(repo_root, before, snapshot(repo_root))
            for change in ignored:
                undone = "put back" if change["restored"] else change.get("note")
                session.echo(f"[agent] round {round_}: ignored a write outside the candidate path: "
                             f"{change['change']} {change['path']} ({undone})")  # fmt: skip
            if candidate_path.is_file():
                verdict = _submission(session, candidate_path.read_text(errors="replace"), round_, program)
            else:
                how = "timed out" if ran["timed_out"] else ran["error"] or f"exit {ran['returncode']}"
                verdict = {"round": round_, "passed": False, "status": "no_candidate",
                           "summary": f"no file at {candidate_path} after the command ({how})"}  # fmt: skip
                session.echo(f"[agent] round {round_}: {verdict['summary']}")
            log["rounds"].append({"round": round_, **ran, "ignored_writes": ignored,
                                  "candidate": verdict.get("candidate"), "summary": verdict["summary"]})  # fmt: skip
            session.save()
            history.append(_history_entry(round_, verdict))
    finally:
        shutil.rmtree(logs, ignore_errors=True)
        if not session.settings.keep_scratch:
            shutil.rmtree(workdir, ignore_errors=True)
    return f"all {session.budget.rounds} rounds run"
