// The page's link: window.__aliLink(set) writes the parameters in `set` into the address (null or
// '' removes one) and tab=<the tab shown>, with history.replaceState; `__theme` and the other
// parameters are kept. The Inspector writes trace= and step= (inspector_request.js), the GRPO
// group view group= and trace= (grpo_link.js); each script includes this one, whichever runs first
// defines it.
if (!window.__aliLink) {
  window.__aliLink = (set = {}) => {
    try {
      const u = new URL(window.location.href);
      for (const [k, v] of Object.entries(set)) { if (v === null || v === undefined || v === '') u.searchParams.delete(k); else u.searchParams.set(k, v); }
      const shown = ['playground', 'inspector', 'files', 'lab'].find((t) => { const e = document.getElementById('tab-' + t); return e && e.offsetParent !== null; });
      if (shown) u.searchParams.set('tab', shown);
      if (u.href !== window.location.href) window.history.replaceState(window.history.state, '', u.href);
    } catch (err) { /* a page without history (a sandboxed frame): no link */ }
  };
}
