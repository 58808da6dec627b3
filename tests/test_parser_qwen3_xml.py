"""The Qwen3-Coder / Qwen3.5 / Qwen3.6 XML tool-call format (``qwen3_xml``).

Oracles: vLLM's ``qwen3_coder`` and ``qwen3_xml`` parsers (with vLLM's ``qwen3`` reasoning parser
in front, as a server runs them) on generated well-formed turns; trl's templates rendered by
transformers for the text a model emits; xgrammar (through ``backend.tool_choice.check_ids``) for
the tool_choice grammar, token by token with the Qwen3 tokenizer. On malformed turns ours must
report a span where vLLM drops or truncates silently.
"""

from __future__ import annotations

import json
import logging
import random
import re
from typing import Any

import pytest

from backend.loading.tokenizers import load_tokenizer, read_trl_template
from backend.parsers import ParseResult, get_format, get_parser, guess_format, guess_parser, parser_for_vllm
from backend.parsers.qwen3_xml import convert_value, schema_types
from backend.tool_choice import build_constraint, check_ids

VLLM_NAMES = ("qwen3_coder", "qwen3_xml")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "run_code", "parameters": {
        "type": "object",
        "properties": {
            "code": {"type": "string"}, "timeout": {"type": "number"}, "verbose": {"type": "boolean"},
            "env": {"type": "object"}, "args": {"type": "array", "items": {"type": "string"}},
            "seed": {"type": ["integer", "null"]}, "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "mode": {"type": "str"}, "level": {"type": "int"}, "flags": {"type": "dict"},
        },
        "required": ["code"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "读取", "parameters": {
        "type": "object", "properties": {"路径": {"type": "string"}, "n": {"type": "integer"}}, "required": ["路径"]}}},
]


def check_spans(text: str, res: ParseResult) -> None:
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None, item
        s, e = item.span
        assert 0 <= s <= e <= len(text), (item.span, len(text))
        assert text[s:e] == item.raw
    for e in res.errors:
        assert not e.message.startswith("internal parser error"), e.message
    prev = -1
    for c in res.tool_calls:
        assert c.span[0] >= prev, "calls overlap"
        prev = c.span[1]


def calls_of(res: ParseResult) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


@pytest.fixture(scope="module")
def ours():
    return get_parser("qwen3_xml", tools=TOOLS)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3").tokenizer


def parse(text: str, parser: Any = None) -> ParseResult:
    res = (parser or get_parser("qwen3_xml", tools=TOOLS)).parse(text)
    check_spans(text, res)
    return res


def one_call(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# ---- declaration, registry, sniffing ---------------------------------------------------------------


def test_declaration_and_registry():
    p = get_parser("qwen3_xml")
    assert p.name == "qwen3_xml"
    fmt = get_format("qwen3_xml")
    assert fmt is type(p).call_format
    assert all(parser_for_vllm(n) == "qwen3_xml" for n in VLLM_NAMES)
    assert parser_for_vllm("hermes") == "hermes"  # hermes keeps its own names
    assert fmt.forbid == "<tool_call>"
    assert (fmt.response_open, fmt.response_close, fmt.turn_open, fmt.turn_close) == (
        "<tool_response>", "</tool_response>", "<|im_start|>", "<|im_end|>")
    assert get_parser("vllm:qwen3_xml".split(":")[1]).name == "qwen3_xml"


@pytest.mark.parametrize("name,expected", [
    ("qwen3_5_think", "qwen3_xml"), ("qwen3_5_nothink", "qwen3_xml"), ("qwen3_6", "qwen3_xml"), ("qwen3_8", "qwen3_xml"),
    ("qwen3_6_training", "qwen3_xml"),
    ("qwen3", "hermes"), ("qwen3_instruct_2507", "hermes"), ("qwen2_5", "hermes"),
])
def test_templates_are_recognised(name, expected):
    assert guess_parser(read_trl_template(name)) == expected


def test_outputs_are_recognised():
    assert guess_format(one_call("f", [("a", "1")])) == "qwen3_xml"
    assert guess_format(one_call("get_time", [])) == "qwen3_xml"  # no parameter: the first line
    assert guess_format('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>') == "hermes"


# ---- writing: what trl's templates render ----------------------------------------------------------

WRITE_CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "c"}},
    {"name": "run_code", "arguments": {
        "code": "print('hi')\nfor i in range(3):\n    print(\"<b>\", i)\n", "timeout": 1.5, "verbose": True,
        "env": {"A": "1", "nested": {"k": [1, 2.5, None, True, "é\"\\"]}}, "args": ["-v", "--x=1"], "seed": None,
        "ratio": 0.25, "mode": "fast", "level": -7, "flags": {}}},
    {"name": "get_time", "arguments": {}},
    {"name": "读取", "arguments": {"路径": "/tmp/文件 😀.txt", "n": 12345678901234567890}},
]


