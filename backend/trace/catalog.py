"""Trace sets: one index over a folder or glob of trace files that need not fit in memory.

:class:`TraceSet` is a :class:`~backend.trace.index.TraceIndex` over every JSONL / Parquet file a
spec names (a folder, searched recursively, a glob, or one file): one row per trace with its
summary (:data:`~backend.trace.index.SUMMARY_COLUMNS`) and where it is (file, line or row, byte
offset and length), built in one streaming pass; :meth:`TraceSet.open` reads only that trace's
bytes. Nothing else of a trace is kept.

* **Cache.** Each file's rows are kept on disk (a Parquet file per trace file, under
  :func:`cache_dir`), keyed by the file's absolute path and :data:`SCHEMA_VERSION`, and valid
  while its size and modification time are unchanged; a JSONL file that grew (the bytes indexed
  still the same: a fingerprint of their end is compared) is indexed from the end of its last
  complete line only. Anything else (a shorter or rewritten file, a damaged cache entry) is
  indexed again. ``stats`` counts hits, misses, grown and invalidated files.
* **Follow.** :meth:`TraceSet.refresh` looks again: new files are indexed, grown files from
  where they stopped, removed or rewritten ones again; it returns the number of rows added. A
  last line without its newline is a line still being written, not an error: it is indexed once
  complete (``final=True``, for a one-shot reader such as the CLI, indexes it as it is, as every
  other reader does; so does a follower once the file has not changed for :data:`SETTLE_S`).
* **Scan.** JSONL lines are read with :func:`~backend.trace.io.read_lines` (bounded by the line
  limit, over-long and bad lines reported with their numbers) and summarised by the light parse
  (:func:`~backend.trace.index.summary_of_line`: the token-id lists are cut out and counted, the
  rest parsed by orjson where installed). Parquet files (our layout) are read one row group at a
  time, only the columns the summary needs (pyarrow), the token lists' lengths from their Arrow
  offsets without building a Python list.
* **Limits.** The line limit, the per-trace token and text limits and the listed-problems cap
  apply as to any file (:mod:`backend.trace.limits`); a set is bounded by
  :func:`~backend.trace.limits.max_index_rows` and :func:`~backend.trace.limits.max_index_files`
  instead of the per-file trace limit and file size limit (which bound traces *held* in memory;
  a set holds none).
* **Other tools' files.** Rows of other tools' formats (a verl rollout dump, Anthropic or
  LangChain records, OTel span lines, TRL Parquet rows ...) are summarised and opened through
  :class:`ForeignRows`, which :mod:`backend.importers` registers (:func:`register_foreign_rows`)
  when it is imported: the trace layer never imports the importers. Without it, our own trace
  files are indexed as they always are, and a record of another format is listed as a problem
  saying that other tools' files need :mod:`backend.importers` (:data:`NO_FOREIGN_ROWS`).

Paths come from the operator (``--traces``, ``ALI_TRACES``, the local-mode folder field), never
from a visitor (see :mod:`backend.safety.trust`).
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from backend.trace.index import (
    INDEX_COLUMNS,
    RL_COLUMNS,
    SUMMARY_COLUMNS,
    IndexedFile,
    TraceIndex,
    step_of_path,
    summary_of_line,
    summary_of_parquet_row,
    summary_of_trace,
)
from backend.trace.io import (
    PARQUET,
    check_layout,
    iter_records,
    no_gc,
    open_parquet,
    parquet_row_at,
    parse_line,
    read_lines,
    refuse_unless_jsonl,
    sniff,
    trace_of,
    trace_of_row,
)
from backend.trace.limits import (
    LoadProblem,
    ProblemList,
    TraceFileError,
    max_index_files,
    max_index_rows,
    max_trace_text_bytes,
    too_many_tokens,
)
from backend.trace.model import Trace, TraceFormatError

try:  # the index's parser where installed (gradio depends on it)
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

# Bump when a cached file's rows or columns change meaning (the cache is then rebuilt)
SCHEMA_VERSION = 4  # 2: verl rollout-dump rows (tokens unknown: null token columns); 3: other tools' formats;
# 4: the RL columns group, sample, rank
SUFFIXES = (".jsonl", ".parquet")
JSONL = "jsonl"
# a follower indexes a last line without its newline once its file has not changed for this long
SETTLE_S = 5.0
# a followed file's cache entry is rewritten at most this often (and by flush())
CACHE_EVERY_S = 10.0
_FINGERPRINT = 4096  # bytes before the end of what was indexed, hashed to tell an append from a rewrite
# Rows are turned into Arrow tables this many at a time (Python lists stay small)
_CHUNK_ROWS = 32_768

_TEXT = ("id", "source", "termination_reason", "preview", "group")
_FLOAT = ("duration_s", "score")
_NULLABLE_INT = ("training_step", "turns", "tokens", "prompt_tokens", "response_tokens")


def _arrow_schema() -> Any:
    import pyarrow as pa

    fields = []
    for c in SUMMARY_COLUMNS + ["line", "offset", "length"]:
        t = pa.string() if c in _TEXT else pa.float64() if c in _FLOAT else pa.int64()
        fields.append(pa.field(c, t))
    return pa.schema(fields)


# ---- what a spec names ---------------------------------------------------------------------


def _natural(path: str) -> list[Any]:
    """Sort key: ``2.jsonl`` before ``10.jsonl`` (verl's steps), then the path."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def resolve(spec: str) -> list[str]:
    """The trace files ``spec`` names: a folder (every ``.jsonl`` / ``.parquet`` under it, hidden
    folders and files skipped), a glob (``runs/*/rollout/*.jsonl``, ``**`` recursive), or one file;
    absolute paths in natural order. Raises :class:`TraceFileError` when it names nothing there
    (an empty folder is an empty set: a run may not have written yet)."""
    spec = os.path.expanduser(str(spec).strip())
    if not spec:
        raise TraceFileError("no folder or glob given")
    if os.path.isdir(spec):
        out = []
        for root, dirs, files in os.walk(spec):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            out += [os.path.join(root, f) for f in files if f.endswith(SUFFIXES) and not f.startswith(".")]
    elif glob.has_magic(spec):
        out = [p for p in glob.glob(spec, recursive=True) if p.endswith(SUFFIXES) and os.path.isfile(p)]
        if not out and not os.path.isdir(os.path.dirname(spec) or ".") and not glob.has_magic(os.path.dirname(spec)):
            raise TraceFileError(f"no such folder: {os.path.dirname(spec)}")
    elif os.path.isfile(spec):
        out = [spec]
    else:
        raise TraceFileError(f"no such folder or file: {spec}")
    return sorted((os.path.abspath(p) for p in out), key=_natural)


# ---- the cache ----------------------------------------------------------------------------------


def cache_dir() -> str | None:
    """Where indexed files are cached: ``$ALI_TRACE_INDEX_CACHE`` (``off`` for no cache), else
    ``trace-index/`` in the user cache folder (:func:`backend.runtime.cache.cache_root`)."""
    v = os.environ.get("ALI_TRACE_INDEX_CACHE", "").strip()
    if v.lower() in ("off", "0", "none", "no"):
        return None
    if v:
        return v
    from backend.runtime.cache import cache_root

    return str(cache_root() / "trace-index")


def _cache_path(root: str, path: str) -> str:
    key = hashlib.sha256(f"{SCHEMA_VERSION}\0{path}".encode()).hexdigest()[:40]
    return os.path.join(root, key + ".parquet")


CACHE_MAX_AGE_S = 30 * 86400  # an entry not rewritten for this long is removed
_pruned: set[str] = set()  # cache folders pruned by this process


def prune_cache(root: str, *, max_age_s: float = CACHE_MAX_AGE_S, limit: int = 10_000) -> int:
    """Remove the cache entries of files that are gone, entries older than ``max_age_s``, and
    temporary files left by a killed writer (the first ``limit`` entries looked at); returns how
    many were removed. A damaged entry is removed too."""
    import pyarrow.parquet as pq

    removed = 0
    now = time.time()
    try:
        names = sorted(os.listdir(root))[:limit]
    except OSError:
        return 0
    for name in names:
        p = os.path.join(root, name)
        try:
            st = os.stat(p)
            if name.endswith(".tmp"):
                stale = now - st.st_mtime > 3600
            elif name.endswith(".parquet"):
                stale = now - st.st_mtime > max_age_s
                if not stale:
                    meta = json.loads((pq.read_schema(p).metadata or {})[b"ali_index"])
                    stale = not os.path.exists(meta["path"])
            else:
                continue
        except Exception:  # noqa: BLE001 - a damaged entry
            stale = True
        if stale:
            try:
                os.remove(p)
                removed += 1
            except OSError:
                pass
    return removed


def _fingerprint(path: str, end: int) -> str:
    if end <= 0:
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, end - _FINGERPRINT))
        return hashlib.sha256(f.read(min(end, _FINGERPRINT))).hexdigest()


