"""`harness bench model`: settings, the waterfall's variants, the decode floor, kernel counting, and a
whole run on the CPU (beam-tiny, interpreter) that writes its record, chart and summary."""

from __future__ import annotations

import json
import re

import pytest
import torch

from harness import bench_model, bench_model_report
from harness.bench_model import BenchModelSettings
from harness.optimized_model import LibraryOp
from reference_model.cache import KVCache
from reference_model.config import get_config
from reference_model.model import Beam, parameter_counts
from reference_model.weights import random_model


# ---- settings and variants -----------------------------------------------------------------------------
def test_settings_refuse_bad_values_naming_them():
    with pytest.raises(ValueError, match=r"candidates must be one of \['promoted', 'present'\]; got 'all'"):
        BenchModelSettings(candidates="all")
    with pytest.raises(ValueError, match=r"ops entries must read task:choice .* got \['fuse_norm'\]"):
        BenchModelSettings(ops=("fuse_norm",))
    with pytest.raises(ValueError, match=r"preset 'beam-huge' unknown; known: \["):
        BenchModelSettings(preset="beam-huge")


def test_command_reproduces_the_non_default_settings():
    assert BenchModelSettings().command() == "python -m harness bench model"
    s = BenchModelSettings(compile_peer=False, ops=("fuse_norm:reference", "moe_experts:routed_slots"), seed=3)
    assert s.command() == (
        "python -m harness bench model ops=[fuse_norm:reference,moe_experts:routed_slots] compile_peer=False seed=3"
    )


def test_waterfall_adds_changes_in_order_and_removes_each_in_turn():
    changes = ["cuda_graph", "pack_qkv_gate", "library:attention", "fuse_norm"]
    got = bench_model.variants(changes, waterfall=True, compile_peer=True)
    names = [v.name for v in got]
    added, removed = ["+cuda_graph", "+pack_qkv_gate", "+library:attention"], [f"-{c}" for c in changes]
    assert names == ["reference", "reference+compile", "optimized", *added, *removed]
    by_name = {v.name: v for v in got}
    assert by_name["+pack_qkv_gate"].changes == ("cuda_graph", "pack_qkv_gate")
    assert by_name["-library:attention"].changes == ("cuda_graph", "pack_qkv_gate", "fuse_norm")
    assert by_name["optimized"].changes == tuple(changes) and by_name["reference+compile"].compiled
    assert [v.name for v in bench_model.variants(changes, waterfall=False, compile_peer=False)] == [
        "reference", "optimized"]  # fmt: skip


def test_the_chart_is_named_a_waterfall_only_when_changes_were_added_one_at_a_time():
    rows = [{"kind": "peer"}, {"kind": "optimized"}]
    assert bench_model_report.chart_kind({"variants": rows}) == "variants"  # waterfall=false
    assert bench_model_report.chart_kind({"variants": [*rows, {"kind": "added"}, {"kind": "removed"}]}) == "waterfall"


def test_available_changes_follow_the_change_order():
    def path(field, kind="library"):
        return LibraryOp(field, lambda _ops: None, "lib", "test", kind)

    choices = {"moe_experts": None, "fuse_norm": None}
    library = {"attention": path("attention"), "moe_experts": path("moe_experts")}
    got = bench_model.available_changes(choices, library, on_gpu=True)
    want = ["cuda_graph", "pack_qkv_gate", "library:attention", "library:moe_experts", "fuse_norm", "moe_experts"]
    assert got == want
    assert "cuda_graph" not in bench_model.available_changes(choices, {}, on_gpu=False)
    # A compiled path stands in for a missing candidate: with output_gate's candidate chosen it is no change.
    library |= {"swiglu": path("swiglu", "compiled"), "output_gate": path("output_gate", "compiled")}
    got = bench_model.available_changes({**choices, "output_gate": None}, library, on_gpu=True)
    assert got == [*want[:4], "compiled:swiglu", "fuse_norm", "output_gate", "moe_experts"]


# ---- the floor ------------------------------------------------------------------------------------------
def test_decode_floor_bytes_agree_with_the_parameter_count_of_beam_slice():
    """Counted two ways: part by part from the config, and from a meta-device model's active
    parameters (BF16 except the FP32 routers) plus one embedding row and the KV cache."""
    cfg, context = get_config("beam-slice"), 100_352
    floor = bench_model_report.decode_floor_bytes(cfg, context)
    counts = parameter_counts(Beam(cfg, device="meta"))
    router = counts.by_part["router"]
    weights = (counts.active - router) * 2 + router * 4 + cfg.hidden * 2
    kv = (
        context * 2 * cfg.n_kv_heads * cfg.head_dim * 2 + 5 * cfg.sliding_window * 2 * cfg.n_kv_heads * cfg.head_dim * 2
    )
    assert floor["total"] == weights + kv
    assert floor["chosen_experts"] == 3 * (8 * 3 * 2560 * 5120 * 2 + 2 * 5120 * 2)  # 3 MoE layers, 8 of 256 experts
    assert 6.5e9 < floor["total"] < 7.0e9  # ~1.6 ms at the 4275 GB/s copy ceiling of TOOLCHAIN.md


