"""Write traces to other formats, read our Parquet back, and load any trace file.

* ``jsonl`` — our trace format, one trace per line (:func:`backend.trace.write_jsonl`).
* ``parquet`` — one row per trace; token ids and mask as native integer list columns, every
  nested field (messages, tools, steps, message spans, config, tokenizer, metadata, and any
  unknown extra keys) as a JSON string column. Loss-less: :func:`read_parquet_traces` gives
  traces equal to the ones written.
* ``hf`` — ``{"id", "messages", "tools"}`` JSONL rows for SFT/chat-template training (tool-call
  arguments as objects, as HF templates expect).
* ``verl`` — ``{"id", "prompt_ids", "response_ids", "response_mask", ...}`` rows as verl's agent
  loop produces them (JSONL, or Parquet when the output name ends in ``.parquet``).

:func:`load_any` is what the UI calls: ``.jsonl`` / ``.json`` / ``.parquet`` → :class:`LoadResult`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from backend.trace import LoadProblem, LoadResult, StepState, Trace, TraceFileError, TraceFormatError, load_traces, write_jsonl

EXPORT_FORMATS = ("jsonl", "parquet", "hf", "verl")
PARQUET_KIND = b"agent-loop-inspector/trace"
PARQUET_VERSION = b"1"

_ID_COLUMNS = ("prompt_ids", "response_ids", "response_mask")
_SCALAR_COLUMNS = ("format_version", "id", "termination_reason")
_JSON_COLUMNS = ("messages", "tools", "steps", "message_spans", "config", "tokenizer", "metadata")


class ExportError(ValueError):
    pass


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


# ---- Parquet ------------------------------------------------------------------------------------


def _parquet_schema():
    import pyarrow as pa

    fields = [
        pa.field("format_version", pa.int32()),
        pa.field("id", pa.string()),
        pa.field("termination_reason", pa.string()),
        pa.field("source", pa.string()),  # metadata.source, duplicated for filtering; not read back
        pa.field("prompt_ids", pa.list_(pa.int64())),
        pa.field("response_ids", pa.list_(pa.int64())),
        pa.field("response_mask", pa.list_(pa.int8())),
    ]
    fields += [pa.field(c, pa.string()) for c in _JSON_COLUMNS]
    fields.append(pa.field("extra", pa.string()))  # unknown top-level keys, as JSON (null if none)
    return pa.schema(fields, metadata={b"kind": PARQUET_KIND, b"version": PARQUET_VERSION})


def _row(t: Trace) -> dict[str, Any]:
    d = t.to_dict()
    row: dict[str, Any] = {c: d.pop(c) for c in _SCALAR_COLUMNS}
    for c in _ID_COLUMNS:
        row[c] = d.pop(c)
    for c in _JSON_COLUMNS:
        row[c] = _dumps(d.pop(c))
    src = t.metadata.get("source") if isinstance(t.metadata, dict) else None
    row["source"] = src if isinstance(src, str) else None
    row["extra"] = _dumps(d) if d else None
    return row


def write_parquet(traces: Iterable[Trace], path: str, *, batch_rows: int = 512) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover
        raise ExportError("Parquet export needs pyarrow (pip install pyarrow)") from e
    schema = _parquet_schema()
    tmp = path + ".tmp"
    n = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        buf: list[dict[str, Any]] = []
        for t in traces:
            buf.append(_row(t))
            n += 1
            if len(buf) >= batch_rows:
                w.write_table(pa.Table.from_pylist(buf, schema=schema))
                buf = []
        if buf or n == 0:
            w.write_table(pa.Table.from_pylist(buf, schema=schema))
    os.replace(tmp, path)
    return n


def _trace_from_row(row: dict[str, Any]) -> Trace:
    d: dict[str, Any] = {}
    extra = row.get("extra")
    if extra:
        d.update(json.loads(extra))
    for c in _SCALAR_COLUMNS:
        if row.get(c) is not None:
            d[c] = row[c]
    for c in _ID_COLUMNS:
        v = row.get(c)
        d[c] = list(v) if v is not None else []
    for c in _JSON_COLUMNS:
        v = row.get(c)
        if v is not None:
            d[c] = json.loads(v)
    return Trace.from_dict(d)


def is_trace_parquet(path: str) -> bool:
    import pyarrow.parquet as pq

    try:
        md = pq.read_schema(path).metadata or {}
    except Exception:
        return False
    return md.get(b"kind") == PARQUET_KIND


def read_parquet_traces(path: str) -> LoadResult:
    """Read a Parquet file written by :func:`write_parquet`. Bad rows are reported by row number
    (1-based), the rest load; rows over the token limits are reported without being decoded
    (:mod:`backend.parquet_limits`). A Parquet file in another layout raises :class:`TraceFileError`
    with a hint to import it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover
        raise TraceFileError("reading Parquet needs pyarrow (pip install pyarrow)") from e
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise TraceFileError(f"{os.path.basename(path)} is not a readable Parquet file: {str(e).splitlines()[0]}") from None
    md = pf.schema_arrow.metadata or {}
    if md.get(b"kind") != PARQUET_KIND:
        cols = set(pf.schema_arrow.names)
        if not {"id", "messages", "steps"} <= cols:
            hint = ""
            try:
                from backend.importers import detect

                fmt = detect(path)
                if fmt and fmt != "trace":
                    hint = f"; it looks like {fmt} data: python -m backend import --from {fmt} {path} --out TRACES.jsonl"
            except Exception:
                pass
            raise TraceFileError(f"{os.path.basename(path)} is not a trace Parquet file (columns: {', '.join(sorted(cols)[:8])}){hint}")
    from backend.parquet_limits import iter_parquet_rows

    res = LoadResult()
    for n, row in iter_parquet_rows(pf, path):  # bounded: token and list-value limits checked before decoding
        if res.full:
            res.stop_reading(n, "row")
            break
        if isinstance(row, LoadProblem):
            res.problems.append(row)
            continue
        try:
            res.traces.append(_trace_from_row(row))
            res.lines.append(n)
        except (TraceFormatError, json.JSONDecodeError, TypeError, ValueError) as e:
            res.problems.append(LoadProblem(n, f"bad row: {e}"))
    return res


