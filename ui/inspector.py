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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.checks.labels import termination_label, trace_termination_label
from backend.trace import Step, Trace
from backend.trace.builder import mask_runs  # noqa: F401  (ui.inspector.mask_runs: tests, callers)
from backend.trace.model import StepState as S
from ui import assets, charts, logprob_lens, token_view
from ui.chat import trace_to_chat
from ui.context import AppContext, Session, UserError, short_error, trace_file_name

PREFIX = "insp"  # token view anchors: insp-step-<n>
STEP_REQ_ID = "insp-step-req"  # the hidden textbox the browser asks for steps through (REQUEST_JS)
STEP_PREFIX = "inspstep"
STEP_COLUMNS = ["step", "state", "tokens", "added", "mask", "tool calls", "finish", "duration ms", "errors"]
DIAG_COLUMNS = ["severity", "code", "message", "step", "message #", "token"]
DECODE_CHOICES = ["auto", "qwen3", "qwen3-thinking", "qwen2.5", "smollm2"]


@dataclass
class LensUI:
    """The logprob lens's widgets (ui/logprob_lens.py renders them)."""

    dtype: gr.Radio
    cap: gr.Number
    button: gr.Button
    status: gr.HTML
    numbers: gr.HTML
    scatter: gr.Plot
    ratios: gr.Plot
    per_step: gr.Plot
    worst: gr.HTML

    def outputs(self) -> list[Any]:
        return [self.status, self.numbers, self.scatter, self.ratios, self.per_step, self.worst]


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
    lens: LensUI

    def trace_outputs(self) -> list[Any]:
        # API outputs of /inspector_open and /app_load, by position: the lens is not among them
        # (it follows the summary, see _wire_lens)
        return [self.trace_dd, self.summary, self.steps_df, self.step_dd, self.chat, self.tokens, self.plot_tokens,
                self.plot_timeline, self.diagnostics, self.download, *self.step_outputs()]

    def step_outputs(self) -> list[Any]:
        return [self.step_header, self.step_text, self.step_tokens, self.step_calls, self.step_results]


# ---- pure functions (tested in-process) ----------------------------------------------------------


def _channel_label(c: dict[str, Any]) -> str:
    ch = str(c.get("channel") or "?")
    to = c.get("recipient")
    return f"{ch}→{to}" if to else ch


