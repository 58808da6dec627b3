"""The Trace files tab's re-render audit (ui/trace_audit.py, wired by ui/trace_files.py), in
process: the view of the sample traces against :func:`backend.checks.audit.audit` run here on the same
traces (read from ``sample_traces/*.jsonl`` by this test) with the tokenizer the app decodes each
with; traces that cannot be audited are listed with why; text from traces is escaped; the bounds
(traces per audit, time) are said; a row opens its trace the way the tab's table does, and a row
of traces the tab no longer shows does not. No count here is written down: they come from
``backend.checks.audit``."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest
from cli_inprocess import run_cli

from backend.checks.audit import CAUSE_LABELS, AuditReport, TraceAudit, audit
from backend.checks.diagnostics import Difference
from backend.trace import Trace, load_traces, write_jsonl
from ui import trace_audit as ta
from ui import trace_files
from ui.context import AppContext, Session, load_samples

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_FILES = sorted((ROOT / "sample_traces").glob("*.jsonl"))


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


@pytest.fixture(scope="module")
def sample_traces() -> list[Trace]:
    """The samples as this test reads them (not through the app's session)."""
    return [t for p in SAMPLE_FILES for t in load_traces(str(p)).traces]


@pytest.fixture(scope="module")
def oracle(ctx, sample_traces) -> AuditReport:
    """backend.checks.audit on the samples, each with the bundle the app decodes it with."""
    return audit(sample_traces, lambda t: ctx.trace_bundle(t)[0] or "no tokenizer")


def _samples_session(ctx: AppContext) -> Session:
    """A new visitor's session (ui.build_app's initial_session): the samples in the tab."""
    s = Session(traces=dict(ctx.samples), file_traces=[label for label, _ in ctx.samples], file_name="sample_traces")
    s.current = s.file_traces[0]
    return s


def _upload(ctx: AppContext, tmp_path: Path, name: str, traces: list[Trace]) -> Session:
    sess = Session()
    path = tmp_path / name
    write_jsonl(traces, str(path))
    status, _ = trace_files.load_file(ctx, sess, str(path))
    assert "trace(s) loaded" in status, status
    return sess


@pytest.fixture(scope="module")
def samples_view(ctx):
    sess = _samples_session(ctx)
    src = trace_files.audit_source(sess)
    return sess, src, ta.audit_view(ctx, src)


# ---- the view of the samples ----------------------------------------------------------------------


def test_the_samples_view_is_backend_audits_report(samples_view, oracle, sample_traces):
    sess, src, (summary, fig, causes, turns, rollouts) = samples_view
    assert src.total == len(sample_traces) == len(src.items) and not src.is_set
    # the sentence, escaped, and the counts it rests on
    assert f">{_esc(oracle.sentence())}.</div>" in summary
    assert f'data-audited="{len(oracle.audited)}"' in summary and f'data-broken="{len(oracle.broken)}"' in summary
    assert f"Audited {len(sample_traces)} trace(s) of sample_traces" in summary
    # by cause: label -> rollouts, most first
    assert list(causes.columns) == ta.CAUSE_COLUMNS
    assert list(zip(causes["cause"], causes["rollouts"])) == [(CAUSE_LABELS.get(c, c), n) for c, n in oracle.by_cause().items()]
    # by turn: (turn, cause) -> places
    want = {("prompt" if k == 0 else str(k), CAUSE_LABELS.get(c, c)): n for k, by in oracle.by_turn().items() for c, n in by.items()}
    assert {(r.turn, r.cause): r.places for r in turns.itertuples()} == want
    assert sum(turns["places"]) == sum(len(a.differences) for a in oracle.traces)
    # one row per rollout, in the tab's order, the row number the tab's table gives it
    assert list(rollouts.columns) == ta.ROLLOUT_COLUMNS
    assert list(rollouts["id"]) == [t.id for t in sample_traces] and list(rollouts["#"]) == list(range(len(sample_traces)))
    for row, a in zip(rollouts.to_dict("records"), oracle.traces):
        assert row["breaks"] == (ta.YES if a.broken else ta.NO)
        assert row["first break"] == (a.differences[0].position if a.differences else "")
        for c, n in a.causes.items():
            assert f"{CAUSE_LABELS.get(c, c).split(' (')[0]} ×{n}" in row["causes"]  # the label without its parenthesis
        if not a.broken:
            assert row["causes"] == "identical"


def test_the_chart_has_one_bar_per_cause(samples_view, oracle):
    fig = samples_view[2][1]
    by = oracle.by_cause()
    if not by:  # the samples may one day all re-render exactly: the chart then says so
        assert "no rollout breaks" in fig.layout.annotations[0].text
        return
    (bar,) = fig.data
    assert bar.type == "bar" and bar.orientation == "h"
    assert dict(zip(bar.hovertext, bar.x)) == {CAUSE_LABELS.get(c, c): n for c, n in by.items()}
    assert fig.layout.title.text == "Rollouts that break, by cause"


def test_the_sentence_agrees_with_the_cli(tmp_path, ctx, sample_traces):
    """The CLI (``python -m backend audit FILE --json``) and the view agree on a trace whose
    tokenizer is an offline profile and whose template is the profile's default."""

    plain = [t for t in sample_traces if t.tokenizer.template != "custom" and not t.metadata.get("chat_template")]
    assert plain
    f = tmp_path / "plain.jsonl"
    write_jsonl(plain, str(f))
    out = run_cli("audit", str(f), "--json")
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    sess = _upload(ctx, tmp_path, "plain_upload.jsonl", plain)
    summary, _, causes, _, rollouts = ta.audit_view(ctx, trace_files.audit_source(sess))
    assert f">{_esc(cli['summary'])}.</div>" in summary
    assert dict(zip(causes["cause"], causes["rollouts"])) == {cli["cause_labels"][c]: n for c, n in cli["by_cause"].items()}
    assert [r["breaks"] == ta.YES for r in rollouts.to_dict("records")] == [r["broken"] for r in cli["rollouts"]]


# ---- what cannot be audited, escaping, failures -------------------------------------------------------


def _esc(s: str) -> str:
    import html

    return html.escape(s)


def _odd_traces(base: Trace) -> list[Trace]:
    """A trace that audits, one with no token ids, one whose tokenizer (named by the file, with
    markup in it) is not available, and one whose id is markup."""
    no_ids = base.model_copy(update={"id": "text-only", "prompt_ids": [], "response_ids": [], "response_mask": [], "steps": [],
                                     "message_spans": []})
    tok = base.tokenizer.model_copy(update={"name": "<img src=x onerror=alert(1)>", "template_sha256": None})
    unknown = base.model_copy(update={"id": "unknown-tokenizer", "tokenizer": tok})
    evil = base.model_copy(update={"id": "<script>alert(1)</script>", "tokenizer": tok})
    return [base, no_ids, unknown, evil]


def test_traces_that_cannot_be_audited_are_listed_with_why(ctx, tmp_path, sample_traces):
    sess = _upload(ctx, tmp_path, "odd.jsonl", _odd_traces(sample_traces[0]))
    summary, fig, causes, turns, rollouts = ta.audit_view(ctx, trace_files.audit_source(sess))
    rows = {r["id"]: r for r in rollouts.to_dict("records")}
    assert list(rows) == [sample_traces[0].id, "text-only", "unknown-tokenizer", "<script>alert(1)</script>"]
    assert rows["text-only"]["breaks"] == ta.NOT_AUDITED and "no token ids" in rows["text-only"]["causes"]
    assert rows["unknown-tokenizer"]["breaks"] == ta.NOT_AUDITED
    assert "not available offline" in rows["unknown-tokenizer"]["causes"] and "showing token ids" not in rows["unknown-tokenizer"]["causes"]
    assert rows[sample_traces[0].id]["breaks"] in (ta.YES, ta.NO)
    # the summary counts them and names them, escaped
    assert 'data-not-audited="3"' in summary and "3 trace(s) not audited" in summary
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in summary and "<script>" not in summary
    assert "&lt;img src=x onerror=alert(1)&gt;" in summary and "<img" not in summary


def test_a_trace_that_cannot_be_read_or_audited_is_a_row_not_a_traceback(ctx, sample_traces, monkeypatch):
    def boom():
        raise OSError("the file went away")

    items = [ta.Item(0, "gone", None, boom), ta.Item(1, sample_traces[0].id, None, lambda: sample_traces[0])]
    src = ta.Source(items, 2, "x", "k")
    summary, _, _, _, rollouts = ta.audit_view(ctx, src)
    assert list(rollouts["breaks"])[0] == ta.NOT_AUDITED and "could not read it (OSError: the file went away)" in rollouts["causes"][0]
    assert list(rollouts["id"]) == ["gone", sample_traces[0].id]

    import backend.checks.audit

    def fails(*a, **k):
        raise RuntimeError("a bug in /srv/secret/place.py")

    monkeypatch.setattr(backend.checks.audit, "audit", fails)
    summary, _, _, _, rollouts = ta.audit_view(ctx, src)
    assert "the audit failed (RuntimeError: a bug in …/place.py)" in rollouts["causes"][1]
    monkeypatch.setattr(ta, "run_audit", fails)
    summary, fig, causes, turns, rollouts = ta.audit_view(ctx, src)
    assert summary.startswith('<div class="ali-err">The audit failed: RuntimeError') and "/srv/secret" not in summary
    assert rollouts.empty and causes.empty and "Traceback" not in summary


def test_nothing_loaded_says_so(ctx):
    summary, *_ = ta.audit_view(ctx, trace_files.audit_source(Session(file_name="x")))
    assert "No traces are loaded" in summary


def test_the_chart_escapes_a_cause_name(sample_traces):
    a = TraceAudit(id="x", differences=[Difference("replace", (3, 4), (3, 4), "<b>odd</b>")], turns=[1])
    fig = ta.cause_figure(AuditReport([a]))
    assert list(fig.data[0].y) == ["&lt;b&gt;odd&lt;/b&gt;"]
    assert "nothing was audited" in ta.cause_figure(AuditReport([TraceAudit(id="y", error="no ids")])).layout.annotations[0].text


# ---- bounds ----------------------------------------------------------------------------------------


def test_at_most_the_limit_is_audited_and_the_rest_is_said(ctx, oracle):
    sess = _samples_session(ctx)
    src = trace_files.audit_source(sess, limit=3)
    assert len(src.items) == 3 and src.total == len(oracle.traces)
    summary, *_, rollouts = ta.audit_view(ctx, src)
    rest = len(oracle.traces) - 3
    assert len(rollouts) == 3 and f"the first 3 of {len(oracle.traces)}: {rest} past the limit of 3 traces per audit" in summary
    # the time budget: the first trace is always audited, the rest skipped and counted
    summary, *_, rollouts = ta.audit_view(ctx, trace_files.audit_source(sess), budget_s=0)
    assert len(rollouts) == 1 and f"{len(oracle.traces) - 1} skipped when the audit reached its 0 s limit" in summary


# ---- opening a row ---------------------------------------------------------------------------------


def test_a_row_opens_its_trace_and_a_stale_row_does_not(ctx, tmp_path, sample_traces):
    traces = [t.model_copy(update={"id": f"up-{k}"}) for k, t in enumerate(sample_traces[:3])]
    sess = _upload(ctx, tmp_path, "three.jsonl", traces)
    key = trace_files.audit_key(sess)
    *_, rollouts = ta.audit_view(ctx, trace_files.audit_source(sess))
    row = rollouts.to_dict("records")[2]
    label = trace_files.open_audit_row(sess, row)
    assert sess.traces[label].id == "up-2" and label == sess.file_traces[2]
    # another upload: the old rows no longer name the tab's traces
    _ = trace_files.load_file(ctx, sess, str(_write(tmp_path / "other.jsonl", traces[::-1])))
    assert trace_files.audit_key(sess) != key
    with pytest.raises(gr.Error, match="audit them again"):
        trace_files.open_audit_row(sess, row)
    with pytest.raises(gr.Error, match="no such row"):
        trace_files.open_audit_row(sess, {"#": "", "id": "x"})


def _write(path: Path, traces: list[Trace]) -> Path:
    write_jsonl(traces, str(path))
    return path


def test_a_trace_set_is_audited_from_its_index(ctx, tmp_path, sample_traces, monkeypatch):
    from backend.trace.catalog import SetRegistry

    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "rollout_data"
    run.mkdir()
    write_jsonl(sample_traces[:2], str(run / "1.jsonl"))
    write_jsonl(sample_traces[2:], str(run / "2.jsonl"))
    sess = Session(set_spec=str(run), set_registry=SetRegistry(min_interval=0))
    src = trace_files.audit_source(sess)
    assert src.is_set and src.total == len(sample_traces) and src.name == "rollout_data"
    summary, _, causes, _, rollouts = ta.audit_view(ctx, src)
    want = audit(sample_traces, lambda t: ctx.trace_bundle(t)[0] or "no tokenizer")
    assert f">{_esc(want.sentence())}.</div>" in summary
    assert list(rollouts.columns) == ta.SET_ROLLOUT_COLUMNS
    assert list(rollouts["file"])[:3] == ["1.jsonl:1", "1.jsonl:2", "2.jsonl:1"]
    label = trace_files.open_audit_row(sess, rollouts.to_dict("records")[2])
    assert sess.traces[label].id == sample_traces[2].id
    # the tab shows an upload instead: a set's row does not open
    sess.set_spec = None
    with pytest.raises(gr.Error, match="audit them again"):
        trace_files.open_audit_row(sess, rollouts.to_dict("records")[0])


# ---- the app ---------------------------------------------------------------------------------------


def test_the_tab_has_the_audit_and_its_events_are_not_api_endpoints(ctx, recwarn):
    import ui

    demo = ui.build_app(ctx)
    # gradio found every handler's event data (a row click's gr.SelectData) by its annotation
    assert not [str(w.message) for w in recwarn if "arguments for function" in str(w.message)]
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert {"ta-section", "ta-run", "ta-summary", "ta-chart", "ta-causes", "ta-turns", "ta-rollouts"} <= ids
    named = demo.get_api_info()["named_endpoints"]
    assert not [n for n in named if "audit" in n], sorted(named)
    # the button's work is bounded over all visitors
    fns = [f for f in demo.fns.values() if getattr(f, "concurrency_id", None) == "trace_audit"]
    assert fns and all(f.concurrency_limit == ta.CONCURRENCY for f in fns)


def test_empty_outputs_are_frames_of_the_right_columns():
    summary, fig, causes, turns, rollouts = ta.empty_outputs()
    assert summary == "" and isinstance(causes, pd.DataFrame) and list(rollouts.columns) == ta.ROLLOUT_COLUMNS
