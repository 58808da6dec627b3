"""GLM-4.5 / 4.7 / 5: the model stops at ``<|observation|>`` (before tool output) or ``<|user|>``,
and that same token opens the next message in the template. It is kept once, where the model wrote
it, and counted as context (mask 0), as verl 0.9.1's ``GLMContinuousTokenBuilder`` does (it drops
the generated copy and appends the template's). No offline vocabulary: the rule applies to a GLM
tokenizer loaded from a hub id or folder."""

from __future__ import annotations

from typing import Any

from backend.families.base import Edit, TurnRule, token_id

OPENINGS = ("<|observation|>", "<|user|>")


class GLMRule(TurnRule):
    name = "glm"
    summary = "the generated <|observation|> / <|user|> opens the next message: kept once, counted as context"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return all(token_id(bundle.tokenizer, t) is not None for t in OPENINGS) and "<|observation|>" in (bundle.chat_template or "")

    def __init__(self, bundle: Any):
        super().__init__(bundle)
        self.openings = {token_id(bundle.tokenizer, t) for t in OPENINGS}

    def edit(self, prefix_ids, context_ids, history, new_messages) -> Edit:
        if prefix_ids and prefix_ids[-1] in self.openings and context_ids[:1] == prefix_ids[-1:]:
            return Edit(relabel=1, why="the stop token the model wrote is also the next message's opening: kept once, as "
                                       "context (verl 0.9.1's GLM builder)")
        return Edit()


# ---- the family ----------------------------------------------------------------------------------

# No vocabulary on the package registry, so no offline profile: GLM's tokenizer comes from a hub id
# or folder (its calls parse with `glm45`, its template's tool turns follow this rule).
PROFILES = ()
VOCABULARIES = ()
OWN_VOCABULARIES = ()
MODEL_NAMES = ()
RULES = (GLMRule,)
