"""The Gradio app: one module per tab, the token view, and :func:`build_app` that puts them
together. ``ui`` only calls ``backend``; ``backend`` never imports ``ui``.

Per-user state is one :class:`ui.context.Session` in a ``gr.State``; what is shared (the model
backend, tokenizers, the sample traces) is read-only or built for concurrent use.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ui import theme
from ui.context import AppContext, Session, load_samples, new_session

__all__ = ["CSS", "AppContext", "Session", "build_app", "launch_kwargs", "load_samples"]

# Colours are the --ali-* variables of ui/theme.py (light, and .dark: Gradio's dark theme), and
# each state sets its text AND its background. Gradio colours every element inside a gr.HTML
# (".prose *") with the theme's text colour, so children of our boxes inherit ours explicitly.
CSS = theme.css_variables() + """
.ali-summary { padding: 8px 10px; border: 1px solid var(--border-color-primary); border-radius: 8px; background: var(--background-fill-secondary); }
.ali-label { font-weight: 600; margin-bottom: 4px; word-break: break-all; }
.ali-desc { font-size: 13px; color: var(--ali-subdued); margin-bottom: 6px; }
.ali-kvs { display: flex; flex-wrap: wrap; gap: 6px 14px; font-size: 13px; }
.ali-kv span { color: var(--ali-subdued); margin-right: 4px; }
.ali-kv b { font-family: ui-monospace, monospace; font-weight: 600; }
.ali-badges { display: flex; flex-wrap: wrap; gap: 6px; margin: 2px 0 6px; }
.ali-badge { font-size: 12px; padding: 1px 8px; border-radius: 10px; border: 1px solid currentColor; font-weight: 600; }
.ali-badge-ok { color: var(--ali-ok-fg); background: var(--ali-ok-bg); }
.ali-badge-warn { color: var(--ali-warn-fg); background: var(--ali-warn-bg); }
.ali-badge-err { color: var(--ali-err-fg); background: var(--ali-err-bg); }
.ali-badge-info { color: var(--ali-info-fg); background: var(--ali-info-bg); }
.ali-note, .ali-warn { color: var(--ali-warn-fg); background: var(--ali-warn-bg); padding: 4px 8px; border-radius: 6px; font-size: 13px; margin-top: 4px; }
.ali-err { color: var(--ali-err-fg); background: var(--ali-err-bg); padding: 4px 8px; border-radius: 6px; font-size: 13px; margin-top: 4px; white-space: pre-wrap; }
.ali-ok { color: var(--ali-ok-fg); background: var(--ali-ok-bg); padding: 4px 8px; border-radius: 6px; font-size: 13px; }
.ali-info { color: var(--ali-info-fg); background: var(--ali-info-bg); padding: 4px 8px; border-radius: 6px; font-size: 13px; }
.ali-note *, .ali-warn *, .ali-err *, .ali-ok *, .ali-info *, .ali-badge *, .ali-diff * { color: inherit; }
.ali-step-head { font-size: 13px; padding: 4px 0; }
.ali-copy-bar { display: inline-flex; gap: 6px; align-items: center; margin-left: 10px; }
.ali-copy { font-size: 12px; padding: 1px 8px; border-radius: 6px; border: 1px solid var(--ali-chip-border); background: var(--ali-chip-bg); color: var(--ali-chip-fg); cursor: pointer; }
.ali-copy:hover { border-color: var(--ali-chip-fg); }
.ali-copy-status { font-size: 12px; color: var(--ali-subdued); }
.ali-diff { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; word-break: break-all; border: 1px solid var(--border-color-primary); border-radius: 6px; max-height: 480px; overflow: auto; background: var(--ali-tv-bg); color: var(--ali-tv-fg); }
.ali-diff .d-head { color: var(--ali-subdued); padding: 4px 6px; border-bottom: 1px solid var(--border-color-primary); }
.ali-diff .d-eq { padding: 0 6px; color: var(--ali-tv-fg); }
.ali-diff .d-del { padding: 0 6px; background: var(--ali-del-bg); color: var(--ali-del-fg); }
.ali-diff .d-add { padding: 0 6px; background: var(--ali-add-bg); color: var(--ali-add-fg); }
.ali-diff .d-skip { padding: 0 6px; color: var(--ali-subdued); font-style: italic; }
.ali-diff mark { background: var(--ali-hl-bg); color: var(--ali-hl-fg); }
/* plots: transparent backgrounds (ui/charts.py); in the dark theme, plotly's own text and grid
   colours (inline styles) give way to ours. Hover labels keep plotly's colours (their box is
   drawn in the bar's colour). Subplots name their axes x2, y3...: .x2tick, .g-y3title. */
.dark .js-plotly-plot .main-svg :is(.xtick, .ytick, [class$="tick"], .g-xtitle, .g-ytitle, [class^="g-"][class$="title"], .g-gtitle, .legend, .annotation) text { fill: var(--ali-chart-fg) !important; }
.dark .js-plotly-plot .main-svg :is(.gridlayer, .zerolinelayer) path { stroke: var(--ali-chart-grid) !important; }
#ali-header h1 { margin-bottom: 0; }
/* chatbot tool messages: a long title (tool name, reason) wraps inside the bubble instead of
   pushing the call id / duration beside it out of the bubble */
.gradio-container .thought-group > .title > .md { flex: 0 1 auto; min-width: 0; overflow-wrap: anywhere; }
"""


def launch_kwargs(ctx: AppContext | None = None) -> dict[str, Any]:
    """What ``launch()`` needs besides host/port (Gradio 6 takes theme and css there). An
    upload over the app's limit is refused by gradio while it streams in, before it is stored."""
    kw: dict[str, Any] = {"css": CSS, "theme": gr.themes.Soft()}
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

        def open_in_inspector(sess: Session, label: str):
            sess.current = label
            return [*refresh_inspector(sess, "auto"), gr.Tabs(selected="inspector"), gr.update(value="auto")]

        trace_files.wire(ctx, tf, session, (open_in_inspector, [*insp_outputs, tabs, insp.decode_dd]))
        playground.wire(ctx, pg, session, (refresh_inspector, [session, insp.decode_dd], insp_outputs))

        def on_load(sess: Session, request: gr.Request):
            # a link (?trace=<label>&step=<n>, which the Inspector writes as its selection changes)
            # reopens that trace and step, among the session's own traces only
            params = dict(request.query_params) if request is not None else {}
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
    demo.queue(default_concurrency_limit=ctx.concurrency_limit)
    return demo


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
