"""Isolation of untrusted candidate code: both sides of the child process boundary.

Parent side (`prepare_job`, `run_child`): a job directory per child, owned by the parent, holding
the request, the child's report and log, and a copy of the candidate file (the child imports
exactly the bytes that were hashed); inside it a scratch directory, the only place the child may
write. The child gets a minimal environment (no API keys or tokens of the parent: an allowlist,
never a blocklist), runs in its own session, and is killed with its process group at the deadline.
A CPU child is forked by the fork server (harness/forkserver.py), whose own environment is that
allowlist too; any other child is exec'd.

Child side (`enter`, `Monitor`), before the candidate is imported:
  network_namespace  unshare(CLONE_NEWNET): no interface but a downed loopback (root only)
  uid_drop           setuid/setgid to `nobody`: the repository and results are not writable
                     (root only, and only when `nobody` can read the Python installation)
  no_new_privs       prctl(PR_SET_NO_NEW_PRIVS): setuid binaries cannot regain privileges
  audit_hook         sys.addaudithook (cannot be removed): records and BLOCKS writes outside the
                     scratch directory, reads of secret-looking paths, sockets, processes other than
                     the compilers Triton runs, signals to other processes
  secret_env         os.environ records reads of secret-looking variable names (none are present)
  minimal_env, scratch_cwd   always active
Which layers were active is recorded with every result; detection works without the OS layers.
A determined attacker with ctypes can step around an audit hook: the OS layers are the boundary,
the hook is the witness (and the barrier where the OS layers are unavailable).
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import forkserver
from harness.environment import REPO_ROOT

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
SANDBOX_USER = "nobody"

# Variables the child inherits when the parent has them: toolchain locations, never credentials.
PASSTHROUGH_ENV = (
    "PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH", "CC", "LANG", "LC_ALL", "TZ",
)  # fmt: skip
# Executables the child may start: what Triton and Inductor run to compile kernels.
ALLOWED_EXECUTABLES = frozenset(
    {"ptxas", "ptxas-blackwell", "cuobjdump", "nvdisasm", "nvlink", "fatbinary", "nvcc", "ldconfig",
     "ldconfig.real", "gcc", "cc", "clang", "g++", "c++", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc", "ninja",
     "file", "uname"}  # read-only probes: platform.architecture() runs `file` on the interpreter
)  # fmt: skip
SECRET_ENV_WORDS = frozenset(
    {"KEY", "KEYS", "APIKEY", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL",
     "CREDENTIALS", "AUTH", "COOKIE", "PRIVATE"}
)  # fmt: skip
SECRET_ENV_PREFIXES = ("ANTHROPIC", "OPENAI", "AWS", "GITHUB", "GH", "HF", "HUGGING", "AZURE", "GOOGLE", "GCP", "SSH")
SECRET_PATH = re.compile(
    r"(/\.ssh(/|$)|/\.netrc$|/\.aws/|/\.config/(gcloud|gh)/|/\.docker/config\.json$|/\.git-credentials$"
    r"|/\.pypirc$|/\.anthropic|/etc/shadow$|/etc/gshadow$|/proc/[^/]+/environ$|/\.env$|\.pem$|\.key$"
    r"|/id_(rsa|ecdsa|ed25519)|(^|[/._-])(secrets?|tokens?|credentials?|api[_-]?keys?)([/._-]|$))",
    re.IGNORECASE,
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_WRITE_EVENTS = {  # event -> indices of the path arguments it writes
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (1,),
    "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,),
    "os.chflags": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}  # fmt: skip
_NETWORK_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
     "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
)  # fmt: skip
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "pty.spawn", "os.startfile"})  # fmt: skip
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg"})
MAX_VIOLATIONS = 50


# ---- parent side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One child's directories. Everything outside `scratch` belongs to the parent."""

    name: str
    job_dir: Path
    scratch: Path
    request_path: Path
    report_path: Path
    log_path: Path
    triton_cache: Path  # inside scratch: the child writes compiled kernels here
    cache_env: dict[str, str]  # env var -> cache dir: copies in scratch (isolated) or shared (trusted)
    candidate_copy: Path | None
    isolated: bool = True  # False: a trusted child (no candidate code)


