"""The Inspector in a real browser (issue 12, "what the inspector says"): the real app
(``app.py --backend scripted``) in headless Chromium, with the fixtures of ``tests/test_browser.py``
(one app and one browser for this module, a fresh browser context per test).

* both themes (``color_scheme`` light and dark, as the OS sets it): the WCAG contrast ratio of text
  against its background, measured with getComputedStyle, for every kind of token, chip, legend
  item, step anchor, status box, the template text, the template lab's diff, the summary and the
  charts' text and bars;
* step navigation: the step table shows its last row, and a row, a chip, ``[`` / ``]`` in the token
  view and *Selected step* select the same step (row highlighted, tokens underlined, details in
  view, the dropdown following);
* tokens by click, tap and keys (index, id, bytes, mask and step in the info line);
* imported traces say where their ids came from; no ``?`` placeholders;
* links: the trace and step go into the address, and a link reopens them (visitor input: only the
  session's own traces, escaped);
* Copy token ids / Copy mask put the step's JSON lists on the clipboard;
* the legend no longer says "prompt (prompt)".

Every wait is on a condition (a text, an element, a class), never a sleep; no timing assertion.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from test_browser import (  # noqa: F401 - fixtures, used by name
    CHROMIUM,
    IMG,
    NAME,
    PAYLOAD,
    SCRIPT,
    VISIBLE,
    App,
    shots,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (install it with: bash scripts/setup.sh --browser)"),
]

ROOT = Path(__file__).resolve().parent.parent
WEATHER = "sample · 01_weather · weather in Seattle (seed 001)"
PARALLEL = "sample · 02_parallel_calls · two tool calls in one turn"


@pytest.fixture
def open_app(browser, app_url):  # noqa: F811 - the fixtures above
    """``open_app(scheme="light", width=1400, height=1000, **context_options)``: a new browser
    context (a new Gradio session) on the app, in that colour scheme."""
    contexts = []

    def make(scheme: str = "light", width: int = 1400, height: int = 1000, **kw) -> App:
        ctx = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme, **kw)
        contexts.append(ctx)
        return App(ctx.new_page(), app_url)

    yield make
    for c in contexts:
        c.close()


def step_value(app: App) -> str:
    return app.js("document.querySelector('#insp-step input').value")


def wait_step(app: App, n: int) -> None:
    app.page.wait_for_function("(n) => document.querySelector('#insp-step input').value.startsWith(n + ' · ')", arg=n)
    app.wait_text("#insp-step-head", f"Step {n}")


def selected_row(app: App) -> list[int]:
    """Rows of the step table drawn with the selected-row background."""
    return app.js("""() => {
      const want = getComputedStyle(document.body).getPropertyValue('--ali-row-sel-bg').trim();
      const probe = document.createElement('div'); probe.style.background = want; document.body.appendChild(probe);
      const rgb = getComputedStyle(probe).backgroundColor; probe.remove();
      return Array.from(document.querySelectorAll('#insp-steps .body-cell[data-col="1"]'))
        .filter((c) => getComputedStyle(c).backgroundColor === rgb).map((c) => +c.dataset.row);
    }""")


def wait_row(app: App, row: int) -> None:
    app.page.wait_for_function(
        "(r) => { const s = document.getElementById('ali-step-row-style'); return !!s && s.textContent.includes('[data-row=\"' + r + '\"]'); }",
        arg=row)
    assert selected_row(app) == [row]


def open_row(app: App, trace_id: str) -> None:
    """Open, from the Trace files table, the row of the trace with this id (whatever its column)."""
    find = ("(id) => { const c = Array.from(document.querySelectorAll('#tf-table [data-row][data-col]'))"
            ".find((e) => e.textContent.trim() === id); return c ? [+c.dataset.row, +c.dataset.col] : null; }")
    app.page.wait_for_function(find, arg=trace_id)
    row, col = app.js(find, trace_id)
    app.cell("tf-table", row, col).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")


def sample_trace(label: str):
    from backend.trace import load_traces

    stem = label.split(" · ")[1]
    return load_traces(str(ROOT / "sample_traces" / f"{stem}.jsonl")).traces[0]


# ---- contrast in both themes ------------------------------------------------------------------------

# WCAG 2 contrast of every text (and, for charts' bars and whitespace markers, graphic) element of
# ours: its colour (text alpha composited) against the background actually under it (the first
# opaque background up its ancestors, translucent ones composited on top).
CONTRAST_JS = r"""
(targets) => {
  const parse = (c) => {
    if (!c || c === 'none' || c === 'transparent') return [0, 0, 0, 0];
    let m = c.match(/^rgba?\(([^)]+)\)$/);
    if (m) { const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(parseFloat); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; }
    m = c.match(/^color\(srgb ([^)]+)\)$/);
    if (m) { const p = m[1].split(/[\s\/]+/).filter(Boolean).map(parseFloat); return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1]; }
    return null;
  };
  const svgFill = (el) => { const cs = getComputedStyle(el), c = parse(cs.fill);
                            return c ? [c[0], c[1], c[2], c[3] * parseFloat(cs.fillOpacity || '1')] : null; };
  const over = (top, under) => { const a = top[3]; return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat([1]); };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                       return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const background = (el, top = []) => {
    const layers = top.filter((c) => c && c[3] > 0).reverse();
    for (let n = el; n && n.nodeType === 1; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (layers.length && layers[layers.length - 1][3] >= 1) break;
      if (c && c[3] > 0) layers.push(c);
    }
    let bg = [255, 255, 255, 1];
    if (!layers.length || layers[layers.length - 1][3] < 1) {
      const page = parse(getComputedStyle(document.documentElement).backgroundColor);
      if (page && page[3] >= 1) bg = page;
    }
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const out = [];
  for (const t of targets) {
    const els = Array.from(document.querySelectorAll(t.sel)).slice(0, t.max || 6);
    if (!els.length) { out.push({what: t.what, sel: t.sel, missing: true}); continue; }
    for (const el of els) {
      const cs = getComputedStyle(el, t.pseudo || null);
      // a plot's text and bars lie on its paper (the first svg's background) and, for bars, its
      // plot area (rect.bg), over whatever is under the plot
      const plot = t.svg ? el.closest('.js-plotly-plot') : null;
      const top = plot ? [parse(getComputedStyle(plot.querySelector('.main-svg')).backgroundColor)] : [];
      const area = plot && t.plotArea ? plot.querySelector('.bglayer .bg') : null;
      if (area) top.push(svgFill(area));
      const bg = background(t.bg ? el.closest(t.bg) || el : (plot || el), top);
      let fg = t.svg ? svgFill(el) : parse(cs.color);
      if (!fg) { out.push({what: t.what, sel: t.sel, unparsed: t.svg ? cs.fill : cs.color}); continue; }
      fg = over(fg, bg);
      const size = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight, 10) >= 700;
      const need = t.need || ((size >= 24 || (size >= 18.66 && bold)) ? 3 : 4.5);
      out.push({what: t.what, sel: t.sel, ratio: Math.round(ratio(fg, bg) * 100) / 100, need,
                fg: cs.color, fill: cs.fill, bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')',
                text: (el.textContent || '').slice(0, 30)});
    }
  }
  return out;
}
"""

# Status boxes and diff lines of every kind, with the children the app puts in them, placed in a
# gr.HTML (prose) container of the page so that Gradio's own rules apply to them as to the real ones.
SWATCHES = """
<div id="ali-swatches">
  <div class="ali-ok">ok <b>12</b> tokens</div><div class="ali-warn">warn <b>w</b></div>
  <div class="ali-err">err <code>e</code></div><div class="ali-info">info <b>i</b></div><div class="ali-note">note <b>n</b></div>
  <div class="ali-diff"><div class="d-head">--- a</div><div class="d-eq">  same</div><div class="d-del">- old<mark>x</mark></div>
  <div class="d-add">+ new<mark>y</mark></div><div class="d-skip">… 3 unchanged lines …</div></div>
