"""Charts by training step (ui/run_charts.py) on real traces: the sample traces and traces the real
engine makes (scripted generator, offline Qwen3 tokenizer, real tools that fail), written in verl's
dump layout (``<step>.jsonl``) and indexed by :class:`backend.trace.TraceIndex`. Every expected
number is computed here from the traces themselves (loaded in full, Python's ``statistics``), never
from the module under test; the charts read only the index.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from backend.checks.labels import termination_label
from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import Trace, TraceIndex, load_traces
from backend.trace.io import write_jsonl
from backend.trace.model import StepState
from ui import run_charts as rc
from ui.context import SAMPLE_DIR, Session, load_samples

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))
SEATTLE = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL_SEATTLE = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
ANSWER = "The current temperature in Seattle, WA, USA is 72°F."


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for.
    """
    return {"temperature": 72, "city": city}


def fail_always(x: str):
    """A tool that raises.

    Args:
        x: anything
    """
    raise RuntimeError("backend down")


def _call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _run(bundle, script, tools, **cfg) -> Trace:
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, script), bundle, tools=ToolRegistry.from_functions(tools),
                     config=LoopConfig(**cfg))
    return asyncio.run(loop.run(SEATTLE))


@pytest.fixture(scope="module")
def engine_traces() -> dict[str, Trace]:
    """Real runs of the engine: an answer after a tool call, a failing tool fed back, a failing
    tool that ends the run, a malformed call, a run cut at response_length."""
    b = load_tokenizer("qwen3")
    kw = {"apply_chat_template_kwargs": {"enable_thinking": False}}
    out = {
        "ok": _run(b, [CALL_SEATTLE, ANSWER], [get_current_temperature], **kw),
        "tool_fail_fed_back": _run(b, [_call("fail_always", x="1"), "sorry"], [fail_always], **kw),
        "tool_fail_end": _run(b, [_call("fail_always", x="1"), "ok"], [fail_always], on_tool_error="terminate", **kw),
        "malformed": _run(b, ['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": </tool_call>'],
                          [get_current_temperature], **kw),
        "long": _run(b, [ANSWER * 8], [get_current_temperature], response_length=30, **kw),
    }
    assert out["tool_fail_end"].termination_reason == "tool_error"
    assert out["malformed"].termination_reason == "malformed_tool_call"
    assert out["long"].termination_reason == "response_length"
    return out


def _samples() -> list[Trace]:
    return [t for p in SAMPLES for t in load_traces(str(p)).traces]


def _relabel(t: Trace, step: int | None, k: int, score: float | None) -> Trace:
    md = dict(t.metadata)
    if score is not None:
        md["score"] = score
    return t.model_copy(update={"id": f"{t.id}-s{step}-{k}", "metadata": md})


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory, engine_traces) -> Path:
    """A verl dump folder: 1.jsonl, 2.jsonl, 10.jsonl (steps from the file names, so 10 sorts
    after 2) and notes.jsonl (a file whose name is no step), real traces re-labelled per step
    with different mixes and scores."""
    d = tmp_path_factory.mktemp("verl_run")
    s, e = _samples(), engine_traces
    plan = {
        "1": [*s, e["ok"], e["tool_fail_fed_back"]],
        "2": [*s[:3], e["ok"], e["tool_fail_end"], e["malformed"], e["malformed"], e["long"]],
        "10": [e["ok"], e["ok"], e["long"], e["tool_fail_fed_back"], *s[3:]],
        "notes": [s[0], e["malformed"]],
    }
    for name, traces in plan.items():
        step = int(name) if name.isdigit() else None
        out = [_relabel(t, step, k, None if step is None or k % 3 == 2 else (step or 0) * 0.1 + k * 0.01)
               for k, t in enumerate(traces)]
        write_jsonl(out, str(d / f"{name}.jsonl"))
    return d


def _files(d: Path) -> list[str]:
    return sorted(str(p) for p in d.glob("*.jsonl"))


def _expected(d: Path) -> dict[str, list[Trace]]:
    out: dict[str, list[Trace]] = {}
    for p in _files(d):
        stem = Path(p).stem
        out.setdefault(stem if stem.isdigit() else rc.NO_STEP, []).extend(load_traces(p).traces)
    return out


