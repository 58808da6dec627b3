"""verl outputs → traces.

* **Agent-loop outputs** (rows with ``prompt_ids``, ``response_ids``, ``response_mask``; as
  ``AgentLoopOutput`` holds them, or as our ``export --to verl`` writes them): the ids and mask
  are kept exactly as given (``metadata.ids = "given"``); text is decoded with the chosen
  tokenizer only to show it, and messages/tool calls are recovered from the decoded text
  (ChatML templates). A missing mask is taken as all ones (``metadata.mask = "assumed"``).
  ``rollout_log_probs`` (or ``response_logprobs``) become per-step rollout logprobs and
  ``old_log_probs`` (the actor's recompute) per-step ``info.trainer_logprobs``, shown side by
  side without recomputing (``trace.scorer.kind = "verl old_log_probs"``); ``num_turns``, ``reward_score``, ``metrics``
  and ``extra_fields`` go to metadata.
* **Rollout dumps** (``trainer.rollout_data_dir`` / ``validation_data_dir`` JSONL: ``input``,
  ``output``, ``score``, ``step``, ``gts`` and reward extras; text decoded with
  ``skip_special_tokens=True``): the conversation is recovered from the text — ChatML markers
  when present, else the ``system``/``user``/``assistant`` role lines the decoded text keeps,
  with ``<tool_call>`` turns and ``<tool_response>`` blocks split out — and rendered with the
  chosen tokenizer (``metadata.ids = "rendered"``, ``metadata.messages = "recovered"``). The
  original text, score and step stay in metadata, with ``training_step`` (the row's ``step``: the
  file is ``<dir>/<step>.jsonl``), ``rewards`` (the score and each numeric reward column), ``group``
  (a ``uid`` column, when a dump has one: verl 0.9.1's does not) and ``request_id``; the other
  columns (``pred``, ...) under ``metadata.record``. Read from verl 0.9.1's
  ``RayPPOTrainer._write_generations``: the dump holds text only — no ids, masks or logprobs.
"""

from __future__ import annotations

import math
import re
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import (
    Conversation,
    RecordError,
    messages_from_chatml,
    record_id,
    system_or_tool_block,
    tool_responses_in,
    trace_from_ids,
)
from backend.importers.rollout_fields import set_trainer_logprobs
from backend.parsers import get_format
from backend.trace.messages import parse_assistant_text

_ID_KEYS = ("prompt_ids", "response_ids")
_META_KEYS = ("num_turns", "reward_score", "score", "metrics", "extra_fields", "step", "uid", "data_source", "acc")

# a tool turn in a decoded multi-turn response, with or without the special tokens kept
_HERMES = get_format("hermes")
_S, _E, _RO, _RC = (re.escape(t) for t in (_HERMES.turn_open, _HERMES.turn_close, _HERMES.response_open, _HERMES.response_close))
_TOOL_TURN = re.compile(rf"(?:{_E})?\n?(?:{_S})?user\n((?:\s*{_RO}.*?{_RC})+)\s*(?:{_E})?\n?(?:{_S})?assistant\n", re.S)
_ROLE_LINE = re.compile(r"(?:^|\n)(system|user|assistant)\n")


def _floats(v: Any, name: str, n: int) -> list[float] | None:
    """A per-response-token float column (verl pads it to the response length: cut to ``n``);
    None when absent or shorter than the response."""
    if v is None:
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list):
        raise RecordError(f"{name} must be a list of numbers, got {type(v).__name__}")
    if len(v) < n:
        return None
    v = v[:n]
    if not all(type(x) in (int, float) for x in v):
        raise RecordError(f"{name} must be a list of numbers")
    return [float(x) for x in v]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _dump_fields(record: dict[str, Any], extras: dict[str, Any]) -> dict[str, Any]:
    """The RL metadata of a rollout dump row (``_write_generations``: ``step`` = the trainer's
    ``global_steps``, ``score`` = the summed token-level scores, then the reward manager's extra
    columns and, when the batch has them, ``request_id``): ``training_step``, ``rewards`` (the score
    and each numeric extra column, e.g. validation's ``reward``), ``group`` from a ``uid`` column,
    ``request_id``."""
    out: dict[str, Any] = {}
    step, score = record.get("step"), record.get("score")
    if step is not None:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RecordError(f"step must be a training step (a whole number), got {step!r}"[:120])
        out["training_step"] = step
    if score is not None and not _number(score):
        raise RecordError(f"score must be a finite number (verl sums the token-level scores), got {score!r}"[:120])
    rewards = {"score": float(score)} if score is not None else {}
    rewards.update({k: float(v) for k, v in extras.items() if k not in ("request_id", "uid") and _number(v)})
    if rewards:
        out["rewards"] = rewards
    if isinstance(record.get("uid"), (str, int)) and not isinstance(record["uid"], bool):
        out["group"] = str(record["uid"])
    if isinstance(record.get("request_id"), str):
        out["request_id"] = record["request_id"]
    return out


