"""Trace sets (issue 16): the index's summary columns (training step, tool and parse errors), the
index over a folder or glob of JSONL / Parquet files, its on-disk cache, following a run while a
writer appends, and the CLI / app plumbing of ``--traces``. Files are real files on disk written by
our engine (the scripted backend with the real Qwen3 tokenizer) and in verl's dump layout."""

from __future__ import annotations

import asyncio
import json

import pytest
from cli_inprocess import run_cli

import backend.importers  # noqa: F401 - registers other tools' readers (verl dumps) with the trace-set catalogue
from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.trace import Trace, TraceIndex, write_jsonl, write_parquet
from backend.trace.index import SUMMARY_COLUMNS, summary_of_record, summary_of_trace

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


# ---- trace sets: a folder indexed -----------------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from backend.trace.catalog import TraceSet, resolve  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Each test its own index cache folder."""
    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))


def variants(engine_traces, n: int, prefix: str = "t", step: int | None = None) -> list[Trace]:
    """``n`` copies of the engine's traces with distinct ids (and a training step in metadata)."""
    out = []
    for i in range(n):
        t = engine_traces[i % len(engine_traces)].model_copy(deep=True)
        t.id = f"{prefix}-{i:05d}"
        if step is not None:
            t.metadata["training_step"] = step
        out.append(t)
    return out


