"""Tool definitions, validation and execution.

The engine uses::

    from backend.tools import Tool, ToolRegistry, truncate_tool_response, ToolLoadError

* :class:`ToolRegistry`: load tools (functions, mock schemas, ``.py``/``.json``/``.yaml`` files,
  sandboxed user code) and ``await registry.execute(call, ...)`` -> ToolResult, never raising.
* :mod:`backend.tools.mock`: the ``"mock"`` syntax of schema tools.
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
from backend.tools.registry import ToolRegistry
from backend.tools.sandbox import SandboxLimits, describe_protections

__all__ = [
    "TRUNCATE_SIDES",
    "FunctionTool",
    "MockTool",
    "SandboxLimits",
    "SandboxedTool",
    "describe_protections",
    "Tool",
    "ToolLoadError",
    "ToolRegistry",
    "VerlTool",
    "normalize_schema",
    "schema_from_function",
    "to_content",
    "truncate_tool_response",
    "validate_truncate_side",
]