# ---- HF / verl ----------------------------------------------------------------------------------

_HF_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


def hf_row(t: Trace) -> dict[str, Any]:
    """``{"id", "messages", "tools"}`` for training: only the keys chat templates read."""
    msgs = []
    for m in t.messages:
        mm = {k: m[k] for k in _HF_MESSAGE_KEYS if k in m and m[k] is not None}
        if "content" not in mm:
            mm["content"] = ""
        if "tool_calls" in mm:
            calls = []
            for c in mm["tool_calls"]:
                fn = dict(c.get("function", {}))
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        pass  # kept as written; diagnostics report it
                call = {"type": "function", "function": fn}
                if c.get("id"):
                    call["id"] = c["id"]
                calls.append(call)
            mm["tool_calls"] = calls
        msgs.append(mm)
    return {"id": t.id, "messages": msgs, "tools": list(t.tools)}


def verl_row(t: Trace) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": t.id,
        "prompt_ids": list(t.prompt_ids),
        "response_ids": list(t.response_ids),
        "response_mask": list(t.response_mask),
        "num_turns": t.num_turns,
        "termination_reason": t.termination_reason,
    }
    for k in ("reward_score", "score"):
        if k in t.metadata:
            row[k] = t.metadata[k]
    lps: list[float] = []
    have_lp = True
    for s in t.steps:
        if s.end > s.start and s.start >= len(t.prompt_ids):
            if s.state == StepState.GENERATING and s.logprobs is not None and len(s.logprobs) == s.end - s.start:
                lps.extend(s.logprobs)
            elif s.state == StepState.GENERATING:
                have_lp = False
            else:
                lps.extend([0.0] * (s.end - s.start))
    if have_lp and lps and len(lps) == len(t.response_ids):
        row["response_logprobs"] = lps
    return row


def _write_jsonl_rows(rows: Iterable[dict[str, Any]], path: str) -> int:
    tmp = path + ".tmp"
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False))
            f.write("\n")
            n += 1
    os.replace(tmp, path)
    return n


def _write_rows_parquet(rows: Iterable[dict[str, Any]], path: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    table = pa.Table.from_pylist(rows) if rows else pa.table({"id": pa.array([], pa.string())})
    tmp = path + ".tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return len(rows)


def export_traces(traces: Iterable[Trace], fmt: str, out: str) -> int:
    """Write ``traces`` to ``out`` in ``fmt``; returns how many were written."""
    if fmt == "jsonl":
        return write_jsonl(traces, out)
    if fmt == "parquet":
        return write_parquet(traces, out)
    if fmt == "hf":
        rows = (hf_row(t) for t in traces)
        return _write_rows_parquet(({**r, "messages": _dumps(r["messages"]), "tools": _dumps(r["tools"])} for r in rows), out) if out.endswith(".parquet") else _write_jsonl_rows(rows, out)
    if fmt == "verl":
        rows = (verl_row(t) for t in traces)
        return _write_rows_parquet(rows, out) if out.endswith(".parquet") else _write_jsonl_rows(rows, out)
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")


# ---- loading anything ---------------------------------------------------------------------------


def load_any(path: str, *, import_foreign: bool = False, tokenizer: str = "qwen3", bundle: Any = None) -> LoadResult:
    """Load a trace file for the UI: ``.parquet`` (ours), or JSONL / JSON (ours).

    A file in which nothing is a trace but whose first records look like a known foreign format
    (Agents SDK, verl, OpenAI chat logs, ShareGPT) is imported when ``import_foreign`` is set
    (an :class:`~backend.importers.ImportResult`, rendered with ``bundle`` if given, else
    ``tokenizer``); otherwise it is refused with the ``import`` command to use."""
    if not os.path.exists(path):
        raise TraceFileError(f"file not found: {path}")
    if os.path.isdir(path):
        raise TraceFileError(f"{path} is a folder, not a trace file")
    from backend import importers

    def imported(fmt: str) -> LoadResult:
        return importers.import_file(path, fmt, tokenizer=tokenizer, bundle=bundle)

    if path.endswith(".parquet"):
        if is_trace_parquet(path):
            return read_parquet_traces(path)
        fmt = importers.detect(path)
        if fmt and fmt != "trace" and import_foreign:
            return imported(fmt)
        return read_parquet_traces(path)  # raises with a hint
    fmt = importers.detect(path)
    foreign = fmt is not None and fmt != "trace"
    # detect() looks at the first few readable records only: one damaged trace line (or one
    # foreign record) among them must not turn a file of traces into "foreign data".
    # load_traces refuses records that are not traces one by one (no id/format_version), so
    # load, and import or refuse the file only when nothing in it is a trace.
    res = load_traces(path)
    if foreign and not res.traces:
        if import_foreign:
            return imported(fmt)
        res = LoadResult()
        hint = f"looks like {fmt} data, not a trace; import it: python -m backend import --from {fmt} {path} --out TRACES.jsonl"
        res.problems.append(LoadProblem(1, hint))
    return res
