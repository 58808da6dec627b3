"""The one trace type: the pydantic models and the checks a record passes to become one.

Everything the app shows is a :class:`Trace`: a live run from :mod:`backend.engine`, a file
loaded from disk, or an import from another tool. Traces are pydantic models because they are
read from untrusted files: validation happens once, at the boundary, and a bad record gets a
message a person can act on.

A trace file is JSONL, one trace per line (``read_jsonl`` / ``write_jsonl``). A single JSON
object or a JSON list of traces is accepted on read as well.
"""

from __future__ import annotations

import codecs
import json
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from backend.errors import UserError
from backend.trace.messages import json_type

FORMAT_VERSION = 1

# Largest token id we accept from a file. Real vocabularies are < 2**20; anything above 2**31
# cannot be a token id of any tokenizer and would overflow int32 tensors downstream.
MAX_TOKEN_ID = 2**31 - 1



# ---- the string codes a trace carries (values are what files hold; never rename one) ------------


class StepState(StrEnum):
    """The state a step records (the loop's state machine)."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


class TerminationReason(StrEnum):
    """Why a run ended (``Trace.termination_reason``; verl's codes where verl has one). Each
    member carries its words for people and its outcome: ``"ok"`` (a normal end), ``"limit"``
    (stopped on a limit or on request) or ``"failure"``. A file may carry a reason not listed
    here: it loads and is kept as a plain string."""

    def __new__(cls, value: str, words: str = "", outcome: str = "failure") -> TerminationReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.words = words
        member.outcome = outcome
        return member

    words: str
    outcome: str

    # the engine's
    NO_TOOL_CALLS = "no_tool_calls", "answered", "ok"
    CANCELLED = "cancelled", "stopped by user", "limit"
    TIME_LIMIT = "time_limit", "stopped at the server's time limit", "limit"  # run(time_limit_s=...) passed
    RESPONSE_LENGTH = "response_length", "hit response_length", "limit"
    MAX_ASSISTANT_TURNS = "max_assistant_turns", "hit max_assistant_turns", "limit"
    MAX_USER_TURNS = "max_user_turns", "hit max_user_turns", "limit"
    MALFORMED_TOOL_CALL = "malformed_tool_call", "malformed tool call"
    TOOL_ERROR = "tool_error", "tool error"
    GENERATION_ERROR = "generation_error", "generation error"
    RENDER_ERROR = "render_error", "template error"
    # backend.rollout: the run raised before it could end on its own
    ERROR = "error", "failed"
    # imported from chat-completions logs (finish_reason)
    CONTENT_FILTER = "content_filter", "stopped by the content filter"
    # backend.gateway: a captured branch whose last turn called tools; the harness runs them
    HARNESS = "harness", "handed its tool calls to the harness", "ok"


class FindingCode(StrEnum):
    """What :func:`backend.checks.diagnostics.check` can report (see that module for each one)."""

    ORPHAN_TOOL_MESSAGE = "orphan_tool_message"
    TOOL_CALL_WITHOUT_RESPONSE = "tool_call_without_response"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    MALFORMED_TOOL_CALL = "malformed_tool_call"
    TRUNCATED_TOOL_RESPONSE = "truncated_tool_response"
    HIT_RESPONSE_LENGTH = "hit_response_length"
    EMPTY_RESPONSE = "empty_response"
    RETOKENIZATION_DRIFT = "retokenization_drift"
    DROPPED_TURN_SEPARATOR = "dropped_turn_separator"
    MASK_MISMATCH = "mask_mismatch"
    MASK_STRUCTURE = "mask_structure"
    THINKING_STRIPPED = "thinking_stripped"
    STEP_ERROR = "step_error"
    TOOL_ERROR = "tool_error"
    CUT_TOOL_CALL = "cut_tool_call"
    REPAIRED_TOOL_CALL = "repaired_tool_call"
    CHECK_SKIPPED = "check_skipped"
    LOGPROB_MISMATCH = "logprob_mismatch"
    LOGPROB_SEMANTICS = "logprob_semantics"
    TEMPLATE_MISMATCH = "template_mismatch"
    VERL_TOOL_TURN = "verl_tool_turn"
    IMPORT_LOSS = "import_loss"


def _known_reason(v: Any) -> Any:
    # a known code becomes its member; anything else stays as it is (a str field keeps it)
    if type(v) is str:
        try:
            return TerminationReason(v)
        except ValueError:
            return v
    return v


_STATES = ", ".join(f"'{s.value}'" for s in list(StepState)[:-1]) + f" or '{list(StepState)[-1].value}'"


def _state(v: Any) -> Any:
    if isinstance(v, StepState):
        return v
    if type(v) is str:
        try:
            return StepState(v)
        except ValueError:
            pass
    raise ValueError(f"Input should be {_STATES}")


Reason = Annotated[TerminationReason | str, BeforeValidator(_known_reason)]
State = Annotated[StepState, BeforeValidator(_state)]


def _span_from_json(v: Any) -> Any:
    # JSON has no tuples: a span is written as a two-element list
    return tuple(v) if type(v) is list else v


_NON_FINITE = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _float_from_json(v: Any) -> Any:
    # the model writes non-finite floats as these strings (ser_json_inf_nan="strings"); only
    # they are read back as floats, not "1.5" or any other string
    return _NON_FINITE.get(v, v) if type(v) is str else v


Span = Annotated[tuple[int, int], BeforeValidator(_span_from_json)]
JsonFloat = Annotated[float, BeforeValidator(_float_from_json)]


class _Model(BaseModel):
    # Unknown keys are kept (extra="allow") so a newer file read by an older version loses
    # nothing on re-save.
    # ser_json_inf_nan="strings": a -inf logprob is written as "-Infinity" (read back as -inf),
    # not as null, which a float field then refuses
    model_config = ConfigDict(extra="allow", validate_assignment=False, ser_json_inf_nan="strings")


class ToolCall(_Model):
    """One tool call parsed out of generated text."""

    name: str
    arguments: Any = Field(default_factory=dict)  # an object for a well-formed call
    id: str | None = None
    span: Span | None = None  # character span of the whole call in the step's text
    raw: str | None = None  # the call's text as the model wrote it

    def to_message_call(self) -> dict[str, Any]:
        """The call in Hugging Face chat format (arguments as an object)."""
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            call["id"] = self.id
        return call


class ParseError(_Model):
    """A part of the generated text that looked like a tool call but could not be parsed
    (``severity="error"``), or a call that was read only after a repair the model did not
    write, e.g. a missing arguments key read as ``{}`` (``"warning"``: the call is kept)."""

    message: str
    span: Span | None = None
    raw: str | None = None
    severity: Literal["error", "warning"] = "error"


class ToolResult(_Model):
    """What running one tool call produced."""

    call_id: str | None = None
    name: str
    content: str  # exactly what was put into the tool message the model sees
    ok: bool = True
    error: str | None = None  # kind of failure: unknown_tool, invalid_arguments, exception, timeout, ...
    error_detail: str | None = None
    duration_s: JsonFloat = 0.0
    truncated: bool = False
    original_length: int | None = None  # characters before truncation
    stdout: str | None = None


class MessageSpan(_Model):
    """Which tokens (and characters of the rendered text) belong to which message."""

    message: int  # index into Trace.messages; -1 for template text that belongs to no message
    start: int  # token index into prompt_ids + response_ids
    end: int
    char_start: int | None = None
    char_end: int | None = None


class LogprobSemantics(_Model):
    """What a generated step's ``logprobs`` are: which backend produced them and whether they
    are ``raw`` (log-softmax of the model's logits, before temperature / top-k / top-p: vLLM's
    default ``raw_logprobs``, and what transformers' ``output_logits`` give) or ``processed``
    (after those: vLLM ``processed_logprobs``), with the sampling settings they were taken
    under. A trainer divides the logits by the temperature and applies no top-k / top-p, so
    only ``processed`` logprobs at any temperature, or ``raw`` ones at temperature 1 without
    filtering, can match its numbers."""

    backend: str
    mode: Literal["raw", "processed"]
    temperature: JsonFloat = 1.0
    top_p: JsonFloat = 1.0
    top_k: int = -1
    # a decoding constraint (tool_choice grammar) masked the distribution the logprobs were
    # taken from: vLLM applies the grammar bitmask to the logits before its sampler, so even its
    # raw logprobs are renormalised over the allowed tokens (transformers' raw ones are not)
    constrained: bool = False

    def filtered(self) -> bool:
        """Whether top-k or top-p cut the distribution the tokens were sampled from."""
        return (self.top_k is not None and self.top_k > 0) or self.top_p < 1.0


class Scorer(_Model):
    """Who computed a trace's trainer-view logprobs (``StepInfo.trainer_logprobs``)."""

    kind: str  # "transformers"; "verl old_log_probs" for an import that carried them
    model: str | None = None
    dtype: str | None = None  # "float32", "bfloat16"
    temperature: JsonFloat = 1.0  # the logits were divided by it before the log-softmax


class StepInfo(_Model):
    """What a step knows beyond its typed fields. Only the keys that were set are written, in the
    order they were set, so a file's ``info`` object is written back exactly as it was read; keys
    this version does not know are kept (extra)."""

    # every step of an imported trace (an importer made it, not our engine)
    imported: bool | None = None
    # terminated: the run's termination reason
    reason: Reason | None = None
    # pending: whether the template rendered each message's span exactly
    spans_exact: bool | None = None
    # generating: the token budget of the request, and the generator's backend details
    max_tokens: int | None = None
    constraint: str | None = None  # the kind of decoding constraint the backend applied
    server_url: str | None = None
    routing: str | None = None
    failover_from: str | None = None
    failover_reason: str | None = None
    # generating, cut by Stop / the time limit: the unfinished call(s), as ParseError dicts
    cut_tool_call: list[dict[str, Any]] | None = None
    # processing_tools: calls over max_parallel_calls not run; a turn not appended, and why
    dropped_calls: int | None = None
    not_appended: str | None = None
    would_append_tokens: int | None = None
    # processing_tools: how the tool turn was tokenized: "continuous" (backend.families), or, under
    # tool_turns "legacy" (and where the continuous render failed), backend.tokens.rendering.render_tool_turn's
    method: str | None = None  # "continuous", "suffix", "verl" or "diff"
    rule: str | None = None  # continuous: the family's rule (backend.families.RULES)
    # continuous: the junction edit, {"position": token index, "inserted": [ids], "relabeled": n, "why": ...}
    boundary: dict[str, Any] | None = None
    continuous_error: str | None = None  # the continuous render failed on this turn (why); legacy was used
    stripped_prefix_tokens: int | None = None
    prefix_mismatch: bool | None = None  # traces written before the suffix method
    verl_error: str | None = None  # verl's method failed on this turn (why)
    verl_tokens: int | None = None  # verl's method gives other ids (this many) than the suffix
    # generating, Harmony (gpt-oss): the turn's messages by channel, each
    # {"channel": ..., "recipient": ... or None, "span": [start, end]} (character span in the text)
    channels: list[dict[str, Any]] | None = None
    # imported processing_tools step: the roles of its messages when not only tool output
    roles: list[str] | None = None
    # generating, with Step.logprobs: what those logprobs are (backend, raw/processed, sampling)
    logprob_semantics: LogprobSemantics | None = None
    # any step with tokens, after backend.checks.logprobs.score_trace: the trainer-view logprob of each
    # of its tokens (Trace.scorer says how they were computed); imported ``old_log_probs`` too
    trainer_logprobs: list[JsonFloat] | None = None

    _order: list[str] = PrivateAttr(default_factory=list)  # the keys set, in order

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> StepInfo:
        info = handler(data)
        if type(data) is dict:
            info.__pydantic_private__["_order"] = list(data)
        return info

    def __setattr__(self, name: str, value: Any) -> None:
        # what pydantic does for an unvalidated assignment, without its general path (a step
        # sets a few keys per turn)
        if name in _INFO_FIELDS:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        elif name.startswith("_"):
            super().__setattr__(name, value)
            return
        else:
            self.__pydantic_extra__[name] = value
        order = self.__pydantic_private__["_order"]
        if name not in order:
            order.append(name)

    @classmethod
    def empty(cls) -> StepInfo:
        """No key set (every step's default), built without validation: a step is made per
        turn, and validating nothing cost more than the rest of the step."""
        info = cls.__new__(cls)
        _set = object.__setattr__
        _set(info, "__dict__", _NO_INFO.copy())
        _set(info, "__pydantic_fields_set__", set())
        _set(info, "__pydantic_extra__", {})
        _set(info, "__pydantic_private__", {"_order": []})
        return info

    def __copy__(self) -> StepInfo:  # model_copy(): a copy with its own key order
        info = super().__copy__()
        info.__pydantic_private__["_order"] = list(self.__pydantic_private__["_order"])
        return info

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> StepInfo:
        info = super().model_copy(deep=deep)
        for k, v in (update or {}).items():
            setattr(info, k, v)
        return info

    def keys(self) -> list[str]:
        """The keys that were set, in the order they were set."""
        return list(self.__pydantic_private__["_order"])

    def update(self, other: StepInfo | dict[str, Any]) -> None:
        """Set every key of ``other`` (a generator's info dict, another StepInfo)."""
        if isinstance(other, StepInfo):
            for k in other.__pydantic_private__["_order"]:
                setattr(self, k, getattr(other, k))
            return
        for k, v in other.items():
            setattr(self, k, _known_reason(v) if k == "reason" else v)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d = handler(self)
        return {k: d[k] for k in self.__pydantic_private__["_order"]}

    def __eq__(self, other: Any) -> bool:  # as the dict it was: same keys and values, any order
        if isinstance(other, StepInfo):
            return self.to_dict() == other.to_dict()
        if isinstance(other, dict):
            return self.to_dict() == other
        return NotImplemented

    def __bool__(self) -> bool:
        return bool(self.keys())

    def __repr_args__(self):  # only the keys that were set
        d = self.model_dump()
        return [(k, d[k]) for k in self.keys()]


_INFO_FIELDS = frozenset(StepInfo.model_fields)
_NO_INFO = dict.fromkeys(StepInfo.model_fields)


class Step(_Model):
    """One transition of the agent loop state machine."""

    index: int
    state: State
    start: int = 0  # token span [start, end) into prompt_ids + response_ids
    end: int = 0
    mask: Literal[0, 1] | None = None  # mask bit of the tokens it appended; None if it appended none
    text: str = ""  # decoded text of the appended tokens
    messages_added: list[int] = Field(default_factory=list)  # indices into Trace.messages
    tool_calls: list[ToolCall] = Field(default_factory=list)
    parse_errors: list[ParseError] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)
    finish_reason: str | None = None  # the generator's: stop, length, abort
    constraint: dict[str, Any] | None = None  # active decoding constraint for a generated turn
    logprobs: list[JsonFloat] | None = None
    started_at: JsonFloat | None = None  # unix seconds
    duration_s: JsonFloat = 0.0
    error: str | None = None
    info: StepInfo = Field(default_factory=StepInfo.empty)

    @field_validator("mask", mode="before")
    @classmethod
    def _mask_is_int(cls, v: Any) -> Any:
        if type(v) in (bool, float):  # Literal[0, 1] would take true and 1.0 as 1, even strictly
            raise ValueError(f"mask is {json.dumps(v)}; it must be 0, 1 or null")
        return v

    @model_validator(mode="after")
    def _span_ok(self) -> Step:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"step {self.index}: bad token span [{self.start}, {self.end})")
        return self


