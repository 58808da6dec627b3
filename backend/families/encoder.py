"""The continuation rule shared by the families rendered by their own encoder instead of a Jinja
template (Mistral through mistral-common, gpt-oss through openai-harmony): the new messages' ids
are what that encoder adds after a synthetic user + assistant call turn, checked to extend it (the
renderer's ``tool_turn``). The model stops at the end token the encoder writes (``</s>``,
``<|call|>``) and the next message follows with nothing between: no edit."""

from __future__ import annotations

from typing import Any

from backend.families.base import SYNTHETIC_USER, TurnRule


class EncoderRule(TurnRule):
    name = "encoder"
    summary = "no edit: the encoder writes nothing between the end token the model stops at and the next message"
    priority = 0  # a bundle with a renderer renders through it, whatever its tokens

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return bundle.renderer is not None

    def __init__(self, bundle: Any):
        super().__init__(bundle)
        self.name = getattr(bundle.renderer, "family", None) or bundle.template_name

    def synthetic_prefix(self, history, new_messages):
        return [dict(SYNTHETIC_USER), self.synthetic_assistant(history, new_messages)]

    def context_ids(self, history, new_messages, tools, kwargs):
        prefix = self.synthetic_prefix(history, new_messages)
        merged = dict(self.bundle.chat_template_kwargs)
        merged.update(kwargs or {})
        return list(self.bundle.renderer.tool_turn(prefix, list(new_messages), tools or None, kwargs=merged)[1])
