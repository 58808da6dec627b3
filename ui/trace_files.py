"""Trace files tab: upload JSONL / JSON / Parquet, a table with filters and search, open a row in
the Inspector, export the filtered set. Bad records are listed with their line numbers; the
good ones load.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.trace import Trace
from ui import charts
from ui.context import AppContext, Session, short_error

COLUMNS = ["#", "id", "source", "turns", "tokens", "termination", "errors"]
ALL = "(all)"


@dataclass
class TraceFilesUI:
    upload: gr.File
    status: gr.HTML
    problems: gr.Dataframe
    reason_dd: gr.Dropdown
    source_dd: gr.Dropdown
    search: gr.Textbox
    table: gr.Dataframe
    dist: gr.Plot
    export_fmt: gr.Radio
    export_btn: gr.Button
    export_file: gr.File


def _source(t: Trace) -> str:
    md = t.metadata if isinstance(t.metadata, dict) else {}
    return str(md.get("source") or "?")


def traces_frame(labels: list[str], traces: dict[str, Trace]) -> pd.DataFrame:
    """One row per trace (pandas). ``#`` is the position in ``labels``."""
    rows = []
    for i, label in enumerate(labels):
        t = traces.get(label)
        if t is None:
            continue
        rows.append({
            "#": i, "id": t.id, "source": _source(t), "turns": t.num_turns,
            "tokens": len(t.prompt_ids) + len(t.response_ids), "termination": t.termination_reason or "",
            "errors": t.step_errors(),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _haystack(t: Trace) -> str:
    parts = [t.id, _source(t), t.termination_reason or ""]
    for m in t.messages:
        if isinstance(m, dict):
            c = m.get("content")
            parts.append(c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else "")
            if m.get("tool_calls"):
                parts.append(json.dumps(m["tool_calls"], ensure_ascii=False))
    return "\n".join(parts).lower()


def filter_frame(df: pd.DataFrame, labels: list[str], traces: dict[str, Trace], reason: str | None, source: str | None,
                 query: str | None) -> pd.DataFrame:
    if df.empty:
        return df
    keep = pd.Series(True, index=df.index)
    if reason and reason != ALL:
        keep &= df["termination"] == ("" if reason == "(none)" else reason)
    if source and source != ALL:
        keep &= df["source"] == source
    q = (query or "").strip().lower()
    if q:
        keep &= df["#"].map(lambda i: q in _haystack(traces[labels[i]]))
    return df[keep].reset_index(drop=True)


def filter_choices(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    reasons = sorted({r or "(none)" for r in df["termination"]}) if not df.empty else []
    sources = sorted(set(df["source"])) if not df.empty else []
    return [ALL, *reasons], [ALL, *sources]


def load_file(ctx: AppContext, session: Session, path: str | None) -> tuple[str, pd.DataFrame]:
    """Load an uploaded file into the session. Returns (status html, problems frame)."""
    import html

    from backend.export import load_any
    from backend.trace import TraceFileError, human_bytes

    empty = pd.DataFrame([], columns=["line", "problem"])
    if not path:
        return "", empty
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        if size > ctx.max_upload_bytes:
            raise TraceFileError(f"{name} is {human_bytes(size)}, over this app's {human_bytes(ctx.max_upload_bytes)} upload limit")
        res = load_any(path)
    except Exception as e:  # noqa: BLE001 - shown to the user
        return f'<div class="ali-err">Could not read {html.escape(name)}: {html.escape(short_error(e))}</div>', empty
    labels = [session.add(f"file · {name} · {t.id}", t) for t in res.traces]
    session.file_traces = labels
    session.file_name = name
    session.file_problems = [(p.line, p.reason) for p in res.problems]
    if labels:
        session.current = labels[0]
    probs = pd.DataFrame([{"line": p.line, "problem": p.reason} for p in res.problems], columns=["line", "problem"])
    msg = f"{html.escape(name)}: {len(res.traces)} trace(s) loaded"
    if res.problems:
        msg += f", <b>{len(res.problems)} bad record(s)</b> (listed below with their line numbers)"
    cls = "ali-ok" if not res.problems else "ali-warn"
    return f'<div class="{cls}">{msg}</div>', probs


def export_filtered(session: Session, df: pd.DataFrame | None, fmt: str) -> str:
    from backend.export import export_traces

    if df is None or len(df) == 0:
        raise gr.Error("nothing to export: the filtered table is empty")
    traces = [session.traces[session.file_traces[int(i)]] for i in df["#"]]
    d = tempfile.mkdtemp(prefix="ali-export-")
    ext = "parquet" if fmt == "parquet" else "jsonl"
    base = os.path.splitext(session.file_name or "traces")[0] or "traces"
    out = os.path.join(d, f"{base}-filtered.{ext}")
    export_traces(traces, fmt, out)
    return out


def build(ctx: AppContext, session: gr.State) -> TraceFilesUI:
    gr.Markdown("Upload trace files (our JSONL / JSON / Parquet). Bad records are listed with their line numbers; "
                "the good ones load. Select a row to open it in the **Inspector**.")
    with gr.Row():
        upload = gr.File(label="Trace file", file_types=[".jsonl", ".json", ".parquet"], type="filepath", elem_id="tf-upload", scale=2)
        with gr.Column(scale=3):
            status = gr.HTML(elem_id="tf-status")
            problems = gr.Dataframe(headers=["line", "problem"], value=pd.DataFrame([], columns=["line", "problem"]),
                                    label="Bad records", interactive=False, elem_id="tf-problems", max_height=200, wrap=True)
    with gr.Row():
        reason_dd = gr.Dropdown(label="Termination reason", choices=[ALL], value=ALL, elem_id="tf-reason")
        source_dd = gr.Dropdown(label="Source", choices=[ALL], value=ALL, elem_id="tf-source")
        search = gr.Textbox(label="Search (id, messages, tool calls)", elem_id="tf-search", placeholder="e.g. Seattle")
    table = gr.Dataframe(headers=COLUMNS, value=pd.DataFrame([], columns=COLUMNS), interactive=False,
                         label="Traces (click a row to inspect)", elem_id="tf-table", max_height=420)
    # not equal_height: the button would be stretched to the file box's height; the file box
    # appears once there is a file
    with gr.Row(equal_height=False):
        export_fmt = gr.Radio(["jsonl", "parquet"], value="jsonl", label="Export the filtered traces as", elem_id="tf-export-fmt",
                              scale=2)
        export_btn = gr.Button("Export filtered", elem_id="tf-export", scale=1)
        export_file = gr.File(label="Exported file", interactive=False, elem_id="tf-export-file", height=90, scale=2, visible=False)
    dist = gr.Plot(label="Distributions", show_label=False, elem_id="tf-dist")
    return TraceFilesUI(upload, status, problems, reason_dd, source_dd, search, table, dist, export_fmt, export_btn, export_file)


def table_outputs(session: Session, reason: str | None = ALL, source: str | None = ALL, query: str | None = "") -> list[Any]:
    """[reason_dd, source_dd, table, dist] for the session's current file."""
    full = traces_frame(session.file_traces, session.traces)
    reasons, sources = filter_choices(full)
    reason = reason if reason in reasons else ALL
    source = source if source in sources else ALL
    df = filter_frame(full, session.file_traces, session.traces, reason, source, query)
    traces = [session.traces[session.file_traces[int(i)]] for i in df["#"]] if not df.empty else []
    return [gr.update(choices=reasons, value=reason), gr.update(choices=sources, value=source), df, charts.file_distributions(traces)]


def initial_status(session: Session) -> str:
    import html

    n = len(session.file_traces)
    return f'<div class="ali-info">{n} trace(s) from {html.escape(session.file_name or "?")}/ are loaded; upload a file to replace them.</div>'



def wire(ctx: AppContext, ui: TraceFilesUI, session: gr.State, open_in_inspector) -> None:
    """Events. ``open_in_inspector(session, label)`` returns the Inspector's outputs and the tab switch;
    it is given as (fn, outputs)."""
    fn_open, open_outputs = open_in_inspector

    def on_upload(sess: Session, path: str | None):
        status, probs = load_file(ctx, sess, path)
        return [sess, status, probs, *table_outputs(sess)]

    def on_filter(sess: Session, reason: str, source: str, query: str):
        return table_outputs(sess, reason, source, query)

    def on_select(sess: Session, df: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if df is None or row is None or row >= len(df):
            raise gr.Error("no such row")
        label = sess.file_traces[int(df.iloc[row]["#"])]
        return fn_open(sess, label)

    filt_out = [ui.reason_dd, ui.source_dd, ui.table, ui.dist]
    # API name, kept stable (see ui/playground.py): /trace_files_upload (file) -> status, bad records,
    # the two filters, the table, the plot; the file goes into the caller's session only
    ui.upload.upload(on_upload, [session, ui.upload], [session, ui.status, ui.problems, *filt_out], api_name="trace_files_upload")
    for comp in (ui.reason_dd, ui.source_dd):
        comp.input(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out)
    ui.search.submit(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out)
    ui.search.change(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out, trigger_mode="always_last")
    ui.table.select(on_select, [session, ui.table], open_outputs)
    ui.export_btn.click(lambda sess, df, fmt: gr.update(value=export_filtered(sess, df, fmt), visible=True),
                        [session, ui.table, ui.export_fmt], [ui.export_file])
