"""Shared pieces of the importers: the record error type, message/tool normalisation, and the
two ways an imported conversation gets token ids.

* **rendered** (the source has no token ids): the messages + tools are rendered with the chosen
  tokenizer and template; ``prompt_ids`` are the tokens before the first assistant turn,
  ``response_ids`` the rest; the mask is 1 on each assistant turn's own tokens (after the
  template's generation prompt, through its end-of-turn token, as a generating engine would
  have produced them) and 0 elsewhere: the separator the template writes after that token
  (Qwen's ``\n`` after ``<|im_end|>``, between turns and after the last one) is context, as
  verl >= 0.9 and the loop mask it and as the mask audit reads it (trl's ``*_training``
  templates count it as assistant: ``check`` says so as an expected ``mask_mismatch``, info).
  Synthetic steps (pending / generating / processing_tools) are built from those spans so the
  UI and diagnostics can point at them; the separator after the last turn is in no step.
* **given** (the source has token ids, e.g. verl agent-loop outputs): ids and mask are kept
  exactly; the text is decoded only to show it, and messages are recovered from the decoded
  text where the template is ChatML-like.

``metadata["ids"]`` says which (``"rendered"`` / ``"given"`` / ``"none"`` when the template
could not render the messages), ``metadata["source"]`` the format.
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from backend.errors import UserError
from backend.parsers import get_format
from backend.trace import MessageSpan, ParseError, ToolCall, ToolResult, Trace
from backend.trace.builder import TraceBuilder, mask_runs
from backend.trace.messages import parse_assistant_text
from backend.trace.model import StepInfo, StepState

ROLES = ("system", "user", "assistant", "tool")


class RecordError(UserError):
    """One input record cannot be imported; the message says why (the rest still import)."""


# ---- small helpers ------------------------------------------------------------------------------


def record_id(record: Any, *, keys: tuple[str, ...] = ("id", "trace_id", "uid", "request_id", "custom_id")) -> str:
    """A stable id: the record's own id field when it has one, else a hash of its content (so
    importing the same file twice gives the same ids)."""
    if isinstance(record, dict):
        for k in keys:
            v = record.get(k)
            if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v):
                return str(v)
    blob = json.dumps(record, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha1(blob).hexdigest()[:16]


def text_of(content: Any, where: str, losses: list[str] | None = None) -> str | None:
    """Message content as text: strings as they are, lists of text parts joined (OpenAI
    ``{"type": "text", "text": ...}``, Responses ``input_text``/``output_text``), None kept.
    A part with no text (an image, audio, a file) is not carried over: it is named in
    ``losses`` when given."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict):
                t = p.get("text")
                if isinstance(t, str):
                    parts.append(t)
                elif p.get("type") == "refusal" and isinstance(p.get("refusal"), str):
                    parts.append(p["refusal"])
                elif losses is not None:  # images/audio/files have no text
                    losses.append(f"{where}: content part {i} ({p.get('type') or 'untyped'}) not carried over: it has no text")
            else:
                raise RecordError(f"{where}: content part {i} is {type(p).__name__}, not an object")
        return "".join(parts)
    if isinstance(content, (int, float, bool)):
        return json.dumps(content)
    if isinstance(content, dict):
        t = content.get("text")
        if isinstance(t, str):
            return t
        return json.dumps(content, ensure_ascii=False)
    raise RecordError(f"{where}: content is {type(content).__name__}, expected text")


def normalize_tool(tool: Any, where: str) -> dict[str, Any]:
    """One tool schema in HF/OpenAI chat format ``{"type": "function", "function": {...}}``.

    Accepts that format, a bare function ``{"name", "description", "parameters"}``, the Responses
    API's flat ``{"type": "function", "name", "parameters"}``, the Agents SDK's FunctionTool
    (object or dict with ``params_json_schema``)."""
    if not isinstance(tool, dict):
        # an agents.FunctionTool (or anything shaped like it)
        name = getattr(tool, "name", None)
        params = getattr(tool, "params_json_schema", None)
        if isinstance(name, str) and isinstance(params, dict):
            return {
                "type": "function",
                "function": {"name": name, "description": getattr(tool, "description", "") or "", "parameters": params},
            }
        raise RecordError(f"{where}: a tool must be an object, got {type(tool).__name__}")
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else None
    src = fn if fn is not None else tool
    name = src.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError(f"{where}: tool has no name")
    params = src.get("parameters")
    if params is None:
        params = src.get("params_json_schema", src.get("input_schema"))
    if params is None:
        params = {"type": "object", "properties": {}}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except json.JSONDecodeError:
            raise RecordError(f"{where}: tool {name!r} parameters are not valid JSON") from None
    if not isinstance(params, dict):
        raise RecordError(f"{where}: tool {name!r} parameters must be a JSON schema object")
    out_fn: dict[str, Any] = {"name": name}
    desc = src.get("description")
    if isinstance(desc, str):
        out_fn["description"] = desc
    out_fn["parameters"] = params
    for k in ("return", "strict"):
        if k in src:
            out_fn[k] = src[k]
    return {"type": "function", "function": out_fn}


