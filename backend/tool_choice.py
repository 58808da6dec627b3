"""``tool_choice`` (auto / required / none / a tool's name) as a token-level constraint.

``required`` and a named tool become an EBNF grammar: the active tool-call format's tags around
(its declaration, :class:`backend.parsers.ToolCallFormat`, lays them out) a JSON body whose schema is ``{"name": <tool>, "arguments": <the tool's parameters>}``, then
nothing but EOS. The JSON part is produced by xgrammar's JSON-schema converter (a vLLM
dependency), so vLLM's structured outputs and the transformers backend (xgrammar logits
processor) enforce the same grammar; the scripted backend checks its script by the schema's
meaning (below). ``none`` forbids the format's opening tag. ``auto`` constrains nothing.

A policy can change per assistant turn: ``["required", "auto"]`` forces a call on the first
turn and leaves the rest free (the last entry repeats).

What generation enforces (the grammar; the structured-outputs convention of vLLM and xgrammar):
the format's exact tags and separators, compact JSON (``", "`` and ``": "``), ``name`` first,
then the arguments with their keys in the schema's ``properties`` order, only the listed keys
(an object with ``properties`` admits no other key; one without ``properties`` admits any,
and keys it lists in ``required`` must be there), no text before or after the calls, then EOS.
Parameter types in the common dialect (``dict``, ``float``, ``any``, ...) are read as JSON
Schema first (:mod:`backend.tools.dialect`).

Checking a turn that was NOT generated under the grammar (the scripted backend's script, an
imported turn): :func:`check_given` accepts what the JSON Schema accepts. The turn is parsed
with the format's parser and each call validated with jsonschema: any key order, any JSON
whitespace, unlisted keys unless the schema sets ``"additionalProperties": false``. Still
required: the turn is only tool calls (no prose or reasoning around them), 1..``max_calls``
of them (exactly one for a named tool), each to an allowed tool, and it ends with EOS.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from backend.constraints import Constraint
from backend.errors import UserError
from backend.parsers import ToolCallFormat, get_format, get_parser, native_name, tool_call_formats
from backend.tools.dialect import SchemaDialectError, iter_schemas, to_json_schema

AUTO, REQUIRED, NONE = "auto", "required", "none"


class ToolChoiceError(UserError):
    """A tool_choice that cannot be applied (unknown tool, unsupported format, unreadable schema)."""


def normalize_policy(choice: Any) -> tuple[str, ...]:
    """Accepts "auto" | "required" | "none" | NAME | OpenAI's {"type": "function", "function":
    {"name": NAME}} | a comma-separated string or list of those (one per assistant turn)."""
    if choice is None:
        return (AUTO,)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str) or not name:
            raise ToolChoiceError('a tool_choice object must look like {"type": "function", "function": {"name": "..."}}')
        return (name,)
    if isinstance(choice, str):
        parts = [p.strip() for p in choice.split(",")] if "," in choice else [choice.strip()]
    elif isinstance(choice, (list, tuple)):
        parts = []
        for c in choice:
            parts.extend(normalize_policy(c))
    else:
        raise ToolChoiceError(f"tool_choice must be a string or a list, not {type(choice).__name__}")
    if not parts or any(not p for p in parts):
        raise ToolChoiceError("empty tool_choice entry")
    return tuple(parts)


# The embedded default model (SmolLM2-135M) never calls a tool on its own; forcing the first turn
# shows a call, a tool result and an answer on a newcomer's first run.
EMBEDDED_DEFAULT_POLICY: tuple[str, ...] = (REQUIRED, AUTO)


def default_policy(*, embedded_model: bool, has_tools: bool) -> tuple[str, ...]:
    """What ``tool_choice`` means when the user did not set it: ``required`` on the first turn,
    then ``auto``, for the embedded default model with tools defined; ``auto`` otherwise."""
    return EMBEDDED_DEFAULT_POLICY if embedded_model and has_tools else (AUTO,)


def choice_for_turn(policy: tuple[str, ...], turn: int) -> str:
    """The choice for assistant turn ``turn`` (0-based); the last entry repeats."""
    return policy[min(turn, len(policy) - 1)]


def validate_policy(policy: tuple[str, ...], tool_names: list[str]) -> None:
    for c in policy:
        if c in (AUTO, NONE):
            continue
        if c == REQUIRED:
            if not tool_names:
                raise ToolChoiceError("tool_choice 'required' needs at least one tool")
            continue
        if c not in tool_names:
            raise ToolChoiceError(f"tool_choice names tool {c!r}, which is not defined (tools: {', '.join(tool_names) or 'none'})")


def json_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters as JSON Schema (dialect type names mapped; see
    :mod:`backend.tools.dialect`); ToolChoiceError naming the field for what cannot be read."""
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    try:
        return to_json_schema(params, tool=fn.get("name"))[0]
    except SchemaDialectError as e:
        raise ToolChoiceError(f"tool '{fn.get('name')}': {e}") from None


