"""Many Space visitors at once against the real app (issue 42, item 14): ``bench/bench_visitors.py``'s
light client (ONE asyncio loop; ``httpx``), the real ``app.py`` in public mode with the scripted
backend and the default queue (64) and run slots (4). Visitors arrive at random over 60 s; each calls
``/app_load`` (what a page load calls) and then ``/playground_run`` with a short scripted answer of its
own, through gradio's HTTP API.

Before the fix, 1,000 visitors: ~900 of them got gradio's bare 503 "Queue is full" (the page loads
first: each cost ~0.2 s of CPU), 98 runs answered with p95 94 s, and with gradio holding a ~0.35 MB
session for each call, the app grew by 100+ MB for the few calls it served.

What must hold (no clock is asserted):

* every run is answered, or refused in words the visitor reads in the status line: the server is
  busy, and a number of seconds to try again in; never gradio's 503, never a connection reset or a
  connection closed without an answer, never an error;
* every page load (``/app_load``) is answered or refused in words (an HTTP 503 whose text says the
  server is busy and when to try again);
* the app's RSS grows by less than 300 MB over the run.

``ALI_TEST_VISITORS`` sets the number of visitors: :data:`VISITORS` (300) by default, so that the test
stays within a few minutes on CI's 2 shared cores (1,000 took 2-5 minutes there, depending on the other
jobs); ``ALI_TEST_VISITORS=1000`` is the issue's case, and ``bench/bench_visitors.py``'s default.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_visitors  # noqa: E402

VISITORS = int(os.environ.get("ALI_TEST_VISITORS", "300"))
WINDOW_S = 60.0
MAX_RSS_GROWTH_MB = 300


def check(res: dict) -> None:
    summary = {k: v for k, v in res.items() if k not in ("results", "log_tail")}
    counts = res["counts"]
    assert set(counts) <= {"answered", "busy"}, summary
    assert sum(counts.values()) == res["visitors"], summary
    assert counts.get("answered", 0) > 0, summary
    assert not res["load_failures"], summary
    for r in res["results"]:
        if r["class"] == "busy":
            assert re.search(r"The server is busy: .* try again in about \d+ s", r["text"]), r["text"]
    assert res["rss_growth_mb"] < MAX_RSS_GROWTH_MB, summary
    assert not res["log_problems"], res["log_tail"]


def test_many_visitors_each_answered_or_told_when_to_retry():
    check(bench_visitors.run_load(VISITORS, WINDOW_S))
