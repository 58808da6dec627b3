"""Import traces from other tools' formats.

>>> from backend.importers import import_file, detect
>>> detect("run.json")                      # a name of FORMATS, 'trace' (ours) or None
>>> res = import_file("run.json", "auto", tokenizer="qwen3")
>>> res.traces, res.problems, res.losses    # bad records and content not carried over, with their line/row/index
>>> res.notes                               # how detection chose where two formats could read a record

Formats (one module each, listed in :data:`FORMAT_TABLE` in detection order): OpenTelemetry
spans (``otel``: OTel GenAI, OpenInference and Langfuse dialects, :mod:`backend.importers.otel`),
``langsmith``, ``mlflow``, ``nemo-gym``, ``openai-responses``, ``anthropic``, ``agents-sdk``, ``verifiers``, ``prime-rl``,
``verl``, ``trl``, ``skyrl``, ``nemo-rl``, ``slime``, ``agentlightning``, ``rllm``, ``art``, ``areal``, ``tinker``, ``pydantic-ai``,
``langchain``, ``smolagents``, ``sharegpt``,
``openai-chat``. Input files: JSONL (one record per line), JSON (one record, or a list of
records; a format may read a whole list as one record), Parquet (one record per row), or a pickle
(torch ``.pt``: read in a worker process, :mod:`backend.safety.pickle_guard`, never in this one). Our own
trace records met in ``auto`` mode are passed through unchanged. Grouped formats (spans of one
trace over many records) are converted per file, after it is read.

Sources without token ids are rendered with the chosen tokenizer (default ``qwen3``); see
:mod:`backend.importers.common` for how ids, mask and steps are derived. Each imported trace has
``metadata.source`` = the format, ``metadata.ids`` = ``"rendered"`` or ``"given"``,
``metadata.import`` = ``{"file", "line" | "row" | "index", "losses"}`` and
``metadata.provenance`` = ``{"format", "library", "version", "trace_id", ...}`` (what the file says).

Importing this package registers :class:`backend.importers.index.ImporterRows` with the trace-set
catalogue (:func:`backend.trace.catalog.register_foreign_rows`): trace sets index and open other
tools' files through it (the trace layer never imports the importers).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.importers.base import ImportContext, Importer, get_importer, importers
from backend.importers.common import Conversation, RecordError, trace_from_conversation, unanswered_results
from backend.loading.tokenizers import TokenizerLoadError
from backend.safety.pickle_guard import looks_like_pickle
from backend.trace import (
    LoadProblem,
    LoadResult,
    StepState,
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
from backend.trace import io as _io
from backend.trace.io import JSON, PARQUET, Source, check_layout, collect, is_trace_parquet, open_parquet
from backend.trace.yaml_guard import YamlRefused, is_yaml_path, read_yaml

# The formats, one row each: (name, module that registers it). The order is auto-detection's:
# most specific first (a record two formats could read goes to the earlier one, and the import
# says which it chose and why); plain {messages} rows go to openai-chat last.
FORMAT_TABLE: tuple[tuple[str, str], ...] = (
    ("otel", "backend.importers.otel"),
    ("langsmith", "backend.importers.langsmith"),
    ("mlflow", "backend.importers.mlflow"),
    ("nemo-gym", "backend.importers.nemo_gym"),  # Responses objects whose output items carry token ids
    ("openai-responses", "backend.importers.openai_responses"),
    ("anthropic", "backend.importers.anthropic"),
    ("agents-sdk", "backend.importers.agents_sdk"),
    ("verifiers", "backend.importers.verifiers"),
    ("prime-rl", "backend.importers.prime_rl"),
    ("verl", "backend.importers.verl"),
    ("trl", "backend.importers.trl"),
    ("skyrl", "backend.importers.skyrl"),
    ("nemo-rl", "backend.importers.nemo_rl"),
    ("slime", "backend.importers.slime"),
    ("agentlightning", "backend.importers.agentlightning"),
    ("rllm", "backend.importers.rllm"),
    ("art", "backend.importers.art"),
    ("areal", "backend.importers.areal"),
    ("tinker", "backend.importers.tinker"),
    ("pydantic-ai", "backend.importers.pydantic_ai"),
    ("langchain", "backend.importers.langchain"),
    ("smolagents", "backend.importers.smolagents"),
    ("sharegpt", "backend.importers.sharegpt"),
    ("openai-chat", "backend.importers.openai_chat"),
)
for _name, _module in FORMAT_TABLE:
    importlib.import_module(_module)  # registers the format
FORMATS = tuple(name for name, _ in FORMAT_TABLE)
_DETECT_ORDER = FORMATS


def is_trace_record(record: Any) -> bool:
    """A record of our own trace format: ``format_version`` is our marker (a minimal trace has
    no other field but ``id``; a damaged one is then refused by ``Trace.from_dict`` with the
    reason, not imported as another format)."""
    return isinstance(record, dict) and "format_version" in record


def detect_record(record: Any) -> str | None:
    """The format of one record: one of :data:`FORMATS`, ``"trace"`` for our own, or None."""
    return detect_why(record)[0]


def detect_why(record: Any) -> tuple[str | None, str, list[str]]:
    """``(format, why, other formats that also match)`` of one record; format None if none
    matches. ``why`` is the chosen format's reason."""
    if is_trace_record(record):
        return "trace", "format_version field", []
    chosen: str | None = None
    why = ""
    others: list[str] = []
    for name in _DETECT_ORDER:
        r = get_importer(name).sniff(record)
        if not r:
            continue
        if chosen is None:
            chosen, why = name, (r if isinstance(r, str) else "")
        else:
            others.append(name)
    return chosen, why, others


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
    # content of imported traces that was not carried over (each trace's metadata.import.losses),
    # with the number of the record the trace came from
    losses: list[LoadProblem] = field(default_factory=list)
    # how auto-detection chose where several formats matched a record (one line per choice)
    notes: list[str] = field(default_factory=list)
    # tool calls of imported traces whose arguments could not be read: kept as written, with a
    # parse error on their turn (nothing lost, but said), with the record's number
    unreadable: list[LoadProblem] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every record imported and nothing left out of any trace."""
        return not self.problem_count and not self.losses

    def summary(self) -> str:
        s = f"{len(self.traces)} trace(s) imported"
        if self.formats:
            s += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.formats.items())) + ")"
        if self.problems:
            s += f", {len(self.problems)} bad record(s)"
        if self.losses:
            s += f", {len(self.losses)} thing(s) not carried over"
        if self.unreadable:
            s += f", {len(self.unreadable)} unreadable tool call(s) kept as written"
        return s

    def problem_lines(self) -> list[str]:
        return [f"{self.unit} {p.line}: {p.reason}" for p in self.problems + self.losses + self.unreadable]

    def add(self, n: int, item: Trace | LoadProblem, name: str | None) -> bool:
        """Take one produced trace or problem (see :meth:`LoadResult.take`), counting formats and
        collecting the trace's losses."""
        if not self.take(n, item, self.unit):
            return False
        if name is not None and not isinstance(item, LoadProblem):
            self.formats[name] = self.formats.get(name, 0) + 1
            for loss in trace_losses(item):
                self.losses.append(LoadProblem(n, f"trace {item.id}: {loss}"))
            for what in unreadable_calls(item):
                self.unreadable.append(LoadProblem(n, f"trace {item.id}: {what}"))
        return True


