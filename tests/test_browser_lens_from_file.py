"""The logprob lens from the file, in headless Chromium (issue 30, item 4): the app with no model
(``--backend scripted``), a prime-rl token export (written by the real library,
tests/fixtures_gen/gen_verifiers.py) uploaded in the Trace files tab, its first row opened in the
Inspector: the lens shows the file's own rollout and trainer logprobs at once, with no Score press,
its status saying "from the file"; the numbers equal what the file says (read here with json:
loss-mask token count, largest |trainer − inference|, prime-rl's own mismatch_kl averaged over the
loss mask), the first worst token is the file's largest |Δ| and selects that token in the token
view. Light and dark: every text of the lens measured against its background (WCAG contrast), and
a screenshot of the lens in each (``ALI_SCREENSHOT_DIR``: logprob_lens_file_light.png,
logprob_lens_file_dark.png; docs/img/logprob-lens-file-*.png are these).
"""

from __future__ import annotations

import json

import pytest
from test_browser import ROOT, App, pytestmark, shots  # noqa: F401 - fixtures, used by name
from test_browser_inspector import check_contrast
from test_browser_logprob_lens import lens_targets

PRIME_RL = ROOT / "tests" / "data" / "import" / "verifiers" / "run" / "token_exports" / "step_3" / "rank_0.jsonl"

METRICS_JS = """() => Object.fromEntries(Array.from(document.querySelectorAll('#insp-lens-numbers tr[data-metric]'),
                  (r) => [r.dataset.metric, parseFloat(r.querySelector('td[data-value]').dataset.value)]))"""


def test_a_prime_rl_export_shows_in_the_lens_without_scoring(browser, app_url, shots):  # noqa: F811 - fixtures
    row = json.loads(PRIME_RL.read_text(encoding="utf-8").splitlines()[0])
    on = [i for i, m in enumerate(row["loss_mask"]) if m]
    delta = {i: row["trainer_logprobs"][i] - row["inference_logprobs"][i] for i in on}
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="light")
    try:
        app = App(ctx.new_page(), app_url)
        assert not app.js("document.body.classList.contains('dark')")
        app.tab("Trace files")
        app.page.locator("#tf-upload input[type=file]").set_input_files(str(PRIME_RL))
        status = app.wait_text("#tf-status", "rank_0.jsonl")
        assert "imported from prime-rl" in status, status
        app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 2")
        app.cell("tf-table", 0, 1).click()
        app.page.wait_for_selector("#tab-inspector", state="visible")
        app.wait_text("#insp-summary", "prime-rl-s3-r0-0")
        lens = app.wait_status("insp-lens-status", kinds=("ok",))
        assert "from the file" in lens and "prime-rl trainer_logprobs" in lens, lens

        values = app.js(METRICS_JS)
        assert values["tokens"] == len(on), values
        assert values["max_abs_delta"] == pytest.approx(max(map(abs, delta.values())), rel=1e-6)
        assert values["kl_k3"] == pytest.approx(sum(row["mismatch_kl"][i] for i in on) / len(on), rel=1e-2)
        assert "prime-rl trainer_logprobs" in app.text("#insp-lens-numbers .ali-lens-src")
        app.page.wait_for_selector("#insp-lens-scatter .scatterlayer .trace:nth-child(2) .point")
        assert app.js("document.querySelectorAll('#insp-lens-scatter .scatterlayer .trace:nth-child(2) .point').length") == len(on)
        app.page.wait_for_selector("#insp-lens-ratios .bars path")
        app.page.wait_for_selector("#insp-lens-steps .bars path")

        # the tokens that dominate it: the first worst token is the file's largest |Δ|; a click selects it
        pos = app.js("+document.querySelector('#insp-lens-worst .ali-lens-tok').dataset.pos")
        assert abs(delta[pos]) == pytest.approx(max(map(abs, delta.values())), rel=1e-6)
        app.page.locator(f'#insp-lens-worst .ali-lens-tok[data-pos="{pos}"]').click()
        app.page.wait_for_function("(i) => (document.querySelector('#insp-tokens .tv-info').textContent || '').startsWith('#' + i + ' ')",
                                   arg=pos)

        # light, then the same page dark: gradio's dark theme is the body's "dark" class (what a
        # dark OS setting gives it, tests/test_browser_run_charts.py), which the lens follows in CSS
        for scheme in ("light", "dark"):
            if scheme == "dark":
                app.js("document.body.classList.add('dark')")
                app.next_frame()
            missing = check_contrast(app, lens_targets(), f"logprob lens from the file, {scheme} theme")
            assert not missing, f"targets not found (the test would check nothing): {missing}"
            app.page.locator("#insp-lens").scroll_into_view_if_needed()
            app.page.locator("#insp-lens").screenshot(path=str(shots / f"logprob_lens_file_{scheme}.png"))
        app.assert_no_xss("logprob lens from the file")
        app.assert_clean()
    finally:
        ctx.close()
