"""``transformers``: the tokenizer's own response parser (``tokenizer.parse_response``, transformers 5).

``get_parser("transformers", tokenizer=tok)`` uses, in order: ``schema=`` if given, the
tokenizer's ``response_template``, or the one trl's ``add_response_schema`` knows for the chat
template (``chat_template=``, a bundle's template, or the tokenizer's own), or, for a tokenizer
with no chat template but ``<tool_call>`` in its vocabulary, trl's Qwen3 one; it raises
:class:`~backend.parsers.base.ParserError` (a ``ValueError``) when none is found. The tokenizer is not modified. ``prefix`` is the prompt text that came before
the generation (default ``""``; pass ``"<think>\\n"`` when the template opened a think block).

Any exception raised while parsing becomes one error spanning the whole text (the content is then
the whole text). Spans of calls are found with our parser of the same format (None if not found).
"""

from __future__ import annotations

import types
from typing import Any

from backend.parsers._adapt import build_result, native_formatter, unwrap_tokenizer, whole_text_error
from backend.parsers.base import ParserError, ParseResult, ToolCallParser, guess_format, register_parser


def schema_for_template(chat_template: str | None) -> Any:
    """trl's response template for a known chat template, or None."""
    if not chat_template:
        return None
    try:
        from trl.chat_template_utils import add_response_schema
    except Exception:  # noqa: BLE001 - trl missing or broken: no schema from it
        return None
    shim = types.SimpleNamespace(chat_template=chat_template)
    try:
        add_response_schema(shim)
    except (ValueError, TypeError, AttributeError):
        return None
    return getattr(shim, "response_template", None) or getattr(shim, "response_schema", None)


def _qwen_family_schema(tok: Any) -> Any:
    """A tokenizer loaded without its chat template (our offline profiles keep the template in
    the bundle) but with ``<tool_call>`` in its vocabulary is Qwen-family: use trl's Qwen3 template."""
    try:
        if tok.convert_tokens_to_ids("<tool_call>") in (None, getattr(tok, "unk_token_id", None)):
            return None
        from trl.chat_template_utils import qwen3_chat_template
    except Exception:  # noqa: BLE001
        return None
    return schema_for_template(qwen3_chat_template)


@register_parser("transformers")
class TransformersParser(ToolCallParser):
    def __init__(
        self,
        tokenizer: Any = None,
        tools: list[dict[str, Any]] | None = None,
        schema: Any = None,
        prefix: str = "",
        chat_template: str | None = None,
        native: str | None = None,
    ) -> None:
        if tokenizer is None:
            raise ParserError("the 'transformers' parser needs a tokenizer: get_parser('transformers', tokenizer=...)")
        tok, bundle_template = unwrap_tokenizer(tokenizer)
        if not hasattr(tok, "parse_response"):
            raise ParserError("the 'transformers' parser needs a transformers >= 5 tokenizer (no parse_response on "
                             f"{type(tok).__name__})")
        super().__init__(tok, tools)
        template = chat_template or bundle_template or getattr(tok, "chat_template", None)
        if isinstance(template, dict):  # several named templates
            template = template.get("default") or next(iter(template.values()), None)
        self.schema = schema or getattr(tok, "response_template", None) or schema_for_template(template)
        if self.schema is None and not template:
            self.schema = _qwen_family_schema(tok)
            template = "<tool_call>" if self.schema is not None else None
        if self.schema is None:
            raise ParserError(
                "the 'transformers' parser needs a response template: this tokenizer has none and trl's "
                "add_response_schema does not know its chat template; pass schema=... (see transformers' "
                "chat response parsing docs) or use a native parser"
            )
        self.prefix = prefix
        self.native = native or guess_format(template if isinstance(template, str) else None) or guess_format(str(self.schema))
        if self.native is not None:
            fmt = native_formatter(self.native, "transformers")
            self.call_begin, self.call_end = fmt.call_begin, fmt.call_end

    def _parse(self, text: str) -> ParseResult:
        try:
            kw: dict[str, Any] = {"schema": self.schema, "prefix": self.prefix}
            if self.tools:
                kw["tools"] = self.tools
            out = self.tokenizer.parse_response(text, **kw)
        except (Exception, RecursionError) as e:  # noqa: BLE001 - reported, never propagated
            return whole_text_error(text, f"transformers parse_response failed: {type(e).__name__}: {e}")
        if not isinstance(out, dict):
            return whole_text_error(text, f"transformers parse_response returned {type(out).__name__}, not a message dict")
        calls = []
        for tc in out.get("tool_calls") or []:
            fn = tc.get("function", tc) if isinstance(tc, dict) else {}
            if not isinstance(fn, dict):
                fn = {}
            calls.append((fn.get("name"), fn.get("arguments"), tc.get("id") if isinstance(tc, dict) else None))
        reasoning = out.get("reasoning_content", out.get("thinking", out.get("reasoning")))
        content = out.get("content")
        if not isinstance(content, str):
            content = "" if content is None else str(content)
        native = self.native or guess_format(text)
        return build_result(text, calls, content, reasoning if isinstance(reasoning, str) else None,
                            native, "transformers", self.tools)

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return native_formatter(self.native, "transformers").format_calls(calls)
