"""Mistral (tekken v3): the profile, its vocabulary and renderer (mistral-common), the model names.

The vocabulary is the ``tekken_240911`` file that ``mistral-common`` ships; a turn ends with
``</s>``. A tool turn is what the encoder adds after a synthetic call turn, with no junction edit
(:mod:`backend.families.encoder`).

Mistral ships no chat template: a Mistral model's prompt ids are what mistral-common's
``MistralTokenizer.encode_chat_completion`` writes, and its control tokens (``[INST]``,
``[TOOL_CALLS]``, ``</s>``) never come out of encoding text. So the text-then-encode pipeline of
:mod:`backend.tokens.rendering` cannot be used: here the ids come first and the text is their decode
with the special tokens kept.

What mistral-common does that a trainer must know (tekken v3, ``tekken_240911``):

* the system prompt and ``[AVAILABLE_TOOLS]`` are written before the *last* user message, so a
  new user message re-renders the conversation before it (no tool-turn suffix then; tool
  messages after an assistant call keep the prefix);
* a tool result that is valid JSON is written as that JSON (``"42"`` becomes ``42``);
* tool-call ids must be exactly 9 ASCII letters/digits; our engine writes ``call_1_0``: such ids
  are mapped to a deterministic 9-character id (:func:`mistral_call_id`), the same for a call
  and its tool message, and the mapping is reported;
* an assistant message with both text and calls is refused; :class:`MistralRenderer` raises
  (``text_with_calls="error"``, the default: that is what a mistral-common pipeline does) or
  drops the text with a note (``"drop"``);
* a conversation ending with an assistant message is refused in ``test`` mode; it is encoded
  closed with ``</s>`` in ``finetuning`` mode (our ``add_generation_prompt=False``) and left open
  with ``continue_final_message`` (our ``kwargs={"continue_final_message": True}``).
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.resources
import json
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby
from typing import Any, Literal

from backend.errors import UserError
from backend.families.encoder import EncoderRule
from backend.families.profile import OwnVocabulary, Profile
from backend.tokens.template_errors import RenderError
from backend.trace.messages import decode_arguments

TOOL_CALLS = "[TOOL_CALLS]"
DEFAULT_TEKKEN = "tekken_240911"
MISTRAL_COMMON_VERSION = "1.13.1"  # the version pinned in requirements (constraints.txt)
TEMPLATE_NAME = f"mistral-common ({DEFAULT_TEKKEN})"  # what a Mistral bundle names as its "template"


def vocabulary_source(name: str = DEFAULT_TEKKEN) -> dict[str, str]:
    """Where the tekken vocabulary comes from (``profiles --json``)."""
    return {"package": "mistral-common", "version": MISTRAL_COMMON_VERSION, "file": f"mistral_common/data/{name}.json"}
_CALL_ID = re.compile(r"[a-zA-Z0-9]{9}")
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ROLES = ("system", "developer", "user", "assistant", "tool")
_KNOWN_KWARGS = ("continue_final_message",)


class MistralRenderError(RenderError, UserError):
    """mistral-common cannot encode these messages (or we refuse them first); says why.

    A :class:`~backend.tokens.rendering.RenderError` so the engine ends the run as for a template
    failure, and a :class:`~backend.errors.UserError` so the UI shows the message."""


# ---- the tokenizer ----------------------------------------------------------------------------


def tekken_names() -> list[str]:
    """The tekken tokenizer files shipped inside the installed mistral-common (no extension)."""
    data = importlib.resources.files("mistral_common") / "data"
    return sorted(p.name[: -len(".json")] for p in data.iterdir() if p.name.startswith("tekken_") and p.name.endswith(".json"))


def mistral_tokenizer(name: str = DEFAULT_TEKKEN) -> Any:
    """transformers' ``MistralCommonBackend`` over a tekken file shipped in mistral-common: the
    bundle's ``tokenizer`` (found through the package, so no path and no Hub); one per name."""
    names = tekken_names()
    if name not in names:
        raise MistralRenderError(f"no tekken tokenizer {name!r} in mistral-common; it ships {', '.join(names)}")
    return _load_tekken(name)


@lru_cache(maxsize=4)
def _load_tekken(name: str) -> Any:
    from transformers.tokenization_mistral_common import MistralCommonBackend

    path = importlib.resources.files("mistral_common") / "data" / f"{name}.json"
    with importlib.resources.as_file(path) as p:
        return MistralCommonBackend(tokenizer_path=str(p))


