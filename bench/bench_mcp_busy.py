"""The MCP endpoint under a burst of renders that need a template worker (issue 42, item 7).

The app (``--backend scripted --public``) on a free loopback port with the MCP endpoint mounted
as ``app.py --mcp`` mounts it; ``--calls`` clients, each with its own MCP session (the MCP SDK's
own client), send at once a ``render`` of an inline template that loops until the template guard
stops it (``ALI_TEMPLATE_TIMEOUT_S``, 5 s). The app's template pool (``ALI_TEMPLATE_WORKERS``, 2)
is started first, so start-up is not measured. Each answer is classed:

* ``refused at admission``: the server is busy (a lane full), answered before anything ran;
* ``stopped``: admitted, rendered, and stopped by the guard (what an admitted call should get);
* ``no worker``: admitted, then refused after waiting for a template worker
  ("all N template workers are busy");
* anything else (an internal error) by its first words.

Printed: per class, how many and the seconds from sending the call to its answer (min, median,
max), with the load average before and after. Nothing here is asserted by a test.

    .venv/bin/python bench/bench_mcp_busy.py [--calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import uptime  # noqa: E402

ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kind(is_error: bool, text: str) -> str:
    if "the server is busy (" in text:
        return "refused at admission"
    if "did not finish rendering within" in text:
        return "stopped"
    if "template workers are busy" in text or "template worker is busy" in text or "waited" in text:
        return "no worker"
    return "answered" if not is_error else text.split(":", 1)[-1].strip()[:60]


async def _one(base: str, start: asyncio.Event) -> tuple[float, bool, str]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(base + "/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await start.wait()
            sent = time.monotonic()
            res = await s.call_tool("render", {"messages": [{"role": "user", "content": "hi"}], "template": ENDLESS})
    return time.monotonic() - sent, bool(res.is_error), " ".join(c.text for c in res.content)


async def main(calls: int) -> None:
    import app as app_module
    import ui
    from backend.tokens.template_guard import GUARD
    from ui import mcp_server

    args = app_module.parse_args(["--backend", "scripted", "--public", "--host", "127.0.0.1"])
    ctx = app_module.build_context(args)
    demo = ui.build_app(ctx)
    kw = ui.launch_kwargs(ctx)
    kw.update(mcp_server.launch_kwargs(ctx, host=args.host))
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kw)
    try:
        GUARD.start()
        load = uptime()
        start = asyncio.Event()
        tasks = [asyncio.ensure_future(_one(f"http://127.0.0.1:{port}", start)) for _ in range(calls)]
        await asyncio.sleep(2.0)  # the sessions opened: the calls leave together
        start.set()
        answers = await asyncio.gather(*tasks)
    finally:
        demo.close()
    by: dict[str, list[float]] = {}
    for took, is_error, text in answers:
        by.setdefault(_kind(is_error, text), []).append(took)
    print(f"{calls} calls, {GUARD.size} template workers, load {load} -> {uptime()}")
    for kind, times in sorted(by.items(), key=lambda kv: min(kv[1])):
        print(f"  {kind}: {len(times)}, answered {min(times):.1f} / {statistics.median(times):.1f} / {max(times):.1f} s "
              "(min / median / max)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=30, help="clients sending a render at once (default 30)")
    asyncio.run(main(p.parse_args().calls))
