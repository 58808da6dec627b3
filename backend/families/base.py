"""How a family continues a token sequence after a tool call: verl 0.9's Continuous Token contract.

The next prompt is exactly the previous prompt + the generated ids + the ids of the new messages,
with one edit at the junction where the family's template needs it. The invariants (verl issue
#6719, as verl 0.9.1's ``ContinuousTokenBuilder`` keeps them; written here from that contract):

1. earlier turns are never re-tokenized: what the model generated stays as it was;
2. the new messages are rendered in a *synthetic* context (a short system + user + an assistant
   turn calling the same tools), and only the ids the template adds for them are kept: a token
   suffix of that small render, checked to be one, so a turn costs the new messages, not the
   conversation;
3. the junction between the generated ids and those context ids gets the family's boundary edit:
   the tokens the template writes after a finished turn that generation stops before (Qwen's
   ``\\n`` after ``<|im_end|>``), or a stop token that is also the next message's opening (GLM's
   ``<|observation|>``), counted once and as context.

:class:`TurnRule` is the default (verl's base builder: no edit); a family module subclasses it
and overrides :meth:`TurnRule.edit` (the junction) or :meth:`TurnRule.context_ids` (how the new
messages are tokenized) and :meth:`TurnRule.matches` (which tokenizer + template it is for).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from backend.tokens.rendering import RenderError, decode, encode, render_text

SYNTHETIC_SYSTEM = {"role": "system", "content": "continuous token synthetic system"}
SYNTHETIC_USER = {"role": "user", "content": "continuous token synthetic user"}
DUMMY_TOOL = "continuous_token_tool"


@dataclass
class Edit:
    """The junction edit: ``inserted`` ids go between the generated ids and the context ids
    (mask 0); ``relabel`` trailing generated ids are the next message's opening and count as
    context (mask 0) — the context ids then start after them. ``why`` says which template rule."""

    inserted: list[int] = field(default_factory=list)
    relabel: int = 0
    why: str = ""

    def __bool__(self) -> bool:
        return bool(self.inserted or self.relabel)

    def boundary(self, total: int) -> dict[str, Any]:
        """The step's ``info.boundary`` for this edit made when the sequence had ``total`` tokens:
        where it starts (a relabelled token is already in the sequence), what was inserted, why."""
        return {"position": total - self.relabel, "inserted": list(self.inserted), "relabeled": self.relabel, "why": self.why}


@dataclass
class ContextTurn:
    """What a tool turn appends in continuous mode: ``ids`` (the edit's inserted ids first), its
    decoded ``text``, the :class:`Edit`, and the rule's name."""

    ids: list[int]
    text: str
    edit: Edit
    rule: str

    def info(self, total: int) -> dict[str, Any]:
        """The step's info for this turn appended to a sequence of ``total`` tokens: the method,
        the rule and, when the junction was edited, where and how."""
        out: dict[str, Any] = {"method": "continuous", "rule": self.rule}
        if self.edit:
            out["boundary"] = self.edit.boundary(total)
        return out


def token_id(tok: Any, token: str) -> int | None:
    """The id of ``token`` when the vocabulary has it as one token, else None."""
    i = tok.convert_tokens_to_ids(token)
    if isinstance(i, list):
        i = i[0] if len(i) == 1 else None
    if not isinstance(i, int) or i < 0 or i == getattr(tok, "unk_token_id", None):
        return None
    return i


def template_text(bundle: Any) -> str:
    return bundle.chat_template or ""


class TurnRule:
    """The default rule: the new messages' ids from the synthetic context, no junction edit
    (verl 0.9.1's base ``ContinuousTokenBuilder``, which Llama 3.x and every model verl does not
    name get)."""

    name = "default"
    #: one line for docs and the Inspector: what the family's junction needs
    summary = "no edit: the template writes nothing between a finished turn and the next message"
    #: where :func:`backend.families.rule_for` tries the rule: lower first, equal ones in the order
    #: of ``FAMILIES``. 0: a family rendered by its own encoder; 10: a family named by tokens only
    #: it has; 20, 30: template shapes other models share (Llama 3's headers, then ChatML)
    priority = 10

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return True

    def __init__(self, bundle: Any):
        self.bundle = bundle
        self._prefix_cache: dict[str, list[int]] = {}
        self._tools_matter: dict[str, bool] = {}  # per tool set: whether the schemas change a tool turn's ids

    # ---- the new messages ------------------------------------------------------------------
    def synthetic_assistant(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]]) -> dict[str, Any]:
        """An assistant turn calling the tools the new messages answer, with empty arguments:
        it exists to be diffed away. Names and ids come from the conversation's last assistant
        calls where they match (a template may look a tool message's name up by its id), else from
        the tool messages."""
        last_calls: list[dict[str, Any]] = []
        for m in reversed(history):
            if isinstance(m, dict) and m.get("role") == "assistant":
                last_calls = [c for c in (m.get("tool_calls") or []) if isinstance(c, dict)]
                break
        by_id = {str(c.get("id")): c for c in last_calls if c.get("id") is not None}
        calls = []
        for i, tm in enumerate(new_messages):
            if tm.get("role") != "tool":
                continue
            real = by_id.get(str(tm.get("tool_call_id"))) or (last_calls[i] if i < len(last_calls) else None)
            fn = (real or {}).get("function") if isinstance((real or {}).get("function"), dict) else {}
            name = tm.get("name") or fn.get("name") or DUMMY_TOOL
            call_id = tm.get("tool_call_id") if tm.get("tool_call_id") is not None else (real or {}).get("id") or f"continuous_token_call_{i}"
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": self.empty_arguments()}})
        return {"role": "assistant", "content": "", "reasoning_content": "reasoning", "tool_calls": calls}

    def empty_arguments(self) -> Any:
        return {}

    def synthetic_prefix(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [SYNTHETIC_SYSTEM, SYNTHETIC_USER, self.synthetic_assistant(history, new_messages)]

    def _ids(self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any] | None, gen: bool) -> list[int]:
        return encode(self.bundle, render_text(self.bundle, messages, tools, add_generation_prompt=gen, chat_template_kwargs=kwargs))

    def context_ids(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: Any,
                    kwargs: dict[str, Any] | None) -> list[int]:
        """The ids the template adds for ``new_messages`` and the generation prompt, rendered after
        the synthetic context (a token suffix, checked to be one). RenderError when the template
        refuses the synthetic context or the suffix check fails. New messages that are not all tool
        results (a harness's next user message) go by :meth:`grouped_ids`."""
        if any(m.get("role") != "tool" for m in new_messages):
            return self.grouped_ids(history, new_messages, tools, kwargs)
        if tools:
            # the tool schemas only change the (diffed-away) system prompt of most templates: checked
            # once per tool set with and without them, and left out of later renders when the ids agree
            key = json.dumps([tools, kwargs], sort_keys=True, default=str)
            matter = self._tools_matter.get(key)
            if matter is None:
                with_tools = self._context_ids(history, new_messages, tools, kwargs)
                if len(self._tools_matter) >= 64:
                    self._tools_matter.clear()
                self._tools_matter[key] = self._context_ids(history, new_messages, None, kwargs) != with_tools
                return with_tools
            if not matter:
                tools = None
        return self._context_ids(history, new_messages, tools, kwargs)

    def grouped_ids(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: Any,
                    kwargs: dict[str, Any] | None) -> list[int]:
        """New messages in groups, as verl 0.9.1's builder appends them: each run of tool messages
        after the synthetic turn that calls them, each other message (user, system, an assistant
        turn in between) alone after the synthetic system + user; the generation prompt with the
        last group. The groups' ids, joined."""
        out: list[int] = []
        seen = list(history)
        groups = message_groups(new_messages)
        for k, group in enumerate(groups):
            last = k == len(groups) - 1
            if group[0].get("role") == "tool":
                prefix = self.synthetic_prefix(seen, group)
            else:
                if last and group[0].get("role") == "assistant":
                    raise RenderError("new messages cannot end with an assistant turn: the model's turn comes next")
                prefix = [SYNTHETIC_SYSTEM, SYNTHETIC_USER]
            out += self._suffix_ids(prefix, group, tools, kwargs, last)
            seen += group
        return out

    def _context_ids(self, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: Any,
                     kwargs: dict[str, Any] | None) -> list[int]:
        return self._suffix_ids(self.synthetic_prefix(history, new_messages), new_messages, tools, kwargs, True)

    def _suffix_ids(self, prefix: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: Any,
                    kwargs: dict[str, Any] | None, gen: bool) -> list[int]:
        """The ids ``new_messages`` (and the generation prompt when ``gen``) add after ``prefix``."""
        try:
            before = self._prefix_ids(prefix, tools, kwargs)
        except (RenderError, TypeError):
            # templates that splice arguments in as a string (DeepSeek R1 / V3.1) refuse a mapping
            for c in prefix[-1].get("tool_calls") or []:
                c["function"]["arguments"] = "{}"
            before = self._prefix_ids(prefix, tools, kwargs)
        after = self._ids(prefix + list(new_messages), tools, kwargs, gen)
        if after[: len(before)] != before:
            at = next((k for k, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))
            raise RenderError(
                f"chat template {self.bundle.template_name!r}: the render of the new messages after a synthetic turn does "
                f"not extend that turn's ids (token {at}: {decode(self.bundle, before[at:at + 4])!r} becomes "
                f"{decode(self.bundle, after[at:at + 4])!r})")
        return after[len(before):]

    def _prefix_ids(self, prefix: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any] | None) -> list[int]:
        """The synthetic context's ids, cached (the same tools are called turn after turn)."""
        key = json.dumps([prefix, tools, kwargs], sort_keys=True, default=str)
        ids = self._prefix_cache.get(key)
        if ids is None:
            ids = self._ids(prefix, tools, kwargs, False)
            if len(self._prefix_cache) >= 64:
                self._prefix_cache.clear()
            self._prefix_cache[key] = ids
        return ids

    # ---- the junction ----------------------------------------------------------------------
    def edit(self, prefix_ids: list[int], context_ids: list[int], history: list[dict[str, Any]],
             new_messages: list[dict[str, Any]]) -> Edit:
        """The edit at the junction of ``prefix_ids`` (everything so far, ending with the generated
        ids) and ``context_ids``. The default: none."""
        return Edit()

    def turn(self, prefix_ids: list[int], history: list[dict[str, Any]], new_messages: list[dict[str, Any]],
             tools: Any = None, kwargs: dict[str, Any] | None = None) -> ContextTurn:
        ctx = self.context_ids(history, new_messages, tools, kwargs)
        e = self.edit(prefix_ids, ctx, history, new_messages)
        ids = list(e.inserted) + ctx[e.relabel:]
        return ContextTurn(ids=ids, text=decode(self.bundle, ids), edit=e, rule=self.name)


