"""Records: validated at construction, append-only, readable with pandas, robust to torn writes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest

from harness.records import (
    RECORDS_FILE,
    EvaluationRecord,
    Status,
    Timing,
    append,
    error_line,
    load_frame,
    read,
    read_lines,
)

HASH = "a" * 64


def test_an_exception_is_recorded_as_its_type_and_first_line():
    assert error_line(RuntimeError("backend failed\n  traceback detail")) == "RuntimeError: backend failed"
    assert error_line(ValueError()) == "ValueError: "
    assert error_line(KeyError("x" * 500), limit=10) == "KeyError: '" + "x" * 9


def _record(**changes) -> EvaluationRecord:
    fields = dict(
        run_id="run-1", task="fuse_norm", implementation="row_per_program", kind="candidate", shape_label="T=1",
        shape={"T": 1, "D": 5120}, device="cuda", policy="gpu", seeds=[1, 2, 3], status=Status.PASSED, detail="",
        environment={"device": "NVIDIA H200"}, candidate_hash=HASH, candidate_path="candidate_kernels/x.py",
        parity={"x_TD": {"passed": True, "max_ulp": 1, "fp64_ratio": 1.0}},
        timing=Timing(2.0, 2.1, 2.3, "cuda_graph", 40, 100), baselines_us={"reference": {"p20_us": 9.0,
        "p50_us": 9.5, "p80_us": 10.0}}, speedups={"reference": 9.5 / 2.1}, floor_us=0.01, floor_fraction=0.01 / 2.1,
    )  # fmt: skip
    fields.update(changes)
    return EvaluationRecord(**fields)


def test_round_trip_through_the_file_and_pandas(tmp_path):
    path = tmp_path / "fuse_norm" / RECORDS_FILE
    first, second = _record(), _record(shape_label="T=8", implementation="other")
    append(path, first)
    append(path, second)
    records, skipped = read(path, EvaluationRecord)
    assert records == [first, second] and skipped == []
    frame, skipped = load_frame(tmp_path, "fuse_norm")
    assert skipped == [] and len(frame) == 2
    assert list(frame["timing.p50_us"]) == [2.1, 2.1]
    assert list(frame["status"]) == ["passed", "passed"]
    assert frame["parity.x_TD.max_ulp"].tolist() == [1, 1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"status": Status.MISMATCH, "detail": "x"}, "got candidate with status mismatch"),
        ({"status": Status.TIMEOUT, "detail": "x", "kind": "library"}, "got library with status timeout"),
        ({"timing": Timing(2.0, 2.1, 2.3, "cuda_graph", 40, 100), "status": "passed", "parity": {}}, "parity"),
        ({"candidate_hash": None}, "64-hex content hash"),
        ({"status": Status.CHEAT_DETECTED, "detail": "x", "timing": None}, "must name the cheats"),
        ({"status": Status.TIMEOUT, "detail": "", "timing": None}, "needs a detail"),
        ({"floor_fraction": float("nan")}, "non-finite number"),
        ({"kind": "winner"}, "kind must be one of"),
        ({"status": "won"}, "'won' is not a valid Status"),
    ],
)
def test_invalid_records_are_refused_at_construction(changes, message):
    with pytest.raises(ValueError, match=message):
        _record(**changes)


def test_a_baseline_that_missed_parity_keeps_its_timing_through_the_file(tmp_path):
    """torch.compile of fuse_norm is not bit-exact: its record says mismatch and still carries its time."""
    path = tmp_path / "fuse_norm" / RECORDS_FILE
    record = _record(kind="torch_compile", implementation="torch_compile", candidate_hash=None,
                     status=Status.MISMATCH, detail="T=16384: 3 elements differ by more than 1 ulp")  # fmt: skip
    append(path, record)
    assert read(path, EvaluationRecord) == ([record], [])
    assert record.timing is not None and record.timing.p50_us == 2.1


def test_a_record_written_before_window_end_existed_reads_as_its_commit_timed_it(tmp_path):
    """Every timed window synchronized the device before its end event until two commits of the thirteenth
    session, whose records do not say so; the harness's results table shows which is which."""
    from harness.run_cmd import format_results

    path = tmp_path / "fuse_norm" / RECORDS_FILE
    path.parent.mkdir(parents=True)
    with path.open("w") as f:
        for name, commit in (("old", "4656e9e5a9ca7c32176b6ba2f172ce2a93c2d338"),
                             ("early_end_event", "4d58156c88204696384a35579840559f9b128986")):  # fmt: skip
            unrecorded = _record(implementation=name, environment={"device": "NVIDIA H200", "git_commit": commit})
            unrecorded = unrecorded.to_dict()
            del unrecorded["timing"]["window_end"]
            f.write(json.dumps(unrecorded) + "\n")
    append(path, _record(implementation="new"))
    (old, early, new), skipped = read(path, EvaluationRecord)
    assert skipped == [] and [r.timing.window_end for r in (old, early, new)] == ["device_sync", *["end_event"] * 2]
    table = format_results("fuse_norm", tmp_path, 5)
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.split()[:1] in (["old"], ["new"])}
    assert "window end" in table and rows["old"][-5] == "device_sync" and rows["new"][-5] == "end_event", table
    assert "window end device_sync: the device was synchronized inside each timed window" in table


def test_timing_quantiles_are_ordered():
    with pytest.raises(ValueError, match="p20 <= p50 <= p80"):
        Timing(3.0, 2.0, 4.0, "events", 10, 3)
    assert Timing(2.0, 2.5, 3.0, "events", 10, 3).noise == pytest.approx(0.4)
    with pytest.raises(ValueError, match="window_end 'host' not in"):
        Timing(2.0, 2.5, 3.0, "events", 10, 3, window_end="host")