def _tool_errors(t: Trace) -> int:
    return sum(1 for s in t.steps for r in s.tool_results if r.ok is False) + sum(
        1 for s in t.steps if s.state == StepState.PROCESSING_TOOLS and s.error)


def _parse_errors(t: Trace) -> int:
    return sum(1 for s in t.steps for e in s.parse_errors if e.severity == "error")


def _q(xs: list[float], p: float) -> float:
    """The p-quantile with linear interpolation (statistics' inclusive method)."""
    if len(xs) == 1:
        return float(xs[0])
    cuts = statistics.quantiles(xs, n=4, method="inclusive")
    return {0.25: cuts[0], 0.5: cuts[1], 0.75: cuts[2]}[p]


def _grouped(d: Path) -> rc.Grouped:
    ix = TraceIndex.build(_files(d))
    return rc.group_frame(ix.frame(), [f.path for f in ix.files])


# ---- aggregates ---------------------------------------------------------------------------------


def test_aggregates_by_step_match_the_traces(verl_run):
    g = _grouped(verl_run)
    exp = _expected(verl_run)
    assert g.by == "training step"
    assert g.order == ["1", "2", "10", rc.NO_STEP]  # numeric order, no-step group last
    assert "3 training step(s)" in g.note and "2 without a step" in g.note
    stats = rc.by_group(g)
    shares = rc.termination_shares(g)
    # the set has tool errors and parse errors at all (else the rates below prove nothing)
    assert any(_tool_errors(t) for ts in exp.values() for t in ts)
    assert any(_parse_errors(t) for ts in exp.values() for t in ts)
    for step, traces in exp.items():
        row = stats.loc[step]
        resp = [len(t.response_ids) for t in traces]
        turns = [t.num_turns for t in traces]
        assert row["n"] == len(traces)
        for p, col in ((0.25, "p25"), (0.5, "median"), (0.75, "p75")):
            assert row[f"resp_{col}"] == pytest.approx(_q(resp, p)), (step, col)
            assert row[f"turns_{col}"] == pytest.approx(_q(turns, p)), (step, col)
        assert row["resp_median"] == pytest.approx(statistics.median(resp))
        assert row["resp_mean"] == pytest.approx(statistics.fmean(resp))
        te, pe = [_tool_errors(t) for t in traces], [_parse_errors(t) for t in traces]
        assert row["tool_error_rate"] == pytest.approx(100 * sum(x > 0 for x in te) / len(traces))
        assert row["tool_errors_mean"] == pytest.approx(statistics.fmean(te))
        assert row["parse_error_rate"] == pytest.approx(100 * sum(x > 0 for x in pe) / len(traces))
        assert row["parse_errors_mean"] == pytest.approx(statistics.fmean(pe))
        scores = [t.metadata["score"] for t in traces if "score" in t.metadata]
        assert row["score_n"] == len(scores)
        if len(scores) >= 2:
            assert row["score_mean"] == pytest.approx(statistics.fmean(scores))
            assert row["score_std"] == pytest.approx(statistics.stdev(scores))
        else:
            assert np.isnan(row["score_mean"])
        labels = [termination_label(t.termination_reason) for t in traces]
        for lab in set(labels):
            assert shares.loc[step, lab] == pytest.approx(100 * labels.count(lab) / len(traces)), (step, lab)
        assert shares.loc[step].sum() == pytest.approx(100)
    # the end states carry the words of backend.checks.labels with verl's code
    assert {"answered (no_tool_calls)", "tool error (tool_error)", "malformed tool call (malformed_tool_call)",
            "hit response_length (response_length)"} <= set(shares.columns)


def test_steps_figure_draws_every_measure(verl_run):
    g = _grouped(verl_run)
    fig = rc.steps_figure(g)
    exp = _expected(verl_run)
    # the median lines: response tokens (x axis 1), turns (x axis 2), in group order
    lines = [t for t in fig.data if t.type == "scatter" and t.mode and "markers" in t.mode]
    by_axis = {t.xaxis: t for t in lines}
    assert list(by_axis["x"].x) == g.order
    assert list(by_axis["x"].y) == pytest.approx([statistics.median([len(t.response_ids) for t in exp[k]]) for k in g.order])
    assert list(by_axis["x2"].y) == pytest.approx([statistics.median([t.num_turns for t in exp[k]]) for k in g.order])
    # IQR bands below the medians: one filled trace per band
    assert sum(1 for t in fig.data if t.type == "scatter" and t.fill == "tonexty") == 2
    # one stacked bar per end state, the tool/parse rates, the score with error bars
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == len(rc.termination_shares(g).columns) and fig.layout.barmode == "stack"
    assert {"x4", "x5", "x6"} <= set(by_axis)
    assert list(by_axis["x6"].error_y.array) == pytest.approx(list(rc.by_group(g)["score_std"].fillna(0)))
    assert fig.layout.xaxis4.title.text == "training step"


