"""One line for a chat template's failure, with the template line it happened on.

Jinja knows where a template failed: a syntax error carries ``lineno``; an error raised while
rendering (``raise_exception(...)``, an undefined value, a Python error inside a filter) has a
traceback in which jinja's rewritten frames are named ``<template>`` and numbered by template
line. Used by :func:`backend.tokens.rendering.render_text` and by the guarded render worker
(:mod:`backend.tokens.template_guard`), so a user's template error says where to look.

Kept free of heavy imports: the worker process imports it.
"""

from __future__ import annotations


class RenderError(ValueError):
    """The chat template (or a family's own renderer) failed on these messages; the message says why."""


TEMPLATE_FRAME = "<template>"  # jinja's name for frames of compiled template code


def template_line(e: BaseException) -> int | None:
    """The template line ``e`` happened on, or None when it cannot be told."""
    lineno = getattr(e, "lineno", None)  # TemplateSyntaxError, TemplateAssertionError
    if isinstance(lineno, int) and lineno > 0:
        return lineno
    line = None
    tb = e.__traceback__
    while tb is not None:  # the innermost template frame is where it failed (inside a macro too)
        if tb.tb_frame.f_code.co_filename == TEMPLATE_FRAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def template_error_text(e: BaseException) -> str:
    """``"TemplateSyntaxError at template line 3: unexpected 'end of print statement'"``."""
    line = template_line(e)
    where = f" at template line {line}" if line else ""
    msg = str(e).strip()
    return f"{type(e).__name__}{where}: {msg}" if msg else f"{type(e).__name__}{where}"
