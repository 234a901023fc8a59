"""Every planted cheat is caught and named; hangs, crashes and exceptions become statuses.

All of them ran in one runner call (tests/conftest.py: planted_run), beside an honest control, so
these tests also show that one candidate's failure never stops the others.
"""

from __future__ import annotations

import pytest
import torch

from harness.environment import REPO_ROOT
from harness.records import Status
from tests.conftest import PLANTED_TIMEOUT_S


@pytest.mark.parametrize(
    ("name", "cheats"),
    [
        ("alias_input", ["output_aliases_input", "inputs_mutated"]),
        ("mutates_input", ["inputs_mutated"]),
        ("cached_storage", ["cached_result"]),
        ("cached_values", ["cached_result"]),
        ("stale_memory", ["stale_memory"]),
        ("side_thread", ["async_work", "background_thread"]),
        ("non_tensor", ["non_tensor_output"]),
        ("patched_timers", ["patched_function: time.perf_counter", "patched_function: torch.cuda.synchronize"]),
        ("fallback", ["fallback_to_reference: executed ops.py:norm_residual_norm"]),
    ],
)
def test_planted_cheats_are_caught_and_named(planted, name, cheats):
    record = planted(name)
    assert record.status is Status.CHEAT_DETECTED, (record.status, record.detail)
    for cheat in cheats:
        assert any(c.startswith(cheat) for c in record.cheats), (cheat, record.cheats)
    assert record.detail in record.cheats
    assert record.timing is None


def test_cached_values_are_caught_by_comparing_seeds_in_the_parent(planted):
    (cheat,) = planted("cached_values").cheats
    assert cheat == "cached_result: seed 2 returned the previous seed's outputs for different inputs"


@pytest.mark.parametrize(
    ("name", "status", "detail"),
    [
        (
            "hangs",
            Status.TIMEOUT,
            f"killed after {PLANTED_TIMEOUT_S:g} s (the limit); it had finished 0 of 2 calls, the last started at",
        ),
        ("crashes", Status.CRASH, "SIGSEGV"),
        ("raises", Status.RUNTIME_ERROR, "NotImplementedError: planted: this launcher always raises"),
    ],
)
def test_failures_become_statuses(planted, name, status, detail):
    record = planted(name)
    assert record.status is status and detail in record.detail, (record.status, record.detail)
    assert record.log_tail  # the child's log (and traceback) travels with the record


def test_no_planted_file_stopped_the_run(planted_run):
    names = {r.implementation for r in planted_run.records}
    assert {"correct", "hangs", "crashes", "raises", "stale_memory", "reads_secret"} <= names
    assert planted_run.run.statuses["correct"] == "passed"
    assert planted_run.run.wall_s > 0


def test_a_wrong_config_the_autotuner_did_not_choose_is_caught(planted):
    """The interpreter runs BUG=False; the GPU autotuner may choose BUG=True. Forced, it fails parity,
    and the record names it (configs=auto: every config on the CPU)."""
    record = planted("wrong_gpu_config")
    assert record.status is Status.MISMATCH, (record.status, record.detail)
    assert record.detail.startswith("config _copy_kernel(BUG=True, warps=4): x_TD: "), record.detail
    assert planted("correct").configs_checked == 0  # plain PyTorch: nothing to force


def test_only_the_chosen_configs_are_checked_when_asked(tmp_path):
    import os

    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    path = os.path.join(os.path.dirname(__file__), "fixtures", "fuse_norm", "wrong_gpu_config.py")
    cand = candidates.load(path, task.name, task.op_name)
    settings = runner.EvaluationSettings(
        device="cpu", shapes=("T=3",), seeds=(1,), configs="chosen", results_dir=str(tmp_path),
        cache_dir=str(tmp_path), progress=False,
    )  # fmt: skip
    (record,) = runner.evaluate(task, [cand], settings, echo=lambda _: None).records
    assert (record.status, record.configs_checked) == (Status.PASSED, 0), record.detail


