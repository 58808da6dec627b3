"""Agent-framework importers: pydantic-ai message histories, LangChain ``messages_to_dict`` lists
and smolagents memory, from files written by the real libraries (tests/fixtures_gen/gen_pydantic_ai.py,
gen_langchain.py, gen_smolagents.py); detection against the other formats; bad input.

The expected values re-state the generators' scenarios (user text, scripted replies, tool
results), never values produced by the importers."""

from __future__ import annotations

import glob
import json
import os

import pytest
from cli_inprocess import run_cli

from backend.importers import _records, detect, detect_why, get_importer, import_file, import_records
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
PA = os.path.join(DATA, "pydantic_ai")
LC = os.path.join(DATA, "langchain")
SM = os.path.join(DATA, "smolagents")
MINE = {"pydantic-ai": PA, "langchain": LC, "smolagents": SM}

# the scenarios' shared values (the three generators use the same ones)
ESCAPED_PATH = 'notes/a "quoted" \\ path\n.txt'
NESTED_TAGS = [{"name": "weather", "meta": {"cities": ["Zürich", "東京"], "ok": True}}]
NOTE_ARGS = {"path": ESCAPED_PATH, "text": "Zürich 12 °C, 東京 20 °C", "tags": NESTED_TAGS}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def roles(t):
    return [m["role"] for m in t.messages]


def calls(m):
    """(id, name, arguments) of an assistant message's calls."""
    return [(c.get("id"), c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]


def results(t):
    """tool_call_id → (name, content) of the tool messages."""
    return {m["tool_call_id"]: (m.get("name"), m["content"]) for m in t.messages if m["role"] == "tool"}


def parse_errors(t):
    return [e for s in t.steps for e in s.parse_errors]


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines) + "\n", encoding="utf-8")
    return str(p)


def load_lines(path):
    return [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]


# ---- pydantic-ai -------------------------------------------------------------------------------


def check_pa_one_call(t):
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[0]["content"] == "You are a concise weather assistant."
    assert t.messages[1]["content"] == "What's the weather in Paris?"
    a = t.messages[2]
    assert a["reasoning_content"] == "The user wants the weather in Paris."
    assert calls(a) == [("call_paris", "get_weather", {"city": "Paris"})]
    name, content = results(t)["call_paris"]
    assert name == "get_weather" and json.loads(content) == {"city": "Paris", "temp_c": 18, "sky": "sunny"}
    assert t.messages[4]["content"] == "It is 18 °C and sunny in Paris."


def check_pa_parallel(t):
    assert roles(t) == ["system", "system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    # system prompt first, the agent's instructions after it (where pydantic-ai puts them)
    assert [m["content"] for m in t.messages[:2]] == ["You are a travel assistant.", "Answer in one sentence."]
    assert t.messages[2]["content"] == "Compare the weather in Zürich and 東京, then save a note."
    # the second call's args were a JSON string in the history: decoded
    assert calls(t.messages[3]) == [("call_zh", "get_weather", {"city": "Zürich"}), ("call_tk", "get_weather", {"city": "東京", "unit": "c"})]
    assert calls(t.messages[6]) == [("call_note", "save_note", NOTE_ARGS)]
    r = results(t)
    assert json.loads(r["call_zh"][1]) == {"city": "Zürich", "temp_c": 12, "sky": "cloudy"}
    assert json.loads(r["call_tk"][1]) == {"city": "東京", "temp_c": 20, "sky": "clear"}
    assert "東京" in r["call_tk"][1]  # UTF-8 kept, not \\u escapes
    assert r["call_note"] == ("save_note", "saved 22 characters")
    assert t.messages[-1]["content"] == "東京 is warmer than Zürich; the note is saved."


def check_pa_retry(t):
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert calls(t.messages[2]) == [("call_bad", "lookup_order", {"order_id": -42})]
    assert calls(t.messages[4]) == [("call_good", "lookup_order", {"order_id": 42})]
    r = results(t)
    # a ModelRetry answers its call as an error, as pydantic-ai sends it on a text-only tool channel
    assert json.loads(r["call_bad"][1]) == {"error": "order_id must be positive"}
    assert json.loads(r["call_good"][1]) == {"order_id": 42, "status": "shipped"}
    assert t.messages[-1]["content"] == "Order 42 has shipped."


def check_pa_plain(t):
    assert t.messages == [{"role": "user", "content": "Say hello in French."}, {"role": "assistant", "content": "Bonjour !"}]


@pytest.mark.parametrize("fmt", ["auto", "pydantic-ai"])
def test_pydantic_ai_runs_jsonl(fmt, qwen3):
    path = os.path.join(PA, "runs.jsonl")
    assert detect(path) == "pydantic-ai"
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"pydantic-ai": 4} and len(res.traces) == 4
    one, par, retry, plain = res.traces
    check_pa_one_call(one)
    check_pa_parallel(par)
    check_pa_retry(retry)
    check_pa_plain(plain)
    for t in res.traces:
        prov = t.metadata["provenance"]
        assert prov["format"] == "pydantic-ai" and prov["library"] == "pydantic-ai"
        assert "version" not in prov  # the history does not say
        assert isinstance(prov["run_id"], str) and isinstance(prov["conversation_id"], str)
        assert t.metadata["model"] == "scripted-model" and t.metadata["ids"] == "rendered"
        assert t.metadata["usage"]["input_tokens"] > 0 and t.metadata["usage"]["output_tokens"] > 0
        assert t.metadata["duration_s"] >= 0
        assert t.tools == [] and not parse_errors(t)
    assert [tr.id for tr in res.traces] == [tr.id for tr in import_file(path, fmt, bundle=qwen3).traces]  # stable ids


