"""Profiler output -> the model profile's tables (pandas): per op, per call site, per layer, per step.

Input: the profiled steps' ranges ("profile.step"), the op ranges inside them (record_function ranges
named after ModelOps fields) with the scope around each ("embedding", "lm_head", a sublayer "L3.moe";
"step" where none), the scope ranges, and the traced ops' call log (harness/profile_model.py), one
OpCall per op range in the same order.

Where they come from: every figure of every table comes from the profile's exported chrome trace
(`trace_ranges`), on both devices, not from prof.events(). torch builds the events in Python and passes
each name through the C++ runtime's demangler (torch._C._demangle, profiler_util.StringTable), and
libstdc++ 6.0.33 (Ubuntu 24.04, the GPU machine's) reads "L4.moe", "L4.mlp" and "L10.attention" as
mangled internal-linkage names (L, a length, the name) and gives ".moe", ".mlp" and ".attention";
libstdc++ 6.0.30 leaves them be (sixty-fourth session, results/gpu_logs/2026-12-07-session64/). So the
events lost L4.moe on that machine's CPU, its ops reattached to the step, as they did on the H200 in
every CUDA profile; the trace, written by the C++ profiler, keeps every name. (On CUDA the events also
attached more kernels to the ranges of the prefill profile than the trace holds in all: 24822 per step
against 22600 kernel events, "GPU busy 121%".) In the trace a range is a "user_annotation" event on a
host thread. On CUDA, device work (a kernel, a memcpy or memset) belongs to it when the host call that
launched it ("cuda_runtime" or "cuda_driver", linked by the "correlation" arg) started inside the range
on the range's thread, whenever the GPU ran it. On CPU, an ATen call ("cpu_op") belongs to it when it
started inside the range on that thread.

Time: on CUDA, a range's time is its device time, the summed duration of the device work (kernels and
copies) launched inside it (what the GPU spent on it, not the host's launch time, which is `host_*`,
the range's own duration); on CPU it is the range's CPU time. `time_basis` says which. Kernels: on
CUDA, the kernels launched inside the range, memcpys and memsets counted apart as copies; on CPU, the
leaf ATen calls that compute something (views, reshapes and allocations excluded): each would be at
least one kernel launch on a GPU.

Every figure is per profiled step (the mean over steps) unless its name says otherwise. Shares are
of the summed time of all ModelOps ops (they add up to 100%); the step's own total, which also
holds the work between ops (the embedding lookup, cache bookkeeping, concatenations), is in
StepFigures. A sublayer range ("L3.moe") covers the sublayer and the norm boundary after it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import bench
from reference_model.config import BeamConfig
from reference_model.ops import ModelOps

OP_NAMES = frozenset(ModelOps.__dataclass_fields__)
SUBLAYER = re.compile(r"^L(\d+)\.(attention|mlp|moe)$")
OUTER_SCOPES = ("embedding", "lm_head")
# Chrome-trace categories: the host calls that launch device work (cudaLaunchKernel, cudaLaunchKernelExC,
# cudaMemcpyAsync, ...; Triton launches through the driver: cuLaunchKernelEx), and the device work itself.
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
DEVICE_WORK = {"kernel": "kernels", "gpu_memcpy": "copies", "gpu_memset": "copies"}
# ATen calls that only make views, reshape metadata or allocate: no kernel on a GPU.
NO_KERNEL_OPS = frozenset(
    f"aten::{name}" for name in (
        "empty", "empty_strided", "empty_like", "view", "_unsafe_view", "as_strided", "reshape", "_reshape_alias",
        "slice", "select", "expand", "expand_as", "permute", "transpose", "t", "unsqueeze", "squeeze", "split",
        "split_with_sizes", "unbind", "chunk", "narrow", "alias", "detach", "lift_fresh", "view_as", "unfold",
        "diagonal", "contiguous", "resize_", "set_", "scalar_tensor", "result_type", "is_nonzero",
    )
)  # fmt: skip


class ProfileMismatch(RuntimeError):
    """The call log and the profiler's op ranges disagree: a harness bug, never data."""


@dataclass(frozen=True)
class StepFigures:
    steps: int
    time_basis: str  # "gpu kernels" or "cpu"
    host_ms: float  # wall time of a step on the host (synchronized with the GPU at its end)
    device_ms: float  # summed device time (kernels and copies) of a step (CUDA); the CPU time on CPU
    ops_ms: float  # of which inside ModelOps ops
    kernels: float
    copies: float
    op_calls: float

    @property
    def ops_coverage(self) -> float:
        return self.ops_ms / self.device_ms if self.device_ms else 0.0

    @property
    def gpu_busy(self) -> float | None:
        """Fraction of the step's wall time the GPU spent in kernels (CUDA only): low means launch-bound."""
        return self.device_ms / self.host_ms if self.time_basis == "gpu kernels" and self.host_ms else None


