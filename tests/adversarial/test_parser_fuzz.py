"""Fuzzing the tool-call parsers.

Two generators, both driven by a small randomness interface so the same code runs from a seeded
``random.Random`` (volume) and from Hypothesis draws (shrinking):

- **structured**: a text assembled from segments whose meaning is known — content, reasoning
  blocks, well-formed calls (arbitrary argument values: escaped quotes, braces and tags inside
  strings, huge numbers, unicode, lone surrogates, NUL, U+FFFD), and malformed calls (truncated,
  mutated, unbalanced, non-object, missing name, non-finite numbers, over-long integers, nesting
  past the recursion limit, junk after the JSON). Other formats' calls appear as content (mixed
  formats). Checked: every well-formed call comes back with its exact arguments, in order; each
  malformed call is covered by an error span; no error touches only good text; reasoning (and,
  where the format defines it exactly, content) is as built.
- **mutated**: a structured text then randomly cut, spliced, duplicated, and sprinkled with
  every format's tags and JSON punctuation. Checked: nothing raises, every span is in bounds
  with ``text[span] == raw``, calls have string names and object arguments, calls do not overlap,
  parsing is deterministic, and (where a call's text stands on its own, wrapped in its format's
  list or block where it needs one) each call's raw text parses back to the same call.

Every native format has its generator. Formats whose values are typed by the tools' schemas
(qwen3_xml, glm45) are parsed without tools here, so a value is the text written (a non-string
value as its JSON). Raw-text formats cannot hold their own closing tags in a value (the templates
do not escape), so their values leave exactly those tags out; JSON formats get every format's tags
inside strings.

Generated malformed calls avoid the documented ambiguities of the readers: text of the shape
``, {"name":`` inside a *malformed* element is where the list readers resynchronise; a qwen3_xml
value cut short and followed by a new call reads the new call as value text up to its
``<parameter=`` (the templates write values raw, so a value may hold ``<tool_call>``).
"""

from __future__ import annotations

import functools
import json
import keyword
import math
import os
import random
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.parsers import ParseResult, ToolCallParser, get_parser

NATIVE = ["hermes", "hunyuan", "llama3_json", "mistral", "harmony", "pythonic", "kimi_k2", "granite", "phi4_mini_json", "deepseek_v3", "deepseek_v31", "glm45", "qwen3_xml"]
SEEDED_PER_PARSER = 5_000  # structured cases per parser (seeded random)
MUTATED_PER_PARSER = 5_000  # mutated cases per parser (seeded random)
# The edit loop (scripts/test.sh --fast sets ALI_TEST_FAST=1) runs a fifth of each volume: the first
# fifth of each seeded stream (the cases CI starts with), of the Hypothesis examples and of the
# adapter cases; CI and a plain pytest run all of them.
FAST_SHARE = 5 if os.environ.get("ALI_TEST_FAST") == "1" else 1
MUTANTS_PER_BASE = 2  # mutated texts made from each generated one
HYPOTHESIS_EXAMPLES = 60  # per parser, shrinkable
ADAPTER_CASES = 1_000  # per adapter (vLLM, transformers): they are slow and not ours

# ---- randomness ---------------------------------------------------------------------------------


class Rand:
    """The few random operations the generators use, over ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def randint(self, a: int, b: int) -> int:
        return a + int(self.rng.random() * (b - a + 1))

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def choice(self, seq: Any) -> Any:
        return seq[self.randint(0, len(seq) - 1)]

    def shuffle(self, seq: list) -> None:
        for i in range(len(seq) - 1, 0, -1):
            j = self.randint(0, i)
            seq[i], seq[j] = seq[j], seq[i]


class HypoRand(Rand):
    """The same operations as Hypothesis draws (so failing cases shrink)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def randint(self, a: int, b: int) -> int:
        return self.data.draw(st.integers(a, b))

    def chance(self, p: float) -> bool:
        return self.data.draw(st.integers(0, 999)) < int(p * 1000)


# ---- values -------------------------------------------------------------------------------------

ALL_TAGS = [  # the first four formats' tags (what ``tags=True`` puts into strings)
    "<tool_call>", "</tool_call>", "<tool_calls>", "</tool_calls>", "<think>", "</think>", "<answer>",
    "</answer>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "[THINK]", "[/THINK]",
]
# The other formats' tags, written out here (not imported from the parsers: the tests state the formats).
H_START, H_END, H_CALL, H_RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
H_CHANNEL, H_MESSAGE, H_CONSTRAIN = "<|channel|>", "<|message|>", "<|constrain|>"
HARMONY_TAGS = [H_START, H_END, H_CALL, H_RETURN, H_CHANNEL, H_MESSAGE, H_CONSTRAIN]
Q_FUNC, Q_FUNC_END, Q_PARAM, Q_PARAM_END = "<function=", "</function>", "<parameter=", "</parameter>"
DS_CALLS_BEGIN, DS_CALLS_END = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
DS_CALL_BEGIN, DS_CALL_END = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>"
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"
DS_TAGS = [DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP]
G_KEY, G_KEY_END, G_VALUE, G_VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
PY_START, PY_END = "<|python_start|>", "<|python_end|>"
K_SECTION, K_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K_CALL, K_CALL_END, K_ARGS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
GRANITE_TAGS = ["<|tool_call|>", "<tool_call>"]
PHI_OPEN = "functools"
NEW_TAGS = [*HARMONY_TAGS, Q_FUNC, Q_FUNC_END, Q_PARAM, Q_PARAM_END, *DS_TAGS, G_KEY, G_KEY_END, G_VALUE, G_VALUE_END,
            PY_START, PY_END, K_SECTION, K_SECTION_END, K_CALL, K_CALL_END, K_ARGS, "<|tool_call|>", PHI_OPEN + "["]
EVERY_TAG = ALL_TAGS + NEW_TAGS
THINK = ["<think>", "</think>"]
# Tags plain text of a format must not hold (the first one opens a call: reasoning the template
# opened must not hold it either).
OWN_TAGS = {
    "hermes": ["<tool_call>", "<think>", "</think>"],
    "hunyuan": ["<tool_calls>", "<think>", "</think>", "<answer>", "</answer>"],
    "llama3_json": ["<|python_tag|>"],
    "mistral": ["[TOOL_CALLS]", "[THINK]", "[/THINK]"],
    "harmony": HARMONY_TAGS,
    "qwen3_xml": ["<tool_call>", "</tool_call>", Q_FUNC, *THINK],
    "deepseek_v3": [*DS_TAGS, *THINK],
    "deepseek_v31": [*DS_TAGS, *THINK],
    "glm45": ["<tool_call>", "</tool_call>", *THINK],
    "pythonic": [PY_START, PY_END],
    "kimi_k2": ["<|tool_call", *THINK],  # every Kimi tag starts so
    "granite": GRANITE_TAGS,
    "phi4_mini_json": [PHI_OPEN],
}
# What a value written raw cannot hold (the reader would end it there), per format.
VALUE_STOPS = {
    "harmony": (H_START, H_END, H_CALL, H_RETURN),  # a message body ends at them, JSON strings or not
    "qwen3_xml": (Q_PARAM_END, Q_PARAM, Q_FUNC_END),
    "glm45": (G_VALUE_END, G_KEY_END, "<tool_call>", "</tool_call>"),
}
# The tags strings of each new format's calls (and its reasoning) are drawn with.
VALUE_TAGS = {fmt: [t for t in EVERY_TAG if t not in VALUE_STOPS.get(fmt, ())]
              for fmt in ("harmony", "qwen3_xml", "deepseek_v3", "deepseek_v31", "glm45", "pythonic", "kimi_k2", "granite",
                          "phi4_mini_json")}
STR_PIECES = [
    # (only a high lone surrogate: a high one followed by a low one would be read back as one
    # character after \u escaping, which is JSON, not a parser bug)
    "a", "b", "Z", "q", "7", " ", "  ", "é", "中文", "😀", "\ufffd", "\x00", "\ud800",
    '"', '\\"', "\\", "\\\\", "{", "}", "[", "]", ",", ":", ";", "\n", "\t", "\r", "\u2028", "/", "'",
    "NaN", "1e999", "true", "null", '{"a": 1}', "助手：",
]
RESERVED_KEYS = {"name", "arguments", "parameters", "id"}


# ``tags``: False (no tag), True (:data:`ALL_TAGS`) or the tags to draw from.
Tags = bool | Sequence[str]


def rand_str(r: Rand, tags: Tags, max_pieces: int = 6) -> str:
    pieces = STR_PIECES + (ALL_TAGS if tags is True else list(tags) if tags else [])
    return "".join(r.choice(pieces) for _ in range(r.randint(0, max_pieces)))


def rand_key(r: Rand, tags: Tags) -> str:
    while True:
        k = r.choice(["city", "q", "x", "path", "k", "values", "opts"]) if r.chance(0.6) else rand_str(r, tags, 3)
        if k not in RESERVED_KEYS and "name" not in k:
            return k


def rand_scalar(r: Rand, tags: Tags) -> Any:
    k = r.randint(0, 9)
    if k == 0:
        return r.randint(-(10**6), 10**6)
    if k == 1:  # huge integers (under Python's 4300-digit conversion limit)
        return int("9" * r.randint(20, 400 if r.chance(0.95) else 4000)) * r.choice([1, -1])
    if k == 2:
        return r.choice([0.5, -2.25, 1e308, -1e-300, 5e-324, 3.141592653589793, 0.0])
    if k == 3:
        return r.choice([True, False, None])
    s = rand_str(r, tags)
    return s.replace("name", "nom") if not tags else s


def rand_value(r: Rand, depth: int, tags: Tags) -> Any:
    if depth <= 0 or r.chance(0.55):
        return rand_scalar(r, tags)
    if r.chance(0.5):
        return [rand_value(r, depth - 1, tags) for _ in range(r.randint(0, 3))]
    return {rand_key(r, tags): rand_value(r, depth - 1, tags) for _ in range(r.randint(0, 3))}


def rand_args(r: Rand, tags: Tags) -> dict[str, Any]:
    return {rand_key(r, tags): rand_value(r, 3, tags) for _ in range(r.randint(0, 3))}


