"""backend.tools: schemas, mocks, validation, execution, truncation and the file loaders."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
from typing import Literal

import pytest
from transformers.utils import get_json_schema

from backend.tools import (
    SandboxLimits,
    Tool,
    ToolLoadError,
    ToolRegistry,
    truncate_tool_response,
    validate_truncate_side,
)
from backend.trace import ToolCall, ToolResult

DATA = os.path.join(os.path.dirname(__file__), "data", "tools")


def data(name: str) -> str:
    return os.path.join(DATA, name)


def call(tool_name: str, **arguments) -> ToolCall:
    return ToolCall(name=tool_name, arguments=arguments, id=f"call_{tool_name}")


# ---- tool functions --------------------------------------------------------------------------


def get_current_temperature(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius"):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
        unit: The unit to return the temperature in.

    Returns:
        the temperature, the location, and the unit in a dict
    """
    return {"temperature": 22, "city": city, "unit": unit}


async def search(query: str, limit: int | None = None, tags: list[str] | None = None) -> list:
    """Search the web.

    Args:
        query: What to look for
        limit: Maximum number of hits
        tags: Filter tags
    """
    await asyncio.sleep(0)
    return [f"{query} #{i}" for i in range(limit or 2)]


def greet(name: str) -> str:
    """Say hello.

    Args:
        name: who to greet
    """
    print(f"greeting {name}")
    return f"Hello, {name}! ünïcödé"


def fail(x: str):
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError(f"backend down for {x}")


def sleepy(seconds: float):
    """Blocks.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke up"


async def async_sleepy(seconds: float):
    """Sleeps without blocking.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "woke up"


def long_text(n: int):
    """Returns n letters.

    Args:
        n: how many
    """
    return "".join(chr(ord("a") + i % 26) for i in range(n))


def returns_set(n: int):
    """Returns a set (not JSON).

    Args:
        n: size
    """
    return set(range(n))


def no_docstring(x: int):
    return x


# ---- schemas from functions ----------------------------------------------------------------------


def test_schemas_from_functions_equal_get_json_schema():
    fns = [get_current_temperature, search, greet]
    reg = ToolRegistry.from_functions(fns)
    assert reg.schemas == [get_json_schema(f) for f in fns]
    assert reg.names == ["get_current_temperature", "search", "greet"]
    assert len(reg) == 3 and "search" in reg and "nope" not in reg
    assert isinstance(reg.get("greet"), Tool) and reg.get("nope") is None
    assert all("mock" not in s for s in reg.schemas)


def test_schemas_are_copies():
    reg = ToolRegistry.from_functions([greet])
    reg.schemas[0]["function"]["name"] = "changed"
    assert reg.schemas[0]["function"]["name"] == "greet"


def test_function_without_docstring_is_a_load_error():
    with pytest.raises(ToolLoadError, match="no_docstring.*docstring"):
        ToolRegistry.from_functions([no_docstring])


def test_duplicate_names_are_rejected():
    with pytest.raises(ToolLoadError, match="two tools are named 'greet'"):
        ToolRegistry.from_functions([greet, greet])


# ---- running functions -----------------------------------------------------------------------


async def test_function_result_as_json_text():
    reg = ToolRegistry.from_functions([get_current_temperature])
    r = await reg.execute(call("get_current_temperature", city="Paris"))
    assert isinstance(r, ToolResult) and r.ok and r.error is None
    assert r.content == '{"temperature": 22, "city": "Paris", "unit": "celsius"}'
    assert r.call_id == "call_get_current_temperature" and r.name == "get_current_temperature"
    assert r.duration_s > 0 and not r.truncated and r.original_length is None


async def test_string_result_as_is_and_stdout_captured(capsys):
    reg = ToolRegistry.from_functions([greet])
    r = await reg.execute(call("greet", name="Ann"))
    assert r.ok and r.content == "Hello, Ann! ünïcödé"
    assert r.stdout == "greeting Ann\n"
    assert "greeting" not in capsys.readouterr().out  # the print went to the result, not the terminal
    print("after")  # stdout is restored
    assert capsys.readouterr().out == "after\n"


async def test_async_function_and_list_result():
    reg = ToolRegistry.from_functions([search])
    r = await reg.execute(call("search", query="cats", limit=3))
    assert r.ok and json.loads(r.content) == ["cats #0", "cats #1", "cats #2"]


async def test_unicode_is_not_escaped():
    def where(city: str):
        """Where.

        Args:
            city: a city
        """
        return {"city": city}

    r = await ToolRegistry.from_functions([where]).execute(call("where", city="Zürich"))
    assert r.content == '{"city": "Zürich"}'


async def test_non_serialisable_result_uses_str_and_a_note():
    r = await ToolRegistry.from_functions([returns_set]).execute(call("returns_set", n=3))
    assert r.ok and r.error is None and r.error_detail is None
    assert r.content == "{0, 1, 2}"
    assert "not JSON-serialisable" in r.note


async def test_calls_as_dicts():
    reg = ToolRegistry.from_functions([greet])
    r = await reg.execute({"name": "greet", "arguments": {"name": "Al"}, "id": "x1"})
    assert r.ok and r.call_id == "x1" and r.content.startswith("Hello, Al!")
    r = await reg.execute({"type": "function", "function": {"name": "greet", "arguments": '{"name": "Cy"}'}, "id": "x2"})
    assert r.ok and r.call_id == "x2" and r.content.startswith("Hello, Cy!")


async def test_arguments_given_as_json_string():
    reg = ToolRegistry.from_functions([greet])
    r = await reg.execute(ToolCall(name="greet", arguments='{"name": "Bo"}'))
    assert r.ok and r.content.startswith("Hello, Bo!")


# ---- errors ----------------------------------------------------------------------------------


async def test_unknown_tool_lists_available_tools():
    reg = ToolRegistry.from_functions([greet, fail])
    r = await reg.execute(call("foo"))
    assert not r.ok and r.error == "unknown_tool"
    assert r.content == "Error: unknown tool 'foo'. Available tools: greet, fail"
    r = await ToolRegistry().execute(call("foo"))
    assert r.content == "Error: unknown tool 'foo'. No tools are available."


