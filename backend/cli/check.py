"""``check``: diagnostics for every trace in a file. The findings do not change the exit status:
0 every record was a trace and was checked; 1 some records were not traces, or an ``--id`` was
not found (listed; the rest was checked); 2 nothing was checked (a missing, unreadable or empty
file, no readable trace, or none of the ``--id``\ s)."""

from __future__ import annotations

import dataclasses
import os
import sys

from backend.cli import CLIError, bad_records_error, emit

_ICON = {"error": "E", "warning": "W", "info": "I"}


def register(sub) -> None:
    p = sub.add_parser(
        "check", help="diagnose traces: orphan tool messages, bad calls, retokenization drift, mask mismatch, ...",
        description="Diagnose every trace of a file. Findings do not change the exit status: 0 every record was a "
                    "trace and was checked; 1 some records were not traces, or an --id was not found (listed; the "
                    "rest was checked); 2 nothing was checked (a missing, unreadable or empty file, no readable "
                    "trace, or none of the --id values).",
    )
    p.add_argument("traces", metavar="TRACE", help="trace file (.jsonl, .json or .parquet), or a folder or glob of them (a "
                                                   "trace set: read through its index, one trace at a time)")
    p.add_argument("--tokenizer", help="tokenizer for the token-level checks (default: the trace's own offline profile, if any)")
    p.add_argument("--template", help="override the chat template (trl name, .jinja file, or Jinja text)")
    p.add_argument("--no-tokens", action="store_true", help="structural checks only (no re-rendering)")
    p.add_argument("--id", action="append", default=[], help="only these trace ids (repeatable)")
    p.add_argument("--logprob-token-threshold", type=float, default=None, metavar="NATS",
                   help="logprob_mismatch when a mask-1 token's |trainer - rollout| logprob passes this (default ln 2)")
    p.add_argument("--logprob-step-threshold", type=float, default=None, metavar="NATS",
                   help="logprob_mismatch when a step's mean |trainer - rollout| passes this (default 0.1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def bundle_for_trace(trace, args, cache: dict):
    """``(bundle, skipped, template_note)`` for the token-level checks of ``trace``: the tokenizer
    (``--tokenizer``, else the trace's own offline profile) with ``--template``, else with the
    template the trace was made with when it can be found (:func:`backend.loading.tokenizers.with_trace_template`:
    the rule the MCP ``check`` tool follows too); ``template_note`` says why the trace's own
    template was not used. ``bundle`` None: skipped, ``skipped`` says why."""
    from backend.families import PROFILES
    from backend.loading.tokenizers import load_tokenizer, with_trace_template

    if args.no_tokens:
        return None, None, ""
    name = args.tokenizer
    template = args.template
    if name is None:
        name = trace.tokenizer.name
        if name not in PROFILES:
            return None, f"token-level checks skipped: the trace's tokenizer {name!r} is not an offline profile; pass --tokenizer", ""
    key = (name, template)
    if key not in cache:
        try:
            cache[key] = (load_tokenizer(name, template=template), None)
        except (ValueError, OSError) as e:
            if args.tokenizer:
                raise CLIError(str(e).splitlines()[0]) from None
            cache[key] = (None, f"token-level checks skipped: {str(e).splitlines()[0]}")
    bundle, skipped = cache[key]
    if bundle is None or template is not None:
        return bundle, skipped, ""
    own = (name, "trace", trace.tokenizer.template_sha256, trace.tokenizer.template,
           trace.metadata.get("chat_template") if isinstance(trace.metadata, dict) else None)
    if own not in cache:
        cache[own] = with_trace_template(bundle, trace, allow_files=True)
    found, note = cache[own]
    return found, None, note


def load_source(args):
    """``(traces, problems)`` of ``args.traces``: a file read whole, or a folder or glob read as a
    trace set, one trace at a time (:func:`set_traces`); CLIError when it cannot be read."""
    import glob

    from backend.importers import load_any
    from backend.trace import TraceFileError

    if os.path.isdir(args.traces) or (glob.has_magic(args.traces) and not os.path.exists(args.traces)):
        return set_traces(args.traces, args.tokenizer)
    if not os.path.exists(args.traces):
        raise CLIError(f"trace file not found: {args.traces}")
    try:
        res = load_any(args.traces)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    return res.traces, [{"line": p.line, "reason": p.reason} for p in res.problems]


def run(args) -> int:
    from backend.checks.diagnostics import Finding, FindingCode, Location, LogprobThresholds, check, summarize

    source, problems = load_source(args)
    th = LogprobThresholds()
    for name, key in (("token", "logprob_token_threshold"), ("step_mean", "logprob_step_threshold")):
        v = getattr(args, key, None)
        if v is not None:
            if not v > 0:
                raise CLIError(f"--{key.replace('_', '-')} must be above 0")
            th = dataclasses.replace(th, **{name: v})
    cache: dict = {}
    out = []
    totals = {"error": 0, "warning": 0, "info": 0}
    text: list[str] = []
    wanted = set(args.id)
    ids: set[str] = set()
    for t in source:
        ids.add(t.id)
        if wanted and t.id not in wanted:
            continue
        bundle, why, note = bundle_for_trace(t, args, cache)
        fs = check(t, bundle, logprob_thresholds=th, template_note=note)
        if why:
            fs.append(Finding(FindingCode.CHECK_SKIPPED, "info", why, Location(), {"check": "tokenizer"}))
        counts = summarize(fs)
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        out.append({"id": t.id, "counts": counts, "findings": [f.to_dict() for f in fs]})
        text.append(f"{t.id}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
        for f in fs:
            loc = ", ".join(f"{k} {v}" for k, v in f.location.to_dict().items() if v is not None)
            text.append(f"  [{_ICON.get(f.severity, '?')}] {f.code}{' (' + loc + ')' if loc else ''}: {f.message}")
    if not ids and not problems:
        raise CLIError(f"{args.traces} holds no traces (empty): nothing to check")
    missing = [i for i in dict.fromkeys(args.id) if i not in ids]
    if wanted and not out and ids:
        raise CLIError(f"no trace in {args.traces} has the id {', '.join(map(repr, missing))}"
                       + (f" ({len(problems)} record(s) of it are not traces)" if problems else ""))
    for p in problems:
        where = f"{p['file']}:{p['line']}" if "file" in p else f"line {p['line']}"
        text.append(f"{where}: not a trace: {p['reason']}")
    summary = {"file": args.traces, "traces": out, "totals": totals, "problems": problems, "missing_ids": missing}
    emit(summary, args.json, "\n".join(text))
    if not ids:
        print(f"error: no record of {args.traces} is a trace ({len(problems)} bad record(s), first: line "
              f"{problems[0]['line']}: {problems[0]['reason']}); nothing was checked", file=sys.stderr)
        return 2
    if problems or missing:
        why = []
        if problems:
            why.append(f"{len(problems)} record(s) are not traces (first: line {problems[0]['line']}: {problems[0]['reason']})")
        if missing:
            why.append(f"no trace has the id {', '.join(map(repr, missing))}")
        return bad_records_error(f"{args.traces}: " + "; ".join(why) + f"; {len(out)} trace(s) were checked")
    return 0


def set_traces(spec: str, tokenizer: str | None = None):
    """The traces of a trace set, read one at a time through its index (a set need not fit in
    memory), and its bad records (``file``, ``line``, ``reason``; a record found bad when read is
    added as it is met)."""
    import backend.importers  # noqa: F401 - registers other tools' readers with the trace-set catalogue
    from backend.trace import LoadProblem, TraceFileError
    from backend.trace.catalog import TraceSet

    try:
        ts = TraceSet.open_set(spec, final=True, tokenizer=tokenizer or "qwen3")  # verl dump rows open with it
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    problems = [{"file": f, "line": ln, "reason": why} for f, ln, why in ts.problem_rows(10_000)]

    def traces():
        for i in range(len(ts)):
            item = ts.read(i)
            if isinstance(item, LoadProblem):
                problems.append({"file": ts.location(i)[0], "line": item.line, "reason": item.reason})
                continue
            yield item

    return traces(), problems
