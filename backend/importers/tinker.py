"""tinker-cookbook RL logs → conversations and traces (tinker-cookbook 0.5.8: ``rl.train``, ``utils.logtree``).

An RL run of tinker-cookbook writes, per iteration, ``iteration_NNNNNN/train_logtree.json``: the
**logtree** of the iteration's sampling (``logtree.Trace.to_dict()``: ``title`` — ``"RL Iteration
N"`` —, ``started_at``, ``path`` and ``root``, a tree of HTML-like nodes ``{tag, attrs, children}``;
a node a formatter logged carries its content as structured ``data``). Each ``Group Rollout``
section is one ``EnvGroupBuilder``'s group; in it the env logged each rollout (the cookbook's
``ProblemEnv``: a ``Prompt`` and a ``Policy Response`` section, each a ``{"type": "conversation",
"messages": [...]}`` data node — the renderer's messages, ``message_to_jsonable`` — and a
``Reward`` table), then ``rl.rollouts`` logged ``Trajectory Details``: per trajectory its turns'
``ob_len`` / ``ac_len`` / step reward, the step's metrics and logs, and the episode totals (final
group reward, total return). The same tree as HTML (``train.html``) is not read: the JSON says the
same without parsing markup. ``train_rollout_summaries.jsonl`` (one line per trajectory:
lengths, rewards, metrics; no text) is recognised and refused with that reason. The files of an RL
run hold no token ids or logprobs (they live in memory, as ``Transition.ob`` / ``ac``) unless the
run was wrapped in the cookbook's capture (``capture/sample.jsonl``, read by
:mod:`backend.importers.tinker_capture`: ids and logprobs kept). From the logtree:

* each response a group's env logged is one conversation: the latest ``Prompt`` conversation's
  messages then the response's, rendered with the chosen tokenizer (``metadata.ids =
  "rendered"``). Thinking parts become ``reasoning_content``, tool-call parts tool calls; an
  unparsed tool call keeps its raw text (the parser flags it); an image part is a loss.
* metadata: ``training_step`` (the title's iteration — ``RL Iteration N``, ``Running evaluation
  <name> N`` —, else an ``iteration_<N>`` folder),
  ``group`` (``<title> #<g>``: the g-th group the logtree holds), ``rewards`` (the response's
  reward table: ``reward`` and its true/false components as 1/0), ``score`` (its ``reward``);
  under ``metadata.extra``: the reward table as written, what else the env logged after the
  response (tables, text), the message ``trainable`` flags, and the group's ``trajectories`` (the
  Trajectory Details tables, by trajectory index). The env's log blocks are in the order its
  rollouts finished, which need not be the trajectory index, so a response is not tied to one
  trajectory (``metadata.sample`` is not set; ``extra.logged`` is its place in the log).
"""

from __future__ import annotations

import html
import os
import re
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError
from backend.importers.tinker_capture import capture_traces, is_capture
from backend.importers.trl import messages_of
from backend.trace.messages import json_type

_TITLE_STEP = re.compile(r"^(?:RL Iteration|Running evaluation .*) (\d{1,9})$")  # train.py's scope names
_ITER_DIR = re.compile(r"^iteration_(\d{1,9})$")
_TRAJ = re.compile(r"^Trajectory (\d{1,6}) Episode$")
_TURN = re.compile(r"^Turn (\d{1,6})$")
_SUMMARY_KEYS = ("schema_version", "split", "iteration", "group_idx", "traj_idx", "steps")
_MESSAGE_KEYS = ("role", "content", "tool_calls", "unparsed_tool_calls", "trainable", "tool_call_id", "name")


def _is_node(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("tag"), str) and isinstance(v.get("children"), list)


def _is_logtree(rec: Any) -> bool:
    return isinstance(rec, dict) and "started_at" in rec and "title" in rec and _is_node(rec.get("root"))


def _is_summary(rec: Any) -> bool:
    return isinstance(rec, dict) and all(k in rec for k in _SUMMARY_KEYS) and isinstance(rec.get("steps"), list)


