"""The runner's sandbox and records (planted candidates), and promotion as a pure function of records."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

from harness import bench, parity, promote, sandbox
from harness.environment import REPO_ROOT
from harness.records import (
    EAGER_FALLBACK,
    PROMOTIONS_FILE,
    RECORDS_FILE,
    RUNS_FILE,
    EvaluationRecord,
    PromotionRecord,
    RunRecord,
    Status,
    Timing,
    append,
    launches_text,
    read,
)
from tests.conftest import PLANTED_SECRET_ENV, PLANTED_SECRET_FILE, working_tree_env


# ---- the sandbox, on planted candidates ------------------------------------------------------------
def test_a_secret_is_neither_found_nor_unrecorded(planted):
    record = planted("reads_secret")
    assert record.status is Status.SANDBOX_VIOLATION
    assert f"secret_env_read: {PLANTED_SECRET_ENV[0]}" in record.sandbox_events
    assert f"secret_read: {PLANTED_SECRET_FILE[0]}" in record.sandbox_events
    assert "FOUND: [None, 'refused: sandbox:" in record.log_tail  # what the candidate printed
    assert PLANTED_SECRET_ENV[1] not in record.log_tail and PLANTED_SECRET_FILE[1] not in record.log_tail


def test_writes_outside_scratch_are_blocked_and_recorded(planted):
    record = planted("writes_repo")
    assert record.status is Status.SANDBOX_VIOLATION
    assert f"write_outside_scratch: {REPO_ROOT / 'PLANTED_BY_CANDIDATE'}" in record.sandbox_events
    assert "write_outside_scratch: /tmp/PLANTED_BY_CANDIDATE" in record.sandbox_events
    assert not (REPO_ROOT / "PLANTED_BY_CANDIDATE").exists() and not Path("/tmp/PLANTED_BY_CANDIDATE").exists()


def test_the_network_is_unreachable_and_attempts_are_recorded(planted):
    record = planted("opens_socket")
    assert record.status is Status.SANDBOX_VIOLATION
    assert any(e.startswith("network: socket.getaddrinfo") for e in record.sandbox_events)
    assert any(e.startswith("network: socket.bind") for e in record.sandbox_events)
    assert "CONNECTED" not in record.log_tail


def test_every_record_says_which_isolation_layers_were_active(planted_run):
    for record in planted_run.records:
        layers = record.isolation
        assert layers["audit_hook"] == "active" and layers["minimal_env"] == "active", record.implementation
        for layer in ("network_namespace", "uid_drop", "no_new_privs"):
            assert layers[layer] == "active" or layers[layer].startswith("active:") or "unavailable" in layers[layer]
        if os.geteuid() == 0:
            assert layers["network_namespace"] == "active"


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_the_uid_drop_makes_the_repository_unwritable(tmp_path):
    """The OS layers of `sandbox.enter`, in a forked process (they cannot be undone in this one)."""
    import pwd

    nobody = pwd.getpwnam(sandbox.SANDBOX_USER)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(scratch, nobody.pw_uid, nobody.pw_gid)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: enter, then try to write into the repository
        os.close(read_end)
        try:
            layers = sandbox.enter(scratch, [nobody.pw_uid, nobody.pw_gid], None)
            try:
                open(REPO_ROOT / "PLANTED_BY_TEST", "w").close()
                outcome = "wrote"
            except PermissionError:
                outcome = "refused"
            Path("ok").write_text("scratch is writable")  # relative: the cwd is scratch
            os.write(write_end, f"{outcome} {layers['uid_drop']} {layers['network_namespace']}".encode())
        except BaseException as e:
            os.write(write_end, f"error {e!r}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    message = os.read(read_end, 1000).decode()
    assert message.startswith("refused active: uid") and message.endswith(" active"), message
    assert (scratch / "ok").exists() and not (REPO_ROOT / "PLANTED_BY_TEST").exists()


def test_the_child_environment_is_an_allowlist(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-should-not-pass")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-should-not-pass")
    job = sandbox.prepare_job(tmp_path, "j", True, None, tmp_path / "no-cache", {})
    env = sandbox.child_env(job, "cpu", 1)
    assert "ANTHROPIC_API_KEY" not in env and "GITHUB_TOKEN" not in env
    assert env["HOME"] == str(job.scratch) and env["TRITON_INTERPRET"] == "1"
    assert set(env) <= set(sandbox.PASSTHROUGH_ENV) | {
        "HOME", "TMPDIR", "XDG_CACHE_HOME", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
        "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TRITON_INTERPRET",
    }  # fmt: skip


def test_only_the_trusted_child_compiles_with_worker_processes(tmp_path):
    isolated = sandbox.prepare_job(tmp_path, "iso", True, None, tmp_path / "no-cache", {})
    trusted = sandbox.prepare_job(tmp_path, "trusted", False, None, tmp_path / "no-cache", {})
    assert sandbox.child_env(isolated, "cpu", 1)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in sandbox.child_env(trusted, "cpu", 1)


def test_a_copied_triton_cache_points_its_groups_at_the_copy(tmp_path):
    src = tmp_path / "src" / "HASH"
    src.mkdir(parents=True)
    (src / "_qk_token_kernel.cubin").write_bytes(b"\0")
    (src / "__grp___qk_token_kernel.json").write_text(
        json.dumps({"child_paths": {"_qk_token_kernel.cubin": str(src / "_qk_token_kernel.cubin")}})
    )
    (src / "_qk_token_kernel.autotune.json").write_text("{}")
    sandbox.copy_triton_cache(tmp_path / "src", tmp_path / "dst")
    group = json.loads((tmp_path / "dst" / "HASH" / "__grp___qk_token_kernel.json").read_text())
    assert group["child_paths"] == {"_qk_token_kernel.cubin": str(tmp_path / "dst" / "HASH" / "_qk_token_kernel.cubin")}
    assert (tmp_path / "dst" / "HASH" / "_qk_token_kernel.autotune.json").exists()
    sandbox.copy_triton_cache(tmp_path / "src", tmp_path / "shared-gpu", autotuning=False)  # a parity child's
    assert sorted(p.name for p in (tmp_path / "shared-gpu" / "HASH").iterdir()) == [
        "__grp___qk_token_kernel.json", "_qk_token_kernel.cubin"]  # fmt: skip


def test_a_benchmark_childs_peer_cache_starts_as_a_copy_of_the_trusted_one(tmp_path):
    trusted = tmp_path / "cache" / "triton" / "baselines-fuse_norm"
    (trusted / "KEY").mkdir(parents=True)
    (trusted / "KEY" / "triton_poi_fused_0.cubin").write_bytes(b"\0")
    (trusted / "KEY" / "__grp__triton_poi_fused_0.json").write_text(
        json.dumps({"child_paths": {"triton_poi_fused_0.cubin": str(trusted / "KEY" / "triton_poi_fused_0.cubin")}})
    )
    job = sandbox.prepare_job(tmp_path / "jobs", "bench-x", True, None, tmp_path / "no-cache", {})
    sandbox.seed_peer_triton_cache(job, trusted)
    peers = job.scratch / sandbox.PEER_TRITON_CACHE / "KEY"
    assert (peers / "triton_poi_fused_0.cubin").read_bytes() == b"\0"
    group = json.loads((peers / "__grp__triton_poi_fused_0.json").read_text())
    assert group["child_paths"] == {"triton_poi_fused_0.cubin": str(peers / "triton_poi_fused_0.cubin")}
    (peers / "triton_poi_fused_0.cubin").write_bytes(b"planted")  # the child spoils its copy only
    assert (trusted / "KEY" / "triton_poi_fused_0.cubin").read_bytes() == b"\0"
    fresh = sandbox.prepare_job(tmp_path / "jobs", "bench-y", True, None, tmp_path / "no-cache", {})
    sandbox.seed_peer_triton_cache(fresh, tmp_path / "never-compiled")  # no baselines child ran: an empty cache
    assert list((fresh.scratch / sandbox.PEER_TRITON_CACHE).iterdir()) == []


def test_the_peers_compile_into_a_triton_cache_of_their_own(tmp_path, monkeypatch):
    """The benchmark child compiles torch.compile's kernels inside child.triton_cache_dir, away from
    the candidate's persisted cache; Triton (and Inductor through it) must follow the switch."""
    import triton

    from harness import child

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "candidate"))
    with child.triton_cache_dir(str(tmp_path / "peers")):
        assert triton.knobs.cache.dir == str(tmp_path / "peers")
    assert triton.knobs.cache.dir == str(tmp_path / "candidate")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    with child.triton_cache_dir(str(tmp_path / "peers")):
        pass
    assert "TRITON_CACHE_DIR" not in os.environ


def test_an_isolated_child_copies_the_shared_caches_except_inductors(tmp_path):
    shared = {"TORCHINDUCTOR_CACHE_DIR": tmp_path / "inductor", "FLASHINFER_WORKSPACE_BASE": tmp_path / "flashinfer"}
    for d in shared.values():
        (d / "entry").mkdir(parents=True)
    iso = sandbox.prepare_job(tmp_path / "jobs", "iso", True, None, tmp_path / "no-cache", shared)
    inductor, flashinfer = (Path(iso.cache_env[v]) for v in shared)
    assert inductor.is_relative_to(iso.scratch) and not (inductor / "entry").exists()  # compiled cold, in scratch
    assert flashinfer.is_relative_to(iso.scratch) and (flashinfer / "entry").is_dir()  # a copy
    trusted = sandbox.prepare_job(tmp_path / "jobs", "trusted", False, None, tmp_path / "no-cache", shared)
    assert trusted.cache_env == {v: str(d) for v, d in shared.items()}  # used in place


@pytest.mark.parametrize(
    ("name", "secret"),
    [("ANTHROPIC_API_KEY", True), ("GITHUB_TOKEN", True), ("MY_DB_PASSWORD", True), ("AWS_REGION", True),
     ("TRITON_CACHE_DIR", False), ("TORCHINDUCTOR_AUTOTUNE", False), ("PATH", False), ("KERNEL_NAME", False)],
)  # fmt: skip
def test_secret_variable_names(name, secret):
    assert sandbox.is_secret_env_name(name) is secret


# ---- what a run writes -------------------------------------------------------------------------------
def test_the_run_appended_its_records_and_run_record(planted_run):
    results = Path(planted_run.run.settings["results_dir"]) / "fuse_norm"
    records, skipped = read(results / RECORDS_FILE, EvaluationRecord)
    assert skipped == [] and len(records) == len(planted_run.records)
    assert {r.record_id for r in records} == {r.record_id for r in planted_run.records}
    (run,), _ = read(results / RUNS_FILE, RunRecord)
    assert run.run_id == planted_run.run.run_id and run.wall_s > 0 and run.device == "cpu"
    # On CPU: parity children, then judging; no baselines child and no benchmark without a GPU.
    assert set(run.phases_s) == {"parity", "judge"} and 0 < sum(run.phases_s.values()) <= run.wall_s
    assert "not meaningful" in run.timing_skipped
    assert not (results / PROMOTIONS_FILE).exists()  # no promotion without GPU timings
    correct = next(r for r in records if r.implementation == "correct")
    assert correct.candidate_meta == {"author": "agent", "model": "planted-fixture", "parent": None,
                                      "idea": "the reference, written out"}  # fmt: skip
    assert correct.environment["torch"] and correct.timing is None and "no CUDA GPU" in correct.timing_skipped


# ---- promotion: a pure function of records -----------------------------------------------------------
SHAPES = ("T=1", "T=16384")
ENV = {"device": "NVIDIA H200"}


def _t(p50: float, spread: float = 0.02) -> dict[str, float]:
    return {"p20_us": p50 * (1 - spread), "p50_us": p50, "p80_us": p50 * (1 + spread)}


def _rec(name: str, shape: str, p50: float, baselines: dict[str, float], spread: float = 0.02, **changes):
    fields = dict(
        run_id="run-7", task="fuse_norm", implementation=name, kind="candidate", shape_label=shape,
        shape={"T": int(shape[2:])}, device="cuda", policy="gpu", seeds=[1, 2, 3], status=Status.PASSED, detail="",
        environment=ENV, candidate_hash=(name * 64)[:64], candidate_path=f"candidate_kernels/fuse_norm/{name}.py",
        parity={"x_TD": {"passed": True}}, timing=Timing(**_t(p50, spread), method="cuda_graph", samples=40,
        calls_per_window=100), baselines_us={b: _t(v) for b, v in baselines.items()},
        speedups={b: v / p50 for b, v in baselines.items()}, floor_us=0.5,
    )  # fmt: skip
    fields.update(changes)
    return EvaluationRecord(**fields)


