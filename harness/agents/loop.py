"""An agent session inside `harness run`: preflight, rounds, evaluation pool, transcript, outcome.

    outcome = loop.run_agent(task, settings)     # settings: harness.run_cmd.RunSettings
    found = loop.with_submissions(found, outcome)

`Session` is what every agent kind shares: it numbers rounds, turns a submitted source into a
candidate file (harness/agents/submissions.py), evaluates it with the same runner as every other
candidate (parity in sandboxed children, timing on a GPU; records in results/<task>/), and returns
the verdict. Evaluations run in parallel up to `agent.workers` (automatic: one on a GPU, where
timing is serialized; half the cores on CPU, where the interpreter is the bottleneck).

The transcript, results/<task>/agents/<session>.json, is rewritten atomically after every round
and at the end: the prompt, every message, every API call with its usage, cost and retries, every
submission with its source and verdict, the budget, and why the session stopped. Preflight checks
(API key, model price, command, transcript) run before anything is written: a session that cannot
start leaves no file behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import candidates as candidate_files
from harness import inspect_kernels, runner
from harness.agents import submissions
from harness.agents.budget import Budget, price_of
from harness.agents.settings import AgentSettings
from harness.agents.tools import ToolError
from harness.candidates import Candidate
from harness.records import now_utc, task_results_dir
from tasks.task import Task

TRANSCRIPT_FORMAT = 1
AGENTS_DIR = "agents"  # results/<task>/agents/<session>.json


class AgentError(RuntimeError):
    """The session could not go on (the API refused or kept failing): the transcript says how far it got."""


@dataclass(frozen=True)
class AgentOutcome:
    session_id: str
    kind: str
    candidates: tuple[Candidate, ...]  # every file written and evaluated, in round order
    passed: tuple[Candidate, ...]  # those that passed parity on every shape evaluated
    transcript_path: Path
    stopped: str
    error: str | None
    budget: dict[str, Any]

    def summary(self) -> str:
        spent = self.budget.get("usage", {}).get("total")
        money = f", {spent:,} tokens, ${self.budget['spent_usd']:.4f}" if self.budget.get("price_usd_per_mtok") else ""
        lines = [f"Agent ({self.kind}) session {self.session_id}: {len(self.candidates)} submission(s), "
                 f"{len(self.passed)} passed every shape{money}; stopped: {self.stopped}",
                 f"  transcript: {self.transcript_path}"]  # fmt: skip
        lines += [f"  {'passed' if c in self.passed else 'failed'}: {c.display_path}" for c in self.candidates]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def default_workers(device: str, gpus: tuple[str, ...] = ()) -> int:
    if gpus:
        return len(gpus)
    return 1 if device == "cuda" else max(1, (os.cpu_count() or 2) // 2)


class Session:
    """One agent session: its settings, budget, evaluation slots, submissions and transcript."""

    def __init__(self, task: Task, settings: runner.EvaluationSettings, agent: AgentSettings, model: str,
                 budget: Budget, echo: Callable[[str], None] = print):  # fmt: skip
        self.task, self.settings, self.agent, self.model, self.budget, self.echo = (
            task, settings, agent, model, budget, echo)  # fmt: skip
        self.device = runner.resolve_device(settings.device)
        self.shapes = tuple(s.label for s in runner.select_shapes(task, self.device, settings.shapes))
        self.folder = Path(agent.candidates_dir) if agent.candidates_dir else candidate_files.task_dir(task.name)
        # Where existing candidates are found (parents, benchmark): this folder and the task's own.
        self.folders = tuple(dict.fromkeys((self.folder, candidate_files.task_dir(task.name))))
        self.slots = threading.BoundedSemaphore(agent.workers or default_workers(self.device, agent.gpus))
        # agent.gpus: each evaluation holds one of them, alone, from start to end.
        self.free_gpus: queue.Queue[str] = queue.Queue()
        for gpu in agent.gpus:
            self.free_gpus.put(gpu)
        self.lock = threading.RLock()  # save() takes it too, from inside submit()
        self.session_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.path = task_results_dir(settings.results_path, task.name) / AGENTS_DIR / f"{self.session_id}.json"
        self.written: dict[str, Candidate] = {}  # name -> candidate, this session's submissions
        self.passed: set[str] = set()
        self.record: dict[str, Any] = {
            "format": TRANSCRIPT_FORMAT, "session_id": self.session_id, "task": task.name, "kind": agent.kind,
            "model": model, "created_utc": now_utc(), "finished_utc": None,
            "agent_settings": dataclasses.asdict(agent),
            "evaluation": {"device": self.device, "shapes": list(self.shapes), "seeds": list(settings.seeds)},
            "prompt": None, "messages": [], "api_calls": [], "submissions": [], "checks": [], "benchmarks": [],
            "budget": budget.to_dict(), "stopped": None, "error": None,
        }  # fmt: skip

    # -- evaluation ---------------------------------------------------------------------------------
    def _evaluate(self, candidate: Candidate, **overrides: Any) -> runner.RunResult:
        settings = dataclasses.replace(self.settings, promote=False, progress=False, **overrides)
        with self.slots:
            if not self.agent.gpus:
                return runner.evaluate(self.task, [candidate], settings, echo=lambda line: self.echo(f"[agent] {line}"))
            gpu = self.free_gpus.get()  # blocks while every GPU is taken (workers > len(gpus))
            try:
                settings = dataclasses.replace(settings, cuda_devices=gpu)
                return runner.evaluate(self.task, [candidate], settings,
                                       echo=lambda line: self.echo(f"[agent] [gpu {gpu}] {line}"))  # fmt: skip
            finally:
                self.free_gpus.put(gpu)

    def _verdict(self, candidate: Candidate, result: runner.RunResult) -> dict[str, Any]:
        """submissions.verdict, plus the GPU the evaluation held when agent.gpus spread them."""
        verdict = submissions.verdict(candidate, result)
        gpu = result.run.settings.get("cuda_devices")
        if gpu is not None:
            verdict["gpu"] = gpu
        return verdict

    def _check_shapes(self, shapes: Any) -> tuple[str, ...]:
        if shapes is None or shapes == []:
            return self.shapes
        known = [s.label for s in self.task.shapes_for(self.device)]
        if not isinstance(shapes, list) or not all(isinstance(s, str) for s in shapes):
            raise ToolError(f"shapes must be a list of shape labels; got {shapes!r}; known here: {known}")
        unknown = [s for s in shapes if s not in known]
        if unknown:
            raise ToolError(f"task {self.task.name!r} has no shapes {unknown} on {self.device}; known: {known}")
        return tuple(shapes)

    def draft(self, source: Any, idea: Any, parent: Any, model: str | None = None) -> submissions.Draft:
        """A checked submission (ToolError: refused, no round spent)."""
        if parent is not None and isinstance(parent, str) and not self.is_candidate(parent):
            raise ToolError(f"parent {parent!r} is not a candidate of this task: name a file stem of "
                            f"{self.folder} or a submission of this session; known: {self.known_names()}")  # fmt: skip
        try:
            return submissions.draft(self.task, source, idea, parent, model or self.model)
        except submissions.SubmissionRejected as e:
            raise ToolError(f"submission refused (no round spent): {e}") from e

    def known_names(self) -> list[str]:
        return sorted(set(self._files()) | set(self.written))

    def _files(self) -> dict[str, Path]:
        """name -> file of every candidate in self.folders (the session's folder wins a name clash)."""
        found: dict[str, Path] = {}
        for folder in self.folders:
            for p in sorted(folder.glob("*.py")) if folder.is_dir() else []:
                if not p.name.startswith("_"):
                    found.setdefault(p.stem, p)
        return found

    def is_candidate(self, ref: str) -> bool:
        """Whether `ref` names a candidate of this task: a file stem, or a content hash (12+ hex digits)."""
        if ref in self.known_names():
            return True
        hashes = {c.content_hash for c in self.written.values()}
        hashes |= {candidate_files.content_hash(p.read_bytes()) for p in self._files().values()}
        return len(ref) >= 12 and any(h.startswith(ref.lower()) for h in hashes)

    def reserve_round(self) -> int:
        with self.lock:
            if self.budget.rounds_used >= self.budget.rounds:
                raise ToolError(f"round budget spent ({self.budget.rounds} rounds): no more submissions")
            self.budget.rounds_used += 1
            return self.budget.rounds_used

    def submit(self, draft: submissions.Draft, round_: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        text = submissions.with_metadata(draft.source, draft.meta, round_)
        path = submissions.write(self.folder, text, round_)
        candidate = candidate_files.load(path, self.task.name, self.task.op_name)
        self.echo(f"[agent] round {round_}: {candidate.display_path}: evaluating on {self.device}, shapes "
                  f"{list(self.shapes)}")  # fmt: skip
        result = self._evaluate(candidate)
        verdict = {"round": round_, **self._verdict(candidate, result),
                   "rounds_left": self.budget.rounds_left}  # fmt: skip
        self.echo(f"[agent] round {round_}: {candidate.name}: {verdict['summary']}")
        with self.lock:
            self.written[candidate.name] = candidate
            if verdict["passed"]:
                self.passed.add(candidate.name)
            self.record["submissions"].append({
                "round": round_, "name": candidate.name, "file": candidate.display_path,
                "content_hash": candidate.content_hash, "model": draft.meta.model, "parent": draft.meta.parent,
                "idea": draft.meta.idea, "source": draft.source, "verdict": verdict, **(extra or {}),
            })  # fmt: skip
            self.record["submissions"].sort(key=lambda s: s["round"])
            self.save()
        return verdict

    @contextlib.contextmanager
    def _scratch_candidate(self, d: submissions.Draft) -> Iterator[tuple[Candidate, Path]]:
        """The draft as a candidate file in a temporary folder (not the candidate folder: no round)."""
        with tempfile.TemporaryDirectory(prefix="beam-agent-check-") as tmp:
            path = Path(tmp) / "check.py"
            path.write_text(submissions.with_metadata(d.source, d.meta, None))
            yield candidate_files.load(path, self.task.name, self.task.op_name), Path(tmp)

    def check_parity(self, source: Any, shapes: Any) -> dict[str, Any]:
        labels = self._check_shapes(shapes)
        d = self.draft(source, "parity check, not a submission", None)
        with self._scratch_candidate(d) as (candidate, tmp):
            result = self._evaluate(candidate, shapes=labels, benchmark=False, baselines=False,
                                    results_dir=str(tmp / "results"))  # fmt: skip
            verdict = self._verdict(candidate, result)
        verdict.update(candidate=None, file=None, note="parity check only: nothing recorded, no round spent")
        with self.lock:
            self.record["checks"].append({"shapes": list(labels), "source": d.source, "verdict": verdict})
        return verdict

    def inspect(self, source: Any, shapes: Any) -> str:
        """The compiler's figures of a file's kernels for the H200 (harness/inspect_kernels.py), as a table."""
        if shapes is not None and (not isinstance(shapes, list) or not all(isinstance(x, str) for x in shapes)):
            raise ToolError(f"shapes must be a list of GPU shape labels; got {shapes!r}")
        try:
            labels = inspect_kernels.gpu_shapes(self.task, tuple(shapes or ()))
        except ValueError as e:
            raise ToolError(str(e)) from e
        d = self.draft(source, "inspection, not a submission", None)
        with self._scratch_candidate(d) as (candidate, _):
            records = inspect_kernels.inspect_candidate(self.task, candidate, labels)
        with self.lock:
            self.record["checks"].append({"shapes": list(labels), "source": d.source, "inspection": [
                {k: getattr(r, k) for k in ("shape_label", "status", "kernel", "config", "figures", "detail")}
                for r in records]})  # fmt: skip
        return inspect_kernels.table(records)

    def benchmark(self, name: Any, shapes: Any) -> dict[str, Any]:
        labels = self._check_shapes(shapes)
        if self.device != "cuda":
            raise ToolError("no GPU here: candidates run through the Triton interpreter, where timings mean "
                            "nothing; nothing ran (the verdicts of this session are parity verdicts)")  # fmt: skip
        candidate = self.written.get(name) if isinstance(name, str) else None
        if candidate is None and isinstance(name, str) and name in self.known_names():
            candidate = candidate_files.load(self._files()[name], self.task.name, self.task.op_name)
        if candidate is None:
            raise ToolError(f"candidate {name!r} unknown; known: {self.known_names()}")
        result = self._evaluate(candidate, shapes=labels)
        verdict = self._verdict(candidate, result)
        with self.lock:
            self.record["benchmarks"].append({"candidate": candidate.name, "shapes": list(labels), "verdict": verdict})
            self.save()
        return verdict

    # -- the transcript -----------------------------------------------------------------------------
    def save(self) -> None:
        """Rewrite the transcript atomically: a reader sees the previous version or this one."""
        with self.lock:
            self.record["budget"] = self.budget.to_dict()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp-{uuid.uuid4().hex[:8]}")
            tmp.write_text(json.dumps(self.record, indent=1, default=str) + "\n")
            os.replace(tmp, self.path)

    def finish(self, stopped: str, error: str | None = None) -> AgentOutcome:
        with self.lock:
            self.record.update(stopped=stopped, error=error, finished_utc=now_utc())
            self.save()
        written = tuple(self.written[s["name"]] for s in self.record["submissions"])
        return AgentOutcome(
            session_id=self.session_id, kind=self.agent.kind, candidates=written,
            passed=tuple(c for c in written if c.name in self.passed), transcript_path=self.path, stopped=stopped,
            error=error, budget=self.budget.to_dict(),
        )  # fmt: skip


# ---- entry points ----------------------------------------------------------------------------------
def _budget(agent: AgentSettings, priced: bool) -> Budget:
    return Budget(rounds=agent.rounds, turns=agent.max_turns, tokens=agent.budget_tokens, usd=agent.budget_usd,
                  price=price_of(agent.model) if priced else None)  # fmt: skip


def run_agent(task: Task, settings: Any, echo: Callable[[str], None] = print, **hooks: Any) -> AgentOutcome:
    """Run the session `settings.agent` asks for. ValueError (bad settings, no API key, missing
    transcript) before anything is written; otherwise an outcome, whose `error` says if it ended early.
    `hooks` reach the agent (tests: `sleep`, `rng`, `repo_root`)."""
    agent: AgentSettings = settings.agent
    if agent.kind == "anthropic":
        from harness.agents import anthropic_agent as kind_module
    elif agent.kind == "command":
        from harness.agents import command_agent as kind_module
    elif agent.kind == "replay":
        from harness.agents import replay_agent as kind_module
    else:
        raise ValueError(f"agent kind {agent.kind!r} runs no session; known: anthropic, command, replay")
    prepared = kind_module.preflight(task, settings)  # raises ValueError; writes nothing
    session = Session(task, settings, agent, prepared.model, _budget(agent, prepared.priced), echo)
    echo(f"[agent] {agent.kind} session {session.session_id} for {task.name} ({prepared.model}); transcript "
         f"{session.path}")  # fmt: skip
    try:
        stopped = kind_module.run(session, prepared, **hooks)
    except AgentError as e:
        return session.finish("error", str(e))
    except BaseException as e:  # a harness bug or Ctrl-C: keep what was done, then let it propagate
        session.finish("interrupted", f"{type(e).__name__}: {e}")
        raise
    return session.finish(stopped)


def with_submissions(found: list[Candidate], outcome: AgentOutcome) -> list[Candidate]:
    """The candidates of the usual evaluation plus the session's passing submissions (by content hash)."""
    seen = {c.content_hash for c in found}
    return found + [c for c in outcome.passed if c.content_hash not in seen]
