"""The Gradio app: one module per tab, the token view, and :func:`build_app` that puts them
together. ``ui`` only calls ``backend``; ``backend`` never imports ``ui``.

Per-user state is one :class:`ui.context.Session` in a ``gr.State``; what is shared (the model
backend, tokenizers, the sample traces) is read-only or built for concurrent use.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ui import assets, theme
from ui.context import AppContext, Session, load_samples, new_session

__all__ = ["CSS", "AppContext", "Session", "build_app", "launch_kwargs", "load_samples"]

# The theme's --ali-* variables (ui/theme.py), then the page's own rules (ui/assets/app.css)
CSS = theme.css_variables() + assets.read("app.css")
# in the page's head: the server's words when gradio's queue is full, shown in a banner (busy.js)
HEAD = "<script>" + assets.read("busy.js") + "</script>"


def launch_kwargs(ctx: AppContext | None = None) -> dict[str, Any]:
    """What ``launch()`` needs besides host/port (Gradio 6 takes theme and css there). An
    upload over the app's limit is refused by gradio while it streams in, before it is stored.
    The page and its config go out gzipped when the browser asks (``ui/compression.py``; event
    streams never); gradio holds at most ``ALI_MAX_SESSIONS`` sessions and forgets a one-shot API
    call's session once it is answered (``ui/sessions.py``); when gradio's queue is full the page
    shows the server's words for it, not only gradio's own (``HEAD``: ``ui/assets/busy.js``)."""
    from starlette.middleware import Middleware

    from ui import compression, sessions

    kw: dict[str, Any] = {"css": CSS, "theme": gr.themes.Soft(), "head": HEAD, "state_session_capacity": sessions.max_sessions(),
                          "app_kwargs": {"middleware": [*compression.middleware(), Middleware(sessions.DropOneShotSessions),
                                                        Middleware(sessions.BusyWords)],
                                         "lifespan": sessions.lifespan()}}
    if ctx is not None:
        kw["max_file_size"] = ctx.max_upload_bytes
    return kw


# gradio's cache of uploads and downloads: every hour, files older than an hour are deleted (a
# session's own temporary folders go when the session ends, see build_app)
DELETE_CACHE = (3600, 3600)


def build_app(ctx: AppContext) -> gr.Blocks:
    from ui import inspector, playground, template_lab, trace_files

    def initial_session() -> Session:
        s = new_session(ctx)
        s.file_traces = [label for label, _ in ctx.samples]
        s.file_name = "sample_traces"
        return s

    with gr.Blocks(title="Agent Loop Inspector", delete_cache=DELETE_CACHE) as demo:
        # a session's download folders go when gradio drops its state (an hour after the tab
        # closes); the app's whole temp root goes at shutdown
        session = gr.State(initial_session, delete_callback=_end_session)
        gr.Markdown(
            "# Agent Loop Inspector\nEvery token of a tool-calling agent loop: what the model generated (mask 1), "
            "what the loop injected (mask 0), step by step. Model: " + _md_escape(_model_line(ctx))
            + " · " + _md_escape(_mode_line(ctx)),
            elem_id="ali-header",
        )
        with gr.Tabs(selected="playground", elem_id="ali-tabs") as tabs:
            with gr.Tab("Playground", id="playground", elem_id="tab-playground"):
                pg = playground.build(ctx)
            with gr.Tab("Inspector", id="inspector", elem_id="tab-inspector"):
                insp = inspector.build(ctx, session)
            with gr.Tab("Trace files", id="files", elem_id="tab-files"):
                tf = trace_files.build(ctx, session)
            with gr.Tab("Template lab", id="lab", elem_id="tab-lab"):
                template_lab.build(ctx)

        insp_outputs = [session, *insp.trace_outputs()]

        def refresh_inspector(sess: Session, decode: str | None):
            return [sess, *inspector.show_trace(ctx, sess, sess.current, decode)]

        def after_run(sess: Session, decode: str | None):
            # the Inspector shows a run that just ended; a send that started none (refused because
            # the server is busy, a bad setting, Stop while waiting in line) leaves it as it is: no
            # charts built again for nothing (~0.2 s of CPU each)
            if sess.last_run is None or sess.last_run == getattr(sess, "_inspected_run", None):
                return [sess, *[gr.update()] * (len(insp_outputs) - 1)]
            sess._inspected_run = sess.last_run  # type: ignore[attr-defined]
            return refresh_inspector(sess, decode)

        def open_in_inspector(sess: Session, label: str):
            sess.current = label
            return [*refresh_inspector(sess, "auto"), gr.Tabs(selected="inspector"), gr.update(value="auto")]

        trace_files.wire(ctx, tf, session, (open_in_inspector, [*insp_outputs, tabs, insp.decode_dd]))
        playground.wire(ctx, pg, session, (after_run, [session, insp.decode_dd], insp_outputs))

        new_page = _NewPageViews(ctx)

        def on_load(sess: Session, request: gr.Request):
            # a link (?trace=<label>&step=<n>, which the Inspector writes as its selection changes)
            # reopens that trace and step, among the session's own traces only
            params = dict(request.query_params) if request is not None else {}
            if not params and new_page.applies(sess):  # every new page without a link: the same views
                return [sess, *new_page.outputs(sess), gr.update()]
            linked, step, note = inspector.open_link(sess, params)
            views = inspector.show_trace(ctx, sess, sess.current, "auto", step=step, note=note)
            tab = inspector.link_tab(params, linked)
            return [sess, *views, *trace_files.table_outputs(sess), trace_files.initial_status(sess),
                    gr.Tabs(selected=tab) if tab else gr.update()]

        # API name, kept stable (see ui/playground.py): /app_load () -> the Inspector's views of the
        # session's current trace (its dropdown lists the session's traces), the Trace files table
        # and status (the tabs come last: a link opens the tab it names)
        demo.load(on_load, [session], [*insp_outputs, tf.reason_dd, tf.source_dd, tf.table, tf.dist, tf.status, tabs],
                  api_name="app_load")
    # an explicit size: with none, gradio sets max_size=1 on a ZeroGPU Space, and every click
    # (the Trace files and Inspector tabs too) is refused while one event waits. The size counts
    # the waiting events of every kind together (gradio has one bound); GPU events wait apart,
    # each in its own concurrency group (agent_run, the lens), so CPU-only events are not held
    # behind them.
    # Agent runs do not wait in it (ui/run_gate.py: their own line of queue_max_size()). When it is
    # full, gradio's bare 503 "Queue is full" is answered in words by ui/sessions.BusyWords.
    demo.queue(default_concurrency_limit=ctx.concurrency_limit, max_size=queue_max_size())
    return demo


QUEUE_MAX_SIZE = 64  # agent runs waiting for a run slot, and events waiting in gradio's queue (ALI_QUEUE_MAX_SIZE)


def queue_max_size(environ: dict[str, str] | None = None) -> int:
    """The queue's bound: ``ALI_QUEUE_MAX_SIZE`` (a positive integer), else :data:`QUEUE_MAX_SIZE`."""
    import os

    raw = (os.environ if environ is None else environ).get("ALI_QUEUE_MAX_SIZE", "").strip()
    try:
        n = int(raw) if raw else QUEUE_MAX_SIZE
    except ValueError:
        n = QUEUE_MAX_SIZE
    return n if n > 0 else QUEUE_MAX_SIZE


