"""The token view: one ``<span>`` per token, coloured by mask, rendered on the server.

Built for ``gr.HTML`` and for 32k-token traces: the markup per token is as small as it can be
(a two-letter class and a ``title``), the per-id work (byte decoding, escaping) is cached per
tokenizer, and everything that comes from a trace or a tokenizer goes through
:func:`html.escape`. Nothing the trace contains is ever interpreted as markup.

Classes of a token span: ``p`` prompt, ``g`` generated (mask 1), ``j`` injected (mask 0, tool
output and template text the loop appended), each with a parity digit (``g0``/``g1``) so
neighbouring tokens are told apart, and ``s`` for special/added tokens (``<|im_start|>``,
``<tool_call>``). Whitespace inside tokens is wrapped in ``<i class=w?>`` so a CSS class on the
view (toggled by a checkbox, no round trip) can show it as ``·``/``↵``/``→``.

Colour modes (issue 14): with rollout and/or trainer logprobs (``logprobs=`` of
:func:`render_tokens`; :func:`render_trace` reads them from the trace), each token also carries
its |Δ| bin (``h0``..``h4``) and probability bin (``q0``..``q4``), the view's root carries the
numbers for the info line (float32, base64), and a switch in the toolbar puts ``tv-m-heat`` /
``tv-m-prob`` on the root (client side). Long views (issue 16, above :data:`WINDOW_TOKENS`) are
windowed: the browser builds the spans of the chunks near the visible part from compact
per-token data. The root listens for ``tv-select`` (``detail.index``: a trace position).

Token text: byte-level BPE tokens (GPT-2/Qwen/SmolLM2 style) are mapped back to their bytes;
bytes that do not form complete UTF-8 characters inside one token are shown as ``\\xe2\\x80``
escapes, never as U+FFFD. SentencePiece tokens (``▁word``, ``<0xE2>``) are handled the same
way. Tokenizers of any other kind fall back to ``decode([id])``.
"""

from __future__ import annotations

import base64
import html
import math
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.logprobs import position_logprobs
from backend.trace.model import StepState as S

PROMPT, GENERATED, INJECTED = 0, 1, 2
KIND_NAMES = {PROMPT: "prompt", GENERATED: "generated", INJECTED: "injected"}
_KIND_CLASS = {PROMPT: "p", GENERATED: "g", INJECTED: "j"}

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
        self._frag: dict[int, tuple[str, str, bool]] = {}
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
            from backend.mistral_family import token_bytes

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

    def fragments(self, ids: Sequence[int]) -> list[tuple[str, str, bool]]:
        """``(inner_html, title, special)`` per id, escaped and cached."""
        missing = [t for t in dict.fromkeys(ids) if t not in self._frag]
        if missing:
            made = {t: _fragment(t, i) for t, i in zip(missing, self.infos(missing))}
            with self._lock:
                self._frag.update(made)
        return [self._frag[t] for t in ids]


_DECODERS: "weakref.WeakKeyDictionary[Any, TokenDecoder]" = weakref.WeakKeyDictionary()
_NONE_DECODER = TokenDecoder(None)
_DECODERS_LOCK = threading.Lock()


def decoder_for(tokenizer: Any | None) -> TokenDecoder:
    if tokenizer is None:
        return _NONE_DECODER
    with _DECODERS_LOCK:
        d = _DECODERS.get(tokenizer)
        if d is None:
            d = TokenDecoder(tokenizer)
            _DECODERS[tokenizer] = d
        return d


# ---- markup -------------------------------------------------------------------------------------

