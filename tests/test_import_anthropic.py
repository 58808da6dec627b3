"""Anthropic Messages importer: files written by the real ``anthropic`` SDK against a loopback
server (tests/fixtures_gen/gen_anthropic.py), detection against openai-chat, and bad input.

The expected values re-state the generator's scenario (user text, scripted replies, tool results)."""

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
AD = os.path.join(DATA, "anthropic")

NOTE_ARGS = {
    "path": "notes/a \"quoted\" \\ path\n",
    "text": "Zürich vs 東京",
    "tags": [{"name": "weather", "score": 1}, {"name": "travel", "score": 0.5, "extra": {"nested": [1, 2]}}],
}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def tool(id_, name, content, **kw):
    return {"role": "tool", "tool_call_id": id_, "content": content, "name": name, **kw}


SYS, USER, ASST = "system", "user", "assistant"

WEATHER = [
    {"role": SYS, "content": "You are a concise weather assistant."},
    {"role": USER, "content": "What's the weather in Paris?"},
    {"role": ASST, "content": "Let me check.", "reasoning_content": "The user wants Paris weather; call get_weather.",
     "tool_calls": [call("toolu_01", "get_weather", {"city": "Paris", "unit": "c"})]},
    tool("toolu_01", "get_weather", "18°C, light rain"),
    {"role": ASST, "content": "It is 18°C with light rain in Paris."},
]
PARALLEL = [
    {"role": SYS, "content": "You are a travel helper.\nAlways save a note of comparisons."},
    {"role": USER, "content": "Compare the weather in Zürich and 東京 and save a note."},
    {"role": ASST, "content": "Checking both cities.", "tool_calls": [
        call("toolu_11", "get_weather", {"city": "Zürich"}), call("toolu_12", "get_weather", {"city": "東京"}),
        call("toolu_13", "save_note", NOTE_ARGS)]},
    tool("toolu_11", "get_weather", "Zürich: 12°C\nwind 5 km/h"),  # a list of text blocks
    tool("toolu_12", "get_weather", "東京: 22°C"),
    tool("toolu_13", "save_note", "permission denied: notes/", is_error=True),
    {"role": USER, "content": "Please also mention humidity if you know it."},  # text after the results, same turn
    {"role": ASST, "content": "Zürich is 12°C (wind 5 km/h), 東京 is 22°C. I could not save the note."},
]
TWO_ROUNDS = [
    {"role": SYS, "content": "You answer from the docs."},
    {"role": USER, "content": "How do I rotate the API key?"},
    {"role": ASST, "content": "", "tool_calls": [call("toolu_21", "search_docs", {"query": "rotate API key"})]},
    tool("toolu_21", "search_docs", '[{"id": "doc-7", "title": "Key rotation"}]'),
    {"role": ASST, "content": "", "reasoning_content": "doc-7 looks right; read it.",
     "tool_calls": [call("toolu_22", "read_doc", {"doc_id": "doc-7"})]},
    tool("toolu_22", "read_doc", "Go to Settings → Keys and click Rotate."),
    {"role": ASST, "content": "Open Settings → Keys and click Rotate."},
]
PLAIN = [{"role": USER, "content": "Say hello in French."}, {"role": ASST, "content": "Bonjour !"}]
TRUNCATED = [{"role": USER, "content": "Write a long poem about the sea."}, {"role": ASST, "content": "The sea, the sea, it rolls and"}]
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                  "required": ["city"]}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records), encoding="utf-8")
    return str(p)


def _generating(t):
    return [s for s in t.steps if s.state == "generating"]


# ---- the SDK's files ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "anthropic"])
def test_messages_file_is_anthropic_with_system_tools_and_results(fmt, qwen3):
    path = os.path.join(AD, "messages.jsonl")
    assert detect(path) == "anthropic"  # it used to be read as openai-chat, tool turns as empty strings
    res = import_file(path, fmt, tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"anthropic": 5}
    assert [t.messages for t in res.traces] == [WEATHER, PARALLEL, TWO_ROUNDS, PLAIN, TRUNCATED]
    w = res.traces[0]
    assert w.tools == [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                                                         "parameters": WEATHER_SCHEMA}}]
    assert [t["function"]["name"] for t in res.traces[1].tools] == ["get_weather", "save_note"]
    assert w.metadata["provenance"] == {"format": "Anthropic Messages"}
    for t in res.traces:
        assert t.metadata["ids"] == "rendered"
    text = qwen3.tokenizer.decode(res.traces[1].input_ids)
    assert "東京" in text and "permission denied: notes/" in text and "You are a travel helper." in text
    # each tool result is linked to its call by id, and the step says so
    p = res.traces[1]
    results = [r for s in p.steps for r in s.tool_results]
    assert [(r.call_id, r.name) for r in results] == [("toolu_11", "get_weather"), ("toolu_12", "get_weather"), ("toolu_13", "save_note")]


