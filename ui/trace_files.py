"""Trace files tab: upload JSONL / JSON / Parquet, a table with filters and search, open a row in
the Inspector, export the filtered set. Bad records are listed with their line numbers; the
good ones load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.labels import trace_termination_label
from backend.trace import Trace, TraceIndex
from backend.trace.io import summary_of_trace
from ui import charts, run_charts
from ui.context import AppContext, Session, short_error

# "termination": the end state in words with verl's code beside it (backend.labels); "preview":
# the first user message
COLUMNS = ["#", "id", "source", "turns", "tokens", "termination", "errors", "preview"]
PREVIEW_CHARS = 80
ALL = "(all)"
AUTO = "auto"
# what an uploaded file may be: "auto" (our traces; a file holding none but another tool's
# records is imported) or one of the importers' formats
FILE_FORMATS = [AUTO, "agents-sdk", "verl", "openai-chat", "sharegpt"]


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
    import_fmt: gr.Dropdown
    import_tok: gr.Dropdown
    count: gr.HTML | None = None  # "3 of 7 shown"
    run: run_charts.RunChartsUI | None = None  # charts by training step (ui/run_charts.py)


def _source(t: Trace) -> str:
    md = t.metadata if isinstance(t.metadata, dict) else {}
    return str(md.get("source") or "?")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def preview(t: Trace, limit: int = PREVIEW_CHARS) -> str:
    """The first user message, on one line, shortened to ``limit`` characters (the index's
    preview column, for a trace in memory)."""
    return _shorten(summary_of_trace(t)["preview"], limit)


def listing(index: TraceIndex, labels: list[str], traces: dict[str, Trace]) -> pd.DataFrame:
    """The table of a file: one row per row of its ``index`` (id, source, turns, tokens, errors,
    preview come from the index), ``#`` the row's position in ``labels`` (its trace in the
    session), the termination in words (:func:`backend.labels.trace_termination_label`)."""
    cols = index.cols
    rows = []
    for i, label in enumerate(labels[: len(index)]):
        t = traces.get(label)
        if t is None:
            continue
        rows.append({
            "#": i, "id": cols["id"][i], "source": cols["source"][i] or "?", "turns": cols["turns"][i],
            "tokens": cols["tokens"][i], "termination": trace_termination_label(t), "errors": cols["errors"][i],
            "preview": _shorten(cols["preview"][i], PREVIEW_CHARS),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def traces_frame(labels: list[str], traces: dict[str, Trace]) -> pd.DataFrame:
    """:func:`listing` of traces in memory (``#`` is the position in ``labels``)."""
    present = [(i, x) for i, x in enumerate(labels) if x in traces]
    df = listing(TraceIndex.of_traces([traces[x] for _, x in present]), [x for _, x in present], traces)
    df["#"] = [i for i, _ in present]
    return df


def file_listing(session: Session) -> pd.DataFrame:
    """The table of the session's file: from the uploaded file's index (built by
    :func:`load_file`), or from an index over the traces in memory (the samples)."""
    ix = session.file_index
    if ix is not None and len(ix) == len(session.file_traces):
        return listing(ix, session.file_traces, session.traces)
    return traces_frame(session.file_traces, session.traces)


def _haystack(t: Trace) -> str:
    parts = [t.id, _source(t), t.termination_reason or "", trace_termination_label(t)]
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
        # the label the dropdown shows, or verl's code (``malformed_tool_call``)
        codes = df["#"].map(lambda i: traces[labels[i]].termination_reason or "")
        keep &= (df["termination"] == reason) | (codes == reason)
    if source and source != ALL:
        keep &= df["source"] == source
    q = (query or "").strip().lower()
    if q:
        keep &= df["#"].map(lambda i: q in _haystack(traces[labels[i]]))
    return df[keep].reset_index(drop=True)


def filter_choices(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    reasons = sorted(set(df["termination"])) if not df.empty else []
    sources = sorted(set(df["source"])) if not df.empty else []
    return [ALL, *reasons], [ALL, *sources]


def import_tokenizers(ctx: AppContext) -> list[str]:
    """Tokenizers an upload may be imported with: the offline profiles, and the model's own
    when the model service has one loaded. Never a typed hub id or path: on a shared deployment
    an upload must not make the server fetch or read what a visitor names."""
    from backend.tokenizers import PROFILES

    names = list(PROFILES)
    own = getattr(ctx.model.bundle, "name", None)
    if own and own not in names:
        names.append(own)
    return names


def _import_bundle(ctx: AppContext, name: str | None) -> Any:
    from backend.trace import TraceFileError

    name = name or ctx.default_tokenizer
    allowed = import_tokenizers(ctx)
    if name not in allowed:
        raise TraceFileError(f"tokenizer {name!r} is not one this app imports with ({', '.join(allowed)})")
    own = ctx.model.bundle
    if own is not None and getattr(own, "name", None) == name:
        return own
    return ctx.tokenizers.get(name)


def read_upload(ctx: AppContext, path: str, fmt: str = AUTO, tokenizer: str | None = None) -> tuple[TraceIndex, str | None]:
    """The index of an uploaded file (its traces held: ``index.traces``), and the format(s) it
    was imported from (None for our own traces). ``fmt`` "auto": our traces as they are, indexed
    as they are read; a file in which nothing is a trace but whose records are another tool's is
    imported with ``tokenizer``, then indexed."""
    from backend import importers
    from backend.importers import load_any
    from backend.trace import TraceFileError

    if fmt not in FILE_FORMATS:
        raise TraceFileError(f"unknown file format {fmt!r}; choose one of {', '.join(FILE_FORMATS)}")
    bundle = lambda: _import_bundle(ctx, tokenizer)  # noqa: E731 - loaded only for an import
    if fmt != AUTO:
        return TraceIndex.of_result(importers.import_file(path, fmt, bundle=bundle()), path), fmt
    if importers.detect(path) in (None, "trace"):
        return TraceIndex.build([path], keep=True), None
    res = load_any(path, import_foreign=True, bundle=bundle())
    return TraceIndex.of_result(res, path), ", ".join(getattr(res, "formats", None) or {}) or None


def load_file(ctx: AppContext, session: Session, path: str | None, fmt: str = AUTO,
              tokenizer: str | None = None) -> tuple[str, pd.DataFrame]:
    """Load an uploaded file into the session (importing another tool's format, see
    :func:`read_upload`). Returns (status html, problems frame)."""
    import html

    from backend.trace import TraceFileError, human_bytes

    empty = pd.DataFrame([], columns=["line", "problem"])
    if not path:
        return "", empty
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        if size > ctx.max_upload_bytes:
            raise TraceFileError(f"{name} is {human_bytes(size)}, over this app's {human_bytes(ctx.max_upload_bytes)} upload limit")
        index, imported = read_upload(ctx, path, fmt, tokenizer)
    except Exception as e:  # noqa: BLE001 - shown to the user
        return f'<div class="ali-err">Could not read {html.escape(name)}: {html.escape(short_error(e))}</div>', empty
    traces = index.traces or []
    index.traces = None  # the session holds them; the index keeps its rows and locations
    labels = [session.add(f"file · {name} · {t.id}", t) for t in traces]
    session.file_traces = labels
    session.file_index = index
    session.file_name = name
    problems = index.problems
    session.file_problems = [(p.line, p.reason) for p in problems]
    if labels:
        session.current = labels[0]
    unit = index.unit  # what a bad record's number counts: line, row or index
    probs = pd.DataFrame([{"line": p.line, "problem": p.reason} for p in problems], columns=["line", "problem"])
    msg = f"{html.escape(name)}: {len(traces)} trace(s) loaded"
    if imported:
        given = sum(1 for t in traces if t.metadata.get("ids") == "given")
        how = f"token ids as given for {given}, " if given else ""
        tok = traces[0].tokenizer.name if traces else (tokenizer or ctx.default_tokenizer)
        msg = (f"{html.escape(name)}: {len(traces)} trace(s) imported from <b>{html.escape(imported)}</b> "
               f"({how}rendered and decoded with {html.escape(str(tok))})")
    if problems:
        total = index.problem_count
        listed = "listed below" if total == len(problems) else f"the first {len(problems)} listed below"
        msg += f", <b>{total} bad record(s)</b> ({listed} with their {unit} numbers)"
    cls = "ali-ok" if not problems else "ali-warn"
    return f'<div class="{cls}">{msg}</div>', probs


def export_filtered(session: Session, df: pd.DataFrame | None, fmt: str) -> str:
    from backend.export import export_traces

    if df is None or len(df) == 0:
        raise gr.Error("nothing to export: the filtered table is empty")
    traces = [session.traces[session.file_traces[int(i)]] for i in df["#"]]
    d = session.temp_dir("export")  # the session's newest only; removed when it ends, or at shutdown
    ext = "parquet" if fmt == "parquet" else "jsonl"
    base = os.path.splitext(session.file_name or "traces")[0] or "traces"
    out = os.path.join(d, f"{base}-filtered.{ext}")
    export_traces(traces, fmt, out)
    return out


def build(ctx: AppContext, session: gr.State) -> TraceFilesUI:
    gr.Markdown("Upload trace files (JSONL / JSON / Parquet): our traces, or another tool's records (OpenAI Agents SDK "
                "runs, verl rollout dumps, chat-completions logs, ShareGPT / HF messages rows), imported as traces. Bad records "
                "are listed with their line numbers; the good ones load. Select a row to open it in the **Inspector**.")
    with gr.Row():
        with gr.Column(scale=2):
            upload = gr.File(label="Trace file", file_types=[".jsonl", ".json", ".parquet"], type="filepath", elem_id="tf-upload")
            with gr.Row():
                import_fmt = gr.Dropdown(FILE_FORMATS, value=AUTO, label="Format", elem_id="tf-import-fmt",
                                         info="auto: our traces, or the other tool's format found in the file")
                toks = import_tokenizers(ctx)
                import_tok = gr.Dropdown(toks, value=ctx.default_tokenizer if ctx.default_tokenizer in toks else toks[0],
                                         label="Tokenizer for imports", elem_id="tf-import-tok",
                                         info="renders records that carry no token ids")
        with gr.Column(scale=3):
            status = gr.HTML(elem_id="tf-status")
            problems = gr.Dataframe(headers=["line", "problem"], value=pd.DataFrame([], columns=["line", "problem"]),
                                    label="Bad records", interactive=False, elem_id="tf-problems", max_height=200, wrap=True)
    with gr.Row():
        reason_dd = gr.Dropdown(label="Termination reason", choices=[ALL], value=ALL, elem_id="tf-reason")
        source_dd = gr.Dropdown(label="Source", choices=[ALL], value=ALL, elem_id="tf-source")
        search = gr.Textbox(label="Search (id, messages, tool calls)", elem_id="tf-search", placeholder="e.g. Seattle")
    count = gr.HTML(elem_id="tf-count")
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
    # ---- charts by training step and the two-step comparison (ui/run_charts.py) ----
    run = run_charts.build(ctx)
    # ----
    return TraceFilesUI(upload, status, problems, reason_dd, source_dd, search, table, dist, export_fmt, export_btn, export_file,
                        import_fmt, import_tok, count, run)


def table_outputs(session: Session, reason: str | None = ALL, source: str | None = ALL, query: str | None = "") -> list[Any]:
    """[reason_dd, source_dd, table, dist] for the session's current file."""
    full = file_listing(session)
    reasons, sources = filter_choices(full)
    if reason not in reasons:  # verl's code (an API caller) selects its label
        by_code = {session.traces[session.file_traces[int(i)]].termination_reason: lab for i, lab in zip(full["#"], full["termination"])}
        reason = by_code.get(reason, ALL)
    source = source if source in sources else ALL
    df = filter_frame(full, session.file_traces, session.traces, reason, source, query)
    traces = [session.traces[session.file_traces[int(i)]] for i in df["#"]] if not df.empty else []
    return [gr.update(choices=reasons, value=reason), gr.update(choices=sources, value=source), df, charts.file_distributions(traces)]


def match_count(session: Session, df: pd.DataFrame | None) -> str:
    """"3 of 7 shown": the rows the filters and search keep, of the file's traces."""
    shown = 0
    if isinstance(df, pd.DataFrame) and "#" in df.columns:
        shown = int(sum(1 for v in df["#"] if str(v).strip() != ""))  # an emptied table may hold one blank row
    return f'<div class="ali-info" data-count="{shown}">{shown} of {len(session.file_traces)} shown</div>'


def initial_status(session: Session) -> str:
    import html

    n = len(session.file_traces)
    return f'<div class="ali-info">{n} trace(s) from {html.escape(session.file_name or "?")}/ are loaded; upload a file to replace them.</div>'



def wire(ctx: AppContext, ui: TraceFilesUI, session: gr.State, open_in_inspector) -> None:
    """Events. ``open_in_inspector(session, label)`` returns the Inspector's outputs and the tab switch;
    it is given as (fn, outputs)."""
    fn_open, open_outputs = open_in_inspector

    def on_upload(sess: Session, path: str | None, fmt: str = AUTO, tokenizer: str | None = None):
        if not path:  # a format/tokenizer change with no file: nothing to (re)load
            return [sess, gr.update(), gr.update(), *table_outputs(sess)]
        status, probs = load_file(ctx, sess, path, fmt or AUTO, tokenizer)
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
    # (file, format="auto", tokenizer=the default) -> ...; format and tokenizer have defaults, so
    # a client passing the file alone still works
    up_in, up_out = [session, ui.upload, ui.import_fmt, ui.import_tok], [session, ui.status, ui.problems, *filt_out]
    ui.upload.upload(on_upload, up_in, up_out, api_name="trace_files_upload")
    # choosing another format or tokenizer re-reads the file already uploaded
    for comp in (ui.import_fmt, ui.import_tok):
        comp.input(on_upload, up_in, up_out, api_visibility="private")
    for comp in (ui.reason_dd, ui.source_dd):
        comp.input(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out)
    ui.search.submit(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out)
    ui.search.change(on_filter, [session, ui.reason_dd, ui.source_dd, ui.search], filt_out, trigger_mode="always_last")
    ui.table.select(on_select, [session, ui.table], open_outputs)
    if ui.count is not None:
        # whatever filled the table (page load, upload, filters, search) also sets the count, so
        # no handler's outputs (and no API output list) change for it
        ui.table.change(match_count, [session, ui.table], [ui.count], queue=False, api_visibility="private")
    # ---- charts by training step (ui/run_charts.py): redrawn when the table's trace set changes ----
    if ui.run is not None:
        run_charts.wire(ui.run, session, [ui.table])
    # ----
    ui.export_btn.click(lambda sess, df, fmt: gr.update(value=export_filtered(sess, df, fmt), visible=True),
                        [session, ui.table, ui.export_fmt], [ui.export_file])
