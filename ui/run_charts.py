"""Charts of a trace set by training step (issue 16), drawn from its index alone.

Everything here reads :meth:`backend.trace.TraceIndex.frame` (one row per trace, the summary
columns), never a trace: a set of 100k traces is charted from its index in well under a second
(``bench/bench_run_charts.py``).

Groups: one per ``training_step`` (the index takes it from the trace's metadata, or from a verl
dump's ``<step>.jsonl`` file name), in step order, and one "no step" group for the traces that have
none. A set in which no trace has a step is grouped by file (when it spans several) or shown as one
group, and the note above the charts says so. Past :data:`MAX_GROUPS` steps (or files), consecutive
ones are merged into ranges (``100–102``), so the figure and the step pickers stay bounded.

Measures per group, as the axis titles and the comparison table name them:

* response tokens (``response_tokens``: every token after the prompt, generated and injected):
  median with the interquartile band (25th–75th percentile);
* assistant turns (``turns``): median with the interquartile band;
* termination: the share of the group's traces per end state, in the words of
  :func:`backend.checks.labels.termination_label` (``answered (no_tool_calls)``);
* tool errors: the share of traces with at least one tool error (``tool_errors`` > 0: a tool result
  with ok false, or an error of a tool step). The index does not count tool calls, so this is a
  rate over traces, not over calls; the hover and the table also give the mean count per trace;
* parse errors: the share of traces with at least one tool-call parse error of severity error
  (``parse_errors`` > 0), and the mean count per trace;
* score (``score``: metadata ``reward_score`` / ``score``): mean ± standard deviation over the
  group's traces that carry one; the panel says so when no trace does.

Text from traces or file names (termination codes this app does not know, file names) goes into
plotly text fields escaped (:func:`ui.charts.plot_text`) and into the note through
:func:`html.escape`.
"""

from __future__ import annotations

import html
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.checks.labels import termination_label
from backend.trace.model import TerminationReason
from ui.charts import LAYOUT, axis_labels, empty_figure, plot_text

NO_STEP = "no step"
MAX_GROUPS = 500  # more steps (or files) than this are shown as ranges of consecutive ones
ALL_TRACES = "all traces"
# the two sides of a comparison (>= 3:1 on the light and the dark page, see ui.theme.CHART)
COLOR_A = "#3b82f6"
COLOR_B = "#ea580c"
BAND_A = "rgba(59,130,246,0.22)"
# end-state colours by outcome (each >= 3:1 on white, #111827 and #0b0f19: tests/test_ui_run_charts.py)
OUTCOME_COLORS: dict[str, list[str]] = {
    "ok": ["#16a34a", "#059669"],
    "limit": ["#3b82f6", "#8b5cf6", "#0891b2", "#6366f1", "#0d9488"],
    "failure": ["#ea580c", "#dc2626", "#db2777", "#c026d3", "#d97706", "#e11d48"],
    "other": ["#6b7280", "#7c3aed"],
}
_OUTCOME = {termination_label(r.value): r.outcome for r in TerminationReason}

# rows of the comparison table
M_TRACES = "traces"
M_RESP_MEDIAN = "response tokens: median"
M_RESP_IQR = "response tokens: IQR (p75 − p25)"
M_RESP_MEAN = "response tokens: mean"
M_TURNS_MEDIAN = "assistant turns: median"
M_TURNS_MEAN = "assistant turns: mean"
M_TOOL_RATE = "traces with a tool error (%)"
M_TOOL_MEAN = "tool errors per trace: mean"
M_PARSE_RATE = "traces with a parse error (%)"
M_PARSE_MEAN = "parse errors per trace: mean"
M_SCORED = "traces with a score"
M_SCORE_MEAN = "score: mean"
M_SCORE_STD = "score: std"
TERM_PREFIX = "end state (%): "
TABLE_COLUMNS = ["measure", "A", "B", "B − A"]


