"""What the harness knows about a task when an agent starts: the machine and its measured ceilings,
the candidates so far and their numbers, and the hot spots of the newest profile.

Everything is read from files the harness wrote (results/<task>/*.jsonl, profiles/<run>/summary.md)
and summarized as text for the task statement (harness/agents/prompt.py). Missing files are stated
as such ("none yet"), never guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from harness import candidates as candidate_files
from harness import environment, goals, promote, review_git
from harness.environment import REPO_ROOT
from harness.profile_kernel_records import kernel_profile_section, load_profiles
from harness.records import RECORDS_FILE, EvaluationRecord, Status, read, task_results_dir
from tasks.task import Task

PROFILES_DIR = REPO_ROOT / "profiles"
SUMMARY_FILE = "summary.md"
HOT_SPOT_SECTION = "## Which ops dominate"
MAX_PROFILES = 2  # model profiles shown (the newest of each kind: decode and prefill, say)
MAX_SECTION_CHARS = 4000


@dataclass(frozen=True)
class TaskContext:
    task: Task
    device: str  # "cuda" or "cpu": where this session's candidates are evaluated
    device_name: str  # "NVIDIA H200" or "CPU (Triton interpreter)"
    shapes: tuple[str, ...]  # the shape labels evaluated in this session
    seeds: tuple[int, ...]
    ceilings: str  # the measured copy bandwidth and GEMM rate, with where they come from
    candidates: str  # the promoted/best candidate and the others, with their latest numbers
    hot_spots: str  # the newest model profile's ranking and the task's kernel profiles, or "none"
    goals: str  # the task's goals and where its candidates stand against them (harness/goals.py)


def _device_name(device: str) -> str:
    if device == "cuda":
        return environment.gpu() or "CUDA GPU"
    return "CPU only (no CUDA GPU): candidates run through the Triton interpreter"


def _task_records(results_dir: Path, task: str) -> list[EvaluationRecord]:
    return read(task_results_dir(results_dir, task) / RECORDS_FILE, EvaluationRecord)[0]


def ceilings_text(records: list[EvaluationRecord], device: str) -> str:
    measured = [r for r in records if r.device == "cuda" and r.copy_gbps]
    if not measured:
        where = "a GPU" if device == "cuda" else "a GPU (none here)"
        return (f"not measured yet for this task: the first evaluation on {where} measures the copy "
                "bandwidth and the BF16 GEMM rate in the benchmark process, and every verdict reports the "
                "floor fraction.")  # fmt: skip
    r = max(measured, key=lambda r: r.created_utc)
    gemm = f"{r.gemm_tflops:,.0f} TFLOP/s BF16 GEMM" if r.gemm_tflops else "no GEMM rate (memory-bound shapes)"
    return (f"{r.copy_gbps:,.0f} GB/s device copy (read + write counted), {gemm}; measured on "
            f"{r.environment.get('device')} in run {r.run_id} ({r.created_utc}). Floor of a shape = "
            "max(bytes / copy bandwidth, flops / GEMM rate) by the task's cost formula.")  # fmt: skip


def _fmt_us(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us >= 1e4 else f"{us:.2f} us"


def _record_line(r: EvaluationRecord, run_showings: dict[tuple[str, str], list[promote.Showing]]) -> str:
    """One shape's status, or its p50 and speedups over each baseline as promotion bars it (promote.bars)."""
    if r.status is not Status.PASSED:
        return f"{r.shape_label}: {r.status.value} ({r.detail[:120]})"
    if r.timing is None:
        return f"{r.shape_label}: passed parity ({r.device}, not timed)"
    vs = ", ".join(f"{bar.p50_us / r.timing.p50_us:.2f}x vs {b}" + ("" if bar.where == "beside it" else
                   f" (its time {bar.where}, faster than beside it)")
                   for b, bar in sorted(promote.bars(r, run_showings).items()))  # fmt: skip
    floor = f", {r.floor_fraction:.0%} of the floor" if r.floor_fraction is not None else ""
    return f"{r.shape_label}: p50 {_fmt_us(r.timing.p50_us)} ({vs}{floor})"


