"""LangChain message lists (``langchain_core.messages.messages_to_dict``) → HF messages.

Input: a list of ``{"type": "system"|"human"|"ai"|"tool"|"function"|"chat", "data": {...}}``
(``*MessageChunk`` types too). A JSON file holding one such list is one conversation; JSONL with
one list per line (or a JSON list of such lists) is several. ``{"messages": [...], "tools": [...]}``
wraps one list with OpenAI/HF tool schemas (e.g. ``convert_to_openai_tool(t)`` of the agent's
tools); its messages must all be LangChain's ``{type, data}`` dicts (openai-chat rows have
``role`` keys instead), so the two never read the same record.

Messages:

* ``system`` → system, ``human`` → user, ``chat`` → its ``role`` (user/assistant/system/tool, or
  ``human``/``ai``/``developer``; any other role cannot be placed: a loss);
* ``ai`` → assistant: ``content`` a string or content blocks (``text``; ``thinking`` /
  ``reasoning`` blocks and ``additional_kwargs.reasoning_content`` → ``reasoning_content``;
  ``tool_use`` / ``tool_call`` blocks that repeat a ``tool_calls`` entry are that call; any other
  block, an image for one, is a loss); ``tool_calls`` → calls (``args`` objects); each
  ``invalid_tool_calls`` entry → a call whose raw ``args`` string is kept, with a parse error on
  that turn (LangChain's ``error`` in its message); with no ``tool_calls`` the raw OpenAI
  ``additional_kwargs.tool_calls`` / legacy ``function_call`` are read instead;
* ``tool`` → a tool message (``tool_call_id``, ``name``; content blocks → text, other values →
  JSON); ``artifact`` is never sent to the model and is not carried (not a loss); ``function``
  (legacy) → a tool message named by its ``name``.

Metadata: ``model`` (the last AI message's ``response_metadata.model_name`` / ``model``),
``usage`` (``usage_metadata`` input/output tokens summed), ``finish_reason`` of the last AI
message. Provenance: ``library: langchain-core`` (``messages_to_dict`` writes no version),
``message_ids`` when the messages have ids.
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, record_id
from backend.trace import ParseError
from backend.trace.messages import decode_arguments

TYPES = {"system", "human", "ai", "tool", "function", "chat", "remove"}
_CHUNKS = {
    "AIMessageChunk": "ai", "HumanMessageChunk": "human", "SystemMessageChunk": "system",
    "ToolMessageChunk": "tool", "FunctionMessageChunk": "function", "ChatMessageChunk": "chat",
}
_CHAT_ROLES = {
    "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant", "system": "system",
    "developer": "system", "tool": "tool", "function": "tool",
}
# additional_kwargs keys whose content is carried elsewhere, or that say nothing the model saw
_KNOWN_KWARGS = {"tool_calls", "function_call", "reasoning_content", "refusal", "parsed", "name"}


def _type_of(m: Any) -> str | None:
    if not isinstance(m, dict) or not isinstance(m.get("data"), dict):
        return None
    t = m.get("type")
    t = _CHUNKS.get(t, t) if isinstance(t, str) else None
    return t if t in TYPES else None


def looks_like_messages(obj: Any) -> bool:
    """A non-empty list of ``messages_to_dict`` entries: every one an object with a ``type``, at
    least one ``{"type": <a LangChain message type>, "data": {...}}`` (a damaged entry is then
    refused by :meth:`convert` with its place, not read as another format)."""
    return (
        isinstance(obj, list) and bool(obj)
        and all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in obj)
        and any(_type_of(m) is not None for m in obj)
    )


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, default=str)


def _blocks_text(content: Any, where: str, losses: list[str], skip_ids: set[str] | None = None,
                 reasoning: list[str] | None = None, extra_calls: list[dict[str, Any]] | None = None) -> str:
    """Content (a string or content blocks) as text. Text blocks are joined; reasoning blocks go to
    ``reasoning`` (AI messages); ``tool_use``/``tool_call`` blocks not in ``skip_ids`` to
    ``extra_calls``; anything else with no text is named in ``losses``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return _dumps(content)
    parts: list[str] = []
    for k, b in enumerate(content):
        if isinstance(b, str):
            parts.append(b)
            continue
        if not isinstance(b, dict):
            raise RecordError(f"{where}[{k}] is {type(b).__name__}, not a content block")
        t = b.get("type")
        if t in ("text", "text-plain", "output_text", "input_text") and isinstance(b.get("text"), str):
            parts.append(b["text"])
        elif reasoning is not None and t in ("thinking", "reasoning") and isinstance(b.get(t) or b.get("text"), str):
            reasoning.append(b.get(t) or b.get("text"))
        elif extra_calls is not None and t in ("tool_use", "tool_call"):
            cid = b.get("id")
            if not (isinstance(cid, str) and skip_ids and cid in skip_ids):
                extra_calls.append({"name": b.get("name"), "args": b.get("input", b.get("args")), "id": cid, "where": f"{where}[{k}]"})
        else:
            losses.append(f"{where}[{k}]: {t or 'untyped'} block not carried over (it has no text)")
    return "".join(parts)


