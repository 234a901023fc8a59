"""`harness profile`: the model profile on beam-tiny (CPU profiler), the kernel profile's reading of an
Nsight Compute report (a stand-in for NVIDIA's ncu_report objects), and bad input. GPU: the model
profile with CUDA kernels and floors, and one candidate under the real ncu (skipped without it)."""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from harness import optimized_model, profile_analysis, profile_kernel
from harness import profile_kernel_records as kr
from harness.environment import REPO_ROOT
from harness.profile import ProfileSettings, main
from harness.profile_analysis import OP_NAMES, OUTER_SCOPES, ProfileMismatch
from harness.profile_model import OP_SHAPES, STEP_RANGE, CallLog, OpCall, load_ops, traced_ops
from harness.profile_summary import no_task_reason
from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.config import get_config
from reference_model.ops import REFERENCE_OPS, ModelOps
from reference_model.weights import random_model
from tasks import TASKS, get_task
from tasks.task import Cost, Shape

TINY = get_config("beam-tiny")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_FILES = ("summary.md", "ops.csv", "ops.md", "sites.csv", "sites.md", "layers.csv", "layers.md", "top_ops.png",
             "trace.json.gz", "profile.json")  # fmt: skip


def _profile(tmp: Path, scenario: str, **extra) -> Path:
    settings = ProfileSettings(model="beam-tiny", scenario=scenario, device="cpu", warmup=1, steps=2,
                               out=str(tmp), name=scenario, **extra)  # fmt: skip
    assert main(settings) == 0
    return tmp / scenario


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("profiles")
    return {scenario: _profile(out, scenario) for scenario in ("decode", "prefill")}


def _table(run: Path, name: str) -> pd.DataFrame:
    """A written CSV table: empty text cells as "", empty numbers as NaN."""
    frame = pd.read_csv(run / f"{name}.csv")
    text = [c for c in ("task", "site", "attention", "ffn") if c in frame.columns]
    return frame.fillna(dict.fromkeys(text, ""))


def _expected_calls(scenario: str) -> dict[str, int]:
    """Calls per step of each ModelOps op, from the config alone (the unpacked reference model)."""
    seqs = 1 if scenario == "decode" else 2  # the small scenario sizes
    n_moe = sum(TINY.is_moe(layer) for layer in range(TINY.n_layers))
    n_dense = TINY.n_layers - n_moe
    return {
        "rms_norm": 1, "norm_residual_norm": 2 * TINY.n_layers, "qk_norm_rope": TINY.n_layers,
        "attention": TINY.n_layers * seqs, "output_gate": TINY.n_layers, "linear": 5 * TINY.n_layers + 3 * n_dense,
        "swiglu": n_dense, "router_logits": n_moe, "moe_route": n_moe, "moe_experts": n_moe, "lm_head_logits": 1,
    }  # fmt: skip


@pytest.mark.parametrize("scenario", ["decode", "prefill"])
def test_model_profile_writes_every_artifact(runs, scenario):
    run = runs[scenario]
    assert sorted(p.name for p in run.iterdir()) == sorted(RUN_FILES)
    assert (run / "top_ops.png").read_bytes()[:8] == PNG_MAGIC
    with gzip.open(run / "trace.json.gz", "rt") as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"profile.step", "L0.attention", "L5.moe", "lm_head"} <= names
    assert set(_expected_calls(scenario)) <= names  # every op that ran has its named range
    meta = json.loads((run / "profile.json").read_text())
    assert meta["not_called"] == ["qkv_gate_proj"]  # the reference model runs unpacked projections
    assert meta["implementations"] == {} and "; ran " not in (run / "summary.md").read_text()
    assert meta["step"]["time_basis"] == "cpu" and meta["steps"] == 2


@pytest.mark.parametrize("scenario", ["decode", "prefill"])
def test_op_table_counts_every_call_and_shares_add_up(runs, scenario):
    ops = _table(runs[scenario], "ops")
    expected = _expected_calls(scenario)
    assert set(ops["op"]) == set(expected) == OP_NAMES - {"qkv_gate_proj"}
    assert dict(zip(ops["op"], ops["calls_per_step"], strict=True)) == pytest.approx(expected)
    assert ops["share_pct"].sum() == pytest.approx(100.0, abs=1e-6)
    assert list(ops["time_per_step_us"]) == sorted(ops["time_per_step_us"], reverse=True)
    assert (ops["kernels_per_step"] > 0).all()
    step = json.loads((runs[scenario] / "profile.json").read_text())["step"]
    assert ops["kernels_per_step"].sum() <= step["kernels"]
    assert ops["time_per_step_us"].sum() / 1e3 == pytest.approx(step["ops_ms"])
    assert step["ops_ms"] <= step["device_ms"]


@pytest.mark.parametrize("scenario", ["decode", "prefill"])
def test_task_costs_use_the_calls_actual_shape(runs, scenario):
    ops = _table(runs[scenario], "ops").set_index("op")
    T = 1 if scenario == "decode" else 2 * 16
    norm = get_task("fuse_norm").cost(Shape("", {"T": T, "D": TINY.hidden}))
    assert ops.loc["norm_residual_norm", "task"] == "fuse_norm"
    assert ops.loc["norm_residual_norm", "bytes_per_step"] == 2 * TINY.n_layers * norm.bytes
    assert ops.loc["norm_residual_norm", "flops_per_step"] == 2 * TINY.n_layers * norm.flops
    router = get_task("router_gemm").cost(Shape("", {"T": T, "D": TINY.hidden, "E": TINY.n_experts}))
    assert ops.loc["router_logits", "bytes_per_step"] == 3 * router.bytes
    # the four unpacked projections are what qkv_gate_gemm packs; o_proj and the MLP have no task
    assert ops.loc["linear", "task"] == "qkv_gate_gemm"
    assert 0 < ops.loc["linear", "task_time_pct"] < 100
    assert ops.loc["attention", "task"] == "" and pd.isna(ops.loc["attention", "bytes_per_step"])
    assert ops["floor_fraction"].isna().all()  # no roofline on CPU
    sites = _table(runs[scenario], "sites")
    linear = sites[sites["op"] == "linear"].set_index("site")
    assert set(linear.index) == {f"attention.{w}" for w in ("wq", "wk", "wv", "wg", "wo")} | {
        f"mlp.{w}" for w in ("w_gate", "w_up", "w_down")}  # fmt: skip
    assert set(linear[linear["task"] == "qkv_gate_gemm"].index) == {f"attention.{w}" for w in ("wq", "wk", "wv", "wg")}
    assert sites["share_pct"].sum() == pytest.approx(100.0, abs=1e-6)


def test_kernels_per_layer(runs):
    layers = _table(runs["decode"], "layers")
    assert list(layers["part"]) == ["embedding", *[f"L{i}" for i in range(TINY.n_layers)], "lm_head"]
    assert (layers["kernels_per_step"] > 0).all()
    body = layers[layers["layer"].notna()]
    assert list(body["attention"]) == ["global" if TINY.is_global(i) else "sliding" for i in range(TINY.n_layers)]
    assert list(body["ffn"]) == ["moe" if TINY.is_moe(i) else "dense" for i in range(TINY.n_layers)]
    assert (body["attention_kernels"] + body["ffn_kernels"] == body["kernels_per_step"]).all()
    # a sublayer's kernels include the norm boundary after it; all layers' together stay within the step
    step = json.loads((runs["decode"] / "profile.json").read_text())["step"]
    assert layers["kernels_per_step"].sum() <= step["kernels"]


