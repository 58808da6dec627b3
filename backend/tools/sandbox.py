"""Run untrusted tool code in a fresh, limited subprocess.

Used for code typed into the web UI (:meth:`backend.tools.ToolRegistry.from_python_source` with
``sandboxed=True``, which the app only offers behind an explicit flag). The code never runs in
the server process: discovering its functions and every single call each start their own child
(:mod:`backend.tools._sandbox_child`, standard library only, ~0.1 s to start) with

* ``python -I`` (isolated mode: no ``PYTHON*`` variables, no user site, no script directory on
  ``sys.path``), stdin on ``/dev/null``, a fresh empty temporary working directory (removed
  afterwards), and an environment holding nothing but a fixed ``PATH`` (no server variables,
  no tokens);
* resource limits set inside the child before any user code runs: ``RLIMIT_AS`` (memory, on
  top of the bare interpreter; a Python ``MemoryError`` or a crash), ``RLIMIT_CPU`` (CPU
  seconds, by default ``ceil(timeout) + 1``: ``SIGXCPU``, then ``SIGKILL``), ``RLIMIT_FSIZE``
  (largest file it may write: ``OSError: File too large``), ``RLIMIT_NOFILE``,
  ``RLIMIT_CORE = 0`` and ``RLIMIT_NPROC = 0``;
* a seccomp filter (Linux x86_64/aarch64, installed with ctypes) that makes ``fork``,
  ``vfork``, ``clone`` and ``clone3`` fail with ``EPERM``: no processes and no threads, so no
  fork bombs, whatever the uid (``RLIMIT_NPROC`` does not bind root); ``PR_SET_NO_NEW_PRIVS``;
* when the server runs as root: a switch to ``nobody`` (uid/gid 65534) before user code runs,
  if nobody can read the interpreter and its libraries (:func:`can_drop_privileges`; not so
  for a Python installed under ``/root``, e.g. pyenv: then the code runs as root, still
  limited as above, and can read root's files. Point ``SandboxLimits.python`` at a
  world-readable interpreter such as ``/usr/bin/python3`` to get the switch);
* its own session / process group, killed as a whole (``SIGKILL``) at the wall-clock deadline
  and again after the child ends. The deadline (``timeout_s``) starts when the child reports
  ready, so interpreter start-up on a busy machine is not charged to the tool;
* stdout and stderr captured through pipes, drained to the end but kept only up to
  ``max_stdout_bytes``; the function's return value comes back as one JSON document over a
  dedicated pipe (not stdout), read up to ``max_result_bytes`` (more: the child is killed and
  the call is a ``bad_result``). The child truncates long results itself, with the call's
  ``max_response_length``, so a 10 MB result costs no more than its truncated form.

This is process isolation with limits, not a security boundary against a determined attacker
(no namespaces: the code can read world-readable files and open network connections).
:func:`describe_protections` says what applies on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# the child has this long to start (interpreter, limits) before the tool's timeout_s begins
STARTUP_TIMEOUT_S = 20.0
NOBODY = 65534


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one sandboxed run. ``None`` leaves a limit unset."""

    memory_mb: int | None = 512  # address space the code may add on top of the bare interpreter
    cpu_s: float | None = None  # CPU seconds; None: ceil(timeout_s) + 1
    file_size_mb: float | None = 1.0  # largest file the code may write (RLIMIT_FSIZE)
    nproc: int | None = 0  # RLIMIT_NPROC: 0 forbids new processes and threads
    nofile: int | None = 64  # open file descriptors
    max_stdout_bytes: int = 64 * 1024  # captured stdout (and stderr) kept per call
    max_result_bytes: int = 8 * 1024 * 1024  # the JSON result document
    drop_privileges: bool = True  # as root: run the code as nobody (when nobody can read the interpreter)
    block_processes: bool = True  # seccomp filter: fork/vfork/clone/clone3 fail (Linux x86_64/aarch64)
    discover_timeout_s: float = 30.0  # running the code once to describe its functions
    python: str | None = None  # interpreter; default: sys.executable

    def child_limits(self, timeout_s: float) -> dict[str, Any]:
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(timeout_s) + 1
        return {
            "memory_bytes": int(self.memory_mb * (1 << 20)) if self.memory_mb else None,
            "cpu_s": cpu,
            "file_size_bytes": int(self.file_size_mb * (1 << 20)) if self.file_size_mb is not None else None,
            "nproc": self.nproc,
            "nofile": self.nofile,
            "drop_privileges": self.drop_privileges and can_drop_privileges(self.python or sys.executable),
            "block_processes": self.block_processes,
            "uid": NOBODY,
            "gid": NOBODY,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _world_accessible(path: str) -> bool:
    """Whether a user with no special rights (other bits) can read ``path`` and reach it."""
    try:
        path = os.path.realpath(path)
        st = os.stat(path)
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
        if st.st_mode & need != need:
            return False
        d = os.path.dirname(path)
        while True:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(d)
            if parent == d:
                return True
            d = parent
    except OSError:
        return False


@functools.lru_cache(maxsize=8)
def can_drop_privileges(python: str) -> bool:
    """Whether the sandbox child can still run after switching to nobody: needs root now, and
    the interpreter, its standard library, site-packages and our child script readable by
    others. (On a Python installed under /root, e.g. pyenv, it is not: the child stays root.)"""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    paths = [python, CHILD_SCRIPT, os.path.join(os.path.dirname(CHILD_SCRIPT), "_runtime.py")]
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import sysconfig

        sp = sysconfig.get_paths()
        stdlib = sp.get("stdlib")
        paths += [p for p in (stdlib, sp.get("platstdlib"), sp.get("purelib"), sp.get("platlib")) if p]
        if stdlib:
            paths.append(os.path.join(stdlib, "lib-dynload"))
    return all(_world_accessible(p) for p in paths if os.path.exists(p) or p == python)


@dataclass
class ChildRun:
    """What one child run produced."""

    payload: dict[str, Any] | None = None  # the JSON document from the result pipe
    payload_error: str | None = None  # why the result could not be read
    returncode: int | None = None
    timed_out: bool = False
    result_too_big: bool = False
    stdout: str = ""
    stdout_bytes: int = 0  # total, including what was cut
    stderr: str = ""
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


class _Bounded:
    """Reads a stream to EOF, keeping the first ``cap`` bytes (the rest is counted, dropped)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.buf = bytearray()
        self.total = 0

    async def drain(self, reader: asyncio.StreamReader) -> None:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.cap - len(self.buf)
            if room > 0:
                self.buf += chunk[:room]

    def text(self) -> str:
        s = self.buf.decode("utf-8", "replace")
        if self.total > len(self.buf):
            s += f"\n...({self.total - len(self.buf)} more bytes not kept)"
        return s


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pid, signal.SIGKILL)


async def run_child(request: dict[str, Any], limits: SandboxLimits, timeout_s: float, *,
                    startup_timeout_s: float = STARTUP_TIMEOUT_S) -> ChildRun:
    """Start one sandbox child for ``request`` and collect what it produces.

    ``timeout_s`` is wall-clock time counted from the child's ready signal (sent after start-up
    and limits, just before the user code runs), so a slow interpreter start on a busy machine
    is not charged to the tool; start-up itself has ``startup_timeout_s``. Never raises for
    anything the child does; raises only if the child cannot be started (OSError) and on
    cancellation (after killing the child)."""
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    run = ChildRun()
    tmp = tempfile.mkdtemp(prefix="ali-sandbox-")
    proc = None
    tasks: list[asyncio.Task] = []
    transport = None
    r_fd = w_fd = -1
    try:
        work = os.path.join(tmp, "work")
        os.mkdir(work, 0o700)
        child_limits = limits.child_limits(timeout_s)
        if limits.drop_privileges and hasattr(os, "geteuid") and os.geteuid() == 0:
            with contextlib.suppress(OSError):
                os.chown(work, NOBODY, NOBODY)
        req_path = os.path.join(tmp, "request.json")
        fd = os.open(req_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**request, "limits": child_limits}, f)
        r_fd, w_fd = os.pipe()
        proc = await asyncio.create_subprocess_exec(
            limits.python or sys.executable, "-I", CHILD_SCRIPT, req_path, str(w_fd),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=work,
            env={"PATH": SAFE_PATH},
            pass_fds=(w_fd,),
            start_new_session=True,
            close_fds=True,
        )
        os.close(w_fd)
        w_fd = -1

        result_reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(result_reader), os.fdopen(r_fd, "rb", buffering=0)
        )
        r_fd = -1  # owned by the transport now
        result = bytearray()
        ready = asyncio.Event()

        async def read_result() -> None:
            while True:
                chunk = await result_reader.read(1 << 16)
                if not chunk:
                    return
                if not ready.is_set():
                    ready.set()
                    if chunk.startswith(b"R"):
                        chunk = chunk[1:]
                result.extend(chunk)
                if len(result) > limits.max_result_bytes:
                    run.result_too_big = True
                    _killpg(proc.pid)
                    return

        out, err = _Bounded(limits.max_stdout_bytes), _Bounded(limits.max_stdout_bytes)
        tasks = [
            asyncio.ensure_future(read_result()),
            asyncio.ensure_future(out.drain(proc.stdout)),
            asyncio.ensure_future(err.drain(proc.stderr)),
        ]
        wait_task = asyncio.ensure_future(proc.wait())
        ready_task = asyncio.ensure_future(ready.wait())
        tasks += [wait_task, ready_task]
        done, _ = await asyncio.wait({wait_task, ready_task}, timeout=startup_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            run.notes.append(f"the sandbox did not start within {startup_timeout_s:g} s")
        elif wait_task not in done:
            done, _ = await asyncio.wait({wait_task}, timeout=max(0.01, timeout_s))
        if wait_task not in done:
            run.timed_out = True
            _killpg(proc.pid)
            await asyncio.wait({wait_task}, timeout=10)
        # stray grandchildren (if any could be made) hold the pipes open: kill the group again
        _killpg(proc.pid)
        await asyncio.wait(tasks[:3], timeout=2.0)
        run.returncode = proc.returncode
        run.stdout, run.stdout_bytes = out.text(), out.total
        run.stderr = err.text()
        if not run.result_too_big and not run.timed_out:
            if result:
                try:
                    payload = json.loads(result.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, RecursionError) as e:
                    run.payload_error = f"the result is not valid JSON ({type(e).__name__})"
                else:
                    if isinstance(payload, dict) and isinstance(payload.get("status"), str):
                        run.payload = payload
                    else:
                        run.payload_error = "the result has an unexpected shape"
        return run
    finally:
        if proc is not None and proc.returncode is None:
            _killpg(proc.pid)
        for t in tasks:
            if not t.done():
                t.cancel()
        if transport is not None:
            transport.close()
        for fd in (r_fd, w_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        run.duration_s = time.perf_counter() - t0
        shutil.rmtree(tmp, ignore_errors=True)


def describe_protections(limits: SandboxLimits | None = None) -> dict[str, Any]:
    """What the sandbox enforces on this machine with these limits (for the UI to show)."""
    import platform

    limits = limits or SandboxLimits()
    python = limits.python or sys.executable
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    drop = limits.drop_privileges and can_drop_privileges(python)
    seccomp = limits.block_processes and sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
    return {
        "python": python,
        "runs_as": "nobody" if drop else ("root" if root else "the server's user"),
        "process_block": "seccomp" if seccomp else ("RLIMIT_NPROC" if (limits.nproc is not None and not root) else "none"),
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s if limits.cpu_s is not None else "timeout + 1",
        "file_size_mb": limits.file_size_mb,
        "nofile": limits.nofile,
        "max_stdout_bytes": limits.max_stdout_bytes,
        "max_result_bytes": limits.max_result_bytes,
        "environment": ["PATH"],
        "network": "not blocked",
    }
