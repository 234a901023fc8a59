"""The fork server: one process with torch imported that starts the harness's CPU children by fork.

Every child (harness/child.py, harness/inspect_child.py) imports torch and the sandbox before it does
anything: about 2.5 s of a 2-core machine's CPU, most of a small parity child's life. A CPU run starts a
configs child and one or more parity children per candidate, the test suite about two hundred. The
server imports harness.child once and forks a child per request; the forked child takes its session,
environment, working directory and log from the request and runs its module as `python -m` would
(runpy, as __main__). From there on it is the child it would have been: it enters the sandbox as its
first act (harness/sandbox.py:enter).

The server is started as a child is (`python -P -s -B`, in a session of its own) with the sandbox's
minimal environment (`sandbox.server_env`: the allowlisted variables, no per-child values), so no
secret of the harness is in its memory for a child to find. It never touches CUDA, and it serves CPU
children only (`sandbox.run_child`): a GPU child's start is small beside its compiling and timing.
What an exec'd child would see differently:
- /proc/self/environ is the server's environment; os.environ (and what a child's subprocesses get) is
  the request's, exactly.
- libgomp read OMP_NUM_THREADS when torch loaded in the server: the child sets torch's threads itself.
- numpy's BLAS runs on one thread (SERVER_ONLY_ENV): a server must be one thread when it forks, and
  refuses to serve otherwise.
- tempfile forgets the server's temporary directory; Python reseeds `random` at fork.
A server that cannot start, refuses, or ends before its first child is not started again in the process:
every child is exec'd, and its log's first line says why. BEAM_HARNESS_FORK_SERVER=0 in the harness's
environment execs every child from the start.

Protocol: JSON lines. The harness writes {"id", "module", "args", "cwd", "env", "log", "threads"} to
the server's stdin; the server answers {"id", "pid"} (or {"id", "error"}) on its stdout, and
{"pid", "status"} (a wait status) when that child has exited; {"refused"} if it will not fork at all.
At end of input (the harness exited, however it died) the server kills the sessions of its children
still running, and exits.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENABLE_ENV = "BEAM_HARNESS_FORK_SERVER"  # "0": no fork server, every child exec'd
MODULE = "harness.forkserver"
# numpy's OpenBLAS starts its worker threads when it loads; the server must stay one thread to fork safely
# (it refuses otherwise). Its children's numpy BLAS runs on one thread then: the interpreter's small blocks.
SERVER_ONLY_ENV = {"OPENBLAS_NUM_THREADS": "1"}
ANSWER_TIMEOUT_S = 300.0  # for a fork: the first one waits for the server's imports (2-3 s on a 2-core machine)


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


class ServerLost(RuntimeError):
    """The fork server ended before it answered a request: the caller starts the child by exec."""


@dataclass(eq=False)
class ForkedChild:
    """A child the fork server started: what sandbox.run_child needs of a Popen (pid, wait, returncode).
    `lost`: the server ended while the child ran; the harness killed its session (returncode -SIGKILL)."""

    pid: int
    returncode: int | None = None
    lost: bool = False
    _done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        assert self.returncode is not None
        return self.returncode

    def _exited(self, returncode: int, lost: bool = False) -> None:
        self.returncode, self.lost = returncode, lost
        self._done.set()


class ForkServer:
    """The harness's side of one server process (started on the first request, by `server_for`)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-s", "-B", "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env={**env, **SERVER_ONLY_ENV}, cwd="/", start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            raise ServerLost(f"the fork server could not start: {e}") from e
        self.forked = 0  # children started: a server that ends before its first never worked here
        self.why_ended = ""
        self._lock = threading.Lock()  # the state below
        self._write_lock = threading.Lock()  # the server's stdin
        self._ids = itertools.count()
        self._asked: dict[int, tuple[threading.Event, list[Any]]] = {}  # id -> (answered, [pid or error])
        self._running: dict[int, ForkedChild] = {}
        self.ended = False
        threading.Thread(target=self._read_answers, name="forkserver-answers", daemon=True).start()

    def start(self, module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path,
              threads: int) -> ForkedChild:  # fmt: skip
        """Fork a child running `python -m module *args` (the server's first answer waits for its imports)."""
        answered, answer = threading.Event(), []
        with self._lock:
            if self.ended:
                raise ServerLost("the fork server has ended")
            ident = next(self._ids)
            self._asked[ident] = (answered, answer)
        line = json.dumps({"id": ident, "module": module, "args": args, "cwd": str(cwd), "env": env,
                           "log": str(log), "threads": threads})  # fmt: skip
        try:
            with self._write_lock:
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as e:  # the reader answers it as ended, or already has
            self.kill()
            raise ServerLost(f"the fork server has ended: {e}") from e
        if not answered.wait(ANSWER_TIMEOUT_S):
            self.kill()  # its reader then ends every child it had started
            raise ServerLost(f"the fork server did not answer in {ANSWER_TIMEOUT_S:.0f} s")
        if isinstance(answer[0], ForkedChild):
            return answer[0]
        raise ServerLost(answer[0])

    def _ending(self) -> str:
        return self.why_ended or f"exit status {self.proc.returncode}"

    def kill(self) -> None:
        """The server is broken: kill it; its reader sees the end and kills the children it had started."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """End of input: the server kills what it still runs and exits."""
        with self._write_lock:
            if self.proc.stdin and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except BrokenPipeError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read_answers(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:  # a torn answer: the server is broken, whatever it does next
                self.kill()
                break
            with self._lock:
                if "refused" in message:
                    self.why_ended = f"it refused to fork: {message['refused']}"
                elif "id" in message:
                    answered, answer = self._asked.pop(message["id"])
                    if "pid" in message:
                        self.forked += 1
                        child = self._running[message["pid"]] = ForkedChild(message["pid"])
                        answer.append(child)
                    else:
                        answer.append(f"the fork server could not fork: {message['error']}")
                    answered.set()
                else:
                    self._running.pop(message["pid"])._exited(os.waitstatus_to_exitcode(message["status"]))
        self.proc.wait()
        with self._lock:
            self.ended = True
            for answered, answer in self._asked.values():
                answer.append(f"the fork server ended before it answered ({self._ending()})")
                answered.set()
            self._asked.clear()
            for pid, child in self._running.items():  # orphans now: nobody would ever reap or report them
                kill_session(pid)
                child._exited(-signal.SIGKILL, lost=True)
            self._running.clear()


def kill_session(pid: int) -> None:
    """SIGKILL to a forked child's session, and to the child itself where it has not made its session yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


