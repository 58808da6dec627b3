"""What a family module declares besides its continuation rules: its offline profiles
(:class:`Profile`, one row per ``--tokenizer`` name) and the vocabularies it loads itself
(:class:`OwnVocabulary`; a vocabulary rebuilt by a :class:`backend.tokens.vocab.Vocabulary` recipe is
declared as that). Data only: :func:`backend.loading.tokenizers.load_tokenizer` builds the bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


def own_template(name: str) -> str:
    """The text of one of our own chat templates (``backend/templates/<name>.jinja``)."""
    return (TEMPLATES_DIR / f"{name}.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Profile:
    """An offline profile: a model family's vocabulary, its default chat template and what
    generation needs to know about it. Data only; :func:`backend.loading.tokenizers.load_tokenizer`
    builds the bundle."""

    name: str  # what --tokenizer takes
    family: str  # qwen3, qwen3.5, llama3, gpt-oss, deepseek-v3, smollm2, ...
    description: str
    vocabulary: str  # a name in backend.families.VOCABULARIES or OWN_VOCABULARIES
    trl_template: str | None  # default template: a file name in trl/chat_templates, or None (see `template`)
    parser: str  # the native tool-call format (a name `parse --format` takes)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    templates: tuple[str, ...] = ()  # other trl templates written for this vocabulary
    stop_tokens: tuple[str, ...] = ()  # tokens besides EOS that end a generated turn
    reasoning: tuple[str, str] | None = None  # the reasoning block's open and close markers
    template_kwargs: tuple[str, ...] = ()  # the template's own switches (enable_thinking, ...)
    # without a trl template: one of ours (backend/templates/<name>.jinja), or, with a renderer,
    # what the profile table calls that renderer (openai-harmony, mistral-common), or, with
    # ``template_text``, the name of a template the vocabulary's package ships
    template: str | None = None
    # the text of the default template when a registry package ships it (read from the installed
    # package at run time, never copied here): ``template`` names it
    template_text: Callable[[], str] | None = field(default=None, compare=False, repr=False)
    # the family's reference renderer, where its encoder is not a Jinja template: the bundle
    # renders through it and takes its tokenizer (its class names the bundle's template)
    renderer: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    # what the default template cannot render of a tool loop, where it cannot (Gemma 2/3: no tool
    # schemas, no calls, no tool messages): empty when it renders them all
    tool_limit: str = ""

    @property
    def default_template(self) -> str | None:
        """The default template's name as the profile table shows it."""
        return self.trl_template[: -len(".jinja")] if self.trl_template else self.template


@dataclass(frozen=True)
class OwnVocabulary:
    """A vocabulary its family builds or loads itself rather than through a
    :class:`backend.tokens.vocab.Vocabulary` recipe (Qwen2/3's BPE, SmolLM2's GGUF tokenizer, Mistral's
    tekken file through mistral-common)."""

    name: str
    source: dict[str, str] = field(compare=False)  # package, version, file (``profiles --json``)
    eos: str
    # the Hugging Face tokenizer; None: the profile's renderer brings it
    load: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
