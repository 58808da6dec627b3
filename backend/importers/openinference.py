"""OpenInference spans (Arize Phoenix / Arize AX instrumentations) → conversations.

A dialect of the ``otel`` importer (:mod:`backend.importers.otel`). OpenInference writes an LLM
call as one span with ``openinference.span.kind = "LLM"`` and flattened attributes::

    llm.input_messages.N.message.role | content | name | tool_call_id
    llm.input_messages.N.message.contents.K.message_content.type | text | image.image.url ...
    llm.input_messages.N.message.tool_calls.M.tool_call.id | function.name | function.arguments
    llm.output_messages.N.message....            (the reply, same keys)
    llm.tools.N.tool.json_schema                  (an OpenAI tool schema as JSON)
    llm.model_name, llm.token_count.prompt | completion | total, llm.invocation_parameters,
    llm.finish_reason, input.value / output.value (+ .mime_type)

``TOOL`` spans carry ``tool.name``, ``tool.parameters``, ``input.value`` (the arguments),
``output.value`` (the result) and sometimes ``tool.id`` (the call id); ``AGENT`` / ``CHAIN`` spans
group and time the rest.

A trace's conversation is its last LLM span's input messages + output message; an LLM span
whose messages do not continue the previous one's starts another conversation of the same
trace (two agent runs, a planning call with another prompt). LLM spans nested in an LLM span
(smolagents' model span around the openai client's span) are the same call twice: the outer
one is read. TOOL spans give their durations (``metadata.tool_durations_s``) and the results of
calls that no later LLM span shows.

smolagents (``openinference-instrumentation-smolagents``) records the agent's memory as the
model input: a tool round is a ``tool-call`` message (``"Calling tools:\\n[{...}]"``, Python
repr) and a ``tool-response`` message (``"Observation:\\n..."``). They are read back as the
assistant's tool calls (from the earlier LLM span's output with the same call ids, else from
the repr) and one tool message per call with the TOOL span's output; where no TOOL span matches,
the observation stays a user message, as smolagents sends it to the model. A turn in which the
model wrote text with its calls is two memory messages (the text as an assistant message, then
the ``tool-call`` message): read back as the one turn the model produced, so the run's later
LLM spans continue the earlier ones (one run, one conversation).

Not carried over, reported as losses with the span and attribute: image / audio / video /
document contents, reasoning signatures and encrypted reasoning, values the instrumentation
redacted (``__REDACTED__``), further output messages (choices beyond the first), messages of a
role that no chat template has, attributes of a message this reader does not know.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools
from backend.importers.openai_chat import normalize_messages
from backend.importers.otel import Dialect, add_timing, continues, json_value, register_dialect
from backend.importers.otlp import Span
from backend.trace import ParseError
from backend.trace.messages import decode_arguments
from backend.trace.model import TerminationReason

KIND = "openinference.span.kind"
IN, OUT = "llm.input_messages.", "llm.output_messages."
REDACTED = "__REDACTED__"  # openinference.instrumentation.REDACTED_VALUE
_ROLES = {
    "system": "system", "developer": "system", "user": "user", "human": "user",
    "assistant": "assistant", "ai": "assistant", "model": "assistant", "tool": "tool", "function": "tool",
}
_KEY = re.compile(r"(\d+)\.(.*)\Z", re.S)
_FINISH = {"length": TerminationReason.RESPONSE_LENGTH, "content_filter": TerminationReason.CONTENT_FILTER}


def _kind(s: Span) -> str:
    k = s.attributes.get(KIND)
    return k.upper() if isinstance(k, str) else ""


def _is_llm(s: Span) -> bool:
    return _kind(s) == "LLM" or any(k.startswith((IN, OUT)) for k in s.attributes)


def _indexed(attrs: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``prefix + "N.rest"`` attributes → ``{N: {rest: value}}``, ordered by N."""
    out: dict[int, dict[str, Any]] = {}
    for k, v in attrs.items():
        if k.startswith(prefix):
            m = _KEY.match(k[len(prefix):])
            if m:
                out.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return dict(sorted(out.items()))


# a smolagents "Calling tools:" repr longer than this is kept as text (ast's memory is many times the text's)
_MAX_REPR_CHARS = 256 * 1024


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


