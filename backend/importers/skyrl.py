"""SkyRL eval dumps and generator outputs → traces.

* **Eval dumps** (``trainer.dump_eval_results``: ``<export_path>/dumped_evals/<global_step_N_evals
  | eval_only>/<data_source>.jsonl``, written by ``dump_per_dataset_eval_results`` in skyrl-train):
  one JSON line per trajectory, ``input_prompt`` and ``output_response`` (the prompt's and the
  response's token ids decoded with ``tokenizer.decode``, special tokens kept), ``score`` (the
  reward: a number, or SkyRL's token-level list with the reward on each turn's last token),
  ``stop_reason``, ``env_class``, ``env_extras``, ``data_source``. The conversation is recovered
  from the text — ChatML turns (Qwen and other ChatML templates; a ``<tools>`` block in the
  system prompt becomes the tools; ``<tool_response>`` blocks become tool messages answering the
  calls before them, in order), else the whole text as one user / one assistant message — and
  rendered with the chosen tokenizer (``metadata.ids = "rendered"``). The original text, the
  score (``score`` = the sum of a token-level list, kept as ``token_rewards``: ``[position,
  reward]`` of its non-zero entries, positions in the response's tokens) and the rest stay in
  metadata, with ``training_step`` from a ``global_step_<N>_evals`` folder. The
  ``aggregated_results.jsonl`` line beside them (metrics only, keys ``eval/...``) is
  recognised and reported as a record with no conversation.
* **Generator outputs** (``GeneratorOutput``, the dict a SkyRL generator returns:
  ``prompt_token_ids``, ``response_ids``, ``loss_masks``, ``rewards``, ``stop_reasons``,
  ``rollout_logprobs``, ``trajectory_ids``...): SkyRL itself writes no such file, but a dumped
  one (``json.dump(generator_output)``: lists over the batch, one trace each) or one line per
  trajectory (the same keys holding one trajectory's values; singular ``loss_mask`` / ``reward``
  / ``stop_reason`` accepted too) keeps its ids exactly (``metadata.ids = "given"``, the loss mask
  as the response mask, rollout logprobs per generated token); the text is decoded only to show
  it and the messages are recovered from it.
* **Training-batch dumps** (``trainer.dump_data_batch``: ``dumped_data/global_step_<N>_training_input.pkl``,
  a pickle of SkyRL's ``TrainingInputBatch``): one trace per row, read by
  :mod:`backend.importers.skyrl_batch`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from backend.importers import skyrl_batch
from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, messages_from_chatml, record_id, trace_from_ids
from backend.importers.trl import link_results, unique_id
from backend.parsers import get_format
from backend.trace.messages import json_type, parse_assistant_text
from backend.trace.model import TerminationReason

_HERMES = get_format("hermes")
_TURNS = _HERMES.turns_regex()
_STEP_DIR = re.compile(r"^global_step_(\d{1,12})_evals$")
_STOP_TO_TERMINATION = {"length": TerminationReason.RESPONSE_LENGTH}
_TEXT_KEYS = ("input_prompt", "output_response", "score", "stop_reason", "env_class", "env_extras", "data_source")
# GeneratorOutput fields (plural, over the batch) and the singular a per-trajectory line may use
_MASK_KEYS = ("loss_masks", "loss_mask")
_REWARD_KEYS = ("rewards", "reward", "score")
_STOP_KEYS = ("stop_reasons", "stop_reason")
_LOGPROB_KEYS = ("rollout_logprobs", "response_logprobs")
_GO_KEYS = {"prompt_token_ids", "response_ids", *_MASK_KEYS, *_REWARD_KEYS, *_STOP_KEYS, *_LOGPROB_KEYS,
            "trajectory_ids", "trajectory_id", "is_last_step", "rollout_metrics", "env_class", "env_classes",
            "env_extras", "data_source", "uid"}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def score_of(v: Any, where: str) -> tuple[float | None, list[list[float]] | None]:
    """``(score, token_rewards)`` of a SkyRL reward: a number, or a token-level list (its sum;
    the non-zero entries as ``[position, reward]``)."""
    if v is None:
        return None, None
    if _num(v):
        return (None if isinstance(v, float) and math.isnan(v) else float(v)), None
    if isinstance(v, list):
        if not all(_num(x) for x in v):
            raise RecordError(f"{where} must be a number or a list of numbers")
        return float(sum(v)), [[i, x] for i, x in enumerate(v) if x]
    raise RecordError(f"{where} must be a number or a list of numbers, got {json_type(v)}")


def _is_chatml(text: str) -> bool:
    return _HERMES.turn_open in text


def _leftover(text: str) -> str:
    return _TURNS.sub("", text).strip()


def recover_messages(prompt: str, response: str, parser: Any, eos: str | None, losses: list[str], *,
                     joined: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    """Messages (and tools) of a decoded prompt + response; how they were recovered. ``joined``:
    the split between the two texts need not be a turn boundary (the response may start inside
    a turn): the ChatML turns are read from the two texts joined."""
    if joined and _is_chatml(prompt):
        messages, tools = messages_from_chatml(prompt + response, parser, eos)
        if _leftover(prompt + response):
            losses.append(f"text outside the chat turns not carried over ({_leftover(prompt + response)[:60]!r})")
        for i in link_results(messages, by_name=False):
            losses.append(f"messages[{i}]: tool result answers no tool call")
        return messages, tools, "chatml"
    if _is_chatml(prompt):
        msgs, tools = messages_from_chatml(prompt, parser, eos)
        if _leftover(prompt):
            losses.append(f"input_prompt: text outside the chat turns not carried over ({_leftover(prompt)[:60]!r})")
        continued = _HERMES.turn_open + "assistant\n" + response  # the response continues the generation prompt
        resp, _ = messages_from_chatml(continued, parser, eos)
        rest = _leftover(continued)
        if rest:
            losses.append(f"output_response: text outside the chat turns not carried over ({rest[:60]!r})")
        how = "chatml"
    else:
        msgs, tools = [{"role": "user", "content": prompt}], None
        a, _ = parse_assistant_text(response, parser, eos)
        resp = [a]
        how = "whole_text"
    messages = msgs + resp
    for i in link_results(messages, by_name=False):
        losses.append(f"messages[{i}]: tool result answers no tool call")
    return messages, tools, how


def step_of_dump(path: str | None) -> int | None:
    """The training step of an eval dump's folder (``dumped_evals/global_step_<N>_evals/``)."""
    m = _STEP_DIR.search(os.path.basename(os.path.dirname(path))) if path else None
    return int(m.group(1)) if m else None


