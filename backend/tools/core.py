"""Tool kinds and how each one runs.

A :class:`Tool` has a schema (what the model sees), validates arguments against its
``parameters`` with jsonschema, and runs through :meth:`Tool.invoke`, which returns an
:class:`Outcome` and never raises (except ``asyncio.CancelledError``). The registry
(:mod:`backend.tools.registry`) turns outcomes into :class:`~backend.trace.ToolResult`.

Kinds:

* :class:`FunctionTool`: a Python callable in this process (trusted code). Async functions
  are awaited on the event loop; blocking ones run on a fresh daemon thread, so a hung tool
  never blocks the loop or a shared executor (the thread cannot be killed; it is left behind).
* :class:`MockTool`: a JSON schema with a ``"mock"`` result (:mod:`backend.tools.mock`).
* :class:`VerlTool`: an instance of a verl ``BaseTool``-like class (duck-typed
  ``create``/``execute``/``release``).
* :class:`SandboxedTool`: user-typed code run in a fresh limited subprocess per call
  (:mod:`backend.tools.sandbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import inspect
import json
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.tools._runtime import clean_text, to_content
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.mock import MissingArgument, Mock, MockError

MAX_DETAIL_CHARS = 20_000  # tracebacks kept in error_detail
MAX_MESSAGE_CHARS = 2_000  # exception messages quoted in the content the model sees
MAX_STDOUT_CHARS = 64 * 1024  # captured print() output of an in-process tool


class ToolLoadError(ValueError):
    """Tools could not be loaded or defined; the message says what and where."""


# ---- outcomes ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one invocation produced, before it becomes a ToolResult."""

    content: str | None = None  # the text (ok) or the error message (not ok)
    error: str | None = None  # None when ok; else unknown_tool, invalid_arguments, exception, timeout, bad_result, crashed
    detail: str | None = None
    stdout: str | None = None
    note: str | None = None
    reward: float | None = None
    metrics: dict[str, Any] | None = None
    truncated: bool = False  # already truncated (by the sandbox child)
    original_length: int | None = None
    extra: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class CallOptions:
    timeout_s: float | None = 30.0
    max_response_length: int | None = None
    truncate_side: str = "middle"


def safe_str(obj: Any, limit: int = MAX_MESSAGE_CHARS) -> str:
    try:
        s = str(obj)
        if not isinstance(s, str):
            raise TypeError
    except BaseException:  # noqa: BLE001 - a hostile __str__
        s = f"<unprintable {type(obj).__name__}>"
    s = clean_text(s)[0]
    return s if len(s) <= limit else s[:limit] + "...(truncated)"


def format_traceback(e: BaseException) -> str:
    try:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except BaseException:  # noqa: BLE001
        tb = f"{type(e).__name__}: {safe_str(e)}"
    tb = clean_text(tb)[0]
    return tb if len(tb) <= MAX_DETAIL_CHARS else "...(truncated)...\n" + tb[-MAX_DETAIL_CHARS:]


def exception_outcome(name: str, e: BaseException) -> Outcome:
    if isinstance(e, SystemExit):
        msg = f"Error: tool '{name}' called sys.exit({safe_str(e.code, 200) if e.code is not None else ''})"
    else:
        text = safe_str(e)
        msg = f"Error: tool '{name}' raised {type(e).__name__}" + (f": {text}" if text else "")
    return Outcome(content=msg, error="exception", detail=format_traceback(e))


def timeout_outcome(name: str, timeout_s: float | None, extra: str = "") -> Outcome:
    return Outcome(content=f"Error: tool '{name}' timed out after {_fmt_s(timeout_s)}", error="timeout",
                   detail=f"no result within {_fmt_s(timeout_s)}{extra}")


def bad_result_outcome(name: str, e: BaseException) -> Outcome:
    return Outcome(
        content=f"Error: tool '{name}' returned a result that cannot be turned into text ({type(e).__name__}: {safe_str(e, 300)})",
        error="bad_result", detail=format_traceback(e),
    )


def _fmt_s(t: float | None) -> str:
    return "no limit" if t is None else f"{t:g} s"


def _timeout_arg(t: float | None) -> float | None:
    if t is None or (isinstance(t, float) and math.isinf(t)):
        return None
    return max(0.0, float(t))


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


# ---- running in-process code under a deadline ------------------------------------------------

