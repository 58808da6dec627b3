"""The Responses dialect (``POST /v1/responses``): a request becomes chat messages as vLLM's
Responses server reads them, a turn becomes a ``response`` object or, with ``stream``, the
Responses event stream (synthetic: the turn is generated and recorded first).

Input: ``instructions`` is a leading system message; ``input`` given as a string is one user
message; as a list of items:

* ``message`` items (``role`` user, system, developer or assistant; no ``type`` with a ``role`` is
  a message too): content a string or a list of ``input_text`` / ``output_text`` parts, joined
  with newlines; ``system`` and ``developer`` are system messages. Image, file and audio parts are
  refused (never fetched);
* a ``reasoning`` item opens the model's next turn: its ``content`` (``reasoning_text``) or else
  its ``summary`` (``summary_text``) is that turn's ``reasoning_content``; one that carries only
  ``encrypted_content`` is reasoning the harness dropped (the gateway's reasoning policy decides);
* an assistant ``message`` item right after it gives that turn its content; ``function_call``
  items (``call_id``, ``name``, ``arguments`` as a JSON string) join the assistant turn before
  them as its ``tool_calls`` (ids the call_ids), so a turn the harness echoes from
  ``response.output`` is one assistant message, the shape the gateway recorded;
* ``function_call_output`` items are tool messages (``tool_call_id`` the call_id), in order.

The ``id`` and ``status`` an echoed item carries are not part of what the model was shown.
Anything else (hosted-tool calls, ``item_reference``, custom tools, ...) is refused by name.

Function tools ``{"type": "function", "name", "description", "parameters", "strict"}`` render as
``{"type": "function", "function": {"name", "description", "parameters"}}``; any other tool type is
refused, never dropped. ``previous_response_id`` and ``conversation`` are refused: this gateway
keeps no responses, the harness sends the whole input (``store: false`` style).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from backend.gateway.chat import SAMPLING, error_body  # noqa: F401  (error_body: OpenAI's shape, shared)
from backend.gateway.core import GatewayError, TurnRequest, TurnResult, read_sampling, strict_loads

DIALECT = "responses"
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
# fields a client may send that this gateway does not apply: recorded on the turn, never silently
IGNORED = ("reasoning", "include", "store", "truncation", "metadata", "user", "service_tier", "prompt_cache_key",
           "prompt_cache_retention", "safety_identifier", "top_logprobs", "max_tool_calls", "stream_options",
           "context_management")
# fields whose meaning this gateway cannot honour: refused with a reason, never ignored
REFUSED = {
    "previous_response_id": "this gateway keeps no responses: send the whole conversation as input "
                            "(store: false style), without previous_response_id",
    "conversation": "this gateway keeps no conversations: send the whole conversation as input, without conversation",
    "prompt": "stored prompt templates are not available on this gateway: send instructions and input",
    "background": "background responses are not supported by this gateway: leave background unset or false",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(content: Any, where: str, *, allowed: tuple[str, ...] = TEXT_PARTS) -> str:
    """A message's or a tool output's content as text: a string, or its text parts joined with
    newlines (as vLLM joins text parts for a text template)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise GatewayError(f"{where}: content must be a string or a list of text parts", param="input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in allowed and isinstance(part.get("text"), str):
            texts.append(part["text"])
            continue
        if kind in ("input_image", "input_file", "input_audio", "image_url", "file"):
            raise GatewayError(f"{where}: content part {j} is {kind!r}; this gateway renders text only (images and files "
                               "are never fetched)", param="input")
        raise GatewayError(f"{where}: content part {j} is {kind or type(part).__name__!r}; this gateway renders text parts "
                           f"only ({', '.join(allowed)})", param="input")
    return "\n".join(texts)


def _call_id(item: dict[str, Any], where: str) -> str:
    cid = item.get("call_id")
    if not isinstance(cid, str) or not cid:
        raise GatewayError(f"{where}: a {item.get('type')} item needs its call_id (a string)", param="input")
    return cid


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, args = item.get("name"), item.get("arguments")
    if not isinstance(name, str) or not name:
        raise GatewayError(f"{where}: a function_call item needs its name (a string)", param="input")
    if not isinstance(args, str):
        raise GatewayError(f"{where}: a function_call item's arguments are a JSON string", param="input")
    value: Any = args
    try:
        decoded = strict_loads(args) if args.strip() else {}
    except (ValueError, RecursionError):
        decoded = None
    if isinstance(decoded, dict):
        value = decoded  # as the chat dialect reads a call's arguments: an object when they decode to one
    return {"id": _call_id(item, where), "type": "function", "function": {"name": name, "arguments": value}}


def _reasoning(item: dict[str, Any], where: str) -> str | None:
    """A reasoning item's text: its content, else its summary; None when it holds neither (only
    encrypted_content: reasoning this gateway cannot read, as if the harness had dropped it)."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise GatewayError(f"{where}: a reasoning item's {key} must be a list", param="input")
        if parts:
            return _text(parts, f"{where}.{key}", allowed=(kind,))
    return None


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The chat messages of a request's ``input`` list."""
    messages: list[dict[str, Any]] = []
    # indices of assistant messages still open to the items that follow: a reasoning item's turn
    # awaiting its content, and a turn whose content is set (function_call items may still join it)
    content_open: set[int] = set()

    def open_assistant() -> dict[str, Any] | None:
        return messages[-1] if messages and messages[-1]["role"] == "assistant" else None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise GatewayError(f"{where} must be an object (an input item)", param="input")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise GatewayError(f"{where}: role {role!r} is not one of {', '.join(MESSAGE_ROLES)}", param="input")
            text = _text(item.get("content"), where)
            if role == "assistant":
                prev = open_assistant()
                if prev is not None and len(messages) - 1 in content_open:
                    prev["content"] = text
                    content_open.discard(len(messages) - 1)
                else:
                    messages.append({"role": "assistant", "content": text})
            else:
                messages.append({"role": "system" if role in ("system", "developer") else "user", "content": text})
        elif kind == "reasoning":
            text = _reasoning(item, where)
            msg: dict[str, Any] = {"role": "assistant", "content": ""}
            if text is not None:
                msg["reasoning_content"] = text
            messages.append(msg)
            content_open.add(len(messages) - 1)
        elif kind == "function_call":
            call = _tool_call(item, where)
            prev = open_assistant()
            if prev is not None:
                prev.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            cid = _call_id(item, where)
            if "output" not in item:
                raise GatewayError(f"{where}: a function_call_output item needs its output", param="input")
            messages.append({"role": "tool", "content": _text(item["output"], where), "tool_call_id": cid})
        elif isinstance(kind, str):
            raise GatewayError(f"{where}: input items of type {kind!r} are not supported by this gateway (message, "
                               "reasoning, function_call and function_call_output are)", param="input")
        else:
            raise GatewayError(f"{where}: an input item needs its type (or a role, for a message)", param="input")
    return messages


def convert_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses function tools as chat tools (name, description, parameters; ``strict`` is an API
    option, not something the model is shown)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise GatewayError("tools must be a list", param="tools")
    out = []
    for j, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            what = f"a {kind!r} tool" if isinstance(kind, str) else "not a function tool"
            raise GatewayError(f"tools[{j}] is {what}: this gateway serves function tools only ({{\"type\": \"function\", "
                               "\"name\", \"description\", \"parameters\"}); hosted tools are never run or dropped",
                               param="tools")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise GatewayError(f"tools[{j}]: a function tool needs its name (a string)", param="tools")
        if t.get("parameters") is not None and not isinstance(t["parameters"], dict):
            raise GatewayError(f"tools[{j}]: parameters must be a JSON schema object", param="tools")
        if t.get("description") is not None and not isinstance(t["description"], str):
            raise GatewayError(f"tools[{j}]: description must be a string", param="tools")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def tool_choice(v: Any) -> Any:
    if v is None or v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str):
        return v["name"]
    raise GatewayError('tool_choice is "auto", "none", "required" or {"type": "function", "name": ...} on this gateway',
                       param="tool_choice")


