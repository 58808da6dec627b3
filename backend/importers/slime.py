"""slime's rollout dumps (``--save-debug-rollout-data``, a torch ``.pt``) → traces, ids kept exactly.

slime saves each rollout as ``torch.save({"rollout_id": N, "samples": [sample.to_dict(), ...]})``
(``save_debug_rollout_data``, ``slime/observability/rollout_data_utils.py``): a pickle, read here
only through :mod:`backend.safety.pickle_guard` (a worker process, an allow-list of globals, torch's
``weights_only`` loader; refused on a public server). Each sample is ``Sample.to_dict()``
(``slime/utils/types.py``): ``tokens`` (prompt and response), ``response_length`` (the last that many
tokens are the response), ``loss_mask`` and ``rollout_log_probs`` (one per response token),
``reward`` (a number, or a dict when a reward model returns several), ``group_index``, ``index``,
``status``, ``prompt``, ``response``, ``label``, ``metadata`` and more.

The importer reads the records :func:`backend.importers.pickle_records` makes of such a file
(``{"slime_sample": sample, "rollout_id": N}``) and bare sample dicts. ``metadata.training_step``
is the rollout id, ``group`` the group index, ``score`` / ``rewards`` the reward, ``stop_reason``
the status; ``rollout_log_probs`` are the generated steps' logprobs; a missing ``loss_mask`` is
all ones over the response (as slime trains it: ``metadata.mask = "assumed"``); everything else
the sample holds is in ``metadata.extra``.
"""

from __future__ import annotations

from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError, trace_from_ids
from backend.importers.rollout_fields import floats_of, ints, is_num, mask_of, number_or_none
from backend.trace.messages import json_type
from backend.trace.model import TerminationReason

_USED = {"tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "group_index", "status"}
_STATUS_TO_TERMINATION = {"truncated": TerminationReason.RESPONSE_LENGTH}


def _sample(record: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(sample, what the file says around it)``."""
    if isinstance(record, dict) and isinstance(record.get("slime_sample"), dict):
        return record["slime_sample"], {k: v for k, v in record.items() if k != "slime_sample"}
    if isinstance(record, dict):
        return record, {}
    raise RecordError(f"expected a slime sample (a dict), got {json_type(record)}")


@register
class SlimeImporter(Importer):
    name = "slime"
    label = "slime"
    description = "slime rollout dumps (torch .pt of Sample.to_dict(): tokens, response_length, loss_mask, rollout_log_probs)"

    def sniff(self, record: Any) -> Any:
        if isinstance(record, dict) and isinstance(record.get("slime_sample"), dict):
            return "a sample of a slime rollout dump"
        if isinstance(record, dict) and "tokens" in record and "response_length" in record:
            return "a slime sample (tokens, response_length)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        s, around = _sample(record)
        tokens = ints(s.get("tokens"), "tokens")
        n = s.get("response_length")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(tokens):
            raise RecordError(f"response_length is {n!r} for {len(tokens)} tokens")
        p = len(tokens) - n
        meta: dict[str, Any] = {}
        if s.get("loss_mask") is None:
            mask = [1] * n
            meta["mask"] = "assumed"
        else:
            mask = mask_of(s["loss_mask"], "loss_mask", n)
        lp = floats_of(s["rollout_log_probs"], "rollout_log_probs", n) if s.get("rollout_log_probs") is not None else None
        reward = s.get("reward")
        if isinstance(reward, dict):
            meta["rewards"] = {str(k): (number_or_none(v, f"reward.{k}") if is_num(v) or v is None else None)
                               for k, v in reward.items()}
        elif reward is not None:
            meta["score"] = number_or_none(reward, "reward")
            meta["rewards"] = {"reward": meta["score"]}
        if isinstance(around.get("rollout_id"), int):
            meta["training_step"] = around["rollout_id"]
        if isinstance(s.get("group_index"), int):
            meta["group"] = str(s["group_index"])
        status = s.get("status")
        if isinstance(status, str):
            meta["stop_reason"] = status
        extra = {k: v for k, v in s.items() if k not in _USED}
        if isinstance(reward, dict):
            extra["reward"] = reward  # as written (non-numeric entries too)
        if extra:
            meta["extra"] = extra
        idx = s.get("index")
        tid = f"rollout{around.get('rollout_id')}-sample{idx}" if isinstance(idx, int) else None
        trace = trace_from_ids(tokens[:p], tokens[p:], mask, ctx.bundle, self.name, parser=ctx.parser, trace_id=tid,
                               metadata=meta, logprobs=lp,
                               termination_reason=_STATUS_TO_TERMINATION.get(status) if isinstance(status, str) else None)
        trace.metadata["provenance"] = {"format": self.label, "library": "slime"}
        return [trace]
