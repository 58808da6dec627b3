"""Per tool-call format: parse time vs vLLM's parser, and tool_choice grammar build + compile.

Parse time against vLLM's parser on the same outputs, and tool_choice grammar build + compile
on real-world tool schemas.

**Parse** (``parse``): for every native format with a vLLM twin, ``--turns`` well-formed model
outputs are generated deterministically (1-3 calls to the real-world tools below, arguments drawn
from their schemas: unicode and escapes in strings, numbers, nested objects and arrays; content
and reasoning text where the format has them), written with the format's ``format_calls`` (Mistral:
tekken v3's ``[TOOL_CALLS][...]``, no space, 9-character ids). Timed over the same texts,
interleaved (the order alternates each repetition), best and median of ``--reps``:

* ours: ``get_parser(fmt, tools=TOOLS).parse(text)`` (reasoning, content, calls, spans, errors);
* vLLM: ``extract_tool_calls(text, request)`` of one parser instance built once with the family's
  tokenizer wrapped as a vLLM server wraps it (``get_cached_tokenizer``; Mistral: vLLM's
  ``MistralTokenizer`` over mistral-common's tekken file); building a parser, which a server does
  per request, is timed apart as ``vllm_new_us``;
* Harmony: vLLM's ``openai`` tool parser is a stub (the Harmony path of a server decodes tokens),
  so the baseline is openai-harmony's ``parse_messages_from_completion_tokens`` on the ids
  (``backend.families.gpt_oss.harmony_encoding()``; the encoding of the text is not timed).

Agreement: the calls (name, arguments as JSON values) of ours and of vLLM (fresh parser per text,
as our ``vllm:`` adapter runs it) on every text; each disagreement is listed with the first text.

**Grammar** (``grammar``): for every format, ``build_constraint("required", fmt, TOOLS)`` and
``build_constraint(<tool>, fmt, TOOLS)`` for each of the tools (our EBNF, with xgrammar's JSON
Schema conversion inside), then ``xgrammar.GrammarCompiler(info).compile_grammar(spec)`` with a new
compiler per grammar: a cold compile (``TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))``
is built once per tokenizer and not timed). Tokenizers: the family's offline profile (GLM, Kimi,
pythonic, Granite, Phi-4: Qwen3's with the formats' tags added, as the parser tests do; Mistral:
``from_huggingface`` refuses ``MistralCommonBackend``, so the ``TokenizerInfo`` is built as vLLM's
xgrammar backend builds it for its ``MistralTokenizer``, and the row says so). ``--reps`` builds of
each grammar, the best kept; median and max over the grammars of a format.

    .venv/bin/python bench/bench_formats.py [--only parse|grammar] [--turns 300] [--reps 3] [--formats hermes,mistral]
        [--no-string-formats] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.parsers import get_parser, tool_call_formats  # noqa: E402


def fn(name: str, description: str, properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


S = {"type": "string"}
TOOLS: list[dict[str, Any]] = [
    fn("get_weather", "Current weather and forecast for a place.", {
        "location": {"type": "string", "description": "City and country, e.g. 'Paris, France'"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    }, ["location"]),
    fn("web_search", "Search the web.", {
        "query": S,
        "num_results": {"type": "integer", "minimum": 1, "maximum": 50},
        "recency": {"type": "string", "enum": ["day", "week", "month", "year", "any"]},
        "site": {"type": "string", "description": "restrict to this domain"},
        "safe_search": {"type": "boolean"},
    }, ["query"]),
    fn("create_calendar_event", "Create a calendar event.", {
        "title": S,
        "start": {"type": "string", "format": "date-time"},
        "end": {"type": "string", "format": "date-time"},
        "location": {"type": "object", "properties": {"name": S, "address": S, "room": S}, "required": ["name"]},
        "attendees": {"type": "array", "items": {"type": "object", "properties": {
            "email": {"type": "string", "format": "email"}, "name": S, "optional": {"type": "boolean"}}, "required": ["email"]}},
        "reminders_min": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10080}},
    }, ["title", "start", "end"]),
    fn("execute_code", "Run code in a sandbox and return stdout, stderr and the exit code.", {
        "language": {"type": "string", "enum": ["python", "javascript", "bash"]},
        "code": S,
        "timeout_s": {"type": "number", "minimum": 0, "maximum": 300},
        "stdin": S,
    }, ["language", "code"]),
    fn("run_sql", "Run a read-only SQL query.", {
        "query": S,
        "database": {"type": "string", "enum": ["analytics", "billing", "users"]},
        "params": {"type": "array", "items": {"type": ["string", "number", "null"]}},
        "max_rows": {"type": "integer", "minimum": 1, "maximum": 10000},
    }, ["query", "database"]),
    fn("read_file", "Read a text file.", {
        "path": S,
        "encoding": {"type": "string", "enum": ["utf-8", "latin-1", "utf-16"]},
        "offset": {"type": "integer", "minimum": 0},
        "limit": {"type": "integer", "minimum": 1},
    }, ["path"]),
    fn("write_file", "Write (or append to) a text file.", {
        "path": S, "content": S,
        "mode": {"type": "string", "enum": ["overwrite", "append"]},
        "create_dirs": {"type": "boolean"},
    }, ["path", "content"]),
    fn("send_email", "Send an email.", {
        "to": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1},
        "subject": S, "body": S,
        "cc": {"type": "array", "items": {"type": "string", "format": "email"}},
        "bcc": {"type": "array", "items": {"type": "string", "format": "email"}},
        "reply_to": {"type": "string", "format": "email"},
        "attachments": {"type": "array", "items": {"type": "object", "properties": {"filename": S, "url": S},
                                                   "required": ["filename", "url"]}},
        "priority": {"type": "string", "enum": ["low", "normal", "high"]},
    }, ["to", "subject", "body"]),
    fn("set_reminder", "Remind the user of something at a time or after a delay.", {
        "text": S,
        "when": {"anyOf": [
            {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}, "required": ["at"]},
            {"type": "object", "properties": {"in_minutes": {"type": "integer", "minimum": 1}}, "required": ["in_minutes"]},
        ]},
        "repeat": {"anyOf": [{"type": "string", "enum": ["daily", "weekly"]}, {"type": "null"}]},
    }, ["text", "when"]),
    fn("get_current_time", "The current date and time.", {}),
    fn("book_flight", "Book a flight.", {
        "origin": S, "destination": S,
        "departure_date": {"type": "string", "format": "date"},
        "return_date": {"type": "string", "format": "date"},
        "adults": {"type": "integer", "minimum": 1, "maximum": 9},
        "children": {"type": "integer", "minimum": 0, "maximum": 8},
        "infants": {"type": "integer", "minimum": 0, "maximum": 4},
        "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]},
        "max_stops": {"type": "integer", "minimum": 0, "maximum": 3},
        "max_price": {"type": "number", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
        "flexible_dates": {"type": "boolean"},
        "preferred_airlines": {"type": "array", "items": S},
        "seat_preference": {"type": "string", "enum": ["window", "aisle", "any"]},
        "loyalty_number": S,
    }, ["origin", "destination", "departure_date", "adults"]),
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# Strings a model writes in arguments: unicode (accents, CJK, emoji, RTL), quotes, backslashes,
# newlines and tabs, markup and JSON-looking text. None has leading or trailing whitespace, and none
# holds a format's own tags (the XML formats could not write it back).
STRINGS = [
    "Paris, France", "São Paulo", "Zürich", "東京都", "北京 天气", "Ελλάδα", "القاهرة", "emoji 😀🚀 ok", "naïve café",
    'say "hello"', "C:\\Users\\me\\notes.txt", "line one\nline two", "col1\tcol2", "<b>bold</b> & more",
    '{"not": "an object"}', "[1, 2", "50% off — today only", "a/b/c?x=1&y=2", "SELECT * FROM t WHERE name = 'O''Brien'",
    "print('hi')\nfor i in range(3):\n    print(i)", "Ünïcödé ñ 中文 日本語 한국어", "tab\tand \\n literal",
]
EMAILS = ["ana@example.com", "bo.li@例え.jp", "x+tag@mail.example.org", "müller@example.de"]
DATES = ["2026-11-25", "2027-01-03", "2026-12-31"]
DATETIMES = ["2026-11-25T09:30:00Z", "2026-12-01T18:00:00+01:00", "2027-02-28T23:59:59-08:00"]
REASONING = ["The user wants the weather; call get_weather first.", "需要先查询，然后回答。\nTwo steps.",
             "Check: x < y and {\"a\": 1} is data, not a call."]
CONTENT = ["Let me check that.", "好的，我来查一下。", "Sure — one moment 😀", "I'll run two tools:\n- first\n- second"]


def gen_value(r: random.Random, schema: dict[str, Any], key: str = "") -> Any:
    if "anyOf" in schema:
        return gen_value(r, r.choice(schema["anyOf"]), key)
    if "enum" in schema:
        return r.choice(schema["enum"])
    t = schema.get("type", "string")
    if isinstance(t, list):
        t = r.choice(t)
    if t == "null":
        return None
    if t == "boolean":
        return r.random() < 0.5
    if t == "integer":
        lo, hi = schema.get("minimum", -1000), schema.get("maximum", 10**9)
        return r.randint(lo, min(hi, lo + 10**6))
    if t == "number":
        lo, hi = schema.get("minimum", -1e6), schema.get("maximum", 1e6)
        return r.choice([round(r.uniform(lo, hi), 2), float(r.randint(int(lo), int(min(hi, lo + 100)))) + 0.5, lo + 0.25])
    if t == "array":
        lo = schema.get("minItems", 0)
        return [gen_value(r, schema.get("items", S), key) for _ in range(r.randint(lo, max(lo, 3)))]
    if t == "object":
        return gen_object(r, schema)
    fmt = schema.get("format")
    if fmt == "email":
        return r.choice(EMAILS)
    if fmt == "date":
        return r.choice(DATES)
    if fmt == "date-time":
        return r.choice(DATETIMES)
    return r.choice(STRINGS)


def gen_object(r: random.Random, schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    req = set(schema.get("required", []))
    return {k: gen_value(r, s, k) for k, s in props.items() if k in req or r.random() < 0.6}


def gen_calls(r: random.Random) -> list[dict[str, Any]]:
    out = []
    for _ in range(r.choice([1, 1, 2, 3])):
        name = r.choice(list(TOOL_SCHEMAS))
        out.append({"name": name, "arguments": gen_object(r, TOOL_SCHEMAS[name]),
                    "id": "".join(r.choice("abcdefghijkABCDEFGHIJK0123456789") for _ in range(9))})
    return out


# ---- per format: the text a model writes, and vLLM's side ------------------------------------------

KIMI_ETC_TAGS = ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
                 "<|tool_call_argument_begin|>", "<|tool_call|>", "<|python_start|>", "<|python_end|>"]
GLM_TAGS = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]


def turn_text(fmt: str, r: random.Random, calls: list[dict[str, Any]]) -> str:
    """A well-formed turn in ``fmt``: the calls, with content / reasoning where the format has them."""
    body = get_parser(fmt).format_calls(calls)
    reasoning = r.choice(REASONING) if r.random() < 0.4 else None
    content = r.choice(CONTENT) if r.random() < 0.5 else ""
    if fmt in ("hermes", "qwen3_xml"):
        return (f"<think>\n{reasoning}\n</think>\n\n" if reasoning else "") + (content + "\n\n" if content else "") + body
    if fmt in ("deepseek_v3", "deepseek_v31"):
        return (f"<think>{reasoning}</think>" if reasoning else "") + content + body
    if fmt == "glm45":
        return (f"\n<think>{reasoning}</think>" if reasoning else "\n<think></think>") + ("\n" + content if content else "") + "\n" + body
    if fmt in ("kimi_k2", "granite", "hunyuan"):
        return (content + " " if content else "") + body
    if fmt == "mistral":  # tekken v3 (mistral-common): no space after [TOOL_CALLS], no text with calls
        return body.replace("[TOOL_CALLS] [", "[TOOL_CALLS][", 1)
    if fmt == "llama3_json":
        return ("<|python_tag|>" if r.random() < 0.5 else "") + body
    if fmt == "harmony":
        pre = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
        if content:
            pre += f"<|channel|>commentary<|message|>{content}<|end|><|start|>assistant"
        return pre + body
    return body  # pythonic, phi4_mini_json: the turn is the call list


# format -> [(vLLM parser name, tokenizer key)]; one row per distinct vLLM class
VLLM_TWINS: dict[str, list[tuple[str, str]]] = {
    "hermes": [("hermes", "qwen3")],
    "qwen3_xml": [("qwen3_coder", "qwen3.5")],
    "llama3_json": [("llama3_json", "llama3")],
    "mistral": [("mistral", "mistral")],
    "deepseek_v3": [("deepseek_v3", "deepseek-v3")],
    "deepseek_v31": [("deepseek_v31", "deepseek-v3")],
    "glm45": [("glm45", "qwen3+tags")],
    "kimi_k2": [("kimi_k2", "qwen3+tags")],
    "pythonic": [("pythonic", "qwen3+tags"), ("llama4_pythonic", "qwen3+tags")],
    "granite": [("granite", "qwen3+tags")],
    "phi4_mini_json": [("phi4_mini_json", "qwen3+tags")],
    "hunyuan": [("hunyuan_a13b", "qwen3")],
    "harmony": [("openai-harmony", "gpt-oss")],
}
# format -> profile whose tokenizer compiles its grammar ("qwen3+tags": Qwen3 with the format's tags added)
GRAMMAR_TOKENIZERS: dict[str, list[str]] = {
    "hermes": ["qwen3"], "qwen3_xml": ["qwen3", "qwen3.5"], "llama3_json": ["llama3"], "harmony": ["gpt-oss"],
    "deepseek_v3": ["deepseek-v3"], "deepseek_v31": ["deepseek-v3"], "mistral": ["mistral"], "glm45": ["qwen3+tags"],
    "kimi_k2": ["qwen3+tags"], "pythonic": ["qwen3+tags"], "granite": ["qwen3+tags"], "phi4_mini_json": ["qwen3+tags"],
    "hunyuan": ["qwen3"],
}

_TOKS: dict[str, Any] = {}


def tokenizer(key: str) -> Any:
    if key not in _TOKS:
        from backend.loading.tokenizers import load_tokenizer

        if key == "qwen3+tags":  # these families have no offline vocabulary (as the parser tests do)
            t = copy.deepcopy(load_tokenizer("qwen3").tokenizer)
            t.add_tokens(KIMI_ETC_TAGS, special_tokens=True)
            t.add_tokens(GLM_TAGS)
            _TOKS[key] = t
        elif key == "vllm-mistral":
            from vllm.tokenizers.mistral import MistralTokenizer

            from backend.families.mistral import mistral_tokenizer
            _TOKS[key] = MistralTokenizer(mistral_tokenizer())
        else:
            _TOKS[key] = load_tokenizer(key).tokenizer
    return _TOKS[key]


def canon(calls: list[tuple[Any, Any]]) -> str:
    return json.dumps(calls, sort_keys=True, ensure_ascii=False)


class VllmSide:
    """vLLM's parser for one format: ``extract(text)`` -> [(name, arguments)]."""

    def __init__(self, vname: str, tok_key: str) -> None:
        self.vname = vname
        if vname == "openai-harmony":
            from openai_harmony import Role

            from backend.families.gpt_oss import harmony_encoding
            self.enc, self.role = harmony_encoding(), Role.ASSISTANT
            return
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        if tok_key == "mistral":
            self.tok = tokenizer("vllm-mistral")
        else:  # as a vLLM server holds it: vocabulary and special ids cached (get_vocab() is not free)
            from vllm.tokenizers.hf import get_cached_tokenizer
            self.tok = get_cached_tokenizer(tokenizer(tok_key))
        self.req = ChatCompletionRequest(model="bench", messages=[], tools=TOOLS)
        self.cls = ToolParserManager.get_tool_parser(vname)
        self.parser = self.new()

    def new(self) -> Any:
        try:
            return self.cls(self.tok, self.req.tools)
        except TypeError:
            return self.cls(self.tok)

    def prepare(self, text: str) -> Any:
        """What the timed call takes: the text, or Harmony's ids."""
        return self.enc.encode(text, allowed_special="all") if self.vname == "openai-harmony" else text

    def run(self, x: Any, fresh: bool = False) -> Any:
        if self.vname == "openai-harmony":
            return self.enc.parse_messages_from_completion_tokens(x, self.role)
        return (self.new() if fresh else self.parser).extract_tool_calls(x, self.req)

    def calls(self, out: Any) -> list[tuple[Any, Any]]:
        if self.vname == "openai-harmony":
            got = []
            for m in out:
                if m.recipient and m.recipient.startswith("functions."):
                    got.append((m.recipient.removeprefix("functions."), _loads("".join(c.text for c in m.content))))
            return got
        return [(c.function.name, _loads(c.function.arguments)) for c in out.tool_calls or []]


