"""gpt-oss's Harmony format (backend/parsers/harmony.py): well-formed and malformed output, the
``channels`` view, agreement with openai-harmony's parser on generated turns (token ids, as
Harmony reads them), ``format_calls`` against Harmony's renderer and trl's gptoss.jinja, the
tool_choice grammar at token level on the o200k_harmony vocabulary, a structured fuzz with the
shared fuzz helpers, and linear time.

The oracles are openai-harmony (``backend.families.gpt_oss.harmony_encoding``: the gpt-oss encoding loaded
offline), trl's template rendered by transformers, and xgrammar's matcher."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from adversarial.test_parser_fuzz import Case, Rand, check_mutated, check_structured, mutate, rand_args, rand_name

from backend.parsers import ParseResult, get_format, get_parser, guess_format, guess_parser, parser_for_vllm
from backend.parsers._grammar import prefix_rules
from backend.parsers.harmony import HarmonyParser, call_header
from backend.tool_choice import build_constraint, check_ids

P = get_parser("harmony")
START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
NEXT = END + START + "assistant"  # between an analysis (or final) message and the next one


def parse(text: str) -> ParseResult:
    res = P.parse(text)
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None
        s, e = item.span
        assert 0 <= s <= e <= len(text) and text[s:e] == item.raw
    assert not any(e.message.startswith("internal") for e in res.errors), res.errors
    assert res.channels is not None
    for ch in res.channels:
        s, e = ch["span"]
        bs, be = ch["body"]
        assert 0 <= s <= bs <= be <= e <= len(text)
    return res


def calls(res: ParseResult) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in res.tool_calls]


def errs(res: ParseResult) -> list[tuple[str, tuple[int, int]]]:
    return [(e.message, e.span) for e in res.errors]


# ---- well-formed turns ----------------------------------------------------------------------------


def test_analysis_then_call():
    text = ('<|channel|>analysis<|message|>thinking...<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>')
    res = parse(text)
    assert calls(res) == [("get_weather", {"city": "Paris"})]
    assert res.reasoning == "thinking..." and res.content == "" and res.errors == []
    second = text.index(START)
    assert res.tool_calls[0].span == (second, len(text))  # the call's message, <|start|> to <|call|>
    assert res.channels == [
        {"channel": "analysis", "recipient": None, "span": [0, second], "body": [30, 41]},
        {"channel": "commentary", "recipient": "functions.get_weather", "span": [second, len(text)],
         "body": [text.index("{"), len(text) - len(CALL)]},
    ]
    assert res.to_dict()["channels"] == res.channels


def test_analysis_then_final_with_and_without_the_stripped_eos():
    base = "<|channel|>analysis<|message|>Easy. <|end|><|start|>assistant<|channel|>final<|message|>The answer"
    for text in (base, base + RETURN):
        res = parse(text)
        assert res.content == "The answer" and res.reasoning == "Easy." and res.tool_calls == [] and res.errors == []
        assert [c["channel"] for c in res.channels] == ["analysis", "final"]
        assert res.channels[1]["body"] == [base.index("The answer"), len(base)]


def test_preamble_is_content_and_the_call_is_kept():
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
            "Let me check the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
            '<|constrain|>json<|message|>{"city": "Paris"}')
    res = parse(text)
    assert res.content == "Let me check the weather." and res.reasoning == "Need weather."
    assert calls(res) == [("get_weather", {"city": "Paris"})] and res.errors == []
    assert [(c["channel"], c["recipient"]) for c in res.channels] == [
        ("analysis", None), ("commentary", None), ("commentary", "functions.get_weather")]


@pytest.mark.parametrize("header", [
    "<|channel|>commentary to=functions.f <|constrain|>json",  # what gpt-oss writes
    "<|channel|>commentary to=functions.f<|constrain|>json",  # no space before <|constrain|>
    "<|channel|>commentary to=functions.f json",  # no <|constrain|>
    "<|channel|>commentary to=functions.f",  # no content type
    " to=functions.f<|channel|>commentary json",  # recipient first (trl's gptoss.jinja)
    " to=functions.f<|channel|>commentary <|constrain|>json",
    " to=functions.f <|channel|>commentary",
])
def test_every_header_form(header):
    first = parse(header + '<|message|>{"x": [1, {"y": null}]}')
    assert calls(first) == [("f", {"x": [1, {"y": None}]})] and first.errors == []
    # the same header on a later message, after <|start|>assistant
    text = "<|channel|>analysis<|message|>a" + NEXT + header + "<|message|>{}" + CALL
    res = parse(text)
    assert calls(res) == [("f", {})] and res.errors == [] and res.reasoning == "a"
    assert res.channels[1]["recipient"] == "functions.f"


def test_built_in_tools_are_calls_named_as_written():
    text = ('<|channel|>analysis<|message|>search first<|end|><|start|>assistant<|channel|>analysis to=browser.search '
            'code<|message|>{"query": "gpt-oss", "topn": 3}<|call|><|start|>assistant to=python<|channel|>analysis code'
            '<|message|>print(1 < 2)\n')
    res = parse(text)
    assert calls(res) == [("browser.search", {"query": "gpt-oss", "topn": 3}), ("python", {"code": "print(1 < 2)\n"})]
    assert res.reasoning == "search first" and res.errors == []


def test_several_calls_and_a_leading_start():
    text = ('<|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>{"n": 1}<|call|>'
            '<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{"n": 2}<|call|>')
    res = parse(text)
    assert calls(res) == [("a", {"n": 1}), ("b", {"n": 2})] and res.errors == []
    assert res.tool_calls[0].span == (0, text.index(START, 1)) and res.tool_calls[1].span == (text.index(START, 1), len(text))


def test_empty_text_and_empty_bodies():
    res = parse("")
    assert res.to_dict() == {"content": "", "reasoning": None, "tool_calls": [], "errors": [], "channels": []}
    res = parse("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>")
    assert res.reasoning == "" and res.content == "" and res.errors == []


def test_multiline_text_and_tags_of_other_formats_are_plain_text():
    body = 'Line 1\n<tool_call>{"name": "x"}</tool_call> [TOOL_CALLS] <think>\n\n  "quoted" 中文 😀'
    res = parse(f"<|channel|>final<|message|>{body}")
    assert res.content == body.strip() and res.tool_calls == [] and res.errors == []


def test_other_parsers_results_have_no_channels_key():
    res = get_parser("hermes").parse("hi")
    assert res.channels is None and "channels" not in res.to_dict()


# ---- malformed turns: errors with spans, the good calls kept -------------------------------------

GOOD = '<|start|>assistant<|channel|>commentary to=functions.ok <|constrain|>json<|message|>{"k": 1}<|call|>'


def _around(bad: str) -> tuple[str, int, int]:
    """``bad`` as a later message between two good calls; its start and end."""
    text = GOOD + bad + GOOD
    return text, len(GOOD), len(GOOD) + len(bad)


@pytest.mark.parametrize("bad,message", [
    ("<|start|>assistant<|channel|>analysis<|end|>", "message header without <|message|> (found <|end|>)"),
    ("<|start|>assistant<|channel|>bogus<|message|>x<|end|>", "unknown channel 'bogus'"),
    ("<|start|>assistant<|message|>x<|end|>", "message without a channel"),
    ("<|start|>user<|message|>hi<|end|>", "a message from 'user' in an assistant turn"),
    ("<|start|>assistant<|channel|> final<|message|>x<|end|>", "<|channel|> with no channel name"),
    ("<|start|>assistant<|channel|>final<|channel|>analysis<|message|>x<|end|>", "two <|channel|> markers"),
    ("<|start|>assistant<|channel|>commentary foo json<|message|>{}<|call|>", "unexpected 'foo' in the message header"),
    ("<|start|>assistant<|channel|>commentary to=a to=b<|message|>{}<|call|>", "unexpected 'to=a'"),
    ("<|start|>assistant<|channel|>commentary to=<|message|>{}<|call|>", "to= with no recipient"),
    ("<|start|>assistant<|channel|>commentary to=functions.<|message|>{}<|call|>", "to=functions. with no function name"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": 1,}<|call|>', "tool call 'f': arguments are invalid JSON"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": 1<|call|>', "tool call 'f': arguments are truncated JSON: the message ends"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|>[1, 2]<|call|>', "arguments must be a JSON object, got an array"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": NaN}<|call|>', "NaN is not valid JSON"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{} {}<|call|>', "extra data after the value"),
    ('<|start|>assistant<|channel|>commentary to=functions.f json<|message|><|call|>', "truncated JSON"),
    ("<|start|>assistant<|channel|>analysis to=browser.search code<|message|>query<|call|>", "tool call 'browser.search': arguments are invalid JSON"),
])
def test_a_malformed_message_between_good_calls(bad, message):
    text, s, e = _around(bad)
    res = parse(text)
    assert calls(res) == [("ok", {"k": 1}), ("ok", {"k": 1})], res.errors
    assert len(res.errors) == 1 and message in res.errors[0].message, res.errors
    assert res.errors[0].span == (s, e) and res.errors[0].severity == "error"


def test_text_outside_any_message():
    text = GOOD + "\n junk " + GOOD
    res = parse(text)
    assert calls(res) == [("ok", {"k": 1})] * 2
    assert errs(res) == [("text outside any message (after a message ends, only <|start|> may follow)", (len(GOOD), len(GOOD) + 7))]
    res = parse("Sure, here it is.")  # not Harmony at all
    assert errs(res) == [("text outside any message (a Harmony message starts with <|channel|>)", (0, 17))]
    assert res.content == "" and res.channels == []
    text = "<|channel|>final<|message|>x<|end|><|endoftext|>"
    assert [e.raw for e in parse(text).errors] == ["<|endoftext|>"]


@pytest.mark.parametrize("cut", [
    "<|start|>", "<|start|>assistant", "<|start|>assistant<|channel|>comm",
    "<|start|>assistant<|channel|>commentary to=functions.get_wea", "<|start|>assistant to=functions.f<|channel|>commentary json",
])
def test_truncated_inside_a_header(cut):
    text = GOOD + cut
    res = parse(text)
    assert calls(res) == [("ok", {"k": 1})]
    assert errs(res) == [("the text ends inside a message header (generation truncated?)", (len(GOOD), len(text)))]


def test_truncated_first_header_and_truncated_arguments():
    res = parse("<|channel|>analys")
    assert errs(res) == [("the text ends inside a message header (generation truncated?)", (0, 17))]
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"city": "Par'
    res = parse(text)
    assert res.tool_calls == [] and len(res.errors) == 1 and res.errors[0].span == (0, len(text))
    assert res.errors[0].message.startswith("tool call 'f': arguments are truncated JSON")


def test_a_message_not_closed_before_the_next_start_is_reported_and_read():
    first = '<|channel|>commentary to=functions.a json<|message|>{"n": 1}'
    text = first + '<|start|>assistant<|channel|>final<|message|>done'
    res = parse(text)
    assert calls(res) == [("a", {"n": 1})] and res.content == "done"
    assert errs(res) == [("message not closed: <|start|> before its <|end|>, <|call|> or <|return|>", (0, len(first)))]


def test_garbage_never_raises():
    pieces = ["<|start|>", "assistant", "<|channel|>", "analysis", "commentary", "final", " to=functions.f", " to=",
              "<|constrain|>", "json", "<|message|>", "{", "}", '"', "<|end|>", "<|call|>", "<|return|>", " ", "x", "<|"]
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        res = parse(text)
        for c in res.tool_calls:
            assert isinstance(c.arguments, dict) and c.name
        assert P.parse(text).to_dict() == res.to_dict()


# ---- openai-harmony as the oracle -----------------------------------------------------------------


@pytest.fixture(scope="module")
def enc():
    from backend.families.gpt_oss import harmony_encoding

    return harmony_encoding()


def harmony_messages(enc, text: str) -> list[Any]:
    from openai_harmony import Role

    return enc.parse_messages_from_completion_tokens(enc.encode(text, allowed_special="all"), Role.ASSISTANT)


VALUE_PIECES = ["a", "Z", " ", "é", "中文", "😀", '"', "\\", "\n", "\t", "\x00", "\u2028", "{", "}", "[", "]", ",", ":",
                "'", "<", "|", "<tool_call>", "NaN", "null"]


def oracle_value(rng: random.Random, depth: int = 3) -> Any:
    k = rng.randint(0, 9)
    if depth == 0 or k < 5:
        return rng.choice([
            lambda: "".join(rng.choice(VALUE_PIECES) for _ in range(rng.randint(0, 6))),
            lambda: rng.randint(-10**6, 10**6), lambda: rng.choice([0.5, -2.25, 1e300, 0.0]),
            lambda: rng.choice([True, False, None]), lambda: int("9" * rng.randint(20, 60)),
        ])()
    if k < 7:
        return [oracle_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {"".join(rng.choice(VALUE_PIECES) for _ in range(rng.randint(0, 3))): oracle_value(rng, depth - 1)
            for _ in range(rng.randint(0, 3))}


def oracle_turn(rng: random.Random) -> str:
    """A well-formed gpt-oss turn: analysis, preambles, final text, calls to several tools and
    built-ins, every header form; the last message may end at the end of the text (EOS stripped)."""
    msgs = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["analysis", "final", "preamble", "call", "call", "builtin"])
        free = "".join(rng.choice(VALUE_PIECES + ["\n\n", "The ", "answer"]) for _ in range(rng.randint(0, 8)))
        if kind == "analysis":
            msgs.append(("<|channel|>analysis", free, END))
        elif kind == "final":
            msgs.append(("<|channel|>final", free, rng.choice([END, RETURN])))
        elif kind == "preamble":
            msgs.append(("<|channel|>commentary", free, END))
        else:
            name = rng.choice(["get_weather", "search", "add", "f.g", "tool-1", "读取"])
            recipient = f"functions.{name}" if kind == "call" else rng.choice(["browser.search", "browser.open", "container.exec"])
            args = {k: oracle_value(rng) for k in rng.sample(["city", "q", "n", "opts", "é"], rng.randint(0, 3))}
            body = json.dumps(args, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 2]),
                              separators=rng.choice([None, (",", ":")]))
            ctype = rng.choice([" <|constrain|>json", "<|constrain|>json", " json", "", " code"])
            if rng.random() < 0.5:
                header = f"<|channel|>{rng.choice(['commentary', 'analysis'])} to={recipient}{ctype}"
            else:
                header = f" to={recipient}<|channel|>{rng.choice(['commentary', 'analysis'])}{ctype}"
            msgs.append((header, body, rng.choice([CALL, END])))
    parts = []
    for k, (header, body, end) in enumerate(msgs):
        last = k == len(msgs) - 1
        parts.append(("" if k == 0 else START + "assistant") + header + "<|message|>" + body + ("" if last and rng.random() < 0.5 else end))
    return "".join(parts)


def test_agrees_with_openai_harmony_on_generated_turns(enc):
    rng = random.Random("harmony-oracle")
    n_calls = n_msgs = 0
    for _ in range(400):
        text = oracle_turn(rng)
        res = parse(text)
        assert res.errors == [], (text, res.errors)
        oracle = harmony_messages(enc, text)
        assert len(oracle) == len(res.channels), text
        want_calls, reasoning, content = [], [], []
        for m, ch in zip(oracle, res.channels):
            body = "".join(c.text for c in m.content)
            assert m.author.role.value == "assistant"
            assert (m.channel, m.recipient) == (ch["channel"], ch["recipient"]), text
            assert body == text[ch["body"][0]:ch["body"][1]], text
            if m.recipient:
                name = m.recipient.removeprefix("functions.")
                want_calls.append((name, json.loads(body)))
            elif m.channel == "analysis":
                reasoning.append(body.strip())
            else:
                content.append(body.strip())
        assert calls(res) == want_calls, text
        assert res.reasoning == ("\n\n".join(r for r in reasoning if r) if reasoning else None)
        assert res.content == "\n\n".join(c for c in content if c)
        n_calls += len(want_calls)
        n_msgs += len(oracle)
    assert n_calls > 300 and n_msgs > 1000  # the generator exercises both


def test_harmony_reads_what_we_report_as_malformed_differently_or_not_at_all(enc):
    """The deliberate differences (module docstring): Harmony returns these; we report them."""
    from openai_harmony import HarmonyError

    assert [m.channel for m in harmony_messages(enc, "<|channel|>bogus<|message|>x")] == ["bogus"]
    assert [m.recipient for m in harmony_messages(enc, "<|channel|>commentary foo json<|message|>{}")] == ["foo"]
    body = "".join(c.text for c in harmony_messages(enc, "<|channel|>final<|message|>x<|start|>assistant<|channel|>final<|message|>y")[0].content)
    assert body == "x<|start|>assistant<|channel|>final<|message|>y"
    with pytest.raises(HarmonyError):
        harmony_messages(enc, "")
    for text in ("<|channel|>bogus<|message|>x", "<|channel|>commentary foo json<|message|>{}",
                 "<|channel|>final<|message|>x<|start|>assistant<|channel|>final<|message|>y"):
        assert parse(text).errors


# ---- format_calls against Harmony's renderer and trl's template ----------------------------------

CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
    {"name": "run", "arguments": {"code": 'print("}{") # ; , ]', "n": [1, 2.5, None, True], "u": "中文 😀", "e": "a\nb\\"}},
    {"name": "noop", "arguments": {}},
]


def test_format_calls_exact_text_and_round_trip():
    one = P.format_calls(CALLS[:1])
    assert one == '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "c"}'
    assert one.startswith(P.call_begin) and P.call_end == ""
    text = P.format_calls(CALLS)
    assert text.count("<|call|><|start|>assistant") == 2 and not text.endswith(CALL)
    res = parse(text)
    assert calls(res) == [(c["name"], c["arguments"]) for c in CALLS] and res.errors == [] and res.content == ""
    assert res.reasoning is None
    assert calls(parse(text + CALL)) == calls(res)  # the final EOS left in: the same


def test_format_calls_is_what_harmonys_renderer_writes(enc):
    from openai_harmony import Conversation, Message, Role

    for calls_ in (CALLS[:1], CALLS):
        msgs = [Message.from_role_and_content(Role.ASSISTANT, json.dumps(c["arguments"], ensure_ascii=False))
                .with_channel("commentary").with_recipient("functions." + c["name"]).with_content_type("json") for c in calls_]
        rendered = enc.render_conversation(Conversation.from_messages(msgs))
        ours = START + "assistant" + P.format_calls(calls_) + CALL
        assert enc.decode_utf8(rendered) == ours
        assert enc.encode(ours, allowed_special="all") == list(rendered)  # token-exact


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from backend.families import vocab_dir

    return AutoTokenizer.from_pretrained(str(vocab_dir("o200k_harmony")))


def test_trl_template_writes_the_recipient_first_and_both_read_the_same(tok):
    from backend.loading.tokenizers import read_trl_template

    template = read_trl_template("gptoss")
    for c in CALLS:
        msgs = [{"role": "user", "content": "Go"},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}]}]
        rendered = tok.apply_chat_template(msgs, chat_template=template, tokenize=False)
        turn = rendered[rendered.rindex("<|start|>assistant"):]
        args = json.dumps(c["arguments"], ensure_ascii=False)
        # the template: recipient before the channel, "json" without <|constrain|>
        assert turn == f"<|start|>assistant to=functions.{c['name']}<|channel|>commentary json<|message|>{args}<|call|>"
        generated = turn.removeprefix("<|start|>assistant")
        ours = P.format_calls([c])
        assert ours == f"<|channel|>commentary to=functions.{c['name']} <|constrain|>json<|message|>{args}"
        assert calls(parse(generated)) == calls(parse(ours)) == [(c["name"], c["arguments"])]


# ---- declaration and template sniffing --------------------------------------------------------------


def test_declaration():
    fmt = get_format("harmony")
    assert fmt is HarmonyParser.call_format and parser_for_vllm("openai") == "harmony"
    assert fmt.forbid == " to=functions." and fmt.template_markers == ("<|channel|>", "<|constrain|>")
    assert guess_format(P.format_calls(CALLS[:1])) == "harmony"


def test_trl_gptoss_templates_sniff_as_harmony_and_no_other_template_changes():
    import backend.parsers.base as base
    from backend.loading.tokenizers import read_trl_template, trl_template_names

    names = trl_template_names()
    assert "gptoss" in names and len(names) > 10
    with_harmony = {n: guess_parser(read_trl_template(n)) for n in names}
    assert with_harmony["gptoss"] == "harmony" and with_harmony["gptoss_training"] == "harmony"
    cls = base._REGISTRY.pop("harmony")
    try:
        without = {n: guess_parser(read_trl_template(n)) for n in names}
    finally:
        base._REGISTRY["harmony"] = cls
    changed = {n for n in names if with_harmony[n] != without[n]}
    assert changed == {"gptoss", "gptoss_training"}, changed


# ---- the tool_choice grammar at token level ---------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "root": {"type": "integer"}}, "required": ["a", "root"]}}},
]
WEATHER = P.format_calls([{"name": "get_weather", "arguments": {"city": "Paris"}}])
ADD = P.format_calls([{"name": "add", "arguments": {"a": 1, "root": 2}}])
ANALYSIS = "<|channel|>analysis<|message|>The user wants a < b and 1 <= 2; call it." + NEXT


def ids(tok, text: str, stop: int | None = None) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id if stop is None else stop]


def test_required_grammar_admits_one_call_with_optional_analysis(tok):
    c = build_constraint("required", "harmony", TOOLS, max_calls=4)
    assert c.spec.startswith("root ::= analysis? call\n")
    for text in (WEATHER, ADD, ANALYSIS + WEATHER, ANALYSIS + ADD,
                 P.format_calls([{"name": "get_weather", "arguments": {"city": "中文 \"q\"\n", "unit": "f"}}])):
        assert check_ids(c, tok, ids(tok, text)) is None, text
        assert c.given_check is not None and calls(parse(text))
    assert tok.encode(WEATHER, add_special_tokens=False)[0] == tok.convert_tokens_to_ids("<|channel|>")  # one special token


@pytest.mark.parametrize("bad,why", [
    (P.format_calls([{"name": "add", "arguments": {"a": 1, "root": 2}}] * 2), "not allowed"),  # one call per turn
    ("<|channel|>final<|message|>It is sunny.", "not allowed"),
    ("<|channel|>analysis<|message|>hmm<|channel|>final" + NEXT + WEATHER, "not allowed"),  # a tag inside the analysis
    (WEATHER.replace('"Paris"', "42"), "not allowed"),
    (WEATHER.replace('"city"', '"town"'), "not allowed"),
    (WEATHER.replace("get_weather", "get_wether"), "not allowed"),
    (WEATHER.replace(" <|constrain|>json", " json"), "not allowed"),  # the grammar writes gpt-oss's own header
    (WEATHER.replace('"Paris"}', '"Paris", "unit": "k"}'), "not allowed"),
    (ADD.replace('"root": 2', '"root": 2.5'), "not allowed"),
    (WEATHER + " and more", "not allowed"),
    (ANALYSIS, "not allowed"),  # EOS where the call must come
])
def test_required_grammar_rejects(tok, bad, why):
    c = build_constraint("required", "harmony", TOOLS)
    assert why in (check_ids(c, tok, ids(tok, bad)) or ""), bad


def test_named_tool_and_none(tok):
    named = build_constraint("add", "harmony", TOOLS)
    assert check_ids(named, tok, ids(tok, ANALYSIS + ADD)) is None
    assert check_ids(named, tok, ids(tok, WEATHER))
    none = build_constraint("none", "harmony", TOOLS)
    assert none.spec == [" to=functions."]
    assert check_ids(none, tok, ids(tok, WEATHER)) and check_ids(none, tok, ids(tok, "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{}"))
    assert check_ids(none, tok, ids(tok, ANALYSIS + "<|channel|>final<|message|>Hi")) is None
    assert "without EOS" in check_ids(named, tok, ids(tok, ADD)[:-1])


def test_the_call_ends_at_call_when_it_is_the_stop_token(tok):
    """With gpt-oss's stop tokens (<|call|>, <|return|>) the matcher stops at <|call|>: the grammar
    ends where the call's JSON ends, and the generator's stop token ends the turn."""
    import xgrammar as xgr

    c = build_constraint("required", "harmony", TOOLS)
    stop_ids = tok.convert_tokens_to_ids(["<|call|>", "<|return|>"])
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=stop_ids)
    compiled = xgr.GrammarCompiler(info).compile_grammar(c.spec)
    for text, ok in ((ANALYSIS + WEATHER, True), (WEATHER[:-3], False)):
        m = xgr.GrammarMatcher(compiled)
        accepted = all(m.accept_token(t) for t in ids(tok, text, stop=stop_ids[0]))
        assert (accepted and m.is_terminated()) is ok, text


def test_tool_rules_are_renamed_apart():
    ebnf = 'root ::= "{" "\\"root\\"" ": " root_x "}"\nroot_x ::= [a-z\\]root] | "root"'
    assert prefix_rules(ebnf, "t0_") == 't0_root ::= "{" "\\"root\\"" ": " t0_root_x "}"\nt0_root_x ::= [a-z\\]root] | "root"'
    assert call_header("f") == "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"


# ---- structured fuzz with the shared helpers -------------------------------------------------------


def _bad_args(r: Rand) -> str:
    """Arguments that are not one strict JSON object (cut, mutated, non-object, NaN), with no Harmony tag."""
    good = json.dumps(rand_args(r, tags=False), ensure_ascii=r.chance(0.5))
    while True:
        k = r.randint(0, 3)
        if k == 0:
            s = good[: r.randint(0, len(good) - 1)]
        elif k == 1:
            i = r.randint(0, len(good))
            s = good[:i] + r.choice(["}", "]", '"', ",", "x", ":", "{"]) + good[i:]
        elif k == 2:
            s = r.choice(["[1, 2]", "3", "null", '"s"', "true"])
        else:
            s = r.choice(['{"v": NaN}', '{"v": 1e999}', "{'a': 1}", "{} {}"])
        if not _strict_object(s):
            return s


def _reject(name: str) -> Any:
    raise ValueError(name)


def _finite(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise ValueError(s)
    return v


def _strict_object(s: str) -> bool:
    try:
        return isinstance(json.loads(s, parse_constant=_reject, parse_float=_finite), dict)
    except (ValueError, RecursionError):
        return False


def gen_harmony(r: Rand) -> Case:
    c = Case("harmony")
    c.check_content = False
    n = r.randint(1, 6)
    for k in range(n):
        last = k == n - 1
        start = "" if k == 0 else START + "assistant"
        what = r.choice(["analysis", "final", "preamble", "call", "call", "builtin", "bad_args", "bad_channel",
                         "no_message", "junk", "cut"])
        end = "" if last and r.chance(0.5) else None
        if what in ("analysis", "final", "preamble"):
            t = "".join(r.choice(["text", " ", "\n", "é中", "{", '"', "<tool_call>", "[TOOL_CALLS]", "<", "|"])
                        for _ in range(r.randint(0, 6)))
            ch = {"analysis": "analysis", "final": "final", "preamble": "commentary"}[what]
            c.add(f"{start}<|channel|>{ch}<|message|>{t}" + (END if end is None else end))
            if what == "analysis":
                c.add_reasoning(t)
        elif what in ("call", "builtin"):
            name = rand_name(r)
            args = rand_args(r, tags=True)
            rec = f"functions.{name}" if what == "call" else r.choice(["browser.search", "container.exec"])
            header = r.choice([f"<|channel|>commentary to={rec} <|constrain|>json", f" to={rec}<|channel|>commentary json",
                               f"<|channel|>analysis to={rec} code", f"<|channel|>commentary to={rec}"])
            body = json.dumps(args, ensure_ascii=r.chance(0.3), separators=r.choice([None, (",", ":")]))
            c.add(f"{start}{header}<|message|>{body}" + (CALL if end is None else end))
            c.calls.append((name if what == "call" else rec, args, None))
        elif what == "bad_args":
            c.add_bad(f"{start}<|channel|>commentary to=functions.{rand_name(r)} json<|message|>{_bad_args(r)}"
                      + (CALL if end is None else end), "bad arguments")
        elif what == "bad_channel":
            c.add_bad(f"{start}<|channel|>{r.choice(['comentary', 'thoughts', 'Final'])}<|message|>x" + (END if end is None else end),
                      "unknown channel")
        elif what == "no_message":
            c.add_bad(f"{start}<|channel|>{r.choice(['analysis', 'final'])} text" + END, "header without <|message|>")
        elif what == "junk" and k > 0:
            c.add_bad(r.choice(["junk", " ", "\n", "{}", "<|endoftext|>"]), "text outside any message")
            c.add(f"{START}assistant<|channel|>final<|message|>ok{END}")
        elif what == "cut" and last and k > 0:
            c.add_bad(r.choice([START, f"{START}assistant", f"{START}assistant<|channel|>fin",
                                f"{START}assistant to=functions.f<|channel|>commentary"]), "truncated header")
        else:
            c.add(f"{start}<|channel|>final<|message|>fine{END}")
    return c


def test_structured_fuzz():
    r = Rand(random.Random("structured-harmony"))
    good = bad = 0
    for _ in range(5000):
        case = gen_harmony(r)
        check_structured(case, P.parse(case.text))
        good += len(case.calls)
        bad += len(case.bad)
    assert good > 4000 and bad > 4000


def test_mutated_fuzz():
    r = Rand(random.Random("mutated-harmony"))
    for k in range(5000):
        text = gen_harmony(r).text
        for tag in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|constrain|>", " to=functions."):
            if r.chance(0.1):
                i = r.randint(0, len(text))
                text = text[:i] + tag + text[i:]
        check_mutated("harmony", P, mutate(r, text), twice=k % 10 == 0)


# ---- linear time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [
    lambda: "<|channel|>analysis<|message|>" + "x <" * 350_000,
    lambda: P.format_calls([{"name": "big", "arguments": {"blob": "\\\"{[<|" * 200_000}}]),
    lambda: P.format_calls([{"name": "f", "arguments": {"i": 1}}] * 12_000),
    lambda: "<|channel|>" * 100_000,
    lambda: "<|start|>" * 100_000,
    lambda: "<|channel|>final<|message|>x" + "<|end|>" * 100_000,
    lambda: "<|channel|>commentary to=functions.f json<|message|>" + "{" * 600_000,
    lambda: " to=x" * 200_000,
    lambda: ("<|channel|>commentary to=functions.f json<|message|>{\"a\": \"" + "<|call|><|start|>assistant" * 30_000),
])
def test_a_megabyte_parses_without_an_internal_error(build):
    text = build()
    assert len(text) >= 500_000
    res = P.parse(text)  # time per byte: bench/bench_parsers.py (no timed assertion here)
    assert not any(e.message.startswith("internal") for e in res.errors)
