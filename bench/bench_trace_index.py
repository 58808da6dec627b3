"""Benchmark: indexing trace sets of 100 MB to 1 GB (issue 16), the path the Trace files tab runs.

Data: the engine-made traces of ``common.make_traces`` (as ``bench_trace_load.py``; scripted model, qwen3 profile: the
weather run, a research run with long tool results, parallel calls, a malformed call, a
response-length hit), copied with distinct ids into a verl-style folder of ``<step>.jsonl`` files
of ``--file-mb`` each, and the same rows as Parquet (our layout, 512 rows a row group). Sizes are
prefixes of one folder (symlinks), so the 100 MB set is the first files of the 1 GB one.

For each size and format, in a child process of its own (so that its peak memory is its own):

* baseline: ``json.loads`` of every line of the same JSONL files (nothing else);
* cold: :meth:`backend.trace.catalog.TraceSet.open_set` with an empty cache folder (scan, the
  DataFrame the tab filters, the cache written);
* warm: the same with the cache filled (what a restart of the app, or a second visitor, costs);
* the tab's table: filters + one page of rows (``ui.trace_sets.set_page``), no filter and a
  text search;
* open: ``TraceSet.open`` of 30 random rows (median and max), each reading only its bytes;
* peak RSS of the process during each phase (sampled every 5 ms from /proc/self/statm).

Then the growth from 100 MB to 1 GB (least squares, R²) and what 10 GB would take, and the
live-follow latency: a writer process appends one trace every 50 ms (half a line, a pause, the
rest) to a new file in the 1 GB folder while a follower calls ``refresh()`` every ``--poll`` s (the
tab's timer: 1 s); latency = row visible in the index − line complete on disk, p50 / p95.

Targets: 1 GB cold ≤ 10 s, warm ≤ 1 s, peak ≤ 500 MB, open ≤ 100 ms. Usage::

    python bench/bench_trace_index.py [--sizes 100,250,500,1000] [--file-mb 50] [--dir /tmp/ali-bench-index] [--keep] [--json]
    python bench/bench_trace_index.py --engines FILE.jsonl   # our scan vs pyarrow.json vs DuckDB (if importable)
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

from common import Peak, cpu, json_baseline, make_traces, uptime  # noqa: E402

TARGETS = {"cold_s": 10.0, "warm_s": 1.0, "peak_mb": 500.0, "open_ms": 100.0}


# ---- data ------------------------------------------------------------------------------------------


def generate(root: str, total_mb: float, file_mb: float) -> list[str]:
    """``root/jsonl/<step>.jsonl`` and ``root/parquet/<step>.parquet`` (the same rows), ``file_mb``
    each, ``total_mb`` in all; returns the step names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from backend.trace.io import parquet_row, parquet_schema

    base = make_traces()
    head = '{"format_version":1,"id":"'
    tails = []
    for t in base:
        s = t.to_json()
        assert s.startswith(head)
        tails.append(s[len(head) + len(t.id):])
    rows = [parquet_row(t) for t in base]
    schema = parquet_schema()
    os.makedirs(os.path.join(root, "jsonl"), exist_ok=True)
    os.makedirs(os.path.join(root, "parquet"), exist_ok=True)
    steps, n, written_all = [], 0, 0
    step = 0
    while written_all < total_mb * 1e6:
        step += 1
        steps.append(str(step))
        jp = os.path.join(root, "jsonl", f"{step}.jsonl")
        pp = os.path.join(root, "parquet", f"{step}.parquet")
        buf: list[dict] = []
        written = 0
        with open(jp, "w", encoding="utf-8") as f, pq.ParquetWriter(pp, schema, compression="zstd") as w:
            while written < file_mb * 1e6:
                k = n % len(base)
                tid = f"bench-{n:08d}"
                line = f"{head}{tid}{tails[k]}\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                r = dict(rows[k])
                r["id"] = tid
                buf.append(r)
                if len(buf) == 512:
                    w.write_table(pa.Table.from_pylist(buf, schema=schema))
                    buf = []
                n += 1
            if buf:
                w.write_table(pa.Table.from_pylist(buf, schema=schema))
        written_all += written
    return steps