def test_request_response_log(qwen3):
    path = os.path.join(AD, "messages_log.jsonl")
    assert detect(path) == "anthropic"
    res = import_file(path, tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"anthropic": 9}
    assert not res.notes  # openai-chat does not claim Anthropic logs (no "could also read it")
    by = {t.id: t for t in res.traces}
    assert sorted(by) == [f"msg_{i:04d}" for i in range(1, 10)]
    # the last line of each conversation holds it whole: the request + the response as the last turn
    assert by["msg_0002"].messages == WEATHER
    assert by["msg_0004"].messages == PARALLEL
    assert by["msg_0007"].messages == TWO_ROUNDS
    assert by["msg_0008"].messages == PLAIN
    assert by["msg_0001"].messages == WEATHER[:3]  # the first call: the response is the tool_use turn
    assert by["msg_0001"].metadata["finish_reason"] == "tool_use"
    assert by["msg_0001"].metadata["model"] == "claude-sonnet-5"
    assert by["msg_0001"].metadata["provenance"] == {"format": "Anthropic Messages", "response_id": "msg_0001"}
    assert by["msg_0001"].metadata["request"]["max_tokens"] == 1024
    assert by["msg_0001"].metadata["usage"]["input_tokens"] > 0
    assert by["msg_0001"].metadata["import"] == {"file": "messages_log.jsonl", "line": 1}
    cut = by["msg_0009"]
    assert cut.messages == TRUNCATED
    assert cut.termination_reason == "response_length"
    assert cut.metadata["finish_reason"] == "max_tokens" and _generating(cut)[-1].finish_reason == "max_tokens"
    assert by["msg_0008"].termination_reason is None


def test_redacted_thinking_is_a_loss_with_its_place(qwen3):
    res = import_file(os.path.join(AD, "redacted_thinking.jsonl"), tokenizer="qwen3")
    assert not res.problems and res.formats == {"anthropic": 2} and not res.complete
    expected = [{"role": SYS, "content": "Think before answering."}, {"role": USER, "content": "Is 1021 prime?"},
                {"role": ASST, "content": "Yes, 1021 is prime."}]
    assert [t.messages for t in res.traces] == [expected, expected]
    assert [(x.line, x.reason.split(": ", 1)[1]) for x in res.losses] == [
        (1, "response.content[0]: redacted_thinking block not carried over: its reasoning is encrypted, the text is not in the file"),
        (2, "messages[1].content[0]: redacted_thinking block not carried over: its reasoning is encrypted, the text is not in the file"),
    ]


# ---- detection ----------------------------------------------------------------------------------


def test_openai_chat_files_and_rows_stay_openai_chat(qwen3):
    path = os.path.join(DATA, "openai_chat.jsonl")
    assert detect(path) == "openai-chat"
    res = import_file(path, tokenizer="qwen3")
    assert res.formats == {"openai-chat": 5} and [p.line for p in res.problems] == [3, 4]  # as before
    for rec in (
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "c", "content": "x"}]},
        {"request": {"messages": []}},
        {"request": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
         "response": {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "hello"}}]}},
        # a claude model behind an OpenAI-compatible proxy still logs chat completions
        {"request": {"model": "claude-sonnet-5", "messages": [{"role": "user", "content": "hi"}]},
         "response": {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "hello"}}]}},
    ):
        assert detect(rec) == "openai-chat", rec


def test_anthropic_records_detected_with_their_reason():
    cases = {
        "content blocks of type tool_use": {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
        "content blocks of type tool_result": {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]},
        "content blocks of type thinking": {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]}]},
        "content blocks of type image": {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]},
        "tools with input_schema": {"tools": [{"name": "f", "input_schema": {"type": "object"}}], "messages": [{"role": "user", "content": "hi"}]},
        "a top-level system beside messages": {"system": "s", "messages": [{"role": "user", "content": "hi"}]},
        "assistant content as a list of text blocks": {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]},
        "a Messages API response (type message, stop_reason)": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "stop_reason": "end_turn"},
        "a response of type message": {"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": {"type": "message", "role": "assistant", "content": []}},
    }
    for why, rec in cases.items():
        name, got, others = detect_why(rec)
        assert (name, got) == ("anthropic", why), rec
        if why.startswith(("content blocks of type t", "a Messages API response", "a response of type")):
            assert "openai-chat" not in others, (rec, others)  # openai-chat's sniff leaves these alone