def verl_layout(root, engine_traces, steps=(1, 2, 10), per_step=6) -> dict[int, list[Trace]]:
    """verl's ``rollout_data_dir``: one ``<step>.jsonl`` per training step."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for s in steps:
        ts = variants(engine_traces, per_step, prefix=f"s{s}")
        write_jsonl(ts, str(root / f"{s}.jsonl"))
        out[s] = ts
    return out


def test_set_over_a_verl_dump_folder(tmp_path, engine_traces):
    by_step = verl_layout(tmp_path / "rollout", engine_traces)
    (tmp_path / "rollout" / "notes.txt").write_text("not a trace file")
    ts = TraceSet.open_set(str(tmp_path / "rollout"), final=True)
    assert [os.path.basename(f.path) for f in ts.files] == ["1.jsonl", "2.jsonl", "10.jsonl"]  # natural order
    df = ts.frame()
    assert len(ts) == 18 and not ts.problems
    assert df["training_step"].tolist() == [1] * 6 + [2] * 6 + [10] * 6
    want = [t for s in (1, 2, 10) for t in by_step[s]]
    assert df["id"].tolist() == [t.id for t in want]
    for i, t in enumerate(want):
        assert ts.open(i) == t and ts.open(t.id) == t
    # the same rows as the in-memory index of the same files
    ref = TraceIndex.build([f.path for f in ts.files]).frame()
    assert df.drop(columns=["file"]).equals(ref.drop(columns=["file"]))
    # a glob names the same files
    assert resolve(str(tmp_path / "rollout" / "*.jsonl")) == [f.path for f in ts.files]


def test_set_of_jsonl_and_parquet(tmp_path, engine_traces):
    a, b = variants(engine_traces, 7, "a"), variants(engine_traces, 1100, "b")
    write_jsonl(a, str(tmp_path / "a.jsonl"))
    write_parquet(b, str(tmp_path / "b.parquet"), batch_rows=256)  # several row groups
    ts = TraceSet.open_set(str(tmp_path), final=True)
    assert len(ts) == 1107 and not ts.problems
    ref = TraceIndex.build([str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")]).frame()
    assert ts.frame().drop(columns=["file"]).equals(ref.drop(columns=["file"]))
    for i in (0, 6, 7, 7 + 255, 7 + 256, 1106):
        want = (a + b)[i]
        assert ts.open(i) == want
    assert ts.location(7 + 300) == (str(tmp_path / "b.parquet"), 301)


def test_corrupt_and_partial_lines_in_the_middle_of_a_large_file(tmp_path, engine_traces, monkeypatch):
    """Bad lines among thousands of good ones: each reported with its line number, every good
    trace indexed and opened by its bytes; a line cut short in the middle is a bad line (its
    newline is there), not a line being written."""
    monkeypatch.setenv("ALI_MAX_TRACE_LINE_BYTES", str(64 << 10))
    import backend.trace.io as tio

    monkeypatch.setattr(tio, "DEFAULT_MAX_LINE_BYTES", 64 << 10)
    good = variants(engine_traces, 3000, "g")
    lines = [t.to_json() for t in good]
    bad = {
        500: lines[10][: len(lines[10]) // 2],  # cut short (a writer killed mid-line, then resumed)
        1200: "{not json",
        1800: json.dumps({"hello": "world"}),  # JSON, not a trace
        2400: "[1, 2, 3]",
        2900: '{"format_version": 1, "id": "' + "x" * (70 << 10) + '"}',  # over the line limit
    }
    out, expect_problems, expect_good = [], [], []
    gi = 0
    for ln in range(1, len(good) + len(bad) + 1):
        if ln in bad:
            out.append(bad[ln])
            expect_problems.append(ln)
        else:
            out.append(lines[gi])
            expect_good.append((ln, good[gi]))
            gi += 1
    p = tmp_path / "big.jsonl"
    p.write_text("\n".join(out) + "\n")
    assert p.stat().st_size > 10 << 20
    ts = TraceSet.open_set(str(p))
    assert [pr.line for pr in ts.problems] == expect_problems
    assert "line limit" in ts.problems[-1].reason
    df = ts.frame()
    assert len(ts) == len(expect_good) and df["line"].tolist() == [ln for ln, _ in expect_good]
    for i in (0, 499, 500, 1500, len(expect_good) - 1):
        assert ts.open(i) == expect_good[i][1]


def test_partial_last_line_is_indexed_once_complete(tmp_path, engine_traces):
    t1, t2, t3 = variants(engine_traces, 3, "p")
    p = tmp_path / "run.jsonl"
    line2 = t2.to_json()
    p.write_text(t1.to_json() + "\n" + line2[:100])
    ts = TraceSet.open_set(str(tmp_path))
    assert len(ts) == 1 and not ts.problems and ts.pending_lines == 1
    with open(p, "a") as f:
        f.write(line2[100:200])
    assert ts.refresh() == 0 and not ts.problems
    with open(p, "a") as f:
        f.write(line2[200:] + "\n{broken\n" + t3.to_json() + "\n")
    assert ts.refresh() == 2
    assert [pr.line for pr in ts.problems] == [3]
    assert ts.frame()["line"].tolist() == [1, 2, 4] and ts.open(1) == t2 and ts.open(2) == t3
    assert ts.pending_lines == 0
    # a one-shot reader (final) indexes a last line without its newline as it is
    q = tmp_path / "nonl.jsonl"
    q.write_text(t1.to_json() + "\n" + t3.to_json())
    one = TraceSet.open_set(str(q), final=True)
    assert len(one) == 2 and one.open(1) == t3


def test_cache_hit_miss_grown_invalidated(tmp_path, engine_traces):
    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1, 2), per_step=50)
    first = TraceSet.open_set(str(d))
    assert first.stats["miss"] == 2 and first.stats["hit"] == 0 and len(first) == 100
    again = TraceSet.open_set(str(d))
    assert again.stats["hit"] == 2 and again.stats["miss"] == 0 and again.stats["scanned_bytes"] == 0
    assert again.frame().equals(first.frame())
    # appended lines: only the new bytes are read
    size = (d / "2.jsonl").stat().st_size
    extra = variants(engine_traces, 3, "new")
    with open(d / "2.jsonl", "a") as f:
        for t in extra:
            f.write(t.to_json() + "\n")
    grown = TraceSet.open_set(str(d))
    assert grown.stats["grown"] == 1 and grown.stats["hit"] == 1
    assert grown.stats["scanned_bytes"] == (d / "2.jsonl").stat().st_size - size
    assert len(grown) == 103 and grown.open("new-00002") == extra[2]
    assert grown.frame()["line"].tolist()[-3:] == [51, 52, 53]
    # a rewritten file (same size, other bytes) is indexed again
    txt = (d / "1.jsonl").read_text()
    (d / "1.jsonl").write_text(txt.replace("s1-00000", "s1-zzzzz"))
    time.sleep(0.01)
    os.utime(d / "1.jsonl", ns=(time.time_ns(), time.time_ns()))
    re = TraceSet.open_set(str(d))
    assert re.stats["invalidated"] == 1 and re.open("s1-zzzzz").id == "s1-zzzzz"
    # a damaged cache entry is a miss, not an error
    for f in (tmp_path / "cache").iterdir():
        f.write_bytes(b"garbage")
    broken = TraceSet.open_set(str(d))
    assert broken.stats["miss"] == 2 and len(broken) == 103
    # no cache at all
    assert TraceSet.open_set(str(d), cache=False).frame().equals(broken.frame())


def test_refresh_follows_new_removed_and_truncated_files(tmp_path, engine_traces):
    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1,), per_step=4)
    ts = TraceSet.open_set(str(d))
    assert len(ts) == 4
    write_jsonl(variants(engine_traces, 2, "two"), str(d / "2.jsonl"))
    assert ts.refresh() == 2 and ts.frame()["training_step"].tolist() == [1] * 4 + [2] * 2
    write_jsonl(variants(engine_traces, 1, "one"), str(d / "1.jsonl"))  # shorter: indexed again
    assert ts.refresh() == -1 and ts.frame()["id"].tolist() == ["one-00000", "two-00000", "two-00001"]
    os.remove(d / "2.jsonl")
    assert ts.refresh() == -1 and len(ts) == 1 and ts.open(0).id == "one-00000"


def test_set_row_limit(tmp_path, engine_traces, monkeypatch):
    monkeypatch.setenv("ALI_MAX_INDEX_ROWS", "5")
    verl_layout(tmp_path / "r", engine_traces, steps=(1, 2), per_step=4)
    ts = TraceSet.open_set(str(tmp_path / "r"))
    assert len(ts) == 5 and ts.capped and "ALI_MAX_INDEX_ROWS" in ts.problems[-1].reason


def test_resolve_refuses_what_is_not_there(tmp_path):
    from backend.trace import TraceFileError

    with pytest.raises(TraceFileError, match="no such folder or file"):
        resolve(str(tmp_path / "nope"))
    with pytest.raises(TraceFileError, match="no such folder"):
        resolve(str(tmp_path / "nope" / "*.jsonl"))
    assert resolve(str(tmp_path)) == []


WRITER = r'''
import sys, time
src, out_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = open(src, encoding="utf-8").read().splitlines()
f = None
for i in range(n):
    if i % 10 == 0:  # a new file every 10 traces, as verl writes one per step
        if f: f.close()
        f = open(f"{out_dir}/{i // 10}.jsonl", "w", encoding="utf-8")
    line = lines[i]
    f.write(line[: len(line) // 2]); f.flush()  # half a line: being written
    time.sleep(0.01)
    f.write(line[len(line) // 2 :] + "\n"); f.flush()
    time.sleep(0.01)
f.close()
print("done", flush=True)
'''


def test_writer_process_appends_while_the_index_follows(tmp_path, engine_traces):
    """A writer process appends traces (half a line at a time, a new file every 10) while the
    set refreshes: rows only grow, no partial line is ever reported, and at the end every trace
    written is indexed once, in order, and opens as written."""
    n = 60
    traces = variants(engine_traces, n, "w")
    src = tmp_path / "src.jsonl"
    write_jsonl(traces, str(src))
    out = tmp_path / "live"
    out.mkdir()
    ts = TraceSet.open_set(str(out))
    assert len(ts) == 0
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(src), str(out), str(n)], stdout=subprocess.PIPE, text=True)
    seen = [0]
    try:
        while proc.poll() is None:
            ts.refresh()
            assert not ts.problems, ts.problems[:3]
            assert len(ts) >= seen[-1]
            seen.append(len(ts))
            time.sleep(0.02)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    ts.refresh()
    assert len(ts) == n and not ts.problems and ts.pending_lines == 0
    assert ts.frame()["id"].tolist() == [t.id for t in traces]
    assert ts.frame()["training_step"].tolist() == [i // 10 for i in range(n)]
    assert len(set(seen)) > 3  # rows appeared while the writer was writing
    for i in (0, 29, 59):
        assert ts.open(i) == traces[i]
    ts.flush()
    cached = TraceSet.open_set(str(out))
    assert cached.stats["hit"] == 6 and cached.frame().equals(ts.frame())


# ---- the Trace files tab over a set (in process) ----------------------------------------------------


def _app_ctx(spec: str | None, public: bool = False):
    from backend.safety.trust import Mode, TrustPolicy
    from ui.context import AppContext

    return AppContext(traces=spec, trust=TrustPolicy(mode=Mode.PUBLIC if public else Mode.LOCAL))


def test_tab_pages_and_filters_over_the_index(tmp_path, engine_traces):
    from ui import trace_files as tf
    from ui import trace_sets as sets
    from ui.context import new_session

    by_step = verl_layout(tmp_path / "run", engine_traces, steps=(1, 2, 3), per_step=130)
    ctx = _app_ctx(str(tmp_path / "run"))
    sess = new_session(ctx)
    assert sets.in_set_mode(sess)
    reason_dd, source_dd, step_dd, table, page, status, probs = sets.set_outputs(sess)
    assert list(table.columns) == sets.SET_COLUMNS and len(table) == sets.PAGE_ROWS
    assert step_dd["choices"] == [sets.ALL, "1", "2", "3"] and 'data-rows="390"' in status
    assert table["id"].iloc[0] == by_step[3][-1].id  # newest first
    assert sess.traces.keys() == set() or all(not k.startswith("set") for k in sess.traces)  # nothing held
    view = sess.set_view
    view.step, view.newest = "2", False
    table = sets.set_outputs(sess)[3]
    assert table["id"].tolist() == [t.id for t in by_step[2]][: sets.PAGE_ROWS]
    view.page = 2
    assert sets.set_outputs(sess)[3]["id"].tolist() == [t.id for t in by_step[2]][sets.PAGE_ROWS:]
    view.step, view.page = sets.ALL, 1
    # termination by its label or verl's code; the parse-error traces are malformed_tool_call
    mal = [t for s in (1, 2, 3) for t in by_step[s] if t.termination_reason == "malformed_tool_call"]
    assert mal
    from backend.checks.labels import termination_label

    for reason in ("malformed_tool_call", termination_label("malformed_tool_call")):
        view.reason = reason
        out = sets.set_outputs(sess)
        assert len(mal) < sets.PAGE_ROWS and sorted(out[3]["id"]) == sorted(t.id for t in mal)
    view.reason = sets.ALL
    view.query = "S2-0001"  # case-insensitive, literal, over id and preview
    assert sorted(sets.set_outputs(sess)[3]["id"]) == sorted(t.id for t in by_step[2] if "s2-0001" in t.id)
    view.query = "weather in seattle"
    assert len(sets.set_matches(sess.set_registry.get(sess.set_spec)[0].df, None, None, None, view.query)) == 390
    view.query = "(["  # not a regex
    assert sets.set_outputs(sess)[3].empty
    # opening a row reads that trace by its bytes into the session
    view.query = ""
    row = sets.set_outputs(sess)[3].iloc[5]
    label = sets.open_set_row(sess, row)
    assert sess.traces[label].id == row["id"] and label.startswith("set · ")
    # the count line
    assert "of 390 matching" in tf.match_count(sess, sets.set_outputs(sess)[3])


def test_tab_follows_new_files_through_the_registry(tmp_path, engine_traces):
    from ui import trace_sets as sets
    from ui.context import new_session

    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1,), per_step=3)
    ctx = _app_ctx(str(d))
    ctx.trace_sets.min_interval = 0.0
    a, b = new_session(ctx), new_session(ctx)
    sets.set_outputs(a)
    v0 = a.set_view.version
    write_jsonl(variants(engine_traces, 4, "late"), str(d / "2.jsonl"))
    ts, v1 = ctx.trace_sets.poll(str(d))
    assert v1 > v0 and len(ts) == 7
    assert b.set_registry is a.set_registry and sets.set_outputs(b)[3]["id"].iloc[0] == "late-00003"
    assert ctx.trace_sets.poll(str(d))[1] == v1  # nothing new: same version


def test_public_mode_never_takes_a_path(tmp_path, engine_traces):
    """In public mode the tab has no folder field; the set shown is the operator's only."""
    import gradio as gr

    from ui import trace_sets as sets

    verl_layout(tmp_path / "op", engine_traces, steps=(1,), per_step=2)
    with gr.Blocks():
        pub = sets.build_set(_app_ctx(str(tmp_path / "op"), public=True))
    assert pub is not None and pub["folder"] is None
    with gr.Blocks():
        assert sets.build_set(_app_ctx(None, public=True)) is None
        loc = sets.build_set(_app_ctx(None))
    assert loc is not None and loc["folder"] is not None