def test_compare_two_steps_numbers(verl_run):
    g = _grouped(verl_run)
    exp = _expected(verl_run)
    fig, table, note = rc.compare(g, "1", "2")
    assert note == ""
    t = table.set_index("measure")
    a, b = exp["1"], exp["2"]

    def check(measure, fa, fb):
        assert t.loc[measure, "A"] == pytest.approx(round(fa, 3)), measure
        assert t.loc[measure, "B"] == pytest.approx(round(fb, 3)), measure
        assert t.loc[measure, "B − A"] == pytest.approx(round(fb - fa, 3), abs=1e-3), measure

    check(rc.M_TRACES, len(a), len(b))
    check(rc.M_RESP_MEDIAN, statistics.median([len(x.response_ids) for x in a]), statistics.median([len(x.response_ids) for x in b]))
    check(rc.M_RESP_MEAN, statistics.fmean([len(x.response_ids) for x in a]), statistics.fmean([len(x.response_ids) for x in b]))
    iqr = lambda ts: _q([len(x.response_ids) for x in ts], 0.75) - _q([len(x.response_ids) for x in ts], 0.25)  # noqa: E731
    check(rc.M_RESP_IQR, iqr(a), iqr(b))
    check(rc.M_TURNS_MEDIAN, statistics.median([x.num_turns for x in a]), statistics.median([x.num_turns for x in b]))
    rate = lambda ts, f: 100 * sum(f(x) > 0 for x in ts) / len(ts)  # noqa: E731
    check(rc.M_TOOL_RATE, rate(a, _tool_errors), rate(b, _tool_errors))
    check(rc.M_PARSE_RATE, rate(a, _parse_errors), rate(b, _parse_errors))
    sa = [x.metadata["score"] for x in a if "score" in x.metadata]
    sb = [x.metadata["score"] for x in b if "score" in x.metadata]
    check(rc.M_SCORE_MEAN, statistics.fmean(sa), statistics.fmean(sb))
    for lab in ("answered (no_tool_calls)", "malformed tool call (malformed_tool_call)"):
        la, lb = [termination_label(x.termination_reason) for x in a], [termination_label(x.termination_reason) for x in b]
        check(rc.TERM_PREFIX + lab, 100 * la.count(lab) / len(a), 100 * lb.count(lab) / len(b))
    # the overlaid histograms: each side's shares sum to 100 % and count the side's traces
    hists = [tr for tr in fig.data if tr.type == "bar" and tr.xaxis in ("x", "x2")]
    assert len(hists) == 4
    for tr in hists:
        assert sum(tr.y) == pytest.approx(100)
    (resp_a,) = [tr for tr in hists if tr.xaxis == "x" and tr.name.startswith("A")]
    counts = np.round(np.array(resp_a.y) * len(a) / 100).astype(int)
    assert counts.sum() == len(a)
    # turns: integer bins centred on each count of turns
    (turns_b,) = [tr for tr in hists if tr.xaxis == "x2" and tr.name.startswith("B")]
    want = {k: 100 * [x.num_turns for x in b].count(k) / len(b) for k in {x.num_turns for x in b}}
    got = {int(round(x)): y for x, y in zip(turns_b.x, turns_b.y) if y}
    assert got == pytest.approx(want)
    # end states side by side: A's and B's bars over the same labels
    ends = [tr for tr in fig.data if tr.xaxis == "x3"]
    assert len(ends) == 2 and list(ends[0].x) == list(ends[1].x) and fig.layout.barmode == "group"


def test_default_pair_is_first_and_last_step(verl_run):
    g = _grouped(verl_run)
    assert rc.default_pair(g.order) == ("1", "10")
    assert rc.default_pair(["3", rc.NO_STEP]) == ("3", rc.NO_STEP)
    assert rc.default_pair([]) == (None, None)


