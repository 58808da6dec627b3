"""Helpers the benchmarks share (one module, so that no bench imports another):

* :func:`make_traces`: realistic traces made by the real engine (scripted model, qwen3 profile,
  token-exact): the seed-001 weather run, a multi-step research run with long tool results,
  parallel calls, a malformed call, and a run that hits response_length (bench_trace_load.py,
  bench_trace_index.py);
* :class:`Peak` (peak RSS of a phase), :func:`cpu` (CPU seconds of this process) and
  :func:`uptime` (the load average, reported with each figure) (bench_trace_index.py,
  bench_trace_load.py, bench_otel_set.py).

A bench imports it as ``common`` (its own folder is first on ``sys.path`` when run as a script).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- engine-made traces ------------------------------------------------------------------------------


def _registry(tools: dict):
    """backend.tools.ToolRegistry when it is there; else a minimal stand-in (same duck type)."""
    try:
        from backend.tools import ToolRegistry

        return ToolRegistry.from_functions(list(tools.values()))
    except Exception:
        from transformers.utils import get_json_schema

        from backend.trace import ToolResult

        class _Reg:
            schemas = [get_json_schema(f) for f in tools.values()]

            def __len__(self):
                return len(self.schemas)

            async def execute(self, call, max_response_length=None, **kw):
                fn = tools.get(call.name)
                if fn is None:
                    return ToolResult(call_id=call.id, name=call.name, ok=False, error="unknown_tool", content=f"Error: unknown tool {call.name!r}")
                out = fn(**call.arguments)
                text = out if isinstance(out, str) else json.dumps(out)
                trunc = max_response_length is not None and len(text) > max_response_length
                return ToolResult(call_id=call.id, name=call.name, content=text[:max_response_length] if trunc else text, truncated=trunc, original_length=len(text))

        return _Reg()


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for, in the format "City, State, Country".
    """
    return {"temperature": 72, "city": city}


def search(query: str):
    """Search the web.

    Args:
        query: what to look for
    """
    return [{"title": f"Result {i} for {query}", "snippet": ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 6).strip(), "url": f"https://example.org/{i}"} for i in range(8)]


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def make_traces() -> list:
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.tokenizers import load_tokenizer

    b = load_tokenizer("qwen3")
    reg = _registry({"get_current_temperature": get_current_temperature, "search": search})
    long_answer = " ".join(f"Finding {i}: the evidence from source {i % 8} suggests a steady trend, with caveats noted." for i in range(40))
    scenarios = [
        ([call("get_current_temperature", city="Seattle, WA, USA"), "The current temperature in Seattle, WA, USA is 72°F."], {}, "What's the weather in Seattle?"),
        ([call("search", query=f"topic {k}") for k in range(5)] + [long_answer], {"max_tool_response_length": 4000}, "Research the topic thoroughly."),
        ([call("get_current_temperature", city="Paris") + "\n" + call("get_current_temperature", city="Tokyo") + "\n" + call("get_current_temperature", city="Lima"), "Paris 72, Tokyo 72, Lima 72."], {"max_parallel_calls": 3}, "Weather in Paris, Tokyo and Lima?"),
        (['<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call>'], {}, "Find x."),
        ([long_answer], {"response_length": 200}, "Write a long report."),
    ]
    traces = []
    for script, cfg, q in scenarios:
        loop = AgentLoop(ScriptedGenerator(b.tokenizer, script), b, tools=reg, config=LoopConfig(**cfg))
        traces.append(asyncio.run(loop.run([{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": q}])))
    return traces


# ---- measuring ---------------------------------------------------------------------------------------


class Peak:
    """Peak RSS (MB) of this process while a phase runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = 0.0
        self._stop = threading.Event()

    def rss(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page / 1e6

    def __enter__(self) -> Peak:
        self.peak = self.rss()
        self._stop.clear()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.rss())

    def __exit__(self, *a) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())


def cpu() -> float:
    """CPU seconds of this process (user + system): on a machine other jobs load, wall time
    includes waiting for a core, CPU time does not."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def uptime() -> str:
    """The load average over 1, 5 and 15 minutes (``/proc/loadavg``), reported with each figure."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