def test_app_flag_and_env(tmp_path, monkeypatch, engine_traces):
    import app as app_module

    verl_layout(tmp_path / "r", engine_traces, steps=(1,), per_step=2)
    args = app_module.parse_args(["--traces", str(tmp_path / "r"), "--no-model"], environ={})
    assert args.traces == str(tmp_path / "r")
    args = app_module.parse_args(["--no-model"], environ={"ALI_TRACES": str(tmp_path / "r" / "*.jsonl")})
    assert args.traces.endswith("*.jsonl")
    assert app_module.build_context(args).traces == args.traces
    bad = app_module.parse_args(["--no-model", "--traces", str(tmp_path / "missing")], environ={})
    with pytest.raises(SystemExit, match="--traces: no such folder"):
        app_module.build_context(bad)


# ---- the CLI ------------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str, env_cache) -> subprocess.CompletedProcess:
    return run_cli(*args, env={"ALI_TRACE_INDEX_CACHE": str(env_cache)})


def test_cli_index(tmp_path, engine_traces):
    import pandas as pd

    d = tmp_path / "run"
    by_step = verl_layout(d, engine_traces, steps=(3, 4), per_step=5)
    with open(d / "4.jsonl", "a") as f:
        f.write("{oops\n")
    r = cli("index", str(d), "--json", "--out", str(tmp_path / "ix.csv"), env_cache=tmp_path / "c")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["traces"] == 10 and out["per_step"] == {"3": 5, "4": 5} and out["cache"]["miss"] == 2
    assert [(os.path.basename(p["file"]), p["line"]) for p in out["problems"]] == [("4.jsonl", 6)]
    assert "4.jsonl:6" in r.stderr
    rows = pd.read_csv(tmp_path / "ix.csv")
    assert rows["id"].tolist() == [t.id for s in (3, 4) for t in by_step[s]]
    again = cli("index", str(d / "3.jsonl"), "--json", env_cache=tmp_path / "c")
    assert again.returncode == 0 and json.loads(again.stdout)["cache"]["hit"] == 1
    missing = cli("index", str(tmp_path / "nope"), env_cache=tmp_path / "c")
    assert missing.returncode == 2 and "no such folder or file" in missing.stderr and "Traceback" not in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("index", str(empty), env_cache=tmp_path / "c").returncode == 2


