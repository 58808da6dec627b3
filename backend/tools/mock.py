"""Mock results for tools that exist only as a JSON schema.

A schema tool may carry a ``"mock"`` key next to ``"type"`` and ``"function"`` (without one, a
call gets a placeholder result marked ``mock="default"``; see ``MockTool``). Three forms:

``"mock": <any JSON value>`` (shorthand)
    Returned as it is: a string is the tool message text verbatim (it is **not** a template);
    anything else is sent as JSON text (``{"temperature": 21}`` → ``{"temperature": 21}``).

``"mock": {"value": <any JSON value>}``
    The same, spelled out. Use it when the value itself is an object whose only key is
    ``"value"`` or ``"template"``.

``"mock": {"template": <string, object or list>}``
    Filled from the call's arguments. In strings, ``{name}`` is replaced by the argument
    ``name`` (a string argument as is, any other value as JSON: ``3``, ``true``, ``["a"]``);
    ``{{`` and ``}}`` are literal braces. A template object or list is filled leaf by leaf
    and then sent as JSON, so JSON results need no brace escaping; a leaf that is exactly
    ``"{name}"`` becomes the argument value itself, keeping its type::

        {"mock": {"template": "It is 22C in {city}"}}
        {"mock": {"template": {"city": "{city}", "temperature": 22, "days": "{days}"}}}

    A placeholder whose argument was not passed uses the property's ``"default"`` from the
    schema when there is one; otherwise the call ends as an ``invalid_arguments`` error
    result. Placeholders must name a parameter of the tool (checked when the tool is loaded).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from backend.errors import UserError

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


class MockError(UserError):
    """A mock spec that cannot be used (raised at load time)."""


class MissingArgument(KeyError):
    """A template placeholder whose argument was not passed and has no default."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Mock:
    kind: str  # "value" | "template"
    data: Any

    @classmethod
    def parse(cls, spec: Any, parameters: dict[str, Any] | None = None) -> Mock:
        """Parse a ``"mock"`` entry; check template placeholders against ``parameters``."""
        if isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("value", "template"):
            key, data = next(iter(spec.items()))
            if key == "value":
                return cls("value", data)
            if not isinstance(data, (str, dict, list)):
                raise MockError(f"a mock template must be a string, an object or a list, got {type(data).__name__}")
            names = _placeholders(data)
            props = (parameters or {}).get("properties") or {}
            unknown = sorted(n for n in names if n not in props)
            if unknown:
                known = ", ".join(sorted(props)) or "none"
                raise MockError(
                    f"the mock template uses {', '.join('{' + n + '}' for n in unknown)} but the tool has no such "
                    f"parameter (parameters: {known}); write {{{{ and }}}} for literal braces"
                )
            return cls("template", data)
        return cls("value", spec)

    def render(self, arguments: dict[str, Any], parameters: dict[str, Any] | None = None) -> Any:
        """The mock's result for these arguments (a str, or a JSON value to be dumped).

        Raises :class:`MissingArgument` for a placeholder with no argument and no default.
        """
        if self.kind == "value":
            return copy.deepcopy(self.data)
        props = (parameters or {}).get("properties") or {}

        def lookup(name: str) -> Any:
            if name in arguments:
                return arguments[name]
            p = props.get(name)
            if isinstance(p, dict) and "default" in p:
                return p["default"]
            raise MissingArgument(name)

        return _fill(self.data, lookup)


def _placeholders(data: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(data, str):
        for m in _TOKEN.finditer(data):
            tok = m.group(0)
            if tok in ("{{", "}}"):
                continue
            name = m.group(1)
            if name is None:
                raise MockError(f"unbalanced brace in mock template {data!r}; write {{{{ or }}}} for a literal brace")
            name = name.strip()
            if not _NAME.match(name):
                raise MockError(f"bad placeholder {{{name}}} in mock template {data!r}: use {{argument_name}}")
            out.add(name)
    elif isinstance(data, dict):
        for k, v in data.items():
            out |= _placeholders(v)
    elif isinstance(data, list):
        for v in data:
            out |= _placeholders(v)
    return out


def _as_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _fill(data: Any, lookup) -> Any:
    if isinstance(data, str):
        m = re.fullmatch(r"\{\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*\}", data)
        if m:
            return lookup(m.group(1))  # a lone placeholder keeps the argument's type
        return _fill_str(data, lookup)
    if isinstance(data, dict):
        return {k: _fill(v, lookup) for k, v in data.items()}
    if isinstance(data, list):
        return [_fill(v, lookup) for v in data]
    return data


def _fill_str(s: str, lookup) -> str:
    def sub(m: re.Match) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        return _as_text(lookup(m.group(1).strip()))

    return _TOKEN.sub(sub, s)


def render_template_string(template: str, arguments: dict[str, Any]) -> str:
    """Fill one template string (for callers outside schema tools)."""
    _placeholders(template)

    def lookup(name: str) -> Any:
        if name in arguments:
            return arguments[name]
        raise MissingArgument(name)

    return _fill_str(template, lookup)
