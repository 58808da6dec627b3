"""Load a tokenizer and its chat template: by offline profile, hub id or local path.

Offline profiles need nothing from the Hugging Face Hub: :data:`backend.families.PROFILES` is
the one table of them (the family modules' rows; ``python -m backend profiles`` prints it). Each
names its vocabulary (built by its family from a registry package), its default trl template
(read from the installed ``trl`` package at run time), its native tool-call format, its stop
tokens and reasoning markers. Families whose authoritative encoder is not a Jinja template —
Mistral (mistral-common) and gpt-oss through openai-harmony — carry a ``renderer`` on the bundle
instead (the profile's; :mod:`backend.families.mistral`, :mod:`backend.families.gpt_oss`). This
module loads them generically and knows no family by name.

A template that does not fit the tokenizer (another family's special tokens split into pieces,
an EOS it never writes, a trl template written for another vocabulary) is reported by
:func:`template_fit_warnings` / :meth:`TokenizerBundle.template_warnings`, never silently used.
Built tokenizers are cached under :func:`backend.runtime.cache.cache_root` (never inside site-packages).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.errors import TokenizerLoadError, UserError  # noqa: F401 - re-exported
from backend.families import FAMILY_PATTERNS, OWN_VOCABULARIES, PROFILES, VOCABULARIES, vocab_dir
from backend.families.profile import Profile, own_template
from backend.parsers import DEFAULT_FORMAT, guess_format, guess_parser
from backend.tokens.bpe import load_folder_tokenizer
from backend.tokens.trl_templates import read_trl_template, training_variant, trl_template_names, unknown_template_text  # noqa: F401
from backend.trace import TokenizerInfo

# ---- templates --------------------------------------------------------------------------------


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
        raise TokenizerLoadError(f"template: {unknown_template_text(spec)}; give a trl template name or Jinja text "
                                 "(files are not read here)")
    raise TokenizerLoadError(f"template: not a file, not Jinja text, and {unknown_template_text(spec)}")


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
    # (backend.tokens.template_guard) with time/size/memory limits
    untrusted_template: bool = False
    stop_tokens: tuple[str, ...] = ()  # tokens besides EOS that end a generated turn (the profile's)
    vocabulary: str | None = None  # the offline profile's vocabulary (None: a hub id or folder)
    # a family whose authoritative encoder is not Jinja (Mistral: mistral-common) renders ids
    # through this object (the profile's renderer: backend.families.mistral.MistralRenderer,
    # backend.families.gpt_oss.HarmonyRenderer); None: the chat template
    renderer: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def template_sha256(self) -> str:
        return hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """EOS and the profile's other end-of-turn tokens (gpt-oss ends a tool call with
        ``<|call|>``, Llama 3.1 an ipython call with ``<|eom_id|>``), as ids of this vocabulary."""
        ids: list[int] = []
        if self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        for t in self.stop_tokens:
            i = self.tokenizer.convert_tokens_to_ids(t)
            if isinstance(i, int) and i != getattr(self.tokenizer, "unk_token_id", None) and i not in ids:
                ids.append(i)
        return tuple(ids)

    @property
    def training_template(self) -> str | None:
        return training_variant(self.template_name)

    def info(self) -> TokenizerInfo:
        return TokenizerInfo(
            name=self.name,
            template=self.template_name,
            # a family rendered by its own encoder (Mistral, Harmony) has no template text to hash
            template_sha256=self.template_sha256 if self.renderer is None or self.chat_template else None,
            eos_token_id=self.eos_token_id,
            vocab_size=len(self.tokenizer),
            template_warnings=self.template_warnings() or None,
        )

    def template_warnings(self) -> list[str]:
        """Why the template does not fit the tokenizer (see :func:`template_fit_warnings`);
        computed once per bundle."""
        key = (self.template_sha256, id(self.tokenizer))
        cached = self.__dict__.get("_fit")
        if cached is None or cached[0] != key:
            found = template_fit_warnings(self.tokenizer, self.chat_template, self.stop_tokens)
            written_for = template_vocabularies(self.template_name)
            if self.vocabulary and written_for and self.vocabulary not in written_for:
                found.insert(0, f"template {self.template_name!r} is written for the {' / '.join(written_for)} "
                                f"vocabulary, not {self.vocabulary!r}: the text is right but the ids are another "
                                f"model's (use --tokenizer {template_profile(self.template_name)})")
            cached = (key, found)
            self.__dict__["_fit"] = cached
        return list(cached[1])

    def encode_generated(self, text: str) -> list[int]:
        """The ids a model generated for ``text`` (a script's or an import's assistant turn):
        special tokens written in it are those tokens."""
        if self.renderer is not None:
            return self.renderer.encode_generated(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def with_template(self, spec: str, *, allow_files: bool = True) -> TokenizerBundle:
        """The same tokenizer with another template (see :func:`template_source`). Only a
        template read from trl's folder renders outside the guarded worker."""
        if self.renderer is not None:
            raise TokenizerLoadError(f"{self.name} renders with {self.template_name}, not a chat template: "
                                     "no template override")
        name, text, source = _resolve(spec, allow_files=allow_files)
        return TokenizerBundle(
            self.tokenizer, self.name, name, text, guess_parser(text), dict(self.chat_template_kwargs),
            untrusted_template=source != "trl", stop_tokens=self.stop_tokens,
            vocabulary=self.vocabulary,
        )

    def guarded(self) -> TokenizerBundle:
        """The same bundle with its template rendered by the guarded worker (a tokenizer that a
        visitor chose by hub id or path brings a template nobody vetted)."""
        if self.untrusted_template:
            return self
        return TokenizerBundle(self.tokenizer, self.name, self.template_name, self.chat_template, self.parser,
                               dict(self.chat_template_kwargs), untrusted_template=True, stop_tokens=self.stop_tokens,
                               vocabulary=self.vocabulary)


