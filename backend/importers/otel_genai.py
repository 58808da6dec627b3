"""OpenTelemetry GenAI semantic conventions → conversations.

A dialect of the ``otel`` importer (:mod:`backend.importers.otel`). It reads what the
instrumentations write for a model call:

* the current (experimental) conventions — ``gen_ai.input.messages``,
  ``gen_ai.output.messages``, ``gen_ai.system_instructions``, ``gen_ai.tool.definitions``: JSON
  strings on a span (content capture ``SPAN_ONLY``), or structured values on a
  ``gen_ai.client.inference.operation.details`` log record (``EVENT_ONLY``). A message is
  ``{"role", "parts": [...], "finish_reason"?}``; parts ``text``, ``tool_call`` (id, name,
  arguments), ``tool_call_response`` (id, response), ``reasoning`` (and ``refusal``, which
  OpenLLMetry writes) are carried over;
* the per-message events of the older conventions — ``gen_ai.system.message``,
  ``gen_ai.user.message``, ``gen_ai.assistant.message``, ``gen_ai.tool.message`` and
  ``gen_ai.choice`` log records (OpenLLMetry with ``use_attributes=False``); a tool message
  event without an id (OpenLLMetry drops it) answers the calls of the assistant turn before it,
  in order;
* OpenLLMetry's flattened attributes — ``gen_ai.prompt.N.role | content | tool_call_id |
  tool_calls.M.id | name | arguments``, ``gen_ai.completion.N.…`` (+ ``finish_reason``,
  ``refusal``) and ``llm.request.functions.N.name | description | parameters``.

Model calls are spans whose ``gen_ai.operation.name`` is ``chat`` / ``text_completion`` /
``generate_content`` or that carry message content (``invoke_agent`` spans only when no model
call span has content; a model call span inside another one is the same call seen twice: the
outer one is read). A trace's conversation is its last model call's input + output messages; a
call whose input does not continue an earlier call's messages starts another conversation of
the same trace (two agent runs in one trace give two conversations). ``execute_tool`` spans
(``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments`` /
``gen_ai.tool.call.result``) give ``metadata.tool_durations_s`` and the results of calls that no
model call's input shows. Tool definitions come from the last call, else from the enclosing
``invoke_agent`` span. ``invoke_agent`` and other spans serve grouping and timing.

``metadata``: ``model``, ``finish_reason``, ``usage`` (input / output tokens summed over the
conversation's model calls), ``chat_spans`` (span id, input / output tokens, duration of each
call), ``tool_durations_s``. Provenance: the instrumentation scope of the model call spans (name
and version), the trace id and the span ids the messages came from.

Not carried over, each a loss with its place (span and attribute): an attribute value that is
not valid JSON (an SDK attribute length limit cuts long values, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``:
the rest of the trace is still read, a cut input rebuilt from the earlier call, the tool spans'
results and the last output), parts with no text (``blob``, ``uri``, ``file``, server tool
calls, unknown types), messages of a role no chat template has, further output messages
(choices beyond the first), a model call span with no content, a tool span result that looks
cut.
"""

from __future__ import annotations

import json
import re
from typing import Any

from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, text_of
from backend.importers.otel import Dialect, register_dialect
from backend.importers.otlp import LogRecord, Span
from backend.trace import ParseError
from backend.trace.messages import decode_arguments
from backend.trace.model import TerminationReason

OP = "gen_ai.operation.name"
IN, OUT, SYS, TOOLS = "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions"
CONTENT_KEYS = (IN, OUT, SYS)
PROMPT_PREFIXES = ("gen_ai.prompt.", "llm.prompts.")
COMPLETION_PREFIXES = ("gen_ai.completion.", "llm.completions.")
FUNCTIONS = "llm.request.functions."
LLM_OPS = {"chat", "text_completion", "generate_content", "completion"}
AGENT_OPS = {"invoke_agent", "create_agent", "invoke_workflow"}
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
MESSAGE_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                  "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}
CHOICE_EVENT = "gen_ai.choice"
ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user", "assistant": "assistant",
         "model": "assistant", "ai": "assistant", "tool": "tool", "function": "tool"}
FINISH = {"length": TerminationReason.RESPONSE_LENGTH, "max_tokens": TerminationReason.RESPONSE_LENGTH,
          "content_filter": TerminationReason.CONTENT_FILTER}
_IDX = re.compile(r"(\d+)\.(.*)\Z", re.S)


def _has_content(attrs: dict[str, Any]) -> bool:
    return any(k in attrs for k in CONTENT_KEYS) or any(k.startswith(PROMPT_PREFIXES + COMPLETION_PREFIXES) for k in attrs)


