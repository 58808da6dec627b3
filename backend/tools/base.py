"""What every tool kind shares: :class:`Tool` (its schema as the model sees it, arguments
validated with jsonschema, :meth:`Tool.invoke` that never raises) and :class:`ToolLoadError`.

The kinds, each in its own module beside what runs it: :mod:`~backend.tools.function_tool`
(Python functions in this process), :mod:`~backend.tools.mock_tool` (JSON schemas with a
``"mock"`` result), :mod:`~backend.tools.verl_tool` (verl ``BaseTool`` classes) and
:mod:`~backend.tools.sandboxed_tool` (user-typed code in a subprocess).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterable
from typing import Any

from backend.errors import UserError
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.outcome import CallOptions, Outcome, exception_outcome


class ToolLoadError(UserError):
    """Tools could not be loaded or defined; the message says what and where."""


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


def check_unique_names(tools: Iterable[Tool], taken: Iterable[str] = ()) -> None:
    """ToolLoadError when two of ``tools``, or one of them and a name in ``taken``, share a name."""
    seen = set(taken)
    for tool in tools:
        if tool.name in seen:
            where = f" ({tool.source})" if tool.source else ""
            raise ToolLoadError(f"two tools are named '{tool.name}'{where}; tool names must be unique")
        seen.add(tool.name)
