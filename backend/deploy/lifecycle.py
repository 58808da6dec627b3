"""Process lifecycle of the web app: temp folders, clean shutdown on SIGTERM / SIGINT.

Everything here is process-wide and thread-safe.

* :func:`temp_dir` makes a folder under ONE per-process root (``ali-app-*`` in the temp
  directory, created on first use) and :func:`remove_temp_dir` removes one (and only folders
  under that root). The root is removed at shutdown and, as a fallback, at interpreter exit.
* :func:`register_closer` names things to shut down (sync or async callables: the model
  service, the worker pools of template renders and Parquet reads); :func:`register_server_stop` the web server's stop (Gradio's
  ``demo.close``); :func:`register_run` the cancel of a running agent run.
* :func:`install_signal_handlers`: on SIGTERM or SIGINT a shutdown thread runs
  :func:`shutdown` and then ends the process with ``os._exit``: new runs are refused, running
  runs cancelled (and waited for, briefly), the web server stopped (``demo.close()`` also ends
  ``launch()``'s wait in the main thread), the closers called, all at once, each bounded by
  what is left of the time, then every remaining descendant process is sent SIGTERM and, if
  still there, SIGKILL, the temp root removed, the ``atexit`` handlers run (bounded) and the
  process exits: within ``ALI_SHUTDOWN_TIMEOUT_S`` seconds (default 20) plus a few seconds of
  kill grace. A second signal during the shutdown kills the descendants at once and exits.

Exit status: 0 when everything closed in time and no process had to be killed, else 1.

Each stage is logged (``[ali shutdown] ...``) on this module's logger: the stages at INFO (shown
once the app configures logging, see ``app.py``), what went wrong (a closer that failed or timed
out, processes that had to be killed, a shutdown not clean) at WARNING, which Python shows on
stderr even where nothing configured logging.

multiprocessing's ``resource_tracker`` processes are left alone: they exit by themselves
(and clean up what they track) as soon as the process that started them is gone; killing one
would leak what it tracks.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import itertools
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT_S = 20.0  # a normal shutdown takes ~4-6 s; a loaded machine needs more for the vLLM engine
RUN_WAIT_S = 5.0  # at most this long for cancelled runs to end
SERVER_STOP_S = 6.0  # at most this long for the web server to stop (gradio joins its thread for 5 s)
KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL for leftover processes
SETTLE_S = 2.0  # before the sweep, for processes already on their way out (vLLM SIGKILLs its EngineCore
# after a 5 s grace, and freeing 2 GB takes a moment) to go

_lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it
_runs_changed = threading.Condition(_lock)

_root: str | None = None
_root_pid: int | None = None
_closers: list[tuple[str, Callable[[], Any]]] = []
_server_stops: list[Callable[[], Any]] = []
_runs: dict[int, Callable[[], Any]] = {}
_run_ids = itertools.count(1)

_stopping = threading.Event()  # set when a shutdown starts: new runs are refused
_shutdown_thread: threading.Thread | None = None


class ShuttingDown(RuntimeError):
    """Raised by :func:`register_run` once a shutdown has started."""


log = logging.getLogger(__name__)


def _log(msg: str, level: int = logging.INFO) -> None:
    with contextlib.suppress(Exception):  # may run in a signal handler: never raise from here
        log.log(level, "[ali shutdown] %s", msg)


def timeout_from_env() -> float:
    try:
        v = float(os.environ.get("ALI_SHUTDOWN_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return v if v > 0 else DEFAULT_TIMEOUT_S


# ---- temp folders ------------------------------------------------------------------------------


def temp_root() -> str:
    """This process's temp root (created on first use; a forked child gets its own)."""
    global _root, _root_pid
    with _lock:
        if _root is None or _root_pid != os.getpid():
            _root = os.path.realpath(tempfile.mkdtemp(prefix="ali-app-"))
            _root_pid = os.getpid()
            atexit.register(_atexit_cleanup)
        return _root


def temp_dir(prefix: str) -> str:
    """A new folder (``prefix`` + random) under this process's temp root."""
    if os.sep in prefix or (os.altsep and os.altsep in prefix) or prefix in (".", ".."):
        raise ValueError(f"a temp folder prefix cannot name a path: {prefix!r}")
    return tempfile.mkdtemp(prefix=prefix, dir=temp_root())


