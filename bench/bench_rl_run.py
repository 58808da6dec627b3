"""Benchmark: a prime-rl run folder (trainer token exports and verifiers rollouts) indexed as a
trace set and followed while it is written (issue 30, item 6).

Data: the rows verifiers 0.4.0 and prime-rl's ``token_export.py`` layout wrote for the fixture run
``tests/data/import/verifiers/run/`` (``token_exports/step_N/rank_R.jsonl``: ids, loss mask and a
dozen per-token float columns; ``rollouts/step_N/train/all/traces.jsonl``: verifiers episodes),
repeated into a temporary run folder of ``--mb`` MB (one step at least): each step gets ``--ranks`` rank
files of ``--seqs`` sequences and one rollouts file with as many episodes as sequences, each row
perturbed (step, rank, sequence index, episode / trace / group ids, advantages, rewards). In a
child process of its own:

* baseline: ``json.loads`` of every line of every file (nothing else);
* cold: :meth:`backend.trace.catalog.TraceSet.open_set` with an empty cache folder (each line
  parsed once and summarised without a tokenizer, the rows built, the cache written);
* warm: the same with the cache filled;
* open: ``TraceSet.open`` of 10 random rows (converted in full with the qwen3 tokenizer);
* follow: a follower (``final=False``) over the run while a new step is written: its files
  appear with the last line half written (not indexed), then the line completes; the rows added
  and the time of each refresh;
* peak RSS of the process during each phase (sampled every 5 ms).

Targets (issue 30 item 6, the trace-set bounds of issue 22): cold ≤ 1.5× baseline, warm ≤ 0.35×
cold, peak ≤ 600 MB. Usage::

    python bench/bench_rl_run.py [--mb 1000] [--ranks 4] [--seqs 64] [--dir /tmp/ali-bench-rl] [--keep] [--json]
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import Peak, child_measure, index_cold_warm, json_baseline, print_set_figures, set_parser  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "data", "import", "verifiers", "run")


def _lines(pattern: str) -> list[dict]:
    out = []
    for p in sorted(glob.glob(os.path.join(FIXTURE, pattern))):
        with open(p, encoding="utf-8") as f:
            out += [json.loads(x) for x in f if x.strip()]
    return out


def _dump(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def _export(rec: dict, step: int, rank: int, k: int, rng: random.Random) -> str:
    r = dict(rec, step=step, rank=rank, export_sequence_idx=k, micro_sequence_idx=k % 8, micro_step=k // 8)
    f = rng.uniform(-2.0, 2.0)
    r["advantages"] = [None if a is None else round(a * f, 6) for a in rec["advantages"]]
    return _dump(r)


def _episode(ep: dict, step: int, k: int, rng: random.Random) -> str:
    e = json.loads(json.dumps(ep))
    e["id"] = f"{step:06d}{k:06d}{rng.getrandbits(80):020x}"
    e["group"] = {"id": f"g-{step}-{k // 8}"}
    e["run"]["work"]["step"] = step
    for t in e["traces"]:
        t["id"] = f"t{step:06d}{k:06d}{rng.getrandbits(76):019x}"
        for r in (t.get("rewards") or {}).values():
            if isinstance(r, dict) and isinstance(r.get("score"), int | float):
                r["score"] = round(rng.random(), 4)
    return _dump(e)


def write_step(run: str, step: int, ranks: int, seqs: int, exports: list[dict], episodes: list[dict], rng: random.Random,
               hold_last: bool = False) -> tuple[int, list[tuple[str, str]]]:
    """Write step ``step``'s rank files and rollouts file; returns (bytes, rows) and, with
    ``hold_last``, each file's last line left out (to be written later)."""
    size, held = 0, []
    files = [(os.path.join(run, "token_exports", f"step_{step}", f"rank_{r}.jsonl"),
              [_export(exports[(r * seqs + k) % len(exports)], step, r, k, rng) for k in range(seqs)]) for r in range(ranks)]
    files.append((os.path.join(run, "rollouts", f"step_{step}", "train", "all", "traces.jsonl"),
                  [_episode(episodes[k % len(episodes)], step, k, rng) for k in range(ranks * seqs)]))
    for path, lines in files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if hold_last:
            held.append((path, lines.pop()))
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(lines)
        size += os.path.getsize(path)
    return size, held


def generate(run: str, mb: float, ranks: int, seqs: int) -> int:
    """Write the run folder up to ``mb`` MB; returns the number of steps."""
    exports, episodes = _lines("token_exports/step_*/rank_*.jsonl"), _lines("rollouts/step_*/*/*/traces.jsonl")
    rng = random.Random(0)
    size, step = 0, 0
    while size < mb * 1e6:
        step += 1
        size += write_step(run, step, ranks, seqs, exports, episodes, rng)[0]
    return step