# ---- one file -------------------------------------------------------------------------------------


@dataclass
class FileState:
    """What is known of one file of a set: its rows (Arrow tables, in line order), how far it was
    read (``done`` bytes, ``lines`` line ends), and the size and time they are valid for."""

    path: str
    kind: str
    size: int = 0
    mtime_ns: int = 0
    done: int = 0  # JSONL: bytes up to the end of the last complete line indexed
    lines: int = 0  # JSONL: lines (newline-terminated) in those bytes
    open_line: bool = False  # the last line indexed had no newline (a settled file's end)
    fingerprint: str = ""
    pending: int = 0  # bytes of a partial last line (not yet indexed)
    rows: list[Any] = field(default_factory=list)  # pyarrow Tables
    problems: ProblemList = field(default_factory=ProblemList)
    error: str | None = None  # the file could not be read at all (shown; retried when it changes)
    cached_at: float = 0.0
    dirty: bool = False
    grouped: bool = False  # span lines (OTel): a row covers several lines, so growth means indexing it again

    @property
    def nrows(self) -> int:
        return sum(t.num_rows for t in self.rows)


class _Bounded(io.RawIOBase):
    """``readline`` of a file up to ``limit`` bytes (what was there when it was looked at: a
    writer may be appending), counting line ends and bytes."""

    def __init__(self, f: Any, limit: int) -> None:
        self.f, self.left, self.ends, self.read_bytes, self.last_nl, self.line_start = f, limit, 0, 0, True, 0

    def readline(self, size: int = -1) -> bytes:  # type: ignore[override]
        if self.left <= 0:
            return b""
        size = self.left if size is None or size < 0 else min(size, self.left)
        b = self.f.readline(size)
        if self.last_nl:
            self.line_start = self.read_bytes
        self.left -= len(b)
        self.read_bytes += len(b)
        if b:
            self.last_nl = b.endswith(b"\n")
            self.ends += self.last_nl
        return b


# ---- other tools' rows: a hook the importers give the catalogue ---------------------------------------