# Runs of spaces/tabs become one <i>; the whitespace toggle paints them (one dot per space via a
# background pattern, an arrow over each tab run) without changing the text, so copying works.
_WS_RE = re.compile(r" +|\t+|\n|\r|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _ws_sub(m: re.Match[str]) -> str:
    c = m.group(0)
    first = c[0]
    if first == " ":
        return f"<i class=ws>{c}</i>"
    if first == "\t":
        return f"<i class=wt>{c}</i>"
    if first == "\n":
        return "<i class=wn></i>\n"
    if first == "\r":
        return "<i class=wc>\\r</i>"  # a raw CR would become a line break in HTML
    return f"<i class=wc>\\x{ord(c):02x}</i>"


def _inner(text: str) -> str:
    """Escaped text with whitespace and control characters wrapped for the toggle."""
    return _WS_RE.sub(_ws_sub, html.escape(text, quote=False))


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


def _hex(data: bytes) -> str:
    return "".join("\\x%02x" % b for b in data)


def _fragment(tid: int, info: TokenInfo) -> tuple[str, str, bool]:
    # Titles stay short (they are repeated for every token); the hover bar adds the text and
    # its UTF-8 bytes client side. Incomplete tokens carry their bytes here.
    if info.special:
        title = f"id {tid} special"
        inner = _inner(info.text)
    elif info.raw is not None and not info.complete:
        title = f"id {tid} bytes {_hex(info.raw)}"
        inner = "".join(
            _inner(part.decode("utf-8")) if ok else f"<i class=wc>{_hex(part)}</i>" for ok, part in split_utf8(info.raw)
        )
    else:
        title = f"id {tid}"
        inner = _inner(info.text)
    return inner or "<i class=we></i>", html.escape(title, quote=True), info.special


# Tokens per chunk of the token body (at least; a chunk ends only at a line end).
CHUNK_TOKENS = 256


@dataclass
class StepMark:
    """A loop step's token range, for anchors and the step bar."""

    index: int
    start: int
    end: int
    state: str
    label: str = ""


@dataclass
class TokenCounts:
    total: int = 0
    by_kind: dict[int, int] = field(default_factory=dict)
    special: int = 0

    def summary(self) -> str:
        parts = [f"{self.total} tokens"]
        for k in (PROMPT, GENERATED, INJECTED):
            if self.by_kind.get(k):
                parts.append(f"{KIND_NAMES[k]} {self.by_kind[k]}")
        parts.append(f"special {self.special}")
        return " · ".join(parts)


def count_tokens(kinds: Sequence[int], fragments: Sequence[tuple[str, str, bool]]) -> TokenCounts:
    c = TokenCounts(total=len(kinds))
    for k in (PROMPT, GENERATED, INJECTED):
        n = sum(1 for x in kinds if x == k)
        if n:
            c.by_kind[k] = n
    c.special = sum(1 for f in fragments if f[2])
    return c


# What the legend says of each kind: prompt tokens are outside response_mask (the trainer's
# input), generated ones are mask 1, injected ones (tool output, template text) mask 0.
KEY_LABELS = {PROMPT: ("prompt", "input, outside response_mask"), GENERATED: ("generated", "mask 1"),
              INJECTED: ("injected", "mask 0")}


def _legend(counts: TokenCounts) -> str:
    items = []
    for k in (PROMPT, GENERATED, INJECTED):
        n = counts.by_kind.get(k, 0)
        name, what = KEY_LABELS[k]
        small = f" <small>({what})</small>" if k != PROMPT else ""
        items.append(
            f'<span class="tv-key {_KIND_CLASS[k]}0" data-kind="{name}" title="{name}: {what}">{name}{small} '
            f'<b data-count="{name}">{n}</b></span>'
        )
    items.append(f'<span class="tv-key sp" title="special / added tokens (framed)">special <b data-count="special">{counts.special}</b></span>')
    items.append(f'<span class="tv-key">total <b data-count="total">{counts.total}</b></span>')
    return "".join(items)


# ---- colour modes (logprobs) -------------------------------------------------------------------

# |Δ| = |trainer − rollout| per token, binned h0..h4; the last bin starts at ln 2, where the
# importance ratio exp(Δ) leaves [1/2, 2] (the default truncation cap of backend.logprobs).
HEAT_EDGES = (0.01, 0.05, 0.2, math.log(2.0))
HEAT_LABELS = ("< 0.01", "< 0.05", "< 0.2", "< ln 2 (ratio in [½, 2])", "≥ ln 2 (ratio outside [½, 2])")
# probability exp(logprob) of the token (the rollout's; the trainer's where the rollout has none),
# binned q0 (likely) .. q4 (unlikely): the same warm scale, hot = worth a look
PROB_EDGES = (0.9, 0.5, 0.2, 0.05)
PROB_LABELS = ("p ≥ 0.9", "≥ 0.5", "≥ 0.2", "≥ 0.05", "< 0.05")


@dataclass
class LogprobData:
    """What the view needs of a sequence's logprobs: per-token bin codes, and the numbers for
    the info line as two little-endian float32 arrays (base64) over ``[lo, hi)``: ``r`` the
    rollout logprob, ``x`` Δ where both exist, the trainer logprob where only it does (NaN where
    absent). The info line rebuilds the trainer logprob as r + Δ: Δ keeps its own precision."""

    heat: Any  # numpy uint8 per token: 0 no |Δ|, else heat bin + 1
    prob: Any  # numpy uint8 per token: 0 no probability, else probability bin + 1
    lo: int
    hi: int
    r: str
    x: str
    rollout: int  # tokens with a rollout logprob
    trainer: int
    pairs: int

    def classes(self) -> list[str]:
        """`` h2 q3`` (leading space) or ``""`` per token."""
        table = [(f" h{h - 1}" if h else "") + (f" q{q - 1}" if q else "") for h in range(6) for q in range(6)]
        return [table[c] for c in (self.heat.astype("int64") * 6 + self.prob).tolist()]


def logprob_data(rollout: Sequence[float | None], trainer: Sequence[float | None], n: int) -> LogprobData | None:
    """None when no token has a (finite) logprob: the view then has no colour modes."""
    import numpy as np

    if len(rollout) != n or len(trainer) != n:
        raise ValueError(f"{n} token ids but {len(rollout)} rollout and {len(trainer)} trainer logprobs")
    nan = float("nan")
    with np.errstate(all="ignore"):
        ro = np.fromiter((nan if v is None else v for v in rollout), dtype=np.float64, count=n)
        tr = np.fromiter((nan if v is None else v for v in trainer), dtype=np.float64, count=n)
        has_r, has_t = np.isfinite(ro), np.isfinite(tr)
        ro[~has_r] = nan
        tr[~has_t] = nan
        anyv = has_r | has_t
        if not anyv.any():
            return None
        both = has_r & has_t
        where = np.flatnonzero(anyv)
        lo, hi = int(where[0]), int(where[-1]) + 1
        d = tr - ro
        heat = np.where(both, np.searchsorted(np.array(HEAT_EDGES), np.abs(d), side="right") + 1, 0).astype(np.uint8)
        p = np.exp(np.minimum(np.where(has_r, ro, tr), 0.0))
        # probability bins count down from likely: bin b holds PROB_EDGES[b] <= p (< the edge before)
        qb = np.searchsorted(-np.array(PROB_EDGES), -p, side="left")
        prob = np.where(anyv, qb + 1, 0).astype(np.uint8)
        r32 = ro[lo:hi].astype("<f4")
        x32 = np.where(both, d, np.where(has_t, tr, nan))[lo:hi].astype("<f4")
    enc = lambda a: base64.b64encode(a.tobytes()).decode("ascii")  # noqa: E731
    return LogprobData(heat, prob, lo, hi, enc(r32), enc(x32), int(has_r.sum()), int(has_t.sum()), int(both.sum()))


def _mode_bar(lp: LogprobData) -> str:
    """The colour mode switch and the legends of the two logprob modes (each shown in its mode)."""
    opts = '<option value="mask" selected>mask</option><option value="prob">probability</option>'
    if lp.pairs:
        opts += '<option value="heat">|Δ| heat</option>'
    src = "rollout" if lp.rollout else "trainer"
    if lp.rollout and lp.trainer > lp.pairs:
        src = "rollout; trainer where no rollout"
    sw = lambda k, b, text: f'<span class="tv-sw {k}{b}">{text}</span>'  # noqa: E731
    prob = "".join(sw("q", b, html.escape(t, quote=False)) for b, t in enumerate(PROB_LABELS))
    heat = "".join(sw("h", b, html.escape(t, quote=False)) for b, t in enumerate(HEAT_LABELS))
    m0 = '<span class="tv-sw tv-sw-m0">mask 0</span><span class="tv-sw tv-sw-none">no value</span>'
    return (
        f'<label class="tv-mode-label" title="colour the tokens by their mask, probability or trainer−rollout |Δ|">colour '
        f'<select class="tv-mode" aria-label="token colour">{opts}</select></label>'
        f'<div class="tv-lg tv-lg-prob" data-legend="prob"><b>probability</b> <small>({src})</small> {prob}{m0}</div>'
        f'<div class="tv-lg tv-lg-heat" data-legend="heat"><b>|Δ| = |trainer − rollout|</b> {heat}{m0}</div>'
    )


# The info line before anything is selected: also the view's one line of help.
INFO_HELP = "hover or click a token for its index, id, bytes, mask, step (and logprobs) · keys in the token box: ← → token, [ ] step, Esc clear"


def render_tokens(
    ids: Sequence[int],
    kinds: Sequence[int],
    tokenizer: Any | None,
    *,
    steps: Sequence[StepMark] = (),
    prefix: str = "tv",
    title: str = "",
    note: str = "",
    show_whitespace: bool = False,
    selected_step: int | None = None,
    first_index: int = 0,
    step_index: int | None = None,
    logprobs: tuple[Sequence[float | None], Sequence[float | None]] | None = None,
    window: bool | None = None,
    channels: Sequence[tuple[int, str]] = (),
) -> str:
    """The whole view: toolbar (counts, whitespace toggle, step jumps), then the tokens.

    ``kinds`` gives PROMPT/GENERATED/INJECTED per token. ``prefix`` keeps element ids unique
    when several views share a page; step anchors are ``{prefix}-step-{index}``.
    ``selected_step`` is highlighted (its anchor, chip and tokens); ``first_index`` is the
    position of ``ids[0]`` in its trace and ``step_index`` the step all of them belong to, for a
    view of one step's tokens (the info line then gives trace positions and that step).
    ``logprobs``: ``(rollout, trainer)`` per token (None where absent), as
    :func:`backend.logprobs.position_logprobs` gives them; with any value the view gets its
    colour modes (probability, and |Δ| heat where both exist), switched client side.
    ``window``: send compact per-token data and let the browser build the token spans of the
    chunks near the visible part only (:func:`_windowed_body`); by default above
    :data:`WINDOW_TOKENS` tokens.
    """
    if len(kinds) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(kinds)} mask entries")
    prefix = re.sub(r"[^A-Za-z0-9_-]", "", prefix) or "tv"
    dec = decoder_for(tokenizer)
    frags = dec.fragments(ids)
    counts = count_tokens(kinds, frags)
    lp = logprob_data(logprobs[0], logprobs[1], len(ids)) if logprobs is not None else None
    windowed = len(ids) > WINDOW_TOKENS if window is None else bool(window)
    lpc = lp.classes() if lp is not None and not windowed else None

    # step starts → anchor markup, inserted before the step's first token
    marks: dict[int, list[str]] = {}
    for s in steps:
        if s.end < s.start:
            continue
        label = html.escape(s.label or f"{s.index} {s.state}", quote=False)
        sel = " sel" if selected_step == s.index else ""
        marks.setdefault(min(s.start, len(ids)), []).append(
            f'<a class="tv-mark{sel}" id="{prefix}-step-{s.index}" data-step="{s.index}" '
            f'data-start="{s.start}" data-end="{s.end}" title="step {s.index}: tokens {s.start}–{s.end}">{label}</a>'
        )

    # Harmony channels (gpt-oss): a label before each message's <|channel|> token
    for pos, label in channels:
        if 0 <= pos <= len(ids):
            name = label.split("→", 1)[0]
            marks.setdefault(pos, []).append(
                f'<a class="tv-ch" data-start="{pos}" data-channel="{html.escape(name, quote=True)}" '
                f'title="Harmony channel {html.escape(label, quote=True)}">{html.escape(label, quote=False)}</a>')

    if windowed:
        body_attrs, out = _windowed_body(ids, kinds, frags, marks, lp, dec)
    else:
        body_attrs, out = "", _full_body(frags, kinds, marks, lpc)

    jump = ""
    if steps:
        chips = "".join(
            f'<button type="button" class="tv-jump{" sel" if selected_step == s.index else ""}" '
            f'data-jump="{prefix}-step-{s.index}" data-step="{s.index}" '
            f'aria-pressed="{"true" if selected_step == s.index else "false"}" title="step {s.index}: tokens {s.start}–{s.end}">'
            f"{html.escape(s.label or f'{s.index} {s.state}', quote=False)} <small>{s.end - s.start}</small></button>"
            for s in steps
        )
        jump = f'<div class="tv-steps" role="group" aria-label="steps">{chips}</div>'
    head = f'<div class="tv-title">{html.escape(title, quote=False)}</div>' if title else ""
    note_html = f'<div class="tv-note">{html.escape(note, quote=False)}</div>' if note else ""
    ws_cls = (" tv-ws" if show_whitespace else "") + (" tv-win" if windowed else "")
    checked = " checked" if show_whitespace else ""
    attrs = f' data-tokens="{len(ids)}"'
    if first_index:
        attrs += f' data-first="{int(first_index)}"'
    if step_index is not None:
        attrs += f' data-step="{int(step_index)}"'
    if selected_step is not None and any(s.index == selected_step for s in steps):
        attrs += f' data-sel="{int(selected_step)}"'
    modes = ""
    if lp is not None:
        attrs += f' data-lp-lo="{lp.lo}" data-lp-hi="{lp.hi}" data-lp-r="{lp.r}" data-lp-x="{lp.x}"'
        modes = _mode_bar(lp)
    return (
        f'<div class="tv{ws_cls}" id="{prefix}"{attrs}>'
        f"{head}"
        f'<div class="tv-bar">{_legend(counts)}'
        f'<label class="tv-ws-label"><input type="checkbox" class="tv-ws-toggle"{checked}> show whitespace</label>{modes}</div>'
        f"{note_html}{jump}"
        f'<div class="tv-info" aria-live="polite">{INFO_HELP}</div>'
        f'<div class="tv-body"{body_attrs}>{"".join(out)}</div></div>'
    )


