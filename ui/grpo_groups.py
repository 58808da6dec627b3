"""The GRPO group view of the Trace files tab (issue 30, item 5): the samples of one prompt side by
side, ranked by reward, and two of them aligned token by token.

What the tab shows (an upload, the samples, or a trace set: ``ui.trace_files.audit_source`` gives
them, read one at a time, the first :data:`MAX_TRACES`) is grouped by :func:`backend.checks.groups.group_traces`
(``metadata.group``, else verl's ``uid``, else the prompt, within a training step) when the section
is first opened (or a link names a group), one trace at a time, at most :data:`MAX_READ_TOKENS`
response tokens. The groups are kept in the session (small: numbers and ids, never the traces)
until the tab shows other traces.

* filters: training step, reward (the groups whose rewards differ, or those whose rewards are all
  equal: no learning signal), and the group itself;
* the group's table: rank, the tab's row (``#``), id, reward, advantage, response tokens, generated
  tokens (mask 1), end state, and where the sample departs from the best one;
* two samples (A and B, by default the best and the worst) side by side: their response tokens,
  the part they share in the prompt colours, from the first token where they differ on in the
  mask colours (generated / injected), that token framed;
* a link to the group (``?tab=files&group=<key>&trace=<id of A>``): opened in a session that holds
  those traces (the samples, a trace set), it shows that group with that sample as A.

Everything from a trace (ids, prompts, token text, end states) is escaped: the token pieces by
:func:`ui.token_view.fragments`, the rest by :func:`html.escape`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import gradio as gr
import pandas as pd

from backend.checks.groups import Group, departure, find_group, group_traces, response_text
from backend.loading.token_text import decoder_for
from ui import assets
from ui.token_view import fragments

MAX_TRACES = 2_000  # traces grouped at most (the first ones the tab shows); the note says when cut
MAX_READ_TOKENS = 8_000_000  # and response tokens read for it at most (about 64 MB kept while grouping)
MAX_TOKENS = 4_096  # response tokens shown per side of the aligned view
ALL = "(all)"
SIGNAL = "rewards differ (learning signal)"
NO_SIGNAL = "all rewards equal (no signal)"
REWARD_CHOICES = [ALL, SIGNAL, NO_SIGNAL]
COLUMNS = ["rank", "#", "id", "reward", "advantage", "tokens", "generated", "end", "departs at"]
CSS = assets.read("grpo_groups.css")
# the group and sample A shown go into the page's address (?group=&trace=) when the note changes
LINK_JS = assets.fill(assets.read("grpo_link.js"), LINK=assets.read("link.js"))


@dataclass
class Held:
    """The groups of what the tab shows, kept in the session (``session.groups``)."""

    key: str
    groups: list[Group]
    open: list[Callable[[], Any]]  # row of the grouped traces -> the trace (read again when shown)
    rows: list[int]  # row of the grouped traces -> the tab's row (#)
    total: int  # traces the tab shows
    skipped: list[str]  # traces that could not be read, with why


def _fmt(v: Any) -> str:
    return "" if v is None else f"{v:.4g}"


def held(session: Any, source: Callable[..., Any]) -> Held:
    """The session's groups, grouped again when the tab shows other traces."""
    src = source(session, MAX_TRACES)
    h = getattr(session, "groups", None)
    if isinstance(h, Held) and h.key == src.key and h.total == src.total:
        return h
    opens: list[Callable[[], Any]] = []
    rows: list[int] = []
    skipped: list[str] = []

    def read():  # one trace at a time, within MAX_READ_TOKENS
        budget = MAX_READ_TOKENS
        for item in src.items:
            if budget <= 0:
                return
            try:
                t = item.open()
            except Exception as e:  # noqa: BLE001 - a bad record: said in the note, the rest grouped
                skipped.append(f"{item.id}: {str(e)[:200]}")
                continue
            budget -= len(t.response_ids) or sum(len(str(m.get("content") or "")) for m in t.messages) // 4
            opens.append(item.open)
            rows.append(item.row)
            yield t

    groups = group_traces(read())
    h = Held(src.key, groups, opens, rows, src.total, skipped)
    session.groups = h
    return h


