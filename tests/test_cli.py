"""The command line: dispatch, Hydra overrides, bad input with clear errors, and a real run end to end."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hydra import compose, initialize_config_dir

from harness import cli
from harness.bench import BenchSettings
from harness.environment import REPO_ROOT
from harness.run_cmd import RunSettings
from tests.conftest import working_tree_env

FIXTURES = REPO_ROOT / "tests" / "fixtures"


def harness(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m harness ...` as the GPU machine runs it: from the working tree, PYTHONPATH set."""
    env = working_tree_env()
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=timeout)  # fmt: skip


def run_in_process(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as e:  # Hydra exits 1 itself on an override it cannot apply
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_lists_every_command():
    result = harness("--help")
    assert result.returncode == 0
    for command in cli.COMMANDS:
        assert f"  {command.name}" in result.stdout and command.help in result.stdout


def test_no_command_or_an_unknown_one_is_bad_input(capsys):
    code, out, _ = run_in_process(capsys)
    assert code == 1 and "usage: harness <command>" in out
    code, _, err = run_in_process(capsys, "frobnicate", "task=fuse_norm")
    assert code == 1 and "unknown command 'frobnicate task=fuse_norm'; known: run, results, model info" in err


def test_command_help_shows_settings_defaults_and_meanings(capsys):
    code, out, _ = run_in_process(capsys, "run", "--help")
    assert code == 0 and out.startswith("harness run: evaluate a task's candidates")
    lines = out.splitlines()
    for key, meaning in (
        ("seeds: [1, 2, 3]", "# fresh inputs per seed"),  # inherited from EvaluationSettings
        ("parity_timeout_s: 600.0", "# per parity child"),
        ("candidates: []", "# file stems"),
        ("  graph_calls: 100", "# calls captured per graph"),
        ("bench:", "# how timing is sampled"),
    ):
        assert any(line.startswith(key + " ") and meaning in line for line in lines), (key, out)  # fmt: skip
    # The comment block above a field documents it when its own line has none.
    assert any(line.startswith("cuda_devices: null ") and "CUDA_VISIBLE_DEVICES for this" in line for line in lines)


def test_every_setting_of_every_command_says_what_it_means():
    for command in cli.COMMANDS:
        settings_cls = getattr(importlib.import_module(command.module), command.settings)
        bare = [key for key, meaning in cli.settings_lines(settings_cls) if not meaning]
        assert not bare, f"harness {command.name}: settings without a comment in the source: {bare}"


def test_cfg_job_prints_the_composed_configuration(capsys):
    code, out, _ = run_in_process(capsys, "run", "task=fuse_norm", "seeds=[4,5]", "bench.samples=70", "--cfg", "job")
    assert code == 0 and "task: fuse_norm" in out and "samples: 70" in out and "- 4\n- 5" in out


def test_overrides_become_the_typed_frozen_settings():
    with initialize_config_dir(config_dir=cli.CONFIG_DIR, version_base=None):
        from hydra.core.config_store import ConfigStore

        ConfigStore.instance().store(name=cli.SCHEMA_NAME, node=cli._schema_node(RunSettings))
        cfg = compose(cli.COMMAND_CONFIG, overrides=["task=fuse_norm", "seeds=[4,5]", "shapes=['T=1']",
                                                     "bench.samples=70", "results_dir=/tmp/r"])  # fmt: skip
    settings = cli._to_settings(RunSettings, cfg)
    assert isinstance(settings, RunSettings) and settings.task == "fuse_norm"
    assert settings.seeds == (4, 5) and settings.shapes == ("T=1",) and settings.candidates == ()
    assert settings.bench == BenchSettings(samples=70) and settings.results_dir == "/tmp/r"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["task=nope"], "task 'nope' unknown; known: ['dense_act', 'fuse_norm'"),
        ([], "task is required, e.g. `harness run task=fuse_norm`; known:"),
        (["task=fuse_norm", "candidates=[no_such_kernel]"],
         "candidate 'no_such_kernel' not found for task 'fuse_norm'"),
        ([f"candidates=[{FIXTURES}/bad_input/no_launcher.py]"],
         "no top-level launcher `def norm_residual_norm(...)` (the reference op's name); public functions found: "
         "['fuse_norm']"),
        ([f"candidates=[{FIXTURES}/bad_input/bad_metadata.py]"], "CANDIDATE must be a literal dict"),
        ([f"candidates=[{FIXTURES}/bad_input/agent_without_model.py]"], "must name its model"),
        (["task=fuse_norm", "shapes=['T=7']"], "task 'fuse_norm' has no shapes ['T=7'] on cpu; known:"),
        (["task=fuse_norm", "seeds=[-1]"], "seeds must be non-negative ints"),
        (["task=fuse_norm", "device=tpu"], "device must be auto, cuda or cpu; got 'tpu'"),
        (["tsk=fuse_norm"], "unknown setting 'tsk' (did you mean 'task'?); it has device, shapes,"),
        (["task=fuse_norm", "bench.max_secs=3"],
         "unknown setting 'bench.max_secs' (did you mean 'bench.max_seconds'?); 'bench' has warmup_windows,"),
        (["task=fuse_norm", "shapes=[T=1,T=8]"],
         "shapes=[T=1,T=8]: a list item holding '=' must be quoted, the whole override too: \"shapes=['T=1','T=8']\""),
    ],
)  # fmt: skip
def test_bad_input_exits_1_with_a_clear_message(capsys, args, message):
    if any(a.startswith("candidates=") for a in args):
        args = ["task=fuse_norm", *args]
    code, out, err = run_in_process(capsys, "run", *args)
    assert code == 1 and message in err, err
    assert "Traceback" not in err and "planted: this module must never be imported" not in out + err


