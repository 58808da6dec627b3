"""Words for a run's end state, for people.

A trace keeps verl's termination code (``Trace.termination_reason``: ``no_tool_calls``,
``response_length``, ...) because trainers and scripts read it. Shown to a person, the code
misleads: ``no_tool_calls`` is how every normal run ends (the model answered without asking for
another tool), and newcomers read it as "the tool was not called". Everything the UI shows
puts :func:`termination_label` first and the code beside it: ``answered (no_tool_calls)``.

The codes, their words and their outcome are :class:`backend.trace.model.TerminationReason`'s
(the engine's, the rollout's ``error`` and what importers carry over from other tools).
"""

from __future__ import annotations

from typing import Any

from backend.trace.model import TerminationReason

# code -> what it means, in a few words (the words live on TerminationReason, one place per code)
TERMINATION_WORDS: dict[str, str] = {r.value: r.words for r in TerminationReason}

# end states that are not failures: a run that ends this way is shown as "ok"
OK_CODES = frozenset(r for r in TerminationReason if r.outcome == "ok")
# end states where the run stopped on a limit or on request, not on a failure
LIMIT_CODES = frozenset(r for r in TerminationReason if r.outcome == "limit")

NO_END_STATE = "no end state"
IMPORTED_NO_END_STATE = "imported (no end state)"


def termination_label(reason: str | None) -> str:
    """``"answered (no_tool_calls)"`` for a known code, the code itself for one this app does not
    know (a file may carry anything), ``"no end state"`` for none."""
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        return NO_END_STATE
    code = str(reason)
    words = TERMINATION_WORDS.get(code)
    return f"{words} ({code})" if words else code


def is_imported(trace: Any) -> bool:
    """Whether a trace came from another tool's file (an importer made it), not from our engine."""
    for s in getattr(trace, "steps", None) or []:
        if getattr(getattr(s, "info", None), "imported", None):
            return True
    md = getattr(trace, "metadata", None)
    return isinstance(md, dict) and md.get("ids") == "given"


def trace_termination_label(trace: Any) -> str:
    """:func:`termination_label` of a trace; an import that records no end state says so
    (``"imported (no end state)"``) rather than showing nothing."""
    reason = getattr(trace, "termination_reason", None)
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        return IMPORTED_NO_END_STATE if is_imported(trace) else NO_END_STATE
    return termination_label(reason)