def rand_name(r: Rand) -> str:
    return r.choice(["get_weather", "search", "run_code", "a", "f.g", "tool-1", "x_y_z", "读取"])


def dumps(r: Rand, value: Any) -> str:
    kw: dict[str, Any] = {"ensure_ascii": r.chance(0.3)}
    k = r.randint(0, 5)
    if k == 0:
        kw["indent"] = r.choice([0, 2])
    elif k == 1:
        kw["separators"] = (",", ":")
    return json.dumps(value, **kw)


def call_object_text(r: Rand, name: str, args: dict, arg_key: str = "arguments", call_id: str | None = None) -> str:
    """A call object as a model writes it: keys in any order, arguments sometimes as a JSON string."""
    items: list[tuple[str, Any]] = [("name", name), (arg_key, dumps(r, args) if r.chance(0.1) else args)]
    if call_id is not None:
        items.append(("id", call_id))
    r.shuffle(items)
    return dumps(r, dict(items))


# ---- what counts as a good call (the oracle) ------------------------------------------------------


def _reject_constant(s: str) -> Any:
    raise ValueError(s)


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(s)
    return v


def oracle_call(body: str, arg_keys: tuple[str, ...]) -> tuple[str, dict] | None:
    """``(name, arguments)`` if ``body`` is exactly one well-formed call object, else None."""
    try:
        v = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return None
    if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"].strip():
        return None
    key = next((k for k in arg_keys if k in v), None)
    args = v[key] if key else {}
    if isinstance(args, str):
        try:
            args = json.loads(args, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return v["name"], args


def strict_object(text: str) -> dict | None:
    """The object ``text`` is as strict JSON (whitespace around it, as the parsers skip it), else None."""
    try:
        v = json.loads(text.strip(), parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


RESYNC = re.compile(r'[,;]\s*\{\s*"(?:name|arguments|parameters|id)"\s*:')
MUTATION_CHARS = ["{", "}", "[", "]", '"', ":", ",", "\\", "x", "\n", "1", " ", "'", "NaN", "-"]


def ambiguous(text: str, context: str) -> bool:
    """True when a reader cannot tell where a malformed element ends: its start is a complete JSON
    value followed by text that, in ``context``, reads as the next thing (``]`` or ``,`` in a
    list; anything after a ``;``-separated call or after ``[ARGS]`` arguments, which is content),
    or, in a list, it opens a bracket that the next elements and the list's ``]`` would close into
    valid JSON (``[{bad}, {good}]``: the extra ``[`` swallows the good element)."""
    if context == "list" and text[:1] in ("]", ","):  # ends the list / is an empty element
        return True
    if context == "semi" and text[:1] == ";":
        return True
    if context == "list":
        follow = text + ', {"name": "z", "arguments": {}}]'
        try:
            _, end = json.JSONDecoder().raw_decode(follow)
            if end > len(text):
                return True
        except (ValueError, RecursionError):
            pass
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return False
    rest = text[end:].lstrip()
    if not rest:
        return False
    return context in ("semi", "args") or rest[0] in ",]"


def bad_body(r: Rand, arg_keys: tuple[str, ...], arg_key: str, allow_junk: bool = True, context: str = "block") -> tuple[str, str]:
    """A malformed call object: ``(text, kind)``. Never ends in whitespace, holds no tag, and is
    not :func:`ambiguous` in ``context`` ("block", "list", "semi" or "args")."""
    name = rand_name(r)
    good = call_object_text(r, name, rand_args(r, tags=False), arg_key)
    while True:
        kind = r.choice(["cut", "mutate", "mutate", "semantic", "semantic", "nonfinite", "deep", "junk"])
        if kind == "junk" and not allow_junk:
            continue
        if kind == "cut":
            text = good[: r.randint(1, len(good) - 1)].rstrip()
        elif kind == "mutate":
            chars = list(good)
            for _ in range(r.randint(1, 3)):
                op = r.randint(0, 2)
                pos = r.randint(0, len(chars) - 1) if chars else 0
                if op == 0 and chars:
                    del chars[pos]
                elif op == 1:
                    chars.insert(pos, r.choice(MUTATION_CHARS))
                elif chars:
                    chars[pos] = r.choice(MUTATION_CHARS)
            text = "".join(chars).strip()
        elif kind == "semantic":
            a = dumps(r, rand_args(r, tags=False))
            text = r.choice([
                f"[{json.dumps(name)}, {a}]", json.dumps(name), "42", "null", "{}", f'{{"{arg_key}": {a}}}',
                f'{{"name": 7, "{arg_key}": {a}}}', f'{{"name": "", "{arg_key}": {a}}}', f'{{"name": "  ", "{arg_key}": {a}}}',
                f'{{"name": "{name}", "{arg_key}": [1, 2]}}', f'{{"name": "{name}", "{arg_key}": 3}}',
                f'{{"name": "{name}", "{arg_key}": null}}', f'{{"name": "{name}", "{arg_key}": "[1]"}}',
                f'{{"name": "{name}", "{arg_key}": "not json"}}', f'{{"name": "{name}", "{arg_key}": true}}',
                f"{{'name': '{name}', '{arg_key}': {{}}}}",
            ])
        elif kind == "nonfinite":
            lit = r.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000])
            text = f'{{"name": "{name}", "{arg_key}": {{"v": [1, {lit}]}}}}'
            if r.chance(0.3):
                text = f'{{"name": "{name}", "{arg_key}": {json.dumps(json.dumps({"v": 1})[:-1] + ", " + json.dumps("w")[:-1] + chr(34) + ": " + lit + "}")}}}'
        elif kind == "deep":
            # deeper than any recursion limit in use (Hypothesis raises it while running a test)
            d = 100_000 if r.chance(0.05) else 6000
            text = f'{{"name": "{name}", "{arg_key}": {{"v": {"[" * d}{"]" * d}}}}}'
        else:  # junk after a complete object
            text = good + r.choice(["}", "]", " x", '"', " {}"])
        text = text.strip()
        if not text or RESYNC.search(text):
            continue
        if kind in ("cut", "mutate", "junk") and (oracle_call(text, arg_keys) is not None or ambiguous(text, context)):
            continue
        if context == "list" and kind in ("cut", "mutate") and _ends_in_string(text):
            # a list element left inside a string: the list's ']', the next tag and a broken element after it
            # can close that string into one valid object (seen: '{"' then ']<|tool_call|>[{arguments":{},
            # "name":"get_weather"}' read as a call), which this generator cannot foresee
            continue
        if any(t in text for t in ALL_TAGS):
            continue
        return text, kind


def _ends_in_string(text: str) -> bool:
    """Whether a JSON scanner reading ``text`` would still be inside a string at its end."""
    inside = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and inside:
            escaped = True
        elif ch == '"':
            inside = not inside
    return inside


