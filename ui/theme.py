"""The app's colours, for Gradio's light and dark themes, in one place.

Gradio follows the OS colour scheme (``?__theme=dark`` forces it) by putting a ``dark`` class on
``<body>`` and switching its own CSS variables. Our views set text AND background for every state
from the variables below (``--ali-*``), defined for ``:root`` (light) and ``.dark``. Every text
colour here has a WCAG contrast ratio of at least 4.5 against the background it is drawn on, in
both themes (tests/test_browser_inspector.py measures it in Chromium).

Chart colours (:data:`CHART`) are mid-tone: plots have a transparent background, so a bar is drawn
on the page's light or dark background, and each colour keeps at least 3:1 against both.
"""

from __future__ import annotations

# name -> (light, dark)
PALETTE: dict[str, tuple[str, str]] = {
    # page text of our own (info lines, legend totals), and its quieter variant
    "fg": ("#1f2937", "#e5e7eb"),
    "subdued": ("#4b5563", "#9ca3af"),
    # token view / template text / diff: the box
    "tv-bg": ("#ffffff", "#111827"),
    "tv-fg": ("#111827", "#e5e7eb"),
    # tokens by kind (two shades each, so neighbours are told apart) and their text
    "p0": ("#e5e7eb", "#1f2937"),
    "p1": ("#d1d5db", "#374151"),
    "p-fg": ("#111827", "#f3f4f6"),
    "g0": ("#bbf7d0", "#14532d"),
    "g1": ("#86efac", "#166534"),
    "g-fg": ("#052e16", "#dcfce7"),
    "j0": ("#fed7aa", "#7c2d12"),
    "j1": ("#fdba74", "#9a3412"),
    "j-fg": ("#431407", "#ffedd5"),
    # special tokens: a frame and their own text colour
    "sp-frame": ("#7c3aed", "#a78bfa"),
    "sp-fg": ("#5b21b6", "#ddd6fe"),
    # whitespace markers and escaped control bytes inside tokens
    "ws": ("#374151", "#d1d5db"),
    "ctl": ("#991b1b", "#fecaca"),
    # selection: the selected token's outline, the selected step's underline
    "tok-sel": ("#111827", "#f9fafb"),
    "step-sel": ("#b91c1c", "#fde047"),
    # step anchors in the token text, and the step chips above it
    "mark-bg": ("#1e3a8a", "#1e3a8a"),
    "mark-fg": ("#ffffff", "#ffffff"),
    "mark-sel-bg": ("#b91c1c", "#b91c1c"),
    "chip-bg": ("#f3f4f6", "#1f2937"),
    "chip-fg": ("#111827", "#f3f4f6"),
    "chip-border": ("#9ca3af", "#4b5563"),
    "chip-sel-bg": ("#1e3a8a", "#bfdbfe"),
    "chip-sel-fg": ("#ffffff", "#111827"),
    # the selected row of the step table
    "row-sel-bg": ("#dbeafe", "#1e3a8a"),
    "row-sel-fg": ("#1e3a8a", "#ffffff"),
    # status boxes
    "warn-bg": ("#fef3c7", "#451a03"),
    "warn-fg": ("#92400e", "#fde68a"),
    "err-bg": ("#fee2e2", "#450a0a"),
    "err-fg": ("#991b1b", "#fecaca"),
    "ok-bg": ("#d1fae5", "#022c22"),
    "ok-fg": ("#065f46", "#a7f3d0"),
    "info-bg": ("#f3f4f6", "#1f2937"),
    "info-fg": ("#1f2937", "#e5e7eb"),
    # special-token marks in template text
    "tsp-bg": ("#ede9fe", "#4c1d95"),
    "tsp-fg": ("#5b21b6", "#ede9fe"),
    # the template lab's diff
    "del-bg": ("#fee2e2", "#450a0a"),
    "del-fg": ("#7f1d1d", "#fecaca"),
    "add-bg": ("#dcfce7", "#052e16"),
    "add-fg": ("#14532d", "#bbf7d0"),
    "hl-bg": ("#fde047", "#854d0e"),
    "hl-fg": ("#111827", "#fef9c3"),
    # plots: axis text and grid lines (the dark theme overrides plotly's own colours)
    "chart-fg": ("#374151", "#e5e7eb"),
    "chart-grid": ("#e5e7eb", "#374151"),
}

# Plot colours: the same in both themes (>= 3:1 against white and against the dark page).
CHART: dict[str, str] = {
    "prompt": "#6b7280",
    "generated": "#16a34a",
    "injected": "#ea580c",
    "tools": "#ea580c",
    "render": "#3b82f6",
    "other": "#8b5cf6",
    "turns": "#3b82f6",
}


def css_variables() -> str:
    """``:root`` (light) and ``.dark`` declarations of every ``--ali-*`` colour."""
    light = " ".join(f"--ali-{k}: {v[0]};" for k, v in PALETTE.items())
    dark = " ".join(f"--ali-{k}: {v[1]};" for k, v in PALETTE.items())
    return f":root {{ {light} }}\n.dark {{ {dark} }}\n"
