"""Re-render audit: would a full re-render of a rollout's messages — what many trainers still do
to build a training sample — give the ids the model was shown, and if not, why.

For every trace: re-render the final messages with the tokenizer's template
(:func:`backend.checks.diagnostics.rerender`), align both token sequences and name each difference by
cause (:func:`backend.checks.diagnostics.drift`: a dropped or added turn separator, reasoning stripped,
arguments re-serialised, BPE re-tokenisation, tool-call markup, context rendered differently).
The separator the template writes after the *last* turn is counted apart (``trailing``): nothing
was generated after it. A rollout *breaks* when any other difference is left.

:func:`audit` folds many traces into one :class:`AuditReport`: how many break, by cause (a
rollout counts once under each cause it has), and where (the assistant turn each difference
falls in), so a user reads "17 of 64 rollouts break: 12 turn separator, 5 reasoning stripped"
before training on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from backend.checks.diagnostics import DRIFT_CAUSES, Difference, drift, rerender
from backend.tokens.template_errors import RenderError
from backend.trace import Trace
from backend.trace.model import StepState

#: the causes in the order reports list them
CAUSES = tuple(DRIFT_CAUSES)
CAUSE_LABELS = {**DRIFT_CAUSES, "turn_separator": "turn separator dropped", "render_failed": "the template cannot render the messages"}


@dataclass
class TraceAudit:
    """One trace's audit. ``differences``: every difference but the trailing separator, each with
    the assistant turn it falls in (``turns``, same order; 0 = the prompt). ``error``: why the
    trace could not be audited (no ids, a render failure)."""

    id: str
    loop_tokens: int = 0
    render_tokens: int = 0
    differences: list[Difference] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    trailing: bool = False
    error: str | None = None
    tool_turns: str | None = None

    @property
    def broken(self) -> bool:
        return bool(self.differences) or self.error is not None and self.error.startswith("render failed")

    @property
    def causes(self) -> dict[str, int]:
        """cause → places, in :data:`CAUSES` order."""
        out: dict[str, int] = {}
        for d in self.differences:
            out[d.cause] = out.get(d.cause, 0) + 1
        return {c: out[c] for c in (*CAUSES, *sorted(set(out) - set(CAUSES))) if c in out}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "broken": self.broken, "tool_turns": self.tool_turns, "loop_tokens": self.loop_tokens,
            "render_tokens": self.render_tokens, "causes": self.causes, "trailing_separator": self.trailing,
            "error": self.error,
            "first_break": self.differences[0].position if self.differences else None,
            "differences": [{"cause": d.cause, "op": d.op, "loop": list(d.loop), "render": list(d.render), "turn": t}
                            for d, t in list(zip(self.differences, self.turns))[:50]],
        }


def _turn_of(trace: Trace) -> Callable[[int], int]:
    """Position → the assistant turn whose tokens (or whose preceding context) hold it."""
    starts = [s.start for s in trace.steps if s.state == StepState.GENERATING]
    import bisect

    return lambda pos: bisect.bisect_right(starts, pos)


def audit_trace(trace: Trace, bundle: Any) -> TraceAudit:
    mode = trace.config.get("tool_turns") if isinstance(trace.config, dict) else None
    a = TraceAudit(id=trace.id, loop_tokens=len(trace.input_ids), tool_turns=mode)
    if not trace.input_ids:
        a.error = "no token ids: nothing to compare (a text-only trace)"
        return a
    try:
        _, rendered = rerender(trace, bundle)
    except RenderError as e:
        a.error = f"render failed: {e}"
        return a
    except Exception as e:  # noqa: BLE001 - a tokenizer or template that breaks on this trace: that trace only
        a.error = f"not audited: {type(e).__name__}: {str(e)[:200]}"
        return a
    a.render_tokens = len(rendered)
    turn = _turn_of(trace)
    for d in drift(trace, bundle, rendered):
        if d.cause == "trailing_separator":
            a.trailing = True
            continue
        a.differences.append(d)
        a.turns.append(turn(d.position))
    return a


@dataclass
class AuditReport:
    traces: list[TraceAudit] = field(default_factory=list)

    @property
    def audited(self) -> list[TraceAudit]:
        return [t for t in self.traces if t.error is None or t.broken]

    @property
    def broken(self) -> list[TraceAudit]:
        return [t for t in self.traces if t.broken]

    def by_cause(self) -> dict[str, int]:
        """cause → rollouts that have it (a rollout counts once under each of its causes)."""
        out: dict[str, int] = {}
        for t in self.traces:
            for c in t.causes:
                out[c] = out.get(c, 0) + 1
            if t.error and t.error.startswith("render failed"):
                out["render_failed"] = out.get("render_failed", 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def by_turn(self) -> dict[int, dict[str, int]]:
        """assistant turn → cause → places."""
        out: dict[int, dict[str, int]] = {}
        for t in self.traces:
            for d, turn in zip(t.differences, t.turns):
                out.setdefault(turn, {})[d.cause] = out.setdefault(turn, {}).get(d.cause, 0) + 1
        return dict(sorted(out.items()))

    def sentence(self) -> str:
        n, b = len(self.audited), len(self.broken)
        skipped = len(self.traces) - n
        tail = f" ({skipped} not audited: no token ids or no tokenizer to re-render with)" if skipped else ""
        if not b:
            return f"0 of {n} rollouts break under a full re-render{tail}"
        causes = ", ".join(f"{k} {CAUSE_LABELS.get(c, c)}" for c, k in self.by_cause().items())
        return f"{b} of {n} rollouts break under a full re-render: {causes}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.sentence(), "traces": len(self.traces), "audited": len(self.audited),
                "broken": len(self.broken), "by_cause": self.by_cause(),
                "by_turn": {str(k): v for k, v in self.by_turn().items()},
                "cause_labels": {c: CAUSE_LABELS.get(c, c) for c in self.by_cause()},
                "rollouts": [t.to_dict() for t in self.traces]}


def audit(traces: Iterable[Trace], bundle_for: Callable[[Trace], Any]) -> AuditReport:
    """Audit each trace with the bundle ``bundle_for`` gives it (None: not audited, and why is
    the trace's ``error``)."""
    rep = AuditReport()
    for t in traces:
        b = bundle_for(t)
        if isinstance(b, str) or b is None:
            rep.traces.append(TraceAudit(id=t.id, loop_tokens=len(t.input_ids), error=b or "no tokenizer to re-render with"))
            continue
        rep.traces.append(audit_trace(t, b))
    return rep
