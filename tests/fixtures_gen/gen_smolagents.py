"""smolagents fixtures: the memory of real ``ToolCallingAgent`` and ``CodeAgent`` runs.

Run (offline, no key): ``/work/fixenv/smolagents/bin/python tests/fixtures_gen/gen_smolagents.py``
with the pins of ``tests/fixtures_gen/requirements-smolagents.txt``.

The model is a ``smolagents.models.Model`` subclass that returns the scenario's scripted
``ChatMessage``\\ s in order (tool calls as ``ChatMessageToolCall``\\ s, token usage 100 in / 20 out
each); the tools are real ``@tool`` functions run by the agent (the CodeAgent's run in smolagents'
local Python executor). Each file holds ``json.dumps(agent.memory.get_full_steps(), default=str)``.
Measured on these runs: the only values that are not plain JSON types are ``MessageRole`` roles
(a ``str`` enum: written as its value); ``default=str`` matters for runs with images (by the
source: ``observations_images`` are ``bytes`` and ``task_images`` PIL images, written as their
Python repr / ``str``; a provider's ``raw`` response is already made JSON by smolagents'
``make_json_serializable``).
Written to ``tests/data/import/smolagents/``:

* ``tool_calling.json``: the ``tool_calling`` run as a whole JSON document;
* ``code_agent.json``: the ``code`` run (a CodeAgent with a planning step) as a whole document;
* ``runs.jsonl``: the step lists of ``one_call``, ``plain`` and ``code``, one per line (several
  conversations in one file);
* ``run_result.json``: ``agent.run(task, return_full_result=True).dict()`` of ``one_call``, with
  ``"tools": [get_tool_json_schema(t) for t in agent.tools.values()]`` added (the memory holds no
  tool schemas).
* ``broken_arguments.json``: the ``broken_arguments`` run as a whole document (written alone by
  ``gen_smolagents.py broken_arguments``, the other files left as they are).
* ``disagreeing_calls.json``: the ``disagreeing_calls`` run as a whole document (written alone by
  ``gen_smolagents.py disagreeing_calls``).

Scenarios (the tests re-state what they expect from here): ``tool_calling`` (parallel calls with
unicode arguments, one given as a JSON string; a second round with escaped and nested arguments;
a tool that raises, so the step has an error; ``final_answer``); ``one_call``; ``plain`` (the
model answers at once with ``final_answer``); ``code`` (a plan, a code action, a code action that
raises, ``final_answer`` in code); ``broken_arguments`` (a call whose arguments are a JSON
string cut short, as a provider passes on a model's broken output, then ``final_answer``);
``disagreeing_calls`` (the same cut call, and an app's step callback — smolagents'
``step_callbacks`` — that records the call it repaired with a JSON repair as the step's
``tool_calls``: the memory's ``tool_calls`` then hold parsed arguments while
``model_output_message.tool_calls`` keep the model's unreadable text).
"""

from __future__ import annotations

import json
import os

from smolagents import CodeAgent, ToolCallingAgent, tool
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole, Model, get_tool_json_schema
from smolagents.monitoring import TokenUsage

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "smolagents")