def test_pydantic_ai_whole_json_file_is_one_conversation():
    path = os.path.join(PA, "run.json")
    assert detect(path) == "pydantic-ai"
    res = import_file(path, "auto", tokenizer="qwen3")
    assert res.complete and len(res.traces) == 1, res.problem_lines()
    check_pa_parallel(res.traces[0])
    res2 = import_file(path, "pydantic-ai", tokenizer="qwen3")
    assert len(res2.traces) == 1 and res2.traces[0].messages == res.traces[0].messages


def test_pydantic_ai_wrapper_with_tools(qwen3):
    path = os.path.join(PA, "with_tools.json")
    res = import_file(path, bundle=qwen3)
    assert res.complete and res.formats == {"pydantic-ai": 1}, res.problem_lines()
    assert any("read as pydantic-ai" in n and "openai-chat" in n for n in res.notes)  # the choice is said
    t = res.traces[0]
    check_pa_one_call(t)
    assert [x["function"]["name"] for x in t.tools] == ["get_weather", "save_note", "lookup_order"]
    w = t.tools[0]["function"]
    assert w["description"] == "Current weather for a city."
    assert w["parameters"]["properties"]["city"] == {"type": "string"} and w["parameters"]["required"] == ["city"]
    assert t.tools[1]["function"]["parameters"]["properties"]["tags"]["type"] == "array"
    # the tools are rendered into the prompt
    assert "save_note" in qwen3.tokenizer.decode(t.prompt_ids)


def _pa_history():
    return json.loads(open(os.path.join(PA, "runs.jsonl"), encoding="utf-8").readline())


def test_pydantic_ai_unknown_parts_and_images_are_losses(tmp_path, qwen3):
    h = _pa_history()
    h[1]["parts"].append({"part_kind": "hologram", "content": "?"})
    h[0]["parts"][1]["content"] = ["What's the weather in Paris?", {"kind": "image-url", "url": "https://example.com/p.png"}]
    h[2]["parts"].insert(0, {"part_kind": "instruction-delta", "content": "x"})  # bookkeeping: counted, no loss
    res = import_file(write(tmp_path, "h.jsonl", [h]), bundle=qwen3)
    assert len(res.traces) == 1 and not res.problems
    t = res.traces[0]
    lost = [p.reason for p in res.losses]
    assert any("[1].parts[2]: hologram part not carried over" in r for r in lost), lost
    assert any("[0].parts[1].content[1]: image-url item not carried over" in r for r in lost), lost
    assert len(lost) == 2 and not res.complete
    assert t.metadata["skipped_parts"] == {"instruction-delta": 1}
    assert t.messages[1]["content"] == "What's the weather in Paris?"  # the text of the prompt stays
    assert t.metadata["import"]["losses"] == [r.split(": ", 1)[1] for r in lost]