def test_configs_must_be_one_of_three():
    from harness import runner

    with pytest.raises(runner.UsageError, match=r"configs must be auto, chosen or all; got 'some'"):
        runner.EvaluationSettings(configs="some")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_forced_config_runs_only_where_its_kernel_launches(tmp_path, jobs):
    """Two autotuned paths chosen by T and a third kernel that never launches: a config is forced only
    at the shapes where the candidate's own call launched its kernel (elsewhere it would run the very
    same code), counted idle there, and one whose kernel launched nowhere is reported unchecked. The
    same with its three configs dealt to two parity children (jobs=2), the second learning where the
    kernels launch from a one-seed probe of its own."""
    from harness import candidates, runner
    from tasks import get_task

    task = get_task("fuse_norm")
    cand = candidates.load(REPO_ROOT / "tests/fixtures/configs/two_paths.py", task.name, task.op_name)
    settings = runner.EvaluationSettings(
        device="cpu", shapes=("tiny T=1", "tiny T=5"), seeds=(1,), results_dir=str(tmp_path / "results"),
        cache_dir=str(tmp_path / "cache"), progress=False, jobs=jobs,
    )  # fmt: skip
    said: list[str] = []
    one_row, rows = runner.evaluate(task, [cand], settings, echo=said.append).records
    assert len([line for line in said if ": parity child parity-" in line]) == jobs, said
    unused = "_unused_kernel(BUG=True, warps=8): _unused_kernel did not launch at any shape (seed 1): nothing to check"
    assert (one_row.status, one_row.configs_checked, one_row.configs_idle) == (Status.PASSED, 1, 2), one_row.detail
    assert one_row.configs_unchecked == rows.configs_unchecked == [unused]
    assert rows.status is Status.MISMATCH
    assert rows.detail.startswith("config _rows_kernel(BUG=True, warps=4): x_TD: "), rows.detail
    assert rows.configs_idle == 1  # _one_row_kernel's config: T = 5 takes the other path


def test_the_launch_log_knows_only_what_a_returned_call_did_not_launch():
    from harness.child import LaunchLog

    class Tuner:
        def run(self, *args, **kwargs):
            return "launched"

    tuners = {"a": Tuner(), "b": Tuner()}
    log = LaunchLog(tuners)
    assert tuners["a"].run() == "launched"  # outside a call: not recorded
    with log.call("T=1", 1):
        tuners["a"].run(grid=(1,))
    with pytest.raises(RuntimeError), log.call("T=5", 1):  # this call raised: it never completed
        raise RuntimeError("the candidate failed")
    assert log.current is None and tuners["a"].run() == "launched"
    assert (log.idle_at("b", "T=1", 1), log.idle_at("a", "T=1", 1)) == (True, False)
    assert not log.idle_at("b", "T=5", 1) and not log.idle_at("b", "T=1", 2)


def test_the_fallback_watch_hooks_calls_only_when_enabled():
    """A candidate's own calls run watched; its forced configs do not, and then no profile hook may run:
    under the interpreter the hook alone was about half of a forced config's time."""
    import sys

    from harness.child import FallbackWatch
    from reference_model import ops

    x = torch.ones(2, 8)
    with FallbackWatch(enabled=True) as watch:
        assert sys.getprofile() == watch._profile
        ops.rms_norm(x, torch.ones(8), 1e-6)
    assert watch.hits[0] == "ops.py:rms_norm" and not watch.removed and sys.getprofile() is None
    with FallbackWatch(enabled=False) as idle:
        assert sys.getprofile() is None
        ops.rms_norm(x, torch.ones(8), 1e-6)
    assert idle.hits == [] and not idle.removed


