"""MLflow traces → conversations.

Input: ``mlflow.entities.Trace.to_json()`` documents, ``{"info": {...}, "data": {"spans": [...]}}``
— a whole JSON file is one trace, a JSON-lines file one trace per line (a JSON list: one trace
per element; a bare list of span dicts is one trace). Both span schemas MLflow has written:

* v3 (MLflow 3): ``trace_id`` / ``span_id`` / ``parent_span_id`` base64 (hex in 3.5.0),
  ``start_time_unix_nano``, ``end_time_unix_nano``, ``status.code``; info ``trace_id``
  (``tr-…``), ``request_time``, ``execution_duration_ms``, ``state``, ``trace_metadata``, ``tags``;
* v2 (MLflow 2): ``context.trace_id`` / ``context.span_id`` (``0x…`` hex), ``parent_id``,
  ``start_time`` / ``end_time`` (ns), ``status_code``; info ``request_id``, ``timestamp_ms``,
  ``execution_time_ms``, ``status``, ``request_metadata``, ``tags``.

Span attributes are JSON-encoded strings (``mlflow.spanType``, ``mlflow.spanInputs``,
``mlflow.spanOutputs``, ``mlflow.chat.tools``, ``mlflow.chat.messages`` ...). The conversation is
the LAST chat span's (``CHAT_MODEL`` / ``LLM``) input messages + output — the request's
``messages`` and the response's ``choices`` (OpenAI autolog), LangChain messages and
``generations``, Responses ``input`` / ``output`` items, or ``mlflow.chat.messages`` where older
versions wrote the whole exchange there. An earlier chat span whose conversation is not a prefix
of a later one gives a conversation of its own. ``TOOL`` spans add their durations
(``metadata.tool_durations_s``) and, where the chat span lacks them, their results (matched to
the call by name and arguments). ``AGENT`` / ``CHAIN`` / ``RETRIEVER`` / ... spans serve grouping
and timing, not losses.

Provenance: library ``mlflow``; the trace says no library version, only its schema
(``trace_metadata["mlflow.trace_schema.version"]``), recorded as ``version`` "trace schema N";
the trace id (``tr-…``), the OTel trace id (hex), the span ids (hex) the conversation came from.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, normalize_tools
from backend.importers.langsmith import ChatCall, ToolRun, assemble, chat_call, chat_messages, tool_metadata, tool_result_text

CHAT_TYPES = ("CHAT_MODEL", "LLM")
_CONTENT_ATTRS = ("mlflow.spanInputs", "mlflow.spanOutputs", "mlflow.chat.messages", "mlflow.chat.tools")


def _hex_id(v: Any, nbytes: int, where: str) -> str | None:
    """A span / trace id as lowercase hex: base64 (v3), hex (3.5.0, ``tr-`` prefixed trace ids)
    or ``0x`` hex (v2)."""
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise RecordError(f"{where}: an id must be a string, got {type(v).__name__}")
    s = v.removeprefix("tr-").removeprefix("0x")
    if len(s) == 2 * nbytes and all(c in "0123456789abcdefABCDEF" for c in s):
        return s.lower()
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == nbytes:
        return raw.hex()
    raise RecordError(f"{where}: {v!r} is neither a base64 nor a hex id of {nbytes} bytes")


def _is_span(s: Any) -> bool:
    if not isinstance(s, dict) or not isinstance(s.get("attributes"), dict):
        return False
    a = s["attributes"]
    return "mlflow.spanType" in a or "mlflow.traceRequestId" in a


def _spans_of(record: Any) -> tuple[dict[str, Any], list[Any], str]:
    """``(info, spans, place of the span list)`` of a record."""
    if isinstance(record, list):
        return {}, record, ""
    if not isinstance(record, dict):
        raise RecordError(f"an MLflow trace must be an object, got {type(record).__name__}")
    data = record.get("data") if "data" in record else record
    if not isinstance(data, dict):
        raise RecordError("data: must be an object with the trace's spans")
    spans = data.get("spans")
    if not isinstance(spans, list):
        raise RecordError("data.spans: missing or not a list")
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    return info, spans, "data.spans" if "data" in record else "spans"


@dataclass
class _Span:
    where: str
    trace_id: str | None
    span_id: str | None
    parent_id: str | None
    name: str
    start_ns: int | None
    end_ns: int | None
    attrs: dict[str, Any]  # raw (JSON strings)
    status: str | None

    @property
    def type(self) -> str:
        t = self.attrs.get("mlflow.spanType")
        if isinstance(t, str):
            try:
                t = json.loads(t)
            except json.JSONDecodeError:
                pass
        return t if isinstance(t, str) else ""

    @property
    def duration_s(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return max(0, self.end_ns - self.start_ns) / 1e9

    def attr(self, key: str, losses: list[str] | None = None) -> Any:
        """An attribute's value, JSON-decoded. Malformed JSON: a conversation attribute is an
        error (``losses`` None) or, for a tool span, kept as its raw text and named in ``losses``."""
        v = self.attrs.get(key)
        if not isinstance(v, str):
            return v
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            msg = f"{self.where}.attributes[{key!r}]: not valid JSON ({e.msg} at char {e.pos})"
            if losses is None:
                raise RecordError(msg) from None
            losses.append(msg + "; its raw text is kept")
            return v


def _int(v: Any, where: str) -> int | None:
    if v is None or v == "":
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise RecordError(f"{where}: {v!r} is not a time in nanoseconds") from None


def _read_span(s: Any, where: str) -> _Span:
    if not isinstance(s, dict):
        raise RecordError(f"{where}: a span must be an object, got {type(s).__name__}")
    attrs = s.get("attributes")
    if attrs is None:
        attrs = {}
    if not isinstance(attrs, dict):
        raise RecordError(f"{where}.attributes: must be an object")
    if isinstance(s.get("context"), dict):  # v2
        ctx = s["context"]
        return _Span(
            where, _hex_id(ctx.get("trace_id"), 16, f"{where}.context.trace_id"), _hex_id(ctx.get("span_id"), 8, f"{where}.context.span_id"),
            _hex_id(s.get("parent_id"), 8, f"{where}.parent_id"), str(s.get("name") or ""),
            _int(s.get("start_time"), f"{where}.start_time"), _int(s.get("end_time"), f"{where}.end_time"), attrs,
            s.get("status_code") if isinstance(s.get("status_code"), str) else None,
        )
    st = s.get("status")
    status = st.get("code") if isinstance(st, dict) else st if isinstance(st, str) else None
    return _Span(
        where, _hex_id(s.get("trace_id"), 16, f"{where}.trace_id"), _hex_id(s.get("span_id"), 8, f"{where}.span_id"),
        _hex_id(s.get("parent_span_id"), 8, f"{where}.parent_span_id"), str(s.get("name") or ""),
        _int(s.get("start_time_unix_nano"), f"{where}.start_time_unix_nano"), _int(s.get("end_time_unix_nano"), f"{where}.end_time_unix_nano"),
        attrs, status,
    )


def _chat_call(sp: _Span) -> ChatCall:
    tools = sp.attr("mlflow.chat.tools")
    inputs = sp.attr("mlflow.spanInputs")
    tools_where = f"{sp.where}.attributes['mlflow.chat.tools']"
    if isinstance(inputs, dict) and inputs.get("tools") is not None:
        # the request's own tools: mlflow.chat.tools is MLflow's rewrite of them, which drops what
        # its ChatTool schema has no field for (the properties of an array's items ...)
        tools, tools_where = inputs["tools"], f"{sp.where}.attributes['mlflow.spanInputs'].tools"
    messages = sp.attr("mlflow.chat.messages")
    if isinstance(messages, list) and messages:  # older MLflow: the whole exchange, input and output
        losses: list[str] = []
        msgs, errors = chat_messages(messages, f"{sp.where}.attributes['mlflow.chat.messages']", losses)
        call = ChatCall(messages=msgs, tools=normalize_tools(tools, tools_where) if tools else [], parse_errors=errors, losses=losses)
        outputs = sp.attr("mlflow.spanOutputs")
        if isinstance(outputs, dict) and isinstance(outputs.get("choices"), list) and outputs["choices"]:
            c0 = outputs["choices"][0]
            if isinstance(c0, dict) and isinstance(c0.get("finish_reason"), str):
                call.finish_reason = c0["finish_reason"]
    else:
        call = chat_call(
            inputs, sp.attr("mlflow.spanOutputs"), f"{sp.where}.attributes['mlflow.spanInputs']",
            tools=tools, out_where=f"{sp.where}.attributes['mlflow.spanOutputs']", tools_where=tools_where if tools is not None else None,
        )
    model = sp.attr("mlflow.llm.model")
    if isinstance(model, str) and model and "model" not in call.info:
        call.info["model"] = model
    usage = sp.attr("mlflow.chat.tokenUsage")
    if isinstance(usage, dict):
        call.info["usage"] = usage
    call.ref = sp.span_id or ""
    call.start = sp.start_ns / 1e9 if sp.start_ns is not None else None
    if sp.status in ("STATUS_CODE_ERROR", "ERROR"):
        call.error = "span status ERROR"
    return call


def _tool_run(sp: _Span) -> ToolRun:
    losses: list[str] = []
    args = sp.attr("mlflow.spanInputs", losses)
    outputs = sp.attr("mlflow.spanOutputs", losses)
    result = None if outputs is None else tool_result_text(outputs)
    error = "span status ERROR" if sp.status in ("STATUS_CODE_ERROR", "ERROR") else None
    return ToolRun(name=sp.name, args=args, result=result, duration_s=sp.duration_s, ref=sp.span_id or "",
                   where=f"{sp.where} ({sp.name!r})", start=sp.start_ns / 1e9 if sp.start_ns is not None else None, error=error,
                   losses=losses)


def looks_like_trace(record: Any) -> str | None:
    if isinstance(record, list):
        return "a list of MLflow spans" if record and all(_is_span(s) for s in record[:3]) else None
    if not isinstance(record, dict):
        return None
    data = record.get("data")
    info = record.get("info")
    if isinstance(data, dict) and isinstance(data.get("spans"), list):
        if isinstance(info, dict) and ("trace_id" in info or "request_id" in info or "trace_location" in info):
            return "an MLflow trace (Trace.to_json: info + data.spans)"
        if data["spans"] and _is_span(data["spans"][0]):
            return "MLflow trace data (spans with mlflow.* attributes)"
    if set(record) <= {"spans", "request", "response"} and isinstance(record.get("spans"), list) and record["spans"] and _is_span(record["spans"][0]):
        return "MLflow trace data (spans with mlflow.* attributes)"
    return None


@register
class MLflowImporter(Importer):
    name = "mlflow"
    label = "MLflow"
    description = ("MLflow traces (Trace.to_json(): one per file or per line), v2 and v3 span schemas: the last chat span's "
                   "messages + output, tool spans' durations and results")

    def sniff(self, record: Any) -> Any:
        return looks_like_trace(record)

    def whole_file(self, doc: Any) -> bool:
        return isinstance(doc, list) and bool(doc) and all(_is_span(s) for s in doc[:3])

    def convert(self, record: Any, ctx: Any) -> list[Conversation]:
        info, raw_spans, place = _spans_of(record)
        spans = [_read_span(s, f"{place}[{i}]" if place else f"[{i}]") for i, s in enumerate(raw_spans)]
        if not spans:
            raise RecordError(f"{place or 'the trace'}: no spans")
        chat = [s for s in spans if s.type in CHAT_TYPES]
        if not chat:
            kinds = ", ".join(f"{s.type or 'UNKNOWN'} {s.name!r}" for s in spans[:4]) + (" ..." if len(spans) > 4 else "")
            raise RecordError(f"no chat span (CHAT_MODEL / LLM) among its {len(spans)} span(s) ({kinds}): no conversation to import")
        calls = [_chat_call(s) for s in chat]
        tool_spans = [_tool_run(s) for s in spans if s.type == "TOOL"]
        got = assemble(calls, tool_spans)
        meta_src = info.get("trace_metadata") if isinstance(info.get("trace_metadata"), dict) else (
            info.get("request_metadata") if isinstance(info.get("request_metadata"), dict) else {})
        tags = info.get("tags") if isinstance(info.get("tags"), dict) else {}
        trace_id = info.get("trace_id") or info.get("request_id")
        otel_tid = next((s.trace_id for s in spans if s.trace_id), None)
        if not isinstance(trace_id, str) or not trace_id:
            req = spans[0].attrs.get("mlflow.traceRequestId")
            try:
                trace_id = json.loads(req) if isinstance(req, str) else None
            except json.JSONDecodeError:
                trace_id = None
        trace_id = trace_id if isinstance(trace_id, str) and trace_id else (f"tr-{otel_tid}" if otel_tid else None)
        duration = None
        for k in ("execution_duration_ms", "execution_time_ms"):
            if isinstance(info.get(k), (int, float)) and not isinstance(info.get(k), bool):
                duration = info[k] / 1000
                break
        if duration is None and isinstance(info.get("execution_duration"), str) and info["execution_duration"].endswith("s"):
            try:
                duration = float(info["execution_duration"][:-1])
            except ValueError:
                duration = None
        if duration is None:
            starts = [s.start_ns for s in spans if s.start_ns is not None]
            ends = [s.end_ns for s in spans if s.end_ns is not None]
            if starts and ends:
                duration = max(0, max(ends) - min(starts)) / 1e9
        counts: dict[str, int] = {}
        for s in spans:
            counts[s.type or "UNKNOWN"] = counts.get(s.type or "UNKNOWN", 0) + 1
        roots = [s for s in spans if s.parent_id is None]
        out = []
        for k, (leaf, conv, thread, tools) in enumerate(got):
            conv.id = (trace_id or "mlflow") if len(got) == 1 else f"{trace_id or 'mlflow'}-{k}"
            md = conv.metadata
            if duration is not None:
                md["duration_s"] = duration
            md.update(leaf.info)
            if leaf.finish_reason:
                md["finish_reason"] = leaf.finish_reason
            md["spans"] = counts
            md["llm_calls"] = len(thread)
            md.update(tool_metadata(tools))
            state = info.get("state") or info.get("status")
            if isinstance(state, str):
                md["state"] = state
            name = tags.get("mlflow.traceName") or (roots[0].name if roots else None)
            if isinstance(name, str) and name:
                md["name"] = name
            prov: dict[str, Any] = {"library": "mlflow"}
            schema = meta_src.get("mlflow.trace_schema.version") or tags.get("mlflow.trace_schema.version")
            if isinstance(schema, (str, int)) and str(schema):
                prov["version"] = f"trace schema {schema}"
            if trace_id:
                prov["trace_id"] = trace_id
            if otel_tid:
                prov["otel_trace_id"] = otel_tid
            prov["span_ids"] = [c.ref for c in thread] + [t.ref for t in tools]
            for key, label in (("mlflow.source.name", "source"), ("mlflow.source.type", "source_type")):
                v = meta_src.get(key) or tags.get(key)
                if isinstance(v, str) and v:
                    prov[label] = v
            conv.provenance = prov
            out.append(conv)
        return out


__all__ = ["MLflowImporter", "looks_like_trace"]
