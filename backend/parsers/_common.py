"""Shared pieces of the native parsers: strict JSON decoding, call validation, a tolerant reader
for lists of calls, and the tag scanner that splits reasoning, content and call blocks.

Everything here is linear in the length of the text (regex searches only use patterns without
nested quantifiers; "next occurrence" searches are cached), so a 1 MB turn parses in milliseconds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from backend.parsers.base import ParseResult
from backend.trace import ParseError, ToolCall
from backend.trace.messages import json_type as type_name

# ---- strict JSON ------------------------------------------------------------------------------


class _NotJSON(ValueError):
    """A value Python's json accepts but JSON does not (NaN, Infinity, a number that overflows)."""


def _parse_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not valid JSON (non-finite numbers are not allowed)")


def _parse_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        shown = s if len(s) <= 40 else s[:37] + "..."
        raise _NotJSON(f"number {shown} overflows to infinity (non-finite numbers are not allowed)")
    return v


_DECODER = json.JSONDecoder(parse_constant=_parse_constant, parse_float=_parse_float)
_VALUE_START = frozenset('{["-0123456789tfnNI')


class Doc(str):
    """The text being parsed. ``json.JSONDecodeError`` computes a line and column by counting
    newlines from the start of the document to the error, which makes many failed decodes in one
    long text quadratic; this ``str`` subclass answers those two calls in O(1) (we report the
    character offset, not the line)."""

    __slots__ = ()

    def count(self, *args: Any) -> int:  # type: ignore[override]
        return 0

    def rfind(self, *args: Any) -> int:  # type: ignore[override]
        return -1


def as_doc(text: str) -> Doc:
    return text if type(text) is Doc else Doc(text)


def decode_at(text: str, idx: int) -> tuple[Any, int, str | None]:
    """Decode one JSON value starting exactly at ``idx``.

    Returns ``(value, end, None)`` on success, ``(None, idx, message)`` on failure. Never raises.
    Duplicate keys: the last one wins (as in ``json``). NaN, Infinity and numbers that overflow
    to infinity are errors (not JSON). Nesting deeper than the interpreter's recursion limit allows
    (about 1000 levels by default) is an error. Pass a :class:`Doc` for long texts.
    """
    if idx >= len(text):
        return None, idx, "truncated JSON: the text ends where a value should start"
    if text[idx] not in _VALUE_START:
        return None, idx, f"invalid JSON: expected a value at char {idx}, found {text[idx:idx + 10]!r}"
    try:
        value, end = _DECODER.raw_decode(text, idx)
        return value, end, None
    except json.JSONDecodeError as e:
        if e.pos >= len(text):
            return None, idx, f"truncated JSON: {e.msg} at end of text"
        return None, idx, f"invalid JSON: {e.msg} at char {e.pos}"
    except _NotJSON as e:
        return None, idx, f"invalid JSON: {e}"
    except RecursionError:
        return None, idx, "invalid JSON: nested too deeply"
    except ValueError as e:  # e.g. an integer over Python's 4300-digit conversion limit
        msg = str(e)
        if "integer string conversion" in msg:
            msg = "integer literal is too long (over 4300 digits)"
        return None, idx, f"invalid JSON: {msg}"
    except MemoryError:
        return None, idx, "invalid JSON: too large to decode"


def decode_whole(s: str) -> tuple[Any, str | None]:
    """Decode a whole string as one JSON value (whitespace around allowed)."""
    i = skip_ws(s, 0)
    value, end, err = decode_at(s, i)
    if err is not None:
        return None, err
    if skip_ws(s, end) != len(s):
        return None, "invalid JSON: extra data after the value"
    return value, None


_WS = re.compile(r"\s*")


def skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def rstrip_end(text: str, start: int, end: int) -> int:
    """``end`` moved left past whitespace, not before ``start``."""
    while end > start and text[end - 1].isspace():
        end -= 1
    return end


class Finder:
    """``text.find(needle, pos)`` with the last answer cached, so that a loop asking with
    increasing ``pos`` is linear in total even when the needle never occurs."""

    __slots__ = ("text", "needle", "_from", "_at")

    def __init__(self, text: str, needle: str) -> None:
        self.text = text
        self.needle = needle
        self._from = -1
        self._at = -1

    def find(self, pos: int) -> int:
        if self._from != -1 and self._from <= pos and (self._at == -1 or self._at >= pos):
            return self._at
        self._from = pos
        self._at = self.text.find(self.needle, pos)
        return self._at


# ---- validating one call ----------------------------------------------------------------------