class _Reader:
    """Reads one trace's spans; collects its losses."""

    def __init__(self, spans: list[Span]):
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}
        self.losses: list[str] = []
        self.tools = [s for s in spans if _kind(s) == "TOOL"]
        self.used_tools: set[str] = set()
        self.matched: set[str] = set()  # TOOL spans some conversation's call ran
        self.outputs: dict[str, dict[str, Any]] = {}  # call id -> the assistant message that made it
        self.results: dict[str, list[dict[str, Any]]] = {}  # the calls (JSON) -> their tool messages

    # ---- one message ------------------------------------------------------------------------

    def message(self, span: Span, where: str, fields: dict[str, Any]) -> tuple[dict[str, Any] | None, list[ParseError], str]:
        """``(HF message or None, parse errors, source role)`` of one flattened message."""
        f = {k.removeprefix("message."): v for k, v in fields.items()}
        raw_role = f.pop("role", None)
        role = _ROLES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if raw_role in ("tool-call", "tool-response"):  # smolagents' memory roles: read by the caller
            role = raw_role
        if role is None:
            self.losses.append(f"{where}: message of role {raw_role!r} not carried over (no chat role for it)")
            return None, [], str(raw_role)
        msg: dict[str, Any] = {"role": role}
        parts: list[str] = []
        reasoning: list[str] = []
        content = f.pop("content", None)
        if content is not None:
            parts.append(self._value(content, f"{where}.message.content"))
        contents = _indexed({k: v for k, v in f.items() if k.startswith("contents.")}, "contents.")
        for k, c in contents.items():
            cw = f"{where}.message.contents.{k}"
            c = {kk.removeprefix("message_content."): vv for kk, vv in c.items()}
            typ = c.pop("type", "text" if "text" in c else None)
            c.pop("id", None)  # a provider's id of the part: no content
            if typ in ("text", "reasoning", "thinking") and isinstance(c.get("text"), str):
                (parts if typ == "text" else reasoning).append(self._value(c.pop("text"), f"{cw}.message_content.text"))
                for extra in sorted(c):
                    self.losses.append(f"{cw}.message_content.{extra}: not carried over")
            else:
                self.losses.append(f"{cw}: {typ or 'untyped'} content not carried over: it has no text")
        errors: list[ParseError] = []
        calls = _indexed({k: v for k, v in f.items() if k.startswith("tool_calls.")}, "tool_calls.")
        out_calls = []
        for j, c in calls.items():
            c = {kk.removeprefix("tool_call."): vv for kk, vv in c.items()}
            name = c.pop("function.name", None)
            raw = c.pop("function.arguments", None)
            cid = c.pop("id", None)
            for extra in sorted(c):
                self.losses.append(f"{where}.message.tool_calls.{j}.tool_call.{extra}: not carried over")
            if not isinstance(name, str) or not name:
                self.losses.append(f"{where}.message.tool_calls.{j}: tool call without a function name not carried over")
                continue
            out_calls.append(self._call(cid, name, raw, errors, j))
        fname = f.pop("function_call_name", None)
        fargs = f.pop("function_call_arguments_json", None)
        if isinstance(fname, str) and fname and role == "assistant":  # the legacy function_call
            out_calls.append(self._call(None, fname, fargs, errors, len(out_calls)))
        elif isinstance(fname, str) and fname and role == "tool":
            msg["name"] = fname
        elif fname or fargs:
            self.losses.append(f"{where}.message.function_call_name: a function call on a {role} message not carried over")
        for k in ("name", "tool_call_id"):
            v = f.pop(k, None)
            if isinstance(v, str) and v:
                msg[k] = v
        for k in sorted(f):
            if not k.startswith(("contents.", "tool_calls.")):
                self.losses.append(f"{where}.message.{k}: not carried over")
        msg["content"] = "".join(parts)
        if reasoning and role == "assistant":
            msg["reasoning_content"] = "".join(reasoning)
        elif reasoning:
            self.losses.append(f"{where}: reasoning content of a {role} message not carried over")
        if out_calls:
            if role == "assistant":
                msg["tool_calls"] = out_calls
            else:
                self.losses.append(f"{where}: tool calls on a {role} message not carried over")
        return msg, errors, str(raw_role)

    def _value(self, v: Any, where: str) -> str:
        if v == REDACTED:
            self.losses.append(f"{where}: redacted by the instrumentation, not in the file")
        return _text(v)

    def _call(self, cid: Any, name: str, raw: Any, errors: list[ParseError], j: int) -> dict[str, Any]:
        args, err = decode_arguments(raw)
        call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
        if isinstance(cid, str) and cid:
            call["id"] = cid
        if err is not None:
            errors.append(ParseError(message=f"tool call {j} ({name!r}): {err}", raw=raw if isinstance(raw, str) else None))
        return call

    # ---- one LLM span -----------------------------------------------------------------------

    def messages(self, span: Span, prefix: str) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]], list[str]]:
        out: list[dict[str, Any]] = []
        errors: dict[int, list[ParseError]] = {}
        roles: list[str] = []
        for i, fields in _indexed(span.attributes, prefix).items():
            msg, errs, raw_role = self.message(span, f"{span.where} {prefix}{i}", fields)
            if msg is None:
                continue
            if errs:
                errors[len(out)] = errs
            out.append(msg)
            roles.append(raw_role)
        return out, errors, roles

    def tool_args(self, s: Span) -> Any:
        v = json_value(s.attributes.get("input.value"))
        if isinstance(v, dict) and "kwargs" in v and "args" in v:  # smolagents' Tool.__call__ arguments
            kw, pos = v.get("kwargs"), v.get("args")
            if isinstance(kw, dict) and not pos:
                return kw
            if isinstance(pos, list) and len(pos) == 1 and isinstance(pos[0], dict) and not kw:
                return pos[0]
        return v

    def tool_span_for(self, call: dict[str, Any], after: int | None) -> Span | None:
        """The unused TOOL span that ran ``call``: same ``tool.id``, else same name and arguments."""
        fn = call.get("function", {})
        cands = [s for s in self.tools if s.span_id not in self.used_tools and (after is None or (s.start_ns or 0) >= after)]
        cid = call.get("id")
        for s in cands:
            if cid and s.attributes.get("tool.id") == cid:
                return s
        for s in cands:
            tid = s.attributes.get("tool.id")
            if (tid in (None, "") or tid == cid) and s.attributes.get("tool.name", s.name) == fn.get("name") and self.tool_args(s) == fn.get("arguments"):
                return s
        return None

    def results_for(self, calls: list[dict[str, Any]], after: int | None) -> list[dict[str, Any]] | None:
        """Tool messages for ``calls`` from their TOOL spans; None unless every call has one."""
        key = json.dumps([[c.get("id"), c["function"]["name"], c["function"]["arguments"]] for c in calls], sort_keys=True, default=str)
        if key in self.results:  # the same round, seen again in a later LLM span's input
            return [dict(m) for m in self.results[key]]
        found = []
        for c in calls:
            s = self.tool_span_for(c, after)
            if s is None or "output.value" not in s.attributes:
                for t in found:
                    self.used_tools.discard(t.span_id)
                return None
            self.used_tools.add(s.span_id)
            found.append(s)
        out = []
        for c, s in zip(calls, found):
            m = {"role": "tool", "content": self._value(s.attributes["output.value"], f"{s.where} output.value"),
                 "name": c["function"]["name"]}
            if c.get("id"):
                m["tool_call_id"] = c["id"]
            out.append(m)
        self.results[key] = out
        return [dict(m) for m in out]

    def smolagents_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A smolagents ``tool-call`` memory message → the assistant's tool calls."""
        text = msg.get("content") or ""
        body = text.split("\n", 1)[1] if text.startswith("Calling tools:") and "\n" in text else None
        listed = None
        if body is not None and len(body) <= _MAX_REPR_CHARS:  # the parser's memory grows with the text: a visitor's file is bounded
            try:
                listed = ast.literal_eval(body.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                listed = None
        if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
            return {"role": "assistant", "content": text}
        ids = [c.get("id") for c in listed]
        prev = self.outputs.get(ids[0]) if ids and isinstance(ids[0], str) else None
        if prev is not None and [c.get("id") for c in prev.get("tool_calls") or []] == ids:
            return json.loads(json.dumps(prev))  # the model's own output (exact argument JSON, its text)
        calls = []
        for c in listed:
            fn = c.get("function") if isinstance(c.get("function"), dict) else {}
            if not isinstance(fn.get("name"), str):
                return {"role": "assistant", "content": text}
            call = {"type": "function", "function": {"name": fn["name"], "arguments": fn.get("arguments") if isinstance(fn.get("arguments"), dict) else json_value(fn.get("arguments")) or {}}}
            if isinstance(c.get("id"), str):
                call["id"] = c["id"]
            calls.append(call)
        return {"role": "assistant", "content": "", "tool_calls": calls}

    def request_messages(self, span: Span) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]], list[str]]:
        """An LLM span without ``llm.input_messages``: the messages of the request in
        ``input.value`` (an OpenAI chat request as JSON), else none (a loss)."""
        req = json_value(span.attributes.get("input.value"))
        raw = req.get("messages") if isinstance(req, dict) else None
        if isinstance(raw, list) and raw:
            try:
                msgs, errors = normalize_messages(raw, f"{span.where} input.value.messages", self.losses)
                return msgs, errors, [m["role"] for m in msgs]
            except RecordError as e:
                self.losses.append(f"LLM span {span.name!r}: input messages not carried over: {e}")
                return [], {}, []
        if req == REDACTED:
            self.losses.append(f"{span.where}: LLM span {span.name!r} input redacted by the instrumentation, not in the file")
        else:
            self.losses.append(f"{span.where}: LLM span {span.name!r} has no input messages")
        return [], {}, []

    def conversation_of(self, span: Span) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]], int]:
        """The messages of one LLM span (input + first output message), their parse errors, and
        how many are input."""
        ins, in_err, roles = self.messages(span, IN)
        if not any(k.startswith(IN) for k in span.attributes):
            ins, in_err, roles = self.request_messages(span)
        msgs: list[dict[str, Any]] = []
        errors: dict[int, list[ParseError]] = {}
        for i, (m, raw) in enumerate(zip(ins, roles)):
            if raw == "tool-call":
                m = self.smolagents_call(m)
                prev = msgs[-1] if msgs else None
                if (prev is not None and prev.get("role") == "assistant" and not prev.get("tool_calls") and m.get("tool_calls")
                        and (m.get("content") or "") in ("", prev.get("content") or "")):
                    # smolagents writes one model turn as two memory messages: its text (an
                    # assistant message) and its calls ("Calling tools:"): one turn again, as the
                    # model produced it (and as the earlier span's output holds it)
                    m = {**m, "content": prev.get("content") or ""}
                    msgs.pop()  # its parse errors, if any, stay with the merged turn
            elif raw == "tool-response":
                prev = msgs[-1] if msgs else None
                results = self.results_for(prev["tool_calls"], None) if prev and prev.get("tool_calls") else None
                if results is not None:
                    msgs.extend(results)
                    continue
                m = {"role": "user", "content": m.get("content") or ""}
            if i in in_err:
                errors[len(msgs)] = errors.get(len(msgs), []) + in_err[i]
            msgs.append(m)
        outs, out_err, _ = self.messages(span, OUT)
        n_in = len(msgs)
        if outs:
            first = outs[0]
            if first["role"] != "assistant":
                self.losses.append(f"{span.where} {OUT}0: output message of role {first['role']!r} read as the assistant's")
                first["role"] = "assistant"
            if 0 in out_err:
                errors[n_in] = out_err[0]
            msgs.append(first)
            for c in first.get("tool_calls") or []:
                if c.get("id"):
                    self.outputs[c["id"]] = first
            for k in range(1, len(outs)):
                self.losses.append(f"{span.where} {OUT}{k}: another output message (choice) not carried over")
        return msgs, errors, n_in


