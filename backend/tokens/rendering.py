"""Render messages + tools through a chat template to text and token ids.

Two jobs:

* :func:`render` — the whole conversation, with per-message character and token spans, so the
  UI can link a message to its tokens (and the tokens to the loop step that added them).
* :func:`render_tool_turn` — verl's way of tokenizing the context injected after a tool call:
  render only the new messages with the generation prompt, then strip the prefix the template
  writes for an empty conversation (Qwen2.5's default system prompt, for example).

Tokenization is always ``encode(text, add_special_tokens=False)`` of the rendered text, which
is what ``apply_chat_template(tokenize=True)`` does; tests hold the two equal.

Every entry point renders the messages as :func:`prepare_messages` makes them first, so the app's
pages, the command line and the MCP tools take the same inputs: content ``null`` is ``""`` (trl's
gpt-oss template fails on it, GLM's and MiniMax's write ``None``); content given as a list of parts
reaches a template that reads parts as it is, and any other template as its text parts joined with
a space (what transformers' server does for a text-only model; vLLM joins them with newlines);
a part with no text (an image, audio) is never sent to a family's own encoder (mistral-common would
fetch an image URL) and is reported (:func:`content_notes`), never dropped silently; and a
malformed ``tool_calls`` entry is an error that names the call and the field, before the template
fails on it with ``Undefined``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from backend.tokens.template_errors import RenderError, template_error_text  # noqa: F401 - RenderError: re-exported
from backend.trace import MessageSpan
from backend.trace.model import StepInfo


class Bundle(Protocol):
    """What rendering reads of a tokenizer bundle (:class:`backend.loading.tokenizers.TokenizerBundle`),
    described here so that rendering imports neither the tokenizer layer nor a family: the
    families' continuation rules render through this module, and the tokenizer layer reads the
    families' table."""

    tokenizer: Any
    template_name: str
    chat_template: str
    chat_template_kwargs: dict[str, Any]
    untrusted_template: bool
    # a family rendered by its own encoder: ``render``, ``tool_turn``, ``decode_with_offsets``
    renderer: Any


@dataclass
class Rendering:
    text: str
    token_ids: list[int]
    offsets: list[tuple[int, int]] = field(default_factory=list)  # char span of each token
    message_spans: list[MessageSpan] = field(default_factory=list)
    spans_exact: bool = True  # False when the template re-renders earlier messages differently
    # what was sent that the rendering does not show (content parts without text): :func:`content_notes`
    notes: list[str] = field(default_factory=list)

    def to_dict(self, tokenizer: Any | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "text": self.text,
            "token_ids": self.token_ids,
            "num_tokens": len(self.token_ids),
            "message_spans": [s.model_dump() for s in self.message_spans],
            "spans_exact": self.spans_exact,
            "notes": list(self.notes),
        }
        if tokenizer is not None:
            d["tokens"] = tokenizer.convert_ids_to_tokens(self.token_ids)
        return d


