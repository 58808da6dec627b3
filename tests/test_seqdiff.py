"""backend.checks.seqdiff: difflib-shaped opcodes for long sequences in bounded time.

Small ``limit`` values force every path (element-wise difflib, segments, a run too long to
align) on inputs small enough to check against ground truth."""

from __future__ import annotations

import difflib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.checks import seqdiff


def check_valid(a, b, ops) -> None:
    """Ops cover both sequences contiguously and in order, equal runs are equal, tags match the
    spans, equal and differing runs alternate (as difflib's get_opcodes)."""
    i = j = 0
    prev_equal = None
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j), ops
        assert i2 >= i1 and j2 >= j1 and (i2 > i1 or j2 > j1)
        if tag == "equal":
            assert list(a[i1:i2]) == list(b[j1:j2])
        else:
            assert tag == {(True, False): "insert", (False, True): "delete", (False, False): "replace"}[(i1 == i2, j1 == j2)]
        eq = tag == "equal"
        assert eq != prev_equal, ops
        prev_equal = eq
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


def differing(ops) -> int:
    return sum(max(i2 - i1, j2 - j1) for t, i1, i2, j1, j2 in ops if t != "equal")


CUT = 0  # the "line end" element


@settings(max_examples=400, deadline=None)
@given(
    a=st.lists(st.integers(0, 5), max_size=60),
    b=st.lists(st.integers(0, 5), max_size=60),
    limit=st.sampled_from([0, 1, 16, 200, 10**9]),
    cut=st.booleans(),
)
def test_opcodes_are_always_a_valid_alignment(a, b, limit, cut):
    ops = seqdiff.opcodes(a, b, cut_after=(lambda x: x == CUT) if cut else None, limit=limit)
    check_valid(a, b, ops)
    if a == b:
        assert ops == ([("equal", 0, len(a), 0, len(b))] if a else [])


def test_identical_and_empty():
    assert seqdiff.opcodes([], []) == []
    assert seqdiff.opcodes([1, 2], []) == [("delete", 0, 2, 0, 0)]
    assert seqdiff.opcodes([], [1]) == [("insert", 0, 0, 0, 1)]
    assert seqdiff.opcodes("abc", "abc") == [("equal", 0, 3, 0, 3)]


def test_within_the_limit_as_good_as_difflib():
    rng = random.Random(7)
    for _ in range(200):
        a = [rng.randrange(6) for _ in range(rng.randrange(40))]
        b = [x for x in a if rng.random() > 0.1] + [rng.randrange(6) for _ in range(rng.randrange(4))]
        if rng.random() < 0.1:
            rng.shuffle(b)
        ops = seqdiff.opcodes(a, b)
        check_valid(a, b, ops)
        assert differing(ops) <= differing(difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes())


@pytest.mark.parametrize("limit", [10_000, 4_000_000])
def test_sparse_edits_in_long_token_runs_are_found_exactly(limit):
    """40k 'tokens' in lines (element 0 ends a line), a token inserted after 60 line ends, one
    replaced and one deleted: exactly those edits come back, through the segment path."""
    rng = random.Random(1)
    a: list[int] = []
    while len(a) < 40_000:
        a += [rng.randrange(1, 3000) for _ in range(rng.randrange(3, 30))] + [CUT]
    b = list(a)
    line_ends = [k for k, x in enumerate(a) if x == CUT]
    inserted = sorted(rng.sample(line_ends[:-1], 60))
    for k in reversed(inserted):
        b.insert(k + 1, 99_999)  # the '\n' a template writes after <|im_end|>
    replace_at = 20_001  # one token changed
    while a[replace_at] == CUT:
        replace_at += 1
    shift = sum(1 for k in inserted if k < replace_at)
    b[replace_at + shift] = 77_777
    ops = seqdiff.opcodes(a, b, cut_after=lambda x: x == CUT, limit=limit)
    check_valid(a, b, ops)
    edits = [op for op in ops if op[0] != "equal"]
    assert [op for op in edits if op[0] == "insert"] == [("insert", k + 1, k + 1, k + 1 + n, k + 2 + n) for n, k in enumerate(inserted)]
    assert [op for op in edits if op[0] != "insert"] == [("replace", replace_at, replace_at + 1, replace_at + shift, replace_at + shift + 1)]


def test_one_long_line_differing_in_one_place_without_cut_points():
    """Past the limit with no way to cut: the common prefix and suffix still come back equal,
    and only the middle is reported."""
    x = "ab" * 100_000
    y = x[:150_001] + "Z" + x[150_002:]
    ops = seqdiff.opcodes(x, y, limit=1000)
    assert ops == [("equal", 0, 150_001, 0, 150_001), ("replace", 150_001, 150_002, 150_001, 150_002),
                   ("equal", 150_002, 200_000, 150_002, 200_000)]
    check_valid(x, "".join(y), ops)
