"""Goals (tasks/<task>.py `goals`): declared with a bar, checked against the task's shapes, and
judged from GPU records only: the promoted kernel's newest record, every candidate's newest, one run side
by side (harness run, nightly) and every task at once (harness results without a task)."""

from __future__ import annotations

import dataclasses

import pytest

from harness import goals
from harness.journal import ItemRecord
from harness.records import (
    PROMOTIONS_FILE,
    RECORDS_FILE,
    EvaluationRecord,
    PromotionRecord,
    Status,
    Timing,
    append,
    read,
)
from harness.regression import Thresholds
from harness.report_nightly import nightly_markdown
from harness.run_cmd import format_overview, format_results
from tasks import TASKS
from tasks.task import Goal

FUSE_NORM, OUTPUT_GATE = TASKS["fuse_norm"], TASKS["output_gate"]
H200 = "NVIDIA H200"


def _record(name: str, shape: str, p50: float, when: str, task: str = "fuse_norm", **changes) -> EvaluationRecord:
    fields = dict(
        run_id=f"run-{when}", task=task, implementation=name, kind="candidate", shape_label=shape,
        shape={"T": int(shape.split("=")[1])}, device="cuda", policy="gpu", seeds=[1], status=Status.PASSED,
        detail="", environment={"device": "NVIDIA H200"}, candidate_hash=(name * 64)[:64],
        candidate_path=f"candidate_kernels/{task}/{name}.py", parity={"x_TD": {"passed": True}},
        timing=Timing(p50 * 0.98, p50, p50 * 1.02, "cuda_graph", 40, 100), created_utc=f"2026-12-{when}",
    )  # fmt: skip
    fields.update(changes)
    return EvaluationRecord(**fields)


def _compile_beside(p50: float) -> dict:
    return {"baselines_us": {"torch_compile": {"p20_us": p50, "p50_us": p50, "p80_us": p50}}}


# ---- declaring a goal ------------------------------------------------------------------------------------
def test_a_goal_takes_a_bar_at_most_one_time_and_a_positive_time():
    with pytest.raises(ValueError, match=r"needs a bar: max_us or not_slower_than \(a time\), or bit_exact=True"):
        Goal()
    with pytest.raises(ValueError, match="at most one time bar, max_us or not_slower_than; got max_us=2.0"):
        Goal(max_us=2.0, not_slower_than="torch_compile")
    with pytest.raises(ValueError, match="bit_exact must be True or False; got 'yes'"):
        Goal(bit_exact="yes")
    with pytest.raises(ValueError, match="max_launches goes with a time bar, max_us or not_slower_than; got max_"):
        Goal(bit_exact=True, max_launches=1)
    assert Goal(bit_exact=True).bar == "bit-exact" and not Goal(bit_exact=True).timed
    assert Goal(max_us=2.3, max_launches=1, bit_exact=True).bar == "p50 <= 2.3 us in one launch, bit-exact"
    for bad in (0, -1.0, float("inf"), "2.3", True):
        with pytest.raises(ValueError, match="positive number of microseconds"):
            Goal(max_us=bad)
    with pytest.raises(ValueError, match="tuple of shape labels; got the string 'T=1'"):
        Goal(max_us=2.0, shapes="T=1")
    assert Goal(max_us=2.3).bar == "p50 <= 2.3 us" and Goal(not_slower_than="x").bar == "not slower than x"
    for bad in (0, 1.0, True, "1"):
        with pytest.raises(ValueError, match="max_launches must be a whole number >= 1"):
            Goal(max_us=2.0, max_launches=bad)
    assert Goal(max_us=2.8, max_launches=1).bar == "p50 <= 2.8 us in one launch"
    assert Goal(not_slower_than="x", max_launches=2).bar == "not slower than x in <= 2 launches"


