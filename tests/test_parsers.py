"""Tool-call parsers: well-formed, truncated and malformed output for every format, reasoning
blocks, content, spans, writing calls back, and the vLLM / transformers adapters."""

from __future__ import annotations

import json
import logging

import pytest

from backend.parsers import ParseResult, ToolCallParser, available_parsers, get_parser
from backend.trace import ParseError, ToolCall

NATIVE = ["hermes", "hunyuan", "llama3_json", "mistral"]


def check_spans(text: str, res: ParseResult) -> None:
    """Every span is in bounds and ``text[span] == raw``."""
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None
        s, e = item.span
        assert 0 <= s <= e <= len(text)
        assert text[s:e] == item.raw


def calls(res: ParseResult) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


def parse(fmt: str, text: str) -> ParseResult:
    res = get_parser(fmt).parse(text)
    check_spans(text, res)
    assert not any(e.message.startswith("internal") for e in res.errors), res.errors
    return res


def hermes_call(name: str, args) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


# ---- registry ----------------------------------------------------------------------------------


def test_registry_lists_the_formats():
    names = available_parsers()
    for n in [*NATIVE, "transformers"]:
        assert n in names
    for n in NATIVE:
        p = get_parser(n, tokenizer=None)  # native parsers accept (and ignore) a tokenizer
        assert isinstance(p, ToolCallParser)
        assert p.name == n


def test_unknown_parser_lists_available_names():
    with pytest.raises(ValueError) as e:
        get_parser("nope")
    for n in NATIVE:
        assert n in str(e.value)
    with pytest.raises(ValueError):
        get_parser("")


def test_vllm_missing_is_a_clear_error(monkeypatch):
    import backend.parsers.vllm_adapter as va

    monkeypatch.setattr(va, "vllm_available", lambda: False)
    with pytest.raises(ValueError, match="vLLM is not installed"):
        get_parser("vllm:hermes", tokenizer=object())


def test_adapters_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        get_parser("transformers")


def test_parse_result_to_dict_shape():
    text = 'Hi <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> <tool_call>\n{"name": 3}\n</tool_call>'
    d = parse("hermes", text).to_dict()
    assert set(d) == {"content", "reasoning", "tool_calls", "errors"}
    assert d["tool_calls"] == [{"name": "f", "arguments": {"x": 1}, "span": [3, 64]}]
    assert d["errors"] == [{"message": 'tool call "name" must be a string, got a number', "span": [65, 101], "severity": "error"}]
    json.dumps(d)


def test_non_str_input_does_not_raise():
    p = get_parser("hermes")
    assert p.parse(None).content == ""  # type: ignore[arg-type]
    assert p.parse(b"hi \xff").content == "hi \ufffd"  # type: ignore[arg-type]


# ---- hermes ------------------------------------------------------------------------------------


def test_hermes_well_formed_multiple_calls_and_content():
    text = "Let me check.\n" + hermes_call("get_weather", {"city": "Paris"}) + "\n" + hermes_call("get_time", {})
    res = parse("hermes", text)
    assert res.content == "Let me check."
    assert res.reasoning is None
    assert calls(res) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert res.errors == []
    first = res.tool_calls[0]
    assert first.raw.startswith("<tool_call>") and first.raw.endswith("</tool_call>")


def test_hermes_one_bad_call_in_the_middle():
    bad = '<tool_call>\n{"name": "b", "arguments": {"x": 1}\n</tool_call>'
    text = hermes_call("a", {"x": 1}) + "\n" + bad + "\n" + hermes_call("c", {"y": [1, 2]})
    res = parse("hermes", text)
    assert calls(res) == [("a", {"x": 1}), ("c", {"y": [1, 2]})]
    assert len(res.errors) == 1
    start = text.index(bad)
    assert res.errors[0].span == (start, start + len(bad))
    assert "invalid JSON" in res.errors[0].message
    assert res.content == ""


