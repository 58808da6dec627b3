"""AReaL rollout dumps → conversations (areal 1.0.4, ``WorkflowExecutor._dump_trajectory``).

With ``rollout.dump_to_file`` AReaL appends, per rollout task, one JSON line per sample to
``<fileroot>/logs/<user>/<experiment>/<trial>/rollout/<tail_version>/<task_id>.jsonl``
(``eval-rollout/`` for evaluation): ``task_id``, ``sample_idx``, ``seqlen``, ``prompt_len`` (the
sequence length, and where the prompt ends: ``seqlen`` minus the loss mask's ones), ``head_version``
/ ``tail_version`` (the oldest and newest policy versions that generated it), ``reward``, and
``prompt`` / ``completion``: the ids decoded with special tokens kept. No ids, mask or logprobs are
written, so the conversation is recovered from the text (ChatML turns of the two texts joined:
AReaL's split is ``seqlen`` minus the mask's ones, which in a multi-turn sample falls inside a later
turn, not at the first generation) and rendered with the chosen tokenizer (``metadata.ids = "rendered"``). Where the chosen tokenizer
does not give the file's ``prompt_len`` and ``seqlen - prompt_len`` tokens for the two texts (another
tokenizer, or ids that do not re-tokenise the same), the import says so.

Metadata: ``group`` = the task id (AReaL's samples of one task share its prompt), ``sample`` =
``sample_idx``, ``training_step`` = ``tail_version`` (the folder AReaL files the dump under),
``rewards`` / ``score`` the reward; the versions and lengths under ``metadata.extra``, the texts as
written under ``metadata.prompt`` / ``metadata.completion``.
"""

from __future__ import annotations

import math
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError
from backend.importers.skyrl import recover_messages
from backend.trace.messages import json_type

_KEYS = ("task_id", "sample_idx", "seqlen", "prompt_len", "head_version", "tail_version", "reward", "prompt", "completion")
_INTS = ("task_id", "sample_idx", "seqlen", "prompt_len", "head_version", "tail_version")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@register
class ArealImporter(Importer):
    name = "areal"
    label = "AReaL"
    description = "AReaL rollout dumps (rollout/<version>/<task_id>.jsonl: prompt/completion text, prompt_len, seqlen, reward, versions)"

    def sniff(self, record: Any) -> Any:
        if isinstance(record, dict) and all(k in record for k in ("prompt", "completion", "prompt_len", "seqlen", "task_id")):
            return "rollout dump line (task_id, prompt, completion, prompt_len, seqlen)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected an AReaL rollout dump line, got {json_type(record)}")
        for k in ("prompt", "completion"):
            if not isinstance(record.get(k), str):
                raise RecordError(f"AReaL rollout dump: {k!r} must be text, got {json_type(record.get(k)) if k in record else 'nothing'}")
        for k in _INTS:
            if k in record and not _int(record[k]):
                raise RecordError(f"AReaL rollout dump: {k!r} must be an integer, got {json_type(record[k])}")
        seqlen, plen = record.get("seqlen"), record.get("prompt_len")
        if _int(seqlen) and _int(plen) and not 0 <= plen < seqlen:
            raise RecordError(f"AReaL rollout dump: prompt_len {plen} is not below seqlen {seqlen}")
        reward = record.get("reward")
        if reward is not None and not (isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)):
            raise RecordError(f"AReaL rollout dump: reward must be a finite number, got {json_type(reward)} {reward!r}"[:200])
        bundle = ctx.bundle
        tok = bundle.tokenizer
        losses: list[str] = []
        messages, tools, how = recover_messages(record["prompt"], record["completion"], ctx.parser, getattr(tok, "eos_token", None),
                                               losses, joined=True)
        if _int(seqlen) and _int(plen):
            got = (len(tok.encode(record["prompt"], add_special_tokens=False)), len(tok.encode(record["completion"], add_special_tokens=False)))
            if got != (plen, seqlen - plen):
                losses.append(f"token counts: the chosen tokenizer gives {got[0]} + {got[1]} tokens for the prompt and completion "
                              f"texts, the file says {plen} + {seqlen - plen} (prompt_len, seqlen): not the run's tokenizer, or "
                              f"ids that do not re-tokenise the same")
        meta: dict[str, Any] = {"messages": "recovered", "recovered_from": how}
        if _int(record.get("task_id")):
            meta["group"] = str(record["task_id"])
        if _int(record.get("sample_idx")):
            meta["sample"] = record["sample_idx"]
        if _int(record.get("tail_version")):
            meta["training_step"] = record["tail_version"]
        if reward is not None:
            meta["rewards"] = {"reward": float(reward)}
            meta["score"] = float(reward)
        extra = {k: record[k] for k in ("head_version", "tail_version", "seqlen", "prompt_len") if k in record}
        extra.update({k: v for k, v in record.items() if k not in _KEYS})
        meta["extra"] = extra
        meta["prompt"], meta["completion"] = record["prompt"], record["completion"]
        tid = "areal-" + "-".join(str(record.get(k)) for k in ("tail_version", "task_id", "sample_idx"))
        conv = Conversation(messages=messages, tools=tools or [], metadata=meta, id=tid, losses=losses)
        conv.provenance = {"format": self.label, "library": "areal"}
        return [conv]
