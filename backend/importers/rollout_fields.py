"""Pieces the RL rollout importers share (verifiers, prime-rl, NeMo-RL, NeMo-Gym, slime, verl): the
training step and rank a run folder's path (or a file's name) gives, strict per-token columns and
0/1 loss masks, rewards as numbers, a per-token advantage stated once, and the trainer's logprobs
put beside the rollout's on the steps.

Run folders name the step and rank in their paths (prime-rl: ``rollouts/step_<N>/<kind>/<subset>/
traces.jsonl``, ``token_exports/step_<N>/rank_<R>.jsonl``); a record that states them itself
wins over its path."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from backend.importers.common import RecordError
from backend.trace import Trace
from backend.trace.messages import json_type
from backend.trace.model import Scorer

_STEP_DIR = re.compile(r"^step_(\d{1,12})$")
_RANK_FILE = re.compile(r"^rank_(\d{1,6})\.jsonl?$")


def run_path_fields(path: str | None) -> dict[str, Any]:
    """``training_step`` (the nearest ``step_<N>`` folder above the file), ``rank`` (a
    ``rank_<R>.jsonl`` file name) and, under ``rollouts/step_<N>/``, the ``kind`` and ``subset``
    folders (prime-rl's ``train``/``eval`` and ``all``/``effective``) of a run folder's file."""
    if not path:
        return {}
    out: dict[str, Any] = {}
    m = _RANK_FILE.match(os.path.basename(path))
    if m:
        out["rank"] = int(m.group(1))
    parts = os.path.normpath(os.path.dirname(path)).split(os.sep)
    for k in range(len(parts) - 1, -1, -1):
        m = _STEP_DIR.match(parts[k])
        if m:
            out["training_step"] = int(m.group(1))
            below = parts[k + 1 :]
            if k > 0 and parts[k - 1] == "rollouts" and len(below) == 2:
                out["kind"], out["subset"] = below
            break
    return out


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(is_int(x) for x in v):
        raise RecordError(f"{where} must be a list of token ids (integers), got {json_type(v)}")
    return v


def bools(v: Any, where: str) -> list[bool]:
    if not isinstance(v, list) or not all(isinstance(x, bool) for x in v):
        raise RecordError(f"{where} must be a list of true/false values, got {json_type(v)}")
    return v


def floats(v: Any, where: str, n: int, *, nulls: bool = False) -> list[float | None]:
    """A per-token float column of exactly ``n`` numbers (``nulls``: None allowed, as prime-rl
    writes a non-finite value)."""
    if not isinstance(v, list):
        raise RecordError(f"{where} must be a list of numbers, got {json_type(v)}")
    if len(v) != n:
        raise RecordError(f"{where} has {len(v)} values for {n} tokens")
    for x in v:
        if not (is_num(x) or (nulls and x is None)):
            raise RecordError(f"{where} must be a list of numbers, found {json_type(x)}")
    return v


def as_step_floats(v: list[float | None]) -> list[float]:
    """Logprobs for a step: numbers as floats; a null (prime-rl's non-finite value) as NaN, which
    the logprob lens reads as absent."""
    return [math.nan if x is None else float(x) for x in v]


def advantage_of(values: list[float | None]) -> float | list[float | None] | None:
    """``metadata.advantage``: one number when every token has the same (a GRPO advantage
    broadcast over the sample), else the per-token list as written; None when there is none."""
    if not values:
        return None
    first = values[0]
    if all(x == first for x in values):
        return float(first) if first is not None else None
    return list(values)


def mask_of(v: Any, where: str, n: int) -> list[int]:
    """A 0/1 mask of exactly ``n`` values (``1.0`` / ``0.0`` floats, as tensors' ``tolist`` of a
    float mask gives, are read as 1 / 0)."""
    if not isinstance(v, list):
        raise RecordError(f"{where} must be a list of 0/1, got {json_type(v)}")
    if len(v) != n:
        raise RecordError(f"{where} has {len(v)} values for {n} token ids")
    out = []
    for i, x in enumerate(v):
        if not is_num(x) or x not in (0, 1):
            raise RecordError(f"{where}[{i}] is {x!r}; a loss mask holds 0 or 1")
        out.append(int(x))
    return out


def floats_of(v: Any, where: str, n: int) -> list[float]:
    """A per-token float column of exactly ``n`` numbers, as floats (values kept as written)."""
    return [float(x) for x in floats(v, where, n)]


def number_or_none(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if not is_num(v):
        raise RecordError(f"{where} must be a number, got {json_type(v)}")
    f = float(v)
    return None if math.isnan(f) else f


def set_trainer_logprobs(trace: Trace, values: list[float], kind: str, *, first: int | None = None) -> None:
    """``values`` (one per token from position ``first`` on; default: the response's first) as
    the ``info.trainer_logprobs`` of each step from there, and ``trace.scorer`` naming where they
    came from (the lens shows them beside the rollout's)."""
    p = len(trace.prompt_ids) if first is None else first
    for s in trace.steps:
        if s.end > s.start and s.start >= p:
            s.info.trainer_logprobs = values[s.start - p : s.end - p]
    trace.scorer = Scorer(kind=kind)


def step_in_name(path: str | None, pattern: re.Pattern[str]) -> int | None:
    """The training step a file's name states (``pattern``'s group 1), if it does."""
    m = pattern.search(os.path.basename(path)) if path else None
    return int(m.group(1)) if m else None


__all__ = ["advantage_of", "as_step_floats", "bools", "floats", "floats_of", "ints", "is_int", "is_num", "mask_of",
           "number_or_none", "run_path_fields", "set_trainer_logprobs", "step_in_name"]
