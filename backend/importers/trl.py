"""TRL GRPO completion logs → conversations.

``GRPOTrainer(args=GRPOConfig(log_completions=True))`` writes, at each logging step,
``<output_dir>/completions/completions_{step:05d}.parquet`` (``GRPOTrainer.log``, trl 1.16): one
row per completion of the last generation batch, columns

* ``step`` — the trainer's global step;
* ``prompt`` — text, or the prompt's messages (``[{role, content}, ...]``) when the dataset is
  conversational;
* ``completion`` — text (decoded with ``skip_special_tokens=True``), or messages: one assistant
  message parsed by the tokenizer's response parser, and with tools (``GRPOTrainer(tools=...)``)
  the assistant turns with ``tool_calls`` (``{"type": "function", "function": {"name",
  "arguments": {...}}}``, no ids) and ``{"role": "tool", "name", "content"}`` results;
* one float column per reward function (named after it; a function's None is NaN in TRL's
  tensor, which pandas writes as a Parquet null), then the ``log_extra`` columns, then
  ``advantage``.

One trace per row: the prompt (text → one user message) + the completion (text → one assistant
message whose text is read for tool calls with the chosen parser; messages as they are, an
assistant message without ``tool_calls`` also read for calls written as text). Tool calls get
ids (``call_1``...) and each tool result is linked to the first unanswered call of its name.
Metadata: ``training_step`` (the step), ``rewards`` (each reward column; null / NaN → None),
``score`` (their sum, missing ones skipped: the file does not carry ``reward_weights``, so this is
the unweighted sum), ``advantage``, ``extra`` (the ``log_extra`` columns). Reward columns are the
numeric columns of the Parquet schema (a numeric ``log_extra`` column cannot be told from a
reward's and counts as one); rows read from another kind of file go by their values (numbers
and nulls are rewards).

Parquet merges the keys of all rows' messages (and all calls' arguments) into one struct, so a
key one message lacks reads back as null: null keys are dropped from messages and arguments (a
null argument cannot be told from an absent one in these files). Images stripped by TRL
(``{"type": "image"}`` parts) and unknown message keys are reported as losses; an assistant's
``reasoning_content`` (or gpt-oss's ``thinking``) is its reasoning.
"""

from __future__ import annotations

import json
import math
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, record_id, text_of
from backend.trace import ParseError
from backend.trace.messages import decode_arguments, json_type, parse_assistant_text

_FIXED = ("step", "prompt", "completion", "advantage")
_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE_KEYS = {"role", "content", "tool_calls", "name", "tool_call_id", "reasoning_content", "thinking"}
_ASSISTANT_ONLY = ("tool_calls", "reasoning_content", "thinking")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def drop_nulls(v: Any) -> Any:
    """``v`` without the null-valued keys of its objects (Parquet's merged struct fields)."""
    if isinstance(v, dict):
        return {k: drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [drop_nulls(x) for x in v]
    return v


def _plain(v: Any) -> Any:
    """numpy values (a Parquet row read through pandas) as plain Python."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return v.tolist()
    return v


def link_results(messages: list[dict[str, Any]], *, by_name: bool) -> list[int]:
    """Give each tool call without an id one (``call_1``...), and each tool message without a
    ``tool_call_id`` the id of the first call still unanswered (of the same name when
    ``by_name``; the message gets the call's name when it has none). Returns the indexes of the
    tool messages that answer no call."""
    n = 0
    pending: list[dict[str, Any]] = []
    out: list[int] = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                if not isinstance(c.get("id"), str) or not c.get("id"):
                    n += 1
                    c["id"] = f"call_{n}"
                pending.append(c)
        elif m.get("role") == "tool" and not m.get("tool_call_id"):
            name = m.get("name")
            match = next((c for c in pending if not by_name or not name or c["function"]["name"] == name), None)
            if match is None:
                out.append(i)
                continue
            pending.remove(match)
            m["tool_call_id"] = match["id"]
            m.setdefault("name", match["function"]["name"])
    return out


def _numeric_columns(ctx: Any) -> set[str] | None:
    """The numeric columns of the Parquet file being imported (its schema, read once), or None
    for another kind of file. pandas writes a reward function's None (NaN in TRL's tensor) as a
    Parquet null, so a row's value alone cannot tell a reward column from a ``log_extra`` one."""
    cache = ctx.__dict__.setdefault("_trl_numeric", {})
    path = getattr(ctx, "path", None)
    if not isinstance(path, str) or not path.endswith(".parquet"):
        return None
    if path not in cache:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
            cache[path] = {f.name for f in schema if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)}
        except Exception:  # noqa: BLE001 - unreadable here: fall back to the values
            cache[path] = None
    return cache[path]