CONTENT_PIECES = [
    "Sure", ", ", "I will check.", " ", "\n", "\n\n", "é中😀", "\ufffd", "\x00", "\ud800", '"quoted"',
    "{", "}", "[", "]", "{}", '{"a": 1}', ";", "<tool_ca", "</tool_cal", "<thin", "[TOOL_CALL", "<|python_ta",
    "</tool_call>", "</tool_calls>", "[ARGS]", "助手：",
    '<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>',
    '<tool_calls>[{"name": "h", "arguments": {}}]</tool_calls>',
    '[TOOL_CALLS] [{"name": "h", "arguments": {}}]', '[TOOL_CALLS]h[ARGS]{"x": 1}',
    '<|python_tag|>{"name": "h", "parameters": {}}', "<answer>", "[THINK]x[/THINK]", "<think>x</think>",
    # the other formats' calls and tag fragments (mixed formats)
    f'{H_CHANNEL}commentary to=functions.h {H_CONSTRAIN}json{H_MESSAGE}{{}}{H_CALL}', "<|chan", "to=functions.h",
    f"<tool_call>\n{Q_FUNC}h>\n{Q_PARAM}x>\n1\n{Q_PARAM_END}\n{Q_FUNC_END}\n</tool_call>", "<parameter=", "</function>",
    f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}h{DS_SEP}{{}}{DS_CALL_END}{DS_CALLS_END}", DS_CALL_BEGIN[:5], "```json\n",
    f"<tool_call>h\n{G_KEY}x{G_KEY_END}\n{G_VALUE}1{G_VALUE_END}\n</tool_call>", "<arg_k", G_VALUE_END,
    f"{PY_START}[h(x=1)]{PY_END}", "h(x=1)", "(", ")", "=",
    f"{K_SECTION}{K_CALL}functions.h:0{K_ARGS}{{}}{K_CALL_END}{K_SECTION_END}", "<|tool_cal",
    '<|tool_call|>[{"name": "h", "arguments": {}}]', 'functools[{"name": "h", "arguments": {}}]', "functool",
]
# A pythonic text that starts so is a call list, not content.
PY_LIST_START = re.compile(r"\s*\[\s*[^\W\d]\w*(?:\s*\.\s*[^\W\d]\w*)*\s*\(")


def content_text(r: Rand, fmt: str, first: bool = False) -> str:
    """Plain text for ``fmt``: never one of its own tags; may hold other formats' calls. ``first``:
    it starts the text (pythonic reads a list there)."""
    own = OWN_TAGS[fmt]
    while True:
        s = "".join(r.choice(CONTENT_PIECES) for _ in range(r.randint(1, 5)))
        if fmt == "llama3_json":
            s = "Text " + s  # must not start with '{' (that would make it a call region)
        if fmt == "pythonic" and first and PY_LIST_START.match(s):
            continue
        if not any(t in s for t in own) and not any(t in s for t in ("</think>", "[/THINK]")):
            return s


def think_text(r: Rand, fmt: str, allow_calls: bool) -> str:
    close = "[/THINK]" if fmt == "mistral" else "</think>"
    opener = "[THINK]" if fmt == "mistral" else "<think>"
    while True:
        s = rand_str(r, tags=VALUE_TAGS.get(fmt, True) if allow_calls else False, max_pieces=5)
        if close in s or opener in s:
            continue
        if not allow_calls and OWN_TAGS[fmt][0] in s:
            continue
        if fmt == "hunyuan" and ("<answer>" in s or "</answer>" in s):
            continue
        return s


# ---- structured cases ---------------------------------------------------------------------------


@dataclass
class Case:
    fmt: str
    parts: list[str] = field(default_factory=list)
    pos: int = 0
    calls: list[tuple[str, dict, str | None]] = field(default_factory=list)
    bad: list[tuple[int, int, str]] = field(default_factory=list)
    reasoning: list[str] | None = None
    content: list[str] = field(default_factory=list)
    check_content: bool = True
    content_sep: str | None = None  # None: the pieces joined as they are; else each stripped, joined by it

    def add(self, s: str) -> tuple[int, int]:
        start = self.pos
        self.parts.append(s)
        self.pos += len(s)
        return start, self.pos

    def add_content(self, s: str) -> None:
        self.add(s)
        self.content.append(s)

    def add_bad(self, s: str, kind: str) -> None:
        a, b = self.add(s)
        self.bad.append((a, b, kind))

    def add_reasoning(self, s: str) -> None:
        if self.reasoning is None:
            self.reasoning = []
        self.reasoning.append(s.strip())

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def expected_reasoning(self) -> str | None:
        return None if self.reasoning is None else "\n\n".join(x for x in self.reasoning if x)

    def expected_content(self) -> str:
        if self.content_sep is None:
            return "".join(self.content).strip()
        return self.content_sep.join(x.strip() for x in self.content if x.strip())


def ws(r: Rand) -> str:
    return r.choice(["", "\n", "\n", " ", "\n\n", "\t"])


def big_args(r: Rand) -> dict:
    return {"blob": "x" * (1 << 20), "tail": rand_str(r, tags=True)}


def gen_hermes(r: Rand) -> Case:
    c = Case("hermes")
    if r.chance(0.15):  # template-opened think: only the closing tag is generated
        t = think_text(r, "hermes", allow_calls=False)
        c.add(t + "</think>")
        c.add_reasoning(t)
    n = r.randint(1, 6)
    ended = False
    for k in range(n):
        last = k == n - 1
        what = r.choice(["content", "think", "good", "good", "good", "bad", "bad", "end_bad", "unclosed_then_call"])
        if what == "content":
            c.add_content(content_text(r, "hermes"))
        elif what == "think":
            t = think_text(r, "hermes", allow_calls=True)
            c.add(f"<think>{t}</think>")
            c.add_reasoning(t)
        elif what == "good":
            name = rand_name(r)
            args = big_args(r) if r.chance(0.002) else rand_args(r, tags=True)
            body = call_object_text(r, name, args) if r.chance(0.95) else dumps(r, {"name": name})
            if "arguments" not in body:
                args = {}
            c.add(f"<tool_call>{ws(r)}{body}{ws(r)}</tool_call>")
            c.calls.append((name, args, None))
        elif what == "bad" or (what == "end_bad" and not last):
            body, kind = bad_body(r, ("arguments", "parameters"), "arguments")
            c.add_bad(f"<tool_call>{ws(r)}{body}{ws(r)}</tool_call>", kind)
        elif what == "end_bad":  # truncated generation: only at the very end
            name = rand_name(r)
            good = call_object_text(r, name, rand_args(r, tags=False))
            style = r.randint(0, 3)
            if style == 0:
                c.add_bad("<tool_call>", "tag only")
            elif style == 1:
                c.add_bad(f"<tool_call>{ws(r)}{good}{ws(r)}", "no closing tag")
            else:
                c.add_bad(f"<tool_call>{ws(r)}{good[: r.randint(1, len(good) - 1)]}", "cut at end")
            ended = True
            break
        else:  # an unclosed, cut call directly followed by a fresh well-formed call
            good = call_object_text(r, rand_name(r), rand_args(r, tags=False))
            cut = good[: r.randint(1, len(good) - 1)].rstrip()
            c.add_bad(f"<tool_call>{ws(r)}{cut}", "unclosed before next call")
            name = rand_name(r)
            args = rand_args(r, tags=True)
            c.add(f"<tool_call>\n{call_object_text(r, name, args)}\n</tool_call>")
            c.calls.append((name, args, None))
    if not ended and r.chance(0.1):
        t = think_text(r, "hermes", allow_calls=True)
        c.add("<think>" + t)  # truncated while thinking
        c.add_reasoning(t)
    return c


def _list_elements(r: Rand, c: Case, arg_keys: tuple[str, ...], arg_key: str, with_ids: bool, at_end: bool,
                   elements: list[str] | None = None) -> str:
    """Elements of a call list, added to ``c`` (and their texts to ``elements``); returns "cut"
    when the list was cut at the end."""
    elements = [] if elements is None else elements
    n = r.randint(0, 5)
    for k in range(n):
        if k:
            c.add(r.choice([", ", ",", ",\n", " , "]))
        roll = r.randint(0, 9)
        if roll < 6:
            name = rand_name(r)
            args = big_args(r) if r.chance(0.002) else rand_args(r, tags=True)
            cid = r.choice([None, "abc123XYZ", "call_1"]) if with_ids else None
            elements.append(call_object_text(r, name, args, arg_key, cid))
            c.add(elements[-1])
            c.calls.append((name, args, cid))
        elif roll < 9 or not at_end or k != n - 1:
            body, kind = bad_body(r, arg_keys, arg_key, context="list")
            elements.append(body)
            c.add_bad(body, kind)
        else:
            good = call_object_text(r, rand_name(r), rand_args(r, tags=False), arg_key)
            elements.append(good[: r.randint(1, len(good) - 1)].rstrip())
            c.add_bad(elements[-1], "cut element at end")
            return "cut"
    return "ok"


def gen_hunyuan(r: Rand) -> Case:
    c = Case("hunyuan")
    if r.chance(0.15):
        t = think_text(r, "hunyuan", allow_calls=False)
        c.add(t + "</think>")
        c.add_reasoning(t)
    n = r.randint(1, 5)
    for k in range(n):
        last = k == n - 1
        what = r.choice(["content", "think", "answer", "block", "block", "block", "bad_block", "end"])
        if what == "content":
            c.add_content(("助手：" if r.chance(0.3) else "") + content_text(r, "hunyuan"))
        elif what == "think":
            t = think_text(r, "hunyuan", allow_calls=True)
            c.add(f"<think>{t}</think>")
            c.add_reasoning(t)
        elif what == "answer":
            c.add(r.choice(["<answer>", "</answer>"]))
        elif what == "block" or (what == "end" and not last):
            c.add("<tool_calls>" + ws(r) + "[")
            _list_elements(r, c, ("arguments", "parameters"), "arguments", False, at_end=False)
            c.add("]" + ws(r) + "</tool_calls>")
        elif what == "bad_block":
            body, kind = r.choice([("{" + '"name": "f", "arguments": {}' + "}", "object not list"), ('"x"', "string not list"),
                                   ("", "empty block")])
            c.add_bad(f"<tool_calls>{ws(r)}{body}{ws(r)}</tool_calls>", kind)
        else:  # truncated at the end
            style = r.randint(0, 2)
            if style == 0:
                c.add_bad(r.choice(["<tool_calls>", "<tool_calls>["]), "tag only")
            elif style == 1:
                start = c.pos
                c.add("<tool_calls>[")
                if _list_elements(r, c, ("arguments", "parameters"), "arguments", False, at_end=True) == "ok":
                    c.add("]" if r.chance(0.5) else "")
                    c.bad.append((start, c.pos, "list without closing tag"))
            else:
                start = c.pos
                c.add("<tool_calls>[")
                c.add(call_object_text(r, "a", {}, "arguments"))
                c.calls.append(("a", {}, None))
                c.bad.append((start, c.pos, "list cut after an element"))
            break
    return c


def gen_llama(r: Rand) -> Case:
    c = Case("llama3_json")
    c.check_content = False
    tagged = r.chance(0.7)
    if tagged:
        if r.chance(0.5):
            c.add_content(content_text(r, "llama3_json"))
        tag_pos = c.pos
        c.add("<|python_tag|>" + ws(r))
        if r.chance(0.05):  # the error spans the tag and what follows it
            c.add(r.choice(['brave_search.call(query="x")', "", "print(1)"]))
            c.bad.append((tag_pos, c.pos, "not JSON after the tag"))
            return c
    n = r.randint(1, 5)
    last_good = False
    for k in range(n):
        if k:
            c.add(r.choice(["; ", ";", ";\n", " ; "]))
        roll = r.randint(0, 9)
        if roll < 6 or (k == 0 and not tagged):  # untagged text must start with a call
            name = rand_name(r)
            args = big_args(r) if r.chance(0.002) else rand_args(r, tags=True)
            key = r.choice(["parameters", "parameters", "arguments"])
            c.add(call_object_text(r, name, args, key))
            c.calls.append((name, args, None))
            last_good = True
        elif roll < 9 or k != n - 1:
            body, kind = bad_body(r, ("parameters", "arguments"), "parameters", allow_junk=False, context="semi")
            c.add_bad(body, kind)
            last_good = False
        else:
            good = call_object_text(r, rand_name(r), rand_args(r, tags=False), "parameters")
            c.add_bad(good[: r.randint(1, len(good) - 1)].rstrip(), "cut at end")
            return c
    if last_good and r.chance(0.3):
        c.add("\n\n" + content_text(r, "llama3_json"))
    return c


def gen_mistral(r: Rand) -> Case:
    c = Case("mistral")
    c.check_content = False
    if r.chance(0.2):
        t = think_text(r, "mistral", allow_calls=False)
        c.add(f"[THINK]{t}[/THINK]")
        c.add_reasoning(t)
    if r.chance(0.5):
        c.add_content(content_text(r, "mistral"))
    n = r.randint(1, 5)
    swallow = False  # after a malformed call, text up to the next [TOOL_CALLS] belongs to it
    for k in range(n):
        what = r.choice(["list", "args", "args", "bad_args", "content"])
        if what == "content" and not swallow:
            c.add_content(content_text(r, "mistral"))
            continue
        if what == "list":
            c.add("[TOOL_CALLS]" + r.choice(["", " "]) + "[")
            nb = len(c.bad)
            if _list_elements(r, c, ("arguments", "parameters"), "arguments", True, at_end=k == n - 1) == "cut":
                return c
            c.add("]")
            swallow = len(c.bad) > nb
        elif what in ("args", "content"):
            name = rand_name(r)
            args = rand_args(r, tags=True)
            cid = r.choice([None, None, "a1b2c3d4e"])
            c.add(f"[TOOL_CALLS]{name}" + (f"[CALL_ID]{cid}" if cid else "") + "[ARGS]" + dumps(r, args))
            c.calls.append((name, args, cid))
            swallow = False
        else:
            name = rand_name(r)
            style = r.randint(0, 3)
            if style == 0:
                body, kind = bad_body(r, ("arguments",), "arguments", allow_junk=False, context="args")
                v = None
                try:
                    v = json.loads(body)
                except (ValueError, RecursionError):
                    pass
                if isinstance(v, dict) and oracle_call(json.dumps({"name": name, "arguments": v}), ("arguments",)):
                    continue  # a valid object is good arguments here
                c.add_bad(f"[TOOL_CALLS]{name}[ARGS]{body}", "bad arguments: " + kind)
            elif style == 1:
                c.add_bad(f"[TOOL_CALLS]{name}[ARGS]" + r.choice(["[1, 2]", "3", "null", '"s"']), "arguments not an object")
            elif style == 2:
                c.add_bad(f"[TOOL_CALLS]{name}" + r.choice(["", "{}", " [1]"]), "no [ARGS]")
            else:
                c.add_bad("[TOOL_CALLS]" + r.choice(["[ARGS]{}", "", "[CALL_ID]x[ARGS]{}"]), "no name")
            swallow = True
    return c


# ---- the other native formats: shared pieces -------------------------------------------------------


@functools.cache
def writer(fmt: str) -> ToolCallParser:
    """The format's own parser, for its ``format_calls`` (the exact text a model emits)."""
    return get_parser(fmt)


def written(v: Any) -> str:
    """A value as the raw-text formats (qwen3_xml, glm45) write it and read it back without tools."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def format_args(r: Rand, fmt: str, key_ok: Callable[[str], bool] = lambda k: True) -> dict[str, Any]:
    """Arguments whose strings hold the format's allowed tags and none of its value stops, with
    only keys the format can write."""
    stops = VALUE_STOPS.get(fmt, ())
    while True:
        args = big_args(r) if r.chance(0.002) else rand_args(r, tags=VALUE_TAGS[fmt])
        args = {k: v for k, v in args.items() if key_ok(k)}
        if not any(t in json.dumps(args, ensure_ascii=False) for t in stops):
            return args


JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)


def ends_in_string(text: str) -> bool:
    """Whether ``text`` ends inside a JSON string: a reader decoding from the text (where a tag
    inside a string is string) would run on through the tags after it, up to the next quote."""
    return '"' in JSON_STRING.sub("", text)


def bad_object(r: Rand) -> tuple[str, str]:
    """Arguments that are not one strict JSON object: ``(text, kind)``; never blank, holds no tag,
    leaves no string open."""
    good = dumps(r, rand_args(r, tags=False))
    while True:
        kind = r.choice(["cut", "mutate", "mutate", "type", "nonfinite", "deep", "junk"])
        if kind == "cut":
            text = good[: r.randint(0, len(good) - 1)]
        elif kind == "mutate":
            chars = list(good)
            for _ in range(r.randint(1, 3)):
                pos = r.randint(0, len(chars) - 1) if chars else 0
                op = r.randint(0, 2)
                if op == 0 and chars:
                    del chars[pos]
                elif op == 1:
                    chars.insert(pos, r.choice(MUTATION_CHARS))
                elif chars:
                    chars[pos] = r.choice(MUTATION_CHARS)
            text = "".join(chars)
        elif kind == "type":
            text = r.choice(["[1, 2]", "3", "null", '"s"', "true", "[]", "{'a': 1}", "{a: 1}", '{"a" 1}', "{,}", "{} {}"])
        elif kind == "nonfinite":
            lit = r.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000])
            text = f'{{"v": [1, {lit}]}}'
        elif kind == "deep":
            d = 100_000 if r.chance(0.05) else 6000
            text = f'{{"v": {"[" * d}{"]" * d}}}'
        else:  # junk after a complete object
            text = good + r.choice(["}", "]", " x", '"', " {}", ","])
        if text.strip() and strict_object(text) is None and not ends_in_string(text) and not any(t in text for t in EVERY_TAG):
            return text, kind


def cut_text(r: Rand, text: str, at_least: int = 1) -> str:
    """``text`` cut short (at least ``at_least`` characters kept, at least one dropped)."""
    return text[: r.randint(at_least, len(text) - 1)]


def add_think(r: Rand, c: Case, opened_by_template: float = 0.15) -> None:
    """Reasoning whose ``<think>`` the chat template opened (only ``</think>`` is generated)."""
    if r.chance(opened_by_template):
        t = think_text(r, c.fmt, allow_calls=False)
        c.add(t + "</think>")
        c.add_reasoning(t)


def add_think_block(r: Rand, c: Case) -> None:
    t = think_text(r, c.fmt, allow_calls=True)
    c.add(f"<think>{t}</think>")
    c.add_reasoning(t)


def add_cut_think(r: Rand, c: Case) -> None:
    """Generation truncated while thinking: the reasoning runs to the end of the text."""
    if r.chance(0.1):
        t = think_text(r, c.fmt, allow_calls=True)
        c.add("<think>" + t)
        c.add_reasoning(t)


# ---- harmony ----------------------------------------------------------------------------------------


def harmony_header(r: Rand, recipient: str) -> str:
    """Every header form openai-harmony reads for a message to ``recipient``."""
    return r.choice([
        f"{H_CHANNEL}commentary to={recipient} {H_CONSTRAIN}json", f"{H_CHANNEL}commentary to={recipient}{H_CONSTRAIN}json",
        f" to={recipient}{H_CHANNEL}commentary json", f" to={recipient}{H_CHANNEL}commentary {H_CONSTRAIN}json",
        f"{H_CHANNEL}analysis to={recipient} code", f"{H_CHANNEL}commentary to={recipient}",
    ])


def gen_harmony(r: Rand) -> Case:
    """Messages: analysis (reasoning), final and preambles (content), calls to functions and to
    built-in tools; malformed arguments and headers, text between messages, a truncated header,
    a message that runs into the next one."""
    c = Case("harmony", content_sep="\n\n")
    n = r.randint(1, 6)
    open_body = False  # the previous message is not closed: only <|start|> may follow it
    for k in range(n):
        last = k == n - 1
        start = "" if k == 0 else H_START + "assistant"

        def end(tag: str) -> str:  # the last message may run to the end of the text (its EOS was stripped)
            return "" if last and r.chance(0.4) else tag

        what = r.choice(["analysis", "final", "preamble", "call", "call", "call", "call", "builtin", "bad_args", "bad_header",
                         "no_message", "junk", "cut", "unclosed"])
        if what == "junk" and open_body:
            what = "final"
        open_body = what == "unclosed" and not last
        if what == "analysis":
            body = content_text(r, "harmony")
            c.add(f"{start}{H_CHANNEL}analysis{H_MESSAGE}{body}{end(H_END)}")
            c.add_reasoning(body)
        elif what in ("final", "preamble"):
            body = content_text(r, "harmony")
            if what == "final":
                c.add(f"{start}{H_CHANNEL}final{H_MESSAGE}{body}{end(r.choice([H_END, H_RETURN]))}")
            else:
                c.add(f"{start}{H_CHANNEL}commentary{H_MESSAGE}{body}{end(H_END)}")
            c.content.append(body)
        elif what == "call":
            name = rand_name(r)
            args = format_args(r, "harmony")
            if r.chance(0.3):
                c.add(start + writer("harmony").format_calls([{"name": name, "arguments": args}]) + end(H_CALL))
            else:
                c.add(f"{start}{harmony_header(r, 'functions.' + name)}{H_MESSAGE}{ws(r)}{dumps(r, args)}{ws(r)}{end(H_CALL)}")
            c.calls.append((name, args, None))
        elif what == "builtin":
            if r.chance(0.3):  # python's body is code, kept verbatim
                code = content_text(r, "harmony")
                c.add(f"{start}{r.choice([H_CHANNEL + 'analysis to=python code', H_CHANNEL + 'commentary to=python'])}"
                      f"{H_MESSAGE}{code}{end(H_CALL)}")
                c.calls.append(("python", {"code": code}, None))
            else:
                tool = r.choice(["browser.search", "browser.open", "container.exec"])
                args = format_args(r, "harmony")
                c.add(f"{start}{harmony_header(r, tool)}{H_MESSAGE}{dumps(r, args)}{end(H_CALL)}")
                c.calls.append((tool, args, None))
        elif what == "bad_args":
            body, kind = bad_object(r)
            c.add_bad(f"{start}{harmony_header(r, 'functions.' + rand_name(r))}{H_MESSAGE}{body}{end(H_CALL)}", "arguments: " + kind)
        elif what == "bad_header":
            name = rand_name(r)
            header = r.choice([
                f"{H_CHANNEL}{r.choice(['comentary', 'thoughts', 'Final'])}", f"{H_CHANNEL}commentary to=functions.{name} extra json",
                f"{H_CHANNEL}commentary to=functions. json", f"{H_CHANNEL}commentary to= json", f"{H_CHANNEL}commentary{H_CHANNEL}final",
                "", H_CHANNEL, f"{H_CHANNEL}final x y",
            ])
            if k > 0 and r.chance(0.2):
                start = H_START + r.choice(["user", "system", "tool"])  # another role's message
                header = f"{H_CHANNEL}final"
            c.add_bad(f"{start}{header}{H_MESSAGE}{r.choice(['x', '{}', ''])}{end(r.choice([H_END, H_CALL]))}", "bad header")
        elif what == "no_message":
            c.add_bad(f"{start}{H_CHANNEL}{r.choice(['analysis', 'final'])} text{end(H_END)}", f"header without {H_MESSAGE}")
        elif what == "junk":  # text where only <|start|> may be, then a message
            c.add_bad(r.choice(["junk", " ", "\n", "{}", "<|endoftext|>", "x <b>"]), "text outside any message")
            c.add(f"{H_START}assistant{H_CHANNEL}final{H_MESSAGE}ok{H_END}")
            c.content.append("ok")
        elif what == "cut" and last:
            if k == 0:
                c.add_bad(r.choice([f"{H_CHANNEL}fin", f" to=functions.f{H_CHANNEL}commentary", H_CHANNEL]), "truncated header")
            else:
                c.add_bad(r.choice([H_START, f"{H_START}assistant", f"{H_START}assistant{H_CHANNEL}fin",
                                    f"{H_START}assistant to=functions.f{H_CHANNEL}commentary"]), "truncated header")
        elif what == "unclosed" and not last:  # the body runs into the next <|start|>: read, and reported
            name = rand_name(r)
            args = format_args(r, "harmony")
            c.add_bad(f"{start}{harmony_header(r, 'functions.' + name)}{H_MESSAGE}{dumps(r, args)}", "message not closed")
            c.calls.append((name, args, None))
        else:
            c.add(f"{start}{H_CHANNEL}final{H_MESSAGE}fine{end(H_END)}")
            c.content.append("fine")
    return c


# ---- qwen3_xml -------------------------------------------------------------------------------------


def qwen_key(k: str) -> bool:
    return bool(k) and k == k.strip() and not any(ch in k for ch in "<>\n")


def inline_value(raw: str) -> str:
    """What the reader takes from a value written without the markup's line breaks: one leading
    and one trailing line break are still read as markup."""
    s = raw[1:] if raw.startswith("\n") else raw
    return s[:-1] if s.endswith("\n") else s


def qwen_call(r: Rand) -> tuple[str, str, dict[str, Any]]:
    """A well-formed call: ``(text, name, arguments as read without tools)``."""
    name = rand_name(r)
    args = format_args(r, "qwen3_xml", qwen_key)
    if r.chance(0.7):
        return writer("qwen3_xml").format_calls([{"name": name, "arguments": args}]), name, {k: written(v) for k, v in args.items()}
    parts = ["<tool_call>", ws(r), f"{Q_FUNC}{name}>"]
    read: dict[str, Any] = {}
    for k, v in args.items():
        raw = written(v)
        if r.chance(0.5):
            parts.append(f"{ws(r)}{Q_PARAM}{k}>{raw}{Q_PARAM_END}")
            read[k] = inline_value(raw)
        else:
            parts.append(f"{ws(r)}{Q_PARAM}{k}>\n{raw}\n{Q_PARAM_END}")
            read[k] = raw
    parts += [ws(r), Q_FUNC_END, ws(r), "</tool_call>"]
    return "".join(parts), name, read


def qwen_bad(r: Rand) -> tuple[str, str]:
    """A malformed block, closed by its ``</tool_call>``."""
    n = rand_name(r)
    body = r.choice([
        "\n" + call_object_text(r, n, rand_args(r, tags=False)) + "\n", "\n",
        f"\n{Q_FUNC}{n}\n{Q_FUNC_END}\n", f"\n{Q_FUNC}>\n{Q_FUNC_END}\n", f"\n{Q_FUNC} >\n{Q_FUNC_END}\n",
        f"\n{Q_FUNC}{n}>\n{Q_PARAM}x>\n1\n{Q_PARAM_END}\n",  # no </function>
        f"\n{Q_FUNC}{n}>\n{Q_PARAM}x>\n1\n{Q_FUNC_END}\n",  # no </parameter>
        f"\n{Q_FUNC}{n}>\n{Q_PARAM}x\n1\n{Q_PARAM_END}\n{Q_FUNC_END}\n", f"\n{Q_FUNC}{n}>\n{Q_PARAM}>\n1\n{Q_PARAM_END}\n{Q_FUNC_END}\n",
        f"\n{Q_FUNC}{n}>\n{Q_PARAM}x>\na {Q_PARAM}y>\nb\n{Q_PARAM_END}\n{Q_FUNC_END}\n",
    ])
    return f"<tool_call>{body}</tool_call>", "malformed block"


def qwen_unclosed(r: Rand, text: str) -> str:
    """A call cut where no value is open (no ``</tool_call>``, a fresh call follows): after a tag, or in a name."""
    cuts = [len("<tool_call>"), text.index(">", text.index(Q_FUNC)) + 1, text.rindex(Q_FUNC_END) + len(Q_FUNC_END),
            text.index(Q_FUNC) + len(Q_FUNC) + 1]
    p = text.find(Q_PARAM_END)
    while p != -1:
        cuts.append(p + len(Q_PARAM_END))
        p = text.find(Q_PARAM_END, p + 1)
    return text[: r.choice(cuts)]


def gen_qwen3_xml(r: Rand) -> Case:
    c = Case("qwen3_xml")
    add_think(r, c)
    n = r.randint(1, 6)
    ended = False
    for k in range(n):
        last = k == n - 1
        what = r.choice(["content", "think", "good", "good", "good", "bad", "bad", "end_bad", "unclosed_then_call"])
        if what == "content":
            c.add_content(content_text(r, "qwen3_xml"))
        elif what == "think":
            add_think_block(r, c)
        elif what == "good":
            text, name, read = qwen_call(r)
            c.add(text)
            c.calls.append((name, read, None))
        elif what == "bad" or (what == "end_bad" and not last):
            c.add_bad(*qwen_bad(r))
        elif what == "end_bad":  # truncated generation
            text = qwen_call(r)[0]
            c.add_bad(r.choice(["<tool_call>", cut_text(r, text, len("<tool_call>")), text[: text.rindex("</tool_call>")]]), "cut at end")
            ended = True
            break
        else:
            c.add_bad(qwen_unclosed(r, qwen_call(r)[0]) + ws(r), "unclosed before next call")
            text, name, read = qwen_call(r)
            c.add(text)
            c.calls.append((name, read, None))
    if not ended:
        add_cut_think(r, c)
    return c


# ---- glm45 -----------------------------------------------------------------------------------------


def glm_key(k: str) -> bool:
    return k == k.strip() and not any(t in k for t in VALUE_STOPS["glm45"])


def glm_call(r: Rand) -> tuple[str, str, dict[str, Any]]:
    """A well-formed call (GLM-4.5's line breaks, or GLM-4.7's none): ``(text, name, arguments read without tools)``."""
    name = rand_name(r)
    args = format_args(r, "glm45", glm_key)
    read = {k: written(v) for k, v in args.items()}
    if r.chance(0.6):
        return writer("glm45").format_calls([{"name": name, "arguments": args}]), name, read
    sep = r.choice(["", "", "\n", " "])
    kv = "".join(f"{sep}{G_KEY}{k}{G_KEY_END}{sep}{G_VALUE}{v}{G_VALUE_END}" for k, v in read.items())
    return f"<tool_call>{name}{kv}{sep}</tool_call>", name, read


def glm_bad(r: Rand) -> tuple[str, str]:
    n = rand_name(r)
    return "<tool_call>" + r.choice([
        f"\n{G_KEY}x{G_KEY_END}\n{G_VALUE}1{G_VALUE_END}\n", "\n", "\n" + call_object_text(r, n, rand_args(r, tags=False)) + "\n",
        "get weather\n", f"{n}\n{G_KEY}x{G_KEY_END}\n{G_VALUE}1\n", f"{n}\n{G_KEY}x\n{G_VALUE}1{G_VALUE_END}\n",
        f"{n}\n{G_KEY}x{G_KEY_END}\n1{G_VALUE_END}\n", f"{n}\n{G_KEY}x{G_KEY_END}{G_VALUE}1{G_VALUE_END} junk",
        f"{n}\nstray {G_KEY}x{G_KEY_END}{G_VALUE}1{G_VALUE_END}", f"{n}\n{G_VALUE}1{G_VALUE_END}\n",
    ]) + "</tool_call>", "malformed call"


def gen_glm45(r: Rand) -> Case:
    c = Case("glm45")
    add_think(r, c)
    n = r.randint(1, 6)
    ended = False
    for k in range(n):
        last = k == n - 1
        what = r.choice(["content", "think", "good", "good", "good", "bad", "bad", "end_bad", "unclosed_then_call"])
        if what == "content":
            c.add_content(content_text(r, "glm45"))
        elif what == "think":
            add_think_block(r, c)
        elif what == "good":
            text, name, read = glm_call(r)
            c.add(text)
            c.calls.append((name, read, None))
        elif what == "bad" or (what == "end_bad" and not last):
            c.add_bad(*glm_bad(r))
        elif what == "end_bad":
            c.add_bad(r.choice(["<tool_call>", cut_text(r, glm_call(r)[0], len("<tool_call>"))]), "cut at end")
            ended = True
            break
        else:  # a call cut anywhere, then a fresh one: the cut one ends where the next opens
            c.add_bad(cut_text(r, glm_call(r)[0], len("<tool_call>")) + ws(r), "unclosed before next call")
            text, name, read = glm_call(r)
            c.add(text)
            c.calls.append((name, read, None))
    if not ended:
        add_cut_think(r, c)
    return c


# ---- deepseek_v3 / deepseek_v31 -----------------------------------------------------------------------


def ds_call_text(fmt: str, name: str, args_text: str) -> str:
    if fmt == "deepseek_v3":
        return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{args_text}\n```{DS_CALL_END}"
    return f"{DS_CALL_BEGIN}{name}{DS_SEP}{args_text}{DS_CALL_END}"


