"""ZeroGPU: the GPU work (transformers generation, the logprob lens's forward pass) runs inside
``@spaces.GPU`` on a ZeroGPU Space, and exactly as before anywhere else.

On ZeroGPU the decorated function runs in a process forked for the call, on a GPU slice lent for
``duration`` seconds, charged to the visitor's daily quota. So:

- :func:`gpu_task` decorates at import time (ZeroGPU looks for decorated functions when the app
  starts); off ZeroGPU it returns the function itself and never imports ``spaces``.
- The arguments cross a process boundary (pickled): the decorated functions take plain data and
  a registry key, never a model; results and streamed ids come back the same way.
- :func:`duration_s` sizes the lease to the request (tokens asked for, prompt length, the speed
  measured on this Space), capped by ``ALI_ZEROGPU_MAX_DURATION_S``; the generation itself stops
  a little before the lease ends (transformers' ``max_time``, from a wall-clock deadline set when
  the lease is asked for: the GPU worker's start-up counts) so the slice is not revoked mid-turn:
  the turn ends with ``finish_reason`` ``length``.
- :func:`gpu_error` turns what the scheduler raises (quota spent, queue timeout, task aborted)
  into one clear sentence for the visitor.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

MAX_DURATION_S = 120.0  # the longest lease asked for (ZeroGPU refuses longer ones for most visitors)
MIN_DURATION_S = 10.0
OVERHEAD_S = 6.0  # fork, weights to the GPU slice, the first CUDA call
FALLBACK_TOKENS_PER_S = 15.0  # until a generation on this Space has been measured (conservative)
PREFILL_TOKENS_PER_S = 4000.0
MARGIN_S = 3.0  # the generation stops this long before the lease ends


TRUE = ("1", "t", "true", "yes", "on")


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether this is a ZeroGPU Space (``SPACES_ZERO_GPU``, the variable the ``spaces`` package reads)."""
    env = os.environ if environ is None else environ
    return (env.get("SPACES_ZERO_GPU") or "").strip().lower() in TRUE


def max_duration_s() -> float:
    raw = os.environ.get("ALI_ZEROGPU_MAX_DURATION_S")
    try:
        v = float(raw) if raw else MAX_DURATION_S
    except ValueError:
        v = MAX_DURATION_S
    return max(MIN_DURATION_S, v)


def gpu_task(fn: F, duration: Callable[..., float]) -> F:
    """``spaces.GPU(duration=duration)(fn)`` on ZeroGPU; ``fn`` itself elsewhere."""
    if not enabled():
        return fn
    import spaces  # the package must be imported before torch touches CUDA: app.main does it first

    return spaces.GPU(duration=duration)(fn)


class _Speed:
    """Decode speed measured on this Space (tokens/s, a running mean), for sizing leases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens_per_s: float | None = None

    def record(self, tokens: int, seconds: float) -> None:
        if tokens < 8 or seconds <= 0:
            return
        rate = tokens / seconds
        with self._lock:
            self.tokens_per_s = rate if self.tokens_per_s is None else 0.7 * self.tokens_per_s + 0.3 * rate

    def get(self) -> float:
        with self._lock:
            return self.tokens_per_s or FALLBACK_TOKENS_PER_S


SPEED = _Speed()


def duration_s(new_tokens: int | None, prompt_tokens: int = 0, *, tokens_per_s: float | None = None) -> float:
    """Seconds of GPU to ask for: start-up, prefill, and ``new_tokens`` at the measured speed
    (half of it: a busy slice is slower), within [MIN_DURATION_S, max_duration_s()]."""
    rate = (tokens_per_s or SPEED.get()) * 0.5
    want = OVERHEAD_S + prompt_tokens / PREFILL_TOKENS_PER_S + (new_tokens or 512) / rate
    return float(min(max_duration_s(), max(MIN_DURATION_S, round(want))))


def scoring_duration_s(tokens: int) -> float:
    """Seconds of GPU for the logprob lens: start-up, loading the scorer (the first time in a
    GPU worker) and one forward pass over ``tokens``."""
    want = OVERHEAD_S + 15.0 + tokens / PREFILL_TOKENS_PER_S
    return float(min(max_duration_s(), max(MIN_DURATION_S, round(want))))


def lease_deadline(lease_s: float) -> float:
    """The wall-clock time (``time.time()``, the same clock in the forked GPU process) by which
    the work of a lease of ``lease_s`` seconds, asked for now, must end."""
    return time.time() + lease_s - MARGIN_S


def time_left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (at least a little: the first step always runs), None for none."""
    return None if deadline is None else max(0.5, deadline - time.time())


def gpu_error(e: BaseException) -> str | None:
    """A visitor's sentence for an error raised by ZeroGPU's scheduler (a ``gradio.Error``
    titled "ZeroGPU …": the quota spent, the queue timed out, the task aborted); None for
    any other exception."""
    gr = sys.modules.get("gradio")
    if gr is None or not isinstance(e, gr.Error):
        return None
    title = str(getattr(e, "title", "") or "")
    if "zerogpu" not in title.lower():
        return None
    message = str(getattr(e, "message", "") or e).strip()
    text = f"{title}: {message}" if message else title
    if "quota" in title.lower():
        text += (" — the Trace files and Inspector tabs need no GPU; a smaller Max tokens asks for a shorter "
                 "GPU lease; logged-in visitors get more quota")
    return text
