"""Anthropic Messages API data → conversations.

Accepted records:

* a Messages request, or a conversation saved in that shape:
  ``{"system": str | [text blocks], "tools": [{"name", "description", "input_schema"}],
  "messages": [{"role": "user" | "assistant", "content": str | [blocks]}], "model", ...}``;
* a request/response log ``{"request": {...Messages request...}, "response": {"id", "type":
  "message", "role": "assistant", "content": [blocks], "stop_reason", "usage", "model"}}``: the
  response's content is the last assistant turn (when the request ends with an assistant turn,
  a prefill, the response continues that turn: the two are one assistant message);
* a bare response object (``type: "message"``) alone: one assistant turn;
* a JSON list of messages alone (with Anthropic content blocks): one conversation.

Blocks:

* ``text``: message text (an assistant turn's text blocks are one generated stream, joined as
  they are; a user turn's, the system prompt's and a tool result's blocks are separate pieces,
  joined with a newline); citations on a text block are not carried (a loss);
* ``tool_use`` (``id``, ``name``, ``input`` object) → a tool call with that id;
* ``tool_result`` (``tool_use_id``, ``content`` str or blocks, ``is_error``) → a ``tool`` message
  (``is_error: true`` kept on it). A user turn holding tool results and text becomes, in the
  order of its blocks, the tool messages and a user message with the text;
* ``thinking`` → the assistant message's ``reasoning_content`` (the signature is a check of the
  text, not content: not carried, not a loss); ``redacted_thinking`` is encrypted reasoning
  whose text is not in the file: a loss naming it;
* ``image``, ``document``, server-side tool blocks (``server_tool_use``, ``web_search_tool_result``,
  ...) and unknown blocks: losses with their place.

``stop_reason`` is the last turn's finish reason; ``max_tokens`` (and
``model_context_window_exceeded``) end the trace as ``response_length``, ``refusal`` as
``content_filter``. Consecutive messages of one role stay as they are.
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, check_messages, fill_tool_message_names, normalize_tools, record_id
from backend.trace import ParseError
from backend.trace.messages import decode_arguments
from backend.trace.model import TerminationReason

LABEL = "Anthropic Messages"

STOP_TO_TERMINATION = {
    "max_tokens": TerminationReason.RESPONSE_LENGTH,
    "model_context_window_exceeded": TerminationReason.RESPONSE_LENGTH,
    "refusal": TerminationReason.CONTENT_FILTER,
}

# block types only the Messages API has (OpenAI chat content parts are text / image_url /
# input_audio / file / refusal)
ANTHROPIC_BLOCKS = frozenset({
    "tool_use", "tool_result", "thinking", "redacted_thinking", "document", "search_result", "server_tool_use",
    "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result", "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result",
    "container_upload",
})
_REQUEST_PARAMS = ("model", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "tool_choice", "thinking",
                   "metadata", "service_tier")


def _block_type(block: Any) -> str | None:
    return block.get("type") if isinstance(block, dict) else None


def _anthropic_block(block: Any) -> bool:
    t = _block_type(block)
    return t in ANTHROPIC_BLOCKS or (t == "image" and "source" in block)


def _request_reason(req: Any) -> str | None:
    """Why a ``{messages, ...}`` object reads as a Messages request, or None. Rows of other
    formats are not claimed: OpenAI chat messages (roles system/tool, tool_calls,
    tool_call_id), ShareGPT (from/value, Hermes ``<tool_call>`` text), tools as a JSON string."""
    if not isinstance(req, dict):
        return None
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return None
    tools = req.get("tools")
    if tools is not None and not isinstance(tools, list):
        return None
    block_reason = None
    text_list = False
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return None
        if any(k in m for k in ("tool_calls", "tool_call_id", "function_call", "from", "value")):
            return None
        c = m.get("content")
        if isinstance(c, str):
            if "<tool_call>" in c or "<tool_response>" in c:
                return None
        elif isinstance(c, list):
            for b in c:
                if block_reason is None and _anthropic_block(b):
                    block_reason = f"content blocks of type {_block_type(b)}"
            if m["role"] == "assistant" and c and all(_block_type(b) == "text" for b in c):
                text_list = True  # what the SDK's response.content gives; chat completions answer with a string
        elif c is not None:
            return None
    if block_reason:
        return block_reason
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return "tools with input_schema"
    system = req.get("system")
    if isinstance(system, str) or (isinstance(system, list) and all(_block_type(b) == "text" for b in system)):
        return "a top-level system beside messages"
    if text_list:
        return "assistant content as a list of text blocks"
    if isinstance(req.get("model"), str) and req["model"].startswith("claude"):
        return "a claude model"
    return None


def _is_response(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("type") == "message" and obj.get("role") == "assistant" and isinstance(obj.get("content"), list)


def _joined_text(blocks: list[Any], where: str, losses: list[str], what: str) -> str:
    """Text blocks (system prompt, tool result content) joined with newlines; others are losses."""
    parts = []
    for j, b in enumerate(blocks):
        w = f"{where}[{j}]"
        t = _block_type(b)
        if isinstance(b, str):
            parts.append(b)
        elif t == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
            _citations(b, w, losses)
        elif isinstance(b, dict):
            losses.append(f"{w}: {_describe(b)} not carried over ({what} keeps text only)")
        else:
            raise RecordError(f"{w} is {type(b).__name__}, not a content block")
    return "\n".join(parts)


def _describe(block: dict[str, Any]) -> str:
    t = block.get("type") or "untyped"
    name = block.get("name")
    return f"{t} block ({name})" if isinstance(name, str) else f"{t} block"


def _citations(block: dict[str, Any], where: str, losses: list[str]) -> None:
    cites = block.get("citations")
    if isinstance(cites, list) and cites:
        losses.append(f"{where}: {len(cites)} citation(s) of the text block not carried over")


def _tool_result(block: dict[str, Any], where: str, losses: list[str]) -> dict[str, Any]:
    tid = block.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise RecordError(f"{where}: tool_result has no tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = _joined_text(content, f"{where}.content", losses, "a tool message")
    else:
        text = json.dumps(content, ensure_ascii=False)
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": tid, "content": text}
    if block.get("is_error") is True:
        msg["is_error"] = True
    return msg


def _user_turn(content: Any, where: str, losses: list[str]) -> list[dict[str, Any]]:
    """One user message's blocks → tool messages and user messages, in the order of the blocks."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise RecordError(f"{where}.content must be a string or a list of content blocks, got {type(content).__name__}")
    out: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append({"role": "user", "content": "\n".join(text)})
            text.clear()

    for j, b in enumerate(content):
        w = f"{where}.content[{j}]"
        t = _block_type(b)
        if isinstance(b, str):
            text.append(b)
        elif not isinstance(b, dict):
            raise RecordError(f"{w} is {type(b).__name__}, not a content block")
        elif t == "text":
            if not isinstance(b.get("text"), str):
                raise RecordError(f"{w}: text block has no text")
            text.append(b["text"])
            _citations(b, w, losses)
        elif t == "tool_result":
            flush()
            out.append(_tool_result(b, w, losses))
        elif t in ("image", "document"):
            losses.append(f"{w}: {t} block not carried over: it has no text")
        else:
            losses.append(f"{w}: {_describe(b)} not carried over (a user turn keeps text and tool results)")
    flush()
    if not out:  # nothing but images/documents: keep the turn so the turns around it stay apart
        out.append({"role": "user", "content": ""})
    return out