def validate_call(
    value: Any, arg_keys: tuple[str, ...] = ("arguments", "parameters"), allow_missing_args: bool = True
) -> tuple[str, dict[str, Any], str | None] | str:
    """``(name, arguments, id)`` for a well-formed call object, else an error message.

    ``arguments`` may be a JSON string holding an object (decoded). A missing arguments key means
    ``{}`` when ``allow_missing_args`` (no-argument tools): a repair, which
    :meth:`Collector.add_value` reports as a warning (:func:`missing_arguments`).
    """
    if not isinstance(value, dict):
        return f"tool call must be a JSON object, got {type_name(value)}"
    if "name" not in value:
        return 'tool call has no "name"'
    name = value["name"]
    if not isinstance(name, str):
        return f'tool call "name" must be a string, got {type_name(name)}'
    if not name.strip():
        return 'tool call "name" is empty'
    key = None
    for k in arg_keys:
        if k in value:
            key = k
            break
    if key is None:
        if not allow_missing_args:
            return f'tool call {name!r} has no "{arg_keys[0]}"'
        args: Any = {}
    else:
        args = value[key]
    if isinstance(args, str):
        decoded, err = decode_whole(args)
        if err is not None:
            return f'tool call {name!r}: "{key}" is a string that is not a JSON object ({err})'
        if not isinstance(decoded, dict):
            return f'tool call {name!r}: "{key}" is a string holding {type_name(decoded)}, not an object'
        args = decoded
    elif not isinstance(args, dict):
        return f'tool call {name!r}: "{key}" must be a JSON object, got {type_name(args)}'
    call_id = value.get("id")
    if call_id is not None and not isinstance(call_id, str):
        call_id = str(call_id) if isinstance(call_id, int) and not isinstance(call_id, bool) else None
    return name, args, call_id


def missing_arguments(value: dict[str, Any], arg_keys: tuple[str, ...]) -> str | None:
    """The repair note for a call object that has no arguments key (read as ``{}``), else None."""
    if any(k in value for k in arg_keys):
        return None
    return (f'tool call {value.get("name")!r} has no "{arg_keys[0]}": read as {{}} (no arguments); the model did not '
            f'write them')


class Collector:
    """Accumulates calls, errors, content ranges and reasoning for one text."""

    def __init__(self, text: str) -> None:
        self.text = as_doc(text)
        self.calls: list[ToolCall] = []
        self.errors: list[ParseError] = []
        self.content: list[tuple[int, int]] = []
        self.reasoning: list[str] | None = None

    def add_content(self, start: int, end: int) -> None:
        if end > start:
            self.content.append((start, end))

    def add_reasoning(self, s: str) -> None:
        if self.reasoning is None:
            self.reasoning = []
        self.reasoning.append(s.strip())

    def add_error(self, start: int, end: int, message: str, severity: str = "error") -> None:
        end = max(start, min(end, len(self.text)))
        self.errors.append(ParseError(message=message, span=(start, end), raw=self.text[start:end], severity=severity))

    def add_value(self, start: int, end: int, value: Any, **validate_kw: Any) -> bool:
        """Validate a decoded call object spanning ``[start, end)``; record a call or an error
        (and a warning over the call when it was read only after a repair)."""
        r = validate_call(value, **validate_kw)
        if isinstance(r, str):
            self.add_error(start, end, r)
            return False
        name, args, call_id = r
        self.add_call(name, args, call_id, start, end)
        repair = missing_arguments(value, validate_kw.get("arg_keys", ("arguments", "parameters")))
        if repair:
            self.add_error(start, end, repair, severity="warning")
        return True

    def add_call(self, name: str, args: dict[str, Any], call_id: str | None, start: int, end: int) -> None:
        self.calls.append(
            ToolCall(name=name, arguments=args, id=call_id, span=(start, end), raw=self.text[start:end])
        )

    def result(self) -> ParseResult:
        content = "".join(self.text[s:e] for s, e in self.content).strip()
        reasoning = None if self.reasoning is None else "\n\n".join(r for r in self.reasoning if r)
        self.calls.sort(key=lambda c: c.span[0] if c.span else 0)
        self.errors.sort(key=lambda e: e.span[0] if e.span else 0)
        return ParseResult(content=content, reasoning=reasoning, tool_calls=self.calls, errors=self.errors)


# ---- sequences of call objects ----------------------------------------------------------------

# Where the next call object of a broken list probably starts: a separator, then an object whose
# first key is one a call object starts with. Used only to recover after a bad element.
_CALL_KEYS = r'\{\s*"(?:name|arguments|parameters|id)"\s*:'
RESYNC_COMMA = re.compile(r",\s*(?=" + _CALL_KEYS + ")")
RESYNC_SEMICOLON = re.compile(r";\s*(?=" + _CALL_KEYS + ")")