def test_a_task_refuses_a_goal_on_a_shape_or_baseline_it_does_not_have():
    with pytest.raises(ValueError, match=r"names shapes \['T=2'\] that are not among its GPU shapes \['T=1', 'T=8'"):
        dataclasses.replace(FUSE_NORM, goals=(Goal(max_us=2.0, shapes=("T=1", "T=2")),))
    with pytest.raises(ValueError, match="names no baseline of the task; expected one of .*flashinfer_rmsnorm_x2"):
        dataclasses.replace(FUSE_NORM, goals=(Goal(not_slower_than="cublas"),))
    with pytest.raises(ValueError, match=r"asks for bit-exactness, but none of its outputs \['logits_TE'\] is a"):
        dataclasses.replace(TASKS["router_gemm"], goals=(Goal(bit_exact=True),))  # FP32 logits: an error bound
    assert FUSE_NORM.exact_outputs == ("h_new_TD", "x_TD")
    every = dataclasses.replace(FUSE_NORM, goals=(Goal(not_slower_than="flashinfer_rmsnorm_x2"),))
    assert every.goal_shapes(every.goals[0]) == tuple(s.label for s in FUSE_NORM.shapes)


# ---- judging records -------------------------------------------------------------------------------------
def test_only_the_newest_gpu_record_of_each_candidate_counts_and_the_promoted_one_by_its_hashes():
    old_hash = "f" * 64  # the promoted kernel's measured bytes, before a documentation-only rehash
    records = [
        _record("promoted", "T=1", 2.20, "03", candidate_hash=old_hash),
        _record("promoted", "T=16384", 170.0, "03", candidate_hash=old_hash),
        _record("rival", "T=16384", 160.0, "01"),  # met once, then slower: the newest counts
        _record("rival", "T=16384", 168.0, "04"),
        _record("rival", "T=1", 2.40, "04"),
        _record("cpu_only", "T=1", 0.5, "05", device="cpu", policy="interpreter"),
        _record("broken", "T=1", 0.5, "05", status=Status.MISMATCH, detail="1 ulp", timing=None),
        _record("too_fast", "T=1", 0.001, "05", suspicious=True),  # below the roofline: meets nothing
    ]
    rows = [r for r in goals.assess(FUSE_NORM, records, in_force={H200: ["a" * 64, old_hash]}) if r.goal.timed]
    assert [(r.shape, r.goal.max_us) for r in rows] == [("T=1", 2.3), ("T=16384", 165.0)]
    small, large = rows
    assert small.in_force.implementation == "promoted" and small.in_force.met
    assert small.in_force.margin_us == pytest.approx(0.1) and small.best.implementation == "promoted"
    assert large.in_force.p50_us == 170.0 and not large.in_force.met
    assert large.best.implementation == "rival" and large.best.p50_us == 168.0
    assert large.best.cell() == "168.00 us, missed by 3.00 (1.8%)"
    assert goals.assess(FUSE_NORM, records, in_force={H200: []})[0].in_force is None


def test_a_goal_set_on_the_h200_is_judged_on_h200_records_only():
    """Issue 4's bars are the H200's: an H100 run's newer, slower record neither meets nor misses them, nor hides
    the newest H200 record, in the history's table or in one run's side by side; a goal naming no GPU (output_gate's
    not slower than the compile, timed beside each candidate) is judged on any."""
    h100 = {"device": "NVIDIA H100 80GB HBM3"}
    records = [
        _record("promoted", "T=16384", 170.8, "03"),
        _record("promoted", "T=16384", 236.6, "05", environment=h100, run_id="run-h100"),
        _record("rival", "T=1", 2.23, "05", environment=h100, run_id="run-h100"),
    ]
    small, large, *bit_exact = goals.assess(FUSE_NORM, records, in_force={H200: [("promoted" * 8)]})
    assert [r.shape for r in bit_exact] == ["T=1", "T=8", "T=64", "T=3"] and not bit_exact[0].goal.gpu
    assert large.in_force.p50_us == 170.8 and large.in_force.run_id == "run-03" and large.best.p50_us == 170.8
    assert small.in_force is None and small.best is None
    assert goals._status(small, promoted=True) == "not measured on the H200"
    assert FUSE_NORM.goals[0].judges_on("NVIDIA H200") and not FUSE_NORM.goals[0].judges_on("NVIDIA H100 80GB HBM3")
    on_h100 = goals.side_by_side(FUSE_NORM, records[1:])
    assert on_h100[0]["cells"] == {"promoted": "-", "rival": "2.23 us, not judged (goal set on the H200)"}
    assert on_h100[1]["cells"]["promoted"] == "236.60 us, not judged (goal set on the H200)"
    assert {n: m for row in on_h100[:2] for n, m in row["met"].items()} == {"promoted": None, "rival": None}
    gate = _record("gate", "T=1", 1.00, "05", task="output_gate", environment=h100, **_compile_beside(1.20))
    (relative,) = [r for r in goals.assess(OUTPUT_GATE, [gate], in_force={H200: []}) if r.shape == "T=1"]
    assert relative.goal.gpu is None and relative.best.met
    with pytest.raises(ValueError, match="gpu must be part of a device name, such as 'H200', or None; got ' '"):
        Goal(max_us=2.0, gpu=" ")