# ---- the CUDA tables, from the chrome trace --------------------------------------------------------
def _x(cat, name, ts, dur=1.0, tid=1, correlation=None):
    args = {} if correlation is None else {"correlation": correlation}
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch_and_run(correlation, launch_ts, cat, run_ts, dur, tid=1):
    """A host call starting at launch_ts and the device work it launched, run by the GPU at run_ts."""
    call = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
    launch = _x("cuda_runtime", call, launch_ts, 2, tid, correlation)
    return [launch, _x(cat, f"work{correlation}", run_ts, dur, 9, correlation)]


def test_the_trace_gives_each_op_its_scope_and_the_device_work_launched_inside_it():
    trace = {"traceEvents": [
        _x("user_annotation", STEP_RANGE, 0, 1000),
        _x("user_annotation", "embedding", 10, 50),
        _x("user_annotation", "rms_norm", 20, 30),
        *_launch_and_run(1, 25, "kernel", 600, 5),  # runs after its op, its scope and its step ended
        _x("user_annotation", "norm_residual_norm", 70, 20),  # in no scope
        *_launch_and_run(2, 75, "gpu_memcpy", 80, 2),
        *_launch_and_run(3, 80, "kernel", 85, 3),
        _x("user_annotation", "L0.attention", 100, 300),
        _x("user_annotation", "linear", 110, 40),
        _x("cpu_op", "aten::mm", 115, 30),  # an ATen call inside the op: its launch is the op's
        *_launch_and_run(4, 120, "kernel", 500, 7),
        *_launch_and_run(5, 108, "kernel", 210, 11),  # in the scope, just before its op
        *_launch_and_run(6, 450, "gpu_memset", 455, 1),  # in the step, in no scope
        *_launch_and_run(7, 115, "kernel", 460, 100, tid=2),  # another thread's, during the op
        *_launch_and_run(8, 1100, "kernel", 1110, 13),  # after the step
        _x("user_annotation", "linear", 1200, 50),  # an op outside every step: not a profiled call
        _x("kernel", "launched_before_the_profile", 5, 4, 9, 99),
    ]}  # fmt: skip
    ranges = profile_analysis.trace_ranges(trace, STEP_RANGE, on_cuda=True)
    got = [(span.name, scope, span.time_us, span.host_us, span.kernels, span.copies) for span, scope in ranges.ops]
    assert got == [("rms_norm", "embedding", 5, 30, 1, 0), ("norm_residual_norm", "step", 5, 20, 1, 1),
                   ("linear", "L0.attention", 7, 40, 1, 0)]  # fmt: skip
    calls = [OpCall("rms_norm", "layers.0.attention.pre_norm", None, None),
             OpCall("norm_residual_norm", None, None, None),
             OpCall("linear", "layers.0.attention.wq", "qkv_gate_gemm", Cost(1000))]  # fmt: skip
    tables = profile_analysis.analyze(ranges, calls, TINY, 1, None, None)
    sites = tables.sites.set_index(["op", "site"])
    linear = sites.loc[("linear", "attention")]
    assert linear[["time_per_step_us", "host_per_step_us", "kernels_per_step"]].tolist() == [7, 40, 1]
    assert linear["achieved_gbps"] == pytest.approx(1000 / 7e3)
    assert sites.loc[("norm_residual_norm", "step"), "copies_per_step"] == 1
    layers = tables.layers.set_index("part")
    assert layers.loc["L0", ["attention_kernels", "time_per_step_us", "host_per_step_us"]].tolist() == [2, 18, 300]
    assert layers.loc["embedding", "kernels_per_step"] == 1
    step = tables.step
    assert (step.kernels, step.copies, step.op_calls) == (4, 2, 3)  # work 7 (other thread) and 8 (later) left out
    assert step.device_ms == pytest.approx(29e-3) and step.ops_ms == pytest.approx(17e-3) and step.host_ms == 1
    assert step.time_basis == "gpu kernels" and step.gpu_busy == pytest.approx(0.029)
    with pytest.raises(
        ProfileMismatch, match="first disagreement at call 1: range 'norm_residual_norm', logged 'linear'"
    ):
        profile_analysis.analyze(ranges, [calls[0], calls[2]], TINY, 1, None, None)
    with pytest.raises(ProfileMismatch, match="expected 2 step ranges in the profile; found 1"):
        profile_analysis.analyze(ranges, calls, TINY, 2, None, None)


def _reference_calls(cfg, seqs: int) -> list[OpCall]:
    """One step's op calls in the reference model's order (reference_model/model.py), with the weights
    its CallLog names for `linear` (the only op whose site names its weight); no tasks or costs."""

    def op(name, weight=None):
        return OpCall(name, weight, None, None)

    calls = [op("rms_norm")]
    for i in range(cfg.n_layers):
        calls += [op("linear", f"layers.{i}.attention.{w}") for w in ("wq", "wk", "wv", "wg")]
        calls += [op("qk_norm_rope"), *[op("attention")] * seqs, op("output_gate"),
                  op("linear", f"layers.{i}.attention.wo"), op("norm_residual_norm")]  # fmt: skip
        if cfg.is_moe(i):
            calls += [op("router_logits"), op("moe_route"), op("moe_experts")]
        else:
            gate, up, down = (op("linear", f"layers.{i}.mlp.{w}") for w in ("w_gate", "w_up", "w_down"))
            calls += [gate, up, op("swiglu"), down]
        calls.append(op("norm_residual_norm"))
    return [*calls, op("lm_head_logits")]


def test_the_chrome_trace_counts_the_device_work_each_range_launched():
    """Two ranges on the host thread; device work is counted by where its launch call (linked by
    correlation id) started, not by when the GPU ran it."""
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python"}},
        _x("user_annotation", "L0.attention", 100, 100),
        _x("cpu_op", "aten::mm", 120, 30),  # a nested op: its launch counts for the range around it
        _x("cuda_runtime", "cudaLaunchKernel", 125, correlation=1),
        _x("cuda_driver", "cuLaunchKernelEx", 160, correlation=2),  # a Triton launch by the range itself
        _x("cuda_runtime", "cudaLaunchKernel", 220, correlation=3),  # between the ranges: in neither
        _x("user_annotation", "L0.mlp", 250, 100),
        _x("cuda_runtime", "cudaMemcpyAsync", 260, correlation=4),
        _x("cuda_runtime", "cudaLaunchKernel", 270, correlation=5),
        _x("cuda_runtime", "cudaMemsetAsync", 280, correlation=6),
        _x("cuda_runtime", "cudaDeviceGetAttribute", 290, correlation=7),  # launches nothing
        _x("cuda_runtime", "cudaLaunchKernel", 300, tid=2, correlation=8),  # another thread
        {"ph": "s", "id": 1, "pid": 7, "tid": 1, "ts": 125, "cat": "ac2g", "name": "ac2g"},
        _x("kernel", "sm90_gemm", 400, tid=9, correlation=1),  # runs after its range ended
        _x("kernel", "triton_qk_norm_rope", 410, tid=9, correlation=2),
        _x("kernel", "outside", 420, tid=9, correlation=3),
        _x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 430, tid=9, correlation=4),
        _x("kernel", "swiglu", 440, tid=9, correlation=5),
        _x("gpu_memset", "Memset (Device)", 450, tid=9, correlation=6),
        _x("kernel", "other_thread", 460, tid=9, correlation=8),
        _x("kernel", "launched_before_the_profile", 90, tid=9, correlation=99),
    ]}  # fmt: skip
    assert profile_analysis.trace_range_launches(trace, on_cuda=True) == {
        "L0.attention": {"kernels": 2, "copies": 0}, "L0.mlp": {"kernels": 1, "copies": 2}}  # fmt: skip


