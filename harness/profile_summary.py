"""The model profile's files: CSV + Markdown tables, a PNG chart of the top ops, a Markdown summary.

    <out>/<name>/summary.md      what dominates and which task addresses it, generated from the tables
                 ops.csv|md      one row per ModelOps op that ran (harness/profile_analysis.py)
                 sites.csv|md    one row per (op, call site): which weight or sublayer
                 layers.csv|md   kernels and time per layer (plus the embedding and the LM head)
                 top_ops.png     share of the op time, top ops, coloured by whether a task addresses them
                 trace.json.gz   the Chrome trace (chrome://tracing, ui.perfetto.dev)
                 profile.json    settings, sizes, step figures, ceilings, environment, the command
Everything here is a function of the tables and the plan: nothing is measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.profile_analysis import ProfileTables

if TYPE_CHECKING:
    from harness.profile_model import Plan

TRACE_FILE = "trace.json.gz"
CHART_FILE = "top_ops.png"
# Why an op (or part of one) has no task; the ranking itself comes from the measured tables.
NO_TASK = {
    "attention": "attention is a library kernel's job (torch's FlashAttention-2 in decode, flashinfer FA3 in prefill)",
    "linear": "o_proj and the dense-MLP projections are plain cuBLAS GEMMs",
    "lm_head_logits": "one GEMM with an FP32 output",
    "rms_norm": "the first sublayer's pre-norm, once per step (every later norm is inside fuse_norm)",
}


NO_TASK_DEFAULT = "nothing addresses it yet"


def no_task_reason(op: str) -> str:
    return NO_TASK.get(op, NO_TASK_DEFAULT)


# ---- Markdown tables ---------------------------------------------------------------------------------
def _human(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def format_cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value.replace("|", "\\|") or "-"
    if column.startswith("bytes"):
        return _human(value, "B")
    if column.startswith("flops"):
        return _human(value, "FLOP")
    if column == "floor_fraction":
        return f"{value:.1%}"
    if column.endswith("_pct"):
        return f"{value:.1f}"
    if column.endswith("_us"):
        return f"{value:,.1f}"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.2f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of `frame` (no index), numbers formatted by column name."""
    if frame.empty:
        return "(no rows)"
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join(" --- " for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(format_cell(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
        for row in frame.astype(object).itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])


# ---- the summary -------------------------------------------------------------------------------------
def _task_sentence(op_row: pd.Series, sites: pd.DataFrame) -> str:
    op = op_row["op"]
    reason = no_task_reason(op)
    if not op_row["task"]:
        return f"no task: {reason}"
    text = "task " + ", ".join(f"`{t}`" for t in op_row["task"].split(", "))
    if op_row["task_time_pct"] < 99.5:
        untasked = sites[(sites["op"] == op) & (sites["task"] == "")]["site"].tolist()
        text += (f" ({op_row['task_time_pct']:.0f}% of its time); the rest ({', '.join(untasked)}) has no task: "
                 f"{reason}")  # fmt: skip
    if op_row["floor_fraction"] is not None and not pd.isna(op_row["floor_fraction"]):
        text += f"; at {op_row['floor_fraction']:.0%} of the roofline floor"
    return text


def _count(n: float, noun: str) -> str:
    return f"{n:g} {noun}" + ("" if n == 1 else "s")


def _dominant_ops(tables: ProfileTables, top: int, implementations: Mapping[str, str]) -> list[str]:
    ops, sites = tables.ops, tables.sites
    head = ops.head(top)
    covered = head["share_pct"].sum()
    lines = [f"The top {len(head)} of {len(ops)} ops take {covered:.1f}% of the op time:", ""]
    for _, r in head.iterrows():
        by_site = sites[sites["op"] == r["op"]].head(4)
        where = ", ".join(f"{s['site']} {s['share_pct']:.1f}%" for _, s in by_site.iterrows())
        lines.append(
            f"- `{r['op']}`: {r['share_pct']:.1f}% ({r['time_per_step_us'] / 1e3:.3f} ms per step, "
            f"{_count(r['calls_per_step'], 'call')}, {_count(r['kernels_per_step'], 'kernel')}); "
            f"{_task_sentence(r, sites)}"
            + (f"; ran {implementations[r['op']]}" if r["op"] in implementations else "")
            + f". By site: {where}."
        )
    return lines


def summary_markdown(plan: Plan, tables: ProfileTables, copy_gbps: float | None, gemm_tflops: float | None,
                     env: dict[str, Any]) -> str:  # fmt: skip
    s, size, st = plan.settings, plan.size, tables.step
    basis = ("device time = the summed durations of the GPU kernels and copies launched inside each range"
             if st.time_basis == "gpu kernels" else
             "CPU time of each range (no GPU: the CPU profiler; shares show where the work is on this CPU, "
             "not what a GPU would spend)")  # fmt: skip
    ceilings = (f"copy {copy_gbps:,.0f} GB/s, BF16 GEMM {gemm_tflops:,.0f} TFLOP/s (floors use both)"
                if copy_gbps else "none on CPU: no roofline floors")  # fmt: skip
    busy = f" (GPU busy {st.gpu_busy:.0%} of the wall time)" if st.gpu_busy is not None else ""
    facts = [("driver", "driver"), ("CUDA", "cuda"), ("torch", "torch"), ("triton", "triton"), ("Python", "python"),
             ("host", "host"), ("git", "git_commit")]  # fmt: skip
    where = ", ".join([env["device"], *(f"{label} {env[key]}" for label, key in facts if env.get(key))])
    where += " (uncommitted changes)" if env.get("git_dirty") else ""
    lines = [
        f"# Profile: {plan.cfg.name}, {s.scenario}, {s.ops} ops",
        "",
        f"- Reproduce: `{s.command()}`",
        f"- Where: {where}",
        f"- Step: {size.seqs} sequence(s) x {size.new_tokens} new token(s) at {size.context:,} cached tokens "
        f"each; {plan.warmup} warm-up step(s), {st.steps} profiled (figures are per step: their mean)",
        f"- Time: {basis}",
        f"- Ceilings measured in this run: {ceilings}",
        "",
        "## The step",
        "",
        "| figure | per step |",
        "| --- | --- |",
        f"| wall time on the host | {st.host_ms:.3f} ms |",
        f"| time ({st.time_basis}) | {st.device_ms:.3f} ms{busy} |",
        f"| inside ModelOps ops | {st.ops_ms:.3f} ms ({st.ops_coverage:.0%}; the rest is glue between ops) |",
        f"| kernels | {st.kernels:g}" + (f" (+ {st.copies:g} copies/memsets)" if st.copies else "") + " |",
        f"| op calls | {st.op_calls:g} |",
        "",
        "## Which ops dominate",
        "",
        *_dominant_ops(tables, s.top, plan.implementations),
    ]
    if tables.not_called:
        lines += ["", "Not called in these steps: " + ", ".join(f"`{op}`" for op in tables.not_called)
                  + (" (the model runs the four projections unpacked: `linear` at attention.wq|wk|wv|wg)"
                     if "qkv_gate_proj" in tables.not_called else "") + "."]  # fmt: skip
    kernels_note = ("GPU kernels launched inside each range (copies apart)" if st.time_basis == "gpu kernels"
                    else "on CPU: leaf ATen calls that compute (views and allocations apart), each at least one "
                    "kernel on a GPU")  # fmt: skip
    lines += [
        "",
        "## Ops",
        "",
        "Shares are of the summed op time (they add up to 100%). Bytes, FLOPs and floors count the calls a "
        "task addresses, by that task's Cost formula at the call's shape.",
        "",
        markdown_table(tables.ops),
        "",
        f"## Top call sites (of {len(tables.sites)})",
        "",
        markdown_table(tables.sites.head(max(s.top, 10))),
        "",
        "## Kernels per layer",
        "",
        f"Kernels: {kernels_note}. A sublayer's figures include the norm boundary after it.",
        "",
        markdown_table(tables.layers),
        "",
        "## Files",
        "",
        "ops.csv, sites.csv, layers.csv (the tables), top_ops.png, "
        f"{TRACE_FILE} (open in ui.perfetto.dev or chrome://tracing), profile.json.",
        "",
    ]
    return "\n".join(lines)


# ---- the chart ----------------------------------------------------------------------------------------
def write_chart(tables: ProfileTables, path: Path, title: str, top: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    head = tables.ops.head(top).iloc[::-1]
    labels = [f"{r['op']}  [{r['task'] or 'no task'}]" for _, r in head.iterrows()]
    colors = ["tab:blue" if r["task"] else "tab:gray" for _, r in head.iterrows()]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(head) + 1.5))
    bars = ax.barh(labels, head["share_pct"], color=colors)
    for bar, (_, r) in zip(bars, head.iterrows(), strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['share_pct']:.1f}%  "
                f"({r['time_per_step_us'] / 1e3:.2f} ms)", va="center", fontsize=8)  # fmt: skip
    ax.set_xlabel(f"share of the op time per step (%), {tables.step.time_basis}")
    ax.set_xlim(0, max(head["share_pct"].max() * 1.35, 1.0))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- writing ---------------------------------------------------------------------------------------
