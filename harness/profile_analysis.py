"""Profiler events -> the model profile's tables (pandas): per op, per call site, per layer, per step.

Input: the events of torch.profiler (their CPU tree: ranges with their children, and on CUDA the
kernels each op launched, attached by correlation id), the profiled steps' "profile.step" ranges,
and the traced ops' call log (harness/profile_model.py), one OpCall per op range in the same order.

Time: on CUDA, an op's time is its device time, the summed duration of the kernels launched inside
its range (what the GPU spent on it, not the host's launch time, which is `host_*`); on CPU it is
the range's CPU time. `time_basis` says which. Kernels: on CUDA, the kernels (copies and memsets
apart) launched inside the range; on CPU, the leaf ATen calls that compute something (views,
reshapes and allocations excluded): each would be at least one kernel launch on a GPU.

The kernels per layer (and `harness bench model`'s) are counted, on CUDA, from the profile's chrome
trace rather than from the events: on the H200 (torch 2.11) the events' tree lost one sublayer range
(L4.moe, in every step; its ops were reattached to the step) that the exported trace holds with all
its launches. The op and step tables, and every time, still come from the events.

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
from torch.autograd import DeviceType

from harness import bench
from reference_model.config import BeamConfig
from reference_model.ops import ModelOps

OP_NAMES = frozenset(ModelOps.__dataclass_fields__)
SUBLAYER = re.compile(r"^L(\d+)\.(attention|mlp|moe)$")
OUTER_SCOPES = ("embedding", "lm_head")
COPY_PREFIXES = ("Memcpy", "Memset")
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
    device_ms: float  # summed kernel time of a step (CUDA); the CPU time on CPU
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


# ---- walking the event tree -------------------------------------------------------------------------
def _subtree(evt) -> Iterable[Any]:
    stack = [evt]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.cpu_children)


def launches(evt, on_cuda: bool) -> tuple[int, int]:
    """(kernels, copies) launched inside one range."""
    kernels = copies = 0
    for e in _subtree(evt):
        if on_cuda:
            for k in e.kernels:
                if k.name.startswith(COPY_PREFIXES):
                    copies += 1
                else:
                    kernels += 1
        elif (e.name.startswith("aten::") and e.name not in NO_KERNEL_OPS
              and not any(c.name.startswith("aten::") for c in e.cpu_children)):  # fmt: skip
            kernels += 1
    return kernels, copies


def _is_scope(name: str) -> bool:
    """A range the layer table reads: "embedding", "lm_head" or a sublayer ("L3.moe")."""
    return name in OUTER_SCOPES or SUBLAYER.match(name) is not None


def range_launches(events: Iterable[Any]) -> dict[str, dict[str, int]]:
    """{"L3.moe": {"kernels": n, "copies": m}, ...} for each scope range of a CPU profile, summed over
    the range's occurrences (one per profiled step): the leaf ATen calls below it (`launches`)."""
    counts: dict[str, dict[str, int]] = {}
    for evt in events:
        if _is_scope(evt.name):
            kernels, copies = launches(evt, on_cuda=False)
            acc = counts.setdefault(evt.name, {"kernels": 0, "copies": 0})
            acc["kernels"] += kernels
            acc["copies"] += copies
    return counts


def trace_range_launches(trace: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{"L3.moe": {"kernels": n, "copies": m}, ...} for each scope range of a CUDA chrome trace, summed
    over the range's occurrences (one per profiled step). Device work (a kernel; a memcpy or memset is a
    copy) belongs to a range when the host call that launched it, linked by the "correlation" arg,
    started inside the range on the range's thread: where the GPU ran it later does not matter.
    Work whose launch the trace lacks (launched before the profile began) is in no range."""
    events = trace["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in LAUNCH_CATEGORIES}
    launched: dict[tuple[int, int], list[tuple[float, str]]] = {}  # (pid, tid) -> [(launch ts, kind)]
    for e in events:
        call = calls.get(e["args"]["correlation"]) if e.get("cat") in DEVICE_WORK else None
        if call is not None:
            launched.setdefault((call["pid"], call["tid"]), []).append((call["ts"], DEVICE_WORK[e["cat"]]))
    for starts in launched.values():
        starts.sort()
    counts: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and _is_scope(e["name"]):
            starts = launched.get((e["pid"], e["tid"]), [])
            first = bisect.bisect_left(starts, e["ts"], key=lambda s: s[0])
            last = bisect.bisect_right(starts, e["ts"] + e["dur"], key=lambda s: s[0])
            acc = counts.setdefault(e["name"], {"kernels": 0, "copies": 0})
            for _, kind in starts[first:last]:
                acc[kind] += 1
    return counts


def read_trace(path: Path) -> dict[str, Any]:
    """A chrome trace as prof.export_chrome_trace wrote it (gzipped where the name ends in .gz)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def _times(evt, on_cuda: bool) -> tuple[float, float]:
    """(time, host time) of a range in microseconds; time is device time on CUDA."""
    host = evt.cpu_time_total
    return (evt.device_time_total if on_cuda else host), host


