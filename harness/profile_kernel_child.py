"""The child of a kernel profile: `python -P -s -B -m harness.profile_kernel_child <job>/request.json`.

Started by harness/profile_kernel.py; it profiles through nsight-python 0.9.6 (`nsight.analyze.kernel`),
which makes the child run twice per shape:
  the first run   for each shape: draws the task's inputs and calls the candidate `warmup` times
                  (Triton compiles and autotunes there, unprofiled; a failing candidate is reported
                  here, cheaply), then calls the decorated function `profiled` with configs=[label].
                  There nsight-python starts `ncu ... <this python> <this file> <request>` (through
                  /bin/sh, `ncu` from PATH: the parent puts its ncu's folder first), waits for it,
                  reads the report (through NVIDIA's ncu_report) and returns ProfileResults, whose
                  DataFrame becomes the shape's "profiled" event. The next shape runs the same way.
  the re-run      under ncu, with NSPY_NCU_PROFILE set (by nsight-python) and BEAM_PROFILE_SHAPE (set
                  here before the call, inherited). It enters the same sandbox, draws and warms up
                  that one shape only, and calls `profiled` again: this time nsight-python runs its
                  body, the candidate once inside `nsight.annotate(label)` (the only NVTX range ncu
                  profiles), then exits the process itself (os._exit(0)). The re-run reports only
                  `rerun_*` events, so no event of the first run is duplicated.
Each shape's ncu writes <scratch>/nsight/shape<i>-ncu-output-profiled-0.ncu-rep and .log (nsight-python's
`output_prefix`); the parent keeps the report. Everything written goes to the parent's report file
as JSON lines, and nothing else: the parent writes the records.

Isolation: as harness/child.py (minimal environment, scratch directory as the only writable place,
the audit hook that blocks and records writes elsewhere, sockets, processes and secret reads), but
without the two OS layers that Nsight Compute's injected library cannot live with: the network
namespace (the injected library talks to the ncu front end over local sockets) and the drop to an
unprivileged user (GPU performance counters are restricted to administrators by default,
ERR_NVGPUCTRPERM). The audit hook lets nsight-python start exactly its two ncu commands, from the
thread that calls `profiled`, and nothing else. Which layers were active is recorded with every profile.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import child, sandbox
from harness.profile_kernel_records import NSIGHT_OPTIONS, call_figures, combine_kernels

RERUN_ENV = "NSPY_NCU_PROFILE"  # nsight-python sets it in the environment of the process it runs under ncu
SHAPE_ENV = "BEAM_PROFILE_SHAPE"  # the shape the re-run is for: set before each profiled call, inherited
REPORT_DIR = "nsight"  # in scratch: nsight-python's output_prefix folder
UNDER_NCU = {
    "network_namespace": "off under ncu: the injected profiler library reports to ncu over local sockets",
    "uid_drop": "off under ncu: GPU performance counters are restricted to administrators by default",
}


def enter(scratch: Path) -> dict[str, str]:
    """The OS layers that work under ncu, applied as the child's first act."""
    layers = {"minimal_env": "active", "scratch_cwd": "active", **UNDER_NCU}
    os.chdir(scratch)
    os.umask(0o077)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(sandbox.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        layers["no_new_privs"] = "active"
    else:
        layers["no_new_privs"] = f"unavailable: {os.strerror(ctypes.get_errno())}"
    return layers


def is_ncu_command(args: tuple) -> bool:
    """Whether a subprocess.Popen audit event is one of nsight-python's two: `ncu --version`, and
    `/bin/sh -c "ncu ..."` (collection/ncu.py launch_ncu)."""
    argv = [os.fsdecode(a) for a in args[1]] if isinstance(args[1], list | tuple) else []
    return argv == ["ncu", "--version"] or (len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]
                                             and argv[2].startswith("ncu "))  # fmt: skip


@dataclass
class ProfileMonitor(sandbox.Monitor):
    """The audit hook, plus a permit for nsight-python's ncu commands: only on the thread holding it."""

    _permit: threading.local = field(default_factory=threading.local)

    @contextlib.contextmanager
    def ncu_permit(self):
        self._permit.active = True
        try:
            yield
        finally:
            self._permit.active = False

    def _check(self, event: str, args: tuple) -> None:
        if event == "subprocess.Popen" and getattr(self._permit, "active", False) and is_ncu_command(args):
            return
        super()._check(event, args)


