"""The trace table the UI lists: one row per trace, built fast, and each trace opened on demand.

Building the table does not validate every trace into a pydantic model (that is what makes a
100 MB file slow); it parses each JSONL line once with ``json.loads``, takes the few numbers a
row needs, and remembers the line's byte offset and length. Opening a trace seeks to its line
and validates just that one (``Trace.from_json``), so a bad record is reported when opened, with
its line number. Columns:

``id, source, turns, tokens, prompt_tokens, response_tokens, termination_reason, errors,
messages, tools, duration_s, line, offset, length``

``errors`` counts what :meth:`backend.trace.Trace.step_errors` counts (parse errors, step errors,
failed tool results). Parquet trace files (``backend.export``) and JSON documents are supported
too (their rows open by index).
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass, field
from typing import Any

from backend.trace import LoadProblem, Trace, TraceFileError, TraceFormatError, Refused, line_too_long, parse_json_record

COLUMNS = [
    "id", "source", "turns", "tokens", "prompt_tokens", "response_tokens", "termination_reason", "errors",
    "messages", "tools", "duration_s", "line", "offset", "length",
]


def row_from_dict(d: dict[str, Any]) -> dict[str, Any]:
    """The table row of one trace record (a parsed JSON object), without validating it."""
    steps = d.get("steps") or []
    turns = 0
    errors = 0
    for s in steps:
        if not isinstance(s, dict):
            continue
        if s.get("state") == "generating":
            turns += 1
        pe = s.get("parse_errors")
        if isinstance(pe, list):  # warnings (a repaired call) are not errors
            errors += sum(1 for e in pe if not (isinstance(e, dict) and e.get("severity") == "warning"))
        if s.get("error"):
            errors += 1
        for r in s.get("tool_results") or ():
            if isinstance(r, dict) and r.get("ok") is False:
                errors += 1
    msgs = d.get("messages") or []
    if not turns:
        turns = sum(1 for m in msgs if isinstance(m, dict) and m.get("role") == "assistant")
    meta = d.get("metadata") or {}
    p = len(d.get("prompt_ids") or ())
    r = len(d.get("response_ids") or ())
    dur = meta.get("duration_s") if isinstance(meta, dict) else None
    return {
        "id": str(d.get("id")),
        "source": meta.get("source") if isinstance(meta, dict) else None,
        "turns": turns,
        "tokens": p + r,
        "prompt_tokens": p,
        "response_tokens": r,
        "termination_reason": d.get("termination_reason"),
        "errors": errors,
        "messages": len(msgs),
        "tools": len(d.get("tools") or ()),
        "duration_s": float(dur) if isinstance(dur, (int, float)) else None,
    }


def row_from_trace(t: Trace) -> dict[str, Any]:
    dur = t.metadata.get("duration_s")
    return {
        "id": t.id,
        "source": t.metadata.get("source"),
        "turns": t.num_turns,
        "tokens": len(t.prompt_ids) + len(t.response_ids),
        "prompt_tokens": len(t.prompt_ids),
        "response_tokens": len(t.response_ids),
        "termination_reason": t.termination_reason,
        "errors": t.step_errors(),
        "messages": len(t.messages),
        "tools": len(t.tools),
        "duration_s": float(dur) if isinstance(dur, (int, float)) else None,
    }


def _frame(rows: dict[str, list[Any]]):
    import pandas as pd

    ints = ("turns", "tokens", "prompt_tokens", "response_tokens", "errors", "messages", "tools", "line", "offset", "length")
    data = {}
    for c in COLUMNS:
        if c in ints:
            data[c] = pd.Series(rows[c], dtype="int64")
        elif c == "duration_s":
            data[c] = pd.Series([float("nan") if v is None else v for v in rows[c]], dtype="float64")
        else:  # text columns keep None (not NaN) for a missing value
            data[c] = pd.Series(rows[c], dtype=object)
    return pd.DataFrame(data, columns=COLUMNS)


@dataclass
class TraceTable:
    """The table (``df``, a pandas DataFrame with :data:`COLUMNS`), the records that could not
    be read at all (``problems``), and how to open each row."""

    path: str | None
    df: Any
    problems: list[LoadProblem] = field(default_factory=list)
    kind: str = "jsonl"  # jsonl | parquet | memory
    _traces: list[Trace] | None = None  # kind == "memory"

    def __len__(self) -> int:
        return len(self.df)

    def row_of(self, key: int | str) -> int:
        """Row number of a row number or a trace id."""
        if isinstance(key, str):
            hits = self.df.index[self.df["id"] == key]
            if len(hits) == 0:
                raise KeyError(f"no trace with id {key!r}")
            return int(hits[-1])  # the newest (a resumed rollout may repeat an id)
        if not 0 <= key < len(self.df):
            raise IndexError(f"row {key} is out of range (0..{len(self.df) - 1})")
        return int(key)

    def open(self, key: int | str) -> Trace:
        """The full, validated trace of a row (by row number or id)."""
        i = self.row_of(key)
        if self.kind == "memory":
            assert self._traces is not None
            return self._traces[i]
        if self.kind == "parquet":
            return _open_parquet_row(self.path, int(self.df.at[i, "line"]) - 1)  # rows of bad records are not listed
        off, n, line = (int(self.df.at[i, c]) for c in ("offset", "length", "line"))
        with open(self.path, "rb") as f:  # type: ignore[arg-type]
            f.seek(off)
            raw = f.read(n)
        try:
            return Trace.from_json(raw)
        except TraceFormatError as e:
            raise TraceFormatError(f"line {line}: {e}") from None


def build_table(path: str) -> TraceTable:
    """The table of a trace file (.jsonl, .json or .parquet)."""
    from backend.trace.io import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_LINE_BYTES, check_file_size

    if not os.path.exists(path):
        raise TraceFileError(f"file not found: {path}")
    check_file_size(path, DEFAULT_MAX_FILE_BYTES)
    if path.endswith(".parquet"):
        return _parquet_table(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\x00" in head:
        raise TraceFileError(f"{os.path.basename(path)} looks like a binary file, not JSON/JSONL text")
    if head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[") or path.endswith(".json"):
        from backend.trace import load_traces

        res = load_traces(path)
        if res.traces or res.problems:
            return table_from_traces(res.traces, res.problems, lines=res.lines, path=path)
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    problems: list[LoadProblem] = []
    gc_was = gc.isenabled()
    gc.disable()  # the loop allocates many short-lived objects and keeps none: no cycles to find
    try:
        with open(path, "rb") as f:
            _scan(f, cols, problems, DEFAULT_MAX_LINE_BYTES)
    finally:
        if gc_was:
            gc.enable()
    return TraceTable(path, _frame(cols), problems, "jsonl")


_ID_KEYS = (b'"prompt_ids":[', b'"response_ids":[', b'"response_mask":[')


def _loads_light(raw: bytes) -> tuple[Any, dict[str, int] | None]:
    """``json.loads`` of a trace line without building its token-id lists (the bulk of a trace):
    each top-level id list is cut out of the bytes and counted (commas + 1). Used only when each
    key occurs exactly once in the line and the parsed object then has it as an empty list, which
    proves the cut list was the top-level one; otherwise a plain ``json.loads``."""
    spans: list[tuple[int, int, str]] = []
    for key in _ID_KEYS:
        if raw.count(key) != 1:
            return json.loads(raw), None
        a = raw.find(key) + len(key)
        b = raw.find(b"]", a)
        if b < 0:
            return json.loads(raw), None
        spans.append((a, b, key[1:-3].decode()))
    spans.sort()
    parts = []
    pos = 0
    for a, b, _ in spans:
        if a < pos:
            return json.loads(raw), None
        parts.append(raw[pos:a])
        pos = b
    parts.append(raw[pos:])
    d = json.loads(b"".join(parts))
    if not isinstance(d, dict):
        return d, None
    counts: dict[str, int] = {}
    for a, b, name in spans:
        if d.get(name) != []:
            return json.loads(raw), None
        counts[name] = raw.count(b",", a, b) + 1 if raw[a:b].strip() else 0
    return d, counts


def _scan(f, cols: dict[str, list[Any]], problems: list[LoadProblem], max_line: int) -> None:
    offset = 0
    lineno = 0
    readline = f.readline
    while True:
        raw = readline(max_line + 1)  # never more than the limit in memory, however long the line
        if not raw:
            break
        lineno += 1
        n = len(raw)
        start = offset
        if n > max_line:
            if not raw.endswith(b"\n"):
                raw = b""
                while True:  # drain the rest of the line without keeping it
                    chunk = readline(1 << 20)
                    n += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
            offset += n
            problems.append(LoadProblem(lineno, line_too_long(n, max_line)))
            continue
        offset += n
        if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark: ignored, as load_traces does
            raw = raw[3:]
            if not raw:
                continue
        if raw.isspace():
            continue
        try:
            d, counts = _loads_light(raw)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, >4300-digit ints
            # the full parser's verdict and words: the light parse cut the id lists out, so its
            # error positions are not the line's, and a "]" inside a string in an id list (a bad
            # record, but a JSON one) makes the cut itself invalid
            d, counts = parse_json_record(raw), None
            if isinstance(d, Refused):
                problems.append(LoadProblem(lineno, d.reason))
                continue
        if not isinstance(d, dict) or "id" not in d or "format_version" not in d:
            try:
                Trace.from_dict(d)  # raises with the reason load_traces gives
                why = "not a trace record"
            except TraceFormatError as e:
                why = str(e)
            problems.append(LoadProblem(lineno, why))
            continue
        try:
            row = row_from_dict(d)
        except (TypeError, AttributeError, ValueError) as e:
            problems.append(LoadProblem(lineno, f"not a trace: {e}"))
            continue
        if counts is not None:
            row["prompt_tokens"] = counts["prompt_ids"]
            row["response_tokens"] = counts["response_ids"]
            row["tokens"] = row["prompt_tokens"] + row["response_tokens"]
        for k, v in row.items():
            cols[k].append(v)
        cols["line"].append(lineno)
        cols["offset"].append(start)
        cols["length"].append(n)


def table_from_traces(traces: list[Trace], problems: list[LoadProblem] | None = None, *, lines: list[int] | None = None, path: str | None = None) -> TraceTable:
    """A table over traces already in memory (a LoadResult, a live run)."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for i, t in enumerate(traces):
        for k, v in row_from_trace(t).items():
            cols[k].append(v)
        cols["line"].append(lines[i] if lines and i < len(lines) else i + 1)
        cols["offset"].append(-1)
        cols["length"].append(-1)
    return TraceTable(path, _frame(cols), list(problems or []), "memory", list(traces))


