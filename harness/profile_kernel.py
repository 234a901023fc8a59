"""The kernel profile: one candidate under Nsight Compute, shape by shape, recorded beside its results.

    harness profile task=fuse_norm candidate=row_per_program 'shapes=["T=1","T=16384"]'

The candidate runs in a sandboxed child (harness/profile_kernel_child.py) started by plain `ncu`:
    ncu <NCU_OPTIONS> --metrics <METRICS> --export <job>/profile
        python -P -m harness.profile_kernel_child <job>/request.json
`--clock-control none` leaves the card's clocks alone (TOOLCHAIN.md); `--cache-control all`
flushes the caches before each replay, so DRAM traffic is a cold call's; `--profile-from-start
off` profiles only the child's cudaProfilerStart/Stop window (one call per shape, after warm-up).
nsight-python is not used: it re-runs the calling process itself under ncu (here the whole harness
command, outside the sandbox) and, when ncu is missing, runs it once more without profiling.

Before the child starts, the parent measures the copy bandwidth (and the GEMM rate, for shapes
where compute could bind) for the floor fractions. After it, the parent reads the report with
NVIDIA's `ncu_report` module (Nsight Compute's extras/python, found next to ncu when it is not on
PYTHONPATH; harness/profile_kernel_records.py), appends one KernelProfileRecord per shape to
results/<task>/kernel_profiles.jsonl and keeps the raw report in results/<task>/ncu/ (ncu-ui).

Without CUDA or without ncu, `execute` says which is missing and returns 0, writing nothing.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from harness import bench, environment, records, runner, sandbox
from harness import candidates as candidate_files
from harness.profile import ProfileSettings
from harness.profile_kernel_records import (
    METRICS,
    PROFILES_FILE,
    RANGE_PREFIX,
    KernelProfileRecord,
    kernel_profile_section,
    read_report,
    shape_figures,
    shape_statuses,
)
from tasks import get_task
from tasks.task import Shape, Task

REPORTS_DIR = "ncu"
CHILD_MODULE = "harness.profile_kernel_child"
NCU_FALLBACKS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute*/ncu")
NCU_REPORT_DIRS = ("/opt/nvidia/nsight-compute/*/extras/python", "/usr/local/cuda*/nsight-compute*/extras/python")
NCU_OPTIONS = ("--target-processes", "all", "--profile-from-start", "off", "--nvtx", "--clock-control", "none",
               "--cache-control", "all", "--replay-mode", "kernel")  # fmt: skip


class NcuUnusable(RuntimeError):
    """ncu is there but cannot be used as installed (no report reader): the machine's problem."""


# ---- validation and availability ------------------------------------------------------------------
@dataclass(frozen=True)
class KernelJob:
    settings: ProfileSettings
    task: Task
    candidate: candidate_files.Candidate
    shapes: tuple[Shape, ...]
    ncu: str | None
    skip_reason: str | None  # why this machine cannot profile (no CUDA, no ncu); None: it can


def find_ncu(explicit: str | None) -> str | None:
    if explicit is not None:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ValueError(f"ncu={explicit!r} is not an executable file")
        return explicit
    on_path = shutil.which("ncu")
    if on_path:
        return on_path
    for pattern in NCU_FALLBACKS:
        found = sorted(p for p in glob.glob(pattern) if os.access(p, os.X_OK))
        if found:
            return found[-1]  # the newest version folder
    return None


def prepare(s: ProfileSettings) -> KernelJob:
    task = get_task(s.task)
    found = candidate_files.resolve(task.name, task.op_name, (s.candidate,))
    known = [x.label for x in task.shapes]
    unknown = [label for label in s.shapes if label not in known]
    if unknown:
        raise ValueError(f"task {task.name!r} has no GPU shapes {unknown}; known: {known}")
    shapes = tuple(x for x in task.shapes if not s.shapes or x.label in s.shapes)
    if s.device == "cpu":
        raise ValueError("a kernel profile runs on the GPU (Nsight Compute); device=cpu does not apply")
    ncu = find_ncu(s.ncu)
    missing = []
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU here (torch.cuda.is_available() is False)")
    if ncu is None:
        missing.append(f"Nsight Compute's ncu not found (looked on PATH and at {', '.join(NCU_FALLBACKS)}; "
                       "give ncu=<path>)")  # fmt: skip
    return KernelJob(s, task, found[0], shapes, ncu, "; ".join(missing) or None)


