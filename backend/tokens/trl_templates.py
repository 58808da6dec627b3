"""trl's chat templates, read from the installed ``trl`` package at run time (never copied into
this repository): their names, their text, and the ``*_training`` twin of a template. A leaf
module (the family renderers and the tokenizer layer both read templates through it)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from backend.errors import TokenizerLoadError
from backend.runtime import cache


@lru_cache(maxsize=1)
def _trl_templates_dir() -> Path | None:
    root = cache.package_dir("trl")
    return root / "chat_templates" if root is not None else None


@lru_cache(maxsize=1)
def _trl_template_names() -> tuple[str, ...]:
    root = _trl_templates_dir()
    if root is None or not root.is_dir():
        return ()
    return tuple(sorted(p.name[: -len(".jinja")] for p in root.iterdir() if p.name.endswith(".jinja")))


def trl_template_names() -> list[str]:
    return list(_trl_template_names())


def read_trl_template(name: str) -> str:
    fname = name if name.endswith(".jinja") else name + ".jinja"
    root = _trl_templates_dir()
    if root is None:
        raise TokenizerLoadError("trl is not installed; it ships the chat templates (pip install trl)")
    res = root / fname
    if not res.is_file():
        raise TokenizerLoadError(f"trl has no template {fname!r}; available: {', '.join(trl_template_names())}")
    return res.read_text(encoding="utf-8")


def training_variant(template_name: str | None) -> str | None:
    """trl's ``*_training.jinja`` twin (with ``{% generation %}`` tags), when it ships one."""
    if not template_name:
        return None
    base = template_name[: -len(".jinja")] if template_name.endswith(".jinja") else template_name
    if base.endswith("_training"):
        return base
    cand = base + "_training"
    return cand if cand in trl_template_names() else None


def closest_template_names(spec: str, n: int = 6) -> list[str]:
    """trl's template names most like ``spec`` (for an error that names what was probably meant):
    names that contain it or that it contains, then the closest by spelling; empty when none is close."""
    import difflib

    names = trl_template_names()
    base = str(spec).strip().lower()
    base = base[: -len(".jinja")] if base.endswith(".jinja") else base
    base = base.replace("-", "_").replace(".", "_")
    near = [x for x in names if base and (base in x or x in base)]
    near.sort(key=lambda x: (abs(len(x) - len(base)), x))
    for x in difflib.get_close_matches(base, names, n=n, cutoff=0.5):
        if x not in near:
            near.append(x)
    return near[:n]


def unknown_template_text(spec: str) -> str:
    """``'qwen3-instruct' is not one of trl's 72 templates (closest: qwen3_instruct_2507, ...)``; a path
    is not echoed."""
    s = str(spec).strip()
    if "/" in s or "\\" in s:  # a path: the same words whatever it names (nothing about the disk)
        return f"a path is not one of trl's {len(trl_template_names())} templates"
    shown = s if len(s) <= 60 else s[:57] + "..."
    near = closest_template_names(s)
    which = f"closest: {', '.join(near)}" if near else f"e.g. {', '.join(trl_template_names()[:6])}"
    return f"{shown!r} is not one of trl's {len(trl_template_names())} templates ({which})"
