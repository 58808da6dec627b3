"""The logprob lens in a real browser: ``app.py --backend transformers`` (the embedded
SmolLM2-135M-Instruct, loaded only when something needs it) with a trace that model generated
with rollout logprobs recorded as its only sample, in headless Chromium.

Pressing *Score with trainer view* scores the trace in the app (status line while it works, then
the numbers with verl's names, the three charts, the worst tokens); the session's trace is the
scored one (the step's info shows the trainer's logprobs); clicking a worst token selects its
step and dispatches ``tv-select`` with the token's position on the token view's root, and the
token ends up selected. Both themes: every text of the lens measured against its background
(WCAG contrast, tests/test_browser_inspector.py's measure). Every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest
from test_browser import CHROMIUM, App, running_app  # noqa: F401 - fixtures, used by name
from test_browser_inspector import check_contrast

from ui.logprob_lens import SCORE_TIMEOUT_S

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (install it with: bash scripts/setup.sh --browser)"),
]

ROOT = Path(__file__).resolve().parent.parent


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for.
    """
    return {"temperature": 72, "city": city}


@pytest.fixture(scope="module")
def lens_app_url(tmp_path_factory, smollm2_model_dir):
    """A trace of the embedded model with logprobs (and a tool turn), then the app on the
    transformers backend with that trace as its sample; killed at the end."""
    from backend.config import LoopConfig
    from backend.engine import AgentLoop
    from backend.generators.transformers_local import TransformersGenerator
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry
    from backend.trace import write_jsonl

    gen = TransformersGenerator(smollm2_model_dir).load()
    cfg = LoopConfig(sampling={"temperature": 1.0, "seed": 5, "max_tokens": 40, "logprobs": 0},
                     tool_choice=["required", "auto"], max_assistant_turns=2)
    loop = AgentLoop(gen, load_tokenizer("smollm2"), tools=ToolRegistry.from_functions([get_current_temperature]), config=cfg)
    # in a thread of its own: Playwright's sync API may already run an event loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        trace = pool.submit(asyncio.run, loop.run([{"role": "user", "content": "What's the weather in Paris?"}])).result(timeout=600)
    del gen
    folder = tmp_path_factory.mktemp("lens_samples")
    write_jsonl([trace], str(folder / "lens.jsonl"))
    with running_app(["--backend", "transformers", "--sample-dir", str(folder)], tmp_path_factory.mktemp("lens_app") / "app.log",
                     start_timeout_s=240) as url:
        yield url, trace


def lens_targets() -> list[dict]:
    t = [
        {"what": "lens status", "sel": "#insp-lens-status .ali-lens-status"},
        {"what": "lens source line", "sel": "#insp-lens-numbers .ali-lens-src"},
        {"what": "lens metric name", "sel": "#insp-lens-numbers .ali-lens-trace th", "max": 8},
        {"what": "lens metric value", "sel": "#insp-lens-numbers .ali-lens-trace td[data-value]", "max": 8},
        {"what": "lens metric explanation", "sel": "#insp-lens-numbers .ali-lens-why", "max": 8},
        {"what": "lens per-step cell", "sel": "#insp-lens-numbers .ali-lens-steps td", "max": 9},
        {"what": "lens per-step header", "sel": "#insp-lens-numbers .ali-lens-steps th", "max": 9},
        {"what": "worst token button", "sel": "#insp-lens-worst .ali-lens-tok:not(.sel)", "max": 3},
        {"what": "selected worst token button", "sel": "#insp-lens-worst .ali-lens-tok.sel"},
        {"what": "worst token cell", "sel": "#insp-lens-worst td:not(:first-child)", "max": 12},
        {"what": "worst token header", "sel": "#insp-lens-worst th", "max": 7},
    ]
    for plot in ("insp-lens-scatter", "insp-lens-ratios", "insp-lens-steps"):
        t.append({"what": f"{plot} text", "sel": f"#{plot} .main-svg :is(.xtick, .ytick, .g-xtitle, .g-ytitle, .g-gtitle) text",
                  "svg": True, "max": 20})
    t.append({"what": "scatter points", "sel": "#insp-lens-scatter .scatterlayer .trace:nth-child(2) .point", "svg": True,
              "plotArea": True, "need": 2.2, "max": 5})  # markers drawn at 0.75 opacity (mid-tone, as the app's bars)
    t.append({"what": "histogram bars", "sel": "#insp-lens-ratios .bars path", "svg": True, "plotArea": True, "need": 3, "max": 5})
    t.append({"what": "per-step bars", "sel": "#insp-lens-steps .bars path", "svg": True, "plotArea": True, "need": 3, "max": 5})
    return t


