"""backend.families.gpt_oss's Harmony renderer against its oracles: openai-harmony's own renderer, fed conversations
built here straight from harmony's message classes (not through our conversion), and trl's
``gptoss.jinja`` through transformers for :func:`template_differences`.

Each generated conversation is a :class:`Scenario`; :func:`hf_messages` and :func:`oracle_messages`
turn it into our HF-format messages and into Harmony ``Message`` objects independently."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
)

from backend.engine import AgentLoop, LoopConfig
from backend.errors import UserError
from backend.families.gpt_oss import HarmonyRenderer, HarmonyRenderError, harmony_encoding, template_differences
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import TokenizerBundle
from backend.parsers import get_parser
from backend.tokens.rendering import RenderError
from backend.tools import ToolRegistry
from backend.trace.builder import mask_runs

DATE = "2025-06-28"
STRINGS = ["Paris", "Zürich 中文 😀", 'say "hi"\\n', "tab\there\nnewline", "", "a/b\\c", "🧬 𝔘ñï", "x <|end|> y"]
RESULTS = ["sunny, 21°C", "42", '{"ok": true, "items": [1, 2]}', "Error: not found", "😀 done", '"quoted"', "[]", "",
           "a <|call|> b", "line1\nline2"]


# ---- scenarios and the two independent conversions -----------------------------------------


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] | str  # an object, or the JSON text as the model wrote it
    id: str

    def body(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Round:
    reasoning: str | None
    preamble: str | None
    calls: list[Call]
    results: list[str]


@dataclass
class Scenario:
    system: str | None
    tools: list[dict[str, Any]]
    user: str
    rounds: list[Round]
    final: tuple[str | None, str] | None = None  # (reasoning, answer)
    kwargs: dict[str, Any] = field(default_factory=dict)


def hf_messages(s: Scenario) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if s.system is not None:
        out.append({"role": "system", "content": s.system})
    out.append({"role": "user", "content": s.user})
    for r in s.rounds:
        m: dict[str, Any] = {"role": "assistant", "content": r.preamble or "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in r.calls]}
        if r.reasoning:
            m["reasoning_content"] = r.reasoning
        out.append(m)
        for c, res in zip(r.calls, r.results):
            out.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": res})
    if s.final is not None:
        m = {"role": "assistant", "content": s.final[1]}
        if s.final[0]:
            m["thinking"] = s.final[0]
        out.append(m)
    return out


def oracle_messages(s: Scenario) -> list[Message]:
    """The conversation written with openai-harmony's classes, as its README does."""
    sc = SystemContent.new()
    kw = s.kwargs
    if "reasoning_effort" in kw:
        sc = sc.with_reasoning_effort({"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
                                       "high": ReasoningEffort.HIGH}[kw["reasoning_effort"]])
    if "model_identity" in kw:
        sc = sc.with_model_identity(kw["model_identity"])
    if kw.get("conversation_start_date"):
        sc = sc.with_conversation_start_date(kw["conversation_start_date"])
    msgs = [Message.from_role_and_content(Role.SYSTEM, sc)]
    if s.system is not None or s.tools:
        dev = DeveloperContent.new()
        if s.system:
            dev = dev.with_instructions(s.system)
        if s.tools:
            dev = dev.with_function_tools([ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                                               parameters=t["function"].get("parameters"))
                                           for t in s.tools])
        msgs.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    msgs.append(Message.from_role_and_content(Role.USER, s.user))
    for r in s.rounds:
        if r.reasoning:
            msgs.append(Message.from_role_and_content(Role.ASSISTANT, r.reasoning).with_channel("analysis"))
        if r.preamble:
            msgs.append(Message.from_role_and_content(Role.ASSISTANT, r.preamble).with_channel("commentary"))
        for c in r.calls:
            msgs.append(Message.from_role_and_content(Role.ASSISTANT, c.body()).with_channel("commentary")
                        .with_recipient(f"functions.{c.name}").with_content_type("<|constrain|>json"))
        for c, res in zip(r.calls, r.results):
            msgs.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{c.name}"), res)
                        .with_channel("commentary").with_recipient("assistant"))
    if s.final is not None:
        if s.final[0]:
            msgs.append(Message.from_role_and_content(Role.ASSISTANT, s.final[0]).with_channel("analysis"))
        msgs.append(Message.from_role_and_content(Role.ASSISTANT, s.final[1]).with_channel("final"))
    return msgs