class SpanRows(Protocol):
    """Span lines of one file (OTel), grouped by trace id while the file is indexed: one row per
    trace, made when the file has been read to its end."""

    traces: dict[str, Any]

    def add(self, d: dict[str, Any], line: int, offset: int, length: int) -> LoadProblem | None:
        """Count a span line's spans into their traces; the problem of a bad span line, or None."""
        ...

    def rows(self) -> list[tuple[dict[str, Any], int, int, int]]:
        """``(summary, first line, offset, length)`` per trace (the bytes from its first span's
        line to its last)."""
        ...


class ForeignRows(Protocol):
    """What a set needs to index and open rows of other tools' formats (see the module's
    docstring). :mod:`backend.importers` registers its implementation
    (``backend.importers.index.ImporterRows``) with :func:`register_foreign_rows` when imported.
    ``ctx`` is :meth:`context`'s object; ``context`` a function giving it (made only when needed:
    it may load the set's tokenizer)."""

    def context(self, path: str, tokenizer: str, bundle: Any) -> Any:
        """The import context rows of ``path`` are converted with: the set's tokenizer (``bundle``
        when the app gave one, else the profile named ``tokenizer``)."""
        ...

    def dump_summary(self, raw: bytes, path: str, line: int) -> dict[str, Any] | list[dict[str, Any]] | None:
        """The light summary (:data:`SUMMARY_COLUMNS`), or summaries, of a line of a rollout dump
        that is indexed without converting it (verl's, prime-rl's token exports, verifiers'
        episodes: no tokenizer), or None. Tried first on a line that names no ``format_version``."""
        ...

    def is_span_record(self, d: Any) -> bool:
        """Whether a parsed line is span data (its trace's row is made by :class:`SpanRows`)."""
        ...

    def span_rows(self) -> SpanRows:
        """A new accumulator for the span lines of one file."""
        ...

    def record_summaries(self, rec: Any, n: int, path: str, ctx: Any) -> list[dict[str, Any]] | LoadProblem | None:
        """The rows of a record (a JSONL line, a Parquet row) of another tool's per-record format,
        the problem that refuses it, or None when it is of no format the importers know."""
        ...

    def open_line(self, raw: bytes, n: int, row_id: str, path: str, context: Callable[[], Any]) -> Trace | LoadProblem | None:
        """The trace of a JSONL row our reader refused (``raw``: its bytes; a span trace's run from
        its first line to its last), or None when ``raw`` is not JSON (the reader's reason stands)."""
        ...

    def open_row(self, row: dict[str, Any], n: int, row_id: str, path: str, context: Callable[[], Any]) -> Trace | LoadProblem:
        """The trace of a Parquet row of another tool's format."""
        ...


# what a set lists for a record of another format when no ForeignRows is registered
NO_FOREIGN_ROWS = ("other tools' files need backend.importers, which is not loaded "
                   "(importing it registers their readers with backend.trace.catalog)")
_foreign: ForeignRows | None = None


def register_foreign_rows(rows: ForeignRows | None) -> None:
    """Give the catalogue the readers of other tools' rows (None: take them away). Sets opened
    after this index and open such rows; a cache entry records whether they were there when it
    was written, and is not used by a process where that differs."""
    global _foreign
    _foreign = rows


def foreign_rows() -> ForeignRows | None:
    """The registered readers of other tools' rows, or None."""
    return _foreign


def _unregistered(n: int, raw: bytes, refused: LoadProblem) -> LoadProblem:
    """A line our reader refused while no :class:`ForeignRows` is registered: a JSON object that
    is not one of our records (no ``format_version``) says what would read it."""
    d = parse_line(n, raw)
    if isinstance(d, dict) and "format_version" not in d:
        return LoadProblem(n, f"{refused.reason}; {NO_FOREIGN_ROWS}")
    return refused


_GROUPED = object()  # a span line: its trace's row is made when the file is read to its end
# how a span line starts (OTLP requests, SDK span JSON): such lines skip the parses for our traces
_SPAN_MARK = re.compile(rb'^\s*(?:\xef\xbb\xbf)?\{\s*"(?:resourceSpans|resource_spans|resourceLogs|resource_logs)"|"context"\s*:\s*\{\s*"trace_id"')


def _foreign_summaries(hook: ForeignRows, raw: bytes, path: str, line: int, offset: int, length: int, groups: SpanRows,
                       ctx: Any) -> Any:
    """Rows of a line of another tool's format: a list of summaries, :data:`_GROUPED` for a span
    line (added to ``groups``), a problem, or None."""
    try:
        d = _orjson.loads(raw.removeprefix(b"\xef\xbb\xbf")) if _orjson is not None else json.loads(raw.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):
        return None
    if hook.is_span_record(d):
        bad = groups.add(d, line, offset, length)
        return bad if bad is not None else _GROUPED
    return hook.record_summaries(d, line, path, ctx) or None


class _Rows:
    """Rows of one file collected as Python lists, turned into Arrow tables every
    :data:`_CHUNK_ROWS`."""

    def __init__(self, out: list[Any], path: str) -> None:
        self.out = out
        self.step = step_of_path(path)  # a verl dump's <step>.jsonl, where the metadata has no step
        self.cols: dict[str, list[Any]] = {c: [] for c in SUMMARY_COLUMNS + ["line", "offset", "length"]}
        self.n = 0

    def add(self, s: dict[str, Any], line: int, offset: int, length: int) -> None:
        cols = self.cols
        if s["training_step"] is None:
            s["training_step"] = self.step
        for c in SUMMARY_COLUMNS:
            cols[c].append(s.get(c) if c in RL_COLUMNS else s[c])
        cols["line"].append(line)
        cols["offset"].append(offset)
        cols["length"].append(length)
        self.n += 1
        if len(cols["id"]) >= _CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.cols["id"]:
            self.out.append(pa.table(self.cols, schema=_arrow_schema()))
            self.cols = {c: [] for c in self.cols}