@pytest.mark.parametrize(
    "arguments,needles",
    [
        ({"city": 3}, ["city: 3 is not of type 'string'"]),  # wrong type
        ({}, ["'city' is a required property"]),  # missing required
        ({"city": "Paris", "unit": "kelvin"}, ["unit: 'kelvin' is not one of ['celsius', 'fahrenheit']"]),
        ({"city": "Paris", "town": "x"}, ["unexpected keyword argument 'town'"]),  # not a parameter of the function
    ],
)
async def test_invalid_arguments_for_functions(arguments, needles):
    reg = ToolRegistry.from_functions([get_current_temperature])
    r = await reg.execute(ToolCall(name="get_current_temperature", arguments=arguments))
    assert not r.ok and r.error == "invalid_arguments"
    assert r.content.startswith("Error: invalid arguments for tool 'get_current_temperature': ")
    for n in needles:
        assert n in r.content
    assert "Expected parameters: city (string, required), unit (string)" in r.content


async def test_invalid_arguments_extra_property_and_several_problems():
    reg = ToolRegistry.from_file(data("mock_tools.json"))  # get_weather has additionalProperties: false
    r = await reg.execute(call("get_weather", city="Oslo", country="NO"))
    assert r.error == "invalid_arguments"
    assert "Additional properties are not allowed ('country' was unexpected)" in r.content
    r = await reg.execute(call("get_weather", unit="k", extra=1))
    assert r.error == "invalid_arguments"
    for needle in ("'city' is a required property", "('extra' was unexpected)", "unit: 'k' is not one of ['c', 'f']"):
        assert needle in r.content


@pytest.mark.parametrize("arguments,needle", [("[1, 2]", "got an array"), ("{not json", "not valid JSON"), (7, "got a number")])
async def test_arguments_that_are_not_an_object(arguments, needle):
    r = await ToolRegistry.from_functions([greet]).execute(ToolCall(name="greet", arguments=arguments))
    assert r.error == "invalid_arguments" and needle in r.content


async def test_exception_becomes_an_error_result():
    r = await ToolRegistry.from_functions([fail]).execute(call("fail", x="db"))
    assert not r.ok and r.error == "exception"
    assert r.content == "Error: tool 'fail' raised RuntimeError: backend down for db"
    assert "Traceback" in r.error_detail and "raise RuntimeError" in r.error_detail


async def test_sys_exit_and_base_exceptions_are_caught():
    def quits(code: int):
        """Exits.

        Args:
            code: exit code
        """
        sys.exit(code)

    class Weird(BaseException):
        pass

    async def weird():
        """Raises a BaseException subclass."""
        raise Weird("odd")

    async def async_quits():
        """Exits from a coroutine."""
        raise SystemExit(4)

    reg = ToolRegistry.from_functions([quits, weird, async_quits])
    r = await reg.execute(call("quits", code=3))
    assert r.error == "exception" and r.content == "Error: tool 'quits' called sys.exit(3)"
    r = await reg.execute(call("weird"))
    assert r.error == "exception" and "Weird: odd" in r.content
    r = await reg.execute(call("async_quits"))
    assert r.error == "exception" and "sys.exit(4)" in r.content


async def test_timeout_blocking_function():
    reg = ToolRegistry.from_functions([sleepy])
    t0 = time.perf_counter()
    r = await reg.execute(call("sleepy", seconds=30), timeout_s=0.3)
    elapsed = time.perf_counter() - t0
    assert r.error == "timeout" and not r.ok and elapsed < 15  # not the 30 s the tool sleeps
    assert r.content == "Error: tool 'sleepy' timed out after 0.3 s"
    r = await reg.execute(call("sleepy", seconds=0.01), timeout_s=2)
    assert r.ok and r.content == "woke up"


async def test_timeout_async_function():
    reg = ToolRegistry.from_functions([async_sleepy])
    t0 = time.perf_counter()
    r = await reg.execute(call("async_sleepy", seconds=30), timeout_s=0.3)
    assert r.error == "timeout" and time.perf_counter() - t0 < 15  # not the 30 s the tool sleeps


async def test_timeout_when_the_tool_ignores_cancellation():
    released = asyncio.Event()

    async def stubborn():
        """Refuses to be cancelled."""
        for _ in range(40):
            if released.is_set():
                break
            try:
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                pass
        return "done"

    t0 = time.perf_counter()
    try:
        r = await ToolRegistry.from_functions([stubborn]).execute(call("stubborn"), timeout_s=0.2)
        assert r.error == "timeout" and time.perf_counter() - t0 < 10  # the tool holds on for 20 s
    finally:
        # let it go: left running, it held the session's event loop open at its close (the last test
        # of a worker waited up to 20 s for it)
        released.set()


async def test_concurrent_calls_run_in_parallel():
    """Four blocking calls and four async calls overlap: each waits at a barrier that only opens
    when all four of its kind are running at the same time (serial execution would time out)."""
    import threading

    sync_barrier = threading.Barrier(4, timeout=20)
    async_barrier = asyncio.Barrier(4)

    def meet_blocking() -> str:
        """Waits for the other three blocking calls."""
        sync_barrier.wait()
        return "met"

    async def meet_async() -> str:
        """Waits for the other three async calls."""
        await asyncio.wait_for(async_barrier.wait(), 20)
        return "met"

    reg = ToolRegistry.from_functions([meet_blocking, meet_async])
    rs = await asyncio.gather(*[reg.execute(call("meet_blocking"), timeout_s=30) for _ in range(4)],
                              *[reg.execute(call("meet_async"), timeout_s=30) for _ in range(4)])
    assert [r.content for r in rs] == ["met"] * 8, [r.content for r in rs]


