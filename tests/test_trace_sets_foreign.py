"""Trace sets over other tools' files (issue 22, item 4): an OpenTelemetry collector's export
(spans of one trace spread over several lines) listed one row per trace id, per-record formats
(chat logs) one row per conversation, the cache, a span file that grows, and rows that open to
the trace the importer gives for the same file. The span files are the fixtures written by the
real ``opentelemetry-instrumentation-openai-v2`` (tests/fixtures_gen/gen_otel.py)."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import pytest

from backend.importers import import_file
from backend.loading.tokenizers import load_tokenizer
from backend.trace.catalog import TraceSet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
OTLP = os.path.join(DATA, "otel", "openai_v2_spans.otlp.jsonl")


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def _trace_ids(path: str) -> list[str]:
    """The trace ids of an OTLP JSON-lines file, in the order of their first span, read with
    the standard library (not our reader)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        if s["traceId"] not in out:
                            out.append(s["traceId"])
    return out


def _messages(t) -> list[tuple]:
    return [(m["role"], m.get("content"), json.dumps(m.get("tool_calls"), sort_keys=True)) for m in t.messages]


def test_otlp_export_is_one_row_per_trace_and_opens_like_an_import(tmp_path, qwen3):
    d = tmp_path / "collector"
    d.mkdir()
    shutil.copy(OTLP, d / "export.jsonl")
    ts = TraceSet.open_set(str(d), cache=str(tmp_path / "cache"), final=True, import_bundle=lambda: qwen3)
    want = _trace_ids(OTLP)
    assert list(ts.df["id"]) == want and set(ts.df["source"]) == {"otel"}
    assert not ts.problems and not ts.file_errors
    assert all(x > 0 for x in ts.df["turns"]) and all(v is not None and v > 0 for v in ts.df["duration_s"])
    imported: dict[str, list] = {}
    for t in import_file(OTLP, "auto", bundle=qwen3).traces:
        imported.setdefault(t.metadata["provenance"]["trace_id"], []).append(t)
    assert set(imported) == set(want)
    for i, tid in enumerate(want):
        t = ts.open(i)
        assert t.metadata["provenance"]["trace_id"] == tid
        first, *others = imported[tid]  # a trace holding two agent runs is one row: its first, the others named
        assert _messages(t) == _messages(first) and t.prompt_ids == first.prompt_ids
        assert t.metadata["import"].get("other_conversations", []) == [x.id for x in others]
    # the cache gives the same rows without reading the file again
    again = TraceSet.open_set(str(d), cache=str(tmp_path / "cache"), final=True, import_bundle=lambda: qwen3)
    assert again.stats["hit"] == 1 and list(again.df["id"]) == want


def test_a_span_file_that_grows_is_indexed_again_with_the_new_spans(tmp_path, qwen3):
    """A trace whose spans arrive in a later export request (the collector appends a line): its
    row covers both lines after the refresh, not two rows of halves."""
    lines = open(OTLP, encoding="utf-8").read().splitlines()
    p = tmp_path / "live.jsonl"
    p.write_text(lines[0] + "\n", encoding="utf-8")
    ts = TraceSet.open_set(str(p), cache=str(tmp_path / "cache"), final=True, import_bundle=lambda: qwen3)
    first = list(ts.df["id"])
    with open(p, "a", encoding="utf-8") as f:
        f.write("\n".join(lines[1:]) + "\n")
    ts.refresh()
    assert list(ts.df["id"]) == _trace_ids(OTLP) and list(ts.df["id"])[: len(first)] == first
    assert len(set(ts.df["id"])) == len(ts.df)


def test_chat_logs_in_a_set_are_rows_per_conversation(tmp_path, qwen3):
    d = tmp_path / "logs"
    d.mkdir()
    shutil.copy(os.path.join(DATA, "openai_chat.jsonl"), d / "chat.jsonl")
    ts = TraceSet.open_set(str(d), cache=False, final=True, import_bundle=lambda: qwen3)
    res = import_file(os.path.join(DATA, "openai_chat.jsonl"), "auto", bundle=qwen3)
    assert list(ts.df["id"]) == [t.id for t in res.traces]
    assert [p[1] for p in ts.problem_rows()] == [p.line for p in res.problems]
    for i, t in enumerate(res.traces):
        got = ts.open(i)
        assert got.id == t.id and _messages(got) == _messages(t)
        assert ts.df["messages"].iat[i] == len(t.messages)


