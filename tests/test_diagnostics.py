"""Diagnostics: every code has a trace that triggers it and one that does not. The seed-001
weather run (real engine, scripted model, qwen3 profile) must show the measured drift (247 vs
249 tokens, the missing '\\n' after '<|im_end|>') and mask mismatch (25/28/16 vs 26/28/17)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from cli_inprocess import run_cli

from backend.checks.diagnostics import CODES, check, summarize
from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.trace import ToolResult, Trace
from backend.trace.model import StepInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")

SEATTLE = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL_SEATTLE = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
ANSWER = "The current temperature in Seattle, WA, USA is 72°F."


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
    """
    return {"temperature": 72, "city": city}


def long_text(n: int):
    """Returns n characters.

    Args:
        n: how many
    """
    return "x" * n


def registry(functions):
    """The project's ToolRegistry; a minimal stand-in with the same interface if it is absent."""
    try:
        from backend.tools import ToolRegistry
    except ImportError:  # pragma: no cover - only while backend.tools is being written
        from transformers.utils import get_json_schema

        table = {f.__name__: f for f in functions}

        class _Reg:
            schemas = [get_json_schema(f) for f in functions]

            def __len__(self):
                return len(self.schemas)

            async def execute(self, call, max_response_length=None, **kw):
                fn = table.get(call.name)
                if fn is None:
                    return ToolResult(call_id=call.id, name=call.name, ok=False, error="unknown_tool", content=f"Error: unknown tool {call.name!r}")
                out = fn(**call.arguments)
                text = out if isinstance(out, str) else json.dumps(out)
                cut = max_response_length is not None and len(text) > max_response_length
                return ToolResult(call_id=call.id, name=call.name, content=text[:max_response_length] if cut else text, truncated=cut, original_length=len(text) if cut else None)

        return _Reg()
    return ToolRegistry.from_functions(functions)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def run_loop(bundle, script, functions=(get_current_temperature,), messages=SEATTLE, **cfg) -> Trace:
    gen = ScriptedGenerator(bundle.tokenizer, script)
    loop = AgentLoop(gen, bundle, tools=registry(list(functions)), config=LoopConfig(**cfg))
    return asyncio.run(loop.run(messages))


@pytest.fixture(scope="module")
def seed001(qwen3) -> Trace:
    """The seed's run as verl < 0.9 built it (tool_turns legacy): the '\\n' after <|im_end|>
    missing at the tool boundary."""
    return run_loop(qwen3, [CALL_SEATTLE, ANSWER], tool_turns="legacy")


@pytest.fixture(scope="module")
def seed001_continuous(qwen3) -> Trace:
    return run_loop(qwen3, [CALL_SEATTLE, ANSWER])


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def only(findings, code):
    return [f for f in findings if f.code == code]


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def trace(messages, tools=None, **kw) -> Trace:
    return Trace(messages=messages, tools=tools or [], **kw)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}


def asst_call(name="get_weather", args=None, cid="c1"):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": {"city": "Oslo"} if args is None else args}}]}


GOOD = [
    {"role": "user", "content": "Weather in Oslo?"},
    asst_call(),
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "3C"},
    {"role": "assistant", "content": "It is 3C."},
]


# ---- the seed-001 run ---------------------------------------------------------------------------


def test_seed001_shape(seed001):
    assert len(seed001.prompt_ids) == 178 and len(seed001.input_ids) == 247


def test_seed001_dropped_turn_separator(seed001, qwen3):
    fs = check(seed001, qwen3)
    (d,) = only(fs, "dropped_turn_separator")
    # the '\n' after <|im_end|> that verl < 0.9 drops at the tool boundary: a warning, at it
    assert d.severity == "warning"
    assert "verl PR #6921" in d.message and "'<|im_end|>\\n'" in d.message
    assert d.details["position"] == 203 and d.details["separator"] == "\n"
    assert d.details["separator_ids"] == qwen3.tokenizer.encode("\n", add_special_tokens=False)
    assert d.location.token == 203 and d.location.step == 2  # the tool turn starts where the '\n' is missing
    assert d.details["tool_turns"] == "legacy"
    # the '\n' after the last turn is no finding (nothing follows it), and nothing else drifts
    assert not only(fs, "retokenization_drift")


