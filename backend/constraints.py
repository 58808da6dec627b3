"""Decoding constraints: what a backend is asked to enforce on one generated turn.

:class:`Constraint` is built by :mod:`backend.tool_choice`; :func:`normalize_constraint` turns it
into the vocabulary every backend speaks (vLLM's ``structured_outputs`` fields, which xgrammar
also compiles): ``regex``, ``json``, ``grammar`` or ``structural_tag``. ``forbid`` (text that
must not contain some strings) becomes an EBNF grammar (:func:`forbid_grammar`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CONSTRAINT_FIELDS = {"regex": "regex", "json_schema": "json", "grammar": "grammar", "structural_tag": "structural_tag"}
CONSTRAINT_KINDS = ("none", "regex", "json_schema", "grammar", "structural_tag", "forbid")


@dataclass(frozen=True)
class Constraint:
    """A decoding constraint for one generated turn (tool_choice; see backend.tool_choice).

    ``kind``: "none" (no constraint), "regex", "json_schema", "grammar" (EBNF/lark),
    "structural_tag" or "forbid". ``spec`` is the regex / schema / grammar text (for "forbid": the
    strings) the backend enforces. ``given_check``: how a turn the model did NOT generate under
    this constraint (a script, an import) is checked against it
    (``backend.tool_choice.check_given``); None: by ``spec``.
    """

    kind: str = "none"
    spec: Any = None
    description: str = ""
    given_check: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "spec": self.spec, "description": self.description}


def active_constraint(constraint: Constraint | None) -> Constraint | None:
    """``constraint``, or None when it constrains nothing (None, kind "none" or empty)."""
    if constraint is None or constraint.kind in ("none", "", None):
        return None
    return constraint


def _class_char(c: str) -> str:
    if c in "\\]^-[":
        return "\\" + c
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, c)


def forbid_grammar(strings: list[str] | tuple[str, ...]) -> str:
    """EBNF (xgrammar/GBNF dialect) for any text that contains none of ``strings``.

    Built from the Aho-Corasick automaton of the strings: one rule per live state, every rule
    optional (text may end anywhere, so EOS is always allowed)."""
    pats = [s for s in dict.fromkeys(strings) if s]
    if not pats:
        raise ValueError("a forbid constraint needs at least one non-empty string")
    goto: list[dict[str, int]] = [{}]
    final = [False]
    for p in pats:
        q = 0
        for ch in p:
            if ch not in goto[q]:
                goto.append({})
                final.append(False)
                goto[q][ch] = len(goto) - 1
            q = goto[q][ch]
        final[q] = True
    fail = [0] * len(goto)
    order = list(goto[0].values())
    i = 0
    while i < len(order):
        q = order[i]
        i += 1
        for ch, r in goto[q].items():
            order.append(r)
            f = fail[q]
            while f and ch not in goto[f]:
                f = fail[f]
            nxt = goto[f].get(ch, 0)
            fail[r] = nxt if nxt != r else 0
            final[r] = final[r] or final[fail[r]]

    def step(q: int, ch: str) -> int:
        while q and ch not in goto[q]:
            q = fail[q]
        return goto[q].get(ch, 0)

    def name(q: int) -> str:
        return "root" if q == 0 else f"s{q}"

    sigma = sorted({ch for p in pats for ch in p})
    other = "[^" + "".join(_class_char(c) for c in sigma) + "]"
    rules = []
    for q in range(len(goto)):
        if final[q]:
            continue
        alts = [f"{json.dumps(ch)} {name(step(q, ch))}" for ch in sigma if not final[step(q, ch)]]
        alts.append(f"{other} root")
        rules.append(f"{name(q)} ::= ({' | '.join(alts)})?")
    return "\n".join(rules)


def normalize_constraint(constraint: Constraint | None) -> tuple[str, Any] | None:
    """A :class:`Constraint` in vLLM's ``structured_outputs`` vocabulary: ``(field, spec)`` with
    field ``regex`` / ``json`` / ``grammar`` / ``structural_tag``; None for no constraint.
    ValueError for a constraint that cannot be read.

    ``forbid`` (spec: strings the text must not contain; backend.tool_choice's ``none``) becomes
    an EBNF grammar (:func:`forbid_grammar`)."""
    constraint = active_constraint(constraint)
    if constraint is None:
        return None
    kind, spec = constraint.kind, constraint.spec
    if spec is None:
        raise ValueError(f"constraint {kind!r} has no spec")
    if kind == "forbid":
        return "grammar", forbid_grammar([spec] if isinstance(spec, str) else list(spec))
    key = CONSTRAINT_FIELDS.get(kind)
    if key is None:
        raise ValueError(f"unknown constraint kind {kind!r}; expected one of {', '.join(CONSTRAINT_KINDS)}")
    if key == "structural_tag" and not isinstance(spec, str):
        spec = json.dumps(spec)
    if key == "json" and not isinstance(spec, (dict, str)):
        spec = json.loads(json.dumps(spec))
    if key in ("regex", "grammar"):
        spec = str(spec)
    return key, spec


def structured_outputs(constraint: Constraint | None) -> dict[str, Any] | None:
    """A :class:`Constraint` as vLLM's ``structured_outputs`` object ``{field: spec}`` (None: none)."""
    norm = normalize_constraint(constraint)
    return None if norm is None else {norm[0]: norm[1]}
