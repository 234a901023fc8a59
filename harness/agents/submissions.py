"""Submissions: an agent's source becomes a candidate file, and an evaluation becomes its verdict.

File: the agent's source with the harness's CANDIDATE dict (author "agent", the model, the parent,
the idea; any CANDIDATE of its own replaced) and a header comment naming the round, written as
`<folder>/agent_r<round>_<sha256[:12]>.py`. The name comes from the content hash and the round, and
the file is created atomically (written under a `_`-prefixed temporary name, which discovery skips,
then hard-linked to its final name, which fails if the name exists): two submissions never overwrite
each other, and a half-written file is never seen. The text is a pure function of (source, model,
round, parent, idea), so replaying a transcript recreates the very same files.

Verdict: what the agent reads back, from the runner's records: status per shape, parity figures,
timings against every baseline, floor fraction, and the error text of a failed compile or run,
truncated (its head and, mostly, its tail, where Triton and Python put the cause).
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import candidates as candidate_files
from harness import promote
from harness.candidates import Candidate, CandidateError, CandidateMeta
from harness.records import EvaluationRecord, Status
from harness.runner import RunResult
from tasks.task import Task

PREFIX = "agent"
DETAIL_CHARS = 600
LOG_HEAD_CHARS, LOG_TAIL_CHARS = 400, 2600
LOGGED_STATUSES = (Status.IMPORT_ERROR, Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.CUDA_FAULT, Status.CRASH,
                   Status.TIMEOUT, Status.SANDBOX_VIOLATION)  # fmt: skip
PARITY_FIGURES = ("max_ulp", "n_mismatched", "n_over_tolerance", "n_elements", "nonfinite", "max_abs_err",
                  "fp64_err", "ref_fp64_err", "fp64_ratio", "first_mismatch_indices")  # fmt: skip


class SubmissionRejected(ValueError):
    """The source cannot become a candidate file (not Python, no launcher, bad idea or parent)."""


@dataclass(frozen=True)
class Draft:
    """A submission before it has a round: what the agent sent, checked."""

    source: str
    meta: CandidateMeta


def _is_candidate_assignment(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "CANDIDATE" for t in node.targets)
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "CANDIDATE"


def _parse(source: str) -> ast.Module:
    try:
        return candidate_files.parse_source(source)
    except SyntaxError as e:
        raise SubmissionRejected(f"not valid Python: {e.msg} (line {e.lineno}): {(e.text or '').strip()[:200]}") from e


def own_metadata(source: str) -> dict[str, Any]:
    """The file's own CANDIDATE dict if it has a literal one (the command agent states idea/parent there)."""
    try:
        tree = candidate_files.parse_source(source)
    except SyntaxError:
        return {}
    for node in tree.body:
        if _is_candidate_assignment(node) and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def with_metadata(source: str, meta: CandidateMeta, round_: int | None) -> str:
    """`source` with its CANDIDATE assignments removed and the harness's inserted after the module
    docstring and `from __future__` imports (which must stay first)."""
    tree = _parse(source)
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if _is_candidate_assignment(node):
            del lines[node.lineno - 1 : node.end_lineno]
    body = "".join(lines)
    tree = _parse(body)
    after = 0
    for node in tree.body:
        is_doc = node is tree.body[0] and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
            and isinstance(node.value.value, str)  # fmt: skip
        if is_doc or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            after = node.end_lineno
        else:
            break
    lines = body.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    where = f"round {round_}" if round_ is not None else "a parity check"
    literal = lambda v: "None" if v is None else json.dumps(v)  # a JSON string is a Python str literal
    block = [
        "\n" if after else "",
        f"# Written by an agent ({meta.model}) in {where} of a `harness run agent=...` session;\n",
        "# the harness set this CANDIDATE dict (harness/agents/submissions.py).\n",
        "CANDIDATE = {\n",
        *(f"    {json.dumps(key)}: {literal(value)},\n" for key, value in meta.to_dict().items()),
        "}\n",
        "\n" if after < len(lines) and lines[after].strip() else "",
    ]
    return "".join(lines[:after] + block + lines[after:])


def draft(task: Task, source: Any, idea: Any, parent: Any, model: str) -> Draft:
    """Check a submission without writing anything: SubmissionRejected says what is wrong."""
    if not isinstance(source, str) or not source.strip():
        raise SubmissionRejected("source must be the whole candidate file as a non-empty string")
    if parent is not None and not (isinstance(parent, str) and parent.strip()):
        raise SubmissionRejected(f"parent must name a candidate (file stem or hash) or be omitted; got {parent!r}")
    try:
        meta = CandidateMeta(author="agent", model=model, parent=parent, idea=idea)
    except ValueError as e:
        raise SubmissionRejected(str(e)) from e
    text = with_metadata(source, meta, 1)
    with tempfile.TemporaryDirectory(prefix="beam-agent-check-") as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(text)
        try:
            candidate_files.load(probe, task.name, task.op_name)
        except CandidateError as e:
            raise SubmissionRejected(str(e).replace(str(probe), "your file")) from e
    return Draft(source, meta)


