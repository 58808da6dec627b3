"""The token view (ui/token_view.py): escaping, counts, byte display, step anchors, size.

Real Qwen tokenizer (offline profile); expectations come from the tokenizer itself, not from
the view. The HTML is parsed back with the standard library's HTMLParser, so the tests see the
same elements a browser would build.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest

from backend.tokenizers import load_tokenizer
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
    assert len(p.tokens) == len(weather.prompt_ids) + len(weather.response_ids) == 247
    kinds = [t["class"].split()[0][0] for t in p.tokens]
    expected = ["p"] * 178 + ["g"] * 25 + ["j"] * 28 + ["g"] * 16
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
    for name, n in {"prompt": 178, "generated": 41, "injected": 28, "total": 247}.items():
        assert f'<b data-count="{name}">{n}</b>' in markup
    n_special = sum(1 for i in weather.input_ids if i in qwen.tokenizer.added_tokens_decoder)
    assert f'<b data-count="special">{n_special}</b>' in markup


def test_step_anchors_and_jump_buttons(qwen, weather):
    markup = tv.render_trace(weather, qwen.tokenizer, prefix="xyz")
    p = parse(markup)
    steps = [s for s in weather.steps if s.end > s.start]
    assert [a["id"] for a in p.anchors] == [f"xyz-step-{s.index}" for s in steps]
    for a, s in zip(p.anchors, steps):
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
    assert tv.split_utf8("é".encode() + b"\xe2\x80") == [(True, "é".encode()), (False, b"\xe2\x80")]
    assert tv.split_utf8(b"\x9cab") == [(False, b"\x9c"), (True, b"ab")]
    assert tv.split_utf8(b"") == []


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
