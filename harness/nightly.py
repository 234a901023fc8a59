"""`harness nightly`: every task again on this GPU and these libraries; promotions, regressions, failures.

    harness nightly                                   every task; results/nightly/<UTC date>/
    harness nightly tasks=[fuse_norm,output_gate] regression.k=4 regression.min_pct=3
    harness nightly agent=anthropic agent.rounds=4    agent rounds per task first (harness/agents)
    harness nightly -m task=fuse_norm,qk_norm_rope hydra/launcher=joblib gpus=[0,1]   one job per task
    harness nightly summarize_only=true               the summary and exit status of the whole night

Per task (an "item" of the run's journal, harness/journal.py):
  agent:<task>     (when agent.kind is not none) an agent session writes and evaluates candidates
  evaluate:<task>  every candidate of candidate_kernels/<task>/ and the promoted kernel (from its
                   path, else from git history by content hash) through the runner, exactly as
                   `harness run` does (records, promotion); then the findings (harness/nightly_checks.py):
                   the promoted kernel re-validated (parity, and its p50 against its own history on
                   this GPU model), baselines' drift, new promotions, failures.
Writes results/nightly/<run>/summary.md and summary.html (every item of the run so far, rewritten
after each item), beside journal.jsonl. Exit status 1 when an item of this invocation has a gating
finding (a regression, a promoted kernel that no longer passes or cannot be loaded) or could not
be done; 0 otherwise; 1 for bad input. The last line of output says why.

Two invocations at once split the items between them (an item is done by whichever takes its
lock first; the other skips it and waits for the rest), and an invocation that was killed is
resumed by running it again: finished items are skipped.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness import candidates as candidate_files
from harness import environment, goals, promote, promoted_source, records, runner
from harness.environment import REPO_ROOT
from harness.journal import ItemRecord, Journal, exclusive
from harness.nightly_checks import Finding, TaskEvidence, assess
from harness.records import EvaluationRecord, RunRecord, now_utc, task_results_dir
from harness.regression import Thresholds
from harness.report_nightly import nightly_html, nightly_markdown

try:
    from harness.agents.settings import AgentSettings

    AGENTS_AVAILABLE = True
except ModuleNotFoundError as missing:  # the agents package is not in this checkout: agent rounds are refused
    if missing.name not in ("harness.agents", "harness.agents.settings"):
        raise  # it is there, and broken: say so
    AGENTS_AVAILABLE = False

    @dataclass(frozen=True)
    class AgentSettings:  # type: ignore[no-redef]
        kind: str = "none"


NIGHTLY_DIR = "nightly"  # results/nightly/<run>/
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
POLL_S = 2.0


@dataclass(frozen=True, kw_only=True)
class NightlySettings(runner.EvaluationSettings):
    task: str = ""  # one task (for `-m task=a,b` sweeps); empty: `tasks`
    tasks: tuple[str, ...] = ()  # several; both empty: every task
    date: str = ""  # YYYY-MM-DD; default: today (UTC)
    run: str = ""  # the run's folder name under results/nightly/; default: the date
    candidates_dir: str | None = None  # default: <repo>/candidate_kernels
    regression: Thresholds = field(default_factory=Thresholds)  # when a night counts as a regression
    gpus: tuple[str, ...] = ()  # claim one of these GPUs (CUDA_VISIBLE_DEVICES ids) for this invocation
    gpu_lock_dir: str = "/tmp/beam-harness-gpu-locks"  # host-local: one lock file per GPU
    wait_s: float = 6 * 3600.0  # how long to wait for items (or a GPU) another invocation holds
    summarize_only: bool = False  # write the summary of what the journal holds, exit by all of it
    agent: AgentSettings = field(default_factory=AgentSettings)  # agent=anthropic|command|replay (harness/agents/)

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.task and self.tasks:
            problems.append(f"give task= or tasks=, not both; got task={self.task!r}, tasks={list(self.tasks)}")
        if self.date:
            try:
                datetime.date.fromisoformat(self.date)
            except ValueError:
                problems.append(f"date must be YYYY-MM-DD; got {self.date!r}")
        if self.run and not RUN_NAME.match(self.run):
            problems.append(f"run must be a folder name ({RUN_NAME.pattern}); got {self.run!r}")
        if self.wait_s < 0:
            problems.append(f"wait_s must be >= 0; got {self.wait_s}")
        if self.promote_fix:
            problems.append(f"promote_fix is a human's call on one task's run (`harness run task=...`), not the "
                            f"nightly's; got promote_fix={self.promote_fix!r}")  # fmt: skip
        if problems:
            raise runner.UsageError("invalid nightly settings: " + "; ".join(problems))

    @property
    def run_name(self) -> str:
        return self.run or self.date or datetime.datetime.now(datetime.UTC).date().isoformat()

    @property
    def candidates_root(self) -> Path:
        return Path(self.candidates_dir) if self.candidates_dir else candidate_files.CANDIDATES_ROOT


def task_names(settings: NightlySettings) -> list[str]:
    from tasks import TASKS

    names = [settings.task] if settings.task else list(settings.tasks) or list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise runner.UsageError(f"task(s) {unknown} unknown; known: {sorted(TASKS)}")
    if settings.shapes:  # every task must know them: say so now, not as one failed item per task
        device = runner.resolve_device(settings.device)
        for name in names:
            runner.select_shapes(TASKS[name], device, settings.shapes)
    return names


def items_of(settings: NightlySettings, tasks: list[str]) -> list[str]:
    if settings.agent.kind != "none" and not AGENTS_AVAILABLE:
        raise runner.UsageError(f"agent rounds are configured (agent.kind={settings.agent.kind!r}) but the "
                                "agent loop (harness/agents/) is not in this checkout; use agent=none")  # fmt: skip
    agent = settings.agent.kind != "none"
    return [item for t in tasks for item in ((f"agent:{t}",) if agent else ()) + (f"evaluate:{t}",)]


# ---- one item -----------------------------------------------------------------------------------------
def _display(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _history(results: Path, task: str, exclude: str) -> tuple[EvaluationRecord, ...]:
    """The task's records from complete runs (a run record exists), except run `exclude`."""
    folder = task_results_dir(results, task)
    runs, _ = records.read(folder / records.RUNS_FILE, RunRecord)
    complete = {r.run_id for r in runs} - {exclude}
    rows, _ = records.read(folder / records.RECORDS_FILE, EvaluationRecord)
    return tuple(r for r in rows if r.run_id in complete)


