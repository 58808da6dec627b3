"""The Trace files tab's re-render audit (:mod:`backend.checks.audit`): would a full re-render of each
loaded trace's final messages (what many trainers do to build a training sample) give the ids the
model was shown, and if not, why.

"Audit these traces" audits what the tab shows (the uploaded file's traces, or the trace set's),
at most :data:`MAX_TRACES` of them and for at most :data:`TIME_BUDGET_S` seconds; the rest is
counted as skipped, and said so. Each trace is re-rendered with the tokenizer the Inspector would
decode it with (:meth:`ui.context.AppContext.trace_bundle`: an offline profile, the model's own,
in local mode a local folder; never a hub id or path a file names, and the trace's own template
when it carries one). The view: the summary sentence, a table and a bar chart by cause, a table by
assistant turn, and one row per rollout (breaks yes / no / not audited, its causes or why it was
not audited, the first break's token position) that opens the trace in the Inspector.

Text that comes from traces (ids, tokenizer names in a reason) goes into HTML escaped, into the
tables as cell text, and into the chart through :func:`ui.charts.plot_text`.

:mod:`ui.trace_files` says which traces the tab shows (:class:`Item` rows) and opens a row; this
module builds, computes and wires the view.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from backend.trace import Trace
from ui.charts import LAYOUT, empty_figure, plot_text
from ui.context import AppContext, short_error
from ui.theme import CHART

MAX_TRACES = 2_000  # traces one click audits (the first ones of the tab's file or set)
TIME_BUDGET_S = 60.0  # and for at most this long: the rest is skipped, and said so
CONCURRENCY = 2  # audits running at once, over all visitors (each one works in a thread of its own)
NOTED = 5  # traces not audited named in the summary (all are in the rollout table)

CAUSE_COLUMNS = ["cause", "rollouts"]
TURN_COLUMNS = ["turn", "cause", "places"]
ROLLOUT_COLUMNS = ["#", "id", "breaks", "causes", "first break", "at turn"]
SET_ROLLOUT_COLUMNS = [*ROLLOUT_COLUMNS, "file"]  # a trace set's rows also name their file and line
YES, NO, NOT_AUDITED = "yes", "no", "not audited"
WIDTHS = {len(ROLLOUT_COLUMNS): ["5%", "25%", "9%", "41%", "10%", "10%"],
          len(SET_ROLLOUT_COLUMNS): ["5%", "19%", "8%", "36%", "9%", "8%", "15%"]}


@dataclass
class Item:
    """One trace the tab shows: its row (``#``: the row of the uploaded file, or of the trace set's
    index), its id, where it is (a trace set's ``file:line``; None for an upload) and how to read it."""

    row: int
    id: str
    file: str | None
    open: Callable[[], Trace]


@dataclass
class Source:
    """What the tab shows: the first :data:`MAX_TRACES` items, how many there are in all, and the
    name of the file or set (for the summary)."""

    items: list[Item]
    total: int
    name: str
    key: str  # changes when the tab shows other traces (a new upload, another set)
    is_set: bool = False
    limit: int = MAX_TRACES  # what ``items`` was cut to


@dataclass
class AuditUI:
    section: Any
    button: Any
    summary: Any
    chart: Any
    causes: Any
    turns: Any
    rollouts: Any
    key: Any  # gr.State: the Source.key of the traces audited ("" none yet)

    def outputs(self) -> list[Any]:
        return [self.summary, self.chart, self.causes, self.turns, self.rollouts, self.key]


# ---- the audit ---------------------------------------------------------------------------------------


def bundle_finder(ctx: AppContext) -> Callable[[Trace], Any]:
    """A trace's tokenizer bundle, as the Inspector gets it (:meth:`AppContext.trace_bundle`), or
    why there is none (a string, :func:`backend.checks.audit.audit`'s way). One lookup per tokenizer name
    and template digest of an audit."""
    cache: dict[tuple[str, str | None], Any] = {}

    def find(t: Trace) -> Any:
        key = (t.tokenizer.name or "", t.tokenizer.template_sha256)
        if key not in cache:
            bundle, note = ctx.trace_bundle(t)
            # the Inspector's note goes on "showing token ids only": here, nothing is audited
            cache[key] = bundle if bundle is not None else note.split(': showing token ids only')[0]
        return cache[key]

    return find


def run_audit(ctx: AppContext, items: Iterable[Item], *, budget_s: float = TIME_BUDGET_S,
              progress: Callable[[int], None] | None = None) -> tuple[Any, list[Item], int]:
    """Audit ``items`` one at a time (:func:`backend.checks.audit.audit`, with :func:`bundle_finder`'s
    bundles): ``(AuditReport, the items audited, in report order, how many were skipped past the
    time budget)``. A trace that cannot be read, or whose audit fails, is in the report with why
    (its ``error``), never dropped."""
    from backend.checks.audit import AuditReport, TraceAudit, audit

    rep = AuditReport()
    done: list[Item] = []
    items = list(items)
    find = bundle_finder(ctx)
    t0 = time.monotonic()
    for k, it in enumerate(items):
        if k and time.monotonic() - t0 > budget_s:  # the first is always audited
            return rep, done, len(items) - k
        if progress is not None:
            progress(k)
        try:
            t = it.open()
        except Exception as e:  # noqa: BLE001 - a bad record: listed with why
            rep.traces.append(TraceAudit(id=it.id, error=f"could not read it ({short_error(e)})"))
        else:
            try:
                rep.traces.extend(audit([t], find).traces)
            except Exception as e:  # noqa: BLE001 - one trace's failure must not lose the others
                rep.traces.append(TraceAudit(id=t.id, loop_tokens=len(t.input_ids), error=f"the audit failed ({short_error(e)})"))
        done.append(it)
    return rep, done, 0


# ---- the view ----------------------------------------------------------------------------------------


def _label(cause: str) -> str:
    from backend.checks.audit import CAUSE_LABELS

    return CAUSE_LABELS.get(cause, cause)


def _short(cause: str) -> str:
    """A cause in words without its parenthesis (the chart's axis, a rollout's cell)."""
    return _label(cause).split(" (")[0]


def _turn(k: int) -> str:
    return "prompt" if k == 0 else str(k)


def cause_table(rep: Any) -> pd.DataFrame:
    """cause (in words) → rollouts that have it, most first (:meth:`AuditReport.by_cause`)."""
    return pd.DataFrame([{"cause": _label(c), "rollouts": n} for c, n in rep.by_cause().items()], columns=CAUSE_COLUMNS)


def turn_table(rep: Any) -> pd.DataFrame:
    """One row per assistant turn and cause (``prompt``: before the first assistant turn): the
    places where a re-render differs (:meth:`AuditReport.by_turn`)."""
    rows = [{"turn": _turn(k), "cause": _label(c), "places": n}
            for k, by in rep.by_turn().items() for c, n in sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))]
    return pd.DataFrame(rows, columns=TURN_COLUMNS)