def test_a_torn_last_line_is_skipped_and_the_next_append_starts_fresh(tmp_path):
    path = tmp_path / RECORDS_FILE
    append(path, _record())
    whole = json.dumps(_record(implementation="torn").to_dict())
    with open(path, "ab") as f:
        f.write(whole[: len(whole) // 2].encode())  # an interrupted writer: half a line, no newline
    records, skipped = read(path, EvaluationRecord)
    assert [r.implementation for r in records] == ["row_per_program"]
    assert len(skipped) == 1 and "torn last line" in skipped[0]
    append(path, _record(implementation="after"))
    records, skipped = read(path, EvaluationRecord)
    assert [r.implementation for r in records] == ["row_per_program", "after"]
    assert len(skipped) == 1 and "corrupt line" in skipped[0]


def _write_many(path, tag: str, n: int) -> None:
    for i in range(n):
        append(path, _record(implementation=f"{tag}-{i}", log_tail="x" * 200_000))


def _spawn_writer(path, tag: str, n: int):
    """A separate process appending n records of ~200 KB (forked: no second interpreter start-up)."""
    process = multiprocessing.get_context("fork").Process(target=_write_many, args=(path, tag, n))
    process.start()
    return process


def test_a_writer_killed_mid_way_leaves_every_earlier_record_intact(tmp_path):
    path = tmp_path / RECORDS_FILE
    writer = _spawn_writer(path, "killed", 10_000)
    deadline = time.monotonic() + 60
    while (not path.exists() or path.stat().st_size < 2_000_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    result = read_lines(path)
    assert len(result.rows) >= 5
    assert [r["implementation"] for r in result.rows] == [f"killed-{i}" for i in range(len(result.rows))]
    assert len(result.skipped) <= 1  # at most the line being written when the signal came


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / RECORDS_FILE
    writers = [_spawn_writer(path, f"w{k}", 25) for k in range(4)]
    for w in writers:
        w.join()
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    result = read_lines(path)
    assert result.skipped == []
    assert len(result.rows) == 100
    for k in range(4):  # each writer's records whole, and in its own order
        mine = [r["implementation"] for r in result.rows if r["implementation"].startswith(f"w{k}-")]
        assert mine == [f"w{k}-{i}" for i in range(25)]


def test_readers_see_whole_lines_while_a_writer_appends(tmp_path):
    # A reader takes a shared lock: it sees whole lines only, never one being written.
    path = tmp_path / RECORDS_FILE
    writer = _spawn_writer(path, "live", 40)
    seen = []
    while writer.is_alive():
        result = read_lines(path)
        assert result.skipped == []
        seen.append(len(result.rows))
    writer.join()
    assert writer.exitcode == 0 and seen == sorted(seen)


def test_the_results_table_says_which_copy_floors_timed_a_memcpy_node(tmp_path):
    """The first version of the decode-size copy floor (one commit) timed a graph memcpy node, erratic at
    147 MB; harness results labels those rows' runs, and no others."""
    from harness.records import MEMCPY_COPY_FLOOR_COMMIT
    from harness.run_cmd import format_results

    path = tmp_path / "fuse_norm" / RECORDS_FILE
    env = {"device": "NVIDIA H200", "git_commit": MEMCPY_COPY_FLOOR_COMMIT}
    append(path, _record(implementation="first", run_id="run-memcpy", environment=env, copy_floor_us=1.1,
                         copy_floor_fraction=0.5, created_utc="2026-12-02T05:00:00+00:00"))  # fmt: skip
    append(path, _record(implementation="later", run_id="run-kernel", copy_floor_us=1.0, copy_floor_fraction=0.45,
                         created_utc="2026-12-02T06:00:00+00:00"))  # fmt: skip
    table = format_results("fuse_norm", tmp_path, 5)
    assert "copy floor" in table and "0.45" in table and "0.5" in table, table
    assert f"copy floor of commit {MEMCPY_COPY_FLOOR_COMMIT[:7]} (runs run-memcpy): a memcpy node" in table, table
    append(path, _record(implementation="first", run_id="run-kernel-2", copy_floor_us=1.0, copy_floor_fraction=0.46,
                         created_utc="2026-12-02T07:00:00+00:00"))  # fmt: skip
    assert "a memcpy node" not in format_results("fuse_norm", tmp_path, 5)  # only the latest rows are listed


def test_the_results_table_lists_shapes_in_numeric_order(tmp_path):
    """'T=8' before 'T=64' before 'T=1000', each shape's implementations by name (not 'T=1000' after 'T=1')."""
    from harness.run_cmd import format_results

    path = tmp_path / "fuse_norm" / RECORDS_FILE
    for label, name in (("T=1000", "b"), ("T=64", "a"), ("T=8", "b"), ("T=8", "a"), ("T=1", "a"), ("T=16384", "a")):
        append(path, _record(implementation=name, shape_label=label))
    table = format_results("fuse_norm", tmp_path, 5)
    rows = [line.split()[:2] for line in table.split("Latest record per implementation and shape:")[1].splitlines()]
    listed = [row for row in rows if len(row) == 2 and row[1].startswith("T=")]
    expected = [["a", "T=1"], ["a", "T=8"], ["b", "T=8"], ["a", "T=64"], ["b", "T=1000"], ["a", "T=16384"]]
    assert listed == expected, table
