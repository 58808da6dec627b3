"""Kimi K2 tool calls::

    <think>reasoning</think>Some text.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>

Each call's header ``functions.NAME:INDEX`` is Kimi's call id, kept as the call's ``id``; the
name is the header without ``functions.`` and ``:INDEX``. Whitespace between the tags is allowed.
Each call is read on its own (its JSON arguments decoded from the text, so a tag inside a JSON
string does not end it): a bad call is one error spanning it, from ``<|tool_call_begin|>`` to its
``<|tool_call_end|>`` (or to the next tag when that is missing), and the calls around it are kept.
Empty arguments are read as ``{}`` with a warning. A section the text ends in (truncated) keeps
its complete calls and is an error. A call outside a section is kept, with an error; any other
Kimi tag out of place is an error. Text after the section is content.
"""

from __future__ import annotations

import re
from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_at, dumps, rstrip_end, scan_tagged, skip_ws, type_name
from backend.parsers._grammar import json_schema_rules
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
TAG_PREFIX = "<|tool_call"  # every Kimi tag starts with it
TAGS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END, ARG_BEGIN)
_PREFIX = "functions."
# NAME:INDEX, after the optional "functions." (taken first: "functions.:1" has no name, it is not
# a call named "functions.", as vLLM's parser agrees: no call)
_HEADER = re.compile(r"(?P<name>[^\s:<>]{1,256}):(?P<index>\d{1,20})")
_ID_OF = re.compile(r"functions\.(?P<name>.+):\d+")