class SeparatorRule(TurnRule):
    """Templates that close a turn with an end token the model stops at, then write a separator
    (``\\n``) before the next message: when the generated ids end with that end token, insert the
    separator (verl 0.9.1's Qwen and MiniMax builders; verl PR #6921)."""

    end_token = ""
    separator = "\n"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return turn_separator(bundle, cls.end_token) == cls.separator

    def __init__(self, bundle: Any):
        super().__init__(bundle)
        self.end_id = token_id(bundle.tokenizer, self.end_token)
        self.sep_ids = encode(bundle, self.separator)

    def edit(self, prefix_ids, context_ids, history, new_messages) -> Edit:
        if prefix_ids and prefix_ids[-1] == self.end_id and context_ids[: len(self.sep_ids)] != self.sep_ids:
            return Edit(inserted=list(self.sep_ids),
                        why=f"the template writes {self.end_token + self.separator!r} between turns; generation stops at "
                            f"{self.end_token!r}")
        return Edit()


def message_groups(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Runs of tool messages, and every other message alone (verl 0.9.1's append groups)."""
    groups: list[list[dict[str, Any]]] = []
    for m in messages:
        if m.get("role") == "tool" and groups and groups[-1][0].get("role") == "tool":
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def turn_separator(bundle: Any, end: str) -> str | None:
    """The whitespace the template writes right after ``end`` when a turn is followed by another
    message, or None when ``end`` is not one token of the vocabulary or the template never writes
    it there (a two-turn conversation probed: user, assistant, user)."""
    if token_id(bundle.tokenizer, end) is None:
        return None
    try:
        text = render_text(bundle, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "yq"},
                                    {"role": "user", "content": "z"}])
    except RenderError:
        return None
    at = text.find("yq" + end)
    if at < 0:
        return None
    rest = text[at + 2 + len(end):]
    return rest[: len(rest) - len(rest.lstrip())]


class DerivedRule(SeparatorRule):
    """Any other template: when it writes whitespace after the end token the model stops at
    (probed), insert it; else no edit. The fallback :func:`backend.families.rule_for` tries last."""

    name = "derived"
    summary = "the whitespace the template writes after the end-of-turn token, found by a probe render"

    @classmethod
    def matches(cls, bundle: Any) -> bool:
        return True

    def __init__(self, bundle: Any):
        TurnRule.__init__(self, bundle)
        self.end_id, self.sep_ids, self.end_token = None, [], ""
        tok = bundle.tokenizer
        for i in bundle.stop_token_ids:
            end = tok.convert_ids_to_tokens(i)
            sep = turn_separator(bundle, end) if isinstance(end, str) else None
            if sep:
                self.end_id, self.end_token, self.separator = i, end, sep
                self.sep_ids = encode(bundle, sep)
                self.name = f"derived ({end!r} + {sep!r})"
                break

    def edit(self, prefix_ids, context_ids, history, new_messages):
        if self.end_id is None:
            return Edit()
        return super().edit(prefix_ids, context_ids, history, new_messages)
