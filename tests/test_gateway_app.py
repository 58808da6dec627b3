"""``app.py --gateway``: the capture gateway on the app's own port, as an anonymous visitor meets it.

A public app (``--public``) serves the gateway only with ``--gateway-key``, and then refuses every
request without it; without a key the routes are not there at all and the log says why. The
captures are the app's live trace set (``--traces`` defaults to the capture folder)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from gateway_support import read_capture
from test_browser import running_app

pytestmark = pytest.mark.slow

ANSWER = "Hello from the script."
USER = [{"role": "user", "content": "hi"}]


def test_public_app_serves_the_gateway_only_with_its_key(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([ANSWER]))
    cap = tmp_path / "cap"
    args = ["--backend", "scripted", "--script", str(script), "--public", "--gateway", "--capture-dir", str(cap),
            "--gateway-key", "op-key"]
    with running_app(args, tmp_path / "app.log") as url:
        base = url.rstrip("/")
        for headers in ({}, {"authorization": "Bearer visitor-guess"}, {"x-api-key": ""}):
            r = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": USER}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{base}/v1/models").status_code == 401
        client = openai.OpenAI(base_url=f"{base}/s/visitor/v1", api_key="op-key", max_retries=0)
        assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content == ANSWER
        assert httpx.get(url).status_code == 200  # the app itself still answers
    (branch,) = read_capture(cap, "visitor")
    assert branch["metadata"]["source"] == "gateway"
    text = (tmp_path / "app.log").read_text()
    assert "capture gateway:" in text and "op-key" not in text and "op-key" not in (cap / "visitor.jsonl").read_text()


def test_public_app_without_a_key_has_no_gateway(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([ANSWER]))
    cap = tmp_path / "cap"
    args = ["--backend", "scripted", "--script", str(script), "--public", "--gateway", "--capture-dir", str(cap)]
    with running_app(args, tmp_path / "app.log") as url:
        r = httpx.post(f"{url.rstrip('/')}/v1/chat/completions", json={"model": "m", "messages": USER})
        assert r.status_code == 404
        assert httpx.post(f"{url.rstrip('/')}/s/x/v1/chat/completions", json={"model": "m", "messages": USER}).status_code == 404
    assert "the capture gateway is off" in (tmp_path / "app.log").read_text()
    assert not any(cap.glob("*.jsonl"))