def _template_kwargs(bundle: Bundle, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(bundle.chat_template_kwargs)
    if kwargs:
        merged.update(kwargs)
    return merged


# ---- messages as a template takes them ---------------------------------------------------------

# content-part types that carry text (OpenAI chat, and the Responses API's input / output text)
TEXT_PART_TYPES = ("text", "input_text", "output_text")
# how text parts are joined for a template that takes text only: transformers' server joins a text
# model's parts with a space (transformers/cli/serving/utils.py); a template that reads parts
# joins them itself
PARTS_JOINER = " "
_CALL_SHAPE = '{"type": "function", "function": {"name": <text>, "arguments": <an object or its JSON text>}}'
_MAX_PART_NOTES = 20


def _part_text(part: Any, where: str) -> str | None:
    """A content part's text, None for a part without text (an image, audio, a file); RenderError
    for something that is no part."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise RenderError(f"{where} is {type(part).__name__}: a content part is an object such as "
                          '{"type": "text", "text": "..."}')
    kind = part.get("type")
    if kind in TEXT_PART_TYPES or (kind is None and "text" in part):
        text = part.get("text")
        if not isinstance(text, str):
            raise RenderError(f"{where} is a {kind or 'text'} part whose text is "
                              f"{'missing' if text is None else type(text).__name__}; send it as text")
        return text
    return None


def _part_kind(part: Any) -> str:
    return str(part.get("type") or "untyped") if isinstance(part, dict) else type(part).__name__


def _tool_calls(calls: Any, where: str) -> list[Any]:
    """``calls`` checked (RenderError naming the call and the field) and in the nested form every
    template reads: a flat ``{"name", "arguments"}`` call, which some templates take and others
    fail on, gets its ``function``; anything else is kept as it is."""
    if not isinstance(calls, list):
        raise RenderError(f"{where} is {type(calls).__name__}: send a list of calls, each {_CALL_SHAPE}")
    out: list[Any] = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise RenderError(f"{at} is {type(call).__name__}: each call is {_CALL_SHAPE}")
        fn = call.get("function")
        if fn is None and ("name" in call or "arguments" in call):  # the flat form
            fn, fat = {k: call[k] for k in ("name", "arguments") if k in call}, at
            call = {**{k: v for k, v in call.items() if k not in ("name", "arguments")}, "type": call.get("type") or "function",
                    "function": fn}
        else:
            fat = f"{at}.function"
            if fn is None:
                raise RenderError(f"{at} has no function: each call is {_CALL_SHAPE}")
            if not isinstance(fn, dict):
                raise RenderError(f"{fat} is {type(fn).__name__}: it is {{\"name\": ..., \"arguments\": ...}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            what = "missing" if name is None else "empty" if isinstance(name, str) else f"{type(name).__name__}, not text"
            raise RenderError(f"{fat}.name is {what}: each call names its tool ({_CALL_SHAPE})")
        if "arguments" not in fn:
            raise RenderError(f"{fat}.arguments is missing (call {name!r}): send an object, or {{}} for none")
        args = fn["arguments"]
        if not isinstance(args, (dict, str)):
            raise RenderError(f"{fat}.arguments is {'null' if args is None else type(args).__name__} (call {name!r}): "
                              "send an object, or its JSON text")
        out.append(call)
    return out


def prepare_messages(bundle: Bundle, messages: list[dict[str, Any]], chat_template: str | None = None,
                     chat_template_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``messages`` as the template (or the family's encoder) is given them: the same list when
    nothing needs to change, else copies of the messages that do (the caller's are never
    changed). See the module's docstring; RenderError for a content part or a tool call that
    cannot be rendered, naming it."""
    if not isinstance(messages, list):
        return messages
    encoder = bundle.renderer is not None
    parts_ok: bool | None = None  # whether the template reads content parts (asked once, when a list is met)
    out: list[dict[str, Any]] | None = None
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        new: dict[str, Any] | None = None
        content = m.get("content", "")
        if content is None and not encoder:  # the encoders take None as they take ""
            new = {**m, "content": ""}
        elif isinstance(content, list):
            texts = [_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content)]
            if not encoder and parts_ok is None:
                parts_ok = template_reads_parts(bundle, chat_template, chat_template_kwargs)
            if encoder or parts_ok:  # parts, each text part as {"type": "text"}; no part without text reaches an encoder
                parts = [p if t is None or (isinstance(p, dict) and p.get("type") == "text") else {"type": "text", "text": t}
                         for p, t in zip(content, texts) if t is not None or not encoder]
                if len(parts) != len(content) or any(a is not b for a, b in zip(parts, content)):
                    new = {**m, "content": parts}
            else:
                new = {**m, "content": PARTS_JOINER.join(t for t in texts if t is not None)}
        if m.get("tool_calls") is not None:
            calls = _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
            if any(a is not b for a, b in zip(calls, m["tool_calls"])):
                new = {**(new or m), "tool_calls": calls}
        for key in ("reasoning_content", "thinking", "reasoning"):  # a null here fails templates as content does
            if key in m and m[key] is None and not encoder:
                new = {k: v for k, v in (new or m).items() if k != key}
        if new is not None:
            if out is None:
                out = list(messages)
            out[i] = new
    return messages if out is None else out


_PROBE = "Zq7 probe text"
_READS_PARTS: OrderedDict[str, bool] = OrderedDict()
_READS_PARTS_LOCK = threading.Lock()
_READS_PARTS_MAX = 256