def size_dir(root: str, fmt: str, steps: list[str], mb: float, file_mb: float) -> str:
    """A folder of symlinks to the first files making ``mb``."""
    k = max(1, round(mb / file_mb))
    d = os.path.join(root, f"set-{fmt}-{int(mb)}")
    if not os.path.isdir(d):
        os.makedirs(d)
        for s in steps[:k]:
            ext = "jsonl" if fmt == "jsonl" else "parquet"
            os.symlink(os.path.join(root, fmt, f"{s}.{ext}"), os.path.join(d, f"{s}.{ext}"))
    return d


# ---- one measurement (child process) ---------------------------------------------------------------


def measure(spec: str, jsonl_spec: str, cache: str) -> dict:
    import gc

    import pandas  # noqa: F401 - imported before timing, as the app has
    import pyarrow.parquet  # noqa: F401

    from backend.trace.catalog import TraceSet, resolve
    from ui import trace_sets as tf

    out: dict = {"rss_start_mb": round(Peak().rss(), 1)}
    files = resolve(jsonl_spec)
    nbytes = sum(os.path.getsize(p) for p in resolve(spec))
    out["jsonl_bytes"] = sum(os.path.getsize(p) for p in files)
    out.update(json_baseline(files))
    n = out["lines"]
    gc.collect()
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["ALI_TRACE_INDEX_CACHE"] = cache
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(spec)
        ts.flush()
        df = ts.df
        out["cold_s"], out["cold_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["cold_peak_mb"] = round(pk.peak, 1)
    out["rows"] = len(df)
    out["bytes"] = nbytes
    assert len(df) == n and not ts.problems, (len(df), n, ts.problems[:3])
    del ts, df
    gc.collect()
    with Peak() as pk:
        t0, c0 = time.perf_counter(), cpu()
        ts = TraceSet.open_set(spec)
        df = ts.df
        out["warm_s"], out["warm_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    out["warm_peak_mb"] = round(pk.peak, 1)
    assert ts.stats["hit"] == len(ts.files) and len(df) == n
    out["rss_after_mb"] = round(Peak().rss(), 1)
    view = tf.SetView()
    t0 = time.perf_counter()
    page, total, _ = tf.set_page(ts, view)
    out["table_page_ms"] = (time.perf_counter() - t0) * 1e3
    view.query = "paris"
    t0 = time.perf_counter()
    page, total, _ = tf.set_page(ts, view)
    out["table_search_ms"] = (time.perf_counter() - t0) * 1e3
    out["search_matches"] = total
    rng = random.Random(0)
    times, cpus = [], []
    for i in [0, n - 1] + [rng.randrange(n) for _ in range(28)]:
        t0, c0 = time.perf_counter(), cpu()
        t = ts.open(i)
        times.append((time.perf_counter() - t0) * 1e3)
        cpus.append((cpu() - c0) * 1e3)
        assert t.id == df["id"].iat[i]
    out["open_ms_median"] = statistics.median(times)
    out["open_ms_max"] = max(times)
    out["open_cpu_ms_median"] = statistics.median(cpus)
    out["open_cpu_ms_max"] = max(cpus)
    return out


# ---- live follow ----------------------------------------------------------------------------------

WRITER = r"""
import json, sys, time
src, path, log, n, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
lines = open(src, encoding="utf-8").read().splitlines()
stamps = []
with open(path, "w", encoding="utf-8") as f:
    for i in range(n):
        line = lines[i % len(lines)].replace('"id":"bench-', '"id":"live-%05d-' % i, 1)
        f.write(line[: len(line) // 2]); f.flush()
        time.sleep(every / 2)
        f.write(line[len(line) // 2 :] + "\n"); f.flush()
        stamps.append(time.time())
        time.sleep(every / 2)
json.dump(stamps, open(log, "w"))
"""


def follow(spec_dir: str, src: str, cache: str, n: int, every: float, poll: float) -> dict:
    import backend.importers  # noqa: F401 - as the app has: other tools' readers registered with the catalogue
    from backend.trace.catalog import TraceSet

    os.environ["ALI_TRACE_INDEX_CACHE"] = cache
    ts = TraceSet.open_set(spec_dir)
    base = len(ts)
    live = os.path.join(spec_dir, "999999.jsonl")
    log = live + ".stamps"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, src, live, log, str(n), str(every)])
    seen: dict[int, float] = {}
    refresh_ms = []
    try:
        while proc.poll() is None or len(seen) < n:
            t0 = time.perf_counter()
            ts.refresh()
            now = time.time()
            refresh_ms.append((time.perf_counter() - t0) * 1e3)
            for i in range(base + len(seen), len(ts)):
                seen[int(ts.df["id"].iat[i].split("-")[1])] = now
            if proc.poll() is not None and len(seen) >= n:
                break
            time.sleep(poll)
    finally:
        proc.wait(timeout=120)
    stamps = json.load(open(log))
    os.remove(log)
    os.remove(live)
    lat = sorted((seen[i] - stamps[i]) * 1e3 for i in range(n))
    assert not ts.problems, ts.problems[:3]
    return {"traces": n, "every_s": every, "poll_s": poll, "latency_ms_p50": lat[len(lat) // 2],
            "latency_ms_p95": lat[int(len(lat) * 0.95) - 1], "latency_ms_max": lat[-1],
            "refresh_ms_median": statistics.median(refresh_ms), "refresh_ms_max": max(refresh_ms), "set_rows": base}


# ---- which engine scans JSONL (--engines) ----------------------------------------------------------


def engines(path: str) -> dict:
    """One JSONL file scanned for the index's summary by each candidate engine, best of two, against
    ``json.loads`` of every line in the same process: our scan (orjson light parse with offsets and
    line numbers), ``pyarrow.json.read_json`` (whole records, no offsets, a bad line fails its
    block) and DuckDB's ``read_json`` (summary columns, no offsets; only if ``duckdb`` is importable:
    it is not a dependency)."""
    import backend.importers  # noqa: F401 - as the app has: other tools' readers registered with the catalogue
    from backend.trace.catalog import TraceSet

    def best(fn):
        out = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return min(out)

    def base():
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)

    res = {"load_before": uptime(), "json_loads_s": best(base)}
    res["traceset_s"] = best(lambda: TraceSet.open_set(path, cache=False, final=True))
    import pyarrow.json as pj

    res["pyarrow_json_s"] = best(lambda: pj.read_json(path))
    try:
        import duckdb
    except ImportError:
        res["duckdb"] = "not installed"
    else:
        con = duckdb.connect()
        q = (f"select id, termination_reason, len(prompt_ids), len(response_ids), metadata.source, "
             f"len(list_filter(steps, lambda x: x.state = 'generating')) from read_json('{path}', "
             "format='newline_delimited', ignore_errors=true, maximum_object_size=100000000)")
        res["duckdb_version"] = duckdb.__version__
        res["duckdb_s"] = best(lambda: con.execute(q).fetchall())
        con.execute("SET threads=1")
        res["duckdb_1thread_s"] = best(lambda: con.execute(q).fetchall())
    res["load_after"] = uptime()
    return res


