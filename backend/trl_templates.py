"""trl's chat templates, read from the installed ``trl`` package at run time (never copied into
this repository): their names, their text, and the ``*_training`` twin of a template. A leaf
module (the family renderers and the tokenizer layer both read templates through it)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from backend import cache
from backend.errors import TokenizerLoadError


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