def _op(attrs: dict[str, Any]) -> str:
    v = attrs.get(OP)
    if not isinstance(v, str):
        v = attrs.get("llm.request.type")  # OpenLLMetry before gen_ai.operation.name
    return v.lower() if isinstance(v, str) else ""


def _indexed(attrs: dict[str, Any], prefixes: tuple[str, ...]) -> tuple[str, dict[int, dict[str, Any]]]:
    """``prefix + "N.rest"`` attributes → ``(prefix, {N: {rest: value}})``, ordered by N."""
    for prefix in prefixes:
        out: dict[int, dict[str, Any]] = {}
        for k, v in attrs.items():
            if k.startswith(prefix):
                m = _IDX.match(k[len(prefix):])
                if m:
                    out.setdefault(int(m.group(1)), {})[m.group(2)] = v
        if out:
            return prefix, dict(sorted(out.items()))
    return prefixes[0], {}


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class _Call:
    """One model call: its span (or log records only), messages and what it says of itself."""

    def __init__(self, key: str, span: Span | None, attrs: dict[str, Any], where: str, order: tuple[int, int]):
        self.key = key
        self.span = span
        self.attrs = attrs  # the span's attributes, or the details event's
        self.where = where
        self.order = order
        self.input: list[dict[str, Any]] | None = []  # None: the input could not be read
        self.output: list[dict[str, Any]] | None = []
        self.in_errors: dict[int, list[ParseError]] = {}
        self.out_errors: list[ParseError] = []
        self.in_losses: list[str] = []  # about the input (moot once a later call's input is read)
        self.out_losses: list[str] = []
        self.losses: list[str] = []  # always said
        self.tools: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.scope: tuple[str | None, str | None] = (span.scope_name, span.scope_version) if span else (None, None)
        self.span_id: str | None = span.span_id if span else None  # or the log records' span

    @property
    def full(self) -> list[dict[str, Any]]:
        return (self.input or []) + (self.output or [])


