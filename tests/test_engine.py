"""The agent loop against the seed-001 numbers, every termination condition, tool failures,
truncation, parallel calls, cancellation and trace round-trips. Scripted generator: the
tokens are exactly the scripted text + EOS, so expectations are computed independently with
the tokenizer, not taken from the engine."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.engine import AgentLoop, ConfigError, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tokens.rendering import render
from backend.tools import ToolRegistry
from backend.trace import Trace


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".

    Returns:
        the temperature, the location, and the unit in a dict
    """
    return {"temperature": 72, "city": city}


def fail_always(x: str):
    """A tool that raises.

    Args:
        x: anything
    """
    raise RuntimeError("backend down")


def slow_tool(x: str):
    """A tool that hangs.

    Args:
        x: anything
    """
    time.sleep(5)
    return "late"


def long_text(n: int):
    """Returns n characters.

    Args:
        n: how many
    """
    return "".join(chr(ord("a") + i % 26) for i in range(n))


SEATTLE = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL_SEATTLE = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
ANSWER = "The current temperature in Seattle, WA, USA is 72°F."


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def run_loop(bundle, script, tools=None, messages=SEATTLE, **cfg) -> Trace:
    gen = ScriptedGenerator(bundle.tokenizer, script)
    reg = ToolRegistry.from_functions(tools if tools is not None else [get_current_temperature])
    loop = AgentLoop(gen, bundle, tools=reg, config=LoopConfig(**cfg))
    return asyncio.run(loop.run(messages))


