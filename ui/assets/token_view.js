// The token view (ui/token_view.py), the js_on_load of its gr.HTML.
//
// First, behaviour shared by every token view on the page and by the events' `js=`
// (select_step_js in ui/token_view.py): installed once, as window.__aliTV. Reads only data
// attributes and text of our own markup.
//   selectStep(tv, step, scroll): the step's anchor, chip and tokens highlighted (scrolled to)
//   selectToken(tv, span): the token outlined, kept in view, described in the info line
//   apply(root): makes token boxes focusable and re-applies the server-rendered selection
//                (data-sel), on load and after a value update
//
// Then the listeners of one view ("---- this view's listeners"): js_on_load runs once per
// component; `element` survives value updates, so all behaviour is delegated from it. Tokens:
// hover shows one in the info line; click (or tap) selects it; with the token box focused, ← →
// move the selection, [ ] go to the previous / next step, Esc clears. A step chosen here (chip,
// [ ]) is announced as a DOM event, "ali-step" ({view: the view's id, step}), bubbling from the
// view: the Inspector listens for it and asks the server for that step (ui/inspector.py). (Not
// gr.HTML's trigger('select', data): gradio re-runs a deferred event with the first event's
// data, so quick picks would lose the last one.)
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

// ---- this view's listeners ----
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