</div>
"""

# token kinds that a sample may not have: synthetic tokens of each kind, special or not, with an
# escaped control byte, appended to a real chunk of the token view (its CSS applies)
TOKEN_SWATCHES = "".join(
    f'<span class="{k}{p}{s} ali-swatch">x<i class=wc>\\x00</i><i class=wn></i>\n</span>'
    for k in "pgj" for p in "01" for s in ("", " s"))


def contrast_targets() -> list[dict]:
    t = []
    for k in "pgj":
        for p in "01":
            t.append({"what": f"token {k}{p}", "sel": f"#insp-tokens .tv-c > span.{k}{p}:not(.s)", "max": 3})
            t.append({"what": f"special token {k}{p}", "sel": f"#insp-tokens .tv-c > span.{k}{p}.s", "max": 3})
            t.append({"what": f"control byte in {k}{p}", "sel": f"#insp-tokens .tv-c > span.{k}{p} i.wc", "max": 2})
            t.append({"what": f"newline marker in {k}{p}", "sel": f"#insp-tokens .tv-c > span.{k}{p} i.wn", "pseudo": "::before",
                      "bg": "span", "max": 2})
    t += [
        {"what": "token of the selected step", "sel": "#insp-tokens .tv-c > span.tv-in-sel", "max": 3},
        {"what": "selected token", "sel": "#insp-tokens .tv-c > span.tv-tok-sel"},
        {"what": "legend item", "sel": "#insp-tokens .tv-key", "max": 10},
        {"what": "legend note", "sel": "#insp-tokens .tv-key small", "max": 10},
        {"what": "legend count", "sel": "#insp-tokens .tv-key b", "max": 10},
        {"what": "step chip", "sel": "#insp-tokens .tv-jump:not(.sel)", "max": 10},
        {"what": "step chip count", "sel": "#insp-tokens .tv-jump small", "max": 10},
        {"what": "selected step chip", "sel": "#insp-tokens .tv-jump.sel"},
        {"what": "step anchor", "sel": "#insp-tokens .tv-mark:not(.sel)", "max": 10},
        {"what": "selected step anchor", "sel": "#insp-tokens .tv-mark.sel"},
        {"what": "token info line", "sel": "#insp-tokens .tv-info"},
        {"what": "whitespace toggle", "sel": "#insp-tokens .tv-ws-label"},
        {"what": "template text", "sel": "#insp-step-text .tv-text"},
        {"what": "special token in template text", "sel": "#insp-step-text .tv-sp", "max": 4},
        {"what": "step header", "sel": "#insp-step-head .ali-step-bits"},
        {"what": "copy button", "sel": "#insp-step-head .ali-copy", "max": 2},
        {"what": "selected step row", "sel": "#insp-steps .body-cell[data-row='1'] span", "max": 9},
        {"what": "summary label", "sel": "#insp-summary .ali-label"},
        {"what": "summary description", "sel": "#insp-summary .ali-desc"},
        {"what": "summary field name", "sel": "#insp-summary .ali-kv span", "max": 12},
        {"what": "summary field value", "sel": "#insp-summary .ali-kv b", "max": 12},
        {"what": "summary badge", "sel": "#insp-summary .ali-badge", "max": 4},
    ]
    for cls in ("ali-ok", "ali-warn", "ali-err", "ali-info", "ali-note"):
        t.append({"what": f"status box {cls}", "sel": f"#ali-swatches .{cls}"})
        t.append({"what": f"text inside {cls}", "sel": f"#ali-swatches .{cls} > *"})
    for cls in ("d-head", "d-eq", "d-del", "d-add", "d-skip"):
        t.append({"what": f"diff {cls}", "sel": f"#ali-swatches .{cls}"})
    t.append({"what": "diff highlight", "sel": "#ali-swatches .ali-diff mark", "max": 2})
    for plot in ("insp-plot-tokens", "insp-plot-timeline"):
        t.append({"what": f"{plot} text", "sel": f"#{plot} .main-svg :is(.xtick, .ytick, .g-xtitle, .g-ytitle, .g-gtitle, .legend) text",
                  "svg": True, "max": 30})
        # bars are graphics: 3:1 against the plot's background (WCAG 1.4.11)
        t.append({"what": f"{plot} bar", "sel": f"#{plot} .bars path", "svg": True, "plotArea": True, "need": 3, "max": 10})
    return t


def check_contrast(app: App, targets: list[dict], where: str) -> list[dict]:
    res = app.js(CONTRAST_JS, targets)
    missing = [r for r in res if r.get("missing") or r.get("unparsed")]
    bad = [r for r in res if "ratio" in r and r["ratio"] < r["need"]]
    assert not bad, f"{where}: {len(bad)} element(s) below the WCAG contrast ratio:\n" + "\n".join(map(json.dumps, bad[:40]))
    return missing


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_view_is_readable_in_both_themes(open_app, shots, scheme):  # noqa: F811 (shots: a fixture)
    app = open_app(scheme)
    assert app.js("document.body.classList.contains('dark')") == (scheme == "dark")
    app.tab("Inspector")
    app.page.wait_for_selector("#insp-plot-tokens .bars path")
    app.page.wait_for_selector("#insp-plot-timeline .bars path")
    wait_row(app, 1)
    app.page.wait_for_selector("#insp-tokens .tv-c > span.tv-in-sel")
    app.page.locator("#insp-tokens .tv-ws-toggle").check()
    app.page.locator("#insp-tokens .tv-c > span").nth(190).click()
    app.page.wait_for_selector("#insp-tokens .tv-c > span.tv-tok-sel")
    app.js("""([sw, tok]) => {
      document.querySelector('#insp-summary .ali-summary').insertAdjacentHTML('beforeend', sw);
      document.querySelector('#insp-tokens .tv-c').insertAdjacentHTML('beforeend', tok);
    }""", [SWATCHES, TOKEN_SWATCHES])
    app.shot(shots, f"inspector_{scheme}")
    missing = check_contrast(app, contrast_targets(), f"Inspector, {scheme} theme")
    assert not missing, f"targets not found (the test would check nothing): {missing}"

    # the template lab's real diff and status boxes
    app.tab("Template lab")
    app.page.locator("#lab-render").click()
    app.page.wait_for_selector("#lab-diff .ali-diff")
    app.page.wait_for_selector("#labA-summary .ali-ok")
    app.shot(shots, f"template_lab_{scheme}")
    lab = [
        {"what": "lab summary", "sel": "#labA-summary .ali-ok, #labB-summary .ali-ok", "max": 2},
        {"what": "lab summary count", "sel": "#labA-summary .ali-ok b", "max": 2},
        {"what": "lab template text", "sel": "#labA-text .tv-text"},
        {"what": "lab special token", "sel": "#labA-text .tv-sp", "max": 3},
        {"what": "lab diff line", "sel": "#lab-diff .ali-diff > div", "max": 20},
        {"what": "lab diff counts", "sel": "#lab-diff .ali-kv b", "max": 3},
    ]
    missing = check_contrast(app, lab, f"Template lab, {scheme} theme")
    assert not missing, missing
    app.assert_clean()


# ---- step navigation ---------------------------------------------------------------------------------


def test_step_table_shows_every_row(open_app):
    """A typical trace's steps fit the table: its last row is not hidden under the table's edge."""
    app = open_app(width=1000, height=900)
    app.tab("Inspector")
    app.page.wait_for_selector('#insp-steps [data-row="4"][data-col="0"]')
    box = app.js("""() => {
      const vp = document.querySelector('#insp-steps .virtual-table-viewport');
      const last = document.querySelector('#insp-steps [data-row="4"][data-col="0"]').getBoundingClientRect();
      return {scroll: vp.scrollHeight - vp.clientHeight, last: last.bottom, bottom: vp.getBoundingClientRect().bottom};
    }""")
    assert box["scroll"] <= 1 and box["last"] <= box["bottom"] + 1, box
    app.assert_clean()


def test_row_chip_keys_and_dropdown_select_the_same_step(open_app):
    app = open_app(width=900, height=800)
    app.tab("Inspector")
    wait_row(app, 1)  # the default step of a trace (its first generated turn) is selected everywhere
    assert app.js("document.querySelector('#insp .tv-jump.sel').dataset.step") == "1"
    assert app.js("document.querySelectorAll('#insp-tokens .tv-c > span.tv-in-sel').length") == 25

    # a row: its step everywhere, highlighted; the details scrolled into view
    app.page.evaluate("window.scrollTo(0, 0)")
    app.cell("insp-steps", 2, 1).click()
    wait_step(app, 2)
    wait_row(app, 2)
    app.page.wait_for_function("document.querySelectorAll('#insp-tokens .tv-c > span.tv-in-sel').length === 29")
    assert app.js("Array.from(document.querySelectorAll('#insp .tv-mark.sel'), (a) => a.id)") == ["insp-step-2"]
    app.page.wait_for_function("""() => { const r = document.getElementById('insp-step-details').getBoundingClientRect();
                                          return r.top >= 0 && r.top < window.innerHeight / 2; }""")
    assert app.page.locator("#insp-step-head").is_visible()

    # a chip in the token view: Selected step follows (it did not), the row too
    app.page.locator('#insp-tokens .tv-jump[data-step="3"]').click()
    wait_step(app, 3)
    wait_row(app, 3)
    assert app.js("document.querySelector('#insp .tv-jump.sel').dataset.step") == "3"
    assert app.js("document.querySelectorAll('#insp-tokens .tv-c > span.tv-in-sel').length") == 16

    # keys in the token box: [ previous step, ] next step (the terminated step has no tokens)
    app.page.mouse.move(0, 0)  # not over the tokens: the info line then follows the selection, not the pointer
    app.page.locator("#insp-tokens .tv-body").focus()
    app.page.keyboard.press("[")
    wait_step(app, 2)
    wait_row(app, 2)
    app.page.keyboard.press("[")
    app.page.keyboard.press("[")
    wait_step(app, 0)
    assert app.js("document.querySelector('#insp .tv-jump.sel').dataset.step") == "0"
    app.page.keyboard.press("]")
    wait_step(app, 1)
    wait_row(app, 1)
    # each jump lands on the step's first token
    assert app.text("#insp-tokens .tv-info").startswith("#178 ")
    assert app.js("Array.prototype.indexOf.call(document.querySelectorAll('#insp-tokens .tv-c > span'), document.querySelector('#insp-tokens .tv-tok-sel'))") == 178

    # the dropdown: the token view and the table follow
    app.page.locator("#insp-step input").click()
    app.page.get_by_role("option", name="3 · generating · 16 tokens").click()
    wait_row(app, 3)
    app.page.wait_for_function("document.querySelector('#insp .tv-mark.sel').id === 'insp-step-3'")
    assert app.js("document.querySelectorAll('#insp-tokens .tv-c > span.tv-in-sel').length") == 16
    app.assert_clean()


# ---- tokens by click, tap and keys ------------------------------------------------------------------------


def test_token_click_keys_and_tap_show_index_id_bytes_mask_and_step(open_app, browser):  # noqa: F811
    app = open_app()
    app.tab("Inspector")
    help_text = app.text("#insp-tokens-help")
    assert "[" in help_text and "]" in help_text and "→" in help_text  # the keys are documented in the UI
    assert "← →" in app.text("#insp-tokens .tv-info")
    weather = sample_trace(WEATHER)
    tok = app.page.locator("#insp-tokens .tv-c > span").nth(200)
    tok.click()
    info = app.text("#insp-tokens .tv-info")
    tid = weather.input_ids[200]
    assert info.startswith(f"#200  id {tid}") and "bytes " in info, info
    assert "mask 1 (generated)" in info and info.endswith("step 1"), info
    assert app.js("document.querySelector('#insp-tokens .tv-tok-sel') === document.querySelectorAll('#insp-tokens .tv-c > span')[200]")
    # keys move the selection; leaving the tokens with the mouse shows the selected one again
    app.page.keyboard.press("ArrowRight")
    assert app.text("#insp-tokens .tv-info").startswith(f"#201  id {weather.input_ids[201]}")
    for _ in range(29):
        app.page.keyboard.press("ArrowRight")
    info = app.text("#insp-tokens .tv-info")
    assert info.startswith("#230 ") and "mask 0 (injected)" in info and info.endswith("step 2"), info
    app.js("document.querySelector('#insp-tokens .tv-body').scrollTop = 0")
    app.next_frame()
    word = app.js("Array.from(document.querySelectorAll('#insp-tokens .tv-c > span')).findIndex((s) => /^[A-Za-z]{3,}$/.test(s.textContent.trim()))")
    assert 0 < word < 178
    app.page.locator("#insp-tokens .tv-c > span").nth(word).hover()
    assert app.text("#insp-tokens .tv-info").startswith(f"#{word} ")
    assert "prompt (outside response_mask)" in app.text("#insp-tokens .tv-info")
    app.page.mouse.move(5, 5)
    assert app.text("#insp-tokens .tv-info").startswith("#230 ")
    app.page.locator("#insp-tokens .tv-body").focus()
    app.page.keyboard.press("Escape")
    assert "← →" in app.text("#insp-tokens .tv-info")
    assert not app.js("document.querySelector('#insp-tokens .tv-tok-sel')")

    # the selected step's own tokens: positions in the trace and the step
    app.page.get_by_role("tab", name="Tokens", exact=True).click()
    app.page.wait_for_selector("#insp-step-tokens .tv-c > span")
    app.page.locator("#insp-step-tokens .tv-c > span").nth(2).click()
    info = app.text("#insp-step-tokens .tv-info")
    assert info.startswith(f"#180  id {weather.input_ids[180]}") and info.endswith("step 1"), info
    app.assert_clean()

    # touch: a tap selects a token
    touch = open_app(width=800, height=900, has_touch=True, is_mobile=True)
    touch.tab("Inspector")
    touch.page.locator("#insp-tokens .tv-body").scroll_into_view_if_needed()
    touch.page.locator("#insp-tokens .tv-c > span").nth(3).tap()
    touch.page.wait_for_selector("#insp-tokens .tv-tok-sel")
    assert touch.text("#insp-tokens .tv-info").startswith("#3 ")
    touch.assert_clean()


# ---- imported traces -----------------------------------------------------------------------------------


def test_imported_trace_says_where_its_ids_came_from(open_app):
    app = open_app()
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(ROOT / "tests" / "data" / "import" / "openai_chat.jsonl"))
    app.wait_text("#tf-status", "openai_chat.jsonl")
    open_row(app, "chat-1")
    app.wait_text("#insp-summary", "chat-1")
    badge = app.text("#insp-summary [data-badge=warn]")
    assert badge == "imported from OpenAI chat completions, re-rendered with qwen3 / qwen3_instruct_2507", badge
    fields = app.js("Object.fromEntries(Array.from(document.querySelectorAll('#insp-summary [data-field]'), (b) => [b.dataset.field, b.textContent]))")
    assert fields["model"] == "qwen3" and fields["source"] == "openai-chat", fields
    assert fields["termination"] == "imported (no end state)", fields
    assert not [k for k, v in fields.items() if "?" in v], fields  # no placeholders
    app.assert_clean()


def test_xss_in_provenance_model_and_link(open_app, tmp_path):
    """New fields the Inspector shows (model, provenance badges and their explanations, the
    tokenizer name, the link's trace label and step) stay text."""
    rec = json.loads((ROOT / "sample_traces" / "01_weather.jsonl").read_text().splitlines()[0])
    rec["id"] = "prov" + NAME
    rec["metadata"] = {"source": "src" + NAME, "ids": "none", "render_error": "Render " + PAYLOAD, "mask": "assumed",
                       "messages": "decoded", "model": "Model " + PAYLOAD, "generator": {"model": "Gen " + PAYLOAD}}
    rec["tokenizer"]["name"] = "tok" + NAME
    f = tmp_path / "prov.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    app = open_app()
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "prov.jsonl")
    open_row(app, "prov" + NAME)
    app.wait_text("#insp-summary", "prov")
    summary = app.text("#insp-summary")
    assert "Gen " + IMG in summary and "tok" + NAME in summary, summary
    assert "no token ids" in summary and "mask assumed" in summary
    assert app.js("document.querySelector('#insp-summary [data-badge=err]').title").startswith("Render " + IMG)
    app.assert_no_xss("inspector summary (provenance)")
    # the link of this trace (its label holds the payload) reopens it in a new session? No: the
    # upload was this session's; a new session gets a note that quotes the label, as text
    url = app.js("location.href")
    assert "trace=" in url and "step=1" in url
    page = app.page.context.new_page()
    page.goto(url)
    page.wait_for_selector("#insp-summary .ali-note")
    note = page.locator("#insp-summary .ali-note").inner_text()
    assert "not in this session" in note and ("prov" + NAME)[:30] in note, note  # quoted, shortened
    other = App.__new__(App)
    other.page, other.errors = page, []
    other.assert_no_xss("a link to another session's trace")
    # a made-up link: payloads in both parameters
    q = urllib.parse.urlencode({"trace": PAYLOAD, "step": SCRIPT})
    page.goto(app.url + "?" + q)
    page.wait_for_selector("#insp-summary .ali-note")
    assert VISIBLE in page.locator("#insp-summary .ali-note").inner_text()
    other.assert_no_xss("a link with payloads")
    app.assert_clean()


