"""Other tools' trace files, damaged (issue 22, "Bad input"): a truncated OTLP export, a span
whose message attribute is not JSON, content of a type nobody knows, tool results that answer
no call (chat log, Responses log, Anthropic file), a file of mixed records, and one huge
single-line OTLP document. Each gives a clear reason with its place or a reported loss, the rest
of the file imports, and memory stays bounded. The files start from the fixtures the real
libraries wrote (tests/fixtures_gen/)."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

import backend.trace.io as trace_mod
from backend.importers import import_file
from backend.loading.tokenizers import load_tokenizer
from backend.trace.catalog import TraceSet

from .test_corrupt_traces import LINE_LIMIT, MEMORY_BOUND, check_reason

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "import"
OTLP = DATA / "otel" / "openai_v2_spans.otlp.jsonl"


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def _lines(p: Path) -> list[str]:
    return [x for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]


def _ids(res) -> list[str]:
    return [t.id for t in res.traces]


def _spans(line: dict):
    for rs in line["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            yield from ss["spans"]


def test_truncated_otlp_export_keeps_the_complete_lines(tmp_path, qwen3):
    """The collector was killed mid-write: the last line is cut. It is reported by its number;
    the traces whose spans are all on complete lines import as from the whole file."""
    lines = _lines(OTLP)
    whole = import_file(str(OTLP), bundle=qwen3)
    p = tmp_path / "cut.jsonl"
    p.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2], encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert [x.line for x in res.problems] == [len(lines)]
    check_reason(res.problems[0].reason)
    last_ids = {s["traceId"] for s in _spans(json.loads(lines[-1]))}
    intact = [t for t in whole.traces if t.metadata["provenance"]["trace_id"] not in last_ids]
    assert intact and [t.id for t in res.traces if t.metadata["provenance"]["trace_id"] not in last_ids] == [t.id for t in intact]
    ts = TraceSet.open_set(str(p), cache=False, final=True, import_bundle=lambda: qwen3)
    assert [pr[1] for pr in ts.problem_rows()] == [len(lines)]


def _with_attribute(line: str, key: str, value: str) -> tuple[str, list[str]]:
    """The line with every span's attribute ``key`` set to ``value``; and those spans' ids."""
    d = json.loads(line)
    ids = []
    for s in _spans(d):
        for kv in s["attributes"]:
            if kv["key"] == key:
                kv["value"] = {"stringValue": value}
                ids.append(s["spanId"])
    assert ids, f"no {key} in the line"
    return json.dumps(d), ids


def test_span_with_malformed_message_json_is_a_loss_not_a_crash(tmp_path, qwen3):
    lines = _lines(OTLP)
    bad, span_ids = _with_attribute(lines[0], "gen_ai.output.messages", '[{"role": "assistant", "parts": [')
    p = tmp_path / "bad_attr.jsonl"
    p.write_text("\n".join([bad, *lines[1:]]) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert not res.problems and len(res.traces) == len(import_file(str(OTLP), bundle=qwen3).traces)
    hits = [x for x in res.losses if "gen_ai.output.messages" in x.reason]
    assert hits and hits[0].line == 1 and any(i in hits[0].reason for i in span_ids), res.losses
    check_reason(hits[0].reason)


def test_unknown_part_type_in_otel_messages_is_named(tmp_path, qwen3):
    lines = _lines(OTLP)
    d = json.loads(lines[0])
    for s in _spans(d):
        for kv in s["attributes"]:
            if kv["key"] == "gen_ai.input.messages":
                msgs = json.loads(kv["value"]["stringValue"])
                msgs[0]["parts"].append({"type": "hologram", "content": "3-D"})
                kv["value"]["stringValue"] = json.dumps(msgs)
    p = tmp_path / "hologram.jsonl"
    p.write_text("\n".join([json.dumps(d), *lines[1:]]) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert not res.problems and any("hologram" in x.reason for x in res.losses), res.losses


def test_unknown_anthropic_block_is_a_loss_with_its_place(tmp_path, qwen3):
    rec = json.loads(_lines(DATA / "anthropic" / "messages.jsonl")[0])
    rec["messages"][1]["content"].append({"type": "mystery_block", "payload": 1})
    p = tmp_path / "mystery.jsonl"
    p.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert res.formats == {"anthropic": 1} and not res.problems
    assert any("mystery_block" in x.reason and "messages[1]" in x.reason for x in res.losses), res.losses


def test_tool_results_that_answer_no_call_are_reported_in_every_format(tmp_path, qwen3):
    chat = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                                                "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
                         {"role": "tool", "tool_call_id": "call_nope", "content": "stray"},
                         {"role": "assistant", "content": "done"}]}
    responses = json.loads(_lines(DATA / "openai_responses" / "responses_log.jsonl")[0])
    responses["request"]["input"] = [{"role": "user", "content": "hi"},
                                     {"type": "function_call_output", "call_id": "call_nope", "output": "stray"}]
    anthropic = json.loads(_lines(DATA / "anthropic" / "messages.jsonl")[0])
    anthropic["messages"][2]["content"][0]["tool_use_id"] = "toolu_nope"
    for name, rec, fmt in (("chat", chat, "openai-chat"), ("responses", responses, "openai-responses"), ("anthropic", anthropic, "anthropic")):
        p = tmp_path / f"{name}.jsonl"
        p.write_text(json.dumps(rec) + "\n", encoding="utf-8")
        res = import_file(str(p), bundle=qwen3)
        assert res.formats == {fmt: 1} and not res.problems, (name, res.problems)
        assert any("nope" in x.reason and "answers no tool call" in x.reason for x in res.losses), (name, res.losses)
        assert not res.complete


def test_a_file_of_mixed_records_imports_what_it_can_and_reports_the_rest_by_line(tmp_path, qwen3):
    sample = _lines(ROOT / "sample_traces" / "01_weather.jsonl")[0]
    rows = [_lines(OTLP)[0], _lines(DATA / "anthropic" / "messages.jsonl")[0], '{"what": "is this"}', sample,
            _lines(DATA / "openai_chat.jsonl")[0], "not json at all"]
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert [x.line for x in res.problems] == [3, 6]
    for x in res.problems:
        check_reason(x.reason)
    assert "unrecognised record" in res.problems[0].reason
    assert {"otel", "anthropic", "trace", "openai-chat"} == set(res.formats)
    where = {t.metadata.get("import", {}).get("line") for t in res.traces if t.metadata.get("source") != "otel"}
    assert {2, 5} <= where


def test_one_huge_single_line_otlp_document_is_refused_with_bounded_memory(tmp_path, monkeypatch):
    """A 50 MB OTLP request on one line, with a 1 MiB line limit: reported as too long at line
    1 by the import and by a trace set, never parsed, never held."""
    span = next(_spans(json.loads(_lines(OTLP)[0])))
    one = json.dumps(span).encode()
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"resourceSpans":[{"resource":{},"scopeSpans":[{"scope":{},"spans":[')
        written = 0
        while written < 50_000_000:
            f.write(one + b",")
            written += len(one) + 1
        f.write(one + b"]}]}]}\n")
    monkeypatch.setattr(trace_mod, "DEFAULT_MAX_LINE_BYTES", LINE_LIMIT)
    for name, fn in (("import_file", lambda: import_file(str(p))),
                     ("TraceSet", lambda: TraceSet.open_set(str(p), cache=False, final=True))):
        tracemalloc.start()
        try:
            res = fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        probs = [(x[1], x[2]) for x in res.problem_rows()] if name == "TraceSet" else [(x.line, x.reason) for x in res.problems]
        assert len(probs) == 1 and probs[0][0] == 1 and "longer than the 1.0 MB line limit" in probs[0][1], (name, probs)
        assert peak < MEMORY_BOUND, f"{name}: tracemalloc peak {peak / 1e6:.1f} MB"
    os.remove(p)


def test_deeply_nested_attribute_json_costs_one_trace_not_the_file(tmp_path, qwen3):
    """A visitor's span whose message attribute is 200,000 nested brackets: that trace is
    reported (or its attribute a loss), the other traces of the file import."""
    lines = _lines(OTLP)
    bad, _ = _with_attribute(lines[0], "gen_ai.input.messages", "[" * 200_000 + "]" * 200_000)
    p = tmp_path / "deep.jsonl"
    p.write_text("\n".join([bad, *lines[1:]]) + "\n", encoding="utf-8")
    whole = import_file(str(OTLP), bundle=qwen3)
    res = import_file(str(p), bundle=qwen3)
    first_ids = {s["traceId"] for s in _spans(json.loads(lines[0]))}
    others = [t.id for t in whole.traces if t.metadata["provenance"]["trace_id"] not in first_ids]
    assert others and [t.id for t in res.traces if t.metadata["provenance"]["trace_id"] not in first_ids] == others
    said = [x.reason for x in res.problems] + [x.reason for x in res.losses]
    assert any("gen_ai.input.messages" in r or "nest" in r for r in said), said
    for r in said:
        check_reason(r)
