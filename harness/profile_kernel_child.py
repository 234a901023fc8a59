"""The child of a kernel profile: `ncu ... python -P -m harness.profile_kernel_child <job>/request.json`.

Started by harness/profile_kernel.py under Nsight Compute, which replays every kernel launched
between cudaProfilerStart and cudaProfilerStop (`--profile-from-start off`). For each shape this
child draws the task's inputs, calls the candidate `warmup` times (Triton compiles and autotunes
there, unprofiled), then makes ONE profiled call inside the NVTX range "<prefix><shape label>", by
which the parent assigns each profiled kernel to its shape. It reports JSON lines to a file the
parent owns and writes nothing else: the parent reads the ncu report and writes the records.

Isolation: as harness/child.py (minimal environment, scratch directory as the only writable place,
the audit hook that blocks and records writes elsewhere, sockets, processes and secret reads), but
without the two OS layers that Nsight Compute's injected library cannot live with: the network
namespace (the injected library talks to the ncu front end over local sockets) and the drop to an
unprivileged user (GPU performance counters are restricted to administrators by default,
ERR_NVGPUCTRPERM). Which layers were active is recorded with every profile.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

from harness import child, sandbox

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


def triton_kernels(module: Any) -> list[dict[str, Any]]:
    """Registers and spills of the Triton kernels the module compiled, from each CompiledKernel (ptxas's
    own counts). Reads Triton's JIT caches (triton 3.6: JITFunction.device_caches[device][0])."""
    found = []
    for attr, obj in vars(module).items():
        fn, hops = obj, 0
        while fn is not None and not hasattr(fn, "device_caches") and hops < 4:  # Autotuner/Heuristics wrap .fn
            fn, hops = getattr(fn, "fn", None), hops + 1
        if fn is None or not hasattr(fn, "device_caches"):
            continue
        for device_cache in list(fn.device_caches.values()):
            for compiled in list(device_cache[0].values()):
                md = compiled.metadata
                found.append({
                    "function": attr, "name": getattr(compiled, "name", None) or getattr(md, "name", attr),
                    "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
                    "num_warps": getattr(md, "num_warps", None), "num_stages": getattr(md, "num_stages", None),
                    "shared_bytes": getattr(md, "shared", None),
                })  # fmt: skip
    return found


def profile_shapes(torch, request: dict[str, Any], task, launcher, report: child.Reporter) -> None:
    device = torch.device("cuda")
    prefix, warmup = request["range_prefix"], request["warmup"]
    for label in request["shapes"]:
        report.emit("shape_start", shape=label)
        inputs = task.make_inputs(task.shape(label, device), request["seed"], device)
        try:
            for _ in range(warmup):
                launcher(**inputs)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(prefix + label)
            torch.cuda.profiler.start()
            try:
                launcher(**inputs)
                torch.cuda.synchronize()
            finally:
                torch.cuda.profiler.stop()
                torch.cuda.nvtx.range_pop()
        except BaseException as e:  # the candidate's failure is data: reported, the next shape runs
            status = child._classify(e)
            report.emit("call_error", shape=label, status=status, message=f"{type(e).__name__}: {e}"[:2000],
                        traceback=traceback.format_exc()[-6000:])  # fmt: skip
            if status == "cuda_fault":
                return  # the context is dead
            continue
        report.emit("profiled", shape=label)
        del inputs
        torch.cuda.empty_cache()


def run(request: dict[str, Any], report: child.Reporter, layers: dict[str, str]) -> None:
    import torch

    from tasks import get_task

    task = get_task(request["task"])
    torch.empty(1, device="cuda")  # the CUDA context exists before the candidate arrives
    monitor = sandbox.Monitor(writable=(os.path.realpath(request["scratch"]),),
                              library_roots=child._library_roots(torch))  # fmt: skip
    monitor.install()
    layers.update(audit_hook="active", secret_env="active")
    report.emit("isolation", layers=layers)
    candidate = request["candidate"]
    try:
        launcher = child._import_candidate(candidate["copy"], candidate["hash"], task.op_name)
    except BaseException as e:  # the candidate's failure is data
        status = "compile_error" if child._classify(e) == "compile_error" else "import_error"
        report.emit("import_error", status=status, message=f"{type(e).__name__}: {e}"[:2000],
                    traceback=traceback.format_exc()[-6000:], violations=list(monitor.violations))  # fmt: skip
        return
    profile_shapes(torch, request, task, launcher, report)
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
    code = 0
    try:
        run(request, report, enter(Path(request["scratch"])))
    except BaseException as e:  # reported; the parent decides whose failure it was
        report.emit("child_error", message=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-6000:])
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing a candidate registered at exit runs after the report (nsight-python exits alike)


if __name__ == "__main__":
    main(sys.argv)