def measure(run: str, cache: str, ranks: int, seqs: int) -> dict:
    import pandas  # noqa: F401 - imported before timing, as the app has
    import pyarrow.parquet  # noqa: F401

    import backend.importers  # noqa: F401 - as the app has: the readers of other tools' rows registered with the catalogue

    files = sorted(glob.glob(os.path.join(run, "**", "*.jsonl"), recursive=True))
    out: dict = {"rss_start_mb": round(Peak().rss(), 1), "bytes": sum(os.path.getsize(p) for p in files), "files": len(files),
                 **json_baseline(files)}
    phases, ts = index_cold_warm(run, cache, final=True)
    out.update(phases)
    df = ts.df
    out["sources"] = {str(k): int(v) for k, v in df["source"].value_counts().items()}
    assert ts.stats["hit"] == len(files), ts.stats
    rng = random.Random(0)
    rows = [0, len(df) - 1] + [rng.randrange(len(df)) for _ in range(8)]
    ts.open(rows[0])  # the tokenizer loads once (not what a row costs)
    times = []
    for i in rows:
        t0 = time.perf_counter()
        t = ts.open(i)
        times.append((time.perf_counter() - t0) * 1e3)
        assert t.id == df["id"].iat[i] and t.metadata.get("training_step") == df["training_step"].iat[i], (t.id, df["id"].iat[i])
    out["open_ms_median"], out["open_ms_max"] = statistics.median(times), max(times)
    del ts, df
    out.update(follow(run, ranks, seqs))
    out["cold_ratio"] = out["cold_s"] / out["baseline_s"]
    out["cold_cpu_ratio"] = out["cold_cpu_s"] / out["baseline_cpu_s"]
    out["warm_ratio"] = out["warm_s"] / out["cold_s"]
    return out


def follow(run: str, ranks: int, seqs: int) -> dict:
    """A follower over the run while the next step is written: the step's files appear with their
    last line not yet written, then each last line is appended in two halves."""
    from backend.trace.catalog import TraceSet

    exports, episodes = _lines("token_exports/step_*/rank_*.jsonl"), _lines("rollouts/step_*/*/*/traces.jsonl")
    step = 1 + max(int(os.path.basename(p)[5:]) for p in glob.glob(os.path.join(run, "token_exports", "step_*")))
    ts = TraceSet.open_set(run)
    before = len(ts)
    _, held = write_step(run, step, ranks, seqs, exports, episodes, random.Random(step), hold_last=True)
    t0 = time.perf_counter()
    first = ts.refresh()
    t_first = time.perf_counter() - t0
    for path, line in held:  # half of each last line: a line still being written is not a row yet
        with open(path, "a", encoding="utf-8") as f:
            f.write(line[: len(line) // 2])
    half = ts.refresh()
    for path, line in held:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line[len(line) // 2 :])
    t0 = time.perf_counter()
    rest = ts.refresh()
    t_rest = time.perf_counter() - t0
    new = ts.df[ts.df["training_step"] == step]
    want = 2 * ranks * seqs  # one export row and one episode row a sequence
    assert first == want - ranks - 1 and half == 0 and rest == ranks + 1 and len(new) == want, (first, half, rest, len(new), want)
    assert len(ts) == before + want and not ts.problem_rows(), ts.problem_rows()[:3]
    for kind in ("token_exports", "rollouts"):  # the run as it was (kept for the next run with --keep)
        shutil.rmtree(os.path.join(run, kind, f"step_{step}"))
    return {"follow_rows": want, "follow_new_files_ms": t_first * 1e3, "follow_completed_lines_ms": t_rest * 1e3}


def main() -> int:
    ap = set_parser(__doc__, "/tmp/ali-bench-rl", ("RUN", "CACHE"))
    ap.add_argument("--ranks", type=int, default=4, help="rank files a step")
    ap.add_argument("--seqs", type=int, default=64, help="sequences a rank file (and episodes a step: ranks × seqs)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.ranks, args.seqs)))
        return 0
    run = os.path.join(args.dir, f"run-{int(args.mb)}mb-{args.ranks}x{args.seqs}")
    if not os.path.isdir(run):
        t0 = time.perf_counter()
        steps = generate(run + ".tmp", args.mb, args.ranks, args.seqs)
        os.replace(run + ".tmp", run)
        print(f"generated {run}: {steps} steps in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    res = child_measure(__file__, [run, os.path.join(args.dir, "cache"), "--ranks", str(args.ranks), "--seqs", str(args.seqs)], args.dir, args.keep)
    if res is None:
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = res["bytes"] / 1e6
        print(f"{mb:.0f} MB in {res['files']} files, {res['lines']:,} lines, {res['rows']:,} rows {res['sources']}, "
              f"{res['problems']} problems (load {res['load_before']} → {res['load_after']})")
        print_set_figures(res)
        print(f"follow a new step ({res['follow_rows']} rows): its files {res['follow_new_files_ms']:.0f} ms, "
              f"their last lines completed {res['follow_completed_lines_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
