"""The tool registry: the set of tools of one run, and the one place calls are executed.

Loading::

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
import hashlib
import importlib
import inspect
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.trace import ToolCall, ToolResult, json_type
from backend.tools._runtime import TRUNCATE_SIDES, truncate_tool_response, validate_truncate_side
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.dialect import summarize as summarize_mappings
from backend.tools.core import (
    CallOptions,
    FunctionTool,
    MockTool,
    Outcome,
    SandboxedTool,
    Tool,
    ToolLoadError,
    VerlTool,
    normalize_schema,
    safe_str,
    verl_schema_object,
)

MAX_TOOL_FILE_BYTES = 10 * 1024 * 1024


class ToolRegistry:
    """An ordered set of tools with unique names."""

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        self.skipped: list[dict[str, str]] = []  # functions a loader left out, and why
        for t in tools:
            self.add(t)

    # ---- building ------------------------------------------------------------------------
    def add(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise ToolLoadError(f"expected a Tool, got {type(tool).__name__}")
        if tool.name in self._tools:
            where = f" ({tool.source})" if tool.source else ""
            raise ToolLoadError(f"two tools are named '{tool.name}'{where}; tool names must be unique")
        self._tools[tool.name] = tool

    def __add__(self, other: ToolRegistry) -> ToolRegistry:
        reg = ToolRegistry(list(self) + list(other))
        reg.skipped = self.skipped + other.skipped
        return reg

    @classmethod
    def from_functions(cls, functions: Iterable[Callable | Tool], *, capture_stdout: bool = True) -> ToolRegistry:
        """Python callables (schemas from ``transformers.utils.get_json_schema``) or Tool objects."""
        tools = []
        for fn in functions:
            tools.append(fn if isinstance(fn, Tool) else FunctionTool(fn, capture_stdout=capture_stdout))
        return cls(tools)

    @classmethod
    def from_schemas(cls, schemas: Iterable[dict[str, Any]], *, source: str | None = None) -> ToolRegistry:
        """JSON-schema tools, each with an optional ``"mock"`` result (see :mod:`backend.tools.mock`;
        without one, a call gets a placeholder result marked ``mock="default"``)."""
        if isinstance(schemas, dict):
            schemas = [schemas]
        tools = []
        for i, spec in enumerate(schemas):
            where = f"{source + ': ' if source else ''}tools[{i}]"
            tools.append(MockTool.from_spec(spec, source=where))
        return cls(tools)

    @classmethod
    def from_verl_config(cls, config: dict[str, Any] | str, *, base_dir: str | None = None) -> ToolRegistry:
        """verl's tool config: ``{"tools": [{"class_name": "pkg.mod.Class", "config": {...},
        "tool_schema": {...}}]}`` (a dict, or the path of a YAML/JSON file)."""
        if isinstance(config, str):
            return cls.from_file(config)
        return cls(_tools_from_document(config, source="verl config", base_dir=base_dir))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ToolRegistry:
        """Load tools from a file, by extension:

        * ``.py``: the documented public functions defined in the file (trusted code: it is
          imported and run in this process). Functions without a docstring, with a leading
          underscore, or imported from elsewhere are left out (see ``registry.skipped``).
        * ``.json``: a list of schemas, each with an optional ``"mock"`` result (or ``{"tools":
          [...]}``); a plain OpenAI tools list is fine, and so is ``[]`` (no tools).
        * ``.yaml`` / ``.yml``: verl's tool config ``{"tools": [{"class_name": ..., "config":
          ..., "tool_schema": ...}]}``; entries without ``class_name`` are read as mock schemas.
        """
        kind, content, name, base_dir = _read_tool_file(path)
        if kind == "py":
            return cls._from_trusted_source(content, filename=os.path.abspath(os.fspath(path)))
        return cls(_tools_from_document(content, source=name, base_dir=base_dir))
        name = os.path.basename(path)

    @classmethod
    def from_python_source(cls, code: str, *, sandboxed: bool = True, limits: Any = None,
                           filename: str = "<tools>") -> ToolRegistry:
        """Tools from Python code typed by a user.

        With ``sandboxed=True`` (the default) the code never runs in this process: a subprocess
        runs it and describes its documented public functions (signature, docstring, type hints
        as JSON); the schemas come from transformers' ``get_json_schema`` applied here to
        stand-ins rebuilt from those descriptions (:mod:`backend.tools.schema_stub`). Every call
        then runs in a fresh limited subprocess (:mod:`backend.tools.sandbox`). A syntax error
        raises :class:`ToolLoadError` with the line. With ``sandboxed=False`` the code is
        executed here, like a trusted ``.py`` file.

        This call blocks for the discovery run (one subprocess, typically 0.1-0.3 s); results
        are cached by the code's hash.
        """
        if not isinstance(code, str):
            raise ToolLoadError(f"tool code must be a string, got {type(code).__name__}")
        if not sandboxed:
            return cls._from_trusted_source(code, filename=filename)
        from backend.tools.sandbox import SandboxLimits

        limits = limits or SandboxLimits()
        if len(code) > MAX_SOURCE_CHARS:
            raise ToolLoadError(f"the tool code is {len(code)} characters; the limit is {MAX_SOURCE_CHARS}")
        key = (hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest(), filename, limits)
        with _DISCOVERED_LOCK:
            p = _DISCOVERED.get(key)
        if p is None:
            p = _discover(code, filename, limits)
            with _DISCOVERED_LOCK:
                _DISCOVERED[key] = p
                while len(_DISCOVERED) > 32:
                    _DISCOVERED.pop(next(iter(_DISCOVERED)))
        from backend.tools.schema_stub import schema_from_description

        tools = []
        for desc in p.get("functions") or []:
            schema = schema_from_description(desc)
            tools.append(SandboxedTool(schema, code, desc["name"], limits, filename=filename,
                                       source=f"{filename}:{desc.get('line')}"))
        if not tools:
            raise ToolLoadError(_no_tools_message(filename, p.get("skipped") or []))
        reg = cls(tools)
        reg.skipped = list(p.get("skipped") or [])
        return reg

    @classmethod
    def _from_trusted_source(cls, code: str, *, filename: str) -> ToolRegistry:
        label = os.path.basename(filename) if os.path.isabs(filename) else filename
        try:
            code_obj = compile(code, filename, "exec")
        except SyntaxError as e:
            text = (e.text or "").rstrip("\n")
            raise ToolLoadError(f"syntax error in {label} at line {e.lineno}: {e.msg}" + (f"\n    {text.strip()}" if text.strip() else "")) from None
        except (ValueError, RecursionError, MemoryError) as e:
            raise ToolLoadError(f"cannot compile {label}: {type(e).__name__}: {e}") from None
        stem = os.path.splitext(os.path.basename(filename))[0] or "tools"
        stem = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
        modname = f"_ali_tools_{stem}_{hashlib.sha1(filename.encode() + code.encode('utf-8', 'replace')).hexdigest()[:10]}"
        mod = types.ModuleType(modname)
        mod.__file__ = filename
        sys.modules[modname] = mod
        if os.path.isabs(filename):
            d = os.path.dirname(filename)
            if d not in sys.path:
                sys.path.append(d)  # sibling modules of a tools file import as they would in a script
        try:
            exec(code_obj, mod.__dict__)  # noqa: S102 - trusted tool files (CLI)
        except BaseException as e:  # noqa: BLE001 - SystemExit at import time too
            sys.modules.pop(modname, None)
            line = _user_line(e, filename)
            raise ToolLoadError(
                f"{label} raised {type(e).__name__} while loading" + (f" (line {line})" if line else "") + f": {safe_str(e, 1000)}"
            ) from None
        tools, skipped = [], []
        for name, obj in list(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(obj):
                continue
            if obj.__module__ != modname or obj.__name__ != name:
                continue  # imported from elsewhere, or an alias
            if not (obj.__doc__ or "").strip():
                skipped.append({"name": name, "reason": "no docstring"})
                continue
            tools.append(FunctionTool(obj, source=f"{label}:{obj.__code__.co_firstlineno}"))
        if not tools:
            raise ToolLoadError(_no_tools_message(label, skipped))
        reg = cls(tools)
        reg.skipped = skipped
        return reg

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
            from backend.tools.core import exception_outcome

            out = exception_outcome(name, e)
            out.detail = "internal error in the tool registry\n" + (out.detail or "")
        return _to_result(out, call_id=call_id, name=name, tool=tool, t0=t0, notes=notes,
                          max_response_length=max_response_length, truncate_side=truncate_side)


def _read_tool_file(path: str | os.PathLike) -> tuple[str, Any, str, str]:
    """``("py", source text, file name, folder)`` or ``("doc", parsed JSON/YAML, file name, folder)``."""
    path = os.fspath(path)
    name = os.path.basename(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(path):
        raise ToolLoadError(f"tool file {path} does not exist")
    if not os.path.isfile(path):
        raise ToolLoadError(f"{path} is not a file")
    size = os.path.getsize(path)
    if size > MAX_TOOL_FILE_BYTES:
        raise ToolLoadError(f"tool file {name} is {size / 1e6:.1f} MB; the limit is {MAX_TOOL_FILE_BYTES / 1e6:.0f} MB")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".py", ".json", ".yaml", ".yml"):
        raise ToolLoadError(f"cannot load tools from {name}: use a .py, .json, .yaml or .yml file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ToolLoadError(f"{name} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ToolLoadError(f"cannot read {path}: {e.strerror or e}") from None
    if ext == ".py":
        return "py", text, name, base_dir
    if ext == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ToolLoadError(f"{name}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise ToolLoadError(f"{name}: invalid JSON: nested too deeply") from None
    else:
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e)
            raise ToolLoadError(f"{name}: invalid YAML{where}: {problem}") from None
    return "doc", doc, name, base_dir


# discovery results by (sha256 of the code, filename, limits): the UI reloads the same code often
_DISCOVERED: dict[tuple, dict[str, Any]] = {}
_DISCOVERED_LOCK = threading.Lock()
MAX_SOURCE_CHARS = 1_000_000


def _discover(code: str, filename: str, limits: Any) -> dict[str, Any]:
    """Run the discovery child; its payload, or ToolLoadError."""
    from backend.tools.sandbox import run_child

    request = {"mode": "discover", "code": code, "filename": filename}
    try:
        run = _run_sync(run_child(request, limits, limits.discover_timeout_s))
    except OSError as e:
        raise ToolLoadError(f"could not start the sandbox: {e}") from None
    p = run.payload
    if run.timed_out:
        raise ToolLoadError(f"loading the tool code took longer than {limits.discover_timeout_s:g} s; the process was killed")
    if p is None:
        sig = run.signal_name
        why = f"killed by {sig}" if sig else f"exited with code {run.returncode}"
        tail = run.stderr.strip().splitlines()[-3:] if run.stderr else []
        raise ToolLoadError(f"loading the tool code failed: the process {why} without a result" + (": " + " | ".join(tail) if tail else ""))
    status = p.get("status")
    if status == "syntax_error":
        line = p.get("lineno")
        text = p.get("text")
        raise ToolLoadError(
            f"syntax error in the tool code" + (f" at line {line}" if line else "") + f": {p.get('message')}"
            + (f"\n    {text}" if text else "")
        )
    if status == "load_error":
        line = p.get("line")
        raise ToolLoadError(
            f"the tool code raised {safe_str(p.get('type'), 100)}" + (f" at line {line}" if isinstance(line, int) else "")
            + f" while loading: {safe_str(p.get('message'), 1000)}"
        )
    if status != "ok":
        raise ToolLoadError(f"loading the tool code failed: {safe_str(p.get('message') or p, 1000)}")
    if p.get("errors"):
        raise ToolLoadError("; ".join(
            f"cannot build a schema for function '{e.get('name')}' (line {e.get('line')}): {e.get('message')}" for e in p["errors"]
        ))
    return p


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
    if raw is None:
        return {}, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return {}, "the arguments are not valid JSON"
    if not isinstance(raw, dict):
        return {}, f"the arguments must be a JSON object, got {json_type(raw)}"
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        return {}, "argument names must be strings"
    return raw, None


def _no_tools_message(label: str, skipped: list[dict[str, str]]) -> str:
    msg = f"no tools found in {label}: define public functions (no leading underscore) with a docstring and type hints"
    if skipped:
        msg += "; left out: " + ", ".join(f"{s['name']} ({s['reason']})" for s in skipped)
    return msg


def _user_line(e: BaseException, filename: str) -> int | None:
    if isinstance(e, SyntaxError) and e.filename == filename:
        return e.lineno
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _run_sync(coro) -> Any:
    """Run a coroutine to completion from synchronous code, on a helper thread with its own
    loop: works inside a running event loop too, and leaves this thread's loop alone."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-load") as ex:
        return ex.submit(asyncio.run, coro).result()


