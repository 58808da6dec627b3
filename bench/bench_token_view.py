"""Token view at 32,768 tokens: server render time, payload size, browser paint, hover and scroll.

The input is a realistic agent trace built from real text with the Qwen3 tokenizer (offline
profile): a system prompt with tool schemas (JSON), then assistant turns (prose, code, CJK,
emoji whose UTF-8 bytes are split across tokens, ``<tool_call>`` JSON) and tool responses
(JSON with CJK and emoji), each wrapped in the chat template's special tokens, until 32,768
tokens; mask per turn (prompt / generated 1 / injected 0) and one step mark per turn.

Server (this process; baselines on the same ids, same process, so the ratios survive a noisy
machine):

* ``render_tokens`` cold (a fresh per-tokenizer cache, as for the first trace of a tokenizer)
  and warm (cache filled, as for every later render), best and median of ``--reps``;
* baselines: ``tokenizer.decode(ids)`` and ``html.escape`` of the decoded text;
* payload: the markup in UTF-8 bytes, as a JSON string (what Gradio sends), and gzipped.

Browser (headless Chromium, ``/usr/bin/chromium`` through Playwright; skipped with
``--no-browser``): a page with the token view's CSS and JS (``ui.token_view.CSS``/``JS``, the
``element`` that ``gr.HTML`` gives ``js_on_load`` is the container), then per repetition:
``innerHTML = markup`` → the next ``requestAnimationFrame`` (parse done) → a task posted from
that frame (style, layout and paint of the frame done), timed with ``performance.now()``.
Baseline, interleaved in a second page: the same markup without the line-aligned chunks
(``div.tv-c`` with ``content-visibility: auto``), i.e. 32k spans in one box. A windowed view
(above ``ui.token_view.WINDOW_TOKENS``, e.g. ``--tokens 131072``) has no spans to flatten: its
baseline is the server-built view of the same trace (``window=False``, every span sent, chunked:
the design before windowing), rendered on the server too (``server_built``: render time, bytes)
and painted as it is in a third page, and flattened for the unchunked page (131k spans in one
box). Hover, scroll and the jump then run on the windowed view (hover: over its built chunks).
``--no-baseline`` paints the view alone.
Then hovers over 200 tokens spread over the view, the last token last (the info bar update:
index, id, bytes; median and max of the synchronous handler), scrolling the token box to the end
(next frame), and a step-chip jump to the last step (time and frames until its anchor is in
view, and whether it stays there once the lazily laid-out chunks have settled).

Targets (issue): server render ≤ 200 ms, payload ≤ 2.5 MB, browser paint ≤ 1 s. Nothing here is
asserted by a test (tests/test_ui_token_view.py keeps size and shape only)::

    .venv/bin/python bench/bench_token_view.py [--tokens 32768] [--reps 7] [--no-browser] [--json]
        [--logprobs] [--no-baseline]

``--logprobs`` adds the view with rollout and trainer logprobs (issue 14: colour modes, the
numbers for the info line) against the mask-only view of the same trace: server render,
payload, paint (interleaved pages), the heat / probability mode switch (class on the root, to
the next frame), hover with logprobs, ``tv-select`` of the last token. Target: payload ≤ 1.5×,
paint ≤ 1 s.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import random
import re
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from backend.loading import token_text  # noqa: E402
from backend.loading.tokenizers import load_tokenizer  # noqa: E402
from ui import token_view as tv  # noqa: E402

# ---- input -------------------------------------------------------------------------------------

PROSE = (
    "The loop appends the generated ids as they come back from the engine; each tool turn is rendered "
    "on its own and stripped of the template's empty-conversation prefix, so the training sequence and "
    "the inference sequence agree token for token. "
)
CJK = "東京の天気は晴れ、気温は摂氏二十二度です。明日は雨が降るでしょう。北京今天多云，气温十八度。서울은 맑음. "
EMOJI = "Done 👍🏽 — family 👨‍👩‍👧‍👦, flags 🇯🇵🇫🇷, weather ⛅🌧️, é à ü ß ∑ ≤ ≥ → ✓ "


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_FILES = ["README.md", "ui/token_view.py", "backend/engine.py", "backend/trace/model.py", "ui/inspector.py", "backend/checks/diagnostics.py"]


def _corpus() -> str:
    """Real prose and code of this repository: varied text, thousands of distinct token ids."""
    parts = []
    for name in CORPUS_FILES:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


def build_input(bundle, n_tokens: int):
    """(ids, kinds, steps) of a realistic trace of exactly ``n_tokens`` tokens."""
    tok = bundle.tokenizer
    sp = {t: tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                                                    "<tool_response>", "</tool_response>")}
    nl = tok.encode("\n", add_special_tokens=False)

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    ids: list[int] = []
    kinds: list[int] = []
    steps: list[tv.StepMark] = []

    def add(seg: list[int], kind: int, state: str) -> None:
        start = len(ids)
        ids.extend(seg)
        kinds.extend([kind] * len(seg))
        steps.append(tv.StepMark(len(steps), start, len(ids), state))

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool {i}: {PROSE[:80]}",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
             for i in range(6)]
    system = "You are a helpful assistant.\n\n# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
    add([sp["<|im_start|>"]] + enc("system\n" + system) + [sp["<|im_end|>"]] + nl + [sp["<|im_start|>"]]
        + enc("user\nWhat's the weather in Tokyo? " + CJK) + [sp["<|im_end|>"]] + nl + [sp["<|im_start|>"]] + enc("assistant\n"),
        tv.PROMPT, "pending")
    corpus = _corpus()
    turn = 0
    while len(ids) < n_tokens:
        turn += 1
        at = (turn * 1100) % (len(corpus) - 1200)
        body = (PROSE + EMOJI + CJK + "\n```python\n" + corpus[at:at + 1100] + "\n```\n")
        call = json.dumps({"name": f"tool_{turn % 6}", "arguments": {"city": "東京 🗼", "n": turn}}, ensure_ascii=False)
        add(enc(body) + [sp["<tool_call>"]] + enc("\n" + call + "\n") + [sp["</tool_call>"], sp["<|im_end|>"]],
            tv.GENERATED, "generating")
        result = json.dumps({"temperature": 22 + turn % 9, "summary": CJK[(turn * 7) % 40:] + EMOJI, "turn": turn,
                             "rows": corpus[at + 1100:at + 1400].splitlines()},
                            ensure_ascii=False)
        add(nl + [sp["<|im_start|>"]] + enc("user\n") + [sp["<tool_response>"]] + enc("\n" + result + "\n")
            + [sp["</tool_response>"], sp["<|im_end|>"]] + nl + [sp["<|im_start|>"]] + enc("assistant\n"),
            tv.INJECTED, "processing_tools")
    del ids[n_tokens:], kinds[n_tokens:]
    steps = [s for s in steps if s.start < n_tokens]
    steps[-1].end = min(steps[-1].end, n_tokens)
    return ids, kinds, steps


# ---- server ------------------------------------------------------------------------------------


def timed(fn, reps: int) -> tuple[list[float], object]:
    out, res = [], None
    for _ in range(reps):
        t = time.perf_counter()
        res = fn()
        out.append(time.perf_counter() - t)
    return out, res


def ms(xs: list[float]) -> dict:
    return {"best_ms": round(min(xs) * 1e3, 1), "median_ms": round(statistics.median(xs) * 1e3, 1)}


def synthetic_logprobs(kinds: list[int], seed: int = 0) -> tuple[list[float | None], list[float | None]]:
    """(rollout, trainer) per token, shaped like a real scored run: the rollout's logprob on
    generated tokens (most tokens near-certain, a tail of unlikely ones), the trainer's on every
    response token (mask 0 scored for information), Δ mostly tiny (float32 noise) with a bf16-like
    tail. Values are the payload's worst case: float32 of all of them, no two alike."""
    rng = random.Random(seed)
    ro: list[float | None] = []
    tr: list[float | None] = []
    for k in kinds:
        if k == tv.PROMPT:
            ro.append(None)
            tr.append(None)
            continue
        lp = -rng.expovariate(4.0) if rng.random() < 0.8 else -rng.expovariate(0.4)
        d = rng.gauss(0, 1e-5) if rng.random() < 0.7 else rng.gauss(0, 0.05 if rng.random() < 0.9 else 0.8)
        ro.append(lp if k == tv.GENERATED else None)
        tr.append(min(lp + d, 0.0))
    return ro, tr


