"""The continuation rule of ChatML templates, shared by the Qwen and SmolLM2 families (and any
Hermes-style template): ``<|im_end|>\\n`` closes a turn, generation stops at ``<|im_end|>``; the
``\\n`` is inserted before the next message (context, mask 0). verl 0.9.1 does this for the models
whose ``model_type`` it names Qwen (``QwenContinuousTokenBuilder``); its default builder, which
SmolLM2 (``model_type`` llama) gets, does not, so a verl run of SmolLM2 still drops it."""

from __future__ import annotations

from backend.families.base import SeparatorRule


class ChatMLRule(SeparatorRule):
    name = "chatml"
    summary = "insert '\\n' after the generated <|im_end|> (the template writes <|im_end|>\\n between turns)"
    end_token = "<|im_end|>"
    priority = 30  # the most widely shared shape: tried after every family's own tokens
