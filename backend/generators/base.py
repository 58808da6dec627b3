"""The one small interface every model backend implements, and the template it runs in.

The engine hands a backend token ids and gets token ids back (EOS included when the model
stopped on it), exactly as verl's server manager does: no text round-trip, so nothing is
re-tokenized between turns.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.constraints import Constraint, active_constraint, normalize_constraint
from backend.errors import UserError

# Called with the ids generated since the previous call (a delta), as they arrive.
TokenCallback = Callable[[list[int]], None]

# The conversation the current generate call belongs to (the engine sets it to the run's trace id
# for the whole run). A backend that spreads requests over several servers pins a conversation
# to one of them with it (prefix cache); None: a request outside any conversation. A context
# variable, so that it reaches every backend without a parameter on every ``generate``.
conversation_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("conversation_key", default=None)


@contextlib.contextmanager
def conversation(key: str | None) -> Iterator[None]:
    """Within the block (and the tasks it starts), generate calls belong to conversation ``key``."""
    token = conversation_key.set(key)
    try:
        yield
    finally:
        conversation_key.reset(token)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: no logprobs; 0: logprob of the sampled token
    ignore_eos: bool = False

    def replace(self, **kw: Any) -> SamplingParams:
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        d = dict(d or {})
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        if "stop" in d and d["stop"] is not None:
            d["stop"] = tuple([d["stop"]] if isinstance(d["stop"], str) else d["stop"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string), "length", "abort"
    logprobs: list[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # backend details (server url, timings, ...)


class GenerationError(UserError, RuntimeError):
    """A backend failed in a way the user should read (unreachable server, OOM, ...).

    Also a RuntimeError, as it always was."""


def first_line(e: BaseException) -> str:
    """The first line of ``str(e)``, or the exception's class name when it has no message."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class Stopwatch:
    """Time to the first token and total time of one request (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ttft_s: float | None = None

    def tokens_arrived(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.t0

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


@dataclass
class Request:
    """One :meth:`Generator.generate` call as the template hands it to a backend's hook."""

    prompt_ids: list[int]
    params: SamplingParams
    constraint: Constraint | None  # None when the call constrains nothing
    structured: tuple[str, Any] | None  # the constraint as (field, spec): normalize_constraint
    on_tokens: TokenCallback | None = None
    callback_error: BaseException | None = None  # what on_tokens raised, if it did

    def emit(self, delta: list[int]) -> None:
        """Hand ``delta`` to the caller's ``on_tokens`` (when there is one). What it raises is the
        caller's own exception: the template lets it through as it is."""
        if self.on_tokens is None:
            return
        try:
            self.on_tokens(delta)
        except BaseException as e:
            self.callback_error = e
            raise


class Generator:
    """Async token-in/token-out text generation.

    :meth:`generate` is the one template every backend shares; a backend implements
    :meth:`_generate` (the request itself) and nothing around it.
    """

    name: str = "generator"
    label: str = "generator"  # how error messages name the backend
    # A model decodes under a constraint: the template reads the constraint before the hook
    # runs and records ``backend`` and ``constraint`` in the Generation's info. A replay of
    # given text (``scripted``) checks the text against the constraint itself, and its info is
    # left as the hook made it.
    decodes: bool = True
    # What the backend's logprobs are: vLLM's ``logprobs_mode`` (``raw_logprobs`` by default:
    # before temperature / top-k / top-p; ``processed_logprobs``: after them). transformers
    # returns the raw logits (``output_logits``), so its logprobs are raw.
    logprobs_mode: str = "raw_logprobs"
    # whether a decoding constraint's mask reaches the raw logprobs too (vLLM: the bitmask is
    # applied to the logits before the sampler takes them); processed ones always see it
    raw_logprobs_see_constraint: bool = True

    def logprob_kind(self) -> str:
        """``"raw"`` or ``"processed"``: what :attr:`logprobs_mode` means for a trainer."""
        return "processed" if str(self.logprobs_mode).startswith("processed") else "raw"

    def logprobs_constrained(self, constrained_turn: bool) -> bool:
        """Whether a constrained turn's logprobs are the grammar's (renormalised over the allowed tokens)."""
        return constrained_turn and (self.logprob_kind() == "processed" or self.raw_logprobs_see_constraint)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        on_tokens: TokenCallback | None = None,
        constraint: Constraint | None = None,
    ) -> Generation:
        """Generate a continuation of ``prompt_ids``.

        * ``params.max_tokens <= 0``: an empty ``"length"`` generation; the backend is not asked.
        * A constraint that cannot be read: :class:`GenerationError` before anything runs.
        * A failure of the backend: :class:`GenerationError` (its own, or one that wraps the
          exception); NotImplementedError (a feature the backend lacks) and what ``on_tokens``
          raises propagate as they are.
        * Cancelling the calling task aborts the request; ``CancelledError`` is re-raised.
        """
        if params.max_tokens is not None and params.max_tokens <= 0:
            return Generation([], "length", [] if params.logprobs is not None else None, {"backend": self.name})
        active = active_constraint(constraint)
        structured = None
        if self.decodes and active is not None:
            try:
                structured = normalize_constraint(active)
            except ValueError as e:
                raise GenerationError(f"invalid {active.kind} constraint: {e}") from e
        request = Request(prompt_ids, params, active, structured, on_tokens)
        try:
            gen = await self._generate(request)
        except (GenerationError, NotImplementedError):
            raise
        except Exception as e:
            if e is request.callback_error:
                raise
            raise self._failure(e) from e
        if self.decodes:
            gen.info = {"backend": self.name, **gen.info}
            if active is not None:
                gen.info["constraint"] = active.kind
        return gen

    async def _generate(self, request: Request) -> Generation:
        """The backend's request: honour ``request.params`` (``max_tokens`` included), enforce
        ``request.structured``, hand deltas to ``request.emit`` as they arrive, and abort the
        underlying request when the calling task is cancelled (then re-raise)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither _generate nor generate")

    def _failure(self, e: Exception) -> GenerationError:
        """The GenerationError that reports ``e``, an exception the backend raised."""
        return GenerationError(f"{self.label} generation failed ({type(e).__name__}): {first_line(e)}")

    def describe(self) -> dict[str, Any]:
        """What to record in the trace's metadata about this backend."""
        return {"backend": self.name}

    def context_length(self) -> int | None:
        """The most tokens a prompt and its generation may hold together, when the backend knows
        it (vLLM's ``max_model_len``); None: no limit known here."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (engine, HTTP sessions)."""


__all__ = [
    "Constraint",
    "Generation",
    "GenerationError",
    "Generator",
    "Request",
    "SamplingParams",
    "Stopwatch",
    "TokenCallback",
    "conversation",
    "conversation_key",
    "first_line",
]
