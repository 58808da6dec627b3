"""The trust boundary: operator input versus visitor input, decided in one place.

*Operator* input is what the person who starts the app gives it: command-line flags, the
environment, files on their disk. It may name paths, hub ids and URLs.

*Visitor* input is anything that arrives over HTTP: every field of the web app and every
argument of its API. In **public** mode (the server is reachable by others: a non-loopback
``--host``, ``--share``, a Hugging Face Space) visitor input is data, never a locator: a
tokenizer field may name only an offline profile or the model's own tokenizer, a template field
only one of trl's template names (read from trl's installed folder) or inline Jinja text (which
renders in the guarded worker, :mod:`backend.tokens.template_guard`). In **local** mode (a person on
their own machine) typed paths and hub ids stay available.

Trust comes from where a thing was read, never from its name: a template read from trl's folder
or our own package is trusted; one typed by a visitor, read from a file a visitor named, or that
came with a tokenizer a visitor chose is rendered by the guarded worker.

Every number a visitor sends is checked against :data:`RANGES` (the ranges the UI offers); the
UI builds its widgets from the same table.
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from backend.config import FIELDS, to_number
from backend.errors import UserError


class Mode(str, Enum):
    PUBLIC = "public"
    LOCAL = "local"


class VisitorInputError(UserError):
    """Visitor input this server does not accept; the message says what it accepts instead and
    never reveals anything about the server (whether a path exists, what a file holds)."""


LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a bind address) is reachable only from this machine."""
    h = (host or "").strip().strip("[]").lower()
    if not h:
        return True  # gradio's default is loopback
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume reachable


def decide_mode(host: str | None, share: bool, forced: str | None = None,
                environ: dict[str, str] | None = None) -> tuple[Mode, str]:
    """``(mode, why)``. ``forced`` ("public" / "local", from ``--public`` / ``--local`` or
    ``ALI_MODE``) wins; otherwise public whenever others can reach the server."""
    env = os.environ if environ is None else environ
    if forced:
        f = forced.strip().lower()
        if f not in ("public", "local", "auto"):
            raise ValueError(f"mode must be public, local or auto, not {forced!r}")
        if f != "auto":
            return Mode(f), f"forced ({f})"
    if env.get("SPACE_ID"):
        return Mode.PUBLIC, f"running as the Hugging Face Space {env['SPACE_ID']}"
    if share:
        return Mode.PUBLIC, "--share creates a public link"
    if not is_loopback(host):
        return Mode.PUBLIC, f"listening on {host}, reachable by others"
    return Mode.LOCAL, f"listening on {host or '127.0.0.1'} only"


# ---- numbers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """A visitor-settable number: the UI offers ``lo..hi``; the server refuses anything else."""

    label: str
    lo: float
    hi: float
    integer: bool = False
    zero_means_none: bool = False  # 0 (or empty) = no limit, for the loop's optional limits

    def check(self, value: Any, *, default: Any = None) -> Any:
        v = to_number(value, self.label, VisitorInputError)
        if v is None:
            return default
        if math.isnan(v) or math.isinf(v):
            raise VisitorInputError(f"{self.label} must be a finite number")
        if self.integer:
            if v != int(v):
                raise VisitorInputError(f"{self.label} must be a whole number")
            v = int(v)
        if self.zero_means_none and v == 0:
            return None
        if v < self.lo or v > self.hi:
            lo = int(self.lo) if self.integer else self.lo
            hi = int(self.hi) if self.integer else self.hi
            extra = " (0 = no limit)" if self.zero_means_none else ""
            raise VisitorInputError(f"{self.label} must be between {lo:g} and {hi:g}{extra} on this server, not {v:g}")
        return v


# The ranges the Playground offers. One table: the widgets are built from it and every value
# reaching /playground_run is checked against it (the API bypasses the widgets). The loop
# settings' ranges come from their LoopConfig fields (backend.config.FIELDS).
RANGES: dict[str, Range] = {
    "token_delay": Range("delay per token (s)", 0.0, 0.5),
    "temperature": Range("temperature", 0.0, 2.0),
    "top_p": Range("top_p", 0.05, 1.0),
    "max_tokens": Range("max_tokens per turn", 1, 8192, integer=True),
    "seed": Range("seed", 0, 2**31 - 1, integer=True),
    **{name: Range(name, k.visitor_min, k.visitor_max, integer=k.kind == "int", zero_means_none=k.optional)
       for name, k in FIELDS.items() if k.visitor_max is not None},
}

