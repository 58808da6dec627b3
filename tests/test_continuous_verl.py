"""Our engine's tool turns (``tool_turns="continuous"``) against verl 0.9.1's own Continuous Token
builders, token-exact, on every family verl has a builder for.

The oracle is verl itself (``tests/verl_oracle.py``: the wheel installed by ``scripts/setup.sh``
into ``.venv/oracles``, its builders fed the same tokenizer and template), replayed the way
verl's ``ToolAgentLoop`` calls them. The engine runs a scripted model; verl gets the very ids
that model generated and the messages the engine parsed from them, and must end with the same
prompt, response and mask. The verl-only tests pin what verl's builders do on their own (the
seed scenario's 25/29/16, which merges insert a token), so a change in the oracle shows up as
such and not as an engine failure.

Known template limits, asserted as behaviour rather than hidden: trl's ``llama3_1`` refuses
parallel calls (engine and verl both stop there); trl's ``gptoss`` renders only the first of
parallel calls (verl encodes gpt-oss tool responses directly, so the tool turn is unaffected);
trl's ``deepseekv3`` never resets ``is_first``, so a full re-render of a second round differs
(verl renders each tool group in a fresh synthetic context, so its tool turns do not).

GLM-4.5 / GLM-5 (verl's ``glm47`` / ``glm5``: ``GLMContinuousTokenBuilder``) and MiniMax-M2
(``minimaxm2``) run on their real vocabularies and templates. verl's GLM builder removes the
generated <|observation|> and appends the template's; the loop keeps it once as context: the same
ids and mask. Where a call turn ends on <|user|> instead, verl still removes it and the loop keeps
it (it never removes a generated id): that one difference is asserted below.
"""

from __future__ import annotations

import asyncio
import json
import site
from pathlib import Path

import pytest
from test_engine import ANSWER as SEED_ANSWER
from test_engine import CALL_SEATTLE, SEATTLE, get_current_temperature
from test_families import ANSWER, CALL, QUESTION, answer_text, call_text
from verl_oracle import (
    ORACLE_DIR,
    VERL_FAMILY,
    VerlOracleMissing,
    check_oracle,
    load_verl_ct,
    verl_builder,
    verl_rollout,
)

from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.parsers import get_parser
from backend.tools import ToolRegistry
from backend.trace import Trace
from backend.trace.builder import mask_runs

PROFILES = ["qwen3", "qwen3.5", "llama3", "gpt-oss", "deepseek-v3", "glm4.5", "glm5", "minimax-m2"]
# what verl's builder does at each tool turn's junction, per profile: the ids it inserts (named by
# their text) and how many generated ids it removes (GLM's stop token, which the template's tool
# turn writes again as its opening)
INSERTS = {"qwen3": "\n", "qwen3.5": "\n", "minimax-m2": "\n"}
REMOVES = {"glm4.5": 1, "glm5": 1}
CALL_ZURICH = {"name": CALL["name"], "arguments": {"city": "Zürich"}}
# scenario -> (the calls of each tool-calling turn, max_parallel_calls); a final answer follows
SCENARIOS = {
    "one_call": ([[CALL]], 1),
    "parallel_calls": ([[CALL, CALL_ZURICH]], 2),
    "two_rounds": ([[CALL], [CALL_ZURICH]], 1),
}
# the one (profile, scenario) whose template refuses the conversation (trl llama3_1: one call per turn)
REFUSED = {("llama3", "parallel_calls")}
# the tool (test_engine's): its result is a JSON object, quotes and a non-ASCII city included
# (verl's gpt-oss builder writes it as a JSON string of its own, not through the template)
REGISTRY = ToolRegistry.from_functions([get_current_temperature])
SCHEMAS = list(REGISTRY.schemas)


def tool_result(call: dict) -> str:
    """What the registry returns for ``call`` (checked against the engine's results below)."""
    return json.dumps(get_current_temperature(**call["arguments"]), ensure_ascii=False)


