"""The kernel profile: one candidate under Nsight Compute through nsight-python, shape by shape.

    harness profile task=fuse_norm candidate=row_per_program 'shapes=["T=1","T=16384"]'

The candidate runs in a sandboxed child (harness/profile_kernel_child.py):
    python -P -s -B -m harness.profile_kernel_child <job>/request.json
which calls an `nsight.analyze.kernel`-decorated function once per shape (metrics METRICS,
cache_control "all": DRAM traffic is a cold call's; clock_control "none": the card's clocks are
left alone, TOOLCHAIN.md; replay_mode "kernel"). nsight-python then re-runs that child, and only
it, under `ncu` (sandboxed alike, its own environment variable NSPY_NCU_PROFILE set) and reads the
report. For that the parent gives the child: this ncu's folder first on PATH (nsight-python runs
`ncu` by name, through /bin/sh; so the binary must be called ncu), the folder of NVIDIA's
`ncu_report` module on PYTHONPATH when this Python cannot import it already (nsight-python reads
reports with it; Nsight Compute's extras/python, found next to ncu), PYTHONSAFEPATH (the re-run
starts the child's file as a script, without -P), and an audit hook that lets nsight-python start
its ncu commands.

Before the child starts, the parent measures the copy bandwidth (and the GEMM rate, for shapes
where compute could bind) for the floor fractions. After it, the parent turns the child's events
into one KernelProfileRecord per shape (harness/profile_kernel_records.py), appends them to
results/<task>/kernel_profiles.jsonl and keeps each shape's raw report in results/<task>/ncu/ (ncu-ui).

Without CUDA or without ncu, `execute` says which is missing and returns 0, writing nothing.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import bench, environment, records, runner, sandbox
from harness import candidates as candidate_files
from harness.profile import ProfileSettings
from harness.profile_kernel_records import (
    METRICS,
    NSIGHT_OPTIONS,
    PROFILES_FILE,
    KernelProfileRecord,
    kernel_profile_section,
    shape_figures,
    shape_statuses,
)
from tasks import get_task
from tasks.task import Shape, Task

REPORTS_DIR = "ncu"
CHILD_MODULE = "harness.profile_kernel_child"
NCU_FALLBACKS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute*/ncu")
NCU_REPORT_DIRS = ("/opt/nvidia/nsight-compute/*/extras/python", "/usr/local/cuda*/nsight-compute*/extras/python")


class NcuUnusable(RuntimeError):
    """ncu is there but cannot be used as installed (no nsight-python, no report reader): the machine's problem."""


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
        if os.path.basename(explicit) != "ncu":
            raise ValueError(f"ncu={explicit!r} must be a file named ncu: nsight-python runs `ncu` from PATH")
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


def child_import_paths(ncu: str) -> list[str]:
    """Folders the child needs on PYTHONPATH besides the parent's: the one holding NVIDIA's report reader
    ncu_report (which nsight-python imports) when this Python cannot import it, found in the Nsight
    Compute install that holds `ncu`. Raises NcuUnusable when nsight-python or ncu_report is missing."""
    if importlib.util.find_spec("nsight") is None:
        raise NcuUnusable("nsight-python is not importable: install it (pyproject's gpu extra: nsight-python==0.9.6)")
    if importlib.util.find_spec("ncu_report") is not None:
        return []
    dirs = [Path(os.path.realpath(ncu)).parent / "extras" / "python"]
    dirs += [Path(p) for pattern in NCU_REPORT_DIRS for p in sorted(glob.glob(pattern), reverse=True)]
    for d in dirs:
        if (d / "ncu_report.py").is_file():
            return [str(d)]
    raise NcuUnusable(f"ncu is at {ncu} but its Python report reader ncu_report is not importable; looked in "
                       f"{[str(d) for d in dirs]}: put Nsight Compute's extras/python on PYTHONPATH")  # fmt: skip


# ---- the profiled child -----------------------------------------------------------------------------
# Documented in Nsight Compute's metrics reference (Occupancy Metrics) but absent from `ncu
# --query-metrics` (2025.3.1 on the H200 listed the sm__ family without it): asked for regardless.
UNLISTED_METRICS = frozenset({"sm__maximum_warps_per_active_cycle_pct"})