def evaluate_task(name: str, settings: NightlySettings, echo: Callable[[str], None]) -> tuple[str, list[Finding], dict]:
    from tasks import get_task

    task = get_task(name)
    folder = settings.candidates_root / name
    loaded, contract = [], []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith("_"):
            continue
        try:
            loaded.append(candidate_files.load(path, name, task.op_name))
        except candidate_files.CandidateError as e:
            contract.append((_display(path.resolve()), str(e)))
    results = settings.results_path
    gpu = environment.gpu()  # the GPU whose promotion this night judges and may move
    before = promote.promoted(name, results, gpu)
    with tempfile.TemporaryDirectory(prefix="beam-nightly-") as scratch:
        extra, promoted_name, note = promoted_source.beside(REPO_ROOT, task, before, loaded, Path(scratch))
        try:
            result = runner.evaluate(task, loaded + ([extra] if extra else []), settings, echo=echo)
        except (runner.HarnessError, ValueError) as e:  # the item fails; the night goes on with the others
            message = f"the evaluation failed: {type(e).__name__}: {e}"
            return "error", [Finding("failure", name, "harness", message, True)], {"error": message}
    after = promote.promoted(name, results, gpu)
    lineage = promote.same_code_hashes(name, before, results)
    evidence = TaskEvidence(
        task=name, records=result.records, promoted_before=before, promoted_name=promoted_name, promoted_note=note,
        promotion=result.promotion, promotion_reason=result.promotion_reason,
        history=_history(results, name, result.run.run_id), contract_failures=tuple(contract), in_force_after=after,
        loadable_problem=promoted_source.loadable_problem(REPO_ROOT, after) if after else None,
        promoted_lineage=lineage,
    )  # fmt: skip
    findings, details = assess(evidence, settings.regression)
    run = result.run  # also when nothing was evaluated (no candidate, no promoted kernel on this device)
    details.update(evaluation_run=run.run_id, device=run.device, environment=run.environment,
                   policy="gpu" if run.device == "cuda" else "interpreter",
                   candidates_dir=_display(folder.resolve()),
                   goals=goals.side_by_side(task, result.records))  # fmt: skip
    return ("failed" if any(f.gating for f in findings) else "ok"), findings, details