def ds_good(r: Rand, fmt: str, tags: bool = True) -> tuple[str, str, dict[str, Any]]:
    name = rand_name(r)
    args = format_args(r, fmt) if tags else rand_args(r, tags=False)
    if r.chance(0.5):
        text = writer(fmt).format_calls([{"name": name, "arguments": args}])
        return text[len(DS_CALLS_BEGIN) : -len(DS_CALLS_END)], name, args
    return ds_call_text(fmt, name, dumps(r, args)), name, args


def ds_bad(r: Rand, fmt: str) -> tuple[str, str]:
    """A malformed call inside a block (or text that is no call); every one ends at its ``<｜tool▁call▁end｜>``
    or, when it has none, where the next call or the block's end starts."""
    n = rand_name(r)
    args = json.dumps(rand_args(r, tags=False))
    roll = r.randint(0, 6)
    if roll <= 2:
        body, kind = bad_object(r)
        return ds_call_text(fmt, n, body), "arguments: " + kind
    if roll == 3:  # the other DeepSeek layout
        return ds_call_text("deepseek_v31" if fmt == "deepseek_v3" else "deepseek_v3", n, args), "other layout"
    if roll == 4:
        if fmt == "deepseek_v3":
            text = r.choice([
                f"{DS_CALL_BEGIN}tool{DS_SEP}{n}\n```json\n{args}\n```{DS_CALL_END}", f"{DS_CALL_BEGIN}function{DS_SEP}\n```json\n{{}}\n```{DS_CALL_END}",
                f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n{args}\n```{DS_CALL_END}", f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{args}{DS_CALL_END}",
                f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{args}\n``` x{DS_CALL_END}", f"{DS_CALL_BEGIN}function{n}\n```json\n{{}}\n```{DS_CALL_END}",
            ])
        else:
            text = r.choice([f"{DS_CALL_BEGIN}{DS_SEP}{args}{DS_CALL_END}", f"{DS_CALL_BEGIN}{n}{args}{DS_CALL_END}",
                             f"{DS_CALL_BEGIN}{n}{DS_SEP}{args} x{DS_CALL_END}", f"{DS_CALL_BEGIN}{n}{DS_SEP}{DS_CALL_END}"])
        return text, "malformed call"
    if roll == 5:  # no <｜tool▁call▁end｜>
        return ds_call_text(fmt, n, args)[: -len(DS_CALL_END)], "no call end"
    return r.choice(["junk", "x y", "{}", '"s"', "[1]", "function"]), "text in the block"


