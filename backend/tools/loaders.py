"""Where tools come from: Python functions, JSON schemas (with an optional ``"mock"``), tool
files (``.py`` / ``.json`` / ``.yaml``), verl's tool config, and Python code typed in the UI.

Each loader returns the tools (and, for Python code, the functions it left out, and why);
:class:`~backend.tools.registry.ToolRegistry`'s ``from_*`` constructors wrap them.
:func:`schemas_for_rendering` reads a file's schemas as given, for paths that only render.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from backend.tools.base import Tool, ToolLoadError, check_unique_names, normalize_schema
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.dialect import summarize as summarize_mappings
from backend.tools.function_tool import FunctionTool
from backend.tools.mock_tool import MockTool
from backend.tools.outcome import safe_str
from backend.tools.sandbox import SandboxLimits
from backend.tools.sandboxed_tool import discover_tools
from backend.tools.verl_tool import verl_tool_from_entry

MAX_TOOL_FILE_BYTES = 10 * 1024 * 1024


def tools_from_functions(functions: Iterable[Callable | Tool], *, capture_stdout: bool = True) -> list[Tool]:
    """Python callables (schemas from ``transformers.utils.get_json_schema``) or Tool objects."""
    return [fn if isinstance(fn, Tool) else FunctionTool(fn, capture_stdout=capture_stdout) for fn in functions]


def tools_from_schemas(schemas: Iterable[dict[str, Any]] | dict[str, Any], *, source: str | None = None) -> list[Tool]:
    """JSON-schema tools, each with an optional ``"mock"`` result (see :mod:`backend.tools.mock`;
    without one, a call gets a placeholder result marked ``mock="default"``)."""
    if isinstance(schemas, dict):
        schemas = [schemas]
    return [MockTool.from_spec(spec, source=f"{source + ': ' if source else ''}tools[{i}]") for i, spec in enumerate(schemas)]


def tools_from_verl_config(config: dict[str, Any], *, base_dir: str | None = None) -> list[Tool]:
    """verl's tool config as a dict: ``{"tools": [{"class_name": "pkg.mod.Class", "config": {...},
    "tool_schema": {...}}]}``; entries without ``class_name`` are read as mock schemas."""
    return _tools_from_document(config, source="verl config", base_dir=base_dir)


def tools_from_file(path: str | os.PathLike) -> tuple[list[Tool], list[dict[str, str]]]:
    """Tools from a file, by extension, and the functions left out (``.py`` only):

    * ``.py``: the documented public functions defined in the file (trusted code: it is
      imported and run in this process); see :func:`tools_from_trusted_source`.
    * ``.json``: a list of schemas, each with an optional ``"mock"`` result (or ``{"tools":
      [...]}``); a plain OpenAI tools list is fine, and so is ``[]`` (no tools).
    * ``.yaml`` / ``.yml``: verl's tool config ``{"tools": [{"class_name": ..., "config":
      ..., "tool_schema": ...}]}``; entries without ``class_name`` are read as mock schemas.
    """
    kind, content, name, base_dir = _read_tool_file(path)
    if kind == "py":
        return tools_from_trusted_source(content, filename=os.path.abspath(os.fspath(path)))
    return _tools_from_document(content, source=name, base_dir=base_dir), []


def tools_from_python_source(code: str, *, sandboxed: bool = True, limits: SandboxLimits | None = None,
                             filename: str = "<tools>") -> tuple[list[Tool], list[dict[str, str]]]:
    """Tools from Python code typed by a user, and the functions left out.

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
        return tools_from_trusted_source(code, filename=filename)
    tools, skipped = discover_tools(code, filename, limits or SandboxLimits())
    if not tools:
        raise ToolLoadError(_no_tools_message(filename, skipped))
    return list(tools), skipped


def tools_from_trusted_source(code: str, *, filename: str) -> tuple[list[Tool], list[dict[str, str]]]:
    """The documented public functions of Python ``code``, executed here (trusted code), and
    the functions left out. Functions without a docstring, with a leading underscore, or
    imported from elsewhere are left out."""
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
    return tools, skipped


# ---- rendering only ----------------------------------------------------------------------------


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
        tools = tools_from_trusted_source(content, filename=os.path.abspath(os.fspath(path)))[0] if kind == "py" \
            else _tools_from_document(content, source=name, base_dir=base_dir)
        check_unique_names(tools)
        mappings = [m for t in tools for m in t.type_mappings]
        return RenderTools([copy.deepcopy(t.schema) for t in tools], mappings, [summarize_mappings(mappings)] if mappings else [])
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


# ---- files and documents -----------------------------------------------------------------------


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
            tools.append(verl_tool_from_entry(entry, where=where, base_dir=base_dir))
        else:
            tools.append(MockTool.from_spec(entry, source=where))
    return tools


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