def test_cli_index_counts_the_rl_columns(tmp_path):
    """``index`` on a prime-rl run folder (tests/fixtures_gen/gen_verifiers.py): the distinct
    group ids and the rows per trainer rank, as the files state them (read here with json); the
    --out rows carry group, sample and rank."""
    import glob

    import pandas as pd

    src = os.path.join(ROOT, "tests", "data", "import", "verifiers", "run")
    groups, ranks = set(), {}
    for p in glob.glob(os.path.join(src, "rollouts", "**", "traces.jsonl"), recursive=True):
        groups |= {json.loads(line)["group"]["id"] for line in open(p, encoding="utf-8")}
    for p in glob.glob(os.path.join(src, "token_exports", "*", "rank_*.jsonl")):
        for line in open(p, encoding="utf-8"):
            r = str(json.loads(line)["rank"])
            ranks[r] = ranks.get(r, 0) + 1
    r = cli("index", src, "--json", "--out", str(tmp_path / "ix.csv"), env_cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["groups"] == len(groups) > 1 and out["ranks"] == dict(sorted(ranks.items()))
    rows = pd.read_csv(tmp_path / "ix.csv")
    assert {"group", "sample", "rank"} <= set(rows.columns) and set(rows["group"].dropna()) == groups
    text = cli("index", src, env_cache=tmp_path / "c").stdout
    assert f"GRPO groups named by the files: {len(groups)}" in text and "per trainer rank: " in text


def test_cli_index_follow_prints_new_traces(tmp_path, engine_traces):
    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1,), per_step=2)
    env = dict(os.environ, HF_HUB_OFFLINE="1", ALI_TRACE_INDEX_CACHE=str(tmp_path / "c"))
    proc = subprocess.Popen([sys.executable, "-m", "backend", "index", str(d), "--follow", "--interval", "0.2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "2 trace(s) in 1 file(s)" in proc.stdout.readline()
        write_jsonl(variants(engine_traces, 1, "later"), str(d / "2.jsonl"))
        for _ in range(50):
            line = proc.stdout.readline()
            if "later-00000" in line:
                break
        assert line.startswith("step 2\tlater-00000\t")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_check_over_a_folder(tmp_path, engine_traces):
    """``check DIR`` reads the set through its index, one trace at a time: the same findings as
    ``check FILE`` of each file, and the bad records with their file and line."""
    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1, 2), per_step=4)
    bad = engine_traces[0].to_dict()
    bad["response_mask"] = bad["response_mask"][:-1]  # JSON of the right shape, not a valid trace: found when opened
    with open(d / "2.jsonl", "a") as f:
        f.write(json.dumps(bad) + "\n")
    r = cli("check", str(d), "--no-tokens", "--json", env_cache=tmp_path / "c")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert [t["id"] for t in out["traces"]] == [f"s{s}-{i:05d}" for s in (1, 2) for i in range(4)]
    assert [(os.path.basename(p["file"]), p["line"]) for p in out["problems"]] == [("2.jsonl", 5)]
    one = json.loads(cli("check", str(d / "1.jsonl"), "--no-tokens", "--json", env_cache=tmp_path / "c").stdout)
    assert out["traces"][:4] == one["traces"]
    glob_run = cli("check", str(d / "1.*"), "--no-tokens", "--json", env_cache=tmp_path / "c")
    assert glob_run.returncode == 0 and json.loads(glob_run.stdout)["traces"] == one["traces"]


