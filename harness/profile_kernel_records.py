"""What a kernel profile records: Nsight Compute's report read into KernelProfileRecords, and shown.

harness/profile_kernel.py runs the candidate under ncu; this module turns the report into figures:
  read_report     kernels per shape, by the NVTX range "<RANGE_PREFIX><shape label>" each ran in,
                  every metric of METRICS converted to base units (ns, bytes, %, registers)
  shape_figures   per shape: duration (summed kernel time), DRAM throughput as % of peak and
                  achieved occupancy (duration-weighted over the kernels), theoretical occupancy,
                  registers per thread (the most of any kernel), spills (local-memory bytes moved,
                  and ptxas's spill count of each Triton kernel), DRAM bytes against the task's
                  Cost floor, and the floor fraction against the measured copy bandwidth / GEMM rate
  shape_statuses  per shape: profiled, or what the candidate did instead (data, as in the runner)
Records are append-only, one per (run, shape), in results/<task>/kernel_profiles.jsonl;
`kernel_profile_section` renders the latest per (candidate, shape) as Markdown for a task's report.

`ncu_report` objects are used through five calls (load_report, range/action iteration,
metric_by_name with value/unit, nvtx_state), so a stand-in can replace them in tests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness import bench, records, sandbox
from harness.profile_summary import markdown_table
from tasks.task import Shape, Task

PROFILES_FILE = "kernel_profiles.jsonl"
RANGE_PREFIX = "beam-profile:"
# ncu metric -> record field. Values are read in base units (ns, bytes, %, registers).
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "local_load_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "local_store_bytes",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
}
UNIT_SCALE = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
              "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}  # fmt: skip
STATUSES = ("profiled", "no_kernels", "import_error", "compile_error", "runtime_error", "cuda_fault", "crash",
            "timeout", "not_run", "sandbox_violation")  # fmt: skip


@dataclass(frozen=True)
class KernelProfileRecord:
    """One candidate on one shape under Nsight Compute. Append-only, in results/<task>/kernel_profiles.jsonl."""

    run_id: str
    task: str
    candidate: str
    candidate_hash: str
    candidate_path: str
    shape_label: str
    shape: dict[str, Any]
    status: str  # one of STATUSES
    detail: str  # why, when not profiled
    kernels: list[dict[str, Any]]  # per kernel launched by the profiled call: name + the METRICS fields
    duration_us: float | None = None  # summed over the call's kernels
    dram_throughput_pct: float | None = None  # duration-weighted
    achieved_occupancy_pct: float | None = None  # duration-weighted
    theoretical_occupancy_pct: float | None = None  # duration-weighted
    registers_per_thread: int | None = None  # the most of any kernel
    spill_bytes: float | None = None  # local-memory bytes loaded + stored
    triton_spills: int | None = None  # ptxas spill count summed over the Triton kernels that ran (where known)
    dram_bytes: float | None = None
    floor_bytes: int | None = None  # the task's Cost at this shape
    floor_flops: int | None = None
    floor_us: float | None = None
    floor_fraction: float | None = None  # floor_us / duration_us
    copy_gbps: float | None = None
    gemm_tflops: float | None = None
    compiled: list[dict[str, Any]] = field(default_factory=list)  # Triton kernels compiled (all configs)
    ncu_version: str = ""
    ncu_report: str | None = None  # the raw report, relative to the results directory
    ncu_options: str = ""
    metrics_missing: list[str] = field(default_factory=list)  # METRICS this GPU's ncu does not know (None above)
    seed: int = 0
    warmup_calls: int = 0
    isolation: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    record_id: str = field(default_factory=records.new_id)
    created_utc: str = field(default_factory=records.now_utc)

    def __post_init__(self) -> None:
        problems = []
        if self.status not in STATUSES:
            problems.append(f"status must be one of {STATUSES}; got {self.status!r}")
        if self.status == "profiled" and not (self.kernels and self.duration_us and self.duration_us > 0):
            problems.append("a profiled record needs its kernels and a positive duration")
        if self.status != "profiled" and not self.detail:
            problems.append(f"status {self.status} needs a detail saying why")
        if len(self.candidate_hash) != 64:
            problems.append(f"candidate_hash must be 64 hex chars; got {self.candidate_hash!r}")
        bad = [k for k, v in _numbers(self.to_dict()) if not math.isfinite(v)]
        if bad:
            problems.append(f"non-finite numbers at {bad[:5]}: store None instead")
        if problems:
            raise ValueError(f"kernel profile {self.task}/{self.candidate}/{self.shape_label}: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _numbers(obj: Any, where: str = "") -> list[tuple[str, float]]:
    if isinstance(obj, float):
        return [(where, obj)]
    if isinstance(obj, dict):
        return [n for k, v in obj.items() for n in _numbers(v, f"{where}.{k}")]
    if isinstance(obj, list | tuple):
        return [n for i, v in enumerate(obj) for n in _numbers(v, f"{where}[{i}]")]
    return []


# ---- reading the report --------------------------------------------------------------------------------
def _metric(action, name: str) -> float | None:
    m = action.metric_by_name(name)
    if m is None:
        return None
    value = m.value()
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return float(value) * UNIT_SCALE.get(m.unit(), 1.0)


def _shape_of(action) -> str | None:
    state = action.nvtx_state()
    if state is None:
        return None
    for domain_id in state.domains():
        for name in state.domain_by_id(domain_id).push_pop_ranges():
            if name.startswith(RANGE_PREFIX):
                return name[len(RANGE_PREFIX) :]
    return None


def read_report(ncu_report, path: Path) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Kernels per shape label (launch order), and the names of kernels outside every shape's range."""
    context = ncu_report.load_report(str(path))
    per_shape: dict[str, list[dict[str, Any]]] = {}
    stray = []
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            row = {"name": action.name(), **{f: _metric(action, m) for m, f in METRICS.items()}}
            label = _shape_of(action)
            if label is None:
                stray.append(row["name"])
            else:
                per_shape.setdefault(label, []).append(row)
    return per_shape, stray


