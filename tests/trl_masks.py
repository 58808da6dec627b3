"""trl's assistant masks as a test oracle (a helper module, not a test file).

transformers' ``apply_chat_template(..., return_assistant_tokens_mask=True)`` over trl's
``*_training.jinja`` twin of a template (its ``{% generation %}`` tags) gives the assistant mask an
SFT trainer with ``assistant_only_loss`` uses. trl's tags run on over the whitespace the template
writes right after the end-of-turn token (Qwen's ``\\n`` after ``<|im_end|>``, Gemma's after
``<end_of_turn>``), a token the model never generates: verl >= 0.9 keeps it as context (mask 0),
and so do the loop, the importers' rendered traces and the mask audit
(docs/tool-turns.md). :func:`generated_mask` is trl's mask with exactly those tokens at 0.
"""

from __future__ import annotations

from typing import Any

from backend.loading.tokenizers import read_trl_template


def trl_assistant_mask(bundle: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[int]]:
    """``(ids, assistant mask)`` of trl's training twin of ``bundle``'s template."""
    enc = bundle.tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
        chat_template=read_trl_template(bundle.training_template), **(bundle.chat_template_kwargs or {}))
    return list(enc["input_ids"]), list(enc["assistant_masks"])


def separator_positions(bundle: Any, ids: list[int]) -> list[int]:
    """Positions of the whitespace-only tokens that follow an end-of-turn token (the EOS or the
    profile's other stop tokens), up to the first token that is not whitespace."""
    stops = set(bundle.stop_token_ids)
    tok = bundle.tokenizer
    out: list[int] = []
    for k in range(1, len(ids)):
        if ids[k] in stops or tok.decode([ids[k]], skip_special_tokens=False).strip():
            continue
        if ids[k - 1] in stops or (out and out[-1] == k - 1):
            out.append(k)
    return out


def generated_mask(bundle: Any, ids: list[int], trl_mask: list[int]) -> list[int]:
    """trl's mask with the separator after each end-of-turn token at 0: what the model generated."""
    out = list(trl_mask)
    for k in separator_positions(bundle, ids):
        out[k] = 0
    return out