def test_hermes_think_blocks():
    res = parse("hermes", "<think>\nI should call f.\n</think>\n\n" + hermes_call("f", {}))
    assert res.reasoning == "I should call f."
    assert res.content == ""
    assert calls(res) == [("f", {})]
    # Qwen3 thinking template opened <think> in the prompt: only the closing tag is generated
    res = parse("hermes", "I should call f.\n</think>\n\nOK. " + hermes_call("f", {"a": 1}))
    assert res.reasoning == "I should call f."
    assert res.content == "OK."
    assert calls(res) == [("f", {"a": 1})]
    # empty think block (non-thinking mode)
    res = parse("hermes", "<think>\n\n</think>\n\nHello")
    assert res.reasoning == "" and res.content == "Hello"
    # a call written inside the reasoning is not a call
    res = parse("hermes", "<think>maybe " + hermes_call("f", {}) + "</think>no call")
    assert res.tool_calls == [] and res.content == "no call"
    # truncated while thinking
    res = parse("hermes", "<think>still thinking about <tool_call>")
    assert res.reasoning == "still thinking about <tool_call>" and res.content == "" and res.errors == []


def test_hermes_truncated_call_is_an_error_not_content():
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"q": "abc'
    res = parse("hermes", text)
    assert res.tool_calls == []
    assert res.content == "Sure."
    assert len(res.errors) == 1
    assert res.errors[0].span == (6, len(text))
    assert "unclosed" in res.errors[0].message
    # complete JSON but no closing tag: still truncated
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n'
    res = parse("hermes", text)
    assert res.tool_calls == [] and len(res.errors) == 1 and "unclosed" in res.errors[0].message
    # ... unless the loop stops generation on </tool_call>
    res = get_parser("hermes", accept_unclosed=True).parse(text)
    assert calls(res) == [("f", {})]
    # just the tag
    res = parse("hermes", "ok <tool_call>")
    assert res.content == "ok" and res.errors[0].span == (3, 14)
    # truncated in the middle of a call, followed by a fresh well-formed call
    text = '<tool_call>\n{"name": "f", "argu' + hermes_call("g", {"k": "v"})
    res = parse("hermes", text)
    assert calls(res) == [("g", {"k": "v"})]
    assert res.errors[0].span == (0, text.index('<tool_call>\n{"name": "g"'))