def oracle_ids(msgs: list[Message], *, gen: bool, drop: bool = True) -> list[int]:
    enc = harmony_encoding()
    conv, cfg = Conversation.from_messages(msgs), RenderConversationConfig(auto_drop_analysis=drop)
    if gen:
        return enc.render_conversation_for_completion(conv, Role.ASSISTANT, cfg)
    return enc.render_conversation_for_training(conv, cfg)


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    schemas = {
        "get_weather": {"type": "object", "properties": {"city": {"type": "string", "description": "the city é"},
                                                         "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}},
                        "required": ["city"]},
        "search_docs": {"type": "object", "properties": {"q": {"type": "string"}, "top": {"type": "integer"},
                                                         "filters": {"type": "array", "items": {"type": "string"}}},
                        "required": ["q"]},
        "set_config": {"type": "object", "properties": {"opts": {"type": "object", "properties": {
            "deep": {"type": "object", "properties": {"flag": {"type": "boolean"}}}}}}},
        "no_args": {"type": "object", "properties": {}},
        "ping": None,
    }
    out = []
    for name in rng.sample(sorted(schemas), rng.randint(2, 5)):
        fn: dict[str, Any] = {"name": name, "description": f"{name.replace('_', ' ')} tool ✓"}
        if schemas[name] is not None:
            fn["parameters"] = schemas[name]
        out.append({"type": "function", "function": fn})
    return out


def _arguments(rng: random.Random, name: str) -> dict[str, Any] | str:
    choice = rng.random()
    if name in ("no_args", "ping") or choice < 0.1:
        return {}
    if choice < 0.25:  # the model's own text, kept verbatim (compact separators, escapes)
        return json.dumps({"q": rng.choice(STRINGS)}, separators=(",", ":"))
    if choice < 0.4:
        return {"opts": {"deep": {"flag": rng.random() < 0.5, "list": [1, {"a": None}], "s": rng.choice(STRINGS)}}}
    return {"city": rng.choice(STRINGS), "n": rng.randint(-3, 1000)}


def scenario(seed: int, *, final: bool | None = None) -> Scenario:
    rng = random.Random(seed)
    tools = _tools(rng)
    rounds = []
    for i in range(rng.randint(0, 3)):
        calls = [Call(t["function"]["name"], _arguments(rng, t["function"]["name"]), f"call_{i}_{j}")
                 for j, t in enumerate(rng.sample(tools, rng.randint(1, min(3, len(tools)))))]
        rounds.append(Round(rng.choice([None, "Need a tool: " + rng.choice(STRINGS)]),
                            rng.choice([None, None, "Checking " + rng.choice(STRINGS)]),
                            calls, [rng.choice(RESULTS) for _ in calls]))
    want_final = rng.random() < 0.5 if final is None else final
    kwargs: dict[str, Any] = {}
    if rng.random() < 0.6:
        kwargs["reasoning_effort"] = rng.choice(["low", "medium", "high"])
    if rng.random() < 0.5:
        kwargs["conversation_start_date"] = DATE
    if rng.random() < 0.2:
        kwargs["model_identity"] = "You are a test model ✓."
    return Scenario(rng.choice([None, "You are terse.", "Règles: réponds en français.\n\n# Not a heading"]),
                    tools if rng.random() < 0.85 else [], rng.choice(STRINGS) or "hi", rounds,
                    (rng.choice([None, "All done: " + rng.choice(STRINGS)]), rng.choice(STRINGS) or "ok")
                    if want_final else None, kwargs)


@pytest.fixture(scope="module")
def renderer() -> HarmonyRenderer:
    return HarmonyRenderer()


# ---- render == openai-harmony ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("gen", [True, False])
def test_render_is_harmonys_own(renderer, seed, gen):
    s = scenario(seed)
    text, ids = renderer.render(hf_messages(s), s.tools, add_generation_prompt=gen, kwargs=s.kwargs)
    expected = oracle_ids(oracle_messages(s), gen=gen)
    assert ids == expected
    assert text == harmony_encoding().decode(expected)
    assert text.endswith("<|start|>assistant") == gen
    if not gen and s.final is not None:
        assert text.endswith(s.final[1] + "<|return|>")  # the EOS the model generated, as trl writes it


def test_generated_scenarios_cover_the_cases():
    ss = [scenario(i) for i in range(40)]
    rounds = [r for s in ss for r in s.rounds]
    assert any(len(r.calls) > 1 for r in rounds)  # parallel calls
    assert any(len(s.rounds) >= 2 for s in ss)  # two tool rounds
    assert any(r.reasoning for r in rounds) and any(s.final and s.final[0] for s in ss)
    assert any(isinstance(c.arguments, str) for r in rounds for c in r.calls)
    assert any(c.arguments == {} for r in rounds for c in r.calls)
    assert any(s.system for s in ss) and any(not s.tools for s in ss)
    assert {s.kwargs.get("reasoning_effort") for s in ss} >= {"low", "medium", "high", None}


def test_parallel_calls_are_separate_messages(renderer):
    s = Scenario(None, _tools(random.Random(1)), "go", [Round(None, None, [
        Call("a_fn", {"x": 1}, "c1"), Call("b_fn", {}, "c2")], ["one", "two"])])
    text, ids = renderer.render(hf_messages(s), None, add_generation_prompt=True)
    assert ids == oracle_ids(oracle_messages(Scenario(None, [], "go", s.rounds)), gen=True)
    assert text.count("<|call|>") == 2
    assert ('<|start|>assistant<|channel|>commentary to=functions.a_fn <|constrain|>json<|message|>{"x": 1}<|call|>'
            '<|start|>assistant<|channel|>commentary to=functions.b_fn <|constrain|>json<|message|>{}<|call|>') in text
    assert "<|start|>functions.b_fn<|channel|>commentary to=assistant<|message|>two<|end|>" in text


def test_special_token_names_in_text_stay_text(renderer):
    """Harmony encodes ``<|end|>`` inside a message as ordinary text: one special token per
    message end, not one more."""
    _, ids = renderer.render([{"role": "user", "content": "x <|end|> y"}], add_generation_prompt=False)
    end = renderer.tokenizer.convert_tokens_to_ids("<|end|>")
    assert ids.count(end) == 2  # the system message's and the user message's


def test_kwargs_reach_the_system_message(renderer):
    msgs = [{"role": "user", "content": "hi"}]
    text, _ = renderer.render(msgs, kwargs={"reasoning_effort": "HIGH", "model_identity": "I am T.",
                                            "conversation_start_date": DATE, "knowledge_cutoff": "2025-01"})
    assert text.startswith(f"<|start|>system<|message|>I am T.\nKnowledge cutoff: 2025-01\nCurrent date: {DATE}\n\n"
                           "Reasoning: high\n\n")
    assert "Current date" not in renderer.render(msgs)[0]  # harmony's SystemContent default: no date line
    today = renderer.render(msgs, kwargs={"conversation_start_date": "today"})[0]
    assert "Current date: 20" in today
    pinned = HarmonyRenderer(conversation_start_date=DATE)
    assert f"Current date: {DATE}" in pinned.render(msgs)[0]
    assert "Current date" not in pinned.render(msgs, kwargs={"conversation_start_date": None})[0]
    notes = renderer.render_detailed(msgs, kwargs={"enable_thinking": True}).notes
    assert any("ignored enable_thinking" in n for n in notes)


def test_tool_message_name_from_its_call(renderer):
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "k1", "type": "function", "function": {"name": "first", "arguments": {}}},
                {"id": "k2", "type": "function", "function": {"name": "second", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "k2", "content": "B"},
            {"role": "tool", "content": "A"}]
    text, _ = renderer.render(msgs)
    assert "<|start|>functions.second<|channel|>commentary to=assistant<|message|>B<|end|>" in text
    assert "<|start|>functions.first<|channel|>commentary to=assistant<|message|>A<|end|>" in text


