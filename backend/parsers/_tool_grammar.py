"""EBNF pieces for formats that build their own ``tool_choice`` grammar
(:meth:`~backend.parsers.format.ToolCallFormat.custom_grammar`): xgrammar's JSON-schema grammar
with its rules renamed per tool, text that must not contain given tags, and the root rule that
lays out one or several calls.

Example (DeepSeek V3, two tools, ``required``)::

    root ::= "<｜tool▁calls▁begin｜>" call ("\\n" call)* "<｜tool▁calls▁end｜>"
    call ::= t0_call | t1_call
    t0_call ::= "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\\n```json\\n" t0_root "\\n```<｜tool▁call▁end｜>"
    t0_root ::= ...   (xgrammar's rules for get_weather's parameters, every rule named t0_*)
"""

from __future__ import annotations

import json
import re
from typing import Any

from backend.parsers.format import MAX_SPELLED_CALLS, ebnf_literal

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE_HEAD = re.compile(r"(?m)^([A-Za-z_][A-Za-z0-9_]*) ::=")


def prefix_rules(grammar: str, prefix: str) -> str:
    """``grammar`` (EBNF text) with every rule it defines renamed ``<prefix>_<name>``. Names are
    replaced only outside string literals and character classes (a property named ``root`` is a
    literal ``"\\"root\\""`` and stays as it is)."""
    names = set(_RULE_HEAD.findall(grammar))
    out: list[str] = []
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c in "\"[":  # a literal or a character class: copied up to its unescaped end
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and grammar[j] != close:
                j += 2 if grammar[j] == "\\" else 1
            out.append(grammar[i : j + 1])
            i = j + 1
            continue
        m = _IDENT.match(grammar, i)
        if m is not None:
            word = m.group()
            out.append(f"{prefix}_{word}" if word in names else word)
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def json_value_rules(schema: dict[str, Any], prefix: str) -> tuple[str, str]:
    """``(rule name, rules)``: xgrammar's grammar of one JSON value matching ``schema`` (compact:
    ``", "`` and ``": "``), its rules renamed with ``prefix``; the value is rule ``<prefix>_root``."""
    import xgrammar as xgr

    g = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": ")))
    return f"{prefix}_root", prefix_rules(g, prefix).strip()


def _class_char(c: str) -> str:
    return "\\" + c if c in "\\]^-[" else c


def text_without(name: str, patterns: tuple[str, ...]) -> list[str]:
    """Rules for any text (possibly empty) that contains none of ``patterns``; the text is rule
    ``name``. Each pattern must start with ``<`` and hold no other ``<`` (tags), so after a
    mismatch the automaton restarts at ``<`` or at the beginning (a KMP automaton over the trie)."""
    for p in patterns:
        if not p.startswith("<") or "<" in p[1:] or len(p) < 2:
            raise ValueError(f"text_without: {p!r} is not a tag")
    prefixes = sorted({p[:k] for p in patterns for k in range(len(p))}, key=lambda s: (len(s), s))
    full = set(patterns)
    rule = {u: (name if u == "" else f"{name}_{k}") for k, u in enumerate(prefixes)}
    rules = []
    for u in prefixes:
        nexts = sorted({p[len(u)] for p in patterns if p.startswith(u) and len(p) > len(u)})
        alts = ['""']
        for c in nexts:
            if u + c in full:
                continue  # the tag itself: not allowed
            alts.append(f"{ebnf_literal(c)} {rule[u + c]}")
        if "<" not in nexts:
            alts.append(f'"<" {rule["<"]}')
        banned = "".join(_class_char(c) for c in sorted({"<", *nexts}))
        alts.append(f"[^{banned}] {name}")
        rules.append(f"{rule[u]} ::= " + " | ".join(f"({a})" for a in alts))
    return rules


def calls_root(call_rule: str, *, open_: str, sep: str, close: str, multiple: bool, max_calls: int | None) -> str:
    """``root ::= open call (sep call)* close``: one call, or with ``multiple`` one or more (at
    most ``max_calls``; up to :data:`MAX_SPELLED_CALLS` the bound is spelled out)."""
    lit = ebnf_literal
    sep_part = f"{lit(sep)} " if sep else ""
    more = ""
    if multiple and max_calls is not None and max_calls <= MAX_SPELLED_CALLS:
        for _ in range(max_calls - 1):
            more = f"({sep_part}{call_rule}{' ' + more if more else ''})?"
    elif multiple:
        more = f"({sep_part}{call_rule})*"
    parts = [lit(open_) if open_ else "", call_rule, more, lit(close) if close else ""]
    return "root ::= " + " ".join(p for p in parts if p)
