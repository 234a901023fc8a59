"""`harness bench model`'s figures and outputs: the decode floor, kernel counts, the record, the table,
the Markdown summary and the waterfall chart. Pure functions of the measurements, except `write`.

Floor of a decode step (BEAM.md §7, batch 1): the bytes one token's step must read at least once:
every attention and dense-MLP weight and norm, the routers, the top_k chosen experts of each MoE
layer (not the other E - top_k), one embedding row, the final norm and the LM head, and the KV
cache (global layers: every cached token's K and V; sliding layers: the window's). Over the copy
bandwidth measured in the same process (read + write counted, as harness/bench.py measures it):
floor_ms = bytes / copy bandwidth. Writes (one token's activations, the new K/V) are negligible.

Shape legend: D hidden, V vocabulary, E experts, k top-k.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.profile_analysis import read_trace, trace_range_launches
from harness.records import RECORDS_FILE, append, now_utc
from reference_model.config import BF16_BYTES, BeamConfig

GOALS = {"decode_floor_ratio_max": 1.25, "decode_speedup_vs_compiled_min": 1.3, "prefill_speedup_vs_compiled_min": 1.2}


# ---- the floor ----------------------------------------------------------------------------------------
def decode_floor_bytes(cfg: BeamConfig, context: int) -> dict[str, int]:
    """Bytes a batch-1 decode step at `context` cached tokens must read, by part."""
    D, B = cfg.hidden, BF16_BYTES
    attention = cfg.n_layers * (
        (cfg.qkv_gate_size * D + D * cfg.q_size) * B + (2 * D + 2 * cfg.head_dim + cfg.n_heads) * B
    )
    dense = cfg.n_dense_layers * (3 * cfg.dense_ff * D * B + 2 * D * B)
    n_moe = cfg.n_layers - cfg.n_dense_layers
    experts = n_moe * (cfg.top_k * 3 * cfg.expert_ff * D * B + 2 * D * B)
    routers = n_moe * (cfg.n_experts * D * 4 + cfg.n_experts * 4)
    kv_row = 2 * cfg.n_kv_heads * cfg.head_dim * B  # K and V of one token in one layer
    kv = len(cfg.global_layers) * context * kv_row + len(cfg.sliding_layers) * min(context, cfg.sliding_window) * kv_row
    head = cfg.vocab_size * D * B + D * B + D * B  # LM head, final norm, one embedding row
    parts = {"attention_weights": attention, "dense_mlp_weights": dense, "chosen_experts": experts,
             "routers": routers, "kv_cache": kv, "lm_head_and_embedding": head}  # fmt: skip
    return parts | {"total": sum(parts.values())}


# ---- kernel counts ------------------------------------------------------------------------------------
def per_layer(counts: dict[str, dict[str, int]], cfg: BeamConfig) -> dict[str, Any]:
    """Kernels per layer (attention sublayer + MLP/MoE sublayer), per layer and averaged by kind.

    A sublayer range the profile lacks leaves its layer out of the means, named under "missing",
    rather than losing the whole benchmark. (prof.events() lost L4.moe on the H200 and on the GPU machine's
    CPU, where its name was demangled to ".moe"; the counts come from the chrome trace, which keeps it: see
    harness/profile_analysis.py.)"""
    layers, missing = [], []
    for layer in range(cfg.n_layers):
        ffn = "moe" if cfg.is_moe(layer) else "mlp"
        names = (f"L{layer}.attention", f"L{layer}.{ffn}")
        absent = [n for n in names if n not in counts]
        if absent:
            missing += absent
            continue
        attn, mlp = (counts[n] for n in names)
        total, copies = attn["kernels"] + mlp["kernels"], attn["copies"] + mlp["copies"]
        layers.append({"layer": layer, "kind": ffn, "attention": attn["kernels"], "ffn": mlp["kernels"],
                       "total": total, "copies": copies})  # fmt: skip

    def mean(kind: str) -> float | None:
        totals = [row["total"] for row in layers if row["kind"] == kind]
        return statistics.mean(totals) if totals else None

    return {"per_moe_layer": mean("moe"), "per_dense_layer": mean("mlp"), "layers": layers, "missing": missing}


def profile_decode_step(step: Callable[[], object], on_cuda: bool) -> dict[str, dict[str, int]]:
    """{"L3.moe": {"kernels": n, "copies": m}, ...} for each sublayer range of one eager decode step (and
    "embedding", "lm_head", which `per_layer` does not read), counted as
    `harness profile` counts them, from the exported chrome trace (harness/profile_analysis.py). On CUDA:
    the device kernels launched inside the range (by the range itself, e.g. a Triton launch, or by any op
    below it), memcpy/memset apart. On the CPU: the leaf ATen calls that compute something (Triton
    kernels run by the interpreter are not ATen calls: they do not show there)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step()
        if on_cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return trace_range_launches(read_trace(path), on_cuda)