@dataclass
class RenderTools:
    """Tool schemas for rendering only: as given (flat ``{"name", ...}`` entries wrapped as
    ``{"type": "function", "function": ...}``, ``"mock"`` dropped), and notes on what a run
    would read differently."""

    schemas: list[dict[str, Any]]
    type_mappings: list[TypeMapping] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def schemas_for_rendering(path: str | os.PathLike) -> RenderTools:
    """The tool schemas of a file, for paths that only render (``render``): no result and no
    valid JSON Schema is needed. A ``.json`` / ``.yaml`` list of schemas (``[]`` included) is
    read without building tools, so a plain OpenAI tools list and catalogue-style types render
    exactly as transformers renders them; types a run could not read are noted, not refused.
    A ``.py`` file, and a verl config with ``class_name`` entries, load their tools to get the
    schemas."""
    kind, content, name, base_dir = _read_tool_file(path)
    if kind == "py" or any(isinstance(e, dict) and "class_name" in e for e in _document_entries(content, name)):
        reg = ToolRegistry._from_trusted_source(content, filename=os.path.abspath(os.fspath(path))) if kind == "py" \
            else ToolRegistry(_tools_from_document(content, source=name, base_dir=base_dir))
        mappings = reg.type_mappings
        return RenderTools(reg.schemas, mappings, [summarize_mappings(mappings)] if mappings else [])
    schemas: list[dict[str, Any]] = []
    mappings: list[TypeMapping] = []
    notes: list[str] = []
    for i, entry in enumerate(_document_entries(content, name)):
        schema = normalize_schema(entry, where=f"{name}: tools[{i}]")
        fn = schema["function"]
        params = fn.get("parameters")
        if isinstance(params, dict):
            try:
                mappings += to_json_schema(params, tool=fn["name"])[1]
            except SchemaDialectError as e:
                notes.append(f"tool '{fn['name']}': {e} (rendered as given; a run refuses it)")
        schemas.append(schema)
    if mappings:
        notes.insert(0, summarize_mappings(mappings))
    return RenderTools(schemas, mappings, notes)