def unique_id(ctx: Any, base: str) -> str:
    """``base`` the first time in this import, then ``base-2``, ``base-3``...: identical rows (a
    GRPO group's equal completions, repeated eval samples) hash to the same content id."""
    seen = ctx.__dict__.setdefault("_content_ids", {})
    k = seen[base] = seen.get(base, 0) + 1
    return base if k == 1 else f"{base}-{k}"


def _tool_calls(calls: Any, where: str, errors: list[ParseError]) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise RecordError(f"{where}.tool_calls must be a list, got {json_type(calls)}")
    out = []
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise RecordError(f"{w} is {json_type(c)}, not a tool call object")
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RecordError(f"{w} has no function name")
        raw = fn.get("arguments")
        args, problem = decode_arguments(raw)
        if problem:
            errors.append(ParseError(message=f"{w}: {problem}", raw=raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)))
        call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
        if isinstance(c.get("id"), str) and c["id"]:
            call["id"] = c["id"]
        out.append(call)
    return out


def messages_of(value: Any, where: str, conv: Conversation, parser: Any, eos: str | None, *, offset: int) -> list[dict[str, Any]]:
    """A list of chat messages from a TRL column (``offset``: where they start in the
    conversation, for the parse errors' message index)."""
    if not isinstance(value, list):
        raise RecordError(f"{where} must be text or a list of messages, got {json_type(value)}")
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise RecordError(f"{w} is {json_type(raw)}, not a message object")
        m = drop_nulls(raw)
        role = m.get("role")
        if role not in _ROLES:
            raise RecordError(f"{w} has role {role!r}; expected one of {', '.join(_ROLES)}")
        for k in sorted(set(m) - _MESSAGE_KEYS):
            conv.losses.append(f"{w}.{k}: message field not carried over")
        content = text_of(m.get("content"), f"{w}.content", conv.losses)
        msg: dict[str, Any] = {"role": role, "content": content if content is not None else ""}
        errors: list[ParseError] = []
        if role != "assistant":
            for k in _ASSISTANT_ONLY:
                if m.get(k):
                    conv.losses.append(f"{w}.{k}: not carried over (only assistant messages carry it)")
        if role == "assistant":
            # reasoning: "reasoning_content" (Qwen3 / DeepSeek response templates), "thinking" (gpt-oss's)
            for k in ("reasoning_content", "thinking"):
                if isinstance(m.get(k), str) and m[k] and "reasoning_content" not in msg:
                    msg["reasoning_content"] = m[k]
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], w, errors)
            elif msg["content"]:  # calls the response parser left as text (or a model without one)
                parsed, errs = parse_assistant_text(msg["content"], parser, eos)
                if parsed.get("tool_calls") or errs:
                    msg["content"] = parsed.get("content") or ""
                    if parsed.get("tool_calls"):
                        msg["tool_calls"] = parsed["tool_calls"]
                    if parsed.get("reasoning_content") and "reasoning_content" not in msg:
                        msg["reasoning_content"] = parsed["reasoning_content"]
                    errors.extend(errs)
        elif role == "tool":
            if isinstance(m.get("name"), str) and m["name"]:
                msg["name"] = m["name"]
            if isinstance(m.get("tool_call_id"), str) and m["tool_call_id"]:
                msg["tool_call_id"] = m["tool_call_id"]
        elif isinstance(m.get("name"), str) and m["name"]:
            msg["name"] = m["name"]
        if errors:
            conv.parse_errors.setdefault(offset + len(out), []).extend(errors)
        out.append(msg)
    return out


