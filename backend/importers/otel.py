"""OpenTelemetry span files → conversations: one importer (``otel``) for every span convention.

The spans of a file (:mod:`backend.importers.otlp` reads every container: OTLP JSON with hex or
base64 ids, the collector's file exporter, SDK span JSON lines, OTLP log records) are grouped by
trace id; each trace goes to the first **dialect** that claims one of its spans or log records,
in the order of :data:`DIALECT_MODULES`:

* ``langfuse`` — Langfuse SDK observations (``langfuse.observation.*``);
* ``openinference`` — OpenInference / Phoenix / Arize (``openinference.span.kind``,
  ``llm.input_messages.N.message.*``);
* ``otel-genai`` — the OpenTelemetry GenAI semantic conventions (``gen_ai.input.messages`` ...,
  and the older ``gen_ai.prompt.N.*`` of OpenLLMetry).

A trace none claims (HTTP or database spans only) is reported, not dropped: its spans carry no
conversation. Spans that carry no conversation content inside a claimed trace (agent, chain,
step spans) serve grouping and timing.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError
from backend.importers.otlp import LogRecord, Span, looks_like_otel, read_record
from backend.trace import LoadProblem

# One row per dialect: (name, module that registers it). Order = which claims a trace first
# (Langfuse and OpenInference spans may carry gen_ai.* attributes too).
DIALECT_MODULES: tuple[tuple[str, str], ...] = (
    ("langfuse", "backend.importers.langfuse"),
    ("openinference", "backend.importers.openinference"),
    ("otel-genai", "backend.importers.otel_genai"),
)

_DIALECTS: dict[str, Dialect] = {}


class Dialect:
    """One span convention: which spans it claims, and the conversation it reads from a trace."""

    name: str = ""
    label: str = ""

    def claims(self, span: Span) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def claims_log(self, log: LogRecord) -> bool:
        return False

    def conversation(self, trace_id: str, spans: list[Span], logs: list[LogRecord]) -> Conversation | list[Conversation] | None:  # pragma: no cover
        raise NotImplementedError


def register_dialect(cls: type[Dialect]) -> type[Dialect]:
    inst = cls()
    _DIALECTS[inst.name] = inst
    return cls


def dialects() -> list[Dialect]:
    """The registered dialects in claiming order (importing their modules on first use)."""
    out = []
    for name, module in DIALECT_MODULES:
        if name not in _DIALECTS:
            importlib.import_module(module)
        if name in _DIALECTS:
            out.append(_DIALECTS[name])
    return out


def json_value(v: Any) -> Any:
    """An attribute that may hold JSON text, decoded; anything else (or text that is not JSON) as it is."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (json.JSONDecodeError, RecursionError, ValueError):
            return v
    return v


def add_timing(meta: dict[str, Any], chat_spans: list[Span], tool_spans: list[Span], *, several: bool, t0: int | None) -> None:
    """``tool_durations_s`` (the tool spans', in order) and, for one of several conversations of a
    trace, its own ``duration_s`` (from ``t0`` to the end of its last span; a trace's single
    conversation gets the trace's duration from :func:`conversations_of_trace`)."""
    if tool_spans:
        meta["tool_durations_s"] = [s.duration_s for s in tool_spans]
    if several:
        ends = [s.end_ns for s in chat_spans + tool_spans if s.end_ns is not None]
        if ends and t0:
            meta["duration_s"] = max(0, max(ends) - t0) / 1e9


