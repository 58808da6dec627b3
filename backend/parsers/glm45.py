"""GLM-4.5 / 4.6 / 4.7 tool calls (trl's ``glm4moe.jinja``)::

    <think>reasoning</think>
    Some text.
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>[1, 2]</arg_value>
    </tool_call>
    <tool_call>get_time
    </tool_call>

GLM-4.7 writes the same tags without the line breaks (``<tool_call>f<arg_key>k</arg_key>…``);
whitespace between the tags is not significant. A value is the raw text between
``<arg_value>`` and ``</arg_value>`` (the template writes strings as they are and other values
as JSON). Typed as vLLM's ``glm45`` parser types them: with the tools given to the constructor,
each value is converted by its parameter's schema types (null, integer, number, boolean,
object/array as JSON, string; then JSON if it parses); without a schema for it a value stays a
string. A call ends at its ``</tool_call>``; one that cannot be read (no name, an unclosed tag,
text between the tags, a missing ``</tool_call>``) is one error spanning it, and the calls around
it are kept. A ``<tool_call>`` whose block is cut by the next ``<tool_call>`` or the end of the
text is an "unclosed" error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_whole, dumps, rstrip_end, scan_tagged, skip_ws
from backend.parsers._grammar import calls_root, json_schema_rules, text_without
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
# The function name: the text up to the first tag, bounded (no backtracking)
_NAME = re.compile(r"[^<]{0,1024}")
_BAD_NAME = re.compile(r"[\s{}\"\[\]]")
# Raw (string) values and keys may not hold these: our parser (and vLLM's) would end them there
_VALUE_STOPS = (VALUE_CLOSE, OPEN, CLOSE)
_KEY_STOPS = (KEY_CLOSE, OPEN, CLOSE)


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter schema admits (``type``, ``enum`` values, ``anyOf``/``oneOf``/
    ``allOf``); ``{"string"}`` when it says nothing (as vLLM reads it)."""
    if not isinstance(schema, dict):
        return {"string"}
    out: set[str] = set()
    t = schema.get("type")
    if isinstance(t, str):
        out.add(t)
    elif isinstance(t, list):
        out.update(x for x in t if isinstance(x, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            out.add("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                    else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                    else "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "string")
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(k), list):
            for sub in schema[k]:
                out |= schema_types(sub)
    return out or {"string"}


_ALIASES = {"str": "string", "text": "string", "int": "integer", "float": "number", "double": "number", "bool": "boolean",
            "dict": "object", "list": "array"}


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    return True


def typed_value(raw: str, schema: Any) -> Any:
    """``raw`` (the text of one ``<arg_value>``) as the parameter's type: the first of null,
    integer, number, boolean, object/array (JSON), string that the schema admits and the text
    reads as; else the JSON value the text holds; else the text."""
    types = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in schema_types(schema)}
    for t in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if t not in types:
            continue
        if t == "null" and raw.lower() == "null":
            return None
        if t == "string":
            return raw
        if t == "integer":
            try:
                return int(raw)
            except ValueError:
                continue
        if t == "number":
            try:
                f = float(raw)
            except ValueError:
                continue
            if math.isfinite(f):
                return int(f) if f == int(f) else f
        if t == "boolean" and raw.strip().lower() in ("true", "1", "false", "0"):
            return raw.strip().lower() in ("true", "1")
        if t in ("object", "array"):
            v, err = decode_whole(raw)
            if err is None:
                return v
    v, err = decode_whole(raw)
    return raw if err is not None or not _finite(v) else v


