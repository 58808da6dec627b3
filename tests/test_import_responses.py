"""OpenAI Responses importer: request/response logs written by the real ``openai`` SDK against a
loopback server (tests/fixtures_gen/gen_openai_responses.py), previous_response_id chains,
detection, and bad input.

The expected values re-state the generator's scenario (user text, scripted output, tool results)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from backend.importers import _records, detect, detect_why, get_importer, import_file, import_records
from backend.loading.tokenizers import load_tokenizer
from backend.trace import LoadProblem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
LOG = os.path.join(DATA, "openai_responses", "responses_log.jsonl")

NOTE_ARGS = {
    "path": "notes/a \"quoted\" \\ path\n",
    "text": "Zürich vs 東京",
    "tags": [{"name": "weather", "score": 1}, {"name": "travel", "score": 0.5, "extra": {"nested": [1, 2]}}],
}
SYS, USER, ASST = "system", "user", "assistant"


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def tool(id_, name, content):
    return {"role": "tool", "tool_call_id": id_, "content": content, "name": name}


WEATHER = [
    {"role": SYS, "content": "You are a concise weather assistant."},
    {"role": USER, "content": "What's the weather in Paris?"},
    {"role": ASST, "content": "", "tool_calls": [call("call_01", "get_weather", {"city": "Paris", "unit": "c"})],
     "reasoning_content": "The user wants Paris weather; call get_weather."},
    tool("call_01", "get_weather", "18°C, light rain"),
    {"role": ASST, "content": "It is 18°C with light rain in Paris."},
]
PARALLEL = [
    {"role": SYS, "content": "You are a travel helper."},
    {"role": USER, "content": "Compare the weather in Zürich and 東京 and save a note."},
    {"role": ASST, "content": "", "tool_calls": [call("call_11", "get_weather", {"city": "Zürich"}), call("call_12", "get_weather", {"city": "東京"}),
                                                 call("call_13", "save_note", NOTE_ARGS)]},
    tool("call_11", "get_weather", "Zürich: 12°C"),
    tool("call_12", "get_weather", "東京: 22°C"),
    tool("call_13", "save_note", "saved"),
    {"role": ASST, "content": "Zürich is 12°C, 東京 is 22°C; the note is saved."},
]
TWO_ROUNDS = [
    {"role": SYS, "content": "You answer from the docs."},
    {"role": USER, "content": "How do I rotate the API key?"},
    {"role": ASST, "content": "", "tool_calls": [call("call_21", "search_docs", {"query": "rotate API key"})]},
    tool("call_21", "search_docs", '[{"id": "doc-7", "title": "Key rotation"}]'),
    {"role": ASST, "content": "", "tool_calls": [call("call_22", "read_doc", {"doc_id": "doc-7"})], "reasoning_content": "doc-7 looks right; read it."},
    tool("call_22", "read_doc", "Go to Settings → Keys and click Rotate."),
    {"role": ASST, "content": "Open Settings → Keys and click Rotate."},
]
PLAIN = [{"role": USER, "content": "Say hello in French."}, {"role": ASST, "content": "Bonjour !"}]
TRUNCATED = [{"role": USER, "content": "Write a long poem about the sea."}, {"role": ASST, "content": "The sea, the sea, it rolls and"}]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records), encoding="utf-8")
    return str(p)


def _log(inp, output, *, instructions=None, status="completed", rid="resp_t1", **req):
    request = {"model": "gpt-5-mini", "input": inp, **req}
    if instructions is not None:
        request["instructions"] = instructions
    return {"request": request, "response": {"id": rid, "object": "response", "status": status, "model": "gpt-5-mini", "output": output}}


def _msg(text):
    return {"type": "message", "id": "msg_t", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}


# ---- the SDK's log ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "openai-responses"])
def test_responses_log(fmt, qwen3):
    assert detect(LOG) == "openai-responses"
    res = import_file(LOG, fmt, tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"openai-responses": 9}
    assert not res.notes  # openai-chat does not claim Responses logs
    by = {t.id: t for t in res.traces}
    assert sorted(by) == [f"resp_{i:04d}" for i in (1, 2, 3, 4, 5, 6, 7, 8, 11)]
    assert by["resp_0001"].messages == WEATHER[:3]  # the first call: the output is the tool-call turn
    assert by["resp_0002"].messages == WEATHER  # the replayed input + the answer
    assert by["resp_0003"].messages == PARALLEL[:3]
    assert by["resp_0004"].messages == PARALLEL
    assert by["resp_0004"].metadata["provenance"] == {"format": "OpenAI Responses", "response_id": "resp_0004"}
    assert by["resp_0007"].messages == TWO_ROUNDS
    assert by["resp_0008"].messages == PLAIN
    cut = by["resp_0011"]
    assert cut.messages == TRUNCATED and cut.termination_reason == "response_length"
    assert cut.metadata["finish_reason"] == "max_output_tokens" and cut.metadata["status"] == "incomplete"
    assert [s for s in cut.steps if s.state == "generating"][-1].finish_reason == "max_output_tokens"
    assert by["resp_0008"].termination_reason is None
    w = by["resp_0002"]
    assert w.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.", "strict": False,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}}]
    assert w.metadata["model"] == "gpt-5-mini" and w.metadata["usage"]["input_tokens"] > 0
    assert w.metadata["import"] == {"file": "responses_log.jsonl", "line": 2}
    results = [r for s in by["resp_0004"].steps for r in s.tool_results]
    assert [(r.call_id, r.name, r.content) for r in results] == [
        ("call_11", "get_weather", "Zürich: 12°C"), ("call_12", "get_weather", "東京: 22°C"), ("call_13", "save_note", "saved")]
    for t in res.traces:
        assert t.metadata["ids"] == "rendered"
    assert "東京" in qwen3.tokenizer.decode(by["resp_0004"].input_ids)


def test_stateful_log_reports_the_turns_the_api_kept(qwen3):
    # the second request sent previous_response_id and only the tool output: that record does not
    # hold the call it answers; each record is read on its own (as a trace set opens one line)
    res = import_file(os.path.join(DATA, "openai_responses", "responses_stateful.jsonl"), tokenizer="qwen3")
    assert res.formats == {"openai-responses": 2} and not res.problems
    first, second = res.traces
    assert first.messages == [{"role": SYS, "content": "You are a concise weather assistant."}, {"role": USER, "content": "Weather in Oslo?"},
                              {"role": ASST, "content": "", "tool_calls": [call("call_51", "get_weather", {"city": "Oslo"})]}]
    assert second.messages == [{"role": SYS, "content": "You are a concise weather assistant."},
                               {"role": "tool", "tool_call_id": "call_51", "content": "3°C, snow"},
                               {"role": ASST, "content": "It is 3°C with snow in Oslo."}]
    assert second.metadata["provenance"]["previous_response_id"] == first.id
    assert [(x.line, x.reason.split(": ", 1)[1]) for x in res.losses] == [
        (2, f"request.previous_response_id: the earlier turns (response {first.id!r} and before) are not in this record: the API kept them"),
        (2, "messages[1]: tool result for call id 'call_51' answers no tool call in the file"),
    ]


def test_trace_sets_index_and_open_responses_logs():
    from backend.trace.catalog import TraceSet

    ts = TraceSet.open_set(LOG, final=True, cache=False)
    assert len(ts) == 9 and set(ts.df["source"]) == {"openai-responses"} and not ts.problem_rows()
    t = ts.open(3)
    assert t.id == "resp_0004" and t.messages == PARALLEL


# ---- detection ----------------------------------------------------------------------------------


def test_detection_reasons_and_neighbours():
    resp = {"id": "r", "object": "response", "status": "completed", "output": [_msg("hi")]}
    assert detect_why(resp)[:2] == ("openai-responses", 'a response object (object "response", output items)')
    assert detect_why({"request": {"input": "hi"}, "response": resp}) == ("openai-responses", 'a response of object "response"', [])
    assert detect_why({"model": "gpt-5-mini", "input": "hi", "instructions": "s"})[:2] == ("openai-responses", "a request with model and input")
    batch_req = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {"model": "m", "input": "hi"}}
    batch_res = {"id": "b", "custom_id": "a", "response": {"status_code": 200, "body": resp}, "error": None}
    assert detect(batch_req) == "openai-responses" and detect(batch_res) == "openai-responses"
    # neighbours keep their formats
    assert detect({"request": {"messages": []}}) == "openai-chat"
    assert detect({"custom_id": "x", "body": {"messages": [{"role": "user", "content": "hi"}]}}) == "openai-chat"
    assert detect({"input": "a", "output": "b"}) == "verl"
    assert detect({"items": []}) == "agents-sdk"
    assert detect(os.path.join(DATA, "agents_sdk_items.json")) == "agents-sdk"
    assert detect(os.path.join(DATA, "openai_chat.jsonl")) == "openai-chat"
    # openai-chat's sniff no longer claims Responses records
    chat = get_importer("openai-chat")
    assert not chat.sniff({"request": {"model": "m", "input": "hi"}, "response": resp})
    assert not chat.sniff(batch_res)
    sniff = get_importer("openai-responses").sniff
    for path in glob.glob(os.path.join(DATA, "**", "*.json*"), recursive=True):
        if os.sep + "openai_responses" + os.sep in path:
            continue
        if os.sep + "nemo_gym" + os.sep in path:  # NeMo-Gym rollouts hold a Responses object: nemo-gym, earlier, wins
            assert detect(path) == "nemo-gym"
            continue
        for _, rec in _records(path, None):
            if not isinstance(rec, LoadProblem):
                assert not sniff(rec), (path, rec)


def test_batch_lines_and_a_bare_response(qwen3):
    resp = {"id": "resp_b", "object": "response", "status": "completed", "instructions": "Be brief.", "output": [_msg("Hi.")]}
    batch_req = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {"model": "m", "instructions": "Be brief.", "input": "Hello"}}
    batch_res = {"id": "b", "custom_id": "a", "response": {"status_code": 200, "body": {**resp, "id": "resp_c"}}, "error": None}
    res = import_records([resp, batch_req, batch_res], bundle=qwen3)
    assert res.formats == {"openai-responses": 3} and res.complete, res.problem_lines()
    a, b, c = res.traces
    assert a.messages == [{"role": SYS, "content": "Be brief."}, {"role": ASST, "content": "Hi."}]
    assert b.messages == [{"role": SYS, "content": "Be brief."}, {"role": USER, "content": "Hello"}]
    assert c.messages == a.messages and c.id == "resp_c"


# ---- bad input and losses -----------------------------------------------------------------------


def test_dangling_call_id_is_a_loss(tmp_path, qwen3):
    rec = _log([{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_missing", "output": "42"}], [_msg("ok")])
    res = import_file(_write(tmp_path, "dangling.jsonl", [rec]), tokenizer="qwen3")
    assert res.formats == {"openai-responses": 1} and not res.problems
    assert res.traces[0].messages[1] == {"role": "tool", "tool_call_id": "call_missing", "content": "42"}
    assert len(res.losses) == 1 and res.losses[0].line == 1
    assert "'call_missing' answers no tool call" in res.losses[0].reason


def test_conversation_kept_by_the_api_is_a_loss(tmp_path, qwen3):
    rec = _log([{"type": "function_call_output", "call_id": "call_9", "output": "42"}], [_msg("It is 42.")], conversation={"id": "conv_7"})
    res = import_file(_write(tmp_path, "conv.jsonl", [rec]), tokenizer="qwen3")
    reasons = [x.reason.split(": ", 1)[1] for x in res.losses]
    assert reasons[0] == "request.conversation: the earlier turns (conversation 'conv_7') are not in this record: the API kept them"
    assert "'call_9' answers no tool call" in reasons[1] and len(reasons) == 2
    assert res.traces[0].metadata["provenance"]["conversation_id"] == "conv_7"


def test_unknown_items_encrypted_reasoning_images_and_annotations_are_losses(tmp_path, qwen3):
    out = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB..."},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "See the docs.", "annotations": [{"type": "url_citation", "url": "https://x", "title": "x", "start_index": 0, "end_index": 3}]}]},
    ]
    inp = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                           {"type": "input_image", "image_url": "data:image/png;base64,iVBOR", "detail": "auto"}]}]
    rec = _log(inp, out, tools=[{"type": "web_search"}])
    res = import_file(_write(tmp_path, "lossy.jsonl", [rec, _log("fine", [_msg("yes")], rid="resp_t2")]), tokenizer="qwen3")
    assert res.formats == {"openai-responses": 2} and not res.problems
    t = res.traces[0]
    assert t.messages == [{"role": USER, "content": "What is this?"}, {"role": ASST, "content": "See the docs."}]
    assert t.tools == [] and t.metadata["hosted_tools"] == ["web_search"]
    assert sorted(x.reason.split(": ", 1)[1] for x in res.losses) == sorted([
        "request.input[0]: content part 1 (input_image) not carried over: it has no text",
        "response.output[0]: web_search_call item not carried over (no chat message holds it)",
        "response.output[1]: reasoning item not carried over: its reasoning is encrypted (encrypted_content), the text is not in the file",
        "response.output[2].content[0]: 1 annotation(s) (url_citation) of the text not carried over",
    ])
    assert {x.line for x in res.losses} == {1}


def test_bad_records_are_problems_with_their_place_and_the_rest_imports(tmp_path, qwen3):
    good = _log("hi", [_msg("hello")])
    no_name = _log([{"role": "user", "content": "hi"}], [{"type": "function_call", "call_id": "c1", "arguments": "{}"}], rid="resp_t3")
    bad_args = _log("hi", [{"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"a\": "}], rid="resp_t4")
    not_resp = {"request": {"model": "m", "input": "hi"}, "response": {"id": "x", "object": "response", "output": "nope"}}
    path = _write(tmp_path, "bad.jsonl", [good, no_name, '{"request": {"model": "m", "input": "h', bad_args, not_resp])
    res = import_file(path, tokenizer="qwen3")
    assert res.formats == {"openai-responses": 2}
    problems = res.problems
    assert [p.line for p in problems] == [2, 3, 5]
    assert problems[0].reason == "response.output[0]: function_call item is malformed (name: Field required)"
    assert "JSON" in problems[1].reason
    assert problems[2].reason == 'response is not a Responses API response (object "response" with an output list)'
    t = {t.id: t for t in res.traces}["resp_t4"]
    assert t.messages[-1]["tool_calls"][0]["function"]["arguments"] == "{\"a\": "
    (gen,) = [s for s in t.steps if s.state == "generating"]
    assert gen.parse_errors and "arguments are not valid JSON" in gen.parse_errors[0].message


def test_failed_and_content_filtered_responses(qwen3):
    failed = _log("hi", [], status="failed", rid="resp_f")
    failed["response"]["error"] = {"code": "server_error", "message": "boom"}
    filtered = _log("hi", [_msg("I")], status="incomplete", rid="resp_g")
    filtered["response"]["incomplete_details"] = {"reason": "content_filter"}
    res = import_records([failed, filtered], bundle=qwen3)
    a, b = res.traces
    assert a.termination_reason == "generation_error" and a.metadata["error"]["code"] == "server_error"
    assert a.messages == [{"role": USER, "content": "hi"}]
    assert b.termination_reason == "content_filter" and b.metadata["finish_reason"] == "content_filter"
