"""tool_choice: grammar construction checked by xgrammar's own matcher on real token ids, the
per-turn policy, and the scripted backend refusing scripts that break the constraint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backend.engine import AgentLoop, ConfigError, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.parsers import get_parser, tool_call_formats
from backend.tool_choice import ToolChoiceError, build_constraint, check_ids, choice_for_turn, normalize_policy
from backend.tools import ToolRegistry

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}, "mock": {"value": {"temperature": 21}}},
    {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}},
     "mock": {"value": 3}},
]
SCHEMAS = [{k: v for k, v in t.items() if k != "mock"} for t in TOOLS]
FORMATS = tool_call_formats()
GOLDEN = Path(__file__).parent / "data" / "tool_choice" / "grammars.json"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3").tokenizer


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_required_grammar_accepts_what_the_parser_writes(tok, fmt):
    """Each format's own writer (parser.format_calls) produces text the grammar accepts, and the
    parser reads the calls back: grammar, writer and parser agree."""
    parser = get_parser(fmt, tools=SCHEMAS)  # formats that type values by schema read them
    calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]
    calls = calls[: FORMATS[fmt].max_calls_per_turn or len(calls)]  # gpt-oss: one call per turn
    text = parser.format_calls(calls)
    c = build_constraint("required", fmt, SCHEMAS)
    assert check_ids(c, tok, ids(tok, text)) is None, text
    parsed = parser.parse(text)
    assert [(x.name, x.arguments) for x in parsed.tool_calls] == [(d["name"], d["arguments"]) for d in calls]


def test_required_rejects_prose_bad_arguments_and_missing_eos(tok):
    c = build_constraint("required", "hermes", SCHEMAS)
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert check_ids(c, tok, ids(tok, good)) is None
    assert "not allowed" in check_ids(c, tok, ids(tok, "It is sunny."))
    assert "not allowed" in check_ids(c, tok, ids(tok, good.replace('"Paris"', "42")))  # city must be a string
    assert "not allowed" in check_ids(c, tok, ids(tok, good.replace('"city"', '"town"')))
    assert "not allowed" in check_ids(c, tok, ids(tok, good.replace("get_weather", "get_wether")))
    assert "not allowed" in check_ids(c, tok, ids(tok, good.replace('"Paris"}', '"Paris", "unit": "k"}')))  # enum
    assert "complete" in check_ids(c, tok, ids(tok, good)[:-1])  # no EOS
    assert "not allowed" in check_ids(c, tok, ids(tok, good + " and more"))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_required_is_bounded_by_max_calls(tok, fmt):
    """``required`` with max_calls=N accepts 1..N calls and refuses N+1 (the loop passes
    max_parallel_calls: a small model would otherwise write calls until its token budget ends)."""
    parser = get_parser(fmt, tools=SCHEMAS)
    call = {"name": "add", "arguments": {"a": 1, "b": 2}}
    per_turn = FORMATS[fmt].max_calls_per_turn  # a format's own bound (gpt-oss: one call, then <|call|>)
    for n_max in (1, 2, 3):
        c = build_constraint("required", fmt, SCHEMAS, max_calls=n_max)
        bound = min(n_max, per_turn) if per_turn else n_max
        for n in range(1, bound + 1):
            assert check_ids(c, tok, ids(tok, parser.format_calls([call] * n))) is None, (fmt, n_max, n)
        assert check_ids(c, tok, ids(tok, parser.format_calls([call] * (bound + 1)))), (fmt, n_max)
    many = build_constraint("required", fmt, SCHEMAS)  # no bound
    n_many = per_turn or 20
    assert check_ids(many, tok, ids(tok, parser.format_calls([call] * n_many))) is None
    if per_turn:
        assert check_ids(many, tok, ids(tok, parser.format_calls([call] * (per_turn + 1))))


def test_engine_bounds_required_by_max_parallel_calls():
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator

    bundle = load_tokenizer("qwen3")
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    for parallel, ok in ((1, False), (2, True)):
        cfg = LoopConfig(tool_choice=["required", "auto"], max_parallel_calls=parallel)
        loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, [two, "3."]), bundle, tools=ToolRegistry.from_schemas(TOOLS), config=cfg)
        trace = asyncio.run(loop.run([{"role": "user", "content": "1+2 twice"}]))
        first = trace.steps[1]
        assert first.constraint["description"].startswith("tool_choice=required: " + ("one call" if parallel == 1 else "1 to 2 calls"))
        if ok:
            assert trace.termination_reason == "no_tool_calls" and len(first.tool_calls) == 2
        else:  # the script breaks the choice: the scripted backend refuses it, as a real backend could not produce it
            assert trace.termination_reason == "generation_error" and "tool_choice" in (first.error or "") + (getattr(trace.steps[-1].info, "error", None) or "")


def test_named_tool_allows_only_that_tool(tok):
    c = build_constraint("add", "hermes", SCHEMAS)
    assert check_ids(c, tok, ids(tok, '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')) is None
    assert check_ids(c, tok, ids(tok, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x"}}\n</tool_call>'))
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert check_ids(c, tok, ids(tok, two))  # exactly one call


def test_none_forbids_the_call_tag(tok):
    c = build_constraint("none", "hermes", SCHEMAS)
    assert c.kind == "forbid"
    assert check_ids(c, tok, ids(tok, "Sunny.")) is None
    assert check_ids(c, tok, ids(tok, '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'))
    assert build_constraint("auto", "hermes", SCHEMAS) is None


def test_policy_parsing():
    assert normalize_policy("required,auto") == ("required", "auto")
    assert normalize_policy(["required", "add"]) == ("required", "add")
    assert normalize_policy({"type": "function", "function": {"name": "add"}}) == ("add",)
    assert [choice_for_turn(("required", "auto"), i) for i in range(4)] == ["required", "auto", "auto", "auto"]
    with pytest.raises(ToolChoiceError):
        normalize_policy({"type": "function"})
    with pytest.raises(ToolChoiceError):
        normalize_policy(",")


def run(tok_bundle, script, **cfg):
    gen = ScriptedGenerator(tok_bundle.tokenizer, script)
    loop = AgentLoop(gen, tok_bundle, tools=ToolRegistry.from_schemas(TOOLS), config=LoopConfig(**cfg))
    return asyncio.run(loop.run([{"role": "user", "content": "Weather in Paris?"}]))


def test_engine_records_constraint_per_turn():
    b = load_tokenizer("qwen3")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    t = run(b, [call, "It is 21 degrees."], tool_choice=["required", "auto"])
    gens = [s for s in t.steps if s.state == "generating"]
    assert gens[0].constraint["tool_choice"] == "required" and gens[0].constraint["kind"] == "grammar"
    assert gens[1].constraint is None
    assert t.termination_reason == "no_tool_calls"
    # constrained tokens are generated tokens: mask 1
    assert all(m == 1 for m in t.full_mask[gens[0].start : gens[0].end])


def test_scripted_backend_refuses_a_script_that_breaks_the_choice():
    b = load_tokenizer("qwen3")
    t = run(b, ["It is sunny, no tool needed."], tool_choice="required")
    assert t.termination_reason == "generation_error"
    assert "does not obey" in t.steps[1].error


def test_bad_tool_choice_is_a_config_error():
    b = load_tokenizer("qwen3")
    with pytest.raises(ConfigError, match="not defined"):
        run(b, ["x"], tool_choice="nope")
    gen = ScriptedGenerator(b.tokenizer, ["x"])
    with pytest.raises(ConfigError, match="needs at least one tool"):
        AgentLoop(gen, b, tools=None, config=LoopConfig(tool_choice="required"))


def test_transformers_style_arguments_json_roundtrip(tok):
    """Arguments with nested objects and unicode still satisfy the schema-derived grammar."""
    schema = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "o": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "number"}}}, "required": ["x"]},
        "s": {"type": "string"}}, "required": ["o", "s"]}}}]
    c = build_constraint("required", "hermes", schema)
    text = "<tool_call>\n" + json.dumps({"name": "f", "arguments": {"o": {"x": [1, 2.5]}, "s": "Zürich"}}, ensure_ascii=False) + "\n</tool_call>"
    assert check_ids(c, tok, ids(tok, text)) is None


# ---- schemas the grammar must read as JSON Schema does ------------------------------------------


def _turn(tok, name, args, fmt="hermes"):
    return ids(tok, get_parser(fmt).format_calls([{"name": name, "arguments": args}]))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_required_keys_without_properties_are_admitted(tok, fmt):
    """{"type": "object", "required": ["k"]} admitted only {} (which breaks its own required):
    now the required key with any value, other keys too (no "properties": any keys), never {}."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["k"]}}}]
    c = build_constraint("required", fmt, tools)
    assert check_ids(c, tok, _turn(tok, "f", {"k": 1}, fmt)) is None
    assert check_ids(c, tok, _turn(tok, "f", {"k": {"deep": [1, "x"]}, "other": True}, fmt)) is None
    assert check_ids(c, tok, _turn(tok, "f", {}, fmt)), "{} breaks required"
    assert check_ids(c, tok, _turn(tok, "f", {"other": 1}, fmt))
    # nested, and beside listed properties
    tools = [{"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "o": {"type": "object", "required": ["x"]}}, "required": ["a", "o", "z"]}}}]
    c = build_constraint("required", fmt, tools)
    assert check_ids(c, tok, _turn(tok, "g", {"a": 1, "o": {"x": None}, "z": "any"}, fmt)) is None
    assert check_ids(c, tok, _turn(tok, "g", {"a": 1, "o": {}, "z": 1}, fmt))
    assert check_ids(c, tok, _turn(tok, "g", {"a": 1, "o": {"x": 1}}, fmt))  # z is required


def test_an_object_without_properties_admits_any_object(tok):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"opts": {"type": "object"}}}}}]
    c = build_constraint("required", "hermes", tools)
    assert check_ids(c, tok, _turn(tok, "f", {"opts": {"a": 1, "b": [2]}})) is None
    assert check_ids(c, tok, _turn(tok, "f", {"extra": 1}))  # listed properties: only those (structured outputs)


