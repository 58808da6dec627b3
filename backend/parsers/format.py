"""What a tool-call format is, declared once per parser (``ToolCallParser.call_format``).

A :class:`ToolCallFormat` holds the format's tags, the text by which its chat templates (and
its outputs) are recognised, the vLLM parser names that read the same format, how a list of
calls is laid out (for the ``tool_choice`` grammar), and the tags of tool responses and chat
turns where the format's templates have them. The registry (:mod:`backend.parsers.base`)
answers from these declarations: the template sniffer, ``tool_choice``, the vLLM adapter and
the importers all read them, so a new format is one module in ``backend/parsers``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# Up to this many calls the grammar spells the bound out; beyond it, any number
MAX_SPELLED_CALLS = 16


def ebnf_literal(s: str) -> str:
    return json.dumps(s)  # JSON string escapes are valid EBNF string escapes


@dataclass(frozen=True)
class ToolCallFormat:
    """One tool-call format. Grammar layout: ``list_open call (sep call)* list_close``, each
    call ``call_open <JSON {"name": ..., args_key: {...}}> call_close``."""

    open_tag: str  # the tag that starts the calls ("" if none; may be optional, as Llama's <|python_tag|>)
    close_tag: str = ""  # the tag that ends them ("" if none)
    # grammar layout of a list of calls (as the model writes it)
    list_open: str = ""
    list_close: str = ""
    call_open: str = ""
    call_close: str = ""
    sep: str = ""
    args_key: str = "arguments"
    forbid_text: str | None = None  # what tool_choice=none bans; None: open_tag
    # substrings that only this format's chat templates (or outputs) contain; None: (open_tag,)
    markers: tuple[str, ...] | None = None
    vllm_names: tuple[str, ...] = ()  # vLLM tool parsers that read this format
    # tags around a tool result and a chat turn in the format's templates ("" where it has none)
    response_open: str = ""
    response_close: str = ""
    turn_open: str = ""
    turn_close: str = ""
    # at most this many calls in one generated turn (gpt-oss ends its turn at <|call|>): None, any
    max_calls_per_turn: int | None = None
    # the tool_choice grammar admits the format's reasoning before the calls (Harmony's analysis)
    reasoning_in_grammar: bool = False

    @property
    def forbid(self) -> str:
        return self.open_tag if self.forbid_text is None else self.forbid_text

    @property
    def template_markers(self) -> tuple[str, ...]:
        if self.markers is not None:
            return self.markers
        return (self.open_tag,) if self.open_tag else ()

    # ---- tool_choice grammar --------------------------------------------------------------

    def custom_grammar(self, tools: list[tuple[str, dict[str, Any]]], *, multiple: bool,
                       max_calls: int | None = None) -> str | None:
        """A whole EBNF grammar (``root`` rule first) for one call (or with ``multiple`` 1..
        ``max_calls`` calls) to ``tools`` (``(name, parameters as JSON Schema)`` pairs), for
        formats whose calls are not a JSON body between tags (XML parameters, Harmony headers).
        None (the default): the JSON layout above is used (:meth:`grammar_rules`)."""
        return None

    def call_schema(self, tools: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """The JSON Schema of one call's JSON body for ``(name, parameters JSON Schema)`` pairs."""
        variants = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, self.args_key: params},
                "required": ["name", self.args_key],
                "additionalProperties": False,
            }
            for name, params in tools
        ]
        return variants[0] if len(variants) == 1 else {"anyOf": variants}

    def grammar_rules(self, body_rule: str, *, multiple: bool, max_calls: int | None = None) -> list[str]:
        """The EBNF ``root`` and ``tool_call`` rules around ``body_rule`` (one call's JSON body):
        one call, or with ``multiple`` one or more (at most ``max_calls`` when given)."""
        lit = ebnf_literal
        call = f"tool_call ::= {lit(self.call_open) if self.call_open else ''} {body_rule} {lit(self.call_close) if self.call_close else ''}"
        more = ""
        if multiple and max_calls is not None and max_calls <= MAX_SPELLED_CALLS:
            for _ in range(max_calls - 1):  # nested optionals: 1..max_calls calls
                more = f"({lit(self.sep)} tool_call {more})?".replace(" )", ")")
        elif multiple:
            more = f"({lit(self.sep)} tool_call)*"
        parts = [lit(self.list_open) if self.list_open else "", "tool_call", more, lit(self.list_close) if self.list_close else ""]
        return ["root ::= " + " ".join(x for x in parts if x), call]

    # ---- recognising and reading the format's text ------------------------------------------

    def responses_regex(self) -> re.Pattern[str]:
        """Tool responses in a rendered turn: group 1 is one response's body."""
        return re.compile(re.escape(self.response_open) + r"\n?(.*?)\n?" + re.escape(self.response_close), re.S)

    def turns_regex(self) -> re.Pattern[str]:
        """Chat turns in rendered text: group 1 the role, group 2 the body (to the turn's end
        tag, the next turn, or the end of the text)."""
        o, c = re.escape(self.turn_open), re.escape(self.turn_close)
        return re.compile(o + r"([A-Za-z_]+)\n(.*?)(?:" + c + "|(?=" + o + r")|\Z)", re.S)