def render_assistant(tok, template: str, content: str, calls: list[dict[str, Any]]) -> str:
    """The assistant turn's text after its header (and think block), up to ``<|im_end|>``."""
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": content,
             "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]}]
    text = tok.apply_chat_template(msgs, tools=TOOLS, chat_template=read_trl_template(template), tokenize=False)
    body = text.split("<|im_start|>assistant\n", 1)[1]
    assert body.startswith("<think>\n\n</think>\n\n"), body[:40]  # the last turn gets an (empty) think block
    body = body[len("<think>\n\n</think>\n\n"):]
    assert body.endswith("<|im_end|>\n")
    return body[: -len("<|im_end|>\n")]


@pytest.mark.parametrize("template", ["qwen3_6", "qwen3_8"])
def test_format_calls_is_what_the_template_renders(tok, template, ours):
    for calls in (WRITE_CALLS, WRITE_CALLS[:1], WRITE_CALLS[2:3]):
        assert render_assistant(tok, template, "", calls) == ours.format_calls(calls)
        with_text = render_assistant(tok, template, "Let me check.", calls)
        assert with_text == "Let me check.\n\n" + ours.format_calls(calls)
        # and it reads back, typed by the tools' schemas
        res = parse(with_text, ours)
        assert calls_of(res) == [(c["name"], c["arguments"]) for c in calls]
        assert res.content == "Let me check." and res.errors == [] and res.reasoning is None


@pytest.mark.parametrize("template", ["qwen3_5_think", "qwen3_5_nothink"])
def test_qwen3_5_templates_write_python_scalars(tok, template, ours):
    """trl's qwen3_5 templates write non-string scalars with |string (True, None), objects and
    lists with tojson; ``python_scalars=True`` writes the same."""
    py = get_parser("qwen3_xml", tools=TOOLS, python_scalars=True)
    rendered = render_assistant(tok, template, "", WRITE_CALLS)
    assert rendered == py.format_calls(WRITE_CALLS)
    assert rendered != ours.format_calls(WRITE_CALLS)
    assert "<parameter=verbose>\nTrue\n</parameter>" in rendered and "<parameter=seed>\nNone\n</parameter>" in rendered
    assert '"k": [1, 2.5, null, true, ' in rendered  # inside tojson: JSON
    # True reads back as a boolean (any case); None is not null for vLLM's rules either: kept as text, with a warning
    res = parse(rendered, ours)
    run = res.tool_calls[1].arguments
    assert run["verbose"] is True and run["seed"] == "None"
    assert [e.raw for e in res.errors] == ["None"] and res.errors[0].severity == "warning"


def test_format_calls_takes_arguments_as_a_json_string(ours):
    args = WRITE_CALLS[0]["arguments"]
    assert ours.format_calls([{"name": "get_weather", "arguments": json.dumps(args)}]) == ours.format_calls(WRITE_CALLS[:1])
    with pytest.raises(ValueError, match="arguments must be an object"):
        ours.format_calls([{"name": "f", "arguments": "[1]"}])


def test_round_trip_generated(ours):
    r = random.Random("round-trip")
    for _ in range(300):
        calls = [gen_call(r) for _ in range(r.randint(1, 3))]
        text = ours.format_calls(calls)
        res = parse(text, ours)
        assert calls_of(res) == [(c["name"], c["arguments"]) for c in calls], text
        assert res.errors == [] and res.content == ""


# ---- generated well-formed turns -----------------------------------------------------------------

STR_PIECES = ["a", "Paris", " ", "  ", "\n", "\t", "é", "中文", "😀", '"', "'", "\\", "\\n", "{", "}", "[", "]", "<", ">",
              "<b>", "</b>", "a < b", "x>y", "&amp;", "<tool_call>", "</tool_call>", "<think>", "null", "true", "42",
              "-1.5", "{\"a\": 1}", "\u2028", "\r"]


def rand_str(r: random.Random, n: int = 6) -> str:
    return "".join(r.choice(STR_PIECES) for _ in range(r.randint(0, n)))


def rand_json(r: random.Random, depth: int = 3) -> Any:
    k = r.randint(0, 9 if depth > 0 else 5)
    if k == 0:
        return r.randint(-10**6, 10**6)
    if k == 1:
        return r.choice([0.5, -2.25, 1e-7, 3.141592653589793, 1e300, 0.0, 10**25])
    if k == 2:
        return r.choice([True, False, None])
    if k <= 5:
        return rand_str(r)
    if k <= 7:
        return [rand_json(r, depth - 1) for _ in range(r.randint(0, 3))]
    return {rand_str(r, 3) or "k": rand_json(r, depth - 1) for _ in range(r.randint(0, 3))}