def drop_target() -> tuple[int, int] | str:
    """(uid, gid) of the sandbox user when the child can drop to it, else why it cannot."""
    if os.geteuid() != 0:
        return "unavailable: not running as root"
    try:
        pw = pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        return f"unavailable: no user {SANDBOX_USER!r}"
    import torch  # the child needs torch's files: they must be readable by the sandbox user too

    for needed in (REPO_ROOT, Path(sysconfig.get_paths()["stdlib"]), Path(torch.__file__).parent,
                   Path(os.path.realpath(sys.executable))):  # fmt: skip
        blocked = _first_unreadable(needed)
        if blocked is not None:
            return f"unavailable: {blocked} is not readable by {SANDBOX_USER!r} (needed: {needed})"
    for device in sorted(Path("/dev").glob("nvidia*")):  # the GPU must stay usable after the drop
        if stat.S_ISCHR(device.stat().st_mode) and device.stat().st_mode & 0o006 != 0o006:
            return f"unavailable: {device} is not readable and writable by others (mode {device.stat().st_mode:o})"
    return pw.pw_uid, pw.pw_gid


def _first_unreadable(path: Path) -> Path | None:
    """The first directory on the way to `path` that others cannot traverse (or read, at the end)."""
    path = Path(os.path.realpath(path))
    for p in [*reversed(path.parents), path]:
        mode = p.stat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return p
    return None if path.stat().st_mode & stat.S_IROTH else path


# Caches an isolated child gets empty rather than copied: Inductor's cached graphs name files by the
# absolute path they were compiled under (its autotuner's .best_config beside each kernel), so a copy
# sends the child back to the shared directory, which it may not write (seen on the H200: every
# candidate's torch.compile peer failed with PermissionError). Its Triton kernels still come from
# the candidate's own Triton cache on a second run.
STARTS_EMPTY_IN_ISOLATION = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
AUTOTUNE_FILES = "*.autotune.json"  # Triton's cached autotuning choices (Autotuner.check_disk_cache)


def prepare_job(
    root: Path,
    name: str,
    isolate: bool,
    candidate_path: Path | None,
    triton_cache: Path,
    shared_caches: dict[str, Path],
) -> Job:
    """Create the job directory. The child compiles into a copy of `triton_cache` (copied back by
    `persist_triton_cache`: a candidate can poison only its own cache). `shared_caches` (env var ->
    dir: Inductor, flashinfer) are used in place by trusted children and copied for isolated ones."""
    job_dir = root / name
    scratch = job_dir / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    os.chmod(job_dir, 0o711)
    copy = None
    if candidate_path is not None:
        copy = job_dir / "candidate.py"
        shutil.copyfile(candidate_path, copy)
        os.chmod(copy, 0o644)
    child_triton = scratch / "triton-cache"
    copy_triton_cache(triton_cache, child_triton)
    cache_env = {}
    for var, shared in shared_caches.items():
        if isolate:
            target = scratch / f"cache-{var.lower()}"
            if var not in STARTS_EMPTY_IN_ISOLATION:
                _copy_dir(shared, target)
        else:
            shared.mkdir(parents=True, exist_ok=True)
            target = shared
        cache_env[var] = str(target)
    return Job(name, job_dir, scratch, job_dir / "request.json", job_dir / "report.jsonl", job_dir / "child.log",
               child_triton, cache_env, copy, isolate)  # fmt: skip


def _copy_dir(src: Path, dst: Path, leave_out: tuple[str, ...] = ()) -> None:
    """Copy `src` into `dst` (merging; lock files and the `leave_out` patterns left out), or make `dst`."""
    if src.is_dir():
        ignore = shutil.ignore_patterns("*.lock", *leave_out)
        shutil.copytree(src, dst, symlinks=False, ignore=ignore, dirs_exist_ok=True)
    else:
        dst.mkdir(parents=True, exist_ok=True)


