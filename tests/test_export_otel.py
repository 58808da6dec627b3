"""Export to OpenTelemetry GenAI spans (OTLP JSON, backend/exporters/export_otel.py), checked against the
official ``opentelemetry-proto`` messages: every line must parse as an ``ExportTraceServiceRequest``
(protobuf's JSON parser reads bytes as base64, so the OTLP/JSON hex ids are converted for the
check, and must decode to 16 / 8 bytes). Traces come from the real engine with the scripted
backend (parallel calls with unicode, a failing tool, reasoning, a system prompt) and from
sample_traces/; token counts are checked against the runs of ``response_mask``, computed here
without the steps. The round trip (export → ``otel`` import) is the last test."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import pytest
from cli_inprocess import run_cli
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from backend.engine import AgentLoop, LoopConfig
from backend.exporters.export import EXPORT_FORMATS, export_traces
from backend.exporters.export_otel import DEFAULT_AGENT_NAME, otel_trace_id, traces_to_otlp, write_otlp_jsonl
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import StepState, Trace, load_traces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR = 1_800_000_000.0  # a synthetic_start for the exports that must give the same bytes
SAMPLES = os.path.join(ROOT, "sample_traces")


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
    """
    return {"temperature": 72, "city": city}


def lookup(query: str):
    """Look a word up.

    Args:
        query: what to look up
    """
    return f"résultat pour «{query}» ✓"


def fail_always(x: str):
    """A tool that raises.

    Args:
        x: anything
    """
    raise RuntimeError("backend down ✗")


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


SYSTEM = "You are a terse assistant. Réponds brièvement 🙂."


def run(bundle, script, tools, messages, **cfg) -> Trace:
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, script), bundle, tools=ToolRegistry.from_functions(tools), config=LoopConfig(**cfg))
    return asyncio.run(loop.run(messages))