async def test_execute_is_cancellable():
    reg = ToolRegistry.from_functions([async_sleepy])
    task = asyncio.ensure_future(reg.execute(call("async_sleepy", seconds=5)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ---- truncation ------------------------------------------------------------------------------

ALPHA = "abcdefghijklmnopqrst"  # 20 characters


@pytest.mark.parametrize(
    "side,n,expected",
    [
        ("left", 10, "abcdefghij...(truncated)"),
        ("right", 10, "(truncated)...klmnopqrst"),
        ("middle", 10, "abcde...(truncated)...pqrst"),
        ("middle", 7, "abc...(truncated)...rst"),  # n // 2 == 3 from each end
        ("middle", 1, "...(truncated)..."),  # verl's text[-0:] would keep everything
        ("left", 0, "...(truncated)"),
        ("right", 0, "(truncated)..."),
    ],
)
def test_truncate_tool_response(side, n, expected):
    assert truncate_tool_response(ALPHA, n, side) == (expected, True)


def test_truncate_only_when_longer():
    for side in ("left", "right", "middle"):
        assert truncate_tool_response(ALPHA, 20, side) == (ALPHA, False)
        assert truncate_tool_response(ALPHA, None, side) == (ALPHA, False)


def test_validate_truncate_side():
    assert validate_truncate_side("left") == "left"
    with pytest.raises(ValueError, match="left, right, middle"):
        validate_truncate_side("top")
    with pytest.raises(ValueError):
        truncate_tool_response(ALPHA, 3, "top")


@pytest.mark.parametrize(
    "side,expected",
    [("left", "abcdefghij...(truncated)"), ("right", "(truncated)...klmnopqrst"), ("middle", "abcde...(truncated)...pqrst")],
)
async def test_execute_truncates(side, expected):
    reg = ToolRegistry.from_functions([long_text])
    r = await reg.execute(call("long_text", n=20), max_response_length=10, truncate_side=side)
    assert r.ok and r.content == expected and r.truncated and r.original_length == 20
    r = await reg.execute(call("long_text", n=10), max_response_length=10, truncate_side=side)
    assert r.content == "abcdefghij" and not r.truncated and r.original_length is None


async def test_error_messages_are_truncated_too():
    r = await ToolRegistry.from_functions([greet]).execute(call("nope"), max_response_length=10, truncate_side="left")
    assert r.content == "Error: unk...(truncated)" and r.truncated and r.error == "unknown_tool"


# ---- mocks -----------------------------------------------------------------------------------


def weather_schema(**extra_props):
    props = {"city": {"type": "string"}, "days": {"type": "integer"}, **extra_props}
    return {"type": "function", "function": {"name": "weather", "description": "Weather.",
                                             "parameters": {"type": "object", "properties": props, "required": ["city"]}}}


@pytest.mark.parametrize(
    "mock,arguments,expected",
    [
        ({"temperature": 21}, {"city": "Rome"}, '{"temperature": 21}'),  # plain value shorthand
        ("It is sunny in {city}", {"city": "Rome"}, "It is sunny in {city}"),  # a plain string is NOT a template
        (21.5, {"city": "Rome"}, "21.5"),
        (None, {"city": "Rome"}, "null"),
        ({"value": {"template": "x"}}, {"city": "Rome"}, '{"template": "x"}'),  # explicit value form
        ({"value": "ünï"}, {"city": "Rome"}, "ünï"),
        ({"template": "It is 22C in {city}"}, {"city": "Rome"}, "It is 22C in Rome"),
        ({"template": "{city} for {days} days"}, {"city": "Rome", "days": 3}, "Rome for 3 days"),
        ({"template": "{{literal}} {city}"}, {"city": "Rome"}, "{literal} Rome"),
        ({"template": {"city": "{city}", "days": "{days}", "note": "in {city}"}}, {"city": "Rome", "days": 3},
         '{"city": "Rome", "days": 3, "note": "in Rome"}'),  # a lone placeholder keeps the type
        ({"template": ["{city}", 1]}, {"city": "Rome"}, '["Rome", 1]'),
    ],
)
async def test_mock_results(mock, arguments, expected):
    reg = ToolRegistry.from_schemas([{**weather_schema(), "mock": mock}])
    assert reg.schemas == [weather_schema()]
    r = await reg.execute(ToolCall(name="weather", arguments=arguments))
    assert r.ok, r.content
    assert r.content == expected


async def test_mock_template_missing_argument_is_an_error_result():
    reg = ToolRegistry.from_schemas([{**weather_schema(), "mock": {"template": "{city} for {days} days"}}])
    r = await reg.execute(call("weather", city="Rome"))
    assert not r.ok and r.error == "invalid_arguments"
    assert r.content == "Error: tool 'weather' needs the argument 'days' (its mock result uses it) but it was not given"


async def test_mock_template_uses_schema_default():
    schema = weather_schema(unit={"type": "string", "default": "C"})
    reg = ToolRegistry.from_schemas([{**schema, "mock": {"template": "21{unit} in {city}"}}])
    assert (await reg.execute(call("weather", city="Rome"))).content == "21C in Rome"
    assert (await reg.execute(call("weather", city="Rome", unit="F"))).content == "21F in Rome"


@pytest.mark.parametrize(
    "mock,needle",
    [
        ({"template": "in {town}"}, "uses {town} but the tool has no such parameter"),
        ({"template": "a { b"}, "unbalanced brace"),
        ({"template": "{not valid}"}, "bad placeholder"),
        ({"template": 3}, "must be a string, an object or a list"),
    ],
)
def test_bad_mock_templates_fail_at_load(mock, needle):
    with pytest.raises(ToolLoadError) as e:
        ToolRegistry.from_schemas([{**weather_schema(), "mock": mock}])
    assert needle in str(e.value) and "weather" in str(e.value)


async def test_schema_without_mock_answers_with_a_marked_placeholder():
    """A plain OpenAI tools list (no "mock") loads; a call gets a placeholder result that says
    so, marked mock=default on the ToolResult, and the registry lists the tool for the trace."""
    reg = ToolRegistry.from_schemas([weather_schema(), {**weather_schema(), "function": {**weather_schema()["function"], "name": "w2"}, "mock": "sunny"}])
    assert reg.schemas[0] == weather_schema() and reg.default_mock_tools == ["weather"]
    r = await reg.execute(call("weather", city="Rome"))
    assert r.ok and r.content == "[placeholder result: no \"mock\" is defined for tool 'weather']"
    assert r.mock == "default" and "placeholder" in r.note
    assert ToolResult.model_validate_json(r.model_dump_json()).mock == "default"  # kept in a saved trace
    r2 = await reg.execute(call("w2", city="Rome"))
    assert r2.content == "sunny" and getattr(r2, "mock", None) is None
    bad = await reg.execute(call("weather", town="Rome"))  # arguments are still validated
    assert not bad.ok and bad.error == "invalid_arguments"
    assert reg.trace_notes() == {"default_mock_tools": ["weather"]}
    assert any("placeholder" in n and "weather" in n for n in reg.notes())


def test_flat_schema_is_normalised():
    reg = ToolRegistry.from_schemas([{"name": "ping", "description": "Ping.", "parameters": {"type": "object", "properties": {}}, "mock": "pong"}])
    assert reg.schemas == [{"type": "function", "function": {"name": "ping", "description": "Ping.", "parameters": {"type": "object", "properties": {}}}}]


# ---- files -----------------------------------------------------------------------------------


async def test_json_file():
    reg = ToolRegistry.from_file(data("mock_tools.json"))
    with open(data("mock_tools.json")) as f:
        raw = json.load(f)
    assert reg.schemas == [{k: v for k, v in t.items() if k != "mock"} for t in raw]
    r = await reg.execute(call("get_weather", city="Oslo"))
    assert r.content == '{"city": "Oslo", "temperature": 21, "unit": "c"}'
    assert (await reg.execute(call("ping"))).content == "pong"


async def test_py_file_loads_only_documented_functions_defined_there():
    reg = ToolRegistry.from_file(data("weather_tools.py"))
    assert reg.names == ["get_current_temperature", "get_forecast"]
    assert {s["name"]: s["reason"] for s in reg.skipped} == {"helper_without_docstring": "no docstring"}
    mod = importlib.import_module("tests.data.tools.weather_tools")
    assert reg.schemas == [get_json_schema(mod.get_current_temperature), get_json_schema(mod.get_forecast)]
    r = await reg.execute(call("get_forecast", city="Lima", days=2))
    assert r.content == "2 sunny days in Lima"
    r = await reg.execute(call("get_current_temperature", city="Lima"))
    assert json.loads(r.content) == {"city": "Lima", "temperature": 22, "unit": "celsius"}
    assert reg.get("get_forecast").source.endswith("weather_tools.py:19")


async def test_yaml_verl_style_tools():
    from tests.data.tools.verl_style import WeatherTool

    WeatherTool.events.clear()
    reg = ToolRegistry.from_file(data("verl_tools.yaml"))
    assert reg.names == ["get_weather", "count"]
    assert reg.schemas[0] == {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}},
    }
    assert reg.schemas[1]["function"]["parameters"] == {"type": "object", "properties": {"step": {"type": "integer"}}}
    assert reg.get("get_weather").instance.name == "get_weather"  # the class read tool_schema.function.name

    r = await reg.execute(call("get_weather", city="Lyon"))
    assert r.ok and r.content == "Lyon: 21F" and r.reward == 0.5 and r.metrics == {"calls": 1}
    assert [e[0] for e in WeatherTool.events] == ["create", "execute", "release"]
    assert len({e[1] for e in WeatherTool.events}) == 1  # one instance id through the whole call

    WeatherTool.events.clear()
    r = await reg.execute(call("get_weather", city="Nowhere"))
    assert r.error == "exception" and "LookupError: no weather station in Nowhere" in r.content
    assert [e[0] for e in WeatherTool.events] == ["create", "execute", "release"]  # released after the error

    r = await reg.execute(call("get_weather", city="Slowtown"), timeout_s=0.2)
    assert r.error == "timeout"

    r = await reg.execute(call("get_weather"))
    assert r.error == "invalid_arguments" and "'city' is a required property" in r.content

    assert (await reg.execute(call("count", step=5))).content == "15"  # create() -> id, execute() -> str
    assert (await reg.execute(call("count"))).content == "16"


