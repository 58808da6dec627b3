"""The real app in a real browser: ``python app.py --backend scripted`` in a subprocess on a free
port of 127.0.0.1, driven by headless Chromium through Playwright.

Covers what only a browser shows: every tab opens without a JS error and shows its content, the
token view's client-side behaviour (hover info, whitespace toggle, step jumps), a scripted run
in the Playground (stream, Stop, Reset, Save), uploading a trace file with a bad line, and that
user- or model-controlled text never becomes markup (XSS payloads in every field the browser can
reach, checked in every view where the text shows up).

One app subprocess and one browser for the module; a fresh browser context (a new Gradio
session) per test. Skips only when no Chromium is installed (``scripts/setup.sh --browser``
installs Debian's). Screenshots of each tab go to a temporary folder (``$ALI_SCREENSHOT_DIR``
keeps them), never into the repository.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (install it with: bash scripts/setup.sh --browser)"),
]

# ---- payloads -------------------------------------------------------------------------------

IMG = '<img src=x onerror="window.__xss=1">'
SCRIPT = "<script>window.__xss=1</script>"
SVG = '"><svg onload=window.__xss=1>'
MD_LINK = "[click me](javascript:window.__xss=1)"
A_LINK = '<a href="javascript:window.__xss=1">js link</a>'
PAYLOAD = f"{IMG} {SCRIPT} {SVG} {MD_LINK} {A_LINK}"
# tool names may not contain whitespace: the same attacks without it
NAME = "w<img/src=x/onerror=window.__xss=1><svg/onload=window.__xss=1>"
# what must be visible as text wherever a payload is shown
VISIBLE = 'onerror="window.__xss=1"'
VISIBLE_NAME = "<img/src=x/onerror=window.__xss=1>"
IMG_HEAD = "<img src=x onerror="  # the payload's start, also inside JSON (where its quotes get backslashes)

XSS_REPORT_JS = r"""
() => {
  const root = document.querySelector('.gradio-container') || document.body;
  const all = Array.from(root.querySelectorAll('*'));
  const urlAttrs = ['href', 'src', 'action', 'formaction', 'xlink:href', 'data', 'srcdoc'];
  return {
    flag: window.__xss === undefined ? null : String(window.__xss),
    img_x: root.querySelectorAll('img[src="x"]').length,
    handlers: all.filter((el) => Array.from(el.attributes).some((a) => a.name.toLowerCase().startsWith('on')))
                 .map((el) => el.outerHTML.slice(0, 160)),
    scripts: Array.from(root.querySelectorAll('script')).map((s) => s.outerHTML.slice(0, 160)),
    js_urls: all.filter((el) => urlAttrs.some((n) => /^\s*(javascript:|vbscript:|data:text\/html)/i.test(el.getAttribute(n) || '')))
                .map((el) => el.outerHTML.slice(0, 160)),
    svg_onload: root.querySelectorAll('svg[onload]').length,
  };
}
"""


# ---- the app and the browser ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Gradio 6.31's queue stream (routes.py, sse_stream) raises a 404 inside a response it has
# already started when a reload cleans the session's messages first; uvicorn then logs one
# "Exception in ASGI application" ending in this RuntimeError. It is Gradio's race on navigation,
# not a handler of ours, so running_app drops that one incident (and only when it names
# sse_stream); any other traceback still fails the test.
_GRADIO_RELOAD_TRACE = re.compile(r"^ERROR:[^\n]*\n(?:(?!ERROR:).*\n)*?"
                                  r"RuntimeError: Caught handled exception, but response already started\.\n?", re.M)


# the logs of the apps running now (running_app): a failing browser test shows their ends (tests/conftest.py)
LIVE_APP_LOGS: list[Path] = []


@contextlib.contextmanager
def running_app(args: list[str], log_path: Path, *, env: dict[str, str] | None = None, start_timeout_s: float = 180):
    """``app.py ARGS`` on a free loopback port, yielding its URL once it answers; stopped at the
    end, and its log must hold no traceback (a handler crashed: the UI must show messages)."""
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
               PYTHONUNBUFFERED="1", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "app.py", *args, "--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer on {url}:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        LIVE_APP_LOGS.append(log_path)
        yield url
    finally:
        if log_path in LIVE_APP_LOGS:
            LIVE_APP_LOGS.remove(log_path)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        text = _drop_reload_race(log_path.read_text(errors="replace"))
        assert "Traceback" not in text, text[-4000:]


# The fixtures ``app_url`` (one ``app.py --backend scripted`` per worker, shared by the browser
# files) and ``browser`` (one headless Chromium per file) live in tests/conftest.py.


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = os.environ.get("ALI_SCREENSHOT_DIR")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return tmp_path_factory.mktemp("screenshots")


# What Gradio's client logs when a navigation cuts its streams: the aborted fetches, and the 404
# that Gradio 6.31's queue stream answers once the old session's messages are gone (the server logs
# that one as "Caught handled exception, but response already started", see _GRADIO_RELOAD_TRACE).
_NAVIGATION_ABORT = re.compile(r"AbortError: signal is aborted without reason|Unexpected error Connection errored out"
                               r"|Unexpected error 404: Not Found")


class App:
    """One browser page on the app (a new Gradio session), with the JS errors it collected."""

    def __init__(self, page, url: str):
        self.page = page
        self.url = url
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.set_default_timeout(30_000)
        page.goto(url)
        page.wait_for_selector("#pg-send")

    def reload(self) -> None:
        """Reload the page. Gradio's client logs the requests that the navigation itself aborted
        ("AbortError: signal is aborted", "Connection errored out") when the reload lands while
        the app's load event is still in flight: those say nothing about the app and are dropped;
        any other error during the reload is kept."""
        n = len(self.errors)
        self.page.reload()
        self.page.wait_for_selector("#pg-send", state="visible")
        self.next_frame()
        self.errors[n:] = [e for e in self.errors[n:] if not _NAVIGATION_ABORT.search(e)]

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name, exact=True).click()
        sel = {"Playground": "#pg-send", "Inspector": "#insp-tokens", "Trace files": "#tf-table", "Template lab": "#lab-render"}[name]
        self.page.wait_for_selector(sel, state="visible")
        if name == "Inspector":
            self.page.wait_for_selector("#insp-tokens .tv-c > span")
        self.next_frame()

    def text(self, selector: str) -> str:
        return self.page.locator(selector).first.inner_text()

    def tokens_text(self, selector: str) -> str:
        """The text of a token view's body. textContent, not innerText: token chunks far from
        the visible part are not rendered (content-visibility: auto) and innerText skips them."""
        return self.js("(sel) => document.querySelector(sel).textContent", selector)

    def next_frame(self) -> None:
        """Wait until the browser has rendered a frame (layout of what just became visible)."""
        self.js("() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)))")

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def set_code(self, elem_id: str, text: str) -> None:
        """Replace the text of a gr.Code (CodeMirror) editor, as a user pasting it."""
        self.page.locator(f"#{elem_id} .cm-content").click()
        self.page.keyboard.press("Control+A")
        self.page.keyboard.press("Delete")
        self.page.keyboard.insert_text(text)

    def expand_chat(self, elem_id: str) -> None:
        """Open every collapsed tool/system message of a chatbot."""
        closed = self.page.locator(f"#{elem_id} .thought-group .title:not(.expanded)")
        for _ in range(100):
            if not closed.count():
                return
            closed.first.click()
        raise AssertionError(f"#{elem_id}: messages do not expand")

    def wait_status(self, elem_id: str, kinds=("ok", "warn", "err"), timeout: float = 60_000) -> str:
        sel = ", ".join(f"#{elem_id} [data-status={k}]" for k in kinds)
        self.page.wait_for_selector(sel, timeout=timeout)
        return self.text(f"#{elem_id}")

    def wait_text(self, selector: str, needle: str, timeout: float = 30_000) -> str:
        """Wait until the element's text contains ``needle``; on timeout, say what it showed."""
        from playwright.sync_api import TimeoutError as PWTimeout

        try:
            self.page.wait_for_function(
                "([sel, needle]) => { const e = document.querySelector(sel); return !!e && e.innerText.includes(needle); }",
                arg=[selector, needle], timeout=timeout)
        except PWTimeout:
            shown = self.js("(sel) => { const e = document.querySelector(sel); return e ? e.innerText : '(no element)'; }", selector)
            raise AssertionError(f"{selector} never showed {needle!r}; it shows {shown[:2000]!r}") from None
        return self.text(selector)

    def cell(self, elem_id: str, row: int, col: int):
        return self.page.locator(f'#{elem_id} [data-testid="cell-{row}-{col}"]')

    def rows(self, elem_id: str) -> int:
        return self.js(f"document.querySelectorAll('#{elem_id} [data-row][data-col=\"0\"]').length")

    def shot(self, folder: Path, name: str) -> None:
        """The whole page, rendered: a viewport as tall as the page (a full-page screenshot
        would show token chunks outside the viewport blank: content-visibility: auto)."""
        size = self.page.viewport_size
        height = self.js("document.documentElement.scrollHeight")
        self.page.set_viewport_size({"width": size["width"], "height": min(height, 8000)})
        self.next_frame()
        self.page.screenshot(path=str(folder / f"{name}.png"))
        self.page.set_viewport_size(size)

    def assert_clean(self) -> None:
        assert not self.errors, "JS errors:\n" + "\n".join(self.errors)

    def assert_no_xss(self, where: str) -> None:
        r = self.js(XSS_REPORT_JS)
        bad = {k: v for k, v in r.items() if v}
        assert not bad, f"{where}: payload became markup: {bad}"