def test_trl_completions_folder_is_a_set_by_training_step(tmp_path, qwen3):
    """TRL's ``completions/`` folder (written by GRPOTrainer, tests/fixtures_gen/gen_trl.py): one
    row per completion with its step and the sum of its reward columns, read back from the
    Parquet files with pandas; each row opens to the trace the importer gives."""
    import glob

    import pandas as pd

    src = os.path.join(DATA, "trl", "completions")
    ts = TraceSet.open_set(src, cache=str(tmp_path / "cache"), final=True, import_bundle=lambda: qwen3)
    frames = [pd.read_parquet(p) for p in sorted(glob.glob(os.path.join(src, "*.parquet")))]
    df = pd.concat(frames, ignore_index=True)
    assert not ts.problem_rows() and set(ts.df["source"]) == {"trl"}
    assert list(ts.df["training_step"]) == list(df["step"])
    assert list(ts.df["score"].round(9)) == list(df[["right_answer", "brevity"]].sum(axis=1).round(9))
    imported = [t for p in sorted(glob.glob(os.path.join(src, "*.parquet"))) for t in import_file(p, "trl", bundle=qwen3).traces]
    for i, t in enumerate(imported):
        got = ts.open(i)
        assert got.id == t.id == ts.df["id"].iat[i] and _messages(got) == _messages(t)


def test_without_the_importers_hook_our_traces_index_as_before_and_other_rows_say_why(tmp_path, qwen3):
    """The catalogue reads other tools' rows only through the hook :mod:`backend.importers`
    registers (``backend.trace.catalog.register_foreign_rows``; the trace layer never imports the
    importers). Taken away: our trace file indexes and opens to the same rows; an OTLP export, a
    chat log and a TRL Parquet file are listed as problems naming backend.importers; a row of
    them opened says so; and a cache entry is used only where the hook is as it was when written."""
    import pandas as pd

    from backend.trace import catalog

    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(os.path.join(ROOT, "sample_traces", "01_weather.jsonl"), d / "a_ours.jsonl")
    shutil.copy(OTLP, d / "b_export.jsonl")
    shutil.copy(os.path.join(DATA, "openai_chat.jsonl"), d / "c_chat.jsonl")
    shutil.copy(os.path.join(DATA, "trl", "completions", "completions_00001.parquet"), d / "d_trl.parquet")
    cache = str(tmp_path / "cache")
    hooked = catalog.foreign_rows()
    assert hooked is not None  # backend.importers is imported by this module
    full = TraceSet.open_set(str(d), cache=cache, final=True, import_bundle=lambda: qwen3)
    ours = full.df[full.df["file"] == 0]
    not_json = [p for p in full.problem_rows() if p[2].startswith("invalid JSON")]
    assert len(ours) and len(full.df) > len(ours) and not_json  # the chat log holds a line that is not JSON
    chat_row = int(full.df.index[full.df["file"] == 2][0])
    catalog.register_foreign_rows(None)
    try:
        bare = TraceSet.open_set(str(d), cache=cache, final=True)
        assert bare.stats["hit"] == 0 and bare.stats["miss"] == 4  # the entries written with the hook: not used
        # the same rows (the token columns are nullable in the mixed set: other tools' rows have none)
        pd.testing.assert_frame_equal(bare.frame(), ours, check_dtype=False)
        assert [bare.open(i) for i in range(len(bare))] == [full.open(i) for i in range(len(ours))]
        problems = bare.problem_rows()
        by_file = {os.path.basename(f) for f, _, _ in problems}
        assert by_file == {"b_export.jsonl", "c_chat.jsonl", "d_trl.parquet"}
        assert [p for p in problems if catalog.NO_FOREIGN_ROWS not in p[2]] == not_json  # the reader's reason stands
        assert [os.path.basename(f) for f, _ in bare.file_errors] == ["d_trl.parquet"]
        # a set indexed with the hook, read without it
        got = full.read(chat_row)
        assert not hasattr(got, "messages") and catalog.NO_FOREIGN_ROWS in got.reason
    finally:
        catalog.register_foreign_rows(hooked)
    again = TraceSet.open_set(str(d), cache=cache, final=True, import_bundle=lambda: qwen3)
    assert again.stats["hit"] == 0 and again.frame().equals(full.frame())