def parse_call_list(
    col: Collector,
    lb: int,
    region_end: Callable[[int], int],
    what: str = "list",
) -> tuple[int, str]:
    """Read a JSON list of call objects whose ``[`` is at ``lb``, element by element.

    Each element that is a well-formed call becomes a call spanning the element; each bad element
    becomes an error spanning it. After a bad element the reader resynchronises at the next
    ``, {"name": ...`` before ``region_end(pos)`` (the end of the enclosing block), so one bad
    element hides nothing after it.

    Returns ``(end, status)``: ``"closed"`` with the position after the closing ``]``;
    ``"truncated"`` when the text ends inside the list (``end`` is the end of the text; element
    errors are recorded, the unclosed list is left to the caller); ``"broken"`` when a bad element
    could not be skipped (``end`` is ``region_end`` of it; its error is recorded).
    """
    text = col.text
    n = len(text)
    i = skip_ws(text, lb + 1)
    if text.startswith("]", i):
        return i + 1, "closed"
    while True:
        s = i
        if s >= n:
            return n, "truncated"
        if text[s] == ",":  # an empty element: "[a,,b]" or "[,a]"
            col.add_error(s, s + 1, f"empty element in {what} (a comma with no value before it)")
            i = skip_ws(text, s + 1)
            continue
        value, end, err = decode_at(text, s)
        search_from = s + 1
        if err is None:
            j = skip_ws(text, end)
            c = text[j : j + 1]
            if c == ",":
                col.add_value(s, end, value)
                i = skip_ws(text, j + 1)
                if text.startswith("]", i):  # trailing comma: tolerated, like most servers do not
                    col.add_error(j, j + 1, f"trailing comma in {what}")
                    return i + 1, "closed"
                continue
            if c == "]":
                col.add_value(s, end, value)
                return j + 1, "closed"
            if c == "":
                col.add_value(s, end, value)
                return n, "truncated"
            err = f"expected ',' or ']' after element of {what}, found {text[j:j + 10]!r}"
            search_from = end
        limit = region_end(s)
        m = RESYNC_COMMA.search(text, search_from, limit)
        if m is not None:
            col.add_error(s, rstrip_end(text, s, m.start()), err)
            i = m.end()
            continue
        col.add_error(s, last_element_end(text, s, limit), err)
        return limit, "broken"


def last_element_end(text: str, s: int, limit: int) -> int:
    """End of a bad last element that runs to ``limit``: trailing whitespace dropped, and a final
    ``]`` too when the element's own brackets are balanced without it (then it closes the list)."""
    e = rstrip_end(text, s, limit)
    if e - 1 > s and text[e - 1] == "]" and bracket_depth(text, s, e - 1) <= 0:
        e = rstrip_end(text, s, e - 1)
    return e


_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)  # possessive: no backtracking


def bracket_depth(text: str, s: int, e: int) -> int:
    """Open minus closed brackets in ``text[s:e]`` outside JSON strings; a huge number when the
    text ends inside a string. Linear, in C (strings removed by one regex pass, then counted)."""
    seg = _JSON_STRING.sub("", text[s:e])
    if '"' in seg:
        return 1 << 30
    return seg.count("{") + seg.count("[") - seg.count("}") - seg.count("]")


# ---- the tag scanner -------------------------------------------------------------------------


CallHandler = Callable[[Collector, int, int], int]


def scan_tagged(
    text: str,
    call_open: str,
    handle_call: CallHandler,
    think_open: str | None = None,
    think_close: str | None = None,
    drop_tags: tuple[str, ...] = (),
    col: Collector | None = None,
) -> Collector:
    """Split ``text`` into content, reasoning blocks and call blocks.

    ``handle_call(col, tag_start, tag_end)`` reads the call block whose opening tag spans
    ``[tag_start, tag_end)`` and returns the position after it. Call tags inside a reasoning block
    are part of the reasoning. A closing reasoning tag with no opening tag and no call before it
    makes everything before it reasoning (a template that already opened ``<think>``). An unclosed
    reasoning block runs to the end of the text. ``drop_tags`` are removed from the content.
    """
    col = col or Collector(text)
    pos = 0
    if think_open and think_close:
        first_close = text.find(think_close)
        if first_close != -1:
            # only if no opening tag and no call comes before it (a call's JSON may hold "</think>")
            first_open = text.find(think_open, 0, first_close)
            if first_open == -1 and text.find(call_open, 0, first_close) == -1:
                col.add_reasoning(text[:first_close])
                pos = first_close + len(think_close)
    tags = [call_open, *drop_tags]
    if think_open and think_close:
        tags += [think_open, think_close]
    # Longest first so that a tag that is a prefix of another never shadows it.
    pattern = re.compile("|".join(re.escape(t) for t in sorted(set(tags), key=len, reverse=True)))
    think_finder = Finder(text, think_close) if think_close else None
    n = len(text)
    while pos < n:
        m = pattern.search(text, pos)
        if m is None:
            col.add_content(pos, n)
            break
        col.add_content(pos, m.start())
        tag = m.group()
        if tag == call_open:
            new_pos = handle_call(col, m.start(), m.end())
            pos = max(new_pos, m.end())
        elif tag == think_open:
            assert think_finder is not None and think_close is not None
            close = think_finder.find(m.end())
            if close == -1:
                col.add_reasoning(text[m.end() :])
                break
            col.add_reasoning(text[m.end() : close])
            pos = close + len(think_close)
        elif tag == think_close:  # stray closing tag after other text: keep it as text
            col.add_content(m.start(), m.end())
            pos = m.end()
        else:  # a dropped tag
            pos = m.end()
    return col


def dumps(value: Any) -> str:
    """JSON the way chat templates write it (``tojson``: ``ensure_ascii=False``, default separators)."""
    return json.dumps(value, ensure_ascii=False)
