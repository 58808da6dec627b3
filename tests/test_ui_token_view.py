"""The token view (ui/token_view.py): escaping, counts, byte display, step anchors, size.

Real Qwen tokenizer (offline profile); expectations come from the tokenizer itself, not from
the view. The HTML is parsed back with the standard library's HTMLParser, so the tests see the
same elements a browser would build.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest

from backend.loading.tokenizers import load_tokenizer
from backend.trace import load_traces
from ui import token_view as tv
from ui.context import SAMPLE_DIR


class Parsed(HTMLParser):
    """Token spans of .tv-body (children of its line-aligned chunks, div.tv-c), anchors, the
    chunks and every tag/attribute seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tokens: list[dict] = []
        self.anchors: list[dict] = []
        self.chunks: list[dict] = []  # {"data-i": first token index, "first": index of its first token span}
        self.tags: list[tuple[str, dict]] = []
        self._body_depth: int | None = None
        self._stack: list[str] = []
        self._cur: dict | None = None
        self._cur_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._stack.append(tag)
        depth = len(self._stack)
        if tag == "div" and "tv-body" in (a.get("class") or "").split():
            self._body_depth = depth
            return
        if self._body_depth is None:
            return
        if tag == "div" and depth == self._body_depth + 1 and "tv-c" in (a.get("class") or "").split():
            self.chunks.append({"data-i": a.get("data-i"), "first": len(self.tokens)})
        elif depth == self._body_depth + 2 and self.chunks:
            if tag == "span":
                self._cur = {"class": a.get("class", ""), "title": a.get("title", ""), "text": ""}
                self._cur_depth = depth
                self.tokens.append(self._cur)
            elif tag == "a":
                self.anchors.append(a)

    def handle_endtag(self, tag):
        if self._cur is not None and len(self._stack) == self._cur_depth:
            self._cur = None
        if self._stack:
            self._stack.pop()
        if self._body_depth is not None and len(self._stack) < self._body_depth:
            self._body_depth = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur["text"] += data


def parse(markup: str) -> Parsed:
    p = Parsed()
    p.feed(markup)
    p.close()
    return p


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def weather():
    return load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0]


def test_one_span_per_token_with_mask_classes(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer)
    p = parse(markup)
    assert len(p.tokens) == len(weather.prompt_ids) + len(weather.response_ids) == 248
    kinds = [t["class"].split()[0][0] for t in p.tokens]
    expected = ["p"] * 178 + ["g"] * 25 + ["j"] * 29 + ["g"] * 16
    assert kinds == expected
    # neighbours alternate parity so token boundaries are visible
    assert [t["class"].split()[0][1] for t in p.tokens[:4]] == ["0", "1", "0", "1"]


def test_token_text_round_trips_to_the_decoded_trace(qwen, weather):
    p = parse(tv.render_trace(weather, qwen.tokenizer))
    shown = "".join(t["text"] for t in p.tokens)
    assert shown == qwen.tokenizer.decode(weather.input_ids, skip_special_tokens=False)


def test_titles_carry_ids(qwen, weather):
    p = parse(tv.render_trace(weather, qwen.tokenizer))
    ids = weather.input_ids
    for t, i in zip(p.tokens, ids):
        assert t["title"].split()[:2] == ["id", str(i)]


def test_special_tokens_are_marked(qwen, weather):
    p = parse(tv.render_trace(weather, qwen.tokenizer))
    added = set(qwen.tokenizer.added_tokens_decoder)
    for t, i in zip(p.tokens, weather.input_ids):
        assert ("s" in t["class"].split()) == (i in added)
    assert p.tokens[0]["text"] == "<|im_start|>" and "special" in p.tokens[0]["title"]


def test_counts_per_mask_value(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer)
    p = parse(markup)
    counts = {a["data-count"]: None for _, a in p.tags if "data-count" in a}
    assert set(counts) == {"prompt", "generated", "injected", "special", "total"}
    # the numbers sit inside <b data-count=...>N</b>
    for name, n in {"prompt": 178, "generated": 41, "injected": 29, "total": 248}.items():
        assert f'<b data-count="{name}">{n}</b>' in markup
    n_special = sum(1 for i in weather.input_ids if i in qwen.tokenizer.added_tokens_decoder)
    assert f'<b data-count="special">{n_special}</b>' in markup