@pytest.fixture
def app(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = ctx.new_page()
    a = App(page, app_url)
    try:
        yield a
    finally:
        ctx.close()


# ---- tabs ----------------------------------------------------------------------------------


def _drop_reload_race(log: str) -> str:
    return _GRADIO_RELOAD_TRACE.sub(lambda m: "" if "sse_stream" in m.group(0) else m.group(0), log)


def test_the_log_check_drops_gradios_reload_race_and_nothing_else():
    race = ("ERROR:    Exception in ASGI application\nTraceback (most recent call last):\n"
            '  File "gradio/routes.py", line 1832, in sse_stream\n    raise HTTPException(\n'
            "fastapi.exceptions.HTTPException: 404: Not Found\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n"
            "RuntimeError: Caught handled exception, but response already started.\n")
    ours = "ERROR:    Exception in ASGI application\nTraceback (most recent call last):\nValueError: a handler of ours\n"
    assert _drop_reload_race("before\n" + race + "after\n") == "before\nafter\n"
    assert _drop_reload_race(ours + race) == ours  # an earlier incident is kept whole
    elsewhere = race.replace("sse_stream", "predict")
    assert _drop_reload_race(elsewhere) == elsewhere  # the same words from another route still fail


def test_every_tab_opens_and_shows_its_content(app, shots):
    # Playground
    assert app.js("document.querySelector('#pg-message textarea').value") == "What's the weather in Seattle?"
    assert "Send a message to start a run" in app.text("#pg-chat")
    app.shot(shots, "playground")

    # Inspector: the first sample trace (seed 001) is loaded: steps, every token, the conversation
    app.tab("Inspector")
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    assert "sample-weather-seattle" in app.text("#insp-summary")
    assert app.rows("insp-steps") == 5
    assert [app.cell("insp-steps", r, 1).inner_text() for r in range(5)] == [
        "pending", "generating", "processing_tools · +1 inserted", "generating", "terminated"]
    spans = app.js("Array.from(document.querySelectorAll('#insp-tokens .tv-c > span'), (s) => s.className)")
    assert len(spans) == 248
    kinds = "".join(c[0] for c in spans)  # p prompt, g generated (mask 1), j injected (mask 0)
    assert kinds == "p" * 178 + "g" * 25 + "j" * 29 + "g" * 16  # continuous tokens: the '\n' after <|im_end|> inserted
    assert app.text("#insp-tokens [data-count=generated]") == "41"
    assert app.text("#insp-tokens [data-count=injected]") == "29"
    assert app.js("document.querySelectorAll('#insp-tokens .tv-ins').length") == 1  # the inserted token, marked
    assert app.js("document.querySelectorAll('#insp-chat .message-row').length") >= 4
    assert "What's the weather in Seattle?" in app.text("#insp-chat")
    assert "72°F" in app.text("#insp-chat")
    # both charts drew bars (plotly SVG), the diagnostics table has rows
    app.page.wait_for_selector("#insp-plot-tokens .main-svg")
    assert app.js("document.querySelectorAll('#insp-plot-tokens .bars path').length") >= 4
    assert app.js("document.querySelectorAll('#insp-plot-timeline .bars path').length") >= 4
    assert "mask_mismatch" in app.text("#insp-diagnostics")
    app.shot(shots, "inspector")

    # Trace files: the samples are listed
    app.tab("Trace files")
    app.page.wait_for_selector("#tf-table [data-row]")
    assert app.rows("tf-table") == 8
    assert "8 trace(s) from sample_traces/" in app.text("#tf-status")
    app.page.wait_for_selector("#tf-dist .main-svg")
    assert "no_tool_calls" in app.js("document.querySelector('#tf-dist').textContent")
    # the export button keeps its size; the file box appears with the file
    assert app.page.locator("#tf-export").bounding_box()["height"] < 80
    assert not app.page.locator("#tf-export-file").is_visible()
    app.page.locator("#tf-export").click()
    app.page.wait_for_selector("#tf-export-file a[download]")
    assert "sample_traces-filtered" in app.text("#tf-export-file")
    app.shot(shots, "trace_files")

    # Template lab: Render gives both sides, their tokens and the diff
    app.tab("Template lab")
    app.page.locator("#lab-render").click()
    app.page.wait_for_selector("#labA-summary [data-count=tokens]")
    app.page.wait_for_selector("#labB-summary [data-count=tokens]")
    assert int(app.text("#labA-summary [data-count=tokens]")) > 100
    assert "<|im_start|>" in app.text("#labA-text")
    assert app.js("document.querySelectorAll('#labA-text mark.tv-sp').length") > 5
    app.page.wait_for_selector("#lab-diff .ali-kvs")
    app.shot(shots, "template_lab")
    app.assert_clean()


# ---- the token view --------------------------------------------------------------------------


def test_token_view_hover_shows_id_and_bytes(app):
    app.tab("Inspector")
    tok = app.page.locator("#insp-tokens .tv-c > span").nth(200)
    title = tok.get_attribute("title")
    assert re.fullmatch(r"id \d+", title)
    tok.hover()
    info = app.text("#insp-tokens .tv-info")
    assert info.startswith("#200 ") and title in info and "bytes " in info
    text = tok.text_content()
    assert " ".join(f"{b:02x}" for b in text.encode()) in info
    # a special token says so in its title
    sp = app.page.locator("#insp-tokens .tv-c > span.s").first
    assert sp.get_attribute("title").endswith(" special")
    sp.hover()
    assert "special" in app.text("#insp-tokens .tv-info")
    app.assert_clean()


def test_token_view_whitespace_toggle(app):
    app.tab("Inspector")
    before = app.tokens_text("#insp-tokens .tv-body")
    newline_mark = "getComputedStyle(document.querySelector('#insp-tokens i.wn'), '::before').content"
    space_bg = "getComputedStyle(document.querySelector('#insp-tokens i.ws')).backgroundImage"
    assert app.js(newline_mark) == "none" and app.js(space_bg) == "none"
    app.page.locator("#insp-tokens .tv-ws-toggle").check()
    assert app.js("document.querySelector('#insp-tokens .tv').classList.contains('tv-ws')")
    assert app.js(newline_mark) == '"↵"'
    assert "radial-gradient" in app.js(space_bg)
    app.page.locator("#insp-tokens .tv-ws-toggle").uncheck()
    assert not app.js("document.querySelector('#insp-tokens .tv').classList.contains('tv-ws')")
    assert app.js(newline_mark) == "none"
    assert app.tokens_text("#insp-tokens .tv-body") == before
    app.assert_clean()


def test_step_chip_and_step_row_jump_to_the_tokens(app):
    app.page.set_viewport_size({"width": 640, "height": 900})  # narrow: the token box scrolls
    app.tab("Inspector")
    app.page.locator("#insp-tokens .tv-body").scroll_into_view_if_needed()  # its chunks render when seen
    body = "document.querySelector('#insp-tokens .tv-body')"
    app.page.wait_for_function(f"{body}.scrollHeight > {body}.clientHeight + 50")
    sel_marks = "Array.from(document.querySelectorAll('#insp-tokens .tv-mark.sel'), (a) => a.id)"
    visible = ("(id) => { const a = document.getElementById(id), b = a.closest('.tv-body');"
               " const ra = a.getBoundingClientRect(), rb = b.getBoundingClientRect();"
               " return ra.top >= rb.top && ra.bottom <= rb.bottom; }")

    app.page.locator('#insp-tokens .tv-jump[data-jump="insp-step-3"]').click()
    assert app.js(sel_marks) == ["insp-step-3"]
    assert app.js(f"{body}.scrollTop") > 0
    assert app.js(visible, "insp-step-3")
    app.page.locator('#insp-tokens .tv-jump[data-jump="insp-step-0"]').click()
    assert app.js(sel_marks) == ["insp-step-0"]
    assert app.js(f"{body}.scrollTop") < 20
    assert app.js(visible, "insp-step-0")

    # a row of the step table selects the step: details, then the token view jumps to it
    app.cell("insp-steps", 2, 1).click()
    app.page.wait_for_function(f"JSON.stringify({sel_marks}) === '[\"insp-step-2\"]'")
    assert app.js(visible, "insp-step-2")
    assert app.js("document.querySelector('#insp-step input').value").startswith("2 · processing_tools")
    app.wait_text("#insp-step-head", "Step 2")
    assert "mask 0" in app.text("#insp-step-head")
    # the selected step's own tokens (its sub-tab): 29 injected tokens with the tool response, the
    # first of them the '\n' continuous tokens inserted after <|im_end|>, marked
    app.page.get_by_role("tab", name="Tokens", exact=True).click()
    app.page.wait_for_function("document.querySelectorAll('#insp-step-tokens .tv-c > span').length === 29")
    assert app.js("document.querySelectorAll('#insp-step-tokens .tv-ins').length") == 1
    assert "+1 inserted at token 203" in app.text("#insp-step-head")
    assert "<tool_response>" in app.tokens_text("#insp-step-tokens .tv-body")
    app.assert_clean()


# ---- playground -------------------------------------------------------------------------------


def test_playground_scripted_run_stop_reset_save(app, tmp_path):
    from backend.trace import Trace

    app.page.locator("#pg-send").click()
    status = app.wait_status("pg-status")
    assert "run 1 ended: answered (no_tool_calls)" in status
    app.expand_chat("pg-chat")
    chat = app.text("#pg-chat")
    assert "Tool call · get_current_temperature" in chat
    assert '"city": "Seattle, WA, USA"' in chat  # the call's arguments
    assert "Tool result · get_current_temperature" in chat
    assert '"temperature": 72' in chat  # the mock tool's output
    assert "The current temperature in Seattle, WA, USA is 72°F." in chat

    # Save trace: a JSONL download of the run, the seed trace
    with app.page.expect_download() as dl:
        app.page.locator("#pg-save").click()
    path = tmp_path / "run.jsonl"
    dl.value.save_as(path)
    assert dl.value.suggested_filename.endswith(".jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    trace = Trace.from_json(lines[0])
    assert trace.termination_reason == "no_tool_calls"
    assert len(trace.prompt_ids) == 178
    assert trace.response_mask == [1] * 25 + [0] * 29 + [1] * 16

    # Reset clears the conversation
    app.page.locator("#pg-reset").click()
    app.wait_text("#pg-status", "conversation cleared")
    assert "Send a message to start a run" in app.text("#pg-chat")

    # Stop: a slow run (0.3 s per token) is cancelled in its first turn and keeps what it generated
    app.page.locator("#pg-delay input[type=number]").fill("0.3")
    app.page.locator("#pg-delay input[type=number]").press("Enter")
    assert app.js("document.querySelector('#pg-message textarea').value") == ""  # a run empties the message box
    app.page.locator("#pg-message textarea").fill("What's the weather in Seattle?")
    app.page.locator("#pg-send").click()
    app.wait_text("#pg-status", "running · generating")
    app.page.locator("#pg-stop").click()
    app.wait_text("#pg-status", "ended")
    status = app.text("#pg-status")
    assert "run 2 ended: stopped by user (cancelled)" in status
    assert "Run ended · stopped by user (cancelled)" in app.text("#pg-chat")
    app.assert_clean()


# ---- trace files --------------------------------------------------------------------------------


def _sample_record(**changes) -> dict:
    rec = json.loads((ROOT / "sample_traces" / "01_weather.jsonl").read_text().splitlines()[0])
    rec.update(changes)
    return rec


def test_trace_file_upload_bad_line_and_open_in_inspector(app, tmp_path):
    good = _sample_record(id="uploaded-good-trace")
    bad = {"format_version": 1, "id": "broken", "prompt_ids": [1, 2], "response_ids": [3], "response_mask": [1, 1]}
    f = tmp_path / "two_lines.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")

    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "two_lines.jsonl")
    status = app.text("#tf-status")
    assert "1 trace(s) loaded" in status and "1 bad record(s)" in status
    app.page.wait_for_function("document.querySelectorAll('#tf-problems [data-row]').length > 0")
    assert app.cell("tf-problems", 0, 0).inner_text() == "2"  # the bad line's number
    assert "response_mask" in app.cell("tf-problems", 0, 1).inner_text()
    app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 1")
    assert app.cell("tf-table", 0, 1).inner_text() == "uploaded-good-trace"

    # a row opens the trace in the Inspector
    app.cell("tf-table", 0, 1).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")
    app.wait_text("#insp-summary", "uploaded-good-trace")
    assert app.js("document.querySelector('#insp-trace input').value").startswith("file · two_lines.jsonl")
    app.page.wait_for_function("document.querySelectorAll('#insp-tokens .tv-c > span').length === 248")
    app.assert_clean()