class _Reader:
    def __init__(self, spans: list[Span], logs: list[LogRecord]):
        self.spans = spans
        self.logs = logs
        self.by_id = {s.span_id: s for s in spans}
        self.losses: list[str] = []  # of the trace, not of one conversation

    # ---- values ---------------------------------------------------------------------------------

    def json_attr(self, attrs: dict[str, Any], key: str, where: str, losses: list[str]) -> Any:
        """An attribute that holds JSON (a string to parse, or an already structured value);
        None (and a loss) when it does not parse."""
        v = attrs.get(key)
        if not isinstance(v, str):
            return v
        try:
            return json.loads(v)
        except (json.JSONDecodeError, RecursionError, ValueError) as e:
            why = f"{e.msg} (char {e.pos})" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            losses.append(f"{where} {key}: not valid JSON ({why}; {len(v)} characters: cut by an attribute length "
                          f"limit?), not carried over")
            return None

    # ---- the current conventions: messages of parts -----------------------------------------------

    def part_messages(self, raw: Any, where: str, losses: list[str], errors: dict[int, list[ParseError]] | None = None,
                      output: bool = False) -> tuple[list[dict[str, Any]], str | None]:
        """``gen_ai.input.messages`` / ``gen_ai.output.messages`` (parsed) → HF messages, and the
        finish reason of the first output message. Only the first output message is read."""
        if raw is None:
            return [], None
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list):
            losses.append(f"{where}: a {type(raw).__name__}, not a list of messages: not carried over")
            return [], None
        out: list[dict[str, Any]] = []
        finish = None
        for i, m in enumerate(raw):
            w = f"{where}[{i}]"
            if output and i > 0:
                losses.append(f"{w}: another output message (choice) not carried over")
                continue
            if not isinstance(m, dict):
                losses.append(f"{w}: a {type(m).__name__}, not a message: not carried over")
                continue
            raw_role = m.get("role")
            role = ROLES.get(raw_role.lower()) if isinstance(raw_role, str) and raw_role else ("assistant" if output else None)
            if output and role != "assistant":
                if role is not None:
                    losses.append(f"{w}: output message of role {raw_role!r} read as the assistant's")
                role = "assistant"
            if role is None:
                losses.append(f"{w}: message of role {raw_role!r} not carried over (no chat role for it)")
                continue
            if output and isinstance(m.get("finish_reason"), str) and m["finish_reason"]:
                finish = m["finish_reason"]
            parts = m.get("parts")
            if parts is None and "content" in m:  # a plain {role, content} message
                parts = [{"type": "text", "content": m["content"]}] if isinstance(m["content"], str) else m["content"]
            if parts is None:
                parts = []
            if not isinstance(parts, list):
                losses.append(f"{w}.parts: a {type(parts).__name__}, not a list of parts: not carried over")
                parts = []
            msg: dict[str, Any] = {"role": role}
            texts: list[str] = []
            reasoning: list[str] = []
            calls: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            call_errors: list[ParseError] = []
            for j, p in enumerate(parts):
                pw = f"{w}.parts[{j}]"
                if isinstance(p, str):
                    texts.append(p)
                    continue
                if not isinstance(p, dict):
                    losses.append(f"{pw}: a {type(p).__name__}, not a part: not carried over")
                    continue
                typ = p.get("type")
                if typ is None and isinstance(p.get("content"), str):
                    typ = "text"
                if typ in ("text", "refusal") and isinstance(p.get("content", p.get("text")), str):
                    texts.append(p.get("content", p.get("text")))
                elif typ in ("reasoning", "thinking") and isinstance(p.get("content"), str):
                    reasoning.append(p["content"])
                elif typ in ("tool_call", "function_call"):
                    name = p.get("name")
                    if not isinstance(name, str) or not name:
                        losses.append(f"{pw}: tool call without a name not carried over")
                        continue
                    args, err = decode_arguments(p.get("arguments"))
                    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
                    if isinstance(p.get("id"), str) and p["id"]:
                        call["id"] = p["id"]
                    calls.append(call)
                    if err is not None:
                        raw_args = p.get("arguments")
                        call_errors.append(ParseError(message=f"tool call {len(calls) - 1} ({name!r}): {err}",
                                                      raw=raw_args if isinstance(raw_args, str) else None))
                elif typ in ("tool_call_response", "function_call_response", "tool_result"):
                    resp = p.get("response", p.get("result"))
                    tm: dict[str, Any] = {"role": "tool", "content": "" if resp is None else _text(resp)}
                    if isinstance(p.get("id"), str) and p["id"]:
                        tm["tool_call_id"] = p["id"]
                    results.append(tm)
                else:
                    what = f"{typ} part" if isinstance(typ, str) and typ else "untyped part"
                    extra = f" ({p['modality']})" if isinstance(p.get("modality"), str) else ""
                    losses.append(f"{pw}: {what}{extra} not carried over: it has no text")
            if reasoning:
                if role == "assistant":
                    msg["reasoning_content"] = "".join(reasoning)
                else:
                    losses.append(f"{w}: reasoning of a {role} message not carried over")
            if calls and role != "assistant":
                losses.append(f"{w}: tool calls on a {role} message not carried over")
                calls = []
            if role == "tool":
                # a tool message: its responses (a text part alone answers the call named by the message)
                if results:
                    out.extend(results)
                    if texts:
                        losses.append(f"{w}: text beside the tool results not carried over")
                else:
                    tm = {"role": "tool", "content": "".join(texts)}
                    if isinstance(m.get("tool_call_id", m.get("id")), str):
                        tm["tool_call_id"] = m.get("tool_call_id", m.get("id"))
                    out.append(tm)
                continue
            msg["content"] = "".join(texts)
            if calls:
                msg["tool_calls"] = calls
            if texts or calls or reasoning or not results:
                if call_errors and errors is not None:
                    errors[len(out)] = call_errors
                out.append(msg)
            out.extend(results)  # responses inside a user message (Anthropic-shaped histories)
        return out, finish

    def system_messages(self, raw: Any, where: str, losses: list[str]) -> list[dict[str, Any]]:
        if raw is None:
            return []
        if isinstance(raw, str):
            return [{"role": "system", "content": raw}]
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list):
            losses.append(f"{where}: a {type(raw).__name__}, not a list of parts: not carried over")
            return []
        msgs, _ = self.part_messages([{"role": "system", "parts": raw}], where, losses)
        return [m for m in msgs if m.get("content")]

    # ---- OpenLLMetry's flattened attributes ----------------------------------------------------------

    def flat_messages(self, attrs: dict[str, Any], prefixes: tuple[str, ...], where: str, losses: list[str],
                      errors: dict[int, list[ParseError]] | None, output: bool) -> tuple[list[dict[str, Any]], str | None]:
        prefix, items = _indexed(attrs, prefixes)
        out: list[dict[str, Any]] = []
        finish = None
        for k, (i, f) in enumerate(items.items()):
            w = f"{where} {prefix}{i}"
            if output and k > 0:
                losses.append(f"{w}: another completion (choice) not carried over")
                continue
            f = dict(f)
            raw_role = f.pop("role", None)
            role = ROLES.get(raw_role.lower()) if isinstance(raw_role, str) else ("assistant" if output else None)
            if output:
                role = "assistant"
            if role is None:
                losses.append(f"{w}: message of role {raw_role!r} not carried over (no chat role for it)")
                continue
            fr = f.pop("finish_reason", None)
            if output and isinstance(fr, str) and fr:
                finish = fr
            msg: dict[str, Any] = {"role": role}
            content = f.pop("content", None)
            refusal = f.pop("refusal", None)
            if isinstance(content, str) and content[:2] == "[{":  # a list of content parts, JSON-encoded
                try:
                    parts = json.loads(content)
                except (json.JSONDecodeError, RecursionError, ValueError):
                    parts = None
                if isinstance(parts, list) and parts and all(isinstance(p, dict) and "type" in p for p in parts):
                    try:
                        content = text_of(parts, f"{w}.content", losses)
                    except RecordError as e:
                        losses.append(str(e))
                        content = ""
            if content is not None and not isinstance(content, str):
                content = _text(content)
            if not content and isinstance(refusal, str):
                content = refusal
            msg["content"] = content or ""
            for key in ("tool_call_id", "name"):
                v = f.pop(key, None)
                if isinstance(v, str) and v and (key == "tool_call_id" or role == "tool"):
                    msg[key] = v
            f.pop("content_filter_results", None)  # the provider's moderation verdicts: no content
            _, calls_raw = _indexed({k2: v for k2, v in f.items() if k2.startswith("tool_calls.")}, ("tool_calls.",))
            calls = []
            call_errors: list[ParseError] = []
            for j, c in calls_raw.items():
                name = c.get("name")
                if not isinstance(name, str) or not name:
                    losses.append(f"{w}.tool_calls.{j}: tool call without a name not carried over")
                    continue
                args, err = decode_arguments(c.get("arguments"))
                call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
                if isinstance(c.get("id"), str) and c["id"]:
                    call["id"] = c["id"]
                calls.append(call)
                if err is not None:
                    raw_args = c.get("arguments")
                    call_errors.append(ParseError(message=f"tool call {len(calls) - 1} ({name!r}): {err}",
                                                  raw=raw_args if isinstance(raw_args, str) else None))
                for extra in sorted(set(c) - {"name", "arguments", "id"}):
                    losses.append(f"{w}.tool_calls.{j}.{extra}: not carried over")
            for extra in sorted(k2 for k2 in f if not k2.startswith("tool_calls.")):
                losses.append(f"{w}.{extra}: not carried over")
            if calls:
                if role == "assistant":
                    msg["tool_calls"] = calls
                    if call_errors and errors is not None:
                        errors[len(out)] = call_errors
                else:
                    losses.append(f"{w}: tool calls on a {role} message not carried over")
            out.append(msg)
        return out, finish

    def flat_tools(self, attrs: dict[str, Any], where: str, losses: list[str]) -> list[dict[str, Any]]:
        _, items = _indexed(attrs, (FUNCTIONS,))
        out = []
        for i, f in items.items():
            params = f.get("parameters")
            if isinstance(params, str):
                try:
                    params = json.loads(params)
                except (json.JSONDecodeError, RecursionError, ValueError):
                    losses.append(f"{where} {FUNCTIONS}{i}.parameters: not valid JSON (cut by an attribute length limit?), not carried over")
                    params = None
            schema = {k: v for k, v in (("name", f.get("name")), ("description", f.get("description")), ("parameters", params)) if v is not None}
            try:
                out.extend(normalize_tools([schema], f"{where} {FUNCTIONS}{i}"))
            except RecordError as e:
                losses.append(f"{e}: tool schema not carried over")
        return out

    def tool_defs(self, attrs: dict[str, Any], where: str, losses: list[str]) -> list[dict[str, Any]]:
        if TOOLS in attrs:
            raw = self.json_attr(attrs, TOOLS, where, losses)
            if raw is None:
                return []
            try:
                return normalize_tools(raw, f"{where} {TOOLS}")
            except RecordError as e:
                losses.append(f"{e}: tool schemas not carried over")
                return []
        return self.flat_tools(attrs, where, losses)

    # ---- the older per-message events ------------------------------------------------------------------

    def event_messages(self, logs: list[LogRecord], call: _Call) -> None:
        ins: list[dict[str, Any]] = []
        outs: list[dict[str, Any]] = []
        pending: list[str] = []  # call ids of the last assistant turn not answered yet
        for lg in logs:
            w = f"{lg.where} ({lg.event_name})"
            body = lg.body if isinstance(lg.body, dict) else ({"content": lg.body} if lg.body is not None else {})
            if lg.event_name == CHOICE_EVENT:
                idx = body.get("index")
                if outs or (isinstance(idx, int) and idx > 0):
                    call.out_losses.append(f"{w}: another choice not carried over")
                    continue
                m = body.get("message") if isinstance(body.get("message"), dict) else {}
                calls_raw = body.get("tool_calls") or m.get("tool_calls")
                msg = self._event_message("assistant", m.get("content"), calls_raw, w, call.out_losses, call.out_errors)
                outs.append(msg)
                fr = body.get("finish_reason")
                if isinstance(fr, str) and fr and fr != "unknown":
                    call.finish = fr
                continue
            role = MESSAGE_EVENTS[lg.event_name]
            if isinstance(body.get("role"), str) and ROLES.get(body["role"].lower()):
                role = ROLES[body["role"].lower()]
            errs: list[ParseError] = []
            msg = self._event_message(role, body.get("content"), body.get("tool_calls"), w, call.in_losses, errs)
            if errs:
                call.in_errors[len(ins)] = errs
            if role == "assistant":
                pending = [c["id"] for c in msg.get("tool_calls") or [] if c.get("id")]
            elif role == "tool":
                tid = body.get("id", body.get("tool_call_id"))
                if isinstance(tid, str) and tid:
                    msg["tool_call_id"] = tid
                    if tid in pending:
                        pending.remove(tid)
                elif pending:  # no id in the event: it answers the next call of the turn
                    msg["tool_call_id"] = pending.pop(0)
            ins.append(msg)
        call.input, call.output = ins, outs

    def _event_message(self, role: str, content: Any, calls_raw: Any, where: str, losses: list[str], errors: list[ParseError]) -> dict[str, Any]:
        try:
            text = text_of(content, f"{where} content", losses)
        except RecordError as e:
            losses.append(f"{e}: not carried over")
            text = ""
        msg: dict[str, Any] = {"role": role, "content": text or ""}
        calls = []
        for j, c in enumerate(calls_raw if isinstance(calls_raw, list) else []):
            fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else c if isinstance(c, dict) else {}
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                losses.append(f"{where} tool_calls[{j}]: tool call without a name not carried over")
                continue
            args, err = decode_arguments(fn.get("arguments"))
            call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
            if isinstance(c.get("id"), str) and c["id"]:
                call["id"] = c["id"]
            calls.append(call)
            if err is not None:
                raw = fn.get("arguments")
                errors.append(ParseError(message=f"tool call {len(calls) - 1} ({name!r}): {err}", raw=raw if isinstance(raw, str) else None))
        if calls:
            if role == "assistant":
                msg["tool_calls"] = calls
            else:
                losses.append(f"{where}: tool calls on a {role} message not carried over")
        return msg

    # ---- one model call ------------------------------------------------------------------------------

    def read_call(self, call: _Call, events: list[LogRecord]) -> None:
        a, w = call.attrs, call.where
        if any(k in a for k in CONTENT_KEYS) or not events:
            if IN in a or not any(k.startswith(PROMPT_PREFIXES) for k in a):
                raw = self.json_attr(a, IN, w, call.in_losses)
                if raw is None and isinstance(a.get(IN), str):
                    call.input = None
                else:
                    call.input, _ = self.part_messages(raw, f"{w} {IN}", call.in_losses, call.in_errors)
            else:
                call.input, _ = self.flat_messages(a, PROMPT_PREFIXES, w, call.in_losses, call.in_errors, output=False)
            if OUT in a or not any(k.startswith(COMPLETION_PREFIXES) for k in a):
                raw = self.json_attr(a, OUT, w, call.out_losses)
                if raw is None and isinstance(a.get(OUT), str):
                    call.output = None
                else:
                    errs: dict[int, list[ParseError]] = {}
                    call.output, call.finish = self.part_messages(raw, f"{w} {OUT}", call.out_losses, errs, output=True)
                    call.out_errors = errs.get(0, [])
            else:
                errs = {}
                call.output, call.finish = self.flat_messages(a, COMPLETION_PREFIXES, w, call.out_losses, errs, output=True)
                call.out_errors = errs.get(0, [])
            if SYS in a:
                raw = self.json_attr(a, SYS, w, call.in_losses)
                if raw is None and isinstance(a.get(SYS), str):
                    call.input = None
                elif call.input is not None:
                    system = self.system_messages(raw, f"{w} {SYS}", call.in_losses)
                    if system and not (call.input and call.input[0].get("role") == "system"
                                       and call.input[0].get("content") == system[0].get("content")):
                        call.input = system + call.input
                        call.in_errors = {i + len(system): e for i, e in call.in_errors.items()}
        else:
            self.event_messages(events, call)
        call.tools = self.tool_defs(a, w, call.losses)
        if call.finish is None:
            frs = a.get("gen_ai.response.finish_reasons")
            if isinstance(frs, list) and frs and isinstance(frs[0], str):
                call.finish = frs[0]
            elif isinstance(frs, str) and frs:
                call.finish = frs

    def usage(self, call: _Call) -> tuple[int | None, int | None]:
        a = call.attrs
        i = _int(a.get("gen_ai.usage.input_tokens"))
        o = _int(a.get("gen_ai.usage.output_tokens"))
        if i is None:
            i = _int(a.get("gen_ai.usage.prompt_tokens"))
        if o is None:
            o = _int(a.get("gen_ai.usage.completion_tokens"))
        return i, o


