"""Corrupted trace files through every entry point a user can hit.

One seeded generator turns the shipped sample traces (``sample_traces/*.jsonl``) into
:data:`N_BAD` corrupted lines of known categories (truncated JSON, wrong types for every field of
every model, missing fields, token ids out of range, bad mask values and lengths, step spans out
of range, invalid UTF-8, lone surrogates, NaN/Infinity, deep nesting, integers of more than 4300
digits, non-objects, foreign records, over-long lines, ...) and interleaves them with
:data:`N_GOOD` good lines (the samples under new ids, plus valid edge cases: unicode, escaped NUL,
extra keys, ``-Infinity`` logprobs as our writer writes them, nesting at the depth limit, the
largest token id, CRLF endings, blank lines). The same file then goes through

* :func:`backend.trace.load_traces` and :func:`backend.trace.load_any` (also under ``.txt`` /
  ``.csv`` / ``.json`` names),
* :class:`backend.trace.TraceIndex` (the fast scan, then every row opened by offset),
* ``python -m backend check`` and ``python -m backend import`` (subprocesses),
* the Trace files tab's upload handler :func:`ui.trace_files.load_file`,

and each must keep EVERY good line (same ids and token ids, same order, right line numbers) and
report EVERY bad line with its line number and a one-line reason a person can read (no
traceback, no exception repr). File-level problems (empty, binary, not Parquet, over the size
limit, a 50 MB line) are refused or skipped with a clear message, and memory stays bounded.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_inprocess import run_cli

import backend.trace.io as trace_mod
from backend.importers import load_any
from backend.trace import (
    MAX_JSON_DEPTH,
    MAX_TOKEN_ID,
    LoadResult,
    Trace,
    TraceFileError,
    TraceFormatError,
    TraceIndex,
    load_traces,
    write_jsonl,
    write_parquet,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "sample_traces"

SEED = 20250611
N_BAD = 1_000  # corrupted lines in the mixed file
N_GOOD = 200  # good lines interleaved with them
N_BLANK = 40  # blank / whitespace-only lines (skipped, but counted in line numbers)
LINE_LIMIT = 1 << 20  # line limit for the mixed file (the over-long corrupted lines are 1.5 MB)
BIG_LINE_BYTES = 50_000_000  # the single huge line of the memory test
MEMORY_BOUND = 8 << 20  # tracemalloc peak allowed while skipping it (the line is 50 MB)

# ---- base traces ----------------------------------------------------------------------------------


def _base_records() -> list[dict[str, Any]]:
    out = []
    for p in sorted(SAMPLE_DIR.glob("*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    assert len(out) >= 6
    return out


BASES = _base_records()


def _dump(d: Any, ascii_only: bool = False) -> bytes:
    return json.dumps(d, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8")


# ---- the field table: every typed field of every model, and values of the wrong type -------------

# kinds: int, str, float, bool, list, dict, state, bit, span; "?" = nullable
TOP_FIELDS = {
    "format_version": "int", "id": "str", "messages": "list", "tools": "list", "prompt_ids": "list", "response_ids": "list",
    "response_mask": "list", "steps": "list", "message_spans": "list", "termination_reason": "str?", "config": "dict",
    "tokenizer": "dict", "metadata": "dict",
}
STEP_FIELDS = {
    "index": "int", "state": "state", "start": "int", "end": "int", "mask": "bit?", "text": "str", "messages_added": "list",
    "tool_calls": "list", "parse_errors": "list", "tool_results": "list", "finish_reason": "str?", "constraint": "dict?",
    "logprobs": "list?", "started_at": "float?", "duration_s": "float", "error": "str?", "info": "dict",
}
TOOL_CALL_FIELDS = {"name": "str", "id": "str?", "span": "span?", "raw": "str?"}  # arguments: Any
TOOL_RESULT_FIELDS = {
    "call_id": "str?", "name": "str", "content": "str", "ok": "bool", "error": "str?", "error_detail": "str?", "duration_s": "float",
    "truncated": "bool", "original_length": "int?", "stdout": "str?",
}
PARSE_ERROR_FIELDS = {"message": "str", "span": "span?", "raw": "str?"}
MESSAGE_SPAN_FIELDS = {"message": "int", "start": "int", "end": "int", "char_start": "int?", "char_end": "int?"}
TOKENIZER_FIELDS = {"name": "str?", "template": "str?", "template_sha256": "str?", "eos_token_id": "int?", "vocab_size": "int?"}

WRONG = {
    "int": ["3", 3.0, 2.5, True, False, [3], {"v": 3}, "three"],
    "str": [3, 2.5, True, ["x"], {"v": "x"}],
    "float": ["1.5", "fast", True, [1.5], {"s": 1.5}],
    "bool": [1, 0, "true", "false", "yes", 1.0],
    "list": ["x", 3, True, {"0": 1}, 2.5],
    "dict": ["x", 3, True, [1, 2], 2.5],
    "state": ["running", "", "GENERATING", 3, True, ["generating"]],
    "bit": [2, -1, "1", True, False, 1.0, [1]],
    "span": [[1], [1, 2, 3], "1-2", [1.5, 2], [True, 2], ["1", "2"], 5, {"a": 1}],
}
ID_ELEMENT_WRONG = ["5", 5.0, 5.5, True, False, None, [5], {"id": 5}, "151644", "5]", "]"]
MASK_ELEMENT_WRONG = ["1", 1.0, True, False, None, [1], 0.5, "]"]
LIST_ELEMENT_WRONG = ["x", 3, True, None, [1], 2.5]  # an element of a list of objects


def _wrong_value(rng: random.Random, kind: str) -> Any:
    nullable = kind.endswith("?")
    base = kind.rstrip("?")
    values = list(WRONG[base])
    if not nullable:
        values.append(None)
    return rng.choice(values)


def _targets(d: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Every (path, kind) of a typed field present in ``d``."""
    out: list[tuple[tuple[Any, ...], str]] = [((k,), kind) for k, kind in TOP_FIELDS.items()]
    for i, s in enumerate(d["steps"]):
        out += [(("steps", i, k), kind) for k, kind in STEP_FIELDS.items()]
        for j, _ in enumerate(s["tool_calls"]):
            out += [(("steps", i, "tool_calls", j, k), kind) for k, kind in TOOL_CALL_FIELDS.items()]
        for j, _ in enumerate(s["tool_results"]):
            out += [(("steps", i, "tool_results", j, k), kind) for k, kind in TOOL_RESULT_FIELDS.items()]
        for j, _ in enumerate(s["parse_errors"]):
            out += [(("steps", i, "parse_errors", j, k), kind) for k, kind in PARSE_ERROR_FIELDS.items()]
    for i, _ in enumerate(d["message_spans"][:3]):
        out += [(("message_spans", i, k), kind) for k, kind in MESSAGE_SPAN_FIELDS.items()]
    out += [(("tokenizer", k), kind) for k, kind in TOKENIZER_FIELDS.items()]
    return out


