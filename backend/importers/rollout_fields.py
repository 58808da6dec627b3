"""Pieces the RL rollout importers share (verifiers, prime-rl): the training step and rank a
run folder's path gives, strict per-token columns, and a per-token advantage stated once.

Run folders name the step and rank in their paths (prime-rl: ``rollouts/step_<N>/<kind>/<subset>/
traces.jsonl``, ``token_exports/step_<N>/rank_<R>.jsonl``); a record that states them itself
wins over its path."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from backend.importers.common import RecordError
from backend.trace.messages import json_type

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
        if not ((isinstance(x, (int, float)) and not isinstance(x, bool)) or (nulls and x is None)):
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


__all__ = ["advantage_of", "as_step_floats", "bools", "floats", "ints", "is_int", "run_path_fields"]