_OK, _RAISED = "ok", "raised"


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
            outcome = (_OK, ctx.run(fn))
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: reported
            outcome = (_RAISED, e)
        with contextlib.suppress(RuntimeError):  # the loop may be gone
            loop.call_soon_threadsafe(deliver, outcome)

    threading.Thread(target=target, name=thread_name, daemon=True).start()
    done, _ = await asyncio.wait({fut}, timeout=_timeout_arg(timeout_s))
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
            return _OK, await make()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001
            return _RAISED, e

    loop = asyncio.get_running_loop()
    task = loop.create_task(guarded(), context=ctx) if ctx is not None else loop.create_task(guarded())
    try:
        done, _ = await asyncio.wait({task}, timeout=_timeout_arg(timeout_s))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        return "timeout", None
    if task.cancelled():  # the tool cancelled itself
        return _RAISED, asyncio.CancelledError("the tool's task was cancelled")
    return task.result()


def _consume(task: asyncio.Task) -> None:
    with contextlib.suppress(BaseException):
        task.exception()


# ---- tools ----------------------------------------------------------------------------------


def normalize_schema(schema: Any, where: str = "tool") -> dict[str, Any]:
    """A tool schema as ``{"type": "function", "function": {...}}`` (the ``mock`` key removed).

    Accepts that form, the flat form ``{"name": ..., "parameters": ...}`` and pydantic models."""
    if hasattr(schema, "model_dump") and not isinstance(schema, dict):
        schema = schema.model_dump(exclude_unset=True, exclude_none=True)
    if not isinstance(schema, dict):
        raise ToolLoadError(f"{where}: a tool schema must be an object, got {type(schema).__name__}")
    schema = copy.deepcopy(schema)
    schema.pop("mock", None)
    if "function" in schema:
        if schema.get("type", "function") != "function":
            raise ToolLoadError(f"{where}: only \"type\": \"function\" tools are supported, got {schema.get('type')!r}")
        schema.setdefault("type", "function")
        fn = schema["function"]
    elif "name" in schema:
        fn = schema
        schema = {"type": "function", "function": fn}
    else:
        raise ToolLoadError(f"{where}: a tool schema needs a \"function\" object with a \"name\" (keys found: {', '.join(map(str, schema)) or 'none'})")
    if not isinstance(fn, dict):
        raise ToolLoadError(f"{where}: \"function\" must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolLoadError(f"{where}: the function needs a non-empty string \"name\"")
    if any(c.isspace() for c in name):
        raise ToolLoadError(f"{where}: tool name {name!r} contains whitespace")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ToolLoadError(f"{where}: tool '{name}': \"parameters\" must be a JSON schema object")
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise ToolLoadError(f"{where}: tool '{name}': the schema is not JSON ({e})") from None
    return schema


