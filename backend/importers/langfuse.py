"""Langfuse observations (the Langfuse Python / JS SDKs v3+, which are OpenTelemetry) → conversations.

A dialect of the ``otel`` importer (:mod:`backend.importers.otel`). Each Langfuse observation is
a span with ``langfuse.observation.type`` (``generation``, ``embedding``, ``span``, ``agent``,
``tool``, ``chain``, ``retriever``, ``evaluator``, ``guardrail``, ``event``) and its data as JSON
strings (keys of ``langfuse._client.attributes.LangfuseOtelSpanAttributes``, langfuse 5.0)::

    langfuse.observation.input / .output      what the app passed (JSON, or a plain string)
    langfuse.observation.model.name           langfuse.observation.model.parameters (JSON)
    langfuse.observation.usage_details (JSON) langfuse.observation.cost_details (JSON)
    langfuse.observation.metadata[.KEY]       langfuse.observation.level / .status_message
    langfuse.trace.name, session.id, user.id, langfuse.environment, langfuse.release

A ``generation``'s input is what the app's LLM call took: from the ``langfuse.openai`` wrapper an
OpenAI message list, or ``{"messages", "tools"}`` when tools were passed; from ``@observe`` on an
app's own function ``{"args": [...], "kwargs": {...}}`` (the messages are read from a
``messages`` argument or a lone list argument); a string is the user's prompt. Its output is the
assistant message (``{"role", "content", "tool_calls"}``), a list of them (one per choice: the
first is read), or a string.

The conversation of a trace is its last generation's input + output; a generation that does not
continue the previous one starts another conversation of the trace (as in OpenInference).
``tool`` observations give their durations (``metadata.tool_durations_s``) and the results of the
last generation's calls that no later generation shows. Agent / span / chain observations group
and time the rest.

Not carried over, reported as losses naming the span and attribute: content parts without text
(images, audio, files, Langfuse media references ``@@@langfuseMedia:...@@@``), values the SDK's
mask function replaced, further choices, a generation whose input holds no messages.
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, tool_run_calls
from backend.importers.openai_chat import normalize_messages
from backend.importers.otel import Dialect, add_timing, continues, json_value, register_dialect
from backend.importers.otlp import Span
from backend.trace import ParseError
from backend.trace.model import TerminationReason

TYPE = "langfuse.observation.type"
INPUT, OUTPUT = "langfuse.observation.input", "langfuse.observation.output"
MASKED = "<fully masked due to failed mask function>"  # langfuse._client.constants.MASK_FALLBACK_VALUE
_FINISH = {"length": TerminationReason.RESPONSE_LENGTH, "content_filter": TerminationReason.CONTENT_FILTER}


def _type(s: Span) -> str:
    t = s.attributes.get(TYPE)
    return t.lower() if isinstance(t, str) else ""


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str)


def _message_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_message(m) for m in v)


def _call_args(v: Any) -> Any:
    """An ``@observe``d function's captured input ``{"args", "kwargs"}`` as its arguments: the
    keyword arguments, or a lone positional dict."""
    if isinstance(v, dict) and set(v) <= {"args", "kwargs"} and "kwargs" in v:
        kw, pos = v.get("kwargs"), v.get("args")
        if isinstance(kw, dict) and not pos:
            return kw
        if isinstance(pos, list) and len(pos) == 1 and isinstance(pos[0], dict) and not kw:
            return pos[0]
    return v


class _Reader:
    def __init__(self, spans: list[Span]):
        self.spans = spans
        self.losses: list[str] = []
        self.tools = [s for s in spans if _type(s) == "tool"]
        self.used_tools: set[str] = set()
        self.matched: set[str] = set()  # TOOL spans some conversation's call ran

    def value(self, s: Span, key: str) -> Any:
        v = s.attributes.get(key)
        if v == MASKED:
            self.losses.append(f"{s.where} {key}: masked by the SDK's mask function, not in the file")
            return None
        return json_value(v)

    # ---- one generation ---------------------------------------------------------------------

    def request(self, s: Span) -> tuple[Any, Any]:
        """``(messages, tools)`` as the generation's input holds them (raw), messages None if none."""
        v = self.value(s, INPUT)
        if isinstance(v, str):
            return [{"role": "user", "content": v}], None
        v = _call_args(v)
        if _message_list(v):
            return v, None
        if isinstance(v, dict):
            msgs = v.get("messages")
            if msgs is None and isinstance(v.get("prompt"), str):
                msgs = [{"role": "user", "content": v["prompt"]}]
            if msgs is None and isinstance(v.get("input"), (str, list)):
                msgs = v["input"] if _message_list(v["input"]) else [{"role": "user", "content": v["input"]}] if isinstance(v["input"], str) else None
            if _message_list(msgs):
                tools = v.get("tools") if v.get("tools") is not None else v.get("functions")
                return msgs, tools
            lists = [x for x in v.values() if _message_list(x)]
            if len(lists) == 1:
                return lists[0], None
        if isinstance(v, list) and v and isinstance(v[0], list) and _message_list(v[0]) and len(v) == 1:
            return v[0], None
        return None, None

    def reply(self, s: Span) -> dict[str, Any] | None:
        v = _call_args(self.value(s, OUTPUT))
        if v is None:
            return None
        if isinstance(v, list) and v and all(_is_message(m) for m in v):
            for k in range(1, len(v)):
                self.losses.append(f"{s.where} {OUTPUT}[{k}]: another choice not carried over")
            v = v[0]
        if isinstance(v, dict) and isinstance(v.get("choices"), list) and v["choices"]:  # a whole completion response
            ch = v["choices"]
            for k in range(1, len(ch)):
                self.losses.append(f"{s.where} {OUTPUT}.choices[{k}]: another choice not carried over")
            v = ch[0].get("message") if isinstance(ch[0], dict) else None
        if isinstance(v, str):
            return {"role": "assistant", "content": v}
        if isinstance(v, dict) and (_is_message(v) or "content" in v or "tool_calls" in v):
            return {**v, "role": "assistant"} if v.get("role") in (None, "assistant", "model", "ai") else v
        self.losses.append(f"{s.where} {OUTPUT}: output ({type(v).__name__}) is not an assistant message, not carried over")
        return None

    def conversation_of(self, s: Span) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]], int, list[dict[str, Any]]] | None:
        raw, raw_tools = self.request(s)
        if raw is None:
            self.losses.append(f"{s.where} {INPUT}: generation {s.name!r} input holds no messages, not carried over")
            return None
        try:
            msgs, errors = normalize_messages(raw, f"{s.where} {INPUT}", self.losses)
        except RecordError as e:
            self.losses.append(f"generation {s.name!r} not carried over: {e}")
            return None
        n_in = len(msgs)
        out = self.reply(s)
        if out is not None:
            try:
                got, e2 = normalize_messages([out], f"{s.where} {OUTPUT}", self.losses)
            except RecordError as e:
                self.losses.append(f"generation {s.name!r} output not carried over: {e}")
                got, e2 = [], {}
            if got:
                msgs.extend(got)
                if 0 in e2:
                    errors[n_in] = e2[0]
        tools: list[dict[str, Any]] = []
        if raw_tools is not None:
            try:
                tools = normalize_tools(raw_tools, f"{s.where} {INPUT}.tools")
            except RecordError as e:
                self.losses.append(f"tools not carried over: {e}")
        return msgs, errors, n_in, tools

    # ---- tool observations ------------------------------------------------------------------

    def tool_args(self, s: Span) -> Any:
        return _call_args(json_value(s.attributes.get(INPUT)))

    def runs(self, s: Span, call: dict[str, Any]) -> bool:
        """The tool observation ran ``call``: its name and arguments, or — a generic wrapper's
        (``call_tool``) — the tool and arguments its input names."""
        fn = call.get("function", {})
        return any(name == fn.get("name") and args == fn.get("arguments") for name, args in tool_run_calls(s.name, self.tool_args(s)))

    def tool_span_for(self, call: dict[str, Any], after: int | None) -> Span | None:
        for s in self.tools:
            if s.span_id in self.used_tools or (after is not None and (s.start_ns or 0) < after):
                continue
            if self.runs(s, call):
                return s
        return None

    def results_for(self, calls: list[dict[str, Any]], after: int | None) -> list[dict[str, Any]]:
        out = []
        for c in calls:
            s = self.tool_span_for(c, after)
            if s is None or OUTPUT not in s.attributes:
                break
            self.used_tools.add(s.span_id)
            v = s.attributes[OUTPUT]
            if v == MASKED:
                self.losses.append(f"{s.where} {OUTPUT}: masked by the SDK's mask function, not in the file")
            m = {"role": "tool", "content": v if isinstance(v, str) else json.dumps(v, ensure_ascii=False), "name": c["function"]["name"]}
            if c.get("id"):
                m["tool_call_id"] = c["id"]
            out.append(m)
        return out