def _ints(v: Any, name: str) -> list[int]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list):
        raise RecordError(f"{name} must be a list of token ids, got {type(v).__name__}")
    return v


def _response_segments(text: str, parser: Any, eos: str | None) -> list[dict[str, Any]]:
    """Assistant turns and tool messages out of a decoded multi-turn response."""
    msgs: list[dict[str, Any]] = []
    pos = 0
    n_calls = 0
    for m in _TOOL_TURN.finditer(text):
        a, _ = parse_assistant_text(text[pos : m.start()], parser, eos)
        for c in a.get("tool_calls", []):
            n_calls += 1
            c["id"] = f"call_{n_calls}"
        msgs.append(a)
        calls = a.get("tool_calls", [])
        for i, body in enumerate(tool_responses_in(m.group(1)) or []):
            tm: dict[str, Any] = {"role": "tool", "content": body}
            if i < len(calls):
                tm["name"] = calls[i]["function"]["name"]
                tm["tool_call_id"] = calls[i]["id"]
            msgs.append(tm)
        pos = m.end()
    a, _ = parse_assistant_text(text[pos:], parser, eos)
    for c in a.get("tool_calls", []):
        n_calls += 1
        c["id"] = f"call_{n_calls}"
    msgs.append(a)
    return msgs


def _prompt_messages(text: str, parser: Any, eos: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    if _HERMES.turn_open in text:
        msgs, tools = messages_from_chatml(text, parser, eos)
        if msgs:
            return msgs, tools, "chatml"
    parts = _ROLE_LINE.split(text)
    # parts: [before, role, body, role, body, ...]
    if len(parts) >= 3 and not parts[0].strip():
        msgs = []
        tools = None
        for role, body in zip(parts[1::2], parts[2::2]):
            if role == "assistant" and not body.strip():
                continue  # the generation prompt
            block = system_or_tool_block(role, body)
            if block is not None:
                msgs.extend(block[0])
                tools = block[1] or tools
            else:
                msgs.append({"role": role, "content": body})
        if msgs:
            return msgs, tools, "role_lines"
    return [{"role": "user", "content": text}], None, "whole_text"


@register
class VerlImporter(Importer):
    name = "verl"
    label = "verl"
    description = "verl agent-loop outputs (prompt_ids/response_ids/response_mask, kept as given) and rollout dumps (input/output text)"

    def sniff(self, record: Any) -> bool:
        if not isinstance(record, dict):
            return False
        if "prompt_ids" in record and "response_ids" in record:
            return True
        return isinstance(record.get("input"), str) and isinstance(record.get("output"), str)

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        meta: dict[str, Any] = {k: record[k] for k in _META_KEYS if k in record}
        meta = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in meta.items()}
        if "prompt_ids" in record or "response_ids" in record:
            for k in _ID_KEYS:
                if k not in record:
                    raise RecordError(f"agent-loop output without {k}")
            prompt_ids = _ints(record["prompt_ids"], "prompt_ids")
            response_ids = _ints(record["response_ids"], "response_ids")
            mask = record.get("response_mask")
            if mask is None:
                mask = [1] * len(response_ids)
                meta["mask"] = "assumed"
            mask = _ints(mask, "response_mask")
            key = "rollout_log_probs" if record.get("rollout_log_probs") is not None else "response_logprobs"
            lp = _floats(record.get(key), key, len(response_ids))
            old = _floats(record.get("old_log_probs"), "old_log_probs", len(response_ids))
            bundle = ctx.bundle
            parser = ctx.parser
            tr = record.get("termination_reason")
            trace = trace_from_ids(
                prompt_ids, response_ids, mask, bundle, self.name, parser=parser, trace_id=record_id(record, keys=("id", "trace_id", "request_id")),
                metadata=meta, termination_reason=tr if isinstance(tr, str) else None,
                logprobs=lp,
                tools=record.get("tools") if isinstance(record.get("tools"), list) else None,
            )
            if old is not None:
                set_trainer_logprobs(trace, old, "verl old_log_probs")
            return [trace]
        inp, out = record.get("input"), record.get("output")
        if not isinstance(inp, str) or not isinstance(out, str):
            raise RecordError("a rollout dump row needs string 'input' and 'output'")
        bundle = ctx.bundle
        parser = ctx.parser
        eos = getattr(bundle.tokenizer, "eos_token", None)
        msgs, tools, how = _prompt_messages(inp, parser, eos)
        resp = _response_segments(out, parser, eos)
        meta.update({"messages": "recovered", "recovered_from": how, "input": inp, "output": out})
        if "gts" in record:
            meta["gts"] = record["gts"]
        extras = {k: v for k, v in record.items() if k not in ("input", "output", "gts", *meta)}
        if extras:
            meta["record"] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in extras.items()}
        meta.update(_dump_fields(record, extras))
        return [Conversation(messages=msgs + resp, tools=tools or [], metadata=meta, id=record_id(record, keys=("id", "trace_id", "request_id")))]
