"""Inspector tab: one trace, whatever produced it (a playground run, a file, a sample).

Shows the summary, the step list (state, tokens added, mask, tool calls, duration, errors), the
conversation, every token coloured by mask with an anchor per step, and for the selected step:
the rendered template text with special tokens marked, its tokens, the parsed tool calls with
parse errors, and the tool results. Charts and diagnostics below.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.trace import Step, Trace
from ui import charts, token_view
from ui.chat import trace_to_chat
from ui.context import AppContext, Session, short_error, trace_file_name

PREFIX = "insp"  # token view anchors: insp-step-<n>
STEP_PREFIX = "inspstep"
STEP_COLUMNS = ["step", "state", "tokens", "added", "mask", "tool calls", "finish", "duration ms", "errors"]
DIAG_COLUMNS = ["severity", "code", "message", "step", "message #", "token"]
DECODE_CHOICES = ["auto", "qwen3", "qwen3-thinking", "qwen2.5", "smollm2"]


@dataclass
class InspectorUI:
    trace_dd: gr.Dropdown
    decode_dd: gr.Dropdown
    summary: gr.HTML
    steps_df: gr.Dataframe
    step_dd: gr.Dropdown
    chat: gr.Chatbot
    step_header: gr.HTML
    step_text: gr.HTML
    step_tokens: gr.HTML
    step_calls: gr.Code
    step_results: gr.Code
    tokens: gr.HTML
    plot_tokens: gr.Plot
    plot_timeline: gr.Plot
    diagnostics: gr.Dataframe
    download: gr.DownloadButton

    def trace_outputs(self) -> list[Any]:
        return [self.trace_dd, self.summary, self.steps_df, self.step_dd, self.chat, self.tokens, self.plot_tokens,
                self.plot_timeline, self.diagnostics, self.download, *self.step_outputs()]

    def step_outputs(self) -> list[Any]:
        return [self.step_header, self.step_text, self.step_tokens, self.step_calls, self.step_results]


# ---- pure functions (tested in-process) ----------------------------------------------------------


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return [(m, n) for m, n in out]


def step_rows(trace: Trace | None) -> pd.DataFrame:
    rows = []
    for s in trace.steps if trace else []:
        calls = ", ".join(c.name for c in s.tool_calls)
        if s.tool_results:
            calls = calls or ", ".join(r.name for r in s.tool_results)
        errors = []
        if s.error:
            errors.append(s.error)
        errors += [f"parse: {e.message}" for e in s.parse_errors]
        errors += [f"{r.name}: {r.error}" for r in s.tool_results if not r.ok]
        if s.info.get("not_appended"):
            errors.append(f"not appended: {s.info['not_appended']}")
        rows.append({
            "step": s.index,
            # the constraint the backend enforced for a generated turn (tool_choice other than auto)
            "state": f"{s.state} · {s.constraint.get('tool_choice') or s.constraint.get('kind')}" if s.constraint else s.state,
            "tokens": f"{s.start}–{s.end}",
            "added": s.end - s.start,
            "mask": "" if s.mask is None else str(s.mask) if s.state != "pending" else "prompt",
            "tool calls": calls,
            "finish": s.finish_reason or (s.info.get("reason") if s.state == "terminated" else "") or "",
            "duration ms": round(s.duration_s * 1000, 1),
            "errors": "; ".join(errors)[:300],
        })
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def step_choices(trace: Trace | None) -> list[tuple[str, int]]:
    if trace is None:
        return []
    return [(f"{s.index} · {s.state} · {s.end - s.start} tokens", s.index) for s in trace.steps]


def default_step(trace: Trace | None) -> int | None:
    if trace is None or not trace.steps:
        return None
    for s in trace.steps:
        if s.state == "generating":
            return s.index
    return trace.steps[0].index


def summary_html(label: str, trace: Trace | None, note: str = "") -> str:
    if trace is None:
        return '<div class="ali-summary">No trace selected. Load a file in <b>Trace files</b> or run one in the <b>Playground</b>.</div>'
    e = html.escape
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    runs = " ".join(f"{n}×{m}" for m, n in mask_runs(trace.response_mask)) or "(no response)"
    gen = sum(trace.response_mask)
    items = [
        ("trace", trace.id),
        ("source", str(md.get("source", "?"))),
        ("tokenizer", f"{trace.tokenizer.name or '?'} / {trace.tokenizer.template or '?'}"),
        ("parser", str(md.get("parser", trace.config.get("parser") or "?"))),
        ("termination", trace.termination_reason or "?"),
        ("turns", str(trace.num_turns)),
        ("prompt tokens", str(len(trace.prompt_ids))),
        ("response tokens", f"{len(trace.response_ids)} ({gen} generated, {len(trace.response_ids) - gen} injected)"),
        ("mask", runs),
        ("errors", str(trace.step_errors())),
    ]
    if md.get("duration_s") is not None:
        try:
            items.append(("duration", f"{float(md['duration_s']):.2f} s"))
        except (TypeError, ValueError):
            pass
    cells = "".join(f'<div class="ali-kv"><span>{e(k)}</span><b data-field="{e(k)}">{e(v)}</b></div>' for k, v in items)
    desc = md.get("description")
    desc_html = f'<div class="ali-desc">{e(str(desc))}</div>' if desc else ""
    note_html = f'<div class="ali-note">{e(note)}</div>' if note else ""
    return f'<div class="ali-summary"><div class="ali-label">{e(label)}</div>{desc_html}<div class="ali-kvs">{cells}</div>{note_html}</div>'


def diagnostics_rows(trace: Trace | None, bundle: Any | None) -> pd.DataFrame:
    if trace is None:
        return pd.DataFrame([], columns=DIAG_COLUMNS)
    try:
        from backend.diagnostics import check
    except ImportError:
        return pd.DataFrame([{"severity": "info", "code": "unavailable", "message": "diagnostics are not installed in this build",
                              "step": "", "message #": "", "token": ""}], columns=DIAG_COLUMNS)
    try:
        findings = check(trace, bundle)
    except Exception as e:  # noqa: BLE001 - a diagnostics bug must not break the inspector
        return pd.DataFrame([{"severity": "info", "code": "diagnostics_failed", "message": short_error(e), "step": "",
                              "message #": "", "token": ""}], columns=DIAG_COLUMNS)
    rows = []
    for f in findings:
        d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
        loc = d.get("location") or {}
        rows.append({
            "severity": d.get("severity", ""), "code": d.get("code", ""), "message": str(d.get("message", ""))[:400],
            "step": "" if loc.get("step") is None else loc.get("step"),
            "message #": "" if loc.get("message") is None else loc.get("message"),
            "token": "" if loc.get("token") is None else loc.get("token"),
        })
    if not rows:
        rows.append({"severity": "ok", "code": "no_findings", "message": "no problems found", "step": "", "message #": "", "token": ""})
    return pd.DataFrame(rows, columns=DIAG_COLUMNS)


def _step_json(step: Step) -> str:
    calls = [c.model_dump(mode="json", exclude_none=True) for c in step.tool_calls]
    errors = [e.model_dump(mode="json", exclude_none=True) for e in step.parse_errors]
    doc: dict[str, Any] = {"tool_calls": calls, "parse_errors": errors}
    if step.constraint:
        doc["constraint"] = step.constraint
    return json.dumps(doc, ensure_ascii=False, indent=2)


def _results_json(step: Step) -> str:
    doc: dict[str, Any] = {"tool_results": [r.model_dump(mode="json", exclude_none=True) for r in step.tool_results]}
    if step.info:
        doc["info"] = step.info
    return json.dumps(doc, ensure_ascii=False, indent=2, default=str)


def step_detail(trace: Trace | None, step_index: int | None, bundle: Any | None) -> tuple[str, str, str, str, str]:
    """(header html, template text html, tokens html, calls json, results json)."""
    if trace is None or step_index is None:
        empty = token_view.empty_view("select a step")
        return "", empty, empty, "", ""
    step = next((s for s in trace.steps if s.index == step_index), None)
    if step is None:
        empty = token_view.empty_view(f"no step {step_index}")
        return "", empty, empty, "", ""
    e = html.escape
    tok = bundle.tokenizer if bundle is not None else None
    bits = [f"<b>Step {step.index}</b>", e(step.state), f"tokens {step.start}–{step.end} ({step.end - step.start})"]
    if step.mask is not None and step.state != "pending":
        bits.append(f"mask {step.mask}")
    if step.finish_reason:
        bits.append(f"finish {e(step.finish_reason)}")
    bits.append(f"{step.duration_s * 1000:.1f} ms")
    errs = []
    if step.error:
        errs.append(step.error)
    errs += [f"parse error: {p.message}" for p in step.parse_errors]
    errs += [f"tool {r.name}: {r.error} — {r.error_detail or ''}" for r in step.tool_results if not r.ok]
    if step.info.get("not_appended"):
        errs.append(f"not appended: {step.info['not_appended']}")
    err_html = "".join(f'<div class="ali-err">{e(x)}</div>' for x in errs)
    header = f'<div class="ali-step-head">{" · ".join(bits)}{err_html}</div>'
    text = token_view.mark_special_text(step.text, tok) if step.text else token_view.empty_view("this step appended no text")
    ids = trace.input_ids[step.start : step.end]
    kinds = token_view.trace_kinds(trace)[step.start : step.end]
    toks = (
        token_view.render_tokens(ids, kinds, tok, prefix=STEP_PREFIX)
        if ids else token_view.empty_view("this step appended no tokens")
    )
    return header, text, toks, _step_json(step), _results_json(step)


def _download_file(trace: Trace | None) -> str | None:
    if trace is None:
        return None
    from backend.trace import write_jsonl

    d = tempfile.mkdtemp(prefix="ali-trace-")
    path = os.path.join(d, trace_file_name(trace))
    write_jsonl([trace], path)
    return path


def show_trace(ctx: AppContext, session: Session, label: str | None, decode: str | None) -> list[Any]:
    """All outputs of :meth:`InspectorUI.trace_outputs` for trace ``label``."""
    if label and label in session.traces:
        session.current = label
    label = session.current
    trace = session.get(label)
    bundle, note = (None, "")
    if trace is not None:
        bundle, note = ctx.trace_bundle(trace, decode)
    tok = bundle.tokenizer if bundle is not None else None
    step = default_step(trace)
    tokens_html = (
        token_view.render_trace(trace, tok, prefix=PREFIX, note=note)
        if trace is not None and trace.input_ids else token_view.empty_view("no tokens in this trace")
    )
    return [
        gr.update(choices=list(session.traces), value=label),
        summary_html(label or "", trace, note),
        step_rows(trace),
        gr.update(choices=step_choices(trace), value=step),
        trace_to_chat(trace),
        tokens_html,
        charts.tokens_per_turn(trace),
        charts.step_timeline(trace),
        diagnostics_rows(trace, bundle),
        gr.update(value=_download_file(trace), interactive=trace is not None),
        *step_detail(trace, step, bundle),
    ]


def show_step(ctx: AppContext, session: Session, step: int | None, decode: str | None) -> tuple[str, str, str, str, str]:
    trace = session.get(session.current)
    bundle = ctx.trace_bundle(trace, decode)[0] if trace is not None else None
    return step_detail(trace, step, bundle)


# ---- layout -------------------------------------------------------------------------------------


def build(ctx: AppContext, session: gr.State) -> InspectorUI:
    with gr.Row():
        trace_dd = gr.Dropdown(label="Trace", choices=[], value=None, scale=4, elem_id="insp-trace")
        decode_dd = gr.Dropdown(label="Decode with", choices=DECODE_CHOICES, value="auto", scale=1, elem_id="insp-decode",
                                info="auto: the trace's tokenizer")
        download = gr.DownloadButton("Save trace (JSONL)", scale=1, elem_id="insp-download", interactive=False)
    summary = gr.HTML(summary_html("", None), elem_id="insp-summary")
    steps_df = gr.Dataframe(
        headers=STEP_COLUMNS, value=step_rows(None), interactive=False, label="Steps (click a row)",
        elem_id="insp-steps", wrap=True, max_height=300,
        column_widths=["5%", "12%", "9%", "6%", "6%", "22%", "9%", "9%", "22%"],
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            step_dd = gr.Dropdown(label="Selected step", choices=[], value=None, elem_id="insp-step")
            step_header = gr.HTML(elem_id="insp-step-head")
            with gr.Tabs():
                with gr.Tab("Template text"):
                    step_text = gr.HTML(token_view.empty_view("select a step"), elem_id="insp-step-text",
                                        css_template=token_view.CSS, js_on_load=None)
                with gr.Tab("Tokens"):
                    step_tokens = gr.HTML(token_view.empty_view("select a step"), elem_id="insp-step-tokens",
                                          css_template=token_view.CSS, js_on_load=token_view.JS)
                with gr.Tab("Tool calls / parse errors"):
                    step_calls = gr.Code(language="json", label="parsed tool calls and parse errors", elem_id="insp-step-calls",
                                         interactive=False, lines=8, max_lines=30)
                with gr.Tab("Tool results / info"):
                    step_results = gr.Code(language="json", label="tool results and step info", elem_id="insp-step-results",
                                           interactive=False, lines=8, max_lines=30)
        with gr.Column(scale=2):
            chat = gr.Chatbot(label="Conversation", elem_id="insp-chat", height=480, feedback_options=None,
                              sanitize_html=True, group_consecutive_messages=False, buttons=["copy"], autoscroll=False)
    gr.Markdown("### All tokens\nColour = mask: grey prompt, green generated (1), orange injected (0); violet frame = special token. "
                "Click a step chip (or a row above) to jump to its tokens.")
    tokens = gr.HTML(token_view.empty_view("no trace"), elem_id="insp-tokens", css_template=token_view.CSS, js_on_load=token_view.JS)
    with gr.Row():
        plot_tokens = gr.Plot(label="Tokens per step", show_label=False, elem_id="insp-plot-tokens")
        plot_timeline = gr.Plot(label="Step timeline", show_label=False, elem_id="insp-plot-timeline")
    diagnostics = gr.Dataframe(headers=DIAG_COLUMNS, value=diagnostics_rows(None, None), interactive=False,
                               label="Diagnostics (backend.diagnostics)", elem_id="insp-diagnostics", wrap=True,
                               column_widths=["8%", "16%", "58%", "6%", "6%", "6%"])

    ui = InspectorUI(trace_dd, decode_dd, summary, steps_df, step_dd, chat, step_header, step_text, step_tokens,
                     step_calls, step_results, tokens, plot_tokens, plot_timeline, diagnostics, download)

    def on_trace(sess: Session, label: str | None, decode: str | None):
        return [sess, *show_trace(ctx, sess, label, decode)]

    def on_step(sess: Session, step: int | None, decode: str | None):
        return show_step(ctx, sess, step, decode)

    def on_row(sess: Session, evt: gr.SelectData):
        trace = sess.get(sess.current)
        if trace is None or evt.index is None:
            return gr.update()
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if 0 <= row < len(trace.steps):
            return gr.update(value=trace.steps[row].index)
        return gr.update()

    # API name, kept stable (see ui/playground.py): /inspector_open (label, decode) -> the trace's
    # views (a label that is not in the caller's session shows the session's current trace)
    trace_dd.input(on_trace, [session, trace_dd, decode_dd], [session, *ui.trace_outputs()], api_name="inspector_open")
    decode_dd.input(on_trace, [session, trace_dd, decode_dd], [session, *ui.trace_outputs()], api_name="inspector_decode",
                    api_visibility="undocumented")
    step_dd.input(on_step, [session, step_dd, decode_dd], ui.step_outputs()).then(
        None, [step_dd], None, js=token_view.select_step_js(PREFIX)
    )
    steps_df.select(on_row, [session], [step_dd]).then(on_step, [session, step_dd, decode_dd], ui.step_outputs()).then(
        None, [step_dd], None, js=token_view.select_step_js(PREFIX)
    )
    return ui