@pytest.mark.parametrize(
    "body, msg",
    [
        ('["f", {}]', "must be a JSON object"),
        ('"f"', "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": 1, "arguments": {}}', '"name" must be a string'),
        ('{"name": "", "arguments": {}}', "empty"),
        ('{"name": "f", "arguments": [1]}', "must be a JSON object"),
        ('{"name": "f", "arguments": null}', "must be a JSON object"),
        ('{"name": "f", "arguments": "[1, 2]"}', "not an object"),
        ('{"name": "f", "arguments": "{bad"}', "not a JSON object"),
        ('{"name": "f", "arguments": {"x": NaN}}', "NaN"),
        ('{"name": "f", "arguments": {"x": Infinity}}', "Infinity"),
        ('{"name": "f", "arguments": {"x": -Infinity}}', "Infinity"),
        ('{"name": "f", "arguments": {"x": 1e999}}', "infinity"),
        ('{"name": "f", "arguments": "{\\"x\\": NaN}"}', "NaN"),
        ('{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}", "too long"),
        ('{"name": "f", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"name": "f", "arguments": {"x": 1}} trailing', "unexpected text"),
        ("not json at all", "invalid JSON"),
        ('{"name": "f", "arguments": {"x": "a\nb"}}', "Invalid control character"),
        ("{'name': 'f', 'arguments': {}}", "invalid JSON"),
    ],
)
def test_hermes_malformed_calls(body, msg):
    text = hermes_call("a", {}) + f"<tool_call>\n{body}\n</tool_call>" + hermes_call("z", {})
    res = parse("hermes", text)
    assert calls(res) == [("a", {}), ("z", {})]
    assert len(res.errors) == 1, res.errors
    assert msg in res.errors[0].message
    s = len(hermes_call("a", {}))
    assert res.errors[0].span == (s, s + len(f"<tool_call>\n{body}\n</tool_call>"))


@pytest.mark.parametrize(
    "args",
    [
        {"q": 'say "hi" \\ {not a brace} [nor a bracket]'},
        {"html": "</tool_call><tool_call>{", "think": "<think>"},
        {"n": 10**300, "f": -1.5e-300, "t": True, "nil": None},
        {"deep": {"a": [{"b": [{"c": {}}]}]}},
        {"emoji": "😀 é 中文", "nul": "\x00", "surrogate": "\ud800"},
        {},
    ],
)
def test_hermes_argument_values_survive(args):
    text = hermes_call("f", args)
    res = parse("hermes", text)
    assert calls(res) == [("f", args)]


def test_hermes_arguments_as_json_string_and_duplicate_keys():
    res = parse("hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>')
    assert calls(res) == [("f", {"x": 1})]
    res = parse("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": 1, "x": 2}}\n</tool_call>')
    assert calls(res) == [("f", {"x": 2})]  # last wins, like json
    res = parse("hermes", '<tool_call>\n{"name": "f"}\n</tool_call>')
    assert calls(res) == [("f", {})]  # a call without "arguments" is kept, as {} ...
    assert [(e.severity, e.span) for e in res.errors] == [("warning", res.tool_calls[0].span)]  # ... and the repair reported


@pytest.mark.parametrize("fmt,text,key", [
    ("llama3_json", '{"name": "f"}', "parameters"),
    ("llama3_json", '<|python_tag|>{"name": "g", "parameters": {"x": 1}}; {"name": "f"}', "parameters"),
    ("hermes", 'Hi <tool_call>\n{"name": "f"}\n</tool_call>', "arguments"),
    ("hunyuan", '<tool_calls>[{"name": "f"}]</tool_calls>', "arguments"),
    ("mistral", '[TOOL_CALLS] [{"name": "f"}]', "arguments"),
])
def test_a_call_without_arguments_is_kept_with_a_warning_over_its_span(fmt, text, key):
    """{"name": "f"} is read as a call with {} arguments, a repair the model did not write: it
    is reported as a warning-severity parse error whose span is the call's, in every format."""
    res = parse(fmt, text)
    f = [c for c in res.tool_calls if c.name == "f"]
    assert len(f) == 1 and f[0].arguments == {}
    assert [(e.severity, e.span) for e in res.errors] == [("warning", f[0].span)], res.errors
    assert res.errors[0].message == f'tool call \'f\' has no "{key}": read as {{}} (no arguments); the model did not write them'
    assert res.to_dict()["errors"][0]["severity"] == "warning"
    with_args = parse(fmt, text.replace('{"name": "f"}', '{"name": "f", "%s": {}}' % key))
    assert calls(with_args) == calls(res) and with_args.errors == []  # written by the model: nothing to report


def test_hermes_content_between_calls_and_stray_tags():
    text = "A " + hermes_call("f", {}) + " B </tool_call> <tool_ca C"
    res = parse("hermes", text)
    assert res.content == "A  B </tool_call> <tool_ca C"
    assert calls(res) == [("f", {})] and res.errors == []


# ---- hunyuan -----------------------------------------------------------------------------------


def test_hunyuan_well_formed_with_think_and_answer():
    text = (
        "<think>\n用户想知道天气。\n</think>\n<answer>\n助手：好的。<tool_calls>"
        '[{"name": "get_weather", "arguments": {"city": "北京"}}, {"name": "get_time", "arguments": {}}]'
        "</tool_calls>\n</answer>"
    )
    res = parse("hunyuan", text)
    assert res.reasoning == "用户想知道天气。"
    assert res.content == "助手：好的。"
    assert calls(res) == [("get_weather", {"city": "北京"}), ("get_time", {})]
    assert res.tool_calls[0].raw == '{"name": "get_weather", "arguments": {"city": "北京"}}'
    assert res.errors == []


def test_hunyuan_plain_answer_keeps_role_prefix():
    res = parse("hunyuan", "<think>\nx\n</think>\n<answer>\n助手：你好！\n</answer>")
    assert res.content == "助手：你好！" and res.reasoning == "x" and res.tool_calls == []


@pytest.mark.parametrize(
    "bad",
    [
        '{"name": "b", "arguments": {"x": 1}',  # missing brace
        '{"name": "b", "arguments": {"x": NaN}}',
        '{"name": "b", "arguments": [1]}',
        '{"name": "b" "arguments": {}}',
        '{"arguments": {}}',
        '{"name": "b", "arguments": {"x": "unterminated}}',
        '{"name": "b", "arguments": {"x": 1}}}',  # extra brace
    ],
)
def test_hunyuan_bad_element_in_the_middle(bad):
    a = '{"name": "a", "arguments": {"k": "v, {\\"name\\": 1}"}}'
    c = '{"name": "c", "arguments": {"z": [1, {"y": 2}]}}'
    text = f"<tool_calls>[{a}, {bad}, {c}]</tool_calls>"
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {"k": 'v, {"name": 1}'}), ("c", {"z": [1, {"y": 2}]})]
    assert len(res.errors) == 1, res.errors
    s = text.index(bad)
    assert res.errors[0].span == (s, s + len(bad))