def test_other_formats_are_not_claimed():
    # ShareGPT/Hermes rows (even with a top-level system), verl, Agents SDK items, our traces
    assert detect({"system": "s", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"}]}) == "sharegpt"
    assert detect({"system": "s", "conversations": [{"from": "human", "value": "hi"}]}) == "sharegpt"
    assert detect({"input": "a", "output": "b"}) == "verl"
    assert detect([{"type": "function_call_output", "call_id": "x", "output": ""}]) == "agents-sdk"
    assert detect({"format_version": 1, "system": "s", "messages": [{"role": "user", "content": "hi"}]}) == "trace"
    sniff = get_importer("anthropic").sniff
    for path in glob.glob(os.path.join(DATA, "**", "*.json*"), recursive=True):
        if os.sep + "anthropic" + os.sep in path:
            continue
        for _, rec in _records(path, None):
            if not isinstance(rec, LoadProblem):
                assert not sniff(rec), (path, rec)


def test_trace_sets_index_and_open_anthropic_files():
    from backend.trace.catalog import TraceSet

    ts = TraceSet.open_set(os.path.join(AD, "messages_log.jsonl"), final=True, cache=False)
    assert len(ts) == 9 and set(ts.df["source"]) == {"anthropic"} and not ts.problem_rows()
    assert list(ts.df["id"])[:2] == ["msg_0001", "msg_0002"]
    t = ts.open(1)
    assert t.messages == WEATHER and t.metadata["provenance"]["format"] == "Anthropic Messages"


# ---- what a conversation can hold ---------------------------------------------------------------


def test_image_and_unknown_blocks_are_losses_with_their_place(tmp_path, qwen3):
    rec = {"messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                                     {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}, {"type": "frobnicate", "x": 1}]},
        {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "d"}}]},
        {"role": "assistant", "content": "Ok."},
    ]}
    res = import_file(_write(tmp_path, "img.jsonl", [rec, {"messages": [{"role": "user", "content": "fine"}], "system": "s"}]), tokenizer="qwen3")
    assert res.formats == {"anthropic": 2} and not res.problems
    t = res.traces[0]
    assert t.messages == [{"role": USER, "content": "What is this?"}, {"role": ASST, "content": "A cat."},
                          {"role": USER, "content": ""}, {"role": ASST, "content": "Ok."}]
    assert [(x.line, x.reason.split(": ", 1)[1]) for x in res.losses] == [
        (1, "messages[0].content[0]: image block not carried over: it has no text"),
        (1, "messages[1].content[1]: frobnicate block not carried over (an assistant turn keeps text, thinking and tool_use)"),
        (1, "messages[2].content[0]: document block not carried over: it has no text"),
    ]
    assert not res.traces[1].metadata.get("import", {}).get("losses")


def test_dangling_tool_use_id_is_a_loss(tmp_path, qwen3):
    rec = {"system": "s", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "ok"},
                                     {"type": "tool_result", "tool_use_id": "toolu_missing", "content": "?"}]},
    ]}
    res = import_file(_write(tmp_path, "dangling.jsonl", [rec]), tokenizer="qwen3")
    assert res.formats == {"anthropic": 1} and not res.problems
    assert [m.get("tool_call_id") for m in res.traces[0].messages if m["role"] == "tool"] == ["toolu_a", "toolu_missing"]
    assert len(res.losses) == 1
    assert res.losses[0].line == 1 and "'toolu_missing' answers no tool call" in res.losses[0].reason


def test_bad_records_are_problems_with_their_place_and_the_rest_imports(tmp_path, qwen3):
    good = {"system": "s", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]}
    no_name = {"system": "s", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]}
    bad_role = {"system": "s", "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}
    bad_resp = {"request": {"system": "s", "messages": [{"role": "user", "content": "hi"}]}, "response": {"type": "message", "role": "assistant", "content": 5}}
    path = _write(tmp_path, "bad.jsonl", [good, no_name, '{"system": "s", "messages": [{"role": "us', good])
    res = import_file(path, tokenizer="qwen3")
    assert len(res.traces) == 2 and res.formats == {"anthropic": 2}
    assert [(p.line, p.reason) for p in res.problems[:1]] == [(2, "messages[1].content[0]: tool_use block has no name")]
    assert res.problems[1].line == 3 and "JSON" in res.problems[1].reason
    # records anthropic cannot read (auto mode would leave them to other formats): --from anthropic says why
    res2 = import_file(_write(tmp_path, "bad2.jsonl", [bad_role, bad_resp]), "anthropic", tokenizer="qwen3")
    assert [(p.line, p.reason) for p in res2.problems] == [
        (1, "messages[1] has role 'tool'; expected user or assistant"),
        (2, "response.content must be a string or a list of content blocks, got int"),
    ]


def test_tool_input_that_is_not_an_object_is_a_parse_error(qwen3):
    rec = {"system": "s", "messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{\"a\": "}]}]}
    res = import_records([rec], bundle=qwen3)
    (t,) = res.traces
    assert t.messages[-1]["tool_calls"][0]["function"]["arguments"] == "{\"a\": "
    (gen,) = _generating(t)
    assert gen.parse_errors and "messages[1].content[0] ('f')" in gen.parse_errors[0].message


