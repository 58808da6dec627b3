"""Stand-ins for the verl types a verl-style tool class touches, for when verl is not installed.

verl builds each tool as ``ToolClass(config=<dict>, tool_schema=<OpenAIFunctionToolSchema>)``
and tool code reads the schema by attribute (``tool_schema.function.name``) or dumps it with
``model_dump(exclude_unset=True, exclude_none=True)``. :class:`FunctionToolSchema` supports both
and dumps back exactly what it was given. :class:`ToolResponse` mirrors the shape of verl's
response object (``text``, ``image``, ``video``) for tools that want to return one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionParameters(_Open):
    type: str = "object"
    properties: dict[str, Any] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class FunctionSpec(_Open):
    name: str
    description: str | None = None
    parameters: FunctionParameters = Field(default_factory=FunctionParameters)
    strict: bool | None = None


class FunctionToolSchema(_Open):
    type: str = "function"
    function: FunctionSpec


class ToolResponse(_Open):
    text: str | None = None
    image: Any = None
    video: Any = None
