"""agent=replay: the submissions of a saved transcript again, in order, with verdicts recomputed.

    harness run task=fuse_norm agent=replay agent.transcript=results/fuse_norm/agents/<session>.json

Deterministic: each submission's file is rebuilt from its source, model, round, parent and idea
(harness/agents/submissions.py), so it has the same bytes, name and content hash as the first time;
no model is asked anything. The runner evaluates them again (in parallel up to agent.workers) and
each new verdict is compared with the saved one, shape by shape; the comparisons go in the new
session's transcript and on the console. `agent.rounds` does not limit a replay.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.agents import submissions
from harness.agents.loop import AgentError, Session
from tasks.task import Task

REQUIRED_KEYS = ("round", "source", "idea", "model")


@dataclass(frozen=True)
class Prepared:
    model: str
    priced: bool
    path: Path
    original: dict[str, Any]


def preflight(task: Task, settings: Any) -> Prepared:
    agent = settings.agent
    if not agent.transcript:
        raise ValueError("agent=replay needs agent.transcript=<path>, e.g. results/<task>/agents/<session>.json")
    path = Path(agent.transcript)
    if not path.is_file():
        raise ValueError(f"agent.transcript {str(path)!r} does not exist")
    try:
        original = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"agent.transcript {str(path)!r} is not a JSON transcript: {e}") from e
    if not isinstance(original, dict) or original.get("task") != task.name:
        got = original.get("task") if isinstance(original, dict) else type(original).__name__
        raise ValueError(f"transcript {str(path)!r} is for task {got!r}, not {task.name!r}")
    subs = original.get("submissions")
    if not isinstance(subs, list) or not subs:
        raise ValueError(f"transcript {str(path)!r} holds no submissions to replay")
    broken = [i for i, s in enumerate(subs) if not isinstance(s, dict) or any(k not in s for k in REQUIRED_KEYS)]
    if broken:
        raise ValueError(f"transcript {str(path)!r}: submissions {broken} lack some of {list(REQUIRED_KEYS)}")
    return Prepared(f"replay of {original.get('session_id', path.stem)}", False, path, original)


def compare(saved: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """A saved submission against its replay: same file? same status on every shape both ran?"""
    old, new = submissions.statuses(saved.get("verdict", {})), submissions.statuses(replayed)
    common = [s for s in new if s in old]
    differences = {s: {"saved": old[s], "replayed": new[s]} for s in common if old[s] != new[s]}
    same_file = saved.get("content_hash") == replayed.get("content_hash")
    entry = {"round": saved["round"], "candidate": replayed.get("candidate"), "same_file": same_file,
             "compared_shapes": common, "differences": differences,
             "agree": same_file and bool(common) and not differences}  # fmt: skip
    if not common:
        entry["note"] = (f"no shape in common: saved {sorted(old)} on {saved.get('verdict', {}).get('device')}, "
                         f"replayed {sorted(new)} on {replayed.get('device')}")  # fmt: skip
    return entry


def run(session: Session, prepared: Prepared, **_: Any) -> str:
    saved = sorted(prepared.original["submissions"], key=lambda s: s["round"])
    original = prepared.original
    session.record["replay_of"] = {"transcript": str(prepared.path), "session_id": original.get("session_id"),
                                   "kind": original.get("kind"), "model": original.get("model")}  # fmt: skip
    session.budget.rounds = max(session.budget.rounds, len(saved))
    session.budget.rounds_used = len(saved)
    drafts = []
    for s in saved:
        try:  # the parent is not re-checked: it may have been deleted since
            drafts.append(submissions.draft(session.task, s["source"], s["idea"], s.get("parent"), s["model"]))
        except submissions.SubmissionRejected as e:
            raise AgentError(f"round {s['round']} of {prepared.path} cannot be rebuilt: {e}") from e
    with ThreadPoolExecutor(max_workers=len(saved)) as pool:  # the session's slots bound the evaluations
        verdicts = list(pool.map(lambda pair: session.submit(pair[1], pair[0]["round"],
                                                             {"replayed_from": prepared.original.get("session_id")}),
                                 zip(saved, drafts, strict=True)))  # fmt: skip
    comparisons = [compare(s, v) for s, v in zip(saved, verdicts, strict=True)]
    agree = sum(c["agree"] for c in comparisons)
    session.record["replay"] = {"comparisons": comparisons, "agree": agree, "of": len(comparisons)}
    for c in comparisons:
        what = "agrees" if c["agree"] else f"DIFFERS {c['differences'] or c.get('note') or 'file changed'}"
        session.echo(f"[agent] replay round {c['round']}: {c['candidate']}: {what}")
    return f"replayed {len(saved)} submission(s); verdicts agree on {agree} of {len(saved)}"
