"""Model calls with their own token ids (one prompt, one response, rollout logprobs each) → traces.

RL agent frameworks that record each LLM call of a rollout separately (Agent Lightning's
``model_request`` events, rLLM's episode steps) store, per call, the prompt's ids, the response's
ids and the response's logprobs. A later call whose prompt starts with the earlier call's prompt +
response continues it (the tokens in between are the tool output / user turn the agent added): such
calls are one trace, its response the responses (mask 1, the file's ids exactly) and the tokens in
between (mask 0). A call whose prompt does not extend the context before it (the agent rewrote the
history, a new conversation) starts a new trace. Nothing is re-tokenised: every id is the file's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from backend.importers.common import RecordError, trace_from_ids
from backend.trace import Trace
from backend.trace.model import StepState


@dataclass
class Call:
    """One model call as the file stores it; ``where`` names it in errors."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    where: str
    info: dict[str, Any] = field(default_factory=dict)  # what the file says of the call (kept per turn)


@dataclass
class Segment:
    """Calls that continue each other: one trace."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)  # per response position; None where not stored
    calls: list[Call] = field(default_factory=list)


def token_ids(v: Any, where: str, vocab: int | None = None) -> list[int]:
    """A list of token ids (each below ``vocab`` when given), or RecordError naming ``where``."""
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RecordError(f"{where} must be a list of token ids (integers)")
    if vocab is not None:
        bad = next((j for j, x in enumerate(v) if not 0 <= x < vocab), None)
        if bad is not None:
            raise RecordError(f"{where}[{bad}] = {v[bad]} is outside the vocabulary of the chosen tokenizer ({vocab} tokens); "
                              "pass the tokenizer the ids came from")
    return v


def logprob_list(v: Any, where: str, n: int) -> list[float] | None:
    """Per-token logprobs of a response of ``n`` tokens (None when absent); RecordError when they
    are not numbers or not one per token."""
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise RecordError(f"{where} must be a list of numbers")
    if len(v) != n:
        raise RecordError(f"{where} has {len(v)} values for {n} response token ids")
    if any(isinstance(x, float) and not math.isfinite(x) for x in v):
        raise RecordError(f"{where} holds a value that is not a finite number")
    return [float(x) for x in v]


def segments(calls: list[Call]) -> list[Segment]:
    """The calls in order, merged where a prompt extends the context before it."""
    out: list[Segment] = []
    for c in calls:
        cur = out[-1] if out else None
        context = cur.prompt_ids + cur.response_ids if cur is not None else None
        if cur is None or context is None or c.prompt_ids[: len(context)] != context:
            cur = Segment(prompt_ids=list(c.prompt_ids))
            out.append(cur)
        else:
            gap = c.prompt_ids[len(context):]
            cur.response_ids += gap
            cur.mask += [0] * len(gap)
            cur.logprobs += [None] * len(gap)
        cur.response_ids += c.response_ids
        cur.mask += [1] * len(c.response_ids)
        cur.logprobs += list(c.logprobs) if c.logprobs is not None else [None] * len(c.response_ids)
        cur.calls.append(c)
    return out


def segment_trace(seg: Segment, ctx: Any, source: str, *, trace_id: str, metadata: dict[str, Any],
                  termination_reason: str | None = None, tools: list[dict[str, Any]] | None = None) -> Trace:
    """The trace of one segment: ids and mask exactly, each generated step's logprobs the file's
    (none on a step whose call stored none)."""
    trace = trace_from_ids(seg.prompt_ids, seg.response_ids, seg.mask, ctx.bundle, source, parser=ctx.parser,
                           trace_id=trace_id, metadata=metadata, termination_reason=termination_reason, tools=tools)
    p = len(seg.prompt_ids)
    for s in trace.steps:
        if s.state == StepState.GENERATING and s.end > s.start:
            lp = seg.logprobs[s.start - p : s.end - p]
            if all(x is not None for x in lp):
                s.logprobs = lp
    return trace


__all__ = ["Call", "Segment", "logprob_list", "segment_trace", "segments", "token_ids"]