def test_pydantic_ai_bad_records(tmp_path, qwen3):
    good = _pa_history()
    no_parts = _pa_history()
    del no_parts[2]["parts"]
    bad_args = _pa_history()
    bad_args[1]["parts"][1]["args"] = '{"city": "Par'
    dangling = _pa_history()
    dangling[2]["parts"][0]["tool_call_id"] = "call_nobody"
    path = write(tmp_path, "bad.jsonl", [good, no_parts, '[{"kind": "request", "parts": [', bad_args, dangling])
    res = import_file(path, bundle=qwen3)
    by_line = {p.line: p.reason for p in res.problems}
    assert set(by_line) == {2, 3}, res.problem_lines()
    assert "[2]: not a pydantic-ai message" in by_line[2]
    assert len(res.traces) == 3  # lines 1, 4, 5
    t4 = res.traces[1]
    errs = parse_errors(t4)
    assert len(errs) == 1 and "get_weather" in errs[0].message and errs[0].raw == '{"city": "Par'
    assert calls(t4.messages[2]) == [("call_paris", "get_weather", '{"city": "Par')]  # the raw string is kept
    lost = [(p.line, p.reason) for p in res.losses]
    assert len(lost) == 1 and lost[0][0] == 5 and "call_nobody" in lost[0][1] and "answers no tool call" in lost[0][1]


def test_pydantic_ai_legacy_retry_prompt_and_changed_instructions(qwen3):
    """Histories written before pydantic-ai split ``retry-prompt``: a tool retry answers its
    call with the text that version sent; one with no tool is a user message."""
    h = [
        {"kind": "request", "instructions": "Be brief.", "parts": [{"part_kind": "user-prompt", "content": "Order 42?"}]},
        {"kind": "response", "parts": [{"part_kind": "tool-call", "tool_name": "lookup_order", "args": {"order_id": -1}, "tool_call_id": "c1"}]},
        {"kind": "request", "instructions": "Be very brief.", "parts": [
            {"part_kind": "retry-prompt", "tool_name": "lookup_order", "content": "order_id must be positive", "tool_call_id": "c1"}]},
        {"kind": "response", "parts": [{"part_kind": "text", "content": "not json"}]},
        {"kind": "request", "instructions": "Be very brief.", "parts": [
            {"part_kind": "retry-prompt", "content": [{"type": "json_invalid", "loc": [], "msg": "Invalid JSON", "input": "not json", "ctx": {"error": "x"}}],
             "tool_call_id": "c2"}]},
        {"kind": "response", "parts": [{"part_kind": "text", "content": "Shipped."}]},
    ]
    res = import_records([h], "auto", bundle=qwen3)
    assert res.formats == {"pydantic-ai": 1}
    t = res.traces[0]
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert t.messages[0]["content"] == "Be very brief."  # the last request's instructions
    assert t.messages[3] == {"role": "tool", "tool_call_id": "c1", "name": "lookup_order",
                             "content": "order_id must be positive\n\nFix the errors and try again."}
    u = t.messages[5]["content"]
    assert u.startswith("1 validation error:\n```json\n") and u.endswith("```\n\nFix the errors and try again.")
    assert '"msg": "Invalid JSON"' in u and '"ctx"' not in u
    lost = [p.reason for p in res.losses]
    assert len(lost) == 1 and "[0].instructions: differ from the last request's" in lost[0]


# ---- LangChain ---------------------------------------------------------------------------------


def check_lc_one_call(t):
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[0]["content"] == "You are a concise weather assistant."
    assert t.messages[1]["content"] == "What's the weather in Paris?"
    assert calls(t.messages[2]) == [("call_paris", "get_weather", {"city": "Paris"})]
    assert results(t) == {"call_paris": ("get_weather", "Paris: 18 °C, sunny")}
    assert t.messages[4]["content"] == "It is 18 °C and sunny in Paris."


def check_lc_parallel(t):
    assert roles(t) == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert t.messages[0]["content"] == "You are a travel assistant."
    assert t.messages[1]["content"] == "Compare the weather in Zürich and 東京, then save a note."  # from a text block
    assert calls(t.messages[2]) == [("call_zh", "get_weather", {"city": "Zürich"}), ("call_tk", "get_weather", {"city": "東京"})]
    assert calls(t.messages[5]) == [("call_note", "save_note", NOTE_ARGS)]
    assert results(t) == {
        "call_zh": ("get_weather", "Zürich: 12 °C, cloudy"),
        "call_tk": ("get_weather", "東京: 20 °C, clear"),
        "call_note": ("save_note", f"saved 22 characters to {ESCAPED_PATH}"),
    }
    assert t.messages[-1]["content"] == "東京 is warmer than Zürich; the note is saved."