@dataclass(frozen=True)
class ProfileTables:
    ops: pd.DataFrame  # one row per ModelOps op that ran
    sites: pd.DataFrame  # one row per (op, call site): which weight or sublayer
    layers: pd.DataFrame  # embedding, one row per layer, lm_head
    step: StepFigures
    not_called: tuple[str, ...]  # ModelOps ops that never ran in these steps
    has_floor: bool  # floors and floor fractions were computed (measured GPU ceilings)


# ---- the ranges ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """One profiler range's figures: an op call, a scope ("L3.moe") or a step."""

    name: str
    time_us: float  # device time on CUDA (kernels and copies), CPU time on CPU
    host_us: float  # the range's own duration on the host
    kernels: int
    copies: int


@dataclass(frozen=True)
class Ranges:
    """The profiled steps' ranges, read from the chrome trace."""

    time_basis: str  # "gpu kernels" or "cpu"
    steps: list[Span]
    ops: list[tuple[Span, str]]  # each op range with its innermost scope ("step" where none), in call order
    scopes: list[Span]


def _is_scope(name: str) -> bool:
    """A range the layer table reads: "embedding", "lm_head" or a sublayer ("L3.moe")."""
    return name in OUTER_SCOPES or SUBLAYER.match(name) is not None


def scope_counts(spans: Iterable[Span]) -> dict[str, dict[str, int]]:
    """{"L3.moe": {"kernels": n, "copies": m}, ...}: each scope's kernels and copies, summed over its
    occurrences (one per profiled step)."""
    counts: dict[str, dict[str, int]] = {}
    for span in spans:
        acc = counts.setdefault(span.name, {"kernels": 0, "copies": 0})
        acc["kernels"] += span.kernels
        acc["copies"] += span.copies
    return counts


# ---- the chrome trace ------------------------------------------------------------------------------
def read_trace(path: Path) -> dict[str, Any]:
    """A chrome trace as prof.export_chrome_trace wrote it (gzipped where the name ends in .gz)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


# What a range is charged with, by the host thread it started on: (pid, tid) -> [(start, "kernels" or
# "copies", duration)], sorted by start.
Work = dict[tuple[int, int], list[tuple[float, str, float]]]


def _device_work(trace: dict[str, Any]) -> Work:
    """A CUDA trace's device work by the host call that launched it: (the call's start, "kernels" or
    "copies", the device duration). A kernel, memcpy or memset is linked to that call by the
    "correlation" arg; work whose launch the trace lacks (launched before the profile began) is left out."""
    events = trace["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in LAUNCH_CATEGORIES}
    work: Work = {}
    for e in events:
        call = calls.get(e["args"]["correlation"]) if e.get("cat") in DEVICE_WORK else None
        if call is not None:
            work.setdefault((call["pid"], call["tid"]), []).append((call["ts"], DEVICE_WORK[e["cat"]], e["dur"]))
    for items in work.values():
        items.sort()
    return work


def _ns(us: float) -> int:
    return round(us * 1000)  # the trace's times are us with ns decimals; nesting is decided on whole ns


def _leaf_calls(trace: dict[str, Any]) -> Work:
    """A CPU trace's ATen calls that compute and call no other ATen op: (start, "kernels", duration) each.
    Nesting is read from the times on one thread, as torch builds its events' tree: a call lies inside
    the open call before it when it starts before that one ends and ends no later."""
    threads: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
    work: Work = {}
    for thread, calls in threads.items():
        spans = sorted(((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e) for e in calls), key=lambda s: (s[0], -s[1]))
        open_calls: list[tuple[int, int]] = []  # (index in spans, end in ns)
        callers: set[int] = set()
        for i, (start, end, _) in enumerate(spans):
            while open_calls and (start >= open_calls[-1][1] or end > open_calls[-1][1]):
                open_calls.pop()
            if open_calls:
                callers.add(open_calls[-1][0])
            open_calls.append((i, end))
        work[thread] = [(e["ts"], "kernels", e["dur"]) for i, (_, _, e) in enumerate(spans)
                        if i not in callers and e["name"] not in NO_KERNEL_OPS]  # fmt: skip
    return work


def _trace_span(e: dict[str, Any], work: Work, on_cuda: bool) -> Span:
    """A trace range's figures: the work that started inside the range on the range's thread (on CUDA the
    launch call's start: where and when the GPU ran the work does not matter, a kernel still queued when
    the range ended counts), and the range's own duration as host time. Its time is the device time of
    that work on CUDA, the range's own duration on the CPU."""
    items = work.get((e["pid"], e["tid"]), [])
    inside = items[bisect.bisect_left(items, e["ts"], key=lambda w: w[0]):
                   bisect.bisect_right(items, e["ts"] + e["dur"], key=lambda w: w[0])]  # fmt: skip
    kernels = sum(kind == "kernels" for _, kind, _ in inside)
    time_us = sum(dur for _, _, dur in inside) if on_cuda else e["dur"]
    return Span(e["name"], time_us, e["dur"], kernels, len(inside) - kernels)


