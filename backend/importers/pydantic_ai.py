"""pydantic-ai message histories → HF messages.

Input: the JSON of ``ModelMessagesTypeAdapter.dump_json(result.all_messages())`` — a list of
``ModelRequest`` (``kind: "request"``) and ``ModelResponse`` (``kind: "response"``) objects, each
with ``parts`` told apart by ``part_kind``. A JSON file holding one such list is one conversation;
JSONL with one list per line (or a JSON list of such lists) is several. The history carries no
tool schemas: ``{"messages": [...], "tools": [...]}`` adds them (pydantic-ai ``ToolDefinition``\\ s
``{"name", "description", "parameters_json_schema"}``, as ``AgentInfo.function_tools`` holds them,
or OpenAI/HF schemas).

Parts, the way pydantic-ai's OpenAI chat model sends them:

* ``system-prompt`` → a system message; the last request's ``instructions`` → a system message
  after the leading system messages (where pydantic-ai inserts them);
* ``user-prompt`` → a user message (a string, or a list whose text items are joined; an image,
  audio, document or binary item is not carried over: a loss);
* ``tool-return`` → a tool message answering ``tool_call_id``: a string as it is, any other value
  as compact JSON (pydantic-ai's own text of it); an errored return (``outcome`` ``failed`` /
  ``retried``) as ``{"error": ...}``, as pydantic-ai sends it on a text-only tool channel;
* legacy ``retry-prompt`` (before pydantic-ai split it): with a ``tool_name`` a tool message
  answering the call, else a user message, with the text that version sent
  (``"<content>\\n\\nFix the errors and try again."``);
* ``retry-feedback`` → a user message with the feedback (pydantic-ai frames it in its own
  attribution line and fence when it sends it; the frame is the library's, not the file's);
* response ``text`` parts → the assistant's content (joined by a blank line), ``thinking`` →
  ``reasoning_content``, ``tool-call`` → a tool call (``args`` an object or a JSON string; a string
  that does not decode is kept and reported as a parse error on that turn).

Bookkeeping parts that carry no conversation text (``instruction-baseline``/``-delta`` — their
text is the request's ``instructions`` —, ``model-settings-delta``, ``tool-availability-delta``,
``capability-load-delta``, ``cache-point`` items) are counted in ``metadata["skipped_parts"]``;
any other part kind (provider-run ``builtin-tool-*`` parts, ``file``, ``speech``, ``compaction``,
unknown kinds) is a loss naming its place.

Metadata: ``model`` (the last response's ``model_name``), ``usage`` (input/output tokens summed
over the responses), ``duration_s`` (first request to last response timestamp), ``finish_reason``
of the last response. Provenance: ``library: pydantic-ai`` (the history says no version),
``run_id`` / ``conversation_id`` when present.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, record_id
from backend.trace import ParseError
from backend.trace.messages import decode_arguments

_SKIPPED_KINDS = {
    "instruction-baseline", "instruction-delta", "instruction-digest", "model-settings-delta",
    "tool-availability-delta", "capability-load-delta",
}
_ERROR_OUTCOMES = ("failed", "retried")
_FILE_KINDS = ("image-url", "binary", "audio-url", "video-url", "document-url", "uploaded-file")
_FIX = "\n\nFix the errors and try again."


def _is_message(x: Any) -> bool:
    return isinstance(x, dict) and x.get("kind") in ("request", "response") and isinstance(x.get("parts"), list)


def looks_like_history(obj: Any) -> bool:
    """A non-empty list of pydantic-ai ModelRequest/ModelResponse objects (every item has a
    ``kind`` of ``request``/``response``, at least one has its ``parts``: a damaged message is
    then refused by :meth:`convert` with its place, not read as another format)."""
    return (
        isinstance(obj, list) and bool(obj)
        and all(isinstance(x, dict) and x.get("kind") in ("request", "response") for x in obj)
        and any(_is_message(x) for x in obj)
    )


def _compact(v: Any) -> str:
    """A non-string value as pydantic-ai writes it for the model: compact JSON, UTF-8 kept."""
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool_text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else _compact(content)


def _without_ctx(errors: list[Any]) -> list[Any]:
    return [{k: v for k, v in e.items() if k != "ctx"} if isinstance(e, dict) else e for e in errors]


def _legacy_retry_text(content: Any, tool_name: Any) -> str:
    """What pydantic-ai sent for a ``RetryPromptPart`` (``model_response()`` before the split)."""
    if isinstance(content, str):
        desc = content if tool_name is not None else f"Validation feedback:\n{content}"
    elif isinstance(content, list):
        plural = "s" if len(content) != 1 else ""
        desc = f"{len(content)} validation error{plural}:\n```json\n{json.dumps(_without_ctx(content), ensure_ascii=False, indent=2)}\n```"
    else:
        desc = _tool_text(content)
    return desc + _FIX


def _time(v: Any) -> float | None:
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _user_content(content: Any, where: str, losses: list[str], skipped: dict[str, int]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RecordError(f"{where}.content is {type(content).__name__}, expected a string or a list")
    texts = []
    for k, item in enumerate(content):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict) and item.get("kind") == "text-content" and isinstance(item.get("content"), str):
            texts.append(item["content"])
        elif isinstance(item, dict) and item.get("kind") == "cache-point":
            skipped["cache-point"] = skipped.get("cache-point", 0) + 1
        else:
            kind = item.get("kind") if isinstance(item, dict) else type(item).__name__
            losses.append(f"{where}.content[{k}]: {kind or 'untyped'} item not carried over (it has no text)")
    return "".join(texts)


def history_to_conversation(history: list[Any], tools: Any = None) -> Conversation:
    """The conversion itself: a dumped ``all_messages()`` list → a conversation."""
    if not isinstance(history, list) or not history:
        raise RecordError("a pydantic-ai history must be a non-empty list of ModelRequest/ModelResponse objects")
    messages: list[dict[str, Any]] = []
    errors: dict[int, list[ParseError]] = {}
    losses: list[str] = []
    skipped: dict[str, int] = {}
    usage: dict[str, int] = {}
    times: list[float] = []
    model = finish = provider = None
    run_ids: list[str] = []
    conv_ids: list[str] = []
    instructions: list[tuple[int, str | None]] = []
    for i, msg in enumerate(history):
        where = f"[{i}]"
        if not _is_message(msg):
            raise RecordError(f"{where}: not a pydantic-ai message (expected kind 'request' or 'response' with a parts list)")
        t = _time(msg.get("timestamp"))
        if t is not None:
            times.append(t)
        for key, acc in (("run_id", run_ids), ("conversation_id", conv_ids)):
            v = msg.get(key)
            if isinstance(v, str) and v and v not in acc:
                acc.append(v)
        if msg["kind"] == "request":
            ins = msg.get("instructions")
            if ins is not None and not isinstance(ins, str):
                raise RecordError(f"{where}.instructions must be a string")
            instructions.append((i, ins))
            for j, part in enumerate(msg["parts"]):
                pw = f"{where}.parts[{j}]"
                if not isinstance(part, dict):
                    raise RecordError(f"{pw} is {type(part).__name__}, not a part object")
                pk = part.get("part_kind")
                if pk == "system-prompt":
                    messages.append({"role": "system", "content": _tool_text(part.get("content"))})
                elif pk == "user-prompt":
                    if "content" not in part:
                        raise RecordError(f"{pw}: user-prompt part has no content")
                    messages.append({"role": "user", "content": _user_content(part["content"], pw, losses, skipped)})
                elif pk == "tool-return":
                    tid = part.get("tool_call_id")
                    if not isinstance(tid, str) or not tid:
                        raise RecordError(f"{pw}: tool-return part has no tool_call_id")
                    content = part.get("content")
                    if isinstance(content, list) and any(isinstance(c, dict) and c.get("kind") in _FILE_KINDS for c in content):
                        for k, c in enumerate(content):
                            if isinstance(c, dict) and c.get("kind") in _FILE_KINDS:
                                losses.append(f"{pw}.content[{k}]: {c['kind']} item of a tool return not carried over (it has no text)")
                        content = [c for c in content if not (isinstance(c, dict) and c.get("kind") in _FILE_KINDS)]
                    text = _tool_text(content)
                    if part.get("outcome") in _ERROR_OUTCOMES:
                        err = content if (part.get("outcome") == "retried" and content is not None and not isinstance(content, str)) else text
                        text = _compact({"error": err})
                    tm: dict[str, Any] = {"role": "tool", "tool_call_id": tid, "content": text}
                    if isinstance(part.get("tool_name"), str):
                        tm["name"] = part["tool_name"]
                    messages.append(tm)
                elif pk == "retry-prompt":
                    text = _legacy_retry_text(part.get("content"), part.get("tool_name"))
                    if part.get("tool_name") is not None:
                        tid = part.get("tool_call_id")
                        if not isinstance(tid, str) or not tid:
                            raise RecordError(f"{pw}: retry-prompt part for tool {part.get('tool_name')!r} has no tool_call_id")
                        messages.append({"role": "tool", "tool_call_id": tid, "name": str(part["tool_name"]), "content": text})
                    else:
                        messages.append({"role": "user", "content": text})
                elif pk == "retry-feedback":
                    c = part.get("content")
                    messages.append({"role": "user", "content": c if isinstance(c, str) else _compact(c)})
                elif pk in _SKIPPED_KINDS:
                    skipped[pk] = skipped.get(pk, 0) + 1
                else:
                    losses.append(f"{pw}: {pk or 'untyped'} part not carried over (no chat message holds it)")
        else:
            texts: list[str] = []
            thinking: list[str] = []
            calls: list[dict[str, Any]] = []
            idx = len(messages)
            for j, part in enumerate(msg["parts"]):
                pw = f"{where}.parts[{j}]"
                if not isinstance(part, dict):
                    raise RecordError(f"{pw} is {type(part).__name__}, not a part object")
                pk = part.get("part_kind")
                if pk == "text":
                    texts.append(_tool_text(part.get("content")))
                elif pk == "thinking":
                    if isinstance(part.get("content"), str) and part["content"]:
                        thinking.append(part["content"])
                    elif part.get("signature") or (part.get("provider_details") or {}).get("redacted"):
                        losses.append(f"{pw}: thinking part with no text (signed or redacted) not carried over")
                elif pk == "tool-call":
                    name = part.get("tool_name")
                    if not isinstance(name, str) or not name:
                        raise RecordError(f"{pw}: tool-call part has no tool_name")
                    raw = part.get("args")
                    args, err = decode_arguments(raw)
                    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
                    if isinstance(part.get("tool_call_id"), str):
                        call["id"] = part["tool_call_id"]
                    calls.append(call)
                    if err is not None:
                        errors.setdefault(idx, []).append(
                            ParseError(message=f"tool call {len(calls) - 1} ({name!r}): {err}", raw=raw if isinstance(raw, str) else None)
                        )
                else:
                    losses.append(f"{pw}: {pk or 'untyped'} part not carried over (no chat message holds it)")
            am: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
            if thinking:
                am["reasoning_content"] = "\n\n".join(thinking)
            if calls:
                am["tool_calls"] = calls
            messages.append(am)
            u = msg.get("usage")
            if isinstance(u, dict):
                for k in ("input_tokens", "output_tokens"):
                    if isinstance(u.get(k), int):
                        usage[k] = usage.get(k, 0) + u[k]
            if isinstance(msg.get("model_name"), str):
                model = msg["model_name"]
            if isinstance(msg.get("provider_name"), str):
                provider = msg["provider_name"]
            finish = msg.get("finish_reason") if isinstance(msg.get("finish_reason"), str) else None
    # the last request's instructions, after the leading system messages (pydantic-ai's place)
    if instructions:
        last_i, last = instructions[-1]
        for i, ins in instructions[:-1]:
            if ins and ins != last:
                losses.append(f"[{i}].instructions: differ from the last request's; only the last request's are carried")
        if last:
            n = 0
            while n < len(messages) and messages[n]["role"] == "system":
                n += 1
            messages.insert(n, {"role": "system", "content": last})
            errors = {(k + 1 if k >= n else k): v for k, v in errors.items()}
    if not any(m["role"] != "system" for m in messages):
        raise RecordError("the history has no user, assistant or tool messages")
    fill_tool_message_names(messages)
    meta: dict[str, Any] = {"messages": len(history)}
    if model:
        meta["model"] = model
    if provider:
        meta["provider"] = provider
    if usage:
        meta["usage"] = usage
    if len(times) >= 2:
        meta["duration_s"] = round(max(times) - min(times), 6)
    if finish:
        meta["finish_reason"] = finish
    if skipped:
        meta["skipped_parts"] = skipped
    prov: dict[str, Any] = {"library": "pydantic-ai"}
    if run_ids:
        prov["run_id"] = run_ids[0] if len(run_ids) == 1 else run_ids
    if conv_ids:
        prov["conversation_id"] = conv_ids[0] if len(conv_ids) == 1 else conv_ids
    return Conversation(
        messages=messages, tools=_tools(tools), metadata=meta, parse_errors=errors, finish_reason=finish,
        losses=losses, provenance=prov,
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    """pydantic-ai ToolDefinitions (``parameters_json_schema``) or OpenAI/HF schemas."""
    if isinstance(tools, list):
        tools = [
            {"name": t.get("name"), "description": t.get("description") or "", "parameters": t["parameters_json_schema"]}
            if isinstance(t, dict) and "parameters_json_schema" in t else t
            for t in tools
        ]
    return normalize_tools(tools, "tools")


@register
class PydanticAIImporter(Importer):
    name = "pydantic-ai"
    label = "pydantic-ai"
    description = "pydantic-ai message history (ModelMessagesTypeAdapter JSON), optionally {messages, tools}"

    def sniff(self, record: Any) -> Any:
        if looks_like_history(record):
            return "a list of pydantic-ai ModelRequest/ModelResponse messages (kind + parts)"
        if isinstance(record, dict) and looks_like_history(record.get("messages")):
            return "messages are pydantic-ai ModelRequest/ModelResponse objects (kind + parts)"
        return False

    def whole_file(self, doc: Any) -> bool:
        return looks_like_history(doc)

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if isinstance(record, dict):
            if not isinstance(record.get("messages"), list):
                raise RecordError('expected a list of pydantic-ai messages, or {"messages": [...], "tools": [...]}')
            conv = history_to_conversation(record["messages"], record.get("tools"))
            conv.id = record_id(record) if any(k in record for k in ("id", "trace_id")) else record_id(record["messages"])
        elif isinstance(record, list):
            conv = history_to_conversation(record)
            conv.id = record_id(record)
        else:
            raise RecordError(f"expected a list of pydantic-ai messages, got {type(record).__name__}")
        return [conv]