def usable_metrics(query_output: str) -> tuple[list[str], list[str]]:
    """(METRICS to ask for, METRICS this GPU's ncu does not know), from `ncu --query-metrics`'s output.

    ncu refuses a whole run over one unknown metric name, so names are checked first: a metric is
    dropped only when the query lists its family ("l1tex__", "launch__") but not its base name (the
    name before the first '.'); a family the query does not list at all is asked for anyway, and so
    are UNLISTED_METRICS, which the query omits although ncu collects them."""
    known = set(re.findall(r"^\s*([a-z0-9]+__[a-z0-9_]+)", query_output, flags=re.MULTILINE))
    families = {name.split("__", 1)[0] for name in known}
    missing = [m for m in METRICS if m.split("__", 1)[0] in families and m.split(".", 1)[0] not in known
               and m not in UNLISTED_METRICS]  # fmt: skip
    return [m for m in METRICS if m not in missing], missing


def _shell_safe(*paths: str | Path) -> None:
    """nsight-python joins the re-run's command line unquoted and hands it to /bin/sh."""
    unsafe = [str(p) for p in paths if shlex.quote(str(p)) != str(p)]
    if unsafe:
        raise runner.HarnessError(f"nsight-python cannot start ncu on paths a shell would split or expand: {unsafe} "
                                  "(set TMPDIR, or move the checkout or Python, to a plain path)")  # fmt: skip


def _run_child(job: KernelJob, metrics: list[str], root: Path,
               import_paths: list[str]) -> tuple[sandbox.ChildRun, sandbox.Job]:  # fmt: skip
    """Start the child (sandbox.run_child's steps, with ncu's folder first on PATH and the report reader
    on PYTHONPATH); wait at most timeout_s for it and the ncu runs it starts; collect its report."""
    s, c = job.settings, job.candidate
    cache_dir = Path(s.cache_dir) if s.cache_dir else runner.DEFAULT_CACHE_DIR
    child_job = sandbox.prepare_job(root, f"ncu-{c.short_hash}", True, c.path, cache_dir / "triton" / c.content_hash,
                                    {})  # fmt: skip
    module_file = importlib.util.find_spec(CHILD_MODULE).origin
    _shell_safe(sys.executable, module_file, child_job.request_path, child_job.scratch)
    request = {
        "task": job.task.name, "shapes": [x.label for x in job.shapes], "seed": s.seed, "warmup": s.kernel_warmup,
        "metrics": metrics, "scratch": str(child_job.scratch), "report_path": str(child_job.report_path),
        "candidate": {"copy": str(child_job.candidate_copy), "hash": c.content_hash},
    }  # fmt: skip
    env = sandbox.child_env(child_job, "cuda", os.cpu_count() or 1)
    env["PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(job.ncu)), env["PATH"]])
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *import_paths])
    env["PYTHONSAFEPATH"] = "1"  # the re-run is `python <file> <request>`: no script folder on sys.path
    request["env_names"] = sorted(env)  # what the re-run finds beyond these, ncu put there
    child_job.request_path.write_text(json.dumps(request, indent=1))
    child_job.report_path.touch(mode=0o644)
    cmd = [sys.executable, "-P", "-s", "-B", "-m", CHILD_MODULE, str(child_job.request_path)]
    start = time.monotonic()
    with open(child_job.log_path, "wb") as log:
        proc = sandbox.start_session(cmd, cwd=child_job.scratch, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=s.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            sandbox.end_session(proc)  # the child, ncu, the re-run and any compiler they started
    events, malformed = [], 0
    for line in child_job.report_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a kill
            malformed += 1
    tail = child_job.log_path.read_text(errors="replace")[-sandbox.LOG_TAIL_CHARS :]
    run = sandbox.ChildRun(None if timed_out else proc.returncode, timed_out, time.monotonic() - start, events, tail,
                           malformed)  # fmt: skip
    sandbox.persist_triton_cache(child_job, cache_dir / "triton" / c.content_hash, autotuning=True)  # alone on its GPU
    return run, child_job


def _check_child(run: sandbox.ChildRun) -> None:
    """Raise HarnessError when the child failed outside the candidate (and outside ncu's re-runs)."""
    if not any(e["event"] == "isolation" for e in run.events) or any(e["event"] == "child_error" for e in run.events):
        raise runner.HarnessError(f"the profiled child failed outside the candidate (exit {run.returncode}); "
                                  f"its log ends:\n{run.log_tail}")  # fmt: skip


def _keep_report(event: dict, scratch: Path, dest: Path) -> Path | None:
    """Copy a shape's raw report (a path the child named, inside its scratch) to `dest`."""
    named = event.get("report")
    if not named:
        return None
    path = Path(os.path.realpath(named))
    if not (path.is_relative_to(os.path.realpath(scratch)) and path.is_file()):
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, dest)
    return dest


