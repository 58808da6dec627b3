"""The tool registry: the set of tools of one run, and the one place calls are executed.

Loading (the loaders are in :mod:`backend.tools.loaders`)::

    ToolRegistry.from_functions([get_current_temperature, ...])  # schemas by transformers' get_json_schema
    ToolRegistry.from_schemas([{"type": "function", "function": {...}, "mock": ...}])  # "mock" optional
    ToolRegistry.from_file("tools.py" | "tools.json" | "tools.yaml")
    ToolRegistry.from_python_source(code, sandboxed=True)     # web UI: runs in a subprocess
    schemas_for_rendering("tools.json")  # only the schemas, as given: for render and the template lab

Schemas are rendered as given. Parameter types in the common non-JSON-Schema dialect (``dict``,
``float``, ``tuple``, ``any``, ``long``, ``String``, ...) are read as JSON Schema for validation
(:mod:`backend.tools.dialect`) and listed in ``registry.type_mappings``. A schema tool without a
``"mock"`` answers every call with a placeholder result marked ``mock="default"``
(``registry.default_mock_tools``); :meth:`ToolRegistry.trace_notes` puts both in a trace's metadata.

Running: ``await registry.execute(call, timeout_s=..., max_response_length=..., truncate_side=...)``
returns a :class:`~backend.trace.ToolResult` and never raises (``asyncio.CancelledError``
excepted). Failures become results the model can read (``ok=False``, ``content`` starting with
``Error:``) with ``error`` one of ``unknown_tool``, ``invalid_arguments``, ``exception``,
``timeout``, ``bad_result``, ``crashed``. Extra ToolResult fields: ``reward`` and ``metrics``
(verl tools), ``note`` (e.g. a result that was not JSON-serialisable and was sent as ``str()``),
``tool_kind``, and ``sandbox`` (return code and time of a sandboxed call).
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from backend.tools._runtime import TRUNCATE_SIDES, truncate_tool_response
from backend.tools.base import Tool, ToolLoadError, check_unique_names
from backend.tools.dialect import TypeMapping
from backend.tools.dialect import summarize as summarize_mappings
from backend.tools.loaders import (
    tools_from_file,
    tools_from_functions,
    tools_from_python_source,
    tools_from_schemas,
    tools_from_verl_config,
)
from backend.tools.outcome import CallOptions, Outcome, exception_outcome, safe_str
from backend.trace import ToolCall, ToolResult
from backend.trace.messages import decode_arguments


class ToolRegistry:
    """An ordered set of tools with unique names."""

    def __init__(self, tools: Iterable[Tool] = (), *, skipped: Iterable[dict[str, str]] = ()):
        self._tools: dict[str, Tool] = {}
        self.skipped: list[dict[str, str]] = list(skipped)  # functions a loader left out, and why
        for t in tools:
            self.add(t)

    # ---- building ------------------------------------------------------------------------
    def add(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise ToolLoadError(f"expected a Tool, got {type(tool).__name__}")
        check_unique_names([tool], self._tools)
        self._tools[tool.name] = tool

    def __add__(self, other: ToolRegistry) -> ToolRegistry:
        return ToolRegistry(list(self) + list(other), skipped=self.skipped + other.skipped)

    @classmethod
    def from_functions(cls, functions: Iterable[Callable | Tool], *, capture_stdout: bool = True) -> ToolRegistry:
        """Python callables (schemas from ``transformers.utils.get_json_schema``) or Tool objects."""
        return cls(tools_from_functions(functions, capture_stdout=capture_stdout))

    @classmethod
    def from_schemas(cls, schemas: Iterable[dict[str, Any]], *, source: str | None = None) -> ToolRegistry:
        """JSON-schema tools, each with an optional ``"mock"`` (:func:`~backend.tools.tools_from_schemas`)."""
        return cls(tools_from_schemas(schemas, source=source))

    @classmethod
    def from_verl_config(cls, config: dict[str, Any] | str, *, base_dir: str | None = None) -> ToolRegistry:
        """verl's tool config: ``{"tools": [{"class_name": "pkg.mod.Class", "config": {...},
        "tool_schema": {...}}]}`` (a dict, or the path of a YAML/JSON file)."""
        if isinstance(config, str):
            return cls.from_file(config)
        return cls(tools_from_verl_config(config, base_dir=base_dir))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ToolRegistry:
        """Tools from a ``.py``, ``.json``, ``.yaml`` or ``.yml`` file
        (:func:`~backend.tools.tools_from_file`)."""
        tools, skipped = tools_from_file(path)
        return cls(tools, skipped=skipped)

    @classmethod
    def from_python_source(cls, code: str, *, sandboxed: bool = True, limits: Any = None,
                           filename: str = "<tools>") -> ToolRegistry:
        """Tools from Python code typed by a user, run in a sandbox unless ``sandboxed=False``
        (:func:`~backend.tools.tools_from_python_source`)."""
        tools, skipped = tools_from_python_source(code, sandboxed=sandboxed, limits=limits, filename=filename)
        return cls(tools, skipped=skipped)

    # ---- reading ----------------------------------------------------------------------------
    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The schemas exactly as passed to ``apply_chat_template(tools=...)`` (no ``mock`` key)."""
        return [copy.deepcopy(t.schema) for t in self._tools.values()]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def type_mappings(self) -> list[TypeMapping]:
        """Parameter type names of the common dialect read as JSON Schema for validation (the
        schemas themselves are rendered as given)."""
        return [m for t in self._tools.values() for m in getattr(t, "type_mappings", ())]

    @property
    def default_mock_tools(self) -> list[str]:
        """Schema tools with no ``"mock"``: their calls get a placeholder result."""
        return [t.name for t in self._tools.values() if getattr(t, "default_mock", False)]

    def notes(self) -> list[str]:
        """What a person should know about these tools, one line each (empty when nothing)."""
        out = []
        if self.type_mappings:
            out.append(summarize_mappings(self.type_mappings))
        if self.default_mock_tools:
            names = self.default_mock_tools
            shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            out.append(f"{len(names)} tool(s) have no \"mock\" result ({shown}): a call to one gets a placeholder "
                       "result, marked mock=default in the trace")
        return out

    def trace_notes(self) -> dict[str, Any]:
        """For a trace's metadata: ``tool_type_mappings`` and ``default_mock_tools`` (only those
        that are not empty)."""
        out: dict[str, Any] = {}
        if self.type_mappings:
            out["tool_type_mappings"] = [m.to_dict() for m in self.type_mappings]
        if self.default_mock_tools:
            out["default_mock_tools"] = self.default_mock_tools
        return out

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name) if isinstance(name, str) else None

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"ToolRegistry({', '.join(self._tools) or 'empty'})"

    # ---- running ----------------------------------------------------------------------------
    async def execute(self, call: ToolCall | dict[str, Any], *, timeout_s: float | None = 30.0, max_response_length: int | None = None,
                      truncate_side: str = "middle") -> ToolResult:
        """Run one call. Never raises (``asyncio.CancelledError`` propagates)."""
        t0 = time.perf_counter()
        if isinstance(call, dict):  # also {"name", "arguments", "id"} or the chat format {"function": {...}, "id"}
            fn = call["function"] if isinstance(call.get("function"), dict) else call
            name, raw_args, call_id = fn.get("name"), fn.get("arguments"), call.get("id")
        else:
            name, raw_args, call_id = getattr(call, "name", None), getattr(call, "arguments", None), getattr(call, "id", None)
        name = name if isinstance(name, str) else safe_str(name, 200)
        notes: list[str] = []
        if truncate_side not in TRUNCATE_SIDES:
            notes.append(f"unknown truncate side {truncate_side!r}; 'middle' was used")
            truncate_side = "middle"
        if max_response_length is not None and (not isinstance(max_response_length, int) or max_response_length < 0):
            notes.append(f"ignored max_response_length={max_response_length!r}")
            max_response_length = None
        tool: Tool | None = None
        try:
            tool = self.get(name)
            if tool is None:
                avail = ", ".join(self._tools) if self._tools else None
                out = Outcome(
                    content=f"Error: unknown tool '{safe_str(name, 200)}'. "
                    + (f"Available tools: {avail}" if avail else "No tools are available."),
                    error="unknown_tool",
                )
            else:
                args, problem = _arguments(raw_args)
                if problem is None:
                    problems = tool.check_arguments(args)
                    problem = "; ".join(problems) if problems else None
                if problem is not None:
                    out = Outcome(
                        content=f"Error: invalid arguments for tool '{tool.name}': {problem}. Expected parameters: {tool.signature_text()}",
                        error="invalid_arguments",
                    )
                else:
                    opts = CallOptions(timeout_s=timeout_s, max_response_length=max_response_length, truncate_side=truncate_side)
                    out = await tool.invoke(args, opts)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug here must not reach the loop
            out = exception_outcome(name, e)
            out.detail = "internal error in the tool registry\n" + (out.detail or "")
        return _to_result(out, call_id=call_id, name=name, tool=tool, t0=t0, notes=notes,
                          max_response_length=max_response_length, truncate_side=truncate_side)