def injected_by_ncu(request: dict[str, Any]) -> frozenset[str]:
    """The variables of the re-run's environment that the parent did not set: ncu's (and nsight-python's)
    own, such as NV_TPS_LAUNCH_TOKEN, which any copy of os.environ reads (seen on the H200, where it was
    recorded as a secret read). They are not the parent's secrets: the parent's never reach the child."""
    return frozenset(os.environ) - set(request["env_names"])


def triton_kernels(module: Any) -> list[dict[str, Any]]:
    """Registers and spills of the Triton kernels the module compiled (child.compiled_kernels), from each
    CompiledKernel (ptxas's own counts), under the module global that leads to it."""
    found = []
    for attr, _, compiled in child.compiled_kernels(module):
        md = compiled.metadata
        found.append({
            "function": attr, "name": getattr(compiled, "name", None) or getattr(md, "name", attr),
            "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
            "num_warps": getattr(md, "num_warps", None), "num_stages": getattr(md, "num_stages", None),
            "shared_bytes": getattr(md, "shared", None),
        })  # fmt: skip
    return found


def report_prefix(scratch: str, index: int) -> str:
    """nsight-python's output_prefix for the shape at `index`: its files are <prefix>ncu-output-profiled-0.*"""
    return os.path.join(scratch, REPORT_DIR, f"shape{index}-")


def profiler(nsight, metrics: list[str], prefix: str, call):
    """The nsight-python-decorated function of one shape: `profiled(label)` runs `call()` (the candidate
    once) inside `nsight.annotate(label)`. Its body runs only in the re-run under ncu."""

    @nsight.analyze.kernel(metrics=metrics, combine_kernel_metrics=combine_kernels(metrics), output_prefix=prefix,
                           **NSIGHT_OPTIONS)  # fmt: skip
    def profiled(shape):
        with nsight.annotate(shape):
            call()

    return profiled


def profile_shape(nsight, monitor: ProfileMonitor, label: str, prefix: str, metrics: list[str]) -> dict[str, Any]:
    """First run: profile one shape through nsight-python (ncu re-runs this child for it); the fields of
    its "profiled" event. Raises what ncu or nsight-python raised."""
    os.environ[SHAPE_ENV] = label
    with monitor.ncu_permit():
        results = profiler(nsight, metrics, prefix, call=None)(configs=[label])
    kernels, values = call_figures(results.to_dataframe())
    report = f"{prefix}ncu-output-profiled-0.ncu-rep"
    return {"kernels": kernels, "values": values, "report": report if os.path.isfile(report) else None}


def warm_up(torch, task, launcher, label: str, request: dict[str, Any]) -> dict[str, Any]:
    inputs = task.make_inputs(task.shape(label, torch.device("cuda")), request["seed"], torch.device("cuda"))
    for _ in range(request["warmup"]):
        launcher(**inputs)
    torch.cuda.synchronize()
    return inputs


def _failure(e: BaseException) -> dict[str, Any]:
    return {"status": child._classify(e), "message": child.error_text(e),
            "traceback": traceback.format_exc()[-6000:]}  # fmt: skip


def profile_shapes(torch, nsight, request: dict[str, Any], task, launcher, monitor, report: child.Reporter) -> None:
    """The first run: warm up and profile the shapes one by one; a failing shape is data, the next one runs."""
    for index, label in enumerate(request["shapes"]):
        report.emit("shape_start", shape=label)
        try:
            inputs = warm_up(torch, task, launcher, label, request)
        except BaseException as e:  # the candidate's failure is data: reported, the next shape runs
            failure = _failure(e)
            report.emit("call_error", shape=label, **failure)
            if failure["status"] == "cuda_fault":
                return  # the context is dead
            continue
        del inputs
        torch.cuda.empty_cache()  # the re-run under ncu needs the memory
        try:
            figures = profile_shape(nsight, monitor, label, report_prefix(request["scratch"], index),
                                    request["metrics"])  # fmt: skip
        except Exception as e:  # ncu or nsight-python failed (the re-run says whether the candidate did)
            report.emit("profile_error", shape=label, message=f"{type(e).__name__}: {e}"[:4000])
            continue
        report.emit("profiled", shape=label, **figures)


