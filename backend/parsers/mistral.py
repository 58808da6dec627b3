"""Mistral tool calls, both styles::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, ...]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}

Ids are kept when present. A list is read element by element (a bad element is one error, the
good ones around it are kept; each call's span is its element). In the ``[ARGS]`` style each
call's span runs from its ``[TOOL_CALLS]`` to the end of its JSON arguments. ``[THINK]...[/THINK]``
(Magistral) is reasoning. Text outside calls is content.
"""

from __future__ import annotations

import re
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
from backend.parsers.base import ParserError, ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
# A function name in the [ARGS] style: anything up to the next '[' (bounded, no backtracking).
_NAME = re.compile(r"[^\[\]{}\"\s]{0,256}")
_ID = re.compile(r"[^\[\]{}\"\s]{0,256}")


@register_parser("mistral")
class MistralParser(ToolCallParser):
    # the grammar writes the list style, as Mistral v0.3 does
    call_format = ToolCallFormat(TOOL_CALLS, list_open=TOOL_CALLS + " [", list_close="]", sep=", ", vllm_names=("mistral",))
    call_begin = TOOL_CALLS
    call_end = ""

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None, style: str = "list") -> None:
        super().__init__(tokenizer, tools)
        if style not in ("list", "args"):
            raise ParserError(f"mistral parser style must be 'list' (v3 [TOOL_CALLS] [...]) or 'args' ([TOOL_CALLS]name[ARGS]{{...}}), not {style!r}")
        self.style = style

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        n = len(text)
        next_call = Finder(text, TOOL_CALLS)

        def region_end(pos: int) -> int:
            p = next_call.find(pos)
            return n if p == -1 else p

        def handle(col: Collector, start: int, after: int) -> int:
            i = skip_ws(text, after)
            if i >= n:
                col.add_error(start, n, f"{TOOL_CALLS} with nothing after it (generation truncated?)")
                return n
            if text.startswith(TOOL_CALLS, i):
                col.add_error(start, rstrip_end(text, start, i), f"{TOOL_CALLS} with no call after it")
                return i
            c = text[i]
            if c == "[" and not text.startswith(ARGS, i) and not text.startswith(CALL_ID, i):
                end, status = parse_call_list(col, i, region_end, what=f"{TOOL_CALLS} list")
                if status == "truncated":
                    col.add_error(start, n, f"truncated {TOOL_CALLS} list: the text ends before its ']'")
                return end
            if c == "{":  # a single call object instead of a list
                value, end, err = decode_at(text, i)
                if err is None:
                    col.add_value(i, end, value)
                    return end
                stop = region_end(after)
                col.add_error(start, rstrip_end(text, start, stop), err)
                return stop
            return self._args_style(col, start, i, region_end)

        col = scan_tagged(text, TOOL_CALLS, handle, "[THINK]", "[/THINK]")
        return col.result()

    def _args_style(self, col: Collector, start: int, i: int, region_end: Any) -> int:
        text = col.text
        n = len(text)
        m = _NAME.match(text, i)
        name = m.group() if m else ""
        k = m.end() if m else i
        call_id = None
        if text.startswith(CALL_ID, k):
            idm = _ID.match(text, k + len(CALL_ID))
            call_id = idm.group() if idm else ""
            k = idm.end() if idm else k + len(CALL_ID)
        stop = region_end(start + len(TOOL_CALLS))
        if not text.startswith(ARGS, k):
            if k >= n:
                msg = f"truncated call after {TOOL_CALLS}: the text ends before {ARGS}"
            elif not name:
                msg = f"expected a function name, a JSON list or {ARGS} after {TOOL_CALLS}, found {text[k:k + 20]!r}"
            else:
                msg = f"expected {ARGS} after the function name {name!r}, found {text[k:k + 20]!r}"
            col.add_error(start, rstrip_end(text, start, stop), msg)
            return stop
        if not name:
            col.add_error(start, rstrip_end(text, start, stop), f"{ARGS} without a function name after {TOOL_CALLS}")
            return stop
        j = skip_ws(text, k + len(ARGS))
        value, end, err = decode_at(text, j)
        if err is not None:
            col.add_error(start, rstrip_end(text, start, stop), f"tool call {name!r}: arguments are {err}")
            return stop
        if not isinstance(value, dict):
            col.add_error(start, end, f"tool call {name!r}: arguments must be a JSON object, got {type_name(value)}")
            return end
        col.add_call(name, value, call_id or None, start, end)
        return end

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        if self.style == "args":
            out = []
            for c in calls:
                cid = f"{CALL_ID}{c['id']}" if c.get("id") else ""
                out.append(f"{TOOL_CALLS}{c['name']}{cid}{ARGS}{dumps(c.get('arguments', {}))}")
            return "".join(out)
        items = []
        for c in calls:
            d: dict[str, Any] = {"name": c["name"], "arguments": c.get("arguments", {})}
            if c.get("id"):
                d["id"] = c["id"]
            items.append(dumps(d))
        return f"{TOOL_CALLS} [{', '.join(items)}]"