def test_not_slower_than_compares_with_the_baseline_as_promotion_bars_it():
    records = [
        _record("gate", "T=1", 1.00, "02", task="output_gate", **_compile_beside(1.20)),
        _record("gate", "T=8", 1.40, "02", task="output_gate", **_compile_beside(1.30)),
        _record("gate", "T=64", 2.00, "02", task="output_gate"),  # the compile did not run beside it
    ]
    rows = {(r.shape, r.goal.bar): r for r in goals.assess(OUTPUT_GATE, records, in_force={H200: [("gate" * 16)]})}
    t1, t8, t64 = (rows[(s, "not slower than torch_compile")] for s in ("T=1", "T=8", "T=64"))
    assert t1.in_force.bar_us == 1.20 and t1.in_force.met and t1.in_force.cell() == "1.00 us, met by 0.20"
    assert t8.in_force.bar_us == 1.30 and not t8.in_force.met
    assert t64.in_force is None and t64.best is None  # no standing without the bar beside it
    # a compile 0.95 us beside another candidate of the same run is the bar, as in promotion (promote.bars);
    # one in another run is not
    faster = _record("other", "T=1", 0.90, "02", task="output_gate", **_compile_beside(0.95))
    later = _record("third", "T=1", 0.90, "05", task="output_gate", **_compile_beside(0.50))
    rows = {r.shape: r for r in goals.assess(OUTPUT_GATE, [*records, faster, later], in_force={H200: [("gate" * 16)]})
            if r.goal.not_slower_than}  # fmt: skip
    assert rows["T=1"].in_force.bar_us == 0.95 and rows["T=1"].in_force.cell() == "1.00 us, missed by 0.05 (5.3%)"
    (t1_row,) = [r for r in goals.side_by_side(OUTPUT_GATE, [*records, faster]) if r["shape"] == "T=1"
                 and r["goal"] == "not slower than torch_compile"]  # fmt: skip
    assert t1_row["met"] == {"gate": False, "other": True}


def test_a_one_launch_goal_needs_the_records_count_of_launches_too():
    """qk_norm_rope's goals (issue 4: "one kernel"): a record meets one only with its time under the bar and
    its call's GPU operations (bench.launches_per_call) at most max_launches; one without the count (timed
    before it was counted, or not capturable) keeps its time and meets nothing."""
    qk = TASKS["qk_norm_rope"]

    def rec(name: str, p50: float, when: str, **changes) -> EvaluationRecord:
        return _record(name, "T=1", p50, when, task="qk_norm_rope", shape_label="sliding T=1", **changes)

    records = [rec("one", 1.40, "02", launches={"kernel": 1}),
               rec("two", 1.20, "02", launches={"kernel": 1, "memset": 1}),
               rec("slow", 3.00, "02", launches={"kernel": 2}),
               rec("uncounted", 1.10, "02", launches_note="not counted: RuntimeError: capture failed")]  # fmt: skip
    (row,) = [r for r in goals.side_by_side(qk, records) if r["shape"] == "sliding T=1"]
    assert row["goal"] == "p50 <= 2.8 us in one launch"
    assert row["cells"] == {
        "one": "1.40 us in 1 launch, met by 1.40",
        "two": "1.20 us in 2 launches, missed: 2 launches, goal 1",
        "slow": "3.00 us in 2 launches, missed by 0.20 (7.1%); 2 launches, goal 1",
        "uncounted": "1.10 us, launches not counted, missed",
    }
    assert row["met"] == {"one": True, "two": False, "slow": False, "uncounted": False}
    (assessed,) = [
        r for r in goals.assess(qk, records, in_force={H200: ["two" * 21 + "t"]}) if r.shape == "sliding T=1"
    ]
    assert assessed.best.implementation == "one"  # the fastest that meets the goal, not the fastest
    assert not assessed.in_force.met and assessed.in_force.launches == 2
    assert goals._status(assessed, promoted=True) == "met by one only (not in force)"
    (uncounted,) = [r for r in goals.assess(qk, records[3:], in_force={H200: [("uncounted" * 8)[:64]]})
                    if r.shape == "sliding T=1"]  # fmt: skip
    assert goals._status(uncounted, promoted=True) == "time met, launches not counted"