def test_step_anchors_and_jump_buttons(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer, prefix="xyz")
    p = parse(markup)
    steps = [s for s in weather.steps if s.end > s.start]
    marks = [a for a in p.anchors if "tv-mark" in a.get("class", "")]
    assert [a["id"] for a in marks] == [f"xyz-step-{s.index}" for s in steps]
    # the token the tool turn's junction edit inserted (continuous tokens) has a mark of its own, before it
    (ins,) = [a for a in p.anchors if "tv-ins" in a.get("class", "")]
    b = weather.steps[2].info.boundary
    assert (int(ins["data-start"]), int(ins["data-end"])) == (b["position"], b["position"] + len(b["inserted"]))
    assert "mask 0" in ins["title"] and "&lt;" not in ins["title"]  # the title is attribute text, decoded once
    for a, s in zip(marks, steps):
        assert (int(a["data-start"]), int(a["data-end"])) == (s.start, s.end)
    jumps = [a["data-jump"] for _, a in p.tags if "data-jump" in a]
    assert jumps == [f"xyz-step-{s.index}" for s in steps]
    # the anchor sits right before the step's first token
    body = markup[markup.index('class="tv-body"'):]
    first_gen = body.index('id="xyz-step-1"')
    assert body[first_gen:].index("&lt;tool_call&gt;") < 200


def test_everything_is_escaped(qwen):
    evil = '<script>alert(1)</script><img src=x onerror=alert(1)> "quoted" \'single\' & amp'
    ids = qwen.tokenizer.encode(evil, add_special_tokens=False)
    markup = tv.render_tokens(ids, [tv.GENERATED] * len(ids), qwen.tokenizer,
                              steps=[tv.StepMark(0, 0, len(ids), "generating", '<b onclick="x">label</b>')],
                              title="<img src=x onerror=alert(2)>", note="<script>alert(3)</script>", prefix="a\"b<c")
    p = parse(markup)
    tags = {t for t, _ in p.tags}
    assert tags <= {"div", "span", "i", "a", "b", "small", "label", "input", "button"}
    assert not any(k.startswith("on") for _, a in p.tags for k in a)
    assert "<script" not in markup and "<img" not in markup
    assert "".join(t["text"] for t in p.tokens) == evil
    assert '<b onclick' not in markup


def test_incomplete_utf8_shows_bytes_not_replacement_chars(qwen):
    text = "🦜 “quote”"
    ids = qwen.tokenizer.encode(text, add_special_tokens=False)
    pieces = qwen.tokenizer.convert_ids_to_tokens(ids)
    p = parse(tv.render_tokens(ids, [tv.GENERATED] * len(ids), qwen.tokenizer))
    shown = [t["text"] for t in p.tokens]
    assert "\ufffd" not in "".join(shown)
    # 🦜 is f0 9f a6 9c; Qwen splits it across tokens: the first carries 3 bytes, the next 1
    assert any("\\xf0\\x9f\\xa6" in s for s in shown), (pieces, shown)
    assert any(s == "\\x9c" for s in shown), shown
    bad = [t for t in p.tokens if "bytes" in t["title"]]
    assert bad and all("\\x" in t["title"] for t in bad)
    # complete characters stay characters
    assert any("“" in s for s in shown)


def test_split_utf8():
    from backend.loading.token_text import split_utf8

    assert split_utf8("é".encode() + b"\xe2\x80") == [(True, "é".encode()), (False, b"\xe2\x80")]
    assert split_utf8(b"\x9cab") == [(False, b"\x9c"), (True, b"ab")]
    assert split_utf8(b"") == []


