"""Messages out of model text, and JSON values named for people.

- :func:`assistant_message`: the assistant message of a parsed turn (the engine's and the
  importers'); :func:`parse_assistant_text`: the same from a turn's text, via a tool-call parser.
- :func:`decode_arguments`: tool-call arguments (an object or a JSON string) as an object, or
  the problem in words.
- :func:`json_type`: the JSON name of a value's type, for messages ("an array", never "list").
"""

from __future__ import annotations

import json
from typing import Any


def json_type(v: Any) -> str:
    """The JSON name of a parsed value's type (for messages: never a Python class name)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def decode_arguments(raw: Any) -> tuple[Any, str | None]:
    """Tool-call arguments as an object: an object as it is, a JSON string decoded, an empty
    string or None as ``{}``. Returns ``(value, problem)``; with a problem the value is what was
    given (or what the string decoded to), kept for display."""
    if raw is None:
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return raw, f"arguments must be a JSON object or a JSON string, got {json_type(raw)}"
    if not raw.strip():
        return {}, None
    try:
        v = json.loads(raw)
    except json.JSONDecodeError as e:
        return raw, f"arguments are not valid JSON: {e.msg} at char {e.pos}"
    except (ValueError, RecursionError):  # nesting, Python's long-integer guard
        return raw, "arguments are not valid JSON: nested too deeply or a number too long"
    if not isinstance(v, dict):
        return v, f"arguments must be a JSON object, got {json_type(v)}"
    return v, None


def strip_suffix(text: str, eos: str | None) -> str:
    """``text`` without a final end-of-sequence token's text."""
    return text[: -len(eos)] if eos and text.endswith(eos) else text


def content_keeping_errors(text: str, res: Any) -> str:
    """The parser's content, except when some call could not be read: then the turn's text with
    only the well-formed calls (and the reasoning block) cut out, so the unreadable call stays
    visible in the message (a parser drops it from ``content``)."""
    if not any(e.severity == "error" for e in res.errors):  # a warning's call was read: nothing to keep
        return res.content
    cuts = [c.span for c in res.tool_calls if c.span is not None]
    if res.reasoning is not None and "</think>" in text:
        cuts.append((0, text.index("</think>") + len("</think>")))
    out, pos = [], 0
    for a, b in sorted(cuts):
        if a >= pos:
            out.append(text[pos:a])
            pos = b
    out.append(text[pos:])
    return "".join(out).strip()


def assistant_message(res: Any, *, text: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant message of a parsed turn (``res``: a parser's result): its content,
    ``reasoning_content`` when the turn has reasoning, ``tool_calls`` (HF format; ``calls``, else
    the parsed calls) when it has calls. With ``text`` (the turn's text), a call the parser could
    not read stays in the content (:func:`content_keeping_errors`)."""
    msg: dict[str, Any] = {"role": "assistant", "content": res.content if text is None else content_keeping_errors(text, res)}
    if res.reasoning is not None:
        msg["reasoning_content"] = res.reasoning
    if calls is None:
        calls = [c.to_message_call() for c in res.tool_calls]
    if calls:
        msg["tool_calls"] = calls
    return msg


def parse_assistant_text(text: str, parser: Any, eos: str | None) -> tuple[dict[str, Any], list[Any]]:
    """An assistant message and its parse errors from a generated turn's text (a final EOS is
    stripped first), via the tool-call parser; unreadable calls stay in the content."""
    body = strip_suffix(text, eos)
    res = parser.parse(body)
    return assistant_message(res, text=body), list(res.errors)