def test_seed001_continuous_has_no_drift(seed001_continuous, qwen3):
    fs = check(seed001_continuous, qwen3)
    assert not only(fs, "dropped_turn_separator") and not only(fs, "retokenization_drift")
    (m,) = only(fs, "mask_mismatch")  # trl's training mask counts the inserted '\n' as assistant: explained
    assert m.severity == "info" and m.details["expected"] is True
    assert [p["loop_token"] for p in m.details["positions"]] == [203, None]
    assert m.details["positions"][0]["loop_mask"] == 0 and m.details["positions"][0]["training_mask"] == 1


def test_seed001_mask_mismatch(seed001, qwen3):
    fs = check(seed001, qwen3)
    (m,) = only(fs, "mask_mismatch")
    assert m.details["training_template"] == "qwen3_instruct_2507_training"
    assert m.details["loop_runs"] == [[1, 25], [0, 28], [1, 16]]
    assert m.details["training_runs"] == [[1, 26], [0, 28], [1, 17]]
    assert "25/28/16" in m.message and "26/28/17" in m.message
    # every loop that stops at EOS has this: one explained info, not a warning on every run
    assert m.severity == "info" and m.details["expected"] is True
    assert "'\\n' it writes after '<|im_end|>'" in m.message
    pos = m.details["positions"]
    assert [p["render_token"] for p in pos] == [203, 248]
    assert all(p["token"] == "\n" and p["training_mask"] == 1 and p["loop_mask"] is None for p in pos)
    assert m.location.step == 1 and m.location.token == 202  # the <|im_end|> the '\n' should follow


def test_seed001_has_nothing_else(seed001, qwen3):
    assert codes(check(seed001, qwen3)) == {"dropped_turn_separator", "mask_mismatch"}
    assert check(seed001) == []  # structurally clean


def test_no_drift_and_no_mask_warning_when_ids_are_the_render(seed001, qwen3):
    """The re-render itself (ids of the full template render, the mask as generation gives it:
    through each <|im_end|>) has no drift and no mask warning; its mask differs from the training
    template's only by the '\\n' after each <|im_end|>, which trl counts as assistant: the expected
    difference, info (issue 42: the import had those at 1, and the mask audit warned)."""
    from backend.importers import import_records

    res = import_records([{"messages": seed001.messages, "tools": seed001.tools}], "openai-chat", bundle=qwen3)
    t = res.traces[0]
    fs = check(t, qwen3)
    assert not codes(fs) & {"retokenization_drift", "mask_structure"}, [f.message for f in fs]
    assert not [f for f in fs if f.severity != "info"], [f.message for f in fs]
    (m,) = only(fs, "mask_mismatch")
    assert m.severity == "info" and m.details["expected"]
    assert [(p["token"], p["loop_mask"], p["training_mask"]) for p in m.details["positions"]] == [("\n", 0, 1)] * 2


# ---- structural codes: trigger / clean ----------------------------------------------------------


def test_orphan_tool_message_seed000_style():
    t = trace([{"role": "user", "content": "Weather in Auckland"}, {"role": "tool", "content": "{\"t\": 16.4}"}, {"role": "assistant", "content": "16.4C"}], [WEATHER])
    (f,) = only(check(t), "orphan_tool_message")
    assert f.severity == "error" and f.location.message == 1
    assert "no assistant tool call precedes it" in f.message