def ds_block(r: Rand, c: Case, at_end: bool) -> bool:
    """One ``<｜tool▁calls▁begin｜>`` block; returns True when it ends the text (cut, or never closed)."""
    fmt = c.fmt
    start = c.pos
    c.add(DS_CALLS_BEGIN + r.choice(["", "", "\n"]))
    m = r.randint(0, 4)
    for j in range(m):
        if j:
            c.add(r.choice(["\n", "", " ", "\n\n"]) if fmt == "deepseek_v3" else r.choice(["", "", "\n"]))
        roll = r.randint(0, 9)
        if roll < 6:
            text, name, args = ds_good(r, fmt)
            c.add(text)
            c.calls.append((name, args, None))
        elif roll < 9 or not at_end or j != m - 1:
            c.add_bad(*ds_bad(r, fmt))
        else:  # cut inside the last call
            # (no tag in its strings: cut inside a string, they would be tags)
            c.add_bad(cut_text(r, ds_good(r, fmt, tags=False)[0]), "cut call")
            c.bad.append((start, c.pos, "unclosed block"))
            return True
    if at_end and r.chance(0.3):
        c.bad.append((start, c.pos, "unclosed block"))
        return True
    c.add(r.choice(["", "", "\n"]) + DS_CALLS_END)
    return False