# ---- sets without steps, one step, none ----------------------------------------------------------


def test_samples_in_memory_have_no_step_and_say_so():
    samples, problems = load_samples()
    assert not problems
    ix = TraceIndex.of_traces([t for _, t in samples])
    g = rc.group_frame(ix.frame(), [f.path for f in ix.files])
    assert g.by == "all" and g.order == [rc.ALL_TRACES]
    assert "no trace in this set has a training step" in g.note and "one group" in g.note
    fig = rc.steps_figure(g)
    notes = [a.text for a in fig.layout.annotations]
    assert "no trace carries a score" in notes
    cfig, table, why = rc.compare(g, rc.ALL_TRACES, rc.ALL_TRACES)
    assert "only one group" in why and table.empty
    assert any("only one group" in a.text for a in cfig.layout.annotations)


def test_files_without_steps_are_grouped_by_file():
    ix = TraceIndex.build([str(p) for p in SAMPLES])
    g = rc.group_frame(ix.frame(), [f.path for f in ix.files])
    assert g.by == "file"
    assert g.order == [p.name for p in SAMPLES]
    assert "grouped by file" in g.note
    stats = rc.by_group(g)
    assert stats.loc["06_thinking_multiturn.jsonl", "n"] == 2
    fig, table, why = rc.compare(g, SAMPLES[0].name, SAMPLES[2].name)
    assert why == "" and table.set_index("measure").loc[rc.M_PARSE_RATE, "B"] == 100.0  # the malformed call


def test_one_step_empty_set_and_bad_picks(tmp_path, engine_traces):
    write_jsonl([_relabel(engine_traces["ok"], 5, 0, 0.5)], str(tmp_path / "5.jsonl"))
    g = rc.group_frame(TraceIndex.build([str(tmp_path / "5.jsonl")]).frame())
    assert g.order == ["5"] and "1 training step(s)" in g.note
    assert rc.by_group(g).loc["5", "score_mean"] == 0.5
    fig = rc.steps_figure(g)
    assert fig.data and fig.layout.title.text == "By training step"
    _, table, why = rc.compare(g, "5", "5")
    assert "only one group (5)" in why and table.empty

    empty = rc.group_frame(TraceIndex().frame())
    assert empty.order == [] and empty.note == "no traces in this set"
    efig = rc.steps_figure(empty)
    assert [a.text for a in efig.layout.annotations] == ["no traces in this set"]
    assert rc.compare(empty, None, None)[2] == "no traces in this set"
    assert rc.by_group(empty).empty and rc.termination_shares(empty).empty

    two = rc.group_frame(pd.concat([TraceIndex.build([str(tmp_path / "5.jsonl")]).frame()] * 2, ignore_index=True).assign(
        training_step=pd.array([5, None], dtype="Int64")))
    assert two.order == ["5", rc.NO_STEP]
    assert rc.compare(two, "5", "5")[2] == "A and B are the same group: pick two different ones"
    assert rc.compare(two, "5", "7")[2] == "step B (7) is not in this trace set"
    assert rc.compare(two, None, "5")[2] == "pick step A"


def test_an_index_frame_without_the_new_columns_still_charts():
    """An index frame from before training_step / tool_errors / parse_errors (or a caller's own):
    one group, the error panels say the index lacks them, nothing raises."""
    df = TraceIndex.build([str(SAMPLES[0])]).frame().drop(columns=["training_step", "tool_errors", "parse_errors"])
    g = rc.group_frame(df)
    assert g.order == [rc.ALL_TRACES]
    fig = rc.steps_figure(g)
    assert [a.text for a in fig.layout.annotations].count("not in this index") == 2
    t = rc.compare(rc.group_frame(pd.concat([df, df.assign(file=1)], ignore_index=True)), "file 1", "file 2")[1]
    assert np.isnan(t.set_index("measure").loc[rc.M_TOOL_RATE, "A"])


# ---- text from traces ---------------------------------------------------------------------------


