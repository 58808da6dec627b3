"""Helpers for the adapters (vLLM, transformers): they return calls without positions, so we find
each call's text in the input with our own parser of the same format."""

from __future__ import annotations

from typing import Any

from backend.parsers._common import decode_whole, type_name
from backend.parsers.base import ParseResult, ToolCallParser, get_parser
from backend.trace import ParseError, ToolCall


def unwrap_tokenizer(tok: Any) -> tuple[Any, str | None]:
    """Accept a tokenizer or a bundle with ``.tokenizer`` and ``.chat_template`` (such as
    :class:`backend.loading.tokenizers.TokenizerBundle`); return ``(tokenizer, chat_template)``."""
    inner = getattr(tok, "tokenizer", None)
    if inner is not None and not hasattr(tok, "encode") and hasattr(tok, "chat_template"):
        return inner, tok.chat_template
    return tok, getattr(tok, "chat_template", None)


def to_arguments(args: Any) -> tuple[dict[str, Any] | None, str | None]:
    """An adapter's arguments (object or JSON string) as a dict, or an error message."""
    if isinstance(args, dict):
        return args, None
    if isinstance(args, str):
        value, err = decode_whole(args) if args.strip() else ({}, None)
        if err is not None:
            return None, f"arguments string is not a JSON object ({err})"
        if not isinstance(value, dict):
            return None, f"arguments string holds {type_name(value)}, not an object"
        return value, None
    if args is None:
        return {}, None
    return None, f"arguments must be a JSON object, got {type_name(args)}"


def build_result(
    text: str,
    calls: list[tuple[str, Any, str | None]],
    content: str | None,
    reasoning: str | None,
    native: str | None,
    source: str,
    tools: list[dict[str, Any]] | None = None,
) -> ParseResult:
    """Turn an adapter's ``(name, arguments, id)`` calls into a :class:`ParseResult`, locating each
    call in ``text`` with our ``native`` parser (span None where it cannot be found)."""
    located: list[ToolCall] = []
    if native is not None:
        try:
            located = get_parser(native, tools=tools).parse(text).tool_calls  # tools: values typed as the adapter's
        except Exception:  # noqa: BLE001 - locating is best effort
            located = []
    used = 0
    res = ParseResult(content=(content or "").strip(), reasoning=reasoning)
    for name, raw_args, call_id in calls:
        args, err = to_arguments(raw_args)
        span = raw = None
        for k in range(used, len(located)):
            c = located[k]
            if c.name == name and (args is None or c.arguments == args):
                span, raw, used = c.span, c.raw, k + 1
                break
        if err is not None or not isinstance(name, str):
            msg = err if err is not None else f"{source} returned a call whose name is not a string"
            res.errors.append(ParseError(message=f"{source}: tool call {name!r}: {msg}", span=span, raw=raw))
            continue
        res.tool_calls.append(ToolCall(name=name, arguments=args, id=call_id, span=span, raw=raw))
    return res


def whole_text_error(text: str, message: str) -> ParseResult:
    return ParseResult(content=text.strip(), errors=[ParseError(message=message[:2000], span=(0, len(text)), raw=text)])


def native_formatter(native: str | None, who: str) -> ToolCallParser:
    if native is None:
        raise NotImplementedError(f"{who}: no native format known for writing calls back")
    return get_parser(native)
