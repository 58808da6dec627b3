"""prime-rl trainer token exports → traces.

With ``enable_token_export``, prime-rl's trainer (``prime_rl/trainer/rl/token_export.py``) appends
one JSON line per trained sequence to ``token_exports/step_<N>/rank_<R>.jsonl``:
``schema_version``, ``step``, ``rank``, ``micro_step``, ``micro_sequence_idx``,
``export_sequence_idx``, ``env_name`` and per-token columns as long as ``token_ids``:
``position_ids``, ``loss_mask`` (true/false), ``advantages``, ``inference_logprobs`` (the
rollout's, 0.0 on tokens it did not sample), ``trainer_logprobs`` (the trainer's forward, shifted
so position i scores token i), ``entropy``, ``mismatch_kl``, ``log_importance_ratio``,
``importance_ratio``, ``prob_delta``, ``is_masked`` / ``is_masked_high`` / ``is_masked_low``,
``rl_weights`` / ``ce_weights`` / ``ref_kl_weights`` (a float column is null where the value was
not finite; a column the trainer did not compute is all null).

The sequence is kept exactly (``metadata.ids = "given"``): the prompt is every token before the
first loss-mask token (the record names no prompt length), the response the rest with
``loss_mask`` as its mask. Rollout logprobs (``inference_logprobs``) go to the generating steps'
``logprobs``, the trainer's to every step's ``info.trainer_logprobs`` (``trace.scorer`` =
"prime-rl trainer_logprobs"), so the logprob lens shows both without rescoring. Messages are
recovered from the decoded text (ChatML). ``training_step`` and ``rank`` come from the record,
else from the file's ``step_<N>`` folder and ``rank_<R>.jsonl`` name; the advantage, the
per-token columns as written (``metadata.extra.columns``) and the mismatch KL summed and
averaged over the loss-mask tokens (``metadata.extra.mismatch_kl``) are kept.
"""

from __future__ import annotations

import math
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import RecordError, record_id, trace_from_ids
from backend.importers.rollout_fields import (
    advantage_of,
    as_step_floats,
    bools,
    floats,
    ints,
    is_int,
    run_path_fields,
    set_trainer_logprobs,
)
from backend.trace.messages import json_type

_FLOAT_COLUMNS = ("advantages", "inference_logprobs", "trainer_logprobs", "entropy", "mismatch_kl", "log_importance_ratio",
                  "importance_ratio", "prob_delta", "rl_weights", "ce_weights", "ref_kl_weights")
_BOOL_COLUMNS = ("is_masked", "is_masked_high", "is_masked_low")
_SCALARS = ("schema_version", "step", "rank", "micro_step", "micro_sequence_idx", "export_sequence_idx", "env_name")


@register
class PrimeRlImporter(Importer):
    name = "prime-rl"
    label = "prime-rl"
    description = "prime-rl trainer token exports (token_exports/step_N/rank_R.jsonl: token_ids, loss_mask, inference/trainer logprobs)"

    def sniff(self, record: Any) -> Any:
        if isinstance(record, dict) and "token_ids" in record and "loss_mask" in record and (
                "trainer_logprobs" in record or "inference_logprobs" in record):
            return "token export (token_ids, loss_mask, trainer_logprobs)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {json_type(record)}")
        ids = ints(record.get("token_ids"), "token_ids")
        n = len(ids)
        mask = bools(record.get("loss_mask"), "loss_mask")
        if len(mask) != n:
            raise RecordError(f"loss_mask has {len(mask)} values for {n} token ids")
        cols: dict[str, list[Any]] = {}
        for k in _FLOAT_COLUMNS:
            if k in record:
                cols[k] = floats(record[k], k, n, nulls=True)
        for k in _BOOL_COLUMNS:
            if k in record:
                v = record[k]
                if not isinstance(v, list) or len(v) != n or not all(x is None or isinstance(x, bool) for x in v):
                    raise RecordError(f"{k} must be {n} true/false/null values")
                cols[k] = v
        if "position_ids" in record:
            cols["position_ids"] = ints(record["position_ids"], "position_ids")
            if len(cols["position_ids"]) != n:
                raise RecordError(f"position_ids has {len(cols['position_ids'])} values for {n} token ids")
        p = next((k for k, m in enumerate(mask) if m), None)
        if p is None:
            raise RecordError("loss_mask has no trained token (prime-rl exports only sequences with one)")
        inf = cols.get("inference_logprobs")
        trainer = cols.get("trainer_logprobs")
        meta: dict[str, Any] = {}
        pf = run_path_fields(ctx.path)
        for key, rec_key in (("training_step", "step"), ("rank", "rank")):
            v = record.get(rec_key)
            if is_int(v):
                meta[key] = v
            elif key in pf:
                meta[key] = pf[key]
        adv = cols.get("advantages")
        if adv is not None:
            a = advantage_of([x for x, m in zip(adv, mask) if m])
            if a is not None:
                meta["advantage"] = a
        extra: dict[str, Any] = {k: record[k] for k in _SCALARS if k in record and k not in ("step", "rank")}
        kl = cols.get("mismatch_kl")
        if kl is not None:
            on = [x for x, m in zip(kl, mask) if m and x is not None]
            if on:
                extra["mismatch_kl"] = {"sum": math.fsum(on), "mean": math.fsum(on) / len(on), "tokens": len(on)}
        extra["columns"] = {k: v for k, v in cols.items() if any(x is not None for x in v)}
        absent = sorted(k for k, v in cols.items() if not any(x is not None for x in v))
        if absent:
            extra["null_columns"] = absent
        others = {k: v for k, v in record.items() if k not in (*_SCALARS, *_FLOAT_COLUMNS, *_BOOL_COLUMNS, "token_ids", "loss_mask", "position_ids")}
        if others:
            extra["record"] = others
        meta["extra"] = extra
        tid = record_id(record, keys=())
        if is_int(record.get("export_sequence_idx")) and "training_step" in meta and "rank" in meta:
            tid = f"prime-rl-s{meta['training_step']}-r{meta['rank']}-{record['export_sequence_idx']}"
        trace = trace_from_ids(ids[:p], ids[p:], [int(m) for m in mask[p:]], ctx.bundle, self.name, parser=ctx.parser,
                               trace_id=tid, metadata=meta, logprobs=as_step_floats(inf[p:]) if inf is not None else None)
        if trainer is not None:  # one per position, the prompt's included
            set_trainer_logprobs(trace, as_step_floats(trainer), "prime-rl trainer_logprobs", first=0)
        trace.metadata["provenance"] = {"format": self.label, "library": "prime-rl",
                                        **({"schema_version": record["schema_version"]} if "schema_version" in record else {})}
        if isinstance(record.get("env_name"), str):
            trace.metadata["provenance"]["env_name"] = record["env_name"]
        return [trace]