def _loads(s: Any) -> Any:
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return ("<not JSON>", s)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_parse(formats: list[str], turns: int, reps: int) -> list[dict[str, Any]]:
    rows = []
    for fmt in formats:
        for vname, tok_key in VLLM_TWINS.get(fmt, []):
            r = random.Random(f"bench-formats-{fmt}")
            cases = [gen_calls(r) for _ in range(turns)]
            texts = [turn_text(fmt, r, cs) for cs in cases]
            if vname == "llama4_pythonic":  # Llama 4 wraps the list in <|python_start|>...<|python_end|> (half of them)
                texts = [f"<|python_start|>{t}<|python_end|>" if k % 2 else t for k, t in enumerate(texts)]
            ours_p = get_parser(fmt, tools=TOOLS)
            t0 = time.perf_counter()
            theirs = VllmSide(vname, tok_key)
            new_us = None
            if vname != "openai-harmony":
                t0 = time.perf_counter()
                for _ in range(20):
                    theirs.new()
                new_us = (time.perf_counter() - t0) / 20 * 1e6
            inputs = [theirs.prepare(t) for t in texts]
            # agreement (untimed): ours vs a fresh vLLM parser per text, and vs the calls written
            disagree, not_as_written, reuse_differs, our_errors, examples = 0, 0, 0, 0, []
            ours_res = [ours_p.parse(t) for t in texts]
            reused = [theirs.run(x) for x in inputs]
            for k, (t, x) in enumerate(zip(texts, inputs)):
                mine = [(c.name, c.arguments) for c in ours_p.parse(t).tool_calls]
                fresh = theirs.calls(theirs.run(x, fresh=True))
                want = [(c["name"], c["arguments"]) for c in cases[k]]
                our_errors += bool([e for e in ours_res[k].errors if e.severity == "error"])
                not_as_written += canon(mine) != canon(want)
                reuse_differs += canon(theirs.calls(reused[k])) != canon(fresh)
                if canon(mine) != canon(fresh):
                    disagree += 1
                    if len(examples) < 3:
                        examples.append({"text": t, "ours": mine, "vllm": fresh})
            # timing: ours and vLLM over the same texts, interleaved, order alternating
            t_ours, t_vllm = [], []
            for rep in range(reps):
                order = [("ours", None), ("vllm", None)]
                if rep % 2:
                    order.reverse()
                for who, _ in order:
                    if who == "ours":
                        t0 = time.perf_counter()
                        for t in texts:
                            ours_p.parse(t)
                        t_ours.append((time.perf_counter() - t0) / turns * 1e6)
                    else:
                        t0 = time.perf_counter()
                        for x in inputs:
                            theirs.run(x)
                        t_vllm.append((time.perf_counter() - t0) / turns * 1e6)
            row = {
                "format": fmt, "vllm": vname, "turns": turns,
                "calls": sum(len(c) for c in cases), "chars_per_turn": round(sum(map(len, texts)) / turns),
                "ours_us_best": round(min(t_ours), 1), "ours_us_median": round(statistics.median(t_ours), 1),
                "vllm_us_best": round(min(t_vllm), 1), "vllm_us_median": round(statistics.median(t_vllm), 1),
                "ratio_best": round(min(t_ours) / min(t_vllm), 2),
                "ratio_median": round(statistics.median(t_ours) / statistics.median(t_vllm), 2),
                "vllm_new_us": round(new_us, 1) if new_us is not None else None,
                "disagreements": disagree, "ours_not_as_written": not_as_written, "ours_error_turns": our_errors,
                "vllm_reused_differs": reuse_differs, "examples": examples, "load": load(),
            }
            rows.append(row)
            print(f"{fmt:15} {vname:16} ours {row['ours_us_best']:8.1f} us  vLLM {row['vllm_us_best']:8.1f} us  "
                  f"ratio {row['ratio_best']:5.2f} (median {row['ratio_median']:5.2f})  disagree {disagree}  "
                  f"[{row['load']}]", file=sys.stderr)
    return rows


