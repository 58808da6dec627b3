"""Charts by training step on the Trace files tab, in headless Chromium (the real app, see
tests/test_browser.py): they render for the samples (one group, and a note saying why), redraw for
an uploaded run with training steps, the step pickers update the comparison, the dark theme
recolours their text, and text from the file stays text.
"""

from __future__ import annotations

import pytest
from test_browser import (  # noqa: F401 - fixtures, used by name
    PAYLOAD,
    ROOT,
    App,
    app,
    pytestmark,
    shots,
)

from backend.trace import load_traces

SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))


def _run_file(path, steps: dict[int, int], reason: str | None = None) -> dict[int, int]:
    """A JSONL of the sample traces re-labelled with metadata training_step: ``steps`` maps a step
    to how many traces it gets. Returns the same map."""
    traces = [t for p in SAMPLES for t in load_traces(str(p)).traces]
    lines, k = [], 0
    for step, n in steps.items():
        for _ in range(n):
            t = traces[k % len(traces)]
            upd = {"id": f"{t.id}-{step}-{k}", "metadata": {**t.metadata, "training_step": step, "score": step / 10}}
            if reason is not None:
                upd["termination_reason"] = reason
            lines.append(t.model_copy(update=upd).to_json())
            k += 1
    path.write_text("\n".join(lines) + "\n")
    return steps


def _diff(a: App) -> dict[str, list[str]]:
    """The comparison table: measure -> [A, B, B − A] as shown."""
    return a.js("""() => {
      const out = {};
      const rows = new Map();
      document.querySelectorAll('#rc-diff [data-row][data-col]').forEach((c) => {
        const r = c.getAttribute('data-row');
        if (!rows.has(r)) rows.set(r, []);
        rows.get(r)[Number(c.getAttribute('data-col'))] = c.innerText.trim();
      });
      rows.forEach((cells) => { out[cells[0]] = cells.slice(1); });
      return out;
    }""")


def _svg_text(a: App, sel: str) -> str:
    return a.js("(sel) => Array.from(document.querySelectorAll(sel), (e) => e.textContent).join(' ')", sel)


def _ticks(a: App, sel: str, axis: str = "xtick") -> list[str]:
    return a.js(f"Array.from(document.querySelectorAll('{sel} .{axis} text'), (t) => t.textContent)")


def test_run_charts_render_and_the_compare_picker_updates_them(app, shots, tmp_path):  # noqa: F811 - fixtures
    app.tab("Trace files")
    # the samples: no training step, one group, a note that says so; the charts drew
    app.wait_text("#rc-note", "no trace in this set has a training step")
    app.page.wait_for_selector("#rc-steps .main-svg")
    assert "only one group" in app.text("#rc-compare-note")

    f = tmp_path / "run.jsonl"
    steps = _run_file(f, {1: 4, 2: 7, 3: 5})
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "run.jsonl")
    app.wait_text("#rc-note", "3 training step(s)")
    assert "16 trace(s)" in app.text("#rc-note")
    app.page.wait_for_function("document.querySelectorAll('#rc-steps .main-svg .scatterlayer .trace').length >= 6")
    assert _ticks(app, "#rc-steps")[:3] == ["1", "2", "3"]
    # the stacked end-state bars and the score panel drew
    assert app.js("document.querySelectorAll('#rc-steps .bars path').length") >= 3
    legend = _svg_text(app, "#rc-steps .legend")
    assert "answered (no_tool_calls)" in legend
    # default comparison: first against last step
    app.page.wait_for_function("document.querySelectorAll('#rc-diff [data-row]').length > 5")
    d = _diff(app)
    assert [float(x) for x in d["traces"]] == [steps[1], steps[3], steps[3] - steps[1]]
    assert [float(x) for x in d["score: mean"][:2]] == [0.1, 0.3]
    assert app.js("document.querySelectorAll('#rc-compare .bars path').length") >= 4
    app.shot(shots, "run_charts")

    # pick step B = 2: the table and the histograms follow
    app.page.locator("#rc-step-b input").click()
    app.page.get_by_role("option", name="2", exact=True).click()
    app.page.wait_for_function(
        "() => Array.from(document.querySelectorAll('#rc-diff [data-row][data-col=\"2\"]')).some((c) => c.innerText.trim() === '7')")
    d = _diff(app)
    assert [float(x) for x in d["traces"]] == [steps[1], steps[2], steps[2] - steps[1]]
    assert float(d["score: mean"][1]) == 0.2
    assert "B: 2" in _svg_text(app, "#rc-compare .legend")
    # same step on both sides: a note, not an error
    app.page.locator("#rc-step-a input").click()
    app.page.get_by_role("option", name="2", exact=True).click()
    app.wait_text("#rc-compare-note", "pick two different ones")
    # a filter changes the table but not the set: the charts stay (no redraw back to the default pair)
    app.page.locator("#tf-search textarea, #tf-search input").first.fill("Seattle")
    app.page.wait_for_function("document.querySelector('#tf-count') && !document.querySelector('#tf-count').innerText.startsWith('16 of')")
    app.next_frame()
    assert "pick two different ones" in app.text("#rc-compare-note")
    app.assert_clean()


