"""Trace sets (issue 16): the index's summary columns (training step, tool and parse errors), the
index over a folder or glob of JSONL / Parquet files, its on-disk cache, following a run while a
writer appends, and the CLI / app plumbing of ``--traces``. Files are real files on disk written by
our engine (the scripted backend with the real Qwen3 tokenizer) and in verl's dump layout."""

from __future__ import annotations

import asyncio
import json

import pytest

from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.tokenizers import load_tokenizer
from backend.trace import Trace, TraceIndex, write_jsonl, write_parquet
from backend.trace.io import SUMMARY_COLUMNS, summary_of_record, summary_of_trace

CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "x", "arguments": {\n</tool_call>'
UNKNOWN = '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>'


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
    """
    return {"temperature": 72, "city": city}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def run_loop(qwen3, script: list[str], prompt: str = "What's the weather in Seattle?") -> Trace:
    from backend.tools import ToolRegistry

    tools = ToolRegistry.from_functions([get_current_temperature])
    loop = AgentLoop(ScriptedGenerator(qwen3.tokenizer, script), qwen3, tools=tools, config=LoopConfig())
    return asyncio.run(loop.run([{"role": "user", "content": prompt}]))


@pytest.fixture(scope="module")
def engine_traces(qwen3) -> list[Trace]:
    """A clean tool call, a malformed call (a parse error), an unknown tool (a failed tool
    result), and a plain answer."""
    return [run_loop(qwen3, s) for s in ([CALL, "72°F"], [BAD_CALL], [UNKNOWN, "sorry"], ["plain answer"])]


# ---- the three columns -------------------------------------------------------------------------------


def test_new_summary_columns_from_engine_traces(tmp_path, engine_traces):
    """``tool_errors`` and ``parse_errors`` split ``errors`` (which keeps its meaning:
    Trace.step_errors); the light JSONL parse, the validating parse and Parquet agree."""
    for c in ("training_step", "tool_errors", "parse_errors"):
        assert c in SUMMARY_COLUMNS
    ok, bad, unknown, plain = (summary_of_trace(t) for t in engine_traces)
    assert (ok["tool_errors"], ok["parse_errors"], ok["errors"]) == (0, 0, 0)
    assert bad["parse_errors"] >= 1 and bad["tool_errors"] == 0
    assert unknown["tool_errors"] >= 1 and unknown["parse_errors"] == 0
    assert plain["training_step"] is None
    for t in engine_traces:
        s = summary_of_trace(t)
        assert s["errors"] == t.step_errors()
        assert s == summary_of_record(t.to_dict())
        expect_parse = sum(1 for st in t.steps for e in st.parse_errors if e.severity == "error")
        expect_tool = sum(1 for st in t.steps for r in st.tool_results if not r.ok)
        expect_tool += sum(1 for st in t.steps if st.error and st.state == "processing_tools")
        assert (s["parse_errors"], s["tool_errors"]) == (expect_parse, expect_tool)
    j, p = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    write_jsonl(engine_traces, str(j))
    write_parquet(engine_traces, str(p))
    frames = [TraceIndex.build([str(j)]).df, TraceIndex.build([str(j)], validate=True).df, TraceIndex.build([str(p)]).df]
    for df in frames:
        assert df["tool_errors"].tolist() == [summary_of_trace(t)["tool_errors"] for t in engine_traces]
        assert df["parse_errors"].tolist() == [summary_of_trace(t)["parse_errors"] for t in engine_traces]
        assert df["errors"].tolist() == [t.step_errors() for t in engine_traces]
        assert str(df["training_step"].dtype) == "Int64" and df["training_step"].isna().all()


def test_step_error_of_a_tool_step_counts_as_tool_error(engine_traces):
    t = engine_traces[0].model_copy(deep=True)
    tool_steps = [s for s in t.steps if s.state == "processing_tools"]
    gen_steps = [s for s in t.steps if s.state == "generating"]
    assert tool_steps and gen_steps
    tool_steps[0].error = "tool worker died"
    gen_steps[0].error = "generator failed"
    s = summary_of_trace(t)
    assert s["tool_errors"] == 1 and s["errors"] == 2 and s["parse_errors"] == 0
    assert summary_of_record(t.to_dict()) == s


@pytest.mark.parametrize(("meta", "step"), [
    ({"training_step": 7}, 7), ({"global_step": 12}, 12), ({"step": 3}, 3), ({"step": "41"}, 41),
    ({"training_step": 5, "step": 9}, 5), ({"step": True}, None), ({"step": 2.5}, None), ({"step": "x1"}, None), ({}, None),
])
def test_training_step_from_metadata(engine_traces, meta, step):
    t = engine_traces[3].model_copy(deep=True)
    t.metadata.update(meta)
    assert summary_of_trace(t)["training_step"] == step
    assert summary_of_record(json.loads(t.to_json()))["training_step"] == step


def test_training_step_from_a_verl_dump_file_name(tmp_path, engine_traces):
    """verl writes ``rollout_data_dir/<step>.jsonl``; the metadata's step wins where it has one."""
    a = engine_traces[3].model_copy(deep=True)
    b = engine_traces[0].model_copy(deep=True)
    b.metadata["global_step"] = 99
    write_jsonl([a, b], str(tmp_path / "17.jsonl"))
    write_jsonl([a], str(tmp_path / "run-17.jsonl"))
    write_parquet([a], str(tmp_path / "18.parquet"))
    df = TraceIndex.build([str(tmp_path / "17.jsonl"), str(tmp_path / "run-17.jsonl"), str(tmp_path / "18.parquet")]).df
    assert df["training_step"].tolist()[:2] == [17, 99]
    assert df["training_step"].isna().tolist()[2] and df["training_step"].tolist()[3] == 18
