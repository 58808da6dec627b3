"""Plotly figures for one trace (tokens per turn by mask, step timeline) and for a set of
traces (distributions of turns, response lengths, termination reasons).

Text that comes from traces (reasons, tool names) only goes into plotly data fields, which plotly
renders as SVG text, never as HTML. Plotly still reads a few tags in that text (``<b>``, ``<br>``,
``<a href>``) and drops unknown ones with their text, so trace text is passed through
:func:`_text` (``<``, ``>`` and ``&`` as entities, which plotly decodes): it shows as the
literal characters. Axis labels from traces are shortened (:func:`_labels`): one long label
would squeeze the plot to nothing.

Colours: the backgrounds are transparent, so a plot sits on the page's light or dark background;
bar colours are :data:`ui.theme.CHART` (mid-tones with at least 3:1 contrast on both), and the
dark theme recolours plotly's text and grid lines through the app's CSS (``ui/__init__.py``).
"""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.trace import Trace
from backend.trace.model import StepState as S
from ui.theme import CHART

COLORS = CHART
_LAYOUT = dict(margin=dict(l=40, r=10, t=40, b=40), height=300, template="plotly_white", legend=dict(orientation="h", y=-0.25),
               paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")


def _text(s: str) -> str:
    """Trace text for a plotly text field, shown literally (plotly knows &lt; &gt; &amp;, not &quot;)."""
    return html.escape(s, quote=False)


def _labels(names: list[str], limit: int = 24, escape: bool = True) -> list[str]:
    """Axis category labels: shortened, escaped (unless ``escape`` is false), and still one per name."""
    out: list[str] = []
    seen: set[str] = set()
    for n in names:
        short = n if len(n) <= limit else n[: limit - 1] + "…"
        label, k = short, 2
        while label in seen:
            label = f"{short} ({k})"
            k += 1
        seen.add(label)
        out.append(_text(label) if escape else label)
    return out


def _empty(title: str, note: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, **_LAYOUT)
    fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# public names for the other chart modules (ui/run_charts.py)
LAYOUT = _LAYOUT
plot_text = _text
axis_labels = _labels
empty_figure = _empty


def _turn_label(step: Any) -> str:
    short = {S.PENDING: "prompt", S.GENERATING: "gen", S.PROCESSING_TOOLS: "tools"}.get(step.state, step.state)
    return f"{step.index}·{short}"


def tokens_per_turn(trace: Trace | None) -> go.Figure:
    """One bar per step that appended tokens, stacked by what the tokens are."""
    title = "Tokens per step (by mask)"
    if trace is None:
        return _empty(title, "no trace")
    steps = [s for s in trace.steps if s.end > s.start]
    if not steps:
        # imported traces without steps: prompt / generated / injected totals
        gen = sum(trace.response_mask)
        inj = len(trace.response_mask) - gen
        steps_x = ["trace"]
        data = {"prompt": [len(trace.prompt_ids)], "generated": [gen], "injected": [inj]}
    else:
        steps_x = [_turn_label(s) for s in steps]
        data = {"prompt": [], "generated": [], "injected": []}
        full = trace.full_mask
        p = len(trace.prompt_ids)
        for s in steps:
            n_prompt = max(0, min(s.end, p) - s.start)
            seg = full[max(s.start, p) : s.end]
            g = sum(seg)
            data["prompt"].append(n_prompt)
            data["generated"].append(g)
            data["injected"].append(len(seg) - g)
    fig = go.Figure()
    for k in ("prompt", "generated", "injected"):
        if any(data[k]):
            fig.add_bar(name=k if k == "prompt" else f"{k} (mask {1 if k == 'generated' else 0})", x=steps_x, y=data[k],
                        marker_color=COLORS[k], hovertemplate="%{x}: %{y} tokens<extra>" + k + "</extra>")
    fig.update_layout(title=title, barmode="stack", xaxis_title="step", yaxis_title="tokens", **_LAYOUT)
    return fig


def step_timeline(trace: Trace | None) -> go.Figure:
    """Horizontal bars: when each step ran and for how long (generation vs tools vs rendering)."""
    title = "Step timeline (seconds from start)"
    if trace is None:
        return _empty(title, "no trace")
    steps = [s for s in trace.steps if s.state != S.TERMINATED]
    if not steps or all(not s.duration_s for s in steps):
        return _empty(title, "this trace has no step timings")
    t0 = min((s.started_at for s in steps if s.started_at), default=None)
    fig = go.Figure()
    kinds = {S.GENERATING: ("generation", COLORS["generated"]), S.PROCESSING_TOOLS: ("tools", COLORS["tools"]),
             S.PENDING: ("render prompt", COLORS["render"])}
    clock = 0.0
    seen: set[str] = set()
    for s in steps:
        start = (s.started_at - t0) if (t0 is not None and s.started_at) else clock
        clock = start + s.duration_s
        name, color = kinds.get(s.state, (s.state, COLORS["other"]))
        tool_names = _text(", ".join(r.name for r in s.tool_results))
        hover = f"step {s.index} {s.state}<br>{s.duration_s * 1000:.1f} ms" + (f"<br>{tool_names}" if tool_names else "")
        fig.add_bar(
            y=[_turn_label(s)], x=[max(s.duration_s, 1e-4)], base=[start], orientation="h", marker_color=color,
            name=name, showlegend=name not in seen, hovertext=[hover], hoverinfo="text",
        )
        seen.add(name)
    fig.update_layout(title=title, barmode="overlay", xaxis_title="seconds", **_LAYOUT)
    fig.update_yaxes(autorange="reversed")
    return fig


def file_distributions(traces: list[Trace]) -> go.Figure:
    """Turns, response lengths and termination reasons of a set of traces."""
    from backend.checks.labels import trace_termination_label

    return distributions([t.num_turns for t in traces], [len(t.response_ids) for t in traces],
                         [trace_termination_label(t) for t in traces])


def distributions(turns: list[int], response_tokens: list[int], ends: list[str]) -> go.Figure:
    """:func:`file_distributions` from the traces' numbers (an index's columns): assistant turns,
    response tokens and end states in words, one of each per trace."""
    if not turns:
        return _empty("Loaded traces", "no traces loaded")
    fig = make_subplots(rows=1, cols=3, subplot_titles=("assistant turns", "response tokens", "termination reason"))
    fig.add_histogram(x=list(turns), marker_color=COLORS["turns"], name="turns", row=1, col=1)
    fig.add_histogram(x=list(response_tokens), marker_color=COLORS["generated"], name="response tokens", row=1, col=2)
    # the same words as the table and the Inspector ("answered (no_tool_calls)", "imported (no end state)")
    reasons = Counter(ends)
    names = sorted(reasons, key=lambda r: -reasons[r])
    fig.add_bar(x=_labels(names), y=[reasons[r] for r in names], marker_color=COLORS["injected"], name="termination", row=1, col=3,
                hovertext=[_text(r[:300]) for r in names], hoverinfo="text+y")
    fig.update_layout(showlegend=False, **{**_LAYOUT, "height": 320, "margin": dict(l=40, r=10, t=50, b=40)})
    return fig
