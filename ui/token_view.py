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

Token text (bytes, broken UTF-8 shown as ``\\xe2\\x80`` escapes, never as U+FFFD, special
tokens) comes from :mod:`backend.loading.token_text`, cached per tokenizer; the markup of each id is
cached here, per decoder. The view's CSS and JS are files: ``ui/assets/token_view.css`` and
``ui/assets/token_view.js`` (:data:`CSS`, :data:`JS`, read once at import).
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

from backend.checks.logprobs import position_logprobs
from backend.loading.token_text import TokenDecoder, TokenInfo, decoder_for, split_utf8
from backend.trace.model import StepState as S
from ui import assets

PROMPT, GENERATED, INJECTED = 0, 1, 2
KIND_NAMES = {PROMPT: "prompt", GENERATED: "generated", INJECTED: "injected"}
_KIND_CLASS = {PROMPT: "p", GENERATED: "g", INJECTED: "j"}

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


# The markup of each id (:func:`_fragment`), cached per decoder: it lives as long as the
# tokenizer's decoder does (backend.loading.token_text.decoder_for).
_FRAGMENTS: "weakref.WeakKeyDictionary[TokenDecoder, dict[int, tuple[str, str, bool]]]" = weakref.WeakKeyDictionary()
_FRAGMENTS_LOCK = threading.Lock()


def fragments(dec: TokenDecoder, ids: Sequence[int]) -> list[tuple[str, str, bool]]:
    """``(inner_html, title, special)`` per id, escaped and cached."""
    with _FRAGMENTS_LOCK:
        cache = _FRAGMENTS.get(dec)
        if cache is None:
            cache = _FRAGMENTS[dec] = {}
    missing = [t for t in dict.fromkeys(ids) if t not in cache]
    if missing:
        made = {t: _fragment(t, i) for t, i in zip(missing, dec.infos(missing))}
        with _FRAGMENTS_LOCK:
            cache.update(made)
    return [cache[t] for t in ids]


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
# importance ratio exp(Δ) leaves [1/2, 2] (the default truncation cap of backend.checks.logprobs).
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
    inserted: Sequence[tuple[int, int, str]] = (),
) -> str:
    """The whole view: toolbar (counts, whitespace toggle, step jumps), then the tokens.

    ``kinds`` gives PROMPT/GENERATED/INJECTED per token. ``prefix`` keeps element ids unique
    when several views share a page; step anchors are ``{prefix}-step-{index}``.
    ``selected_step`` is highlighted (its anchor, chip and tokens); ``first_index`` is the
    position of ``ids[0]`` in its trace and ``step_index`` the step all of them belong to, for a
    view of one step's tokens (the info line then gives trace positions and that step).
    ``logprobs``: ``(rollout, trainer)`` per token (None where absent), as
    :func:`backend.checks.logprobs.position_logprobs` gives them; with any value the view gets its
    colour modes (probability, and |Δ| heat where both exist), switched client side.
    ``window``: send compact per-token data and let the browser build the token spans of the
    chunks near the visible part only (:func:`_windowed_body`); by default above
    :data:`WINDOW_TOKENS` tokens.
    """
    if len(kinds) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(kinds)} mask entries")
    prefix = re.sub(r"[^A-Za-z0-9_-]", "", prefix) or "tv"
    dec = decoder_for(tokenizer)
    frags = fragments(dec, ids)
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

    # continuous tokens: the tokens a tool turn's junction edit inserted (mask 0, not generated)
    for start, end, why in inserted:
        if 0 <= start <= len(ids):
            marks.setdefault(start, []).append(
                f'<a class="tv-ins" data-start="{int(start)}" data-end="{int(end)}" '
                f'title="{html.escape(f"inserted at the turn boundary ({end - start} token(s), mask 0): {why}", quote=True)}">+ins</a>')

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
    for t, f in zip(uniq, fragments(dec, uniq)):
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
        channels=channel_marks(trace, tokenizer), inserted=inserted_marks(trace),
    )


def inserted_marks(trace: Any, steps: Sequence[Any] | None = None) -> list[tuple[int, int, str]]:
    """``(start, end, why)`` of the tokens each tool turn's junction edit inserted
    (``info.boundary``, tool_turns continuous)."""
    out = []
    for s in steps if steps is not None else trace.steps:
        b = getattr(s.info, "boundary", None)
        if b and b.get("inserted") and isinstance(b.get("position"), int):
            out.append((b["position"], b["position"] + len(b["inserted"]), str(b.get("why") or "")))
    return out


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

# css_template and js_on_load of the view's gr.HTML: the view's rules (colour modes included) and
# its behaviour (window.__aliTV, shared by every view on the page and by select_step_js; the
# delegated events of one view), read once.
CSS = assets.read("token_view.css")
JS = assets.read("token_view.js")


def select_step_js(prefix: str) -> str:
    """JS for an event's ``js=``: select (highlight, scroll to) in view ``prefix`` the step given
    as the first input."""
    prefix = re.sub(r"[^A-Za-z0-9_-]", "", prefix)
    return (
        "(step, ...rest) => { if (step !== null && step !== undefined && step !== '' && window.__aliTV)"
        f" window.__aliTV.selectById('{prefix}', step, true); return [step, ...rest]; }}"
    )
