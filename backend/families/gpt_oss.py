"""gpt-oss (Harmony): the profiles, the o200k_harmony vocabulary, openai-harmony loaded offline,
its reference renderer, the model names, and how a tool turn continues.

**The vocabulary** (``o200k_harmony``): quicktok's ``o200k.vocab`` + ``o200k_harmony.special``
(the ``quicktok-v1`` PyPI package); the o200k pattern comes from ``tiktoken_ext.openai_public``.
The ranks are also written in tiktoken's text format (``o200k_base.tiktoken``, checked against
the sha256 that tiktoken and openai-harmony pin) so that :func:`harmony_encoding` loads Harmony
offline. A turn ends with ``<|return|>`` (the EOS) or, for a tool call, ``<|call|>``; reasoning
is the ``analysis`` channel.

**Two profiles**: ``gpt-oss`` renders with trl's ``gptoss.jinja``; ``gpt-oss-harmony`` with
openai-harmony, OpenAI's reference renderer, instead of a Jinja template. The two write different
ids for the same conversation; a trainer of gpt-oss needs to see both. :class:`HarmonyRenderer`
has the interface of :class:`backend.families.mistral.MistralRenderer` (``render``,
``tool_turn``, ``encode_generated``, ``decode_with_offsets``, ``tokenizer``): the ids come from
``harmony_encoding().render_conversation_*`` and the text is their decode.

**The tool turn**: a tool call ends with ``<|call|>``, which the model writes, and the tool's
message ``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>`` follows
with nothing between: no edit (verl 0.9.1's ``GptOssContinuousTokenBuilder`` formats that message
itself; here the template — trl's gptoss.jinja — or openai-harmony writes it, in the synthetic
context, and the tests hold the two equal). Through openai-harmony the rule is the encoder
families' (:mod:`backend.families.encoder`).

How our Hugging Face-style messages become Harmony messages:

* a leading ``system`` or ``developer`` message is the developer message's ``# Instructions``
  (Harmony's developer message is what chat APIs call the system prompt; trl does the same);
  the tools are the developer message's ``functions`` namespace
  (``ToolDescription.new(name, description, parameters)``);
* Harmony's own system message is built from the kwargs: ``model_identity``,
  ``reasoning_effort`` (``low``/``medium``/``high``), ``knowledge_cutoff`` and
  ``conversation_start_date`` (``"YYYY-MM-DD"``, ``"today"``, or ``None``/``""`` for no date
  line). The default date is the constructor's, ``None``: harmony's ``SystemContent`` default,
  which writes no ``Current date`` line, so renders are deterministic. trl's template and vLLM
  always print today's date: pass ``conversation_start_date="today"`` to match them;
* an assistant message's ``reasoning_content`` (or ``thinking``, ``reasoning``) is an
  ``analysis`` message; its ``content`` is a ``final`` message, or, when the message also has
  tool calls, a ``commentary`` preamble (what :mod:`backend.parsers.harmony` reads a preamble
  as); each tool call is its own ``commentary`` message to ``functions.NAME`` with content type
  ``<|constrain|>json``, its arguments as written (a string verbatim, an object as
  ``json.dumps(..., ensure_ascii=False)``, which is what trl's ``tojson`` and our parser's
  ``format_calls`` write);
* a ``tool`` message is a ``commentary`` message from ``functions.NAME`` (its ``name``, else the
  call its ``tool_call_id`` answers, else the next unanswered call) to ``assistant``.

Which Harmony render:

* with the generation prompt: ``render_conversation_for_completion(conv, Role.ASSISTANT)``;
* without: ``render_conversation_for_training``. It is ``render_conversation`` except that a
  conversation ending with an assistant ``final`` message ends with ``<|return|>`` (the EOS the
  model generated and must learn) instead of ``<|end|>`` (what the same message becomes once
  the conversation goes on);
* a tool turn: ``render_conversation`` of the history (its last message as context: a final
  answer closed with ``<|end|>``), which must be an id prefix of the completion render with the
  new messages.

Harmony drops analysis messages (``RenderConversationConfig.auto_drop_analysis``, on by default,
kwarg ``auto_drop_analysis``): when the *last assistant message* is a ``final`` message, every
analysis message before the *first* final message goes. Consequences, measured on
oss-harmony 0.0.11:

* a tool turn after a call keeps the prefix (the last assistant message is the call, nothing is
  dropped before or after), in every round: two tool rounds concatenate to the full render;
* once the answer (a final message) closes the conversation, the re-render drops the analysis of
  the earlier tool-call turns *and* of the answer's own turn, so the loop's sequence (which has
  them) is not harmony's training render unless ``auto_drop_analysis=False``;
* a conversation that goes on after an answer (a new user message) is rendered with the
  earlier analysis dropped in its prompt, and with it again once the model's next message is a
  call: the history moves under the loop (no error can be raised for the prompt alone; a tool
  turn whose new messages end in a final answer is refused, see :meth:`HarmonyRenderer.tool_turn`).

:func:`template_differences` renders one conversation both ways and describes where they part.
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError, UserError
from backend.families.base import TurnRule, token_id
from backend.families.encoder import EncoderRule
from backend.families.profile import Profile
from backend.runtime import cache
from backend.tokens import vocab
from backend.tokens.bpe import build_bpe_files, load_folder_tokenizer, load_tiktoken_ranks, tiktoken_text
from backend.tokens.template_errors import RenderError, template_error_text
from backend.tokens.trl_templates import read_trl_template
from backend.tokens.vocab import Vocabulary, check_contiguous, read_quicktok_special, read_quicktok_vocab

# ---- the vocabulary ------------------------------------------------------------------------------

# sha256 of o200k_base.tiktoken, as pinned by tiktoken_ext.openai_public and by openai-harmony.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_TIKTOKEN = "o200k_base.tiktoken"
_TIKTOKEN_LOCK = threading.Lock()


def o200k_from_tiktoken(tiktoken_file: Path) -> dict[str, Any]:
    """tiktoken_ext.openai_public's own ``o200k_harmony()`` definition (pattern and special
    tokens), its ranks loader pointed at our local file: the hash it pins is checked here."""
    try:
        from tiktoken_ext import openai_public
    except ImportError:
        raise ModelBuildError("the o200k_harmony vocabulary needs tiktoken: pip install tiktoken==0.14.0") from None
    pinned: list[str | None] = []

    def local_loader(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        pinned.append(expected_hash)
        data = tiktoken_file.read_bytes()
        if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
            raise ModelBuildError(f"{tiktoken_file.name} does not have the sha256 tiktoken pins ({expected_hash})")
        return load_tiktoken_ranks(tiktoken_file)

    with _TIKTOKEN_LOCK:
        saved = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = local_loader
        try:
            enc = openai_public.o200k_harmony()
        finally:
            openai_public.load_tiktoken_bpe = saved
    return dict(enc, pinned_sha256=pinned[0] if pinned else None)


def _harmony_specials(specials: list[tuple[int, str]]) -> list[tuple[int, str, bool]]:
    """One name per id: where quicktok (like tiktoken) lists two names for an id (200018 is both
    ``<|endofprompt|>`` and ``<|reserved_200018|>``) keep the one that is not a reserved slot,
    as gpt-oss's tokenizer.json does."""
    by_id: dict[int, str] = {}
    for tid, content in specials:
        if tid not in by_id or by_id[tid].startswith("<|reserved_"):
            by_id[tid] = content
    return [(tid, by_id[tid], True) for tid in sorted(by_id)]