BASE = {"reference": 10.0, "torch_compile": 6.0, "flashinfer_rmsnorm_x2": 5.0}


def test_a_cpu_run_s_verdict_counts_the_configs_it_forced():
    from harness.run_cmd import _verdict

    cpu = dict(device="cpu", policy="interpreter", timing=None, baselines_us={}, speedups={})
    one = _rec("one", "T=1", 1.0, {}, **cpu, configs_checked=1, configs_unchecked=["k(BLOCK=8): no launch"])
    many = _rec("many", "T=1", 1.0, {}, **cpu, configs_checked=7, configs_idle=2, configs_unchecked=["a", "b"])
    no_gpu = " (timing skipped: no GPU)"
    assert _verdict(one, None, None, {}) == "parity ok, 1 forced config too, 1 config unchecked" + no_gpu
    assert (
        _verdict(many, None, None, {})
        == "parity ok, 7 forced configs too, 2 idle at this shape, 2 configs unchecked" + no_gpu
    )


def test_a_clear_win_everywhere_is_promoted_with_its_evidence():
    records = [_rec("fast", s, 3.0, BASE) for s in SHAPES]
    record, (assessment,), reason = promote.decide(records, SHAPES, None, ENV)
    assert record is not None and record.action == "promote" and record.candidate == "fast"
    assert record.evidence == [r.record_id for r in records] and record.content_hash == records[0].candidate_hash
    assert record.speedups["T=1"]["flashinfer_rmsnorm_x2"] == pytest.approx(5.0 / 3.0)
    assert assessment.score == pytest.approx(5.0 / 3.0) and "beats every baseline" in reason


def test_a_win_inside_the_noise_is_not_promoted():
    # 3% faster at the median than the best baseline, but with 2% noise bands the bands overlap.
    records = [_rec("marginal", s, 4.85, BASE) for s in SHAPES]
    assert all(r.speedups["flashinfer_rmsnorm_x2"] > 1 for r in records)
    record, (assessment,), reason = promote.decide(records, SHAPES, None, ENV)
    assert record is None and not assessment.eligible
    assert any("not beyond noise against flashinfer_rmsnorm_x2" in r for r in assessment.reasons)
    # the same medians with tight bands are beyond the noise
    tight = [_rec("marginal", s, 4.85, {b: v for b, v in BASE.items()}, spread=0.005) for s in SHAPES]
    tight = [
        EvaluationRecord(**{**r.__dict__, "baselines_us": {b: _t(v, 0.005) for b, v in BASE.items()}}) for r in tight
    ]
    assert promote.decide(tight, SHAPES, None, ENV)[0] is not None


def test_losing_on_one_shape_or_to_one_baseline_blocks_promotion():
    records = [_rec("half", "T=1", 3.0, BASE), _rec("half", "T=16384", 5.5, BASE)]
    record, (assessment,), _ = promote.decide(records, SHAPES, None, ENV)
    assert record is None and assessment.reasons == [
        "T=16384: not beyond noise against flashinfer_rmsnorm_x2 (candidate p80 5.61 us, flashinfer_rmsnorm_x2 "
        "p20 4.90 us)"
    ]


def test_failing_parity_on_one_shape_blocks_promotion():
    records = [
        _rec("wrong", "T=1", 3.0, BASE),
        _rec("wrong", "T=16384", 3.0, BASE, status=Status.MISMATCH, detail="x_TD: 12 elements", timing=None,
             baselines_us={}, speedups={}),
    ]  # fmt: skip
    record, (assessment,), _ = promote.decide(records, SHAPES, None, ENV)
    assert record is None and assessment.reasons == ["T=16384: mismatch (x_TD: 12 elements)"]


def test_a_torch_compile_that_falls_back_to_eager_is_excused_only_where_it_does():
    """moe_experts on the H200: dynamo hit its recompile limit at T >= 64 and would have run eagerly."""
    from harness import child

    class FailOnRecompileLimitHit(RuntimeError):  # torch._dynamo.exc's name; only the name is matched
        pass

    note = child.compile_fallback(FailOnRecompileLimitHit("Hard failure due to fail_on_recompile_limit_hit"))
    assert note is not None and note.startswith(EAGER_FALLBACK) and "recompile limit" in note
    assert child.compile_fallback(RuntimeError("a real compile bug")) is None
    no_compile = {b: v for b, v in BASE.items() if b != "torch_compile"}
    records = [_rec("fast", "T=1", 3.0, BASE),
               _rec("fast", "T=16384", 3.0, no_compile, baseline_notes={"torch_compile": note})]  # fmt: skip
    record, _, _ = promote.decide(records, SHAPES, None, ENV)
    assert record is not None and record.candidate == "fast"
    # a peer missing for another reason still blocks the promotion
    broken = [records[0], _rec("fast", "T=16384", 3.0, no_compile, baseline_notes={"torch_compile": "RuntimeError: x"})]
    record, (assessment,), _ = promote.decide(broken, SHAPES, None, ENV)
    assert record is None and assessment.reasons == ["T=16384: baselines ['torch_compile'] were not timed beside it"]


def test_a_time_below_the_roofline_is_not_promoted():
    records = [_rec("too_fast", s, 3.0, BASE, floor_us=4.0, suspicious=True) for s in SHAPES]
    record, (assessment,), _ = promote.decide(records, SHAPES, None, ENV)
    assert record is None and "below the roofline floor" in assessment.reasons[0]


def test_the_best_eligible_candidate_wins_and_a_partial_run_promotes_nothing():
    records = [_rec("good", s, 4.0, BASE) for s in SHAPES] + [_rec("better", s, 2.0, BASE) for s in SHAPES]
    record, assessments, _ = promote.decide(records, SHAPES, None, ENV)
    assert record.candidate == "better" and len(assessments) == 2
    record, _, reason = promote.decide(records, (*SHAPES, "T=64"), None, ENV)
    assert record is None and "not every GPU shape" in reason


def _promotion(name: str, action: str = "promote") -> PromotionRecord:
    return PromotionRecord(
        task="fuse_norm", action=action, candidate=name, path=f"candidate_kernels/fuse_norm/{name}.py",
        content_hash=(name * 64)[:64], run_id="run-1", evidence=["r1"], reason="earlier", speedups={}, environment=ENV,
    )  # fmt: skip


def test_the_promotion_in_force_changes_only_when_it_was_compared():
    current = _promotion("incumbent")
    challenger = [_rec("challenger", s, 2.0, BASE) for s in SHAPES]
    record, _, reason = promote.decide(challenger, SHAPES, current, ENV)
    assert record is None and "was not evaluated in this run" in reason
    both = challenger + [_rec("incumbent", s, 3.0, BASE) for s in SHAPES]
    record, _, _ = promote.decide(both, SHAPES, current, ENV)
    assert record.action == "promote" and record.candidate == "challenger"


def test_a_challenger_slower_than_the_promoted_kernel_is_told_where_their_autotuners_picked_differently():
    def tuned(mixed: int) -> dict[str, dict[str, str]]:
        configs = {1: "MIXED: 6", 16384: f"MIXED: {mixed}"}
        return {"_fuse_norm_kernel": {f"(5120, {rows}, 'torch.bfloat16')": f"{c}, num_warps: 4, num_ctas: 1"
                                      for rows, c in configs.items()}}  # fmt: skip

    def child_rows(**changes) -> list[EvaluationRecord]:  # the best geomean, but slower at T=16384
        return [_rec("child", s, p50, BASE, **changes) for s, p50 in (("T=1", 1.0), ("T=16384", 3.5))]

    current = _promotion("incumbent")
    incumbent = [_rec("incumbent", s, 3.0, BASE, autotuned=tuned(0)) for s in SHAPES]
    child = child_rows(autotuned=tuned(6))
    record, _, reason = promote.decide(incumbent + child, SHAPES, current, ENV)
    assert record is None and "slower than the promoted incumbent on T=16384: " in reason
    assert reason.endswith("(their autotuners picked differently, promoted -> challenger: "
                           "`_fuse_norm_kernel` (5120, 16384): MIXED 0 -> 6)")  # fmt: skip
    # the same picks, or kernels of other names: nothing said of them
    renamed = {"_other_kernel": tuned(6)["_fuse_norm_kernel"]}
    for rows in (child_rows(autotuned=tuned(0)), child_rows(autotuned=renamed)):
        _, _, reason = promote.decide(incumbent + rows, SHAPES, current, ENV)
        assert "slower than the promoted incumbent on T=16384" in reason and "autotuners" not in reason


def test_a_better_geomean_does_not_buy_a_shape_slower_than_the_promoted_kernel():
    current = _promotion("incumbent")
    incumbent = [_rec("incumbent", s, 3.0, BASE) for s in SHAPES]
    # the best geomean (5x at T=1), but 16.7% slower than the incumbent at T=16384, bands apart
    lopsided = [_rec("lopsided", "T=1", 1.0, BASE), _rec("lopsided", "T=16384", 3.5, BASE)]
    record, _, reason = promote.decide(incumbent + lopsided, SHAPES, current, ENV)
    assert record is None and reason.startswith("incumbent stays promoted (the best of the others")
    assert "lopsided (geomean 2.673x) not promoted: slower than the promoted incumbent on T=16384" in reason
    # the next eligible challenger by score that slows no shape (and is faster on one) is promoted, and the
    # record says who gave way
    steady = [_rec("steady", "T=1", 2.5, BASE), _rec("steady", "T=16384", 2.9, BASE)]
    record, _, _ = promote.decide(incumbent + lopsided + steady, SHAPES, current, ENV)
    assert record.candidate == "steady" and "lopsided (geomean 2.673x) not promoted" in record.reason
    # slower with the bands apart, but by 3%: within the default 5%, not within a 2% setting
    close = [_rec("close", "T=1", 1.0, BASE), _rec("close", "T=16384", 3.09, BASE, spread=0.005)]
    assert promote.decide(incumbent + close, SHAPES, current, ENV)[0].candidate == "close"
    record, _, reason = promote.decide(incumbent + close, SHAPES, current, ENV, max_regression_pct=2.0)
    assert record is None and "close (geomean" in reason
    # no promotion in force: nothing to regress against
    assert promote.decide(incumbent + lopsided, SHAPES, None, ENV)[0].candidate == "lopsided"


def test_a_tie_with_the_promoted_kernel_does_not_replace_it():
    current = _promotion("incumbent")
    incumbent = [_rec("incumbent", s, 3.0, BASE) for s in SHAPES]
    # a better geomean (3.0 / 2.95), but within the noise of the incumbent on every shape
    tie = [_rec("tie", s, 2.95, BASE) for s in SHAPES]
    record, _, reason = promote.decide(incumbent + tie, SHAPES, current, ENV)
    assert record is None and reason.startswith("incumbent stays promoted (the best of the others")
    assert "tie (geomean 1.695x) not promoted: not faster than the promoted incumbent on any shape" in reason
    assert "(its best, T=1: within noise or 5%" in reason
    # faster beyond noise on one shape, the same on the other: it replaces the incumbent
    better = [_rec("better", "T=1", 2.5, BASE), _rec("better", "T=16384", 3.0, BASE)]
    assert promote.decide(incumbent + better, SHAPES, current, ENV)[0].candidate == "better"
    # bands apart but under max_regression_pct faster is still a tie; a 2% setting counts it
    close = [_rec("close", s, 2.85, BASE, spread=0.005) for s in SHAPES]
    assert promote.decide(incumbent + close, SHAPES, current, ENV)[0] is None
    assert promote.decide(incumbent + close, SHAPES, current, ENV, max_regression_pct=2.0)[0].candidate == "close"