def normalize_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]]:
    if tools is None or tools == "":
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise RecordError(f"{where}: not valid JSON ({e.msg})") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise RecordError(f"{where}: must be a list of tool schemas")
    out = []
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") not in (None, "function") and "function" not in t and "name" not in t:
            continue  # hosted tools (web_search, file_search, ...) have no schema to render
        out.append(normalize_tool(t, f"{where}[{i}]"))
    return out


def tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {t.get("function", t).get("name") for t in tools if isinstance(t, dict)}


# a generic tool wrapper's inputs: the tool it ran and that tool's arguments
_WRAPPED_NAME_KEYS = ("name", "tool_name", "tool")
_WRAPPED_ARGS_KEYS = ("arguments", "args", "tool_input", "input", "parameters")


def _decoded(a: Any) -> Any:
    """Arguments given as a JSON string, decoded (kept as written when they are not JSON)."""
    if isinstance(a, str):
        try:
            return json.loads(a)
        except (json.JSONDecodeError, RecursionError, ValueError):
            pass
    return a


def _positional_call(args: Any) -> tuple[str, Any] | None:
    """A generic wrapper called positionally, ``call_tool("get_weather", {"city": "Paris"})``:
    ``(tool name, its arguments)`` from the inputs ``{"args": [name, arguments], "kwargs": {}}``
    (Langfuse's ``@observe``; a ``*args`` wrapper's inputs) or a bare ``[name, arguments]``;
    the arguments may also come as a keyword (``call_tool("get_weather", arguments={...})``) or
    be the tool's own keywords (``call_tool("get_weather", city="Paris")``). None otherwise."""
    if isinstance(args, dict) and set(args) <= {"args", "kwargs"} and isinstance(args.get("args"), list):
        pos, kw = args["args"], args.get("kwargs") or {}
    elif isinstance(args, list):
        pos, kw = args, {}
    else:
        return None
    if not pos or not isinstance(pos[0], str) or not pos[0] or not isinstance(kw, dict):
        return None
    if len(pos) == 2 and not kw:
        return pos[0], _decoded({} if pos[1] is None else pos[1])
    if len(pos) == 1:
        keys = [k for k in _WRAPPED_ARGS_KEYS if k in kw]
        if len(keys) == 1 and len(kw) == 1:
            a = kw[keys[0]]
            return pos[0], _decoded({} if a is None else a)
        return pos[0], dict(kw)
    return None


def tool_run_calls(name: Any, args: Any) -> list[tuple[Any, Any]]:
    """The ``(tool name, arguments)`` a tool run (a LangSmith tool run, an MLflow TOOL span, a
    Langfuse tool observation) may have run: its own name and inputs, then — a generic wrapper's
    run — the tool its inputs name, with those arguments (a JSON string decoded): called with
    keywords (``call_tool(name="get_weather", arguments={...})``: the inputs name another tool,
    with its arguments or none) or positionally (``call_tool("get_weather", {...})``: inputs
    ``{"args": ["get_weather", {...}], "kwargs": {}}``, see :func:`_positional_call`). Callers
    match against the conversation's calls in this order."""
    out: list[tuple[Any, Any]] = [(name, args)]
    if isinstance(args, dict):
        inner = next((args[k] for k in _WRAPPED_NAME_KEYS if isinstance(args.get(k), str) and args[k]), None)
        rest = [k for k in args if k not in _WRAPPED_NAME_KEYS]
        arg_key = next((k for k in _WRAPPED_ARGS_KEYS if k in args), None)
        if inner is not None and inner != name and (arg_key is not None or not rest):
            a = args[arg_key] if arg_key is not None else {}
            out.append((inner, _decoded({} if a is None else a)))
    pos = _positional_call(args)
    if pos is not None and pos[0] != name:
        out.append(pos)
    return out


