"""MiniMax M2: ``[e~[\\n`` closes a turn, generation stops at ``[e~[``; the ``\\n`` is inserted
(verl 0.9.1's ``MiniMaxContinuousTokenBuilder``). No offline vocabulary: the rule applies to a
MiniMax tokenizer loaded from a hub id or folder."""

from __future__ import annotations

from backend.families.base import SeparatorRule


class MiniMaxRule(SeparatorRule):
    name = "minimax"
    summary = "insert '\\n' after the generated [e~[ (the template writes [e~[\\n between turns)"
    end_token = "[e~["


# ---- the family ----------------------------------------------------------------------------------

# No vocabulary on the package registry, so no offline profile: MiniMax's tokenizer comes from a hub
# id or folder (its template's tool turns follow this rule).
PROFILES = ()
VOCABULARIES = ()
OWN_VOCABULARIES = ()
MODEL_NAMES = ()
RULES = (MiniMaxRule,)
