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
  worker, then is refused ("all N template workers are busy; try again"); a caller that must
  bound the waits of all its renders together (an MCP call: one bound from its admission, its
  own queue included) runs them inside :func:`wait_budget`;
* the worker refuses to send back more than ``ALI_TEMPLATE_MAX_CHARS`` characters (default
  20 M) and runs under an address-space limit (``ALI_TEMPLATE_MEMORY_BYTES``, default 4 GiB).

The pool is a :class:`backend.runtime.worker_pool.WorkerPool` (shared with the Parquet reader's). Workers
start with the first untrusted render (not at import); :meth:`TemplatePool.close` stops them all
(the app calls it on SIGTERM) and a later render starts the pool again. The worker renders with transformers' own ``render_jinja_template`` and the tokenizer's special
tokens, exactly as ``apply_chat_template`` does.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

from backend.runtime.worker_pool import Lost, Overrun, WorkerPool

TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_TIMEOUT_S", "5"))
MAX_CHARS = int(os.environ.get("ALI_TEMPLATE_MAX_CHARS", str(20_000_000)))
MEMORY_BYTES = int(os.environ.get("ALI_TEMPLATE_MEMORY_BYTES", str(4 << 30)))
WORKERS = max(1, int(os.environ.get("ALI_TEMPLATE_WORKERS", "2")))
START_TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_START_TIMEOUT_S", "60"))
QUEUE_TIMEOUT_S = float(os.environ.get("ALI_TEMPLATE_QUEUE_TIMEOUT_S", "30"))


class TemplateGuardError(RuntimeError):
    """The template overran a limit, the worker crashed, or no worker was free."""


def _setup(max_chars: int, memory_bytes: int):  # runs in the child, before it says ready
    from transformers.utils.chat_template_utils import render_jinja_template

    # warm-up (imports jinja2 and builds the environment) before saying ready, so the first
    # request's time limit covers only its own template
    render_jinja_template(conversations=[[{"role": "user", "content": "hi"}]], chat_template="{{ messages[0].content }}")
    return functools.partial(_answer, render_jinja_template=render_jinja_template, max_chars=max_chars,
                             memory_bytes=memory_bytes)


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
        from backend.tokens.template_errors import template_error_text

        conn.send(("error", template_error_text(e)))  # with the template line it failed on


class WaitBudget:
    """Seconds a caller may still wait for template workers, over all its renders together."""

    def __init__(self, seconds: float) -> None:
        self.left = float(seconds)

    def spend(self, seconds: float) -> None:
        self.left = max(0.0, self.left - max(0.0, seconds))


_BUDGET: contextvars.ContextVar[WaitBudget | None] = contextvars.ContextVar("ali_template_wait_budget", default=None)


@contextlib.contextmanager
def wait_budget(budget: WaitBudget) -> Iterator[WaitBudget]:
    """Renders in this context (this thread, this task) wait for a free worker at most what is
    left of ``budget`` in all, each also at most the pool's ``queue_timeout_s``; what they wait
    is taken off it."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


class TemplatePool(WorkerPool):
    """A fixed-size pool of template workers (:class:`backend.runtime.worker_pool.WorkerPool`)."""

    def __init__(self, size: int = WORKERS, *, timeout_s: float = TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S, max_chars: int = MAX_CHARS,
                 memory_bytes: int = MEMORY_BYTES) -> None:
        super().__init__(size, kind="template", noun="template worker", service="template renderer",
                         error=TemplateGuardError, setup=_setup, setup_args=(max_chars, memory_bytes),
                         timeout_s=timeout_s, start_timeout_s=start_timeout_s, queue_timeout_s=queue_timeout_s,
                         memory_bytes=memory_bytes)
        self.max_chars = max_chars

    def render(self, template: str, messages: Any, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any],
               timeout_s: float | None = None) -> str:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        req = {"template": template, "messages": messages, "tools": tools,
               "add_generation_prompt": add_generation_prompt, "kwargs": kwargs}
        try:  # pickled before a worker is taken: bad input costs no worker
            payload = ForkingPickler.dumps(req)
        except Exception as e:  # noqa: BLE001
            raise TemplateGuardError(f"cannot send the conversation to the template worker: {e}") from e
        budget = _BUDGET.get()
        asked = time.monotonic()
        try:
            lease = self.lease(None if budget is None else budget.left)
        finally:
            if budget is not None:
                budget.spend(time.monotonic() - asked)
        with lease:
            try:
                lease.send_bytes(payload)
                # the time limit counts from here: the worker is ready and has the request
                status, result = lease.recv(timeout_s)
            except Overrun:
                raise TemplateGuardError(f"the template did not finish rendering within {timeout_s:g} s; it was stopped") from None
            except Lost as e:
                if e.closed:
                    raise TemplateGuardError("the template renderer was shut down while rendering; try again") from None
                raise TemplateGuardError("the template worker crashed (out of memory?) while rendering") from e
        if status == "ok":
            return result
        if status == "limit":
            raise TemplateGuardError(result)
        raise ValueError(result)


GUARD = TemplatePool()  # closed at exit and at the app's shutdown (backend.runtime.worker_pool.close_all)


def guarded_render(template: str, messages: Any, tools: Any, *, add_generation_prompt: bool,
                   kwargs: dict[str, Any], timeout_s: float | None = None) -> str:
    return GUARD.render(template, messages, tools, add_generation_prompt, kwargs, timeout_s)