def test_the_cpu_count_is_the_leaf_aten_calls_that_compute_started_inside_the_range():
    """On the CPU a range is charged with the ATen calls on its thread that started inside it, call no other
    ATen op and compute (views and allocations left out); its time is its own duration."""
    trace = {"traceEvents": [
        _x("user_annotation", STEP_RANGE, 0, 1000),
        _x("user_annotation", "L0.attention", 100, 300),
        _x("cpu_op", "aten::linear", 110, 50),  # calls t and mm: not a leaf
        _x("cpu_op", "aten::t", 110, 5),  # starts with its caller; a view
        _x("user_annotation", "linear", 112, 40),  # a range between linear and mm does not end the nesting
        _x("cpu_op", "aten::mm", 120, 40),  # ends with its caller: still inside it
        _x("cpu_op", "aten::add", 160, 10),  # starts as linear ends: linear's sibling, a leaf
        _x("cpu_op", "aten::empty", 175, 2),
        _x("cpu_op", "aten::copy_", 180, 10, tid=2),  # another thread's
        _x("cpu_op", "aten::sum", 390, 20),  # starts inside the range, ends after it
        _x("cpu_op", "aten::mul", 1100, 5),  # after the step
    ]}  # fmt: skip
    assert profile_analysis.trace_range_launches(trace, on_cuda=False) == {"L0.attention": {"kernels": 3, "copies": 0}}
    ranges = profile_analysis.trace_ranges(trace, STEP_RANGE, on_cuda=False)
    assert ranges.time_basis == "cpu"
    assert [(s.name, s.time_us, s.host_us, s.kernels) for s in ranges.steps] == [(STEP_RANGE, 1000, 1000, 3)]
    assert [(s.name, scope, s.time_us, s.kernels) for s, scope in ranges.ops] == [("linear", "L0.attention", 40, 1)]


def test_a_demangler_that_renames_l4_moe_in_the_events_changes_nothing_in_the_profile(
    runs, tmp_path, demangled_as_on_the_gpu_machine
):
    """The GPU machine's CPU profiles had L4.moe as ".moe" in prof.events(), so L4's MoE counted 0 kernels;
    the tables come from the chrome trace, which keeps the name, and are what they are without it."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        random_model(TINY, 0).decode(KVCache(TINY, 1, 40, "cpu"), torch.tensor([5]))
    names = {e.name for e in prof.events()}
    assert ".moe" in names and "L4.moe" not in names and {"L3.moe", "L4.attention"} <= names  # the fault, emulated
    run = _profile(tmp_path, "decode")
    layers, want = _table(run, "layers").set_index("part"), _table(runs["decode"], "layers").set_index("part")
    counted = ["attention_kernels", "ffn_kernels", "kernels_per_step", "copies_per_step"]
    assert layers[counted].equals(want[counted])
    assert layers.loc["L4", "ffn_kernels"] == layers.loc["L3", "ffn_kernels"] > 0


def test_the_reference_calls_are_what_the_call_log_records():
    log = CallLog()
    model = random_model(TINY, 0, ops=traced_ops(REFERENCE_OPS, log))
    log.know_weights(model)
    cache = KVCache(TINY, 2, 40, "cpu")
    fill_synthetic_context(cache, model, 20, seed=1)
    log.recording = True
    model.decode(cache, torch.tensor([5, 6]))

    def named(calls):
        return [(c.op, c.weight if c.op == "linear" else None) for c in calls]

    assert named(log.calls) == named(_reference_calls(TINY, seqs=2))


H200_DECODE = REPO_ROOT / "profiles" / "beam-slice-decode-reference-cuda-20261130T072238Z"
H200_PREFILL = REPO_ROOT / "profiles" / "beam-slice-prefill-reference-cuda-20261130T072255Z"
L4_MOE_OPS = ["router_logits", "moe_route", "moe_experts", "norm_residual_norm"]
SUMMED = ["calls_per_step", "time_per_step_us", "host_per_step_us", "kernels_per_step", "copies_per_step"]


@pytest.fixture(scope="module")
def h200() -> dict[Path, dict]:
    return {run: profile_analysis.read_trace(run / "trace.json.gz") for run in (H200_DECODE, H200_PREFILL)}


def _h200_tables(run: Path, trace: dict):
    """The committed run's ranges and tables as `harness profile` now reads them, from its trace and the
    reference model's calls (its own call log was not kept)."""
    meta = json.loads((run / "profile.json").read_text())
    cfg = get_config(meta["preset"])
    ranges = profile_analysis.trace_ranges(trace, STEP_RANGE, on_cuda=True)
    calls = _reference_calls(cfg, meta["size"]["seqs"]) * meta["steps"]
    return ranges, profile_analysis.analyze(ranges, calls, cfg, meta["steps"], None, None)


