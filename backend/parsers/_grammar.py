"""Grammar pieces for the formats whose ``tool_choice`` grammar is not a JSON body between tags
(:meth:`~backend.parsers.format.ToolCallFormat.custom_grammar`): xgrammar's JSON-schema rules
renamed apart (one set per tool: :func:`prefix_rules`, :func:`json_schema_rules`), text that
must not contain given tags (:func:`text_without`), the root rule that lays out one or several
calls (:func:`calls_root`), and a JSON Schema -> EBNF converter for Python literals written the
JSON way (pythonic calls: ``"strings"``, numbers, ``True``/``False``/``None``, ``[...]``,
``{"key": ...}``).

Example (DeepSeek V3, two tools, ``required``)::

    root ::= "<｜tool▁calls▁begin｜>" call ("\\n" call)* "<｜tool▁calls▁end｜>"
    call ::= (t0_call) | (t1_call)
    t0_call ::= "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\\n```json\\n" t0_root "\\n```<｜tool▁call▁end｜>"
    t0_root ::= ...   (xgrammar's rules for get_weather's parameters, every rule named t0_*)

The Python-literal converter reads a subset of JSON Schema: ``type`` (one or a list), ``enum``,
``const``, ``anyOf``/``oneOf``, ``properties`` (in order; ``required`` ones must be written, the
others may be left out; no other key is admitted, as xgrammar's strict mode does), object
``additionalProperties`` as a schema when there are no ``properties``, and array ``items``.
Keywords that only narrow a value (``minimum``, ``pattern``, ``maxItems``, ``format``, ...) are
left to the arguments' jsonschema validation (:data:`VALUE_CONSTRAINTS`); keywords whose
structure it cannot follow (``$ref``, ``allOf``, ``not``, ...) raise ``ValueError`` rather than
admit values of another shape.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from backend.parsers.format import MAX_SPELLED_CALLS, ebnf_literal

# ---- xgrammar's JSON rules, one set per tool -----------------------------------------------------

_RULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE_HEAD = re.compile(r"(?m)^([A-Za-z_][A-Za-z0-9_]*) ::=")


def prefix_rules(ebnf: str, prefix: str) -> str:
    """``ebnf`` with every rule it defines renamed ``prefix + name``, in definitions and uses, so
    that several tools' grammars live in one (two tools' ``root`` become ``t0_root``, ``t1_root``).
    Text inside string literals and character classes is left alone (a property named ``root`` is
    the literal ``"\\"root\\""``), and only whole words are renamed. Linear in the grammar's size."""
    names = set(_RULE_HEAD.findall(ebnf))
    out: list[str] = []
    i, n = 0, len(ebnf)
    while i < n:
        c = ebnf[i]
        if c in "\"[":  # a string literal or a character class, with backslash escapes
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != close:
                j += 2 if ebnf[j] == "\\" else 1
            out.append(ebnf[i : j + 1])
            i = j + 1
            continue
        m = _RULE_NAME.match(ebnf, i)
        if m is not None and (i == 0 or not (ebnf[i - 1].isalnum() or ebnf[i - 1] == "_")):
            word = m.group()
            out.append(prefix + word if word in names else word)
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def json_schema_rules(schema: dict[str, Any], prefix: str) -> tuple[str, str]:
    """``(root rule name, rules)``: xgrammar's grammar for one JSON value of ``schema`` (compact
    JSON, ``", "`` and ``": "``), its rules renamed with ``prefix`` (the value is ``prefix + "root"``)."""
    import xgrammar as xgr

    body = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": ")))
    return prefix + "root", prefix_rules(body, prefix).strip()


# ---- text without tags, and the calls' layout ---------------------------------------------------------


def text_without(name: str, patterns: tuple[str, ...]) -> list[str]:
    """The rule ``name``: any text (possibly empty) that contains none of ``patterns`` (tags).

    xgrammar's ``TagDispatch`` builtin with ``excludes`` (what its structural tags' ``any_text``
    compiles to): one rule the compiler handles natively. The character-by-character automaton
    this replaced took ~800 ms to compile over a 151k vocabulary; this takes ~26 ms."""
    for p in patterns:
        if not p or "\n" in p:
            raise ValueError(f"text_without: {p!r} cannot be excluded")
    excludes = ", ".join(ebnf_literal(p) for p in patterns)
    return [f"{name} ::= TagDispatch(loop_after_dispatch=false, excludes=({excludes}))"]