def test_text_from_traces_and_file_names_is_escaped(tmp_path, engine_traces):
    evil = '<img src=x onerror="alert(1)"><b>x</b>'
    t = engine_traces["ok"].model_copy(update={"termination_reason": evil})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fname = '<img src=x onerror="alert(2)"><b>y<b>'  # no "/" in a file name
    pa, pb = tmp_path / "a" / f"{fname}.jsonl", tmp_path / "b" / "plain.jsonl"
    write_jsonl([t], str(pa))
    write_jsonl([engine_traces["ok"]], str(pb))
    ix = TraceIndex.build([str(pa), str(pb)])
    g = rc.group_frame(ix.frame(), [f.path for f in ix.files])
    assert g.by == "file" and g.order[0].startswith(fname[:30])  # the label itself is the (shortened) name
    for fig in (rc.steps_figure(g), rc.compare(g, g.order[0], g.order[1])[0]):
        js = fig.to_json()
        assert "<img" not in js and "<b>" not in js, js[:500]
        assert "&lt;img src=x onerror=" in js and "alert(1)" in js
    note = rc.note_html(g.note)
    assert "<img" not in note
    table = rc.compare(g, g.order[0], g.order[1])[1]
    assert rc.TERM_PREFIX + evil in set(table["measure"])  # the table holds text; gr.Dataframe shows it as text


def test_colours_hold_3_to_1_on_both_backgrounds():
    from test_ui_inspector import contrast

    from ui.theme import PALETTE

    colours = [rc.COLOR_A, rc.COLOR_B, *(c for cs in rc.OUTCOME_COLORS.values() for c in cs)]
    for c in colours:
        for page in ("#ffffff", PALETTE["tv-bg"][1], "#0b0f19"):
            assert contrast(c, page) >= 3, (c, page)
    # end states: normal ends green, failures not, unknown codes grey
    cols = rc.termination_colors(["answered (no_tool_calls)", "tool error (tool_error)", "whatever"])
    assert cols["answered (no_tool_calls)"] in rc.OUTCOME_COLORS["ok"]
    assert cols["tool error (tool_error)"] in rc.OUTCOME_COLORS["failure"]
    assert cols["whatever"] in rc.OUTCOME_COLORS["other"]


# ---- the tab's handlers --------------------------------------------------------------------------


def test_session_handlers_chart_the_tabs_current_set(verl_run):
    samples, _ = load_samples()
    sess = Session(traces=dict(samples), file_traces=[lab for lab, _ in samples], file_name=SAMPLE_DIR)
    values, key = rc.refresh(sess)
    note, fig, dd_a, dd_b, cnote, cfig, table = values
    assert "one group" in note and dd_a["choices"] == [rc.ALL_TRACES] and "only one group" in cnote

    ix = TraceIndex.build(_files(verl_run), keep=True)
    labels = [f"file · {i}" for i in range(len(ix))]
    sess2 = Session(traces={lab: ix.open(i) for i, lab in enumerate(labels)}, file_traces=labels, file_index=ix, file_name="run")
    values2, key2 = rc.refresh(sess2)
    note, fig, dd_a, dd_b, cnote, cfig, table = values2
    assert key2 != key
    assert dd_a["choices"] == ["1", "2", "10", rc.NO_STEP] and (dd_a["value"], dd_b["value"]) == ("1", "10")
    assert cnote == "" and table.set_index("measure").loc[rc.M_TRACES, "A"] == len(_expected(verl_run)["1"])
    cn, cf, tb = rc.on_compare(sess2, "2", rc.NO_STEP)
    assert cn == "" and tb.set_index("measure").loc[rc.M_TRACES, "B"] == 2
    cn, _, tb = rc.on_compare(sess2, "2", "<script>")
    assert "&lt;script&gt;" in cn and "<script>" not in cn and tb.empty


