"""What a token id looks like as text, per tokenizer: its bytes, whether they are whole UTF-8
characters on their own, whether it is a special/added token. The token view (``ui/token_view.py``)
builds its markup from this; ``bench/bench_token_view.py`` counts split characters with it.

Byte-level BPE tokens (GPT-2/Qwen/SmolLM2 style) are mapped back to their bytes; bytes that do not
form complete UTF-8 characters inside one token are shown as ``\\xe2\\x80`` escapes, never as
U+FFFD. SentencePiece tokens (``▁word``, ``<0xE2>``) are handled the same way, Mistral's tekken
ids through mistral-common (:func:`backend.families.mistral.token_bytes`). Tokenizers of any other
kind fall back to ``decode([id])``. :func:`decoder_for` keeps one :class:`TokenDecoder` (a
thread-safe per-id cache) per tokenizer.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# ---- bytes of a token -------------------------------------------------------------------------


def _byte_level_decoder() -> dict[str, int]:
    """The reversible byte → printable-character table of byte-level BPE (GPT-2 and
    descendants): printable Latin-1 bytes stand for themselves, the other 68 bytes are
    shifted to code points 256.. in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table: dict[str, int] = {}
    shift = 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + shift)] = b
            shift += 1
    return table


_BYTE_LEVEL = _byte_level_decoder()
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def show_bytes(data: bytes) -> str:
    """Text for bytes: valid UTF-8 as characters, anything else as ``\\xNN`` escapes."""
    return data.decode("utf-8", errors="backslashreplace")


def _tokenizer_kind(tokenizer: Any) -> str:
    """"byte_level", "sentencepiece", "tekken" (Mistral's, through mistral-common: the bytes of
    each id) or "decode" (ask the tokenizer per token)."""
    if type(tokenizer).__name__ == "MistralCommonBackend":
        return "tekken"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    dec = getattr(backend, "decoder", None) if backend is not None else None
    desc = repr(dec) if dec is not None else ""
    if "ByteLevel" in desc:
        return "byte_level"
    if "ByteFallback" in desc or "Metaspace" in desc or "▁" in desc:
        return "sentencepiece"
    return "decode"


@dataclass
class TokenInfo:
    text: str  # what to show (valid UTF-8 text, with \\xNN for broken bytes)
    raw: bytes | None  # the token's bytes, when known
    special: bool  # an added/special token (shown as its literal content)
    complete: bool  # its bytes are valid UTF-8 on their own