def test_orphan_tool_message_unknown_id_and_extra_message():
    t = trace([GOOD[0], GOOD[1], {"role": "tool", "tool_call_id": "zzz", "content": "?"}, GOOD[3]], [WEATHER])
    assert "zzz" in only(check(t), "orphan_tool_message")[0].message
    t2 = trace([GOOD[0], {**GOOD[1], "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, GOOD[3]], [WEATHER])
    fs = only(check(t2), "orphan_tool_message")
    assert len(fs) == 1 and fs[0].location.message == 3


def test_no_orphan_in_a_good_conversation():
    assert check(trace(GOOD, [WEATHER])) == []


def test_tool_call_without_response():
    t = trace(GOOD[:2], [WEATHER])
    (f,) = only(check(t), "tool_call_without_response")
    assert f.severity == "warning" and f.location.message == 1 and f.details["id"] == "c1"
    t.termination_reason = "max_assistant_turns"
    assert only(check(t), "tool_call_without_response")[0].severity == "info"
    assert not only(check(trace(GOOD, [WEATHER])), "tool_call_without_response")


def test_unknown_tool():
    t = trace([GOOD[0], asst_call("get_wether"), {**GOOD[2], "name": "get_wether"}, GOOD[3]], [WEATHER])
    (f,) = only(check(t), "unknown_tool")
    assert "get_wether" in f.message and "get_weather" in f.message and f.location.message == 1
    assert not only(check(trace(GOOD, [WEATHER])), "unknown_tool")


def test_no_tools_means_no_unknown_tool_but_a_note():
    fs = check(trace(GOOD))
    assert not only(fs, "unknown_tool")
    assert only(fs, "check_skipped")[0].details["check"] == "tools"


def test_invalid_arguments_against_the_schema():
    t = trace([GOOD[0], asst_call(args={"days": 0}), GOOD[2], GOOD[3]], [WEATHER])
    (f,) = only(check(t), "invalid_arguments")
    assert "'city' is a required property" in f.message and "(and 1 more)" in f.message
    assert len(f.details["errors"]) == 2
    assert not only(check(trace([GOOD[0], asst_call(args={"city": "Oslo", "days": 2}), GOOD[2], GOOD[3]], [WEATHER])), "invalid_arguments")


def test_malformed_tool_call_from_arguments_string_and_from_step_parse_errors(qwen3):
    t = trace([GOOD[0], asst_call(args='{"city": "Oslo"'), GOOD[2], GOOD[3]], [WEATHER])
    (f,) = only(check(t), "malformed_tool_call")
    assert "not valid JSON" in f.message and f.location.message == 1
    # the engine: the model writes a broken call; the parser records it on the step
    lt = run_loop(qwen3, ['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Paris"}\n</tool_call>'])
    fs = only(check(lt), "malformed_tool_call")
    assert len(fs) == 1 and fs[0].location.step == 1 and fs[0].location.token == 178
    assert lt.termination_reason == "malformed_tool_call"
    assert not only(check(trace(GOOD, [WEATHER])), "malformed_tool_call")


def test_repaired_tool_call_is_a_warning_not_a_malformed_call(qwen3):
    """A call written without its arguments key is run with {} and the step keeps a
    warning-severity parse error: check says repaired_tool_call (warning), not malformed."""
    lt = run_loop(qwen3, ['<tool_call>\n{"name": "get_current_temperature"}\n</tool_call>', "ok"])
    (f,) = only(check(lt), "repaired_tool_call")
    assert f.severity == "warning" and f.location.step == 1 and 'has no "arguments"' in f.message
    assert not only(check(lt), "malformed_tool_call")
    assert only(check(lt), "invalid_arguments")  # {} still misses the required city


def test_truncated_tool_response(qwen3):
    t = run_loop(qwen3, [call("long_text", n=500), "ok"], functions=(long_text,), max_tool_response_length=50)
    (f,) = only(check(t), "truncated_tool_response")
    assert f.location.step == 2 and "500" in f.message
    t2 = run_loop(qwen3, [call("long_text", n=10), "ok"], functions=(long_text,), max_tool_response_length=50)
    assert not only(check(t2), "truncated_tool_response")


def test_hit_response_length(qwen3):
    t = run_loop(qwen3, [ANSWER * 10], response_length=20)
    fs = only(check(t), "hit_response_length")
    assert fs and fs[0].location.step == 1 and "max_tokens 20" in fs[0].message
    assert t.termination_reason == "response_length"
    # a tool turn that would overflow the budget: the run ends on response_length with no 'length' step
    t2 = run_loop(qwen3, [CALL_SEATTLE, ANSWER], response_length=40)
    (f2,) = only(check(t2), "hit_response_length")
    assert "dropped" in f2.message
    assert not only(check(run_loop(qwen3, [CALL_SEATTLE, ANSWER])), "hit_response_length")


def test_empty_response(qwen3):
    t = run_loop(qwen3, [""])
    (f,) = only(check(t), "empty_response")
    assert "only the end-of-turn token" in f.message and f.location.step == 1
    t2 = trace([GOOD[0], {"role": "assistant", "content": "  "}])
    assert only(check(t2), "empty_response")[0].location.message == 1
    assert not only(check(trace(GOOD, [WEATHER])), "empty_response")


def test_thinking_stripped(qwen3):
    msgs = [GOOD[0], {**asst_call(), "reasoning_content": "I should look up Oslo."}, GOOD[2], GOOD[3]]
    t = trace(msgs, [WEATHER])
    (f,) = only(check(t, qwen3), "thinking_stripped")  # qwen3_instruct_2507 has no reasoning in its template
    assert f.location.message == 1 and "I should look up Oslo." in f.message
    thinking = load_tokenizer("qwen3-thinking")
    # qwen3.jinja keeps the reasoning of turns after the last user message
    assert not only(check(t, thinking), "thinking_stripped")
    # ... and drops it for turns before a later user message
    t2 = trace(msgs + [{"role": "user", "content": "And tomorrow?"}, {"role": "assistant", "content": "Same."}], [WEATHER])
    assert [x.location.message for x in only(check(t2, thinking), "thinking_stripped")] == [1]


def test_step_error_and_tool_error(qwen3):
    def boom(x: str):
        """Fails.

        Args:
            x: anything
        """
        raise RuntimeError("backend down")

    t = run_loop(qwen3, [call("boom", x="1"), "sorry"], functions=(boom,))
    (f,) = only(check(t), "tool_error")
    assert f.location.step == 2 and "boom" in f.message
    t2 = run_loop(qwen3, [CALL_SEATTLE])  # the script has no second turn: a generation error
    (g,) = only(check(t2), "step_error")
    assert g.location.step == 3 and t2.termination_reason == "generation_error"
    clean = check(run_loop(qwen3, [CALL_SEATTLE, ANSWER]))
    assert not codes(clean) & {"step_error", "tool_error"}


def test_check_skipped_without_a_training_template_and_not_with_one(seed001, qwen3):
    smol = load_tokenizer("qwen3", template="llama3_1")  # trl has no llama3_1_training
    fs = check(seed001, smol)
    assert any(f.code == "check_skipped" and f.details.get("check") == "mask_mismatch" for f in fs)
    assert any(f.code == "check_skipped" and f.details.get("check") == "template" for f in fs)
    assert not only(check(seed001, qwen3), "check_skipped")


def test_every_code_is_exercised():
    here = open(__file__, encoding="utf-8").read()
    for c in CODES:
        assert f'"{c}"' in here, c


def test_findings_serialise_and_sort(seed001, qwen3):
    t = trace([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], [WEATHER])
    fs = check(t)
    d = [f.to_dict() for f in fs]
    json.dumps(d)
    assert set(d[0]) == {"code", "severity", "message", "location", "details"}
    assert set(d[0]["location"]) == {"step", "message", "token"}
    assert fs[0]["severity"] == "error"
    assert summarize(check(seed001, qwen3)) == {"error": 0, "warning": 1, "info": 1}


def test_a_real_mask_difference_stays_a_warning(seed001, qwen3):
    """A generated token masked 0 (a loop bug) is not the expected '\\n': a warning that names it."""
    mask = list(seed001.response_mask)
    mask[3] = 0  # inside the first generated turn
    fs = check(seed001.model_copy(update={"response_mask": mask}), qwen3)
    (m,) = only(fs, "mask_mismatch")
    assert m.severity == "warning" and m.details["expected"] is False
    assert any(p["loop_mask"] == 0 and p["training_mask"] == 1 for p in m.details["positions"])


# ---- CLI ----------------------------------------------------------------------------------------


def _cli(*args):
    return run_cli(*args)


def test_cli_check_json(tmp_path, seed001):
    p = tmp_path / "seed.jsonl"
    p.write_text(seed001.to_json() + "\n")
    r = _cli("check", str(p), "--tokenizer", "qwen3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    fs = out["traces"][0]["findings"]
    assert {f["code"] for f in fs} == {"dropped_turn_separator", "mask_mismatch"}
    # the dropped separator is a warning at its boundary
    assert {f["code"]: f["severity"] for f in fs}["dropped_turn_separator"] == "warning"
    assert out["totals"]["warning"] == 1 and out["totals"]["info"] == 1
    r = _cli("check", str(p), "--tokenizer", "qwen3")
    assert r.returncode == 0 and "[W] dropped_turn_separator" in r.stdout, r.stdout


def test_cli_check_broken_trace_text_and_unreadable_file(tmp_path):
    imported = tmp_path / "broken.jsonl"
    r = _cli("import", os.path.join(DATA, "seed000_broken.json"), "--out", str(imported))
    assert r.returncode == 0, r.stderr
    r = _cli("check", str(imported))  # default: the trace's own tokenizer (qwen3)
    assert r.returncode == 0 and "orphan_tool_message" in r.stdout and "[E]" in r.stdout
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b"\x00\x01\x02")
    r = _cli("check", str(bad))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = _cli("check", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", ["legacy", "continuous"])
def test_drift_and_mask_on_a_40k_token_run_are_exact(qwen3, mode):
    """A long engine run (60 tool turns, ~40k tokens of prose, code-like lines and JSON): the
    token alignment behind drift and mask findings (by lines first, then token by token, in
    bounded time) names exactly the '\\n' after each <|im_end|> that legacy tool turns drop
    (one warning per boundary) and continuous tokens insert (none)."""
    import random

    rng = random.Random(3)
    # no whitespace-only words: a line ending in spaces before <tool_call> is stripped from the
    # parsed content, a real drift of its own that would blur the count here
    words = ["weather", "Seattle", "the", "of", "temperature", "東京", "😀", "x = f(y)", "{", "}", "é", "data", "a\tb"]

    def body() -> str:
        lines = [" ".join(rng.choice(words) for _ in range(rng.randrange(4, 18))) for _ in range(rng.randrange(20, 40))]
        return "\n".join(lines)

    script = [body() + "\n" + call("get_current_temperature", city=f"City {i}") for i in range(60)] + [body()]
    tr = run_loop(qwen3, script, response_length=100_000, max_assistant_turns=100, sampling={"max_tokens": 4096},
                  tool_turns=mode)
    assert tr.termination_reason == "no_tool_calls" and len(tr.input_ids) > 30_000
    turns = sum(1 for st in tr.steps if st.state == "generating")
    assert turns == 61
    fs = check(tr, qwen3)
    assert not only(fs, "retokenization_drift")
    bounds = [st.start for st in tr.steps if st.state == "processing_tools"]
    seps = only(fs, "dropped_turn_separator")
    assert [f.location.token for f in seps] == (bounds if mode == "legacy" else [])
    (m,) = only(fs, "mask_mismatch")
    assert len(m.details["positions"]) == turns and m.severity == "info"
    assert all(p["token"] == "\n" and p["training_mask"] == 1 for p in m.details["positions"])
    if mode == "continuous":  # inserted, as context; only the one after the last turn is missing
        assert [p["loop_token"] for p in m.details["positions"][:-1]] == bounds
        assert all(p["loop_mask"] == 0 for p in m.details["positions"][:-1])


# ---- expected vs real drift, cut turns (issue 12) -----------------------------------------------


def test_real_drift_stays_a_warning_beside_the_expected_newline(seed001, qwen3):
    """Ids that are not what the template's tokenization gives (the same text in other tokens: a
    model emitting 'Seattle' letter by letter) are real drift: a warning, which still mentions the
    expected '\\n' beside it."""
    tok = qwen3.tokenizer
    ids = list(seed001.response_ids)
    word = tok.encode(" Seattle", add_special_tokens=False)
    assert len(word) == 1
    gen2 = seed001.steps[3]
    p = len(seed001.prompt_ids)
    at = ids.index(word[0], gen2.start - p)
    letters = [tok.encode(c, add_special_tokens=False)[0] for c in " Seattle"]
    ids[at:at + 1] = letters
    t = seed001.model_copy(update={"response_ids": ids, "response_mask": seed001.response_mask + [1] * (len(letters) - 1)})
    fs = check(t, qwen3)
    (d,) = only(fs, "retokenization_drift")
    assert d.severity == "warning" and d.details["expected"] is False
    assert "' Seattle' vs ' Seattle'" in d.message
    assert d.details["causes"] == {"bpe_retokenization": 1}
    assert "generated text the tokenizer splits differently" in d.message
    assert any("same text, different tokens" in x["description"] for x in d.details["differences"])
    assert len(only(fs, "dropped_turn_separator")) == 1  # the separator, named on its own beside it
    assert d.location.token == len(seed001.prompt_ids) + at  # points at the real difference


def test_drift_causes_are_named(seed001_continuous, qwen3):
    """Arguments the template writes another way, and reasoning stripped, each named as a cause."""
    t = seed001_continuous
    # the model wrote its arguments with other spacing: the template re-serialises them
    gen = t.steps[1]
    spaced = CALL_SEATTLE.replace('{"city": "Seattle, WA, USA"}', '{ "city" : "Seattle, WA, USA" }')
    ids = qwen3.tokenizer.encode(spaced, add_special_tokens=False) + [qwen3.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    p = len(t.prompt_ids)
    new_resp = t.response_ids[: gen.start - p] + ids + t.response_ids[gen.end - p:]
    delta = len(ids) - (gen.end - gen.start)
    steps = [s.model_copy(update={"start": s.start + (delta if s.index > 1 else 0),
                                  "end": s.end + (delta if s.index >= 1 else 0)}) for s in t.steps]
    mask = t.response_mask[: gen.start - p] + [1] * len(ids) + t.response_mask[gen.end - p:]
    t2 = t.model_copy(update={"response_ids": new_resp, "response_mask": mask, "steps": steps})
    (d,) = only(check(t2, qwen3), "retokenization_drift")
    assert set(d.details["causes"]) == {"arguments_reserialized"}, d.details["differences"]
    assert "tool-call arguments the template writes another way" in d.message


def test_stop_inside_a_tool_call_is_a_cut_turn_not_an_error(qwen3):
    """A run stopped while the model wrote a call: ``cut_tool_call`` (info), no
    ``malformed_tool_call`` error. A trace saved before the engine recorded cut calls (the
    unfinished call as a parse error on the aborted last turn) reads the same way."""
    from backend.trace import ParseError, Step

    text = "Let me check.\n<tool_call>\n{\"name\": \"get_current_temperature\", \"argu"
    ids = qwen3.tokenizer.encode(text, add_special_tokens=False)
    err = {"message": "unclosed <tool_call>", "span": [14, len(text)], "raw": text[14:]}
    steps = [Step(index=0, state="pending", start=0, end=3),
             Step(index=1, state="generating", start=3, end=3 + len(ids), mask=1, text=text, finish_reason="abort",
                  messages_added=[1], info={"cut_tool_call": [err]}),
             Step(index=2, state="terminated", start=3 + len(ids), end=3 + len(ids), info={"reason": "cancelled"})]
    base = dict(messages=SEATTLE + [{"role": "assistant", "content": "Let me check."}], prompt_ids=[1, 2, 3],
                response_ids=ids, response_mask=[1] * len(ids))
    for reason in ("cancelled", "time_limit"):
        t = Trace(steps=steps, termination_reason=reason, **base)
        fs = check(t)
        (c,) = only(fs, "cut_tool_call")
        assert c.severity == "info" and c.location.step == 1 and "not run" in c.message
        assert not only(fs, "malformed_tool_call") and summarize(fs)["error"] == 0
    legacy = [steps[0], steps[1].model_copy(update={"info": StepInfo(), "parse_errors": [ParseError(**err)]}), steps[2]]
    fs = check(Trace(steps=legacy, termination_reason="cancelled", **base))
    assert codes(fs) == {"cut_tool_call"} and summarize(fs)["error"] == 0
    # the same parse error in a turn that ended on its own is the model's: an error
    done = [steps[0], legacy[1].model_copy(update={"finish_reason": "stop"}), steps[2]]
    assert only(check(Trace(steps=done, termination_reason="malformed_tool_call", **base)), "malformed_tool_call")


def test_a_repaired_call_at_the_end_of_a_stopped_turn_is_not_taken_for_a_cut_one(qwen3):
    """A warning (a call the parser kept after a repair) reaching the end of a cancelled turn is
    a finished call, not one Stop cut: it stays a warning, the engine and ``check`` alike."""
    import asyncio

    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.trace import ParseError, Step

    text = '<tool_call>\n{"name": "get_current_temperature"}\n</tool_call>'
    ids = qwen3.tokenizer.encode(text, add_special_tokens=False)
    warn = ParseError(message="no arguments: read as {}", span=[0, len(text)], raw=text, severity="warning")
    steps = [Step(index=0, state="pending", start=0, end=3),
             Step(index=1, state="generating", start=3, end=3 + len(ids), mask=1, text=text, finish_reason="abort",
                  messages_added=[1], parse_errors=[warn]),
             Step(index=2, state="terminated", start=3 + len(ids), end=3 + len(ids), info={"reason": "cancelled"})]
    t = Trace(steps=steps, termination_reason="cancelled", messages=SEATTLE + [{"role": "assistant", "content": ""}],
              prompt_ids=[1, 2, 3], response_ids=ids, response_mask=[1] * len(ids))
    fs = check(t)
    assert not only(fs, "cut_tool_call") and only(fs, "repaired_tool_call")

    async def stopped_after_the_call() -> Trace:
        # the whole call streams, then Stop arrives before the EOS token
        gen = ScriptedGenerator(qwen3.tokenizer, [{"token_ids": ids + [qwen3.eos_token_id], "token_delay_s": 0.05}])
        cancel = asyncio.Event()
        seen: list[int] = []

        def on_event(ev):
            if ev.kind == "tokens":
                seen.extend(ev.token_ids)
                if len(seen) >= len(ids):
                    cancel.set()

        return await AgentLoop(gen, qwen3, config=LoopConfig()).run(SEATTLE, on_event=on_event, cancel=cancel)

    run = asyncio.run(stopped_after_the_call())
    gen_step = next(s for s in run.steps if s.state == "generating")
    assert run.termination_reason == "cancelled" and gen_step.info.cut_tool_call is None
    assert [e.severity for e in gen_step.parse_errors] == ["warning"]


def test_a_call_left_by_the_time_limit_is_info(qwen3):
    t = trace(SEATTLE + [asst_call()], [WEATHER], termination_reason="time_limit")
    (f,) = only(check(t), "tool_call_without_response")
    assert f.severity == "info" and "time_limit" in f.message


def test_logprob_mismatch_and_logprob_semantics(seed001):
    """Structural: both codes on hand-set logprobs (tests/test_logprobs.py has them on a real model)."""
    from backend.trace.model import LogprobSemantics

    t = seed001.model_copy(deep=True)
    p = len(t.prompt_ids)
    gens = [s for s in t.steps if s.state == "generating" and s.end > s.start]
    for s in t.steps:
        if s.start >= p and s.end > s.start:
            s.info.trainer_logprobs = [-1.0] * (s.end - s.start)
            if s in gens:
                s.logprobs = [-1.0] * (s.end - s.start)
                s.info.logprob_semantics = LogprobSemantics(backend="vllm", mode="processed", temperature=0.7)
            else:
                s.logprobs = [0.0] * (s.end - s.start)  # mask-0 tokens far off: never counted
    assert not codes(check(t)) & {"logprob_mismatch", "logprob_semantics"}
    gens[0].logprobs = [-1.0] + [-3.0] + [-1.0] * (len(gens[0].logprobs) - 2)
    (f,) = only(check(t), "logprob_mismatch")
    assert f.location.token == gens[0].start + 1 and f.details["delta"] == 2.0
    gens[1].info.logprob_semantics = LogprobSemantics(backend="vllm", mode="raw", temperature=0.7)
    (f,) = only(check(t), "logprob_semantics")
    assert f.location.step == gens[1].index and "temperature 0.7" in f.message


# ---- templates that do not fit, and tool turns a verl-style trainer builds differently ---------


def test_template_mismatch_a_llama_template_over_the_qwen_vocabulary(qwen3):
    """A Llama 3.1 template over Qwen's vocabulary splits <|start_header_id|> into pieces: the run
    says so ("template_mismatch"), where the same run with Qwen's own template does not."""
    llama_over_qwen = load_tokenizer("qwen3", template="llama3_1")
    t = run_loop(llama_over_qwen, ['{"name": "get_current_temperature", "parameters": {"city": "Seattle"}}', ANSWER],
                 parser="llama3_json", max_assistant_turns=1)
    fs = only(check(t), "template_mismatch")
    assert {f.severity for f in fs} == {"warning"} and all("llama3_1" in f.message for f in fs)
    assert any("<|start_header_id|>" in f.message and "single tokens" in f.message for f in fs)
    assert any("EOS <|im_end|>" in f.message for f in fs)
    assert any("written for the llama3 vocabulary" in f.message and "--tokenizer llama3" in f.message for f in fs)
    assert not only(check(run_loop(qwen3, [CALL_SEATTLE, ANSWER])), "template_mismatch")


def test_verl_tool_turn_where_verls_method_fails_or_differs(qwen3):
    """A tool turn the loop tokenized as the conversation's suffix because verl's way (the tool
    messages rendered alone) fails or gives other ids: one info finding per such step."""
    t = trace(GOOD, [WEATHER], steps=[])
    from backend.trace import Step

    t.steps = [Step(index=0, state="pending", start=0, end=0),
               Step(index=1, state="processing_tools", start=0, end=10, mask=0,
                    info=StepInfo(method="suffix", verl_error="No user query found in messages.")),
               Step(index=2, state="processing_tools", start=10, end=14, mask=0,
                    info=StepInfo(method="suffix", verl_tokens=51)),
               Step(index=3, state="processing_tools", start=14, end=18, mask=0, info=StepInfo(method="verl"))]
    fs = only(check(t), "verl_tool_turn")
    assert [f.location.step for f in fs] == [1, 2]
    assert all(f.severity == "info" for f in fs)
    assert "No user query found" in fs[0].message and "builds 51 tokens here instead of 4" in fs[1].message
    # the seed run on Qwen3: verl's method agrees, nothing to say
    assert not only(check(run_loop(qwen3, [CALL_SEATTLE, ANSWER])), "verl_tool_turn")


def test_import_loss_names_what_the_source_had(qwen3, tmp_path):
    """A chat log with an image part and a tool result whose id answers no call: the import
    keeps the text, and the trace says what it lost, with the file and line."""
    from backend.importers import import_file

    rec = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "tool", "tool_call_id": "call_gone", "content": "42"},
        {"role": "user", "content": "Thanks"}]}
    clean = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    p = tmp_path / "chat.jsonl"
    p.write_text(json.dumps(clean) + "\n" + json.dumps(rec) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert len(res.traces) == 2 and not res.problems and not res.complete
    assert [x.line for x in res.losses] == [2, 2]
    fs = only(check(res.traces[1]), "import_loss")
    assert len(fs) == 2 and all(f.severity == "warning" and "chat.jsonl" in f.message and "line 2" in f.message for f in fs)
    assert "messages[0]: content part 1 (image_url)" in fs[0].message
    assert "'call_gone' answers no tool call" in fs[1].message
    assert not only(check(res.traces[0]), "import_loss")


def test_mask_structure_names_tool_output_left_trainable(qwen3):
    """A tool turn's tokens at mask 1 (slime#1370): one mask_structure finding at its first
    token, naming the tool message; the loop's own trace has none."""
    t = run_loop(qwen3, [CALL_SEATTLE, ANSWER])
    assert not only(check(t, qwen3), "mask_structure")
    step = next(s for s in t.steps if s.state == "processing_tools")
    p = len(t.prompt_ids)
    bad = list(t.response_mask)
    bad[step.start - p:step.end - p] = [1] * (step.end - step.start)
    fs = only(check(t.model_copy(update={"response_mask": bad}), qwen3), "mask_structure")
    assert fs and fs[0].location.token == step.start and fs[0].severity == "warning"
    assert any("(tool)" in f.message for f in fs)