def parse_request(body: Any, served_model: str) -> tuple[TurnRequest, dict[str, Any]]:
    """``(the turn request, the dialect's own options: stream and the fields a response echoes)``;
    :class:`GatewayError` for anything malformed."""
    if not isinstance(body, dict):
        raise GatewayError("the body must be a JSON object")
    for k, why in REFUSED.items():
        if body.get(k) not in (None, False):
            raise GatewayError(f"{k}: {why}", param=k)
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise GatewayError("model must be a string", param="model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise GatewayError("instructions must be a string", param="instructions")
    raw = body.get("input")
    if isinstance(raw, str):
        messages = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        messages = input_messages(raw)
    elif raw is None:
        raise GatewayError("input is required: a string or a list of input items", param="input")
    else:
        raise GatewayError("input must be a string or a non-empty list of input items", param="input")
    if instructions:
        messages = [{"role": "system", "content": instructions}, *messages]
    n = body.get("n")
    if n is not None and n != 1:
        raise GatewayError("n must be 1: this gateway records one turn per request", param="n")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise GatewayError("max_output_tokens must be a positive whole number", param="max_output_tokens")
    sampling = read_sampling(body, SAMPLING)
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or not (fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text")):
            raise GatewayError("text.format other than text (json_schema, json_object) is not supported by this gateway",
                               param="text.format")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise GatewayError("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError("stream must be true or false", param="stream")
    tools = body.get("tools")
    req = TurnRequest(
        dialect=DIALECT, model=model, messages=messages, tools=convert_tools(tools),
        tool_choice=tool_choice(body.get("tool_choice")), parallel_tool_calls=parallel, max_tokens=max_tokens,
        sampling=sampling, ignored={k: body[k] for k in IGNORED if body.get(k) not in (None, {}, [])},
    )
    echo = {
        "instructions": instructions, "max_output_tokens": max_tokens, "metadata": body.get("metadata") or {},
        "parallel_tool_calls": True if parallel is None else parallel,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "store": body.get("store") if isinstance(body.get("store"), bool) else False,
        "temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"),
        "text": text if text is not None else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto", "tools": tools or [],
        "truncation": body.get("truncation") if body.get("truncation") in ("auto", "disabled") else "disabled",
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
    }
    return req, {"stream": stream, "echo": echo}


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def output_items(result: TurnResult) -> list[dict[str, Any]]:
    """The turn's output items: its reasoning, its text, one function_call per call. Their ids come
    from the turn's, so a retry answered from the record is the same response."""
    items: list[dict[str, Any]] = []
    if result.reasoning:
        items.append({"id": f"rs_{result.id}", "type": "reasoning", "summary": [],
                      "content": [{"type": "reasoning_text", "text": result.reasoning}], "status": "completed"})
    if result.content:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        items.append({"id": f"msg_{result.id}", "type": "message", "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": result.content, "annotations": [], "logprobs": []}]})
    for k, c in enumerate(result.tool_calls):
        items.append({"id": f"fc_{result.id}_{k}", "type": "function_call", "call_id": c["id"], "name": c["name"],
                      "arguments": _arguments(c["arguments"]), "status": "completed"})
    return items


