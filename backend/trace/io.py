"""Reading and writing trace files.

One path for every reader: :func:`sniff` says what a file is (JSONL, one JSON document, or
Parquet), :func:`read_lines` reads JSONL with bounded memory, :func:`iter_records` yields each
record (or the problem that replaced it) with where it is, and :func:`trace_of` /
:func:`trace_of_row` turn our records into a :class:`Trace` or a :class:`LoadProblem`. On that:

* :func:`load_traces` (our JSON / JSONL), :func:`read_parquet_traces` (our Parquet);
  :func:`backend.importers.load_any` builds on them for any trace file (importing another
  tool's when asked), so this module never imports the importers;
* :func:`parquet_row_at`: one row of a Parquet file, reading only its row group;
* the writers: :func:`write_jsonl`, :func:`append_jsonl`, :func:`write_parquet`, :func:`write_lines`.

The lazy index over these readers (:class:`~backend.trace.index.TraceIndex`, the row summaries)
is in :mod:`backend.trace.index`.

The limits (file, line, traces per file, listed problems, tokens, Parquet values and text) are
in :mod:`backend.trace.limits` (re-exported by :mod:`backend.trace`), apart so that
:mod:`backend.trace.parquet_guard` can use them without an import cycle.
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from backend.trace import text_kind
from backend.trace.limits import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    LoadProblem,
    LoadResult,
    TraceFileError,
    check_file_size,
    line_too_long,
    record_tokens_problem,
)
from backend.trace.model import Refused, Trace, TraceFormatError, parse_json_record

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
    or :data:`PARQUET`. ``problem``: a file that is read as nothing but this one problem (a JSON
    document that does not parse, an HTML page)."""

    path: str
    kind: str
    doc: Any = None
    problem: LoadProblem | None = None

    @property
    def unit(self) -> str:
        """What a record's number counts: ``row`` (Parquet) or ``line``."""
        return "row" if self.kind == PARQUET else "line"


def sniff(path: str, *, text_only: bool = False, max_bytes: int | None = None, max_line_bytes: int | None = None) -> Source:
    """What ``path`` holds, decided from its content as much as its name. Refused
    (:class:`TraceFileError`): a missing file, a folder, a file over the size limit, bytes that
    are not text (:func:`~backend.trace.text_kind.looks_binary`). ``.parquet`` is Parquet (unless
    ``text_only``). A text file that is not JSONL is one :data:`JSON` source: an HTML or XML file
    is one problem that says so; a JSON document is read whole when it is named ``.json`` or
    when it is no longer than the line limit (so memory stays bounded by that limit) and either
    starts with ``[`` or is written over many lines (:func:`~backend.trace.text_kind.spans_lines`).
    A document written over many lines that does not parse is one problem that says where json
    stopped; anything else is JSONL (a bad line is then one problem of its own)."""
    if not os.path.exists(path):
        raise TraceFileError(f"file not found: {path}")
    if os.path.isdir(path):
        raise TraceFileError(f"{path} is a folder, not a trace file")
    size = check_file_size(path, DEFAULT_MAX_FILE_BYTES if max_bytes is None else max_bytes)
    if path.endswith(".parquet") and not text_only:
        return Source(path, PARQUET)
    limit = DEFAULT_MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    name = os.path.basename(path)
    with open(path, "rb") as f:
        head = f.read(text_kind.HEAD_BYTES)
        markup = not_text(name, head)
        if markup is not None:
            return Source(path, JSON, problem=markup)
        spread = text_kind.spans_lines(head, whole=size <= len(head))
        named = path.endswith(".json")
        if not (named or ((spread or text_kind.body_of(head).startswith(b"[")) and size <= limit)):
            if spread:  # too big to read whole under another name: one problem, not one per line
                return Source(path, JSON, problem=LoadProblem(1, text_kind.too_big_reason(name, size, limit)))
            return Source(path, JSONL)
        f.seek(0)
        doc = text_kind.read_document(f.read())
    if isinstance(doc, LoadProblem):
        # a document over many lines says where json stopped; other text is read line by line
        # (a JSONL file, or a one-line document: its line then says why)
        return Source(path, JSON, problem=doc) if spread else Source(path, JSONL)
    # "null" is read line by line (the line says it is no trace)
    return Source(path, JSON, doc) if doc is not None else Source(path, JSONL)


def not_text(name: str, head: bytes) -> LoadProblem | None:
    """A file whose first bytes (``head``) say it is no trace file: binary bytes are refused
    (:class:`TraceFileError`), an HTML or XML file is the one problem returned."""
    if text_kind.looks_binary(head):
        raise TraceFileError(f"{name} looks like a binary file, not JSON/JSONL text")
    why = text_kind.markup_reason(name, head)
    return LoadProblem(1, why) if why is not None else None


def refuse_unless_jsonl(path: str, size: int, complete: bool) -> None:
    """For the readers of JSONL only (trace sets): :class:`TraceFileError` with the one reason
    when ``path`` is binary, HTML / XML, or one JSON document written over many lines (where json
    stops in it when it does not parse). ``complete``: the file is not being written (a first
    line without its newline yet is then a line, not a document cut short)."""
    name = os.path.basename(path)
    with open(path, "rb") as f:
        head = f.read(text_kind.HEAD_BYTES)
        markup = not_text(name, head)
        if markup is not None:
            raise TraceFileError(markup.reason)
        if not text_kind.spans_lines(head, whole=complete and size <= len(head)):
            return
        if size > DEFAULT_MAX_LINE_BYTES and not path.endswith(".json"):
            raise TraceFileError(text_kind.too_big_reason(name, size, DEFAULT_MAX_LINE_BYTES))
        f.seek(0)
        doc = text_kind.read_document(f.read())
    if isinstance(doc, LoadProblem):
        raise TraceFileError(f"{name}: {doc.reason}")
    raise TraceFileError(f"{name} is one JSON document written over many lines, not JSONL (one record a line): "
                         "a trace set reads JSONL and Parquet files; load it in Trace files, or import it")


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
    :func:`backend.trace.parquet_guard.iter_parquet_rows`). Numbers are 1-based."""
    if src.kind == PARQUET:
        from backend.trace.parquet_guard import iter_parquet_rows

        for n, row in iter_parquet_rows(open_parquet(src.path), src.path):
            yield n, n, row
    elif src.problem is not None:
        yield src.problem.line, 0, src.problem
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
    (:mod:`backend.trace.parquet_guard`). Another layout raises :class:`TraceFileError` with a hint."""
    src = Source(path, PARQUET)
    check_layout(open_parquet(path), path)
    return collect(src, LoadResult(), "row")


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
