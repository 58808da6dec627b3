"""Many users at once: sessions of the real app never see each other, and Stop stops only the
run it belongs to.

* The real ``app.py`` runs in a subprocess (``--no-model``: the scripted backend) on a free port
  of 127.0.0.1. :data:`N_SESSIONS` ``gradio_client`` clients (one session each) start together
  (a barrier) and each: uploads a trace file of its own, defines its OWN tools (distinct names
  and mock results), system prompt, script and messages, runs two playground turns through the
  app's API (``/playground_run``), then lists and opens its traces (``/app_load``,
  ``/inspector_open``). Every output each one gets back is checked to carry its own marker and
  no other session's.
* Stop in the app: several slow scripted runs at once; one session presses Stop
  (``/playground_stop``): only its run ends ``cancelled``, the others finish.
* Stop on a real engine: two agent loops share ONE in-process vLLM engine (the tiny model
  fixture of ``tests/conftest.py``), each generating a long output (``ignore_eos``); one is
  cancelled as the UI's Stop does (its cancel event; or its task cancelled, as when the browser
  goes away). The cancelled one ends at once (``cancelled``, its vLLM request aborted: the
  engine has one unfinished request left, the other loop's, while that one is still running);
  the other completes its full length with the tokens vLLM gives for its prompt alone.

API names used here are the ones ``ui/`` gives deliberately (``api_name=``), not Gradio's
generated ``/on_send_1``-style names.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from backend.trace import load_traces

pytestmark = pytest.mark.slow  # the real app with many sessions at once: ≥ 10 s a test (scripts/test_durations.py); CI runs it

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "sample_traces"

N_SESSIONS = 20  # concurrent sessions in the isolation test
N_STOP_SESSIONS = 6  # concurrent slow runs in the app-level Stop test (one is stopped)
STARTUP_TIMEOUT_S = 240  # the app's first start on a busy 2-core machine
CALL_TIMEOUT_S = 300  # any one API call; generous: it bounds a hang, it measures nothing

MARKER_RE = re.compile(r"zq\d\d[a-f]{4}")  # every session's marker has this shape (and nothing else does)


def marker(i: int, rng: random.Random) -> str:
    return f"zq{i:02d}" + "".join(rng.choice("abcdef") for _ in range(4))


# ---- the app in a subprocess -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        fd, self.log_path = tempfile.mkstemp(prefix="ali-app-", suffix=".log")
        os.close(fd)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--no-model", "--host", "127.0.0.1", "--port", str(self.port), *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def log_tail(self, n: int = 60) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"app.py exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"app.py did not answer within {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def app(request):
    # every session's runs at once (the default limit, 4, would queue them: isolated too, but
    # less adversarial)
    a = AppProcess("--concurrency-limit", str(N_SESSIONS))
    failed_before = request.session.testsfailed
    try:
        a.wait_ready()
        yield a
    finally:
        a.stop()
        if request.session.testsfailed > failed_before:
            print(f"\n---- app.py log tail ({a.log_path}) ----\n{a.log_tail(80)}\n----")
        os.unlink(a.log_path)


def client(url: str):
    from gradio_client import Client

    # a generous HTTP timeout: 20 clients fetch the app's config at once from a 2-core machine
    return Client(url, verbose=False, download_files=False, httpx_kwargs={"timeout": 120})


def run_settings(**kw: Any) -> list[Any]:
    """/playground_run's arguments after the message: one settings object (RunSettings' fields;
    code_tools only when the app runs with --enable-code-tools, which it does not here)."""
    from ui.playground import RunSettings

    s = RunSettings(**kw)
    return [{k: v for k, v in s.__dict__.items() if k != "code_tools"}]


# output positions of /app_load and /inspector_open (the Inspector's trace views come first)
INSP_TRACE_DD, INSP_SUMMARY, INSP_CHAT = 0, 1, 4
LOAD_TABLE, LOAD_STATUS = 17, 19


def table_ids(table: dict[str, Any]) -> list[str]:
    col = table["headers"].index("id")
    return [row[col] for row in table["data"]]


def markers_in(obj: Any) -> set[str]:
    return set(MARKER_RE.findall(json.dumps(obj, ensure_ascii=False)))


def tools_of(m: str) -> list[dict[str, Any]]:
    return [{
        "type": "function",
        "function": {
            "name": f"tool_{m}", "description": f"the private tool of session {m}",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
        "mock": {"template": {"answer": f"result-{m}", "echo": "{q}"}},
    }]


def script_of(m: str) -> list[str]:
    return [
        f'<tool_call>\n{{"name": "tool_{m}", "arguments": {{"q": "{m}-q1"}}}}\n</tool_call>',
        f"First answer for {m}.",
        f"Second answer for {m}.",
    ]


def trace_file_of(m: str, folder: Path) -> Path:
    lines = []
    for k, src in enumerate(("01_weather.jsonl", "05_hunyuan_format.jsonl"), start=1):
        d = json.loads((SAMPLE_DIR / src).read_text().splitlines()[0])
        d["id"] = f"{m}-file-{k}"
        d["messages"][0]["content"] = f"uploaded by {m}"
        lines.append(json.dumps(d))
    lines.append("{this line of " + m + " is not JSON")
    p = folder / f"upload-{m}.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


# ---- 20 sessions at once ---------------------------------------------------------------------------


def session_work(url: str, i: int, m: str, folder: Path, barrier: threading.Barrier) -> list[Any]:
    """One user's whole visit; returns every output the app gave it."""
    from gradio_client import handle_file

    c = client(url)
    seen: list[Any] = []
    sample_ids = [t.id for p in sorted(SAMPLE_DIR.glob("*.jsonl")) for t in load_traces(str(p)).traces]

    load = c.predict(api_name="/app_load")
    seen.append(load)
    # a new session starts with the sample traces listed (Session.__deepcopy__ kept them)
    assert table_ids(load[LOAD_TABLE]) == sample_ids, load[LOAD_TABLE]
    assert f"{len(sample_ids)} trace(s) from sample_traces/" in load[LOAD_STATUS], load[LOAD_STATUS]

    barrier.wait(timeout=CALL_TIMEOUT_S)  # everyone starts the rest together

    up = c.predict(handle_file(str(trace_file_of(m, folder))), api_name="/trace_files_upload")
    seen.append(up)
    status, problems, _, _, table, _ = up
    assert f"upload-{m}.jsonl: 2 trace(s) loaded" in status and "1 bad record(s)" in status, status
    assert [row[0] for row in problems["data"]] == [3]
    assert table_ids(table) == [f"{m}-file-1", f"{m}-file-2"]

    settings = run_settings(backend="scripted", script=json.dumps(script_of(m)), token_delay=0.01, tokenizer="qwen3",
                            system=f"system prompt of {m}", tools=json.dumps(tools_of(m)), tool_choice="auto")
    runs = []
    for k, text in enumerate((f"first question from {m}", f"second question from {m}"), start=1):
        job = c.submit(text, *settings, api_name="/playground_run")
        out = job.result(timeout=CALL_TIMEOUT_S)
        seen.append(out)
        chat, status, box, save, _ = out
        assert f"run {k} ended: answered (no_tool_calls)" in status, status
        # the message box is emptied with the run's first update (then left to what the user types)
        assert job.outputs()[0][2] == "" and box == {"__type__": "update"}, (job.outputs()[0][2], box)
        flat = json.dumps(chat, ensure_ascii=False)
        for needle in (f"system prompt of {m}", f"first question from {m}", f"tool_{m}", f"result-{m}", f"First answer for {m}."):
            assert needle in flat, (k, needle)
        if k == 2:  # the second run continues this session's conversation, and only it
            assert f"second question from {m}" in flat and f"Second answer for {m}." in flat
        v = save["value"]  # the Save button's file (the server's copy: same machine)
        runs.append(v["path"] if isinstance(v, dict) else v)
    for k, path in enumerate(runs, start=1):
        t = load_traces(path).traces[0]
        seen.append(t.to_dict())
        assert [x["function"]["name"] for x in t.tools] == [f"tool_{m}"]
        assert t.messages[0] == {"role": "system", "content": f"system prompt of {m}"}
        assert [s.tool_results[0].content for s in t.steps if s.tool_results] == [json.dumps({"answer": f"result-{m}", "echo": f"{m}-q1"})] * (k == 1)
        assert markers_in(t.to_dict()) == {m}

    load = c.predict(api_name="/app_load")
    seen.append(load)
    labels = [choice[0] for choice in load[INSP_TRACE_DD]["choices"]]
    own = [lb for lb in labels if not lb.startswith("sample · ")]
    # the upload's first trace (opened for the Inspector on upload; the others are read from the
    # file when their row is selected) and the session's two runs, nothing of another session's
    assert own == [f"file · upload-{m}.jsonl · {m}-file-1",
                   f"run 1 · first question from {m}", f"run 2 · second question from {m}"], own
    opened = c.predict(own[1], "auto", api_name="/inspector_open")
    seen.append(opened)
    assert f"first question from {m}" in json.dumps(opened[INSP_CHAT]) and m in opened[INSP_SUMMARY]
    return seen