def test_overrides_in_hydra_s_own_grammar_are_left_to_hydra():
    from harness.cli import COMMANDS, override_problem
    from harness.run_cmd import RunSettings

    run = next(c for c in COMMANDS if c.words == ("run",))
    fine = ("task=fuse_norm", "agent=anthropic", "agent.model=x", "bench.max_seconds=3", "shapes=['T=1','T=8']",
            "shapes=[T1]", "+extra=1", "~task", "hydra.sweep.dir=/tmp/x", "--cfg", "job", "-m", "task=a,b")  # fmt: skip
    for arg in fine:
        assert override_problem(run, RunSettings, arg) is None, arg
    typo = override_problem(run, RunSettings, "agent.modl=x")
    assert typo.startswith("unknown setting 'agent.modl' (did you mean 'agent.model'?); 'agent' has kind,"), typo


def test_a_git_revision_or_one_value_of_a_list_arrives_as_typed(capsys):
    """`harness review base=HEAD~1`: '~', '^' and '@' are outside Hydra's unquoted grammar, so a text setting's value
    holding them is quoted for it; `candidates=lean_row` gives a list setting one value, so it is made a list. A
    value Hydra reads (a sweep, a list, null) and a setting of another type stay as typed."""
    from harness.review import ReviewSettings

    code, out, err = run_in_process(capsys, "review", "base=HEAD~1", "head=main@{1}", "--cfg", "job")
    assert code == 0 and "base: HEAD~1\n" in out and "head: main@{1}\n" in out, err
    code, out, err = run_in_process(capsys, "run", "candidates=row_warps", "seeds=4", "shapes=T=1", "--cfg", "job")
    assert code == 0 and "candidates:\n- row_warps\n" in out and "seeds:\n- 4\n" in out and "- T=1\n" in out, err
    assert cli.as_hydra_reads(ReviewSettings, "base=HEAD^") == "base='HEAD^'"
    assert cli.as_hydra_reads(ReviewSettings, "base=it's~") == "base='it\\'s~'"
    assert cli.as_hydra_reads(RunSettings, "shapes=tiny T=1") == "shapes=['tiny T=1']"
    assert cli.as_hydra_reads(RunSettings, "candidates=HEAD~1") == "candidates=['HEAD~1']"
    for unchanged in ("base=main", "base=a,b", "seeds=[1]", "seeds=1,2", "seeds=[1],[2]", "shapes=null", "candidates=",
                      "shapes=[T=1]", "+base=HEAD~1", "-m", "bench.max_seconds=3"):  # fmt: skip
        settings = ReviewSettings if unchanged.startswith(("base", "+base")) else RunSettings
        assert cli.as_hydra_reads(settings, unchanged) == unchanged


def test_a_value_of_the_wrong_type_is_refused_by_hydra(capsys):
    code, _, err = run_in_process(capsys, "run", "task=fuse_norm", "seeds=[a]")
    assert code == 1 and "could not be converted to Integer" in err


def test_a_multirun_sweep_runs_every_job_and_fails_if_one_fails(capsys, tmp_path):
    sweep = tmp_path / "sweep"  # not the default under $TMPDIR, which nothing would remove
    code, _, err = run_in_process(capsys, "run", "-m", "task=nope,also_nope", f"hydra.sweep.dir={sweep}")
    assert code == 1 and "task 'nope' unknown" in err and "task 'also_nope' unknown" in err
    assert (sweep / "multirun.yaml").is_file()


