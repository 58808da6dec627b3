(label, step) => {
  const has = step !== null && step !== undefined && step !== '';
  if (has && window.__aliTV) window.__aliTV.fromServer('{{PREFIX}}', step);
  const table = document.getElementById('insp-steps');
  let st = document.getElementById('ali-step-row-style');
  if (!st) { st = document.createElement('style'); st.id = 'ali-step-row-style'; document.head.appendChild(st); }
  if (has) {
    // the row whose "step" cell says this step; the table may not be drawn yet (the Inspector tab
    // is mounted when first opened): then row = step, as our traces number their steps
    let row = null;
    if (table) table.querySelectorAll('[data-row][data-col="0"]').forEach((c) => { if (c.textContent.trim() === String(step)) row = +c.dataset.row; });
    if (row === null) row = +step;
    const cell = '#insp-steps .body-cell[data-row="' + row + '"]';
    st.textContent = cell + ' { background: var(--ali-row-sel-bg) !important; color: var(--ali-row-sel-fg) !important; font-weight: 600; }\n'
      + cell + ' * { color: inherit !important; }\n'
      + cell + '.first-column { box-shadow: inset 4px 0 0 var(--ali-step-sel); }';
    const vp = table ? table.querySelector('.virtual-table-viewport') : null;
    const c0 = vp ? table.querySelector('[data-row="' + row + '"][data-col="0"]') : null;
    if (vp && c0) {
      const r = c0.getBoundingClientRect(), v = vp.getBoundingClientRect();
      const head = table.querySelector('thead, .thead, [role=rowgroup]');
      const top = v.top + (head ? Math.min(head.getBoundingClientRect().height, 80) : 0);
      if (r.top < top) vp.scrollTop += r.top - top - 4;
      else if (r.bottom > v.bottom) vp.scrollTop += r.bottom - v.bottom + 4;
    } else if (vp) {
      const rows = table.querySelectorAll('.virtual-row');
      const h = rows.length ? vp.scrollHeight / Math.max(rows.length, 1) : 40;
      vp.scrollTop = row * h;
    }
  } else { st.textContent = ''; }
  if (window.__aliLink) window.__aliLink({trace: label || null, step: has ? String(step) : null});
  return [label, step];
}