def _build_o200k_harmony(out: Path, files: list[Path]) -> None:
    ranks = read_quicktok_vocab(files[0])
    specials = read_quicktok_special(files[1])
    text = tiktoken_text(ranks)
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise ModelBuildError(f"quicktok's o200k ranks give {O200K_TIKTOKEN} sha256 {digest}, not {O200K_BASE_SHA256}")
    (out / O200K_TIKTOKEN).write_bytes(text)
    tk = o200k_from_tiktoken(out / O200K_TIKTOKEN)
    if tk["pinned_sha256"] != O200K_BASE_SHA256:
        raise ModelBuildError(f"tiktoken pins {tk['pinned_sha256']} for o200k_base, this build expects {O200K_BASE_SHA256}")
    if sorted(tk["special_tokens"].items()) != sorted((c, t) for t, c in specials):
        raise ModelBuildError("quicktok's o200k_harmony special tokens differ from tiktoken_ext's o200k_harmony")
    added = _harmony_specials(specials)
    check_contiguous(ranks, added, "o200k_harmony")
    v = O200K_HARMONY
    build_bpe_files(
        out, ranks, tk["pat_str"], added, eos=v.eos, bos=v.bos, pad=v.pad, model_max_length=131072, ignore_merges=True
    )


O200K_HARMONY = Vocabulary(
    name="o200k_harmony",
    package="quicktok-v1",
    version="0.4.0",
    file="data/o200k.vocab",
    kind="tiktoken",
    bos="<|startoftext|>",
    eos="<|return|>",
    pad="<|endoftext|>",
    build=_build_o200k_harmony,
    notes="gpt-oss (199,998 ranks + 1,090 specials, ids 199998..201087); 200018 is <|endofprompt|> as in "
    "tiktoken (which also maps <|reserved_200018|> to it) and gpt-oss's tokenizer.json; openai-harmony "
    "calls it <|reserved_200018|> and adds <|reserved_201088|>. Folder also holds o200k_base.tiktoken.",
    module="quicktok",
    special_file="data/o200k_harmony.special",
)


