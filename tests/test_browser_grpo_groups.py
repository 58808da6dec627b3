"""The GRPO group view on the Trace files tab, in headless Chromium (the real app, see
tests/test_browser.py): a TRL completion log (written by ``trl.GRPOTrainer``,
tests/fixtures_gen/gen_trl.py) is uploaded, the group view lists its two prompts' groups, the
ranked table shows the rewards the Parquet file holds (read here with pandas), two samples picked
in the A and B pickers are shown side by side with their first difference framed; screenshots in
the light and the dark theme (``ALI_SCREENSHOT_DIR``: grpo_groups_light.png, grpo_groups_dark.png).
"""

from __future__ import annotations

import pandas as pd
from test_browser import _NAVIGATION_ABORT, ROOT, App, app, pytestmark, shots  # noqa: F401 - fixtures, used by name

TRL_STEP1 = ROOT / "tests" / "data" / "import" / "trl" / "completions" / "completions_00001.parquet"


def test_group_view_of_a_trl_log_light_and_dark(app, shots):  # noqa: F811 - fixtures
    df = pd.read_parquet(TRL_STEP1)
    rewards = sorted(round(float(df[["right_answer", "brevity"]].iloc[i].sum()), 4) for i in range(len(df)))
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(TRL_STEP1))
    status = app.wait_text("#tf-status", "completions_00001.parquet")
    assert "imported from trl" in status, status
    app.page.locator("#gv-section").get_by_text("GRPO groups", exact=False).first.click()
    app.page.wait_for_function("document.querySelectorAll('#gv-table [data-row][data-col=\"0\"]').length === 2")
    app.wait_text("#gv-note", "2 group(s)")
    assert "link to this group" in app.text("#gv-note")

    # the other group, from the group picker
    app.page.locator("#gv-group input").click()
    options = app.page.get_by_role("option")
    assert options.count() == 2
    second = options.nth(1).inner_text()
    options.nth(1).click()
    app.wait_text("#gv-note", second.split(" · ")[1][:30])
    shown = sorted(round(float(app.cell("gv-table", r, 3).inner_text()), 4) for r in range(2))
    assert set(shown) <= set(rewards) and shown[0] < shown[1]
    assert app.cell("gv-table", 0, 0).inner_text() == "1"

    # pick the two samples the other way round: A = rank 2, B = rank 1
    app.page.locator("#gv-a input").click()
    app.page.get_by_role("option").filter(has_text="2 · ").first.click()
    app.page.locator("#gv-b input").click()
    app.page.get_by_role("option").filter(has_text="1 · ").first.click()
    app.wait_text("#gv-aligned", "A: rank 2")
    app.wait_text("#gv-aligned", "B: rank 1")
    departs = app.js("document.querySelector('#gv-aligned .gv-pair').dataset.departs")
    assert departs.isdigit()
    assert app.js("document.querySelectorAll('#gv-aligned .gv-body .gv-at').length") == 2
    # the framed token's outline is drawn (a colour, not none), side by side
    cols = app.js("[...document.querySelectorAll('#gv-aligned .gv-col')].map(e => e.getBoundingClientRect().left)")
    assert len(cols) == 2 and cols[0] < cols[1]
    app.page.locator("#gv-aligned").scroll_into_view_if_needed()
    app.shot(shots, "grpo_groups_light")

    # the dark theme (gradio's: the body's "dark" class): the token colours follow the theme
    light_bg = app.js("getComputedStyle(document.querySelector('#gv-aligned .gv-body')).backgroundColor")
    app.js("document.body.classList.add('dark')")
    app.next_frame()
    dark_bg = app.js("getComputedStyle(document.querySelector('#gv-aligned .gv-body')).backgroundColor")
    assert light_bg == "rgb(255, 255, 255)" and dark_bg == "rgb(17, 24, 39)"  # --ali-tv-bg, ui/theme.py
    app.shot(shots, "grpo_groups_dark")
    app.assert_clean()


def test_a_link_opens_a_group_with_its_sample(browser, app_url):  # noqa: F811 - fixtures
    """``?tab=files&group=<key>&trace=<id>`` (as the view writes it) on the samples every session holds, opened in a new page: the
    Trace files tab opens with the group view open on that group, the linked sample as A beside the
    best one as B; the Inspector, opened next, keeps ``group=`` in the address it rewrites, and a
    reload of that address shows the same group and sample."""
    from urllib.parse import parse_qs, quote, urlsplit

    from backend.checks.groups import group_traces
    from backend.trace import load_traces

    traces = [t for p in sorted((ROOT / "sample_traces").glob("*.jsonl")) for t in load_traces(str(p)).traces]
    g = next(g for g in group_traces(traces) if len(g.samples) >= 3)
    linked = g.samples[-1]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        # the page first as App opens it (the Playground shown), then the link: a link opens another
        # tab, and App's wait for the Playground's Send would race the app's load event
        app = App(ctx.new_page(), app_url)
        app.page.goto(f"{app_url}?tab=files&group={quote(g.key, safe='')}&trace={quote(linked.id, safe='')}")
        app.page.wait_for_selector("#tf-table", state="visible")
        app.page.wait_for_function(f"document.querySelectorAll('#gv-table [data-row][data-col=\"0\"]').length === {len(g.samples)}")
        assert f"group {g.key}" in app.wait_text("#gv-note", g.key)
        app.wait_text("#gv-aligned", f"A: rank {linked.rank} · {linked.id}")
        assert "B: rank 1" in app.text("#gv-aligned")
        # the Inspector, opened on the linked trace, writes its trace and step into the address:
        # the group stays named there, and the address reopens the same group and sample
        app.tab("Inspector")
        app.page.wait_for_function("new URL(window.location.href).searchParams.get('step') !== null")
        q = parse_qs(urlsplit(app.js("window.location.href")).query)
        assert q["group"] == [g.key] and q["tab"] == ["inspector"], q
        assert q["trace"] != [linked.id]  # the Inspector names the trace by its label now
        app.page.reload()  # not App.reload: it waits for the Playground, and this address opens the Inspector
        app.page.wait_for_selector("#insp-tokens .tv-c > span", state="visible")
        assert parse_qs(urlsplit(app.js("window.location.href")).query)["group"] == [g.key]
        app.tab("Trace files")
        app.wait_text("#gv-note", f"group {g.key}")
        app.wait_text("#gv-aligned", f"A: rank {linked.rank} · {linked.id}")
        # the two navigations (the link, the reload) abort the previous page's requests: gradio's
        # client logs those (as App.reload drops them); any other error stays
        app.errors[:] = [e for e in app.errors if not _NAVIGATION_ABORT.search(e)]
        app.assert_clean()
    finally:
        ctx.close()
