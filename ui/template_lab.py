"""Template lab: render messages + tools through one or two chat templates, see the text with
special tokens marked, the tokens, the token counts and a diff of the two texts."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

import gradio as gr

from backend.checks import seqdiff
from ui import token_view
from ui.context import AppContext, UserError, short_error

OWN = "(tokenizer's own)"
CUSTOM = "custom (text below)"

EXAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Seattle?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}}]},
    {"role": "tool", "name": "get_current_temperature", "content": "{\"temperature\": 72, \"city\": \"Seattle, WA, USA\"}"},
    {"role": "assistant", "content": "The current temperature in Seattle, WA, USA is 72°F."},
]
EXAMPLE_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get current temperature at a location.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The location, as \"City, State, Country\"."}},
                       "required": ["city"]},
    },
}]


@dataclass
class Side:
    tokenizer: gr.Dropdown
    template: gr.Dropdown
    custom: gr.Code
    summary: gr.HTML
    text: gr.HTML
    tokens: gr.HTML


@dataclass
class TemplateLabUI:
    messages: gr.Code
    tools: gr.Code
    gen_prompt: gr.Checkbox
    kwargs: gr.Textbox
    compare: gr.Checkbox
    render_btn: gr.Button
    left: Side
    right: Side
    diff: gr.HTML
    right_col: gr.Column


def _template_choices() -> list[str]:
    from backend.loading.tokenizers import trl_template_names

    return [OWN, CUSTOM, *trl_template_names()]


def parse_json(text: str, what: str, kind: type) -> Any:
    from backend.safety.trust import VisitorInputError, check_text

    try:
        text = check_text(text, what).strip()
    except VisitorInputError as e:
        raise UserError(str(e)) from None
    if not text:
        return kind()
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(v, kind):
        raise UserError(f"{what} must be a JSON {'list' if kind is list else 'object'}")
    return v


def render_one(ctx: AppContext, tokenizer: str, template: str, custom: str, messages: list, tools: list, gen_prompt: bool,
               kwargs: dict, prefix: str) -> tuple[str, str, str, Any]:
    """(summary html, text html, tokens html, Rendering or None)."""
    from backend.tokens.rendering import render

    try:
        if not tokenizer:
            raise UserError("choose a tokenizer")
        # visitor input: what may be named is the trust policy's to say (public / local mode)
        if template == CUSTOM:
            if not (custom or "").strip():
                raise UserError("the custom template is empty")
            bundle = ctx.visitor_bundle(tokenizer, custom)
        elif template and template != OWN:
            bundle = ctx.visitor_bundle(tokenizer, template)
        else:
            bundle = ctx.visitor_bundle(tokenizer)
        r = render(bundle, messages, tools or None, add_generation_prompt=gen_prompt, chat_template_kwargs=kwargs, spans=False)
    except Exception as e:  # noqa: BLE001 - any failure is shown, never raised
        msg = html.escape(short_error(e))
        err = f'<div class="ali-err">{msg}</div>'
        return err, token_view.empty_view("no rendering"), token_view.empty_view("no tokens"), None
    n_chars = len(r.text)
    summary = (f'<div class="ali-ok"><b data-count="tokens">{len(r.token_ids)}</b> tokens · {n_chars} characters · '
               f'template <code>{html.escape(bundle.template_name)}</code> (sha {bundle.template_sha256[:12]}) · parser '
               f'{html.escape(bundle.parser)}</div>')
    for w in bundle.template_warnings():  # a template that does not fit the tokenizer: never silent
        summary += f'<div class="ali-warn" data-warning="template-fit">{html.escape(w)}</div>'
    for w in r.notes:  # content parts the rendering does not show (an image given to a text template)
        summary += f'<div class="ali-warn" data-warning="content-part">{html.escape(w)}</div>'
    text = token_view.mark_special_text(r.text, bundle.tokenizer)
    kinds = [token_view.PROMPT] * len(r.token_ids)
    toks = token_view.render_tokens(r.token_ids, kinds, bundle.tokenizer, prefix=prefix)
    return summary, text, toks, r


def diff_html(a: str, b: str, name_a: str = "left", name_b: str = "right") -> str:
    """Line diff of two rendered texts; changed lines also get a character-level highlight."""
    if a == b:
        return '<div class="ali-ok">The two renderings are identical.</div>'
    al, bl = a.splitlines(keepends=True), b.splitlines(keepends=True)
    out: list[str] = []
    # bounded time on huge renders: paragraphs first (cut at blank lines), then lines
    for tag, i1, i2, j1, j2 in seqdiff.opcodes(al, bl, cut_after=lambda line: not line.strip()):
        if tag == "equal":
            block = al[i1:i2]
            if len(block) > 6:
                out += [_line(" ", x) for x in block[:2]]
                out.append(f'<div class="d-skip">… {len(block) - 4} unchanged lines …</div>')
                out += [_line(" ", x) for x in block[-2:]]
            else:
                out += [_line(" ", x) for x in block]
        elif tag == "replace" and (i2 - i1) == (j2 - j1):
            for x, y in zip(al[i1:i2], bl[j1:j2]):
                dx, dy = _char_diff(x, y)
                out.append(f'<div class="d-del">- {dx}</div>')
                out.append(f'<div class="d-add">+ {dy}</div>')
        else:
            out += [_line("-", x) for x in al[i1:i2]]
            out += [_line("+", y) for y in bl[j1:j2]]
    head = f'<div class="d-head">--- {html.escape(name_a)}<br>+++ {html.escape(name_b)}</div>'
    return f'<div class="ali-diff">{head}{"".join(out)}</div>'


def _vis(s: str) -> str:
    return html.escape(s.replace("\n", "↵"), quote=False)


def _line(sign: str, s: str) -> str:
    cls = {" ": "d-eq", "-": "d-del", "+": "d-add"}[sign]
    return f'<div class="{cls}">{sign} {_vis(s)}</div>'


def _char_diff(x: str, y: str) -> tuple[str, str]:
    ox, oy = [], []
    for tag, i1, i2, j1, j2 in seqdiff.opcodes(x, y):  # a 1 MB line differing in one place stays fast
        if tag == "equal":
            ox.append(_vis(x[i1:i2]))
            oy.append(_vis(y[j1:j2]))
        else:
            if i2 > i1:
                ox.append(f"<mark>{_vis(x[i1:i2])}</mark>")
            if j2 > j1:
                oy.append(f"<mark>{_vis(y[j1:j2])}</mark>")
    return "".join(ox), "".join(oy)


def run_lab(ctx: AppContext, messages_text: str, tools_text: str, gen_prompt: bool, kwargs_text: str, compare: bool,
            ltok: str, ltpl: str, lcustom: str, rtok: str, rtpl: str, rcustom: str) -> list[Any]:
    try:
        messages = parse_json(messages_text, "messages", list)
        tools = parse_json(tools_text, "tools", list)
        kwargs = parse_json(kwargs_text, "chat_template_kwargs", dict)
    except UserError as e:
        err = f'<div class="ali-err">{html.escape(str(e))}</div>'
        empty = token_view.empty_view("fix the input first")
        return [err, empty, empty, "", empty, empty, ""]
    ls, lt, lk, lr = render_one(ctx, ltok, ltpl, lcustom, messages, tools, gen_prompt, kwargs, "labL")
    if not compare:
        return [ls, lt, lk, "", token_view.empty_view(""), token_view.empty_view(""), ""]
    rs, rt, rk, rr = render_one(ctx, rtok, rtpl, rcustom, messages, tools, gen_prompt, kwargs, "labR")
    if lr is not None and rr is not None:
        counts = (f'<div class="ali-kvs"><div class="ali-kv"><span>left tokens</span><b data-field="left tokens">{len(lr.token_ids)}</b></div>'
                  f'<div class="ali-kv"><span>right tokens</span><b data-field="right tokens">{len(rr.token_ids)}</b></div>'
                  f'<div class="ali-kv"><span>difference</span><b>{len(rr.token_ids) - len(lr.token_ids):+d}</b></div></div>')
        d = counts + diff_html(lr.text, rr.text, f"{ltok} / {ltpl}", f"{rtok} / {rtpl}")
    else:
        d = '<div class="ali-warn">Both sides must render to compare them.</div>'
    return [ls, lt, lk, rs, rt, rk, d]


def tokenizer_choices(ctx: AppContext) -> list[str]:
    """What a tokenizer field lists: the offline profiles and the model's own tokenizer."""
    from backend.families import PROFILES

    names = list(PROFILES)
    own = ctx.model_tokenizer_name()
    if own and own not in names:
        names.append(own)
    return names


