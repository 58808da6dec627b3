"""Importers: Agents SDK runs (driven for real with a fake Model and a real @function_tool, and
checked against the SDK's own chat-completions converter), verl outputs, chat-completions logs,
ShareGPT / HF datasets (JSONL and Parquet); detection; rendered vs given ids; bad records."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from cli_inprocess import run_cli
from trl_masks import generated_mask, trl_assistant_mask

from backend.importers import FORMATS, detect, import_agents_sdk_run, import_file, import_records
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


# ---- invariants of rendered ids -----------------------------------------------------------------


def assert_rendered(t, bundle):
    """ids = the full template render; the mask = trl's training-template assistant mask, except
    the "\\n" the template writes after each <|im_end|> (trl counts it as assistant; no generation
    has it: 0, as verl >= 0.9 and the mask audit have it)."""
    tok = bundle.tokenizer
    tools = None if t.metadata.get("tools_in_system_prompt") else (t.tools or None)
    full = tok.apply_chat_template(t.messages, tools=tools, tokenize=True, return_dict=False, chat_template=bundle.chat_template)
    assert t.input_ids == list(full)
    assert t.metadata["ids"] == "rendered"
    if any(m["role"] == "assistant" for m in t.messages):
        assert tok.decode(t.prompt_ids).endswith("<|im_start|>assistant\n")
    ids, trl_mask = trl_assistant_mask(bundle, t.messages, tools)
    assert ids == t.input_ids
    assert t.full_mask == generated_mask(bundle, ids, trl_mask)
    # steps cover prompt, each assistant turn (mask 1) and the turns between (mask 0)
    for s in t.steps:
        if s.state == "generating":
            assert set(t.full_mask[s.start : s.end]) == {1}
        elif s.state == "processing_tools" and s.end > s.start:
            assert set(t.full_mask[s.start : s.end]) == {0}


# ---- Agents SDK: real runs ---------------------------------------------------------------------

agents = pytest.importorskip("agents")


def _sdk():
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage

    set_tracing_disabled(True)

    class ScriptedModel(Model):
        """A Model that returns scripted responses and records what it was sent."""

        def __init__(self, outputs):
            self.outputs = list(outputs)
            self.inputs = []

        async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kw):
            self.inputs.append(input)
            return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

        def stream_response(self, *a, **k):  # pragma: no cover - not used
            raise NotImplementedError

    @function_tool
    def get_current_temperature(city: str, unit: str = "f") -> str:
        """Get current temperature at a location.

        Args:
            city: The location, "City, State, Country".
            unit: "c" or "f".
        """
        return json.dumps({"temperature": 72 if unit == "f" else 22, "city": city, "unit": unit})

    @function_tool
    def get_time(city: str) -> str:
        """Local time in a city.

        Args:
            city: The city.
        """
        return f"12:00 in {city}"

    return Agent, Runner, ScriptedModel, [get_current_temperature, get_time]


def _fc(call_id, name, **args):
    from openai.types.responses import ResponseFunctionToolCall

    return ResponseFunctionToolCall(id="fc_" + call_id, call_id=call_id, type="function_call", name=name, arguments=json.dumps(args))


def _msg(text, mid="msg_1"):
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    return ResponseOutputMessage(id=mid, type="message", role="assistant", status="completed", content=[ResponseOutputText(text=text, type="output_text", annotations=[])])


def _reasoning(text):
    from openai.types.responses import ResponseReasoningItem
    from openai.types.responses.response_reasoning_item import Summary

    return ResponseReasoningItem(id="rs_1", type="reasoning", summary=[Summary(text=text, type="summary_text")])


SCENARIOS = {
    "call_then_answer": [[_fc("call_a", "get_current_temperature", city="Seattle, WA, USA")], [_msg("It is 72F in Seattle.")]],
    "parallel_calls": [[_fc("call_a", "get_current_temperature", city="Paris", unit="c"), _fc("call_b", "get_time", city="Paris")], [_msg("22C, noon.")]],
    "reasoning": [[_reasoning("Need the weather tool."), _fc("call_a", "get_current_temperature", city="Lima")], [_msg("72F in Lima.")]],
    "text_and_call": [[_msg("Let me check.", "msg_0"), _fc("call_a", "get_time", city="Tokyo")], [_msg("Noon in Tokyo.")]],
    "two_steps": [[_fc("call_a", "get_time", city="Oslo")], [_fc("call_b", "get_current_temperature", city="Oslo", unit="c")], [_msg("Noon and 22C.")]],
}


def run_sdk(outputs, question="What's the weather?"):
    Agent, Runner, ScriptedModel, tools = _sdk()
    model = ScriptedModel(outputs)
    agent = Agent(name="weather", instructions="You are a weather bot.", model=model, tools=tools)
    result = asyncio.run(Runner.run(agent, question))
    return agent, result, model


def _norm(messages):
    """Compare our HF messages with the SDK's chat-completions messages: arguments as objects,
    no content as "", and only the keys both have."""
    out = []
    for m in messages:
        n = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            n["tool_calls"] = [
                (c["id"], c["function"]["name"], json.loads(a) if isinstance(a := c["function"]["arguments"], str) else a) for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            n["tool_call_id"] = m["tool_call_id"]
        out.append(n)
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_agents_sdk_run_matches_the_sdk_converter(name, qwen3):
    from agents.models.chatcmpl_converter import Converter

    agent, result, model = run_sdk(SCENARIOS[name])
    items = result.to_input_list()
    t = import_agents_sdk_run(items, agent.tools, instructions=agent.instructions, bundle=qwen3)
    sdk_msgs = Converter.items_to_messages(items)
    assert _norm(t.messages[1:]) == _norm(sdk_msgs)  # ours starts with the instructions as system
    assert t.messages[0] == {"role": "system", "content": "You are a weather bot."}
    # what the model was sent on its last call is what we imported, minus the final answer
    assert _norm(Converter.items_to_messages(model.inputs[-1])) == _norm(t.messages[1:-1])
    # tool messages carry the call's name; arguments are objects
    for m in t.messages:
        if m["role"] == "tool":
            assert m["name"] in ("get_current_temperature", "get_time")
        for c in m.get("tool_calls") or []:
            assert isinstance(c["function"]["arguments"], dict)
    # tools: the SDK's own chat-completions tool schema
    sdk_tools = [Converter.tool_to_openai(x) for x in agent.tools]
    for ours, theirs in zip(t.tools, sdk_tools):
        assert ours["function"]["name"] == theirs["function"]["name"]
        assert ours["function"]["parameters"] == theirs["function"]["parameters"]
        assert ours["function"]["description"] == theirs["function"]["description"]
    assert t.metadata["source"] == "agents-sdk"
    assert_rendered(t, qwen3)


def test_agents_sdk_reasoning_becomes_reasoning_content(qwen3):
    agent, result, _ = run_sdk(SCENARIOS["reasoning"])
    t = import_agents_sdk_run(result.to_input_list(), agent.tools, bundle=qwen3)
    (asst,) = [m for m in t.messages if m.get("tool_calls")]
    assert asst["reasoning_content"] == "Need the weather tool."


def test_agents_sdk_text_and_call_are_one_turn(qwen3):
    agent, result, _ = run_sdk(SCENARIOS["text_and_call"])
    t = import_agents_sdk_run(result.to_input_list(), agent.tools, bundle=qwen3)
    roles = [m["role"] for m in t.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1]["content"] == "Let me check." and t.messages[1]["tool_calls"][0]["function"]["name"] == "get_time"


def test_agents_sdk_multi_turn_conversation(qwen3):
    from agents.models.chatcmpl_converter import Converter

    agent, result, _ = run_sdk(SCENARIOS["call_then_answer"])
    Agent, Runner, ScriptedModel, tools = _sdk()
    agent2 = agent.clone(model=ScriptedModel([[_fc("call_z", "get_time", city="Seattle")], [_msg("Noon.")]]))
    nxt = result.to_input_list() + [{"role": "user", "content": "And the time?"}]
    result2 = asyncio.run(Runner.run(agent2, nxt))
    items = result2.to_input_list()
    t = import_agents_sdk_run(items, tools, bundle=qwen3)
    assert _norm(t.messages) == _norm(Converter.items_to_messages(items))
    assert [m["role"] for m in t.messages].count("user") == 2
    assert t.num_turns == 4
    assert_rendered(t, qwen3)


def test_agents_sdk_files_detected_and_imported(qwen3, tmp_path):
    for f in ("agents_sdk_run.json", "agents_sdk_items.json"):
        path = os.path.join(DATA, f)
        assert detect(path) == "agents-sdk"
        res = import_file(path)
        assert len(res.traces) == 1 and not res.problems, res.problems
        t = res.traces[0]
        assert t.metadata["source"] == "agents-sdk" and t.metadata["import"] == {"file": f, "line": 1}
    assert res.traces[0].tools == []  # the bare item list has no tools
    t = import_file(os.path.join(DATA, "agents_sdk_run.json")).traces[0]
    assert t.tools[0]["function"]["name"] == "get_current_temperature"
    assert t.messages[0]["role"] == "system"
    # JSONL: one run per line; a bad run is reported by line and the rest import
    good = json.load(open(os.path.join(DATA, "agents_sdk_run.json")))
    bad = {"items": [{"type": "function_call", "name": "get_time", "arguments": "{}"}]}
    bad2 = {"items": [{"role": "user", "content": "hi"}, 42]}
    p = tmp_path / "runs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in (good, bad, good | {"id": "r3"}, bad2)) + "\n")
    res = import_file(str(p), "agents-sdk")
    assert [tr.id for tr in res.traces][1] == "r3" and len(res.traces) == 2
    assert [(pr.line, "call_id" in pr.reason) for pr in res.problems][0] == (2, True)
    assert res.problems[1].line == 4 and "item 1" in res.problems[1].reason


def test_agents_sdk_item_objects_and_function_tools(qwen3):
    """SDK pydantic items (not dicts) and FunctionTool objects are accepted directly."""
    from openai.types.responses import ResponseFunctionToolCall

    agent, result, _ = run_sdk(SCENARIOS["call_then_answer"])
    items = result.to_input_list()
    mixed = [items[0], ResponseFunctionToolCall(**items[1])] + items[2:]
    t = import_agents_sdk_run(mixed, agent.tools, bundle=qwen3)
    assert t.messages[1]["tool_calls"][0]["id"] == "call_a"


def test_agents_sdk_bad_arguments_are_a_parse_error(qwen3):
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": '{"city": '},
        {"type": "function_call_output", "call_id": "c1", "output": "err"},
    ]
    t = import_records([{"items": items}], "agents-sdk", bundle=qwen3).traces[0]
    (gen,) = [s for s in t.steps if s.state == "generating"]
    assert gen.parse_errors and "not valid JSON" in gen.parse_errors[0].message
    assert t.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": '


# ---- verl ---------------------------------------------------------------------------------------


def test_verl_agent_loop_ids_kept_exactly(qwen3):
    path = os.path.join(DATA, "verl_agent_loop.jsonl")
    assert detect(path) == "verl"
    rows = [json.loads(line) for line in open(path)]
    res = import_file(path, "verl")
    assert [t.id for t in res.traces] == ["seed001", "no-mask"]
    t = res.traces[0]
    assert t.prompt_ids == rows[0]["prompt_ids"] and t.response_ids == rows[0]["response_ids"]
    assert t.response_mask == rows[0]["response_mask"]
    assert t.metadata["ids"] == "given" and t.metadata["mask"] == "given" and t.metadata["reward_score"] == 1.0
    # decoded for display; messages and tools recovered from the ChatML text
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1]["tool_calls"][0]["function"] == {"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}
    assert t.tools and t.tools[0]["function"]["name"] == "get_current_temperature"
    assert [(s.state, s.start, s.end, s.mask) for s in t.steps[1:4]] == [("generating", 178, 203, 1), ("processing_tools", 203, 231, 0), ("generating", 231, 247, 1)]
    assert res.traces[1].metadata["mask"] == "assumed"
    assert [(p.line, p.reason.split(" ")[0]) for p in res.problems] == [(2, "response_mask"), (3, "response_ids[68]")]
    assert "outside the vocabulary" in res.problems[1].reason


def test_verl_rollout_dump_text_is_recovered_and_rendered(qwen3):
    path = os.path.join(DATA, "verl_rollout_dump.jsonl")
    res = import_file(path, "verl")
    assert len(res.traces) == 2 and res.problems[0].line == 3 and "output" in res.problems[0].reason
    simple, tools = res.traces
    assert [m["role"] for m in simple.messages] == ["system", "user", "assistant"]
    assert simple.messages[2]["content"] == "2+2 = 4."
    assert simple.metadata["score"] == 1.0 and simple.metadata["step"] == 3 and simple.metadata["gts"] == "4"
    assert simple.metadata["messages"] == "recovered" and simple.metadata["recovered_from"] == "role_lines"
    assert_rendered(simple, qwen3)
    assert [m["role"] for m in tools.messages] == ["user", "assistant", "tool", "assistant"]
    assert tools.tools[0]["function"]["name"] == "get_current_temperature"
    assert tools.messages[2]["content"] == '{"temperature": 72, "city": "Seattle, WA, USA"}'
    assert tools.messages[2]["tool_call_id"] == tools.messages[1]["tool_calls"][0]["id"]
    assert_rendered(tools, qwen3)


# ---- openai-chat ------------------------------------------------------------------------------


def test_openai_chat_logs(qwen3):
    path = os.path.join(DATA, "openai_chat.jsonl")
    res = import_file(path)
    assert res.formats == {"openai-chat": 5}
    assert [(p.line) for p in res.problems] == [3, 4]
    assert "no messages" in res.problems[0].reason and "invalid JSON" in res.problems[1].reason
    by = {t.id: t for t in res.traces}
    c1 = by["chat-1"]
    assert c1.messages[-1]["tool_calls"][0]["function"]["arguments"] == {"city": "Auckland", "unit": "c"}
    assert c1.metadata["request"]["temperature"] == 0.7 and c1.metadata["finish_reason"] == "tool_calls"
    assert c1.metadata["import"] == {"file": "openai_chat.jsonl", "line": 1}
    c2 = by["chat-2"]
    assert c2.messages[0]["content"] == "Weather in Oslo?"  # content parts joined
    assert c2.messages[2]["name"] == "get_weather"  # filled from the call
    bad = by["chat-badargs"]
    (gen,) = [s for s in bad.steps if s.state == "generating"]
    assert gen.parse_errors and bad.messages[-1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lima"'
    assert by["batch-7"].messages[0] == {"role": "system", "content": "Be brief."}
    ln = by["chat-len"]
    assert ln.termination_reason == "response_length" and ln.steps[-2].finish_reason == "length"
    for t in res.traces:
        if t.id != "chat-badargs":
            assert_rendered(t, qwen3)


def test_openai_chat_several_choices_and_legacy_functions(qwen3):
    rec = {
        "request": {"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f", "parameters": {"type": "object", "properties": {}}}]},
        "response": {"choices": [
            {"message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"},
            {"message": {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}, "finish_reason": "function_call"},
        ]},
    }
    res = import_records([rec], "openai-chat", bundle=qwen3)
    a, b = res.traces
    assert a.id.endswith("-0") and b.id.endswith("-1") and b.metadata["choice"] == 1
    assert b.messages[-1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {}}
    assert a.tools[0]["function"]["name"] == "f"


def test_seed000_broken_trace_imports_with_an_orphan(qwen3):
    from backend.checks.diagnostics import check

    res = import_file(os.path.join(DATA, "seed000_broken.json"))
    (t,) = res.traces
    text = qwen3.tokenizer.decode(t.input_ids)
    # the render of the seed: a <tool_response> right after the user turn
    assert "Weather in Auckland<|im_end|>\n<|im_start|>user\n<tool_response>" in text
    assert "orphan_tool_message" in {f.code for f in check(t, qwen3)}


# ---- sharegpt / HF rows ------------------------------------------------------------------------


def test_sharegpt_hermes_and_llamafactory(qwen3):
    path = os.path.join(DATA, "sharegpt.jsonl")
    assert detect(path) == "sharegpt"
    res = import_file(path)
    assert [t.id for t in res.traces] == ["h-1", "h-2", "h-3"]
    assert [(p.line, "narrator" in p.reason) for p in res.problems] == [(3, True)]
    h1, h2, h3 = res.traces
    # tools read out of the system prompt's <tools> block, not rendered a second time
    assert h1.tools[0]["function"]["name"] == "get_stock_price" and h1.metadata["tools_in_system_prompt"]
    assert qwen3.tokenizer.decode(h1.input_ids).count("get_stock_price") == 2  # the system prompt and the call, not a second tools block
    assert h1.messages[2]["tool_calls"][0]["function"] == {"name": "get_stock_price", "arguments": {"symbol": "AAPL"}}
    assert h1.messages[3] == {"role": "tool", "content": '{"symbol": "AAPL", "price": 187.3}', "tool_call_id": "call_1", "name": "get_stock_price"}
    assert_rendered(h1, qwen3)
    # an unreadable call stays visible in the content and is a parse error on its step
    assert "<tool_call>" in h2.messages[2]["content"] and "tool_calls" not in h2.messages[2]
    assert [s for s in h2.steps if s.state == "generating"][0].parse_errors
    # LLaMA-Factory: function_call / observation turns, tools as a JSON string of bare functions
    assert [m["role"] for m in h3.messages] == ["user", "assistant", "tool", "assistant"]
    assert h3.messages[1]["tool_calls"][0]["function"]["arguments"] == {"symbol": "IBM"}
    assert h3.tools[0]["type"] == "function" and not h3.metadata.get("tools_in_system_prompt")
    assert_rendered(h3, qwen3)


def test_hf_messages_rows_from_parquet(tmp_path, qwen3):
    import pandas as pd

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    conv = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": '<think>\nLook it up.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'},
        {"role": "tool", "content": "3C"},
        {"role": "assistant", "content": "It is 3C."},
    ]
    structured = [conv[0], {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}, conv[2], conv[3]]
    p = tmp_path / "rows.parquet"
    pd.DataFrame({"messages": [json.dumps(conv), json.dumps(structured), "[not json"], "tools": [json.dumps(tools)] * 3}).to_parquet(p)
    assert detect(str(p)) == "sharegpt"
    res = import_file(str(p), "sharegpt")
    assert res.unit == "row" and [pr.line for pr in res.problems] == [3]
    a, b = res.traces
    assert a.messages[1]["reasoning_content"].strip() == "Look it up." and a.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert a.messages[2]["name"] == "get_weather"
    assert b.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert a.metadata["import"] == {"file": "rows.parquet", "row": 1}
    for t in (a, b):
        assert_rendered(t, qwen3)
    # native nested columns (not JSON strings) too
    p2 = tmp_path / "native.parquet"
    pd.DataFrame({"messages": [structured]}).to_parquet(p2)
    res2 = import_file(str(p2), "sharegpt")
    assert len(res2.traces) == 1 and not res2.problems, res2.problems


# ---- detection, errors, CLI ---------------------------------------------------------------------


def test_detect_records():
    assert detect({"items": []}) == "agents-sdk"
    assert detect([{"type": "function_call_output", "call_id": "x", "output": ""}]) == "agents-sdk"
    assert detect({"prompt_ids": [1], "response_ids": [2]}) == "verl"
    assert detect({"input": "a", "output": "b"}) == "verl"
    assert detect({"request": {"messages": []}}) == "openai-chat"
    assert detect({"messages": [{"role": "user", "content": "hi"}]}) == "openai-chat"
    assert detect({"conversations": []}) == "sharegpt"
    assert detect({"messages": [{"from": "human", "value": "hi"}]}) == "sharegpt"
    assert detect({"messages": [{"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"}]}) == "sharegpt"
    assert detect({"format_version": 1, "steps": []}) == "trace"
    assert detect({"foo": 1}) is None
    assert set(FORMATS) == {"otel", "langsmith", "mlflow", "nemo-gym", "openai-responses", "anthropic", "agents-sdk", "verifiers", "prime-rl", "verl", "trl", "skyrl", "nemo-rl", "slime",
                            "agentlightning", "rllm", "art", "areal", "tinker", "pydantic-ai", "langchain", "smolagents", "sharegpt", "openai-chat"}
    assert FORMATS[-2:] == ("sharegpt", "openai-chat")  # the generic ones are tried last


def test_our_traces_pass_through_auto(tmp_path, qwen3):
    t = import_file(os.path.join(DATA, "seed000_broken.json")).traces[0]
    p = tmp_path / "mixed.jsonl"
    p.write_text(t.to_json() + "\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n" + json.dumps({"hello": 1}) + "\n")
    res = import_file(str(p))
    assert res.formats == {"trace": 1, "openai-chat": 1}
    assert res.traces[0] == t
    assert res.problems[0].line == 3 and "unrecognised" in res.problems[0].reason


def test_unrenderable_messages_still_import(qwen3):
    """A template that raises on the messages: the trace keeps messages, no ids, and says why."""
    tpl = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}"
    b = qwen3.with_template(tpl)
    res = import_records([{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}], "openai-chat", bundle=b)
    (t,) = res.traces
    assert t.metadata["ids"] == "none" and "no tools here" in t.metadata["render_error"] and t.input_ids == []


def _cli(*args):
    return run_cli(*args)


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_cli_import(tmp_path):
    out = tmp_path / "t.jsonl"
    r = _cli("import", "--from", "openai-chat", os.path.join(DATA, "openai_chat.jsonl"), "--out", str(out), "--json")
    assert r.returncode == 1, r.stderr  # bad records: the good ones are written, the exit status says so
    assert r.stderr.startswith("error: 2 of 7 record(s)") and len(r.stderr.strip().splitlines()) == 1
    s = json.loads(r.stdout)
    assert s["traces"] == 5 and s["ids"] == {"rendered": 5} and [p["line"] for p in s["problems"]] == [3, 4]
    from backend.trace import load_traces

    assert len(load_traces(str(out)).traces) == 5
    r = _cli("import", os.path.join(DATA, "sharegpt.jsonl"), "--out", str(out))
    assert r.returncode == 1 and "line 3: conversations[0] has unknown speaker 'narrator'" in r.stdout
    r = _cli("import", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = _cli("import", os.path.join(DATA, "sharegpt.jsonl"), "--out", str(out), "--tokenizer", "no/such-tokenizer-here")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