# ---- the record ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelBenchRecord:
    """One `harness bench model` run: one line of results/model_bench/records.jsonl."""

    run_id: str
    created_utc: str
    command: str
    preset: str
    device: str
    timings_meaningful: bool
    settings: dict[str, Any]
    environment: dict[str, Any]
    sources: list[dict[str, str]]  # where each op of the optimized model came from
    variants: list[dict[str, Any]]
    copy_gbps: float | None
    floor: dict[str, Any] | None
    kernel_counts: dict[str, Any]
    goals: dict[str, Any]
    failures: list[str]
    wall_s: float

    def __post_init__(self) -> None:
        json.dumps(self.to_dict(), allow_nan=False)  # a NaN would not round-trip: fail here, not in a reader

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def make_record(plan, env: dict, variants, results, optimized, counts: dict, copy_gbps: float | None,
                wall_s: float, failures: Sequence[str] = ()) -> ModelBenchRecord:  # fmt: skip
    from reference_model.config import get_config

    cfg = get_config(plan.preset)
    ref, peer = results["reference"], results.get("reference+compile")
    rows = []
    for v in variants:
        m = results[v.name]
        rows.append({
            "name": v.name, "kind": v.kind, "changes": list(v.changes), "decode_ms": m.decode_ms,
            "prefill_ms": m.prefill_ms, "decode_ms_windows": m.decode_ms_windows,
            "prefill_ms_repeats": m.prefill_ms_repeats, "decode_logits_err": m.decode_logits_err, "errors": m.errors,
            "decode_speedup_vs_reference": _ratio(ref.decode_ms, m.decode_ms),
            "prefill_speedup_vs_reference": _ratio(ref.prefill_ms, m.prefill_ms),
            "decode_speedup_vs_compiled": _ratio(peer.decode_ms, m.decode_ms) if peer else None,
            "prefill_speedup_vs_compiled": _ratio(peer.prefill_ms, m.prefill_ms) if peer else None,
        })  # fmt: skip
    floor = None
    if copy_gbps is not None:
        parts = decode_floor_bytes(cfg, plan.context)
        floor = {"bytes": parts, "copy_gbps": copy_gbps, "ms": parts["total"] / (copy_gbps * 1e6)}
    opt = results["optimized"]
    goals = {
        "decode_floor_ratio": _ratio(opt.decode_ms, floor["ms"]) if floor else None,
        "decode_speedup_vs_compiled": _ratio(peer.decode_ms, opt.decode_ms) if peer else None,
        "prefill_speedup_vs_compiled": _ratio(peer.prefill_ms, opt.prefill_ms) if peer else None,
    }
    goals["met"] = {
        "decode_floor": None if goals["decode_floor_ratio"] is None
        else goals["decode_floor_ratio"] <= GOALS["decode_floor_ratio_max"],
        "decode_vs_compiled": None if goals["decode_speedup_vs_compiled"] is None
        else goals["decode_speedup_vs_compiled"] >= GOALS["decode_speedup_vs_compiled_min"],
        "prefill_vs_compiled": None if goals["prefill_speedup_vs_compiled"] is None
        else goals["prefill_speedup_vs_compiled"] >= GOALS["prefill_speedup_vs_compiled_min"],
    }  # fmt: skip
    goals["targets"] = dict(GOALS)
    failures = list(failures) + [f"{r['name']}: {e}" for r in rows for e in r["errors"]]
    kernel_counts = {name: (per_layer(c, cfg) if c is not None else None) for name, c in counts.items()}
    return ModelBenchRecord(
        run_id=f"{now_utc().replace(':', '').replace('+0000', 'Z')}-{uuid.uuid4().hex[:6]}",
        created_utc=now_utc(), command=plan.settings.command(), preset=cfg.name, device=env["device"],
        timings_meaningful=plan.on_gpu, settings=dataclasses.asdict(plan.settings) | {
            "resolved": {"context": plan.context, "decode_steps": plan.decode_steps,
                         "decode_windows": plan.decode_windows, "prefill_seqs": plan.prefill_seqs,
                         "prefill_len": plan.prefill_len}},
        environment=env, sources=[dataclasses.asdict(s) for s in optimized.sources], variants=rows,
        copy_gbps=copy_gbps, floor=floor, kernel_counts=kernel_counts, goals=goals, failures=failures,
        wall_s=wall_s,
    )  # fmt: skip


