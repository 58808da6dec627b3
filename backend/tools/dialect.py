"""Tool parameter schemas as people write them, read as JSON Schema where a step needs one.

Real tool catalogues (the Berkeley Function Calling Leaderboard's thousands of functions, many
hand-written lists) name types the way Python, Java or JavaScript do: ``dict``, ``float``,
``tuple``, ``any``, ``long``, ``String``. Chat templates do not care: transformers renders any
JSON, and so do we (tools go into the template exactly as given). Two steps do need JSON Schema:
argument validation (jsonschema) and the ``tool_choice`` grammar (xgrammar). For them
:func:`to_json_schema` returns a copy in which the common dialect is mapped, case-insensitively,
and a :class:`TypeMapping` for each name it changed, so the change is reported, never silent:

========================================================  ==============
given ``"type"``                                          read as
========================================================  ==============
``dict``, ``map``, ``hashmap``, ``hashtable``             ``object``
``float``, ``double``                                     ``number``
``int``, ``long``, ``short``, ``byte``, ``bigint``        ``integer``
``str``, ``char``                                         ``string``
``bool``                                                  ``boolean``
``list``, ``tuple``, ``set``, ``arraylist``, ``queue``,   ``array``
``stack``
``none``                                                  ``null``
``any``                                                   no constraint (the ``"type"`` is dropped)
========================================================  ==============

plus any JSON Schema name in another case (``String`` → ``string``). A list-valued ``"items"``
(the old tuple form) is read as ``"prefixItems"``. A type name that is none of these cannot be
understood: :class:`SchemaDialectError` names the field (``parameters/properties/when/type``)
and the fix.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from backend.errors import UserError

JSON_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")

# lower-cased name -> JSON Schema type (None: any value)
TYPE_NAMES: dict[str, str | None] = {
    **{t: t for t in JSON_TYPES},
    "dict": "object", "map": "object", "hashmap": "object", "hashtable": "object",
    "float": "number", "double": "number",
    "int": "integer", "long": "integer", "short": "integer", "byte": "integer", "bigint": "integer",
    "str": "string", "char": "string",
    "bool": "boolean",
    "list": "array", "tuple": "array", "set": "array", "arraylist": "array", "queue": "array", "stack": "array",
    "none": "null",
    "any": None,
}

# keywords whose value is one schema / a list of schemas / an object of schemas
_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties")
_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

MAX_DEPTH = 100


class SchemaDialectError(UserError):
    """A parameter schema with a type name that cannot be read as JSON Schema."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class TypeMapping:
    """One dialect name read as JSON Schema: at ``path``, ``given`` was read as ``used``
    (``None``: no type constraint)."""

    path: str
    given: Any
    used: Any
    tool: str | None = None

    def __str__(self) -> str:
        used = "any type (no constraint)" if self.used is None else repr(self.used)
        where = f"tool '{self.tool}': " if self.tool else ""
        return f"{where}{self.path} {self.given!r} read as {used}"

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "path": self.path, "given": self.given, "used": self.used}


def map_type_name(name: str) -> tuple[bool, str | None]:
    """``(known, json_type)`` for one type name (case-insensitive); ``json_type`` None is "any"."""
    key = name.strip().lower()
    if key in TYPE_NAMES:
        return True, TYPE_NAMES[key]
    return False, None


def to_json_schema(schema: Any, path: str = "parameters", *, tool: str | None = None) -> tuple[Any, list[TypeMapping]]:
    """``schema`` with dialect type names mapped to JSON Schema (a deep copy; the input is left
    as it is) and the list of what was mapped. Raises :class:`SchemaDialectError` for a type name
    that cannot be understood. Anything else that is not valid JSON Schema is left for the
    validator to report."""
    out = copy.deepcopy(schema)
    mappings: list[TypeMapping] = []
    declared = out.get("$schema") if isinstance(out, dict) else None
    # a list "items" is valid in drafts up to 2019-09: convert it only where 2020-12 applies
    convert_tuple_items = not (isinstance(declared, str) and "2020-12" not in declared)
    stack: list[tuple[Any, str, int]] = [(out, path, 0)]
    while stack:
        node, where, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > MAX_DEPTH:
            raise SchemaDialectError(where, f"nested more than {MAX_DEPTH} levels deep")
        if "type" in node:
            _map_type(node, f"{where}/type", mappings, tool)
        items = node.get("items")
        if isinstance(items, list) and "prefixItems" not in node and convert_tuple_items:
            node["prefixItems"] = node.pop("items")
            mappings.append(TypeMapping(f"{where}/items", "a list of schemas", "prefixItems", tool))
        stack.extend((c, p, depth + 1) for c, p in reversed(_children(node, where)))
    return out, mappings  # in document order