def test_shown_index_is_what_the_tab_lists(tmp_path, engine_traces):
    """``shown_index`` (for the charts by training step): the set, or the uploaded file, or the samples."""
    from ui import trace_files as tf
    from ui.context import new_session

    verl_layout(tmp_path / "run", engine_traces, steps=(5,), per_step=3)
    ctx = _app_ctx(str(tmp_path / "run"))
    sess = new_session(ctx)
    assert tf.shown_index(sess).frame()["training_step"].tolist() == [5, 5, 5]
    write_jsonl(variants(engine_traces, 2, "up", step=9), str(tmp_path / "up.jsonl"))
    sess.set_spec = None
    tf.load_file(ctx, sess, str(tmp_path / "up.jsonl"))
    assert tf.shown_index(sess).frame()["id"].tolist() == ["up-00000", "up-00001"]
    assert tf.shown_index(sess).frame()["training_step"].tolist() == [9, 9]


def test_cache_prune_removes_entries_of_gone_files(tmp_path, engine_traces):
    from backend.trace.catalog import prune_cache

    d = tmp_path / "run"
    verl_layout(d, engine_traces, steps=(1, 2), per_step=2)
    cache = tmp_path / "cache"
    TraceSet.open_set(str(d))
    assert len(list(cache.iterdir())) == 2
    os.remove(d / "2.jsonl")
    (cache / "junk.parquet").write_bytes(b"not parquet")
    old = cache / "x.parquet.123.tmp"
    old.write_bytes(b"")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert prune_cache(str(cache)) == 3
    assert len(list(cache.iterdir())) == 1 and TraceSet.open_set(str(d)).stats["hit"] == 1