def without_string_formats(node: Any) -> Any:
    """The schemas without ``"format"`` (email, date, date-time): xgrammar turns each into a regex."""
    if isinstance(node, dict):
        return {k: without_string_formats(v) for k, v in node.items() if k != "format"}
    if isinstance(node, list):
        return [without_string_formats(v) for v in node]
    return node


def bench_grammar(formats: list[str], reps: int, string_formats: bool = True) -> list[dict[str, Any]]:
    import xgrammar as xgr

    from backend.tool_choice import ToolChoiceError, build_constraint

    tools = TOOLS if string_formats else without_string_formats(TOOLS)
    rows = []
    infos: dict[str, Any] = {}
    for fmt in formats:
        for tok_key in GRAMMAR_TOKENIZERS[fmt]:
            if tok_key not in infos:
                tok = tokenizer(tok_key)
                t0 = time.perf_counter()
                try:
                    infos[tok_key] = (xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)), time.perf_counter() - t0, None)
                except Exception as e:  # noqa: BLE001 - MistralCommonBackend: reported, then built as vLLM builds it
                    why = f"from_huggingface: {type(e).__name__}: {str(e)[:160]}"
                    info = None
                    if tok_key == "mistral":
                        vt = tokenizer("vllm-mistral")
                        t0 = time.perf_counter()
                        info = xgr.TokenizerInfo(  # vllm/v1/structured_output/backend_xgrammar.py, Mistral branch
                            encoded_vocab=vt.vocab, vocab_type=xgr.VocabType.RAW if vt.is_tekken else xgr.VocabType.BYTE_FALLBACK,
                            vocab_size=len(vt.vocab), stop_token_ids=[vt.eos_token_id], add_prefix_space=True)
                        why += "; TokenizerInfo built as vLLM's xgrammar backend builds it for a MistralTokenizer"
                    infos[tok_key] = (info, time.perf_counter() - t0, why)
            info, info_s, why = infos[tok_key]
            if info is None:
                rows.append({"format": fmt, "tokenizer": tok_key, "skipped": why, "load": load()})
                print(f"{fmt:15} {tok_key:12} skipped: {why}", file=sys.stderr)
                continue
            builds, compiles, totals, per_choice, refused = [], [], [], {}, {}
            for choice in ["required", *TOOL_SCHEMAS]:
                bs, cs = [], []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    try:
                        c = build_constraint(choice, fmt, tools)
                    except ToolChoiceError as e:  # a schema the format's grammar cannot express: reported
                        refused[choice] = str(e)
                        break
                    t1 = time.perf_counter()
                    xgr.GrammarCompiler(info, cache_enabled=False).compile_grammar(c.spec)
                    t2 = time.perf_counter()
                    bs.append((t1 - t0) * 1e3)
                    cs.append((t2 - t1) * 1e3)
                if choice in refused:
                    continue
                b, k = min(bs), min(cs)
                builds.append(b)
                compiles.append(k)
                totals.append(b + k)
                per_choice[choice] = round(b + k, 1)
            if not totals:
                rows.append({"format": fmt, "tokenizer": tok_key, "skipped": "every grammar refused", "refused": refused, "load": load()})
                print(f"{fmt:15} {tok_key:12} every grammar refused: {next(iter(refused.values()))}", file=sys.stderr)
                continue
            row = {
                "format": fmt, "tokenizer": tok_key, "string_formats": string_formats, "vocab": info.vocab_size, "tokenizer_info_s": round(info_s, 2),
                "grammars": len(totals),
                "build_ms_median": round(statistics.median(builds), 1), "build_ms_max": round(max(builds), 1),
                "compile_ms_median": round(statistics.median(compiles), 1), "compile_ms_max": round(max(compiles), 1),
                "total_ms_median": round(statistics.median(totals), 1), "total_ms_max": round(max(totals), 1),
                "required_ms": per_choice.get("required"), "slowest": max(per_choice, key=per_choice.get),
                "per_choice_ms": per_choice, "refused": refused, "note": why, "load": load(),
            }
            rows.append(row)
            print(f"{fmt:15} {tok_key:12} build {row['build_ms_median']:6.1f}/{row['build_ms_max']:6.1f} ms  compile "
                  f"{row['compile_ms_median']:6.1f}/{row['compile_ms_max']:6.1f} ms  total median {row['total_ms_median']:6.1f} "
                  f"max {row['total_ms_max']:6.1f} ({row['slowest']})  refused {len(refused)}  [{row['load']}]", file=sys.stderr)
    return rows