def unreadable_calls(trace: Trace) -> list[str]:
    """The tool calls of an imported trace that could not be read (arguments that are not a JSON
    object, a call the parser could not read): kept as the source wrote them, each a parse error
    on its turn; one line each, for the import to list."""
    return [f"step {s.index}: {e.message} (kept as written; a parse error on the turn)"
            for s in trace.steps if s.state == StepState.GENERATING for e in s.parse_errors if e.severity == "error"]


def trace_losses(trace: Trace) -> list[str]:
    """What an import did not carry over into ``trace`` (empty for a complete import)."""
    imp = trace.metadata.get("import") if isinstance(trace.metadata, dict) else None
    losses = imp.get("losses") if isinstance(imp, dict) else None
    return [str(x) for x in losses] if isinstance(losses, list) else []


def _records(path: str, fmt: str | None) -> Iterator[tuple[int, Any]]:
    """``(number, record or LoadProblem)`` of a file, read by :mod:`backend.trace.io`; a JSON list
    is one record when the chosen format (or, in auto mode, Agents SDK run items) says so. A
    pickle (torch ``.pt``) is read by :mod:`backend.safety.pickle_guard` (:func:`pickle_records`)."""
    if looks_like_pickle(path):
        yield from pickle_records(path)
        return
    if fmt in FORMATS:
        whole = get_importer(fmt).whole_file
    else:
        whole = _whole_in_auto if fmt in (None, "auto") else None
    if is_yaml_path(path):  # one YAML document, read bounded (backend/trace/yaml_guard.py), then as a JSON one
        try:
            src = Source(path, JSON, read_yaml(path))
        except YamlRefused as e:
            yield 1, LoadProblem(1, str(e))
            return
    else:
        src = sniff(path)
    for n, _, rec in iter_records(src, whole=whole):
        yield n, rec


