"""Helpers the benchmarks share (one module, so that no bench imports another):

* :func:`make_traces`: realistic traces made by the real engine (scripted model, qwen3 profile,
  token-exact): the seed-001 weather run, a multi-step research run with long tool results,
  parallel calls, a malformed call, and a run that hits response_length (bench_trace_load.py,
  bench_trace_index.py);
* :class:`Peak` (peak RSS of a phase), :func:`cpu` (CPU seconds of this process) and
  :func:`uptime` (the load average, reported with each figure) (bench_trace_index.py,
  bench_trace_load.py, bench_otel_set.py, bench_rl_run.py);
* :func:`json_baseline` (``json.loads`` of every line: the trace-set benchmarks' baseline) and
  :func:`index_cold_warm` (a set indexed with an empty cache, then from it), :func:`child_measure`
  (the measurement in a child process of its own, with the load before and after),
  :func:`set_parser` and :func:`print_set_figures` (bench_trace_index.py, bench_otel_set.py, bench_rl_run.py).

A bench imports it as ``common`` (its own folder is first on ``sys.path`` when run as a script).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

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
    from backend.loading.tokenizers import load_tokenizer

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


def paired_report(res: dict, ratios: list[float], load_before: str, as_json: bool) -> dict:
    """Adds the paired ratios ours / baseline (median, min, max) and the load before and after
    to a bench's figures, prints them (one JSON line, or a line per figure) and returns them
    (bench_transformers_stream.py, bench_gguf.py)."""
    import statistics

    res = {**res, "ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
           "ratio_max": round(max(ratios), 3), "load_before": load_before, "load_after": uptime()}
    print(json.dumps(res) if as_json else "\n".join(f"{k}: {v}" for k, v in res.items()))
    return res


# ---- trace sets ----------------------------------------------------------------------------------------

# the trace-set bounds (issue 22; a prime-rl run, issue 30): cold ≤ 1.5× json.loads, warm ≤ 0.35× cold, peak ≤ 600 MB
SET_TARGETS = {"cold_ratio": 1.5, "warm_ratio": 0.35, "peak_mb": 600.0}


def json_baseline(files: list[str]) -> dict:
    """``json.loads`` of every line of ``files``, nothing else: wall and CPU seconds, peak RSS, lines."""
    t0, c0 = time.perf_counter(), cpu()
    n = 0
    with Peak() as pk:
        for p in files:
            with open(p, "rb") as f:
                for line in f:
                    json.loads(line)
                    n += 1
    return {"baseline_s": time.perf_counter() - t0, "baseline_cpu_s": cpu() - c0, "baseline_peak_mb": round(pk.peak, 1), "lines": n}


def index_cold_warm(spec: str, cache: str, **kw: Any) -> tuple[dict, Any]:
    """The trace set of ``spec`` indexed with the cache folder ``cache`` emptied (cold: scan, rows,
    the cache written), then again from it (warm), in this process; ``kw`` to ``TraceSet.open_set``.
    Returns the times, CPU, peaks, rows and problems, and the warm set."""
    import gc

    from backend.trace.catalog import TraceSet

    gc.collect()
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["ALI_TRACE_INDEX_CACHE"] = cache
    out: dict = {}
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(spec, **kw)
        ts.flush()
        df = ts.df
        out["cold_s"], out["cold_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["cold_peak_mb"], out["rows"], out["problems"] = round(pk.peak, 1), len(df), len(ts.problems)
    del ts, df
    gc.collect()
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(spec, **kw)
        _ = ts.df  # the frame the tab filters: built in the timed phase
        out["warm_s"], out["warm_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["warm_peak_mb"] = round(pk.peak, 1)
    return out, ts


def set_parser(doc: str, default_dir: str, child: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options a 1 GB trace-set benchmark shares: ``--mb``, ``--dir``, ``--keep``, ``--json``
    and the hidden ``--child`` (what :func:`child_measure` passes)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000.0)
    ap.add_argument("--dir", default=default_dir)
    ap.add_argument("--keep", action="store_true", help="keep the generated data (reused by the next run of the same size)")
    ap.add_argument("--child", nargs=len(child), metavar=child, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    return ap


def child_measure(script: str, argv: list[str], data_dir: str, keep: bool) -> dict | None:
    """``script --child ARGV`` in a child process of its own (its peak RSS is its own): its last
    stdout line as JSON, with the load average before and after; ``data_dir`` removed unless
    ``keep``. None (its stderr printed) when it failed."""
    load = uptime()
    r = subprocess.run([sys.executable, script, "--child", *argv], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return None
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["load_before"], res["load_after"] = load, uptime()
    if not keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    return res


def print_set_figures(res: dict, targets: dict = SET_TARGETS) -> None:
    """The baseline, cold, warm and open-a-row lines of a trace-set benchmark's result."""
    print(f"json.loads of every line: {res['baseline_s']:.1f} s ({res['baseline_cpu_s']:.1f} s CPU), peak {res['baseline_peak_mb']:.0f} MB")
    print(f"cold index: {res['cold_s']:.1f} s = {res['cold_ratio']:.2f}× (CPU {res['cold_cpu_ratio']:.2f}×; target ≤ {targets['cold_ratio']}), "
          f"peak {res['cold_peak_mb']:.0f} MB (target ≤ {targets['peak_mb']:.0f})")
    print(f"warm index: {res['warm_s']:.2f} s = {res['warm_ratio']:.3f}× cold (target ≤ {targets['warm_ratio']}), peak {res['warm_peak_mb']:.0f} MB")
    print(f"open a row: median {res['open_ms_median']:.0f} ms, max {res['open_ms_max']:.0f} ms")
