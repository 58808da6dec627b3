"""Benchmark: the Trace files tab's charts by training step (ui/run_charts.py) on a 100k-row index.

The rows: the index rows of the sample traces (``TraceIndex.build(sample_traces/*.jsonl)``),
repeated to ``--rows`` with seeded variation (training step over ``--steps`` steps, 1 % with no
step, response tokens, turns, end state, tool and parse errors, a score on 90 %). They are put into
a :class:`backend.trace.TraceIndex` (its columns), so what is timed is the handler the tab runs,
:func:`ui.run_charts.refresh` on a session holding that index: the index frame (cached by the
index, as in the app), the groups, the six-panel figure, the default comparison and its table.
Also timed: ``on_compare`` (a step picker changed), the figures' JSON (what Gradio sends), and
``--sessions`` sessions following one trace set (a run being written: every session's table
changes once per new version of the set, and each redraws): the time for all of them per version,
against one session's refresh.

Baseline, in the same process: a plain pandas ``groupby("training_step")`` of the same frame with
the same statistics (quantiles of response tokens and turns, means of the error flags and the score,
a crosstab of the end-state codes), no figure. Usage::

    python bench/bench_run_charts.py [--rows 100000] [--steps 200] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_index(rows: int, steps: int, seed: int = 0):
    import numpy as np

    from backend.trace import TraceIndex
    from backend.trace.index import INDEX_COLUMNS

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = TraceIndex.build(sorted(glob.glob(os.path.join(root, "sample_traces", "*.jsonl")))).frame()
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(base), rows)
    df = base.iloc[pick].reset_index(drop=True)
    step = rng.integers(0, steps, rows)
    df["id"] = [f"t{i}" for i in range(rows)]
    df["training_step"] = [None if r < 0.01 else int(s) for r, s in zip(rng.random(rows), step)]
    df["response_tokens"] = (df["response_tokens"] * rng.uniform(0.5, 3 + step / steps, rows)).astype("int64")
    df["turns"] = rng.integers(1, 12, rows)
    codes = ["no_tool_calls", "response_length", "malformed_tool_call", "tool_error", "max_assistant_turns", None]
    df["termination_reason"] = rng.choice(np.array(codes, dtype=object), rows, p=[0.6, 0.15, 0.1, 0.05, 0.05, 0.05])
    df["tool_errors"] = rng.poisson(0.2, rows)
    df["parse_errors"] = (rng.random(rows) < 0.05).astype("int64")
    df["score"] = np.where(rng.random(rows) < 0.9, rng.random(rows), np.nan)
    ix = TraceIndex()
    for c in INDEX_COLUMNS:
        v = df[c].tolist()
        ix.cols[c] = [None if isinstance(x, float) and x != x and c == "score" else x for x in v]
    ix.files = TraceIndex.build(sorted(glob.glob(os.path.join(root, "sample_traces", "*.jsonl")))).files
    return ix


def baseline(df):
    import pandas as pd

    gb = df.groupby("training_step", dropna=False)
    q = gb[["response_tokens", "turns"]].quantile([0.25, 0.5, 0.75])
    flags = pd.DataFrame({"step": df["training_step"], "tool": df["tool_errors"] > 0, "parse": df["parse_errors"] > 0,
                          "score": df["score"]}).groupby("step", dropna=False).agg(["mean", "std"])
    ends = pd.crosstab(df["training_step"].fillna(-1), df["termination_reason"].fillna("none"), normalize="index")
    return q, flags, ends


def _time(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=8, help="sessions following one set")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from ui import run_charts as rc
    from ui.context import Session

    ix = make_index(a.rows, a.steps)
    sess = Session(file_traces=[f"r{i}" for i in range(len(ix))], file_index=ix, file_name="bench")
    t0 = time.perf_counter()
    df = ix.df  # the index's frame, made once per index (the app caches it the same way)
    frame_s = time.perf_counter() - t0
    base_s, _ = _time(lambda: baseline(df), a.repeat)
    groups_s, g = _time(lambda: rc.group_frame(df, [f.path for f in ix.files]), a.repeat)
    aggs_s, _ = _time(lambda: (rc.by_group(g), rc.termination_shares(g)), a.repeat)
    fig_s, fig = _time(lambda: rc.steps_figure(g), a.repeat)
    refresh_s, out = _time(lambda: rc.refresh(sess), a.repeat)
    values, _ = out
    order = g.order
    compare_s, cmp_out = _time(lambda: rc.on_compare(sess, order[0], order[len(order) // 2]), a.repeat)
    json_s, payload = _time(lambda: values[1].to_json() + values[5].to_json(), a.repeat)
    # sessions following one set: the app's SetRegistry hands every session the same set object and
    # its version (a lookup; here the index itself, a new version each time the run grows)
    class Registry:
        version = 0

        def get(self, spec):
            return ix, self.version

    reg = Registry()
    watchers = [Session(set_spec="run", set_registry=reg) for _ in range(a.sessions)]

    def new_version():
        reg.version += 1
        for w in watchers:
            rc.refresh(w)

    follow_s, _ = _time(new_version, a.repeat)
    res = {
        "rows": len(ix), "groups": len(order), "index_frame_s": frame_s, "baseline_groupby_s": base_s,
        "groups_s": groups_s, "aggregates_s": aggs_s, "steps_figure_s": fig_s, "refresh_s": refresh_s,
        "refresh_over_baseline": refresh_s / base_s, "on_compare_s": compare_s, "figures_json_s": json_s,
        "figures_json_bytes": len(payload),
        "sessions_following": a.sessions, "follow_all_sessions_per_version_s": follow_s,
        "follow_over_one_refresh": follow_s / refresh_s, "load": os.getloadavg(),
    }
    if a.json:
        print(json.dumps(res))
        return
    for k, v in res.items():
        print(f"{k:24s} {v:.4f}" if isinstance(v, float) else f"{k:24s} {v}")


if __name__ == "__main__":
    main()
