"""``groups``: the GRPO groups of a rollout file (:mod:`backend.checks.groups`): per group its step,
prompt, mean and std of the rewards and whether they are all equal (no learning signal), and
its samples ranked by reward with advantage, response tokens, end state and the first token
where each departs from the best one. Another tool's file (TRL's completion logs, verl's
dumps...) is imported first. Exit status: 0 every record was read; 1 some were bad (listed);
2 nothing could be read."""

from __future__ import annotations

import sys

from backend.cli import CLIError, bad_records_error, emit, text_table


def register(sub) -> None:
    p = sub.add_parser(
        "groups", help="GRPO groups: the samples of each prompt ranked by reward (advantage, length, end state, departure)",
        description="Group the rollouts of a file by metadata.group (else verl's uid, else the prompt messages) within "
                    "each training step, rank each group by reward and show where each sample departs from the best "
                    "one. Another tool's file is imported (--tokenizer renders records that carry no token ids).",
    )
    p.add_argument("traces", metavar="FILE", help="trace file or another tool's rollout file (.jsonl, .json, .parquet)")
    p.add_argument("--tokenizer", default="qwen3", help="tokenizer profile for imports that carry no token ids (default qwen3)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run, no_tokens=False)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def run(args) -> int:
    import os

    from backend.checks.groups import group_traces
    from backend.importers import load_any
    from backend.trace import TraceFileError

    if not os.path.isfile(args.traces):
        raise CLIError(f"trace file not found: {args.traces}")
    try:
        res = load_any(args.traces, import_foreign=True, tokenizer=args.tokenizer)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    problems = [{"line": p.line, "reason": p.reason} for p in res.problems]
    groups = group_traces(res.traces)
    text: list[str] = []
    for g in groups:
        stats = f"mean {_fmt(g.mean)}, std {_fmt(g.std)}" + (", all rewards equal: no learning signal" if g.all_equal else "")
        text += [f"group {g.key} ({'by ' + g.by}; {len(g.samples)} samples; {stats}): {g.prompt}"]
        rows = [["rank", "id", "reward", "advantage", "tokens", "end", "departs at"]]
        for s in g.samples:
            dep = "" if s.departs is None else f"{s.departs_unit} {s.departs}"
            rows.append([str(s.rank), s.id, _fmt(s.reward), _fmt(s.advantage_value), str(s.tokens), s.end_label, dep])
        text += text_table(rows) + [""]
    for p in problems:
        text.append(f"line {p['line']}: {p['reason']}")
    emit({"file": args.traces, "groups": [g.to_dict() for g in groups], "problems": problems}, args.json, "\n".join(text))
    if not res.traces:
        print(f"error: no record of {args.traces} could be read ({len(problems)} bad record(s))", file=sys.stderr)
        return 2
    if problems:
        return bad_records_error(f"{args.traces}: {len(problems)} bad record(s); {len(res.traces)} grouped")
    return 0