def server(bundle, ids, kinds, steps, reps: int, logprobs=None, window=None) -> tuple[dict, str]:
    tok = bundle.tokenizer

    def render() -> str:
        return tv.render_tokens(ids, kinds, tok, steps=steps, prefix="tv", logprobs=logprobs, window=window)

    def cold() -> str:
        token_text.forget(tok)  # a fresh per-tokenizer cache
        return render()

    decode = lambda: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    escape = lambda: html.escape(tok.decode(ids, skip_special_tokens=False))  # noqa: E731
    cold_t, warm_t, dec_t, esc_t = [], [], [], []
    markup = ""
    for _ in range(reps):  # interleaved: drift on a noisy machine hits every variant alike
        cold_t += timed(cold, 1)[0]
        t, markup = timed(render, 1)
        warm_t += t
        dec_t += timed(decode, 1)[0]
        esc_t += timed(escape, 1)[0]
    raw = markup.encode("utf-8")
    as_json = json.dumps(markup).encode("utf-8")
    # special-token spans sent (None for a windowed view: it sends no spans, the browser builds them)
    n_specials = markup.count('s" title="id ') if '<div class="tv-body">' in markup else None
    res = {
        "render_cold": ms(cold_t),
        "render_warm": ms(warm_t),
        "baseline_decode": ms(dec_t),
        "baseline_decode_and_escape": ms(esc_t),
        "warm_vs_decode_and_escape": round(statistics.median(warm_t) / statistics.median(esc_t), 2),
        "cold_vs_decode_and_escape": round(statistics.median(cold_t) / statistics.median(esc_t), 2),
        "payload_bytes": len(raw),
        "payload_json_bytes": len(as_json),
        "payload_gzip_bytes": len(gzip.compress(as_json, 6)),
        "bytes_per_token": round(len(raw) / len(ids), 1),
        "special_tokens": n_specials,
    }
    return res, markup


