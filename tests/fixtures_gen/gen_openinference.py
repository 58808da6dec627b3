"""OpenInference span fixtures, written by the real Arize/Phoenix instrumentations, offline.

Run (no network, no key): ``/work/fixenv/openinference/bin/python tests/fixtures_gen/gen_openinference.py``
with the pins of ``tests/fixtures_gen/requirements-openinference.txt``.

A stdlib HTTP server on 127.0.0.1 (random port) answers ``POST /v1/chat/completions`` from the
script below. Spans are captured with OpenTelemetry's ``InMemorySpanExporter`` (trace and span ids
from a seeded generator) and written to ``tests/data/import/openinference/`` as:

* ``*.otlp.jsonl``: OTLP JSON, the collector file exporter's shape: one
  ``ExportTraceServiceRequest`` per line (one per trace here), built by
  ``opentelemetry-exporter-otlp-proto-common``'s ``encode_spans`` + ``google.protobuf.json_format``,
  with the ids turned from protobuf JSON's base64 into the collector's hex;
* ``*.spans.jsonl``: the SDK's ``ReadableSpan.to_json(indent=None)``, one span per line.

Files:

* ``openai_tools``: ``openinference-instrumentation-openai`` around the ``openai`` client, in a
  tool-calling loop written like an app instrumented for Phoenix: an AGENT span per
  conversation and a TOOL span per tool execution, made with ``OITracer`` and its helpers
  (``set_tool``, ``set_input``, ``set_output``). Three traces: one call (with a system prompt); parallel
  calls with unicode / escaped / nested arguments and a second tool round; a plain answer (no
  tools, no system prompt).
* ``openai_image``: one trace whose user message has an image part (a loss to report).
* ``smolagents``: ``openinference-instrumentation-smolagents`` around a smolagents
  ``ToolCallingAgent`` whose model is an ``OpenAIServerModel`` pointed at the loopback server.
  Two agent runs (two traces): one tool call then ``final_answer``; parallel calls then
  ``final_answer``.
* ``smolagents_two_rounds``: one smolagents run with two tool rounds before ``final_answer``,
  the model writing a line of text with each call (smolagents' memory then holds the text as an
  assistant message and the calls as a ``tool-call`` message after it) (``SMOL_TWO_ROUNDS``; written alone by ``gen_openinference.py smolagents_two_rounds``, the
  other files left as they are).
* ``smolagents_openai``: the first run again with both instrumentations on, as Phoenix users
  often have them: each smolagents LLM span has the openai instrumentation's LLM span inside it
  (the same call seen twice, once as the agent's memory, once as the wire request).

The scenario (user texts, scripted model replies, tool results) is held in ``SCENARIOS`` /
``SMOL_RUNS`` below; the tests re-state what they expect from it.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "import", "openinference")
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
                "properties": {
                    "stops": {"type": "array", "items": {"type": "object"}},
                    "note": {"type": "string"},
                },
                "required": ["stops"],
            },
        },
    },
]

TRIP_ARGS = {
    "stops": [{"city": "Zürich", "days": 2, "tags": ["lake", "old town"]}, {"city": "東京", "days": 3, "hotel": {"name": "Hotel \"Sakura\"", "stars": 4}}],
    "note": "a \"quoted\" \\ path\n",
}

# One conversation per trace. ``rounds``: the model's scripted replies (text, [(call id, name,
# arguments)]); after a reply with calls, the loop runs the tools: results from ``results``.
SCENARIOS = [
    {
        "file": "openai_tools",
        "agent": "weather-agent",
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
        "file": "openai_tools",
        "agent": "travel-agent",
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
        "file": "openai_tools",
        "agent": None,
        "system": None,
        "user": "Say hello in French.",
        "tools": [],
        "rounds": [("Bonjour !", [])],
        "results": {},
    },
    {
        "file": "openai_image",
        "agent": None,
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

# smolagents runs: the task, the scripted model replies (all tool calls: ToolCallingAgent ends with
# the final_answer tool), and what the tools return.
SMOL_RUNS = [
    {
        "task": "What's the weather in Paris?",
        "rounds": [
            (None, [("call_s1", "get_weather", {"city": "Paris"})]),
            (None, [("call_s2", "final_answer", {"answer": "It is 18°C with light rain in Paris."})]),
        ],
    },
    {
        "task": "Compare the weather in Zürich and 東京.",
        "rounds": [
            (None, [("call_s3", "get_weather", {"city": "Zürich"}), ("call_s4", "get_weather", {"city": "東京"})]),
            (None, [("call_s5", "final_answer", {"answer": "Zürich: 12°C, 東京: 22°C."})]),
        ],
    },
]
SMOL_TWO_ROUNDS = [
    {
        "task": "Is it warmer in Zürich or in 東京?",
        "rounds": [
            ("Zürich first.", [("call_t1", "get_weather", {"city": "Zürich"})]),
            ("Now 東京.", [("call_t2", "get_weather", {"city": "東京"})]),
            (None, [("call_t3", "final_answer", {"answer": "東京 (22°C) is warmer than Zürich (12°C)."})]),
        ],
    },
]
WEATHER = {"Paris": "18°C, light rain", "Zürich": "Zürich: 12°C, wind 5 km/h", "東京": "東京: 22°C, humid"}


# ---- the loopback server ---------------------------------------------------------------------


class Script:
    def __init__(self):
        self.replies: list[tuple] = []
        self.requests: list[dict] = []


def serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.path.endswith("/chat/completions"), self.path
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


# ---- openai + openinference-instrumentation-openai -------------------------------------------


def run_openai(base_url: str, script: Script) -> dict[str, list]:
    import openai
    from openinference.instrumentation import OITracer, TraceConfig
    from openinference.instrumentation.openai import OpenAIInstrumentor

    tp, exporter = provider(7, "weather-app")
    OpenAIInstrumentor().instrument(tracer_provider=tp)
    tracer = OITracer(tp.get_tracer("weather-app", "1.0.0"), TraceConfig())
    client = openai.OpenAI(base_url=base_url, api_key="sk-loopback", max_retries=0)
    by_name = {t["function"]["name"]: t for t in TOOLS}
    files: dict[str, list] = {}
    for sc in SCENARIOS:
        exporter.clear()
        script.replies = list(sc["rounds"])
        messages: list = []
        if sc["system"]:
            messages.append({"role": "system", "content": sc["system"]})
        messages.append({"role": "user", "content": sc["user"]})
        tools = [by_name[n] for n in sc["tools"]]

        def loop(messages=messages, tools=tools, sc=sc):
            while True:
                kw = {"tools": tools} if tools else {}
                resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, temperature=0, **kw)
                msg = resp.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                if not msg.tool_calls:
                    return msg.content
                for call in msg.tool_calls:
                    with tracer.start_as_current_span(call.function.name, openinference_span_kind="tool") as span:
                        fn = by_name[call.function.name]["function"]
                        span.set_tool(name=fn["name"], description=fn["description"], parameters=fn["parameters"])
                        span.set_input(call.function.arguments, mime_type="application/json")
                        span.set_attribute("tool.id", call.id)
                        result = sc["results"][call.id]
                        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
                        span.set_output(text, mime_type="text/plain" if isinstance(result, str) else "application/json")
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})

        if sc["agent"]:
            with tracer.start_as_current_span(sc["agent"], openinference_span_kind="agent") as agent:
                agent.set_input(sc["user"])
                agent.set_output(loop())
        else:
            loop()
        files.setdefault(sc["file"], []).extend(exporter.get_finished_spans())
    OpenAIInstrumentor().uninstrument()
    return files


# ---- smolagents + openinference-instrumentation-smolagents ----------------------------------


def run_smolagents(base_url: str, script: Script, runs: list, seed: int, with_openai: bool = False) -> list:
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city name.
        """
        return WEATHER[city]

    tp, exporter = provider(seed, "smol-app")
    SmolagentsInstrumentor().instrument(tracer_provider=tp)
    if with_openai:
        OpenAIInstrumentor().instrument(tracer_provider=tp)
    spans = []
    for run in runs:
        exporter.clear()
        script.replies = list(run["rounds"])
        model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=base_url, api_key="sk-loopback", client_kwargs={"max_retries": 0})
        agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=4, verbosity_level=0)
        agent.run(run["task"])
        spans.extend(exporter.get_finished_spans())
    SmolagentsInstrumentor().uninstrument()
    if with_openai:
        OpenAIInstrumentor().uninstrument()
    return spans


def main(argv: list[str]) -> None:
    os.makedirs(OUT, exist_ok=True)
    script = Script()
    srv = serve(script)
    base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    if argv == ["smolagents_two_rounds"]:
        try:
            write_files("smolagents_two_rounds", run_smolagents(base_url, script, SMOL_TWO_ROUNDS, 17))
            assert not script.replies, script.replies
        finally:
            srv.shutdown()
        return
    try:
        write_files("smolagents_two_rounds", run_smolagents(base_url, script, SMOL_TWO_ROUNDS, 17))
        for name, spans in run_openai(base_url, script).items():
            write_files(name, spans)
        write_files("smolagents", run_smolagents(base_url, script, SMOL_RUNS, 11))
        write_files("smolagents_openai", run_smolagents(base_url, script, SMOL_RUNS[:1], 13, with_openai=True))
        assert not script.replies, script.replies
    finally:
        srv.shutdown()
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