def test_run_end_to_end_with_a_real_triton_candidate(tmp_path):
    results, cache = tmp_path / "results", tmp_path / "cache"
    run = harness("run", "task=fuse_norm", "candidates=[row_per_program]", "device=cpu",
                  "shapes=['tiny T=1','tiny T=5']", "seeds=[1,2]", f"results_dir={results}", f"cache_dir={cache}",
                  "progress=false")  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "== fuse_norm | tiny T=1 | cpu, interpreter policy, seeds [1, 2] ==" in out
    assert "== fuse_norm | tiny T=5 |" in out and "row_per_program passed" in out
    assert "timings there are not meaningful and were skipped" in out
    assert "floor" not in out.split("Timings:")[0]  # CPU: no timing columns, neither floor
    assert "fuse_norm: parity phase took" in out and "s wall (parity " in out and "); records in" in out
    lines = (results / "fuse_norm" / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["implementation"], r["shape_label"], r["status"]) for r in records] == [
        ("row_per_program", "tiny T=1", "passed"),
        ("row_per_program", "tiny T=5", "passed"),
    ]
    assert records[0]["candidate_path"] == "candidate_kernels/fuse_norm/row_per_program.py"
    assert records[0]["isolation"]["audit_hook"] == "active"
    assert any((cache / "triton").iterdir())  # the candidate's compiled kernels are kept for the next run
    history = harness("results", "task=fuse_norm", f"results_dir={results}")
    assert history.returncode == 0, history.stderr
    run_id = json.loads((results / "fuse_norm" / "runs.jsonl").read_text())["run_id"]
    assert run_id in history.stdout and "Promoted: none" in history.stdout
    assert "row_per_program" in history.stdout and "tiny T=5" in history.stdout
    assert "Goals (p50 in this run" not in out and "not measured on the H200" in history.stdout  # goals judge GPU runs
    overview = harness("results", f"results_dir={results}")  # no task: every task's promotion and goals
    assert overview.returncode == 0, overview.stderr
    assert "== fuse_norm ==" in overview.stdout and "== moe_route ==" in overview.stdout
    assert "T=16384 p50 <= 165 us" in overview.stdout and run_id not in overview.stdout


def _children(pid: int, module: str) -> list[int]:
    """Processes whose parent is `pid` and whose command line runs `module`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat_fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if entry.isdigit() and int(stat_fields[1]) == pid and module.encode() in cmdline:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(("sig", "fork_server"), [(signal.SIGTERM, "1"), (signal.SIGINT, "1"), (signal.SIGTERM, "0")])
def test_a_stopped_run_takes_its_children_with_it(tmp_path, sig, fork_server):
    """A CI runner's time limit (SIGTERM) or a Ctrl-C (SIGINT) while a candidate hangs in its parity child:
    the command exits 128 + the signal at once, and no child is left running. Children run in sessions of
    their own, out of reach of a signal to the command's group: before, this one ran on to its 600 s limit.
    The parity child is forked by the fork server (a child of the command), or exec'd by the command."""
    env = working_tree_env(BEAM_HARNESS_FORK_SERVER=fork_server)
    cmd = [sys.executable, "-m", "harness", "run", "task=fuse_norm", f"candidates=[{FIXTURES / 'fuse_norm/hangs.py'}]",
           "shapes=['tiny T=1']", "device=cpu", "seeds=[1]", f"results_dir={tmp_path / 'results'}",
           f"cache_dir={tmp_path / 'cache'}", "progress=false"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def parity_children() -> tuple[list[int], list[int]]:
        if fork_server == "0":
            return [], _children(proc.pid, "harness.child")
        servers = _children(proc.pid, "harness.forkserver")
        return servers, [c for s in servers for c in _children(s, "harness.forkserver")]

    try:
        deadline = time.monotonic() + 180
        while not (found := parity_children())[1] and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        servers, children = found
        assert children, "no parity child started"
        time.sleep(1.0)  # the child is into the candidate's endless call
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)  # not the parity child's 600 s limit
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out
    deadline = time.monotonic() + 10
    while any(map(_running, servers + children)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_running, servers + children)), f"children left running: {servers + children}"
    assert not (tmp_path / "results" / "fuse_norm" / "records.jsonl").exists()  # a stopped run records nothing


def test_a_stopping_harness_starts_no_child(monkeypatch):
    from harness import sandbox

    monkeypatch.setattr(sandbox, "_stopping", threading.Event())
    with pytest.raises(SystemExit) as stopped:
        sandbox.stop_on_signal(signal.SIGTERM, None)
    assert stopped.value.code == 128 + signal.SIGTERM
    with pytest.raises(sandbox.Stopping, match="the harness is stopping: true was not started"):
        sandbox.start_session(["true"])
    assert not sandbox._live_sessions


def test_output_reaches_a_pipe_line_by_line_even_when_the_process_is_killed():
    """A GPU runner's time limit kills the command: what it printed before must be in the log
    (PYTHONUNBUFFERED, set on some machines and not on others, is taken away)."""
    script = "\n".join(["import os", "from harness import cli", "cli.main(['--help'])", "os._exit(9)"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          timeout=120)  # fmt: skip
    assert done.returncode == 9 and done.stdout.startswith("usage: harness <command>"), done