@pytest.fixture(scope="module", autouse=True)
def verl_ct():
    """verl's module, imported once (its chat_template module imports transformers'
    ProcessorMixin, which pulls in torch: seconds, paid here rather than in one test)."""
    return load_verl_ct()


@pytest.fixture(scope="module", params=PROFILES)
def family(request):
    """(profile name, its bundle): each bundle built once per module."""
    return request.param, load_tokenizer(request.param)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


# ---- scripts in each family's native format (the parsers' own format_calls, as test_families) --


def call_turn(profile: str, bundle, calls: list[dict]) -> str:
    if bundle.parser == "harmony":
        text = get_parser(bundle.parser).format_calls(calls)
        return "<|channel|>analysis<|message|>I should look it up.<|end|><|start|>assistant" + text + "<|call|>"
    return call_text(profile, bundle, calls)


def answer_turn(profile: str, bundle) -> str:
    if bundle.parser == "harmony":
        return "<|channel|>final<|message|>" + ANSWER
    return answer_text(profile)


def script_for(profile: str, bundle, scenario: str) -> list[str]:
    rounds, _ = SCENARIOS[scenario]
    return [call_turn(profile, bundle, calls) for calls in rounds] + [answer_turn(profile, bundle)]


def generated_ids(bundle, text: str) -> list[int]:
    """What the scripted model returns for ``text``: its encoding, then EOS unless it ended on a
    stop token (gpt-oss's <|call|>)."""
    ids = bundle.encode_generated(text)
    return ids if ids and ids[-1] in bundle.stop_token_ids else [*ids, bundle.tokenizer.eos_token_id]


def handmade_turns(profile: str, bundle, scenario: str) -> list[tuple[list[int], dict, list[dict] | None]]:
    """verl's turns for a scenario without our engine: the script's ids, the calls as the model
    wrote them, the tool's results."""
    rounds, _ = SCENARIOS[scenario]
    script = script_for(profile, bundle, scenario)
    turns = []
    for r, calls in enumerate(rounds, 1):
        ids = [f"call_{r}_{i}" for i in range(len(calls))]
        assistant = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}, "id": i}
            for c, i in zip(calls, ids)]}
        tools = [{"role": "tool", "content": tool_result(c), "tool_call_id": i} for c, i in zip(calls, ids)]
        turns.append((generated_ids(bundle, script[r - 1]), assistant, tools))
    turns.append((generated_ids(bundle, script[-1]), {"role": "assistant", "content": ANSWER}, None))
    return turns


def template_prompt(bundle, messages, tools, kwargs=None) -> list[int]:
    return list(bundle.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=bundle.chat_template, add_generation_prompt=True, tokenize=True,
        return_dict=False, **{**bundle.chat_template_kwargs, **(kwargs or {})}))


# ---- the engine, and verl fed what the engine's model generated ----------------------------


