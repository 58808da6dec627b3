"""Phi-4-mini tool calls::

    functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

``functools`` directly followed by ``[`` (whitespace allowed) opens a JSON list of call objects;
the list's ``]`` ends it. ``functools`` not followed by ``[`` is text (``import functools``).
Text before and after the list is content. The list is read element by element
(:func:`~backend.parsers._common.parse_call_list`): a bad element is one error spanning it and the
good ones around it are kept; each call's span is its element. A list the text ends in
(truncated) keeps its complete calls and is an error. ``"parameters"`` is accepted in place of
``"arguments"``.
"""

from __future__ import annotations

import re
from typing import Any

from backend.parsers._common import Collector, as_doc, dumps, parse_call_list, rstrip_end
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

TAG = "functools"
_OPEN = re.compile(r"functools[ \t\r\n]*+\[")


@register_parser("phi4_mini_json")
class Phi4MiniJsonParser(ToolCallParser):
    call_format = ToolCallFormat(
        TAG + "[", list_open=TAG + "[", list_close="]", sep=", ", markers=(TAG + "[", "<|/tool|>"),
        vllm_names=("phi4_mini_json",),
    )
    call_begin = TAG + "["
    call_end = "]"

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        n = len(text)
        col = Collector(text)

        def region_end(p: int) -> int:
            m = _OPEN.search(text, p)
            return n if m is None else m.start()

        pos = 0
        while pos < n:
            m = _OPEN.search(text, pos)
            if m is None:
                col.add_content(pos, n)
                break
            col.add_content(pos, m.start())
            end, status = parse_call_list(col, m.end() - 1, region_end, what=f"{TAG} list")
            if status == "truncated":
                col.add_error(m.start(), n, f"truncated {TAG} list: the text ends before its ']' (generation truncated?)")
            elif status == "broken":  # a bad last element runs to the next list or the end: was the list closed?
                e = rstrip_end(text, m.start(), end)
                if text.find("]", m.end(), end) == -1:
                    col.add_error(m.start(), e, f"unclosed {TAG} list: no ']' before {'the end of the text' if end >= n else 'the next list'}")
            pos = end
        return col.result()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        body = ", ".join(dumps({"name": c["name"], "arguments": c.get("arguments", {})}) for c in calls)
        return f"{TAG}[{body}]"