def group_label(g: Group) -> str:
    step = f"step {g.step}" if g.step is not None else "no step"
    prompt = g.prompt if len(g.prompt) <= 60 else g.prompt[:59] + "…"
    n = f"{len(g.samples)} sample{'s' if len(g.samples) != 1 else ''}"
    mean = f"mean {_fmt(g.mean)}" if g.mean is not None else "no reward"
    return f"{step} · {prompt} · {n}, {mean}" + (" · no signal" if g.all_equal else "")


def step_choices(groups: list[Group]) -> list[str]:
    steps = sorted({g.step for g in groups if g.step is not None})
    return [ALL, *(str(s) for s in steps)] + (["(no step)"] if any(g.step is None for g in groups) else [])


def matching(groups: list[Group], step: str | None, reward: str | None) -> list[Group]:
    """The groups the step and reward filters keep."""
    out = groups
    if step and step != ALL:
        out = [g for g in out if (g.step is None if step == "(no step)" else str(g.step) == step)]
    if reward == SIGNAL:
        out = [g for g in out if len(g.rewards) >= 2 and not g.all_equal]
    elif reward == NO_SIGNAL:
        out = [g for g in out if g.all_equal]
    return out


def group_table(g: Group | None, h: Held) -> pd.DataFrame:
    if g is None:
        return pd.DataFrame([], columns=COLUMNS)
    rows = []
    for s in g.samples:
        adv = s.advantage_value
        rows.append({"rank": s.rank, "#": h.rows[s.row], "id": s.id, "reward": _fmt(s.reward),
                     "advantage": _fmt(adv) + (" (token-level mean)" if isinstance(s.advantage, list) else ""),
                     "tokens": s.tokens, "generated": s.generated, "end": s.end_label,
                     "departs at": "" if s.departs is None else f"{s.departs_unit} {s.departs}"})
    return pd.DataFrame(rows, columns=COLUMNS)


def pair_choices(g: Group | None) -> list[tuple[str, str]]:
    if g is None:
        return []
    return [(f"{s.rank} · {s.id} · reward {_fmt(s.reward) or 'none'}", str(s.rank)) for s in g.samples]


def default_pair(g: Group | None) -> tuple[str | None, str | None]:
    """The best and the worst sample (ranks)."""
    if g is None or not g.samples:
        return None, None
    return "1", str(len(g.samples)) if len(g.samples) > 1 else "1"


def link(g: Group, sample_id: str | None) -> str:
    q = f"?tab=files&group={quote(g.key, safe='')}"
    return q + (f"&trace={quote(sample_id, safe='')}" if sample_id else "")


def note_html(g: Group | None, h: Held, shown: int, a_id: str | None = None, extra: str = "", keep_link: bool = False) -> str:
    """The note above the group's table; ``keep_link``: the page's address is left as it is (a
    link naming a group not among these traces), not made this group's (LINK_JS)."""
    e = html.escape
    bits = []
    cut = ""
    if h.total > len(h.open) + len(h.skipped):
        cut = (f" of the first {len(h.open):,} of {h.total:,} traces (at most {MAX_TRACES:,} traces and "
               f"{MAX_READ_TOKENS:,} response tokens are grouped)")
    bits.append(f"{len(h.groups):,} group(s){cut}; {shown:,} match the filters.")
    if h.skipped:
        bits.append(f"{len(h.skipped)} trace(s) could not be read: {e(h.skipped[0])}")
    if extra:
        bits.append(e(extra))
    head = " ".join(bits)
    root = '<div class="gv" data-keep-link="1">' if keep_link else '<div class="gv">'
    if g is None:
        return f'{root}<div class="ali-info">{head}</div></div>'
    by = "the file's group id" if g.by == "group" else "prompt"
    stats = f"mean reward {e(_fmt(g.mean) or 'none')}, std {e(_fmt(g.std) or 'none')} (n − 1)"
    warn = ('<div class="ali-warn gv-nosignal">All rewards are equal: every advantage is zero, this group gives no '
            "learning signal.</div>") if g.all_equal else ""
    return (f'{root}<div class="ali-info">{head}</div>'
            f'<div class="gv-head" data-group="{e(g.key)}" data-n="{len(g.samples)}">'
            f'<b>group {e(g.key)}</b> (by {by}; {len(g.samples)} samples; {stats}) '
            f'<a class="gv-link" href="{e(link(g, a_id))}">link to this group</a>'
            f'<div class="gv-prompt">{e(g.prompt)}</div></div>{warn}</div>')