# ---- verl's own rollout dump (trainer.rollout_data_dir/<step>.jsonl: input/output text) -------------


def verl_dump(path, qwen3, traces: list[Trace], step: int, uids: bool = True) -> list[dict]:
    """Rows as verl's ``_dump_generations`` writes them: the prompt and response decoded with
    ``skip_special_tokens=True``, ``gts``, ``score``, ``step`` and reward extras, one
    ``json.dumps(entry, ensure_ascii=False)`` per line."""
    rows = []
    for k, t in enumerate(traces):
        row = {"input": qwen3.tokenizer.decode(t.prompt_ids, skip_special_tokens=True),
               "output": qwen3.tokenizer.decode(t.response_ids, skip_special_tokens=True),
               "gts": "72", "score": k / 4, "step": step, "acc": k % 2 == 0}
        if uids:
            row["uid"] = f"u{step}-{k}"
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows


def test_set_indexes_and_opens_verl_rollout_dump_rows(tmp_path, qwen3, engine_traces):
    from backend.trace.catalog import TraceSet
    from backend.trace.index import PREVIEW_CHARS

    d = tmp_path / "rollout"
    rows = verl_dump(d / "7.jsonl", qwen3, engine_traces, step=7)
    nouid = verl_dump(d / "8.jsonl", qwen3, engine_traces[:2], step=8, uids=False)
    # a file mixing our records and verl rows, with a bad line between them
    with open(d / "8.jsonl", "a") as f:
        f.write("{oops\n")
        f.write(engine_traces[3].to_json() + "\n")
    ts = TraceSet.open_set(str(d), final=True, cache=str(tmp_path / "c"))
    df = ts.df
    assert len(df) == 7 and [(os.path.basename(p), ln) for p, ln, _ in ts.problem_rows()] == [("8.jsonl", 3)]
    verl = df[df["source"] == "verl"]
    assert verl["id"].tolist()[:4] == [r["uid"] for r in rows]
    assert verl["training_step"].tolist() == [7] * 4 + [8] * 2
    assert verl["score"].tolist() == [r["score"] for r in rows + nouid]
    assert verl["tokens"].isna().all() and verl["turns"].isna().all() and (verl["errors"] == 0).all()
    assert verl["preview"].tolist()[:4] == [" ".join(r["input"].split())[:PREVIEW_CHARS] for r in rows]
    ours = df[df["source"] != "verl"]
    assert ours["id"].tolist() == [engine_traces[3].id] and ours["tokens"].iloc[0] == len(engine_traces[3].prompt_ids) + len(engine_traces[3].response_ids)
    # ids of rows without a uid are stable across a rebuild
    again = TraceSet.open_set(str(d), final=True, cache=False)
    assert again.df["id"].tolist() == df["id"].tolist()
    # opening converts the row with the verl importer and the set's tokenizer
    t = ts.open(rows[0]["uid"])
    assert t.id == rows[0]["uid"] and t.metadata.get("source") == "verl" and t.metadata["score"] == 0.0 and t.metadata["step"] == 7
    assert t.messages[-1]["role"] == "assistant" and t.messages[-1]["content"] == rows[0]["output"].rsplit("assistant\n", 1)[-1] == "72°F"
    assert [m["role"] for m in t.messages if m["role"] != "system"] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1]["tool_calls"][0]["function"]["name"] == "get_current_temperature" and t.response_ids
    u = ts.open(int(df.index[df["id"] == verl["id"].iloc[4]][0]))
    assert u.id == verl["id"].iloc[4] and u.metadata["step"] == 8
    assert ts.open(engine_traces[3].id).response_ids == engine_traces[3].response_ids
    # the cached index gives the same rows
    warm = TraceSet.open_set(str(d), final=True, cache=str(tmp_path / "c"))
    assert warm.stats["hit"] == 2 and warm.df["id"].tolist() == df["id"].tolist() and warm.df["tokens"].isna().sum() == 6


