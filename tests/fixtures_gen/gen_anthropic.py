"""Anthropic Messages fixtures, written by the real ``anthropic`` SDK against a loopback server.

Run (offline, no key): ``/work/fixenv/anthropic/bin/python tests/fixtures_gen/gen_anthropic.py``
with the pins of ``tests/fixtures_gen/requirements-anthropic.txt``.

A stdlib HTTP server on 127.0.0.1 (random port) answers ``POST /v1/messages`` from the script
below and records the JSON body the SDK sent. Each scripted conversation is driven the way an
agent loop drives the SDK (``messages.create``, append ``response.content`` as the assistant
turn, append the tool results as a user turn, call again). Written to
``tests/data/import/anthropic/``:

* ``messages_log.jsonl``: one request/response log per ``create`` call:
  ``{"request": <the JSON body the SDK sent>, "response": <the SDK's Message>.model_dump(mode="json")}``;
* ``messages.jsonl``: one plain Messages file per conversation, as people save them:
  ``{"model", "max_tokens", "system", "tools", "messages"}`` = the last request's messages plus the
  last response as the final assistant turn;
* ``redacted_thinking.jsonl``: a conversation whose answer has a ``redacted_thinking`` block, as a
  log line and as a plain file (a file with a loss to report: the reasoning is encrypted).

Scenarios (the tests re-state what they expect from here): one call with thinking; parallel
calls with unicode, escaped and nested arguments, a tool_result with a list of text blocks and
one with ``is_error``, followed by user text in the same turn, and a system prompt as a list of
text blocks; two tool rounds; a plain answer (no tools, no system); an answer cut at
``max_tokens``; a redacted_thinking block.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "anthropic")
MODEL = "claude-sonnet-5"

TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
    {
        "name": "save_note",
        "description": "Save a note to a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "text": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["path", "text"],
        },
    },
    {
        "name": "search_docs",
        "description": "Search the documentation.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
    {
        "name": "read_doc",
        "description": "Read one document by id.",
        "input_schema": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]},
    },
]

NOTE_ARGS = {
    "path": "notes/a \"quoted\" \\ path\n",
    "text": "Zürich vs 東京",
    "tags": [{"name": "weather", "score": 1}, {"name": "travel", "score": 0.5, "extra": {"nested": [1, 2]}}],
}


def text(t):
    return {"type": "text", "text": t}


def tool_use(id_, name, input_):
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


def thinking(t, sig):
    return {"type": "thinking", "thinking": t, "signature": sig}


# Each conversation: the request options, the first user turn, and its rounds: the model's
# scripted reply (content blocks, stop_reason) and then the user turn the loop sends back (the
# tool results), None after the last reply.
SCENARIOS = [
    {
        "id": "a-weather",
        "file": "main",
        "system": "You are a concise weather assistant.",
        "tools": ["get_weather"],
        "user": "What's the weather in Paris?",
        "rounds": [
            (
                [thinking("The user wants Paris weather; call get_weather.", "sig-weather-1"), text("Let me check."),
                 tool_use("toolu_01", "get_weather", {"city": "Paris", "unit": "c"})],
                "tool_use",
                [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18°C, light rain"}],
            ),
            ([text("It is 18°C with light rain in Paris.")], "end_turn", None),
        ],
    },
    {
        "id": "a-parallel",
        "file": "main",
        "system": [text("You are a travel helper."), text("Always save a note of comparisons.")],
        "tools": ["get_weather", "save_note"],
        "user": "Compare the weather in Zürich and 東京 and save a note.",
        "rounds": [
            (
                [text("Checking both cities."),
                 tool_use("toolu_11", "get_weather", {"city": "Zürich"}),
                 tool_use("toolu_12", "get_weather", {"city": "東京"}),
                 tool_use("toolu_13", "save_note", NOTE_ARGS)],
                "tool_use",
                [
                    {"type": "tool_result", "tool_use_id": "toolu_11", "content": [text("Zürich: 12°C"), text("wind 5 km/h")]},
                    {"type": "tool_result", "tool_use_id": "toolu_12", "content": "東京: 22°C"},
                    {"type": "tool_result", "tool_use_id": "toolu_13", "content": "permission denied: notes/", "is_error": True},
                    text("Please also mention humidity if you know it."),
                ],
            ),
            ([text("Zürich is 12°C (wind 5 km/h), 東京 is 22°C. I could not save the note.")], "end_turn", None),
        ],
    },
    {
        "id": "a-two-rounds",
        "file": "main",
        "system": "You answer from the docs.",
        "tools": ["search_docs", "read_doc"],
        "user": "How do I rotate the API key?",
        "rounds": [
            (
                [tool_use("toolu_21", "search_docs", {"query": "rotate API key"})],
                "tool_use",
                [{"type": "tool_result", "tool_use_id": "toolu_21", "content": '[{"id": "doc-7", "title": "Key rotation"}]'}],
            ),
            (
                [thinking("doc-7 looks right; read it.", "sig-docs-2"), tool_use("toolu_22", "read_doc", {"doc_id": "doc-7"})],
                "tool_use",
                [{"type": "tool_result", "tool_use_id": "toolu_22", "content": "Go to Settings → Keys and click Rotate."}],
            ),
            ([text("Open Settings → Keys and click Rotate.")], "end_turn", None),
        ],
    },
    {
        "id": "a-plain",
        "file": "main",
        "user": "Say hello in French.",
        "rounds": [([text("Bonjour !")], "end_turn", None)],
    },
    {
        "id": "a-truncated",
        "file": "main",
        "max_tokens": 16,
        "user": "Write a long poem about the sea.",
        "rounds": [([text("The sea, the sea, it rolls and")], "max_tokens", None)],
    },
    {
        "id": "a-redacted",
        "file": "redacted",
        "system": "Think before answering.",
        "user": "Is 1021 prime?",
        "rounds": [
            ([{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
              text("Yes, 1021 is prime.")], "end_turn", None),
        ],
    },
]


class Script:
    """The loopback server's replies, in order, and the request bodies it received."""

    def __init__(self):
        self.replies: list[dict] = []
        self.requests: list[dict] = []
        self.n = 0


def serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.path == "/v1/messages", self.path
            script.requests.append(body)
            content, stop = script.replies.pop(0)
            script.n += 1
            reply = {
                "id": f"msg_{script.n:04d}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 40 + 10 * script.n, "output_tokens": 5 + script.n},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    script = Script()
    srv = serve(script)
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.server_address[1]}", api_key="test-key", max_retries=0)
    out: dict[str, dict[str, list[str]]] = {"main": {"log": [], "plain": []}, "redacted": {"log": [], "plain": []}}
    try:
        for sc in SCENARIOS:
            kwargs = {"model": MODEL, "max_tokens": sc.get("max_tokens", 1024)}
            if "system" in sc:
                kwargs["system"] = sc["system"]
            if sc.get("tools"):
                kwargs["tools"] = [t for t in TOOLS if t["name"] in sc["tools"]]
            messages: list = [{"role": "user", "content": sc["user"]}]
            script.replies = [(content, stop) for content, stop, _ in sc["rounds"]]
            for _content, _stop, results in sc["rounds"]:
                resp = client.messages.create(messages=list(messages), **kwargs)
                sent = script.requests[-1]
                line = {"request": sent, "response": resp.model_dump(mode="json")}
                out[sc["file"]]["log"].append(json.dumps(line, ensure_ascii=False))
                messages.append({"role": "assistant", "content": resp.content})  # the SDK's blocks, as agent loops do
                if results is not None:
                    messages.append({"role": "user", "content": results})
            # the plain file: what the SDK serialised for the last request, plus the last answer
            plain = {k: v for k, v in sent.items() if k in ("model", "max_tokens", "system", "tools")}
            plain["messages"] = sent["messages"] + [
                {"role": "assistant", "content": [b.model_dump(mode="json", exclude_none=True) for b in resp.content]}
            ]
            out[sc["file"]]["plain"].append(json.dumps(plain, ensure_ascii=False))
    finally:
        srv.shutdown()
    files = {
        "messages_log.jsonl": out["main"]["log"],
        "messages.jsonl": out["main"]["plain"],
        "redacted_thinking.jsonl": out["redacted"]["log"] + out["redacted"]["plain"],
    }
    for name, lines in files.items():
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {name}: {len(lines)} lines")
    print(f"anthropic {anthropic.__version__}")


if __name__ == "__main__":
    main()