# ---- Harmony offline -----------------------------------------------------------------------------

HARMONY_PACKAGE = "oss-harmony==0.0.11"  # vLLM's fork; it installs the `openai_harmony` module
_ENV_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def harmony_encoding() -> Any:
    """openai-harmony's gpt-oss encoding, loaded offline: ``TIKTOKEN_ENCODINGS_BASE`` points at
    the o200k_harmony folder (which holds ``o200k_base.tiktoken``) only for the call."""
    folder = vocab.vocab_dir(O200K_HARMONY)
    if cache.package_dir("openai_harmony") is None:
        raise ModelBuildError(f"Harmony rendering and parsing need the `openai_harmony` module: pip install {HARMONY_PACKAGE}")
    import openai_harmony

    with _ENV_LOCK:
        saved = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        try:
            return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
        finally:
            if saved is None:
                os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
            else:
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = saved


# ---- openai-harmony's renderer -------------------------------------------------------------------

TEMPLATE_NAME = "openai-harmony"  # what a bundle rendered by this module names as its "template"
TRL_TEMPLATE = "gptoss.jinja"
KNOWN_KWARGS = ("reasoning_effort", "model_identity", "conversation_start_date", "knowledge_cutoff",
                "auto_drop_analysis")
_HARMONY_ONLY_KWARGS = ("conversation_start_date", "knowledge_cutoff", "auto_drop_analysis")
_EFFORTS = ("low", "medium", "high")
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
START, MESSAGE = "<|start|>", "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")


class HarmonyRenderError(RenderError, UserError):
    """openai-harmony cannot render these messages (or we refuse them first); says why.

    A :class:`~backend.tokens.rendering.RenderError` so the engine ends the run as for a template
    failure, and a :class:`~backend.errors.UserError` so the UI shows the message."""


@lru_cache(maxsize=1)
def harmony_tokenizer() -> Any:
    """The o200k_harmony Hugging Face tokenizer (built offline from quicktok's files)."""
    return load_folder_tokenizer(str(vocab.vocab_dir(O200K_HARMONY)))


@dataclass
class HarmonyRendering:
    """A render's ids, their decode, and what was changed or ignored on the way."""

    text: str
    token_ids: list[int]
    notes: list[str] = field(default_factory=list)


@dataclass
class HarmonyInput:
    """Our messages as openai-harmony's objects (``conversation``: a ``Conversation``)."""

    conversation: Any
    auto_drop_analysis: bool
    notes: list[str] = field(default_factory=list)


def _short(e: BaseException, n: int = 300) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s if len(s) <= n else s[: n - 1] + "…"