def _call(name: Any, raw: Any, cid: Any, where: str, j: int, idx: int, errors: dict[int, list[ParseError]], note: str | None = None) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise RecordError(f"{where}: tool call has no name")
    args, err = decode_arguments(raw)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if isinstance(cid, str) and cid:
        call["id"] = cid
    if err is not None or note is not None:
        msg = f"tool call {j} ({name!r}): " + "; ".join(x for x in (note, err) if x)
        errors.setdefault(idx, []).append(ParseError(message=msg, raw=raw if isinstance(raw, str) else None))
    return call


def messages_to_conversation(raw: list[Any], tools: Any = None, where0: str = "") -> Conversation:
    """The conversion itself: ``messages_to_dict`` output → a conversation."""
    if not isinstance(raw, list) or not raw:
        raise RecordError("a LangChain message list must be a non-empty list of {type, data} objects")
    messages: list[dict[str, Any]] = []
    errors: dict[int, list[ParseError]] = {}
    losses: list[str] = []
    usage: dict[str, int] = {}
    ids: list[str] = []
    model = finish = None
    for i, m in enumerate(raw):
        where = f"{where0}[{i}]"
        t = _type_of(m)
        if t is None:
            what = m.get("type") if isinstance(m, dict) else type(m).__name__
            raise RecordError(f"{where}: not a LangChain message (expected {{\"type\", \"data\"}} with a message type, got {what!r})")
        d = m["data"]
        dw = f"{where}.data"
        if isinstance(d.get("id"), str) and d["id"]:
            ids.append(d["id"])
        if t == "remove":
            losses.append(f"{where}: RemoveMessage not carried over (it removes message {d.get('id')!r} from a graph's state)")
            continue
        if "content" not in d:
            raise RecordError(f"{dw} has no content")
        kwargs = d.get("additional_kwargs") if isinstance(d.get("additional_kwargs"), dict) else {}
        for k, v in kwargs.items():
            if k not in _KNOWN_KWARGS and v not in (None, "", [], {}):
                losses.append(f"{dw}.additional_kwargs.{k} not carried over")
        role = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool", "function": "tool"}.get(t)
        if t == "chat":
            role = _CHAT_ROLES.get(str(d.get("role")))
            if role is None:
                losses.append(f"{where}: chat message with role {d.get('role')!r} not carried over (no chat role holds it)")
                continue
        if role == "assistant":
            idx = len(messages)
            reasoning: list[str] = []
            calls_in = d.get("tool_calls") or []
            if not isinstance(calls_in, list):
                raise RecordError(f"{dw}.tool_calls must be a list")
            known = {c.get("id") for c in calls_in if isinstance(c, dict) and isinstance(c.get("id"), str)}
            invalid = d.get("invalid_tool_calls") or []
            if not isinstance(invalid, list):
                raise RecordError(f"{dw}.invalid_tool_calls must be a list")
            known |= {c.get("id") for c in invalid if isinstance(c, dict) and isinstance(c.get("id"), str)}
            extra: list[dict[str, Any]] = []
            text = _blocks_text(d["content"], f"{dw}.content", losses, known, reasoning, extra)
            calls: list[dict[str, Any]] = []
            for j, c in enumerate(calls_in):
                if not isinstance(c, dict):
                    raise RecordError(f"{dw}.tool_calls[{j}] is not an object")
                calls.append(_call(c.get("name"), c.get("args"), c.get("id"), f"{dw}.tool_calls[{j}]", len(calls), idx, errors))
            for j, c in enumerate(invalid):
                if not isinstance(c, dict):
                    raise RecordError(f"{dw}.invalid_tool_calls[{j}] is not an object")
                err = c.get("error")
                note = f"LangChain could not parse it ({err})" if isinstance(err, str) and err else "LangChain could not parse it"
                name = c.get("name") if isinstance(c.get("name"), str) and c.get("name") else "unknown"
                calls.append(_call(name, c.get("args"), c.get("id"), f"{dw}.invalid_tool_calls[{j}]", len(calls), idx, errors, note))
            for c in extra:
                calls.append(_call(c["name"], c["args"], c["id"], c["where"], len(calls), idx, errors))
            if not calls:  # older messages: only the provider's raw calls
                raw_calls = kwargs.get("tool_calls")
                if isinstance(raw_calls, list):
                    for j, c in enumerate(raw_calls):
                        fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else {}
                        calls.append(_call(fn.get("name"), fn.get("arguments"), c.get("id") if isinstance(c, dict) else None,
                                           f"{dw}.additional_kwargs.tool_calls[{j}]", len(calls), idx, errors))
                elif isinstance(kwargs.get("function_call"), dict):
                    fc = kwargs["function_call"]
                    calls.append(_call(fc.get("name"), fc.get("arguments"), None, f"{dw}.additional_kwargs.function_call", 0, idx, errors))
            if isinstance(kwargs.get("reasoning_content"), str) and kwargs["reasoning_content"]:
                reasoning.insert(0, kwargs["reasoning_content"])
            if not text and isinstance(kwargs.get("refusal"), str):
                text = kwargs["refusal"]
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                msg["reasoning_content"] = "\n".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
            u = d.get("usage_metadata")
            if isinstance(u, dict):
                for k in ("input_tokens", "output_tokens"):
                    if isinstance(u.get(k), int):
                        usage[k] = usage.get(k, 0) + u[k]
            rm = d.get("response_metadata") if isinstance(d.get("response_metadata"), dict) else {}
            mn = rm.get("model_name") or rm.get("model")
            if isinstance(mn, str) and mn:
                model = mn
            fr = rm.get("finish_reason") or rm.get("stop_reason") or rm.get("done_reason")
            finish = fr if isinstance(fr, str) else None
        else:
            msg = {"role": role, "content": _blocks_text(d["content"], f"{dw}.content", losses)}
            if role == "tool":
                tid = d.get("tool_call_id")
                if t == "tool" and (not isinstance(tid, str) or not tid):
                    raise RecordError(f"{dw}: tool message has no tool_call_id")
                if isinstance(tid, str) and tid:
                    msg["tool_call_id"] = tid
                if isinstance(d.get("name"), str) and d["name"]:
                    msg["name"] = d["name"]
            messages.append(msg)
    if not any(m["role"] != "system" for m in messages):
        raise RecordError("the list has no human, AI or tool messages")
    fill_tool_message_names(messages)
    meta: dict[str, Any] = {"messages": len(raw)}
    if model:
        meta["model"] = model
    if usage:
        meta["usage"] = usage
    if finish:
        meta["finish_reason"] = finish
    prov: dict[str, Any] = {"library": "langchain-core"}
    if ids:
        prov["message_ids"] = ids
    return Conversation(
        messages=messages, tools=normalize_tools(tools, "tools"), metadata=meta, parse_errors=errors,
        finish_reason=finish, losses=losses, provenance=prov,
    )


@register
class LangChainImporter(Importer):
    name = "langchain"
    label = "LangChain"
    description = "LangChain messages_to_dict lists ({type, data} messages), optionally {messages, tools}"

    def sniff(self, record: Any) -> Any:
        if looks_like_messages(record):
            return "a list of LangChain {type, data} messages (messages_to_dict)"
        if isinstance(record, dict) and looks_like_messages(record.get("messages")):
            return "messages are LangChain {type, data} dicts (messages_to_dict)"
        return False

    def whole_file(self, doc: Any) -> bool:
        return looks_like_messages(doc)

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if isinstance(record, dict):
            if not isinstance(record.get("messages"), list):
                raise RecordError('expected a messages_to_dict list, or {"messages": [...], "tools": [...]}')
            conv = messages_to_conversation(record["messages"], record.get("tools"), "messages")
            conv.id = record_id(record) if any(k in record for k in ("id", "trace_id")) else record_id(record["messages"])
        elif isinstance(record, list):
            conv = messages_to_conversation(record)
            conv.id = record_id(record)
        else:
            raise RecordError(f"expected a list of LangChain messages, got {type(record).__name__}")
        return [conv]