def _make_validator(params: dict[str, Any], name: str, where: str | None = None):
    """A jsonschema validator for ``params`` (already read by :func:`~backend.tools.dialect.to_json_schema`)."""
    import jsonschema
    from jsonschema.validators import validator_for

    cls = validator_for(params, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(params)
    except jsonschema.SchemaError as e:
        path = "/".join(["parameters", *(str(p) for p in e.absolute_path)])
        msg = e.message if len(e.message) <= 300 else e.message[:300] + "..."
        raise ToolLoadError(
            f"{where + ': ' if where else ''}tool '{name}': its parameters are not a valid JSON schema ({path}: {msg}); "
            f"fix {path}{_schema_fix(e)}"
        ) from None
    return cls(params)


def _schema_fix(e: Any) -> str:
    """A hint for the commonest schema mistakes, after 'fix <path>'."""
    key = e.absolute_path[-1] if e.absolute_path else None
    if key == "required":
        return ': "required" is a list of property names on the object, e.g. "required": ["city"]'
    if key == "properties":
        return ': "properties" maps each parameter name to its schema, e.g. {"city": {"type": "string"}}'
    if key == "enum":
        return ': "enum" is a list of the allowed values'
    return " so that it is valid JSON Schema (https://json-schema.org/understanding-json-schema)"


class Tool:
    """A tool the model can call. Subclasses implement :meth:`_invoke`."""

    kind = "tool"

    def __init__(self, schema: Any, *, source: str | None = None):
        self.schema = normalize_schema(schema, where=source or "tool")
        fn = self.schema["function"]
        self.name: str = fn["name"]
        self.description: str = fn.get("description") or ""
        # as given (rendered, shown); json_parameters is what validation reads (dialect types mapped)
        self.parameters: dict[str, Any] = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {"type": "object", "properties": {}}
        self.source = source
        self.type_mappings: list[TypeMapping]
        try:
            self.json_parameters, self.type_mappings = to_json_schema(self.parameters, tool=self.name)
        except SchemaDialectError as e:
            raise ToolLoadError(f"{source + ': ' if source else ''}tool '{self.name}': {e}") from None
        self._validator = _make_validator(self.json_parameters, self.name, source)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- arguments -----------------------------------------------------------------------
    def check_arguments(self, arguments: dict[str, Any]) -> list[str]:
        """Problems with ``arguments`` (empty when they are valid)."""
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path], e.message))
        out = []
        for e in errors[:5]:
            path = "/".join(str(p) for p in e.absolute_path)
            msg = e.message if len(e.message) <= 300 else e.message[:300] + "..."
            out.append(f"{path}: {msg}" if path else msg)
        if len(errors) > 5:
            out.append(f"and {len(errors) - 5} more problem(s)")
        return out

    def signature_text(self) -> str:
        """Short description of the expected parameters, for error messages."""
        props = self.parameters.get("properties") or {}
        req = set(self.parameters.get("required") or [])
        parts = []
        for k, v in props.items():
            t = v.get("type") if isinstance(v, dict) else None
            t = "|".join(t) if isinstance(t, list) else t
            bits = [b for b in (t, "required" if k in req else None) if b]
            parts.append(f"{k} ({', '.join(bits)})" if bits else k)
        return ", ".join(parts) if parts else "none"

    # -- running -------------------------------------------------------------------------
    async def invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        """Run the tool; never raises except asyncio.CancelledError."""
        try:
            return await self._invoke(arguments, options)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug here must not take the loop down
            out = exception_outcome(self.name, e)
            out.detail = "internal error while running the tool\n" + (out.detail or "")
            return out

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:  # pragma: no cover
        raise NotImplementedError


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
        deadline = None if _timeout_arg(options.timeout_s) is None else time.monotonic() + _timeout_arg(options.timeout_s)

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with _stdout_routing() if cap is not None else contextlib.nullcontext():
            if self.is_async:
                status, value = await run_coroutine(lambda: self.fn(**arguments), options.timeout_s, ctx=ctx)
                if status == _OK and not isinstance(value, str):
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
                if status == _OK and isinstance(value, _Awaitable):
                    async def again():
                        return await value.aw

                    status, value = await run_coroutine(again, remaining(), ctx=ctx)
                    if status == _OK:
                        status, value = await run_blocking(lambda v=value: _convert(v), remaining(), ctx=ctx)
        if status == "timeout":
            extra = "" if self.is_async else "; the worker thread could not be stopped and was left running"
            return self._finish(timeout_outcome(self.name, options.timeout_s, extra), cap)
        if status == _RAISED:
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


def placeholder_text(name: str) -> str:
    """The tool message of a call to a schema tool that has no ``"mock"``."""
    return f"[placeholder result: no \"mock\" is defined for tool '{name}']"


class MockTool(Tool):
    """A JSON-schema tool whose result is a fixed value or a template filled from the arguments.

    A schema with no ``"mock"`` (a plain OpenAI tools list) is a tool too: rendering needs no
    result, and a call to it during a run gets :func:`placeholder_text` as its result, which the
    ToolResult marks (``mock="default"``, a ``note``) and the trace's metadata lists
    (``default_mock_tools``), so a placeholder is never mistaken for a tool's output."""

    kind = "mock"

    def __init__(self, schema: Any, mock: Any = None, *, source: str | None = None, default: bool = False):
        super().__init__(schema, source=source)
        self.default_mock = default
        if default:
            self.mock = Mock("value", placeholder_text(self.name))
            self.mock_spec = None
            return
        try:
            self.mock = Mock.parse(mock, self.parameters)
        except MockError as e:
            raise ToolLoadError(f"{source or 'tool'}: tool '{self.name}': {e}") from None
        self.mock_spec = copy.deepcopy(mock)

    @classmethod
    def from_spec(cls, spec: Any, *, source: str | None = None) -> MockTool:
        """A tool from a schema with an optional ``"mock"`` (none: the placeholder result)."""
        where = source or "tool"
        if not isinstance(spec, dict):
            raise ToolLoadError(f"{where}: a tool must be an object, got {type(spec).__name__}")
        if "mock" not in spec:
            return cls(spec, source=source, default=True)
        return cls(spec, spec["mock"], source=source)

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        if self.default_mock:
            return Outcome(content=self.mock.data, note='placeholder result: the tool\'s schema has no "mock"',
                           extra={"mock": "default"})
        try:
            value = self.mock.render(arguments, self.parameters)
        except MissingArgument as e:
            return Outcome(
                content=f"Error: tool '{self.name}' needs the argument '{e.name}' (its mock result uses it) but it was not given",
                error="invalid_arguments", detail=f"mock template placeholder {{{e.name}}} has no argument and no default",
            )
        try:
            text, note = to_content(value)
        except Exception as e:  # noqa: BLE001
            return bad_result_outcome(self.name, e)
        return Outcome(content=text, note=note)


