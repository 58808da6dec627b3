// The GRPO group view's note changed (a group or sample A picked, a filter, other traces): the
// group it shows and sample A go into the page's address as its link does (?group=<key>&trace=<id>,
// step= removed: it was the Inspector's trace's), so a reload or a copied address reopens them.
// The note is parsed, never inserted; a note that keeps the link (a link naming a group that is
// not among the traces shown: uploading the file again reopens it) leaves the address as it is.
// An event's js= (ui/grpo_groups.py), with link.js in {{LINK}}.
(note) => {
  {{LINK}}
  try {
    const doc = new DOMParser().parseFromString(typeof note === 'string' ? note : '', 'text/html');
    const a = doc.querySelector('a.gv-link');
    if (a && !doc.querySelector('[data-keep-link]')) {
      const q = new URLSearchParams((a.getAttribute('href') || '').replace(/^[^?]*\?/, ''));
      if (q.get('group')) window.__aliLink({group: q.get('group'), trace: q.get('trace'), step: null});
    }
  } catch (err) { /* no link */ }
  return [];
}
