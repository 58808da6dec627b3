"""Export (JSONL, loss-less Parquet, HF messages+tools, verl rows), load_any, and the trace index."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from cli_inprocess import run_cli

from backend.engine import AgentLoop, LoopConfig
from backend.exporters.export import export_traces, hf_row, verl_row
from backend.generators.scripted import ScriptedGenerator
from backend.importers import import_file, load_any
from backend.loading.tokenizers import load_tokenizer
from backend.trace import (
    INDEX_COLUMNS,
    LoadProblem,
    Trace,
    TraceFileError,
    TraceIndex,
    is_trace_parquet,
    load_traces,
    read_parquet_traces,
    write_jsonl,
    write_parquet,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")

CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
    """
    return {"temperature": 72, "city": city}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def traces(qwen3) -> list[Trace]:
    from test_diagnostics import registry  # the same ToolRegistry (or stand-in) as the diagnostics tests

    out = []
    for script in ([CALL, "72°F — ünïcode ✓"], ['<tool_call>\n{"name": "x", "arguments": {\n</tool_call>'], ["plain answer"]):
        loop = AgentLoop(ScriptedGenerator(qwen3.tokenizer, script), qwen3, tools=registry([get_current_temperature]), config=LoopConfig())
        out.append(asyncio.run(loop.run([{"role": "user", "content": "What's the weather in Seattle?"}])))
    out += import_file(os.path.join(DATA, "openai_chat.jsonl")).traces
    out += import_file(os.path.join(DATA, "verl_agent_loop.jsonl")).traces
    t = out[0].model_copy(deep=True)
    t.id = "with-extra"
    t.metadata["nested"] = {"a": [1, 2.5, None, {"b": "ü"}]}
    extra = t.to_dict()
    extra["future_field"] = {"x": 1}  # unknown keys are kept (extra="allow")
    out.append(Trace.from_dict(extra))
    empty = Trace(id="empty")
    out.append(empty)
    return out


def test_jsonl_round_trip(tmp_path, traces):
    p = tmp_path / "t.jsonl"
    assert export_traces(traces, "jsonl", str(p)) == len(traces)
    assert load_traces(str(p)).traces == traces


def test_parquet_is_lossless(tmp_path, traces):
    p = tmp_path / "t.parquet"
    assert export_traces(traces, "parquet", str(p)) == len(traces)
    assert is_trace_parquet(str(p))
    back = read_parquet_traces(str(p))
    assert not back.problems
    assert back.traces == traces
    assert back.traces[-2].model_extra["future_field"] == {"x": 1}
    assert [t.to_json() for t in back.traces] == [t.to_json() for t in traces]
    # native columns for ids, JSON strings for nested fields, source for filtering
    import pyarrow.parquet as pq

    tbl = pq.read_table(p)
    import pyarrow as pa

    assert pa.types.is_list(tbl.schema.field("prompt_ids").type) and tbl.schema.field("prompt_ids").type.value_type == pa.int64()
    assert tbl.schema.field("steps").type == pa.string()
    assert tbl.column("source").to_pylist()[:4] == ["engine", "engine", "engine", "openai-chat"]
    assert load_any(str(p)).traces == traces


def test_parquet_in_batches_and_empty(tmp_path, traces):
    p = tmp_path / "many.parquet"
    many = [t.model_copy(update={"id": f"t{i}"}) for i, t in enumerate(traces * 30)]
    write_parquet(many, str(p), batch_rows=7)
    assert read_parquet_traces(str(p)).traces == many
    e = tmp_path / "empty.parquet"
    assert write_parquet([], str(e)) == 0
    assert read_parquet_traces(str(e)).traces == []


def test_bad_parquet_rows_are_reported(tmp_path, traces):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from backend.trace import parquet_row, parquet_schema

    rows = [parquet_row(traces[0]), parquet_row(traces[1])]
    rows[1]["response_mask"] = rows[1]["response_mask"][:-1]
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema()), p)
    res = read_parquet_traces(str(p))
    assert len(res.traces) == 1 and res.problems[0].line == 2 and "response_mask" in res.problems[0].reason


def test_foreign_parquet_and_jsonl_get_an_import_hint(tmp_path):
    import pandas as pd

    p = tmp_path / "hf.parquet"
    pd.DataFrame({"conversations": [json.dumps([{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}])]}).to_parquet(p)
    with pytest.raises(TraceFileError, match="import --from sharegpt"):
        load_any(str(p))
    res = load_any(str(p), import_foreign=True)
    assert len(res.traces) == 1 and res.traces[0].metadata["source"] == "sharegpt"
    res = load_any(os.path.join(DATA, "openai_chat.jsonl"))
    assert not res.traces and "import --from openai-chat" in res.problems[0].reason
    assert len(load_any(os.path.join(DATA, "openai_chat.jsonl"), import_foreign=True).traces) == 5
    with pytest.raises(TraceFileError):
        load_any(str(tmp_path / "missing.jsonl"))
    with pytest.raises(TraceFileError):
        load_any(str(tmp_path))