def test_verl_config_dict_and_schema_from_the_class():
    reg = ToolRegistry.from_verl_config({"tools": [{"class_name": "tests.data.tools.verl_style.WeatherTool", "config": {}}]})
    assert reg.names == ["get_weather"] and reg.get("get_weather").kind == "verl"
    assert reg.schemas[0]["function"]["description"] == "Weather in a city."


def test_yaml_list_of_mock_schemas(tmp_path):
    p = tmp_path / "t.yml"
    p.write_text("- type: function\n  function: {name: ping, parameters: {type: object, properties: {}}}\n  mock: pong\n")
    assert ToolRegistry.from_file(str(p)).names == ["ping"]


@pytest.mark.parametrize(
    "name,needles",
    [
        ("bad_syntax.py", ["syntax error in bad_syntax.py at line 10", "def broken(x: int)"]),
        ("raises_on_import.py", ["raises_on_import.py raised KeyError while loading (line 3)", "ALI_SURELY_MISSING_VARIABLE"]),
        ("no_tools.py", ["no tools found in no_tools.py", "helper (no docstring)"]),
        ("missing_hints.py", ["function 'add' (line 1)", "type hint"]),
        ("bad_json.json", ["bad_json.json: invalid JSON at line 3"]),
        ("bad_parameters.json", ["bad_parameters.json: tools[0]: tool 'lookup'", "parameters/properties/q/type",
                                 "unknown type 'strin'", "did you mean 'string'"]),
        ("bad_yaml.yaml", ["bad_yaml.yaml: invalid YAML at line"]),
        ("missing_class.yaml", ["tools[0]", "has no attribute 'NoSuchTool'"]),
        ("missing_module.yaml", ["cannot import no_such_package_xyz.tools.Weather", "No module named 'no_such_package_xyz'"]),
        ("broken_init.yaml", ["raised RuntimeError: cannot connect to the weather service"]),
        ("mcp.yaml", ["MCP tools are not supported"]),
        ("does_not_exist.json", ["does not exist"]),
        ("__init__.py", ["no tools found"]),
    ],
)
def test_bad_files_raise_tool_load_error(name, needles):
    with pytest.raises(ToolLoadError) as e:
        ToolRegistry.from_file(data(name))
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_other_bad_inputs(tmp_path):
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ToolLoadError, match="use a .py, .json, .yaml or .yml file"):
        ToolRegistry.from_file(str(tmp_path / "t.txt"))
    (tmp_path / "s.json").write_text('"just a string"')
    with pytest.raises(ToolLoadError, match="expected a list of tool schemas"):
        ToolRegistry.from_file(str(tmp_path / "s.json"))
    (tmp_path / "b.json").write_bytes(b"\xff\xfe[]")
    with pytest.raises(ToolLoadError, match="not UTF-8"):
        ToolRegistry.from_file(str(tmp_path / "b.json"))
    (tmp_path / "exit.py").write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(ToolLoadError, match="raised SystemExit while loading"):
        ToolRegistry.from_file(str(tmp_path / "exit.py"))
    with pytest.raises(ToolLoadError, match="only \"type\": \"function\""):
        ToolRegistry.from_schemas([{"type": "retrieval", "function": {"name": "x"}, "mock": 1}])


# ---- python source ---------------------------------------------------------------------------