class KimiK2Format(ToolCallFormat):
    """Kimi's layout; the grammar is per tool (the name is in the header, not in the JSON)."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        alts, bodies = [], []
        for k, (name, params) in enumerate(tools):
            root, rules = json_schema_rules(params, f"k{k}_")
            alts.append(f'{ebnf_literal(name + ":")} ("0" | [1-9] [0-9]*) {ebnf_literal(ARG_BEGIN)} {root}')
            bodies.append(rules)
        rules = self.grammar_rules("tool_body", multiple=multiple, max_calls=max_calls)
        return "\n".join([*rules, "tool_body ::= " + " | ".join(alts), *bodies])


@register_parser("kimi_k2")
class KimiK2Parser(ToolCallParser):
    call_format = KimiK2Format(
        SECTION_BEGIN, SECTION_END, list_open=SECTION_BEGIN, list_close=SECTION_END,
        call_open=CALL_BEGIN + "functions.", call_close=CALL_END, vllm_names=("kimi_k2",),
    )
    call_begin = SECTION_BEGIN
    call_end = SECTION_END

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        n = len(text)
        next_tag = Finder(text, TAG_PREFIX)

        def tag_at(pos: int) -> str | None:
            for t in TAGS:
                if text.startswith(t, pos):
                    return t
            return None

        def next_kimi_tag(pos: int) -> int:
            """Where the next Kimi tag starts at or after ``pos`` (``n`` if none)."""
            while True:
                p = next_tag.find(pos)
                if p == -1:
                    return n
                if tag_at(p) is not None:
                    return p
                pos = p + 1

        def read_call(col: Collector, start: int, in_section: bool) -> int:
            """The call whose ``<|tool_call_begin|>`` is at ``start``; the position after it."""
            h = start + len(CALL_BEGIN)
            a = next_kimi_tag(h)
            if a >= n or not text.startswith(ARG_BEGIN, a):
                if a >= n:
                    col.add_error(start, n, f"truncated call: the text ends before {ARG_BEGIN} (generation truncated?)")
                    return n
                stop = a + len(CALL_END) if text.startswith(CALL_END, a) else a
                col.add_error(start, rstrip_end(text, start, stop), f"tool call without {ARG_BEGIN}")
                return stop
            header = text[h:a].strip()
            m = _HEADER.fullmatch(header.removeprefix(_PREFIX))
            j = skip_ws(text, a + len(ARG_BEGIN))
            err = None
            if m is None and header.startswith(_PREFIX) and header[len(_PREFIX):].startswith(":"):
                err = f"tool call header {header[:60]!r} has no function name (functions.NAME:INDEX)"
            elif m is None:
                err = f"tool call header {header[:60]!r} is not functions.NAME:INDEX"
            value: Any = None
            end = j
            if err is None:
                if text.startswith(CALL_END, j) or text.startswith(SECTION_END, j) and in_section:
                    value = {}  # no arguments written
                else:
                    value, end, derr = decode_at(text, j)
                    if derr is not None:
                        err = f"tool call {m.group('name')!r}: arguments are {derr}"
                    elif not isinstance(value, dict):
                        err = f"tool call {m.group('name')!r}: arguments must be a JSON object, got {type_name(value)}"
            if err is None:
                k = skip_ws(text, end)
                if text.startswith(CALL_END, k):
                    stop = k + len(CALL_END)
                    col.add_call(m.group("name"), value, header, start, stop)
                    if end == j:
                        col.add_error(start, stop, f"tool call {m.group('name')!r} has no arguments: read as {{}}",
                                      severity="warning")
                    if not in_section:
                        col.add_error(start, stop, f"tool call outside {SECTION_BEGIN}")
                    return stop
                if k >= n:
                    col.add_error(start, n, f"truncated call: the text ends before {CALL_END} (generation truncated?)")
                    return n
                err = f"unexpected text after the arguments, before {CALL_END}: {text[k:k + 20]!r}"
                search = k
            else:
                search = end
            # an unreadable call: it ends at its closing tag, or before the next tag
            p = next_kimi_tag(search)
            if text.startswith(CALL_END, p):
                col.add_error(start, p + len(CALL_END), err)
                return p + len(CALL_END)
            col.add_error(start, rstrip_end(text, start, p), f"{err} (no {CALL_END})")
            return p

        def handle(col: Collector, start: int, after: int) -> int:
            tag = tag_at(start)
            if tag is None:  # "<|tool_call" that starts no Kimi tag: text
                col.add_content(start, after)
                return after
            if tag == CALL_BEGIN:
                return read_call(col, start, in_section=False)
            if tag != SECTION_BEGIN:
                col.add_error(start, start + len(tag), f"{tag} out of place (no call or section open)")
                return start + len(tag)
            i = start + len(SECTION_BEGIN)
            while True:
                i = skip_ws(text, i)
                if i >= n:
                    col.add_error(start, n, f"unclosed {SECTION_BEGIN}: the text ends before {SECTION_END} (generation truncated?)")
                    return n
                t = tag_at(i)
                if t == SECTION_END:
                    return i + len(SECTION_END)
                if t == CALL_BEGIN:
                    i = read_call(col, i, in_section=True)
                    continue
                if t == SECTION_BEGIN:
                    col.add_error(start, rstrip_end(text, start, i), f"{SECTION_BEGIN} without {SECTION_END} before the next section")
                    return i
                stop = next_kimi_tag(i + 1)
                if t is not None:
                    col.add_error(i, i + len(t), f"{t} out of place in the tool-call section")
                    i += len(t)
                else:
                    col.add_error(i, rstrip_end(text, i, stop), f"unexpected text in the tool-call section: {text[i:i + 20]!r}")
                    i = stop

        return scan_tagged(text, TAG_PREFIX, handle, "<think>", "</think>").result()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        out = []
        for k, c in enumerate(calls):
            cid = c.get("id")
            m = _ID_OF.fullmatch(cid) if isinstance(cid, str) else None
            header = cid if m is not None and m.group("name") == c["name"] else f"functions.{c['name']}:{k}"
            out.append(f"{CALL_BEGIN}{header}{ARG_BEGIN}{dumps(c.get('arguments', {}))}{CALL_END}")
        return SECTION_BEGIN + "".join(out) + SECTION_END
