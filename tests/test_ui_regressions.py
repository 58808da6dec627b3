"""In-process regression tests for UI bugs found by the browser tests (tests/test_browser.py):
each is also exercised there in a real browser; these run without one.

* a Markdown link to ``javascript:`` (or any non-http scheme) in chat text showed as its label
  only: the chatbot's sanitiser drops the href, and the target text with it;
* metadata titles of chat messages are rendered as Markdown: ``[a](x:y)`` or ``*b*`` in a tool
  name changed what the title said;
* plotly reads ``<b>``/``<a href>`` in trace text and drops unknown tags with their text; one
  long termination reason squeezed the distributions plot to nothing;
* a trace id with ``/`` (from an uploaded file) crashed opening the trace: the download file
  name was built from the raw id;
* Stop answered "stopping…" in the status line; that reply could arrive after the run's final
  update and stay there ("stopping" forever, the run's end hidden).
"""

from __future__ import annotations

import json
import os

import pytest

import ui
from backend.trace import Trace, load_traces
from ui import charts, chat, inspector, playground
from ui.context import SAMPLE_DIR, AppContext, Session, load_samples, new_session, trace_file_name

JS_LINK = "[click me](javascript:window.__xss=1)"


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


@pytest.fixture(scope="module")
def weather() -> Trace:
    return load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0]


# ---- chat ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    JS_LINK,
    "![img](data:text/html;base64,PHNjcmlwdD4=)",
    "[x]( JavaScript:alert(1))",
    "[x](vbscript:msgbox)",
])
def test_unsafe_markdown_links_show_as_text(text):
    out = chat.esc(text)
    assert "](" not in out and "]\\(" in out  # no inline link left: "\(" is a literal parenthesis
    assert out.replace("\\(", "(") == text


def test_unsafe_reference_links_show_as_text():
    out = chat.esc("see [x]\n[x]: javascript:alert(1)")
    assert "\n\\[x]: javascript:alert(1)" in out


@pytest.mark.parametrize("text", ["[docs](https://example.org/a_b)", "[mail](mailto:a@b.c)", "[top](#steps)", "[rel](a/b.html)"])
def test_ordinary_markdown_links_stay_links(text):
    assert chat.esc(text) == text


def test_chat_messages_keep_the_link_text():
    msgs = chat.message_to_chat({"role": "user", "content": "hi " + JS_LINK}, 0)
    assert msgs[0]["content"] == "hi [click me]\\(javascript:window.__xss=1)"


def test_titles_escape_markdown():
    name = "[a](javascript:x)*b*_c_~~d~~$$e$$"
    title = chat.message_to_chat({"role": "tool", "name": name, "content": "ok"}, 0)[0]["metadata"]["title"]
    assert title == "Tool result · \\[a\\](javascript:x)\\*b\\*\\_c\\_\\~\\~d\\~\\~\\$\\$e\\$\\$"
    # underscores inside names are literal in Markdown and stay readable
    assert chat.md_title("get_current_temperature") == "get_current_temperature"
    assert chat.md_title("<img src=x>") == "‹img src=x›"


def test_run_ended_title_and_call_titles_escape_markdown(weather):
    t = weather.model_copy(update={"termination_reason": "[r](javascript:x)"})
    msgs = chat.trace_to_chat(t)
    assert msgs[-1]["metadata"]["title"] == "Run ended · \\[r\\](javascript:x)"
    assert msgs[-1]["content"] == "Run ended: **[r]\\(javascript:x)**"
    calls = chat.message_to_chat(
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "*x*", "arguments": {}}}]}, 0)
    assert calls[0]["metadata"]["title"] == "Tool call · \\*x\\*"


# ---- charts ----------------------------------------------------------------------------------


