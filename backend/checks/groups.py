"""GRPO groups: the samples of one prompt side by side (issue 30, item 5).

A pure function of traces (no tokenizer, no UI): :func:`group_traces` puts each trace in a
group and ranks each group by reward.

Which group a trace belongs to:

* ``metadata.group`` (the RL importers' convention, docs/trace-formats.md), else verl's ``uid``
  (the id verl gives the samples of one prompt): the group the file names;
* else the prompt: the messages before the first assistant message (role, content, tool calls,
  compared as JSON), so TRL's completion logs, which carry no group id, group by prompt.

Either way within one training step (``metadata.training_step``, or ``global_step`` / ``step``:
:func:`backend.trace.index.training_step_of`): the same prompt at two steps is two groups. A
group's :attr:`Group.key` (``"3/p-1a2b3c4d5e6f"``, ``"7/uid-42"``) names it in a link
(``?group=``).

Per sample: the reward (``metadata.score``, else verl's ``reward_score``), the advantage as the
file states it (a number, or a list for token-level advantages), the response length in tokens
(``response_ids``; and how many of them the model generated, mask 1), the end state
(``termination_reason``, else the last generated step's ``finish_reason``), its rank (1 = the
highest reward; samples without a reward rank last, ties keep file order) and where it departs
from the best sample: the first response token where the two differ (when both carry token ids),
else the first character of the response text (the messages from the first assistant message
on). ``None`` when the two are the same.

Per group: the mean and the standard deviation of the rewards (the sample deviation, n − 1, as
TRL's and verl's GRPO compute it: TRL's advantage is ``(r − mean) / (std + 1e-4)``), and whether
all rewards are equal, so that every advantage is zero and the group gives no learning signal.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.checks.labels import termination_label
from backend.trace.index import group_id_of, training_step_of
from backend.trace.model import StepState, Trace

SCORE_KEYS = ("score", "reward_score")  # the total reward: the RL convention's, then verl's
EQUAL_TOL = 1e-9  # rewards closer than this count as equal (no learning signal)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return None if math.isnan(v) else v


def score_of(meta: Any) -> float | None:
    """The sample's reward: ``metadata.score``, else ``reward_score``; None when there is none."""
    if isinstance(meta, dict):
        for k in SCORE_KEYS:
            v = _num(meta.get(k))
            if v is not None:
                return v
    return None


def advantage_of(meta: Any) -> float | list[float | None] | None:
    """The advantage as the file states it: a number, a list (token-level), or None."""
    v = meta.get("advantage") if isinstance(meta, dict) else None
    if isinstance(v, list):
        return [_num(x) for x in v]
    return _num(v)


def _first_assistant(t: Trace) -> int:
    return next((i for i, m in enumerate(t.messages) if isinstance(m, dict) and m.get("role") == "assistant"), len(t.messages))


def prompt_messages(t: Trace) -> list[dict[str, Any]]:
    """The messages before the first assistant message (the prompt the samples share)."""
    return [m for m in t.messages[: _first_assistant(t)] if isinstance(m, dict)]


def response_text(t: Trace) -> str:
    """The response as text: the messages from the first assistant message on (content, tool
    calls as JSON, reasoning), one after another."""
    parts: list[str] = []
    for m in t.messages[_first_assistant(t):]:
        if not isinstance(m, dict):
            continue
        if isinstance(m.get("reasoning_content"), str):
            parts.append(m["reasoning_content"])
        c = m.get("content")
        parts.append(c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else "")
        if m.get("tool_calls"):
            parts.append(json.dumps(m["tool_calls"], ensure_ascii=False, sort_keys=True))
    return "\n".join(parts)


def _preview(msgs: list[dict[str, Any]], limit: int = 200) -> str:
    user = next((m for m in reversed(msgs) if m.get("role") == "user"), msgs[-1] if msgs else None)
    c = user.get("content") if user else ""
    text = c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) if c is not None else ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def group_of(t: Trace) -> tuple[str, str]:
    """``(group id, by)``: the id the file names (``by`` "group"), else a hash of the prompt
    messages (``"p-<12 hex>"``, ``by`` "prompt")."""
    gid = group_id_of(t.metadata)
    if gid is not None:
        return gid, "group"
    blob = json.dumps(prompt_messages(t), ensure_ascii=False, sort_keys=True, default=str)
    return "p-" + hashlib.sha1(blob.encode("utf-8", "surrogatepass")).hexdigest()[:12], "prompt"


def group_key(step: int | None, group: str) -> str:
    """The key of a group in a link: ``"<step>/<group id>"``, or the id alone with no step."""
    return group if step is None else f"{step}/{group}"


def end_state(t: Trace) -> str | None:
    """``termination_reason``, else the last generated step's ``finish_reason``."""
    if isinstance(t.termination_reason, str) and t.termination_reason.strip():
        return str(t.termination_reason)
    for s in reversed(t.steps):
        if s.state == StepState.GENERATING and s.finish_reason:
            return s.finish_reason
    return None