def test_an_uploaded_files_rows_are_read_when_selected(app, tmp_path):
    """Our own traces are not held after an upload: a row the Inspector was not given opens from
    the file when it is clicked, and then is one of the Inspector's traces."""
    f = tmp_path / "three.jsonl"
    f.write_text("".join(json.dumps(_sample_record(id=f"lazy-{c}")) + "\n" for c in "abc"))
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(f))
    app.wait_text("#tf-status", "three.jsonl: 3 trace(s) loaded")
    app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 3")
    app.cell("tf-table", 2, 1).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")
    app.wait_text("#insp-summary", "lazy-c")
    assert app.js("document.querySelector('#insp-trace input').value") == "file · three.jsonl · lazy-c"
    app.tab("Trace files")
    app.cell("tf-table", 1, 1).click()
    app.wait_text("#insp-summary", "lazy-b")
    app.assert_clean()


def test_trace_file_upload_imports_an_agents_sdk_run_and_reimports_on_a_tokenizer_change(app):
    """Another tool's file through the real page: an OpenAI Agents SDK run is imported (not
    refused), listed with its source, opens in the Inspector with its tokens; choosing another
    tokenizer re-reads the same upload with it."""
    path = ROOT / "tests" / "data" / "import" / "agents_sdk_run.json"
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(path))
    status = app.wait_text("#tf-status", "agents_sdk_run.json")
    assert "imported from agents-sdk" in status and "rendered and decoded with qwen3" in status, status
    app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 1")
    assert app.cell("tf-table", 0, 2).inner_text() == "agents-sdk"

    app.page.locator("#tf-import-tok input").click()
    app.page.get_by_role("option", name="qwen2.5", exact=True).click()
    status = app.wait_text("#tf-status", "decoded with qwen2.5")
    assert "imported from agents-sdk" in status

    app.cell("tf-table", 0, 1).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")
    app.wait_text("#insp-summary", "qwen2.5")
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    assert "What's the weather in Seattle?" in app.tokens_text("#insp-tokens .tv-body")
    app.assert_clean()