SOURCE = '''
import math


def hypot(a: float, b: float) -> float:
    """Length of the hypotenuse.

    Args:
        a: first side
        b: second side
    """
    print("computing")
    return math.hypot(a, b)


async def shout(text: str) -> str:
    """Upper-case text.

    Args:
        text: what to shout
    """
    return text.upper()


def _helper(x):
    return x
'''


async def test_python_source_in_process():
    reg = ToolRegistry.from_python_source(SOURCE, sandboxed=False)
    assert reg.names == ["hypot", "shout"]
    r = await reg.execute(call("hypot", a=3, b=4))
    assert r.content == "5.0" and r.stdout == "computing\n"


def test_python_source_syntax_error_has_the_line():
    bad = "def f(x: int):\n    '''Doc.'''\n    return (x\n\n"
    with pytest.raises(ToolLoadError, match="line 3"):
        ToolRegistry.from_python_source(bad, sandboxed=False)
    with pytest.raises(ToolLoadError, match="syntax error in the tool code at line 3"):
        ToolRegistry.from_python_source(bad, sandboxed=True)


async def test_python_source_sandboxed():
    reg = await asyncio.to_thread(ToolRegistry.from_python_source, SOURCE, sandboxed=True)
    ns: dict = {}
    exec(compile(SOURCE, "<tools>", "exec"), ns)  # the same functions, here, for the expected schemas
    assert reg.schemas == [get_json_schema(ns["hypot"]), get_json_schema(ns["shout"])]
    assert [t.kind for t in reg] == ["sandboxed", "sandboxed"]
    r = await reg.execute(call("hypot", a=3, b=4))
    assert r.ok and r.content == "5.0" and r.stdout == "computing\n" and r.sandbox["returncode"] == 0
    r = await reg.execute(call("shout", text="hey"))
    assert r.ok and r.content == "HEY"
    r = await reg.execute(call("hypot", a="x", b=4))
    assert r.error == "invalid_arguments"  # validated here, before any process starts
    # loading the same code again is served from the discovery cache: no second child process
    from backend.tools import sandboxed_tool

    def no_child(*a, **k):
        raise AssertionError("discovery ran again")

    orig = sandboxed_tool.run_discovery
    sandboxed_tool.run_discovery = no_child
    try:
        again = ToolRegistry.from_python_source(SOURCE)
    finally:
        sandboxed_tool.run_discovery = orig
    assert again.schemas == reg.schemas


HINTS_SOURCE = '''
from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union


class Point:
    pass


def many(a: int, b: float, c: str, d: bool, e: list, f: tuple, g: dict, h: Any, i: Optional[int], j: Union[int, str],
         k: int | None, l: Literal["x", "y"], m: Literal[1, "a", True, None, 2.5], n: list[int], o: List[str],
         p: dict[str, int], q: Dict, r: tuple[int, str], s: Tuple, t: list[dict[str, list[int]]], u: Point,
         v: Annotated[int, "meta"], w: Union[list[int], dict[str, int], None], x: Point | None, *, y: int = 3,
         z: str = "q") -> dict[str, int]:
    """Many kinds of type hints.

    Args:
        a: a
        b: b
        c: c (choices: ["p", "q"])
        d: d
        e: e
        f: f
        g: g
        h: h
        i: i
        j: j
        k: k
        l: l
        m: m
        n: n
        o: o
        p: p
        q: q
        r: r
        s: s
        t: t
        u: u
        v: v
        w: w
        x: x
        y: y
        z: z

    Returns:
        a mapping
    """


def method_like(self, city: str, *args: int, **kwargs: str):
    """A leading un-annotated self is skipped.

    Args:
        city: the city
        args: more
        kwargs: even more
    """


def no_args():
    """Nothing at all."""
'''


def test_sandboxed_schemas_match_get_json_schema_for_all_hint_kinds():
    reg = ToolRegistry.from_python_source(HINTS_SOURCE, sandboxed=True)
    ns: dict = {}
    exec(compile(HINTS_SOURCE, "<tools>", "exec"), ns)
    assert reg.names == ["many", "method_like", "no_args"]
    assert reg.schemas == [get_json_schema(ns[n]) for n in reg.names]


@pytest.mark.parametrize(
    "source,needle",
    [
        ("def f(x: tuple[int]):\n    \"\"\"Doc.\n\n    Args:\n        x: one\n    \"\"\"\n", "Tuple with a single element"),
        ("def f(x):\n    \"\"\"Doc.\n\n    Args:\n        x: one\n    \"\"\"\n", "missing a type hint"),
        ("def f(x: int):\n    \"\"\"Doc.\"\"\"\n", "no description for the argument 'x'"),
        ("def f(x: set[int]):\n    \"\"\"Doc.\n\n    Args:\n        x: one\n    \"\"\"\n", "Couldn't parse this type hint"),
        ("def f(x: 'Nope'):\n    \"\"\"Doc.\n\n    Args:\n        x: one\n    \"\"\"\n", "NameError"),
        ("x = 1\n", "no tools found"),
        ("import sys\nsys.exit(1)\n", "raised SystemExit at line 2 while loading"),
        ("raise ValueError('bad config')\n", "raised ValueError at line 1 while loading: bad config"),
    ],
)
def test_sandboxed_load_errors(source, needle):
    with pytest.raises(ToolLoadError) as e:
        ToolRegistry.from_python_source(source, sandboxed=True)
    assert needle in str(e.value)


def test_sandbox_limits_are_hashable_settings():
    assert SandboxLimits() == SandboxLimits() and hash(SandboxLimits(memory_mb=256))
    assert SandboxLimits().child_limits(2.0)["cpu_s"] == 3


async def test_sandbox_startup_has_its_own_timeout(tmp_path):
    from backend.tools.sandbox import describe_protections, run_child

    request = {"mode": "call", "code": "def f():\n    '''Doc.'''\n    return 1\n", "function": "f", "arguments": {}}
    # An interpreter that never reaches the ready signal. (A 1 ms limit on the real interpreter
    # was racy: on a loaded machine the child could finish before the event loop looked.)
    pid_file = tmp_path / "pid"
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    slow.chmod(0o755)
    run = await run_child(request, SandboxLimits(python=str(slow)), 5.0, startup_timeout_s=1.0)
    assert run.timed_out and "did not start within 1 s" in run.notes[0] and run.payload is None
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the stuck child was killed and reaped, not left behind
        os.kill(pid, 0)
    run = await run_child(request, SandboxLimits(), 5.0)
    assert run.payload == {"status": "ok", "content": "1", "note": None, "truncated": False, "original_length": None}
    info = describe_protections()
    assert info["environment"] == ["PATH"] and info["memory_mb"] == 512


