"""Many Space visitors at once (issue 42, item 14): ``--visitors`` visitors arrive over ``--window`` seconds
at the real app in public mode (``app.py --backend scripted --public``, the default queue of 64 and 4 runs
at once), each driving the Playground through gradio's HTTP API as a script would: ``/app_load``, then
one ``/playground_run`` of a short scripted answer of its own (``POST /gradio_api/call/NAME``, then its
event stream). The client is light: ONE asyncio loop, one ``httpx.AsyncClient`` per visitor (a browser
of its own: its own connections), no thread per visitor.

Every run is classed by what the visitor got back:

* ``answered``: the run's status says it ended (``run 1 ended: ...``) and the answer is in the chat;
* ``busy``: the app's own refusal in words (the status line, or an HTTP 503 whose ``detail`` says it: the
  server is busy, when to try again);
* ``queue_full``: gradio's bare refusal (HTTP 503 "Queue is full", no words of ours);
* ``reset``: the connection was reset or closed without an answer (``httpx.ReadError``,
  ``RemoteProtocolError``, ``ConnectError``...);
* ``other``: anything else (its first words are counted).

Printed (and returned by :func:`run_load`): the counts, seconds from a visitor's arrival to its run's
answer (p50 / p95 / max of the answered), runs answered per second and per core, the app's RSS before
the first visitor and after the last (and its peak), the load average before and after, and any
traceback or error line in the app's log.

    .venv/bin/python bench/bench_visitors.py [--visitors 1000] [--window 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import html
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 240
CALL_TIMEOUT_S = 600  # a bound on a hang: a run still unanswered after this is counted as "timeout"
TAG_RE = re.compile(r"<[^>]*>")
RESET_ERRORS = ("ReadError", "RemoteProtocolError", "ConnectError", "WriteError", "ReadTimeout", "ConnectTimeout",
                "PoolTimeout", "WriteTimeout", "LocalProtocolError")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in kB (Linux /proc)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class App:
    """``app.py`` in public mode with the scripted backend on a free loopback port."""

    def __init__(self, *extra: str, env: dict[str, str] | None = None, root: Path = ROOT) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        fd, self.log_path = tempfile.mkstemp(prefix="ali-visitors-", suffix=".log")
        os.close(fd)
        e = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--backend", "scripted", "--public", "--host", "127.0.0.1", "--port", str(self.port), *extra],
            cwd=root, env=e, stdout=self.log, stderr=subprocess.STDOUT)

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(self.url + "gradio_api/info", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"app.py did not answer within {STARTUP_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()
        os.unlink(self.log_path)


def visitor_settings(i: int) -> dict[str, Any]:
    """One visitor's own run: a scripted answer of ~20 tokens naming the visitor, 20 ms a token."""
    answer = f"Hello visitor {i}, " + " ".join(f"w{k}" for k in range(12)) + f" end-{i}."
    return {"backend": "scripted", "script": json.dumps([answer]), "token_delay": 0.02, "tokenizer": "qwen3",
            "tools": "[]", "tool_choice": "auto"}


def plain(status: Any) -> str:
    return html.unescape(TAG_RE.sub("", str(status)))


async def call(http: Any, url: str, api: str, data: list[Any]) -> tuple[str, Any]:
    """One call of gradio's HTTP API: ``("complete" | "error" | "http NNN", payload or text)``."""
    r = await http.post(f"{url}gradio_api/call/{api}", json={"data": data})
    if r.status_code != 200:
        return f"http {r.status_code}", r.text
    event_id = r.json()["event_id"]
    ev, last = None, None
    async with http.stream("GET", f"{url}gradio_api/call/{api}/{event_id}") as s:
        async for line in s.aiter_lines():
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                if ev in ("complete", "error"):
                    try:
                        last = json.loads(line[5:].strip())
                    except json.JSONDecodeError:
                        last = line[5:].strip()
                    return ev, last
    return "ended", last


def classify_run(kind: str, payload: Any, i: int) -> tuple[str, str]:
    """``(class, what the visitor read)`` for one /playground_run outcome."""
    if kind == "complete":
        # the outputs: the session's state (null over the API), the chat, the status line, ...
        items = payload if isinstance(payload, list) else []
        status = next((plain(x) for x in items if isinstance(x, str) and "data-status" in x), "")
        chat = next((json.dumps(x) for x in items if isinstance(x, list)), "")
        if "run 1 ended:" in status and f"end-{i}." in chat:
            return "answered", status
        if "busy" in status.lower() and "try again" in status.lower():
            return "busy", status
        return "other", status or str(payload)[:200]
    if kind.startswith("http 503") and "queue is full" in str(payload).lower():
        return "queue_full", str(payload)[:200]
    if kind.startswith("http 503") and "busy" in str(payload).lower() and "try again" in str(payload).lower():
        return "busy", json.loads(payload).get("detail", "") if str(payload).startswith("{") else str(payload)[:200]
    return "other", f"{kind}: {str(payload)[:200]}"


def new_client(pool: int | None = None) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool) if pool else httpx.Limits()
    return httpx.AsyncClient(timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=30), verify=_ssl_context(), limits=limits)