# ---- the tool turn --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [s for s in range(60) if len(scenario(s, final=False).rounds) >= 1][:15])
def test_tool_turns_concatenate_to_the_full_render(renderer, seed):
    """prompt + each generated turn (harmony's ids for it) + each tool turn == harmony's render
    of the whole conversation, round after round."""
    s = scenario(seed, final=False)
    full = hf_messages(s)
    head = 2 if s.system is not None else 1
    _, seq = renderer.render(full[:head], s.tools, add_generation_prompt=True, kwargs=s.kwargs)
    hist = full[:head]
    for k, r in enumerate(s.rounds):
        done = Scenario(s.system, s.tools, s.user, s.rounds[:k], None, s.kwargs)
        upto_call = Scenario(s.system, s.tools, s.user, [*s.rounds[:k], Round(r.reasoning, r.preamble, r.calls, [])],
                             None, s.kwargs)
        before = oracle_ids(oracle_messages(done), gen=True)
        generated = oracle_ids(oracle_messages(upto_call), gen=False)
        assert generated[: len(before)] == before
        seq = seq + generated[len(before):]
        assistant = full[len(hist)]
        results = full[len(hist) + 1: len(hist) + 1 + len(r.calls)]
        assert assistant["role"] == "assistant" and all(m["role"] == "tool" for m in results)
        text, ids = renderer.tool_turn([*hist, assistant], results, s.tools, kwargs=s.kwargs)
        assert text == harmony_encoding().decode(ids) and text.endswith("<|start|>assistant")
        seq = seq + ids
        hist = [*hist, assistant, *results]
        assert seq == oracle_ids(oracle_messages(Scenario(s.system, s.tools, s.user, s.rounds[:k + 1], None, s.kwargs)),
                                 gen=True)