def test_hunyuan_truncated_and_unclosed():
    good = '{"name": "a", "arguments": {}}'
    text = f'<tool_calls>[{good}, {{"name": "b", "argum'
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {})]
    # the cut element, and the block left open
    assert [e.span for e in res.errors] == [(0, len(text)), (text.index('{"name": "b"'), len(text))]
    assert "unclosed" in res.errors[0].message
    # complete list, missing closing tag: calls kept, truncation reported
    text = f"<tool_calls>[{good}]"
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {})]
    assert len(res.errors) == 1 and "unclosed" in res.errors[0].message and res.errors[0].span == (0, len(text))
    # the list itself cut off after a complete element
    text = f"<tool_calls>[{good}"
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {})] and len(res.errors) == 1
    res = parse("hunyuan", "ok <tool_calls>")
    assert res.content == "ok" and res.errors[0].span == (3, 15)


def test_hunyuan_not_a_list_and_junk_after_list():
    text = '<tool_calls>{"name": "a", "arguments": {}}</tool_calls> after'
    res = parse("hunyuan", text)
    assert res.tool_calls == [] and res.content == "after"
    assert res.errors[0].span == (0, text.index(" after"))
    text = '<tool_calls>[{"name": "a", "arguments": {}}] junk</tool_calls>'
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {})] and len(res.errors) == 1 and res.errors[0].raw == "junk"


def test_hunyuan_two_blocks_and_empty_list():
    text = '<tool_calls>[{"name": "a", "arguments": {}}]</tool_calls> mid <tool_calls>[]</tool_calls>'
    res = parse("hunyuan", text)
    assert calls(res) == [("a", {})] and res.content == "mid" and res.errors == []


# ---- llama3_json -------------------------------------------------------------------------------


def test_llama3_json_forms():
    res = parse("llama3_json", '{"name": "f", "parameters": {"x": 1}}')
    assert calls(res) == [("f", {"x": 1})] and res.content == ""
    res = parse("llama3_json", '<|python_tag|>{"name": "f", "arguments": {"x": 1}}')
    assert calls(res) == [("f", {"x": 1})]
    res = parse("llama3_json", '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"y": "a;b"}}')
    assert calls(res) == [("f", {}), ("g", {"y": "a;b"})]
    assert res.tool_calls[1].raw == '{"name": "g", "parameters": {"y": "a;b"}}'


def test_llama3_json_plain_text_is_content():
    for text in ["The answer is 42.", '{"answer": 42}', "{not json", "Here: {\"name\": \"f\", \"parameters\": {}}", ""]:
        res = parse("llama3_json", text)
        assert res.tool_calls == [] and res.errors == [] and res.content == text.strip()