# ---- outputs ------------------------------------------------------------------------------------------
def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def console_table(record: dict[str, Any]) -> str:
    note = "" if record["timings_meaningful"] else "   (CPU interpreter: timings NOT meaningful)"
    lines = [f"{record['preset']} on {record['device']}{note}",
             f"{'variant':<24} {'decode ms':>10} {'x ref':>6} {'x comp':>7} {'prefill ms':>11} {'x ref':>6} "
             f"{'x comp':>7} {'logit err':>9}"]  # fmt: skip
    for r in record["variants"]:
        lines.append(
            f"{r['name']:<24} {_cell(r['decode_ms'], '10.3f')} {_cell(r['decode_speedup_vs_reference'], '6.2f')} "
            f"{_cell(r['decode_speedup_vs_compiled'], '7.2f')} {_cell(r['prefill_ms'], '11.2f')} "
            f"{_cell(r['prefill_speedup_vs_reference'], '6.2f')} {_cell(r['prefill_speedup_vs_compiled'], '7.2f')} "
            f"{_cell(r['decode_logits_err'], '9.2g')}"
            + ("  FAILED: " + ", ".join(e.split(":", 1)[0] for e in r["errors"]) if r["errors"] else "")
        )  # the phases only: the errors follow the table (Failures)
    if record["floor"]:
        f = record["floor"]
        lines.append(
            f"decode floor: {f['bytes']['total'] / 1e9:.2f} GB at {f['copy_gbps']:.0f} GB/s = {f['ms']:.3f} ms"
        )
    g, t = record["goals"], record["goals"]["targets"]
    lines.append(
        f"goals: decode/floor {_cell(g['decode_floor_ratio'], '.2f')} (<= {t['decode_floor_ratio_max']}), decode vs "
        f"compiled {_cell(g['decode_speedup_vs_compiled'], '.2f')}x (>= {t['decode_speedup_vs_compiled_min']}), "
        f"prefill vs compiled {_cell(g['prefill_speedup_vs_compiled'], '.2f')}x "
        f"(>= {t['prefill_speedup_vs_compiled_min']})"
    )
    what = "kernels" if record["timings_meaningful"] else "leaf ATen ops (CPU: interpreted Triton kernels not seen)"
    for name, counts in record["kernel_counts"].items():
        if counts is None:
            lines.append(f"{what} per layer ({name}): not counted (the profiled step failed)")
        else:
            gaps = counts.get("missing")
            lines.append(f"{what} per layer ({name}): MoE layer {_cell(counts['per_moe_layer'], '.1f')}, "
                         f"dense layer {_cell(counts['per_dense_layer'], '.1f')}"
                         + (f" (ranges not in the profile, left out: {', '.join(gaps)})" if gaps else ""))  # fmt: skip
    return "\n".join(lines)