def _tekken(tokenizer: Any) -> Any:
    """The mistral-common ``Tekkenizer`` under a ``MistralCommonBackend``."""
    tk = tokenizer.tokenizer.instruct_tokenizer.tokenizer
    if not hasattr(tk, "id_to_byte_piece") or not hasattr(tk, "num_special_tokens"):
        raise MistralRenderError(f"{type(tk).__name__} is not a tekken tokenizer; only tekken files are supported here")
    return tk


def decode_with_offsets(tokenizer: Any, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` (special tokens kept) and each token's character span in it.

    ``MistralCommonBackend`` refuses ``return_offsets_mapping``; this is its replacement. The
    text is exactly mistral-common's decode: like it, special and ordinary tokens are decoded in
    runs, bytes that are not UTF-8 become U+FFFD. The tokens that share the bytes of one character all
    cover that character (as a fast tokenizer's offsets do)."""
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    tk = _tekken(tokenizer)
    n_special = tk.num_special_tokens
    vocab = tk.n_words
    parts: list[str] = []
    offsets: list[tuple[int, int]] = []
    pos = 0
    for special, group in groupby(ids, lambda t: t < n_special):
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for t in group:
            if not isinstance(t, int) or t < 0 or t >= vocab:
                raise MistralRenderError(f"token id {t!r} is not in this vocabulary (0..{vocab - 1})")
            piece = tk.id_to_byte_piece(t, SpecialTokenPolicy.KEEP)
            s = piece.decode("utf-8") if special else dec.decode(piece)
            parts.append(s)
            # bytes left pending belong to the next character: this token covers it too
            offsets.append((pos, pos + len(s) + (1 if not special and dec.getstate()[0] else 0)))
            pos += len(s)
        if not special:
            tail = dec.decode(b"", final=True)  # an unfinished character at the end of a run: U+FFFD
            parts.append(tail)
            pos += len(tail)
    return "".join(parts), offsets


# ---- tool-call ids ------------------------------------------------------------------------------


def mistral_call_id(call_id: str) -> str:
    """``call_id`` when it is already 9 ASCII letters/digits (what mistral-common accepts), else
    a 9-character id derived from it: the same input always gives the same id, so a call and its
    tool message, and the history and the longer conversation, agree."""
    if _CALL_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode("utf-8")).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, 62)
        out.append(_ALPHABET[r])
    return "".join(out)


# ---- the renderer -------------------------------------------------------------------------------


@dataclass
class MistralRendering:
    """A render, with what was changed to make mistral-common accept it."""

    text: str
    token_ids: list[int]
    id_map: dict[str, str] = field(default_factory=dict)  # our call id -> the 9-character id written
    notes: list[str] = field(default_factory=list)


def _short(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    text = " ".join(lines[:3]) if lines else type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


class MistralRenderer:
    """Renders HF-format messages through mistral-common's ``encode_chat_completion``.

    The request is built with ``ChatCompletionRequest.from_openai`` and encoded by the
    ``MistralTokenizer`` inside the ``MistralCommonBackend``: the same two calls that
    ``MistralCommonBackend.apply_chat_template(tokenize=True)`` makes, minus its wrapper, which
    fixes the validation mode at load time (a conversation ending with an assistant message needs
    ``finetuning`` mode) and turns every refusal into a bare ``ValueError``."""

    template_name = TEMPLATE_NAME  # what a bundle rendered by it names as its template

    def __init__(self, tokenizer: Any | None = None, *, text_with_calls: Literal["error", "drop"] = "error") -> None:
        if text_with_calls not in ("error", "drop"):
            raise MistralRenderError(f"text_with_calls must be 'error' or 'drop', not {text_with_calls!r}")
        self.tokenizer = tokenizer if tokenizer is not None else mistral_tokenizer()
        self.text_with_calls = text_with_calls
        self._mt = self.tokenizer.tokenizer  # mistral-common MistralTokenizer (test mode)
        self._tk = _tekken(self.tokenizer)
        self.version = str(self._tk.version.value)  # "v3" for both shipped tekken files
        self._lock = threading.Lock()
        self._ft: Any = None

    # ---- mistral-common in its two modes ----
    def _finetuning(self) -> Any:
        """The same instruct tokenizer with the ``finetuning`` validator: it accepts (and closes
        with ``</s>``) a conversation that ends with an assistant message."""
        with self._lock:
            if self._ft is None:
                from mistral_common.protocol.instruct.normalize import get_normalizer
                from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
                from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

                self._ft = MistralTokenizer(
                    self._mt.instruct_tokenizer,
                    validator=get_validator(self._tk.version, mode=ValidationMode.finetuning),
                    request_normalizer=get_normalizer(self._tk.version, self._tk.model_settings_builder),
                )
            return self._ft

    def encode_generated(self, text: str) -> list[int]:
        """The ids a model generated for ``text`` (see :func:`encode_generated`)."""
        return encode_generated(self.tokenizer, text)

    def decode_with_offsets(self, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """The text of ``ids`` and each token's character span in it (see :func:`decode_with_offsets`)."""
        return decode_with_offsets(self.tokenizer, ids)

    def decode(self, ids: list[int]) -> str:
        """mistral-common's decode with the special tokens kept."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        return self._tk.decode(list(ids), special_token_policy=SpecialTokenPolicy.KEEP)

    # ---- input checks ----
    def _arguments(self, args: Any, where: str) -> dict[str, Any]:
        if isinstance(args, str) and not args.strip():  # not JSON: mistral-common would not encode it
            raise MistralRenderError(f"{where}: arguments are an empty string, not a JSON object")
        value, problem = decode_arguments(args)
        if problem is not None:
            raise MistralRenderError(f"{where}: {problem}")
        return value

    def _normalize(self, messages: Any, notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Copies of ``messages`` that mistral-common accepts: ids mapped, arguments as objects,
        reasoning dropped where the tokenizer has no thinking tokens; refuses what it cannot
        render faithfully."""
        if not isinstance(messages, list) or not messages:
            raise MistralRenderError("messages must be a non-empty list of chat messages")
        id_map: dict[str, str] = {}
        owners: dict[str, str] = {}  # written id -> our id, to catch two ids mapped to one
        pending: list[str] = []  # written ids of the last assistant's calls not yet answered

        def written(raw: str) -> str:
            new = mistral_call_id(raw)
            if owners.setdefault(new, raw) != raw:
                raise MistralRenderError(f"tool-call ids {owners[new]!r} and {raw!r} both become {new!r} for mistral-common")
            if new != raw:
                id_map[raw] = new
            return new

        thinking = self.version not in ("v1", "v2", "v3", "v7")
        out: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise MistralRenderError(f"message {i} is {type(m).__name__}, not a chat message object")
            role = m.get("role")
            if role not in _ROLES:
                raise MistralRenderError(f"message {i} has role {role!r}; mistral-common knows {', '.join(_ROLES)}")
            mm = dict(m)
            if role == "assistant":
                for key in ("reasoning_content", "reasoning"):
                    if key in mm and not thinking:
                        if mm.pop(key):
                            notes.append(f"message {i}: {key} dropped (tokenizer {self.version} has no thinking tokens)")
                calls = mm.get("tool_calls")
                if calls is not None and not isinstance(calls, list):
                    raise MistralRenderError(f"message {i}: tool_calls must be a list, got {type(calls).__name__}")
                if calls:
                    if mm.get("content"):
                        if self.text_with_calls == "error":
                            raise MistralRenderError(
                                f"message {i}: mistral-common refuses an assistant message with both text and tool "
                                f"calls (text {str(mm['content'])[:40]!r}); a mistral-common training pipeline cannot "
                                "encode this turn")
                        notes.append(f"message {i}: text {str(mm['content'])[:40]!r} dropped, mistral-common encodes an "
                                     "assistant message with calls only without its text")
                    mm["content"] = None
                    new_calls = []
                    pending = []
                    for j, c in enumerate(calls):
                        where = f"message {i}, tool call {j}"
                        if not isinstance(c, dict):
                            raise MistralRenderError(f"{where} is {type(c).__name__}, not an object")
                        fn = c.get("function") if isinstance(c.get("function"), dict) else c
                        name = fn.get("name")
                        if not isinstance(name, str) or not name:
                            raise MistralRenderError(f"{where} has no function name")
                        raw = c.get("id")
                        if raw is not None and not isinstance(raw, str):
                            raise MistralRenderError(f"{where}: id must be a string, got {type(raw).__name__}")
                        if not raw:  # no id: one derived from the position, answered in order
                            raw = f"#message{i}call{j}"
                            notes.append(f"{where} has no id: {mistral_call_id(raw)!r} written")
                        cid = written(raw)
                        pending.append(cid)
                        new_calls.append({"id": cid, "type": "function",
                                          "function": {"name": name, "arguments": self._arguments(fn.get("arguments"), where)}})
                    mm["tool_calls"] = new_calls
                else:
                    mm.pop("tool_calls", None)
                    pending = []
            elif role == "tool":
                raw = mm.get("tool_call_id")
                if raw is not None and not isinstance(raw, str):
                    raise MistralRenderError(f"message {i}: tool_call_id must be a string, got {type(raw).__name__}")
                if raw:
                    cid = written(raw)
                    if cid in pending:
                        pending.remove(cid)
                elif pending:
                    cid = pending.pop(0)
                    notes.append(f"message {i}: tool message without tool_call_id answers call {cid!r} (in order)")
                else:
                    raise MistralRenderError(f"message {i}: tool message without tool_call_id and no call left to answer")
                mm["tool_call_id"] = cid
            else:
                pending = []
            out.append(mm)
        if id_map:
            notes.append("tool-call ids mapped to mistral-common's 9 letters/digits: "
                         + ", ".join(f"{k!r}->{v!r}" for k, v in id_map.items()))
        return out, id_map

    @staticmethod
    def _tools(tools: Any) -> list[dict[str, Any]] | None:
        if not tools:
            return None
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
            raise MistralRenderError("tools must be a list of OpenAI tool definitions ({'type': 'function', 'function': {...}})")
        return tools

    @staticmethod
    def _kwargs(kwargs: dict[str, Any] | None, notes: list[str]) -> bool:
        kwargs = dict(kwargs or {})
        cont = kwargs.pop("continue_final_message", False)
        if not isinstance(cont, bool):
            raise MistralRenderError(f"continue_final_message must be true or false, not {cont!r}")
        if kwargs:
            notes.append(f"ignored {', '.join(sorted(kwargs))}: mistral-common's encoder takes only "
                         f"{', '.join(_KNOWN_KWARGS)}")
        return cont

    # ---- rendering ----
    def render_detailed(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: dict[str, Any] | None = None,
    ) -> MistralRendering:
        """:meth:`render`, with the id mapping and notes on what was changed."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        notes: list[str] = []
        cont = self._kwargs(kwargs, notes)
        msgs, id_map = self._normalize(messages, notes)
        last = msgs[-1]["role"]
        encoder = self._mt
        if last == "assistant":
            if add_generation_prompt and not cont:
                raise MistralRenderError(
                    "the conversation ends with an assistant message: there is no generation prompt to add after it "
                    "(render it with add_generation_prompt=False to close it with </s>, or continue_final_message)")
            if not cont:
                encoder = self._finetuning()
        elif cont:
            raise MistralRenderError(f"continue_final_message needs a conversation that ends with an assistant message, "
                                     f"not {last!r}")
        elif not add_generation_prompt:
            notes.append("mistral-common writes no generation prompt: the ids are the same with and without it")
        try:
            req = ChatCompletionRequest.from_openai(messages=msgs, tools=self._tools(tools), continue_final_message=cont)
            tokens = list(encoder.encode_chat_completion(req).tokens)
        except MistralRenderError:
            raise
        except (MistralCommonException, ValueError, TypeError, AssertionError, KeyError) as e:
            raise MistralRenderError(f"mistral-common refused the conversation: {_short(e)}") from e
        return MistralRendering(self.decode(tokens), tokens, id_map, notes)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """``(text, ids)``: ids from mistral-common, text their decode with special tokens."""
        r = self.render_detailed(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        return r.text, r.token_ids

    def _split(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: Any,
               kwargs: dict[str, Any] | None) -> tuple[MistralRendering, MistralRendering, int | None]:
        """The history closed (no generation prompt), the whole conversation with it, and the
        first token where the second stops starting with the first (None: it is a prefix)."""
        if not isinstance(new_messages, list) or not new_messages:
            raise MistralRenderError("the tool turn needs at least one new message")
        if not isinstance(history, list) or not history:
            raise MistralRenderError("the tool turn needs the conversation before it (history)")
        before = self.render_detailed(history, tools, add_generation_prompt=False, kwargs=kwargs)
        after = self.render_detailed(list(history) + list(new_messages), tools, add_generation_prompt=True, kwargs=kwargs)
        a, b = before.token_ids, after.token_ids
        if b[: len(a)] == a:
            return before, after, None
        at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return before, after, at

    def render_prefix_ok(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> bool:
        """Whether the history's render (its last assistant message closed with ``</s>``) is a
        token prefix of the render with ``new_messages``, i.e. whether :meth:`tool_turn` has an
        answer. True for tool messages after an assistant call; False for a new user message
        when there are tools or a system prompt (mistral-common moves them to the last user
        message). Messages mistral-common refuses still raise."""
        return self._split(history, new_messages, tools, kwargs)[2] is None

    def tool_turn(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        """``(text, ids)`` the conversation gains when ``new_messages`` follow ``history``: the
        render of both with the generation prompt, after the render of ``history`` alone, once
        that render is checked to be its prefix."""
        before, after, at = self._split(history, new_messages, tools, kwargs)
        if at is not None:
            show = lambda ids: self.decode(ids[max(0, at - 3): at + 3])  # noqa: E731
            raise MistralRenderError(
                f"mistral-common writes the earlier conversation differently once the new messages follow it (token "
                f"{at}: {show(before.token_ids)!r} becomes {show(after.token_ids)!r}), so the turn is not a suffix; "
                "mistral-common moves the system prompt and the tools to the last user message")
        ids = after.token_ids[len(before.token_ids):]
        text = after.text[len(before.text):] if after.text.startswith(before.text) else self.decode(ids)
        return text, ids

    # ---- what the model writes ----
    def _calls_json(self, calls: list[dict[str, Any]]) -> str:
        items = []
        for j, c in enumerate(calls):
            if not isinstance(c, dict):
                raise MistralRenderError(f"tool call {j} is {type(c).__name__}, not an object")
            fn = c.get("function") if isinstance(c.get("function"), dict) else c
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise MistralRenderError(f"tool call {j} has no function name")
            d: dict[str, Any] = {"name": name, "arguments": self._arguments(fn.get("arguments"), f"tool call {j}")}
            if c.get("id"):
                d["id"] = mistral_call_id(str(c["id"]))
            items.append(d)
        return json.dumps(items, ensure_ascii=False)

    def format_text_calls(self, calls: list[dict[str, Any]]) -> str:
        """The text of an assistant tool-call turn as mistral-common writes it for tekken v3:
        ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (no space, ``json.dumps``
        separators, non-ASCII kept), without the closing ``</s>``. Calls as our parsers give them
        (``name``/``arguments``/``id``) or in HF format (``function``)."""
        if not calls:
            raise MistralRenderError("no tool calls to format")
        return TOOL_CALLS + self._calls_json(calls)

    def format_call_ids(self, calls: list[dict[str, Any]], *, eos: bool = True) -> list[int]:
        """The ids of :meth:`format_text_calls` as mistral-common encodes them: the
        ``[TOOL_CALLS]`` control token, the JSON's ids, ``</s>``."""
        if not calls:
            raise MistralRenderError("no tool calls to format")
        ids = [self._tk.get_special_token(TOOL_CALLS), *self._tk.encode(self._calls_json(calls), bos=False, eos=False)]
        return ids + [self._tk.eos_id] if eos else ids


# ---- text a model generates, with its control tokens ------------------------------------------


_CONTROL_NAMES = re.compile(r"</?s>|\[/?[A-Z_]{2,32}\]|<pad>|<unk>")


def encode_generated(tokenizer: Any, text: str) -> list[int]:
    """The ids a model generated for ``text``: control-token names (``[TOOL_CALLS]``, ``</s>``,
    ``[/INST]``, ...) become their control ids, the rest is ordinary text. ``encode`` never
    produces control ids (mistral-common's policy for text from outside), but a scripted or
    imported assistant turn's ``[TOOL_CALLS]`` is the token the model wrote."""
    tk = _tekken(tokenizer)
    out: list[int] = []
    pos = 0
    for m in _CONTROL_NAMES.finditer(text):
        try:
            tid = tk.get_special_token(m.group())
        except Exception:  # noqa: BLE001 - not a control token of this vocabulary: plain text
            continue
        if m.start() > pos:
            out += tk.encode(text[pos:m.start()], bos=False, eos=False)
        out.append(tid)
        pos = m.end()
    if pos < len(text):
        out += tk.encode(text[pos:], bos=False, eos=False)
    return out


def token_bytes(tokenizer: Any, tid: int) -> tuple[bytes, bool]:
    """A tekken token's bytes and whether it is a control token (``[INST]``, ``</s>``, ...): what
    the token view shows for one id (``convert_ids_to_tokens`` gives U+FFFD for byte pieces)."""
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    tk = _tekken(tokenizer)
    if not 0 <= tid < tk.n_words:
        raise MistralRenderError(f"token id {tid} is not in this vocabulary (0..{tk.n_words - 1})")
    return tk.id_to_byte_piece(tid, SpecialTokenPolicy.KEEP), tid < tk.num_special_tokens


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("mistral", "mistral",
            "Mistral (tekken v3 vocabulary; ids from mistral-common's encoder, no Jinja template; [TOOL_CALLS] JSON list)",
            "mistral-tekken", None, "mistral", template="mistral-common", renderer=MistralRenderer),
)
VOCABULARIES = ()
OWN_VOCABULARIES = (OwnVocabulary("mistral-tekken", vocabulary_source(), "</s>"),)  # the renderer brings the tokenizer
MODEL_NAMES = ((r"mistral|ministral|devstral|magistral", "mistral"),)
RULES = (EncoderRule,)
