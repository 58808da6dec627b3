"""Python functions as tools, run in this process (trusted code).

Async functions are awaited on the event loop; blocking ones run on a fresh daemon thread, so a
hung tool never blocks the loop or a shared executor (the thread cannot be killed; it is left
behind). What a tool prints is captured per call (``ToolResult.stdout``) while other output goes
to the real stdout.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.tools._runtime import clean_text, to_content
from backend.tools.base import Tool, ToolLoadError
from backend.tools.deadline import OK, RAISED, run_blocking, run_coroutine, timeout_arg
from backend.tools.outcome import CallOptions, Outcome, bad_result_outcome, exception_outcome, safe_str, timeout_outcome

MAX_STDOUT_CHARS = 64 * 1024  # captured print() output of an in-process tool


# ---- stdout capture for in-process tools ----------------------------------------------------

_capture: contextvars.ContextVar[_StdoutCapture | None] = contextvars.ContextVar("ali_tool_stdout", default=None)
_route_lock = threading.Lock()
_route_count = 0
_route_saved: Any = None


class _StdoutCapture:
    def __init__(self, cap: int = MAX_STDOUT_CHARS):
        self.cap = cap
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self.lock:
            self.total += len(s)
            room = self.cap - self.kept
            if room > 0:
                piece = s[:room]
                self.parts.append(piece)
                self.kept += len(piece)
        return len(s)

    def text(self) -> str | None:
        if not self.total:
            return None
        s = "".join(self.parts)
        if self.total > self.kept:
            s += f"\n...({self.total - self.kept} more characters not kept)"
        return clean_text(s)[0]


class _RoutedStdout:
    """Stands in for sys.stdout while tools run: writes from a tool's context go to its capture,
    everything else to the real stream."""

    def __init__(self, base: Any):
        self._base = base

    def write(self, s: str) -> int:
        cap = _capture.get()
        if cap is None:
            return self._base.write(s)
        return cap.write(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _capture.get() is None:
            with contextlib.suppress(Exception):
                self._base.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


@contextlib.contextmanager
def _stdout_routing():
    global _route_count, _route_saved
    with _route_lock:
        if not isinstance(sys.stdout, _RoutedStdout):
            _route_saved = sys.stdout
            sys.stdout = _RoutedStdout(sys.stdout)
        _route_count += 1
    try:
        yield
    finally:
        with _route_lock:
            _route_count -= 1
            if _route_count == 0 and isinstance(sys.stdout, _RoutedStdout) and sys.stdout._base is _route_saved:
                sys.stdout = _route_saved
                _route_saved = None


# ---- the tool ---------------------------------------------------------------------------------


def schema_from_function(fn: Callable) -> dict[str, Any]:
    """The schema transformers' ``apply_chat_template(tools=[fn])`` would build for ``fn``."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", repr(fn))
    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers raises several types
        line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
        where = f" (line {line})" if line else ""
        raise ToolLoadError(
            f"cannot build a schema for function '{name}'{where}: {str(e).rstrip('. ')}. A tool function needs a docstring with a "
            "description and an Args: section describing every argument, and a type hint on every argument"
        ) from None


class FunctionTool(Tool):
    """A Python function run in this process."""

    kind = "function"

    def __init__(self, fn: Callable, schema: Any = None, *, source: str | None = None, capture_stdout: bool = True):
        if not callable(fn):
            raise ToolLoadError(f"{fn!r} is not callable")
        super().__init__(schema if schema is not None else schema_from_function(fn), source=source)
        self.fn = fn
        self.capture_stdout = capture_stdout
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None

    def check_arguments(self, arguments: dict[str, Any]) -> list[str]:
        errors = super().check_arguments(arguments)
        if not errors and self._signature is not None:
            try:
                self._signature.bind(**arguments)
            except TypeError as e:
                errors.append(str(e))
        return errors

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        cap = _StdoutCapture() if self.capture_stdout else None
        ctx = contextvars.copy_context()
        if cap is not None:
            ctx.run(_capture.set, cap)
        deadline = None if timeout_arg(options.timeout_s) is None else time.monotonic() + timeout_arg(options.timeout_s)

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with _stdout_routing() if cap is not None else contextlib.nullcontext():
            if self.is_async:
                status, value = await run_coroutine(lambda: self.fn(**arguments), options.timeout_s, ctx=ctx)
                if status == OK and not isinstance(value, str):
                    # conversion (json.dumps, a user __str__) runs off the loop, under the same deadline
                    status, value = await run_blocking(lambda v=value: _convert(v), remaining(), ctx=ctx,
                                                       thread_name=f"tool-{self.name}")
            else:

                def call() -> Any:
                    r = self.fn(**arguments)
                    if inspect.isawaitable(r):
                        return _Awaitable(r)
                    return _convert(r)

                status, value = await run_blocking(call, options.timeout_s, ctx=ctx, thread_name=f"tool-{self.name}")
                if status == OK and isinstance(value, _Awaitable):
                    async def again():
                        return await value.aw

                    status, value = await run_coroutine(again, remaining(), ctx=ctx)
                    if status == OK:
                        status, value = await run_blocking(lambda v=value: _convert(v), remaining(), ctx=ctx)
        if status == "timeout":
            extra = "" if self.is_async else "; the worker thread could not be stopped and was left running"
            return self._finish(timeout_outcome(self.name, options.timeout_s, extra), cap)
        if status == RAISED:
            return self._finish(exception_outcome(self.name, value), cap)
        if isinstance(value, str):
            return self._finish(Outcome(content=clean_text(value)[0]), cap)
        if isinstance(value, _BadResult):
            return self._finish(bad_result_outcome(self.name, value.exc), cap)
        if isinstance(value, _Converted):
            return self._finish(Outcome(content=value.text, note=value.note), cap)
        return self._finish(Outcome(content=safe_str(value)), cap)  # pragma: no cover - not reached

    @staticmethod
    def _finish(out: Outcome, cap: _StdoutCapture | None) -> Outcome:
        if cap is not None:
            out.stdout = cap.text()
        return out


@dataclass
class _Converted:
    text: str
    note: str | None


@dataclass
class _Awaitable:
    aw: Any


@dataclass
class _BadResult:
    exc: BaseException


def _convert(value: Any) -> _Converted | _BadResult:
    try:
        return _Converted(*to_content(value))
    except BaseException as e:  # noqa: BLE001 - a hostile __str__ may raise anything
        return _BadResult(e)
