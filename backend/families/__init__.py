"""Model families: how each continues a token sequence after a tool call (verl 0.9's Continuous
Token builders, written from their contract; see :mod:`backend.families.base`).

One module per family, one row in :data:`RULES`. :func:`rule_for` picks the first rule whose
``matches`` accepts the tokenizer and template (read from the vocabulary and the template itself,
so a hub model or a user's template gets its family's rule too); :class:`DerivedRule` is the
fallback for any other template: the whitespace it writes after an end-of-turn token, found by
rendering a probe conversation."""

from __future__ import annotations

from typing import Any

from backend.families.base import ContextTurn, Edit, SeparatorRule, TurnRule, turn_separator
from backend.families.chatml import ChatMLRule
from backend.families.deepseek import DeepSeekRule
from backend.families.encoder import EncoderRule
from backend.families.glm import GLMRule
from backend.families.gpt_oss import GptOssRule
from backend.families.llama3 import Llama3Rule
from backend.families.minimax import MiniMaxRule

__all__ = ["ContextTurn", "Edit", "RULES", "TurnRule", "rule_for"]


class DerivedRule(SeparatorRule):
    """Any other template: when it writes whitespace after the end token the model stops at
    (probed), insert it; else no edit."""

    name = "derived"
    summary = "the whitespace the template writes after the end-of-turn token, found by a probe render"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return True

    def __init__(self, bundle: Any):
        TurnRule.__init__(self, bundle)
        self.end_id, self.sep_ids, self.end_token = None, [], ""
        tok = bundle.tokenizer
        for i in bundle.stop_token_ids:
            end = tok.convert_ids_to_tokens(i)
            sep = turn_separator(bundle, end) if isinstance(end, str) else None
            if sep:
                self.end_id, self.end_token, self.separator = i, end, sep
                from backend.rendering import encode

                self.sep_ids = encode(bundle, sep)
                self.name = f"derived ({end!r} + {sep!r})"
                break

    def edit(self, prefix_ids, context_ids, history, new_messages):
        if self.end_id is None:
            return Edit()
        return super().edit(prefix_ids, context_ids, history, new_messages)


# first match wins: the encoder families, then the families named by their tokens, then ChatML
RULES: tuple[type[TurnRule], ...] = (EncoderRule, GptOssRule, DeepSeekRule, GLMRule, MiniMaxRule, Llama3Rule,
                                     ChatMLRule, DerivedRule)


def rule_for(bundle: Any) -> TurnRule:
    """The continuation rule of ``bundle``'s tokenizer + template (built once per bundle and template)."""
    key = (bundle.template_sha256, id(bundle.tokenizer), id(bundle.renderer))
    cached = bundle.__dict__.get("_turn_rule")
    if cached is not None and cached[0] == key:
        return cached[1]
    rule = next(r for r in RULES if r.matches(bundle))(bundle)
    bundle.__dict__["_turn_rule"] = (key, rule)
    return rule
