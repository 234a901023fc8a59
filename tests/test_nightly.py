"""`harness nightly`: the regression detector on synthetic history, findings from records, and the loop
end to end on CPU: a promoted kernel that stops passing, two invocations at once, resumption after a kill."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import nightly, records
from harness.candidates import content_hash
from harness.environment import REPO_ROOT
from harness.journal import ItemRecord, Journal
from harness.nightly_checks import TaskEvidence, assess
from harness.records import EvaluationRecord, PromotionRecord, RunRecord, Status, Timing
from harness.regression import Thresholds, compare_same_run, compare_to_history
from harness.report_nightly import nightly_html, nightly_markdown
from tests.conftest import working_tree_env

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "fuse_norm"
GPU = "NVIDIA H200"
PROMOTED_HASH = "a" * 64
OUTPUT_GATE = '''"""The reference's arithmetic in plain PyTorch{why}."""
import time

import torch

CANDIDATE = {{"author": "human", "model": None, "parent": None, "idea": "the reference, written out"}}


def output_gate(o_THD, g_THD, bias_H):
    time.sleep({sleep})
    gate = torch.sigmoid(g_THD.float() + bias_H.float()[None, :, None])
    return (o_THD.float() * gate).to(torch.bfloat16)
'''


def band(p50: float, half: float = 0.1) -> Timing:
    return Timing(p50 - half, p50, p50 + half, "cuda_graph", 40, 100)


# ---- the detector, on synthetic history ----------------------------------------------------------------
def test_a_slowdown_beyond_the_noise_aware_threshold_is_a_regression():
    history = [band(p) for p in (10.0, 10.1, 9.9, 10.05, 9.95)]  # MAD spread 0.07, half band 0.1: within wins
    steady = compare_to_history(band(10.3), history)
    assert steady.verdict == "steady" and steady.center_us == 10.0 and steady.within_us == pytest.approx(0.1)
    assert steady.margin_us == pytest.approx(0.5)  # max(3 x 0.1, 5% of 10): the percentage floor
    slow = compare_to_history(band(10.9), history)
    assert slow.verdict == "regression" and slow.change_pct == pytest.approx(9.0)
    assert slow.reason.startswith("p50 10.90 us is +9.0% vs median 10.00 us of 5")
    assert compare_to_history(band(9.3), history).verdict == "faster"


def test_a_noisy_history_widens_the_threshold_and_a_short_one_judges_nothing():
    noisy = [band(p, 0.05) for p in (10.0, 12.0, 8.0, 11.0, 9.0)]  # MAD 1.0 -> spread 1.48 us
    cmp = compare_to_history(band(13.0), noisy)
    assert cmp.verdict == "steady" and cmp.between_us == pytest.approx(1.4826) and cmp.threshold_us > 13.0
    assert compare_to_history(band(16.0), noisy).verdict == "regression"
    assert compare_to_history(band(99.0), noisy[:2]).verdict == "no_history"
    window = [band(5.0)] * 10 + [band(10.0)] * 3  # only the last `window` measurements count
    assert compare_to_history(band(10.2), window, Thresholds(window=3)).verdict == "steady"
    assert compare_to_history(band(10.2), window, Thresholds(window=13)).verdict == "regression"
    with pytest.raises(ValueError, match="min_history <= window"):
        Thresholds(min_history=5, window=3)


def test_same_run_comparison_needs_disjoint_bands_and_the_percentage():
    assert compare_same_run(band(2.9, 0.05), band(2.4, 0.05)).verdict == "regression"
    assert compare_same_run(band(2.45, 0.1), band(2.4, 0.1)).verdict == "steady"  # bands overlap
    assert compare_same_run(band(2.45, 0.01), band(2.4, 0.01)).verdict == "steady"  # apart, but only +2%
    assert compare_same_run(band(1.9, 0.05), band(2.4, 0.05)).verdict == "faster"


# ---- findings from records: a planted regression --------------------------------------------------------
def gpu_record(run: str, name: str, p50: float, kind: str = "candidate", when: str = "2026-11-01T00:00:00+00:00",
               **changes) -> EvaluationRecord:  # fmt: skip
    fields = dict(run_id=run, task="fuse_norm", implementation=name, kind=kind, shape_label="T=1",
                  shape={"T": 1, "D": 5120}, device="cuda", policy="gpu", seeds=[1], status=Status.PASSED, detail="",
                  environment={"device": GPU, "torch": "2.11.0"}, parity={"x_TD": {"passed": True}},
                  timing=band(p50, 0.02), created_utc=when, record_id=f"{run}-{name}")  # fmt: skip
    if kind == "candidate":
        fields.update(candidate_hash=PROMOTED_HASH, candidate_path="candidate_kernels/fuse_norm/row_per_program.py",
                      speedups={"reference": 8.0 / p50})  # fmt: skip
    fields.update(changes)
    return EvaluationRecord(**fields)


PROMOTION = PromotionRecord(task="fuse_norm", action="promote", candidate="row_per_program",
                            path="candidate_kernels/fuse_norm/row_per_program.py", content_hash=PROMOTED_HASH,
                            run_id="old", evidence=["x"], reason="best", speedups={},
                            environment={"device": "NVIDIA H200"})  # fmt: skip


def test_a_promoted_kernel_slower_than_its_history_fails_the_night():
    history = [gpu_record(f"h{i}", "row_per_program", 2.0 + 0.01 * i, when=f"2026-11-0{i + 1}T00:00:00+00:00")
               for i in range(4)]  # fmt: skip
    history += [gpu_record(f"h{i}", "reference", 8.0, kind="reference") for i in range(4)]
    history.append(gpu_record("other-gpu", "row_per_program", 9.0, environment={"device": "NVIDIA B200"}))
    now = (gpu_record("new", "row_per_program", 3.0, when="2026-11-30T00:00:00+00:00"),
           gpu_record("new", "reference", 9.6, kind="reference"))  # fmt: skip
    evidence = TaskEvidence("fuse_norm", now, PROMOTION, "row_per_program", "", None, "stays", tuple(history))
    findings, details = assess(evidence, Thresholds())
    (regression,) = [f for f in findings if f.kind == "regression"]
    assert regression.gating and regression.shape == "T=1" and regression.figures["n_history"] == 4
    assert regression.figures["center_us"] == pytest.approx(2.015)  # the B200 record is not history here
    (drift,) = [f for f in findings if f.kind == "drift"]
    assert not drift.gating and drift.message.startswith("slower than its history: p50 9.60 us is +20.0%")
    assert details["revalidation"][0]["comparison"]["verdict"] == "regression"
    done = [ItemRecord("2026-11-30", "evaluate:fuse_norm", "done", "failed", [f.to_dict() for f in findings],
                       details)]  # fmt: skip
    code, line = nightly.verdict_line(done, ["evaluate:fuse_norm"], [])
    assert code == 1 and line.startswith("nightly: FAIL: fuse_norm/row_per_program: regression on `T=1`: p50 3.00 us")
    text = nightly_markdown("2026-11-30", done, [], Thresholds().__dict__, "2026-11-30T06:00:00+00:00")
    assert "## Regressions" in text and "| `fuse_norm` | `row_per_program` | `T=1` | 3.00 | 2.01 |" in text
    assert "**FAIL**: 1 gating finding(s)" in text and "| `reference` | `T=1` | 9.60 | regression |" in text
    assert "`candidate_kernels/fuse_norm/row_per_program.py`, since run `old` on the NVIDIA H200)." in text
    assert nightly_html("2026-11-30", done, [], Thresholds().__dict__, "x").startswith("<!DOCTYPE html>")
    steady = TaskEvidence("fuse_norm", (gpu_record("new", "row_per_program", 2.02),), PROMOTION, "row_per_program",
                          "", None, "stays", tuple(history))  # fmt: skip
    assert not [f for f in assess(steady, Thresholds())[0] if f.gating]


def test_a_regression_names_the_autotuner_picks_that_changed_since_the_last_run_in_its_history():
    def tuned(picks: dict[int, str]) -> dict[str, dict[str, str]]:
        return {"_fuse_norm_kernel": {f"(5120, {rows}, 'torch.bfloat16')": f"{config}, num_ctas: 1, maxnreg: None"
                                      for rows, config in picks.items()}}  # fmt: skip

    plain, ring = "RING: False, STAGES: 1, num_warps: 4", "RING: True, STAGES: 4, num_warps: 4"
    history = [gpu_record(f"h{i}", "row_per_program", 2.0 + 0.01 * i, when=f"2026-11-0{i + 1}T00:00:00+00:00",
                          autotuned=tuned({1024: plain, 1: plain})) for i in range(4)]  # fmt: skip
    now = (gpu_record("new", "row_per_program", 3.0, when="2026-11-30T00:00:00+00:00",
                      autotuned=tuned({1024: ring, 1: plain, 64: plain})),)  # fmt: skip
    findings, details = assess(TaskEvidence("fuse_norm", now, PROMOTION, "row_per_program", "", None, "stays",
                                            tuple(history)), Thresholds())  # fmt: skip
    (regression,) = [f for f in findings if f.kind == "regression"]
    change = "`_fuse_norm_kernel` (5120, 1024): RING False -> True, STAGES 1 -> 4"
    assert regression.message.endswith(f"; its autotuners picked differently from run h3: {change}")
    assert regression.figures["autotune_changes"] == [change] == details["revalidation"][0]["autotune_changes"]
    # the same picks (a key tuned in one run only is no change): the finding says nothing of them
    same = (gpu_record("new", "row_per_program", 3.0, autotuned=tuned({1024: plain, 1: plain, 64: ring})),)
    findings, _ = assess(TaskEvidence("fuse_norm", same, PROMOTION, "row_per_program", "", None, "stays",
                                      tuple(history)), Thresholds())  # fmt: skip
    (regression,) = [f for f in findings if f.kind == "regression"]
    assert "autotuners" not in regression.message and regression.figures["autotune_changes"] == []


def test_history_timed_with_the_old_windows_is_not_compared_with_the_new():
    """Windows that synchronized the device before their end event (records written before window_end
    existed) read 1-5% slow: a kernel 8% slower than such a history is judged only against history
    timed as it was, and with none left there is nothing to judge."""
    old = [gpu_record(f"h{i}", "row_per_program", 2.0, when=f"2026-11-0{i + 1}T00:00:00+00:00",
                      timing=Timing(1.98, 2.0, 2.02, "cuda_graph", 40, 100, window_end="device_sync"))
           for i in range(4)]  # fmt: skip
    now = (gpu_record("new", "row_per_program", 2.16, when="2026-11-30T00:00:00+00:00"),)
    evidence = TaskEvidence("fuse_norm", now, PROMOTION, "row_per_program", "", None, "stays", tuple(old))
    findings, details = assess(evidence, Thresholds())
    assert not [f for f in findings if f.kind == "regression"], findings
    assert details["revalidation"][0]["comparison"]["verdict"] == "no_history"
    same = [gpu_record(f"n{i}", "row_per_program", 2.0, when=f"2026-11-1{i}T00:00:00+00:00") for i in range(4)]
    findings, _ = assess(TaskEvidence("fuse_norm", now, PROMOTION, "row_per_program", "", None, "stays",
                                      tuple(old + same)), Thresholds())  # fmt: skip
    (regression,) = [f for f in findings if f.kind == "regression"]
    assert regression.figures["n_history"] == 4


def test_history_leaves_out_runs_that_never_finished(tmp_path):
    folder = tmp_path / "fuse_norm"
    for run in ("complete", "killed", "current"):
        records.append(folder / records.RECORDS_FILE, gpu_record(run, "row_per_program", 2.0))
    for run in ("complete", "current"):
        records.append(folder / records.RUNS_FILE, RunRecord(run, "fuse_norm", "cuda", {}, {}, {}, 1.0, {}))
    assert [r.run_id for r in nightly._history(tmp_path, "fuse_norm", exclude="current")] == ["complete"]


# ---- end to end on CPU -----------------------------------------------------------------------------------
def cpu_settings(tmp_path: Path, **changes) -> nightly.NightlySettings:
    fields = dict(tasks=("fuse_norm",), device="cpu", shapes=("tiny T=1",), seeds=(1,), progress=False,
                  results_dir=str(tmp_path / "results"), candidates_dir=str(tmp_path / "candidates"))  # fmt: skip
    fields.update(changes)
    return nightly.NightlySettings(**fields)


def test_a_promoted_kernel_replaced_by_a_failing_file_fails_the_night(tmp_path, capsys):
    kernel = tmp_path / "candidates" / "fuse_norm" / "kernel.py"
    kernel.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "correct.py", kernel)
    promotion = PromotionRecord(task="fuse_norm", action="promote", candidate="kernel", path=str(kernel),
                                content_hash=content_hash(kernel.read_bytes()), run_id="planted", evidence=["x"],
                                reason="planted", speedups={}, environment={})  # fmt: skip
    records.append(tmp_path / "results" / "fuse_norm" / records.PROMOTIONS_FILE, promotion)
    assert nightly.main(cpu_settings(tmp_path, run="night-1")) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "nightly: PASS: 1 item(s): no regression, every promoted kernel passes"
    summary = (tmp_path / "results" / "nightly" / "night-1" / "summary.md").read_text()
    assert "| `kernel` | `tiny T=1` | passed |" in summary  # the promoted kernel, re-validated

    shutil.copy(FIXTURES / "skipped_rounding.py", kernel)  # same path, other bytes: no longer passes
    assert nightly.main(cpu_settings(tmp_path, run="night-2")) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("nightly: FAIL: fuse_norm/kernel: failure: the file at the promoted kernel's path fails "
                           "on `tiny T=1`: mismatch")  # fmt: skip
    summary = (tmp_path / "results" / "nightly" / "night-2" / "summary.md").read_text()
    assert "neither at" in summary and "the optimized model cannot load the promotion in force" in summary


def test_bad_input_is_refused_with_the_reason(tmp_path, capsys, monkeypatch):
    assert nightly.main(cpu_settings(tmp_path, tasks=("fuse_norm", "nope"))) == 1
    assert "task(s) ['nope'] unknown; known: [" in capsys.readouterr().err
    assert nightly.main(cpu_settings(tmp_path, tasks=("fuse_norm", "router_gemm"), shapes=("T=3",))) == 1
    assert "task 'router_gemm' has no shapes ['T=3'] on cpu; known: [" in capsys.readouterr().err
    with pytest.raises(ValueError, match="date must be YYYY-MM-DD; got '30/11'"):
        cpu_settings(tmp_path, date="30/11")
    with pytest.raises(ValueError, match="give task= or tasks=, not both"):
        cpu_settings(tmp_path, task="fuse_norm")
    assert nightly.main(cpu_settings(tmp_path, gpus=("0",), wait_s=0)) == 1
    assert "needs CUDA GPUs" in capsys.readouterr().err
    monkeypatch.setattr(nightly, "AGENTS_AVAILABLE", False)
    configured = cpu_settings(tmp_path, agent=nightly.AgentSettings(kind="command"))  # as `agent=command` sets it
    with pytest.raises(ValueError, match="agent loop .harness/agents/. is not in this checkout"):
        nightly.items_of(configured, ["fuse_norm"])


def test_gpu_claims_are_exclusive_per_host(tmp_path):
    with nightly.claim(("0", "1"), tmp_path, 0) as first, nightly.claim(("0", "1"), tmp_path, 0) as second:
        assert (first, second) == ("0", "1")
        with pytest.raises(ValueError, match=r"no GPU of \['0', '1'\] became free within wait_s=0 s"):
            with nightly.claim(("0", "1"), tmp_path, 0):
                pass
    with nightly.claim(("0", "1"), tmp_path, 0) as again:
        assert again == "0"  # released


def test_agent_rounds_run_first_and_their_candidates_are_evaluated(tmp_path, capsys, monkeypatch):
    from harness.agents import loop

    repo = tmp_path / "repo"  # what the command agent may not touch: a stand-in, not this repository
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setattr(loop, "run_agent", functools.partial(loop.run_agent, repo_root=repo))
    cmd = f'{sys.executable} -c "import shutil, sys; shutil.copy(*sys.argv[1:])" {FIXTURES / "correct.py"} ' \
          "{candidate_path}"  # fmt: skip
    agent = nightly.AgentSettings(kind="command", cmd=cmd, rounds=1, time_limit_s=60)
    assert nightly.main(cpu_settings(tmp_path, run="agents", agent=agent)) == 0
    out = capsys.readouterr().out
    assert out.index("agent:fuse_norm: ok") < out.index("evaluate:fuse_norm: ok")
    done = Journal(tmp_path / "results" / "nightly" / "agents").done("agents")
    session = done["agent:fuse_norm"].details
    assert session["kind"] == "command" and len(session["submissions"]) == 1
    assert session["passed"] == session["submissions"]
    assert Path(session["transcript"]).is_file()
    assert done["evaluate:fuse_norm"].details["statuses"] == {session["submissions"][0]: "passed"}
    assert "## Agent sessions" in (tmp_path / "results" / "nightly" / "agents" / "summary.md").read_text()


def two_task_tree(tmp_path: Path, sleep_s: float) -> None:
    (tmp_path / "candidates" / "fuse_norm").mkdir(parents=True)
    shutil.copy(FIXTURES / "correct.py", tmp_path / "candidates" / "fuse_norm" / "correct.py")
    gate = tmp_path / "candidates" / "output_gate" / "plain.py"
    gate.parent.mkdir(parents=True)
    gate.write_text(OUTPUT_GATE.format(why=f", {sleep_s} s late", sleep=sleep_s))


def start(tmp_path: Path, temp: Path | None = None) -> subprocess.Popen:
    """A nightly process on the two-task tree; `temp` its TMPDIR (the evaluation's scratch root goes there)."""
    env = working_tree_env(**({"TMPDIR": str(temp)} if temp else {}))
    args = [sys.executable, "-m", "harness", "nightly", "tasks=[fuse_norm,output_gate]", "device=cpu",
            "shapes=['tiny T=1']", "seeds=[1]", "progress=false", "run=night", f"results_dir={tmp_path / 'results'}",
            f"candidates_dir={tmp_path / 'candidates'}"]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=REPO_ROOT, start_new_session=True)  # fmt: skip


def check_each_item_once(tmp_path: Path) -> list[ItemRecord]:
    entries, skipped = Journal(tmp_path / "results" / "nightly" / "night").entries()
    assert not skipped
    done = [e for e in entries if e.state == "done"]
    assert sorted(e.item for e in done) == ["evaluate:fuse_norm", "evaluate:output_gate"]
    for task in ("fuse_norm", "output_gate"):
        folder = tmp_path / "results" / task
        runs, bad = records.read(folder / records.RUNS_FILE, RunRecord)
        rows, bad_rows = records.read(folder / records.RECORDS_FILE, EvaluationRecord)
        assert not bad and not bad_rows and len(runs) == 1, (task, runs, bad, bad_rows)
        assert {r.run_id for r in rows} == {runs[0].run_id} and len(rows) == 1  # one candidate x one shape
    return entries


def test_two_nightlies_at_once_do_each_item_once(tmp_path):
    two_task_tree(tmp_path, sleep_s=1.0)
    first, second = start(tmp_path), start(tmp_path)
    outs = [p.communicate(timeout=300)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    for out in outs:
        assert out.strip().splitlines()[-1] == "nightly: PASS: 2 item(s): no regression, every promoted kernel passes"
    entries = check_each_item_once(tmp_path)
    assert len([e for e in entries if e.state == "started"]) == 2  # nobody started an item twice
    assert sum("done already" in out or "waiting for" in out for out in outs) >= 1, outs  # they met


@pytest.fixture
def temp_for_a_victim():
    """TMPDIR for a nightly that is killed, so cannot remove its scratch: removed here instead. In /tmp,
    traversable like it, for the sandboxed children that run in the scratch root."""
    temp = Path(tempfile.mkdtemp(prefix="beam-killed-nightly-"))
    os.chmod(temp, 0o711)
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


def test_a_killed_nightly_resumes_where_it_stopped(tmp_path, temp_for_a_victim):
    two_task_tree(tmp_path, sleep_s=3.0)
    journal = Journal(tmp_path / "results" / "nightly" / "night")
    victim = start(tmp_path, temp_for_a_victim)
    deadline = time.monotonic() + 120
    while not any(e.item == "evaluate:output_gate" for e in journal.entries()[0]):  # fuse_norm done, gate begun
        assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()[0]
        time.sleep(0.2)
    os.killpg(victim.pid, signal.SIGKILL)  # the nightly and the evaluation child it had started
    victim.wait()
    assert [e.item for e in journal.entries()[0] if e.state == "done"] == ["evaluate:fuse_norm"]
    again = start(tmp_path)
    out = again.communicate(timeout=300)[0]
    assert again.returncode == 0, out
    assert "evaluate:fuse_norm: done already (ok" in out
    entries = check_each_item_once(tmp_path)
    (interrupted,) = journal.interrupted("night")
    assert interrupted.item == "evaluate:output_gate" and interrupted.pid == victim.pid
    assert {e.pid for e in entries if e.state == "done"} == {victim.pid, again.pid}
    summary = (tmp_path / "results" / "nightly" / "night" / "summary.md").read_text()
    assert "## Started, not finished" in summary
    assert f"| `evaluate:output_gate` | {interrupted.host} | {victim.pid} |" in summary


# ---- on the GPU: the whole regression path with real timings --------------------------------------------------
@pytest.mark.gpu
def test_on_the_gpu_a_promoted_kernel_slower_than_its_planted_history_fails_the_night(tmp_path, capsys):
    source = REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py"
    kernel = tmp_path / "candidates" / "fuse_norm" / "row_per_program.py"
    kernel.parent.mkdir(parents=True)
    shutil.copy(source, kernel)
    results = tmp_path / "results" / "fuse_norm"
    records.append(results / records.PROMOTIONS_FILE, PromotionRecord(
        task="fuse_norm", action="promote", candidate="row_per_program", path=str(kernel),
        content_hash=content_hash(kernel.read_bytes()), run_id="planted", evidence=["x"], reason="planted",
        speedups={}, environment={}))  # fmt: skip
    settings = dict(device="cuda", shapes=("T=1",), baselines=False)
    assert nightly.main(cpu_settings(tmp_path, run="gpu-1", **settings)) == 0  # no history yet: nothing to judge
    rows, _ = records.read(results / records.RECORDS_FILE, EvaluationRecord)
    (measured,) = [r for r in rows if r.implementation == "row_per_program" and r.timing is not None]
    for i in range(3):  # plant a history three times faster than this GPU just measured
        fast = Timing(*(t / 3 for t in (measured.timing.p20_us, measured.timing.p50_us, measured.timing.p80_us)),
                      "cuda_graph", 40, 100)  # fmt: skip
        records.append(results / records.RECORDS_FILE, EvaluationRecord(**{
            **measured.to_dict(), "run_id": f"planted-{i}", "timing": fast, "record_id": f"planted-{i}"}))  # fmt: skip
        records.append(results / records.RUNS_FILE, RunRecord(f"planted-{i}", "fuse_norm", "cuda", {}, {}, {}, 1.0, {}))
    capsys.readouterr()
    assert nightly.main(cpu_settings(tmp_path, run="gpu-2", **settings)) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("nightly: FAIL: fuse_norm/row_per_program: regression on `T=1`: p50 "), last