def fill_tool_message_names(messages: list[dict[str, Any]]) -> None:
    """Give tool messages the ``name`` of the call they answer (matched by ``tool_call_id``,
    else by order within the turn), as HF templates expect."""
    by_id: dict[str, str] = {}
    pending: list[str] = []
    for m in messages:
        if m.get("role") == "assistant":
            pending = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function", c) if isinstance(c, dict) else {}
                name = fn.get("name")
                if isinstance(name, str):
                    pending.append(name)
                    if isinstance(c.get("id"), str):
                        by_id[c["id"]] = name
        elif m.get("role") == "tool":
            if "name" not in m or not m.get("name"):
                tid = m.get("tool_call_id")
                if isinstance(tid, str) and tid in by_id:
                    m["name"] = by_id[tid]
                elif pending:
                    m["name"] = pending[0]
            if pending:
                pending.pop(0)


# ---- a conversation, before it becomes a trace --------------------------------------------------


@dataclass
class Conversation:
    """What an importer produces: HF messages + tools, and what it knows beyond them."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    # per assistant message index: parse errors found while importing (bad arguments JSON, ...)
    parse_errors: dict[int, list[ParseError]] = field(default_factory=dict)
    finish_reason: str | None = None  # of the last assistant turn, when the source says
    termination_reason: str | None = None
    render_tools: bool = True  # False when the tools are already written into the system prompt
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # content of the source that the conversation does not carry (an image part, an unknown
    # block type, a tool result that answers no call ...): one line each, with its place in the
    # record; reported on the trace (metadata.import.losses) and by the import
    losses: list[str] = field(default_factory=list)
    # where it came from: {"format": label, "library", "version", "trace_id", "span_ids", ...}
    # (only what the file says); the Inspector's badge names it
    provenance: dict[str, Any] = field(default_factory=dict)


def unanswered_results(messages: list[dict[str, Any]], where: str = "messages") -> list[str]:
    """Tool results whose ``tool_call_id`` names no tool call of the conversation (a dangling
    ``tool_call_id`` / ``call_id`` / ``tool_use_id``): one line each, for ``Conversation.losses``.
    The result is kept as a tool message; what it answered is not in the file."""
    ids: set[str] = set()
    out = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                if isinstance(c, dict) and isinstance(c.get("id"), str):
                    ids.add(c["id"])
        elif m.get("role") == "tool":
            tid = m.get("tool_call_id")
            if isinstance(tid, str) and tid and tid not in ids:
                out.append(f"{where}[{i}]: tool result for call id {tid!r} answers no tool call in the file")
    return out


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise RecordError(f"{where} must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise RecordError(f"{where} is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RecordError(f"{where}[{i}] is {type(m).__name__}, not a message object")
        role = m.get("role")
        if role not in ROLES:
            raise RecordError(f"{where}[{i}] has role {role!r}; expected one of {', '.join(ROLES)}")
    return messages


# ---- token ids ----------------------------------------------------------------------------------


def _template_kwargs(conv: Conversation) -> dict[str, Any]:
    return dict(conv.chat_template_kwargs)


def _token_at(starts: list[int], char_pos: int) -> int:
    """Index of the first token whose first character is at or after ``char_pos``."""
    return bisect.bisect_left(starts, char_pos)


def _calls_of(msg: dict[str, Any]) -> list[ToolCall]:
    out = []
    for c in msg.get("tool_calls") or []:
        if not isinstance(c, dict):
            continue
        fn = c.get("function", c)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            continue
        out.append(ToolCall(name=name, arguments=fn.get("arguments", {}), id=c.get("id") if isinstance(c.get("id"), str) else None))
    return out


def results_of(messages: list[dict[str, Any]], idxs: list[int]) -> list[ToolResult]:
    out = []
    for i in idxs:
        m = messages[i]
        if m.get("role") != "tool":
            continue
        content = m.get("content")
        failed = m.get("is_error") is True  # the source says the tool failed (Anthropic's tool_result is_error)
        out.append(
            ToolResult(
                call_id=m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None,
                name=m.get("name") if isinstance(m.get("name"), str) else "",
                content=content if isinstance(content, str) else json.dumps(content, ensure_ascii=False),
                ok=not failed, error="tool_error" if failed else None,
            )
        )
    return out


def trace_from_conversation(conv: Conversation, bundle: Any, source: str) -> Trace:
    """Render ``conv`` with ``bundle`` and build a trace with rendered ids, mask and steps.

    If the template cannot render the messages, the trace is still built (messages and tools
    only, ``metadata["ids"] = "none"``, ``metadata["render_error"]``) so it can be inspected."""
    from backend.tokens.rendering import RenderError, render, render_text

    messages = conv.messages
    tools = conv.tools
    meta = {"source": source, **conv.metadata}
    kw = _template_kwargs(conv)
    if not conv.render_tools:
        meta["tools_in_system_prompt"] = True
    rtools = tools if conv.render_tools else None
    trace_kw: dict[str, Any] = {"tools": tools, "tokenizer": bundle.info(), "metadata": meta}
    if conv.id:
        trace_kw["id"] = conv.id
    if conv.chat_template_kwargs:
        trace_kw["config"] = {"apply_chat_template_kwargs": dict(conv.chat_template_kwargs)}
    b = TraceBuilder(messages, imported=True)
    try:
        r = render(bundle, messages, rtools, add_generation_prompt=False, chat_template_kwargs=kw)
    except RenderError as e:
        meta["ids"] = "none"
        meta["render_error"] = str(e)
        _message_only_steps(b, conv)
        return b.build(termination_reason=conv.termination_reason, **trace_kw)
    text, ids = r.text, r.token_ids
    starts = [o[0] for o in r.offsets]
    spans_by_msg = {s.message: s for s in r.message_spans if s.message >= 0}
    stops = set(getattr(bundle, "stop_token_ids", ()) or ())
    # each assistant message: [start, end) in tokens
    asst: list[tuple[int, int, int]] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or i not in spans_by_msg:
            continue
        sp = spans_by_msg[i]
        cs, ce = sp.char_start or 0, sp.char_end or 0
        start_c = cs
        if i > 0:
            try:
                gp = render_text(bundle, messages[:i], rtools, add_generation_prompt=True, chat_template_kwargs=kw)
            except RenderError:
                gp = None
            if gp is not None and cs <= len(gp) <= ce and text.startswith(gp):
                start_c = len(gp)
        ts, te = _token_at(starts, start_c), _token_at(starts, ce)
        # the turn ends at its last end-of-turn token, inclusive: what the template writes after it
        # (Qwen's "\n" after <|im_end|>) no generation has; it is context, mask 0, as verl >= 0.9 and
        # the loop mask it (trl's training templates count it as assistant: an expected mask_mismatch).
        # A turn with no end-of-turn token of its own (GLM's, which the next message opens) keeps its span
        te = next((k + 1 for k in range(te - 1, ts - 1, -1) if ids[k] in stops), te)
        if te > ts:
            asst.append((ts, te, i))

    n = len(ids)
    msg_tok_start = {i: s.start for i, s in spans_by_msg.items()}
    first = asst[0][0] if asst else n
    b.set_prompt(ids[:first])
    prev = first
    for ts, te, _ in asst:  # the mask: 1 on each assistant turn's own tokens
        ts = max(ts, prev)
        b.append(ids[prev:ts], 0)
        b.append(ids[ts:te], 1)
        prev = max(te, prev)
    b.append(ids[prev:], 0)
    for span in r.message_spans:
        b.add_span(span)

    def decode(a: int, b: int) -> str:
        return bundle.tokenizer.decode(ids[a:b], skip_special_tokens=False)

    def msgs_in(a: int, b: int, *, last: bool = False) -> list[int]:
        return [i for i, s in sorted(msg_tok_start.items()) if messages[i].get("role") != "assistant" and (a <= s < b or (last and s >= a))]

    b.add_step(b.step(StepState.PENDING, start=0, end=first, text=decode(0, first),
                      messages_added=msgs_in(0, first) if asst else list(range(len(messages)))))
    prev = first
    for k, (ts, te, i) in enumerate(asst):
        if ts > prev:
            _between_step(b, prev, ts, decode(prev, ts), msgs_in(prev, ts))
        is_last = k == len(asst) - 1
        b.add_step(b.step(
            StepState.GENERATING, start=ts, end=te, mask=1, text=decode(ts, te),
            messages_added=[i], tool_calls=_calls_of(messages[i]), parse_errors=list(conv.parse_errors.get(i, [])),
            finish_reason=conv.finish_reason if is_last else None,
        ))
        prev = te
    if asst and prev < n:
        added = msgs_in(prev, n, last=True)
        if added:
            _between_step(b, prev, n, decode(prev, n), added)
    b.terminate(conv.termination_reason)
    meta["ids"] = "rendered"
    meta["mask"] = "rendered"
    if not r.spans_exact:
        meta["spans_exact"] = False
    return b.build(termination_reason=conv.termination_reason, **trace_kw)


def _between_step(b: TraceBuilder, start: int, end: int, text: str, added: list[int]) -> None:
    roles = sorted({b.messages[i].get("role") for i in added})
    info = StepInfo(imported=True)
    if roles and roles != ["tool"]:
        info.roles = roles  # a user/system turn between assistant turns, not only tool output
    b.add_step(b.step(
        StepState.PROCESSING_TOOLS, start=start, end=end, mask=0, text=text, messages_added=added,
        tool_results=results_of(b.messages, added), info=info,
    ))


def _message_only_steps(b: TraceBuilder, conv: Conversation) -> None:
    """Steps without tokens, for a trace the template could not render."""
    messages = conv.messages
    pre: list[int] = []
    pending = b.step(StepState.PENDING)
    seen_asst = False
    pending_tools: list[int] = []

    def tool_step() -> None:
        b.add_step(b.step(StepState.PROCESSING_TOOLS, messages_added=pending_tools,
                          tool_results=results_of(messages, pending_tools)))

    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            if not seen_asst:
                pending.messages_added = pre
                b.add_step(pending)
            elif pending_tools:
                tool_step()
            pending_tools = []
            seen_asst = True
            b.add_step(b.step(StepState.GENERATING, messages_added=[i], tool_calls=_calls_of(m),
                              parse_errors=list(conv.parse_errors.get(i, []))))
        elif seen_asst:
            pending_tools.append(i)
        else:
            pre.append(i)
    if not seen_asst:
        pending.messages_added = pre
        b.add_step(pending)
    elif pending_tools:
        tool_step()
    b.terminate(conv.termination_reason)


# ---- given token ids ----------------------------------------------------------------------------

_HERMES = get_format("hermes")  # ChatML turns with <tool_response> blocks (Qwen, Hermes)
_CHATML_BLOCK = _HERMES.turns_regex()
_TOOL_RESPONSE = _HERMES.responses_regex()
_TOOLS_BLOCK = re.compile(r"<tools>\n?(.*?)\n?</tools>", re.S)


def tools_from_text(text: str) -> list[dict[str, Any]] | None:
    """Tool schemas written in a system prompt between ``<tools>`` tags (Hermes / Qwen): one
    JSON object per line, or one JSON list. None if there is no such block or it does not parse."""
    for m in _TOOLS_BLOCK.finditer(text):
        body = m.group(1).strip()
        if body:
            found = _parse_tools_body(body)
            if found is not None:
                return found
    return None


def _parse_tools_body(body: str) -> list[dict[str, Any]] | None:
    try:
        v = json.loads(body)
        items = v if isinstance(v, list) else [v]
    except json.JSONDecodeError:
        items = []
        for line in body.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError:
                return None
    try:
        return normalize_tools(items, "<tools> block")
    except RecordError:
        return None


def tool_responses_in(text: str) -> list[str] | None:
    found = _TOOL_RESPONSE.findall(text)
    return found or None


def system_or_tool_block(role: str, body: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None:
    """``(messages, tools)`` of a decoded system block (a ``<tools>`` block in it read into tools)
    or of a user block that holds only ``<tool_response>`` blocks (tool messages); None for any
    other block."""
    if role == "system":
        tools = tools_from_text(body)
        if tools is None:
            return [{"role": "system", "content": body}], None
        head = body.split("# Tools", 1)[0].rstrip("\n")
        return ([{"role": "system", "content": head}] if head else []), tools
    if role == "user":
        trs = tool_responses_in(body)
        if trs is not None and not _TOOL_RESPONSE.sub("", body).strip():
            return [{"role": "tool", "content": c} for c in trs], None
    return None


def messages_from_chatml(text: str, parser: Any, eos: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and tools from a ``<tools>`` system block) out of ChatML text. Empty if the text
    is not ChatML."""
    messages: list[dict[str, Any]] = []
    tools = None
    for m in _CHATML_BLOCK.finditer(text):
        role, body = m.group(1), m.group(2)
        block = system_or_tool_block(role, body)
        if block is not None:
            messages.extend(block[0])
            tools = block[1] or tools
        elif role == "user":
            messages.append({"role": "user", "content": body})
        elif role == "assistant":
            if not body and m.end() == len(text):
                continue  # the generation prompt
            msg, _ = parse_assistant_text(body, parser, eos)
            messages.append(msg)
        else:
            messages.append({"role": role if role in ROLES else "user", "content": body})
    return messages, tools


