"""Continuous tokens (``tool_turns: continuous``, the default) against other people's code.

Oracles: transformers' own ``apply_chat_template`` of the whole conversation (mistral-common's
encoder for Mistral) — with continuous tokens, the loop's ids are what a trainer re-rendering the
finished conversation gets, wherever the template is append-only and keeps the reasoning — and the
tokenizer's own encoding of the separator. verl 0.9.1's builders are the other oracle
(tests/test_continuous_verl.py). ``legacy`` keeps the old method (the seed's 25·28·16).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cli_inprocess import run_cli

from backend.checks.diagnostics import check
from backend.config import LoopConfig
from backend.engine import AgentLoop
from backend.families import PROFILES, RULES, rule_for
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tokens.rendering import render_ids
from backend.tools import ToolRegistry
from backend.trace import Trace
from backend.trace.builder import mask_runs
from tests.test_families import QUESTION, TOOL, script_for, with_tool_template

ROOT = Path(__file__).resolve().parent.parent
SEATTLE = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL_SEATTLE = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
ANSWER = "The current temperature in Seattle, WA, USA is 72°F."
SEED_TOOLS = [{"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The location"}},
                   "required": ["city"]}}, "mock": '{"temperature": 72, "city": "Seattle, WA, USA"}'}]


def seed_run(bundle, mode: str | None, script=None, **cfg) -> Trace:
    gen = ScriptedGenerator(bundle.tokenizer, script or [CALL_SEATTLE, ANSWER])
    config = LoopConfig(apply_chat_template_kwargs={"enable_thinking": False}, **({"tool_turns": mode} if mode else {}), **cfg)
    from tests.test_engine import get_current_temperature

    return asyncio.run(AgentLoop(gen, bundle, tools=ToolRegistry.from_functions([get_current_temperature]), config=config).run(SEATTLE))


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def test_default_is_continuous():
    assert LoopConfig().tool_turns == "continuous"
    with pytest.raises(Exception, match="tool_turns must be one of continuous, legacy"):
        LoopConfig(tool_turns="verl")


def test_seed_scenario_legacy_is_the_seeds_numbers(qwen3):
    t = seed_run(qwen3, "legacy")
    assert len(t.prompt_ids) == 178
    assert [tuple(r) for r in mask_runs(t.response_mask)] == [(1, 25), (0, 28), (1, 16)]
    assert t.config["tool_turns"] == "legacy" and t.steps[2].info.boundary is None


def test_seed_scenario_continuous_inserts_the_newline_as_context(qwen3):
    t = seed_run(qwen3, None)  # the default
    newline = qwen3.tokenizer.encode("\n", add_special_tokens=False)
    im_end = qwen3.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(t.prompt_ids) == 178
    assert [tuple(r) for r in mask_runs(t.response_mask)] == [(1, 25), (0, 29), (1, 16)]
    assert t.config["tool_turns"] == "continuous"
    tool_step = t.steps[2]
    assert tool_step.info.method == "continuous" and tool_step.info.rule == "chatml"
    assert tool_step.info.boundary["position"] == 178 + 25 == tool_step.start
    assert tool_step.info.boundary["inserted"] == newline and len(newline) == 1
    ids = t.input_ids
    assert ids[202] == im_end and ids[203] == newline[0] and t.full_mask[203] == 0
    # the whole sequence is transformers' render of the finished conversation (its last '\n' aside)
    full = qwen3.tokenizer.apply_chat_template(t.messages, tools=t.tools, tokenize=True, return_dict=False,
                                                chat_template=qwen3.chat_template, enable_thinking=False)
    assert list(full[: len(ids)]) == ids and qwen3.tokenizer.decode(full[len(ids):]) == "\n"


def test_trace_round_trip_keeps_the_boundary(qwen3, tmp_path):
    t = seed_run(qwen3, None)
    back = Trace.model_validate_json(t.model_dump_json())
    assert back.steps[2].info.boundary == t.steps[2].info.boundary and back.config["tool_turns"] == "continuous"


# profiles whose model ends its last turn on a token that opens the next message (GLM's <|user|>)
STOP_OPENS_NEXT = ("glm4.5", "glm5")


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
@pytest.mark.parametrize("calls", [1, 2])
def test_every_family_continuous_equals_the_templates_own_render(calls):
    """One and two rounds of calls on every profile: the loop's ids equal the family's own render of
    the finished conversation (transformers' apply_chat_template; mistral-common for Mistral),
    up to the separator after the last turn (GLM: up to the <|user|> the model stopped at), for every
    family whose template keeps the reasoning and writes calls as the model does (GLM-4.5 / 5 and
    MiniMax-M2 keep it for the turns after the last user message, all of a tool loop's). gpt-oss and
    DeepSeek drop reasoning on re-render: the difference is named (reasoning_stripped), never a
    dropped separator. Gemma's templates render no tools: its profiles run over the tests'
    Gemma tool template (same turns, same separator)."""
    for name in PROFILES:
        bundle = with_tool_template(name, load_tokenizer(name))
        script = script_for(name, bundle)
        script = [script[0]] * calls + [script[1]]
        gen = ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids, encode=bundle.encode_generated)
        t = asyncio.run(AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]), config=LoopConfig()).run(QUESTION))
        assert t.termination_reason == "no_tool_calls", (name, [s.error for s in t.steps])
        tool_steps = [s for s in t.steps if s.state == "processing_tools"]
        assert len(tool_steps) == calls and all(s.info.method == "continuous" and not s.info.continuous_error for s in tool_steps), name
        if bundle.renderer is not None:
            full = bundle.renderer.oracle_ids(t.messages, [{k: v for k, v in TOOL.items() if k != "mock"}]) \
                if hasattr(bundle.renderer, "oracle_ids") else render_ids(bundle, t.messages, t.tools)[1]
        else:
            full = list(bundle.tokenizer.apply_chat_template(t.messages, tools=t.tools, tokenize=True, return_dict=False,
                                                             chat_template=bundle.chat_template))
        ids = t.input_ids
        findings = {f.code for f in check(t, bundle)}
        assert "dropped_turn_separator" not in findings, name
        if name in ("gpt-oss", "gpt-oss-harmony", "deepseek-v3"):
            assert "thinking_stripped" in findings and full[: len(ids)] != ids, name
            continue
        if name in STOP_OPENS_NEXT:
            # GLM's turns have no end token: the model stops at <|user|>, the next message's opening,
            # which the render of the finished conversation (no next message) does not write
            assert bundle.tokenizer.convert_ids_to_tokens(ids[-1]) == "<|user|>" and full == ids[:-1], name
        else:
            assert full[: len(ids)] == ids, name
            assert not bundle.tokenizer.decode(full[len(ids):]).strip(), name
        assert "retokenization_drift" not in findings, name


def test_legacy_drops_the_separator_and_check_warns_at_each_boundary(qwen3):
    t = seed_run(qwen3, "legacy", [CALL_SEATTLE, CALL_SEATTLE.replace("Seattle", "Boston"), ANSWER])
    fs = [f for f in check(t, qwen3) if f.code == "dropped_turn_separator"]
    bounds = [s.start for s in t.steps if s.state == "processing_tools"]
    assert [f.location.token for f in fs] == bounds and all(f.severity == "warning" for f in fs)
    assert all("verl PR #6921" in f.message and f.details["separator"] == "\n" for f in fs)
    assert not [f for f in check(t, qwen3) if f.code == "retokenization_drift"]  # the separators are all the drift


def test_continuous_trace_gets_no_separator_warning(qwen3):
    t = seed_run(qwen3, None, [CALL_SEATTLE, CALL_SEATTLE.replace("Seattle", "Boston"), ANSWER])
    codes = {f.code: f.severity for f in check(t, qwen3)}
    assert "dropped_turn_separator" not in codes and "retokenization_drift" not in codes
    assert codes.get("mask_mismatch") == "info"  # trl's training mask counts the '\n' as assistant: explained


def test_qwen3_thinking_template_runs_where_legacy_could_not():
    """trl's qwen3.jinja adds an empty think block to the last assistant turn only: the legacy
    suffix check fails once a tool message follows a call written without reasoning (the run ends
    on render_error); continuous tokens never re-render the history."""
    b = load_tokenizer("qwen3-thinking")
    gen = lambda: ScriptedGenerator(b.tokenizer, [CALL_SEATTLE, ANSWER])  # noqa: E731
    from tests.test_engine import get_current_temperature

    reg = ToolRegistry.from_functions([get_current_temperature])
    legacy = asyncio.run(AgentLoop(gen(), b, tools=reg, config=LoopConfig(tool_turns="legacy")).run(SEATTLE))
    cont = asyncio.run(AgentLoop(gen(), b, tools=reg, config=LoopConfig()).run(SEATTLE))
    assert legacy.termination_reason == "render_error"
    assert cont.termination_reason == "no_tool_calls"


def test_a_template_that_refuses_the_synthetic_context_falls_back_to_legacy(qwen3):
    """A user's template that refuses a system message: continuous tokens' synthetic context has one,
    so the turn is tokenized the legacy way, with the family's junction edit, and the step says why."""
    refusing = qwen3.chat_template.replace(
        "{%- if tools %}", "{%- if messages[0].role == 'system' %}{{ raise_exception('no system messages') }}{%- endif %}\n{%- if tools %}", 1)
    assert refusing != qwen3.chat_template
    b = qwen3.with_template(refusing)
    t = seed_run(b, None)
    step = t.steps[2]
    assert t.termination_reason == "no_tool_calls"
    assert "no system messages" in step.info.continuous_error and step.info.method in ("verl", "suffix")
    assert step.info.boundary["inserted"] == qwen3.tokenizer.encode("\n", add_special_tokens=False)
    assert [tuple(r) for r in mask_runs(t.response_mask)] == [(1, 25), (0, 29), (1, 16)]


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_rules_are_picked_from_vocabulary_and_template():
    want = {"qwen3": "chatml", "qwen3-thinking": "chatml", "qwen2.5": "chatml", "qwen3.5": "chatml", "smollm2": "chatml",
            "llama3": "llama3", "gpt-oss": "gpt-oss", "deepseek-v3": "deepseek", "glm4.5": "glm", "glm5": "glm",
            "minimax-m2": "minimax", "gemma3": "gemma", "gemma2": "gemma"}
    for name, rule in want.items():
        assert rule_for(load_tokenizer(name)).name == rule, name
    assert {r.name for r in RULES} >= {"chatml", "llama3", "gpt-oss", "deepseek", "glm", "minimax", "derived"}
    # a Llama template over the Qwen vocabulary: the template decides, not the vocabulary's name
    assert rule_for(load_tokenizer("qwen3", template="llama3_1")).name != "chatml"


def test_derived_rule_finds_a_separator_of_an_unknown_template(qwen3):
    """A ChatML-like template that writes a double newline after <|im_end|>: not ChatML's rule,
    the probe finds it."""
    tpl = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\n{% endfor %}"
           "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    b = qwen3.with_template(tpl)
    r = rule_for(b)
    assert r.name.startswith("derived") and r.sep_ids == qwen3.tokenizer.encode("\n\n", add_special_tokens=False)
    im_end = qwen3.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert r.edit([7, im_end], [1, 2], [], []).inserted == r.sep_ids and not r.edit([7, 8], [1, 2], [], [])


@pytest.mark.parametrize("name", ["glm4.5", "glm5"])
def test_glm_rule_counts_the_shared_stop_token_once_as_context(name):
    """GLM's <|observation|> is the stop token and the next message's opening. On GLM's own
    vocabulary and template the edit keeps it once and relabels it: the turn is what transformers
    renders after the conversation once the tool message follows, less that first token."""
    from backend.families.glm import GLMRule

    b = load_tokenizer(name)
    tok = b.tokenizer
    rule = rule_for(b)
    assert isinstance(rule, GLMRule)
    obs = tok.convert_tokens_to_ids("<|observation|>")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": "1"}}}
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    tool = {"role": "tool", "content": "22", "tool_call_id": "c1", "name": "f"}
    turn = rule.turn([5, 6, obs], history, [tool])
    before = tok.apply_chat_template(history, tokenize=False, chat_template=b.chat_template)
    after = tok.apply_chat_template([*history, tool], tokenize=False, add_generation_prompt=True, chat_template=b.chat_template)
    suffix = tok.encode(after[len(before):], add_special_tokens=False)
    assert suffix[0] == obs and turn.edit.relabel == 1 and turn.ids == suffix[1:]
    # a turn that ended on EOS (no stop token shared with the next message): no edit
    assert not rule.turn([5, 6, tok.eos_token_id], history, [tool]).edit


async def test_glm_trace_explains_its_mask_and_its_last_stop_token():
    """A GLM-4.5 run: trl's glm4moe_training counts the generated <|observation|> as assistant, the
    loop (as verl) as context: an expected mask difference, said as info; the final <|user|> the
    model stopped at is not drift (the template writes it only before a next message)."""
    b = load_tokenizer("glm4.5")
    gen = ScriptedGenerator(b.tokenizer, script_for("glm4.5", b), stop_token_ids=b.stop_token_ids, encode=b.encode_generated)
    t = await AgentLoop(gen, b, tools=ToolRegistry.from_schemas([TOOL]), config=LoopConfig()).run(QUESTION)
    findings = {f.code: f for f in check(t, b)}
    assert "retokenization_drift" not in findings and "dropped_turn_separator" not in findings
    mm = findings["mask_mismatch"]
    assert mm.severity == "info" and mm.details["expected"] and mm.details["training_template"] == "glm4moe_training"
    assert [p["token"] for p in mm.details["positions"]] == ["<|observation|>"]
    assert t.input_ids[-1] == b.tokenizer.convert_tokens_to_ids("<|user|>")


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_cli_tool_turns_flag_and_variable(tmp_path):
    (tmp_path / "messages.json").write_text(json.dumps(SEATTLE))
    (tmp_path / "tools.json").write_text(json.dumps(SEED_TOOLS))
    (tmp_path / "script.json").write_text(json.dumps([CALL_SEATTLE, ANSWER]))
    (tmp_path / "config.json").write_text(json.dumps({"apply_chat_template_kwargs": {"enable_thinking": False}}))

    def run(*extra, env_extra=None):

        p = run_cli("run", "--tokenizer", "qwen3", "--generator", "scripted",
                    "--script", str(tmp_path / "script.json"), "--tools", str(tmp_path / "tools.json"),
                    "--messages", str(tmp_path / "messages.json"), "--config", str(tmp_path / "config.json"),
                    "--out", str(tmp_path / "t.jsonl"), "--json", *extra, env=env_extra)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["mask_runs"]

    assert run() == [[1, 25], [0, 29], [1, 16]]
    assert run("--tool-turns", "legacy") == [[1, 25], [0, 28], [1, 16]]
    assert run(env_extra={"ALI_TOOL_TURNS": "legacy"}) == [[1, 25], [0, 28], [1, 16]]


def test_traces_written_before_tool_turns_still_load_and_say_legacy():
    from backend.trace import load_traces
    from ui.inspector import tool_turns_label

    # the weather sample as the engine wrote it before tool_turns existed (commit 5b16559)
    res = load_traces(str(ROOT / "tests" / "data" / "pre_tool_turns_weather.jsonl"))
    assert not res.problems and res.traces
    t = res.traces[0]
    assert "tool_turns" not in t.config and t.steps[2].info.method == "verl"
    assert tool_turns_label(t) == "legacy (not recorded)"
    assert [tuple(r) for r in mask_runs(t.response_mask)] == [(1, 25), (0, 28), (1, 16)]
    fs = [f for f in check(t, load_tokenizer("qwen3")) if f.code == "dropped_turn_separator"]
    assert [f.location.token for f in fs] == [203] and fs[0].details["tool_turns"].startswith("legacy")


@pytest.mark.parametrize("name,newline", [("gemma3", 107), ("gemma2", 108)])
def test_gemma_inserts_the_newline_its_template_writes_after_end_of_turn(name, newline):
    """Google's Gemma templates (trl gemma3 / gemma) write ``<end_of_turn>\n`` between turns and the
    model stops at ``<end_of_turn>``: the rule inserts the tokenizer's own ``\n``. verl 0.9.1 has no
    Gemma 2/3 builder (its default one makes no edit): tests/test_continuous_verl.py."""
    bundle = load_tokenizer(name)
    tok = bundle.tokenizer
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "yq"}, {"role": "user", "content": "z"}]
    text = tok.apply_chat_template(probe, chat_template=bundle.chat_template, tokenize=False)
    assert "yq<end_of_turn>\n<start_of_turn>user" in text
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    assert bundle.stop_token_ids[0] == end and tok.encode("\n", add_special_tokens=False) == [newline]
    rule = rule_for(bundle)
    assert rule.name == "gemma" and rule.sep_ids == [newline]
    assert rule.edit([7, end], [1, 2], [], []).inserted == [newline] and not rule.edit([7, 8], [1, 2], [], [])
    assert not rule.edit([7, end], [newline, 2], [], [])  # the context already starts with it: nothing to add