def gen_deepseek(fmt: str) -> Callable[[Rand], Case]:
    def gen(r: Rand) -> Case:
        c = Case(fmt)
        add_think(r, c)
        n = r.randint(1, 5)
        ended = False
        for k in range(n):
            last = k == n - 1
            what = r.choice(["content", "think", "block", "block", "block", "stray", "end"])
            if what == "content":
                c.add_content(content_text(r, fmt))
            elif what == "think":
                add_think_block(r, c)
            elif what == "stray":  # a call outside any block: an error, not text
                c.add_bad(ds_good(r, fmt, tags=False)[0], "call outside a block")
            elif ds_block(r, c, at_end=what == "end" and last):
                ended = True
                break
        if not ended:
            add_cut_think(r, c)
        return c

    gen.__name__ = f"gen_{fmt}"
    return gen


# ---- kimi_k2 ---------------------------------------------------------------------------------------


def kimi_good(r: Rand, tags: bool = True) -> tuple[str, str, dict[str, Any], str]:
    """``(text, name, arguments, id)``; no arguments at all is read as {} (with a warning over the call)."""
    name = rand_name(r)
    idx = r.randint(0, 20)
    if r.chance(0.1):
        header = f"functions.{name}:{idx}"
        return f"{K_CALL}{header}{K_ARGS}{ws(r)}{K_CALL_END}", name, {}, header
    args = format_args(r, "kimi_k2") if tags else rand_args(r, tags=False)
    if r.chance(0.3):
        header = f"functions.{name}:{idx}"
        text = writer("kimi_k2").format_calls([{"name": name, "arguments": args, "id": header}])
        return text[len(K_SECTION) : -len(K_SECTION_END)], name, args, header
    header = f"functions.{name}:{idx}" if r.chance(0.8) else f"{name}:{idx}"
    return f"{K_CALL}{r.choice(['', ' '])}{header}{r.choice(['', ' '])}{K_ARGS}{ws(r)}{dumps(r, args)}{ws(r)}{K_CALL_END}", name, args, header


def kimi_bad(r: Rand) -> tuple[str, str]:
    n = rand_name(r)
    header = f"functions.{n}:{r.randint(0, 9)}"
    args = json.dumps(rand_args(r, tags=False))
    roll = r.randint(0, 8)
    if roll <= 2:
        body, kind = bad_object(r)
        return f"{K_CALL}{header}{K_ARGS}{body}{K_CALL_END}", "arguments: " + kind
    if roll == 3:
        bad_header = r.choice([n, f"functions.{n}", f"functions.{n}:x", f"functions.{n} x:0", "", ":0", f"functions.{n}:{'9' * 25}"])
        return f"{K_CALL}{bad_header}{K_ARGS}{args}{K_CALL_END}", "bad header"
    if roll == 4:
        return f"{K_CALL}{header}{r.choice(['', ' ' + args])}{K_CALL_END}", "no argument tag"
    if roll == 5:
        return f"{K_CALL}{header}{K_ARGS}{args} x{K_CALL_END}", "text after the arguments"
    if roll == 6:  # no <|tool_call_end|>: what follows is never one (see kimi_section)
        return f"{K_CALL}{header}{K_ARGS}{args}", "no call end"
    if roll == 7:
        return K_ARGS, "tag out of place"
    return r.choice(["junk", "x", "{}", "functions.f:0"]), "text in the section"


def kimi_section(r: Rand, c: Case, at_end: bool) -> bool:
    """One section; returns True when it ends the text."""
    start = c.pos
    c.add(K_SECTION + ws(r))
    m = r.randint(0, 4)
    for j in range(m):
        if j:
            c.add(r.choice(["", "", "\n", " "]))
        roll = r.randint(0, 9)
        if roll < 6:
            text, name, args, header = kimi_good(r)
            c.add(text)
            c.calls.append((name, args, header))
        elif roll < 9 or not at_end or j != m - 1:
            c.add_bad(*kimi_bad(r))
        else:
            c.add_bad(cut_text(r, kimi_good(r, tags=False)[0]), "cut call")
            c.bad.append((start, c.pos, "unclosed section"))
            return True
    if at_end and r.chance(0.3):
        c.bad.append((start, c.pos, "unclosed section"))
        return True
    if r.chance(0.05):  # a new section opens before this one's end
        c.bad.append((start, c.pos, "section without its end"))
        return kimi_section(r, c, at_end)
    c.add(ws(r) + K_SECTION_END)
    return False


def gen_kimi_k2(r: Rand) -> Case:
    c = Case("kimi_k2")
    add_think(r, c)
    n = r.randint(1, 5)
    ended = False
    for k in range(n):
        last = k == n - 1
        what = r.choice(["content", "think", "section", "section", "section", "stray_call", "stray_tag", "end"])
        if what == "content":
            c.add_content(content_text(r, "kimi_k2"))
        elif what == "think":
            add_think_block(r, c)
        elif what == "stray_call":  # kept, and reported
            text, name, args, header = kimi_good(r)
            a, b = c.add(text)
            c.calls.append((name, args, header))
            c.bad.append((a, b, "call outside a section"))
        elif what == "stray_tag":
            c.add_bad(r.choice([K_SECTION_END, K_ARGS, K_CALL_END]), "tag out of place")
        elif kimi_section(r, c, at_end=what == "end" and last):
            ended = True
            break
    if not ended:
        add_cut_think(r, c)
    return c


# ---- pythonic --------------------------------------------------------------------------------------

PY_NAMES = ["get_weather", "search", "run_code", "a", "f.g", "x_y_z", "读取"]
# malformed elements that start as a call (a list is read only when its first element does)
PY_BAD_CALLS = [
    "f(a=foo)", "f(1)", "f(a=1, a=2)", "f(a={1, 2})", "f(a=true)", "f(a=null)", "f(a=1 + 2)", "f(**k)", 'f(a="x\ny")',
    "f(a=b'x')", "f(a=1e999)", "f(a=-1e999)", "f(a=f'x')", "f(a=x.y)", "f(a=[1][0])", "f(a={1: 2})", "f(*a)",
    "f(a=lambda: 1)", "f()()", "f(a=1)[0]", "f(a=1) g(b=2)", "f(class=1)", "f(1, a=2)", "f(a=" + "9" * 5000 + ")",
    "f(a=" + "[" * 150 + "]" * 150 + ")", "f(a='x' 'y' + 'z')", "f(a={'k': [1, {2}]})",
]
PY_BAD_OTHER = ["42", '"s"', "f", "None", "{'a': 1}", "[f(a=1)]", "f.1(a=1)", "1f(a=1)"]


def py_key(k: str) -> bool:
    """A keyword argument name that reads back as itself (Python normalises identifiers to NFKC)."""
    return k.isidentifier() and not keyword.iskeyword(k) and unicodedata.normalize("NFKC", k) == k


def py_good(r: Rand) -> tuple[str, str, dict[str, Any]]:
    name = r.choice(PY_NAMES)
    args = format_args(r, "pythonic", py_key)
    return writer("pythonic").format_calls([{"name": name, "arguments": args}])[1:-1], name, args


