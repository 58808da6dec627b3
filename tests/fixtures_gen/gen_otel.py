"""Make the OTel GenAI fixture files in tests/data/import/otel/ with the real instrumentations.

Offline: the ``openai`` client talks to a stdlib HTTP server on 127.0.0.1 that answers
``/v1/chat/completions`` from SCENARIOS below; OpenTelemetry's in-memory exporters capture the
spans and log records, which are written in the shapes people have on disk.

    python3 -m venv /work/fixenv/otel && /work/fixenv/otel/bin/pip install -r tests/fixtures_gen/requirements-otel.txt
    /work/fixenv/otel/bin/python tests/fixtures_gen/gen_otel.py            # every mode but the next
    python3 -m venv /work/fixenv/otel-legacy && /work/fixenv/otel-legacy/bin/pip install -r tests/fixtures_gen/requirements-otel-legacy.txt
    /work/fixenv/otel-legacy/bin/python tests/fixtures_gen/gen_otel.py --mode openllmetry-legacy

Each mode runs in its own process (the instrumentations read their settings from the
environment when they are set up). Modes and files (all OTLP JSON files are one
``ExportTraceServiceRequest`` / ``ExportLogsServiceRequest`` per line, one line per trace):

* ``v2-span``  opentelemetry-instrumentation-openai-v2, ``gen_ai_latest_experimental``,
  content ``SPAN_ONLY``: ``openai_v2_spans.otlp.jsonl`` (hex ids, as the collector's file
  exporter writes them), ``openai_v2_spans.b64.otlp.jsonl`` (base64 ids, as protobuf's
  ``MessageToDict`` writes them), ``openai_v2_spans.spans.jsonl`` (``ReadableSpan.to_json()``,
  one per line);
* ``v2-event`` the same with content ``EVENT_ONLY``: ``openai_v2_events.otlp.jsonl`` (span
  lines, then log lines: the collector's file exporter in both pipelines) and
  ``openai_v2_events.logs.otlp.jsonl`` (the log lines alone);
* ``v2-truncated`` as ``v2-span`` with ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` cutting a long
  tool result: ``openai_v2_truncated.otlp.jsonl``;
* ``openllmetry`` traceloop's opentelemetry-instrumentation-openai 0.62.4:
  ``openllmetry_spans.otlp.jsonl``;
* ``openllmetry-events`` the same with ``use_attributes=False``: the content in per-message
  events ``gen_ai.system.message`` / ``gen_ai.user.message`` / ``gen_ai.assistant.message`` /
  ``gen_ai.tool.message`` / ``gen_ai.choice``: ``openllmetry_events.otlp.jsonl`` (span lines,
  then log lines). (openai-v2 2.4b0 has no such mode any more: with util-genai 1.1b0 it always
  takes the latest-conventions path, ``is_experimental_mode()`` is always true.)
* ``openllmetry-legacy`` traceloop's 0.54.0 (the last one writing ``gen_ai.prompt.N`` /
  ``gen_ai.completion.N`` / ``llm.request.functions.N``): ``openllmetry_legacy.otlp.jsonl``.

The agent around the model calls makes an ``invoke_agent`` span (with the agent's tool
definitions) and one ``execute_tool`` span per tool call, as the GenAI semantic conventions
describe (with util-genai's handler where the venv has it, else by hand with the same
attributes).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "import" / "otel"

# ---- the scenario (the tests re-state what they expect from it) ------------------------------

SYSTEM = "You are a concise travel assistant. Use the tools when they help."
MODEL = "gpt-4o-mini"
RESPONSE_MODEL = "gpt-4o-mini-2024-07-18"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write text to a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "search_notes", "description": "Search the user's notes.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "object", "properties": {
                "field": {"type": "string"}, "values": {"type": "array", "items": {}}}}},
            "limit": {"type": "integer"}}, "required": ["query"]}}},
]
FETCH_TOOL = {"type": "function", "function": {
    "name": "fetch_report", "description": "Fetch a report by id.",
    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}

LONG_REPORT = {"id": "r-42", "sections": [{"n": i, "text": "Quarterly figures, region %d: all within plan." % i} for i in range(120)]}

# A reply: ("text", str) or ("calls", [(call id, name, arguments dict)]); usage = (prompt, completion).
# Tool results: call id -> the string the agent sends back.
SCENARIOS = {
    "weather": {
        "system": SYSTEM,
        "user": "What's the weather in Zürich and 東京 right now?",
        "tools": ["get_weather"],
        "replies": [
            (("calls", [("call_zrh", "get_weather", {"city": "Zürich", "unit": "celsius"}),
                        ("call_tyo", "get_weather", {"city": "東京", "unit": "celsius"})]), (112, 41)),
            (("text", "Zürich: 7 °C and foggy. 東京: 18 °C and clear."), (201, 19)),
        ],
        "results": {"call_zrh": '{"city": "Zürich", "temp_c": 7, "sky": "Nebel"}',
                    "call_tyo": '{"city": "東京", "temp_c": 18, "sky": "晴れ"}'},
    },
    "files": {
        "system": SYSTEM,
        "user": "Save my note, then find related notes tagged travel or food.",
        "tools": ["get_weather", "write_file", "search_notes"],
        "replies": [
            (("calls", [("call_write", "write_file",
                         {"path": 'notes/a "quoted" \\ path\n.txt', "content": 'Line 1\nLine "2"\t✓'})]), (150, 33)),
            (("calls", [("call_search", "search_notes",
                         {"query": "related", "filters": [{"field": "tag", "values": ["travel", "food"]},
                                                          {"field": "year", "values": [2024, {"from": 2020}]}],
                          "limit": 3})]), (190, 45)),
            (("text", "Saved the note and found 1 related note: Café list."), (240, 14)),
        ],
        "results": {"call_write": "wrote 18 bytes", "call_search": '[{"id": 7, "title": "Café list"}]'},
    },
    "plain": {
        "system": None,
        "user": "Say hello in French.",
        "tools": [],
        "replies": [(("text", "Bonjour !"), (12, 3))],
        "results": {},
    },
    # two independent agent runs inside one trace (one root span)
    "pair-1": {
        "system": SYSTEM,
        "user": "What's the weather in Oslo?",
        "tools": ["get_weather"],
        "replies": [
            (("calls", [("call_oslo", "get_weather", {"city": "Oslo"})]), (98, 17)),
            (("text", "Oslo: -2 °C with snow."), (131, 9)),
        ],
        "results": {"call_oslo": '{"city": "Oslo", "temp_c": -2, "sky": "snow"}'},
    },
    "pair-2": {
        "system": None,
        "user": "Name a prime number.",
        "tools": [],
        "replies": [(("text", "7"), (11, 1))],
        "results": {},
    },
    # only in the truncated file: the tool result is longer than the attribute limit
    "report": {
        "system": SYSTEM,
        "user": "Fetch report r-42 and tell me if anything is off.",
        "tools": ["fetch_report"],
        "replies": [
            (("calls", [("call_report", "fetch_report", {"id": "r-42"})]), (80, 12)),
            (("text", "Report r-42: all 120 regions are within plan."), (2400, 15)),
        ],
        "results": {"call_report": json.dumps(LONG_REPORT, ensure_ascii=False)},
    },
}
TRACES = [["weather"], ["files"], ["plain"], ["pair-1", "pair-2"]]
TRUNCATED_TRACES = [["report"], ["plain"]]
ATTRIBUTE_LIMIT = 2000


def tool_schemas(names: list[str]) -> list[dict]:
    by_name = {t["function"]["name"]: t for t in [*TOOLS, FETCH_TOOL]}
    return [by_name[n] for n in names]


def scenario_of(messages: list[dict]) -> str:
    user = next(m["content"] for m in messages if m["role"] == "user")
    return next(k for k, s in SCENARIOS.items() if s["user"] == user)


# ---- the fake endpoint ---------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        key = scenario_of(body["messages"])
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        (kind, what), (pt, ct) = SCENARIOS[key]["replies"][turn]
        msg: dict = {"role": "assistant", "content": None, "refusal": None}
        if kind == "text":
            msg["content"] = what
            finish = "stop"
        else:
            msg["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                for cid, name, args in what
            ]
            finish = "tool_calls"
        resp = {
            "id": f"chatcmpl-{key}-{turn}", "object": "chat.completion", "created": 1764000000, "model": RESPONSE_MODEL,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
            "system_fingerprint": "fp_fixture",
        }
        data = json.dumps(resp, ensure_ascii=False).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve() -> tuple[ThreadingHTTPServer, str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


# ---- one mode (in its own process) ---------------------------------------------------------------


def run_mode(mode: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class SeededIds(IdGenerator):  # the same ids on every run
        def __init__(self, seed: str):
            self.rng = random.Random(seed)

        def generate_span_id(self) -> int:
            return self.rng.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            return self.rng.getrandbits(128) or 1

    resource = Resource.create({"service.name": "otel-fixture-agent"})
    tp = TracerProvider(resource=resource, id_generator=SeededIds(mode))
    spans = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tp)
    logs = None
    lp = None
    if mode in ("v2-event", "openllmetry-events"):
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import InMemoryLogExporter, SimpleLogRecordProcessor

        lp = LoggerProvider(resource=resource)
        logs = InMemoryLogExporter()
        lp.add_log_record_processor(SimpleLogRecordProcessor(logs))
        set_logger_provider(lp)

    handler = None
    if mode.startswith("v2"):
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        from opentelemetry.util.genai.handler import TelemetryHandler

        OpenAIInstrumentor().instrument(tracer_provider=tp, logger_provider=lp)
        handler = TelemetryHandler(tracer_provider=tp, logger_provider=lp)
    elif mode == "openllmetry-events":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor(use_attributes=False).instrument(tracer_provider=tp, logger_provider=lp)
    else:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=tp)

    import openai

    srv, base_url = serve()
    client = openai.OpenAI(base_url=base_url, api_key="sk-fixture", max_retries=0)
    tracer = tp.get_tracer("otel_fixture.agent", "0.1")
    traces = TRUNCATED_TRACES if mode == "v2-truncated" else TRACES
    for keys in traces:
        if len(keys) == 1:
            run_agent(client, tracer, handler, keys[0])
        else:
            with tracer.start_as_current_span("batch", attributes={"batch.size": len(keys)}):
                for k in keys:
                    run_agent(client, tracer, handler, k)
    srv.shutdown()
    write_mode(mode, spans.get_finished_spans(), logs.get_finished_logs() if logs else ())


def run_agent(client, tracer, handler, key: str) -> None:
    """A minimal agent loop: call the model, run the tools it asks for, until it answers."""
    sc = SCENARIOS[key]
    tools = tool_schemas(sc["tools"])
    messages: list[dict] = []
    if sc["system"]:
        messages.append({"role": "system", "content": sc["system"]})
    messages.append({"role": "user", "content": sc["user"]})
    agent_name = "travel-agent"
    if handler is not None:
        from opentelemetry.util.genai.types import FunctionToolDefinition

        agent = handler.start_invoke_local_agent(agent_name=agent_name, request_model=MODEL)
        agent.tool_definitions = [FunctionToolDefinition(name=t["function"]["name"], description=t["function"]["description"],
                                                         parameters=t["function"]["parameters"]) for t in tools] or None
        ctx = None
    else:
        attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent_name, "gen_ai.request.model": MODEL}
        if tools:
            attrs["gen_ai.tool.definitions"] = json.dumps([{"type": "function", **t["function"]} for t in tools], ensure_ascii=False)
        ctx = tracer.start_as_current_span(f"invoke_agent {agent_name}", attributes=attrs)
        ctx.__enter__()
    try:
        while True:
            kw = {"tools": tools} if tools else {}
            resp = client.chat.completions.create(model=MODEL, messages=messages, **kw)
            msg = resp.choices[0].message
            if not msg.tool_calls:
                break
            messages.append({"role": "assistant", "content": msg.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in msg.tool_calls]})
            for c in msg.tool_calls:
                result = sc["results"][c.id]
                run_tool(tracer, handler, c.id, c.function.name, c.function.arguments, result)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    finally:
        if handler is not None:
            agent.stop()
        else:
            ctx.__exit__(None, None, None)


def run_tool(tracer, handler, call_id: str, name: str, arguments: str, result: str) -> None:
    if handler is not None:
        inv = handler.tool(name, tool_call_id=call_id, tool_type="function")
        if inv.should_capture_content_on_span:
            inv.arguments = json.loads(arguments)
            # a JSON result is handed over as the object the tool returned
            inv.tool_result = json.loads(result) if result[:1] in "[{" else result
        inv.stop()
        return
    with tracer.start_as_current_span(f"execute_tool {name}", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function", "gen_ai.tool.call.arguments": arguments, "gen_ai.tool.call.result": result,
    }):
        pass


# ---- writing ----------------------------------------------------------------------------------


def _hex(b64: str) -> str:
    return base64.b64decode(b64).hex()


def hex_ids(doc: dict) -> dict:
    """protobuf JSON (base64 bytes) → the collector file exporter's JSON (hex trace/span ids)."""
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = _hex(sp[k])
                for ln in sp.get("links", []):
                    for k in ("traceId", "spanId"):
                        if ln.get(k):
                            ln[k] = _hex(ln[k])
    for rl in doc.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for lr in sl.get("logRecords", []):
                for k in ("traceId", "spanId"):
                    if lr.get(k):
                        lr[k] = _hex(lr[k])
    return doc


