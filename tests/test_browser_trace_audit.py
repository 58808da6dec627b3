"""The re-render audit on the Trace files tab, in headless Chromium (the real app, see
tests/test_browser.py): the sample traces the tab shows are audited with one click, the sentence,
tables and chart show what :func:`backend.checks.audit.audit` says of the same traces (run here), a
rollout opens in the Inspector; an upload clears the audit of the traces shown before, and its
traces that cannot be audited are listed with why, their text never markup.
"""

from __future__ import annotations

import html
import json

import pytest
from test_browser import (  # noqa: F401 - fixtures, used by name
    ROOT,
    SCRIPT,
    App,
    app,
    pytestmark,
    shots,
)

from backend.trace import load_traces, write_jsonl

SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))


@pytest.fixture(scope="module")
def expected():
    """backend.checks.audit of the samples, each with the tokenizer the app decodes it with."""
    from backend.checks.audit import audit
    from ui.context import AppContext

    ctx = AppContext()
    traces = [t for p in SAMPLES for t in load_traces(str(p)).traces]
    return traces, audit(traces, lambda t: ctx.trace_bundle(t)[0] or "no tokenizer")


def _open_and_run(page_app: App) -> None:
    page_app.page.locator("#ta-section").get_by_text("Re-render audit", exact=False).first.click()
    page_app.page.locator("#ta-run").click()


def _cells(page_app: App, elem_id: str, col: int) -> list[str]:
    return page_app.js(f"""Array.from(document.querySelectorAll('#{elem_id} [data-row][data-col="{col}"]'), (c) => c.innerText.trim())""")


def test_audit_the_samples_then_open_a_rollout(app, shots, expected):  # noqa: F811 - fixtures
    traces, rep = expected
    app.tab("Trace files")
    _open_and_run(app)
    summary = app.wait_text("#ta-summary", "under a full re-render", timeout=120_000)
    assert rep.sentence() + "." in summary
    assert f"Audited {len(traces)} trace(s) of sample_traces" in summary
    # one bar per cause (or the chart says no rollout breaks)
    by = rep.by_cause()
    if by:
        app.page.wait_for_function(f"document.querySelectorAll('#ta-chart .bars path').length === {len(by)}")
    else:
        app.wait_text("#ta-chart", "no rollout breaks")
    # the tables
    app.page.wait_for_function(f"document.querySelectorAll('#ta-rollouts [data-row][data-col=\"0\"]').length === {len(traces)}")
    assert _cells(app, "ta-rollouts", 1) == [t.id for t in traces]
    assert _cells(app, "ta-rollouts", 2) == ["yes" if a.broken else "no" for a in rep.traces]
    assert [int(x) for x in _cells(app, "ta-causes", 1)] == list(by.values())
    app.shot(shots, "trace_audit")

    # a rollout that breaks (else the first) opens in the Inspector, as a row of the tab's table does
    k = next((i for i, a in enumerate(rep.traces) if a.broken), 0)
    app.cell("ta-rollouts", k, 1).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")
    app.wait_text("#insp-summary", traces[k].id)
    app.assert_clean()


def test_an_upload_clears_the_audit_and_lists_what_cannot_be_audited(app, tmp_path, expected):  # noqa: F811 - fixtures
    traces, _ = expected
    base = traces[0]
    tok = base.tokenizer.model_copy(update={"name": "no-such-tokenizer", "template_sha256": None})
    odd = [base.model_copy(update={"id": "audit-ok"}),
           base.model_copy(update={"id": f"evil {SCRIPT}", "tokenizer": tok}),
           base.model_copy(update={"id": "text-only", "prompt_ids": [], "response_ids": [], "response_mask": [], "steps": [],
                                   "message_spans": []})]
    f = tmp_path / "odd.jsonl"
    write_jsonl(odd, str(f))
    app.tab("Trace files")
    _open_and_run(app)
    app.wait_text("#ta-summary", "under a full re-render", timeout=120_000)
    # another file in the tab: the audit shown is of other traces, and goes
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "odd.jsonl: 3 trace(s) loaded")
    app.wait_text("#ta-summary", "audit them again")
    app.page.wait_for_function("document.querySelectorAll('#ta-rollouts [data-row][data-col=\"1\"]').length === 0")
    app.page.locator("#ta-run").click()
    summary = app.wait_text("#ta-summary", "not audited", timeout=120_000)
    assert "Audited 3 trace(s) of odd.jsonl" in summary and "2 trace(s) not audited" in summary
    assert f"evil {SCRIPT}" in summary  # shown as text
    app.page.wait_for_function("document.querySelectorAll('#ta-rollouts [data-row][data-col=\"0\"]').length === 3")
    assert _cells(app, "ta-rollouts", 1) == ["audit-ok", f"evil {SCRIPT}", "text-only"]
    breaks = _cells(app, "ta-rollouts", 2)
    assert breaks[1:] == ["not audited", "not audited"] and breaks[0] in ("yes", "no")
    why = _cells(app, "ta-rollouts", 3)
    assert "'no-such-tokenizer' is not available offline" in why[1] and "no token ids" in why[2]
    assert html.escape(SCRIPT) not in json.dumps(summary)  # escaped once, not twice
    app.assert_no_xss("re-render audit")
    app.assert_clean()
