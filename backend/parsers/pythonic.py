"""Pythonic tool calls (Llama 3.2 / Llama 4 with the pythonic templates, Gemma-style prompts,
ToolACE)::

    [get_weather(city="Paris", days=3), get_time()]
    <|python_start|>[get_weather(city="Paris")]<|python_end|>

A list of calls ``name(keyword=literal, ...)``; a name may be dotted (``a.b``). Calls are read
when the text (after whitespace) starts with ``[name(``, and after each ``<|python_start|>``
(Llama 4), where a list must follow and ``<|python_end|>`` must close it. Elsewhere a ``[...]``
is content, and so is text after the list.

Arguments are Python literals, read with :mod:`ast` (never evaluated): strings, numbers,
``True``/``False``/``None``, lists, tuples (read as lists) and dicts with string keys. Anything
else — a name (``true``, ``null``, ``x``), a call, an operator, a set, bytes, an f-string, a
positional or ``**`` argument, a repeated keyword, a non-finite number — makes that call one error
spanning it; the other calls are kept. Each element is found by a linear scan of brackets and
string literals, then parsed on its own, so one bad call hides nothing after it.

``format_calls`` and the ``tool_choice`` grammar write values the JSON way with Python's
``True``/``False``/``None`` (``city="Paris"``, ``opts={"a": [1, 2.5, None]}``), ``", "`` between
arguments and calls, and the list without the Llama 4 tag.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from backend.parsers._common import Collector, Finder, rstrip_end, skip_ws
from backend.parsers._grammar import PY_BASE_RULES, PyLiteralGrammar, is_identifier, py_literal
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal

PY_START = "<|python_start|>"
PY_END = "<|python_end|>"
MAX_DEPTH = 100  # brackets inside one call (Python's own parser stops at 200)

# "[" then a (dotted) name and "(": what starts a list of calls
_LIST_START = re.compile(r"\[\s*[^\W\d]\w*(?:\s*\.\s*[^\W\d]\w*)*\s*\(")
# what the element scanner stops at
_SIG = re.compile(r"[\[\](){},'\"#]")
_CLOSER = {")": "(", "]": "[", "}": "{"}
# string literals (possessive: no backtracking). A one-line string may run over raw newlines here
# (models write them in code arguments; Python rejects them, so that call is an error, but the
# scan stays in step); one with no closing quote at all stops at its line's end.
_STR1 = {q: re.compile(q + r"[^" + q + r"\\]*+(?:\\.[^" + q + r"\\]*+)*+" + q, re.S) for q in "'\""}
_STR3 = {q: re.compile(q * 3 + r"(?:[^" + q + r"\\]++|\\.|" + q + r"(?!" + q * 2 + r"))*+" + q * 3, re.S) for q in "'\""}
_JSON_NAMES = {"true": "True", "false": "False", "null": "None"}


class _BadLiteral(ValueError):
    pass


def _literal(node: ast.expr, depth: int = 0) -> Any:
    """The JSON value of a literal node; _BadLiteral for anything that is not a literal."""
    if depth > MAX_DEPTH:
        raise _BadLiteral("nested too deeply")
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, (bool, str, int)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise _BadLiteral("a number that overflows to infinity (not a JSON number)")
            return v
        raise _BadLiteral(f"a {type(v).__name__} literal is not a JSON value")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant):
        v = node.operand.value
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, float) and not math.isfinite(v):
                raise _BadLiteral("a number that overflows to infinity (not a JSON number)")
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _BadLiteral("'**' unpacking in a dict")
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise _BadLiteral("a dict key that is not a string literal")
            out[k.value] = _literal(v, depth + 1)
        return out
    if isinstance(node, ast.Name):
        hint = f" (Python writes {_JSON_NAMES[node.id]})" if node.id in _JSON_NAMES else ""
        raise _BadLiteral(f"the name {node.id!r}, not a literal{hint}")
    if isinstance(node, ast.Set):
        raise _BadLiteral("a set (unordered; not a JSON value)")
    if isinstance(node, ast.JoinedStr):
        raise _BadLiteral("an f-string")
    raise _BadLiteral(f"an expression ({type(node).__name__}), not a literal")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def read_call(src: str) -> tuple[str, dict[str, Any]] | str:
    """``(name, arguments)`` for the source of one call ``name(k=v, ...)``, else an error message."""
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        return f"not a Python call: {e.msg}"
    except (ValueError, UnicodeError, MemoryError, RecursionError) as e:
        return f"not a Python call: {type(e).__name__}: {e}"[:300]
    call = tree.body
    if not isinstance(call, ast.Call):
        return f"expected a call name(...), found {type(call).__name__}"
    name = _dotted(call.func)
    if name is None:
        return "the called thing is not a (dotted) name"
    if call.args:
        return f"tool call {name!r} has positional arguments (only keyword arguments name=value are read)"
    args: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            return f"tool call {name!r} has a '**' argument"
        if kw.arg in args:
            return f"tool call {name!r}: keyword argument {kw.arg!r} is repeated"
        try:
            args[kw.arg] = _literal(kw.value)
        except _BadLiteral as e:
            return f"tool call {name!r}: argument {kw.arg!r} is {e}"
        except RecursionError:
            return f"tool call {name!r}: argument {kw.arg!r} is nested too deeply"
    return name, args


def _scan_element(text: str, s: int, unclosed: dict[str, int]) -> tuple[int, str, bool]:
    """From ``s``, the end of one list element: ``(pos, stop, too_deep)`` where ``stop`` is ``","``
    or ``"]"`` (at ``pos``) or ``""`` (the text ended). Brackets and string literals are skipped
    (a string with no closing quote ends at its line's end, to keep a bad string local).
    ``unclosed`` maps a quote character to where a string opened by it was found to have no
    closing quote: every later one has none either (each later quote was an escaped one in that
    search), so it is not searched again and the scan stays linear."""
    n = len(text)
    stack: list[str] = []
    deep = False
    i = s
    while True:
        m = _SIG.search(text, i)
        if m is None:
            return n, "", deep
        c = m.group()
        p = m.start()
        if c in "'\"":
            if text.startswith(c * 3, p):
                sm = _STR3[c].match(text, p)
                if sm is None:
                    return n, "", deep  # an unclosed triple-quoted string runs to the end
                i = sm.end()
            else:
                sm = None if unclosed.get(c, n) < p else _STR1[c].match(text, p)
                if sm is None:
                    unclosed[c] = min(unclosed.get(c, n), p)
                if sm is not None:
                    i = sm.end()
                else:
                    nl = text.find("\n", p + 1)
                    i = n if nl == -1 else nl
            continue
        if c == "#":
            nl = text.find("\n", p)
            i = n if nl == -1 else nl
            continue
        if c in "([{":
            stack.append(c)
            if len(stack) > MAX_DEPTH:
                deep = True
        elif c in ")]}":
            if not stack:
                if c == "]":
                    return p, "]", deep
            elif stack[-1] == _CLOSER[c]:
                stack.pop()
            elif c == "]":
                if "[" not in stack:
                    return p, "]", deep  # "[f(a=1]": the list ends here
                while stack.pop() != "[":
                    pass
        elif not stack:  # a comma at the top level
            return p, ",", deep
        i = p + 1


class PythonicFormat(ToolCallFormat):
    """The pythonic layout: ``[name(k=v, ...), ...]``; its grammar is built per tool."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        g = PyLiteralGrammar("py_r")
        alts = []
        for name, params in tools:
            if not all(is_identifier(p) for p in name.split(".")):
                raise ValueError(f"tool name {name!r} cannot be written as a Python call")
            alts.append(f"{ebnf_literal(name + '(')} {g.keyword_args(params)} {ebnf_literal(')')}")
        rules = self.grammar_rules("tool_body", multiple=multiple, max_calls=max_calls)
        return "\n".join([*rules, "tool_body ::= " + " | ".join(alts), *g.rules, PY_BASE_RULES.strip()])


@register_parser("pythonic")
class PythonicParser(ToolCallParser):
    # tool_choice=none bans "[" (a call list has no other fixed text)
    call_format = PythonicFormat(
        "[", list_open="[", list_close="]", sep=", ", markers=("[func_name1(",),
        vllm_names=("pythonic", "llama4_pythonic"),
    )
    call_begin = "["
    call_end = "]"

    def _parse(self, text: str) -> ParseResult:
        col = Collector(text)
        n = len(text)
        pos = 0
        i = skip_ws(text, 0)
        if _LIST_START.match(text, i):
            end, status = self._read_list(col, i)
            if status == "truncated":
                col.add_error(i, n, "unclosed call list: the text ends before its ']' (generation truncated?)")
            pos = end
        # cached "next tag" searches: a text of many unclosed <|python_start|> stays linear
        starts, ends = Finder(text, PY_START), Finder(text, PY_END)
        while pos < n:
            t = starts.find(pos)
            if t == -1:
                col.add_content(pos, n)
                break
            col.add_content(pos, t)
            pos = self._read_tagged(col, t, starts, ends)
        return col.result()

    def _read_tagged(self, col: Collector, t: int, starts: Finder, ends: Finder) -> int:
        text = col.text
        n = len(text)
        after = t + len(PY_START)
        j = skip_ws(text, after)
        if j >= n:
            col.add_error(t, n, f"{PY_START} with nothing after it (generation truncated?)")
            return n
        if text[j] != "[":
            close = ends.find(j)
            nxt = starts.find(j)
            if close != -1 and (nxt == -1 or close < nxt):
                col.add_error(t, close + len(PY_END), f"{PY_START} is not followed by a list of calls [name(...)]")
                return close + len(PY_END)
            stop = n if nxt == -1 else nxt
            col.add_error(t, rstrip_end(text, t, stop), f"{PY_START} is not followed by a list of calls [name(...)]")
            return stop
        end, status = self._read_list(col, j)
        if status == "truncated":
            col.add_error(t, n, f"unclosed {PY_START}: the text ends inside the call list (generation truncated?)")
            return n
        k = skip_ws(text, end)
        if text.startswith(PY_END, k):
            return k + len(PY_END)
        if k >= n:
            col.add_error(t, n, f"unclosed {PY_START}: the text ends before {PY_END}")
            return n
        close = ends.find(k)
        nxt = starts.find(k)
        if close != -1 and (nxt == -1 or close < nxt):
            col.add_error(k, close + len(PY_END), f"unexpected text after the call list, before {PY_END}: {text[k:k + 20]!r}")
            return close + len(PY_END)
        col.add_error(t, rstrip_end(text, t, end), f"unclosed {PY_START}: no {PY_END} after the call list")
        return end

    def _read_list(self, col: Collector, lb: int) -> tuple[int, str]:
        """Read the call list whose ``[`` is at ``lb``: ``(end, "closed" | "truncated")``."""
        text = col.text
        n = len(text)
        i = skip_ws(text, lb + 1)
        if text.startswith("]", i):  # "[]": no calls
            return i + 1, "closed"
        unclosed: dict[str, int] = {}
        while True:
            s = i
            if s >= n:
                return n, "truncated"
            if text[s] == ",":
                col.add_error(s, s + 1, "empty element in the call list (a comma with no call before it)")
                i = skip_ws(text, s + 1)
                continue
            p, stop, deep = _scan_element(text, s, unclosed)
            e = rstrip_end(text, s, p)
            if deep:
                col.add_error(s, e, f"call nested more than {MAX_DEPTH} brackets deep")
            else:
                r = read_call(text[s:e])
                if isinstance(r, str):
                    col.add_error(s, e, ("truncated call: " if not stop else "") + r)
                else:
                    col.add_call(r[0], r[1], None, s, e)
            if not stop:
                return n, "truncated"
            if stop == "]":
                return p + 1, "closed"
            i = skip_ws(text, p + 1)
            if text.startswith("]", i):
                col.add_error(p, p + 1, "trailing comma in the call list")
                return i + 1, "closed"

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        out = []
        for c in calls:
            name = c["name"]
            if not all(is_identifier(p) for p in str(name).split(".")):
                raise ValueError(f"tool name {name!r} cannot be written as a Python call")
            args = []
            for k, v in (c.get("arguments") or {}).items():
                if not is_identifier(k):
                    raise ValueError(f"argument {k!r} of {name!r} cannot be written as a Python keyword argument")
                args.append(f"{k}={py_literal(v)}")
            out.append(f"{name}({', '.join(args)})")
        return "[" + ", ".join(out) + "]"