# ---- tool definitions as people have them: plain OpenAI lists, [] and catalogue types ----------

# A small catalogue in the style of the Berkeley Function Calling Leaderboard's: "dict" objects,
# "float", "tuple", "any", "long", "String", nested objects in arrays, an object with no properties
BFCL_TOOLS = [
    {"type": "function", "function": {
        "name": "calculate_triangle_area", "description": "Calculate the area of a triangle given its base and height.",
        "parameters": {"type": "dict", "properties": {
            "base": {"type": "float", "description": "The base of the triangle."},
            "height": {"type": "float", "description": "The height of the triangle."},
            "unit": {"type": "String", "description": "The unit of measure (defaults to 'units' if not specified)", "default": "units"}},
            "required": ["base", "height"]}}},
    {"type": "function", "function": {
        "name": "geometry.calculate_distance", "description": "Calculate the distance between two points.",
        "parameters": {"type": "dict", "properties": {
            "point_a": {"type": "tuple", "items": {"type": "float"}, "description": "(x, y) of the first point."},
            "point_b": {"type": "tuple", "items": {"type": "float"}, "description": "(x, y) of the second point."},
            "precision": {"type": "long", "description": "Number of decimal places."}},
            "required": ["point_a", "point_b"]}}},
    {"type": "function", "function": {
        "name": "database.query", "description": "Query the database with conditions.",
        "parameters": {"type": "dict", "properties": {
            "table": {"type": "String", "description": "Name of the table."},
            "conditions": {"type": "array", "description": "Conditions to apply.", "items": {"type": "dict", "properties": {
                "field": {"type": "string"}, "operation": {"type": "string", "enum": ["<", ">", "=", ">=", "<="]},
                "value": {"type": "any", "description": "The value to compare with."}},
                "required": ["field", "operation", "value"]}},
            "options": {"type": "dict", "description": "Extra driver options."}},
            "required": ["table", "conditions"]}}},
]
BFCL_MAPPINGS = [
    ("calculate_triangle_area", "parameters/type", "dict", "object"),
    ("calculate_triangle_area", "parameters/properties/base/type", "float", "number"),
    ("calculate_triangle_area", "parameters/properties/height/type", "float", "number"),
    ("calculate_triangle_area", "parameters/properties/unit/type", "String", "string"),
    ("geometry.calculate_distance", "parameters/type", "dict", "object"),
    ("geometry.calculate_distance", "parameters/properties/point_a/type", "tuple", "array"),
    ("geometry.calculate_distance", "parameters/properties/point_a/items/type", "float", "number"),
    ("geometry.calculate_distance", "parameters/properties/point_b/type", "tuple", "array"),
    ("geometry.calculate_distance", "parameters/properties/point_b/items/type", "float", "number"),
    ("geometry.calculate_distance", "parameters/properties/precision/type", "long", "integer"),
    ("database.query", "parameters/type", "dict", "object"),
    ("database.query", "parameters/properties/table/type", "String", "string"),
    ("database.query", "parameters/properties/conditions/items/type", "dict", "object"),
    ("database.query", "parameters/properties/conditions/items/properties/value/type", "any", None),
    ("database.query", "parameters/properties/options/type", "dict", "object"),
]
MESSAGES = [{"role": "user", "content": "What is the area of a triangle with base 10 and height 5?"}]


def _reference_render(bundle, tools, messages=MESSAGES):
    kw = dict(add_generation_prompt=True, chat_template=bundle.chat_template, **bundle.chat_template_kwargs)
    text = bundle.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, **kw)
    ids = bundle.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=False, **kw)
    return text, list(ids)


@pytest.mark.parametrize("profile", ["qwen3", "qwen2.5"])
def test_catalogue_types_render_exactly_as_transformers(tmp_path, profile):
    """(a) The tools as given go into the template: render() of a catalogue with dict / float /
    tuple / any / long / String equals transformers' apply_chat_template, text and ids; the file
    loader for rendering keeps the types and reports what a run reads them as."""
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import render
    from backend.tools import schemas_for_rendering

    bundle = load_tokenizer(profile)
    p = tmp_path / "bfcl.json"
    p.write_text(json.dumps(BFCL_TOOLS))
    loaded = schemas_for_rendering(str(p))
    assert loaded.schemas == BFCL_TOOLS  # as given
    assert [(m.tool, m.path, m.given, m.used) for m in loaded.type_mappings] == BFCL_MAPPINGS
    assert len(loaded.notes) == 1 and "15 parameter type name(s) in 3 tool(s) are not JSON Schema" in loaded.notes[0]
    text, ids = _reference_render(bundle, BFCL_TOOLS)
    r = render(bundle, MESSAGES, loaded.schemas)
    assert r.text == text and r.token_ids == ids
    assert '"type": "dict"' in r.text and '"type": "tuple"' in r.text and '"type": "any"' in r.text


async def test_catalogue_types_validate_as_json_schema_and_the_mapping_is_reported():
    """(b) Argument validation reads the dialect as JSON Schema (jsonschema), and the registry
    reports every name it mapped; the schemas the model sees are unchanged."""
    reg = ToolRegistry.from_schemas(BFCL_TOOLS)
    assert reg.schemas == BFCL_TOOLS
    assert [(m.tool, m.path, m.given, m.used) for m in reg.type_mappings] == BFCL_MAPPINGS
    notes = reg.trace_notes()
    assert notes["tool_type_mappings"][0] == {"tool": "calculate_triangle_area", "path": "parameters/type", "given": "dict", "used": "object"}
    assert notes["default_mock_tools"] == ["calculate_triangle_area", "geometry.calculate_distance", "database.query"]
    assert "dict→object ×5" in reg.notes()[0] and "any→(any type)" in reg.notes()[0]

    async def problems(name, **args):
        r = await reg.execute(call(name, **args))
        return None if r.ok else r.content

    assert await problems("calculate_triangle_area", base=10, height=5.5, unit="cm") is None
    assert "base: 'ten' is not of type 'number'" in await problems("calculate_triangle_area", base="ten", height=5)
    assert "'height' is a required property" in await problems("calculate_triangle_area", base=10)
    assert await problems("geometry.calculate_distance", point_a=[0, 0], point_b=[3.5, 4], precision=2) is None
    assert "is not of type 'integer'" in await problems("geometry.calculate_distance", point_a=[0, 0], point_b=[3, 4], precision=2.5)
    assert "is not of type 'number'" in await problems("geometry.calculate_distance", point_a=["x", 0], point_b=[3, 4])
    for value in (1, "a", None, [1, {"x": 2}], {"k": True}):  # "any": no constraint
        assert await problems("database.query", table="t", conditions=[{"field": "f", "operation": "=", "value": value}],
                              options={"anything": [1, 2]}) is None
    assert "'value' is a required property" in await problems("database.query", table="t", conditions=[{"field": "f", "operation": "="}])
    assert "is not one of" in await problems("database.query", table="t", conditions=[{"field": "f", "operation": "!=", "value": 1}])