def _latest_by_hash(records: list[EvaluationRecord]) -> dict[str, list[EvaluationRecord]]:
    """Per candidate hash, its records from the newest run that evaluated it (GPU runs first)."""
    runs: dict[str, dict[str, list[EvaluationRecord]]] = {}
    for r in records:
        if r.kind == "candidate" and r.candidate_hash:
            runs.setdefault(r.candidate_hash, {}).setdefault(r.run_id, []).append(r)
    latest = {}
    for h, by_run in runs.items():
        latest[h] = max(by_run.values(), key=lambda rs: (rs[0].device == "cuda", rs[0].created_utc))
    return latest


def _same_code_records(c: candidate_files.Candidate, latest: dict[str, list[EvaluationRecord]],
                       repo: Path) -> tuple[list[EvaluationRecord], str] | None:  # fmt: skip
    """The newest records of `c`'s code under earlier bytes of its file, documentation edited since
    (candidates.code_hash, the bytes found in the file's git history), and those bytes' hash; None if none."""
    if not c.path.is_relative_to(repo):
        return None
    rel = str(c.path.relative_to(repo))
    earlier = {h: rs for h, rs in latest.items() if h != c.content_hash and rs[0].candidate_path == rel}
    if not earlier:
        return None
    now, same = c.path.read_bytes(), []
    for _, data in review_git.history(repo, rel):
        h = candidate_files.content_hash(data)
        if h in earlier and candidate_files.same_code(data, now):
            same.append((earlier.pop(h), h))
    return max(same, key=lambda found: (found[0][0].device == "cuda", found[0][0].created_utc), default=None)


def _baseline_line(records: list[EvaluationRecord]) -> str | None:
    timed = [r for r in records if r.kind != "candidate" and r.timing is not None]
    if not timed:
        return None
    run = max(timed, key=lambda r: r.created_utc).run_id
    rows = [f"{r.implementation} {r.shape_label} p50 {_fmt_us(r.timing.p50_us)}" for r in timed if r.run_id == run]
    return f"Baselines in run {run}: " + "; ".join(rows)


def candidates_text(task: Task, records: list[EvaluationRecord], results_dir: Path, folder: Path,
                    repo: Path = REPO_ROOT, gpu: str | None = None) -> str:  # fmt: skip
    """The kernel in force on `gpu` (promote.promoted; None: no GPU here) with its newest records, then every
    other candidate file with its latest evaluation."""
    lines = []
    current = promote.promoted(task.name, results_dir, gpu)
    latest = _latest_by_hash(records)
    by_run = promote.showings_by_run(records)
    if current is not None:
        score = [min(s.values()) for s in current.speedups.values() if s]
        geo = math.exp(sum(map(math.log, score)) / len(score)) if score else None
        lines.append(f"Promoted (the one to beat): {current.candidate} ({current.path}, sha256 "
                     f"{current.content_hash[:12]}), promoted on the {promote.gpu_of(current) or 'GPU'} in run "
                     f"{current.run_id}"
                     + (f"; geomean of its worst speedups {geo:.3f}x" if geo else "") + ".")  # fmt: skip
        # its newest evaluation under any bytes of the same code (harness rehash: a header edited since)
        chain = [latest[h] for h in promote.same_code_hashes(task.name, current, results_dir) if h in latest]
        newest = max(chain, key=lambda rs: (rs[0].device == "cuda", rs[0].created_utc), default=[])
        for r in sorted(newest, key=lambda r: r.shape_label):
            lines.append(f"  - {_record_line(r, by_run[r.run_id])}")
    else:
        lines.append("Promoted: none yet (promotion needs GPU timings beating every baseline on every GPU shape).")
    present, broken = [], []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith("_"):
            continue
        try:
            present.append(candidate_files.load(path, task.name, task.op_name))
        except candidate_files.CandidateError as e:
            broken.append(f"- {path.name}: breaks the candidate contract: {e}")
    others = [c for c in present if current is None or c.content_hash != current.content_hash]
    if others:
        shown = folder.relative_to(REPO_ROOT) if folder.is_relative_to(REPO_ROOT) else folder
        lines.append(f"Other candidates in {shown}/ (latest evaluation of each):")
    for c in others:
        recs = sorted(latest.get(c.content_hash, []), key=lambda r: r.shape_label)
        where = f"{recs[0].device}, run {recs[0].run_id}" if recs else "never evaluated"
        if not recs and (found := _same_code_records(c, latest, repo)) is not None:
            recs = sorted(found[0], key=lambda r: r.shape_label)
            where = (f"{recs[0].device}, run {recs[0].run_id}, as its earlier bytes {found[1][:12]}: the same code, "
                     "documentation edited since")  # fmt: skip
        lines.append(f"- {c.name} ({c.meta.author}{', ' + c.meta.model if c.meta.model else ''}): "
                     f"{c.meta.idea} [{where}]")  # fmt: skip
        lines += [f"  - {_record_line(r, by_run[r.run_id])}" for r in recs]
    if not present and current is None:
        lines.append(f"No candidate files yet in {folder}.")
    baseline = _baseline_line(records)
    if baseline:
        lines.append(baseline)
    return "\n".join(lines + broken)