def _ranges_in_step(step) -> tuple[list[tuple[Any, str]], list[Any]]:
    """The op ranges of one step with their scope (in call order), and the scope ranges themselves."""
    ops, scopes = [], []
    stack = [(child, "step") for child in reversed(step.cpu_children)]
    while stack:
        evt, scope = stack.pop()
        if evt.name in OP_NAMES:
            ops.append((evt, scope))
            continue  # ops do not nest: whatever runs inside belongs to this op
        if _is_scope(evt.name):
            scope = evt.name
            scopes.append(evt)
        stack.extend((child, scope) for child in reversed(evt.cpu_children))
    return ops, scopes


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
def _call_rows(events, calls, on_cuda: bool, copy_gbps: float | None, gemm_tflops: float | None,
               step_range: str) -> tuple[list[dict], list[dict], list[Any]]:  # fmt: skip
    steps = [e for e in events if e.name == step_range and e.device_type == DeviceType.CPU]
    op_events, scope_events = [], []
    for step in steps:
        ops, scopes = _ranges_in_step(step)
        op_events += ops
        scope_events += scopes
    names = [evt.name for evt, _ in op_events]
    if names != [call.op for call in calls]:
        pairs = enumerate(zip(names, calls, strict=False))
        first = next((i for i, (n, c) in pairs if n != c.op), min(len(names), len(calls)))
        raise ProfileMismatch(f"{len(op_events)} op ranges in the profiled steps but {len(calls)} logged calls; "
                              f"first disagreement at call {first}")  # fmt: skip
    rows = []
    for (evt, scope), call in zip(op_events, calls, strict=True):
        time_us, host_us = _times(evt, on_cuda)
        kernels, copies = launches(evt, on_cuda)
        cost = call.cost
        floor = None
        if cost is not None and copy_gbps is not None:
            floor = bench.floor_us(cost.bytes, cost.flops, copy_gbps, gemm_tflops)
        rows.append({
            "op": call.op, "site": _kind(scope), "weight": call.weight.rsplit(".", 1)[-1] if call.weight else "",
            "scope": scope, "task": call.task or "",
            "time_us": time_us, "host_us": host_us, "kernels": kernels, "copies": copies,
            "bytes": cost.bytes if cost else None, "flops": cost.flops if cost else None, "floor_us": floor,
        })  # fmt: skip
    _sites(rows)
    scope_rows = []
    for evt in scope_events:
        time_us, host_us = _times(evt, on_cuda)
        scope_rows.append({"scope": evt.name, "time_us": time_us, "host_us": host_us})
    return rows, scope_rows, steps


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


def _layers(scope_rows: Sequence[dict], counts: dict[str, dict[str, int]], cfg: BeamConfig,
            n_steps: int) -> pd.DataFrame:  # fmt: skip
    """Times from the events' scope ranges; kernels and copies from `counts` (range_launches or
    trace_range_launches), which on CUDA may hold a range the events lost."""
    empty = {"time_us": 0.0, "host_us": 0.0, "kernels": 0, "copies": 0}
    per_scope: dict[str, dict[str, float]] = {name: empty | c for name, c in counts.items()}
    for r in scope_rows:
        acc = per_scope.setdefault(r["scope"], dict(empty))
        acc["time_us"] += r["time_us"]
        acc["host_us"] += r["host_us"]

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


def analyze(events, trace: dict[str, Any] | None, calls, cfg: BeamConfig, n_steps: int, on_cuda: bool,
            copy_gbps: float | None, gemm_tflops: float | None, step_range: str) -> ProfileTables:  # fmt: skip
    """`trace`: the same profile's chrome trace, which the kernels per layer are counted from on CUDA
    (None on CPU, where they come from the events)."""
    rows, scope_rows, steps = _call_rows(events, calls, on_cuda, copy_gbps, gemm_tflops, step_range)
    if len(steps) != n_steps:
        raise ProfileMismatch(f"expected {n_steps} '{step_range}' ranges in the profile; found {len(steps)}")
    ops_total = sum(r["time_us"] for r in rows)
    step_times = [_times(s, on_cuda) for s in steps]
    step_launches = [launches(s, on_cuda) for s in steps]
    figures = StepFigures(
        steps=n_steps,
        time_basis="gpu kernels" if on_cuda else "cpu",
        host_ms=sum(h for _, h in step_times) / n_steps / 1e3,
        device_ms=sum(t for t, _ in step_times) / n_steps / 1e3,
        ops_ms=ops_total / n_steps / 1e3,
        kernels=sum(k for k, _ in step_launches) / n_steps,
        copies=sum(c for _, c in step_launches) / n_steps,
        op_calls=len(rows) / n_steps,
    )
    ran = {r["op"] for r in rows}
    return ProfileTables(
        ops=_aggregate(rows, ("op",), n_steps, ops_total),
        sites=_aggregate(rows, ("op", "site"), n_steps, ops_total),
        layers=_layers(scope_rows, trace_range_launches(trace) if on_cuda else range_launches(events), cfg, n_steps),
        step=figures,
        not_called=tuple(sorted(OP_NAMES - ran)),
        has_floor=copy_gbps is not None,
    )