def test_whitespace_markup_keeps_text_and_toggle_exists(qwen):
    text = "a  b\n\tc\r\x07"
    ids = qwen.tokenizer.encode(text, add_special_tokens=False)
    markup = tv.render_tokens(ids, [tv.PROMPT] * len(ids), qwen.tokenizer)
    assert 'class="tv-ws-toggle"' in markup
    p = parse(markup)
    joined = "".join(t["text"] for t in p.tokens)
    assert joined.replace("\\x07", "\x07").replace("\\r", "\r") == text
    assert "<i class=ws>  </i>" in markup or "<i class=ws> </i>" in markup
    assert "<i class=wn></i>\n" in markup and "<i class=wt>\t</i>" in markup
    assert tv.render_tokens(ids, [0] * len(ids), qwen.tokenizer, show_whitespace=True).startswith('<div class="tv tv-ws"')


def test_no_tokenizer_shows_ids():
    markup = tv.render_tokens([5, 17], [0, 1], None)
    p = parse(markup)
    assert [t["text"] for t in p.tokens] == ["⟨5⟩", "⟨17⟩"]


def test_out_of_range_ids_do_not_crash(qwen):
    p = parse(tv.render_tokens([9707, 10**9], [1, 1], qwen.tokenizer))
    assert [t["text"] for t in p.tokens] == ["Hello", f"⟨{10**9}⟩"]


def test_mark_special_text(qwen):
    out = tv.mark_special_text("<|im_start|>user\n<b>hi</b><|im_end|>", qwen.tokenizer)
    assert out.count('<mark class="tv-sp">') == 2
    assert "&lt;b&gt;hi&lt;/b&gt;" in out and "<b>" not in out


