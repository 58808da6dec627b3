"""A pool of long-lived worker processes for untrusted work, each under a memory cap, each request
under a time limit.

Two users: :mod:`backend.tokens.template_guard` (chat templates a visitor types) and
:mod:`backend.trace.parquet_guard` (Parquet files a visitor uploads). This module holds what they
share and nothing of either (standard library only):

* :func:`serve` is a worker's main (``spawn``: no inherited state, no forked threads). It caps the
  process's memory (:func:`cap_memory`), exits when its parent is gone (a worker stuck in a
  request would otherwise outlive a parent that died without :meth:`WorkerPool.close`), runs the
  owner's ``setup`` (imports and a warm-up, so that start-up is never charged to a request) and
  then says "ready"; it answers one request at a time with the handler ``setup`` returned, until
  it reads ``None`` or its pipe closes.
* :class:`WorkerPool` keeps ``size`` workers: they start in the background with the first request
  (start-up has its own limit), all at once or (``lazy``) one more each time every one is busy.
  :meth:`WorkerPool.lease` hands out a ready worker, waiting at most ``queue_timeout_s`` for one
  ("all N ... are busy; try again"); a :class:`Lease` sends requests and receives answers, each
  within a time limit counted from the moment it is awaited. A worker that overruns it is killed
  and a replacement starts in the background at once (:class:`Overrun`); one that dies (killed,
  out of memory, crashed) is replaced too (:class:`Lost`, with its exit code).
  :meth:`WorkerPool.close` stops them all; a later request starts the pool again.
* answers are pickled, except large ones (:func:`send_raw`, :meth:`Lease.recv_raw`): on Linux
  those are written to an anonymous memory file, sealed, whose descriptor is passed on the pipe
  and mapped by the parent (no copy through the pipe, one hand-over however large); elsewhere
  they are raw bytes on the pipe.
* :func:`close_all` closes every pool of this process: the app's shutdown calls it
  (:mod:`backend.deploy.lifecycle`), and so does the interpreter's exit.

The memory cap (:func:`cap_memory`) is ``RLIMIT_AS``, the process's address space: an allocation
past it fails (``MemoryError``, pyarrow's ``ArrowMemoryError``) and the worker reports it. Where
the kernel does not enforce ``RLIMIT_AS`` (macOS accepts or refuses the call but does not apply
it) a thread of the worker reads its own peak resident memory every :data:`WATCH_S` seconds and
ends the process with :data:`OVER_MEMORY_EXIT` once it passes the cap, so the cap still holds
there, give or take what the worker allocates between two looks. Without the ``resource`` module
(Windows) there is no cap: the time limit still applies.
"""

from __future__ import annotations

import atexit
import collections
import mmap
import multiprocessing as mp
import multiprocessing.util  # noqa: F401 - its exit hook registered before ours: ours runs first
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

CLOSE_JOIN_S = 3.0  # close(): how long workers get to exit on their own before they are killed
WATCH_S = 0.05  # where RLIMIT_AS is not enforced: how often a worker looks at its own peak memory
OVER_MEMORY_EXIT = 86  # the exit code of a worker that ended itself over the cap (the watch above)

_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


class Overrun(Exception):
    """No answer within the time limit: the worker was killed (and replaced)."""


class Lost(Exception):
    """The worker's pipe closed: it died (killed, over its memory cap, crashed) or the pool was
    closed (``closed``). ``exitcode``: the process's, when known (negative: the signal)."""

    def __init__(self, closed: bool, exitcode: int | None) -> None:
        super().__init__("the pool was closed" if closed else f"the worker exited (exit code {exitcode})")
        self.closed = closed
        self.exitcode = exitcode


# ---- in the worker --------------------------------------------------------------------------------

