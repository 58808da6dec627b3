"""Hermes / Qwen2.5 / Qwen3 tool calls::

    <think>reasoning</think>
    Some text.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

Each ``<tool_call>`` block is read on its own: its JSON object is decoded from the text (so a
``</tool_call>`` inside a JSON string does not end the block); a block whose JSON cannot be read
ends at the next ``</tool_call>`` (or the next ``<tool_call>``, or the end of the text) and becomes
one error. A block without its closing tag at the end of the text (truncated generation) is an
error even if its JSON is complete, unless the parser was built with ``accept_unclosed=True``
(for loops that stop generation on ``</tool_call>``).
"""

from __future__ import annotations

from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_at, dumps, rstrip_end, scan_tagged, skip_ws
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@register_parser("hermes")
class HermesParser(ToolCallParser):
    call_format = ToolCallFormat(
        OPEN, CLOSE, call_open=OPEN + "\n", call_close="\n" + CLOSE, sep="\n",
        vllm_names=("hermes", "qwen3_json"),
        response_open="<tool_response>", response_close="</tool_response>",
        turn_open="<|im_start|>", turn_close="<|im_end|>",  # ChatML, as Qwen's and Hermes' templates write turns
    )
    call_begin, call_end = call_format.call_open, call_format.call_close

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None, accept_unclosed: bool = False) -> None:
        super().__init__(tokenizer, tools)
        self.accept_unclosed = accept_unclosed

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        close_finder = Finder(text, CLOSE)
        open_finder = Finder(text, OPEN)
        n = len(text)

        def handle(col: Collector, start: int, after: int) -> int:
            i = skip_ws(text, after)
            value, end, err = decode_at(text, i)
            search_from = after
            if err is None:
                search_from = end
                j = skip_ws(text, end)
                if text.startswith(CLOSE, j):
                    col.add_value(start, j + len(CLOSE), value)
                    return j + len(CLOSE)
                if j >= n:
                    if self.accept_unclosed:
                        col.add_value(start, end, value)
                    else:
                        col.add_error(start, n, f"unclosed {OPEN}: the text ends before {CLOSE} (generation truncated?)")
                    return n
                err = f"unexpected text after the JSON object in {OPEN}: {text[j:j + 20]!r}"
            elif i >= n:
                col.add_error(start, n, f"unclosed {OPEN}: the text ends right after it (generation truncated?)")
                return n
            # Unreadable block: it ends at the next closing tag, or before the next opening tag.
            close = close_finder.find(search_from)
            nxt = open_finder.find(search_from)
            if close != -1 and (nxt == -1 or close < nxt):
                col.add_error(start, close + len(CLOSE), err)
                return close + len(CLOSE)
            stop = nxt if nxt != -1 else n
            col.add_error(start, rstrip_end(text, start, stop), f"unclosed {OPEN} ({err})")
            return stop

        return scan_tagged(text, OPEN, handle, "<think>", "</think>").result()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return "\n".join(
            f"{self.call_begin}{dumps({'name': c['name'], 'arguments': c.get('arguments', {})})}{self.call_end}" for c in calls
        )