def test_hf_rows_render_with_the_template(tmp_path, traces, qwen3):
    p = tmp_path / "hf.jsonl"
    n = export_traces(traces[:5], "hf", str(p))
    rows = [json.loads(line) for line in open(p)]
    assert n == 5 and set(rows[0]) == {"id", "messages", "tools"}
    seed = rows[0]
    assert seed["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Seattle, WA, USA"}
    assert seed["messages"][2]["tool_call_id"] == seed["messages"][1]["tool_calls"][0]["id"]
    for r in rows:
        qwen3.tokenizer.apply_chat_template(r["messages"], tools=r["tools"] or None, tokenize=False, chat_template=qwen3.chat_template)
    # string arguments (an imported log) are decoded for training
    assert hf_row(traces[3])["messages"][-1]["tool_calls"][0]["function"]["arguments"] == {"city": "Auckland", "unit": "c"}
    pq_path = tmp_path / "hf.parquet"
    export_traces(traces[:5], "hf", str(pq_path))
    import pandas as pd

    df = pd.read_parquet(pq_path)
    assert json.loads(df["messages"][0]) == seed["messages"]


def test_verl_rows_round_trip_through_the_verl_importer(tmp_path, traces, qwen3):
    p = tmp_path / "verl.jsonl"
    export_traces(traces[:3], "verl", str(p))
    rows = [json.loads(line) for line in open(p)]
    assert rows[0]["response_mask"] == traces[0].response_mask and rows[0]["num_turns"] == 2
    assert rows[0]["termination_reason"] == "no_tool_calls"
    back = import_file(str(p), "verl")
    for orig, t in zip(traces[:3], back.traces):
        assert (t.prompt_ids, t.response_ids, t.response_mask) == (orig.prompt_ids, orig.response_ids, orig.response_mask)
        assert t.termination_reason == orig.termination_reason
        assert [m["role"] for m in t.messages] == [m["role"] for m in orig.messages]
    assert "response_logprobs" not in verl_row(traces[0])  # the scripted model has no logprobs
    lp = traces[0].model_copy(deep=True)
    for s in lp.steps:
        if s.state == "generating":
            s.logprobs = [-0.5] * (s.end - s.start)
    row = verl_row(lp)
    assert len(row["response_logprobs"]) == len(row["response_ids"])
    pqp = tmp_path / "verl.parquet"
    export_traces(traces[:3], "verl", str(pqp))
    assert len(import_file(str(pqp), "verl").traces) == 3


def test_unknown_export_format(tmp_path, traces):
    from backend.exporters.export import ExportError

    with pytest.raises(ExportError):
        export_traces(traces, "csv", str(tmp_path / "x"))


# ---- trace index ---------------------------------------------------------------------------------


def test_trace_table_jsonl(tmp_path, traces):
    p = tmp_path / "t.jsonl"
    write_jsonl(traces, str(p))
    with open(p, "a") as f:
        f.write("{broken\n\n[1, 2]\n")
    tbl = TraceIndex.build([str(p)])
    assert list(tbl.df.columns) == INDEX_COLUMNS and len(tbl) == len(traces)
    assert [(pr.line, pr.reason.split(":")[0]) for pr in tbl.problems] == [(len(traces) + 1, "invalid JSON"), (len(traces) + 3, "a trace must be a JSON object, got an array")]
    for i, t in enumerate(traces):
        row = tbl.df.iloc[i]
        assert row["id"] == t.id and row["tokens"] == len(t.input_ids) and row["turns"] == t.num_turns
        assert row["errors"] == t.step_errors() and row["termination_reason"] == t.termination_reason
        assert row["source"] == t.metadata.get("source") and row["prompt_tokens"] == len(t.prompt_ids)
        assert tbl.open(i) == t
    assert tbl.df.iloc[1]["errors"] == 1  # the malformed call
    assert tbl.open("with-extra").id == "with-extra"
    with pytest.raises(KeyError):
        tbl.open("nope")
    with pytest.raises(IndexError):
        tbl.open(10_000)


def test_trace_table_light_parse_is_safe_with_id_keys_inside_content(tmp_path, traces):
    """A message mentioning "prompt_ids":[ must not fool the fast path."""
    t = traces[0].model_copy(deep=True)
    t.id = "tricky"
    t.messages[0]["content"] = 'look: "prompt_ids":[1,2,3] and "response_ids":[9]'
    t.metadata["x"] = {"prompt_ids": [5, 6, 7, 8]}
    p = tmp_path / "t.jsonl"
    write_jsonl([t], str(p))
    row = TraceIndex.build([str(p)]).df.iloc[0]
    assert row["prompt_tokens"] == len(t.prompt_ids) and row["response_tokens"] == len(t.response_ids)