# ---- per shape ---------------------------------------------------------------------------------------
def _weighted(kernels: list[dict[str, Any]], key: str) -> float | None:
    pairs = [(k[key], k["duration_ns"]) for k in kernels if k[key] is not None and k["duration_ns"]]
    total = sum(d for _, d in pairs)
    return sum(v * d for v, d in pairs) / total if total else None


def _sum(kernels: list[dict[str, Any]], *keys: str) -> float | None:
    values = [k[key] for k in kernels for key in keys if k[key] is not None]
    return sum(values) if values else None


def _ptxas_spills(kernel: dict[str, Any], compiled: list[dict[str, Any]]) -> int | None:
    """Spills of the compiled Triton kernel that this launch ran: same name, and (autotuning compiles one
    name several times) the launch's block size and registers; None when no compilation or several
    with different counts fit."""
    block, regs = kernel["block_size"], kernel["registers_per_thread"]
    fits = [c for c in compiled if c["name"] == kernel["name"] and c["n_spills"] is not None
            and (block is None or c["num_warps"] is None or c["num_warps"] * 32 == block)
            and (regs is None or c["n_regs"] is None or c["n_regs"] == regs)]  # fmt: skip
    counts = {c["n_spills"] for c in fits}
    return int(counts.pop()) if len(counts) == 1 else None


def shape_figures(kernels: list[dict[str, Any]], compiled: list[dict[str, Any]], task: Task, shape: Shape,
                  copy_gbps: float | None, gemm_tflops: float | None) -> dict[str, Any]:  # fmt: skip
    """The record's figures for one shape from its kernels' metrics (each kernel also gets the ptxas spill
    count of the Triton compilation that ran, when it can be told apart: `triton_n_spills`)."""
    for k in kernels:
        k["triton_n_spills"] = _ptxas_spills(k, compiled)
    duration_ns = _sum(kernels, "duration_ns")
    cost = task.cost(shape)
    floor = bench.floor_us(cost.bytes, cost.flops, copy_gbps, gemm_tflops) if copy_gbps else None
    spills = [k["triton_n_spills"] for k in kernels if k["triton_n_spills"] is not None]
    regs = [k["registers_per_thread"] for k in kernels if k["registers_per_thread"] is not None]
    duration_us = duration_ns / 1e3 if duration_ns else None
    return {
        "duration_us": duration_us,
        "dram_throughput_pct": _weighted(kernels, "dram_throughput_pct"),
        "achieved_occupancy_pct": _weighted(kernels, "achieved_occupancy_pct"),
        "theoretical_occupancy_pct": _weighted(kernels, "theoretical_occupancy_pct"),
        "registers_per_thread": int(max(regs)) if regs else None,
        "spill_bytes": _sum(kernels, "local_load_bytes", "local_store_bytes"),
        "triton_spills": int(sum(spills)) if spills else None,
        "dram_bytes": _sum(kernels, "dram_read_bytes", "dram_write_bytes"),
        "floor_bytes": cost.bytes, "floor_flops": cost.flops, "floor_us": floor,
        "floor_fraction": floor / duration_us if floor and duration_us else None,
    }  # fmt: skip


