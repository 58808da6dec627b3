"""``audit``: would a full re-render of each rollout's messages (what many trainers still do)
give the ids the model was shown? A table by cause and by turn (:mod:`backend.checks.audit`). Exit
status as ``check``: 0 every record was a trace and was audited; 1 some records were not traces
(listed; the rest was audited); 2 nothing was audited."""

from __future__ import annotations

import sys

from backend.cli import CLIError, bad_records_error, emit, text_table


def register(sub) -> None:
    p = sub.add_parser(
        "audit", help="re-render audit: which rollouts a full re-render of their messages would break, and why",
        description="For every trace of a file or trace set: re-render its final messages with the template and compare "
                    "with the ids the loop built (what the model was shown); a rollout breaks when they differ, each "
                    "difference named by cause (turn separator, reasoning stripped, arguments re-serialised, BPE "
                    "re-tokenisation, tool-call markup, context rendered differently). Exit status: 0 every record was "
                    "audited; 1 some records were not traces (listed); 2 nothing was audited.",
    )
    p.add_argument("traces", metavar="TRACE", help="trace file (.jsonl, .json or .parquet), or a folder or glob of them (a "
                                                   "trace set, read one trace at a time)")
    p.add_argument("--tokenizer", help="tokenizer to re-render with (default: the trace's own offline profile, if any)")
    p.add_argument("--template", help="override the chat template (trl name, .jinja file, or Jinja text)")
    p.add_argument("--rollouts", action="store_true", help="also list every rollout (text output)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run, no_tokens=False)


def run(args) -> int:
    from backend.checks.audit import CAUSE_LABELS, audit
    from backend.cli.check import bundle_for_trace, load_source

    source, problems = load_source(args)
    cache: dict = {}

    def bundle_for(t):
        bundle, why, _ = bundle_for_trace(t, args, cache)
        return bundle if bundle is not None else why

    rep = audit(source, bundle_for)
    if not rep.traces and not problems:
        raise CLIError(f"{args.traces} holds no traces (empty): nothing to audit")
    summary = {"file": args.traces, **rep.to_dict(), "problems": problems}
    text = [rep.sentence() + "."]
    if rep.by_cause():
        text += ["", "by cause (rollouts):"] + text_table([[CAUSE_LABELS.get(c, c), str(n)] for c, n in rep.by_cause().items()])
    turns = rep.by_turn()
    if turns:
        causes = list(dict.fromkeys(c for v in turns.values() for c in v))
        rows = [["turn", *causes]] + [[str(k) if k else "prompt", *(str(v.get(c, "")) for c in causes)] for k, v in turns.items()]
        text += ["", "by assistant turn (places):"] + text_table(rows)
    if args.rollouts:
        text += ["", "rollouts:"]
        for t in rep.traces:
            what = t.error or (", ".join(f"{CAUSE_LABELS.get(c, c)} ×{n}" for c, n in t.causes.items()) or "identical")
            text.append(f"  {t.id}: {'BREAKS' if t.broken else 'ok'}: {what}")
    for p in problems:
        where = f"{p['file']}:{p['line']}" if "file" in p else f"line {p['line']}"
        text.append(f"{where}: not a trace: {p['reason']}")
    emit(summary, args.json, "\n".join(text))
    if not rep.traces:
        print(f"error: no record of {args.traces} is a trace ({len(problems)} bad record(s)); nothing was audited", file=sys.stderr)
        return 2
    if problems:
        return bad_records_error(f"{args.traces}: {len(problems)} record(s) are not traces (first: line {problems[0]['line']}: "
                                 f"{problems[0]['reason']}); {len(rep.traces)} trace(s) were audited")
    return 0