def grammar_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` (JSON Schema) as the grammar should read it. xgrammar's strict mode admits only
    the keys an object lists in ``properties``; an object that lists keys in ``required`` but has
    no ``properties`` for them would admit only ``{}`` and break its own ``required``. Such keys
    get a ``{}`` (any value) property, and an object with no ``properties`` at all keeps JSON
    Schema's meaning (any keys) through ``"additionalProperties": true``."""
    out = json.loads(json.dumps(params))  # a copy (the schemas are JSON)
    for node, _ in iter_schemas(out):
        t = node.get("type")
        if not (t == "object" or isinstance(t, list) and "object" in t or t is None and ("properties" in node or "required" in node)):
            continue
        required = [k for k in node.get("required") or [] if isinstance(k, str)] if isinstance(node.get("required"), list) else []
        props = node.get("properties")
        if props is None:
            if "additionalProperties" not in node:
                node["additionalProperties"] = True
            if not required:
                continue
            props = node["properties"] = {}
        if isinstance(props, dict):
            for k in required:
                props.setdefault(k, {})
    return out


def call_grammar(fmt: ToolCallFormat, tools: list[dict[str, Any]], *, multiple: bool, max_calls: int | None = None) -> str:
    """EBNF accepting one (or, with ``multiple``, one or more; at most ``max_calls`` when given)
    calls to ``tools``: the format's rules around xgrammar's rules for one call's JSON body."""
    import xgrammar as xgr

    pairs = [(t.get("function", t)["name"], grammar_parameters(json_parameters(t))) for t in tools]
    try:
        custom = fmt.custom_grammar(pairs, multiple=multiple, max_calls=max_calls)
    except ToolChoiceError:
        raise
    except Exception as e:  # a schema the format's grammar cannot express
        raise ToolChoiceError(f"cannot build a grammar for these tool schemas: {e}") from e
    if custom is not None:
        return custom
    schema = fmt.call_schema([(t.get("function", t)["name"], grammar_parameters(json_parameters(t))) for t in tools])
    try:
        body = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": ")))
    except Exception as e:  # xgrammar rejects some schemas (unsupported keywords)
        raise ToolChoiceError(f"cannot build a grammar for these tool schemas: {e}") from e
    body = re.sub(r"(?m)^root ::=", "tool_body ::=", body)
    return "\n".join([*fmt.grammar_rules("tool_body", multiple=multiple, max_calls=max_calls), body])


def build_constraint(choice: str, parser_name: str, tools: list[dict[str, Any]], *, max_calls: int | None = None) -> Constraint | None:
    """The constraint for one turn, or None for ``auto``. ``max_calls`` bounds ``required``
    (the loop passes ``max_parallel_calls``: calls past it would be dropped, and a small model
    that may write another call instead of EOS would fill the turn's token budget with them)."""
    if choice == AUTO:
        return None
    fmt = get_format(parser_name)
    if fmt is None:
        supported = ", ".join(tool_call_formats())
        raise ToolChoiceError(f"tool_choice {choice!r} is not supported for the {parser_name!r} format (supported: {supported})")
    if choice == NONE:
        return Constraint(kind="forbid", spec=[fmt.forbid], description="tool_choice=none: no tool call")
    fmt_name = native_name(parser_name) or parser_name  # the native parser that reads the format
    if choice == REQUIRED:
        if fmt.max_calls_per_turn is not None:
            max_calls = fmt.max_calls_per_turn if max_calls is None else min(max_calls, fmt.max_calls_per_turn)
        grammar = call_grammar(fmt, tools, multiple=True, max_calls=max_calls)
        how_many = "one call" if max_calls == 1 else "one or more calls" if max_calls is None else f"1 to {max_calls} calls"
        description = f"tool_choice=required: {how_many} ({parser_name} format)"
        check = GivenTurnCheck(fmt_name, _allowed(tools), max_calls, description, fmt.reasoning_in_grammar)
        return Constraint(kind="grammar", spec=grammar, description=description, given_check=check)
    named = [t for t in tools if t.get("function", t).get("name") == choice]
    if not named:
        raise ToolChoiceError(f"tool_choice names tool {choice!r}, which is not defined")
    grammar = call_grammar(fmt, named, multiple=False)
    description = f"tool_choice={choice}: one call to {choice}"
    return Constraint(kind="grammar", spec=grammar, description=description,
                      given_check=GivenTurnCheck(fmt_name, _allowed(named), 1, description, fmt.reasoning_in_grammar))


def _allowed(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t.get("function", t)["name"]: json_parameters(t) for t in tools}


@dataclass(frozen=True)
class GivenTurnCheck:
    """What a tool_choice constraint means for a turn that was not generated under its grammar
    (see the module docstring): checked by parsing and jsonschema, not by the grammar."""

    parser: str  # the native format whose parser reads the turn
    tools: dict[str, dict[str, Any]]  # allowed tool name -> parameters as JSON Schema
    max_calls: int | None
    description: str
    allow_reasoning: bool = False  # the format's grammar admits its reasoning before the calls

    def check_text(self, text: str) -> str | None:
        """Why ``text`` (the turn without its EOS) breaks the constraint; None if it obeys."""
        from jsonschema import SchemaError
        from jsonschema.validators import validator_for

        tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in self.tools.items()]
        parsed = get_parser(self.parser, tools=tools).parse(text)  # formats that type values by schema need them
        errors = [e for e in parsed.errors if e.severity == "error"]  # a warning's call was read
        if errors:
            return f"a tool call cannot be read ({errors[0].message}), and {self.description} allows only well-formed calls"
        if not parsed.tool_calls:
            return f"the turn has no tool call, which {self.description} requires"
        other = " ".join(x for x in (None if self.allow_reasoning else parsed.reasoning, parsed.content)
                         if x and x.strip())
        if other:
            shown = other if len(other) <= 60 else other[:57] + "..."
            return f"the turn has text besides its tool calls ({shown!r}); {self.description} allows only the calls"
        n = len(parsed.tool_calls)
        if self.max_calls is not None and n > self.max_calls:
            return f"the turn has {n} tool calls; {self.description} allows at most {self.max_calls}"
        for i, c in enumerate(parsed.tool_calls):
            params = self.tools.get(c.name)
            if params is None:
                return f"call {i} is to {c.name!r}, which {self.description} does not allow (allowed: {', '.join(self.tools)})"
            try:
                bad = sorted(validator_for(params)(params).iter_errors(c.arguments), key=lambda e: list(map(str, e.absolute_path)))
            except SchemaError as e:
                return f"call {i} ({c.name!r}): the tool's parameters are not a valid JSON schema ({e.message})"
            if bad:
                path = "/".join(str(p) for p in bad[0].absolute_path)
                return (f"call {i} ({c.name!r}): the arguments do not match the tool's parameters: "
                        f"{path + ': ' if path else ''}{bad[0].message}")
        return None


# ---- checking token ids against a constraint (scripted backend, tests) ------------------------


def check_given(constraint: Constraint | None, tokenizer: Any, ids: list[int],
                stop_ids: tuple[int, ...] | None = None) -> str | None:
    """Why a whole turn that was NOT generated under ``constraint`` (a script, an imported turn;
    EOS included) breaks it; None if it obeys. A tool_choice grammar is checked by its meaning
    (:class:`GivenTurnCheck`: what the JSON Schema accepts), not token by token; anything else
    as :func:`check_ids` does."""
    check = getattr(constraint, "given_check", None)
    if constraint is None or constraint.kind != "grammar" or not isinstance(check, GivenTurnCheck):
        return check_ids(constraint, tokenizer, ids, stop_ids=stop_ids)
    eos = tokenizer.eos_token_id
    stops = tuple(stop_ids) if stop_ids else ((eos,) if eos is not None else ())
    if stops and (not ids or ids[-1] not in stops):
        return f"the turn does not end with EOS; under {constraint.description} a turn ends when its calls are complete"
    return check.check_text(tokenizer.decode(ids[:-1] if stops else ids, skip_special_tokens=False))


class _MatcherCache:
    def __init__(self) -> None:
        self._info: dict[tuple[int, tuple[int, ...] | None], Any] = {}
        self._compiled: dict[tuple[Any, str], Any] = {}

    def compiled(self, tokenizer: Any, grammar: str, stop_ids: tuple[int, ...] | None = None):
        import xgrammar as xgr

        key = (id(tokenizer), stop_ids)
        info = self._info.get(key)
        if info is None:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer),
                                                      stop_token_ids=list(stop_ids) if stop_ids else None)
            self._info[key] = info
        ck = (key, grammar)
        if ck not in self._compiled:
            self._compiled[ck] = xgr.GrammarCompiler(info).compile_grammar(grammar)
        return self._compiled[ck]


_CACHE = _MatcherCache()


def check_ids(constraint: Constraint, tokenizer: Any, ids: list[int], stop_ids: tuple[int, ...] | None = None) -> str | None:
    """Why ``ids`` (a whole generated turn, EOS included) violate ``constraint`` token by token
    (what the backend enforced while generating); None if they obey it. ``stop_ids``: the tokens
    that end a turn (default the tokenizer's EOS; gpt-oss also ends one on ``<|call|>``)."""
    if constraint is None or constraint.kind == "none":
        return None
    if constraint.kind == "forbid":
        text = tokenizer.decode(ids, skip_special_tokens=False)
        for s in constraint.spec:
            if s and s in text:
                return f"contains {s!r}, which {constraint.description or 'the constraint'} forbids"
        return None
    if constraint.kind != "grammar":
        return f"cannot check a {constraint.kind!r} constraint"
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(_CACHE.compiled(tokenizer, constraint.spec, tuple(stop_ids) if stop_ids else None))
    for i, t in enumerate(ids):
        if not matcher.accept_token(t):
            return f"token {i} ({tokenizer.decode([t])!r}) is not allowed by {constraint.description or 'the grammar'}"
    if not matcher.is_terminated():
        return f"the turn ends before {constraint.description or 'the grammar'} is complete (or without EOS)"
    return None