def _launched_in_steps(trace: dict) -> tuple[int, int, float]:
    """(kernels, copies, device us) of the device work whose launch call started inside a step range on
    the step's thread, found one device event at a time."""
    events = trace["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == STEP_RANGE]
    launch = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    spans = [(s["pid"], s["tid"], s["ts"], s["ts"] + s["dur"]) for s in steps]
    kernels, copies, device_us = 0, 0, 0.0
    for e in events:
        call = launch.get(e["args"]["correlation"]) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") else None
        if call and any((call["pid"], call["tid"]) == (pid, tid) and start <= call["ts"] <= end
                        for pid, tid, start, end in spans):  # fmt: skip
            kernels += e["cat"] == "kernel"
            copies += e["cat"] != "kernel"
            device_us += e["dur"]
    return kernels, copies, device_us


def _sites_with_l4_moe_in_place(run: Path) -> pd.DataFrame:
    """The committed sites.csv with its "step" rows (the ops of L4.moe, whose range the events lost)
    added to the "moe" rows, where the trace puts them."""
    sites = _table(run, "sites")
    assert sorted(sites.loc[sites["site"] == "step", "op"]) == sorted(L4_MOE_OPS)
    return sites.assign(site=sites["site"].replace("step", "moe")).groupby(["op", "site"])[SUMMED].sum()


def test_the_committed_h200_decode_tables_from_the_trace(h200):
    ranges, tables = _h200_tables(H200_DECODE, h200[H200_DECODE])
    assert [span.name for span, scope in ranges.ops if scope == "L4.moe"] == L4_MOE_OPS * 5
    step, recorded = tables.step, json.loads((H200_DECODE / "profile.json").read_text())["step"]
    kernels, copies, device_us = _launched_in_steps(h200[H200_DECODE])
    assert (step.kernels * 5, step.copies * 5) == (kernels, copies) == (4305, 125)
    assert step.device_ms * 5e3 == pytest.approx(device_us) and step.device_ms == pytest.approx(12.5657438)
    # The events put one copy more (about 1 us) into the five steps than the trace has launched inside
    # them; the trace's other 65 copies were launched between the steps, where the cache is restored.
    assert (recorded["copies"], recorded["device_ms"]) == (25.2, pytest.approx(12.565955))
    for figure in ("host_ms", "ops_ms", "kernels", "op_calls"):
        assert getattr(step, figure) == pytest.approx(recorded[figure])
    # Per op the events were right (L4.moe's ops counted, only under another site) ...
    ops = _table(H200_DECODE, "ops").set_index("op")
    pd.testing.assert_frame_equal(tables.ops.set_index("op")[[*SUMMED, "share_pct"]], ops[[*SUMMED, "share_pct"]])
    # ... and per site but for L4.moe's, which the trace puts under "moe"
    pd.testing.assert_frame_equal(tables.sites.set_index(["op", "site"])[SUMMED].sort_index(),
                                  _sites_with_l4_moe_in_place(H200_DECODE))  # fmt: skip
    layers, recorded_layers = tables.layers.set_index("part"), _table(H200_DECODE, "layers").set_index("part")
    pd.testing.assert_frame_equal(layers.drop(index="L4"), recorded_layers.drop(index="L4"), check_dtype=False)
    assert layers.loc["L4", ["attention_kernels", "ffn_kernels", "copies_per_step"]].tolist() == [95, 61, 5]
    assert layers.loc["L4", "time_per_step_us"] == pytest.approx(836.7594)  # the events: 242.3 (no L4.moe)


def test_the_committed_h200_prefill_tables_stay_within_what_the_gpu_ran(h200):
    trace = h200[H200_PREFILL]
    ranges, tables = _h200_tables(H200_PREFILL, trace)
    assert [span.name for span, scope in ranges.ops if scope == "L4.moe"] == L4_MOE_OPS
    step = tables.step
    assert (step.kernels, step.copies, step.device_ms * 1e3) == pytest.approx(_launched_in_steps(trace))
    # The events gave 24822 kernels and 3779 ms of device time, 121% of the wall time: more than the
    # whole trace holds (22600 kernels, 2866 ms of device work), all of it launched inside the one step.
    assert step.kernels == sum(e.get("cat") == "kernel" for e in trace["traceEvents"]) == 22600
    assert step.copies == 1344 and step.device_ms == pytest.approx(2865.7178)
    assert step.device_ms <= step.host_ms and step.gpu_busy == pytest.approx(0.916, abs=1e-3)
    assert step.ops_ms <= step.device_ms and tables.ops["share_pct"].sum() == pytest.approx(100)
    shares = tables.ops.set_index("op")["share_pct"]  # summary.md, from the events: 92%, 3.2%, 2.2%, 1.3%
    assert shares[["attention", "moe_experts", "linear", "norm_residual_norm"]].round(1).tolist() == [
        90.5, 4.1, 2.2, 1.4]  # fmt: skip
    # Host times and calls are the ranges' own: the same in the events wherever they kept the range ...
    sites = tables.sites.set_index(["op", "site"])[SUMMED].sort_index()
    recorded = _sites_with_l4_moe_in_place(H200_PREFILL)
    pd.testing.assert_frame_equal(sites[["calls_per_step", "host_per_step_us"]],
                                  recorded[["calls_per_step", "host_per_step_us"]])  # fmt: skip
    # ... but the events attached more device work to most ranges than was launched inside them.
    assert (sites[["time_per_step_us", "kernels_per_step", "copies_per_step"]]
            <= recorded[["time_per_step_us", "kernels_per_step", "copies_per_step"]] + 1e-6).all().all()  # fmt: skip
    assert sites.loc[("attention", "attention"), ["kernels_per_step", "copies_per_step"]].tolist() == [6272, 384]
    assert recorded.loc[("attention", "attention"), ["kernels_per_step", "copies_per_step"]].tolist() == [7962, 542]
    assert tables.layers["kernels_per_step"].sum() <= step.kernels


@pytest.mark.parametrize("folder, kernels_copies, l4_ffn_kernels", [
    ("beam-slice-decode-optimized-cuda-20261201T180611Z", (980, 45), 6),  # f2b93ac, eighth session
    ("beam-slice-decode-optimized-cuda-20261201T193144Z", (565, 20), 5),  # 03cf9fd: ring decode, compiled ops
])  # fmt: skip
def test_the_optimized_h200_profiles_are_what_their_own_traces_hold(folder, kernels_copies, l4_ffn_kernels):
    """The profiles `harness profile ops=optimized` wrote from the trace on the H200 (promoted ops): their
    step figures and kernels per layer equal an independent count of the device work in their traces."""
    run = REPO_ROOT / "profiles" / folder
    trace = profile_analysis.read_trace(run / "trace.json.gz")
    meta = json.loads((run / "profile.json").read_text())
    steps, step = meta["steps"], meta["step"]
    kernels, copies, device_us = _launched_in_steps(trace)
    assert (step["kernels"] * steps, step["copies"] * steps) == (kernels, copies) == kernels_copies
    assert step["device_ms"] * steps * 1e3 == pytest.approx(device_us)
    assert sum(e.get("cat") == "kernel" for e in trace["traceEvents"]) == kernels  # none launched outside
    cfg = get_config(meta["preset"])
    counts = profile_analysis.trace_range_launches(trace, on_cuda=True)
    layers = _table(run, "layers").set_index("part")
    for i in range(cfg.n_layers):
        ffn = "moe" if cfg.is_moe(i) else "mlp"
        want = [counts[f"L{i}.attention"]["kernels"] / steps, counts[f"L{i}.{ffn}"]["kernels"] / steps]
        assert layers.loc[f"L{i}", ["attention_kernels", "ffn_kernels"]].tolist() == want, f"L{i}"
    assert layers.loc["L4", "ffn_kernels"] == l4_ffn_kernels  # the range the events once lost


def test_the_committed_h200_trace_holds_the_range_its_events_lost():
    """`harness profile model=beam-slice` on the H200: prof.events() lost L4.moe in all 5 steps (its name
    demangled to ".moe", harness/profile_analysis.py; its layers.csv says 0 kernels there); counted from the
    same run's chrome trace, every range is present and every range the events kept has the count
    layers.csv recorded."""
    cfg = get_config("beam-slice")
    steps = json.loads((H200_DECODE / "profile.json").read_text())["steps"]
    counts = profile_analysis.trace_range_launches(profile_analysis.read_trace(H200_DECODE / "trace.json.gz"), True)
    per_step = {name: {k: n / steps for k, n in c.items()} for name, c in counts.items()}
    sublayers = [[f"L{i}.attention", f"L{i}.{'moe' if cfg.is_moe(i) else 'mlp'}"] for i in range(cfg.n_layers)]
    assert sorted(per_step) == sorted(["embedding", *sum(sublayers, []), "lm_head"])
    assert [[per_step[n]["kernels"] for n in pair] for pair in sublayers] == [
        [95, 34], [95, 34], [95, 34], [95, 61], [95, 61], [79, 61]]  # fmt: skip
    # L4.moe: 58 cudaLaunchKernel + 3 Triton cuLaunchKernelEx; one memcpy and two memsets
    assert per_step["L4.moe"] == {"kernels": 61, "copies": 3}
    layers = _table(H200_DECODE, "layers").set_index("part")
    assert layers.loc["L4", "ffn_kernels"] == 0 and layers.loc["L4", "copies_per_step"] == 2  # what the events said
    for layer, (attention, ffn) in enumerate(sublayers):
        row = layers.loc[f"L{layer}"]
        assert per_step[attention]["kernels"] == row["attention_kernels"]
        if layer != 4:
            assert per_step[ffn]["kernels"] == row["ffn_kernels"]
            assert per_step[attention]["copies"] + per_step[ffn]["copies"] == row["copies_per_step"]
    for part in OUTER_SCOPES:
        assert per_step[part]["kernels"] == layers.loc[part, "kernels_per_step"]


def test_summary_names_the_dominating_ops_and_their_tasks(runs):
    for run in runs.values():
        summary = (run / "summary.md").read_text()
        ops = _table(run, "ops")
        assert "python -m harness profile model=beam-tiny" in summary
        ranking = summary.split("## Which ops dominate")[1].split("## Ops")[0]
        bullets = [line for line in ranking.splitlines() if line.startswith("- `")]
        assert [b.split("`")[1] for b in bullets] == list(ops["op"].head(12))  # in the measured order
        for bullet, (_, row) in zip(bullets, ops.iterrows(), strict=False):
            assert f"{row['share_pct']:.1f}%" in bullet
            if row["task"]:
                assert f"task `{row['task']}`" in bullet
            else:
                assert no_task_reason(row["op"]) in bullet


def test_the_optimized_profile_names_what_implements_each_op(tmp_path, capsys):
    """ops=optimized on the CPU: each promoted task's op names its candidate, the others the
    reference, in profile.json and in the summary's ranking; the build is announced and timed (on a
    fresh GPU machine it compiles for minutes before anything else is printed)."""
    run = _profile(tmp_path, "decode", ops="optimized")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "profile: building ops=optimized on cpu (harness.optimized_model.build_model_ops)"
    assert re.fullmatch(r"profile: ops=optimized built in \d+\.\d s", printed[1]), printed[:3]
    promoted = optimized_model.promoted_choices()
    assert promoted, "no promotion records: nothing to check"
    want = {field: "reference" for field in OP_NAMES}
    want |= {optimized_model.TASK_FIELDS[t]: f"candidate {t}/{c.name}" for t, c in promoted.items()}
    meta = json.loads((run / "profile.json").read_text())
    assert meta["implementations"] == want and meta["pack_qkv_gate"] is True
    ranking = (run / "summary.md").read_text().split("## Which ops dominate")[1].split("## Ops")[0]
    bullets = [line for line in ranking.splitlines() if line.startswith("- `")]
    assert bullets
    for bullet in bullets:
        assert f"; ran {want[bullet.split('`')[1]]}. By site:" in bullet


@pytest.mark.parametrize("returned", ["two", "not_ops"])
def test_an_optimized_hook_of_the_wrong_shape_is_named(monkeypatch, returned):
    value = (REFERENCE_OPS, True) if returned == "two" else ("ops", True, {})
    monkeypatch.setattr(optimized_model, "build_model_ops", lambda device: value)
    with pytest.raises(
        TypeError,
        match=r"must return \(ModelOps, bool, Mapping\[str, str\]\); got \((ModelOps, bool|str, bool, dict)\)",
    ):
        load_ops("optimized", torch.device("cpu"))


def test_traced_ops_name_every_op_and_change_nothing():
    log = CallLog()
    traced = traced_ops(REFERENCE_OPS, log)
    model_ref, model_traced = random_model(TINY, 0), random_model(TINY, 0, ops=traced)
    log.know_weights(model_traced)
    logits = []
    for model in (model_ref, model_traced):
        cache = KVCache(TINY, 1, 40, "cpu")
        fill_synthetic_context(cache, model, 20, seed=1)
        logits.append(model.decode(cache, torch.tensor([5])))
    assert torch.equal(logits[0], logits[1])  # wrapping changes no bit
    log.recording = True
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        traced.output_gate(torch.zeros(1, 2, 4, dtype=torch.bfloat16), torch.zeros(1, 2, 4, dtype=torch.bfloat16),
                           model_traced.layers[0].attention.gate_bias[:2].clone())  # fmt: skip
    assert [c.op for c in log.calls] == ["output_gate"] and log.calls[0].task == "output_gate"
    assert "output_gate" in {e.name for e in prof.events()}
    assert {f.name for f in dataclasses.fields(ModelOps)} == OP_NAMES


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(model="beam-tiny", scenario="decoding"), "scenario 'decoding' unknown; known: ['decode', 'prefill']"),
        (dict(model="beam-huge"), "preset 'beam-huge' unknown; known:"),
        (dict(model="beam"), "exists only on the meta device"),
        (dict(model="beam-tiny", context=5000), "exceed the max_positions=4096 of preset 'beam-tiny'"),
        (dict(model="beam-tiny", new_tokens=4), "decode adds one token per sequence"),
        (dict(model="beam-tiny", ops="fastest"), "ops 'fastest' unknown; known: ['reference', 'optimized']"),
        (dict(task="fuse_nrom", candidate="x"), "task 'fuse_nrom' unknown; known: ["),
        (dict(task="fuse_norm", candidate="no_such_kernel"), "candidate 'no_such_kernel' not found for task"),
        (dict(task="fuse_norm", candidate="{candidate}", shapes=("T=2",)), "no GPU shapes ['T=2']; known: ['T=1'"),
        (dict(task="fuse_norm", candidate="{candidate}", ncu="/no/such/ncu"), "ncu='/no/such/ncu' is not an exec"),
    ],
)
def test_bad_input_is_named(settings, message, tmp_path, capsys, candidate_file):
    settings = {k: (v.format(candidate=candidate_file) if isinstance(v, str) else v) for k, v in settings.items()}
    assert main(ProfileSettings(device="cpu" if "model" in settings else "auto", out=str(tmp_path), **settings)) == 1
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_settings_refuse_mixed_or_missing_targets(tmp_path):
    with pytest.raises(ValueError, match="exactly one of model=<preset>"):
        ProfileSettings()
    with pytest.raises(ValueError, match="exactly one of model=<preset>"):
        ProfileSettings(model="beam-tiny", task="fuse_norm", candidate="x")
    with pytest.raises(ValueError, match="needs candidate=<name>"):
        ProfileSettings(task="fuse_norm")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ProfileSettings(model="beam-tiny", steps=0)