def runs(mask: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return [tuple(x) for x in out]


def test_seed_001_weather_scenario(qwen3):
    """The seed's numbers: verl before 0.9 (tool_turns legacy). The default, continuous tokens,
    is tests/test_continuous.py (25·29·16)."""
    t = run_loop(qwen3, [CALL_SEATTLE, ANSWER], apply_chat_template_kwargs={"enable_thinking": False}, tool_turns="legacy")
    assert len(t.prompt_ids) == 178
    assert runs(t.response_mask) == [(1, 25), (0, 28), (1, 16)]
    assert t.termination_reason == "no_tool_calls"
    tok = qwen3.tokenizer
    # the prompt is exactly what apply_chat_template gives
    ref = tok.apply_chat_template(SEATTLE, tools=t.tools, add_generation_prompt=True, tokenize=True, return_dict=False, chat_template=qwen3.chat_template)
    assert t.prompt_ids == list(ref)
    # the response decodes to the seed's text
    assert tok.decode(t.response_ids) == (
        CALL_SEATTLE + "<|im_end|><|im_start|>user\n<tool_response>\n"
        '{"temperature": 72, "city": "Seattle, WA, USA"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
        + ANSWER + "<|im_end|>"
    )
    assert [s.state for s in t.steps] == ["pending", "generating", "processing_tools", "generating", "terminated"]
    gen1, tools_step, gen2 = t.steps[1], t.steps[2], t.steps[3]
    assert (gen1.start, gen1.end, gen1.mask) == (178, 203, 1)
    assert (tools_step.start, tools_step.end, tools_step.mask) == (203, 231, 0)
    assert (gen2.start, gen2.end, gen2.mask) == (231, 247, 1)
    assert gen1.tool_calls[0].name == "get_current_temperature"
    assert gen1.tool_calls[0].arguments == {"city": "Seattle, WA, USA"}
    assert tools_step.tool_results[0].ok and tools_step.tool_results[0].content == '{"temperature": 72, "city": "Seattle, WA, USA"}'
    roles = [m["role"] for m in t.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1]["tool_calls"][0]["function"] == {"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}
    assert t.messages[2]["tool_call_id"] == t.messages[1]["tool_calls"][0]["id"]
    assert t.messages[3]["content"] == ANSWER
    # message spans: the prompt's messages, then one per added message, covering every token
    covered = sorted((s.start, s.end) for s in t.message_spans)
    assert covered[0][0] == 0 and covered[-1][1] == 247


def test_full_rerender_differs_by_newline_after_im_end(qwen3):
    """The retokenization drift users hit: the loop stops at <|im_end|>, the template writes
    <|im_end|>\\n. The engine keeps the generated tokens; it must not 'fix' them. Legacy tool
    turns miss the '\\n' at the tool boundary too; continuous tokens insert it there (context)."""
    legacy = run_loop(qwen3, [CALL_SEATTLE, ANSWER], tool_turns="legacy")
    full = render(qwen3, legacy.messages, legacy.tools, add_generation_prompt=False, spans=False)
    assert len(legacy.input_ids) == 247 and len(full.token_ids) == 249
    cont = run_loop(qwen3, [CALL_SEATTLE, ANSWER])
    assert len(cont.input_ids) == 248 and full.token_ids[:248] == cont.input_ids
    assert cont.response_ids[:25] == legacy.response_ids[:25]  # the generated ids, untouched


def test_qwen25_tool_turn_strips_default_system_prompt():
    b = load_tokenizer("qwen2.5")
    t = run_loop(b, [CALL_SEATTLE, ANSWER], tool_turns="legacy")
    tools_step = t.steps[2]
    assert tools_step.info.method == "verl" and tools_step.info.stripped_prefix_tokens == 21
    assert "You are Qwen" not in tools_step.text
    assert tools_step.text.startswith("<|im_start|>user\n<tool_response>")
    assert runs(t.response_mask)[1] == (0, 28)


def test_parallel_calls_limited(qwen3):
    three = "\n".join(call("get_current_temperature", city=c) for c in ["A", "B", "C"])
    t = run_loop(qwen3, [three, "done"], max_parallel_calls=2)
    tools_step = t.steps[2]
    assert [r.content for r in tools_step.tool_results] == [json.dumps({"temperature": 72, "city": c}) for c in "AB"]
    assert tools_step.info.dropped_calls == 1
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert tools_step.text.count("<tool_response>") == 2


@pytest.mark.parametrize(
    "side,expected",
    [
        ("left", "abcdefghij...(truncated)"),
        ("right", "(truncated)...klmnopqrst"),
        ("middle", "abcde...(truncated)...pqrst"),
    ],
)
def test_tool_response_truncation(qwen3, side, expected):
    t = run_loop(qwen3, [call("long_text", n=20), "ok"], tools=[long_text], max_tool_response_length=10, tool_response_truncate_side=side)
    res = t.steps[2].tool_results[0]
    assert res.content == expected and res.truncated and res.original_length == 20
    assert t.messages[2]["content"] == expected
    assert f"<tool_response>\n{expected}\n</tool_response>" in t.steps[2].text


def test_termination_response_length_during_generation(qwen3):
    t = run_loop(qwen3, [CALL_SEATTLE, ANSWER], response_length=10)
    assert t.termination_reason == "response_length"
    assert len(t.response_ids) == 10 and t.response_mask == [1] * 10
    assert t.steps[1].finish_reason == "length"


@pytest.mark.parametrize("mode,tool_tokens", [("legacy", 28), ("continuous", 29)])
def test_termination_response_length_on_tool_turn(qwen3, mode, tool_tokens):
    # 25 generated + 28 tool tokens (29 with the inserted separator) >= 40: verl drops the tool turn and stops
    t = run_loop(qwen3, [CALL_SEATTLE, ANSWER], response_length=40, tool_turns=mode)
    assert t.termination_reason == "response_length"
    assert t.response_mask == [1] * 25
    assert t.steps[2].state == "processing_tools" and t.steps[2].info.not_appended is not None
    assert t.steps[2].info.would_append_tokens == tool_tokens


def test_termination_max_assistant_turns(qwen3):
    t = run_loop(qwen3, [CALL_SEATTLE, CALL_SEATTLE, CALL_SEATTLE], max_assistant_turns=2)
    assert t.termination_reason == "max_assistant_turns"
    assert sum(1 for s in t.steps if s.state == "generating") == 2


def test_termination_max_user_turns(qwen3):
    t = run_loop(qwen3, [CALL_SEATTLE, CALL_SEATTLE, CALL_SEATTLE], max_user_turns=1)
    assert t.termination_reason == "max_user_turns"
    assert sum(1 for s in t.steps if s.state == "processing_tools") == 1


def test_termination_malformed_tool_call(qwen3):
    t = run_loop(qwen3, ['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Sea\n</tool_call>'])
    assert t.termination_reason == "malformed_tool_call"
    assert t.steps[1].parse_errors and not t.steps[1].tool_calls
    assert t.steps[1].parse_errors[0].span is not None


def test_malformed_call_does_not_hide_good_one(qwen3):
    text = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": \n</tool_call>\n' + call("get_current_temperature", city="Oslo")
    t = run_loop(qwen3, [text, "ok"])
    assert [c.arguments for c in t.steps[1].tool_calls] == [{"city": "Oslo"}]
    assert len(t.steps[1].parse_errors) == 1
    assert t.termination_reason == "no_tool_calls"


def test_generation_error_when_script_runs_out(qwen3):
    t = run_loop(qwen3, [CALL_SEATTLE])
    assert t.termination_reason == "generation_error"
    assert "turn 2" in t.steps[3].error


def test_render_error_is_reported_not_raised():
    b = load_tokenizer("qwen3", template="{{ raise_exception('bad template') }}")
    t = run_loop(b, [ANSWER])
    assert t.termination_reason == "render_error"
    assert "bad template" in t.steps[0].error


@pytest.mark.parametrize(
    "script,tools,kind,needle",
    [
        ([call("nope", x=1), "ok"], [get_current_temperature], "unknown_tool", "nope"),
        ([call("get_current_temperature", town="x"), "ok"], [get_current_temperature], "invalid_arguments", "city"),
        ([call("fail_always", x="1"), "ok"], [fail_always], "exception", "backend down"),
    ],
)
def test_tool_failures_are_fed_back(qwen3, script, tools, kind, needle):
    t = run_loop(qwen3, script, tools=tools)
    res = t.steps[2].tool_results[0]
    assert not res.ok and res.error == kind and needle in res.content
    assert t.messages[2]["role"] == "tool" and t.messages[2]["content"] == res.content
    assert t.termination_reason == "no_tool_calls"  # the loop went on to the second turn
    assert t.step_errors() >= 1


def test_tool_timeout(qwen3):
    t0 = time.time()
    t = run_loop(qwen3, [call("slow_tool", x="1"), "ok"], tools=[slow_tool], tool_timeout_s=0.3)
    assert time.time() - t0 < 4
    res = t.steps[2].tool_results[0]
    assert res.error == "timeout" and not res.ok


def test_tool_error_can_terminate(qwen3):
    t = run_loop(qwen3, [call("fail_always", x="1"), "ok"], tools=[fail_always], on_tool_error="terminate")
    assert t.termination_reason == "tool_error"
    assert t.response_mask == [1] * len(t.response_mask)


def test_bad_config_is_rejected():
    for bad in [{"response_length": 0}, {"tool_response_truncate_side": "top"}, {"max_parallel_calls": 0}, {"sampling": {"temprature": 1}}]:
        with pytest.raises(ConfigError):
            LoopConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="unknown loop config"):
        LoopConfig.from_dict({"max_turns": 3})


def test_cancel_aborts_generation_and_keeps_partial_tokens(qwen3):
    async def go():
        gen = ScriptedGenerator(qwen3.tokenizer, [ANSWER * 20], token_delay_s=0.01)
        loop = AgentLoop(gen, qwen3, config=LoopConfig())
        cancel = asyncio.Event()
        events = []
        task = asyncio.create_task(loop.run(SEATTLE, cancel=cancel, on_event=events.append))
        await asyncio.sleep(0.2)
        cancel.set()
        return await task, events

    t, events = asyncio.run(go())
    assert t.termination_reason == "cancelled"
    full = len(qwen3.tokenizer.encode(ANSWER * 20)) + 1
    assert 0 < len(t.response_ids) < full
    assert t.steps[1].finish_reason == "abort"
    streamed = [tid for e in events if e.kind == "tokens" for tid in e.token_ids]
    assert streamed == t.response_ids


def test_events_stream_steps_in_order(qwen3):
    events = []
    gen = ScriptedGenerator(qwen3.tokenizer, [CALL_SEATTLE, ANSWER])
    loop = AgentLoop(gen, qwen3, tools=ToolRegistry.from_functions([get_current_temperature]))
    t = asyncio.run(loop.run(SEATTLE, on_event=events.append))
    assert [e.step.state for e in events if e.kind == "step"] == [s.state for s in t.steps]
    assert [e.state for e in events if e.kind == "state"] == ["pending", "generating", "processing_tools", "generating"]


def test_step_events_carry_the_messages_each_step_appended(qwen3):
    events = []
    gen = ScriptedGenerator(qwen3.tokenizer, [CALL_SEATTLE, ANSWER])
    loop = AgentLoop(gen, qwen3, tools=ToolRegistry.from_functions([get_current_temperature]))
    t = asyncio.run(loop.run(SEATTLE, on_event=events.append))
    steps = [e for e in events if e.kind == "step"]
    assert [e.messages for e in steps] == [[t.messages[i] for i in s.messages_added] for s in t.steps]
    assert [[m["role"] for m in e.messages] for e in steps] == [["user"], ["assistant"], ["tool"], ["assistant"], []]
    assert steps[1].messages[0]["tool_calls"][0]["function"]["name"] == "get_current_temperature"
    assert steps[3].messages[0]["content"] == ANSWER
    assert all(e.messages == [] for e in events if e.kind != "step")
    steps[3].messages[0]["content"] = "changed"  # copies: the trace is not touched
    assert t.messages[-1]["content"] == ANSWER


def test_trace_round_trip_is_lossless(qwen3, tmp_path):
    from backend.trace import load_traces, write_jsonl

    t = run_loop(qwen3, [CALL_SEATTLE, ANSWER])
    again = Trace.from_json(t.to_json())
    assert again == t and again.to_dict() == t.to_dict()
    p = tmp_path / "t.jsonl"
    write_jsonl([t, t], str(p))
    res = load_traces(str(p))
    assert res.traces == [t, t] and not res.problems


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(st.one_of(TEXT, st.builds(lambda c: call("get_current_temperature", city=c), TEXT)), min_size=1, max_size=4))
def test_property_mask_matches_generated_text(qwen3, script):
    t = run_loop(qwen3, script + ["end"], response_length=100000)
    assert len(t.response_ids) == len(t.response_mask)
    tok = qwen3.tokenizer
    gen_steps = [s for s in t.steps if s.state == "generating"]
    for s, text in zip(gen_steps, script + ["end"]):
        ids = t.input_ids[s.start : s.end]
        assert all(m == 1 for m in t.full_mask[s.start : s.end])
        expected = tok.encode(text, add_special_tokens=False)
        if not expected or expected[-1] != tok.eos_token_id:
            expected.append(tok.eos_token_id)
        assert ids == expected
        assert tok.decode(ids) == tok.decode(expected)
    # every mask-1 token belongs to a generating step and nothing else
    ones = [i for i, m in enumerate(t.full_mask) if m == 1]
    assert ones == [i for s in gen_steps for i in range(s.start, s.end)]


