"""Export traces to other formats (``python -m backend export --to ...``).

* ``jsonl`` — our trace format, one trace per line (:func:`backend.trace.io.write_jsonl`).
* ``parquet`` — our loss-less Parquet layout (:func:`backend.trace.io.write_parquet`; read back by
  :func:`backend.importers.load_any`).
* ``hf`` — ``{"id", "messages", "tools"}`` JSONL rows for SFT/chat-template training (tool-call
  arguments as objects, as HF templates expect).
* ``verl`` — ``{"id", "prompt_ids", "response_ids", "response_mask", ...}`` rows as verl's agent
  loop produces them (JSONL, or Parquet when the output name ends in ``.parquet``).
* ``otel`` — OpenTelemetry GenAI spans as OTLP JSON, one export request per trace per line (the
  collector file exporter's layout; :mod:`backend.exporters.export_otel`), for Phoenix, Langfuse, Jaeger.

Reading trace files, and the writers of our own formats, are in :mod:`backend.trace.io`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from backend.errors import UserError
from backend.trace import StepState, Trace, write_jsonl, write_lines, write_parquet

EXPORT_FORMATS = ("jsonl", "parquet", "hf", "verl", "otel")


class ExportError(UserError):
    """An export that cannot be written as asked (an unknown format)."""


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


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
        row["rollout_log_probs"] = lps  # the name verl's trainer batch gives them
    old = _trainer_logprobs(t)
    if old is not None:
        row["old_log_probs"] = old
    return row


def _trainer_logprobs(t: Trace) -> list[float] | None:
    """verl's ``old_log_probs`` from the steps' ``info.trainer_logprobs`` (mask-0 tokens that
    were not scored: 0.0, as verl pads), or None when a generated turn has none."""
    out: list[float] = []
    p = len(t.prompt_ids)
    for s in t.steps:
        if s.end > s.start and s.start >= p:
            tr = s.info.trainer_logprobs
            if tr is not None and len(tr) == s.end - s.start:
                out.extend(tr)
            elif s.state == StepState.GENERATING:
                return None
            else:
                out.extend([0.0] * (s.end - s.start))
    return out if out and len(out) == len(t.response_ids) else None


def _write_jsonl_rows(rows: Iterable[dict[str, Any]], path: str) -> int:
    return write_lines((json.dumps(r, ensure_ascii=False) for r in rows), path)


def _write_rows_parquet(rows: Iterable[dict[str, Any]], path: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    table = pa.Table.from_pylist(rows) if rows else pa.table({"id": pa.array([], pa.string())})
    tmp = path + ".tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return len(rows)


def export_traces(traces: Iterable[Trace], fmt: str, out: str, *, synthetic_start: float | None = None) -> int:
    """Write ``traces`` to ``out`` in ``fmt``; returns how many were written. ``synthetic_start``
    (otel only, Unix seconds): where the spans of traces without real times begin (default: now)."""
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
    if fmt == "otel":
        from backend.exporters.export_otel import write_otlp_jsonl

        return write_otlp_jsonl(traces, out, synthetic_start=synthetic_start)
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
