"""The lazy index of trace files: one row per trace, each opened by reading only its bytes.

* :class:`TraceIndex`: one row per trace over a list of files, with its summary
  (:data:`SUMMARY_COLUMNS`) and where it is (:data:`INDEX_COLUMNS`: file, line or row, byte offset
  and length), built in one streaming pass over the readers of :mod:`backend.trace.io`;
  :meth:`TraceIndex.open` reads only that trace's bytes (the Trace files tab lists it).
  :class:`IndexedFile` is one file of it. :class:`backend.trace.catalog.TraceSet` builds one
  over a folder or glob (cached on disk, followed while written).
* The summary of a row: :func:`summary_of_trace` (a trace), :func:`summary_of_record` (a parsed
  record, not validated), :func:`summary_of_line` (a JSONL line, parsed lightly: the token-id
  lists are cut out and counted), :func:`summary_of_parquet_row` (a row of our Parquet layout),
  and what they read: :func:`training_step_of`, :func:`step_of_path`, :func:`preview_text`.

Everything a caller uses is re-exported by :mod:`backend.trace`.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.trace import io as trace_io  # read_lines through the module: the one line reader, patched or not
from backend.trace.io import (
    JSON,
    JSONL,
    PARQUET,
    Source,
    check_layout,
    collect,
    iter_records,
    iter_traces,
    no_gc,
    open_parquet,
    parquet_row_at,
    parse_line,
    sniff,
    trace_of,
    trace_of_row,
)
from backend.trace.limits import (
    LoadProblem,
    LoadResult,
    ProblemList,
    max_traces_per_file,
    not_read,
    record_tokens_problem,
    too_many_tokens,
)
from backend.trace.model import StepState, Trace, TraceFormatError

# The summary of a trace, then where it is: ``file`` (position in TraceIndex.files), ``line`` (the
# record's number: line, row or list index + 1), ``offset`` / ``length`` (JSONL: the line's bytes;
# traces held in memory: offset is the position among them; Parquet: -1, the row group is found
# from the row number)
SUMMARY_COLUMNS = [
    "id", "source", "turns", "tokens", "prompt_tokens", "response_tokens", "termination_reason", "errors",
    "messages", "tools", "duration_s", "score", "preview", "training_step", "tool_errors", "parse_errors",
    "group", "sample", "rank",
]
INDEX_COLUMNS = [*SUMMARY_COLUMNS, "file", "line", "offset", "length"]
_INT_COLUMNS = ("turns", "tokens", "prompt_tokens", "response_tokens", "errors", "messages", "tools", "tool_errors",
                "parse_errors", "file", "line", "offset", "length")
_FLOAT_COLUMNS = ("duration_s", "score")
_NULLABLE_INT_COLUMNS = ("training_step", "sample", "rank")  # pandas "Int64": missing is <NA>
# the RL columns (docs/trace-formats.md, "RL rollout files"): the GRPO group id, the sample's index
# in it, the trainer rank; a row builder that does not know them leaves them None
RL_COLUMNS = ("group", "sample", "rank")
GROUP_KEYS = ("group", "uid")  # the group id: the RL convention's, then verl's prompt uid
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


def group_id_of(meta: Any) -> str | None:
    """The group id a trace's metadata names: ``group`` as written, else verl's ``uid`` as
    ``uid-<uid>`` (:data:`GROUP_KEYS`; backend/checks/groups.py groups by it), else None."""
    if isinstance(meta, dict):
        for k in GROUP_KEYS:
            v = meta.get(k)
            if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v) != "":
                return str(v) if k == "group" else f"{k}-{v}"
    return None


def _int_of(meta: Any, key: str) -> int | None:
    v = meta.get(key) if isinstance(meta, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def rl_columns(meta: Any) -> dict[str, Any]:
    """:data:`RL_COLUMNS` of a trace's metadata."""
    return {"group": group_id_of(meta), "sample": _int_of(meta, "sample"), "rank": _int_of(meta, "rank")}


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
        **rl_columns(t.metadata),
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
        "tool_errors": tool_errors, "parse_errors": parse_errors, **rl_columns(meta),
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
            cols[c].append(summary.get(c) if c in RL_COLUMNS else summary[c])
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
                for lineno, off, n, raw in trace_io.read_lines(fh):
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