def test_existing_run_name_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    assert main(ProfileSettings(model="beam-tiny", device="cpu", out=str(tmp_path), name="taken")) == 1
    assert "profiles are never overwritten" in capsys.readouterr().err


# ---- the kernel profile ----------------------------------------------------------------------------
CANDIDATE_SOURCE = """
CANDIDATE = {"author": "human", "model": None, "parent": None, "idea": "test stand-in"}


def norm_residual_norm(y_TD, h_TD, post_weight_D, pre_weight_D, n, eps):
    raise NotImplementedError
"""


@pytest.fixture
def candidate_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("candidates") / "stand_in.py"
    path.write_text(CANDIDATE_SOURCE)
    return str(path)


def test_kernel_profile_without_ncu_says_so_and_writes_nothing(tmp_path, capsys, monkeypatch, candidate_file):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(profile_kernel, "NCU_FALLBACKS", ())
    results = tmp_path / "results"
    settings = ProfileSettings(task="fuse_norm", candidate=candidate_file, results_dir=str(results))
    assert main(settings) == 0
    out = capsys.readouterr().out
    assert "kernel profile of fuse_norm/stand_in skipped" in out and "ncu not found" in out
    if not torch.cuda.is_available():
        assert "no CUDA GPU here" in out
    assert "Nothing was written" in out and not results.exists()


class _Metric:
    def __init__(self, value):
        self._value = value

    def value(self):
        return self._value