def write(plan: Plan, tables: ProfileTables, copy_gbps: float | None, gemm_tflops: float | None,
          env: dict[str, Any]) -> list[Path]:  # fmt: skip
    d, s = plan.run_dir, plan.settings
    written = []
    for stem, frame in (("ops", tables.ops), ("sites", tables.sites), ("layers", tables.layers)):
        frame.to_csv(d / f"{stem}.csv", index=False)
        (d / f"{stem}.md").write_text(markdown_table(frame) + "\n")
        written += [d / f"{stem}.csv", d / f"{stem}.md"]
    title = f"{plan.cfg.name} {s.scenario}, {s.ops} ops, {env['device']}"
    write_chart(tables, d / CHART_FILE, title, s.top)
    (d / "summary.md").write_text(summary_markdown(plan, tables, copy_gbps, gemm_tflops, env))
    meta = {
        "settings": dataclasses.asdict(s), "command": s.command(), "preset": plan.cfg.name,
        "size": dataclasses.asdict(plan.size), "warmup": plan.warmup, "steps": plan.steps,
        "device": str(plan.device), "pack_qkv_gate": plan.pack_qkv_gate,
        "implementations": dict(plan.implementations),
        "step": {**dataclasses.asdict(tables.step), "ops_coverage": tables.step.ops_coverage,
                 "gpu_busy": tables.step.gpu_busy},
        "copy_gbps": copy_gbps, "gemm_tflops": gemm_tflops, "not_called": list(tables.not_called),
        "environment": env,
    }  # fmt: skip
    (d / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")
    return [*written, d / CHART_FILE, d / "summary.md", d / "profile.json"]


def console_summary(tables: ProfileTables, top: int) -> str:
    st = tables.step
    cols = ["op", "task", "share_pct", "time_per_step_us", "calls_per_step", "kernels_per_step", "floor_fraction"]
    view = tables.ops.head(top)[cols]
    return (f"step: {st.host_ms:.3f} ms wall, {st.device_ms:.3f} ms {st.time_basis}, {st.kernels:g} kernels, "
            f"ops cover {st.ops_coverage:.0%}\n" + view.to_string(index=False, na_rep="-"))  # fmt: skip