# ---- kernel counts --------------------------------------------------------------------------------------
def test_kernels_are_summed_per_layer_and_a_missing_range_leaves_its_layer_out():
    cfg = get_config("beam-tiny")
    counts = {}
    for layer in range(cfg.n_layers):
        ffn = "moe" if cfg.is_moe(layer) else "mlp"
        counts[f"L{layer}.attention"] = {"kernels": 2, "copies": 1}
        counts[f"L{layer}.{ffn}"] = {"kernels": 3 if ffn == "moe" else 2, "copies": 0}
    summary = bench_model_report.per_layer(counts, cfg)
    assert summary["per_moe_layer"] == 5 and summary["per_dense_layer"] == 4
    assert [row["total"] for row in summary["layers"]] == [4, 4, 4, 5, 5, 5]
    assert summary["missing"] == [] and summary["layers"][0]["copies"] == 1
    del counts["L4.moe"]
    partial = bench_model_report.per_layer(counts, cfg)
    assert partial["missing"] == ["L4.moe"] and [row["layer"] for row in partial["layers"]] == [0, 1, 2, 3, 5]
    assert partial["per_moe_layer"] == 5 and partial["per_dense_layer"] == 4


# ---- a whole run on the CPU -------------------------------------------------------------------------------
def test_cpu_kernel_counts_keep_l4_moe_where_the_profilers_events_lose_its_name(demangled_as_on_the_gpu_machine):
    cfg = get_config("beam-tiny")
    model = random_model(cfg, 0)
    counts = bench_model_report.profile_decode_step(
        lambda: model.decode(KVCache(cfg, 1, 40, "cpu"), torch.tensor([5])), on_cuda=False)  # fmt: skip
    layers = bench_model_report.per_layer(counts, cfg)
    assert layers["missing"] == [] and len(layers["layers"]) == cfg.n_layers
    assert counts["L4.moe"] == counts["L3.moe"] and counts["L4.moe"]["kernels"] > 0


def test_bench_model_runs_on_cpu_and_writes_record_chart_and_summary(tmp_path, capsys):
    settings = BenchModelSettings(ops=("output_gate:head_rows",), results_dir=str(tmp_path / "no-promotions"),
                                  out=str(tmp_path / "out"))  # fmt: skip
    assert bench_model.bench(settings) == 0
    lines = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["preset"] == "beam-tiny" and record["timings_meaningful"] is False and record["floor"] is None
    assert record["command"] == settings.command() and record["environment"]["torch"] == torch.__version__
    names = [v["name"] for v in record["variants"]]
    assert names == ["reference", "optimized", "+pack_qkv_gate", "-pack_qkv_gate", "-output_gate"]
    for v in record["variants"]:
        assert v["errors"] == [] and v["decode_ms"] > 0 and v["prefill_ms"] > 0, v
        assert v["decode_logits_err"] < 2**-4, v  # the same function: only reduction orders may differ
    sources = {s["field"]: s for s in record["sources"]}
    assert sources["output_gate"]["kind"] == "candidate" and sources["output_gate"]["name"] == "output_gate/head_rows"
    assert sources["attention"]["kind"] == "reference"  # no library paths on the CPU
    counts = record["kernel_counts"]["reference"]
    assert len(counts["layers"]) == 6 and counts["per_moe_layer"] > counts["per_dense_layer"] > 0
    labels = [label for label, _ in bench_model_report.chart_rows(record)]
    assert labels == ["reference", "+pack_qkv_gate", "optimized (+output_gate)"]  # the last addition is the optimized
    chart = tmp_path / "out" / f"{record['run_id']}_waterfall.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "out" / f"{record['run_id']}.md").read_text()
    assert f"]({chart.name})" in summary and "not meaningful" in summary
    out = capsys.readouterr().out
    assert "timings NOT meaningful" in out and "-output_gate" in out
    # every phase is stamped with the seconds since the start, so a run cut short shows where its time went
    stamped = re.findall(r"^  \[ *([\d.]+) s\] (.+)$", out, re.MULTILINE)
    phases = [text for _, text in stamped]
    loaded = {"reference": 0, "optimized": 1, "+pack_qkv_gate": 0, "-pack_qkv_gate": 1, "-output_gate": 0}
    built = [f"variant {n}: ops built ({loaded[n]} candidate{'' if loaded[n] == 1 else 's'} loaded and probed)"
             for n in names]  # fmt: skip
    assert phases[: 2 + len(names)] == ["model built", *built, "5 variants built"]
    assert phases[2 + len(names)] == "kernels counted: reference, optimized"
    assert phases[-1] == "record, summary and chart written"
    assert len(phases) == 4 + 3 * len(names)  # and a decode and a prefill line per variant
    assert [float(s) for s, _ in stamped] == sorted(float(s) for s, _ in stamped)