def _causes_text(a: Any) -> str:
    if a.error and not a.differences:
        return a.error
    return ", ".join(f"{_short(c)} ×{n}" for c, n in a.causes.items()) or "identical"


def rollout_table(rep: Any, items: list[Item], is_set: bool = False) -> pd.DataFrame:
    """One row per trace audited (or not: ``breaks`` says "not audited" and ``causes`` why): its
    row in the tab (``#``), id, whether it breaks, its causes (places each), the first break's
    token position and the assistant turn it falls in; a trace set's rows also their file and line."""
    rows = []
    for a, it in zip(rep.traces, items):
        audited = a.error is None or a.broken
        first = a.differences[0].position if a.differences else ""
        row = {"#": it.row, "id": it.id, "breaks": (YES if a.broken else NO) if audited else NOT_AUDITED,
               "causes": _causes_text(a), "first break": first, "at turn": _turn(a.turns[0]) if a.turns else ""}
        if is_set:
            row["file"] = it.file or ""
        rows.append(row)
    return pd.DataFrame(rows, columns=SET_ROLLOUT_COLUMNS if is_set else ROLLOUT_COLUMNS)


def cause_figure(rep: Any) -> go.Figure:
    """Horizontal bars: rollouts that break, by cause (a rollout counts once under each of its causes)."""
    title = "Rollouts that break, by cause"
    by = rep.by_cause()
    if not by:
        return empty_figure(title, "no rollout breaks" if rep.audited else "nothing was audited")
    names = list(by)[::-1]  # the most common on top
    labels = [plot_text(_short(c) if len(_short(c)) <= 60 else _short(c)[:59] + "…") for c in names]
    fig = go.Figure()
    fig.add_bar(y=labels, x=[by[c] for c in names], orientation="h", marker_color=CHART["injected"], name="rollouts",
                hovertext=[plot_text(_label(c)) for c in names], hoverinfo="text+x")
    layout = {**LAYOUT, "height": 120 + 36 * len(names), "margin": dict(l=10, r=10, t=40, b=40)}
    fig.update_layout(title=title, xaxis_title="rollouts", showlegend=False, **layout)
    fig.update_yaxes(automargin=True)
    fig.update_xaxes(rangemode="tozero", dtick=1 if max(by.values()) <= 10 else None)
    return fig