def _side(ctx: AppContext, label: str, tok: str, tpl: str, prefix: str) -> Side:
    from backend.loading.tokenizers import families_line

    public = ctx.trust.public
    with gr.Row():
        # a public server loads only what it lists; a local one also what its user types
        t = gr.Dropdown(tokenizer_choices(ctx), value=tok, allow_custom_value=not public,
                        label=f"{label}: tokenizer" + ("" if public else " (profile, hub id or path)"), elem_id=f"{prefix}-tok",
                        info="by family: " + families_line())
        p = gr.Dropdown(_template_choices(), value=tpl, label=f"{label}: template", elem_id=f"{prefix}-tpl")
    # an initial value (empty), so the API documents the box as optional, as it is on the page
    c = gr.Code("", language="jinja2", label=f"{label}: custom template (used when template = custom): Jinja text"
                + ("" if public else " or a file path"), lines=4, max_lines=16,
                elem_id=f"{prefix}-custom")
    s = gr.HTML(elem_id=f"{prefix}-summary")
    with gr.Tabs():
        with gr.Tab("Text"):
            x = gr.HTML(token_view.empty_view("press Render"), css_template=token_view.CSS, js_on_load=None, elem_id=f"{prefix}-text")
        with gr.Tab("Tokens"):
            k = gr.HTML(token_view.empty_view("press Render"), css_template=token_view.CSS, js_on_load=token_view.JS, elem_id=f"{prefix}-tokens")
    return Side(t, p, c, s, x, k)