class _NewPageViews:
    """What ``/app_load`` shows a new session opened without a link (every page load of a new
    visitor): the sample traces, the first one in the Inspector. It is the same for every visitor,
    and building it took ~0.2 s of CPU (the charts, with plotly), so 1,000 visitors arriving in a
    minute held both cores with it alone (issue 42, item 14). Built once; each visitor gets a copy,
    the charts as the JSON gradio sends (built once too), and its own download file of the trace."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.labels = [label for label, _ in ctx.samples]
        self.views: list[Any] | None = None
        self.filters: Any = None

    def applies(self, sess: Session) -> bool:
        from ui import trace_files

        return (bool(self.labels) and sess.runs == 0 and not trace_files.in_set_mode(sess) and sess.file_rows is None
                and sess.file_index is None and sess.file_name == "sample_traces" and sess.file_traces == self.labels
                and list(sess.traces) == self.labels and sess.current == self.labels[0])

    def outputs(self, sess: Session) -> list[Any]:
        import copy

        import pandas as pd
        import plotly.graph_objects as go
        from gradio.components.plot import PlotData

        from ui import inspector, trace_files

        if self.views is None:
            views = [*inspector.show_trace(self.ctx, sess, sess.current, "auto"), *trace_files.table_outputs(sess),
                     trace_files.initial_status(sess)]
            self.filters = sess.file_filters
            self.views = [PlotData(type="plotly", plot=v.to_json()) if isinstance(v, go.Figure) else v for v in views]
        sess.file_filters = self.filters
        out = [v if isinstance(v, (str, PlotData)) else v.copy() if isinstance(v, pd.DataFrame) else copy.deepcopy(v)
               for v in self.views]
        trace = sess.get(sess.current)
        out[inspector.DOWNLOAD_OUTPUT] = gr.update(value=inspector._download_file(trace, sess), interactive=trace is not None)
        return out


def _end_session(sess: Any) -> None:
    if isinstance(sess, Session):
        sess.remove_temp_dirs()


def _model_line(ctx: AppContext) -> str:
    """What the header says of the model: which one, never its state (the header is rendered
    once; the playground's status line follows loading)."""
    o = ctx.model.options
    return o.describe() if o is not None else "none (explore traces; scripted runs only)"


def _mode_line(ctx: AppContext) -> str:
    t = ctx.trust
    if t.public:
        return "public mode (tokenizers: offline profiles and the model's own; templates: trl names or Jinja text)"
    return "local mode (typed paths and hub ids are loaded)"


def _md_escape(s: str) -> str:
    import html

    return html.escape(s).replace("*", "\\*").replace("_", "\\_")