def test_catalogue_types_tool_choice_required_grammar_accepts_a_valid_call():
    """(c) tool_choice=required built from the catalogue (xgrammar, real qwen3 token ids) accepts
    a valid call to each tool, an arbitrary object for the property-less "dict", any value for
    "any", and refuses a call that breaks the mapped types."""
    from backend.loading.tokenizers import load_tokenizer
    from backend.tool_choice import build_constraint, check_ids

    tok = load_tokenizer("qwen3").tokenizer
    c = build_constraint("required", "hermes", ToolRegistry.from_schemas(BFCL_TOOLS).schemas)

    def turn(*calls):
        text = "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)
        return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]

    ok = [("calculate_triangle_area", {"base": 10.0, "height": 5}),
          ("geometry.calculate_distance", {"point_a": [0, 0.5], "point_b": [3, 4], "precision": 2}),
          ("database.query", {"table": "users", "conditions": [{"field": "age", "operation": ">", "value": 30},
                                                               {"field": "name", "operation": "=", "value": "Ann"}],
                              "options": {"timeout_ms": 500, "tags": ["a"]}})]
    for one in ok:
        assert check_ids(c, tok, turn(one)) is None, one
    assert check_ids(c, tok, turn(*ok)) is None
    assert check_ids(c, tok, turn(("calculate_triangle_area", {"base": "ten", "height": 5})))
    assert check_ids(c, tok, turn(("geometry.calculate_distance", {"point_a": [0, 0], "point_b": [3, 4], "precision": 2.5})))


def test_unknown_type_names_are_refused_for_runs_with_the_field_and_the_fix_but_render(tmp_path):
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import render
    from backend.tool_choice import ToolChoiceError, build_constraint
    from backend.tools import schemas_for_rendering

    tools = [{"type": "function", "function": {"name": "book", "description": "Book a slot.", "parameters": {
        "type": "object", "properties": {"when": {"type": "datetime"}, "n": {"type": "integer"}}}}}]
    with pytest.raises(ToolLoadError) as e:
        ToolRegistry.from_schemas(tools)
    msg = str(e.value)
    assert "tool 'book'" in msg and "parameters/properties/when/type" in msg and "unknown type 'datetime'" in msg
    assert "use a JSON Schema type" in msg and 'leave "type" out' in msg
    with pytest.raises(ToolChoiceError, match="parameters/properties/when/type"):
        build_constraint("required", "hermes", tools)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(tools))
    loaded = schemas_for_rendering(str(p))  # rendering needs no JSON Schema: noted, not refused
    assert loaded.schemas == tools and any("unknown type 'datetime'" in n and "a run refuses it" in n for n in loaded.notes)
    bundle = load_tokenizer("qwen3")
    assert render(bundle, MESSAGES, loaded.schemas).text == _reference_render(bundle, tools)[0]
    # a schema mistake that is not a type name: the field and how to fix it
    with pytest.raises(ToolLoadError, match=r'parameters/properties/n/required: True is not of type .array.*fix parameters/properties/n/required: "required" is a list of property names'):
        ToolRegistry.from_schemas([{"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "required": True}}}}])


def test_dialect_mapping_rules():
    from backend.tools import to_json_schema
    from backend.tools.dialect import TYPE_NAMES

    given = {"type": "DICT", "properties": {
        "a": {"type": ["Float", "NULL"]}, "b": {"type": ["string", "Any"]}, "c": {"type": "Boolean"},
        "d": {"type": "list", "items": [{"type": "INT"}, {"type": "str"}]}, "e": {"type": "string"},
        "f": {"anyOf": [{"type": "double"}, {"type": "bool"}]}, "type": {"type": "Integer"}}}
    before = json.dumps(given)
    out, mappings = to_json_schema(given)
    assert json.dumps(given) == before  # the input is not changed
    assert out == {"type": "object", "properties": {
        "a": {"type": ["number", "null"]}, "b": {}, "c": {"type": "boolean"},
        "d": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, "e": {"type": "string"},
        "f": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}, "type": {"type": "integer"}}}
    assert [(m.path, m.given, m.used) for m in mappings] == [
        ("parameters/type", "DICT", "object"), ("parameters/properties/a/type", ["Float", "NULL"], ["number", "null"]),
        ("parameters/properties/b/type", ["string", "Any"], None), ("parameters/properties/c/type", "Boolean", "boolean"),
        ("parameters/properties/d/type", "list", "array"), ("parameters/properties/d/items", "a list of schemas", "prefixItems"),
        ("parameters/properties/d/prefixItems/0/type", "INT", "integer"), ("parameters/properties/d/prefixItems/1/type", "str", "string"),
        ("parameters/properties/f/anyOf/0/type", "double", "number"), ("parameters/properties/f/anyOf/1/type", "bool", "boolean"),
        ("parameters/properties/type/type", "Integer", "integer")]
    assert to_json_schema({"type": "object", "properties": {"x": {"type": "string"}}})[1] == []  # JSON Schema: nothing to report
    # draft-07 reads a list "items" itself
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "integer"}]}
    assert to_json_schema(d7) == (d7, [])
    assert {TYPE_NAMES[k] for k in ("dict", "float", "double", "tuple", "any", "long", "string", "int", "bool", "boolean", "list")} == \
        {"object", "number", "array", None, "integer", "string", "boolean"}


