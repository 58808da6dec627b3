"""The app's CSS and JavaScript, as files beside this module, handed to gradio as strings.

``app.css`` (the page's rules; ``ui/__init__.py`` puts the theme's variables first),
``token_view.css`` / ``token_view.js`` (the token view's ``gr.HTML``: ``css_template``,
``js_on_load``), ``inspector_*.js`` (the Inspector's step header, step requests and events'
``js=``), ``logprob_lens.css`` / ``logprob_lens.js``. Each module that uses one reads it once, at
import, into a module constant (``token_view.CSS``...), and passes it to gradio as before. A
file's leading comment (``/* ... */`` or ``//`` lines) is for its readers: :func:`read` leaves it
out of what is sent to every page.

A file may hold ``{{NAME}}`` placeholders for what Python knows (an element id): :func:`fill`
replaces them, and raises when a placeholder is left or a value has none, so an id renamed on
one side cannot go stale on the other. CSS files hold none (gradio reads ``css_template`` as a
template: no double brace there).
"""

from __future__ import annotations

import re
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
PLACEHOLDER = re.compile(r"\{\{([A-Z][A-Z0-9_]*)\}\}")


def read(name: str) -> str:
    """The text of the asset ``name`` (a file name in this folder), without its leading comment."""
    text = (FOLDER / name).read_text(encoding="utf-8")
    if text.startswith("/*"):
        return text[text.index("*/") + 2 :].lstrip("\n")
    lines = text.split("\n")
    while lines and lines[0].startswith("//"):
        lines.pop(0)
    return "\n".join(lines)


def fill(text: str, **values: str) -> str:
    """``text`` with each ``{{NAME}}`` replaced by ``values[NAME]``; every placeholder must get a
    value and every value must have a placeholder (ValueError otherwise)."""
    names = set(PLACEHOLDER.findall(text))
    if names != set(values):
        raise ValueError(f"placeholders {sorted(names)} but values for {sorted(values)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
