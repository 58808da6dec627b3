"""Render messages + tools through a chat template to text and token ids.

Two jobs:

* :func:`render` — the whole conversation, with per-message character and token spans, so the
  UI can link a message to its tokens (and the tokens to the loop step that added them).
* :func:`render_tool_turn` — verl's way of tokenizing the context injected after a tool call:
  render only the new messages with the generation prompt, then strip the prefix the template
  writes for an empty conversation (Qwen2.5's default system prompt, for example).

Tokenization is always ``encode(text, add_special_tokens=False)`` of the rendered text, which
is what ``apply_chat_template(tokenize=True)`` does; tests hold the two equal.
"""

from __future__ import annotations

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

    def to_dict(self, tokenizer: Any | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "text": self.text,
            "token_ids": self.token_ids,
            "num_tokens": len(self.token_ids),
            "message_spans": [s.model_dump() for s in self.message_spans],
            "spans_exact": self.spans_exact,
        }
        if tokenizer is not None:
            d["tokens"] = tokenizer.convert_ids_to_tokens(self.token_ids)
        return d


def _template_kwargs(bundle: Bundle, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(bundle.chat_template_kwargs)
    if kwargs:
        merged.update(kwargs)
    return merged


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
    Mistral's mistral-common, the decode of that encoder's ids)."""
    if bundle.renderer is not None:
        return bundle.renderer.render(messages, tools or None, add_generation_prompt=add_generation_prompt,
                                      kwargs=_template_kwargs(bundle, chat_template_kwargs))[0]
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
        _, ids = bundle.renderer.render(messages, tools or None, add_generation_prompt=add_generation_prompt,
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
        text, ids = bundle.renderer.tool_turn(history, new_messages, tools or None,
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
    dropped: tool schemas that change nothing in the text (trl's deepseekv3 templates never write
    ``tools``), and a generation prompt that adds nothing (the same templates write none after a
    tool turn). Each is found by rendering again without it. A family rendered by its own encoder
    answers for itself (its ``render_detailed`` notes): nothing here."""
    if bundle.renderer is not None:
        return []
    out: list[str] = []
    kw = {"chat_template_kwargs": chat_template_kwargs}
    if tools and render_text(bundle, messages, None, add_generation_prompt=add_generation_prompt, **kw) == text:
        out.append(f"the template wrote nothing of the {len(tools)} tool schema(s) given (the text is the same without them): "
                   "the model would not be shown its tools")
    if add_generation_prompt and render_text(bundle, messages, tools, add_generation_prompt=False, **kw) == text:
        last = messages[-1].get("role") if messages else None
        out.append(f"add_generation_prompt added nothing: the template writes no generation prompt after this "
                   f"conversation (its last message is {last!r}); the model is not prompted to answer")
    return out