def summary_html(rep: Any, src: Source, skipped_time: int = 0, budget_s: float = TIME_BUDGET_S) -> str:
    """The summary sentence (:meth:`AuditReport.sentence`), what was audited of what the tab shows,
    and the traces not audited with why (the first :data:`NOTED`; all are in the rollout table)."""
    e = html.escape
    cls = "ali-warn" if rep.broken else "ali-ok"
    out = [f'<div class="{cls}" data-audited="{len(rep.audited)}" data-broken="{len(rep.broken)}">{e(rep.sentence())}.</div>']
    n = len(rep.traces)
    what = f"{n:,} trace(s) of {e(src.name)}"
    if n < src.total:
        what += f" (the first {n:,} of {src.total:,}"
        parts = []
        if skipped_time:
            parts.append(f"{skipped_time:,} skipped when the audit reached its {budget_s:g} s limit")
        past = src.total - n - skipped_time
        if past:
            parts.append(f"{past:,} past the limit of {src.limit:,} traces per audit")
        what += ": " + " and ".join(parts) + ")"
    out.append(f'<div class="ali-info">Audited {what}, each re-rendered with the tokenizer the Inspector decodes it with.</div>')
    missing = [a for a in rep.traces if a.error is not None and not a.broken]
    if missing:
        listed = "; ".join(f"<code>{e(a.id)}</code>: {e(a.error)}" for a in missing[:NOTED])
        more = f"; and {len(missing) - NOTED:,} more" if len(missing) > NOTED else ""
        out.append(f'<div class="ali-note" data-not-audited="{len(missing)}">{len(missing):,} trace(s) not audited (marked in the '
                   f'table below): {listed}{more}</div>')
    return "".join(out)


def empty_outputs(note: str = "", kind: str = "info") -> list[Any]:
    """[summary, chart, causes, turns, rollouts] before an audit (or after a failed one)."""
    return [f'<div class="ali-{kind}">{html.escape(note)}</div>' if note else "",
            empty_figure("Rollouts that break, by cause", "not audited yet" if kind == "info" else ""),
            pd.DataFrame([], columns=CAUSE_COLUMNS), pd.DataFrame([], columns=TURN_COLUMNS),
            pd.DataFrame([], columns=ROLLOUT_COLUMNS)]


def audit_view(ctx: AppContext, src: Source, *, budget_s: float = TIME_BUDGET_S,
               progress: Callable[[int], None] | None = None) -> list[Any]:
    """[summary html, figure, by-cause table, by-turn table, rollout table] of ``src`` audited;
    a failure is a message, never a traceback."""
    if not src.items:
        return empty_outputs("No traces are loaded in this tab: upload a file (or show a trace set) first.", "warn")
    try:
        rep, done, skipped = run_audit(ctx, src.items, budget_s=budget_s, progress=progress)
        return [summary_html(rep, src, skipped, budget_s), cause_figure(rep), cause_table(rep), turn_table(rep),
                rollout_table(rep, done, src.is_set)]
    except Exception as e:  # noqa: BLE001 - shown to the user
        return empty_outputs(f"The audit failed: {short_error(e)}", "err")


# ---- layout and events -------------------------------------------------------------------------------