def import_ncu_report(ncu: str):
    """NVIDIA's report reader, from PYTHONPATH or from the Nsight Compute install that holds `ncu`."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    dirs = [Path(os.path.realpath(ncu)).parent / "extras" / "python"]
    dirs += [Path(p) for pattern in NCU_REPORT_DIRS for p in sorted(glob.glob(pattern), reverse=True)]
    for d in dirs:
        if (d / "ncu_report.py").is_file():
            sys.path.insert(0, str(d))
            return importlib.import_module("ncu_report")
    raise NcuUnusable(f"ncu is at {ncu} but its Python report reader ncu_report is not importable; looked in "
                       f"{[str(d) for d in dirs]}: put Nsight Compute's extras/python on PYTHONPATH")  # fmt: skip


# ---- the profiled child -----------------------------------------------------------------------------
def usable_metrics(query_output: str) -> tuple[list[str], list[str]]:
    """(METRICS to ask for, METRICS this GPU's ncu does not know), from `ncu --query-metrics`'s output.

    ncu refuses a whole run over one unknown metric name, so names are checked first: a metric is
    dropped only when the query lists its family ("l1tex__", "launch__") but not its base name (the
    name before the first '.'); a family the query does not list at all is asked for anyway."""
    known = set(re.findall(r"^\s*([a-z0-9]+__[a-z0-9_]+)", query_output, flags=re.MULTILINE))
    families = {name.split("__", 1)[0] for name in known}
    missing = [m for m in METRICS if m.split("__", 1)[0] in families and m.split(".", 1)[0] not in known]
    return [m for m in METRICS if m not in missing], missing


def ncu_command(ncu: str, metrics: list[str], report_base: Path, request_path: Path) -> list[str]:
    return [ncu, *NCU_OPTIONS, "--metrics", ",".join(metrics), "--export", str(report_base), "--force-overwrite",
            sys.executable, "-P", "-s", "-B", "-m", CHILD_MODULE, str(request_path)]  # fmt: skip


def _run_under_ncu(job: KernelJob, metrics: list[str], root: Path) -> tuple[sandbox.ChildRun, Path]:
    """Run the child under ncu (sandbox.run_child's steps, with ncu in front of the child's command)."""
    s, c = job.settings, job.candidate
    cache_dir = Path(s.cache_dir) if s.cache_dir else runner.DEFAULT_CACHE_DIR
    child_job = sandbox.prepare_job(root, f"ncu-{c.short_hash}-{c.name}", True, c.path,
                                    cache_dir / "triton" / c.content_hash, {})  # fmt: skip
    request = {
        "task": job.task.name, "shapes": [x.label for x in job.shapes], "seed": s.seed, "warmup": s.kernel_warmup,
        "scratch": str(child_job.scratch), "report_path": str(child_job.report_path), "range_prefix": RANGE_PREFIX,
        "candidate": {"copy": str(child_job.candidate_copy), "hash": c.content_hash},
    }  # fmt: skip
    child_job.request_path.write_text(json.dumps(request, indent=1))
    child_job.report_path.touch(mode=0o644)
    report_base = child_job.job_dir / "profile"
    cmd = ncu_command(job.ncu, metrics, report_base, child_job.request_path)
    env = sandbox.child_env(child_job, "cuda", os.cpu_count() or 1)
    start = time.monotonic()
    with open(child_job.log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=child_job.scratch, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=s.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            sandbox._kill_group(proc)  # ncu, the child and any compiler they started
    events, malformed = [], 0
    for line in child_job.report_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a kill
            malformed += 1
    tail = child_job.log_path.read_text(errors="replace")[-sandbox.LOG_TAIL_CHARS :]
    run = sandbox.ChildRun(None if timed_out else proc.returncode, timed_out, time.monotonic() - start, events, tail,
                           malformed)  # fmt: skip
    sandbox.persist_triton_cache(child_job, cache_dir / "triton" / c.content_hash)
    return run, report_base.with_suffix(".ncu-rep")


def _kernels_of(run: sandbox.ChildRun, report_path: Path, ncu_report: ModuleType):
    """(kernels per shape, stray kernel names) from ncu's report; raises HarnessError when ncu itself failed."""
    if not any(e["event"] == "isolation" for e in run.events) or any(e["event"] == "child_error" for e in run.events):
        raise runner.HarnessError(f"the profiled child failed outside the candidate (exit {run.returncode}); "
                                  f"its log ends:\n{run.log_tail}")  # fmt: skip
    if report_path.is_file():
        return read_report(ncu_report, report_path)
    if any(e["event"] == "profiled" for e in run.events):  # calls were made, yet ncu recorded nothing
        errors = "\n".join(re.findall(r"==ERROR==.*", run.log_tail)) or run.log_tail
        raise runner.HarnessError(f"ncu wrote no report although the child made profiled calls:\n{errors}")
    return {}, []  # no call got that far: the statuses say why


def execute(job: KernelJob) -> int:
    s, task, c = job.settings, job.task, job.candidate
    if job.skip_reason is not None:
        print(f"kernel profile of {task.name}/{c.name} skipped: {job.skip_reason}. Nothing was written.")
        return 0
    try:
        ncu_report = import_ncu_report(job.ncu)
    except NcuUnusable as e:
        print(f"error: harness profile: {e}", file=sys.stderr)
        return 1
    version = subprocess.run([job.ncu, "--version"], capture_output=True, text=True, timeout=120)
    ncu_version = (version.stdout.strip().splitlines() or ["unknown"])[-1]
    query = subprocess.run([job.ncu, "--query-metrics"], capture_output=True, text=True, timeout=300)
    metrics, unknown_metrics = usable_metrics(query.stdout if query.returncode == 0 else "")
    if unknown_metrics:
        print(f"note: this GPU's ncu does not know {unknown_metrics}; profiling without them")
    bench_settings = bench.BenchSettings()
    copy_gbps = bench.measure_copy_gbps(bench_settings)
    compute_bound = any(task.cost(x).flops / max(task.cost(x).bytes, 1) > 50 for x in job.shapes)
    gemm_tflops = bench.measure_gemm_tflops(bench_settings) if compute_bound else None
    torch.cuda.empty_cache()
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    labels = [x.label for x in job.shapes]
    print(f"kernel profile: {task.name}/{c.name} ({c.short_hash}) on {len(labels)} shape(s) with {ncu_version}")
    results = records.task_results_dir(Path(s.results_dir) if s.results_dir else records.DEFAULT_RESULTS_DIR,
                                        task.name)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix=f"beam-profile-{task.name}-"))
    os.chmod(root, 0o711)
    kept = None
    try:
        run, report_path = _run_under_ncu(job, metrics, root)
        per_shape, stray = _kernels_of(run, report_path, ncu_report)
        if report_path.is_file():
            kept = results / REPORTS_DIR / f"{run_id}-{c.name}.ncu-rep"
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(report_path, kept)
    finally:
        if not s.keep_scratch:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"job directory kept: {root}")
    compiled = next((e["kernels"] for e in run.events if e["event"] == "compiled"), [])
    isolation = next(e["layers"] for e in run.events if e["event"] == "isolation")
    statuses = shape_statuses(run, labels, s.timeout_s)
    env = environment.capture().to_dict()
    made = []
    for shape in job.shapes:
        status, detail = statuses[shape.label]
        kernels = per_shape.get(shape.label, [])
        if status == "profiled" and not kernels:
            status, detail = "no_kernels", "the profiled call launched no kernel that ncu saw"
        figures = shape_figures(kernels, compiled, task, shape, copy_gbps, gemm_tflops) if kernels else {}
        made.append(KernelProfileRecord(
            run_id=run_id, task=task.name, candidate=c.name, candidate_hash=c.content_hash,
            candidate_path=c.display_path, shape_label=shape.label, shape=dict(shape.params), status=status,
            detail=detail, kernels=kernels, **figures, copy_gbps=copy_gbps, gemm_tflops=gemm_tflops,
            compiled=compiled, ncu_version=ncu_version, metrics_missing=unknown_metrics,
            ncu_report=str(kept.relative_to(results.parent)) if kept else None, ncu_options=" ".join(NCU_OPTIONS),
            seed=s.seed, warmup_calls=s.kernel_warmup, isolation=isolation, environment=env, command=s.command(),
        ))  # fmt: skip
    for r in made:
        records.append(results / PROFILES_FILE, r)
    print(kernel_profile_section([r.to_dict() for r in made]))
    if stray:
        print(f"note: {len(stray)} kernel(s) ran outside every shape's range and were left out: {sorted(set(stray))}")
    print(f"records: {results / PROFILES_FILE}" + (f"; raw report: {kept} (open with ncu-ui)" if kept else ""))
    return 0 if any(r.status == "profiled" for r in made) else 1