def _counted(h_off: int, x_off: int, n: int = 100) -> dict:
    """A record's parity figures for fuse_norm's two bit-exact outputs: elements off the reference out of n each."""
    return {name: {"passed": True, "n_mismatched": off, "n_elements": n}
            for name, off in (("h_new_TD", h_off), ("x_TD", x_off))}  # fmt: skip


def test_a_bit_exact_goal_counts_the_elements_off_the_reference_that_parity_let_pass():
    """Issue 4's "bit-exact with the reference at T <= 64": parity passes 1-ulp flips on a small fraction of the
    elements; the goal counts them over the task's bit-exact outputs, from any GPU's records, alone or beside a time."""
    h100 = {"device": "NVIDIA H100 80GB HBM3"}
    records = [
        _record("promoted", "T=64", 3.6, "03", parity=_counted(0, 2)),
        _record("rival", "T=64", 3.9, "04", parity=_counted(0, 0), environment=h100),
        _record("uncounted", "T=64", 3.0, "04"),  # parity figures without the counts: meets nothing, ranks last
        _record("promoted", "T=8", 2.9, "03", parity=_counted(0, 0)),
        _record("rival", "T=8", 3.1, "04", parity=_counted(0, 0)),  # as bit-exact, newer: the best names it
    ]
    rows = {r.shape: r for r in goals.assess(FUSE_NORM, records, in_force={H200: ["promoted" * 8]}) if not r.goal.timed}
    assert rows["T=64"].in_force.cell() == "2 of 200 elements off, missed" and not rows["T=64"].in_force.met
    assert rows["T=64"].best.implementation == "rival" and rows["T=64"].best.cell() == "bit-exact, met"
    assert goals._status(rows["T=64"], promoted=True) == "met by rival only (not in force)"
    assert rows["T=8"].in_force.cell() == "bit-exact, met" and goals._status(rows["T=8"], promoted=True) == "met"
    assert rows["T=8"].best.implementation == "rival" and rows["T=8"].best.run_id == "run-04"
    assert goals._status(rows["T=1"], promoted=True) == "not measured on a GPU"
    uncounted = goals.standing(FUSE_NORM.goals[-1], records[2], exact_outputs=FUSE_NORM.exact_outputs)
    assert uncounted.cell() == "bit-exactness not recorded, missed"
    assert goals._best([uncounted, rows["T=64"].in_force]).implementation == "promoted"  # 2 off beats no count
    # with a time bar: both must hold
    both = Goal(max_us=3.7, shapes=("T=64",), bit_exact=True)
    cells = {r.implementation: goals.standing(both, r, exact_outputs=FUSE_NORM.exact_outputs).cell()
             for r in records[:2]}  # fmt: skip
    assert cells == {"promoted": "3.60 us, 2 of 200 elements off, missed: not bit-exact",
                     "rival": "3.90 us, bit-exact, missed by 0.20 (5.4%)"}  # fmt: skip
    (row,) = [r for r in goals.side_by_side(FUSE_NORM, records[:3]) if r["shape"] == "T=64"]
    assert row["goal"] == "bit-exact" and row["met"] == {"promoted": False, "rival": True, "uncounted": False}


