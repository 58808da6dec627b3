"""Compressed responses (issue 42, item 15; ``ui/compression.py``): the real ``app.py`` (public mode,
scripted backend, the capture gateway with its key) on a free loopback port, asked over HTTP as a
browser and an SDK ask it.

* The page (``/``) and its ``/config`` come gzipped when the request accepts gzip, as they are when it
  does not; the gzipped body decompresses (Python's ``gzip``, not our code) to the same bytes.
* Event streams are never compressed (a compressor would hold their events back): gradio's own stream
  of a Playground run (``/gradio_api/call/playground_run/ID``) asked with ``Accept-Encoding: gzip`` has
  no ``Content-Encoding`` and carries the run's updates one by one (several "running" statuses, then
  the end); the capture gateway's streamed answer (``stream: true``) has no ``Content-Encoding`` and
  the same events as without gzip.
"""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from test_browser import running_app

pytestmark = pytest.mark.slow  # one app start (~10 s on 2 shared cores)

ANSWER = "Hello from the script."
KEY = "op-key"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gz")
    script = tmp / "s.json"
    script.write_text(json.dumps([ANSWER] * 8))
    args = ["--backend", "scripted", "--script", str(script), "--public", "--gateway", "--capture-dir", str(tmp / "cap"),
            "--gateway-key", KEY]
    with running_app(args, tmp / "app.log") as url:
        yield url


def raw_get(url: str, encoding: str | None) -> httpx.Response:
    """A GET whose body is kept as it came over the wire (``.raw``), not decoded by httpx."""
    headers = {"accept-encoding": encoding} if encoding else {"accept-encoding": "identity"}
    with httpx.Client(timeout=60) as c, c.stream("GET", url, headers=headers) as r:
        r.raw = b"".join(r.iter_raw())  # type: ignore[attr-defined]
        return r


@pytest.mark.parametrize("path", ["", "config"], ids=["page", "config"])
def test_the_page_and_its_config_are_gzipped_when_asked_and_the_same_bytes(app, path):
    plain = raw_get(app + path, None)
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    for asked in ("gzip", "gzip, deflate, br, zstd"):  # what httpx sends; what Chromium sends
        zipped = raw_get(app + path, asked)
        assert zipped.status_code == 200
        enc = zipped.headers.get("content-encoding")
        assert enc == "gzip", (path, asked, dict(zipped.headers))
        assert "accept-encoding" in zipped.headers.get("vary", "").lower()
        assert gzip.decompress(zipped.raw) == plain.raw, path
        assert len(zipped.raw) * 3 < len(plain.raw), (len(zipped.raw), len(plain.raw))


def sse_events(lines) -> list[tuple[str, str]]:
    out, ev = [], None
    for line in lines:
        if line.startswith("event:"):
            ev = line[6:].strip()
        elif line.startswith("data:"):
            out.append((ev or "message", line[5:].strip()))
    return out


def test_a_runs_event_stream_is_not_compressed_and_carries_each_update(app):
    words = " ".join(f"w{i}" for i in range(60))
    settings = {"backend": "scripted", "script": json.dumps([words]), "token_delay": 0.05, "tokenizer": "qwen3", "tools": "[]"}
    with httpx.Client(timeout=120, headers={"accept-encoding": "gzip"}) as c:
        r = c.post(app + "gradio_api/call/playground_run", json={"data": ["hello", settings]})
        assert r.status_code == 200, r.text
        event_id = r.json()["event_id"]
        with c.stream("GET", f"{app}gradio_api/call/playground_run/{event_id}") as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            assert "content-encoding" not in s.headers, dict(s.headers)
            ev, statuses = None, []
            for line in s.iter_lines():
                if line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:") and ev in ("generating", "complete"):
                    # the outputs: the session (not sent), the chat, the status line, ...
                    out = json.loads(line[5:])
                    statuses.append((ev, next((x for x in out if isinstance(x, str) and "data-status" in x), "")))
                    if ev == "complete":
                        break
    # the run's own updates came one by one: some say it is running, the last one that it ended
    running = [st for ev, st in statuses if ev == "generating" and "running ·" in str(st)]
    assert len(running) >= 2, statuses[:3]
    assert "run 1 ended" in str(statuses[-1][1]) and not any("ended" in str(st) for st in running)


def test_the_gateways_streamed_answer_is_not_compressed_and_intact(app):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    got = {}
    for asked in ("identity", "gzip"):
        headers = {"authorization": f"Bearer {KEY}", "accept-encoding": asked}
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{app}s/gz-{asked}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert "content-encoding" not in r.headers, dict(r.headers)
            got[asked] = sse_events(r.iter_lines())
    for asked, events in got.items():
        assert events[-1] == ("message", "[DONE]"), events[-3:]
        text = "".join((json.loads(d)["choices"][0]["delta"].get("content") or "") for _, d in events[:-1]
                       if json.loads(d).get("choices"))
        assert text == ANSWER, (asked, text)
    assert len(got["gzip"]) == len(got["identity"])