def test_a_kernel_in_force_that_misses_a_bar_gives_way_to_a_faster_one_that_misses_only_that_bar():
    """qk_norm_rope: the kernel in force and its challenger both behind torch.compile on one shape (there the
    compile fails parity, but stays a bar); the challenger faster on another shape, slower on none."""
    current = _promotion("incumbent")
    behind = {**BASE, "flashinfer_rmsnorm_x2": 7.0}  # T=16384: only torch.compile (6.0) ahead of both
    incumbent = [_rec("incumbent", "T=1", 3.0, BASE), _rec("incumbent", "T=16384", 6.3, behind)]
    challenger = [_rec("challenger", "T=1", 2.5, BASE), _rec("challenger", "T=16384", 6.25, behind)]
    record, assessments, reason = promote.decide(incumbent + challenger, SHAPES, current, ENV)
    assert not any(a.eligible for a in assessments)
    assert [a.short_of for a in assessments] == [{"T=16384": ["torch_compile"]}] * 2
    assert record is not None and record.candidate == "challenger"
    assert record.reason.startswith("beats every baseline beyond noise on every shape but where the promoted "
                                    "incumbent does not either (T=16384: torch_compile), and replaces it")  # fmt: skip
    # no kernel in force, or one that clears every bar: the usual rule, and the challenger is not eligible
    assert promote.decide(challenger, SHAPES, None, ENV)[0] is None
    clears = [_rec("incumbent", "T=1", 3.0, BASE), _rec("incumbent", "T=16384", 5.0, behind)]
    record, _, reason = promote.decide(clears + challenger, SHAPES, current, ENV)
    assert record is None and reason.startswith("incumbent stays promoted (best again")
    # a bar the kernel in force clears: the challenger is behind flashinfer (7.0) too, within its noise
    also_behind = _rec("challenger", "T=16384", 6.8, behind)
    record, _, reason = promote.decide(incumbent + challenger[:1] + [also_behind], SHAPES, current, ENV)
    assert record is None and reason == "no candidate beats every baseline beyond noise on every shape"
    # any other shortfall rules it out: parity on one shape
    wrong = _rec("challenger", "T=16384", 6.25, behind, status=Status.MISMATCH, detail="q: 3 elements", timing=None,
                 baselines_us={}, speedups={})  # fmt: skip
    assert promote.decide(incumbent + challenger[:1] + [wrong], SHAPES, current, ENV)[0] is None
    # and the rest of the rule holds: slower than the kernel in force on a shape, or faster on none
    slower = _rec("challenger", "T=16384", 6.7, behind)  # 6.3% slower, still ahead of flashinfer (7.0)
    record, _, reason = promote.decide(incumbent + challenger[:1] + [slower], SHAPES, current, ENV)
    assert record is None and reason.startswith("incumbent stays promoted (it is itself not eligible in this run)")
    assert "challenger (geomean" in reason and "slower than the promoted incumbent on T=16384" in reason
    tie = [_rec("challenger", "T=1", 2.97, BASE), challenger[1]]
    record, _, reason = promote.decide(incumbent + tie, SHAPES, current, ENV)
    assert record is None and "not faster than the promoted incumbent on any shape" in reason


def _qk_norm_rope_run(run_id: str, incumbent: str):
    """The committed records of one qk_norm_rope run, the task's GPU shapes and the promotion of `incumbent`."""
    from tasks import TASKS

    results = REPO_ROOT / "results" / "qk_norm_rope"
    records = [r for r in read(results / RECORDS_FILE, EvaluationRecord)[0] if r.run_id == run_id]
    shapes = [s.label for s in TASKS["qk_norm_rope"].shapes]
    current = next(p for p in reversed(promote.history("qk_norm_rope", REPO_ROOT / "results"))
                   if p.candidate == incumbent)  # fmt: skip
    return records, shapes, current


def test_the_twenty_sixth_session_qk_norm_rope_run_replayed():
    """Committed H200 records of run 20261204T041340-c79e43: pdl_head_groups faster than the promoted
    head_groups on every shape; at global T=16384 both behind the in-child torch.compile (144.66 and 146.42
    against 142.52 us), which fails parity there. The rule that required beating it refused the promotion."""
    records, shapes, current = _qk_norm_rope_run("20261204T041340-c79e43", "head_groups")
    record, assessments, _ = promote.decide(records, shapes, current, records[0].environment)
    by_name = {a.candidate: a for a in assessments}
    assert (
        by_name["head_groups"].short_of == by_name["pdl_head_groups"].short_of == {"global T=16384": ["torch_compile"]}
    )
    assert record is not None and record.candidate == "pdl_head_groups"
    assert "(global T=16384: torch_compile)" in record.reason


@pytest.mark.parametrize(
    ("run_id", "incumbent", "challenger", "beside_it", "bar", "where"),
    [
        # twenty-seventh session: pdl_token_ring over pdl_head_groups
        ("20261204T115359-166329", "pdl_head_groups", "pdl_token_ring", 179.39, 143.44, "pdl_head_groups"),
        # thirty-fifth session: loads_first over pdl_token_ring
        ("20261205T014911-ba3c81", "pdl_token_ring", "loads_first", 178.85, 141.00, "pdl_token_ring"),
    ],
)  # fmt: skip
def test_a_torch_compile_slow_in_one_child_is_judged_by_its_faster_showing(
    run_id, incumbent, challenger, beside_it, bar, where
):
    """Committed H200 records of two qk_norm_rope runs: at global T=16384 the torch.compile timed beside the
    challenger read about 179 us, beside the kernel in force about 141-143 us, the challenger's own time. Judged
    against the timing beside it, the challenger looked clear of every bar. Judged against the peer's faster
    showing (promote.bars), both miss that one bar, and the challenger replaces the kernel in force by the rule
    for a kernel in force that misses a bar: the same promotion, for the true reason."""
    records, shapes, current = _qk_norm_rope_run(run_id, incumbent)
    r = next(r for r in records if r.implementation == challenger and r.shape_label == "global T=16384")
    assert r.baselines_us["torch_compile"]["p50_us"] == pytest.approx(beside_it, abs=0.01)
    judged = promote.bars(r, promote.showings(records))["torch_compile"]
    assert judged.p50_us == pytest.approx(bar, abs=0.01) and judged.where == f"beside {where}"
    # only torch.compile's timings differ between the run's processes by more than 5%: the reference's and
    # flashinfer's, everywhere, are judged beside the candidate
    elsewhere = {b for r in records if r.kind == "candidate" and r.timing is not None
                 for b, s in promote.bars(r, promote.showings(records)).items() if s.where != "beside it"}  # fmt: skip
    assert elsewhere == {"torch_compile"}
    record, assessments, _ = promote.decide(records, shapes, current, records[0].environment)
    by_name = {a.candidate: a for a in assessments}
    assert by_name[challenger].short_of == by_name[incumbent].short_of == {"global T=16384": ["torch_compile"]}
    assert by_name[challenger].elsewhere["global T=16384"]["torch_compile"] == judged
    assert record is not None and record.candidate == challenger
    assert record.reason.startswith(f"beats every baseline beyond noise on every shape but where the promoted "
                                    f"{incumbent} does not either (global T=16384: torch_compile)")  # fmt: skip
    assert record.speedups["global T=16384"]["torch_compile"] == pytest.approx(judged.p50_us / r.timing.p50_us)
    # without the other showings (the rule before): judged by the slow peer beside it, clear of every bar
    alone = promote.assess([r for r in records if r.implementation == challenger], shapes)
    assert alone.eligible and not alone.elsewhere


def test_a_baseline_faster_elsewhere_in_the_run_is_the_bar_wherever_the_run_is_shown():
    """torch.compile timed at 6.0 us beside one candidate and at 9.0 beside another (a slower process), 6.1 in
    the baselines child: the second candidate, at 6.2, is judged against 6.0, in the promotion, the run's table,
    the review's timing table and the agent's verdict; the timing beside it stays in its record."""
    from types import SimpleNamespace

    from harness import report, runner
    from harness.agents import submissions
    from harness.run_cmd import format_run

    peers = {"reference": 10.0, "torch_compile": 6.0}
    steady = [_rec("steady", s, 3.0, peers) for s in SHAPES]
    lucky = [_rec("lucky", s, 6.2, {**peers, "torch_compile": 9.0}) for s in SHAPES]
    trusted = [_rec("torch_compile", s, 6.1, {}, kind="torch_compile", candidate_hash=None, candidate_path=None,
                    status=Status.MISMATCH, detail="x_TD: 1 ulp on 30% of elements", speedups={})
               for s in SHAPES]  # fmt: skip
    records = steady + lucky + trusted
    run_showings = promote.showings(records)
    assert [s.where for s in run_showings[("T=1", "torch_compile")]] == [
        "beside steady", "beside lucky", "in the baselines child"]  # fmt: skip
    bar = promote.bars(lucky[0], run_showings)
    assert (bar["torch_compile"].p50_us, bar["torch_compile"].where) == (6.0, "beside steady")
    assert bar["reference"].where == "beside it"  # 10.0 everywhere: the timing beside it stands
    assert promote.bars(steady[0], run_showings)["torch_compile"].where == "beside it"  # 6.1 is not 5% faster
    record, assessments, _ = promote.decide(records, SHAPES, None, ENV)
    by_name = {a.candidate: a for a in assessments}
    assert record is not None and record.candidate == "steady"
    assert by_name["lucky"].short_of == {s: ["torch_compile"] for s in SHAPES}
    assert by_name["lucky"].reasons[0] == (
        "T=1: not beyond noise against torch_compile (candidate p80 6.32 us, torch_compile p20 5.88 us "
        "beside steady, 8.82 us beside it)"
    )
    assert by_name["lucky"].speedups["T=1"]["torch_compile"] == pytest.approx(6.0 / 6.2)
    assert lucky[0].speedups["torch_compile"] == pytest.approx(9.0 / 6.2)  # the record keeps what it saw

    run = RunRecord(run_id="run-7", task="fuse_norm", device="cuda", settings={}, candidates={}, statuses={},
                    wall_s=1.0, environment={}, promoted=record.content_hash)  # fmt: skip
    result = runner.RunResult(run, tuple(records), record, record.reason, tuple(assessments))
    table = format_run(result)
    lucky_row = next(line for line in table.splitlines() if line.strip().startswith("lucky"))
    assert "0.97x (6.00 us beside steady*)" in lucky_row and "1.61x (10.00 us)" in lucky_row
    assert lucky_row.endswith("not faster beyond noise than torch_compile")
    assert "*: the baseline ran more than 5% faster, beyond noise, elsewhere in this run" in table

    rows = report.timing_table(lucky, "lucky", {}, run_showings).rows
    assert [(row[1], row[-2]) for row in rows if row[0] == "`T=1`"] == [
        ("`lucky` (candidate)", "-"), ("reference", "yes"), ("torch_compile", "yes"),
        ("torch_compile (beside steady: faster, the bar)", "no"),
    ]  # fmt: skip

    candidate = SimpleNamespace(name="lucky", display_path="candidate_kernels/fuse_norm/lucky.py",
                                content_hash=lucky[0].candidate_hash)  # fmt: skip
    told = submissions.verdict(candidate, result)
    shape = told["shapes"][0]
    assert shape["beyond_noise_vs"] == {"reference": True, "torch_compile": False}
    assert shape["baseline_p50_us"]["torch_compile"] == 6.0
    assert shape["baseline_timed_faster_elsewhere"] == {"torch_compile": "beside steady"}
    assert told["summary"].endswith("worst speedup over any baseline 0.968x")