# ---- browser -----------------------------------------------------------------------------------

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>%s</style></head>
<body style="margin:0;padding:16px;width:1200px;font-family:sans-serif"><div id="root"></div>
<script>const element = document.getElementById('root');
%s
</script></body></html>"""

PAINT_JS = """async (markup) => {
  const root = document.getElementById('root');
  root.innerHTML = '';
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  const t0 = performance.now();
  root.innerHTML = markup;
  if (window.__aliTV) window.__aliTV.apply(root);  // what gr.HTML's watch('value') runs (a windowed view builds its visible chunks)
  const t1 = performance.now();
  const t2 = await new Promise((r) => requestAnimationFrame(() => r(performance.now())));
  const t3 = await new Promise((r) => setTimeout(() => r(performance.now()), 0));
  return {set_inner_html_ms: t1 - t0, to_next_frame_ms: t2 - t0, to_after_paint_ms: t3 - t0,
          spans: root.querySelectorAll('.tv-c > span').length};
}"""

HOVER_JS = """() => {
  const spans = element.querySelectorAll('.tv-c > span');
  const times = [];
  let el = null;
  for (let i = 0; i < 200; i++) {  // tokens spread over the whole view (the built chunks of a windowed one), the last one last
    el = spans[Math.floor((spans.length - 1) * i / 199)];
    const t0 = performance.now();
    el.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return {hover_median_ms: times[100], hover_max_ms: times[199], info: element.querySelector('.tv-info').textContent,
          index: window.__aliTV ? window.__aliTV.indexOf(el) : spans.length - 1};
}"""


SCROLL_JS = """async () => {
  const body = element.querySelector('.tv-body');
  body.scrollIntoView();
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  const t0 = performance.now();
  body.scrollTop = body.scrollHeight;
  const t1 = await new Promise((r) => requestAnimationFrame(() => setTimeout(() => r(performance.now()), 0)));
  const end = body.scrollTop + body.clientHeight >= body.scrollHeight - 2;
  // after that one frame: is the last token built and inside the box?
  const chunks = body.querySelectorAll('.tv-c'), lastc = chunks[chunks.length - 1];
  const spans = lastc.querySelectorAll(':scope > span'), last = spans[spans.length - 1];
  const n = +element.querySelector('.tv').dataset.tokens;
  let last_visible = false;
  if (last && window.__aliTV.indexOf(last) === n - 1) {
    const r = last.getBoundingClientRect(), b = body.getBoundingClientRect();
    last_visible = r.top >= b.top && r.bottom <= b.bottom + 1;
  }
  const h = body.scrollHeight;
  body.scrollTop = 0;
  return {scroll_to_end_ms: t1 - t0, scrolled_to_end: end, last_token_visible_next_frame: last_visible, scroll_height_px: h};
}"""

JUMP_JS = """async () => {
  const chips = element.querySelectorAll('.tv-jump');
  const chip = chips[chips.length - 1];
  const a = element.querySelector('#' + CSS.escape(chip.dataset.jump));
  const body = a.closest('.tv-body');
  const visible = () => { const ra = a.getBoundingClientRect(), rb = body.getBoundingClientRect();
                          return ra.top >= rb.top && ra.bottom <= rb.bottom; };
  const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  body.scrollTop = 0;
  await frame();
  const t0 = performance.now();
  chip.click();
  let frames = 0;
  do { await frame(); frames++; } while (!visible() && frames < 10);
  const t1 = performance.now();
  for (let i = 0; i < 5; i++) await frame();  // still there once the view has settled?
  return {jump_last_step_ms: t1 - t0, frames, anchor_visible: visible(), selected: a.classList.contains('sel'),
          chips: chips.length};
}"""


def flat_variant(markup: str) -> tuple[str, str]:
    """(css, markup) of the same view without chunks (every token span a child of the token
    box, no content-visibility): the in-browser baseline. ``markup`` must be a server-built view
    (a windowed one has no spans to flatten: pass its ``window=False`` rendering)."""
    if '<div class="tv-body">' not in markup:
        raise ValueError("flat_variant needs a server-built (unwindowed) view")
    head, body = markup.split('<div class="tv-body">', 1)
    body = re.sub(r'<div class="tv-c" data-i="\d+">|</div>', "", body)
    css = tv.CSS.replace(".tv-c > span", ".tv-body > span")
    css = re.sub(r"\.tv-c \{[^}]*\}", "", css)
    return css, head + '<div class="tv-body">' + body + "</div></div>"


MODE_JS = """async (mode) => {
  const sel = element.querySelector('select.tv-mode');
  const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  await frame();
  const t0 = performance.now();
  sel.value = mode;
  sel.dispatchEvent(new Event('change', {bubbles: true}));
  await frame();
  const t1 = performance.now();
  const on = element.querySelector('.tv').classList.contains('tv-m-' + mode);
  return {mode_switch_ms: t1 - t0, on};
}"""

SELECT_JS = """async (index) => {
  const tv = element.querySelector('.tv');
  const t0 = performance.now();
  tv.dispatchEvent(new CustomEvent('tv-select', {detail: {index}}));
  const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  let frames = 0, el;
  const inView = () => { el = tv.querySelector('.tv-tok-sel'); if (!el) return false;
    const r = el.getBoundingClientRect(), b = el.closest('.tv-body').getBoundingClientRect();
    return r.top >= b.top && r.bottom <= b.bottom; };
  do { await frame(); frames++; } while (!inView() && frames < 10);
  return {tv_select_ms: performance.now() - t0, frames, in_view: inView(),
          index_ok: !!el && window.__aliTV.indexOf(el) === index, info: tv.querySelector('.tv-info').textContent};
}"""


def browser_lp(markup: str, lp_markup: str, reps: int, n_tokens: int, names=("mask_only", "with_logprobs")) -> dict:
    """Paint of ``lp_markup`` (the view with logprobs) against ``markup`` (by default the
    mask-only view of the same trace), interleaved, then on the former: the mode switch, hover
    with logprobs, scroll to the end, tv-select of the last token."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return {"skipped": "no chromium on PATH"}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            errors: list[str] = []
            page = b.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            lp_page = b.new_page(viewport={"width": 1280, "height": 900})
            lp_page.on("pageerror", lambda e: errors.append(str(e)))
            page.set_content(PAGE % (tv.CSS, tv.JS))
            lp_page.set_content(PAGE % (tv.CSS, tv.JS))
            plain, withlp = [], []
            for _ in range(reps):
                plain.append(page.evaluate(PAINT_JS, markup))
                withlp.append(lp_page.evaluate(PAINT_JS, lp_markup))
            heat = lp_page.evaluate(MODE_JS, "heat")
            hover = lp_page.evaluate(HOVER_JS)
            scroll = lp_page.evaluate(SCROLL_JS)
            sel = lp_page.evaluate(SELECT_JS, n_tokens - 1)
            prob = lp_page.evaluate(MODE_JS, "prob")
        finally:
            b.close()
    a = [r["to_after_paint_ms"] / 1e3 for r in plain]
    c = [r["to_after_paint_ms"] / 1e3 for r in withlp]
    return {
        f"{names[0]}_to_after_paint": ms(a),
        f"{names[1]}_to_after_paint": ms(c),
        "paint_ratio": round(statistics.median(c) / statistics.median(a), 2),
        "heat_mode_switch_ms": round(heat["mode_switch_ms"], 1), "heat_on": heat["on"],
        "prob_mode_switch_ms": round(prob["mode_switch_ms"], 1), "prob_on": prob["on"],
        "hover_median_ms": round(hover["hover_median_ms"], 2), "hover_max_ms": round(hover["hover_max_ms"], 2),
        "hover_info": hover["info"][:200],
        "scroll_to_end_ms": round(scroll["scroll_to_end_ms"], 1), "scrolled_to_end": scroll["scrolled_to_end"],
        "last_token_visible_next_frame": scroll["last_token_visible_next_frame"],
        "tv_select_last_ms": round(sel["tv_select_ms"], 1), "tv_select_frames": sel["frames"],
        "tv_select_ok": sel["in_view"] and sel["index_ok"], "tv_select_info": sel["info"][:200],
        "js_errors": errors,
    }


def browser(markup: str, reps: int, ids: list[int], full_markup: str | None = None, baseline: bool = True) -> dict:
    """Paint of ``markup`` against the unchunked baseline, interleaved, then hover, scroll and a
    step-chip jump on ``markup``. For a windowed view, ``full_markup`` is the server-built view of
    the same trace (``window=False``): the unchunked baseline is made from it, and it is painted
    as a second baseline (the design before windowing). ``baseline=False``: ``markup`` alone."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return {"skipped": "no chromium on PATH"}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = b.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            flat_page = full_page = None
            if baseline:
                flat_css, flat_markup = flat_variant(full_markup or markup)
                flat_page = b.new_page(viewport={"width": 1280, "height": 900})
                flat_page.set_content(PAGE % (flat_css, tv.JS))
            page.set_content(PAGE % (tv.CSS, tv.JS))
            if baseline and full_markup is not None:
                full_page = b.new_page(viewport={"width": 1280, "height": 900})
                full_page.set_content(PAGE % (tv.CSS, tv.JS))
            runs, flat, full = [], [], []
            for _ in range(reps):  # interleaved with the baseline(s)
                runs.append(page.evaluate(PAINT_JS, markup))
                if flat_page is not None:
                    flat.append(flat_page.evaluate(PAINT_JS, flat_markup))
                if full_page is not None:
                    full.append(full_page.evaluate(PAINT_JS, full_markup))
            hover = page.evaluate(HOVER_JS)
            scroll = page.evaluate(SCROLL_JS)
            jump = page.evaluate(JUMP_JS)
            version = b.version
        finally:
            b.close()
    key = lambda k, rs=runs: [r[k] / 1e3 for r in rs]  # noqa: E731
    paint, flat_paint = key("to_after_paint_ms"), key("to_after_paint_ms", flat)
    base_res = {}
    if flat:
        base_res = {"baseline_unchunked_to_after_paint": ms(flat_paint),
                    "paint_vs_unchunked": round(statistics.median(paint) / statistics.median(flat_paint), 2)}
    if full:
        full_paint = key("to_after_paint_ms", full)
        base_res |= {"baseline_server_built_to_after_paint": ms(full_paint),
                    "paint_vs_server_built": round(statistics.median(paint) / statistics.median(full_paint), 2)}
    return {
        "chromium": version,
        "spans": runs[-1]["spans"],  # of a windowed view: those built (the chunks near the visible part)
        "set_inner_html": ms(key("set_inner_html_ms")),
        "to_next_frame": ms(key("to_next_frame_ms")),
        "to_after_paint": ms(paint),
        **base_res,
        "hover_median_ms": round(hover["hover_median_ms"], 2),
        "hover_max_ms": round(hover["hover_max_ms"], 2),
        "hover_info": hover["info"][:120],
        "hover_info_ok": hover["info"].startswith(f"#{hover['index']}  id {ids[hover['index']]}"),
        "scroll_to_end_ms": round(scroll["scroll_to_end_ms"], 1),
        "scrolled_to_end": scroll["scrolled_to_end"],
        "scroll_height_px": scroll["scroll_height_px"],
        "jump_last_step_ms": round(jump["jump_last_step_ms"], 1),
        "jump_frames": jump["frames"],
        "jump_anchor_visible": jump["anchor_visible"] and jump["selected"],
        "step_chips": jump["chips"],
        "js_errors": errors,
    }


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    ap.add_argument("--logprobs", action="store_true",
                    help="also the view with rollout and trainer logprobs (colour modes) against the mask-only view")
    ap.add_argument("--no-baseline", action="store_true", help="skip the in-browser baselines (unchunked; server-built for a windowed view): slow at 128k")
    ap.add_argument("--window", choices=("auto", "on", "off"), default="auto",
                    help=f"windowed view (auto: above {tv.WINDOW_TOKENS} tokens)")
    ap.add_argument("--vs-full", action="store_true",
                    help="with --logprobs: also the server-built (unwindowed) view with logprobs, as the baseline")
    args = ap.parse_args()

    bundle = load_tokenizer("qwen3")
    ids, kinds, steps = build_input(bundle, args.tokens)
    # tokens whose bytes are not whole UTF-8 characters (shown with their bytes, \xNN escapes)
    split = sum(1 for i in token_text.decoder_for(bundle.tokenizer).infos(ids) if not i.special and i.raw is not None and not i.complete)
    summary: dict = {
        "input": {
            "tokens": len(ids), "prompt": kinds.count(tv.PROMPT), "generated": kinds.count(tv.GENERATED),
            "injected": kinds.count(tv.INJECTED), "steps": len(steps), "distinct_ids": len(set(ids)),
            "tokens_with_split_utf8": split,
        },
    }
    window = {"auto": None, "on": True, "off": False}[args.window]
    summary["input"]["windowed"] = len(ids) > tv.WINDOW_TOKENS if window is None else window
    summary["server"], markup = server(bundle, ids, kinds, steps, args.reps, window=window)
    if args.logprobs:
        lps = synthetic_logprobs(kinds)
        lp_server, lp_markup = server(bundle, ids, kinds, steps, args.reps, logprobs=lps, window=window)
        s0 = summary["server"]
        summary["logprobs"] = {
            "server": lp_server,
            "render_cold_ratio": round(lp_server["render_cold"]["median_ms"] / s0["render_cold"]["median_ms"], 2),
            "render_warm_ratio": round(lp_server["render_warm"]["median_ms"] / s0["render_warm"]["median_ms"], 2),
            "payload_ratio": round(lp_server["payload_json_bytes"] / s0["payload_json_bytes"], 3),
            "payload_gzip_ratio": round(lp_server["payload_gzip_bytes"] / s0["payload_gzip_bytes"], 3),
        }
        if not args.no_browser:
            summary["logprobs"]["browser"] = browser_lp(markup, lp_markup, args.reps, len(ids))
        if args.vs_full:
            full_server, full_markup = server(bundle, ids, kinds, steps, args.reps, logprobs=lps, window=False)
            summary["vs_full"] = {
                "full_server": full_server,
                "render_cold_ratio": round(lp_server["render_cold"]["median_ms"] / full_server["render_cold"]["median_ms"], 2),
                "payload_ratio": round(lp_server["payload_json_bytes"] / full_server["payload_json_bytes"], 3),
            }
            if not args.no_browser:
                summary["vs_full"]["browser"] = browser_lp(full_markup, lp_markup, args.reps, len(ids), names=("full", "windowed"))
    if not args.no_browser:
        full_markup = None
        if summary["input"]["windowed"] and not args.no_baseline:
            # the baseline of a windowed view: the server-built view of the same trace (its spans
            # flattened for the unchunked baseline, and painted as it is)
            summary["server_built"], full_markup = server(bundle, ids, kinds, steps, args.reps, window=False)
        summary["browser"] = browser(markup, args.reps, ids, full_markup, baseline=not args.no_baseline)
    s, b = summary["server"], summary.get("browser", {})
    summary["targets"] = {
        "server_render_le_200ms": s["render_cold"]["median_ms"] <= 200,
        "payload_le_2_5MB": s["payload_json_bytes"] <= 2.5e6,
        **({"browser_paint_le_1s": b["to_after_paint"]["median_ms"] <= 1000} if "to_after_paint" in b else {}),
    }
    if summary["input"]["windowed"]:  # issue 16, long traces: 128k tokens
        summary["targets"]["server_render_le_400ms"] = s["render_cold"]["median_ms"] <= 400
        summary["targets"]["bytes_le_8MB"] = s["payload_json_bytes"] <= 8e6
    if "logprobs" in summary:
        lp = summary["logprobs"]
        if summary["input"]["windowed"]:
            summary["targets"]["logprobs_bytes_le_8MB"] = lp["server"]["payload_json_bytes"] <= 8e6
            summary["targets"]["logprobs_server_render_le_400ms"] = lp["server"]["render_cold"]["median_ms"] <= 400
            if "browser" in lp:
                summary["targets"]["last_token_visible_next_frame"] = lp["browser"]["last_token_visible_next_frame"]
        else:  # issue 14 at 32k: against the mask-only view
            summary["targets"]["logprobs_payload_le_1_5x"] = lp["payload_ratio"] <= 1.5
        if "browser" in lp and "with_logprobs_to_after_paint" in lp["browser"]:
            summary["targets"]["logprobs_paint_le_1s"] = lp["browser"]["with_logprobs_to_after_paint"]["median_ms"] <= 1000
    if not args.json:
        print(f"{len(ids)} tokens, {len(steps)} steps; server render cold {s['render_cold']['median_ms']} ms, warm "
              f"{s['render_warm']['median_ms']} ms (decode+escape {s['baseline_decode_and_escape']['median_ms']} ms); "
              f"payload {s['payload_bytes'] / 1e6:.2f} MB", file=sys.stderr)
        if "to_after_paint" in b:
            print(f"browser: paint {b['to_after_paint']['median_ms']} ms (median of {args.reps})", file=sys.stderr)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return summary


if __name__ == "__main__":
    main()
