"""What a kernel profile records: nsight-python's results turned into KernelProfileRecords, and shown.

harness/profile_kernel_child.py profiles the candidate through nsight-python; this module holds what
both sides of that child share and what the parent makes of it:
  METRICS, NSIGHT_OPTIONS  what is asked of Nsight Compute, and how (`nsight.analyze.kernel`)
  combine_kernels  nsight-python's `combine_kernel_metrics` rule when one call launches several
                   kernels: it folds the kernels' metric arrays pairwise in launch order, so each
                   metric is combined by its own rule: durations and bytes summed, registers, grid
                   and block the largest of any kernel, percentages weighted by kernel duration (the
                   fold carries the summed duration, so the running weighted mean stays exact)
  call_figures     the kernels' names and the combined METRICS of one call, from the ProfileResults
                   DataFrame (one row per metric: Annotation, Metric, AvgValue, Kernel "k1|k2", ...)
  shape_figures    per shape: duration, DRAM throughput as % of peak, SM throughput and occupancy
                   (achieved, theoretical), the issue slots used and the XU, FP64, FMA and ALU
                   pipes' utilizations, the warp cycles per issued instruction split by stall
                   reason (STALL_REASONS), L2's throughput, the bytes the SMs read from L2 and L1's
                   hit rate, registers per thread, spills (local-memory bytes moved,
                   and ptxas's spill count of the Triton kernels), DRAM bytes against the task's
                   Cost floor, and the floor fraction against the measured copy bandwidth / GEMM rate
  shape_statuses   per shape: profiled, or what the candidate (or the profiler) did instead
Per-kernel metrics are not recorded: nsight-python hands back one combined value per metric and
call (and the launched kernels' names); a call's kernels are listed by name only.
Records are append-only, one per (run, shape), in results/<task>/kernel_profiles.jsonl;
`kernel_profile_section` renders the latest per (candidate, shape) as Markdown for a task's report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import bench, records, sandbox
from harness.profile_summary import markdown_table
from tasks.task import Shape, Task

PROFILES_FILE = "kernel_profiles.jsonl"
DURATION = "gpu__time_duration.sum"
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "membar", "lg_throttle", "mio_throttle",
                 "math_pipe_throttle", "tex_throttle", "drain", "dispatch_stall", "branch_resolving", "no_instruction",
                 "imc_miss", "sleeping", "misc", "not_selected", "selected")  # fmt: skip
# ncu metric -> (record field, how several kernels of one call combine). ncu_report gives base units
# (ns, bytes, %, registers).
METRICS = {
    DURATION: ("duration_ns", "sum"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("dram_throughput_pct", "weighted"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("sm_throughput_pct", "weighted"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved_occupancy_pct", "weighted"),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical_occupancy_pct", "weighted"),
    "launch__registers_per_thread": ("registers_per_thread", "max"),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": ("local_load_bytes", "sum"),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": ("local_store_bytes", "sum"),
    "dram__bytes_read.sum": ("dram_read_bytes", "sum"),
    "dram__bytes_write.sum": ("dram_write_bytes", "sum"),
    "launch__grid_size": ("grid_size", "max"),
    "launch__block_size": ("block_size", "max"),
    # Where the SM's time goes when DRAM is not the wall: the schedulers' issue slots, and the pipes a
    # fused elementwise kernel can saturate (XU: type conversions and transcendentals; FP64: double
    # precision, such as the exact FP64 sums of squares; FMA and ALU: the float and integer work).
    "smsp__issue_active.avg.pct_of_peak_sustained_active": ("issue_active_pct", "weighted"),
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": ("xu_pipe_pct", "weighted"),
    "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active": ("fp64_pipe_pct", "weighted"),
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": ("fma_pipe_pct", "weighted"),
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": ("alu_pipe_pct", "weighted"),
    # Traffic DRAM does not see: what the SMs read from L2 (a tile re-read by many programs), how busy
    # L2 was, and how much of the SMs' traffic their L1 served.
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("l2_throughput_pct", "weighted"),
    "lts__t_sectors_srcunit_tex_op_read.sum": ("l2_read_sectors", "sum"),
    "l1tex__t_sector_hit_rate.pct": ("l1_hit_pct", "weighted"),
    # Why the warps did not issue (ncu's Warp State Statistics): per stall reason, the warps stalled for it
    # per cycle in which the scheduler issued, i.e. the share of a warp's cycles between two issued
    # instructions that the reason accounts for; the reasons add up to the first metric's total. A
    # memory-bound kernel short of its DRAM ceiling whose largest reason is long_scoreboard (waiting on
    # global loads), with few warps active, has too few loads in flight; wait (fixed-latency dependencies),
    # barrier, mio/lg_throttle (shared/global request queues full) or math_pipe_throttle point at its code.
    "smsp__average_warp_latency_per_inst_issued.ratio": ("warp_cycles_per_issue", "weighted"),
    **{
        f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": (f"stall_{r}", "weighted")
        for r in STALL_REASONS
    },
}
L2_SECTOR_BYTES = 32
PIPES = ("xu", "fp64", "fma", "alu")
# `nsight.analyze.kernel` settings besides metrics, combine_kernel_metrics and output_prefix: one cold
# call per shape (caches flushed before each replay), the card's clocks left alone (TOOLCHAIN.md), no
# thermal pauses (NVML's GPU 0 need not be the profiled GPU under CUDA_VISIBLE_DEVICES).
NSIGHT_OPTIONS = {"runs": 1, "cache_control": "all", "clock_control": "none", "replay_mode": "kernel",
                  "thermal_mode": "off", "output": "quiet"}  # fmt: skip
STATUSES = ("profiled", "no_kernels", "import_error", "compile_error", "runtime_error", "cuda_fault", "crash",
            "timeout", "not_run", "sandbox_violation", "profiler_error")  # fmt: skip


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
    kernels: list[str]  # names of the kernels the profiled call launched, in launch order
    duration_us: float | None = None  # summed over the call's kernels
    dram_throughput_pct: float | None = None  # duration-weighted
    sm_throughput_pct: float | None = None  # duration-weighted
    achieved_occupancy_pct: float | None = None  # duration-weighted
    theoretical_occupancy_pct: float | None = None  # duration-weighted
    issue_active_pct: float | None = None  # duration-weighted: issue slots used, of the SM's active cycles
    xu_pipe_pct: float | None = None  # duration-weighted pipe utilizations, of the SM's active cycles
    fp64_pipe_pct: float | None = None
    fma_pipe_pct: float | None = None
    alu_pipe_pct: float | None = None
    l2_throughput_pct: float | None = None  # duration-weighted, of L2's peak
    l2_read_bytes: float | None = None  # read by the SMs from L2 (32-byte sectors), summed
    l1_hit_pct: float | None = None  # duration-weighted: sectors the SMs' L1 served, of all they asked for
    warp_cycles_per_issue: float | None = None  # duration-weighted: a warp's cycles from one issue to its next
    stalls: dict[str, float] = field(default_factory=dict)  # STALL_REASONS -> their share of those cycles
    registers_per_thread: int | None = None  # the most of any kernel
    grid_size: int | None = None  # blocks (threads per block) of the kernel; the largest of any when several
    block_size: int | None = None
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
    ncu_report: str | None = None  # the raw report of this shape's profiled run, relative to the results directory
    ncu_options: str = ""  # nsight-python's version and settings
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


# ---- nsight-python's side ----------------------------------------------------------------------------
def combine_kernels(metrics: Sequence[str]) -> Callable[[Any, Any], np.ndarray]:
    """`combine_kernel_metrics` for `metrics` (nsight-python folds each call's kernels with it: the
    combined values so far and the next kernel's, as arrays in `metrics` order). Percentages are
    weighted by duration (NaN when the call's duration is not among `metrics` or is zero)."""
    rules = [METRICS[m][1] for m in metrics]
    d = list(metrics).index(DURATION) if DURATION in metrics else None

    def combine(x: Any, y: Any) -> np.ndarray:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        wx, wy = (x[d], y[d]) if d is not None else (math.nan, math.nan)
        out = np.empty_like(x)
        for i, rule in enumerate(rules):
            if rule == "sum":
                out[i] = x[i] + y[i]
            elif rule == "max":
                out[i] = max(x[i], y[i])
            else:
                out[i] = (x[i] * wx + y[i] * wy) / (wx + wy) if wx + wy > 0 else math.nan
        return out

    return combine


def call_figures(frame: pd.DataFrame) -> tuple[list[str], dict[str, float | None]]:
    """(kernel names in launch order, record field -> value) of one profiled call, from nsight-python's
    ProfileResults.to_dataframe() (one config, one run: a row per metric; `Kernel` joins the combined
    kernels' names with '|'). METRICS not in the frame, or not finite, are None."""
    values: dict[str, float | None] = dict.fromkeys((f for f, _ in METRICS.values()), None)
    kernels: list[str] = []
    for row in frame.to_dict("records"):
        field_name = METRICS.get(row["Metric"], (None,))[0]
        if field_name is None:
            continue
        value = row["AvgValue"]
        ok = isinstance(value, int | float | np.number) and not isinstance(value, bool) and math.isfinite(value)
        values[field_name] = float(value) if ok else None
        kernels = str(row["Kernel"]).split("|")
    return kernels, values


# ---- per shape ---------------------------------------------------------------------------------------
def _ptxas_spills(name: str, block: float | None, regs: float | None, compiled: list[dict[str, Any]]) -> int | None:
    """Spills of the compiled Triton kernel `name` that ran: autotuning compiles one name several times,
    so the launch's block size and registers pick one when known (`block`/`regs`: None when the call
    launched several kernels, whose figures are combined); None when none or several counts fit."""
    fits = [c for c in compiled if c["name"] == name and c["n_spills"] is not None
            and (block is None or c["num_warps"] is None or c["num_warps"] * 32 == block)
            and (regs is None or c["n_regs"] is None or c["n_regs"] == regs)]  # fmt: skip
    counts = {c["n_spills"] for c in fits}
    return int(counts.pop()) if len(counts) == 1 else None


def _total(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def shape_figures(kernels: list[str], values: dict[str, float | None], compiled: list[dict[str, Any]], task: Task,
                  shape: Shape, copy_gbps: float | None, gemm_tflops: float | None) -> dict[str, Any]:  # fmt: skip
    """The record's figures for one shape from its call's kernel names and combined METRICS (`call_figures`)."""
    single = len(kernels) == 1
    spills = [_ptxas_spills(k, values["block_size"] if single else None,
                            values["registers_per_thread"] if single else None, compiled) for k in kernels]  # fmt: skip
    known = [n for n in spills if n is not None]
    duration_us = values["duration_ns"] / 1e3 if values["duration_ns"] else None
    cost = task.cost(shape)
    floor = bench.floor_us(cost.bytes, cost.flops, copy_gbps, gemm_tflops) if copy_gbps else None
    ints = {k: int(values[k]) if values[k] is not None else None for k in ("registers_per_thread", "grid_size",
                                                                          "block_size")}  # fmt: skip
    return {
        "duration_us": duration_us,
        **{k: values[k] for k in ("dram_throughput_pct", "sm_throughput_pct", "achieved_occupancy_pct",
                                  "theoretical_occupancy_pct", "issue_active_pct",
                                  *(f"{p}_pipe_pct" for p in PIPES), "l2_throughput_pct", "l1_hit_pct")},
        "l2_read_bytes": values["l2_read_sectors"] * L2_SECTOR_BYTES if values["l2_read_sectors"] is not None else None,
        "warp_cycles_per_issue": values["warp_cycles_per_issue"],
        "stalls": {r: values[f"stall_{r}"] for r in STALL_REASONS if values[f"stall_{r}"] is not None},
        **ints,
        "spill_bytes": _total(values["local_load_bytes"], values["local_store_bytes"]),
        "triton_spills": int(sum(known)) if known else None,
        "dram_bytes": _total(values["dram_read_bytes"], values["dram_write_bytes"]),
        "floor_bytes": cost.bytes, "floor_flops": cost.flops, "floor_us": floor,
        "floor_fraction": floor / duration_us if floor and duration_us else None,
    }  # fmt: skip


def shape_statuses(run: sandbox.ChildRun, labels: list[str], timeout_s: float) -> dict[str, tuple[str, str]]:
    """(status, detail) per shape from what the child (and its re-runs under ncu: `rerun_*` events)
    reported and how it ended; "profiled" is provisional (the call must also have launched kernels).
    A shape whose profiled run failed is the candidate's status when its re-run said the candidate
    raised, else "profiler_error" (ncu or nsight-python failed; the detail holds their errors)."""
    events = run.events
    violations = [v for e in events if e["event"] in ("done", "import_error", "rerun_done", "rerun_error")
                  for v in e.get("violations") or []]  # fmt: skip
    if violations:
        detail = "; ".join(list(dict.fromkeys(violations))[:5])
        return {label: ("sandbox_violation", detail) for label in labels}
    imported = next((e for e in events if e["event"] == "import_error"), None)
    if imported is not None:
        return {label: (imported["status"], imported["message"]) for label in labels}
    out: dict[str, tuple[str, str]] = {}
    rerun_errors = {e["shape"]: e for e in events if e["event"] == "rerun_error"}
    for e in events:
        if e["event"] == "profiled":
            out[e["shape"]] = ("profiled", "")
        elif e["event"] == "call_error":
            out[e["shape"]] = (e["status"], e["message"])
        elif e["event"] == "profile_error":
            raised = rerun_errors.get(e["shape"])
            if raised is not None and raised["status"] != "profiler_error":
                out[e["shape"]] = (raised["status"], f"under ncu: {raised['message']}")
            else:
                out[e["shape"]] = ("profiler_error", "\n".join(x for x in (raised and raised["message"],
                                                                            e["message"]) if x))  # fmt: skip
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
def pipes_cell(r: dict[str, Any]) -> str:
    """'xu 38 fma 21 ...': the pipes' utilizations, busiest first (records before these metrics: '')."""
    known = [(p, r.get(f"{p}_pipe_pct")) for p in PIPES]
    known = sorted(((p, v) for p, v in known if v is not None), key=lambda pv: -pv[1])
    return " ".join(f"{p} {v:.0f}" for p, v in known)


def stalls_cell(r: dict[str, Any], top: int = 3) -> str:
    """'long_scoreboard 14.2 wait 2.1 not_selected 0.9 of 19.0': the largest stall reasons in warp cycles
    per issued instruction, then all reasons' total (records before these metrics: '')."""
    stalls = sorted((r.get("stalls") or {}).items(), key=lambda kv: -kv[1])[:top]
    if not stalls:
        return ""
    total = r.get("warp_cycles_per_issue")
    return " ".join(f"{k} {v:.1f}" for k, v in stalls) + (f" of {total:.1f}" if total is not None else "")


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
        "l2_pct": r.get("l2_throughput_pct"), "bytes_l2_read": r.get("l2_read_bytes"),
        "l1_hit_pct": r.get("l1_hit_pct"),
        "floor_fraction": r.get("floor_fraction"), "issue_pct": r.get("issue_active_pct"),
        "pipes_pct": pipes_cell(r), "stalls": stalls_cell(r), "detail": r["detail"][:80],
    } for r in latest.values()])  # fmt: skip
    first = next(iter(latest.values()))
    return (f"### Nsight Compute ({first['ncu_version']}; {first['ncu_options']})\n\n"
            "DRAM % of peak and occupancy are duration-weighted over a call's kernels; registers: the most of "
            "any kernel; spill bytes: local-memory traffic; caches flushed before each kernel (cold call). "
            "issue %: the schedulers' issue slots used; pipes %: each pipe's utilization, busiest first "
            "(xu: conversions and transcendentals), both of the SM's active cycles. l2 %: L2's throughput of its "
            "peak; bytes l2 read: what the SMs read from L2, which a tile re-read by many programs inflates past "
            "bytes dram; l1 hit %: sectors the SMs' L1 served. stalls: the largest reasons a warp waited, in warp "
            "cycles per issued instruction, of all reasons' total (long_scoreboard: global loads; wait: fixed "
            "latencies; not_selected: ready but another warp issued).\n\n"
            + markdown_table(table))  # fmt: skip