def _side(title: str, ids: list[int], mask: list[int], text: str, at: int | None, dec: Any, unit: str) -> str:
    """One column: the shared part (before ``at``) in the prompt colours, the rest by mask, the
    token (or character) at ``at`` framed."""
    e = html.escape
    out = [f'<div class="gv-col"><div class="gv-title">{e(title)}</div><div class="gv-body">']
    if unit == "token":
        shown = ids[:MAX_TOKENS]
        for i, (inner, tip, _) in enumerate(fragments(dec, shown)):
            cls = f"p{i % 2}" if at is None or i < at else f"{'g' if (mask[i] if i < len(mask) else 1) else 'j'}{i % 2}"
            if at is not None and i == at:
                cls += " gv-at"
            out.append(f'<span class="{cls}" title="{tip} · token {i}">{inner}</span>')
        if len(ids) > MAX_TOKENS:
            out.append(f'<span class="gv-more">… {len(ids) - MAX_TOKENS:,} more tokens</span>')
    else:
        cut = len(text) if at is None else at
        out.append(f'<span class="p0">{e(text[:cut])}</span>')
        if at is not None and at < len(text):
            out.append(f'<span class="g0 gv-at">{e(text[at])}</span><span class="g1">{e(text[at + 1:])}</span>')
    out.append("</div></div>")
    return "".join(out)


def aligned_html(ctx: Any, g: Group | None, h: Held, a: str | None, b: str | None) -> str:
    """Samples ``a`` and ``b`` (ranks) side by side, aligned at the start of their responses,
    with the first token where they differ framed."""
    if g is None:
        return '<div class="gv"><div class="ali-info">no group</div></div>'
    by_rank = {str(s.rank): s for s in g.samples}
    sa, sb = by_rank.get(str(a)), by_rank.get(str(b))
    if sa is None or sb is None:
        return '<div class="gv"><div class="ali-info">pick two samples of the group</div></div>'
    try:
        ta, tb = h.open[sa.row](), h.open[sb.row]()
    except Exception as e:  # noqa: BLE001 - the file changed or went: said, not raised
        return f'<div class="gv"><div class="ali-err">could not read the samples again: {html.escape(str(e)[:200])}</div></div>'
    if ta.response_ids and tb.response_ids:
        unit, at = "token", departure(ta.response_ids, tb.response_ids)
    else:
        unit, at = "char", departure(response_text(ta), response_text(tb))
    bundle = ctx.trace_bundle(ta)[0] if ctx is not None and unit == "token" else None
    dec = decoder_for(getattr(bundle, "tokenizer", None))
    where = "identical responses" if at is None else f"A and B depart at {unit} {at}"
    if unit == "char":
        where += " (no token ids: compared as text)"
    head = (f'<div class="gv-pair" data-departs="{"" if at is None else at}" data-unit="{unit}">{html.escape(where)} · '
            '<span class="p0">shared</span> <span class="g0">generated</span> <span class="j0">injected</span> '
            '<span class="g0 gv-at">first difference</span></div>')
    cols = [_side(f"A: rank {s.rank} · {s.id} · reward {_fmt(s.reward) or 'none'} · advantage {_fmt(s.advantage_value) or 'none'}",
                  t.response_ids, t.response_mask, response_text(t), at, dec, unit)
            for s, t in ((sa, ta), (sb, tb))]
    cols[1] = cols[1].replace('<div class="gv-title">A:', '<div class="gv-title">B:', 1)
    return f'<div class="gv">{head}<div class="gv-grid">{"".join(cols)}</div></div>'