def py_list(r: Rand, c: Case, at_end: bool, first: bool) -> bool:
    """A call list; ``first``: it starts the text, so its first element starts as a call. Returns
    True when it was cut at the end of the text."""
    c.add("[")
    m = r.randint(1 if first else 0, 4)
    for j in range(m):
        if j:
            c.add(r.choice([", ", ",", ",\n", " , "]))
            if r.chance(0.03):
                c.add_bad(",", "empty element")
                c.add(" ")
        roll = r.randint(0, 9)
        if roll < 6:
            text, name, args = py_good(r)
            c.add(text)
            c.calls.append((name, args, None))
        elif roll < 9 or not at_end or j != m - 1:
            c.add_bad(r.choice(PY_BAD_CALLS if first and j == 0 or r.chance(0.7) else PY_BAD_OTHER), "malformed call")
        else:
            text = py_good(r)[0]
            c.add_bad(cut_text(r, text, text.index("(") + 1), "cut call")
            return True
    if m and r.chance(0.03):
        c.add_bad(",", "trailing comma")
    c.add("]")
    return False


def py_block(r: Rand, c: Case, at_end: bool) -> bool:
    """A ``<|python_start|>`` block; returns True when it ends the text."""
    start = c.pos
    c.add(PY_START + r.choice(["", "", "\n"]))
    style = r.randint(0, 9)
    if at_end and style == 9:
        c.bad.append((start, c.pos, "tag only"))
        return True
    if style == 8:
        c.add(r.choice(["f(a=1)", "hello", "{}", "(1)"]) + PY_END)
        c.bad.append((start, c.pos, "no list after the tag"))
        return False
    if py_list(r, c, at_end, first=False) or (at_end and r.chance(0.2)):
        c.bad.append((start, c.pos, "unclosed block"))
        return True
    if style == 7:
        c.add_bad(r.choice([" junk", "x", " ]", " f()"]).lstrip() + PY_END, "text after the list")
    elif style == 6:  # no <|python_end|>: the block is reported, its calls kept
        c.bad.append((start, c.pos, "no end tag"))
    else:
        c.add(r.choice(["", "", "\n"]) + PY_END)
    return False


def gen_pythonic(r: Rand) -> Case:
    c = Case("pythonic")
    if r.chance(0.6):  # the text starts with a call list
        c.add(r.choice(["", "", " ", "\n"]))
        start = c.pos
        if py_list(r, c, at_end=r.chance(0.1), first=True):
            c.bad.append((start, c.pos, "unclosed list"))
            return c
    n = r.randint(1, 4)
    for k in range(n):
        if r.chance(0.5):
            c.add_content(content_text(r, "pythonic", first=c.pos == 0 or not c.text.strip()))
        elif py_block(r, c, at_end=k == n - 1):
            break
    return c


# ---- granite / phi4_mini_json ---------------------------------------------------------------------------


CALL_START = re.compile(r'\{\s*"(?:name|arguments|parameters|id)"\s*:')


def list_broken(elements: list[str]) -> bool:
    """Whether a list reader is still skipping after these elements: after an element that is not
    one JSON value it cannot tell where that element ends, and skips to the next element that starts
    as a call object (``{"name": ...``); with none, the error runs to the next list or the end."""
    skipping = False
    for e in elements:
        if skipping and not CALL_START.match(e):
            continue
        try:
            json.loads(e, parse_constant=_reject_constant, parse_float=_finite_float)
            skipping = False
        except (ValueError, RecursionError):
            skipping = True
    return skipping


def gen_json_list(fmt: str) -> Callable[[Rand], Case]:
    """A tag (``<|tool_call|>`` / ``<tool_call>``; ``functools``) then a JSON list of call objects,
    which its ``]`` ends; text before and after is content."""

    def opener(r: Rand) -> str:
        return (r.choice(GRANITE_TAGS) if fmt == "granite" else PHI_OPEN) + r.choice(["", "", " ", "\n"]) + "["

    def gen(r: Rand) -> Case:
        c = Case(fmt)
        n = r.randint(1, 5)
        swallow = False  # after a list whose last element is malformed, its error runs to the next list
        for k in range(n):
            last = k == n - 1
            what = r.choice(["content", "list", "list", "list", "bad_open", "end"])
            if what == "content":
                s = content_text(r, fmt)
                if swallow:
                    c.add(s)
                else:
                    c.add_content(s)
            elif what == "bad_open" and fmt == "granite":  # a tag without a list
                tag = r.choice(GRANITE_TAGS)
                if r.chance(0.5):
                    c.add_bad(tag + r.choice(["", " "]) + r.choice(['{"name": "f", "arguments": {}}', '"x"', "42", "null"]), "not a list")
                    swallow = False
                else:  # not JSON: the error runs to the next tag
                    c.add_bad(tag + r.choice(["", " "]) + r.choice(["hello", "x [1]", "f(a=1)"]), "not JSON")
                    swallow = True
            elif what != "end" or not last:
                c.add(opener(r))
                elements: list[str] = []
                _list_elements(r, c, ("arguments", "parameters"), r.choice(["arguments", "parameters"]), False, False, elements)
                swallow = list_broken(elements)
                c.add("]")
            else:  # truncated at the end
                start = c.pos
                style = r.randint(0, 2)
                if style == 0:
                    c.add_bad(r.choice(GRANITE_TAGS) if fmt == "granite" else opener(r), "tag only")
                elif style == 1:
                    c.add(opener(r))
                    elements = []
                    cut = _list_elements(r, c, ("arguments", "parameters"), "arguments", False, True, elements) == "cut"
                    if not cut and not list_broken(elements):  # (else a malformed element's error runs to the end)
                        c.bad.append((start, c.pos, "list without its ]"))
                else:
                    c.add(opener(r))
                    c.add(call_object_text(r, "a", {}, "arguments"))
                    c.calls.append(("a", {}, None))
                    c.bad.append((start, c.pos, "list cut after an element"))
                break
        return c

    gen.__name__ = f"gen_{fmt}"
    return gen


gen_granite = gen_json_list("granite")
gen_phi4_mini_json = gen_json_list("phi4_mini_json")
gen_deepseek_v3 = gen_deepseek("deepseek_v3")
gen_deepseek_v31 = gen_deepseek("deepseek_v31")


GENERATORS: dict[str, Callable[[Rand], Case]] = {
    "hermes": gen_hermes, "hunyuan": gen_hunyuan, "llama3_json": gen_llama, "mistral": gen_mistral, "harmony": gen_harmony,
    "qwen3_xml": gen_qwen3_xml, "deepseek_v3": gen_deepseek_v3, "deepseek_v31": gen_deepseek_v31, "glm45": gen_glm45,
    "pythonic": gen_pythonic, "kimi_k2": gen_kimi_k2, "granite": gen_granite, "phi4_mini_json": gen_phi4_mini_json,
}
assert sorted(GENERATORS) == sorted(NATIVE)


# ---- properties ---------------------------------------------------------------------------------


def check_safety(text: str, res: ParseResult) -> None:
    assert isinstance(res, ParseResult)
    assert isinstance(res.content, str)
    assert res.reasoning is None or isinstance(res.reasoning, str)
    for item in [*res.tool_calls, *res.errors]:
        assert item.span is not None, item
        s, e = item.span
        assert 0 <= s <= e <= len(text), (item.span, len(text))
        assert text[s:e] == item.raw
    for e in res.errors:
        assert not e.message.startswith("internal parser error"), e.message
        assert e.message
    prev_end = -1
    for call in res.tool_calls:
        assert isinstance(call.name, str) and call.name.strip()
        assert isinstance(call.arguments, dict)
        assert call.span[0] >= prev_end, "calls overlap"
        prev_end = call.span[1]


def check_structured(case: Case, res: ParseResult) -> None:
    text = case.text
    check_safety(text, res)
    got = [(c.name, c.arguments) for c in res.tool_calls]
    want = [(n, a) for n, a, _ in case.calls]
    if got != want:
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(
            f"calls differ at #{k} (got {len(got)}, want {len(want)})\n got[k]={got[k:k + 1]!r:.600}\n want[k]={want[k:k + 1]!r:.600}\n"
            f" text={text!r:.3000}\n errors={res.errors!r:.1500}"
        )
    if case.fmt in ("mistral", "kimi_k2"):  # ids the format writes
        assert [c.id for c in res.tool_calls] == [i for _, _, i in case.calls], (res.tool_calls, text[:2000])
    for s, e, kind in case.bad:
        e2 = e
        while e2 > s and text[e2 - 1].isspace():
            e2 -= 1
        assert any(err.span[0] <= s and err.span[1] >= e2 for err in res.errors if err.severity == "error"), (
            f"malformed call ({kind}) at {s}:{e} {text[s:e]!r:.300} not covered by an error\n text={text[:2000]!r}\n errors={res.errors!r:.2000}"
        )
    for err in res.errors:  # no error on good text only
        s, e = err.span
        if err.severity == "warning":  # a repair (no arguments key, read as {}): exactly over such a good call
            assert any(c.span == err.span and c.arguments == {} for c in res.tool_calls), (err, text[:2000])
            continue
        assert any(s < be and e > bs or (s == e and bs <= s <= be) for bs, be, _ in case.bad), (
            f"error {err.message!r} at {err.span} {err.raw!r:.200} touches no malformed call\n text={text[:2000]!r}"
        )
    if case.fmt != "llama3_json":
        assert res.reasoning == case.expected_reasoning(), (res.reasoning, case.expected_reasoning(), text[:1000])
    if case.check_content:
        assert res.content == case.expected_content(), (res.content, case.content, text[:1000])


MUTATION_TOKENS = EVERY_TAG + ["{", "}", "[", "]", '"', "\\", ",", ";", ":", "\n", " ", "NaN", "1e999", "\ufffd", "\x00", "\ud800",
                                '{"name": "m", "arguments": {}}', '"name": ', "]]]]", "}}}}", "{{{{", "(", ")", "=", "'", "```",
                                "f(", "to=functions.m", f"{Q_FUNC}m>", f"{Q_PARAM}x>", "```json\n", "functions.m:0", "<|tool_call"]
# Where a call's raw text, wrapped so, is a whole text that reads back as the same call.
ROUND_TRIP = {
    "hermes": ("", ""), "glm45": ("", ""), "kimi_k2": ("", ""), "harmony": ("", ""),
    "deepseek_v3": (DS_CALLS_BEGIN, DS_CALLS_END), "deepseek_v31": (DS_CALLS_BEGIN, DS_CALLS_END),
    "granite": ("<|tool_call|>[", "]"), "phi4_mini_json": ("functools[", "]"), "pythonic": ("[", "]"),
    "hunyuan": ("<tool_calls>[", "]</tool_calls>"),
}