def test_llama3_json_bad_call_in_the_middle():
    bad = '{"name": "g", "parameters": {"x": }'
    text = f'<|python_tag|>{{"name": "f", "parameters": {{}}}}; {bad}; {{"name": "h", "parameters": {{"z": 1}}}}'
    res = parse("llama3_json", text)
    assert calls(res) == [("f", {}), ("h", {"z": 1})]
    s = text.index(bad)
    assert len(res.errors) == 1 and res.errors[0].span == (s, s + len(bad))


def test_llama3_json_malformed_and_truncated():
    text = 'Checking.<|python_tag|>{"name": "f", "parameters": {"x": 1'
    res = parse("llama3_json", text)
    assert res.content == "Checking." and res.tool_calls == []
    assert res.errors[0].span == (text.index("{"), len(text))
    res = parse("llama3_json", '{"name": "f", "parameters": [1]}')
    assert res.tool_calls == [] and "must be a JSON object" in res.errors[0].message
    res = parse("llama3_json", '{"name": "f", "parameters": {"x": 1')  # call-like without the tag: still an error
    assert res.tool_calls == [] and len(res.errors) == 1
    res = parse("llama3_json", '<|python_tag|>brave_search.call(query="x")')
    assert "not supported" in res.errors[0].message
    res = parse("llama3_json", '{"name": "f", "parameters": {}}\n\nI called f.')
    assert calls(res) == [("f", {})] and res.content == "I called f."


# ---- mistral -----------------------------------------------------------------------------------


def test_mistral_list_style_with_ids():
    text = 'Sure.[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "abc123def"}, {"name": "g", "arguments": "{\\"y\\": 2}"}]'
    res = parse("mistral", text)
    assert res.content == "Sure."
    assert calls(res) == [("f", {"x": 1}), ("g", {"y": 2})]
    assert [c.id for c in res.tool_calls] == ["abc123def", None]


def test_mistral_args_style():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}'
    res = parse("mistral", text)
    assert calls(res) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert [c.id for c in res.tool_calls] == [None, "a1b2c3d4e"]
    assert res.tool_calls[0].raw == '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'


def test_mistral_bad_calls():
    bad = '{"name": "g", "arguments": {"y": }}'
    text = f'[TOOL_CALLS] [{{"name": "f", "arguments": {{}}}}, {bad}, {{"id": "x", "name": "h", "arguments": {{}}}}]'
    res = parse("mistral", text)
    assert calls(res) == [("f", {}), ("h", {})]
    assert res.errors[0].span == (text.index(bad), text.index(bad) + len(bad))
    text = '[TOOL_CALLS]f[ARGS]{"x": 1[TOOL_CALLS]g[ARGS]{}[TOOL_CALLS]h{}[TOOL_CALLS]k[ARGS][1]'
    res = parse("mistral", text)
    assert calls(res) == [("g", {})]
    assert [e.raw for e in res.errors] == ['[TOOL_CALLS]f[ARGS]{"x": 1', "[TOOL_CALLS]h{}", "[TOOL_CALLS]k[ARGS][1]"]
    res = parse("mistral", "text [TOOL_CALLS]")
    assert res.content == "text" and len(res.errors) == 1


def test_mistral_think():
    res = parse("mistral", "[THINK]plan[/THINK]Answer.")
    assert res.reasoning == "plan" and res.content == "Answer."


# ---- writing calls back ------------------------------------------------------------------------

ROUND_TRIP_CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
    {"name": "run", "arguments": {"code": 'print("}{") # ; , ]', "n": [1, 2.5, None, True], "u": "中文 😀"}},
    {"name": "noop", "arguments": {}},
]