def _calls_of(m: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True, ensure_ascii=False, default=str), c.get("id"))
            for c in m.get("tool_calls") or []]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same turn: role, text, calls (ids compared where both have them), result id."""
    if a.get("role") != b.get("role") or (a.get("content") or "") != (b.get("content") or ""):
        return False
    ca, cb = _calls_of(a), _calls_of(b)
    if len(ca) != len(cb) or any(x[:2] != y[:2] or (x[2] and y[2] and x[2] != y[2]) for x, y in zip(ca, cb)):
        return False
    ta, tb = a.get("tool_call_id"), b.get("tool_call_id")
    return not (ta and tb and ta != tb)


def _continues(prev: list[dict[str, Any]], nxt: list[dict[str, Any]]) -> bool:
    return bool(prev) and len(prev) <= len(nxt) and all(_same(a, b) for a, b in zip(prev, nxt))


@register_dialect
class OTelGenAIDialect(Dialect):
    name = "otel-genai"
    label = "OTel GenAI"

    def claims(self, span: Span) -> bool:
        a = span.attributes
        return isinstance(a.get(OP), str) or _has_content(a) or any(k.startswith(FUNCTIONS) for k in a)

    def claims_log(self, log: LogRecord) -> bool:
        return (log.event_name in MESSAGE_EVENTS or log.event_name in (CHOICE_EVENT, DETAILS_EVENT)
                or any(k in log.attributes for k in (IN, OUT)))

    # ---- the trace -----------------------------------------------------------------------------------

    def conversation(self, trace_id: str, spans: list[Span], logs: list[LogRecord]) -> Conversation | list[Conversation] | None:
        r = _Reader(spans, logs)
        details: dict[str | None, LogRecord] = {}
        events: dict[str | None, list[LogRecord]] = {}
        for lg in logs:
            if lg.event_name == DETAILS_EVENT or (lg.event_name not in MESSAGE_EVENTS and lg.event_name != CHOICE_EVENT
                                                  and any(k in lg.attributes for k in (IN, OUT))):
                details.setdefault(lg.span_id, lg)
            elif lg.event_name in MESSAGE_EVENTS or lg.event_name == CHOICE_EVENT:
                events.setdefault(lg.span_id, []).append(lg)

        def is_llm(s: Span) -> bool:
            op = _op(s.attributes)
            if op in LLM_OPS:
                return True
            return op not in AGENT_OPS and op != "execute_tool" and _has_content(s.attributes)

        llm = [s for s in spans if is_llm(s)]
        if not any(_has_content(s.attributes) or s.span_id in details or s.span_id in events for s in llm):
            agents = [s for s in spans if _op(s.attributes) in AGENT_OPS and _has_content(s.attributes)]
            if agents:
                llm = agents
        llm_ids = {s.span_id for s in llm}
        kept = []
        for s in llm:  # a call inside another call (a framework's span around the client's): read the outer one
            p, seen = s.parent_id, set()
            while p and p in r.by_id and p not in seen:
                seen.add(p)
                if p in llm_ids:
                    break
                p = r.by_id[p].parent_id
            else:
                kept.append(s)
        calls: list[_Call] = []
        for k, s in enumerate(kept):
            det = details.get(s.span_id)
            attrs = s.attributes
            where = f"{s.where} (span {s.span_id} {s.name!r})"
            if det is not None and not any(key in attrs for key in CONTENT_KEYS):
                attrs = {**det.attributes, **{key: v for key, v in attrs.items() if key not in det.attributes}}
                where = f"{det.where} ({DETAILS_EVENT} of span {s.span_id})"
            c = _Call(s.span_id, s, attrs, where, (s.start_ns or 0, k))
            r.read_call(c, events.get(s.span_id, []))
            if not c.input and not c.output and c.input is not None and c.output is not None:
                r.losses.append(f"{s.where} (span {s.span_id} {s.name!r}): model call span without messages (content "
                                f"capture off?), its content is not in the file")
                continue
            calls.append(c)
        # log records of calls whose spans are not in the file (a logs-only export)
        consumed = {s.span_id for s in kept}
        for sid, det in details.items():
            if sid not in consumed and sid not in llm_ids:
                c = _Call(f"log:{det.where}", None, det.attributes, f"{det.where} ({DETAILS_EVENT})", (det.time_ns or 0, len(calls)))
                c.scope, c.span_id = (det.scope_name, det.scope_version), sid
                r.read_call(c, [])
                calls.append(c)
        for sid, evs in events.items():
            if sid not in consumed and sid not in llm_ids:
                c = _Call(f"log:{evs[0].where}", None, {}, evs[0].where, (evs[0].time_ns or 0, len(calls)))
                c.scope, c.span_id = (evs[0].scope_name, evs[0].scope_version), sid
                r.read_call(c, evs)
                if c.input or c.output:
                    calls.append(c)
        if not calls:
            return None
        calls.sort(key=lambda c: c.order)
        # chains of calls, each continuing an earlier call's messages
        chains: list[list[_Call]] = []
        for c in calls:
            target = None
            if c.input is None:  # unreadable input: the latest conversation goes on
                target = chains[-1] if chains else None
            else:
                for ch in reversed(chains):
                    last_good = next((x for x in reversed(ch) if x.input is not None), None)
                    if last_good is not None and _continues(last_good.full, c.input):
                        target = ch
                        break
            if target is None:
                chains.append([c])
            else:
                target.append(c)
        tool_spans = sorted((s for s in spans if _op(s.attributes) == "execute_tool"), key=lambda s: s.start_ns or 0)
        owner = self._tool_owners(tool_spans, chains)
        out = [self._finish(r, ch, [s for s in tool_spans if owner.get(s.span_id) is ch], len(chains) > 1) for ch in chains]
        out = [c for c in out if c.messages]
        if not out:
            return None
        out[0].losses = list(dict.fromkeys(r.losses + out[0].losses))  # the trace's, said once
        return out[0] if len(out) == 1 else out

    def _tool_owners(self, tool_spans: list[Span], chains: list[list[_Call]]) -> dict[str, list[_Call]]:
        """Which conversation ran each tool span: the one with its call id, else the one whose
        last model call before it started latest."""
        owner: dict[str, list[_Call]] = {}
        ids = []  # the call ids of each conversation: its calls' outputs, and its last readable input
        for ch in chains:
            last_in = next((x.input for x in reversed(ch) if x.input is not None), [])
            ids.append({c.get("id") for m in [*last_in, *(m for x in ch for m in x.output or [])] for c in m.get("tool_calls") or []})
        for s in tool_spans:
            cid = s.attributes.get("gen_ai.tool.call.id")
            for ch, its in zip(chains, ids):
                if cid and cid in its:
                    owner[s.span_id] = ch
                    break
            else:
                best, best_t = None, -1
                for ch in chains:
                    for x in ch:
                        t = x.order[0]
                        if t <= (s.start_ns or 0) and t > best_t:
                            best, best_t = ch, t
                if best is not None:
                    owner[s.span_id] = best
        return owner

    def _finish(self, r: _Reader, ch: list[_Call], tool_spans: list[Span], several: bool) -> Conversation:
        good = [k for k, c in enumerate(ch) if c.input is not None]
        base = good[-1] if good else 0
        losses: list[str] = []
        msgs: list[dict[str, Any]] = []
        errors: dict[int, list[ParseError]] = {}
        used_tool_spans: list[str] = []
        for k, c in enumerate(ch):
            if k < base:
                continue  # a later call's input carries these messages
            if k == base and c.input is not None:
                msgs = [dict(m) for m in c.input]
                errors = dict(c.in_errors)
                losses += c.in_losses
            else:  # this call's input could not be read: what came before + the tools' results
                losses += c.in_losses
                used_tool_spans += self._add_results(r, msgs, tool_spans, losses)
            if c.output is None:
                losses += c.out_losses
                continue
            if c.out_errors:
                errors[len(msgs)] = c.out_errors
            msgs += [dict(m) for m in c.output]
            losses += c.out_losses
        used_tool_spans += self._add_results(r, msgs, tool_spans, losses)
        for c in ch:
            losses += c.losses
        fill_tool_message_names(msgs)
        last = ch[-1]
        tools = last.tools
        if not tools:
            tools = self._agent_tools(r, last, losses) or next((c.tools for c in reversed(ch) if c.tools), [])
        meta: dict[str, Any] = {}
        a = last.attrs
        model = a.get("gen_ai.response.model") or a.get("gen_ai.request.model")
        if isinstance(model, str) and model:
            meta["model"] = model
        finish = next((c.finish for c in reversed(ch) if c.output is not None), None)
        if finish:
            meta["finish_reason"] = finish
        usage = {"input_tokens": 0, "output_tokens": 0}
        per_call = []
        for c in ch:
            i, o = r.usage(c)
            usage["input_tokens"] += i or 0
            usage["output_tokens"] += o or 0
            per_call.append({"span_id": c.span_id, "input_tokens": i, "output_tokens": o,
                             "duration_s": c.span.duration_s if c.span else None})
        if any(p["input_tokens"] is not None or p["output_tokens"] is not None for p in per_call):
            meta["usage"] = usage
        meta["chat_spans"] = per_call
        if tool_spans:
            meta["tool_durations_s"] = [s.duration_s for s in tool_spans]
        if several:
            own = [c.span for c in ch if c.span] + tool_spans
            starts = [s.start_ns for s in own if s.start_ns is not None]
            ends = [s.end_ns for s in own if s.end_ns is not None]
            agent = self._agent_of(r, last)
            if agent is not None and agent.duration_s is not None:
                meta["duration_s"] = agent.duration_s
            elif starts and ends:
                meta["duration_s"] = max(0, max(ends) - min(starts)) / 1e9
        prov: dict[str, Any] = {"format": self.label}
        lib, ver = next((c.scope for c in reversed(ch) if c.scope[0]), (None, None))
        if lib:
            prov["library"] = lib
            if ver:
                prov["version"] = ver
        ids = [c.span_id for c in ch if c.span_id] + used_tool_spans
        if ids:
            prov["span_ids"] = list(dict.fromkeys(ids))
        return Conversation(
            messages=msgs, tools=tools, metadata=meta, parse_errors=errors, losses=list(dict.fromkeys(losses)),
            provenance=prov, finish_reason=finish,
            termination_reason=FINISH.get(finish) if finish else None,
        )

    def _add_results(self, r: _Reader, msgs: list[dict[str, Any]], tool_spans: list[Span], losses: list[str]) -> list[str]:
        """Tool messages from the ``execute_tool`` spans for calls of ``msgs`` that no message
        answers; returns the spans used."""
        answered = {m.get("tool_call_id") for m in msgs if m.get("role") == "tool"}
        used = []
        i = 0
        while i < len(msgs):
            m = msgs[i]
            i += 1
            if m.get("role") != "assistant" or not m.get("tool_calls"):
                continue
            while i < len(msgs) and msgs[i].get("role") == "tool":
                i += 1
            add = []
            for c in m["tool_calls"]:
                cid = c.get("id")
                if not cid or cid in answered:
                    continue
                s = next((s for s in tool_spans if s.attributes.get("gen_ai.tool.call.id") == cid and "gen_ai.tool.call.result" in s.attributes), None)
                if s is None:
                    continue
                res = s.attributes["gen_ai.tool.call.result"]
                content = _text(res)
                if isinstance(res, str) and res[:1] in "[{":
                    try:
                        json.loads(res)
                    except (json.JSONDecodeError, RecursionError, ValueError):
                        losses.append(f"{s.where} (span {s.span_id} {s.name!r}) gen_ai.tool.call.result: not valid JSON "
                                      f"({len(res)} characters: cut by an attribute length limit?), carried over as it is, "
                                      f"the rest is not in the file")
                add.append({"role": "tool", "content": content, "tool_call_id": cid, "name": c["function"]["name"]})
                answered.add(cid)
                used.append(s.span_id)
            msgs[i:i] = add
            i += len(add)
        return used

    def _agent_of(self, r: _Reader, call: _Call) -> Span | None:
        p, seen = call.span.parent_id if call.span else None, set()
        while p and p in r.by_id and p not in seen:
            seen.add(p)
            s = r.by_id[p]
            if _op(s.attributes) in AGENT_OPS:
                return s
            p = s.parent_id
        return None

    def _agent_tools(self, r: _Reader, call: _Call, losses: list[str]) -> list[dict[str, Any]]:
        """Tool definitions of the agent span around the call (the agent's tools)."""
        p, seen = call.span.parent_id if call.span else None, set()
        while p and p in r.by_id and p not in seen:
            seen.add(p)
            s = r.by_id[p]
            if TOOLS in s.attributes:
                return r.tool_defs(s.attributes, f"{s.where} (span {s.span_id} {s.name!r})", losses)
            p = s.parent_id
        return []


__all__ = ["OTelGenAIDialect"]