def _text(value: Any, where: str) -> str:
    """A message's text: a string, a list of text parts, or nothing."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                raise HarmonyRenderError(f"{where}: content part {j} is not text; openai-harmony renders text only")
        return "".join(out)
    raise HarmonyRenderError(f"{where}: content must be text, got {type(value).__name__}")


def _arguments(value: Any, where: str) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value  # what the model wrote, verbatim
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise HarmonyRenderError(f"{where}: arguments must be a JSON object or its text, got {type(value).__name__}")


class HarmonyRenderer:
    """openai-harmony's gpt-oss renderer behind the interface of ``MistralRenderer``."""

    template_name = TEMPLATE_NAME  # what a bundle rendered by it names as its template

    def __init__(self, *, conversation_start_date: str | None = None) -> None:
        self.default_date = conversation_start_date
        if conversation_start_date is not None:
            self._date({"conversation_start_date": conversation_start_date})  # fail early on a bad default

    # ---- the vocabulary ----
    @property
    def tokenizer(self) -> Any:
        """The bundle's tokenizer: o200k_harmony as a Hugging Face fast tokenizer."""
        return harmony_tokenizer()

    def encode_generated(self, text: str) -> list[int]:
        """The ids a model generated for ``text``: special tokens written in it are those tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_with_offsets(ids)[0]

    def decode_with_offsets(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
        """The text of ``ids`` (special tokens kept) and each token's character span in it.

        Harmony's ids are not always what encoding their text gives (it encodes header pieces
        and bodies separately, and special-token names inside a body as text), so the spans come
        from the ids' own bytes: tokens sharing the bytes of one character all cover it; bytes
        that are not UTF-8 become U+FFFD."""
        byte_of, added = _byte_tables(self.tokenizer)
        n = len(self.tokenizer)
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= n:
                raise HarmonyRenderError(f"token id {t!r} is not in the o200k_harmony vocabulary (0..{n - 1})")
        pieces = self.tokenizer.convert_ids_to_tokens(list(ids))
        parts: list[str] = []
        offsets: list[tuple[int, int]] = []
        pending: list[int] = []  # tokens holding the first bytes of a character not yet complete
        pos = 0
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def emit(s: str, k: int | None) -> None:
            nonlocal pos
            for j in pending:  # they share this text's first character
                offsets[j] = (pos, pos + min(1, len(s)))
            pending.clear()
            if k is not None:
                offsets.append((pos, pos + len(s)))
            parts.append(s)
            pos += len(s)

        for k, (t, piece) in enumerate(zip(ids, pieces)):
            if t in added:
                flushed = dec.decode(b"", final=True)  # an unfinished character before it: U+FFFD
                dec.reset()
                if flushed:
                    emit(flushed, None)
                emit(added[t], k)
                continue
            s = dec.decode(bytes(byte_of[c] for c in piece))
            if s:
                emit(s, k)
            else:
                offsets.append((pos, pos))
                pending.append(k)
        tail = dec.decode(b"", final=True)
        if tail:
            emit(tail, None)
        return "".join(parts), offsets

    # ---- our messages as Harmony's ----
    def _date(self, kw: dict[str, Any]) -> str | None:
        d = kw.get("conversation_start_date", self.default_date)
        if d is None or d == "":
            return None
        if d == "today":
            return datetime.now().strftime("%Y-%m-%d")  # what trl's strftime_now("%Y-%m-%d") prints
        if not isinstance(d, str) or not _DATE.fullmatch(d):
            raise HarmonyRenderError(f"conversation_start_date must be 'YYYY-MM-DD', 'today' or empty, not {d!r}")
        try:
            datetime.strptime(d, "%Y-%m-%d")
        except ValueError:
            raise HarmonyRenderError(f"conversation_start_date {d!r} is not a date") from None
        return d

    def _system(self, kw: dict[str, Any]) -> Any:
        from openai_harmony import Message, ReasoningEffort, Role, SystemContent

        content = SystemContent.new()
        effort = kw.get("reasoning_effort")
        if effort is not None:
            if not isinstance(effort, str) or effort.lower() not in _EFFORTS:
                raise HarmonyRenderError(f"reasoning_effort must be one of {', '.join(_EFFORTS)}, not {effort!r}")
            content = content.with_reasoning_effort(ReasoningEffort(effort.lower().capitalize()))
        identity = kw.get("model_identity")
        if identity is not None:
            if not isinstance(identity, str):
                raise HarmonyRenderError(f"model_identity must be text, not {type(identity).__name__}")
            content = content.with_model_identity(identity)
        cutoff = kw.get("knowledge_cutoff")
        if cutoff is not None:
            if not isinstance(cutoff, str):
                raise HarmonyRenderError(f"knowledge_cutoff must be text, not {type(cutoff).__name__}")
            content = content.with_knowledge_cutoff(cutoff)
        date = self._date(kw)
        if date is not None:
            content = content.with_conversation_start_date(date)
        return Message.from_role_and_content(Role.SYSTEM, content)

    @staticmethod
    def _tool_descriptions(tools: Any) -> list[Any]:
        from openai_harmony import ToolDescription

        if not tools:
            return []
        if not isinstance(tools, list):
            raise HarmonyRenderError("tools must be a list of OpenAI tool definitions ({'type': 'function', 'function': {...}})")
        out = []
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or (t.get("type", "function") != "function"):
                raise HarmonyRenderError(f"tool {i} is not a function tool ({{'type': 'function', 'function': {{...}}}})")
            name, desc, params = fn.get("name"), fn.get("description") or "", fn.get("parameters")
            if not isinstance(name, str) or not name:
                raise HarmonyRenderError(f"tool {i} has no function name")
            if not isinstance(desc, str):
                raise HarmonyRenderError(f"tool {name!r}: description must be text")
            if params is not None and not isinstance(params, dict):
                raise HarmonyRenderError(f"tool {name!r}: parameters must be a JSON schema object")
            out.append(ToolDescription.new(name, desc, parameters=params))
        return out

    def to_harmony(self, messages: Any, tools: Any = None, kwargs: dict[str, Any] | None = None) -> HarmonyInput:
        """Our messages, tools and kwargs as a Harmony ``Conversation`` (see the module doc)."""
        from openai_harmony import Author, Conversation, DeveloperContent, Message, Role

        kw = dict(kwargs or {})
        notes: list[str] = []
        ignored = sorted(k for k in kw if k not in KNOWN_KWARGS)
        if ignored:
            notes.append(f"ignored {', '.join(ignored)}: openai-harmony's renderer takes {', '.join(KNOWN_KWARGS)}")
        drop = kw.get("auto_drop_analysis", True)
        if not isinstance(drop, bool):
            raise HarmonyRenderError(f"auto_drop_analysis must be true or false, not {drop!r}")
        if not isinstance(messages, list) or not messages:
            raise HarmonyRenderError("messages must be a non-empty list of chat messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise HarmonyRenderError(f"message {i} is {type(m).__name__}, not a chat message object")
        out = [self._system(kw)]
        rest = messages
        instructions = ""
        if messages[0].get("role") in ("system", "developer"):
            instructions = _text(messages[0].get("content"), "message 0")
            rest = messages[1:]
        descs = self._tool_descriptions(tools)
        if instructions or descs:
            dev = DeveloperContent.new()
            if instructions:
                dev = dev.with_instructions(instructions)
            if descs:
                dev = dev.with_function_tools(descs)
            out.append(Message.from_role_and_content(Role.DEVELOPER, dev))

        names: dict[str, str] = {}  # call id -> function name
        pending: list[str] = []  # names of the last assistant message's calls not yet answered
        offset = len(messages) - len(rest)
        for i, m in enumerate(rest, start=offset):
            role, where = m.get("role"), f"message {i}"
            if role == "user":
                out.append(Message.from_role_and_content(Role.USER, _text(m.get("content"), where)))
                pending = []
            elif role == "assistant":
                out += self._assistant(m, where, names, pending)
            elif role == "tool":
                name = m.get("name")
                cid = m.get("tool_call_id")
                if name is not None and (not isinstance(name, str) or not name):
                    raise HarmonyRenderError(f"{where}: the tool message's name must be a function name")
                if not name and isinstance(cid, str) and cid in names:
                    name = names[cid]
                if not name and pending:
                    name = pending[0]
                    notes.append(f"{where}: tool message without name answers {name!r} (in order)")
                if not name:
                    raise HarmonyRenderError(f"{where}: a tool message needs a name (or a tool_call_id of an earlier "
                                             "call): Harmony writes which function answered")
                if name in pending:
                    pending.remove(name)
                out.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"),
                                                           _text(m.get("content"), where))
                           .with_channel("commentary").with_recipient("assistant"))
            elif role in ("system", "developer"):
                raise HarmonyRenderError(f"{where} is a {role} message: Harmony takes the instructions from the first "
                                         "message only (the developer message)")
            else:
                raise HarmonyRenderError(f"{where} has role {role!r}; messages are system, developer, user, "
                                         "assistant or tool")
        return HarmonyInput(Conversation.from_messages(out), drop, notes)

    @staticmethod
    def _assistant(m: dict[str, Any], where: str, names: dict[str, str], pending: list[str]) -> list[Any]:
        from openai_harmony import Message, Role

        reasoning = [(k, m[k]) for k in _REASONING_KEYS if m.get(k)]
        for k, v in reasoning:
            if not isinstance(v, str):
                raise HarmonyRenderError(f"{where}: {k} must be text, got {type(v).__name__}")
        if len({v for _, v in reasoning}) > 1:
            raise HarmonyRenderError(f"{where} has different reasoning in {' and '.join(k for k, _ in reasoning)}")
        content = _text(m.get("content"), where)
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise HarmonyRenderError(f"{where}: tool_calls must be a list, got {type(calls).__name__}")
        out = []
        if reasoning:
            out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning[0][1]).with_channel("analysis"))
        if not calls:
            if content or not reasoning:
                out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("final"))
            return out
        if content:  # text beside calls: the preamble gpt-oss writes on the commentary channel
            out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("commentary"))
        pending.clear()
        for j, c in enumerate(calls):
            cw = f"{where}, tool call {j}"
            if not isinstance(c, dict):
                raise HarmonyRenderError(f"{cw} is {type(c).__name__}, not an object")
            fn = c.get("function") if isinstance(c.get("function"), dict) else c
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise HarmonyRenderError(f"{cw} has no function name")
            if isinstance(c.get("id"), str) and c["id"]:
                names[c["id"]] = name
            pending.append(name)
            out.append(Message.from_role_and_content(Role.ASSISTANT, _arguments(fn.get("arguments"), cw))
                       .with_channel("commentary").with_recipient(f"functions.{name}")
                       .with_content_type("<|constrain|>json"))
        return out

    # ---- rendering ----
    def _ids(self, inp: HarmonyInput, how: str) -> list[int]:
        from openai_harmony import HarmonyError, RenderConversationConfig, Role

        enc = harmony_encoding()
        cfg = RenderConversationConfig(auto_drop_analysis=inp.auto_drop_analysis)
        try:
            if how == "completion":
                return list(enc.render_conversation_for_completion(inp.conversation, Role.ASSISTANT, cfg))
            if how == "training":
                return list(enc.render_conversation_for_training(inp.conversation, cfg))
            return list(enc.render_conversation(inp.conversation, cfg))
        except (HarmonyError, ValueError, TypeError) as e:
            raise HarmonyRenderError(f"openai-harmony refused the conversation: {_short(e)}") from e

    def render_detailed(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                        add_generation_prompt: bool = True, kwargs: dict[str, Any] | None = None) -> HarmonyRendering:
        """:meth:`render`, with notes on what was ignored or inferred."""
        inp = self.to_harmony(messages, tools, kwargs)
        ids = self._ids(inp, "completion" if add_generation_prompt else "training")
        return HarmonyRendering(self.decode(ids), ids, inp.notes)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
               add_generation_prompt: bool = True, kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        """``(text, ids)``: ids from openai-harmony (with the generation prompt
        ``<|start|>assistant``: ``render_conversation_for_completion``; without:
        ``render_conversation_for_training``), text their decode with special tokens."""
        r = self.render_detailed(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        return r.text, r.token_ids

    def tool_turn(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        """``(text, ids)`` the conversation gains when ``new_messages`` follow ``history``: the
        completion render of both after ``render_conversation`` of ``history`` alone, once that
        is checked to be its id prefix (it is not when the new messages end in a final answer:
        Harmony then drops the history's analysis)."""
        if not isinstance(history, list) or not history:
            raise HarmonyRenderError("the tool turn needs the conversation before it (history)")
        if not isinstance(new_messages, list) or not new_messages:
            raise HarmonyRenderError("the tool turn needs at least one new message")
        before = self._ids(self.to_harmony(history, tools, kwargs), "context")
        after = self._ids(self.to_harmony(list(history) + list(new_messages), tools, kwargs), "completion")
        if after[: len(before)] != before:
            at = next((k for k, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))
            show = lambda ids: self.decode(ids[max(0, at - 3): at + 4])  # noqa: E731
            raise HarmonyRenderError(
                f"openai-harmony writes the earlier conversation differently once the new messages follow it (token "
                f"{at}: {show(before)!r} becomes {show(after)!r}), so the turn is not a suffix; Harmony drops analysis "
                "messages before the first final message when the last assistant message is a final one "
                "(auto_drop_analysis)")
        ids = after[len(before):]
        return self.decode(ids), ids


@lru_cache(maxsize=4)
def _byte_tables(tok: Any) -> tuple[dict[str, int], dict[int, str]]:
    """The byte-level alphabet's inverse and the added (special) tokens' text, per tokenizer."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return byte_of, {i: t.content for i, t in tok.added_tokens_decoder.items()}


# ---- trl's template against Harmony ------------------------------------------------------------


@dataclass
class _Segment:
    start: int  # token index of its <|start|> (or 0)
    ids: list[int]
    text: str

    @property
    def header(self) -> str:
        i = self.text.find(MESSAGE)
        return self.text if i < 0 else self.text[: i + len(MESSAGE)]

    @property
    def end(self) -> str:
        return next((e for e in _ENDS if self.text.endswith(e)), "")

    @property
    def body(self) -> str:
        i = self.text.find(MESSAGE)
        if i < 0:
            return ""
        return self.text[i + len(MESSAGE): len(self.text) - len(self.end)]

    @property
    def shown(self) -> str:
        """The message with its body shortened (the header and end token in full)."""
        return self.header + _clip(self.body, 60) + self.end if MESSAGE in self.text else _clip(self.text)

    @property
    def what(self) -> str:
        h = self.header.removeprefix(START).removesuffix(MESSAGE)
        role = re.split(r"[\s<]", h, maxsplit=1)[0] or "?"
        ch = re.search(r"<\|channel\|>(\w+)", h)
        return f"{role} {ch.group(1)}" if ch else role


def _segments(renderer: HarmonyRenderer, ids: list[int]) -> list[_Segment]:
    """The render cut before each ``<|start|>`` token: one segment per Harmony message."""
    start_id = renderer.tokenizer.convert_tokens_to_ids(START)
    cuts = [0] + [k for k, t in enumerate(ids) if t == start_id and k > 0] + [len(ids)]
    return [_Segment(a, ids[a:b], renderer.decode(ids[a:b])) for a, b in zip(cuts, cuts[1:]) if b > a]


def _clip(s: str, n: int = 90) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _first_diff(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _describe_pair(t: _Segment, h: _Segment) -> str:
    k = next((j for j, (x, y) in enumerate(zip(t.ids, h.ids)) if x != y), min(len(t.ids), len(h.ids)))
    parts = []
    if t.header != h.header:
        parts.append(f"header: trl writes {t.header!r}, harmony {h.header!r}")
    if t.body != h.body:
        if t.body == json.dumps(h.body, ensure_ascii=False):
            parts.append(f"trl quotes the body with tojson: {_clip(t.body)!r}, harmony writes it as is: {_clip(h.body)!r}")
        else:
            c = _first_diff(t.body, h.body)
            parts.append(f"body differs at character {c}: trl {_clip(t.body[max(0, c - 20): c + 40])!r}, "
                         f"harmony {_clip(h.body[max(0, c - 20): c + 40])!r}")
    if t.end != h.end:
        parts.append(f"trl ends it with {t.end or 'nothing'}, harmony with {h.end or 'nothing'}")
    if not parts:  # same text, other ids: a special token's name written as text on one side
        parts.append(f"same text, different ids ({t.ids[k] if k < len(t.ids) else '-'} vs "
                     f"{h.ids[k] if k < len(h.ids) else '-'}): one side encodes a special token's name as text")
    return (f"{t.what} message at trl token {t.start + k} / harmony token {h.start + k}: " + "; ".join(parts))


def _align(ts: list[_Segment], hs: list[_Segment]) -> list[tuple[str, _Segment | None, _Segment | None]]:
    """The messages of two renders that differ, aligned: by text first, then, inside a block
    that differs, by kind (role and channel), so a message only one side writes does not shift
    the pairs after it. ``("pair", t, h)``, ``("trl", t, None)`` or ``("harmony", None, h)``."""
    out: list[tuple[str, _Segment | None, _Segment | None]] = []
    texts = difflib.SequenceMatcher(None, [s.text for s in ts], [s.text for s in hs], autojunk=False)
    for op, i1, i2, j1, j2 in texts.get_opcodes():
        if op == "equal":
            continue
        a, b = ts[i1:i2], hs[j1:j2]
        kinds = difflib.SequenceMatcher(None, [s.what for s in a], [s.what for s in b], autojunk=False)
        for _, k1, k2, l1, l2 in kinds.get_opcodes():
            n = min(k2 - k1, l2 - l1)
            out += [("pair", a[k1 + d], b[l1 + d]) for d in range(n)]
            out += [("trl", s, None) for s in a[k1 + n:k2]]
            out += [("harmony", None, s) for s in b[l1 + n:l2]]
    return out


def _trl_ids(renderer: HarmonyRenderer, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any],
             add_generation_prompt: bool) -> tuple[str, list[int]]:
    tok = renderer.tokenizer
    try:
        text = tok.apply_chat_template(messages, tools=tools or None, chat_template=read_trl_template(TRL_TEMPLATE),
                                       add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - jinja2 errors, raise_exception(): the template refuses
        raise RenderError(template_error_text(e)) from e
    return text, tok.encode(text, add_special_tokens=False)


def template_differences(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                         kwargs: dict[str, Any] | None = None, *, add_generation_prompt: bool | None = None,
                         renderer: HarmonyRenderer | None = None, limit: int = 12) -> list[str]:
    """How trl's ``gptoss.jinja`` (through transformers) and openai-harmony render the same
    conversation, for the Template lab: an empty list when the ids are equal, else a first line
    with the sizes and the first differing token, then one line per Harmony message that
    differs (aligned message by message), each with its token position on both sides.

    ``add_generation_prompt`` defaults to true unless the last message is the assistant's. trl's
    template prints today's date and takes no date: unless ``kwargs`` pins
    ``conversation_start_date``, Harmony is given the date trl printed, so the list shows format
    differences, not the day. Harmony-only kwargs are not passed to the template."""
    renderer = renderer or HarmonyRenderer()
    kw = dict(kwargs or {})
    if add_generation_prompt is None:
        last = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else {}
        add_generation_prompt = last.get("role") != "assistant"
    h_text, h_ids = renderer.render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kw)
    try:
        t_text, t_ids = _trl_ids(renderer, messages, tools, {k: v for k, v in kw.items() if k not in _HARMONY_ONLY_KWARGS},
                                 add_generation_prompt)
    except RenderError as e:
        return [f"trl's {TRL_TEMPLATE} refuses this conversation ({_clip(str(e), 200)}); openai-harmony renders it "
                f"({len(h_ids)} ids)"]
    printed = re.search(r"Current date: (\d{4}-\d{2}-\d{2})", t_text)
    if "conversation_start_date" not in kw and printed:
        h_text, h_ids = renderer.render(messages, tools, add_generation_prompt=add_generation_prompt,
                                        kwargs={**kw, "conversation_start_date": printed.group(1)})
    if t_ids == h_ids:
        return []
    k = _first_diff(t_ids, h_ids)
    out = [f"trl's {TRL_TEMPLATE}: {len(t_ids)} ids, openai-harmony: {len(h_ids)} ids; first difference at token {k}"]
    ts, hs = _segments(renderer, t_ids), _segments(renderer, h_ids)
    uses_reasoning_key = any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("reasoning_content")
                             and not m.get("thinking") for m in messages)
    drops = kw.get("auto_drop_analysis", True)
    for kind, t, h in _align(ts, hs):
        if kind == "pair":
            assert t is not None and h is not None
            out.append(_describe_pair(t, h))
        elif t is not None:
            why = ""
            if t.what == "assistant analysis" and drops:
                why = (" (openai-harmony drops the analysis before the first final message when the last assistant "
                       "message is a final one: auto_drop_analysis)")
            out.append(f"only trl writes the {t.what} message (trl token {t.start}){why}: {t.shown!r}")
        elif h is not None:
            why = ""
            if h.what == "assistant analysis" and uses_reasoning_key:
                why = " (trl's template reads reasoning from `thinking` only, not `reasoning_content`)"
            out.append(f"only harmony writes the {h.what} message (harmony token {h.start}){why}: {h.shown!r}")
    if len(out) > limit:
        out = out[: limit - 1] + [f"… and {len(out) - limit + 1} more"]
    return out


# ---- the tool turn (trl's template) --------------------------------------------------------------


class GptOssRule(TurnRule):
    name = "gpt-oss"
    summary = "no edit: <|call|> is followed directly by the tool's <|start|>functions.NAME message"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return token_id(bundle.tokenizer, "<|call|>") is not None and token_id(bundle.tokenizer, "<|channel|>") is not None


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("gpt-oss", "gpt-oss", "gpt-oss (o200k + Harmony special tokens; trl gptoss.jinja)", "o200k_harmony",
            "gptoss.jinja", "harmony", stop_tokens=("<|call|>",),
            reasoning=("<|channel|>analysis<|message|>", "<|end|>"), template_kwargs=("reasoning_effort",)),
    Profile("gpt-oss-harmony", "gpt-oss",
            "gpt-oss rendered by openai-harmony's reference renderer (what the model was trained on; compare with "
            "trl's gptoss template in the Template lab)", "o200k_harmony", None, "harmony", stop_tokens=("<|call|>",),
            reasoning=("<|channel|>analysis<|message|>", "<|end|>"), template_kwargs=("reasoning_effort",),
            template="openai-harmony", renderer=HarmonyRenderer),
)
VOCABULARIES = (O200K_HARMONY,)
OWN_VOCABULARIES = ()
MODEL_NAMES = ((r"gpt-oss", "gpt-oss-harmony"),)
RULES = (EncoderRule, GptOssRule)
