"""The Inspector's pure functions (issue 12, "what the inspector says"), in-process: the palette's
contrast ratios in both themes, the legend's labels, the token view's selection markup, where an
imported trace's ids came from (no ``?`` placeholders), the Copy buttons' lists, links (the
trace and step a query string names, among the session's own traces only), and the CSS / JS files
(``ui/assets/``) with their placeholders filled.

What only a browser shows (colours as rendered, clicks, keys, the clipboard, the address) is in
``tests/test_browser_inspector.py``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from backend.importers import import_file
from backend.loading.tokenizers import load_tokenizer
from backend.trace import load_traces
from ui import inspector, theme
from ui import token_view as tv
from ui.context import SAMPLE_DIR, AppContext, load_samples, new_session

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = ROOT / "tests" / "data" / "import"


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def weather():
    return load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0]


def _lum(hex_color: str) -> float:
    r, g, b = (int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    f = lambda c: c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4  # noqa: E731
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b)


def contrast(a: str, b: str) -> float:
    x, y = sorted((_lum(a), _lum(b)), reverse=True)
    return (x + 0.05) / (y + 0.05)


# text colour -> the backgrounds it is drawn on
PAIRS = {
    "p-fg": ["p0", "p1"], "g-fg": ["g0", "g1"], "j-fg": ["j0", "j1"],
    "sp-fg": ["p0", "p1", "g0", "g1", "j0", "j1", "tv-bg"], "ws": ["p0", "p1", "g0", "g1", "j0", "j1"],
    "ctl": ["p0", "p1", "g0", "g1", "j0", "j1"], "tv-fg": ["tv-bg"], "subdued": ["tv-bg"], "mark-fg": ["mark-bg", "mark-sel-bg"],
    "chip-fg": ["chip-bg"], "chip-sel-fg": ["chip-sel-bg"], "row-sel-fg": ["row-sel-bg"], "warn-fg": ["warn-bg"],
    "err-fg": ["err-bg"], "ok-fg": ["ok-bg"], "info-fg": ["info-bg"], "tsp-fg": ["tsp-bg"], "del-fg": ["del-bg"],
    "add-fg": ["add-bg"], "hl-fg": ["hl-bg"],
}


@pytest.mark.parametrize("side", [0, 1], ids=["light", "dark"])
def test_palette_text_has_wcag_contrast_on_its_backgrounds(side):
    p = theme.PALETTE
    bad = [(fg, bg, round(contrast(p[fg][side], p[bg][side]), 2)) for fg, bgs in PAIRS.items() for bg in bgs
           if contrast(p[fg][side], p[bg][side]) < 4.5]
    assert not bad, bad
    # the step underline and the selected-token outline are graphics: 3:1 on the tokens
    for mark in ("step-sel", "tok-sel"):
        for bg in ("p0", "p1", "g0", "g1", "j0", "j1", "tv-bg"):
            assert contrast(p[mark][side], p[bg][side]) >= 3, (mark, bg)


def test_chart_colours_hold_3_to_1_on_both_backgrounds():
    for name, c in theme.CHART.items():
        for page in ("#ffffff", theme.PALETTE["tv-bg"][1], "#0b0f19"):
            assert contrast(c, page) >= 3, (name, c, page)


def test_css_variables_cover_both_themes():
    css = theme.css_variables()
    assert css.count("--ali-p0:") == 2 and css.startswith(":root {") and "\n.dark {" in css
    used = set(re.findall(r"var\(--ali-([a-z0-9-]+)\)", tv.CSS))
    assert used and used <= set(theme.PALETTE), used - set(theme.PALETTE)
    import ui

    used = set(re.findall(r"var\(--ali-([a-z0-9-]+)\)", ui.CSS + inspector.SYNC_JS))
    assert used <= set(theme.PALETTE), used - set(theme.PALETTE)
    # no fixed colour left in the token view's CSS: every one follows the theme
    assert not re.findall(r"#[0-9a-fA-F]{3,8}\b", tv.CSS)


def test_css_and_js_are_files_with_their_placeholders_filled():
    """The CSS and JS live in ui/assets/ (issue 24): read once at import, a file's leading comment
    (for its readers) not sent, every ``{{NAME}}`` filled from Python, a value missing or without a
    placeholder refused."""
    import ui
    from ui import assets, logprob_lens

    files = sorted(p.name for p in assets.FOLDER.iterdir() if p.suffix in (".css", ".js"))
    assert {"app.css", "token_view.css", "token_view.js", "logprob_lens.js"} <= set(files)
    for name in files:
        text = assets.read(name)
        assert text.strip() and not text.startswith(("/*", "//")), name
    sent = [ui.CSS, tv.CSS, tv.JS, logprob_lens.CSS, inspector.COPY_JS, inspector.REQUEST_JS, inspector.SYNC_JS,
            inspector.SHOW_DETAILS_JS]
    assert all("{{" not in text for text in sent)
    assert "${" not in tv.CSS + logprob_lens.CSS  # css_template is a template
    assert f"#{inspector.STEP_REQ_ID} textarea" in inspector.REQUEST_JS and "e.detail.view === 'insp')" in inspector.REQUEST_JS
    assert "fromServer('insp', step)" in inspector.SYNC_JS
    assert "document.querySelector('#insp-tokens .tv')" in assets.fill(logprob_lens.JS, VIEW="insp-tokens")
    with pytest.raises(ValueError):
        assets.fill(logprob_lens.JS)
    with pytest.raises(ValueError):
        assets.fill(logprob_lens.JS, VIEW="insp-tokens", PREFIX="insp")

def test_legend_says_each_kind_once(qwen):
    markup = tv.render_tokens([1, 2, 3], [tv.PROMPT, tv.GENERATED, tv.INJECTED], qwen.tokenizer)
    keys = re.findall(r'<span class="tv-key[^"]*"[^>]*>(.*?)</span>', markup)
    text = [re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", k))).strip() for k in keys]
    assert text == ["prompt 1", "generated (mask 1) 1", "injected (mask 0) 1", "special 0", "total 3"], text
    assert "prompt (prompt)" not in markup


def test_token_view_marks_the_selected_step_and_documents_its_keys(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer, prefix="insp", selected_step=2)
    assert 'data-sel="2"' in markup
    assert re.search(r'<button type="button" class="tv-jump sel" data-jump="insp-step-2" data-step="2" aria-pressed="true"', markup)
    assert markup.count("tv-jump sel") == 1 and markup.count('class="tv-mark sel"') == 1
    assert "[ ] step" in markup and "← → token" in markup and "b.tabIndex = 0" in tv.JS  # the box takes the focus
    # no step selected (or one without tokens): nothing marked
    plain = tv.render_trace(weather, qwen.tokenizer, prefix="insp", selected_step=4)
    assert "data-sel" not in plain and " sel" not in re.sub(r'class="tv-ws-label"', "", plain).replace("tv-ws-toggle", "")
    # a step's own view: positions in the trace and the step
    one = tv.render_tokens(weather.input_ids[178:203], [tv.GENERATED] * 25, qwen.tokenizer, first_index=178, step_index=1)
    assert 'data-first="178"' in one and 'data-step="1"' in one


def _fields(summary: str) -> dict[str, str]:
    return {html.unescape(k): html.unescape(v) for k, v in re.findall(r'data-field="([^"]*)">([^<]*)</b>', summary)}


@pytest.mark.parametrize("name", ["agents_sdk_run.json", "openai_chat.jsonl", "sharegpt.jsonl", "verl_agent_loop.jsonl",
                                  "verl_rollout_dump.jsonl"])
def test_imported_trace_summary_says_where_ids_came_from(qwen, name):
    res = import_file(str(IMPORTS / name), bundle=qwen)
    assert res.traces
    for t in res.traces:
        summary = inspector.summary_html(f"file · {name} · {t.id}", t)
        fields = _fields(summary)
        assert fields and not [k for k, v in fields.items() if v.strip() == "?" or " ? " in f" {v} " or "/ ?" in v], fields
        assert fields["termination"] and fields["source"] == t.metadata["source"]
        badges = dict(re.findall(r'data-badge="(\w+)"[^>]*>([^<]*)<', summary))
        lead = "imported from " + {"agents-sdk": "OpenAI Agents SDK", "openai-chat": "OpenAI chat completions", "sharegpt": "ShareGPT",
                                   "verl": "verl"}[t.metadata["source"]]
        if t.metadata.get("ids") == "rendered":
            assert badges.get("warn", "").startswith(f"{lead}, re-rendered with qwen3 / qwen3_instruct_2507"), badges
        else:
            assert t.metadata.get("ids") == "given" and badges.get("ok") == f"{lead}, token ids as recorded in the source", badges
        if t.metadata.get("mask") == "assumed":
            assert "mask assumed: all 1" in summary


def test_source_model_where_known(qwen, weather):
    chat = import_file(str(IMPORTS / "openai_chat.jsonl"), bundle=qwen).traces[0]
    assert inspector.source_model(chat) == "qwen3"
    assert inspector.source_model(weather) == "none (scripted replay)"
    t = weather.model_copy(update={"metadata": {"generator": {"backend": "vllm", "model": "Qwen/Qwen3-4B"}}})
    assert inspector.source_model(t) == "Qwen/Qwen3-4B" and _fields(inspector.summary_html("x", t))["model"] == "Qwen/Qwen3-4B"
    bare = weather.model_copy(update={"metadata": {}, "tokenizer": weather.tokenizer.model_copy(update={"name": None, "template": None})})
    fields = _fields(inspector.summary_html("x", bare))
    assert "model" not in fields and fields["source"] == "not recorded" and fields["tokenizer"] == "not recorded"
    assert fields["parser"] == "not recorded" and "?" not in "".join(fields.values())


def test_summary_escapes_new_fields(weather):
    payload = '<img src=x onerror="alert(1)">'
    t = weather.model_copy(update={"metadata": {"ids": "none", "render_error": payload, "model": payload, "source": payload}})
    s = inspector.summary_html(payload, t, note=payload)
    assert "<img" not in s and s.count(html.escape(payload)) >= 4


def test_copy_lists_are_the_steps_ids_and_mask(weather):
    for step in weather.steps:
        ids, mask = inspector.step_ids_and_mask(weather, step)
        assert ids == weather.input_ids[step.start : step.end] and len(mask) == len(ids)
        if step.state == "generating":
            assert mask == [1] * len(ids)
        elif step.state in ("pending", "processing_tools"):
            assert mask == [0] * len(ids)
    header = inspector.step_detail(weather, 2, None)[0]
    copies = {k: json.loads(html.unescape(v)) for k, v in re.findall(r'data-what="([^"]+)" data-copy="([^"]*)"', header)}
    s = weather.steps[2]
    assert copies == {"token ids": weather.input_ids[s.start : s.end], "mask": [0] * (s.end - s.start)}
    assert "ali-copy" not in inspector.step_detail(weather, 4, None)[0]  # no tokens, nothing to copy


def test_open_link_selects_only_the_sessions_own_traces(ctx):
    sess = new_session(ctx)
    label, t = ctx.samples[1]
    assert inspector.open_link(sess, {}) == (False, None, "")
    assert inspector.open_link(sess, {"trace": label, "step": "2"}) == (True, 2, "") and sess.current == label
    # by trace id; a step the trace lacks, or that is no number, is refused with a note
    first_label, first = ctx.samples[0]
    linked, step, note = inspector.open_link(sess, {"trace": first.id, "step": "99"})
    assert (linked, step, sess.current) == (True, None, first_label) and "not in this trace" in note
    assert inspector.open_link(sess, {"trace": first.id, "step": "<script>"})[1] is None
    # a label the session does not have: nothing selected, a note quoting it (escaped when shown)
    sess.current = first_label
    linked, step, note = inspector.open_link(sess, {"trace": "<img src=x onerror=alert(1)>" + "x" * 200})
    assert linked and step is None and sess.current == first_label and "not in this session" in note and len(note) < 160
    out = inspector.show_trace(ctx, sess, sess.current, "auto", step=step, note=note)
    assert "<img" not in out[1] and "&lt;img" in out[1]
    # show_trace selects the linked step: dropdown, token view and details
    out = inspector.show_trace(ctx, sess, label, "auto", step=2)
    assert out[3]["value"] == 2 and 'data-sel="2"' in out[5] and "<b>Step 2</b>" in out[-5]
    # the tab a link opens: the one it names, else the Inspector for a trace link, else none
    assert inspector.link_tab({"tab": "playground", "trace": "x"}, True) == "playground"
    assert inspector.link_tab({"tab": "<b>"}, True) == "inspector" and inspector.link_tab({}, False) is None
    assert inspector.step_number(t, True) is None and inspector.step_number(t, " 3 ") == 3 and inspector.step_number(t, 3.0) is None


def test_a_repaired_call_is_shown_as_kept_not_as_an_error():
    """A call the parser kept after a repair (severity warning) is said so in the step table, the
    step header and the chat; a real parse error stays an error."""
    from backend.trace import ParseError, Step, Trace
    from ui import chat, inspector

    warn = ParseError(message="no arguments: read as {}", span=[0, 10], raw='{"name": "f"}', severity="warning")
    bad = ParseError(message="invalid JSON", span=[11, 20], raw="{oops", severity="error")
    steps = [Step(index=0, state="pending", start=0, end=1),
             Step(index=1, state="generating", start=1, end=3, mask=1, text="x", parse_errors=[warn, bad], messages_added=[1])]
    t = Trace(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], prompt_ids=[1],
              response_ids=[2, 3], response_mask=[1, 1], steps=steps)
    row = inspector.step_rows(t).iloc[1].to_dict()
    text = json.dumps(row, default=str)
    assert "repaired: no arguments" in text and "parse: invalid JSON" in text
    header = inspector.step_detail(t, 1, None)[0]
    assert re.search(r'class="ali-warn">repaired call \(kept\): no arguments', header)
    assert re.search(r'class="ali-err">parse error: invalid JSON', header)
    titles = [m.get("metadata", {}).get("title") for m in chat.trace_to_chat(t)]
    assert "Repaired tool call (kept)" in titles and "Malformed tool call" in titles