def mutate(r: Rand, text: str) -> str:
    chars = text
    for _ in range(r.randint(1, 6)):
        n = len(chars)
        op = r.randint(0, 6)
        a = r.randint(0, n)
        b = min(n, a + r.randint(0, 40))
        if op == 0:
            chars = chars[:a] + chars[b:]
        elif op == 1:
            chars = chars[:a] + r.choice(MUTATION_TOKENS) + chars[a:]
        elif op == 2:
            chars = chars[:a] + chars[a:b] * r.randint(2, 4) + chars[b:]
        elif op == 3:
            chars = chars[:a]  # truncation
        elif op == 4:
            chars = chars[:a] + "\ufffd" * (b - a) + chars[b:]  # invalid UTF-8 decoded with replacement
        elif op == 5 and n:
            c = r.randint(0, n)
            chars = chars[:a] + chars[c : c + 30] + chars[a:]  # splice from elsewhere
        else:
            chars = chars[:a] + r.choice(["{" * 50, "[" * 50, '"' * 7, "\\" * 5, "}" * 50]) + chars[a:]
    return chars


def check_mutated(fmt: str, parser: Any, text: str, twice: bool = True) -> None:
    res = parser.parse(text)
    check_safety(text, res)
    if twice:
        again = parser.parse(text)
        assert again.to_dict() == res.to_dict(), "parsing is not deterministic"
    if fmt in ROUND_TRIP:
        before, after = ROUND_TRIP[fmt]
        for call in res.tool_calls:
            alone = parser.parse(before + call.raw + after)
            assert [(c.name, c.arguments) for c in alone.tool_calls] == [(call.name, call.arguments)], (call.raw[:2000], text[:3000])


# ---- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", NATIVE)
def test_structured_seeded(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    r = Rand(random.Random(f"structured-{fmt}"))
    ran = bad = good = 0
    t0 = time.perf_counter()
    n = SEEDED_PER_PARSER // FAST_SHARE
    for _ in range(n):
        case = gen(r)
        check_structured(case, parser.parse(case.text))
        ran += 1
        bad += len(case.bad)
        good += len(case.calls)
    assert ran == n
    assert bad > n // 2 and good > n  # the generator exercises both
    print(f"{fmt}: {ran} structured cases, {good} good calls, {bad} malformed, {time.perf_counter() - t0:.1f}s")


@pytest.mark.parametrize("fmt", NATIVE)
def test_mutated_seeded(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    r = Rand(random.Random(f"mutated-{fmt}"))
    ran = 0
    while ran < MUTATED_PER_PARSER // FAST_SHARE:
        base = gen(r).text
        if r.chance(0.3):  # mixed formats: another format's output spliced in
            other = GENERATORS[r.choice(NATIVE)](r).text
            cut = r.randint(0, len(base))
            base = base[:cut] + other + base[cut:]
        for _ in range(MUTANTS_PER_BASE):
            check_mutated(fmt, parser, mutate(r, base), twice=ran % 10 == 0)
            ran += 1
    assert ran == MUTATED_PER_PARSER // FAST_SHARE


@pytest.mark.parametrize("fmt", NATIVE)
def test_structured_hypothesis(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    count = 0

    @settings(max_examples=HYPOTHESIS_EXAMPLES // FAST_SHARE, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def prop(data):
        nonlocal count
        count += 1
        r = HypoRand(data)
        case = gen(r)
        check_structured(case, parser.parse(case.text))
        if r.chance(0.5):
            check_mutated(fmt, parser, mutate(r, case.text))

    prop()
    assert count >= HYPOTHESIS_EXAMPLES // FAST_SHARE


@pytest.mark.parametrize("fmt", NATIVE)
def test_total_cases_per_parser(fmt):
    """The volume the brief asks for: at least 10,000 generated outputs per parser."""
    assert SEEDED_PER_PARSER + MUTATED_PER_PARSER + HYPOTHESIS_EXAMPLES >= 10_000


# A malformed call before the two good ones and one after, and how many errors the text holds.
MEGA_PREFIX = {
    "hermes": "<tool_call>\n{bad\n</tool_call>", "hunyuan": "<tool_calls>[{bad}]</tool_calls>", "llama3_json": "",
    "mistral": "[TOOL_CALLS]f[ARGS]{bad",
    "harmony": f"{H_CHANNEL}commentary to=functions.f json{H_MESSAGE}{{bad{H_CALL}{H_START}assistant",
    "qwen3_xml": '<tool_call>\n{"name": "f"}\n</tool_call>\n',
    "deepseek_v3": f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}f\n```json\n{{bad\n```{DS_CALL_END}{DS_CALLS_END}",
    "deepseek_v31": f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}f{DS_SEP}{{bad{DS_CALL_END}{DS_CALLS_END}",
    "glm45": "<tool_call>\n</tool_call>\n",
    "pythonic": f"{PY_START}[f(a=foo)]{PY_END}{PY_START}",
    "kimi_k2": f"{K_SECTION}{K_CALL}functions.f:0{K_ARGS}{{bad{K_CALL_END}{K_SECTION_END}",
    "granite": "<|tool_call|>[{bad}]", "phi4_mini_json": "functools[{bad}]",
}
MEGA_SUFFIX = {
    "hermes": '<tool_call>\n{"name": "t", "arguments": {"x": NaN}}', "hunyuan": "<tool_calls>[{",
    "llama3_json": '; {"name": "t", "parameters": {"x": NaN}}', "mistral": "[TOOL_CALLS]t[ARGS]{",
    "harmony": f"{H_CALL}{H_START}assistant{H_CHANNEL}commentary to=functions.t json{H_MESSAGE}{{\"x\": NaN}}",
    "qwen3_xml": f"\n<tool_call>\n{Q_FUNC}t>\n{Q_PARAM}x>\nNa",
    "deepseek_v3": f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}t\n```json\n{{\"x\": NaN}}",
    "deepseek_v31": f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}t{DS_SEP}{{\"x\": NaN}}",
    "glm45": f"\n<tool_call>t\n{G_KEY}x{G_KEY_END}\n{G_VALUE}Na",
    "pythonic": f"{PY_END}{PY_START}[t(x=1e999)]",
    "kimi_k2": f"{K_SECTION}{K_CALL}functions.t:9{K_ARGS}{{\"x\": NaN}}",
    "granite": '<|tool_call|>[{"name": "t", "arguments": {"x": NaN}}', "phi4_mini_json": 'functools[{"name": "t", "arguments": {"x": NaN}}',
}
# the bad call before, the bad one after; hunyuan, deepseek, kimi, pythonic, granite, phi4: plus the
# unclosed block, section, tag or list; llama: the NaN call only, as text before a call without
# <|python_tag|> is not read
MEGA_ERRORS = {"hermes": 2, "hunyuan": 3, "llama3_json": 1, "mistral": 2, "harmony": 2, "qwen3_xml": 2, "deepseek_v3": 3,
               "deepseek_v31": 3, "glm45": 2, "pythonic": 3, "kimi_k2": 3, "granite": 3, "phi4_mini_json": 3}
TYPED_BY_SCHEMA = ("qwen3_xml", "glm45")  # without tools, every value reads as the text written


@pytest.mark.parametrize("fmt", NATIVE)
def test_megabyte_argument_between_malformed_calls(fmt):
    parser = get_parser(fmt)
    args = {"blob": "\\\"{[" * (1 << 18), "n": int("9" * 4000)}
    good = parser.format_calls([{"name": "big", "arguments": args}, {"name": "small", "arguments": {"x": 1}}])
    text = MEGA_PREFIX[fmt] + good + MEGA_SUFFIX[fmt]
    res = parser.parse(text)
    check_safety(text, res)
    assert [c.name for c in res.tool_calls] == ["big", "small"]
    assert res.tool_calls[0].arguments == ({k: written(v) for k, v in args.items()} if fmt in TYPED_BY_SCHEMA else args)
    assert len(res.errors) == MEGA_ERRORS[fmt], res.errors
    assert all(e.severity == "error" for e in res.errors)


# ---- adapters (fewer cases: the parsing is vLLM's / transformers', and slower) --------------------


def _adapter_texts(n: int) -> list[str]:
    r = Rand(random.Random("adapters"))
    out = []
    for k in range(n):
        text = gen_hermes(r).text
        text = text[:20_000]  # vLLM's hermes regex is quadratic in the number of unclosed tags
        out.append(mutate(r, text) if k % 2 else text)
    return out


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from backend.loading.tokenizers import load_tokenizer

    return load_tokenizer("qwen3").tokenizer


def _check_adapter(parser: Any, texts: list[str]) -> int:
    ran = 0
    for text in texts:
        res = parser.parse(text)
        assert isinstance(res, ParseResult)
        for item in [*res.tool_calls, *res.errors]:
            if item.span is not None:
                assert 0 <= item.span[0] <= item.span[1] <= len(text)
                assert text[item.span[0] : item.span[1]] == item.raw
        for call in res.tool_calls:
            assert isinstance(call.arguments, dict)
        ran += 1
    return ran


def test_vllm_hermes_adapter_never_raises(qwen_tokenizer, caplog):
    pytest.importorskip("vllm", reason="vLLM is not installed: the vllm: adapters cannot run")
    import logging

    parser = get_parser("vllm:hermes", tokenizer=qwen_tokenizer)
    with caplog.at_level(logging.CRITICAL):
        logging.getLogger("vllm").setLevel(logging.CRITICAL)
        try:
            assert _check_adapter(parser, _adapter_texts(ADAPTER_CASES // FAST_SHARE)) == ADAPTER_CASES // FAST_SHARE
        finally:
            logging.getLogger("vllm").setLevel(logging.NOTSET)


def test_transformers_adapter_never_raises(qwen_tokenizer):
    parser = get_parser("transformers", tokenizer=qwen_tokenizer)
    assert _check_adapter(parser, _adapter_texts(ADAPTER_CASES // FAST_SHARE)) == ADAPTER_CASES // FAST_SHARE
