"""Qwen3-Coder / Qwen3.5 / Qwen3.6 tool calls (XML parameters; trl's ``qwen3_5_think``,
``qwen3_5_nothink``, ``qwen3_6`` and ``qwen3_8`` templates; vLLM's ``qwen3_coder`` / ``qwen3_xml``)::

    <think>
    reasoning
    </think>

    Some text.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>
    <tool_call>
    <function=get_time>
    </function>
    </tool_call>

Reading. Each ``<tool_call>`` block holds one ``<function=NAME>`` block (several are read as
several calls, with a warning) of ``<parameter=KEY>`` blocks. A value is the text between
``<parameter=KEY>`` and the first ``</parameter>``, less one leading and one trailing line break
(the template's markup), as vLLM reads it; for a parameter whose schema admits only objects
and/or arrays the value is first decoded as JSON, so a ``</parameter>`` inside a JSON string does
not end it. The template writes strings raw, with no escaping, so a string value holding a tag of
the format is ambiguous: a ``<parameter=`` or ``</function>`` before the ``</parameter>`` is read as
an unclosed parameter and reported. A ``<function=`` block outside ``<tool_call>`` is read as a call,
as vLLM does, with a warning. ``<think>…</think>`` is reasoning; a leading ``…</think>`` with no
``<think>`` (the qwen3_5_think / qwen3_6 generation prompt opens it) is reasoning too.

Typing (vLLM's rules, from the ``tools`` the parser is built with): without tools, for a tool not
in them, for a tool without ``properties`` and for a parameter not in ``properties``, every value
is the string written. Otherwise the property's types (``type``, a list of types, the types of its
``enum`` values, ``anyOf``/``oneOf``/``allOf`` merged; aliases such as ``int``/``float``/``dict``;
no type: string) are tried in the order null (``null``, any case), integer (``int()``), number
(``float()``, finite; integral values become ints), boolean (``true``/``false``/``1``/``0``, any
case), object, array (JSON), string (the text as written). With only unknown type names the value
is decoded as JSON if it is JSON, else kept as text.

Where ours differs from vLLM (deliberately): a value that none of its declared types can read
(``abc`` for an integer) is kept as the raw string the model wrote, and a ``severity="warning"``
ParseError spans the value. vLLM instead decodes such a value as any JSON it happens to be
(``1.5`` for an integer becomes 1.5), and reads an ``object`` parameter's ``3`` as 3: that hides
the mismatch, where the raw string plus the warning shows it, and a JSON Schema check of the
arguments (tool_choice's, the tool's own) still sees a wrong type. For the same reason JSON read
for an ``object`` (``array``) type must be an object (array). Errors (the call is not returned):
an unclosed ``<tool_call>``, ``<function=`` or ``<parameter=``, a ``<tool_call>`` without
``<function=``, an empty name; each spans its block, and the calls around it are kept. Warnings
(the call is returned as read): text between the tags (spans the text), a duplicate parameter (the
last value is kept, as vLLM does; spans the later one), a value its type cannot read.

Writing (:meth:`Qwen3XmlParser.format_calls`) follows trl's ``qwen3_6`` / ``qwen3_8`` templates:
strings raw, other values as ``tojson`` (``true``, ``null``, ``{"a": 1}``). trl's ``qwen3_5_*``
templates write non-string scalars with Jinja's ``string`` filter (Python's ``True``, ``None``):
``get_parser("qwen3_xml", python_scalars=True)`` writes those.

``tool_choice`` grammar (:meth:`Qwen3XmlFormat.custom_grammar`): ``<tool_call>\\n<function=NAME>\\n``,
then each parameter as ``<parameter=KEY>\\nVALUE\\n</parameter>\\n`` in the schema's
``properties`` order (required ones must appear, optional ones may be left out; a tool without
``properties`` takes any parameters with string values), then ``</function>\\n</tool_call>``;
several calls separated by ``\\n``. VALUE for a parameter that may be a string (or has no type):
any text holding none of ``</parameter>``, ``<parameter=``, ``</function>`` (an enum of strings:
one of them, raw); otherwise xgrammar's JSON grammar of the property's schema. String constraints
other than ``enum`` (``pattern``, lengths) are not enforced.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_at, decode_whole, dumps, rstrip_end, skip_ws
from backend.parsers._grammar import calls_root, json_schema_rules, text_without
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNC, FUNC_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# The name in <function=NAME> / <parameter=NAME>: up to '>' on the same line, no tag inside.
_NAME = re.compile(r"[^<>\n]*")
_SCAN = re.compile("|".join(re.escape(t) for t in (THINK_CLOSE, THINK_OPEN, OPEN, FUNC)))

# vLLM's type aliases (tool_parsers/utils.py) and its order of trying types.
_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
    "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
    "float": "number", "float32": "number", "float64": "number", "double": "number",
    "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
# Tags a string value cannot hold (the parser reads them as the value's end or as an unclosed one).
_VALUE_STOPS = (PARAM_END, PARAM, FUNC_END)


def schema_types(schema: Any) -> set[str]:
    """The JSON types a property's schema admits, as vLLM reads them: ``type`` (or a list),
    the types of ``enum`` values, ``anyOf``/``oneOf``/``allOf`` merged (a branch that says
    nothing counts as string), aliases mapped, lower case; ``{"string"}`` when nothing says."""
    return {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in _raw_types(schema, 0)}


def _raw_types(schema: Any, depth: int) -> set[str]:
    if not isinstance(schema, dict) or depth > 64:
        return {"string"}
    found: set[str] = set()
    t = schema.get("type")
    for x in (t if isinstance(t, list) else [t]):
        if isinstance(x, str):
            found.add(x)
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            kind = ("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                    else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                    else "array" if isinstance(v, list) else "object" if isinstance(v, dict) else None)
            if kind is not None:
                found.add(kind)
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(k), list):
            for branch in schema[k]:
                found |= _raw_types(branch, depth + 1)
    return found or {"string"}


def _json(raw: str) -> tuple[Any, bool]:
    """``raw`` as one JSON value (JSON whitespace around it allowed; NaN, infinities and numbers
    that overflow are not JSON), as ``json.loads`` plus vLLM's finiteness check reads it."""
    s = raw.strip(" \t\n\r")
    value, end, err = decode_at(s, 0)
    return value, err is None and end == len(s)


