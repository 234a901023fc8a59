"""agent.gpus: evaluations spread over several GPUs of one host, one evaluation per GPU at a time, each
child seeing only its GPU (CUDA_VISIBLE_DEVICES). CPU only: the runner's evaluate is a stand-in that
records which GPU each evaluation held, and when."""

from __future__ import annotations

import threading
import time

import pytest

from harness import run_cmd, runner, sandbox
from harness.agents import loop
from harness.agents.budget import Budget
from harness.agents.settings import AgentSettings
from harness.environment import REPO_ROOT
from harness.records import RunRecord
from tasks import get_task

TASK = get_task("fuse_norm")
SOURCE = (REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py").read_text()


def _settings(tmp_path, agent: AgentSettings) -> run_cmd.RunSettings:
    return run_cmd.RunSettings(task="fuse_norm", device="cpu", shapes=("tiny T=1",), seeds=(1,), progress=False,
                               results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "cache"),
                               agent=agent)  # fmt: skip


def test_child_env_takes_cuda_devices_from_the_settings_else_inherits(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    job = sandbox.prepare_job(tmp_path, "j", True, None, tmp_path / "no-cache", {})
    assert sandbox.child_env(job, "cuda", 1)["CUDA_VISIBLE_DEVICES"] == "3"
    assert sandbox.child_env(job, "cuda", 1, "1")["CUDA_VISIBLE_DEVICES"] == "1"
    uuid = "GPU-5f3a2b1c-0d4e-4f6a-8b7c-9d0e1f2a3b4c"
    assert sandbox.child_env(job, "cuda", 1, f"0, {uuid}")["CUDA_VISIBLE_DEVICES"] == f"0,{uuid}"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "CUDA_VISIBLE_DEVICES" not in sandbox.child_env(job, "cuda", 1)
    with pytest.raises(ValueError, match=r"cuda_devices: expected comma-separated GPU indices.*got 'cuda:1'"):
        sandbox.child_env(job, "cuda", 1, "cuda:1")


@pytest.mark.parametrize("bad", ["", "-1", "0,,1", "cuda:0", "0,0", "gpu0"])
def test_bad_cuda_devices_are_refused_with_what_was_expected(bad):
    with pytest.raises(runner.UsageError, match=rf"cuda_devices: .*{bad!r}"):
        runner.EvaluationSettings(cuda_devices=bad)
    runner.EvaluationSettings(cuda_devices="0,1")  # fine


@pytest.mark.parametrize("gpus", [("0", "0"), ("0,1",), ("x",)])
def test_bad_agent_gpus_are_refused(gpus):
    with pytest.raises(ValueError, match=r"agent.gpus must be distinct GPU indices"):
        AgentSettings(gpus=gpus)


def test_the_runner_hands_cuda_devices_to_every_child(tmp_path, monkeypatch):
    seen = []

    def fake_run_child(job, request, timeout_s, device, threads, cuda_devices=None):
        seen.append(cuda_devices)
        return sandbox.ChildRun(0, False, 0.0, [], "")

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    for cuda_devices in ("1", None):
        settings = runner.EvaluationSettings(device="cpu", cuda_devices=cuda_devices, cache_dir=str(tmp_path))
        with runner._Evaluation(TASK, [], settings) as ev:
            ev._spawn("bench-baselines", "bench", None, [], [s.label for s in ev.shapes], 5.0)
    assert seen == ["1", None]


def _fake_evaluate(log: list, lock: threading.Lock, barrier: threading.Barrier):
    calls = []

    def evaluate(task, candidates, settings, echo=print):
        with lock:
            calls.append(settings.cuda_devices)
            n = len(calls)
        start = time.monotonic()
        if n <= 2:
            barrier.wait(timeout=30)  # the first two evaluations must run at once: two GPUs, two workers
        time.sleep(0.02)
        with lock:
            log.append((settings.cuda_devices, start, time.monotonic(), f"run-{n}"))
        if n % 3 == 0:
            raise RuntimeError(f"evaluation {n} failed")
        run = RunRecord(run_id=f"run-{n}", task=task.name, device="cuda", settings=runner._jsonable(settings),
                        candidates={}, statuses={}, wall_s=0.0, environment={})  # fmt: skip
        return runner.RunResult(run, (), None, "", ())

    return evaluate


def test_each_evaluation_holds_one_gpu_alone_and_gives_it_back(tmp_path, monkeypatch):
    agent = AgentSettings(kind="anthropic", model="m", gpus=("0", "1"), candidates_dir=str(tmp_path / "cand"))
    log, lock, barrier = [], threading.Lock(), threading.Barrier(2)
    monkeypatch.setattr(loop.runner, "evaluate", _fake_evaluate(log, lock, barrier))
    session = loop.Session(TASK, _settings(tmp_path, agent), agent, "m", Budget(rounds=8, turns=1, tokens=1, usd=1.0),
                           echo=lambda line: None)  # fmt: skip
    assert session.slots._value == 2  # workers: one per GPU
    verdicts, errors = [], []

    def submit(i: int) -> None:
        try:
            verdicts.append(session.submit(session.draft(SOURCE, f"idea {i}", None), session.reserve_round()))
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(log) == 7 and len(errors) == 2 and len(verdicts) == 5, (log, errors)
    assert {gpu for gpu, *_ in log} == {"0", "1"}  # each ran with exactly one GPU id
    for gpu in ("0", "1"):
        spans = sorted((s, e) for g, s, e, _ in log if g == gpu)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False)), (gpu, spans)
    gpu_of_run = {run_id: gpu for gpu, _, _, run_id in log}
    assert all(v["gpu"] == gpu_of_run[v["run_id"]] for v in verdicts)  # the verdict names the GPU it held
    assert sorted(session.free_gpus.queue) == ["0", "1"]  # every GPU back, failed evaluations included
    saved = [s["verdict"]["gpu"] for s in session.record["submissions"]]
    assert sorted(saved) == sorted(v["gpu"] for v in verdicts)