def _usage(result: TurnResult) -> dict[str, Any]:
    # reasoning tokens are not counted apart (0): the turn's ids are not split by the parser
    return {"input_tokens": result.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": result.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def _status(result: TurnResult) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


def response(result: TurnResult, options: dict[str, Any], *, done: bool = True) -> dict[str, Any]:
    """The ``response`` object of a turn (``done=False``: as it stands before its output, for the
    stream's first events)."""
    status = _status(result) if done else "in_progress"
    return {
        "id": f"resp_{result.id}", "object": "response", "created_at": result.created, "status": status,
        "completed_at": result.created if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": result.model, "output": output_items(result) if done else [],
        "previous_response_id": None, **options.get("echo", {}),
        "usage": _usage(result) if done else None,
    }


def _event(kind: str, seq: int, **fields: Any) -> str:
    data = {"type": kind, "sequence_number": seq, **fields}
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream(result: TurnResult, options: dict[str, Any]) -> Iterator[str]:
    """The turn as the Responses event stream: response.created, response.in_progress, each output
    item's events, then response.completed (response.incomplete when it hit max_output_tokens)."""
    seq = iter(range(1 << 62))
    start = response(result, options, done=False)
    yield _event("response.created", next(seq), response=start)
    yield _event("response.in_progress", next(seq), response=start)
    for k, item in enumerate(output_items(result)):
        at = {"output_index": k, "item_id": item["id"]}
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            yield _event("response.output_item.added", next(seq), output_index=k,
                         item={**item, "content": [], "status": "in_progress"})
            yield _event("response.content_part.added", next(seq), **at, content_index=0,
                         part={"type": "reasoning_text", "text": ""})
            yield _event("response.reasoning_text.delta", next(seq), **at, content_index=0, delta=text)
            yield _event("response.reasoning_text.done", next(seq), **at, content_index=0, text=text)
            yield _event("response.content_part.done", next(seq), **at, content_index=0, part=item["content"][0])
        elif item["type"] == "message":
            part = item["content"][0]
            yield _event("response.output_item.added", next(seq), output_index=k,
                         item={**item, "content": [], "status": "in_progress"})
            yield _event("response.content_part.added", next(seq), **at, content_index=0,
                         part={**part, "text": ""})
            yield _event("response.output_text.delta", next(seq), **at, content_index=0, delta=part["text"], logprobs=[])
            yield _event("response.output_text.done", next(seq), **at, content_index=0, text=part["text"], logprobs=[])
            yield _event("response.content_part.done", next(seq), **at, content_index=0, part=part)
        else:
            yield _event("response.output_item.added", next(seq), output_index=k,
                         item={**item, "arguments": "", "status": "in_progress"})
            yield _event("response.function_call_arguments.delta", next(seq), **at, delta=item["arguments"])
            yield _event("response.function_call_arguments.done", next(seq), **at, name=item["name"],
                         arguments=item["arguments"])
        yield _event("response.output_item.done", next(seq), output_index=k, item=item)
    final = response(result, options)
    yield _event(f"response.{final['status']}", next(seq), response=final)
