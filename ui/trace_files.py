"""Trace files tab: upload JSONL / JSON / Parquet, a table with filters and search, open a row in
the Inspector, export the filtered set. Bad records are listed with their line numbers; the
good ones load.

A trace set (``--traces`` / ``ALI_TRACES``, or in local mode the folder field) is listed instead
of the upload: that mode is ``ui/trace_sets.py``; this module builds the tab and wires both.

The GRPO group view of the tab's traces (an accordion under the table) is ``ui/grpo_groups.py``.
The re-render audit of the tab's traces (an accordion under the charts) is ``ui/trace_audit.py``;
which traces it audits and how its rows open are here (:func:`audit_source`, :func:`open_audit_row`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gradio as gr
import pandas as pd

from backend.checks.labels import trace_termination_label
from backend.importers import FORMATS as IMPORT_FORMATS
from backend.trace import Trace, TraceFileError, TraceFormatError, TraceIndex
from backend.trace.index import summary_of_trace
from ui import captured, charts, grpo_groups, run_charts, trace_audit
from ui.context import AppContext, Session, free_label, short_error
from ui.trace_sets import (
    ALL,
    GROUP_CHARS,
    PREVIEW_CHARS,
    REWARD_CHOICES,
    SEARCH_CHARS,
    SetUI,
    build_set,
    export_set,
    in_set_mode,
    open_set_row,
    rl_keep,
    session_set,
    set_count,
    set_table,
    set_view,
    shorten,
    step_choices,
    wire_set,
)

# "termination": the end state in words with verl's code beside it (backend.checks.labels); "preview":
# the first user message
COLUMNS = ["#", "id", "source", "turns", "tokens", "termination", "errors", "preview"]
AUTO = "auto"
# what an uploaded file may be: "auto" (our traces; a file holding none but another tool's
# records is imported) or one of the importers' formats
FILE_FORMATS = [AUTO, *IMPORT_FORMATS]
# traces of an upload that is not held (FileRows) kept opened in the session at once: the ones the
# Inspector was given, the oldest let go first (opened again from the file when selected)
MAX_OPENED = 64
# what reading a row of a kept upload may raise: a bad record, a damaged or vanished file
READ_ERRORS = (TraceFileError, TraceFormatError, OSError)


@dataclass
class FileRows:
    """An upload (our traces: JSONL, JSON, our Parquet; or an import, converted to our JSONL),
    listed from its index and opened row by row: the session holds the index and, per row, the
    end state in words and the search text, never all the traces (measured: a 50 MB JSONL file of
    6,333 traces held 309 MB as traces, 11 MB so). ``path`` is the session's own link or copy of
    the upload, or the import's converted copy (gradio deletes its copy after an hour; this one
    goes when the session ends or the next upload replaces it)."""

    index: TraceIndex
    ends: list[str]
    haystacks: list[str]
    path: str
    opened: dict[str, None] = field(default_factory=dict)  # labels opened into session.traces, oldest first
    # an import (another tool's records, converted and written to ``path`` as our traces): how
    # many carried their token ids, and the tokenizer the first was rendered with
    given: int = 0
    losses: int = 0  # things the import did not carry over (listed with the problems)
    notes: list[str] = field(default_factory=list)  # how auto-detection chose between formats
    tokenizer: str | None = None
    # per row, the GRPO group the group view puts it in (backend.checks.groups.group_of: the file's group
    # id, else a hash of the prompt): what the group filter matches
    groups: list[str] = field(default_factory=list)


class FileFilters(NamedTuple):
    """The upload table's filters as last listed (:func:`table_outputs`): what "Export filtered"
    exports when it is given no rows (the API's default table), and what the step / group / reward
    controls are set back to after the table changes."""

    reason: str = ALL
    source: str = ALL
    query: str = ""
    step: str = ALL
    group: str = ""
    reward: str = ALL


def _kept_name(path: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(path))[-120:].lstrip(".") or "upload"


def _rows_of(kept: str) -> FileRows:
    """The :class:`FileRows` of a file of our traces (every record validated as it is read)."""
    from backend.checks.groups import group_of

    ends: list[str] = []
    hay: list[str] = []
    groups: list[str] = []

    def seen(t: Trace) -> None:
        ends.append(trace_termination_label(t))
        hay.append(_haystack(t))
        groups.append(group_of(t)[0])

    return FileRows(TraceIndex.build([kept], on_trace=seen), ends, hay, kept, groups=groups)


def _rows_of_import(res: Any, path: str, folder: str) -> FileRows:
    """An import's traces written to ``folder`` as our JSONL and listed from there, so the session
    does not hold them either; the import's bad records keep the upload's line (or row) numbers."""
    from backend.trace import write_jsonl

    stem = os.path.splitext(_kept_name(path))[0] or "upload"
    out = os.path.join(folder, f"{stem}.jsonl")
    write_jsonl(res.traces, out)
    rows = _rows_of(out)
    f = rows.index.files[0]
    f.unit = getattr(res, "unit", "line")
    f.formats = dict(getattr(res, "formats", None) or {})
    f.problems.extend(res.problems)
    f.problems.unlisted = getattr(res.problems, "unlisted", 0)
    losses = list(getattr(res, "losses", None) or [])
    f.problems.extend(losses)  # listed with their line, after the bad records
    f.problems.extend(getattr(res, "unreadable", None) or [])  # calls kept as written, said
    rows.losses = len(losses)
    rows.notes = list(getattr(res, "notes", None) or [])
    rows.given = sum(1 for t in res.traces if t.metadata.get("ids") == "given")
    rows.tokenizer = res.traces[0].tokenizer.name if res.traces else None
    return rows


def keep_upload(path: str, folder: str) -> str:
    """The upload at ``path`` linked (or, across file systems, copied) into ``folder``."""
    import shutil

    dest = os.path.join(folder, _kept_name(path))  # a name, never a path
    try:
        os.link(path, dest)
    except OSError:
        shutil.copyfile(path, dest)
    return dest


def open_file_row(session: Session, i: int) -> str:
    """Row ``i`` of the session's file as a trace of the session: its label. A held file's trace
    is there already; an upload that is not held (:class:`FileRows`) is read by the row's bytes
    (raises one of :data:`READ_ERRORS` when it cannot be), and the oldest traces opened past :data:`MAX_OPENED` are let go.
    Under the session's file lock: an upload replacing this one waits, and is not half seen."""
    with session.file_lock():
        return _open_file_row(session, i)


def _open_file_row(session: Session, i: int) -> str:
    label = session.file_traces[i]
    rows = session.file_rows
    if not isinstance(rows, FileRows):
        return label
    if label in rows.opened and label in session.traces:
        rows.opened.pop(label)
        rows.opened[label] = None
        return label
    t = rows.index.open(i)
    label = session.add(label, t)  # a new name if something else took this one meanwhile
    session.file_traces[i] = label
    rows.opened[label] = None
    for old in list(rows.opened):
        if len(rows.opened) <= MAX_OPENED:
            break
        if old != session.current and old != label:
            rows.opened.pop(old)
            session.traces.pop(old, None)
    return label


def file_trace(session: Session, i: int) -> Trace:
    """Row ``i``'s trace, without keeping it in the session (read by its bytes when not held)."""
    rows = session.file_rows
    label = session.file_traces[i]
    if isinstance(rows, FileRows) and label not in rows.opened:
        return rows.index.open(i)
    return session.traces[label]


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
    # training step, GRPO group and reward filters: the upload's (their choices follow the file:
    # rl_filter_updates) and the trace set's
    step_dd: gr.Dropdown | None = None
    group_tb: gr.Textbox | None = None
    reward_dd: gr.Dropdown | None = None
    filter_api: gr.Button | None = None  # hidden: carries /trace_files_filter
    # the trace set (a folder or glob: --traces, or in local mode the folder field; ui/trace_sets.py)
    set_ui: SetUI | None = None
    run: run_charts.RunChartsUI | None = None  # charts by training step (ui/run_charts.py)
    audit: trace_audit.AuditUI | None = None  # the re-render audit of the tab's traces (ui/trace_audit.py)
    groups: grpo_groups.GroupsUI | None = None  # the GRPO group view (ui/grpo_groups.py)
    captured: captured.CapturedUI | None = None  # the capture gateway's sessions (ui/captured.py)


def _source(t: Trace) -> str:
    md = t.metadata if isinstance(t.metadata, dict) else {}
    return str(md.get("source") or "?")


def preview(t: Trace, limit: int = PREVIEW_CHARS) -> str:
    """The first user message, on one line, shortened to ``limit`` characters (the index's
    preview column, for a trace in memory)."""
    return shorten(summary_of_trace(t)["preview"], limit)


def listing(index: TraceIndex, labels: list[str], traces: dict[str, Trace], ends: list[str] | None = None) -> pd.DataFrame:
    """The table of a file: one row per row of its ``index`` (id, source, turns, tokens, errors,
    preview come from the index), ``#`` the row's position in ``labels`` (its trace in the
    session), the termination in words (:func:`backend.checks.labels.trace_termination_label`; ``ends``:
    those words per row, for a file whose traces are not held)."""
    cols = index.cols
    rows = []
    for i, label in enumerate(labels[: len(index)]):
        if ends is not None:
            end = ends[i]
        else:
            t = traces.get(label)
            if t is None:
                continue
            end = trace_termination_label(t)
        rows.append({
            "#": i, "id": cols["id"][i], "source": cols["source"][i] or "?", "turns": cols["turns"][i],
            "tokens": cols["tokens"][i], "termination": end, "errors": cols["errors"][i],
            "preview": shorten(cols["preview"][i], PREVIEW_CHARS),
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
    rows = session.file_rows
    if isinstance(rows, FileRows):
        return listing(rows.index, session.file_traces, session.traces, rows.ends)
    ix = session.file_index
    if ix is not None and len(ix) == len(session.file_traces):
        return listing(ix, session.file_traces, session.traces)
    return traces_frame(session.file_traces, session.traces)


def shown_index(session: Session) -> TraceIndex:
    """The index of what the tab lists (its ``frame()``: one row per trace, INDEX_COLUMNS, with
    ``training_step``): the session's trace set, else the uploaded file's index, else an index
    over the traces in memory (the samples)."""
    if in_set_mode(session):
        return session_set(session)[0]
    ix = session.file_index
    if ix is not None and len(ix) == len(session.file_traces):
        return ix
    return TraceIndex.of_traces([session.traces[x] for x in session.file_traces if x in session.traces])


def _haystack(t: Trace) -> str:
    parts = [t.id, _source(t), t.termination_reason or "", trace_termination_label(t)]
    for m in t.messages:
        if isinstance(m, dict):
            c = m.get("content")
            parts.append(c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else "")
            if m.get("tool_calls"):
                parts.append(json.dumps(m["tool_calls"], ensure_ascii=False))
    return "\n".join(parts).lower()


def rl_frame(df: pd.DataFrame, labels: list[str], traces: dict[str, Trace], rows: FileRows | None = None) -> pd.DataFrame:
    """The training step, GRPO group and reward (``training_step``, ``group``, ``score``, as the
    index has them) of a file's table rows (their ``#``): from the index of a file not held
    (``rows``), else from the traces in memory. ``group`` is the group the group view puts the row
    in (:func:`backend.checks.groups.group_of`: the file's group id, else a hash of its prompt)."""
    from backend.checks.groups import group_of

    at = [int(i) for i in df["#"]]
    if rows is not None:
        ix = rows.index.df
        step, score = ix["training_step"].iloc[at].tolist(), ix["score"].iloc[at].tolist()
        gids = [rows.groups[i] for i in at] if len(rows.groups) == len(ix) else ix["group"].iloc[at].tolist()
    else:
        held = [traces[labels[i]] for i in at]
        summ = [summary_of_trace(t) for t in held]
        step, score = [x["training_step"] for x in summ], [x["score"] for x in summ]
        gids = [group_of(t)[0] for t in held]
    return pd.DataFrame({"training_step": pd.Series(step, dtype="Int64"), "group": pd.Series(gids, dtype=object),
                         "score": pd.Series([float("nan") if pd.isna(x) else x for x in score], dtype="float64")}).set_axis(df.index)


def filter_frame(df: pd.DataFrame, labels: list[str], traces: dict[str, Trace], reason: str | None, source: str | None,
                 query: str | None, rows: FileRows | None = None, step: str | None = ALL, group: str | None = "",
                 reward: str | None = ALL) -> pd.DataFrame:
    """The rows of a file's table the filters keep (``rows``: a file whose traces are not held,
    filtered by its index's end states and its rows' search text); the training step, GRPO group
    and reward filters as the trace set's (:func:`ui.trace_sets.rl_keep` on :func:`rl_frame`)."""
    if df.empty:
        return df
    keep = pd.Series(True, index=df.index)
    if (step and step != ALL) or (group or "").strip() or (reward and reward != ALL):
        keep &= rl_keep(rl_frame(df, labels, traces, rows), step, group, reward)
    if reason and reason != ALL:
        # the label the dropdown shows, or verl's code (``malformed_tool_call``)
        if rows is not None:
            code_of = rows.index.cols["termination_reason"]
            codes = df["#"].map(lambda i: code_of[i] or "")
        else:
            codes = df["#"].map(lambda i: traces[labels[i]].termination_reason or "")
        keep &= (df["termination"] == reason) | (codes == reason)
    if source and source != ALL:
        keep &= df["source"] == source
    q = (query or "").strip().lower()[:SEARCH_CHARS]
    if q:
        if rows is not None:
            keep &= df["#"].map(lambda i: q in rows.haystacks[i])
        else:
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
    from backend.families import PROFILES

    names = list(PROFILES)
    own = getattr(ctx.model.bundle, "name", None)
    if own and own not in names:
        names.append(own)
    return names


def _import_bundle(ctx: AppContext, name: str | None) -> Any:
    name = name or ctx.default_tokenizer
    allowed = import_tokenizers(ctx)
    if name not in allowed:
        raise TraceFileError(f"tokenizer {name!r} is not one this app imports with ({', '.join(allowed)})")
    own = ctx.model.bundle
    if own is not None and getattr(own, "name", None) == name:
        return own
    return ctx.tokenizers.get(name)


def read_upload(ctx: AppContext, path: str, fmt: str = AUTO, tokenizer: str | None = None, *,
                keep_in: str) -> tuple[FileRows, str | None]:
    """The rows of an uploaded file (:class:`FileRows`, kept in the session's folder ``keep_in``),
    and the format(s) it was imported from (None for our own traces). ``fmt`` "auto": our traces
    as they are (the file linked into ``keep_in``), every record validated as it is read; a file
    in which nothing is a trace but whose records are another tool's is imported with
    ``tokenizer``, and the traces written to ``keep_in`` as our JSONL. No trace is held."""
    from backend import importers
    from backend.importers import load_any
    from backend.safety.pickle_guard import looks_like_pickle
    from backend.trace.yaml_guard import is_yaml_path

    pickled = looks_like_pickle(path)
    if pickled:  # before anything reads it: a public server never does
        ctx.trust.check_pickle(os.path.basename(path))
    if fmt not in FILE_FORMATS:
        raise TraceFileError(f"unknown file format {fmt!r}; choose one of {', '.join(FILE_FORMATS)}")
    bundle = lambda: _import_bundle(ctx, tokenizer)  # noqa: E731 - loaded only for an import
    if fmt != AUTO:
        return _rows_of_import(importers.import_file(path, fmt, bundle=bundle()), path, keep_in), fmt
    # a pickle or a YAML log is never ours: read once, by the import (which says why one is refused)
    if not (pickled or is_yaml_path(path)) and importers.detect(path) in (None, "trace"):
        return _rows_of(keep_upload(path, keep_in)), None
    res = load_any(path, import_foreign=True, bundle=bundle())
    return _rows_of_import(res, path, keep_in), ", ".join(getattr(res, "formats", None) or {}) or None


def _let_go_of_file(session: Session) -> set[str]:
    """A new upload replaces the last one: its traces leave the session (all but the one the
    Inspector shows until it shows another, and the samples, which the app holds anyway).
    Returns the label of the one kept, if it is the old file's."""
    kept: set[str] = set()
    for label in session.file_traces:
        if label.startswith("file · "):
            if label == session.current:
                kept.add(label)
            else:
                session.traces.pop(label, None)
    session.file_rows = None
    return kept


def load_file(ctx: AppContext, session: Session, path: str | None, fmt: str = AUTO,
              tokenizer: str | None = None) -> tuple[str, pd.DataFrame] | None:
    """Load an uploaded file into the session (importing another tool's format, see
    :func:`read_upload`). Returns (status html, problems frame), or None when a newer upload or
    re-read of this session was asked for while this one was read (the newer one is shown;
    nothing of this one is kept)."""
    import html

    from backend.deploy import lifecycle
    from backend.trace import human_bytes

    empty = pd.DataFrame([], columns=["line", "problem"])
    if not path:
        return "", empty
    name = os.path.basename(path)
    lock = session.file_lock()
    with lock:
        session.upload_seq += 1
        seq = session.upload_seq
    try:
        size = os.path.getsize(path)
        if size > ctx.max_upload_bytes:
            raise TraceFileError(f"{name} is {human_bytes(size)}, over this app's {human_bytes(ctx.max_upload_bytes)} upload limit")
        # the last upload's folder stays until this one is read: a file that fails leaves it as it was
        kept_dir = lifecycle.temp_dir("ali-upload-")
        try:
            rows, imported = read_upload(ctx, path, fmt, tokenizer, keep_in=kept_dir)
        except BaseException:
            lifecycle.remove_temp_dir(kept_dir)
            raise
    except Exception as e:  # noqa: BLE001 - shown to the user
        if session.upload_seq != seq:
            return None
        return f'<div class="ali-err">Could not read {html.escape(name)}: {html.escape(short_error(e))}</div>', empty
    # the folder goes when nothing reads its file any more: a row being opened, exported or audited
    # from the last upload while this one replaces it still finds its bytes
    _remove_when_unused(rows.index, kept_dir)
    with lock:
        if session.upload_seq != seq:  # a newer upload or re-read was asked for meanwhile: that one is shown
            return None
        return _show_file(ctx, session, name, rows, imported, kept_dir, tokenizer)


def _remove_when_unused(index: TraceIndex, folder: str) -> None:
    import weakref

    from backend.deploy import lifecycle

    def remove() -> None:
        try:
            lifecycle.remove_temp_dir(folder)
        except ValueError:
            pass  # the temp root went first (shutdown)

    weakref.finalize(index, remove).atexit = False  # at exit the temp root goes whole


def _show_file(ctx: AppContext, session: Session, name: str, rows: FileRows, imported: str | None, kept_dir: str,
               tokenizer: str | None) -> tuple[str, pd.DataFrame]:
    import html

    old_labels = _let_go_of_file(session)
    session.temp_dirs["upload"] = kept_dir  # removed when the session ends; the last one's, once unused
    # listed from the index, opened row by row: each row's label is free now (opening it checks again)
    index = rows.index
    taken = set(session.traces)
    labels = []
    for tid in index.cols["id"]:
        labels.append(free_label(f"file · {name} · {tid}", taken))
        taken.add(labels[-1])
    session.file_traces = labels
    session.file_rows = rows
    session.file_index = index
    session.file_name = name
    problems = index.problems
    session.file_problems = [(p.line, p.reason) for p in problems]
    count = len(labels)
    if labels:
        try:
            session.current = open_file_row(session, 0)
        except Exception:  # noqa: BLE001 - the row is listed; selecting it says why it does not open
            pass
    if old_labels and session.current not in old_labels:  # the Inspector shows the new file: the last trace of the old one goes
        for label in old_labels:
            session.traces.pop(label, None)
    unit = index.unit  # what a bad record's number counts: line, row or index
    probs = pd.DataFrame([{"line": p.line, "problem": p.reason} for p in problems], columns=["line", "problem"])
    msg = f"{html.escape(name)}: {count} trace(s) loaded"
    if imported:
        given, tok = rows.given, rows.tokenizer or tokenizer or ctx.default_tokenizer
        how = f"token ids as given for {given}, " if given else ""
        msg = (f"{html.escape(name)}: {count} trace(s) imported from <b>{html.escape(imported)}</b> "
               f"({how}rendered and decoded with {html.escape(str(tok))})")
    lost = rows.losses
    if problems:
        total = index.problem_count - lost
        listed = "listed below" if total + lost == len(problems) else f"the first {len(problems)} listed below"
        parts = []
        if total:
            parts.append(f"<b>{total} bad record(s)</b>")
        if lost:
            parts.append(f"<b>{lost} thing(s) not carried over</b> into the traces")
        msg += ", " + " and ".join(parts) + f" ({listed} with their {unit} numbers)"
    for note in rows.notes:
        msg += f'<div class="ali-note">{html.escape(note)}</div>'
    cls = "ali-ok" if not problems else "ali-warn"
    return f'<div class="{cls}">{msg}</div>', probs


def export_filtered(session: Session, df: pd.DataFrame | None, fmt: str) -> str:
    """The table's rows (their ``#``) as one file. No rows given (the API's default table, or a
    table the filters emptied): the rows the session's table lists now (its last filters)."""
    from backend.exporters.export import export_traces

    at = [int(i) for i in df["#"] if str(i).strip() != ""] if isinstance(df, pd.DataFrame) and "#" in df.columns else []
    if not at:  # an emptied table may hold one blank row
        listed = table_outputs(session, *(session.file_filters or FileFilters()))[2]
        at = [int(i) for i in listed["#"]]
    if not at:
        raise gr.Error("nothing to export: the filtered table is empty")
    traces = (file_trace(session, i) for i in at)  # one at a time: a file not held stays so
    d = session.temp_dir("export")  # the session's newest only; removed when it ends, or at shutdown
    ext = "parquet" if fmt == "parquet" else "otlp.jsonl" if fmt == "otel" else "jsonl"
    base = os.path.splitext(session.file_name or "traces")[0] or "traces"
    out = os.path.join(d, f"{base}-filtered.{ext}")
    try:
        export_traces(traces, fmt, out)
    except READ_ERRORS as e:
        raise gr.Error(f"{session.file_name}: {short_error(e)}") from None
    return out


def build(ctx: AppContext, session: gr.State) -> TraceFilesUI:
    gr.Markdown("Upload trace files (JSONL / JSON / Parquet): our traces, or another tool's records (OpenTelemetry / "
                "OpenInference / Langfuse spans, LangSmith, MLflow, Anthropic and OpenAI logs, Agents SDK, pydantic-ai, "
                "LangChain, smolagents, verl, TRL, SkyRL, NeMo-RL, NeMo-Gym, slime .pt in local mode, ART's .yaml logs, ShareGPT), imported as traces. Bad records and anything not carried "
                "over are listed with their line numbers; the good ones load. Select a row to open it in the **Inspector**.")
    parts = build_set(ctx)
    with gr.Row():
        with gr.Column(scale=2):
            upload = gr.File(label="Trace file", file_types=[".jsonl", ".json", ".parquet", ".yaml", ".yml", *([] if ctx.trust.public else [".pt"])], type="filepath", elem_id="tf-upload")
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
        search = gr.Textbox("", label="Search (id, messages, tool calls)", elem_id="tf-search", placeholder="e.g. Seattle")
        step_dd = gr.Dropdown(label="Training step", choices=[ALL], value=ALL, elem_id="tf-step", allow_custom_value=True)
        group_tb = gr.Textbox("", label="GRPO group", elem_id="tf-group", placeholder="a group id, or step/id",
                              max_length=GROUP_CHARS)
        reward_dd = gr.Dropdown(label="Reward", choices=REWARD_CHOICES, value=ALL, elem_id="tf-reward")
        filter_api = gr.Button(visible=False, elem_id="tf-filter-api")
        if parts is not None:
            page = gr.Number(label="Page", value=1, precision=0, minimum=1, elem_id="tf-page", min_width=80)
    count = gr.HTML(elem_id="tf-count")
    table = gr.Dataframe(headers=COLUMNS, value=pd.DataFrame([], columns=COLUMNS), interactive=False,
                         label="Traces (click a row to inspect)", elem_id="tf-table", max_height=420)
    # not equal_height: the button would be stretched to the file box's height; the file box
    # appears once there is a file
    with gr.Row(equal_height=False):
        export_fmt = gr.Radio([("jsonl", "jsonl"), ("parquet", "parquet"), ("OpenTelemetry (OTLP JSON: Phoenix, Langfuse, Jaeger)", "otel")],
                              value="jsonl", label="Export the filtered traces as", elem_id="tf-export-fmt",
                              scale=2)
        export_btn = gr.Button("Export filtered", elem_id="tf-export", scale=1)
        export_file = gr.File(label="Exported file", interactive=False, elem_id="tf-export-file", height=90, scale=2, visible=False)
    dist = gr.Plot(label="Distributions", show_label=False, elem_id="tf-dist")
    set_ui = None
    if parts is not None:
        set_ui = SetUI(parts["folder"], parts["show_btn"], parts["follow"], parts["newest"], parts["status"], step_dd, page,
                       gr.Timer(1.0, active=bool(ctx.traces)), group_tb, reward_dd)  # the timer ticks once a set is shown
    # ---- the capture gateway's sessions (ui/captured.py), when the app has a capture folder ----
    cap = captured.build(ctx)
    # ---- the GRPO group view (ui/grpo_groups.py) ----
    groups = grpo_groups.build()
    # ---- charts by training step and the two-step comparison (ui/run_charts.py) ----
    run = run_charts.build(ctx)
    # ---- the re-render audit of the tab's traces (ui/trace_audit.py) ----
    audit = trace_audit.build()
    # ----
    return TraceFilesUI(upload, status, problems, reason_dd, source_dd, search, table, dist, export_fmt, export_btn, export_file,
                        import_fmt, import_tok, count, step_dd, group_tb, reward_dd, filter_api, set_ui, run=run, audit=audit,
                        groups=groups, captured=cap)


def table_outputs(session: Session, reason: str | None = ALL, source: str | None = ALL, query: str | None = "",
                  step: str | None = None, group: str | None = None, reward: str | None = None) -> list[Any]:
    """[reason_dd, source_dd, table, dist] for the session's current file (or its trace set), with
    the training step, GRPO group and reward filters too (None: all rows; a trace set's view keeps
    its own)."""
    if in_set_mode(session):
        view = set_view(session)
        if step is not None:
            view.step = step
        if group is not None:
            view.group = group.strip()[:GROUP_CHARS]
        if reward is not None:
            view.reward = reward if reward in REWARD_CHOICES else ALL
        return [*set_table(session, reason, source, query), charts.file_distributions([])]
    full = file_listing(session)
    reasons, sources = filter_choices(full)
    rows = session.file_rows if isinstance(session.file_rows, FileRows) else None
    if reason not in reasons:  # verl's code (an API caller) selects its label
        if rows is not None:
            codes = [rows.index.cols["termination_reason"][int(i)] for i in full["#"]]
        else:
            codes = [session.traces[session.file_traces[int(i)]].termination_reason for i in full["#"]]
        by_code = dict(zip(codes, full["termination"]))
        reason = by_code.get(reason, ALL)
    source = source if source in sources else ALL
    step = step if step in rl_choices(session, full)[0] else ALL
    group = (group or "").strip()[:GROUP_CHARS]
    reward = reward if reward in REWARD_CHOICES else ALL
    session.file_filters = FileFilters(reason, source, query, step, group, reward)  # what Export exports when given no rows
    df = filter_frame(full, session.file_traces, session.traces, reason, source, query, rows, step, group, reward)
    if rows is not None:  # from the index: the traces are not held
        cols = rows.index.cols
        at = [int(i) for i in df["#"]]
        dist = charts.distributions([cols["turns"][i] for i in at], [cols["response_tokens"][i] for i in at],
                                    [rows.ends[i] for i in at])
    else:
        dist = charts.file_distributions([session.traces[session.file_traces[int(i)]] for i in df["#"]] if not df.empty else [])
    return [gr.update(choices=reasons, value=reason), gr.update(choices=sources, value=source), df, dist]


def rl_choices(session: Session, full: pd.DataFrame | None = None) -> tuple[list[str], bool, bool]:
    """The upload's training steps (the step filter's choices), whether any trace is in a GRPO
    group and whether any states a reward."""
    full = file_listing(session) if full is None else full
    if full.empty:
        return [ALL], False, False
    rows = session.file_rows if isinstance(session.file_rows, FileRows) else None
    rl = rl_frame(full, session.file_traces, session.traces, rows)
    return step_choices(rl), bool(rl["group"].notna().any()), bool(rl["score"].notna().any())


def rl_filter_updates(session: Session) -> list[Any]:
    """[step_dd, group_tb, reward_dd] for the uploaded file: each usable where its traces carry
    what it filters on (a training step, a group, a reward), else disabled, saying why; set to the
    table's filters. Left as they are in trace-set mode (the set's listing updates them). A usable
    one's info is "" (Gradio keeps the old text on None: a TRL upload still read "state no
    reward" under a working reward filter)."""
    if in_set_mode(session):
        return [gr.skip()] * 3
    steps, grouped, rewarded = rl_choices(session)
    ff = session.file_filters if isinstance(session.file_filters, FileFilters) else FileFilters()
    step, group, reward = ff.step, ff.group, ff.reward
    has_steps = len(steps) > 1
    return [
        gr.update(choices=steps, value=step if step in steps else ALL, interactive=has_steps,
                  info="" if has_steps else "these traces state no training step"),
        gr.update(value=group, interactive=grouped, info="" if grouped else "no traces to group"),
        gr.update(value=reward if reward in REWARD_CHOICES else ALL, interactive=rewarded,
                  info="" if rewarded else "these traces state no reward (metadata.score)"),
    ]


def match_count(session: Session, df: pd.DataFrame | None) -> str:
    """"3 of 7 shown": the rows the filters and search keep, of the file's traces."""
    shown = 0
    if isinstance(df, pd.DataFrame) and "#" in df.columns:
        shown = int(sum(1 for v in df["#"] if str(v).strip() != ""))  # an emptied table may hold one blank row
    if in_set_mode(session) and isinstance(df, pd.DataFrame) and "file" in df.columns:
        return set_count(session, shown)
    return f'<div class="ali-info" data-count="{shown}">{shown} of {len(session.file_traces)} shown</div>'


def audit_key(session: Session) -> str:
    """Changes when the tab shows other traces: another trace set, a new upload."""
    if in_set_mode(session):
        return f"set:{session.set_spec}"
    return f"file:{session.file_name}:{id(session.file_rows)}:{id(session.file_index)}:{len(session.file_traces)}"


def audit_source(session: Session, limit: int | None = None) -> trace_audit.Source:
    """The traces the tab shows, for the re-render audit: the trace set's (in the order of its
    index) or the uploaded file's (the samples), the first ``limit`` (default
    :data:`ui.trace_audit.MAX_TRACES`) as items read one at a time, and how many there are in all.
    Raises TraceFileError when the set cannot be read."""
    limit = trace_audit.MAX_TRACES if limit is None else limit
    Item = trace_audit.Item
    if in_set_mode(session):
        ts, _ = session_set(session)
        df = ts.df
        names = [os.path.basename(f.path or "?") for f in ts.files]
        n = min(len(ts), limit)
        ids, files, lines = df["id"].iloc[:n].tolist(), df["file"].iloc[:n].tolist(), df["line"].iloc[:n].tolist()
        items = [Item(i, str(ids[i]), f"{names[int(files[i])]}:{lines[i]}", lambda i=i: ts.open(i)) for i in range(n)]
        name = os.path.basename(os.path.normpath(session.set_spec or "")) or "the trace set"
        return trace_audit.Source(items, len(ts), name, audit_key(session), is_set=True, limit=limit)
    labels = session.file_traces
    rows = session.file_rows if isinstance(session.file_rows, FileRows) else None
    n = min(len(labels), limit)
    if rows is not None:
        ids = [str(x) for x in rows.index.cols["id"][:n]]
    else:
        ids = [session.traces[x].id if x in session.traces else x for x in labels[:n]]
    items = [Item(i, ids[i], None, lambda i=i: file_trace(session, i)) for i in range(n)]
    return trace_audit.Source(items, len(labels), session.file_name or "the uploaded file", audit_key(session), limit=limit)


def open_audit_row(session: Session, row: dict[str, Any]) -> str:
    """A row of the audit's rollout table (``#``, ``id``, and for a trace set ``file``) as a trace
    of the session, the way the tab's own table opens one: its label. The row's id is checked (the
    tab may show other traces since the audit); raises gr.Error with why it does not open."""
    again = "the tab shows other traces since the audit: audit them again"
    if in_set_mode(session):
        if not str(row.get("file") or ""):
            raise gr.Error(again)
        try:
            return open_set_row(session, row)
        except (KeyError, IndexError, TraceFileError, OSError) as e:
            raise gr.Error(f"{row.get('file')}: {short_error(e)}; {again}") from None
    if row.get("file"):
        raise gr.Error(again)
    try:
        i = int(row["#"])
    except (KeyError, TypeError, ValueError):
        raise gr.Error("no such row") from None
    labels = session.file_traces
    rows = session.file_rows if isinstance(session.file_rows, FileRows) else None
    if not 0 <= i < len(labels):
        raise gr.Error(again)
    now = str(rows.index.cols["id"][i]) if rows is not None else getattr(session.traces.get(labels[i]), "id", None)
    if now != str(row.get("id")):
        raise gr.Error(again)
    try:
        return open_file_row(session, i)
    except READ_ERRORS as e:
        raise gr.Error(f"{session.file_name}: {short_error(e)}") from None


def initial_status(session: Session) -> str:
    import html

    if in_set_mode(session):
        return '<div class="ali-info">Showing the trace set (above); upload a file to show it instead.</div>'
    n = len(session.file_traces)
    return f'<div class="ali-info">{n} trace(s) from {html.escape(session.file_name or "?")}/ are loaded; upload a file to replace them.</div>'



def wire(ctx: AppContext, ui: TraceFilesUI, session: gr.State, open_in_inspector) -> None:
    """Events. ``open_in_inspector(session, label)`` returns the Inspector's outputs and the tab switch;
    it is given as (fn, outputs)."""
    fn_open, open_outputs = open_in_inspector
    su = ui.set_ui

    def on_upload(sess: Session, path: str | None, fmt: str = AUTO, tokenizer: str | None = None):
        if not path:  # a format/tokenizer change with no file: nothing to (re)load
            return [sess, gr.update(), gr.update(), *table_outputs(sess)]
        sess.set_spec = None  # the file is shown instead of the trace set
        shown = load_file(ctx, sess, path, fmt or AUTO, tokenizer)
        if shown is None:  # superseded: the newer event fills the tab
            return [sess, *(gr.update() for _ in up_out[1:])]
        status, probs = shown
        return [sess, status, probs, *table_outputs(sess)]

    def on_filter(sess: Session, reason: str = ALL, source: str = ALL, query: str = "", step: str = ALL, group: str = "",
                  reward: str = ALL):
        return table_outputs(sess, reason, source, query, step or ALL, group or "", reward or ALL)

    def on_select(sess: Session, df: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if df is None or row is None or row >= len(df):
            raise gr.Error("no such row")
        if in_set_mode(sess) and "file" in df.columns:
            return fn_open(sess, open_set_row(sess, df.iloc[row]))
        try:
            label = open_file_row(sess, int(df.iloc[row]["#"]))
        except READ_ERRORS as e:  # the record's reason, as a message
            raise gr.Error(f"{sess.file_name}: {short_error(e)}") from None
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
    filt_in = [session, ui.reason_dd, ui.source_dd, ui.search, ui.step_dd, ui.group_tb, ui.reward_dd]
    # API name, kept stable: /trace_files_filter (reason, source, search, step, group, reward; each
    # optional: all rows) -> the two filters, the table, the plot: the session's upload (or its trace
    # set) filtered as the tab's filters filter it. The page's own filter events are private.
    ui.filter_api.click(on_filter, filt_in, filt_out, api_name="trace_files_filter")
    if su is None:
        for comp in (ui.reason_dd, ui.source_dd, ui.step_dd, ui.reward_dd):
            comp.input(on_filter, filt_in, filt_out, api_visibility="private")
        ui.group_tb.submit(on_filter, filt_in, filt_out, api_visibility="private")
        ui.group_tb.blur(on_filter, filt_in, filt_out, api_visibility="private")
        ui.search.submit(on_filter, filt_in, filt_out, api_visibility="private")
        ui.search.change(on_filter, filt_in, filt_out, trigger_mode="always_last", api_visibility="private")
    else:
        if getattr(ctx.trace_sets, "import_bundle", False) is None:  # verl rollout-dump rows open with
            ctx.trace_sets.import_bundle = lambda: _import_bundle(ctx, None)  # the upload's default tokenizer
        wire_set(ctx, ui, su, session, on_filter, initial_status)
    # a row click carries the browser's selection (gr.SelectData), which an API call cannot send:
    # not an API endpoint (/inspector_open opens a trace by its label)
    ui.table.select(on_select, [session, ui.table], open_outputs, api_visibility="private")
    if ui.count is not None:
        # whatever filled the table (page load, upload, filters, search) also sets the count, so
        # no handler's outputs (and no API output list) change for it
        ui.table.change(match_count, [session, ui.table], [ui.count], queue=False, api_visibility="private")
    # and the upload's step, group and reward filters: usable where its traces carry those
    ui.table.change(rl_filter_updates, [session], [ui.step_dd, ui.group_tb, ui.reward_dd], queue=False,
                    api_visibility="private")
    # ---- charts by training step (ui/run_charts.py): redrawn when the table's trace set changes ----
    if ui.run is not None:
        run_charts.wire(ui.run, session, [ui.table])
    # ---- the GRPO group view (ui/grpo_groups.py): regrouped when the table's traces change ----
    if ui.groups is not None:
        grpo_groups.wire(ctx, ui.groups, session, audit_source, audit_key, ui.table)
    # ---- the capture gateway's sessions (ui/captured.py): a branch opens in the Inspector ----
    if ui.captured is not None:
        captured.wire(ctx, ui.captured, session, fn_open, open_outputs)
    # ---- the re-render audit (ui/trace_audit.py): its rows open in the Inspector as the table's do ----
    if ui.audit is not None:
        trace_audit.wire(ctx, ui.audit, session, audit_source, audit_key,
                         lambda sess, row: fn_open(sess, open_audit_row(sess, row)), open_outputs, ui.table)
    # ----

    def on_export(sess: Session, df: pd.DataFrame | None = None, fmt: str = "jsonl"):
        # the table's rows; none (the API's default table): what the session's table lists now
        no_rows = df is None or df.empty
        path = export_set(sess, fmt) if in_set_mode(sess) and (no_rows or "file" in df.columns) else export_filtered(sess, df, fmt)
        return gr.update(value=path, visible=True)

    ui.export_btn.click(on_export, [session, ui.table, ui.export_fmt], [ui.export_file])
