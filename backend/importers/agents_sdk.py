"""OpenAI Agents SDK runs → HF messages + tools.

Input: the SDK's input items, as ``RunResult.to_input_list()`` returns them (a bare list), or an
object ``{"items": [...], "tools": [...], "instructions": "..."}``. Items:

* ``{"role": "user"|"system"|"developer", "content": ...}`` (easy or ``type: "message"`` input
  messages; content a string or ``input_text`` parts) → user/system messages (developer → system);
* assistant ``message`` items (``output_text`` / ``refusal`` parts) → assistant messages;
* ``function_call`` (``name``, JSON-string ``arguments``, ``call_id``) → a tool call on the current
  assistant message (arguments decoded to an object; one that does not decode is kept as the
  string and reported as a parse error on that turn);
* ``function_call_output`` (``call_id``, ``output``) → a ``tool`` message with ``tool_call_id`` and
  the call's ``name``;
* ``reasoning`` (``summary`` / ``content`` texts) → ``reasoning_content`` of the next assistant message.

Grouping follows the SDK's own chat-completions converter
(``agents.models.chatcmpl_converter.Converter.items_to_messages``): calls attach to the current
assistant message (or open one), an output message after calls of the same turn merges into
it, any input message or tool output closes it. Other item types (hosted tool calls,
handoffs, ...) are skipped and counted in ``metadata["skipped_items"]``.

Tools: FunctionTool objects, FunctionTool-like dicts ``{"name", "description",
"params_json_schema"}``, or OpenAI/HF schemas.
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, record_id, text_of
from backend.trace import ParseError
from backend.trace.messages import decode_arguments

SDK_ITEM_TYPES = {
    "message", "function_call", "function_call_output", "reasoning", "file_search_call", "web_search_call",
    "computer_call", "computer_call_output", "item_reference", "image_generation_call", "code_interpreter_call",
    "local_shell_call", "local_shell_call_output", "mcp_call", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "custom_tool_call", "custom_tool_call_output", "shell_call", "shell_call_output",
    "apply_patch_call", "apply_patch_call_output", "tool_search_call", "tool_search_output", "compaction",
}
_SDK_SPECIFIC = SDK_ITEM_TYPES - {"message"}


def looks_like_items(obj: Any) -> bool:
    """A list that reads as SDK input items: has at least one item with an SDK-only type, or is
    made of messages where an assistant message carries ``output_text`` parts."""
    if not isinstance(obj, list) or not obj or not all(isinstance(x, dict) for x in obj):
        return False
    for x in obj:
        t = x.get("type")
        if t in _SDK_SPECIFIC:
            return True
        if t == "message" and x.get("role") == "assistant" and isinstance(x.get("content"), list):
            if any(isinstance(p, dict) and p.get("type") == "output_text" for p in x["content"]):
                return True
    return False


def _validate(item: dict[str, Any], where: str) -> None:
    """Check an item against the SDK's own types (openai.types.responses) when they are
    installed: a clear error for a malformed item instead of a KeyError later."""
    t = item.get("type")
    try:
        from pydantic import TypeAdapter, ValidationError
        if t == "function_call":
            from openai.types.responses import ResponseFunctionToolCallParam as P
        elif t == "function_call_output":
            from openai.types.responses.response_input_item_param import FunctionCallOutput as P
        elif t == "reasoning":
            from openai.types.responses import ResponseReasoningItemParam as P
        else:
            return
    except ImportError:  # pragma: no cover - openai is a dependency of openai-agents
        return
    adapter = _ADAPTERS.get(t)
    if adapter is None:
        adapter = _ADAPTERS[t] = TypeAdapter(P)
    try:
        adapter.validate_python(item)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "item"
        raise RecordError(f"{where}: {t} item is malformed ({loc}: {err.get('msg')})") from None


_ADAPTERS: dict[str, Any] = {}


def items_to_conversation(items: list[Any], tools: Any = None, instructions: str | None = None, *, validate: bool = True) -> Conversation:
    """The conversion itself (also usable on ``result.to_input_list()`` directly)."""
    if not isinstance(items, list):
        raise RecordError("agents-sdk input must be a list of items (result.to_input_list())")
    messages: list[dict[str, Any]] = []
    parse_errors: dict[int, list[ParseError]] = {}
    skipped: dict[str, int] = {}
    losses: list[str] = []
    current: dict[str, Any] | None = None  # open assistant message
    pending_reasoning: str | None = None

    if instructions:
        messages.append({"role": "system", "content": instructions})

    def flush() -> None:
        nonlocal current
        if current is not None:
            if not current.get("tool_calls"):
                current.pop("tool_calls", None)
            messages.append(current)
            current = None

    def open_assistant() -> dict[str, Any]:
        nonlocal current, pending_reasoning
        if current is None:
            current = {"role": "assistant", "content": "", "tool_calls": []}
        if pending_reasoning is not None:
            prev = current.get("reasoning_content")
            current["reasoning_content"] = pending_reasoning if not prev else prev + "\n" + pending_reasoning
            pending_reasoning = None
        return current

    for idx, raw in enumerate(items):
        where = f"item {idx}"
        item = raw.model_dump(exclude_unset=True) if hasattr(raw, "model_dump") else raw
        if not isinstance(item, dict):
            raise RecordError(f"{where} is {type(item).__name__}, not an object")
        t = item.get("type")
        role = item.get("role")
        if validate:
            _validate(item, where)
        if role in ("user", "system", "developer") and (t in (None, "message")):
            flush()
            pending_reasoning = None
            if "content" not in item:
                raise RecordError(f"{where}: {role} message has no content")
            messages.append({"role": "system" if role == "developer" else role, "content": text_of(item["content"], where, losses) or ""})
        elif role == "assistant" and t in (None, "message"):
            content = item.get("content")
            text = text_of(content, where, losses) if content is not None else ""
            if isinstance(content, list):
                segs = [p.get("text") if p.get("type") == "output_text" else p.get("refusal") for p in content if isinstance(p, dict)]
                text = "\n".join(s for s in segs if isinstance(s, str))
            if current is not None and current.get("tool_calls") and not current.get("content"):
                # a streamed turn may order its calls before its text: same assistant turn
                current["content"] = text
                if pending_reasoning is not None:
                    current["reasoning_content"] = pending_reasoning
                    pending_reasoning = None
            else:
                flush()
                msg = open_assistant()
                msg["content"] = text
        elif t == "function_call":
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise RecordError(f"{where}: function_call has no name")
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RecordError(f"{where}: function_call {name!r} has no call_id")
            args, err = decode_arguments(item.get("arguments"))
            msg = open_assistant()
            msg["tool_calls"].append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
            if err is not None:
                parse_errors.setdefault(len(messages), []).append(
                    ParseError(message=f"tool call {name!r} ({call_id}): {err}", raw=item.get("arguments") if isinstance(item.get("arguments"), str) else None)
                )
        elif t == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RecordError(f"{where}: function_call_output has no call_id")
            flush()
            out = item.get("output")
            content = out if isinstance(out, str) else text_of(out, where, losses)
            if content is None:
                content = ""
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif t == "reasoning":
            texts = [s.get("text") for s in item.get("summary") or [] if isinstance(s, dict) and isinstance(s.get("text"), str)]
            if not texts:
                texts = [c.get("text") for c in item.get("content") or [] if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if texts:
                pending_reasoning = "\n".join(texts) if pending_reasoning is None else pending_reasoning + "\n" + "\n".join(texts)
            elif item.get("encrypted_content"):
                losses.append(f"{where}: reasoning item not carried over: its reasoning is encrypted (encrypted_content), the text is not in the file")
        else:
            skipped[str(t or role)] = skipped.get(str(t or role), 0) + 1
            losses.append(f"{where}: {t or role} item not carried over (no chat message holds it)")
    flush()
    fill_tool_message_names(messages)
    meta: dict[str, Any] = {"items": len(items)}
    if skipped:
        meta["skipped_items"] = skipped
    if not any(m["role"] != "system" for m in messages):
        raise RecordError("the run has no messages to import")
    return Conversation(messages=messages, tools=normalize_tools(tools, "tools"), metadata=meta, parse_errors=parse_errors, losses=losses)


@register
class AgentsSDKImporter(Importer):
    name = "agents-sdk"
    label = "OpenAI Agents SDK"
    description = "OpenAI Agents SDK run items (result.to_input_list()), optionally with tools"

    def sniff(self, record: Any) -> bool:
        if isinstance(record, dict) and isinstance(record.get("items"), list):
            return True
        return looks_like_items(record)

    def whole_file(self, doc: Any) -> bool:
        # a JSON file holding one bare list of items is one run, not a list of records
        return looks_like_items(doc)

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if isinstance(record, dict):
            if not isinstance(record.get("items"), list):
                raise RecordError("expected {\"items\": [...], \"tools\": [...]} or a list of run items")
            items = record["items"]
            tools = record.get("tools")
            instructions = record.get("instructions")
            if instructions is not None and not isinstance(instructions, str):
                raise RecordError("instructions must be a string")
            rid = record_id(record) if any(k in record for k in ("id", "trace_id")) else record_id(items)
            extra = {k: v for k, v in record.items() if k not in ("items", "tools", "instructions", "id", "trace_id")}
        else:
            items, tools, instructions, rid, extra = record, None, None, record_id(record), {}
        conv = items_to_conversation(items, tools if tools is not None else ctx.options.get("tools"), instructions)
        conv.id = rid
        if extra:
            conv.metadata["record"] = json.loads(json.dumps(extra, default=str))
        return [conv]