def agent_task(name: str, settings: NightlySettings, echo: Callable[[str], None]) -> tuple[str, list[Finding], dict]:
    from harness.agents.loop import run_agent
    from tasks import get_task

    agent = settings.agent
    if not agent.candidates_dir:  # write where the evaluate item looks
        agent = dataclasses.replace(agent, candidates_dir=str(settings.candidates_root / name))
    try:
        outcome = run_agent(get_task(name), dataclasses.replace(settings, agent=agent), echo=echo)
    except ValueError as e:  # no API key, bad settings: nothing was written
        return "error", [Finding("failure", name, f"agent ({agent.kind})", f"could not start: {e}", True)], {}
    details = {"session": outcome.session_id, "kind": outcome.kind, "stopped": outcome.stopped,
               "error": outcome.error, "transcript": str(outcome.transcript_path), "budget": outcome.budget,
               "submissions": [c.name for c in outcome.candidates],
               "passed": [c.name for c in outcome.passed]}  # fmt: skip
    findings = []
    if outcome.error:  # the session ended early (the API kept failing): worth a look, not a broken kernel
        findings.append(Finding("failure", name, f"agent ({agent.kind})", f"ended early: {outcome.error}", False))
    return "ok", findings, details


# ---- GPUs of one host -------------------------------------------------------------------------------------
@contextmanager
def claim(pool: tuple[str, ...], lock_dir: Path, wait_s: float) -> Iterator[str]:
    """One id of `pool` that no other holder of these lock files has, held for the block (first free
    in pool order; polled until `wait_s`). The lock files are host-local: one per GPU of this host."""
    deadline = time.monotonic() + wait_s
    while True:
        for gpu in pool:
            with exclusive(lock_dir / f"gpu-{gpu}.lock", blocking=False) as got:
                if got:
                    yield gpu
                    return
        if time.monotonic() >= deadline:
            raise runner.UsageError(f"no GPU of {list(pool)} became free within wait_s={wait_s:g} s "
                                    f"(locks in {lock_dir})")  # fmt: skip
        time.sleep(POLL_S)


@contextmanager
def only_gpu(gpu: str, echo: Callable[[str], None]) -> Iterator[None]:
    """Run the block on `gpu`: this process keeps seeing every GPU (it initializes CUDA before
    CUDA_VISIBLE_DEVICES changes) and makes `gpu` its current device; the evaluation children it
    starts see only `gpu`. A worker process that a launcher reuses for several jobs (joblib) thus
    follows each job's claim."""
    import torch

    if not torch.cuda.is_available():
        raise runner.UsageError(f"gpus=[{gpu}, ...] needs CUDA GPUs; torch.cuda.is_available() is False here")
    original = os.environ.get("CUDA_VISIBLE_DEVICES")
    torch.cuda.init()
    visible = original.split(",") if original else [str(i) for i in range(torch.cuda.device_count())]
    if gpu not in visible:
        raise runner.UsageError(f"gpu {gpu!r} is not visible here; visible: {visible}")
    torch.cuda.set_device(visible.index(gpu))
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    echo(f"nightly: claimed GPU {gpu} ({torch.cuda.get_device_name()})")
    try:
        yield
    finally:
        if original is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = original


# ---- the run -----------------------------------------------------------------------------------------------
def work(settings: NightlySettings, items: list[str], journal: Journal, echo: Callable[[str], None]) -> list[str]:
    """Do every item not done yet; items another process holds are retried until done or wait_s. The
    items still not done at the end (held elsewhere for too long)."""
    run = settings.run_name
    deadline = time.monotonic() + settings.wait_s
    pending = list(items)
    while pending:
        held = []
        for item in pending:
            with journal.item_lock(item, blocking=False) as got:
                if not got:
                    held.append(item)
                    continue
                done = journal.done(run).get(item)
                if done is not None:
                    echo(f"{item}: done already ({done.outcome}; pid {done.pid} on {done.host}, {done.created_utc})")
                    continue
                journal.start(run, item)
                began = time.monotonic()
                kind, task = item.split(":", 1)
                do = agent_task if kind == "agent" else evaluate_task
                outcome, findings, details = do(task, settings, echo)
                journal.finish(ItemRecord(run, item, "done", outcome, [f.to_dict() for f in findings], details,
                                          time.monotonic() - began))  # fmt: skip
                echo(f"{item}: {outcome} ({len(findings)} finding(s), {time.monotonic() - began:.1f} s)")
        if held and held == pending and time.monotonic() > deadline:
            return held
        if held:
            echo(f"nightly: waiting for {held} (another invocation holds them)")
            time.sleep(POLL_S)
        pending = held
    return []