# A large answer goes to the parent as it is, after a message that says how many bytes: on Linux in
# an anonymous memory file whose descriptor is passed on the pipe (one hand-over however large, where
# streaming it through the pipe's ~200 KB buffer costs a wake-up of each side a buffer, which on a
# busy machine is a wait for a core each time); elsewhere as raw bytes on the pipe, or (Windows) as
# one message of the pipe.
_MEMFD = all(hasattr(os, n) for n in ("memfd_create", "MFD_ALLOW_SEALING")) and hasattr(fcntl, "F_ADD_SEALS")
_SEALS = (fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE) if _MEMFD else 0
_RAW = hasattr(os, "readv")


def send_raw(conn: Any, data: Any) -> None:
    """In a worker: ``data`` (any buffer) to the parent as it is, no pickling (the parent takes it
    with :meth:`Lease.recv_raw`, told its size by the message before)."""
    view = memoryview(data).cast("B")
    if not _RAW:
        conn.send_bytes(view)
        return
    if not _MEMFD:
        fd = conn.fileno()
        while len(view):
            view = view[os.write(fd, view):]
        return
    fd = os.memfd_create("ali-answer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        while len(view):
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)  # the parent maps it: it can no longer change
        reduction.send_handle(conn, fd, None)
    finally:
        os.close(fd)


def _read_into(fd: int, view: memoryview) -> int:
    n = os.readv(fd, [view])
    if n == 0:
        raise EOFError
    return n


def _exit_with_parent(parent_pid: int) -> None:  # a thread in the child
    # the loop holds the GIL only for a switch interval at a time
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _peak_rss_bytes() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _watch_memory(memory_bytes: int) -> None:  # a thread in the child
    while _peak_rss_bytes() <= memory_bytes:
        time.sleep(WATCH_S)
    os._exit(OVER_MEMORY_EXIT)


def cap_memory(memory_bytes: int) -> str:
    """Cap this process's memory at ``memory_bytes`` (see the module's docstring); returns how:
    ``"rlimit"``, ``"watch"`` or ``"none"``."""
    try:
        import resource
    except ImportError:
        return "none"
    try:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        cap = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError, AttributeError):
        pass
    if sys.platform.startswith("linux"):
        return "rlimit"
    threading.Thread(target=_watch_memory, args=(memory_bytes,), daemon=True, name="ali-memory-watch").start()
    return "watch"


def serve(conn, setup: Callable[..., Callable[[Any, Any], None]], setup_args: tuple, memory_bytes: int,
          parent_pid: int | None = None) -> None:  # runs in the child
    """A worker's main: cap, ``handler = setup(*setup_args)``, "ready", then ``handler(conn, request)``
    for each request until ``None`` or the pipe closes."""
    if parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    cap_memory(memory_bytes)
    handler = setup(*setup_args)
    try:
        conn.send(("ready", os.getpid()))
    except OSError:  # the parent is gone (closed, or exited while we were starting)
        return
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        if req is None:
            return
        try:
            handler(conn, req)
        except OSError:  # the parent is gone
            return


# ---- in the parent ---------------------------------------------------------------------------------


class _Worker:
    """One worker process and its pipe. ``state``: starting → idle ⇄ busy; a retired worker
    (killed, crashed, closed) is out of the pool for good."""

    __slots__ = ("name", "proc", "conn", "state", "retired")

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: mp.process.BaseProcess | None = None
        self.conn = None
        self.state = "starting"
        self.retired = False


