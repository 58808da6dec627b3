"""The agent loop: verl's ``ToolAgentLoop`` as an explicit, token-exact state machine.

PENDING → GENERATING → PROCESSING_TOOLS → GENERATING → … → TERMINATED

* PENDING renders the messages + tools with the generation prompt: ``prompt_ids``.
* GENERATING sends ``prompt_ids + response_ids`` to the generator and appends the returned ids
  as they are (mask 1). No text round-trip: what the model produced is what is recorded.
* PROCESSING_TOOLS runs the parsed calls (at most ``max_parallel_calls``), then tokenizes the
  new tool messages as the text the template adds after the conversation (checked to be a
  suffix; verl's way — render them alone, strip the empty-conversation prefix — where it agrees,
  which is then used alone) and appends them (mask 0).

Every transition becomes a :class:`~backend.trace.Step`; the result is a :class:`~backend.trace.Trace`.
Configuration is immutable (:class:`LoopConfig`); all per-run state lives in one :class:`_Run`.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.config import ConfigError, LoopConfig  # noqa: F401 - ConfigError: re-exported
from backend.families import rule_for
from backend.generators.base import Constraint, Generation, GenerationError, Generator, conversation
from backend.loading.tokenizers import TokenizerBundle
from backend.parsers import get_parser
from backend.tokens.rendering import RenderError, decode, empty_render_prefix, render, render_tool_turn
from backend.tool_choice import ToolChoiceError, build_constraint, choice_for_turn, validate_policy
from backend.trace import Step, ToolCall, ToolResult, Trace, new_trace_id
from backend.trace.builder import TraceBuilder
from backend.trace.messages import assistant_message, strip_suffix
from backend.trace.model import LogprobSemantics, StepInfo, StepState, TerminationReason

R = TerminationReason  # recorded in Trace.termination_reason
S = StepState
# how long a cancelled run waits for its generation's clean-up (the backend's abort) before the
# cancellation leaves the loop
CANCEL_CLEANUP_S = 30.0


# Tokenizer work on inputs smaller than this runs on the event loop (see AgentLoop._off_loop).
INLINE_WORK_CHARS = 16_384


async def tokenizer_work(bundle: TokenizerBundle, fn: Callable[..., Any], *args: Any, size_hint: int | None = None,
                         **kwargs: Any) -> Any:
    """Tokenizer/template work, serialised per tokenizer (HF fast tokenizers mutate shared state
    on each call). Large inputs (``size_hint`` characters at least :data:`INLINE_WORK_CHARS`, or
    none given) run in a thread, as verl's run_in_executor does, so a 10 MB tool output cannot
    stall other runs; small ones (the common tool turn, ~0.2 ms of work) run inline, where a
    thread hop would cost more than the work. The agent loop's and the capture gateway's."""

    def locked():
        with bundle._lock:
            return fn(*args, **kwargs)

    if size_hint is not None and size_hint < INLINE_WORK_CHARS:
        return locked()
    return await asyncio.to_thread(locked)


def text_before_stop(bundle: TokenizerBundle, ids: list[int], text: str, stop_ids: set[int]) -> str:
    """``text`` (the decode of a generated turn's ``ids``) without the stop token the turn ended
    on, if it ended on one: what the tool-call parser reads."""
    if ids and ids[-1] in stop_ids:
        eos = bundle.tokenizer.convert_ids_to_tokens(ids[-1]) or ""
        return strip_suffix(text, eos) if eos and text.endswith(eos) else decode(bundle, ids[:-1])
    return text


@dataclass
class LoopEvent:
    """Progress of a run, for live views. ``kind``: "step" (a step finished), "tokens" (new
    generated ids of the current step), "state" (entering a state). ``messages``: on "step", the
    message dicts that step appended (copies; empty for other events)."""

    kind: str
    step: Step | None = None
    state: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)


EventCallback = Callable[[LoopEvent], None]


@dataclass
class _Run:
    """All state of one run (verl keeps this in AgentData); the trace so far is ``trace``."""

    trace: TraceBuilder
    assistant_turns: int = 0
    user_turns: int = 0
    pending_calls: list[ToolCall] = field(default_factory=list)
    termination: TerminationReason | None = None
    started: float = field(default_factory=time.time)
    stop_reason: TerminationReason | None = None  # why the run's stop event was set: cancelled or time_limit

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.trace.messages

    @property
    def total(self) -> int:
        return self.trace.total


class AgentLoop:
    def __init__(
        self,
        generator: Generator,
        tokenizer: TokenizerBundle,
        tools: Any = None,  # backend.tools.ToolRegistry
        config: LoopConfig | None = None,
    ):
        self.generator = generator
        self.bundle = tokenizer
        self.tools = tools
        self.config = config or LoopConfig()
        self.parser = get_parser(self.config.parser or tokenizer.parser, tokenizer=tokenizer.tokenizer)
        self._system_prefix: str | None = None
        # whether verl's way of tokenizing a tool turn was seen to agree with the conversation's
        # suffix for this template (backend.tokens.rendering.render_tool_turn)
        self._verl_agrees = False
        self._stop_ids = set(tokenizer.stop_token_ids)
        # how a tool turn continues the sequence for this tokenizer + template (tool_turns "continuous");
        # picked on the first tool turn, off the event loop (a user's template renders in the guarded worker)
        self._rule: Any = None
        policy = self.config.tool_choice_policy
        try:
            validate_policy(policy, [t.get("function", t).get("name") for t in self.tool_schemas])
        except ToolChoiceError as e:
            raise ConfigError(str(e)) from None
        self._constraints: dict[str, Constraint | None] = {}
        for choice in set(policy):  # built once per loop, reused every turn
            try:
                self._constraints[choice] = build_constraint(choice, self.parser.name, self.tool_schemas,
                                                             max_calls=self.config.max_parallel_calls)
            except ToolChoiceError as e:
                raise ConfigError(str(e)) from None

    # ---- helpers ----------------------------------------------------------------------------
    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self.tools.schemas) if self.tools is not None and len(self.tools) else []

    async def _off_loop(self, fn, *args, _size_hint: int | None = None, **kwargs):
        """:func:`tokenizer_work` on this loop's tokenizer."""
        return await tokenizer_work(self.bundle, fn, *args, size_hint=_size_hint, **kwargs)

    def _decode(self, ids: list[int]) -> str:
        return decode(self.bundle, ids)

    def _emit(self, cb: EventCallback | None, ev: LoopEvent) -> None:
        if cb is not None:
            cb(ev)

    def _end_step(self, run: _Run, step: Step, t0: float, on_event: EventCallback | None, next_state: StepState,
                  termination: TerminationReason | None = None) -> StepState:
        """Every step ends here: timed, added to the trace, announced (with copies of the
        messages it appended); ``termination`` ends the run."""
        step.duration_s = time.time() - t0
        run.trace.add_step(step)
        if termination is not None:
            run.termination = termination
        if on_event is not None:
            on_event(LoopEvent("step", step=step, messages=[copy.deepcopy(run.messages[i]) for i in step.messages_added]))
        return next_state

    # ---- run --------------------------------------------------------------------------------
    async def run(
        self,
        messages: list[dict[str, Any]],
        *,
        on_event: EventCallback | None = None,
        cancel: asyncio.Event | None = None,
        trace_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        time_limit_s: float | None = None,
        conversation_key: str | None = None,
    ) -> Trace:
        """Run the loop to termination and return the trace. Never raises for model, tool or
        template failures: they end the run with a termination reason and an error on the step.
        ``cancel`` (set from another task) aborts the current generation and ends the run.
        ``time_limit_s``: a wall-clock limit for the whole run; when it passes, the generation
        in progress is aborted (what it produced is kept) and the run ends with ``time_limit``
        before its next state. Every generation of the run belongs to one conversation, keyed by
        ``conversation_key`` or else the trace id (a backend with several servers sends all of
        its turns to one of them; a chat whose every message is a run passes its own key, which
        the trace records as ``metadata.conversation_id``)."""
        run = _Run(trace=TraceBuilder(copy.deepcopy(list(messages))))
        trace_id = trace_id or new_trace_id()
        stop, timer = cancel, None
        if time_limit_s is not None and time_limit_s > 0:
            stop = asyncio.Event()
            timer = asyncio.ensure_future(self._watch(run, cancel, stop, time_limit_s))
        try:
            with conversation(conversation_key or trace_id):
                state = S.PENDING
                while state != S.TERMINATED:
                    if run.stop_reason == R.TIME_LIMIT and state != S.PENDING:
                        run.termination = R.TIME_LIMIT
                        break
                    self._emit(on_event, LoopEvent("state", state=state))
                    if state == S.PENDING:
                        state = await self._pending(run, on_event)
                    elif state == S.GENERATING:
                        state = await self._generating(run, on_event, stop)
                    elif state == S.PROCESSING_TOOLS:
                        state = await self._processing_tools(run, on_event)
                    else:  # pragma: no cover - states are closed
                        raise AssertionError(state)
        finally:
            if timer is not None:
                timer.cancel()
        end = run.trace.terminate(run.termination)
        end.started_at = time.time()
        self._emit(on_event, LoopEvent("step", step=end))
        return self._trace(run, trace_id, metadata, conversation_key)

    @staticmethod
    async def _watch(run: _Run, cancel: asyncio.Event | None, stop: asyncio.Event, limit_s: float) -> None:
        """Set ``stop`` when the caller cancels or the time limit passes, noting which."""
        try:
            if cancel is None:
                await asyncio.sleep(limit_s)
            else:
                await asyncio.wait_for(cancel.wait(), timeout=limit_s)
                run.stop_reason = R.CANCELLED
                stop.set()
                return
        except asyncio.TimeoutError:
            pass
        run.stop_reason = R.TIME_LIMIT
        stop.set()

    def _trace(self, run: _Run, trace_id: str, metadata: dict[str, Any] | None, conversation_key: str | None = None) -> Trace:
        n = self.config.response_length
        meta = {
            "source": "engine",
            "generator": self.generator.describe(),
            "parser": self.parser.name,
            "started_at": run.started,
            "duration_s": time.time() - run.started,
            "assistant_turns": run.assistant_turns,
            "user_turns": run.user_turns,
        }
        if conversation_key:  # the chat this run is a turn of (its runs share it; the OTel export's gen_ai.conversation.id)
            meta["conversation_id"] = conversation_key
        notes = getattr(self.tools, "trace_notes", None)  # dialect types read as JSON Schema, tools without a mock
        if callable(notes):
            meta.update(notes())
        meta.update(metadata or {})
        b = run.trace
        b.response_ids, b.response_mask = b.response_ids[:n], b.response_mask[:n]
        return b.build(termination_reason=run.termination, tools=self.tool_schemas, config=self.config.to_dict(),
                       tokenizer=self.bundle.info(), metadata=meta, id=trace_id)

    # ---- states -----------------------------------------------------------------------------
    async def _pending(self, run: _Run, on_event: EventCallback | None) -> StepState:
        t0 = time.time()
        step = run.trace.step(S.PENDING, started_at=t0, messages_added=list(range(len(run.messages))))
        try:
            r = await self._off_loop(
                render, self.bundle, run.messages, self.tool_schemas,
                add_generation_prompt=True, chat_template_kwargs=self.config.apply_chat_template_kwargs,
            )
            if self._system_prefix is None:
                self._system_prefix = await self._off_loop(empty_render_prefix, self.bundle, self.config.apply_chat_template_kwargs)
        except RenderError as e:
            step.error = str(e)
            return self._end_step(run, step, t0, on_event, S.TERMINATED, R.RENDER_ERROR)
        run.trace.set_prompt(r.token_ids)
        for span in r.message_spans:
            run.trace.add_span(span)
        step.end = run.total
        step.text = r.text
        step.info.spans_exact = r.spans_exact
        return self._end_step(run, step, t0, on_event, S.GENERATING)

    async def _generating(self, run: _Run, on_event: EventCallback | None, cancel: asyncio.Event | None) -> StepState:
        t0 = time.time()
        budget = self.config.response_length - len(run.trace.response_mask)
        params = self.config.sampling_params
        params = params.replace(max_tokens=max(1, min(params.max_tokens, budget)))
        constraint = self._constraint_for_turn(run)
        step = run.trace.step(
            S.GENERATING, mask=1, started_at=t0,
            constraint=(
                {**constraint.to_dict(), "tool_choice": choice_for_turn(self.config.tool_choice_policy, run.assistant_turns)}
                if constraint is not None and constraint.kind != "none" else None
            ),
        )
        streamed: list[int] = []

        def on_tokens(delta: list[int]) -> None:
            streamed.extend(delta)
            self._emit(on_event, LoopEvent("tokens", step=step, token_ids=list(delta)))

        gen: Generation | None = None
        error: str | None = None
        cancelled = False
        task = asyncio.ensure_future(
            self.generator.generate(run.trace.prompt_ids + run.trace.response_ids, params, on_tokens=on_tokens, constraint=constraint)
        )
        waiter: asyncio.Future | None = None
        try:
            if cancel is None:
                gen = await task
            else:
                waiter = asyncio.ensure_future(cancel.wait())
                done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    waiter.cancel()
                    gen = task.result()
                else:
                    cancelled = True
                    task.cancel()
                    try:
                        await task
                    except (asyncio.CancelledError, Exception):
                        pass
        except asyncio.CancelledError:
            # The run itself was cancelled (its task: the page went away, Ctrl-C). Let the
            # generation finish its clean-up first (the backend aborts its request): leaving at
            # once let a vLLM request outlive the run, generating on for nobody, for good if the
            # event loop closed meanwhile. Bounded, so a stuck backend cannot hold the cancellation.
            task.cancel()
            if waiter is not None:
                waiter.cancel()
            try:
                await asyncio.wait({task}, timeout=CANCEL_CLEANUP_S)
            except asyncio.CancelledError:
                pass  # cancelled again: stop waiting
            raise
        except GenerationError as e:
            error = str(e)
        except Exception as e:  # a backend bug must still end the run with a trace
            error = f"{type(e).__name__}: {e}"

        if gen is None:
            # keep what was streamed before the abort/failure: those tokens were generated
            gen = Generation(token_ids=streamed, finish_reason="abort")
        ids = list(gen.token_ids)
        run.assistant_turns += 1
        run.trace.add_generated(step, ids)
        step.finish_reason = gen.finish_reason
        step.logprobs = gen.logprobs
        if gen.logprobs is not None:
            step.info.logprob_semantics = LogprobSemantics(
                # a vLLM server's --logprobs-mode is not visible over HTTP: the loop config says it
                backend=self.generator.name,
                mode=self.config.vllm_logprobs_mode if self.generator.name == "vllm-server" else self.generator.logprob_kind(),
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                constrained=self.generator.logprobs_constrained(bool(gen.info.get("constraint"))),
            )
        step.info.update(gen.info)
        step.info.max_tokens = params.max_tokens
        step.error = error
        step.text = self._decode(ids)

        # parse for display and for the assistant message, whatever happens next; the parser
        # sees the text without the final EOS
        text = text_before_stop(self.bundle, ids, step.text, self._stop_ids)
        parsed = self.parser.parse(text)
        calls = [
            c if c.id else c.model_copy(update={"id": f"call_{run.assistant_turns}_{i}"})
            for i, c in enumerate(parsed.tool_calls)
        ]
        step.tool_calls = calls
        step.parse_errors = list(parsed.errors)
        if getattr(parsed, "channels", None):  # Harmony: analysis / commentary / final, shown per step
            step.info.channels = parsed.channels
        if cancelled:
            # Stop (or the time limit) cut the turn: a call still being written at the end is not
            # the model's mistake. Kept on the step as cut text, not as a parse error.
            # (a warning is a repaired call the parser kept: not cut, it stays a warning)
            cut = [e for e in parsed.errors
                   if getattr(e, "severity", "error") == "error" and (e.span is None or e.span[1] >= len(text.rstrip()))]
            if cut:
                step.parse_errors = [e for e in parsed.errors if e not in cut]
                step.info.cut_tool_call = [e.model_dump(mode="json") for e in cut]
        if ids or not (cancelled or error):
            msg = assistant_message(parsed, calls=[c.to_message_call() for c in calls])
            step.messages_added = run.trace.add_messages([msg], step.start, step.end)

        # termination, in verl's order
        if cancelled:
            end = run.stop_reason or R.CANCELLED
        elif error is not None:
            end = R.GENERATION_ERROR
        elif len(run.trace.response_mask) >= self.config.response_length:
            end = R.RESPONSE_LENGTH
        elif self.config.max_assistant_turns and run.assistant_turns >= self.config.max_assistant_turns:
            end = R.MAX_ASSISTANT_TURNS
        elif self.config.max_user_turns and run.user_turns >= self.config.max_user_turns:
            end = R.MAX_USER_TURNS
        elif calls:
            run.pending_calls = calls
            return self._end_step(run, step, t0, on_event, S.PROCESSING_TOOLS)
        elif parsed.errors:
            end = R.MALFORMED_TOOL_CALL
        else:
            end = R.NO_TOOL_CALLS
        return self._end_step(run, step, t0, on_event, S.TERMINATED, end)

    def _constraint_for_turn(self, run: _Run) -> Constraint | None:
        return self._constraints.get(choice_for_turn(self.config.tool_choice_policy, run.assistant_turns))

    async def _processing_tools(self, run: _Run, on_event: EventCallback | None) -> StepState:
        t0 = time.time()
        calls = run.pending_calls[: self.config.max_parallel_calls]
        dropped = len(run.pending_calls) - len(calls)
        run.pending_calls = []
        step = run.trace.step(S.PROCESSING_TOOLS, mask=0, started_at=t0)
        if dropped:
            step.info.dropped_calls = dropped
        results = await asyncio.gather(*(self._call_tool(c) for c in calls))
        step.tool_results = list(results)
        new_messages = []
        for call, res in zip(calls, results):
            m: dict[str, Any] = {"role": "tool", "content": res.content, "name": call.name}
            if call.id:
                m["tool_call_id"] = call.id
            new_messages.append(m)

        if self.config.on_tool_error == "terminate" and any(not r.ok for r in results):
            step.info.not_appended = "a tool failed and on_tool_error is 'terminate'"
            return self._end_step(run, step, t0, on_event, S.TERMINATED, R.TOOL_ERROR)

        relabel = 0
        if self.config.tool_turns == "continuous":
            text, ids, info, relabel = await self._continuous_turn(run, new_messages)
        else:
            info = None
        if info is None or info.continuous_error:
            try:
                text, ids, legacy = await self._legacy_turn(run, new_messages)
            except RenderError as e:
                step.error = str(e) if info is None else f"{info.continuous_error}; legacy: {e}"
                return self._end_step(run, step, t0, on_event, S.TERMINATED, R.RENDER_ERROR)
            if info is not None:
                legacy.continuous_error = info.continuous_error
            if info is not None and self._rule is not None:  # continuous, its render failed: legacy ids + the junction edit
                edit = self._rule.edit((run.trace.response_ids or run.trace.prompt_ids)[-8:], ids, run.messages, new_messages)
                if edit:
                    legacy.rule, relabel = self._rule.name, edit.relabel
                    legacy.boundary = edit.boundary(run.trace.total)
                    ids = list(edit.inserted) + ids[edit.relabel:]
                    text = self._decode(ids)
            info = legacy
        step.info.update(info)
        step.text = text
        if len(run.trace.response_mask) + len(ids) >= self.config.response_length:
            # verl drops the tool turn that would overflow the budget and stops
            step.info.not_appended = f"{len(ids)} tool-turn tokens would exceed response_length"
            step.info.would_append_tokens = len(ids)
            return self._end_step(run, step, t0, on_event, S.TERMINATED, R.RESPONSE_LENGTH)
        # the stop token the model wrote may open the next message (GLM: relabel); the tool
        # messages of one turn share its tokens (one rendered block)
        run.trace.add_context(step, ids, relabel=relabel, messages=new_messages)
        run.user_turns += 1
        return self._end_step(run, step, t0, on_event, S.GENERATING)

    async def _continuous_turn(self, run: _Run, new_messages: list[dict[str, Any]]) -> tuple[str, list[int], StepInfo, int]:
        """verl >= 0.9's continuous tokens: the new messages' ids from the family's synthetic
        context, with the family's junction edit (backend.families). Cost: the new messages, not
        the conversation. On a render failure: ``info.continuous_error`` (the caller falls back to
        the legacy method)."""
        info = StepInfo.empty()
        tail = (run.trace.response_ids or run.trace.prompt_ids)[-8:]  # the junction edit reads the last tokens only
        try:
            if self._rule is None:
                self._rule = await self._off_loop(rule_for, self.bundle, _size_hint=None)
            turn = await self._off_loop(
                self._rule.turn, tail, run.messages, new_messages, self.tool_schemas or None,
                self.config.apply_chat_template_kwargs, _size_hint=sum(len(m["content"]) for m in new_messages),
            )
        except RenderError as e:
            info.continuous_error = str(e)
            return "", [], info, 0
        info.update(turn.info(run.trace.total))
        return turn.text, turn.ids, info, turn.edit.relabel

    async def _legacy_turn(self, run: _Run, new_messages: list[dict[str, Any]]) -> tuple[str, list[int], StepInfo]:
        """verl < 0.9: the tool turn as the conversation's suffix, or verl's render-alone method
        where it agrees (backend.tokens.rendering.render_tool_turn); no junction edit."""
        text, ids, info = await self._off_loop(
            render_tool_turn, self.bundle, new_messages,
            history=run.messages, tools=self.tool_schemas,
            chat_template_kwargs=self.config.apply_chat_template_kwargs, system_prefix=self._system_prefix,
            trust_verl=self._verl_agrees,
            _size_hint=sum(len(m["content"]) for m in new_messages) + (0 if self._verl_agrees else run.trace.total * 4),
        )
        if info.method == "verl":
            # verl's method agreed with the conversation's suffix: later turns use it alone, so a
            # turn's cost does not grow with the conversation
            self._verl_agrees = True
        return text, ids, info

    async def _call_tool(self, call: ToolCall) -> ToolResult:
        if self.tools is None:
            return ToolResult(
                call_id=call.id, name=call.name, ok=False, error="unknown_tool",
                content=f"Error: unknown tool '{call.name}'. No tools are available.",
            )
        return await self.tools.execute(
            call,
            timeout_s=self.config.tool_timeout_s,
            max_response_length=self.config.max_tool_response_length,
            truncate_side=self.config.tool_response_truncate_side,
        )