def test_trace_table_bad_record_opens_with_its_line(tmp_path, traces):
    p = tmp_path / "t.jsonl"
    d = traces[0].to_dict()
    d["response_mask"] = d["response_mask"][:-1]
    p.write_text(traces[1].to_json() + "\n" + json.dumps(d) + "\n")
    tbl = TraceIndex.build([str(p)])
    assert len(tbl) == 2
    from backend.trace import TraceFormatError

    with pytest.raises(TraceFormatError, match="line 2"):
        tbl.open(1)


def test_trace_table_parquet_json_and_memory(tmp_path, traces):
    pq_path = tmp_path / "t.parquet"
    write_parquet(traces, str(pq_path))
    tp = TraceIndex.build([str(pq_path)])
    jl = tmp_path / "t.jsonl"
    write_jsonl(traces, str(jl))
    tj = TraceIndex.build([str(jl)])
    cols = ["id", "source", "turns", "tokens", "termination_reason", "errors", "messages", "tools"]
    assert tp.df[cols].equals(tj.df[cols])
    assert tp.open(2) == traces[2]
    js = tmp_path / "t.json"
    js.write_text(json.dumps([t.to_dict() for t in traces]))
    assert TraceIndex.build([str(js)]).open(0) == traces[0]
    mem = TraceIndex.of_traces(traces, [LoadProblem(3, "x")])
    assert mem.df[cols].equals(tj.df[cols]) and mem.open(1) is traces[1]


# ---- CLI ----------------------------------------------------------------------------------------


def _cli(*args):
    return run_cli(*args)


def test_cli_export(tmp_path, traces):
    src = tmp_path / "in.jsonl"
    write_jsonl(traces, str(src))
    for fmt, name in (("parquet", "o.parquet"), ("hf", "o.hf.jsonl"), ("verl", "o.verl.jsonl"), ("jsonl", "o.jsonl")):
        out = tmp_path / name
        r = _cli("export", str(src), "--to", fmt, "--out", str(out), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["traces"] == len(traces)
    assert read_parquet_traces(str(tmp_path / "o.parquet")).traces == traces
    r = _cli("export", str(tmp_path / "o.parquet"), "--to", "jsonl", "--out", str(tmp_path / "back.jsonl"))
    assert r.returncode == 0 and load_traces(str(tmp_path / "back.jsonl")).traces == traces
    r = _cli("export", str(tmp_path / "missing.jsonl"), "--to", "hf", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and r.stderr.startswith("error:")
    r = _cli("export", os.path.join(DATA, "openai_chat.jsonl"), "--to", "hf", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "import --from openai-chat" in r.stderr


def test_trace_index_over_several_files(tmp_path, traces):
    """One index over a list of files (JSONL, our Parquet, a JSON list): rows in file order, each
    with its file, and each opens to the trace load_any gives for it."""
    jl, pq_path, js = tmp_path / "a.jsonl", tmp_path / "b.parquet", tmp_path / "c.json"
    write_jsonl(traces[:2], str(jl))
    write_parquet(traces[2:4], str(pq_path))
    js.write_text(json.dumps([t.to_dict() for t in traces[4:]]))
    ix = TraceIndex.build([str(jl), str(pq_path), str(js)])
    want = [t for p in (jl, pq_path, js) for t in load_any(str(p)).traces]
    assert len(ix) == len(want) == len(traces)
    assert ix.cols["file"] == [0, 0, 1, 1] + [2] * (len(traces) - 4)
    assert [f.kind for f in ix.files] == ["jsonl", "parquet", "memory"]
    assert [ix.open(i) for i in range(len(ix))] == want
    assert ix.cols["line"][:4] == [1, 2, 1, 2] and ix.cols["offset"][2:4] == [-1, -1]


def test_every_reader_reads_lines_through_one_reader(tmp_path, traces, monkeypatch):
    """load_traces, load_any, the importers and the index read a JSONL file through
    backend.trace.io.read_lines (the one bounded line reader): a change to it reaches them all."""
    import backend.trace.io as trace_io
    from backend.importers import detect

    p = tmp_path / "t.jsonl"
    write_jsonl(traces[:3], str(p))
    calls: list[str] = []
    real = trace_io.read_lines

    def counting(stream, max_line_bytes=None):
        calls.append("read_lines")
        return real(stream, max_line_bytes)

    monkeypatch.setattr(trace_io, "read_lines", counting)
    for name, fn in (("load_traces", load_traces), ("load_any", load_any), ("import_file", import_file), ("detect", detect),
                     ("TraceIndex", lambda path: TraceIndex.build([path])), ("TraceIndex(validate)", lambda path: TraceIndex.build([path], validate=True))):
        calls.clear()
        fn(str(p))
        assert calls, f"{name} read the file without read_lines"
