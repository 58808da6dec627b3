"""``import``: other tools' traces (OpenTelemetry spans, observability and agent-framework
exports, Anthropic / OpenAI logs, Agents SDK runs, verl / TRL / SkyRL outputs, ShareGPT / HF
datasets) → our trace JSONL. The formats are :data:`backend.importers.FORMATS`."""

from __future__ import annotations

import os
import sys

from backend.cli import CLIError, bad_records_error, emit
from backend.cli.files import add_file_command, check_paths


def _choices() -> tuple[str, ...]:
    from backend.importers import FORMATS

    return (*FORMATS, "auto")


# what the command does, and what its exit statuses 0, 1 and 2 mean
ABOUT = ("Import other tools' records as traces.",
         "every record was imported, completely",
         "some records could not be, or some content of the file is not in the traces (both listed; the rest was written)",
         "nothing was imported (a missing, unreadable or empty file, or no record could be read; --out is left as it was)")


def register(sub) -> None:
    p = add_file_command(sub, "import", "import traces from another tool's format (OTel, Anthropic, LangSmith, verl, ...: --from lists them)", *ABOUT)
    p.add_argument("input", metavar="INPUT", help="JSONL, JSON or Parquet file")
    p.add_argument("--from", dest="fmt", choices=_choices(), default="auto", help="source format (default: detect per record)")
    p.add_argument("--out", required=True, help="trace file to write (JSONL)")
    p.add_argument("--tokenizer", default="qwen3", help="tokenizer for rendering (sources without ids) or decoding (verl ids); default qwen3")
    p.add_argument("--template", help="override the chat template (trl name, .jinja file, or Jinja text)")
    p.add_argument("--tools", help="agents-sdk: JSON file of tool schemas when the run file has none")
    p.add_argument("--parser", help="tool-call parser for text formats (default: the tokenizer profile's)")
    p.add_argument("--max-problems", type=int, default=20, help="bad records to list in text output (all are in --json)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.cli import read_json_file
    from backend.importers import iter_import, trace_losses, unit_of_file, unreadable_calls
    from backend.trace import LoadProblem, TraceFileError

    check_paths([args.input], args.out, missing="input file not found", same="--out must not be the input file")
    options = {}
    if args.tools:
        options["tools"] = read_json_file(args.tools, "tools")
    if args.parser:
        options["parser"] = args.parser
    unit = unit_of_file(args.input)
    problems: list[dict] = []
    losses: list[dict] = []
    unreadable: list[dict] = []
    notes: list[str] = []
    formats: dict[str, int] = {}
    ids_how: dict[str, int] = {}
    n = 0
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for num, item, name in iter_import(args.input, args.fmt, tokenizer=args.tokenizer, template=args.template, options=options, notes=notes):
                if isinstance(item, LoadProblem):
                    problems.append({unit: num, "reason": item.reason})
                    continue
                losses.extend({unit: num, "trace": item.id, "what": what} for what in trace_losses(item))
                unreadable.extend({unit: num, "trace": item.id, "what": what} for what in unreadable_calls(item))
                f.write(item.to_json())
                f.write("\n")
                n += 1
                formats[name or "?"] = formats.get(name or "?", 0) + 1
                how = str(item.metadata.get("ids", "given"))
                ids_how[how] = ids_how.get(how, 0) + 1
        if n == 0 and not problems:
            raise CLIError(f"{args.input} holds no records (the file is empty): nothing to import")
        if n:
            os.replace(tmp, args.out)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    summary = {"out": args.out if n else None, "traces": n, "formats": formats, "ids": ids_how, "problems": problems,
               "not_carried_over": losses, "unreadable_calls": unreadable, "detection": notes}
    lines = [(f"wrote {n} trace(s) to {args.out}" if n else f"wrote nothing to {args.out}") + (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(formats.items())) + ")" if formats else "")]
    if ids_how:
        lines.append("token ids: " + ", ".join(f"{k}: {v}" for k, v in sorted(ids_how.items())))
    lines.extend(f"note: {x}" for x in notes)
    for rows, head in ((losses, "thing(s) not carried over into the traces (the traces were written without them)"),
                       (unreadable, "tool call(s) could not be read (kept as written, a parse error on their turn)")):
        if rows:
            lines.append(f"{len(rows)} {head}:")
            lines.extend(f"  {unit} {x[unit]}, trace {x['trace']}: {x['what']}" for x in rows[: args.max_problems])
            if len(rows) > args.max_problems:
                lines.append(f"  ... and {len(rows) - args.max_problems} more (--json lists all)")
    if problems:
        lines.append(f"{len(problems)} bad record(s):")
        for p in problems[: args.max_problems]:
            lines.append(f"  {unit} {p[unit]}: {p['reason']}")
        if len(problems) > args.max_problems:
            lines.append(f"  ... and {len(problems) - args.max_problems} more (--json lists all)")
    emit(summary, args.json, "\n".join(lines))
    if problems:
        first = f"{unit} {problems[0][unit]}: {problems[0]['reason']}"
        if not n:
            print(f"error: none of the {len(problems)} record(s) in {args.input} could be imported (first: {first}); "
                  f"nothing was written", file=sys.stderr)
            return 2
        return bad_records_error(f"{len(problems)} of {n + len(problems)} record(s) in {args.input} could not be imported "
                                 f"(first: {first}); the other {n} were written to {args.out}")
    if losses:
        x = losses[0]
        return bad_records_error(f"{len(losses)} thing(s) in {args.input} are not in the written traces "
                                 f"(first: {unit} {x[unit]}, trace {x['trace']}: {x['what']})")
    return 0