def build(ctx: AppContext) -> TemplateLabUI:
    with gr.Row():
        with gr.Column(scale=3):
            messages = gr.Code(json.dumps(EXAMPLE_MESSAGES, ensure_ascii=False, indent=2), language="json", label="messages (HF chat format)",
                               lines=12, max_lines=30, elem_id="lab-messages")
        with gr.Column(scale=2):
            tools = gr.Code(json.dumps(EXAMPLE_TOOLS, indent=2), language="json", label="tools (JSON schemas)", lines=12, max_lines=30,
                            elem_id="lab-tools")
    with gr.Row():
        gen_prompt = gr.Checkbox(False, label="add_generation_prompt", elem_id="lab-genprompt")
        kwargs = gr.Textbox('{"enable_thinking": false}', label="chat_template_kwargs (JSON)", elem_id="lab-kwargs")
        compare = gr.Checkbox(True, label="compare two templates side by side", elem_id="lab-compare")
        render_btn = gr.Button("Render", variant="primary", elem_id="lab-render")
    with gr.Row(equal_height=False):
        with gr.Column():
            left = _side(ctx, "A", "qwen3", OWN, "labA")
        with gr.Column() as right_col:
            right = _side(ctx, "B", "qwen3", "qwen3" if "qwen3" in _template_choices() else OWN, "labB")
    gr.Markdown("### Diff (A → B)")
    diff = gr.HTML(elem_id="lab-diff")
    ui = TemplateLabUI(messages, tools, gen_prompt, kwargs, compare, render_btn, left, right, diff, right_col)
    inputs = [messages, tools, gen_prompt, kwargs, compare, left.tokenizer, left.template, left.custom, right.tokenizer,
              right.template, right.custom]
    outputs = [left.summary, left.text, left.tokens, right.summary, right.text, right.tokens, diff]
    render_btn.click(lambda *a: run_lab(ctx, *a), inputs, outputs, concurrency_limit=ctx.concurrency_limit, concurrency_id="lab",
                     api_name="template_lab_render")
    compare.change(lambda c: gr.update(visible=c), [compare], [right_col])
    return ui
