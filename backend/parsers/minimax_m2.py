"""MiniMax-M2 / M2.1 / M2.5 / M2.7 tool calls (their ``chat_template.jinja``; vLLM's ``minimax_m2``)::

    reasoning
    </think>

    Some text.
    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    <invoke name="get_time">
    </invoke>
    </minimax:tool_call>

Reading. A ``<minimax:tool_call>`` block holds ``<invoke name="NAME">`` blocks (one call each) of
``<parameter name="KEY">VALUE</parameter>`` tags; the name may be in double or single quotes or
bare, as vLLM reads it. A value is the text between ``>`` and the first ``</parameter>``, kept
verbatim (whitespace included), as vLLM keeps it; for a parameter whose schema admits only objects
and/or arrays the value is first decoded as JSON, so a ``</parameter>`` inside a JSON string does
not end it. ``<think>…</think>`` is reasoning; a leading ``…</think>`` with no ``<think>`` (the
generation prompt opens it) is reasoning too. An ``<invoke`` block outside ``<minimax:tool_call>``
is read as a call, as vLLM does, with a warning.

Typing: as vLLM's parser engine types them (``coerce_to_schema_type``), from the ``tools`` the
parser is built with; the rules (and the one deliberate difference: a value none of its declared
types can read is kept as the string written, with a warning) are qwen3_xml's
(:func:`backend.parsers.qwen3_xml.convert_value`). Without tools every value is the string written.

Errors (the call is not returned, the calls around it are kept; each spans its block): an unclosed
``<minimax:tool_call>``, ``<invoke`` or ``<parameter`` (vLLM ends a parameter at the next
``<parameter name=`` and returns a call cut by the end of the text without a word), an empty name, a
block with no ``<invoke``. Warnings (the call is returned as read): text between the tags, a
duplicate parameter (the last value is kept, as vLLM does), a value its type cannot read.

Writing (:meth:`MiniMaxM2Parser.format_calls`) follows the template: one block, each call
``<invoke name="NAME">\\n`` then ``<parameter name="KEY">VALUE</parameter>\\n`` per argument (strings
raw, other values ``tojson``) then ``</invoke>\\n``. The template writes ``\\n`` before the block (after
the content); a model's turn that has no content starts with it.

``tool_choice`` grammar: that layout, parameters in the schema's ``properties`` order (required ones
must appear, optional ones may be left out; a tool without ``properties`` takes any parameters with
string values). VALUE for a parameter that may be a string: any text holding none of
``</parameter>``, ``<parameter name=``, ``</invoke>`` (an enum of strings: one of them); otherwise
xgrammar's JSON grammar of the property's schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_at, decode_whole, dumps, rstrip_end, skip_ws
from backend.parsers._grammar import calls_root, json_schema_rules, text_without
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal
from backend.parsers.qwen3_xml import convert_value, schema_types

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
PARAM, PARAM_END = "<parameter name=", "</parameter>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# a name: "…", '…' or bare (up to '>' or whitespace), then '>'
_NAME = re.compile(r"""\s*(?:"(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s>"']+))\s*>""")
_SCAN = re.compile("|".join(re.escape(t) for t in (OPEN, INVOKE, THINK_CLOSE, THINK_OPEN)))
# tags a string value cannot hold (the parser would end it there or read an unclosed parameter)
_VALUE_STOPS = (PARAM_END, PARAM, INVOKE_END)
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


class _Bad(Exception):
    """A call that cannot be read: ``at`` is where reading stopped."""

    def __init__(self, at: int, message: str) -> None:
        super().__init__(message)
        self.at = at
        self.message = message


@dataclass
class _Invoke:
    name: str
    start: int
    end: int
    params: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[tuple[int, int, str]] = field(default_factory=list)


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or any(c in name for c in '"<>\n'):
        raise ValueError(f"{what} {name!r} cannot be written in MiniMax's tool-call format (empty, or holds '\"', '<', "
                         "'>', a line break or surrounding spaces)")


@dataclass(frozen=True)
class MiniMaxM2Format(ToolCallFormat):
    """MiniMax-M2's layout; its tool_choice grammar is built here (see the module docstring)."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        lit = ebnf_literal
        rules: list[str] = []
        invokes: list[str] = []
        uses_text = uses_name = False
        for ti, (name, params) in enumerate(tools):
            _check_name("tool name", name)
            inv = f"mm2_t{ti}"
            parts = [lit(f'{INVOKE}"{name}">\n')]
            params = params if isinstance(params, dict) else {}
            props = params.get("properties")
            required = params.get("required") if isinstance(params.get("required"), list) else []
            if isinstance(props, dict):
                for pi, (key, schema) in enumerate(props.items()):
                    _check_name("parameter name", key)
                    prule = f"{inv}_p{pi}"
                    value, extra = _value_rule(schema, prule)
                    uses_text = uses_text or value == "mm2_text"
                    rules.append(f"{prule} ::= {lit(f'{PARAM}{chr(34)}{key}{chr(34)}>')} {value} {lit(PARAM_END + chr(10))}")
                    rules.extend(extra)
                    parts.append(prule if key in required else f"{prule}?")
            extra_ok = params.get("additionalProperties")
            if extra_ok is True or (not isinstance(props, dict) and extra_ok is not False):
                uses_text = uses_name = True
                rules.append(f'{inv}_any ::= {lit(PARAM + chr(34))} mm2_name {lit(chr(34) + ">")} mm2_text {lit(PARAM_END + chr(10))}')
                parts.append(f"{inv}_any*")
            parts.append(lit(INVOKE_END + "\n"))
            rules.insert(0, f"{inv} ::= " + " ".join(parts))
            invokes.append(inv)
        head = [
            calls_root("mm2_invoke", open_=OPEN + "\n", sep="", close=CLOSE, multiple=multiple, max_calls=max_calls),
            f"mm2_invoke ::= {' | '.join(invokes)}",
        ]
        if uses_text:
            rules.extend(text_without("mm2_text", _VALUE_STOPS))
        if uses_name:
            rules.append('mm2_name ::= [^"<>\\n]+')
        return "\n".join([*head, *rules])


def _value_rule(schema: Any, prefix: str) -> tuple[str, list[str]]:
    """``(rule, extra rules)`` for one parameter's VALUE."""
    types = schema_types(schema)
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if types == {"string"} and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        if not any(stop in v for v in enum for stop in _VALUE_STOPS):
            return f"{prefix}_enum", [f"{prefix}_enum ::= " + " | ".join(ebnf_literal(v) for v in enum)]
    if "string" in types or not types & set(_ORDER) or not isinstance(schema, dict):
        return "mm2_text", []
    rule, body = json_schema_rules(schema, prefix + "_")
    return rule, [body]


FORMAT = MiniMaxM2Format(
    OPEN, CLOSE, call_open=OPEN + "\n", call_close=CLOSE, sep="",
    markers=(OPEN,),  # longer than qwen3_xml's </parameter>, which MiniMax's template also holds
    vllm_names=("minimax_m2",),
    response_open="<response>", response_close="</response>",
    turn_open="]~b]", turn_close="[e~[",
)


@register_parser("minimax_m2")
class MiniMaxM2Parser(ToolCallParser):
    call_format = FORMAT
    call_begin, call_end = OPEN, CLOSE

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tokenizer, tools)
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
        f = {t: Finder(text, t) for t in (OPEN, CLOSE, INVOKE, INVOKE_END, PARAM, PARAM_END, THINK_CLOSE)}

        def first(k: int, *tags: str) -> int:
            best = -1
            for t in tags:
                p = f[t].find(k)
                if p != -1 and (best == -1 or p < best):
                    best = p
            return best

        def name_at(i: int, what: str) -> tuple[str, int]:
            """The quoted or bare name after a tag ending at ``i``, and where its ``>`` ends."""
            m = _NAME.match(text, i)
            if m is None:
                if skip_ws(text, i) >= n:
                    raise _Bad(n, f"unclosed {what} tag (generation truncated?)")
                raise _Bad(i, f"{what} tag: expected a quoted name and '>', found {text[i:i + 20]!r}")
            name = (m.group("dq") if m.group("dq") is not None else m.group("sq") if m.group("sq") is not None
                    else m.group("bare")).strip()
            if not name:
                raise _Bad(m.end(), f"empty name in {what}>")
            return name, m.end()

        def invoke_at(i: int) -> _Invoke:
            name, pos = name_at(i + len(INVOKE), INVOKE.rstrip("="))
            inv = _Invoke(name, i, i)
            props = self._props.get(name) or {}
            while True:
                k = skip_ws(text, pos)
                if text.startswith(PARAM, k):
                    pos = parameter_at(inv, k, props)
                    continue
                if text.startswith(INVOKE_END, k):
                    inv.end = k + len(INVOKE_END)
                    return inv
                if k >= n:
                    raise _Bad(n, f"unclosed <invoke name={name!r}>: the text ends before {INVOKE_END} (generation truncated?)")
                nxt = first(k, PARAM, INVOKE_END)
                stop = first(k, CLOSE, OPEN, INVOKE)
                if nxt == -1 or (stop != -1 and stop < nxt):
                    raise _Bad(k, f"unclosed <invoke name={name!r}>: no {INVOKE_END} before "
                               + ("the end of the text" if stop == -1 else repr(text[stop:stop + 20])))
                inv.notes.append((k, rstrip_end(text, k, nxt), f"text between the tags of <invoke name={name!r}> (ignored)"))
                pos = nxt

        def parameter_at(inv: _Invoke, k: int, props: dict[str, Any]) -> int:
            key, v0 = name_at(k + len(PARAM), PARAM.rstrip("="))
            end = json_end(v0, props.get(key))
            if end == -1:
                end = f[PARAM_END].find(v0)
                early = first(v0, PARAM, INVOKE_END)
                if early != -1 and (end == -1 or early < end):
                    raise _Bad(early, f"unclosed <parameter name={key!r}> in {inv.name!r}: {text[early:early + 16]!r} comes "
                                      f"before its {PARAM_END}")
                if end == -1:
                    raise _Bad(n, f"unclosed <parameter name={key!r}> in {inv.name!r}: no {PARAM_END} (generation truncated?)")
            if key in inv.params:
                inv.notes.append((k, end + len(PARAM_END), f"duplicate parameter {key!r} in {inv.name!r}: the last value is kept"))
            inv.params[key] = (v0, end)
            return end + len(PARAM_END)

        def json_end(v0: int, schema: Any) -> int:
            """Where ``</parameter>`` is when the value must be JSON (object/array only) and is:
            a tag inside a JSON string then does not end it. -1 otherwise."""
            if schema is None or not schema_types(schema) <= {"object", "array"}:
                return -1
            _, e, err = decode_at(text, skip_ws(text, v0))
            if err is not None:
                return -1
            e = skip_ws(text, e)
            return e if text.startswith(PARAM_END, e) else -1

        def add_invoke(inv: _Invoke, s: int, e: int, notes: list[tuple[int, int, str]]) -> None:
            props = self._props.get(inv.name) or {}
            args: dict[str, Any] = {}
            for key, (vs, ve) in inv.params.items():
                raw = text[vs:ve]
                if key in props:
                    value, why = convert_value(raw, props[key])
                    if why is not None:
                        notes.append((vs, ve, f"parameter {key!r} of {inv.name!r}: {why}"))
                    args[key] = value
                else:
                    args[key] = raw
            col.add_call(inv.name, args, None, s, e)
            notes.extend(inv.notes)

        def bad_invoke(k: int, bad: _Bad) -> int:
            """One error over the invoke that starts at ``k``: to its ``</invoke>`` when that comes
            before the next invoke or the block's end, else up to them (or the end of the text)."""
            c = f[INVOKE_END].find(bad.at)
            s = first(bad.at, INVOKE, CLOSE, OPEN)
            if c != -1 and (s == -1 or c < s):
                end = c + len(INVOKE_END)
            else:
                end = rstrip_end(text, k, n if s == -1 else s)
            col.add_error(k, end, bad.message)
            return max(end, k + len(INVOKE))

        def block_at(start: int, after: int) -> int:
            """A ``<minimax:tool_call>`` block: each invoke is a call or one error (the others are
            kept); text between the tags is a warning; an unclosed block is an error over it."""
            items: list[_Invoke | None] = []  # None: an invoke that was an error
            notes: list[tuple[int, int, str]] = []
            k = skip_ws(text, after)
            closed = True
            while True:
                if text.startswith(CLOSE, k):
                    end = k + len(CLOSE)
                    break
                if text.startswith(INVOKE, k):
                    try:
                        items.append(invoke_at(k))
                        k = skip_ws(text, items[-1].end)
                    except _Bad as bad:
                        items.append(None)
                        k = skip_ws(text, bad_invoke(k, bad))
                    continue
                nxt = first(k, INVOKE, CLOSE)
                stop = first(k, OPEN)
                if k >= n or nxt == -1 or (stop != -1 and stop < nxt):
                    end = n if stop == -1 or k >= n else rstrip_end(text, start, stop)
                    closed = False
                    break
                notes.append((k, rstrip_end(text, k, nxt), f"text between the tags of {OPEN} (ignored)"))
                k = nxt
            if not closed:
                where = "the text ends" if end >= n else f"another {OPEN} follows"
                col.add_error(start, end, f"unclosed {OPEN}: {where} before {CLOSE}"
                              + (" (generation truncated?)" if end >= n else ""))
            elif not items:
                col.add_error(start, end, f"{OPEN} without {INVOKE}\"NAME\">")
            for idx, inv in enumerate(items):
                if inv is not None:
                    s = start if idx == 0 else inv.start
                    e = end if idx == len(items) - 1 and closed else inv.end
                    add_invoke(inv, s, e, notes)
            for s, e, msg in notes:
                col.add_error(s, e, msg, severity="warning")
            return end

        def bare_invoke_at(start: int) -> int:
            try:
                inv = invoke_at(start)
            except _Bad as bad:
                return bad_invoke(start, bad)
            notes = [(start, inv.end, f"an {INVOKE} block outside {OPEN}: read as a call, as vLLM does")]
            add_invoke(inv, start, inv.end, notes)
            for s, e, msg in notes:
                col.add_error(s, e, msg, severity="warning")
            return inv.end

        # reasoning, content and calls
        pos = 0
        first_close = f[THINK_CLOSE].find(0)
        if first_close != -1:
            before = first(0, OPEN, INVOKE)
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
                pos = max(block_at(m.start(), m.end()), m.end())
            elif tag == INVOKE:
                pos = max(bare_invoke_at(m.start()), m.end())
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

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        out = [OPEN, "\n"]
        for c in calls:
            _check_name("tool name", c["name"])
            args = c.get("arguments") or {}
            if isinstance(args, str):  # arguments as a JSON string (OpenAI's wire form)
                args, err = decode_whole(args)
                if err is not None or not isinstance(args, dict):
                    raise ValueError(f"call {c.get('name')!r}: arguments must be an object or a JSON string holding one")
            out.append(f'{INVOKE}"{c["name"]}">\n')
            for k, v in args.items():
                _check_name("parameter name", k)
                out.append(f'{PARAM}"{k}">{v if isinstance(v, str) else dumps(v)}{PARAM_END}\n')
            out.append(INVOKE_END + "\n")
        out.append(CLOSE)
        return "".join(out)