@register
class TrlImporter(Importer):
    name = "trl"
    label = "TRL"
    description = "TRL GRPO completion logs (completions/completions_NNNNN.parquet: step, prompt, completion, rewards, advantage)"

    def sniff(self, record: Any) -> Any:
        if not isinstance(record, dict) or "advantage" not in record and "step" not in record:
            return False
        if "prompt" in record and "completion" in record:
            return "GRPO completion log row (step, prompt, completion, advantage)"
        if "advantage" in record and ("prompt" in record or "completion" in record):
            return "GRPO completion log row (prompt/completion with an advantage)"
        return False

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {json_type(record)}")
        rec = {k: _plain(v) for k, v in record.items()}
        for k in ("prompt", "completion"):
            if k not in rec or rec[k] is None:
                raise RecordError(f"TRL completion row without {k!r}")
        step = rec.get("step")
        if step is not None and not (isinstance(step, int) and not isinstance(step, bool)):
            raise RecordError(f"step must be an integer, got {json_type(step)} {step!r}"[:200])
        adv = rec.get("advantage")
        if adv is not None and not _number(adv):
            raise RecordError(f"advantage must be a number, got {json_type(adv)}")
        bundle = ctx.bundle
        parser = ctx.parser
        eos = getattr(bundle.tokenizer, "eos_token", None)
        conv = Conversation(messages=[])
        prompt, completion = rec["prompt"], rec["completion"]
        conversational = not isinstance(prompt, str)
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = messages_of(prompt, "prompt", conv, parser, eos, offset=0)
        if isinstance(completion, list) and not completion:
            raise RecordError("completion is an empty list of messages")
        n_prompt = len(messages)
        if isinstance(completion, str):
            msg, errs = parse_assistant_text(completion, parser, eos)
            if errs:
                conv.parse_errors.setdefault(len(messages), []).extend(errs)
            if not errs and not msg.get("tool_calls") and not msg.get("reasoning_content"):
                msg = {"role": "assistant", "content": completion}  # the text as TRL logged it
            messages.append(msg)
        else:
            messages.extend(messages_of(completion, "completion", conv, parser, eos, offset=len(messages)))
        for i in link_results(messages, by_name=True):
            where = f"prompt[{i}]" if i < n_prompt else f"completion[{i - n_prompt}]"
            name = messages[i].get("name")
            conv.losses.append(f"{where}: tool result{f' of {name!r}' if name else ''} answers no tool call in the row")
        rewards: dict[str, float | None] = {}
        extra: dict[str, Any] = {}
        numeric = _numeric_columns(ctx)
        for k, v in rec.items():
            if k in _FIXED:
                continue
            if numeric is not None:
                is_reward = k in numeric
            else:  # not a Parquet file: by the value (a null is taken for a reward that was None)
                is_reward = v is None or _number(v)
            if is_reward and (v is None or _number(v)):
                rewards[k] = None if v is None or isinstance(v, float) and math.isnan(v) else v
            else:
                extra[k] = v
        meta: dict[str, Any] = {"conversational": conversational}
        if step is not None:
            meta["training_step"] = step
        if rewards:
            meta["rewards"] = rewards
            given = [v for v in rewards.values() if v is not None]
            if given:
                meta["score"] = float(sum(given))
        if adv is not None:
            meta["advantage"] = None if isinstance(adv, float) and math.isnan(adv) else adv
        if extra:
            meta["extra"] = extra
        conv.messages = messages
        conv.metadata = meta
        conv.provenance = {"format": self.label, "library": "trl"}
        conv.id = unique_id(ctx, f"trl-{step}-{record_id(rec, keys=())}" if step is not None else f"trl-{record_id(rec, keys=())}")
        return [conv]