def test_twenty_sessions_at_once_see_only_their_own_tools_messages_and_traces(app, tmp_path):
    rng = random.Random(7)
    markers = [marker(i, rng) for i in range(N_SESSIONS)]
    assert len(set(markers)) == N_SESSIONS
    barrier = threading.Barrier(N_SESSIONS)
    with ThreadPoolExecutor(N_SESSIONS) as pool:
        futures = [pool.submit(session_work, app.url, i, m, tmp_path, barrier) for i, m in enumerate(markers)]
        results = [f.result(timeout=2 * CALL_TIMEOUT_S) for f in futures]  # every session completes
    for m, seen in zip(markers, results):
        # everything this session was shown names this session, and no other
        assert markers_in(seen) == {m}, (m, markers_in(seen) - {m})


# ---- Stop in the app: only the session that pressed it -------------------------------------------


def test_stop_in_one_session_cancels_only_its_run(app):
    from gradio_client.utils import Status

    rng = random.Random(11)
    markers = [marker(50 + i, rng) for i in range(N_STOP_SESSIONS)]
    # ~450 tokens at 20 ms each (about 9 s) for the others; the stopped run would take minutes,
    # so its Stop surely arrives while it is running
    answers = [" ".join(f"word{n}" for n in range(3000 if i == 0 else 150)) for i in range(N_STOP_SESSIONS)]
    started = threading.Barrier(N_STOP_SESSIONS)

    def work(i: int, m: str) -> tuple[str, str, list[Any]]:
        c = client(app.url)
        settings = run_settings(backend="scripted", script=json.dumps([f"{m} says: {answers[i]}"]), token_delay=0.02,
                                tokenizer="qwen3", tools="[]", tool_choice="auto", max_tokens=8192, response_length=8192)
        job = c.submit(f"talk, {m}", *settings, api_name="/playground_run")
        deadline = time.monotonic() + CALL_TIMEOUT_S
        # wait until this run is streaming (a "running" update has arrived)
        while not any("running ·" in str(o[1]) for o in job.outputs()):
            assert not job.done(), f"{m}: the run ended before it streamed: {job.outputs()[-1:]}"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started.wait(timeout=CALL_TIMEOUT_S)  # every run is under way
        stop_reply = None
        if i == 0:
            stop_reply = c.predict(api_name="/playground_stop")
        out = job.result(timeout=CALL_TIMEOUT_S)
        assert job.status().code == Status.FINISHED
        return out[1], json.dumps(out[0], ensure_ascii=False), [stop_reply]

    with ThreadPoolExecutor(N_STOP_SESSIONS) as pool:
        results = [f.result(timeout=2 * CALL_TIMEOUT_S) for f in [pool.submit(work, i, m) for i, m in enumerate(markers)]]
    for i, (m, (status, chat, _)) in enumerate(zip(markers, results)):
        assert markers_in(chat) == {m}
        if i == 0:
            assert "run 1 ended: stopped by user (cancelled)" in status, status
            assert "word2999" not in chat  # it did not run to the end
        else:
            assert "run 1 ended: answered (no_tool_calls)" in status, (m, status)
            assert "word149" in chat


