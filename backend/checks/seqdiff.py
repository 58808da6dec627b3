"""Diffs of long sequences (token ids, lines, characters) in bounded time.

``difflib.SequenceMatcher`` is exact but its cost grows with how often elements repeat: on two
40k-token sequences (common tokens occur thousands of times) one call to ``get_opcodes`` took
~10 s, and diagnostics make two such calls per trace. Here, as in line-then-character text
diffs, a long sequence is first cut into segments (lines, or runs ending at a token such as
``<|im_end|>``), the segments are aligned, and only the runs of segments that differ are
aligned element by element. Every level strips the common prefix and suffix first, and
``difflib`` aligns elements one by one (``autojunk=False``) only while the product of the two
lengths is at most ``limit``; past it, popular elements stop being anchors (``autojunk=True``)
at the segment level, and a differing run too long to align is reported as one replacement.

The result has ``SequenceMatcher.get_opcodes()``'s shape and meaning: ``(tag, i1, i2, j1, j2)``
with tags ``equal``/``replace``/``delete``/``insert``, covering both sequences in order, equal
runs and differing runs alternating.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Sequence

Op = tuple[str, int, int, int, int]

# Largest len(a) * len(b) that difflib aligns element by element (popular elements included).
LIMIT = 4_000_000


def opcodes(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    *,
    cut_after: Callable[[Hashable], bool] | None = None,
    limit: int = LIMIT,
) -> list[Op]:
    """Opcodes turning ``a`` into ``b``.

    ``cut_after(x)`` true marks ``x`` as the last element of a segment (a token that ends a
    line or a turn); without it, long differing runs are aligned directly or not at all.
    """
    raw: list[Op] = []
    _diff(a, b, 0, len(a), 0, len(b), cut_after, limit, raw)
    return _normalise(raw)


def _tag(i1: int, i2: int, j1: int, j2: int) -> str:
    if i1 == i2:
        return "insert"
    if j1 == j2:
        return "delete"
    return "replace"


def _diff(a, b, alo, ahi, blo, bhi, cut_after, limit, out: list[Op]) -> None:
    # common prefix and suffix: most sequences compared here are nearly equal
    p = 0
    n = min(ahi - alo, bhi - blo)
    while p < n and a[alo + p] == b[blo + p]:
        p += 1
    if p:
        out.append(("equal", alo, alo + p, blo, blo + p))
        alo += p
        blo += p
    s = 0
    n = min(ahi - alo, bhi - blo)
    while s < n and a[ahi - 1 - s] == b[bhi - 1 - s]:
        s += 1
    tail = ("equal", ahi - s, ahi, bhi - s, bhi) if s else None
    ahi -= s
    bhi -= s
    la, lb = ahi - alo, bhi - blo
    if la == 0 or lb == 0:
        if la or lb:
            out.append((_tag(alo, ahi, blo, bhi), alo, ahi, blo, bhi))
    elif la * lb <= limit:
        sm = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
        out += [(t, alo + i1, alo + i2, blo + j1, blo + j2) for t, i1, i2, j1, j2 in sm.get_opcodes()]
    elif cut_after is not None:
        sa = _segments(a, alo, ahi, cut_after)
        sb = _segments(b, blo, bhi, cut_after)
        if len(sa) == 1 and len(sb) == 1:  # no cut point: one long differing run
            out.append(("replace", alo, ahi, blo, bhi))
        else:
            ka = [tuple(a[x:y]) for x, y in sa]
            kb = [tuple(b[x:y]) for x, y in sb]
            sm = difflib.SequenceMatcher(None, ka, kb, autojunk=len(ka) * len(kb) > limit)
            for t, i1, i2, j1, j2 in sm.get_opcodes():
                x1, x2 = (sa[i1][0], sa[i2 - 1][1]) if i2 > i1 else ((sa[i1][0],) * 2 if i1 < len(sa) else (ahi, ahi))
                y1, y2 = (sb[j1][0], sb[j2 - 1][1]) if j2 > j1 else ((sb[j1][0],) * 2 if j1 < len(sb) else (bhi, bhi))
                if t == "equal":
                    out.append(("equal", x1, x2, y1, y2))
                else:  # align the differing run element by element (bounded again)
                    _diff(a, b, x1, x2, y1, y2, None, limit, out)
    else:
        out.append(("replace", alo, ahi, blo, bhi))
    if tail:
        out.append(tail)


def _segments(seq, lo: int, hi: int, cut_after) -> list[tuple[int, int]]:
    out = []
    start = lo
    for k in range(lo, hi):
        if cut_after(seq[k]):
            out.append((start, k + 1))
            start = k + 1
    if start < hi:
        out.append((start, hi))
    return out


def _normalise(ops: list[Op]) -> list[Op]:
    """Drop empty ops, merge neighbours: adjacent equal runs into one, adjacent differing runs
    into one replace/insert/delete (as difflib reports a gap between two matching blocks)."""
    out: list[list] = []
    for t, i1, i2, j1, j2 in ops:
        if i1 == i2 and j1 == j2:
            continue
        eq = t == "equal"
        if out and (out[-1][0] == "equal") == eq:
            out[-1][2], out[-1][4] = i2, j2
            if not eq:
                out[-1][0] = _tag(out[-1][1], i2, out[-1][3], j2)
        else:
            out.append([t if eq else _tag(i1, i2, j1, j2), i1, i2, j1, j2])
    return [tuple(o) for o in out]  # type: ignore[misc]
