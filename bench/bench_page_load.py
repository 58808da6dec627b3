"""The first page load in headless Chromium (issue 42, item 15): bytes over the wire and time to an
interactive page, for the app of each ``--app-root`` (this checkout, and another commit's to compare).

The app (``app.py --backend scripted --public``) on a free loopback port; each repetition opens a new
browser context (empty cache) and loads ``/``. Bytes: the sum of Chromium's ``encodedDataLength`` over
every response of the load (DevTools protocol, ``Network.loadingFinished``), with the page's and
``/config``'s own size and ``Content-Encoding``. Interactive: the Playground's Send button is visible and
enabled and its message box filled (the Inspector's tab is rendered only when opened). Measured on loopback as it is, and
with Chromium's network emulation at ``--mbps`` Mbit/s and ``--rtt-ms`` ms (a visitor's line).

    .venv/bin/python bench/bench_page_load.py [--reps 3] [--app-root /path/to/other/checkout ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_visitors import ROOT, App, loadavg  # noqa: E402

CHROMIUM = os.environ.get("ALI_CHROMIUM", "/usr/bin/chromium")


def load_once(browser, url: str, throttle: tuple[float, float] | None) -> dict:
    ctx = browser.new_context()
    page = ctx.new_page()
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    if throttle:
        mbps, rtt = throttle
        bps = mbps * 1e6 / 8
        cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": rtt, "downloadThroughput": bps,
                                                       "uploadThroughput": bps})
    sizes: dict[str, int] = {}
    urls: dict[str, tuple[str, str]] = {}
    cdp.on("Network.responseReceived", lambda e: urls.__setitem__(e["requestId"], (e["response"]["url"],
                                                                                   e["response"]["headers"].get("content-encoding", ""))))
    cdp.on("Network.loadingFinished", lambda e: sizes.__setitem__(e["requestId"], int(e["encodedDataLength"])))
    t0 = time.monotonic()
    page.goto(url)
    page.wait_for_selector("#pg-send", state="visible", timeout=120_000)
    # the Playground's message box filled and Send enabled (the Inspector's tab is rendered only
    # when opened, so its summary cannot be waited for on the first tab)
    page.wait_for_function("() => { const b = document.querySelector('#pg-send');"
                           " const t = document.querySelector('#pg-message textarea');"
                           " return b && !b.disabled && t && t.value.length > 0; }", timeout=120_000)
    interactive = time.monotonic() - t0
    page.wait_for_timeout(500)  # responses still finishing are counted
    own = {}
    for rid, (u, enc) in urls.items():
        path = u.split(url, 1)[-1] if u.startswith(url) else None
        if path in ("", "config"):
            own["/" + path] = {"bytes": sizes.get(rid), "encoding": enc or "none"}
    ctx.close()
    return {"interactive_s": interactive, "bytes": sum(sizes.values()), "requests": len(sizes), "own": own}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--app-root", type=Path, action="append", help="a checkout whose app.py is started (repeatable; default: this one)")
    p.add_argument("--mbps", type=float, default=10.0)
    p.add_argument("--rtt-ms", type=float, default=40.0)
    a = p.parse_args()
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                           "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        for root in a.app_root or [ROOT]:
            app = App(root=root)
            try:
                app.wait_ready()
                load_once(browser, app.url, None)  # warm: the server's first page build is not measured
                for name, throttle in (("loopback", None), (f"{a.mbps:g} Mbit/s, {a.rtt_ms:g} ms", (a.mbps, a.rtt_ms))):
                    load0 = loadavg()
                    runs = [load_once(browser, app.url, throttle) for _ in range(a.reps)]
                    out[f"{root} · {name}"] = {
                        "interactive_s": [round(r["interactive_s"], 2) for r in runs],
                        "median_s": round(statistics.median(r["interactive_s"] for r in runs), 2),
                        "bytes": runs[-1]["bytes"], "requests": runs[-1]["requests"], "own": runs[-1]["own"],
                        "load": f"{load0} -> {loadavg()}"}
            finally:
                app.stop()
        browser.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