def test_the_results_table_says_met_missed_not_in_force_and_not_measured(tmp_path):
    folder = tmp_path / "fuse_norm"
    for r in (_record("promoted", "T=1", 2.50, "03"), _record("rival", "T=1", 2.10, "04")):
        append(folder / RECORDS_FILE, r)
    table = format_results("fuse_norm", tmp_path, 5)
    assert "Goals (0 of 6 met by the promoted kernel" in table
    assert "met by rival only (none promoted)" in table and "not measured on the H200" in table
    append(folder / PROMOTIONS_FILE, PromotionRecord(
        task="fuse_norm", action="promote", candidate="promoted", path="candidate_kernels/fuse_norm/promoted.py",
        content_hash="promoted" * 8, run_id="run-03", evidence=["x"], reason="planted", speedups={},
        environment={}))  # fmt: skip
    table = format_results("fuse_norm", tmp_path, 5)
    (row,) = [line for line in table.splitlines() if line.strip().startswith("T=1 p50")]
    assert "2.50 us, missed by 0.20 (8.7%) [run-03]" in row and row.endswith("met by rival only (not in force)")
    append(folder / RECORDS_FILE, _record("promoted", "T=1", 2.25, "05"))
    table = format_results("fuse_norm", tmp_path, 5)
    (row,) = [line for line in table.splitlines() if line.strip().startswith("T=1 p50")]
    assert "2.25 us, met by 0.05 [run-05]" in row and row.endswith(" met")
    # the latest-record table counts each record's launches per call, over kinds: "not counted" where the record
    # says why its call could not be counted, "-" where it was timed before counting
    append(folder / RECORDS_FILE, _record("rival", "T=16384", 170.0, "06", launches={"kernel": 2, "memset": 1}))
    append(folder / RECORDS_FILE, _record("syncs", "T=1", 3.0, "06", launches_note="not counted: capture refused"))
    latest = format_results("fuse_norm", tmp_path, 5).split("Latest record per implementation and shape:")[1]
    header, *rows = latest.strip().splitlines()
    assert header.split()[-1] == "launches"
    assert [row.split()[-1] for row in rows if row.split()[0] == "rival"] == ["-", "3"]
    assert [row.rsplit(maxsplit=2)[-2:] for row in rows if row.split()[0] == "syncs"] == [["not", "counted"]]


def test_the_results_tables_keep_each_gpus_newest_record_and_name_the_gpu(tmp_path):
    """An H100 run after the H200's: the runs table names each run's GPU, the latest-record table keeps the newest
    record of each GPU (the H200's is not replaced by the H100's), and the goals take the H200's."""
    folder = tmp_path / "fuse_norm"
    append(folder / RECORDS_FILE, _record("rival", "T=16384", 170.0, "03"))
    append(folder / RECORDS_FILE, _record("rival", "T=16384", 236.6, "05", environment={"device": "NVIDIA H100"}))
    table = format_results("fuse_norm", tmp_path, 5)
    latest = table.split("Latest record per implementation and shape:")[1].strip().splitlines()[1:]
    assert sorted((row.split()[2:4], row.split()[5]) for row in latest) == [(["NVIDIA", "H100"], "236.6"),
                                                                            (["NVIDIA", "H200"], "170.0")]  # fmt: skip
    (goal,) = [line for line in table.splitlines() if line.strip().startswith("T=16384 p50")]
    assert "rival 170.00 us, missed by 5.00 (3.0%) [run-03]" in goal


