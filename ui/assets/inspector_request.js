// Steps asked for in the browser (a row of the step table, a chip or [ ] in the token view) go to
// the server through one hidden textbox, {{REQ}}: its value ("table:<step>:<n>" / "tokens:<step>:<n>",
// n counting requests so that each one is a change) is written as typing would write it, and its
// change event runs the handler. That runs with trigger_mode="always_last", and gradio gathers a
// deferred run's inputs when it runs it: after a quick series of picks, the last one wins.
// (Event data would not do: gradio re-runs a deferred event with the first event's data.)
// Runs after inspector_copy.js and link.js, in the same js_on_load (ui/inspector.py).
if (!window.__aliStepRequests) {
  window.__aliStepRequests = true;
  // The link: ?trace=<label>&step=<n>&tab=<the tab shown> (window.__aliLink, ui/assets/link.js,
  // which runs first). The tab is there so that reloading the page shows the tab it showed
  // (app_load opens the one named, see open_link / TAB_IDS).
  document.addEventListener('click', (e) => {
    if (e.target.closest && e.target.closest('[role=tab]')) requestAnimationFrame(() => window.__aliLink());
  }, true);
  // installed when the Inspector is first shown: link what it shows now
  requestAnimationFrame(() => {
    const t = document.querySelector('#insp-trace input'), s = document.querySelector('#insp-step input');
    const m = s ? /^([0-9]{1,9}) · /.exec(s.value) : null;
    window.__aliLink({trace: t ? t.value : null, step: m ? m[1] : null});
  });
  let n = 0;
  const ask = (value) => {
    const box = document.querySelector('#{{REQ}} textarea, #{{REQ}} input');
    if (!box) return;
    value += ':' + (++n);
    const proto = box.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(box, value);
    box.dispatchEvent(new Event('input', {bubbles: true}));
  };
  document.addEventListener('ali-step', (e) => { if (e.detail && e.detail.view === '{{PREFIX}}') ask('tokens:' + e.detail.step); });
  document.addEventListener('click', (e) => {
    const cell = e.target.closest ? e.target.closest('#insp-steps .body-cell[data-row]') : null;
    if (!cell) return;
    const first = document.querySelector('#insp-steps .body-cell[data-row="' + cell.dataset.row + '"][data-col="0"]');
    const step = first ? first.textContent.trim() : '';
    if (/^[0-9]{1,9}$/.test(step)) ask('table:' + step);
  }, true);
}