def departure(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length when one is a
    prefix of the other), None when they are equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


@dataclass
class Sample:
    row: int  # position in the traces given to group_traces
    id: str
    reward: float | None
    advantage: float | list[float | None] | None
    tokens: int  # response tokens (generated and injected)
    generated: int  # of them mask 1
    end: str | None  # termination_reason / finish_reason code
    end_label: str
    rank: int = 0  # 1 = highest reward
    departs: int | None = None  # first token (or character) where it differs from the best sample
    departs_unit: str = "token"  # "token" or "char"

    @property
    def advantage_value(self) -> float | None:
        """The advantage as one number (a token-level list: its mean over the given values)."""
        if isinstance(self.advantage, list):
            vals = [x for x in self.advantage if x is not None]
            return sum(vals) / len(vals) if vals else None
        return self.advantage


@dataclass
class Group:
    key: str
    step: int | None
    group: str
    by: str  # "group" (the file's id) or "prompt"
    prompt: str  # the last user message of the prompt, on one line
    samples: list[Sample] = field(default_factory=list)  # ranked

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples if s.reward is not None]

    @property
    def mean(self) -> float | None:
        r = self.rewards
        return sum(r) / len(r) if r else None

    @property
    def std(self) -> float | None:
        """The sample standard deviation (n − 1) of the rewards, None under two rewards."""
        r = self.rewards
        if len(r) < 2:
            return None
        m = sum(r) / len(r)
        return math.sqrt(sum((x - m) ** 2 for x in r) / (len(r) - 1))

    @property
    def all_equal(self) -> bool:
        """Every sample has a reward and they are all equal (two samples at least): every
        advantage is zero, the group teaches nothing."""
        r = self.rewards
        return len(self.samples) >= 2 and len(r) == len(self.samples) and max(r) - min(r) <= EQUAL_TOL

    @property
    def best(self) -> Sample | None:
        return self.samples[0] if self.samples else None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "step": self.step, "group": self.group, "by": self.by, "prompt": self.prompt,
                "n": len(self.samples), "mean": self.mean, "std": self.std, "all_equal": self.all_equal,
                "samples": [asdict(s) for s in self.samples]}


def _sample(row: int, t: Trace) -> Sample:
    md = t.metadata if isinstance(t.metadata, dict) else {}
    end = end_state(t)
    return Sample(row=row, id=t.id, reward=score_of(md), advantage=advantage_of(md), tokens=len(t.response_ids),
                  generated=sum(t.response_mask), end=end, end_label=termination_label(end))


def rank(samples: list[Sample]) -> list[Sample]:
    """Highest reward first, samples without one last; ties keep their order. Sets ``rank``."""
    out = sorted(samples, key=lambda s: (s.reward is None, -(s.reward or 0.0), s.row))
    for k, s in enumerate(out, 1):
        s.rank = k
    return out


def group_traces(traces: Iterable[Trace]) -> list[Group]:
    """The groups of ``traces`` (in the order of their first sample, steps ascending, the traces
    with no step last), each ranked by reward, with each sample's departure from the best one.
    ``traces`` is read once, one at a time: what is kept of each until the departures are known is
    its response ids (4 bytes a token) and response text."""
    groups: dict[tuple[int | None, str], Group] = {}
    seqs: dict[int, tuple[array, str]] = {}
    for row, t in enumerate(traces):
        md = t.metadata if isinstance(t.metadata, dict) else {}
        step = training_step_of(md)
        gid, by = group_of(t)
        g = groups.get((step, gid))
        if g is None:
            g = groups[(step, gid)] = Group(group_key(step, gid), step, gid, by, _preview(prompt_messages(t)))
        g.samples.append(_sample(row, t))
        seqs[row] = (array("i", t.response_ids), response_text(t))
    for g in groups.values():
        g.samples = rank(g.samples)
        best_ids, best_text = seqs[g.samples[0].row]
        for s in g.samples[1:]:
            ids, text = seqs[s.row]
            if ids and best_ids:
                s.departs, s.departs_unit = departure(ids, best_ids), "token"
            else:
                s.departs, s.departs_unit = departure(text, best_text), "char"
        if g.samples:
            g.samples[0].departs_unit = "token" if best_ids else "char"
    order = sorted(groups.values(), key=lambda g: (g.step is None, g.step if g.step is not None else 0))
    return order  # sorted() is stable: first-seen order within a step


def find_group(groups: list[Group], key: str | None) -> Group | None:
    """The group a link names (its :attr:`Group.key`, or a group id alone when only one step
    has it)."""
    if not key:
        return None
    hit = next((g for g in groups if g.key == key), None)
    if hit is None:
        by_id = [g for g in groups if g.group == key]
        hit = by_id[0] if len(by_id) == 1 else None
    return hit
