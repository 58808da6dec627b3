"""``export``: trace files → JSONL, Parquet, HF messages+tools (training), verl rows."""

from __future__ import annotations

import os

from backend.cli import CLIError, emit


def register(sub) -> None:
    p = sub.add_parser("export", help="export traces to jsonl, parquet, hf (messages+tools) or verl (ids+mask) rows")
    p.add_argument("traces", metavar="TRACES", help="trace file (.jsonl, .json or .parquet)")
    p.add_argument("--to", dest="fmt", required=True, choices=("jsonl", "parquet", "hf", "verl"))
    p.add_argument("--out", required=True, help="output file (hf/verl: .parquet for Parquet, else JSONL)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.export import export_traces, load_any
    from backend.trace import TraceFileError

    if not os.path.exists(args.traces):
        raise CLIError(f"trace file not found: {args.traces}")
    if os.path.abspath(args.traces) == os.path.abspath(args.out):
        raise CLIError("--out must not be the input file")
    try:
        res = load_any(args.traces)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    if not res.traces and res.problems:
        raise CLIError(f"no trace could be read from {args.traces}: line {res.problems[0].line}: {res.problems[0].reason}")
    n = export_traces(res.traces, args.fmt, args.out)
    summary = {"out": args.out, "format": args.fmt, "traces": n, "skipped": [{"line": p.line, "reason": p.reason} for p in res.problems]}
    text = f"wrote {n} trace(s) to {args.out} as {args.fmt}"
    if res.problems:
        text += f"; skipped {len(res.problems)} bad record(s) (first: line {res.problems[0].line}: {res.problems[0].reason})"
    emit(summary, args.json, text)
    return 0