def nsight_options() -> str:
    try:
        version = importlib.metadata.version("nsight-python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"nsight-python {version}: " + " ".join(f"{k}={v}" for k, v in NSIGHT_OPTIONS.items())


def execute(job: KernelJob) -> int:
    s, task, c = job.settings, job.task, job.candidate
    if job.skip_reason is not None:
        print(f"kernel profile of {task.name}/{c.name} skipped: {job.skip_reason}. Nothing was written.")
        return 0
    try:
        import_paths = child_import_paths(job.ncu)
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
    kept: dict[str, Path] = {}
    try:
        run, child_job = _run_child(job, metrics, root, import_paths)
        _check_child(run)
        profiled = {e["shape"]: e for e in run.events if e["event"] == "profiled"}
        for i, label in enumerate(labels):
            if label in profiled:
                dest = results / REPORTS_DIR / f"{run_id}-{c.name}-shape{i}.ncu-rep"
                if _keep_report(profiled[label], child_job.scratch, dest) is not None:
                    kept[label] = dest
    finally:
        if not s.keep_scratch:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"job directory kept: {root}")
    compiled = next((e["kernels"] for e in run.events if e["event"] == "compiled"), [])
    isolation = next(e["layers"] for e in run.events if e["event"] == "isolation")
    statuses = shape_statuses(run, labels, s.timeout_s)
    env = environment.capture().to_dict()
    options = nsight_options()
    made = []
    for shape in job.shapes:
        status, detail = statuses[shape.label]
        call = profiled.get(shape.label, {})
        kernels = call.get("kernels", []) if status == "profiled" else []
        if status == "profiled" and not (kernels and call["values"]["duration_ns"]):
            status, detail = "no_kernels", "the profiled call launched no kernel that ncu saw"
        figures = shape_figures(kernels, call["values"], compiled, task, shape, copy_gbps,
                                gemm_tflops) if status == "profiled" else {}  # fmt: skip
        report = kept.get(shape.label)
        made.append(KernelProfileRecord(
            run_id=run_id, task=task.name, candidate=c.name, candidate_hash=c.content_hash,
            candidate_path=c.display_path, shape_label=shape.label, shape=dict(shape.params), status=status,
            detail=detail, kernels=kernels if status == "profiled" else [], **figures, copy_gbps=copy_gbps,
            gemm_tflops=gemm_tflops, compiled=compiled, ncu_version=ncu_version, metrics_missing=unknown_metrics,
            ncu_report=str(report.relative_to(results.parent)) if report else None, ncu_options=options,
            seed=s.seed, warmup_calls=s.kernel_warmup, isolation=isolation, environment=env, command=s.command(),
        ))  # fmt: skip
    for r in made:
        records.append(results / PROFILES_FILE, r)
    print(kernel_profile_section([r.to_dict() for r in made]))
    for r in made:
        if r.status == "profiler_error":
            print(f"profiler error on {r.shape_label}:\n{r.detail}")
    where = f"; raw reports: {results / REPORTS_DIR}/{run_id}-* (open with ncu-ui)" if kept else ""
    print(f"records: {results / PROFILES_FILE}{where}")
    return 0 if any(r.status == "profiled" for r in made) else 1
