"""NeMo-Gym rollouts (``rollouts.jsonl``) → traces, their ids kept exactly.

``ng_collect_rollouts`` (``nemo_gym/rollout_collection.py``) writes one line per rollout: the
input row's fields (``responses_create_params``, ``agent_ref``, ``_ng_task_index``,
``_ng_rollout_index``) with the agent's answer (``response``: a Responses API object, ``reward``
and whatever the environment's verify adds). In training mode the model server puts
``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs`` on the output items a
model call produced (``TokenIDLogProbMixin``, ``nemo_gym/openai_utils.py``).

Read as NeMo-RL reads it (``nemo_rl/environments/nemo_gym.py``): the output items with a non-empty
``generation_token_ids`` in order; each call's ``prompt_token_ids`` must start with every token seen
so far (else the history was re-tokenised or cut: the record is refused, naming the item and the
first token that differs, as NeMo-RL refuses it); the new prompt tokens are context (mask 0), the
generated ones are trained on (mask 1) with their logprobs. ``metadata.group`` is the task index,
``metadata.sample`` the rollout index, ``score`` the reward, the tools those of
``responses_create_params``; the rest of the line (the request,
the response without its token arrays, the environment's fields) is in ``metadata.extra``.
"""

from __future__ import annotations

from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError, normalize_tools, record_id, trace_from_ids
from backend.importers.rollout_fields import floats_of, ints, number_or_none
from backend.trace.messages import json_type

_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_TASK, _ROLLOUT = "_ng_task_index", "_ng_rollout_index"


def _output(record: Any) -> list[Any] | None:
    resp = record.get("response") if isinstance(record, dict) else None
    out = resp.get("output") if isinstance(resp, dict) else None
    return out if isinstance(out, list) else None


def _stripped(record: dict[str, Any]) -> dict[str, Any]:
    """The line without the token arrays (they are the trace's) and the fields kept elsewhere."""
    out = {k: v for k, v in record.items() if k not in ("reward", _TASK, _ROLLOUT)}
    resp = dict(record["response"])
    resp["output"] = [{k: v for k, v in it.items() if k not in _TOKEN_FIELDS} if isinstance(it, dict) else it
                      for it in resp["output"]]
    out["response"] = resp
    return out


@register
class NemoGymImporter(Importer):
    name = "nemo-gym"
    label = "NeMo-Gym"
    description = "NeMo-Gym rollouts (rollouts.jsonl: Responses output items with prompt/generation token ids and logprobs)"

    def sniff(self, record: Any) -> Any:
        out = _output(record)
        if out and any(isinstance(it, dict) and "generation_token_ids" in it for it in out):
            return "a rollout whose output items carry generation_token_ids"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        out = _output(record)
        if out is None:
            raise RecordError(f"a NeMo-Gym rollout needs response.output, a list (got {json_type(record)})")
        prompt: list[int] | None = None
        seen: list[int] = []
        resp_ids: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        for i, it in enumerate(out):
            if not isinstance(it, dict) or not it.get("generation_token_ids"):
                continue  # not a model call's tokens (tool output, or an empty generation NeMo-RL skips too)
            where = f"response.output[{i}]"
            p = ints(it.get("prompt_token_ids"), f"{where}.prompt_token_ids")
            g = ints(it["generation_token_ids"], f"{where}.generation_token_ids")
            lp = floats_of(it.get("generation_log_probs"), f"{where}.generation_log_probs", len(g))
            if p[: len(seen)] != seen:
                at = next((j for j, (a, b) in enumerate(zip(seen, p)) if a != b), min(len(seen), len(p)))
                raise RecordError(f"{where}.prompt_token_ids does not continue the tokens before it: they differ at "
                                  f"token {at} (the history was re-tokenised or cut; NeMo-RL refuses such a rollout)")
            new = p[len(seen):]
            if prompt is None:
                prompt = new
            else:
                resp_ids += new
                mask += [0] * len(new)
                lps += [0.0] * len(new)
            resp_ids += g
            mask += [1] * len(g)
            lps += lp
            seen = p + g
        if prompt is None:
            raise RecordError("no output item carries generation_token_ids: nothing to train on (NeMo-RL refuses it too)")
        meta: dict[str, Any] = {"extra": _stripped(record)}
        if "reward" in record:
            r = number_or_none(record["reward"], "reward")
            meta["rewards"] = {"reward": r}
            if r is not None:
                meta["score"] = r
        if isinstance(record.get(_TASK), int):
            meta["group"] = str(record[_TASK])
        if isinstance(record.get(_ROLLOUT), int):
            meta["sample"] = record[_ROLLOUT]
        tid = (f"task{record[_TASK]}-rollout{record[_ROLLOUT]}" if "group" in meta and "sample" in meta
               else record_id(record.get("response") or {}, keys=("id",)))
        params = record.get("responses_create_params")
        tools = normalize_tools(params.get("tools"), "responses_create_params.tools") if isinstance(params, dict) else []
        trace = trace_from_ids(prompt, resp_ids, mask, ctx.bundle, self.name, parser=ctx.parser, trace_id=tid,
                               metadata=meta, logprobs=lps, tools=tools or None)
        trace.metadata["provenance"] = {"format": self.label, "library": "nemo-gym"}
        return [trace]
