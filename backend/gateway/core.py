"""Sessions of captured turns: which sampled turn a request extends, where and why it forks, and the
capture files.

A request reaches :meth:`Gateway.turn` as a :class:`TurnRequest` (a dialect adapter made it: chat
messages in Hugging Face format, tools, sampling). Within its session it either

* **extends** a branch: every message of the branch comes back (the model's own turns in whatever
  form the harness echoes them: ``content: null``, arguments as JSON strings, call ids) with the
  same tools and model, followed by new messages that are not assistant turns. The new messages
  are appended exactly as the agent loop appends a tool turn: the family's continuous-token rule
  (:func:`backend.families.rule_for`: the new messages' ids from a synthetic context, the junction
  edit), mask 0; no earlier id is re-tokenized; or
* **starts a branch**: rendered in full with the generation prompt (every id context). Its parent
  is the branch it shares the most messages with, ``fork_at`` the first token where the two
  sequences differ, and ``cause`` why (:data:`FORK_CAUSES`). A request that shares nothing with
  the session, or carries no tools where the session's branches do (a title generator, a
  summariser), starts a root.

Then the model generates on that branch (mask 1, the rollout logprobs kept), the turn is parsed
with the family's parser, the session's capture file is rewritten and only then does the client
get its answer. A request whose body was seen before in the session (an SDK's retry) gets the
answer it got then, and no second turn.

**Reasoning the harness drops.** Most OpenAI-style clients send the model's turns back without
``reasoning_content``. Where the template would not render that reasoning at that place anyway
(a reasoning block before the last user message, in Qwen's templates), the turn still matches;
where it would, the model was shown something the harness no longer sends: a fork, cause
``reasoning_dropped``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.engine import text_before_stop, tokenizer_work
from backend.errors import UserError
from backend.families import rule_for
from backend.generators.base import Generation, GenerationError, Generator, SamplingParams, conversation
from backend.parsers import get_parser
from backend.tokens.rendering import RenderError, decode, render, render_text
from backend.tool_choice import ToolChoiceError, build_constraint, normalize_policy
from backend.trace import Step, Trace, new_trace_id
from backend.trace.builder import TraceBuilder
from backend.trace.io import write_lines
from backend.trace.messages import assistant_message, decode_arguments
from backend.trace.model import StepInfo, StepState, TerminationReason

log = logging.getLogger(__name__)

# why a branch starts where it does (metadata.branch.cause), in words for people
FORK_CAUSES = {
    "history_rewritten": "the harness rewrote its history (turns removed or replaced, a summary instead of the turns)",
    "reasoning_dropped": "the harness sent a turn back without reasoning that the template renders there",
    "arguments_reserialized": "the harness sent a turn back with other tool-call arguments than the model wrote",
    "system_prompt_changed": "the system prompt changed",
    "tools_changed": "the tool list changed",
    "model_changed": "the request names another model",
    "message_edited": "a message came back edited (the model's own turn, or one the harness had sent)",
    "resampled": "the harness asked again from a point the branch had already gone past",
    "not_continuable": "the new messages could not be appended with the family's rule (the template refused); "
                       "rendered in full",
}
# a session's capture file smaller than this (characters) is written on the event loop, a larger one in a thread
INLINE_WRITE_CHARS = 1 << 20
SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class GatewayError(UserError):
    """A request the gateway refuses: ``status`` (HTTP), ``kind`` (the error's type in the
    dialect's shape: invalid_request_error, authentication_error, not_found_error, ...)."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        v = int(raw)
    except ValueError:
        raise UserError(f"{name} must be a whole number, not {raw!r}") from None
    if v <= 0:
        raise UserError(f"{name} must be positive, not {v}")
    return v


@dataclass(frozen=True)
class GatewayLimits:
    """What one request or session may hold (docs/limits.md; each has an ``ALI_GATEWAY_*`` variable)."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_messages: int = 4096
    max_tools: int = 512
    max_sessions: int = 1024  # sessions held in memory (the least recently used idle one is let go)
    max_branches: int = 256  # branches of one session
    max_answers: int = 256  # answers kept per session for retries
    max_session_tokens: int = 4_000_000  # token ids of all of a session's branches together

    @classmethod
    def from_env(cls) -> GatewayLimits:
        return cls(
            max_body_bytes=_env_int("ALI_GATEWAY_MAX_BODY_BYTES", cls.max_body_bytes),
            max_messages=_env_int("ALI_GATEWAY_MAX_MESSAGES", cls.max_messages),
            max_tools=_env_int("ALI_GATEWAY_MAX_TOOLS", cls.max_tools),
            max_sessions=_env_int("ALI_GATEWAY_MAX_SESSIONS", cls.max_sessions),
            max_branches=_env_int("ALI_GATEWAY_MAX_BRANCHES", cls.max_branches),
            max_answers=_env_int("ALI_GATEWAY_MAX_ANSWERS", cls.max_answers),
            max_session_tokens=_env_int("ALI_GATEWAY_MAX_SESSION_TOKENS", cls.max_session_tokens),
        )


@dataclass
class TurnRequest:
    """One request, in chat terms: what every dialect adapter produces."""

    dialect: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: Any = None  # "auto" | "required" | "none" | a tool name | None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, seed, stop
    digest: str = ""  # of the request body: the same body is a retry
    ignored: dict[str, Any] = field(default_factory=dict)  # fields sent that the gateway does not apply


@dataclass
class TurnResult:
    """One answered turn, in chat terms: what every dialect adapter formats."""

    id: str
    session: str
    branch: str
    model: str
    created: int
    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]  # {"id", "name", "arguments" (object or raw string)}
    finish_reason: str  # stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    prompt_len: int  # the prompt is the branch's first prompt_len ids (kept there, not copied per answer)
    logprobs: list[float] | None
    tokens: list[str]  # each generated id's text (for logprobs)
    parse_errors: list[str]
    replayed: bool = False  # a retry answered from the session's record
    stop_sequence: str | None = None  # the stop string the turn ended on, where the backend says which
    branch_ids: Callable[[], list[int]] | None = None

    @property
    def prompt_ids(self) -> list[int]:
        """The ids the model was given for this turn (the branch is append-only: read from it)."""
        return self.branch_ids()[: self.prompt_len] if self.branch_ids is not None else []


def message_text(content: Any, where: str) -> str:
    """A message's content as text: a string; None as ""; a list of text parts joined with
    newlines (as vLLM's server joins them for a text template). Any other part is refused: this
    gateway renders text only, and a part left out would be lost silently."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
                continue
            raise GatewayError(f"{where}: content part {j} is {kind or type(part).__name__!r}; this gateway renders "
                               "text only (text parts)", param="messages")
        return "\n".join(texts)
    raise GatewayError(f"{where}: content must be a string or a list of text parts", param="messages")


def read_sampling(body: dict[str, Any], fields: dict[str, tuple[tuple[type, ...], float, float]]) -> dict[str, Any]:
    """The sampling fields of a request body that are set, each checked for its JSON type and its
    range (``fields``: name -> (types, low, high), the dialect's own), so a bad one is a 400 and not
    a failed turn. Booleans are refused for numbers."""
    out: dict[str, Any] = {}
    for k, (types, low, high) in fields.items():
        v = body.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, types):
            raise GatewayError(f"{k} must be a {'whole ' if types == (int,) else ''}number", param=k)
        if not low <= v <= high:
            raise GatewayError(f"{k} must be between {low} and {high}", param=k)
        out[k] = v
    return out


def _args_value(args: Any) -> Any:
    """Tool-call arguments as a value to compare (a JSON string decoded; a raw string kept)."""
    value, problem = decode_arguments(args)
    return args if problem else value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity (Python reads them; JSON has no such numbers,
    and a NaN would pass every range check)."""
    return json.loads(text, parse_constant=_no_constant)


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


@dataclass
class SampledTurn:
    """A turn the model generated on a branch: the message as the branch holds it."""

    message: dict[str, Any]
    reasoning: str | None
    echo: dict[str, Any] | None = None  # the harness's copy of this turn, as it last matched (compared first)


def assistant_departure(sent: dict[str, Any], ours: SampledTurn) -> str | None:
    """None when ``sent`` is the harness's copy of our turn ``ours``; else why it is not:
    a cause of :data:`FORK_CAUSES`, or ``"reasoning_missing"`` (the caller asks the template)."""
    if sent.get("role") != "assistant":
        return "history_rewritten"
    sent_calls = sent.get("tool_calls") or []
    our_calls = ours.message.get("tool_calls") or []
    names = [(c.get("function") or {}).get("name") for c in sent_calls]
    if names != [c["function"]["name"] for c in our_calls]:
        return "message_edited"
    if (sent.get("content") or "").strip() != (ours.message.get("content") or "").strip():
        return "message_edited"
    for a, b in zip(sent_calls, our_calls):
        x, y = _args_value(a["function"].get("arguments")), _args_value(b["function"]["arguments"])
        if x != y and _canonical(x) != _canonical(y):  # equal values first (the common case), then by their JSON
            return "arguments_reserialized"
    sent_reasoning = sent.get("reasoning_content")
    if sent_reasoning is not None and sent_reasoning.strip() != (ours.reasoning or "").strip():
        return "message_edited"
    if sent_reasoning is None and (ours.reasoning or "").strip():
        return "reasoning_missing"
    return None


@dataclass
class _LineParts:
    """A branch's capture line in parts, each serialised once: appending a turn costs the turn, not
    the conversation (only the final join and the write are proportional to its length)."""

    prompt: str | None = None
    ids: list[str] = field(default_factory=list)
    mask: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)
    ids_done: int = 0
    mask_done: int = 0
    line: str | None = None  # the whole line, as of ``version`` (steps, messages, ids, last update)
    version: tuple[Any, ...] = ()


@dataclass
class Branch:
    """One path of a session, root to leaf: an ordinary trace under construction."""

    id: str
    trace_id: str
    tools: list[dict[str, Any]]
    model: str
    builder: TraceBuilder
    parent: str | None = None
    fork_at: int | None = None
    cause: str | None = None
    cause_detail: str | None = None
    sampled: dict[int, SampledTurn] = field(default_factory=dict)  # message index -> the model's turn
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    last_finish: str | None = None
    last_calls: int = 0
    last_parse_errors: int = 0
    dialects: list[str] = field(default_factory=list)
    frags: _LineParts = field(default_factory=lambda: _LineParts())  # the capture line, built turn by turn
    relabeled: bool = False  # a junction edit changed mask bits already written (GLM): the mask is written anew
    # (message index, last user message index) -> whether the template renders that turn's reasoning
    reasoning_rendered: dict[tuple[int, int], bool] = field(default_factory=dict)
    # the harness's copies of this branch's first messages, as a request last matched them (the
    # branch is append-only, so they match again when they come back the same), and which of them
    # are the model's turns sent without their reasoning: the next request is compared from there
    echoed: list[dict[str, Any]] = field(default_factory=list)
    echoed_missing: list[int] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.builder.messages

    @property
    def ids(self) -> list[int]:
        return self.builder.prompt_ids + self.builder.response_ids

    def tail(self, k: int) -> list[int]:
        """The last ``k`` ids (without copying the whole sequence)."""
        bd = self.builder
        if len(bd.response_ids) >= k:
            return bd.response_ids[-k:]
        return (bd.prompt_ids + bd.response_ids)[-k:]


@dataclass
class Session:
    name: str
    generator: Generator
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    branches: list[Branch] = field(default_factory=list)
    answers: OrderedDict[str, TurnResult] = field(default_factory=OrderedDict)
    used: float = field(default_factory=time.time)
    turns: int = 0
    unwritten: bool = False  # the last capture write failed: the next answer (a retry's too) writes again

    def branch(self, bid: str) -> Branch:
        return next(b for b in self.branches if b.id == bid)


@dataclass
class _Match:
    branch: Branch | None
    extends: bool
    common: int  # messages shared from the start
    cause: str | None = None
    detail: str | None = None

    @property
    def rank(self) -> tuple[int, int, int]:
        """More shared messages first; at equal counts, one with the same tools, then one that
        shares its system prompt too."""
        return self.common, 0 if self.cause == "tools_changed" else 1, 0 if self.cause == "system_prompt_changed" else 1


def _last_user(messages: list[dict[str, Any]]) -> int:
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)


class Gateway:
    """The capture core, shared by every dialect: sessions, their branches, their files.

    ``generator_for``: the generator of a new session (a scripted generator per session, so that
    each session replays its script from the start; one shared model otherwise). ``capture_dir``:
    where each session's file goes (None: nothing written). ``max_tokens``: the most tokens one
    turn may generate (a request's ``max_tokens`` is clamped to it; its default when absent)."""

    def __init__(self, bundle: Any, generator_for: Callable[[str], Generator], *, capture_dir: str | None = None,
                 max_tokens: int = 4096, chat_template_kwargs: dict[str, Any] | None = None, parser: str | None = None,
                 served_model: str = "agent-loop-inspector", limits: GatewayLimits | None = None,
                 policy_version: str | None = None, max_parallel_calls: int | None = None,
                 default_sampling: dict[str, Any] | None = None, owns_generators: bool = True):
        self.bundle = bundle
        self.generator_for = generator_for
        self.capture_dir = capture_dir
        self.max_tokens = max_tokens
        self.kwargs = dict(chat_template_kwargs or {})
        self.parser = get_parser(parser or bundle.parser, tokenizer=bundle.tokenizer)
        self.served_model = served_model
        self.limits = limits or GatewayLimits.from_env()
        self.policy_version = policy_version
        self.max_parallel_calls = max_parallel_calls
        # the operator's sampling defaults (LoopConfig.sampling); a request's own values win
        self.default_sampling = {k: v for k, v in (default_sampling or {}).items() if k not in ("max_tokens", "logprobs")}
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.owns_generators = owns_generators  # False: the caller closes them (the app's own backend)
        self._stop_ids = set(bundle.stop_token_ids)
        self._tokenizer_info = bundle.info()
        self._constraints: dict[str, Any] = {}
        if capture_dir:
            os.makedirs(capture_dir, exist_ok=True)

    # ---- sessions ---------------------------------------------------------------------------
    def session(self, name: str) -> Session:
        s = self.sessions.get(name)
        if s is not None:
            self.sessions.move_to_end(name)
            return s
        if len(self.sessions) >= self.limits.max_sessions:
            idle = next((k for k, v in self.sessions.items() if not v.lock.locked()), None)
            if idle is None:
                raise GatewayError(f"all {self.limits.max_sessions} sessions are busy; retry shortly", 429, "rate_limit_error")
            del self.sessions[idle]  # its capture file stays; a later request starts a new root there
        s = Session(name, self.generator_for(name))
        self.sessions[name] = s
        return s

    async def close(self) -> None:
        if not self.owns_generators:
            return
        seen: set[int] = set()
        for s in self.sessions.values():
            if id(s.generator) not in seen:
                seen.add(id(s.generator))
                await s.generator.close()

    # ---- one turn ---------------------------------------------------------------------------
    async def turn(self, session_name: str, req: TurnRequest) -> TurnResult:
        self.check(req)
        s = self.session(session_name)
        async with s.lock:
            s.used = time.time()
            if req.digest and req.digest in s.answers:
                old = s.answers[req.digest]
                s.answers.move_to_end(req.digest)
                if s.unwritten:
                    await self._write(s)
                return dataclasses.replace(old, replayed=True)
            held = sum(b.builder.total for b in s.branches)
            if held >= self.limits.max_session_tokens:
                raise GatewayError(f"session {s.name!r} holds {held:,} tokens, this gateway's limit of "
                                   f"{self.limits.max_session_tokens:,}: start a new session", 413)
            branch = await self._place(s, req)
            result = await self._generate(s, branch, req)
            s.turns += 1
            if req.digest:
                s.answers[req.digest] = result
                while len(s.answers) > self.limits.max_answers:
                    s.answers.popitem(last=False)
            await self._write(s)
            return result

    def check(self, req: TurnRequest) -> None:
        if not req.messages:
            raise GatewayError("the request has no messages", param="messages")
        if len(req.messages) > self.limits.max_messages:
            raise GatewayError(f"{len(req.messages)} messages is over this gateway's limit of {self.limits.max_messages}",
                               413, param="messages")
        if len(req.tools) > self.limits.max_tools:
            raise GatewayError(f"{len(req.tools)} tools is over this gateway's limit of {self.limits.max_tools}", 413,
                               param="tools")
        if req.max_tokens is not None and (isinstance(req.max_tokens, bool) or not isinstance(req.max_tokens, int)
                                           or req.max_tokens < 1):
            raise GatewayError("max_tokens must be a positive whole number", param="max_tokens")

    async def count_tokens(self, req: TurnRequest) -> int:
        """How many ids ``req``'s messages and tools render to with the generation prompt (the
        prompt a new branch would get; Anthropic's ``count_tokens``). No session, no capture."""
        self.check(req)
        size = sum(len(str(m.get("content") or "")) for m in req.messages)
        try:
            r = await self._work(render, self.bundle, copy.deepcopy(req.messages), req.tools or None,
                                 add_generation_prompt=True, chat_template_kwargs=self.kwargs, size=size)
        except RenderError as e:
            raise GatewayError(f"the model's chat template refused these messages: {e}") from None
        return len(r.token_ids)

    async def _work(self, fn: Callable[..., Any], *args: Any, size: int = 0, **kwargs: Any) -> Any:
        """:func:`backend.engine.tokenizer_work` on this gateway's tokenizer (``size``: the
        characters the work reads; a huge request's work runs in a thread)."""
        return await tokenizer_work(self.bundle, fn, *args, size_hint=size, **kwargs)

    # ---- where a request goes ---------------------------------------------------------------
    async def _place(self, s: Session, req: TurnRequest) -> Branch:
        candidates: list[_Match] = []
        for b in s.branches:
            if bool(b.tools) != bool(req.tools):
                continue  # a call without tools (a title, a summary) is its own root, and vice versa
            m = await self._compare(b, req)
            if m.extends:
                new = req.messages[len(b.messages):]
                if not new:
                    return b
                try:
                    await self._append_context(b, new)
                    return b
                except RenderError as e:
                    m = _Match(b, False, len(b.messages), "not_continuable", str(e))
            candidates.append(m)
        if len(s.branches) >= self.limits.max_branches:
            raise GatewayError(f"session {s.name!r} has {len(s.branches)} branches, this gateway's limit; start a new "
                               "session", 400)
        # a request that shares no more than a system prompt with the session is a new task (or a
        # compaction that kept nothing of the conversation: the messages cannot tell): a new root
        first_user = _first_user(req.messages)
        candidates = [m for m in candidates if m.common > first_user or m.cause == "system_prompt_changed"]
        return await self._new_branch(s, req, candidates)

    async def _compare(self, b: Branch, req: TurnRequest) -> _Match:
        msgs, ours = req.messages, b.messages
        n = len(ours)
        p, cause = 0, None
        missing: list[int] = []
        k = len(b.echoed)
        if k and k <= len(msgs) and msgs[:k] == b.echoed:  # the history as the last request sent it: one comparison
            p, missing = k, list(b.echoed_missing)
        for i in range(p, min(n, len(msgs))):
            sent = msgs[i]
            if i in b.sampled:
                st = b.sampled[i]
                if st.echo is not None and sent == st.echo:  # the harness sends its copy the same way each turn
                    c = None
                else:
                    c = assistant_departure(sent, st)
                    if c is None:
                        st.echo = sent
                if c == "reasoning_missing":
                    missing.append(i)
                    c = None
            else:
                c = None if sent == ours[i] else ("history_rewritten" if sent.get("role") != ours[i].get("role")
                                                  else "message_edited")
            if c is not None:
                cause = c
                break
            p = i + 1
        if p > k:
            b.echoed, b.echoed_missing = msgs[:p], [i for i in missing if i < p]
        for i in missing:
            if i >= p:
                break
            if await self._renders_reasoning(b, msgs, i):
                p, cause = i, "reasoning_dropped"
                break
        if p == 0 and cause == "message_edited" and msgs[0].get("role") == "system":
            # the system prompt swapped under the same conversation (CLI agents do it): a fork
            rest = await self._compare(b, TurnRequest(req.dialect, req.model, [ours[0], *msgs[1:]], req.tools))
            if rest.common > _first_user(msgs):
                return _Match(b, False, rest.common, "system_prompt_changed")
            return _Match(b, False, 0, "message_edited")
        if req.tools != b.tools or _tools_json(req.tools) != _tools_json(b.tools):  # key order renders too
            return _Match(b, False, p, "tools_changed")
        if req.model != b.model:
            return _Match(b, False, p, "model_changed")
        if p == n:
            new = msgs[n:]
            if not new and (n - 1) not in b.sampled:
                return _Match(b, True, p)  # the branch waits for a turn (its generation failed): this is it
            if not new:
                return _Match(b, False, p, "resampled", "the request ends with the model's own last turn")
            if any(m.get("role") == "assistant" for m in new):
                return _Match(b, False, p, "history_rewritten", "an assistant turn the model did not write on this branch")
            return _Match(b, True, p)
        if p == len(msgs):
            return _Match(b, False, p, "resampled")
        return _Match(b, False, p, cause)

    async def _renders_reasoning(self, b: Branch, msgs: list[dict[str, Any]], i: int) -> bool:
        """Whether the template renders the reasoning of the model's turn ``i`` in ``msgs`` (which
        came back without it): the request's messages rendered as sent and with it restored."""
        key = (i, _last_user(msgs))
        known = b.reasoning_rendered.get(key)
        if known is None:
            with_it = [*msgs[:i], {**msgs[i], "reasoning_content": b.sampled[i].reasoning}, *msgs[i + 1:]]
            size = sum(len(str(m.get("content") or "")) for m in msgs)
            try:
                a = await self._work(render_text, self.bundle, list(msgs), b.tools or None, chat_template_kwargs=self.kwargs, size=size)
                c = await self._work(render_text, self.bundle, with_it, b.tools or None, chat_template_kwargs=self.kwargs, size=size)
                known = a != c
            except RenderError:
                known = True
            b.reasoning_rendered[key] = known
        return known

    async def _append_context(self, b: Branch, new: list[dict[str, Any]]) -> None:
        """Append ``new`` (tool results, user messages) to ``b`` as the agent loop appends a tool
        turn: the family's continuous-token rule, mask 0."""
        rule = await self._work(rule_for, self.bundle)
        tail = b.tail(8)
        size = sum(len(str(m.get("content") or "")) for m in new)
        turn = await self._work(rule.turn, tail, b.messages, copy.deepcopy(new), b.tools or None, self.kwargs, size=size)
        t0 = time.time()
        step = b.builder.step(StepState.PROCESSING_TOOLS, mask=0, started_at=t0)
        step.info.update(turn.info(b.builder.total))
        b.builder.add_context(step, turn.ids, relabel=turn.edit.relabel, messages=copy.deepcopy(new))
        b.relabeled = b.relabeled or bool(turn.edit.relabel)
        step.text = turn.text
        step.info.update({"roles": [m.get("role") for m in new]})
        step.duration_s = time.time() - t0
        b.builder.add_step(step)

    async def _new_branch(self, s: Session, req: TurnRequest, candidates: list[_Match]) -> Branch:
        """A branch rendered in full from ``req``; its parent the candidate whose ids it shares the
        longest prefix with (then the one sharing more messages, then the oldest)."""
        t0 = time.time()
        size = sum(len(str(m.get("content") or "")) for m in req.messages)
        try:
            r = await self._work(render, self.bundle, copy.deepcopy(req.messages), req.tools or None,
                                 add_generation_prompt=True, chat_template_kwargs=self.kwargs, size=size)
        except RenderError as e:
            raise GatewayError(f"the model's chat template refused these messages: {e}") from None
        builder = TraceBuilder(copy.deepcopy(req.messages))
        builder.set_prompt(r.token_ids)
        for span in r.message_spans:
            builder.add_span(span)
        step = builder.step(StepState.PENDING, started_at=t0, messages_added=list(range(len(req.messages))))
        step.end = builder.total
        step.text = r.text
        step.info.spans_exact = r.spans_exact
        step.duration_s = time.time() - t0
        builder.add_step(step)
        b = Branch(id=f"b{len(s.branches)}", trace_id=new_trace_id(), tools=copy.deepcopy(req.tools), model=req.model,
                   builder=builder)
        best: tuple[Any, ...] | None = None
        for k, m in enumerate(candidates):
            ours = m.branch.ids
            fork_at = next((j for j, (x, y) in enumerate(zip(ours, r.token_ids)) if x != y), min(len(ours), len(r.token_ids)))
            key = (fork_at, m.rank, -k)
            if best is None or key > best[0]:
                best = (key, m, fork_at)
        if best is not None:
            _, m, b.fork_at = best
            b.parent, b.cause, b.cause_detail = m.branch.id, m.cause, m.detail
        s.branches.append(b)
        return b

    # ---- generation -------------------------------------------------------------------------
    def _constraint(self, req: TurnRequest) -> Any:
        choice = req.tool_choice
        if choice is None or choice == "auto" or not req.tools:
            if choice not in (None, "auto", "none"):
                raise GatewayError("tool_choice names a tool but the request has no tools", param="tool_choice")
            return None
        try:
            (name,) = normalize_policy(choice)
        except (ToolChoiceError, ValueError) as e:
            raise GatewayError(f"tool_choice: {e}", param="tool_choice") from None
        max_calls = 1 if req.parallel_tool_calls is False else self.max_parallel_calls
        key = hashlib.sha256(_canonical([name, req.tools, max_calls]).encode("utf-8", "surrogatepass")).hexdigest()
        if key not in self._constraints:
            try:
                self._constraints[key] = build_constraint(name, self.parser.name, req.tools, max_calls=max_calls)
            except ToolChoiceError as e:
                raise GatewayError(f"tool_choice: {e}", param="tool_choice") from None
            if len(self._constraints) > 256:
                self._constraints.pop(next(iter(self._constraints)))
        return self._constraints[key]

    async def _generate(self, s: Session, b: Branch, req: TurnRequest) -> TurnResult:
        prompt = b.ids
        cap = self.max_tokens
        engine_len = s.generator.context_length()
        if isinstance(engine_len, int) and engine_len > 0:
            cap = min(cap, engine_len - len(prompt))
            if cap <= 0:
                raise GatewayError(f"the conversation is {len(prompt)} tokens; the model's context is {engine_len}",
                                   param="messages", kind="context_length_exceeded")
        max_tokens = min(req.max_tokens, cap) if req.max_tokens else cap
        sampling = {**self.default_sampling, **{k: v for k, v in req.sampling.items() if v is not None}}
        try:
            params = SamplingParams.from_dict({**sampling, "max_tokens": max_tokens, "logprobs": 0})
        except (TypeError, ValueError) as e:
            raise GatewayError(f"sampling parameters: {e}") from None
        constraint = self._constraint(req)
        t0 = time.time()
        step = b.builder.step(StepState.GENERATING, mask=1, started_at=t0)
        try:
            with conversation(f"{s.name}/{b.id}"):
                gen: Generation = await s.generator.generate(prompt, params, constraint=constraint)
        except GenerationError as e:
            raise GatewayError(f"generation failed: {e}", 502, "api_error") from None
        ids = list(gen.token_ids)
        text = decode(self.bundle, ids)
        body = text_before_stop(self.bundle, ids, text, self._stop_ids)
        parsed = self.parser.parse(body)
        calls = [c.model_copy(update={"id": f"call_{uuid.uuid4().hex[:24]}"}) for c in parsed.tool_calls]
        msg = assistant_message(parsed, text=body, calls=[c.to_message_call() for c in calls])
        b.builder.add_generated(step, ids)
        step.text = text
        step.finish_reason = gen.finish_reason
        step.logprobs = gen.logprobs
        step.tool_calls = calls
        step.parse_errors = list(parsed.errors)
        step.info.update(gen.info)
        step.info.max_tokens = max_tokens
        step.info.update({"gateway": {
            "dialect": req.dialect, "model": req.model, "served_model": self.served_model,
            "sampling": {**sampling, "max_tokens": req.max_tokens}, "tool_choice": req.tool_choice,
            "version": self.policy_version, "dispatched_at": t0, "session_turn": s.turns,
            **({"ignored": req.ignored} if req.ignored else {}),
        }})
        step.messages_added = b.builder.add_messages([msg], step.start, step.end)
        step.duration_s = time.time() - t0
        b.builder.add_step(step)
        b.sampled[step.messages_added[0]] = SampledTurn(msg, parsed.reasoning)
        finish = "tool_calls" if calls else ("length" if gen.finish_reason == "length" else "stop")
        b.last_finish, b.last_calls = finish, len(calls)
        b.last_parse_errors = sum(1 for e in parsed.errors if e.severity == "error")
        b.updated = time.time()
        if req.dialect not in b.dialects:
            b.dialects.append(req.dialect)
        return TurnResult(
            id=uuid.uuid4().hex[:24], session=s.name, branch=b.id, model=req.model, created=int(t0),
            content=msg.get("content") or "", reasoning=parsed.reasoning,
            tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
            finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=len(ids), token_ids=ids,
            prompt_len=len(prompt), branch_ids=lambda: b.ids, logprobs=list(gen.logprobs) if gen.logprobs is not None else None,
            tokens=[decode(self.bundle, [t]) for t in ids] if gen.logprobs is not None else [],
            parse_errors=[e.message for e in parsed.errors if e.severity == "error"],
            stop_sequence=_stop_sequence(gen, text, params.stop) if finish == "stop" else None,
        )

    # ---- capture files ----------------------------------------------------------------------
    def trace(self, s: Session, b: Branch, *, steps: list[Step] | None = None, messages: list[dict[str, Any]] | None = None,
              ids: bool = True) -> Trace:
        """Branch ``b`` of session ``s`` as a trace (root to leaf), ended for now. ``steps``,
        ``messages``, ``ids=False``: that part left out (the capture line's head)."""
        if b.last_finish == "tool_calls":
            reason: Any = TerminationReason.HARNESS
        elif b.last_finish == "length":
            reason = TerminationReason.RESPONSE_LENGTH
        elif b.last_parse_errors:
            reason = TerminationReason.MALFORMED_TOOL_CALL
        else:
            reason = TerminationReason.NO_TOOL_CALLS
        bd = b.builder
        end = Step(index=len(bd.steps), state=StepState.TERMINATED, start=bd.total, end=bd.total,
                   info=StepInfo(reason=reason))
        metadata = {
            "source": "gateway",
            "session": s.name,
            "conversation_id": s.name,
            "branch": {"id": b.id, "parent": b.parent, "fork_at": b.fork_at, "cause": b.cause},
            "generator": s.generator.describe(),
            "parser": self.parser.name,
            "dialects": list(b.dialects),
            "model": b.model,
            "served_model": self.served_model,
            "started_at": b.started,
            "duration_s": b.updated - b.started,
            "assistant_turns": len(b.sampled),
        }
        if b.cause_detail:
            metadata["branch"]["detail"] = b.cause_detail
        return Trace(messages=bd.messages if messages is None else messages,
                     prompt_ids=bd.prompt_ids if ids else [], response_ids=bd.response_ids if ids else [],
                     response_mask=bd.response_mask if ids else [], steps=[*(bd.steps if steps is None else steps), end],
                     message_spans=bd.message_spans if ids else [],
                     termination_reason=reason, tools=b.tools, tokenizer=self._tokenizer_info,
                     config={"chat_template_kwargs": self.kwargs, "max_tokens": self.max_tokens},
                     metadata=metadata, id=b.trace_id)

    def capture_path(self, name: str) -> str | None:
        return os.path.join(self.capture_dir, f"{name}.jsonl") if self.capture_dir else None

    async def _write(self, s: Session) -> None:
        path = self.capture_path(s.name)
        if path is None:
            return
        lines = [self.capture_line(s, b) for b in s.branches]
        s.unwritten = True
        try:
            if sum(map(len, lines)) < INLINE_WRITE_CHARS:
                write_lines(lines, path)  # a few hundred KB: quicker than a thread hop, and steadier
            else:
                await asyncio.to_thread(write_lines, lines, path)
            s.unwritten = False
        except OSError as e:
            log.error("gateway: session %s: cannot write %s: %s", s.name, path, e)
            raise GatewayError(f"the turn was generated but its capture file could not be written ({e.strerror or e}); "
                               "a retry of this request gets the same answer and writes it again", 500, "api_error") from None

    def capture_line(self, s: Session, b: Branch) -> str:
        """:meth:`trace`'s JSON line, from parts serialised once each (the same trace: tested).
        Kept until the branch changes: a session's other branches cost nothing per turn."""
        f, bd = b.frags, b.builder
        version = (len(bd.steps), len(bd.messages), bd.total, b.updated)
        if f.line is not None and f.version == version:
            return f.line
        if f.prompt is None:
            f.prompt = "[" + ",".join(map(str, bd.prompt_ids)) + "]"
        if len(bd.response_ids) > f.ids_done:
            f.ids.append(",".join(map(str, bd.response_ids[f.ids_done:])))
            f.ids_done = len(bd.response_ids)
        if b.relabeled:
            f.mask, f.mask_done, b.relabeled = [], 0, False
        if len(bd.response_mask) > f.mask_done:
            f.mask.append(",".join(map(str, bd.response_mask[f.mask_done:])))
            f.mask_done = len(bd.response_mask)
        f.steps += [st.model_dump_json() for st in bd.steps[len(f.steps):]]
        f.messages += [_json(m) for m in bd.messages[len(f.messages):]]
        f.spans += [sp.model_dump_json() for sp in bd.message_spans[len(f.spans):]]
        head = self.trace(s, b, steps=[], messages=[], ids=False)
        end = head.steps[-1].model_dump_json()
        d = json.loads(head.to_json())
        # one join of the parts (a chain of + would copy the growing line once per piece)
        f.version = version
        f.line = "".join((
            '{"format_version":', str(d["format_version"]), ',"id":', _json(d["id"]),
            ',"messages":[', ",".join(f.messages), '],"tools":', _json(d["tools"]),
            ',"prompt_ids":', f.prompt, ',"response_ids":[', ",".join(f.ids), '],"response_mask":[', ",".join(f.mask),
            '],"steps":[', ",".join(f.steps), "," if f.steps else "", end, '],"message_spans":[', ",".join(f.spans),
            '],"termination_reason":', _json(d["termination_reason"]), ',"config":', _json(d["config"]),
            ',"tokenizer":', _json(d["tokenizer"]), ',"metadata":', _json(d["metadata"]), "}"))
        return f.line


def _stop_sequence(gen: Generation, text: str, stops: Any) -> str | None:
    """The stop string a turn ended on: vLLM names it (``stop_reason``); transformers keeps it at
    the text's end. None when the turn ended on a stop token."""
    named = gen.info.get("stop_reason")
    if isinstance(named, str) and named in (stops or ()):
        return named
    return next((s for s in stops or () if text.endswith(s)), None)


def _tools_json(tools: list[dict[str, Any]]) -> str:
    return json.dumps(tools, ensure_ascii=False)


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _first_user(messages: list[dict[str, Any]]) -> int:
    """How many messages come before the first user message (the system prompts)."""
    return next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def session_name(route_name: str | None, api_key: str | None, header_name: str | None = None) -> str:
    """The session a request belongs to: the route's ``/s/NAME``, else a client's session header
    (opencode's ``x-session-id``), else the API key's digest (never the key), else ``default``."""
    for name in (route_name, header_name):
        if name is not None:
            if not SESSION_NAME.fullmatch(name):
                raise GatewayError("a session name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                                   param="session")
            return name
    if api_key:
        return "key-" + hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return "default"
