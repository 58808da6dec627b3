"""Llama 3.x: ``<|eot_id|>`` / ``<|eom_id|>`` end a turn and the next header follows with nothing
between, so the junction needs no edit (verl 0.9.1's default builder). The template stamps a dated
system header on every render; in the synthetic context it is part of the prefix that is diffed
away, so it never reaches the sequence."""

from __future__ import annotations

from typing import Any

from backend.families.base import TurnRule, token_id


class Llama3Rule(TurnRule):
    name = "llama3"
    summary = "no edit: <|eot_id|> / <|eom_id|> is followed directly by the next <|start_header_id|>"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return (token_id(bundle.tokenizer, "<|start_header_id|>") is not None
                and "<|start_header_id|>" in (bundle.chat_template or ""))
