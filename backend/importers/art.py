"""OpenPipe ART trajectories → traces (read from ART's source, 0.3.11: ``art.trajectories``,
``art.utils.trajectory_logging``).

An ART ``Trajectory`` is text: ``messages_and_choices`` — chat messages (dicts: the prompt, tool
results, and assistant turns ART does not train on) and the model's own turns as openai ``Choice``
objects (``{finish_reason, index, message, logprobs}``: trained on) — with ``reward``, ``metrics``,
``metadata``, ``logs`` and ``tools``; a ``TrajectoryGroup`` holds the trajectories of one prompt
(``trajectories``, ``metadata``, ``exceptions``). Read here: a group (a list of groups is what
``LocalBackend`` logs to ``trajectories/<split>/<step>.yaml``, written by
``serialize_trajectory_groups`` — ``yaml.dump`` of ``trajectory_group_to_dict`` — read as it is,
through :mod:`backend.trace.yaml_guard`, or the same as JSON; or the ``model_dump`` ART's client
posts), a lone trajectory, or ``Trajectory.for_logging()`` (``messages`` each with ART's
``trainable`` flag).

There are no token ids: each trajectory is rendered with the chosen tokenizer and template
(``metadata.ids = "rendered"``), and the mask follows ART's flag — a trainable turn's tokens 1,
an assistant message ART does not train on 0 (like the prompt and tool output). Metadata:
``rewards`` = ``{"reward": ...}``, ``score`` the reward, ``group`` the group's (a content hash: ART
groups have no id) with ``sample`` the trajectory's index in it, ``training_step`` from a
``<step>.yaml`` (or ``.json``) file name under ``trajectories/<split>/``, the rest (metrics, metadata, logs, the group's metadata and exceptions,
each choice's finish reason and logprobs — per word/token of the model's text, not of the
re-rendered ids) under ``metadata.extra``.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, normalize_tools, record_id, trace_from_conversation
from backend.importers.trl import messages_of
from backend.trace.messages import json_type

_STEP_FILE = re.compile(r"^(\d{1,9})\.(?:json|ya?ml)$")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_trajectory(rec: Any) -> bool:
    if not isinstance(rec, dict) or "reward" not in rec:
        return False
    if isinstance(rec.get("messages_and_choices"), list):
        return True
    msgs = rec.get("messages")
    return isinstance(msgs, list) and any(isinstance(m, dict) and "trainable" in m for m in msgs)


def _is_group(rec: Any) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("trajectories"), list) and bool(rec["trajectories"])
            and all(_is_trajectory(t) for t in rec["trajectories"]))


def _items(traj: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], list[bool], list[dict[str, Any]]]:
    """``(messages, trainable per message, what each choice says besides its message)``."""
    msgs: list[dict[str, Any]] = []
    flags: list[bool] = []
    choices: list[dict[str, Any]] = []
    if "messages_and_choices" in traj:
        for i, item in enumerate(traj["messages_and_choices"]):
            if not isinstance(item, dict):
                raise RecordError(f"{where}.messages_and_choices[{i}] is {json_type(item)}, not a message or choice object")
            if "message" in item:  # a Choice: the model's turn, trained on
                if not isinstance(item["message"], dict):
                    raise RecordError(f"{where}.messages_and_choices[{i}].message is {json_type(item['message'])}, not a message")
                msgs.append(item["message"])
                flags.append(True)
                choices.append({"index": i, **{k: item[k] for k in ("finish_reason", "logprobs") if item.get(k) is not None}})
            else:
                msgs.append(item)
                flags.append(False)
    else:
        for i, m in enumerate(traj["messages"]):
            if not isinstance(m, dict):
                raise RecordError(f"{where}.messages[{i}] is {json_type(m)}, not a message object")
            t = m.get("trainable")
            if not isinstance(t, bool):
                raise RecordError(f"{where}.messages[{i}].trainable must be true or false, got {json_type(t)}")
            msgs.append({k: v for k, v in m.items() if k != "trainable"})
            flags.append(t)
    if not msgs:
        raise RecordError(f"{where} has no messages")
    for i, (m, t) in enumerate(zip(msgs, flags)):
        if t and m.get("role") != "assistant":
            raise RecordError(f"{where}: message {i} is marked trainable but its role is {m.get('role')!r}, not assistant")
    return msgs, flags, choices


@register
class ArtImporter(Importer):
    name = "art"
    label = "OpenPipe ART"
    description = "OpenPipe ART trajectories and trajectory groups (messages_and_choices / for_logging messages with trainable flags; text, re-rendered)"

    def sniff(self, record: Any) -> Any:
        if _is_group(record):
            return "trajectory group (trajectories of messages_and_choices)"
        if _is_trajectory(record):
            return "trajectory (messages and choices with a reward)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if _is_group(record):
            gid = "art-" + record_id(record, keys=())[:12]
            group = {k: record[k] for k in ("metadata", "exceptions") if record.get(k)}
            return [self._trajectory(t, f"trajectories[{i}]", ctx, gid, i, group) for i, t in enumerate(record["trajectories"])]
        if _is_trajectory(record):
            return [self._trajectory(record, "trajectory", ctx, None, None, {})]
        raise RecordError("not an ART trajectory (messages_and_choices or messages with trainable flags, and a reward) or trajectory group")

    def _trajectory(self, traj: dict[str, Any], where: str, ctx, gid: str | None, sample: int | None, group: dict[str, Any]) -> Any:
        reward = traj.get("reward")
        if not _num(reward) or (isinstance(reward, float) and not math.isfinite(reward)):
            raise RecordError(f"{where}.reward must be a finite number, got {json_type(reward)} {reward!r}"[:200])
        raw, flags, choices = _items(traj, where)
        bundle = ctx.bundle
        conv = Conversation(messages=[])
        conv.messages = messages_of(raw, where + ".messages", conv, ctx.parser, getattr(bundle.tokenizer, "eos_token", None), offset=0)
        conv.tools = normalize_tools(traj["tools"], f"{where}.tools") if traj.get("tools") else []
        meta: dict[str, Any] = {"rewards": {"reward": float(reward)}, "score": float(reward)}
        if gid is not None:
            meta["group"], meta["sample"] = gid, sample
        m = _STEP_FILE.match(os.path.basename(ctx.path or ""))
        if m and os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(ctx.path)))) == "trajectories":
            meta["training_step"] = int(m.group(1))
        extra: dict[str, Any] = {"trainable": flags}
        for k in ("metrics", "metadata", "logs"):
            if traj.get(k):
                extra[k] = traj[k]
        if choices:
            extra["choices"] = choices
        if group:
            extra["group"] = group
        meta["extra"] = extra
        conv.metadata = meta
        conv.id = record_id({"t": traj, "g": gid, "s": sample}, keys=())
        trace = trace_from_conversation(conv, bundle, self.name)
        untrained = {i for i, f in enumerate(flags) if not f and raw[i].get("role") == "assistant"}
        p = len(trace.prompt_ids)
        for s in trace.steps:  # ART does not train on assistant messages given as plain messages
            if s.mask == 1 and untrained.intersection(s.messages_added):
                s.mask = 0
                trace.response_mask[s.start - p : s.end - p] = [0] * (s.end - s.start)
        trace.metadata["provenance"] = {"format": self.label, "library": "openpipe-art"}
        if conv.losses:
            trace.metadata["import"] = {"losses": list(conv.losses)}
        return trace
