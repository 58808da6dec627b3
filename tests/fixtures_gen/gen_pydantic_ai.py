"""pydantic-ai fixtures, written by a real ``Agent`` run on pydantic-ai's own ``FunctionModel``.

Run (offline, no key): ``/work/fixenv/pydantic_ai/bin/python tests/fixtures_gen/gen_pydantic_ai.py``
with the pins of ``tests/fixtures_gen/requirements-pydantic_ai.txt``.

Each scenario below is run by an ``Agent`` with real ``@agent.tool_plain`` tools; the model is a
``FunctionModel`` that returns the scenario's scripted ``ModelResponse``\\ s in order (and records
the ``ToolDefinition``\\ s it was offered). Written to ``tests/data/import/pydantic_ai/``:

* ``runs.jsonl``: one ``ModelMessagesTypeAdapter.dump_json(result.all_messages())`` per line, one
  line per scenario (several conversations in one file);
* ``run.json``: the ``parallel`` scenario alone, as a whole JSON document (one conversation);
* ``with_tools.json``: ``{"messages": <the one_call history>, "tools": <the ToolDefinitions the
  model was offered>}`` (pydantic-ai's history has no tool schemas; this wrapper adds them).

Scenarios (the tests re-state what they expect from here): ``one_call`` (system prompt, thinking,
one call, answer); ``parallel`` (system prompt + instructions, parallel calls with unicode
arguments, one given as a JSON string, then a second round with escaped and nested arguments);
``retry`` (a tool raises ``ModelRetry``, the model calls again); ``plain`` (no tools, no system
prompt).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pydantic_core
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ThinkingPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "pydantic_ai")

ESCAPED_PATH = 'notes/a "quoted" \\ path\n.txt'
NESTED_TAGS = [{"name": "weather", "meta": {"cities": ["Zürich", "東京"], "ok": True}}]

SCENARIOS = {
    "one_call": {
        "system_prompt": "You are a concise weather assistant.",
        "user": "What's the weather in Paris?",
        "responses": [
            [ThinkingPart("The user wants the weather in Paris."), ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="call_paris")],
            [TextPart("It is 18 °C and sunny in Paris.")],
        ],
    },
    "parallel": {
        "system_prompt": "You are a travel assistant.",
        "instructions": "Answer in one sentence.",
        "user": "Compare the weather in Zürich and 東京, then save a note.",
        "responses": [
            [
                ToolCallPart("get_weather", {"city": "Zürich"}, tool_call_id="call_zh"),
                ToolCallPart("get_weather", '{"city": "東京", "unit": "c"}', tool_call_id="call_tk"),
            ],
            [ToolCallPart("save_note", {"path": ESCAPED_PATH, "text": "Zürich 12 °C, 東京 20 °C", "tags": NESTED_TAGS}, tool_call_id="call_note")],
            [TextPart("東京 is warmer than Zürich; the note is saved.")],
        ],
    },
    "retry": {
        "system_prompt": "You look up orders.",
        "user": "Where is order 42?",
        "responses": [
            [ToolCallPart("lookup_order", {"order_id": -42}, tool_call_id="call_bad")],
            [ToolCallPart("lookup_order", {"order_id": 42}, tool_call_id="call_good")],
            [TextPart("Order 42 has shipped.")],
        ],
    },
    "plain": {
        "user": "Say hello in French.",
        "responses": [[TextPart("Bonjour !")]],
    },
}

# what the tools return (the tests re-state these)
WEATHER = {"Paris": {"temp_c": 18, "sky": "sunny"}, "Zürich": {"temp_c": 12, "sky": "cloudy"}, "東京": {"temp_c": 20, "sky": "clear"}}
RETRY_TEXT = "order_id must be positive"


def run(name: str) -> tuple[bytes, list]:
    sc = SCENARIOS[name]
    script = list(sc["responses"])
    offered: list = []

    def model_fn(messages, info: AgentInfo) -> ModelResponse:
        offered[:] = info.function_tools
        return ModelResponse(parts=script.pop(0))

    kw = {}
    if "system_prompt" in sc:
        kw["system_prompt"] = sc["system_prompt"]
    if "instructions" in sc:
        kw["instructions"] = sc["instructions"]
    agent = Agent(FunctionModel(model_fn, model_name="scripted-model"), **kw)

    if name != "plain":
        @agent.tool_plain
        def get_weather(city: str, unit: str = "c") -> dict:
            """Current weather for a city."""
            return {"city": city, **WEATHER[city]}

        @agent.tool_plain
        def save_note(path: str, text: str, tags: list[dict]) -> str:
            """Save a note to a file."""
            return f"saved {len(text)} characters"

        @agent.tool_plain
        def lookup_order(order_id: int) -> dict:
            """Look up an order by id."""
            if order_id <= 0:
                raise ModelRetry(RETRY_TEXT)
            return {"order_id": order_id, "status": "shipped"}

    result = agent.run_sync(sc["user"])
    assert not script, f"{name}: {len(script)} scripted responses left"
    return ModelMessagesTypeAdapter.dump_json(result.all_messages()), offered


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    dumps = {name: run(name) for name in SCENARIOS}
    with open(os.path.join(OUT, "runs.jsonl"), "wb") as f:
        for name in SCENARIOS:
            f.write(dumps[name][0] + b"\n")
    with open(os.path.join(OUT, "run.json"), "wb") as f:
        f.write(ModelMessagesTypeAdapter.dump_json(ModelMessagesTypeAdapter.validate_json(dumps["parallel"][0]), indent=2) + b"\n")
    history, offered = dumps["one_call"]
    tools = pydantic_core.to_jsonable_python([asdict(t) for t in offered])
    with open(os.path.join(OUT, "with_tools.json"), "w", encoding="utf-8") as f:
        json.dump({"messages": json.loads(history), "tools": tools}, f, ensure_ascii=False, indent=2)
        f.write("\n")
    for fn in sorted(os.listdir(OUT)):
        print(fn, os.path.getsize(os.path.join(OUT, fn)), "bytes")


if __name__ == "__main__":
    main()