# ---- verl-style tool classes -----------------------------------------------------------------


def verl_schema_object(schema: dict[str, Any]) -> Any:
    """The schema as the object a verl ``BaseTool.__init__`` expects (``.function.name`` ...):
    verl's own ``OpenAIFunctionToolSchema`` when verl is installed, else an equivalent pydantic
    model that dumps back to exactly ``schema``."""
    try:  # pragma: no cover - verl is not installed in our environments
        from verl.tools.schemas import OpenAIFunctionToolSchema

        return OpenAIFunctionToolSchema.model_validate(schema)
    except Exception:  # noqa: BLE001
        pass
    from backend.tools.verl_compat import FunctionToolSchema

    return FunctionToolSchema.model_validate(schema)


async def _maybe_await(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


class VerlTool(Tool):
    """An instance of a verl ``BaseTool``-like class.

    Each call does what verl's ToolAgentLoop does: ``create()`` an instance, ``execute(
    instance_id, arguments)`` and ``release(instance_id)`` (always, also after an error).
    ``execute`` returns ``(response, reward, metrics)``; the response's ``.text`` (or the
    response itself) becomes the content, the reward goes to ``ToolResult.reward``."""

    kind = "verl"

    def __init__(self, instance: Any, schema: Any = None, *, source: str | None = None):
        if schema is None:
            getter = getattr(instance, "get_openai_tool_schema", None)
            schema = getter() if callable(getter) else getattr(instance, "tool_schema", None)
            if schema is None:
                raise ToolLoadError(f"{source or type(instance).__name__}: the tool has no schema (get_openai_tool_schema() returned None)")
        for m in ("create", "execute"):
            if not callable(getattr(instance, m, None)):
                raise ToolLoadError(f"{source or type(instance).__name__}: a verl tool needs an async {m}() method")
        super().__init__(schema, source=source)
        self.instance = instance

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        inst = self.instance

        async def body():
            created = await _maybe_await(inst.create())
            instance_id = created[0] if isinstance(created, tuple) else created
            try:
                return await _maybe_await(inst.execute(instance_id, arguments))
            finally:
                release = getattr(inst, "release", None)
                if callable(release):
                    await _maybe_await(release(instance_id))

        status, value = await run_coroutine(body, options.timeout_s)
        if status == "timeout":
            return timeout_outcome(self.name, options.timeout_s)
        if status == _RAISED:
            return exception_outcome(self.name, value)
        response, reward, metrics = value, None, None
        if isinstance(value, tuple) and len(value) == 3:
            response, reward, metrics = value
        try:
            text, note = to_content(response)
        except Exception as e:  # noqa: BLE001
            return bad_result_outcome(self.name, e)
        out = Outcome(content=text, note=note)
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            out.reward = float(reward)
        elif reward is not None:
            out.note = ((out.note + "; ") if out.note else "") + f"non-numeric reward {safe_str(reward, 100)} ignored"
        if isinstance(metrics, dict) and metrics:
            try:
                out.metrics = json.loads(json.dumps(metrics, default=str))
            except (TypeError, ValueError, RecursionError):
                out.metrics = {str(k): safe_str(v, 200) for k, v in metrics.items()}
        return out


# ---- sandboxed user code ---------------------------------------------------------------------


class SandboxedTool(Tool):
    """A function from user-typed code, run in a fresh limited subprocess per call."""

    kind = "sandboxed"

    def __init__(self, schema: Any, code: str, function: str, limits: Any, *, filename: str = "<tools>",
                 source: str | None = None):
        super().__init__(schema, source=source)
        self.code = code
        self.function = function
        self.limits = limits
        self.filename = filename

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        from backend.tools.sandbox import run_child

        timeout = _timeout_arg(options.timeout_s)
        timeout = 3600.0 if timeout is None else timeout  # a child never runs unbounded
        request = {
            "mode": "call", "code": self.code, "filename": self.filename, "function": self.function,
            "arguments": arguments, "max_response_length": options.max_response_length,
            "truncate_side": options.truncate_side,
        }
        try:
            run = await run_child(request, self.limits, timeout)
        except OSError as e:
            return Outcome(content=f"Error: tool '{self.name}' could not be started", error="crashed",
                           detail=f"starting the sandbox failed: {e}")
        return outcome_from_child(self.name, run, timeout, self.limits)


def outcome_from_child(name: str, run: Any, timeout_s: float, limits: Any) -> Outcome:
    """Turn a sandbox :class:`~backend.tools.sandbox.ChildRun` into an Outcome."""
    stdout = run.stdout if run.stdout_bytes else None
    stderr_tail = run.stderr[-4000:] if run.stderr else ""
    extra = {"sandbox": {"returncode": run.returncode, "duration_s": round(run.duration_s, 4)}}

    def done(out: Outcome) -> Outcome:
        out.stdout = stdout
        out.extra = extra
        return out

    if run.timed_out:
        if run.notes:
            return done(Outcome(content=f"Error: tool '{name}' could not be started in time", error="crashed",
                                detail="; ".join(run.notes) + "; the sandbox process was killed"))
        return done(timeout_outcome(name, timeout_s, "; the sandbox process was killed"))
    if run.result_too_big:
        return done(Outcome(
            content=f"Error: tool '{name}' returned a result larger than the {limits.max_result_bytes} byte limit",
            error="bad_result", detail=f"the sandbox result pipe carried more than {limits.max_result_bytes} bytes; the process was killed",
        ))
    p = run.payload
    if p is None:
        if run.payload_error:
            return done(Outcome(content=f"Error: tool '{name}' sent back an unreadable result", error="bad_result",
                                detail=run.payload_error + ("\n" + stderr_tail if stderr_tail else "")))
        sig = run.signal_name
        if sig == "SIGXCPU":
            why = f"it used up its CPU time limit ({limits.child_limits(timeout_s)['cpu_s']:g} s)"
        elif sig == "SIGKILL":
            why = "it was killed (SIGKILL), most likely by the CPU time or memory limit"
        elif sig == "SIGSEGV":
            why = "it crashed (segmentation fault)"
        elif sig:
            why = f"it was killed by {sig}"
        else:
            why = f"the process exited with code {run.returncode} without returning a result"
        return done(Outcome(content=f"Error: tool '{name}' crashed: {why}", error="crashed",
                            detail=(why + ("\nstderr:\n" + stderr_tail if stderr_tail else ""))))
    status = p.get("status")
    if status == "ok":
        content = p.get("content")
        if not isinstance(content, str):
            return done(Outcome(content=f"Error: tool '{name}' sent back an unreadable result", error="bad_result",
                                detail="the result document has no text content"))
        note = p.get("note") if isinstance(p.get("note"), str) else None
        truncated = bool(p.get("truncated"))
        original = p.get("original_length") if isinstance(p.get("original_length"), int) else None
        out = Outcome(content=clean_text(content)[0], note=note)
        if truncated and original is not None and original >= len(content) - 20:
            out.truncated, out.original_length = True, original
        return done(out)
    if status in ("exception", "load_error", "bad_result"):
        etype = safe_str(p.get("type") or "Exception", 200)
        msg = safe_str(p.get("message") or "", MAX_MESSAGE_CHARS)
        tb = safe_str(p.get("traceback") or "", MAX_DETAIL_CHARS)
        if etype == "SystemExit":
            code = p.get("exit_code")
            content = f"Error: tool '{name}' called sys.exit({'' if code is None else safe_str(code, 200)})"
        elif status == "load_error":
            line = p.get("line")
            content = (f"Error: tool '{name}': the tool code failed while loading"
                       + (f" (line {line})" if isinstance(line, int) else "") + f": {etype}" + (f": {msg}" if msg else ""))
        elif status == "bad_result":
            return done(Outcome(content=f"Error: tool '{name}' returned a result that cannot be turned into text ({etype}: {msg})",
                                error="bad_result", detail=tb))
        else:
            content = f"Error: tool '{name}' raised {etype}" + (f": {msg}" if msg else "")
        if etype == "MemoryError" and limits.memory_mb:
            content += f" (out of memory: the sandbox allows {limits.memory_mb} MB)"
        return done(Outcome(content=content, error="exception", detail=tb))
    if status == "syntax_error":
        return done(Outcome(content=f"Error: tool '{name}': the tool code has a syntax error", error="exception",
                            detail=safe_str(p.get("message"), 500)))
    return done(Outcome(content=f"Error: tool '{name}' failed in the sandbox", error="crashed",
                        detail=safe_str(p.get("message") or p, 2000)))