def test_a_fix_of_the_promoted_kernel_named_by_the_run_replaces_it_at_equal_speed():
    """promote_fix: a candidate whose CANDIDATE parent is the kernel in force may replace it within the noise;
    a slower shape still blocks it, and a named candidate with another parent is held to the usual rule
    (below the kernel in force by score, it is not considered)."""
    current = _promotion("incumbent")
    incumbent = [_rec("incumbent", s, 3.0, BASE) for s in SHAPES]

    def meta(parent):
        return {"author": "human", "model": None, "parent": parent, "idea": "the same kernel, one hazard fixed"}

    fixed = [_rec("fixed", s, 3.02, BASE, candidate_meta=meta("incumbent")) for s in SHAPES]
    record, _, reason = promote.decide(incumbent + fixed, SHAPES, current, ENV)  # a hair slower: a tie
    assert record is None and reason == "incumbent stays promoted (best again, geomean speedup 1.667x)"
    record, _, _ = promote.decide(incumbent + fixed, SHAPES, current, ENV, fix="fixed")
    assert record is not None and record.candidate == "fixed"
    assert "a fix of the promoted incumbent (promote_fix)" in record.reason
    by_hash = [_rec("fixed", s, 3.02, BASE, candidate_meta=meta(current.content_hash[:12])) for s in SHAPES]
    assert promote.decide(incumbent + by_hash, SHAPES, current, ENV, fix="fixed")[0].candidate == "fixed"
    slower = [_rec("fixed", "T=1", 3.0, BASE, candidate_meta=meta("incumbent")),
              _rec("fixed", "T=16384", 3.5, BASE, candidate_meta=meta("incumbent"))]  # fmt: skip
    record, _, reason = promote.decide(incumbent + slower, SHAPES, current, ENV, fix="fixed")
    assert record is None and "fixed (geomean" in reason and "slower than the promoted incumbent on T=16384" in reason
    stranger = [_rec("stranger", s, 3.02, BASE, candidate_meta=meta("someone_else")) for s in SHAPES]
    record, _, reason = promote.decide(incumbent + stranger, SHAPES, current, ENV, fix="stranger")
    assert record is None and reason.startswith("incumbent stays promoted (best again")
    assert ("stranger is named as a fix (promote_fix) but is not one: its CANDIDATE parent is 'someone_else', "
            "not the promoted incumbent") in reason  # fmt: skip
    above = [_rec("stranger", s, 2.95, BASE, candidate_meta=meta("someone_else")) for s in SHAPES]
    record, _, reason = promote.decide(incumbent + above, SHAPES, current, ENV, fix="stranger")  # the usual rule
    assert record is None and "stranger (geomean 1.695x) not promoted: not faster than the promoted" in reason


def test_promote_fix_must_name_a_candidate_of_the_run_and_is_not_the_nightlys(tmp_path):
    from harness import candidates, nightly, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    found = [candidates.load(REPO_ROOT / "tests/fixtures/fuse_norm/correct.py", task.name, task.op_name)]
    settings = runner.EvaluationSettings(device="cpu", results_dir=str(tmp_path), promote_fix="corect")
    with pytest.raises(runner.UsageError, match=r"promote_fix names 'corect', which is not a candidate of this run: "
                                                r"\['correct'\]"):  # fmt: skip
        runner.evaluate(task, found, settings, echo=lambda _: None)
    assert not any(tmp_path.iterdir()), "nothing may run or be written on bad input"
    with pytest.raises(runner.UsageError, match="promote_fix is a human's call on one task's run"):
        nightly.NightlySettings(promote_fix="correct")


def _router_run(run_id: str):
    from tasks import TASKS

    results = REPO_ROOT / "results" / "router_gemm"
    records = [r for r in read(results / RECORDS_FILE, EvaluationRecord)[0] if r.run_id == run_id]
    return records, [s.label for s in TASKS["router_gemm"].shapes]


def test_the_sixteenth_session_router_promotions_replayed():
    """Committed H200 records: bit_split replaced swap_ab_bf16x3 (T=64 7.73 against 9.29 us, T=1000
    33.66 against 48.01), which the rule still allows; narrow_tiles then replaced bit_split on a geomean
    0.3% higher with every shape within noise, which it now refuses."""
    history = promote.history("router_gemm", REPO_ROOT / "results")
    records, shapes = _router_run("20261202T115525-2e55be")
    current = [p for p in history if p.candidate == "swap_ab_bf16x3"][-1]  # after `harness rehash`
    record, _, _ = promote.decide(records, shapes, current, records[0].environment)
    assert record is not None and record.candidate == "bit_split"
    records, shapes = _router_run("20261202T120325-8eeea2")
    current = next(p for p in history if p.candidate == "bit_split")
    record, _, reason = promote.decide(records, shapes, current, records[0].environment)
    assert record is None and reason.startswith("bit_split stays promoted")
    assert "narrow_tiles (geomean" in reason and "not faster than the promoted bit_split on any shape" in reason


@pytest.mark.parametrize(
    ("run_id", "incumbent", "challenger", "slower"),
    [("20261202T065658-e9a046", "splitk_bf16x3", "row_vector", "T=64"),
     ("20261202T070842-823784", "row_vector", "swap_ab_bf16x3", "T=1000")],
)  # fmt: skip
def test_the_router_promotions_of_the_fifteenth_session_would_now_be_refused(run_id, incumbent, challenger, slower):
    """Committed H200 records: row_vector was promoted with T=64 at 16.28 us against the promoted
    splitk_bf16x3's 9.82 in the same run, swap_ab_bf16x3 with T=1000 at 48.34 against row_vector's 44.92."""
    records, shapes = _router_run(run_id)
    current = next(p for p in promote.history("router_gemm", REPO_ROOT / "results") if p.candidate == incumbent)
    record, _, reason = promote.decide(records, shapes, current, records[0].environment)
    assert record is None and f"{incumbent} stays promoted" in reason
    assert f"{challenger} (geomean" in reason and f"slower than the promoted {incumbent} on {slower}:" in reason
    # the rule this replaced, the best geomean whatever it slowed, is what is left with no kernel in force
    assert promote.decide(records, shapes, None, records[0].environment)[0].candidate == challenger


def test_a_promoted_candidate_that_fails_parity_is_withdrawn(tmp_path):
    current = _promotion("incumbent")
    failing = [
        _rec("incumbent", s, 3.0, BASE, status=Status.MISMATCH, detail="after a reference fix", timing=None,
             baselines_us={}, speedups={}) for s in SHAPES
    ]  # fmt: skip
    record, _, reason = promote.decide(failing, SHAPES, current, ENV)
    assert record.action == "withdraw" and record.content_hash == current.content_hash
    assert record.evidence == [r.record_id for r in failing] and "after a reference fix" in reason
    path = tmp_path / "fuse_norm" / PROMOTIONS_FILE
    append(path, current)
    assert promote.promoted("fuse_norm", tmp_path) == current
    append(path, record)
    assert promote.promoted("fuse_norm", tmp_path) is None
    assert [p.action for p in promote.history("fuse_norm", tmp_path)] == ["promote", "withdraw"]


def test_promotions_are_kept_per_gpu_and_a_gpu_without_its_own_runs_with_another_gpus(tmp_path):
    """An H100 runner's decisions move the H100's promotion only: the H200's kernel in force is neither replaced
    nor withdrawn by them. Until the H100 has a history of its own, the newest promotion in force on another
    GPU stands in there (and for a CPU build), and the H100's first run must evaluate it to promote anything."""
    h100 = {"device": "NVIDIA H100 80GB HBM3"}
    path = tmp_path / "fuse_norm" / PROMOTIONS_FILE
    on_h200 = _promotion("incumbent")
    append(path, on_h200)
    assert promote.promoted("fuse_norm", tmp_path, "NVIDIA H200") == on_h200
    assert promote.promoted("fuse_norm", tmp_path, h100["device"]) == on_h200  # standing in
    assert promote.promoted("fuse_norm", tmp_path) == on_h200  # no GPU named: a CPU build
    challenger = [_rec("challenger", s, 2.0, BASE, environment=h100) for s in SHAPES]
    record, _, reason = promote.decide(challenger, SHAPES, on_h200, h100)
    assert (
        record is None
        and "is promoted on the NVIDIA H200 (standing in: this GPU has no promotion of its own)" in reason
    )
    alone = [_rec("incumbent", s, 3.0, BASE, environment=h100) for s in SHAPES]
    assert promote.decide(alone, SHAPES, on_h200, h100)[2].startswith("incumbent stays promoted on the NVIDIA H200 (")
    both = challenger + [_rec("incumbent", s, 3.0, BASE, environment=h100) for s in SHAPES]
    record, _, _ = promote.decide(both, SHAPES, on_h200, h100)
    assert record.candidate == "challenger" and promote.gpu_of(record) == "NVIDIA H100 80GB HBM3"
    append(path, record)
    assert promote.promoted("fuse_norm", tmp_path, h100["device"]) == record
    assert promote.promoted("fuse_norm", tmp_path, "NVIDIA H200") == on_h200  # untouched
    assert promote.promoted("fuse_norm", tmp_path, "NVIDIA B200") == record  # the newest in force stands in
    # the H100 withdraws its kernel after a parity failure there: nothing in force on the H100, and neither the
    # H200's promotion nor the stand-in for other GPUs comes back to it
    failing = [_rec("challenger", s, 3.0, BASE, environment=h100, status=Status.MISMATCH, detail="1 ulp",
                    timing=None, baselines_us={}, speedups={}) for s in SHAPES]  # fmt: skip
    withdrawal, _, _ = promote.decide(failing, SHAPES, record, h100)
    append(path, withdrawal)
    assert promote.promoted("fuse_norm", tmp_path, h100["device"]) is None
    assert promote.promoted("fuse_norm", tmp_path, "NVIDIA H200") == on_h200
    assert promote.promoted("fuse_norm", tmp_path, "NVIDIA B200") == on_h200 == promote.promoted("fuse_norm", tmp_path)
    assert list(promote.latest_by_gpu("fuse_norm", tmp_path)) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]


def test_no_promotion_from_a_cpu_run():
    records = [_rec("fast", s, 3.0, BASE, device="cpu", policy="interpreter", timing=None, baselines_us={},
                    speedups={}, timing_skipped="no CUDA GPU") for s in SHAPES]  # fmt: skip
    record, _, reason = promote.decide(records, SHAPES, None, ENV)
    assert record is None and reason == "no promotion without GPU timings"


# ---- the benchmark's methodology, with fake windows (the device parts run on the GPU below) -----------
def test_quantiles_floor_and_rotations():
    assert bench.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert bench.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2) == pytest.approx(1.8)
    # 41 KB at 4275 GB/s; a GEMM-bound shape takes the compute side
    assert bench.floor_us(40_980, 0, 4275.0, None) == pytest.approx(40_980 / 4275e3)
    assert bench.floor_us(1_000, 2 * 10**12, 4275.0, 700.0) == pytest.approx(2e12 / 700e6)
    settings = bench.BenchSettings()
    l2 = 60 << 20
    assert bench.rotation_count(40_000, l2, settings) == settings.rotations_max  # tiny sets: capped
    assert bench.rotation_count(10 << 20, l2, settings) == 12  # cover 2x the L2
    assert bench.rotation_count(700 << 20, l2, settings) == 1  # a set larger than the L2: no rotation needed


def test_an_event_window_holds_the_gpu_until_its_calls_are_queued(monkeypatch):
    """The spin kernel is queued before the start event, and grows to cover the host's enqueue time
    (harness/bench.py: slow launches in the sandboxed child were timed as the kernel's time)."""
    import time as _time

    log: list[tuple] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool):
            self.t = None

        def record(self):
            self.t = _time.perf_counter()
            log.append(("record",))

        def synchronize(self):
            pass

        def elapsed_time(self, other) -> float:
            return (other.t - self.t) * 1e3

    monkeypatch.setattr(bench, "_Event", FakeEvent)
    monkeypatch.setattr(bench, "_synchronize", lambda: None)
    monkeypatch.setattr(bench, "_spin", lambda cycles: log.append(("spin", cycles)))
    monkeypatch.setattr(bench.GpuHold, "_calibrate", lambda self: 2000.0)  # 2 GHz: 2000 cycles per us

    def slow_launch(**inputs):
        _time.sleep(0.002)  # a 2 ms launch path on the host
        log.append(("call", inputs["i"]))

    settings = bench.BenchSettings(event_calls=3)
    timer = bench._event_timer("slow", slow_launch, [{"i": 0}, {"i": 1}], settings, None, None)
    log.clear()
    timer.window()
    first_spin = log[0]
    assert first_spin == ("spin", int(bench.GpuHold.HOLD_MIN_US * 2000))
    assert [e[0] for e in log] == ["spin", "record", "call", "call", "call", "record"]
    log.clear()
    timer.window()
    _, cycles = log[0]
    assert cycles >= 1.5 * 3 * 2000 * 2000  # 1.5 x three 2 ms launches, in cycles: the calls are queued in time
    assert [e[1] for e in log if e[0] == "call"] == [1, 0, 1]  # inputs keep rotating across windows


def _clock_events(clock: list[float], on_synchronize=lambda event: None):
    """CUDA events that read a fake GPU clock in us (clock[0]), which the fake kernels advance."""

    class ClockEvent:
        def __init__(self, enable_timing: bool):
            self.t = 0.0

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            on_synchronize(self)

        def elapsed_time(self, other) -> float:
            return (other.t - self.t) / 1e3

    return ClockEvent