def _two_round_seeds() -> set[int]:
    return {s for s in range(60) if len(scenario(s, final=False).rounds) >= 2}


def test_some_tool_turn_cases_have_two_rounds():
    picked = [s for s in range(60) if len(scenario(s, final=False).rounds) >= 1][:15]
    assert len(set(picked) & _two_round_seeds()) >= 3


def test_a_turn_ending_in_an_answer_is_refused_while_harmony_drops_analysis(renderer):
    """A final answer among the new messages makes Harmony drop the history's analysis: no suffix."""
    s = Scenario(None, [], "q", [Round("think first", None, [Call("f", {"a": 1}, "c1")], ["r"])], (None, "done"))
    msgs = hf_messages(s)
    with pytest.raises(HarmonyRenderError, match="auto_drop_analysis") as e:
        renderer.tool_turn(msgs[:2], msgs[2:])
    assert isinstance(e.value, UserError) and isinstance(e.value, RenderError)
    _, ids = renderer.tool_turn(msgs[:2], msgs[2:], kwargs={"auto_drop_analysis": False})
    assert renderer.decode(ids).endswith("<|channel|>final<|message|>done<|end|><|start|>assistant")


def test_after_an_answer_the_prompt_drops_analysis_that_the_next_tool_turn_brings_back(renderer):
    """Two rounds with a user message between them: the prompt of round 2 has round 1's analysis
    dropped (its last assistant message is a final one); once round 2 calls a tool, Harmony
    renders that analysis again. The tool turn is still a suffix, but the conversation's ids
    moved under the loop: the documented drift."""
    msgs = [{"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"}]
    _, prompt = renderer.render(msgs)
    assert "r1" not in renderer.decode(prompt)
    call = {"role": "assistant", "content": "", "reasoning_content": "r2",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}
    _, turn = renderer.tool_turn([*msgs, call], [{"role": "tool", "name": "f", "content": "x"}])
    full_text, full = renderer.render([*msgs, call, {"role": "tool", "name": "f", "content": "x"}])
    assert full[-len(turn):] == turn
    assert "<|channel|>analysis<|message|>r1<|end|>" in full_text
    assert full[: len(prompt)] != prompt


# ---- the agent loop over a Harmony bundle -----------------------------------------------------

