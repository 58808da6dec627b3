"""The importer interface and the registry of formats by name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.importers.common import Conversation

_REGISTRY: dict[str, Importer] = {}


@dataclass
class ImportContext:
    """What an importer may need besides the record: the tokenizer bundle (loaded lazily, only
    when a record needs rendering or decoding), the tool-call parser, and user options."""

    tokenizer: str = "qwen3"
    template: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    _bundle: Any = None
    _parser: Any = None

    @property
    def bundle(self):
        if self._bundle is None:
            from backend.loading.tokenizers import load_tokenizer

            self._bundle = load_tokenizer(self.tokenizer, template=self.template)
        return self._bundle

    @property
    def parser(self):
        if self._parser is None:
            from backend.parsers import get_parser

            bundle = self.bundle
            name = self.options.get("parser") or bundle.parser or "hermes"
            self._parser = get_parser(name, tokenizer=bundle.tokenizer)
        return self._parser


class Importer:
    """One source format. ``convert`` returns conversations (rendered into traces by the caller)
    or finished traces (formats with their own token ids).

    ``sniff(record)`` answers whether a record is of this format: falsy, or a short reason
    (``True`` or a string such as ``"content blocks of type tool_use"``); auto-detection names
    the reason when several formats match one record.

    A ``grouped`` format (spans of one trace spread over many records: OTel, OpenInference,
    Langfuse) is converted per file: :meth:`convert_group` receives every ``(number, record)``
    of the file that sniffed as this format and yields ``(number, Conversation | Trace |
    LoadProblem)``, the number being where the conversation (or problem) is in the file."""

    name: str = ""
    description: str = ""
    label: str = ""  # the name shown to people ("OTel GenAI"); defaults to ``name``
    grouped: bool = False

    def sniff(self, record: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def convert_group(self, records: list[tuple[int, Any]], ctx: ImportContext) -> Iterator[tuple[int, Any]]:
        """Grouped formats: all of a file's records of this format → conversations (see above)."""
        for n, rec in records:  # default: one record at a time
            for item in self.convert(rec, ctx):
                yield n, item

    def whole_file(self, doc: Any) -> bool:
        """True if a whole JSON document is one record of this format (not a list of records)."""
        return False

    def convert(self, record: Any, ctx: ImportContext) -> list[Any]:  # Conversation | Trace
        raise NotImplementedError


def register(cls: type[Importer]) -> type[Importer]:
    inst = cls()
    _REGISTRY[inst.name] = inst
    return cls


def get_importer(name: str) -> Importer:
    imp = _REGISTRY.get(name)
    if imp is None:
        raise ValueError(f"unknown import format {name!r}; known: {', '.join(sorted(_REGISTRY))}, auto")
    return imp


def importers() -> dict[str, Importer]:
    return dict(_REGISTRY)


__all__ = ["Conversation", "ImportContext", "Importer", "get_importer", "importers", "register"]