def test_trace_set_mode_charts_the_folder_and_follows_new_steps(tmp_path, engine_traces, monkeypatch):
    """The tab showing a folder (``--traces``, a SetRegistry shared by sessions): the charts read
    the set's index; a new step file written later changes the key and the charts show it."""
    from backend.trace.catalog import SetRegistry

    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "rollout_data"
    run.mkdir()
    e = engine_traces
    write_jsonl([_relabel(t, 1, k, 0.1) for k, t in enumerate([e["ok"], e["malformed"]])], str(run / "1.jsonl"))
    write_jsonl([_relabel(t, 2, k, 0.4) for k, t in enumerate([e["ok"], e["ok"], e["long"]])], str(run / "2.jsonl"))
    reg = SetRegistry(min_interval=0)
    sess = Session(set_spec=str(run), set_registry=reg)
    (note, fig, dd_a, dd_b, cnote, cfig, table), key = rc.refresh(sess)
    assert dd_a["choices"] == ["1", "2"] and "5 trace(s) in 2 training step(s)" in note
    t = table.set_index("measure")
    assert (t.loc[rc.M_TRACES, "A"], t.loc[rc.M_TRACES, "B"]) == (2, 3)
    assert t.loc[rc.M_PARSE_RATE, "A"] == 50.0 and t.loc[rc.M_PARSE_RATE, "B"] == 0.0
    assert rc.session_frame(sess)[2] == key  # nothing new: the same key (a filter does not redraw)

    write_jsonl([_relabel(e["tool_fail_end"], 3, 0, 0.9)], str(run / "3.jsonl"))
    reg.poll(str(run))  # what the tab's follow timer does
    (note, *_rest), key2 = rc.refresh(sess)
    assert key2 != key and "6 trace(s) in 3 training step(s)" in note
    assert _rest[1]["choices"] == ["1", "2", "3"] and _rest[2]["value"] == "3"
    assert rc.by_group(rc.group_frame(rc.session_frame(sess)[0])).loc["3", "tool_error_rate"] == 100.0

    gone = Session(set_spec=str(tmp_path / "nothing-here"), set_registry=reg)
    (note, *_), _ = rc.refresh(gone)
    assert "no charts:" in note
    assert "no comparison:" in rc.on_compare(gone, "1", "2")[0]


def test_sessions_watching_one_set_share_its_charts_until_it_grows(tmp_path, engine_traces, monkeypatch):
    """Many visitors following one run: the set's charts are drawn once per version of the set,
    not once per session and tick; a grown set is drawn again, and a session's table is its own."""
    from backend.trace.catalog import SetRegistry

    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "rollout_data"
    run.mkdir()
    e = engine_traces
    write_jsonl([_relabel(t, 1, k, 0.1) for k, t in enumerate([e["ok"], e["malformed"]])], str(run / "1.jsonl"))
    write_jsonl([_relabel(e["ok"], 2, 0, 0.4)], str(run / "2.jsonl"))
    reg = SetRegistry(min_interval=0)
    a, b, c = (Session(set_spec=str(run), set_registry=reg) for _ in range(3))
    before = dict(rc._DRAWN_STATS)
    (note_a, fig_a, *_, table_a), key_a = rc.refresh(a)
    (note_b, fig_b, *_, table_b), key_b = rc.refresh(b)
    rc.refresh(c)
    assert rc._DRAWN_STATS["drawn"] - before["drawn"] == 1 and rc._DRAWN_STATS["reused"] - before["reused"] == 2
    assert key_a == key_b and note_a == note_b and fig_a is fig_b
    assert table_a is not table_b  # each session gets its own copy of the table
    table_a.iloc[0, 1] = -12345.0
    assert rc.refresh(c)[0][6].iloc[0, 1] != -12345.0

    write_jsonl([_relabel(e["tool_fail_end"], 3, 0, 0.9)], str(run / "3.jsonl"))
    reg.poll(str(run))
    drawn = rc._DRAWN_STATS["drawn"]
    (note_b2, *_), key_b2 = rc.refresh(b)
    assert rc._DRAWN_STATS["drawn"] == drawn + 1 and key_b2 != key_b and "4 trace(s) in 3 training step(s)" in note_b2
    assert rc.on_compare(a, "1", "3")[2].set_index("measure").loc[rc.M_TRACES, "B"] == 1
    assert rc._DRAWN_STATS["drawn"] == drawn + 1  # the comparison reused the grouped set


