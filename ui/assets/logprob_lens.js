// The logprob lens's worst tokens (ui/logprob_lens.py), js_on_load of their gr.HTML. A button:
// select its step first when the token view ({{VIEW}}, the elem_id of its gr.HTML) shows another
// one (the view's own pick: highlighted at once, the "ali-step" event asks the server,
// ui/inspector.py), then "tv-select" on the view's root with the token's position (token_view's
// interface). Where no listener selected it (an older token view), the token is selected here.
element.addEventListener('click', (e) => {
  const b = e.target.closest('button.ali-lens-tok');
  if (!b || !element.contains(b)) return;
  const tv = document.querySelector('#{{VIEW}} .tv');
  if (!tv) return;
  const index = +b.dataset.pos, step = b.dataset.step;
  const TV = window.__aliTV;
  if (tv.dataset.sel !== step) {
    if (TV && TV.selectStep && TV.sent) { TV.selectStep(tv, step, false); TV.sent(tv.id, step); }
    tv.dispatchEvent(new CustomEvent('ali-step', {bubbles: true, detail: {view: tv.id, step: +step}}));
  }
  tv.dispatchEvent(new CustomEvent('tv-select', {detail: {index: index}}));
  element.querySelectorAll('button.ali-lens-tok.sel').forEach((x) => x.classList.remove('sel'));
  b.classList.add('sel');
  requestAnimationFrame(() => {
    if (!TV || !TV.current || !TV.indexOf || !TV.tokenAt || !TV.selectToken) return;
    const cur = TV.current(tv);
    if (cur && TV.indexOf(cur) + +(tv.dataset.first || 0) === index) return;
    const el = TV.tokenAt(tv, index - +(tv.dataset.first || 0));
    if (el) TV.selectToken(tv, el, true);
  });
});