def test_cli_index_of_a_verl_rollout_dump(tmp_path, qwen3, engine_traces):
    d = tmp_path / "rollout"
    verl_dump(d / "1.jsonl", qwen3, engine_traces, step=1)
    verl_dump(d / "2.jsonl", qwen3, engine_traces[:3], step=2)
    r = cli("index", str(d), "--json", env_cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["traces"] == 7 and out["per_step"] == {"1": 4, "2": 3} and not out["problems"]
    # check reads each verl row through the set, converted with the given tokenizer
    chk = cli("check", str(d), "--tokenizer", "qwen3", "--json", env_cache=tmp_path / "c")
    assert chk.returncode == 0, chk.stderr
    assert [t["id"] for t in json.loads(chk.stdout)["traces"]] == [f"u{s}-{k}" for s, n in ((1, 4), (2, 3)) for k in range(n)]


def test_tab_opens_a_verl_rollout_dump_row(tmp_path, qwen3, engine_traces):
    from ui import trace_sets as sets
    from ui.context import new_session

    rows = verl_dump(tmp_path / "run" / "5.jsonl", qwen3, engine_traces, step=5)
    ctx = _app_ctx(str(tmp_path / "run"))
    sess = new_session(ctx)
    table = sets.set_outputs(sess)[3]
    assert sorted(table["id"]) == sorted(r["uid"] for r in rows)
    row = table[table["id"] == rows[1]["uid"]].iloc[0]
    label = sets.open_set_row(sess, row)
    t = sess.traces[label]
    assert t.id == rows[1]["uid"] and t.metadata.get("source") == "verl" and t.metadata["score"] == rows[1]["score"]
    assert t.response_ids and t.prompt_ids