class Lease:
    """A ready worker, for one exchange (or several) with it; from :meth:`WorkerPool.lease`, as a
    context manager: leaving it normally gives the worker back, leaving it by an exception (other
    than :class:`Overrun` / :class:`Lost`, after which the worker is gone already) kills it, as
    its state is then unknown."""

    def __init__(self, pool: WorkerPool, worker: _Worker, generation: int) -> None:
        self.pool = pool
        self.worker = worker
        self.generation = generation
        self.done = False
        assert worker.conn is not None
        self.conn = worker.conn

    def send(self, obj: Any) -> None:
        self._io(self.conn.send, obj)

    def send_bytes(self, data: Any) -> None:
        self._io(self.conn.send_bytes, data)

    def recv(self, timeout_s: float | None = None) -> Any:
        """The worker's next message (pickled), within ``timeout_s`` (default: the pool's)."""
        return self._wait(timeout_s, self.conn.recv)

    def recv_bytes(self, timeout_s: float | None = None) -> bytes:
        return self._wait(timeout_s, self.conn.recv_bytes)

    def recv_raw(self, size: int, timeout_s: float | None = None) -> Any:
        """The ``size`` bytes the worker sent by :func:`send_raw`, within ``timeout_s`` (each wait for
        more, through the pipe): a read-only ``mmap`` of them (Linux), else a ``bytearray``."""
        if _MEMFD:
            fd = self._wait(timeout_s, lambda: reduction.recv_handle(self.conn))
            try:
                # sealed: the mapping cannot shrink under us (a read past its end would be SIGBUS)
                if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS and os.fstat(fd).st_size == size:
                    return mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
            except (OSError, ValueError):
                pass
            finally:
                os.close(fd)
            self.kill()  # not what it said: its state is unknown
            raise Lost(False, None)
        if not _RAW:
            return self.recv_bytes(timeout_s)
        buf = bytearray(size)
        view, fd, got = memoryview(buf), self.conn.fileno(), 0
        while got < size:
            got += self._wait(timeout_s, lambda: _read_into(fd, view[got:]))
        return buf

    def _wait(self, timeout_s: float | None, read: Callable[[], Any]) -> Any:
        timeout_s = self.pool.timeout_s if timeout_s is None else timeout_s
        ready = self._io(self.conn.poll, timeout_s)
        if not ready:
            self.kill()
            raise Overrun
        return self._io(read)

    def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (EOFError, OSError):
            pool, w = self.pool, self.worker
            exitcode = None
            if w.proc is not None:
                w.proc.join(timeout=0.5)  # for its exit code
                exitcode = w.proc.exitcode
            with pool._cond:
                closed = pool._generation != self.generation
            self.kill()
            raise Lost(closed, exitcode) from None

    def kill(self) -> None:
        """Kill the worker (a replacement starts unless the pool was closed meanwhile)."""
        if self.done:
            return
        self.done = True
        pool = self.pool
        with pool._cond:
            pool._retire(self.worker, kill=True, replace=pool._generation == self.generation)
        self.conn.close()

    def release(self) -> None:
        """Give the worker back to the pool (it must owe no answer)."""
        if self.done:
            return
        self.done = True
        pool, w = self.pool, self.worker
        with pool._cond:
            if w.retired:  # close() ran meanwhile; what was answered is still good
                self.conn.close()
            else:
                w.state = "idle"
                pool._idle.append(w)
                pool._cond.notify_all()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
        else:
            self.kill()


