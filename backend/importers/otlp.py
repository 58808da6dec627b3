"""OpenTelemetry spans and log records out of every container people save them in.

* OTLP JSON (``{"resourceSpans": [...]}`` / ``{"resourceLogs": [...]}``): one document, or the
  collector's file exporter (one export request per line). Ids hex, as the OTLP/JSON
  specification writes them, or base64, as protobuf's ``MessageToJson`` does; keys lowerCamelCase
  or, from ``MessageToDict(preserving_proto_field_name=True)``, snake_case.
* The Python SDK's ``ReadableSpan.to_json()`` (``{"name", "context": {"trace_id": "0x..."},
  "parent_id", "start_time": ISO, "attributes": {...}, "resource": {...}}``), one per line or
  a JSON list.
* A bare OTLP span object (``{"traceId", "spanId", "name", ...}``).

:func:`read_record` gives plain :class:`Span` / :class:`LogRecord` objects (AnyValue wrappers
unwrapped, ids lowercase hex, times in ns) with their place in the file; what reads them as a
conversation is a dialect of :mod:`backend.importers.otel`. The reading is hand-written over
``json`` values rather than ``opentelemetry-proto``'s parser: that parser takes base64 ids only
(the collector's file exporter writes hex) and, measured on the openai-v2 fixture lines
(protobuf 7.36.2), ``json_format.Parse`` into ``ExportTraceServiceRequest`` costs 19.6× a
``json.loads`` of the same line (orjson: 0.37×), which a trace set of GBs cannot afford; the
tests check our exporter's output with it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from backend.importers.common import RecordError

_KINDS = {0: None, 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass
class SpanEvent:
    name: str
    time_ns: int | None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str | None
    start_ns: int | None
    end_ns: int | None
    attributes: dict[str, Any]
    events: list[SpanEvent]
    resource: dict[str, Any]
    scope_name: str | None
    scope_version: str | None
    status: str | None
    status_message: str | None
    n: int
    where: str

    @property
    def duration_s(self) -> float | None:
        if self.start_ns is None or self.end_ns is None or self.end_ns < self.start_ns:
            return None
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class LogRecord:
    trace_id: str | None
    span_id: str | None
    time_ns: int | None
    event_name: str | None
    body: Any
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_name: str | None
    scope_version: str | None
    n: int
    where: str


# ---- values -------------------------------------------------------------------------------------


def _get(d: dict[str, Any], camel: str, snake: str | None = None) -> Any:
    v = d.get(camel)
    if v is None and snake is not None:
        v = d.get(snake)
    return v


def any_value(v: Any) -> Any:
    """An OTLP ``AnyValue`` (``{"stringValue": ...}`` ...) as a plain value; a value that is
    not wrapped is returned as it is."""
    if not isinstance(v, dict) or len(v) != 1:
        return v if not isinstance(v, dict) or v else None
    (k, x), = v.items()
    if k in ("stringValue", "string_value"):
        return x
    if k in ("boolValue", "bool_value"):
        return bool(x)
    if k in ("intValue", "int_value"):
        try:
            return int(x)
        except (TypeError, ValueError):
            return x
    if k in ("doubleValue", "double_value"):
        try:
            return float(x)
        except (TypeError, ValueError):
            return x
    if k in ("arrayValue", "array_value"):
        vals = x.get("values") if isinstance(x, dict) else None
        return [any_value(e) for e in vals] if isinstance(vals, list) else []
    if k in ("kvlistValue", "kvlist_value"):
        vals = x.get("values") if isinstance(x, dict) else None
        return attributes(vals) if isinstance(vals, list) else {}
    if k in ("bytesValue", "bytes_value"):
        return x
    return v


def attributes(raw: Any, where: str = "attributes") -> dict[str, Any]:
    """OTLP ``[{"key", "value": AnyValue}]`` or an SDK ``{key: value}`` dict → a plain dict."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    if not isinstance(raw, list):
        raise RecordError(f"{where}: expected a list of key/value pairs, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(raw):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise RecordError(f"{where}[{i}]: not a {{key, value}} pair")
        out[kv["key"]] = any_value(kv.get("value"))
    return out


def hex_id(v: Any, nbytes: int, where: str) -> str | None:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex: from hex (``0x`` prefix or not)
    or base64; None for an empty / all-zero id."""
    if v is None or v == "":
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        h = f"{v:0{nbytes * 2}x}"
    elif isinstance(v, str):
        s = v[2:] if v[:2] in ("0x", "0X") else v
        h = ""
        if len(s) == nbytes * 2:
            try:
                h = bytes.fromhex(s).hex()
            except ValueError:
                h = ""
        if not h:
            try:
                raw = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != nbytes:
                raise RecordError(f"{where}: {v[:40]!r} is not a {nbytes}-byte id (hex or base64)")
            h = raw.hex()
    else:
        raise RecordError(f"{where}: id is {type(v).__name__}, expected a string")
    return None if set(h) == {"0"} else h


def _ns(v: Any, where: str) -> int | None:
    if v is None or v == "":
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str):
        s = v.strip()
        if s.isdigit():
            return int(s)
        try:  # the SDK's to_json writes ISO 8601 times
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise RecordError(f"{where}: {s[:40]!r} is not a time") from None
        # microseconds from the datetime, the rest of the nanoseconds from the text
        frac = s.split(".", 1)[1].rstrip("Z").split("+")[0].split("-")[0] if "." in s else ""
        ns = int(dt.timestamp()) * 1_000_000_000
        return ns + int((frac + "000000000")[:9]) if frac.isdigit() else ns + dt.microsecond * 1000
    raise RecordError(f"{where}: time is {type(v).__name__}")


def _kind(v: Any) -> str | None:
    if isinstance(v, int):
        return _KINDS.get(v)
    if isinstance(v, str):
        return v.rsplit(".", 1)[-1].removeprefix("SPAN_KIND_").upper() or None
    return None


def _status(v: Any) -> tuple[str | None, str | None]:
    if not isinstance(v, dict):
        return None, None
    code = _get(v, "code", "status_code")
    msg = v.get("message", v.get("description"))
    if isinstance(code, int):
        name = _STATUS.get(code)
    elif isinstance(code, str):
        name = code.rsplit(".", 1)[-1].removeprefix("STATUS_CODE_").upper()
    else:
        name = None
    return name, msg if isinstance(msg, str) and msg else None


# ---- records ------------------------------------------------------------------------------------


def looks_like_otel(record: Any) -> str | None:
    """Why a record reads as OpenTelemetry data, or None."""
    if not isinstance(record, dict):
        return None
    if isinstance(_get(record, "resourceSpans", "resource_spans"), list):
        return "OTLP resourceSpans"
    if isinstance(_get(record, "resourceLogs", "resource_logs"), list):
        return "OTLP resourceLogs"
    ctx = record.get("context")
    if isinstance(ctx, dict) and "trace_id" in ctx and "span_id" in ctx and "name" in record:
        return "an OpenTelemetry SDK span (to_json)"
    if "traceId" in record and "spanId" in record and "name" in record and ("attributes" in record or "startTimeUnixNano" in record):
        return "an OTLP span"
    return None


def _span_otlp(s: Any, resource: dict[str, Any], scope: dict[str, Any], n: int, where: str) -> Span:
    if not isinstance(s, dict):
        raise RecordError(f"{where}: a span must be an object")
    tid = hex_id(_get(s, "traceId", "trace_id"), 16, f"{where}.traceId")
    sid = hex_id(_get(s, "spanId", "span_id"), 8, f"{where}.spanId")
    if tid is None or sid is None:
        raise RecordError(f"{where}: span has no trace id or span id")
    status, smsg = _status(s.get("status"))
    events = []
    for j, e in enumerate(s.get("events") or []):
        if isinstance(e, dict):
            events.append(SpanEvent(str(e.get("name") or ""), _ns(_get(e, "timeUnixNano", "time_unix_nano"), f"{where}.events[{j}]"),
                                    attributes(e.get("attributes"), f"{where}.events[{j}].attributes")))
    return Span(
        trace_id=tid, span_id=sid, parent_id=hex_id(_get(s, "parentSpanId", "parent_span_id"), 8, f"{where}.parentSpanId"),
        name=str(s.get("name") or ""), kind=_kind(s.get("kind")),
        start_ns=_ns(_get(s, "startTimeUnixNano", "start_time_unix_nano"), f"{where}.startTimeUnixNano"),
        end_ns=_ns(_get(s, "endTimeUnixNano", "end_time_unix_nano"), f"{where}.endTimeUnixNano"),
        attributes=attributes(s.get("attributes"), f"{where}.attributes"), events=events, resource=resource,
        scope_name=scope.get("name") or None, scope_version=scope.get("version") or None,
        status=status, status_message=smsg, n=n, where=where,
    )


def _span_sdk(s: dict[str, Any], n: int, where: str) -> Span:
    ctx = s.get("context") or {}
    tid = hex_id(ctx.get("trace_id"), 16, f"{where}.context.trace_id")
    sid = hex_id(ctx.get("span_id"), 8, f"{where}.context.span_id")
    if tid is None or sid is None:
        raise RecordError(f"{where}: span has no trace id or span id")
    status, smsg = _status(s.get("status"))
    res = s.get("resource")
    res_attrs = attributes(res.get("attributes"), f"{where}.resource.attributes") if isinstance(res, dict) else {}
    scope = s.get("instrumentation_scope") or s.get("instrumentation_info") or {}
    events = []
    for j, e in enumerate(s.get("events") or []):
        if isinstance(e, dict):
            events.append(SpanEvent(str(e.get("name") or ""), _ns(e.get("timestamp"), f"{where}.events[{j}].timestamp"),
                                    attributes(e.get("attributes"), f"{where}.events[{j}].attributes")))
    attrs = s.get("attributes")
    if attrs is not None and not isinstance(attrs, dict):
        raise RecordError(f"{where}.attributes: expected an object, got {type(attrs).__name__}")
    return Span(
        trace_id=tid, span_id=sid, parent_id=hex_id(s.get("parent_id"), 8, f"{where}.parent_id"),
        name=str(s.get("name") or ""), kind=_kind(s.get("kind")),
        start_ns=_ns(s.get("start_time"), f"{where}.start_time"), end_ns=_ns(s.get("end_time"), f"{where}.end_time"),
        attributes=dict(attrs or {}), events=events, resource=res_attrs,
        scope_name=(scope.get("name") if isinstance(scope, dict) else None) or None,
        scope_version=(scope.get("version") if isinstance(scope, dict) else None) or None,
        status=status, status_message=smsg, n=n, where=where,
    )


def _scoped(record: dict[str, Any], top: tuple[str, str], inner: tuple[str, str], leaf: tuple[str, str], n: int) -> Any:
    """``(resource attributes, scope, item, place)`` for each item of an OTLP request."""
    res_list = _get(record, *top)
    for i, rs in enumerate(res_list):
        w = f"line {n} {top[0]}[{i}]"
        if not isinstance(rs, dict):
            raise RecordError(f"{w}: not an object")
        res = rs.get("resource")
        res_attrs = attributes(res.get("attributes"), f"{w}.resource.attributes") if isinstance(res, dict) else {}
        scopes = _get(rs, *inner) or []
        if not isinstance(scopes, list):
            raise RecordError(f"{w}.{inner[0]}: not a list")
        for j, ss in enumerate(scopes):
            w2 = f"{w}.{inner[0]}[{j}]"
            if not isinstance(ss, dict):
                raise RecordError(f"{w2}: not an object")
            scope = ss.get("scope") if isinstance(ss.get("scope"), dict) else {}
            items = _get(ss, *leaf) or []
            if not isinstance(items, list):
                raise RecordError(f"{w2}.{leaf[0]}: not a list")
            for k, item in enumerate(items):
                yield res_attrs, scope, item, f"{w2}.{leaf[0]}[{k}]"


def read_record(record: Any, n: int) -> tuple[list[Span], list[LogRecord]]:
    """The spans and log records of one record of a file (see the module doc). Raises
    :class:`RecordError` naming the place of what is malformed."""
    if not isinstance(record, dict):
        raise RecordError(f"line {n}: not an OpenTelemetry object")
    spans: list[Span] = []
    logs: list[LogRecord] = []
    if _get(record, "resourceSpans", "resource_spans") is not None:
        for res, scope, s, w in _scoped(record, ("resourceSpans", "resource_spans"), ("scopeSpans", "scope_spans"), ("spans", "spans"), n):
            spans.append(_span_otlp(s, res, scope, n, w))
    if _get(record, "resourceLogs", "resource_logs") is not None:
        for res, scope, lr, w in _scoped(record, ("resourceLogs", "resource_logs"), ("scopeLogs", "scope_logs"), ("logRecords", "log_records"), n):
            if not isinstance(lr, dict):
                raise RecordError(f"{w}: a log record must be an object")
            attrs = attributes(lr.get("attributes"), f"{w}.attributes")
            name = _get(lr, "eventName", "event_name") or attrs.get("event.name")
            logs.append(LogRecord(
                trace_id=hex_id(_get(lr, "traceId", "trace_id"), 16, f"{w}.traceId"),
                span_id=hex_id(_get(lr, "spanId", "span_id"), 8, f"{w}.spanId"),
                time_ns=_ns(_get(lr, "timeUnixNano", "time_unix_nano") or _get(lr, "observedTimeUnixNano", "observed_time_unix_nano"), f"{w}.timeUnixNano"),
                event_name=name if isinstance(name, str) and name else None, body=any_value(lr.get("body")), attributes=attrs,
                resource=res, scope_name=scope.get("name") or None, scope_version=scope.get("version") or None, n=n, where=w,
            ))
    if spans or logs or looks_like_otel(record) in ("OTLP resourceSpans", "OTLP resourceLogs"):
        return spans, logs
    if isinstance(record.get("context"), dict):
        return [_span_sdk(record, n, f"line {n}")], []
    if "traceId" in record and "spanId" in record:
        return [_span_otlp(record, {}, {}, n, f"line {n}")], []
    raise RecordError(f"line {n}: not an OpenTelemetry object (no resourceSpans, resourceLogs or span)")


__all__ = ["LogRecord", "Span", "SpanEvent", "any_value", "attributes", "hex_id", "looks_like_otel", "read_record"]