@pytest.mark.parametrize(("gpu_us", "calls"), [(5.0, 100), (25.0, 80), (190.0, 11), (900.0, 3)])
def test_event_windows_grow_to_their_gpu_time_target(monkeypatch, gpu_us, calls):
    """Short calls are batched until a window holds window_us of GPU time (at least event_calls, at
    most event_calls_max), sized in the warm-up; every timed window then has that many calls, and
    the L2 is swept by reading before each. The window closes with its end event; the device is
    never synchronized."""
    clock = [0.0]
    sizes: list[int] = []
    syncs: list[str] = []

    class FakeFlush:
        reads = 0

        def sum(self):
            FakeFlush.reads += 1

    def kernel(**_):
        clock[0] += gpu_us
        sizes[-1] += 1

    monkeypatch.setattr(bench, "_Event", _clock_events(clock, on_synchronize=lambda event: sizes.append(0)))
    monkeypatch.setattr(bench, "_synchronize", lambda: syncs.append("device sync"))
    monkeypatch.setattr(bench, "_spin", lambda cycles: None)
    monkeypatch.setattr(bench.GpuHold, "_calibrate", lambda self: 2000.0)
    sizes.append(0)
    settings = bench.BenchSettings(warmup_windows=2, samples=10, min_samples=10, window_us=2000.0)
    timer = bench._event_timer("k", kernel, [{}], settings, FakeFlush(), None)
    (timing,) = bench.time_interleaved([timer], settings).values()
    assert timing.calls_per_window == calls and sizes[-11:-1] == [calls] * 10, sizes
    assert FakeFlush.reads == len(sizes) - 1  # one sweep per window, warm-up included
    assert timing.p50_us == pytest.approx(gpu_us) and not syncs
    with pytest.raises(ValueError, match="event_calls_max=2 is below event_calls=3"):
        bench.BenchSettings(event_calls_max=2)


def test_an_event_windows_end_event_waits_for_the_streams_the_calls_used(monkeypatch):
    """A call that leaves 300 us of work on another stream: the streams made since watch_streams() are
    joined before the end event, so the window ends when that work does; the device synchronization
    after the end event is not timed."""
    clock = [0.0]
    pending = [0.0]
    log: list[str] = []

    def split_work(**_):
        clock[0] += 20.0  # 20 us on the timed stream
        pending[0] += 300.0  # and 300 us on another

    def join():
        log.append("join")
        clock[0] += pending[0]
        pending[0] = 0.0

    monkeypatch.setattr(bench, "_Event", _clock_events(clock, on_synchronize=lambda event: log.append("end")))
    monkeypatch.setattr(bench, "_join_made_streams", join)
    monkeypatch.setattr(bench, "_synchronize", lambda: log.append("device sync"))
    monkeypatch.setattr(bench, "_spin", lambda cycles: None)
    monkeypatch.setattr(bench.GpuHold, "_calibrate", lambda self: 2000.0)
    settings = bench.BenchSettings(warmup_windows=1, samples=10, min_samples=10, event_calls=3, event_calls_max=3)
    timer = bench._event_timer("k", split_work, [{}], settings, None, None)
    (timing,) = bench.time_interleaved([timer], settings).values()
    assert timing.p50_us == pytest.approx(320.0)
    assert log == ["join", "end"] * 11  # joined before every end event; no device synchronization


def test_watch_streams_remembers_the_streams_made_after_it_once_each(monkeypatch):
    """Pool streams (handed out in turn) and external handles are remembered by handle; torch's wrappers
    of existing streams (they pass stream_id: current_stream(), default_stream()) are not; the
    harness's own side stream is not, unless the code being timed made that pool stream too."""
    import torch

    pool = iter([100, 101, 100, 102, 100])

    class FakeStream:
        def __new__(cls, device=None, priority=0, **kwargs):
            stream = super().__new__(cls)
            stream.cuda_stream = kwargs.get("stream_ptr", kwargs.get("stream_id")) or next(pool)
            return stream

    class FakeExternal(FakeStream):
        def __new__(cls, stream_ptr, device=None, **kwargs):
            return super().__new__(cls, stream_ptr=stream_ptr, **kwargs)

    monkeypatch.setattr(bench, "_made_streams", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    FakeStream()  # 100, before watching
    bench.watch_streams(FakeStream)
    first, again = FakeStream(), FakeStream()  # 101, then 100 again
    external = FakeExternal(7)
    FakeStream(stream_id=5)  # a wrapper of the current stream
    assert bench._made_streams == {101: first, 100: again, 7: external}
    assert bench._own_stream().cuda_stream == 102 and 102 not in bench._made_streams  # the harness's own
    assert bench._own_stream().cuda_stream == 100 and 100 in bench._made_streams  # shared with the timed code: kept


@pytest.mark.parametrize(("gpu_us", "replays"), [(1.5, 14), (3.0, 7), (30.0, 1), (0.1, 50)])
def test_graph_windows_replay_the_graph_until_they_hold_their_gpu_time(monkeypatch, gpu_us, replays):
    """A decode-size window replays its 100-call graph back to back until it holds window_us of GPU
    time (at most graph_replays_max times), sized from one replay of the warm-up: 2000 / (100 x 1.5)
    -> 14. The end event follows the last replay; no device synchronization is timed."""
    clock = [0.0]
    per_window: list[int] = [0]
    log: list[str] = []

    def replay():
        clock[0] += 100 * gpu_us
        per_window[-1] += 1

    def end_of_window(*_):
        per_window.append(0)

    monkeypatch.setattr(bench, "_Event", _clock_events(clock, on_synchronize=end_of_window))
    monkeypatch.setattr(bench, "_synchronize", lambda: log.append("device sync"))
    monkeypatch.setattr(bench, "_spin", lambda cycles: log.append("spin"))
    monkeypatch.setattr(bench.GpuHold, "_calibrate", lambda self: 2000.0)
    settings = bench.BenchSettings(warmup_windows=2, samples=10, min_samples=10, window_us=2000.0)
    timer = bench._replay_timer("k", replay, settings)
    (timing,) = bench.time_interleaved([timer], settings).values()
    assert timing.method == "cuda_graph" and timing.calls_per_window == 100 * replays, timing
    assert per_window[-11:-1] == [replays] * 10, per_window
    assert timing.p50_us == pytest.approx(gpu_us)
    assert set(log) == {"spin"}  # the GPU is held while the replays are queued; the device is never synchronized


def test_the_ceilings_are_timed_between_stream_events_with_the_gpu_held(monkeypatch):
    log: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool):
            pass

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("event sync")

        def elapsed_time(self, other) -> float:
            return 0.25

    monkeypatch.setattr(bench, "_Event", FakeEvent)
    monkeypatch.setattr(bench, "_synchronize", lambda: log.append("device sync"))
    monkeypatch.setattr(bench, "_spin", lambda cycles: log.append("spin"))
    monkeypatch.setattr(bench.GpuHold, "_calibrate", lambda self: 2000.0)
    assert bench._events_ms(lambda: log.append("copy"), 2) == [0.25, 0.25]
    assert log == ["spin", "record", "copy", "record", "event sync"] * 2  # no synchronization inside


def test_timers_are_sampled_round_robin_and_a_failing_one_is_dropped(monkeypatch):
    monkeypatch.setattr(bench, "_synchronize", lambda: None)  # no device here
    order: list[str] = []

    def window(name: str, us: float, fail_after: int | None = None):
        calls = [0]

        def run() -> float:
            calls[0] += 1
            order.append(name)
            if fail_after is not None and calls[0] > fail_after:
                raise RuntimeError(f"{name} broke")
            return us + calls[0] % 3 * 0.1

        return bench._Timer(name, run, "cuda_graph", 100)

    timers = [window("a", 2.0), window("b", 5.0), window("c", 1.0, fail_after=5)]
    settings = bench.BenchSettings(warmup_windows=2, samples=12, min_samples=10)
    results = bench.time_interleaved(timers, settings)
    assert results["c"] == "RuntimeError: c broke"
    a, b = results["a"], results["b"]
    assert a.samples == b.samples == 12 and a.method == "cuda_graph" and a.calls_per_window == 100
    assert 2.0 <= a.p20_us <= a.p50_us <= a.p80_us <= 2.2 and b.p50_us > a.p50_us
    sampled = order[2 * 3 :]  # after the warm-up windows, each round starts one implementation later
    assert sampled[:3] == ["a", "b", "c"] and sampled[3:6] == ["b", "c", "a"]


