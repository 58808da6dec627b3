"""Granite 3.x tool calls::

    Some text.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

``<|tool_call|>`` (one special token; Granite 3.0 and the 3.x templates) or ``<tool_call>`` (the
same words as text, which Granite 3.1 sometimes writes) is followed by a JSON list of call
objects; there is no closing tag: the list's ``]`` ends it. Text before the tag and after the
list is content. The list is read element by element (:func:`~backend.parsers._common.parse_call_list`):
a bad element is one error spanning it and the good ones around it are kept; each call's span
is its element. A list the text ends in (truncated) keeps its complete calls and is an error; a
tag not followed by a list is an error. ``"parameters"`` is accepted in place of ``"arguments"``.
"""

from __future__ import annotations

import re
from typing import Any

from backend.parsers._common import Collector, as_doc, decode_at, dumps, parse_call_list, rstrip_end, skip_ws, type_name
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

TOOL_TOKEN = "<|tool_call|>"
TOOL_TEXT = "<tool_call>"
_TAGS = re.compile(re.escape(TOOL_TOKEN) + "|" + re.escape(TOOL_TEXT))


@register_parser("granite")
class GraniteParser(ToolCallParser):
    call_format = ToolCallFormat(TOOL_TOKEN, list_open=TOOL_TOKEN + "[", list_close="]", sep=", ", vllm_names=("granite",))
    call_begin = TOOL_TOKEN
    call_end = ""

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        n = len(text)
        col = Collector(text)
        pos = 0
        while pos < n:
            m = _TAGS.search(text, pos)
            if m is None:
                col.add_content(pos, n)
                break
            col.add_content(pos, m.start())
            pos = self._read_block(col, m.start(), m.end())
        return col.result()

    def _read_block(self, col: Collector, start: int, after: int) -> int:
        text = col.text
        n = len(text)
        tag = text[start:after]

        def region_end(p: int) -> int:
            m = _TAGS.search(text, p)
            return n if m is None else m.start()

        i = skip_ws(text, after)
        if i >= n:
            col.add_error(start, n, f"{tag} with nothing after it (generation truncated?)")
            return n
        if text[i] != "[":
            value, end, err = decode_at(text, i)
            if err is None:
                err = f"expected a JSON list of calls after {tag}, got {type_name(value)}"
                col.add_error(start, end, err)
                return end
            stop = region_end(i)
            col.add_error(start, rstrip_end(text, start, stop), f"expected a JSON list of calls after {tag} ({err})")
            return stop
        end, status = parse_call_list(col, i, region_end, what=f"{tag} list")
        if status == "truncated":
            col.add_error(start, n, f"truncated {tag} list: the text ends before its ']' (generation truncated?)")
        elif status == "broken":  # a bad last element runs to the next tag or the end: was the list closed?
            e = rstrip_end(text, i, end)
            if text.find("]", i, end) == -1:
                col.add_error(start, e, f"unclosed {tag} list: no ']' before {'the end of the text' if end >= n else 'the next tag'}")
        return end

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        body = ", ".join(dumps({"name": c["name"], "arguments": c.get("arguments", {})}) for c in calls)
        return f"{TOOL_TOKEN}[{body}]"
