"""Schemas for sandboxed functions without running their code here.

The sandbox child describes each function as JSON (name, docstring, parameters, resolved type
hints encoded by ``_sandbox_child._encode_hint``). Here we rebuild a stand-in function with the
same name, docstring, signature shape and equivalent type hints, and hand it to transformers'
``get_json_schema``: the schema is exactly the one the real function would get, and no user
code runs in the server. Classes the schema cannot tell apart map to fresh empty classes
(``{"type": "object"}``, as for any custom class); ``torch.Tensor`` and ``PIL.Image.Image`` map
to the real classes when those libraries are installed, as transformers treats them specially.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any

from backend.tools.base import ToolLoadError
from backend.tools.function_tool import schema_from_function

_BUILTINS = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple, "dict": dict}
_LITERAL_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "NoneType": type(None)}
_SPECIAL_CLASSES = {"torch.Tensor": ("torch", "Tensor"), "PIL.Image.Image": ("PIL.Image", "Image")}
_NO_DEFAULT = inspect.Parameter.empty
_KINDS = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD")


class _Default:
    """Stands for a parameter's default value (only its presence matters to the schema)."""

    def __repr__(self) -> str:
        return "<default>"


class UnsupportedHint(Exception):
    pass


def decode_hint(d: Any) -> Any:
    if not isinstance(d, dict):
        raise ValueError("bad type hint description")
    t = d.get("t")
    if t == "none":
        return type(None)
    if t == "any":
        return typing.Any
    if t == "builtin":
        return _BUILTINS[d["name"]]
    if t == "class":
        name = str(d.get("name"))
        special = _SPECIAL_CLASSES.get(name)
        if special:
            try:  # a trusted library, not user code
                return getattr(importlib.import_module(special[0]), special[1])
            except Exception:  # noqa: BLE001
                pass
        return type(name.rsplit(".", 1)[-1].replace("<", "_").replace(">", "_") or "Hint", (), {})
    if t == "union":
        args = tuple(decode_hint(a) for a in d["args"])
        return typing.Union[args] if len(args) > 1 else args[0]
    if t == "literal":
        vals = []
        for v in d["values"]:
            ty = _LITERAL_TYPES.get(v.get("ty"))
            vals.append(object() if ty is None else (None if ty is type(None) else ty(v["v"])))
        return typing.Literal[tuple(vals)]
    if t == "generic":
        origin = _BUILTINS[d["origin"]]
        args = tuple(Ellipsis if a.get("t") == "ellipsis" else decode_hint(a) for a in d["args"])
        if not args:
            return origin
        return origin[args]
    if t == "unsupported":
        raise UnsupportedHint(f"Couldn't parse this type hint, likely due to a custom class or object: {d.get('repr')}")
    raise ValueError(f"unknown type hint kind {t!r}")


def stub_function(desc: dict[str, Any]) -> Any:
    """A function object with the described name, docstring, signature and type hints."""
    name = desc["name"]
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"bad function name {name!r}")
    hints = {k: decode_hint(v) for k, v in (desc.get("hints") or {}).items()}
    params = []
    for p in desc.get("params") or []:
        if p.get("kind") not in _KINDS:
            raise ValueError(f"bad parameter kind {p.get('kind')!r}")
        kind = getattr(inspect.Parameter, p["kind"])
        ann = hints.get(p["name"], _NO_DEFAULT) if p.get("annotated") else _NO_DEFAULT
        default = _Default() if p.get("default") and kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) else _NO_DEFAULT
        params.append(inspect.Parameter(p["name"], kind, default=default, annotation=ann))
    ret = hints.get("return", inspect.Signature.empty)

    def stub(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise RuntimeError("schema stand-in; not callable")

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = desc.get("doc")
    stub.__signature__ = inspect.Signature(params, return_annotation=ret)  # type: ignore[attr-defined]
    stub.__annotations__ = hints
    return stub


def schema_from_description(desc: dict[str, Any]) -> dict[str, Any]:
    """``get_json_schema`` of the described function (ToolLoadError when it has none)."""
    name = desc.get("name")
    line = desc.get("line")
    where = f" (line {line})" if isinstance(line, int) else ""
    try:
        stub = stub_function(desc)
    except UnsupportedHint as e:
        raise ToolLoadError(
            f"cannot build a schema for function '{name}'{where}: {str(e).rstrip('. ')}. A tool function needs a docstring with a "
            "description and an Args: section describing every argument, and a type hint on every argument"
        ) from None
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ToolLoadError(f"function '{name}'{where}: unreadable description from the sandbox ({type(e).__name__}: {e})") from None
    stub.__code__ = stub.__code__.replace(co_firstlineno=line) if isinstance(line, int) and line > 0 else stub.__code__
    return schema_from_function(stub)
