"""gpt-oss's Harmony format (OpenAI's ``openai-harmony``). After the generation prompt
``<|start|>assistant`` the model writes one or more messages::

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

    <|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>The answer<|return|>

(shown on two lines; the real text has no newline between messages). A message is a header, then
``<|message|>``, then its body, then ``<|end|>``, ``<|call|>`` (a tool call) or ``<|return|>``
(the end of the answer). The first message's ``<|start|>assistant`` is the generation prompt, so
the text starts with its header. Every header form ``openai-harmony`` accepts is read the same way:
the recipient after the channel (``<|channel|>commentary to=functions.f <|constrain|>json``), or
before it (``<|start|>assistant to=functions.f<|channel|>commentary json``), with or without
``<|constrain|>``, with any content type or none.

What the messages mean here:

- ``analysis`` without a recipient: reasoning (several are joined with a blank line);
- ``final``: content;
- ``commentary`` without a recipient: a *preamble* (gpt-oss tells the user what it is about to
  do before a call): content too, joined with the final text by a blank line;
- any message with a recipient ``to=functions.NAME``: a call to ``NAME`` whose arguments are the
  body, decoded as one strict JSON object;
- any other recipient (``to=browser.search``, ``to=python``): a call to a built-in tool, kept with
  the recipient as written as its name (``"browser.search"``). Its body is a JSON object, except
  for ``python``, whose body is code: it is kept verbatim as ``{"code": "<body>"}``.

``<|call|>`` and ``<|return|>`` are EOS tokens and the engine strips the final EOS's text before
parsing, so a last message that runs to the end of the text is complete (a trailing ``<|call|>``
or ``<|return|>`` is read too, for a tokenizer whose EOS is another token). A message cut inside
its header is an error, as are: a header without ``<|message|>``, a header with no channel, an
unknown channel (Harmony's are ``analysis``, ``commentary`` and ``final``), a message from a role
other than ``assistant``, words in a header that are neither ``to=RECIPIENT`` nor a content type,
arguments that are not one JSON object, text between messages (after ``<|end|>``, anything but
``<|start|>``), and a message whose body runs into the next ``<|start|>`` without ``<|end|>`` (its
meaning is still read). Calls in well-formed messages around an error are kept.

``ParseResult.channels`` lists every message whose header names a channel, in order:
``{"channel", "recipient", "span", "body"}``; ``span`` runs from the message's ``<|start|>`` (or
the start of the text) to the end of its ``<|end|>``/``<|call|>``/``<|return|>``, ``body`` is the
text between ``<|message|>`` and that tag. A call's span is its message's span.

Where this differs from ``openai-harmony`` (which parses token ids, not text): a leading
``<|start|>assistant`` is read as the message's start (Harmony, told the role, reads it as a
recipient); ``<|start|>`` inside a body ends the body, with an error (Harmony keeps it as body
text); a second ``<|channel|>`` in one header, a bare word where Harmony would take a recipient
without ``to=``, an unknown channel, a missing channel and a non-assistant role are errors here
(Harmony returns such messages); an empty text is no error (Harmony: unexpected EOS).

``format_calls`` writes what gpt-oss emits and Harmony's renderer renders:
``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``, the call's final
``<|call|>`` being its EOS; several calls are one message each, joined by
``<|call|><|start|>assistant``. (trl's ``gptoss.jinja`` writes the recipient before the channel
and no ``<|constrain|>``: ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``;
both read the same.)

``tool_choice``: ``required`` and a named tool allow an optional analysis message, then exactly one
call message (gpt-oss ends its turn at ``<|call|>``, so even ``required`` with several calls
allowed is one call per turn), then EOS. ``none`` forbids `` to=functions.``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from backend.parsers._common import as_doc, decode_at, dumps, skip_ws, type_name
from backend.parsers._grammar import json_schema_rules
from backend.parsers.base import ParseResult, ToolCallParser, register_parser
from backend.parsers.format import ToolCallFormat, ebnf_literal
from backend.trace import ParseError, ToolCall

START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
CHANNEL, MESSAGE, CONSTRAIN = "<|channel|>", "<|message|>", "<|constrain|>"
CHANNELS = ("analysis", "commentary", "final")
FUNCTIONS = "functions."
ROLE = "assistant"

# Where a header stops (it should at <|message|>) and where a body stops: plain alternations,
# searched forward from each position once, so parsing is linear.
_HEADER_STOP = re.compile(r"<\|(?:message|end|call|return|start)\|>")
_BODY_STOP = re.compile(r"<\|(?:end|call|return|start)\|>")
# A channel name runs to whitespace or '<' (as openai-harmony reads it).
_CHANNEL_NAME = re.compile(r"[^\s<]*")
_ASCII_WS = re.compile(r"[ \t\n\r\x0c]+")  # Rust's split_ascii_whitespace, which Harmony uses
_AT_CHAR = re.compile(r"at char (\d+)")


@dataclass(frozen=True)
class _Header:
    channel: str | None
    recipient: str | None
    content_type: str | None


def _parse_header(h: str, has_role: bool) -> _Header | str:
    """A message header (the text before ``<|message|>``, after ``<|start|>`` when ``has_role``),
    read the way openai-harmony reads it, or why it cannot be read."""
    channel = None
    ci = h.find(CHANNEL)
    if ci != -1:
        m = _CHANNEL_NAME.match(h, ci + len(CHANNEL))
        assert m is not None  # the pattern matches the empty string
        if not m.group():
            return f"{CHANNEL} with no channel name after it"
        channel = m.group()
        h = h[:ci] + h[m.end():]
        if CHANNEL in h:
            return f"two {CHANNEL} markers in one message header"
    h = h.strip()
    if CONSTRAIN in h:  # "to=f<|constrain|>json": the marker starts a new word
        h = h.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    parts = [p for p in _ASCII_WS.split(h) if p]
    if has_role:
        if not parts:
            return f"no role after {START}"
        role = parts.pop(0)
        if role != ROLE:
            return f"a message from {role[:40]!r} in an assistant turn (only {ROLE!r} messages are the model's)"
    recipient = content_type = None
    if parts:
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        else:
            content_type = last
            if parts and parts[-1].startswith("to="):
                recipient = parts.pop()[3:]
    if parts:
        return f"unexpected {parts[-1][:40]!r} in the message header (expected to=RECIPIENT and a content type)"
    if recipient == "":
        return "to= with no recipient in the message header"
    return _Header(channel, recipient, content_type)


class _Reader:
    """One pass over the text, message by message."""

    def __init__(self, text: str) -> None:
        self.text = as_doc(text)
        self.calls: list[ToolCall] = []
        self.errors: list[tuple[int, int, str]] = []
        self.content: list[str] = []
        self.reasoning: list[str] | None = None
        self.channels: list[dict[str, Any]] = []

    def error(self, start: int, end: int, message: str) -> None:
        """Record an error; one that continues the previous one with the same message extends it
        (100,000 ``<|start|>`` in a row are one error, not 100,000)."""
        end = max(start, min(end, len(self.text)))
        if self.errors and self.errors[-1][1] == start and self.errors[-1][2] == message:
            self.errors[-1] = (self.errors[-1][0], end, message)
        else:
            self.errors.append((start, end, message))

    def run(self) -> ParseResult:
        text, n, pos = self.text, len(self.text), 0
        while pos < n:
            msg_start = pos
            has_role = text.startswith(START, pos)
            if not has_role and pos > 0:  # after a message's end: only <|start|> may follow
                nxt = text.find(START, pos)
                stop = n if nxt == -1 else nxt
                self.error(pos, stop, f"text outside any message (after a message ends, only {START} may follow)")
                pos = stop
                continue
            hstart = pos + len(START) if has_role else pos
            m = _HEADER_STOP.search(text, hstart)
            stop = n if m is None else m.start()
            if (not has_role and (m is None or m.group() != MESSAGE)
                    and CHANNEL not in text[hstart:stop] and "to=" not in text[hstart:stop]):
                # the first "header", cut by a tag other than <|message|> and holding neither a
                # channel nor a recipient, is no header: plain text
                end = stop if m is None or m.group() == START else m.end()
                self.error(pos, end, f"text outside any message (a Harmony message starts with {CHANNEL})")
                pos = end
                continue
            if m is None:
                self.error(msg_start, n, "the text ends inside a message header (generation truncated?)")
                break
            if m.group() != MESSAGE:
                end = m.start() if m.group() == START else m.end()
                self.error(msg_start, end, f"message header without {MESSAGE} (found {m.group()})")
                pos = end
                continue
            pos = self._message(msg_start, hstart, m.start(), m.end(), has_role)
        return self.result()

    def _message(self, msg_start: int, hstart: int, hend: int, bstart: int, has_role: bool) -> int:
        """Read one message whose header is ``[hstart, hend)`` and body starts at ``bstart``;
        returns where the next one starts."""
        text, n = self.text, len(self.text)
        m = _BODY_STOP.search(text, bstart)
        bend = n if m is None else m.start()
        tag = None if m is None else m.group()
        msg_end = bend if tag in (None, START) else m.end()  # type: ignore[union-attr]
        header = _parse_header(text[hstart:hend], has_role)
        if isinstance(header, str):
            self.error(msg_start, msg_end, header)
            return msg_end
        if header.channel is not None:
            self.channels.append({"channel": header.channel, "recipient": header.recipient,
                                  "span": [msg_start, msg_end], "body": [bstart, bend]})
        if tag == START:
            self.error(msg_start, bend, f"message not closed: {START} before its {END}, {CALL} or {RETURN}")
        if header.channel is None:
            self.error(msg_start, msg_end, f"message without a channel (gpt-oss writes {CHANNEL}analysis, commentary or final)")
            return msg_end
        if header.channel not in CHANNELS:
            self.error(msg_start, msg_end, f"unknown channel {header.channel[:40]!r} (Harmony's are {', '.join(CHANNELS)})")
            return msg_end
        if header.recipient is not None:
            self._call(header.recipient, msg_start, msg_end, bstart, bend)
        elif header.channel == "analysis":
            if self.reasoning is None:
                self.reasoning = []
            self.reasoning.append(text[bstart:bend].strip())
        else:  # final, or a commentary preamble
            self.content.append(text[bstart:bend].strip())
        return msg_end

    def _call(self, recipient: str, start: int, end: int, bstart: int, bend: int) -> None:
        text = self.text
        if recipient.startswith(FUNCTIONS):
            name = recipient[len(FUNCTIONS):]
            if not name:
                self.error(start, end, f"to={FUNCTIONS} with no function name")
                return
        elif recipient == "python":  # the built-in python tool's body is code, not JSON
            self.calls.append(ToolCall(name=recipient, arguments={"code": text[bstart:bend]}, span=(start, end), raw=text[start:end]))
            return
        else:
            name = recipient
        body = as_doc(text[bstart:bend])
        i = skip_ws(body, 0)
        value, vend, err = decode_at(body, i)
        if err is None and skip_ws(body, vend) != len(body):
            err = f"invalid JSON: extra data after the value at char {bstart + skip_ws(body, vend)}"
        elif err is not None:
            err = _AT_CHAR.sub(lambda mm: f"at char {bstart + int(mm.group(1))}", err)
            if err.startswith("truncated JSON") and bend < len(text):
                err = f"truncated JSON: the message ends at char {bend} before the value is complete"
            elif "Unterminated string" in err and bend == len(text):
                err = "truncated JSON: the text ends inside a string (generation truncated?)"
        if err is not None:
            self.error(start, end, f"tool call {name[:80]!r}: arguments are {err}")
            return
        if not isinstance(value, dict):
            self.error(start, end, f"tool call {name[:80]!r}: arguments must be a JSON object, got {type_name(value)}")
            return
        self.calls.append(ToolCall(name=name, arguments=value, span=(start, end), raw=text[start:end]))

    def result(self) -> ParseResult:
        reasoning = None if self.reasoning is None else "\n\n".join(r for r in self.reasoning if r)
        errors = [ParseError(message=m, span=(s, e), raw=self.text[s:e]) for s, e, m in sorted(self.errors, key=lambda x: x[0])]
        return ParseResult(content="\n\n".join(c for c in self.content if c), reasoning=reasoning,
                           tool_calls=self.calls, errors=errors, channels=self.channels)


# ---- tool_choice grammar ---------------------------------------------------------------------

# Text without "<|" (so without any Harmony tag): runs of '<' only before a character other than '|'.
_FREE_TEXT = 'analysis_text ::= ([^<] | "<"+ [^<|])* "<"*'


def call_header(name: str) -> str:
    """The header gpt-oss writes before a call's JSON arguments."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