def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["parse", "grammar"], help="run one part (default: both)")
    ap.add_argument("--turns", type=int, default=300, help="generated turns per format (parse)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (parse: passes over the turns; grammar: builds per grammar, best kept)")
    ap.add_argument("--formats", default="", help="comma-separated formats (default: all)")
    ap.add_argument("--no-string-formats", action="store_true",
                    help="grammar: drop the schemas' \"format\" keywords (email, date, date-time) to see what they cost")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()] or list(tool_call_formats())
    unknown = [f for f in formats if f not in tool_call_formats()]
    if unknown:
        ap.error(f"unknown formats {unknown}; known: {', '.join(tool_call_formats())}")
    logging.disable(logging.CRITICAL)  # vLLM's parsers log every call they cannot read
    out: dict[str, Any] = {"load_start": load()}
    if args.only in (None, "parse"):
        out["parse"] = bench_parse(formats, args.turns, args.reps)
    if args.only in (None, "grammar"):
        out["grammar"] = bench_grammar(formats, args.reps, string_formats=not args.no_string_formats)
    out["load_end"] = load()
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        for r in out.get("parse", []):
            print(f"{r['format']:15} vs {r['vllm']:16} ours {r['ours_us_best']:8.1f} us/turn  vLLM {r['vllm_us_best']:8.1f} us/turn  "
                  f"ours/vLLM {r['ratio_best']:5.2f}  disagreements {r['disagreements']}/{r['turns']}")
            for ex in r["examples"][:1]:
                print(f"    e.g. {ex['text'][:300]!r}\n      ours {str(ex['ours'])[:300]}\n      vLLM {str(ex['vllm'])[:300]}")
        for r in out.get("grammar", []):
            if "skipped" in r:
                print(f"{r['format']:15} {r['tokenizer']:12} skipped: {r['skipped']} {next(iter(r.get('refused', {}).values()), '')}")
            else:
                print(f"{r['format']:15} {r['tokenizer']:12} build median {r['build_ms_median']:5.1f} max {r['build_ms_max']:5.1f} ms  "
                      f"compile median {r['compile_ms_median']:6.1f} max {r['compile_ms_max']:6.1f} ms  build+compile median "
                      f"{r['total_ms_median']:6.1f} max {r['total_ms_max']:6.1f} ms  required {r['required_ms']} ms")
                if r["refused"]:
                    print(f"    refused {len(r['refused'])} of {len(r['refused']) + r['grammars']}: {', '.join(r['refused'])} "
                          f"({next(iter(r['refused'].values()))})")
        print(f"{out['load_start']} -> {out['load_end']}")
    return out


if __name__ == "__main__":
    main()