def _assistant_turn(content: Any, where: str, losses: list[str], errors: list[ParseError]) -> dict[str, Any]:
    """One assistant message's blocks → one assistant message (text, reasoning, tool calls)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise RecordError(f"{where + '.' if where else ''}content must be a string or a list of content blocks, got {type(content).__name__}")
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        w = f"{where}.content[{j}]" if where else f"content[{j}]"  # "": a bare response object
        t = _block_type(b)
        if not isinstance(b, dict):
            raise RecordError(f"{w} is {type(b).__name__}, not a content block")
        if t == "text":
            if not isinstance(b.get("text"), str):
                raise RecordError(f"{w}: text block has no text")
            text.append(b["text"])
            _citations(b, w, losses)
        elif t == "thinking":
            if isinstance(b.get("thinking"), str):
                reasoning.append(b["thinking"])
        elif t == "redacted_thinking":
            losses.append(f"{w}: redacted_thinking block not carried over: its reasoning is encrypted, the text is not in the file")
        elif t == "tool_use":
            name = b.get("name")
            if not isinstance(name, str) or not name:
                raise RecordError(f"{w}: tool_use block has no name")
            raw = b.get("input")
            args, err = decode_arguments(raw)
            call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
            if isinstance(b.get("id"), str):
                call = {"id": b["id"], **call}
            calls.append(call)
            if err is not None:
                errors.append(ParseError(message=f"{w} ({name!r}): {err}", raw=raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)))
        elif t == "server_tool_use":
            losses.append(f"{w}: {_describe(b)} not carried over: a tool run by the API, not by the caller")
        else:
            losses.append(f"{w}: {_describe(b)} not carried over (an assistant turn keeps text, thinking and tool_use)")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system(system: Any, where: str, losses: list[str]) -> str | None:
    if system is None or system == "" or system == []:
        return None
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return _joined_text(system, where, losses, "the system prompt")
    raise RecordError(f"{where} must be a string or a list of text blocks, got {type(system).__name__}")


@register
class AnthropicImporter(Importer):
    name = "anthropic"
    label = LABEL
    description = "Anthropic Messages API: {system, tools, messages} files, request/response logs, response objects"

    def sniff(self, record: Any) -> Any:
        if isinstance(record, list):
            return self._bare_messages(record)
        if not isinstance(record, dict):
            return False
        if _is_response(record) and "stop_reason" in record:
            return "a Messages API response (type message, stop_reason)"
        req, resp = record.get("request"), record.get("response")
        if isinstance(req, dict) or isinstance(resp, dict):
            if _is_response(resp):
                return "a response of type message"
            if isinstance(resp, dict) and resp.get("type") == "error" and _request_reason(req):
                return "an error response of the Messages API"
            if resp is not None:
                return False  # another API's response (chat completions' choices, ...)
            why = _request_reason(req)
            return f"request: {why}" if why else False
        if "choices" in record:
            return False
        return _request_reason(record) or False

    @staticmethod
    def _bare_messages(doc: Any) -> Any:
        """A JSON list of Messages API messages alone (``messages`` saved without the request),
        recognised by Anthropic-only content blocks."""
        why = _request_reason({"messages": doc}) if isinstance(doc, list) else None
        return f"a list of messages with {why}" if why and why.startswith("content blocks") else False

    def whole_file(self, doc: Any) -> bool:
        return bool(self._bare_messages(doc))

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if isinstance(record, list):
            record = {"messages": record}
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        if _is_response(record):
            req, resp, pre = None, record, ""
        elif "request" in record or "response" in record:
            req, resp, pre = record.get("request"), record.get("response"), "request."
            if req is not None and not isinstance(req, dict):
                raise RecordError(f"request is {type(req).__name__}, not an object")
            if resp is not None and not isinstance(resp, dict):
                raise RecordError(f"response is {type(resp).__name__}, not an object")
        else:
            req, resp, pre = record, None, ""
        losses: list[str] = []
        messages: list[dict[str, Any]] = []
        parse_errors: dict[int, list[ParseError]] = {}
        meta: dict[str, Any] = {}
        tools: list[dict[str, Any]] = []
        if req is not None:
            system = _system(req.get("system"), f"{pre}system", losses)
            if system is not None:
                messages.append({"role": "system", "content": system})
            raw_msgs = req.get("messages")
            if not isinstance(raw_msgs, list):
                raise RecordError(f"{pre}messages must be a list of messages, got {type(raw_msgs).__name__ if raw_msgs is not None else 'nothing'}")
            for i, m in enumerate(raw_msgs):
                w = f"{pre}messages[{i}]"
                if not isinstance(m, dict):
                    raise RecordError(f"{w} is {type(m).__name__}, not a message object")
                role = m.get("role")
                if "content" not in m:
                    raise RecordError(f"{w} has no content")
                if role == "user":
                    messages.extend(_user_turn(m["content"], w, losses))
                elif role == "assistant":
                    errs: list[ParseError] = []
                    messages.append(_assistant_turn(m["content"], w, losses, errs))
                    if errs:
                        parse_errors[len(messages) - 1] = errs
                elif role == "system" and isinstance(m["content"], (str, list)):  # not the API's, but seen in saved files
                    messages.append({"role": "system", "content": _system(m["content"], f"{w}.content", losses) or ""})
                else:
                    raise RecordError(f"{w} has role {role!r}; expected user or assistant")
            tools = normalize_tools(req.get("tools"), f"{pre}tools")
            types = {t["name"]: t["type"] for t in req.get("tools") or []
                     if isinstance(t, dict) and isinstance(t.get("name"), str) and t.get("type") not in (None, "custom")}
            if types:
                meta["tool_types"] = types  # Anthropic-defined tools (bash, text_editor, web_search ...): no schema in the file
            params = {k: req[k] for k in _REQUEST_PARAMS if k in req}
            if params:
                meta["request"] = params
            if isinstance(req.get("model"), str):
                meta["model"] = req["model"]
        finish = None
        termination = None
        prov: dict[str, Any] = {"format": LABEL}
        if resp is not None:
            if resp.get("type") == "error" or (resp.get("error") and not _is_response(resp)):
                meta["error"] = resp.get("error", resp)
                termination = TerminationReason.GENERATION_ERROR
            elif resp.get("type") != "message" or resp.get("role", "assistant") != "assistant":
                raise RecordError("response is not a Messages API response (type \"message\", role \"assistant\")")
            else:
                w = "response" if resp is not record else ""
                errs = []
                turn = _assistant_turn(resp.get("content"), w, losses, errs)
                prefill = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
                if prefill is not None and not prefill.get("tool_calls") and not errs:
                    # the response continues the prefilled assistant turn: one message
                    meta["prefill"] = prefill["content"]
                    turn["content"] = prefill["content"] + turn["content"]
                    if prefill.get("reasoning_content") and not turn.get("reasoning_content"):
                        turn["reasoning_content"] = prefill["reasoning_content"]
                    messages[-1] = turn
                else:
                    messages.append(turn)
                if errs:
                    parse_errors[len(messages) - 1] = errs
                stop = resp.get("stop_reason")
                if isinstance(stop, str):
                    finish = stop
                    meta["finish_reason"] = stop
                    termination = STOP_TO_TERMINATION.get(stop)
                if isinstance(resp.get("model"), str):
                    meta["model"] = resp["model"]
                if isinstance(resp.get("usage"), dict):
                    meta["usage"] = {k: v for k, v in resp["usage"].items() if v is not None}
                if isinstance(resp.get("stop_sequence"), str):
                    meta["stop_sequence"] = resp["stop_sequence"]
                if isinstance(resp.get("id"), str):
                    prov["response_id"] = resp["id"]
        if not messages:
            raise RecordError(f"{pre}messages is empty")
        fill_tool_message_names(messages)
        check_messages(messages)
        rid = prov.get("response_id") or record_id(record)
        return [Conversation(
            messages=messages, tools=tools, metadata=meta, id=rid, parse_errors=parse_errors, finish_reason=finish,
            termination_reason=termination, losses=losses, provenance=prov,
        )]