SCRIPT_TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}},
     "mock": {"template": "{a}+{b}"}},
    {"type": "function", "function": {"name": "strict", "description": "Strict", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False}},
     "mock": "ok"},
    {"type": "function", "function": {"name": "need_k", "description": "Needs k", "parameters": {"type": "object", "required": ["k"]}},
     "mock": "k"},
]


def _scripted(script, choice, **cfg):
    b = load_tokenizer("qwen3")
    loop = AgentLoop(ScriptedGenerator(b.tokenizer, script), b, tools=ToolRegistry.from_schemas(SCRIPT_TOOLS),
                     config=LoopConfig(tool_choice=choice, **cfg))
    return asyncio.run(loop.run([{"role": "user", "content": "go"}]))


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "add", "arguments": {"b": 2, "a": 1}}\n</tool_call>',  # key order
    '<tool_call>\n{"arguments": {"a": 1, "b": 2}, "name": "add"}\n</tool_call>',  # name after the arguments
    '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>',  # compact JSON, no newlines
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2, "note": "x"}}\n</tool_call>',  # a key the schema allows
    '<tool_call>\n{"name": "need_k", "arguments": {"k": 1}}\n</tool_call>',  # required without properties
    '<tool_call>\n{"name": "add", "arguments": {"b": 2, "a": 1}}\n</tool_call>\n<tool_call>\n{"name": "strict", "arguments": {"q": "x"}}\n</tool_call>',
])
def test_a_given_turn_is_checked_by_what_the_schema_accepts(tok, text):
    """The scripted backend checks a script against tool_choice by parsing it and validating the
    calls with jsonschema, not with the generation grammar (which forces key order, whitespace
    and only listed keys): a turn the schema accepts runs."""
    t = _scripted([text, "done"], ["required", "auto"], max_parallel_calls=2)
    assert t.termination_reason == "no_tool_calls", t.steps[1].error
    assert all(r.ok for r in t.steps[2].tool_results)
    if '"b": 2, "a": 1' in text:  # generation, by contrast, writes the schema's key order
        assert check_ids(build_constraint("required", "hermes", [x for x in SCRIPT_TOOLS]), tok, ids(tok, text))


