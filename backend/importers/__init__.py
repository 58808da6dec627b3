"""Import traces from other tools' formats.

>>> from backend.importers import import_file, detect
>>> detect("run.json")                      # 'agents-sdk', 'verl', 'openai-chat', 'sharegpt', 'trace' or None
>>> res = import_file("run.json", "auto", tokenizer="qwen3")
>>> res.traces, res.problems                 # every bad record: its line/row/index and the reason

Formats (one module each, registered by name): ``agents-sdk``, ``verl``, ``openai-chat``,
``sharegpt``. Input files: JSONL (one record per line), JSON (one record, or a list of records;
for ``agents-sdk`` a bare list of run items is one run), or Parquet (one record per row).
Our own trace records met in ``auto`` mode are passed through unchanged.

Sources without token ids are rendered with the chosen tokenizer (default ``qwen3``); see
:mod:`backend.importers.common` for how ids, mask and steps are derived. Each imported trace has
``metadata.source`` = the format, ``metadata.ids`` = ``"rendered"`` or ``"given"``, and
``metadata.import`` = ``{"file", "line" | "row" | "index"}``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# importing the modules registers the formats
from backend.importers import agents_sdk, openai_chat, sharegpt, verl  # noqa: F401  isort: skip
from backend.importers.base import ImportContext, Importer, get_importer, importers
from backend.importers.common import Conversation, RecordError, trace_from_conversation
from backend.tokenizers import TokenizerLoadError
from backend.trace import (
    LoadProblem,
    LoadResult,
    Trace,
    TraceFileError,
    TraceFormatError,
    iter_records,
    json_type,
    record_tokens_problem,
    sniff,
    too_many_tokens,
    trace_of,
)
from backend.trace.io import JSON, PARQUET, check_layout, collect, is_trace_parquet, open_parquet

FORMATS = ("agents-sdk", "verl", "openai-chat", "sharegpt")
# auto-detection order: most specific first; plain {messages} rows go to openai-chat last
_DETECT_ORDER = ("agents-sdk", "verl", "sharegpt", "openai-chat")


def is_trace_record(record: Any) -> bool:
    """A record of our own trace format: ``format_version`` is our marker (a minimal trace has
    no other field but ``id``; a damaged one is then refused by ``Trace.from_dict`` with the
    reason, not imported as another format)."""
    return isinstance(record, dict) and "format_version" in record


def detect_record(record: Any) -> str | None:
    """The format of one record: one of :data:`FORMATS`, ``"trace"`` for our own, or None."""
    if is_trace_record(record):
        return "trace"
    # openai-chat request/response logs before verl/sharegpt (they also carry messages)
    if isinstance(record, dict) and (isinstance(record.get("request"), dict) or isinstance(record.get("response"), dict)):
        return "openai-chat"
    for name in _DETECT_ORDER:
        if get_importer(name).sniff(record):
            return name
    return None


def detect(record_or_path: Any, max_records: int = 5) -> str | None:
    """The format of a record, or of a file (its first few readable records)."""
    if isinstance(record_or_path, (str, os.PathLike)) and os.path.isfile(record_or_path):
        for i, (_, rec) in enumerate(_records(str(record_or_path), None)):
            if i >= max_records:
                break
            fmt = detect_record(rec) if not isinstance(rec, LoadProblem) else None
            if fmt is not None:
                return fmt
        return None
    return detect_record(record_or_path)


@dataclass
class ImportResult(LoadResult):
    """Traces imported, bad records (``problems``: line/row/index and reason), and how many
    records of each format were seen."""

    formats: dict[str, int] = field(default_factory=dict)
    unit: str = "line"  # what ``LoadProblem.line`` counts: line (JSONL), row (Parquet), index (JSON list)

    def summary(self) -> str:
        s = f"{len(self.traces)} trace(s) imported"
        if self.formats:
            s += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.formats.items())) + ")"
        if self.problems:
            s += f", {len(self.problems)} bad record(s)"
        return s

    def problem_lines(self) -> list[str]:
        return [f"{self.unit} {p.line}: {p.reason}" for p in self.problems]


def _records(path: str, fmt: str | None) -> Iterator[tuple[int, Any]]:
    """``(number, record or LoadProblem)`` of a file, read by :mod:`backend.trace.io`; a JSON list
    is one record when the chosen format (or, in auto mode, Agents SDK run items) says so."""
    if fmt in FORMATS:
        whole = get_importer(fmt).whole_file
    else:
        whole = agents_sdk.looks_like_items if fmt in (None, "auto") else None
    for n, _, rec in iter_records(sniff(path), whole=whole):
        yield n, rec


def _unit_for(path: str) -> str:
    return "row" if path.endswith(".parquet") else "line"


def convert_record(n: int, rec: Any, fmt: str, ctx: ImportContext, where: dict[str, Any] | None = None) -> Iterator[tuple[Trace | LoadProblem, str | None]]:
    """``(trace or problem, format)`` for what one record gives: our own trace records pass
    through; others are converted by their format's importer (``fmt`` "auto": detected per
    record). ``where`` (``{"file", "line" | "row"}``) is recorded as each imported trace's
    ``metadata.import``."""
    name = fmt if fmt != "auto" else detect_record(rec)
    if name is None:
        what = f"keys: {', '.join(sorted(rec)[:8])}" if isinstance(rec, dict) else f"{json_type(rec)}, not a JSON object"
        yield LoadProblem(n, f"unrecognised record ({what}); pass --from to choose a format"), None
        return
    why = record_tokens_problem(rec)  # ALI_MAX_TRACE_TOKENS, before the ids are copied into a trace
    if why:
        yield LoadProblem(n, why), name
        return
    try:
        if name == "trace":
            yield trace_of(n, rec), name
            return
        for item in get_importer(name).convert(rec, ctx):
            t = trace_from_conversation(item, ctx.bundle, name) if isinstance(item, Conversation) else item
            why = too_many_tokens(len(t.prompt_ids) + len(t.response_ids))  # ids rendered from the messages
            if why:
                yield LoadProblem(n, why), name
                continue
            if where is not None:
                t.metadata["import"] = dict(where)
            yield t, name
    except (RecordError, TraceFormatError) as e:
        yield LoadProblem(n, str(e)), name
    except (TraceFileError, TokenizerLoadError):
        raise  # nothing else can import either
    except Exception as e:  # a bug on one record must not stop the import
        yield LoadProblem(n, f"internal error: {type(e).__name__}: {e}"[:500]), name


def iter_import(
    path: str,
    fmt: str = "auto",
    *,
    tokenizer: str = "qwen3",
    template: str | None = None,
    ctx: ImportContext | None = None,
    options: dict[str, Any] | None = None,
) -> Iterator[tuple[int, Trace | LoadProblem, str | None]]:
    """Stream an import: ``(number, trace_or_problem, format)`` per produced trace / bad record."""
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown import format {fmt!r}; known: {', '.join(FORMATS)}, auto")
    ctx = ctx or ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), path=path)
    unit = _unit_for(path)
    base = os.path.basename(path)
    for n, rec in _records(path, fmt):
        if isinstance(rec, LoadProblem):
            yield n, rec, None
            continue
        for item, name in convert_record(n, rec, fmt, ctx, {"file": base, unit: n}):
            yield n, item, name


def import_file(
    path: str,
    fmt: str = "auto",
    *,
    tokenizer: str = "qwen3",
    template: str | None = None,
    options: dict[str, Any] | None = None,
    bundle: Any = None,
) -> ImportResult:
    """Import a whole file. ``bundle``: an already loaded tokenizer bundle to render and decode
    with (else ``tokenizer``/``template`` are loaded when a record first needs them)."""
    res = ImportResult(unit=_unit_for(path))
    ctx = ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), path=path, _bundle=bundle)
    for n, item, name in iter_import(path, fmt, ctx=ctx):
        if not res.take(n, item, res.unit):
            break
        if name is not None and not isinstance(item, LoadProblem):
            res.formats[name] = res.formats.get(name, 0) + 1
    return res


def import_records(
    records: list[Any], fmt: str = "auto", *, tokenizer: str = "qwen3", template: str | None = None, bundle: Any = None,
    options: dict[str, Any] | None = None,
) -> ImportResult:
    """Import in-memory records (e.g. ``result.to_input_list()`` wrapped as ``[{"items": ...}]``)."""
    ctx = ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), _bundle=bundle)
    res = ImportResult(unit="index")
    for i, rec in enumerate(records, start=1):
        for item, name in convert_record(i, rec, fmt, ctx):
            res.take(i, item, res.unit)
            if name is not None and not isinstance(item, LoadProblem):
                res.formats[name] = res.formats.get(name, 0) + 1
    return res


def import_agents_sdk_run(items: list[Any], tools: Any = None, *, instructions: str | None = None, bundle: Any = None, tokenizer: str = "qwen3") -> Trace:
    """One Agents SDK run (``result.to_input_list()``, and the agent's tools) → a trace."""
    from backend.importers.agents_sdk import items_to_conversation

    ctx = ImportContext(tokenizer=tokenizer, _bundle=bundle)
    conv = items_to_conversation(items, tools, instructions)
    from backend.importers.common import record_id

    conv.id = record_id([i.model_dump() if hasattr(i, "model_dump") else i for i in items])
    return trace_from_conversation(conv, ctx.bundle, "agents-sdk")


def load_any(path: str, *, import_foreign: bool = False, tokenizer: str = "qwen3", bundle: Any = None) -> LoadResult:
    """Load a trace file (the UI and the CLI call this): our ``.parquet``, or JSONL / JSON.

    A file in which nothing is a trace but whose first records look like a known foreign format
    (Agents SDK, verl, OpenAI chat logs, ShareGPT) is imported when ``import_foreign`` is set
    (an :class:`~backend.importers.ImportResult`, rendered with ``bundle`` if given, else
    ``tokenizer``); otherwise it is refused with the ``import`` command to use."""
    src = sniff(path)
    def imported(fmt: str) -> LoadResult:
        return import_file(path, fmt, tokenizer=tokenizer, bundle=bundle)

    if src.kind == PARQUET:
        pf = open_parquet(path)
        hint = ""
        if not is_trace_parquet(path):
            try:
                fmt = detect(path)
            except Exception:  # a damaged file: check_layout says what it is not
                fmt = None
            if fmt and fmt != "trace":
                if import_foreign:
                    return imported(fmt)
                hint = f"; it looks like {fmt} data: python -m backend import --from {fmt} {path} --out TRACES.jsonl"
        check_layout(pf, path, hint)
        return collect(src, LoadResult(), "row")
    fmt = detect(path)
    foreign = fmt is not None and fmt != "trace"
    # detect() looks at the first few readable records only: one damaged trace line (or one
    # foreign record) among them must not turn a file of traces into "foreign data". Records
    # that are not traces are refused one by one (no id/format_version), so load, and import or
    # refuse the file only when nothing in it is a trace.
    res = collect(src, LoadResult(), "record" if src.kind == JSON else "line")
    if foreign and not res.traces:
        if import_foreign:
            return imported(fmt)
        res = LoadResult()
        hint = f"looks like {fmt} data, not a trace; import it: python -m backend import --from {fmt} {path} --out TRACES.jsonl"
        res.problems.append(LoadProblem(1, hint))
    return res


__all__ = [
    "FORMATS",
    "ImportContext",
    "ImportResult",
    "Importer",
    "RecordError",
    "convert_record",
    "detect",
    "detect_record",
    "get_importer",
    "import_agents_sdk_run",
    "import_file",
    "import_records",
    "importers",
    "is_trace_record",
    "iter_import",
    "load_any",
]

