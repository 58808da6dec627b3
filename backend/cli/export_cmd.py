"""``export``: trace files → JSONL, Parquet, HF messages+tools (training), verl rows, OTel GenAI (OTLP JSON)."""

from __future__ import annotations

from backend.cli import CLIError, bad_records_error, emit
from backend.cli.files import add_file_command, check_paths

# what the command does, and what its exit statuses 0, 1 and 2 mean
ABOUT = ("Export the traces of one or more files, in order, to one output.",
         "every record was a trace", "some records were not (listed; the traces were written)",
         "nothing was written (a missing or unreadable file, empty input, or no trace could be read)")


def register(sub) -> None:
    p = add_file_command(sub, "export", "export traces to jsonl, parquet, hf (messages+tools), verl (ids+mask) rows or otel (OTLP JSON spans)", *ABOUT)
    p.add_argument("traces", metavar="TRACES", nargs="+", help="trace file(s) (.jsonl, .json or .parquet), exported in order")
    p.add_argument("--to", "--format", dest="fmt", required=True, choices=("jsonl", "parquet", "hf", "verl", "otel"))
    p.add_argument("--out", required=True, help="output file (hf/verl: .parquet for Parquet, else JSONL; otel: OTLP JSON lines)")
    p.add_argument("--synthetic-start", metavar="TIME", type=synthetic_start,
                   help="otel: where the times of traces that recorded none (or made-up ones, as the samples) begin: "
                        "Unix seconds or an ISO 8601 time such as 2026-01-01T00:00:00Z (default: an hour before now; the same value "
                        "gives the same bytes)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def synthetic_start(text: str) -> float:
    """``--synthetic-start``: Unix seconds, or an ISO 8601 time (UTC when it names no zone)."""
    import argparse
    import math
    from datetime import datetime, timezone

    try:
        v = float(text)
    except ValueError:
        try:
            d = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a time: {text!r} (Unix seconds, or ISO 8601 such as 2026-01-01T00:00:00Z)") from None
        v = (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (a finite number of seconds since 1970, not negative)")
    return v


def run(args) -> int:
    from backend.exporters.export import export_traces
    from backend.importers import load_any
    from backend.trace import TraceFileError

    if args.synthetic_start is not None and args.fmt != "otel":
        raise CLIError(f"--synthetic-start is for --to otel, not {args.fmt}")
    check_paths(args.traces, args.out, missing="trace file not found", same="--out must not be an input file")
    traces = []
    problems: list[dict] = []
    for path in args.traces:
        try:
            res = load_any(path)
        except TraceFileError as e:
            raise CLIError(str(e)) from None
        traces += res.traces
        problems += [{"file": path, "line": p.line, "reason": p.reason} for p in res.problems]
        if not res.traces and not res.problems and len(args.traces) > 1:
            problems.append({"file": path, "line": None, "reason": "the file is empty"})

    def where(p: dict) -> str:
        at = f"line {p['line']}: " if p["line"] is not None else ""
        return (f"{p['file']}: " if len(args.traces) > 1 else "") + at + p["reason"]

    names = ", ".join(args.traces)
    if not traces:
        if not problems:
            raise CLIError(f"{names} holds no traces (empty): nothing to export")
        raise CLIError(f"no trace could be read from {names}: {where(problems[0])}"
                       + (f" (and {len(problems) - 1} more bad record(s))" if len(problems) > 1 else ""))
    n = export_traces(traces, args.fmt, args.out, synthetic_start=args.synthetic_start)
    summary = {"out": args.out, "format": args.fmt, "inputs": list(args.traces), "traces": n, "skipped": problems}
    text = f"wrote {n} trace(s) to {args.out} as {args.fmt}"
    if problems:
        text += f"; skipped {len(problems)} bad record(s) (first: {where(problems[0])})"
    emit(summary, args.json, text)
    if problems:
        return bad_records_error(f"skipped {len(problems)} bad record(s) (first: {where(problems[0])}); the {n} "
                                 f"trace(s) read were written to {args.out}")
    return 0