@pytest.mark.parametrize("fmt", ["auto", "langchain"])
def test_langchain_messages_jsonl(fmt, qwen3):
    path = os.path.join(LC, "messages.jsonl")
    assert detect(path) == "langchain"
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"langchain": 3}
    one, par, plain = res.traces
    check_lc_one_call(one)
    check_lc_parallel(par)
    assert plain.messages == [{"role": "user", "content": "Say hello in French."}, {"role": "assistant", "content": "Bonjour !"}]
    for t, n_ai in zip(res.traces, (2, 3, 1)):
        prov = t.metadata["provenance"]
        assert prov["format"] == "LangChain" and prov["library"] == "langchain-core" and "version" not in prov
        assert len(prov["message_ids"]) == n_ai  # the AIMessages' run ids
        assert t.metadata["model"] == "scripted-model" and t.metadata["finish_reason"] == "stop"
        assert t.metadata["usage"] == {"input_tokens": 20 * n_ai, "output_tokens": 8 * n_ai}
        assert t.metadata["ids"] == "rendered" and not parse_errors(t)


def test_langchain_whole_file_and_wrapper_with_tools(qwen3):
    res = import_file(os.path.join(LC, "conversation.json"), "auto", tokenizer="qwen3")
    assert res.complete and len(res.traces) == 1, res.problem_lines()
    check_lc_parallel(res.traces[0])
    res = import_file(os.path.join(LC, "with_tools.json"), bundle=qwen3)
    assert res.complete and res.formats == {"langchain": 1}, res.problem_lines()
    t = res.traces[0]
    check_lc_one_call(t)
    assert [x["function"]["name"] for x in t.tools] == ["get_weather", "save_note"]
    assert t.tools[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert t.tools[0]["function"]["description"] == "Current weather for a city."


def test_langchain_invalid_tool_call_is_a_parse_error(qwen3):
    res = import_file(os.path.join(LC, "invalid_tool_call.json"), bundle=qwen3)
    assert len(res.traces) == 1 and not res.problems and not res.losses
    t = res.traces[0]
    assert roles(t) == ["user", "assistant"] and t.messages[0]["content"] == "Save a note about Zürich."
    raw = '{"path": "zurich.txt", "text": "Zür'
    assert calls(t.messages[1]) == [("call_cut", "save_note", raw)]  # the raw arguments are kept
    errs = parse_errors(t)
    assert len(errs) == 1 and errs[0].raw == raw and "LangChain could not parse it" in errs[0].message
    assert t.metadata["finish_reason"] == "tool_calls"


def test_langchain_image_block_is_a_loss(qwen3):
    res = import_file(os.path.join(LC, "image.json"), bundle=qwen3)
    assert len(res.traces) == 1 and not res.problems
    assert [p.reason.split(": ", 1)[1] for p in res.losses] == ["[0].data.content[1]: image_url block not carried over (it has no text)"]
    t = res.traces[0]
    assert t.messages == [{"role": "user", "content": "What city is this?"}, {"role": "assistant", "content": "It looks like Zürich."}]


def _lc(t, **data):
    return {"type": t, "data": {"content": "", "additional_kwargs": {}, "response_metadata": {}, "type": t, **data}}


def test_langchain_content_blocks_chunks_and_legacy_messages(qwen3):
    """Anthropic-style AI content (thinking + tool_use blocks that repeat tool_calls), chunks,
    legacy function calls, chat messages with any role, RemoveMessage."""
    conv = [
        _lc("human", content="Weather in Oslo?"),
        _lc("AIMessageChunk", content=[
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ], tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "toolu_1", "type": "tool_call"}]),
        _lc("tool", content=[{"type": "text", "text": "Oslo: 3 °C"}], tool_call_id="toolu_1", name="get_weather", artifact={"raw": 3}),
        _lc("ai", content="", additional_kwargs={"function_call": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}),
        _lc("function", content="12:00", name="get_time"),
        _lc("chat", content="Looks fine.", role="critic"),
        {"type": "remove", "data": {"id": "m9", "type": "remove", "content": ""}},
        _lc("chat", content="It is 3 °C in Oslo at noon.", role="assistant"),
    ]
    res = import_records([conv], "auto", bundle=qwen3)
    assert res.formats == {"langchain": 1} and not res.problems
    t = res.traces[0]
    assert roles(t) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    a = t.messages[1]
    assert a["content"] == "Checking." and a["reasoning_content"] == "Use the tool."
    assert calls(a) == [("toolu_1", "get_weather", {"city": "Oslo"})]  # the tool_use block is that call, once
    assert t.messages[2] == {"role": "tool", "content": "Oslo: 3 °C", "tool_call_id": "toolu_1", "name": "get_weather"}
    assert calls(t.messages[3]) == [(None, "get_time", {"city": "Oslo"})]
    assert t.messages[4] == {"role": "tool", "content": "12:00", "name": "get_time"}
    lost = sorted(p.reason.split(": ", 1)[1] for p in res.losses)
    assert len(lost) == 2
    assert lost[0].startswith("[5]: chat message with role 'critic' not carried over")
    assert lost[1].startswith("[6]: RemoveMessage not carried over")


