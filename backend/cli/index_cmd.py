"""``index``: the index of a trace set (a folder or glob of JSONL / Parquet files), what the Trace
files tab lists: traces per file, per training step and per end state, the bad records with their
file and line; ``--out`` writes the rows (CSV or Parquet); ``--follow`` prints each new trace as
a writer appends it. Exit status: 0 every record was a trace; 1 some were not (listed); 2 nothing
could be indexed (no such folder, no trace file, no readable record)."""

from __future__ import annotations

import os
import sys
import time

from backend.cli import CLIError, bad_records_error, emit


def register(sub) -> None:
    p = sub.add_parser(
        "index", help="index a folder or glob of trace files (a training run's rollouts): counts, steps, bad records",
        description="Index every JSONL / Parquet trace file of a folder (recursively) or glob, as the app's --traces does "
                    "(cached on disk; unchanged files are not read again, grown ones only from where they stopped). "
                    "Exit status: 0 every record was a trace; 1 some records were not (listed); 2 nothing could be indexed.",
    )
    p.add_argument("traces", metavar="DIR_OR_GLOB", help="folder (searched recursively), glob (quote it), or one file")
    p.add_argument("--out", help="write the index rows here (.csv or .parquet)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the index cache")
    p.add_argument("--follow", action="store_true", help="keep watching: print each new trace as it is written (Ctrl-C stops)")
    p.add_argument("--interval", type=float, default=1.0, help="--follow: seconds between looks (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _counts(series) -> dict[str, int]:
    return {str(k): int(v) for k, v in series.value_counts(dropna=False).sort_index().items()}


def run(args) -> int:
    import backend.importers  # noqa: F401 - registers other tools' readers with the trace-set catalogue
    from backend.trace import TraceFileError
    from backend.trace.catalog import TraceSet

    try:
        ts = TraceSet.open_set(args.traces, final=not args.follow, cache=not args.no_cache)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    if not args.no_cache:
        ts.flush()
    df = ts.df
    problems = [{"file": f, "line": ln, "reason": why} for f, ln, why in ts.problem_rows(10_000)]
    steps = df["training_step"].astype("string").fillna("none")
    summary = {
        "spec": args.traces, "traces": len(ts), "files": len(ts.files), "bytes": ts.bytes,
        "per_file": {f.path: int((df["file"] == k).sum()) for k, f in enumerate(ts.files)},
        "per_step": _counts(steps), "groups": int(df["group"].nunique()), "ranks": _counts(df["rank"].dropna()),
        "termination": _counts(df["termination_reason"].fillna("none")),
        "errors": {"traces_with_errors": int((df["errors"] > 0).sum()), "tool_errors": int(df["tool_errors"].sum()),
                   "parse_errors": int(df["parse_errors"].sum())},
        "problems": problems, "problem_count": ts.problem_count + len(ts.file_errors), "cache": dict(ts.stats),
    }
    if args.out:
        out = args.out
        if os.path.abspath(out) in {os.path.abspath(f.path or "") for f in ts.files}:
            raise CLIError("--out is one of the indexed files")
        if out.endswith(".parquet"):
            df.assign(file=[ts.files[k].path for k in df["file"]]).to_parquet(out, index=False)
        elif out.endswith(".csv"):
            df.assign(file=[ts.files[k].path for k in df["file"]]).to_csv(out, index=False)
        else:
            raise CLIError("--out must end in .csv or .parquet")
    lines = [f"{len(ts):,} trace(s) in {len(ts.files):,} file(s) ({ts.bytes:,} bytes)"]
    if df["training_step"].notna().any():
        lines.append("per training step: " + ", ".join(f"{k}: {v}" for k, v in summary["per_step"].items()))
    if summary["groups"]:
        lines.append(f"GRPO groups named by the files: {summary['groups']:,}")
    if summary["ranks"]:
        lines.append("per trainer rank: " + ", ".join(f"{k}: {v}" for k, v in summary["ranks"].items()))
    lines.append("end states: " + ", ".join(f"{k}: {v}" for k, v in summary["termination"].items()))
    e = summary["errors"]
    lines.append(f"traces with errors: {e['traces_with_errors']}, tool errors: {e['tool_errors']}, parse errors: {e['parse_errors']}")
    for p in problems:
        lines.append(f"{p['file']}:{p['line']}: not a trace: {p['reason']}")
    emit(summary, args.json, "\n".join(lines))
    if args.follow:
        return _follow(ts, args.interval)
    if not len(ts):
        if not problems:
            print(f"error: {args.traces} holds no trace file with a trace in it", file=sys.stderr)
        else:
            print(f"error: no record of {args.traces} is a trace ({summary['problem_count']} bad record(s))", file=sys.stderr)
        return 2
    if problems:
        first = problems[0]
        return bad_records_error(f"{summary['problem_count']} record(s) are not traces (first: {first['file']}:{first['line']}: "
                                 f"{first['reason']}); {len(ts)} trace(s) were indexed")
    return 0


def _follow(ts, interval: float) -> int:
    """Print each new row (step, id, end state, tokens, file:line) as it is indexed, until Ctrl-C."""
    seen, listed = len(ts), ts.problem_count
    while True:
        time.sleep(max(0.1, interval))
        if ts.refresh() < 0:
            seen = 0  # rebuilt (a file rewritten or removed): the rows are listed again
        df = ts.df
        for i in range(seen, len(df)):
            r = df.iloc[i]
            step = "-" if r["training_step"] is None or str(r["training_step"]) == "<NA>" else r["training_step"]
            where = f"{os.path.basename(ts.files[int(r['file'])].path or '?')}:{r['line']}"
            print(f"step {step}\t{r['id']}\t{r['termination_reason']}\t{r['tokens']} tokens\t{where}", flush=True)
        seen = len(df)
        if ts.problem_count > listed:
            for f, ln, why in ts.problem_rows(10_000)[listed:]:
                print(f"{f}:{ln}: not a trace: {why}", file=sys.stderr, flush=True)
            listed = ts.problem_count