@pytest.fixture(scope="module")
def engine_traces() -> dict[str, Trace]:
    qwen3 = load_tokenizer("qwen3")
    thinking = load_tokenizer("qwen3-thinking")
    parallel = "\n".join([call("get_current_temperature", city="東京, 日本"), call("lookup", query='naïve "quoted" \\ {nested: [1]}'),
                          call("get_current_temperature", city="Zürich, CH")])
    return {
        "parallel": run(qwen3, [parallel, "Tokyo 72°F, Zürich 72°F — ✓ 🌤"], [get_current_temperature, lookup],
                        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in 東京 and Zürich? 🌍"}],
                        max_parallel_calls=3),
        "failed": run(qwen3, [call("fail_always", x="ü"), "The tool failed, sorry."], [fail_always],
                      [{"role": "user", "content": "Try the tool."}]),
        "reasoning": run(thinking, ["<think>\nI should look it up: «ok».\n</think>\n\n" + call("lookup", query="ok"),
                                    "<think>\nDone.\n</think>\n\nIt is ok."], [lookup],
                         [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Look up ok."}],
                         apply_chat_template_kwargs={"enable_thinking": True}),
        "plain": run(qwen3, ["Just an answer."], [get_current_temperature], [{"role": "user", "content": "Hi"}]),
    }


@pytest.fixture(scope="module")
def sample_traces() -> list[Trace]:
    out: list[Trace] = []
    for name in sorted(os.listdir(SAMPLES)):
        if name.endswith(".jsonl"):
            res = load_traces(os.path.join(SAMPLES, name))
            assert not res.problems
            out += res.traces
    return out


@pytest.fixture(scope="module")
def no_turns(engine_traces) -> Trace:
    """A run that failed before its first turn (a rollout's error trace): messages, no steps."""
    return Trace(id="no-turns", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Bonjour ü 🙂"}],
                 tools=engine_traces["parallel"].tools, termination_reason="error", metadata={"error": "model failed to load"})


@pytest.fixture(scope="module")
def all_traces(engine_traces, sample_traces, no_turns) -> list[Trace]:
    return list(engine_traces.values()) + sample_traces + [no_turns]


# ---- helpers: the checks, computed from the OTLP JSON alone ------------------------------------


def proto_parse(line: str) -> ExportTraceServiceRequest:
    """protobuf's JSON parser on the line, with the hex ids turned into the base64 it reads."""
    req = json.loads(line)
    for rs in req["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        h = sp[k]
                        assert h == h.lower() and len(h) == {"traceId": 32}.get(k, 16), (k, h)
                        raw = bytes.fromhex(h)
                        assert any(raw), f"{k} is all zero"
                        sp[k] = base64.b64encode(raw).decode()
    return json_format.Parse(json.dumps(req), ExportTraceServiceRequest())


def spans_of(req: dict) -> list[dict]:
    return [sp for rs in req["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def value(v: dict):
    """An OTLP JSON AnyValue as a Python value."""
    ((kind, x),) = v.items()
    if kind == "intValue":
        return int(x)
    if kind == "arrayValue":
        return [value(e) for e in x.get("values", [])]
    return x


def attrs(span: dict) -> dict:
    return {kv["key"]: value(kv["value"]) for kv in span["attributes"]}


def by_op(spans: list[dict], op: str) -> list[dict]:
    return [s for s in spans if attrs(s)["gen_ai.operation.name"] == op]


def mask_runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(bit, start, length)`` runs of a mask."""
    out: list[list[int]] = []
    for i, m in enumerate(mask):
        if out and out[-1][0] == m:
            out[-1][2] += 1
        else:
            out.append([m, i, 1])
    return [tuple(r) for r in out]


# ---- structure -----------------------------------------------------------------------------------


def test_every_line_parses_as_an_otlp_request(tmp_path, all_traces):
    p = tmp_path / "otel.jsonl"
    assert write_otlp_jsonl(iter(all_traces), str(p)) == len(all_traces)
    lines = p.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(all_traces)  # one request per trace per line
    for line, t in zip(lines, all_traces):
        msg = proto_parse(line)
        (rs,) = msg.resource_spans
        assert {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"] == "agent-loop-inspector"
        (ss,) = rs.scope_spans
        assert ss.scope.name == "agent_loop_inspector" and ss.scope.version == "0.1.0"
        gen = [s for s in t.steps if s.state == StepState.GENERATING]
        results = [r for s in t.steps if s.state == StepState.PROCESSING_TOOLS for r in s.tool_results]
        assert len(ss.spans) == 1 + len(gen) + len(results)
        for sp in ss.spans:
            assert len(sp.trace_id) == 16 and len(sp.span_id) == 8
            assert sp.start_time_unix_nano <= sp.end_time_unix_nano
        root = ss.spans[0]
        assert root.name.startswith(f"invoke_agent {DEFAULT_AGENT_NAME}: ") and not root.parent_span_id and root.kind == 1  # INTERNAL
        assert all(sp.parent_span_id == root.span_id and sp.trace_id == root.trace_id for sp in ss.spans[1:])
        assert [sp.kind for sp in ss.spans if sp.name.startswith("chat")] == [3] * len(gen)  # CLIENT


def test_the_encoding_is_otlp_json(engine_traces):
    req = traces_to_otlp([engine_traces["parallel"]])
    root, chat = spans_of(req)[:2]
    assert set(root) >= {"traceId", "spanId", "name", "kind", "startTimeUnixNano", "endTimeUnixNano", "attributes"}
    assert "parentSpanId" not in root and chat["parentSpanId"] == root["spanId"]
    assert isinstance(root["startTimeUnixNano"], str) and root["startTimeUnixNano"].isdigit()
    assert root["kind"] == 1 and chat["kind"] == 3
    a = {kv["key"]: kv["value"] for kv in chat["attributes"]}
    assert a["gen_ai.usage.input_tokens"] == {"intValue": str(chat_input_tokens(engine_traces["parallel"])[0])}
    assert a["gen_ai.response.finish_reasons"] == {"arrayValue": {"values": [{"stringValue": "tool_call"}]}}
    assert a["gen_ai.operation.name"] == {"stringValue": "chat"}
    assert traces_to_otlp([])["resourceSpans"][0]["scopeSpans"][0]["spans"] == []


def chat_input_tokens(t: Trace) -> list[int]:
    return [len(t.prompt_ids) + start for bit, start, _ in mask_runs(t.response_mask) if bit == 1]


def test_token_counts_are_the_generated_runs_of_the_mask(all_traces):
    for t in all_traces:
        chats = by_op(spans_of(traces_to_otlp([t])), "chat")
        gen_runs = [(bit, start, n) for bit, start, n in mask_runs(t.response_mask) if bit == 1]
        assert len(chats) == len(gen_runs), t.id  # every generated turn is one run of 1s
        for sp, (_, start, n) in zip(chats, gen_runs):
            a = attrs(sp)
            assert a["gen_ai.usage.output_tokens"] == n, t.id
            assert a["gen_ai.usage.input_tokens"] == len(t.prompt_ids) + start, t.id
            assert a["agent_loop_inspector.token_span"] == [len(t.prompt_ids) + start, len(t.prompt_ids) + start + n]


def test_chat_spans_carry_the_conversation(engine_traces):
    t = engine_traces["parallel"]
    spans = spans_of(traces_to_otlp([t]))
    first, second = by_op(spans, "chat")
    a1, a2 = attrs(first), attrs(second)
    assert json.loads(a1["gen_ai.system_instructions"]) == [{"type": "text", "content": SYSTEM}]
    # the system prompt is given once, as instructions, not again in the input messages
    assert json.loads(a1["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": "Weather in 東京 and Zürich? 🌍"}]}]
    (out,) = json.loads(a1["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_call"
    assert [(p["type"], p["name"], p["arguments"]) for p in out["parts"]] == [
        ("tool_call", "get_current_temperature", {"city": "東京, 日本"}),
        ("tool_call", "lookup", {"query": 'naïve "quoted" \\ {nested: [1]}'}),
        ("tool_call", "get_current_temperature", {"city": "Zürich, CH"}),
    ]
    ids = [p["id"] for p in out["parts"]]
    assert len(set(ids)) == 3 and all(ids)
    inp = json.loads(a2["gen_ai.input.messages"])
    assert [m["role"] for m in inp] == ["user", "assistant", "tool", "tool", "tool"]
    assert [m["parts"][0]["id"] for m in inp[2:]] == ids
    assert [m["parts"][0]["type"] for m in inp[2:]] == ["tool_call_response"] * 3
    assert inp[3]["parts"][0]["response"] == 'résultat pour «naïve "quoted" \\ {nested: [1]}» ✓'
    assert json.loads(a2["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Tokyo 72°F, Zürich 72°F — ✓ 🌤"}], "finish_reason": "stop"}]
    assert a2["gen_ai.response.finish_reasons"] == ["stop"]
    defs = json.loads(a1["gen_ai.tool.definitions"])
    assert [(d["type"], d["name"]) for d in defs] == [("function", "get_current_temperature"), ("function", "lookup")]
    assert defs[0]["parameters"] == t.tools[0]["function"]["parameters"]
    assert a1["gen_ai.provider.name"] == "scripted" and a1["gen_ai.conversation.id"] == t.id
    # the scripted backend names no model: the tokenizer its ids are of stands in, and says so
    assert first["name"] == "chat qwen3" and a1["agent_loop_inspector.model_source"] == "tokenizer"


def test_tool_spans_one_per_answered_call(engine_traces):
    t = engine_traces["parallel"]
    tools = by_op(spans_of(traces_to_otlp([t])), "execute_tool")
    calls = t.steps[1].tool_calls
    assert [s["name"] for s in tools] == [f"execute_tool {c.name}" for c in calls]
    for sp, c, r in zip(tools, calls, t.steps[2].tool_results):
        a = attrs(sp)
        assert sp["kind"] == 1 and "status" not in sp
        assert a["gen_ai.tool.name"] == c.name and a["gen_ai.tool.call.id"] == c.id == r.call_id
        assert json.loads(a["gen_ai.tool.call.arguments"]) == c.arguments
        assert a["gen_ai.tool.call.result"] == r.content
        assert a["gen_ai.tool.type"] == "function"
    assert attrs(tools[0])["gen_ai.tool.description"] == "Get current temperature at a location."


def test_a_failed_tool_is_an_error_span(engine_traces):
    t = engine_traces["failed"]
    (tool,) = by_op(spans_of(traces_to_otlp([t])), "execute_tool")
    (r,) = t.steps[2].tool_results
    assert not r.ok
    assert tool["status"]["code"] == 2 and "backend down ✗" in tool["status"]["message"]
    a = attrs(tool)
    assert a["error.type"] == r.error and a["gen_ai.tool.call.result"] == r.content
    assert json.loads(a["gen_ai.tool.call.arguments"]) == {"x": "ü"}


def test_reasoning_is_a_reasoning_part(engine_traces):
    t = engine_traces["reasoning"]
    first, second = by_op(spans_of(traces_to_otlp([t])), "chat")
    (out,) = json.loads(attrs(first)["gen_ai.output.messages"])
    assert out["parts"][0] == {"type": "reasoning", "content": t.messages[2]["reasoning_content"]}
    assert "I should look it up" in out["parts"][0]["content"]
    assert out["parts"][1]["type"] == "tool_call"
    (out2,) = json.loads(attrs(second)["gen_ai.output.messages"])
    assert [p["type"] for p in out2["parts"]] == ["reasoning", "text"]
    assert out2["parts"][1]["content"] == "It is ok."


def test_the_root_span_says_how_the_run_ended(engine_traces, sample_traces):
    t = engine_traces["plain"]
    root = spans_of(traces_to_otlp([t]))[0]
    a = attrs(root)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["agent_loop_inspector.trace_id"] == t.id
    assert a["agent_loop_inspector.termination_reason"] == "no_tool_calls"
    assert a["agent_loop_inspector.tokenizer"] == "qwen3"
    assert "status" not in root
    malformed = next(x for x in sample_traces if x.termination_reason == "malformed_tool_call")
    root = spans_of(traces_to_otlp([malformed]))[0]
    assert root["status"]["code"] == 2 and attrs(root)["error.type"] == "malformed_tool_call"
    (chat,) = by_op(spans_of(traces_to_otlp([malformed])), "chat")
    assert [e["name"] for e in chat["events"]] == ["agent_loop_inspector.parse_error"]


def test_the_root_span_holds_the_agents_input_and_answer(engine_traces, no_turns):
    t = engine_traces["parallel"]
    a = attrs(spans_of(traces_to_otlp([t]))[0])
    assert json.loads(a["gen_ai.system_instructions"]) == [{"type": "text", "content": SYSTEM}]
    assert json.loads(a["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": t.messages[1]["content"]}]}]
    assert json.loads(a["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": t.messages[-1]["content"]}], "finish_reason": "stop"}]
    assert [d["name"] for d in json.loads(a["gen_ai.tool.definitions"])] == ["get_current_temperature", "lookup"]
    # no generated turn: the whole conversation is on the root, the only span
    (root,) = spans_of(traces_to_otlp([no_turns]))
    a = attrs(root)
    assert json.loads(a["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": "Bonjour ü 🙂"}]}]
    assert "gen_ai.output.messages" not in a and "agent_loop_inspector.synthetic_time" in a
    assert root["status"]["code"] == 2 and a["agent_loop_inspector.termination_reason"] == "error"


def test_recorded_times_are_used(engine_traces):
    t = engine_traces["parallel"]
    spans = spans_of(traces_to_otlp([t]))
    assert not any("agent_loop_inspector.synthetic_time" in attrs(s) for s in spans)
    chats = by_op(spans, "chat")
    gen = [s for s in t.steps if s.state == StepState.GENERATING]
    for sp, s in zip(chats, gen):
        assert abs(int(sp["startTimeUnixNano"]) - s.started_at * 1e9) < 2_000  # to the microsecond
    root = spans[0]
    assert all(int(root["startTimeUnixNano"]) <= int(s["startTimeUnixNano"]) for s in spans)
    assert all(int(root["endTimeUnixNano"]) >= int(s["endTimeUnixNano"]) for s in spans)


def test_a_trace_without_times_gets_marked_monotonic_ones(engine_traces):
    t = engine_traces["parallel"].model_copy(deep=True)
    for s in t.steps:
        s.started_at = None
    t.metadata.pop("started_at", None)
    spans = spans_of(traces_to_otlp([t], synthetic_start=ANCHOR))
    assert all(attrs(s)["agent_loop_inspector.synthetic_time"] is True for s in spans)
    assert int(spans[0]["startTimeUnixNano"]) == int(ANCHOR) * 10**9
    chat1, chat2 = by_op(spans, "chat")
    tools = by_op(spans, "execute_tool")
    assert int(chat1["endTimeUnixNano"]) <= min(int(s["startTimeUnixNano"]) for s in tools)
    assert max(int(s["endTimeUnixNano"]) for s in tools) <= int(chat2["startTimeUnixNano"])
    assert all(int(s["startTimeUnixNano"]) < int(s["endTimeUnixNano"]) for s in spans)
    assert int(spans[0]["endTimeUnixNano"]) == max(int(s["endTimeUnixNano"]) for s in spans)


def test_ids_are_deterministic_valid_and_distinct(tmp_path, all_traces):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_otlp_jsonl(all_traces, str(a), synthetic_start=ANCHOR)
    write_otlp_jsonl(iter(all_traces), str(b), synthetic_start=ANCHOR)
    assert a.read_bytes() == b.read_bytes()  # exporting twice gives the same file
    reqs = [json.loads(line) for line in a.read_text(encoding="utf-8").splitlines()]
    trace_ids = [spans_of(r)[0]["traceId"] for r in reqs]
    assert len(set(trace_ids)) == len(all_traces)
    assert trace_ids[0] == otel_trace_id(all_traces[0].id)
    span_ids = [s["spanId"] for r in reqs for s in spans_of(r)]
    assert len(set(span_ids)) == len(span_ids)
    # the same trace twice in one export: two OTel traces, not one merged
    twice = traces_to_otlp([all_traces[0], all_traces[0]])
    roots = [s for s in spans_of(twice) if "parentSpanId" not in s]
    assert len(roots) == 2 and roots[0]["traceId"] != roots[1]["traceId"]
    assert len({s["spanId"] for s in spans_of(twice)}) == 2 * len(spans_of(reqs[0]))


def test_writing_streams_the_traces(tmp_path, all_traces, monkeypatch):
    import backend.exporters.export_otel as eo

    pulled = 0
    seen: list[int] = []
    real = eo.trace_spans

    def spans(t, ids=None):
        seen.append(pulled)
        return real(t, ids)

    def gen():
        nonlocal pulled
        for t in all_traces:
            pulled += 1
            yield t

    monkeypatch.setattr(eo, "trace_spans", spans)
    assert write_otlp_jsonl(gen(), str(tmp_path / "s.jsonl")) == len(all_traces)
    assert seen == list(range(1, len(all_traces) + 1))  # each converted before the next is read


def test_export_format_and_cli(tmp_path, sample_traces):

    assert "otel" in EXPORT_FORMATS
    p = tmp_path / "e.jsonl"
    assert export_traces(iter(sample_traces), "otel", str(p), synthetic_start=1767225600.0) == len(sample_traces)
    out = tmp_path / "cli.jsonl"
    files = sorted(os.path.join(SAMPLES, f) for f in os.listdir(SAMPLES) if f.endswith(".jsonl"))
    r = run_cli("export", *files, "--format", "otel", "--out", str(out), "--synthetic-start", "2026-01-01T00:00:00Z")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == p.read_bytes()
    for line in out.read_text(encoding="utf-8").splitlines():
        proto_parse(line)


# ---- as a viewer shows it (Phoenix: issue 31 items 18-22) ---------------------------------------


def roots(req: dict) -> list[dict]:
    return [s for s in spans_of(req) if "parentSpanId" not in s]


def test_synthetic_times_are_recent_ordered_and_said(sample_traces, no_turns, engine_traces):
    """Traces without real times (the samples' are made up: ``metadata.timings``; a run that
    recorded none) start an hour before the export by default (recent, and in the past: a viewer's
    window ends now), one after another, each span saying
    its time is synthetic; real times are kept; a given anchor gives the same bytes."""
    import time

    assert all(t.metadata["timings"].startswith("synthetic") for t in sample_traces)
    untimed = engine_traces["parallel"].model_copy(deep=True)
    for s in untimed.steps:
        s.started_at = None
    untimed.metadata.pop("started_at", None)
    traces = [*sample_traces, untimed, engine_traces["plain"], no_turns]
    before = time.time()
    req = traces_to_otlp(traces)
    after = time.time()
    rs = roots(req)
    assert len(rs) == len(traces)
    synthetic = [r for r, t in zip(rs, traces) if t is not engine_traces["plain"]]
    hour = 3600 * 10**9
    for r in synthetic:  # inside a viewer's "last 7 days" window, not 2026-01-01, and none in the future
        assert int(before * 1e9) - hour - 1000 <= int(r["startTimeUnixNano"])
        assert int(r["endTimeUnixNano"]) <= int(after * 1e9)
    assert int(synthetic[0]["startTimeUnixNano"]) <= int(after * 1e9) - hour + 1000
    for a, b in zip(synthetic, synthetic[1:]):  # each after the previous one's end (turn 2 after turn 1)
        assert int(b["startTimeUnixNano"]) > int(a["endTimeUnixNano"])
    for sp in spans_of(req):
        t = traces[[r["traceId"] for r in rs].index(sp["traceId"])]
        assert (attrs(sp).get("agent_loop_inspector.synthetic_time") is True) == (t is not engine_traces["plain"]), t.id
    # the made-up times keep their durations: the samples' 25 ms per generated token
    weather = next(t for t in sample_traces if t.id == "sample-weather-seattle")
    chat = by_op(spans_of(traces_to_otlp([weather])), "chat")[0]
    gen = next(s for s in weather.steps if s.state == StepState.GENERATING)
    assert int(chat["endTimeUnixNano"]) - int(chat["startTimeUnixNano"]) == round(gen.duration_s * 1e9)
    # real times stay as recorded, whatever the anchor
    plain = engine_traces["plain"]
    assert int(roots(traces_to_otlp([plain], synthetic_start=ANCHOR))[0]["startTimeUnixNano"]) == round(plain.metadata["started_at"] * 1e6) * 1000
    # a given anchor: the first synthetic trace starts there, and the bytes repeat
    one, two = (json.dumps(traces_to_otlp(traces, synthetic_start=ANCHOR)) for _ in range(2))
    assert one == two
    assert int(roots(json.loads(one))[0]["startTimeUnixNano"]) == int(ANCHOR) * 10**9
    with pytest.raises(ValueError):
        traces_to_otlp(traces, synthetic_start=float("nan"))


def test_the_cli_takes_the_synthetic_start(tmp_path, sample_traces):

    src = os.path.join(SAMPLES, "06_thinking_multiturn.jsonl")
    out = tmp_path / "o.jsonl"
    base = ["export", src, "--to", "otel", "--out", str(out)]
    r = run_cli(*base, "--synthetic-start", "1800000000")
    assert r.returncode == 0, r.stderr
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert roots(first)[0]["startTimeUnixNano"] == str(int(ANCHOR) * 10**9)
    r = run_cli(*base, "--synthetic-start", "yesterday")
    assert r.returncode == 2 and "not a time" in r.stderr
    r = run_cli(*base[:-4], "--to", "jsonl", "--out", str(tmp_path / "j.jsonl"), "--synthetic-start", "0")
    assert r.returncode == 2 and "--synthetic-start is for --to otel" in r.stderr


def test_the_root_summarises_the_run_for_a_trace_list(sample_traces, engine_traces):
    """What Phoenix shows in its trace list: the root's input.value / output.value (the user's
    question, the final answer, as text), its name ``invoke_agent {gen_ai.agent.name}``, the model."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    by_id = {t.id: t for t in sample_traces}
    for t in sample_traces:
        (root,) = roots(traces_to_otlp([t], synthetic_start=ANCHOR))
        a = attrs(root)
        users = [m["content"] for m in t.messages if m["role"] == "user"]
        assert a["input.value"] == users[-1] and a["input.mime_type"] == "text/plain", t.id
        assert a[ga.GEN_AI_AGENT_NAME] == DEFAULT_AGENT_NAME and root["name"] == f"invoke_agent {DEFAULT_AGENT_NAME}: {t.metadata['title']}"
        last = t.messages[-1]
        if t.termination_reason == "no_tool_calls":
            assert a["output.value"] == last["content"] and a["output.mime_type"] == "text/plain", t.id
    # a malformed call is not an answer: the root's output is the error it ended on
    a = attrs(roots(traces_to_otlp([by_id["sample-malformed-call"]], synthetic_start=ANCHOR))[0])
    assert a["output.value"].startswith("malformed tool call (malformed_tool_call): malformed tool call: invalid JSON")
    # turn 2 of a multi-turn run: its own question
    a = attrs(roots(traces_to_otlp([by_id["sample-thinking-multiturn-turn2"]], synthetic_start=ANCHOR))[0])
    assert a["input.value"] == "And in Celsius?" and a["output.value"] == "That is about 22°C."
    # an agent named in the metadata, and the model where known
    t = engine_traces["plain"].model_copy(deep=True)
    t.metadata["agent_name"] = "weather-bot"
    t.metadata["generator"] = {**t.metadata["generator"], "model": "Qwen/Qwen3-4B-Instruct-2507"}
    spans = spans_of(traces_to_otlp([t]))
    assert spans[0]["name"] == "invoke_agent weather-bot: Hi" and attrs(spans[0])[ga.GEN_AI_AGENT_NAME] == "weather-bot"
    assert attrs(spans[0])[ga.GEN_AI_REQUEST_MODEL] == "Qwen/Qwen3-4B-Instruct-2507"
    assert by_op(spans, "chat")[0]["name"] == "chat Qwen/Qwen3-4B-Instruct-2507"
    imported = engine_traces["plain"].model_copy(deep=True)
    imported.metadata["generator"] = {}
    imported.metadata["model"] = "gpt-4o-mini-2024-07-18"  # what importers record
    assert attrs(roots(traces_to_otlp([imported]))[0])[ga.GEN_AI_REQUEST_MODEL] == "gpt-4o-mini-2024-07-18"


def test_the_turns_of_one_conversation_share_its_id(engine_traces, sample_traces):
    """A chat whose every message is a run (the Playground passes its conversation's key):
    every span of every turn carries the same gen_ai.conversation.id; imported traces use
    the session / conversation id they carry; others their own id."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    qwen3 = load_tokenizer("qwen3")
    loop = AgentLoop(ScriptedGenerator(qwen3.tokenizer, ["Hello.", "Again."]), qwen3, tools=ToolRegistry.from_functions([lookup]))
    t1 = asyncio.run(loop.run([{"role": "user", "content": "Hi"}], conversation_key="chat-42"))
    t2 = asyncio.run(loop.run([*t1.messages, {"role": "user", "content": "Once more"}], conversation_key="chat-42"))
    assert t1.metadata["conversation_id"] == t2.metadata["conversation_id"] == "chat-42"
    assert Trace.from_json(t1.to_json()).metadata["conversation_id"] == "chat-42"  # kept in the file
    for sp in spans_of(traces_to_otlp([t1, t2])):
        assert attrs(sp)[ga.GEN_AI_CONVERSATION_ID] == "chat-42"
    # the samples' multi-turn scenario: its two runs are one conversation
    turns = [t for t in sample_traces if t.id.startswith("sample-thinking-multiturn-")]
    assert len(turns) == 2
    assert {attrs(sp)[ga.GEN_AI_CONVERSATION_ID] for sp in spans_of(traces_to_otlp(turns))} == {"sample-thinking-multiturn"}
    imported = engine_traces["plain"].model_copy(deep=True)
    imported.metadata["provenance"] = {"format": "Langfuse", "trace_id": "abc"}
    imported.metadata["session_id"] = "sess-7"
    assert attrs(roots(traces_to_otlp([imported]))[0])[ga.GEN_AI_CONVERSATION_ID] == "sess-7"
    # a trace of before (no conversation recorded): its own id
    old = engine_traces["plain"]
    assert "conversation_id" not in old.metadata
    assert attrs(roots(traces_to_otlp([old]))[0])[ga.GEN_AI_CONVERSATION_ID] == old.id


def test_a_malformed_call_marks_the_chat_span_that_made_it(sample_traces):
    malformed = next(x for x in sample_traces if x.termination_reason == "malformed_tool_call")
    (chat,) = by_op(spans_of(traces_to_otlp([malformed])), "chat")
    assert chat["status"]["code"] == 2 and "malformed tool call" in chat["status"]["message"]
    (gen,) = [s for s in malformed.steps if s.state == StepState.GENERATING]
    assert gen.parse_errors[0].message in chat["status"]["message"]
    assert attrs(chat)["error.type"] == "malformed_tool_call"
    # a well-formed run's chat spans stay unset
    for t in sample_traces:
        if t.termination_reason == "no_tool_calls":
            assert all("status" not in sp for sp in by_op(spans_of(traces_to_otlp([t])), "chat")), t.id


def test_chat_input_is_what_the_model_was_shown(sample_traces, engine_traces):
    """Turn 2 of a Qwen3 thinking chat: the template drops turn 1's reasoning from the prompt.
    The chat span's input keeps a message's reasoning only where the tokens the model was given
    (decoded here from the trace's ids, not its steps) hold it, and says which it left out."""
    turn2 = next(t for t in sample_traces if t.id == "sample-thinking-multiturn-turn2")
    tok = load_tokenizer(turn2.tokenizer.name).tokenizer
    ids = turn2.prompt_ids + turn2.response_ids
    with_reasoning = [i for i, m in enumerate(turn2.messages) if m.get("reasoning_content")]
    assert with_reasoning  # the sample has earlier turns with reasoning
    for sp in by_op(spans_of(traces_to_otlp([turn2])), "chat"):
        a = attrs(sp)
        shown = tok.decode(ids[:a["gen_ai.usage.input_tokens"]])
        inp = json.loads(a["gen_ai.input.messages"])
        for m in inp:
            for p in m["parts"]:
                if p["type"] == "reasoning":
                    assert p["content"].strip() in shown
        dropped = [i for i in with_reasoning if i < len(inp) + 1 and turn2.messages[i]["reasoning_content"].strip() not in shown]
        assert dropped and a["agent_loop_inspector.input.reasoning_not_shown"] == dropped
    # the root's input leaves it out too (issue 42 item 11), and names it with its text (for the
    # otel import, which puts it back: test_round_trip_through_the_otel_importer)
    ra = attrs(roots(traces_to_otlp([turn2]))[0])
    root_in = json.loads(ra["gen_ai.input.messages"])
    assert not any(p["type"] == "reasoning" for m in root_in for p in m["parts"])
    assert ra["agent_loop_inspector.input.reasoning_not_shown"] == dropped
    assert ra["agent_loop_inspector.input.reasoning_not_shown_text"] == [turn2.messages[i]["reasoning_content"] for i in dropped]
    # reasoning the run generated itself stays (it is in the token stream)
    first, second = by_op(spans_of(traces_to_otlp([engine_traces["reasoning"]])), "chat")
    assert "reasoning" in [p["type"] for m in json.loads(attrs(second)["gen_ai.input.messages"]) for p in m["parts"]]
    assert "agent_loop_inspector.input.reasoning_not_shown" not in attrs(second)


# ---- round trip: export → the otel importer (otel-genai dialect) --------------------------------


def _conversation(messages: list[dict]) -> list[tuple]:
    """What must survive the round trip: roles, text, reasoning, calls (name + arguments) and
    tool results by call id."""
    out = []
    for m in messages:
        calls = tuple((c["function"]["name"], json.dumps(_args(c["function"].get("arguments")), sort_keys=True))
                      for c in m.get("tool_calls") or [])
        out.append((m["role"], m.get("content") or "", m.get("reasoning_content") or "", calls,
                    m.get("tool_call_id") if m["role"] == "tool" else None))
    return out


def _args(a):
    if isinstance(a, str):
        try:
            return json.loads(a)
        except json.JSONDecodeError:
            return a
    return a


def _tools(tools: list[dict]) -> list[tuple]:
    return [(x["function"]["name"], x["function"].get("description"), json.dumps(x["function"].get("parameters"), sort_keys=True))
            for x in tools]


def test_round_trip_through_the_otel_importer(tmp_path, all_traces):
    from backend.importers import import_file

    p = tmp_path / "rt.jsonl"
    write_otlp_jsonl(all_traces, str(p))
    res = import_file(str(p), "otel", tokenizer="qwen3")
    assert not res.problems, res.problems[:3]
    assert len(res.traces) == len(all_traces)
    for orig, back in zip(all_traces, res.traces):
        assert _conversation(back.messages) == _conversation(orig.messages), orig.id
        assert back.id == orig.id and back.termination_reason == orig.termination_reason, (back.id, orig.id)
        assert back.metadata["provenance"]["conversation_id"] == (orig.metadata.get("conversation_id") or orig.id)
        assert _tools(back.tools) == _tools(orig.tools), orig.id
        # the calls each tool result answers, by id
        calls = {c["id"]: c["function"]["name"] for m in back.messages for c in m.get("tool_calls") or []}
        for m in back.messages:
            if m["role"] == "tool":
                assert m["tool_call_id"] in calls


# ---- as Phoenix shows it, again (issue 42 items 8-11) -------------------------------------------


def test_a_malformed_calls_generated_text_is_the_chat_spans_output(sample_traces):
    """Item 8: the text the parse error points into is exported, as the chat span's output."""
    malformed = next(x for x in sample_traces if x.id == "sample-malformed-call")
    (gen,) = [s for s in malformed.steps if s.state == StepState.GENERATING]
    (chat,) = by_op(spans_of(traces_to_otlp([malformed])), "chat")
    a = attrs(chat)
    assert a["output.value"] == gen.text and a["output.mime_type"] == "text/plain"
    (err,) = gen.parse_errors
    assert "char 90" in err.message
    start, end = err.span
    assert a["output.value"][start:end] == err.raw  # the error's span, in the exported text
    assert json.loads(a["gen_ai.output.messages"])[0]["parts"] == [{"type": "text", "content": ""}]  # the message as recorded


def test_chat_and_tool_spans_have_input_and_output_values(engine_traces, sample_traces):
    """Item 9: what Phoenix's span table shows: a chat span's input is the messages as the model
    was shown them (JSON, system prompt included), its output the text it generated; a tool
    span's input its arguments, its output its result."""
    t = engine_traces["parallel"]
    spans = spans_of(traces_to_otlp([t]))
    gen = [s for s in t.steps if s.state == StepState.GENERATING]
    for sp, s in zip(by_op(spans, "chat"), gen):
        a = attrs(sp)
        assert a["input.mime_type"] == "application/json"
        assert json.loads(a["input.value"]) == t.messages[:min(s.messages_added)]
        assert json.loads(a["input.value"])[0] == {"role": "system", "content": SYSTEM}
        assert a["output.value"] == s.text and a["output.mime_type"] == "text/plain"
    assert "<tool_call>" in attrs(by_op(spans, "chat")[0])["output.value"]
    results = t.steps[2].tool_results
    for sp, c, r in zip(by_op(spans, "execute_tool"), t.steps[1].tool_calls, results):
        a = attrs(sp)
        assert json.loads(a["input.value"]) == c.arguments and a["input.mime_type"] == "application/json"
        assert a["output.value"] == r.content
    kinds = [attrs(sp)["output.mime_type"] for sp in by_op(spans, "execute_tool")]
    assert kinds == ["application/json", "text/plain", "application/json"]  # a JSON result, a text one
    # the input leaves out the reasoning the model was not shown (Qwen3 drops turn 1's)
    turn2 = next(x for x in sample_traces if x.id == "sample-thinking-multiturn-turn2")
    for sp in by_op(spans_of(traces_to_otlp([turn2])), "chat"):
        a = attrs(sp)
        shown = json.loads(a["input.value"])
        for i in a["agent_loop_inspector.input.reasoning_not_shown"]:
            assert "reasoning_content" not in shown[i] and shown[i]["content"] == turn2.messages[i]["content"]
    # every chat and tool span of every trace has both
    for tr in [*engine_traces.values(), *sample_traces]:
        for sp in by_op(spans_of(traces_to_otlp([tr])), "chat") + by_op(spans_of(traces_to_otlp([tr])), "execute_tool"):
            a = attrs(sp)
            assert a["input.value"] and a["output.value"], (tr.id, sp["name"])


def test_every_chat_span_names_its_model(engine_traces, sample_traces, tmp_path):
    """Item 10: gen_ai.request.model / gen_ai.response.model and OpenInference's llm.model_name
    with llm.token_count.* (Phoenix's model, token and cost columns) on every chat span: the
    run's model where the trace knows it; else (the scripted backend) the tokenizer its ids are
    of, marked ``agent_loop_inspector.model_source = tokenizer`` and not imported back as a model."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    for t in [*engine_traces.values(), *sample_traces]:
        spans = spans_of(traces_to_otlp([t]))
        for sp in by_op(spans, "chat"):
            a = attrs(sp)
            assert a[ga.GEN_AI_REQUEST_MODEL] == a[ga.GEN_AI_RESPONSE_MODEL] == a["llm.model_name"] == t.tokenizer.name, t.id
            assert sp["name"] == f"chat {t.tokenizer.name}"
            assert a["agent_loop_inspector.model_source"] == "tokenizer"
            assert a["llm.token_count.prompt"] == a[ga.GEN_AI_USAGE_INPUT_TOKENS]
            assert a["llm.token_count.completion"] == a[ga.GEN_AI_USAGE_OUTPUT_TOKENS]
            assert a["llm.token_count.total"] == a["llm.token_count.prompt"] + a["llm.token_count.completion"]
        assert attrs(spans[0])[ga.GEN_AI_REQUEST_MODEL] == t.tokenizer.name
    # a run that names its model: that model, not marked
    t = engine_traces["parallel"].model_copy(deep=True)
    t.metadata["generator"] = {**t.metadata["generator"], "model": "Qwen/Qwen3-4B-Instruct-2507"}
    for sp in spans_of(traces_to_otlp([t])):
        a = attrs(sp)
        assert "agent_loop_inspector.model_source" not in a
        if a["gen_ai.operation.name"] == "chat":
            assert a["llm.model_name"] == a[ga.GEN_AI_REQUEST_MODEL] == "Qwen/Qwen3-4B-Instruct-2507"
    # a tokenizer loaded from a folder: its last part, not the machine's path
    local = engine_traces["plain"].model_copy(deep=True)
    local.tokenizer.name = "/home/me/models/my-qwen/"
    assert attrs(by_op(spans_of(traces_to_otlp([local])), "chat")[0])["llm.model_name"] == "my-qwen"
    # imported back: the named model is the trace's model; the stand-in is not
    from backend.importers import import_file

    p = tmp_path / "m.jsonl"
    write_otlp_jsonl([t, engine_traces["plain"]], str(p))
    named, scripted = import_file(str(p), "otel", tokenizer="qwen3").traces
    assert named.metadata["model"] == "Qwen/Qwen3-4B-Instruct-2507" and "model" not in scripted.metadata


def test_roots_tell_runs_apart_and_every_run_has_an_output(all_traces, sample_traces, engine_traces, no_turns):
    """Item 11: a root's name is ``invoke_agent {agent}: {label}``, the label its title where it
    has one, else the question it answered (cut at 60 characters), else its id; every root has an
    output: the answer, else the error it ended on, else how it ended."""
    names = []
    for t in all_traces:
        (root,) = roots(traces_to_otlp([t]))
        names.append(root["name"])
        a = attrs(root)
        assert a["output.value"] and a["output.mime_type"] == "text/plain", t.id
    assert len(set(names)) == len(names), names
    by_id = {t.id: t for t in sample_traces}
    assert names[len(engine_traces)] == "invoke_agent agent-loop: " + sample_traces[0].metadata["title"]
    assert roots(traces_to_otlp([by_id["sample-thinking-multiturn-turn2"]]))[0]["name"] == \
        "invoke_agent agent-loop: multi-turn with thinking (user turn 2)"
    # no title: the question; a long one cut; none at all: the id
    t = engine_traces["parallel"]
    assert roots(traces_to_otlp([t]))[0]["name"] == "invoke_agent agent-loop: Weather in 東京 and Zürich? 🌍"
    long = engine_traces["plain"].model_copy(deep=True)
    long.messages[0]["content"] = "Tell me\nabout " + "the weather " * 20
    name = roots(traces_to_otlp([long]))[0]["name"]
    assert name.startswith("invoke_agent agent-loop: Tell me about the weather") and name.endswith("…")
    assert len(name) == len("invoke_agent agent-loop: ") + 60
    nothing = Trace(id="run-7", messages=[{"role": "system", "content": SYSTEM}], termination_reason="error")
    (root,) = roots(traces_to_otlp([nothing]))
    assert root["name"] == "invoke_agent agent-loop: run-7" and attrs(root)["output.value"] == "failed (error)"
    # outputs: the error a failed run ended on
    a = attrs(roots(traces_to_otlp([by_id["sample-malformed-call"]]))[0])
    (gen,) = [s for s in by_id["sample-malformed-call"].steps if s.state == StepState.GENERATING]
    assert a["output.value"] == f"malformed tool call (malformed_tool_call): malformed tool call: {gen.parse_errors[0].message}"
    (root,) = roots(traces_to_otlp([no_turns]))
    assert attrs(root)["output.value"] == "failed (error): model failed to load" and root["status"]["message"] == "failed (error): model failed to load"
    # a run that stopped on a limit after calling tools: how it ended, and the calls
    stopped = engine_traces["failed"].model_copy(deep=True)
    stopped.termination_reason = "max_assistant_turns"
    stopped.messages = stopped.messages[:3]
    stopped.steps = [s for s in stopped.steps if s.index <= 2]
    a = attrs(roots(traces_to_otlp([stopped]))[0])
    assert a["output.value"] == 'hit max_assistant_turns (max_assistant_turns); the last turn called fail_always({"x":"ü"})'
    assert "status" not in roots(traces_to_otlp([stopped]))[0]


def test_an_older_export_keeps_reasoning_on_the_root_and_still_imports_it(tmp_path, sample_traces):
    """Exports written before issue 42 item 11 kept the unshown reasoning in the root's input
    messages (no ``..._text``): the otel import reads it back from there, as it did."""
    from backend.exporters.export_otel import genai_message
    from backend.importers import import_file

    turn2 = next(t for t in sample_traces if t.id == "sample-thinking-multiturn-turn2")
    req = traces_to_otlp([turn2], synthetic_start=ANCHOR)
    root = roots(req)[0]
    kept = [kv for kv in root["attributes"] if kv["key"] != "agent_loop_inspector.input.reasoning_not_shown_text"]
    n_in = len(json.loads(attrs(root)["gen_ai.input.messages"]))
    for kv in kept:
        if kv["key"] == "gen_ai.input.messages":  # as recorded, reasoning included
            n_sys = sum(1 for m in turn2.messages[:2] if m["role"] == "system")
            kv["value"] = {"stringValue": json.dumps([genai_message(m) for m in turn2.messages[n_sys:n_sys + n_in]])}
    root["attributes"] = kept
    p = tmp_path / "old.jsonl"
    p.write_text(json.dumps(req) + "\n", encoding="utf-8")
    (back,) = import_file(str(p), "otel", tokenizer="qwen3").traces
    assert _conversation(back.messages) == _conversation(turn2.messages)


def test_every_span_has_openinferences_span_kind(all_traces, engine_traces):
    """Phoenix files a span under ``openinference.span.kind`` (without it: UNKNOWN, and its LLM
    and tool views leave our spans out). OpenInference's own conventions are the oracle: the kind
    is one of theirs, and chat / tool / agent spans are LLM / TOOL / AGENT; the attributes Phoenix
    reads for inputs, outputs, model and tokens are spelled as theirs."""
    from openinference.semconv.trace import OpenInferenceSpanKindValues as Kind
    from openinference.semconv.trace import SpanAttributes as OI

    expected = {"chat": Kind.LLM.value, "execute_tool": Kind.TOOL.value, "invoke_agent": Kind.AGENT.value}
    seen: set[str] = set()
    for sp in spans_of(traces_to_otlp([*all_traces, *engine_traces.values()])):
        a = attrs(sp)
        op = a["gen_ai.operation.name"]
        assert a[OI.OPENINFERENCE_SPAN_KIND] == expected[op], (op, sp["name"])
        seen.add(op)
        assert OI.INPUT_VALUE in a and OI.OUTPUT_VALUE in a, (op, sp["name"])
        if op == "chat":
            assert a[OI.LLM_MODEL_NAME] and a[OI.INPUT_MIME_TYPE] == "application/json"
            if OI.LLM_TOKEN_COUNT_PROMPT in a:
                assert a[OI.LLM_TOKEN_COUNT_TOTAL] == a[OI.LLM_TOKEN_COUNT_PROMPT] + a[OI.LLM_TOKEN_COUNT_COMPLETION]
    assert seen == set(expected)