def test_stop_inside_a_tool_call_is_a_cut_turn_not_a_malformed_call(qwen3):
    """Stop pressed while the model writes a tool call: the turn ends ``cancelled``, the
    unfinished call is kept on the step as ``info["cut_tool_call"]`` (its text, where it starts),
    and no parse error is recorded (it was not the model's mistake); a complete call before it
    stays a call. The cancel is set from the token stream, once the call's JSON has begun."""
    script = "Let me check.\n" + call("get_current_temperature", city="Paris") + "\n" + CALL_SEATTLE

    async def go():
        gen = ScriptedGenerator(qwen3.tokenizer, [script], token_delay_s=0.002)
        loop = AgentLoop(gen, qwen3, tools=ToolRegistry.from_functions([get_current_temperature]),
                         config=LoopConfig(max_parallel_calls=2))
        cancel = asyncio.Event()
        streamed: list[int] = []

        def on_event(ev):
            if ev.kind == "tokens":
                streamed.extend(ev.token_ids)
                text = qwen3.tokenizer.decode(streamed)
                if text.count("<tool_call>") == 2 and '"name": "get_' in text.split("<tool_call>")[-1]:
                    cancel.set()

        return await loop.run(SEATTLE, cancel=cancel, on_event=on_event)

    t = asyncio.run(go())
    assert t.termination_reason == "cancelled"
    gen_step = t.steps[1]
    assert gen_step.finish_reason == "abort" and "</tool_call>" in gen_step.text
    assert gen_step.parse_errors == []
    assert [c.arguments for c in gen_step.tool_calls] == [{"city": "Paris"}]
    cut = gen_step.info.cut_tool_call
    assert len(cut) == 1 and cut[0]["raw"].startswith('<tool_call>\n{"name": "get_')
    assert not gen_step.text.endswith("</tool_call>")
    assert t.step_errors() == 0
    again = Trace.from_json(t.to_json())  # the cut call survives a round trip
    assert again.steps[1].info.cut_tool_call == cut