def test_a_new_session_keeps_every_field_of_the_initial_state():
    """Regression: gr.State deep-copies the value it hands each session (also one built by a
    callable), and Session.__deepcopy__ kept only the traces and the current label: every new
    session's Trace files tab listed nothing ("0 trace(s) from ?/")."""
    import copy

    from ui.context import Session

    t = load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0]
    s = Session(traces={"a": t}, current="a", file_traces=["a"], file_name="sample_traces", file_problems=[(2, "bad")],
                history=[{"role": "user", "content": "hi"}], runs=3, script_cursor=1, last_run="a")
    c = copy.deepcopy(s)
    for f in ("traces", "current", "file_traces", "file_name", "file_problems", "history", "runs", "script_cursor", "last_run"):
        assert getattr(c, f) == getattr(s, f), f
    assert c.traces["a"] is t  # traces are shared (never mutated) ...
    for f in ("traces", "file_traces", "file_problems", "history"):
        assert getattr(c, f) is not getattr(s, f), f  # ... the containers are the session's own
    assert c.history[0] is not s.history[0]
    s.cancel, s.running = asyncio.Event(), True
    c2 = copy.deepcopy(s)
    assert c2.cancel is None and c2.running is False


# ---- Stop on a real vLLM engine shared by two loops ------------------------------------------------

