"""Model families: one module per family, and this registry of them.

A family module holds everything the product knows of the family, and declares it in five
tables (empty where the family has none):

- ``PROFILES``: its offline profiles (:class:`~backend.families.profile.Profile`, one per
  ``--tokenizer`` name): vocabulary, default template, tool-call format, stop tokens (besides the
  vocabulary's EOS), reasoning markers, and its reference renderer where its encoder is not Jinja;
- ``VOCABULARIES``: the vocabularies it rebuilds from a registry package
  (:class:`backend.tokens.vocab.Vocabulary`: source files, special tokens, recipe);
- ``OWN_VOCABULARIES``: the ones it builds or loads itself
  (:class:`~backend.families.profile.OwnVocabulary`);
- ``MODEL_NAMES``: ``(regex, profile)`` pairs that place a model by its name (first match wins);
- ``RULES``: how it continues a token sequence after a tool call (verl 0.9's Continuous Token
  builders, written from their contract; see :mod:`backend.families.base`). Rules that several
  families share live in their own module (:mod:`~backend.families.chatml`,
  :mod:`~backend.families.encoder`).

A new family is one module and its name in :data:`FAMILIES`. The tables below are the families'
tables joined in that order. :func:`rule_for` picks the first rule (by ``priority``, then in
``FAMILIES`` order) whose ``matches`` accepts the tokenizer and template (read from the vocabulary
and the template itself, so a hub model or a user's template gets its family's rule too);
:class:`~backend.families.base.DerivedRule` is the fallback for any other template: the
whitespace it writes after an end-of-turn token, found by rendering a probe conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError
from backend.families import deepseek, gemma, glm, gpt_oss, llama3, minimax, mistral, qwen, smollm2
from backend.families.base import ContextTurn, DerivedRule, Edit, TurnRule
from backend.families.profile import OwnVocabulary, Profile
from backend.tokens import vocab
from backend.tokens.vocab import Vocabulary

__all__ = ["FAMILIES", "ContextTurn", "Edit", "OWN_VOCABULARIES", "PROFILES", "RULES", "TurnRule", "VOCABULARIES",
           "rule_for", "vocab_dir"]

# the families, in the order of the profile table
FAMILIES = (qwen, llama3, gpt_oss, deepseek, mistral, smollm2, gemma, glm, minimax)


def _by_name(rows: list[Any], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in rows:
        if row.name in out:
            raise ValueError(f"two families declare the {what} {row.name!r}")
        out[row.name] = row
    return out


PROFILES: dict[str, Profile] = _by_name([p for f in FAMILIES for p in f.PROFILES], "profile")
VOCABULARIES: dict[str, Vocabulary] = _by_name([v for f in FAMILIES for v in f.VOCABULARIES], "vocabulary")
OWN_VOCABULARIES: dict[str, OwnVocabulary] = _by_name([v for f in FAMILIES for v in f.OWN_VOCABULARIES],
                                                      "vocabulary")
# a model the operator names (ALI_MODEL: a hub id or a folder) → its family's offline profile
FAMILY_PATTERNS: tuple[tuple[str, str], ...] = tuple(p for f in FAMILIES for p in f.MODEL_NAMES)
# families with no offline vocabulary: their rules apply to a tokenizer loaded from a hub id or folder
HUB_ONLY: tuple[str, ...] = tuple(f.__name__.rpartition(".")[2] for f in FAMILIES if not f.PROFILES)

# first match wins: the encoder families, then the families named by their tokens, then the shapes
# several families share (Llama 3's headers, ChatML), then the probe
RULES: tuple[type[TurnRule], ...] = (
    *sorted(dict.fromkeys(r for f in FAMILIES for r in f.RULES), key=lambda r: r.priority), DerivedRule)


def vocabulary(name: str) -> Vocabulary:
    """The rebuilt vocabulary called ``name`` (see :data:`VOCABULARIES`)."""
    try:
        return VOCABULARIES[name]
    except KeyError:
        raise ModelBuildError(f"unknown vocabulary {name!r}; choose one of {', '.join(VOCABULARIES)}") from None


def vocab_dir(name: str) -> Path:
    """The tokenizer folder of the rebuilt vocabulary ``name``, built on first use
    (:func:`backend.tokens.vocab.vocab_dir`)."""
    return vocab.vocab_dir(vocabulary(name))


def rule_for(bundle: Any) -> TurnRule:
    """The continuation rule of ``bundle``'s tokenizer + template (built once per bundle and template)."""
    key = (bundle.template_sha256, id(bundle.tokenizer), id(bundle.renderer))
    cached = bundle.__dict__.get("_turn_rule")
    if cached is not None and cached[0] == key:
        return cached[1]
    rule = next(r for r in RULES if r.matches(bundle))(bundle)
    bundle.__dict__["_turn_rule"] = (key, rule)
    return rule
