"""Many visitors at once, in-process (issue 42, item 14): the Playground's own line of runs
(``ui/run_gate.py``) and the new page's views built once (``ui/__init__.py``). The same against the
real app, 1,000 visitors over gradio's HTTP API: ``tests/adversarial/test_many_visitors.py``.

* The line: ``limit`` runs go at once, ``max_waiting`` wait in arrival order, the next is refused;
  a slot freed goes to the first in line.
* In the app (one run slot, one place in line): a second visitor's run waits and its status says its
  place; a third is answered at once, in the status line, that the server is busy and when to try
  again, its message left in the box; Stop takes a waiting run out of the line; every run that got
  in ends answered.
* ``/app_load`` of a new session without a link gives every visitor what the uncached path gives
  (the charts as gradio's JSON of the same figures), each with its own download file.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from playground_support import fresh, settings

from ui.context import AppContext, load_samples
from ui.run_gate import RunGate


def plain(html_text: str) -> str:
    return re.sub(r"<[^>]+>", "", str(html_text)).replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&")


def test_the_line_admits_in_order_and_refuses_past_its_bound():
    async def go():
        gate = RunGate(limit=2, max_waiting=2)
        a, b = gate.join(), gate.join()
        assert a.admitted and b.admitted and gate.running == 2
        c, d = gate.join(), gate.join()
        assert not c.admitted and not d.admitted
        assert (gate.position(c), gate.position(d)) == (1, 2)
        assert gate.join() is None and gate.refused == 1
        text = gate.busy_text()
        assert "busy" in text and re.search(r"try again in about \d+ s", text), text
        gate.leave(a)
        assert c.admitted and gate.position(d) == 1 and gate.running == 2
        assert await gate.wait(c, 0) and not await gate.wait(d, 0)
        gate.leave(d)  # leaves the line unadmitted: nothing else changes
        assert gate.line == collections_deque() and gate.running == 2
        gate.leave(b), gate.leave(c)
        assert gate.running == 0
        gate.leave(c)  # twice is once
        assert gate.running == 0

    asyncio.run(go())


def collections_deque():
    import collections

    return collections.deque()


@pytest.fixture
def one_slot_app(monkeypatch):
    import ui

    monkeypatch.setenv("ALI_QUEUE_MAX_SIZE", "1")
    samples, problems = load_samples()
    assert not problems
    ctx = AppContext(samples=samples, concurrency_limit=1)
    demo = ui.build_app(ctx)
    fn = next(d.fn for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "on_send")
    return ctx, fn


async def test_a_full_line_is_refused_in_words_and_a_waiting_run_says_its_place(one_slot_app):
    ctx, on_send = one_slot_app
    slow = {**settings(script=json.dumps([" ".join(f"w{i}" for i in range(400))]), tools="[]", token_delay=0.01).__dict__}
    quick = {**settings().__dict__}
    first, second, stopped = fresh(ctx), fresh(ctx), fresh(ctx)
    run1 = on_send(first, "first", slow)
    out1 = await run1.__anext__()  # admitted: the run has started (its box is cleared)
    assert out1[3] == "" and ctx.run_gate.running == 1

    run2 = on_send(second, "second", quick)
    out2 = await run2.__anext__()
    assert "number 1 in line" in plain(out2[2]) and out2[3] == {"__type__": "update"}, plain(out2[2])

    third = [o async for o in on_send(fresh(ctx), "third", quick)]  # line full: answered at once
    assert len(third) == 1
    status = plain(third[0][2])
    assert 'data-status="warn"' in third[0][2]
    assert "The server is busy" in status and re.search(r"try again in about \d+ s", status), status
    assert third[0][3] == {"__type__": "update"}  # the message stays in the box

    # the first run ends; the second, waiting, is admitted and answered
    rest1 = [o async for o in run1]
    assert "run 1 ended: answered" in plain(rest1[-1][2])
    rest2 = [o async for o in run2]
    assert "run 1 ended: answered" in plain(rest2[-1][2]), plain(rest2[-1][2])
    assert ctx.run_gate.running == 0 and not ctx.run_gate.line

    # Stop while waiting: out of the line, nothing run
    blocker = fresh(ctx)
    run1 = on_send(blocker, "again", slow)
    while "running ·" not in plain((await run1.__anext__())[2]):
        pass
    assert ctx.run_gate.running == 1
    waiting = on_send(stopped, "wait", quick)
    assert "in line" in plain((await waiting.__anext__())[2])
    stopped.cancel.set()
    left = [o async for o in waiting]
    assert "left the line" in plain(left[-1][2]) and stopped.runs == 0 and not ctx.run_gate.line
    blocker.cancel.set()
    [o async for o in run1]
    assert ctx.run_gate.running == 0


def test_new_page_views_are_the_uncached_ones_with_a_download_of_each_visitors_own():
    import plotly.graph_objects as go
    from gradio.components.plot import PlotData

    import ui
    from ui import inspector, trace_files

    samples, _ = load_samples()
    ctx = AppContext(samples=samples)
    demo = ui.build_app(ctx)
    on_load = next(d.fn for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "on_load")
    state = next(b for b in demo.blocks.values() if type(b).__name__ == "State")

    class Request:
        query_params: dict = {}

    def new_session():
        import copy

        return copy.deepcopy(state.value() if callable(state.value) else state.value)

    ref_sess = new_session()
    ref = [*inspector.show_trace(ctx, ref_sess, ref_sess.current, "auto"), *trace_files.table_outputs(ref_sess),
           trace_files.initial_status(ref_sess)]
    downloads = []
    for _ in range(3):
        sess = new_session()
        out = on_load(sess, Request())
        assert out[0] is sess
        got = out[1:-1]
        assert len(got) == len(ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            if isinstance(r, go.Figure):
                assert isinstance(g, PlotData) and json.loads(g.plot) == json.loads(r.to_json()), i
            elif i == inspector.DOWNLOAD_OUTPUT:
                assert open(g["value"]).read() == open(r["value"]).read()
                downloads.append(g["value"])
            elif hasattr(r, "equals"):
                assert r.equals(g), i
            else:
                assert g == r, i
        assert sess.file_filters == ref_sess.file_filters
    assert len(set(downloads)) == 3  # each visitor's own file


def test_a_one_shot_api_calls_session_is_forgotten_once_answered_and_a_named_one_kept(monkeypatch):
    """gradio kept every API call's session (~0.35 MB of config copies each, up to 10,000): 1,000
    visitors grew the app by hundreds of MB. Launched as app.py launches it (ui.launch_kwargs)."""
    import socket

    import httpx

    import ui
    from ui import sessions

    monkeypatch.setenv("ALI_MAX_SESSIONS", "50")
    samples, _ = load_samples()
    ctx = AppContext(samples=samples)
    demo = ui.build_app(ctx)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **ui.launch_kwargs(ctx))
    try:
        url = f"http://127.0.0.1:{port}/gradio_api"
        holder = demo.app.state_holder
        assert holder.capacity == 50 == sessions.max_sessions()
        with httpx.Client(timeout=120) as c:
            ids = []
            for own in (None, "mysession12345"):
                body = {"data": []} if own is None else {"data": [], "session_hash": own}
                event_id = c.post(f"{url}/call/app_load", json=body).json()["event_id"]
                with c.stream("GET", f"{url}/call/app_load/{event_id}") as r:
                    text = "".join(r.iter_text())
                assert "event: complete" in text, text[:300]
                ids.append(event_id)
        assert ids[0] not in holder.session_data  # the one-shot call's session: gone
        assert "mysession12345" in holder.session_data  # a session the caller named: kept
    finally:
        demo.close()
