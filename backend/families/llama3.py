"""Llama 3.1 / 3.2: the profile, its vocabulary, the model names, and how a tool turn continues.

The vocabulary is quicktok's ``llama3.vocab`` + ``llama3.special`` (the ``quicktok-v1`` PyPI
package), the specials renamed to Llama 3.1's names (quicktok numbers the reserved tokens
differently). A turn ends with ``<|eot_id|>`` (the EOS), an ipython call with ``<|eom_id|>``.

``<|eot_id|>`` / ``<|eom_id|>`` end a turn and the next header follows with nothing between, so
the junction needs no edit (verl 0.9.1's default builder). The template stamps a dated system
header on every render; in the synthetic context it is part of the prefix that is diffed away, so
it never reaches the sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError
from backend.families.base import TurnRule, token_id
from backend.families.profile import Profile
from backend.tokens.bpe import build_bpe_files
from backend.tokens.vocab import Vocabulary, check_contiguous, read_quicktok_special, read_quicktok_vocab

# ---- the vocabulary ------------------------------------------------------------------------------

# Llama 3.1's names for the 11 ids after the ranks; the rest are reserved_special_token_{id-128008}.
LLAMA31_NAMED: dict[int, str] = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128002: "<|reserved_special_token_0|>",
    128003: "<|reserved_special_token_1|>",
    128004: "<|finetune_right_pad_id|>",
    128005: "<|reserved_special_token_2|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}


def _llama31_name(tid: int) -> str:
    return LLAMA31_NAMED.get(tid) or f"<|reserved_special_token_{tid - 128008}|>"


def _build_llama3(out: Path, files: list[Path]) -> None:
    from quicktok import _import_core  # quicktok's pattern constants (pure Python)

    ranks = read_quicktok_vocab(files[0])
    specials = read_quicktok_special(files[1])
    ids = [tid for tid, _ in specials]
    if ids != list(range(128000, 128256)):
        raise ModelBuildError(f"quicktok's llama3.special does not hold ids 128000..128255: {LLAMA3.pip}")
    quick = dict(specials)
    for tid in (128000, 128001, 128006, 128007, 128009):  # the names both numberings share
        if quick[tid] != LLAMA31_NAMED[tid]:
            raise ModelBuildError(f"quicktok names {tid} {quick[tid]!r}, Llama 3.1 {LLAMA31_NAMED[tid]!r}")
    added = [(tid, _llama31_name(tid), True) for tid in ids]
    check_contiguous(ranks, added, "llama3")
    v = LLAMA3
    build_bpe_files(
        out, ranks, _import_core.LLAMA3_PAT, added, eos=v.eos, bos=v.bos, pad=v.pad,
        model_max_length=131072, ignore_merges=True, bos_template=True,
    )


LLAMA3 = Vocabulary(
    name="llama3",
    package="quicktok-v1",
    version="0.4.0",
    file="data/llama3.vocab",
    kind="tiktoken",
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad=None,
    build=_build_llama3,
    notes="Llama 3.1/3.2 (128,000 ranks + 256 specials with Llama 3.1's names); encode() adds BOS "
    "unless add_special_tokens=False, as Meta's tokenizer.json does.",
    module="quicktok",
    special_file="data/llama3.special",
)


# ---- the tool turn -------------------------------------------------------------------------------


class Llama3Rule(TurnRule):
    name = "llama3"
    summary = "no edit: <|eot_id|> / <|eom_id|> is followed directly by the next <|start_header_id|>"
    priority = 20  # a header shape Llama-derived templates share: after the families' own tokens

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return (token_id(bundle.tokenizer, "<|start_header_id|>") is not None
                and "<|start_header_id|>" in (bundle.chat_template or ""))


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("llama3", "llama3", "Llama 3.1 / 3.2 Instruct (128k vocabulary, JSON tool calls; trl llama3_1.jinja)",
            "llama3", "llama3_1.jinja", "llama3_json", templates=("llama3_1", "llama3_2", "llama3"),
            stop_tokens=("<|eom_id|>", "<|end_of_text|>"), template_kwargs=("date_string",)),
)
VOCABULARIES = (LLAMA3,)
OWN_VOCABULARIES = ()
MODEL_NAMES = ((r"llama[-_ ]?3", "llama3"),)
RULES = (Llama3Rule,)