def calls_root(call_rule: str, *, open_: str, sep: str, close: str, multiple: bool, max_calls: int | None) -> str:
    """``root ::= open call (sep call)* close``: one call, or with ``multiple`` one or more (at
    most ``max_calls``; up to :data:`MAX_SPELLED_CALLS` the bound is spelled out)."""
    lit = ebnf_literal
    sep_part = f"{lit(sep)} " if sep else ""
    more = ""
    if multiple and max_calls is not None and max_calls <= MAX_SPELLED_CALLS:
        for _ in range(max_calls - 1):
            more = f"({sep_part}{call_rule}{' ' + more if more else ''})?"
    elif multiple:
        more = f"({sep_part}{call_rule})*"
    parts = [lit(open_) if open_ else "", call_rule, more, lit(close) if close else ""]
    return "root ::= " + " ".join(p for p in parts if p)


# ---- Python literals, written the JSON way ----------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENT = re.compile(r"[^\W\d]\w*")
_PY_KEYWORDS = frozenset(
    "False None True and as assert async await break class continue def del elif else except finally for from "
    "global if import in is lambda nonlocal not or pass raise return try while with yield".split()
)


def is_identifier(s: str) -> bool:
    """A Python identifier that is not a keyword (usable as a keyword argument)."""
    return isinstance(s, str) and _IDENT.fullmatch(s) is not None and s not in _PY_KEYWORDS and s.isidentifier()


def py_str(s: str) -> str:
    """``s`` as a Python string literal written as JSON writes it (lone surrogates escaped, as
    Python source cannot hold them)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(s, ensure_ascii=False))


def py_literal(value: Any) -> str:
    """A JSON value as Python literal source: JSON's text with ``True``/``False``/``None``."""
    if value is None:
        return "None"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no Python literal")
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_str(str(k))}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"a {type(value).__name__} is not a JSON value")


# Shared rules (once per grammar).
PY_BASE_RULES = r"""py_any ::= py_str | py_num | "True" | "False" | "None" | py_list | py_dict
py_str ::= "\"" py_char* "\""
py_char ::= [^"\\\0-\x1f] | "\\" py_escape
py_escape ::= ["\\bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]
py_int ::= "-"? ("0" | [1-9] [0-9]*)
py_num ::= py_int ("." [0-9]+)? ([eE] [+\-]? [0-9]+)?
py_bool ::= "True" | "False"
py_list ::= "[" "]" | "[" py_any (", " py_any)* "]"
py_dict ::= "{" "}" | "{" py_str ": " py_any (", " py_str ": " py_any)* "}"
"""

# Keywords whose structure the Python-literal grammar cannot follow: refused (a grammar that
# admitted values of another shape would not be the schema's).
_UNSUPPORTED = frozenset({
    "$ref", "$defs", "definitions", "allOf", "not", "if", "then", "else", "prefixItems", "contains",
    "patternProperties", "propertyNames", "dependentSchemas", "additionalItems", "unevaluatedProperties",
    "unevaluatedItems",
})
# Keywords that only narrow a value of the right shape (a range, a length, a pattern, a format):
# the grammar writes the shape and leaves these to the arguments' jsonschema validation (the
# engine's check of a given turn, the invalid_arguments finding), as they are common in
# real-world tools and refusing them made tool_choice unusable there.
VALUE_CONSTRAINTS = frozenset({
    "pattern", "minLength", "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems", "uniqueItems", "minContains", "maxContains", "minProperties",
    "maxProperties", "dependentRequired",
})


def _extra(schema: dict[str, Any]) -> Any:
    """What an object schema without ``properties`` admits besides them: False (nothing), True
    (anything) or a schema. Listed (even empty) ``properties`` admit no other key unless
    ``additionalProperties`` says otherwise (xgrammar's strict mode)."""
    extra = schema.get("additionalProperties")
    if extra is None:
        return not isinstance(schema.get("properties"), dict)
    return True if extra == {} else extra