def view(ctx: Any, session: Any, source: Callable[..., Any], step: str | None, reward: str | None,
         group: str | None, a: str | None, b: str | None, note: str = "", keep_link: bool = False) -> dict[str, Any]:
    """Everything the section shows, as plain values: ``steps`` (choices, value), ``groups``
    (choices, value), ``note``, ``table``, ``pair`` (choices, a, b), ``aligned``. A group or
    sample that is not there falls back to the first group / the best and worst samples."""
    h = held(session, source)
    steps = step_choices(h.groups)
    step = step if step in steps else ALL
    reward = reward if reward in REWARD_CHOICES else ALL
    shown = matching(h.groups, step, reward)
    g = find_group(shown, group) or (shown[0] if shown else None)
    pairs = pair_choices(g)
    ranks = [v for _, v in pairs]
    da, db = default_pair(g)
    a = a if a in ranks else da
    b = b if b in ranks else db
    a_id = next((s.id for s in g.samples if str(s.rank) == a), None) if g is not None else None
    return {"steps": (steps, step), "reward": reward, "groups": ([(group_label(x), x.key) for x in shown], g.key if g else None),
            "note": note_html(g, h, len(shown), a_id, note, keep_link), "table": group_table(g, h), "pair": (pairs, a, b),
            "aligned": aligned_html(ctx, g, h, a, b), "group": g}


def link_params(params: dict[str, Any]) -> tuple[str | None, str | None]:
    """The group key and sample id a link names (visitor input: bounded, only ever matched)."""
    g, t = params.get("group"), params.get("trace")
    g = g[:500] if isinstance(g, str) and g.strip() else None
    t = t[:500] if isinstance(t, str) and t.strip() else None
    return g, t


def rank_of(session: Any, source: Callable[..., Any], group: str | None, trace_id: str | None) -> str | None:
    """The rank of the sample ``trace_id`` (an id, or a session label) in ``group``."""
    if not trace_id:
        return None
    h = held(session, source)
    g = find_group(h.groups, group)
    if g is None:
        return None
    t = getattr(session, "traces", {}).get(trace_id)
    want = t.id if t is not None else trace_id
    return next((str(s.rank) for s in g.samples if s.id == want), None)


# ---- the section -----------------------------------------------------------------------------------


@dataclass
class GroupsUI:
    note: Any
    step_dd: Any
    reward_dd: Any
    group_dd: Any
    table: Any
    a_dd: Any
    b_dd: Any
    aligned: Any
    key: Any  # gr.State: what the groups were made from ("" none yet)
    section: Any = None  # the accordion (a link opens it)
    opened: Any = None  # gr.State: the section was opened once (grouping waits for that, or a link)

    def outputs(self) -> list[Any]:
        return [self.step_dd, self.reward_dd, self.group_dd, self.note, self.table, self.a_dd, self.b_dd, self.aligned]


def build() -> GroupsUI:
    with gr.Accordion("GRPO groups: the samples of one prompt, ranked by reward", open=False, elem_id="gv-section") as section:
        with gr.Row():
            step_dd = gr.Dropdown([ALL], value=ALL, label="Training step", elem_id="gv-step", allow_custom_value=True, scale=1)
            reward_dd = gr.Dropdown(REWARD_CHOICES, value=ALL, label="Reward", elem_id="gv-reward", scale=1)
            group_dd = gr.Dropdown([], value=None, label="Group", elem_id="gv-group", allow_custom_value=True, scale=3)
        note = gr.HTML("", elem_id="gv-note", css_template=CSS)
        table = gr.Dataframe(headers=COLUMNS, value=pd.DataFrame([], columns=COLUMNS), interactive=False,
                             label="Samples ranked by reward (departs at: the first token where it differs from rank 1)",
                             elem_id="gv-table", max_height=320)
        with gr.Row():
            a_dd = gr.Dropdown([], value=None, label="Sample A", elem_id="gv-a", allow_custom_value=True)
            b_dd = gr.Dropdown([], value=None, label="Sample B", elem_id="gv-b", allow_custom_value=True)
        aligned = gr.HTML("", elem_id="gv-aligned", css_template=CSS)
        key = gr.State("")
        opened = gr.State(False)
    return GroupsUI(note, step_dd, reward_dd, group_dd, table, a_dd, b_dd, aligned, key, section, opened)


def values(v: dict[str, Any]) -> list[Any]:
    """:func:`view`'s values as the section's outputs (:meth:`GroupsUI.outputs`)."""
    steps, step = v["steps"]
    groups, group = v["groups"]
    pairs, a, b = v["pair"]
    return [gr.update(choices=steps, value=step), gr.update(value=v["reward"]), gr.update(choices=groups, value=group),
            v["note"], v["table"], gr.update(choices=pairs, value=a), gr.update(choices=pairs, value=b), v["aligned"]]


