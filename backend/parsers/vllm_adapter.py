"""``vllm:<name>``: vLLM's own tool parser, for comparing what a vLLM server would return.

``get_parser("vllm:hermes", tokenizer=tok, tools=[...])`` builds vLLM's parser class
(``ToolParserManager.get_tool_parser(name)``) and calls its ``extract_tool_calls(text, request)``
with a minimal ``ChatCompletionRequest`` carrying the tools. vLLM reports no errors and no
positions: each call's span is found with our parser of the same format (None if not found), and
an exception raised by vLLM becomes one error spanning the whole text. Note that vLLM's parsers
usually drop every call of a turn when one is malformed (they log and return the text as content).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import Any

from backend.parsers._adapt import build_result, native_formatter, unwrap_tokenizer, whole_text_error
from backend.parsers.base import ParserError, ParseResult, ToolCallParser, get_parser, parser_for_vllm, register_prefix
from backend.trace import ParseError


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def vllm_parser_names() -> list[str]:
    """``vllm:<name>`` for every tool parser the installed vLLM registers ([] without vLLM).
    Importing vLLM takes seconds; this is not called by :func:`available_parsers`."""
    if not vllm_available():
        return []
    from vllm.tool_parsers import ToolParserManager

    return [f"vllm:{n}" for n in ToolParserManager.list_registered()]


class VLLMParser(ToolCallParser):
    def __init__(self, vllm_name: str, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None, native: str | None = None) -> None:
        if not vllm_available():
            raise ParserError(f"vLLM is not installed, so parser 'vllm:{vllm_name}' is not available (pip install vllm); "
                             "the native parsers (python -m backend parse --format NAME: hermes, qwen3_xml, harmony, ...) need nothing extra")
        if tokenizer is None:
            raise ParserError(f"parser 'vllm:{vllm_name}' needs a tokenizer: get_parser('vllm:{vllm_name}', tokenizer=...)")
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        try:
            self._cls = ToolParserManager.get_tool_parser(vllm_name)
        except KeyError:
            raise ParserError(
                f"vLLM has no tool parser {vllm_name!r}; vLLM's parsers: {', '.join(ToolParserManager.list_registered())}"
            ) from None
        except Exception as e:  # a lazily registered parser whose module fails to import
            raise ParserError(f"vLLM's tool parser {vllm_name!r} could not be loaded: {type(e).__name__}: {e}") from e
        super().__init__(tokenizer, tools)
        self.name = f"vllm:{vllm_name}"
        self.vllm_name = vllm_name
        self._tok, _ = unwrap_tokenizer(tokenizer)
        try:
            self._request = ChatCompletionRequest(model="agent-loop-inspector", messages=[], tools=tools or None)
        except Exception as e:  # pydantic validation of the tools
            raise ParserError(f"tools are not valid OpenAI tool definitions for vLLM: {e}") from e
        try:
            self._new_vllm_parser()  # fail here, not on every parse, when the tokenizer does not fit
        except Exception as e:  # noqa: BLE001
            raise ParserError(f"vLLM's {vllm_name!r} tool parser cannot be used with this tokenizer: {type(e).__name__}: {e}") from e
        self.native = native or parser_for_vllm(vllm_name)  # locates spans, writes calls back
        if self.native is not None:
            fmt = native_formatter(self.native, self.name)
            self.call_begin, self.call_end = fmt.call_begin, fmt.call_end

    def _new_vllm_parser(self) -> Any:
        # A fresh instance per parse: vLLM parsers keep streaming state on the instance.
        try:
            return self._cls(self._tok, self._request.tools)
        except TypeError:
            return self._cls(self._tok)

    def _parse(self, text: str) -> ParseResult:
        with _LoggedByVLLM() as logged:
            try:
                info = self._new_vllm_parser().extract_tool_calls(text, self._request)
            except Exception as e:  # noqa: BLE001 - whatever vLLM raises is reported, not propagated
                hint = f" (the native {self.native!r} parser reads this format: --format {self.native})" if self.native else ""
                return whole_text_error(text, f"{self.name} raised {type(e).__name__}: {e}{hint}")
        calls = []
        for tc in info.tool_calls or []:
            fn = getattr(tc, "function", None)
            calls.append((getattr(fn, "name", None), getattr(fn, "arguments", None), getattr(tc, "id", None)))
        res = build_result(text, calls, info.content, None, self.native, self.name, self.tools)
        self._report_what_vllm_swallowed(text, res, logged.records, info)
        return res

    def _report_what_vllm_swallowed(self, text: str, res: ParseResult, records: list[logging.LogRecord], info: Any) -> None:
        """vLLM's parsers often fail without saying so in their result: an exception they only log
        (``mistral`` on a v11 ``[ARGS]`` call), no call and no content at all (``deepseek_v31`` on
        V3-style output), calls the native parser of the same format reads and vLLM dropped. Each
        becomes an error on the result, so an adapter is never silently lossy."""
        whole = (0, len(text))
        for r in records:
            msg = r.getMessage().splitlines()[0] if r.getMessage() else ""
            exc = f" ({r.exc_info[0].__name__}: {r.exc_info[1]})" if r.exc_info and r.exc_info[1] is not None else ""
            res.errors.append(ParseError(message=f"{self.name} logged {r.levelname.lower()}: {msg}{exc}"[:500]
                                         + " — its result does not say so", span=whole, raw=text))
        if not res.tool_calls and not (info.content or "").strip() and text.strip():
            res.errors.append(ParseError(message=f"{self.name} returned no tool call, no content and no error for this "
                                                 "text: everything in it was dropped", span=whole, raw=text))
        if self.native is None:
            return
        try:
            native = get_parser(self.native, tools=self.tools).parse(text).tool_calls
        except Exception:  # noqa: BLE001 - the cross-check is best effort
            return
        if len(native) > len(res.tool_calls):
            found = {(c.name, repr(c.arguments)) for c in res.tool_calls}
            lost = [c for c in native if (c.name, repr(c.arguments)) not in found]
            spans = [c.span for c in lost if c.span is not None]
            span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else whole
            res.errors.append(ParseError(
                message=f"{self.name} returned {len(res.tool_calls)} tool call(s) where the native {self.native!r} parser "
                        f"reads {len(native)} ({', '.join(c.name for c in lost[:5])} dropped)", span=span,
                raw=text[span[0]:span[1]]))

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return native_formatter(self.native, self.name).format_calls(calls)


class _LoggedByVLLM(logging.Handler):
    """Collects what vLLM's loggers say at warning level or above, from this thread, while in
    the ``with`` block (vLLM's parsers log exceptions they then swallow)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self._thread = threading.get_ident()
        self._logger = logging.getLogger("vllm")

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread:
            self.records.append(record)

    def __enter__(self) -> _LoggedByVLLM:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.removeHandler(self)


register_prefix("vllm", VLLMParser)