def rand_value(r: random.Random, key: str) -> Any:
    """A value of the type the tools' schema gives ``key`` (keys of several tools share types)."""
    if key in ("city", "code", "mode", "路径"):
        s = rand_str(r, 8)
        return s if r.random() < 0.9 else "line one\n\nline three\n"
    if key in ("days", "level", "n"):
        return r.choice([0, 3, -12, 10**30, r.randint(-999, 999)])
    if key == "unit":
        return r.choice(["c", "f"])
    if key in ("timeout", "ratio"):
        return r.choice([1.5, -0.001, 2.5e-8, 1e300, 7]) if key == "timeout" or r.random() < 0.8 else None
    if key == "verbose":
        return r.choice([True, False])
    if key in ("env", "flags"):
        return {rand_str(r, 2) or "k": rand_json(r) for _ in range(r.randint(0, 3))}
    if key == "args":
        return [rand_str(r, 3) for _ in range(r.randint(0, 3))]
    if key == "seed":
        return r.choice([None, 0, 42, -5])
    raise AssertionError(key)


PROPS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def gen_call(r: random.Random) -> dict[str, Any]:
    name = r.choice(["get_weather", "run_code", "get_time", "读取", "free", "not_a_tool"])
    params = PROPS.get(name, {})
    props = list((params.get("properties") or {}).keys())
    required = params.get("required", [])
    keys = [k for k in props if k in required or r.random() < 0.6]
    if r.random() < 0.3:
        r.shuffle(keys)  # any order reads the same
    args = {k: rand_value(r, k) for k in keys}
    if name in ("free", "not_a_tool") or r.random() < 0.1:  # parameters the schema does not list: strings
        for _ in range(r.randint(0, 2)):
            args["extra_" + str(r.randint(0, 9))] = rand_str(r)
    return {"name": name, "arguments": args}


def gen_turn(r: random.Random, parser: Any) -> tuple[str, bool]:
    """A well-formed turn, and whether it has a reasoning block (vLLM needs to know: a server
    knows it from the request's enable_thinking)."""
    calls = [gen_call(r) for _ in range(r.randint(1, 3))]
    text = parser.format_calls(calls)
    if r.random() < 0.6:
        text = r.choice(["Let me check.", "好的，我来查一下。", "Sure 😀 <b>bold</b>", "I'll call two tools:\n- a\n- b"]) + "\n\n" + text
    think = r.random() < 0.5
    if think:
        reasoning = r.choice(["", "plan: call get_weather", "多行\n推理\n", "x < y and {\"a\": 1}"])
        text = (r.choice(["<think>\n", ""]) + reasoning + "\n</think>\n\n") + text
    return text, think


# ---- vLLM parity ------------------------------------------------------------------------------------


class VLLM:
    """vLLM as a server runs it: the ``qwen3`` reasoning parser (thinking on or off, as the
    request says), then the tool parser on what is left."""

    def __init__(self, tok, name: str, tools: list[dict[str, Any]] | None) -> None:
        pytest.importorskip("vllm", reason="vLLM is not installed: the parity oracle cannot run")
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        self.tok = tok
        self.req = ChatCompletionRequest(model="m", messages=[], tools=tools or None)
        self.tool_cls = ToolParserManager.get_tool_parser(name)
        self.reasoning_cls = ReasoningParserManager.get_reasoning_parser("qwen3")
        # building one takes 0.2 s (vocabulary scans); they reset on every extract_* call
        self._reasoning = {t: self.reasoning_cls(tok, chat_template_kwargs={"enable_thinking": t}) for t in (True, False)}
        self._tools = self.tool_cls(tok, self.req.tools)

    def parse(self, text: str, thinking: bool, fresh: bool = False) -> tuple[str | None, str, list[tuple[str, dict]]]:
        rp = self.reasoning_cls(self.tok, chat_template_kwargs={"enable_thinking": thinking}) if fresh else self._reasoning[thinking]
        reasoning, content = rp.extract_reasoning(text, self.req)
        tp = self.tool_cls(self.tok, self.req.tools) if fresh else self._tools
        info = tp.extract_tool_calls(content or "", self.req)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
        return (reasoning.strip() if reasoning is not None else None), (info.content or "").strip(), calls


@pytest.fixture(scope="module", params=VLLM_NAMES)
def vllm_name(request):
    return request.param