def _document_entries(doc: Any, source: str) -> list[Any]:
    """The tool entries of a JSON/YAML tools document."""
    if isinstance(doc, dict) and "tools" in doc:
        entries = doc["tools"]
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise ToolLoadError(f"{source}: \"tools\" must be a list, got {type(entries).__name__}")
    elif isinstance(doc, list):
        entries = doc
    elif isinstance(doc, dict) and ("function" in doc or "name" in doc or "class_name" in doc):
        entries = [doc]
    elif doc is None:
        raise ToolLoadError(f"{source} is empty")
    else:
        raise ToolLoadError(
            f"{source}: expected a list of tool schemas or {{\"tools\": [...]}}, got {type(doc).__name__}"
            + (f" with keys {', '.join(map(str, list(doc)[:5]))}" if isinstance(doc, dict) else "")
        )
    return entries  # [] is a valid tools list: no tools


def _tools_from_document(doc: Any, *, source: str, base_dir: str | None) -> list[Tool]:
    tools: list[Tool] = []
    for i, entry in enumerate(_document_entries(doc, source)):
        where = f"{source}: tools[{i}]"
        if isinstance(entry, dict) and "class_name" in entry:
            tools.append(_verl_tool(entry, where=where, base_dir=base_dir))
        else:
            tools.append(MockTool.from_spec(entry, source=where))
    return tools


