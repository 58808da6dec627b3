"""The capture gateway's sessions in a real browser: ``app.py --gateway`` in headless Chromium, a
session captured through the app's own port by the ``openai`` SDK (a linear turn, then an edited
tool result: a fork), shown in the Trace files tab's Captured sessions view as a tree with both
branches and the fork's cause; a branch opens in the Inspector. A capture file with markup in
its branch names and details shows it as text."""

from __future__ import annotations

import json

import openai
import pytest
from test_browser import IMG, App, running_app  # noqa: F401 - fixtures, used by name
from test_families import ANSWER, CALL

from backend.parsers import get_parser

pytestmark = pytest.mark.browser
USER = {"role": "user", "content": "What's the weather in Seattle?"}
TOOLS = [{"type": "function", "function": {"name": CALL["name"], "description": "Temperature in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def captured_app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cap-app")
    script = tmp / "script.json"
    script.write_text(json.dumps([get_parser("hermes").format_calls([CALL]), ANSWER, ANSWER]))
    cap = tmp / "captures"
    cap.mkdir()
    evil = {"format_version": 1, "id": "x", "prompt_ids": [1], "response_ids": [], "response_mask": [],
            "metadata": {"source": "gateway", "branch": {"id": "b0" + IMG, "parent": None, "fork_at": None, "cause": None}}}
    child = {**evil, "id": "y", "metadata": {"source": "gateway", "branch": {
        "id": "b1", "parent": "b0" + IMG, "fork_at": 1, "cause": "message_edited" + IMG, "detail": IMG}}}
    (cap / "evil.jsonl").write_text(json.dumps(evil) + "\n" + json.dumps(child) + "\n")
    with running_app(["--backend", "scripted", "--script", str(script), "--gateway", "--capture-dir", str(cap),
                      "--tokenizer", "qwen3"], tmp / "app.log") as url:
        yield url


@pytest.fixture
def app(browser, captured_app):  # noqa: F811 - the browser fixture
    ctx = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        yield App(ctx.new_page(), captured_app)
    finally:
        ctx.close()


def capture_a_fork(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url.rstrip('/')}/s/demo/v1", api_key="k", max_retries=0)
    r = client.chat.completions.create(model="m", messages=[USER], tools=TOOLS)
    m = r.choices[0].message.model_dump(exclude_none=True)
    tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": '{"temperature": 72}'}
    assert client.chat.completions.create(model="m", messages=[USER, m, tool], tools=TOOLS).choices[0].message.content == ANSWER
    edited = {**tool, "content": '{"temperature": 10}'}
    assert client.chat.completions.create(model="m", messages=[USER, m, edited], tools=TOOLS).choices[0].message.content == ANSWER


def test_a_captured_fork_shows_both_branches_and_its_cause(app, captured_app):
    capture_a_fork(captured_app)
    app.tab("Trace files")
    app.page.locator("#cap-refresh").click()  # the view polls too; a click need not wait for it
    app.page.locator("#cap-session input").click()
    app.page.get_by_role("option", name="demo").click()
    app.wait_text("#cap-tree", "message_edited")
    tree = app.text("#cap-tree")
    assert "session demo: 2 branch(es)" in tree and "forked from b0 at token" in tree
    assert app.js("document.querySelectorAll('#cap-tree li[data-branch=\"b0\"] li[data-branch=\"b1\"]').length") == 1
    cells = app.js("Array.from(document.querySelectorAll('#cap-branches [data-row][data-col=\"0\"]'), (c) => c.innerText.trim())")
    assert cells == ["b0", "b1"]
    app.cell("cap-branches", 1, 0).click()
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    app.wait_text("#ali-tabs", "captured · demo · b1")
    app.assert_clean()


def test_markup_in_a_capture_file_is_text(app):
    app.tab("Trace files")
    app.page.locator("#cap-session input").click()
    app.page.get_by_role("option", name="evil").click()
    app.wait_text("#cap-tree", "2 branch(es)")
    assert 'onerror="window.__xss=1"' in app.text("#cap-tree")
    app.assert_no_xss("captured sessions tree")
    app.assert_clean()
