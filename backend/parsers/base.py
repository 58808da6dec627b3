"""The parser interface, its result type and the registry of parsers by name.

A parser turns one generated assistant turn (text) into content, reasoning, tool calls and
parse errors. Parsers never raise on any ``str`` input: everything that looks like a tool call
but cannot be read becomes a :class:`~backend.trace.ParseError` with the character span of the
offending text, and the well-formed calls around it are still returned. A call that is read only
after a repair the model did not write (no arguments key, read as ``{}``) is returned with a
``severity="warning"`` ParseError over its span, so the repair is never silent.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from backend.errors import UserError
from backend.parsers.format import ToolCallFormat
from backend.trace import ParseError, ToolCall

# The one table of parsers shipped here: name -> module that defines it (imported on first use,
# as vLLM's tool_parsers/__init__.py does). A new format is one module and one row.
PARSER_MODULES: dict[str, str] = {
    "deepseek_v3": "backend.parsers.deepseek_v3",
    "deepseek_v31": "backend.parsers.deepseek_v3",
    "glm45": "backend.parsers.glm45",
    "granite": "backend.parsers.granite",
    "harmony": "backend.parsers.harmony",
    "hermes": "backend.parsers.hermes",
    "hunyuan": "backend.parsers.hunyuan",
    "kimi_k2": "backend.parsers.kimi_k2",
    "llama3_json": "backend.parsers.llama3_json",
    "minimax_m2": "backend.parsers.minimax_m2",
    "mistral": "backend.parsers.mistral",
    "phi4_mini_json": "backend.parsers.phi4_mini",
    "pythonic": "backend.parsers.pythonic",
    "qwen3_xml": "backend.parsers.qwen3_xml",
    "transformers": "backend.parsers.transformers_adapter",
}
_REGISTRY: dict[str, type[ToolCallParser]] = {}
_ALL_LOADED = False
# Parsers named "<prefix>:<name>" (vLLM's own: "vllm:hermes"), built by a factory the adapter
# module registers, so this module never imports an adapter.
_PREFIXED: dict[str, Callable[..., ToolCallParser]] = {}

# What a chat template that no format recognises is read with.
DEFAULT_FORMAT = "hermes"

P = TypeVar("P", bound="type[ToolCallParser]")


class ParserError(UserError):
    """A parser that cannot be built as asked (unknown name, bad option, missing tokenizer or vLLM)."""


@dataclass
class ParseResult:
    """What a parser read out of one turn of generated text."""

    content: str = ""  # text outside tool calls and reasoning, stripped of surrounding whitespace
    reasoning: str | None = None  # None when the text has no reasoning block at all
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    # Harmony: each message's {"channel", "recipient", "span": [start, end], ...} in order; None elsewhere
    channels: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (spans as ``[start, end]`` lists, or None); ``channels`` only where
        the parser reports them."""
        out: dict[str, Any] = {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [
                {"name": c.name, "arguments": c.arguments, "span": list(c.span) if c.span is not None else None}
                for c in self.tool_calls
            ],
            "errors": [{"message": e.message, "span": list(e.span) if e.span is not None else None, "severity": e.severity}
                       for e in self.errors],
        }
        if self.channels is not None:
            out["channels"] = [dict(c) for c in self.channels]
        return out


