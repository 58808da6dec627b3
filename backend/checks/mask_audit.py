"""Mask audit: does a stored loss mask follow the sequence's structure?

A trainer's file (verl, slime, prime-rl, NeMo-RL ...) stores token ids and a loss mask side by
side, and the mask is where the bugs are: tool output left at 1 (slime#1370: the policy is trained
to write its tools' answers), the end-of-turn token at 0 (the model never learns to stop), the
separator a builder inserts after a turn trained on. This audit reads the structure from the ids
alone, never from the mask it checks:

* a generated turn starts at the response's first token, and after that right after a resume
  marker: the template's generation header after a user turn (the ids ``add_generation_prompt``
  appends: Qwen's ``<|im_start|>assistant\n``), or what it writes after a tool result from its
  last special token on (the header again for most templates; DeepSeek V3 writes no header after
  tool outputs, so ``<｜tool▁outputs▁end｜>``; Mistral ``[/TOOL_RESULTS]``), both found by
  rendering a probe conversation;
* it ends at the first stop token (the EOS and the profile's other end-of-turn tokens:
  ``<|im_end|>``, ``<|call|>``, ``<|eom_id|>``), inclusive; what follows up to the next marker is
  context (tool output, template text, an inserted separator) and should be 0, and so is what
  follows the last turn's stop token to the end of the ids (the ``\n`` a full render writes after
  the last ``<|im_end|>``, which no generation has: the importers' rendered traces carry it at 0;
  a loop's or verl's sequence ends at the stop token). trl's ``*_training`` templates count that
  separator as assistant; verl >= 0.9 and the loop do not, and neither does this audit.

A stop token that is also the next message's opening (GLM's ``<|observation|>`` / ``<|user|>``,
which verl 0.9 keeps as context and the loop keeps once) may carry either bit. A template that
yields no marker at all (it refuses the probe: Gemma's have no tool role) gives no structural
start: the mask's own next run of 1s is taken as the turn's start, and the report says so
(``starts_from_mask``), so only ends, separators and stop tokens are checked.

:func:`audit_mask` returns the runs where the stored bit differs from the structure's, each
named by kind (``context_trained``, ``generated_masked``, ``stop_masked``), the tokens decoded,
and the message the tokens render (from ``trace.message_spans``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: kinds of a disagreeing run, with the sentence each starts with
KINDS = {
    "context_trained": "context trained on",
    "generated_masked": "generated tokens masked out",
    "stop_masked": "the end-of-turn token masked out",
}


@dataclass
class MaskRun:
    """Positions ``start``..``end`` (into prompt_ids + response_ids) where the stored mask is
    ``stored`` and the structure says ``expected``."""

    kind: str
    start: int
    end: int
    expected: int
    stored: int
    text: str = ""
    message: int | None = None  # the message these tokens render (-1: template text), when known
    role: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end, "expected": self.expected, "stored": self.stored,
                "text": self.text, "message": self.message, "role": self.role}


@dataclass
class MaskReport:
    runs: list[MaskRun] = field(default_factory=list)
    turns: int = 0  # generated turns found by structure
    starts_from_mask: int = 0  # turn starts taken from the mask (the template gave no resume marker)
    header: list[int] = field(default_factory=list)
    after_tool: list[int] = field(default_factory=list)
    skipped: str | None = None  # why the audit could not run

    @property
    def tokens(self) -> int:
        return sum(r.end - r.start for r in self.runs)


PROBE_RESULT = "mask audit probe result"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}


def _suffix_ids(bundle: Any, messages: list[dict[str, Any]], tools: Any, after: str | None,
                header: list[int] | None = None) -> list[int]:
    """The ids ``add_generation_prompt`` renders after ``messages``: the whole addition, or
    (``after`` given) the ids after the text ``after`` ends: ``header`` when they end with it,
    else from their last control token on ([] when the template refuses the messages)."""
    from backend.tokens.rendering import RenderError, render_ids

    try:
        _, with_ = render_ids(bundle, messages, tools, add_generation_prompt=True)
        if after is None:
            _, without = render_ids(bundle, messages, tools, add_generation_prompt=False)
            return list(with_[len(without):]) if list(with_[:len(without)]) == list(without) else []
    except (RenderError, ValueError, TypeError, KeyError):
        return []
    tok = bundle.tokenizer
    with_ = list(with_)
    if after not in tok.decode(with_, skip_special_tokens=False):
        return []
    lo, hi = 0, len(with_)  # the shortest prefix whose text holds ``after`` (containment only grows)
    while lo < hi:
        mid = (lo + hi) // 2
        if after in tok.decode(with_[:mid], skip_special_tokens=False):
            hi = mid
        else:
            lo = mid + 1
    ids = with_[lo:]
    if header and ids[-len(header):] == header:  # the tool turn closes, then the usual header
        return header
    added = set(getattr(tok, "all_special_ids", []) or [])
    if hasattr(tok, "get_added_vocab"):
        added |= set(tok.get_added_vocab().values())

    def control(i: int) -> bool:  # a special or added token, or one that decoding skips as special
        return i in added or tok.decode([i], skip_special_tokens=True) == "" != tok.decode([i], skip_special_tokens=False)

    last = max((k for k, i in enumerate(ids) if control(i)), default=None)
    return ids[last:] if last is not None else []


def generation_header(bundle: Any) -> list[int]:
    """The ids the template appends for ``add_generation_prompt`` after a user turn ([] when it
    appends nothing, or when the render with it is not an extension of the one without)."""
    return resume_markers(bundle)[0]


def resume_markers(bundle: Any) -> tuple[list[int], list[int]]:
    """``(header, after_tool)``: where generation resumes after a user turn (the generation
    header) and after a tool turn (from the last special token the template writes after a tool
    result, the header included: Qwen's ``<|im_start|>assistant\n``, DeepSeek's
    ``<｜tool▁outputs▁end｜>``, Mistral's ``[/TOOL_RESULTS]``). Cached on the bundle per template."""
    cached = bundle.__dict__.get("_mask_audit_markers")
    if cached is not None and cached[0] == bundle.template_sha256:
        return cached[1]
    user = {"role": "user", "content": "mask audit probe"}
    header = _suffix_ids(bundle, [user], None, None)
    call = {"id": "a1B2c3D4e", "type": "function", "function": {"name": "probe", "arguments": {}}}
    convo = [user, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": PROBE_RESULT, "tool_call_id": "a1B2c3D4e", "name": "probe"}]
    after_tool = _suffix_ids(bundle, convo, [_PROBE_TOOL], PROBE_RESULT, header)
    bundle.__dict__["_mask_audit_markers"] = (bundle.template_sha256, (header, after_tool))
    return header, after_tool


def _either_bit(bundle: Any) -> set[int]:
    """Stop tokens that may be kept as context (the next message's opening): the family rule's."""
    from backend.families import rule_for

    try:
        return set(getattr(rule_for(bundle), "openings", set()) or set())
    except Exception:  # a template the probe cannot render: no rule, no exemption
        return set()


def expected_mask(response_ids: list[int], stored: list[int], markers: list[list[int]], stops: set[int],
                  either: set[int]) -> tuple[list[int | None], int, int]:
    """The bit the structure gives each response token (None: either bit), the generated turns
    found, and how many turn starts were taken from ``stored`` (no resume marker: the template
    writes none, or it could not be probed). ``markers``: the id runs generation resumes after."""
    out: list[int | None] = []
    generating, turns, from_mask = True, 1 if response_ids else 0, 0
    markers = sorted({tuple(m) for m in markers if m}, key=len, reverse=True)
    i, n = 0, len(response_ids)
    while i < n:
        t = response_ids[i]
        if generating:
            if t in stops:
                out.append(None if t in either else 1)
                generating = False
            else:
                out.append(1)
            i += 1
            continue
        hit = next((m for m in markers if tuple(response_ids[i:i + len(m)]) == m), None)
        if hit is not None:
            # right after the stop token, the model may have written the header itself (Harmony's
            # parallel calls: <|call|><|start|>assistant...): either bit there
            same_turn = bool(out) and out[-1] != 0 and response_ids[i - 1] in stops
            out.extend([None if same_turn else 0] * len(hit))
            i += len(hit)
            generating, turns = True, turns + (not same_turn)
            continue
        if not markers and stored[i] == 1 and (i == 0 or stored[i - 1] == 0):
            generating, turns, from_mask = True, turns + 1, from_mask + 1
            continue
        out.append(0)
        i += 1
    return out, turns, from_mask


def _message_at(spans: list[Any], pos: int) -> int | None:
    for s in spans:
        if s.start <= pos < s.end:
            return s.message
    return None


def audit_mask(trace: Any, bundle: Any) -> MaskReport:
    """Where ``trace.response_mask`` disagrees with the structure of ``trace.response_ids``."""
    from backend.tokens.rendering import decode

    rep = MaskReport()
    resp, mask = list(trace.response_ids or []), list(trace.response_mask or [])
    if not resp:
        rep.skipped = "the trace has no response ids"
        return rep
    if len(mask) != len(resp):
        rep.skipped = f"the mask has {len(mask)} bits for {len(resp)} response ids"
        return rep
    stops = set(bundle.stop_token_ids)
    if not stops:
        rep.skipped = "the tokenizer names no end-of-turn token"
        return rep
    rep.header, rep.after_tool = resume_markers(bundle)
    want, rep.turns, rep.starts_from_mask = expected_mask(resp, mask, [rep.header, rep.after_tool], stops, _either_bit(bundle))
    p = len(trace.prompt_ids or [])
    spans = sorted(trace.message_spans or [], key=lambda s: s.start)
    i = 0
    while i < len(resp):
        e = want[i]
        if e is None or e == mask[i]:
            i += 1
            continue
        j = i + 1
        while j < len(resp) and want[j] == e and mask[j] == mask[i]:
            j += 1
        kind = "context_trained" if e == 0 else ("stop_masked" if j - i == 1 and resp[i] in stops else "generated_masked")
        msg = _message_at(spans, p + i)
        role = None
        if msg is not None and 0 <= msg < len(trace.messages or []):
            m = trace.messages[msg]
            role = m.get("role") if isinstance(m, dict) else None
        rep.runs.append(MaskRun(kind, p + i, p + j, e, mask[i], decode(bundle, resp[i:j]), msg, role))
        i = j
    return rep


def describe(run: MaskRun, limit: int = 80) -> str:
    """One line: what is wrong with these tokens, and whose they are."""
    text = run.text if len(run.text) <= limit else run.text[:limit] + "…"
    whose = ""
    if run.message is not None and run.message >= 0:
        whose = f" of message {run.message}" + (f" ({run.role})" if run.role else "")
    elif run.message == -1:
        whose = " (template text of no message)"
    n = run.end - run.start
    return (f"{KINDS[run.kind]}: {n} token(s) at {run.start}..{run.end}{whose} have mask {run.stored}, "
            f"the sequence's structure says {run.expected}: {text!r}")
