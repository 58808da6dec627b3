"""The trace layer's own structure: the string codes as enums (values pinned to what files
hold), typed step info that writes back exactly what it read, the builder's invariants, the one
mask run-length function, and the one place a new termination reason or step field goes."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.checks import diagnostics, labels
from backend.engine import AgentLoop
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import MessageSpan, Step, Trace, TraceFormatError, load_traces, write_jsonl
from backend.trace.builder import TraceBuilder, TraceBuildError, mask_runs
from backend.trace.messages import decode_arguments, json_type
from backend.trace.model import FindingCode, StepInfo, StepState, TerminationReason

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))


def _records() -> list[dict]:
    return [json.loads(line) for p in SAMPLES for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---- enums: the values are the strings files carry ---------------------------------------------


def test_enum_values_are_the_strings_of_the_file_format():
    assert [s.value for s in StepState] == ["pending", "generating", "processing_tools", "terminated"]
    assert {r.value for r in TerminationReason} >= {  # never renamed or removed: files hold them
        "no_tool_calls", "cancelled", "time_limit", "response_length", "max_assistant_turns", "max_user_turns",
        "malformed_tool_call", "tool_error", "generation_error", "render_error", "error", "content_filter",
    }
    assert FindingCode.MASK_MISMATCH == "mask_mismatch" and json.dumps(TerminationReason.CANCELLED) == '"cancelled"'
    # the sample files hold only these values, and load as members
    recs = _records()
    assert recs
    for d in recs:
        t = Trace.from_dict(d)
        assert {s["state"] for s in d["steps"]} <= {s.value for s in StepState}
        assert all(isinstance(s.state, StepState) for s in t.steps)
        if d["termination_reason"] is not None:
            assert isinstance(t.termination_reason, TerminationReason) and t.termination_reason == d["termination_reason"]


def test_every_finding_code_is_documented_in_diagnostics():
    assert diagnostics.CODES == tuple(FindingCode)
    for c in FindingCode:
        assert f"``{c.value}``" in diagnostics.__doc__, c


def test_an_unknown_termination_reason_loads_and_is_written_back_as_it_was(tmp_path):
    d = _records()[0]
    d["termination_reason"] = "someone_elses_reason"
    d["steps"][-1]["info"] = {"reason": "someone_elses_reason", "their_key": [1, {"a": None}]}
    line = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
    t = Trace.from_json(line)
    assert t.termination_reason == "someone_elses_reason" and not isinstance(t.termination_reason, TerminationReason)
    assert t.steps[-1].info.reason == "someone_elses_reason"
    assert labels.termination_label(t.termination_reason) == "someone_elses_reason"
    assert json.loads(t.to_json()) == d


def test_sample_files_are_written_back_byte_identically(tmp_path):
    for p in SAMPLES:
        res = load_traces(str(p))
        out = tmp_path / p.name
        write_jsonl(res.traces, str(out))
        assert out.read_bytes() == p.read_bytes(), p.name


# ---- StepInfo ------------------------------------------------------------------------------------

EVERY_KEY = {
    "imported": True, "reason": "no_tool_calls", "spans_exact": False, "max_tokens": 512, "constraint": "structural_tag",
    "server_url": "http://a:8000", "routing": "sticky", "failover_from": "http://b:8000", "failover_reason": "ConnectError",
    "cut_tool_call": [{"message": "cut", "span": [3, 9], "raw": "<tool_call>{", "severity": "error"}],
    "dropped_calls": 2, "not_appended": "a tool failed", "would_append_tokens": 28, "method": "verl",
    "stripped_prefix_tokens": 21, "prefix_mismatch": True, "verl_error": "boom", "roles": ["user"],
}


def test_step_info_declares_every_key_the_code_reads_or_writes():
    assert set(StepInfo.model_fields) >= set(EVERY_KEY)


def test_step_info_round_trips_every_key_and_an_unknown_one_in_any_order():
    keys = [*StepInfo.model_fields, "someone_elses_key"]  # a field added later: round-tripped as null
    random.Random(13).shuffle(keys)
    info = {k: EVERY_KEY.get(k) if k in StepInfo.model_fields else {"nested": [1, 2.5, None]} for k in keys}
    raw = json.dumps({"index": 0, "state": "terminated", "info": info}, separators=(",", ":"))
    step = Step.model_validate_json(raw)
    assert step.info.reason is TerminationReason.NO_TOOL_CALLS and step.info.max_tokens == 512
    assert step.info.someone_elses_key == {"nested": [1, 2.5, None]}
    assert list(json.loads(step.model_dump_json())["info"]) == keys  # the order it was read in
    assert json.loads(step.model_dump_json())["info"] == info
    assert Step.model_validate(json.loads(step.model_dump_json())) == step


def test_step_info_writes_only_the_keys_that_were_set_in_the_order_they_were_set():
    info = StepInfo()
    assert not info and info.to_dict() == {} and info == {}
    info.max_tokens = 5
    info.update({"backend": "scripted", "reason": "cancelled"})
    info.not_appended = None  # set to null: written as null, as a dict would
    assert info.to_dict() == {"max_tokens": 5, "backend": "scripted", "reason": "cancelled", "not_appended": None}
    assert list(info.to_dict()) == ["max_tokens", "backend", "reason", "not_appended"]
    assert info.reason is TerminationReason.CANCELLED and info


@pytest.mark.parametrize("bad", [{"max_tokens": "5"}, {"imported": 1}, {"roles": "user"}, "x", [1]])
def test_step_info_refuses_a_known_key_of_the_wrong_type(bad):
    d = _records()[0]
    d["steps"][0]["info"] = bad
    with pytest.raises(TraceFormatError, match="steps.0.info"):
        Trace.from_dict(d)


# ---- the builder ---------------------------------------------------------------------------------


def _builder() -> TraceBuilder:
    b = TraceBuilder([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], vocab_size=100, tokenizer_name="toy")
    b.set_prompt([1, 2, 3])
    b.add_span(MessageSpan(message=0, start=0, end=3))
    return b


def test_builder_builds_a_trace_that_keeps_its_invariants():
    b = _builder()
    b.add_step(b.step(StepState.PENDING, start=0, end=3, messages_added=[0]))
    start, end = b.append([4, 5], 1)
    assert (start, end) == (3, 5)
    b.add_span(MessageSpan(message=1, start=start, end=end))
    b.add_step(b.step(StepState.GENERATING, start=start, end=end, mask=1, messages_added=[1]))
    b.terminate(TerminationReason.NO_TOOL_CALLS)
    t = b.build(termination_reason=TerminationReason.NO_TOOL_CALLS)
    assert t.input_ids == [1, 2, 3, 4, 5] and t.response_mask == [1, 1]
    assert [s.state for s in t.steps] == ["pending", "generating", "terminated"] and t.steps[-1].start == 5
    assert t.steps[-1].info.to_dict() == {"reason": "no_tool_calls"}
    assert Trace.from_json(t.to_json()) == t


@pytest.mark.parametrize("breaks,words", [
    (lambda b: b.append([4, 100], 1), "outside the vocabulary"),
    (lambda b: b.append([4, -1], 0), "outside the vocabulary"),
    (lambda b: b.append([4, True], 0), "not an integer"),
    (lambda b: b.append([4], 2), "0 or 1"),
    (lambda b: b.set_response([4, 5], [1]), "response_mask has 1 entries but response_ids has 2"),
    (lambda b: b.set_response([4], [2]), "mask values must be 0 or 1"),
    (lambda b: b.add_span(MessageSpan(message=1, start=2, end=3)), "overlaps"),
    (lambda b: b.add_span(MessageSpan(message=1, start=3, end=9)), "outside the 3 tokens"),
    (lambda b: b.add_span(MessageSpan(message=5, start=3, end=3)), "names message 5"),
    (lambda b: b.add_step(b.step(StepState.GENERATING, start=0, end=9)), "past the 3 tokens"),
    (lambda b: b.add_step(Step(index=4, state="pending")), "added as step 0"),
    (lambda b: (b.add_step(b.step(StepState.PENDING, start=0, end=3)), b.add_step(b.step(StepState.GENERATING, start=1, end=3))),
     "inside step 0"),
])
def test_builder_refuses_what_would_break_a_trace(breaks, words):
    b = _builder()
    with pytest.raises(TraceBuildError, match=words):
        breaks(b)
    assert issubclass(TraceBuildError, TraceFormatError)  # importers report it as a bad record


def test_builder_marks_imported_steps_first_and_terminates_with_the_reason():
    b = TraceBuilder([{"role": "user", "content": "hi"}], imported=True)
    b.add_step(b.step(StepState.PENDING, messages_added=[0], info=StepInfo(roles=["user"])))
    end = b.terminate(None)
    assert [s.info.to_dict() for s in b.steps] == [{"imported": True, "roles": ["user"]}, {"reason": None, "imported": True}]
    assert end.index == 1


# ---- mask runs -----------------------------------------------------------------------------------


def test_mask_runs():
    assert mask_runs([]) == []
    assert mask_runs([1]) == [(1, 1)]
    assert mask_runs([1, 1, 0, 0, 0, 1]) == [(1, 2), (0, 3), (1, 1)]


@given(st.lists(st.integers(0, 1), max_size=60))
def test_mask_runs_expand_back_to_the_mask(mask):
    runs = mask_runs(mask)
    assert [b for b, n in runs for _ in range(n)] == mask
    assert all(n > 0 for _, n in runs) and all(a[0] != b[0] for a, b in zip(runs, runs[1:]))


# ---- messages ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,value,problem", [
    (None, {}, None), ("", {}, None), ("  ", {}, None), ({"a": 1}, {"a": 1}, None), ('{"a": 1}', {"a": 1}, None),
    ("[1]", [1], "got an array"), ("{x", "{x", "not valid JSON"), (7, 7, "got a number"), ("null", None, "got null"),
])
def test_decode_arguments(raw, value, problem):
    v, p = decode_arguments(raw)
    assert v == value
    assert (p is None) if problem is None else (problem in p)


def test_json_type_has_one_wording():
    assert [json_type(v) for v in (None, True, 1, 1.5, "s", [], {})] == [
        "null", "a boolean", "a number", "a number", "a string", "an array", "an object"]


# ---- one place per kind of knowledge -------------------------------------------------------------


def test_a_termination_reason_is_declared_once():
    """Words and outcome come from the enum: labels and diagnostics derive theirs from it."""
    assert set(labels.TERMINATION_WORDS) == {r.value for r in TerminationReason}
    for r in TerminationReason:
        assert r.words and r.outcome in ("ok", "limit", "failure"), r
        assert labels.termination_label(r) == f"{r.words} ({r.value})"
    # a normal end: the model answered, or (a captured branch) handed its calls to the harness
    assert labels.OK_CODES == {TerminationReason.NO_TOOL_CALLS, TerminationReason.HARNESS}
    assert labels.LIMIT_CODES == {r for r in TerminationReason if r.outcome == "limit"}
    assert TerminationReason.TIME_LIMIT in labels.LIMIT_CODES and TerminationReason.TOOL_ERROR not in labels.LIMIT_CODES


def test_engine_step_info_keys_are_declared_fields():
    bundle = load_tokenizer("qwen3")
    call = '<tool_call>\n{"name": "f", "arguments": {"x": "a"}}\n</tool_call>'

    def f(x: str):
        """A tool.

        Args:
            x: anything
        """
        return x

    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, [call, "done"]), bundle, tools=ToolRegistry.from_functions([f]))
    events = []
    t = asyncio.run(loop.run([{"role": "user", "content": "go"}], on_event=events.append))
    generator_keys = {"backend", "script_turn"}  # the generator's own details, kept as extra keys
    for s in t.steps:
        assert set(s.info.to_dict()) - generator_keys <= set(StepInfo.model_fields), s.info
    assert t.steps[-1].info.reason is TerminationReason.NO_TOOL_CALLS
    assert [e.step.index for e in events if e.kind == "step"] == [s.index for s in t.steps]
