// The Inspector's step header (ui/inspector.py), js_on_load of its gr.HTML: the Copy buttons. The
// clipboard API where the page may use it (https, localhost), else a hidden textarea and
// execCommand (plain http on a LAN address). The status line says which, so a failed copy is
// never silent.
element.addEventListener('click', async (e) => {
  const b = e.target.closest('button.ali-copy');
  if (!b || !element.contains(b)) return;
  const text = b.dataset.copy || '';
  let ok = false;
  try { await navigator.clipboard.writeText(text); ok = true; } catch (err) {
    const ta = document.createElement('textarea');
    ta.value = text; ta.setAttribute('readonly', ''); ta.style.position = 'fixed'; ta.style.opacity = '0';
    document.body.appendChild(ta); ta.select();
    try { ok = document.execCommand('copy'); } catch (err2) { ok = false; }
    ta.remove();
  }
  b.dataset.copied = ok ? 'yes' : 'no';
  const st = element.querySelector('.ali-copy-status');
  if (st) st.textContent = ok ? 'copied the ' + b.dataset.what + ' (' + JSON.parse(text).length + ')' : 'could not copy: the browser refused the clipboard';
});