def test_32k_tokens_render_small(qwen):
    text = (open(tv.__file__, encoding="utf-8").read() + " 日本語 😀 é\n") * 40
    ids = qwen.tokenizer.encode(text, add_special_tokens=False)[:32768]
    assert len(ids) == 32768
    kinds = [tv.PROMPT] * 1000 + [tv.GENERATED if (i // 700) % 2 == 0 else tv.INJECTED for i in range(len(ids) - 1000)]
    steps = [tv.StepMark(i, s, min(s + 700, len(ids)), "generating") for i, s in enumerate(range(0, len(ids), 700))]
    markup = tv.render_tokens(ids, kinds, qwen.tokenizer, steps=steps)  # time: bench/bench_token_view.py
    assert len(markup.encode("utf-8")) < 2.5e6
    assert parse(markup).tokens.__len__() == len(ids)
    assert html.unescape("x") == "x"




def test_chunks_are_line_aligned(qwen):
    """Tokens come in chunks (div.tv-c, content-visibility in CSS) that end only after a token
    ending a line, so they stack as the unbroken text would flow; data-i is the first token's
    index (the hover bar counts from it)."""
    text = ("def f(x):\n    return x  # 日本語 😀\n\n" + "word " * 300 + "\n") * 30
    ids = qwen.tokenizer.encode(text, add_special_tokens=False)
    markup = tv.render_tokens(ids, [tv.GENERATED] * len(ids), qwen.tokenizer)
    p = parse(markup)
    assert len(p.tokens) == len(ids) and len(p.chunks) > 5
    assert [int(c["data-i"]) for c in p.chunks] == [c["first"] for c in p.chunks]
    ends = [c["first"] for c in p.chunks[1:]] + [len(ids)]
    for c, end in zip(p.chunks[:-1], ends):
        assert end - c["first"] >= tv.CHUNK_TOKENS
        assert p.tokens[end - 1]["text"].endswith("\n")
    assert "".join(t["text"] for t in p.tokens) == qwen.tokenizer.decode(ids)
    # a short view is one chunk; no tokens, one empty chunk
    assert len(parse(tv.render_tokens(ids[:10], [tv.PROMPT] * 10, qwen.tokenizer)).chunks) == 1
    assert markup.count('<div class="tv-c"') == len(p.chunks)
    assert '<div class="tv-body"><div class="tv-c" data-i="0"></div></div>' in tv.render_tokens([], [], qwen.tokenizer)


# ---- colour modes: logprobs (issue 14, "see it") ------------------------------------------------

# one value of each bin, by the bins' definitions (|Δ| edges 0.01, 0.05, 0.2, ln 2; probability
# edges 0.9, 0.5, 0.2, 0.05), cycled over the response tokens
DELTAS = [0.001, -0.03, 0.1, -0.5, 1.0]  # heat bins 0, 1, 2, 3, 4
PROBS = [0.95, 0.6, 0.3, 0.1, 0.01]  # probability bins 0, 1, 2, 3, 4


def _scored(trace):
    """The trace with rollout logprobs on its generated steps and trainer logprobs on every
    response step (the tool step's for information, as score_trace does)."""
    import math

    t = trace.model_copy(deep=True)
    for s in t.steps:
        n = s.end - s.start
        if n <= 0 or s.start < len(t.prompt_ids):
            continue
        k0 = s.start
        if s.mask == 1:
            s.logprobs = [math.log(PROBS[(k0 + k) % 5]) for k in range(n)]
            s.info.trainer_logprobs = [math.log(PROBS[(k0 + k) % 5]) + DELTAS[(k0 + k) % 5] for k in range(n)]
        else:
            s.info.trainer_logprobs = [math.log(PROBS[(k0 + k) % 5]) for k in range(n)]
    return t


def _floats(b64: str) -> list[float]:
    import base64
    import struct

    raw = base64.b64decode(b64, validate=True)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@pytest.fixture(scope="module")
def scored(weather):
    return _scored(weather)


def test_position_logprobs_per_position(scored, weather):
    from backend.checks.logprobs import position_logprobs

    ro, tr = position_logprobs(scored)
    n = len(scored.input_ids)
    assert len(ro) == len(tr) == n
    p = len(scored.prompt_ids)
    assert ro[:p] == [None] * p and tr[:p] == [None] * p
    for s in scored.steps:
        for k in range(s.start, s.end):
            if k < p:
                continue
            assert tr[k] == pytest.approx(s.info.trainer_logprobs[k - s.start])
            assert (ro[k] is None) == (s.mask != 1)
    assert position_logprobs(weather) == ([None] * n, [None] * n)
    # a list of the wrong length cannot be placed; NaN reads as absent
    bad = scored.model_copy(deep=True)
    gen = next(s for s in bad.steps if s.mask == 1 and s.end > s.start)
    gen.logprobs = gen.logprobs[:-1]
    gen.info.trainer_logprobs = [float("nan")] + gen.info.trainer_logprobs[1:]
    ro2, tr2 = position_logprobs(bad)
    assert ro2[gen.start : gen.end] == [None] * (gen.end - gen.start)
    assert tr2[gen.start] is None and tr2[gen.start + 1] is not None


def test_bins_per_token(qwen, scored):
    p = parse(tv.render_trace(scored, qwen.tokenizer))
    start = len(scored.prompt_ids)
    mask = scored.response_mask
    for i, t in enumerate(p.tokens):
        cls = t["class"].split()
        heat = [c for c in cls if c[0] == "h"]
        prob = [c for c in cls if c[0] == "q"]
        if i < start:
            assert heat == [] and prob == [], (i, cls)
        elif mask[i - start] == 1:
            assert heat == [f"h{i % 5}"] and prob == [f"q{i % 5}"], (i, cls)
        else:  # mask 0: the trainer's logprob only: a probability, no |Δ|; still shown as mask 0
            assert heat == [] and prob == [f"q{i % 5}"] and cls[0][0] == "j", (i, cls)


def test_info_data_carries_both_logprobs(qwen, scored):
    import math

    markup = tv.render_trace(scored, qwen.tokenizer)
    root = parse(markup).tags[0][1]
    lo, hi = int(root["data-lp-lo"]), int(root["data-lp-hi"])
    assert (lo, hi) == (len(scored.prompt_ids), len(scored.input_ids))
    r, x = _floats(root["data-lp-r"]), _floats(root["data-lp-x"])
    assert len(r) == len(x) == hi - lo
    mask = scored.response_mask
    for k in range(hi - lo):
        pos = lo + k
        prob = math.log(PROBS[pos % 5])
        if mask[k] == 1:  # rollout and Δ (float32)
            assert r[k] == pytest.approx(prob, rel=1e-6) and x[k] == pytest.approx(DELTAS[pos % 5], rel=1e-6)
        else:  # no rollout: the trainer's logprob
            assert math.isnan(r[k]) and x[k] == pytest.approx(prob, rel=1e-6)
    # the mode switch offers all three modes, mask first and chosen; each mode has its legend
    assert '<select class="tv-mode"' in markup
    opts = [a.get("value") for t, a in parse(markup).tags if t == "option"]
    assert opts == ["mask", "prob", "heat"]
    assert 'data-legend="heat"' in markup and 'data-legend="prob"' in markup and "ratio outside [½, 2]" in markup


def test_only_rollout_logprobs_give_probability_but_no_heat(qwen, scored):
    only = scored.model_copy(deep=True)
    for s in only.steps:
        s.info.trainer_logprobs = None
    markup = tv.render_trace(only, qwen.tokenizer)
    opts = [a.get("value") for t, a in parse(markup).tags if t == "option"]
    assert opts == ["mask", "prob"]
    assert not any(c[0] == "h" for t in parse(markup).tokens for c in t["class"].split())
    assert "(rollout)" in markup


def test_no_logprobs_no_mode_switch(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer)
    assert "tv-mode" not in markup and "data-lp-" not in markup and "tv-lg" not in markup
    # the classes stay as they were: one kind class (and s)
    assert all(set(t["class"].split()) <= {"p0", "p1", "g0", "g1", "j0", "j1", "s"} for t in parse(markup).tokens)


def test_logprob_markup_is_escaped_and_bounded(qwen):
    import re

    evil = '<script>alert(1)</script><img src=x onerror=alert(1)> "q" &'
    ids = qwen.tokenizer.encode(evil, add_special_tokens=False)
    n = len(ids)
    rollout = [float("nan"), float("inf"), -float("inf"), None] + [-0.5] * (n - 4)
    trainer = [-1e308, None, 0.0, 5.0] + [-0.25] * (n - 4)  # a positive logprob is shown, not trusted
    markup = tv.render_tokens(ids, [tv.GENERATED] * n, qwen.tokenizer, logprobs=(rollout, trainer), prefix="x\"<y")
    p = parse(markup)
    assert "".join(t["text"] for t in p.tokens) == evil
    assert "<script" not in markup and "<img" not in markup
    assert not any(k.startswith("on") for _, a in p.tags for k in a)
    root = p.tags[0][1]
    for k in ("data-lp-r", "data-lp-x"):
        assert re.fullmatch(r"[A-Za-z0-9+/=]+", root[k])
    r, x = _floats(root["data-lp-r"]), _floats(root["data-lp-x"])
    # non-finite values are absent; the trainer's -1e308 underflows float32's range to -inf (shown, not crashing)
    import math

    assert math.isnan(r[0]) and math.isnan(r[1]) and math.isnan(r[2]) and math.isnan(r[3])
    assert x[0] == -math.inf and math.isnan(x[1]) and x[2] == 0.0 and x[3] == 5.0
    assert p.tokens[4]["class"].split() == ["g0", "h3", "q1"]  # |Δ| 0.25 in [0.2, ln 2), p = e^-0.5 = 0.61
    with pytest.raises(ValueError):
        tv.render_tokens(ids, [tv.GENERATED] * n, qwen.tokenizer, logprobs=(rollout[:-1], trainer))
    # all None: no modes
    assert "tv-mode" not in tv.render_tokens(ids, [tv.GENERATED] * n, qwen.tokenizer, logprobs=([None] * n, [None] * n))


def test_colour_modes_css_follows_the_theme_and_keeps_mask0_apart():
    css = tv.CSS
    for m in ("prob", "heat"):
        assert f".tv-m-{m} .tv-c > span:is(.j0, .j1)" in css  # mask 0 in every colour mode: italic, dotted
        for b in range(5):
            assert f".tv-m-{m} .tv-c > span.{'q' if m == 'prob' else 'h'}{b}" in css
    assert "{{" not in css and "${" not in css


def test_payload_with_logprobs_stays_within_1_5x(qwen, scored):
    """Size, not time: the colour modes add bin classes and two float32 arrays (bench/ times it)."""
    big_ids, big_kinds = [], []
    base = scored.input_ids
    while len(big_ids) < 8000:
        big_ids += base
        big_kinds += tv.trace_kinds(scored)
    ro, tr = [], []
    from backend.checks.logprobs import position_logprobs

    r1, t1 = position_logprobs(scored)
    while len(ro) < len(big_ids):
        ro += r1
        tr += t1
    plain = tv.render_tokens(big_ids, big_kinds, qwen.tokenizer)
    with_lp = tv.render_tokens(big_ids, big_kinds, qwen.tokenizer, logprobs=(ro, tr))
    assert len(with_lp.encode()) <= 1.5 * len(plain.encode())


def test_a_step_view_gets_that_steps_logprobs(qwen, scored, weather):
    gen = next(s for s in scored.steps if s.mask == 1 and s.end > s.start)
    ro, tr = tv.step_logprobs(scored, gen)
    assert ro == pytest.approx(gen.logprobs) and tr == pytest.approx(gen.info.trainer_logprobs)
    ids = scored.input_ids[gen.start : gen.end]
    markup = tv.render_tokens(ids, tv.trace_kinds(scored)[gen.start : gen.end], qwen.tokenizer, first_index=gen.start,
                              step_index=gen.index, logprobs=(ro, tr))
    assert 'data-lp-lo="0"' in markup and '<option value="heat">' in markup
    assert [t["class"].split()[1] for t in parse(markup).tokens] == [f"h{i % 5}" for i in range(gen.start, gen.end)]
    assert tv.step_logprobs(scored, scored.steps[0]) is None  # the prompt has none
    assert tv.step_logprobs(weather, gen) is None


def test_windowed_markup_is_escaped_and_compact(qwen):
    import re

    evil = '<script>alert(1)</script><img src=x onerror=alert(1)> "q" & ' * 50
    ids = qwen.tokenizer.encode(evil, add_special_tokens=False)
    n = len(ids)
    markup = tv.render_tokens(ids, [tv.GENERATED] * n, qwen.tokenizer, window=True,
                              steps=[tv.StepMark(0, 0, n, "generating", '<b onclick="x">label</b>')],
                              logprobs=([-0.5] * n, [-0.25] * n))
    p = parse(markup)
    assert {t for t, _ in p.tags} <= {"div", "span", "i", "a", "b", "small", "label", "input", "button", "select", "option", "template"}
    assert not any(k.startswith("on") for _, a in p.tags for k in a)
    assert "<script" not in markup and "<img" not in markup and "<b onclick" not in markup
    body = next(a for t, a in p.tags if "tv-body" in (a.get("class") or ""))
    for k in ("data-seq", "data-meta"):
        assert re.fullmatch(r"[A-Za-z0-9+/=]+", body[k])
    # each distinct token once, in the template; none in the chunks
    vocab = markup.split('<template class="tv-vocab">', 1)[1].split("</template>", 1)[0]
    assert vocab.count("<span") == len(set(ids)) < n
    assert "<span" not in markup.split("</template>", 1)[1]


def test_windowed_sequence_decodes_to_the_ids_also_past_65535_distinct():
    import base64
    import struct

    for n in (1000, 70000):
        ids = [(i * 7919) % (n + 13) for i in range(n)]  # many distinct ids, some repeated
        markup = tv.render_tokens(ids, [tv.GENERATED] * n, None, window=True)
        body = next(a for t, a in parse(markup).tags if "tv-body" in (a.get("class") or ""))
        width = int(body["data-seq-bytes"])
        assert width == (4 if len(set(ids)) > 0xFFFF else 2)
        raw = base64.b64decode(body["data-seq"])
        seq = struct.unpack(f"<{len(raw) // width}{'I' if width == 4 else 'H'}", raw)
        vocab = markup.split('<template class="tv-vocab">', 1)[1].split("</template>", 1)[0]
        texts = [html.unescape(t) for t in __import__("re").findall(r"<span[^>]*>(.*?)</span>", vocab)]
        assert [texts[k] for k in seq] == [f"⟨{i}⟩" for i in ids]
        meta = base64.b64decode(body["data-meta"])
        assert len(meta) == n and set(meta) == {tv.GENERATED}
