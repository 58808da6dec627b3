"""Diagnostics: what is wrong (or suspicious) in a trace, each finding pointing at a step, a
message and/or a token position.

``check(trace, bundle=None) -> list[Finding]``. Structural checks need only the trace; the
token-level checks (``retokenization_drift``, ``mask_mismatch``, ``thinking_stripped``) need the
tokenizer bundle the trace was made with (they re-render the final messages).

Codes (severity):

* ``orphan_tool_message`` (error) — a tool message that answers no assistant tool call: its
  ``tool_call_id`` matches no earlier call, or no assistant message with calls precedes it, or
  the turn has more tool messages than calls. The seed-000 render (a ``<tool_response>`` right
  after the user turn) is this.
* ``tool_call_without_response`` (warning; info when the loop stopped on a limit before running
  the call) — an assistant tool call that no tool message answers.
* ``unknown_tool`` (error) — a call to a tool not in ``trace.tools``.
* ``invalid_arguments`` (error) — arguments that do not validate against the tool's parameters
  JSON schema (jsonschema).
* ``malformed_tool_call`` (error) — parse errors recorded on a step (text that looked like a call
  but could not be read), or arguments that are not a JSON object.
* ``truncated_tool_response`` (warning) — a tool result cut to ``max_tool_response_length``.
* ``hit_response_length`` (warning) — the run ended on ``response_length`` or a generation
  stopped on its token budget (finish_reason ``length``).
* ``empty_response`` (warning) — a generated turn with no tokens, or only the end-of-turn token,
  or an assistant message with no content, reasoning or calls.
* ``dropped_turn_separator`` (warning) — at a turn boundary inside the sequence, the loop's ids
  lack the whitespace the template writes after the end-of-turn token (Qwen's ``\\n`` after
  ``<|im_end|>``): verl < 0.9's tool turns (``tool_turns: legacy``); one finding per boundary, at
  its position. The separator after the *last* turn is not a finding: no generation has it.
* ``retokenization_drift`` (warning) — the rest of the difference between the loop's ids and a
  full re-render of the final messages with the same template, named by cause
  (``details["causes"]``, :data:`DRIFT_CAUSES`): reasoning stripped, arguments re-serialised,
  tool-call markup written differently, BPE re-tokenisation of generated text, earlier context
  rendered differently (a template that is not append-only); first divergence, both token runs
  decoded around it.
* ``mask_mismatch`` (warning; info when expected) — the loop's mask differs from the assistant mask of trl's
  ``*_training.jinja`` variant (``return_assistant_tokens_mask``), per turn and per position.
* ``mask_structure`` (warning) — the stored loss mask disagrees with the sequence's structure,
  read from the ids alone (:mod:`backend.checks.mask_audit`): tool output or template text trained on
  (1 where the structure says context, the separator after an end-of-turn token included: Qwen's
  ``\\n`` after ``<|im_end|>``, between turns and after the last one), generated tokens or the
  end-of-turn token masked out.
  One finding per run of such tokens (at most 20, then one that counts the rest), naming the
  tokens and the message they render. Runs on any trace with ids; it needs no re-render.
* ``thinking_stripped`` (warning) — reasoning of an assistant turn (``reasoning_content`` /
  ``<think>``) that the template drops on re-render, so training on the re-render would not see it.
* ``step_error`` (error) — a step that failed (generation, template, tool timeout ...).
* ``tool_error`` (warning) — a tool call that ran and failed (its error text went back to the model).
* ``cut_tool_call`` (info) — a turn cut by Stop or the run's time limit while the model was
  writing a tool call: the unfinished call was not run; it is not the model's mistake (no
  ``malformed_tool_call``). Read from the step's ``info.cut_tool_call``, or, for traces saved
  before the engine recorded it, from a parse error at the end of the aborted last turn.
* ``repaired_tool_call`` (warning) — a call the parser kept only after a repair the model did not
  write (no arguments key, read as ``{}``): a warning-severity parse error on the step.
* ``check_skipped`` (info) — a token-level check that could not run, and why.
* ``logprob_mismatch`` (warning) — a step whose trainer-view logprobs (``info.trainer_logprobs``:
  ``python -m backend score``, or verl's ``old_log_probs``) differ from the rollout's: a mask-1
  token's |Δ| over ``token_threshold`` (default ln 2: the importance ratio leaves [1/2, 2]) or the
  step's mean |Δ| over ``step_threshold`` (default 0.1); one per step, at its worst token.
  Mask-0 tokens are never counted (:mod:`backend.checks.logprobs`).
* ``logprob_semantics`` (warning) — the recorded logprobs cannot match a trainer's whatever the
  numerics: ``raw`` logprobs (taken before temperature / top-k / top-p) of a run sampled with
  temperature ≠ 1 or with top-k / top-p filtering, or logprobs a decoding constraint masked
  (vLLM applies the grammar bitmask before taking even its raw logprobs). One per trace, at
  the first such step.
* ``template_mismatch`` (warning) — the template the trace was made with does not fit its
  tokenizer (recorded in ``trace.tokenizer.template_warnings``): special tokens the vocabulary
  splits into pieces, an EOS the template never writes, a trl template written for another
  family's vocabulary. The ids are then not the ones the model family sees.
* ``import_loss`` (warning) — content of the source file that the importer could not carry into
  the trace (an image part, an unknown block or item type, a cut attribute, a tool result that
  answers no call), with the file and line it came from (``metadata.import.losses``).
* ``verl_tool_turn`` (info) — a tool turn that verl's way of tokenizing it (render the tool
  messages alone, strip the empty-conversation prefix) would build differently or not at all
  with this template; the loop used the conversation's suffix (``info.method == "suffix"``), and
  a verl-style trainer would see other ids there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from backend.checks import seqdiff
from backend.checks.logprobs import DEFAULT_CAP, compare, semantics_problem
from backend.trace import Trace
from backend.trace.builder import mask_runs
from backend.trace.messages import decode_arguments
from backend.trace.model import FindingCode, StepState, TerminationReason

SEVERITIES = ("error", "warning", "info")
_SEV_ORDER = {s: i for i, s in enumerate(SEVERITIES)}

C = FindingCode
CODES = tuple(FindingCode)
R = TerminationReason

# termination reasons where the loop stopped on purpose before running the last calls
_LIMIT_REASONS = {r for r in R if r.outcome == "limit"} | {R.TOOL_ERROR}
# termination reasons of a run whose generation was cut from outside (Stop, the time limit)
_CUT_REASONS = {R.CANCELLED, R.TIME_LIMIT}


@dataclass
class Location:
    step: int | None = None  # index into trace.steps
    message: int | None = None  # index into trace.messages
    token: int | None = None  # position in prompt_ids + response_ids

    def to_dict(self) -> dict[str, int | None]:
        return {"step": self.step, "message": self.message, "token": self.token}


@dataclass
class Finding:
    code: FindingCode
    severity: str
    message: str
    location: Location = field(default_factory=Location)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": str(self.code),
            "severity": self.severity,
            "message": self.message,
            "location": self.location.to_dict(),
            "details": self.details,
        }

    def __getitem__(self, key: str) -> Any:  # findings read like the dicts they serialise to
        return self.to_dict()[key]


# ---- index helpers ------------------------------------------------------------------------------


class _Index:
    def __init__(self, trace: Trace):
        self.trace = trace
        self.step_of_message: dict[int, int] = {}
        for s in trace.steps:
            for m in s.messages_added:
                self.step_of_message.setdefault(m, s.index)
        self.token_of_message: dict[int, int] = {}
        for sp in trace.message_spans:
            if sp.message >= 0 and sp.end > sp.start:
                self.token_of_message.setdefault(sp.message, sp.start)
        self.n_tokens = len(trace.prompt_ids) + len(trace.response_ids)

    def at_message(self, i: int) -> Location:
        return Location(step=self.step_of_message.get(i), message=i, token=self.token_of_message.get(i))

    def at_step(self, step_index: int, token: int | None = None) -> Location:
        s = self.trace.steps[step_index] if 0 <= step_index < len(self.trace.steps) else None
        msg = s.messages_added[0] if s is not None and s.messages_added else None
        if token is None and s is not None and s.end > s.start:
            token = s.start
        return Location(step=step_index, message=msg, token=token)

    def step_at_token(self, pos: int) -> int | None:
        best = None
        for s in self.trace.steps:
            if s.start <= pos < s.end:
                return s.index
            if s.end == pos and s.end > s.start:
                best = s.index
        return best

    def message_at_token(self, pos: int) -> int | None:
        for sp in self.trace.message_spans:
            if sp.start <= pos < sp.end and sp.message >= 0:
                return sp.message
        return None

    def at_token(self, pos: int) -> Location:
        return Location(step=self.step_at_token(pos), message=self.message_at_token(pos), token=pos)


def _calls(msg: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for c in msg.get("tool_calls") or []:
        if isinstance(c, dict):
            fn = c.get("function", c)
            if isinstance(fn, dict):
                out.append({"id": c.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    return out


def _tool_schemas(trace: Trace) -> dict[str, dict[str, Any]]:
    out = {}
    for t in trace.tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn
    return out


def _short(s: str, n: int = 80) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


# ---- structural checks --------------------------------------------------------------------------


def _check_tool_pairing(trace: Trace, ix: _Index) -> list[Finding]:
    out: list[Finding] = []
    msgs = trace.messages
    known_ids: dict[str, tuple[int, int]] = {}  # call id -> (assistant message, call index)
    answered: set[tuple[int, int]] = set()
    last_asst: int | None = None  # assistant message with calls whose tool block we are in
    block_pos = 0
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "assistant":
            calls = _calls(m)
            last_asst = i if calls else None
            block_pos = 0
            for j, c in enumerate(calls):
                if isinstance(c["id"], str) and c["id"]:
                    known_ids[c["id"]] = (i, j)
        elif role == "tool":
            tid = m.get("tool_call_id")
            if isinstance(tid, str) and tid:
                if tid in known_ids:
                    answered.add(known_ids[tid])
                    block_pos += 1
                    continue
                reason = f"its tool_call_id {tid!r} matches no earlier assistant tool call"
            elif last_asst is not None and block_pos < len(_calls(msgs[last_asst])):
                answered.add((last_asst, block_pos))
                block_pos += 1
                continue
            elif last_asst is not None:
                reason = f"the assistant turn (message {last_asst}) made {len(_calls(msgs[last_asst]))} call(s) and this is tool message {block_pos + 1} after it"
            else:
                prev = next((k for k in range(i - 1, -1, -1) if msgs[k].get("role") != "tool"), None)
                what = f"message {prev} is a {msgs[prev].get('role')} message" if prev is not None else "it is the first message"
                reason = f"no assistant tool call precedes it ({what})"
            block_pos += 1
            content = m.get("content")
            out.append(
                Finding(
                    C.ORPHAN_TOOL_MESSAGE, "error",
                    f"tool message {i} answers no tool call: {reason}. The template renders it as a tool response the model never asked for.",
                    ix.at_message(i), {"tool_call_id": tid, "name": m.get("name"), "content": _short(content if isinstance(content, str) else json.dumps(content))},
                )
            )
        else:
            last_asst = None
            block_pos = 0
    for i, m in enumerate(msgs):
        if m.get("role") != "assistant":
            continue
        for j, c in enumerate(_calls(m)):
            if (i, j) in answered:
                continue
            is_last = not any(mm.get("role") == "assistant" for mm in msgs[i + 1 :])
            limited = is_last and trace.termination_reason in _LIMIT_REASONS
            sev = "info" if limited else "warning"
            why = f" (the run ended with {trace.termination_reason} before running it)" if limited else ""
            out.append(
                Finding(
                    C.TOOL_CALL_WITHOUT_RESPONSE, sev,
                    f"tool call {j} of message {i} ({c['name']!r}, id {c['id']!r}) has no tool message answering it{why}",
                    ix.at_message(i), {"call_index": j, "name": c["name"], "id": c["id"]},
                )
            )
    return out


def _check_calls(trace: Trace, ix: _Index) -> list[Finding]:
    out: list[Finding] = []
    schemas = _tool_schemas(trace)
    steps_with_parse_errors = {s.index for s in trace.steps if any(e.severity == "error" for e in s.parse_errors)}
    any_calls = False
    for i, m in enumerate(trace.messages):
        if m.get("role") != "assistant":
            continue
        for j, c in enumerate(_calls(m)):
            any_calls = True
            name, args = c["name"], c["arguments"]
            loc = ix.at_message(i)
            if not schemas:
                continue  # nothing to check against (reported once below)
            if name not in schemas:
                avail = ", ".join(sorted(schemas)) or "none"
                out.append(Finding(C.UNKNOWN_TOOL, "error", f"message {i} calls {name!r}, which is not among the trace's tools ({avail})", loc, {"call_index": j, "name": name}))
                continue
            args, problem = decode_arguments(args) if args is not None else (None, "arguments must be a JSON object, got null")
            if problem is not None:
                if loc.step in steps_with_parse_errors:
                    continue  # the step's parse error reports it
                details: dict[str, Any] = {"call_index": j}
                if isinstance(args, str):  # not JSON: the text as written
                    details["raw"] = _short(args, 200)
                out.append(Finding(C.MALFORMED_TOOL_CALL, "error", f"message {i}, call {j} ({name!r}): {problem}", loc, details))
                continue
            params = schemas[name].get("parameters")
            if isinstance(params, dict) and params:
                errs = _validate(args, params)
                if errs:
                    out.append(
                        Finding(
                            C.INVALID_ARGUMENTS, "error",
                            f"message {i}, call {j} ({name!r}): arguments do not match the tool's parameters: {errs[0]}"
                            + (f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""),
                            loc, {"call_index": j, "errors": errs[:10], "arguments": args},
                        )
                    )
    if any_calls and not schemas:
        out.append(
            Finding(
                C.CHECK_SKIPPED, "info", "the trace has tool calls but no tool schemas: unknown_tool and invalid_arguments not checked",
                Location(), {"check": "tools"},
            )
        )
    # parse errors and tool failures recorded on steps
    for s in trace.steps:
        cut, errors = _cut_calls(trace, s)
        for e in cut:
            span = e.get("span") if isinstance(e.get("span"), (list, tuple)) else None
            tok = s.start if s.end > s.start else None
            out.append(
                Finding(
                    C.CUT_TOOL_CALL, "info",
                    f"step {s.index}: the turn was cut ({trace.termination_reason or 'aborted'}) while the model was writing a tool "
                    f"call; the unfinished call was not run: {_short(str(e.get('raw') or ''), 80)!r}",
                    ix.at_step(s.index, tok), {"raw": _short(str(e.get("raw") or ""), 200), "span": list(span) if span else None},
                )
            )
        for k, e in enumerate(errors):
            tok = s.start if s.end > s.start else None
            code, sev = (C.REPAIRED_TOOL_CALL, "warning") if e.severity == "warning" else (C.MALFORMED_TOOL_CALL, "error")
            out.append(Finding(code, sev, f"step {s.index}: {e.message}", ix.at_step(s.index, tok), {"raw": _short(e.raw or "", 200), "span": list(e.span) if e.span else None}))
        for r in s.tool_results:
            if r.truncated:
                orig = f" from {r.original_length} characters" if r.original_length is not None else ""
                out.append(
                    Finding(
                        C.TRUNCATED_TOOL_RESPONSE, "warning",
                        f"step {s.index}: the result of {r.name!r} was truncated{orig} to {len(r.content)} characters; the model saw a partial tool response",
                        ix.at_step(s.index), {"name": r.name, "call_id": r.call_id, "original_length": r.original_length, "length": len(r.content)},
                    )
                )
            if not r.ok and r.error not in ("unknown_tool", "invalid_arguments"):
                out.append(
                    Finding(C.TOOL_ERROR, "warning", f"step {s.index}: tool {r.name!r} failed ({r.error or 'error'}): {_short(r.error_detail or r.content, 160)}", ix.at_step(s.index), {"name": r.name, "error": r.error})
                )
            elif not r.ok and r.error == "invalid_arguments" and not any(f.code == C.INVALID_ARGUMENTS for f in out):
                out.append(Finding(C.INVALID_ARGUMENTS, "error", f"step {s.index}: tool {r.name!r} rejected its arguments: {_short(r.error_detail or r.content, 160)}", ix.at_step(s.index), {"name": r.name}))
            elif not r.ok and r.error == "unknown_tool" and not any(f.code == C.UNKNOWN_TOOL and f.details.get("name") == r.name for f in out):
                out.append(Finding(C.UNKNOWN_TOOL, "error", f"step {s.index}: tool {r.name!r} is not registered", ix.at_step(s.index), {"name": r.name}))
        if s.error:
            out.append(Finding(C.STEP_ERROR, "error", f"step {s.index} ({s.state}) failed: {_short(s.error, 200)}", ix.at_step(s.index), {"state": s.state}))
    return out


def _cut_calls(trace: Trace, s: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """(calls cut by Stop / the time limit, the step's real parse errors). The engine records a
    cut call in ``info.cut_tool_call``; older traces have it as a parse error reaching the end
    of the aborted last turn of a cancelled run."""
    recorded = s.info.cut_tool_call
    cut = [e for e in recorded if isinstance(e, dict)] if isinstance(recorded, list) else []
    errors = list(s.parse_errors)
    if (errors and s.state == StepState.GENERATING and s.finish_reason == "abort" and trace.termination_reason in _CUT_REASONS
            and s.index == max((x.index for x in trace.steps if x.state == StepState.GENERATING), default=-1)):
        end = len((s.text or "").rstrip())
        legacy = [e for e in errors if getattr(e, "severity", "error") == "error" and (e.span is None or e.span[1] >= end)]
        cut += [e.model_dump(mode="json") for e in legacy]
        errors = [e for e in errors if e not in legacy]
    return cut, errors


def _validate(args: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a dependency
        return []
    from backend.tools.dialect import SchemaDialectError, to_json_schema

    try:
        schema = to_json_schema(schema)[0]  # catalogue types (dict, float, any, ...) as the tools read them
    except SchemaDialectError:
        return []
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        v = cls(schema)
        errs = sorted(v.iter_errors(args), key=lambda e: list(e.absolute_path))
    except jsonschema.SchemaError:
        return []
    out = []
    for e in errs:
        path = "/".join(str(p) for p in e.absolute_path)
        out.append(f"{path + ': ' if path else ''}{e.message}")
    return out


def _check_lengths(trace: Trace, ix: _Index) -> list[Finding]:
    out: list[Finding] = []
    eos_id = trace.tokenizer.eos_token_id
    ids = trace.input_ids
    budget = trace.config.get("response_length") if isinstance(trace.config, dict) else None
    length_steps = [s for s in trace.steps if s.state == StepState.GENERATING and s.finish_reason == "length"]
    for s in length_steps:
        mt = s.info.max_tokens
        out.append(
            Finding(
                C.HIT_RESPONSE_LENGTH, "warning",
                f"step {s.index}: generation stopped on its token budget{f' (max_tokens {mt})' if mt is not None else ''} after {s.end - s.start} tokens, mid-turn",
                ix.at_step(s.index, s.end - 1 if s.end > s.start else s.start), {"tokens": s.end - s.start, "max_tokens": mt},
            )
        )
    if trace.termination_reason == R.RESPONSE_LENGTH and not length_steps:
        last = trace.steps[-1].index if trace.steps else None
        dropped = next((s.info.would_append_tokens for s in trace.steps if s.info.would_append_tokens), None)
        extra = f"; a tool turn of {dropped} tokens was dropped" if dropped else ""
        out.append(
            Finding(
                C.HIT_RESPONSE_LENGTH, "warning",
                f"the run ended on response_length ({len(trace.response_ids)} response tokens, budget {budget}){extra}",
                Location(step=last, token=ix.n_tokens or None), {"response_tokens": len(trace.response_ids), "budget": budget},
            )
        )
    for s in trace.steps:
        if s.state != StepState.GENERATING:
            continue
        n = s.end - s.start
        only_eos = n == 1 and eos_id is not None and s.start < len(ids) and ids[s.start] == eos_id
        if n == 0 and not s.error and s.finish_reason != "abort" and not s.info.imported:
            out.append(Finding(C.EMPTY_RESPONSE, "warning", f"step {s.index}: the model generated no tokens", ix.at_step(s.index, s.start), {}))
        elif only_eos:
            out.append(Finding(C.EMPTY_RESPONSE, "warning", f"step {s.index}: the model ended its turn at once (only the end-of-turn token)", ix.at_step(s.index), {}))
    flagged = {f.location.message for f in out if f.code == C.EMPTY_RESPONSE}
    for i, m in enumerate(trace.messages):
        if m.get("role") != "assistant" or i in flagged:
            continue
        c = m.get("content")
        if (c is None or (isinstance(c, str) and not c.strip())) and not m.get("tool_calls") and not m.get("reasoning_content"):
            loc = ix.at_message(i)
            if any(f.code == C.EMPTY_RESPONSE and f.location.step == loc.step and loc.step is not None for f in out):
                continue
            out.append(Finding(C.EMPTY_RESPONSE, "warning", f"assistant message {i} is empty (no content, reasoning or tool calls)", loc, {}))
    return out


# ---- token-level checks -------------------------------------------------------------------------


def _render_tools(trace: Trace) -> list[dict[str, Any]] | None:
    if trace.metadata.get("tools_in_system_prompt"):
        return None
    return list(trace.tools) or None


def _template_kwargs(trace: Trace) -> dict[str, Any]:
    kw = trace.config.get("apply_chat_template_kwargs") if isinstance(trace.config, dict) else None
    return dict(kw) if isinstance(kw, dict) else {}


def _tok_repr(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def _show(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]  # escapes \n visibly, no quotes


def _describe_op(tok: Any, tag: str, a: list[int], b: list[int], i1: int, i2: int, j1: int, j2: int) -> str:
    loop_txt = _show(_tok_repr(tok, a[i1:i2]))
    ren_txt = _show(_tok_repr(tok, b[j1:j2]))
    before = _show(_tok_repr(tok, a[max(0, i1 - 1) : i1])) if i1 > 0 else ""
    after_ctx = f" after '{before}'" if before else " at the start"
    if tag == "insert":
        return f"missing '{ren_txt}'{after_ctx} (loop token {i1}; the template writes {j2 - j1} token(s) the loop does not have)"
    if tag == "delete":
        return f"extra '{loop_txt}'{after_ctx} (loop tokens {i1}..{i2 - 1}; not in the re-render)"
    return f"'{loop_txt}' vs '{ren_txt}'{after_ctx} (loop tokens {i1}..{i2 - 1} vs re-render tokens {j1}..{j2 - 1}: same text, different tokens)" if loop_txt == ren_txt else f"'{loop_txt}' in the loop vs '{ren_txt}' in the re-render{after_ctx} (loop tokens {i1}..{i2 - 1})"


def _cut_ids(tok: Any, *seqs: list[int]) -> set[int]:
    """Ids after which a token sequence may be cut into segments for diffing: tokens whose text
    holds a line break, and added/special tokens (``<|im_end|>``, ``<tool_call>``...)."""
    distinct = sorted(set().union(*seqs))
    added = getattr(tok, "added_tokens_decoder", None)
    if callable(added):  # MistralCommonBackend has it as a method
        try:
            added = added()
        except Exception:  # noqa: BLE001 - no added tokens known: cut at line breaks only
            added = None
    cut = {i for i in (added if isinstance(added, dict) else {}) if isinstance(i, int)}
    try:
        texts = tok.batch_decode([[i] for i in distinct], skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode: no cut there
        texts = [""] * len(distinct)
    cut.update(i for i, t in zip(distinct, texts) if "\n" in t)
    return cut


def _opcodes(tok: Any, a: list[int], b: list[int]) -> list[tuple[str, int, int, int, int]]:
    """Alignment of two token sequences (difflib opcodes) in bounded time: by lines and turns
    first, then token by token inside the parts that differ (``backend.checks.seqdiff``)."""
    cut = _cut_ids(tok, a, b)
    return seqdiff.opcodes(a, b, cut_after=cut.__contains__)


# the causes of drift, as check names them (details["causes"] of a retokenization_drift finding)
DRIFT_CAUSES = {
    "turn_separator": "a turn separator the loop dropped",
    "reasoning_stripped": "reasoning the template drops on re-render",
    "reasoning_added": "reasoning markup the template adds on re-render (an empty think block)",
    "arguments_reserialized": "tool-call arguments the template writes another way",
    "tool_call_markup": "tool-call markup the template writes differently",
    "bpe_retokenization": "generated text the tokenizer splits differently on re-render",
    "generated_text": "generated text the template writes another way (whitespace trimmed, a malformed call re-rendered)",
    "not_append_only": "earlier context the template renders differently once the conversation goes on",
    "other": "other",
}
PR_6921 = "verl < 0.9 builds tool turns this way; fixed in verl PR #6921 (continuous tokens, tool_turns 'continuous')"


def _norm_call_text(t: str) -> str:
    """Text of a tool call with the formatting a template may change taken out (whitespace,
    quotes, Python's True/False/None), to tell re-serialised arguments from other markup."""
    t = "".join(t.split()).replace("'", '"')
    for a, b in (("True", "true"), ("False", "false"), ("None", "null")):
        t = t.replace(a, b)
    return t


def _drift_cause(trace: Trace, bundle: Any, ix: _Index, loop: list[int], rendered: list[int],
                 op: tuple[str, int, int, int, int], end_ids: set[int], reasoning: tuple[str, ...]) -> str:
    tok = bundle.tokenizer
    tag, i1, i2, j1, j2 = op
    ltxt, rtxt = _tok_repr(tok, loop[i1:i2]), _tok_repr(tok, rendered[j1:j2])
    if tag == "insert" and i1 > 0 and loop[i1 - 1] in end_ids and not rtxt.strip():
        return "trailing_separator" if i1 == len(loop) else "turn_separator"
    if tag == "delete" and i2 == len(loop) and j1 == len(rendered) and all(t in end_ids for t in loop[i1:i2]):
        # the stop token the last turn ended on, which the template writes only when a message
        # follows it (GLM's <|user|> opens the next message): nothing follows the last turn
        return "trailing_separator"
    if tag == "replace" and ltxt == rtxt:
        return "bpe_retokenization"
    if any(m in ltxt and m not in rtxt for m in reasoning):
        return "reasoning_stripped"
    if any(m in rtxt and m not in ltxt for m in reasoning):
        return "reasoning_added"
    step = ix.step_at_token(i1)
    st = trace.steps[step] if step is not None else None
    if st is not None and st.state == StepState.GENERATING:
        if st.tool_calls:
            return "arguments_reserialized" if _norm_call_text(ltxt) == _norm_call_text(rtxt) else "tool_call_markup"
        return "generated_text"
    return "not_append_only" if i1 < len(loop) else "other"


@dataclass
class Difference:
    """One difference between the loop's ids and a full re-render of the final messages:
    difflib's op over both token sequences, the loop and re-render spans, and its cause
    (:data:`DRIFT_CAUSES`, or ``trailing_separator``: what the template writes after the last
    turn, which no generation has, or the stop token the last turn ended on where the template
    writes it only before a next message, as GLM's ``<|user|>``)."""

    op: str
    loop: tuple[int, int]
    render: tuple[int, int]
    cause: str

    @property
    def position(self) -> int:
        return self.loop[0]


def rerender(trace: Trace, bundle: Any) -> tuple[str, list[int]]:
    """``(text, ids)`` of the trace's final messages rendered again with ``bundle`` (its tools and
    chat-template kwargs), no generation prompt: what a trainer that re-renders the messages
    trains on. RenderError when the template cannot render them."""
    from backend.tokens.rendering import render_ids

    return render_ids(bundle, trace.messages, _render_tools(trace), add_generation_prompt=False,
                      chat_template_kwargs=_template_kwargs(trace))


def drift(trace: Trace, bundle: Any, rendered: list[int] | None = None, ix: _Index | None = None) -> list[Difference]:
    """Every difference between the loop's ids and ``rendered`` (default: :func:`rerender`), with
    its cause. Empty when the two are equal."""
    if rendered is None:
        rendered = rerender(trace, bundle)[1]
    loop = trace.input_ids
    if loop == rendered:
        return []
    ix = ix or _Index(trace)
    tok = bundle.tokenizer
    ops = [op for op in _opcodes(tok, loop, rendered) if op[0] != "equal"]
    end_ids = {i for i in (trace.tokenizer.eos_token_id, tok.eos_token_id) if isinstance(i, int)}
    end_ids.update(getattr(bundle, "stop_token_ids", ()) or ())
    reasoning = tuple(m for m in ("<think>", "</think>", "<|channel|>analysis", "analysis<|message|>")
                      if m in (bundle.chat_template or "") or m in _tok_repr(tok, loop))
    return [Difference(op[0], (op[1], op[2]), (op[3], op[4]), _drift_cause(trace, bundle, ix, loop, rendered, op, end_ids, reasoning))
            for op in ops]


def _check_drift(trace: Trace, bundle: Any, ix: _Index, rendered: list[int]) -> list[Finding]:
    tok = bundle.tokenizer
    loop = trace.input_ids
    diffs = drift(trace, bundle, rendered, ix)
    if not diffs:
        return []
    ops = [(d.op, d.loop[0], d.loop[1], d.render[0], d.render[1]) for d in diffs]
    causes = [d.cause for d in diffs]
    out: list[Finding] = []
    mode = trace.config.get("tool_turns") if isinstance(trace.config, dict) else None
    for (tag, i1, i2, j1, j2), cause in zip(ops, causes):
        if cause != "turn_separator":
            continue
        end, sep = _tok_repr(tok, loop[i1 - 1:i1]), _tok_repr(tok, rendered[j1:j2])
        nxt = _tok_repr(tok, loop[i1:i1 + 1])
        out.append(Finding(
            C.DROPPED_TURN_SEPARATOR, "warning",
            f"dropped turn separator at token {i1}: the template writes '{_show(end + sep)}' between turns, but the loop's ids "
            f"have '{_show(end)}' followed directly by '{_show(nxt)}', a boundary the template never renders: the model was "
            f"shown it and a trainer trains on it. {PR_6921}",
            ix.at_token(i1),
            {"position": i1, "separator": sep, "separator_ids": rendered[j1:j2], "after": end,
             "tool_turns": mode or "legacy (written before tool_turns existed)"}))
    rest = [(op, c) for op, c in zip(ops, causes) if c not in ("turn_separator", "trailing_separator")]
    if not rest:
        return out  # only separators: named above; the one after the last turn is what no generation has
    first = rest[0][0][1]
    w = 6
    loop_only = sum(i2 - i1 for (_, i1, i2, _, _), _c in rest)
    render_only = sum(j2 - j1 for (_, _, _, j1, j2), _c in rest)
    descs = [_describe_op(tok, tag, loop, rendered, i1, i2, j1, j2) for (tag, i1, i2, j1, j2), _c in rest]
    by_cause: dict[str, int] = {}
    for _op, c in rest:
        by_cause[c] = by_cause.get(c, 0) + 1
    groups: dict[str, list[int]] = {}
    for ((tag, i1, i2, j1, j2), _c), d in zip(rest, descs):
        groups.setdefault(d.split(" (")[0], []).append(i1)
    summary = "; ".join(
        f"{k} at {len(v)} place(s) (loop position{'s' if len(v) > 1 else ''} {', '.join(map(str, v[:6]))}{', ...' if len(v) > 6 else ''})"
        for k, v in groups.items()
    )
    named = ", ".join(f"{n} × {DRIFT_CAUSES[c]}" for c, n in by_cause.items())
    msg = (
        f"the loop's {len(loop)} tokens differ from a re-render of the final messages ({len(rendered)} tokens) with template "
        f"{bundle.template_name!r}: {named}. First divergence at token {first}; {summary}. "
        f"{loop_only} loop token(s) and {render_only} re-render token(s) differ: a trainer that re-renders the messages "
        "trains on other ids than the model was shown"
    )
    details = {
        "expected": False,
        "causes": by_cause,
        "first_divergence": first,
        "loop_tokens": len(loop),
        "render_tokens": len(rendered),
        "loop_only_tokens": loop_only,
        "render_only_tokens": render_only,
        "loop_context": _tok_repr(tok, loop[max(0, first - w): first + w]),
        "render_context": _tok_repr(tok, rendered[max(0, rest[0][0][3] - w): rest[0][0][3] + w]),
        "loop_ids_at": loop[max(0, first - w): first + w],
        "render_ids_at": rendered[max(0, rest[0][0][3] - w): rest[0][0][3] + w],
        "differences": [
            {"op": tag, "cause": c, "loop": [i1, i2], "render": [j1, j2], "loop_text": _tok_repr(tok, loop[i1:i2]),
             "render_text": _tok_repr(tok, rendered[j1:j2]), "description": d}
            for ((tag, i1, i2, j1, j2), c), d in list(zip(rest, descs))[:50]
        ],
    }
    return out + [Finding(C.RETOKENIZATION_DRIFT, "warning", msg, ix.at_token(first), details)]


def _check_mask(trace: Trace, bundle: Any, ix: _Index) -> list[Finding]:
    from backend.loading.tokenizers import read_trl_template

    tname = bundle.training_template
    if not tname:
        return [Finding(C.CHECK_SKIPPED, "info", f"mask_mismatch not checked: trl ships no *_training.jinja variant of template {bundle.template_name!r}", Location(), {"check": "mask_mismatch"})]
    text = read_trl_template(tname)
    tok = bundle.tokenizer
    try:
        enc = tok.apply_chat_template(
            trace.messages, tools=_render_tools(trace), tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
            chat_template=text, **_template_kwargs(trace),
        )
    except Exception as e:
        return [Finding(C.CHECK_SKIPPED, "info", f"mask_mismatch not checked: the training template {tname!r} failed: {type(e).__name__}: {_short(str(e), 160)}", Location(), {"check": "mask_mismatch"})]
    t_ids = list(enc["input_ids"])
    t_mask = list(enc["assistant_masks"])
    loop = trace.input_ids
    lmask = trace.full_mask
    p = len(trace.prompt_ids)
    diffs: list[dict[str, Any]] = []
    for tag, i1, i2, j1, j2 in _opcodes(tok, loop, t_ids):
        if tag == "equal":
            for k in range(i2 - i1):
                if lmask[i1 + k] != t_mask[j1 + k]:
                    diffs.append({"loop_token": i1 + k, "render_token": j1 + k, "token": tok.decode([loop[i1 + k]], skip_special_tokens=False), "loop_mask": lmask[i1 + k], "training_mask": t_mask[j1 + k]})
        else:
            for k in range(j1, j2):
                if t_mask[k]:
                    diffs.append({"loop_token": None, "after_loop_token": i1 - 1, "render_token": k, "token": tok.decode([t_ids[k]], skip_special_tokens=False), "loop_mask": None, "training_mask": 1})
            for k in range(i1, i2):
                if lmask[k]:
                    diffs.append({"loop_token": k, "render_token": None, "token": tok.decode([loop[k]], skip_special_tokens=False), "loop_mask": 1, "training_mask": None})
    if not diffs:
        return []
    loop_runs = mask_runs(trace.response_mask)
    # the training render's response region: after the same prompt, when the prompt matches
    t_resp = t_mask[p:] if t_ids[:p] == trace.prompt_ids else t_mask[next((k for k, v in enumerate(t_mask) if v), len(t_mask)) :]
    t_runs = mask_runs(t_resp)
    fmt = lambda rs: "/".join(str(n) for _, n in rs)  # noqa: E731
    ones = lambda rs: "/".join(str(n) for b, n in rs if b == 1)  # noqa: E731
    kinds: dict[str, list[dict[str, Any]]] = {}
    for d in diffs:
        if d["loop_token"] is None:
            prev = tok.decode([loop[d["after_loop_token"]]], skip_special_tokens=False) if d["after_loop_token"] >= 0 else ""
            key = f"the training template counts '{_show(d['token'])}' after '{_show(prev)}' as assistant, a token the loop does not have"
        elif d["render_token"] is None:
            key = f"the loop masks '{_show(d['token'])}' as generated, a token the training render does not have"
        elif d["loop_mask"] == 1:
            key = f"'{_show(d['token'])}' is generated (mask 1) in the loop but not assistant in the training template"
        else:
            key = f"'{_show(d['token'])}' is assistant in the training template but mask 0 in the loop"
        kinds.setdefault(key, []).append(d)
    expl = "; ".join(
        f"{k} ({len(v)}×, render position{'s' if len(v) > 1 else ''} {', '.join(str(x['render_token']) for x in v[:6])})" if v[0]["render_token"] is not None
        else f"{k} ({len(v)}×, loop position{'s' if len(v) > 1 else ''} {', '.join(str(x['loop_token']) for x in v[:6])})"
        for k, v in kinds.items()
    )
    msg = (
        f"the loop's response mask ({fmt(loop_runs)}: assistant turns {ones(loop_runs)}) differs from the assistant mask of trl's "
        f"{tname!r} ({fmt(t_runs)}: assistant turns {ones(t_runs)}) at {len(diffs)} position(s): {expl}"
    )
    first_loop = next((d["loop_token"] if d["loop_token"] is not None else max(d["after_loop_token"], 0) for d in diffs), None)
    details = {
        "training_template": tname,
        "loop_runs": [list(r) for r in loop_runs],
        "training_runs": [list(r) for r in t_runs],
        "loop_assistant_tokens": sum(trace.response_mask),
        "training_assistant_tokens": sum(t_mask),
        "positions": diffs[:200],
    }
    eos_ids = {i for i in (trace.tokenizer.eos_token_id, tok.eos_token_id) if isinstance(i, int)}
    # the training template's assistant span runs on over the whitespace it writes after the
    # end-of-turn token; the loop stops at EOS and never has it. Every run has this: said once,
    # explained, as info (a trainer on trl's mask learns that "\n"; verl's loop does not)
    def after_eos_separator(d: dict[str, Any]) -> bool:
        if d["token"].strip():
            return False
        if d["loop_token"] is None:  # the loop lacks it (tool_turns legacy, or the last turn)
            return d["render_token"] > 0 and t_ids[d["render_token"] - 1] in eos_ids
        # the loop has it as context: the separator continuous tokens insert
        return d["loop_mask"] == 0 and d["training_mask"] == 1 and d["loop_token"] > 0 and loop[d["loop_token"] - 1] in eos_ids

    # a stop token the model wrote that also opens the next message (GLM's <|observation|>): the
    # continuous junction edit kept it once and relabelled it context, as verl 0.9.1's GLM builder does
    relabelled = {int(b["position"]) + k for s in trace.steps for b in [getattr(s.info, "boundary", None) or {}]
                  if b.get("relabeled") and isinstance(b.get("position"), int) for k in range(int(b["relabeled"]))}

    def relabelled_stop(d: dict[str, Any]) -> bool:
        return d["loop_token"] in relabelled and d["loop_mask"] == 0 and d["training_mask"] == 1

    expected = all(after_eos_separator(d) or relabelled_stop(d) for d in diffs)
    details["expected"] = expected
    if expected and all(relabelled_stop(d) for d in diffs):
        msg = (f"expected mask difference: trl's {tname!r} marks the '{_show(diffs[0]['token'])}' the model stopped at as "
               f"assistant ({len(diffs)}×): its mask {fmt(t_runs)} (assistant turns {ones(t_runs)}), the loop's "
               f"{fmt(loop_runs)} (assistant turns {ones(loop_runs)}). The model generated it, and it also opens the next "
               "message in the template: the loop keeps it once, as context (mask 0), as verl 0.9.1's GLM builder does. "
               "A trainer on trl's mask trains the model to stop there; a verl-style trainer does not")
    elif expected:
        msg = (f"expected mask difference: trl's {tname!r} marks the '{_show(diffs[0]['token'])}' it writes after "
               f"{tok.eos_token!r} as assistant ({len(diffs)}×): its mask {fmt(t_runs)} (assistant turns {ones(t_runs)}), the "
               f"loop's {fmt(loop_runs)} (assistant turns {ones(loop_runs)}). "
               f"The model stops generating at {tok.eos_token!r} and never writes that token: where the trace has it (the "
               "separator continuous tokens insert, or the template's text in an imported conversation's render) it is "
               "context, mask 0, as verl >= 0.9 masks it. "
               "A trainer on trl's mask learns it; a verl-style trainer does not")
    loc = ix.at_token(first_loop) if first_loop is not None else Location()
    return [Finding(C.MASK_MISMATCH, "info" if expected else "warning", msg, loc, details)]


def _check_thinking(trace: Trace, bundle: Any, ix: _Index, rendered_text: str) -> list[Finding]:
    out = []
    for i, m in enumerate(trace.messages):
        if m.get("role") != "assistant":
            continue
        r = m.get("reasoning_content")
        if not (isinstance(r, str) and r.strip()):
            c = m.get("content")
            if isinstance(c, str) and "<think>" in c and "</think>" in c:
                r = c.split("<think>", 1)[1].split("</think>", 1)[0]
            else:
                continue
        if not r.strip() or r.strip() in rendered_text:
            continue
        msg = (f"assistant message {i}: its reasoning ({len(r)} characters, '{_show(_short(r.strip(), 60))}') is dropped when "
               f"template {bundle.template_name!r} re-renders the conversation; the model generated it, a re-rendered "
               "training sample will not contain it")
        harmony = getattr(bundle, "parser", None) == "harmony"
        if harmony:  # gpt-oss: the drift users meet as high KL in multi-turn training
            msg += (". gpt-oss's templates drop the analysis channel of turns before the last final answer; a loop that "
                    "appends the generated ids keeps it, so the trainer's re-render conditions the later turns on a "
                    "context the model never saw when it sampled them (train on the loop's ids, or drop analysis in the "
                    "rollout the same way)")
        out.append(Finding(C.THINKING_STRIPPED, "warning", msg, ix.at_message(i),
                           {"reasoning_chars": len(r), **({"family": "gpt-oss"} if harmony else {})}))
    return out


# ---- entry point --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogprobThresholds:
    """When ``logprob_mismatch`` fires (|Δ| in nats; see :mod:`backend.checks.logprobs`)."""

    token: float = math.log(DEFAULT_CAP)  # one mask-1 token's |trainer - rollout|
    step_mean: float = 0.1  # a step's mean |Δ| over its mask-1 tokens


def check(trace: Trace, bundle: Any = None, *, logprob_thresholds: LogprobThresholds | None = None,
          template_note: str = "") -> list[Finding]:
    """All findings for ``trace``, most severe first, then by position. Never raises for a
    trace that loaded; a check that cannot run becomes a ``check_skipped`` info finding.
    ``template_note``: why ``bundle``'s template is not the one the trace was made with
    (:func:`backend.loading.tokenizers.with_trace_template`), said in that finding."""
    ix = _Index(trace)
    findings: list[Finding] = []
    findings += _check_tool_pairing(trace, ix)
    findings += _check_calls(trace, ix)
    findings += _check_lengths(trace, ix)
    findings += _check_logprobs(trace, ix, logprob_thresholds or LogprobThresholds())
    findings += _check_template_fit(trace, ix)
    findings += _check_import_losses(trace)
    if bundle is not None:
        findings += _token_checks(trace, bundle, ix, template_note)
    findings.sort(key=lambda f: (_SEV_ORDER.get(f.severity, 9), f.location.token if f.location.token is not None else 1 << 60, f.location.message if f.location.message is not None else 1 << 30))
    return findings


def _check_import_losses(trace: Trace) -> list[Finding]:
    """What an importer could not carry over from the source file (``metadata.import.losses``)."""
    imp = trace.metadata.get("import") if isinstance(trace.metadata, dict) else None
    losses = imp.get("losses") if isinstance(imp, dict) else None
    if not isinstance(losses, list):
        return []
    where = {k: imp[k] for k in ("file", "line", "row", "index") if k in imp}
    place = ", ".join(f"{k} {v}" for k, v in where.items())
    return [Finding(C.IMPORT_LOSS, "warning", f"not carried over from the source{f' ({place})' if place else ''}: {x}", Location(),
                    {"source": where}) for x in losses[:50]]


def _check_template_fit(trace: Trace, ix: _Index) -> list[Finding]:
    out: list[Finding] = []
    tok = trace.tokenizer
    for w in (tok.template_warnings or []) if tok is not None else []:
        out.append(Finding(C.TEMPLATE_MISMATCH, "warning", f"template {tok.template!r} over tokenizer {tok.name!r}: {w}",
                           Location(step=0 if trace.steps else None, token=0)))
    for s in trace.steps:
        if s.state != StepState.PROCESSING_TOOLS or s.info.method != "suffix":
            continue
        if s.info.verl_error:
            what = f"fails on it ({_short(s.info.verl_error, 160)})"
        elif s.info.verl_tokens is not None:
            what = f"builds {s.info.verl_tokens} tokens here instead of {s.end - s.start}"
        else:
            continue
        out.append(Finding(
            C.VERL_TOOL_TURN, "info",
            f"step {s.index}: the loop tokenized this tool turn as the text the template adds after the conversation; "
            f"verl < 0.9's method (render the tool messages alone, strip the empty-conversation prefix) {what}, so a "
            "trainer on verl < 0.9 would see other ids here",
            ix.at_step(s.index), {"verl_error": s.info.verl_error, "verl_tokens": s.info.verl_tokens,
                                  "tokens": s.end - s.start}))
    return out


def _check_logprobs(trace: Trace, ix: _Index, th: LogprobThresholds) -> list[Finding]:
    out: list[Finding] = []
    for s in trace.steps:
        why = semantics_problem(s.info.logprob_semantics) if s.logprobs is not None else None
        if why:
            n = sum(1 for x in trace.steps if x.logprobs is not None and semantics_problem(x.info.logprob_semantics))
            sem = s.info.logprob_semantics
            out.append(Finding(
                C.LOGPROB_SEMANTICS, "warning",
                (f"step {s.index}: {sem.backend}'s logprobs were taken under {why}: a trainer's logprobs cannot match them"
                 if sem.constrained else
                 f"step {s.index}: {sem.backend} recorded raw logprobs (before temperature / top-k / top-p) but sampled with {why}: "
                 "a trainer's logprobs cannot match them (use vLLM logprobs_mode='processed_logprobs')"),
                ix.at_step(s.index), {"steps": n, "semantics": sem.model_dump(mode="json")},
            ))
            break
    if not any(s.info.trainer_logprobs is not None for s in trace.steps):
        return out
    cmp = compare(trace)
    for i, st in cmp.steps.items():
        if not st.tokens:
            continue
        over_token = st.max_abs_delta > th.token
        over_mean = st.mean_abs_delta > th.step_mean
        if not (over_token or over_mean):
            continue
        worst = next(t for t in cmp.tokens if t.pos == st.max_at)
        what = (f"token {worst.pos} has |Δ| {abs(worst.delta):.3g} (rollout {worst.rollout:.3f}, trainer {worst.trainer:.3f}, ratio {worst.ratio:.3g})"
                if over_token else f"mean |Δ| {st.mean_abs_delta:.3g} over {st.tokens} tokens (worst: token {worst.pos}, |Δ| {abs(worst.delta):.3g})")
        out.append(Finding(
            C.LOGPROB_MISMATCH, "warning", f"step {i}: the trainer's logprobs differ from the rollout's: {what}",
            ix.at_step(i, worst.pos),
            {"token": worst.pos, "rollout": worst.rollout, "trainer": worst.trainer, "delta": worst.delta, "ratio": worst.ratio,
             "step_mean_abs_delta": st.mean_abs_delta, "tokens": st.tokens,
             "thresholds": {"token": th.token, "step_mean": th.step_mean}},
        ))
    return out


def _token_checks(trace: Trace, bundle: Any, ix: _Index, template_note: str = "") -> list[Finding]:
    from backend.tokens.rendering import RenderError

    out: list[Finding] = []
    info = trace.tokenizer
    if info.template_sha256 and info.template_sha256 != bundle.template_sha256:
        out.append(
            Finding(
                C.CHECK_SKIPPED, "info",
                f"the trace was made with template {info.template!r} (sha {info.template_sha256[:12]}), not {bundle.template_name!r}"
                f"{f' (not used: {template_note})' if template_note else ''}; token-level findings compare against the template given",
                Location(), {"check": "template", "trace_template": info.template, **({"why": template_note} if template_note else {})},
            )
        )
    if trace.response_ids:
        out += _check_mask_structure(trace, bundle, ix)
    try:
        text, rendered = rerender(trace, bundle)
    except RenderError as e:
        return out + [Finding(C.CHECK_SKIPPED, "info", f"token-level checks skipped: the template cannot render the final messages: {_short(str(e), 200)}", Location(), {"check": "render"})]
    out += _check_thinking(trace, bundle, ix, text)
    if not trace.input_ids:
        out.append(Finding(C.CHECK_SKIPPED, "info", "retokenization_drift and mask_mismatch not checked: the trace has no token ids", Location(), {"check": "tokens"}))
        return out
    out += _check_drift(trace, bundle, ix, rendered)
    out += _check_mask(trace, bundle, ix)
    return out


_MASK_RUNS_SHOWN = 20


def _check_mask_structure(trace: Trace, bundle: Any, ix: _Index) -> list[Finding]:
    """The stored mask against the structure of the ids (:func:`backend.checks.mask_audit.audit_mask`)."""
    from backend.checks.mask_audit import audit_mask, describe

    rep = audit_mask(trace, bundle)
    if rep.skipped:
        return [Finding(C.CHECK_SKIPPED, "info", f"mask_structure not checked: {rep.skipped}", Location(), {"check": "mask_structure"})]
    out: list[Finding] = []
    for r in rep.runs[:_MASK_RUNS_SHOWN]:
        loc = Location(step=ix.step_at_token(r.start), message=r.message if r.message is not None and r.message >= 0 else None, token=r.start)
        details = {**r.to_dict(), "turns": rep.turns}
        if rep.starts_from_mask:
            details["starts_from_mask"] = rep.starts_from_mask
        out.append(Finding(C.MASK_STRUCTURE, "warning", describe(r), loc, details))
    if len(rep.runs) > _MASK_RUNS_SHOWN:
        rest = rep.runs[_MASK_RUNS_SHOWN:]
        out.append(Finding(C.MASK_STRUCTURE, "warning",
                           f"{len(rest)} more run(s) of mis-masked tokens ({sum(r.end - r.start for r in rest)} tokens) not listed",
                           Location(token=rest[0].start), {"more": len(rest)}))
    return out


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return counts
