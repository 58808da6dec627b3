"""OpenAI Responses API fixtures, written by the real ``openai`` SDK against a loopback server.

Run (offline, no key): ``/work/fixenv/anthropic/bin/python tests/fixtures_gen/gen_openai_responses.py``
with the pins of ``tests/fixtures_gen/requirements-openai-responses.txt``.

A stdlib HTTP server on 127.0.0.1 (random port) answers ``POST /v1/responses`` from the script
below and records the JSON body the SDK sent. Each scripted conversation is driven the way
agent loops drive ``client.responses.create``: either replaying the whole input
(``input = previous input + response.output + function_call_output items``) or statefully
(``previous_response_id`` and only the new function_call_output items). One line per ``create``
call: ``{"request": <the JSON body the SDK sent>, "response": <the SDK's Response>.model_dump(mode="json")}``,
written to ``tests/data/import/openai_responses/``: ``responses_log.jsonl`` (the replaying
conversations: complete) and ``responses_stateful.jsonl`` (a conversation continued with
``previous_response_id``: its second line does not hold the first turns).

Scenarios (the tests re-state what they expect from here): one call with a reasoning summary
(input a string, instructions); parallel calls with unicode, escaped and nested arguments;
two tool rounds (input as message items with ``input_text`` parts); a plain answer (no tools, no instructions); an answer cut at
``max_output_tokens`` (status ``incomplete``); a stateful conversation (``previous_response_id``).
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "openai_responses")
MODEL = "gpt-5-mini"

TOOLS = [
    {
        "type": "function", "name": "get_weather", "description": "Current weather for a city.", "strict": False,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]},
    },
    {
        "type": "function", "name": "save_note", "description": "Save a note to a file.", "strict": False,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"},
                                                        "tags": {"type": "array", "items": {"type": "object"}}},
                       "required": ["path", "text"]},
    },
    {
        "type": "function", "name": "search_docs", "description": "Search the documentation.", "strict": False,
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
    {
        "type": "function", "name": "read_doc", "description": "Read one document by id.", "strict": False,
        "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]},
    },
]

NOTE_ARGS = {
    "path": "notes/a \"quoted\" \\ path\n",
    "text": "Zürich vs 東京",
    "tags": [{"name": "weather", "score": 1}, {"name": "travel", "score": 0.5, "extra": {"nested": [1, 2]}}],
}


def call(call_id, name, args):
    return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id, "name": name,
            "arguments": json.dumps(args, ensure_ascii=False), "status": "completed"}


def message(id_, t, status="completed"):
    return {"type": "message", "id": id_, "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": t, "annotations": []}]}


def reasoning(id_, t):
    return {"type": "reasoning", "id": id_, "summary": [{"type": "summary_text", "text": t}]}


def result(call_id, output):
    return {"type": "function_call_output", "call_id": call_id, "output": output}


# Each conversation: request options, its first input, and its rounds: the model's scripted
# output items (and status), then the tool results the loop sends back (None after the last).
# ``stateful``: later requests carry previous_response_id and only the new items.
SCENARIOS = [
    {
        "id": "r-weather",
        "instructions": "You are a concise weather assistant.",
        "tools": ["get_weather"],
        "input": "What's the weather in Paris?",
        "rounds": [
            ([reasoning("rs_01", "The user wants Paris weather; call get_weather."), call("call_01", "get_weather", {"city": "Paris", "unit": "c"})],
             "completed", [result("call_01", "18°C, light rain")]),
            ([message("msg_01", "It is 18°C with light rain in Paris.")], "completed", None),
        ],
    },
    {
        "id": "r-parallel",
        "instructions": "You are a travel helper.",
        "tools": ["get_weather", "save_note"],
        "input": "Compare the weather in Zürich and 東京 and save a note.",
        "rounds": [
            ([call("call_11", "get_weather", {"city": "Zürich"}), call("call_12", "get_weather", {"city": "東京"}),
              call("call_13", "save_note", NOTE_ARGS)],
             "completed", [result("call_11", "Zürich: 12°C"), result("call_12", "東京: 22°C"), result("call_13", "saved")]),
            ([message("msg_11", "Zürich is 12°C, 東京 is 22°C; the note is saved.")], "completed", None),
        ],
    },
    {
        "id": "r-two-rounds",
        "instructions": "You answer from the docs.",
        "tools": ["search_docs", "read_doc"],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "How do I rotate the API key?"}]}],
        "rounds": [
            ([call("call_21", "search_docs", {"query": "rotate API key"})], "completed",
             [result("call_21", '[{"id": "doc-7", "title": "Key rotation"}]')]),
            ([reasoning("rs_22", "doc-7 looks right; read it."), call("call_22", "read_doc", {"doc_id": "doc-7"})], "completed",
             [result("call_22", "Go to Settings → Keys and click Rotate.")]),
            ([message("msg_23", "Open Settings → Keys and click Rotate.")], "completed", None),
        ],
    },
    {
        "id": "r-plain",
        "input": "Say hello in French.",
        "rounds": [([message("msg_31", "Bonjour !")], "completed", None)],
    },
    {
        "id": "r-stateful",
        "file": "stateful",
        "stateful": True,
        "instructions": "You are a concise weather assistant.",
        "tools": ["get_weather"],
        "input": "Weather in Oslo?",
        "rounds": [
            ([call("call_51", "get_weather", {"city": "Oslo"})], "completed", [result("call_51", "3°C, snow")]),
            ([message("msg_51", "It is 3°C with snow in Oslo.")], "completed", None),
        ],
    },
    {
        "id": "r-incomplete",
        "max_output_tokens": 16,
        "input": "Write a long poem about the sea.",
        "rounds": [([message("msg_41", "The sea, the sea, it rolls and", status="incomplete")], "incomplete", None)],
    },
]


class Script:
    def __init__(self):
        self.replies: list = []
        self.requests: list[dict] = []
        self.n = 0


def serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.path == "/v1/responses", self.path
            script.requests.append(body)
            output, status = script.replies.pop(0)
            script.n += 1
            reply = {
                "id": f"resp_{script.n:04d}",
                "object": "response",
                "created_at": 1764000000 + script.n,
                "status": status,
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.get("instructions"),
                "max_output_tokens": body.get("max_output_tokens"),
                "model": body["model"],
                "output": output,
                "parallel_tool_calls": True,
                "previous_response_id": body.get("previous_response_id"),
                "temperature": 1.0,
                "tool_choice": "auto",
                "tools": body.get("tools", []),
                "top_p": 1.0,
                "usage": {
                    "input_tokens": 40 + 10 * script.n, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                    "output_tokens": 5 + script.n, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 45 + 11 * script.n,
                },
                "metadata": {},
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
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", api_key="test-key", max_retries=0)
    lines: dict[str, list[str]] = {"main": [], "stateful": []}
    try:
        for sc in SCENARIOS:
            kwargs: dict = {"model": MODEL}
            for k in ("instructions", "max_output_tokens"):
                if k in sc:
                    kwargs[k] = sc[k]
            if sc.get("tools"):
                kwargs["tools"] = [t for t in TOOLS if t["name"] in sc["tools"]]
            script.replies = [(output, status) for output, status, _ in sc["rounds"]]
            inp = sc["input"]
            prev = None
            for _output, _status, results in sc["rounds"]:
                extra = {"previous_response_id": prev} if prev else {}
                resp = client.responses.create(input=inp, **kwargs, **extra)
                lines[sc.get("file", "main")].append(json.dumps({"request": script.requests[-1], "response": resp.model_dump(mode="json")}, ensure_ascii=False))
                if results is None:
                    break
                if sc.get("stateful"):
                    prev, inp = resp.id, list(results)
                else:  # replay: the SDK's output items go back as input, as the docs show
                    base = [{"role": "user", "content": inp}] if isinstance(inp, str) else list(inp)
                    inp = base + list(resp.output) + list(results)
    finally:
        srv.shutdown()
    for name, key in (("responses_log.jsonl", "main"), ("responses_stateful.jsonl", "stateful")):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines[key]) + "\n")
        print(f"wrote {name}: {len(lines[key])} lines")
    print(f"openai {openai.__version__}")


if __name__ == "__main__":
    main()