# ---- links ---------------------------------------------------------------------------------------------


def test_link_holds_the_trace_and_step_and_reopens_them(open_app, browser, app_url):  # noqa: F811
    app = open_app()
    app.tab("Inspector")
    app.page.locator("#insp-trace input").click()
    app.page.get_by_role("option", name=PARALLEL).click()
    app.wait_text("#insp-summary", "sample-parallel")
    app.cell("insp-steps", 2, 1).click()
    wait_step(app, 2)
    app.page.wait_for_function("new URL(location.href).searchParams.get('step') === '2'")
    url = app.js("location.href")
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert q == {"trace": [PARALLEL], "step": ["2"], "tab": ["inspector"]}, q

    # a new session from the link: the Inspector opens on that trace and step
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = ctx.new_page()
        page.set_default_timeout(30_000)
        page.goto(url)
        page.wait_for_selector("#insp-tokens .tv-c > span", state="visible")
        page.wait_for_function("(v) => { const e = document.querySelector('#insp-trace input'); return !!e && e.value === v; }",
                               arg=PARALLEL)
        page.wait_for_function("document.querySelector('#insp-step input').value.startsWith('2 · ')")
        page.wait_for_function("document.querySelector('#insp .tv-mark.sel').id === 'insp-step-2'")
        assert "Step 2" in page.locator("#insp-step-head").inner_text()
        # a trace id works as well as a label; a step the trace lacks falls back, with a note
        page.goto(app_url + "?" + urllib.parse.urlencode({"trace": "sample-weather-seattle", "step": "99"}))
        page.wait_for_function("(v) => { const e = document.querySelector('#insp-trace input'); return !!e && e.value === v; }",
                               arg=WEATHER)
        page.wait_for_selector("#insp-summary .ali-note")
        assert "step is not in this trace" in page.locator("#insp-summary .ali-note").inner_text()
        page.wait_for_function("document.querySelector('#insp-step input').value.startsWith('1 · ')")
        # the link keeps the tab shown: after going back to the Playground, a reload shows the
        # Playground (and the Inspector still has the trace and step)
        page.goto(url)
        page.wait_for_selector("#insp-tokens .tv-c > span", state="visible")
        page.get_by_role("tab", name="Playground", exact=True).click()
        page.wait_for_function("new URL(location.href).searchParams.get('tab') === 'playground'")
        page.reload()
        page.wait_for_selector("#pg-send", state="visible")
        page.get_by_role("tab", name="Inspector", exact=True).click()
        page.wait_for_function("document.querySelector('#insp-step input').value.startsWith('2 · ')")
        assert page.locator("#insp-trace input").input_value() == PARALLEL
    finally:
        ctx.close()
    app.assert_clean()