# ---- the set --------------------------------------------------------------------------------------


class TraceSet(TraceIndex):
    """The index of the trace files a spec names (see the module's docstring). ``final``: the
    files are complete (a last line without its newline is indexed as it is, as a one-shot
    reader does); otherwise they may be being written (:meth:`refresh` follows them)."""

    def __init__(self, spec: str, *, final: bool = False, cache: str | None | bool = True,
                 tokenizer: str = "qwen3", import_bundle: Any = None) -> None:
        super().__init__()
        self.spec = spec
        # other tools' rows (a verl rollout dump ...) are converted when opened with this tokenizer: ``import_bundle``
        # (a function giving the bundle: the app's operator-chosen one) or the profile ``tokenizer``
        self.tokenizer = tokenizer
        self.import_bundle = import_bundle
        self._import_ctx: Any = None
        self.final = final
        self.cache = cache_dir() if cache is True else (cache or None)
        self.states: list[FileState] = []
        self.stats = {"hit": 0, "miss": 0, "grown": 0, "invalidated": 0, "scanned_bytes": 0}
        self.capped: str | None = None  # why some rows or files were not indexed (the set's limits)
        self._frames: list[Any] = []  # pandas frames appended since the last full frame
        self._df = None
        self._files_of: dict[str, int] = {}

    @classmethod
    def open_set(cls, spec: str, **kw: Any) -> TraceSet:
        """The set of ``spec``, indexed (from the cache where it can be)."""
        s = cls(spec, **kw)
        s.refresh()
        return s

    # -- building and following
    def refresh(self) -> int:
        """Look at the files again: index new ones, what was appended to grown ones, rewritten ones
        again; forget removed ones. Returns the number of rows added (or -1 when the index was
        rebuilt because a file shrank, changed or went away)."""
        paths = resolve(self.spec)
        if len(paths) > max_index_files():
            self.capped = f"{len(paths):,} files; at most {max_index_files():,} are indexed (ALI_MAX_INDEX_FILES)"
            paths = paths[: max_index_files()]
        rebuilt = False
        present = set(paths)
        if any(st.path not in present for st in self.states):
            self.states = [st for st in self.states if st.path in present]
            rebuilt = True
        known = {st.path: st for st in self.states}
        added = 0
        with no_gc():
            for p in paths:
                st = known.get(p)
                if st is None:
                    st = self._load_cached(p)
                    self.states.append(st)
                    known[p] = st
                    added += st.nrows
                    continue
                n = self._update(st)
                if n < 0:
                    rebuilt = True
                else:
                    added += n
        self._save_dirty(force=False)
        if rebuilt:
            self._reframe()
            return -1
        if added:
            self._extend()
        return added

    def flush(self) -> None:
        """Write every changed file's cache entry now."""
        self._save_dirty(force=True)

    def _total_rows(self) -> int:
        return sum(st.nrows for st in self.states)

    def _room(self) -> int:
        return max(0, max_index_rows() - self._total_rows())

    def _kind(self, path: str) -> str:
        return PARQUET if path.endswith(".parquet") else JSONL

    def _load_cached(self, path: str) -> FileState:
        """A file seen for the first time: from the cache when its entry is valid (then only what
        was appended is read), else indexed."""
        st = FileState(path, self._kind(path))
        cached = self._read_cache(path)
        if cached is not None:
            stat = os.stat(path)
            if cached.size == stat.st_size and cached.mtime_ns == stat.st_mtime_ns:
                self.stats["hit"] += 1
                if cached.pending and (self.final or time.time() - stat.st_mtime_ns / 1e9 >= SETTLE_S):
                    self._scan(cached, settle=True)  # cached while its last line had no newline
                return cached
            if cached.kind == JSONL and stat.st_size > cached.size and cached.fingerprint == _fingerprint(path, cached.done):
                try:
                    self._scan(cached)
                    self.stats["grown"] += 1
                    return cached
                except _Rewritten:
                    pass
            self.stats["invalidated"] += 1
        else:
            self.stats["miss"] += 1
        self._scan(st)
        return st

    def _update(self, st: FileState) -> int:
        """Rows added to a known file, or -1 when it had to be indexed again."""
        try:
            stat = os.stat(st.path)
        except OSError:
            return 0  # gone between the listing and now: the next refresh drops it
        if stat.st_size == st.size and stat.st_mtime_ns == st.mtime_ns:
            if st.pending and not self.final and time.time() - stat.st_mtime_ns / 1e9 >= SETTLE_S:
                before = st.nrows
                self._scan(st, settle=True)  # a last line without its newline, no longer written
                return st.nrows - before
            return 0
        if st.kind == JSONL and st.error is None and stat.st_size >= st.done and st.fingerprint == _fingerprint(st.path, st.done):
            before = st.nrows
            try:
                self._scan(st)
                return st.nrows - before
            except _Rewritten:
                pass
        fresh = FileState(st.path, st.kind)
        self._scan(fresh)
        self.states[self.states.index(st)] = fresh
        self.stats["invalidated"] += 1
        return -1

    def _scan(self, st: FileState, settle: bool = False) -> None:
        stat = os.stat(st.path)
        st.mtime_ns, st.dirty = stat.st_mtime_ns, True
        try:
            if st.kind == PARQUET:
                st.rows, st.problems, st.error = [], ProblemList(), None
                self._scan_parquet(st)
            else:
                self._scan_jsonl(st, stat.st_size, settle or self.final)
            st.error = None
        except TraceFileError as e:
            st.error = str(e)
            st.rows = []
        except OSError as e:
            st.error = f"{os.path.basename(st.path)} could not be read: {e.strerror or e}"
            st.rows = []
        st.size = stat.st_size if st.kind == PARQUET or st.error else st.size

    def _scan_jsonl(self, st: FileState, size: int, take_partial: bool) -> None:
        if st.grouped and st.done:  # a span file grew: its traces' rows are built from the whole file again
            st.rows, st.problems, st.done, st.lines, st.open_line, st.pending = [], ProblemList(), 0, 0, False, 0
        if st.done == 0:  # a new file: one reason when it is not JSONL at all, not one per line
            refuse_unless_jsonl(st.path, size, take_partial)
        rows = _Rows(st.rows, st.path)
        hook = _foreign
        groups = hook.span_rows() if hook is not None else None
        room = self._room()
        start = st.done
        with open(st.path, "rb") as fh:
            if st.open_line:  # the last line was indexed without its newline: only the newline may follow
                fh.seek(start)
                head = fh.read(2)
                if head[:1] == b"\n" or head == b"\r\n":
                    start += 1 if head[:1] == b"\n" else 2
                    st.open_line = False
                elif head:
                    raise _Rewritten()
            fh.seek(start)
            src = _Bounded(fh, size - start)
            capped = False
            for lineno, off, n, raw in read_lines(src):
                ln = st.lines + lineno
                dumped = False  # the line was given to hook.dump_summary already
                if not src.last_nl and off + n >= size - start and not take_partial:
                    break  # a line still being written: indexed once complete
                if hook is not None and not isinstance(raw, LoadProblem) and _SPAN_MARK.search(raw, 0, 256):  # span lines: parsed once
                    item = _foreign_summaries(hook, raw, st.path, ln, start + off, n, groups, self._context(st.path))  # type: ignore[arg-type]
                    if item is _GROUPED:
                        st.grouped = True
                        continue
                    if item is None:  # not JSON, or not spans after all: the reason our reader gives
                        item = summary_of_line(ln, raw)
                else:  # a line that names no format_version is not our trace's: a rollout dump's row is tried first
                    dumped = hook is not None and not isinstance(raw, LoadProblem) and b'"format_version"' not in raw
                    item = raw if isinstance(raw, LoadProblem) else (dumped and hook.dump_summary(raw, st.path, ln)) or summary_of_line(ln, raw)  # type: ignore[union-attr]
                items: list[dict[str, Any]] = []
                if isinstance(item, LoadProblem) and not isinstance(raw, LoadProblem):
                    if hook is None:  # our reader's reason, and what would read another tool's record
                        item = _unregistered(ln, raw, item)
                    else:
                        item = ((not dumped and hook.dump_summary(raw, st.path, ln))
                                or _foreign_summaries(hook, raw, st.path, ln, start + off, n, groups, self._context(st.path))  # type: ignore[arg-type]
                                or item)
                        if item is _GROUPED:
                            st.grouped = True
                            continue
                if isinstance(item, list):
                    items = item
                elif not isinstance(item, LoadProblem):
                    items = [item]
                if isinstance(item, LoadProblem):
                    st.problems.append(LoadProblem(ln, item.reason))
                elif rows.n + len(items) > room:
                    self.capped = f"at most {max_index_rows():,} traces are indexed (ALI_MAX_INDEX_ROWS)"
                    st.problems.append(LoadProblem(ln, f"line {ln:,} and after not indexed: {self.capped}"), force=True)
                    capped = True
                    break
                else:
                    for one in items:
                        rows.add(one, ln, start + off, n)
        if groups is not None and groups.traces:
            for summary, ln, off, n in groups.rows():
                if rows.n >= room:
                    self.capped = f"at most {max_index_rows():,} traces are indexed (ALI_MAX_INDEX_ROWS)"
                    st.problems.append(LoadProblem(ln, f"traces from line {ln:,} on not indexed: {self.capped}"), force=True)
                    break
                rows.add(summary, ln, off, n)
        rows.flush()
        if capped:  # nothing more of this file is read
            done, lines, st.pending, st.open_line = size, st.lines + src.ends, 0, False
        elif src.read_bytes and not src.last_nl and not take_partial:
            done, lines, st.pending = start + src.line_start, st.lines + src.ends, src.read_bytes - src.line_start
        else:
            tail = bool(src.read_bytes) and not src.last_nl
            done, lines, st.pending = start + src.read_bytes, st.lines + src.ends + tail, 0
            st.open_line = st.open_line or tail
        self.stats["scanned_bytes"] += size - st.done
        st.done, st.lines, st.size = done, lines, size
        st.fingerprint = _fingerprint(st.path, st.done)

    def _scan_parquet(self, st: FileState) -> None:
        import pyarrow.compute as pc

        pf = open_parquet(st.path)
        try:
            check_layout(pf, st.path)
        except TraceFileError as e:
            if _foreign is None:
                raise TraceFileError(f"{e}; {NO_FOREIGN_ROWS}") from None
            if self._scan_foreign_parquet(st, _foreign):  # another tool's rows (TRL completions ...)
                return
            raise
        names = set(pf.schema_arrow.names)
        text = [c for c in ("id", "termination_reason", "source", "steps", "messages", "tools", "metadata") if c in names]
        lists = [c for c in ("prompt_ids", "response_ids") if c in names]
        rows = _Rows(st.rows, st.path)
        room = self._room()
        first = 1
        limit = max_trace_text_bytes()
        for g in range(pf.num_row_groups):
            rg = pf.metadata.row_group(g)
            nrows = rg.num_rows
            if nrows <= 0:
                continue
            try:
                t = pf.read_row_group(g, columns=text + lists, use_threads=False)
                lens = {c: pc.list_value_length(t.column(c)).fill_null(0).to_pylist() for c in lists}
                sizes = None
                for c in text:
                    b = pc.binary_length(t.column(c)).fill_null(0)
                    sizes = b if sizes is None else pc.add(sizes, b)
                sizes_l = sizes.to_pylist() if sizes is not None else [0] * nrows
                vals = {c: t.column(c).to_pylist() for c in text}
            except Exception as e:  # pyarrow raises ArrowInvalid / OSError on a damaged row group
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                st.problems.append(LoadProblem(first, f"rows {first:,}-{first + nrows - 1:,} not read: {msg}"[:500]))
                first += nrows
                continue
            for i in range(nrows):
                n = first + i
                ntok = sum(lens[c][i] for c in lists)
                why = too_many_tokens(ntok) or (f"{sizes_l[i]:,} bytes of text in one row; the limit is {limit:,} "
                                                "(ALI_MAX_TRACE_TEXT_BYTES)" if sizes_l[i] > limit else None)
                if why:
                    st.problems.append(LoadProblem(n, why))
                    continue
                row = {c: vals[c][i] for c in text}
                row.update({c: [None] * 0 for c in lists})
                s = summary_of_parquet_row(n, row, {c: lens[c][i] for c in lists})
                if isinstance(s, LoadProblem) or s is None:
                    item = trace_of_row(n, parquet_row_at(st.path, n))  # for its reason
                    if isinstance(item, LoadProblem):
                        st.problems.append(item)
                        continue
                    s = summary_of_trace(item)
                if rows.n >= room:
                    self.capped = f"at most {max_index_rows():,} traces are indexed (ALI_MAX_INDEX_ROWS)"
                    st.problems.append(LoadProblem(n, f"row {n:,} and after not indexed: {self.capped}"), force=True)
                    rows.flush()
                    return
                rows.add(s, n, -1, -1)
            first += nrows
        rows.flush()
        self.stats["scanned_bytes"] += os.path.getsize(st.path)

    def _scan_foreign_parquet(self, st: FileState, hook: ForeignRows) -> bool:
        """Index a Parquet file of another tool's rows, one conversation per row (read with the
        bounded reader of uploads); False when its first row is of no known format."""
        rows = _Rows(st.rows, st.path)
        room = self._room()
        for n, _, rec in iter_records(sniff(st.path)):
            if isinstance(rec, LoadProblem):
                st.problems.append(rec)
                continue
            got = hook.record_summaries(rec, n, st.path, self._context(st.path))
            if got is None:
                if n == 1:
                    return False
                st.problems.append(LoadProblem(n, "a row of no known format"))
                continue
            if isinstance(got, LoadProblem):
                st.problems.append(got)
                continue
            if rows.n + len(got) > room:
                self.capped = f"at most {max_index_rows():,} traces are indexed (ALI_MAX_INDEX_ROWS)"
                st.problems.append(LoadProblem(n, f"row {n:,} and after not indexed: {self.capped}"), force=True)
                break
            for one in got:
                rows.add(one, n, -1, -1)
        rows.flush()
        self.stats["scanned_bytes"] += os.path.getsize(st.path)
        return True

    # -- cache entries
    def _read_cache(self, path: str) -> FileState | None:
        if not self.cache:
            return None
        cp = _cache_path(self.cache, path)
        if not os.path.exists(cp):
            return None
        try:
            import pyarrow.parquet as pq

            t = pq.read_table(cp)
            meta = json.loads((t.schema.metadata or {})[b"ali_index"])
            if meta.get("version") != SCHEMA_VERSION or meta.get("path") != path or t.schema.remove_metadata() != _arrow_schema():
                return None
            if bool(meta.get("foreign", True)) != (_foreign is not None):  # indexed with(out) other tools' readers
                return None
            st = FileState(path, meta["kind"], meta["size"], meta["mtime_ns"], meta["done"], meta["lines"], meta["open_line"],
                           meta["fingerprint"], meta.get("pending", 0), [t.replace_schema_metadata(None)] if t.num_rows else [])
            for line, reason in meta["problems"]:
                st.problems.append(LoadProblem(int(line), str(reason)))
            st.problems.unlisted = int(meta.get("unlisted", 0))
            st.error = meta.get("error")
            st.grouped = bool(meta.get("grouped"))
            st.cached_at = time.monotonic()
            return st
        except Exception:  # noqa: BLE001 - a damaged or foreign cache entry is a miss
            return None

    def _write_cache(self, st: FileState) -> None:
        if not self.cache:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = {"version": SCHEMA_VERSION, "path": st.path, "kind": st.kind, "size": st.size, "mtime_ns": st.mtime_ns,
                "done": st.done, "lines": st.lines, "open_line": st.open_line, "fingerprint": st.fingerprint,
                "pending": st.pending, "problems": [[p.line, p.reason] for p in st.problems],
                "unlisted": st.problems.unlisted, "error": st.error, "grouped": st.grouped, "foreign": _foreign is not None}
        t = pa.concat_tables(st.rows) if st.rows else _arrow_schema().empty_table()
        t = t.replace_schema_metadata({b"ali_index": json.dumps(meta).encode()})
        try:
            os.makedirs(self.cache, exist_ok=True)
            cp = _cache_path(self.cache, st.path)
            tmp = f"{cp}.{os.getpid()}.tmp"
            pq.write_table(t, tmp, compression="zstd")
            os.replace(tmp, cp)
            st.rows = [t.replace_schema_metadata(None)] if t.num_rows else []
        except OSError:
            pass  # a read-only cache folder: the index works without it
        st.cached_at, st.dirty = time.monotonic(), False

    def _save_dirty(self, force: bool) -> None:
        if self.cache and self.cache not in _pruned and any(st.dirty for st in self.states):
            _pruned.add(self.cache)  # once per process and folder, before its first write
            prune_cache(self.cache)
        now = time.monotonic()
        for st in self.states:
            if st.dirty and (force or not st.cached_at or now - st.cached_at >= CACHE_EVERY_S):
                self._write_cache(st)

    # -- rows
    def _frame_of(self, k: int, st: FileState, tables: Iterable[Any] | None = None) -> Any:
        import pandas as pd
        import pyarrow as pa

        tabs = list(st.rows if tables is None else tables)
        t = pa.concat_tables(tabs) if tabs else _arrow_schema().empty_table()
        df = t.to_pandas()
        for c in _TEXT:
            df[c] = pd.Series(t.column(c).to_pylist(), dtype=object, index=df.index)
        for c in ("training_step", "sample", "rank"):
            df[c] = df[c].astype("Int64")
        for c in _NULLABLE_INT[1:]:  # null only for verl rollout-dump rows (not tokenized when indexed)
            if t.column(c).null_count:
                df[c] = df[c].astype("Int64")
        df["file"] = k
        return df[INDEX_COLUMNS]

    def _reframe(self) -> None:
        import pandas as pd

        files = [IndexedFile(st.path, st.kind, "row" if st.kind == PARQUET else "line", st.problems) for st in self.states]
        frames = [self._frame_of(k, st) for k, st in enumerate(self.states)]
        df = pd.concat(frames, ignore_index=True) if frames else self._frame_of(0, FileState("", JSONL))
        self._seen = [st.nrows for st in self.states]
        # other threads read while a set is refreshed: what a row's number means is replaced last
        self.files = files
        self._publish(df)

    def _extend(self) -> None:
        """Append the rows added since the last frame (new files, grown files)."""
        import pandas as pd
        import pyarrow as pa

        if self._df is None:
            return self._reframe()
        new = []
        for k, st in enumerate(self.states):
            if k >= len(self._seen):
                self.files.append(IndexedFile(st.path, st.kind, "row" if st.kind == PARQUET else "line", st.problems))
                self._seen.append(0)
            self.files[k].problems = st.problems
            if st.nrows > self._seen[k]:
                t = pa.concat_tables(st.rows).slice(self._seen[k])
                new.append(self._frame_of(k, st, [t]))
                self._seen[k] = st.nrows
        if new:
            self._publish(pd.concat([self._df, *new], ignore_index=True))
        return None

    def _publish(self, df: Any) -> None:
        """Make ``df`` the rows: the locations first, then the frame (a reader holding the new
        frame finds its rows' locations)."""
        self._loc = (df["file"].to_numpy(), df["line"].to_numpy(), df["offset"].to_numpy(), df["length"].to_numpy())
        self._ids = None
        self._df = df

    # -- reading (TraceIndex's interface)
    def __len__(self) -> int:
        return 0 if self._df is None else len(self._df)

    @property
    def df(self) -> Any:
        if self._df is None:
            self._reframe()
        return self._df

    def frame(self) -> Any:
        """The rows as a pandas DataFrame with :data:`INDEX_COLUMNS` (a copy)."""
        return self.df.copy()

    @property
    def cols(self) -> dict[str, list[Any]]:  # type: ignore[override]
        df = self.df
        return {c: df[c].tolist() for c in INDEX_COLUMNS}

    @cols.setter
    def cols(self, value: Any) -> None:  # TraceIndex.__init__ sets it; a set keeps its rows in frames
        pass

    @property
    def pending_lines(self) -> int:
        """Files whose last line is still being written."""
        return sum(1 for st in self.states if st.pending)

    @property
    def file_errors(self) -> list[tuple[str, str]]:
        return [(st.path, st.error) for st in self.states if st.error]

    @property
    def bytes(self) -> int:
        return sum(st.size for st in self.states)

    def problem_rows(self, limit: int = 1000) -> list[tuple[str, int, str]]:
        """``(file, line, reason)`` of the bad records, the first ``limit``."""
        out = []
        for st in self.states:
            if st.error:
                out.append((st.path, 0, st.error))
            for p in st.problems:
                if len(out) >= limit:
                    return out
                out.append((st.path, p.line, p.reason))
        return out

    def row_of(self, key: int | str) -> int:
        if isinstance(key, str):
            if self._ids is None:
                ids = self.df["id"].tolist()
                self._ids = {v: i for i, v in enumerate(ids)}  # the newest row of an id wins
            if key not in self._ids:
                raise KeyError(f"no trace with id {key!r}")
            return self._ids[key]
        if not 0 <= key < len(self):
            raise IndexError(f"row {key} is out of range (0..{len(self) - 1})")
        return int(key)

    def read(self, key: int | str) -> Trace | LoadProblem:
        i = self.row_of(key)
        fk, n, off, length = (int(a[i]) for a in self._loc)
        f = self.files[fk]
        path: str = f.path  # type: ignore[assignment]
        hook = _foreign
        if f.kind == PARQUET:
            row = parquet_row_at(path, n)
            item = trace_of_row(n, row)
            if isinstance(item, LoadProblem) and "format_version" not in row:
                if hook is None:
                    return LoadProblem(n, f"{item.reason}; {NO_FOREIGN_ROWS}")
                return hook.open_row(row, n, str(self.df["id"].iat[i]), path, lambda: self._context(path))
            return item
        with open(path, "rb") as fh:
            fh.seek(off)
            raw = fh.read(length)
        first = raw.split(b"\n", 1)[0].removeprefix(b"\xef\xbb\xbf")
        item = trace_of(n, parse_line(n, first))
        if not isinstance(item, LoadProblem):
            return item
        if hook is None:
            return _unregistered(n, first, item)
        got = hook.open_line(raw, n, str(self.df["id"].iat[i]), path, lambda: self._context(path))
        return item if got is None else got

    def _context(self, path: str) -> Any:
        """The import context of the set's rows of other tools' formats (made once: the app's
        tokenizer bundle, or the profile ``tokenizer``)."""
        if self._import_ctx is None:
            bundle = self.import_bundle() if self.import_bundle is not None else None
            self._import_ctx = _foreign.context(path, getattr(bundle, "name", None) or self.tokenizer, bundle)  # type: ignore[union-attr]
        return self._import_ctx

    def open(self, key: int | str) -> Trace:
        item = self.read(key)
        if isinstance(item, LoadProblem):
            unit = self.files[int(self._loc[0][self.row_of(key)])].unit
            raise TraceFormatError(f"{unit} {item.line}: {item.reason}")
        return item

    def location(self, key: int | str) -> tuple[str, int]:
        """``(file path, line or row)`` of a row."""
        i = self.row_of(key)
        return self.files[int(self._loc[0][i])].path or "", int(self._loc[1][i])