def test_the_compile_peer_stays_compiled_on_every_shape_or_fails_loudly():
    """Dynamo's recompile limit (8) would make shapes past the 8th run eagerly under the compile name.
    In a fresh interpreter: the baselines' setup, then 12 shapes of one function, all compiled."""
    script = """
import torch
from harness import child
from tasks import get_task
child.baseline_impls(get_task("fuse_norm"), torch, ["torch_compile"], 12, None)
graphs = []
def backend(gm, example_inputs):
    graphs.append(gm)
    return gm.forward
f = lambda x: (x * 2).sum()
for n in range(1, 13):
    torch.compile(f, dynamic=False, backend=backend)(torch.ones(n))
print(len(graphs), torch._dynamo.config.fail_on_recompile_limit_hit)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["12", "True"], out.stderr[-2000:]


def test_a_time_somewhat_below_the_copy_floor_is_plausible_far_below_it_is_suspicious():
    assert not bench.is_suspicious(9.3, 10.0)  # 108% of the floor: a read-mostly kernel (H200, moe_experts)
    assert bench.is_suspicious(5.0, 10.0)  # twice the bandwidth: work skipped, or a broken measurement


# ---- the GPU records path, from a benchmark child's report (no GPU needed to build the records) ------
def _records_from_a_bench_report(tmp_path, labels: list[str], timings: dict[str, dict[str, dict]], launches=None,
                                 autotuned: dict | None = None):  # fmt: skip
    """fuse_norm records of the fixture candidate, built from a benchmark child's report whose timing events
    carry `timings[label]` (implementation -> Timing fields), and its launches events `launches[label]` where
    given (implementation -> counts by kind, or why not counted), and the autotuned event `autotuned` where
    given, everything passing parity."""
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cand = candidates.load(REPO_ROOT / "tests/fixtures/fuse_norm/correct.py", task.name, task.op_name)
    with runner._Evaluation(task, [cand], runner.EvaluationSettings(device="cpu", results_dir=str(tmp_path))) as ev:
        ev.device, ev.on_gpu, ev.shapes = "cuda", True, [task.shape(label, "cuda") for label in labels]
        unit = ev.units[0]
        events = [
            {"event": "isolation", "layers": {"audit_hook": "active"}},
            {"event": "imported", "cheats": []},
            {"event": "roofline", "copy_gbps": 4275.0, "gemm_tflops": None},
            *({"event": "timing", "shape": label, "results": timings[label]} for label in labels),
            *({"event": "launches", "shape": label, "results": counts} for label, counts in (launches or {}).items()),
            *([{"event": "autotuned", **autotuned}] if autotuned else []),
            {"event": "done", "violations": []},
        ]  # fmt: skip
        for label in labels:
            unit.status[label] = (Status.PASSED, "")
            unit.verdicts[label] = [parity.CallParity(True, "nearest", {"x_TD": parity.OutputParity("x_TD", True, "")})]
        ev._read_bench(unit, sandbox.ChildRun(0, False, 1.0, events, ""), labels)
        return task, ev, ev.records({"device": "NVIDIA H200"}, None)


def _timed(method: str, **p50s: float) -> dict[str, dict]:
    return {name: {**_t(p50), "method": method, "samples": 40, "calls_per_window": 100, "note": None}
            for name, p50 in p50s.items()}  # fmt: skip


def _run_table(ev, task, records, promotion) -> str:
    from harness import runner
    from harness.run_cmd import format_run

    result = runner.RunResult(
        RunRecord(run_id=ev.run_id, task=task.name, device="cuda", settings={}, candidates={}, statuses={},
                  wall_s=1.0, environment={}, promoted=promotion.content_hash if promotion else None),
        tuple(records), promotion, promotion.reason if promotion else "", (),
    )  # fmt: skip
    return format_run(result)


def test_gpu_timings_become_speedups_floor_fractions_and_a_promotion(tmp_path):
    timing = _timed("cuda_graph", reference=10.0, torch_compile=6.0, candidate=3.0)
    task, ev, records = _records_from_a_bench_report(tmp_path, ["T=1", "T=8"], {"T=1": timing, "T=8": timing})
    first = records[0]
    assert first.timing.p50_us == 3.0 and first.speedups == {"reference": 10.0 / 3.0, "torch_compile": 2.0}
    cost = task.cost(ev.shapes[0])
    assert first.floor_us == pytest.approx(cost.bytes / 4275e3) and first.floor_fraction == pytest.approx(
        first.floor_us / 3.0
    )
    assert not first.suspicious and first.copy_gbps == 4275.0
    promotion, _, _ = promote.decide(records, [s.label for s in ev.shapes], None, {})
    assert promotion is not None and promotion.candidate == "correct"
    table = _run_table(ev, task, records, promotion)
    assert "3.00 us (2.94-3.06)" in table and "3.33x (10.00 us)" in table and "2.00x (6.00 us)" in table
    assert "PROMOTED" in table and "timed again beside it" in table
    # the task's goals, this run's candidate against each on the shapes it ran: fuse_norm's T=1 bar is 2.3 us (its
    # T=16384 was not run: no row), and bit-exactness at T=1 and 8 (these records' parity figures do not count it)
    goal_rows = table.split("Goals (p50 in this run; tasks/fuse_norm.py):\n")[1].splitlines()
    assert [" ".join(row.split()) for row in goal_rows[1:4]] == [
        "T=1 p50 <= 2.3 us 3.00 us, missed by 0.70 (30.4%)",
        "T=1 bit-exact bit-exactness not recorded, missed",
        "T=8 bit-exact bit-exactness not recorded, missed",
    ] and goal_rows[4].startswith("Promotion: ")


def test_a_copy_of_the_same_bytes_is_a_floor_of_the_record_not_a_baseline_to_beat(tmp_path):
    """The benchmark child's same-bytes copy, graph-replayed or event-timed, becomes copy_floor_us and its
    fraction on every record of that shape; it is neither a baseline nor a speedup, so it never blocks a
    promotion. Where it was not timed (its buffers did not fit) the records say why and carry no fraction."""
    decode = _timed("cuda_graph", reference=40.0, torch_compile=3.0, candidate=2.5, **{bench.SAME_BYTES_COPY: 2.0})
    large = _timed("events", reference=3000.0, torch_compile=185.0, candidate=170.0, **{bench.SAME_BYTES_COPY: 163.2})
    unfit = bench.same_bytes_copy_unfit(2 * 2**30, 3 * 2**30)
    middle = {**_timed("events", reference=120.0, torch_compile=15.0, candidate=12.0), bench.SAME_BYTES_COPY: unfit}
    timings = {"T=1": decode, "T=1000": middle, "T=16384": large}
    task, ev, (small, mid, big) = _records_from_a_bench_report(tmp_path, list(timings), timings)
    assert small.copy_floor_us == 2.0 and small.copy_floor_fraction == pytest.approx(0.8)
    assert small.floor_fraction < 0.01  # the roofline: 60 KB at the copy rate, a sliver of the call
    assert set(small.baselines_us) == set(small.speedups) == {"reference", "torch_compile"}
    assert not small.baseline_notes
    assert big.copy_floor_us == 163.2 and big.copy_floor_fraction == pytest.approx(0.96)
    assert set(big.baselines_us) == {"reference", "torch_compile"}
    assert mid.copy_floor_us is None and mid.copy_floor_fraction is None
    assert mid.baseline_notes == {bench.SAME_BYTES_COPY: unfit}
    promotion, _, why = promote.decide([small, mid, big], list(timings), None, {})
    assert promotion is not None, why  # the copy is not a baseline the candidate had to beat
    table = _run_table(ev, task, (small, mid, big), None)
    assert "copy floor" in table and " 80% " in table and " 96% " in table
    assert "one kernel moving the same bytes" in table and bench.SAME_BYTES_COPY not in table


def test_what_one_call_launches_reaches_its_record_and_the_run_table(tmp_path):
    """The benchmark child's launches events (bench.launches_per_call) become each record's `launches`, or its
    `launches_note` where the call could not be captured; the run table shows the count by kind."""
    timing = _timed("cuda_graph", reference=10.0, torch_compile=6.0, candidate=3.0)
    launches = {
        "T=1": {"candidate": {"kernel": 1}, "reference": {"kernel": 9, "memcpy": 1}},
        "T=8": {"candidate": "not counted: RuntimeError: operation not permitted when stream is capturing"},
    }
    task, ev, (t1, t8) = _records_from_a_bench_report(tmp_path, ["T=1", "T=8"], {"T=1": timing, "T=8": timing},
                                                      launches)  # fmt: skip
    assert t1.launches == {"kernel": 1} and t1.launches_note is None
    assert t8.launches is None and t8.launches_note.startswith("not counted: RuntimeError: operation not permitted")
    assert EvaluationRecord(**json.loads(json.dumps(t1.to_dict()))).launches == {"kernel": 1}  # a JSON round trip
    table = _run_table(ev, task, (t1, t8), None)
    (t1_row, t8_row) = [line for line in table.splitlines() if line.lstrip().startswith("correct")]
    assert " - 1 kernel beats" in t1_row and " - not counted " in t8_row, table  # after the copy floor column
    assert "launches: what one call puts on the GPU" in table
    assert launches_text({"kernel": 9, "memcpy": 1}) == "10 (9 kernels, 1 memcpy)"
    assert launches_text({"memset": 2}) == "2 memsets" and launches_text({}) == "0 (no GPU work)"
    # the review's timing table: the candidate's count, and each baseline's from the baselines child's record of it
    from harness import report

    reference = dataclasses.replace(t1, implementation="reference", kind="reference", launches={"kernel": 24})
    rows = report.timing_table([t1, t8], "correct", {}, None, [t1, t8, reference])
    launches_at = rows.headers.index("launches")
    assert rows.headers[launches_at - 1 : launches_at + 2] == ("noise", "launches", "candidate speedup")
    assert [(row[0], row[1], row[launches_at]) for row in rows.rows] == [
        ("`T=1`", "`correct` (candidate)", "1 kernel"), ("`T=1`", "reference", "24 kernels"),
        ("`T=1`", "torch_compile", "-"), ("`T=8`", "`correct` (candidate)", "not counted"),
        ("`T=8`", "reference", "-"), ("`T=8`", "torch_compile", "-"),
    ]  # fmt: skip
    # without counts (records before the thirty-sixth session) the column is left out
    _, ev, plain = _records_from_a_bench_report(tmp_path, ["T=1"], {"T=1": timing})
    assert plain[0].launches is None and "launches" not in _run_table(ev, task, plain, None)
    assert "launches" not in report.timing_table(plain, "correct", {}, None, plain).headers


def test_the_same_bytes_copy_is_timed_where_its_buffers_take_at_most_half_the_free_memory():
    assert bench.same_bytes_copy_unfit(671 * 2**20, 130 * 2**30) is None  # fuse_norm T = 16384 on an H200
    assert bench.same_bytes_copy_unfit(4 * 2**30, 8 * 2**30) is None  # exactly half
    why = bench.same_bytes_copy_unfit(4 * 2**30 + 1, 8 * 2**30)
    assert why == (
        "not timed: its buffers (4.00 GiB) would take more than 50% of the 8.00 GiB of GPU memory "
        "left free by the inputs"
    )


# ---- on the GPU: `python -m pytest -m gpu tests/test_runner.py` ---------------------------------------
def test_the_benchmark_child_reports_what_each_autotuner_chose():
    import types

    import triton
    import triton.language as tl

    from harness import child

    @triton.jit
    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), 0.0, mask=tl.arange(0, BLOCK) < n)

    configs = [triton.Config({"BLOCK": 64}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=2)]
    tuned = triton.autotune(configs=configs, key=["n"])(kernel)
    untouched = triton.autotune(configs=configs, key=["n"])(kernel)
    tuned.cache[(100, "torch.float32")] = configs[1]  # as Autotuner.run leaves it after benchmarking
    module = types.SimpleNamespace(_tuned=tuned, _untouched=untouched, helper=kernel)
    choices = child.autotuned_choices(module)
    assert choices == {"_tuned": {"(100, 'torch.float32')": str(configs[1])}}
    assert "BLOCK: 128" in choices["_tuned"]["(100, 'torch.float32')"]


@pytest.mark.gpu
def test_gpu_run_times_a_real_candidate_against_every_baseline(tmp_path):
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    found = candidates.resolve(task.name, task.op_name, ("row_per_program",))
    settings = runner.EvaluationSettings(
        device="cuda", shapes=("T=1", "T=16384"), seeds=(1, 2), results_dir=str(tmp_path), promote=False,
        bench=bench.BenchSettings(samples=15, min_samples=10, max_seconds=3.0),
    )  # fmt: skip
    lines: list[str] = []
    result = runner.evaluate(task, found, settings, echo=lines.append)
    # The benchmark child's peers come as the baselines child built them: both torch.compile graphs
    # loaded (none compiled again, no failed load), flashinfer's norm module not rebuilt.
    warmed = next(line for line in lines if "bench child" in line)
    assert "torch.compile graphs: 2 from the baselines child's artifacts, 0 compiled" in warmed, warmed
    assert "first failed load" not in warmed and "flashinfer modules prebuilt: norm" in warmed, warmed
    by_name = {(r.implementation, r.shape_label): r for r in result.records}
    for label in ("T=1", "T=16384"):
        cand = by_name[("row_per_program", label)]
        assert cand.status is Status.PASSED, cand.detail
        assert cand.timing is not None and {"reference", "torch_compile"} <= set(cand.baselines_us)
        assert cand.timing.method == ("cuda_graph" if label == "T=1" else "events")
        assert 1000 < cand.copy_gbps < 10_000 and 0 < cand.floor_fraction
        assert by_name[("reference", label)].timing is not None
        assert set(cand.autotuned) == {"_fuse_norm_kernel"} and cand.autotuned["_fuse_norm_kernel"], cand.autotuned
        # Inductor's fused arithmetic misses the bit-exact gate of fuse_norm (results/README.md): recorded,
        # and still timed as the peer every candidate must beat.
        compiled = by_name[("torch_compile", label)]
        assert compiled.status in (Status.PASSED, Status.MISMATCH) and compiled.timing is not None
        # what one call launches: the fused kernel once; the eager reference a chain of kernels
        assert cand.launches == {"kernel": 1}, (cand.launches, cand.launches_note)
        reference = by_name[("reference", label)].launches
        assert reference is not None and reference.get("kernel", 0) > 3, reference
        assert compiled.launches is not None and compiled.launches.get("kernel", 0) >= 1, compiled.launches
    assert result.run.device == "cuda"


def test_the_bench_child_notes_the_autotuning_keys_each_shape_reads_and_each_record_holds_its_own(tmp_path):
    """child.KeyLog on a real Triton autotuner (its launches stubbed: no GPU), then the runner: each record holds
    the picks its shape's calls read; a shape that read none (or a child before KeyLog) holds all of them."""
    import torch
    import triton
    import triton.language as tl

    from harness.child import KeyLog, autotuned_choices

    @triton.jit
    def _rows_kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    tuner = triton.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])(_rows_kernel)
    small, large = tuner.configs
    tuner.cache.update({(8, "torch.float32"): small, (1024, "torch.float32"): large})  # tuned already
    launched = []
    tuner.fn = types.SimpleNamespace(run=lambda *args, **kw: launched.append(kw["BLOCK"]))
    keys = KeyLog({"_rows_kernel": tuner})
    x = torch.zeros(4)
    with keys.timing("T=8"):
        tuner.run(x, 8, grid=(1,))
        tuner.run(x, 8, grid=(1,))
    with keys.timing("T=1000"):
        tuner.run(x, 1024, grid=(1,))
    tuner.run(x, 1024, grid=(1,))  # outside any shape's timing: not noted
    assert launched == [16, 16, 32, 32]  # the autotuner ran as before
    picks = keys.picks()
    assert picks == {"T=8": {"_rows_kernel": {"(8, 'torch.float32')": str(small)}},
                     "T=1000": {"_rows_kernel": {"(1024, 'torch.float32')": str(large)}}}  # fmt: skip
    every = autotuned_choices(types.SimpleNamespace(_rows_kernel=tuner))
    assert every == {"_rows_kernel": {**picks["T=8"]["_rows_kernel"], **picks["T=1000"]["_rows_kernel"]}}
    timing = _timed("cuda_graph", reference=10.0, torch_compile=6.0, candidate=3.0)
    report = {"kernels": every, "by_shape": {"T=8": picks["T=8"]}}
    _, _, (t1, t8) = _records_from_a_bench_report(tmp_path, ["T=1", "T=8"], {"T=1": timing, "T=8": timing},
                                                   autotuned=report)  # fmt: skip
    assert t8.autotuned == picks["T=8"] and t1.autotuned == every
    _, _, (old,) = _records_from_a_bench_report(tmp_path, ["T=8"], {"T=8": timing}, autotuned={"kernels": every})
    assert old.autotuned == every