def test_submissions_on_several_gpus_parse_their_sources_one_at_a_time(monkeypatch):
    """CPython 3.11 builds syntax trees with interpreter-wide state: two threads inside ast.parse at once
    can raise "SystemError: AST constructor recursion depth mismatch" (seen in this file's test above
    under load). The harness's parses go through one lock; a stand-in ast.parse counts who is inside."""
    import ast

    from harness import candidates
    from harness.agents import submissions

    real_parse, inside, most, lock = ast.parse, [0], [0], threading.Lock()

    def counting_parse(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # another thread gets the GIL here, and would enter too without the harness's lock
        try:
            return real_parse(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", counting_parse)
    path = REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py"
    calls = [lambda: submissions.own_metadata(SOURCE), lambda: candidates.load(path, TASK.name, TASK.op_name),
             lambda: candidates.parse_source(SOURCE)] * 4  # fmt: skip
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert most[0] == 1 and inside[0] == 0


def test_without_gpus_evaluations_inherit_the_parents_gpus(tmp_path, monkeypatch):
    agent = AgentSettings(kind="anthropic", model="m", candidates_dir=str(tmp_path / "cand"))
    log, lock = [], threading.Lock()
    monkeypatch.setattr(loop.runner, "evaluate", _fake_evaluate(log, lock, threading.Barrier(1)))
    session = loop.Session(TASK, _settings(tmp_path, agent), agent, "m", Budget(rounds=2, turns=1, tokens=1, usd=1.0),
                           echo=lambda line: None)  # fmt: skip
    assert session.slots._value == loop.default_workers("cpu")
    verdict = session.submit(session.draft(SOURCE, "idea", None), session.reserve_round())
    assert [gpu for gpu, *_ in log] == [None] and "gpu" not in verdict