def _properties(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    if not tools:
        return None
    out: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
            props = params.get("properties")
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


@dataclass(frozen=True)
class GlmFormat(ToolCallFormat):
    """GLM's layout for the tool_choice grammar: per call ``<tool_call>NAME\\n`` then one
    ``<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n`` per argument (in the schema's
    ``properties`` order; optional ones may be left out) then ``</tool_call>``; calls separated
    by a line break. A value the schema lets be a string is raw text without ``</arg_value>``
    (nor ``<tool_call>``/``</tool_call>``), any other value compact JSON."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        lit = ebnf_literal
        rules: list[str] = [*text_without("raw_value", _VALUE_STOPS)]
        calls = []
        for k, (name, params) in enumerate(tools):
            props = params.get("properties")
            props = props if isinstance(props, dict) else {}
            required = set(params.get("required") or []) if isinstance(params.get("required"), list) else set()
            parts = []
            for j, (key, sub) in enumerate(props.items()):
                if "string" in schema_types(sub):
                    value = "raw_value"
                else:
                    value, sub_rules = json_schema_rules(sub, f"t{k}_p{j}_")
                    rules.append(sub_rules)
                rules.append(f"t{k}_a{j} ::= {lit(KEY_OPEN + key + KEY_CLOSE + chr(10) + VALUE_OPEN)} {value} {lit(VALUE_CLOSE + chr(10))}")
                parts.append(f"t{k}_a{j}" if key in required else f"(t{k}_a{j})?")
            extra = params.get("additionalProperties")
            if extra is True or (not props and extra is not False):  # any other keys, raw values
                if not any(r.startswith("raw_key ::=") for r in rules):
                    rules += text_without("raw_key", _KEY_STOPS)
                rules.append(f"t{k}_any ::= {lit(KEY_OPEN)} raw_key {lit(KEY_CLOSE + chr(10) + VALUE_OPEN)} raw_value "
                             f"{lit(VALUE_CLOSE + chr(10))}")
                parts.append(f"(t{k}_any)*")
            rules.append(f"t{k}_call ::= {lit(OPEN + name + chr(10))} {' '.join(parts)} {lit(CLOSE)}".replace("  ", " "))
            calls.append(f"(t{k}_call)")
        root = calls_root("call", open_="", sep="\n", close="", multiple=multiple, max_calls=max_calls)
        return "\n".join([root, "call ::= " + " | ".join(calls), *rules])


@register_parser("glm45")
class Glm45Parser(ToolCallParser):
    call_format = GlmFormat(
        OPEN, CLOSE, sep="\n", vllm_names=("glm45", "glm47"),
        markers=(KEY_CLOSE + "\n" + VALUE_OPEN, KEY_CLOSE + VALUE_OPEN, VALUE_CLOSE),  # longer than hermes' <tool_call>
        response_open="<tool_response>", response_close="</tool_response>",
    )
    call_begin, call_end = OPEN, CLOSE

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None, compact: bool = False) -> None:
        """``compact``: write calls as GLM-4.7 / GLM-5's templates do, with no line breaks between
        the tags (reading takes both layouts)."""
        super().__init__(tokenizer, tools)
        self._props = _properties(tools)
        self.compact = compact

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)
        n = len(text)
        close_finder = Finder(text, CLOSE)
        open_finder = Finder(text, OPEN)
        key_close = Finder(text, KEY_CLOSE)
        value_close = Finder(text, VALUE_CLOSE)

        def handle(col: Collector, start: int, after: int) -> int:
            close = close_finder.find(after)
            nxt = open_finder.find(after)
            if close != -1 and (nxt == -1 or close < nxt):
                limit, closed = close, True
            else:
                limit, closed = (nxt if nxt != -1 else n), False

            def fail(msg: str) -> int:
                if closed:
                    col.add_error(start, limit + len(CLOSE), msg)
                    return limit + len(CLOSE)
                col.add_error(start, rstrip_end(text, start, limit), f"unclosed {OPEN} ({msg})" if not msg.startswith("unclosed") else msg)
                return limit

            m = _NAME.match(text, after, limit)
            name = m.group().strip() if m else ""
            i = m.end() if m else after
            if not name:
                if not closed and skip_ws(text, after) >= n:
                    return fail(f"unclosed {OPEN}: the text ends right after it (generation truncated?)")
                return fail(f"no function name after {OPEN}")
            if _BAD_NAME.search(name):
                return fail(f"expected a function name after {OPEN}, found {name[:30]!r}")
            args: dict[str, Any] = {}
            props = None if self._props is None else self._props.get(name, {})
            while True:
                i = skip_ws(text, i)
                if i >= limit:
                    if closed:
                        col.add_call(name, args, None, start, limit + len(CLOSE))
                        return limit + len(CLOSE)
                    where = "the text ends" if limit >= n else f"another {OPEN} follows"
                    return fail(f"unclosed {OPEN}: {where} before {CLOSE} (generation truncated?)")
                if not text.startswith(KEY_OPEN, i):
                    return fail(f"tool call {name!r}: expected {KEY_OPEN} or {CLOSE}, found {text[i:min(i + 20, limit)]!r}")
                ke = key_close.find(i + len(KEY_OPEN))
                if ke == -1 or ke + len(KEY_CLOSE) > limit:
                    return fail(f"tool call {name!r}: {KEY_OPEN} without {KEY_CLOSE}")
                key = text[i + len(KEY_OPEN) : ke].strip()
                j = skip_ws(text, ke + len(KEY_CLOSE))
                if not text.startswith(VALUE_OPEN, j) or j >= limit:
                    found = text[j:min(j + 20, limit)]
                    return fail(f"tool call {name!r}: expected {VALUE_OPEN} after the key {key!r}, found {found!r}")
                ve = value_close.find(j + len(VALUE_OPEN))
                if ve == -1 or ve + len(VALUE_CLOSE) > limit:
                    return fail(f"tool call {name!r}: {VALUE_OPEN} of {key!r} without {VALUE_CLOSE}")
                raw = text[j + len(VALUE_OPEN) : ve]
                args[key] = raw if props is None or key not in props else typed_value(raw, props[key])
                i = ve + len(VALUE_CLOSE)

        return scan_tagged(text, OPEN, handle, "<think>", "</think>").result()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        nl = "" if self.compact else "\n"
        out = []
        for c in calls:
            lines = [f"{OPEN}{c['name']}"]
            for k, v in (c.get("arguments") or {}).items():
                lines.append(f"{KEY_OPEN}{k}{KEY_CLOSE}{nl}{VALUE_OPEN}{v if isinstance(v, str) else dumps(v)}{VALUE_CLOSE}")
            lines.append(CLOSE)
            out.append(nl.join(lines))
        return nl.join(out)