def trace_from_ids(
    prompt_ids: list[int],
    response_ids: list[int],
    response_mask: list[int],
    bundle: Any,
    source: str,
    *,
    parser: Any,
    trace_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    messages: list[dict[str, Any]] | None = None,
    termination_reason: str | None = None,
    logprobs: list[float] | None = None,
) -> Trace:
    """A trace whose ids are kept exactly as given. Steps follow the mask runs (1: generating,
    0: processing_tools); messages are recovered from the decoded text unless given."""
    tok = bundle.tokenizer
    b = TraceBuilder(vocab_size=len(tok), tokenizer_name=bundle.name, imported=True)
    b.set_prompt(prompt_ids)
    b.set_response(response_ids, response_mask)
    eos = getattr(tok, "eos_token", None)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    p = len(prompt_ids)
    prompt_text = decode(prompt_ids)
    rec_msgs, rec_tools = messages_from_chatml(prompt_text, parser, eos)
    recovered = messages is None
    if messages is None:
        messages = rec_msgs if rec_msgs else [{"role": "user", "content": prompt_text}]
    b.messages = copy.deepcopy(messages)
    b.add_step(b.step(StepState.PENDING, start=0, end=p, text=prompt_text, messages_added=list(range(len(b.messages)))))
    if p:
        b.add_span(MessageSpan(message=-1, start=0, end=p))
    turn = 0
    a = 0
    for bit, length in mask_runs(response_mask):
        start, end = p + a, p + a + length
        text = decode(response_ids[a : a + length])
        if bit == 1:
            turn += 1
            msg, errs = parse_assistant_text(text, parser, eos)
            calls = [ToolCall(name=c["function"]["name"], arguments=c["function"]["arguments"], id=f"call_{turn}_{i}") for i, c in enumerate(msg.get("tool_calls", []))]
            if calls:
                msg["tool_calls"] = [c.to_message_call() for c in calls]
            lp = logprobs[a : a + length] if logprobs is not None and len(logprobs) >= a + length else None
            b.add_step(b.step(
                StepState.GENERATING, start=start, end=end, mask=1, text=text,
                messages_added=b.add_messages([msg], start, end) if recovered else [],
                tool_calls=calls, parse_errors=errs, logprobs=lp, finish_reason="stop" if eos and text.endswith(eos) else None,
            ))
        else:
            added: list[int] = []
            if recovered:
                trs = tool_responses_in(text)
                new: list[dict[str, Any]]
                if trs is not None:
                    prev_calls = b.steps[-1].tool_calls if b.steps[-1].state == StepState.GENERATING else []
                    new = []
                    for i, c in enumerate(trs):
                        m: dict[str, Any] = {"role": "tool", "content": c}
                        if i < len(prev_calls):
                            m["name"] = prev_calls[i].name
                            if prev_calls[i].id:
                                m["tool_call_id"] = prev_calls[i].id
                        new.append(m)
                else:
                    new_msgs, _ = messages_from_chatml(text, parser, eos)
                    new = new_msgs or [{"role": "user", "content": text}]
                added = b.add_messages(new, start, end)
            b.add_step(b.step(StepState.PROCESSING_TOOLS, start=start, end=end, mask=0, text=text, messages_added=added,
                              tool_results=results_of(b.messages, added)))
        a += length
    b.terminate(termination_reason)
    meta = {"source": source, **(metadata or {}), "ids": "given"}
    meta.setdefault("mask", "given")
    if recovered:
        meta["messages"] = "decoded"
    kw = {"id": trace_id} if trace_id else {}
    return b.build(termination_reason=termination_reason, tools=tools if tools is not None else (rec_tools or []),
                   tokenizer=bundle.info(), metadata=meta, **kw)