def _children(node: dict[str, Any], where: str) -> list[tuple[Any, str]]:
    """The subschemas of one schema object, with their paths, in document order."""
    children: list[tuple[Any, str]] = []
    for k in _ONE:
        if isinstance(node.get(k), dict):
            children.append((node[k], f"{where}/{k}"))
    for k in _LIST:
        if isinstance(node.get(k), list):
            children += [(v, f"{where}/{k}/{i}") for i, v in enumerate(node[k])]
    for k in _MAP:
        if isinstance(node.get(k), dict):
            children += [(v, f"{where}/{k}/{name}") for name, v in node[k].items()]
    return children


def iter_schemas(schema: Any, path: str = "parameters") -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object in ``schema`` (itself included), with its path, parents first; at
    most :data:`MAX_DEPTH` levels deep."""
    stack: list[tuple[Any, str, int]] = [(schema, path, 0)]
    while stack:
        node, where, depth = stack.pop()
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            continue
        yield node, where
        stack.extend((c, p, depth + 1) for c, p in reversed(_children(node, where)))


def _map_type(node: dict[str, Any], where: str, mappings: list[TypeMapping], tool: str | None) -> None:
    given = node["type"]
    if isinstance(given, str):
        known, used = map_type_name(given)
        if not known:
            raise SchemaDialectError(where, _unknown(given))
        if used is None:
            del node["type"]
            mappings.append(TypeMapping(where, given, None, tool))
        elif used != given:
            node["type"] = used
            mappings.append(TypeMapping(where, given, used, tool))
        return
    if isinstance(given, list) and all(isinstance(t, str) for t in given):
        mapped: list[str] = []
        anything = False
        for t in given:
            known, used = map_type_name(t)
            if not known:
                raise SchemaDialectError(where, _unknown(t))
            if used is None:
                anything = True
            elif used not in mapped:
                mapped.append(used)
        if anything:
            del node["type"]
            mappings.append(TypeMapping(where, given, None, tool))
        elif mapped != given:
            node["type"] = mapped
            mappings.append(TypeMapping(where, given, mapped, tool))
    # any other value: the JSON Schema validator reports it with its path


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name.strip().lower(), list(TYPE_NAMES), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"unknown type {name!r}: {hint}use a JSON Schema type ({', '.join(JSON_TYPES)}), one of the common "
            "names that are read as one (dict, float, double, int, long, str, bool, list, tuple, any), or leave "
            "\"type\" out to accept any value")


def summarize(mappings: list[TypeMapping]) -> str:
    """One line for many mappings, e.g. ``7 parameter type name(s) in 3 tool(s) are not JSON
    Schema (float→number ×4, dict→object ×3): rendered as given; ...``."""
    counts: dict[str, int] = {}
    for m in mappings:
        used = "(any type)" if m.used is None else m.used if isinstance(m.used, str) else "/".join(m.used)
        given = m.given if isinstance(m.given, str) else "/".join(map(str, m.given)) if isinstance(m.given, list) else str(m.given)
        key = f"{given}→{used}"
        counts[key] = counts.get(key, 0) + 1
    tools = {m.tool for m in mappings}
    parts = ", ".join(f"{k} ×{v}" if v > 1 else k for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"{len(mappings)} parameter type name(s) in {len(tools)} tool(s) are not JSON Schema ({parts}): rendered as "
            "given; argument validation and tool_choice read them as the JSON Schema type after the arrow")
