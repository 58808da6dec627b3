"""rLLM episodes → traces (rLLM 0.3, ``rllm.types.Episode``).

An rLLM ``Episode`` (``id`` = ``<task_id>:<rollout_idx>``, ``task``, ``termination_reason``,
``is_correct``, ``metrics``) holds ``trajectories`` (``uid``, ``name``, ``reward``), each a list of
``steps``: one LLM call each, with the call's ``prompt_ids``, ``response_ids`` and rollout
``logprobs``, the step's ``reward``, ``done``, ``advantage`` (set by rLLM's trainer), ``mc_return``,
``weight_version`` and the ``model_output`` rLLM got from the engine (its ``text``). Files: one JSON
object per episode as ``rllm eval`` saves them (``EvalEpisodeStore``: ``Episode.model_dump``, steps
with ``metadata``), or ``Episode.to_dict()`` (steps with ``info``), one per line or a list.

One trace per trajectory (``<episode id>/<name>`` when the episode has several): its steps' calls
merged where a prompt extends the context before it (:mod:`backend.importers.turns`; a step that
starts over starts a new trace ``.../2``). Ids and logprobs are kept exactly (``metadata.ids =
"given"``). Metadata: ``group`` = ``<task_id>:<name>`` (how rLLM groups trajectories for GRPO),
``sample`` = the rollout index, ``rewards`` = ``{"trajectory": ...}``, ``score`` = the trajectory's
reward (else the sum of its steps'), ``advantage`` = the steps' advantage when rLLM broadcast one
value; per step (reward, done, advantage, ...) and per episode (task, is_correct, metrics,
termination reason) under ``metadata.extra``, with the messages rLLM kept (``chat_completions``: a
step's when the next step's do not start with them, so the last step's at least; the trace's own
messages are decoded from the ids). A step whose ``model_output`` disagrees with its ids (other
``completion_ids``, a ``text`` that is not the decoded ids) is refused.
"""

from __future__ import annotations

from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError
from backend.importers.turns import Call, logprob_list, segment_trace, segments, token_ids
from backend.trace.messages import json_type

_STEP_INFO = ("id", "reward", "done", "advantage", "mc_return", "weight_version", "observation", "thought", "action",
              "model_response")
_EPISODE_INFO = ("task", "termination_reason", "is_correct", "session_id", "metrics", "artifacts", "eval_idx")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_episode(rec: Any) -> bool:
    if not isinstance(rec, dict) or not isinstance(rec.get("trajectories"), list) or "id" not in rec:
        return False
    trajs = rec["trajectories"]
    return ("is_correct" in rec or "termination_reason" in rec) and all(isinstance(t, dict) and "steps" in t for t in trajs)


def _check_output(step: dict[str, Any], response: list[int], where: str, tok: Any) -> dict[str, Any]:
    """The step's ``model_output`` against its ids; what it says of the call (finish reason...)."""
    mo = step.get("model_output")
    if not isinstance(mo, dict):
        return {}
    comp = mo.get("completion_ids")
    if comp is not None and comp != response:
        raise RecordError(f"{where}.model_output.completion_ids differ from the step's response_ids")
    text = mo.get("text")
    if isinstance(text, str) and response and tok.decode(response, skip_special_tokens=True).strip() != text.strip():
        raise RecordError(f"{where}: the response ids disagree with model_output.text {text.strip()[:60]!r}")
    return {k: mo[k] for k in ("finish_reason", "prompt_length", "completion_length", "metrics") if mo.get(k) is not None}