def test_plain_openai_list_and_empty_list_load_from_files(tmp_path):
    reg = ToolRegistry.from_file(data("no_mock.json"))  # a plain OpenAI tools list
    assert reg.names == ["lookup"] and reg.default_mock_tools == ["lookup"]
    for doc in ("[]", '{"tools": []}'):
        (tmp_path / "e.json").write_text(doc)
        assert len(ToolRegistry.from_file(str(tmp_path / "e.json"))) == 0
    (tmp_path / "e.yaml").write_text("tools: []\n")
    assert len(ToolRegistry.from_file(str(tmp_path / "e.yaml"))) == 0
    from backend.tools import schemas_for_rendering

    assert schemas_for_rendering(str(tmp_path / "e.json")).schemas == []
    # flat entries are wrapped, "mock" dropped; the rest is as given
    (tmp_path / "f.json").write_text(json.dumps([{"name": "ping", "description": "Ping.", "parameters": {"type": "dict", "properties": {}}, "mock": "pong"}]))
    assert schemas_for_rendering(str(tmp_path / "f.json")).schemas == [
        {"type": "function", "function": {"name": "ping", "description": "Ping.", "parameters": {"type": "dict", "properties": {}}}}]


async def test_engine_trace_records_placeholders_and_type_mappings():
    """A run with a catalogue and no mocks: the call gets the placeholder, its ToolResult says
    mock=default, and the trace's metadata lists the mapped types and the tools without a mock."""
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.loading.tokenizers import load_tokenizer
    from backend.trace import Trace

    bundle = load_tokenizer("qwen3")
    script = ['<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"height": 5, "base": 10}}\n</tool_call>', "25."]
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, script), bundle, tools=ToolRegistry.from_schemas(BFCL_TOOLS),
                     config=LoopConfig(tool_choice=["required", "auto"]))
    t = await loop.run(MESSAGES)
    assert t.termination_reason == "no_tool_calls", t.steps[1].error
    res = t.steps[2].tool_results[0]
    assert res.mock == "default" and res.content.startswith("[placeholder result:")
    assert t.tools == BFCL_TOOLS
    again = Trace.from_json(t.to_json())
    assert [tuple(m.values()) for m in again.metadata["tool_type_mappings"]] == BFCL_MAPPINGS
    assert again.metadata["default_mock_tools"] == ["calculate_triangle_area", "geometry.calculate_distance", "database.query"]
    assert again.steps[2].tool_results[0].mock == "default"


def test_template_lab_renders_plain_schemas_catalogue_types_and_an_empty_list():
    """The template lab passes the tools box straight to render: a plain OpenAI list (no "mock"),
    catalogue types and [] all render, equal to apply_chat_template."""
    from backend.loading.tokenizers import load_tokenizer
    from ui import template_lab
    from ui.context import AppContext

    ctx = AppContext()
    bundle = load_tokenizer("qwen3")
    plain = [{"type": "function", "function": {"name": "lookup", "description": "Look up.", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
    for tools in (plain, BFCL_TOOLS, []):
        summary, _, _, r = template_lab.render_one(ctx, "qwen3", template_lab.OWN, "", MESSAGES, tools, True, {}, "t")
        assert r is not None, summary
        assert r.text == _reference_render(bundle, tools)[0]
    out = template_lab.run_lab(ctx, json.dumps(MESSAGES), "[]", True, "{}", False, "qwen3", template_lab.OWN, "", "", "", "")
    assert 'data-count="tokens"' in out[0] and "ali-err" not in out[0]


def test_check_validates_catalogue_typed_arguments():
    """`check` (diagnostics) validated arguments only against valid JSON Schema: a trace whose
    tools use catalogue types had its arguments silently unchecked. They are read as the tools
    read them."""
    import asyncio

    from backend.checks.diagnostics import check
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.loading.tokenizers import load_tokenizer

    bundle = load_tokenizer("qwen3")
    bad = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": "ten", "height": 5}}\n</tool_call>'
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, [bad, "?"]), bundle, tools=ToolRegistry.from_schemas(BFCL_TOOLS), config=LoopConfig())
    t = asyncio.run(loop.run(MESSAGES))
    found = [f for f in check(t) if f.code == "invalid_arguments"]
    assert len(found) == 1 and "base: 'ten' is not of type 'number'" in found[0].message


# ---- the package's structure -----------------------------------------------------------------


async def test_a_new_tool_kind_is_one_subclass_of_tool():
    """A kind implements ``_invoke``; validation, error wrapping, truncation and the ToolResult
    come from Tool and the registry."""
    from backend.tools.base import Tool
    from backend.tools.outcome import Outcome

    class Upper(Tool):
        kind = "upper"

        async def _invoke(self, arguments, options):
            if arguments["text"] == "boom":
                raise RuntimeError("the kind has a bug")
            return Outcome(content=arguments["text"].upper())

    schema = {"name": "upper", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
    reg = ToolRegistry([Upper(schema)])
    r = await reg.execute(call("upper", text="hi"))
    assert (r.ok, r.content, r.tool_kind) == (True, "HI", "upper")
    r = await reg.execute(call("upper", text=3))
    assert r.error == "invalid_arguments" and "text (string, required)" in r.content
    r = await reg.execute(call("upper", text="x" * 50), max_response_length=10, truncate_side="left")
    assert r.truncated and r.content == "X" * 10 + "...(truncated)" and r.original_length == 50
    r = await reg.execute(call("upper", text="boom"))
    assert r.error == "exception" and "RuntimeError: the kind has a bug" in r.content


def test_each_tool_kind_lives_in_its_own_module_and_loaders_need_no_registry():
    import backend.tools as tools
    from backend.errors import UserError
    from backend.tools import loaders

    kinds = {cls.kind: cls.__module__ for cls in (tools.FunctionTool, tools.MockTool, tools.VerlTool, tools.SandboxedTool)}
    assert kinds == {"function": "backend.tools.function_tool", "mock": "backend.tools.mock_tool",
                     "verl": "backend.tools.verl_tool", "sandboxed": "backend.tools.sandboxed_tool"}
    got = loaders.tools_from_schemas([{"name": "a", "mock": "x"}, {"name": "b"}], source="t.json")
    assert [(t.kind, t.name, t.source) for t in got] == [("mock", "a", "t.json: tools[0]"), ("mock", "b", "t.json: tools[1]")]
    with pytest.raises(ToolLoadError, match="two tools are named 'a'"):
        ToolRegistry(got + loaders.tools_from_schemas([{"name": "a"}]))
    from backend.tools.mock import MockError

    for err in (ToolLoadError, tools.SchemaDialectError, MockError):
        assert issubclass(err, UserError) and issubclass(err, ValueError)
