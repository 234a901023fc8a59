"""The fork server (harness/forkserver.py): CPU children forked from a process with torch imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest

from harness import candidates, forkserver, runner, sandbox
from harness.environment import REPO_ROOT
from tasks import TASKS

# A module a forked child runs: what it was given, as it sees it, then the exit the request asks for.
PROBE = """
import json, os, sys, torch
out = {"name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(), "environ": dict(os.environ),
       "exec_environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
       "threads": torch.get_num_threads(), "session_leader": os.getsid(0) == os.getpid(), "pid": os.getpid()}
print("probe ran")
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
how = sys.argv[2]
if how == "hang":
    import time
    time.sleep(600)
if how == "segfault":
    os.kill(os.getpid(), 11)
sys.exit(int(how))
"""


@pytest.fixture
def server(tmp_path):
    (tmp_path / "fs_probe.py").write_text(PROBE)
    env = {**sandbox.server_env(), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}"}
    started = forkserver.ForkServer(env)
    yield started
    started.close()


def _start(server, tmp_path, how: str, env: dict[str, str] | None = None, threads: int = 1):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    log = tmp_path / f"{how}.log"
    log.write_text("")
    child = server.start("fs_probe", [str(tmp_path / f"{how}.json"), how], work, env or {"PATH": "/usr/bin:/bin"}, log,
                         threads)  # fmt: skip
    return child, tmp_path / f"{how}.json", log


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether `pid` has stopped running within `within_s` (a zombie nobody reaped counts as stopped)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists()


def test_a_forked_child_runs_its_module_as_main_with_the_requests_environment_directory_and_log(server, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "BEAM_PROBE": "given", "OMP_NUM_THREADS": "2"}
    child, out, log = _start(server, tmp_path, "7", env, threads=2)
    assert child.wait(120) == 7
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__" and seen["argv"] == [str(out), "7"]
    assert seen["cwd"] == str(tmp_path / "work")
    assert seen["environ"] == env  # exactly the request's: nothing of the server's or the parent's
    assert seen["threads"] == 2
    assert seen["session_leader"]  # a session of its own, as start_session gives an exec'd child
    assert log.read_text() == "probe ran\n"


def test_the_server_and_its_children_hold_no_variable_outside_the_allowlist(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_TEST_API_KEY", "sk-planted")
    (tmp_path / "fs_probe.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = forkserver.server_for(sandbox.server_env())
    try:
        child, out, _ = _start(server, tmp_path, "0")
        assert child.wait(120) == 0
        seen = json.loads(out.read_text())
        assert "sk-planted" not in seen["exec_environ"] and "BEAM_TEST_API_KEY" not in seen["exec_environ"]
        assert "sk-planted" not in Path(f"/proc/{server.proc.pid}/environ").read_text(errors="replace")
    finally:
        server.close()


def test_a_signal_that_kills_a_forked_child_is_its_returncode(server, tmp_path):
    child, _, _ = _start(server, tmp_path, "segfault")
    assert child.wait(120) == -signal.SIGSEGV and not child.lost


def test_a_hanging_forked_child_times_out_and_its_session_is_killed(server, tmp_path):
    child, out, _ = _start(server, tmp_path, "hang")
    sandbox._live_sessions.add(child)
    _wait_for(out)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)
    sandbox.end_session(child)
    assert child.returncode == -signal.SIGKILL and _gone(child.pid)
    assert child not in sandbox._live_sessions


def test_a_server_that_dies_takes_its_running_children_and_is_replaced(server, tmp_path, monkeypatch):
    child, out, _ = _start(server, tmp_path, "hang")
    _wait_for(out)
    os.kill(server.proc.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL and child.lost
    assert _gone(child.pid)
    with pytest.raises(forkserver.ServerLost, match="has ended"):  # run_child then starts the child by exec
        server.start("fs_probe", [], tmp_path, {}, tmp_path / "x.log", 1)
    monkeypatch.setattr(forkserver, "_servers", {json.dumps(server.env, sort_keys=True): server})
    replacement = forkserver.server_for(server.env)
    try:
        assert replacement is not server
        child, _, _ = _start(replacement, tmp_path, "0")
        assert child.wait(120) == 0
    finally:
        replacement.close()


def test_a_harness_that_exits_leaves_no_forked_child_running(server, tmp_path):
    """End of the server's input (the harness exited, or was killed): it kills its children and exits."""
    child, out, _ = _start(server, tmp_path, "hang")
    _wait_for(out)
    server.proc.stdin.close()
    assert server.proc.wait(30) == 0
    assert _gone(child.pid)


def test_forked_and_execd_parity_children_give_the_same_records(tmp_path, monkeypatch):
    task = TASKS["output_gate"]
    found = [c for c in candidates.discover(task.name, task.op_name) if c.name == "flat"]
    results, forked_by_servers = {}, {}
    monkeypatch.setattr(forkserver, "_servers", {})
    for fork in ("1", "0"):
        monkeypatch.setenv(forkserver.ENABLE_ENV, fork)
        settings = runner.EvaluationSettings(device="cpu", seeds=(1,), shapes=("tiny T=5",), configs="chosen",
                                             results_dir=str(tmp_path / fork), cache_dir=str(tmp_path / "cache"),
                                             progress=False)  # fmt: skip
        (record,) = runner.evaluate(task, found, settings, echo=lambda _: None).records
        results[fork] = record
        forked_by_servers[fork] = sum(server.forked for server in forkserver._servers.values())
    assert forked_by_servers == {"1": 1, "0": 1}  # the parity child was forked, then exec'd
    forked, execd = results["1"], results["0"]
    assert forked.status.value == execd.status.value == "passed"
    assert forked.isolation == execd.isolation
    if os.geteuid() == 0:
        assert forked.isolation["network_namespace"] == "active"
    assert forked.sandbox_events == execd.sandbox_events == [] and forked.cheats == execd.cheats == []
    assert forked.parity == execd.parity and forked.parity