@pytest.mark.parametrize("with_tools", [True, False])
def test_vllm_parity_on_generated_turns(tok, vllm_name, with_tools, caplog):
    tools = TOOLS if with_tools else None
    theirs = VLLM(tok, vllm_name, tools)
    mine = get_parser("qwen3_xml", tools=tools)
    writer = get_parser("qwen3_xml")
    r = random.Random(f"parity-{vllm_name}-{with_tools}")
    n_calls = n_think = n_turns = 0
    with caplog.at_level(logging.CRITICAL):
        for _ in range(250):
            text, think = gen_turn(r, writer)
            res = parse(text, mine)
            reasoning, content, their_calls = theirs.parse(text, think)
            if n_turns < 3:  # reused vLLM parsers answer as new ones do
                assert theirs.parse(text, think, fresh=True) == (reasoning, content, their_calls)
            n_turns += 1
            assert calls_of(res) == their_calls, text
            assert res.content == content, text
            assert (res.reasoning or None) == (reasoning or None), text
            assert res.errors == [], (text, res.errors)
            n_calls += len(their_calls)
            n_think += think
    assert n_calls > 400 and 80 < n_think < 170  # the generator covers both kinds of turns
    if not with_tools:  # without tools every value is the text written, as in vLLM
        assert all(isinstance(v, str) for c in parse(writer.format_calls([gen_call(r)]), mine).tool_calls for v in c.arguments.values())


def test_vllm_parity_on_typed_values(tok, vllm_name):
    """Each type rule on its own, including inline values (no line breaks around them) and
    the values both read the same way whatever the schema."""
    theirs = VLLM(tok, vllm_name, TOOLS)
    cases = [
        ("run_code", [("code", "x"), ("timeout", "3"), ("verbose", "FALSE"), ("seed", "null"), ("ratio", "NULL")]),
        ("run_code", [("code", "x"), ("timeout", "1e3"), ("verbose", "1"), ("seed", "7"), ("ratio", "2.50")]),
        ("run_code", [("code", "x"), ("timeout", "-0.0"), ("verbose", " true "), ("level", "12"), ("mode", "007")]),
        ("run_code", [("code", "x"), ("env", '{"a": [1, {"b": null}]}'), ("args", '["x", "y"]'), ("flags", " {} ")]),
        ("run_code", [("code", "\n\nindented\n  code\n\n")]),
        ("get_weather", [("city", "  Paris  "), ("days", " 4 "), ("unit", "f"), ("note", "not in the schema")]),
        ("get_weather", [("city", "null"), ("days", "+5")]),
        ("not_a_tool", [("n", "3"), ("b", "true")]),
        ("free", [("anything", '{"a": 1}')]),
    ]
    for name, params in cases:
        text = one_call(name, params)
        inline = text.replace(">\n", ">").replace("\n</parameter>", "</parameter>")
        for t in (text, inline):
            res = parse(t)
            assert res.errors == [], (t, res.errors)
            assert calls_of(res) == theirs.parse(t, False)[2], t


def test_vllm_adapter_locates_spans_with_ours(tok):
    pytest.importorskip("vllm", reason="vLLM is not installed: the vllm: adapters cannot run")
    text = "Checking.\n\n" + get_parser("qwen3_xml").format_calls(WRITE_CALLS[:2])
    for name in VLLM_NAMES:
        # without tools (every value the text written), so that the adapter's locator, which
        # parses with our parser built without tools, compares like with like
        p = get_parser(f"vllm:{name}", tokenizer=tok)
        res = p.parse(text)
        mine = get_parser("qwen3_xml").parse(text)
        assert calls_of(res) == calls_of(mine) and len(res.tool_calls) == 2
        assert [c.span for c in res.tool_calls] == [c.span for c in mine.tool_calls]
        assert all(c.span is not None for c in res.tool_calls)
        assert res.content == mine.content == "Checking."
        typed = get_parser(f"vllm:{name}", tokenizer=tok, tools=TOOLS).parse(text)
        assert calls_of(typed) == calls_of(parse(text))
        assert p.format_calls(WRITE_CALLS) == get_parser("qwen3_xml").format_calls(WRITE_CALLS)


# ---- typing: vLLM's coercion is the oracle ------------------------------------------------------------


