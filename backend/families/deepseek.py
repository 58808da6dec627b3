"""DeepSeek V3 / R1: ``<｜end▁of▁sentence｜>`` ends the assistant turn and the tool outputs follow
with nothing between, so a tool turn needs no edit (verl 0.9.1's ``DeepSeekContinuousTokenBuilder``
edits only before an appended *user* message, which this loop never appends). The synthetic
call's arguments fall back to the string ``"{}"`` for templates that splice them in as text
(R1, V3.1: :meth:`backend.families.base.TurnRule.context_ids`)."""

from __future__ import annotations

from typing import Any

from backend.families.base import TurnRule, token_id

EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
TOOL_OUTPUTS_BEGIN = "<\uff5ctool\u2581outputs\u2581begin\uff5c>"


class DeepSeekRule(TurnRule):
    name = "deepseek"
    summary = "no edit: <｜end▁of▁sentence｜> is followed directly by <｜tool▁outputs▁begin｜>"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return token_id(bundle.tokenizer, EOS) is not None and TOOL_OUTPUTS_BEGIN in (bundle.chat_template or "")