def step_rows(trace: Trace | None) -> pd.DataFrame:
    rows = []
    for s in trace.steps if trace else []:
        calls = ", ".join(c.name for c in s.tool_calls)
        if s.tool_results:
            calls = calls or ", ".join(r.name for r in s.tool_results)
        errors = []
        if s.error:
            errors.append(s.error)
        # a repair the parser made (a warning: the call was kept) is said so, not called an error
        errors += [f"{'repaired' if getattr(e, 'severity', 'error') == 'warning' else 'parse'}: {e.message}" for e in s.parse_errors]
        errors += [f"{r.name}: {r.error}" for r in s.tool_results if not r.ok]
        if s.info.not_appended:
            errors.append(f"not appended: {s.info.not_appended}")
        state = f"{s.state} · {s.constraint.get('tool_choice') or s.constraint.get('kind')}" if s.constraint else str(s.state)
        if s.info.channels:  # Harmony's channels, in order: analysis, commentary→tool, final
            state += " · " + ", ".join(_channel_label(c) for c in s.info.channels)
        if s.info.boundary:  # continuous tokens: the junction edit this tool turn made
            b = s.info.boundary
            state += f" · +{len(b.get('inserted') or [])} inserted" if b.get("inserted") else f" · {b.get('relabeled')} relabelled"
        rows.append({
            "step": s.index,
            # the constraint the backend enforced for a generated turn (tool_choice other than auto)
            "state": state,
            "tokens": f"{s.start}–{s.end}",
            "added": s.end - s.start,
            "mask": "" if s.mask is None else str(s.mask) if s.state != S.PENDING else "prompt",
            "tool calls": calls,
            "finish": s.finish_reason or (termination_label(s.info.reason) if s.state == S.TERMINATED and s.info.reason else ""),
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
        if s.state == S.GENERATING:
            return s.index
    return trace.steps[0].index


def _get(md: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(md, dict):
            return None
        md = md.get(k)
    return md


def source_model(trace: Trace) -> str | None:
    """The model that produced the trace, where its metadata says: our engine records the
    generator's model, chat-completions logs the request's / response's ``model``."""
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    for path in (("generator", "model"), ("model",), ("response", "model"), ("request", "model"), ("record", "model")):
        v = _get(md, *path)
        if isinstance(v, str) and v.strip():
            return v.strip()
    if _get(md, "generator", "backend") == "scripted":
        return "none (scripted replay)"
    return None


def tokenizer_name(trace: Trace) -> str:
    name, tpl = trace.tokenizer.name, trace.tokenizer.template
    if not name:
        return "not recorded"
    return f"{name} / {tpl}" if tpl else name


def imported_from(trace: Trace) -> str | None:
    """"imported from OTel GenAI (openai-v2 2.4b0)": the source format an importer recorded in
    ``metadata["provenance"]``, with the writing library and version where the file named them."""
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    prov = md.get("provenance")
    if not isinstance(prov, dict) or not prov.get("format"):
        return None
    lib = prov.get("library")
    lib = str(lib).removeprefix("opentelemetry.instrumentation.").replace("_", "-") if lib else ""
    ver = str(prov.get("version") or "")
    who = " ".join(x for x in (lib, ver) if x)
    return f"imported from {prov['format']}" + (f" ({who})" if who else "")


def provenance(trace: Trace) -> list[tuple[str, str, str]]:
    """Where the trace's token ids and mask came from, as ``(kind, text, explanation)`` badges
    (kind: ok / warn / err / info). Importers record it in ``metadata["ids"]``: ``"given"`` (the
    source had token ids, kept exactly), ``"rendered"`` (it had only messages: the ids are ours,
    from rendering them with a tokenizer and template), ``"none"`` (the template could not
    render them)."""
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    ids, mask, msgs = md.get("ids"), md.get("mask"), md.get("messages")
    tok = tokenizer_name(trace)
    out: list[tuple[str, str, str]] = []
    src = imported_from(trace)
    lead = f"{src}, " if src else ""
    if ids == "rendered":
        out.append(("warn", f"{lead}re-rendered with {tok}",
                    "the source had no token ids: these ids and this mask come from rendering its messages with this "
                    "tokenizer and template; the model may have seen other tokens"))
    elif ids == "given":
        out.append(("ok", f"{lead}token ids as recorded in the source", "the source's own token ids, kept exactly"))
    elif ids == "none":
        why = md.get("render_error")
        out.append(("err", f"{lead}no token ids: the template could not render the messages",
                    str(why) if why else "the messages are shown without tokens"))
    elif isinstance(md.get("generator"), dict):
        out.append(("ok", "token ids from the agent loop's run", "ids appended as the backend returned them"))
    if mask == "assumed":
        out.append(("warn", "mask assumed: all 1", "the source gave no response mask"))
    imp = md.get("import")
    lost = imp.get("losses") if isinstance(imp, dict) else None
    if isinstance(lost, list) and lost:
        out.append(("err", f"{len(lost)} thing(s) of the source not carried over", "; ".join(str(x) for x in lost[:5])[:1000]))
    if msgs in ("decoded", "recovered"):
        out.append(("info", f"messages {msgs} from the {'token ids' if msgs == 'decoded' else 'text'}",
                    "the source had no message list: the conversation was read back from it"))
    return out


def tool_turns_label(trace: Trace) -> str:
    """How the trace's tool turns were appended: the loop setting, with the junction edits made
    (``continuous · 2 separators inserted``); for a trace written by another tool, or by this one
    before the setting existed, what its steps say."""
    mode = trace.config.get("tool_turns") if isinstance(trace.config, dict) else None
    edits = [s.info.boundary for s in trace.steps if s.info.boundary]
    if mode is None:
        if not any(s.state == S.PROCESSING_TOOLS for s in trace.steps):
            return "not recorded"
        mode = "legacy (not recorded)" if not (trace.metadata or {}).get("import") else "as the source wrote them"
    if edits:
        ins = sum(1 for e in edits if e.get("inserted"))
        rel = sum(1 for e in edits if e.get("relabeled"))
        parts = ([f"{ins} separator{'s' if ins != 1 else ''} inserted"] if ins else []) + ([f"{rel} relabelled"] if rel else [])
        return f"{mode} · {', '.join(parts)}"
    return str(mode)


def summary_html(label: str, trace: Trace | None, note: str = "") -> str:
    if trace is None:
        note_html = f'<div class="ali-note">{html.escape(note)}</div>' if note else ""
        return ('<div class="ali-summary">No trace selected. Load a file in <b>Trace files</b> or run one in the '
                f'<b>Playground</b>.{note_html}</div>')
    e = html.escape
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    runs = " ".join(f"{n}×{m}" for m, n in mask_runs(trace.response_mask)) or "(no response)"
    gen = sum(trace.response_mask)
    source = md.get("source")
    parser = md.get("parser", trace.config.get("parser"))
    items = [
        ("trace", trace.id),
        ("source", str(source) if source not in (None, "") else "not recorded"),
    ]
    model = source_model(trace)
    if model:
        items.append(("model", model))
    items += [
        ("tokenizer", tokenizer_name(trace)),
        ("parser", str(parser) if parser not in (None, "") else "not recorded"),
        ("tool turns", tool_turns_label(trace)),
        ("termination", trace_termination_label(trace)),
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
    badges = "".join(
        f'<span class="ali-badge ali-badge-{kind}" data-badge="{kind}" title="{e(why)}">{e(text)}</span>'
        for kind, text, why in provenance(trace)
    )
    badges_html = f'<div class="ali-badges">{badges}</div>' if badges else ""
    desc = md.get("description")
    desc_html = f'<div class="ali-desc">{e(str(desc))}</div>' if desc else ""
    note_html = f'<div class="ali-note">{e(note)}</div>' if note else ""
    return (f'<div class="ali-summary"><div class="ali-label">{e(label)}</div>{desc_html}{badges_html}'
            f'<div class="ali-kvs">{cells}</div>{note_html}</div>')


def diagnostics_rows(trace: Trace | None, bundle: Any | None) -> pd.DataFrame:
    if trace is None:
        return pd.DataFrame([], columns=DIAG_COLUMNS)
    try:
        from backend.checks.diagnostics import check
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
    if step.info.channels:
        doc["channels"] = step.info.channels
    return json.dumps(doc, ensure_ascii=False, indent=2)


def _results_json(step: Step) -> str:
    doc: dict[str, Any] = {"tool_results": [r.model_dump(mode="json", exclude_none=True) for r in step.tool_results]}
    if step.info:
        doc["info"] = step.info.to_dict()
    return json.dumps(doc, ensure_ascii=False, indent=2, default=str)


def step_ids_and_mask(trace: Trace, step: Step) -> tuple[list[int], list[int]]:
    """The token ids a step appended and their mask over the full sequence (prompt tokens are
    context: 0), as the Copy buttons give them."""
    return trace.input_ids[step.start : step.end], trace.full_mask[step.start : step.end]


def _copy_buttons(ids: list[int], mask: list[int]) -> str:
    ids_json, mask_json = json.dumps(ids), json.dumps(mask)
    return (
        '<span class="ali-copy-bar">'
        f'<button type="button" class="ali-copy" data-what="token ids" data-copy="{html.escape(ids_json)}" '
        f'title="copy the {len(ids)} token ids as a JSON list">Copy token ids</button>'
        f'<button type="button" class="ali-copy" data-what="mask" data-copy="{html.escape(mask_json)}" '
        f'title="copy their mask (prompt tokens 0) as a JSON list">Copy mask</button>'
        '<span class="ali-copy-status" aria-live="polite"></span></span>'
    )


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
    if step.mask is not None and step.state != S.PENDING:
        bits.append(f"mask {step.mask}")
    if step.finish_reason:
        bits.append(f"finish {e(step.finish_reason)}")
    if step.info.method:  # how a tool turn was tokenized (continuous / legacy's suffix, verl, diff)
        bits.append(f"tokenized {e(step.info.method)}" + (f" ({e(step.info.rule)})" if step.info.rule else ""))
    if step.info.boundary:
        b = step.info.boundary
        what = f"+{len(b.get('inserted') or [])} inserted" if b.get("inserted") else f"{b.get('relabeled')} relabelled"
        bits.append(f'<span class="ali-boundary" title="{e(str(b.get("why") or ""), quote=True)}">{what} at token {b.get("position")}</span>')
    bits.append(f"{step.duration_s * 1000:.1f} ms")
    errs = []
    if step.error:
        errs.append(step.error)
    repaired = [f"repaired call (kept): {p.message}" for p in step.parse_errors if getattr(p, "severity", "error") == "warning"]
    errs += [f"parse error: {p.message}" for p in step.parse_errors if getattr(p, "severity", "error") != "warning"]
    errs += [f"tool {r.name}: {r.error} — {r.error_detail or ''}" for r in step.tool_results if not r.ok]
    if step.info.not_appended:
        errs.append(f"not appended: {step.info.not_appended}")
    if step.info.continuous_error:
        repaired.append(f"continuous tokens failed here, the legacy method was used: {step.info.continuous_error}")
    err_html = "".join(f'<div class="ali-err">{e(x)}</div>' for x in errs)
    err_html += "".join(f'<div class="ali-warn">{e(x)}</div>' for x in repaired)
    ids, mask = step_ids_and_mask(trace, step)
    copy = _copy_buttons(ids, mask) if ids else ""
    header = (f'<div class="ali-step-head" data-step="{step.index}"><span class="ali-step-bits">{" · ".join(bits)}</span>'
              f'{copy}{err_html}</div>')
    text = token_view.mark_special_text(step.text, tok) if step.text else token_view.empty_view("this step appended no text")
    kinds = token_view.trace_kinds(trace)[step.start : step.end]
    toks = (
        token_view.render_tokens(ids, kinds, tok, prefix=STEP_PREFIX, first_index=step.start, step_index=step.index,
                                 logprobs=token_view.step_logprobs(trace, step),
                                 channels=[(p - step.start, lab) for p, lab in token_view.channel_marks(trace, tok, [step])],
                                 inserted=[(a - step.start, b - step.start, why) for a, b, why in token_view.inserted_marks(trace, [step])])
        if ids else token_view.empty_view("this step appended no tokens")
    )
    return header, text, toks, _step_json(step), _results_json(step)


def _download_file(trace: Trace | None, session: Session) -> str | None:
    if trace is None:
        return None
    from backend.trace import write_jsonl

    d = session.temp_dir("trace")  # the session's newest only; removed when it ends, or at shutdown
    path = os.path.join(d, trace_file_name(trace))
    write_jsonl([trace], path)
    return path


DOWNLOAD_OUTPUT = 9  # where show_trace's outputs hold the trace's download file


def show_trace(
    ctx: AppContext, session: Session, label: str | None, decode: str | None, *, step: int | None = None, note: str = "",
) -> list[Any]:
    """All outputs of :meth:`InspectorUI.trace_outputs` for trace ``label`` (a label that is not
    one of the session's traces shows the session's current one), with ``step`` selected when
    the trace has it (else :func:`default_step`)."""
    if label and label in session.traces:
        session.current = label
    label = session.current
    trace = session.get(label)
    bundle, tok_note = (None, "")
    if trace is not None:
        bundle, tok_note = ctx.trace_bundle(trace, decode)
    tok = bundle.tokenizer if bundle is not None else None
    if trace is None or step is None or not any(s.index == step for s in trace.steps):
        step = default_step(trace)
    tokens_html = (
        token_view.render_trace(trace, tok, prefix=PREFIX, note=tok_note, selected_step=step)
        if trace is not None and trace.input_ids else token_view.empty_view("no tokens in this trace")
    )
    return [
        gr.update(choices=list(session.traces), value=label),
        summary_html(label or "", trace, " · ".join(x for x in (tok_note, note) if x)),
        step_rows(trace),
        gr.update(choices=step_choices(trace), value=step),
        trace_to_chat(trace),
        tokens_html,
        charts.tokens_per_turn(trace),
        charts.step_timeline(trace),
        diagnostics_rows(trace, bundle),
        gr.update(value=_download_file(trace, session), interactive=trace is not None),
        *step_detail(trace, step, bundle),
    ]


def show_step(ctx: AppContext, session: Session, step: int | None, decode: str | None) -> tuple[str, str, str, str, str]:
    trace = session.get(session.current)
    bundle = ctx.trace_bundle(trace, decode)[0] if trace is not None else None
    return step_detail(trace, step, bundle)


def step_number(trace: Trace | None, value: Any) -> int | None:
    """A step index sent by the browser (a chip, a key, a link), if ``trace`` has that step."""
    if trace is None or isinstance(value, bool):
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*\d{1,9}\s*", value):
        value = int(value)
    if not isinstance(value, int):
        return None
    return value if any(s.index == value for s in trace.steps) else None


# the app's tabs (ui/__init__.py: gr.Tab ids), as a link may name them
TAB_IDS = ("playground", "inspector", "files", "lab")


def link_tab(params: Mapping[str, Any], linked: bool) -> str | None:
    """The tab a link opens: the one it names (``tab=``, written with the trace and step), else
    the Trace files tab for a link that names a GRPO group (``group=``), else the Inspector for a
    link that names a trace, else none (the app's default)."""
    tab = params.get("tab")
    if isinstance(tab, str) and tab in TAB_IDS:
        return tab
    if isinstance(params.get("group"), str) and params["group"].strip():
        return "files"  # a GRPO group (ui/grpo_groups.py) is shown in the Trace files tab
    return "inspector" if linked else None


def open_link(session: Session, params: Mapping[str, Any]) -> tuple[bool, int | None, str]:
    """The trace and step a link names (``?trace=<label>&step=<n>``, written by the Inspector as
    the selection changes): ``(linked, step, note)``. The label is visitor input: it only selects
    among the session's own traces (by label, else by trace id), and is never shown unescaped."""
    label = params.get("trace")
    if not isinstance(label, str) or not label.strip():
        return False, None, ""
    label = label[:2000]
    if label not in session.traces:
        by_id = next((lb for lb, t in session.traces.items() if t.id == label), None)
        if by_id is None:
            short = label if len(label) <= 80 else label[:79] + "…"
            return True, None, f"the link names a trace that is not in this session: {short!r}"
        label = by_id
    session.current = label
    raw = params.get("step")
    step = step_number(session.get(label), raw) if raw is not None else None
    note = "" if raw is None or step is not None else "the link's step is not in this trace: showing the default step"
    return True, step, note


# ---- browser side ------------------------------------------------------------------------------

# The step header's Copy buttons (ui/assets/inspector_copy.js), and the steps the browser asks
# for (a row of the step table, a chip or [ ] in the token view), written into one hidden textbox
# whose change event runs the handler (ui/assets/inspector_request.js): both the js_on_load of
# the step header. The request script also keeps the page's link (?trace=&step=&tab=, link.js) current.
COPY_JS = assets.read("inspector_copy.js")
REQUEST_JS = assets.read("link.js") + assets.fill(assets.read("inspector_request.js"), REQ=STEP_REQ_ID, PREFIX=PREFIX)

# After the selected step changed (any way: the dropdown, a table row, a chip or [ ] in the token
# view, a trace opened, a link): its anchor, chip and tokens highlighted in the token view (and
# scrolled to inside its box), its table row highlighted (a style rule by data-row, which
# survives the table's re-renders and virtual scrolling) and scrolled into the table's box, and
# the link updated (window.__aliLink, REQUEST_JS). An event's ``js=``.
SYNC_JS = assets.fill(assets.read("inspector_sync.js"), PREFIX=PREFIX)

# After a click on a table row: the step's details (the column under the table) come into view
# when less than about half of them is on screen. An event's ``js=``.
SHOW_DETAILS_JS = assets.read("inspector_show_details.js")

KEYS_HELP = ("Click a token (or tap it) to select it: the line above the tokens gives its index, id, bytes, mask and "
             "step. With the token box focused, **←** / **→** move to the previous / next token, **[** / **]** to "
             "the previous / next step, **Esc** clears. A step chip, a row of the step table and *Selected step* "
             "all select the same step; the page's address links to the trace and step shown.")


# ---- layout -------------------------------------------------------------------------------------


def _build_lens() -> LensUI:
    L = logprob_lens
    with gr.Accordion("Logprob lens: rollout vs trainer", open=True, elem_id="insp-lens"):
        gr.Markdown(L.HELP, elem_id="insp-lens-help")
        with gr.Row(equal_height=True):
            dtype = gr.Radio(list(L.DTYPE_CHOICES), value="float32", label="Trainer dtype", elem_id="insp-lens-dtype", scale=2)
            cap = gr.Number(value=L.DEFAULT_CAP, label="Truncation cap C", minimum=1.01, maximum=1e6, step=0.5,
                            elem_id="insp-lens-cap", scale=1)
            button = gr.Button("Score with trainer view", variant="primary", elem_id="insp-lens-score", scale=2)
        status = gr.HTML(L.status_html("info", "no trace"), elem_id="insp-lens-status")
        numbers = gr.HTML("", elem_id="insp-lens-numbers", css_template=L.CSS)
        with gr.Row():
            scatter = gr.Plot(label="rollout vs trainer logprob", show_label=False, elem_id="insp-lens-scatter")
            ratios = gr.Plot(label="ratio histogram", show_label=False, elem_id="insp-lens-ratios")
            per_step = gr.Plot(label="mean |Δ| per step", show_label=False, elem_id="insp-lens-steps")
        gr.Markdown("**Worst tokens** (mask 1, largest |Δ|; click one to select it in the token view)")
        worst = gr.HTML("", elem_id="insp-lens-worst", css_template=L.CSS, js_on_load=assets.fill(L.JS, VIEW="insp-tokens"))
    return LensUI(dtype, cap, button, status, numbers, scatter, ratios, per_step, worst)


def show_lens(ctx: AppContext, session: Session, decode: str | None, status: str | None = None) -> list[Any]:
    """The logprob lens's outputs (:meth:`LensUI.outputs`) for the session's current trace."""
    trace = session.get(session.current)
    bundle = ctx.trace_bundle(trace, decode)[0] if trace is not None else None
    tok = bundle.tokenizer if bundle is not None else None
    return logprob_lens.lens_view(trace, tok, session.lens_cap, status).values()


def _wire_lens(ctx: AppContext, session: gr.State, ui: InspectorUI) -> None:
    L = logprob_lens
    lens = ui.lens
    outputs = [session, *ui.trace_outputs(), *lens.outputs()]
    status_at = outputs.index(lens.status)

    async def on_score(sess: Session, dtype: str | None = "float32", step: int | None = None, decode: str | None = "auto"):
        label = sess.current
        trace = sess.get(label)

        def only_status(kind: str, text: str) -> list[Any]:
            out: list[Any] = [gr.update() for _ in outputs]
            out[0] = sess
            out[status_at] = L.status_html(kind, text)
            return out

        if trace is None:
            yield only_status("err", "no trace selected")
            return
        n = len(trace.input_ids)
        yield only_status("info", f"scoring {n:,} tokens with the trainer's view ({dtype or 'float32'}): loading the model "
                                  "on first use, then one forward pass…")
        try:
            scored = await L.score(ctx, trace, str(dtype or "float32"))
        except UserError as e:
            yield only_status("err", f"not scored: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a message, never a traceback
            yield only_status("err", f"not scored: {short_error(e)}")
            return
        if sess.get(label) is trace:  # the session's trace is replaced by the scored one (a new Trace)
            sess.traces[label] = scored
        st = L.compare(scored, sess.lens_cap).trace
        done = L.status_html("ok", f"scored {st.tokens:,} mask-1 tokens ({scored.scorer.dtype}): mean |Δ| {L.fmt('x', st.mean_abs_delta)}, "
                                   f"max |Δ| {L.fmt('x', st.max_abs_delta)}")
        yield [sess, *show_trace(ctx, sess, label, decode, step=step_number(scored, step)), *show_lens(ctx, sess, decode, done)]

    def on_cap(sess: Session, cap: Any, decode: str | None):
        try:
            sess.lens_cap = L.valid_cap(cap)
        except UserError as e:
            return show_lens(ctx, sess, decode, L.status_html("err", str(e)))
        return show_lens(ctx, sess, decode)

    # API name, kept stable: /inspector_score (dtype, step, decode) -> the trace's views (as
    # /inspector_open gives them), then the lens's
    lens.button.click(on_score, [session, lens.dtype, ui.step_dd, ui.decode_dd], outputs, api_name="inspector_score",
                      concurrency_limit=2)
    lens.cap.submit(on_cap, [session, lens.cap, ui.decode_dd], lens.outputs(), api_visibility="undocumented")
    lens.cap.blur(on_cap, [session, lens.cap, ui.decode_dd], lens.outputs(), api_visibility="undocumented")
    # whatever showed a trace (a pick, a link, a file, a run) rewrote the summary: the lens follows
    # (not among those events' outputs, whose positions API clients rely on)
    def lens_follows(sess: Session, decode: str | None = "auto"):
        return show_lens(ctx, sess, decode)

    # API name, kept stable: /inspector_lens (decode) -> the lens of the session's current trace as
    # it stands (status, numbers, three charts, worst tokens): a file's own rollout and trainer
    # logprobs with no scoring, a scored trace's, else the status saying what is missing
    ui.summary.change(lens_follows, [session, ui.decode_dd], lens.outputs(), api_name="inspector_lens")



def build(ctx: AppContext, session: gr.State) -> InspectorUI:
    with gr.Row():
        trace_dd = gr.Dropdown(label="Trace", choices=[], value=None, scale=4, elem_id="insp-trace")
        decode_dd = gr.Dropdown(label="Decode with", choices=DECODE_CHOICES, value="auto", scale=1, elem_id="insp-decode",
                                info="auto: the trace's tokenizer")
        download = gr.DownloadButton("Save trace (JSONL)", scale=1, elem_id="insp-download", interactive=False)
    summary = gr.HTML(summary_html("", None), elem_id="insp-summary")
    # tall enough for a typical trace's rows, wrapped, on a narrow window (300 px hid the last row)
    steps_df = gr.Dataframe(
        headers=STEP_COLUMNS, value=step_rows(None), interactive=False, label="Steps (click a row)",
        elem_id="insp-steps", wrap=True, max_height=640,
        column_widths=["5%", "12%", "9%", "6%", "6%", "22%", "9%", "9%", "22%"],
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, elem_id="insp-step-details"):
            step_dd = gr.Dropdown(label="Selected step", choices=[], value=None, elem_id="insp-step")
            step_header = gr.HTML(elem_id="insp-step-head", js_on_load=COPY_JS + REQUEST_JS)
            # where the browser asks for a step (REQUEST_JS); never shown
            step_req = gr.Textbox(value="", visible="hidden", elem_id=STEP_REQ_ID, show_label=False, container=False)
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
    gr.Markdown("### All tokens\nColour = mask: grey prompt, green generated (mask 1), orange injected (mask 0); "
                "violet frame = special token; underlined = the selected step. " + KEYS_HELP, elem_id="insp-tokens-help")
    tokens = gr.HTML(token_view.empty_view("no trace"), elem_id="insp-tokens", css_template=token_view.CSS, js_on_load=token_view.JS)
    lens = _build_lens()
    with gr.Row():
        plot_tokens = gr.Plot(label="Tokens per step", show_label=False, elem_id="insp-plot-tokens")
        plot_timeline = gr.Plot(label="Step timeline", show_label=False, elem_id="insp-plot-timeline")
    diagnostics = gr.Dataframe(headers=DIAG_COLUMNS, value=diagnostics_rows(None, None), interactive=False,
                               label="Diagnostics (backend.checks.diagnostics)", elem_id="insp-diagnostics", wrap=True,
                               column_widths=["8%", "16%", "58%", "6%", "6%", "6%"])

    ui = InspectorUI(trace_dd, decode_dd, summary, steps_df, step_dd, chat, step_header, step_text, step_tokens,
                     step_calls, step_results, tokens, plot_tokens, plot_timeline, diagnostics, download, lens)

    # the API's defaults are the page's (the dropdowns are filled per session, so a label or step
    # left out means what the page shows: the session's current trace, its default step)
    def on_trace(sess: Session, label: str | None = None, decode: str | None = "auto"):
        return [sess, *show_trace(ctx, sess, label, decode)]

    def on_step(sess: Session, step: int | None = None, decode: str | None = "auto"):
        return show_step(ctx, sess, step if step is not None else default_step(sess.get(sess.current)), decode)

    def select(sess: Session, step: int | None, decode: str | None):
        if step is None:
            return [gr.update(), *[gr.update() for _ in ui.step_outputs()]]
        return [gr.update(value=step), *show_step(ctx, sess, step, decode)]

    def on_request(sess: Session, request: str | None, decode: str | None):
        # "table:<step>:<n>" / "tokens:<step>:<n>", written by the page (REQUEST_JS): visitor input
        m = re.fullmatch(r"(table|tokens):(\d{1,9}):\d{1,12}", request or "")
        return select(sess, step_number(sess.get(sess.current), int(m.group(2))) if m else None, decode)

    # API name, kept stable (see ui/playground.py): /inspector_open (label, decode) -> the trace's
    # views (a label that is not in the caller's session shows the session's current trace)
    trace_dd.input(on_trace, [session, trace_dd, decode_dd], [session, *ui.trace_outputs()], api_name="inspector_open")
    decode_dd.input(on_trace, [session, trace_dd, decode_dd], [session, *ui.trace_outputs()], api_name="inspector_decode",
                    api_visibility="undocumented")
    # a quick series of selections (keys held, clicks in a row): the last one wins, none is dropped
    # (gradio's default trigger mode ignores an event while the previous one is running)
    step_dd.input(on_step, [session, step_dd, decode_dd], ui.step_outputs(), trigger_mode="always_last")
    step_req.change(on_request, [session, step_req, decode_dd], [step_dd, *ui.step_outputs()], trigger_mode="always_last",
                   api_visibility="undocumented").then(None, [step_req], None, js=SHOW_DETAILS_JS)
    _wire_lens(ctx, session, ui)
    # whatever changed them (a user or a handler): highlight, scroll, link
    step_dd.change(None, [trace_dd, step_dd], None, js=SYNC_JS)
    trace_dd.change(None, [trace_dd, step_dd], None, js=SYNC_JS)
    return ui