@pytest.mark.gpu
def test_gpu_launches_are_counted_from_a_graph_of_one_call():
    """Kernels, memcpys and side-stream work are counted; what a call sets up once per stream is not; a call
    that synchronizes with the host cannot be captured and says so."""
    import torch

    x = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    workspaces: dict[int, torch.Tensor] = {}

    def on_a_side_stream(x):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
        return y + 1

    def with_a_workspace(x):  # zeroed on the first call on each stream only
        stream = torch.cuda.current_stream().cuda_stream
        if stream not in workspaces:
            workspaces[stream] = torch.zeros_like(x)
        return workspaces[stream].add_(x)

    counted = bench.launches_per_call({
        "add": lambda x: x + 1, "clone": lambda x: x.clone(), "side": on_a_side_stream,
        "workspace": with_a_workspace, "host_sync": lambda x: x + x.sum().item(),
    }, {"x": x})  # fmt: skip
    assert counted["add"] == {"kernel": 1} and counted["clone"] == {"memcpy": 1}
    assert counted["side"] == {"kernel": 2} and counted["workspace"] == {"kernel": 1}, counted
    assert counted["host_sync"].startswith("not counted: "), counted["host_sync"]
    assert bench.launches_per_call({"add": lambda x: x + 1}, {"x": x}) == {"add": {"kernel": 1}}  # after a failure


@pytest.mark.gpu
def test_gpu_event_windows_time_the_gpu_not_a_slow_launch():
    """A 1 ms host launch path before a ~100 us kernel: the held window times the kernel (the
    sandboxed benchmark child's launches were timed before the hold: harness/bench.py)."""
    import time as _time

    import torch

    cycles_per_us = bench.GpuHold()._calibrate()

    def slow_launch(**_):
        _time.sleep(0.001)
        torch.cuda._sleep(int(100 * cycles_per_us))

    settings = bench.BenchSettings(samples=10, min_samples=10, event_calls=3)
    timer = bench.make_timer("slow", slow_launch, [{}], False, settings, bench.l2_flush_buffer())
    (timing,) = bench.time_interleaved([timer], settings).values()
    assert timing.method == "events" and 90 < timing.p50_us < 300, timing  # not ~1000 us: the launch is not timed
    assert timing.calls_per_window >= 10, timing  # ~2000 us of GPU time per window, not 3 calls
    assert bench.measure_copy_gbps(settings) > 3000


def test_a_shape_whose_inputs_do_not_fit_fails_for_every_implementation_and_frees_what_was_drawn(monkeypatch):
    """moe_experts on the H200 (twenty-sixth session): the trusted child ran out of GPU memory drawing a shape's
    expert weights, and the whole run died with it. Now that shape fails for each implementation, with the
    allocator's message, and whatever was drawn is released before the next shape."""
    import types
    import weakref

    import torch

    drawn = []

    class Task:
        def make_inputs(self, shape, seed, device):
            if seed > shape.params["fits"]:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.50 GiB.")
            x = torch.ones(1024)
            drawn.append(weakref.ref(x))
            return {"x": x}

    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(L2_cache_size=1 << 20)
    )
    impls = {"reference": lambda x: x, "candidate": lambda x: x}
    settings = bench.BenchSettings()
    for fits in (0, 2):  # the first set (seed 1), or the third of the rotation (seed 3), does not fit
        shape = types.SimpleNamespace(params={"T": 1, "fits": fits})
        results = bench.time_shape(Task(), shape, impls, settings, 1, None)
        assert results == dict.fromkeys(impls, "the shape's inputs did not fit in GPU memory: OutOfMemoryError: "
                                                "CUDA out of memory. Tried to allocate 12.50 GiB.")  # fmt: skip
    assert len(drawn) == 2 and all(ref() is None for ref in drawn)


def test_a_parity_child_whose_shape_inputs_do_not_fit_reports_that_shape_not_run_and_goes_on(tmp_path):
    """The same in a parity child: drawing a shape's inputs ran out of GPU memory outside any call, and the
    exception ended the child (a candidate was recorded as crashed on every shape; a trusted child failed the
    run). Now that shape alone is reported not run, with the allocator's message, and the next one runs."""
    import types

    import torch

    from harness import child
    from tasks.fuse_norm import TASK

    big = TASK.cpu_shapes[1].label

    def make_inputs(shape, seed, device):
        if shape.label == big:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.50 GiB.")
        return TASK.make_inputs(shape, seed, device)

    task = dataclasses.replace(TASK, make_inputs=make_inputs)
    events = []
    report = types.SimpleNamespace(emit=lambda event, **kw: events.append({"event": event, **kw}))
    request = {"device": "cpu", "scratch": str(tmp_path), "shapes": [s.label for s in TASK.cpu_shapes],
               "seeds": [1, 2], "settle_s": 0}  # fmt: skip
    guard = child.snapshot_identities(sys.modules[__name__])
    child.parity_loop(torch, request, task, TASK.reference, "reference", report, None, guard, [], watch_fallback=False)
    ends = [(e["event"], e["shape"], e["seed"]) for e in events if e["event"] != "call_start"]
    labels = [s.label for s in TASK.cpu_shapes]
    assert ends == [("call", labels[0], 1), ("call", labels[0], 2), ("call_error", big, 1),
                    ("call", labels[2], 1), ("call", labels[2], 2)]  # fmt: skip
    error = next(e for e in events if e["event"] == "call_error")
    assert Status(error["status"]) is Status.NOT_RUN
    assert error["message"] == ("not run: the shape's inputs did not fit in GPU memory: OutOfMemoryError: "
                                "CUDA out of memory. Tried to allocate 12.50 GiB.")  # fmt: skip


@pytest.mark.gpu
def test_gpu_shapes_time_a_copy_of_their_bytes_beside_the_implementations():
    import torch

    from tasks import get_task

    task = get_task("fuse_norm")
    settings = bench.BenchSettings(samples=10, min_samples=10, max_seconds=2.0)
    impls = {"reference": task.reference}
    small = bench.time_shape(task, task.shape("T=1", torch.device("cuda")), impls, settings, 1, None)
    copy = small[bench.SAME_BYTES_COPY]
    assert copy.method == "cuda_graph" and copy.samples == 10, copy
    # One launch moving 60 KB: at least a graph node's cost (one that stores a float took 1.06 us on the
    # H200), and less than the eager reference's chain of kernels.
    assert 0.5 < copy.p50_us < small["reference"].p50_us, (copy, small["reference"])
    big = task.shape("T=16384", torch.device("cuda"))
    large = bench.time_shape(task, big, impls, settings, 1, bench.l2_flush_buffer())
    copy = large[bench.SAME_BYTES_COPY]
    assert copy.method == "events", copy
    # 671 MB: no faster than the roofline's copy rate allows (157 us at 4275 GB/s, with 5% for a faster
    # device), and faster than the eager reference, which moves those bytes several times.
    assert 0.95 * task.cost(big).bytes / 4275e3 < copy.p50_us < large["reference"].p50_us


@pytest.mark.gpu
def test_gpu_event_windows_charge_work_left_on_another_stream(monkeypatch):
    """Each call spins 20 us on the timed stream and 500 us on a side stream it never joins: the
    window's end event waits for the side stream, which was made after watch_streams()."""
    import torch

    monkeypatch.setattr(bench, "_made_streams", {})
    monkeypatch.setattr(torch.cuda.Stream, "__new__", torch.cuda.Stream.__new__)  # restored afterwards
    bench.watch_streams()
    cycles_per_us = bench.GpuHold()._calibrate()
    side = torch.cuda.Stream()

    def split_work(**_):
        torch.cuda._sleep(int(20 * cycles_per_us))
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(500 * cycles_per_us))

    settings = bench.BenchSettings(samples=10, min_samples=10)
    timer = bench.make_timer("split", split_work, [{}], False, settings, None)
    (timing,) = bench.time_interleaved([timer], settings).values()
    assert timing.p50_us > 400, timing  # the side stream's 500 us per call, not the timed stream's 20


@pytest.mark.gpu
def test_gpu_cheats_side_streams_and_stale_memory_are_caught(tmp_path):
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    paths = [REPO_ROOT / "tests/fixtures/gpu/side_stream.py"] + [
        REPO_ROOT / f"tests/fixtures/fuse_norm/{n}.py" for n in ("stale_memory", "side_thread", "correct")
    ]
    found = [candidates.load(p, task.name, task.op_name) for p in paths]
    settings = runner.EvaluationSettings(device="cuda", shapes=("T=8",), seeds=(1, 2), results_dir=str(tmp_path),
                                         benchmark=False, baselines=False, promote=False)  # fmt: skip
    result = runner.evaluate(task, found, settings)
    status = {r.implementation: r for r in result.records}
    assert any(c.startswith("async_work") for c in status["side_stream"].cheats), status["side_stream"].detail
    assert any(c.startswith("stale_memory") for c in status["stale_memory"].cheats), status["stale_memory"].detail
    assert status["side_thread"].status is Status.CHEAT_DETECTED
    assert status["correct"].status is Status.PASSED, status["correct"].detail


@pytest.mark.gpu
def test_a_kernel_that_lets_the_next_launch_start_early_is_caught_in_the_benchmark_child(tmp_path):
    """Back to back, a kernel that triggers its dependents early (griddepcontrol.launch_dependents) would
    overlap the next timed call of itself; one that only launches as a dependent and waits is timed."""
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    found = [candidates.load(REPO_ROOT / f"tests/fixtures/gpu/{n}.py", task.name, task.op_name)
             for n in ("early_trigger", "waits_first")]  # fmt: skip
    settings = runner.EvaluationSettings(device="cuda", shapes=("T=1",), seeds=(1,), results_dir=str(tmp_path),
                                         baselines=False, promote=False)  # fmt: skip
    status = {r.implementation: r for r in runner.evaluate(task, found, settings).records}
    early = status["early_trigger"]
    assert early.status is Status.CHEAT_DETECTED, (early.status, early.detail)
    assert early.detail.startswith("in the benchmark child: early_launch_trigger: _copy_out"), early.detail
    assert early.timing is None
    waits = status["waits_first"]
    assert waits.status is Status.PASSED and waits.timing is not None, (waits.status, waits.detail)


# ---- torch.compile artifacts: the baselines child's compiles, loaded by the benchmark children ---------
PEER_SCRIPT = """
import json, sys, torch
from harness import child
from tasks import get_task
mode, path = sys.argv[1], sys.argv[2]
class Report:
    def emit(self, *args, **kwargs): raise AssertionError((args, kwargs))
task = get_task("fuse_norm")
labels = [s.label for s in task.cpu_shapes[:2]]
peer = child.baseline_impls(task, torch, ["torch_compile"], len(labels), Report())["torch_compile"]
if mode.startswith("load"):
    assert child.load_compile_artifacts(torch, path) is None
if mode == "load_denied":  # what a loaded graph met in a sandboxed child: a path it may not open
    from torch._inductor import codecache
    load = codecache.PyCodeCache.load_by_key_path
    def denied(*args, **kwargs):  # loading a cached graph fails; compiling it again works
        if sys._getframe(1).f_code.co_name == "after_deserialization":
            raise PermissionError(13, "Permission denied", "/trusted/cache/kernel.best_config")
        return load(*args, **kwargs)
    codecache.PyCodeCache.load_by_key_path = denied
with child.PeerCompileWatch() as watch:
    for label in labels:
        peer(**task.make_inputs(task.shape(label, "cpu"), 1, torch.device("cpu")))
if mode == "save":
    assert child.save_compile_artifacts(torch, path)[0] > 0
print(json.dumps(watch.summary()))
"""