def _under_root(path: str) -> str:
    with _lock:
        root = _root if _root_pid == os.getpid() else None
    if root is None:
        raise ValueError(f"not a temp folder of this process (none made yet): {path!r}")
    real = os.path.realpath(path)
    if real == root or os.path.commonpath([root, real]) != root:
        raise ValueError(f"not a temp folder of this process: {path!r}")
    return real


def remove_temp_dir(path: str) -> bool:
    """Remove a folder made by :func:`temp_dir` (anything under the temp root; the root itself
    and anything outside it, symlinks included, are refused with ValueError). Returns whether
    something was removed."""
    real = _under_root(path)
    if not os.path.lexists(real):
        return False
    if os.path.isdir(real) and not os.path.islink(real):
        shutil.rmtree(real, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(real)
    return not os.path.lexists(real)


def remove_temp_root() -> None:
    """Remove this process's temp root and everything under it (a new one is made on the next
    :func:`temp_dir`)."""
    global _root, _root_pid
    with _lock:
        root, pid = _root, _root_pid
        if root is None or pid != os.getpid():
            return
        _root = _root_pid = None
    shutil.rmtree(root, ignore_errors=True)


def _atexit_cleanup() -> None:
    if _root_pid == os.getpid():
        remove_temp_root()


# ---- what to shut down -------------------------------------------------------------------------


def register_closer(name: str, fn: Callable[[], Any]) -> None:
    """Something to close at shutdown: ``fn()`` (sync, or returning an awaitable, which is run
    on a private event loop). Closers run concurrently, each bounded by the time left."""
    with _lock:
        _closers.append((name, fn))


def unregister_closer(name: str) -> None:
    with _lock:
        _closers[:] = [(n, f) for n, f in _closers if n != name]


def register_server_stop(fn: Callable[[], Any]) -> None:
    """The web server's stop (Gradio's ``demo.close``): called after the runs are cancelled,
    before the closers. It also ends ``demo.launch()``'s wait in the main thread."""
    with _lock:
        _server_stops.append(fn)


def register_run(cancel: Any) -> Callable[[], None]:
    """A running agent run: ``cancel`` is a callable or an ``asyncio.Event`` (set on the event
    loop running now, thread-safely). Returns the unregister function (idempotent). Raises
    :class:`ShuttingDown` once a shutdown has started."""
    if isinstance(cancel, asyncio.Event):
        loop = asyncio.get_running_loop()
        event = cancel

        def cancel() -> None:
            loop.call_soon_threadsafe(event.set)

    if not callable(cancel):
        raise TypeError("register_run needs a callable or an asyncio.Event")
    with _lock:
        if _stopping.is_set():
            raise ShuttingDown("the app is shutting down: no new runs")
        rid = next(_run_ids)
        _runs[rid] = cancel

    def unregister() -> None:
        with _lock:
            if _runs.pop(rid, None) is not None:
                _runs_changed.notify_all()

    return unregister


def running_runs() -> int:
    with _lock:
        return len(_runs)


def stopping() -> bool:
    """Whether a shutdown has started."""
    return _stopping.is_set()


# ---- processes ---------------------------------------------------------------------------------


def _is_tracker(cmdline: list[str]) -> bool:
    return any("multiprocessing.resource_tracker" in a or "multiprocessing.forkserver" in a for a in cmdline)


def _descendants() -> list[tuple[int, str, list[str]]]:
    """``(pid, name, cmdline)`` of every living descendant of this process."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with accelerate / vllm
        return _descendants_proc()
    out = []
    try:
        for p in psutil.Process().children(recursive=True):
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                out.append((p.pid, p.name(), p.cmdline()))
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return out


def _descendants_proc() -> list[tuple[int, str, list[str]]]:  # pragma: no cover - no psutil
    kids: dict[int, list[int]] = {}
    info: dict[int, tuple[str, list[str]]] = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            if state == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except (OSError, ValueError):
            continue
        kids.setdefault(int(ppid), []).append(pid)
        info[pid] = (name, cmd)
    out, todo = [], list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        out.append((pid, *info[pid]))
        todo += kids.get(pid, [])
    return out


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child: reap it
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:  # pragma: no cover
        return True
    except Exception:  # noqa: BLE001 - gone meanwhile
        return False


def _signal_all(procs: list[tuple[int, str, list[str]]], sig: int) -> None:
    my_pgid = os.getpgid(0)
    for pid, _, _ in procs:
        with contextlib.suppress(OSError):
            # a child in a session / process group of its own (tool sandboxes): the whole group,
            # grandchildren that outlived it included
            if os.getpgid(pid) == pid and pid != my_pgid:
                os.killpg(pid, sig)
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def kill_children(grace_s: float = KILL_GRACE_S) -> list[dict[str, Any]]:
    """SIGTERM every descendant process (but resource trackers), SIGKILL those still there after
    ``grace_s``; returns what was found: ``{pid, name, how}`` (how: ``SIGTERM``, ``SIGKILL`` or
    ``survived``)."""
    procs = [p for p in _descendants() if not _is_tracker(p[2])]
    if not procs:
        return []
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace_s)
    left = procs
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p[0])]
    how = {p[0]: "SIGTERM" for p in procs}
    if left:
        _signal_all(left, signal.SIGKILL)
        for p in left:
            how[p[0]] = "SIGKILL"
        deadline = time.monotonic() + 2.0
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if _alive(p[0])]
        for p in left:
            how[p[0]] = "survived"
    return [{"pid": pid, "name": name, "how": how[pid]} for pid, name, _ in procs]


# ---- shutdown ----------------------------------------------------------------------------------


def _call_bounded(name: str, fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``fn`` (sync or async) in a daemon thread; the caller joins it with a timeout."""
    res: dict[str, Any] = {"name": name, "status": "timeout"}
    t0 = time.monotonic()

    def target() -> None:
        try:
            r = fn()
            if inspect.isawaitable(r):

                async def wait() -> Any:
                    return await r

                asyncio.run(wait())
            res["status"] = "ok"
        except BaseException as e:  # noqa: BLE001 - reported, never raised from a shutdown
            res["status"] = "error"
            res["error"] = f"{type(e).__name__}: {e}"
        res["seconds"] = round(time.monotonic() - t0, 2)

    th = threading.Thread(target=target, name=f"ali-close-{name}", daemon=True)
    th.start()
    return th, res


def _join_all(threads: list[threading.Thread], until: float) -> None:
    for th in threads:
        th.join(max(0.0, until - time.monotonic()))


def _worker_pools_closer() -> None:
    """Close the worker pools (template renders, Parquet reads) if this process ever made one
    (:func:`backend.runtime.worker_pool.close_all`, looked up at shutdown, so the module is neither
    imported for nothing nor tied to its internals)."""
    mod = sys.modules.get("backend.runtime.worker_pool")
    close_all = getattr(mod, "close_all", None) if mod is not None else None
    if callable(close_all):
        close_all()


def shutdown(timeout_s: float | None = None, *, reason: str = "shutdown") -> dict[str, Any]:
    """Stop everything this process started, within about ``timeout_s`` seconds (default
    ``ALI_SHUTDOWN_TIMEOUT_S`` or 20) plus a few seconds of kill grace. Does not exit; returns a
    report: ``runs_cancelled``, ``runs_left``, ``server``, ``closers`` (name, status ok / error /
    timeout, seconds), ``killed`` (leftover processes), ``clean``, ``seconds``."""
    timeout_s = timeout_from_env() if timeout_s is None else float(timeout_s)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    kill_reserve = min(KILL_GRACE_S + 1.0, timeout_s * 0.25)
    _stopping.set()
    _log(f"{reason}: shutting down (at most {timeout_s:g} s)")
    report: dict[str, Any] = {"reason": reason, "timeout_s": timeout_s}

    # 1. cancel the runs, wait (briefly) for them to end
    with _lock:
        cancels = list(_runs.values())
    for c in cancels:
        with contextlib.suppress(Exception):
            c()
    until = min(t0 + RUN_WAIT_S, deadline - kill_reserve)
    with _lock:
        while _runs and time.monotonic() < until:
            _runs_changed.wait(max(0.01, until - time.monotonic()))
        report["runs_cancelled"], report["runs_left"] = len(cancels), len(_runs)
    if cancels:
        _log(f"cancelled {len(cancels)} running run(s); {report['runs_left']} still running")

    # 2. stop the web server (no new connections; ends launch()'s wait in the main thread)
    with _lock:
        stops = list(_server_stops)
    if stops:
        threads, results = zip(*[_call_bounded("server", f) for f in stops])
        _join_all(list(threads), min(time.monotonic() + SERVER_STOP_S, deadline - kill_reserve))
        report["server"] = [r["status"] for r in results]

    # 3. the closers, all at once, until the time left before the kill reserve
    with _lock:
        closers = list(_closers)
    started = [_call_bounded(n, f) for n, f in closers]
    _join_all([th for th, _ in started], deadline - kill_reserve)
    report["closers"] = [dict(r) for _, r in started]
    for r in report["closers"]:
        if r["status"] != "ok":
            _log(f"closer {r['name']!r}: {r['status']} {r.get('error', '')}".rstrip(), logging.WARNING)

    # 4. whatever is still running, once what is already exiting has gone
    settle_until = min(time.monotonic() + SETTLE_S, deadline - 1.0)
    while time.monotonic() < settle_until and any(not _is_tracker(p[2]) for p in _descendants()):
        time.sleep(0.05)
    report["killed"] = kill_children(max(0.5, min(KILL_GRACE_S, deadline - time.monotonic() - 1.0)))
    if report["killed"]:
        _log("leftover processes stopped: " + ", ".join(f"{k['pid']} {k['name']} ({k['how']})" for k in report["killed"]),
             logging.WARNING)

    # 5. temp files
    remove_temp_root()
    report["seconds"] = round(time.monotonic() - t0, 2)
    report["clean"] = (report["runs_left"] == 0 and all(s == "ok" for s in report.get("server", []))
                       and all(r["status"] == "ok" for r in report["closers"]) and not report["killed"])
    _log(f"done in {report['seconds']:.1f} s ({'clean' if report['clean'] else 'not clean'})",
         logging.INFO if report["clean"] else logging.WARNING)
    return report


def _exit_now(code: int) -> None:
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(code)


def _run_atexit(bound_s: float) -> None:
    """The interpreter's atexit handlers (other modules' clean-ups: vLLM's IPC folder, ...), in a
    daemon thread bounded by ``bound_s``: ``os._exit`` skips them."""
    th = threading.Thread(target=atexit._run_exitfuncs, name="ali-atexit", daemon=True)
    th.start()
    th.join(bound_s)


def _shutdown_and_exit(timeout_s: float, reason: str) -> None:
    code = 1
    try:
        report = shutdown(timeout_s, reason=reason)
        code = 0 if report["clean"] else 1
        _run_atexit(1.5)
    finally:
        _exit_now(code)


def _watchdog(bound_s: float) -> None:
    time.sleep(bound_s)
    _log(f"not finished after {bound_s:g} s: killing what is left and exiting", logging.WARNING)
    _force_exit()


def _force_exit() -> None:
    with contextlib.suppress(Exception):
        procs = [p for p in _descendants() if not _is_tracker(p[2])]
        _signal_all(procs, signal.SIGKILL)
    with contextlib.suppress(Exception):
        remove_temp_root()
    _exit_now(1)


def start_shutdown(reason: str = "shutdown", timeout_s: float | None = None) -> bool:
    """Start the shutdown in a thread of its own that ends the process (``os._exit``); returns
    False if one has already started."""
    global _shutdown_thread
    with _lock:
        if _shutdown_thread is not None:
            return False
        t = timeout_from_env() if timeout_s is None else float(timeout_s)
        _stopping.set()
        _shutdown_thread = threading.Thread(target=_shutdown_and_exit, args=(t, reason), name="ali-shutdown", daemon=True)
        _shutdown_thread.start()
        threading.Thread(target=_watchdog, args=(t + KILL_GRACE_S + 5.0,), name="ali-shutdown-watchdog", daemon=True).start()
        return True


def _on_signal(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if not start_shutdown(reason=name):
        _log(f"{name} again: exiting now")
        _force_exit()


def install_signal_handlers(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> bool:
    """Handle ``signals`` with a bounded shutdown (a second one exits at once). Call from the
    main thread; returns False elsewhere (handlers can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for s in signals:
        signal.signal(s, _on_signal)
    return True


def wait_for_shutdown() -> None:
    """For the main thread once the web server's blocking call returns: if a shutdown is under
    way, wait for it to end the process; otherwise run one now and exit."""
    if _shutdown_thread is None:
        start_shutdown(reason="server stopped")
    while True:  # the shutdown thread ends the process; short sleeps let a second signal in
        time.sleep(0.2)


def install_app(model_close: Callable[[], Any] | None = None) -> None:
    """What app.py calls once its context is built: the model service's close and the worker
    pools (templates, Parquet) as closers, and the SIGTERM / SIGINT handlers."""
    if model_close is not None:
        register_closer("model", model_close)
    register_closer("worker pools", _worker_pools_closer)
    install_signal_handlers()
