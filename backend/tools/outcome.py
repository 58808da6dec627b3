"""What one tool invocation produced (:class:`Outcome`), before the registry turns it into a
:class:`~backend.trace.ToolResult`, and the outcomes every tool kind reports the same way
(an exception, a timeout, a result that cannot become text)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from backend.tools._runtime import clean_text

MAX_DETAIL_CHARS = 20_000  # tracebacks kept in error_detail
MAX_MESSAGE_CHARS = 2_000  # exception messages quoted in the content the model sees


@dataclass
class Outcome:
    """What one invocation produced, before it becomes a ToolResult."""

    content: str | None = None  # the text (ok) or the error message (not ok)
    error: str | None = None  # None when ok; else unknown_tool, invalid_arguments, exception, timeout, bad_result, crashed
    detail: str | None = None
    stdout: str | None = None
    note: str | None = None
    reward: float | None = None
    metrics: dict[str, Any] | None = None
    truncated: bool = False  # already truncated (by the sandbox child)
    original_length: int | None = None
    extra: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class CallOptions:
    timeout_s: float | None = 30.0
    max_response_length: int | None = None
    truncate_side: str = "middle"


def safe_str(obj: Any, limit: int = MAX_MESSAGE_CHARS) -> str:
    try:
        s = str(obj)
        if not isinstance(s, str):
            raise TypeError
    except BaseException:  # noqa: BLE001 - a hostile __str__
        s = f"<unprintable {type(obj).__name__}>"
    s = clean_text(s)[0]
    return s if len(s) <= limit else s[:limit] + "...(truncated)"


def format_traceback(e: BaseException) -> str:
    try:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except BaseException:  # noqa: BLE001
        tb = f"{type(e).__name__}: {safe_str(e)}"
    tb = clean_text(tb)[0]
    return tb if len(tb) <= MAX_DETAIL_CHARS else "...(truncated)...\n" + tb[-MAX_DETAIL_CHARS:]


def exception_outcome(name: str, e: BaseException) -> Outcome:
    if isinstance(e, SystemExit):
        msg = f"Error: tool '{name}' called sys.exit({safe_str(e.code, 200) if e.code is not None else ''})"
    else:
        text = safe_str(e)
        msg = f"Error: tool '{name}' raised {type(e).__name__}" + (f": {text}" if text else "")
    return Outcome(content=msg, error="exception", detail=format_traceback(e))


def timeout_outcome(name: str, timeout_s: float | None, extra: str = "") -> Outcome:
    return Outcome(content=f"Error: tool '{name}' timed out after {fmt_s(timeout_s)}", error="timeout",
                   detail=f"no result within {fmt_s(timeout_s)}{extra}")


def bad_result_outcome(name: str, e: BaseException) -> Outcome:
    return Outcome(
        content=f"Error: tool '{name}' returned a result that cannot be turned into text ({type(e).__name__}: {safe_str(e, 300)})",
        error="bad_result", detail=format_traceback(e),
    )


def fmt_s(t: float | None) -> str:
    return "no limit" if t is None else f"{t:g} s"
