"""gpt-oss (Harmony): a tool call ends with ``<|call|>``, which the model writes, and the tool's
message ``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>`` follows
with nothing between: no edit (verl 0.9.1's ``GptOssContinuousTokenBuilder`` formats that message
itself; here the template — trl's gptoss.jinja — or openai-harmony writes it, in the synthetic
context, and the tests hold the two equal)."""

from __future__ import annotations

from typing import Any

from backend.families.base import TurnRule, token_id


class GptOssRule(TurnRule):
    name = "gpt-oss"
    summary = "no edit: <|call|> is followed directly by the tool's <|start|>functions.NAME message"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return token_id(bundle.tokenizer, "<|call|>") is not None and token_id(bundle.tokenizer, "<|channel|>") is not None