def test_a_fork_of_the_harness_does_not_share_its_servers(monkeypatch):
    """The servers answer the process that started them (its reader threads): a fork of it starts its own."""
    monkeypatch.setattr(forkserver, "_servers", {"env": "a server of the parent's"})
    with warnings.catch_warnings():  # Python 3.12 warns of a fork beside threads (pytest's): this one runs nothing
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os._exit(0 if forkserver._servers == {} else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert forkserver._servers == {"env": "a server of the parent's"}


def test_a_server_that_cannot_start_children_is_not_tried_again_and_they_are_execd(tmp_path, monkeypatch):
    (tmp_path / "harness").mkdir()  # a harness that cannot be imported, first on the server's path
    (tmp_path / "harness" / "__init__.py").write_text("raise ImportError('planted')\n")
    broken = {**sandbox.server_env(), "PYTHONPATH": str(tmp_path)}
    monkeypatch.setattr(forkserver, "_servers", {})
    server = forkserver.server_for(broken)
    with pytest.raises(forkserver.ServerLost, match=r"ended before it answered \(exit status 1\)"):
        server.start("harness.child", [], tmp_path, {}, tmp_path / "x.log", 1)
    for _ in range(2):
        with pytest.raises(forkserver.ServerLost, match="ended before its first child"):
            forkserver.server_for(broken)
    # run_child: the child is exec'd, and its log says why
    (tmp_path / "fs_hello.py").write_text("import sys\nprint('hello from an exec', sys.orig_argv[1:4])\n")
    monkeypatch.setattr(sandbox, "server_env", lambda: dict(broken))
    monkeypatch.setenv(forkserver.ENABLE_ENV, "1")  # also where the suite runs with every child exec'd
    job = sandbox.prepare_job(tmp_path / "root", "hello", False, None, tmp_path / "triton", {})
    run = sandbox.run_child(job, {}, 120, "cpu", 1, module="fs_hello")
    assert run.returncode == 0, run.log_tail
    assert run.log_tail.startswith("harness: the fork server ended before its first child (exit status 1): this child")
    assert "hello from an exec ['-P', '-s', '-B']" in run.log_tail


def test_a_server_with_a_second_thread_refuses_to_fork_and_says_why(tmp_path, monkeypatch):
    """numpy's BLAS threads would be one (SERVER_ONLY_ENV takes them away): a fork copies only the forking thread."""
    monkeypatch.setattr(forkserver, "SERVER_ONLY_ENV", {"OPENBLAS_NUM_THREADS": "2"})
    monkeypatch.setattr(forkserver, "_servers", {})
    server = forkserver.server_for(sandbox.server_env())
    with pytest.raises(forkserver.ServerLost, match=r"before it answered \(it refused to fork: 2 threads after its"):
        server.start("harness.child", [], tmp_path, {}, tmp_path / "x.log", 1)
    with pytest.raises(forkserver.ServerLost, match=r"before its first child \(it refused to fork: 2 threads"):
        forkserver.server_for(sandbox.server_env())


def test_a_torn_answer_ends_the_server_and_its_request(tmp_path, monkeypatch):
    torn = 'import sys, time\nsys.stdin.readline()\nprint(\'{"id": 0, "pi\', flush=True)\ntime.sleep(600)\n'
    (tmp_path / "fs_torn.py").write_text(torn)
    monkeypatch.setattr(forkserver, "MODULE", "fs_torn")
    server = forkserver.ForkServer({**sandbox.server_env(), "PYTHONPATH": str(tmp_path)})
    with pytest.raises(forkserver.ServerLost, match=r"ended before it answered \(exit status -9\)"):
        server.start("harness.child", [], tmp_path, {}, tmp_path / "x.log", 1)
    assert server.ended and server.proc.returncode == -signal.SIGKILL


def test_a_child_whose_server_died_is_recorded_killed_and_its_log_says_why(tmp_path, monkeypatch):
    (tmp_path / "fs_hang.py").write_text("import time\nprint('hanging', flush=True)\ntime.sleep(600)\n")
    env = {**sandbox.server_env(), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}"}
    monkeypatch.setattr(sandbox, "server_env", lambda: dict(env))
    monkeypatch.setattr(forkserver, "_servers", {})
    monkeypatch.setenv(forkserver.ENABLE_ENV, "1")
    job = sandbox.prepare_job(tmp_path / "root", "hang", False, None, tmp_path / "triton", {})
    runs = []
    waiter = threading.Thread(target=lambda: runs.append(sandbox.run_child(job, {}, 120, "cpu", 1, module="fs_hang")))
    waiter.start()
    deadline = time.monotonic() + 120
    while "hanging" not in (job.log_path.read_text() if job.log_path.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    (server,) = forkserver._servers.values()
    os.kill(server.proc.pid, signal.SIGKILL)
    waiter.join(60)
    (run,) = runs
    assert run.returncode == -signal.SIGKILL and not run.timed_out
    assert (
        run.log_tail == "hanging\nharness: the fork server ended while this child ran; the harness killed the child\n"
    )