class TokenizerInfo(_Model):
    name: str | None = None  # profile name, hub id or path
    template: str | None = None  # template name, file, or "custom"
    template_sha256: str | None = None
    eos_token_id: int | None = None
    vocab_size: int | None = None
    # why the template does not fit this tokenizer (backend.loading.tokenizers.template_fit_warnings)
    template_warnings: list[str] | None = None


def new_trace_id() -> str:
    """A fresh trace id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


class Trace(_Model):
    format_version: int = FORMAT_VERSION
    id: str = Field(default_factory=new_trace_id)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    message_spans: list[MessageSpan] = Field(default_factory=list)
    termination_reason: Reason | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    tokenizer: TokenizerInfo = Field(default_factory=TokenizerInfo)
    metadata: dict[str, Any] = Field(default_factory=dict)
    scorer: Scorer | None = None  # who computed the steps' trainer_logprobs (backend.checks.logprobs)

    @model_serializer(mode="wrap")
    def _without_unset_scorer(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a trace nobody scored is written as it was before the key existed (files read and
        # written back stay byte-for-byte the same)
        d = handler(self)
        if d.get("scorer", 0) is None:
            del d["scorer"]
        return d

    @field_validator("prompt_ids", "response_ids")
    @classmethod
    def _ids_in_range(cls, ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t < 0 or t > MAX_TOKEN_ID:
                raise ValueError(f"token id {t} at position {i} is out of range 0..{MAX_TOKEN_ID}")
        return ids

    @field_validator("response_mask")
    @classmethod
    def _mask_bits(cls, mask: list[int]) -> list[int]:
        for i, m in enumerate(mask):
            if m not in (0, 1):
                raise ValueError(f"response_mask[{i}] is {m}; mask values must be 0 or 1")
        return mask

    @field_validator("format_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v > FORMAT_VERSION:
            raise ValueError(f"trace format version {v} is newer than this tool understands ({FORMAT_VERSION})")
        if v < 1:
            raise ValueError(f"trace format version {v} is not a version (versions start at 1)")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> Trace:
        if len(self.response_ids) != len(self.response_mask):
            raise ValueError(
                f"response_mask has {len(self.response_mask)} entries but response_ids has "
                f"{len(self.response_ids)}; they must be the same length"
            )
        total = len(self.prompt_ids) + len(self.response_ids)
        for s in self.steps:
            if s.end > total and total:
                raise ValueError(f"step {s.index} span [{s.start}, {s.end}) is past the {total} tokens of the trace")
        return self

    # ---- derived views -------------------------------------------------------------------
    @property
    def input_ids(self) -> list[int]:
        """The full token sequence: prompt then response."""
        return self.prompt_ids + self.response_ids

    @property
    def full_mask(self) -> list[int]:
        """Mask over the full sequence (prompt tokens are context: 0)."""
        return [0] * len(self.prompt_ids) + self.response_mask

    @property
    def num_turns(self) -> int:
        """Assistant turns generated (or present, for imported traces)."""
        gen = sum(1 for s in self.steps if s.state == StepState.GENERATING)
        if gen:
            return gen
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    def step_errors(self) -> int:
        n = 0
        for s in self.steps:
            n += sum(1 for e in s.parse_errors if e.severity == "error") + (1 if s.error else 0) + sum(1 for r in s.tool_results if not r.ok)
        return n

    # ---- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        """A trace from a parsed record (of a file, a Parquet row, an import): the record must
        carry ``format_version`` and ``id`` (every other field has a default), and fields are
        validated strictly: ``"3"``, ``3.0`` and ``true`` are not the integer 3, ``1`` is not
        ``true``, ``"1.5"`` is not a number."""
        if not isinstance(data, dict):
            raise TraceFormatError(f"a trace must be a JSON object, got {json_type(data)}")
        missing = [k for k in ("format_version", "id") if k not in data]
        if missing:
            raise TraceFormatError(f"not a trace record: no {' or '.join(missing)} field "
                                   "(files from other tools: python -m backend import)")
        why = _check_record(data)
        if why:
            raise TraceFormatError(why)
        try:
            return cls.model_validate(data, strict=True)
        except ValidationError as e:
            raise TraceFormatError(_explain(e)) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Trace:
        # the same parser and checks as load_traces, so a record opened from the trace table is
        # accepted or refused exactly as it is when the whole file is loaded
        data = parse_json_record(text)
        if isinstance(data, Refused):
            raise TraceFormatError(data.reason)
        return cls.from_dict(data)


class TraceFormatError(UserError):
    """A record that is not a valid trace; the message says why in plain words."""


@dataclass
class Refused:
    reason: str


def json_error_reason(e: BaseException) -> str:
    """One plain line for why ``json.loads`` refused a text."""
    if isinstance(e, json.JSONDecodeError):
        # some of json's messages end in " at" ("Invalid control character at")
        return f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return f"not valid UTF-8 at byte {e.start + 1}"  # 1-based, like JSON's columns
    if isinstance(e, RecursionError):
        return "invalid JSON: nested too deeply"
    msg = str(e)
    if "integer string conversion" in msg:  # Python's guard against quadratic int parsing
        return "invalid JSON: an integer literal of more than 4300 digits"
    return f"invalid JSON: {msg.splitlines()[0] if msg else type(e).__name__}"[:300]


def parse_json_record(raw: str | bytes) -> Any:
    """``json.loads`` of one record (bytes must be UTF-8; a leading byte-order mark is ignored),
    or a :class:`Refused` with the reason. Every reader of trace lines goes through this, so a
    line gets the same verdict and the same words wherever it is read."""
    try:
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = bytes(raw)
            if raw.startswith(codecs.BOM_UTF8):
                raw = raw[3:]
            raw = raw.decode("utf-8")  # strict: no surrogates smuggled in as bytes, no UTF-16 guessing
        elif raw.startswith("\ufeff"):
            raw = raw[1:]
        # without the line's own newline, an error at its end is reported at its end (json
        # counts columns from the last newline: "column 1" of the next line otherwise)
        return json.loads(raw.rstrip("\r\n"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return Refused(json_error_reason(e))


# Deepest JSON nesting a trace record may have (the record itself is level 1). Deeper records
# could be loaded but not written back (pydantic's serializer stops at 255 levels, orjson at 254,
# pydantic's JSON parser at 200), so they are refused when read.
MAX_JSON_DEPTH = 100
_ID_FIELDS = ("prompt_ids", "response_ids", "response_mask")
_INF = float("inf")


def _kind(v: Any) -> str:
    if type(v) is float and (v != v or v in (_INF, -_INF)):
        return "NaN/Infinity"
    if type(v) is float:
        return "a number with a fraction"
    return json_type(v)


def _check_record(rec: dict[str, Any]) -> str | None:
    """Why a parsed record cannot be a trace although pydantic might accept it, or None.

    * token ids and mask values must be JSON integers (pydantic would turn ``"5"``, ``5.0`` and
      ``true`` into ints silently);
    * no NaN/Infinity anywhere (not JSON; written back as null, which then does not read back);
    * no lone UTF-16 surrogates in strings (``"\\ud800"``: the trace could not be saved or sent
      to the browser);
    * at most :data:`MAX_JSON_DEPTH` levels of nesting.
    """
    for key in _ID_FIELDS:
        ids = rec.get(key)
        if isinstance(ids, list) and not all(type(x) is int for x in ids):
            i, x = next((i, x) for i, x in enumerate(ids) if type(x) is not int)
            what = "mask values" if key == "response_mask" else "token ids"
            shown = "" if x is None else f" ({json.dumps(x)[:40]})"
            return f"{key}[{i}] is {_kind(x)}{shown}; {what} must be JSON integers"
    stack: list[tuple[Any, int, str]] = [(rec, 1, "")]
    while stack:
        obj, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            where = path if len(path) <= 60 else path[:60] + "…"
            return f"nested more than {MAX_JSON_DEPTH} levels deep (at {where})"
        items = obj.items() if type(obj) is dict else enumerate(obj)
        for k, v in items:
            if type(k) is str and not k.isascii() and _has_surrogate(k):
                return f"{path or 'trace'}: key {k!r} holds a lone UTF-16 surrogate (not valid Unicode)"
            t = type(v)
            if t is str:
                if not v.isascii() and _has_surrogate(v):
                    return f"{_child(path, k)}: a string with a lone UTF-16 surrogate (not valid Unicode)"
            elif t is float:
                if v != v or v == _INF or v == -_INF:
                    return f"{_child(path, k)}: {v} is not a JSON number (NaN and Infinity are not allowed)"
            elif t is dict or t is list:
                if depth == 1 and k in _ID_FIELDS:
                    continue  # checked above (flat integer lists)
                stack.append((v, depth + 1, _child(path, k)))
    return None


def _child(path: str, k: Any) -> str:
    return f"{path}[{k}]" if type(k) is int else (f"{path}.{k}" if path else str(k))


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "trace"
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        parts.append(f"{loc}: {msg}")
    more = e.error_count() - 3
    if more > 0:
        parts.append(f"and {more} more problem(s)")
    return "; ".join(parts)
