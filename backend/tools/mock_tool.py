"""JSON-schema tools whose result is a fixed value or a template filled from the arguments
(the ``"mock"`` syntax: :mod:`backend.tools.mock`)."""

from __future__ import annotations

import copy
from typing import Any

from backend.tools._runtime import to_content
from backend.tools.base import Tool, ToolLoadError
from backend.tools.mock import MissingArgument, Mock, MockError
from backend.tools.outcome import CallOptions, Outcome, bad_result_outcome


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