def rerun_shape(torch, nsight, request: dict[str, Any], task, launcher, monitor, report: child.Reporter) -> None:
    """The re-run under ncu: one shape, warmed up, then profiled by nsight-python, which exits the process."""
    label = os.environ[SHAPE_ENV]
    index = request["shapes"].index(label)
    try:
        inputs = warm_up(torch, task, launcher, label, request)

        def call():
            launcher(**inputs)
            torch.cuda.synchronize()
            report.emit("rerun_done", shape=label, violations=list(monitor.violations))

        profiler(nsight, request["metrics"], report_prefix(request["scratch"], index), call)(configs=[label])
    except BaseException as e:  # the candidate's failure under ncu
        report.emit("rerun_error", shape=label, **_failure(e), violations=list(monitor.violations))
        return
    report.emit("rerun_error", shape=label, status="profiler_error",
                message="nsight-python did not profile this shape in its re-run (call signature differs)")  # fmt: skip


def run(request: dict[str, Any], report: child.Reporter, layers: dict[str, str], rerun: bool) -> None:
    import nsight  # before the audit hook: matplotlib, nvtx and the report reader load here
    import torch

    from tasks import get_task

    task = get_task(request["task"])
    torch.empty(1, device="cuda")  # the CUDA context exists before the candidate arrives
    if not rerun and shutil.which("ncu") is None:
        raise RuntimeError(f"ncu is not on the child's PATH ({os.environ.get('PATH')})")
    monitor = ProfileMonitor(writable=(os.path.realpath(request["scratch"]),),
                             library_roots=child.library_roots_of(torch),
                             harmless_env=injected_by_ncu(request) if rerun else frozenset())  # fmt: skip
    monitor.install()
    layers.update(audit_hook="active", secret_env="active")
    if not rerun:
        report.emit("isolation", layers=layers)
    candidate = request["candidate"]
    try:
        launcher = child.import_candidate(candidate["copy"], candidate["hash"], task.op_name)
    except BaseException as e:  # the candidate's failure is data
        status = "compile_error" if child._classify(e) == "compile_error" else "import_error"
        if not rerun:
            report.emit("import_error", status=status, message=f"{type(e).__name__}: {e}"[:2000],
                        traceback=traceback.format_exc()[-6000:], violations=list(monitor.violations))  # fmt: skip
            return
        raise
    if rerun:
        rerun_shape(torch, nsight, request, task, launcher, monitor, report)
        return
    profile_shapes(torch, nsight, request, task, launcher, monitor, report)
    module = sys.modules.get(getattr(launcher, "__module__", ""), None)
    try:
        compiled = triton_kernels(module) if module is not None else []
        report.emit("compiled", kernels=compiled)
    except (AttributeError, TypeError, IndexError, KeyError) as e:  # another Triton's cache layout: say so
        report.emit("compiled", kernels=[], note=f"Triton metadata unreadable: {type(e).__name__}: {e}"[:500])
    report.emit("done", violations=list(monitor.violations))


def main(argv: list[str]) -> None:
    request = json.loads(Path(argv[1]).read_text())
    report = child.Reporter(request["report_path"])
    rerun = RERUN_ENV in os.environ and SHAPE_ENV in os.environ
    code = 3 if rerun else 0  # a re-run that returns has failed: nsight-python exits a successful one itself
    try:
        run(request, report, enter(Path(request["scratch"])), rerun)
    except BaseException as e:  # reported; the parent decides whose failure it was
        failure = {"message": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-6000:]}
        if rerun:  # outside the candidate's calls: the profiler's (the first run got past this point)
            report.emit("rerun_error", shape=os.environ[SHAPE_ENV], status="profiler_error", **failure)
        else:
            report.emit("child_error", **failure)
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing a candidate registered at exit runs after the report (nsight-python exits alike)


if __name__ == "__main__":
    main(sys.argv)