def wire(ctx: Any, ui: GroupsUI, session: Any, source: Callable[..., Any], key_of: Callable[[Any], str], table: Any) -> None:
    """Group when the section is first opened, and again when the tab's ``table`` shows other traces
    (not before: a page that never opens the section reads no trace for it); a link
    (``?group=&trace=``, read at the table's first change after the page loads) opens the section on
    its group. The filters and pickers redraw. ``source`` is ``ui.trace_files.audit_source``,
    ``key_of`` its key."""
    from backend.errors import UserError

    outs = ui.outputs()
    inputs = [session, ui.step_dd, ui.reward_dd, ui.group_dd, ui.a_dd, ui.b_dd]

    def safe(sess: Any, step: Any, reward: Any, group: Any, a: Any, b: Any, note: str = "", keep_link: bool = False) -> list[Any]:
        try:
            return values(view(ctx, sess, source, step, reward, group, a, b, note, keep_link))
        except UserError as e:  # a trace set that cannot be read: its own status says more
            return [gr.update(), gr.update(), gr.update(choices=[], value=None),
                    f'<div class="gv"><div class="ali-warn">no groups: {html.escape(str(e)[:300])}</div></div>',
                    pd.DataFrame([], columns=COLUMNS), gr.update(choices=[], value=None), gr.update(choices=[], value=None), ""]

    def current(sess: Any) -> str:
        try:
            return key_of(sess)
        except UserError:
            return ""

    def on_table(sess: Any, key: str, opened: bool, step: Any, reward: Any, group: Any, a: Any, b: Any, request: gr.Request):
        now = current(sess)
        skip = [gr.skip()] * (len(outs) + 3)
        if key and now == key:  # a filter or a page of the same traces
            return skip
        g, t = link_params(dict(request.query_params)) if request is not None else (None, None)
        # the address names a group (a link, or the group shown before a reload): on the page's first
        # listing, and when other traces are shown (the same file uploaded again after a reload) and
        # the group is among them, the section opens on it, the linked sample beside the best
        found = bool(g) and (not key or opened) and find_group(held(sess, source).groups, g) is not None
        if not g or (key and not found):
            return [*safe(sess, step, reward, group, a, b), now, gr.skip(), gr.skip()] if opened else skip
        a = rank_of(sess, source, g, t)
        b = "1" if a and a != "1" else None
        note = "" if found else "the link names a group that is not among these traces: showing the first group"
        return [*safe(sess, ALL, ALL, g, a, b, note, keep_link=not found), now, gr.update(open=True), True]

    def on_open(sess: Any, key: str, step: Any, reward: Any, group: Any, a: Any, b: Any):
        now = current(sess)
        if key and now == key:
            return [*[gr.skip()] * (len(outs) + 1), True]
        return [*safe(sess, step, reward, group, a, b), now, True]

    def on_filter(sess: Any, step: Any, reward: Any, group: Any, a: Any, b: Any):
        return safe(sess, step, reward, group, None, None)

    def on_group(sess: Any, step: Any = ALL, reward: Any = ALL, group: Any = None, a: Any = None, b: Any = None):
        return safe(sess, step, reward, group, a, b)

    pickers = [ui.step_dd, ui.reward_dd, ui.group_dd, ui.a_dd, ui.b_dd]
    table.change(on_table, [session, ui.key, ui.opened, *pickers], [*outs, ui.key, ui.section, ui.opened],
                 api_visibility="private", trigger_mode="always_last")
    ui.section.expand(on_open, [session, ui.key, *pickers], [*outs, ui.key, ui.opened], api_visibility="private")
    for dd in (ui.step_dd, ui.reward_dd):
        dd.input(on_filter, inputs, outs, api_visibility="private")
    # API name, kept stable: /trace_groups (step, reward, group key, sample A rank, sample B rank; each
    # optional: the first group matching, its best and worst samples) -> step filter, reward filter,
    # group picker (its choices: every group's key), note (HTML), ranked table, A, B, aligned view (HTML)
    ui.group_dd.input(on_group, inputs, outs, api_name="trace_groups")
    # whatever changed the note (a picker, a filter, a link, other traces) writes the group shown
    # and sample A into the page's address
    ui.note.change(None, [ui.note], None, js=LINK_JS)
    for dd in (ui.a_dd, ui.b_dd):
        dd.input(on_group, inputs, outs, api_visibility="private")
