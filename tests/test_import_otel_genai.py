"""OTel GenAI dialect of the ``otel`` importer: span and log files written by the real
instrumentations (opentelemetry-instrumentation-openai-v2 with util-genai, traceloop's OpenLLMetry
0.62.4 and 0.54.0) against a loopback server (tests/fixtures_gen/gen_otel.py), and bad input.

The expected values re-state the generator's scenario (user text, scripted replies, tool results,
token counts)."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from backend.importers import detect, detect_why, import_file
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
OD = os.path.join(DATA, "otel")

SYSTEM = "You are a concise travel assistant. Use the tools when they help."
MODEL = "gpt-4o-mini-2024-07-18"


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def tool(id_, name, content):
    return {"role": "tool", "tool_call_id": id_, "content": content, "name": name}


WEATHER = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What's the weather in Zürich and 東京 right now?"},
    {"role": "assistant", "content": "", "tool_calls": [
        call("call_zrh", "get_weather", {"city": "Zürich", "unit": "celsius"}),
        call("call_tyo", "get_weather", {"city": "東京", "unit": "celsius"})]},
    tool("call_zrh", "get_weather", '{"city": "Zürich", "temp_c": 7, "sky": "Nebel"}'),
    tool("call_tyo", "get_weather", '{"city": "東京", "temp_c": 18, "sky": "晴れ"}'),
    {"role": "assistant", "content": "Zürich: 7 °C and foggy. 東京: 18 °C and clear."},
]
FILES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Save my note, then find related notes tagged travel or food."},
    {"role": "assistant", "content": "", "tool_calls": [
        call("call_write", "write_file", {"path": 'notes/a "quoted" \\ path\n.txt', "content": 'Line 1\nLine "2"\t✓'})]},
    tool("call_write", "write_file", "wrote 18 bytes"),
    {"role": "assistant", "content": "", "tool_calls": [
        call("call_search", "search_notes", {"query": "related", "filters": [{"field": "tag", "values": ["travel", "food"]},
                                                                            {"field": "year", "values": [2024, {"from": 2020}]}],
                                             "limit": 3})]},
    tool("call_search", "search_notes", '[{"id": 7, "title": "Café list"}]'),
    {"role": "assistant", "content": "Saved the note and found 1 related note: Café list."},
]
PLAIN = [{"role": "user", "content": "Say hello in French."}, {"role": "assistant", "content": "Bonjour !"}]
OSLO = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What's the weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [call("call_oslo", "get_weather", {"city": "Oslo"})]},
    tool("call_oslo", "get_weather", '{"city": "Oslo", "temp_c": -2, "sky": "snow"}'),
    {"role": "assistant", "content": "Oslo: -2 °C with snow."},
]
PRIME = [{"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "7"}]
# scenario -> (messages, tools the agent had, (input, output) tokens of each model call)
SCENARIOS = {
    "weather": (WEATHER, ["get_weather"], [(112, 41), (201, 19)]),
    "files": (FILES, ["get_weather", "write_file", "search_notes"], [(150, 33), (190, 45), (240, 14)]),
    "plain": (PLAIN, [], [(12, 3)]),
    "oslo": (OSLO, ["get_weather"], [(98, 17), (131, 9)]),
    "prime": (PRIME, [], [(11, 1)]),
}
V2 = ("opentelemetry.util.genai.handler", "1.1b0")  # openai-v2 2.4b0 writes its spans through util-genai
FILES_SCOPE = {  # file -> (instrumentation scope, or None where the file does not say; tools and tool spans in the file)
    "openai_v2_spans.otlp.jsonl": (V2, True),
    "openai_v2_spans.b64.otlp.jsonl": (V2, True),
    "openai_v2_spans.spans.jsonl": (None, True),  # ReadableSpan.to_json() has no scope
    "openai_v2_events.otlp.jsonl": (V2, True),
    "openai_v2_events.logs.otlp.jsonl": (V2, False),  # the log records alone
    "openllmetry_spans.otlp.jsonl": (("opentelemetry.instrumentation.openai.v1", "0.62.4"), True),
    "openllmetry_events.otlp.jsonl": (("opentelemetry.instrumentation.openai.v1", "0.62.4"), True),
    "openllmetry_legacy.otlp.jsonl": (("opentelemetry.instrumentation.openai.v1", "0.54.0"), True),
}
TRUNCATED = os.path.join(OD, "openai_v2_truncated.otlp.jsonl")


@pytest.fixture(scope="module")
def bundle():
    return load_tokenizer("qwen3")


_cache: dict[tuple[str, str], object] = {}


def imported(name: str, bundle, fmt: str = "auto"):
    key = (name, fmt)
    if key not in _cache:
        _cache[key] = import_file(os.path.join(OD, name), fmt, bundle=bundle)
    return _cache[key]


def by_scenario(res) -> dict[str, object]:
    out = {}
    for t in res.traces:
        user = next(m["content"] for m in t.messages if m["role"] == "user")
        key = next(k for k, (msgs, _, _) in SCENARIOS.items() if msgs[1 if msgs[0]["role"] == "system" else 0]["content"] == user)
        assert key not in out, f"two conversations of scenario {key}"
        out[key] = t
    return out


def test_every_fixture_file_is_there_and_small():
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(OD, "*.jsonl")))
    assert names == sorted([*FILES_SCOPE, os.path.basename(TRUNCATED)])
    for n in names:
        assert os.path.getsize(os.path.join(OD, n)) < 200_000


@pytest.mark.parametrize("name", sorted(FILES_SCOPE))
def test_fixture_imports_completely_with_the_scenarios_messages(name, bundle):
    res = imported(name, bundle)
    assert res.complete, res.problem_lines()
    assert res.formats == {"otel": 5}
    assert detect(os.path.join(OD, name)) == "otel"
    got = by_scenario(res)
    assert sorted(got) == sorted(SCENARIOS)
    scope, has_spans = FILES_SCOPE[name]
    for key, (msgs, tools, usage) in SCENARIOS.items():
        t = got[key]
        assert t.messages == msgs, (name, key)
        assert [x["function"]["name"] for x in t.tools] == (tools if has_spans else []), (name, key)
        prov = t.metadata["provenance"]
        assert prov["format"] == "OTel GenAI"
        assert re.fullmatch(r"[0-9a-f]{32}", prov["trace_id"])
        if scope is None:
            assert "library" not in prov and "version" not in prov
        else:
            assert (prov["library"], prov["version"]) == scope
        # usage: summed over the model calls, and per call
        assert t.metadata["usage"] == {"input_tokens": sum(i for i, _ in usage), "output_tokens": sum(o for _, o in usage)}
        spans = t.metadata["chat_spans"]
        assert [(s["input_tokens"], s["output_tokens"]) for s in spans] == usage
        assert all(re.fullmatch(r"[0-9a-f]{16}", s["span_id"]) for s in spans)
        assert [s["span_id"] for s in spans] == prov["span_ids"][: len(spans)]
        assert t.metadata["model"] == MODEL
        assert t.metadata["finish_reason"] == "stop"
        n_calls = sum(len(m.get("tool_calls") or []) for m in msgs)
        if has_spans:
            assert all(s["duration_s"] > 0 for s in spans)
            assert len(t.metadata.get("tool_durations_s", [])) == n_calls
            assert all(d >= 0 for d in t.metadata.get("tool_durations_s", []))
        # every tool result answers a call of the conversation, by id
        ids = {c["id"] for m in t.messages for c in m.get("tool_calls") or []}
        assert {m["tool_call_id"] for m in t.messages if m["role"] == "tool"} <= ids


@pytest.mark.parametrize("name", sorted(FILES_SCOPE))
def test_two_agent_runs_in_one_trace_are_two_conversations(name, bundle):
    got = by_scenario(imported(name, bundle))
    oslo, prime = got["oslo"], got["prime"]
    assert oslo.metadata["provenance"]["trace_id"] == prime.metadata["provenance"]["trace_id"]
    assert oslo.id != prime.id
    others = {got[k].metadata["provenance"]["trace_id"] for k in ("weather", "files", "plain")}
    assert len(others) == 3 and oslo.metadata["provenance"]["trace_id"] not in others


def test_hex_base64_and_span_json_give_the_same_conversations(bundle):
    runs = [imported(n, bundle) for n in ("openai_v2_spans.otlp.jsonl", "openai_v2_spans.b64.otlp.jsonl", "openai_v2_spans.spans.jsonl")]
    ref = runs[0]
    for res in runs[1:]:
        assert [t.id for t in res.traces] == [t.id for t in ref.traces]
        assert [t.messages for t in res.traces] == [t.messages for t in ref.traces]
        assert [t.tools for t in res.traces] == [t.tools for t in ref.traces]
        for a, b in zip(res.traces, ref.traces):
            assert a.metadata["provenance"]["trace_id"] == b.metadata["provenance"]["trace_id"]
            assert a.metadata["provenance"]["span_ids"] == b.metadata["provenance"]["span_ids"]
            assert a.metadata["usage"] == b.metadata["usage"]
    # the ids are the file's: the hex file names them as they are
    text = open(os.path.join(OD, "openai_v2_spans.otlp.jsonl"), encoding="utf-8").read()
    for t in ref.traces:
        assert t.metadata["provenance"]["trace_id"] in text
        assert all(s in text for s in t.metadata["provenance"]["span_ids"])


def test_the_explicit_format_and_the_tools_schemas(bundle):
    auto, explicit = imported("openllmetry_legacy.otlp.jsonl", bundle), imported("openllmetry_legacy.otlp.jsonl", bundle, "otel")
    assert [t.messages for t in explicit.traces] == [t.messages for t in auto.traces]
    assert explicit.complete
    files = by_scenario(explicit)["files"]
    search = next(x["function"] for x in files.tools if x["function"]["name"] == "search_notes")
    assert search["description"] == "Search the user's notes."
    assert search["parameters"]["properties"]["filters"]["type"] == "array"
    assert search["parameters"]["required"] == ["query"]
    # the same tools from the chat spans (0.62.4's gen_ai.tool.definitions) and the agent span (openai-v2)
    for name in ("openllmetry_spans.otlp.jsonl", "openai_v2_spans.otlp.jsonl"):
        assert by_scenario(imported(name, bundle))["files"].tools == files.tools


def test_import_renders_the_conversation(bundle):
    t = by_scenario(imported("openai_v2_spans.otlp.jsonl", bundle))["weather"]
    assert t.metadata["ids"] == "rendered"
    text = bundle.tokenizer.decode(t.prompt_ids + t.response_ids)
    assert "東京" in text and "Nebel" in text


def test_truncated_attribute_is_a_loss_and_the_rest_imports(bundle):
    res = import_file(TRUNCATED, "auto", bundle=bundle)
    assert not res.problems
    assert len(res.traces) == 2 and not res.complete
    report, plain = res.traces
    assert plain.messages == PLAIN and not plain.metadata.get("import", {}).get("losses")
    # the cut input of the second model call is rebuilt: the first call, the tool span's result, the last output
    roles = [m["role"] for m in report.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert report.messages[1]["content"] == "Fetch report r-42 and tell me if anything is off."
    assert report.messages[2]["tool_calls"] == [call("call_report", "fetch_report", {"id": "r-42"})]
    assert report.messages[3]["tool_call_id"] == "call_report" and report.messages[3]["content"].startswith('{"id":"r-42","sections":[')
    assert len(report.messages[3]["content"]) == 2000  # OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT in the generator
    assert report.messages[4]["content"] == "Report r-42: all 120 regions are within plan."
    losses = [p.reason for p in res.losses]
    assert len(losses) == 2
    chat_ids = report.metadata["chat_spans"]
    second = chat_ids[1]["span_id"]
    assert any(f"span {second} " in x and "gen_ai.input.messages: not valid JSON" in x and "attribute length limit" in x for x in losses)
    assert any("execute_tool fetch_report" in x and "gen_ai.tool.call.result" in x for x in losses)
    assert report.metadata["usage"] == {"input_tokens": 80 + 2400, "output_tokens": 12 + 15}


# ---- hand-made records: what the instrumentations can write that the fixtures do not show -------

TID = "0af7651916cd43dd8448eb211c80319c"


def _value(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _value(x)} for k, x in v.items()]}}
    return {"stringValue": v}


def span(sid, name, attrs, *, parent=None, start=1, end=2, tid=TID):
    s = {"traceId": tid, "spanId": sid, "name": name, "kind": 3, "startTimeUnixNano": str(start * 10**9),
         "endTimeUnixNano": str(end * 10**9), "attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()]}
    if parent:
        s["parentSpanId"] = parent
    return s


def request(*spans, scope=("my.instrumentation", "1.2.3")):
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
        {"scope": {"name": scope[0], "version": scope[1]}, "spans": list(spans)}]}]}


def logs_request(*records, scope=("my.instrumentation", "1.2.3")):
    return {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [
        {"scope": {"name": scope[0], "version": scope[1]}, "logRecords": list(records)}]}]}


def write(tmp_path, *docs, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return str(p)


def chat_attrs(inp, out, **extra):
    a = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
         "gen_ai.input.messages": inp if isinstance(inp, str) else json.dumps(inp, ensure_ascii=False),
         "gen_ai.output.messages": out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)}
    a.update(extra)
    return a


def text(role, s):
    return {"role": role, "parts": [{"type": "text", "content": s}]}


def test_system_instructions_reasoning_tool_definitions_on_the_chat_span(tmp_path, bundle):
    tools = [{"type": "function", "name": "lookup", "description": "Look a word up.",
              "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}]
    inp = [text("user", "Define 'ü'."),
           {"role": "assistant", "parts": [{"type": "reasoning", "content": "Look it up."},
                                           {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"word": "ü"}}]},
           {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"found": True, "text": "u umlaut"}}]}]
    out = [{"role": "assistant", "parts": [{"type": "text", "content": "It is "}, {"type": "text", "content": "u umlaut."}],
            "finish_reason": "length"}]
    p = write(tmp_path, request(span("00000000000000a1", "chat m", chat_attrs(
        inp, out, **{"gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
                     "gen_ai.tool.definitions": json.dumps(tools)}))))
    res = import_file(p, "auto", bundle=bundle)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert t.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Define 'ü'."},
        {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [call("c1", "lookup", {"word": "ü"})]},
        tool("c1", "lookup", '{"found": true, "text": "u umlaut"}'),
        {"role": "assistant", "content": "It is u umlaut."},
    ]
    assert t.tools == [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                         "parameters": tools[0]["parameters"]}}]
    assert t.metadata["finish_reason"] == "length" and t.termination_reason == "response_length"
    assert t.metadata["provenance"]["library"] == "my.instrumentation" and t.metadata["provenance"]["version"] == "1.2.3"
    assert t.id == TID and t.metadata["provenance"]["span_ids"] == ["00000000000000a1"]


def test_parts_with_no_text_and_extra_choices_are_losses(tmp_path, bundle):
    inp = [{"role": "user", "parts": [{"type": "text", "content": "What is in "},
                                      {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBO"},
                                      {"type": "uri", "modality": "image", "uri": "https://x/y.png"},
                                      {"type": "hologram", "data": 1}]},
           {"role": "narrator", "parts": [{"type": "text", "content": "meanwhile"}]}]
    out = [text("assistant", "A cat."), text("assistant", "A dog.")]
    p = write(tmp_path, request(span("00000000000000b1", "chat m", chat_attrs(inp, out))))
    res = import_file(p, "auto", bundle=bundle)
    assert not res.problems and not res.complete
    (t,) = res.traces
    assert t.messages == [{"role": "user", "content": "What is in "}, {"role": "assistant", "content": "A cat."}]
    losses = [x.reason for x in res.losses]
    assert len(losses) == 5, losses
    where = "(span 00000000000000b1 'chat m') gen_ai.input.messages"
    assert any(f"{where}[0].parts[1]: blob part (image) not carried over" in x for x in losses)
    assert any(f"{where}[0].parts[2]: uri part (image) not carried over" in x for x in losses)
    assert any(f"{where}[0].parts[3]: hologram part not carried over" in x for x in losses)
    assert any(f"{where}[1]: message of role 'narrator' not carried over" in x for x in losses)
    assert any("gen_ai.output.messages[1]: another output message (choice) not carried over" in x for x in losses)


def test_malformed_attribute_json_is_a_loss_naming_span_and_attribute(tmp_path, bundle):
    good = [text("user", "hi")]
    p = write(tmp_path,
              request(span("00000000000000c1", "chat m", chat_attrs(good, '[{"role": "assistant", "parts": [{"type": "te'))),
              request(span("00000000000000c2", "chat m", chat_attrs([text("user", "other")], [text("assistant", "fine")]),
                           tid="1" * 32)))
    res = import_file(p, "auto", bundle=bundle)
    assert not res.problems
    assert [t.messages for t in res.traces] == [[{"role": "user", "content": "hi"}],
                                               [{"role": "user", "content": "other"}, {"role": "assistant", "content": "fine"}]]
    (loss,) = res.losses
    assert loss.line == 1
    assert "line 1 resourceSpans[0].scopeSpans[0].spans[0] (span 00000000000000c1 'chat m') gen_ai.output.messages: not valid JSON" in loss.reason


def test_arguments_that_do_not_decode_are_kept_with_a_parse_error(tmp_path, bundle):
    inp = [text("user", "go")]
    out = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c9", "name": "run", "arguments": "{\"cmd\": \"ls"}]}]
    p = write(tmp_path, request(span("00000000000000d1", "chat m", chat_attrs(inp, out))))
    res = import_file(p, "auto", bundle=bundle)
    (t,) = res.traces
    assert t.messages[1]["tool_calls"] == [call("c9", "run", "{\"cmd\": \"ls")]
    assert not res.losses  # the raw arguments are carried over, with the error on the turn


def test_dangling_tool_result_is_a_loss(tmp_path, bundle):
    inp = [text("user", "go"), {"role": "tool", "parts": [{"type": "tool_call_response", "id": "nope", "response": "42"}]}]
    p = write(tmp_path, request(span("00000000000000e1", "chat m", chat_attrs(inp, [text("assistant", "ok")]))))
    res = import_file(p, "auto", bundle=bundle)
    assert res.traces and not res.complete
    assert any("'nope' answers no tool call" in x.reason for x in res.losses)


def test_a_chat_span_without_content_is_reported(tmp_path, bundle):
    p = write(tmp_path, request(span("00000000000000f1", "chat m", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})))
    res = import_file(p, "auto", bundle=bundle)
    assert not res.traces
    (prob,) = res.problems
    assert prob.line == 1 and "no messages" in prob.reason


def test_truncated_json_line_is_a_problem_with_its_line(tmp_path, bundle):
    good = request(span("0000000000000011", "chat m", chat_attrs([text("user", "hi")], [text("assistant", "yo")])))
    line = json.dumps(request(span("0000000000000012", "chat m", chat_attrs([text("user", "x")], [text("assistant", "y")]), tid="2" * 32)))
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(good) + "\n" + line[: len(line) // 2] + "\n", encoding="utf-8")
    res = import_file(str(p), "auto", bundle=bundle)
    assert len(res.traces) == 1 and res.traces[0].messages[-1]["content"] == "yo"
    assert [x.line for x in res.problems] == [2]


def test_openllmetry_flat_attributes_with_content_parts_and_unknown_keys(tmp_path, bundle):
    attrs = {
        "llm.request.type": "chat", "gen_ai.request.model": "m",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": json.dumps([{"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "https://x"}}]),
        "gen_ai.prompt.0.mood": "curious",
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "t1", "gen_ai.completion.0.tool_calls.0.name": "zoom",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"factor": [2, {"axis": "x"}]}',
        "llm.request.functions.0.name": "zoom", "llm.request.functions.0.parameters": '{"type": "object", "properties": {}}',
        "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 6,
    }
    p = write(tmp_path, request(span("0000000000000021", "openai.chat", attrs)))
    res = import_file(p, "auto", bundle=bundle)
    (t,) = res.traces
    assert t.messages == [{"role": "user", "content": "Look: "},
                          {"role": "assistant", "content": "", "tool_calls": [call("t1", "zoom", {"factor": [2, {"axis": "x"}]})]}]
    assert [x["function"]["name"] for x in t.tools] == ["zoom"]
    assert t.metadata["usage"] == {"input_tokens": 5, "output_tokens": 6} and t.metadata["finish_reason"] == "tool_calls"
    losses = [x.reason for x in res.losses]
    assert any("gen_ai.prompt.0.content: content part 1 (image_url) not carried over" in x for x in losses)
    assert any("gen_ai.prompt.0.mood: not carried over" in x for x in losses)
    assert len(losses) == 2


def test_tool_results_from_tool_spans_when_the_chat_spans_lack_them(tmp_path, bundle):
    """The run ended on a tool round: the results are only on the execute_tool spans."""
    out = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "k1", "name": "f", "arguments": {"a": 1}}]}]
    p = write(tmp_path, request(
        span("0000000000000031", "invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.tool.definitions": json.dumps(
            [{"type": "function", "name": "f", "parameters": {"type": "object"}}])}, start=1, end=9),
        span("0000000000000032", "chat m", chat_attrs([text("user", "go")], out), parent="0000000000000031", start=2, end=3),
        span("0000000000000033", "execute_tool f", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "f",
                                                    "gen_ai.tool.call.id": "k1", "gen_ai.tool.call.result": "done"},
             parent="0000000000000031", start=4, end=6)))
    res = import_file(p, "auto", bundle=bundle)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert t.messages[-1] == tool("k1", "f", "done")
    assert t.metadata["tool_durations_s"] == [2.0]
    assert t.metadata["duration_s"] == 8.0
    assert [x["function"]["name"] for x in t.tools] == ["f"]
    assert t.metadata["provenance"]["span_ids"] == ["0000000000000032", "0000000000000033"]


def test_events_without_spans_link_tool_results_by_order(tmp_path, bundle):
    def ev(name, body, sid="0000000000000041"):
        return {"traceId": TID, "spanId": sid, "eventName": name, "body": _value(body), "attributes": []}
    p = write(tmp_path, logs_request(
        ev("gen_ai.user.message", {"content": "two things"}),
        ev("gen_ai.assistant.message", {"content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{\"x\": \"é\"}"}}]}),
        ev("gen_ai.tool.message", {"content": "ra"}),
        ev("gen_ai.tool.message", {"content": "rb"}),
        ev("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"content": "both done"}}),
        ev("gen_ai.choice", {"index": 1, "finish_reason": "stop", "message": {"content": "other"}})))
    res = import_file(p, "auto", bundle=bundle)
    (t,) = res.traces
    assert t.messages == [{"role": "user", "content": "two things"},
                          {"role": "assistant", "content": "", "tool_calls": [call("a", "f", {}), call("b", "g", {"x": "é"})]},
                          tool("a", "f", "ra"), tool("b", "g", "rb"), {"role": "assistant", "content": "both done"}]
    assert [x.reason for x in res.losses] and "another choice not carried over" in res.losses[0].reason
    assert t.metadata["provenance"]["span_ids"] == ["0000000000000041"]


def test_nested_chat_spans_are_read_once(tmp_path, bundle):
    """A framework's chat span around the client instrumentation's chat span: one call."""
    a = chat_attrs([text("user", "q")], [text("assistant", "a")])
    p = write(tmp_path, request(span("0000000000000051", "chat outer", a, start=1, end=5),
                                span("0000000000000052", "chat inner", a, parent="0000000000000051", start=2, end=4)))
    res = import_file(p, "auto", bundle=bundle)
    assert res.complete and len(res.traces) == 1
    assert res.traces[0].metadata["provenance"]["span_ids"] == ["0000000000000051"]


def test_detection(bundle):
    rec = json.loads(open(os.path.join(OD, "openai_v2_spans.otlp.jsonl"), encoding="utf-8").readline())
    assert detect_why(rec)[0] == "otel" and not detect_why(rec)[2]
    for name in FILES_SCOPE:
        assert detect(os.path.join(OD, name)) == "otel"
    # the other formats' files keep theirs
    for p in sorted(glob.glob(os.path.join(DATA, "*.json*"))) + sorted(glob.glob(os.path.join(DATA, "*", "*.json*"))):
        if os.sep + "otel" + os.sep in p or os.path.basename(os.path.dirname(p)) in ("openinference", "langfuse"):
            continue
        assert detect(p) != "otel", p
    # a trace whose spans only one dialect reads goes to it: openinference and langfuse spans are not ours
    from backend.importers.otel import dialects

    names = [d.name for d in dialects()]
    assert names[-1] == "otel-genai" and "openinference" in names
    oi = next(d for d in dialects() if d.name == "otel-genai")
    from backend.importers.otlp import read_record

    spans, _ = read_record(rec, 1)
    assert any(oi.claims(s) for s in spans)


def test_a_call_sent_the_same_input_again_is_its_own_conversation(tmp_path, bundle):
    """A retry (or a second sample) of the same prompt: both answers are kept, none dropped."""
    p = write(tmp_path, request(
        span("0000000000000061", "chat m", chat_attrs([text("user", "q")], [text("assistant", "first")]), start=1, end=2),
        span("0000000000000062", "chat m", chat_attrs([text("user", "q")], [text("assistant", "second")]), start=3, end=4)))
    res = import_file(p, "auto", bundle=bundle)
    assert res.complete
    assert [t.messages[-1]["content"] for t in res.traces] == ["first", "second"]
    assert [t.metadata["provenance"]["span_ids"] for t in res.traces] == [["0000000000000061"], ["0000000000000062"]]
    assert len({t.id for t in res.traces}) == 2
