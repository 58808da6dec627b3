"""The token view's colour modes and its ``tv-select`` event in a real headless Chromium.

The page holds the app's theme variables (``ui.theme.css_variables()``, light; ``class="dark"`` on
``<body>`` as Gradio sets it for the dark theme), the token view's own CSS and JS
(``ui.token_view.CSS`` / ``JS``, with the container as the ``element`` that ``gr.HTML`` gives
``js_on_load``), and markup rendered by ``ui.token_view.render_trace`` from the weather sample
(real Qwen3 tokenizer) with rollout and trainer logprobs on its response steps. Gradio scopes
``css_template`` by nesting it under the component's id (``#id { & .rule }``), which changes no
rule's meaning here.

Checked: the mode switch paints each |Δ| and probability bin in its own colour (computed
styles), mask-0 tokens stay told apart, hover shows both logprobs, Δ and the ratio, every token
and legend text keeps a WCAG contrast ratio >= 4.5 in both themes, and ``tv-select`` selects and
scrolls (on a long view). No timing is asserted (bench/bench_token_view.py times it).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
from test_browser import CHROMIUM, App  # noqa: F401 - fixtures, used by name
from test_browser_inspector import CONTRAST_JS
from test_ui_token_view import DELTAS, PROBS, _scored

from backend.checks.logprobs import position_logprobs
from backend.loading.tokenizers import load_tokenizer
from backend.trace import load_traces
from ui import theme
from ui import token_view as tv
from ui.context import SAMPLE_DIR

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (install it with: bash scripts/setup.sh --browser)"),
]

PAGE_BG = {"light": "#ffffff", "dark": "#0b0f19"}  # Gradio's page backgrounds

PAGE = """<!doctype html><html style="background:%s"><head><meta charset="utf-8"><style>%s
%s</style></head><body class="%s" style="margin:0;padding:16px;width:1100px;font-family:sans-serif">
<div id="root"></div>
<script>const element = document.getElementById('root');
%s
</script></body></html>"""


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def scored():
    return _scored(load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0])


def open_view(browser, markup: str, scheme: str = "light", height: int = 900):  # noqa: F811
    page = browser.new_page(viewport={"width": 1200, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content(PAGE % (PAGE_BG[scheme], theme.css_variables(), tv.CSS, "dark" if scheme == "dark" else "", tv.JS))
    page.evaluate("(m) => { element.innerHTML = m; window.__aliTV.apply(element); }", markup)
    page.__errors = errors  # type: ignore[attr-defined]
    return page


def styles(page, sel: str, props=("backgroundColor", "color", "fontStyle", "textDecorationStyle")) -> list[dict]:
    return page.evaluate(
        "([sel, props]) => Array.from(document.querySelectorAll(sel)).map((el) => {"
        " const cs = getComputedStyle(el); return Object.fromEntries(props.map((p) => [p, cs[p]])); })",
        [sel, list(props)],
    )


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_heat_and_probability_modes_paint_each_bin(browser, qwen, scored, scheme):  # noqa: F811
    page = open_view(browser, tv.render_trace(scored, qwen.tokenizer), scheme)
    try:
        mask_bg = styles(page, "#tv .tv-c > span.g0")[0]["backgroundColor"]
        assert not page.evaluate("document.querySelector('#tv').matches('.tv-m-heat, .tv-m-prob')")  # mask by default
        assert not page.is_visible("#tv .tv-lg-heat")
        page.select_option("#tv select.tv-mode", "heat")
        assert page.evaluate("document.querySelector('#tv').classList.contains('tv-m-heat')")
        assert page.is_visible("#tv .tv-lg-heat") and not page.is_visible("#tv .tv-lg-prob")
        heat = [styles(page, f"#tv .tv-c > span.h{b}")[0] for b in range(5)]
        bgs = [h["backgroundColor"] for h in heat]
        assert len(set(bgs)) == 5, bgs
        # a bin's tokens and its legend swatch share the colour
        assert [styles(page, f"#tv .tv-lg-heat .tv-sw.h{b}")[0]["backgroundColor"] for b in range(5)] == bgs
        # tokens without a pair (the prompt) are plain, unlike any bin
        plain = styles(page, "#tv .tv-c > span.p0")[0]["backgroundColor"]
        assert plain not in bgs
        # mask-0 tokens (scored for information, no rollout): italic, dotted underline, never a heat colour
        m0 = styles(page, "#tv .tv-c > span.j0, #tv .tv-c > span.j1")
        assert m0 and all(s["fontStyle"] == "italic" and s["textDecorationStyle"] == "dotted" for s in m0)
        assert not {s["backgroundColor"] for s in m0} & set(bgs)
        assert all(s["fontStyle"] == "normal" for s in styles(page, "#tv .tv-c > span.g0"))

        page.select_option("#tv select.tv-mode", "prob")
        prob = [styles(page, f"#tv .tv-c > span.q{b}:not(.j0):not(.j1)")[0]["backgroundColor"] for b in range(5)]
        assert len(set(prob)) == 5 and page.is_visible("#tv .tv-lg-prob") and not page.is_visible("#tv .tv-lg-heat")
        # mask-0 tokens have a probability (the trainer's) and stay marked as mask 0
        m0q = styles(page, "#tv .tv-c > span.j0.q1, #tv .tv-c > span.j1.q1")
        assert m0q and all(s["fontStyle"] == "italic" for s in m0q)

        page.select_option("#tv select.tv-mode", "mask")
        assert styles(page, "#tv .tv-c > span.g0")[0]["backgroundColor"] == mask_bg
        assert not page.evaluate("document.querySelector('#tv').matches('.tv-m-heat, .tv-m-prob')")
        assert page.__errors == []  # type: ignore[attr-defined]
    finally:
        page.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_colour_modes_are_readable_in_both_themes(browser, qwen, scored, scheme):  # noqa: F811
    page = open_view(browser, tv.render_trace(scored, qwen.tokenizer), scheme)
    try:
        assert page.evaluate("document.body.classList.contains('dark')") == (scheme == "dark")
        for mode, k in (("heat", "h"), ("prob", "q")):
            page.select_option("#tv select.tv-mode", mode)
            targets = []
            for b in range(5):
                targets.append({"what": f"{mode} token bin {b}", "sel": f"#tv .tv-c > span.{k}{b}", "max": 4})
                targets.append({"what": f"{mode} special token bin {b}", "sel": f"#tv .tv-c > span.{k}{b}.s", "max": 2})
                targets.append({"what": f"{mode} legend bin {b}", "sel": f"#tv .tv-lg-{mode} .tv-sw.{k}{b}"})
            targets += [
                {"what": f"{mode}: token without a value", "sel": "#tv .tv-c > span.p0", "max": 4},
                {"what": f"{mode}: token without a value, other shade", "sel": "#tv .tv-c > span.p1", "max": 4},
                {"what": f"{mode}: special token without a value", "sel": "#tv .tv-c > span.p0.s", "max": 2},
                {"what": f"{mode}: mask-0 token", "sel": "#tv .tv-c > span.j0, #tv .tv-c > span.j1", "max": 6},
                {"what": f"{mode} legend", "sel": f"#tv .tv-lg-{mode} > :is(b, small, .tv-sw)", "max": 12},
                {"what": "mode switch", "sel": "#tv select.tv-mode"},
                {"what": "mode label", "sel": "#tv .tv-mode-label"},
            ]
            res = page.evaluate(CONTRAST_JS, targets)
            missing = [r for r in res if r.get("missing") or r.get("unparsed")]
            # a bin may be empty of special tokens; every other target must exist
            assert not [r for r in missing if "special token bin" not in r["what"]], missing
            bad = [r for r in res if "ratio" in r and r["ratio"] < r["need"]]
            assert not bad, f"{scheme}, {mode}: below 4.5:1:\n" + "\n".join(map(json.dumps, bad))
            assert len([r for r in res if "ratio" in r]) >= 30
    finally:
        page.close()


def test_hover_shows_both_logprobs_delta_and_ratio(browser, qwen, scored):  # noqa: F811
    page = open_view(browser, tv.render_trace(scored, qwen.tokenizer))
    try:
        ro, tr = position_logprobs(scored)
        p = len(scored.prompt_ids)
        pos = p + 3  # a generated token (mask 1): both logprobs
        assert scored.response_mask[3] == 1
        page.locator("#tv .tv-c > span").nth(pos).hover()
        info = page.text_content("#tv .tv-info")
        d = tr[pos] - ro[pos]
        assert info.startswith(f"#{pos}  id {scored.input_ids[pos]}"), info
        assert f"rollout {ro[pos]:.4f}" in info and f"trainer {tr[pos]:.4f}" in info, info
        assert f"Δ {d:+.4f}" in info and f"ratio {math.exp(d):.5g}" in info, info
        assert abs(d) == pytest.approx(abs(DELTAS[pos % 5]))
        shown_p = float(info.split("rollout ")[1].split("(p ")[1].split(")")[0])
        assert shown_p == pytest.approx(PROBS[pos % 5], rel=1e-3)
        # a mask-0 token: the trainer's logprob only
        # (the first such token is the '\n' continuous tokens insert after <|im_end|>: a line break,
        # nothing to hover; the next one, <|im_start|>, is a framed token)
        j = next(i for i in range(p, len(ro)) if ro[i] is None and tr[i] is not None
                 and qwen.tokenizer.decode([scored.input_ids[i]]).strip())
        page.locator("#tv .tv-c > span").nth(j).hover()
        info = page.text_content("#tv .tv-info")
        assert f"trainer {tr[j]:.4f}" in info and "rollout –" in info and "Δ" not in info, info
        # the prompt: no logprob
        page.locator("#tv .tv-c > span").nth(1).hover()
        assert page.text_content("#tv .tv-info").endswith("no logprob")
        # a click keeps the numbers in the info line after the pointer leaves
        page.locator("#tv .tv-c > span").nth(pos).click()
        page.mouse.move(5, 5)
        assert f"rollout {ro[pos]:.4f}" in page.text_content("#tv .tv-info")
        assert page.__errors == []  # type: ignore[attr-defined]
    finally:
        page.close()


def _long(qwen, scored, n_tokens: int) -> tuple[list[int], dict]:
    """The scored weather trace repeated to ``n_tokens``: (ids, render_tokens keyword arguments
    but the prefix), one step mark per copy."""
    ids: list[int] = []
    kinds: list[int] = []
    ro: list = []
    tr: list = []
    r1, t1 = position_logprobs(scored)
    k1 = tv.trace_kinds(scored)
    while len(ids) < n_tokens:
        ids += scored.input_ids
        kinds += k1
        ro += r1
        tr += t1
    n1 = len(scored.input_ids)
    steps = [tv.StepMark(i, a, min(a + n1, n_tokens), "generating") for i, a in enumerate(range(0, n_tokens, n1))]
    return ids[:n_tokens], {"kinds": kinds[:n_tokens], "tokenizer": qwen.tokenizer, "steps": steps,
                            "logprobs": (ro[:n_tokens], tr[:n_tokens])}


def _long_view(qwen, scored, n_tokens: int, prefix: str = "tv", **kw) -> tuple[str, list[int]]:
    ids, args = _long(qwen, scored, n_tokens)
    return tv.render_tokens(ids, prefix=prefix, **args, **kw), ids


def test_tv_select_selects_and_scrolls(browser, qwen, scored):  # noqa: F811
    markup, ids = _long_view(qwen, scored, 20000)
    page = open_view(browser, markup)
    try:
        page.select_option("#tv select.tv-mode", "heat")
        page.evaluate("document.activeElement.blur()")
        before = page.evaluate("document.activeElement === document.body")
        n1 = len(scored.input_ids)
        target = (19000 // n1) * n1 + len(scored.prompt_ids) + 5  # a generated token of a late copy
        page.evaluate("(i) => document.querySelector('#tv').dispatchEvent(new CustomEvent('tv-select', {detail: {index: i}}))", target)
        page.wait_for_function("""(i) => { const el = document.querySelector('#tv .tv-tok-sel');
          if (!el) return false; const r = el.getBoundingClientRect(), b = el.closest('.tv-body').getBoundingClientRect();
          return r.top >= b.top && r.bottom <= b.bottom && window.__aliTV.indexOf(el) === i; }""", arg=target)
        info = page.text_content("#tv .tv-info")
        assert info.startswith(f"#{target}  id {ids[target]}") and "rollout" in info and "ratio" in info, info
        assert page.evaluate("document.activeElement === document.body") == before  # focuses nothing
        assert page.evaluate("document.querySelector('#tv .tv-body').scrollTop") > 1000
        # the mode stays; a later event moves the selection (one token selected)
        assert page.evaluate("document.querySelector('#tv').classList.contains('tv-m-heat')")
        page.evaluate("() => document.querySelector('#tv').dispatchEvent(new CustomEvent('tv-select', {detail: {index: 3}}))")
        page.wait_for_function("() => document.querySelector('#tv').scrollTop === 0 && "
                               "window.__aliTV.indexOf(document.querySelector('#tv .tv-tok-sel')) === 3")
        assert page.evaluate("document.querySelectorAll('#tv .tv-tok-sel').length") == 1
        # an index outside the view changes nothing
        page.evaluate("() => document.querySelector('#tv').dispatchEvent(new CustomEvent('tv-select', {detail: {index: 10 ** 9}}))")
        assert page.evaluate("window.__aliTV.indexOf(document.querySelector('#tv .tv-tok-sel'))") == 3
        assert page.__errors == []  # type: ignore[attr-defined]
    finally:
        page.close()


def test_the_chosen_mode_survives_a_re_render(browser, qwen, scored):  # noqa: F811
    """Gradio replaces the view's markup on every update (another step selected): the mode stays."""
    markup = tv.render_trace(scored, qwen.tokenizer, prefix="insp")
    page = open_view(browser, markup)
    try:
        page.select_option("#insp select.tv-mode", "heat")
        page.evaluate("(m) => { element.innerHTML = m; window.__aliTV.apply(element); }",
                      tv.render_trace(scored, qwen.tokenizer, prefix="insp", selected_step=3))
        assert page.evaluate("document.querySelector('#insp').classList.contains('tv-m-heat')")
        assert page.input_value("#insp select.tv-mode") == "heat"
    finally:
        page.close()


