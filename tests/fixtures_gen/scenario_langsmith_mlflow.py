"""The scenario behind the LangSmith and MLflow fixture files (gen_langsmith.py, gen_mlflow.py):
the user text, the scripted model replies and the tools' results, in one place. The tests
(tests/test_import_langsmith_mlflow.py) re-state what they expect from it.

A small travel agent: the model is a stdlib HTTP server on 127.0.0.1 answering
``/v1/chat/completions`` from REPLIES (keyed by the conversation's first user text and the
number of assistant turns already in the request); the tools are the plain functions below,
run by the agent loop of each generator under the library's own tracing.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM = "You are a concise travel assistant. Use the tools when they help."
MODEL = "gpt-4o-mini"
RESPONSE_MODEL = "gpt-4o-mini-2024-07-18"

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the user's notes.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "plan_trip", "description": "Plan a trip through several stops.",
        "parameters": {"type": "object", "properties": {
            "stops": {"type": "array", "items": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}}}, "required": ["stops"]}}},
]

WEATHER = {"Zürich": {"temp": 7, "sky": "cloudy"}, "東京": {"temp": 18, "sky": "clear"}}
NOTES_PATH = 'notes/a "quoted" \\ path\n.txt'  # quote, backslash and newline in an argument


def get_weather(city: str, unit: str = "c") -> str:
    w = WEATHER[city]
    return json.dumps({"city": city, "temp": w["temp"], "unit": unit, "sky": w["sky"]}, ensure_ascii=False)


def read_file(path: str) -> str:
    return f"{path.strip()}: pack an umbrella; 東京 hotel is booked"


def plan_trip(stops: list[dict[str, Any]]) -> str:
    return json.dumps({"route": " → ".join(s["city"] for s in stops), "days": sum(s["days"] for s in stops)}, ensure_ascii=False)


TOOL_FUNCTIONS = {"get_weather": get_weather, "read_file": read_file, "plan_trip": plan_trip}

# The conversations: name, system prompt or None, user text, with tools?, the model's replies in
# order (a reply is {"content": str} or {"tool_calls": [(call id, name, arguments)]}), and where
# the agent stops early, its limit of model calls (max_llm_calls).
CONVERSATIONS: list[dict[str, Any]] = [
    {
        "name": "one_call",
        "system": SYSTEM,
        "user": "What's the weather in Zürich right now?",
        "tools": True,
        "replies": [
            {"tool_calls": [("call_w1", "get_weather", {"city": "Zürich"})]},
            {"content": "It is 7 °C and cloudy in Zürich."},
        ],
    },
    {
        "name": "parallel_two_rounds",
        "system": SYSTEM,
        "user": "Plan 2 days in Zürich, then 3 in 東京. Check 東京's weather and read my notes first.",
        "tools": True,
        "replies": [
            {"tool_calls": [
                ("call_p1", "get_weather", {"city": "東京", "unit": "c"}),
                ("call_p2", "read_file", {"path": NOTES_PATH}),
                ("call_p3", "plan_trip", {"stops": [{"city": "Zürich", "days": 2}, {"city": "東京", "days": 3}]}),
            ]},
            {"tool_calls": [("call_p4", "get_weather", {"city": "Zürich", "unit": "f"})]},
            {"content": "Zürich → 東京 over 5 days: 東京 is clear at 18 °C, Zürich cloudy; pack an umbrella."},
        ],
    },
    {
        # the agent stops at its call limit right after running the tool: the trace's last llm
        # call is the tool call, the result is only in the tool's own run / span
        "name": "stopped_after_tools",
        "system": SYSTEM,
        "user": "Read my todo notes.",
        "tools": True,
        "max_llm_calls": 1,
        "replies": [{"tool_calls": [("call_s1", "read_file", {"path": "notes/todo.txt"})]}],
    },
    {
        "name": "plain",
        "system": None,
        "user": "Say hello in Japanese, one word.",
        "tools": False,
        "replies": [{"content": "こんにちは"}],
    },
]


def reply_for(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted reply to a chat-completions request's messages."""
    user = next(m["content"] for m in messages if m.get("role") == "user")
    conv = next(c for c in CONVERSATIONS if c["user"] == user)
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    return conv["replies"][turn]


def completion_json(messages: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A chat.completion response body for the request (``n`` numbers the response id)."""
    r = reply_for(messages)
    msg: dict[str, Any] = {"role": "assistant", "content": r.get("content")}
    if "tool_calls" in r:
        msg["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
            for cid, name, args in r["tool_calls"]
        ]
    prompt_tokens = 20 + 10 * len(messages)
    completion_tokens = 12 if "tool_calls" in r else 9
    return {
        "id": f"chatcmpl-{n:04d}", "object": "chat.completion", "created": 1764000000 + n, "model": RESPONSE_MODEL,
        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if "tool_calls" in r else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


# ---- the same model behind the Responses API (/v1/responses), for the one_call conversation -----

RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def responses_json(items: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A response body for a Responses API request's input items: the reply is the one after as
    many model turns as the input holds groups of function calls."""
    user = next(i["content"] for i in items if i.get("role") == "user")
    turn, prev = 0, None
    for i in items:
        t = i.get("type")
        if t == "function_call" and prev != "function_call":
            turn += 1
        prev = t
    conv = next(c for c in CONVERSATIONS if c["user"] == user)
    r = conv["replies"][turn]
    if "tool_calls" in r:
        output = [{"type": "function_call", "id": f"fc_{n:04d}_{k}", "call_id": cid, "name": name,
                   "arguments": json.dumps(args, ensure_ascii=False), "status": "completed"}
                  for k, (cid, name, args) in enumerate(r["tool_calls"])]
    else:
        output = [{"type": "message", "id": f"msg_{n:04d}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": r["content"], "annotations": []}]}]
    return {
        "id": f"resp_{n:04d}", "object": "response", "created_at": 1764000000 + n, "model": RESPONSE_MODEL,
        "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": RESPONSES_TOOLS, "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
        "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": 30 + 10 * len(items), "output_tokens": 10, "total_tokens": 40 + 10 * len(items),
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }
