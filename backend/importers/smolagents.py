"""smolagents agent memory (``agent.memory.get_full_steps()``) → HF messages.

Input: the list of step dicts ``get_full_steps()`` returns (``json.dumps(..., default=str)``), or
the dict of a full run result (``agent.run(..., return_full_result=True).dict()``:
``{"output", "state", "steps", "token_usage", "timing"}``), to which a ``"tools"`` list (OpenAI/HF
schemas, e.g. smolagents' ``get_tool_json_schema(tool)`` for each of ``agent.tools``) may be added —
the memory holds no tool schemas. A JSON file holding one step list is one run; JSONL with one
step list (or run result) per line is several. Steps carry no type field; they are told apart by
their keys (smolagents 1.x ``MemoryStep.dict()``):

* ``TaskStep`` ``{"task", "task_images"}`` → a user message ``"New task:\\n<task>"``, as
  smolagents feeds it (``write_memory_to_messages``); task images are a loss;
* ``ActionStep`` ``{"step_number", "timing", "model_input_messages", "model_output_message",
  "model_output", "tool_calls", "code_action", "observations", "error", "action_output",
  "token_usage", "is_final_answer", ...}``:

  - a **ToolCallingAgent** step (no ``code_action``): an assistant message with the model's text
    and its tool calls as JSON calls (from ``model_output_message.tool_calls``: what the model
    produced, also when the step failed before smolagents recorded ``tool_calls``; where the
    step's ``tool_calls`` — what smolagents ran, which a step callback may have edited — name
    other calls or arguments, the disagreement is listed with the losses and the step's calls
    are kept in ``metadata.step_tool_calls``); then one tool message per call with its observation (smolagents joins the observations of parallel calls,
    in call-id order, by newlines: they are split back when there is one line per call, else the
    whole text answers the first call); a step ``error`` is the text of the tool message answering
    the call(s) left without a result, as smolagents feeds it back (``"Error:\\n<message>\\nNow
    let's retry: ..."``). ``final_answer`` stays the tool call the model made, with its result;
  - a **CodeAgent** step (``code_action`` set): the model's output (thought + code block) is the
    assistant's text; its ``python_interpreter`` call is smolagents' own, not a model tool call,
    and is not made one; the observations (and an error) come back as a user message
    ``"Observation:\\n..."`` / ``"Error:\\n..."``, as smolagents feeds them (consecutive user texts
    joined by a newline, as its ``get_clean_message_list`` merges them).

  smolagents itself writes calls back into its prompts as Python-repr text (``"Calling tools:\\n
  [{'id': ...}]"``); that text is not copied: the calls stay JSON tool calls.
* ``PlanningStep`` ``{"plan", "model_output_message", ...}`` → the plan as assistant text, then the
  user message ``"Now proceed and carry out this plan."`` (smolagents' own words); the planning
  call's separate prompt is not part of the action conversation;
* ``SystemPromptStep`` ``{"system_prompt"}`` (when present) or the system message that leads the
  first step's ``model_input_messages`` → the system message. The rest of ``model_input_messages``
  is the same conversation again, in smolagents' text protocol: not read;
* ``FinalAnswerStep`` ``{"output"}``: the answer is already the ``final_answer`` result.

Observation images are a loss. Metadata: ``duration_s`` (first step start to last step end),
``step_durations`` (``[{"step", "kind", "duration_s"}]``), ``usage`` (input/output tokens summed
over the steps), ``final_answer`` (the last ``action_output`` of a final step, or the run
result's ``output``), ``agent`` (``"ToolCallingAgent"`` / ``"CodeAgent"``), ``state`` of a run
result, ``step_tool_calls`` (``[{"step_number", "message", "tool_calls"}]``: a step's
``tool_calls`` as recorded where they disagree with the model output's; ``message`` is the
assistant message that holds the model's). Provenance: ``library: smolagents`` (the memory says no version).
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, record_id, text_of
from backend.trace import ParseError
from backend.trace.messages import decode_arguments
from backend.trace.model import TerminationReason

PLAN_FOLLOW_UP = "Now proceed and carry out this plan."
RETRY_ADVICE = "\nNow let's retry: take care not to repeat previous errors! If you have retried several times, try a completely different approach.\n"
_ACTION_KEYS = {"model_output_message", "model_output", "observations", "code_action", "action_output", "is_final_answer"}


def step_kind(step: Any) -> str | None:
    """``"task"``, ``"action"``, ``"planning"``, ``"system"``, ``"final"`` or None."""
    if not isinstance(step, dict):
        return None
    if "step_number" in step and "timing" in step and _ACTION_KEYS & step.keys():
        return "action"
    if "plan" in step and "model_output_message" in step:
        return "planning"
    if "task" in step and set(step) <= {"task", "task_images"}:
        return "task"
    if set(step) == {"system_prompt"}:
        return "system"
    if set(step) == {"output"}:
        return "final"
    return None


def looks_like_steps(obj: Any) -> bool:
    """A non-empty list of smolagents step dicts with at least one action or planning step."""
    if not isinstance(obj, list) or not obj:
        return False
    kinds = [step_kind(s) for s in obj]
    return any(k in ("action", "planning") for k in kinds) and all(k is not None or isinstance(s, dict) and "step_number" in s for k, s in zip(kinds, obj))


def _is_run_result(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("steps"), list) and {"output", "state"} <= obj.keys()


def _text(v: Any, where: str, losses: list[str]) -> str:
    """Content as text: smolagents' ``[{"type": "text", "text"}]`` lists, strings; a JSON-looking
    string that ``make_json_serializable`` turned into an object back to JSON."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return text_of(v, where, losses) or ""
    return json.dumps(v, ensure_ascii=False)


def _error_text(err: Any) -> str | None:
    if err is None:
        return None
    msg = err.get("message") if isinstance(err, dict) else err
    return "Error:\n" + str(msg) + RETRY_ADVICE


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def steps_to_conversation(steps: list[Any], tools: Any = None, where0: str = "") -> Conversation:
    """The conversion itself: ``get_full_steps()`` → a conversation."""
    if not isinstance(steps, list) or not steps:
        raise RecordError("smolagents memory must be a non-empty list of steps")
    messages: list[dict[str, Any]] = []
    errors: dict[int, list[ParseError]] = {}
    losses: list[str] = []
    usage: dict[str, int] = {}
    durations: list[dict[str, Any]] = []
    starts: list[float] = []
    ends: list[float] = []
    agents: set[str] = set()
    system: str | None = None
    max_steps = False
    final: Any = None
    has_final = False
    kept_step_calls: list[dict[str, Any]] = []  # a step's tool_calls that disagree with its model output's

    def user(text: str) -> None:
        if messages and messages[-1]["role"] == "user":  # smolagents merges consecutive user texts
            messages[-1]["content"] += "\n" + text
        else:
            messages.append({"role": "user", "content": text})

    def timing(step: dict[str, Any], where: str, n: Any, kind: str) -> None:
        tm = step.get("timing")
        if tm is None:
            return
        if not isinstance(tm, dict):
            raise RecordError(f"{where}.timing must be an object")
        s, e = _num(tm.get("start_time")), _num(tm.get("end_time"))
        if s is not None:
            starts.append(s)
        if e is not None:
            ends.append(e)
        d = _num(tm.get("duration"))
        if d is None and s is not None and e is not None:
            d = e - s
        if d is not None:
            durations.append({"step": n, "kind": kind, "duration_s": round(d, 6)})

    def count(u: Any) -> None:
        if isinstance(u, dict):
            for k in ("input_tokens", "output_tokens"):
                if isinstance(u.get(k), int):
                    usage[k] = usage.get(k, 0) + u[k]

    for i, step in enumerate(steps):
        where = f"{where0}[{i}]"
        kind = step_kind(step)
        if kind is None:
            what = f"keys: {', '.join(sorted(step)[:8])}" if isinstance(step, dict) else type(step).__name__
            raise RecordError(f"{where}: not a smolagents step ({what})")
        if kind == "system":
            system = _text(step["system_prompt"], f"{where}.system_prompt", losses)
        elif kind == "task":
            if not isinstance(step.get("task"), str):
                raise RecordError(f"{where}.task must be a string")
            user("New task:\n" + step["task"])
            if step.get("task_images"):
                n = len(step["task_images"]) if isinstance(step["task_images"], list) else 1
                losses.append(f"{where}.task_images: {n} image(s) not carried over")
        elif kind == "final":
            final, has_final = step["output"], True
        elif kind == "planning":
            timing(step, where, None, "planning")
            count(step.get("token_usage"))
            plan = step.get("plan")
            if not isinstance(plan, str):
                raise RecordError(f"{where}.plan must be a string")
            messages.append({"role": "assistant", "content": plan.strip()})
            user(PLAN_FOLLOW_UP)
        else:  # action
            n = step.get("step_number")
            timing(step, where, n, "action")
            count(step.get("token_usage"))
            if system is None and isinstance(step.get("model_input_messages"), list) and step["model_input_messages"]:
                first = step["model_input_messages"][0]
                if isinstance(first, dict) and first.get("role") == "system":
                    system = _text(first.get("content"), f"{where}.model_input_messages[0].content", losses)
            out_msg = step.get("model_output_message")
            if out_msg is not None and not isinstance(out_msg, dict):
                raise RecordError(f"{where}.model_output_message must be an object")
            model_output = step.get("model_output")
            if model_output is None and isinstance(out_msg, dict):
                model_output = out_msg.get("content")
            text = _text(model_output, f"{where}.model_output", losses)
            err_text = _error_text(step.get("error"))
            if isinstance(step.get("error"), dict) and step["error"].get("type") == "AgentMaxStepsError":
                max_steps = True
            obs = step.get("observations")
            if obs is not None and not isinstance(obs, str):
                raise RecordError(f"{where}.observations must be a string")
            if step.get("observations_images"):
                k = len(step["observations_images"]) if isinstance(step["observations_images"], list) else 1
                losses.append(f"{where}.observations_images: {k} image(s) not carried over")
            if step.get("is_final_answer"):  # a ToolCallingAgent keeps the answer only as the observation
                final, has_final = step.get("action_output") if step.get("action_output") is not None else obs, True
            if step.get("code_action") is not None:
                agents.add("CodeAgent")
                if out_msg is not None or model_output is not None:
                    messages.append({"role": "assistant", "content": text.strip()})
                if obs is not None:
                    user("Observation:\n" + obs)
                if err_text is not None:
                    user(err_text)
                continue
            # a ToolCallingAgent step (or a step that failed before any output)
            raw_calls = out_msg.get("tool_calls") if isinstance(out_msg, dict) else None
            cw = f"{where}.model_output_message.tool_calls"
            step_calls = step.get("tool_calls")
            if not raw_calls:
                raw_calls, cw = step_calls or [], f"{where}.tool_calls"
            elif step_calls:  # both recorded: they should be the same calls
                differ = _disagreement(raw_calls, step_calls)
                if differ:
                    losses.append(f"{where}: tool_calls disagree with model_output_message.tool_calls ({differ}); the conversation "
                                  "keeps model_output_message's (what the model wrote), the step's are in metadata.step_tool_calls")
                    kept_step_calls.append({"step_number": n, "message": len(messages), "tool_calls": step_calls})
            if not isinstance(raw_calls, list):
                raise RecordError(f"{cw} must be a list")
            if out_msg is None and model_output is None and not raw_calls:
                # no model output (e.g. max steps reached): the answer smolagents asked for separately
                if err_text is not None:
                    user(err_text)
                if step.get("action_output") is not None:
                    messages.append({"role": "assistant", "content": _text(step["action_output"], f"{where}.action_output", losses)})
                continue
            agents.add("ToolCallingAgent")
            idx = len(messages)
            calls = []
            for j, c in enumerate(raw_calls):
                if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
                    raise RecordError(f"{cw}[{j}] is not a {{id, type, function}} tool call")
                fn = c["function"]
                name = fn.get("name")
                if not isinstance(name, str) or not name:
                    raise RecordError(f"{cw}[{j}] has no function name")
                args, err = decode_arguments(fn.get("arguments"))
                call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
                if isinstance(c.get("id"), str) and c["id"]:
                    call["id"] = c["id"]
                calls.append(call)
                if err is not None:
                    raw = fn.get("arguments")
                    errors.setdefault(idx, []).append(ParseError(message=f"tool call {j} ({name!r}): {err}", raw=raw if isinstance(raw, str) else None))
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
            if not calls:
                if obs is not None:
                    user("Observation:\n" + obs)
                if err_text is not None:
                    user(err_text)
                continue
            # results, in smolagents' order (sorted by call id)
            ordered = sorted(calls, key=lambda c: str(c.get("id", "")))
            answered = 0
            if obs is not None:
                lines = obs.split("\n")
                if len(ordered) > 1 and len(lines) == len(ordered):
                    for c, line in zip(ordered, lines):
                        messages.append(_tool_msg(c, line))
                    answered = len(ordered)
                else:
                    messages.append(_tool_msg(ordered[0], obs))
                    answered = 1
            if err_text is not None:
                if answered < len(ordered):
                    messages.append(_tool_msg(ordered[answered], err_text))
                else:
                    user(err_text)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
        errors = {k + 1: v for k, v in errors.items()}
        for k in kept_step_calls:
            k["message"] += 1
    if not any(m["role"] in ("assistant", "user") for m in messages):
        raise RecordError("the memory has no task or model output")
    fill_tool_message_names(messages)
    meta: dict[str, Any] = {"steps": len(steps)}
    if agents:
        meta["agent"] = "/".join(sorted(agents))
    if starts and ends:
        meta["duration_s"] = round(max(ends) - min(starts), 6)
    if durations:
        meta["step_durations"] = durations
    if usage:
        meta["usage"] = usage
    if has_final:
        meta["final_answer"] = final
    if kept_step_calls:
        meta["step_tool_calls"] = kept_step_calls
    return Conversation(
        messages=messages, tools=normalize_tools(tools, "tools"), metadata=meta, parse_errors=errors,
        losses=losses, provenance={"library": "smolagents"},
        termination_reason=TerminationReason.MAX_ASSISTANT_TURNS if max_steps else None,
    )


def _call_key(c: Any) -> tuple[str, str, str]:
    """``(id, name, arguments)`` of a recorded call, the arguments decoded where they are JSON
    (compared as canonical JSON), else as written."""
    fn = c.get("function") if isinstance(c, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    args, err = decode_arguments(fn.get("arguments"))
    shown = repr(fn.get("arguments")) if err is not None else json.dumps(args, ensure_ascii=False, sort_keys=True)
    return (str(c.get("id", "")) if isinstance(c, dict) else "", str(fn.get("name", "")), shown)


def _disagreement(model_calls: Any, step_calls: Any) -> str:
    """How a step's ``tool_calls`` (what smolagents ran, sorted by call id) differ from its
    ``model_output_message.tool_calls`` (what the model wrote): "" when they are the same calls."""
    if not isinstance(model_calls, list) or not isinstance(step_calls, list):
        return "one of them is not a list"
    a, b = sorted(map(_call_key, model_calls)), sorted(map(_call_key, step_calls))
    if a == b:
        return ""
    out = []
    by_id = {k[0]: k for k in b}
    for k in a:
        other = by_id.pop(k[0], None)
        if other == k:
            continue
        what = f"call {k[0]!r} ({k[1]})"
        if other is None:
            out.append(f"{what}: only in model_output_message")
        elif other[1] != k[1]:
            out.append(f"{what}: named {other[1]!r} in tool_calls")
        else:
            out.append(f"{what}: arguments {k[2]} in model_output_message, {other[2]} in tool_calls")
    out += [f"call {k[0]!r} ({k[1]}): only in tool_calls" for k in by_id.values()]
    return "; ".join(out)


def _tool_msg(call: dict[str, Any], text: str) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "tool", "content": text, "name": call["function"]["name"]}
    if "id" in call:
        m["tool_call_id"] = call["id"]
    return m


@register
class SmolagentsImporter(Importer):
    name = "smolagents"
    label = "smolagents"
    description = "smolagents agent memory (memory.get_full_steps(), or a run result's dict)"

    def sniff(self, record: Any) -> Any:
        if looks_like_steps(record):
            return "a list of smolagents memory steps (task/action/planning steps)"
        if _is_run_result(record) and looks_like_steps(record["steps"]):
            return "a smolagents run result (output, state, steps)"
        return False

    def whole_file(self, doc: Any) -> bool:
        return looks_like_steps(doc)

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if isinstance(record, dict):
            if not isinstance(record.get("steps"), list):
                raise RecordError('expected a list of smolagents steps, or a run result {"output", "state", "steps", ...}')
            conv = steps_to_conversation(record["steps"], record.get("tools"), "steps")
            conv.id = record_id(record) if any(k in record for k in ("id", "trace_id")) else record_id(record["steps"])
            if "output" in record:
                conv.metadata["final_answer"] = record["output"]
            if isinstance(record.get("state"), str):
                conv.metadata["state"] = record["state"]
                if record["state"] == "max_steps_error":
                    conv.termination_reason = TerminationReason.MAX_ASSISTANT_TURNS
            tm = record.get("timing")
            if isinstance(tm, dict) and _num(tm.get("duration")) is not None:
                conv.metadata["duration_s"] = round(float(tm["duration"]), 6)
            count = record.get("token_usage")
            if isinstance(count, dict) and "usage" not in conv.metadata:
                conv.metadata["usage"] = {k: count[k] for k in ("input_tokens", "output_tokens") if isinstance(count.get(k), int)}
        elif isinstance(record, list):
            conv = steps_to_conversation(record)
            conv.id = record_id(record)
        else:
            raise RecordError(f"expected a list of smolagents steps, got {type(record).__name__}")
        return [conv]