TOOL = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get the current temperature at a location.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}, "mock": "22"}
SCHEMA = {k: v for k, v in TOOL.items() if k != "mock"}
QUESTION = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL = {"name": "get_current_temperature", "arguments": {"city": "Seattle"}}
ANSWER = "It is 22 degrees in Seattle."
# the messages the agent loop ends with on the seed scenario (checked in the loop's test below)
SEED_MESSAGES = [
    *QUESTION,
    {"role": "assistant", "content": "", "reasoning_content": "I should look it up.", "tool_calls": [
        {"type": "function", "function": {"name": CALL["name"], "arguments": CALL["arguments"]}, "id": "call_1_0"}]},
    {"role": "tool", "content": "22", "name": CALL["name"], "tool_call_id": "call_1_0"},
    {"role": "assistant", "content": ANSWER},
]


def harmony_bundle(renderer: HarmonyRenderer) -> TokenizerBundle:
    return TokenizerBundle(renderer.tokenizer, "gpt-oss-harmony", "openai-harmony", "", "harmony",
                           stop_tokens=("<|call|>",), vocabulary="o200k_harmony", renderer=renderer)


def seed_script(calls: int = 1) -> list[str]:
    call = get_parser("harmony").format_calls([CALL])
    turn = "<|channel|>analysis<|message|>I should look it up.<|end|><|start|>assistant" + call + "<|call|>"
    return [turn] * calls + ["<|channel|>final<|message|>" + ANSWER]


async def _run(bundle: TokenizerBundle, script: list[str], kwargs: dict[str, Any] | None = None):
    gen = ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                            encode=bundle.encode_generated)
    cfg = LoopConfig(apply_chat_template_kwargs=dict(kwargs or {}))
    return await AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]), config=cfg).run(QUESTION)


def _seed_oracle(rounds: int, final: bool) -> list[Message]:
    tool = SCHEMA["function"]
    msgs = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
            Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_function_tools(
                [ToolDescription.new(tool["name"], tool["description"], parameters=tool["parameters"])])),
            Message.from_role_and_content(Role.USER, QUESTION[0]["content"])]
    for _ in range(rounds):
        msgs += [Message.from_role_and_content(Role.ASSISTANT, "I should look it up.").with_channel("analysis"),
                 Message.from_role_and_content(Role.ASSISTANT, '{"city": "Seattle"}').with_channel("commentary")
                 .with_recipient("functions.get_current_temperature").with_content_type("<|constrain|>json"),
                 Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_current_temperature"), "22")
                 .with_channel("commentary").with_recipient("assistant")]
    if final:
        msgs.append(Message.from_role_and_content(Role.ASSISTANT, ANSWER).with_channel("final"))
    return msgs


async def test_seed_scenario_through_the_agent_loop(renderer):
    bundle = harmony_bundle(renderer)
    script = seed_script()
    trace = await _run(bundle, script)
    assert trace.termination_reason == "no_tool_calls", [s.error for s in trace.steps]
    assert [(c.name, c.arguments) for c in next(s for s in trace.steps if s.state == "generating").tool_calls] == \
        [(CALL["name"], CALL["arguments"])]

    prompt = oracle_ids(_seed_oracle(0, False), gen=True)
    assert trace.prompt_ids == prompt
    t1 = bundle.encode_generated(script[0])  # ends on <|call|>: no EOS added
    t2 = [*bundle.encode_generated(script[1]), renderer.tokenizer.convert_tokens_to_ids("<|return|>")]
    assert t1 == harmony_encoding().encode(script[0], allowed_special="all")  # our encoding is tiktoken's
    after_tool = oracle_ids(_seed_oracle(1, False), gen=True)
    assert after_tool[: len(prompt) + len(t1)] == prompt + t1  # harmony renders the turn as the model wrote it
    t_tool = after_tool[len(prompt) + len(t1):]
    assert [tuple(r) for r in mask_runs(trace.response_mask)] == [(1, len(t1)), (0, len(t_tool)), (1, len(t2))]
    assert trace.response_ids == t1 + t_tool + t2
    assert trace.messages == SEED_MESSAGES
    step = next(s for s in trace.steps if s.state == "processing_tools")
    assert step.info.method == "continuous" and step.info.boundary is None  # Harmony: nothing between <|call|> and the tool

    # the whole sequence is harmony's training render with analysis kept; by default harmony
    # drops the call turn's analysis once the answer closes the conversation
    seq = trace.prompt_ids + trace.response_ids
    assert seq == oracle_ids(_seed_oracle(1, True), gen=False, drop=False)
    dropped = oracle_ids(_seed_oracle(1, True), gen=False)
    assert dropped != seq and len(seq) - len(dropped) == len(harmony_encoding().render(_seed_oracle(1, False)[3]))
    assert renderer.render(trace.messages, [SCHEMA], add_generation_prompt=False)[1] == dropped