# ---- helpers ---------------------------------------------------------------------------------


def _to_result(out: Outcome, *, call_id, name, tool, t0, notes, max_response_length, truncate_side) -> ToolResult:
    text = out.content if isinstance(out.content, str) else ""
    truncated, original = out.truncated, out.original_length
    if not truncated and max_response_length is not None and len(text) > max_response_length:
        original = len(text)
        text, truncated = truncate_tool_response(text, max_response_length, truncate_side)
    elif truncated and max_response_length is not None and len(text) > max_response_length + len("...(truncated)..."):
        text, _ = truncate_tool_response(text, max_response_length, truncate_side)  # do not trust the child
    if out.note:
        notes.insert(0, out.note)
    extra: dict[str, Any] = {}
    if out.reward is not None:
        extra["reward"] = out.reward
    if out.metrics:
        extra["metrics"] = out.metrics
    if notes:
        extra["note"] = "; ".join(notes)
    if tool is not None:
        extra["tool_kind"] = tool.kind
    if out.extra:
        extra.update(out.extra)
    return ToolResult(
        call_id=call_id if isinstance(call_id, str) else None,
        name=name,
        content=text,
        ok=out.ok,
        error=out.error,
        error_detail=out.detail,
        duration_s=time.perf_counter() - t0,
        truncated=bool(truncated),
        original_length=original if truncated else None,
        stdout=out.stdout,
        **extra,
    )


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """The call's arguments as an object, or a problem description."""
    value, problem = decode_arguments(raw)
    if problem is not None:
        return {}, f"the {problem}"
    if any(not isinstance(k, str) for k in value):
        return {}, "argument names must be strings"
    return value, None


__all__ = ["ToolRegistry"]