def template_reads_parts(bundle: Bundle, chat_template: str | None = None,
                         chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the template renders a user message given as ``[{"type": "text", "text": X}]`` as it
    renders the text ``X`` (Qwen3.5's, Gemma 3's, GLM's, SmolLM's do; Qwen3's writes an empty turn,
    Llama 3.1's the Python repr of the list, gpt-oss' and DeepSeek's fail). Found by rendering
    both, once per template text (and switches); a template that fails on either takes text only.
    A guarded template's limits (time, size, a busy pool) are raised, as its render would be."""
    from backend.tokens.template_guard import TemplateGuardError

    text = chat_template or bundle.chat_template or ""
    kw = _template_kwargs(bundle, chat_template_kwargs)
    key = hashlib.sha256(repr((text, sorted(kw.items(), key=str))).encode("utf-8", "surrogatepass")).hexdigest()
    with _READS_PARTS_LOCK:
        hit = _READS_PARTS.get(key)
        if hit is not None:
            _READS_PARTS.move_to_end(key)
            return hit
    try:
        as_text = _render_template(bundle, [{"role": "user", "content": _PROBE}], None, False, chat_template_kwargs, chat_template)
        as_parts = _render_template(bundle, [{"role": "user", "content": [{"type": "text", "text": _PROBE}]}], None, False,
                                    chat_template_kwargs, chat_template)
        reads = as_text == as_parts
    except RenderError as e:
        if isinstance(e.__cause__, TemplateGuardError):
            raise
        reads = False
    with _READS_PARTS_LOCK:
        _READS_PARTS[key] = reads
        while len(_READS_PARTS) > _READS_PARTS_MAX:
            _READS_PARTS.popitem(last=False)
    return reads


def content_notes(bundle: Bundle, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str, *,
                  add_generation_prompt: bool, chat_template_kwargs: dict[str, Any] | None = None,
                  chat_template: str | None = None) -> list[str]:
    """The content parts that ``text`` (the rendering of ``messages``) does not show, one note each
    (the first 20, then a count): parts without text given to a template that takes text only, or
    to a family's encoder, are not rendered; a template that reads parts may write a placeholder
    of its own for them (Qwen3.5's ``<|image_pad|>``, Gemma 3's ``<start_of_image>``), which is
    said too, found by rendering again without them: the image itself is never tokenized here."""
    where = [(i, j, _part_kind(p)) for i, m in enumerate(messages) if isinstance(m, dict) and isinstance(m.get("content"), list)
             for j, p in enumerate(m["content"]) if _part_text(p, f"messages[{i}].content[{j}]") is None]
    if not where:
        return []
    if bundle.renderer is not None:
        how = f"{bundle.template_name} encodes text only"
    elif not template_reads_parts(bundle, chat_template, chat_template_kwargs):
        how = f"the template {bundle.template_name!r} takes text only (the text parts are joined with a space)"
    else:
        stripped = [{**m, "content": [p for p in m["content"] if _part_text(p, "") is not None]}
                    if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in messages]
        without = render_text(bundle, stripped, tools, add_generation_prompt=add_generation_prompt,
                              chat_template_kwargs=chat_template_kwargs, chat_template=chat_template)
        if without == text:
            how = f"the template {bundle.template_name!r} writes nothing for it"
        else:
            return [f"messages[{i}].content[{j}] ({kind}): the template {bundle.template_name!r} writes a placeholder of its "
                    "own in its place; the part itself is not tokenized here (a model's processor would expand it)"
                    for i, j, kind in where[:_MAX_PART_NOTES]] + _more_parts(where)
    return [f"messages[{i}].content[{j}] ({kind}) is not rendered: {how}" for i, j, kind in where[:_MAX_PART_NOTES]] + \
        _more_parts(where)


def _more_parts(where: list[Any]) -> list[str]:
    n = len(where) - _MAX_PART_NOTES
    return [f"... and {n} more content part(s) without text"] if n > 0 else []


def render_text(
    bundle: Bundle,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    chat_template: str | None = None,
) -> str:
    """The template's text for ``messages`` (transformers' sandboxed Jinja environment; user
    templates additionally in the guarded worker process; a family rendered by its own encoder,
    Mistral's mistral-common, the decode of that encoder's ids), as :func:`prepare_messages`
    gives them."""
    messages = prepare_messages(bundle, messages, chat_template, chat_template_kwargs)
    if bundle.renderer is not None:
        return bundle.renderer.render(messages, tools or None, add_generation_prompt=add_generation_prompt,
                                      kwargs=_template_kwargs(bundle, chat_template_kwargs))[0]
    return _render_template(bundle, messages, tools, add_generation_prompt, chat_template_kwargs, chat_template)


def _render_template(bundle: Bundle, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     add_generation_prompt: bool, chat_template_kwargs: dict[str, Any] | None,
                     chat_template: str | None) -> str:
    """The template's text for ``messages`` as they are."""
    if bundle.untrusted_template or chat_template is not None and chat_template != bundle.chat_template:
        from backend.tokens.template_guard import TemplateGuardError, guarded_render

        try:
            return guarded_render(
                chat_template or bundle.chat_template, messages, tools or None,
                add_generation_prompt=add_generation_prompt,
                kwargs={**bundle.tokenizer.special_tokens_map, **_template_kwargs(bundle, chat_template_kwargs)},
            )
        except TemplateGuardError as e:
            raise RenderError(f"chat template {bundle.template_name!r} stopped: {e}") from e
        except ValueError as e:
            raise RenderError(f"chat template {bundle.template_name!r} failed: {e}") from e
    try:
        out = bundle.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=chat_template or bundle.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **_template_kwargs(bundle, chat_template_kwargs),
        )
    except Exception as e:  # jinja2 TemplateError, SecurityError, raise_exception(), TypeError ...
        raise RenderError(f"chat template {bundle.template_name!r} failed: {template_error_text(e)}") from e
    if not isinstance(out, str):  # batched input or a template returning something odd
        raise RenderError(f"chat template {bundle.template_name!r} did not render to text")
    return out


def render_ids(
    bundle: Bundle,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """``(text, ids)`` of ``messages``: the template's text encoded, or, for a family rendered by
    its own encoder (Mistral), that encoder's ids and their decode."""
    if bundle.renderer is not None:
        messages = prepare_messages(bundle, messages)
        return bundle.renderer.render(messages, tools or None, add_generation_prompt=add_generation_prompt,
                                      kwargs=_template_kwargs(bundle, chat_template_kwargs))
    text = render_text(bundle, messages, tools, add_generation_prompt=add_generation_prompt,
                       chat_template_kwargs=chat_template_kwargs)
    return text, encode(bundle, text)


def _fast(bundle: Bundle):
    """The Rust tokenizer under a transformers fast tokenizer, or None. Calling it directly
    skips ~0.3 ms of Python wrapping per call; tests hold the results equal to
    ``apply_chat_template(tokenize=True)``."""
    return getattr(bundle.tokenizer, "backend_tokenizer", None) if getattr(bundle.tokenizer, "is_fast", False) else None


def encode(bundle: Bundle, text: str) -> list[int]:
    fast = _fast(bundle)
    if fast is not None:
        return fast.encode(text, add_special_tokens=False).ids
    return bundle.tokenizer.encode(text, add_special_tokens=False)


def decode(bundle: Bundle, ids: list[int]) -> str:
    """Text of ``ids`` with special tokens kept (what the model emitted, verbatim)."""
    fast = _fast(bundle)
    if fast is not None:
        return fast.decode(ids, skip_special_tokens=False)
    return bundle.tokenizer.decode(ids, skip_special_tokens=False)


def encode_with_offsets(bundle: Bundle, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = bundle.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on the first difference
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def message_char_spans(
    bundle: Bundle,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    full_text: str,
    chat_template_kwargs: dict[str, Any] | None = None,
    chat_template: str | None = None,
) -> tuple[list[tuple[int, int]], bool]:
    """Character span of each message in ``full_text``.

    Message ``i`` ends where the render of ``messages[:i+1]`` stops agreeing with the full
    render. That is exact for templates whose output for a prefix is a prefix of the output
    (most). A prefix render may close its last message differently (Qwen3 groups consecutive
    tool messages in one block); that only moves the boundary inside that message. Templates
    that rewrite *earlier* turns depending on later ones (Qwen3 drops old ``<think>`` blocks)
    give approximate spans, reported by ``exact=False``.
    """
    spans: list[tuple[int, int]] = []
    exact = True
    prev = 0
    for i in range(len(messages)):
        try:
            t = render_text(bundle, messages[: i + 1], tools, chat_template_kwargs=chat_template_kwargs, chat_template=chat_template)
        except RenderError:
            exact = False
            t = ""
        end = _common_prefix_len(t, full_text)
        if end < prev:
            exact = False  # text before this message differs from the full render
        end = max(end, prev)
        content = messages[i].get("content") if isinstance(messages[i], dict) else None
        if isinstance(content, str) and content and content not in full_text[prev:end]:
            exact = False  # the boundary fell inside this message
        spans.append((prev, end))
        prev = end
    return spans, exact


def char_spans_to_token_spans(offsets: list[tuple[int, int]], char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Assign each token to the span that contains its first character."""
    out: list[tuple[int, int]] = []
    t = 0
    n = len(offsets)
    for cs, ce in char_spans:
        start = t
        while t < n and offsets[t][0] < ce:
            t += 1
        out.append((start, t))
    return out


def render(
    bundle: Bundle,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: dict[str, Any] | None = None,
    chat_template: str | None = None,
    spans: bool = True,
) -> Rendering:
    if bundle.renderer is not None:  # ids from the family's encoder; the text is their decode
        _, ids = bundle.renderer.render(prepare_messages(bundle, messages), tools or None, add_generation_prompt=add_generation_prompt,
                                        kwargs=_template_kwargs(bundle, chat_template_kwargs))
        text, offsets = bundle.renderer.decode_with_offsets(ids)
    else:
        text = render_text(
            bundle,
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            chat_template=chat_template,
        )
        ids, offsets = encode_with_offsets(bundle, text)
    r = Rendering(text=text, token_ids=ids, offsets=offsets)
    r.notes = content_notes(bundle, messages, tools, text, add_generation_prompt=add_generation_prompt,
                            chat_template_kwargs=chat_template_kwargs, chat_template=chat_template)
    if spans:
        cspans, exact = message_char_spans(bundle, messages, tools, text, chat_template_kwargs, chat_template)
        tail = cspans[-1][1] if cspans else 0
        if tail < len(text):
            cspans.append((tail, len(text)))  # generation prompt / trailing template text
        tspans = char_spans_to_token_spans(offsets, cspans)
        r.spans_exact = exact
        for i, ((cs, ce), (ts, te)) in enumerate(zip(cspans, tspans)):
            idx = i if i < len(messages) else -1
            r.message_spans.append(MessageSpan(message=idx, start=ts, end=te, char_start=cs, char_end=ce))
    return r


# ---- the tool turn, as verl tokenizes it ---------------------------------------------------


def empty_render_prefix(bundle: Bundle, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """What the template writes for a conversation of one empty message (verl renders ``[{}]``):
    the default system prompt of templates that add one, else ``""``."""
    if bundle.renderer is not None:
        return ""
    try:
        return render_text(bundle, [{}], add_generation_prompt=False, chat_template_kwargs=chat_template_kwargs)
    except RenderError:
        return ""


def _verl_tool_turn(
    bundle: Bundle,
    new_messages: list[dict[str, Any]],
    chat_template_kwargs: dict[str, Any] | None,
    system_prefix: str,
) -> tuple[str, list[int], int]:
    """verl's method: ``new_messages`` rendered alone with the generation prompt, minus the
    template's empty-conversation prefix. Returns ``(text, ids, stripped prefix tokens)``;
    RenderError when the template refuses the messages alone or the prefix does not match."""
    text = render_text(bundle, new_messages, add_generation_prompt=True, chat_template_kwargs=chat_template_kwargs)
    if not system_prefix:
        return text, encode(bundle, text), 0
    if not text.startswith(system_prefix):
        raise RenderError("the render of the tool messages alone does not start with the template's "
                          "empty-conversation prefix")
    prefix_ids = encode(bundle, system_prefix)
    all_ids = encode(bundle, text)
    if all_ids[: len(prefix_ids)] != prefix_ids:
        raise RenderError("the empty-conversation prefix tokenizes differently inside the tool-turn render")
    return text[len(system_prefix):], all_ids[len(prefix_ids):], len(prefix_ids)


def _suffix_tool_turn(
    bundle: Bundle,
    history: list[dict[str, Any]],
    new_messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
) -> str:
    """The text the template adds when ``new_messages`` follow ``history``: the conversation
    rendered without them and with them (plus the generation prompt); RenderError unless the
    first render is a prefix of the second (a template that rewrites earlier turns when later
    ones arrive has no well-defined tool turn)."""
    before = render_text(bundle, history, tools, chat_template_kwargs=chat_template_kwargs)
    after = render_text(bundle, list(history) + list(new_messages), tools, add_generation_prompt=True,
                        chat_template_kwargs=chat_template_kwargs)
    if not after.startswith(before):
        at = _common_prefix_len(before, after)
        raise RenderError(
            f"chat template {bundle.template_name!r} renders the earlier conversation differently once the tool "
            f"messages follow it (first difference at character {at}: {before[at:at + 30]!r} becomes "
            f"{after[at:at + 30]!r}), so the tool turn is not a suffix of the conversation"
        )
    return after[len(before):]


def render_tool_turn(
    bundle: Bundle,
    new_messages: list[dict[str, Any]],
    *,
    history: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    system_prefix: str | None = None,
    trust_verl: bool = False,
) -> tuple[str, list[int], StepInfo]:
    """Text and ids of the context appended after a tool call (mask 0), and how they were made
    (``info.method``).

    Two methods:

    * ``suffix`` (needs ``history``, the conversation before ``new_messages``): render the
      conversation without and with the new messages and keep what the second adds, after
      checking that the first is its prefix. Works for every template that renders a
      conversation incrementally, whatever it writes for a lone tool message.
    * ``verl``: verl's ``ToolAgentLoop`` way: render only ``new_messages`` with the generation
      prompt and drop the tokens of the empty-conversation prefix (what ``[{}]`` renders to).
      Many templates break it: some refuse a conversation with no user query (Qwen3.5/3.6) or
      a tool message with no call before it (gpt-oss), others stamp a dated system header on
      every render (Llama 3.1), which verl would inject into the sequence.

    With ``history``, the suffix is the tool turn; verl's result is computed beside it. When the
    two agree the step says ``verl``; when verl's fails or differs the step says ``suffix`` and
    records verl's outcome (``info.verl_error`` / ``info.verl_tokens``), so the diagnostics can
    say what a verl-style trainer would have built instead. ``trust_verl`` (a template already
    seen to agree) uses verl's cheaper method alone: its cost does not grow with the
    conversation. Without ``history`` (older callers), verl's method is used and a
    minimal user/assistant exchange stands in for the conversation when it fails (``diff``).
    """
    info = StepInfo.empty()
    if bundle.renderer is not None:
        if history is None:
            raise RenderError(f"{bundle.template_name} tokenizes a tool turn from the conversation before it (history)")
        text, ids = bundle.renderer.tool_turn(prepare_messages(bundle, history), prepare_messages(bundle, new_messages), tools or None,
                                              kwargs=_template_kwargs(bundle, chat_template_kwargs))
        info.method = "suffix"  # of ids: mistral-common's render of the conversation with and without them
        return text, ids, info
    if system_prefix is None:
        system_prefix = empty_render_prefix(bundle, chat_template_kwargs)
    verl: tuple[str, list[int], int] | None = None
    verl_error: str | None = None
    try:
        verl = _verl_tool_turn(bundle, new_messages, chat_template_kwargs, system_prefix)
    except RenderError as e:
        verl_error = str(e)
    if history is not None and not (trust_verl and verl is not None):
        text = _suffix_tool_turn(bundle, history, new_messages, tools, chat_template_kwargs)
        ids = encode(bundle, text)
        if verl is None or verl[1] != ids:
            info.method = "suffix"
            if verl is None:
                info.verl_error = verl_error
            else:
                info.verl_tokens = len(verl[1])
            return text, ids, info
        # both methods agree: the turn is what a verl-style trainer builds
    if verl is not None:
        info.method = "verl"
        if verl[2]:
            info.stripped_prefix_tokens = verl[2]
        return verl[0], verl[1], info
    info.verl_error = verl_error
    base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    text = _suffix_tool_turn(bundle, base, new_messages, None, chat_template_kwargs)
    info.method = "diff"
    return text, encode(bundle, text), info


def render_warnings(bundle: Bundle, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str, *,
                    add_generation_prompt: bool, chat_template_kwargs: dict[str, Any] | None = None) -> list[str]:
    """What a template's rendering left out that its caller asked for, said rather than silently
    dropped: content parts it does not show (:func:`content_notes`), tool schemas that change
    nothing in the text (trl's deepseekv3 templates never write ``tools``), and a generation
    prompt that adds nothing (the same templates write none after a tool turn). Each is found by
    rendering again without it. A family rendered by its own encoder answers for the rest itself
    (its ``render_detailed`` notes)."""
    out = content_notes(bundle, messages, tools, text, add_generation_prompt=add_generation_prompt,
                        chat_template_kwargs=chat_template_kwargs)
    if bundle.renderer is not None:
        return out
    kw = {"chat_template_kwargs": chat_template_kwargs}
    if tools and render_text(bundle, messages, None, add_generation_prompt=add_generation_prompt, **kw) == text:
        out.append(f"the template wrote nothing of the {len(tools)} tool schema(s) given (the text is the same without them): "
                   "the model would not be shown its tools")
    if add_generation_prompt and render_text(bundle, messages, tools, add_generation_prompt=False, **kw) == text:
        last = messages[-1].get("role") if messages else None
        out.append(f"add_generation_prompt added nothing: the template writes no generation prompt after this "
                   f"conversation (its last message is {last!r}); the model is not prompted to answer")
    return out
