"""OpenInference and Langfuse spans (two dialects of the ``otel`` importer): files written by the
real instrumentations against a loopback chat-completions server (tests/fixtures_gen/
gen_openinference.py: openinference-instrumentation-openai and -smolagents; gen_langfuse.py: the
Langfuse SDK's ``@observe`` + ``langfuse.openai``), as OTLP JSON lines (collector file exporter
shape) and as SDK span JSON lines; detection; bad input.

The expected values re-state the generators' scenarios (user texts, scripted replies, tool
results)."""

from __future__ import annotations

import copy
import json
import os

import pytest

from backend.importers import detect, detect_why, import_file
from backend.importers.otel import conversations_of_trace, dialects
from backend.importers.otlp import read_record
from backend.loading.tokenizers import load_tokenizer
from backend.trace.model import StepState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
OI = os.path.join(DATA, "openinference")
LF = os.path.join(DATA, "langfuse")

SYS, USER, ASST = "system", "user", "assistant"


def call(id_, name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}, "id": id_}


def tool(id_, name, content):
    return {"role": "tool", "tool_call_id": id_, "content": content, "name": name}


TRIP_ARGS = {
    "stops": [{"city": "Zürich", "days": 2, "tags": ["lake", "old town"]}, {"city": "東京", "days": 3, "hotel": {"name": "Hotel \"Sakura\"", "stars": 4}}],
    "note": "a \"quoted\" \\ path\n",
}
# the three conversations of gen_openinference.py's openai_tools and gen_langfuse.py's agent file
WEATHER = [
    {"role": SYS, "content": "You are a concise weather assistant."},
    {"role": USER, "content": "What's the weather in Paris?"},
    {"role": ASST, "content": "", "tool_calls": [call("call_w1", "get_weather", {"city": "Paris"})]},
    tool("call_w1", "get_weather", "18°C, light rain"),
    {"role": ASST, "content": "It is 18°C with light rain in Paris."},
]
TRIP = [
    {"role": SYS, "content": "You are a travel helper. Check the weather before planning."},
    {"role": USER, "content": "Compare the weather in Zürich and 東京, then plan a trip."},
    {"role": ASST, "content": "Checking both cities.", "tool_calls": [
        call("call_p1", "get_weather", {"city": "Zürich"}), call("call_p2", "get_weather", {"city": "東京", "unit": "celsius"})]},
    tool("call_p1", "get_weather", "Zürich: 12°C, wind 5 km/h"),
    tool("call_p2", "get_weather", "東京: 22°C, humid"),
    {"role": ASST, "content": "", "tool_calls": [call("call_p3", "plan_trip", TRIP_ARGS)]},
    tool("call_p3", "plan_trip", json.dumps({"ok": True, "itinerary_id": "trip-42", "days": 5})),
    {"role": ASST, "content": "Zürich is 12°C and 東京 is 22°C; your 5-day trip is planned."},
]
PLAIN = [{"role": USER, "content": "Say hello in French."}, {"role": ASST, "content": "Bonjour !"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TRIP_TOOL = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip through several cities.",
    "parameters": {"type": "object", "properties": {"stops": {"type": "array", "items": {"type": "object"}}, "note": {"type": "string"}},
                   "required": ["stops"]}}}


def norm(messages):
    """Messages with keys in a fixed order, for comparison."""
    return [json.loads(json.dumps(m, sort_keys=True)) for m in messages]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(p)


def _spans(doc):
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            yield from ss["spans"]


def _attr(span, key):
    for kv in span["attributes"]:
        if kv["key"] == key:
            return kv
    return None


def _set(span, key, value):
    kv = _attr(span, key)
    if kv is None:
        kv = {"key": key}
        span["attributes"].append(kv)
    kv["value"] = {"stringValue": value}


def _generating(t):
    return [s for s in t.steps if s.state == StepState.GENERATING]