def goals_text(task: Task, records: list[EvaluationRecord], results_dir: Path) -> str:
    return goals.goals_table(task, records, goals.in_force_on(task.name, records, results_dir))


RUN_STAMP = re.compile(r"(\d{8}T\d{6}Z)$")  # harness/profile_model.py ends each run folder's name with it


def newest_profile_summaries(profiles_dir: Path) -> list[tuple[Path, str]]:
    """(path, text) of the newest summary of each profile kind (preset, scenario, ops: its title),
    newest first. Age is the UTC stamp that ends the run folder's name (a fresh checkout's file
    times say nothing), else the file's modification time."""

    def age(path: Path) -> tuple[str, float]:
        stamp = RUN_STAMP.search(path.parent.name)
        return (stamp.group(1) if stamp else "", path.stat().st_mtime)

    newest: dict[str, tuple[Path, str]] = {}
    for path in sorted(profiles_dir.glob(f"*/{SUMMARY_FILE}")) if profiles_dir.is_dir() else []:
        text = path.read_text(errors="replace")
        kind = _title(text)
        if kind not in newest or age(path) > age(newest[kind][0]):
            newest[kind] = (path, text)
    return sorted(newest.values(), key=lambda found: age(found[0]), reverse=True)


def _title(text: str) -> str:
    return next((line[2:] for line in text.splitlines() if line.startswith("# ")), "Profile")


def markdown_section(text: str, heading: str) -> str | None:
    """The lines of a Markdown section (heading included) up to the next heading of the same level."""
    lines = text.splitlines()
    if heading not in lines:
        return None
    start = lines.index(heading)
    level = heading.split(" ")[0] + " "
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    return "\n".join(lines[start:end]).strip()


def _clip(text: str, limit: int = MAX_SECTION_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters in the file]"


def hot_spots_text(task: Task, results_dir: Path, profiles_dir: Path) -> str:
    parts = []
    summaries = newest_profile_summaries(profiles_dir)
    if not summaries:
        parts.append(f"Model profile: none (no {profiles_dir.name}/<run>/{SUMMARY_FILE} yet; "
                     "`harness profile model=beam-slice` writes one).")  # fmt: skip
    for summary, text in summaries[:MAX_PROFILES]:
        section = markdown_section(text, HOT_SPOT_SECTION) or "(the summary has no ranking section)"
        shown = summary.relative_to(REPO_ROOT) if summary.is_relative_to(REPO_ROOT) else summary
        then = "; it ran the kernels promoted when it was taken: the ones in force now are under Candidates"
        parts.append(f"Newest model profile of its kind, {shown} ({_title(text)}"
                     f"{then if 'optimized ops' in _title(text) else ''}):\n{_clip(section)}")  # fmt: skip
    profiles, _ = load_profiles(results_dir, task.name)
    if profiles:
        parts.append("Kernel profiles of this task (Nsight Compute, latest per candidate and shape):\n"
                     + _clip(kernel_profile_section([p.to_dict() for p in profiles])))  # fmt: skip
    else:
        parts.append("Kernel profiles of this task: none (`harness profile task=<task> candidate=<name>` on a GPU).")
    return "\n\n".join(parts)


def gather(task: Task, device: str, shapes: tuple[str, ...], seeds: tuple[int, ...], results_dir: Path,
           candidates_folder: Path, profiles_dir: Path = PROFILES_DIR) -> TaskContext:  # fmt: skip
    records = _task_records(results_dir, task.name)
    return TaskContext(
        task=task, device=device, device_name=_device_name(device), shapes=shapes, seeds=seeds,
        ceilings=ceilings_text(records, device),
        candidates=candidates_text(task, records, results_dir, candidates_folder,
                                   gpu=environment.gpu() if device == "cuda" else None),
        hot_spots=hot_spots_text(task, results_dir, profiles_dir),
        goals=goals_text(task, records, results_dir),
    )  # fmt: skip