def _full_body(frags, kinds, marks: dict[int, list[str]], lpc: list[str] | None) -> list[str]:
    """Every token's span, server side."""
    # Tokens go in chunks (<div class=tv-c data-i=FIRST>) of about CHUNK_TOKENS, each ending
    # after a token that ends a line, so the chunks stack exactly as the unbroken text would
    # flow. The CSS gives chunks content-visibility: auto: the browser lays out and paints only
    # the chunks near the visible part of the scroll box (32k tokens paint ~3x faster).
    out: list[str] = ['<div class="tv-c" data-i="0">']
    append = out.append
    cls = {(k, p): f"{_KIND_CLASS.get(k, 'p')}{p}" for k in (PROMPT, GENERATED, INJECTED) for p in (0, 1)}
    n = len(frags)
    next_cut = CHUNK_TOKENS
    for i, (frag, k) in enumerate(zip(frags, kinds)):
        m = marks.get(i)
        if m:
            append("".join(m))
        extra = lpc[i] if lpc is not None else ""
        if frag[2]:
            append(f'<span class="{cls[(k, i & 1)]}{extra} s" title="{frag[1]}">{frag[0]}</span>')
        elif extra:
            append(f'<span class="{cls[(k, i & 1)]}{extra}" title="{frag[1]}">{frag[0]}</span>')
        else:
            append(f'<span class={cls[(k, i & 1)]} title="{frag[1]}">{frag[0]}</span>')
        if i + 1 >= next_cut and frag[0].endswith("\n") and i + 1 < n:
            append(f'</div><div class="tv-c" data-i="{i + 1}">')
            next_cut = i + 1 + CHUNK_TOKENS
    tail = marks.get(n)
    if tail:
        append("".join(tail))
    append("</div>")
    return out


# Above this many tokens the view is windowed: the server sends each distinct token's markup
# once (a <template>), the sequence as indexes into it and one byte per token (kind, |Δ| bin,
# probability bin), all base64; the browser builds the spans of a chunk when it comes near the
# visible part of the token box (or when a step, a key or tv-select needs it).
WINDOW_TOKENS = 32768
_COLS = 120  # characters per row of the token box, for the estimated height of an unbuilt chunk
_ROW_PX = 20.2  # 13 px × line-height 1.55


def _chunk_starts(frags, n: int) -> list[int]:
    starts = [0]
    next_cut = CHUNK_TOKENS
    for i in range(CHUNK_TOKENS - 1, n - 1):
        if i + 1 >= next_cut and frags[i][0].endswith("\n"):
            starts.append(i + 1)
            next_cut = i + 1 + CHUNK_TOKENS
    return starts


