"""The Trace files tab over a trace set: a folder or glob of JSONL / Parquet files (``--traces`` /
``ALI_TRACES``, or in local mode the folder field). The table pages and filters over the set's
index (:class:`backend.trace.catalog.TraceSet`, shared by the sessions through the app's
``SetRegistry``), never over traces in memory; a row is read by its bytes when opened, a timer
follows the files while they are written, and the filtered rows export.

``ui/trace_files.py`` builds the tab (the upload mode) and wires this mode into it
(:func:`build_set`, :func:`wire_set`); what both modes' filters share is here: :data:`ALL`,
:data:`SEARCH_CHARS`, :data:`PREVIEW_CHARS`, :func:`shorten`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.trace import TraceFileError
from ui import charts
from ui.context import AppContext, Session, short_error

ALL = "(all)"  # the filters' choice that keeps every row
PREVIEW_CHARS = 80
SEARCH_CHARS = 200  # a search string is data: bounded, matched literally


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class SetUI:
    """The set's controls (:func:`build_set`), with the step filter and page the tab puts beside
    its other filters, and the follow timer."""

    folder: gr.Textbox | None  # local mode only: a visitor never names a path in public mode
    show_btn: gr.Button
    follow: gr.Checkbox
    newest: gr.Checkbox
    status: gr.HTML
    step_dd: gr.Dropdown
    page: gr.Number
    timer: gr.Timer
    group_tb: gr.Textbox | None = None  # the GRPO group filter: a group id (or a group view key, step/id)
    reward_dd: gr.Dropdown | None = None  # the reward filter (REWARD_CHOICES)


# ---- trace sets: the table over an index (backend/trace/catalog.py), never over traces in memory

# "#": the row in the set's index; "file": its file and line (or row)
SET_COLUMNS = ["#", "step", "id", "source", "turns", "tokens", "termination", "errors", "preview", "file"]
PAGE_ROWS = 100


@dataclass
class SetView:
    """What a session's set table shows."""

    reason: str = ALL
    source: str = ALL
    step: str = ALL
    query: str = ""
    group: str = ""
    reward: str = ALL
    page: int = 1
    newest: bool = True
    version: int = -1  # the set's version last listed (the timer lists again when it changes)


def in_set_mode(session: Session) -> bool:
    return bool(session.set_spec) and session.set_registry is not None


def session_set(session: Session, poll: bool = False) -> tuple[Any, int]:
    """The session's set and its version (refreshed first with ``poll``); raises TraceFileError."""
    reg = session.set_registry
    return reg.poll(session.set_spec) if poll else reg.get(session.set_spec)


def set_view(session: Session) -> SetView:
    if not isinstance(session.set_view, SetView):
        session.set_view = SetView()
    return session.set_view


# the reward filter: the index's ``score`` (the total reward as the file states it)
REWARD_CHOICES = [ALL, "reward > 0", "reward = 0", "reward < 0", "no reward"]
GROUP_CHARS = 500  # a group filter typed by a visitor: only ever compared


def set_matches(df: pd.DataFrame, reason: str | None, source: str | None, step: str | None, query: str | None,
                group: str | None = None, reward: str | None = None) -> pd.DataFrame:
    """The index rows the filters keep: termination (its label or verl's code), source, training
    step, a literal, case-insensitive search of the id and the preview, the GRPO group (its id as
    the index's ``group`` column holds it, or the group view's key ``<step>/<id>``) and the reward
    (:data:`REWARD_CHOICES`, on ``score``)."""
    keep = rl_keep(df, step, group, reward)
    if reason and reason != ALL:
        codes = df["termination_reason"].fillna("")
        labels = codes.map(_label_of)
        keep &= (labels == reason) | (codes == reason)
    if source and source != ALL:
        keep &= df["source"].fillna("?") == source
    q = (query or "").strip().lower()[:SEARCH_CHARS]
    if q:
        hay = df["id"].astype(str).str.lower().str.contains(q, regex=False) | df["preview"].fillna("").str.lower().str.contains(q, regex=False)
        keep &= hay
    return df[keep]


def rl_keep(df: pd.DataFrame, step: str | None, group: str | None, reward: str | None) -> pd.Series:
    """The rows of an index frame (its ``training_step``, ``group`` and ``score`` columns) the
    training step, GRPO group and reward filters keep: the step (a number, or :data:`NO_STEP`),
    the group (its id as ``group`` holds it, or the group view's key ``<step>/<id>``; bounded to
    :data:`GROUP_CHARS`, only ever compared) and the reward (:data:`REWARD_CHOICES`, on ``score``).
    The trace set's filters (:func:`set_matches`) and the upload's (``ui.trace_files.filter_frame``)."""
    keep = pd.Series(True, index=df.index)
    g = (group or "").strip()[:GROUP_CHARS]
    if g:
        ids = df["group"].astype(object)
        keys = [f"{int(st)}/{gid}" if not pd.isna(st) else gid for st, gid in zip(df["training_step"], ids)]
        keep &= (ids == g) | (pd.Series(keys, index=df.index) == g)
    if reward and reward != ALL:
        score = df["score"]
        keep &= {"reward > 0": score > 0, "reward = 0": score == 0, "reward < 0": score < 0}.get(reward, score.isna())
    if step and step != ALL:
        try:
            keep &= df["training_step"] == int(step)
        except ValueError:
            keep &= df["training_step"].isna() if step == NO_STEP else False
    return keep.fillna(False).astype(bool)