def test_thousands_of_steps_are_shown_as_ranges(engine_traces, tmp_path):
    """A run of 1,200 steps (or a file giving every trace its own step): at most MAX_GROUPS
    groups, consecutive steps merged into ranges, every trace counted once, the note says so."""
    write_jsonl([engine_traces["ok"]], str(tmp_path / "1.jsonl"))
    row = TraceIndex.build([str(tmp_path / "1.jsonl")]).frame()
    df = pd.concat([row] * 2400, ignore_index=True)
    df["training_step"] = pd.array([k // 2 for k in range(2400)], dtype="Int64")  # steps 0..1199, two traces each
    g = rc.group_frame(df)
    assert len(g.order) == rc.MAX_GROUPS
    assert "1200 training step(s), shown as 500 ranges of consecutive steps" in g.note
    stats = rc.by_group(g)
    assert stats["n"].sum() == 2400
    # ranges cover the steps in order, without gaps or overlaps
    bounds = [tuple(int(x) for x in lab.split("–")) if "–" in lab else (int(lab), int(lab)) for lab in g.order]
    assert bounds[0][0] == 0 and bounds[-1][1] == 1199
    assert all(b[0] == a[1] + 1 for a, b in zip(bounds, bounds[1:]))
    for lab, (lo, hi) in zip(g.order[:5], bounds[:5]):
        assert stats.loc[lab, "n"] == 2 * (hi - lo + 1)
    assert len(rc.steps_figure(g).data[0].x) == rc.MAX_GROUPS
    # files past the cap: ranges of files
    files = df.drop(columns=["training_step"]).assign(file=[k % 600 for k in range(2400)])
    gf = rc.group_frame(files, [f"/run/part-{k:04d}.jsonl" for k in range(600)])
    assert len(gf.order) == rc.MAX_GROUPS and gf.order[0] == "part-0000.jsonl–part-0001.jsonl"
    assert "600 files, shown as 500 ranges of files" in gf.note and rc.by_group(gf)["n"].sum() == 2400


def test_charts_of_a_verl_rollout_dump_folder(tmp_path):
    """verl's own dump (text rows: step, score, no token counts) charted from a trace set: the
    steps and scores come out, and the token panels are empty, not zero."""
    import backend.importers  # noqa: F401 - registers the readers of verl's rows with the trace-set catalogue
    from backend.trace.catalog import TraceSet

    bundle = load_tokenizer("qwen3")
    traces = [t for p in sorted(SAMPLE_DIR.glob("*.jsonl")) for t in load_traces(str(p)).traces if t.prompt_ids]
    scores = {1: [0.0, 0.5, 1.0], 2: [1.0, 1.0]}
    for step, sc in scores.items():
        with open(tmp_path / f"{step}.jsonl", "w", encoding="utf-8") as f:
            for k, s in enumerate(sc):
                t = traces[k % len(traces)]
                f.write(json.dumps({"input": bundle.tokenizer.decode(t.prompt_ids, skip_special_tokens=True),
                                    "output": bundle.tokenizer.decode(t.response_ids, skip_special_tokens=True),
                                    "gts": "x", "score": s, "step": step, "uid": f"u{step}-{k}"}, ensure_ascii=False) + "\n")
    ts = TraceSet.open_set(str(tmp_path), final=True, cache=False)
    g = rc.group_frame(ts.df)
    assert g.order == ["1", "2"]
    stats = rc.by_group(g)
    assert stats["n"].tolist() == [3, 2]
    assert stats["score_mean"].tolist() == [statistics.mean(scores[1]), statistics.mean(scores[2])]
    assert stats["resp_median"].isna().all() and stats["turns_median"].isna().all()  # unknown, not 0
    fig = rc.steps_figure(g, stats)
    assert fig.data  # drawn
    fig2, table, note = rc.compare(g, "1", "2")
    assert table is not None


def test_a_panel_note_sits_in_its_own_panel():
    """The "no score" note is drawn in the score panel (bottom right), not over another one."""
    df = pd.DataFrame({"id": ["a", "b"], "training_step": [1, 2], "response_tokens": [10, 20], "turns": [1, 2],
                       "termination_reason": ["no_tool_calls"] * 2, "tool_errors": [0, 1], "parse_errors": [0, 0],
                       "score": [None, None], "source": ["engine"] * 2})
    fig = rc.steps_figure(rc.group_frame(df))
    (note,) = [a for a in fig.layout.annotations if a.text == "no trace carries a score"]
    xd, yd = fig.layout.xaxis6.domain, fig.layout.yaxis6.domain
    assert note.xref == "paper" and xd[0] < note.x < xd[1] and yd[0] < note.y < yd[1]
    assert not (fig.layout.xaxis.domain[0] < note.x < fig.layout.xaxis.domain[1])  # not in panel 1's column