def _set(d: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _where_str(d: dict[str, Any], rng: random.Random) -> tuple[Any, ...]:
    """A path to some string value of the record (content, name, text, id ...)."""
    options: list[tuple[Any, ...]] = [("id",)]
    for i, m in enumerate(d["messages"]):
        if isinstance(m.get("content"), str):
            options.append(("messages", i, "content"))
    for i, s in enumerate(d["steps"]):
        options.append(("steps", i, "text"))
        for j, _ in enumerate(s["tool_calls"]):
            options.append(("steps", i, "tool_calls", j, "name"))
        for j, _ in enumerate(s["tool_results"]):
            options.append(("steps", i, "tool_results", j, "content"))
    options.append(("tokenizer", "name"))
    return rng.choice(options)


def _where_any(d: dict[str, Any], rng: random.Random) -> tuple[Any, ...]:
    """A path where any JSON value may go (metadata, info, tool arguments, message fields)."""
    options: list[tuple[Any, ...]] = [("metadata", "x"), ("config", "x"), ("messages", 0, "x")]
    for i, s in enumerate(d["steps"]):
        options.append(("steps", i, "info", "x"))
        for j, _ in enumerate(s["tool_calls"]):
            options.append(("steps", i, "tool_calls", j, "arguments"))
    return rng.choice(options)


def _nested(depth: int, leaf: Any = 1) -> Any:
    v: Any = leaf
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def _depth(v: Any) -> int:
    """Levels of containers in ``v`` (a scalar is 0)."""
    best = 0
    stack = [(v, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            best = max(best, d)
            stack.extend((c, d + 1) for c in (o.values() if isinstance(o, dict) else o))
    return best


# ---- the corruptions --------------------------------------------------------------------------------


@dataclass
class Case:
    category: str
    raw: bytes  # the line, without its newline
    expect: str  # a word the reason must contain (case-insensitive)
    good: dict[str, Any] | None = None  # the record, for good lines


def _fresh(rng: random.Random, tag: str) -> dict[str, Any]:
    d = copy.deepcopy(rng.choice(BASES))
    d["id"] = tag
    return d


def c_truncated(rng, tag):
    raw = _dump(_fresh(rng, tag))
    return Case("truncated", raw[: rng.randint(1, len(raw) - 1)], "invalid JSON")


def c_wrong_type(rng, tag):
    d = _fresh(rng, tag)
    targets = _targets(d)
    kind = rng.choice(sorted({k for _, k in targets}))  # every kind equally often, then a field of it
    path = rng.choice([p for p, k in targets if k == kind])
    _set(d, path, _wrong_value(rng, kind))
    return Case(f"wrong_type:{kind}", _dump(d), str(path[0]))


def c_wrong_element(rng, tag):
    d = _fresh(rng, tag)
    which = rng.choice(["prompt_ids", "response_ids", "response_mask", "messages", "tools", "steps", "message_spans",
                        "messages_added", "tool_calls", "tool_results", "logprobs"])
    if which in ("prompt_ids", "response_ids"):
        ids = d[which]
        ids[rng.randrange(len(ids))] = rng.choice(ID_ELEMENT_WRONG)
        return Case(f"wrong_element:{which}", _dump(d), which)
    if which == "response_mask":
        d[which][rng.randrange(len(d[which]))] = rng.choice(MASK_ELEMENT_WRONG)
        return Case("wrong_element:response_mask", _dump(d), which)
    if which in ("messages", "tools", "steps", "message_spans"):
        lst = d[which]
        lst[rng.randrange(len(lst))] = rng.choice(LIST_ELEMENT_WRONG)
        return Case(f"wrong_element:{which}", _dump(d), which)
    step = rng.choice(d["steps"])
    if which == "messages_added":
        step["messages_added"] = [rng.choice(["0", 0.0, 1.5, True, None, [0]])]
    elif which == "logprobs":
        step["logprobs"] = [-0.5, rng.choice(["x", True, None, [0.1], {"p": 1}])]
    else:
        step[which] = [rng.choice(LIST_ELEMENT_WRONG)]
    return Case(f"wrong_element:{which}", _dump(d), "steps")


REQUIRED = {  # (container path getter, key) whose absence must be reported
    "step": ("index", "state"), "tool_call": ("name",), "tool_result": ("name", "content"), "parse_error": ("message",),
    "message_span": ("message", "start", "end"),
}


def c_missing(rng, tag):
    d = _fresh(rng, tag)
    kind = rng.choice(["id", "format_version", "both", "response_mask", "response_ids", "prompt_ids", "step", "tool_call",
                       "tool_result", "message_span"])
    if kind in ("id", "format_version"):
        del d[kind]
        return Case(f"missing:{kind}", _dump(d), "trace")
    if kind == "both":
        del d["id"], d["format_version"]
        return Case("missing:id+format_version", _dump(d), "trace")
    if kind in ("response_mask", "response_ids"):
        del d[kind]
        return Case(f"missing:{kind}", _dump(d), "response_mask")
    if kind == "prompt_ids":
        del d["prompt_ids"]
        return Case("missing:prompt_ids", _dump(d), "span")
    if kind == "step":
        s = rng.choice(d["steps"])
        del s[rng.choice(REQUIRED["step"])]
        return Case("missing:step field", _dump(d), "steps")
    if kind == "message_span":
        del d["message_spans"][0][rng.choice(REQUIRED["message_span"])]
        return Case("missing:message_span field", _dump(d), "message_spans")
    key = "tool_calls" if kind == "tool_call" else "tool_results"
    steps = [s for s in d["steps"] if s[key]]
    if not steps:  # this base has none: a missing required step field instead
        del d["steps"][0]["state"]
        return Case("missing:step field", _dump(d), "steps")
    item = rng.choice(rng.choice(steps)[key])
    del item[rng.choice(REQUIRED[kind])]
    return Case(f"missing:{kind} field", _dump(d), "steps")


BAD_IDS = [-1, -2, -(2**31), 2**31, 2**32, 2**63, 2**64 + 1, -(10**20), 10**30]


def c_token_id(rng, tag):
    d = _fresh(rng, tag)
    key = rng.choice(["prompt_ids", "response_ids"])
    d[key][rng.randrange(len(d[key]))] = rng.choice(BAD_IDS)
    return Case(f"token_id:{key}", _dump(d), "out of range")


def c_mask_value(rng, tag):
    d = _fresh(rng, tag)
    d["response_mask"][rng.randrange(len(d["response_mask"]))] = rng.choice([2, -1, 3, 255, 10**20, -(2**40)])
    return Case("mask_value", _dump(d), "mask")


def c_mask_length(rng, tag):
    d = _fresh(rng, tag)
    how = rng.choice(["mask_short", "mask_long", "ids_long", "mask_empty"])
    if how == "mask_short":
        del d["response_mask"][rng.randrange(len(d["response_mask"]))]
    elif how == "mask_long":
        d["response_mask"].extend([rng.choice([0, 1])] * rng.randint(1, 5))
    elif how == "ids_long":
        d["response_ids"].append(rng.randint(0, 1000))
    else:
        d["response_mask"] = []
    return Case(f"mask_length:{how}", _dump(d), "response_mask")


def c_step_span(rng, tag):
    d = _fresh(rng, tag)
    total = len(d["prompt_ids"]) + len(d["response_ids"])
    s = rng.choice(d["steps"])
    how = rng.choice(["negative_start", "end_before_start", "past_end", "both_past"])
    if how == "negative_start":
        s["start"] = -rng.randint(1, 10**6)
    elif how == "end_before_start":
        s["start"], s["end"] = s["end"] + 1, s["end"]
    elif how == "past_end":
        s["end"] = total + rng.randint(1, 10**6)
    else:
        s["start"], s["end"] = total + 5, total + 10
    return Case(f"step_span:{how}", _dump(d), "span")


BAD_UTF8 = [b"\xff", b"\xfe\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xf4\x90\x80\x80"]


def c_utf8(rng, tag):
    d = _fresh(rng, tag)
    path = _where_str(d, rng)
    marker = "@@UTF8@@"
    _set(d, path, "ab" + marker + "cd")
    raw = _dump(d).replace(marker.encode(), rng.choice(BAD_UTF8))
    return Case("utf8", raw, "UTF-8")


SURROGATES = ["\ud800", "\udfff", "\udc00x", "x\ud83d", "\ude00\ud83d", "\udbff"]


def c_surrogate(rng, tag):
    d = _fresh(rng, tag)
    s = rng.choice(SURROGATES)
    how = rng.choice(["value", "value", "key", "deep"])
    if how == "value":
        path = _where_str(d, rng)
        _set(d, path, "before " + s + " after")
    elif how == "key":
        d["metadata"]["k" + s] = 1
    else:
        _set(d, _where_any(d, rng), {"a": [{"b": s}]})
    return Case(f"surrogate:{how}", _dump(d, ascii_only=True), "surrogate")


def c_nonfinite(rng, tag):
    d = _fresh(rng, tag)
    v = rng.choice([math.nan, math.inf, -math.inf])
    how = rng.choice(["duration", "started_at", "logprobs", "anywhere", "prompt_ids", "response_mask", "tool_result"])
    if how == "duration":
        rng.choice(d["steps"])["duration_s"] = v
    elif how == "started_at":
        rng.choice(d["steps"])["started_at"] = v
    elif how == "logprobs":
        rng.choice(d["steps"])["logprobs"] = [-0.1, v]
    elif how == "prompt_ids":
        d["prompt_ids"][rng.randrange(len(d["prompt_ids"]))] = v
    elif how == "response_mask":
        d["response_mask"][rng.randrange(len(d["response_mask"]))] = v
    elif how == "tool_result":
        d["steps"][-1]["tool_results"] = [{"name": "f", "content": "x", "duration_s": v}]
    else:
        _set(d, _where_any(d, rng), {"score": v})
    raw = json.dumps(d, ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode()
    return Case(f"nonfinite:{how}", raw, "NaN")


def c_deep(rng, tag):
    d = _fresh(rng, tag)
    depth = rng.choice([MAX_JSON_DEPTH, MAX_JSON_DEPTH + 20, 300, 900, 5_000, 100_000])
    where = _where_any(d, rng)
    # the nested value sits ``len(where)`` levels below the record (which is level 1), so its
    # innermost container is at record level len(where) + depth: always past the limit here
    assert len(where) + depth > MAX_JSON_DEPTH
    marker = "@@DEEP@@"
    _set(d, where, marker)
    raw = _dump(d).replace(f'"{marker}"'.encode(), b"[" * depth + b"1" + b"]" * depth)
    return Case(f"deep:{depth}", raw, "nested")


def c_bigint(rng, tag):
    d = _fresh(rng, tag)
    digits = rng.choice([4_301, 5_000, 20_000])
    big = b"9" * digits
    how = rng.choice(["prompt_ids", "response_ids", "step_start", "metadata", "format_version"])
    marker = "@@BIG@@"
    if how in ("prompt_ids", "response_ids"):
        d[how][rng.randrange(len(d[how]))] = marker
    elif how == "step_start":
        rng.choice(d["steps"])["start"] = marker
    elif how == "metadata":
        d["metadata"]["n"] = marker
    else:
        d["format_version"] = marker
    raw = _dump(d).replace(f'"{marker}"'.encode(), (b"-" if rng.random() < 0.3 else b"") + big)
    return Case(f"bigint:{how}", raw, "digits")


def c_not_object(rng, tag):
    v = rng.choice([[], [1, 2], 42, -1.5, '"a string"', "null", "true", "false", "list-of-trace"])
    if v == "list-of-trace":
        return Case("not_object:list", _dump([_fresh(rng, tag)]), "object")
    raw = v.encode() if isinstance(v, str) else _dump(v)
    return Case("not_object", raw, "object")


def c_foreign(rng, tag):
    d = _fresh(rng, tag)
    v = rng.choice([
        {},
        {"messages": d["messages"]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"prompt_ids": d["prompt_ids"], "response_ids": d["response_ids"], "response_mask": d["response_mask"]},
        {"request": {"messages": d["messages"]}, "response": {"choices": []}},
        {"items": [{"role": "user", "content": "hi"}]},
        {"hello": "world"},
    ])
    return Case("foreign", _dump(v), "trace")


def c_version(rng, tag):
    d = _fresh(rng, tag)
    d["format_version"] = rng.choice([2, 3, 99, 10**9, 0, -1])
    return Case("version", _dump(d), "version")


def c_garbage(rng, tag):
    d = _fresh(rng, tag)
    raw = _dump(d)
    how = rng.choice(["trailing", "two_records", "leading", "control_char", "nul", "single_quotes", "comment"])
    if how == "trailing":
        raw += rng.choice([b"x", b",", b"}", b"]", b" true"])
    elif how == "two_records":
        raw += _dump(_fresh(rng, tag + "-b"))
    elif how == "leading":
        raw = rng.choice([b"x", b",", b"data: ", b"'"]) + raw
    elif how == "control_char":
        raw = raw.replace(b'"role":"user","content":"', b'"role":"user","content":"\x01', 1) if b'"role":"user","content":"' in raw else raw[:-1] + b',"x":"\x1f"}'
    elif how == "nul":
        raw = raw[:-1] + b',"x":"a\x00b"}'
    elif how == "single_quotes":
        raw = raw.replace(b'"format_version"', b"'format_version'", 1)
    else:
        raw = b"// a comment\t" + raw
    return Case(f"garbage:{how}", raw, "invalid JSON")


def c_too_long(rng, tag):
    d = _fresh(rng, tag)
    d["metadata"]["padding"] = "x" * (LINE_LIMIT + LINE_LIMIT // 2)
    return Case("too_long", _dump(d), "longer than")


# weights: how many of the N_BAD lines each category gets (before rounding)
CATEGORIES = [
    (c_truncated, 120), (c_wrong_type, 250), (c_wrong_element, 90), (c_missing, 80), (c_token_id, 50), (c_mask_value, 30),
    (c_mask_length, 30), (c_step_span, 40), (c_utf8, 50), (c_surrogate, 50), (c_nonfinite, 50), (c_deep, 30), (c_bigint, 30),
    (c_not_object, 20), (c_foreign, 20), (c_version, 15), (c_garbage, 40), (c_too_long, 5),
]
assert sum(w for _, w in CATEGORIES) == N_BAD


# ---- good lines ------------------------------------------------------------------------------------


def good_variant(rng: random.Random, tag: str, k: int) -> Case:
    d = _fresh(rng, tag)
    how = k % 10
    if how == 1:
        d["messages"][0]["content"] = "naïve café 🤖 \u2028 עברית \u0000 \t end"
    elif how == 2:
        d["extra_top_level"] = {"from": "a newer version", "n": [1, 2.5, None]}
        d["steps"][0]["extra_step_key"] = True
    elif how == 3:
        for s in d["steps"]:
            if s["state"] == "generating":
                s["logprobs"] = [-0.25] * (s["end"] - s["start"] - 1) + ["-Infinity"]
    elif how == 4:
        d["metadata"]["deep"] = _nested(MAX_JSON_DEPTH - 2)  # metadata is level 2: innermost at level 100
        assert 1 + _depth(d["metadata"]) == MAX_JSON_DEPTH
    elif how == 5:
        d["prompt_ids"][0] = MAX_TOKEN_ID
        d["prompt_ids"][1] = 0
    elif how == 6:
        d = {"format_version": 1, "id": tag}  # minimal: every other field has a default
    elif how == 7:
        d["metadata"]["big"] = 10**4000  # a long (but allowed) integer
        d["metadata"]["f"] = -1.5e308
    elif how == 8:
        d["metadata"]["escaped"] = "\ud83d\ude00 (a valid surrogate pair)"
        return Case("good", _dump(d, ascii_only=True), "", d)
    return Case("good", _dump(d), "", d)


# ---- the mixed file ------------------------------------------------------------------------------


@dataclass
class Mixed:
    path: Path
    good: list[tuple[int, dict[str, Any]]]  # (line, record)
    bad: dict[int, Case]  # line -> case
    n_lines: int


def build_mixed(path: Path, seed: int = SEED) -> Mixed:
    rng = random.Random(seed)
    bad_cases: list[Case] = []
    n = 0
    for fn, weight in CATEGORIES:
        for _ in range(weight):
            bad_cases.append(fn(rng, f"bad-{n:04d}"))
            n += 1
    good_cases = [good_variant(rng, f"good-{i:04d}", i) for i in range(N_GOOD)]
    rows: list[Case | None] = [*bad_cases, *good_cases[1:], *([None] * N_BLANK)]
    rng.shuffle(rows)
    rows.insert(0, good_cases[0])  # the first line is good: the binary sniff looks at the first 4 KB
    # the last line: a truncated record with no newline at all
    tail = Case("truncated:eof", _dump(_fresh(rng, "bad-eof"))[:-7], "invalid JSON")
    rows.append(tail)
    good: list[tuple[int, dict[str, Any]]] = []
    bad: dict[int, Case] = {}
    with open(path, "wb") as f:
        for lineno, c in enumerate(rows, start=1):
            if c is None:
                f.write(rng.choice([b"", b"   ", b"\t", b"\r"]) + b"\n")
                continue
            end = b"\r\n" if rng.random() < 0.1 else b"\n"
            f.write(c.raw + (b"" if c is tail else end))
            if c.good is not None:
                good.append((lineno, c.good))
            else:
                bad[lineno] = c
    return Mixed(path, good, bad, len(rows))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Mixed:
    m = build_mixed(tmp_path_factory.mktemp("corrupt") / "mixed.jsonl")
    assert len(m.bad) == N_BAD + 1 and len(m.good) == N_GOOD
    return m


@pytest.fixture
def line_limit(monkeypatch):
    """The line limit for in-process entry points that take no parameter (read at call time)."""
    monkeypatch.setattr(trace_mod, "DEFAULT_MAX_LINE_BYTES", LINE_LIMIT)


# ---- checks ----------------------------------------------------------------------------------------

_REPR = re.compile(r"Traceback|File \"|<class |object at 0x|\w+Error\(|\\n|NoneType")


def check_reason(reason: str, case: Case | None = None) -> None:
    assert isinstance(reason, str) and reason.strip(), "empty reason"
    assert "\n" not in reason, f"reason spans lines: {reason!r}"
    assert not _REPR.search(reason), f"reason looks like a Python repr: {reason!r}"
    assert len(reason) <= 600, f"reason too long ({len(reason)} chars): {reason[:200]!r}"
    assert " at at " not in reason, reason
    if case is not None:
        assert case.expect.lower() in reason.lower(), f"{case.category}: expected {case.expect!r} in {reason!r}"


def check_good(t: Trace, rec: dict[str, Any]) -> None:
    assert t.id == rec["id"]
    for k in ("prompt_ids", "response_ids", "response_mask", "messages", "tools"):
        assert getattr(t, k) == rec.get(k, []), k


def check_result(res: LoadResult, m: Mixed) -> None:
    """Every good line kept (order, ids, line numbers), every bad line reported once with a reason."""
    assert res.lines == [ln for ln, _ in m.good]
    assert len(res.traces) == len(m.good)
    for t, (_, rec) in zip(res.traces, m.good):
        check_good(t, rec)
    got = {p.line: p.reason for p in res.problems}
    assert len(got) == len(res.problems), "a line reported twice"
    missing = sorted(set(m.bad) - set(got))
    extra = sorted(set(got) - set(m.bad))
    assert not missing, f"bad lines not reported: {[(ln, m.bad[ln].category) for ln in missing[:10]]}"
    assert not extra, f"good/blank lines reported: {[(ln, got[ln]) for ln in extra[:10]]}"
    for ln, reason in got.items():
        check_reason(reason, m.bad[ln])


# ---- entry points: load_traces / load_any ------------------------------------------------------------


def test_generator_is_deterministic_and_covers_every_category(mixed, tmp_path):
    again = build_mixed(tmp_path / "again.jsonl")
    assert again.path.read_bytes() == mixed.path.read_bytes()
    cats = {c.category.split(":")[0] for c in mixed.bad.values()}
    assert cats >= {fn.__name__[2:] for fn, _ in CATEGORIES}
    kinds = {c.category.split(":")[1] for c in mixed.bad.values() if c.category.startswith("wrong_type:")}
    assert kinds >= {"int", "str", "float", "bool", "list", "dict", "state", "bit?", "span?", "str?", "int?", "float?"}


def test_load_traces_keeps_every_good_line_and_reports_every_bad_one(mixed):
    check_result(load_traces(str(mixed.path), max_line_bytes=LINE_LIMIT), mixed)


def test_load_traces_reads_the_line_limit_at_call_time(mixed, line_limit):
    check_result(load_traces(str(mixed.path)), mixed)


@pytest.mark.parametrize("suffix", [".jsonl", ".txt", ".csv", ".json", ""])
def test_load_any_under_any_name(mixed, line_limit, tmp_path, suffix):
    p = tmp_path / f"traces{suffix}"
    p.write_bytes(mixed.path.read_bytes())
    check_result(load_any(str(p)), Mixed(p, mixed.good, mixed.bad, mixed.n_lines))


def test_round_trip_of_every_good_trace(mixed, tmp_path):
    res = load_traces(str(mixed.path), max_line_bytes=LINE_LIMIT)
    out = tmp_path / "round.jsonl"
    assert write_jsonl(res.traces, str(out)) == N_GOOD
    back = load_traces(str(out))
    assert not back.problems
    assert back.traces == res.traces
    assert back.lines == list(range(1, N_GOOD + 1))
    # and once more: the written form is stable
    out2 = tmp_path / "round2.jsonl"
    write_jsonl(back.traces, str(out2))
    assert out2.read_bytes() == out.read_bytes()
    # -Infinity logprobs come back as -inf floats, not strings
    lp = [s.logprobs for t in back.traces for s in t.steps if s.logprobs]
    assert lp and all(x[-1] == -math.inf for x in lp)


def test_each_bad_line_alone_is_refused_by_trace_from_json(mixed):
    """The record-level API: every bad line that fits the limit raises TraceFormatError (never
    anything else) with the reason load_traces gives; every good one loads."""
    full = {p.line: p.reason for p in load_traces(str(mixed.path), max_line_bytes=LINE_LIMIT).problems}
    for ln, c in mixed.bad.items():
        if c.category == "too_long":
            continue
        with pytest.raises(TraceFormatError) as ei:
            Trace.from_json(c.raw)
        assert str(ei.value) == full[ln], (ln, c.category)
    lines = mixed.path.read_bytes().split(b"\n")
    for ln, rec in mixed.good:
        assert Trace.from_json(lines[ln - 1]).id == rec["id"]


# ---- entry point: the trace index -------------------------------------------------------------------


def test_trace_index_scan_and_open_every_row(mixed, line_limit):
    table = TraceIndex.build([str(mixed.path)])
    scanned = {p.line: p.reason for p in table.problems}
    for ln, reason in scanned.items():
        assert ln in mixed.bad, f"good line {ln} refused by the scan: {reason}"
        check_reason(reason)
    good_lines = {ln: rec for ln, rec in mixed.good}
    opened_good: list[int] = []
    refused_on_open: dict[int, str] = {}
    for i in range(len(table)):
        ln = int(table.df.at[i, "line"])
        if ln in good_lines:
            t = table.open(i)
            check_good(t, good_lines[ln])
            opened_good.append(ln)
            assert table.df.at[i, "id"] == good_lines[ln]["id"]
            assert int(table.df.at[i, "tokens"]) == len(t.prompt_ids) + len(t.response_ids)
        else:
            assert ln in mixed.bad, f"row for line {ln}, which is neither good nor bad"
            with pytest.raises(TraceFormatError) as ei:
                table.open(i)
            msg = str(ei.value)
            assert msg.startswith(f"line {ln}: "), msg
            refused_on_open[ln] = msg[len(f"line {ln}: "):]
    assert opened_good == [ln for ln, _ in mixed.good]
    assert not set(scanned) & set(refused_on_open)
    assert set(scanned) | set(refused_on_open) == set(mixed.bad)
    # the reason for a line is the same whichever way it was found
    full = {p.line: p.reason for p in load_traces(str(mixed.path), max_line_bytes=LINE_LIMIT).problems}
    for ln, reason in refused_on_open.items():
        check_reason(reason, mixed.bad[ln])
        assert reason == full[ln]


def test_trace_index_of_a_json_named_jsonl_file(mixed, line_limit, tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(mixed.path.read_bytes())
    table = TraceIndex.build([str(p)], validate=True)  # as the Trace files tab builds it
    assert list(table.df["line"]) == [ln for ln, _ in mixed.good]
    assert {pr.line for pr in table.problems} == set(mixed.bad)
    assert table.open(len(table) - 1).id == mixed.good[-1][1]["id"]


# ---- entry point: the command line ----------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """In this process, unless ENV sets a limit that is read when the process starts
    (backend/trace/limits.py reads the line and file limits at import): then a process of its own."""
    if not env:
        return run_cli(*args)
    e = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=e)


LIMIT_ENV = {"ALI_MAX_TRACE_LINE_BYTES": str(LINE_LIMIT)}


def test_cli_check_lists_every_bad_line(mixed):
    p = cli("check", str(mixed.path), "--no-tokens", "--json", env=LIMIT_ENV)
    assert p.returncode == 1, p.stderr  # bad records: every trace checked, the exit status says some were not traces
    out = json.loads(p.stdout)
    assert [t["id"] for t in out["traces"]] == [rec["id"] for _, rec in mixed.good]
    got = {x["line"]: x["reason"] for x in out["problems"]}
    assert set(got) == set(mixed.bad)
    for ln, reason in got.items():
        check_reason(reason, mixed.bad[ln])
    text = cli("check", str(mixed.path), "--no-tokens", env=LIMIT_ENV)
    assert text.returncode == 1
    problem_lines = [ln for ln in text.stdout.splitlines() if re.match(r"line \d+: not a trace: ", ln)]
    assert len(problem_lines) == len(mixed.bad)


def test_cli_import_passes_good_traces_through_and_reports_bad_lines(mixed, tmp_path):
    out = tmp_path / "imported.jsonl"
    p = cli("import", str(mixed.path), "--out", str(out), "--json", env=LIMIT_ENV)
    assert p.returncode == 1, p.stderr  # bad records: the good ones written, the exit status says some were not
    summary = json.loads(p.stdout)
    got = {x["line"]: x["reason"] for x in summary["problems"]}
    res = load_traces(str(out))
    assert not res.problems
    ours = [t for t in res.traces if t.metadata.get("import") is None]
    assert [t.id for t in ours] == [rec["id"] for _, rec in mixed.good]
    for t, (_, rec) in zip(ours, mixed.good):
        check_good(t, rec)
    # records without our format_version key are other tools' data to the importer: some of
    # them (a bare {"messages"}, verl-style id lists) are imported as such, the rest reported
    imported = {t.metadata["import"]["line"] for t in res.traces if t.metadata.get("import")}
    for ln in imported:
        assert mixed.bad[ln].category.startswith(("missing:format_version", "missing:id+format_version", "foreign")), mixed.bad[ln].category
    assert set(got) | imported == set(mixed.bad) and not set(got) & imported
    for ln, reason in got.items():
        check_reason(reason)
        if mixed.bad[ln].category.split(":")[0] not in ("foreign", "missing"):
            check_reason(reason, mixed.bad[ln])


# ---- entry point: the Trace files tab's upload handler ----------------------------------------------


@pytest.fixture(scope="module")
def ui_ctx():
    from ui.context import AppContext, load_samples

    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


def ui_load(ctx, path):
    from ui import trace_files
    from ui.context import new_session

    sess = new_session(ctx)
    status, probs = trace_files.load_file(ctx, sess, str(path))
    return sess, status, probs


def test_ui_loader_keeps_good_and_lists_bad(mixed, line_limit, ui_ctx):
    from ui import trace_files

    sess, status, probs = ui_load(ui_ctx, mixed.path)
    assert f"{N_GOOD} trace(s) loaded" in status and f"{N_BAD + 1} bad record(s)" in status
    got = [trace_files.file_trace(sess, i) for i in range(len(sess.file_traces))]
    assert [t.id for t in got] == [rec["id"] for _, rec in mixed.good]
    for t, (_, rec) in zip(got, mixed.good):
        check_good(t, rec)
    assert list(probs["line"]) == sorted(mixed.bad)
    for ln, reason in zip(probs["line"], probs["problem"]):
        check_reason(reason, mixed.bad[int(ln)])
    assert sess.file_problems == [(int(a), b) for a, b in zip(probs["line"], probs["problem"])]
    # the table the tab shows next lists exactly the good traces
    from ui import trace_files

    df = trace_files.table_outputs(sess)[2]
    assert list(df["id"]) == [rec["id"] for _, rec in mixed.good]


# ---- file-level problems, through every entry point ----------------------------------------------------


def _file_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, word the refusal must contain)."""
    rng = random.Random(SEED + 1)
    good = (SAMPLE_DIR / "01_weather.jsonl").read_bytes()
    cases: dict[str, tuple[Path, str]] = {}

    def add(name: str, data: bytes, expect: str) -> None:
        p = tmp / name
        p.write_bytes(data)
        cases[name] = (p, expect)

    add("binary.jsonl", bytes(rng.randrange(256) for _ in range(20_000)) + b"\x00", "binary")
    add("png.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(rng.randrange(256) for _ in range(3000)), "binary")
    add("nul-first-line.jsonl", b'{"format_version":1,"id":"a\x00"}\n' + good, "binary")
    add("fake.parquet", good, "Parquet")
    add("empty-named.parquet", b"", "Parquet")
    add("truncated-parquet.parquet", b"PAR1" + bytes(rng.randrange(256) for _ in range(500)), "Parquet")
    return cases


def _json_parquet(tmp: Path) -> Path:
    """A real Parquet file that is not ours (another tool's rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp / "other.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), p)
    return p


def _refusals(path: Path, monkeypatch) -> dict[str, str]:
    """The refusal message of each entry point (a TraceFileError where it raises)."""
    from ui.context import AppContext

    out: dict[str, str] = {}
    for name, fn in (("load_traces", lambda: load_traces(str(path))), ("load_any", lambda: load_any(str(path))),
                     ("TraceIndex", lambda: TraceIndex.build([str(path)]))):
        if name == "load_traces" and path.suffix == ".parquet":
            continue  # load_traces reads our JSON/JSONL only; Parquet goes through load_any
        with pytest.raises(TraceFileError) as ei:
            fn()
        out[name] = str(ei.value)
    _, status, probs = ui_load(AppContext(), path)
    assert "Could not read" in status and probs.empty, status
    out["ui"] = status
    return out


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_unreadable_files_are_refused_everywhere_with_one_clear_line(tmp_path, monkeypatch):
    cases = _file_cases(tmp_path)
    cases["other.parquet"] = (_json_parquet(tmp_path), "not a trace Parquet file")
    for name, (path, expect) in cases.items():
        for where, msg in _refusals(path, monkeypatch).items():
            check_reason(msg.replace("\n", " ") if where == "ui" else msg)
            assert expect.lower() in msg.lower(), (name, where, msg)
            assert "Error:" not in msg and "Traceback" not in msg, (name, where, msg)
        for cmd in (["check", str(path), "--no-tokens"], ["import", str(path), "--out", str(tmp_path / "o.jsonl")]):
            if name == "other.parquet" and cmd[0] == "import":
                continue  # importing other tools' files is import's job: below
            p = cli(*cmd)
            assert p.returncode == 2, (name, cmd[0], p.returncode, p.stdout, p.stderr)
            err = p.stderr.strip()
            assert len(err.splitlines()) == 1 and expect.lower() in err.lower(), (name, cmd[0], err)
            check_reason(err)
    # import reads another tool's Parquet row by row: each row it cannot place is reported
    p = cli("import", str(cases["other.parquet"][0]), "--out", str(tmp_path / "o.jsonl"), "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["traces"] == 0  # no row could be imported
    assert [(x["row"], x["reason"]) for x in json.loads(p.stdout)["problems"]] == [
        (1, "unrecognised record (keys: a, b); pass --from to choose a format"),
        (2, "unrecognised record (keys: a, b); pass --from to choose a format")]


def test_binary_looking_bytes_after_the_first_4k_are_bad_lines_not_a_crash(tmp_path):
    rng = random.Random(SEED + 2)
    good = (SAMPLE_DIR / "01_weather.jsonl").read_bytes()
    junk = bytes(rng.randrange(1, 256) for _ in range(50_000))  # no NUL: not caught by the sniff
    p = tmp_path / "junk.jsonl"
    p.write_bytes(good + junk + b"\n" + good)
    res = load_traces(str(p))
    assert [t.id for t in res.traces] == ["sample-weather-seattle"] * 2
    n_lines = p.read_bytes().count(b"\n") + (0 if p.read_bytes().endswith(b"\n") else 1)
    assert res.lines == [1, n_lines]
    for pr in res.problems:
        assert 1 < pr.line < n_lines
        check_reason(pr.reason)
    table = TraceIndex.build([str(p)])
    assert list(table.df["line"]) == [1, n_lines]
    assert [pr.line for pr in table.problems] == [pr.line for pr in res.problems]


@pytest.mark.parametrize("content", [b"", b"\n\n\n", b"   \n\t\n", b"\xef\xbb\xbf", b"\r\n"])
def test_empty_files_load_nothing_and_say_so(tmp_path, ui_ctx, content):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(content)
    for res in (load_traces(str(p)), load_any(str(p))):
        assert not res.traces and not res.problems
    assert len(TraceIndex.build([str(p)])) == 0
    sess, status, probs = ui_load(ui_ctx, p)
    assert "0 trace(s) loaded" in status and probs.empty and sess.file_traces == []
    c = cli("check", str(p), "--no-tokens")
    assert c.returncode == 2 and "holds no traces (empty): nothing to check" in c.stderr


def test_byte_order_mark_is_ignored_everywhere(tmp_path, ui_ctx):
    """A file saved by an editor that writes a UTF-8 BOM (or files concatenated from such): each
    line's BOM is ignored by every reader, not only by the trace table's byte parser."""
    lines = [ln for ln in (SAMPLE_DIR / "02_parallel_calls.jsonl").read_bytes().splitlines() if ln.strip()]
    other = (SAMPLE_DIR / "01_weather.jsonl").read_bytes().strip()
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + lines[0] + b"\n" + b"\xef\xbb\xbf" + other + b"\n")
    want = [json.loads(lines[0])["id"], "sample-weather-seattle"]
    for res in (load_traces(str(p)), load_any(str(p))):
        assert [t.id for t in res.traces] == want and not res.problems
    table = TraceIndex.build([str(p)])
    assert [table.open(i).id for i in range(len(table))] == want and not table.problems
    from ui import trace_files

    sess, status, _ = ui_load(ui_ctx, p)
    assert [trace_files.file_trace(sess, i).id for i in range(len(sess.file_traces))] == want
    j = tmp_path / "bom.json"  # a JSON document with a BOM
    j.write_bytes(b"\xef\xbb\xbf[" + lines[0] + b",\n" + other + b"]")
    assert [t.id for t in load_any(str(j)).traces] == want
    assert [t.id for t in load_traces(str(j)).traces] == want


# ---- size limits ------------------------------------------------------------------------------------


def test_file_over_the_size_limit_is_refused_with_the_limit_and_the_setting(tmp_path, monkeypatch, ui_ctx):
    p = tmp_path / "big.jsonl"
    p.write_bytes((SAMPLE_DIR / "01_weather.jsonl").read_bytes() * 3)
    size = p.stat().st_size
    with pytest.raises(TraceFileError) as ei:
        load_traces(str(p), max_bytes=1000)
    msg = str(ei.value)
    # a small limit reads as what it is (not "0 MB")
    assert msg == f"big.jsonl is {size / 1e3:.1f} KB, over the 1.0 KB limit for trace files (set ALI_MAX_TRACE_FILE_BYTES to raise it)"
    with pytest.raises(TraceFileError, match=r"over the 999 bytes limit"):
        load_traces(str(p), max_bytes=999)
    monkeypatch.setattr(trace_mod, "DEFAULT_MAX_FILE_BYTES", 5000)
    for fn in (load_traces, load_any, lambda p: TraceIndex.build([p])):
        with pytest.raises(TraceFileError, match=r"over the 5\.0 KB limit .*ALI_MAX_TRACE_FILE_BYTES"):
            fn(str(p))
    _, status, _ = ui_load(ui_ctx, p)
    assert "Could not read big.jsonl" in status and "5.0 KB limit" in status
    monkeypatch.undo()
    # the app's own upload limit: the same kind of message, no exception class name
    from ui.context import AppContext

    _, status, _ = ui_load(AppContext(max_upload_bytes=2048), p)
    assert "Could not read big.jsonl" in status and "2.0 KB" in status and "Error" not in status
    for cmd in (["check", str(p), "--no-tokens"], ["import", str(p), "--out", str(tmp_path / "o.jsonl")], ["export", str(p), "--to", "jsonl", "--out", str(tmp_path / "e.jsonl")]):
        c = cli(*cmd, env={"ALI_MAX_TRACE_FILE_BYTES": "5000"})
        assert c.returncode == 2 and c.stdout == "", (cmd, c.stdout, c.stderr)
        assert c.stderr.strip().splitlines() == [f"error: big.jsonl is {size / 1e3:.1f} KB, over the 5.0 KB limit for trace files (set ALI_MAX_TRACE_FILE_BYTES to raise it)"] or (
            len(c.stderr.strip().splitlines()) == 1 and "over the 5.0 KB limit" in c.stderr), c.stderr


def test_a_50mb_line_is_skipped_with_bounded_memory(tmp_path, monkeypatch):
    """One 50 MB line between two good ones, with a 1 MiB line limit: reported as too long at its
    line number, skipped without being held in memory (tracemalloc peak far below 50 MB), and
    the good lines around it load. Through load_traces, load_any, the trace table and import."""
    good = (SAMPLE_DIR / "01_weather.jsonl").read_bytes().strip()
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as f:
        f.write(good + b"\n")
        f.write(b'{"format_version":1,"id":"huge","metadata":{"blob":"')
        chunk = b"A" * (1 << 20)
        written = 0
        while written < BIG_LINE_BYTES:
            f.write(chunk)
            written += len(chunk)
        f.write(b'"}}\n')
        f.write(good.replace(b"sample-weather-seattle", b"after-the-huge-line") + b"\n")
    assert p.stat().st_size > BIG_LINE_BYTES
    monkeypatch.setattr(trace_mod, "DEFAULT_MAX_LINE_BYTES", LINE_LIMIT)
    from backend.importers import import_file

    peaks: dict[str, int] = {}
    for name, fn in (("load_traces", lambda: load_traces(str(p))), ("load_any", lambda: load_any(str(p))),
                     ("TraceIndex", lambda: TraceIndex.build([str(p)])), ("import_file", lambda: import_file(str(p)))):
        tracemalloc.start()
        try:
            res = fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        peaks[name] = peak
        ids = list(res.df["id"]) if name == "TraceIndex" else [t.id for t in res.traces]
        assert ids == ["sample-weather-seattle", "after-the-huge-line"], name
        assert [(pr.line, pr.reason.split(" (")[0]) for pr in res.problems] == [(2, "line is longer than the 1.0 MB line limit")], name
        check_reason(res.problems[0].reason)
        assert peak < MEMORY_BOUND, f"{name}: tracemalloc peak {peak / 1e6:.1f} MB while skipping a 50 MB line"
    print("tracemalloc peaks (MB):", {k: round(v / 1e6, 2) for k, v in peaks.items()})
    c = cli("check", str(p), "--no-tokens", "--json", env=LIMIT_ENV)
    assert c.returncode == 1 and [x["line"] for x in json.loads(c.stdout)["problems"]] == [2]


# ---- Parquet files with damaged rows -----------------------------------------------------------------


def test_parquet_rows_with_bad_records(tmp_path, ui_ctx):
    """Our Parquet layout with damaged rows (bad JSON in a column, a token id out of range, a
    missing id): reported by row number; the good rows load, open from the table, and export."""
    import pyarrow.parquet as pq

    good = load_traces(str(SAMPLE_DIR / "02_parallel_calls.jsonl")).traces[0]
    p = tmp_path / "t.parquet"
    write_parquet([good.model_copy(update={"id": f"row-{i}"}) for i in range(5)], str(p))
    table = pq.read_table(p)
    rows = table.to_pylist()
    rows[1]["steps"] = "[{not json"
    rows[2]["prompt_ids"] = [-5, *rows[2]["prompt_ids"][1:]]
    rows[3]["id"] = None
    pq.write_table(table.from_pylist(rows, schema=table.schema), p)
    res = load_any(str(p))
    assert [t.id for t in res.traces] == ["row-0", "row-4"] and res.lines == [1, 5]
    assert [pr.line for pr in res.problems] == [2, 3, 4]
    for pr in res.problems:
        check_reason(pr.reason)
    assert "out of range" in res.problems[1].reason and "no id" in res.problems[2].reason
    tbl = TraceIndex.build([str(p)])
    assert [pr.line for pr in tbl.problems] == [2]  # the scan reads the JSON columns only
    opened = {}
    for i in range(len(tbl)):
        try:
            opened[int(tbl.df.at[i, "line"])] = tbl.open(i).id
        except TraceFormatError as e:
            opened[int(tbl.df.at[i, "line"])] = f"refused: {e}"
    assert opened[1] == "row-0" and opened[5] == "row-4"
    assert "out of range" in opened[3] and "no id" in opened[4]
    sess, status, probs = ui_load(ui_ctx, p)
    assert "2 trace(s) loaded" in status and list(probs["line"]) == [2, 3, 4]


# ---- regressions: what this suite found -------------------------------------------------------------


@pytest.mark.parametrize("path, value", [
    (("steps", 1, "index"), "1"), (("steps", 1, "start"), 260.0), (("steps", 1, "mask"), True), (("steps", 1, "mask"), 1.0),
    (("steps", 1, "duration_s"), "1.5"), (("steps", 1, "duration_s"), True), (("steps", 1, "started_at"), "now"),
    (("steps", 2, "tool_results", 0, "ok"), 1), (("steps", 2, "tool_results", 0, "truncated"), "false"),
    (("steps", 2, "tool_results", 0, "original_length"), "12"), (("steps", 1, "tool_calls", 0, "span"), [0.0, 5]),
    (("message_spans", 0, "start"), True), (("tokenizer", "eos_token_id"), "151645"), (("format_version",), True),
    (("format_version",), 0), (("format_version",), -1), (("steps", 1, "messages_added"), ["1"]),
])
def test_values_pydantic_would_coerce_are_refused(path, value):
    """Before: a file's ``"index": "1"``, ``"start": 260.0``, ``"mask": true``, ``"ok": 1`` ...
    were silently converted (pydantic's lax mode) and written back changed; format version 0 or
    -1 loaded. Now a record is validated strictly at the file boundary."""
    d = copy.deepcopy(next(b for b in BASES if b["id"] == "sample-parallel-calls"))
    _set(d, path, value)
    with pytest.raises(TraceFormatError) as ei:
        Trace.from_dict(d)
    check_reason(str(ei.value))
    assert str(path[0]) in str(ei.value) or "version" in str(ei.value)


def test_strict_reading_still_takes_what_our_writer_writes():
    """Spans are JSON lists, ints stand for floats, non-finite floats are the strings pydantic
    writes (``ser_json_inf_nan="strings"``): all read back."""
    d = copy.deepcopy(next(b for b in BASES if b["id"] == "sample-parallel-calls"))
    d["steps"][1]["duration_s"] = 2
    d["steps"][1]["started_at"] = 1767225600
    d["steps"][1]["logprobs"] = [-1, "-Infinity", "NaN", "Infinity"] + [-0.5] * (d["steps"][1]["end"] - d["steps"][1]["start"] - 4)
    t = Trace.from_dict(d)
    s = t.steps[1]
    assert s.duration_s == 2.0 and isinstance(s.duration_s, float) and s.logprobs[1] == -math.inf and math.isnan(s.logprobs[2])
    assert isinstance(s.tool_calls[0].span, tuple) if s.tool_calls and s.tool_calls[0].span else True
    again = Trace.from_json(t.to_json())
    assert again.steps[1].logprobs[:2] == [-1.0, -math.inf]


def test_importer_refuses_a_trace_record_without_id_and_passes_a_minimal_one(tmp_path):
    """Before: ``python -m backend import`` gave a trace line that lost its id a random id (and
    refused a minimal ``{"format_version", "id"}`` record as "unrecognised"), while load_traces
    refused the one and loaded the other."""
    from backend.importers import import_file, import_records

    d = copy.deepcopy(BASES[0])
    del d["id"]
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(d) + "\n" + json.dumps({"format_version": 1, "id": "minimal"}) + "\n")
    for res in (import_file(str(p)), load_any(str(p)), load_traces(str(p))):
        assert [t.id for t in res.traces] == ["minimal"]
        assert [pr.line for pr in res.problems] == [1] and "no id field" in res.problems[0].reason
    rec = import_records([d, {"format_version": 1, "id": "minimal"}])
    assert [t.id for t in rec.traces] == ["minimal"] and "no id field" in rec.problems[0].reason


@pytest.mark.parametrize("raw, reason", [
    (b"null", "a trace must be a JSON object, got null"),
    (b"[1]", "a trace must be a JSON object, got an array"),
    (b"3", "a trace must be a JSON object, got a number"),
    (b'{"format_version": 1, "id": "x", "prompt_ids": [' + b"7" * 5000 + b"]}", "invalid JSON: an integer literal of more than 4300 digits"),
    (b'{"format_version": 1, "id": "\xed\xa0\x80"}', "not valid UTF-8 at byte 30"),  # an encoded surrogate
    (b'{"format_version": 1, "id": "x"' + b"\xff}", "not valid UTF-8 at byte 32"),
    # a "]" inside a string of an id list broke the trace table's light parse: "invalid JSON"
    # (compact, as our writer writes: the light parse looks for '"prompt_ids":[')
    (b'{"format_version":1,"id":"x","prompt_ids":[1,"a]b"],"response_ids":[],"response_mask":[]}',
     'prompt_ids[1] is a string ("a]b"); token ids must be JSON integers'),
    (b'{"format_version":1,"id":"x","prompt_ids":[1,2],"response_ids":[5],"response_mask":[1,"]"]}',
     'response_mask[1] is a string ("]"); mask values must be JSON integers'),
])
def test_reasons_are_plain_words_and_the_same_in_every_reader(tmp_path, raw, reason):
    """Before: "got NoneType" (a Python class name), "use sys.set_int_max_str_digits()" (advice
    for programmers), and the trace table's scan worded (and for surrogate bytes, decided) its
    reasons differently from load_traces."""
    p = tmp_path / "one.jsonl"
    good = (SAMPLE_DIR / "01_weather.jsonl").read_bytes().strip()
    p.write_bytes(good + b"\n" + raw + b"\n")
    assert [(pr.line, pr.reason) for pr in load_traces(str(p)).problems] == [(2, reason)]
    table = TraceIndex.build([str(p)])
    found = [(pr.line, pr.reason) for pr in table.problems]
    for i in range(len(table)):
        try:
            table.open(i)
        except TraceFormatError as e:
            found.append((int(table.df.at[i, "line"]), str(e).split(": ", 1)[1]))
    assert found == [(2, reason)]