def test_rl_columns_group_sample_rank_are_the_files_own(tmp_path, qwen3):
    """The index's RL columns (issue 30, item 5) on a prime-rl run folder (written by the real
    verifiers / prime-rl code, tests/fixtures_gen/gen_verifiers.py): a verifiers episode's rows
    carry its ``group.id``, a token export's rows its ``rank`` and ``step``, read here from the
    files with json; cold and from the cache alike; the same values as the imported traces' rows
    (``summary_of_trace``)."""
    import glob

    from backend.trace.index import summary_of_trace

    src = os.path.join(DATA, "verifiers", "run")
    want: dict[str, tuple[object, object, object]] = {}  # id -> (group, rank, step)
    for p in sorted(glob.glob(os.path.join(src, "token_exports", "*", "rank_*.jsonl"))):
        for line in open(p, encoding="utf-8"):
            r = json.loads(line)
            want[f"prime-rl-s{r['step']}-r{r['rank']}-{r['export_sequence_idx']}"] = (None, r["rank"], r["step"])
    for p in sorted(glob.glob(os.path.join(src, "rollouts", "*", "*", "*", "traces.jsonl"))):
        for line in open(p, encoding="utf-8"):
            ep = json.loads(line)
            for tr in ep["traces"]:
                want[tr["id"]] = (ep["group"]["id"], None, ep["run"]["work"]["step"])
    assert len({g for g, _, _ in want.values() if g}) >= 2 and len({r for _, r, _ in want.values() if r is not None}) == 2
    cache = str(tmp_path / "cache")
    for _ in range(2):  # cold, then from the cache
        ts = TraceSet.open_set(src, cache=cache, final=True, import_bundle=lambda: qwen3)
        df = ts.df
        assert not ts.problem_rows() and sorted(df["id"]) == sorted(want)
        for _, row in df.iterrows():
            group, rank, step = want[row["id"]]
            assert (row["group"], None if row["rank"] is pd.NA else row["rank"], row["training_step"]) == (group, rank, step), row["id"]
            assert row["sample"] is pd.NA
    for i in range(len(df)):
        s = summary_of_trace(ts.open(i))
        assert (s["group"], s["rank"], s["sample"]) == (want[s["id"]][0], want[s["id"]][1], None)


def test_rl_columns_of_our_traces_and_a_verl_uid(tmp_path):
    """Our own traces give ``metadata.group`` / ``sample`` / ``rank`` as written; a verl rollout-dump
    row (hand-built here) its ``uid`` as the group, as backend/checks/groups.py names it."""
    from backend.trace import Trace, write_jsonl

    d = tmp_path / "set"
    d.mkdir()
    write_jsonl([Trace(id="a", messages=[{"role": "user", "content": "q"}], metadata={"group": "g7", "sample": 3, "rank": 1}),
                 Trace(id="b", messages=[{"role": "user", "content": "q"}], metadata={"group": 12, "sample": True})], str(d / "ours.jsonl"))
    (d / "5.jsonl").write_text(json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 5, "uid": "u-9"}) + "\n")
    ts = TraceSet.open_set(str(d), cache=False, final=True)
    rows = {r["id"]: r for _, r in ts.df.iterrows()}
    assert (rows["a"]["group"], rows["a"]["sample"], rows["a"]["rank"]) == ("g7", 3, 1)
    assert rows["b"]["group"] == "12" and rows["b"]["sample"] is pd.NA  # a bool is not an index
    (verl,) = [r for k, r in rows.items() if k not in ("a", "b")]
    assert verl["group"] == "uid-u-9" and verl["training_step"] == 5