def _text(node: Any) -> str:
    """The text of a node: its strings (HTML-escaped by logtree) unescaped, descendants included."""
    out: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, str):
            out.append(n)
        elif _is_node(n):
            stack.extend(reversed(n["children"]))
    return html.unescape("".join(out))


def _table(node: dict[str, Any]) -> dict[str, str] | list[list[str]]:
    """A logtree table's rows (cells as text); a ``key`` / ``value`` table as a dict."""
    rows: list[list[str]] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if not _is_node(n):
            continue
        if n["tag"] == "tr":
            rows.append([_text(c) for c in n["children"] if _is_node(c) and c["tag"] in ("td", "th")])
        else:
            stack.extend(reversed(n["children"]))
    if rows and rows[0] == ["key", "value"] and all(len(r) == 2 for r in rows[1:]):
        return {k: v for k, v in rows[1:]}
    return rows


def _sections(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(header text, section body)`` of each section directly in ``body``."""
    out = []
    for c in body["children"]:
        if _is_node(c) and c["tag"] == "section":
            kids = [k for k in c["children"] if _is_node(k)]
            head = next((k for k in kids if re.fullmatch(r"h[1-6]", k["tag"])), None)
            inner = next((k for k in kids if k["tag"] == "div"), None)
            if head is not None and inner is not None:
                out.append((_text(head), inner))
    return out


def _events(body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """What a group's env logged, in order: ``(kind, section title, content)`` with kind
    ``conversation`` (a message list), ``data`` (another formatter's data), ``table`` or ``text``.
    The rollout's own ``Trajectory Details`` section is left out (read by :func:`_trajectories`)."""
    out: list[tuple[str, str, Any]] = []
    stack: list[tuple[Any, str, str | None]] = [(c, "", None) for c in reversed(body["children"])]
    while stack:
        n, title, caption = stack.pop()
        if not _is_node(n):
            if isinstance(n, str) and n.strip():
                out.append(("text", title, html.unescape(n)))
            continue
        data = n.get("data")
        if isinstance(data, dict):
            kind = "conversation" if data.get("type") == "conversation" else "data"
            out.append((kind, title, data.get("messages") if kind == "conversation" else data))
            continue
        tag, cls = n["tag"], str((n.get("attrs") or {}).get("class", ""))
        if tag == "section":
            secs = _sections({"children": [n]})
            if secs and secs[0][0] == "Trajectory Details":
                continue
            if secs:
                stack.append((secs[0][1], secs[0][0], None))
            continue
        if tag == "table":
            out.append(("table", title, {"caption": caption, "rows": _table(n)} if caption else {"rows": _table(n)}))
        elif cls == "lt-table-caption":
            nxt = stack.pop() if stack else None  # the table it captions
            if nxt is not None:
                stack.append((nxt[0], nxt[1], _text(n)))
        elif tag in ("p", "pre", "details") or n["children"] and all(isinstance(c, str) for c in n["children"]):
            t = _text(n)
            if t.strip():
                out.append(("text", title, t))
        else:
            stack.extend((c, title, None) for c in reversed(n["children"]))
    return out


def _trajectories(body: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The ``Trajectory Details`` tables of a group, by trajectory index: each turn's step stats,
    metrics and logs, and the episode totals."""
    details = next((b for t, b in _sections(body) if t == "Trajectory Details"), None)
    if details is None:
        return []
    out: list[dict[str, Any]] = []
    for title, tb in _sections(details):
        m = _TRAJ.match(title)
        if not m:
            continue
        traj: dict[str, Any] = {"index": int(m.group(1)), "turns": []}
        for sub, sb in _sections(tb):
            if sub != "Episode Details":
                continue
            for turn_title, turn_body in _sections(sb):
                if _TURN.match(turn_title):
                    traj["turns"].append(_tables_by_caption(_events(turn_body)))
            totals = _tables_by_caption([e for e in _events({"children": [c for c in sb["children"] if not (_is_node(c) and c["tag"] == "section")]})])
            if totals:
                traj["totals"] = totals.get("Episode totals", totals)
        n_turns = (traj.get("totals") or {}).get("num_turns")
        if isinstance(n_turns, str) and n_turns.isdigit() and int(n_turns) != len(traj["turns"]):
            raise RecordError(f"{where}: trajectory {traj['index']} says num_turns {n_turns} but logs {len(traj['turns'])} turn(s)")
        out.append(traj)
    return out


def _tables_by_caption(events: list[tuple[str, str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, title, content in events:
        if kind == "table":
            out[content.get("caption") or title or f"table {len(out)}"] = content["rows"]
        elif kind == "text":
            out.setdefault("logs", []).append(content)
    return out


def _number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _tinker_message(m: Any, where: str, losses: list[str], trainable: list[Any]) -> dict[str, Any]:
    """A message as the cookbook's renderer wrote it (``message_to_jsonable``) in chat-message form."""
    if not isinstance(m, dict):
        raise RecordError(f"{where} is {json_type(m)}, not a message object")
    for k in sorted(set(m) - set(_MESSAGE_KEYS)):
        losses.append(f"{where}.{k}: message field not carried over")
    out: dict[str, Any] = {k: m[k] for k in ("role", "name", "tool_call_id") if k in m}
    calls = list(m.get("tool_calls") or [])
    content = m.get("content")
    if isinstance(content, list):
        texts: list[str] = []
        thinking: list[str] = []
        for i, p in enumerate(content):
            w = f"{where}.content[{i}]"
            t = p.get("type") if isinstance(p, dict) else None
            if t == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif t == "thinking" and isinstance(p.get("thinking"), str):
                thinking.append(p["thinking"])
            elif t == "tool_call" and isinstance(p.get("tool_call"), dict):
                calls.append(p["tool_call"])
            elif t == "unparsed_tool_call" and isinstance(p.get("raw_text"), str):
                texts.append(p["raw_text"])
            elif isinstance(p, dict):
                losses.append(f"{w}: content part of type {t!r} not carried over (it has no text)")
            else:
                raise RecordError(f"{w} is {json_type(p)}, not a content part")
        out["content"] = "".join(texts)
        if thinking:
            out["reasoning_content"] = "\n".join(thinking)
    else:
        out["content"] = content
    for i, u in enumerate(m.get("unparsed_tool_calls") or []):
        raw = u.get("raw_text") if isinstance(u, dict) else None
        if isinstance(raw, str) and raw not in (out.get("content") or ""):
            out["content"] = (out.get("content") or "") + raw  # kept as the model wrote it: the parser flags it
        elif not isinstance(raw, str):
            raise RecordError(f"{where}.unparsed_tool_calls[{i}] has no raw_text")
    if calls:
        out["tool_calls"] = calls
    trainable.append(m.get("trainable"))
    return out


@register
class TinkerImporter(Importer):
    name = "tinker"
    label = "tinker-cookbook"
    description = ("tinker-cookbook RL logs: the logtree JSON (iteration_N/train_logtree.json: the envs' conversations and reward "
                   "tables per group; text, re-rendered) and capture/sample.jsonl (each sampling call's ids and logprobs, kept)")

    def sniff(self, record: Any) -> Any:
        if _is_logtree(record):
            return "logtree (title, started_at, root node tree)"
        if is_capture(record):
            return f"capture record (kind {record['kind']!r}, scope)"
        if _is_summary(record):
            return "rollout summary line (group_idx, traj_idx, steps)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if is_capture(record):
            return capture_traces(record, ctx, self.name)
        if _is_summary(record) and not _is_logtree(record):
            raise RecordError("a tinker-cookbook rollout summary holds no text and no token ids (only lengths, rewards and metrics "
                              "per trajectory): import train_logtree.json from the same iteration folder")
        if not _is_logtree(record):
            raise RecordError(f"not a tinker-cookbook logtree (title, started_at, root node) or capture record (kind, scope), "
                              f"got {json_type(record)}")
        title = str(record["title"])
        step = _TITLE_STEP.match(title)
        folder = _ITER_DIR.match(os.path.basename(os.path.dirname(os.path.abspath(ctx.path)))) if ctx.path else None
        training_step = int(step.group(1)) if step else int(folder.group(1)) if folder else None
        root = record["root"]
        groups = [b for t, b in _sections(root) if t == "Group Rollout"]
        if not groups:
            raise RecordError(f"logtree {title!r} has no Group Rollout section (no rollouts were logged)")
        out: list[Conversation] = []
        empty: list[str] = []
        for g, body in enumerate(groups):
            where = f"group {g}"
            trajs = _trajectories(body, where)
            made = self._group(body, where, f"{title} #{g}", training_step, trajs, record, out, ctx)
            if not made:
                empty.append(f"{where}: the env logged no conversation; its {len(trajs)} trajectory table(s) not carried over")
        if not out:
            raise RecordError(f"logtree {title!r}: no env logged a conversation (only tables): nothing to show as a trace")
        out[0].losses.extend(empty)
        return out

    def _group(self, body: dict[str, Any], where: str, gid: str, training_step: int | None, trajs: list[dict[str, Any]],
               record: dict[str, Any], out: list[Conversation], ctx) -> int:
        prompt: list[Any] = []
        current: Conversation | None = None
        pending: list[dict[str, Any]] = []  # logged before the next response (kept with it)
        made = 0
        for kind, title, content in _events(body):
            if kind == "conversation":
                if not isinstance(content, list):
                    raise RecordError(f"{where}: a {title!r} conversation's messages are {json_type(content)}, not a list")
                if title == "Prompt":
                    prompt, current = content, None  # what follows belongs to the next response
                    continue
                current = self._sample(prompt, content, f"{where}.response[{made}]", gid, made, training_step, trajs, record, ctx)
                if pending:
                    current.metadata["extra"]["logs_before"] = pending
                    pending = []
                out.append(current)
                made += 1
            elif current is not None and kind == "table" and isinstance(content["rows"], dict) and "reward" in f"{title} {content.get('caption', '')}".lower():
                self._rewards(current, content["rows"])
            elif current is not None:
                current.metadata["extra"].setdefault("logs", []).append({"section": title, kind: content})
            else:
                pending.append({"section": title, kind: content})
        if pending and made:  # logged after the group's last response's prompt, with no response after it
            out[-1].metadata["extra"].setdefault("logs", []).extend(pending)
        return made

    def _sample(self, prompt: list[Any], response: list[Any], where: str, gid: str, k: int, training_step: int | None,
                trajs: list[dict[str, Any]], record: dict[str, Any], ctx) -> Conversation:
        conv = Conversation(messages=[])
        trainable: list[Any] = []
        raw = [_tinker_message(m, f"{where}.prompt[{i}]", conv.losses, trainable) for i, m in enumerate(prompt)]
        raw += [_tinker_message(m, f"{where}.messages[{i}]", conv.losses, trainable) for i, m in enumerate(response)]
        if not raw:
            raise RecordError(f"{where}: no messages")
        conv.messages = messages_of(raw, where, conv, ctx.parser, getattr(ctx.bundle.tokenizer, "eos_token", None), offset=0)
        meta: dict[str, Any] = {"group": gid}
        if training_step is not None:
            meta["training_step"] = training_step
        extra: dict[str, Any] = {"logged": k, "trajectories": trajs}
        if any(t is not None for t in trainable):
            extra["trainable"] = trainable
        meta["extra"] = extra
        conv.metadata = meta
        conv.id = f"{gid}/{k}"
        conv.provenance = {"library": "tinker-cookbook", "logtree": str(record.get("title")),
                           "started_at": str(record.get("started_at"))}
        return conv

    @staticmethod
    def _rewards(conv: Conversation, table: dict[str, str]) -> None:
        meta = conv.metadata
        meta["extra"].setdefault("reward_table", {}).update(table)
        rewards = meta.setdefault("rewards", {})
        for key, v in table.items():
            if v in ("True", "False"):
                rewards[key] = 1.0 if v == "True" else 0.0
            elif key == "reward":
                rewards[key] = _number(v)
                if rewards[key] is not None:
                    meta["score"] = rewards[key]