def convert_value(raw: str, schema: Any) -> tuple[Any, str | None]:
    """``raw`` (a parameter's text) typed by its property ``schema``: ``(value, None)``, or
    ``(raw, why)`` when none of the declared types can read it."""
    types = schema_types(schema)
    for t in _ORDER:
        if t not in types:
            continue
        if t == "null":
            if raw.lower() == "null":
                return None, None
        elif t == "integer":
            try:
                return int(raw), None
            except ValueError:
                pass
        elif t == "number":
            try:
                f = float(raw)
            except ValueError:
                continue
            if math.isfinite(f):
                return (int(f) if f == int(f) else f), None
        elif t == "boolean":
            low = raw.lower().strip()
            if low in ("true", "1"):
                return True, None
            if low in ("false", "0"):
                return False, None
        elif t in ("object", "array"):
            v, ok = _json(raw)
            if ok and isinstance(v, dict if t == "object" else list):
                return v, None
        else:
            return raw, None
    known = [t for t in _ORDER if t in types]
    if not known:  # only type names vLLM does not know: JSON if it is JSON, else the text
        v, ok = _json(raw)
        return (v if ok else raw), None
    shown = raw if len(raw) <= 40 else raw[:37] + "..."
    return raw, f"{shown!r} is not {' or '.join(known)}: kept as the text the model wrote"


class _Bad(Exception):
    """A call that cannot be read: ``at`` is where reading stopped."""

    def __init__(self, at: int, message: str) -> None:
        super().__init__(message)
        self.at = at
        self.message = message


@dataclass
class _Function:
    name: str
    start: int
    end: int  # after </function>
    params: dict[str, tuple[int, int]]  # key -> value span (line breaks of the markup removed)
    notes: list[tuple[int, int, str]]  # warnings


def _check_tag_name(what: str, name: str) -> None:
    if not name or any(c in name for c in "<>\n") or name != name.strip():
        raise ValueError(f"{what} {name!r} cannot be written in the XML tool-call format (empty, or holds '<', '>', "
                         "a line break or surrounding spaces)")