def pickle_records(path: str) -> Iterator[tuple[int, Any]]:
    """``(number, record or LoadProblem)`` of a pickle, read in a pickle worker (never here): a
    slime rollout dump (``{"rollout_id", "samples": [...]}``) gives one record per sample, as
    ``{"slime_sample": sample, "rollout_id": N}``; a SkyRL batch (``dump_data_batch``) one record
    per row (:func:`backend.importers.skyrl_batch.batch_rows`); a list gives its items; anything
    else is one record. A file the worker refuses is one problem that says why."""
    from backend.safety.pickle_guard import PickleRefused, read_pickle
    from backend.trace.limits import check_file_size, max_file_text_bytes, max_file_values

    check_file_size(path, _io.DEFAULT_MAX_FILE_BYTES)
    try:
        doc = read_pickle(path, max_bytes=max_file_text_bytes() + 12 * max_file_values())
    except PickleRefused as e:
        yield 1, LoadProblem(1, f"{os.path.basename(path)} not read: {e}")
        return
    if isinstance(doc, dict) and "skyrl_batch" in doc:
        from backend.importers.skyrl_batch import batch_rows

        yield from batch_rows(doc)
    elif isinstance(doc, dict) and isinstance(doc.get("samples"), list):
        top = {k: v for k, v in doc.items() if k != "samples"}
        for i, sample in enumerate(doc["samples"]):
            yield i + 1, {"slime_sample": sample, **top}
    elif isinstance(doc, list):
        yield from enumerate(doc, start=1)
    else:
        yield 1, doc


def _whole_in_auto(doc: Any) -> bool:
    """Auto mode: a JSON document (a list) that some format reads as one record as a whole."""
    return any(get_importer(name).whole_file(doc) for name in FORMATS)


def unit_of_file(path: str) -> str:
    """What a record's number counts in ``path``: ``index`` (a pickle's or YAML list's items), ``row`` (Parquet), ``line``."""
    if looks_like_pickle(path) or is_yaml_path(path):
        return "index"
    return "row" if path.endswith(".parquet") else "line"


def _finish(n: int, item: Any, name: str, ctx: ImportContext, where: dict[str, Any] | None) -> Trace | LoadProblem:
    """A converted conversation (or trace) as the trace the import yields: rendered, checked
    against the token limit, with its place in the file, its losses and its provenance."""
    if isinstance(item, LoadProblem):
        return item
    losses: list[str] = []
    prov: dict[str, Any] = {}
    if isinstance(item, Conversation):
        losses = list(item.losses) + unanswered_results(item.messages)
        prov = dict(item.provenance)
        t = trace_from_conversation(item, ctx.bundle, name)
    else:
        t = item
        imp = t.metadata.get("import") if isinstance(t.metadata.get("import"), dict) else {}
        losses = list(imp.get("losses") or []) + unanswered_results(t.messages)
    why = too_many_tokens(len(t.prompt_ids) + len(t.response_ids))  # ids rendered from the messages
    if why:
        return LoadProblem(n, why)
    imp = dict(where) if where is not None else {}
    if losses:
        imp["losses"] = list(dict.fromkeys(losses))  # once each
    if imp:
        t.metadata["import"] = imp
    if prov or name not in (None, "trace"):
        prov.setdefault("format", get_importer(name).label or name)
        t.metadata["provenance"] = {**prov, **(t.metadata.get("provenance") or {})}
    return t


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
            yield _finish(n, item, name, ctx, where), name
    except (RecordError, TraceFormatError) as e:
        yield LoadProblem(n, str(e)), name
    except (TraceFileError, TokenizerLoadError):
        raise  # nothing else can import either
    except Exception as e:  # a bug on one record must not stop the import
        yield LoadProblem(n, f"internal error: {type(e).__name__}: {e}"[:500]), name


def convert_group(name: str, records: list[tuple[int, Any]], ctx: ImportContext, where: dict[str, Any] | None, unit: str) -> Iterator[tuple[int, Trace | LoadProblem]]:
    """``(number, trace or problem)`` for all of a file's records of a grouped format (spans
    grouped into conversations by the importer)."""
    try:
        for n, item in get_importer(name).convert_group(records, ctx):
            w = {**where, unit: n} if where is not None else None
            try:
                yield n, _finish(n, item, name, ctx, w)
            except (RecordError, TraceFormatError) as e:
                yield n, LoadProblem(n, str(e))
    except (TraceFileError, TokenizerLoadError):
        raise
    except RecordError as e:
        yield (records[0][0] if records else 1), LoadProblem(records[0][0] if records else 1, str(e))
    except Exception as e:  # a bug must not lose the rest of the file in silence
        n0 = records[0][0] if records else 1
        yield n0, LoadProblem(n0, f"internal error while grouping {name} records: {type(e).__name__}: {e}"[:500])