LONG = 256  # tokens each loop generates (ignore_eos): long enough to still be running after a stop


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("how", ["cancel_event", "task_cancel"])
async def test_stop_one_loop_on_a_shared_vllm_engine_leaves_the_other_intact(vllm_engine, how):
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from backend.engine import AgentLoop, LoopConfig
    from backend.loading.tokenizers import load_tokenizer

    bundle = load_tokenizer("smollm2")  # the tiny Llama uses SmolLM2's tokenizer
    cfg = LoopConfig(sampling={"temperature": 0.0, "max_tokens": LONG, "ignore_eos": True}, response_length=LONG)
    assert vllm_engine.num_unfinished_requests() == 0
    loops, cancels, streamed, tasks = {}, {}, {}, {}
    first = {k: asyncio.Event() for k in "ab"}
    for k, text in (("a", "Tell me a long story about the sea."), ("b", "Write a long poem about mountains.")):
        loops[k] = AgentLoop(vllm_engine, bundle, config=cfg)
        cancels[k] = asyncio.Event()
        streamed[k] = []

        def on_event(ev, k=k):
            if ev.kind == "tokens":
                streamed[k].extend(ev.token_ids)
                if len(streamed[k]) >= 8:
                    first[k].set()

        tasks[k] = asyncio.ensure_future(loops[k].run([{"role": "user", "content": text}], on_event=on_event, cancel=cancels[k]))
    await asyncio.wait_for(asyncio.gather(first["a"].wait(), first["b"].wait()), CALL_TIMEOUT_S)
    assert vllm_engine.num_unfinished_requests() == 2  # both requests are in the engine's batch

    # Stop "a" the two ways the UI does: its cancel event (the Stop button), or the task (the page went away)
    if how == "cancel_event":
        cancels["a"].set()
        ta = await asyncio.wait_for(tasks["a"], 60)  # a bound on a hang, not a timing
    else:
        tasks["a"].cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(tasks["a"], 60)
        ta = None
    # "a" ended while "b" is still generating: "a" did not wait for anything, and its request is
    # gone from the engine while "b"'s is still there
    assert not tasks["b"].done(), "the other loop finished before the stopped one ended: nothing proved"
    assert vllm_engine.num_unfinished_requests() == 1
    if ta is not None:
        assert ta.termination_reason == "cancelled"
        gen = ta.steps[1]
        assert gen.state == "generating" and gen.finish_reason == "abort"
        assert 8 <= len(ta.response_ids) < LONG and ta.response_ids == streamed["a"][: len(ta.response_ids)]
        assert ta.response_mask == [1] * len(ta.response_ids)

    tb = await asyncio.wait_for(tasks["b"], CALL_TIMEOUT_S)
    assert vllm_engine.num_unfinished_requests() == 0
    assert tb.termination_reason == "response_length", tb.termination_reason
    assert len(tb.response_ids) == LONG and tb.steps[1].finish_reason == "length"
    assert tb.response_ids == streamed["b"]
    # the tokens "b" got are the ones vLLM gives for its prompt alone (greedy)
    async def alone(engine):
        final = None
        params = VSamplingParams(temperature=0.0, max_tokens=LONG, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        async for out in engine.generate(TokensPrompt(prompt_token_ids=list(tb.prompt_ids)), params, f"alone-{how}"):
            final = out
        return list(final.outputs[0].token_ids)

    assert await vllm_engine.run_on_engine(alone) == tb.response_ids
    # and the engine keeps serving both kinds of work afterwards
    again = await AgentLoop(vllm_engine, bundle, config=LoopConfig(sampling={"temperature": 0.0, "max_tokens": 4, "ignore_eos": True})).run(
        [{"role": "user", "content": "again"}])
    assert len(again.response_ids) == 4