def _tools_of(span: Span, losses: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, f in _indexed(span.attributes, "llm.tools.").items():
        schema = json_value(f.get("tool.json_schema"))
        if schema is None:
            schema = {"name": f.get("tool.name"), "description": f.get("tool.description"), "parameters": json_value(f.get("tool.parameters"))}
            schema = {k: v for k, v in schema.items() if v is not None}
        try:
            out.extend(normalize_tools([schema], f"{span.where} llm.tools.{i}"))
        except Exception as e:  # a schema we cannot read: said, the rest imported
            losses.append(f"{span.where} llm.tools.{i}: tool schema not carried over ({e})")
    return out


def _scope(spans: list[Span]) -> tuple[str | None, str | None]:
    for s in spans:
        if s.scope_name:
            return s.scope_name, s.scope_version
    return None, None


@register_dialect
class OpenInferenceDialect(Dialect):
    name = "openinference"
    label = "OpenInference"

    def claims(self, span: Span) -> bool:
        if not _is_llm(span):
            return False
        if "gen_ai.input.messages" in span.attributes or "gen_ai.output.messages" in span.attributes:
            # a GenAI-convention chat span that names its OpenInference kind for viewers only (ours,
            # export --to otel): the GenAI reader's, unless it carries OpenInference's messages too
            return any(k.startswith((IN, OUT)) for k in span.attributes)
        return True

    def conversation(self, trace_id: str, spans: list[Span], logs: list[Any]) -> Conversation | list[Conversation] | None:
        r = _Reader(spans)
        llm = []
        for s in spans:
            if not _is_llm(s):
                continue
            p, seen = s.parent_id, set()
            while p and p in r.by_id and p not in seen:  # the same call seen by an outer instrumentation
                seen.add(p)
                if _is_llm(r.by_id[p]):
                    break
                p = r.by_id[p].parent_id
            else:
                llm.append(s)
        # chains of LLM spans, each continuing the previous one's messages
        chains: list[dict[str, Any]] = []
        for s in llm:
            msgs, errors, n_in = r.conversation_of(s)
            if not msgs:
                r.losses.append(f"{s.where}: LLM span {s.name!r} has no messages (hidden by the instrumentation's settings?)")
                continue
            target = None
            for ch in reversed(chains):
                if continues(ch["msgs"], msgs[:n_in]):
                    target = ch
                    break
            if target is None:
                target = {"spans": [], "tools_spans": []}
                chains.append(target)
            target.update(msgs=msgs, errors=errors, last=s)
            target["spans"].append(s)
        if not chains:
            return None
        out = []
        for ch in chains:
            out.append(self._finish(r, ch, trace_id, several=len(chains) > 1))
        # losses of the trace (not of one chain) go on every conversation of it
        for s in r.tools:  # a tool run that no conversation's call asked for: its result is not carried
            if s.span_id not in r.matched:
                r.losses.append(f"{s.where}: TOOL span {s.name!r} answers no tool call of the trace's LLM calls, not carried over")
        for conv in out:
            conv.losses = list(dict.fromkeys(r.losses + conv.losses))
        return out[0] if len(out) == 1 else out

    def _finish(self, r: _Reader, ch: dict[str, Any], trace_id: str, several: bool) -> Conversation:
        last: Span = ch["last"]
        msgs = [dict(m) for m in ch["msgs"]]
        losses: list[str] = []
        span_ids = [s.span_id for s in ch["spans"]]
        last_msg = msgs[-1]
        if last_msg.get("role") == "assistant" and last_msg.get("tool_calls"):
            results = r.results_for(last_msg["tool_calls"], last.start_ns)
            if results:
                msgs.extend(results)
        # the TOOL spans of this conversation: those it ran (by call id / name + arguments)
        calls = [c for m in msgs if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        t0 = min((s.start_ns or 0) for s in ch["spans"])
        tool_spans = []
        for s in r.tools:
            mine = any((c.get("id") and s.attributes.get("tool.id") == c.get("id"))
                       or (s.attributes.get("tool.name", s.name) == c["function"]["name"] and r.tool_args(s) == c["function"]["arguments"])
                       for c in calls)
            if mine and (not several or t0 <= (s.start_ns or 0)):
                tool_spans.append(s)
        tool_spans.sort(key=lambda s: s.start_ns or 0)
        r.matched.update(s.span_id for s in tool_spans)
        span_ids += [s.span_id for s in tool_spans if s.span_id in r.used_tools]
        fill_tool_message_names(msgs)
        tools = _tools_of(last, losses)
        a = last.attributes
        meta: dict[str, Any] = {}
        model = a.get("llm.model_name") or a.get("llm.response.model_name") or a.get("llm.request.model_name")
        if isinstance(model, str) and model:
            meta["model"] = model
        usage: dict[str, int] = {}
        for s in ch["spans"]:
            for src, dst in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"), ("total", "total_tokens")):
                v = s.attributes.get(f"llm.token_count.{src}")
                if isinstance(v, int) and not isinstance(v, bool):
                    usage[dst] = usage.get(dst, 0) + v
        if usage:
            meta["usage"] = usage
        meta["llm_calls"] = len(ch["spans"])
        params = json_value(a.get("llm.invocation_parameters"))
        if isinstance(params, dict) and params:
            meta["invocation_parameters"] = params
        add_timing(meta, ch["spans"], tool_spans, several=several, t0=t0)
        finish = a.get("llm.finish_reason")
        if isinstance(finish, str) and finish:
            meta["finish_reason"] = finish
        lib, ver = _scope(ch["spans"])
        prov: dict[str, Any] = {"format": self.label, "trace_id": trace_id, "span_ids": span_ids}
        if lib:
            prov["library"] = lib
            if ver:
                prov["version"] = ver
        return Conversation(
            messages=msgs, tools=tools, metadata=meta, parse_errors=ch["errors"], losses=losses, provenance=prov,
            finish_reason=finish if isinstance(finish, str) and finish else None,
            termination_reason=_FINISH.get(finish) if isinstance(finish, str) else None,
            id=f"{trace_id}-{ch['spans'][0].span_id}" if several else None,
        )


__all__ = ["OpenInferenceDialect"]