def test_a_first_visit_stays_on_the_playground(open_app):
    """The app writes no link before the Inspector is shown, and a reload of a page that never
    showed it opens the Playground."""
    app = open_app()
    app.page.wait_for_function("document.querySelector('#pg-send') !== null")
    assert "trace=" not in app.js("location.href")
    app.reload()
    assert not app.page.locator("#tab-inspector").is_visible()
    app.assert_clean()


# ---- copy ----------------------------------------------------------------------------------------------


def test_copy_buttons_put_the_steps_ids_and_mask_on_the_clipboard(browser, app_url):  # noqa: F811
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=app_url.rstrip("/"))
    try:
        app = App(ctx.new_page(), app_url)
        app.tab("Inspector")
        app.cell("insp-steps", 2, 1).click()
        wait_step(app, 2)
        weather = sample_trace(WEATHER)
        step = weather.steps[2]
        app.page.locator("#insp-step-head button.ali-copy[data-what='token ids']").click()
        app.wait_text("#insp-step-head .ali-copy-status", "copied the token ids (29)")
        assert json.loads(app.js("navigator.clipboard.readText()")) == weather.input_ids[step.start:step.end]
        app.page.locator("#insp-step-head button.ali-copy[data-what='mask']").click()
        app.wait_text("#insp-step-head .ali-copy-status", "copied the mask")
        assert json.loads(app.js("navigator.clipboard.readText()")) == [0] * 29
        app.cell("insp-steps", 1, 1).click()
        wait_step(app, 1)
        app.page.locator("#insp-step-head button.ali-copy[data-what='mask']").click()
        app.wait_text("#insp-step-head .ali-copy-status", "copied the mask (25)")
        assert json.loads(app.js("navigator.clipboard.readText()")) == [1] * 25
        app.assert_clean()
    finally:
        ctx.close()


