"""NeMo-RL's training data dumps (``train_data_step{N}.jsonl``) → traces, their ids kept exactly.

NeMo-RL's GRPO loop (``nemo_rl/algorithms/grpo.py``) logs each step's training batch with
``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py``): one line per sample, every
key holding that sample's slice of the batch (a batch of one: ``"rewards": [r]``,
``"token_ids": [[...]]``), plus ``"idx"`` (the sample's place in the batch). The keys:
``token_ids`` (prompt, generated turns and environment turns as one sequence, right-padded with the
pad id to the batch's length), ``input_lengths`` (the unpadded length), ``token_loss_mask`` (1 on
generated tokens), ``generation_logprobs`` (the inference engine's logprob of each token, 0 where
nothing was generated), ``prev_logprobs`` (the policy's recompute before the update),
``advantages`` (per token: GRPO's one number expanded over the row), ``rewards``, ``sample_loss_mask``, ``content`` (each message's text)
and, where used, ``filtered_rewards`` and ``agent_ref``.

The trace: ``prompt_ids`` are the tokens before the first masked-in one, ``response_ids`` the rest up
to ``input_lengths``, ``response_mask`` the loss mask over them; ``generation_logprobs`` become the
generated steps' rollout logprobs and ``prev_logprobs`` their ``info.trainer_logprobs``
(``trace.scorer.kind = "NeMo-RL prev_logprobs"``). ``metadata.training_step`` is the file name's N,
``score`` the reward, ``rewards`` every reward column, ``advantage`` the row's one number (GRPO),
else the response's token-level advantages; what the trace has no slot for (the prompt's
``prev_logprobs``, ``content``, ``sample_loss_mask``, the padding's length) is in
``metadata.extra``.
"""

from __future__ import annotations

import re
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError, record_id, trace_from_ids
from backend.importers.rollout_fields import advantage_of, floats_of, ints, mask_of, number_or_none, set_trainer_logprobs, step_in_name
from backend.trace.messages import json_type

_STEP = re.compile(r"^train_data_step(\d{1,12})\.jsonl$")
_TOKEN_KEYS = ("token_ids", "token_loss_mask", "generation_logprobs", "prev_logprobs", "advantages")
_REWARD_KEYS = ("rewards", "filtered_rewards")
_KNOWN = {*_TOKEN_KEYS, *_REWARD_KEYS, "input_lengths", "idx"}


def _one(rec: dict[str, Any], key: str) -> Any:
    """A key's value for the one sample of the line (the batch-of-one slice NeMo-RL writes)."""
    v = rec[key]
    if not isinstance(v, list) or len(v) != 1:
        raise RecordError(f"{key} must hold one sample's value (a batch of one), got {json_type(v)}"
                          f"{f' of {len(v)}' if isinstance(v, list) else ''}")
    return v[0]


def _split(values: list[float], first: int, end: int) -> tuple[list[float], list[float]]:
    return values[:first], values[first:end]


@register
class NemoRlImporter(Importer):
    name = "nemo-rl"
    label = "NeMo-RL"
    description = "NeMo-RL training data dumps (train_data_step{N}.jsonl: token_ids, token_loss_mask, generation/prev logprobs)"

    def sniff(self, record: Any) -> Any:
        if isinstance(record, dict) and "token_ids" in record and "token_loss_mask" in record:
            return "train data line (token_ids, token_loss_mask)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {json_type(record)}")
        ids = ints(_one(record, "token_ids"), "token_ids")
        n = len(ids)
        length = n
        if "input_lengths" in record:
            length = _one(record, "input_lengths")
            if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= n:
                raise RecordError(f"input_lengths is {length!r} for {n} token ids")
        mask = mask_of(_one(record, "token_loss_mask"), "token_loss_mask", n)
        if any(mask[length:]):
            raise RecordError(f"token_loss_mask has 1s in the padding after input_lengths ({length})")
        first = mask.index(1) if 1 in mask[:length] else length
        extra: dict[str, Any] = {}
        gen = prev = None
        if record.get("generation_logprobs") is not None:
            before, gen = _split(floats_of(_one(record, "generation_logprobs"), "generation_logprobs", n), first, length)
            if any(before):
                extra["generation_logprobs_prompt"] = before
        if record.get("prev_logprobs") is not None:
            before, prev = _split(floats_of(_one(record, "prev_logprobs"), "prev_logprobs", n), first, length)
            extra["prev_logprobs_prompt"] = before
        meta: dict[str, Any] = {}
        if record.get("advantages") is not None:
            adv = _one(record, "advantages")
            if isinstance(adv, list):
                row = floats_of(adv, "advantages", n)
                meta["advantage"] = advantage_of(row)  # GRPO's: one number expanded over the row
                if isinstance(meta["advantage"], list):
                    before, meta["advantage"] = _split(row, first, length)
                    if any(before):
                        extra["advantages_prompt"] = before
            else:
                meta["advantage"] = number_or_none(adv, "advantages")
        rewards = {k: number_or_none(_one(record, k), k) for k in _REWARD_KEYS if k in record}
        if rewards:
            meta["rewards"] = rewards
            if rewards.get("rewards") is not None:
                meta["score"] = rewards["rewards"]
        step = step_in_name(ctx.path, _STEP)
        if step is not None:
            meta["training_step"] = step
        if length < n:
            extra["padding"] = n - length
        for k, v in record.items():
            if k not in _KNOWN:
                extra[k] = v[0] if isinstance(v, list) and len(v) == 1 else v
        if extra:
            meta["extra"] = extra
        idx = record.get("idx")
        tid = f"step{step}-{idx}" if step is not None and isinstance(idx, int) else record_id(record, keys=())
        trace = trace_from_ids(ids[:first], ids[first:length], mask[first:length], ctx.bundle, self.name, parser=ctx.parser,
                               trace_id=tid, metadata=meta, logprobs=gen)
        if prev is not None:
            set_trainer_logprobs(trace, prev, "NeMo-RL prev_logprobs")
        trace.metadata["provenance"] = {"format": self.label, "library": "nemo-rl", **({"idx": idx} if idx is not None else {})}
        return [trace]