def _line(doc: dict) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


def write_mode(mode: str, spans, logs) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    by_trace: dict[int, list] = {}
    for s in spans:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    logs_by_trace: dict[int, list] = {}
    for lr in logs:
        logs_by_trace.setdefault(lr.log_record.trace_id, []).append(lr)
    b64_span_lines = [MessageToDict(encode_spans(group)) for group in by_trace.values()]
    b64_log_lines = [MessageToDict(encode_logs(group)) for group in logs_by_trace.values()]
    span_lines = [_line(hex_ids(json.loads(json.dumps(d)))) for d in b64_span_lines]
    log_lines = [_line(hex_ids(json.loads(json.dumps(d)))) for d in b64_log_lines]
    OUT.mkdir(parents=True, exist_ok=True)

    def write(name: str, lines: list[str]) -> None:
        (OUT / name).write_text("".join(lines), encoding="utf-8")
        print(f"{name}: {len(lines)} lines, {(OUT / name).stat().st_size} bytes")

    if mode == "v2-span":
        write("openai_v2_spans.otlp.jsonl", span_lines)
        write("openai_v2_spans.b64.otlp.jsonl", [_line(d) for d in b64_span_lines])
        write("openai_v2_spans.spans.jsonl", [json.dumps(json.loads(s.to_json(indent=None)), ensure_ascii=False) + "\n" for s in spans])
    elif mode == "v2-event":
        write("openai_v2_events.otlp.jsonl", span_lines + log_lines)
        write("openai_v2_events.logs.otlp.jsonl", log_lines)
    elif mode == "openllmetry-events":
        write("openllmetry_events.otlp.jsonl", span_lines + log_lines)
    elif mode == "v2-truncated":
        write("openai_v2_truncated.otlp.jsonl", span_lines)
    elif mode == "openllmetry":
        write("openllmetry_spans.otlp.jsonl", span_lines)
    elif mode == "openllmetry-legacy":
        write("openllmetry_legacy.otlp.jsonl", span_lines)


MODE_ENV = {
    "v2-span": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
    "v2-event": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
                 "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"},
    "v2-truncated": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
                     "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
                     "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": str(ATTRIBUTE_LIMIT)},
    "openllmetry": {"TRACELOOP_TRACE_CONTENT": "true"},
    "openllmetry-events": {"TRACELOOP_TRACE_CONTENT": "true"},
    "openllmetry-legacy": {"TRACELOOP_TRACE_CONTENT": "true"},
}
DEFAULT_MODES = ["v2-span", "v2-event", "v2-truncated", "openllmetry", "openllmetry-events"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=list(MODE_ENV), action="append",
                    help="run only these modes (default: all but openllmetry-legacy, which needs its own venv)")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    modes = a.mode or DEFAULT_MODES
    if a.in_process:
        run_mode(modes[0])
        return
    for m in modes:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACELOOP_"))}
        env.update(MODE_ENV[m])
        env["OPENAI_API_KEY"] = "sk-fixture"
        subprocess.run([sys.executable, __file__, "--in-process", "--mode", m], env=env, check=True)


if __name__ == "__main__":
    main()