def shape_statuses(run: sandbox.ChildRun, labels: list[str], timeout_s: float) -> dict[str, tuple[str, str]]:
    """(status, detail) per shape from what the child reported and how it ended; "profiled" is provisional
    (the report must also hold the shape's kernels)."""
    events = run.events
    violations = next((e["violations"] for e in events if e["event"] == "done"), [])
    violations = violations or next((e.get("violations") for e in events if e["event"] == "import_error"), [])
    if violations:
        return {label: ("sandbox_violation", "; ".join(violations[:5])) for label in labels}
    imported = next((e for e in events if e["event"] == "import_error"), None)
    if imported is not None:
        return {label: (imported["status"], imported["message"]) for label in labels}
    out: dict[str, tuple[str, str]] = {}
    for e in events:
        if e["event"] == "profiled":
            out[e["shape"]] = ("profiled", "")
        elif e["event"] == "call_error":
            out[e["shape"]] = (e["status"], e["message"])
    started = [e["shape"] for e in events if e["event"] == "shape_start"]
    if not any(e["event"] == "done" for e in events):
        died = f"the child died ({run.signal_name or f'exit {run.returncode}'}) without reporting"
        why = ("timeout", f"killed after {timeout_s:g} s (timeout_s)") if run.timed_out else ("crash", died)
        cut = started[-1] if started else None
        for label in labels:
            if label not in out:
                out[label] = why if label == cut else ("not_run", f"not run: the child stopped earlier ({why[0]})")
    return out


# ---- for reports -------------------------------------------------------------------------------------
def load_profiles(results_dir: Path | str, task: str) -> tuple[list[KernelProfileRecord], list[str]]:
    """Every kernel profile of a task, plus the reports of skipped (unreadable) lines."""
    return records.read(records.task_results_dir(Path(results_dir), task) / PROFILES_FILE, KernelProfileRecord)


def kernel_profile_section(rows: list[dict[str, Any]]) -> str:
    """Markdown: the latest profile per (candidate, shape), for `harness profile` and a task's report."""
    if not rows:
        return "No kernel profiles recorded (`harness profile task=<task> candidate=<name>` on a GPU with ncu)."
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r["created_utc"]):
        latest[(r["candidate"], r["shape_label"])] = r
    table = pd.DataFrame([{
        "candidate": r["candidate"], "shape": r["shape_label"], "status": r["status"],
        "kernels": len(r["kernels"]), "duration_us": r.get("duration_us"),
        "dram_pct": r.get("dram_throughput_pct"), "occupancy_pct": r.get("achieved_occupancy_pct"),
        "theoretical_occupancy_pct": r.get("theoretical_occupancy_pct"), "registers": r.get("registers_per_thread"),
        "spill_bytes": r.get("spill_bytes"), "ptxas_spills": r.get("triton_spills"),
        "bytes_dram": r.get("dram_bytes"), "bytes_floor": r.get("floor_bytes"),
        "floor_fraction": r.get("floor_fraction"), "detail": r["detail"][:80],
    } for r in latest.values()])  # fmt: skip
    first = next(iter(latest.values()))
    return (f"### Nsight Compute ({first['ncu_version']}; {first['ncu_options']})\n\n"
            "DRAM % of peak and occupancy are duration-weighted over a call's kernels; registers: the most of "
            "any kernel; spill bytes: local-memory traffic; caches flushed before each kernel (cold call).\n\n"
            + markdown_table(table))  # fmt: skip