class PyLiteralGrammar:
    """Builds EBNF rules for Python-literal values of JSON Schemas (see the module docstring);
    rules are named ``prefix`` + a counter. ``rules`` holds them once built."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.rules: list[str] = []

    def _rule(self, body: str) -> str:
        name = f"{self.prefix}{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def chain(self, items: list[tuple[str, str, bool]]) -> str:
        """A rule for ``items`` (``(literal head, value expression, required)``) written in order,
        separated by ``", "``, the optional ones possibly left out."""
        after = first = '""'
        for head, value, required in reversed(items):
            item = f"{ebnf_literal(head)} {value}"
            if required:
                new_after = self._rule(f'", " {item} {after}')
                new_first = self._rule(f"{item} {after}")
            else:
                new_after = self._rule(f'(", " {item} {after}) | {after}')
                new_first = self._rule(f"({item} {after}) | {first}")
            after, first = new_after, new_first
        return first

    def keyword_args(self, params: dict[str, Any]) -> str:
        """A rule for a call's keyword arguments ``k=v, ...`` for the parameters schema ``params``."""
        props = params.get("properties")
        if not isinstance(props, dict) or not props:
            extra = _extra(params)
            if extra is False:
                return '""'  # no arguments at all
            value = "py_any" if extra is True else self.value(extra, 1)
            kw = r'[a-zA-Z_] [a-zA-Z0-9_]* "="'
            return self._rule(f'"" | {kw} {value} (", " {kw} {value})*')
        required = set(params.get("required") or [])
        items = []
        for key, sub in props.items():
            if not is_identifier(key):
                raise ValueError(f"parameter {key!r} cannot be written as a Python keyword argument")
            items.append((f"{key}=", self.value(sub, 1), key in required))
        listed = self.chain(items)
        extra = params.get("additionalProperties")
        if extra is not True and not isinstance(extra, dict):
            return listed  # listed properties admit no other key (xgrammar's strict mode)
        kw = r'[a-zA-Z_] [a-zA-Z0-9_]* "="'
        value = "py_any" if extra is True or extra == {} else self.value(extra, 1)
        if required & set(props):  # the listed part is never empty: more keywords may follow it
            return self._rule(f'{listed} (", " {kw} {value})*')
        # nothing required: any keywords (the listed ones then take any value; the given-turn
        # check still validates them against the schema)
        return self._rule(f'"" | {kw} {value} (", " {kw} {value})*')

    def value(self, schema: Any, depth: int) -> str:
        """An EBNF expression for one value of ``schema``."""
        if depth > 64:
            raise ValueError("schema nested too deeply")
        if schema is True or schema == {}:
            return "py_any"
        if not isinstance(schema, dict):
            raise ValueError(f"not a JSON schema: {schema!r:.60}")
        bad = sorted(_UNSUPPORTED & set(schema))
        if bad:
            raise ValueError(f"JSON Schema keyword {bad[0]!r} is not supported by the pythonic tool_choice grammar")
        if "const" in schema:
            return ebnf_literal(py_literal(schema["const"]))
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise ValueError("enum must be a non-empty list")
            return "(" + " | ".join(ebnf_literal(py_literal(v)) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                subs = schema[key]
                if not isinstance(subs, list) or not subs:
                    raise ValueError(f"{key} must be a non-empty list")
                rest = {k: v for k, v in schema.items() if k != key and k not in ("description", "title", "default", "examples")}
                return "(" + " | ".join(self.value({**rest, **s} if isinstance(s, dict) else s, depth + 1) for s in subs) + ")"
        t = schema.get("type")
        if t is None:
            if "properties" in schema or "required" in schema or "additionalProperties" in schema:
                t = "object"
            elif "items" in schema:
                t = "array"
            else:
                return "py_any"
        types = t if isinstance(t, list) else [t]
        alts = [self._typed(x, schema, depth) for x in types]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def _typed(self, t: Any, schema: dict[str, Any], depth: int) -> str:
        if t == "string":
            return "py_str"
        if t == "integer":
            return "py_int"
        if t == "number":
            return "py_num"
        if t == "boolean":
            return "py_bool"
        if t == "null":
            return '"None"'
        if t == "array":
            items = schema.get("items", True)
            if items is True or items == {}:
                return "py_list"
            v = self.value(items, depth + 1)
            return self._rule(f'"[" "]" | "[" {v} (", " {v})* "]"')
        if t == "object":
            props = schema.get("properties")
            if isinstance(props, dict) and props:
                required = set(schema.get("required") or [])
                items = [(py_str(k) + ": ", self.value(sub, depth + 1), k in required) for k, sub in props.items()]
                return self._rule(f'"{{" {self.chain(items)} "}}"')
            extra = _extra(schema)
            if extra is False:
                return ebnf_literal("{}")
            if extra is True:
                return "py_dict"
            v = self.value(extra, depth + 1)
            return self._rule(f'"{{" "}}" | "{{" py_str ": " {v} (", " py_str ": " {v})* "}}"')
        raise ValueError(f"JSON Schema type {t!r} is not supported by the pythonic tool_choice grammar")
