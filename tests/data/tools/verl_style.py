"""A verl-style tool class (duck-typed like verl's BaseTool) for the YAML loader tests.

verl is not installed in the test environment; this class follows the same interface:
``__init__(config, tool_schema)``, ``get_openai_tool_schema()``, ``async create()``,
``async execute(instance_id, parameters) -> (response, reward, metrics)``, ``async release()``.
"""

from __future__ import annotations

import asyncio
import uuid


class TextResponse:
    """Shaped like verl's ToolResponse: text plus optional media."""

    def __init__(self, text=None, image=None):
        self.text = text
        self.image = image


class WeatherTool:
    # calls seen by all instances, so tests can check create/execute/release happened
    events: list[tuple[str, str]] = []

    def __init__(self, config: dict, tool_schema=None):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = self.tool_schema.function.name if hasattr(self.tool_schema, "function") else self.tool_schema["function"]["name"]
        self.unit = config.get("unit", "C")
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self):
        if getattr(self, "tool_schema", None) is not None:
            return self.tool_schema
        return {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }

    async def create(self, instance_id=None, **kwargs):
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = {}
        WeatherTool.events.append(("create", instance_id))
        return instance_id, TextResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        WeatherTool.events.append(("execute", instance_id))
        city = parameters["city"]
        if city == "Nowhere":
            raise LookupError(f"no weather station in {city}")
        if city == "Slowtown":
            await asyncio.sleep(10)
        return TextResponse(text=f"{city}: 21{self.unit}", image=None), 0.5, {"calls": 1}

    async def release(self, instance_id, **kwargs):
        WeatherTool.events.append(("release", instance_id))
        self._instances.pop(instance_id, None)


class LegacyCounter:
    """Older verl interface: create() returns just the id, execute() returns a str response."""

    def __init__(self, config, tool_schema=None):
        self.tool_schema = tool_schema
        self.count = config.get("start", 0)

    def get_openai_tool_schema(self):
        return self.tool_schema

    async def create(self, instance_id=None, **kwargs):
        return "fixed-id"

    async def execute(self, instance_id, parameters, **kwargs):
        self.count += parameters.get("step", 1)
        return str(self.count), 0.0, {}


class BrokenInit:
    def __init__(self, config, tool_schema=None):
        raise RuntimeError("cannot connect to the weather service")