async def visitor(i: int, url: str, delay: float, t_origin: float, results: list[dict[str, Any]], shared: Any = None) -> None:
    await asyncio.sleep(delay)
    t0 = time.monotonic()
    rec: dict[str, Any] = {"i": i, "arrived": t0 - t_origin}
    try:
        async with contextlib.nullcontext(shared) if shared is not None else new_client() as http:
            kind, payload = await call(http, url, "app_load", [])
            rec["load"] = kind if kind != "complete" else "ok"
            if kind.startswith("http 503"):
                rec["load_text"] = str(payload)[:200]
                if "busy" in str(payload).lower() and "try again" in str(payload).lower():
                    rec["load"] = "busy"
            kind, payload = await asyncio.wait_for(call(http, url, "playground_run", [f"hello from visitor {i}", visitor_settings(i)]),
                                                   CALL_TIMEOUT_S)
            rec["class"], rec["text"] = classify_run(kind, payload, i)
    except asyncio.TimeoutError:
        rec["class"], rec["text"] = "timeout", f"no answer within {CALL_TIMEOUT_S} s"
    except Exception as e:  # noqa: BLE001 - every failure is counted by its kind
        name = type(e).__name__
        rec["class"] = "reset" if name in RESET_ERRORS else "other"
        rec["text"] = f"{name}: {e}"[:300]
    rec["seconds"] = time.monotonic() - t0
    results.append(rec)


_SSL: list[Any] = []


def _ssl_context() -> Any:
    """One TLS context for every visitor's client (the app is plain http): httpx builds one per client
    otherwise, reading the CA bundle each time (~1 MB and tens of ms each: 1,000 of them loaded the
    client's own loop more than the app's)."""
    import ssl

    if not _SSL:
        _SSL.append(ssl.create_default_context())
    return _SSL[0]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def drive(url: str, visitors: int, window: float, seed: int = 42, shared_pool: int = 0) -> list[dict[str, Any]]:
    """Every visitor on one asyncio loop, arriving at uniformly random times over ``window`` seconds;
    with ``shared_pool``, all of them through ONE client whose pool holds that many connections (kept
    alive and reused from one visitor's call to the next's, as a proxy or a load tester does)."""
    rng = random.Random(seed)
    delays = sorted(rng.uniform(0, window) for _ in range(visitors))
    results: list[dict[str, Any]] = []
    t_origin = time.monotonic()
    shared = new_client(shared_pool) if shared_pool else None
    try:
        await asyncio.gather(*(visitor(i, url, d, t_origin, results, shared) for i, d in enumerate(delays)))
    finally:
        if shared is not None:
            await shared.aclose()
    return results


LOG_PROBLEM_RE = re.compile(r"Traceback|^ERROR|Exception in ASGI|h11|Invalid HTTP", re.M)


def run_load(visitors: int = 1000, window: float = 60.0, app_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
             seed: int = 42, root: Path = ROOT, shared_pool: int = 0) -> dict[str, Any]:
    """Start the app, drive the visitors, stop the app; the figures (see the module's docstring)."""
    app = App(*app_args, env=env, root=root)
    try:
        app.wait_ready()
        time.sleep(2.0)  # the warm-up thread (sample tokenizers) has settled
        rss0 = rss_kb(app.proc.pid)
        load0 = loadavg()
        t0 = time.monotonic()
        results = asyncio.run(drive(app.url, visitors, window, seed, shared_pool))
        wall = time.monotonic() - t0
        time.sleep(1.0)
        rss1 = rss_kb(app.proc.pid)
        load1 = loadavg()
        log = app.log_text()
    finally:
        app.stop()
    counts = collections.Counter(r["class"] for r in results)
    texts = collections.Counter((r["class"], re.sub(r"\d+(\.\d+)?", "N", r["text"])[:160]) for r in results if r["class"] != "answered")
    answered = [r["seconds"] for r in results if r["class"] == "answered"]
    cores = os.cpu_count() or 1
    return {
        "visitors": visitors, "window_s": window, "shared_pool": shared_pool, "wall_s": round(wall, 1), "counts": dict(counts),
        "load_failures": dict(collections.Counter(r.get("load", "none") for r in results if r.get("load") not in ("ok", "busy"))),
        "loads_refused_in_words": sum(r.get("load") == "busy" for r in results),
        "texts": [[k[0], k[1], n] for k, n in texts.most_common(8)],
        "answered_p50_s": round(percentile(answered, 0.5), 2), "answered_p95_s": round(percentile(answered, 0.95), 2),
        "answered_max_s": round(max(answered), 2) if answered else None,
        "runs_per_s": round(len(answered) / wall, 2), "runs_per_s_per_core": round(len(answered) / wall / cores, 2), "cores": cores,
        "rss_before_mb": round(rss0["VmRSS"] / 1024), "rss_after_mb": round(rss1["VmRSS"] / 1024),
        "rss_peak_mb": round(rss1["VmHWM"] / 1024), "rss_growth_mb": round((rss1["VmRSS"] - rss0["VmRSS"]) / 1024),
        "load_before": load0, "load_after": load1,
        "log_problems": LOG_PROBLEM_RE.findall(log)[:20], "log_tail": log[-2000:] if LOG_PROBLEM_RE.search(log) else "",
        "results": results,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--visitors", type=int, default=1000)
    p.add_argument("--window", type=float, default=60.0, help="seconds over which the visitors arrive")
    p.add_argument("--json", help="write every figure (and each visitor's outcome) here")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--app-root", type=Path, default=ROOT, help="the checkout whose app.py is started (another commit's, to compare)")
    p.add_argument("--shared-pool", type=int, default=0, metavar="N",
                   help="every visitor through one client with a pool of N kept-alive connections (default: a client each)")
    p.add_argument("app_args", nargs="*", help="more app.py flags (after --)")
    a = p.parse_args()
    res = run_load(a.visitors, a.window, tuple(a.app_args), seed=a.seed, root=a.app_root, shared_pool=a.shared_pool)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    shown = {k: v for k, v in res.items() if k not in ("results", "log_tail")}
    print(json.dumps(shown, indent=1))
    if res["log_tail"]:
        print("---- app log tail ----\n" + res["log_tail"])


if __name__ == "__main__":
    main()
