"""Building a trace: the one place that appends tokens, messages and steps, and checks that they
agree, for the engine and every importer.

A :class:`TraceBuilder` holds the invariants a finished :class:`~backend.trace.Trace` must keep:

* token ids are integers in range (of the tokenizer's vocabulary when it is known);
* the response mask has one bit (0 or 1) per response token;
* message spans lie inside the ids, in order, without overlapping (the tool messages of one
  turn share its block), and name a message of the trace (or -1: template text);
* steps are numbered in order and their token spans lie inside the ids, in order.

:func:`mask_runs` is the run-length form of a mask (the only copy).
"""

from __future__ import annotations

from typing import Any

from backend.trace.model import MAX_TOKEN_ID, MessageSpan, Step, StepInfo, StepState, TerminationReason, Trace, TraceFormatError


class TraceBuildError(TraceFormatError):
    """What was given cannot make a valid trace (ids out of range, a mask of the wrong length...)."""


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """``[(bit, length), ...]`` of consecutive equal mask bits: ``[1, 1, 0]`` → ``[(1, 2), (0, 1)]``."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], i - start))
            start = i
    return out


class TraceBuilder:
    """A trace under construction. ``vocab_size``/``tokenizer_name``: refuse ids the tokenizer
    does not have; ``imported``: mark every step as made by an importer (``info.imported``)."""

    def __init__(self, messages: list[dict[str, Any]] | None = None, *, vocab_size: int | None = None,
                 tokenizer_name: str | None = None, imported: bool = False):
        self.messages: list[dict[str, Any]] = messages if messages is not None else []
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.steps: list[Step] = []
        self.message_spans: list[MessageSpan] = []
        self.vocab_size = vocab_size
        self.tokenizer_name = tokenizer_name
        self.imported = imported

    @property
    def total(self) -> int:
        """Tokens so far (prompt + response)."""
        return len(self.prompt_ids) + len(self.response_ids)

    # ---- tokens ---------------------------------------------------------------------------------
    def _check_ids(self, ids: list[Any], name: str, offset: int) -> None:
        top = self.vocab_size - 1 if self.vocab_size else MAX_TOKEN_ID
        if not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= top):
            return  # all good (the common case, checked at C speed); else find the first bad one
        for j, t in enumerate(ids):
            if type(t) is not int:
                raise TraceBuildError(f"{name}[{offset + j}] is {t!r}, not an integer token id")
            if t < 0 or t > top:
                if self.vocab_size:
                    raise TraceBuildError(
                        f"{name}[{offset + j}] = {t} is outside the vocabulary of tokenizer {self.tokenizer_name!r} "
                        f"({self.vocab_size} tokens); pass the tokenizer the ids came from")
                raise TraceBuildError(f"token id {t} at position {offset + j} of {name} is out of range 0..{MAX_TOKEN_ID}")

    def set_prompt(self, ids: list[int]) -> None:
        """The prompt's ids (before any response token)."""
        if self.response_ids:
            raise TraceBuildError("the prompt is set before any response token")
        self._check_ids(ids, "prompt_ids", 0)
        self.prompt_ids = list(ids)

    def append(self, ids: list[int], bit: int) -> tuple[int, int]:
        """Append response tokens with one mask bit (1: generated, 0: context); their span."""
        if bit not in (0, 1):
            raise TraceBuildError(f"a mask bit is 0 or 1, not {bit!r}")
        self._check_ids(ids, "response_ids", len(self.response_ids))
        start = self.total
        self.response_ids += ids
        self.response_mask += [bit] * len(ids)
        return start, self.total

    def relabel_tail(self, n: int, bit: int) -> None:
        """Give the last ``n`` response tokens the mask bit ``bit`` (a generated stop token that the
        template counts as the next message's opening: context)."""
        if not 0 <= n <= len(self.response_mask) or bit not in (0, 1):
            raise TraceBuildError(f"cannot relabel the last {n} of {len(self.response_mask)} response tokens as {bit!r}")
        if n:
            self.response_mask[-n:] = [bit] * n

    def add_context(self, step: Step, ids: list[int], *, relabel: int = 0,
                    messages: list[dict[str, Any]] | None = None) -> Step:
        """A context turn (tool results, a harness's new messages) appended to ``step`` as the agent
        loop and the capture gateway append one: the family's junction relabel first (the last
        ``relabel`` generated tokens open the next message: context from here on), then ``ids`` at
        mask 0, then ``messages``, which share the block. Sets the step's end and messages."""
        if relabel:
            self.relabel_tail(relabel, 0)
        _, step.end = self.append(ids, 0)
        if messages is not None:
            step.messages_added = self.add_messages(messages, step.start, step.end)
        return step

    def add_generated(self, step: Step, ids: list[int]) -> Step:
        """A turn the model generated, appended to ``step`` at mask 1. Sets the step's end."""
        _, step.end = self.append(ids, 1)
        return step

    def set_response(self, ids: list[int], mask: list[int]) -> None:
        """Response ids with their mask as given (a source that has both)."""
        if len(mask) != len(ids):
            raise TraceBuildError(f"response_mask has {len(mask)} entries but response_ids has {len(ids)}")
        for j, m in enumerate(mask):
            if type(m) is not int or m not in (0, 1):
                raise TraceBuildError(f"response_mask[{j}] is {m!r}; mask values must be 0 or 1")
        self._check_ids(ids, "response_ids", 0)
        self.response_ids, self.response_mask = list(ids), list(mask)

    # ---- messages -------------------------------------------------------------------------------
    def add_messages(self, msgs: list[dict[str, Any]], start: int | None = None, end: int | None = None) -> list[int]:
        """Append messages; with a token span, each gets it (one rendered block). Their indices."""
        first = len(self.messages)
        self.messages.extend(msgs)
        added = list(range(first, len(self.messages)))
        if start is not None and end is not None:
            for i in added:
                self.add_span(MessageSpan(message=i, start=start, end=end))
        return added

    def add_span(self, span: MessageSpan) -> None:
        last = self.message_spans[-1] if self.message_spans else None
        same_block = last is not None and (last.start, last.end) == (span.start, span.end)
        if not -1 <= span.message < len(self.messages):
            raise TraceBuildError(f"a message span names message {span.message}; the trace has {len(self.messages)}")
        if not 0 <= span.start <= span.end <= self.total:
            raise TraceBuildError(f"message {span.message}'s span [{span.start}, {span.end}) is outside the {self.total} tokens")
        if last is not None and not same_block and span.start < last.end and span.end > span.start:
            raise TraceBuildError(f"message {span.message}'s span [{span.start}, {span.end}) overlaps the span before it "
                                  f"[{last.start}, {last.end})")
        self.message_spans.append(span)

    # ---- steps ----------------------------------------------------------------------------------
    def step(self, state: StepState | str, **fields: Any) -> Step:
        """A new step, numbered next (not added yet); an empty span at the current end by default."""
        fields.setdefault("start", self.total)
        fields.setdefault("end", fields["start"])
        return Step(index=len(self.steps), state=state, **fields)

    def add_step(self, step: Step) -> Step:
        if step.index != len(self.steps):
            raise TraceBuildError(f"step {step.index} added as step {len(self.steps)}")
        prev = self.steps[-1] if self.steps else None
        if step.end > self.total:
            raise TraceBuildError(f"step {step.index} span [{step.start}, {step.end}) is past the {self.total} tokens of the trace")
        if prev is not None and step.start < prev.end:
            raise TraceBuildError(f"step {step.index} starts at token {step.start}, inside step {prev.index} [{prev.start}, {prev.end})")
        if self.imported and step.info.imported is None:  # first, as importers always wrote it
            step.info = StepInfo(imported=True, **step.info.model_dump())
        self.steps.append(step)
        return step

    def terminate(self, reason: TerminationReason | str | None) -> Step:
        """The closing ``terminated`` step (empty, at the end of the ids), carrying ``reason``."""
        info = StepInfo(reason=reason, imported=True) if self.imported else StepInfo(reason=reason)
        return self.add_step(Step(index=len(self.steps), state=StepState.TERMINATED, start=self.total, end=self.total, info=info))

    # ---- the trace ------------------------------------------------------------------------------
    def build(self, *, termination_reason: TerminationReason | str | None = None, **fields: Any) -> Trace:
        """The trace (``fields``: tools, tokenizer, metadata, config, id)."""
        return Trace(
            messages=self.messages, prompt_ids=self.prompt_ids, response_ids=self.response_ids,
            response_mask=self.response_mask, steps=self.steps, message_spans=self.message_spans,
            termination_reason=termination_reason, **fields,
        )