def build() -> AuditUI:
    with gr.Accordion("Re-render audit: would a trainer's full re-render of these traces give the ids the model was shown?",
                      open=False, elem_id="ta-section") as section:
        gr.Markdown("Many RL trainers build a training sample by rendering a rollout's final messages again. Each "
                    "trace loaded here (the uploaded file, or the trace set; at most "
                    f"{MAX_TRACES:,}) is re-rendered with its tokenizer and template and compared with the ids the "
                    "model was shown; every difference is named by cause and by the assistant turn it falls in "
                    "(on the command line: `python -m backend audit FILE_OR_SET`). Click a rollout to inspect it.")
        button = gr.Button("Audit these traces", elem_id="ta-run", variant="secondary")
        first = empty_outputs()
        summary = gr.HTML(first[0], elem_id="ta-summary")
        chart = gr.Plot(first[1], show_label=False, elem_id="ta-chart")
        with gr.Row():
            causes = gr.Dataframe(headers=CAUSE_COLUMNS, value=first[2], interactive=False, label="By cause (rollouts)",
                                  elem_id="ta-causes", max_height=300, wrap=True, column_widths=["80%", "20%"])
            turns = gr.Dataframe(headers=TURN_COLUMNS, value=first[3], interactive=False,
                                 label="By assistant turn (places that differ)", elem_id="ta-turns", max_height=300, wrap=True,
                                 column_widths=["15%", "65%", "20%"])
        rollouts = gr.Dataframe(headers=ROLLOUT_COLUMNS, value=first[4], interactive=False,
                                label="Rollouts (click a row to inspect)", elem_id="ta-rollouts", max_height=420, wrap=True,
                                column_widths=WIDTHS[len(ROLLOUT_COLUMNS)])
        key = gr.State("")
    return AuditUI(section, button, summary, chart, causes, turns, rollouts, key)


def _sized(outputs: list[Any]) -> list[Any]:
    """The view's outputs with the rollout table's column widths for its columns (a trace set's
    rows also name their file)."""
    *views, rollouts = outputs
    return [*views, gr.update(value=rollouts, column_widths=WIDTHS[len(rollouts.columns)])]


def wire(ctx: AppContext, ui: AuditUI, session: Any, source: Callable[[Any], Source], key_of: Callable[[Any], str],
         open_row: Callable[[Any, dict], Any], open_outputs: list[Any], table: Any) -> None:
    """Events. ``source(session)``: what the tab shows now (:class:`Source`), ``key_of(session)``
    its key alone (cheap); ``open_row(session, row)``: a row of the rollout table (its columns by
    name) opened in the Inspector (the tab's own row-open outputs, ``open_outputs``); ``table``:
    the tab's trace table, whose changes tell when the tab shows other traces (the audit shown is
    then cleared)."""

    def on_audit(sess: Any, progress=gr.Progress()):  # noqa: B008 - gradio's way of asking for progress
        try:
            src = source(sess)
        except Exception as e:  # noqa: BLE001 - a set that cannot be read: a message
            return [*_sized(empty_outputs(f"Could not list the traces to audit: {short_error(e)}", "err")), ""]
        n = len(src.items)
        step = max(1, n // 100)

        def tick(k: int) -> None:
            if k % step == 0:
                progress((k, n), desc="auditing", unit="traces")

        return [*_sized(audit_view(ctx, src, progress=tick)), src.key]

    def on_select(sess: Any, df: pd.DataFrame, evt: gr.SelectData):
        values = getattr(evt, "row_value", None)
        if isinstance(df, pd.DataFrame) and isinstance(values, list) and len(values) == len(df.columns):
            row = dict(zip(df.columns, values))
        else:
            i = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
            if not isinstance(df, pd.DataFrame) or i is None or i >= len(df):
                raise gr.Error("no such row")
            row = df.iloc[i].to_dict()
        if str(row.get("#", "")).strip() == "":
            raise gr.Error("no such row")
        return open_row(sess, row)

    def on_table(sess: Any, key: str):
        if not key:
            return [gr.skip()] * (len(ui.outputs()))
        try:
            now = key_of(sess)
        except Exception:  # noqa: BLE001 - the tab's status says why
            now = ""
        if now == key:
            return [gr.skip()] * (len(ui.outputs()))
        return [*_sized(empty_outputs("The tab shows other traces now: audit them again.")), ""]

    ui.button.click(on_audit, [session], ui.outputs(), api_visibility="private", concurrency_limit=CONCURRENCY,
                    concurrency_id="trace_audit")
    ui.rollouts.select(on_select, [session, ui.rollouts], open_outputs, api_visibility="private")
    table.change(on_table, [session, ui.key], ui.outputs(), api_visibility="private", trigger_mode="always_last")