@pytest.fixture
def dark_app(browser, app_url):  # noqa: F811 - the fixtures above
    """A new session in a dark-scheme browser (as the OS sets it)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    try:
        yield App(ctx.new_page(), app_url)
    finally:
        ctx.close()


def test_run_charts_dark_theme_and_escaped_text(dark_app, shots, tmp_path):  # noqa: F811 - fixtures
    app = dark_app  # noqa: F811 - this test's page
    f = tmp_path / "evil.jsonl"
    _run_file(f, {7: 2, 8: 2}, reason=PAYLOAD)
    assert app.js("document.body.classList.contains('dark')")
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#rc-note", "2 training step(s)")
    app.page.wait_for_function("document.querySelectorAll('#rc-steps .legend text').length > 0")
    # the end state shows as text in the legend and the comparison table, never as markup
    assert "onerror=" in _svg_text(app, "#rc-steps .legend")
    app.page.wait_for_function("document.querySelectorAll('#rc-diff [data-row]').length > 5")
    assert any("onerror=" in k for k in _diff(app))
    app.assert_no_xss("run charts")
    # dark theme: the charts' titles, ticks and legend take the dark page's chart text colour
    fills = app.js("""() => Array.from(document.querySelectorAll(
        '#rc-steps .main-svg :is([class$="tick"], [class^="g-"][class$="title"], .legend, .annotation) text, '
        + '#rc-compare .main-svg :is([class$="tick"], [class^="g-"][class$="title"], .legend, .annotation) text'),
        (t) => getComputedStyle(t).fill)""")
    # every subplot's ticks and axis titles too (.x2tick, .g-x3title), not only the first axis'
    assert len(fills) > 40 and set(fills) == {"rgb(229, 231, 235)"}, set(fills)
    app.shot(shots, "run_charts_dark")
    app.assert_clean()


def test_run_charts_follow_a_verl_folder_shown_on_the_tab(app, tmp_path):  # noqa: F811 - fixtures
    """The tab showing a folder in verl's dump layout (the local-mode folder field): steps come
    from the file names; a step file written later appears in the charts (the follow timer)."""
    run = tmp_path / "rollout_data"
    run.mkdir()
    traces = [t for p in SAMPLES for t in load_traces(str(p)).traces]

    def dump(step: int, n: int) -> None:
        lines = [traces[k % len(traces)].model_copy(update={"id": f"v{step}-{k}"}).to_json() for k in range(n)]
        (run / f"{step}.jsonl").write_text("\n".join(lines) + "\n")

    dump(1, 3)
    dump(2, 5)
    app.tab("Trace files")
    # the page's own load events (the samples' table, then their charts) finish first: under load
    # they could land after the Show click and put the samples' charts back over the folder's
    app.wait_text("#rc-note", "8 trace(s); no trace in this set has a training step")
    box = app.page.locator("#tf-folder textarea, #tf-folder input").first
    if not box.is_visible():  # the trace-set section is collapsed when the app has no --traces
        app.page.locator("#tf-set").get_by_text("Trace set:").first.click()
        # typed into while the section was still opening, the text was lost (2 runs in 5 alone here):
        # the box is typed into once it shows, as a person would
        box.wait_for(state="visible")
        app.next_frame()
    box.fill(str(run))
    assert box.input_value() == str(run)
    app.page.locator("#tf-set-show").click()
    app.wait_text("#rc-note", "8 trace(s) in 2 training step(s)")
    app.page.wait_for_function("document.querySelectorAll('#rc-diff [data-row]').length > 5")
    assert [float(x) for x in _diff(app)["traces"]] == [3, 5, 2]
    dump(3, 4)
    app.wait_text("#rc-note", "12 trace(s) in 3 training step(s)")
    app.page.wait_for_function(
        "() => Array.from(document.querySelectorAll('#rc-diff [data-row][data-col=\"2\"]')).some((c) => c.innerText.trim() === '4')")
    assert [float(x) for x in _diff(app)["traces"]] == [3, 4, 1]  # the default pair: first and last step
    app.assert_clean()
