"""DeepSeek V3 / R1 and DeepSeek V3.1 tool calls (two parsers, one module).

``deepseek_v3`` (V3, R1; trl's ``deepseekv3.jinja``)::

    <think>reasoning</think>Some text.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time
    ```json
    {}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

``deepseek_v31`` (V3.1, V3.2)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(the bars are U+FF5C, the ``▁`` U+2581). Each call is read on its own: its JSON arguments are
decoded from the text (so a tag inside a JSON string does not end the call); a call that cannot
be read is one error that runs to its ``<｜tool▁call▁end｜>`` (or to the next call, the end of
the block or of the text), and the calls around it are kept. A block whose
``<｜tool▁calls▁end｜>`` is missing keeps its complete calls and adds an "unclosed" error over the
block. Each parser names the other format when it meets its layout (vLLM's ``deepseek_v31``
returns nothing at all for V3 output). A ``<｜tool▁call▁begin｜>`` outside a block is an error.
Text before and after the block is content; ``<think>…</think>`` is reasoning (R1, V3.1 thinking:
a leading ``…</think>`` whose ``<think>`` the prompt opened too).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from backend.parsers._common import Collector, Finder, as_doc, decode_at, dumps, rstrip_end, scan_tagged, skip_ws, type_name
from backend.parsers._grammar import calls_root, json_schema_rules
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
JSON_OPEN = "\n```json\n"
JSON_CLOSE = "\n```"
FENCE = "```"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# The call type (V3) or the function name (V3.1) before <｜tool▁sep｜>: up to a line break or a
# full-width bar, bounded (no backtracking)
_BEFORE_SEP = re.compile(r"[^\n<\uff5c]{0,512}")
# The function name after <｜tool▁sep｜> (V3): up to the line break
_V3_NAME = re.compile(r"[^\n<\uff5c]{0,512}")
_FENCE_JSON = re.compile(r"```json[ \t]*\n")


@dataclass(frozen=True)
class DeepSeekFormat(ToolCallFormat):
    """A DeepSeek layout: ``calls_begin call (sep call)* calls_end``, each call a literal
    prefix holding the tool's name, the JSON of its parameters, a literal suffix."""

    call_prefix: str = ""  # "{name}" is replaced by the tool's name
    call_suffix: str = ""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        rules: list[str] = []
        bodies: list[str] = []
        for k, (name, params) in enumerate(tools):
            value, value_rules = json_schema_rules(params, f"t{k}_")
            rules.append(f"t{k}_call ::= {ebnf_literal(self.call_prefix.replace('{name}', name))} {value} "
                         f"{ebnf_literal(self.call_suffix)}")
            bodies.append(value_rules)
        call = "call ::= " + " | ".join(f"(t{k}_call)" for k in range(len(tools)))
        root = calls_root("call", open_=self.list_open, sep=self.sep, close=self.list_close, multiple=multiple, max_calls=max_calls)
        return "\n".join([root, call, *rules, *bodies])