def _trajectory_id(v: Any) -> str | None:
    if isinstance(v, dict) and "instance_id" in v:
        return f"{v['instance_id']}_{v.get('repetition_id', 0)}"
    if isinstance(v, (str, int)) and not isinstance(v, bool):
        return str(v)
    return None


def _first(rec: dict[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if k in rec and rec[k] is not None:
            return k, rec[k]
    return None, None


def _ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RecordError(f"{where} must be a list of token ids (integers)")
    return v


@register
class SkyrlImporter(Importer):
    name = "skyrl"
    label = "SkyRL"
    description = ("SkyRL eval dumps (input_prompt/output_response/score JSONL), training-batch dumps (dump_data_batch pickles) "
                   "and generator outputs (prompt_token_ids/response_ids/loss_masks)")

    def sniff(self, record: Any) -> Any:
        if not isinstance(record, dict):
            return False
        if isinstance(record.get(skyrl_batch.ROW), dict):
            return "a row of a SkyRL training batch dump (dump_data_batch)"
        if "input_prompt" in record and "output_response" in record:
            return "eval dump row (input_prompt, output_response)"
        if "prompt_token_ids" in record and "response_ids" in record:
            return "generator output (prompt_token_ids, response_ids)"
        if record and all(isinstance(k, str) and k.startswith("eval/") for k in record):
            return "aggregated eval metrics (eval/... keys)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {json_type(record)}")
        if isinstance(record.get(skyrl_batch.ROW), dict):
            return [skyrl_batch.convert_row(record, ctx, self.name)]
        if "prompt_token_ids" in record or "response_ids" in record:
            return self._generator_output(record, ctx)
        if "input_prompt" in record or "output_response" in record:
            return [self._eval_row(record, ctx)]
        if record and all(isinstance(k, str) and k.startswith("eval/") for k in record):
            raise RecordError("SkyRL aggregated eval metrics (aggregated_results.jsonl): metrics only, no conversation to import")
        raise RecordError("not a SkyRL eval dump row (input_prompt, output_response) or generator output (prompt_token_ids, response_ids)")

    # ---- eval dump rows (text) ------------------------------------------------------------------

    def _eval_row(self, rec: dict[str, Any], ctx) -> Conversation:
        for k in ("input_prompt", "output_response"):
            if not isinstance(rec.get(k), str):
                raise RecordError(f"eval dump row: {k!r} must be text, got {json_type(rec.get(k)) if k in rec else 'nothing'}")
        stop = rec.get("stop_reason")
        if stop is not None and not isinstance(stop, str):
            raise RecordError(f"stop_reason must be text, got {json_type(stop)}")
        score, token_rewards = score_of(rec.get("score"), "score")
        bundle = ctx.bundle
        eos = getattr(bundle.tokenizer, "eos_token", None)
        losses: list[str] = []
        messages, tools, how = recover_messages(rec["input_prompt"], rec["output_response"], ctx.parser, eos, losses)
        meta: dict[str, Any] = {"messages": "recovered", "recovered_from": how}
        step = step_of_dump(ctx.path)
        if step is not None:
            meta["training_step"] = step
        if score is not None:
            meta["score"] = score
        if token_rewards is not None:
            meta["token_rewards"] = token_rewards
        for k in ("stop_reason", "env_class", "data_source", "env_extras"):
            if rec.get(k) is not None:
                meta[k] = rec[k]
        extras = {k: v for k, v in rec.items() if k not in _TEXT_KEYS}
        if extras:
            meta["record"] = extras
        meta["input_prompt"] = rec["input_prompt"]
        meta["output_response"] = rec["output_response"]
        conv = Conversation(messages=messages, tools=tools or [], metadata=meta, id=unique_id(ctx, record_id(rec, keys=("uid", "id"))),
                            finish_reason=stop, termination_reason=_STOP_TO_TERMINATION.get(stop or ""), losses=losses)
        conv.provenance = {"format": self.label, "library": "skyrl-train"}
        if isinstance(rec.get("data_source"), str):
            conv.provenance["data_source"] = rec["data_source"]
        return conv

    # ---- generator outputs (token ids) ----------------------------------------------------------

    def _generator_output(self, rec: dict[str, Any], ctx) -> list[Any]:
        for k in ("prompt_token_ids", "response_ids"):
            if not isinstance(rec.get(k), list):
                raise RecordError(f"generator output: {k!r} must be a list, got {json_type(rec.get(k)) if k in rec else 'nothing'}")
        batch = bool(rec["prompt_token_ids"]) and isinstance(rec["prompt_token_ids"][0], list)
        if not batch:
            return [self._trajectory(rec, None, ctx)]
        n = len(rec["prompt_token_ids"])
        for k, v in rec.items():
            if k in _GO_KEYS and k != "rollout_metrics" and isinstance(v, list) and len(v) != n:
                raise RecordError(f"generator output: {k!r} has {len(v)} entries for {n} prompts")
        return [self._trajectory(rec, i, ctx) for i in range(n)]

    def _trajectory(self, rec: dict[str, Any], i: int | None, ctx) -> Any:
        def get(keys: tuple[str, ...]) -> tuple[str | None, Any]:
            k, v = _first(rec, keys)
            if k is None or i is None:
                return k, v
            return f"{k}[{i}]", (v[i] if isinstance(v, list) else None)

        at = "" if i is None else f"[{i}]"
        prompt_ids = _ints(rec["prompt_token_ids"][i] if i is not None else rec["prompt_token_ids"], f"prompt_token_ids{at}")
        response_ids = _ints(rec["response_ids"][i] if i is not None else rec["response_ids"], f"response_ids{at}")
        mk, mask = get(_MASK_KEYS)
        meta: dict[str, Any] = {}
        if mask is None:
            mask = [1] * len(response_ids)
            meta["mask"] = "assumed"
        else:
            mask = _ints(mask, mk or "loss_masks")
            if len(mask) != len(response_ids):
                raise RecordError(f"{mk} has {len(mask)} values for {len(response_ids)} response ids")
        rk, reward = get(_REWARD_KEYS)
        score, token_rewards = score_of(reward, rk or "rewards")
        if score is not None:
            meta["score"] = score
        if token_rewards is not None:
            meta["token_rewards"] = token_rewards
        sk, stop = get(_STOP_KEYS)
        if stop is not None and not isinstance(stop, str):
            raise RecordError(f"{sk} must be text, got {json_type(stop)}")
        if stop is not None:
            meta["stop_reason"] = stop
        lk, lp = get(_LOGPROB_KEYS)
        if lp is not None:
            if not isinstance(lp, list) or not all(_num(x) for x in lp):
                raise RecordError(f"{lk} must be a list of numbers")
            lp = [float(x) for x in lp] if len(lp) >= len(response_ids) else None
        for key in ("env_class", "env_classes", "data_source", "env_extras", "uid", "is_last_step"):
            k, v = get((key,))
            if v is not None:
                meta["env_class" if key == "env_classes" else key] = v
        if i is not None and isinstance(rec.get("rollout_metrics"), dict):
            meta["rollout_metrics"] = rec["rollout_metrics"]
        _, tid = get(("trajectory_ids", "trajectory_id"))
        trace_id = _trajectory_id(tid) or record_id({"p": prompt_ids, "r": response_ids, "i": i}, keys=())
        extras = {k: v for k, v in rec.items() if k not in _GO_KEYS}
        if extras:
            meta["record"] = extras if i is None else {k: (v[i] if isinstance(v, list) and len(v) == len(rec["prompt_token_ids"]) else v) for k, v in extras.items()}
        trace = trace_from_ids(
            prompt_ids, response_ids, mask, ctx.bundle, self.name, parser=ctx.parser, trace_id=trace_id, metadata=meta,
            termination_reason=_STOP_TO_TERMINATION.get(stop or ""), logprobs=lp,
        )
        prov = {"format": self.label, "library": "skyrl-train"}
        if isinstance(meta.get("data_source"), str):
            prov["data_source"] = meta["data_source"]
        trace.metadata["provenance"] = prov
        return trace