def write(folder: Path, text: str, round_: int) -> Path:
    """Create `<folder>/agent_r<round>_<hash12>.py` atomically; the same bytes again reuse the file."""
    data = text.encode()
    final = folder / f"{PREFIX}_r{round_:02d}_{candidate_files.content_hash(data)[:12]}.py"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"_tmp-{uuid.uuid4().hex}.py"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            if final.read_bytes() != data:
                raise RuntimeError(f"{final} exists with other bytes: refusing to overwrite it") from None
    finally:
        tmp.unlink()
    return final


def clip_log(text: str) -> str:
    if len(text) <= LOG_HEAD_CHARS + LOG_TAIL_CHARS:
        return text
    cut = len(text) - LOG_HEAD_CHARS - LOG_TAIL_CHARS
    return f"{text[:LOG_HEAD_CHARS]}\n[... {cut} characters cut ...]\n{text[-LOG_TAIL_CHARS:]}"


def _shape_entry(r: EvaluationRecord, run_showings: dict[tuple[str, str], list[promote.Showing]]) -> dict[str, Any]:
    entry: dict[str, Any] = {"shape": r.shape_label, "status": r.status.value}
    if r.detail:
        entry["detail"] = r.detail[:DETAIL_CHARS]
    if r.cheats:
        entry["cheats"] = r.cheats
    if r.sandbox_events:
        entry["sandbox_events"] = r.sandbox_events[:10]
    if r.parity:
        entry["parity"] = {out: {k: figures[k] for k in PARITY_FIGURES if figures.get(k) is not None}
                           for out, figures in r.parity.items()}  # fmt: skip
    if r.timing is not None:
        entry["p50_us"], entry["p20_us"], entry["p80_us"] = r.timing.p50_us, r.timing.p20_us, r.timing.p80_us
        bars = sorted(promote.bars(r, run_showings).items())  # what promotion judges it against
        entry["speedup_vs"] = {b: round(bar.p50_us / r.timing.p50_us, 4) for b, bar in bars}
        entry["baseline_p50_us"] = {b: bar.p50_us for b, bar in bars}
        entry["beyond_noise_vs"] = {b: r.timing.p80_us < bar.p20_us for b, bar in bars}
        if faster := {b: bar.where for b, bar in bars if bar.where != "beside it"}:
            entry["baseline_timed_faster_elsewhere"] = faster
        entry["floor_us"], entry["floor_fraction"] = r.floor_us, r.floor_fraction
        if r.suspicious:
            entry["suspicious"] = "faster than the roofline floor: a measurement problem or a cheat"
    else:
        entry["timing"] = r.timing_skipped
    return entry


def verdict(candidate: Candidate, result: RunResult) -> dict[str, Any]:
    """The tool result of one evaluation: JSON-ready, every figure the records hold for the agent."""
    recs = result.for_implementation(candidate.name)
    passed = [r.shape_label for r in recs if r.status is Status.PASSED]
    failed = [r for r in recs if r.status is not Status.PASSED]
    run_showings = promote.showings(result.records)
    entries = [_shape_entry(r, run_showings) for r in recs]
    if not failed:
        summary = f"passed parity on all {len(recs)} shapes"
        timed = [e["speedup_vs"] for e in entries if "p50_us" in e]
        if timed:
            worst = min(min(speedups.values(), default=0.0) for speedups in timed)
            summary += f"; worst speedup over any baseline {worst:.3f}x"
        else:
            summary += f" (not timed: {recs[0].timing_skipped})" if recs else ""
    else:
        summary = "failed: " + ", ".join(f"{r.status.value} on {r.shape_label}" for r in failed)
    logs = list(dict.fromkeys(r.log_tail for r in failed if r.status in LOGGED_STATUSES and r.log_tail))
    out: dict[str, Any] = {
        "candidate": candidate.name, "file": candidate.display_path, "content_hash": candidate.content_hash,
        "run_id": result.run.run_id, "device": recs[0].device if recs else None,
        "passed": not failed and bool(recs), "passed_shapes": passed, "summary": summary,
        "shapes": entries,
    }  # fmt: skip
    if logs:
        out["log"] = [clip_log(text) for text in logs[:2]]
    return out


def statuses(verdict_: dict[str, Any]) -> dict[str, str]:
    """shape label -> status, from a verdict (for replay comparisons)."""
    return {s["shape"]: s["status"] for s in verdict_.get("shapes", [])}