def test_langchain_bad_records(tmp_path, qwen3):
    good = load_lines(os.path.join(LC, "messages.jsonl"))[0]
    no_data = json.loads(json.dumps(good))
    no_data[2] = {"type": "ai", "content": "x"}  # not {type, data}
    dangling = json.loads(json.dumps(good))
    dangling[3]["data"]["tool_call_id"] = "call_nobody"
    unknown_block = json.loads(json.dumps(good))
    unknown_block[4]["data"]["content"] = [{"type": "text", "text": "It is 18 °C."}, {"type": "hologram", "x": 1}]
    path = write(tmp_path, "bad.jsonl", [good, no_data, '[{"type": "human", "data": {"content": "hi', dangling, unknown_block])
    res = import_file(path, bundle=qwen3)
    by_line = {p.line: p.reason for p in res.problems}
    assert set(by_line) == {2, 3}, res.problem_lines()
    assert "[2]: not a LangChain message" in by_line[2]
    assert len(res.traces) == 3
    lost = {p.line: p.reason for p in res.losses}
    assert set(lost) == {4, 5}
    assert "call_nobody" in lost[4] and "answers no tool call" in lost[4]
    assert "[4].data.content[1]: hologram block not carried over" in lost[5]
    assert res.traces[2].messages[-1]["content"] == "It is 18 °C."


# ---- smolagents --------------------------------------------------------------------------------

SM_ERROR_ADVICE = "Now let's retry: take care not to repeat previous errors!"


def assert_no_repr_calls(t):
    """smolagents' own prompts carry calls as Python repr text; ours must not."""
    for m in t.messages:
        assert "Calling tools:" not in m["content"] and "'function': {" not in m["content"]


@pytest.mark.parametrize("fmt", ["auto", "smolagents"])
def test_smolagents_tool_calling_agent(fmt, qwen3):
    path = os.path.join(SM, "tool_calling.json")
    assert detect(path) == "smolagents"
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete and len(res.traces) == 1, res.problem_lines()
    t = res.traces[0]
    assert roles(t) == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert t.messages[0]["content"].startswith("You are an expert assistant who can solve any task using tool calls.")
    assert t.messages[1]["content"] == "New task:\nCompare the weather in Zürich and 東京, then save a note."
    # the second call's arguments were a JSON string: decoded; results split per call (by call id, as smolagents orders them)
    assert calls(t.messages[2]) == [("call_zh", "get_weather", {"city": "Zürich"}), ("call_tk", "get_weather", {"city": "東京"})]
    assert [m["tool_call_id"] for m in t.messages[3:5]] == ["call_tk", "call_zh"]
    r = results(t)
    assert r["call_zh"] == ("get_weather", "Zürich: 12 °C, cloudy") and r["call_tk"] == ("get_weather", "東京: 20 °C, clear")
    assert calls(t.messages[5]) == [("call_note", "save_note", NOTE_ARGS)]
    assert r["call_note"] == ("save_note", "saved 22 characters")
    # the failing call is kept (smolagents recorded no tool_calls for that step) and its error answers it
    assert t.messages[7]["content"] == "Let me also check Atlantis."
    assert calls(t.messages[7]) == [("call_atl", "get_weather", {"city": "Atlantis"})]
    err = r["call_atl"][1]
    assert err.startswith("Error:\n") and "unknown city Atlantis" in err and SM_ERROR_ADVICE in err
    # final_answer stays the model's tool call, with its result
    assert calls(t.messages[9]) == [("call_final", "final_answer", {"answer": "東京 is warmer than Zürich."})]
    assert r["call_final"] == ("final_answer", "東京 is warmer than Zürich.")
    assert_no_repr_calls(t)
    md = t.metadata
    assert md["agent"] == "ToolCallingAgent" and md["final_answer"] == "東京 is warmer than Zürich."
    assert md["usage"] == {"input_tokens": 400, "output_tokens": 80}  # 4 replies of 100 in / 20 out
    assert [d["step"] for d in md["step_durations"]] == [1, 2, 3, 4]
    assert md["duration_s"] >= sum(d["duration_s"] for d in md["step_durations"]) - 1e-3
    assert md["provenance"] == {"library": "smolagents", "format": "smolagents"}
    assert t.metadata["ids"] == "rendered"