# Special-looking tokens a template writes: <|name|>, DeepSeek's full-width <｜name｜>, Mistral's
# [NAME]. A template's XML-like tags (<tool_call>) are often plain text on purpose, so not checked.
_MISTRAL_CONTROL = frozenset({"INST", "TOOL_CALLS", "AVAILABLE_TOOLS", "TOOL_RESULTS", "SYSTEM_PROMPT", "THINK", "ARGS",
                               "CALL_ID", "TOOL_CONTENT"})
_JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.S)  # a comment is never written (gptoss's mentions <|final|>)
_SPECIAL_LIKE = re.compile(r"<\|[A-Za-z0-9_.:-]{1,48}\|>|<｜[^｜<>\s]{1,48}｜>|\[/?[A-Z][A-Z_]{1,24}\]")


def template_fit_warnings(tokenizer: Any, template: str | None, stop_tokens: tuple[str, ...] = ()) -> list[str]:
    """Ways ``template`` does not fit ``tokenizer`` that would silently give wrong ids: a
    special token the template writes that this vocabulary splits into pieces (a Llama template
    over a Qwen vocabulary turns ``<|start_header_id|>`` into 6 ordinary tokens), and an EOS the
    template never writes (the model would end its turns with a token the template does not use)
    unless it writes one of the model's other ``stop_tokens`` (GLM's templates write no
    ``<|endoftext|>``: its turns end at ``<|user|>`` / ``<|observation|>``, which open the next message)."""
    if not template:
        return []
    out: list[str] = []
    seen: set[str] = set()
    split: list[str] = []
    for m in _SPECIAL_LIKE.finditer(_JINJA_COMMENT.sub("", template)):
        tok = m.group()
        if tok in seen:
            continue
        seen.add(tok)
        if tok.startswith("[") and tok.strip("[]/") not in _MISTRAL_CONTROL:
            continue  # [A-Z] in a template is usually text (a Jinja list, a heading), not a token
        try:
            n = len(tokenizer.encode(tok, add_special_tokens=False))
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode is reported elsewhere
            continue
        if n > 1:
            split.append(f"{tok} -> {n} tokens")
    if split:
        shown = ", ".join(split[:6]) + (f" and {len(split) - 6} more" if len(split) > 6 else "")
        out.append(f"the template writes special tokens that this tokenizer does not have as single tokens ({shown}): "
                   "the template is probably for another model family, and its ids are not what that model sees")
    eos = getattr(tokenizer, "eos_token", None)
    if (isinstance(eos, str) and eos and eos not in template and "eos_token" not in template
            and not any(t and t in template for t in stop_tokens)):
        out.append(f"the tokenizer's EOS {eos} never appears in the template: the model would end its turns with a "
                   "token the template does not write (another family's template?)")
    return out


@lru_cache(maxsize=16)
def _load_hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _profile_tokenizer(profile: Profile):
    own = OWN_VOCABULARIES.get(profile.vocabulary)
    if own is not None and own.load is not None:
        return own.load()
    return load_folder_tokenizer(str(vocab_dir(profile.vocabulary)))