class TokenDecoder:
    """Per-tokenizer, per-id cache of what a token looks like. Thread-safe."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer
        self.kind = _tokenizer_kind(tokenizer) if tokenizer is not None else "none"
        self._lock = threading.Lock()
        self._info: dict[int, TokenInfo] = {}
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        if callable(added):  # MistralCommonBackend: a method
            try:
                added = added()
            except Exception:  # noqa: BLE001 - no added tokens known
                added = {}
        self.added: dict[int, str] = {int(i): str(getattr(t, "content", t)) for i, t in dict(added).items()}
        try:
            self.special_ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}
        except Exception:  # noqa: BLE001 - a tokenizer without special ids is fine
            self.special_ids = set()
        try:
            self.vocab_size = len(tokenizer) if tokenizer is not None else None
        except TypeError:
            self.vocab_size = None

    def special_strings(self) -> list[str]:
        return sorted(set(self.added.values()), key=len, reverse=True)

    def _compute(self, tid: int, piece: str | None) -> TokenInfo:
        if self.kind == "tekken":
            from backend.families.mistral import token_bytes

            try:
                raw, control = token_bytes(self.tokenizer, tid)
            except Exception:  # noqa: BLE001 - an id outside the vocabulary shows as its number
                return TokenInfo(f"⟨{tid}⟩", None, False, True)
            if control:
                content = raw.decode("utf-8", errors="replace")
                return TokenInfo(content, raw, True, True)
            try:
                return TokenInfo(raw.decode("utf-8"), raw, False, True)
            except UnicodeDecodeError:
                return TokenInfo(show_bytes(raw), raw, False, False)
        if tid in self.added or tid in self.special_ids:
            content = self.added.get(tid) or piece or ""
            return TokenInfo(content, content.encode("utf-8"), True, True)
        if piece is None:
            if self.tokenizer is None or (self.vocab_size is not None and not 0 <= tid < self.vocab_size):
                return TokenInfo(f"⟨{tid}⟩", None, False, True)
            try:
                text = self.tokenizer.decode([tid], skip_special_tokens=False)
            except Exception:  # noqa: BLE001 - unknown ids show as their number
                return TokenInfo(f"⟨{tid}⟩", None, False, True)
            return TokenInfo(text, text.encode("utf-8"), False, "\ufffd" not in text)
        if self.kind == "byte_level" and all(c in _BYTE_LEVEL for c in piece):
            raw = bytes(_BYTE_LEVEL[c] for c in piece)
        elif self.kind == "sentencepiece":
            m = _SP_BYTE.match(piece)
            raw = bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8")
        else:
            try:
                text = self.tokenizer.decode([tid], skip_special_tokens=False)
            except Exception:  # noqa: BLE001
                text = piece
            return TokenInfo(text, text.encode("utf-8"), False, "\ufffd" not in text)
        try:
            return TokenInfo(raw.decode("utf-8"), raw, False, True)
        except UnicodeDecodeError:
            return TokenInfo(show_bytes(raw), raw, False, False)

    def infos(self, ids: Sequence[int]) -> list[TokenInfo]:
        missing = [t for t in dict.fromkeys(ids) if t not in self._info]
        if missing:
            pieces: list[str | None]
            if self.tokenizer is not None and self.kind in ("byte_level", "sentencepiece"):
                ok = [t for t in missing if self.vocab_size is None or 0 <= t < self.vocab_size]
                try:
                    conv = self.tokenizer.convert_ids_to_tokens(ok)
                except Exception:  # noqa: BLE001
                    conv = [None] * len(ok)
                got = dict(zip(ok, conv))
                pieces = [got.get(t) for t in missing]
            else:
                pieces = [None] * len(missing)
            computed = {t: self._compute(t, p) for t, p in zip(missing, pieces)}
            with self._lock:
                self._info.update(computed)
        return [self._info[t] for t in ids]

    def info(self, tid: int) -> TokenInfo:
        return self.infos([tid])[0]


_DECODERS: "weakref.WeakKeyDictionary[Any, TokenDecoder]" = weakref.WeakKeyDictionary()
_NONE_DECODER = TokenDecoder(None)
_DECODERS_LOCK = threading.Lock()


def decoder_for(tokenizer: Any | None) -> TokenDecoder:
    """The tokenizer's :class:`TokenDecoder`, one per tokenizer (held as long as the tokenizer is)."""
    if tokenizer is None:
        return _NONE_DECODER
    with _DECODERS_LOCK:
        d = _DECODERS.get(tokenizer)
        if d is None:
            d = TokenDecoder(tokenizer)
            _DECODERS[tokenizer] = d
        return d


def forget(tokenizer: Any) -> None:
    """Drop the tokenizer's decoder: the next :func:`decoder_for` starts with empty caches (and
    so does what is cached per decoder, the token view's markup). For timing a cold render."""
    with _DECODERS_LOCK:
        _DECODERS.pop(tokenizer, None)


def split_utf8(raw: bytes) -> list[tuple[bool, bytes]]:
    """``raw`` cut into ``(True, valid UTF-8)`` and ``(False, bytes that are not)`` pieces."""
    out: list[tuple[bool, bytes]] = []
    i = 0
    while i < len(raw):
        try:
            raw[i:].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start:
                out.append((True, raw[i : i + e.start]))
            out.append((False, raw[i + e.start : i + e.end]))
            i += e.end
            continue
        out.append((True, raw[i:]))
        break
    return out