class ToolCallParser(abc.ABC):
    """Base class of all tool-call parsers.

    Subclasses implement :meth:`_parse` and :meth:`format_calls`; :meth:`parse` wraps ``_parse`` so
    that no input can make it raise (an unexpected exception becomes one ``ParseError`` that spans
    the whole text and starts with ``"internal parser error"``, which the fuzz tests treat as a bug).
    """

    name: str = ""
    call_format: ToolCallFormat | None = None  # the format this parser reads (None for the adapters)
    call_begin: str = ""  # text that opens a tool call in this format ("" if there is none)
    call_end: str = ""  # text that closes a tool call in this format ("" if there is none)

    def __init__(self, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None) -> None:
        # Native parsers need neither; they accept both so callers can pass them uniformly.
        self.tokenizer = tokenizer
        self.tools = tools

    def parse(self, text: str) -> ParseResult:
        """Parse one turn of generated text. Never raises for any ``str``."""
        if not isinstance(text, str):
            if text is None:
                text = ""
            elif isinstance(text, (bytes, bytearray)):
                text = bytes(text).decode("utf-8", errors="replace")
            else:
                text = str(text)
        try:
            return self._parse(text)
        except (Exception, RecursionError) as e:  # noqa: BLE001 - the contract is "never raises"
            return ParseResult(
                content=text.strip(),
                errors=[ParseError(message=f"internal parser error: {type(e).__name__}: {e}"[:500], span=(0, len(text)), raw=text)],
            )

    @abc.abstractmethod
    def _parse(self, text: str) -> ParseResult:
        """Parse ``text``; may assume it is a ``str``."""

    @abc.abstractmethod
    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        """The exact text a model using this format emits for ``calls``
        (``[{"name": ..., "arguments": {...}}, ...]``; an ``"id"`` is used where the format has one)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def register_parser(name: str) -> Callable[[P], P]:
    """Class decorator: register a parser class under ``name``."""

    def deco(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"a tool-call parser named {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def unregister_parser(name: str) -> None:
    """Remove a registered parser (a plugin or a test that registered one)."""
    _REGISTRY.pop(name, None)


def register_prefix(prefix: str, factory: Callable[..., ToolCallParser]) -> None:
    """Build parsers named ``"<prefix>:<name>"`` with ``factory(name, tokenizer=..., **options)``."""
    _PREFIXED[prefix] = factory


def _load(name: str) -> type[ToolCallParser] | None:
    """The parser class registered as ``name``, importing its module from the table if needed."""
    cls = _REGISTRY.get(name)
    if cls is None and name in PARSER_MODULES:
        import importlib

        importlib.import_module(PARSER_MODULES[name])
        cls = _REGISTRY.get(name)
        if cls is None:  # pragma: no cover - a table row whose module registers another name
            raise ParserError(f"module {PARSER_MODULES[name]} does not define the {name!r} parser")
    return cls


def _load_all() -> None:
    global _ALL_LOADED
    if not _ALL_LOADED:
        for name in PARSER_MODULES:
            _load(name)
        _ALL_LOADED = True


def tool_call_formats() -> dict[str, ToolCallFormat]:
    """Every registered parser's declared format, by parser name (sorted)."""
    _load_all()
    return {n: c.call_format for n, c in sorted(_REGISTRY.items()) if c.call_format is not None}


def native_name(name: str) -> str | None:
    """The native parser that reads what parser ``name`` reads: ``name`` itself, or for
    ``vllm:<vllm name>`` the native format declaring that vLLM name (``vllm:qwen3_coder`` ->
    ``qwen3_xml``, ``vllm:hunyuan_a13b`` -> ``hunyuan``); None when there is none."""
    prefix, sep, rest = name.partition(":")
    if sep and prefix == "vllm":
        return parser_for_vllm(rest) or (rest if _load(rest) is not None else None)
    return name if _load(name) is not None else None


def get_format(name: str) -> ToolCallFormat | None:
    """The declared format of parser ``name`` (``vllm:<name>``: of the native format that reads
    the same text), or None."""
    native = native_name(name)
    cls = _load(native) if native is not None else None
    return cls.call_format if cls is not None else None


def guess_format(text: str | None) -> str | None:
    """The parser whose format's markers appear in ``text`` (a chat template, a response schema
    or a model output), or None. Markers are tried longest first (a generic word such as
    ``ipython`` yields to a tag), ties by parser name."""
    t = text or ""
    markers = sorted(((m, n) for n, f in tool_call_formats().items() for m in f.template_markers if m),
                     key=lambda mn: (-len(mn[0]), mn[1]))
    for marker, name in markers:
        if marker in t:
            return name
    return None


def guess_parser(template_text: str | None) -> str:
    """The parser for a chat template: the format it is recognised as, else :data:`DEFAULT_FORMAT`."""
    return guess_format(template_text) or DEFAULT_FORMAT


def parser_for_vllm(vllm_name: str) -> str | None:
    """Our parser for the format vLLM's tool parser ``vllm_name`` reads, or None."""
    for n, f in tool_call_formats().items():
        if vllm_name in f.vllm_names:
            return n
    return None


def available_parsers() -> list[str]:
    """Registered parser names. ``vllm:<name>`` adapters are not listed (see :func:`vllm_parser_names`)."""
    _load_all()
    return sorted(_REGISTRY)


def get_parser(name: str, tokenizer: Any = None, **options: Any) -> ToolCallParser:
    """A parser by name: a native one (a key of :data:`PARSER_MODULES`: ``"hermes"``,
    ``"qwen3_xml"``, ``"harmony"``, ...), ``"transformers"`` (needs ``tokenizer``) or
    ``"vllm:<vllm parser name>"`` (needs ``tokenizer`` and an importable vLLM). Raises
    :class:`ParserError` for an unknown name."""
    if not isinstance(name, str) or not name:
        raise ParserError(f"parser name must be a non-empty string; available: {', '.join(available_parsers())}")
    prefix, sep, rest = name.partition(":")
    if sep and prefix in _PREFIXED:
        return _PREFIXED[prefix](rest, tokenizer=tokenizer, **options)
    cls = _load(name)
    if cls is None:
        raise ParserError(
            f"unknown tool-call parser {name!r}; available: {', '.join(available_parsers())}, or vllm:<name> to use vLLM's parser"
        )
    return cls(tokenizer=tokenizer, **options)
