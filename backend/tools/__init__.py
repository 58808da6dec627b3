"""Tool definitions, validation and execution.

The engine uses::

    from backend.tools import Tool, ToolRegistry, truncate_tool_response, ToolLoadError

* :class:`ToolRegistry`: load tools (functions, mock schemas, ``.py``/``.json``/``.yaml`` files,
  sandboxed user code) and ``await registry.execute(call, ...)`` -> ToolResult, never raising.
* :func:`schemas_for_rendering`: a file's schemas as given, for paths that only render.
* :mod:`backend.tools.mock`: the ``"mock"`` syntax of schema tools (optional: without one, a
  call gets a placeholder result marked ``mock="default"``).
* :mod:`backend.tools.dialect`: catalogue-style parameter types (``dict``, ``float``, ``any``,
  ...) read as JSON Schema where validation or a grammar needs it, each mapping reported.
* :mod:`backend.tools.sandbox`: how user-typed code is isolated.
"""

from backend.tools._runtime import TRUNCATE_SIDES, to_content, truncate_tool_response, validate_truncate_side
from backend.tools.core import (
    FunctionTool,
    MockTool,
    SandboxedTool,
    Tool,
    ToolLoadError,
    VerlTool,
    normalize_schema,
    schema_from_function,
)
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.registry import RenderTools, ToolRegistry, schemas_for_rendering
from backend.tools.sandbox import SandboxLimits, describe_protections

__all__ = [
    "TRUNCATE_SIDES",
    "FunctionTool",
    "MockTool",
    "RenderTools",
    "SchemaDialectError",
    "SandboxLimits",
    "SandboxedTool",
    "describe_protections",
    "Tool",
    "ToolLoadError",
    "ToolRegistry",
    "TypeMapping",
    "VerlTool",
    "normalize_schema",
    "schema_from_function",
    "schemas_for_rendering",
    "to_content",
    "to_json_schema",
    "truncate_tool_response",
    "validate_truncate_side",
]