ESCAPED_PATH = 'notes/a "quoted" \\ path\n.txt'
NESTED_TAGS = [{"name": "weather", "meta": {"cities": ["Zürich", "東京"], "ok": True}}]
WEATHER = {"Paris": "18 °C, sunny", "Zürich": "12 °C, cloudy", "東京": "20 °C, clear"}


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city's name
    """
    if city not in WEATHER:
        raise ValueError(f"unknown city {city}")
    return f"{city}: {WEATHER[city]}"


@tool
def save_note(path: str, text: str, tags: list) -> str:
    """Save a note to a file.

    Args:
        path: where to save it
        text: the note
        tags: tag objects
    """
    return f"saved {len(text)} characters"


def reply(content=None, calls=()):
    return {"content": content, "calls": list(calls)}


SCENARIOS = {
    "tool_calling": {
        "agent": "ToolCallingAgent",
        "task": "Compare the weather in Zürich and 東京, then save a note.",
        "replies": [
            reply(calls=[("call_zh", "get_weather", {"city": "Zürich"}), ("call_tk", "get_weather", '{"city": "東京"}')]),
            reply(calls=[("call_note", "save_note", {"path": ESCAPED_PATH, "text": "Zürich 12 °C, 東京 20 °C", "tags": NESTED_TAGS})]),
            reply("Let me also check Atlantis.", calls=[("call_atl", "get_weather", {"city": "Atlantis"})]),
            reply(calls=[("call_final", "final_answer", {"answer": "東京 is warmer than Zürich."})]),
        ],
    },
    "one_call": {
        "agent": "ToolCallingAgent",
        "task": "What's the weather in Paris?",
        "replies": [
            reply(calls=[("call_paris", "get_weather", {"city": "Paris"})]),
            reply(calls=[("call_done", "final_answer", {"answer": "18 °C and sunny."})]),
        ],
    },
    "plain": {
        "agent": "ToolCallingAgent",
        "task": "Say hello in French.",
        "replies": [reply(calls=[("call_hello", "final_answer", {"answer": "Bonjour !"})])],
    },
    "broken_arguments": {
        "agent": "ToolCallingAgent",
        "task": "What's the weather in Paris?",
        "replies": [
            reply(calls=[("call_bad", "get_weather", '{"city": "Par')]),
            reply(calls=[("call_end", "final_answer", {"answer": "I could not read the weather."})]),
        ],
    },
    "disagreeing_calls": {
        "agent": "ToolCallingAgent",
        "task": "What's the weather in Paris?",
        "replies": [
            reply(calls=[("call_bad", "get_weather", '{"city": "Par')]),
            reply(calls=[("call_end", "final_answer", {"answer": "I could not read the weather."})]),
        ],
        "step_callbacks": "repair_calls",
    },
    "code": {
        "agent": "CodeAgent",
        "task": "How warm is it in Zürich?",
        "planning_interval": 5,
        "replies": [
            reply("1. Get the weather in Zürich.\n2. Give the answer."),
            reply('Thought: I will look up the weather.\n<code>\nw = get_weather(city="Zürich")\nprint(w)\n</code>'),
            reply("Thought: Let me check a division.\n<code>\nprint(1 / 0)\n</code>"),
            reply("Thought: I have the answer.\n<code>\nfinal_answer(w)\n</code>"),
        ],
    },
}


class ScriptedModel(Model):
    """Returns the scripted replies in order, as a provider's model would return ChatMessages."""

    def __init__(self, replies):
        super().__init__(model_id="scripted-model")
        self.replies = list(replies)

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        r = self.replies.pop(0)
        calls = [
            ChatMessageToolCall(function=ChatMessageToolCallFunction(name=name, arguments=args), id=cid, type="function")
            for cid, name, args in r["calls"]
        ]
        return ChatMessage(role=MessageRole.ASSISTANT, content=r["content"], tool_calls=calls or None, token_usage=TokenUsage(100, 20))


def repair_calls(memory_step, agent=None):
    """An app's step callback: a step that failed on calls whose arguments are not JSON gets the
    calls it would have run, repaired by closing the cut JSON, recorded as its ``tool_calls``
    (``model_output_message`` keeps what the model wrote)."""
    from smolagents.memory import ActionStep, ToolCall

    msg = getattr(memory_step, "model_output_message", None)
    if not isinstance(memory_step, ActionStep) or memory_step.error is None or memory_step.tool_calls or msg is None:
        return
    repaired = []
    for c in msg.tool_calls or []:
        args = c.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args + '"}')
            except json.JSONDecodeError:
                continue
        repaired.append(ToolCall(name=c.function.name, arguments=args, id=c.id))
    memory_step.tool_calls = repaired or None


def make_agent(name: str):
    sc = SCENARIOS[name]
    model = ScriptedModel(sc["replies"])
    cls = ToolCallingAgent if sc["agent"] == "ToolCallingAgent" else CodeAgent
    kw = {"planning_interval": sc["planning_interval"]} if "planning_interval" in sc else {}
    if sc.get("step_callbacks") == "repair_calls":
        kw["step_callbacks"] = [repair_calls]
    return cls(tools=[get_weather, save_note], model=model, verbosity_level=0, **kw), model


def run(name: str) -> list:
    agent, model = make_agent(name)
    agent.run(SCENARIOS[name]["task"])
    assert not model.replies, f"{name}: {len(model.replies)} scripted replies left"
    return json.loads(json.dumps(agent.memory.get_full_steps(), default=str))


def write(fn: str, obj) -> None:
    with open(os.path.join(OUT, fn), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main(argv: list[str]) -> None:
    os.makedirs(OUT, exist_ok=True)
    if argv in (["broken_arguments"], ["disagreeing_calls"]):
        write(f"{argv[0]}.json", run(argv[0]))
        return
    dumps = {name: run(name) for name in SCENARIOS}
    write("disagreeing_calls.json", dumps["disagreeing_calls"])
    write("broken_arguments.json", dumps["broken_arguments"])

    write("tool_calling.json", dumps["tool_calling"])
    write("code_agent.json", dumps["code"])
    with open(os.path.join(OUT, "runs.jsonl"), "w", encoding="utf-8") as f:
        for name in ("one_call", "plain", "code"):
            f.write(json.dumps(dumps[name], ensure_ascii=False) + "\n")
    agent, model = make_agent("one_call")
    result = json.loads(json.dumps(agent.run(SCENARIOS["one_call"]["task"], return_full_result=True).dict(), default=str))
    result["tools"] = [get_tool_json_schema(t) for t in agent.tools.values()]
    write("run_result.json", result)
    for fn in sorted(os.listdir(OUT)):
        print(fn, os.path.getsize(os.path.join(OUT, fn)), "bytes")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
