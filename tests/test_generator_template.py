"""Generator.generate is a template: a backend implements only ``_generate`` and gets the
zero-budget answer, constraint reading, info assembly and error wrapping from the base."""

from __future__ import annotations

import asyncio

import pytest

from backend.constraints import Constraint, forbid_grammar, normalize_constraint
from backend.generators.base import Generation, GenerationError, Generator, Request, SamplingParams, Stopwatch


class Echo(Generator):
    """A new backend: nothing but the hook."""

    name = "echo"
    label = "Echo"

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.requests: list[Request] = []

    async def _generate(self, request: Request) -> Generation:
        self.requests.append(request)
        clock = Stopwatch()
        for t in request.prompt_ids[: request.params.max_tokens]:
            clock.tokens_arrived()
            request.emit([t])
        if self.fail is not None:
            raise self.fail
        return Generation(list(request.prompt_ids[: request.params.max_tokens]), "stop", info={"ttft_s": clock.ttft_s})


async def test_the_hook_is_all_a_backend_writes():
    gen = Echo()
    got: list[int] = []
    g = await gen.generate([5, 6, 7], SamplingParams(max_tokens=2), on_tokens=got.extend)
    assert g.token_ids == [5, 6] and got == [5, 6]
    assert list(g.info) == ["backend", "ttft_s"] and g.info["backend"] == "echo" and g.info["ttft_s"] >= 0
    assert gen.requests[0].constraint is None and gen.requests[0].structured is None


async def test_no_budget_is_answered_without_the_backend():
    gen = Echo()
    g = await gen.generate([1, 2], SamplingParams(max_tokens=0, logprobs=0))
    assert (g.token_ids, g.finish_reason, g.logprobs, g.info) == ([], "length", [], {"backend": "echo"})
    assert gen.requests == []


async def test_the_constraint_is_read_once_and_recorded():
    gen = Echo()
    g = await gen.generate([1], SamplingParams(max_tokens=4), constraint=Constraint("regex", "a+"))
    assert gen.requests[-1].structured == ("regex", "a+") and g.info["constraint"] == "regex"
    await gen.generate([1], SamplingParams(max_tokens=4), constraint=Constraint("forbid", ["<tool_call>"]))
    assert gen.requests[-1].structured == ("grammar", forbid_grammar(["<tool_call>"]))
    g = await gen.generate([1], SamplingParams(max_tokens=4), constraint=Constraint("none"))
    assert gen.requests[-1].constraint is None and "constraint" not in g.info
    n = len(gen.requests)
    with pytest.raises(GenerationError, match="invalid telepathy constraint: unknown constraint kind"):
        await gen.generate([1], SamplingParams(max_tokens=4), constraint=Constraint("telepathy", "x"))
    assert len(gen.requests) == n  # refused before the backend was asked
    assert normalize_constraint(Constraint("json_schema", {"type": "object"})) == ("json", {"type": "object"})


async def test_backend_failures_are_wrapped_and_callback_errors_are_not():
    boom = OSError("lost\nsecond line")
    with pytest.raises(GenerationError, match=r"^Echo generation failed \(OSError\): lost$") as info:
        await Echo(fail=boom).generate([1], SamplingParams(max_tokens=1))
    assert info.value.__cause__ is boom and isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    own = GenerationError("the backend's own words")
    with pytest.raises(GenerationError) as info:
        await Echo(fail=own).generate([1], SamplingParams(max_tokens=1))
    assert info.value is own

    def ui_gone(_delta):
        raise RuntimeError("ui went away")

    with pytest.raises(RuntimeError, match="ui went away") as info:
        await Echo().generate([1, 2], SamplingParams(max_tokens=2), on_tokens=ui_gone)
    assert not isinstance(info.value, GenerationError)
    with pytest.raises(asyncio.CancelledError):
        await Echo(fail=asyncio.CancelledError()).generate([1], SamplingParams(max_tokens=1))


async def test_a_generator_with_neither_method_says_so():
    class Empty(Generator):
        pass

    with pytest.raises(NotImplementedError, match="Empty implements neither"):
        await Empty().generate([1], SamplingParams(max_tokens=1))