def step_choices(df: pd.DataFrame) -> list[str]:
    """The training step filter's choices of an index frame: every step, and :data:`NO_STEP` when
    some rows have one and some none."""
    steps = [str(int(x)) for x in sorted(df["training_step"].dropna().unique())]
    if df["training_step"].isna().any() and steps:
        steps.append(NO_STEP)
    return [ALL, *steps]


NO_STEP = "(no step)"
_LABELS: dict[str, str] = {}


def _label_of(code: str) -> str:
    from backend.checks.labels import termination_label

    if code not in _LABELS:
        _LABELS[code] = termination_label(code or None) if code else "no end state"
    return _LABELS[code]


def set_choices(df: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The filters' choices: termination labels, sources, training steps."""
    reasons = sorted({_label_of(c) for c in df["termination_reason"].fillna("").unique()})
    sources = sorted(set(df["source"].fillna("?").unique()))
    return [ALL, *reasons], [ALL, *sources], step_choices(df)


def view_matches(df: pd.DataFrame, view: SetView) -> pd.DataFrame:
    """:func:`set_matches` with the view's filters."""
    return set_matches(df, view.reason, view.source, view.step, view.query, view.group, view.reward)


def set_page(ts: Any, view: SetView) -> tuple[pd.DataFrame, int, int]:
    """``(the page's rows as SET_COLUMNS, rows matching, pages)``."""
    df = ts.df
    m = view_matches(df, view)
    total = len(m)
    pages = max(1, -(-total // PAGE_ROWS))
    view.page = min(max(1, int(view.page or 1)), pages)
    if view.newest:
        m = m.iloc[::-1]
    part = m.iloc[(view.page - 1) * PAGE_ROWS: view.page * PAGE_ROWS]
    names = [os.path.basename(f.path or "?") for f in ts.files]
    out = pd.DataFrame({
        "#": part.index.to_numpy(),
        "step": [("" if pd.isna(x) else int(x)) for x in part["training_step"]],
        "id": part["id"].to_numpy(), "source": part["source"].fillna("?").to_numpy(), "turns": part["turns"].to_numpy(),
        "tokens": part["tokens"].to_numpy(), "termination": [_label_of(c or "") for c in part["termination_reason"]],
        "errors": part["errors"].to_numpy(), "preview": [shorten(p or "", PREVIEW_CHARS) for p in part["preview"]],
        "file": [f"{names[f]}:{n}" for f, n in zip(part["file"], part["line"])],
    }, columns=SET_COLUMNS)
    return out, total, pages


def set_status(session: Session, ts: Any) -> str:
    import html

    from backend.trace import human_bytes

    err = session.set_registry.error(session.set_spec) if session.set_registry else None
    name = os.path.basename(os.path.normpath(session.set_spec or "")) or "?"
    msg = (f"<b>{html.escape(name)}</b>: {len(ts):,} trace(s) indexed in {len(ts.files):,} file(s) "
           f"({human_bytes(ts.bytes)})")
    if ts.pending_lines:
        msg += f", {ts.pending_lines} line(s) being written"
    n = ts.problem_count + len(ts.file_errors)
    if n:
        msg += f", <b>{n:,} bad record(s)</b> (listed below with their file and line)"
    if ts.capped:
        msg += f"; {html.escape(ts.capped)}"
    if err:
        if session.set_registry is not None and session.set_spec:
            err = err.replace(os.path.expanduser(session.set_spec), name)  # the operator's path is not shown
        msg += f'; <span class="ali-err">{html.escape(err)}</span>'
    return f'<div class="{"ali-warn" if n or err else "ali-ok"}" data-rows="{len(ts)}">{msg}</div>'


def set_problems(ts: Any) -> pd.DataFrame:
    rows = [{"line": f"{os.path.basename(f)}:{ln}" if ln else os.path.basename(f), "problem": why} for f, ln, why in ts.problem_rows(1000)]
    return pd.DataFrame(rows, columns=["line", "problem"])


def set_outputs(session: Session, poll: bool = False) -> list[Any]:
    """[reason_dd, source_dd, step_dd, table, page, status, problems] of the session's set."""
    import html

    view = set_view(session)
    try:
        ts, version = session_set(session, poll)
    except Exception as e:  # noqa: BLE001 - shown to the user
        msg = f'<div class="ali-err">Could not index {html.escape(str(session.set_spec))}: {html.escape(short_error(e))}</div>'
        empty = pd.DataFrame([], columns=SET_COLUMNS)
        return [gr.update(), gr.update(), gr.update(), empty, gr.update(), msg, gr.update()]
    view.version = version
    reasons, sources, steps = set_choices(ts.df)
    if view.reason not in reasons and _label_of(view.reason) in reasons:  # verl's code (an API caller) selects its label
        view.reason = _label_of(view.reason)
    for attr, choices in (("reason", reasons), ("source", sources), ("step", steps)):
        if getattr(view, attr) not in choices:
            setattr(view, attr, ALL)
    table, total, pages = set_page(ts, view)
    return [gr.update(choices=reasons, value=view.reason), gr.update(choices=sources, value=view.source),
            gr.update(choices=steps, value=view.step), table, gr.update(value=view.page, maximum=pages),
            set_status(session, ts), set_problems(ts)]


def export_set(session: Session, fmt: str, limit: int = 10_000) -> str:
    """The traces the set's filters keep (each read by its bytes), as one file; at most ``limit``."""
    from backend.exporters.export import export_traces

    view = set_view(session)
    ts, _ = session_set(session)
    m = view_matches(ts.df, view)
    if len(m) == 0:
        raise gr.Error("nothing to export: no trace matches the filters")
    if len(m) > limit:
        raise gr.Error(f"{len(m):,} traces match; narrow the filters to at most {limit:,} to export them from here")
    traces = (ts.open(int(i)) for i in m.index)  # one at a time
    d = session.temp_dir("export")
    out = os.path.join(d, f"traces-filtered.{'parquet' if fmt == 'parquet' else 'otlp.jsonl' if fmt == 'otel' else 'jsonl'}")
    export_traces(traces, fmt, out)
    return out


def build_set(ctx: AppContext) -> dict[str, Any] | None:
    """The trace set's controls: in local mode a folder field; in public mode only the operator's
    set (``--traces``), never a path a visitor names. None when there is nothing to show."""
    public = ctx.trust.public
    if public and not ctx.traces:
        return None
    with gr.Accordion("Trace set: a folder or glob of JSONL / Parquet files, followed while written", open=bool(ctx.traces),
                      elem_id="tf-set"):
        with gr.Row():
            folder = None
            if not public:
                folder = gr.Textbox(label="Folder or glob", value=ctx.traces or "", elem_id="tf-folder", scale=3,
                                    placeholder="runs/exp1/rollout_data  or  runs/*/rollout/*.jsonl",
                                    info="indexed on this machine (cached; only new bytes are read again)")
            show_btn = gr.Button("Index and show" if not public else "Show the run's traces", elem_id="tf-set-show", scale=1)
            with gr.Column(scale=1, min_width=160):
                follow = gr.Checkbox(True, label="Follow (new lines appear as they are written)", elem_id="tf-follow")
                newest = gr.Checkbox(True, label="Newest first", elem_id="tf-newest")
        status = gr.HTML(elem_id="tf-set-status")
    return {"folder": folder, "show_btn": show_btn, "follow": follow, "newest": newest, "status": status}


def set_table(session: Session, reason: str | None, source: str | None, query: str | None) -> list[Any]:
    """[reason_dd, source_dd, table] of the session's set with these filters (the upload mode's
    filter handler, when the set is shown)."""
    view = set_view(session)
    view.reason, view.source, view.query = reason or ALL, source or ALL, query or ""
    out = set_outputs(session)
    view.version = -1  # the status, step filter and bad records are not among these outputs: the next tick lists them
    return [out[0], out[1], out[3]]


def set_count(session: Session, shown: int) -> str:
    """"rows 1–100 of 2,345 matching": the count line of the set's table, ``shown`` rows on the page."""
    try:
        ts, _ = session_set(session)
    except Exception:  # noqa: BLE001 - the status line says why
        return f'<div class="ali-info" data-count="{shown}">{shown} shown</div>'
    view = set_view(session)
    total = len(view_matches(ts.df, view))
    first = (view.page - 1) * PAGE_ROWS + 1 if shown else 0
    return (f'<div class="ali-info" data-count="{shown}" data-matching="{total}">rows {first:,}–{first + shown - 1 if shown else 0:,} '
            f'of {total:,} matching ({len(ts):,} indexed; page {view.page})</div>')


def open_set_row(sess: Session, row: Any) -> str:
    """Read one row of the session's set by its bytes into the session; its label. The row's id
    is checked against the index (a rebuilt index may have moved rows: the id then finds it)."""
    ts, _ = session_set(sess)
    i = int(row["#"])
    if i >= len(ts) or ts.df["id"].iat[i] != row["id"]:
        i = ts.row_of(str(row["id"]))
    try:
        t = ts.open(i)
    except Exception as e:  # noqa: BLE001 - a bad record: its reason, as a message
        raise gr.Error(f"{row['file']}: {short_error(e)}") from None
    return sess.add(f"set · {row['file']} · {t.id}", t)


def wire_set(ctx: AppContext, ui: Any, su: SetUI, session: gr.State, on_filter, status) -> None:
    """The trace set's events: show it, filters and pages over its index, the follow timer. ``ui``
    is the tab's :class:`ui.trace_files.TraceFilesUI` (its filters, table, plot, status line and
    bad records are this mode's too); ``on_filter(session, reason, source, query)`` lists the
    uploaded file when that is shown instead; ``status(session)`` is the tab's status line."""
    set_out = [ui.reason_dd, ui.source_dd, su.step_dd, ui.table, su.page, su.status, ui.problems]
    all_out = [*set_out, ui.dist, ui.status]
    filters = [session, ui.reason_dd, ui.source_dd, ui.search, su.step_dd, su.page, su.newest,
               *(c for c in (su.group_tb, su.reward_dd) if c is not None)]

    def listed(sess: Session, poll: bool = False) -> list[Any]:
        return [*set_outputs(sess, poll), charts.file_distributions([]), status(sess)]

    def on_show(sess: Session, folder: str | None = None):
        import html

        from backend.trace.catalog import resolve

        if ctx.trust.public or su.folder is None:
            spec = ctx.traces  # never a path from a visitor
        else:
            spec = (folder or "").strip()[:4096] or ctx.traces
        if not spec:
            return [sess, *[gr.update()] * 5, '<div class="ali-err">Type a folder or a glob first.</div>', *[gr.update()] * 4]
        try:
            resolve(spec)
        except (TraceFileError, OSError) as e:
            return [sess, *[gr.update()] * 5, f'<div class="ali-err">{html.escape(short_error(e))}</div>', *[gr.update()] * 4]
        sess.set_spec = spec
        sess.set_view = SetView()
        return [sess, *listed(sess), gr.Timer(active=True)]

    def on_set_filter(sess: Session, reason: str, source: str, query: str, step: str, page: Any, newest: bool,
                      group: str | None = "", reward: str | None = ALL):
        if not in_set_mode(sess):  # the uploaded file is shown
            r, so, table, dist = on_filter(sess, reason, source, query, step, group, reward)
            return [r, so, gr.update(), table, *[gr.update()] * 3, dist, gr.update()]
        view = set_view(sess)
        now = (reason or ALL, source or ALL, (query or "")[:SEARCH_CHARS], step or ALL, (group or "").strip()[:GROUP_CHARS],
               reward if reward in REWARD_CHOICES else ALL)
        changed = (view.reason, view.source, view.query, view.step, view.group, view.reward) != now
        view.reason, view.source, view.query, view.step, view.group, view.reward = now
        view.newest = bool(newest)
        try:
            view.page = 1 if changed else max(1, int(page or 1))
        except (TypeError, ValueError):
            view.page = 1
        return listed(sess)

    def on_tick(sess: Session, follow: bool):
        if not follow or not in_set_mode(sess):
            return [gr.skip()] * len(all_out)
        reg = sess.set_registry
        _, version = reg.poll(sess.set_spec)
        if version == set_view(sess).version:
            return [gr.skip()] * len(all_out)
        return listed(sess)

    show_in = [session] + ([su.folder] if su.folder is not None else [])
    su.show_btn.click(on_show, show_in, [session, *all_out, su.timer], api_visibility="private")
    if su.folder is not None:
        su.folder.submit(on_show, show_in, [session, *all_out, su.timer], api_visibility="private")
    for comp in (ui.reason_dd, ui.source_dd, su.step_dd, su.reward_dd):
        if comp is not None:
            comp.input(on_set_filter, filters, all_out, api_visibility="private")
    if su.group_tb is not None:
        su.group_tb.submit(on_set_filter, filters, all_out, api_visibility="private")
        su.group_tb.blur(on_set_filter, filters, all_out, api_visibility="private")
    ui.search.submit(on_set_filter, filters, all_out, api_visibility="private")
    ui.search.change(on_set_filter, filters, all_out, trigger_mode="always_last", api_visibility="private")
    su.page.submit(on_set_filter, filters, all_out, api_visibility="private")
    su.page.input(on_set_filter, filters, all_out, trigger_mode="always_last", api_visibility="private")
    su.newest.input(on_set_filter, filters, all_out, api_visibility="private")
    su.timer.tick(on_tick, [session, su.follow], all_out, api_visibility="private", queue=False, show_progress="hidden")
