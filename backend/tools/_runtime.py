"""Result conversion and truncation, shared by the server and the sandbox child.

This module must stay **standard-library only** and must not import anything from ``backend``:
the sandbox child (:mod:`backend.tools._sandbox_child`) loads it by file path inside an
isolated interpreter (``python -I``) where the project is not importable.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

TRUNCATE_SIDES = ("left", "right", "middle")

# verl's markers (ToolAgentLoop): what the model sees where text was cut
LEFT_MARKER = "...(truncated)"
RIGHT_MARKER = "(truncated)..."
MIDDLE_MARKER = "...(truncated)..."

NOT_SERIALISABLE_NOTE = "the result is not JSON-serialisable; str() of it was used"


def validate_truncate_side(side: str) -> str:
    """Return ``side`` if it is one of ``left``, ``right``, ``middle``; raise ValueError otherwise."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate side must be one of {', '.join(TRUNCATE_SIDES)}, got {side!r}")
    return side


def truncate_tool_response(text: str, max_len: int | None, side: str = "middle") -> tuple[str, bool]:
    """Cut ``text`` to ``max_len`` characters the way verl's ToolAgentLoop does.

    Nothing happens when ``max_len`` is None or ``len(text) <= max_len``. Otherwise, with
    ``n = max_len``:

    * ``left`` keeps the head: ``text[:n] + "...(truncated)"``
    * ``right`` keeps the tail: ``"(truncated)..." + text[-n:]``
    * ``middle`` keeps both ends: ``text[:n//2] + "...(truncated)..." + text[-(n//2):]``

    The marker is added on top of the ``n`` kept characters (as in verl). One deliberate
    difference: for ``middle`` with ``n == 1`` verl's ``text[-0:]`` would append the *whole*
    text; here the tail is then empty.

    Returns ``(text, truncated)``.
    """
    validate_truncate_side(side)
    if max_len is None or len(text) <= max_len:
        return text, False
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    if side == "left":
        return text[:max_len] + LEFT_MARKER, True
    if side == "right":
        return RIGHT_MARKER + (text[len(text) - max_len :] if max_len else ""), True
    half = max_len // 2
    return text[:half] + MIDDLE_MARKER + (text[len(text) - half :] if half else ""), True


def clean_text(text: str) -> tuple[str, bool]:
    """Replace lone surrogates (which cannot be encoded as UTF-8, tokenized or saved) with U+FFFD.

    Returns ``(text, changed)``.
    """
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), True


def to_content(value: Any) -> tuple[str, str | None]:
    """Turn a tool's return value into the text of the tool message.

    * ``str``: as it is
    * an object with a ``text`` attribute that is a str or None (verl's ``ToolResponse``): the text
    * ``dict``/``list``/``tuple``/number/``bool``/``None``: ``json.dumps(value, ensure_ascii=False)``
    * a pydantic model (``model_dump``) or a dataclass instance: its fields as JSON
    * anything else (or JSON that fails: sets, datetimes, cycles, ...): ``str(value)``; the
      result is still ``ok`` and the returned note says so

    Returns ``(text, note)``; note is None unless something noteworthy happened. Raises
    whatever ``str(value)`` raises if even that fails (the caller reports ``bad_result``).
    """
    note = None
    if isinstance(value, str):
        text = value
    elif not isinstance(value, type) and hasattr(value, "text") and isinstance(getattr(value, "text", None), (str, type(None))):
        text = value.text or ""
        extra = [k for k in ("image", "video", "audio") if getattr(value, k, None)]
        if extra:
            note = f"the response's {', '.join(extra)} part(s) were dropped; only text is supported"
    else:
        obj = value
        try:
            if hasattr(obj, "model_dump") and not isinstance(obj, type):
                obj = obj.model_dump(mode="json")
            elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                obj = dataclasses.asdict(obj)
            text = json.dumps(obj, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError, OverflowError):
            text = str(value)
            if not isinstance(text, str):  # pragma: no cover - str() always returns str or raises
                raise TypeError("str() of the result did not return a string")
            note = NOT_SERIALISABLE_NOTE
    text, changed = clean_text(text)
    if changed:
        note = (note + "; " if note else "") + "lone surrogate characters were replaced with U+FFFD"
    return text, note