# ---- OpenInference: openai instrumentation ------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "otel"])
@pytest.mark.parametrize("name", ["openai_tools.otlp.jsonl", "openai_tools.spans.jsonl"])
def test_openinference_openai_conversations(name, fmt, qwen3):
    path = os.path.join(OI, name)
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"otel": 3}
    assert [norm(t.messages) for t in res.traces] == [norm(WEATHER), norm(TRIP), norm(PLAIN)]
    weather, trip, plain = res.traces
    assert weather.tools == [WEATHER_TOOL] and trip.tools == [WEATHER_TOOL, TRIP_TOOL] and plain.tools == []
    for t, n_llm, n_tools in ((weather, 2, 1), (trip, 3, 3), (plain, 1, 0)):
        prov = t.metadata["provenance"]
        assert prov["format"] == "OpenInference"
        assert prov["trace_id"] == t.id and len(t.id) == 32
        assert len(prov["span_ids"]) == n_llm and all(len(s) == 16 for s in prov["span_ids"])
        assert t.metadata["llm_calls"] == n_llm
        assert t.metadata["model"] == "gpt-4o-mini-2024-07-18"
        assert t.metadata["duration_s"] > 0
        assert len(t.metadata.get("tool_durations_s", [])) == n_tools
        assert all(d > 0 for d in t.metadata.get("tool_durations_s", []))
        u = t.metadata["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] == u["total_tokens"]
        assert t.metadata["finish_reason"] == "stop"
        if name.endswith(".otlp.jsonl"):  # the instrumentation scope; the SDK's span JSON has none
            assert (prov["library"], prov["version"]) == ("openinference.instrumentation.openai", "0.1.66")
        else:
            assert "library" not in prov
    # usage summed over the conversation's LLM calls (the loopback server's counts)
    assert weather.metadata["usage"] == {"prompt_tokens": 34 + 48, "completion_tokens": 14 + 13, "total_tokens": 48 + 61}


def test_openinference_image_is_a_loss(qwen3):
    for name in ("openai_image.otlp.jsonl", "openai_image.spans.jsonl"):
        res = import_file(os.path.join(OI, name), bundle=qwen3)
        assert not res.complete and not res.problems
        (t,) = res.traces
        assert t.messages == [{"role": USER, "content": "What is in this picture?"}, {"role": ASST, "content": "A single white pixel."}]
        (loss,) = res.losses
        assert loss.line == 1
        assert "llm.input_messages.0.message.contents.1: image content not carried over" in loss.reason


# ---- OpenInference: smolagents instrumentation ---------------------------------------------------


@pytest.mark.parametrize("name", ["smolagents.otlp.jsonl", "smolagents.spans.jsonl"])
def test_smolagents_through_openinference_gives_the_agents_conversation(name, qwen3):
    res = import_file(os.path.join(OI, name), bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"otel": 2}
    one, two = res.traces
    for t, task in ((one, "What's the weather in Paris?"), (two, "Compare the weather in Zürich and 東京.")):
        assert t.messages[0]["role"] == SYS and t.messages[0]["content"].startswith("You are an expert assistant who can solve any task using tool calls.")
        assert t.messages[1] == {"role": USER, "content": f"New task:\n{task}"}
        assert [x["function"]["name"] for x in t.tools] == ["get_weather", "final_answer"]
        assert t.tools[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
        assert t.metadata["provenance"]["format"] == "OpenInference"
        if name.endswith(".otlp.jsonl"):
            assert (t.metadata["provenance"]["library"], t.metadata["provenance"]["version"]) == ("openinference.instrumentation.smolagents", "0.1.43")
        assert t.metadata["llm_calls"] == 2
    # smolagents' tool-call / tool-response memory messages are read back as the model's calls and
    # one tool message per call; final_answer stays the call the model made, with its result
    assert norm(one.messages[2:]) == norm([
        {"role": ASST, "content": "", "tool_calls": [call("call_s1", "get_weather", {"city": "Paris"})]},
        tool("call_s1", "get_weather", "18°C, light rain"),
        {"role": ASST, "content": "", "tool_calls": [call("call_s2", "final_answer", {"answer": "It is 18°C with light rain in Paris."})]},
        tool("call_s2", "final_answer", "It is 18°C with light rain in Paris."),
    ])
    assert norm(two.messages[2:]) == norm([
        {"role": ASST, "content": "", "tool_calls": [call("call_s3", "get_weather", {"city": "Zürich"}), call("call_s4", "get_weather", {"city": "東京"})]},
        tool("call_s3", "get_weather", "Zürich: 12°C, wind 5 km/h"),
        tool("call_s4", "get_weather", "東京: 22°C, humid"),
        {"role": ASST, "content": "", "tool_calls": [call("call_s5", "final_answer", {"answer": "Zürich: 12°C, 東京: 22°C."})]},
        tool("call_s5", "final_answer", "Zürich: 12°C, 東京: 22°C."),
    ])
    assert len(one.metadata["tool_durations_s"]) == 2 and len(two.metadata["tool_durations_s"]) == 3
    assert len(two.metadata["provenance"]["span_ids"]) == 2 + 3  # the LLM spans and the TOOL spans whose results were read


@pytest.mark.parametrize("name", ["smolagents_two_rounds.otlp.jsonl", "smolagents_two_rounds.spans.jsonl"])
def test_smolagents_run_with_text_and_two_tool_rounds_is_one_conversation(name, qwen3):
    """gen_openinference.py's SMOL_TWO_ROUNDS: the model writes a line of text with each call;
    smolagents' memory holds that turn as an assistant text message then a ``tool-call``
    message. One run is one conversation, each turn once, as the model produced it."""
    res = import_file(os.path.join(OI, name), bundle=qwen3)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert t.messages[1] == {"role": USER, "content": "New task:\nIs it warmer in Zürich or in 東京?"}
    assert norm(t.messages[2:]) == norm([
        {"role": ASST, "content": "Zürich first.", "tool_calls": [call("call_t1", "get_weather", {"city": "Zürich"})]},
        tool("call_t1", "get_weather", "Zürich: 12°C, wind 5 km/h"),
        {"role": ASST, "content": "Now 東京.", "tool_calls": [call("call_t2", "get_weather", {"city": "東京"})]},
        tool("call_t2", "get_weather", "東京: 22°C, humid"),
        {"role": ASST, "content": "", "tool_calls": [call("call_t3", "final_answer", {"answer": "東京 (22°C) is warmer than Zürich (12°C)."})]},
        tool("call_t3", "final_answer", "東京 (22°C) is warmer than Zürich (12°C)."),
    ])
    assert t.metadata["llm_calls"] == 3 and len(t.metadata["tool_durations_s"]) == 3
    assert not any(a["role"] == b["role"] == ASST for a, b in zip(t.messages, t.messages[1:]))


@pytest.mark.parametrize("name", ["smolagents_openai.otlp.jsonl", "smolagents_openai.spans.jsonl"])
def test_llm_span_inside_an_llm_span_is_the_same_call_read_once(name, qwen3):
    """smolagents + openai instrumentations on together: the openai client's LLM span sits in
    smolagents' model span (the wire request: smolagents' memory roles turned into assistant /
    user text); the agent's view (the outer span) is read, the inner one is not a second
    conversation and not a loss."""
    res = import_file(os.path.join(OI, name), bundle=qwen3)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert norm(t.messages[2:]) == norm([
        {"role": ASST, "content": "", "tool_calls": [call("call_s1", "get_weather", {"city": "Paris"})]},
        tool("call_s1", "get_weather", "18°C, light rain"),
        {"role": ASST, "content": "", "tool_calls": [call("call_s2", "final_answer", {"answer": "It is 18°C with light rain in Paris."})]},
        tool("call_s2", "final_answer", "It is 18°C with light rain in Paris."),
    ])
    assert t.metadata["llm_calls"] == 2
    if name.endswith(".otlp.jsonl"):
        assert t.metadata["provenance"]["library"] == "openinference.instrumentation.smolagents"


def test_smolagents_observation_without_a_tool_span_stays_what_the_model_saw(tmp_path, qwen3):
    docs = _lines(os.path.join(OI, "smolagents.otlp.jsonl"))[:1]
    for rs in docs[0]["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            ss["spans"] = [s for s in ss["spans"] if s["name"] != "SimpleTool"]  # the get_weather TOOL span is gone
    res = import_file(_write(tmp_path, "smol.jsonl", docs), bundle=qwen3)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert t.messages[2]["tool_calls"] == [call("call_s1", "get_weather", {"city": "Paris"})]
    assert t.messages[3] == {"role": USER, "content": "Observation:\n18°C, light rain"}  # as smolagents sends it to the model


# ---- Langfuse ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "otel"])
@pytest.mark.parametrize("name", ["agent.otlp.jsonl", "agent.spans.jsonl"])
def test_langfuse_agent_conversations(name, fmt, qwen3):
    res = import_file(os.path.join(LF, name), fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"otel": 3}
    assert [norm(t.messages) for t in res.traces] == [norm(WEATHER), norm(TRIP), norm(PLAIN)]
    weather, trip, plain = res.traces
    assert weather.tools == [WEATHER_TOOL] and trip.tools == [WEATHER_TOOL, TRIP_TOOL] and plain.tools == []
    for t, n_gen, n_tools, trace_name in ((weather, 2, 1, "weather-question"), (trip, 3, 3, "trip-planning"), (plain, 1, 0, "greeting")):
        prov = t.metadata["provenance"]
        assert prov["format"] == "Langfuse"
        assert prov["trace_id"] == t.id and len(t.id) == 32
        assert len(prov["span_ids"]) == n_gen
        if name.endswith(".otlp.jsonl"):
            assert (prov["library"], prov["version"]) == ("langfuse-sdk", "5.0.4")
        else:
            assert "library" not in prov
        m = t.metadata
        assert (m["trace_name"], m["session_id"], m["user_id"], m["environment"], m["release"]) == (trace_name, "session-1", "user-1", "fixtures", "1.0.0")
        assert m["model"] == "gpt-4o-mini-2024-07-18" and m["llm_calls"] == n_gen
        assert m["model_parameters"]["temperature"] == 0
        assert m["duration_s"] > 0 and len(m.get("tool_durations_s", [])) == n_tools
    assert weather.metadata["usage"] == {"prompt_tokens": 34 + 48, "completion_tokens": 14 + 13, "total_tokens": 48 + 61}


@pytest.mark.parametrize("name", ["wrapped_tools.otlp.jsonl", "wrapped_tools.spans.jsonl"])
def test_langfuse_generic_tool_wrapper_answers_the_calls_it_names(name, qwen3):
    """gen_langfuse.py ``wrapped_tools``: the tools run through one ``@observe(as_type="tool")``
    ``call_tool(name, arguments)``; each observation answers the call its input names, so none is
    reported as not carried over (the conversation holds every result)."""
    res = import_file(os.path.join(LF, name), bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert [norm(t.messages) for t in res.traces] == [norm(WEATHER), norm(TRIP)]
    assert [len(t.metadata["tool_durations_s"]) for t in res.traces] == [1, 3]


@pytest.mark.parametrize("name", ["wrapped_tools_positional.otlp.jsonl", "wrapped_tools_positional.spans.jsonl"])
def test_langfuse_generic_tool_wrapper_called_positionally(name, qwen3):
    """gen_langfuse.py ``wrapped_tools_positional`` (issue 42 item 12): the same wrapper called
    ``call_tool("get_weather", {"city": "Paris"})``, which the SDK records as
    ``{"args": ["get_weather", {...}], "kwargs": {}}``: each observation answers the call it
    names, as the keyword form does; nothing is reported as not carried over."""
    path = os.path.join(LF, name)
    with open(path, encoding="utf-8") as f:
        assert '\\"args\\": [\\"get_weather\\", {\\"city\\": \\"Paris\\"}], \\"kwargs\\": {}' in f.read()
    res = import_file(path, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert [norm(t.messages) for t in res.traces] == [norm(WEATHER), norm(TRIP)]
    assert [len(t.metadata["tool_durations_s"]) for t in res.traces] == [1, 3]


def test_langfuse_wrapper_observation_naming_no_call_is_a_loss(tmp_path, qwen3):
    """Only a result that truly answers no call is a loss: the wrapper's input names a tool the
    model never called."""
    with open(os.path.join(LF, "wrapped_tools.otlp.jsonl"), encoding="utf-8") as f:
        line = f.readline()
    old = '{\\"name\\": \\"get_weather\\", \\"arguments\\"'
    assert line.count(old) == 1
    path = tmp_path / "stray.otlp.jsonl"
    path.write_text(line.replace(old, old.replace("get_weather", "get_time")), encoding="utf-8")
    res = import_file(str(path), bundle=qwen3)
    (loss,) = res.losses
    assert "tool observation 'call_tool' answers no tool call" in loss.reason
    assert norm(res.traces[0].messages) == norm(WEATHER)


@pytest.mark.parametrize("name", ["manual.otlp.jsonl", "manual.spans.jsonl"])
def test_langfuse_manual_generations_two_conversations_in_one_trace(name, qwen3):
    res = import_file(os.path.join(LF, name), bundle=qwen3)
    assert res.complete, res.problem_lines()
    a, b = res.traces
    assert a.messages == [{"role": SYS, "content": "Summarize in one line."}, {"role": USER, "content": "Zürich had rain all week; 東京 was sunny."},
                          {"role": ASST, "content": "Rain in Zürich, sun in 東京."}]
    assert b.messages == [{"role": USER, "content": "Translate to German: good morning"}, {"role": ASST, "content": "Guten Morgen"}]
    assert a.metadata["provenance"]["trace_id"] == b.metadata["provenance"]["trace_id"]
    assert a.id != b.id and a.id.startswith(a.metadata["provenance"]["trace_id"])
    assert a.metadata["usage"] == {"prompt_tokens": 21, "completion_tokens": 9}
    assert b.metadata["usage"] == {"prompt_tokens": 8, "completion_tokens": 3}
    assert a.metadata["model"] == "local-llama" and a.metadata["trace_name"] == "summaries"


def test_langfuse_image_media_reference_is_a_loss(qwen3):
    for name in ("image.otlp.jsonl", "image.spans.jsonl"):
        res = import_file(os.path.join(LF, name), bundle=qwen3)
        assert not res.complete and not res.problems
        (t,) = res.traces
        assert t.messages == [{"role": USER, "content": "What is in this picture?"}, {"role": ASST, "content": "A single white pixel."}]
        (loss,) = res.losses
        assert "langfuse.observation.input[0]: content part 1 (image_url) not carried over" in loss.reason


# ---- detection -------------------------------------------------------------------------------------


def test_detection_picks_otel_and_provenance_names_the_dialect(qwen3):
    cases = {os.path.join(OI, f): "OpenInference" for f in os.listdir(OI)} | {os.path.join(LF, f): "Langfuse" for f in os.listdir(LF)}
    assert len(cases) == 20
    for path, label in cases.items():
        assert detect(path) == "otel", path
        first = _lines(path)[0]
        fmt, why, _ = detect_why(first)
        assert fmt == "otel" and why in ("OTLP resourceSpans", "an OpenTelemetry SDK span (to_json)")
        res = import_file(path, bundle=qwen3)
        assert {t.metadata["provenance"]["format"] for t in res.traces} == {label}, path


def test_each_dialect_claims_only_its_own_spans():
    by_name = {d.name: d for d in dialects()}
    assert list(by_name)[:2] == ["langfuse", "openinference"]
    for path, own, other in ((os.path.join(OI, "openai_tools.otlp.jsonl"), "openinference", "langfuse"),
                             (os.path.join(OI, "smolagents.otlp.jsonl"), "openinference", "langfuse"),
                             (os.path.join(LF, "agent.otlp.jsonl"), "langfuse", "openinference")):
        spans = [s for n, doc in enumerate(_lines(path), 1) for s in read_record(doc, n)[0]]
        assert any(by_name[own].claims(s) for s in spans)
        assert not any(by_name[other].claims(s) for s in spans)
        tid = spans[0].trace_id
        chosen, convs = conversations_of_trace(tid, [s for s in spans if s.trace_id == tid], [])
        assert chosen.name == own and convs


def test_other_formats_are_not_read_as_otel():
    for f in sorted(os.listdir(DATA)):
        p = os.path.join(DATA, f)
        if os.path.isfile(p) and f.endswith((".json", ".jsonl")):
            assert detect(p) != "otel", f


# ---- bad input ---------------------------------------------------------------------------------------


def test_truncated_line_is_a_problem_and_the_rest_imports(tmp_path, qwen3):
    with open(os.path.join(OI, "openai_tools.otlp.jsonl"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    p = tmp_path / "cut.jsonl"
    p.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2] + "\n" + lines[2] + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert [x.line for x in res.problems] == [2]
    assert [norm(t.messages) for t in res.traces] == [norm(WEATHER), norm(PLAIN)]


def test_openinference_bad_arguments_unknown_content_redacted_and_dangling_result(tmp_path, qwen3):
    docs = _lines(os.path.join(OI, "openai_tools.otlp.jsonl"))
    weather, trip, plain = copy.deepcopy(docs)
    llm = [s for s in _spans(weather) if s["name"] == "ChatCompletion"]
    # the first call's arguments cut (in its output and in the next call's input), the result's id changed
    _set(llm[0], "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments", '{"city": "Par')
    _set(llm[1], "llm.input_messages.2.message.tool_calls.0.tool_call.function.arguments", '{"city": "Par')
    _set(llm[1], "llm.input_messages.3.message.tool_call_id", "call_nobody")
    # an audio part, and a redacted user message, in the plain conversation
    (p,) = [s for s in _spans(plain) if s["name"] == "ChatCompletion"]
    _set(p, "llm.input_messages.0.message.content", "__REDACTED__")
    _set(p, "llm.input_messages.0.message.contents.0.message_content.type", "audio")
    _set(p, "llm.input_messages.0.message.contents.0.message_content.audio.audio.url", "https://example.com/a.wav")
    res = import_file(_write(tmp_path, "bad.jsonl", [weather, trip, plain]), bundle=qwen3)
    assert not res.problems
    t0, t1, t2 = res.traces
    assert t0.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'  # kept as written
    (gen,) = [g for g in _generating(t0) if g.parse_errors]
    assert "tool call 0 ('get_weather'): arguments are not valid JSON" in gen.parse_errors[0].message
    assert norm(t1.messages) == norm(TRIP)
    by_line = {}
    for x in res.losses:
        by_line.setdefault(x.line, []).append(x.reason.split(": ", 1)[1])
    assert set(by_line) == {1, 3}
    assert by_line[1] == ["messages[3]: tool result for call id 'call_nobody' answers no tool call in the file"]
    assert any("llm.input_messages.0.message.contents.0: audio content not carried over" in r for r in by_line[3])
    assert any("llm.input_messages.0.message.content: redacted by the instrumentation" in r for r in by_line[3])


def test_openinference_unknown_role_and_second_choice_are_losses(tmp_path, qwen3):
    doc = copy.deepcopy(_lines(os.path.join(OI, "openai_tools.otlp.jsonl"))[2])
    (p,) = [s for s in _spans(doc) if s["name"] == "ChatCompletion"]
    _set(p, "llm.input_messages.1.message.role", "critic")
    _set(p, "llm.input_messages.1.message.content", "Be brief.")
    _set(p, "llm.output_messages.1.message.role", "assistant")
    _set(p, "llm.output_messages.1.message.content", "Salut !")
    res = import_file(_write(tmp_path, "roles.jsonl", [doc]), bundle=qwen3)
    (t,) = res.traces
    assert t.messages == PLAIN
    reasons = [x.reason for x in res.losses]
    assert any("llm.input_messages.1: message of role 'critic' not carried over" in r for r in reasons)
    assert any("llm.output_messages.1: another output message (choice) not carried over" in r for r in reasons)


def test_langfuse_bad_output_masked_input_and_no_messages(tmp_path, qwen3):
    docs = _lines(os.path.join(LF, "agent.otlp.jsonl"))
    weather, trip, plain = copy.deepcopy(docs)
    gens = [s for s in _spans(plain) if s["name"] == "OpenAI-generation"]
    _set(gens[0], "langfuse.observation.output", json.dumps({"score": 3}))
    tgens = [s for s in _spans(trip) if s["name"] == "OpenAI-generation"]
    for g in tgens:  # no message anywhere in the input: the trace has no conversation
        _set(g, "langfuse.observation.input", json.dumps({"args": [1, 2], "kwargs": {}}))
    wgens = [s for s in _spans(weather) if s["name"] == "OpenAI-generation"]
    _set(wgens[-1], "langfuse.observation.output", "<fully masked due to failed mask function>")
    res = import_file(_write(tmp_path, "bad.jsonl", [weather, trip, plain]), bundle=qwen3)
    assert [x.line for x in res.problems] == [2]
    assert "Langfuse spans found" in res.problems[0].reason and "no messages" in res.problems[0].reason
    w, p = res.traces
    assert norm(w.messages) == norm(WEATHER[:4])  # the masked answer is not invented
    assert p.messages == PLAIN[:1]
    reasons = {x.line: x.reason for x in res.losses}
    assert "langfuse.observation.output: masked by the SDK's mask function" in reasons[1]
    assert "langfuse.observation.output: output (dict) is not an assistant message, not carried over" in reasons[3]


def test_openinference_hidden_input_messages(tmp_path, qwen3):
    """``TraceConfig(hide_input_messages=True)`` drops ``llm.input_messages``: the request in
    ``input.value`` is read instead; with that hidden too, the missing input is a loss."""
    doc = _lines(os.path.join(OI, "openai_tools.otlp.jsonl"))[0]
    hidden, redacted = copy.deepcopy(doc), copy.deepcopy(doc)
    for d in (hidden, redacted):
        for s in _spans(d):
            s["attributes"] = [kv for kv in s["attributes"] if not kv["key"].startswith("llm.input_messages.")]
    for s in _spans(redacted):
        if _attr(s, "openinference.span.kind")["value"]["stringValue"] == "LLM":
            _set(s, "input.value", "__REDACTED__")
    res = import_file(_write(tmp_path, "hidden.jsonl", [hidden]), bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert norm(res.traces[0].messages) == norm(WEATHER)
    res = import_file(_write(tmp_path, "redacted.jsonl", [redacted]), bundle=qwen3)
    # nothing says how the two replies follow each other: each is its own conversation, each
    # trace saying what is not in the file
    assert not res.problems
    assert [t.messages for t in res.traces] == [
        [{"role": ASST, "content": "", "tool_calls": [call("call_w1", "get_weather", {"city": "Paris"})]},
         {"role": "tool", "content": "18°C, light rain", "name": "get_weather", "tool_call_id": "call_w1"}],  # from the TOOL span
        [{"role": ASST, "content": "It is 18°C with light rain in Paris."}]]
    assert {x.line for x in res.losses} == {1} and len(res.losses) == 4  # both spans' inputs, on both traces
    assert all("input redacted by the instrumentation, not in the file" in x.reason for x in res.losses)


def test_tool_run_that_answers_no_call_is_a_loss(tmp_path, qwen3):
    lf = copy.deepcopy(_lines(os.path.join(LF, "agent.otlp.jsonl"))[0])
    (t_span,) = [s for s in _spans(lf) if s["name"] == "get_weather"]
    _set(t_span, "langfuse.observation.input", json.dumps({"args": [], "kwargs": {"city": "Lyon"}}))
    oi = copy.deepcopy(_lines(os.path.join(OI, "openai_tools.otlp.jsonl"))[0])
    (o_span,) = [s for s in _spans(oi) if s["name"] == "get_weather"]
    o_span["attributes"] = [kv for kv in o_span["attributes"] if kv["key"] != "tool.id"]
    _set(o_span, "input.value", json.dumps({"city": "Lyon"}))
    for doc, what in ((lf, "tool observation 'get_weather'"), (oi, "TOOL span 'get_weather'")):
        res = import_file(_write(tmp_path, "t.jsonl", [doc]), bundle=qwen3)
        (t,) = res.traces
        assert norm(t.messages) == norm(WEATHER)  # the result is in the next LLM call's input
        assert "tool_durations_s" not in t.metadata
        (loss,) = res.losses
        assert f"{what} answers no tool call of the trace's LLM calls, not carried over" in loss.reason