def copy_triton_cache(src: Path, dst: Path, autotuning: bool = True) -> None:
    """Copy a Triton cache and point its group files at the copy. A group file (`__grp__*.json`)
    lists its kernel's files by absolute path: left as they are, a copy would read the files of the
    child that compiled them (another job's scratch, outside the sandbox; seen on the H200 as a
    secret_read of a kernel named `_qk_token_kernel`), or miss them once that job is gone.
    `autotuning=False` leaves out the autotuners' cached choices (`*.autotune.json`)."""
    _copy_dir(src, dst, () if autotuning else (AUTOTUNE_FILES,))
    for group in dst.glob("*/__grp__*.json"):
        try:
            data = json.loads(group.read_text())
            paths = data["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a group file Triton wrote: Triton ignores it too
        data["child_paths"] = {name: str(group.parent / Path(path).name) for name, path in paths.items()}
        group.write_text(json.dumps(data))


# In a benchmark child's scratch: the Triton cache its torch.compile peers compile into (harness/child.py).
PEER_TRITON_CACHE = "triton-cache-peers"


def seed_peer_triton_cache(job: Job, trusted_cache: Path) -> None:
    """Start a benchmark child's peer cache as a copy of `trusted_cache`, the Triton cache of the
    task's baselines child, which compiled the same torch.compile graphs and is written by trusted
    code only: the peers' kernels load instead of compiling again, also when the baselines child's
    compile artifacts (harness/runner.py PEER_ARTIFACTS, which bring the lowered graphs too) cannot
    be used. The copy is the child's to spoil: it is never copied back."""
    copy_triton_cache(trusted_cache, job.scratch / PEER_TRITON_CACHE)


def _parent_pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


# One entry of CUDA_VISIBLE_DEVICES: an index, or a GPU / MIG UUID as nvidia-smi -L prints it.
CUDA_DEVICE_TOKEN = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")


def cuda_devices_problem(value: str) -> str | None:
    """Why `value` is not a CUDA_VISIBLE_DEVICES list (comma-separated entries, each distinct), or None."""
    tokens = [t.strip() for t in value.split(",")] if isinstance(value, str) else []
    bad = [t for t in tokens if not CUDA_DEVICE_TOKEN.fullmatch(t)]
    if not tokens or bad:
        return (f"expected comma-separated GPU indices (e.g. '0,1') or GPU-/MIG- UUIDs; got {value!r}"
                + (f" (not a GPU: {bad})" if bad and isinstance(value, str) else ""))  # fmt: skip
    if len(set(tokens)) != len(tokens):
        return f"GPUs must be distinct; got {value!r}"
    return None


def server_env() -> dict[str, str]:
    """What every child's environment starts from, and the fork server's whole environment: the allowlisted
    variables the parent has, and Python's own (harness/forkserver.py)."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        # The repo first, then the parent's own extra import paths (where wheels were unpacked on
        # an offline GPU machine, say): paths are not credentials.
        PYTHONPATH=os.pathsep.join(dict.fromkeys([str(REPO_ROOT), *_parent_pythonpath()])),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
    )
    return env


def child_env(job: Job, device: str, threads: int, cuda_devices: str | None = None,
              interpret: bool | None = None) -> dict[str, str]:  # fmt: skip
    """The child's whole environment. `cuda_devices`: its CUDA_VISIBLE_DEVICES (None: the parent's);
    `interpret`: Triton's interpreter (None: on the CPU)."""
    env = server_env()
    if cuda_devices is not None:
        problem = cuda_devices_problem(cuda_devices)
        if problem:
            raise ValueError(f"cuda_devices: {problem}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(t.strip() for t in cuda_devices.split(","))
    env.update(
        HOME=str(job.scratch),
        TMPDIR=str(job.scratch / "tmp"),
        XDG_CACHE_HOME=str(job.scratch / ".cache"),
        TRITON_CACHE_DIR=str(job.triton_cache),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )
    if job.isolated:
        # Compile in-process: no worker processes outside the audit hook. The trusted child (no
        # candidate code) keeps inductor's parallel compile workers: it compiles every shape cold.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env.update(job.cache_env)
    if device == "cpu" if interpret is None else interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


@dataclass(frozen=True)
class ChildRun:
    """What came back from one child: its exit, its report lines, the tail of its log."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    events: list[dict[str, Any]]
    log_tail: str
    malformed_report_lines: int = 0

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


LOG_TAIL_CHARS = 4000


def run_child(job: Job, request: dict[str, Any], timeout_s: float, device: str, threads: int,
              cuda_devices: str | None = None, module: str = "harness.child",
              interpret: bool | None = None) -> ChildRun:  # fmt: skip
    """Start `python -m <module>` (harness.child) on `request`; wait at most `timeout_s`; collect its report.
    A CPU child is forked by the fork server, with torch imported already (harness/forkserver.py)."""
    job.request_path.write_text(json.dumps(request, indent=1))
    os.chmod(job.request_path, 0o644)
    job.report_path.touch(mode=0o644)
    drop = request.get("drop")
    if drop:
        uid, gid = drop
        for p in [job.scratch, *job.scratch.rglob("*")]:
            os.lchown(p, uid, gid)
    cmd = [sys.executable, "-P", "-s", "-B", "-m", module, str(job.request_path)]
    env = child_env(job, device, threads, cuda_devices, interpret)
    start = time.monotonic()
    with open(job.log_path, "wb") as log:
        proc = None
        if device == "cpu" and forkserver.enabled():
            try:
                proc = start_forked_session(module, [str(job.request_path)], job.scratch, env, job.log_path, threads)
            except forkserver.ServerLost as e:
                log.write(f"harness: {e}: this child was started by exec\n".encode())
                log.flush()
        if proc is None:
            proc = start_session(cmd, cwd=job.scratch, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            end_session(proc)
    if isinstance(proc, forkserver.ForkedChild) and proc.lost:
        with open(job.log_path, "ab") as log:  # after the child's own lines (the handle above is at its start)
            log.write(b"harness: the fork server ended while this child ran; the harness killed the child\n")
    wall = time.monotonic() - start
    events, malformed = [], 0
    for line in job.report_path.read_text(errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            malformed += 1
            continue
        if isinstance(obj, dict):
            events.append(obj)
    log_text = job.log_path.read_text(errors="replace")
    return ChildRun(None if timed_out else proc.returncode, timed_out, wall, events, log_text[-LOG_TAIL_CHARS:],
                    malformed)  # fmt: skip


# ---- the sessions this process started: killed with it ----------------------------------------------------
class Stopping(BaseException):
    """Raised where a new child would start after the harness was told to stop (a BaseException, as
    SystemExit: no `except Exception` that records a candidate's failure takes it for one)."""


Session = subprocess.Popen | forkserver.ForkedChild
_live_sessions: set[Session] = set()  # started by start_session or start_forked_session, not yet ended
_stopping = threading.Event()


def start_session(cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """`cmd` in a session of its own (it may start compilers, ncu, ...), known to `stop_on_signal` until
    `end_session`. Refused once the harness is stopping."""
    if _stopping.is_set():
        raise Stopping(f"the harness is stopping: {cmd[0]} was not started")
    return _live(subprocess.Popen(cmd, start_new_session=True, **popen_kwargs))


def start_forked_session(module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path,
                         threads: int) -> forkserver.ForkedChild:  # fmt: skip
    """`python -m module *args` forked by the fork server (a session of its own too), as start_session."""
    if _stopping.is_set():
        raise Stopping(f"the harness is stopping: {module} was not started")
    server = forkserver.server_for(server_env())
    return _live(server.start(module, args, cwd, env, log, threads))


def _live(proc: Session) -> Session:
    _live_sessions.add(proc)
    if _stopping.is_set():  # the signal came while it started
        signal_session(proc, signal.SIGKILL)
    return proc


def signal_session(proc: Session, sig: int) -> None:
    """`sig` to every process of `proc`'s session (gone already, or no longer ours: nothing to do). A
    forked child that has not yet made its session (the instant after the fork) gets it alone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        if isinstance(proc, forkserver.ForkedChild) and proc.returncode is None:
            try:
                os.kill(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def end_session(proc: Session) -> None:
    """Kill whatever is left of `proc`'s session, reap `proc`, forget it."""
    signal_session(proc, signal.SIGKILL)
    proc.wait()
    _live_sessions.discard(proc)


def stop_on_signal(signum: int, frame: Any) -> None:
    """The harness commands' SIGTERM and SIGINT handler (harness/cli.py): kill every child session now,
    refuse new ones, and exit 128 + signum. A worker thread waiting on a child (parity children run side
    by side) would otherwise let it run to its own limit, on the GPU the next job uses, after a CI runner's
    time limit or a Ctrl-C had ended the command. A signal that the main thread takes in the instant between
    starting a child itself and registering it leaves that one child running."""
    _stopping.set()
    for proc in list(_live_sessions):
        signal_session(proc, signal.SIGKILL)
    raise SystemExit(128 + signum)


def persist_triton_cache(job: Job, dest: Path, autotuning: bool) -> None:
    """Copy the child's Triton cache back to the candidate's own persistent cache. `autotuning`: keep
    the configs its autotuners chose (Triton's cache_results). Only a child that had the GPU to itself
    should keep them: GPU parity children run two at a time, and a choice timed beside another
    child's kernels can be several times off (seen on the H200: 13.3 us at T=1 for a fuse_norm kernel
    that ran 3.9 us at T=3, 12 us at T=8 for a moe_route kernel that ran 3.6 us at T=64)."""
    if job.triton_cache.is_dir():
        copy_triton_cache(job.triton_cache, dest, autotuning)


# ---- child side ---------------------------------------------------------------------------------
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def enter(scratch: Path, drop: list[int] | None, drop_reason: str | None) -> dict[str, str]:
    """Apply the OS layers in the child (as its first act) and say which are active."""
    layers = {"minimal_env": "active", "scratch_cwd": "active"}
    os.chdir(scratch)
    os.umask(0o077)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0:
        if _libc().unshare(CLONE_NEWNET) == 0:
            layers["network_namespace"] = "active"
        else:
            layers["network_namespace"] = f"unavailable: unshare failed: {os.strerror(ctypes.get_errno())}"
    else:
        layers["network_namespace"] = "unavailable: not running as root"
    if drop:
        uid, gid = drop
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise RuntimeError(f"sandbox: could not drop to uid {uid}; still {os.getuid()}/{os.geteuid()}")
        layers["uid_drop"] = f"active: uid {uid} ({SANDBOX_USER})"
    else:
        layers["uid_drop"] = drop_reason or "unavailable"
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        layers["no_new_privs"] = "active"
    else:
        layers["no_new_privs"] = f"unavailable: {os.strerror(ctypes.get_errno())}"
    return layers


def is_secret_env_name(name: str) -> bool:
    words = re.split(r"[^A-Za-z0-9]+", name.upper())
    return any(w in SECRET_ENV_WORDS for w in words) or words[0] in SECRET_ENV_PREFIXES


@dataclass
class Monitor:
    """The audit hook and the environ witness. `violations` lists what the candidate attempted."""

    writable: tuple[str, ...]  # real paths of the directories the child may write in
    library_roots: tuple[str, ...]  # Python installation: read freely, never "secret"
    own: str | None = None  # the child's job directory (candidate copy, scratch): read freely, never "secret"
    harmless_env: frozenset[str] = frozenset()  # secret-looking names the parent knows are not its secrets
    violations: list[str] = field(default_factory=list)
    _busy: threading.local = field(default_factory=threading.local)

    def record(self, kind: str, what: str) -> None:
        entry = f"{kind}: {what}"
        if entry not in self.violations and len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(entry)

    def install(self) -> None:
        sys.addaudithook(self._hook)
        environ = os.environ
        monitor = self

        class WitnessedEnviron(type(environ)):
            def __getitem__(self, key):
                if isinstance(key, str) and is_secret_env_name(key) and key not in monitor.harmless_env:
                    monitor.record("secret_env_read", key)
                return super().__getitem__(key)

        # Rebinding (not clearing) is the point: os.getenv and every later reader go through the witness.
        witnessed = WitnessedEnviron(
            environ._data, environ.encodekey, environ.decodekey, environ.encodevalue, environ.decodevalue
        )
        os.environ = witnessed  # noqa: B003

    def _may_write(self, path: str) -> bool:
        if path in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return True
        return any(path == root or path.startswith(root + os.sep) for root in self.writable)

    def _is_library_or_own(self, path: str) -> bool:
        roots = (*self.library_roots, self.own) if self.own else self.library_roots
        return any(path.startswith(root + os.sep) for root in roots)

    def _hook(self, event: str, args: tuple) -> None:
        if event != "open" and event not in _PATH_WRITE_EVENTS and event not in _NETWORK_EVENTS \
                and event not in _PROCESS_EVENTS and event not in _SIGNAL_EVENTS:  # fmt: skip
            return
        if getattr(self._busy, "active", False):
            return
        self._busy.active = True
        try:
            self._check(event, args)
        finally:
            self._busy.active = False

    def _check(self, event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            real = _real(path)
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writes and not self._may_write(real):
                self.record("write_outside_scratch", real)
                raise PermissionError(f"sandbox: writing {real} is not allowed (only the scratch directory)")
            if SECRET_PATH.search(real) and not self._is_library_or_own(real):
                self.record("secret_read", real)
                raise PermissionError(f"sandbox: {real} is not readable here")
        elif event in _PATH_WRITE_EVENTS:
            for i in _PATH_WRITE_EVENTS[event]:
                if i < len(args) and isinstance(args[i], str | bytes | os.PathLike):
                    real = _real(args[i])
                    if not self._may_write(real):
                        self.record("write_outside_scratch", f"{event} {real}")
                        raise PermissionError(f"sandbox: {event} on {real} is not allowed")
        elif event in _NETWORK_EVENTS:
            on_socket = event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg")
            self.record("network", f"{event} {args[-1] if on_socket else args}")
            raise PermissionError(f"sandbox: {event} is not allowed (no network)")
        elif event in _PROCESS_EVENTS:
            exe = _executable(event, args)
            if exe is None or os.path.basename(exe) not in ALLOWED_EXECUTABLES:
                self.record("process", f"{event} {exe!r}")
                raise PermissionError(f"sandbox: {event} of {exe!r} is not allowed")
        elif event in _SIGNAL_EVENTS and args and args[0] not in (0, os.getpid()):
            self.record("signal", f"{event}{args}")
            raise PermissionError(f"sandbox: {event} to another process is not allowed")


def _real(path: str | bytes | os.PathLike) -> str:
    p = os.fsdecode(path)
    return os.path.realpath(p)


def _executable(event: str, args: tuple) -> str | None:
    """The program an exec-like event would start (None for a bare fork)."""
    if event == "subprocess.Popen":
        exe, argv = args[0], args[1]
        if exe is None:
            if isinstance(argv, str | bytes | os.PathLike):
                return os.fsdecode(argv).split()[0] if os.fsdecode(argv).strip() else None
            return os.fsdecode(argv[0]) if argv else None
        return os.fsdecode(exe)
    if event == "os.system":
        command = os.fsdecode(args[0]).strip()
        return command.split()[0] if command else None
    if event in ("os.exec", "os.posix_spawn"):
        return os.fsdecode(args[0])
    if event == "os.spawn":
        return os.fsdecode(args[1])
    return None
