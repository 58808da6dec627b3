"""The agent loop's settings (:class:`LoopConfig`) and the one table that says how each is set.

Every ``LoopConfig`` field declares a :class:`Knob` in its dataclass metadata: the label and help
the Playground widget and the CLI flag show, the widget kind, the values it accepts (checked in
``LoopConfig.__post_init__``), the largest value a visitor of a public server may send (read by
:data:`backend.safety.trust.RANGES`), the CLI flag and the ``ALI_*`` environment variable where one
exists. :data:`FIELDS` is that table; the Playground widgets, the CLI flags and the validation
are built from it, so a new knob is one field here.

The defaults of :func:`backend.tool_choice.default_policy` and the Playground's tool_choice
presets (``"required, then auto"``) are spelled here too, with :func:`runs_embedded_model`.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from backend.errors import UserError
from backend.generators.base import SamplingParams
from backend.tool_choice import ToolChoiceError, default_policy, normalize_policy

TRUNCATE_SIDES = ("left", "right", "middle")
TOOL_ERROR_POLICIES = ("feed_back", "terminate")
VLLM_LOGPROBS_MODES = ("raw", "processed")
# how a tool turn's ids are appended (backend.families): verl >= 0.9's continuous tokens, or verl < 0.9
TOOL_TURNS = ("continuous", "legacy")  # a vLLM server's --logprobs-mode: raw_logprobs / processed_logprobs


class ConfigError(UserError):
    """A loop setting out of its range, of the wrong type, or unknown."""


def runs_embedded_model(backend: str | None, model: str | None) -> bool:
    """Whether a model backend runs the embedded default model: a local backend (vllm,
    transformers) given no model. ``vllm-server`` serves whatever its server holds; ``scripted``
    (or no backend) runs no model."""
    return backend in ("vllm", "transformers") and not model


# ---- tool_choice presets -------------------------------------------------------------------------
# The Playground offers "X, then auto": X on the first turn, then the model decides. A forced choice
# alone (required, a tool's name) repeats on every turn, so the run can end only on a limit.
THEN_AUTO = ", then auto"


def tool_choice_label(policy: tuple[str, ...] | list[str] | str) -> str:
    """A policy as the Playground writes it: ``("required", "auto")`` → ``"required, then auto"``."""
    parts = normalize_policy(policy)
    if len(parts) == 2 and parts[1] == "auto" and parts[0] != "auto":
        return parts[0] + THEN_AUTO
    return ", ".join(parts)


def tool_choice_policy(choice: str | None, has_tools: bool) -> Any:
    """The LoopConfig ``tool_choice`` for a Playground choice. A preset "X, then auto" is
    ``[X, "auto"]``; "required, then auto" means plain ``auto`` when no tools are defined."""
    c = (choice or "auto").strip()
    if c.endswith(THEN_AUTO) and c[: -len(THEN_AUTO)].strip():
        first = c[: -len(THEN_AUTO)].strip()
        if first == "required" and not has_tools:
            return "auto"
        return [first, "auto"]
    return c


def default_tool_choice(*, embedded_model: bool, has_tools: bool = True) -> str:
    """The Playground's default tool_choice (:func:`backend.tool_choice.default_policy`)."""
    return tool_choice_label(default_policy(embedded_model=embedded_model, has_tools=has_tools))


