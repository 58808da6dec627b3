"""Benchmark: what `rollout`'s output and progress bar cost per 1,000 finished traces.

A real trace (the engine, scripted model, qwen3 profile: a tool call, its result, an answer)
is copied with new ids; then, in the same process, each way of writing them is timed (median of
``--repeats``), against the baseline of today's one JSONL file (``JsonlSink``: a line appended
and flushed per trace):

* JSONL shards (``ShardSink``, ``--shard-size 1000``): the same lines, a new file per 1,000;
* Parquet shards: the journal lines, plus the conversion of each full shard (read the journal
  back, write Parquet, fsync, rename, remove the journal);
* the progress bar (tqdm, drawn to an in-memory terminal at the default 0.2 s interval): per
  finished item one ``item_done`` and ``--ticks`` token events, against the same calls disabled.

Usage::

    python bench/bench_rollout_output.py [--traces 5000] [--repeats 3] [--ticks 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
SCHEMA = {
    "type": "function",
    "function": {"name": "get_current_temperature", "description": "Get current temperature at a location.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "mock": {"template": {"temperature": 72, "city": "{city}"}},
}


def one_trace():
    from backend.engine import AgentLoop
    from backend.generators.scripted import ScriptedGenerator
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry

    bundle = load_tokenizer("qwen3")
    loop = AgentLoop(ScriptedGenerator(bundle.tokenizer, [CALL, "It is 72°F in Seattle today; a light jacket is enough."]), bundle,
                     tools=ToolRegistry.from_schemas([SCHEMA]))
    return asyncio.run(loop.run([{"role": "user", "content": "What is the weather in Seattle?"}], trace_id="t"))


def time_sink(make, traces) -> float:
    d = tempfile.mkdtemp(prefix="bench-rollout-")
    try:
        sink = make(d)
        sink.open(True, False)
        t0 = time.perf_counter()
        for t in traces:
            sink.write(t)
        sink.close()
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(d)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def time_progress(n: int, ticks: int, enabled: bool) -> float:
    from backend.rollout import Progress, RolloutStats

    stats = RolloutStats(total=n)
    p = Progress(stats, stream=_Tty(), enabled=enabled)
    t0 = time.perf_counter()
    p.start()
    for _ in range(n):
        for _ in range(ticks):
            stats.generated_tokens += 1
            p.tick()
        stats.done += 1
        p.item_done()
    p.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=30, help="token events per item for the progress bar")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from backend.rollout import JsonlSink, ShardSink

    base = one_trace()
    traces = []
    for i in range(a.traces):
        t = type(base).from_dict({**base.to_dict(), "id": f"item-{i}"})
        traces.append(t)
    line_bytes = len(base.to_json()) + 1
    ways = {
        "jsonl file (baseline)": lambda d: JsonlSink(os.path.join(d, "t.jsonl")),
        "jsonl shards": lambda d: ShardSink(os.path.join(d, "s"), 1000, "jsonl"),
        "parquet shards": lambda d: ShardSink(os.path.join(d, "s"), 1000, "parquet"),
    }
    res: dict[str, float] = {}
    for name, make in ways.items():
        res[name] = statistics.median(time_sink(make, traces) for _ in range(a.repeats))
    prog_on = statistics.median(time_progress(a.traces, a.ticks, True) for _ in range(a.repeats))
    prog_off = statistics.median(time_progress(a.traces, a.ticks, False) for _ in range(a.repeats))
    k = a.traces / 1000
    out = {
        "traces": a.traces, "trace_json_bytes": line_bytes,
        "ms_per_1k": {n: round(v / k * 1000, 1) for n, v in res.items()},
        "vs_baseline": {n: round(v / res["jsonl file (baseline)"], 2) for n, v in res.items()},
        "progress_ms_per_1k_items": {"on": round(prog_on / k * 1000, 1), "off": round(prog_off / k * 1000, 1),
                                     "ticks_per_item": a.ticks},
    }
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{a.traces} traces of {line_bytes} bytes (JSON), median of {a.repeats}")
    for n in res:
        print(f"  {n:24s} {out['ms_per_1k'][n]:8.1f} ms / 1k traces   x{out['vs_baseline'][n]}")
    p = out["progress_ms_per_1k_items"]
    print(f"  progress bar: {p['on']} ms / 1k items with {a.ticks} token events each (disabled: {p['off']} ms)")


if __name__ == "__main__":
    main()