def _windowed_body(ids, kinds, frags, marks: dict[int, list[str]], lp: LogprobData | None, dec: TokenDecoder):
    """(attributes of .tv-body, its inner markup) of a windowed view: one empty chunk per
    line-aligned chunk, with its step anchors and an estimated height; the tokens as data."""
    import numpy as np

    n = len(ids)
    vocab: dict[int, int] = {}
    seq = np.fromiter((vocab.setdefault(t, len(vocab)) for t in ids), dtype=np.uint32, count=n)
    uniq = list(vocab)
    tmpl = []
    for t, f in zip(uniq, dec.fragments(uniq)):
        tmpl.append(f'<span class=s title="{f[1]}">{f[0]}</span>' if f[2] else f'<span title="{f[1]}">{f[0]}</span>')
    wide = len(uniq) > 0xFFFF
    seq_b = seq.astype("<u4" if wide else "<u2").tobytes()
    meta = np.fromiter(kinds, dtype=np.uint8, count=n) & 3
    if lp is not None:
        meta |= (lp.heat << 2) | (lp.prob << 5)
    starts = _chunk_starts(frags, n)
    texts = [i.text for i in dec.infos(ids)]
    out = []
    for c, a in enumerate(starts):
        b = starts[c + 1] if c + 1 < len(starts) else n
        rows = sum(max(1, -(-len(line) // _COLS)) for line in "".join(texts[a:b]).split("\n"))
        anchors = "".join("".join(marks[i]) for i in range(a, b) if i in marks)
        if b == n and n in marks:
            anchors += "".join(marks[n])
        out.append(f'<div class="tv-c tv-u" data-i="{a}" style="height:{round(rows * _ROW_PX)}px">{anchors}</div>')
    if not starts or not n:
        out = ['<div class="tv-c" data-i="0">' + "".join(marks.get(0, [])) + "</div>"]
    enc = lambda x: base64.b64encode(x).decode("ascii")  # noqa: E731
    attrs = (f' data-seq="{enc(seq_b)}" data-seq-bytes="{4 if wide else 2}" data-meta="{enc(meta.tobytes())}"')
    return attrs, ['<template class="tv-vocab">', *tmpl, "</template>", *out]


def empty_view(message: str) -> str:
    return f'<div class="tv tv-empty">{html.escape(message, quote=False)}</div>'


# ---- from a trace ------------------------------------------------------------------------------

_STATE_SHORT = {S.PENDING: "prompt", S.GENERATING: "gen", S.PROCESSING_TOOLS: "tools", S.TERMINATED: "end"}


def trace_kinds(trace: Any) -> list[int]:
    return [PROMPT] * len(trace.prompt_ids) + [GENERATED if m == 1 else INJECTED for m in trace.response_mask]


def trace_steps(trace: Any) -> list[StepMark]:
    marks = []
    for s in trace.steps:
        if s.end <= s.start and s.state != S.TERMINATED:
            continue
        if s.state == S.TERMINATED:
            continue
        marks.append(StepMark(s.index, s.start, s.end, s.state, f"{s.index} {_STATE_SHORT.get(s.state, s.state)}"))
    return marks


def channel_marks(trace: Any, tokenizer: Any | None, steps: Sequence[Any] | None = None) -> list[tuple[int, str]]:
    """``(position, label)`` of each Harmony message a generated step holds (``info.channels``):
    the position of its ``<|channel|>`` token in the trace, the label ``analysis``,
    ``commentary→functions.get_weather``, ``final``. Empty for other formats."""
    if tokenizer is None:
        return []
    try:
        ch = tokenizer.convert_tokens_to_ids("<|channel|>")
    except Exception:  # noqa: BLE001 - a tokenizer without it: no channels
        return []
    if not isinstance(ch, int) or ch == getattr(tokenizer, "unk_token_id", None):
        return []
    ids = trace.prompt_ids + trace.response_ids
    out: list[tuple[int, str]] = []
    for s in steps if steps is not None else trace.steps:
        chans = getattr(s.info, "channels", None)
        if not chans:
            continue
        positions = [i for i in range(s.start, min(s.end, len(ids))) if ids[i] == ch]
        for pos, c in zip(positions, chans):
            to = c.get("recipient")
            out.append((pos, f"{c.get('channel') or '?'}→{to}" if to else str(c.get("channel") or "?")))
    return out


def render_trace(
    trace: Any, tokenizer: Any | None, *, prefix: str = "tv", note: str = "", show_whitespace: bool = False,
    selected_step: int | None = None,
) -> str:
    """The trace's tokens, with its step marks (and Harmony's channels); with rollout and/or
    trainer logprobs (recorded, imported or scored), the colour modes too."""
    ids = trace.prompt_ids + trace.response_ids
    rollout, trainer = position_logprobs(trace)
    has_lp = any(v is not None for v in rollout) or any(v is not None for v in trainer)
    return render_tokens(
        ids, trace_kinds(trace), tokenizer, steps=trace_steps(trace), prefix=prefix, note=note,
        show_whitespace=show_whitespace, selected_step=selected_step, logprobs=(rollout, trainer) if has_lp else None,
        channels=channel_marks(trace, tokenizer),
    )


def step_logprobs(trace: Any, step: Any) -> tuple[list[float | None], list[float | None]] | None:
    """``(rollout, trainer)`` of one step's tokens (for a view of that step), or None when the
    step has none: what :func:`render_tokens` takes as ``logprobs``."""
    rollout, trainer = position_logprobs(trace)
    a, b = step.start, step.end
    ro, tr = rollout[a:b], trainer[a:b]
    return (ro, tr) if any(v is not None for v in ro) or any(v is not None for v in tr) else None


# ---- rendered template text with special tokens marked -----------------------------------------


def mark_special_text(text: str, tokenizer: Any | None, *, extra: Sequence[str] = ()) -> str:
    """Escaped ``<pre>`` of template text with each special/added token string marked."""
    specials = list(decoder_for(tokenizer).special_strings()) if tokenizer is not None else []
    specials += [s for s in extra if s and s not in specials]
    if not specials:
        return f'<pre class="tv-text">{html.escape(text, quote=False)}</pre>'
    pat = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    out: list[str] = []
    pos = 0
    for m in pat.finditer(text):
        out.append(html.escape(text[pos : m.start()], quote=False))
        out.append(f'<mark class="tv-sp">{html.escape(m.group(0), quote=False)}</mark>')
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return f'<pre class="tv-text">{"".join(out)}</pre>'


# ---- styling and behaviour for gr.HTML ---------------------------------------------------------

# The colour modes' scale (background, text), the same for |Δ| (h0..h4) and probability (q0..q4,
# likely to unlikely): pairs of the theme's colours that hold >= 4.5:1 in light and dark
# (tests/test_browser_token_view.py measures them); bin 3 mixes two of them.
BIN_COLOURS = (
    ("var(--ali-g0)", "var(--ali-g-fg)"),
    ("var(--ali-hl-bg)", "var(--ali-hl-fg)"),
    ("var(--ali-j0)", "var(--ali-j-fg)"),
    ("color-mix(in srgb, var(--ali-j1), var(--ali-mark-sel-bg))", "var(--ali-tv-fg)"),
    ("var(--ali-step-sel)", "var(--ali-chip-sel-fg)"),
)


def _mode_css() -> str:
    """Rules of the colour modes: the view's root carries ``tv-m-prob`` or ``tv-m-heat`` (the
    mode switch sets it, client side). Tokens without the mode's value are plain (subdued text,
    alternating neutral shades); mask-0 tokens are italic with a dotted underline in every
    colour mode, so they stay told apart from the policy's tokens."""
    modes = {"prob": "q", "heat": "h"}
    tok = lambda m: f".tv-m-{m} .tv-c > span"  # noqa: E731
    rules = [
        ".tv-mode-label { font-size: 12px; cursor: pointer; color: var(--ali-fg); }",
        ".tv-mode { font: inherit; font-size: 12px; padding: 0 4px; border-radius: 6px; border: 1px solid var(--ali-chip-border); "
        "background: var(--ali-chip-bg); color: var(--ali-chip-fg); }",
        ".tv-lg { display: none; flex-basis: 100%; flex-wrap: wrap; gap: 4px; align-items: center; font-size: 12px; color: var(--ali-fg); }",
        ".tv-lg small { color: var(--ali-subdued); }",
        ".tv-m-prob .tv-lg-prob, .tv-m-heat .tv-lg-heat { display: flex; }",
        ".tv-sw { padding: 0 6px; border-radius: 4px; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }",
        ", ".join([tok(m) for m in modes] + [".tv-sw-none", ".tv-sw-m0"])
        + " { background: var(--ali-tv-bg); color: var(--ali-subdued); }",
        ", ".join(f"{tok(m)}:is(.p1, .g1, .j1)" for m in modes) + " { background: var(--ali-p0); }",
        ".tv-sw-none, .tv-sw-m0 { border: 1px solid var(--ali-chip-border); }",
    ]
    for b, (bg, fg) in enumerate(BIN_COLOURS):
        sel = [f".tv-sw.{k}{b}" for k in modes.values()] + [f"{tok(m)}.{k}{b}" for m, k in modes.items()]
        rules.append(", ".join(sel) + f" {{ background: {bg}; color: {fg}; }}")
    rules.append(", ".join(f"{tok(m)}:is(.j0, .j1)" for m in modes) + ", .tv-sw-m0"
                 " { font-style: italic; text-decoration: underline dotted 1.5px; text-underline-offset: 3px; }")
    rules.append(", ".join(f"{tok(m)}.tv-in-sel" for m in modes) + " { text-decoration: underline 2px var(--ali-tok-sel); }")
    return "\n".join(rules) + "\n"


# css_template of gr.HTML is scoped to the component; no "${" or "{{" may appear (it is a template).
# Colours come from the --ali-* variables of ui/theme.py (light and dark); every state sets its
# text AND its background. Gradio gives every element inside gr.HTML the theme's text colour
# (".prose *"), so children inherit ours explicitly.
CSS = """
.tv { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; line-height: 1.55; color: var(--ali-fg); }
.tv * { color: inherit; }
.tv-empty { color: var(--ali-subdued); padding: 8px; font-family: inherit; }
.tv-title { font-weight: 600; margin-bottom: 4px; font-family: var(--font); }
.tv-bar { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-bottom: 6px; font-family: var(--font); }
.tv-key { padding: 1px 8px; border-radius: 10px; font-size: 12px; border: 1px solid var(--ali-chip-border); background: var(--ali-chip-bg); color: var(--ali-chip-fg); }
.tv-key.p0 { background: var(--ali-p0); color: var(--ali-p-fg); }
.tv-key.g0 { background: var(--ali-g0); color: var(--ali-g-fg); }
.tv-key.j0 { background: var(--ali-j0); color: var(--ali-j-fg); }
.tv-key.sp { border: 2px solid var(--ali-sp-frame); color: var(--ali-sp-fg); background: var(--ali-tv-bg); font-weight: 600; }
.tv-ws-label { margin-left: auto; font-size: 12px; cursor: pointer; user-select: none; color: var(--ali-fg); }
.tv-note { font-size: 12px; color: var(--ali-warn-fg); background: var(--ali-warn-bg); padding: 2px 8px; border-radius: 6px; margin-bottom: 4px; font-family: var(--font); }
.tv-steps { display: flex; flex-wrap: wrap; gap: 4px; margin-bottom: 6px; }
.tv-jump { font-size: 11px; padding: 1px 6px; border-radius: 6px; border: 1px solid var(--ali-chip-border); background: var(--ali-chip-bg); cursor: pointer; color: var(--ali-chip-fg); font-family: inherit; }
.tv-jump:hover { border-color: var(--ali-chip-fg); }
.tv-jump.sel { background: var(--ali-chip-sel-bg); color: var(--ali-chip-sel-fg); border-color: var(--ali-chip-sel-bg); font-weight: 600; }
.tv-info { font-size: 12px; min-height: 18px; color: var(--ali-fg); margin-bottom: 4px; white-space: pre; overflow: hidden; text-overflow: ellipsis; }
.tv-body { white-space: pre-wrap; word-break: break-all; max-height: 560px; overflow: auto; padding: 6px; border: 1px solid var(--border-color-primary); border-radius: 6px; background: var(--ali-tv-bg); color: var(--ali-tv-fg); }
.tv-body:focus-visible { outline: 2px solid var(--ali-tok-sel); outline-offset: 1px; }
.tv-c { content-visibility: auto; contain-intrinsic-block-size: auto 240px; }
.tv-c > span { border-radius: 2px; cursor: pointer; }
.tv-c > span:hover { outline: 2px solid var(--ali-tok-sel); }
.p0 { background: var(--ali-p0); color: var(--ali-p-fg); } .p1 { background: var(--ali-p1); color: var(--ali-p-fg); }
.g0 { background: var(--ali-g0); color: var(--ali-g-fg); } .g1 { background: var(--ali-g1); color: var(--ali-g-fg); }
.j0 { background: var(--ali-j0); color: var(--ali-j-fg); } .j1 { background: var(--ali-j1); color: var(--ali-j-fg); }
.tv-c > span.s { box-shadow: inset 0 0 0 2px var(--ali-sp-frame); color: var(--ali-sp-fg); font-weight: 600; }
.tv-c > span.tv-in-sel { text-decoration: underline 2px var(--ali-step-sel); text-underline-offset: 2px; }
.tv-c > span.tv-tok-sel { outline: 2px solid var(--ali-tok-sel); outline-offset: 1px; position: relative; z-index: 1; }
.tv-mark { display: inline-block; font-size: 10px; line-height: 1.2; padding: 0 4px; margin: 0 2px; border-radius: 4px; background: var(--ali-mark-bg); color: var(--ali-mark-fg) !important; text-decoration: none; vertical-align: middle; white-space: nowrap; scroll-margin-top: 30px; font-weight: 600; }
.tv-mark.sel { background: var(--ali-mark-sel-bg); }
.tv-ch { display: inline-block; font-size: 10px; line-height: 1.2; padding: 0 4px; margin: 0 2px; border-radius: 8px; background: var(--ali-mark-bg); color: var(--ali-mark-fg) !important; font-style: italic; vertical-align: middle; white-space: nowrap; text-decoration: none; }
.tv-body .wc { color: var(--ali-ctl); font-style: normal; }
i.ws, i.wn, i.wt, i.we { font-style: normal; }
.tv-ws i.ws { background: radial-gradient(circle at 50% 55%, var(--ali-ws) 0 1.3px, transparent 1.7px) 0 0 / 1ch 100% repeat-x; }
.tv-ws i.wn::before { content: "↵"; color: var(--ali-ws); }
.tv-ws i.wt { position: relative; }
.tv-ws i.wt::before { content: "→"; position: absolute; left: 0; color: var(--ali-ws); }
.tv-text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; line-height: 1.5; max-height: 420px; overflow: auto; padding: 8px; margin: 0; border: 1px solid var(--border-color-primary); border-radius: 6px; background: var(--ali-tv-bg); color: var(--ali-tv-fg); }
.tv-text * { color: inherit; }
.tv-text .tv-sp { background: var(--ali-tsp-bg); color: var(--ali-tsp-fg); font-weight: 600; border-radius: 3px; padding: 0 1px; }
""" + _mode_css()

# Behaviour shared by every token view on the page and by the events' ``js=`` (select_step_js):
# installed once, as window.__aliTV. Reads only data attributes and text of our own markup.
#   selectStep(tv, step, scroll): the step's anchor, chip and tokens highlighted (scrolled to)
#   selectToken(tv, span): the token outlined, kept in view, described in the info line
#   apply(root): makes token boxes focusable and re-applies the server-rendered selection
#                (data-sel), on load and after a value update
_SHARED_JS = r"""
if (!window.__aliTV) window.__aliTV = (() => {
  const hex = (s) => Array.from(new TextEncoder().encode(s), (b) => b.toString(16).padStart(2, '0')).join(' ');
  const KIND = {p: 'prompt (outside response_mask)', g: 'mask 1 (generated)', j: 'mask 0 (injected)'};
  // Scroll a view's token box so step anchor a is at its top. From rectangles, not offsetTop,
  // and again on the next frames: chunks away from the visible part are laid out lazily
  // (content-visibility), with estimated heights that become real ones as they come into view.
  const scrollToMark = (a, n = 0) => {
    const body = a.closest('.tv-body'); if (!body) return;
    const d = a.getBoundingClientRect().top - body.getBoundingClientRect().top - 8;
    if (Math.abs(d) >= 1) body.scrollTop += d;
    if (n < 4 && body.scrollTop > 0) requestAnimationFrame(() => scrollToMark(a, n + 1));
  };
  const marks = (tv) => tv.__marks || (tv.__marks = Array.from(tv.querySelectorAll('.tv-body .tv-mark')));
  // a token's position in its view: the chunk's first token + the spans before it in the chunk
  const indexOf = (el) => {
    let idx = +(el.parentElement.dataset.i || 0);
    for (let n = el.previousElementSibling; n; n = n.previousElementSibling) { if (n.tagName === 'SPAN') idx++; }
    return idx;
  };
  // A windowed view (.tv-win, long traces) arrives with empty chunks (.tv-u, an estimated height,
  // their step anchors) and the tokens as data: the distinct tokens' markup in a <template>,
  // data-seq (indexes into it, uint16/uint32) and data-meta (a byte per token: kind | (|Δ| bin + 1)
  // << 2 | (probability bin + 1) << 5), base64. A chunk's spans are built when it comes near the
  // visible part of the box (scroll handler: the same frame; an IntersectionObserver for the
  // rest: a tab shown, a resize) or when a step, a key or tv-select needs one of its tokens.
  const bytes = (s) => { const b = atob(s), u = new Uint8Array(b.length);
                         for (let i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
                         return u; };
  const KL = ['p', 'g', 'j'];
  const attr = (s) => s.replace(/&/g, '&amp;').replace(/"/g, '&quot;').replace(/</g, '&lt;');
  const winData = (tv) => {
    if (tv.__win !== undefined) return tv.__win;
    const body = tv.querySelector('.tv-body'), tpl = tv.querySelector('template.tv-vocab');
    if (!body || body.dataset.seq === undefined || !tpl) return (tv.__win = null);
    const sb = bytes(body.dataset.seq);
    const seq = body.dataset.seqBytes === '4' ? new Uint32Array(sb.buffer) : new Uint16Array(sb.buffer);
    const vocab = Array.from(tpl.content.children, (el) => ({h: el.innerHTML, t: attr(el.getAttribute('title') || ''),
                                                             s: el.classList.contains('s')}));
    const chunks = Array.from(body.children).filter((c) => c.classList.contains('tv-c'));
    return (tv.__win = {body, seq, meta: bytes(body.dataset.meta), vocab, chunks});
  };
  const fill = (tv, c) => {
    if (!c || !c.classList.contains('tv-u')) return;
    const W = winData(tv); if (!W) return;
    const start = +c.dataset.i, nx = c.nextElementSibling;
    const end = nx && nx.dataset.i !== undefined ? +nx.dataset.i : W.seq.length;
    const anchors = Array.from(c.children).filter((a) => a.tagName === 'A');
    let ai = 0, buf = '';
    const flush = (before) => { if (buf) { if (before) before.insertAdjacentHTML('beforebegin', buf); else c.insertAdjacentHTML('beforeend', buf); } buf = ''; };
    for (let i = start; i < end; i++) {
      while (ai < anchors.length && +anchors[ai].dataset.start <= i) flush(anchors[ai++]);
      const m = W.meta[i], v = W.vocab[W.seq[i]], h = (m >> 2) & 7, q = m >> 5;
      buf += '<span class="' + KL[m & 3] + (i & 1) + (h ? ' h' + (h - 1) : '') + (q ? ' q' + (q - 1) : '') + (v.s ? ' s' : '')
        + '" title="' + v.t + '">' + v.h + '</span>';
    }
    flush(ai < anchors.length ? anchors[ai] : null);
    c.classList.remove('tv-u');
    // off-screen, a built chunk is sized as estimated (content-visibility: auto skips it)
    const est = c.style.height;
    c.style.height = '';
    if (est) c.style.containIntrinsicBlockSize = 'auto ' + est;
    if (tv.__io) tv.__io.unobserve(c);
    const rg = tv.__range;
    if (rg && rg[0] < end && rg[1] > start) {
      let i = start;
      for (const n of c.children) {
        if (n.tagName !== 'SPAN') continue;
        if (i >= rg[0] && i < rg[1]) { n.classList.add('tv-in-sel'); (tv.__painted = tv.__painted || []).push(n); }
        i++;
      }
    }
  };
  const fillVisible = (tv) => {
    const W = winData(tv); if (!W) return;
    const b = W.body.getBoundingClientRect(); if (!b.height) return;
    const lo = b.top - 600, hi = b.bottom + 600, cs = W.chunks;
    let l = 0, r = cs.length - 1;
    while (l < r) { const m = (l + r) >> 1; if (cs[m].getBoundingClientRect().bottom < lo) l = m + 1; else r = m; }
    for (let k = l; k < cs.length; k++) { if (cs[k].getBoundingClientRect().top > hi) break; fill(tv, cs[k]); }
  };
  const live = new Set();  // windowed views with an observer: disconnected once gone (a re-render replaced them)
  const initWin = (tv) => {
    for (const old of live) { if (!old.isConnected) { if (old.__io) old.__io.disconnect(); live.delete(old); } }
    if (tv.__winInit) return;
    tv.__winInit = true;
    live.add(tv);
    const W = winData(tv); if (!W) return;
    W.body.addEventListener('scroll', () => fillVisible(tv), {passive: true});
    if (window.IntersectionObserver) {
      tv.__io = new IntersectionObserver((es) => { for (const e of es) if (e.isIntersecting) fill(tv, e.target); },
                                        {root: W.body, rootMargin: '600px 0px'});
      W.chunks.forEach((c) => { if (c.classList.contains('tv-u')) tv.__io.observe(c); });
    }
    fillVisible(tv);
  };
  const tokenAt = (tv, idx) => {
    let c = null;
    for (const ch of tv.querySelectorAll('.tv-body > .tv-c')) { if (+ch.dataset.i <= idx) c = ch; else break; }
    if (!c || idx < 0) return null;
    fill(tv, c);
    let i = +c.dataset.i;
    for (const n of c.children) { if (n.tagName !== 'SPAN') continue; if (i === idx) return n; i++; }
    return null;
  };
  const stepOf = (tv, idx) => {
    for (const a of marks(tv)) { if (idx >= +a.dataset.start && idx < +a.dataset.end) return a.dataset.step; }
    return tv.dataset.step === undefined ? null : tv.dataset.step;
  };
  // logprobs (data-lp-*: float32 arrays over [lo, hi), base64): r rollout, x = delta where both
  // exist, the trainer's where only it does; NaN where absent
  const f32 = (s) => new Float32Array(bytes(s).buffer);
  const lpData = (tv) => {
    if (tv.__lp === undefined) { const d = tv.dataset; tv.__lp = d.lpR === undefined ? null : {lo: +d.lpLo, r: f32(d.lpR), x: f32(d.lpX)}; }
    return tv.__lp;
  };
  const num = (x) => (x === 0 || Math.abs(x) >= 0.001 ? x.toFixed(4) : x.toExponential(2));
  const sgn = (x) => (x > 0 ? '+' : '') + num(x);
  const prob = (x) => ' (p ' + Math.exp(x).toPrecision(3) + ')';
  const lpText = (tv, idx) => {
    const L = lpData(tv); if (!L) return '';
    const k = idx - L.lo, r = k >= 0 && k < L.r.length ? L.r[k] : NaN, x = k >= 0 && k < L.x.length ? L.x[k] : NaN;
    if (isNaN(r) && isNaN(x)) return '  no logprob';
    if (isNaN(r)) return '  rollout –  trainer ' + num(x) + prob(x);
    if (isNaN(x)) return '  rollout ' + num(r) + prob(r) + '  trainer –';
    return '  rollout ' + num(r) + prob(r) + '  trainer ' + num(r + x) + prob(r + x) + '  Δ ' + sgn(x) + '  ratio ' + Math.exp(x).toPrecision(5);
  };
  const describe = (tv, el) => {
    const idx = indexOf(el);
    const title = el.getAttribute('title') || '';
    const text = el.textContent;
    const bytes = title.includes(' bytes ') ? '' : '  bytes ' + hex(text);
    const step = stepOf(tv, idx);
    return '#' + (idx + +(tv.dataset.first || 0)) + '  ' + title + '  ' + JSON.stringify(text) + bytes + '  '
      + (KIND[el.className[0]] || '') + (step === null ? '' : '  step ' + step) + lpText(tv, idx);
  };
  // colour modes: a class on the view's root; the choice outlives a re-render of the same view
  const modes = {};
  const setMode = (tv, m, remember = true) => {
    tv.classList.remove('tv-m-prob', 'tv-m-heat');
    if (m === 'prob' || m === 'heat') tv.classList.add('tv-m-' + m);
    if (remember && tv.id) modes[tv.id] = m;
  };
  const info = (tv, el) => {
    const box = tv.querySelector('.tv-info'); if (!box) return;
    if (box.dataset.help === undefined) box.dataset.help = box.textContent;
    box.textContent = el ? describe(tv, el) : box.dataset.help;
  };
  const current = (tv) => (tv.__tok && tv.contains(tv.__tok) ? tv.__tok : null);
  const keepVisible = (el) => {
    const body = el.closest('.tv-body'); if (!body) return;
    const r = el.getBoundingClientRect(), b = body.getBoundingClientRect();
    if (r.top < b.top) body.scrollTop += r.top - b.top - 8;
    else if (r.bottom > b.bottom) body.scrollTop += r.bottom - b.bottom + 8;
  };
  // a token scrolled to the middle of its box, again on the next frames while lazily laid-out
  // chunks above it take their real heights
  const scrollToToken = (el, n = 0) => {
    const body = el.closest('.tv-body'); if (!body) return;
    const r = el.getBoundingClientRect(), b = body.getBoundingClientRect();
    if (r.top < b.top + 8 || r.bottom > b.bottom - 8) body.scrollTop += (r.top + r.bottom) / 2 - (b.top + b.bottom) / 2;
    if (n < 4) requestAnimationFrame(() => scrollToToken(el, n + 1));
  };
  // select the token at trace position `index` (the "tv-select" event), scrolled into view
  const selectIndex = (tv, index) => {
    const el = tokenAt(tv, Math.floor(+index) - +(tv.dataset.first || 0));
    if (!el) return false;
    selectToken(tv, el, false);
    scrollToToken(el);
    return true;
  };
  const selectToken = (tv, el, scroll = true) => {
    const old = current(tv); if (old) old.classList.remove('tv-tok-sel');
    tv.__tok = el || null;
    if (el) { el.classList.add('tv-tok-sel'); if (scroll) keepVisible(el); }
    info(tv, el);
  };
  // the selected step's tokens, underlined; only the chunks that overlap its range are visited
  const paint = (tv, start, end) => {
    (tv.__painted || []).forEach((s) => s.classList.remove('tv-in-sel'));
    tv.__range = [start, end];
    const out = [];
    const chunks = tv.querySelectorAll('.tv-body > .tv-c');
    for (let c = 0; c < chunks.length; c++) {
      const first = +chunks[c].dataset.i, next = c + 1 < chunks.length ? +chunks[c + 1].dataset.i : Infinity;
      if (next <= start || first >= end) continue;
      let i = first;
      for (const n of chunks[c].children) {
        if (n.tagName !== 'SPAN') continue;
        if (i >= start && i < end) { n.classList.add('tv-in-sel'); out.push(n); }
        i++;
      }
    }
    tv.__painted = out;
  };
  const selectStep = (tv, step, scroll) => {
    const key = String(step);
    tv.querySelectorAll('.tv-mark.sel').forEach((m) => m.classList.remove('sel'));
    tv.querySelectorAll('.tv-jump.sel').forEach((b) => { b.classList.remove('sel'); b.setAttribute('aria-pressed', 'false'); });
    const a = marks(tv).find((m) => m.dataset.step === key);
    if (!a) { paint(tv, 0, 0); delete tv.dataset.sel; return null; }
    a.classList.add('sel');
    tv.querySelectorAll('.tv-jump').forEach((b) => { if (b.dataset.step === key) { b.classList.add('sel'); b.setAttribute('aria-pressed', 'true'); } });
    tv.dataset.sel = key;
    paint(tv, +a.dataset.start, +a.dataset.end);
    if (scroll) scrollToMark(a);
    return a;
  };
  const selectById = (id, step, scroll) => {
    const tv = document.getElementById(id);
    return tv && tv.classList.contains('tv') ? selectStep(tv, step, scroll) : null;
  };
  // the token box takes the keyboard focus (its keys are ours: without this script, no keys)
  const apply = (root) => {
    root.querySelectorAll('.tv-body:not([tabindex])').forEach((b) => {
      b.tabIndex = 0;
      b.setAttribute('role', 'group');
      const help = b.parentElement.querySelector('.tv-info');
      b.setAttribute('aria-label', 'tokens' + (help ? ': ' + (help.dataset.help || help.textContent) : ''));
    });
    root.querySelectorAll('.tv.tv-win').forEach(initWin);
    root.querySelectorAll('.tv[data-sel]').forEach((tv) => selectStep(tv, tv.dataset.sel, false));
    root.querySelectorAll('.tv select.tv-mode').forEach((s) => {
      const tv = s.closest('.tv'), m = modes[tv.id];
      if (m && Array.from(s.options).some((o) => o.value === m)) { s.value = m; setMode(tv, m, false); }
    });
  };
  // Steps picked in a view (chip, [ ]) and sent to the server, in order, per view id. The
  // server's answers come back as changes of the selected step: the view shows its own picks
  // already, and an answer to an older pick, landing after a newer one, must not move it back.
  // A change that is no pick of ours (the dropdown, a table row, a new trace) is applied.
  const picks = {};
  const sent = (id, step) => { (picks[id] = picks[id] || []).push(String(step)); };
  const fromServer = (id, step) => {
    const key = String(step), list = picks[id] || [];
    const i = list.indexOf(key);
    if (i < 0) { picks[id] = []; return selectById(id, key, true); }
    picks[id] = list.slice(i + 1);  // our own pick, confirmed (the view shows it already), or an older one
    return null;
  };
  return {hex, indexOf, tokenAt, describe, info, current, selectToken, selectStep, selectById, apply, marks, scrollToMark,
          sent, fromServer, setMode, selectIndex, scrollToToken, lpText, fill, fillVisible};
})();
"""

# js_on_load of gr.HTML: runs once per component; `element` survives value updates, so all
# behaviour is delegated from it. Tokens: hover shows one in the info line; click (or tap)
# selects it; with the token box focused, ← → move the selection, [ ] go to the previous / next
# step, Esc clears. A step chosen here (chip, [ ]) is announced as a DOM event, "ali-step"
# ({view: the view's id, step}), bubbling from the view: the Inspector listens for it and asks
# the server for that step (ui/inspector.py). (Not gr.HTML's trigger('select', data): gradio
# re-runs a deferred event with the first event's data, so quick picks would lose the last one.)
JS = _SHARED_JS + r"""
const TV = window.__aliTV;
const pick = (tv, step) => {
  const a = TV.selectStep(tv, step, true);
  if (!a) return;
  const first = TV.tokenAt(tv, +a.dataset.start);
  if (first) TV.selectToken(tv, first, false);
  TV.sent(tv.id, step);
  tv.dispatchEvent(new CustomEvent('ali-step', {bubbles: true, detail: {view: tv.id, step: +step}}));
};
element.addEventListener('mouseover', (e) => {
  const el = e.target.closest('.tv-c > span');
  if (el && element.contains(el)) TV.info(el.closest('.tv'), el);
});
element.addEventListener('mouseout', (e) => {
  const body = e.target.closest('.tv-body');
  if (!body || !element.contains(body) || body.contains(e.relatedTarget)) return;
  const tv = body.closest('.tv');
  TV.info(tv, TV.current(tv));  // leaving the tokens: back to the selected one (or the help)
});
element.addEventListener('change', (e) => {
  const t = e.target;
  if (t && t.classList && t.classList.contains('tv-ws-toggle')) {
    const tv = t.closest('.tv');
    if (tv) tv.classList.toggle('tv-ws', t.checked);
  } else if (t && t.classList && t.classList.contains('tv-mode')) {
    const tv = t.closest('.tv');
    if (tv) TV.setMode(tv, t.value);
  }
});
// another view (the logprob lens) selects a token: tv.dispatchEvent(new CustomEvent('tv-select',
// {detail: {index}})), index a position in prompt_ids + response_ids. Captured here, so the event
// needs no bubbling; it selects and scrolls, and focuses nothing.
element.addEventListener('tv-select', (e) => {
  const tv = e.target && e.target.closest ? e.target.closest('.tv') : null;
  if (tv && element.contains(tv) && e.detail && e.detail.index !== undefined) TV.selectIndex(tv, e.detail.index);
}, true);
element.addEventListener('click', (e) => {
  const b = e.target.closest('[data-jump]');
  if (b && element.contains(b)) { e.preventDefault(); pick(b.closest('.tv'), b.dataset.step); return; }
  const el = e.target.closest('.tv-c > span');
  if (el && element.contains(el)) {
    TV.selectToken(el.closest('.tv'), el);
    el.closest('.tv-body').focus({preventScroll: true});
  }
});
element.addEventListener('keydown', (e) => {
  const body = e.target.closest ? e.target.closest('.tv-body') : null;
  if (!body || !element.contains(body) || e.ctrlKey || e.metaKey || e.altKey) return;
  const tv = body.closest('.tv');
  if (e.key === 'ArrowRight' || e.key === 'ArrowLeft') {
    const dir = e.key === 'ArrowRight' ? 1 : -1;
    const cur = TV.current(tv);
    const idx = cur ? TV.indexOf(cur) + dir : (dir > 0 ? 0 : +tv.dataset.tokens - 1);
    const el = TV.tokenAt(tv, idx);
    if (el) TV.selectToken(tv, el);
    e.preventDefault();
  } else if (e.key === ']' || e.key === '[') {
    const ms = TV.marks(tv);
    if (!ms.length) return;
    let i = ms.findIndex((a) => a.dataset.step === tv.dataset.sel);
    i = i < 0 ? (e.key === ']' ? 0 : ms.length - 1) : i + (e.key === ']' ? 1 : -1);
    if (i >= 0 && i < ms.length) pick(tv, ms[i].dataset.step);
    e.preventDefault();
  } else if (e.key === 'Escape') {
    TV.selectToken(tv, null);
  }
});
TV.apply(element);
if (typeof watch === 'function') watch('value', () => TV.apply(element));
"""


def select_step_js(prefix: str) -> str:
    """JS for an event's ``js=``: select (highlight, scroll to) in view ``prefix`` the step given
    as the first input."""
    prefix = re.sub(r"[^A-Za-z0-9_-]", "", prefix)
    return (
        "(step, ...rest) => { if (step !== null && step !== undefined && step !== '' && window.__aliTV)"
        f" window.__aliTV.selectById('{prefix}', step, true); return [step, ...rest]; }}"
    )