def _work(trace: dict[str, Any], on_cuda: bool) -> Work:
    return _device_work(trace) if on_cuda else _leaf_calls(trace)


def trace_range_launches(trace: dict[str, Any], on_cuda: bool) -> dict[str, dict[str, int]]:
    """`scope_counts` of a trace's scope ranges, counted as `_trace_span` counts them."""
    work = _work(trace, on_cuda)
    return scope_counts(_trace_span(e, work, on_cuda) for e in trace["traceEvents"]
                        if e.get("cat") == "user_annotation" and _is_scope(e["name"]))  # fmt: skip


def trace_ranges(trace: dict[str, Any], step_range: str, on_cuda: bool) -> Ranges:
    """The ranges of a profile, from its chrome trace: every record_function range is a "user_annotation"
    event. An op range belongs to the step range its start lies in, on the same thread, and to the
    innermost scope range around its start there ("step" where none)."""
    work = _work(trace, on_cuda)
    annotations = sorted((e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"),
                         key=lambda e: e["ts"])  # fmt: skip
    steps = [e for e in annotations if e["name"] == step_range]
    ops, scopes = [], []
    for step in steps:
        inside = [e for e in annotations if (e["pid"], e["tid"]) == (step["pid"], step["tid"])
                  and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]  # fmt: skip
        step_scopes = [e for e in inside if _is_scope(e["name"])]
        for e in inside:
            if e["name"] in OP_NAMES:
                around = [s["name"] for s in step_scopes if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
                ops.append((_trace_span(e, work, on_cuda), around[-1] if around else "step"))
        scopes += [_trace_span(e, work, on_cuda) for e in step_scopes]
    spans = [_trace_span(s, work, on_cuda) for s in steps]
    return Ranges("gpu kernels" if on_cuda else "cpu", spans, ops, scopes)


def _kind(scope: str) -> str:
    match = SUBLAYER.match(scope)
    return match.group(2) if match else scope


def _sites(rows: list[dict]) -> None:
    """Name each call's site: its scope's kind ("attention", "moe", "lm_head"), plus the weight it was
    called with where one op meets several weights in one kind of scope (`linear`: attention.wq, .wo...)."""
    leaves: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        leaves.setdefault((r["op"], r["site"]), set()).add(r["weight"])
    for r in rows:
        if len(leaves[(r["op"], r["site"])]) > 1 and r["weight"]:
            r["site"] = f"{r['site']}.{r['weight']}"


# ---- the tables ------------------------------------------------------------------------------------
def _call_rows(ops: Sequence[tuple[Span, str]], calls, copy_gbps: float | None,
               gemm_tflops: float | None) -> list[dict]:  # fmt: skip
    """One row per op range, paired in order with its logged call (weight, task, cost)."""
    names = [span.name for span, _ in ops]
    if names != [call.op for call in calls]:
        pairs = enumerate(zip(names, calls, strict=False))
        first = next((i for i, (n, c) in pairs if n != c.op), min(len(names), len(calls)))
        got = names[first] if first < len(names) else "no range"
        logged = calls[first].op if first < len(calls) else "no call"
        raise ProfileMismatch(f"{len(ops)} op ranges in the profiled steps but {len(calls)} logged calls; "
                              f"first disagreement at call {first}: range {got!r}, logged {logged!r}")  # fmt: skip
    rows = []
    for (span, scope), call in zip(ops, calls, strict=True):
        cost = call.cost
        floor = None
        if cost is not None and copy_gbps is not None:
            floor = bench.floor_us(cost.bytes, cost.flops, copy_gbps, gemm_tflops)
        rows.append({
            "op": call.op, "site": _kind(scope), "weight": call.weight.rsplit(".", 1)[-1] if call.weight else "",
            "scope": scope, "task": call.task or "",
            "time_us": span.time_us, "host_us": span.host_us, "kernels": span.kernels, "copies": span.copies,
            "bytes": cost.bytes if cost else None, "flops": cost.flops if cost else None, "floor_us": floor,
        })  # fmt: skip
    _sites(rows)
    return rows


def _aggregate(rows: Sequence[dict], keys: tuple[str, ...], n_steps: int, ops_total_us: float) -> pd.DataFrame:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, group in groups.items():
        time_us = sum(r["time_us"] for r in group)
        tasked = [r for r in group if r["task"]]
        task_us = sum(r["time_us"] for r in tasked)
        bytes_ = sum(r["bytes"] for r in tasked) if tasked else None
        flops = sum(r["flops"] for r in tasked) if tasked else None
        floor = sum(r["floor_us"] for r in tasked) if tasked and tasked[0]["floor_us"] is not None else None
        out.append({
            **dict(zip(keys, key, strict=True)),
            "task": ", ".join(sorted({r["task"] for r in tasked})),
            "calls_per_step": len(group) / n_steps,
            "time_per_step_us": time_us / n_steps,
            "mean_us": time_us / len(group),
            "share_pct": 100.0 * time_us / ops_total_us if ops_total_us else 0.0,
            "host_per_step_us": sum(r["host_us"] for r in group) / n_steps,
            "kernels_per_step": sum(r["kernels"] for r in group) / n_steps,
            "kernels_per_call": sum(r["kernels"] for r in group) / len(group),
            "copies_per_step": sum(r["copies"] for r in group) / n_steps,
            "task_time_pct": 100.0 * task_us / time_us if time_us else 0.0,
            "bytes_per_step": bytes_ / n_steps if bytes_ is not None else None,
            "flops_per_step": flops / n_steps if flops is not None else None,
            "achieved_gbps": bytes_ / task_us / 1e3 if bytes_ and task_us else None,
            "floor_us_per_step": floor / n_steps if floor is not None else None,
            "floor_fraction": floor / task_us if floor is not None and task_us else None,
        })  # fmt: skip
    frame = pd.DataFrame(out)
    return frame.sort_values("time_per_step_us", ascending=False, kind="stable").reset_index(drop=True)


def _layers(scopes: Sequence[Span], cfg: BeamConfig, n_steps: int) -> pd.DataFrame:
    empty = {"time_us": 0.0, "host_us": 0.0, "kernels": 0, "copies": 0}
    per_scope: dict[str, dict[str, float]] = {}
    for span in scopes:
        acc = per_scope.setdefault(span.name, dict(empty))
        for k in acc:
            acc[k] += getattr(span, k)

    def row(part, layer, attention, ffn, parts) -> dict:
        got = [per_scope.get(p, empty) for p in parts]
        return {
            "part": part, "layer": layer, "attention": attention, "ffn": ffn,
            "attention_kernels": got[0]["kernels"] / n_steps if attention else None,
            "ffn_kernels": got[1]["kernels"] / n_steps if ffn else None,
            "kernels_per_step": sum(g["kernels"] for g in got) / n_steps,
            "copies_per_step": sum(g["copies"] for g in got) / n_steps,
            "time_per_step_us": sum(g["time_us"] for g in got) / n_steps,
            "host_per_step_us": sum(g["host_us"] for g in got) / n_steps,
        }  # fmt: skip

    rows = [row("embedding", None, "", "", ["embedding"])]
    for layer in range(cfg.n_layers):
        attention, ffn = "global" if cfg.is_global(layer) else "sliding", "moe" if cfg.is_moe(layer) else "dense"
        parts = [f"L{layer}.attention", f"L{layer}.{'moe' if cfg.is_moe(layer) else 'mlp'}"]
        rows.append(row(f"L{layer}", layer, attention, ffn, parts))
    rows.append(row("lm_head", None, "", "", ["lm_head"]))
    return pd.DataFrame(rows)


def analyze(ranges: Ranges, calls, cfg: BeamConfig, n_steps: int, copy_gbps: float | None,
            gemm_tflops: float | None) -> ProfileTables:  # fmt: skip
    """`ranges`: `trace_ranges` of the profile; `calls`: the call log,
    one OpCall per op range in the same order."""
    if len(ranges.steps) != n_steps:
        raise ProfileMismatch(f"expected {n_steps} step ranges in the profile; found {len(ranges.steps)}")
    rows = _call_rows(ranges.ops, calls, copy_gbps, gemm_tflops)
    ops_total = sum(r["time_us"] for r in rows)
    figures = StepFigures(
        steps=n_steps,
        time_basis=ranges.time_basis,
        host_ms=sum(s.host_us for s in ranges.steps) / n_steps / 1e3,
        device_ms=sum(s.time_us for s in ranges.steps) / n_steps / 1e3,
        ops_ms=ops_total / n_steps / 1e3,
        kernels=sum(s.kernels for s in ranges.steps) / n_steps,
        copies=sum(s.copies for s in ranges.steps) / n_steps,
        op_calls=len(rows) / n_steps,
    )
    ran = {r["op"] for r in rows}
    return ProfileTables(
        ops=_aggregate(rows, ("op",), n_steps, ops_total),
        sites=_aggregate(rows, ("op", "site"), n_steps, ops_total),
        layers=_layers(ranges.scopes, cfg, n_steps),
        step=figures,
        not_called=tuple(sorted(OP_NAMES - ran)),
        has_floor=copy_gbps is not None,
    )