def load_tokenizer(name: str = "qwen3", template: str | None = None) -> TokenizerBundle:
    """Load an offline profile, a local tokenizer folder, or a hub id; optionally override the
    template (trl template name, file, or Jinja text). Operator input: visitor input goes
    through :class:`backend.safety.trust.TrustPolicy` first (see ``ui.context.TokenizerCache``)."""
    if not name:
        raise TokenizerLoadError("no tokenizer given")
    profile = PROFILES.get(name)
    if profile is not None and profile.renderer is not None:
        renderer = profile.renderer()
        bundle = TokenizerBundle(renderer.tokenizer, name, renderer.template_name, "", profile.parser,
                                 stop_tokens=profile.stop_tokens, vocabulary=profile.vocabulary, renderer=renderer)
    elif profile is not None:
        tok = _profile_tokenizer(profile)
        if profile.template_text is not None:
            tname, ttext = profile.template, profile.template_text()
        elif profile.trl_template is None:
            tname, ttext = profile.template, own_template(profile.template)
        else:
            tname = profile.trl_template[: -len(".jinja")]
            ttext = read_trl_template(profile.trl_template)
        bundle = TokenizerBundle(tok, name, tname, ttext, profile.parser, dict(profile.chat_template_kwargs),
                                 stop_tokens=profile.stop_tokens, vocabulary=profile.vocabulary)
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


# profiles rendered by their family's reference encoder, not by a Jinja template
_RENDERER_FAMILIES = tuple(p.name for p in PROFILES.values() if p.renderer is not None)
_PROBE = "Hello, world! <tool_call>{\"name\": \"f\"}</tool_call> 123 éà 日本"


def family_profile(model: str | None) -> str | None:
    """The offline profile of ``model``'s family, from its name (the hub id, or a folder's last
    two path parts; the families' ``MODEL_NAMES``, first match wins), or None."""
    if not model:
        return None
    name = "/".join(model.rstrip("/").replace("\\", "/").split("/")[-2:]).lower()
    for pattern, profile in FAMILY_PATTERNS:
        if re.search(pattern, name):
            return profile
    return None


def same_vocabulary(a: Any, b: Any) -> bool:
    """Whether two tokenizers share a vocabulary: the same size and the same ids for a probe
    text with punctuation, markup, accents and CJK."""
    try:
        return len(a) == len(b) and a.encode(_PROBE, add_special_tokens=False) == b.encode(_PROBE, add_special_tokens=False)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode the probe is not the same
        return False


def load_model_tokenizer(model: str, template: str | None = None) -> tuple[TokenizerBundle, str]:
    """The bundle for a model the operator named (no ``--tokenizer``), and how it was chosen.

    The model's own tokenizer is loaded first (its vocabulary is the truth). When the name says a
    family rendered by a reference encoder (gpt-oss: openai-harmony; Mistral: mistral-common)
    and that profile's vocabulary is the model's (checked), the profile renders; otherwise the
    model's own template does, with the family's tool-call format when the template shows none
    and the family's end-of-turn tokens."""
    own = load_tokenizer(model, template=template)
    family = family_profile(model)
    if family is None:
        return own, f"{model}: its own tokenizer and template (no known family in the name); format {own.parser}"
    prof = PROFILES[family]
    if family in _RENDERER_FAMILIES and template is None:
        ref = load_tokenizer(family)
        if same_vocabulary(own.tokenizer, ref.tokenizer):
            return ref, f"{model}: family {prof.family}, rendered by profile {family} ({ref.template_name}; its vocabulary is the model's)"
        return own, (f"{model}: named like {prof.family} but its vocabulary is not profile {family}'s: its own template; "
                     f"format {own.parser}")
    parser = own.parser if guess_format(own.chat_template) is not None else prof.parser
    bundle = TokenizerBundle(own.tokenizer, own.name, own.template_name, own.chat_template, parser,
                             dict(own.chat_template_kwargs), untrusted_template=own.untrusted_template,
                             stop_tokens=tuple(dict.fromkeys(own.stop_tokens + prof.stop_tokens)), vocabulary=own.vocabulary)
    return bundle, f"{model}: its own tokenizer and template; family {prof.family} (format {parser})"


def available_tokenizers() -> list[str]:
    return list(PROFILES)