# ---- XSS --------------------------------------------------------------------------------------


def test_xss_playground_fields(app, shots):
    tools = [{
        "type": "function",
        "function": {
            "name": NAME,
            "description": "D " + PAYLOAD,
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "C " + PAYLOAD}},
                           "required": ["city"]},
        },
        "mock": {"template": {"out": PAYLOAD, "city": "{city}"}},
    }]
    script = [
        "<tool_call>\n" + json.dumps({"name": NAME, "arguments": {"city": PAYLOAD}}) + "\n</tool_call>",
        "Answer " + PAYLOAD,
    ]
    # a bad tools JSON first: its error message quotes the payload
    app.set_code("pg-tools", json.dumps([{"type": "function", "function": {"name": "a b" + IMG}}]))
    app.page.locator("#pg-send").click()
    assert VISIBLE in app.wait_status("pg-status", kinds=("err",))
    app.assert_no_xss("playground error status")

    app.set_code("pg-tools", json.dumps(tools, indent=1))
    app.set_code("pg-script", json.dumps(script))
    app.page.locator("#pg-system textarea").fill("System " + PAYLOAD)
    app.page.locator("#pg-message textarea").fill("User " + PAYLOAD)
    app.page.locator("#pg-send").click()
    app.wait_text("#pg-status", "run 1 ended", timeout=60_000)
    app.expand_chat("pg-chat")
    chat = app.text("#pg-chat")
    for what in ("System " + IMG, "User " + IMG, "Answer " + IMG, MD_LINK, A_LINK, SCRIPT):
        assert what in chat, what
    assert VISIBLE_NAME in chat  # the tool call's title
    app.assert_no_xss("playground chat")
    app.shot(shots, "xss_playground")

    # the run in the Inspector: every view that shows it
    app.tab("Inspector")
    app.wait_text("#insp-summary", "run 1")
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    assert VISIBLE in app.text("#insp-summary")  # the label quotes the user message
    assert VISIBLE_NAME in app.text("#insp-steps")
    body = app.tokens_text("#insp-tokens .tv-body")
    assert "System " + IMG in body and "User " + IMG in body and "D " + IMG_HEAD in body
    assert "Answer " + IMG in body and SCRIPT in body
    app.expand_chat("insp-chat")
    assert "User " + IMG in app.text("#insp-chat")
    assert "Answer " + IMG in app.text("#insp-chat")
    for tab in ("Template text", "Tokens", "Tool calls / parse errors", "Tool results / info"):
        app.page.get_by_role("tab", name=tab, exact=True).click()
    assert VISIBLE_NAME in app.text("#insp-step-calls")
    app.cell("insp-steps", 2, 1).click()  # the tool step
    app.wait_text("#insp-step-head", "Step 2")
    app.page.get_by_role("tab", name="Tool results / info", exact=True).click()
    assert VISIBLE_NAME in app.text("#insp-step-results")
    app.page.get_by_role("tab", name="Template text", exact=True).click()
    assert '\\"window.__xss=1\\"' in app.text("#insp-step-text")  # the mock's JSON output, escaped as text
    app.page.locator("#insp-tokens .tv-c > span").nth(40).hover()
    app.page.locator("#insp-tokens .tv-ws-toggle").check()
    app.assert_no_xss("inspector (playground run)")
    app.shot(shots, "xss_inspector_run")
    app.assert_clean()