@dataclass
class Grouped:
    """The index frame with its group per row: ``group`` (an ordered categorical of labels),
    ``by`` (``"training step"``, ``"file"`` or ``"all"``), ``note`` (plain text: how the set was
    grouped, for the page)."""

    frame: pd.DataFrame
    order: list[str]
    by: str
    note: str


def _numbers(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df.columns:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[col], errors="coerce").astype("float64")


def _file_label(path: Any, k: int) -> str:
    return os.path.basename(path) if isinstance(path, str) and path else f"file {k + 1}"


def group_frame(df: pd.DataFrame, file_names: list[str | None] | None = None) -> Grouped:
    """Group the rows of an index frame by training step (see the module's doc). ``file_names``:
    the index's file paths by the ``file`` column's number (for a set without steps)."""
    n = len(df)
    steps = _numbers(df, "training_step")
    has = steps.notna()
    work = pd.DataFrame({
        "response_tokens": _numbers(df, "response_tokens"), "turns": _numbers(df, "turns"),
        "tool_errors": _numbers(df, "tool_errors"), "parse_errors": _numbers(df, "parse_errors"),
        "score": _numbers(df, "score"),
        "termination": termination_labels(df["termination_reason"] if "termination_reason" in df.columns else pd.Series([None] * n)),
    }, index=df.index)
    if has.any():
        mask = has.to_numpy()
        values, inverse = np.unique(steps.to_numpy()[mask].astype("int64"), return_inverse=True)
        names, inverse = _ranges([str(v) for v in values.tolist()], inverse)
        order = names + ([NO_STEP] if not mask.all() else [])
        codes = np.full(n, len(names), dtype="int64")  # "no step" last
        codes[mask] = inverse
        labels = pd.Categorical.from_codes(codes, categories=order, ordered=True)
        missing = int((~mask).sum())
        note = f"{n} trace(s) in {len(values)} training step(s)"
        if len(names) < len(values):
            note += f", shown as {len(names)} ranges of consecutive steps"
        if missing:
            note += f"; {missing} without a step form the group “{NO_STEP}”"
        by = "training step"
    else:
        files = df["file"] if "file" in df.columns else pd.Series(0, index=df.index)
        distinct = sorted(pd.unique(files).tolist()) if n else []
        why = ("no trace in this set has a training step (metadata training_step / global_step / step, or a verl "
               "dump's <step>.jsonl file name)")
        if len(distinct) > 1:
            paths = list(file_names or [])
            names = axis_labels([_file_label(paths[int(f)] if int(f) < len(paths) else None, int(f)) for f in distinct],
                                limit=40, escape=False)
            ranged, pos = _ranges(names, np.arange(len(names)))
            mapping = {f: ranged[p] for f, p in zip(distinct, pos.tolist())}
            labels = files.map(mapping).astype(object)
            order = ranged
            note = f"{n} trace(s); {why}: grouped by file ({len(distinct)} files"
            note += f", shown as {len(ranged)} ranges of files)" if len(ranged) < len(names) else ")"
            by = "file"
        else:
            labels = pd.Series(ALL_TRACES, index=df.index, dtype=object)
            order = [ALL_TRACES] if n else []
            note = f"{n} trace(s); {why}: shown as one group" if n else "no traces in this set"
            by = "all"
    work["group"] = labels if isinstance(labels, pd.Categorical) else pd.Categorical(labels, categories=order, ordered=True)
    return Grouped(work, order, by, note)