# ---- driver ---------------------------------------------------------------------------------------


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """``(intercept, slope, R²)`` of the least-squares line."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / ss if ss else 1.0
    return a, b, r2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,250,500,1000", help="MB, comma-separated")
    ap.add_argument("--file-mb", type=float, default=50.0)
    ap.add_argument("--dir", default="/tmp/ali-bench-index")
    ap.add_argument("--keep", action="store_true", help="keep the generated data (reused by the next run)")
    ap.add_argument("--formats", default="jsonl,parquet")
    ap.add_argument("--follow-n", type=int, default=100)
    ap.add_argument("--poll", type=float, default=1.0, help="follower's refresh interval (the tab's timer: 1 s)")
    ap.add_argument("--engines", metavar="JSONL", help="only compare the scan engines on this file")
    ap.add_argument("--child", nargs=3, metavar=("SPEC", "JSONL_SPEC", "CACHE"), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    if args.engines:
        r = engines(args.engines)
        print(json.dumps(r, indent=1))
        return 0
    sizes = [float(s) for s in args.sizes.split(",")]
    root = args.dir
    steps_file = os.path.join(root, "steps.json")
    t0 = time.perf_counter()
    if os.path.exists(steps_file):
        steps = json.load(open(steps_file))
    else:
        steps = generate(root, max(sizes), args.file_mb)
        json.dump(steps, open(steps_file, "w"))
    gen_s = time.perf_counter() - t0
    results: dict = {"generate_s": round(gen_s, 1), "runs": []}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        for fmt in args.formats.split(","):
            for mb in sizes:
                spec = size_dir(root, fmt, steps, mb, args.file_mb)
                jspec = size_dir(root, "jsonl", steps, mb, args.file_mb)
                load0 = uptime()
                r = subprocess.run([sys.executable, __file__, "--child", spec, jspec, os.path.join(root, f"cache-{fmt}-{int(mb)}")],
                                   capture_output=True, text=True, env=env, timeout=1800)
                if r.returncode:
                    raise SystemExit(r.stderr[-3000:])
                m = json.loads(r.stdout.strip().splitlines()[-1])
                m.update(format=fmt, mb=mb, load_before=load0, load_after=uptime())
                results["runs"].append(m)
                print(f"{fmt:8s} {mb:6.0f} MB  rows {m['rows']:7d}  baseline {m['baseline_s']:6.2f} s  cold {m['cold_s']:6.2f} s "
                      f"({m['cold_s'] / m['baseline_s']:.2f}x; cpu {m['cold_cpu_s']:.2f} vs {m['baseline_cpu_s']:.2f} s)  warm {m['warm_s']:5.2f} s  peak cold {m['cold_peak_mb']:.0f} MB "
                      f"warm {m['warm_peak_mb']:.0f} MB  open {m['open_ms_median']:.1f}/{m['open_ms_max']:.1f} ms (cpu {m['open_cpu_ms_median']:.1f}/{m['open_cpu_ms_max']:.1f})  "
                      f"page {m['table_page_ms']:.0f} ms search {m['table_search_ms']:.0f} ms  load {load0} -> {m['load_after']}",
                      flush=True)
        for fmt in args.formats.split(","):
            runs = [r for r in results["runs"] if r["format"] == fmt]
            if len(runs) >= 2:
                xs = [r["jsonl_bytes"] / 1e6 for r in runs]  # the same traces' size as JSONL, for both formats
                growth = {}
                for key in ("cold_s", "cold_cpu_s", "baseline_cpu_s", "warm_s", "warm_cpu_s", "cold_peak_mb"):
                    a, b, r2 = fit(xs, [r[key] for r in runs])
                    growth[key] = {"intercept": round(a, 3), "per_gb": round(b * 1000, 3), "r2": round(r2, 4),
                                   "at_10gb": round(a + b * 10_000, 1)}
                results[f"growth_{fmt}"] = growth
                print(f"{fmt}: growth " + "; ".join(f"{k}: {v['intercept']} + {v['per_gb']}/GB (R² {v['r2']}), 10 GB ≈ {v['at_10gb']}"
                                                   for k, v in growth.items()), flush=True)
        big = size_dir(root, "jsonl", steps, max(sizes), args.file_mb)
        src = os.path.join(root, "jsonl", f"{steps[0]}.jsonl")
        load0 = uptime()
        f = follow(big, src, os.path.join(root, "cache-follow"), args.follow_n, 0.05, args.poll)
        f.update(load_before=load0, load_after=uptime())
        results["follow"] = f
        print(f"follow: {f['traces']} traces, one per {f['every_s']} s, poll {f['poll_s']} s over a {f['set_rows']}-row set: latency "
              f"p50 {f['latency_ms_p50']:.0f} ms, p95 {f['latency_ms_p95']:.0f} ms, max {f['latency_ms_max']:.0f} ms; refresh "
              f"{f['refresh_ms_median']:.1f} ms median ({f['refresh_ms_max']:.1f} max); load {load0} -> {f['load_after']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
