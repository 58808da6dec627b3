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

import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import Peak, child_measure, index_cold_warm, json_baseline, print_set_figures, set_parser  # noqa: E402

SOURCE = os.path.join(ROOT, "tests", "data", "import", "otel", "openai_v2_spans.otlp.jsonl")


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
    import pandas  # noqa: F401 - imported before timing, as the app has
    import pyarrow.parquet  # noqa: F401

    import backend.importers  # noqa: F401 - as the app has: the readers of span files registered with the catalogue

    out: dict = {"rss_start_mb": round(Peak().rss(), 1), "bytes": os.path.getsize(path), **json_baseline([path])}
    phases, ts = index_cold_warm(path, cache, final=True)
    out.update(phases)
    df = ts.df
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
    args = set_parser(__doc__, "/tmp/ali-bench-otel", ("PATH", "CACHE")).parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"otlp-{int(args.mb)}mb.jsonl")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        traces = generate(path, args.mb)
        print(f"generated {path}: {os.path.getsize(path) / 1e6:.0f} MB, {traces:,} traces in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    res = child_measure(__file__, [path, os.path.join(args.dir, "cache")], args.dir, args.keep)
    if res is None:
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = res["bytes"] / 1e6
        print(f"{mb:.0f} MB, {res['lines']:,} lines, {res['rows']:,} traces (load {res['load_before']} → {res['load_after']})")
        print_set_figures(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
