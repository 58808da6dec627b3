"""Running a tool's code under a deadline: blocking code on its own daemon thread, coroutines as
their own task. Each returns ``(status, value)``: ``(OK, value)``, ``(RAISED, exception)`` or
``(TIMEOUT, None)``, and never raises what the tool raised."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import threading
from collections.abc import Callable
from typing import Any

OK, RAISED, TIMEOUT = "ok", "raised", "timeout"


def timeout_arg(t: float | None) -> float | None:
    """A timeout in seconds as ``asyncio.wait`` takes it: None (no limit) for None or infinity."""
    if t is None or (isinstance(t, float) and math.isinf(t)):
        return None
    return max(0.0, float(t))


async def run_blocking(fn: Callable[[], Any], timeout_s: float | None, *, ctx: contextvars.Context | None = None,
                       thread_name: str = "tool") -> tuple[str, Any]:
    """Run ``fn()`` on a new daemon thread; ``("ok", value)``, ``("raised", exc)`` or
    ``("timeout", None)``. Any BaseException from ``fn`` (SystemExit included) is returned,
    not raised. On timeout the thread is abandoned (threads cannot be killed)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    ctx = ctx or contextvars.copy_context()

    def deliver(outcome: tuple[str, Any]) -> None:
        if not fut.done():
            fut.set_result(outcome)

    def target() -> None:
        try:
            outcome = (OK, ctx.run(fn))
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: reported
            outcome = (RAISED, e)
        with contextlib.suppress(RuntimeError):  # the loop may be gone
            loop.call_soon_threadsafe(deliver, outcome)

    threading.Thread(target=target, name=thread_name, daemon=True).start()
    done, _ = await asyncio.wait({fut}, timeout=timeout_arg(timeout_s))
    if not done:
        return "timeout", None
    return fut.result()


async def run_coroutine(make: Callable[[], Any], timeout_s: float | None, *,
                        ctx: contextvars.Context | None = None) -> tuple[str, Any]:
    """Await ``make()`` (a coroutine) as its own task under a deadline. Exceptions, SystemExit
    included, are returned; KeyboardInterrupt propagates (it may be a real Ctrl-C on the loop
    thread). On timeout the task is cancelled but not awaited, so a tool that swallows the
    cancellation cannot hang the caller."""

    async def guarded() -> tuple[str, Any]:
        try:
            return OK, await make()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001
            return RAISED, e

    loop = asyncio.get_running_loop()
    task = loop.create_task(guarded(), context=ctx) if ctx is not None else loop.create_task(guarded())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_arg(timeout_s))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        return "timeout", None
    if task.cancelled():  # the tool cancelled itself
        return RAISED, asyncio.CancelledError("the tool's task was cancelled")
    return task.result()


def _consume(task: asyncio.Task) -> None:
    with contextlib.suppress(BaseException):
        task.exception()
