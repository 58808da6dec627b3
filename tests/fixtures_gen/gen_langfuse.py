"""Langfuse fixtures: the real Langfuse Python SDK (v5, OpenTelemetry based), offline.

Run (no network, no key): ``/work/fixenv/langfuse/bin/python tests/fixtures_gen/gen_langfuse.py``
with the pins of ``tests/fixtures_gen/requirements-langfuse.txt``.

A stdlib HTTP server on 127.0.0.1 (random port) answers ``POST /v1/chat/completions`` from the
script below, and the one Langfuse API call the SDK makes offline: ``POST /api/public/media`` for an
image it cuts out of an input (answered "already stored", so nothing is uploaded; the input keeps
the SDK's ``@@@langfuseMedia:...@@@`` reference in place of the image).
``Langfuse(span_exporter=InMemorySpanExporter(), base_url=<loopback>, public_key="pk-lf-x",
secret_key="sk-lf-x")`` sends its spans to memory instead of the Langfuse server; trace and span
ids come from a seeded generator. The app is written as the Langfuse docs show: an
``@observe(as_type="agent")`` function running a tool-calling loop with the ``langfuse.openai``
drop-in client (one ``generation`` observation per call) and ``@observe(as_type="tool")`` tool
functions, the trace named with ``propagate_attributes``. Written to ``tests/data/import/langfuse/``:

* ``*.otlp.jsonl``: OTLP JSON, the collector file exporter's shape: one
  ``ExportTraceServiceRequest`` per line (one per trace here), built by
  ``opentelemetry-exporter-otlp-proto-common``'s ``encode_spans`` + ``google.protobuf.json_format``,
  ids turned from protobuf JSON's base64 into the collector's hex;
* ``*.spans.jsonl``: the SDK's ``ReadableSpan.to_json(indent=None)``, one span per line.

Files: ``agent`` (three traces: one call with a system prompt; parallel calls with unicode /
escaped / nested arguments and a second tool round; a plain answer with no tools and no system
prompt), ``manual`` (generations recorded by hand with ``start_as_current_observation``: two
independent calls in one trace) and ``image`` (a user message with a base64 image part, replaced by the SDK with a media
reference: a loss to report), and ``wrapped_tools`` (the first two ``agent`` conversations again, the
tools run through one generic ``@observe(as_type="tool", name="call_tool")`` wrapper taking
``name`` and ``arguments``, as apps dispatching tools by name write it; written alone by
``gen_langfuse.py wrapped_tools``, the other files left as they are), and
``wrapped_tools_positional`` (the same, the wrapper called positionally,
``call_tool("get_weather", {"city": "Paris"})``: the SDK captures its input as
``{"args": ["get_weather", {...}], "kwargs": {}}``; written alone by
``gen_langfuse.py wrapped_tools_positional``).

The scenario (user texts, scripted model replies, tool results) is held in ``SCENARIOS`` and
``MANUAL``; the
tests re-state what they expect from it.

The Langfuse API's export of observations (``/api/public/v2/observations``) is not written here:
it is made by the Langfuse server from these spans, which no library does offline.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "langfuse")
MODEL = "gpt-4o-mini-2024-07-18"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "plan_trip",
            "description": "Plan a trip through several cities.",
            "parameters": {
                "type": "object",
                "properties": {"stops": {"type": "array", "items": {"type": "object"}}, "note": {"type": "string"}},
                "required": ["stops"],
            },
        },
    },
]

TRIP_ARGS = {
    "stops": [{"city": "Zürich", "days": 2, "tags": ["lake", "old town"]}, {"city": "東京", "days": 3, "hotel": {"name": "Hotel \"Sakura\"", "stars": 4}}],
    "note": "a \"quoted\" \\ path\n",
}

# One conversation per trace: the model's scripted replies (text, [(call id, name, arguments)]);
# after a reply with calls the loop runs the tools, which answer from ``results``.
SCENARIOS = [
    {
        "file": "agent",
        "trace_name": "weather-question",
        "system": "You are a concise weather assistant.",
        "user": "What's the weather in Paris?",
        "tools": ["get_weather"],
        "rounds": [
            (None, [("call_w1", "get_weather", {"city": "Paris"})]),
            ("It is 18°C with light rain in Paris.", []),
        ],
        "results": {"call_w1": "18°C, light rain"},
    },
    {
        "file": "agent",
        "trace_name": "trip-planning",
        "system": "You are a travel helper. Check the weather before planning.",
        "user": "Compare the weather in Zürich and 東京, then plan a trip.",
        "tools": ["get_weather", "plan_trip"],
        "rounds": [
            ("Checking both cities.", [("call_p1", "get_weather", {"city": "Zürich"}), ("call_p2", "get_weather", {"city": "東京", "unit": "celsius"})]),
            (None, [("call_p3", "plan_trip", TRIP_ARGS)]),
            ("Zürich is 12°C and 東京 is 22°C; your 5-day trip is planned.", []),
        ],
        "results": {"call_p1": "Zürich: 12°C, wind 5 km/h", "call_p2": "東京: 22°C, humid", "call_p3": {"ok": True, "itinerary_id": "trip-42", "days": 5}},
    },
    {
        "file": "agent",
        "trace_name": "greeting",
        "system": None,
        "user": "Say hello in French.",
        "tools": [],
        "rounds": [("Bonjour !", [])],
        "results": {},
    },
    {
        "file": "image",
        "trace_name": "picture",
        "system": None,
        "user": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="}},
        ],
        "tools": [],
        "rounds": [("A single white pixel.", [])],
        "results": {},
    },
]


# Generations an app records by hand around its own model call (no openai client): two
# independent calls in one trace (two conversations of one trace), input a message list, output
# a string, usage as Langfuse's own ``input`` / ``output`` keys.
MANUAL = {
    "file": "manual",
    "trace_name": "summaries",
    "model": "local-llama",
    "calls": [
        {"name": "summarize", "messages": [{"role": "system", "content": "Summarize in one line."}, {"role": "user", "content": "Zürich had rain all week; 東京 was sunny."}],
         "output": "Rain in Zürich, sun in 東京.", "usage": {"input": 21, "output": 9}},
        {"name": "translate", "messages": [{"role": "user", "content": "Translate to German: good morning"}],
         "output": "Guten Morgen", "usage": {"input": 8, "output": 3}},
    ],
}


# ---- the loopback server ---------------------------------------------------------------------


class Script:
    def __init__(self):
        self.replies: list[tuple] = []
        self.requests: list[dict] = []
        self.other: list[str] = []
        self.media: list[dict] = []


def serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/api/public/media":  # the SDK registers an image it cut out of the input
                script.media.append(body)
                data = json.dumps({"mediaId": "already-stored", "uploadUrl": None}).encode()  # "stored already": no upload
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if not self.path.endswith("/chat/completions"):  # another Langfuse API call: none is expected
                script.other.append(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            script.requests.append(body)
            text, calls = script.replies.pop(0)
            n = len(script.requests)
            msg = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                    for cid, name, args in calls
                ]
            prompt_tokens = 20 + 7 * len(body.get("messages") or [])
            completion_tokens = 5 + 9 * len(calls) + len((text or "").split())
            reply = {
                "id": f"chatcmpl-{n:04d}",
                "object": "chat.completion",
                "created": 1764000000 + n,
                "model": MODEL,
                "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
                "system_fingerprint": "fp_loopback",
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


# ---- writing spans ---------------------------------------------------------------------------


def seeded_ids(seed: int):
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class SeededIds(IdGenerator):
        def __init__(self):
            self.rng = random.Random(seed)

        def generate_span_id(self) -> int:
            return self.rng.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            return self.rng.getrandbits(128) or 1

    return SeededIds()


def _hex_ids(obj):
    """protobuf JSON writes bytes ids as base64; the collector's file exporter writes hex."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                obj[k] = base64.b64decode(v).hex()
            else:
                _hex_ids(v)
    elif isinstance(obj, list):
        for v in obj:
            _hex_ids(v)
    return obj