@dataclass(frozen=True)
class Qwen3XmlFormat(ToolCallFormat):
    """The XML layout; its tool_choice grammar is built here (see the module docstring)."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        lit = ebnf_literal
        rules: list[str] = []
        fns: list[str] = []
        uses_text = uses_name = False
        for ti, (name, params) in enumerate(tools):
            _check_tag_name("tool name", name)
            fn = f"q3x_t{ti}"
            parts = [lit(f"{FUNC}{name}>\n")]
            params = params if isinstance(params, dict) else {}
            props = params.get("properties")
            required = params.get("required") if isinstance(params.get("required"), list) else []
            if isinstance(props, dict):  # only the listed parameters (none for "properties": {})
                for pi, (key, schema) in enumerate(props.items()):
                    _check_tag_name("parameter name", key)
                    prule = f"{fn}_p{pi}"
                    value, extra = self._value_rule(schema, prule)
                    uses_text = uses_text or value == "q3x_text"
                    rules.append(f"{prule} ::= {lit(f'{PARAM}{key}>' + chr(10))} {value} {lit(chr(10) + PARAM_END + chr(10))}")
                    rules.extend(extra)
                    parts.append(prule if key in required else f"{prule}?")
            # other parameters: any, when the schema lists none (JSON Schema's default) or says
            # so explicitly (tool_choice.grammar_parameters marks required keys given without
            # properties that way); listed properties alone admit no other (xgrammar's strict mode)
            extra = params.get("additionalProperties")
            if extra is True or (not isinstance(props, dict) and extra is not False):
                uses_text = uses_name = True
                rules.append(f'{fn}_any ::= {lit(PARAM)} q3x_name {lit(">" + chr(10))} q3x_text {lit(chr(10) + PARAM_END + chr(10))}')
                parts.append(f"{fn}_any*")
            rules.insert(0, f"{fn} ::= " + " ".join(parts))
            fns.append(fn)
        head = [
            calls_root("q3x_call", open_="", sep="\n", close="", multiple=multiple, max_calls=max_calls),
            f"q3x_call ::= {lit(OPEN + chr(10))} ({' | '.join(fns)}) {lit(FUNC_END + chr(10) + CLOSE)}",
        ]
        if uses_text:
            rules.extend(text_without("q3x_text", _VALUE_STOPS))
        if uses_name:
            rules.append("q3x_name ::= [^<>\\n]+")
        return "\n".join([*head, *rules])

    @staticmethod
    def _value_rule(schema: Any, prefix: str) -> tuple[str, list[str]]:
        """``(rule, extra rules)`` for one parameter's VALUE."""
        types = schema_types(schema)
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if types == {"string"} and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            if not any(stop in v for v in enum for stop in _VALUE_STOPS):
                return f"{prefix}_enum", [f"{prefix}_enum ::= " + " | ".join(ebnf_literal(v) for v in enum)]
        if "string" in types or not types & set(_ORDER) or not isinstance(schema, dict):
            return "q3x_text", []
        rule, body = json_schema_rules(schema, prefix + "_")
        return rule, [body]


FORMAT = Qwen3XmlFormat(
    OPEN, CLOSE, call_open=OPEN + "\n", call_close="\n" + CLOSE, sep="\n",
    # "</parameter>" is longer than hermes' "<tool_call>" (a tie would go to hermes by name); a
    # call without parameters is recognised by its first line (the templates spell it "\n")
    markers=(PARAM_END, OPEN + "\n" + FUNC, OPEN + "\\n" + FUNC),
    vllm_names=("qwen3_coder", "qwen3_xml"),
    response_open="<tool_response>", response_close="</tool_response>",
    turn_open="<|im_start|>", turn_close="<|im_end|>",  # ChatML
)


