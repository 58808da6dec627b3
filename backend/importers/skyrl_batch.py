"""SkyRL's training-batch dumps (``trainer.dump_data_batch=true``) → one trace per row, ids kept exactly.

skyrl-train 0.4 writes ``<export_path>/dumped_data/global_step_<N>_training_input.pkl`` each step
(``RayPPOTrainer.dump_data``: ``TrainingInputBatch.save``, a pickle), read here only through
:mod:`backend.safety.pickle_guard` (a worker process; SkyRL's class becomes a stand-in holding its pickled
state; refused on a public server). The batch is a dict of ``[rows, columns]`` tensors, as
``convert_prompts_responses_to_batch_tensors`` pads them: ``sequences`` = the prompt padded on the
LEFT then the response padded on the RIGHT, ``attention_mask`` over both, ``response_mask``,
``loss_mask``, ``rollout_logprobs`` (the inference engine's), ``action_log_probs`` (the policy's
forward), ``base_action_log_probs`` (the reference model's), ``values``, ``returns``,
``advantages`` (one per response column), ``is_last_step`` (one per row); ``metadata`` holds
``response_length`` (the response columns), ``avg_response_length``, ``pad_size`` (rows that
``pad_batch`` appended, copies of the first rows, for the data-parallel split), ``metrics`` and,
for step-wise training, ``trajectory_ids`` (``<uid>_<repetition>``). SkyRL drops ``rewards`` and
``metadata["uids"]`` before it dumps; a batch that still has them (saved earlier by hand) keeps
them here too.

Each row: the prompt is the ``attention_mask``'s ones of the prompt columns, the response the
``response_mask``'s ones (both checked to be SkyRL's padding); ``loss_mask`` is the response
mask, ``rollout_logprobs`` the generated steps' logprobs, ``action_log_probs`` (else
``base_action_log_probs``) the trainer logprobs the lens shows beside them; ``advantage``,
``returns``, ``values``, ``base_action_log_probs`` over the response's tokens (the padding columns
after it, where the models' outputs mean nothing, are not kept). ``group`` / ``sample`` from the
row's uid or trajectory id; ``training_step`` from the file's name. The batch's metadata is under
``metadata.extra.batch``, and a padding row says so (``metadata.extra.padding_row``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from backend.importers.common import RecordError, trace_from_ids
from backend.importers.rollout_fields import (
    advantage_of,
    floats_of,
    ints,
    is_int,
    mask_of,
    set_trainer_logprobs,
    step_in_name,
)
from backend.trace import LoadProblem
from backend.trace.messages import json_type

ROW = "skyrl_batch_row"
_STEP_FILE = re.compile(r"global_step_(\d{1,12})_training_input")
_PER_TOKEN = ("rollout_logprobs", "action_log_probs", "base_action_log_probs", "values", "returns", "advantages",
              "kl", "rewards")
_USED = {"sequences", "attention_mask", "response_mask", "loss_mask", *_PER_TOKEN}
_PER_ROW_META = ("uids", "trajectory_ids")


def batch_rows(doc: dict[str, Any]) -> Iterator[tuple[int, Any]]:
    """``(number, record or LoadProblem)`` for each row of a SkyRL batch as the pickle reader
    gives it (``{"skyrl_batch", "batch_size", "tensors", "metadata"}``)."""
    tensors, meta = doc.get("tensors"), doc.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    n = doc.get("batch_size")
    if not isinstance(tensors, dict) or not is_int(n):
        yield 1, LoadProblem(1, "a SkyRL batch without tensors or batch size")
        return
    for k, v in [*tensors.items(), *((k, meta.get(k)) for k in _PER_ROW_META if k in meta)]:
        if v is not None and (not isinstance(v, list) or len(v) != n):
            yield 1, LoadProblem(1, f"SkyRL batch: {k!r} has {len(v) if isinstance(v, list) else json_type(v)} rows "
                                    f"for a batch of {n}")
            return
    shared = {k: v for k, v in meta.items() if k not in _PER_ROW_META}
    pad = meta.get("pad_size") if is_int(meta.get("pad_size")) else 0
    for i in range(n):
        yield i + 1, {ROW: {k: v[i] for k, v in tensors.items() if v is not None}, "row": i, "class": doc["skyrl_batch"],
                      "batch": shared, "padding_row": i >= n - pad,
                      **{k[:-1]: meta[k][i] for k in _PER_ROW_META if isinstance(meta.get(k), list)}}


def _edges(mask: list[int], where: str, *, left: bool) -> int:
    """The count of ones of a padded 0/1 mask: zeros then ones (``left``) or ones then zeros."""
    k = sum(mask)
    want = [0] * (len(mask) - k) + [1] * k if left else [1] * k + [0] * (len(mask) - k)
    if mask != want:
        side = "left" if left else "right"
        raise RecordError(f"{where} is not SkyRL's {side} padding (ones {'after' if left else 'before'} zeros)")
    return k


def _group(record: dict[str, Any], meta: dict[str, Any], extra: dict[str, Any]) -> None:
    uid, tid = record.get("uid"), record.get("trajectory_id")
    if isinstance(tid, str):
        extra["trajectory_id"] = tid
        head, _, rep = tid.rpartition("_")
        if head and rep.isdigit():
            meta["group"], meta["sample"] = head, int(rep)
        else:
            meta["group"] = tid
    if isinstance(uid, str):
        meta["group"] = uid


def convert_row(record: dict[str, Any], ctx: Any, source: str) -> Any:
    """One row of a SkyRL batch dump → a trace (ids, masks and logprobs as written)."""
    t, i = record[ROW], record.get("row")
    batch = record.get("batch") if isinstance(record.get("batch"), dict) else {}
    seq = ints(t.get("sequences"), "sequences")
    att = mask_of(t.get("attention_mask"), "attention_mask", len(seq))
    r = batch.get("response_length")
    if not is_int(r):
        r = len(t["response_mask"]) if isinstance(t.get("response_mask"), list) else None
    if r is None or not 0 <= r <= len(seq):
        raise RecordError(f"response_length is {r!r} for {len(seq)} sequence columns")
    p = len(seq) - r
    resp_mask = mask_of(t.get("response_mask"), "response_mask", r)
    n = _edges(resp_mask, "response_mask", left=False)
    if att[p:] != resp_mask:
        raise RecordError("attention_mask over the response columns differs from response_mask")
    k = _edges(att[:p], "attention_mask over the prompt columns", left=True)
    loss = mask_of(t.get("loss_mask"), "loss_mask", r)
    if any(loss[n:]):
        raise RecordError("loss_mask is 1 past the response's last token")
    cols = {key: floats_of(t[key], key, r)[:n] for key in _PER_TOKEN if t.get(key) is not None}
    meta: dict[str, Any] = {}
    extra: dict[str, Any] = {"row": i}
    step = step_in_name(getattr(ctx, "path", None), _STEP_FILE)
    if step is not None:
        meta["training_step"] = step
    _group(record, meta, extra)
    if "advantages" in cols:
        meta["advantage"] = advantage_of(cols["advantages"])
    if "rewards" in cols:
        meta["score"] = sum(cols["rewards"])
        meta["rewards"] = {"reward": meta["score"]}
    for key in ("base_action_log_probs", "values", "returns", "kl", "rewards"):
        if key in cols:
            extra[key] = cols[key]
    if "is_last_step" in t:
        extra["is_last_step"] = t["is_last_step"]
    extra.update({key: v for key, v in t.items() if key not in _USED and key != "is_last_step"})
    if record.get("padding_row"):
        extra["padding_row"] = True
    extra["batch"] = batch
    meta["extra"] = extra
    tid = f"step{step}-row{i}" if step is not None else f"row{i}"
    trace = trace_from_ids(seq[p - k : p], seq[p : p + n], loss[:n], ctx.bundle, source, parser=ctx.parser,
                           trace_id=tid, metadata=meta, logprobs=cols.get("rollout_logprobs"))
    trainer = "action_log_probs" if "action_log_probs" in cols else "base_action_log_probs" if "base_action_log_probs" in cols else None
    if trainer is not None:
        set_trainer_logprobs(trace, cols[trainer], f"skyrl {trainer}")
    trace.metadata["provenance"] = {"format": "SkyRL", "library": "skyrl-train", "class": record.get("class"), "row": i}
    return trace
