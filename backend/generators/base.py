"""The one small interface every model backend implements.

The engine hands a backend token ids and gets token ids back (EOS included when the model
stopped on it), exactly as verl's server manager does: no text round-trip, so nothing is
re-tokenized between turns.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
import contextlib
import contextvars
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Constraint:
    """A decoding constraint for one generated turn (tool_choice; see backend.tool_choice).

    ``kind``: "none" (no constraint), "regex", "json_schema", "grammar" (EBNF/lark), or
    "structural_tag". ``spec`` is the regex / schema / grammar text the backend enforces.
    ``given_check``: how a turn the model did NOT generate under this constraint (a script, an
    import) is checked against it (``backend.tool_choice.check_given``); None: by ``spec``.
    """

    kind: str = "none"
    spec: Any = None
    description: str = ""
    given_check: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "spec": self.spec, "description": self.description}


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string), "length", "abort"
    logprobs: list[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # backend details (server url, timings, ...)


class GenerationError(RuntimeError):
    """A backend failed in a way the user should read (unreachable server, OOM, ...)."""


class Generator(abc.ABC):
    """Async token-in/token-out text generation."""

    name: str = "generator"

    @abc.abstractmethod
    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        on_tokens: TokenCallback | None = None,
        constraint: Constraint | None = None,
    ) -> Generation:
        """Generate a continuation of ``prompt_ids``.

        Must honour ``params.max_tokens``; must abort the underlying request when the calling
        task is cancelled (re-raise ``asyncio.CancelledError`` after aborting).
        """

    def describe(self) -> dict[str, Any]:
        """What to record in the trace's metadata about this backend."""
        return {"backend": self.name}

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (engine, HTTP sessions)."""
