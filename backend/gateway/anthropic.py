"""The Anthropic Messages dialect (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): a
request becomes chat messages as vLLM's Anthropic server reads them, a turn becomes a ``message``
or, with ``stream``, its events (synthetic: the turn is generated and recorded first).

Messages: the top-level ``system`` (a string, or text blocks joined with no separator, as vLLM
joins them) is a leading system message. A user message's ``tool_result`` blocks become ``tool``
messages (``tool_call_id`` from ``tool_use_id``) in their order, and its text blocks one user
message after them (joined with newlines): tool results first, then the user's text, whatever
their order in the blocks, as vLLM orders them. An assistant message's text blocks are its
content, its ``thinking`` blocks its ``reasoning_content`` (the ``signature`` is not rendered),
its ``tool_use`` blocks its ``tool_calls`` (``input`` as the arguments object): the very shape the
gateway records for the model's own turn, so a harness that echoes the blocks it got extends its
branch. Tools ``{"name", "description", "input_schema"}`` become ``{"type": "function", "function":
{"name", "description", "parameters"}}``, key order kept.

Refused with a 400, never dropped: a ``system`` role inside ``messages``, image / document /
search-result blocks (never fetched), ``redacted_thinking`` (another model's encrypted reasoning:
nothing to render), a last assistant message (a prefill: the gateway starts a new turn, it does not
continue one), server tools (``web_search_*``, ``bash_*``, ...), ``mcp_servers``, ``container``,
``context_management``, a structured-output ``output_config.format``, ``temperature`` outside 0-1
(Anthropic's range). ``max_tokens`` is required, as Anthropic requires it. Recorded on the turn as
ignored: ``metadata``, ``service_tier``, ``thinking`` (the family's template and the operator's
``chat_template_kwargs`` decide whether the model reasons), ``output_config.effort``, a tool
result's ``is_error``, Claude Code's ``x-anthropic-billing-header`` system block (vLLM strips it
too: a per-request hash), ``cache_control`` everywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from backend.gateway.core import GatewayError, TurnRequest, TurnResult, read_sampling

DIALECT = "anthropic"
# sampling fields, their JSON types and ranges (Anthropic's: temperature 0-1)
SAMPLING = {"temperature": ((int, float), 0, 1), "top_p": ((int, float), 1e-9, 1), "top_k": ((int,), 1, 1 << 20)}
MAX_STOP_SEQUENCES = 64
# top-level fields this gateway does not apply: recorded on the turn, never silently
IGNORED = ("metadata", "service_tier", "thinking", "inference_geo", "speed", "diagnostics", "cache_control",
           "user_profile_id", "workspace_id")
# top-level fields that would change what the model sees or does server-side: refused
REFUSED = {"mcp_servers": "MCP servers run by the API", "container": "a code-execution container",
           "context_management": "server-side edits of the history"}
BILLING_HEADER = "x-anthropic-billing-header"
# the error type of each HTTP status, in Anthropic's words
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _refuse(message: str, param: str = "messages") -> GatewayError:
    return GatewayError(message, param=param)


def _block_kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _refuse(f"{where} must be a content block: an object with a \"type\"")
    return block["type"]


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _refuse(f"{where}: a text block's \"text\" must be a string")
    return text


def _unsupported(kind: str, where: str, role: str) -> GatewayError:
    if kind in ("image", "document", "search_result", "container_upload"):
        return _refuse(f"{where} is a {kind!r} block; this gateway renders text only (it never fetches or reads "
                       "attachments)")
    if kind == "redacted_thinking":
        return _refuse(f"{where} is a 'redacted_thinking' block: encrypted reasoning of another model, which this "
                       "gateway cannot render (send the history without it)")
    known = {"user": "text, tool_result", "assistant": "text, thinking, tool_use"}[role]
    return _refuse(f"{where}: a {role} message holds {known} blocks here, not {kind!r}")


def _tool_result(block: dict[str, Any], where: str, ignored: dict[str, Any]) -> dict[str, Any]:
    tid = block.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise _refuse(f"{where}: a tool_result needs its \"tool_use_id\" (the id of the tool_use it answers)")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = _block_kind(part, f"{where}.content[{k}]")
            if kind != "text":
                raise _unsupported(kind, f"{where}.content[{k}]", "user") if kind in (
                    "image", "document", "search_result") else _refuse(
                    f"{where}.content[{k}]: a tool_result holds text blocks, not {kind!r}")
            parts.append(_text_of(part, f"{where}.content[{k}]"))
        text = "\n".join(parts)
    else:
        raise _refuse(f"{where}: a tool_result's content is a string or a list of text blocks")
    if block.get("is_error") is not None:
        if not isinstance(block["is_error"], bool):
            raise _refuse(f"{where}: is_error must be true or false")
        if block["is_error"]:  # vLLM does not render it either: the tool's own text says what failed
            ignored.setdefault("tool_result_is_error", []).append(tid)
    return {"role": "tool", "content": text, "tool_call_id": tid}


def _user(content: list[Any], where: str, ignored: dict[str, Any]) -> list[dict[str, Any]]:
    tools, texts = [], []
    for j, block in enumerate(content):
        w = f"{where}.content[{j}]"
        kind = _block_kind(block, w)
        if kind == "text":
            text = _text_of(block, w)
            if text:
                texts.append(text)
        elif kind == "tool_result":
            tools.append(_tool_result(block, w, ignored))
        else:
            raise _unsupported(kind, w, "user")
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    texts, thinking, calls = [], [], []
    for j, block in enumerate(content):
        w = f"{where}.content[{j}]"
        kind = _block_kind(block, w)
        if kind == "text":
            text = _text_of(block, w)
            if text:
                texts.append(text)
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise _refuse(f"{w}: a thinking block's \"thinking\" must be a string")
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not block["id"] or not isinstance(block.get("name"), str):
                raise _refuse(f"{w}: a tool_use block is {{\"type\": \"tool_use\", \"id\", \"name\", \"input\"}}")
            args = block.get("input")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": {} if args is None else args}})
        else:
            raise _unsupported(kind, w, "assistant")
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def chat_messages(messages: Any, ignored: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic ``messages`` as chat messages in Hugging Face format."""
    if not isinstance(messages, list) or not messages:
        raise _refuse("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _refuse(f"{where} must be an object")
        role = m.get("role")
        if role == "system":
            raise _refuse(f"{where}: role 'system' is not a message role in the Messages API; send the system "
                          "prompt in the top-level \"system\" field")
        if role not in ("user", "assistant"):
            raise _refuse(f"{where}: role {role!r} is not one of user, assistant")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _refuse(f"{where}: content must be a string or a list of content blocks")
        if role == "user":
            mapped = _user(content, where, ignored)
            if not mapped:
                raise _refuse(f"{where}: a user message needs content (text or tool_result blocks)")
            out.extend(mapped)
        else:
            out.append(_assistant(content, where))
    if messages[-1].get("role") == "assistant":
        raise _refuse("the last message is an assistant turn (a prefill): this gateway starts a new turn after the "
                      "messages, it does not continue one; end with a user message")
    return out


def system_message(system: Any, ignored: dict[str, Any]) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise _refuse("system must be a string or a list of text blocks", "system")
    parts = []
    for j, block in enumerate(system):
        kind = _block_kind(block, f"system[{j}]")
        if kind != "text":
            raise _refuse(f"system[{j}] is a {kind!r} block; the system prompt holds text blocks", "system")
        text = _text_of(block, f"system[{j}]")
        if text.startswith(BILLING_HEADER):  # a per-request hash (Claude Code): vLLM strips it too
            ignored["system_billing_header"] = text
        elif text:
            parts.append(text)
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _refuse("tools must be a list", "tools")
    out = []
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise _refuse(f"tools[{j}] must be an object", "tools")
        kind = t.get("type")
        if kind not in (None, "custom"):
            raise _refuse(f"tools[{j}] is the server tool {kind!r}, which Anthropic's API runs itself; this gateway "
                          "serves client tools only ({\"name\", \"description\", \"input_schema\"})", "tools")
        if not isinstance(t.get("name"), str) or not t["name"] or not isinstance(t.get("input_schema"), dict):
            raise _refuse(f"tools[{j}] must be {{\"name\", \"description\", \"input_schema\": {{...}}}}", "tools")
        if t.get("description") is not None and not isinstance(t["description"], str):
            raise _refuse(f"tools[{j}]: description must be a string", "tools")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = t["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def tool_choice(v: Any) -> tuple[Any, bool | None]:
    """``(the gateway's tool_choice, parallel_tool_calls)``."""
    if v is None:
        return None, None
    if not isinstance(v, dict) or v.get("type") not in ("auto", "any", "tool", "none"):
        raise _refuse('tool_choice is {"type": "auto" | "any" | "tool" | "none"}', "tool_choice")
    disable = v.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _refuse("tool_choice.disable_parallel_tool_use must be true or false", "tool_choice")
    parallel = False if disable else None
    kind = v["type"]
    if kind == "tool":
        if not isinstance(v.get("name"), str) or not v["name"]:
            raise _refuse('tool_choice {"type": "tool"} needs the tool\'s "name"', "tool_choice")
        return v["name"], parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _common(body: Any, served_model: str) -> tuple[TurnRequest, dict[str, Any]]:
    if not isinstance(body, dict):
        raise GatewayError("the body must be a JSON object")
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise _refuse("model must be a string", "model")
    for k, what in REFUSED.items():
        if body.get(k) not in (None, [], {}):
            raise _refuse(f"{k} ({what}) is not supported by this gateway", k)
    output = body.get("output_config")
    ignored: dict[str, Any] = {k: body[k] for k in IGNORED if body.get(k) not in (None, {}, [])}
    if output is not None:
        if not isinstance(output, dict):
            raise _refuse("output_config must be an object", "output_config")
        if output.get("format") is not None:
            raise _refuse("output_config.format (structured output) is not supported by this gateway", "output_config")
        if output:
            ignored["output_config"] = output
    messages = system_message(body.get("system"), ignored) + chat_messages(body.get("messages"), ignored)
    choice, parallel = tool_choice(body.get("tool_choice"))
    req = TurnRequest(dialect=DIALECT, model=model, messages=messages, tools=chat_tools(body.get("tools")),
                      tool_choice=choice, parallel_tool_calls=parallel, ignored=ignored)
    return req, body


def parse_count_request(body: Any, served_model: str) -> TurnRequest:
    """``count_tokens``: the messages, system and tools of a turn request (no ``max_tokens``)."""
    req, _ = _common(body, served_model)
    return req


def parse_request(body: Any, served_model: str) -> tuple[TurnRequest, dict[str, Any]]:
    """``(the turn request, the dialect's own options: stream)``; :class:`GatewayError` for
    anything malformed."""
    req, body = _common(body, served_model)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _refuse("max_tokens is required (the Messages API has no default)", "max_tokens")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise _refuse("max_tokens must be a positive whole number", "max_tokens")
    req.max_tokens = max_tokens
    req.sampling.update(read_sampling(body, SAMPLING))
    stop = body.get("stop_sequences")
    if stop is not None:
        if (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
                or len(stop) > MAX_STOP_SEQUENCES):
            raise _refuse(f"stop_sequences must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings",
                          "stop_sequences")
        if stop:
            req.sampling["stop"] = stop
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _refuse("stream must be true or false", "stream")
    return req, {"stream": stream}


def signature(reasoning: str) -> str:
    """A thinking block's ``signature``: the SHA-256 of its text (nothing secret; a client keeps it
    and sends it back, and the gateway does not need it)."""
    return hashlib.sha256(reasoning.encode("utf-8", "surrogatepass")).hexdigest()


def _input(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # a raw string the parser kept: sent as it is, and compared as it is when echoed
    return arguments


def blocks(result: TurnResult) -> list[dict[str, Any]]:
    """The turn's content blocks: thinking (when the model reasoned), text (when it wrote any, or
    when nothing else came: Anthropic's shape of an empty turn), a tool_use per call."""
    out: list[dict[str, Any]] = []
    if result.reasoning:
        out.append({"type": "thinking", "thinking": result.reasoning, "signature": signature(result.reasoning)})
    if result.content or not (out or result.tool_calls):
        out.append({"type": "text", "text": result.content})
    out += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": _input(c["arguments"])}
            for c in result.tool_calls]
    return out


def stop_reason(result: TurnResult) -> tuple[str, str | None]:
    if result.finish_reason == "tool_calls":
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    stop = getattr(result, "stop_sequence", None)
    return ("stop_sequence", stop) if stop else ("end_turn", None)


def _usage(result: TurnResult) -> dict[str, int]:
    return {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}


def response(result: TurnResult, options: dict[str, Any]) -> dict[str, Any]:
    """The ``message`` object of a turn."""
    reason, sequence = stop_reason(result)
    return {"id": f"msg_{result.id}", "type": "message", "role": "assistant", "model": result.model,
            "content": blocks(result), "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(result)}


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def stream(result: TurnResult, options: dict[str, Any]) -> Iterator[str]:
    """The turn as Messages stream events: message_start, each block's start / delta(s) / stop,
    message_delta (stop_reason, usage), message_stop."""
    head = response(result, options)
    yield _event("message_start", {"message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                               "usage": {"input_tokens": result.prompt_tokens, "output_tokens": 0}}})
    yield _event("ping", {})
    for i, b in enumerate(head["content"]):
        if b["type"] == "thinking":
            yield _event("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": "",
                                                                              "signature": ""}})
            yield _event("content_block_delta", {"index": i, "delta": {"type": "thinking_delta", "thinking": b["thinking"]}})
            yield _event("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                      "signature": b["signature"]}})
        elif b["type"] == "text":
            yield _event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
            if b["text"]:
                yield _event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": b["text"]}})
        else:
            yield _event("content_block_start", {"index": i, "content_block": {"type": "tool_use", "id": b["id"],
                                                                              "name": b["name"], "input": {}}})
            yield _event("content_block_delta", {"index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(b["input"], ensure_ascii=False)}})
        yield _event("content_block_stop", {"index": i})
    yield _event("message_delta", {"delta": {"stop_reason": head["stop_reason"], "stop_sequence": head["stop_sequence"]},
                                   "usage": head["usage"]})
    yield _event("message_stop", {})


def error_body(e: GatewayError) -> dict[str, Any]:
    """Anthropic's error shape."""
    if e.status >= 500:
        kind = "overloaded_error" if e.kind == "overloaded_error" else "api_error"
    else:
        kind = ERROR_TYPES.get(e.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": str(e)}}