def test_benchmark_children_load_the_peers_the_baselines_child_compiled(tmp_path):
    """Compile artifacts saved by one process, compiling the peers as the harness configures them,
    let another with an empty Inductor cache of its own (an isolated benchmark child's) load every
    graph instead of compiling it (CPU Inductor here); a graph that fails to load is compiled, and
    the watch says why it failed."""
    import subprocess
    import sys

    artifacts = tmp_path / "peers.bin"

    def start(mode: str, cache: str) -> subprocess.Popen:
        env = working_tree_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / cache))
        return subprocess.Popen([sys.executable, "-c", PEER_SCRIPT, mode, str(artifacts)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def summary(proc: subprocess.Popen) -> dict:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.splitlines()[-1])

    assert summary(start("save", "baselines")) == {"graphs_loaded": 0, "graphs_compiled": 2, "load_failure": None}
    loading, denied_loading = start("load", "bench"), start("load_denied", "bench-denied")  # side by side
    try:
        assert summary(loading) == {"graphs_loaded": 2, "graphs_compiled": 0, "load_failure": None}
        denied = summary(denied_loading)
    finally:
        for proc in (loading, denied_loading):  # none left behind by a failed assertion (no-op once ended)
            proc.kill()
            proc.wait()
    assert (denied["graphs_loaded"], denied["graphs_compiled"]) == (0, 2)
    assert denied["load_failure"].startswith("Failed to load artifact: ")
    assert denied["load_failure"].endswith("PermissionError: [Errno 13] Permission denied: "
                                           "'/trusted/cache/kernel.best_config'")  # fmt: skip


def test_a_benchmark_child_loads_flashinfers_modules_as_the_trusted_child_built_them(tmp_path, monkeypatch):
    """flashinfer's AOT directory is pointed at the modules in the child's copy of the workspace
    (ninja would rebuild them all there), unless flashinfer is not imported or has AOT modules."""
    import types

    from harness import child

    built, package_aot = tmp_path / "copy" / "cached_ops", tmp_path / "package" / "aot"
    for name in ("norm", "rope"):
        (built / name).mkdir(parents=True)
        (built / name / f"{name}.so").write_bytes(b"ELF")
        (built / name / f"{name}.cuda.o").write_bytes(b"object")
    (built / "page").mkdir()  # a module whose build never finished: no .so, built again on first use
    env = types.ModuleType("flashinfer.jit.env")
    env.FLASHINFER_JIT_DIR, env.FLASHINFER_AOT_DIR = built, package_aot
    monkeypatch.delitem(sys.modules, "flashinfer.jit.env", raising=False)
    assert child.use_prebuilt_flashinfer() == []  # flashinfer not imported: nothing to do, nothing imported
    assert "flashinfer.jit.env" not in sys.modules
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", env)
    assert child.use_prebuilt_flashinfer() == ["norm", "rope"]
    assert env.FLASHINFER_AOT_DIR == built
    env.FLASHINFER_AOT_DIR = package_aot
    (package_aot / "norm").mkdir(parents=True)  # flashinfer's own AOT modules win
    assert child.use_prebuilt_flashinfer() == [] and env.FLASHINFER_AOT_DIR == package_aot


def test_unusable_compile_artifacts_are_a_reason_not_a_crash(tmp_path):
    import torch

    from harness import child

    garbage = tmp_path / "peers.bin"
    garbage.write_bytes(b"not a cache")
    assert "did not deserialize" in child.load_compile_artifacts(torch, str(garbage))
    assert "FileNotFoundError" in child.load_compile_artifacts(torch, str(tmp_path / "missing.bin"))


def test_each_benchmark_child_gets_its_own_copy_of_the_baselines_childs_artifacts(tmp_path, monkeypatch):
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cand = candidates.load(REPO_ROOT / "tests/fixtures/fuse_norm/correct.py", task.name, task.op_name)
    requests, lines = [], []

    def fake_run_child(job, request, timeout_s, device, threads, cuda_devices=None):
        requests.append(request)
        if request["mode"] == "baselines":  # what the trusted child does with its compiles
            Path(request["peer_artifacts"]).write_bytes(b"compiled peers")
            events = [{"event": "peer_artifacts", "saved_bytes": 14, "problem": None}]
        else:
            assert Path(request["peer_artifacts"]).read_bytes() == b"compiled peers"
            events = [{"event": "peer_artifacts", "loaded": True, "problem": None},
                      {"event": "peer_warm", "graphs_loaded": 5, "graphs_compiled": 1, "flashinfer_prebuilt": ["norm"],
                       "load_failure": "Failed to load artifact: /x.py: PermissionError: denied"},
                      {"event": "isolation", "t": 7.5}]  # fmt: skip
        return sandbox.ChildRun(0, False, 9.0, events, "")

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    settings = runner.EvaluationSettings(device="cpu", cache_dir=str(tmp_path / "cache"), results_dir=str(tmp_path))
    with runner._Evaluation(task, [cand], settings, echo=lines.append) as ev:  # its scratch root holds the copy
        labels = [s.label for s in ev.shapes]
        ev._spawn("baselines", "baselines", None, ["reference", "torch_compile"], labels, 5.0)
        _, job = ev._spawn("bench-x", "bench", ev.units[0], ["reference", "torch_compile"], labels, 5.0)
        copy = Path(requests[1]["peer_artifacts"])
        assert copy.parent == job.job_dir and copy.stat().st_mode & 0o777 == 0o644  # outside the child's scratch
    assert (tmp_path / "cache" / "peers" / "fuse_norm.bin").read_bytes() == b"compiled peers"  # for later runs
    assert lines[0].endswith("(saved 14 bytes of torch.compile artifacts)")
    assert lines[1].endswith(
        "(7.5 s of it compiling and warming the peers: torch.compile graphs: 5 from the baselines child's artifacts,"
        " 1 compiled; first failed load: Failed to load artifact: /x.py: PermissionError: denied;"
        " flashinfer modules prebuilt: norm)"
    )
    # A later run whose baselines child had nothing to save (all loaded from a warm cache) still has them.
    monkeypatch.setattr(sandbox, "run_child", lambda *args, **kwargs: sandbox.ChildRun(0, False, 1.0, [], ""))
    with runner._Evaluation(task, [cand], settings, echo=lines.append) as later:
        later._spawn("baselines", "baselines", None, ["reference", "torch_compile"], labels, 5.0)
    assert later.peer_artifacts == tmp_path / "cache" / "peers" / "fuse_norm.bin"


def test_parity_children_share_the_cpus_and_the_baselines_and_benchmark_children_get_them_all(tmp_path, monkeypatch):
    """Parity children run jobs at a time and split the CPUs between them; the baselines child and each
    benchmark child run alone, so each gets every CPU (they used to inherit the parity children's share)."""
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cands = [candidates.load(REPO_ROOT / f"tests/fixtures/fuse_norm/{f}.py", task.name, task.op_name)
             for f in ("correct", "one_ulp_everywhere")]  # fmt: skip
    threads_by_mode = {}

    def fake_run_child(job, request, timeout_s, device, threads, cuda_devices=None):
        threads_by_mode.setdefault(request["mode"], set()).add(threads)
        return sandbox.ChildRun(0, False, 1.0, [{"event": "isolation", "layers": {}, "t": 0.1}], "")

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 8)
    settings = runner.EvaluationSettings(device="cpu", jobs=2, configs="chosen", results_dir=str(tmp_path))
    with runner._Evaluation(task, cands, settings, echo=lambda _: None) as ev:
        labels = [s.label for s in ev.shapes]
        ev.run_parity_children(runner.tqdm(disable=True))
        ev._spawn("baselines", "baselines", None, ["reference"], labels, 5.0)
        ev._spawn("bench-x", "bench", ev.units[0], ["reference"], labels, 5.0)
    assert threads_by_mode == {"parity": {4}, "baselines": {8}, "bench": {8}}


def test_a_spent_budget_skips_the_benchmark_children_and_records_why(tmp_path, monkeypatch):
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cand = candidates.load(REPO_ROOT / "tests/fixtures/fuse_norm/correct.py", task.name, task.op_name)
    limits = []

    def fake_run_child(job, request, timeout_s, device, threads, cuda_devices=None):
        limits.append(timeout_s)
        return sandbox.ChildRun(None, True, timeout_s, [], "")  # ran into its limit

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    for budget, clock in ((100.0, 80.0), (100.0, 40.0)):  # 20 s left: skipped; 60 s left: capped at 60
        settings = runner.EvaluationSettings(device="cpu", budget_s=budget, results_dir=str(tmp_path))
        with runner._Evaluation(task, [cand], settings, echo=lambda _: None) as ev:
            ev.device, ev.on_gpu, ev.shapes = "cuda", True, list(task.shapes[:2])
            for s in ev.shapes:
                ev.units[0].status[s.label] = (Status.PASSED, "")
                ev.units[0].verdicts[s.label] = [
                    parity.CallParity(True, "nearest", {"x_TD": parity.OutputParity("x_TD", True, "")})
                ]
            ev.started -= clock
            ev.run_bench_children(runner.tqdm(disable=True))
            record = ev.records({}, None)[0]
        assert record.status is Status.PASSED and record.timing is None
        if clock == 80.0:
            assert not limits and "budget of 100 s was spent" in record.timing_skipped, record.timing_skipped
        else:
            assert limits and 55.0 < limits[0] <= 60.0
            assert "timed out" in record.timing_skipped
            assert "end of the run's budget (100 s)" in record.baseline_notes["benchmark child"]


def test_a_run_removes_its_scratch_root_however_it_ends_unless_asked_to_keep_it(tmp_path, monkeypatch):
    """The children's job directories live under one root per run; a run that fails halfway (here the
    child runner itself breaks) leaves nothing behind in the temp dir, and keep_scratch keeps it."""
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cand = candidates.load(REPO_ROOT / "tests/fixtures/fuse_norm/correct.py", task.name, task.op_name)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    def broken_run_child(*args, **kwargs):
        raise RuntimeError("the child runner broke")

    monkeypatch.setattr(sandbox, "run_child", broken_run_child)
    settings = runner.EvaluationSettings(device="cpu", results_dir=str(tmp_path / "results"), progress=False)
    with pytest.raises(RuntimeError, match="the child runner broke"):
        runner.evaluate(task, [cand], settings, echo=lambda _: None)
    assert list(temp.iterdir()) == []
    with pytest.raises(RuntimeError, match="the child runner broke"):
        runner.evaluate(task, [cand], dataclasses.replace(settings, keep_scratch=True), echo=lambda _: None)
    (kept,) = temp.iterdir()
    assert kept.name.startswith("beam-harness-fuse_norm-") and kept.is_dir()


def test_a_negative_budget_is_bad_input():
    from harness import runner

    with pytest.raises(runner.UsageError, match=r"budget_s must be >= 0 \(0: no budget\); got -1"):
        runner.EvaluationSettings(budget_s=-1)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only_and_lines_print_clear_of_it(monkeypatch):
    from harness import runner

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    seen = []  # what the terminal held when each line was printed
    with runner.progress_bar(2, "fuse_norm children", wanted=True) as bar:
        say = runner.clear_of(bar, lambda line: seen.append((line, terminal.getvalue())))
        bar.update(1)
        bar.refresh()  # tqdm redraws at most every 0.1 s by itself
        assert "1/2" in terminal.getvalue()
        say("fuse_norm: parity phase took 1.0 s")
    ((line, held),) = seen
    assert line == "fuse_norm: parity phase took 1.0 s"
    assert "fuse_norm children" in held and held.endswith("\r")  # the bar drawn, then cleared for the line
    assert terminal.getvalue()[len(held) :].lstrip("\r").startswith("fuse_norm children")  # and drawn again

    for stderr, wanted in ((io.StringIO(), True), (_Terminal(), False)):  # a log or a pipe; progress=false
        monkeypatch.setattr(sys, "stderr", stderr)
        echo = seen.append
        with runner.progress_bar(2, "fuse_norm children", wanted=wanted) as bar:
            bar.update(1)
            assert runner.clear_of(bar, echo) is echo
        assert stderr.getvalue() == ""
