"""Chat-completions logs → traces.

Accepted records:

* ``{"request": {"messages", "tools", ...}, "response": {"choices": [{"message", "finish_reason"}]}}``
  — the request's messages plus each choice's message (one trace per choice);
* OpenAI Batch API lines: ``{"custom_id", "body": {"messages", ...}}`` (requests) and
  ``{"custom_id", "response": {"body": {"choices": ...}}}`` (results, with the request when present);
* plain ``{"messages": [...], "tools": [...]}``.

Messages are normalised to HF chat format: ``tool_calls[].function.arguments`` JSON strings are
decoded to objects (a string that does not decode is kept and reported as a parse error on that
turn), content part lists become text, legacy ``function_call`` / ``function`` role become tool
calls / tool messages, ``developer`` becomes ``system``; tool messages get the ``name`` of the call
they answer. Tools may also come as the legacy ``functions`` list.
"""

from __future__ import annotations

from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import (
    Conversation,
    RecordError,
    check_messages,
    fill_tool_message_names,
    normalize_tools,
    record_id,
    text_of,
)
from backend.trace import ParseError
from backend.trace.messages import decode_arguments
from backend.trace.model import TerminationReason

FINISH_TO_TERMINATION = {"length": TerminationReason.RESPONSE_LENGTH, "content_filter": TerminationReason.CONTENT_FILTER}


def normalize_messages(raw: Any, where: str = "messages", losses: list[str] | None = None) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]]]:
    """OpenAI chat messages → HF messages (a new list; the input is not modified). Content parts
    with no text (images, audio, files) are named in ``losses`` when given."""
    if not isinstance(raw, list):
        raise RecordError(f"{where} must be a list, got {type(raw).__name__}")
    out: list[dict[str, Any]] = []
    errors: dict[int, list[ParseError]] = {}
    for i, m in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise RecordError(f"{w} is {type(m).__name__}, not a message object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        elif role == "function":
            role = "tool"
        elif role in ("human",):
            role = "user"
        if role not in ("system", "user", "assistant", "tool"):
            raise RecordError(f"{w} has role {role!r}")
        msg: dict[str, Any] = {"role": role}
        content = text_of(m.get("content"), w, losses)
        msg["content"] = content if content is not None else ""
        for k in ("name", "tool_call_id", "reasoning_content"):
            if isinstance(m.get(k), str):
                msg[k] = m[k]
        if role == "assistant":
            if isinstance(m.get("reasoning"), str) and "reasoning_content" not in msg:
                msg["reasoning_content"] = m["reasoning"]
            if losses is not None:
                if isinstance(m.get("refusal"), str) and m["refusal"]:
                    losses.append(f"{w}: refusal not carried over: {m['refusal'][:80]!r}")
                if m.get("audio"):
                    losses.append(f"{w}: audio of the message not carried over")
            calls_in = m.get("tool_calls")
            if calls_in is None and isinstance(m.get("function_call"), dict):
                calls_in = [{"type": "function", "function": m["function_call"]}]
            if calls_in:
                if not isinstance(calls_in, list):
                    raise RecordError(f"{w}.tool_calls must be a list")
                calls = []
                for j, c in enumerate(calls_in):
                    if not isinstance(c, dict):
                        raise RecordError(f"{w}.tool_calls[{j}] is not an object")
                    fn = c.get("function") if isinstance(c.get("function"), dict) else c
                    name = fn.get("name")
                    if not isinstance(name, str) or not name:
                        raise RecordError(f"{w}.tool_calls[{j}] has no function name")
                    args, err = decode_arguments(fn.get("arguments"))
                    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
                    if isinstance(c.get("id"), str):
                        call["id"] = c["id"]
                    calls.append(call)
                    if err is not None:
                        raw_args = fn.get("arguments")
                        errors.setdefault(i, []).append(
                            ParseError(message=f"tool call {j} ({name!r}): {err}", raw=raw_args if isinstance(raw_args, str) else None)
                        )
                msg["tool_calls"] = calls
        out.append(msg)
    fill_tool_message_names(out)
    return out, errors


# content block types of the Anthropic Messages API: a message holding one is not a chat-completions message
_FOREIGN_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})


