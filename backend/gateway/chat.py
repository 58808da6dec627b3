"""The Chat Completions dialect (``POST /v1/chat/completions``): a request becomes chat messages as
vLLM's server reads them, a turn becomes a ``chat.completion`` or, with ``stream``, its
``chat.completion.chunk`` events (synthetic: the turn is generated and recorded first).

Messages: ``system`` and ``developer`` are system messages; content given as a list of text parts
is joined with newlines (any other part is refused, never dropped); an assistant turn's
``tool_calls`` keep their ids, arguments decoded from their JSON string; ``reasoning_content`` (or
vLLM's newer ``reasoning``) is the turn's reasoning; ``tool`` messages keep ``tool_call_id``.
Tools are rendered exactly as sent. ``n`` above 1 is refused; ``max_tokens`` /
``max_completion_tokens`` bound the turn; ``return_token_ids`` (vLLM's extension) adds the ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from backend.gateway.core import GatewayError, TurnRequest, TurnResult, message_text, read_sampling, strict_loads

DIALECT = "chat"
ROLES = ("system", "developer", "user", "assistant", "tool")
# sampling fields passed to the generator: their JSON types and the range each must lie in (what
# vLLM accepts), checked here so a bad one is a 400, not a failed turn (core.read_sampling)
SAMPLING = {"temperature": ((int, float), 0, 100), "top_p": ((int, float), 1e-9, 1), "top_k": ((int,), -1, 1 << 20),
            "seed": ((int,), -(1 << 63), (1 << 63) - 1), "repetition_penalty": ((int, float), 1e-9, 100)}
# fields a client may send that this gateway does not apply: recorded on the turn, never silently
IGNORED = ("frequency_penalty", "presence_penalty", "logit_bias", "user", "metadata", "store", "service_tier",
           "prediction", "reasoning_effort", "top_logprobs", "modalities", "audio", "web_search_options")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tool_call(c: Any, where: str) -> dict[str, Any]:
    if not isinstance(c, dict) or not isinstance(c.get("function"), dict) or not isinstance(c["function"].get("name"), str):
        raise GatewayError(f"{where}: a tool call is {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                           "\"arguments\"}}}}", param="messages")
    args = c["function"].get("arguments")
    if isinstance(args, str):
        try:
            decoded = strict_loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            args = decoded
    elif args is None:
        args = {}
    call: dict[str, Any] = {"type": "function", "function": {"name": c["function"]["name"], "arguments": args}}
    if c.get("id") is not None:
        call["id"] = str(c["id"])
    return call


def chat_message(m: Any, i: int) -> dict[str, Any]:
    """One request message as a chat message in Hugging Face format."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise GatewayError(f"{where} must be an object", param="messages")
    role = m.get("role")
    if role not in ROLES:
        raise GatewayError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}", param="messages")
    text = message_text(m.get("content"), where)
    if role in ("system", "developer"):
        return {"role": "system", "content": text}
    if role == "user":
        return {"role": "user", "content": text}
    if role == "tool":
        out = {"role": "tool", "content": text}
        if m.get("tool_call_id") is not None:
            out["tool_call_id"] = str(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        return out
    out = {"role": "assistant", "content": text}
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if isinstance(reasoning, str):
        out["reasoning_content"] = reasoning
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise GatewayError(f"{where}: tool_calls must be a list", param="messages")
        if calls:
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def check_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise GatewayError("tools must be a list", param="tools")
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function" or not isinstance(fn.get("name"), str):
            raise GatewayError(f"tools[{j}] must be {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}", param="tools")
    return tools


def tool_choice(v: Any) -> Any:
    if v is None or v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance((v.get("function") or {}).get("name"), str):
        return v["function"]["name"]
    raise GatewayError('tool_choice is "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
                       param="tool_choice")


def parse_request(body: Any, served_model: str) -> tuple[TurnRequest, dict[str, Any]]:
    """``(the turn request, the dialect's own options: stream, include_usage, logprobs,
    return_token_ids)``; :class:`GatewayError` for anything malformed."""
    if not isinstance(body, dict):
        raise GatewayError("the body must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise GatewayError("messages must be a non-empty list", param="messages")
    n = body.get("n")
    if n is not None and n != 1:
        raise GatewayError("n must be 1: this gateway records one turn per request", param="n")
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise GatewayError("model must be a string", param="model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise GatewayError("max_tokens must be a positive whole number", param="max_tokens")
    sampling = read_sampling(body, SAMPLING)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
            raise GatewayError("stop must be a string or a list of at most 16 strings", param="stop")
        sampling["stop"] = stop
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise GatewayError("response_format other than text is not supported by this gateway", param="response_format")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise GatewayError("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError("stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise GatewayError("stream_options must be an object", param="stream_options")
    req = TurnRequest(
        dialect=DIALECT, model=model, messages=[chat_message(m, i) for i, m in enumerate(msgs)],
        tools=check_tools(body.get("tools")), tool_choice=tool_choice(body.get("tool_choice")),
        parallel_tool_calls=parallel, max_tokens=max_tokens, sampling=sampling,
        ignored={k: body[k] for k in IGNORED if body.get(k) not in (None, 0, {}, [])},
    )
    return req, {"stream": stream, "include_usage": bool(options.get("include_usage")),
                 "logprobs": bool(body.get("logprobs")), "return_token_ids": bool(body.get("return_token_ids"))}


def _calls(result: TurnResult) -> list[dict[str, Any]]:
    return [{"id": c["id"], "type": "function", "function": {
        "name": c["name"],
        "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"], ensure_ascii=False)}}
        for c in result.tool_calls]


def _logprobs(result: TurnResult) -> dict[str, Any] | None:
    if result.logprobs is None:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", "replace")), "top_logprobs": []}
                        for t, lp in zip(result.tokens, result.logprobs)]}


def _usage(result: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def response(result: TurnResult, options: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` object of a turn."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content or (None if result.tool_calls else "")}
    if result.reasoning is not None:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = _calls(result)
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "logprobs": _logprobs(result) if options.get("logprobs") else None,
                              "finish_reason": result.finish_reason}
    out: dict[str, Any] = {"id": f"chatcmpl-{result.id}", "object": "chat.completion", "created": result.created,
                           "model": result.model, "choices": [choice], "usage": _usage(result)}
    if options.get("return_token_ids"):
        choice["token_ids"] = list(result.token_ids)
        out["prompt_token_ids"] = list(result.prompt_ids)
    return out


def stream(result: TurnResult, options: dict[str, Any]) -> Iterator[str]:
    """The turn as ``chat.completion.chunk`` server-sent events, ending with ``data: [DONE]``."""
    head = {"id": f"chatcmpl-{result.id}", "object": "chat.completion.chunk", "created": result.created,
            "model": result.model}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        return f"data: {json.dumps({**head, 'choices': [c]}, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    if result.reasoning:
        yield chunk({"reasoning_content": result.reasoning})
    if result.content:
        extra = {"logprobs": _logprobs(result)} if options.get("logprobs") else {}
        yield chunk({"content": result.content}, **extra)
    for i, call in enumerate(_calls(result)):
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
    extra = {"token_ids": list(result.token_ids)} if options.get("return_token_ids") else {}
    yield chunk({}, result.finish_reason, **extra)
    if options.get("include_usage"):
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(result)})}\n\n"
    yield "data: [DONE]\n\n"


def error_body(e: GatewayError) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.status}}