def test_schema_types_and_conversion_agree_with_vllm():
    pytest.importorskip("vllm", reason="vLLM is not installed: the conversion oracle cannot run")
    from vllm.tool_parsers.utils import _TYPE_ALIASES, coerce_to_schema_type, extract_types_from_schema

    schemas = [
        {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
        {"type": "object"}, {"type": "array"}, {"type": ["integer", "null"]}, {"type": ["string", "integer"]},
        {"anyOf": [{"type": "number"}, {"type": "boolean"}]}, {"oneOf": [{"type": "array"}, {"type": "object"}]},
        {"allOf": [{"type": "integer"}]}, {"enum": [1, 2]}, {"enum": ["a", None]}, {"enum": [1.5, True, [1], {"a": 1}]},
        {}, {"description": "no type"}, {"type": "INT"}, {"type": " Float "}, {"type": "bool"}, {"type": "list"},
        {"type": "dict"}, {"type": "any"}, {"type": "unknown"}, {"anyOf": [{"type": "integer"}, {"description": "x"}]},
        {"anyOf": [{"type": "boolean"}, "not a schema"]}, {"enum": []}, {"type": ["Integer", 3]},
    ]
    raws = ["", "0", "1", "-3", "+4", " 5 ", "1_000", "2.5", "1e3", "-0.0", "1e400", "nan", "inf", "true", "False", "TRUE",
            "null", "NULL", "None", "abc", '{"a": 1}', "[1, 2]", "[1e999]", '"quoted"', "{bad", "\n7\n", "٣",
            " [1] ", "\u00a0[1]", "[NaN]", "9" * 5000, "[" * 3000 + "]" * 3000]
    crashed = 0
    for schema in schemas:
        want_types = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in extract_types_from_schema(schema)}
        assert schema_types(schema) == want_types, schema
        for raw in raws:
            value, why = convert_value(raw, schema)
            try:
                want = coerce_to_schema_type(raw, extract_types_from_schema(schema))
            except RecursionError:  # vLLM raises on JSON nested 3000 deep; ours keeps the text
                assert value == raw, schema
                crashed += 1
                continue
            if why is None:
                assert value == want and type(value) is type(want), (schema, raw, value, want)
            else:  # none of the declared types reads it: ours keeps the text, vLLM falls back to any JSON
                assert value == raw
                assert want == _json_or_text(raw), (schema, raw, want)
    assert crashed > 0


def _json_or_text(raw: str) -> Any:
    try:
        v = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    try:
        json.dumps(v, allow_nan=False)
    except ValueError:
        return raw
    return v


@pytest.mark.parametrize("schema,raw,vllm_value", [
    ({"type": "integer"}, "1.5", 1.5),  # vLLM: any JSON
    ({"type": "integer"}, "[1]", [1]),
    ({"type": "object"}, "3", 3),  # vLLM: whatever JSON the text is
    ({"type": "array"}, '{"a": 1}', {"a": 1}),
    ({"type": "boolean"}, "yes", "yes"),  # the same value; ours says so
    ({"type": ["integer", "null"]}, "None", "None"),
])
def test_a_value_its_type_cannot_read_is_kept_as_text_with_a_warning(tok, schema, raw, vllm_value):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}}}]
    text = one_call("f", [("x", raw)])
    res = parse(text, get_parser("qwen3_xml", tools=tools))
    assert calls_of(res) == [("f", {"x": raw})]
    (w,) = res.errors
    assert w.severity == "warning" and w.raw == raw and text[w.span[0] - 1] == "\n" and "kept as the text" in w.message
    assert VLLM(tok, "qwen3_coder", tools).parse(text, False)[2] == [("f", {"x": vllm_value})]


