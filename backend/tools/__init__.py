"""Tool definitions, validation and execution.

The engine uses::

    from backend.tools import Tool, ToolRegistry, truncate_tool_response, ToolLoadError

* :class:`ToolRegistry` (:mod:`~backend.tools.registry`): the tools of a run, built by the
  loaders of :mod:`backend.tools.loaders` (functions, mock schemas, ``.py``/``.json``/``.yaml``
  files, verl's tool config, sandboxed user code); ``await registry.execute(call, ...)`` ->
  ToolResult, never raising.
* One module per tool kind, beside what runs it: :mod:`~backend.tools.function_tool`,
  :mod:`~backend.tools.mock_tool`, :mod:`~backend.tools.verl_tool`,
  :mod:`~backend.tools.sandboxed_tool`; what they share is in :mod:`~backend.tools.base`
  (:class:`Tool`), :mod:`~backend.tools.outcome` and :mod:`~backend.tools.deadline`.
* :func:`schemas_for_rendering`: a file's schemas as given, for paths that only render.
* :mod:`backend.tools.mock`: the ``"mock"`` syntax of schema tools (optional: without one, a
  call gets a placeholder result marked ``mock="default"``).
* :mod:`backend.tools.dialect`: catalogue-style parameter types (``dict``, ``float``, ``any``,
  ...) read as JSON Schema where validation or a grammar needs it, each mapping reported.
* :mod:`backend.tools.sandbox`: how user-typed code is isolated.
"""

from backend.tools._runtime import TRUNCATE_SIDES, to_content, truncate_tool_response, validate_truncate_side
from backend.tools.base import Tool, ToolLoadError, normalize_schema
from backend.tools.dialect import SchemaDialectError, TypeMapping, to_json_schema
from backend.tools.function_tool import FunctionTool, schema_from_function
from backend.tools.loaders import RenderTools, schemas_for_rendering
from backend.tools.mock_tool import MockTool
from backend.tools.registry import ToolRegistry
from backend.tools.sandbox import SandboxLimits, describe_protections
from backend.tools.sandboxed_tool import SandboxedTool
from backend.tools.verl_tool import VerlTool

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