@pytest.mark.parametrize("text,why", [
    ("It is sunny.", "has no tool call"),
    ('Sure: <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "text besides its tool calls"),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', "'b' is a required property"),
    ('<tool_call>\n{"name": "add", "arguments": {"a": "1", "b": 2}}\n</tool_call>', "a: '1' is not of type 'integer'"),
    ('<tool_call>\n{"name": "strict", "arguments": {"q": "x", "extra": 1}}\n</tool_call>', "Additional properties are not allowed"),
    ('<tool_call>\n{"name": "need_k", "arguments": {}}\n</tool_call>', "'k' is a required property"),
    ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', "'nope', which tool_choice=required"),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}\n</tool_call>', "cannot be read"),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' * 3, "allows at most 2"),
])
def test_a_given_turn_that_breaks_the_choice_is_refused_with_the_reason(text, why):
    t = _scripted([text, "done"], ["required", "auto"], max_parallel_calls=2)
    assert t.termination_reason == "generation_error"
    assert "does not obey" in t.steps[1].error and why in t.steps[1].error, t.steps[1].error


def test_a_given_turn_under_a_named_choice_and_without_eos():
    from backend.tool_choice import check_given

    b = load_tokenizer("qwen3")
    c = build_constraint("add", "hermes", [{k: v for k, v in t.items() if k != "mock"} for t in SCRIPT_TOOLS])
    tok = b.tokenizer
    good = '<tool_call>\n{"name": "add", "arguments": {"b": 2, "a": 1}}\n</tool_call>'
    assert check_given(c, tok, ids(tok, good)) is None
    assert "does not allow" in check_given(c, tok, ids(tok, good.replace('"add"', '"strict"')))
    assert "at most 1" in check_given(c, tok, ids(tok, good + "\n" + good))
    assert "does not end with EOS" in check_given(c, tok, ids(tok, good)[:-1])
    # a scripted turn given as token ids without EOS is refused the same way
    t = _scripted([{"token_ids": tok.encode(good, add_special_tokens=False)}, "done"], ["add", "auto"])
    assert t.termination_reason == "generation_error" and "does not end with EOS" in t.steps[1].error
    none = build_constraint("none", "hermes", [])
    assert check_given(none, tok, ids(tok, good)) and check_given(none, tok, ids(tok, "Fine.")) is None