def check_sm_code(t):
    assert roles(t) == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert t.messages[0]["content"].startswith("You are an expert assistant who can solve any task using code blobs.")
    assert t.messages[1]["content"] == "New task:\nHow warm is it in Zürich?"
    assert "1. Get the weather in Zürich.\n2. Give the answer." in t.messages[2]["content"]  # the plan
    assert t.messages[3]["content"] == "Now proceed and carry out this plan."
    # the code action is the assistant's text; no tool calls (python_interpreter is smolagents' own)
    assert t.messages[4]["content"] == 'Thought: I will look up the weather.\n<code>\nw = get_weather(city="Zürich")\nprint(w)\n</code>'
    assert not any(m.get("tool_calls") for m in t.messages)
    assert t.messages[5]["content"].startswith("Observation:\nExecution logs:\nZürich: 12 °C, cloudy")
    assert t.messages[6]["content"] == "Thought: Let me check a division.\n<code>\nprint(1 / 0)\n</code>"
    assert t.messages[7]["content"].startswith("Error:\n") and "ZeroDivisionError" in t.messages[7]["content"]
    assert t.messages[8]["content"] == "Thought: I have the answer.\n<code>\nfinal_answer(w)\n</code>"
    assert t.messages[9]["content"].startswith("Observation:") and "Zürich: 12 °C, cloudy" in t.messages[9]["content"]
    assert_no_repr_calls(t)
    md = t.metadata
    assert md["agent"] == "CodeAgent" and md["final_answer"] == "Zürich: 12 °C, cloudy"
    assert [d["kind"] for d in md["step_durations"]] == ["planning", "action", "action", "action"]
    assert md["usage"] == {"input_tokens": 400, "output_tokens": 80}


def test_smolagents_code_agent(qwen3):
    res = import_file(os.path.join(SM, "code_agent.json"), bundle=qwen3)
    assert res.complete and res.formats == {"smolagents": 1}, res.problem_lines()
    check_sm_code(res.traces[0])
    assert res.traces[0].metadata["ids"] == "rendered"