class _DeepSeekParser(ToolCallParser):
    """The block scanner shared by both layouts; :meth:`_read_call` reads one call."""

    call_format: DeepSeekFormat
    other_format = ""  # the parser of the other layout, named in errors
    _finders: dict[str, Finder]

    def _parse(self, text: str) -> ParseResult:
        text = as_doc(text)  # O(1) error positions in json (see _common.Doc)
        # the finders of this text live on a copy, so one parser may parse in several threads
        worker = copy.copy(self)
        worker._finders = {t: Finder(text, t) for t in (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END)}
        return worker._scan(text)

    def _scan(self, text: str) -> ParseResult:
        n = len(text)

        def handle(col: Collector, start: int, after: int) -> int:
            i = skip_ws(text, after)
            while True:
                if i >= n:
                    col.add_error(start, n, f"unclosed {CALLS_BEGIN}: the text ends before {CALLS_END} (generation truncated?)")
                    return n
                if text.startswith(CALLS_END, i):
                    return i + len(CALLS_END)
                if text.startswith(CALL_BEGIN, i):
                    i = skip_ws(text, self._read_call(col, i))
                    continue
                if text.startswith(CALLS_BEGIN, i):  # a new block opens inside this one
                    col.add_error(start, rstrip_end(text, start, i), f"unclosed {CALLS_BEGIN}: another {CALLS_BEGIN} follows")
                    return i
                stop = self._next(i, CALL_BEGIN, CALLS_END, CALLS_BEGIN)
                col.add_error(i, rstrip_end(text, i, stop), f"unexpected text in the tool-calls block: {text[i:i + 30]!r}")
                i = stop

        col = scan_tagged(text, CALLS_BEGIN, handle, THINK_OPEN, THINK_CLOSE)
        self._stray_calls(col)
        return col.result()

    def _next(self, pos: int, *tags: str) -> int:
        """The first of ``tags`` at or after ``pos`` (the end of the text if none)."""
        found = [p for p in (self._finders[t].find(pos) for t in tags) if p != -1]
        return min(found) if found else len(self._finders[CALL_END].text)

    def _sep_after(self, col: Collector, start: int, what: str) -> int:
        """The position of the ``<｜tool▁sep｜>`` that follows ``what`` in the call at ``start``
        (both layouts put one there), or, when there is none, minus where parsing goes on after
        the error it adds (a position is never 0 here: a call starts with its begin tag)."""
        text = col.text
        after = start + len(CALL_BEGIN)
        m = _BEFORE_SEP.match(text, after)
        k = m.end() if m else after
        if text.startswith(SEP, k):
            return k
        if k >= len(text):
            return -self._fail(col, start, k, f"truncated call: the text ends before {SEP}")
        return -self._fail(col, start, after, f"expected {what} and {SEP} after {CALL_BEGIN}, found {text[after:after + 20]!r}")

    def _fail(self, col: Collector, start: int, search_from: int, message: str) -> int:
        """One error for the call at ``start``: up to its ``<｜tool▁call▁end｜>`` when that comes
        before the next call or the block's end, else up to those (or the end of the text)."""
        text = col.text
        close = self._finders[CALL_END].find(search_from)
        nxt = self._next(search_from, CALL_BEGIN, CALLS_END, CALLS_BEGIN)
        if close != -1 and close < nxt:
            col.add_error(start, close + len(CALL_END), message)
            return close + len(CALL_END)
        if nxt >= len(text) and not message.startswith("truncated"):
            message = f"unclosed {CALL_BEGIN} ({message})"
        col.add_error(start, rstrip_end(text, start, nxt), message)
        return nxt

    def _finish(self, col: Collector, start: int, name: str, args: dict[str, Any], j: int, args_end: int) -> int:
        """After the arguments (and, in V3, the closing fence) at ``j``: ``<｜tool▁call▁end｜>``."""
        text = col.text
        k = skip_ws(text, j)
        if text.startswith(CALL_END, k):
            col.add_call(name, args, None, start, k + len(CALL_END))
            return k + len(CALL_END)
        if k >= len(text):
            return self._fail(col, start, k, f"truncated call {name!r}: the text ends before {CALL_END}")
        return self._fail(col, start, args_end, f"tool call {name!r}: expected {CALL_END} after the arguments, found {text[k:k + 20]!r}")

    def _read_args(self, col: Collector, start: int, name: str, i: int) -> tuple[dict[str, Any], int] | int:
        """Decode the JSON object at ``i``: ``(arguments, end)``, or on failure the position after the error."""
        text = col.text
        value, end, err = decode_at(text, i)
        if err is not None:
            if i >= len(text) or err.startswith("truncated"):
                return self._fail(col, start, i, f"truncated call {name!r}: arguments are {err}")
            return self._fail(col, start, i, f"tool call {name!r}: arguments are {err}")
        if not isinstance(value, dict):
            return self._fail(col, start, end, f"tool call {name!r}: arguments must be a JSON object, got {type_name(value)}")
        return value, end

    def _stray_calls(self, col: Collector) -> None:
        """A ``<｜tool▁call▁begin｜>`` in the content (outside a block) is an error, not text."""
        text = col.text
        kept: list[tuple[int, int]] = []
        for s, e in col.content:
            pos = s
            while True:
                p = self._finders[CALL_BEGIN].find(pos)
                if p == -1 or p >= e:
                    break
                close = self._finders[CALL_END].find(p)
                stop = close + len(CALL_END) if close != -1 and close + len(CALL_END) <= e else rstrip_end(text, p, e)
                if p > pos:
                    kept.append((pos, p))
                col.add_error(p, stop, f"tool call outside a {CALLS_BEGIN} block (vLLM ignores it)")
                pos = max(stop, p + len(CALL_BEGIN))
            if e > pos:
                kept.append((pos, e))
        col.content = kept

    def _read_call(self, col: Collector, start: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


@register_parser("deepseek_v3")
class DeepSeekV3Parser(_DeepSeekParser):
    call_format = DeepSeekFormat(
        CALLS_BEGIN, CALLS_END, list_open=CALLS_BEGIN, list_close=CALLS_END, sep="\n",
        markers=(CALLS_BEGIN,),  # V3.1's templates are told apart by their longer markers
        vllm_names=("deepseek_v3",), response_open="<｜tool▁output▁begin｜>", response_close="<｜tool▁output▁end｜>",
        call_prefix=CALL_BEGIN + "function" + SEP + "{name}" + JSON_OPEN, call_suffix=JSON_CLOSE + CALL_END,
    )
    call_begin, call_end = CALLS_BEGIN, CALLS_END
    other_format = "deepseek_v31"

    def _read_call(self, col: Collector, start: int) -> int:
        text = col.text
        after = start + len(CALL_BEGIN)
        k = self._sep_after(col, start, "the call type")
        if k < 0:
            return -k
        call_type = text[after:k]
        i = k + len(SEP)
        m = _V3_NAME.match(text, i)
        j = m.end() if m else i
        name = text[i:j]
        if call_type != "function":
            if call_type.strip() and text.startswith(("{", " {"), i):
                return self._fail(col, start, i, f"{call_type!r}{SEP}{{...}} is DeepSeek V3.1's layout (name{SEP}JSON); "
                                                  f"read it with the {self.other_format} parser")
            return self._fail(col, start, after, f"call type must be 'function', found {call_type!r}")
        if not name.strip():
            if j >= len(text):
                return self._fail(col, start, j, f"truncated call: the text ends before the function name after {SEP}")
            return self._fail(col, start, i, f"no function name after {SEP}")
        if j >= len(text) or (text.startswith("\n", j) and j + 1 >= len(text)):
            return self._fail(col, start, j, f"truncated call {name!r}: the text ends before ```json")
        fence = _FENCE_JSON.match(text, j + 1) if text.startswith("\n", j) else None
        if fence is None:
            rest = text[j + 1 : j + 8]
            if text.startswith("\n", j) and "```json".startswith(rest) and j + 1 + len(rest) >= len(text):
                return self._fail(col, start, j, f"truncated call {name!r}: the text ends before ```json")
            return self._fail(col, start, j, f"tool call {name!r}: expected a line break and ```json after the name, found {text[j:j + 20]!r}")
        got = self._read_args(col, start, name, skip_ws(text, fence.end()))
        if isinstance(got, int):
            return got
        args, end = got
        f = skip_ws(text, end)
        if not text.startswith(FENCE, f):
            if f >= len(text):
                return self._fail(col, start, f, f"truncated call {name!r}: the text ends before the closing ```")
            return self._fail(col, start, end, f"tool call {name!r}: expected the closing ``` after the arguments, found {text[f:f + 20]!r}")
        return self._finish(col, start, name, args, f + len(FENCE), end)

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        body = "\n".join(
            f"{CALL_BEGIN}function{SEP}{c['name']}{JSON_OPEN}{dumps(c.get('arguments', {}))}{JSON_CLOSE}{CALL_END}" for c in calls
        )
        return f"{CALLS_BEGIN}{body}{CALLS_END}"


@register_parser("deepseek_v31")
class DeepSeekV31Parser(_DeepSeekParser):
    call_format = DeepSeekFormat(
        CALLS_BEGIN, CALLS_END, list_open=CALLS_BEGIN, list_close=CALLS_END, sep="",
        # V3.1's templates write the name right after <｜tool▁call▁begin｜> (V3's write tool['type'])
        markers=(CALL_BEGIN + "'+ tool['function']['name']", CALL_BEGIN + "' + tool['function']['name']"),
        vllm_names=("deepseek_v31",), response_open="<｜tool▁output▁begin｜>", response_close="<｜tool▁output▁end｜>",
        call_prefix=CALL_BEGIN + "{name}" + SEP, call_suffix=CALL_END,
    )
    call_begin, call_end = CALLS_BEGIN, CALLS_END
    other_format = "deepseek_v3"

    def _read_call(self, col: Collector, start: int) -> int:
        text = col.text
        after = start + len(CALL_BEGIN)
        k = self._sep_after(col, start, "the function name")
        if k < 0:
            return -k
        name = text[after:k]
        i = k + len(SEP)
        if not name.strip():
            return self._fail(col, start, after, f"no function name before {SEP}")
        if name == "function" and not text.startswith("{", skip_ws(text, i)):
            m2 = _V3_NAME.match(text, i)
            if m2 is not None and m2.end() > i and text.startswith("\n```json", m2.end()):
                return self._fail(col, start, i, f"function{SEP}{text[i:m2.end()]}\\n```json ... is DeepSeek V3's layout; "
                                                  f"read it with the {self.other_format} parser")
        j = skip_ws(text, i)
        if j >= len(text):
            return self._fail(col, start, j, f"truncated call {name!r}: the text ends before its arguments")
        got = self._read_args(col, start, name, j)
        if isinstance(got, int):
            return got
        return self._finish(col, start, name, got[0], got[1], got[1])

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        body = "".join(f"{CALL_BEGIN}{c['name']}{SEP}{dumps(c.get('arguments', {}))}{CALL_END}" for c in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"