@pytest.mark.parametrize("name", ["gemma3", "gemma2"])
def test_gemma_legacy_drops_the_separator_continuous_does_not(name):
    """Over a Gemma template that renders tools: legacy tool turns have ``<end_of_turn>`` followed
    directly by ``<start_of_turn>`` (check warns at the boundary); continuous ones are transformers'
    render of the finished conversation."""
    bundle = with_tool_template(name, load_tokenizer(name))
    script = script_for(name, bundle)
    traces = {}
    for mode in ("legacy", "continuous"):
        gen = ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids, encode=bundle.encode_generated)
        traces[mode] = asyncio.run(AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]),
                                             config=LoopConfig(tool_turns=mode)).run(QUESTION))
    legacy, cont = traces["legacy"], traces["continuous"]
    full = list(bundle.tokenizer.apply_chat_template(cont.messages, tools=cont.tools, tokenize=True, return_dict=False,
                                                     chat_template=bundle.chat_template))
    assert full[: len(cont.input_ids)] == cont.input_ids and full[: len(legacy.input_ids)] != legacy.input_ids
    (boundary,) = [s.start for s in legacy.steps if s.state == "processing_tools"]
    assert [f.location.token for f in check(legacy, bundle) if f.code == "dropped_turn_separator"] == [boundary]
    assert cont.input_ids == legacy.input_ids[:boundary] + bundle.tokenizer.encode("\n", add_special_tokens=False) \
        + legacy.input_ids[boundary:]