class _Rewritten(Exception):
    """A file's indexed bytes changed: index it again."""


def iter_set_traces(ts: TraceSet, rows: Iterable[int] | None = None) -> Iterator[tuple[int, Trace | LoadProblem]]:
    """``(row, trace or problem)`` for rows of a set (all by default), each read by its bytes."""
    for i in range(len(ts)) if rows is None else rows:
        yield i, ts.read(i)


class SetRegistry:
    """The trace sets an app serves, shared by its sessions: each spec indexed once, refreshed at
    most every ``min_interval`` seconds whoever asks (one refresh at a time per set; a caller that
    finds one under way gets the rows as they are), the ``max_sets`` most recently used kept."""

    def __init__(self, max_sets: int = 4, min_interval: float = 0.5) -> None:
        import threading

        self.max_sets, self.min_interval = max_sets, min_interval
        self.import_bundle: Any = None  # the tokenizer bundle other tools' rows are opened with (TraceSet)
        self._lock = threading.Lock()
        self._sets: dict[str, dict[str, Any]] = {}

    @staticmethod
    def key(spec: str) -> str:
        spec = os.path.expanduser(str(spec).strip())
        return spec if glob.has_magic(spec) else os.path.abspath(spec)

    def _entry(self, spec: str) -> dict[str, Any]:
        import threading

        k = self.key(spec)
        with self._lock:
            e = self._sets.pop(k, None)
            if e is None:
                e = {"set": None, "lock": threading.Lock(), "at": 0.0, "version": 0, "error": None}
            self._sets[k] = e  # most recently used last
            while len(self._sets) > self.max_sets:
                self._sets.pop(next(iter(self._sets)))
        return e

    def get(self, spec: str, *, final: bool = False) -> tuple[TraceSet, int]:
        """``(set, version)``, indexing it first if it is new (blocking); ``version`` changes
        whenever its rows do. Raises :class:`TraceFileError` when the spec names nothing."""
        e = self._entry(spec)
        with e["lock"]:
            if e["set"] is None:
                resolve(spec)  # a clear error for a spec that names nothing
                e["set"] = TraceSet.open_set(self.key(spec), final=final, import_bundle=self.import_bundle)
                e["at"], e["version"] = time.monotonic(), e["version"] + 1
        return e["set"], e["version"]

    def poll(self, spec: str) -> tuple[TraceSet, int]:
        """``(set, version)`` after a refresh if the last one is older than ``min_interval`` (the
        set is indexed first if it is new); the rows as they are while another caller refreshes."""
        e = self._entry(spec)
        if e["set"] is None:
            return self.get(spec)
        if not e["lock"].acquire(blocking=False):
            return e["set"], e["version"]
        try:
            if time.monotonic() - e["at"] >= self.min_interval:
                try:
                    if e["set"].refresh():
                        e["version"] += 1
                    e["error"] = None
                except TraceFileError as err:  # the folder went away: keep the rows, say why
                    e["error"] = str(err)
                e["at"] = time.monotonic()
            return e["set"], e["version"]
        finally:
            e["lock"].release()

    def error(self, spec: str) -> str | None:
        e = self._sets.get(self.key(spec))
        return e["error"] if e else None