@register_parser("qwen3_xml")
class Qwen3XmlParser(ToolCallParser):
    call_format = FORMAT
    call_begin, call_end = FORMAT.call_open, FORMAT.call_close

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None, accept_unclosed: bool = False,
                 python_scalars: bool = False) -> None:
        """``accept_unclosed``: a call complete to ``</function>`` at the end of the text is kept
        (loops that stop generation on ``</tool_call>``). ``python_scalars``: write non-string
        scalars as trl's qwen3_5 templates do (``True``, ``None``)."""
        super().__init__(tokenizer, tools)
        self.accept_unclosed = accept_unclosed
        self.python_scalars = python_scalars
        self._props: dict[str, dict[str, Any]] = {}
        for t in tools if isinstance(tools, list) else []:
            fn = t.get("function", t) if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or fn["name"] in self._props:
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            self._props[fn["name"]] = props if isinstance(props, dict) else {}

    # ---- reading -------------------------------------------------------------------------------

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)
        n = len(text)
        col = Collector(text)
        f = {t: Finder(text, t) for t in (OPEN, CLOSE, FUNC, FUNC_END, PARAM, PARAM_END, THINK_CLOSE)}

        def function_at(i: int) -> _Function:
            """Read ``<function=NAME> ... </function>`` whose tag starts at ``i``."""
            m = _NAME.match(text, i + len(FUNC))
            j = m.end()  # type: ignore[union-attr]
            if j >= n or text[j] != ">":
                raise _Bad(j, f"unclosed {FUNC} tag: no '>' after the name on its line" + (" (generation truncated?)" if j >= n else ""))
            name = m.group().strip()  # type: ignore[union-attr]
            if not name:
                raise _Bad(j, f"empty function name in {FUNC}>")
            fn = _Function(name, i, i, {}, [])
            props = self._props.get(name) or {}
            pos = j + 1
            while True:
                k = skip_ws(text, pos)
                if text.startswith(PARAM, k):
                    pos = parameter_at(fn, k, props)
                    continue
                if text.startswith(FUNC_END, k):
                    fn.end = k + len(FUNC_END)
                    return fn
                if k >= n:
                    raise _Bad(n, f"unclosed <function={name}>: the text ends before {FUNC_END} (generation truncated?)")
                nxt = first(k, PARAM, FUNC_END)
                stop = first(k, CLOSE, OPEN, FUNC)
                if nxt == -1 or (stop != -1 and stop < nxt):
                    raise _Bad(k, f"unclosed <function={name}>: no {FUNC_END} before "
                               + ("the end of the text" if stop == -1 else repr(text[stop:stop + 12])))
                fn.notes.append((k, rstrip_end(text, k, nxt), f"text between the tags of <function={name}> (ignored)"))
                pos = nxt

        def parameter_at(fn: _Function, k: int, props: dict[str, Any]) -> int:
            m = _NAME.match(text, k + len(PARAM))
            j = m.end()  # type: ignore[union-attr]
            if j >= n or text[j] != ">":
                raise _Bad(j, f"unclosed {PARAM} tag: no '>' after the name on its line" + (" (generation truncated?)" if j >= n else ""))
            key = m.group().strip()  # type: ignore[union-attr]
            if not key:
                raise _Bad(j, f"empty parameter name in {PARAM}> of {fn.name!r}")
            v0 = j + 1
            end = json_end(v0, props.get(key))
            if end == -1:
                end = f[PARAM_END].find(v0)
                early = first(v0, PARAM, FUNC_END)
                if early != -1 and (end == -1 or early < end):  # (its block's end, not the text's, ends the error)
                    raise _Bad(early, f"unclosed <parameter={key}> in {fn.name!r}: {text[early:early + 12]!r} comes before its {PARAM_END}")
                if end == -1:
                    raise _Bad(n, f"unclosed <parameter={key}> in {fn.name!r}: no {PARAM_END} (generation truncated?)")
            vs, ve = v0, end
            if text.startswith("\n", vs):
                vs += 1
            if ve > vs and text[ve - 1] == "\n":
                ve -= 1
            if key in fn.params:
                fn.notes.append((k, end + len(PARAM_END), f"duplicate parameter {key!r} in {fn.name!r}: the last value is kept"))
            fn.params[key] = (vs, ve)
            return end + len(PARAM_END)

        def json_end(v0: int, schema: Any) -> int:
            """Where ``</parameter>`` is when the value must be JSON (object/array only) and is:
            a tag inside a JSON string then does not end it. -1 otherwise."""
            if schema is None or not schema_types(schema) <= {"object", "array"}:
                return -1
            i = v0 + 1 if text.startswith("\n", v0) else v0
            _, e, err = decode_at(text, i)
            if err is not None:
                return -1
            e = e + 1 if text.startswith("\n", e) else e
            return e if text.startswith(PARAM_END, e) else -1

        def first(k: int, *tags: str) -> int:
            best = -1
            for t in tags:
                p = f[t].find(k)
                if p != -1 and (best == -1 or p < best):
                    best = p
            return best

        def fail(start: int, bad: _Bad, close: str, stops: tuple[str, ...]) -> int:
            """One error from ``start`` to the end of its block: past the next ``close``, or
            before the next of ``stops``, or the end of the text."""
            c = f[close].find(bad.at)
            s = first(bad.at, *stops)
            if c != -1 and (s == -1 or c < s):
                end = c + len(close)
                col.add_error(start, end, bad.message)
                return end
            stop = n if s == -1 else s
            col.add_error(start, rstrip_end(text, start, stop), bad.message)
            return stop

        def keep(fns: list[_Function], start: int, end: int, notes: list[tuple[int, int, str]]) -> None:
            for idx, fn in enumerate(fns):
                s = start if idx == 0 else fn.start
                e = end if idx == len(fns) - 1 else fn.end
                props = self._props.get(fn.name) or {}
                args: dict[str, Any] = {}
                for key, (vs, ve) in fn.params.items():
                    raw = text[vs:ve]
                    if key in props:
                        value, why = convert_value(raw, props[key])
                        if why is not None:
                            notes.append((vs, ve, f"parameter {key!r} of {fn.name!r}: {why}"))
                        args[key] = value
                    else:
                        args[key] = raw
                col.add_call(fn.name, args, None, s, e)
                notes.extend(fn.notes)
            for s, e, msg in notes:
                col.add_error(s, e, msg, severity="warning")

        def tool_call_at(start: int, after: int) -> int:
            fns: list[_Function] = []
            notes: list[tuple[int, int, str]] = []
            try:
                k = skip_ws(text, after)
                if not text.startswith(FUNC, k):
                    if k >= n:
                        raise _Bad(n, f"unclosed {OPEN}: the text ends right after it (generation truncated?)")
                    fpos = f[FUNC].find(k)
                    stop = first(k, CLOSE, OPEN)
                    if fpos == -1 or (stop != -1 and stop < fpos):
                        raise _Bad(k, f"{OPEN} without {FUNC}NAME>")
                    notes.append((k, rstrip_end(text, k, fpos), f"text between {OPEN} and {FUNC} (ignored)"))
                    k = fpos
                while True:
                    fn = function_at(k)
                    if fns:
                        notes.append((fn.start, fn.end, f"another {FUNC} block in the same {OPEN}: read as another call"))
                    fns.append(fn)
                    k = skip_ws(text, fn.end)
                    if text.startswith(CLOSE, k):
                        end = k + len(CLOSE)
                        break
                    if text.startswith(FUNC, k):
                        continue
                    if k >= n:
                        if not self.accept_unclosed:
                            raise _Bad(n, f"unclosed {OPEN}: the text ends before {CLOSE} (generation truncated?)")
                        end = fn.end
                        break
                    c = f[CLOSE].find(k)
                    stop = first(k, OPEN, FUNC)
                    if c == -1 or (stop != -1 and stop < c):
                        raise _Bad(k, f"unclosed {OPEN}: no {CLOSE} after {FUNC_END}")
                    notes.append((k, rstrip_end(text, k, c), f"text between {FUNC_END} and {CLOSE} (ignored)"))
                    end = c + len(CLOSE)
                    break
            except _Bad as bad:
                return fail(start, bad, CLOSE, (OPEN,))
            keep(fns, start, end, notes)
            return end

        def bare_function_at(start: int) -> int:
            try:
                fn = function_at(start)
            except _Bad as bad:
                return fail(start, bad, FUNC_END, (OPEN, FUNC))
            keep([fn], start, fn.end, [(start, fn.end, f"a {FUNC} block outside {OPEN}: read as a call, as vLLM does")])
            return fn.end

        # reasoning, content and calls
        pos = 0
        first_close = f[THINK_CLOSE].find(0)
        if first_close != -1:
            before = first(0, OPEN, FUNC)
            if text.find(THINK_OPEN, 0, first_close) == -1 and (before == -1 or before > first_close):
                col.add_reasoning(text[:first_close])
                pos = first_close + len(THINK_CLOSE)
        while pos < n:
            m = _SCAN.search(text, pos)
            if m is None:
                col.add_content(pos, n)
                break
            col.add_content(pos, m.start())
            tag = m.group()
            if tag == OPEN:
                pos = max(tool_call_at(m.start(), m.end()), m.end())
            elif tag == FUNC:
                pos = max(bare_function_at(m.start()), m.end())
            elif tag == THINK_OPEN:
                close = f[THINK_CLOSE].find(m.end())
                if close == -1:
                    col.add_reasoning(text[m.end():])
                    break
                col.add_reasoning(text[m.end():close])
                pos = close + len(THINK_CLOSE)
            else:  # a stray </think> after other text: kept as text
                col.add_content(m.start(), m.end())
                pos = m.end()
        return col.result()

    # ---- writing -------------------------------------------------------------------------------

    def _value_text(self, v: Any) -> str:
        if isinstance(v, str):
            return v
        if self.python_scalars and not isinstance(v, (dict, list, tuple)):
            return str(v)  # Jinja's |string of a Python scalar
        return dumps(v)

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        out = []
        for c in calls:
            args = c.get("arguments") or {}
            if isinstance(args, str):  # arguments as a JSON string (OpenAI's wire form)
                args, err = decode_whole(args)
                if err is not None or not isinstance(args, dict):
                    raise ValueError(f"call {c.get('name')!r}: arguments must be an object or a JSON string holding one")
            params = "".join(f"{PARAM}{k}>\n{self._value_text(v)}\n{PARAM_END}\n" for k, v in args.items())
            out.append(f"{OPEN}\n{FUNC}{c['name']}>\n{params}{FUNC_END}\n{CLOSE}")
        return "\n".join(out)