# ---- the legend ----------------------------------------------------------------------------------------


def test_legend_names_each_kind_once(open_app):
    app = open_app()
    app.tab("Inspector")
    keys = app.js("Array.from(document.querySelectorAll('#insp-tokens .tv-key'), (k) => k.textContent.replace(/\\s+/g, ' ').trim())")
    assert keys == ["prompt 178", "generated (mask 1) 41", "injected (mask 0) 29", "special 18", "total 248"], keys
    app.assert_clean()


def test_imported_otel_file_lists_its_losses_and_names_its_writer(open_app, tmp_path):
    """An OTel export (written by opentelemetry-instrumentation-openai-v2) whose instrumentation
    scope name is a script and whose first line has a cut output attribute: the status says what
    was not carried over, the problems table lists it by line, the trace's badges name the
    format and writer as text and the loss in red."""
    lines = (ROOT / "tests" / "data" / "import" / "otel" / "openai_v2_spans.otlp.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    trace_ids = []
    for rs in first["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            ss["scope"]["name"] = "lib" + NAME
            for s in ss["spans"]:
                trace_ids.append(s["traceId"])
                for kv in s["attributes"]:
                    if kv["key"] == "gen_ai.output.messages":
                        kv["value"] = {"stringValue": '[{"role": "assistant", "parts": ['}
    f = tmp_path / "otel.jsonl"
    f.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    app = open_app()
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "otel.jsonl")
    status = app.text("#tf-status")
    assert "imported from otel" in status and "not carried over" in status and "bad record" not in status, status
    app.page.wait_for_function("document.querySelectorAll('#tf-problems [data-row]').length > 0")
    assert app.cell("tf-problems", 0, 0).inner_text() == "1"
    assert "gen_ai.output.messages" in app.cell("tf-problems", 0, 1).inner_text()
    open_row(app, trace_ids[0])
    app.wait_text("#insp-summary", trace_ids[0])
    warn = app.text("#insp-summary [data-badge=warn]")
    assert warn.startswith("imported from OTel GenAI (libw<img/src=x/onerror=") and "re-rendered with qwen3" in warn, warn  # as text
    assert "not carried over" in app.text("#insp-summary [data-badge=err]")
    app.assert_no_xss("inspector badges (import provenance)")
    app.assert_clean()
