"""Render untrusted chat templates in worker processes with a time, size and memory limit.

Jinja's sandbox (transformers renders with ``ImmutableSandboxedEnvironment``) blocks attribute
tricks such as ``__class__``/``__globals__``, but not a template that loops for hours or
renders 100 MB. A template typed into the app or passed as a file is therefore rendered by a
small pool of long-lived worker processes (``ALI_TEMPLATE_WORKERS``, default 2), so one
visitor's endless loop holds one worker, not every visitor's render:

* a worker imports transformers, renders a warm-up template and then says "ready"; only a
  ready worker is handed a request, so start-up (seconds) is never charged to a template. Its
  start-up has its own limit (``ALI_TEMPLATE_START_TIMEOUT_S``, default 60);
* a render's time limit (``ALI_TEMPLATE_TIMEOUT_S``, default 5) counts from the moment the
  request is sent to a ready worker; a worker that overruns is killed and a replacement starts
  in the background at once, so the next visitor does not wait for its start-up;
* a render waits at most ``ALI_TEMPLATE_QUEUE_TIMEOUT_S`` seconds (default 30) for a free
  worker, then is refused ("all N template workers are busy; try again");
* the worker refuses to send back more than ``ALI_TEMPLATE_MAX_CHARS`` characters (default
  20 M) and runs under an address-space limit (``ALI_TEMPLATE_MEMORY_BYTES``, default 4 GiB).

Workers start with the first untrusted render (not at import); :meth:`TemplatePool.close`
stops them all (the app calls it on SIGTERM) and a later render starts the pool again. The
worker renders with transformers' own ``render_jinja_template`` and the tokenizer's special
tokens, exactly as ``apply_chat_template`` does.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing as mp
import os
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_TIMEOUT_S", "5"))
MAX_CHARS = int(os.environ.get("ALI_TEMPLATE_MAX_CHARS", str(20_000_000)))
MEMORY_BYTES = int(os.environ.get("ALI_TEMPLATE_MEMORY_BYTES", str(4 << 30)))
WORKERS = max(1, int(os.environ.get("ALI_TEMPLATE_WORKERS", "2")))
START_TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_START_TIMEOUT_S", "60"))
QUEUE_TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_QUEUE_TIMEOUT_S", "30"))

_CLOSE_JOIN_S = 3.0  # close(): how long workers get to exit on their own before they are killed


class TemplateGuardError(RuntimeError):
    """The template overran a limit, the worker crashed, or no worker was free."""


def _exit_with_parent(parent_pid: int) -> None:  # a thread in the child
    # a worker stuck in an endless template would outlive a parent that died without close()
    # (SIGKILL, crash); the loop holds the GIL only for a switch interval at a time
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _worker(conn, max_chars: int, memory_bytes: int, parent_pid: int | None = None) -> None:  # runs in the child
    if parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
    from transformers.utils.chat_template_utils import render_jinja_template

    # warm-up (imports jinja2 and builds the environment) before saying ready, so the first
    # request's time limit covers only its own template
    render_jinja_template(conversations=[[{"role": "user", "content": "hi"}]], chat_template="{{ messages[0].content }}")
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
            _answer(conn, req, render_jinja_template, max_chars, memory_bytes)
        except OSError:  # the parent is gone
            return


def _answer(conn, req: dict[str, Any], render_jinja_template, max_chars: int, memory_bytes: int) -> None:
    try:
        rendered, _ = render_jinja_template(
            conversations=[req["messages"]],
            tools=req["tools"],
            chat_template=req["template"],
            add_generation_prompt=req["add_generation_prompt"],
            **req["kwargs"],
        )
        text = rendered[0]
        if len(text) > max_chars:
            conn.send(("limit", f"the template rendered {len(text):,} characters; the limit is {max_chars:,}"))
        else:
            conn.send(("ok", text))
    except MemoryError:
        conn.send(("limit", f"the template used more than {memory_bytes >> 20} MB of memory"))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as text
        from backend.template_errors import template_error_text

        conn.send(("error", template_error_text(e)))  # with the template line it failed on


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


class TemplatePool:
    """A fixed-size pool of template workers. All bookkeeping is under ``self._cond``; process
    start-up, joins and renders happen outside it."""

    def __init__(self, size: int = WORKERS, *, timeout_s: float = TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S, max_chars: int = MAX_CHARS,
                 memory_bytes: int = MEMORY_BYTES) -> None:
        self.size = max(1, int(size))
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self.max_chars = max_chars
        self.memory_bytes = memory_bytes
        self._cond = threading.Condition(threading.Lock())
        self._close_lock = threading.Lock()  # one close() at a time; a second waits for the first
        self._workers: list[_Worker] = []  # live: starting, idle or busy
        self._idle: collections.deque[_Worker] = collections.deque()
        self._threads: set[threading.Thread] = set()  # starters and reapers, joined by close()
        self._start_error: str | None = None  # why the last start-up failed (None after a success)
        self._generation = 0  # bumped by close(); a render that began before it is refused
        self._serial = 0

    # ---- bookkeeping (caller holds self._cond) ------------------------------------------------

    def _spawn_thread(self, target, *args) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._cond:
                    self._threads.discard(threading.current_thread())

        t = threading.Thread(target=run, daemon=True, name=f"ali-template-pool-{target.__name__}")
        self._threads.add(t)
        t.start()

    def _fill(self) -> None:
        """Start workers (in the background) until the pool has its size."""
        while len(self._workers) < self.size:
            self._serial += 1
            w = _Worker(f"ali-template-worker-{self._serial}")
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
            self._fill()
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
            proc = ctx.Process(target=_worker, args=(child, self.max_chars, self.memory_bytes, os.getpid()), daemon=True, name=w.name)
            proc.start()
            child.close()
        except Exception as e:  # noqa: BLE001 - reported to the render that waits for a worker
            with self._cond:
                self._start_error = f"cannot start the template worker: {type(e).__name__}: {e}"
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
                error = f"the template worker did not start within {self.start_timeout_s:g} s"
            else:
                ready = parent.recv()[0] == "ready"
        except (EOFError, OSError):
            pass
        if not ready and error is None:
            proc.join(timeout=1)
            error = f"the template worker exited during start-up (exit code {proc.exitcode})"
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
                self._retire(w, kill=True, replace=False)  # no endless restarts: the next render refills
                parent.close()

    @staticmethod
    def _reap(proc: mp.process.BaseProcess) -> None:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)

    # ---- a render ------------------------------------------------------------------------------

    def _acquire(self) -> tuple[_Worker, int]:
        deadline = time.monotonic() + self.queue_timeout_s
        with self._cond:
            self._fill()
            generation = self._generation
            while True:
                if self._generation != generation:
                    raise TemplateGuardError("the template renderer was shut down; try again")
                while self._idle:
                    w = self._idle.popleft()
                    if w.proc is not None and w.proc.is_alive():
                        w.state = "busy"
                        return w, generation
                    self._retire(w, kill=False, replace=True)  # died while idle
                starting = any(w.state == "starting" for w in self._workers)
                busy = any(w.state == "busy" for w in self._workers)
                if not starting and not busy:  # every start-up failed
                    raise TemplateGuardError(self._start_error or "no template worker could be started")
                now = time.monotonic()
                if not starting and now >= deadline:
                    who = "the template worker is" if self.size == 1 else f"all {self.size} template workers are"
                    raise TemplateGuardError(f"{who} busy; try again")
                # while a worker is starting, its own start-up limit bounds the wait
                self._cond.wait(max(0.01, deadline - now) if not starting else 1.0)

    def render(self, template: str, messages: Any, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any],
               timeout_s: float | None = None) -> str:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        req = {"template": template, "messages": messages, "tools": tools,
               "add_generation_prompt": add_generation_prompt, "kwargs": kwargs}
        try:  # pickled before a worker is taken: bad input costs no worker
            payload = ForkingPickler.dumps(req)
        except Exception as e:  # noqa: BLE001
            raise TemplateGuardError(f"cannot send the conversation to the template worker: {e}") from e
        w, generation = self._acquire()
        conn = w.conn
        assert conn is not None
        try:
            conn.send_bytes(payload)
            # the time limit counts from here: the worker is ready and has the request
            if not conn.poll(timeout_s):
                with self._cond:
                    self._retire(w, kill=True, replace=self._generation == generation)
                raise TemplateGuardError(f"the template did not finish rendering within {timeout_s:g} s; it was stopped")
            status, result = conn.recv()
        except TemplateGuardError:
            conn.close()
            raise
        except (EOFError, OSError) as e:
            with self._cond:
                closed = self._generation != generation
                self._retire(w, kill=True, replace=not closed)
            conn.close()
            if closed:
                raise TemplateGuardError("the template renderer was shut down while rendering; try again") from None
            raise TemplateGuardError("the template worker crashed (out of memory?) while rendering") from e
        except BaseException:  # anything else (KeyboardInterrupt, a bad answer): the worker's state is unknown
            with self._cond:
                self._retire(w, kill=True, replace=self._generation == generation)
            conn.close()
            raise
        with self._cond:
            if w.retired:  # close() ran while we rendered; the answer is still good
                conn.close()
            else:
                w.state = "idle"
                self._idle.append(w)
                self._cond.notify_all()
        if status == "ok":
            return result
        if status == "limit":
            raise TemplateGuardError(result)
        raise ValueError(result)

    # ---- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker (idle ones are asked to exit, then all are joined with a bounded
        wait and killed if still alive). Idempotent and thread-safe; a later render starts the
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
            deadline = time.monotonic() + _CLOSE_JOIN_S
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
        """Start the pool's workers now instead of at the first render; with ``wait``, wait
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


GUARD = TemplatePool()
atexit.register(GUARD.close)  # before multiprocessing's own exit hook (atexit runs last-in first-out)


def guarded_render(template: str, messages: Any, tools: Any, *, add_generation_prompt: bool,
                   kwargs: dict[str, Any], timeout_s: float | None = None) -> str:
    return GUARD.render(template, messages, tools, add_generation_prompt, kwargs, timeout_s)