def _usage(v: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if not isinstance(v, dict):
        return out
    for src, dst in (("prompt_tokens", "prompt_tokens"), ("input", "prompt_tokens"), ("completion_tokens", "completion_tokens"),
                     ("output", "completion_tokens"), ("total_tokens", "total_tokens"), ("total", "total_tokens")):
        x = v.get(src)
        if isinstance(x, int) and not isinstance(x, bool) and dst not in out:
            out[dst] = x
    return out


@register_dialect
class LangfuseDialect(Dialect):
    name = "langfuse"
    label = "Langfuse"

    def claims(self, span: Span) -> bool:
        return _type(span) == "generation" and (INPUT in span.attributes or OUTPUT in span.attributes)

    def conversation(self, trace_id: str, spans: list[Span], logs: list[Any]) -> Conversation | list[Conversation] | None:
        r = _Reader(spans)
        chains: list[dict[str, Any]] = []
        for s in spans:
            if _type(s) != "generation":
                continue
            got = r.conversation_of(s)
            if got is None:
                continue
            msgs, errors, n_in, tools = got
            target = None
            for ch in reversed(chains):
                if continues(ch["msgs"], msgs[:n_in]):
                    target = ch
                    break
            if target is None:
                target = {"spans": []}
                chains.append(target)
            target.update(msgs=msgs, errors=errors, last=s, tools=tools)
            target["spans"].append(s)
        if not chains:
            return None
        out = [self._finish(r, ch, trace_id, several=len(chains) > 1) for ch in chains]
        for s in r.tools:  # a tool run that no conversation's call asked for: its result is not carried
            if s.span_id not in r.matched:
                r.losses.append(f"{s.where}: tool observation {s.name!r} answers no tool call of the trace's LLM calls, not carried over")
        for conv in out:
            conv.losses = list(dict.fromkeys(r.losses + conv.losses))
        return out[0] if len(out) == 1 else out

    def _finish(self, r: _Reader, ch: dict[str, Any], trace_id: str, several: bool) -> Conversation:
        last: Span = ch["last"]
        msgs = [dict(m) for m in ch["msgs"]]
        span_ids = [s.span_id for s in ch["spans"]]
        if msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("tool_calls"):
            results = r.results_for(msgs[-1]["tool_calls"], last.start_ns)
            msgs.extend(results)
        calls = [c for m in msgs if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        t0 = min((s.start_ns or 0) for s in ch["spans"])
        tool_spans = [s for s in r.tools
                      if any(r.runs(s, c) for c in calls)
                      and (not several or (s.start_ns or 0) >= t0)]
        tool_spans.sort(key=lambda s: s.start_ns or 0)
        r.matched.update(s.span_id for s in tool_spans)
        span_ids += [s.span_id for s in tool_spans if s.span_id in r.used_tools]
        fill_tool_message_names(msgs)
        a = last.attributes
        meta: dict[str, Any] = {}
        model = a.get("langfuse.observation.model.name")
        if isinstance(model, str) and model:
            meta["model"] = model
        usage: dict[str, int] = {}
        for s in ch["spans"]:
            for k, v in _usage(json_value(s.attributes.get("langfuse.observation.usage_details"))).items():
                usage[k] = usage.get(k, 0) + v
        if usage:
            meta["usage"] = usage
        meta["llm_calls"] = len(ch["spans"])
        params = json_value(a.get("langfuse.observation.model.parameters"))
        if isinstance(params, dict) and params:
            meta["model_parameters"] = params
        add_timing(meta, ch["spans"], tool_spans, several=several, t0=t0)
        for key, dst in (("langfuse.trace.name", "trace_name"), ("session.id", "session_id"), ("user.id", "user_id"),
                         ("langfuse.environment", "environment"), ("langfuse.release", "release")):
            v = a.get(key) if key in a else next((s.attributes[key] for s in r.spans if key in s.attributes), None)
            if v is None:
                v = last.resource.get(key)
            if isinstance(v, str) and v:
                meta[dst] = v
        level = a.get("langfuse.observation.level")
        if isinstance(level, str) and level not in ("DEFAULT", "DEBUG"):
            meta["level"] = level
            if isinstance(a.get("langfuse.observation.status_message"), str):
                meta["status_message"] = a["langfuse.observation.status_message"]
        out = json_value(a.get(OUTPUT))
        finish = out.get("finish_reason") if isinstance(out, dict) else None
        if isinstance(finish, str) and finish:
            meta["finish_reason"] = finish
        prov: dict[str, Any] = {"format": self.label, "trace_id": trace_id, "span_ids": span_ids}
        scope = next((s for s in ch["spans"] if s.scope_name), None)
        if scope is not None:
            prov["library"] = scope.scope_name
            if scope.scope_version:
                prov["version"] = scope.scope_version
        return Conversation(
            messages=msgs, tools=ch["tools"], metadata=meta, parse_errors=ch["errors"], provenance=prov,
            finish_reason=finish if isinstance(finish, str) and finish else None,
            termination_reason=_FINISH.get(finish) if isinstance(finish, str) else None,
            id=f"{trace_id}-{ch['spans'][0].span_id}" if several else None,
        )


__all__ = ["LangfuseDialect"]
