(req) => {
  if (!String(req || '').startsWith('table:')) return;
  const d = document.getElementById('insp-step-details');
  if (!d) return;
  const r = d.getBoundingClientRect();
  const shown = Math.min(r.bottom, window.innerHeight) - Math.max(r.top, 0);
  if (shown < Math.min(r.height, window.innerHeight) * 0.5) window.scrollBy(0, r.top - 8);
}