# ---- long traces: the windowed view (issue 16) ----------------------------------------------------

ALL_SPANS_JS = """(id) => Array.from(document.querySelectorAll('#' + id + ' .tv-c > span'),
  (s) => [s.className.replace(/ ?tv-(in|tok)-sel/g, ''), s.getAttribute('title'), s.textContent])"""


def test_windowed_view_builds_the_same_tokens(browser, qwen, scored):  # noqa: F811
    """Built chunk by chunk in the browser, a windowed view has the same spans (classes, titles,
    text) and step anchors as the server-built view of the same tokens."""
    markup, ids = _long_view(qwen, scored, 3000, prefix="full", window=False)
    wmarkup, _ = _long_view(qwen, scored, 3000, prefix="win", window=True)
    assert 'class="tv tv-win"' in wmarkup and "<span class=" not in wmarkup.split("</template>", 1)[1]
    page = open_view(browser, markup + wmarkup, height=700)
    try:
        n_win = page.evaluate("document.querySelectorAll('#win .tv-c > span').length")
        assert 0 < n_win < len(ids)  # only the chunks near the visible part are built
        page.evaluate("() => { const tv = document.querySelector('#win'); tv.querySelectorAll('.tv-c').forEach((c) => window.__aliTV.fill(tv, c)); }")
        full = page.evaluate(ALL_SPANS_JS, "full")
        win = page.evaluate(ALL_SPANS_JS, "win")
        assert len(full) == len(ids) and win == full
        marks = ("(id) => Array.from(document.querySelectorAll('#' + id + ' .tv-body .tv-mark'),"
                 " (a) => [a.dataset.start, a.nextElementSibling && a.nextElementSibling.title])")
        assert page.evaluate(marks, "win") == page.evaluate(marks, "full")
        assert len(page.evaluate(marks, "win")) == -(-3000 // len(scored.input_ids))
        assert page.__errors == []  # type: ignore[attr-defined]
    finally:
        page.close()


def test_128k_tokens_scroll_to_the_end_and_select_there(browser, qwen, scored):  # noqa: F811
    """A 131,072-token view (windowed by default): the box scrolls to its end, the last tokens
    are there, one near the end is selected by a click and by the arrow keys, the last step's
    chip brings its anchor into view, tv-select reaches a token far away. No timing asserted
    (bench/bench_token_view.py --tokens 131072)."""
    n = 131072
    markup, ids = _long_view(qwen, scored, n)
    assert 'class="tv tv-win"' in markup and len(markup.encode()) < 8e6
    page = open_view(browser, markup, height=900)
    try:
        assert page.evaluate("document.querySelectorAll('#tv .tv-c > span').length") < 5000
        page.evaluate("document.querySelector('#tv .tv-body').scrollIntoView()")  # the box on screen, as a reader has it
        page.evaluate("() => { const b = document.querySelector('#tv .tv-body'); b.scrollTop = b.scrollHeight; }")
        page.wait_for_function("""(n) => { const b = document.querySelector('#tv .tv-body');
          const last = b.querySelector('.tv-c:last-of-type > span:last-of-type');
          if (!last || window.__aliTV.indexOf(last) !== n - 1) return false;
          const r = last.getBoundingClientRect(), br = b.getBoundingClientRect();
          return b.scrollTop + b.clientHeight >= b.scrollHeight - 2 && r.bottom <= br.bottom + 1 && r.top >= br.top; }""", arg=n)
        # a visible token near the end, clicked
        idx = page.evaluate("""(n) => { const b = document.querySelector('#tv .tv-body'), br = b.getBoundingClientRect();
          const spans = Array.from(b.querySelectorAll('.tv-c > span')).filter((s) => { const r = s.getBoundingClientRect();
            return r.top >= br.top && r.bottom <= br.bottom && r.width > 4 && window.__aliTV.indexOf(s) < n - 3; });
          const s = spans[spans.length - 1]; s.setAttribute('data-pick', '1'); return window.__aliTV.indexOf(s); }""", n)
        assert idx > n - 400
        page.click("#tv [data-pick]")
        info = page.text_content("#tv .tv-info")
        assert info.startswith(f"#{idx}  id {ids[idx]}"), info
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert page.text_content("#tv .tv-info").startswith(f"#{idx + 2}  id {ids[idx + 2]}")
        # whitespace toggle and heat mode still apply to the built tokens
        page.check("#tv .tv-ws-toggle")
        page.select_option("#tv select.tv-mode", "heat")
        assert page.evaluate("document.querySelector('#tv').matches('.tv-ws.tv-m-heat')")
        assert len({s["backgroundColor"] for b in range(5) for s in styles(page, f"#tv .tv-c > span.h{b}")[:1]}) == 5
        # the last step's chip: its anchor comes into view
        page.locator("#tv .tv-jump").last.click()
        page.wait_for_function("""() => { const a = document.querySelector('#tv .tv-body .tv-mark.sel'); if (!a) return false;
          const r = a.getBoundingClientRect(), b = a.closest('.tv-body').getBoundingClientRect();
          return r.top >= b.top && r.bottom <= b.bottom; }""")
        # tv-select far away (the box's start), then back near the end
        for target in (200, n - 10):
            page.evaluate("(i) => document.querySelector('#tv').dispatchEvent(new CustomEvent('tv-select', {detail: {index: i}}))", target)
            page.wait_for_function("""(i) => { const el = document.querySelector('#tv .tv-tok-sel');
              if (!el || window.__aliTV.indexOf(el) !== i) return false;
              const r = el.getBoundingClientRect(), b = el.closest('.tv-body').getBoundingClientRect();
              return r.top >= b.top && r.bottom <= b.bottom; }""", arg=target)
            assert page.text_content("#tv .tv-info").startswith(f"#{target}  id {ids[target]}")
        assert page.__errors == []  # type: ignore[attr-defined]
    finally:
        page.close()


# ---- in the app ---------------------------------------------------------------------------------


def _long_trace_file(scored, path, n_tokens: int = 40000):
    """A valid trace file: the scored weather run's response (generated, tool, generated steps
    with their logprobs) repeated until ``n_tokens``."""
    d = json.loads(scored.model_dump_json())
    p, r = len(d["prompt_ids"]), len(d["response_ids"])
    k = (n_tokens - p) // r + 1
    steps = [d["steps"][0]]
    for c in range(k):
        for st in d["steps"][1:4]:
            s2 = copy.deepcopy(st)
            s2["start"] += c * r
            s2["end"] += c * r
            s2["index"] = len(steps)
            steps.append(s2)
    end = copy.deepcopy(d["steps"][4])
    end.update(index=len(steps), start=p + k * r, end=p + k * r)
    d.update(steps=steps + [end], response_ids=d["response_ids"] * k, response_mask=d["response_mask"] * k, id="long-scored-run")
    path.write_text(json.dumps(d) + "\n")
    return p + k * r


def test_in_the_app_a_long_scored_trace_is_windowed_with_its_colour_modes(browser, app_url, scored, tmp_path):  # noqa: F811
    """The real app (app.py --backend scripted): a 40k-token trace with rollout and trainer
    logprobs uploaded on Trace files and opened in the Inspector arrives windowed through
    gr.HTML, builds its visible tokens, switches to heat mode, shows both logprobs on hover,
    scrolls to its end and answers tv-select there. 40k: above WINDOW_TOKENS (32,768), so the
    same windowed path as 131k tokens, which made this test 80 s long in a loaded CI run; the
    view at 131k tokens is test_128k_tokens_scroll_to_the_end_and_select_there above and
    bench/bench_token_view.py --tokens 131072."""
    n = _long_trace_file(scored, tmp_path / "long.jsonl")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        app = App(ctx.new_page(), app_url)
        app.tab("Trace files")
        app.page.locator("#tf-upload input[type=file]").set_input_files(str(tmp_path / "long.jsonl"))
        app.wait_text("#tf-status", "long.jsonl", timeout=120_000)
        app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 1")
        app.cell("tf-table", 0, 1).click()
        app.wait_text("#insp-summary", "long-scored-run", timeout=120_000)
        app.page.wait_for_selector("#insp-tokens .tv.tv-win .tv-c > span", timeout=120_000)
        assert app.js("document.querySelector('#insp-tokens .tv').dataset.tokens") == str(n)
        assert app.js("document.querySelectorAll('#insp-tokens .tv-c > span').length") < 10000
        app.page.select_option("#insp-tokens select.tv-mode", "heat")
        app.page.wait_for_selector("#insp-tokens .tv.tv-m-heat")
        bgs = {b: app.js(f"getComputedStyle(document.querySelector('#insp-tokens .tv-c > span.h{b}')).backgroundColor") for b in range(5)}
        assert len(set(bgs.values())) == 5, bgs
        app.js("document.querySelector('#insp-tokens .tv-body').scrollIntoView()")
        app.next_frame()
        picked = app.js("""() => { const b = document.querySelector('#insp-tokens .tv-body'), br = b.getBoundingClientRect();
          const s = Array.from(b.querySelectorAll('.tv-c > span.h4')).find((e) => { const r = e.getBoundingClientRect();
            return r.width > 4 && r.top >= br.top && r.bottom <= br.bottom; });
          if (s) s.setAttribute('data-pick', '1'); return !!s; }""")
        assert picked
        app.page.hover("#insp-tokens [data-pick]")
        info = app.text("#insp-tokens .tv-info")
        assert "rollout" in info and "trainer" in info and "Δ" in info and "ratio" in info, info
        app.js("() => { const b = document.querySelector('#insp-tokens .tv-body'); b.scrollTop = b.scrollHeight; }")
        app.page.wait_for_function("""(n) => { const b = document.querySelector('#insp-tokens .tv-body');
          const cs = b.querySelectorAll('.tv-c'), sp = cs[cs.length - 1].querySelectorAll(':scope > span');
          return sp.length && window.__aliTV.indexOf(sp[sp.length - 1]) === n - 1; }""", arg=n)
        app.page.mouse.move(1, 1)  # the pointer off the tokens (a hovered token takes the info line)
        app.js("(i) => document.querySelector('#insp-tokens .tv').dispatchEvent(new CustomEvent('tv-select', {detail: {index: i}}))", n - 20)
        app.page.wait_for_function("""(i) => { const el = document.querySelector('#insp-tokens .tv-tok-sel');
          if (!el || window.__aliTV.indexOf(el) !== i) return false;
          const r = el.getBoundingClientRect(), b = el.closest('.tv-body').getBoundingClientRect();
          return r.top >= b.top && r.bottom <= b.bottom; }""", arg=n - 20)
        assert app.text("#insp-tokens .tv-info").startswith(f"#{n - 20}  id ")
        app.assert_clean()
    finally:
        ctx.close()
