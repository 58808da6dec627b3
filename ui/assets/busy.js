// When gradio's queue is full it answers queue/join with HTTP 503, and its page shows its own
// "This application is currently busy. Please try again." (the text is in gradio's JavaScript).
// The server says more in the 503's body (ui/sessions.py BusyWords: what happened and when to try
// again); this shows those words in a banner at the foot of the page (gradio's toasts are top right), as text (never markup), for 20 s.
(() => {
  const original = window.fetch;
  const show = (text) => {
    if (typeof text !== "string" || !text) return;
    let el = document.getElementById("ali-busy");
    if (!el) {
      el = document.createElement("div");
      el.id = "ali-busy";
      el.setAttribute("role", "alert");
      document.body.appendChild(el);
    }
    el.textContent = text;
    el.hidden = false;
    clearTimeout(show.timer);
    show.timer = setTimeout(() => { el.hidden = true; }, 20000);
  };
  window.fetch = async function (...args) {
    const response = await original.apply(this, args);
    try {
      const target = args[0];
      const url = typeof target === "string" ? target : (target && target.url) || String(target);
      if (response.status === 503 && url.includes("/queue/join")) {
        response.clone().json().then((body) => show(body && body.detail)).catch(() => {});
      }
    } catch (e) {
      // the page's own request goes on whatever this could not read
    }
    return response;
  };
})();