def _foreign_blocks(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") in _FOREIGN_BLOCKS for p in c):
            return True
    return False


def _tools_of(req: dict[str, Any]) -> list[dict[str, Any]]:
    if req.get("tools") is not None:
        return normalize_tools(req["tools"], "tools")
    if req.get("functions") is not None:
        return normalize_tools(req["functions"], "functions")
    return []


@register
class OpenAIChatImporter(Importer):
    name = "openai-chat"
    label = "OpenAI chat completions"
    description = "chat-completions request/response logs, or plain {messages, tools} rows"

    def sniff(self, record: Any) -> bool:
        if not isinstance(record, dict):
            return False
        req, resp = record.get("request"), record.get("response")
        if isinstance(resp, dict):
            body = resp["body"] if isinstance(resp.get("body"), dict) else resp
            if body.get("type") == "message" or body.get("object") == "response":
                return False  # an Anthropic Messages / OpenAI Responses response, not a chat completion
        if isinstance(req, dict):
            body = req["body"] if isinstance(req.get("body"), dict) else req
            if "messages" not in body and "input" in body:
                return False  # a Responses API request
            if _foreign_blocks(body.get("messages")):
                return False
        if isinstance(req, dict) or isinstance(resp, dict):
            return True
        if _foreign_blocks(record.get("messages")):
            return False
        if isinstance(record.get("body"), dict) and "messages" in record["body"]:
            return True
        if isinstance(record.get("choices"), list):
            return True
        return isinstance(record.get("messages"), list)

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        req = record.get("request")
        if req is None and isinstance(record.get("body"), dict):
            req = record["body"]
        if isinstance(req, dict) and isinstance(req.get("body"), dict):
            req = req["body"]
        resp = record.get("response")
        if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
            resp = resp["body"]
        if resp is None and isinstance(record.get("choices"), list):
            resp = record
        if req is None:
            req = record if "messages" in record else {}
        if not isinstance(req, dict):
            raise RecordError("request must be an object")
        if "messages" not in req:
            raise RecordError("no messages: expected request.messages (or messages)")
        losses: list[str] = []
        if req.get("system"):  # an Anthropic-style top-level system prompt: chat rows keep it in messages
            losses.append(f"{'request.' if req is not record else ''}system: the top-level system prompt is not carried over "
                          "(chat-completions messages only; --from anthropic reads it)")
        base, errors = normalize_messages(req["messages"], "request.messages" if req is not record else "messages", losses)
        tools = _tools_of(req) or (_tools_of(record) if record is not req else [])
        rid = record_id(record)
        meta: dict[str, Any] = {}
        for k in ("model", "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "tool_choice"):
            if k in req:
                meta.setdefault("request", {})[k] = req[k]
        if isinstance(resp, dict):
            for k in ("id", "model", "usage", "created"):
                if k in resp:
                    meta.setdefault("response", {})[k] = resp[k]
        choices = resp.get("choices") if isinstance(resp, dict) else None
        if resp is not None and not isinstance(choices, list):
            raise RecordError("response has no choices list")
        if not choices:
            check_messages(base)
            return [Conversation(messages=base, tools=tools, metadata=meta, id=rid, parse_errors=errors, losses=losses)]
        out = []
        for ci, ch in enumerate(choices):
            if not isinstance(ch, dict) or not isinstance(ch.get("message"), dict):
                raise RecordError(f"response.choices[{ci}] has no message")
            closs: list[str] = []
            extra, e2 = normalize_messages([ch["message"]], f"response.choices[{ci}].message", closs)
            msgs = base + extra
            fill_tool_message_names(msgs)
            errs = dict(errors)
            if e2:
                errs[len(base)] = e2[0]
            finish = ch.get("finish_reason")
            m = dict(meta)
            if finish is not None:
                m["finish_reason"] = finish
            if len(choices) > 1:
                m["choice"] = ci
            check_messages(msgs)
            out.append(
                Conversation(
                    messages=msgs, tools=tools, metadata=m, id=rid if len(choices) == 1 else f"{rid}-{ci}", parse_errors=errs,
                    finish_reason=finish if isinstance(finish, str) else None,
                    termination_reason=FINISH_TO_TERMINATION.get(finish) if isinstance(finish, str) else None,
                    losses=losses + closs,
                )
            )
        return out