def test_each_gpus_records_stand_for_the_kernel_promoted_on_that_gpu(tmp_path):
    """An H100 runner promoted rival (promotions are per GPU, harness/promote.py): on the H200 the kernel in force
    is still promoted, so the H200 goal's in-force standing is promoted's H200 record, not rival's newer one;
    `harness results` names each GPU's promotion."""
    folder, h100 = tmp_path / "fuse_norm", {"device": "NVIDIA H100 80GB HBM3"}
    for r in (_record("promoted", "T=16384", 170.0, "03"), _record("rival", "T=16384", 168.0, "04"),
              _record("rival", "T=16384", 236.6, "05", environment=h100)):  # fmt: skip
        append(folder / RECORDS_FILE, r)
    for name, env, run in (("promoted", {"device": H200}, "run-03"), ("rival", h100, "run-05")):
        append(folder / PROMOTIONS_FILE, PromotionRecord(
            task="fuse_norm", action="promote", candidate=name, path=f"candidate_kernels/fuse_norm/{name}.py",
            content_hash=(name * 64)[:64], run_id=run, evidence=["x"], reason="planted", speedups={},
            environment=env))  # fmt: skip
    records = read(folder / RECORDS_FILE, EvaluationRecord)[0]
    in_force = goals.in_force_on("fuse_norm", records, tmp_path)
    assert in_force == {H200: ("promoted" * 8,), h100["device"]: (("rival" * 13)[:64],)}
    (large,) = [r for r in goals.assess(FUSE_NORM, records, in_force) if r.shape == "T=16384"]
    assert large.in_force.implementation == "promoted" and large.in_force.p50_us == 170.0
    assert large.best.implementation == "rival" and large.best.p50_us == 168.0
    table = format_results("fuse_norm", tmp_path, 5)
    assert (
        "Promoted on the NVIDIA H200: promoted (" in table and "Promoted on the NVIDIA H100 80GB HBM3: rival (" in table
    )
    (goal,) = [line for line in table.splitlines() if line.strip().startswith("T=16384 p50")]
    assert "170.00 us, missed by 5.00 (3.0%) [run-03]" in goal and goal.endswith("missed")
    append(folder / PROMOTIONS_FILE, PromotionRecord(
        task="fuse_norm", action="withdraw", candidate="rival", path="candidate_kernels/fuse_norm/rival.py",
        content_hash=("rival" * 13)[:64], run_id="run-06", evidence=["y"], reason="failed parity", speedups={},
        environment=h100))  # fmt: skip
    table = format_results("fuse_norm", tmp_path, 5)
    assert "Promoted on the NVIDIA H100 80GB HBM3: none, rival withdrawn in run run-06: failed parity" in table
    assert "Promoted on the NVIDIA H200: promoted (" in table


def test_without_a_task_results_shows_every_tasks_promotion_and_goals(tmp_path):
    append(tmp_path / "router_gemm" / RECORDS_FILE, _record("row", "T=8", 4.4, "02", task="router_gemm"))
    text = format_overview(tmp_path)
    for name, task in TASKS.items():
        assert f"== {name} ==" in text
        if not task.goals:
            assert f"Goals: none declared for {name}" in text
    router = text.split("== router_gemm ==")[1].split("==")[0]
    assert "Promoted: none" in router and "row 4.40 us, missed by 0.90 (25.7%) [run-02]" in router


# ---- one run, side by side -------------------------------------------------------------------------------
def test_a_runs_candidates_stand_side_by_side_and_reach_the_nightly_summary():
    records = [_record("a", "T=1", 2.2, "01"), _record("b", "T=1", 2.4, "01"), _record("a", "T=16384", 170.0, "01"),
               _record("reference", "T=1", 38.0, "01", kind="reference", candidate_hash=None)]  # fmt: skip
    rows = goals.side_by_side(FUSE_NORM, records)
    assert rows[0] == {"shape": "T=1", "goal": "p50 <= 2.3 us", "cells": {"a": "2.20 us, met by 0.10",
                       "b": "2.40 us, missed by 0.10 (4.3%)"}, "met": {"a": True, "b": False}}  # fmt: skip
    assert rows[1]["cells"] == {"a": "170.00 us, missed by 5.00 (3.0%)", "b": "-"} and rows[1]["met"]["b"] is None
    table = goals.run_goals_table(FUSE_NORM, records)
    assert table.startswith("Goals (p50 in this run; tasks/fuse_norm.py):") and "2.40 us, missed by 0.10" in table
    cpu = [_record("a", "T=1", 2.2, "01", device="cpu", policy="interpreter", timing=None)]
    assert goals.side_by_side(FUSE_NORM, cpu) == [] and goals.run_goals_table(FUSE_NORM, cpu) is None

    details = {"evaluation_run": "run-01", "goals": rows}
    done = [ItemRecord("night", "evaluate:fuse_norm", "done", "ok", [], details)]
    text = nightly_markdown("night", done, [], Thresholds().__dict__, "2026-12-05T06:00:00+00:00")
    assert "#### Goals in this run (tasks/fuse_norm.py)" in text
    assert "| `T=1` | p50 <= 2.3 us | 2.20 us, met by 0.10 | 2.40 us, missed by 0.10 (4.3%) |" in text