def test_object_or_string_prefers_the_string_where_json_is_not_an_object(tok):
    """vLLM tries object before string and returns any JSON: "3" for object|string becomes 3."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": ["object", "string"]}}}}}]
    text = one_call("f", [("x", "3")])
    assert calls_of(parse(text, get_parser("qwen3_xml", tools=tools))) == [("f", {"x": "3"})]
    assert VLLM(tok, "qwen3_coder", tools).parse(text, False)[2] == [("f", {"x": 3})]


# ---- malformed output: ours reports a span, vLLM is silent ----------------------------------------------

GOOD = one_call("get_weather", [("city", "Paris")])


def _theirs(tok, text: str) -> list[tuple[str, dict]]:
    return VLLM(tok, "qwen3_coder", TOOLS).parse(text, False)[2]


def test_truncated_parameter(tok):
    text = GOOD + "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n3"
    res = parse(text)
    assert calls_of(res) == [("get_weather", {"city": "Paris"})]
    (e,) = res.errors
    assert e.severity == "error" and e.raw == text[len(GOOD) + 1:] and "unclosed <parameter=days>" in e.message
    assert _theirs(tok, text) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]  # days dropped


@pytest.mark.parametrize("cut", ["<tool_call>", "<tool_call>\n<function=get_we", "<tool_call>\n<function=get_weather>\n",
                                 "<tool_call>\n<function=get_weather>\n<parameter=ci",
                                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
                                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
                                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"])
def test_every_truncation_is_one_error_over_the_cut_call(cut):
    text = "Text.\n\n" + GOOD + "\n" + cut
    res = parse(text)
    assert calls_of(res) == [("get_weather", {"city": "Paris"})] and res.content == "Text."
    (e,) = res.errors
    assert e.severity == "error" and e.span == (len(text) - len(cut), len(text.rstrip())), (cut, e)
    assert "truncated" in e.message


def test_accept_unclosed_keeps_a_call_cut_after_function():
    text = GOOD[: -len("\n</tool_call>")]
    assert parse(text).errors[0].severity == "error"
    res = parse(text, get_parser("qwen3_xml", tools=TOOLS, accept_unclosed=True))
    assert calls_of(res) == [("get_weather", {"city": "Paris"})] and res.errors == []


def test_unclosed_parameter_before_the_next_one(tok):
    bad = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    text = bad + "\n" + GOOD
    res = parse(text)
    assert calls_of(res) == [("get_weather", {"city": "Paris"})]
    (e,) = res.errors
    assert e.span == (0, len(bad)) and "unclosed <parameter=city>" in e.message
    assert _theirs(tok, text)[0] == ("get_weather", {"city": "Paris", "days": 3})  # read as if closed, silently


def test_missing_function_and_missing_close_tags(tok):
    no_fn = "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>"
    no_close = GOOD[: -len("</tool_call>")]  # </function> then no </tool_call> before the next call
    text = no_fn + "\n" + no_close + "\n" + GOOD
    res = parse(text)
    assert calls_of(res) == [("get_weather", {"city": "Paris"})] and res.tool_calls[0].raw == GOOD
    assert [e.raw for e in res.errors] == [no_fn, no_close.rstrip()]
    assert "without <function=" in res.errors[0].message and "unclosed <tool_call>" in res.errors[1].message
    assert len(_theirs(tok, text)) == 2  # the JSON block: nothing, no error; the unclosed one: a call


def test_unclosed_function():
    bad = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"
    res = parse(bad + "\n" + GOOD)
    assert calls_of(res) == [("get_weather", {"city": "Paris"})]
    (e,) = res.errors
    assert e.raw == bad and "unclosed <function=get_weather>" in e.message
    for t in ("<tool_call>\n<function=>\n</function>\n</tool_call>", "<tool_call>\n<function=a\nb>\n</function>\n</tool_call>",
              "<tool_call>\n<function=f>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>"):
        res = parse(t)
        assert res.tool_calls == [] and [e.raw for e in res.errors] == [t], t


def test_junk_between_tags_and_duplicates_are_warnings_over_them(tok):
    text = ("<tool_call>\nI will call it\n<function=get_weather>\nnow:\n<parameter=city>\nParis\n</parameter>\nand\n"
            "<parameter=city>\nRome\n</parameter>\n</function>\ndone\n</tool_call>")
    res = parse(text)
    assert calls_of(res) == [("get_weather", {"city": "Rome"})]  # the last value, as vLLM
    assert [(e.severity, e.raw) for e in res.errors] == [
        ("warning", "I will call it"), ("warning", "now:"), ("warning", "and"),
        ("warning", "<parameter=city>\nRome\n</parameter>"), ("warning", "done")]
    assert "duplicate parameter 'city'" in res.errors[3].message
    assert _theirs(tok, text) == [("get_weather", {"city": "Rome"})]  # no word about any of it


def test_several_functions_in_one_tool_call_and_a_bare_function(tok):
    text = ("<tool_call>\n<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</function>\n</tool_call>\nand <function=get_time>\n</function>")
    res = parse(text)
    assert calls_of(res) == [("get_time", {}), ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert all(e.severity == "warning" for e in res.errors) and len(res.errors) == 2
    assert res.content == "and"
    assert calls_of(res) == _theirs(tok, text)


def test_tags_inside_values(tok):
    """Strings are written raw: a tag the parser ends a value at is ambiguous and reported; a
    JSON value (object/array schema) is decoded, so a tag inside its strings is text (vLLM cuts it)."""
    obj = {"html": "</parameter> and </function>", "k": ["<parameter=x>"]}
    text = get_parser("qwen3_xml").format_calls([{"name": "run_code", "arguments": {"code": "x", "env": obj}}])
    res = parse(text)
    assert calls_of(res) == [("run_code", {"code": "x", "env": obj})] and res.errors == []
    assert _theirs(tok, text) != calls_of(res)
    s = get_parser("qwen3_xml").format_calls([{"name": "get_weather", "arguments": {"city": "<p> </function> </p>"}}])
    res = parse(s)
    assert res.tool_calls == [] and res.errors[0].raw == s and "unclosed <parameter=city>" in res.errors[0].message
    assert _theirs(tok, s) == [("get_weather", {})]  # vLLM: the parameter is gone, silently
    ok = get_parser("qwen3_xml").format_calls([{"name": "get_weather", "arguments": {"city": "a </tool_call> <tool_call> b"}}])
    assert calls_of(parse(ok)) == _theirs(tok, ok) == [("get_weather", {"city": "a </tool_call> <tool_call> b"})]


def test_text_after_the_calls_is_content_vllm_drops_it(tok):
    text = GOOD + "\nThat was the call."
    res = parse(text)
    assert res.content == "That was the call." and calls_of(res) == [("get_weather", {"city": "Paris"})]
    assert VLLM(tok, "qwen3_coder", TOOLS).parse(text, False)[1] == ""


def test_reasoning():
    res = parse("<think>\nplan <tool_call> in thought\n</think>\n\n" + GOOD)
    assert res.reasoning == "plan <tool_call> in thought" and len(res.tool_calls) == 1
    res = parse("plan\n</think>\n\nText.\n\n" + GOOD)  # the prompt opened <think>
    assert res.reasoning == "plan" and res.content == "Text."
    res = parse(GOOD + "\n</think>")  # a </think> after a call is text
    assert res.reasoning is None and res.content == "</think>"
    res = parse("<think>\nunclosed " + GOOD)
    assert res.tool_calls == [] and res.reasoning.startswith("unclosed")
    assert parse("no reasoning").reasoning is None


# ---- tool_choice grammar, token by token -------------------------------------------------------------


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def test_grammar_accepts_what_format_calls_writes(tok):
    w = get_parser("qwen3_xml")
    required = build_constraint("required", "qwen3_xml", TOOLS, max_calls=3)
    assert required.spec.startswith("root ::= q3x_call")
    for calls in (WRITE_CALLS[:3], WRITE_CALLS[3:], [WRITE_CALLS[1]], [{"name": "free", "arguments": {"a": "1", "b": "x\ny"}}],
                  [{"name": "get_weather", "arguments": {"city": ""}}], [{"name": "get_weather", "arguments": {"city": "\n\n"}}],
                  [{"name": "get_weather", "arguments": {"city": "a < b </b> </parameter x"}}]):
        assert check_ids(required, tok, _ids(tok, w.format_calls(calls))) is None, calls
    r = random.Random("grammar")
    for _ in range(40):
        calls = [c for c in (gen_call(r) for _ in range(3)) if c["name"] != "not_a_tool" and not (
            c["name"] != "free" and any(k.startswith("extra_") for k in c["arguments"]))]
        if not calls:
            continue
        for c in calls:  # in the schema's order
            props = list((PROPS[c["name"]].get("properties") or {}).keys())
            if props:
                c["arguments"] = {k: c["arguments"][k] for k in props if k in c["arguments"]}
            c["arguments"] = {k: v for k, v in c["arguments"].items()
                              if not (isinstance(v, str) and any(t in v for t in ("</parameter>", "<parameter=", "</function>")))}
            if c["name"] == "get_weather":
                c["arguments"].setdefault("city", "x")
            if c["name"] == "run_code":
                c["arguments"].setdefault("code", "x")
            if c["name"] == "读取":
                c["arguments"].setdefault("路径", "x")
        assert check_ids(required, tok, _ids(tok, w.format_calls(calls))) is None, calls


def test_grammar_rejects(tok):
    w = get_parser("qwen3_xml")
    required = build_constraint("required", "qwen3_xml", TOOLS, max_calls=2)
    good = w.format_calls([{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}])
    assert check_ids(required, tok, _ids(tok, good)) is None
    bad = {
        "missing required": one_call("get_weather", [("days", "3")]),
        "wrong type": one_call("get_weather", [("city", "Paris"), ("days", "three")]),
        "float for integer": one_call("get_weather", [("city", "Paris"), ("days", "3.5")]),
        "order": one_call("get_weather", [("days", "3"), ("city", "Paris")]),
        "unknown parameter": one_call("get_weather", [("city", "Paris"), ("zzz", "1")]),
        "enum": one_call("get_weather", [("city", "Paris"), ("unit", "kelvin")]),
        "unknown tool": one_call("nope", []),
        "tag in a string": one_call("get_weather", [("city", "a </function> b")]),
        "no line break": good.replace("<parameter=city>\n", "<parameter=city>"),
        "text before": "Sure.\n" + good,
        "three calls": "\n".join([good] * 3),
        "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "bad json object": one_call("run_code", [("code", "x"), ("env", "{'a': 1}")]),
    }
    for why, text in bad.items():
        assert check_ids(required, tok, _ids(tok, text)) is not None, why
    assert check_ids(required, tok, _ids(tok, "\n".join([good] * 2))) is None
    named = build_constraint("get_time", "qwen3_xml", TOOLS)
    assert check_ids(named, tok, _ids(tok, w.format_calls([{"name": "get_time", "arguments": {}}]))) is None
    assert check_ids(named, tok, _ids(tok, one_call("get_time", [("x", "1")]))) is not None  # "properties": {}: none
    assert check_ids(named, tok, _ids(tok, good)) is not None
    assert check_ids(named, tok, _ids(tok, "\n".join([w.format_calls([{"name": "get_time", "arguments": {}}])] * 2))) is not None
    none = build_constraint("none", "qwen3_xml", TOOLS)
    assert check_ids(none, tok, _ids(tok, good)) is not None and check_ids(none, tok, _ids(tok, "Fine.")) is None


def test_grammar_accepts_a_long_string_value(tok):
    w = get_parser("qwen3_xml")
    required = build_constraint("required", "qwen3_xml", TOOLS, max_calls=1)
    text = w.format_calls([{"name": "run_code", "arguments": {"code": ("for i in range(10):\n    print('<b>', i)  # é\n" * 100)}}])
    assert check_ids(required, tok, _ids(tok, text)) is None


def test_grammar_refuses_names_the_format_cannot_write():
    from backend.tool_choice import ToolChoiceError

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a>b": {"type": "string"}}}}}]
    with pytest.raises(ToolChoiceError, match="cannot be written"):
        build_constraint("required", "qwen3_xml", tools)


# ---- never raises, spans, linear time ---------------------------------------------------------------------

TAGS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<think>", "</think>",
        ">", "\n", "get_weather", "city", "{", "}", '"', "1e999", "\ud800", "\x00", "\ufffd"]


def test_mutated_turns_never_raise_and_spans_hold(ours):
    r = random.Random("mutated")
    writer = get_parser("qwen3_xml")
    for k in range(3000):
        text, _ = gen_turn(r, writer)
        for _ in range(r.randint(1, 5)):
            a = r.randint(0, len(text))
            b = min(len(text), a + r.randint(0, 30))
            op = r.randint(0, 3)
            text = (text[:a] + text[b:] if op == 0 else text[:a] + r.choice(TAGS) + text[a:] if op == 1
                    else text[:a] if op == 2 else text[:a] + text[a:b] * 3 + text[b:])
        res = ours.parse(text)
        check_spans(text, res)
        for c in res.tool_calls:
            assert isinstance(c.name, str) and c.name.strip() and isinstance(c.arguments, dict)
        if k % 10 == 0:
            assert ours.parse(text).to_dict() == res.to_dict()


def test_never_raises_on_odd_input(ours):
    for text in ["", ">", "<", "<function=", "<parameter=", "</parameter>", "<tool_call>" * 5, "</think>" * 3,
                 "<tool_call>\n<function=f>\n<parameter=x>\n" * 50, "\ud800<tool_call>\x00", None, b"<tool_call>\xff"]:
        res = ours.parse(text)
        assert isinstance(res, ParseResult)
        assert not any(e.message.startswith("internal") for e in res.errors)
    bad_tools = get_parser("qwen3_xml", tools=[None, {"function": {"name": 3}}, {"name": "f", "parameters": {"properties": []}}])
    assert calls_of(bad_tools.parse(one_call("f", [("a", "1")]))) == [("f", {"a": "1"})]


@pytest.mark.parametrize("shape", ["value", "open", "function", "parameter", "unclosed_param", "junk", "many_calls", "think"])
def test_a_megabyte_parses_with_exact_spans(ours, shape):
    mb = 1 << 20
    text = {
        "value": one_call("run_code", [("code", "x < y </b> \n" * (mb // 12))]),
        "open": "<tool_call>" * (mb // 11),
        "function": "<function=" * (mb // 10),
        "parameter": "<tool_call>\n<function=f>\n" + "<parameter=" * (mb // 11),
        "unclosed_param": "<tool_call>\n<function=f>\n" + "<parameter=a>\nx\n" * (mb // 16),
        "junk": "<tool_call>\n<function=f>\n" + "junk </tool_call " * (mb // 17) + "</function>\n</tool_call>",
        "many_calls": one_call("get_weather", [("city", "Paris"), ("days", "3")]) * (mb // 100),
        "think": "</think><think>" * (mb // 15),
    }[shape]
    res = ours.parse(text)  # its time per byte: bench/bench_parsers.py
    check_spans(text, res)
    assert not any(e.message.startswith("internal") for e in res.errors)
    if shape == "value":
        assert len(res.tool_calls) == 1 and len(res.tool_calls[0].arguments["code"]) > mb - 20
    if shape == "many_calls":
        assert len(res.tool_calls) == mb // 100 and res.errors == []


def test_module_docstring_shows_the_format():
    import backend.parsers.qwen3_xml as m

    doc = m.__doc__ or ""
    assert re.search(r"<tool_call>\n\s*<function=get_weather>\n\s*<parameter=city>\n\s*Paris\n\s*</parameter>", doc)
