"""Llama 3.1 / 3.2 JSON tool calls::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ..., "parameters": {...}}

``<|python_tag|>`` is optional; ``"arguments"`` is accepted in place of ``"parameters"``; several
calls are separated by ``;``.

- With ``<|python_tag|>``: the text before it is content, and what follows it is calls: anything
  there that is not a well-formed call is an error (Llama's built-in tools' ``name.call(...)``
  syntax included, which this parser does not read).
- Without it: calls are read only if the text (after whitespace) starts with ``{`` (a tag later
  in such a text is not looked for: it can only be inside a call's strings or after the calls). A first
  object that is not call-shaped (no ``"name"``/``"parameters"``/``"arguments"`` key) means the
  whole text is plain content, as is text that does not start with ``{``.
- Text after the last call (not starting with ``;``) is content.
"""

from __future__ import annotations

import re
from typing import Any

from backend.parsers._common import RESYNC_SEMICOLON, Collector, as_doc, decode_at, dumps, rstrip_end, skip_ws
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat

PYTHON_TAG = "<|python_tag|>"
_CALL_LIKE = re.compile(r'"(?:name|parameters|arguments)"\s*:')
_ARG_KEYS = ("parameters", "arguments")


@register_parser("llama3_json")
class Llama3JsonParser(ToolCallParser):
    # the tag is optional, so tool_choice=none bans a call object's start; Llama 3 templates
    # are recognised by the tag or their "ipython" (tool) role
    call_format = ToolCallFormat(
        PYTHON_TAG, sep="; ", args_key="parameters", forbid_text='{"name"', markers=(PYTHON_TAG, "ipython"),
        vllm_names=("llama3_json", "llama4_json"),
    )
    call_begin = ""
    call_end = ""

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        col = Collector(text)
        n = len(text)
        i = skip_ws(text, 0)
        # A text that starts with '{' is read as calls from there (a "<|python_tag|>" later on can
        # only be inside those calls' strings or after them); otherwise look for the tag.
        tag = -1 if text.startswith("{", i) else text.find(PYTHON_TAG)
        strict = tag != -1
        if strict:
            col.add_content(0, tag)
            i = skip_ws(text, tag + len(PYTHON_TAG))
            if i >= n:
                col.add_error(tag, n, f"{PYTHON_TAG} with nothing after it (generation truncated?)")
                return col.result()
        else:
            if i >= n or text[i] != "{":
                col.add_content(0, n)
                return col.result()

        first = True
        while True:
            s = i
            value, end, err = decode_at(text, s)
            if err is None:
                if first and not strict and not (isinstance(value, dict) and any(k in value for k in ("name", *_ARG_KEYS))):
                    col.add_content(0, n)  # a JSON answer, not a call
                    return col.result()
                col.add_value(s, end, value, arg_keys=_ARG_KEYS)
                j = skip_ws(text, end)
                if text.startswith(";", j):
                    i = skip_ws(text, j + 1)
                    while text.startswith(";", i):  # ";;": an empty call
                        col.add_error(i, i + 1, "empty call (two ';' in a row)")
                        i = skip_ws(text, i + 1)
                    if i >= n:  # a trailing ';'
                        return col.result()
                    first = False  # after ';' comes another call, whatever it looks like
                    continue
                col.add_content(end, n)
                return col.result()
            # An unreadable object: is it a call at all?
            m = RESYNC_SEMICOLON.search(text, s + 1)
            stop = m.start() if m is not None else n
            if first and not strict and _CALL_LIKE.search(text, s, stop) is None:
                col.add_content(0, n)  # not JSON and not call-like: plain text that starts with '{'
                return col.result()
            if first and strict and err.startswith("invalid JSON: expected a value"):
                # not JSON at all right after the tag: report it from the tag
                err = (f"{PYTHON_TAG} is not followed by a JSON call object (built-in tool `name.call(...)` "
                       "syntax is not supported by this parser)")
                s = tag
            col.add_error(s, rstrip_end(text, s, stop), err)
            if m is None:
                return col.result()
            i = m.end()
            first = False

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return "; ".join(dumps({"name": c["name"], "parameters": c.get("arguments", {})}) for c in calls)