def write_files(name: str, spans) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    by_trace: dict[int, list] = {}
    for s in spans:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    with open(os.path.join(OUT, f"{name}.otlp.jsonl"), "w", encoding="utf-8") as f:
        for group in by_trace.values():
            doc = _hex_ids(MessageToDict(encode_spans(group)))
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, f"{name}.spans.jsonl"), "w", encoding="utf-8") as f:
        for s in spans:
            f.write(s.to_json(indent=None) + "\n")


def provider(seed: int, service: str):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=seeded_ids(seed))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


# ---- the app, traced by Langfuse ---------------------------------------------------------


def run(base_url: str, script: Script, wrapped: str | None = None) -> dict[str, list]:
    """``wrapped``: None (each tool its own observation), ``"keyword"`` or ``"positional"`` (one
    generic ``call_tool`` observation, called with keyword or positional arguments)."""
    from langfuse import Langfuse, observe, propagate_attributes
    from langfuse.openai import OpenAI
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    langfuse = Langfuse(span_exporter=exporter, base_url=base_url.removesuffix("/v1"), public_key="pk-lf-x", secret_key="sk-lf-x",
                        id_generator=seeded_ids(5), environment="fixtures", release="1.0.0")
    client = OpenAI(base_url=base_url, api_key="sk-loopback", max_retries=0)
    by_name = {t["function"]["name"]: t for t in TOOLS}
    current: dict = {}

    @observe(as_type="tool")
    def get_weather(city: str, unit: str | None = None):
        return current["results"][current["call"]]

    @observe(as_type="tool")
    def plan_trip(stops: list, note: str = ""):
        return current["results"][current["call"]]

    impls = {"get_weather": get_weather, "plan_trip": plan_trip}

    @observe(as_type="tool", name="call_tool")
    def call_tool(name: str, arguments: dict):  # the app's one tool observation: dispatches by name
        return current["results"][current["call"]]

    @observe(as_type="agent", name="travel-agent")
    def agent(question, system: str | None = None, tool_names: tuple = ()) -> str:
        sc = current["scenario"]
        messages: list = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": question})
        tools = [by_name[n] for n in tool_names]
        while True:
            kw = {"tools": tools} if tools else {}
            resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, temperature=0, **kw)
            msg = resp.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                return msg.content
            for call in msg.tool_calls:
                current.update(results=sc["results"], call=call.id)
                if wrapped == "positional":
                    result = call_tool(call.function.name, json.loads(call.function.arguments))
                elif wrapped:
                    result = call_tool(name=call.function.name, arguments=json.loads(call.function.arguments))
                else:
                    result = impls[call.function.name](**json.loads(call.function.arguments))
                text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})

    files: dict[str, list] = {}
    for sc in (SCENARIOS[:2] if wrapped else SCENARIOS):
        if wrapped:
            sc = {**sc, "file": "wrapped_tools_positional" if wrapped == "positional" else "wrapped_tools"}
        exporter.clear()
        script.replies = list(sc["rounds"])
        with propagate_attributes(trace_name=sc["trace_name"], session_id="session-1", user_id="user-1"):
            current["scenario"] = sc
            agent(sc["user"], system=sc["system"], tool_names=tuple(sc["tools"]))
        langfuse.flush()
        files.setdefault(sc["file"], []).extend(sorted(exporter.get_finished_spans(), key=lambda s: s.start_time))
    if wrapped:
        langfuse.shutdown()
        return files
    exporter.clear()
    with propagate_attributes(trace_name=MANUAL["trace_name"]):
        with langfuse.start_as_current_observation(as_type="span", name="batch"):
            for call in MANUAL["calls"]:
                with langfuse.start_as_current_observation(as_type="generation", name=call["name"], model=MANUAL["model"],
                                                           input=call["messages"]) as gen:
                    gen.update(output=call["output"], usage_details=call["usage"])
    langfuse.flush()
    files[MANUAL["file"]] = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    langfuse.shutdown()
    return files


def main(argv: list[str]) -> None:
    os.makedirs(OUT, exist_ok=True)
    script = Script()
    srv = serve(script)
    base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        wrapped = {"wrapped_tools": "keyword", "wrapped_tools_positional": "positional"}.get(argv[0]) if argv else None
        for name, spans in run(base_url, script, wrapped=wrapped).items():
            write_files(name, spans)
        assert not script.replies, script.replies
        assert not script.other, f"unexpected calls to the Langfuse API: {script.other}"
    finally:
        srv.shutdown()
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
