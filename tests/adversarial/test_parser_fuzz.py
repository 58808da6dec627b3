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
  parsing is deterministic, and (hermes) each call's raw text parses back to the same call.

Generated malformed calls avoid one documented ambiguity of the list readers: text of the shape
``, {"name":`` inside a *malformed* element is where the reader resynchronises.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.parsers import ParseResult, get_parser

NATIVE = ["hermes", "hunyuan", "llama3_json", "mistral", "harmony", "pythonic", "kimi_k2", "granite", "phi4_mini_json", "deepseek_v3", "deepseek_v31", "glm45", "qwen3_xml"]
SEEDED_PER_PARSER = 5_000  # structured cases per parser (seeded random)
MUTATED_PER_PARSER = 5_000  # mutated cases per parser (seeded random)
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

OWN_TAGS = {
    "hermes": ["<tool_call>", "<think>", "</think>"],
    "hunyuan": ["<tool_calls>", "<think>", "</think>", "<answer>", "</answer>"],
    "llama3_json": ["<|python_tag|>"],
    "mistral": ["[TOOL_CALLS]", "[THINK]", "[/THINK]"],
}
ALL_TAGS = [
    "<tool_call>", "</tool_call>", "<tool_calls>", "</tool_calls>", "<think>", "</think>", "<answer>",
    "</answer>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "[THINK]", "[/THINK]",
]
STR_PIECES = [
    # (only a high lone surrogate: a high one followed by a low one would be read back as one
    # character after \u escaping, which is JSON, not a parser bug)
    "a", "b", "Z", "q", "7", " ", "  ", "é", "中文", "😀", "\ufffd", "\x00", "\ud800",
    '"', '\\"', "\\", "\\\\", "{", "}", "[", "]", ",", ":", ";", "\n", "\t", "\r", "\u2028", "/", "'",
    "NaN", "1e999", "true", "null", '{"a": 1}', "助手：",
]
RESERVED_KEYS = {"name", "arguments", "parameters", "id"}


def rand_str(r: Rand, tags: bool, max_pieces: int = 6) -> str:
    pieces = STR_PIECES + (ALL_TAGS if tags else [])
    return "".join(r.choice(pieces) for _ in range(r.randint(0, max_pieces)))


def rand_key(r: Rand, tags: bool) -> str:
    while True:
        k = r.choice(["city", "q", "x", "path", "k", "values", "opts"]) if r.chance(0.6) else rand_str(r, tags, 3)
        if k not in RESERVED_KEYS and "name" not in k:
            return k


def rand_scalar(r: Rand, tags: bool) -> Any:
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


def rand_value(r: Rand, depth: int, tags: bool) -> Any:
    if depth <= 0 or r.chance(0.55):
        return rand_scalar(r, tags)
    if r.chance(0.5):
        return [rand_value(r, depth - 1, tags) for _ in range(r.randint(0, 3))]
    return {rand_key(r, tags): rand_value(r, depth - 1, tags) for _ in range(r.randint(0, 3))}


def rand_args(r: Rand, tags: bool) -> dict[str, Any]:
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
        if any(t in text for t in ALL_TAGS):
            continue
        return text, kind


def content_text(r: Rand, fmt: str, first: bool = False) -> str:
    """Plain text for ``fmt``: never one of its own tags; may hold other formats' calls."""
    own = OWN_TAGS[fmt]
    pieces = [
        "Sure", ", ", "I will check.", " ", "\n", "\n\n", "é中😀", "\ufffd", "\x00", "\ud800", '"quoted"',
        "{", "}", "[", "]", "{}", '{"a": 1}', ";", "<tool_ca", "</tool_cal", "<thin", "[TOOL_CALL", "<|python_ta",
        "</tool_call>", "</tool_calls>", "[ARGS]", "助手：",
        '<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>',
        '<tool_calls>[{"name": "h", "arguments": {}}]</tool_calls>',
        '[TOOL_CALLS] [{"name": "h", "arguments": {}}]', '[TOOL_CALLS]h[ARGS]{"x": 1}',
        '<|python_tag|>{"name": "h", "parameters": {}}', "<answer>", "[THINK]x[/THINK]", "<think>x</think>",
    ]
    while True:
        s = "".join(r.choice(pieces) for _ in range(r.randint(1, 5)))
        if fmt == "llama3_json":
            s = "Text " + s  # must not start with '{' (that would make it a call region)
        if not any(t in s for t in own) and not any(t in s for t in ("</think>", "[/THINK]")):
            return s


def think_text(r: Rand, fmt: str, allow_calls: bool) -> str:
    close = "[/THINK]" if fmt == "mistral" else "</think>"
    opener = "[THINK]" if fmt == "mistral" else "<think>"
    while True:
        s = rand_str(r, tags=allow_calls, max_pieces=5)
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


def _list_elements(r: Rand, c: Case, arg_keys: tuple[str, ...], arg_key: str, with_ids: bool, at_end: bool) -> str:
    """Elements of a call list, added to ``c``; returns "cut" when the list was cut at the end."""
    n = r.randint(0, 5)
    for k in range(n):
        if k:
            c.add(r.choice([", ", ",", ",\n", " , "]))
        roll = r.randint(0, 9)
        if roll < 6:
            name = rand_name(r)
            args = big_args(r) if r.chance(0.002) else rand_args(r, tags=True)
            cid = r.choice([None, "abc123XYZ", "call_1"]) if with_ids else None
            c.add(call_object_text(r, name, args, arg_key, cid))
            c.calls.append((name, args, cid))
        elif roll < 9 or not at_end or k != n - 1:
            body, kind = bad_body(r, arg_keys, arg_key, context="list")
            c.add_bad(body, kind)
        else:
            good = call_object_text(r, rand_name(r), rand_args(r, tags=False), arg_key)
            c.add_bad(good[: r.randint(1, len(good) - 1)].rstrip(), "cut element at end")
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


GENERATORS = {"hermes": gen_hermes, "hunyuan": gen_hunyuan, "llama3_json": gen_llama, "mistral": gen_mistral}


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
    if case.fmt == "mistral":
        assert [c.id for c in res.tool_calls] == [i for _, _, i in case.calls]
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
    if case.check_content and case.fmt in ("hermes", "hunyuan"):
        assert res.content == "".join(case.content).strip(), (res.content, case.content, text[:1000])


MUTATION_TOKENS = ALL_TAGS + ["{", "}", "[", "]", '"', "\\", ",", ";", ":", "\n", " ", "NaN", "1e999", "\ufffd", "\x00", "\ud800",
                              '{"name": "m", "arguments": {}}', '"name": ', "]]]]", "}}}}", "{{{{"]


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
    if fmt == "hermes":
        for call in res.tool_calls:
            alone = parser.parse(call.raw)
            assert [(c.name, c.arguments) for c in alone.tool_calls] == [(call.name, call.arguments)], call.raw


# ---- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", NATIVE)
def test_structured_seeded(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    r = Rand(random.Random(f"structured-{fmt}"))
    ran = bad = good = 0
    t0 = time.perf_counter()
    for _ in range(SEEDED_PER_PARSER):
        case = gen(r)
        check_structured(case, parser.parse(case.text))
        ran += 1
        bad += len(case.bad)
        good += len(case.calls)
    assert ran == SEEDED_PER_PARSER
    assert bad > SEEDED_PER_PARSER // 2 and good > SEEDED_PER_PARSER  # the generator exercises both
    print(f"{fmt}: {ran} structured cases, {good} good calls, {bad} malformed, {time.perf_counter() - t0:.1f}s")


@pytest.mark.parametrize("fmt", NATIVE)
def test_mutated_seeded(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    r = Rand(random.Random(f"mutated-{fmt}"))
    ran = 0
    while ran < MUTATED_PER_PARSER:
        base = gen(r).text
        if r.chance(0.3):  # mixed formats: another format's output spliced in
            other = GENERATORS[r.choice(NATIVE)](r).text
            cut = r.randint(0, len(base))
            base = base[:cut] + other + base[cut:]
        for _ in range(MUTANTS_PER_BASE):
            check_mutated(fmt, parser, mutate(r, base), twice=ran % 10 == 0)
            ran += 1
    assert ran == MUTATED_PER_PARSER


@pytest.mark.parametrize("fmt", NATIVE)
def test_structured_hypothesis(fmt):
    parser = get_parser(fmt)
    gen = GENERATORS[fmt]
    count = 0

    @settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, database=None, derandomize=True,
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
    assert count >= HYPOTHESIS_EXAMPLES


@pytest.mark.parametrize("fmt", NATIVE)
def test_total_cases_per_parser(fmt):
    """The volume the brief asks for: at least 10,000 generated outputs per parser."""
    assert SEEDED_PER_PARSER + MUTATED_PER_PARSER + HYPOTHESIS_EXAMPLES >= 10_000


@pytest.mark.parametrize("fmt", NATIVE)
def test_megabyte_argument_between_malformed_calls(fmt):
    parser = get_parser(fmt)
    args = {"blob": "\\\"{[" * (1 << 18), "n": int("9" * 4000)}
    good = parser.format_calls([{"name": "big", "arguments": args}, {"name": "small", "arguments": {"x": 1}}])
    prefix = {"hermes": "<tool_call>\n{bad\n</tool_call>", "hunyuan": "<tool_calls>[{bad}]</tool_calls>",
              "llama3_json": "", "mistral": "[TOOL_CALLS]f[ARGS]{bad"}[fmt]
    suffix = {"hermes": '<tool_call>\n{"name": "t", "arguments": {"x": NaN}}', "hunyuan": "<tool_calls>[{",
              "llama3_json": '; {"name": "t", "parameters": {"x": NaN}}', "mistral": "[TOOL_CALLS]t[ARGS]{"}[fmt]
    text = prefix + good + suffix
    res = parser.parse(text)
    check_safety(text, res)
    assert [c.name for c in res.tool_calls] == ["big", "small"]
    assert res.tool_calls[0].arguments == args
    # the bad call before, the bad one after (hunyuan: plus its unclosed block; llama: the NaN
    # call only, as text before a call without <|python_tag|> is not read)
    assert len(res.errors) == {"hermes": 2, "hunyuan": 3, "llama3_json": 1, "mistral": 2}[fmt]


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
    from backend.tokenizers import load_tokenizer

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
            assert _check_adapter(parser, _adapter_texts(ADAPTER_CASES)) == ADAPTER_CASES
        finally:
            logging.getLogger("vllm").setLevel(logging.NOTSET)


def test_transformers_adapter_never_raises(qwen_tokenizer):
    parser = get_parser("transformers", tokenizer=qwen_tokenizer)
    assert _check_adapter(parser, _adapter_texts(ADAPTER_CASES)) == ADAPTER_CASES