class RecordingGenerator(ScriptedGenerator):
    """The scripted model, keeping the ids it returned each turn (what verl's server returns)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outputs: list[list[int]] = []

    async def _generate(self, request):
        gen = await super()._generate(request)
        self.outputs.append(list(gen.token_ids))
        return gen


def run_engine(bundle, script, registry, messages, **cfg) -> tuple[Trace, list[list[int]]]:
    gen = RecordingGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                             encode=bundle.encode_generated)
    loop = AgentLoop(gen, bundle, tools=registry, config=LoopConfig(**cfg))
    return asyncio.run(loop.run(messages)), gen.outputs


def trace_turns(trace: Trace, outputs: list[list[int]]) -> list[tuple[list[int], dict, list[dict] | None]]:
    """One verl turn per generating step: the ids the model generated (which the trace holds at
    the step's span, mask 1), the assistant message the engine parsed from them, and the tool
    messages the tool step that followed appended (None when none did, or it appended none)."""
    steps = trace.steps
    gen_steps = [k for k, s in enumerate(steps) if s.state == "generating"]
    assert len(gen_steps) == len(outputs)
    turns = []
    for k, out in zip(gen_steps, outputs):
        step = steps[k]
        assert trace.input_ids[step.start:step.end] == out and step.mask == 1
        (assistant,) = [trace.messages[i] for i in step.messages_added]
        assert assistant["role"] == "assistant"
        nxt = steps[k + 1] if k + 1 < len(steps) else None
        tools = None
        if nxt is not None and nxt.state == "processing_tools" and nxt.messages_added:
            tools = [trace.messages[i] for i in nxt.messages_added]
            assert all(m["role"] == "tool" for m in tools)
        turns.append((out, assistant, tools))
    return turns


def prompt_messages(trace: Trace) -> list[dict]:
    pending = trace.steps[0]
    assert pending.state == "pending"
    return [trace.messages[i] for i in pending.messages_added]


# ---- the oracle itself ----------------------------------------------------------------------


def test_missing_oracle_is_an_error_naming_setup(tmp_path):
    with pytest.raises(VerlOracleMissing, match=r"verl 0\.9\.1 test oracle is missing .*bash scripts/setup\.sh"):
        check_oracle(tmp_path)
    (tmp_path / "verl-0.9.0.dist-info").mkdir()
    with pytest.raises(VerlOracleMissing, match=r"found verl-0\.9\.0\.dist-info"):
        check_oracle(tmp_path)


def test_oracle_is_verl_091_from_venv_oracles_not_site_packages(verl_ct, qwen3):
    ct = verl_ct
    assert Path(ct.__file__).resolve().is_relative_to(ORACLE_DIR.resolve())
    assert (ORACLE_DIR / "verl-0.9.1.dist-info").is_dir()
    assert set(ct.list_continuous_token_builder_families()) >= set(VERL_FAMILY.values())
    # --no-deps --target: nothing of verl (or the ray it would pull) in the venv's site-packages
    for sp in site.getsitepackages():
        assert not (Path(sp) / "verl").exists() and not list(Path(sp).glob("verl-*.dist-info")), sp
    builder = verl_builder(qwen3, "qwen3")
    assert type(builder).__name__ == "QwenContinuousTokenBuilder"


def test_the_builder_renders_with_the_bundles_template_not_the_tokenizers(qwen3):
    """verl calls tokenizer.apply_chat_template itself: the copy it gets carries the bundle's
    template; the bundle's own tokenizer is left as it was."""
    before = qwen3.tokenizer.chat_template
    builder = verl_builder(qwen3, "qwen3", {"enable_thinking": False})
    assert builder.tokenizer.chat_template == qwen3.chat_template
    assert builder.tokenizer is not qwen3.tokenizer and qwen3.tokenizer.chat_template == before
    assert builder.chat_template_kwargs == {"enable_thinking": False}


def test_seed_scenario_through_verl_is_25_29_16(qwen3):
    """The seed scenario (qwen3, enable_thinking False, the SEATTLE call then the answer) as verl
    0.9.1 builds it: prompt 178, mask runs 25/29/16 (measured with verl 0.9.1: its Qwen builder
    inserts the "\\n" the template writes after <|im_end|>, which the model stopped before; the
    legacy suffix method gives 28)."""
    tok = qwen3.tokenizer
    tools = SCHEMAS
    args = {"city": "Seattle, WA, USA"}
    result = '{"temperature": 72, "city": "Seattle, WA, USA"}'
    turns = [
        (tok.encode(CALL_SEATTLE, add_special_tokens=False) + [tok.eos_token_id],
         {"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "get_current_temperature", "arguments": args}, "id": "call_1_0"}]},
         [{"role": "tool", "content": result, "tool_call_id": "call_1_0"}]),
        (tok.encode(SEED_ANSWER, add_special_tokens=False) + [tok.eos_token_id],
         {"role": "assistant", "content": SEED_ANSWER}, None),
    ]
    record = []
    prompt, response, mask = verl_rollout(qwen3, "qwen3", SEATTLE, tools, turns, {"enable_thinking": False},
                                          record=record)
    assert len(prompt) == 178
    assert [tuple(r) for r in mask_runs(mask)] == [(1, 25), (0, 29), (1, 16)]
    assert prompt == template_prompt(qwen3, SEATTLE, tools, {"enable_thinking": False})
    assert tok.decode(response) == (
        CALL_SEATTLE + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + result
        + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + SEED_ANSWER + "<|im_end|>")
    context = record[2]
    assert context.kind == "context" and context.inserted_token_ids == tok.encode("\n", add_special_tokens=False)
    assert context.removed_prefix_token_count == 0 and context.appended_token_count == 28


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_verl_alone_on_every_family(family, scenario):
    """verl's builders on their own: the prompt is the template's render, the generated ids sit
    unchanged at mask 1, the Qwen and MiniMax builders insert a token (the "\\n" after <|im_end|> /
    [e~[), the GLM builders remove the generated <|observation|> (the template's tool turn opens with
    it); no other builder edits here (DeepSeek's removal is for a user message after tool outputs)."""
    profile, bundle = family
    turns = handmade_turns(profile, bundle, scenario)
    if (profile, scenario) in REFUSED:
        with pytest.raises(Exception, match="only supports single tool-calls at once"):
            verl_rollout(bundle, VERL_FAMILY[profile], QUESTION, SCHEMAS, turns)
        return
    record = []
    prompt, response, mask = verl_rollout(bundle, VERL_FAMILY[profile], QUESTION, SCHEMAS, turns, record=record)
    assert prompt == template_prompt(bundle, QUESTION, SCHEMAS)
    runs = [tuple(r) for r in mask_runs(mask)]
    assert [bit for bit, _ in runs] == [1, 0] * (len(turns) - 1) + [1]
    pos, generated = 0, []
    for bit, n in runs:
        if bit:
            generated.append(response[pos:pos + n])
        pos += n
    removed = REMOVES.get(profile, 0)
    assert generated == [ids[: len(ids) - removed] if tools else ids for ids, _, tools in turns]
    contexts = [m for m in record[1:] if m.kind == "context"]
    assert len(contexts) == len(turns) - 1
    inserted = bundle.tokenizer.encode(INSERTS[profile], add_special_tokens=False) if profile in INSERTS else []
    for m, (ids, _, _) in zip(contexts, turns):
        assert m.inserted_token_ids == inserted
        assert m.removed_prefix_token_count == removed
        if removed:  # what it removed is the stop token the model wrote, and the context starts with it again
            assert ids[-1] in bundle.stop_token_ids and m.token_ids[-m.appended_token_count] == ids[-1]


# ---- the engine against verl ------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_engine_continuous_tool_turns_equal_verls(family, scenario):
    profile, bundle = family
    rounds, parallel = SCENARIOS[scenario]
    trace, outputs = run_engine(bundle, script_for(profile, bundle, scenario), REGISTRY, QUESTION,
                                tool_turns="continuous", max_parallel_calls=parallel)
    if (profile, scenario) in REFUSED:
        return check_refused_parallel_calls(bundle, profile, trace, outputs)
    assert trace.termination_reason == "no_tool_calls", [s.error for s in trace.steps]
    assert [[r.content for r in s.tool_results] for s in trace.steps if s.state == "processing_tools"] == [
        [tool_result(c) for c in calls] for calls in rounds]
    turns = trace_turns(trace, outputs)
    prompt, response, mask = verl_rollout(bundle, VERL_FAMILY[profile], prompt_messages(trace), trace.tools, turns)
    assert trace.prompt_ids == prompt
    assert trace.response_ids == response
    assert trace.response_mask == mask


def check_refused_parallel_calls(bundle, profile, trace: Trace, outputs: list[list[int]]) -> None:
    """trl's llama3_1 raises on an assistant message with two calls. The engine ends the run with
    a render error naming the template's message, keeping what the model generated; verl raises
    the template's error at the same merge, after the same tokens."""
    assert trace.termination_reason == "render_error"
    tool_step = trace.steps[-2]
    assert tool_step.state == "processing_tools" and len(tool_step.tool_results) == 2
    assert "only supports single tool-calls at once" in (tool_step.error or "")
    assert tool_step.messages_added == [] and tool_step.end == tool_step.start  # nothing appended
    (first,) = trace_turns(trace, outputs)
    assert first[2] is None and len(first[1]["tool_calls"]) == 2
    # verl up to the call turn: the same sequence...
    assert verl_rollout(bundle, VERL_FAMILY[profile], prompt_messages(trace), trace.tools, [first]) == (
        trace.prompt_ids, trace.response_ids, trace.response_mask)
    # ...then its merge of the two tool results raises the template's error
    results = [{"role": "tool", "content": r.content, "tool_call_id": c["id"]}
               for r, c in zip(tool_step.tool_results, first[1]["tool_calls"])]
    with pytest.raises(Exception, match="only supports single tool-calls at once"):
        verl_rollout(bundle, VERL_FAMILY[profile], prompt_messages(trace), trace.tools, [(first[0], first[1], results)])


def test_engine_seed_scenario_equals_verl_and_legacy_does_not(qwen3):
    """The seed scenario through the engine: continuous tool turns are verl 0.9.1's (25/29/16);
    the legacy ones (verl < 0.9, 25/28/16) are not, so the comparison above can tell them apart."""
    kwargs = {"enable_thinking": False}
    trace, outputs = run_engine(qwen3, [CALL_SEATTLE, SEED_ANSWER], REGISTRY, SEATTLE, tool_turns="continuous",
                                apply_chat_template_kwargs=kwargs)
    verl = verl_rollout(qwen3, "qwen3", prompt_messages(trace), trace.tools, trace_turns(trace, outputs), kwargs)
    assert (trace.prompt_ids, trace.response_ids, trace.response_mask) == verl
    assert len(trace.prompt_ids) == 178 and [tuple(r) for r in mask_runs(trace.response_mask)] == [(1, 25), (0, 29), (1, 16)]

    legacy, outputs = run_engine(qwen3, [CALL_SEATTLE, SEED_ANSWER], REGISTRY, SEATTLE, tool_turns="legacy",
                                 apply_chat_template_kwargs=kwargs)
    assert [tuple(r) for r in mask_runs(legacy.response_mask)] == [(1, 25), (0, 28), (1, 16)]
    assert legacy.prompt_ids == verl[0] and legacy.response_mask != verl[2]


@pytest.mark.parametrize("profile", ["glm4.5"])
def test_glm_call_turn_ending_on_user_verl_removes_a_generated_token(profile):
    """Where GLM ends a call turn on <|user|> instead of <|observation|>, verl 0.9.1's GLM builder
    still removes it (any trailing <|observation|> / <|user|>) and appends the template's tool turn,
    which opens with <|observation|>. The loop never removes a generated id: it keeps <|user|> at
    mask 1, so the two differ by that one token, and check reports it as drift there."""
    from backend.checks.diagnostics import check

    bundle = load_tokenizer(profile)
    user = bundle.tokenizer.convert_tokens_to_ids("<|user|>")
    script = [call_turn(profile, bundle, [CALL]).replace("<|observation|>", "<|user|>"), answer_turn(profile, bundle)]
    trace, outputs = run_engine(bundle, script, REGISTRY, QUESTION, tool_turns="continuous")
    assert trace.termination_reason == "no_tool_calls"
    assert outputs[0][-1] == user and not trace.steps[2].info.boundary  # no edit: the tool turn does not open with it
    record = []
    prompt, response, mask = verl_rollout(bundle, VERL_FAMILY[profile], prompt_messages(trace), trace.tools,
                                          trace_turns(trace, outputs), record=record)
    assert record[2].kind == "context" and record[2].removed_prefix_token_count == 1
    at = len(outputs[0]) - 1  # the <|user|> in the response
    assert prompt == trace.prompt_ids and trace.response_ids[at] == user and trace.response_mask[at] == 1
    assert trace.response_ids[:at] + trace.response_ids[at + 1:] == response
    assert trace.response_mask[:at] + trace.response_mask[at + 1:] == mask
    (drift,) = [f for f in check(trace, bundle) if f.code == "retokenization_drift"]
    assert drift.details["first_divergence"] == len(trace.prompt_ids) + at


# ---- Gemma 2 / 3: verl 0.9.1 has no builder for them --------------------------------------------

GEMMA = ["gemma3", "gemma2"]


@pytest.fixture(scope="module", params=GEMMA)
def gemma(request):
    """(profile, its bundle over the tests' Gemma tool template, its bundle over trl's template)."""
    from test_families import with_tool_template

    bundle = load_tokenizer(request.param)
    return request.param, with_tool_template(request.param, bundle), bundle


def test_verl_gives_gemma_2_and_3_its_default_builder(verl_ct):
    """verl picks a builder from config.json's model_type; Gemma 2/3's (gemma2, gemma3, gemma3_text)
    are not in its table, so they get the default builder, which makes no junction edit. Only
    Gemma 4 has one (its <turn|> tokens are not in these vocabularies)."""
    default = verl_ct.ContinuousTokenModelFamily.DEFAULT
    for model_type in ("gemma2", "gemma3", "gemma3_text"):
        assert verl_ct.infer_continuous_token_model_family(hf_model_type=model_type) == default, model_type
    assert verl_ct.infer_continuous_token_model_family(hf_model_type="gemma4") == verl_ct.ContinuousTokenModelFamily.GEMMA4


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_engine_gemma_is_verls_default_builder_plus_the_newline(gemma, scenario):
    """Over a Gemma template that renders tools, verl's default builder (what verl 0.9.1 gives Gemma
    2/3) keeps the generated <end_of_turn> and appends the tool turn right after it; the template
    writes ``<end_of_turn>\\n``. The engine's sequence is verl's with that ``\\n`` (mask 0) inserted
    after each call turn, and nothing else differs."""
    profile, bundle, _ = gemma
    rounds, parallel = SCENARIOS[scenario]
    trace, outputs = run_engine(bundle, script_for(profile, bundle, scenario), REGISTRY, QUESTION,
                                tool_turns="continuous", max_parallel_calls=parallel)
    assert trace.termination_reason == "no_tool_calls", [s.error for s in trace.steps]
    prompt, response, mask = verl_rollout(bundle, "default", prompt_messages(trace), trace.tools,
                                          trace_turns(trace, outputs))
    newline = bundle.tokenizer.encode("\n", add_special_tokens=False)
    end = bundle.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    want_ids, want_mask, pos = [], [], 0
    runs = [tuple(r) for r in mask_runs(mask)]
    for k, (bit, n) in enumerate(runs):
        want_ids += response[pos:pos + n]
        want_mask += [bit] * n
        pos += n
        if bit and k + 1 < len(runs):  # a call turn, then verl's tool turn
            assert response[pos - 1] == end
            want_ids += newline
            want_mask += [0] * len(newline)
    assert trace.prompt_ids == prompt
    assert trace.response_ids == want_ids and trace.response_mask == want_mask
    assert len(want_ids) == len(response) + len(rounds) * len(newline)


def test_gemma_templates_refuse_tool_turns_in_verl_too(gemma):
    """trl's gemma3 / gemma (Google's templates): verl's builder raises the template's own error at
    the first tool merge, as the engine ends on render_error there (tests/test_families.py)."""
    profile, _, bundle = gemma
    turns = handmade_turns(profile, bundle, "one_call")
    with pytest.raises(Exception, match="Conversation roles must alternate|System role not supported"):
        verl_rollout(bundle, "default", QUESTION, SCHEMAS, turns)