class _Action:
    """What nsight-python's extraction reads of an ncu_report action (extraction.extract_ncu_action_data)."""

    def __init__(self, name, annotation, metrics):
        self._name, self._annotation = name, annotation
        self._metrics = {**metrics, "device__attribute_clock_rate": 1980000,
                         "device__attribute_memory_clock_rate": 2619000,
                         "device__attribute_display_name": "NVIDIA H200"}  # fmt: skip

    def name(self):
        return self._name

    def metric_names(self):
        return list(self._metrics)

    def __getitem__(self, metric):
        return _Metric(self._metrics[metric])

    def nvtx_state(self):
        action = self

        class State:
            def domains(self):
                return [0]

            def domain_by_id(self, _):
                return type("Domain", (), {"name": lambda _: "nsight-python",
                                           "push_pop_ranges": lambda _: [action._annotation]})()  # fmt: skip

        return State()


class _Report:
    def __init__(self, actions):
        self._actions = actions

    def num_ranges(self):
        return 1

    def range_by_idx(self, _):
        return self

    def num_actions(self):
        return len(self._actions)

    def action_by_idx(self, i):
        return self._actions[i]


def _kernel(duration, dram_pct, occupancy, regs, local_ld, dram_read, block=128, issue=30.0, xu=5.0, l2_sectors=0,
            l1_hit=0.0, long_scoreboard=2.0):  # fmt: skip
    stalls = {r: 0.25 for r in kr.STALL_REASONS} | {
        "long_scoreboard": long_scoreboard,
        "wait": 3.0,
        "not_selected": 1.0,
    }
    return {
        **{f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": v for r, v in stalls.items()},
        "smsp__average_warp_latency_per_inst_issued.ratio": sum(stalls.values()),
        "lts__throughput.avg.pct_of_peak_sustained_elapsed": 2 * dram_pct,
        "lts__t_sectors_srcunit_tex_op_read.sum": l2_sectors, "l1tex__t_sector_hit_rate.pct": l1_hit,
        "smsp__issue_active.avg.pct_of_peak_sustained_active": issue,
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": xu,
        "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active": 2.0,
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": 12.0,
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": 8.0,
        "gpu__time_duration.sum": duration, "dram__throughput.avg.pct_of_peak_sustained_elapsed": dram_pct,
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": 10.0,
        "sm__warps_active.avg.pct_of_peak_sustained_active": occupancy,
        "sm__maximum_warps_per_active_cycle_pct": 50.0, "launch__registers_per_thread": regs,
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": local_ld, "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": 0,
        "dram__bytes_read.sum": dram_read, "dram__bytes_write.sum": 1000, "launch__grid_size": 132,
        "launch__block_size": block,
    }  # fmt: skip


def _profile_through_nsight(monkeypatch, tmp_path, label, kernels, metrics):
    """The child's first run on one shape, through nsight-python's own decorator, extraction and
    aggregation; ncu's launch and NVIDIA's report reader are the stand-ins."""
    import nsight
    import nsight.collection.ncu as nsight_ncu
    import nsight.extraction as nsight_extraction

    from harness import profile_kernel_child as pkc

    launched = []
    report = _Report([_Action(name, label, {m: v for m, v in values.items() if m in metrics})
                      for name, values in kernels])  # fmt: skip
    monkeypatch.setattr(nsight_ncu, "launch_ncu", lambda path, *a, **k: launched.append((path, os.environ.copy())))
    monkeypatch.setattr(nsight_extraction, "ncu_report", type("R", (), {"load_report": staticmethod(lambda p: report)}))
    monkeypatch.delenv(pkc.RERUN_ENV, raising=False)
    monitor = pkc.ProfileMonitor(writable=(str(tmp_path),), library_roots=())
    event = pkc.profile_shape(nsight, monitor, label, pkc.report_prefix(str(tmp_path), 0), metrics)
    assert launched[0][0] == f"{tmp_path}/nsight/shape0-ncu-output-profiled-0.ncu-rep"
    assert launched[0][1][pkc.SHAPE_ENV] == label  # the re-run learns its shape from the environment
    return event


def test_profiled_call_through_nsight_python_combines_kernels_per_metric(monkeypatch, tmp_path):
    metrics = list(kr.METRICS)
    event = _profile_through_nsight(monkeypatch, tmp_path, "T=1", [
        ("_fused", _kernel(3000, 20.0, 50.0, 40, 0, 10_000, issue=60.0, xu=40.0, l2_sectors=900, l1_hit=60.0,
                           long_scoreboard=16.0)),
        ("_tail", _kernel(1000, 80.0, 25.0, 96, 64, 30_000, block=256, l2_sectors=100, l1_hit=20.0,
                          long_scoreboard=4.0)),
    ], metrics)  # fmt: skip
    assert event["kernels"] == ["_fused", "_tail"] and event["report"] is None  # no real ncu wrote one
    v = event["values"]
    assert v["duration_ns"] == 4000 and v["registers_per_thread"] == 96 and v["block_size"] == 256
    assert v["dram_throughput_pct"] == pytest.approx((20.0 * 3000 + 80.0 * 1000) / 4000)
    assert v["achieved_occupancy_pct"] == pytest.approx((50.0 * 3000 + 25.0 * 1000) / 4000)
    assert v["theoretical_occupancy_pct"] == pytest.approx(50.0)
    assert v["issue_active_pct"] == pytest.approx((60.0 * 3000 + 30.0 * 1000) / 4000)
    assert v["xu_pipe_pct"] == pytest.approx((40.0 * 3000 + 5.0 * 1000) / 4000)
    assert v["dram_read_bytes"] == 40_000 and v["local_load_bytes"] == 64
    task = get_task("fuse_norm")
    shape = task.shape("T=1", "cuda")
    compiled = [{"name": "_fused", "n_regs": 40, "n_spills": 0, "num_warps": 4},
                {"name": "_tail", "n_regs": 96, "n_spills": 3, "num_warps": 8}]  # fmt: skip
    fig = kr.shape_figures(event["kernels"], v, compiled, task, shape, copy_gbps=4000.0, gemm_tflops=None)
    assert fig["duration_us"] == pytest.approx(4.0) and fig["spill_bytes"] == 64 and fig["triton_spills"] == 3
    assert fig["dram_bytes"] == pytest.approx(40_000 + 2000)
    # L2: what the SMs read from it, in 32-byte sectors; its throughput and L1's hit rate duration-weighted
    assert fig["l2_read_bytes"] == 1000 * 32
    assert fig["l2_throughput_pct"] == pytest.approx((40.0 * 3000 + 160.0 * 1000) / 4000)
    assert fig["l1_hit_pct"] == pytest.approx((60.0 * 3000 + 20.0 * 1000) / 4000)
    # the stall reasons, in warp cycles per issued instruction, duration-weighted; their total beside them
    assert fig["stalls"]["long_scoreboard"] == pytest.approx((16.0 * 3000 + 4.0 * 1000) / 4000)
    assert set(fig["stalls"]) == set(kr.STALL_REASONS) and fig["stalls"]["wait"] == pytest.approx(3.0)
    assert fig["warp_cycles_per_issue"] == pytest.approx(13.0 + 3.0 + 1.0 + 0.25 * (len(kr.STALL_REASONS) - 3))
    cost = task.cost(shape)
    assert fig["floor_bytes"] == cost.bytes and fig["floor_fraction"] == pytest.approx(cost.bytes / 4000e3 / 4.0)
    record = kr.KernelProfileRecord(
        run_id="r", task=task.name, candidate="c", candidate_hash="a" * 64, candidate_path="p", shape_label="T=1",
        shape=dict(shape.params), status="profiled", detail="", kernels=event["kernels"], **fig,
    )  # fmt: skip
    section = kr.kernel_profile_section([record.to_dict()])
    assert "| c | T=1 | profiled | 2 | 4.0 |" in section
    assert "| 52.5 | xu 31 fma 12 alu 8 fp64 2 |" in section  # issue %, then the pipes busiest first
    assert "| 70.0 | 32.00 KB | 50.0 |" in section  # L2 % of peak, bytes the SMs read from L2, L1 hit %
    assert "| long_scoreboard 13.0 wait 3.0 not_selected 1.0 of 20.8 |" in section  # the largest three, the total
    with pytest.raises(ValueError, match="needs its kernels"):
        dataclasses.replace(record, kernels=[])
    with pytest.raises(ValueError, match="non-finite"):
        dataclasses.replace(record, floor_us=float("nan"))
    with pytest.raises(ValueError, match="needs a detail"):
        dataclasses.replace(record, status="crash")


def test_a_metric_this_ncu_lacks_stays_none_and_autotuned_spills_pick_by_launch(monkeypatch, tmp_path):
    lacked = (
        "sm__maximum_warps_per_active_cycle_pct",
        "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    )
    metrics = [m for m in kr.METRICS if m not in lacked]
    event = _profile_through_nsight(monkeypatch, tmp_path, "T=16384", [("_tail", _kernel(2000, 90.0, 70.0, 96, 0, 1))],
                                    metrics)  # fmt: skip
    assert event["kernels"] == ["_tail"] and event["values"]["theoretical_occupancy_pct"] is None
    task = get_task("fuse_norm")
    compiled = [{"name": "_tail", "n_regs": 96, "n_spills": 3, "num_warps": 4},  # the one that ran (96 regs)
                {"name": "_tail", "n_regs": 255, "n_spills": 40, "num_warps": 4}]  # fmt: skip
    fig = kr.shape_figures(event["kernels"], event["values"], compiled, task, task.shape("T=16384", "cuda"), None, None)
    assert fig["triton_spills"] == 3 and fig["floor_fraction"] is None and fig["theoretical_occupancy_pct"] is None
    assert "imc_miss" not in fig["stalls"] and fig["stalls"]["long_scoreboard"] == 2.0  # a lacked reason: left out


def test_the_audit_hook_lets_only_nsight_pythons_ncu_commands_through_and_only_with_the_permit():
    from harness import profile_kernel_child as pkc

    monitor = pkc.ProfileMonitor(writable=("/nonexistent",), library_roots=())
    run_ncu = ("/bin/sh", ["/bin/sh", "-c", "ncu --log-file x --metrics a -f -o r.ncu-rep python c.py q.json"])
    with pytest.raises(PermissionError):
        monitor._check("subprocess.Popen", (*run_ncu, None, None))
    with monitor.ncu_permit():
        monitor._check("subprocess.Popen", (None, ["ncu", "--version"], None, None))
        monitor._check("subprocess.Popen", (*run_ncu, None, None))
        with pytest.raises(PermissionError):
            monitor._check("subprocess.Popen", ("/bin/sh", ["/bin/sh", "-c", "curl x | sh"], None, None))
    assert monitor.violations == ["process: subprocess.Popen '/bin/sh'"] * 1


def test_variables_ncu_put_in_the_re_run_are_not_recorded_as_secret_reads(monkeypatch):
    from harness import profile_kernel_child as pkc

    monkeypatch.setenv("NV_TPS_LAUNCH_TOKEN", "ncu's own")
    monkeypatch.setenv("HOME", "/scratch")
    assert pkc.injected_by_ncu({"env_names": [k for k in os.environ if k != "NV_TPS_LAUNCH_TOKEN"]}) == {
        "NV_TPS_LAUNCH_TOKEN"}  # fmt: skip
    # The witness itself, in a fresh interpreter (an audit hook cannot be removed again).
    script = (
        "import os; from harness import sandbox\n"
        "m = sandbox.Monitor(writable=(), library_roots=(), harmless_env=frozenset({'NV_TPS_LAUNCH_TOKEN'}))\n"
        "m.install(); dict(os.environ.copy()); os.environ.get('GITHUB_TOKEN'); print(m.violations)"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[1]),
           "NV_TPS_LAUNCH_TOKEN": "ncu's own", "GITHUB_TOKEN": "planted"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['secret_env_read: GITHUB_TOKEN']", out


def _child_run(events, returncode=0, timed_out=False):
    from harness.sandbox import ChildRun

    return ChildRun(returncode, timed_out, 1.0, events, "")


def test_shape_statuses_turn_the_childs_end_into_data():
    labels = ["T=1", "T=8", "T=64"]
    iso = {"event": "isolation", "layers": {}}
    crashed = _child_run([iso, {"event": "shape_start", "shape": "T=1"}, {"event": "profiled", "shape": "T=1"},
                          {"event": "shape_start", "shape": "T=8"}], returncode=-11)  # fmt: skip
    assert kr.shape_statuses(crashed, labels, 60) == {
        "T=1": ("profiled", ""), "T=8": ("crash", "the child died (SIGSEGV) without reporting"),
        "T=64": ("not_run", "not run: the child stopped earlier (crash)"),
    }  # fmt: skip
    hung = _child_run([iso, {"event": "shape_start", "shape": "T=1"}], returncode=None, timed_out=True)
    assert kr.shape_statuses(hung, labels, 60)["T=1"] == ("timeout", "killed after 60 s (timeout_s)")
    failed_import = _child_run([iso, {"event": "import_error", "status": "import_error", "message": "boom",
                                      "violations": []}])  # fmt: skip
    assert set(kr.shape_statuses(failed_import, labels, 60).values()) == {("import_error", "boom")}
    errored = _child_run([iso, {"event": "call_error", "shape": "T=8", "status": "runtime_error", "message": "bad"},
                          {"event": "done", "violations": ["network: socket.connect"]}])  # fmt: skip
    assert kr.shape_statuses(errored, labels, 60)["T=1"][0] == "sandbox_violation"

    ran_under_ncu = _child_run([iso, {"event": "shape_start", "shape": "T=1"},
                                {"event": "rerun_error", "shape": "T=1", "status": "cuda_fault", "message": "IMA"},
                                {"event": "profile_error", "shape": "T=1", "message": "ProfilerException: x"},
                                {"event": "shape_start", "shape": "T=8"},
                                {"event": "profile_error", "shape": "T=8", "message": "ERR_NVGPUCTRPERM"},
                                {"event": "done", "violations": []}])  # fmt: skip
    statuses = kr.shape_statuses(ran_under_ncu, labels, 60)
    assert statuses["T=1"] == ("cuda_fault", "under ncu: IMA") and statuses["T=8"] == ("profiler_error",
                                                                                       "ERR_NVGPUCTRPERM")  # fmt: skip


@pytest.mark.parametrize("ending", ["crash", "hang"])
def test_a_crashing_or_hanging_profiled_child_becomes_statuses(tmp_path, monkeypatch, candidate_file, ending):
    """The parent's process handling on a stand-in child (the real one needs CUDA and ncu)."""
    (tmp_path / "stand_in_child.py").write_text(
        "import json, os, signal, sys, time\n"
        "req = json.load(open(sys.argv[1]))\n"
        "assert os.environ['PATH'].startswith(req['ncu_dir']) and os.environ['PYTHONSAFEPATH'] == '1'\n"
        "with open(req['report_path'], 'a') as f:\n"
        "    f.write(json.dumps({'event': 'isolation', 'layers': {}}) + '\\n')\n"
        "    f.write(json.dumps({'event': 'shape_start', 'shape': req['shapes'][0]}) + '\\n')\n"
        f"{'time.sleep(60)' if ending == 'hang' else 'os.kill(os.getpid(), signal.SIGSEGV)'}\n"
    )  # fmt: skip
    (tmp_path / "bin").mkdir()
    ncu = tmp_path / "bin" / "ncu"
    ncu.write_text("#!/bin/sh\n")
    ncu.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the child's
    monkeypatch.syspath_prepend(str(tmp_path))  # the parent's (it finds the child's file, for the re-run's command)
    monkeypatch.setattr(profile_kernel, "CHILD_MODULE", "stand_in_child")
    original = json.dumps
    monkeypatch.setattr(
        profile_kernel.json,
        "dumps",
        lambda obj, **k: original({**obj, "ncu_dir": str(ncu.parent)} if "shapes" in obj else obj, **k),
    )
    settings = ProfileSettings(task="fuse_norm", candidate=candidate_file, shapes=("T=1", "T=16384"), timeout_s=5,
                               cache_dir=str(tmp_path / "cache"))  # fmt: skip
    job = profile_kernel.prepare(settings)
    job = dataclasses.replace(job, ncu=str(ncu), skip_reason=None)
    run, _ = profile_kernel._run_child(job, list(kr.METRICS), tmp_path / "root", [])
    profile_kernel._check_child(run)
    statuses = kr.shape_statuses(run, ["T=1", "T=16384"], settings.timeout_s)
    first = ("timeout", "killed after 5 s (timeout_s)") if ending == "hang" else (
        "crash", "the child died (SIGSEGV) without reporting")  # fmt: skip
    assert statuses == {"T=1": first, "T=16384": ("not_run", f"not run: the child stopped earlier ({first[0]})")}


# ---- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_model_profile_on_cuda_counts_kernels_and_floors(tmp_path):
    settings = ProfileSettings(model="beam-tiny", device="cuda", warmup=1, steps=2, out=str(tmp_path), name="gpu")
    assert main(settings) == 0
    ops = _table(tmp_path / "gpu", "ops").set_index("op")
    step = json.loads((tmp_path / "gpu" / "profile.json").read_text())["step"]
    assert step["time_basis"] == "gpu kernels" and 0 < step["gpu_busy"] <= 1.0
    assert (ops["kernels_per_step"] >= 1).all()
    assert 0 < ops.loc["norm_residual_norm", "floor_fraction"] < 1.5


@pytest.mark.gpu
def test_kernel_profile_of_a_candidate_under_ncu(tmp_path):
    if profile_kernel.find_ncu(None) is None:
        pytest.skip("Nsight Compute (ncu) not installed")
    settings = ProfileSettings(task="fuse_norm", candidate="row_per_program", shapes=("T=1", "T=16384"),
                               results_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert main(settings) == 0
    found, skipped = kr.load_profiles(tmp_path, "fuse_norm")
    assert not skipped and [r.shape_label for r in found] == ["T=1", "T=16384"]
    for r in found:
        assert r.status == "profiled", r.detail
        assert r.metrics_missing == [], f"this ncu lacks {r.metrics_missing}"
        assert r.duration_us > 0 and 0 < r.dram_throughput_pct <= 100 and 0 < r.achieved_occupancy_pct <= 100
        assert r.registers_per_thread > 0 and r.spill_bytes is not None and 0 < r.floor_fraction < 1.5
        assert r.kernels and r.block_size > 0 and r.ncu_options.startswith("nsight-python 0.9.6")
        assert (tmp_path / r.ncu_report).is_file()
        # every stall reason recorded; together they make up a warp's cycles per issued instruction
        assert set(r.stalls) == set(kr.STALL_REASONS) and r.warp_cycles_per_issue > 1
        assert sum(r.stalls.values()) == pytest.approx(r.warp_cycles_per_issue, rel=0.15)
    big = found[1]  # base units: DRAM bytes of the large shape within reach of the task's byte floor
    assert 0.5 < big.dram_bytes / big.floor_bytes < 4


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_every_task_op_is_costed_at_its_calls_shape(task_name):
    """The model profile reads each task's shape from the op's own arguments: on the task's own inputs,
    that must give the task's Cost at the task's shape."""
    task = TASKS[task_name]
    if task.op_name not in OP_NAMES:
        pytest.skip(f"{task.op_name} is not a ModelOps op")
    shape = task.cpu_shapes[0]
    args = inspect.signature(task.reference).bind(**task.make_inputs(shape, 0, torch.device("cpu"))).arguments
    assert task.op_name in OP_SHAPES, f"profile_model.OP_SHAPES has no entry for {task.op_name}"
    params = OP_SHAPES[task.op_name](args)
    assert task.cost(Shape("from the call", params)) == task.cost(shape)


def test_metrics_unknown_to_this_ncu_are_dropped_not_fatal():
    query = """Device NVIDIA H200 (GH100)
    ----------------------------------------- ------------------------------
    Metric Name                               Metric Description
    dram__bytes_read                          # of bytes read from DRAM
    dram__bytes_write                         # of bytes written to DRAM
    dram__throughput                          DRAM throughput
    gpu__time_duration                        total duration in nanoseconds
    l1tex__t_bytes_pipe_lsu_mem_local_op_ld   # of bytes requested for local loads
    sm__throughput                            SM throughput
    sm__warps_active                          cumulative # of warps in flight
    """
    usable, missing = profile_kernel.usable_metrics(query)
    # the local-store metric's family is listed without it; the launch__ family is not listed at all;
    # theoretical occupancy is not listed either, as on the H200's ncu 2025.3.1, yet collected there
    # the pipe metrics' family (sm__) is listed without them: dropped; smsp__ is not listed at all: kept
    # L1's hit rate: its family (l1tex__) is listed without it; lts__ is not listed at all: kept
    pipes = [m for m in kr.METRICS if m.startswith("sm__") and "pipe" in m]
    assert len(pipes) == 4 and missing == ["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", *pipes,
                                           "l1tex__t_sector_hit_rate.pct"]  # fmt: skip
    assert usable == [m for m in kr.METRICS if m not in missing]
    assert profile_kernel.usable_metrics("") == (list(kr.METRICS), [])  # a failed query: ask for everything


def test_reproducing_command_parses_back_through_the_cli(tmp_path, capsys, monkeypatch, candidate_file):
    from harness import cli

    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(profile_kernel, "NCU_FALLBACKS", ())
    settings = ProfileSettings(task="fuse_norm", candidate=candidate_file, shapes=("T=1", "T=16384"),
                               results_dir=str(tmp_path / "results"))  # fmt: skip
    command = settings.command()
    shapes = """'shapes=["T=1","T=16384"]'"""  # quoted for the shell; Hydra needs the inner quotes (T=1 holds '=')
    assert command == f"python -m harness profile task=fuse_norm candidate={candidate_file} {shapes}"
    assert cli.main(shlex.split(command)[3:] + [f"results_dir={tmp_path / 'results'}"]) == 0
    assert "kernel profile of fuse_norm/stand_in skipped" in capsys.readouterr().out