def write_summary(settings: NightlySettings, journal: Journal) -> tuple[Path, Path, list[ItemRecord]]:
    run = settings.run_name
    with exclusive(journal.folder / "summary.lock"):
        done = sorted(journal.done(run).values(), key=lambda r: r.item)
        interrupted = journal.interrupted(run)
        args = (run, done, interrupted, dataclasses.asdict(settings.regression), now_utc())
        paths = []
        for name, text in (("summary.md", nightly_markdown(*args)), ("summary.html", nightly_html(*args))):
            tmp = journal.folder / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, journal.folder / name)  # readers never see half a summary
            paths.append(journal.folder / name)
    return paths[0], paths[1], done


def finding_line(f: dict) -> str:
    """One finding on one line: task/subject: kind on <shape>: message (the shape when the message lacks it)."""
    shape = f" on `{f['shape']}`" if f.get("shape") and f"`{f['shape']}`" not in f["message"] else ""
    return f"{f['task']}/{f['subject']}: {f['kind']}{shape}: {f['message']}"


def verdict_line(done: list[ItemRecord], wanted: list[str], not_done: list[str]) -> tuple[int, str]:
    """Exit status and last line for the items `wanted` by this invocation."""
    mine = [r for r in done if r.item in wanted]
    gating = [(r, f) for r in mine for f in r.findings if f["gating"]]
    problems = [finding_line(f) for _, f in gating]
    problems += [f"{item}: not done (held by another invocation past wait_s)" for item in not_done]
    missing = [i for i in wanted if i not in {r.item for r in mine} and i not in not_done]
    problems += [f"{item}: no record in the journal" for item in missing]
    if not wanted:
        problems.append("no item of this run is done: nothing to summarize")
    if problems:
        more = f" (and {len(problems) - 1} more; see the summary)" if len(problems) > 1 else ""
        return 1, f"nightly: FAIL: {problems[0]}{more}"
    promoted = sum(1 for r in mine for f in r.findings if f["kind"] == "promotion")
    return 0, (f"nightly: PASS: {len(mine)} item(s): no regression, every promoted kernel passes"
               + (f"; {promoted} new promotion(s)" if promoted else ""))  # fmt: skip


def main(settings: NightlySettings) -> int:
    settings = dataclasses.replace(settings, run=settings.run_name)  # the date, fixed once: midnight may pass
    try:
        tasks = task_names(settings)
        items = items_of(settings, tasks)
    except ValueError as e:
        print(f"error: harness nightly: {e}", file=sys.stderr)
        return 1
    journal = Journal(settings.results_path / NIGHTLY_DIR / settings.run_name)
    not_done: list[str] = []
    if not settings.summarize_only:
        try:
            if settings.gpus:
                with claim(settings.gpus, Path(settings.gpu_lock_dir), settings.wait_s) as gpu, only_gpu(gpu, print):
                    not_done = work(settings, items, journal, print)
            else:
                not_done = work(settings, items, journal, print)
        except ValueError as e:  # UsageError: shapes unknown to a task, no GPU for device=cuda, ...
            print(f"error: harness nightly: {e}", file=sys.stderr)
            return 1
    md, page, done = write_summary(settings, journal)
    wanted = [r.item for r in done] if settings.summarize_only else items
    for r in done:
        if r.item in wanted:
            for f in r.findings:
                print(f"  {'GATING ' if f['gating'] else ''}{finding_line(f)}")
    print(f"summary: {md}\n         {page}")
    code, line = verdict_line(done, wanted, not_done)
    print(line)
    sys.stdout.flush()
    return code
