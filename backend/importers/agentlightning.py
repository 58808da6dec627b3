"""Agent Lightning rollout events → traces (agentlightning 1.0.x).

Agent Lightning's server keeps, per rollout attempt, a list of events
(``GET /api/rollouts/{id}/events``: ``{event_type, rollout_id, attempt_id, timestamp, data}``).
Its LLM proxy records every model call as a ``model_request`` event — the request body, the model
server's whole response (vLLM's ``prompt_token_ids``, ``choices[0].token_ids``,
``choices[0].logprobs``), status and usage; ``?format=triplet`` trims each to
``prompt_token_ids`` / ``response_token_ids`` / ``response_log_probs``. The environment or agent
posts ``reward`` events (``value``, ``source``, ``message``); any other event type is the agent's.

A file of such events (the API's JSON list, or one event per line; events of several rollouts
mixed) is read per rollout attempt: the model calls whose prompt extends the call before it form
one trace (:mod:`backend.importers.turns`: every id, the rollout logprobs per generated token, the
inserted tool/user tokens mask 0, ``metadata.ids = "given"``); a call that starts over starts a
new trace (``<rollout_id>/2``...). A failed call (HTTP error status, no response ids) is not a turn
(Agent Lightning's trainer skips it too): it is named in the import's losses and kept under
``metadata.extra.failed_requests``. Rewards: ``metadata.rewards`` (each reward event, by its
``source``), ``metadata.score`` the last one's value (the one Agent Lightning trains on). Rollout
records (``GET /api/rollouts``) in the same file give each trace its ``input``, state and group
(``input.data_id``, as Agent Lightning groups samples). Where a call stores both its ids and the
response text, the text must be in the decoded ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError
from backend.importers.turns import Call, logprob_list, segment_trace, segments, token_ids
from backend.trace import LoadProblem, TraceFormatError
from backend.trace.messages import json_type

_EVENT_KEYS = ("event_type", "rollout_id", "attempt_id", "data")


def _is_event(rec: Any) -> bool:
    return isinstance(rec, dict) and all(k in rec for k in _EVENT_KEYS)


def _rollout_of(rec: Any) -> dict[str, Any] | None:
    """A rollout record (``Rollout``, or ``RolloutDetail`` = ``{rollout, attempts}``), else None."""
    if isinstance(rec, dict) and isinstance(rec.get("rollout"), dict) and "attempts" in rec:
        rec = rec["rollout"]
    if isinstance(rec, dict) and isinstance(rec.get("rollout_id"), str) and "input" in rec and isinstance(rec.get("status"), dict):
        return rec
    return None


def _choice_logprobs(choice: dict[str, Any], where: str) -> Any:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("content"), list):
        out = []
        for i, item in enumerate(lp["content"]):
            if not isinstance(item, dict) or "logprob" not in item:
                raise RecordError(f"{where}.logprobs.content[{i}] has no logprob")
            out.append(item["logprob"])
        return out
    return lp.get("token_logprobs")


def _call_of(data: dict[str, Any], where: str) -> tuple[list[int], list[int], Any, str | None]:
    """``(prompt ids, response ids, logprobs as stored, response text)`` of a model_request."""
    if "response" not in data:  # ?format=triplet
        return (token_ids(data.get("prompt_token_ids", []), f"{where}.prompt_token_ids"),
                token_ids(data.get("response_token_ids", []), f"{where}.response_token_ids"),
                data.get("response_log_probs"), None)
    resp = data["response"]
    if isinstance(resp, list):  # raw stream chunks (older gateways)
        prompt: list[int] = []
        response: list[int] = []
        for i, chunk in enumerate(resp):
            if not isinstance(chunk, dict):
                raise RecordError(f"{where}.response[{i}] is {json_type(chunk)}, not a chunk object")
            if not prompt and chunk.get("prompt_token_ids"):
                prompt = token_ids(chunk["prompt_token_ids"], f"{where}.response[{i}].prompt_token_ids")
            ch = chunk.get("choices") or []
            if ch and isinstance(ch[0], dict) and ch[0].get("token_ids"):
                response += token_ids(ch[0]["token_ids"], f"{where}.response[{i}].choices[0].token_ids")
        return prompt, response, None, None
    if not isinstance(resp, dict):
        raise RecordError(f"{where}.response is {json_type(resp)}, not a response object")
    choices = resp.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    prompt = resp.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    prompt = token_ids(prompt, f"{where}.response.prompt_token_ids")
    response = token_ids(choice.get("token_ids") or [], f"{where}.response.choices[0].token_ids")
    msg = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    text = msg.get("content") if isinstance(msg.get("content"), str) else choice.get("text")
    return prompt, response, _choice_logprobs(choice, f"{where}.response.choices[0]"), text if isinstance(text, str) else None


def _failed(data: dict[str, Any], response_ids: list[int]) -> str | None:
    status = data.get("http_status")
    if data.get("status") == "error" or (isinstance(status, int) and status >= 400):
        resp = data.get("response")
        err = data.get("error") or (resp.get("error") if isinstance(resp, dict) else None)
        what = err.get("message") if isinstance(err, dict) else err
        return f"the call failed (HTTP {status}{': ' + str(what)[:120] if what else ''})"
    if not response_ids:
        return "the call has no response token ids"
    return None


def _reward_name(data: dict[str, Any], taken: dict[str, Any]) -> str:
    base = data.get("source") if isinstance(data.get("source"), str) and data.get("source") else "reward"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


@register
class AgentLightningImporter(Importer):
    name = "agentlightning"
    label = "Agent Lightning"
    description = "Agent Lightning rollout events (GET /api/rollouts/{id}/events, raw or ?format=triplet: model_request ids/logprobs, rewards)"
    grouped = True

    def sniff(self, record: Any) -> Any:
        if _is_event(record):
            return "rollout event (event_type, rollout_id, attempt_id, data)"
        r = _rollout_of(record)
        if r is not None and isinstance(r["status"].get("state"), str):
            return "rollout record (rollout_id, input, status)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        return [item for _, item in self.convert_group([(1, record)], ctx)]

    def convert_group(self, records: list[tuple[int, Any]], ctx) -> Iterator[tuple[int, Any]]:
        rollouts: dict[str, tuple[int, dict[str, Any]]] = {}
        attempts: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
        for n, rec in records:
            if _is_event(rec):
                rid, aid = rec["rollout_id"], rec["attempt_id"]
                if not isinstance(rid, str) or not isinstance(aid, str) or not isinstance(rec["data"], dict):
                    yield n, LoadProblem(n, "Agent Lightning event: rollout_id and attempt_id must be text and data an object")
                    continue
                attempts.setdefault((rid, aid), []).append((n, rec))
            elif (r := _rollout_of(rec)) is not None:
                rollouts[r["rollout_id"]] = (n, r)
            else:
                yield n, LoadProblem(n, f"not an Agent Lightning event or rollout record ({json_type(rec)})")
        several = {rid for rid, _ in attempts if sum(1 for r, _ in attempts if r == rid) > 1}
        for (rid, aid), events in attempts.items():
            n0 = events[0][0]
            try:
                yield from self._attempt(rid, aid, events, rollouts.get(rid, (0, None))[1], rid in several, ctx)
            except (RecordError, TraceFormatError) as e:
                yield n0, LoadProblem(n0, f"rollout {rid}: {e}")
        seen = {rid for rid, _ in attempts}
        for rid, (n, _) in rollouts.items():
            if rid not in seen:
                yield n, LoadProblem(n, f"rollout {rid}: no events of it in this file (a rollout record alone holds no "
                                        f"model calls; its events are GET /api/rollouts/{rid}/events)")

    def _attempt(self, rid: str, aid: str, events: list[tuple[int, dict[str, Any]]], rollout: dict[str, Any] | None,
                 several: bool, ctx) -> Iterator[tuple[int, Any]]:
        calls: list[Call] = []
        rewards: dict[str, float | None] = {}
        reward_events: list[dict[str, Any]] = []
        others: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        losses: list[str] = []
        tools = None
        view = "events"
        for k, (n, ev) in enumerate(events):
            data, kind, where = ev["data"], ev["event_type"], f"event {k} ({ev['event_type']})"
            if kind == "model_request":
                prompt, response, lp, text = _call_of(data, where)
                if "response" not in data:
                    view = "triplet"
                why = _failed(data, response)
                if why:
                    failed.append({"event": k, "reason": why, "data": data})
                    losses.append(f"{where}: {why}; not a turn (Agent Lightning's trainer skips it too), kept under metadata.extra.failed_requests")
                    continue
                vocab = len(ctx.bundle.tokenizer)
                token_ids(prompt, f"{where} prompt ids", vocab)
                token_ids(response, f"{where} response ids", vocab)
                logprobs = logprob_list(lp, f"{where} logprobs", len(response))
                if text and text.strip() and text.strip() not in ctx.bundle.tokenizer.decode(response, skip_special_tokens=True):
                    raise RecordError(f"{where}: the response token ids disagree with the response text {text.strip()[:60]!r}")
                info = {k2: data[k2] for k2 in ("model_version", "finish_reason", "usage", "latency_ms", "server") if data.get(k2) is not None}
                calls.append(Call(prompt, response, logprobs, where, info={"event": k, **info}))
                req = data.get("request")
                if tools is None and isinstance(req, dict) and isinstance(req.get("tools"), list):
                    tools = req["tools"]
            elif kind == "reward":
                v = data.get("value")
                name = _reward_name(data, rewards)
                rewards[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                reward_events.append(data)
            else:
                others.append({"event_type": kind, "data": data, "timestamp": ev.get("timestamp")})
        if not calls:
            raise RecordError("no successful model_request event with token ids: nothing to import" +
                              (f" ({len(failed)} failed call(s))" if failed else ""))
        last = reward_events[-1].get("value") if reward_events else None
        base = rid if not several else f"{rid}@{aid}"
        segs = segments(calls)
        for i, seg in enumerate(segs):
            meta: dict[str, Any] = {}
            extra: dict[str, Any] = {"calls": [c.info for c in seg.calls]}
            if rewards:
                meta["rewards"] = dict(rewards)
            if isinstance(last, (int, float)) and not isinstance(last, bool):
                meta["score"] = float(last)
            if reward_events:
                extra["reward_events"] = reward_events
            if others:
                extra["events"] = others
            if failed:
                extra["failed_requests"] = failed
            if len(segs) > 1:
                extra["segment"] = {"index": i + 1, "of": len(segs), "why": "the call's prompt does not extend the context before it"}
            if rollout is not None:
                inp = rollout.get("input")
                gid = inp.get("data_id") or inp.get("instance_id") if isinstance(inp, dict) else None
                if isinstance(gid, (str, int)) and not isinstance(gid, bool) and str(gid):
                    meta["group"] = str(gid)
                extra["rollout"] = {k: rollout[k] for k in ("input", "is_train", "metadata", "status") if k in rollout}
            if extra:
                meta["extra"] = extra
            if losses:
                meta["import"] = {"losses": list(losses)}
            tid = base if i == 0 else f"{base}/{i + 1}"
            trace = segment_trace(seg, ctx, self.name, trace_id=tid, metadata=meta, tools=tools)
            trace.metadata["provenance"] = {"format": self.label, "library": "agentlightning", "rollout_id": rid,
                                            "attempt_id": aid, "view": view}
            yield events[seg.calls[0].info["event"]][0], trace