@pytest.mark.parametrize("fmt", NATIVE)
def test_format_calls_round_trips(fmt):
    p = get_parser(fmt)
    text = p.format_calls(ROUND_TRIP_CALLS)
    res = p.parse(text)
    check_spans(text, res)
    assert calls(res) == [(c["name"], c["arguments"]) for c in ROUND_TRIP_CALLS]
    assert res.errors == [] and res.content == ""
    if p.call_begin:
        assert text.startswith(p.call_begin)
    if p.call_end:
        assert text.endswith(p.call_end)
    one = p.format_calls(ROUND_TRIP_CALLS[:1])
    assert calls(p.parse(one)) == [("get_weather", {"city": "Paris", "unit": "c"})]


def test_format_calls_exact_text():
    c = [{"name": "f", "arguments": {"x": 1}}]
    assert get_parser("hermes").format_calls(c) == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert get_parser("hunyuan").format_calls(c) == '<tool_calls>[{"name": "f", "arguments": {"x": 1}}]</tool_calls>'
    assert get_parser("llama3_json").format_calls(c) == '{"name": "f", "parameters": {"x": 1}}'
    assert get_parser("mistral").format_calls([{**c[0], "id": "abc123def"}]) == (
        '[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "abc123def"}]'
    )
    args_style = get_parser("mistral", style="args")
    assert args_style.format_calls(c) == '[TOOL_CALLS]f[ARGS]{"x": 1}'
    text = args_style.format_calls([{**ROUND_TRIP_CALLS[0], "id": "a1b2c3d4e"}, ROUND_TRIP_CALLS[1]])
    res = args_style.parse(text)
    assert calls(res) == [(c["name"], c["arguments"]) for c in ROUND_TRIP_CALLS[:2]]
    assert res.tool_calls[0].id == "a1b2c3d4e"


# ---- robustness --------------------------------------------------------------------------------

NASTY = [
    "",
    "\x00",
    "\ud800\udfff\ud800",
    "<tool_call>",
    "</tool_call>",
    "<tool_call></tool_call>",
    "<tool_call>{}</tool_call>",
    "<tool_calls>[",
    "<tool_calls>[,,,]</tool_calls>",
    "<tool_calls>[{]}]</tool_calls>",
    "[TOOL_CALLS]",
    "[TOOL_CALLS][ARGS]",
    "[TOOL_CALLS][CALL_ID][ARGS]{}",
    "<|python_tag|>",
    "<|python_tag|>;;;",
    '{"name": "f", "parameters": {}};',
    "<think>",
    "</think></think><think>",
    "{" * 10_000,
    "[" * 200_000,
    '<tool_call>{"name": "f", "arguments": ' + "{" * 200_000,
    '"\\' * 1000,
    "\ufffd" * 100 + "<tool_call>\ufffd{",
]


@pytest.mark.parametrize("fmt", NATIVE)
@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_nasty_inputs_never_raise(fmt, text):
    parse(fmt, text)


@pytest.mark.parametrize("fmt", NATIVE)
def test_one_megabyte_argument_is_fast(fmt):
    p = get_parser(fmt)
    args = {"blob": "x" * (1 << 20), "nested": {"s": '"}{][' * 1000}}
    prefix = "Before. " + ("<|python_tag|>" if fmt == "llama3_json" else "")  # llama: text first needs the tag
    text = prefix + p.format_calls([{"name": "f", "arguments": args}])
    res = p.parse(text)  # speed: bench/bench_parsers.py
    assert calls(res) == [("f", args)]
    check_spans(text, res)