@dataclass(frozen=True)
class HarmonyFormat(ToolCallFormat):
    """Harmony's declaration: its calls are headers, not a JSON body between tags, so the
    tool_choice grammar is built here (:meth:`custom_grammar`)."""

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        """An optional analysis message, then one call message to one of ``tools`` (one call per
        turn whatever ``multiple`` and ``max_calls`` say: gpt-oss ends its turn at ``<|call|>``),
        then EOS (the matcher's stop token)."""
        lines = [
            "root ::= analysis? call",
            f"analysis ::= {ebnf_literal(CHANNEL + 'analysis' + MESSAGE)} analysis_text {ebnf_literal(END + START + ROLE)}",
            _FREE_TEXT,
            "call ::= " + " | ".join(f"call_{k}" for k in range(len(tools))),
        ]
        for k, (name, params) in enumerate(tools):
            root, rules = json_schema_rules(params, f"t{k}_")
            lines.append(f"call_{k} ::= {ebnf_literal(call_header(name))} {root}")
            lines.append(rules)
        return "\n".join(lines)


@register_parser("harmony")
class HarmonyParser(ToolCallParser):
    call_format = HarmonyFormat(
        CHANNEL, forbid_text=f" to={FUNCTIONS}", markers=(CHANNEL, CONSTRAIN), vllm_names=("openai",),
        max_calls_per_turn=1, reasoning_in_grammar=True,
    )
    call_begin = f"{CHANNEL}commentary to={FUNCTIONS}"
    call_end = ""  # the call's <|call|> is its EOS

    def _parse(self, text: str) -> ParseResult:
        return _Reader(text).run()

    def format_calls(self, calls: list[dict[str, Any]]) -> str:
        return (CALL + START + ROLE).join(call_header(c["name"]) + dumps(c.get("arguments", {})) for c in calls)
