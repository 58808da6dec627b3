"""Reading and writing trace files.

One path for every reader: :func:`sniff` says what a file is (JSONL, one JSON document, or
Parquet), :func:`read_lines` reads JSONL with bounded memory, :func:`iter_records` yields each
record (or the problem that replaced it) with where it is, and :func:`trace_of` /
:func:`trace_of_row` turn our records into a :class:`Trace` or a :class:`LoadProblem`. On that:

* :func:`load_traces` (our JSON / JSONL), :func:`read_parquet_traces` (our Parquet);
  :func:`backend.importers.load_any` builds on them for any trace file (importing another
  tool's when asked), so this module never imports the importers;
* :class:`TraceIndex`: one row per trace with its summary and location, each trace opened on
  demand by reading only its bytes (the Trace files tab lists it);
  :class:`backend.trace.catalog.TraceSet` builds one over a folder or glob (cached on disk,
  followed while written);
* the writers: :func:`write_jsonl`, :func:`append_jsonl`, :func:`write_parquet`, :func:`write_lines`.

The limits (file, line, traces per file, listed problems, tokens, Parquet values and text) are
in :mod:`backend.trace.limits` (re-exported by :mod:`backend.trace`), apart so that
:mod:`backend.parquet_limits` can use them without an import cycle.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import gc
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.trace.limits import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    LoadProblem,
    LoadResult,
    ProblemList,
    TraceFileError,
    check_file_size,
    line_too_long,
    max_traces_per_file,
    not_read,
    record_tokens_problem,
    too_many_tokens,
)
from backend.trace.model import Refused, StepState, Trace, TraceFormatError, parse_json_record

# DEFAULT_MAX_FILE_BYTES / DEFAULT_MAX_LINE_BYTES are read from this module at each call (tests
# and embedders set them here).

JSONL, JSON, PARQUET = "jsonl", "json", "parquet"

# ---- lines ---------------------------------------------------------------------------------


def read_lines(
    stream: io.BufferedIOBase | Iterable[bytes], max_line_bytes: int | None = None
) -> Iterator[tuple[int, int, int, bytes | LoadProblem]]:
    """``(line number, byte offset, byte length, the line's bytes or a LoadProblem)`` for each
    non-blank line; the bytes lose a leading byte-order mark (an editor's, or files concatenated
    from such). Memory stays bounded by ``max_line_bytes`` (default :data:`DEFAULT_MAX_LINE_BYTES`,
    read at call time): an over-long line is drained, not kept, and reported."""
    if max_line_bytes is None:
        max_line_bytes = DEFAULT_MAX_LINE_BYTES
    lineno = 0
    offset = 0
    reader = stream.readline if hasattr(stream, "readline") else None
    it = iter(stream) if reader is None else None
    while True:
        raw = reader(max_line_bytes + 1) if reader is not None else next(it, b"")  # type: ignore[arg-type]
        if not raw:
            return
        lineno += 1
        start, n = offset, len(raw)
        if n > max_line_bytes and not raw.endswith(b"\n"):
            while reader is not None:  # drain the rest of this line without keeping it
                chunk = reader(1 << 20)
                n += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            offset += n
            yield lineno, start, n, LoadProblem(lineno, line_too_long(n, max_line_bytes))
            continue
        offset += n
        if raw.startswith(codecs.BOM_UTF8):
            raw = raw[3:]
        if raw.isspace() or not raw:
            continue
        yield lineno, start, n, raw


def iter_jsonl_records(
    stream: io.BufferedIOBase | Iterable[bytes], max_line_bytes: int | None = None
) -> Iterator[tuple[int, Any | LoadProblem]]:
    """``(line number, parsed JSON or LoadProblem)`` for each non-blank line (:func:`read_lines`)."""
    for lineno, _, _, raw in read_lines(stream, max_line_bytes):
        yield lineno, parse_line(lineno, raw)


def parse_line(lineno: int, raw: bytes | LoadProblem) -> Any:
    """A line's JSON, or the LoadProblem saying why it is not JSON."""
    if isinstance(raw, LoadProblem):
        return raw
    rec = parse_json_record(raw)
    return LoadProblem(lineno, rec.reason) if isinstance(rec, Refused) else rec


# ---- what a file is ------------------------------------------------------------------------------


@dataclass
class Source:
    """A sniffed file: ``kind`` is :data:`JSONL`, :data:`JSON` (``doc`` holds the parsed document)
    or :data:`PARQUET`."""

    path: str
    kind: str
    doc: Any = None

    @property
    def unit(self) -> str:
        """What a record's number counts: ``row`` (Parquet) or ``line``."""
        return "row" if self.kind == PARQUET else "line"


def sniff(path: str, *, text_only: bool = False, max_bytes: int | None = None, max_line_bytes: int | None = None) -> Source:
    """What ``path`` holds. Refused (:class:`TraceFileError`): a missing file, a folder, a file over
    the size limit, binary bytes in a text file. ``.parquet`` is Parquet (unless ``text_only``); a
    ``.json`` file, or one starting with ``[`` that is no longer than the line limit (so memory
    stays bounded by that limit), is one JSON document when it parses as one; anything else is JSONL."""
    if not os.path.exists(path):
        raise TraceFileError(f"file not found: {path}")
    if os.path.isdir(path):
        raise TraceFileError(f"{path} is a folder, not a trace file")
    size = check_file_size(path, DEFAULT_MAX_FILE_BYTES if max_bytes is None else max_bytes)
    if path.endswith(".parquet") and not text_only:
        return Source(path, PARQUET)
    limit = DEFAULT_MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    with open(path, "rb") as f:
        head = f.read(4096)
        if b"\x00" in head:
            raise TraceFileError(f"{os.path.basename(path)} looks like a binary file, not JSON/JSONL text")
        if (head.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[") and size <= limit) or path.endswith(".json"):
            f.seek(0)
            doc = parse_json_record(f.read())
            # "null" or a document that does not parse: read line by line (each line then says why)
            if doc is not None and not isinstance(doc, Refused):
                return Source(path, JSON, doc)
    return Source(path, JSONL)


def open_parquet(path: str) -> Any:
    """The ``pyarrow.parquet.ParquetFile`` at ``path``, or :class:`TraceFileError`."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover
        raise TraceFileError("reading Parquet needs pyarrow (pip install pyarrow)") from e
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError
        raise TraceFileError(f"{os.path.basename(path)} is not a readable Parquet file: {str(e).splitlines()[0] if str(e) else e!r}") from None


# ---- records -------------------------------------------------------------------------------------


def iter_records(
    src: Source, *, whole: Callable[[Any], bool] | None = None, max_line_bytes: int | None = None
) -> Iterator[tuple[int, Any, Any]]:
    """``(number, where, record or LoadProblem)`` for each record of ``src``: JSONL lines
    (``where`` = ``(offset, length)`` in bytes), a JSON document's records (``where`` = the index;
    the document is one record when it is not a list, or when ``whole(doc)`` says so), Parquet
    rows (``where`` = the row number; read with bounded memory by
    :func:`backend.parquet_limits.iter_parquet_rows`). Numbers are 1-based."""
    if src.kind == PARQUET:
        from backend.parquet_limits import iter_parquet_rows

        for n, row in iter_parquet_rows(open_parquet(src.path), src.path):
            yield n, n, row
    elif src.kind == JSON:
        doc = src.doc
        if not isinstance(doc, list) or (whole is not None and whole(doc)):
            yield 1, 0, doc
        else:
            for i, rec in enumerate(doc):
                yield i + 1, i, rec
    else:
        with open(src.path, "rb") as f:
            for lineno, off, n, raw in read_lines(f, max_line_bytes):
                yield lineno, (off, n), parse_line(lineno, raw)


def trace_of(n: int, rec: Any) -> Trace | LoadProblem:
    """One of our records (parsed JSON) as a trace, or the problem with its reason. A record must
    carry ``format_version`` and ``id`` (:meth:`Trace.from_dict`): every field has a default, so a
    record of another format would otherwise load as an empty trace with a made-up id."""
    if isinstance(rec, LoadProblem):
        return rec
    why = record_tokens_problem(rec)  # before the ids are copied into a trace
    if why:
        return LoadProblem(n, why)
    try:
        return Trace.from_dict(rec)
    except TraceFormatError as e:
        return LoadProblem(n, str(e))


def trace_of_row(n: int, row: Any) -> Trace | LoadProblem:
    """A row of our Parquet layout as a trace, or the problem (``bad row: ...``)."""
    if isinstance(row, LoadProblem):
        return row
    try:
        return trace_from_row(row)
    except (TraceFormatError, json.JSONDecodeError, TypeError, ValueError) as e:
        return LoadProblem(n, f"bad row: {e}")


def iter_traces(src: Source, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, Any, Trace | LoadProblem]]:
    """``(number, where, trace or problem)`` for each record of one of our trace files."""
    convert = trace_of_row if src.kind == PARQUET else trace_of
    for n, where, rec in iter_records(src, max_line_bytes=max_line_bytes):
        yield n, where, convert(n, rec)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic GC paused: reading a file allocates many objects and frees none in cycles, and
    each collection would walk every trace read so far."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def collect(src: Source, res: LoadResult, unit: str, max_line_bytes: int | None = None) -> LoadResult:
    """Every trace of ``src`` into ``res`` (problems listed by ``unit``), up to the per-file limit."""
    with no_gc():
        for n, _, item in iter_traces(src, max_line_bytes=max_line_bytes):
            if not res.take(n, item, unit):
                break
    return res


def load_traces(path: str, max_bytes: int | None = None, max_line_bytes: int | None = None) -> LoadResult:
    """Our trace records from a text file: JSONL (one trace per line), a JSON object, or a JSON
    list (:func:`sniff`). Good records load; each bad one is reported with its line (or list
    index) and the reason. The limits default to :data:`DEFAULT_MAX_FILE_BYTES` /
    :data:`DEFAULT_MAX_LINE_BYTES` (read at call time)."""
    if max_line_bytes is None:
        max_line_bytes = DEFAULT_MAX_LINE_BYTES
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    src = sniff(path, text_only=True, max_bytes=max_bytes, max_line_bytes=max_line_bytes)
    return collect(src, LoadResult(), "record" if src.kind == JSON else "line", max_line_bytes)


# ---- our Parquet layout ----------------------------------------------------------------------------

PARQUET_KIND = b"agent-loop-inspector/trace"
PARQUET_VERSION = b"1"
ID_COLUMNS = ("prompt_ids", "response_ids", "response_mask")
SCALAR_COLUMNS = ("format_version", "id", "termination_reason")
JSON_COLUMNS = ("messages", "tools", "steps", "message_spans", "config", "tokenizer", "metadata")


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def parquet_schema() -> Any:
    """One row per trace: token ids and mask as integer list columns, every nested field as a
    JSON string column, ``source`` (metadata.source, for filtering; not read back) and ``extra``
    (unknown top-level keys, as JSON)."""
    import pyarrow as pa

    fields = [
        pa.field("format_version", pa.int32()),
        pa.field("id", pa.string()),
        pa.field("termination_reason", pa.string()),
        pa.field("source", pa.string()),
        pa.field("prompt_ids", pa.list_(pa.int64())),
        pa.field("response_ids", pa.list_(pa.int64())),
        pa.field("response_mask", pa.list_(pa.int8())),
    ]
    fields += [pa.field(c, pa.string()) for c in JSON_COLUMNS]
    fields.append(pa.field("extra", pa.string()))
    return pa.schema(fields, metadata={b"kind": PARQUET_KIND, b"version": PARQUET_VERSION})


def parquet_row(t: Trace) -> dict[str, Any]:
    """A trace as a row of :func:`parquet_schema`."""
    d = t.to_dict()
    row: dict[str, Any] = {c: d.pop(c) for c in SCALAR_COLUMNS}
    for c in ID_COLUMNS:
        row[c] = d.pop(c)
    for c in JSON_COLUMNS:
        row[c] = _dumps(d.pop(c))
    src = t.metadata.get("source") if isinstance(t.metadata, dict) else None
    row["source"] = src if isinstance(src, str) else None
    row["extra"] = _dumps(d) if d else None
    return row


def trace_from_row(row: dict[str, Any]) -> Trace:
    """A row of :func:`parquet_schema` back as the trace written (raises on a bad row)."""
    d: dict[str, Any] = {}
    extra = row.get("extra")
    if extra:
        d.update(json.loads(extra))
    for c in SCALAR_COLUMNS:
        if row.get(c) is not None:
            d[c] = row[c]
    for c in ID_COLUMNS:
        v = row.get(c)
        d[c] = list(v) if v is not None else []
    for c in JSON_COLUMNS:
        v = row.get(c)
        if v is not None:
            d[c] = json.loads(v)
    return Trace.from_dict(d)


def is_trace_parquet(path: str) -> bool:
    """Whether ``path`` is a Parquet file written by :func:`write_parquet`."""
    try:
        import pyarrow.parquet as pq

        md = pq.read_schema(path).metadata or {}
    except Exception:
        return False
    return md.get(b"kind") == PARQUET_KIND


def check_layout(pf: Any, path: str, hint: str = "") -> None:
    """Refuse a Parquet file that is not in our layout (``hint``: what the caller knows of what it
    holds; :func:`backend.importers.load_any` names the format it detects)."""
    if (pf.schema_arrow.metadata or {}).get(b"kind") == PARQUET_KIND:
        return
    cols = set(pf.schema_arrow.names)
    if {"id", "messages", "steps"} <= cols:
        return  # our columns, written by something else
    hint = hint or f"; if it holds another tool's records, import it: python -m backend import {path} --out TRACES.jsonl"
    raise TraceFileError(f"{os.path.basename(path)} is not a trace Parquet file (columns: {', '.join(sorted(cols)[:8])}){hint}")


def read_parquet_traces(path: str) -> LoadResult:
    """Read a Parquet file written by :func:`write_parquet`. Bad rows are reported by row number
    (1-based), the rest load; rows over the limits are reported without being decoded
    (:mod:`backend.parquet_limits`). Another layout raises :class:`TraceFileError` with a hint."""
    src = Source(path, PARQUET)
    check_layout(open_parquet(path), path)
    return collect(src, LoadResult(), "row")


# ---- any trace file --------------------------------------------------------------------------------


# ---- the index ---------------------------------------------------------------------------------------

# The summary of a trace, then where it is: ``file`` (position in TraceIndex.files), ``line`` (the
# record's number: line, row or list index + 1), ``offset`` / ``length`` (JSONL: the line's bytes;
# traces held in memory: offset is the position among them; Parquet: -1, the row group is found
# from the row number)
SUMMARY_COLUMNS = [
    "id", "source", "turns", "tokens", "prompt_tokens", "response_tokens", "termination_reason", "errors",
    "messages", "tools", "duration_s", "score", "preview", "training_step", "tool_errors", "parse_errors",
]
INDEX_COLUMNS = [*SUMMARY_COLUMNS, "file", "line", "offset", "length"]
_INT_COLUMNS = ("turns", "tokens", "prompt_tokens", "response_tokens", "errors", "messages", "tools", "tool_errors",
                "parse_errors", "file", "line", "offset", "length")
_FLOAT_COLUMNS = ("duration_s", "score")
_NULLABLE_INT_COLUMNS = ("training_step",)  # pandas "Int64": missing is <NA>
# where a trace's training step is read: its metadata (the first of these keys holding an
# integer), else a verl dump's file name (``trainer.rollout_data_dir/<step>.jsonl``)
STEP_KEYS = ("training_step", "global_step", "step")
_STEP_FILE = re.compile(r"^(\d{1,12})\.(?:jsonl|json|parquet)$")
PREVIEW_CHARS = 200  # of the first user message, whitespace collapsed


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _preview(messages: Any) -> str:
    for m in messages if isinstance(messages, list) else ():
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            text = c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else ""
            return preview_text(text)
    return ""


def preview_text(text: str) -> str:
    """A table preview of a text: whitespace collapsed, at most PREVIEW_CHARS."""
    return " ".join(text.split())[:PREVIEW_CHARS]


def _score(meta: Any) -> float | None:
    if isinstance(meta, dict):
        for k in ("reward_score", "score"):
            if _number(meta.get(k)) is not None:
                return _number(meta.get(k))
    return None


def training_step_of(meta: Any) -> int | None:
    """The training step a trace's metadata names (:data:`STEP_KEYS`: an integer, or a string
    of digits), or None."""
    if isinstance(meta, dict):
        for k in STEP_KEYS:
            v = meta.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 12:
                return int(v)
    return None


def step_of_path(path: str | None) -> int | None:
    """The training step a verl dump's file name gives (``.../12.jsonl`` → 12), or None."""
    if not path:
        return None
    m = _STEP_FILE.match(os.path.basename(path))
    return int(m.group(1)) if m else None


def summary_of_trace(t: Trace) -> dict[str, Any]:
    """The index row of a trace (its :data:`SUMMARY_COLUMNS`). ``training_step`` is the
    metadata's (:func:`training_step_of`); an index fills it from a verl dump's file name
    (:func:`step_of_path`) where the metadata has none. ``errors`` counts parse errors of severity
    error, step errors and failed tool results; ``tool_errors`` the failed tool results and the
    errors of tool steps; ``parse_errors`` the parse errors of severity error."""
    tool_errors = parse_errors = 0
    for s in t.steps:
        parse_errors += sum(1 for e in s.parse_errors if e.severity == "error")
        tool_errors += sum(1 for r in s.tool_results if not r.ok) + (1 if s.error and s.state == StepState.PROCESSING_TOOLS else 0)
    return {
        "id": t.id,
        "source": t.metadata.get("source") if isinstance(t.metadata.get("source"), str) else None,
        "turns": t.num_turns,
        "tokens": len(t.prompt_ids) + len(t.response_ids),
        "prompt_tokens": len(t.prompt_ids),
        "response_tokens": len(t.response_ids),
        "termination_reason": t.termination_reason,
        "errors": t.step_errors(),
        "messages": len(t.messages),
        "tools": len(t.tools),
        "duration_s": _number(t.metadata.get("duration_s")),
        "score": _score(t.metadata),
        "preview": _preview(t.messages),
        "training_step": training_step_of(t.metadata),
        "tool_errors": tool_errors,
        "parse_errors": parse_errors,
    }


def summary_of_record(d: dict[str, Any], counts: dict[str, int] | None = None) -> dict[str, Any]:
    """:func:`summary_of_trace` of a parsed record, without validating it (``counts``: the token
    lists' lengths when the lists were not parsed). Raises TypeError / AttributeError / ValueError
    on a record of the wrong shape (it is then converted in full, for its reason)."""
    turns = errors = tool_errors = parse_errors = 0
    for s in d.get("steps") or ():
        state = s.get("state")
        if state == StepState.GENERATING:
            turns += 1
        for e in s.get("parse_errors") or ():  # warnings (a repaired call) are not errors
            parse_errors += e.get("severity", "error") == "error"
        failed = sum(r.get("ok") is False for r in s.get("tool_results") or ())
        tool_errors += failed + (bool(s.get("error")) and state == StepState.PROCESSING_TOOLS)
        errors += bool(s.get("error")) + failed
    errors += parse_errors
    msgs = d.get("messages") or []
    if not turns:
        turns = sum(1 for m in msgs if m.get("role") == "assistant")
    meta = d.get("metadata") or {}
    p = counts["prompt_ids"] if counts else len(d.get("prompt_ids") or ())
    r = counts["response_ids"] if counts else len(d.get("response_ids") or ())
    src = meta.get("source")
    return {
        "id": str(d["id"]), "source": src if isinstance(src, str) else None, "turns": turns, "tokens": p + r,
        "prompt_tokens": p, "response_tokens": r, "termination_reason": d.get("termination_reason"), "errors": errors,
        "messages": len(msgs), "tools": len(d.get("tools") or ()), "duration_s": _number(meta.get("duration_s")),
        "score": _score(meta), "preview": _preview(msgs), "training_step": training_step_of(meta),
        "tool_errors": tool_errors, "parse_errors": parse_errors,
    }


_ID_KEYS = (b'"prompt_ids":[', b'"response_ids":[', b'"response_mask":[')

try:  # a faster parser for the index's light parse where installed (gradio depends on it)
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None


def _loads(raw: bytes | str) -> Any:
    """``json.loads``, through orjson first where it is installed. orjson accepts a subset of what
    ``json`` does (no NaN, no lone surrogates, no integers past 64 bits, strict UTF-8) and parses
    it to the same values; whatever it refuses is parsed by ``json``, so the verdict and values
    are ``json.loads``'s."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except (ValueError, TypeError):  # orjson.JSONDecodeError is a ValueError
            pass
    return json.loads(raw)


def _loads_light(raw: bytes) -> tuple[Any, dict[str, int] | None]:
    """``json.loads`` of a trace line without building its token-id lists (the bulk of a trace):
    each top-level id list is cut out of the bytes and counted (commas + 1). Used only when each
    key occurs exactly once in the line and the parsed object then has it as an empty list, which
    proves the cut list was the top-level one; otherwise a plain ``json.loads``."""
    spans: list[tuple[int, int, str]] = []
    for key in _ID_KEYS:
        if raw.count(key) != 1:
            return _loads(raw), None
        a = raw.find(key) + len(key)
        b = raw.find(b"]", a)
        if b < 0:
            return _loads(raw), None
        spans.append((a, b, key[1:-3].decode()))
    spans.sort()
    parts = []
    pos = 0
    for a, b, _ in spans:
        if a < pos:
            return _loads(raw), None
        parts.append(raw[pos:a])
        pos = b
    parts.append(raw[pos:])
    d = _loads(b"".join(parts))
    if not isinstance(d, dict):
        return d, None
    counts: dict[str, int] = {}
    for a, b, name in spans:
        if d.get(name) != []:
            return _loads(raw), None
        counts[name] = raw.count(b",", a, b) + 1 if raw[a:b].strip() else 0
    return d, counts


def summary_of_line(lineno: int, raw: bytes) -> dict[str, Any] | LoadProblem:
    """The summary of a JSONL line, parsed lightly; where the light parse is not sure the line is
    a trace, the line is converted in full (:func:`trace_of`), so a refused line has the reason
    :func:`backend.importers.load_any` gives."""
    try:
        d, counts = _loads_light(raw)
        if isinstance(d, dict) and "id" in d and "format_version" in d:
            n = counts["prompt_ids"] + counts["response_ids"] if counts else None
            if n is not None and too_many_tokens(n):
                return LoadProblem(lineno, too_many_tokens(n))  # type: ignore[arg-type]
            if n is not None or not record_tokens_problem(d):
                return summary_of_record(d, counts)
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        pass  # JSONDecodeError, UnicodeDecodeError, >4300-digit ints, a record of the wrong shape
    item = trace_of(lineno, parse_line(lineno, raw))
    return item if isinstance(item, LoadProblem) else summary_of_trace(item)


@dataclass
class IndexedFile:
    """One file of a :class:`TraceIndex`: how its rows open (``kind``: jsonl, parquet, or memory
    for traces held in memory: a JSON document, an import, a live run)."""

    path: str | None
    kind: str
    unit: str = "line"
    problems: ProblemList = field(default_factory=ProblemList)
    formats: dict[str, int] = field(default_factory=dict)  # an import: traces of each source format
    held: list[Trace] | None = None  # kind memory: the traces, by the position in ``where``

    @functools.cached_property
    def step(self) -> int | None:
        """The training step its name gives (:func:`step_of_path`)."""
        return step_of_path(self.path)


class TraceIndex:
    """One row per trace over a list of files: its summary (:data:`SUMMARY_COLUMNS`) and where it
    is (:data:`INDEX_COLUMNS`), built in one streaming pass; :meth:`open` reads only that trace's
    bytes (a JSONL line, a Parquet row group) and gives the trace :func:`backend.importers.load_any` gives, or raises
    :class:`TraceFormatError` with the reason it gives (``"line 7: ..."``).

    ``build(paths)`` parses JSONL lines lightly (a line the light parse cannot summarise is
    converted in full, for its reason): a line that is JSON of the right shape but not a valid
    trace is found when opened. ``build(paths, validate=True)`` converts every record, so the
    problems are exactly :func:`backend.importers.load_any`'s, and ``keep=True`` holds the traces (``traces``)."""

    def __init__(self) -> None:
        self.files: list[IndexedFile] = []
        self.cols: dict[str, list[Any]] = {c: [] for c in INDEX_COLUMNS}
        self.traces: list[Trace] | None = None  # build(keep=True): each row's trace
        self._df: Any = None

    # -- building
    @classmethod
    def build(cls, paths: Iterable[str], *, validate: bool = False, keep: bool = False,
              on_trace: Callable[[Trace], None] | None = None) -> TraceIndex:
        """The index of our trace files (JSONL, JSON, our Parquet). A file that cannot be read at
        all raises :class:`TraceFileError`, as :func:`backend.importers.load_any` does.
        ``validate``: every record is made a trace (a record that is not one is a problem, as
        when loading); ``on_trace(trace)`` is then called for each row's trace, in row order, so a
        caller can keep what it needs of it without the index holding the traces (``keep``)."""
        ix = cls()
        if keep:
            ix.traces = []
        for path in paths:
            ix._add_file(path, validate or keep or on_trace is not None, on_trace)
        return ix

    @classmethod
    def of_traces(cls, traces: Iterable[Trace], problems: Iterable[LoadProblem] = (), *, lines: list[int] | None = None,
                  path: str | None = None, unit: str = "line", formats: dict[str, int] | None = None) -> TraceIndex:
        """An index over traces in memory (an import, a JSON document, a live run)."""
        ix = cls()
        ix.traces = []
        ix._add_memory(list(traces), problems, lines, path, unit, formats)
        return ix

    @classmethod
    def of_result(cls, res: LoadResult, path: str | None = None) -> TraceIndex:
        """:meth:`of_traces` of a :class:`LoadResult` (or an import's result)."""
        return cls.of_traces(res.traces, res.problems, lines=res.lines, path=path, unit=getattr(res, "unit", "line"),
                             formats=getattr(res, "formats", None))

    def _add_memory(self, traces: list[Trace], problems: Iterable[LoadProblem], lines: list[int] | None, path: str | None,
                    unit: str, formats: dict[str, int] | None) -> None:
        f = IndexedFile(path, "memory", unit, formats=dict(formats or {}), held=traces)
        f.problems.extend(problems)
        f.problems.unlisted = getattr(problems, "unlisted", 0)
        k = len(self.files)
        self.files.append(f)
        for i, t in enumerate(traces):
            self._row(summary_of_trace(t), k, lines[i] if lines and i < len(lines) else i + 1, i, -1, t)

    def _row(self, summary: dict[str, Any], file: int, line: int, offset: int, length: int, trace: Trace | None = None) -> None:
        cols = self.cols
        if summary["training_step"] is None:  # a verl dump's <step>.jsonl
            summary["training_step"] = self.files[file].step
        for c in SUMMARY_COLUMNS:
            cols[c].append(summary[c])
        cols["file"].append(file)
        cols["line"].append(line)
        cols["offset"].append(offset)
        cols["length"].append(length)
        if self.traces is not None and trace is not None:
            self.traces.append(trace)

    def _add_file(self, path: str, validate: bool, on_trace: Callable[[Trace], None] | None = None) -> None:
        src = sniff(path)
        if src.kind == PARQUET:
            check_layout(open_parquet(path), path)
        elif src.kind == JSON:  # the document is in memory already: its traces are held
            res = collect(src, LoadResult(), "record")
            self._add_memory(res.traces, res.problems, res.lines, path, "line", None)
            if on_trace is not None:
                for t in res.traces:
                    on_trace(t)
            return
        f = IndexedFile(path, src.kind, src.unit)
        k = len(self.files)
        self.files.append(f)
        rows, cap = 0, max_traces_per_file()
        with no_gc():
            for n, where, item in self._scan(src, validate):
                if rows >= cap:  # as LoadResult.take: the record after the last trace read says so
                    f.problems.append(not_read(n, src.unit, cap), force=True)
                    break
                if isinstance(item, LoadProblem):
                    f.problems.append(item)
                    continue
                rows += 1
                off, length = where if src.kind == JSONL else (-1, -1)
                if isinstance(item, Trace):
                    self._row(summary_of_trace(item), k, n, off, length, item)
                    if on_trace is not None:
                        on_trace(item)
                else:
                    self._row(item, k, n, off, length)

    @staticmethod
    def _scan(src: Source, validate: bool) -> Iterator[tuple[int, Any, Any]]:
        if validate:
            yield from iter_traces(src)
        elif src.kind == PARQUET:
            for n, where, row in iter_records(src):
                yield n, where, _summary_of_row(n, row)
        else:
            with open(src.path, "rb") as fh:
                for lineno, off, n, raw in read_lines(fh):
                    yield lineno, (off, n), raw if isinstance(raw, LoadProblem) else summary_of_line(lineno, raw)

    # -- reading
    def __len__(self) -> int:
        return len(self.cols["id"])

    @property
    def problems(self) -> ProblemList:
        """The records that could not be read, of every file (listed, and counted past the cap)."""
        if len(self.files) == 1:
            return self.files[0].problems
        out = ProblemList()
        for f in self.files:
            out.extend(f.problems)
            out.unlisted += f.problems.unlisted
        return out

    @property
    def problem_count(self) -> int:
        return sum(f.problems.total for f in self.files)

    @property
    def unit(self) -> str:
        return self.files[0].unit if self.files else "line"

    @property
    def formats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            for k, v in f.formats.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def df(self) -> Any:
        """:meth:`frame`, made once (an index does not change once built)."""
        if self._df is None or len(self._df) != len(self):
            self._df = self.frame()
        return self._df

    def frame(self) -> Any:
        """The rows as a pandas DataFrame with :data:`INDEX_COLUMNS` (text columns keep None)."""
        import pandas as pd

        data = {}
        for c in INDEX_COLUMNS:
            v = self.cols[c]
            if c in _INT_COLUMNS:
                data[c] = pd.Series(v, dtype="int64")
            elif c in _NULLABLE_INT_COLUMNS:
                data[c] = pd.Series(v, dtype="Int64")
            elif c in _FLOAT_COLUMNS:
                data[c] = pd.Series([float("nan") if x is None else x for x in v], dtype="float64")
            else:
                data[c] = pd.Series(v, dtype=object)
        return pd.DataFrame(data, columns=INDEX_COLUMNS)

    def row_of(self, key: int | str) -> int:
        """Row number of a row number or a trace id (the newest row of an id: a resumed rollout
        may repeat one)."""
        if isinstance(key, str):
            ids = self.cols["id"]
            for i in range(len(ids) - 1, -1, -1):
                if ids[i] == key:
                    return i
            raise KeyError(f"no trace with id {key!r}")
        if not 0 <= key < len(self):
            raise IndexError(f"row {key} is out of range (0..{len(self) - 1})")
        return int(key)

    def read(self, key: int | str) -> Trace | LoadProblem:
        """The trace of a row (by row number or id), or the problem that refuses it, reading only
        its bytes."""
        i = self.row_of(key)
        f = self.files[self.cols["file"][i]]
        n, off, length = self.cols["line"][i], self.cols["offset"][i], self.cols["length"][i]
        if f.kind == "memory":
            assert f.held is not None
            return f.held[off]
        if f.kind == PARQUET:
            return trace_of_row(n, parquet_row_at(f.path, n))  # type: ignore[arg-type]
        with open(f.path, "rb") as fh:  # type: ignore[arg-type]
            fh.seek(off)
            raw = fh.read(length)
        return trace_of(n, parse_line(n, raw.removeprefix(codecs.BOM_UTF8)))

    def open(self, key: int | str) -> Trace:
        """:meth:`read`, raising :class:`TraceFormatError` (``"line 7: <reason>"``) for a row whose
        record is not a valid trace."""
        item = self.read(key)
        if isinstance(item, LoadProblem):
            unit = self.files[self.cols["file"][self.row_of(key)]].unit
            raise TraceFormatError(f"{unit} {item.line}: {item.reason}")
        return item


def summary_of_parquet_row(n: int, row: Any, counts: dict[str, int] | None = None) -> dict[str, Any] | None:
    """The summary of a row of our Parquet layout from its JSON columns, without validating
    (``counts``: the token lists' lengths, when the row holds no lists), or None when it cannot be
    summarised so (the row is then converted in full, for its reason)."""
    try:
        d = {c: _loads(row[c]) if row.get(c) is not None else None for c in ("steps", "messages", "tools", "metadata")}
        d["id"] = row["id"]  # a missing id is found when the row is opened, with its reason
        d["termination_reason"] = row.get("termination_reason")
        s = summary_of_record(d, counts or {k: len(row.get(k) or ()) for k in ("prompt_ids", "response_ids")})
        if row.get("source") is not None:
            s["source"] = row["source"]
        return s
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return None


def _summary_of_row(n: int, row: Any) -> dict[str, Any] | LoadProblem:
    """The summary of a row of our Parquet layout, from its JSON columns without validating; a
    row that cannot be summarised is converted in full (:func:`trace_of_row`), for its reason."""
    if isinstance(row, LoadProblem):
        return row
    s = summary_of_parquet_row(n, row)
    if s is not None:
        return s
    item = trace_of_row(n, row)
    return item if isinstance(item, LoadProblem) else summary_of_trace(item)


def parquet_row_at(path: str, n: int) -> Any:
    """Row ``n`` (1-based) of a Parquet file: its row group is found from the footer and only that
    group is read."""
    pf = open_parquet(path)
    first = 1
    for g in range(pf.num_row_groups):
        rows = pf.metadata.row_group(g).num_rows
        if rows <= 0:
            continue
        if n < first + rows:
            return pf.read_row_group(g).slice(n - first, 1).to_pylist()[0]
        first += rows
    raise IndexError(f"row {n} is not in {os.path.basename(path)}")


# ---- writing -----------------------------------------------------------------------------------------


def write_lines(lines: Iterable[str], path: str) -> int:
    """Write one line per string to ``path`` (UTF-8), through a temporary file replaced at the
    end; returns how many were written."""
    n = 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
            n += 1
    os.replace(tmp, path)
    return n


def write_jsonl(traces: Iterable[Trace], path: str) -> int:
    """Our trace file: one trace per line."""
    return write_lines((t.to_json() for t in traces), path)


def append_jsonl(trace: Trace, path: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(trace.to_json())
        f.write("\n")
        f.flush()


def write_parquet(traces: Iterable[Trace], path: str, *, batch_rows: int = 512) -> int:
    """Our Parquet layout (:func:`parquet_schema`), loss-less: :func:`read_parquet_traces` gives
    the traces written."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover
        raise TraceFileError("Parquet needs pyarrow (pip install pyarrow)") from e
    schema = parquet_schema()
    tmp = path + ".tmp"
    n = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        buf: list[dict[str, Any]] = []
        for t in traces:
            buf.append(parquet_row(t))
            n += 1
            if len(buf) >= batch_rows:
                w.write_table(pa.Table.from_pylist(buf, schema=schema))
                buf = []
        if buf or n == 0:
            w.write_table(pa.Table.from_pylist(buf, schema=schema))
    os.replace(tmp, path)
    return n
