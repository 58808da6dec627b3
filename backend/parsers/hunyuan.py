"""HunYuan-A13B tool calls::

    <think>
    reasoning
    </think>
    <answer>
    助手：<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]</tool_calls>
    </answer>

The list is read element by element: each call's span is its own ``{...}`` element inside the
list, and a bad element is one error spanning that element, with the good elements around it
still returned. ``<answer>``/``</answer>`` are removed from the content; the ``助手：`` role prefix
the model writes is kept as part of the content. A list whose elements are complete but whose
``</tool_calls>`` is missing (truncated generation) keeps its calls and adds an "unclosed" error.
"""

from __future__ import annotations

from typing import Any

from backend.parsers._common import (
    Collector,
    Finder,
    as_doc,
    decode_at,
    dumps,
    parse_call_list,
    rstrip_end,
    scan_tagged,
    skip_ws,
    type_name,
)
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

OPEN = "<tool_calls>"
CLOSE = "</tool_calls>"


@register_parser("hunyuan")
class HunyuanParser(ToolCallParser):
    call_format = ToolCallFormat(OPEN, CLOSE, list_open=OPEN + "[", list_close="]" + CLOSE, sep=", ", vllm_names=("hunyuan_a13b",))
    call_begin = OPEN
    call_end = CLOSE

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        close_finder = Finder(text, CLOSE)
        open_finder = Finder(text, OPEN)
        n = len(text)

        def block_end(pos: int) -> int:
            """Where the block that contains ``pos`` ends at the latest (its closing tag, the next
            opening tag, or the end of the text)."""
            close = close_finder.find(pos)
            nxt = open_finder.find(pos)
            cands = [p for p in (close, nxt) if p != -1]
            return min(cands) if cands else n

        def finish(col: Collector, span_start: int, search_from: int, err: str, whole_block: bool) -> int:
            """Record ``err`` for the text from ``span_start`` to the end of the block (its closing tag
            included when ``whole_block``); return the position after the block."""
            stop = block_end(search_from)
            if text.startswith(CLOSE, stop):
                col.add_error(span_start, stop + len(CLOSE) if whole_block else rstrip_end(text, span_start, stop), err)
                return stop + len(CLOSE)
            col.add_error(span_start, rstrip_end(text, span_start, stop), f"unclosed {OPEN} ({err})")
            return stop

        def handle(col: Collector, start: int, after: int) -> int:
            i = skip_ws(text, after)
            if i >= n:
                col.add_error(start, n, f"unclosed {OPEN}: the text ends right after it (generation truncated?)")
                return n
            if text[i] != "[":
                value, end, err = decode_at(text, i)
                if err is None:
                    err = f"expected a JSON list of calls after {OPEN}, got {type_name(value)}"
                    return finish(col, start, end, err, True)
                return finish(col, start, after, err, True)
            end, status = parse_call_list(col, i, block_end, what=f"{OPEN} list")
            if status == "truncated":
                col.add_error(start, n, f"unclosed {OPEN}: the text ends inside the list (generation truncated?)")
                return n
            if status == "broken":
                if text.startswith(CLOSE, end):
                    return end + len(CLOSE)
                col.add_error(start, rstrip_end(text, start, end), f"unclosed {OPEN}: no {CLOSE} after the list")
                return end
            j = skip_ws(text, end)
            if text.startswith(CLOSE, j):
                return j + len(CLOSE)
            if j >= n:
                col.add_error(start, n, f"unclosed {OPEN}: the text ends before {CLOSE} (generation truncated?)")
                return n
            return finish(col, j, j, f"unexpected text after the list in {OPEN}: {text[j:j + 20]!r}", False)

        col = scan_tagged(text, OPEN, handle, "<think>", "</think>", drop_tags=("<answer>", "</answer>"))
        return col.result()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        body = ", ".join(dumps({"name": c["name"], "arguments": c.get("arguments", {})}) for c in calls)
        return f"{OPEN}[{body}]{CLOSE}"
