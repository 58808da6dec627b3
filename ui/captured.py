"""The Trace files tab's Captured sessions view: the capture gateway's folder (``app.py --gateway``,
``--capture-dir``) as sessions arrive, each a tree of branches with where and why each forked; a
branch opens in the Inspector like any other trace.

The folder is the operator's; a visitor only picks one of the sessions listed there (a name is
checked against the listing, never used as a path). Text from the files (session and branch
names, causes, details) goes into the tree's HTML escaped and into the table as cell text."""

from __future__ import annotations

import html
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from backend.gateway.core import FORK_CAUSES, SESSION_NAME
from backend.trace import Trace
from backend.trace.io import load_traces
from ui.context import AppContext, Session, short_error

COLUMNS = ["branch", "parent", "fork at", "cause", "turns", "tokens", "end"]
MAX_SESSIONS_LISTED = 500  # the newest ones
REFRESH_S = 3.0
_CACHE_ENTRIES = 16


@dataclass
class CapturedUI:
    section: Any
    session_dd: gr.Dropdown
    refresh: gr.Button
    tree: gr.HTML
    table: gr.Dataframe
    timer: gr.Timer
    seen: gr.State  # what the page shows: the session list and the shown file's size and time


class _Files:
    """Capture files read once per (size, mtime), shared by the page's sessions (bounded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[tuple[int, int], list[Trace], list[str]]] = OrderedDict()

    def read(self, path: str) -> tuple[list[Trace], list[str]]:
        st = os.stat(path)
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
            if hit is not None and hit[0] == key:
                self._cache.move_to_end(path)
                return hit[1], hit[2]
        res = load_traces(path)
        traces = list(res.traces)
        problems = [f"line {p.line}: {p.reason}" for p in res.problems]
        with self._lock:
            self._cache[path] = (key, traces, problems)
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return traces, problems


FILES = _Files()


def sessions(folder: str) -> list[str]:
    """The sessions captured in ``folder``, newest first (a file per session: NAME.jsonl)."""
    try:
        entries = [e for e in os.scandir(folder) if e.is_file() and e.name.endswith(".jsonl")]
    except OSError:
        return []
    entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
    names = [e.name[: -len(".jsonl")] for e in entries]
    return [n for n in names if SESSION_NAME.fullmatch(n)][:MAX_SESSIONS_LISTED]


def _branch(t: Trace) -> dict[str, Any]:
    b = t.metadata.get("branch") if isinstance(t.metadata, dict) else None
    return b if isinstance(b, dict) else {}


def branch_rows(traces: list[Trace]) -> pd.DataFrame:
    rows = []
    for t in traces:
        b = _branch(t)
        turns = sum(1 for s in t.steps if s.state == "generating")
        end = getattr(t.termination_reason, "words", None) or str(t.termination_reason or "")
        rows.append([str(b.get("id") or t.id), str(b.get("parent") or ""), "" if b.get("fork_at") is None else str(b["fork_at"]),
                     str(b.get("cause") or ""), turns, len(t.prompt_ids) + len(t.response_ids), end])
    return pd.DataFrame(rows, columns=COLUMNS)


def tree_html(name: str, traces: list[Trace], problems: list[str]) -> str:
    """The session's branches as a tree: each under its parent, with where and why it forked."""
    by_id = {str(_branch(t).get("id") or t.id): t for t in traces}
    children: dict[str | None, list[str]] = {}
    for bid, t in by_id.items():
        parent = _branch(t).get("parent")
        children.setdefault(parent if parent in by_id else None, []).append(bid)

    def item(bid: str, depth: int) -> str:
        t = by_id[bid]
        b = _branch(t)
        turns = sum(1 for s in t.steps if s.state == "generating")
        end = getattr(t.termination_reason, "words", None) or str(t.termination_reason or "")
        head = f'<span class="cap-id">{html.escape(bid)}</span> · {turns} turn(s) · {html.escape(end)}'
        if b.get("parent") is not None:
            cause = str(b.get("cause") or "")
            words = FORK_CAUSES.get(cause, "")
            head += (f' · <span class="cap-fork">forked from {html.escape(str(b["parent"]))} at token '
                     f'{html.escape(str(b.get("fork_at")))}: <b class="cap-cause">{html.escape(cause)}</b>'
                     + (f" ({html.escape(words)})" if words else "") + "</span>")
            if b.get("detail"):
                head += f'<div class="cap-detail">{html.escape(str(b["detail"])[:500])}</div>'
        kids = children.get(bid, []) if depth < 64 else []
        inner = "".join(item(k, depth + 1) for k in kids)
        return f'<li data-branch="{html.escape(bid)}">{head}' + (f"<ul>{inner}</ul>" if inner else "") + "</li>"

    roots = "".join(item(bid, 0) for bid in children.get(None, []))
    bad = "".join(f'<div class="ali-err">{html.escape(p)}</div>' for p in problems[:5])
    return (f'<div class="cap-tree-box"><div class="ali-info">session <b>{html.escape(name)}</b>: {len(traces)} '
            f'branch(es)</div><ul class="cap-tree">{roots}</ul>{bad}</div>')