@pytest.mark.parametrize("fmt", NATIVE)
def test_one_megabyte_of_broken_tags(fmt):
    """Tens of thousands of malformed calls in one text parse without an internal error, every
    error has a span inside the text. (Time per byte at 128 KB vs 1 MB: bench/bench_parsers.py.)"""
    p = get_parser(fmt)
    unit = {"hermes": "<tool_call>{", "hunyuan": "<tool_calls>[{", "mistral": "[TOOL_CALLS]f[ARGS]{",
            "llama3_json": '{"name": "a", "parameters": {; '}[fmt]
    text = unit * ((1 << 20) // len(unit))
    res = p.parse(text)
    assert res.errors and not res.tool_calls
    assert not any(e.message.startswith("internal") for e in res.errors)
    assert all(0 <= e.span[0] <= e.span[1] <= len(text) for e in res.errors if e.span)
    if fmt == "llama3_json":
        res = p.parse(unit * 100)
        assert len(res.errors) == 100  # each one reported: the reader resynchronises at every "; {"


def test_types_are_the_trace_types():
    res = parse("hermes", hermes_call("f", {}) + "<tool_call>x</tool_call>")
    assert isinstance(res.tool_calls[0], ToolCall) and isinstance(res.errors[0], ParseError)


# ---- vLLM adapter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_bundle():
    from backend.loading.tokenizers import load_tokenizer

    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def vllm_hermes(qwen_bundle):
    pytest.importorskip("vllm", reason="vLLM is not installed: the vllm: adapters cannot run")
    return get_parser("vllm:hermes", tokenizer=qwen_bundle.tokenizer)


def test_vllm_hermes_agrees_on_good_output(vllm_hermes):
    text = "Checking.\n" + hermes_call("get_weather", {"city": "Paris"}) + "\n" + hermes_call("get_time", {})
    ours = parse("hermes", text)
    theirs = vllm_hermes.parse(text)
    check_spans(text, theirs)
    assert calls(theirs) == calls(ours)
    assert [c.span for c in theirs.tool_calls] == [c.span for c in ours.tool_calls]  # located with our parser
    assert all(c.id for c in theirs.tool_calls)  # vLLM makes up ids
    assert theirs.content == "Checking."
    assert vllm_hermes.name == "vllm:hermes"
    assert vllm_hermes.format_calls(ROUND_TRIP_CALLS) == get_parser("hermes").format_calls(ROUND_TRIP_CALLS)


def test_vllm_hermes_drops_every_call_when_one_is_bad_ours_keeps_the_good_ones(vllm_hermes, caplog):
    bad = '<tool_call>\n{"name": "b", "arguments": {"x": 1}\n</tool_call>'
    text = hermes_call("a", {"x": 1}) + "\n" + bad + "\n" + hermes_call("c", {})
    with caplog.at_level(logging.CRITICAL):
        theirs = vllm_hermes.parse(text)
    assert theirs.tool_calls == []  # vLLM: json error -> no calls, the whole text as content
    assert theirs.content == text.strip()
    ours = parse("hermes", text)
    assert calls(ours) == [("a", {"x": 1}), ("c", {})]
    assert len(ours.errors) == 1 and ours.errors[0].raw == bad


def test_vllm_other_formats_and_bad_names(qwen_bundle, vllm_hermes):
    tok = qwen_bundle.tokenizer
    p = get_parser("vllm:hunyuan_a13b", tokenizer=qwen_bundle)  # a bundle is accepted too
    text = '<tool_calls>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]</tool_calls>'
    res = p.parse(text)
    assert calls(res) == calls(parse("hunyuan", text))
    assert [c.span for c in res.tool_calls] == [c.span for c in parse("hunyuan", text).tool_calls]
    with pytest.raises(ValueError, match="no tool parser"):
        get_parser("vllm:no_such_parser", tokenizer=tok)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        get_parser("vllm:hermes")
    with pytest.raises(ValueError, match="cannot be used with this tokenizer"):
        get_parser("vllm:llama3_json", tokenizer=tok)  # no <|python_tag|> in Qwen's vocabulary


def test_vllm_adapter_never_raises(vllm_hermes, caplog):
    with caplog.at_level(logging.CRITICAL):
        for text in NASTY:
            res = vllm_hermes.parse(text)
            for item in [*res.tool_calls, *res.errors]:
                if item.span is not None:
                    assert text[item.span[0] : item.span[1]] == item.raw


# ---- transformers adapter ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_parser(qwen_bundle):
    return get_parser("transformers", tokenizer=qwen_bundle.tokenizer)


def test_transformers_adapter_good_output(hf_parser, qwen_bundle):
    text = "<think>\nplan\n</think>\n\nChecking.\n" + hermes_call("get_weather", {"city": "Paris"}) + "\n" + hermes_call("f", {})
    res = hf_parser.parse(text)
    check_spans(text, res)
    assert calls(res) == [("get_weather", {"city": "Paris"}), ("f", {})]
    assert res.reasoning == "plan" and res.content == "Checking."
    assert [c.span for c in res.tool_calls] == [c.span for c in parse("hermes", text).tool_calls]
    assert hf_parser.format_calls(ROUND_TRIP_CALLS) == get_parser("hermes").format_calls(ROUND_TRIP_CALLS)
    # the tokenizer itself is not modified
    assert getattr(qwen_bundle.tokenizer, "response_template", None) is None
    # a bundle works too (its chat template picks the response template)
    res2 = get_parser("transformers", tokenizer=qwen_bundle).parse(text)
    assert calls(res2) == calls(res)


def test_transformers_adapter_errors_span_the_whole_text(hf_parser):
    text = hermes_call("a", {}) + '\n<tool_call>\n{"name": "b", "arguments": {\n</tool_call>'
    res = hf_parser.parse(text)
    assert res.tool_calls == []
    assert len(res.errors) == 1 and res.errors[0].span == (0, len(text)) and res.errors[0].raw == text
    assert "parse_response failed" in res.errors[0].message
    for t in NASTY:
        r = hf_parser.parse(t)
        for item in [*r.tool_calls, *r.errors]:
            if item.span is not None:
                assert t[item.span[0] : item.span[1]] == item.raw


def test_transformers_adapter_needs_a_response_template():
    class NoTemplate:
        chat_template = None

        def parse_response(self, text, **kw):  # pragma: no cover - never reached
            return {}

        def convert_tokens_to_ids(self, t):
            return None

    with pytest.raises(ValueError, match="response template"):
        get_parser("transformers", tokenizer=NoTemplate())
    with pytest.raises(ValueError, match="transformers >= 5"):
        get_parser("transformers", tokenizer=object())


def test_a_repaired_call_is_a_warning_downstream_not_an_error(tmp_path):
    """A run whose model writes {"name": ...} without arguments: the call runs, the step keeps
    the warning, the trace counts no error (step_errors, trace table), check reports
    repaired_tool_call (warning) instead of malformed_tool_call, and an import of the same turn
    keeps the content as the parser read it."""
    import asyncio

    from backend.checks.diagnostics import check
    from backend.engine import AgentLoop
    from backend.generators.scripted import ScriptedGenerator
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry
    from backend.trace import TraceIndex, write_jsonl
    from backend.trace.messages import parse_assistant_text as assistant_message

    bundle = load_tokenizer("qwen3")
    tools = ToolRegistry.from_schemas([{"type": "function", "function": {"name": "now", "description": "Time.",
                                                                        "parameters": {"type": "object", "properties": {}}}, "mock": "12:00"}])
    turn = 'Checking. <tool_call>\n{"name": "now"}\n</tool_call>'
    trace = asyncio.run(AgentLoop(ScriptedGenerator(bundle.tokenizer, [turn, "Noon."]), bundle, tools=tools).run(
        [{"role": "user", "content": "Time?"}]))
    assert trace.termination_reason == "no_tool_calls"
    gen = trace.steps[1]
    assert [c.name for c in gen.tool_calls] == ["now"] and [e.severity for e in gen.parse_errors] == ["warning"]
    assert trace.steps[2].tool_results[0].content == "12:00"
    assert trace.step_errors() == 0
    codes = {(f.code, f.severity) for f in check(trace)}
    assert ("repaired_tool_call", "warning") in codes and not any(c == "malformed_tool_call" for c, _ in codes)
    write_jsonl([trace], str(tmp_path / "t.jsonl"))
    assert TraceIndex.build([str(tmp_path / "t.jsonl")]).df["errors"].tolist() == [0]
    msg, errs = assistant_message(turn, get_parser("hermes"), None)
    assert msg["content"] == "Checking." and [e.severity for e in errs] == ["warning"]