def chart_rows(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The chart's bars, labelled: the peers, the changes added in order, then the optimized model,
    which is the last addition (the waterfall stops one change short of it) and is labelled with it."""
    rows = record["variants"]
    added = [r for r in rows if r["kind"] == "added"]
    order = [(r["name"], r) for r in rows if r["kind"] == "peer"] + [(r["name"], r) for r in added]
    for r in rows:
        if r["kind"] == "optimized":
            last = [c for c in r["changes"] if added and c not in added[-1]["changes"]]
            order.append((f"optimized (+{', '.join(last)})" if last else r["name"], r))
    return order


def chart_kind(record: dict[str, Any]) -> str:
    """What the chart shows: "waterfall" when the run added changes one at a time, else "variants" (the
    peers and the optimized model only, `waterfall=false`)."""
    return "waterfall" if any(r["kind"] == "added" for r in record["variants"]) else "variants"


def write_chart(record: dict[str, Any], path: Path) -> None:
    """Two panels (decode, prefill): the peers, the waterfall of added changes (if timed), the optimized
    model, and on decode the floor as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = chart_rows(record)
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(order) + 1.8))
    colors = {"peer": "#888888", "added": "#4c72b0", "optimized": "#2ca02c"}
    for ax, key, title in zip(axes, ("decode_ms", "prefill_ms"), ("decode step", "prefill"), strict=True):
        values = [r[key] or 0.0 for _, r in order]
        ax.barh(range(len(order)), values, color=[colors[r["kind"]] for _, r in order])
        ax.set_yticks(range(len(order)), [label for label, _ in order])
        ax.invert_yaxis()
        ax.set_xlabel("ms" + ("" if record["timings_meaningful"] else " (CPU interpreter: not meaningful)"))
        ax.set_title(f"{record['preset']}: {title}")
        if key == "decode_ms" and record["floor"]:
            ax.axvline(record["floor"]["ms"], color="#d62728", linestyle="--", label="floor")
            ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_markdown(record: dict[str, Any], chart_name: str) -> str:
    lines = [f"# Whole-model benchmark {record['run_id']}", "",
             f"`{record['command']}` on {record['device']} ({record['environment'].get('git_commit') or 'no git'}), "
             f"{record['created_utc']}.", ""]  # fmt: skip
    if not record["timings_meaningful"]:
        lines += ["**CPU run through the Triton interpreter: the timings are not meaningful.**", ""]
    lines += [f"![{chart_kind(record)}]({chart_name})", "", "```", console_table(record), "```", "",
              "## Optimized model", "", "| op | kind | implementation | detail |",
              "| --- | --- | --- | --- |"]  # fmt: skip
    lines += [f"| {s['field']} | {s['kind']} | {s['name']} | {s['detail']} |" for s in record["sources"]]
    if record["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in record["failures"]]
    return "\n".join(lines) + "\n"


def write(record: ModelBenchRecord, out: Path) -> dict[str, Path]:
    """Append the record to out/records.jsonl; write the chart and the Markdown summary beside it."""
    out.mkdir(parents=True, exist_ok=True)
    data = record.to_dict()
    chart = out / f"{record.run_id}_{chart_kind(data)}.png"
    summary = out / f"{record.run_id}.md"
    write_chart(data, chart)
    summary.write_text(summary_markdown(data, chart.name))
    records = out / RECORDS_FILE
    append(records, record)
    return {"records": records, "summary": summary, "chart": chart}
