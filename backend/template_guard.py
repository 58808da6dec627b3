"""Render untrusted chat templates in a worker process with a time, size and memory limit.

Jinja's sandbox (transformers renders with ``ImmutableSandboxedEnvironment``) blocks attribute
tricks such as ``__class__``/``__globals__``, but not a template that loops for hours or
renders 100 MB. A template typed into the app or passed as a file is therefore rendered by a
long-lived worker process: the parent waits at most ``ALI_TEMPLATE_TIMEOUT_S`` seconds (default
5) and kills and replaces the worker when it overruns; the worker refuses to send back more
than ``ALI_TEMPLATE_MAX_CHARS`` characters (default 20 M) and runs under an address-space
limit. The worker renders with transformers' own ``render_jinja_template`` and the
tokenizer's special tokens, exactly as ``apply_chat_template`` does.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from typing import Any

TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_TIMEOUT_S", "5"))
MAX_CHARS = int(os.environ.get("ALI_TEMPLATE_MAX_CHARS", str(20_000_000)))
MEMORY_BYTES = int(os.environ.get("ALI_TEMPLATE_MEMORY_BYTES", str(4 << 30)))


class TemplateGuardError(RuntimeError):
    """The template overran a limit or crashed the worker."""


def _worker(conn, max_chars: int, memory_bytes: int) -> None:  # runs in the child
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
    from transformers.utils.chat_template_utils import render_jinja_template

    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
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
            conn.send(("error", f"{type(e).__name__}: {e}"))


class _Guard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # no inherited state, no forked threads
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, MAX_CHARS, MEMORY_BYTES), daemon=True, name="ali-template-worker")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None
        self._started_ok = False

    def render(self, template: str, messages: Any, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any],
               timeout_s: float | None = None) -> str:
        timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._kill()
                self._start()
            assert self._conn is not None
            try:
                self._conn.send({"template": template, "messages": messages, "tools": tools,
                                 "add_generation_prompt": add_generation_prompt, "kwargs": kwargs})
            except Exception as e:  # unpicklable input, or the worker died
                self._kill()
                raise TemplateGuardError(f"cannot send the conversation to the template worker: {e}") from e
            # the first call includes the worker's start-up (importing transformers)
            if not self._conn.poll(timeout_s + 30 if self._first_call() else timeout_s):
                self._kill()
                raise TemplateGuardError(f"the template did not finish rendering within {timeout_s:g} s; it was stopped")
            try:
                status, payload = self._conn.recv()
            except (EOFError, OSError):
                self._kill()
                raise TemplateGuardError("the template worker crashed (out of memory?) while rendering") from None
            self._started_ok = True
            if status == "ok":
                return payload
            if status == "limit":
                raise TemplateGuardError(payload)
            raise ValueError(payload)

    _started_ok = False

    def _first_call(self) -> bool:
        return not self._started_ok

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(None)
                except Exception:
                    pass
            self._kill()


GUARD = _Guard()


def guarded_render(template: str, messages: Any, tools: Any, *, add_generation_prompt: bool,
                   kwargs: dict[str, Any], timeout_s: float | None = None) -> str:
    return GUARD.render(template, messages, tools, add_generation_prompt, kwargs, timeout_s)