def test_kernels_that_trigger_the_next_launch_are_named_from_their_compiled_code():
    """The benchmark child's early_launch_trigger check: every Triton kernel a module global leads to (through
    autotuner-like `.fn` wrappers; child.compiled_kernels, whose walk harness profile's register counts share),
    each compiled variant's PTX; a pending compile is awaited. Here with
    stand-ins for Triton's objects: the GPU test in test_runner.py compiles real ones."""
    import types

    from harness.child import PDL_TRIGGER, compiled_kernels, early_launch_triggers

    class Compiled:
        def __init__(self, ptx):
            self.asm = {"ptx": ptx}

    class Pending:  # an asynchronous compile, as Triton may keep in its cache
        def __init__(self, kernel):
            self.kernel = kernel

        def result(self):
            return self.kernel

    def jit(name, *ptx, pending=False):
        kernels = {i: (Pending(Compiled(p)) if pending else Compiled(p)) for i, p in enumerate(ptx)}
        return types.SimpleNamespace(__name__=name, device_caches={0: (kernels, {}, None, None, None)})

    waits = "griddepcontrol.wait;\nld.global.b32 ..."
    module = types.SimpleNamespace(
        _plain=jit("_plain", "ld.global.b32 ...", waits),
        _tuned=types.SimpleNamespace(fn=types.SimpleNamespace(fn=jit("_tuned_fn", waits, f"{PDL_TRIGGER};"))),
        _later=jit("_later", f"{PDL_TRIGGER}; // dummy", pending=True),
        _never_compiled=jit("_never_compiled"),
        torch=types.SimpleNamespace(),
        BLOCK=128,
    )
    walked = [(attr, fn.__name__, kernel.asm["ptx"]) for attr, fn, kernel in compiled_kernels(module)]
    assert walked == [
        ("_plain", "_plain", "ld.global.b32 ..."),
        ("_plain", "_plain", waits),
        ("_tuned", "_tuned_fn", waits),
        ("_tuned", "_tuned_fn", f"{PDL_TRIGGER};"),
        ("_later", "_later", f"{PDL_TRIGGER}; // dummy"),
    ]
    found = early_launch_triggers(module)
    assert [f.split(" ")[1] for f in found] == ["_later", "_tuned_fn"], found
    assert all(f.startswith("early_launch_trigger: ") for f in found)
    assert early_launch_triggers(types.SimpleNamespace(_plain=module._plain)) == []


def test_a_heavy_candidates_configs_are_dealt_to_several_children():
    from harness.runner import ParityChild, plan_parity_children

    # One candidate, 24 configs, 2 seeds, 2 cores: two children, every config once, neighbours apart.
    plan = plan_parity_children([24], seeds=2, jobs=2)
    assert plan == [ParityChild(0, 0, tuple(range(0, 24, 2))), ParityChild(0, 1, tuple(range(1, 24, 2)))]
    # Candidates within an even share keep one child each (longest first); so does everyone on one core.
    whole = [ParityChild(u, 0, tuple(range(n))) for u, n in ((1, 20), (2, 12), (0, 10))]
    assert plan_parity_children([10, 20, 12], seeds=2, jobs=2) == whole
    assert [len(c.configs) for c in plan_parity_children([80, 4], seeds=3, jobs=1)] == [80, 4]
    # A heavy one takes as many parts as its even shares, at most `jobs`, never more than it has configs.
    parts = [(c.unit, c.part) for c in plan_parity_children([30, 30, 2], seeds=2, jobs=4)]
    assert parts == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    parts = [(c.unit, c.part) for c in plan_parity_children([60, 2], seeds=2, jobs=4)]
    assert parts == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert plan_parity_children([1], seeds=1, jobs=8) == [ParityChild(0, 0, (0,))]
    assert plan_parity_children([0, 0], seeds=2, jobs=2) == [ParityChild(0, 0, ()), ParityChild(1, 0, ())]


def test_the_fallback_watch_is_on_for_the_first_seed_of_each_shape(tmp_path):
    """The parity loop watches one call per shape, its first seed's: the shape picks a launcher's code
    path. A fallback there is named; the later seeds run at the interpreter's unwatched speed."""
    import json
    import sys

    from harness import child
    from tasks import get_task

    task = get_task("fuse_norm")
    watched: list[tuple[tuple[int, ...], bool]] = []

    def falls_back(**inputs):
        watched.append((tuple(inputs["y_TD"].shape), sys.getprofile() is not None))
        return task.reference(**inputs)

    report_path = tmp_path / "report.jsonl"
    report_path.touch()
    shapes = [s.label for s in task.cpu_shapes[:2]]
    request = {"device": "cpu", "scratch": str(tmp_path), "shapes": shapes, "seeds": [1, 2, 3], "settle_s": 0.0}
    guard = child.snapshot_identities(sys.modules[task.make_inputs.__module__])
    child.parity_loop(torch, request, task, falls_back, "candidate", child.Reporter(str(report_path)), None, guard,
                      [], watch_fallback=True)  # fmt: skip
    assert [on for _, on in watched] == [True, False, False] * len(shapes)
    assert len({shape for shape, _ in watched}) == len(shapes)
    calls = [e for e in map(json.loads, report_path.read_text().splitlines()) if e["event"] == "call"]
    named = [(e["shape"], e["seed"]) for e in calls if any(c.startswith("fallback_to_reference") for c in e["cheats"])]
    assert named == [(shape, 1) for shape in shapes]
    assert sys.getprofile() is None