# ---- the field table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """How one LoopConfig field is set from outside (widget, CLI flag, env var) and checked.

    ``kind``: "int", "float", "choice" (one of ``choices``), "object" (a JSON object), "parser"
    (a tool-call format name, "auto" = the tokenizer's default) or "tool_choice".
    ``widget``: "number", "dropdown", "radio", "text", or "" for a field the Playground sets
    from widgets of its own (``sampling``: temperature, top_p, ...)."""

    label: str
    help: str
    kind: str
    widget: str = "number"
    group: str = "limits"  # the Playground accordion: "limits", "format", "tools"
    elem_id: str = ""
    optional: bool = False  # None = no limit; the widget's 0 (or an empty box) means None
    positive: bool = False  # numbers must be > 0
    choices: tuple[str, ...] = ()
    visitor_min: float | None = None  # the range a visitor of this server may send
    visitor_max: float | None = None
    env: str | None = None  # ALI_* variable giving the CLI default
    extra: Any = None  # a further check of the value: raises ValueError with the message

    def flag(self, name: str) -> str:
        return "--" + name.replace("_", "-")

    def check(self, name: str, v: Any) -> None:
        """Raise :class:`ConfigError` when ``v`` is not a value of this field."""
        if self.kind in ("int", "float"):
            if v is None and self.optional:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (self.kind == "int" and not isinstance(v, int)):
                raise ConfigError(f"{name} must be {'a whole number' if self.kind == 'int' else 'a number'}"
                                  f"{' or null' if self.optional else ''}, not {v!r}")
            if self.positive and not v > 0:
                raise ConfigError(f"{name} must be positive{' or null' if self.optional else ''}")
        elif self.kind == "choice" and v not in self.choices:
            raise ConfigError(f"{name} must be one of {', '.join(self.choices)}")
        elif self.kind == "object" and not isinstance(v, dict):
            raise ConfigError(f"{name} must be a JSON object")
        elif self.kind == "parser" and v is not None and not isinstance(v, str):
            raise ConfigError(f"{name} must be a format name or null")
        if self.extra is not None:
            try:
                self.extra(v)
            except (TypeError, ValueError) as e:
                raise ConfigError(str(e)) from None

    def parse(self, value: Any, *, has_tools: bool = True) -> Any:
        """A widget's or a flag's value (text or number) as the field's value."""
        if self.kind == "object":
            if isinstance(value, dict):
                return value
            try:
                d = json.loads(value or "{}")
            except json.JSONDecodeError as e:
                raise ConfigError(f"{self.label}: invalid JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise ConfigError(f"{self.label} must be a JSON object")
            return d
        if self.kind in ("int", "float"):
            v = to_number(value, self.label)
            if v is None or (self.optional and v == 0):
                return None
            return int(v) if self.kind == "int" and v.is_integer() else v
        if self.kind == "parser":
            return None if value in (None, "", "auto") else value
        if self.kind == "tool_choice":
            return tool_choice_policy(value, has_tools)
        return value

    def widget_value(self, v: Any) -> Any:
        """The field's value as its widget shows it (the inverse of :meth:`parse`)."""
        if self.kind == "object":
            return json.dumps(v)
        if self.kind in ("int", "float") and v is None:
            return 0
        if self.kind == "parser" and v is None:
            return "auto"
        if self.kind == "tool_choice":
            return tool_choice_label(v)
        return v


def to_number(value: Any, label: str, error: type[Exception] = ConfigError) -> float | None:
    """A number typed in a box or on the command line: None when empty, else ``float(value)``,
    or ``error`` saying that ``label`` must be a number."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise error(f"{label} must be a number, not {str(value)[:40]!r}") from None


def knob(default: Any = None, *, factory: Any = None, **kw: Any) -> Any:
    """A dataclass field with its :class:`Knob`."""
    meta = {"knob": Knob(**kw)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _check_sampling(v: Any) -> None:
    SamplingParams.from_dict(v)


def _check_tool_choice(v: Any) -> None:
    try:
        normalize_policy(v)
    except ToolChoiceError as e:
        raise ValueError(str(e)) from None


@dataclass(frozen=True)
class LoopConfig:
    """verl's agent-loop knobs (defaults follow verl's ``multi_turn`` config where it has one)."""

    response_length: int = knob(4096, label="response_length (all response tokens)", kind="int", positive=True,
                                help="budget for all response tokens (generated + injected)",
                                elem_id="pg-response-length", visitor_min=1, visitor_max=32768)
    max_assistant_turns: int | None = knob(None, label="max_assistant_turns (0 = no limit)", kind="int", optional=True, positive=True,
                                           help="assistant turns at most", elem_id="pg-max-assistant", visitor_min=1, visitor_max=100)
    max_user_turns: int | None = knob(None, label="max_user_turns (0 = no limit)", kind="int", optional=True, positive=True,
                                      help="tool-response turns at most, as verl counts them", elem_id="pg-max-user",
                                      visitor_min=1, visitor_max=100)
    max_parallel_calls: int = knob(1, label="max_parallel_calls", kind="int", positive=True, help="tool calls run per turn at most",
                                   elem_id="pg-parallel", visitor_min=1, visitor_max=16)
    max_tool_response_length: int | None = knob(256, label="max_tool_response_length (chars, 0 = no limit)", kind="int", optional=True,
                                                positive=True, help="characters of a tool result kept", elem_id="pg-max-tool-len",
                                                visitor_min=1, visitor_max=100_000)
    tool_response_truncate_side: str = knob("middle", label="tool_response_truncate_side", kind="choice", widget="dropdown",
                                            choices=TRUNCATE_SIDES, help="where a long tool result is cut", elem_id="pg-trunc")
    apply_chat_template_kwargs: dict[str, Any] = knob(factory=dict, label="chat_template_kwargs", kind="object", widget="text",
                                                      group="format", help="extra chat template variables (JSON object), "
                                                      'e.g. {"enable_thinking": false}', elem_id="pg-kwargs")
    parser: str | None = knob(None, label="tool-call parser", kind="parser", widget="dropdown", group="format",
                              help="tool-call format; auto: the tokenizer profile's default", elem_id="pg-parser")
    sampling: dict[str, Any] = knob(factory=dict, label="sampling", kind="object", widget="", extra=_check_sampling,
                                    help="SamplingParams fields (JSON object), e.g. {\"temperature\": 0}")
    tool_turns: str = knob("continuous", label="tool_turns", kind="choice", widget="radio", group="format",
                           choices=TOOL_TURNS, env="ALI_TOOL_TURNS", elem_id="pg-tool-turns",
                           help="how a tool turn's tokens are appended: continuous (verl >= 0.9: the generated ids, the "
                                "family's boundary edit such as Qwen's \\n after <|im_end|>, then the new messages' ids) or "
                                "legacy (verl < 0.9: the tool turn rendered alone, no boundary edit)")
    tool_timeout_s: float = knob(30.0, label="tool_timeout_s", kind="float", positive=True, help="seconds a tool call may take",
                                 elem_id="pg-tool-timeout", visitor_min=0.1, visitor_max=60.0)
    on_tool_error: str = knob("feed_back", label="on_tool_error", kind="choice", widget="radio", choices=TOOL_ERROR_POLICIES,
                              help="a failed tool: feed the error back to the model, or end the run", elem_id="pg-on-error")
    # "auto" | "required" | "none" | a tool name, or one per assistant turn (last repeats),
    # e.g. ["required", "auto"]; enforced at token level by the backend (backend.tool_choice)
    tool_choice: Any = knob("auto", label="tool_choice", kind="tool_choice", widget="dropdown", group="tools", extra=_check_tool_choice,
                            help="auto | required | none | TOOL_NAME, or one per assistant turn, comma-separated (last repeats), "
                                 "e.g. required,auto. Default: required,auto for the embedded default model when tools are "
                                 "given, else the --config value or auto", elem_id="pg-tool-choice")
    # a vLLM server's --logprobs-mode cannot be read over HTTP: the user says it, the vllm-server
    # backend records it in each step's logprob_semantics (other backends know their own)
    vllm_logprobs_mode: str = knob("raw", label="vllm_logprobs_mode (vllm-server)", kind="choice", widget="dropdown",
                                   group="format", choices=VLLM_LOGPROBS_MODES, env="ALI_VLLM_LOGPROBS_MODE",
                                   elem_id="pg-vllm-logprobs-mode",
                                   help="vllm-server backend: the servers' --logprobs-mode, recorded with the logprobs: raw "
                                        "(vLLM's default raw_logprobs, before temperature/top-k/top-p) or processed "
                                        "(processed_logprobs, after them)")

    def __post_init__(self) -> None:
        for name, k in FIELDS.items():
            k.check(name, getattr(self, name))

    @property
    def tool_choice_policy(self) -> tuple[str, ...]:
        return normalize_policy(self.tool_choice)

    @property
    def sampling_params(self) -> SamplingParams:
        cached = self.__dict__.get("_sampling_params")
        if cached is None:
            cached = SamplingParams.from_dict(self.sampling)
            object.__setattr__(self, "_sampling_params", cached)  # frozen: cache by hand
        return cached

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LoopConfig:
        d = dict(d or {})
        unknown = set(d) - set(FIELDS)
        if unknown:
            raise ConfigError(f"unknown loop config key(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(FIELDS))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(str(e)) from None


# name → Knob, in LoopConfig's field order
FIELDS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in fields(LoopConfig)}
DEFAULTS: dict[str, Any] = LoopConfig().to_dict()


def env_defaults(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The loop settings given by ``ALI_*`` environment variables (fields that have one)."""
    env = os.environ if environ is None else environ
    out = {}
    for name, k in FIELDS.items():
        if k.env and env.get(k.env, "").strip():
            out[name] = k.parse(env[k.env].strip())
    return out