_servers: dict[str, ForkServer] = {}  # by their environment: one per distinct minimal environment
_servers_lock = threading.Lock()


def server_for(env: dict[str, str]) -> ForkServer:
    """The running server started with `env`, or a new one where one ended after forking children (killed,
    say). One that ended before it forked any (it cannot import torch or the harness, say) is not started
    again in this process: ServerLost, every time, and the children are exec'd."""
    key = json.dumps(env, sort_keys=True)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.ended and not server.forked:
            raise ServerLost(f"the fork server ended before its first child ({server._ending()})")
        if server is None or server.ended:
            server = _servers[key] = ForkServer(env)
        return server


def _forget_all() -> None:
    """In a fork of the harness: the servers' answers go to the parent's reader threads, not here."""
    global _servers, _servers_lock
    _servers, _servers_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_all)


@atexit.register
def _close_all() -> None:
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


# ---- the server process ----------------------------------------------------------------------------
def _serve() -> None:
    # The protocol gets fds of its own; stdin and stdout become /dev/null and stderr (nothing may write
    # into the answers, nor be inherited through a buffer by a forked child).
    requests, answers = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    import harness.child  # noqa: F401  (what every child imports first: torch, the sandbox)

    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:  # a fork copies only the forking thread: a lock another thread held stays held
        os.write(answers, json.dumps({"refused": f"{threads} threads after its imports"}).encode() + b"\n")
        os._exit(3)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    own_fds = (requests, answers, wake_r, wake_w)
    children: set[int] = set()

    def answer(message: dict[str, Any]) -> None:
        os.write(answers, json.dumps(message).encode() + b"\n")  # a few hundred bytes: one atomic write

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            answer({"pid": pid, "status": status})

    pending = b""
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        reap()
        if requests not in ready:
            continue
        data = os.read(requests, 1 << 16)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as e:
                answer({"id": request["id"], "error": str(e)})
                continue
            if pid == 0:
                _become_child(request, own_fds)  # never returns
            children.add(pid)
            answer({"id": request["id"], "pid": pid})
    for pid in children:
        kill_session(pid)
    os._exit(0)


def _become_child(request: dict[str, Any], own_fds: tuple[int, ...]) -> None:
    """In the forked process: take the request's session, fds, directory and environment, run its module."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own_fds:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import runpy
        import tempfile

        import torch

        tempfile.tempdir = None
        torch.set_num_threads(request["threads"])
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    _serve()