# ---- refactoring pin ---------------------------------------------------------------------------


def test_grammars_match_the_pre_refactoring_output():
    """The constraints every format builds are the same strings as before issue 13 moved the
    format tables from tool_choice onto the parsers' declarations. ``data/tool_choice/grammars.json``
    is a golden file written by the ORIGINAL code (at the commit it names, with
    ``data/tool_choice/make_grammars.py``): a pin for the refactoring, not a spec."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    tools = golden["tools"]
    assert len(golden["cases"]) >= 40 and {c["parser"] for c in golden["cases"]} >= {"hermes", "hunyuan", "llama3_json", "mistral"}
    for case in golden["cases"]:
        c = build_constraint(case["choice"], case["parser"], tools if case["tools"] == "all" else tools[:1], max_calls=case["max_calls"])
        assert (c.kind, c.spec, c.description) == (case["kind"], case["spec"], case["description"]), case
    for err in golden["errors"]:
        if err["parser"] == "vllm:qwen3_json":
            # issue 21: vLLM's qwen3_json reads hermes' format, so it now gets hermes' constraint
            assert build_constraint(err["choice"], err["parser"], tools).spec == build_constraint(err["choice"], "hermes", tools).spec
            continue
        with pytest.raises(ToolChoiceError) as e:
            build_constraint(err["choice"], err["parser"], tools)
        # the same text while the four formats are all there are; a format module added later joins the list
        assert str(e.value) == err["message"].replace("hermes, hunyuan, llama3_json, mistral", ", ".join(FORMATS))
