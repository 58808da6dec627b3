"""LangChain fixtures, written by ``langchain_core.messages.messages_to_dict`` after a real agent loop.

Run (offline, no key): ``/work/fixenv/langchain/bin/python tests/fixtures_gen/gen_langchain.py``
with the pins of ``tests/fixtures_gen/requirements-langchain.txt``.

The model is langchain-core's own ``FakeMessagesListChatModel`` returning the scenario's scripted
``AIMessage``\\ s; the loop is the one LangGraph's ``ToolNode`` runs: invoke the model on the
messages so far, append its ``AIMessage``, invoke each ``@tool`` with its ``ToolCall`` (which
returns the ``ToolMessage``), append those, repeat until the model answers without calls. The
scripted replies that carry raw OpenAI tool calls are parsed the way ``langchain-openai`` parses
them (``parse_tool_call``; a call whose arguments are not JSON becomes an ``invalid_tool_call``
via ``make_invalid_tool_call``). Written to ``tests/data/import/langchain/``:

* ``messages.jsonl``: ``messages_to_dict(messages)`` per line for ``one_call``, ``parallel`` and
  ``plain`` (several conversations in one file);
* ``conversation.json``: the ``parallel`` scenario alone as a whole JSON document;
* ``with_tools.json``: ``{"messages": <one_call>, "tools": [convert_to_openai_tool(t), ...]}``;
* ``invalid_tool_call.json``: ``invalid`` (a call whose arguments were cut: a parse error to report);
* ``image.json``: ``image`` (a human message with an ``image_url`` block: a loss to report).

Scenarios (the tests re-state what they expect from here): ``one_call`` (system prompt, one call,
answer); ``parallel`` (system prompt, a human message as content blocks, parallel calls with
unicode arguments, a second round with escaped and nested arguments); ``plain`` (no tools, no
system prompt); ``invalid``; ``image``.
"""

from __future__ import annotations

import json
import os

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, messages_to_dict
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "langchain")
MODEL = "scripted-model"

ESCAPED_PATH = 'notes/a "quoted" \\ path\n.txt'
NESTED_TAGS = [{"name": "weather", "meta": {"cities": ["Zürich", "東京"], "ok": True}}]
WEATHER = {"Paris": "18 °C, sunny", "Zürich": "12 °C, cloudy", "東京": "20 °C, clear"}


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"{city}: {WEATHER[city]}"


@tool
def save_note(path: str, text: str, tags: list[dict]) -> str:
    """Save a note to a file."""
    return f"saved {len(text)} characters to {path}"


TOOLS = {t.name: t for t in (get_weather, save_note)}


def ai(content="", calls=(), raw_calls=(), usage=(20, 8)) -> AIMessage:
    """A scripted reply: ``calls`` = (name, args, id) parsed calls; ``raw_calls`` = OpenAI wire
    calls parsed as langchain-openai does."""
    tool_calls = [{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls]
    invalid = []
    for rc in raw_calls:
        try:
            tool_calls.append(parse_tool_call(rc, return_id=True))
        except Exception as e:  # OutputParserException, as langchain-openai catches it
            invalid.append(make_invalid_tool_call(rc, str(e)))
    return AIMessage(
        content=content, tool_calls=tool_calls, invalid_tool_calls=invalid,
        response_metadata={"model_name": MODEL, "finish_reason": "tool_calls" if (calls or raw_calls) else "stop"},
        usage_metadata={"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": usage[0] + usage[1]},
    )


def raw_call(cid: str, name: str, arguments: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


SCENARIOS = {
    "one_call": {
        "messages": [SystemMessage("You are a concise weather assistant."), HumanMessage("What's the weather in Paris?")],
        "replies": [ai(calls=[("get_weather", {"city": "Paris"}, "call_paris")]), ai("It is 18 °C and sunny in Paris.")],
    },
    "parallel": {
        "messages": [
            SystemMessage("You are a travel assistant."),
            HumanMessage(content=[{"type": "text", "text": "Compare the weather in Zürich and 東京, then save a note."}]),
        ],
        "replies": [
            ai(calls=[("get_weather", {"city": "Zürich"}, "call_zh")],
               raw_calls=[raw_call("call_tk", "get_weather", '{"city": "東京"}')]),
            ai(calls=[("save_note", {"path": ESCAPED_PATH, "text": "Zürich 12 °C, 東京 20 °C", "tags": NESTED_TAGS}, "call_note")]),
            ai("東京 is warmer than Zürich; the note is saved."),
        ],
    },
    "plain": {
        "messages": [HumanMessage("Say hello in French.")],
        "replies": [ai("Bonjour !")],
    },
    "invalid": {
        "messages": [HumanMessage("Save a note about Zürich.")],
        "replies": [ai(raw_calls=[raw_call("call_cut", "save_note", '{"path": "zurich.txt", "text": "Zür')])],
    },
    "image": {
        "messages": [
            HumanMessage(content=[
                {"type": "text", "text": "What city is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]),
        ],
        "replies": [ai("It looks like Zürich.")],
    },
}


def run(name: str) -> list:
    sc = SCENARIOS[name]
    model = FakeMessagesListChatModel(responses=sc["replies"])
    messages = list(sc["messages"])
    for _ in range(len(sc["replies"])):
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(TOOLS[call["name"]].invoke(call))  # a ToolCall in → a ToolMessage out
    return messages_to_dict(messages)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    dumps = {name: run(name) for name in SCENARIOS}

    def write(fn: str, obj, indent=None) -> None:
        with open(os.path.join(OUT, fn), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=indent)
            f.write("\n")

    with open(os.path.join(OUT, "messages.jsonl"), "w", encoding="utf-8") as f:
        for name in ("one_call", "parallel", "plain"):
            f.write(json.dumps(dumps[name], ensure_ascii=False) + "\n")
    write("conversation.json", dumps["parallel"], indent=2)
    write("with_tools.json", {"messages": dumps["one_call"], "tools": [convert_to_openai_tool(t) for t in TOOLS.values()]}, indent=2)
    write("invalid_tool_call.json", dumps["invalid"], indent=2)
    write("image.json", dumps["image"], indent=2)
    for fn in sorted(os.listdir(OUT)):
        print(fn, os.path.getsize(os.path.join(OUT, fn)), "bytes")


if __name__ == "__main__":
    main()