@register
class RllmImporter(Importer):
    name = "rllm"
    label = "rLLM"
    description = "rLLM episodes (Episode JSON: trajectories of steps with prompt_ids/response_ids/logprobs, rewards, advantages)"

    def sniff(self, record: Any) -> Any:
        return "episode (trajectories of steps)" if _is_episode(record) else False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected an rLLM episode object, got {json_type(record)}")
        if not _is_episode(record):
            raise RecordError("not an rLLM episode (id, trajectories of steps)")
        eid = str(record["id"])
        task_id, _, rollout = eid.partition(":")
        trajs = record["trajectories"]
        if not trajs:
            raise RecordError(f"episode {eid}: no trajectories")
        out: list[Any] = []
        episode = {k: record[k] for k in _EPISODE_INFO if k in record}
        if record.get("metadata") or record.get("info"):
            episode["metadata"] = record.get("metadata") or record.get("info")
        for ti, traj in enumerate(trajs):
            name = traj.get("name") if isinstance(traj.get("name"), str) else f"trajectory_{ti}"
            out += self._trajectory(traj, f"trajectories[{ti}]", eid if len(trajs) == 1 else f"{eid}/{name}",
                                    name, task_id, rollout, episode, ctx)
        return out

    def _trajectory(self, traj: dict[str, Any], where: str, base: str, name: str, task_id: str, rollout: str,
                    episode: dict[str, Any], ctx) -> list[Any]:
        steps = traj["steps"]
        if not isinstance(steps, list) or not steps:
            raise RecordError(f"{where}: no steps")
        tok = ctx.bundle.tokenizer
        calls: list[Call] = []
        infos: list[dict[str, Any]] = []
        for si, step in enumerate(steps):
            w = f"{where}.steps[{si}]"
            if not isinstance(step, dict):
                raise RecordError(f"{w} is {json_type(step)}, not a step object")
            prompt = token_ids(step.get("prompt_ids"), f"{w}.prompt_ids", len(tok))
            response = token_ids(step.get("response_ids"), f"{w}.response_ids", len(tok))
            if not response:
                raise RecordError(f"{w} has no response_ids (an eval-only step without token ids): nothing to import as given ids")
            lp = step.get("logprobs")
            logprobs = logprob_list(lp if lp else None, f"{w}.logprobs", len(response))
            info = {k: step[k] for k in _STEP_INFO if k in step}
            meta = step.get("metadata") if step.get("metadata") is not None else step.get("info")
            if meta:
                info["metadata"] = meta
            info.update(_check_output(step, response, w, tok))
            infos.append(info)
            calls.append(Call(prompt, response, logprobs, w, info={"step": si}))
        rewards = [s.get("reward") for s in steps]
        tr = traj.get("reward")
        score = float(tr) if _num(tr) else (float(sum(r for r in rewards if _num(r))) if any(_num(r) for r in rewards) else None)
        advs = {s.get("advantage") for s in steps if _num(s.get("advantage"))}
        for si, step in enumerate(steps):  # the messages rLLM kept: each step's, unless the next step's start with them
            cc = step.get("chat_completions")
            nxt = steps[si + 1].get("chat_completions") if si + 1 < len(steps) else None
            if cc and not (isinstance(nxt, list) and isinstance(cc, list) and nxt[: len(cc)] == cc):
                infos[si]["chat_completions"] = cc
        segs = segments(calls)
        out = []
        for i, seg in enumerate(segs):
            meta: dict[str, Any] = {"group": f"{task_id}:{name}"}
            if rollout.isdigit():
                meta["sample"] = int(rollout)
            if _num(tr) or tr is None:
                meta["rewards"] = {"trajectory": float(tr) if _num(tr) else None}
            if score is not None:
                meta["score"] = score
            if len(advs) == 1:
                meta["advantage"] = float(next(iter(advs)))
            extra: dict[str, Any] = {"trajectory": {k: traj[k] for k in ("uid", "name", "signals", "task") if traj.get(k) is not None},
                                     "steps": [infos[c.info["step"]] for c in seg.calls], "episode": episode}
            if traj.get("metadata") or traj.get("info"):
                extra["trajectory"]["metadata"] = traj.get("metadata") or traj.get("info")
            if len(segs) > 1:
                extra["segment"] = {"index": i + 1, "of": len(segs), "why": "the step's prompt does not extend the context before it"}
            meta["extra"] = extra
            trace = segment_trace(seg, ctx, self.name, trace_id=base if i == 0 else f"{base}/{i + 1}", metadata=meta)
            trace.metadata["provenance"] = {"format": self.label, "library": "rllm", "episode_id": base.split("/")[0],
                                            "trajectory": name}
            out.append(trace)
        return out
