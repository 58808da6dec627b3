"""What the NeMo-RL, NeMo-Gym and slime importers share, beside :mod:`backend.importers.rollout_fields`
(ids and per-token columns): a checked 0/1 loss mask, rewards as numbers, the step a file's name
states, and the trainer's logprobs put beside the rollout's on the steps."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from backend.importers.common import RecordError
from backend.importers.rollout_fields import floats
from backend.trace import Trace
from backend.trace.messages import json_type
from backend.trace.model import Scorer


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


def set_trainer_logprobs(trace: Trace, values: list[float], kind: str) -> None:
    """``values`` (one per response token) as each response step's ``info.trainer_logprobs``, and
    ``trace.scorer`` naming where they came from (the lens shows them beside the rollout's)."""
    p = len(trace.prompt_ids)
    for s in trace.steps:
        if s.end > s.start and s.start >= p:
            s.info.trainer_logprobs = values[s.start - p : s.end - p]
    trace.scorer = Scorer(kind=kind)


def step_in_name(path: str | None, pattern: re.Pattern[str]) -> int | None:
    """The training step a file's name states (``pattern``'s group 1), if it does."""
    m = pattern.search(os.path.basename(path)) if path else None
    return int(m.group(1)) if m else None