def _import_class(class_name: Any, *, where: str, base_dir: str | None) -> type:
    if not isinstance(class_name, str) or "." not in class_name:
        raise ToolLoadError(f"{where}: class_name must be a dotted path like 'package.module.ClassName', got {class_name!r}")
    module_name, _, attr = class_name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as first:
        # verl resolves class_name on sys.path; also try the current directory and the config's
        # directory, as a user running the CLI from their project would expect
        extra = [p for p in dict.fromkeys([os.getcwd(), base_dir]) if p and p not in sys.path]
        sys.path[:0] = extra
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            raise ToolLoadError(f"{where}: cannot import {class_name}: {first}") from None
        except BaseException as e:  # noqa: BLE001
            raise ToolLoadError(f"{where}: importing {module_name} raised {type(e).__name__}: {safe_str(e, 500)}") from None
        finally:
            for p in extra:
                if p in sys.path:
                    sys.path.remove(p)
    except BaseException as e:  # noqa: BLE001 - a broken module
        raise ToolLoadError(f"{where}: importing {module_name} raised {type(e).__name__}: {safe_str(e, 500)}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ToolLoadError(f"{where}: module {module_name} has no attribute {attr!r}")
    if not isinstance(cls, type):
        raise ToolLoadError(f"{where}: {class_name} is not a class")
    return cls


def _verl_tool(entry: dict[str, Any], *, where: str, base_dir: str | None) -> VerlTool:
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolLoadError(f"{where}: config must be a mapping")
    if str(config.get("type", "native")).lower() == "mcp":
        raise ToolLoadError(f"{where}: MCP tools are not supported (they need a network server); use native tools")
    cls = _import_class(entry["class_name"], where=where, base_dir=base_dir)
    schema = entry.get("tool_schema")
    schema_obj = None
    if schema is not None:
        schema = normalize_schema(schema, where=where)
        schema_obj = verl_schema_object(schema)
    try:
        instance = cls(config=config, tool_schema=schema_obj)
    except BaseException as e:  # noqa: BLE001
        raise ToolLoadError(f"{where}: creating {entry['class_name']}(config=..., tool_schema=...) raised {type(e).__name__}: {safe_str(e, 500)}") from None
    try:
        return VerlTool(instance, source=f"{where} ({entry['class_name']})")
    except ToolLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - get_openai_tool_schema() can fail
        raise ToolLoadError(f"{where}: reading the schema of {entry['class_name']} failed: {type(e).__name__}: {safe_str(e, 500)}") from None


__all__ = ["RenderTools", "ToolRegistry", "ToolLoadError", "schemas_for_rendering", "truncate_tool_response", "validate_truncate_side"]
