"""tinker-cookbook's capture records → traces with the sampled token ids (tinker-cookbook 0.5.8,
``tinker_cookbook.capture``), for :mod:`backend.importers.tinker`.

With ``instrument_tinker(CaptureExporter(JsonlFileSink(storage)))`` (or ``capture_to_store``) every
``SamplingClient.sample`` / ``sample_async`` call of a run — the RL rollouts' ``TinkerTokenCompleter``
included — is appended to ``<run>/capture/sample.jsonl``, one record per call: ``kind = "sample"``,
the ambient ``scope`` the code set with ``capture(...)`` (``run_id``, ``iteration``, ``group_idx``,
``traj_idx``...), the call's ``prompt_tokens`` / ``prompt_length``, ``sampling_params``,
``num_samples``, ``seq_id``, ``status`` and ``samples`` (each ``tokens``, ``logprobs``, ``stop_reason``).
Training calls land in ``capture/train_op.jsonl`` (``kind = "train_op"``): no rollout in them.

Each sampled sequence is one trace: the prompt's ids, then the sampled ids (mask 1) with their
logprobs as the rollout logprobs, kept exactly (``metadata.ids = "given"``). A multi-turn rollout
is one call per turn, each call's prompt holding the whole context so far: each call is its own
trace. Metadata: ``training_step`` = the scope's ``iteration``; ``group`` = the scope's group
(``<run_id>/<iteration>/<group_idx>``: one ``EnvGroupBuilder``'s calls), else, for a call of several
samples, the call (its samples share the prompt); ``sample`` = the scope's ``traj_idx``, else the
sequence's index in a call of several. No reward is captured (the env's rewards are in the
iteration's logtree). The rest (scope, sampling parameters, stop reason, model, ids of the call)
under ``metadata.extra``.
"""

from __future__ import annotations

from typing import Any

from backend.importers.common import RecordError
from backend.importers.rollout_fields import is_int
from backend.importers.turns import Call, logprob_list, segment_trace, segments, token_ids
from backend.trace.messages import json_type
from backend.trace.model import TerminationReason

_CALL_INFO = ("scope", "num_samples", "sampling_params", "model_path", "base_model", "sampling_session_id", "seq_id",
              "created_at", "latency_sec", "status")


def is_capture(rec: Any) -> bool:
    return isinstance(rec, dict) and rec.get("kind") in ("sample", "train_op") and isinstance(rec.get("scope"), dict)


def capture_traces(rec: dict[str, Any], ctx: Any, source: str) -> list[Any]:
    """The traces of one capture record (a sampling call), or RecordError saying why none."""
    if rec["kind"] == "train_op":
        raise RecordError(f"a tinker-cookbook capture of a training call ({rec.get('op') or 'train_op'}), not a sampling "
                          "call: no rollout in it (the rollouts are in capture/sample.jsonl)")
    status = rec.get("status")
    if status != "ok":
        why = f": {rec['error']}" if isinstance(rec.get("error"), str) else ""
        raise RecordError(f"the sampling call's status is {status!r}{why}: no sampled tokens were captured"[:500])
    vocab = len(ctx.bundle.tokenizer)
    if "prompt_tokens" not in rec:
        raise RecordError(f"the sampling call's prompt was not captured as token ids (prompt_length "
                          f"{rec.get('prompt_length')!r}; a prompt with image chunks has none)")
    prompt = token_ids(rec["prompt_tokens"], "prompt_tokens", vocab)
    plen = rec.get("prompt_length")
    if plen is not None and plen != len(prompt):
        raise RecordError(f"prompt_length is {plen!r} but prompt_tokens holds {len(prompt)} ids")
    samples = rec.get("samples")
    if not isinstance(samples, list) or not samples:
        raise RecordError(f"samples must be a non-empty list of sampled sequences, got {json_type(samples)}")
    n = rec.get("num_samples")
    if is_int(n) and n != len(samples):
        raise RecordError(f"num_samples is {n} but the record holds {len(samples)} sample(s)")
    scope = rec["scope"]
    run = scope.get("run_id")
    base = f"{run if run is not None else 'capture'}:{rec.get('seq_id')}"
    info = {k: rec[k] for k in _CALL_INFO if rec.get(k) is not None}
    out = []
    for i, s in enumerate(samples):
        w = f"samples[{i}]"
        if not isinstance(s, dict):
            raise RecordError(f"{w} is {json_type(s)}, not a sampled sequence")
        tokens = token_ids(s.get("tokens"), f"{w}.tokens", vocab)
        if not tokens:
            raise RecordError(f"{w} has no tokens")
        logprobs = logprob_list(s.get("logprobs"), f"{w}.logprobs", len(tokens))
        meta: dict[str, Any] = {"extra": {**info, "sample_index": i, "stop_reason": s.get("stop_reason")}}
        if is_int(scope.get("iteration")):
            meta["training_step"] = scope["iteration"]
        if scope.get("group_idx") is not None:
            meta["group"] = "/".join(str(scope.get(k)) for k in ("run_id", "iteration", "group_idx"))
        elif len(samples) > 1:
            meta["group"] = base
        if is_int(scope.get("traj_idx")):
            meta["sample"] = scope["traj_idx"]
        elif len(samples) > 1:
            meta["sample"] = i
        (seg,) = segments([Call(prompt, tokens, logprobs, w)])
        trace = segment_trace(seg, ctx, source, trace_id=base if len(samples) == 1 else f"{base}/{i}", metadata=meta,
                              termination_reason=TerminationReason.RESPONSE_LENGTH if s.get("stop_reason") == "length" else None)
        trace.metadata["provenance"] = {"library": "tinker-cookbook", "capture": "sample", "seq_id": rec.get("seq_id")}
        out.append(trace)
    return out
