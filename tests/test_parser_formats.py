"""Tool-call formats are declared once, on their parser (``ToolCallParser.call_format``): the
template sniffer, tool_choice, the vLLM adapter and the importers read the declarations, so a
new format is one module in ``backend/parsers``. Shown here by a format defined in this file."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import backend.parsers
from backend.loading.tokenizers import load_tokenizer, read_trl_template
from backend.parsers import (
    PARSER_MODULES,
    ParseResult,
    ToolCallFormat,
    ToolCallParser,
    available_parsers,
    get_format,
    get_parser,
    guess_format,
    guess_parser,
    parser_for_vllm,
    register_parser,
    tool_call_formats,
    unregister_parser,
)
from backend.tool_choice import ToolChoiceError, build_constraint, check_ids
from backend.trace import ToolCall

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "echo", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}},
]

OPEN, CLOSE = "<|fn|>", "<|/fn|>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


class DemoParser(ToolCallParser):
    """What a new format module holds: the declaration, a parser and a writer. Calls are
    ``<|fn|>{"name": ..., "args": {...}}<|/fn|>``, written one after another with no separator."""

    call_format = ToolCallFormat(OPEN, CLOSE, call_open=OPEN, call_close=CLOSE, args_key="args", vllm_names=("demo_fn",))
    call_begin, call_end = OPEN, CLOSE

    def _parse(self, text: str) -> ParseResult:
        calls, content, pos = [], [], 0
        for m in _CALL.finditer(text):
            content.append(text[pos:m.start()])
            v = json.loads(m.group(1))
            calls.append(ToolCall(name=v["name"], arguments=v["args"], span=m.span(), raw=m.group()))
            pos = m.end()
        content.append(text[pos:])
        return ParseResult(content="".join(content).strip(), tool_calls=calls)

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return "".join(OPEN + json.dumps({"name": c["name"], "args": c.get("arguments", {})}) + CLOSE for c in calls)


@pytest.fixture
def demo():
    """Registered the way a new module registers its parser; removed afterwards."""
    register_parser("demo_fn")(DemoParser)
    yield "demo_fn"
    unregister_parser("demo_fn")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3").tokenizer


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def test_a_format_declared_in_one_class_is_used_everywhere(demo, tok):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}Call tools as " + OPEN + "{json}" + CLOSE
    # the template sniffer, the vLLM name and the registry know it
    assert guess_parser(template) == demo and guess_format(template) == demo
    assert guess_parser(read_trl_template("qwen3")) == "hermes"  # the others are unaffected
    assert parser_for_vllm("demo_fn") == demo and get_format(demo) is DemoParser.call_format
    assert demo in tool_call_formats()
    # tool_choice builds its grammar from the declaration, and the grammar admits what the writer writes
    parser = get_parser(demo)
    calls = [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "echo", "arguments": {"s": "hi"}}]
    text = parser.format_calls(calls)
    required = build_constraint("required", demo, TOOLS, max_calls=2)
    assert required.spec.startswith(f'root ::= tool_call ("" tool_call)?\ntool_call ::= "{OPEN}" tool_body "{CLOSE}"\n')
    assert check_ids(required, tok, _ids(tok, text)) is None
    assert check_ids(required, tok, _ids(tok, text + parser.format_calls(calls[:1])))  # 3 calls > max_calls
    assert check_ids(required, tok, _ids(tok, get_parser("hermes").format_calls(calls)))  # another format's text
    named = build_constraint("echo", demo, TOOLS)
    assert check_ids(named, tok, _ids(tok, parser.format_calls(calls[1:]))) is None
    assert check_ids(named, tok, _ids(tok, parser.format_calls(calls[:1])))
    none = build_constraint("none", demo, TOOLS)
    assert none.spec == [OPEN] and check_ids(none, tok, _ids(tok, text)) and check_ids(none, tok, _ids(tok, "Fine.")) is None
    # the scripted backend's check of a given turn parses it with the new parser
    assert required.given_check.check_text(text) is None
    assert "no tool call" in required.given_check.check_text("Fine.")
    # and the parser reads the calls back
    res = parser.parse("Sure. " + text)
    assert res.content == "Sure." and [(c.name, c.arguments) for c in res.tool_calls] == [(d["name"], d["arguments"]) for d in calls]


def test_an_unregistered_format_is_not_supported_by_tool_choice():
    assert guess_format(OPEN) is None
    with pytest.raises(ToolChoiceError, match="not supported for the 'demo_fn' format"):
        build_constraint("required", "demo_fn", TOOLS)


def test_the_native_formats_declarations():
    f = tool_call_formats()
    assert ["hermes", "hunyuan", "llama3_json", "mistral"] == [n for n in f if n in ("hermes", "hunyuan", "llama3_json", "mistral")]
    assert {n: f[n].forbid for n in ("hermes", "hunyuan", "llama3_json", "mistral")} == {
        "hermes": "<tool_call>", "hunyuan": "<tool_calls>", "llama3_json": '{"name"', "mistral": "[TOOL_CALLS]"}
    expected = {
        "hermes": "hermes", "qwen3_json": "hermes", "hunyuan_a13b": "hunyuan", "llama3_json": "llama3_json",
        "llama4_json": "llama3_json", "mistral": "mistral", "pythonic": "pythonic", "llama4_pythonic": "pythonic",
        "qwen3_coder": "qwen3_xml", "qwen3_xml": "qwen3_xml", "openai": "harmony", "deepseek_v3": "deepseek_v3",
        "deepseek_v31": "deepseek_v31", "glm45": "glm45", "kimi_k2": "kimi_k2", "granite": "granite",
        "phi4_mini_json": "phi4_mini_json", "minimax_m2": "minimax_m2", "internlm": None, "jamba": None}
    assert {v: parser_for_vllm(v) for v in expected} == expected
    for name, fmt in f.items():  # each parser's writer starts with what its format is recognised by
        text = get_parser(name).format_calls([{"name": "f", "arguments": {"x": 1}}])
        assert fmt.open_tag == "" or name == "llama3_json" or text.startswith(fmt.open_tag), name


@pytest.mark.parametrize("text,expected", [
    ("", None), ("plain text", None),
    ("x <tool_call> y", "hermes"), ("<tool_calls>[]</tool_calls>", "hunyuan"), ("[TOOL_CALLS] [", "mistral"),
    ("<|python_tag|>{", "llama3_json"), ("{% if m.role == 'ipython' %}", "llama3_json"),
    ("<tool_call> and an ipython role", "hermes"),  # a tag wins over a generic word
    ('{"name": "f", "parameters": {}}', None),  # a bare key is no marker
])
def test_guess_format(text, expected):
    assert guess_format(text) == expected
    assert guess_parser(text) == (expected or "hermes")


def test_the_parser_table_names_every_parser_module_and_loads_lazily():
    """Parsers are listed in one table (name -> module), imported on first use; every module of the
    package that defines a parser class has its row, and each row's module registers that name."""
    names = [m.name for m in pkgutil.iter_modules(backend.parsers.__path__) if not m.name.startswith("_")]
    table_modules = {m.rsplit(".", 1)[1] for m in PARSER_MODULES.values()}
    for n in names:
        src = (ROOT / "backend" / "parsers" / f"{n}.py").read_text(encoding="utf-8")
        if "@register_parser(" in src:
            assert n in table_modules, f"backend/parsers/{n}.py registers a parser but has no row in PARSER_MODULES"
    for name, module in PARSER_MODULES.items():
        assert name in available_parsers()
        assert module in sys.modules
    assert importlib.import_module("backend.parsers.hermes").HermesParser.call_format is get_format("hermes")


def test_no_module_outside_the_parsers_package_imports_its_private_names():
    bad = []
    for path in [*ROOT.joinpath("backend").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py"), ROOT / "app.py"]:
        if "parsers" in path.relative_to(ROOT).parts[:2] or not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("backend.parsers"):
                if any(p.startswith("_") for p in node.module.split(".")) or any(a.name.startswith("_") for a in node.names):
                    bad.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                bad += [f"{path.relative_to(ROOT)}: import {a.name}" for a in node.names
                        if a.name.startswith("backend.parsers.") and any(p.startswith("_") for p in a.name.split("."))]
    assert bad == []
