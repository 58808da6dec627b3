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
  a little before the lease ends (transformers' ``max_time``, from a deadline the GPU task sets
  when it starts: the time a visitor waited in ZeroGPU's queue is not taken from the turn) so the
  slice is not revoked mid-turn: the turn ends with ``finish_reason`` ``length``.
- The weights go to ``"cuda"`` in the app's process (ZeroGPU packs them there and moves them to
  each lent slice), but ``spaces`` emulates CUDA there only in the thread that imported it: its
  torch modes are thread-local and ``torch._C._cuda_init`` is replaced by a function that raises.
  :func:`to_device` moves a model in a thread that has entered those modes (as ``spaces`` itself
  does for its own threads), so a model loaded lazily, or the lens's scorer, loads from any thread.
- :func:`gpu_error` turns what the scheduler raises (quota spent, queue timeout, task aborted)
  into one clear sentence for the visitor.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


def cpu_torch() -> str | None:
    """The installed torch's version when it is a CPU build (``2.13.0+cpu``), else None. Read
    from the package metadata: ``import spaces`` on ZeroGPU reads ``torch.version.cuda`` and
    fails with a CPU build, so this is asked before that import."""
    try:
        v = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return v if "+cpu" in v else None


def usable(environ: dict[str, str] | None = None) -> bool:
    """ZeroGPU hardware with a torch that can use it (not the CPU build: then the app runs on the
    CPU and says so, :mod:`backend.deploy.hardware`)."""
    return enabled(environ) and cpu_torch() is None


def import_spaces() -> str | None:
    """On ZeroGPU, import ``spaces`` (before anything touches torch or CUDA: it patches torch on
    import). Returns a one-line warning instead when the installed torch is a CPU build, whose
    import would fail inside ``spaces``; None otherwise (and off ZeroGPU, where nothing is done)."""
    if not enabled():
        return None
    cpu = cpu_torch()
    if cpu is not None:
        return (f"ZeroGPU hardware but torch {cpu} is a CPU build: `spaces` not imported, the model runs on the CPU "
                "(use the zerogpu variant's requirement files: python scripts/space_variant.py zerogpu)")
    import spaces  # noqa: F401

    return None


def gpu_task(fn: F, duration: Callable[..., float]) -> F:
    """``spaces.GPU(duration=duration)(fn)`` on ZeroGPU; ``fn`` itself elsewhere (and on ZeroGPU
    hardware with a CPU build of torch, where ``spaces`` cannot be imported)."""
    if not usable():
        return fn
    import spaces  # the package must be imported before torch touches CUDA: app.main does it first

    return spaces.GPU(duration=duration)(fn)


# ---- CUDA in the app's process ------------------------------------------------------------------

_EMULATED: dict[int, ThreadPoolExecutor] = {}  # by process id: a fork does not inherit the thread
_EMULATED_LOCK = threading.Lock()


def _spaces_torch() -> Any:
    """``spaces.zero.torch`` when ``spaces`` has patched torch in this process (ZeroGPU, the app's
    process), None in a GPU worker (where ``spaces`` has restored torch) and everywhere else."""
    if not enabled():
        return None
    wrappers = sys.modules.get("spaces.zero.wrappers")
    if wrappers is not None and getattr(wrappers, "forked", False):
        return None  # the worker forked for a call: real CUDA on the lent slice
    zt = sys.modules.get("spaces.zero.torch")
    patching = sys.modules.get("spaces.zero.torch.patching")
    torch = sys.modules.get("torch")
    raiser = getattr(patching, "_cuda_init_raise", None)
    if torch is None or raiser is None or getattr(torch._C, "_cuda_init", None) is not raiser:
        return None  # torch is not patched in this process (anymore)
    return zt if callable(getattr(zt, "enter_mode", None)) else None


def _emulated_pool(zt: Any) -> ThreadPoolExecutor:
    pid = os.getpid()
    with _EMULATED_LOCK:
        pool = _EMULATED.get(pid)
        if pool is None:
            # one thread that enters spaces' (thread-local) CUDA emulation once and keeps it
            pool = _EMULATED[pid] = ThreadPoolExecutor(1, thread_name_prefix="ali-zerogpu-cuda", initializer=zt.enter_mode)
        return pool


def to_device(module: Any, device: str) -> Any:
    """``module.to(device)``. On ZeroGPU, in the app's process, a move to CUDA runs in a thread
    that has entered ``spaces``' CUDA emulation (its torch modes are thread-local: from any other
    thread the move reaches the real ``_cuda_init``, which ``spaces`` made raise)."""
    zt = _spaces_torch() if str(device).startswith("cuda") else None
    if zt is None:
        return module.to(device)
    return _emulated_pool(zt).submit(module.to, device).result()


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
