"""Trace sets in a real browser (issue 16): ``app.py --traces DIR`` in headless Chromium, with
the fixtures of ``tests/test_browser.py``. A writer PROCESS appends traces to the folder (half a
line at a time, and a new ``<step>.jsonl`` file) while the page follows: the rows appear in the
table without a reload, a line being written is never reported as a bad record, and a row opens in
the Inspector. In local mode the folder field shows another folder; a path that names nothing
gives a message. Every wait is on a condition, never a sleep; no timing assertion."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys

import pytest
from test_browser import App, running_app  # noqa: F401 - fixtures, used by name

from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import write_jsonl

pytestmark = pytest.mark.browser
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Paris"}}\n</tool_call>'


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location.
    """
    return {"temperature": 72, "city": city}


def engine_traces(n: int, prefix: str):
    b = load_tokenizer("qwen3")
    base = []
    for script in ([CALL, "It is 72°F in Paris."], ["plain answer"]):
        loop = AgentLoop(ScriptedGenerator(b.tokenizer, script), b, tools=ToolRegistry.from_functions([get_current_temperature]),
                         config=LoopConfig())
        # in a thread of its own: Playwright's sync API runs an event loop in this one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            base.append(pool.submit(asyncio.run, loop.run([{"role": "user", "content": "What's the weather in Paris?"}])).result())
    out = []
    for i in range(n):
        t = base[i % 2].model_copy(deep=True)
        t.id = f"{prefix}-{i:03d}"
        out.append(t)
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "rollout"
    d.mkdir()
    write_jsonl(engine_traces(12, "step1"), str(d / "1.jsonl"))
    return d


@pytest.fixture(scope="module")
def set_app_url(tmp_path_factory, run_dir):
    """``app.py --backend scripted --traces DIR`` on a free port (local mode); killed at the end."""
    tmp = tmp_path_factory.mktemp("app")
    with running_app(["--backend", "scripted", "--traces", str(run_dir)], tmp / "app.log",
                     env={"ALI_TRACE_INDEX_CACHE": str(tmp / "cache")}) as url:
        yield url


@pytest.fixture
def app(browser, set_app_url):  # noqa: F811 - the browser fixture
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    a = App(page, set_app_url)
    try:
        yield a
    finally:
        ctx.close()


WRITER = r'''
import os, sys, time
src, out_dir, go = sys.argv[1], sys.argv[2], sys.argv[3]
lines = open(src, encoding="utf-8").read().splitlines()
with open(f"{out_dir}/1.jsonl", "a", encoding="utf-8") as f:  # appended to the file being shown
    for line in lines[:3]:
        f.write(line[: len(line) // 2]); f.flush()
        time.sleep(0.3)  # half a line on disk across a poll of the page
        f.write(line[len(line) // 2 :] + "\n"); f.flush()
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:  # the test has seen the first rows
    time.sleep(0.05)
with open(f"{out_dir}/2.jsonl", "w", encoding="utf-8") as f:  # the next training step's file
    for line in lines[3:]:
        f.write(line + "\n"); f.flush()
        time.sleep(0.2)
print("done", flush=True)
'''


def ids_in_table(app: App) -> list[str]:
    return app.js("Array.from(document.querySelectorAll('#tf-table [data-row][data-col=\"2\"]'), (c) => c.innerText.trim())")


def test_rows_appear_while_a_writer_appends(app, run_dir, tmp_path):
    app.tab("Trace files")
    app.wait_text("#tf-set-status", "12 trace(s) indexed")
    assert set(ids_in_table(app)) == {f"step1-{i:03d}" for i in range(12)}
    headers = app.js("Array.from(document.querySelectorAll('#tf-table th'), (h) => h.innerText.trim())")
    assert "step" in " ".join(headers) and "file" in " ".join(headers)
    src = tmp_path / "new.jsonl"
    write_jsonl(engine_traces(6, "live"), str(src))
    go = tmp_path / "go"  # the writer holds its second file until the test has seen the first rows
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(src), str(run_dir), str(go)], stdout=subprocess.PIPE, text=True)
    seen_partial_ok = []
    try:
        # the first appended trace shows up (newest first: at the top) while the writer still writes
        app.page.wait_for_function(
            "() => Array.from(document.querySelectorAll('#tf-table [data-row][data-col=\"2\"]')).some((c) => c.innerText.includes('live-000'))",
            timeout=30_000)
        seen_partial_ok.append(proc.poll() is None)
        go.touch()
        assert "bad record" not in app.text("#tf-set-status")
        app.wait_text("#tf-set-status", "18 trace(s) indexed in 2 file(s)", timeout=60_000)
    finally:
        go.touch()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "done" in out
    assert seen_partial_ok == [True]  # rows appeared before the writer had finished
    assert "bad record" not in app.text("#tf-set-status")
    ids = ids_in_table(app)
    assert ids[:6] == [f"live-{i:03d}" for i in range(5, -1, -1)]  # newest first
    # the step filter lists the new file's step
    steps = app.js("Array.from(document.querySelectorAll('#tf-step input'), (i) => i.value)")
    assert steps  # the dropdown exists
    # a row opens in the Inspector by its bytes
    row = ids.index("live-004")
    app.cell("tf-table", row, 2).click()
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    app.wait_text("#ali-tabs", "live-004")
    app.assert_clean()


def test_local_mode_folder_field(app, tmp_path):
    """Another folder typed in local mode; its file names, ids and messages (here XSS payloads) are
    shown as text."""
    from test_browser import IMG, PAYLOAD

    other = tmp_path / "other"
    other.mkdir()
    write_jsonl(engine_traces(3, "other"), str(other / "7.jsonl"))
    evil = engine_traces(1, "x")[0]
    evil.id = "zz" + IMG
    evil.metadata["source"] = IMG
    evil.messages[0]["content"] = PAYLOAD
    write_jsonl([evil], str(other / (IMG.replace("/", "") + ".jsonl")))
    (other / "8.jsonl").write_text('{"id": "' + IMG.replace('"', '\\"') + '", bad\n')
    app.tab("Trace files")
    app.wait_text("#tf-set-status", "trace(s) indexed")
    box = app.page.locator("#tf-folder textarea, #tf-folder input").first
    box.fill(str(tmp_path / "missing"))
    app.page.locator("#tf-set-show").click()
    app.wait_text("#tf-set-status", "no such folder")
    box.fill(str(other))
    app.page.locator("#tf-set-show").click()
    app.wait_text("#tf-set-status", "4 trace(s) indexed in 3 file(s)")
    assert "1 bad record" in app.text("#tf-set-status")
    assert sorted(ids_in_table(app)) == ["other-000", "other-001", "other-002", "zz" + IMG]
    steps = app.js("Array.from(document.querySelectorAll('#tf-table [data-row][data-col=\"1\"]'), (c) => c.innerText.trim())")
    assert sorted(steps) == ["", "7", "7", "7"]  # the training step from a verl file name
    assert "onerror" in app.text("#tf-table") and "8.jsonl:1" in app.text("#tf-problems")
    app.assert_no_xss("trace set table")
    app.assert_clean()