@pytest.fixture(scope="module")
def xss_trace_file(tmp_path_factory) -> Path:
    """A trace made by the real engine with payloads everywhere a model, a tool or a file can put
    them, plus a bad line; in a file whose NAME is a payload."""
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry

    tools = [{
        "type": "function",
        "function": {"name": NAME, "description": "D " + PAYLOAD,
                     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
        "mock": {"template": {"out": PAYLOAD, "q": "{q}"}},
    }]
    script = [
        "<tool_call>\n" + json.dumps({"name": NAME, "arguments": {"q": PAYLOAD}}) + "\n</tool_call>\n"
        "<tool_call>\n" + json.dumps({"name": "unknown" + NAME, "arguments": {"q": PAYLOAD}}) + "\n</tool_call>",
        "Thinking " + PAYLOAD + '\n<tool_call>\n{"name": "' + NAME + '", "arguments": {"q": "' + IMG.replace('"', "'") + "\"\n</tool_call>",
    ]
    bundle = load_tokenizer("qwen3")
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, script), bundle, tools=ToolRegistry.from_schemas(tools),
                     config=LoopConfig(max_parallel_calls=2))
    messages = [{"role": "system", "content": "System " + PAYLOAD}, {"role": "user", "content": "User " + PAYLOAD}]
    run = loop.run(messages, trace_id="id" + NAME, metadata={
        "source": "src" + NAME, "title": "Title " + PAYLOAD, "description": "Desc " + PAYLOAD, "parser": "Parser " + PAYLOAD,
        "duration_s": PAYLOAD})
    # in a thread of its own: Playwright's sync API keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        trace = pool.submit(asyncio.run, run).result()
    rec = trace.to_dict()
    assert any(s["parse_errors"] for s in rec["steps"]) and any(
        r["error"] == "unknown_tool" for s in rec["steps"] for r in s["tool_results"])
    rec["termination_reason"] = "Reason " + PAYLOAD
    rec["steps"][1]["error"] = "Step error " + PAYLOAD
    bad = {"format_version": 1, "id": IMG, "prompt_ids": SCRIPT, "response_ids": [], "response_mask": []}
    d = tmp_path_factory.mktemp("xss")
    f = d / 'x"><img src=x onerror=window.__xss=1>.jsonl'
    f.write_text(json.dumps(rec, ensure_ascii=False) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    return f


def test_xss_uploaded_trace_file(app, shots, xss_trace_file):
    app.tab("Trace files")
    app.page.locator("#tf-upload input[type=file]").set_input_files(str(xss_trace_file))
    app.wait_text("#tf-status", "trace(s) loaded")
    status = app.text("#tf-status")
    assert "1 trace(s) loaded" in status and "1 bad record(s)" in status
    # the file name, as text (Gradio's upload already drops '<' and '>' from names)
    assert "img src=x onerror=window.__xss=1.jsonl" in status
    app.page.wait_for_function("document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === 1")
    table = app.text("#tf-table")
    assert "id" + NAME in table and "src" + NAME in table and "Reason " + IMG in table
    assert app.cell("tf-problems", 0, 0).inner_text() == "2"
    app.page.wait_for_selector("#tf-dist .main-svg")
    assert "Reason <img src=x" in app.js("document.querySelector('#tf-dist').textContent")  # shortened, as text
    # the search box and the filter dropdowns get the payloads too
    app.page.locator("#tf-search textarea").fill(SCRIPT)
    app.page.wait_for_timeout(500)
    app.page.locator("#tf-reason input").click()
    app.page.wait_for_selector("[role=listbox]")
    assert "Reason " + IMG in app.text("[role=listbox]")
    app.page.keyboard.press("Escape")
    app.assert_no_xss("trace files")
    app.shot(shots, "xss_trace_files")

    app.cell("tf-table", 0, 1).click()
    app.page.wait_for_selector("#tab-inspector", state="visible")
    app.wait_text("#insp-summary", "Reason")
    app.page.wait_for_selector("#insp-tokens .tv-c > span")
    summary = app.text("#insp-summary")
    for what in ("id" + NAME, "src" + NAME, "Reason " + IMG, "Desc " + IMG, "Parser " + IMG):
        assert what in summary, what
    steps = app.text("#insp-steps")
    assert "Step error " + IMG in steps and "unknown" + NAME in steps
    app.expand_chat("insp-chat")
    chat = app.text("#insp-chat")
    for what in ("User " + IMG, "Thinking " + IMG, MD_LINK, A_LINK, "Step error " + IMG):
        assert what in chat, what
    body = app.tokens_text("#insp-tokens .tv-body")
    assert "User " + IMG in body and "D " + IMG_HEAD in body
    assert VISIBLE_NAME in app.text("#insp-diagnostics")
    # the details of the steps that carry payloads (every sub-tab is mounted once, then stays)
    for tab in ("Tokens", "Tool calls / parse errors", "Tool results / info", "Template text"):
        app.page.get_by_role("tab", name=tab, exact=True).click()
    details = {}
    for row in (1, 2, 3):
        app.cell("insp-steps", row, 1).click()
        app.wait_text("#insp-step-head", f"Step {row}")
        details[row] = {k: app.js(f"document.querySelector('#insp-step-{k}').textContent")
                        for k in ("head", "text", "tokens", "calls", "results")}
    assert "Step error " + IMG in details[1]["head"] and NAME in details[1]["calls"]
    assert "unknown" + NAME in details[2]["results"] and IMG_HEAD in details[2]["text"]
    assert "Thinking " + IMG in details[3]["tokens"] and IMG_HEAD in details[3]["calls"]  # the malformed call's raw text
    app.page.locator("#insp-trace input").click()
    app.page.wait_for_selector("[role=listbox]")
    app.page.keyboard.press("Escape")
    # plotly hover text of the timeline (tool names), as text
    bars = app.page.locator("#insp-plot-timeline .bars path")
    hovers = []
    layer = "(document.querySelector('#insp-plot-timeline .hoverlayer') || {}).textContent || ''"
    for i in range(bars.count()):
        # plotly throttles hover events (~50 ms): read the label only once this bar's hover has
        # replaced the last one (moving away first clears it), or a quick hover reads a stale label
        app.page.mouse.move(0, 0)
        app.page.wait_for_function(f"({layer}) === ''", timeout=5000)
        bars.nth(i).hover(force=True)
        app.page.wait_for_function(f"({layer}) !== ''", timeout=5000)
        hovers.append(app.js(layer))
    assert any(VISIBLE_NAME in h for h in hovers), hovers
    app.assert_no_xss("inspector (uploaded trace)")
    app.shot(shots, "xss_inspector_file")
    app.assert_clean()


def test_xss_template_lab(app, shots):
    messages = [
        {"role": "system", "content": "System " + PAYLOAD},
        {"role": "user", "content": "User " + PAYLOAD},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": NAME, "arguments": {"q": PAYLOAD}}}]},
        {"role": "tool", "name": NAME, "content": "Tool " + PAYLOAD},
        {"role": "assistant", "content": "Answer " + PAYLOAD},
    ]
    tools = [{"type": "function", "function": {"name": NAME, "description": "D " + PAYLOAD,
                                               "parameters": {"type": "object", "properties": {}}}}]
    app.tab("Template lab")
    app.set_code("lab-messages", json.dumps(messages))
    app.set_code("lab-tools", json.dumps(tools))
    # B: a custom template that writes payloads of its own
    app.page.locator("#labB-tpl input").click()
    app.page.get_by_role("option", name="custom (text below)").click()
    app.set_code("labB-custom", "{% for m in messages %}" + IMG + "{{ m.content }}" + SCRIPT + "\n{% endfor %}")
    app.page.locator("#lab-render").click()
    app.page.wait_for_selector("#labA-summary [data-count=tokens]")
    app.page.wait_for_selector("#labB-summary [data-count=tokens]")
    app.page.wait_for_selector("#lab-diff .ali-diff")
    assert "User " + IMG in app.text("#labA-text") and "D " + IMG_HEAD in app.text("#labA-text")
    assert IMG + "System " + IMG in app.text("#labB-text")
    assert "User " + IMG in app.text("#lab-diff")
    for tab in app.page.get_by_role("tab", name="Tokens", exact=True).all():
        tab.click()
    assert "User " + IMG in app.tokens_text("#labA-tokens .tv-body")
    app.assert_no_xss("template lab")
    app.shot(shots, "xss_template_lab")

    # a template that fails: its error message quotes the template text
    app.set_code("labB-custom", "{% if " + IMG + " %}")
    app.page.locator("#lab-render").click()
    app.page.wait_for_selector("#labB-summary .ali-err")
    app.assert_no_xss("template lab error")
    app.assert_clean()