def test_distribution_labels_are_escaped_short_and_distinct(weather):
    long_a = "<b>bold</b> " + "a" * 100
    long_b = "<b>bold</b> " + "a" * 100 + "b"
    traces = [weather.model_copy(update={"termination_reason": r}) for r in (long_a, long_b, "no_tool_calls", "x & y")]
    fig = charts.file_distributions(traces)
    bar = fig.data[2]
    assert len(set(bar.x)) == 4
    assert all("<" not in x and len(x.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")) <= 30 for x in bar.x)
    assert bar.x[0].startswith("&lt;b&gt;bold&lt;/b&gt; a") and "x &amp; y" in bar.x
    assert any(h.startswith("&lt;b&gt;bold&lt;/b&gt; aaaa") for h in bar.hovertext)  # the full reason on hover
    # end states in the same words as the table: a normal run is "answered", not a bare code
    assert any(h.startswith("answered (no_tool_calls)") for h in bar.hovertext)


def test_timeline_hover_escapes_tool_names(weather):
    steps = [s.model_copy(update={"tool_results": [r.model_copy(update={"name": "<a href='javascript:x'>t</a>"})
                                                   for r in s.tool_results]}) for s in weather.steps]
    fig = charts.step_timeline(weather.model_copy(update={"steps": steps}))
    hovers = [h for b in fig.data for h in b.hovertext]
    assert any("&lt;a href='javascript:x'&gt;t&lt;/a&gt;" in h for h in hovers)
    assert not any("<a " in h for h in hovers)


# ---- downloads -------------------------------------------------------------------------------


@pytest.mark.parametrize("tid, want", [
    ("../../etc/passwd", "trace-etc_passwd.jsonl"),
    ("w<img/src=x/onerror=alert(1)>", "trace-w_img_src_x_onerror_alert_1.jsonl"),
    ("sample-weather-seattle", "trace-sample-weather-seattle.jsonl"),
    ("..", "trace-trace.jsonl"),
    ("日本", "trace-trace.jsonl"),
])
def test_trace_file_name(weather, tid, want):
    assert trace_file_name(weather.model_copy(update={"id": tid})) == want


def test_inspector_opens_a_trace_whose_id_has_slashes(ctx, weather):
    sess = new_session(ctx)
    t = weather.model_copy(update={"id": "a/../../b<img>"})
    sess.current = sess.add("file · x.jsonl · a/b", t)
    outs = inspector.show_trace(ctx, sess, sess.current, "auto")
    path = outs[9]["value"]  # the Save trace button's file
    assert os.path.basename(path) == "trace-a_.._.._b_img.jsonl" and os.path.isfile(path)
    assert Trace.from_json(open(path, encoding="utf-8").read().splitlines()[0]).id == t.id
    saved = playground._tmp_trace_file(t, sess)
    assert os.path.basename(saved) == "trace-a_.._.._b_img.jsonl"
    # both downloads sit in the session's own folders, under the app's temp root
    from backend.deploy import lifecycle

    root = lifecycle.temp_root()
    assert all(os.path.realpath(p).startswith(os.path.realpath(root) + os.sep) for p in (path, saved))
    assert {os.path.dirname(path), os.path.dirname(saved)} == set(sess.temp_dirs.values())
    # a newer save replaces the session's older folder of that kind; the session's end removes all
    again = playground._tmp_trace_file(t, sess)
    assert not os.path.exists(saved) and os.path.exists(again)
    sess.remove_temp_dirs()
    assert not os.path.exists(again) and not os.path.exists(path)


# ---- Stop ------------------------------------------------------------------------------------


async def test_stop_leaves_the_status_to_the_run(ctx):
    demo = ui.build_app(ctx)
    on_stop = next(d.fn for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "on_stop")
    sess: Session = new_session(ctx)
    s = playground.RunSettings(script=json.dumps(["x " * 300]), tools="[]", token_delay=0.01)
    statuses = []
    async for chat_msgs, status, trace in playground.run_turn(ctx, sess, "go", s):
        statuses.append(status)
        if sess.cancel is not None and not sess.cancel.is_set() and len(statuses) > 3:
            reply = await on_stop(sess)
            assert reply == {"__type__": "update"}  # no status of its own: it could land after the run's last one
    assert "stopping: the generation is being aborted" in "".join(statuses[:-1])
    assert "run 1 ended: stopped by user (cancelled)" in statuses[-1]
    assert "nothing is running" in await on_stop(sess)


def test_a_sessions_end_removes_its_download_folders(ctx, weather):
    """gradio calls the session State's delete_callback when it drops a session's state: the
    session's download folders go with it."""
    import gradio as gr

    demo = ui.build_app(ctx)
    (state,) = [b for b in demo.blocks.values() if isinstance(b, gr.State) and callable(b.value)]  # the session's (a factory)
    sess = new_session(ctx)
    saved = playground._tmp_trace_file(weather, sess)
    assert os.path.exists(saved)
    state.delete_callback(sess)
    assert not os.path.exists(saved) and not os.path.exists(os.path.dirname(saved)) and sess.temp_dirs == {}