def _ranges(names: list[str], inverse: np.ndarray) -> tuple[list[str], np.ndarray]:
    """At most :data:`MAX_GROUPS` groups: past that, consecutive groups are merged into ranges
    labelled ``first–last`` (a run of thousands of steps, or a file that gives every trace its
    own step, still draws a bounded figure and picker). Returns the labels and each row's new code."""
    if len(names) <= MAX_GROUPS:
        return names, inverse
    chunk = np.arange(len(names)) * MAX_GROUPS // len(names)  # group -> its range, in order
    firsts = np.searchsorted(chunk, np.arange(MAX_GROUPS), side="left")
    lasts = np.searchsorted(chunk, np.arange(MAX_GROUPS), side="right") - 1
    labels = [names[a] if a == b else f"{names[a]}–{names[b]}" for a, b in zip(firsts.tolist(), lasts.tolist())]
    return labels, chunk[inverse]


def termination_labels(codes: pd.Series) -> pd.Series:
    """:func:`backend.checks.labels.termination_label` of each code (computed once per distinct code)."""
    idx, uniques = pd.factorize(codes, use_na_sentinel=True)
    words = np.array([termination_label(str(c)) for c in uniques] + [termination_label(None)], dtype=object)
    return pd.Series(words[idx], index=codes.index, dtype=object)  # -1 (missing): the last entry


def by_group(g: Grouped) -> pd.DataFrame:
    """One row per group (in order): ``n``; ``resp_p25/resp_median/resp_p75/resp_mean``;
    ``turns_p25/turns_median/turns_p75/turns_mean``; ``tool_error_rate`` / ``parse_error_rate``
    (% of the group's traces with at least one; NaN when the index has no such column),
    ``tool_errors_mean`` / ``parse_errors_mean``; ``score_n``, ``score_mean``, ``score_std``
    (sample standard deviation, NaN for fewer than two scores)."""
    f = g.frame
    idx = pd.Index(g.order, name="group")
    if f.empty:
        return pd.DataFrame({"n": np.zeros(len(g.order), dtype="int64")}, index=idx)
    work = f[["group", "response_tokens", "turns", "tool_errors", "parse_errors", "score"]].copy()
    for col, pre in (("tool_errors", "tool"), ("parse_errors", "parse")):
        work[f"{pre}_hit"] = (f[col] > 0).astype("float64").where(f[col].notna()) * 100
    gb = work.groupby("group", observed=False, sort=True)
    q = gb[["response_tokens", "turns"]].quantile([0.25, 0.5, 0.75])  # rows: (group, q), in group order
    mean = gb.mean()
    cols: dict[str, Any] = {"n": gb.size().to_numpy().astype("int64")}
    for col, pre in (("response_tokens", "resp"), ("turns", "turns")):
        v = q[col].to_numpy().reshape(len(g.order), 3)
        cols[f"{pre}_p25"], cols[f"{pre}_median"], cols[f"{pre}_p75"] = v[:, 0], v[:, 1], v[:, 2]
        cols[f"{pre}_mean"] = mean[col].to_numpy()
    for col, pre in (("tool_errors", "tool"), ("parse_errors", "parse")):
        cols[f"{pre}_error_rate"] = mean[f"{pre}_hit"].to_numpy()
        cols[f"{pre}_errors_mean"] = mean[col].to_numpy()
    cols["score_n"] = gb["score"].count().to_numpy().astype("int64")
    cols["score_mean"] = mean["score"].to_numpy()
    cols["score_std"] = gb["score"].std().to_numpy()
    return pd.DataFrame(cols, index=idx)


def termination_shares(g: Grouped) -> pd.DataFrame:
    """Share (%) of each group's traces per end-state label: groups × labels (most common first)."""
    f = g.frame
    if f.empty:
        return pd.DataFrame(index=pd.Index(g.order, name="group"))
    counts = f.groupby(["group", "termination"], observed=True).size().unstack(fill_value=0)
    counts = counts.reindex(pd.CategoricalIndex(g.order, categories=g.order, ordered=True), fill_value=0)
    counts.index = pd.Index(g.order, name="group")
    counts.columns = pd.Index(list(counts.columns), dtype=object)
    total = counts.sum(axis=1).replace(0, np.nan)
    shares = counts.div(total, axis=0) * 100
    return shares[counts.sum(axis=0).sort_values(ascending=False, kind="stable").index]


