"""Benchmark: an OpenTelemetry collector's export (OTLP JSON lines) indexed as a trace set
(issue 22): one row per trace id, the path ``--traces`` and the Trace files folder field run.

Data: the spans the real ``opentelemetry-instrumentation-openai-v2`` wrote for the fixture
``tests/data/import/otel/openai_v2_spans.otlp.jsonl`` (chat and tool spans with GenAI message
attributes), copied with fresh trace ids until the file reaches ``--mb``, one export request per
line as the collector's file exporter writes them. In a child process of its own:

* baseline: ``json.loads`` of every line (nothing else);
* cold: :meth:`backend.trace.catalog.TraceSet.open_set` with an empty cache folder (spans read,
  grouped by trace id, rows built, the cache written);
* warm: the same with the cache filled;
* open: ``TraceSet.open`` of 10 random rows (each reads only the lines its trace spans and
  renders the conversation with the qwen3 tokenizer);
* peak RSS of the process during each phase (sampled every 5 ms).

Targets (issue 22): cold ≤ 1.5× baseline, warm ≤ 0.35× cold, peak ≤ 600 MB. Usage::

    python bench/bench_otel_set.py [--mb 1000] [--dir /tmp/ali-bench-otel] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import Peak, cpu, uptime  # noqa: E402

SOURCE = os.path.join(ROOT, "tests", "data", "import", "otel", "openai_v2_spans.otlp.jsonl")
TARGETS = {"cold_ratio": 1.5, "warm_ratio": 0.35, "peak_mb": 600.0}


def _retrace(obj: dict, mapping: dict[str, str], k: int) -> None:
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                old = s["traceId"]
                new = mapping.get(old)
                if new is None:
                    new = mapping[old] = f"{k:016x}{len(mapping):016x}"
                s["traceId"] = new


def generate(path: str, mb: float) -> int:
    """Write ``path`` up to ``mb`` MB; returns the number of traces in it."""
    with open(SOURCE, encoding="utf-8") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    target = int(mb * 1e6)
    size, k, traces = 0, 0, 0
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        while size < target:
            k += 1
            mapping: dict[str, str] = {}
            for obj in lines:
                o = json.loads(json.dumps(obj))
                _retrace(o, mapping, k)
                s = json.dumps(o, separators=(",", ":"), ensure_ascii=False) + "\n"
                out.write(s)
                size += len(s.encode("utf-8"))
            traces += len(mapping)
    os.replace(path + ".tmp", path)
    return traces


def measure(path: str, cache: str) -> dict:
    import gc

    import pandas  # noqa: F401 - imported before timing, as the app has
    import pyarrow.parquet  # noqa: F401

    import backend.importers  # noqa: F401 - as the app has: the readers of span files registered with the catalogue
    from backend.trace.catalog import TraceSet

    out: dict = {"rss_start_mb": round(Peak().rss(), 1), "bytes": os.path.getsize(path)}
    t0, c0 = time.perf_counter(), cpu()
    n = 0
    with Peak() as pk:
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
    out["baseline_s"], out["baseline_cpu_s"], out["baseline_peak_mb"], out["lines"] = time.perf_counter() - t0, cpu() - c0, round(pk.peak, 1), n
    gc.collect()
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["ALI_TRACE_INDEX_CACHE"] = cache
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(path, final=True)
        ts.flush()
        df = ts.df
        out["cold_s"], out["cold_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["cold_peak_mb"], out["rows"], out["problems"] = round(pk.peak, 1), len(df), len(ts.problems)
    del ts, df
    gc.collect()
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(path, final=True)
        df = ts.df
        out["warm_s"], out["warm_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["warm_peak_mb"] = round(pk.peak, 1)
    assert ts.stats["hit"] == 1, ts.stats
    rng = random.Random(0)
    times = []
    rows = [0, len(df) - 1] + [rng.randrange(len(df)) for _ in range(8)]
    ts.open(rows[0])  # the tokenizer loads once (not what a row costs)
    for i in rows:
        t0 = time.perf_counter()
        t = ts.open(i)
        times.append((time.perf_counter() - t0) * 1e3)
        assert t.metadata["provenance"]["trace_id"] == df["id"].iat[i], (t.id, df["id"].iat[i])
    out["open_ms_median"], out["open_ms_max"] = statistics.median(times), max(times)
    out["cold_ratio"] = out["cold_s"] / out["baseline_s"]
    out["cold_cpu_ratio"] = out["cold_cpu_s"] / out["baseline_cpu_s"]
    out["warm_ratio"] = out["warm_s"] / out["cold_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000.0)
    ap.add_argument("--dir", default="/tmp/ali-bench-otel")
    ap.add_argument("--keep", action="store_true", help="keep the generated file (reused by the next run)")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "CACHE"), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"otlp-{int(args.mb)}mb.jsonl")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        traces = generate(path, args.mb)
        print(f"generated {path}: {os.path.getsize(path) / 1e6:.0f} MB, {traces:,} traces in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    load = uptime()
    r = subprocess.run([sys.executable, __file__, "--child", path, os.path.join(args.dir, "cache")], capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return r.returncode
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["load_before"], res["load_after"] = load, uptime()
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = res["bytes"] / 1e6
        print(f"{mb:.0f} MB, {res['lines']:,} lines, {res['rows']:,} traces (load {res['load_before']} → {res['load_after']})")
        print(f"json.loads of every line: {res['baseline_s']:.1f} s ({res['baseline_cpu_s']:.1f} s CPU), peak {res['baseline_peak_mb']:.0f} MB")
        print(f"cold index: {res['cold_s']:.1f} s = {res['cold_ratio']:.2f}× (CPU {res['cold_cpu_ratio']:.2f}×; target ≤ {TARGETS['cold_ratio']}), "
              f"peak {res['cold_peak_mb']:.0f} MB (target ≤ {TARGETS['peak_mb']:.0f})")
        print(f"warm index: {res['warm_s']:.2f} s = {res['warm_ratio']:.3f}× cold (target ≤ {TARGETS['warm_ratio']}), peak {res['warm_peak_mb']:.0f} MB")
        print(f"open a row: median {res['open_ms_median']:.0f} ms, max {res['open_ms_max']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