class WorkerPool:
    """A fixed-size pool of workers running :func:`serve` with ``setup(*setup_args)``. ``kind``
    names its threads and processes (``ali-<kind>-worker-N``), ``noun`` its workers in messages
    ("template worker"), ``service`` what it does ("template renderer"); its own failures (no worker
    started, all busy, shut down) raise ``error``. All bookkeeping is under ``self._cond``; process
    start-up, joins and requests happen outside it."""

    def __init__(self, size: int, *, kind: str, noun: str, service: str, error: type[Exception],
                 setup: Callable[..., Callable[[Any, Any], None]], setup_args: tuple = (), timeout_s: float,
                 start_timeout_s: float, queue_timeout_s: float, memory_bytes: int, lazy: bool = False) -> None:
        self.size = max(1, int(size))
        self.lazy = lazy  # start workers one at a time, when every one there is busy (not all at once)
        self.kind, self.noun, self.service, self.error = kind, noun, service, error
        self.setup, self.setup_args = setup, setup_args
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self.memory_bytes = memory_bytes
        self._cond = threading.Condition(threading.Lock())
        self._close_lock = threading.Lock()  # one close() at a time; a second waits for the first
        self._workers: list[_Worker] = []  # live: starting, idle or busy
        self._idle: collections.deque[_Worker] = collections.deque()
        self._threads: set[threading.Thread] = set()  # starters and reapers, joined by close()
        self._start_error: str | None = None  # why the last start-up failed (None after a success)
        self._generation = 0  # bumped by close(); a request that began before it is refused
        self._serial = 0
        _POOLS.add(self)

    # ---- bookkeeping (caller holds self._cond) ------------------------------------------------

    def _spawn_thread(self, target, *args) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._cond:
                    self._threads.discard(threading.current_thread())

        t = threading.Thread(target=run, daemon=True, name=f"ali-{self.kind}-pool-{target.__name__}")
        self._threads.add(t)
        t.start()

    def _fill(self, upto: int | None = None) -> None:
        """Start workers (in the background) until the pool has ``upto`` of them (its size at most)."""
        while len(self._workers) < min(self.size, self.size if upto is None else upto):
            self._serial += 1
            w = _Worker(f"ali-{self.kind}-worker-{self._serial}")
            self._workers.append(w)
            self._spawn_thread(self._start, w)

    def _retire(self, w: _Worker, *, kill: bool, replace: bool) -> None:
        """Take ``w`` out of the pool, kill it if asked, reap it in the background, and start a
        replacement at once (in the background too) when asked."""
        if w.retired:
            return
        w.retired = True
        if w in self._workers:
            self._workers.remove(w)
        try:
            self._idle.remove(w)
        except ValueError:
            pass
        if kill and w.proc is not None:
            try:
                w.proc.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        if w.proc is not None:
            self._spawn_thread(self._reap, w.proc)
        if replace:
            self._fill(len(self._workers) + 1 if self.lazy else None)
        self._cond.notify_all()

    # ---- background work -----------------------------------------------------------------------

    def _start(self, w: _Worker) -> None:
        """Start ``w``'s process and wait (at most ``start_timeout_s``) for its ready message."""
        with self._cond:
            if w.retired:
                return
        error: str | None = None
        try:
            ctx = mp.get_context("spawn")  # no inherited state, no forked threads
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(child, self.setup, self.setup_args, self.memory_bytes, os.getpid()),
                               daemon=True, name=w.name)
            proc.start()
            child.close()
        except Exception as e:  # noqa: BLE001 - reported to the request that waits for a worker
            with self._cond:
                self._start_error = f"cannot start the {self.noun}: {type(e).__name__}: {e}"
                self._retire(w, kill=False, replace=False)
            return
        with self._cond:
            w.proc, w.conn = proc, parent
            if w.retired:  # close() ran while the process was starting
                proc.kill()
                self._spawn_thread(self._reap, proc)
                parent.close()
                return
        ready = False
        try:
            if not parent.poll(self.start_timeout_s):
                error = f"the {self.noun} did not start within {self.start_timeout_s:g} s"
            else:
                ready = parent.recv()[0] == "ready"
        except (EOFError, OSError):
            pass
        if not ready and error is None:
            proc.join(timeout=1)
            error = f"the {self.noun} exited during start-up (exit code {proc.exitcode})"
        with self._cond:
            if w.retired:  # closed meanwhile: close() killed it and the reaper owns the process
                parent.close()
                return
            if ready:
                self._start_error = None
                w.state = "idle"
                self._idle.append(w)
                self._cond.notify_all()
            else:
                self._start_error = error
                self._retire(w, kill=True, replace=False)  # no endless restarts: the next request refills
                parent.close()

    @staticmethod
    def _reap(proc: mp.process.BaseProcess) -> None:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)

    # ---- a request -----------------------------------------------------------------------------

    def lease(self, max_wait_s: float | None = None) -> Lease:
        """A ready worker (the pool starts if it has not), waiting at most ``queue_timeout_s`` for a
        free one, or ``max_wait_s`` when that is less (a caller that has waited already, elsewhere,
        passes what is left of its own bound; an idle worker is handed out even with 0 left); raises
        ``error`` when none can be had."""
        wait_s = self.queue_timeout_s if max_wait_s is None else max(0.0, min(self.queue_timeout_s, max_wait_s))
        deadline = time.monotonic() + wait_s
        with self._cond:
            if not self.lazy:
                self._fill()
            elif not self._idle and not any(w.state == "starting" for w in self._workers):
                self._fill(len(self._workers) + 1)  # every one there is busy (or there is none)
            generation = self._generation
            while True:
                if self._generation != generation:
                    raise self.error(f"the {self.service} was shut down; try again")
                while self._idle:
                    w = self._idle.pop()  # the one that worked last: its caches are warm
                    if w.proc is not None and w.proc.is_alive():
                        w.state = "busy"
                        return Lease(self, w, generation)
                    self._retire(w, kill=False, replace=True)  # died while idle
                starting = any(w.state == "starting" for w in self._workers)
                busy = any(w.state == "busy" for w in self._workers)
                if not starting and not busy:  # every start-up failed
                    raise self.error(self._start_error or f"no {self.noun} could be started")
                now = time.monotonic()
                if not starting and now >= deadline:
                    who = f"the {self.noun} is" if self.size == 1 else f"all {self.size} {self.noun}s are"
                    raise self.error(f"{who} busy; try again")
                # while a worker is starting, its own start-up limit bounds the wait
                self._cond.wait(max(0.01, deadline - now) if not starting else 1.0)

    # ---- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker (idle ones are asked to exit, then all are joined with a bounded
        wait and killed if still alive). Idempotent and thread-safe; a later request starts the
        pool again."""
        with self._close_lock:
            with self._cond:
                self._generation += 1
                workers = list(self._workers)
                idle = list(self._idle)
                self._workers.clear()
                self._idle.clear()
                for w in workers:
                    w.retired = True
                self._cond.notify_all()
            for w in workers:
                if w in idle and w.conn is not None:
                    try:
                        w.conn.send(None)
                    except Exception:  # noqa: BLE001 - already gone; killed below
                        pass
                elif w.proc is not None:  # busy or starting: its thread sees EOF and cleans up
                    w.proc.kill()
            deadline = time.monotonic() + CLOSE_JOIN_S
            for w in workers:
                if w.proc is not None:
                    w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
                    if w.proc.is_alive():
                        w.proc.kill()
                        w.proc.join(timeout=5)
                if w in idle and w.conn is not None:
                    w.conn.close()
            # starters may be between proc.start() and noticing the close; reapers joining kills
            with self._cond:
                threads = list(self._threads)
            for t in threads:
                if t is not threading.current_thread():
                    t.join(timeout=max(1.0, deadline - time.monotonic()))

    def start(self, *, wait: bool = True) -> int:
        """Start the pool's workers now instead of at the first request; with ``wait``, wait
        (bounded by the start-up limit) until none is starting. Returns how many are ready."""
        with self._cond:
            self._fill()
            deadline = time.monotonic() + self.start_timeout_s + 5
            while wait and any(w.state == "starting" for w in self._workers) and time.monotonic() < deadline:
                self._cond.wait(1.0)
            return len(self._idle)

    def counts(self) -> dict[str, int]:
        """How many workers are starting, idle and busy (for tests and diagnostics)."""
        with self._cond:
            return {state: sum(w.state == state for w in self._workers) for state in ("starting", "idle", "busy")}

    def pids(self) -> list[int]:
        """The process ids of the pool's live workers (for tests and diagnostics)."""
        with self._cond:
            return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.pid is not None]


def close_all() -> None:
    """Close every :class:`WorkerPool` of this process (the app's shutdown, the interpreter's exit)."""
    for pool in list(_POOLS):
        pool.close()


atexit.register(close_all)  # before multiprocessing's own exit hook (atexit runs last-in first-out)