def same_turn(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two messages are the same turn (content, calls and their ids, result ids)."""
    if a.get("role") != b.get("role") or (a.get("content") or "") != (b.get("content") or ""):
        return False
    ca = [(c.get("id"), c["function"]["name"], c["function"]["arguments"]) for c in a.get("tool_calls") or []]
    cb = [(c.get("id"), c["function"]["name"], c["function"]["arguments"]) for c in b.get("tool_calls") or []]
    return ca == cb and a.get("tool_call_id") == b.get("tool_call_id")


def continues(prev: list[dict[str, Any]], nxt: list[dict[str, Any]]) -> bool:
    """``nxt`` starts with the turns of ``prev`` (a later model call of the same conversation)."""
    return len(prev) <= len(nxt) and all(same_turn(a, b) for a, b in zip(prev, nxt))


def _start(s: Span) -> int:
    return s.start_ns if s.start_ns is not None else 0


def _names(spans: list[Span], k: int = 4) -> str:
    names = list(dict.fromkeys(s.name or "?" for s in spans))
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def _restore_reasoning(conv: Conversation, root: dict[str, Any]) -> None:
    """Our own export leaves out of its spans' input the reasoning the prompt did not show the
    model (``agent_loop_inspector.input.reasoning_not_shown``: the messages' indices). Put that
    reasoning back on the conversation's messages that lack it: from the root ``invoke_agent``
    span's ``..._text`` (the text, index by index), or — an export written before the root left
    it out too — from the root's input messages (same place, same role)."""
    where = root.get("agent_loop_inspector.input.reasoning_not_shown")
    texts = root.get("agent_loop_inspector.input.reasoning_not_shown_text")
    if isinstance(where, list) and isinstance(texts, list) and len(where) == len(texts):
        for i, text in zip(where, texts):
            if (isinstance(i, int) and 0 <= i < len(conv.messages) and isinstance(text, str) and text
                    and conv.messages[i].get("role") == "assistant" and not conv.messages[i].get("reasoning_content")):
                conv.messages[i]["reasoning_content"] = text
        return
    recorded = json_value(root.get("gen_ai.input.messages"))
    if not isinstance(recorded, list):
        return
    rest = list(conv.messages)
    while rest and rest[0].get("role") == "system":
        rest.pop(0)
    for rm, m in zip(recorded, rest):
        if not isinstance(rm, dict) or rm.get("role") != m.get("role"):
            return
        parts = rm.get("parts") if isinstance(rm.get("parts"), list) else []
        reasoning = "".join(p.get("content") or "" for p in parts if isinstance(p, dict) and p.get("type") == "reasoning"
                            and isinstance(p.get("content"), str))
        if reasoning and not m.get("reasoning_content"):
            m["reasoning_content"] = reasoning


def conversations_of_trace(trace_id: str, spans: list[Span], logs: list[LogRecord], *, dialect: str | None = None) -> tuple[Dialect | None, list[Conversation]]:
    """``(dialect, conversations)`` of one trace's spans and logs (``dialect`` forces one)."""
    spans = sorted(spans, key=_start)
    chosen = None
    for d in dialects():
        if dialect is not None and d.name != dialect:
            continue
        if any(d.claims(s) for s in spans) or any(d.claims_log(lg) for lg in logs):
            chosen = d
            break
    if chosen is None:
        return None, []
    got = chosen.conversation(trace_id, spans, logs)
    convs = [] if got is None else got if isinstance(got, list) else [got]
    for other in dialects():  # spans of another convention in the same trace are not read: say so
        if other is chosen or (dialect is not None and other.name != dialect):
            continue
        theirs = [s for s in spans if other.claims(s) and not chosen.claims(s)]
        if theirs and convs:
            convs[0].losses.append(f"{len(theirs)} {other.label} span(s) of this trace ({_names(theirs)}, first at {theirs[0].where}) "
                                   f"not read: the trace was read as {chosen.label}")
    # our own export (backend.exporters.export_otel): the trace's id and end state are on the root span
    ours = next((s.attributes for s in spans if "agent_loop_inspector.trace_id" in s.attributes), None)
    if ours is not None and len(convs) == 1:
        convs[0].id = convs[0].id or str(ours["agent_loop_inspector.trace_id"])
        tr = ours.get("agent_loop_inspector.termination_reason")
        if isinstance(tr, str) and tr and convs[0].termination_reason is None:
            convs[0].termination_reason = tr
        if any("agent_loop_inspector.input.reasoning_not_shown" in s.attributes for s in spans):
            _restore_reasoning(convs[0], ours)
        if ours.get("agent_loop_inspector.model_source") == "tokenizer":  # no model of its own: not a model name
            convs[0].metadata.pop("model", None)
    # the conversation (session) the trace belongs to, as the GenAI conventions name it
    conv_id = next((s.attributes["gen_ai.conversation.id"] for s in spans
                    if isinstance(s.attributes.get("gen_ai.conversation.id"), str) and s.attributes["gen_ai.conversation.id"]), None)
    starts = [s.start_ns for s in spans if s.start_ns is not None]
    ends = [s.end_ns for s in spans if s.end_ns is not None]
    for k, conv in enumerate(convs):
        conv.provenance.setdefault("format", chosen.label)
        conv.provenance.setdefault("trace_id", trace_id)
        if conv_id is not None:
            conv.provenance.setdefault("conversation_id", conv_id)
        if conv.id is None:
            conv.id = trace_id if len(convs) == 1 else f"{trace_id}-{k}"
        if starts and ends and "duration_s" not in conv.metadata:
            conv.metadata["duration_s"] = max(0, max(ends) - min(starts)) / 1e9
    return chosen, convs


@register
class OTelImporter(Importer):
    name = "otel"
    label = "OpenTelemetry"
    description = ("OpenTelemetry spans (OTLP JSON, collector file export, SDK span JSON) with GenAI, OpenInference or "
                   "Langfuse attributes, grouped into conversations by trace id")
    grouped = True

    def sniff(self, record: Any) -> Any:
        return looks_like_otel(record)

    def convert(self, record: Any, ctx: Any) -> list[Any]:
        return [item for _, item in self.convert_group([(1, record)], ctx) if not isinstance(item, LoadProblem)]

    def convert_group(self, records: list[tuple[int, Any]], ctx: Any) -> Iterator[tuple[int, Any]]:
        by_trace: dict[str, list[Span]] = {}
        logs_by_trace: dict[str, list[LogRecord]] = {}
        first_n: dict[str, int] = {}
        seen: set[tuple[str, str]] = set()
        dupes: dict[str, list[str]] = {}
        for n, rec in records:
            try:
                spans, logs = read_record(rec, n)
            except RecordError as e:
                yield n, LoadProblem(n, str(e))
                continue
            for s in spans:
                key = (s.trace_id, s.span_id)
                if key in seen:  # the same span exported twice (files concatenated, a retried export)
                    dupes.setdefault(s.trace_id, []).append(s.where)
                    continue
                seen.add(key)
                by_trace.setdefault(s.trace_id, []).append(s)
                first_n.setdefault(s.trace_id, n)
            for lg in logs:
                tid = lg.trace_id or f"log-line-{n}"
                logs_by_trace.setdefault(tid, []).append(lg)
                first_n.setdefault(tid, n)
        forced = ctx.options.get("dialect") if ctx is not None and isinstance(getattr(ctx, "options", None), dict) else None
        for tid in sorted(first_n, key=lambda t: first_n[t]):
            n = first_n[tid]
            spans, logs = by_trace.get(tid, []), logs_by_trace.get(tid, [])
            try:
                chosen, convs = conversations_of_trace(tid, spans, logs, dialect=forced)
            except RecordError as e:
                yield n, LoadProblem(n, f"trace {tid}: {e}")
                continue
            except (RecursionError, MemoryError):
                yield n, LoadProblem(n, f"trace {tid}: its span attributes nest too deeply or are too large to read")
                continue
            except Exception as e:  # noqa: BLE001 - a bug on one trace must not lose the others
                yield n, LoadProblem(n, f"trace {tid}: internal error: {type(e).__name__}: {e}"[:500])
                continue
            if chosen is None:
                what = f"{len(spans)} span(s) ({_names(spans)})" if spans else f"{len(logs)} log record(s)"
                known = ", ".join(d.label for d in dialects()) or "none registered"
                yield n, LoadProblem(n, f"trace {tid}: its {what} carry no conversation of a known convention ({known})")
                continue
            if not convs:
                yield n, LoadProblem(n, f"trace {tid}: {chosen.label} spans found ({_names(spans)}) but no messages in them")
                continue
            for conv in convs:
                if tid in dupes:  # nothing lost: said on the trace
                    conv.metadata["duplicate_spans"] = {"count": len(dupes[tid]), "first": dupes[tid][0]}
                yield n, conv


__all__ = ["DIALECT_MODULES", "Dialect", "OTelImporter", "add_timing", "continues", "json_value", "conversations_of_trace", "dialects", "register_dialect", "same_turn"]