def show(folder: str, name: str | None) -> tuple[str, pd.DataFrame]:
    """The tree and the table of session ``name`` (one of the folder's; anything else shows nothing)."""
    if not name or name not in sessions(folder):
        return '<div class="ali-info">Choose a captured session.</div>', pd.DataFrame(columns=COLUMNS)
    try:
        traces, problems = FILES.read(os.path.join(folder, f"{name}.jsonl"))
    except (OSError, ValueError) as e:
        return f'<div class="ali-err">{html.escape(short_error(e))}</div>', pd.DataFrame(columns=COLUMNS)
    return tree_html(name, traces, problems), branch_rows(traces)


def build(ctx: AppContext) -> CapturedUI | None:
    folder = ctx.capture_dir
    if not folder:
        return None
    with gr.Accordion("Captured sessions (the capture gateway): each session a tree of branches, forks named by cause",
                      open=True, elem_id="cap-section") as section:
        gr.Markdown("Sessions the capture gateway recorded (`/v1/chat/completions`, docs/gateway.md), newest first. "
                    "A branch continues the model's exact ids; a request whose history departs starts a branch, under "
                    "the branch it departs from, with the token where it forked and why. Click a branch to inspect it.")
        with gr.Row():
            names = sessions(folder)
            # no value yet: the page's first refresh picks the newest session
            session_dd = gr.Dropdown(choices=names, value=None, label="session",
                                     elem_id="cap-session", allow_custom_value=False, scale=4)
            refresh = gr.Button("Refresh", elem_id="cap-refresh", scale=1)
        tree = gr.HTML('<div class="ali-info">Choose a captured session.</div>', elem_id="cap-tree")
        table = gr.Dataframe(headers=COLUMNS, value=pd.DataFrame(columns=COLUMNS), interactive=False,
                             label="Branches (click one to inspect it)", elem_id="cap-branches", wrap=True, max_height=360)
        timer = gr.Timer(REFRESH_S, active=True)
        seen = gr.State(None)
    return CapturedUI(section, session_dd, refresh, tree, table, timer, seen)


def wire(ctx: AppContext, ui: CapturedUI, session: gr.State, fn_open, open_outputs) -> None:
    folder = ctx.capture_dir

    def signature(names: list[str], pick: str | None) -> tuple[Any, ...]:
        try:
            st = os.stat(os.path.join(folder, f"{pick}.jsonl")) if pick else None
        except OSError:
            st = None
        return tuple(names), pick, (st.st_size, st.st_mtime_ns) if st else None

    def on_pick(name: str | None):
        return [*show(folder, name), signature(sessions(folder), name)]

    def on_refresh(name: str | None, seen: Any = None, poll: bool = False):
        names = sessions(folder)
        pick = name if name in names else (names[0] if names else None)
        sig = signature(names, pick)
        if poll and sig == seen:
            return [gr.skip()] * 4
        tree, rows = show(folder, pick)
        return gr.update(choices=names, value=pick), tree, rows, sig

    def on_tick(name: str | None, seen: Any):
        return on_refresh(name, seen, poll=True)

    def on_select(sess: Session, name: str | None, df: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if df is None or row is None or row >= len(df) or not name or name not in sessions(folder):
            raise gr.Error("no such branch")
        bid = str(df.iloc[row]["branch"])
        traces, _ = FILES.read(os.path.join(folder, f"{name}.jsonl"))
        match = [t for t in traces if str(_branch(t).get("id") or t.id) == bid]
        if not match:
            raise gr.Error(f"session {name} has no branch {bid} now")
        return fn_open(sess, sess.add(f"captured · {name} · {bid}", match[0]))

    shown = [ui.session_dd, ui.tree, ui.table, ui.seen]
    ui.session_dd.input(on_pick, [ui.session_dd], [ui.tree, ui.table, ui.seen], api_visibility="private")
    ui.refresh.click(on_refresh, [ui.session_dd], shown, api_visibility="private")
    ui.timer.tick(on_tick, [ui.session_dd, ui.seen], shown, api_visibility="private", queue=False, show_progress="hidden")
    ui.table.select(on_select, [session, ui.session_dd, ui.table], open_outputs, api_visibility="private")