def test_score_button_numbers_charts_and_worst_tokens(browser, lens_app_url, tmp_path):  # noqa: F811
    url, trace = lens_app_url
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="light")
    try:
        app = App(ctx.new_page(), url)
        app.tab("Inspector")
        app.wait_text("#insp-lens-status", "Score with trainer view")
        assert app.js("document.querySelectorAll('#insp-lens-worst .ali-lens-tok').length") == 0
        app.page.locator("#insp-lens-score").click()
        # the click starts the scoring (its "scoring N tokens…" line), which the app gives up after
        # logprob_lens.SCORE_TIMEOUT_S: waiting longer than that says nothing more
        app.wait_text("#insp-lens-status", "scor", timeout=60_000)
        status = app.wait_status("insp-lens-status", kinds=("ok", "err"), timeout=(SCORE_TIMEOUT_S + 60) * 1000)
        assert "scored" in status and "mask-1 tokens" in status, status
        # the numbers, with verl's names, over the mask-1 tokens that have rollout logprobs
        n_policy = sum(len(s.logprobs) for s in trace.steps if s.logprobs is not None and s.mask == 1)
        values = app.js("""() => Object.fromEntries(Array.from(document.querySelectorAll('#insp-lens-numbers tr[data-metric]'),
                           (r) => [r.dataset.metric, parseFloat(r.querySelector('td[data-value]').dataset.value)]))""")
        assert values["tokens"] == n_policy > 0, values
        assert 0 <= values["mean_abs_delta"] <= values["max_abs_delta"] < 1e-3, values  # float32: same weights, same math
        for k in ("rollout_probs_diff_max", "rollout_probs_diff_mean", "rollout_probs_diff_std", "outside_cap", "kl_k3"):
            assert k in values, k
        text = app.text("#insp-lens-numbers")
        assert "rollout_probs_diff_max" in text and "ratio outside [1/C, C]" in text and "KL (k3)" in text
        # the three charts, drawn: one point per mask-1 token, histogram and per-step bars
        app.page.wait_for_selector("#insp-lens-scatter .scatterlayer .trace:nth-child(2) .point")
        assert app.js("document.querySelectorAll('#insp-lens-scatter .scatterlayer .trace:nth-child(2) .point').length") == n_policy
        app.page.wait_for_selector("#insp-lens-ratios .bars path")
        app.page.wait_for_selector("#insp-lens-steps .bars path")
        # the session's trace is the scored one: the selected step's info carries the trainer's logprobs
        app.page.get_by_role("tab", name="Tool results / info").click()
        app.page.wait_for_function("() => (document.querySelector('#insp-step-results').textContent || '').includes('trainer_logprobs')")

        # a worst token, in another step than the selected one when there is one
        app.js("""() => { const tv = document.querySelector('#insp-tokens .tv'); window.__tvSel = [];
                   tv.addEventListener('tv-select', (e) => window.__tvSel.push(e.detail.index)); }""")
        sel = app.js("document.querySelector('#insp-tokens .tv').dataset.sel")
        buttons = app.js("() => Array.from(document.querySelectorAll('#insp-lens-worst .ali-lens-tok'), (b) => [+b.dataset.pos, b.dataset.step])")
        assert len(buttons) == min(20, n_policy)
        pos, step = next(((p, s) for p, s in buttons if s != sel), buttons[0])
        app.page.locator(f'#insp-lens-worst .ali-lens-tok[data-pos="{pos}"]').click()
        app.page.wait_for_function("(i) => window.__tvSel.includes(i)", arg=pos)
        assert app.js("window.__tvSel") == [pos]
        app.page.wait_for_function("(s) => document.querySelector('#insp-step input').value.startsWith(s + ' · ')", arg=step)
        app.wait_text("#insp-step-head", f"Step {step}")
        app.page.wait_for_function("(i) => (document.querySelector('#insp-tokens .tv-info').textContent || '').startsWith('#' + i + ' ')",
                                   arg=pos)
        assert app.js("document.querySelector('#insp-tokens .tv').dataset.sel") == step
        assert app.js("document.querySelectorAll('#insp-tokens .tv-tok-sel').length") == 1

        missing = check_contrast(app, lens_targets(), "logprob lens, light theme")
        assert not missing, f"targets not found (the test would check nothing): {missing}"
        # the same page in the dark theme: gradio's, the body's "dark" class (what a dark OS setting
        # gives it, tests/test_browser_run_charts.py); the lens and its charts follow it in CSS
        app.js("document.body.classList.add('dark')")
        app.next_frame()
        missing = check_contrast(app, lens_targets(), "logprob lens, dark theme")
        assert not missing, f"targets not found in the dark theme: {missing}"
        app.assert_no_xss("logprob lens")
        app.assert_clean()
    finally:
        ctx.close()