def describe_profiles() -> list[dict[str, Any]]:
    """The profile table as data (``python -m backend profiles --json``): no tokenizer is built."""
    out = []
    for p in PROFILES.values():
        v = OWN_VOCABULARIES.get(p.vocabulary) or VOCABULARIES[p.vocabulary]
        out.append({
            "name": p.name,
            "family": p.family,
            "description": p.description,
            "vocabulary": p.vocabulary,
            "vocabulary_source": dict(v.source),
            "template": p.default_template,
            "templates": list(p.templates),
            "eos": v.eos,
            "stop_tokens": list(p.stop_tokens),
            "format": p.parser,
            "reasoning": list(p.reasoning) if p.reasoning else None,
            "template_kwargs": list(p.template_kwargs),
            "tool_limit": p.tool_limit or None,
        })
    return out


def template_vocabularies(template_name: str | None) -> list[str]:
    """The vocabularies of the profiles that list trl template ``template_name`` (empty when no
    profile does: a template we cannot place is not judged by name)."""
    if not template_name:
        return []
    base = template_name[: -len(".jinja")] if template_name.endswith(".jinja") else template_name
    base = base[: -len("_training")] if base.endswith("_training") else base
    out: list[str] = []
    for p in PROFILES.values():
        names = {t[: -len(".jinja")] for t in (p.trl_template,) if t} | set(p.templates)
        if base in names and p.vocabulary not in out:
            out.append(p.vocabulary)
    return out


def template_profile(template_name: str) -> str:
    """The first profile that lists trl template ``template_name``."""
    base = template_name[: -len("_training")] if template_name.endswith("_training") else template_name
    for p in PROFILES.values():
        if base in p.templates or (p.trl_template and p.trl_template[: -len(".jinja")] == base):
            return p.name
    return ""


def families_line() -> str:
    """One line naming the profiles by family, for the pickers' help text."""
    return " · ".join(f"{fam}: {', '.join(names)}" if names != [fam] else fam for fam, names in profiles_by_family().items())


def profiles_by_family() -> dict[str, list[str]]:
    """Profile names grouped by family, in table order (the pickers' grouping)."""
    out: dict[str, list[str]] = {}
    for p in PROFILES.values():
        out.setdefault(p.family, []).append(p.name)
    return out


def dump_info(bundle: TokenizerBundle) -> str:
    return json.dumps(bundle.info().model_dump(), indent=2)


def with_trace_template(bundle: TokenizerBundle, trace: Any, *, allow_files: bool,
                        load: Any = None) -> tuple[TokenizerBundle, str]:
    """``bundle`` with the chat template ``trace`` was made with, when it can be found and its
    sha256 is the one the trace records: the template text kept in the trace's metadata
    (``chat_template``), else the template the trace names (a trl name; a file only with
    ``allow_files``). Returns ``(bundle, why)``: ``why`` is empty when the trace's template is
    used (or the trace records none), else says why the bundle's own template is used instead.
    One rule for ``check`` on the command line, the MCP tool and the Inspector. ``load(spec)``
    builds the bundle for one candidate (default: :meth:`TokenizerBundle.with_template`)."""
    info = trace.tokenizer
    want = info.template_sha256
    if not want or want == bundle.template_sha256:
        return bundle, ""
    if bundle.renderer is not None:
        return bundle, f"{bundle.name} renders with {bundle.template_name}, not a chat template"
    candidates: list[tuple[str, str]] = []
    text = trace.metadata.get("chat_template") if isinstance(trace.metadata, dict) else None
    if isinstance(text, str) and text and ("{%" in text or "{{" in text):
        candidates.append(("the template text in its metadata", text))
    if info.template and info.template != "custom":
        candidates.append((f"the template it names, {info.template!r}", info.template))
    if not candidates:
        return bundle, "the trace does not carry its template text (metadata.chat_template) nor a template name that can be read"
    why: list[str] = []
    for label, spec in candidates:
        try:
            hit = load(spec) if load is not None else bundle.with_template(spec, allow_files=allow_files)
        except Exception as e:  # noqa: BLE001 - not this one; said in the finding
            reason = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
            if not allow_files and "files are not read here" in reason:
                reason = "a file a trace names is not read here"
            why.append(f"{label} cannot be used ({reason})")
            continue
        if hit.template_sha256 == want:
            return hit, ""
        why.append(f"{label} has another sha256 ({hit.template_sha256[:12]})")
    return bundle, "; ".join(why)