# Text a visitor may send in one field (messages, tools, a script, code, a template)
MAX_FIELD_CHARS = int(os.environ.get("ALI_MAX_FIELD_CHARS", str(2_000_000)))


def check_text(value: Any, label: str, limit: int | None = None) -> str:
    s = "" if value is None else str(value)
    limit = MAX_FIELD_CHARS if limit is None else limit
    if len(s) > limit:
        raise VisitorInputError(f"{label} is {len(s):,} characters; this server accepts at most {limit:,}")
    return s


# ---- tokenizers and templates -----------------------------------------------------------------


@dataclass(frozen=True)
class TemplateChoice:
    """Where a template comes from: ``trl`` (a name, read from trl's folder: trusted),
    ``inline`` (Jinja text typed by the visitor) or ``file`` (a path, local mode only)."""

    kind: str
    value: str

    @property
    def trusted(self) -> bool:
        return self.kind == "trl"


@dataclass(frozen=True)
class TrustPolicy:
    """What visitor input may name, in this server's mode. Built once by the app from the
    operator's flags; every UI path that turns visitor text into a tokenizer or a template goes
    through :meth:`tokenizer` and :meth:`template`."""

    mode: Mode = Mode.LOCAL
    why: str = ""
    # tokenizer names the operator made available besides the offline profiles (the model's own)
    operator_tokenizers: tuple[str, ...] = ()
    run_timeout_s: float | None = None  # wall-clock limit per agent run; None = none
    # who refuses, in the messages: a public server, or a local app's MCP endpoint (public rules in every mode)
    server: str = "this public server"
    ranges: dict[str, Range] = field(default_factory=lambda: dict(RANGES))

    @property
    def public(self) -> bool:
        return self.mode is Mode.PUBLIC

    def tokenizer(self, name: Any, label: str = "tokenizer") -> str:
        """A visitor's tokenizer choice, or :class:`VisitorInputError`. In public mode only the
        offline profiles and the operator's tokenizers; in local mode anything (a hub id or a
        path is loaded as typed, and its template is treated as untrusted)."""
        from backend.families import PROFILES

        n = check_text(name, label, 1000).strip()
        if not n:
            raise VisitorInputError(f"choose a {label}")
        if n in PROFILES or n in self.operator_tokenizers or not self.public:
            return n
        raise VisitorInputError(f"{label}: {self.server} loads only its offline profiles"
                                f"{' and the model' + chr(39) + 's own tokenizer' if self.operator_tokenizers else ''}"
                                f" ({', '.join([*PROFILES, *self.operator_tokenizers])}); hub ids and paths are not loaded")

    def is_operator_tokenizer(self, name: str) -> bool:
        from backend.families import PROFILES

        return name in PROFILES or name in self.operator_tokenizers

    def template(self, spec: Any, label: str = "template") -> TemplateChoice:
        """A visitor's template: a trl template name, inline Jinja text, or (local mode only) a
        file path. In public mode nothing is read from the server's disk but trl's folder, and
        the answer for a path is the same whether or not it exists."""
        from backend.loading.tokenizers import MAX_TEMPLATE_CHARS, trl_template_names
        from backend.tokens.trl_templates import unknown_template_text

        s = check_text(spec, label, MAX_TEMPLATE_CHARS)
        if not s.strip():
            raise VisitorInputError(f"the {label} is empty")
        if "{%" in s or "{{" in s:
            return TemplateChoice("inline", s)
        name = s.strip()
        base = name[: -len(".jinja")] if name.endswith(".jinja") else name
        if base in trl_template_names():
            return TemplateChoice("trl", base)
        if not self.public:
            return TemplateChoice("file", name)
        raise VisitorInputError(f"{label}: {unknown_template_text(name)}; give a trl template name or Jinja text "
                                f"({self.server} does not read files)")

    def check_pickle(self, name: str) -> None:
        """A visitor's upload that is a pickle (a torch ``.pt``, slime's rollout dumps): refused in
        public mode, whatever is in it (the restricted reader, :mod:`backend.safety.pickle_guard`, is for
        the operator's files and a person's own machine)."""
        if self.public:
            raise VisitorInputError(
                f"{name} is a Python pickle (a torch .pt file); this public server does not read pickles, not even "
                "with a restricted loader. Import it on your own machine (python -m backend import FILE --out "
                "traces.jsonl) and upload the JSONL")

    def number(self, key: str, value: Any, default: Any = None) -> Any:
        return self.ranges[key].check(value, default=default)


LOCAL = TrustPolicy(Mode.LOCAL, "default")