def termination_colors(labels: list[str]) -> dict[str, str]:
    """A colour per end-state label: green shades for normal ends, blue/violet for limits,
    orange/red for failures, grey for no end state and codes this app does not know."""
    used: dict[str, int] = {}
    out = {}
    for lab in labels:
        outcome = _OUTCOME.get(lab, "other")
        pal = OUTCOME_COLORS[outcome]
        k = used.get(outcome, 0)
        used[outcome] = k + 1
        out[lab] = pal[k % len(pal)]
    return out


# ---- figures ------------------------------------------------------------------------------------


def _panel_note(fig: go.Figure, k: int, text: str) -> None:
    """A note in the middle of subplot ``k``, placed in paper coordinates from the subplot's
    domains (an "xK domain" reference lands in the wrong panel when subplot K has no trace)."""
    ax = "" if k == 1 else str(k)
    xd, yd = fig.layout[f"xaxis{ax}"].domain, fig.layout[f"yaxis{ax}"].domain
    fig.add_annotation(text=text, showarrow=False, x=(xd[0] + xd[1]) / 2, y=(yd[0] + yd[1]) / 2, xref="paper", yref="paper")


def steps_figure(g: Grouped, stats: pd.DataFrame | None = None, shares: pd.DataFrame | None = None) -> go.Figure:
    """Six panels over the groups: response tokens and turns (median, IQR band), end-state shares
    (stacked), tool-error and parse-error rates (% of traces), score (mean ± std)."""
    title = "By training step" if g.by == "training step" else "By file" if g.by == "file" else "All traces"
    if not g.order:
        return empty_figure(title, "no traces in this set")
    stats = by_group(g) if stats is None else stats
    shares = termination_shares(g) if shares is None else shares
    x = axis_labels(g.order, limit=24)
    xtitle = {"training step": "training step", "file": "file", "all": ""}[g.by]
    fig = make_subplots(rows=2, cols=3, horizontal_spacing=0.07, vertical_spacing=0.2, subplot_titles=(
        "response tokens (median, p25–p75)", "assistant turns (median, p25–p75)", "end state (% of traces)",
        "traces with a tool error (%)", "traces with a parse error (%)", "score (mean ± std)"))
    n = stats["n"].to_numpy()
    mode = "lines+markers" if len(x) > 1 else "markers"
    for col, pre, color, band in ((1, "resp", "#16a34a", "rgba(22,163,74,0.22)"), (2, "turns", COLOR_A, BAND_A)):
        lo, med, hi = stats[f"{pre}_p25"].to_numpy(), stats[f"{pre}_median"].to_numpy(), stats[f"{pre}_p75"].to_numpy()
        fig.add_scatter(x=x, y=hi, mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip", row=1, col=col)
        fig.add_scatter(x=x, y=lo, mode="lines", line=dict(width=0), fill="tonexty", fillcolor=band, showlegend=False,
                        hoverinfo="skip", row=1, col=col)
        fig.add_scatter(x=x, y=med, mode=mode, line=dict(color=color), marker=dict(color=color, size=6), showlegend=False,
                        customdata=np.stack([lo, hi, n], axis=1), row=1, col=col,
                        hovertemplate="%{x}: median %{y}<br>p25 %{customdata[0]} · p75 %{customdata[1]}<br>%{customdata[2]} trace(s)<extra></extra>")
    colors = termination_colors(list(shares.columns))
    for lab in shares.columns:
        fig.add_bar(x=x, y=shares[lab].to_numpy(), name=plot_text(lab if len(lab) <= 40 else lab[:39] + "…"), marker_color=colors[lab],
                    legendgroup="end", hovertemplate="%{x}: %{y:.1f}%<extra>" + plot_text(lab[:200]) + "</extra>", row=1, col=3)
    for k, (col, pre, color) in enumerate(((1, "tool", "#ea580c"), (2, "parse", "#8b5cf6"))):
        rate = stats[f"{pre}_error_rate"].to_numpy()
        if np.isnan(rate).all():
            _panel_note(fig, 4 + k, "not in this index")
            continue
        fig.add_scatter(x=x, y=rate, mode=mode, line=dict(color=color), marker=dict(color=color, size=6), showlegend=False,
                        customdata=np.stack([stats[f"{pre}_errors_mean"].to_numpy(), n], axis=1), row=2, col=col,
                        hovertemplate="%{x}: %{y:.1f}% of traces<br>%{customdata[0]:.2f} per trace<br>%{customdata[1]} trace(s)<extra></extra>")
        top = float(np.nanmax(rate))
        fig.update_yaxes(range=[0, max(5.0, min(100.0, top * 1.15))], row=2, col=col)  # a percentage axis, not 0..1
    if stats["score_n"].sum() == 0:
        _panel_note(fig, 6, "no trace carries a score")
    else:
        std = stats["score_std"].fillna(0).to_numpy()
        fig.add_scatter(x=x, y=stats["score_mean"].to_numpy(), mode=mode, error_y=dict(type="data", array=std, visible=True, color="#6b7280"),
                        line=dict(color="#0d9488"), marker=dict(color="#0d9488", size=6), showlegend=False,
                        customdata=np.stack([std, stats["score_n"].to_numpy()], axis=1), row=2, col=3,
                        hovertemplate="%{x}: mean %{y:.3f} ± %{customdata[0]:.3f}<br>%{customdata[1]} scored trace(s)<extra></extra>")
    for r in (1, 2):
        for c in (1, 2, 3):
            fig.update_xaxes(type="category", title_text=xtitle if r == 2 else None, row=r, col=c)
    fig.update_yaxes(range=[0, 100], row=1, col=3)
    fig.update_layout(title=title, barmode="stack", **{**LAYOUT, "height": 600, "legend": dict(orientation="h", y=-0.18),
                                                       "margin": dict(l=40, r=10, t=60, b=40)})
    return fig


def _hist(a: np.ndarray, b: np.ndarray, integer: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Shared bins for two samples: (bin centres, share % of A, share % of B, bin width)."""
    both = np.concatenate([a, b])
    lo, hi = float(both.min()), float(both.max())
    if integer and hi - lo <= 60:
        edges = np.arange(lo - 0.5, hi + 1.5)
    else:  # the square-root rule, 5 to 30 bins
        edges = np.linspace(lo, hi if hi > lo else lo + 1, min(30, max(5, int(np.sqrt(len(both))))) + 1)
    ha = np.histogram(a, edges)[0] / max(len(a), 1) * 100
    hb = np.histogram(b, edges)[0] / max(len(b), 1) * 100
    return (edges[:-1] + edges[1:]) / 2, ha, hb, float(edges[1] - edges[0])


def compare(g: Grouped, a: str | None, b: str | None) -> tuple[go.Figure, pd.DataFrame, str]:
    """Step A against step B: overlaid distributions (response tokens and turns as % of each
    step's traces, end-state shares side by side), the table of measures (:data:`TABLE_COLUMNS`;
    ``B − A`` for every row) and a note (plain text; empty when both sides are fine)."""
    title = "Compare two steps"
    empty = pd.DataFrame([], columns=TABLE_COLUMNS)
    if len(g.order) < 2:
        why = "no traces in this set" if not g.order else f"only one group ({g.order[0]}): nothing to compare"
        return empty_figure(title, plot_text(why)), empty, why
    for side, v in (("A", a), ("B", b)):
        if v not in g.order:
            why = f"pick step {side}" if not v else f"step {side} ({v}) is not in this trace set"
            return empty_figure(title, plot_text(why)), empty, why
    note = "A and B are the same group: pick two different ones" if a == b else ""
    f = g.frame
    fa, fb = f[f["group"] == a], f[f["group"] == b]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=("response tokens (% of traces)", "assistant turns (% of traces)", "end state (% of traces)"))
    name_a, name_b = plot_text(f"A: {a}"[:40]), plot_text(f"B: {b}"[:40])
    for col, c, integer in ((1, "response_tokens", False), (2, "turns", True)):
        va, vb = fa[c].dropna().to_numpy(), fb[c].dropna().to_numpy()
        if not len(va) and not len(vb):
            continue
        centres, ha, hb, width = _hist(va, vb, integer)
        fig.add_bar(x=centres, y=ha, name=name_a, marker_color=COLOR_A, legendgroup="A", showlegend=col == 1, row=1, col=col,
                    hovertemplate="%{x}: %{y:.1f}% of A<extra></extra>")
        fig.add_bar(x=centres, y=hb, name=name_b, marker_color=COLOR_B, legendgroup="B", showlegend=col == 1, row=1, col=col,
                    hovertemplate="%{x}: %{y:.1f}% of B<extra></extra>")
    shares = termination_shares(Grouped(pd.concat([fa, fb]), [a, b] if a != b else [a], g.by, ""))
    labels = list(shares.columns)
    xl = axis_labels(labels, limit=24)
    for side, name, color in ((a, name_a, COLOR_A), (b, name_b, COLOR_B)):
        fig.add_bar(x=xl, y=shares.loc[side].to_numpy() if labels else [], name=name, marker_color=color, legendgroup=name[0],
                    showlegend=False, row=1, col=3, hovertext=[plot_text(x[:300]) for x in labels],
                    hovertemplate="%{hovertext}: %{y:.1f}%<extra>" + name + "</extra>")
    fig.update_xaxes(title_text="response tokens", row=1, col=1)
    fig.update_xaxes(title_text="turns", row=1, col=2)
    fig.update_xaxes(type="category", row=1, col=3)
    fig.update_layout(title=title, barmode="group", bargap=0.1, **{**LAYOUT, "height": 360, "margin": dict(l=40, r=10, t=60, b=40)})
    return fig, compare_table(fa, fb, labels), note


def _measures(f: pd.DataFrame, labels: list[str]) -> dict[str, float]:
    n = len(f)
    resp, turns = f["response_tokens"].dropna(), f["turns"].dropna()
    m: dict[str, float] = {
        M_TRACES: n,
        M_RESP_MEDIAN: resp.median(), M_RESP_IQR: resp.quantile(0.75) - resp.quantile(0.25), M_RESP_MEAN: resp.mean(),
        M_TURNS_MEDIAN: turns.median(), M_TURNS_MEAN: turns.mean(),
    }
    for col, rate, mean in (("tool_errors", M_TOOL_RATE, M_TOOL_MEAN), ("parse_errors", M_PARSE_RATE, M_PARSE_MEAN)):
        v = f[col].dropna()
        m[rate] = (v > 0).mean() * 100 if len(v) else np.nan
        m[mean] = v.mean() if len(v) else np.nan
    s = f["score"].dropna()
    m[M_SCORED] = len(s)
    m[M_SCORE_MEAN] = s.mean() if len(s) else np.nan
    m[M_SCORE_STD] = s.std() if len(s) > 1 else np.nan
    counts = f["termination"].value_counts()
    for lab in labels:
        key, k = TERM_PREFIX + _short(lab), 2
        while key in m:  # two long labels that start alike
            key, k = f"{TERM_PREFIX}{_short(lab)} ({k})", k + 1
        m[key] = counts.get(lab, 0) / n * 100 if n else np.nan
    return m


def _short(label: str, limit: int = 60) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def compare_table(fa: pd.DataFrame, fb: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """The measures of A and B (:data:`M_TRACES` ...; one ``end state (%)`` row per label) and
    B − A, rounded to 3 decimals (NaN where a side has no value)."""
    ma, mb = _measures(fa, labels), _measures(fb, labels)
    rows = [[k, ma[k], mb[k], mb[k] - ma[k]] for k in ma]
    df = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for c in TABLE_COLUMNS[1:]:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64").round(3)
    return df


def default_pair(order: list[str]) -> tuple[str | None, str | None]:
    """The first and the last training step (or group); ``no step`` is never picked by default
    when there are two steps."""
    steps = [x for x in order if x != NO_STEP] if len([x for x in order if x != NO_STEP]) >= 2 else order
    if not steps:
        return None, None
    return steps[0], steps[-1]


# ---- the Trace files tab's section ------------------------------------------------------------------


@dataclass
class RunChartsUI:
    note: Any
    steps: Any
    step_a: Any
    step_b: Any
    compare_note: Any
    compare_plot: Any
    table: Any
    key: Any  # gr.State: what the charts show now (skips a redraw when a filter changed the table only)


def _set_of(session: Any) -> tuple[Any, int] | None:
    """The session's trace set (a folder or glob the tab shows) and its version, or None when the
    tab shows a file (the same test as ui.trace_sets.in_set_mode). Raises TraceFileError when the set
    cannot be read."""
    spec, reg = getattr(session, "set_spec", None), getattr(session, "set_registry", None)
    if not spec or reg is None:
        return None
    return reg.get(spec)


def session_frame(session: Any) -> tuple[pd.DataFrame, list[str | None], str]:
    """The index frame of the Trace files tab's current set, its files' paths and a key that
    changes when the rows do: the trace set's index (a folder or glob; its version grows as a
    followed run is written), the uploaded file's index (``session.file_index``), or an index over
    the traces in memory (the samples)."""
    from backend.trace import TraceIndex

    held = _set_of(session)
    if held is not None:
        ts, version = held
        return ts.df, [getattr(f, "path", None) for f in ts.files], f"set:{id(ts)}:{version}:{len(ts)}"
    ix = getattr(session, "file_index", None)
    key = f"file:{id(ix)}:{len(ix) if ix is not None else -1}:{len(session.file_traces)}:{session.file_name}"
    if ix is None or len(ix) != len(session.file_traces):
        ix = TraceIndex.of_traces([session.traces[x] for x in session.file_traces if x in session.traces])
    return ix.df, [getattr(f, "path", None) for f in ix.files], key


def note_html(text: str, kind: str = "info") -> str:
    return f'<div class="ali-{kind}">{html.escape(text)}</div>' if text else ""


def build(ctx: Any = None) -> RunChartsUI:
    import gradio as gr

    with gr.Accordion("Charts by training step", open=True, elem_id="rc-section"):
        note = gr.HTML(elem_id="rc-note")
        steps = gr.Plot(show_label=False, elem_id="rc-steps")
        with gr.Row():
            step_a = gr.Dropdown(label="Compare step A", choices=[], value=None, elem_id="rc-step-a")
            step_b = gr.Dropdown(label="with step B", choices=[], value=None, elem_id="rc-step-b")
        compare_note = gr.HTML(elem_id="rc-compare-note")
        compare_plot = gr.Plot(show_label=False, elem_id="rc-compare")
        table = gr.Dataframe(headers=TABLE_COLUMNS, value=pd.DataFrame([], columns=TABLE_COLUMNS), interactive=False,
                             label="A against B", elem_id="rc-diff", max_height=360)
        key = gr.State("")
    return RunChartsUI(note, steps, step_a, step_b, compare_note, compare_plot, table, key)


# A trace set is shared by every session that shows it (the app's SetRegistry), and a followed run
# changes its version up to once a second: its charts are drawn once per version, whatever the
# number of sessions watching, and kept while the set object lives (weakly keyed, so a set the
# registry lets go takes its charts with it).
_DRAWN: weakref.WeakKeyDictionary[Any, tuple[str, Grouped, list[Any]]] = weakref.WeakKeyDictionary()
_DRAWN_LOCK = threading.Lock()
_DRAWN_STATS = {"drawn": 0, "reused": 0}


def _drawn(session: Any, draw: bool = True) -> tuple[Grouped, list[Any] | None, str]:
    """(the grouped frame, [note, steps figure, step A, step B, compare note, compare figure,
    table] for the default pair, key) of the session's current set; raises UserError. With
    ``draw`` false only the grouped frame is made when nothing is kept (the values are then None)."""
    held = _set_of(session)
    ts = held[0] if held is not None else None
    df, files, key = session_frame(session)
    if ts is not None:
        with _DRAWN_LOCK:
            hit = _DRAWN.get(ts)
        if hit is not None and hit[0] == key:
            _DRAWN_STATS["reused"] += 1
            return hit[1], hit[2], key
    g = group_frame(df, files)
    if not draw:
        return g, None, key
    a, b = default_pair(g.order)
    fig, table, why = compare(g, a, b)
    values = [note_html(g.note), steps_figure(g), {"choices": g.order, "value": a}, {"choices": g.order, "value": b},
              note_html(why, "warn"), fig, table]
    _DRAWN_STATS["drawn"] += 1
    if ts is not None:
        with _DRAWN_LOCK:
            _DRAWN[ts] = (key, g, values)
    return g, values, key


def refresh(session: Any) -> tuple[list[Any], str]:
    """The section's values for the session's current set: [note, steps figure, step A dropdown,
    step B dropdown, compare note, compare figure, table], and the set's key."""
    import gradio as gr

    from backend.errors import UserError

    try:
        _, values, key = _drawn(session)
    except UserError as e:  # a trace set that cannot be read: the set's own status says more
        why = f"no charts: {e}"
        return [note_html(why, "warn"), empty_figure("By training step", plot_text(why[:200])), gr.update(choices=[], value=None),
                gr.update(choices=[], value=None), "", empty_figure("Compare two steps", ""),
                pd.DataFrame([], columns=TABLE_COLUMNS)], ""
    note, fig_steps, dd_a, dd_b, why, fig, table = values
    return [note, fig_steps, gr.update(**dd_a), gr.update(**dd_b), why, fig, table.copy()], key


def on_compare(session: Any, a: str | None, b: str | None) -> list[Any]:
    """[compare note, compare figure, table] for steps ``a`` and ``b`` of the current set."""
    from backend.errors import UserError

    try:
        g = _drawn(session, draw=False)[0]
    except UserError as e:
        return [note_html(f"no comparison: {e}", "warn"), empty_figure("Compare two steps", ""), pd.DataFrame([], columns=TABLE_COLUMNS)]
    fig, table, why = compare(g, a, b)
    return [note_html(why, "warn"), fig, table]


def wire(ui: RunChartsUI, session: Any, triggers: list[Any]) -> None:
    """Redraw when any of ``triggers`` changes (the trace table: set on page load, upload and
    filtering; a filter leaves the set, and so the charts, as they are); the step pickers redraw
    the comparison."""
    import gradio as gr

    outs = [ui.note, ui.steps, ui.step_a, ui.step_b, ui.compare_note, ui.compare_plot, ui.table]

    def on_change(sess: Any, key: str):
        from backend.errors import UserError

        try:
            same = bool(key) and session_frame(sess)[2] == key
        except UserError:
            same = False
        if same:  # a filter or a page: the same rows
            return [gr.skip()] * (len(outs) + 1)
        values, k = refresh(sess)
        return [*values, k]

    for t in triggers:
        t.change(on_change, [session, ui.key], [*outs, ui.key], api_visibility="private", trigger_mode="always_last")
    for dd in (ui.step_a, ui.step_b):
        dd.input(on_compare, [session, ui.step_a, ui.step_b], [ui.compare_note, ui.compare_plot, ui.table],
                 api_visibility="private")