def test_smolagents_several_runs_and_run_result(qwen3):
    res = import_file(os.path.join(SM, "runs.jsonl"), bundle=qwen3)
    assert res.complete and res.formats == {"smolagents": 3}, res.problem_lines()
    one, plain, code = res.traces
    assert one.messages[1]["content"] == "New task:\nWhat's the weather in Paris?"
    assert calls(one.messages[2]) == [("call_paris", "get_weather", {"city": "Paris"})]
    assert results(one) == {"call_paris": ("get_weather", "Paris: 18 °C, sunny"), "call_done": ("final_answer", "18 °C and sunny.")}
    assert roles(plain) == ["system", "user", "assistant", "tool"]
    assert calls(plain.messages[2]) == [("call_hello", "final_answer", {"answer": "Bonjour !"})]
    assert results(plain) == {"call_hello": ("final_answer", "Bonjour !")}
    check_sm_code(code)
    res = import_file(os.path.join(SM, "run_result.json"), "auto", tokenizer="qwen3")
    assert res.complete and res.formats == {"smolagents": 1}, res.problem_lines()
    t = res.traces[0]
    assert t.messages == one.messages
    assert [x["function"]["name"] for x in t.tools] == ["get_weather", "save_note", "final_answer"]
    assert t.tools[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert t.metadata["final_answer"] == "18 °C and sunny." and t.metadata["state"] == "success"


def _sm_steps():
    return json.load(open(os.path.join(SM, "tool_calling.json"), encoding="utf-8"))


def test_smolagents_broken_arguments_are_listed_and_kept(tmp_path, qwen3):
    """A ToolCallingAgent run whose model wrote a call's arguments as cut JSON (smolagents'
    broken_arguments scenario): the import lists the unreadable call, with nothing lost — the
    raw arguments, the tool's error fed back, the final answer."""

    path = os.path.join(SM, "broken_arguments.json")
    res = import_file(path, bundle=qwen3)
    assert len(res.traces) == 1 and not res.problems and not res.losses  # nothing lost ...
    (listed,) = res.unreadable  # ... but said
    assert "tool call 0 ('get_weather')" in listed.reason and "not valid JSON" in listed.reason and "kept as written" in listed.reason
    assert any("get_weather" in x and "not valid JSON" in x for x in res.problem_lines())
    assert "1 unreadable tool call(s) kept as written" in res.summary()
    t = res.traces[0]
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert calls(t.messages[2]) == [("call_bad", "get_weather", '{"city": "Par')]  # as the model wrote it
    assert t.messages[3]["tool_call_id"] == "call_bad" and "Error executing tool 'get_weather'" in t.messages[3]["content"]
    assert t.messages[5]["content"] == "I could not read the weather."
    (err,) = parse_errors(t)
    assert err.raw == '{"city": "Par'
    out = run_cli("import", path, "--out", str(tmp_path / "o.jsonl"), "--json")
    assert out.returncode == 0, out.stderr
    (u,) = json.loads(out.stdout)["unreadable_calls"]
    assert "get_weather" in u["what"] and u["line"] == 1


def test_smolagents_disagreeing_tool_calls_are_reported_and_both_kept(tmp_path, qwen3):
    """smolagents' ``disagreeing_calls`` run (issue 42 item 13): an app's step callback recorded
    the call it repaired as the step's ``tool_calls`` ({"city": "Par"}) while
    ``model_output_message.tool_calls`` keep what the model wrote ('{"city": "Par', unreadable).
    The import says so, keeps the model's calls in the conversation (the unreadable one listed
    as such) and the step's in the metadata; and the same with the two sides swapped (the
    model's parsed, the step's unreadable), where nothing else would be listed."""
    path = os.path.join(SM, "disagreeing_calls.json")
    steps = json.load(open(path, encoding="utf-8"))
    step = steps[1]
    assert step["tool_calls"][0]["function"]["arguments"] == {"city": "Par"}
    assert step["model_output_message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    res = import_file(path, bundle=qwen3)
    assert len(res.traces) == 1 and not res.problems
    (loss,) = res.losses
    assert "[1]: tool_calls disagree with model_output_message.tool_calls" in loss.reason
    assert "call 'call_bad' (get_weather)" in loss.reason and '{"city": "Par"}' in loss.reason and "'{\"city\": \"Par'" in loss.reason
    assert "metadata.step_tool_calls" in loss.reason
    (listed,) = res.unreadable  # the model's call, kept as written
    assert "get_weather" in listed.reason
    t = res.traces[0]
    assert roles(t) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert calls(t.messages[2]) == [("call_bad", "get_weather", '{"city": "Par')]
    (kept,) = t.metadata["step_tool_calls"]
    assert kept == {"step_number": 1, "message": 2, "tool_calls": step["tool_calls"]}

    # swapped: the model's arguments parsed, the step's unreadable
    mo = step["model_output_message"]["tool_calls"][0]["function"]
    st = step["tool_calls"][0]["function"]
    mo["arguments"], st["arguments"] = st["arguments"], mo["arguments"]
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps(steps, ensure_ascii=False), encoding="utf-8")
    res = import_file(str(swapped), bundle=qwen3)
    assert not res.problems and not res.unreadable
    (loss,) = res.losses
    assert "[1]: tool_calls disagree with model_output_message.tool_calls" in loss.reason
    t = res.traces[0]
    assert calls(t.messages[2]) == [("call_bad", "get_weather", {"city": "Par"})]
    assert t.metadata["step_tool_calls"][0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    # agreeing sides (every other fixture, parallel calls in another order included): nothing said
    for name in ("tool_calling.json", "broken_arguments.json"):
        res = import_file(os.path.join(SM, name), bundle=qwen3)
        assert not res.losses and "step_tool_calls" not in res.traces[0].metadata


def test_smolagents_bad_records(tmp_path, qwen3):
    good = _sm_steps()
    odd_step = _sm_steps()
    odd_step[2] = {"step_number": 2, "whatever": 1}
    images = _sm_steps()
    images[1]["observations_images"] = ["b'\\x00\\x01'"]
    joined = _sm_steps()
    joined[1]["observations"] = "Zürich: 12 °C,\ncloudy\n東京: 20 °C, clear"  # 3 lines for 2 calls: not split
    path = write(tmp_path, "bad.jsonl", [good, odd_step, "[{\"task\": \"x\"}, {\"step_number\": 1, ", images, joined])
    res = import_file(path, bundle=qwen3)
    by_line = {p.line: p.reason for p in res.problems}
    assert set(by_line) == {2, 3}, res.problem_lines()
    assert "[2]: not a smolagents step" in by_line[2]
    assert len(res.traces) == 3
    assert [(p.line, p.reason.split(": ", 1)[1]) for p in res.losses] == [(4, "[1].observations_images: 1 image(s) not carried over")]
    t = res.traces[2]
    tools = [m for m in t.messages if m["role"] == "tool"]
    # the whole text answers the first call (in smolagents' order); the other call has no result
    assert tools[0]["tool_call_id"] == "call_tk" and tools[0]["content"] == "Zürich: 12 °C,\ncloudy\n東京: 20 °C, clear"
    assert "call_zh" not in results(t)


def test_smolagents_max_steps_and_json_looking_output(qwen3):
    """A run stopped at max steps: the final step has no model output, an AgentMaxStepsError and
    the answer smolagents asked for separately; a model output that make_json_serializable turned
    into an object comes back as JSON text."""
    steps = [
        {"task": "Count to three.", "task_images": None},
        {"step_number": 1, "timing": {"start_time": 10.0, "end_time": 11.5, "duration": 1.5}, "model_input_messages": None,
         "tool_calls": [], "error": None,
         "model_output_message": {"role": "assistant", "content": {"a": 1}, "tool_calls": [
             {"function": {"arguments": "{\"n\": 1", "name": "count", "description": None}, "id": "c1", "type": "function"}],
             "raw": None, "token_usage": None},
         "model_output": None, "code_action": None, "observations": "1", "observations_images": None, "action_output": None,
         "token_usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}, "is_final_answer": False},
        {"step_number": 2, "timing": {"start_time": 11.5, "end_time": 12.0, "duration": 0.5}, "model_input_messages": None,
         "tool_calls": [], "error": {"type": "AgentMaxStepsError", "message": "Reached max steps."},
         "model_output_message": None, "model_output": None, "code_action": None, "observations": None,
         "observations_images": None, "action_output": "1, 2, 3", "token_usage": None, "is_final_answer": False},
    ]
    res = import_records([steps], "auto", bundle=qwen3)
    assert res.formats == {"smolagents": 1} and not res.problems and not res.losses
    t = res.traces[0]
    assert roles(t) == ["user", "assistant", "tool", "user", "assistant"]
    assert json.loads(t.messages[1]["content"]) == {"a": 1}
    assert calls(t.messages[1]) == [("c1", "count", '{"n": 1')]
    assert len(parse_errors(t)) == 1 and parse_errors(t)[0].raw == '{"n": 1'
    assert t.messages[3]["content"].startswith("Error:\nReached max steps.")
    assert t.messages[4]["content"] == "1, 2, 3"
    assert t.termination_reason == "max_assistant_turns"
    assert t.metadata["duration_s"] == 2.0 and t.metadata["usage"] == {"input_tokens": 5, "output_tokens": 2}


# ---- detection ---------------------------------------------------------------------------------


def test_detection_keeps_every_format_apart():
    """Our files are read as their format only; every other fixture keeps its format; no record
    of another format is sniffed by ours (and ours by theirs, except openai-chat on the
    ``{"messages": [...]}`` wrappers, which loses to ours in the detection order)."""
    ours = {name: get_importer(name) for name in MINE}
    for path in sorted(glob.glob(os.path.join(DATA, "**", "*"), recursive=True)):
        if os.path.isdir(path) or path.endswith(".parquet"):
            continue
        folder = os.path.dirname(path)
        expected = next((name for name, d in MINE.items() if folder == d), None)
        for n, rec in _records(path, None):
            fmt, _, others = detect_why(rec)
            if expected is not None:
                assert fmt == expected, (path, n, fmt)
                assert set(others) <= {"openai-chat"}, (path, n, others)
                if others:
                    assert isinstance(rec, dict) and "messages" in rec
            else:
                assert fmt not in MINE, (path, n, fmt)
                assert not [name for name, imp in ours.items() if imp.sniff(rec)], (path, n)


def test_detection_of_near_misses():
    # openai-chat rows, ShareGPT, Agents SDK items, verl, our traces: not ours
    for rec in (
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"conversations": [{"from": "human", "value": "hi"}]},
        [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}],
        [{"role": "user", "content": "hi"}],
        {"prompt_ids": [1], "response_ids": [2]},
        {"format_version": 1, "id": "x"},
        [{"task": "only a task", "task_images": None}],  # no action step: not enough to be smolagents
        [{"kind": "other", "parts": []}],
        [{"type": "human", "content": "no data"}],
    ):
        assert detect_why(rec)[0] not in MINE, rec
    assert detect_why([{"kind": "request", "parts": []}, {"kind": "response", "parts": []}])[0] == "pydantic-ai"
    assert detect_why([{"type": "human", "data": {"content": "hi"}}])[0] == "langchain"
    assert detect_why({"messages": [{"type": "human", "data": {"content": "hi"}}]})[0] == "langchain"
