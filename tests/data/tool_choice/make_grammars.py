"""Writes tests/data/tool_choice/grammars.json: the tool_choice constraints for a fixed set of tools.

Run once against the ORIGINAL code (commit main before issue 13 moved format knowledge onto the
parsers) with `PYTHONPATH=. python tests/data/tool_choice/make_grammars.py $(git rev-parse HEAD)`;
the file is a refactoring pin (tests/test_tool_choice.py::test_grammars_match_the_pre_refactoring_output)."""
import json
import sys

from backend.tool_choice import build_constraint

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "need_k", "parameters": {"type": "object", "required": ["k"]}}},
    {"type": "function", "function": {"name": "nested", "parameters": {"type": "object", "properties": {
        "o": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "number"}}}, "required": ["x"]},
        "opts": {"type": "object"}, "s": {"type": "string"}}, "required": ["o", "s"]}}},
    {"name": "bare", "parameters": {"type": "object", "properties": {"n": {"type": "float"}}}},
    {"type": "function", "function": {"name": "noparams"}},
]
CASES = []
for fmt in ["hermes", "hunyuan", "llama3_json", "mistral"]:
    for mc in (None, 1, 3, 17):
        CASES.append((fmt, "required", mc, "all"))
    CASES.append((fmt, "required", 2, "one"))
    CASES.append(("vllm:" + fmt, "required", None, "one"))
    for name in ("get_weather", "need_k", "bare", "noparams"):
        CASES.append((fmt, name, None, "all"))
    CASES.append((fmt, "none", None, "all"))
    CASES.append(("vllm:" + fmt, "none", None, "all"))
out = {"commit": sys.argv[1], "tools": TOOLS, "cases": []}
for parser, choice, mc, which in CASES:
    tools = TOOLS if which == "all" else TOOLS[:1]
    c = build_constraint(choice, parser, tools, max_calls=mc)
    out["cases"].append({"parser": parser, "choice": choice, "max_calls": mc, "tools": which,
                         "kind": c.kind, "spec": c.spec, "description": c.description})
out["errors"] = []
for parser, choice in [("transformers", "required"), ("vllm:qwen3_json", "none"), ("hermes", "missing")]:
    try:
        build_constraint(choice, parser, TOOLS)
    except Exception as e:
        out["errors"].append({"parser": parser, "choice": choice, "message": str(e)})
json.dump(out, open("tests/data/tool_choice/grammars.json", "w"), indent=1, ensure_ascii=False)
print(len(out["cases"]))