async def test_two_tool_rounds_through_the_agent_loop_with_kwargs(renderer):
    bundle = harmony_bundle(renderer)
    kwargs = {"reasoning_effort": "high", "conversation_start_date": DATE, "auto_drop_analysis": False}
    trace = await _run(bundle, seed_script(2), kwargs)
    assert trace.termination_reason == "no_tool_calls", [s.error for s in trace.steps]
    assert [b for b, _ in mask_runs(trace.response_mask)] == [1, 0, 1, 0, 1]
    oracle = _seed_oracle(2, True)
    oracle[0] = Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(
        ReasoningEffort.HIGH).with_conversation_start_date(DATE))
    assert trace.prompt_ids + trace.response_ids == oracle_ids(oracle, gen=False, drop=False)
    assert renderer.render(trace.messages, [SCHEMA], add_generation_prompt=False, kwargs=kwargs)[1] == \
        trace.prompt_ids + trace.response_ids


# ---- trl's template against Harmony --------------------------------------------------------


def test_template_differences_name_the_known_ones_on_the_seed_conversation(renderer):
    diffs = template_differences(SEED_MESSAGES, [SCHEMA], renderer=renderer)
    text = "\n".join(diffs)
    assert diffs[0].startswith("trl's gptoss.jinja: ") and "first difference at token" in diffs[0]
    # the call header: recipient before the channel, no <|constrain|> in trl
    assert ("'<|start|>assistant to=functions.get_current_temperature<|channel|>commentary json<|message|>'"
            in text and "'<|start|>assistant<|channel|>commentary to=functions.get_current_temperature "
            "<|constrain|>json<|message|>'" in text)
    # the tool result: header order, and trl's tojson quoting of a string
    assert "'<|start|>functions.get_current_temperature to=assistant<|channel|>commentary<|message|>'" in text
    assert "'<|start|>functions.get_current_temperature<|channel|>commentary to=assistant<|message|>'" in text
    assert "trl quotes the body with tojson: '\"22\"', harmony writes it as is: '22'" in text
    # both end the answer with <|return|> (harmony's training render), so no end-token line
    assert "ends it with" not in text
    assert len(diffs) == 3, diffs

    # reasoning: trl keeps the answer's `thinking` (last message, no generation prompt) where
    # harmony drops it; before the answer, harmony writes the call turn's reasoning_content,
    # which trl's template never reads
    with_thinking = [*SEED_MESSAGES[:-1], {**SEED_MESSAGES[-1], "thinking": "Easy."}]
    d2 = template_differences(with_thinking, [SCHEMA], renderer=renderer)
    assert any(d.startswith("only trl writes the assistant analysis message") and "auto_drop_analysis" in d
               and "Easy." in d for d in d2), d2
    d3 = template_differences(SEED_MESSAGES[:3], [SCHEMA], renderer=renderer)
    assert any(d.startswith("only harmony writes the assistant analysis message") and "`thinking` only" in d
               and "I should look it up." in d for d in d3), d3


def test_template_differences_empty_when_both_agree(renderer):
    assert template_differences(QUESTION, renderer=renderer) == []
    assert template_differences([{"role": "system", "content": "Be brief."}, *QUESTION], [SCHEMA],
                                {"reasoning_effort": "low"}, renderer=renderer) == []