def _parquet_table(path: str) -> TraceTable:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from backend.export import PARQUET_KIND

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a file that is not Parquet
        raise TraceFileError(f"{os.path.basename(path)} is not a readable Parquet file: {str(e).splitlines()[0]}") from None
    if (pf.schema_arrow.metadata or {}).get(b"kind") != PARQUET_KIND:
        raise TraceFileError(f"{os.path.basename(path)} is not a trace Parquet file; import it with python -m backend import")
    t = pf.read(columns=["id", "source", "termination_reason", "prompt_ids", "response_ids", "steps", "messages", "tools", "metadata"])
    p = pc.list_value_length(t["prompt_ids"]).to_pylist()
    r = pc.list_value_length(t["response_ids"]).to_pylist()
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    ids = t["id"].to_pylist()
    src = t["source"].to_pylist()
    term = t["termination_reason"].to_pylist()
    steps = t["steps"].to_pylist()
    msgs = t["messages"].to_pylist()
    tools = t["tools"].to_pylist()
    metas = t["metadata"].to_pylist()
    problems: list[LoadProblem] = []
    for i in range(t.num_rows):
        try:
            d = {"id": ids[i], "steps": json.loads(steps[i] or "[]"), "messages": json.loads(msgs[i] or "[]"), "tools": json.loads(tools[i] or "[]"), "metadata": json.loads(metas[i] or "{}"), "termination_reason": term[i]}
            row = row_from_dict(d)
        except (ValueError, TypeError, AttributeError, RecursionError) as e:  # a corrupted row: report it, list the rest
            problems.append(LoadProblem(i + 1, f"bad row: {e}"[:300]))
            continue
        row["source"] = src[i] if src[i] is not None else row["source"]
        row["prompt_tokens"], row["response_tokens"] = p[i] or 0, r[i] or 0
        row["tokens"] = row["prompt_tokens"] + row["response_tokens"]
        for k, v in row.items():
            cols[k].append(v)
        cols["line"].append(i + 1)
        cols["offset"].append(-1)
        cols["length"].append(-1)
    return TraceTable(path, _frame(cols), problems, "parquet")


def _open_parquet_row(path: str | None, i: int) -> Trace:
    import pyarrow.parquet as pq

    from backend.export import _trace_from_row

    pf = pq.ParquetFile(path)
    # find the row group holding row i
    start = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if i < start + n:
            rows = pf.read_row_group(g).slice(i - start, 1).to_pylist()
            return _trace_from_row(rows[0])
        start += n
    raise IndexError(f"row {i} is out of range")