@pytest.mark.parametrize(("phase", "where"), [("decode", "__init__"), ("prefill", "__init__"), ("prefill", "run")])
def test_a_phase_that_runs_out_of_memory_is_every_variants_recorded_failure_and_the_other_phase_runs(
    phase, where, tmp_path, monkeypatch, capsys
):
    """As beam-slice's prefill on an 80 GB GPU: the phase's cache and inputs cannot be made (__init__),
    or each variant's prefill fails (run). The run still times the other phase, writes its record, and
    says which sizes to make smaller."""

    def out_of_memory(self, *args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.34 GiB. GPU 0 has a total capacity")

    bench = {"decode": bench_model.DecodeBench, "prefill": bench_model.PrefillBench}[phase]
    monkeypatch.setattr(bench, where, out_of_memory)
    settings = BenchModelSettings(waterfall=False, out=str(tmp_path / "out"), results_dir=str(tmp_path / "none"))
    assert bench_model.bench(settings) == 1  # a failure is the exit status, not a crash
    record = json.loads((tmp_path / "out" / "records.jsonl").read_text())
    sizes = {"decode": "one sequence at a 24-token context (beam-tiny; smaller context may fit)",
             "prefill": "2 x 6 new tokens at a 24-token context (beam-tiny; smaller prefill_seqs, prefill_len or "
                        "context may fit)"}[phase]  # fmt: skip
    want = f"{phase}: out of GPU memory for {sizes}: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.34 GiB."
    other = "prefill" if phase == "decode" else "decode"
    assert [v["name"] for v in record["variants"]] == ["reference", "optimized"]
    for v in record["variants"]:
        assert v[f"{phase}_ms"] is None and v[f"{other}_ms"] > 0, v
        assert [e[: len(want)] for e in v["errors"]] == [want], v["errors"]
    assert record["failures"] == [f"{v['name']}: {v['errors'][0]}" for v in record["variants"]]
    assert (record["kernel_counts"]["optimized"] is None) == (phase == "decode")  # counting needs the decode cache
    out = capsys.readouterr().out
    assert (f"{phase} not timed: {want}" in out) == (where == "__init__")
    table = bench_model_report.console_table(record)
    assert re.search(rf"^optimized .*  FAILED: {phase}$", table, re.MULTILINE), table  # the errors follow the table
    assert f"failed: optimized: {want}" in out
    summary = (tmp_path / "out" / f"{record['run_id']}.md").read_text()
    assert f"## Failures\n\n- reference: {want}" in summary


def test_an_unknown_task_in_ops_names_the_known_ones(tmp_path):
    settings = BenchModelSettings(ops=("output_gates:reference",), out=str(tmp_path))
    with pytest.raises(ValueError, match=r"task 'output_gates' unknown; known: \["):
        bench_model.choose_candidates(settings)


# ---- on the GPU machine ------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_bench_model_gpu_path_on_a_small_preset(tmp_path):
    """The GPU-only parts on beam-tiny (fast): decode graphs, kernel events per range, the floor from
    a measured bandwidth. The full beam-slice run (library paths, compiled peer) is `harness bench model`."""
    settings = BenchModelSettings(preset="beam-tiny", context=256, decode_steps=4, prefill_seqs=2, prefill_len=32,
                                  ops=("output_gate:head_rows",), results_dir=str(tmp_path / "none"),
                                  compile_peer=False, libraries=False, out=str(tmp_path))  # fmt: skip
    assert bench_model.bench(settings) == 0
    record = json.loads((tmp_path / "records.jsonl").read_text())
    assert record["timings_meaningful"] and record["floor"]["ms"] > 0
    assert record["kernel_counts"]["optimized"]["per_moe_layer"] > 0
    assert {v["name"] for v in record["variants"]} >= {"reference", "optimized", "-cuda_graph", "+cuda_graph"}
    assert all(v["decode_logits_err"] < 2**-4 for v in record["variants"])