def test_template_differences_parallel_calls_and_refusals(renderer):
    msgs = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "A"}}},
        {"id": "b", "type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "B"}}}]}]
    diffs = template_differences(msgs, [SCHEMA], renderer=renderer, add_generation_prompt=False)
    assert any(d.startswith("only harmony writes the assistant commentary message") and '{"city": "B"}' in d
               for d in diffs), diffs  # trl renders only the first of parallel calls
    lone_tool = [*QUESTION, {"role": "tool", "name": "get_current_temperature", "content": "22"}]
    (only,) = template_differences(lone_tool, [SCHEMA], renderer=renderer)
    assert only.startswith("trl's gptoss.jinja refuses this conversation") and "no previous assistant" in only
    pinned = template_differences(QUESTION, None, {"conversation_start_date": "2001-02-03"}, renderer=renderer)
    assert any("Current date: 2001-02-03" in d for d in pinned), pinned


# ---- text, offsets, generated ids, errors ------------------------------------------------------


def test_decode_with_offsets_covers_split_characters(renderer):
    text = "<|start|>user<|message|>🧬 𝔘ñï 中文 ok<|end|>"
    ids = renderer.encode_generated(text)
    out, offsets = renderer.decode_with_offsets(ids)
    assert out == text == renderer.tokenizer.decode(ids, skip_special_tokens=False)
    assert len(offsets) == len(ids)
    at = text.index("🧬")  # o200k writes it as three tokens of 2, 1 and 1 bytes: all three cover it
    assert [k for k, o in enumerate(offsets) if o == (at, at + 1)] == [3, 4, 5]
    assert all(a <= b for a, b in offsets) and offsets[-1][1] == len(text)
    assert [text[a:b] for a, b in offsets[:3]] == ["<|start|>", "user", "<|message|>"]
    with pytest.raises(HarmonyRenderError, match="not in the o200k_harmony vocabulary"):
        renderer.decode([1, 10**7])


def test_encode_generated_makes_special_tokens(renderer):
    text = seed_script()[0]
    ids = renderer.encode_generated(text)
    assert ids == harmony_encoding().encode(text, allowed_special="all")
    assert ids[-1] == renderer.tokenizer.convert_tokens_to_ids("<|call|>")


@pytest.mark.parametrize("messages,tools,kwargs,match", [
    ([], None, None, "non-empty list"),
    (QUESTION, None, {"reasoning_effort": "max"}, "reasoning_effort must be one of low, medium, high"),
    (QUESTION, None, {"conversation_start_date": "28/06/2025"}, "YYYY-MM-DD"),
    (QUESTION, None, {"conversation_start_date": "2025-02-30"}, "is not a date"),
    (QUESTION, None, {"auto_drop_analysis": "yes"}, "auto_drop_analysis must be true or false"),
    (QUESTION, [{"type": "code_interpreter"}], None, "tool 0 is not a function tool"),
    ([*QUESTION, {"role": "tool", "content": "x"}], None, None, "a tool message needs a name"),
    ([*QUESTION, {"role": "system", "content": "late"}], None, None, "first message only"),
    ([{"role": "robot", "content": "x"}], None, None, "role 'robot'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None, None, "not text"),
    ([*QUESTION, {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}], None, None,
     "no function name"),
    ([*QUESTION, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}],
     None, None, "arguments must be a JSON object"),
    ([*QUESTION, {"role": "assistant", "content": "x", "reasoning_content": "a", "thinking": "b"}], None, None,
     "different reasoning"),
    (["hello"], None, None, "not a chat message object"),
])
def test_bad_input_is_a_clear_user_error(renderer, messages, tools, kwargs, match):
    with pytest.raises(HarmonyRenderError, match=match) as e:
        renderer.render(messages, tools, kwargs=kwargs)
    assert isinstance(e.value, UserError) and isinstance(e.value, RenderError)


def test_tool_turn_needs_history_and_new_messages(renderer):
    with pytest.raises(HarmonyRenderError, match="history"):
        renderer.tool_turn([], [{"role": "tool", "name": "f", "content": "x"}])
    with pytest.raises(HarmonyRenderError, match="at least one new message"):
        renderer.tool_turn(QUESTION, [])
    with pytest.raises(ValueError, match="conversation_start_date"):
        HarmonyRenderer(conversation_start_date="June")