def test_response_alone_prefill_error_and_citations(qwen3):
    resp = {"id": "msg_x", "type": "message", "role": "assistant", "model": "claude-sonnet-5",
            "content": [{"type": "text", "text": "Hi."}, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 2}}
    prefill = {"request": {"messages": [{"role": "user", "content": "Pick A or B."}, {"role": "assistant", "content": "The answer is ("}]},
               "response": {"id": "msg_y", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "B)"}], "stop_reason": "end_turn"}}
    err = {"request": {"system": "s", "messages": [{"role": "user", "content": "hi"}]},
           "response": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}}
    cited = {"system": "s", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "text", "text": "It is 5", "citations": [{"type": "char_location", "cited_text": "5", "document_index": 0}]}]}]}
    res = import_records([resp, prefill, err, cited], bundle=qwen3)
    assert res.formats == {"anthropic": 4} and not res.problems
    a, b, c, d = res.traces
    assert a.id == "msg_x" and a.messages == [{"role": ASST, "content": "Hi."}] and a.metadata["model"] == "claude-sonnet-5"
    # the response continues the prefilled assistant turn: one message
    assert b.messages == [{"role": USER, "content": "Pick A or B."}, {"role": ASST, "content": "The answer is (B)"}]
    assert b.metadata["prefill"] == "The answer is ("
    assert c.termination_reason == "generation_error" and c.metadata["error"]["type"] == "overloaded_error"
    assert d.messages[-1]["content"] == "It is 5"
    assert [x.reason.split(": ", 1)[1] for x in res.losses] == [
        "content[1]: server_tool_use block (web_search) not carried over: a tool run by the API, not by the caller",
        "messages[1].content[0]: 1 citation(s) of the text block not carried over",
    ]


def test_a_bare_list_of_messages_is_one_conversation(tmp_path, qwen3):
    doc = [{"role": "user", "content": "hi"},
           {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]}]
    p = tmp_path / "conv.json"
    p.write_text(json.dumps(doc))
    res = import_file(str(p), tokenizer="qwen3")
    assert res.formats == {"anthropic": 1} and res.complete
    assert res.traces[0].messages[-1] == tool("t1", "f", "1")


def test_openai_chat_reports_what_it_drops_from_anthropic_data(qwen3):
    # --from openai-chat on an Anthropic file: no longer silent (system prompt, tool blocks)
    res = import_file(os.path.join(AD, "messages.jsonl"), "openai-chat", tokenizer="qwen3")
    assert res.formats == {"openai-chat": 5} and not res.complete
    reasons = [x.reason.split(": ", 1)[1] for x in res.losses if x.line == 1]
    assert reasons[0].startswith("system: the top-level system prompt is not carried over")
    assert "messages[1]: content part 2 (tool_use) not carried over: it has no text" in reasons
    assert "messages[2]: content part 0 (tool_result) not carried over: it has no text" in reasons
    refusal = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "refusal": "I can't help with that."}]}
    r2 = import_records([refusal], "openai-chat", bundle=qwen3)
    assert [x.reason.split(": ", 1)[1] for x in r2.losses] == ["messages[1]: refusal not carried over: \"I can't help with that.\""]


def test_a_tool_result_with_is_error_is_a_failed_tool_result_on_its_step(qwen3):
    """``is_error: true`` (the save_note call of the parallel scenario) makes the step's result a
    failure, which the Inspector and the ``tool_error`` diagnostic show."""
    from backend.checks.diagnostics import check

    res = import_file(os.path.join(AD, "messages.jsonl"), "anthropic", bundle=qwen3)
    t = next(t for t in res.traces if any(m.get("tool_call_id") == "toolu_13" for m in t.messages))
    results = {r.call_id: r for s in t.steps for r in s.tool_results}
    assert results["toolu_13"].ok is False and results["toolu_11"].ok and results["toolu_12"].ok
    assert [f for f in check(t) if f.code == "tool_error"]