def iter_import(
    path: str,
    fmt: str = "auto",
    *,
    tokenizer: str = "qwen3",
    template: str | None = None,
    ctx: ImportContext | None = None,
    options: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> Iterator[tuple[int, Trace | LoadProblem, str | None]]:
    """Stream an import: ``(number, trace_or_problem, format)`` per produced trace / bad record.

    Records of a grouped format (OTel spans ...) are held until the file is read, then grouped
    into conversations. ``notes`` (a list) receives how auto-detection chose where several
    formats matched a record."""
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown import format {fmt!r}; known: {', '.join(FORMATS)}, auto")
    ctx = ctx or ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), path=path)
    unit = unit_of_file(path)
    base = os.path.basename(path)
    groups: dict[str, list[tuple[int, Any]]] = {}
    seen_choices: set[tuple[str, tuple[str, ...]]] = set()
    for n, rec in _records(path, fmt):
        if isinstance(rec, LoadProblem):
            yield n, rec, None
            continue
        name = fmt
        if fmt == "auto":
            name, why, others = detect_why(rec)
            if name is not None and others and notes is not None and (name, tuple(others)) not in seen_choices:
                seen_choices.add((name, tuple(others)))
                notes.append(f"{unit} {n}: read as {name}" + (f" ({why})" if why else "") +
                             f", though {', '.join(others)} could also read it (earlier in the detection order wins; "
                             f"--from chooses)")
        if name is not None and name != "trace" and get_importer(name).grouped:
            groups.setdefault(name, []).append((n, rec))
            continue
        for item, got in convert_record(n, rec, name if name is not None else "auto", ctx, {"file": base, unit: n}):
            yield n, item, got
    for name, recs in groups.items():
        for n, item in convert_group(name, recs, ctx, {"file": base}, unit):
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
    res = ImportResult(unit=unit_of_file(path))
    ctx = ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), path=path, _bundle=bundle)
    for n, item, name in iter_import(path, fmt, ctx=ctx, notes=res.notes):
        if not res.add(n, item, name):
            break
    return res


def import_records(
    records: list[Any], fmt: str = "auto", *, tokenizer: str = "qwen3", template: str | None = None, bundle: Any = None,
    options: dict[str, Any] | None = None,
) -> ImportResult:
    """Import in-memory records (e.g. ``result.to_input_list()`` wrapped as ``[{"items": ...}]``)."""
    ctx = ImportContext(tokenizer=tokenizer, template=template, options=dict(options or {}), _bundle=bundle)
    res = ImportResult(unit="index")
    groups: dict[str, list[tuple[int, Any]]] = {}
    for i, rec in enumerate(records, start=1):
        name = fmt if fmt != "auto" else detect_record(rec)
        if name is not None and name != "trace" and get_importer(name).grouped:
            groups.setdefault(name, []).append((i, rec))
            continue
        for item, got in convert_record(i, rec, fmt, ctx):
            res.add(i, item, got)
    for name, recs in groups.items():
        for n, item in convert_group(name, recs, ctx, None, "index"):
            res.add(n, item, name)
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
    def imported(fmt: str) -> LoadResult:
        return import_file(path, fmt, tokenizer=tokenizer, bundle=bundle)

    # never trace files: a pickle (read in a pickle worker) or a YAML log (ART's) is imported when asked
    what = "a pickle (a torch .pt file)" if looks_like_pickle(path) else "YAML" if is_yaml_path(path) else None
    if what is not None:
        if import_foreign:
            return imported("auto")
        res = LoadResult()
        res.problems.append(LoadProblem(1, f"{os.path.basename(path)} is {what}, not a trace; import "
                                           f"it: python -m backend import {path} --out TRACES.jsonl"))
        return res
    src = sniff(path)
    if src.problem is not None:  # not JSONL and no document (HTML, a document cut short): its one problem
        return collect(src, LoadResult(), "line")

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
    "FORMAT_TABLE",
    "convert_group",
    "convert_record",
    "detect",
    "detect_record",
    "detect_why",
    "get_importer",
    "import_agents_sdk_run",
    "import_file",
    "import_records",
    "importers",
    "is_trace_record",
    "iter_import",
    "load_any",
    "trace_losses",
    "unit_of_file",
    "unreadable_calls",
]


# other tools' rows in trace sets: the catalogue (backend.trace.catalog) reads them through the hook
# the importers give it, registered here so that whatever imports the importers has it
from backend.importers import index as _set_rows  # noqa: E402 - needs the names above

_set_rows.register()
