"""LangSmith run trees → conversations.

Input: runs as the LangSmith SDK sends them and as they are exported (``Run`` / ``RunTree``
dicts: ``id``, ``trace_id``, ``parent_run_id``, ``dotted_order``, ``name``, ``run_type``,
``inputs``, ``outputs``, ``start_time``, ``end_time``, ``error``, ``extra``, ``events``, ...), in
any of the shapes people keep them:

* one run per line (``client.list_runs`` exports, or what the SDK posted: a post and a later
  patch of the same run are merged by ``id``);
* one nested run tree per line (``child_runs``, as ``read_run(load_child_runs=True)`` or a
  ``RunTree`` gives it);
* batch-ingest bodies ``{"post": [...], "patch": [...]}``.

Runs are grouped by trace (``trace_id``; else the root of ``dotted_order``, else the
``parent_run_id`` chain) across the whole file. In a trace, the conversation is the LAST ``llm``
run's input messages + its output: OpenAI-style (``wrap_openai``: ``inputs.messages`` +
``outputs.choices``) or LangChain-serialised (LangChain's tracer: ``inputs.messages`` =
``[[{"lc": 1, "type": "constructor", "id": [..., "HumanMessage"], "kwargs": {...}}]]`` +
``outputs.generations``), also ``messages_to_dict`` ``{"type", "data"}`` messages and Responses
API runs (``inputs.input`` + ``outputs.output`` items). An earlier ``llm`` run whose conversation
is not a prefix of a later one is a conversation of its own (one trace may give several).

``tool`` runs give their durations (``metadata.tool_durations_s``, in order, and
``metadata.tool_runs``) and, where the conversation lacks them, their results (matched to the
call by the run's ``tool_call_id``, else by name and arguments). ``chain`` / ``prompt`` /
``parser`` / ``retriever`` / ``embedding`` runs serve grouping and timing, not losses.

Provenance: library ``langsmith`` with ``extra.runtime.sdk_version`` (``runtime.library`` and
``library_version`` too when another library traced it, e.g. ``langchain-core``), the trace id,
the run ids the conversation came from.

The readers of chat inputs / outputs here (:func:`chat_call`, :func:`lc_message`) also serve
the MLflow importer, whose spans carry the same payloads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, fill_tool_message_names, normalize_tools, tool_run_calls
from backend.trace import LoadProblem, ParseError
from backend.trace.model import TerminationReason

# ---- LangChain messages -------------------------------------------------------------------------

_LC_TYPE_ROLE = {
    "human": "user", "user": "user", "ai": "assistant", "assistant": "assistant", "system": "system",
    "developer": "system", "tool": "tool", "function": "tool",
}
_LC_CLASS_TYPE = {
    "HumanMessage": "human", "AIMessage": "ai", "SystemMessage": "system", "ToolMessage": "tool",
    "FunctionMessage": "function", "ChatMessage": "chat",
}
_CALL_BLOCKS = ("tool_call", "tool_use", "function_call", "tool_call_chunk")


def is_lc_message(m: Any) -> bool:
    """A LangChain message in one of its serialised shapes: ``dumpd`` (``{"lc": 1, "type":
    "constructor", "id": [..., "AIMessage"], "kwargs"}``), ``messages_to_dict`` (``{"type",
    "data"}``) or a message's ``model_dump()`` (``{"type": "ai", "content", ...}``, no role)."""
    if not isinstance(m, dict):
        return False
    if m.get("lc") == 1 and m.get("type") == "constructor" and isinstance(m.get("kwargs"), dict):
        return True
    if isinstance(m.get("data"), dict) and isinstance(m.get("type"), str):
        return True
    return "role" not in m and m.get("type") in (*_LC_TYPE_ROLE, "chat") and "content" in m


def lc_message(m: dict[str, Any], where: str) -> dict[str, Any]:
    """A LangChain message (see :func:`is_lc_message`) → an OpenAI-style message (tool calls with
    object arguments; ``invalid_tool_calls`` keep their raw argument string)."""
    if m.get("lc") == 1 and isinstance(m.get("kwargs"), dict):
        kw = m["kwargs"]
        ident = m.get("id")
        cls = ident[-1] if isinstance(ident, list) and ident and isinstance(ident[-1], str) else ""
        typ = kw.get("type") or _LC_CLASS_TYPE.get(cls.removesuffix("Chunk"))
    elif isinstance(m.get("data"), dict):
        kw, typ = m["data"], m.get("type")
    else:
        kw, typ = m, m.get("type")
    if isinstance(typ, str):
        typ = typ.removesuffix("Chunk").lower()
        typ = {"aimessage": "ai", "humanmessage": "human", "systemmessage": "system", "toolmessage": "tool"}.get(typ, typ)
    role = kw.get("role") if typ == "chat" else _LC_TYPE_ROLE.get(typ)  # type: ignore[arg-type]
    if role not in ("system", "user", "assistant", "tool", "developer", "human", "ai"):
        raise RecordError(f"{where}: LangChain message of type {typ!r} (role {role!r}) is not a chat message")
    role = {"human": "user", "ai": "assistant", "developer": "system"}.get(role, role)
    out: dict[str, Any] = {"role": role}
    content = kw.get("content", "")
    ak = kw.get("additional_kwargs") if isinstance(kw.get("additional_kwargs"), dict) else {}
    if role == "assistant":
        calls: list[dict[str, Any]] = []
        lc_calls = kw.get("tool_calls")
        if isinstance(lc_calls, list) and lc_calls:
            for c in lc_calls:
                if not isinstance(c, dict):
                    raise RecordError(f"{where}.tool_calls: a tool call is {type(c).__name__}, not an object")
                if "function" in c:  # OpenAI-shaped after all
                    calls.append(c)
                    continue
                call: dict[str, Any] = {"type": "function", "function": {"name": c.get("name"), "arguments": c.get("args", {})}}
                if isinstance(c.get("id"), str):
                    call["id"] = c["id"]
                calls.append(call)
        elif isinstance(ak.get("tool_calls"), list) and ak["tool_calls"]:
            calls = list(ak["tool_calls"])  # older LangChain: the provider's raw calls only
        for c in kw.get("invalid_tool_calls") or []:
            if isinstance(c, dict):  # arguments that did not parse: kept raw, reported as a parse error
                call = {"type": "function", "function": {"name": c.get("name") or "", "arguments": c.get("args") or ""}}
                if isinstance(c.get("id"), str):
                    call["id"] = c["id"]
                calls.append(call)
        if calls:
            out["tool_calls"] = calls
        elif isinstance(ak.get("function_call"), dict):
            out["function_call"] = ak["function_call"]
        reasoning = ak.get("reasoning_content") if isinstance(ak.get("reasoning_content"), str) else kw.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        if isinstance(content, list):  # content blocks that repeat the calls are not content
            ids = {c.get("id") for c in calls if isinstance(c, dict)}
            content = [b for b in content if not (isinstance(b, dict) and b.get("type") in _CALL_BLOCKS and b.get("id") in ids)]
    if role == "tool":
        for k in ("tool_call_id", "name"):
            if isinstance(kw.get(k), str):
                out[k] = kw[k]
    out["content"] = content
    return out


# ---- chat payloads (LangSmith llm runs, MLflow chat spans) --------------------------------------


def chat_messages(raw: Any, where: str, losses: list[str]) -> tuple[list[dict[str, Any]], dict[int, list[ParseError]]]:
    """OpenAI-style or LangChain messages → HF messages and parse errors by index."""
    from backend.importers.openai_chat import normalize_messages

    if not isinstance(raw, list):
        raise RecordError(f"{where} must be a list of messages, got {type(raw).__name__}")
    openai_style = []
    for i, m in enumerate(raw):
        if is_lc_message(m):
            openai_style.append(lc_message(m, f"{where}[{i}]"))
        elif isinstance(m, dict) and m.get("type") == "message" and "role" in m and isinstance(m.get("content"), list):
            openai_style.append({"role": m["role"], "content": m["content"]})  # Responses-style message item
        else:
            openai_style.append(m)
    return normalize_messages(openai_style, where, losses)


def input_messages(inputs: Any, where: str, losses: list[str]) -> tuple[Any, str]:
    """``(raw message list, its place)`` of a chat model's inputs: ``{"messages": [...]}``,
    LangChain's batch ``{"messages": [[...]]}``, a bare list (of lists), or completion prompts."""
    if isinstance(inputs, dict):
        if "messages" in inputs:
            raw, w = inputs["messages"], f"{where}.messages"
        elif isinstance(inputs.get("prompts"), list):  # a completion model (LangChain LLM)
            prompts = inputs["prompts"]
            if len(prompts) > 1:
                losses.append(f"{where}.prompts[1:]: {len(prompts) - 1} more prompt(s) of a batch not carried over")
            if not prompts or not isinstance(prompts[0], str):
                raise RecordError(f"{where}.prompts: expected a list of prompt strings")
            return [{"role": "user", "content": prompts[0]}], f"{where}.prompts"
        elif isinstance(inputs.get("prompt"), str):
            return [{"role": "user", "content": inputs["prompt"]}], f"{where}.prompt"
        else:
            keys = ", ".join(sorted(inputs)[:8]) or "none"
            raise RecordError(f"{where}: no messages (keys: {keys})")
    else:
        raw, w = inputs, where
    if isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):  # one list per prompt of a batch
        if len(raw) > 1:
            losses.append(f"{w}[1:]: {len(raw) - 1} more prompt(s) of a batch not carried over")
        return raw[0], f"{w}[0]"
    return raw, w


def output_messages(outputs: Any, where: str, losses: list[str], inputs_raw: Any = None) -> tuple[list[Any], str, dict[str, Any]]:
    """``(raw output messages, their place, info)`` of a chat model's outputs: a chat completion
    (``choices``), a LangChain ``LLMResult`` (``generations``), a message (OpenAI-style or
    LangChain), ``{"message"}``, ``{"messages"}`` or a plain string. ``info``: finish_reason,
    model, usage where said."""
    info: dict[str, Any] = {}
    if outputs is None:
        return [], where, info
    if isinstance(outputs, str):
        return [{"role": "assistant", "content": outputs}], where, info
    if isinstance(outputs, list):  # MLflow LangChain spans: a list of messages
        return list(outputs), where, info
    if not isinstance(outputs, dict):
        raise RecordError(f"{where}: the output is {type(outputs).__name__}, not an object")
    for k in ("model", "model_name"):
        if isinstance(outputs.get(k), str):
            info.setdefault("model", outputs[k])
    for k in ("usage", "usage_metadata"):
        if isinstance(outputs.get(k), dict):
            info.setdefault("usage", outputs[k])
    if isinstance(outputs.get("choices"), list):
        ch = outputs["choices"]
        if not ch:
            return [], f"{where}.choices", info
        if len(ch) > 1:
            losses.append(f"{where}.choices[1:]: {len(ch) - 1} more choice(s) not carried over")
        c0 = ch[0]
        if not isinstance(c0, dict) or not isinstance(c0.get("message"), dict):
            raise RecordError(f"{where}.choices[0] has no message")
        if isinstance(c0.get("finish_reason"), str):
            info["finish_reason"] = c0["finish_reason"]
        return [c0["message"]], f"{where}.choices[0].message", info
    if isinstance(outputs.get("generations"), list):
        gens = outputs["generations"]
        w = f"{where}.generations"
        if gens and isinstance(gens[0], list):
            if len(gens) > 1:
                losses.append(f"{w}[1:]: {len(gens) - 1} more prompt(s) of a batch not carried over")
            gens, w = gens[0], f"{w}[0]"
        if not gens:
            return [], w, info
        if len(gens) > 1:
            losses.append(f"{w}[1:]: {len(gens) - 1} more generation(s) not carried over")
        g = gens[0]
        if not isinstance(g, dict):
            raise RecordError(f"{w}[0] is {type(g).__name__}, not a generation object")
        gi = g.get("generation_info") if isinstance(g.get("generation_info"), dict) else {}
        if isinstance(gi.get("finish_reason"), str):
            info["finish_reason"] = gi["finish_reason"]
        lo = outputs.get("llm_output") if isinstance(outputs.get("llm_output"), dict) else {}
        if isinstance(lo.get("model_name"), str):
            info.setdefault("model", lo["model_name"])
        if isinstance(lo.get("token_usage"), dict):
            info.setdefault("usage", lo["token_usage"])
        msg = g.get("message")
        if isinstance(msg, dict):
            kw = msg.get("kwargs") if isinstance(msg.get("kwargs"), dict) else msg
            rm = kw.get("response_metadata") if isinstance(kw.get("response_metadata"), dict) else {}
            if "finish_reason" not in info and isinstance(rm.get("finish_reason"), str):
                info["finish_reason"] = rm["finish_reason"]
            if isinstance(kw.get("usage_metadata"), dict):
                info.setdefault("usage", kw["usage_metadata"])
            return [msg], f"{w}[0].message", info
        if isinstance(g.get("text"), str):
            return [{"role": "assistant", "content": g["text"]}], f"{w}[0].text", info
        raise RecordError(f"{w}[0] has neither a message nor text")
    if isinstance(outputs.get("message"), dict):
        return [outputs["message"]], f"{where}.message", info
    if isinstance(outputs.get("messages"), list):
        msgs = outputs["messages"]
        if isinstance(inputs_raw, list) and len(msgs) >= len(inputs_raw) and msgs[: len(inputs_raw)] == inputs_raw:
            return msgs[len(inputs_raw):], f"{where}.messages[{len(inputs_raw)}:]", info  # the whole state came back
        return list(msgs), f"{where}.messages", info
    if outputs.get("role") == "assistant" or is_lc_message(outputs):
        return [outputs], where, info
    if "output" in outputs and len(outputs) <= 2:
        o = outputs["output"]
        if isinstance(o, str):
            return [{"role": "assistant", "content": o}], f"{where}.output", info
        if isinstance(o, dict) and (o.get("role") == "assistant" or is_lc_message(o)):
            return [o], f"{where}.output", info
    keys = ", ".join(sorted(outputs)[:8]) or "none"
    losses.append(f"{where}: not a chat model output (keys: {keys}); the model's reply is not carried over")
    return [], where, info


@dataclass
class ChatCall:
    """One chat model call (a LangSmith ``llm`` run, an MLflow chat span) read as HF messages."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    parse_errors: dict[int, list[ParseError]] = field(default_factory=dict)
    losses: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # model, usage
    ref: str = ""  # the run / span id
    n: int = 1  # the file's record number
    start: float | None = None
    error: str | None = None


def chat_call(inputs: Any, outputs: Any, where: str, *, tools: Any = None, out_where: str | None = None,
              tools_where: str | None = None) -> ChatCall:
    """A chat model's inputs + outputs → :class:`ChatCall` (see :func:`input_messages`,
    :func:`output_messages`; Responses API payloads — ``inputs.input`` + ``outputs.output``
    items — go through the Agents SDK item reader)."""
    losses: list[str] = []
    out_where = out_where or where.replace("inputs", "outputs")
    if isinstance(inputs, dict) and "input" in inputs and "messages" not in inputs and (
        outputs is None or (isinstance(outputs, dict) and isinstance(outputs.get("output"), list))
    ):
        return _responses_call(inputs, outputs, where, out_where, tools)
    raw_in, w_in = input_messages(inputs, where, losses)
    msgs, errors = chat_messages(raw_in, w_in, losses)
    raw_out, w_out, info = output_messages(outputs, out_where, losses, raw_in)
    if raw_out:
        out, e2 = chat_messages(raw_out, w_out, losses)
        for i, errs in e2.items():
            errors[len(msgs) + i] = errs
        msgs = msgs + out
        fill_tool_message_names(msgs)
    if tools is None and isinstance(inputs, dict):
        tools = inputs.get("tools") if inputs.get("tools") is not None else inputs.get("functions")
        tools_where = f"{where}.tools" if inputs.get("tools") is not None else f"{where}.functions"
    return ChatCall(
        messages=msgs, tools=normalize_tools(tools, tools_where or f"{where}.tools") if tools is not None else [], parse_errors=errors,
        losses=losses, finish_reason=info.pop("finish_reason", None), info=info,
    )


def _responses_call(inputs: dict[str, Any], outputs: Any, where: str, out_where: str, tools: Any) -> ChatCall:
    from backend.importers.agents_sdk import items_to_conversation

    items = inputs["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RecordError(f"{where}.input must be a string or a list of items")
    out_items = list(outputs["output"]) if isinstance(outputs, dict) else []
    # a dumped Response writes every unset field as null (namespace, caller ...): absent, not content
    items = [{k: v for k, v in i.items() if v is not None} if isinstance(i, dict) else i for i in items]
    out_items = [{k: v for k, v in i.items() if v is not None} if isinstance(i, dict) else i for i in out_items]
    instructions = inputs.get("instructions") if isinstance(inputs.get("instructions"), str) else None
    try:
        conv = items_to_conversation(items + out_items, tools if tools is not None else inputs.get("tools"), instructions)
    except RecordError as e:
        raise RecordError(f"{where}.input + {out_where}.output: {e}") from None
    info: dict[str, Any] = {}
    if isinstance(outputs, dict):
        if isinstance(outputs.get("model"), str):
            info["model"] = outputs["model"]
        if isinstance(outputs.get("usage"), dict):
            info["usage"] = outputs["usage"]
    return ChatCall(messages=conv.messages, tools=conv.tools, parse_errors=conv.parse_errors,
                    losses=[f"{where}.input + {out_where}.output {x}" for x in conv.losses], info=info)


# ---- tool executions and the assembled conversation --------------------------------------------


@dataclass
class ToolRun:
    """One tool execution (a LangSmith ``tool`` run, an MLflow ``TOOL`` span)."""

    name: str
    args: Any  # what the tool was called with, when said
    result: str | None
    duration_s: float | None
    ref: str
    where: str
    call_id: str | None = None  # the tool call it answers, when the source says
    start: float | None = None
    error: str | None = None
    losses: list[str] = field(default_factory=list)  # of the tool run itself (a malformed attribute ...)


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple((c.get("function", {}).get("name"), _canon(c.get("function", {}).get("arguments"))) for c in m.get("tool_calls") or [])
    return (m.get("role"), m.get("content") or "", calls, m.get("tool_call_id"))


def tool_result_text(out: Any) -> str:
    """A tool's output as the tool message's text: a string as it is, a LangChain
    ``ToolMessage`` (any of its shapes) as its content, anything else JSON."""
    if isinstance(out, dict) and set(out) == {"output"}:
        out = out["output"]
    if isinstance(out, str):
        return out
    if isinstance(out, dict):
        kw = out.get("kwargs") if out.get("lc") == 1 and isinstance(out.get("kwargs"), dict) else out.get("data") if isinstance(out.get("data"), dict) else out
        if kw.get("type") == "tool" or (out.get("lc") == 1 and "content" in kw):
            c = kw.get("content")
            return c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)
    return json.dumps(out, ensure_ascii=False, default=str)


def assemble(calls: list[ChatCall], tools: list[ToolRun]) -> list[tuple[ChatCall, Conversation, list[ChatCall], list[ToolRun]]]:
    """The conversations of one trace: each chat call whose messages are not a prefix of a later
    call's is the end of a conversation (usually only the last one), with the tool runs that
    answer its calls (durations; results where its messages lack them). Returns ``(last call,
    conversation, chat calls of it, tool runs of it)``; tool runs that answer no call are
    named in the last conversation's losses."""
    calls = sorted(calls, key=lambda c: (c.start is None, c.start or 0.0))
    keys = {id(c): [_key(m) for m in c.messages] for c in calls}

    def is_prefix(a: ChatCall, b: ChatCall) -> bool:
        ka, kb = keys[id(a)], keys[id(b)]
        return len(ka) <= len(kb) and ka == kb[: len(ka)]

    leaves = [c for i, c in enumerate(calls) if not any(is_prefix(c, d) for d in calls[i + 1:])]
    out = []
    claimed: set[int] = set()
    tools = sorted(tools, key=lambda t: (t.start is None, t.start or 0.0))
    for leaf in leaves:
        msgs = [dict(m) for m in leaf.messages]
        errors = {i: list(e) for i, e in leaf.parse_errors.items()}
        thread = [c for c in calls if is_prefix(c, leaf)]
        # calls of this conversation, in order: (message index, call)
        call_list = [(i, c) for i, m in enumerate(msgs) if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        answered = {m.get("tool_call_id") for m in msgs if m.get("role") == "tool"}
        used_calls: set[int] = set()
        mine: list[tuple[ToolRun, str | None]] = []
        for ti, t in enumerate(tools):
            if ti in claimed:
                continue
            match = None
            for k, (_, c) in enumerate(call_list):
                if k not in used_calls and t.call_id and c.get("id") == t.call_id:
                    match = k
                    break
            if match is None and not t.call_id:
                for name, args in tool_run_calls(t.name, t.args):  # its own name, else the tool a wrapper's inputs name
                    same = [k for k, (_, c) in enumerate(call_list) if k not in used_calls and c.get("function", {}).get("name") == name]
                    exact = [k for k in same if _canon(call_list[k][1].get("function", {}).get("arguments")) == _canon(args)]
                    match = (exact or same or [None])[0]
                    if match is not None:
                        break
            if match is None:
                continue
            claimed.add(ti)
            used_calls.add(match)
            cid = call_list[match][1].get("id")
            mine.append((replace(t, call_id=cid if isinstance(cid, str) else t.call_id), cid))
        # results the messages lack: after the calling turn (and its other results)
        inserts: dict[int, list[dict[str, Any]]] = {}
        for t, cid in mine:
            if cid in answered or t.result is None:
                continue
            at = next(i for i, c in call_list if c.get("id") == cid) if cid else None
            if at is None:
                continue
            end = at + 1
            while end < len(msgs) and msgs[end].get("role") == "tool":
                end += 1
            fn = call_list[[c.get("id") for _, c in call_list].index(cid)][1].get("function", {})
            msg = {"role": "tool", "content": t.result, "name": fn.get("name") if isinstance(fn.get("name"), str) else t.name}
            if cid:
                msg["tool_call_id"] = cid
            inserts.setdefault(end, []).append(msg)
            answered.add(cid)
        if inserts:
            new: list[dict[str, Any]] = []
            remap: dict[int, int] = {}
            for i in range(len(msgs) + 1):
                new.extend(inserts.get(i, []))
                if i < len(msgs):
                    remap[i] = len(new)
                    new.append(msgs[i])
            msgs = new
            errors = {remap[i]: e for i, e in errors.items()}
        fill_tool_message_names(msgs)
        conv = Conversation(messages=msgs, tools=list(leaf.tools), parse_errors=errors, losses=list(leaf.losses),
                            finish_reason=leaf.finish_reason)
        if leaf.finish_reason == "length":
            conv.termination_reason = TerminationReason.RESPONSE_LENGTH
        elif leaf.finish_reason == "content_filter":
            conv.termination_reason = TerminationReason.CONTENT_FILTER
        elif leaf.error is not None:
            conv.termination_reason = TerminationReason.GENERATION_ERROR
        if not conv.tools:  # an earlier call of the conversation may have named them
            for c in reversed(thread):
                if c.tools:
                    conv.tools = list(c.tools)
                    break
        for c in thread:
            if c is not leaf:
                conv.losses.extend(x for x in c.losses if x not in conv.losses)
        for t, _ in mine:
            conv.losses.extend(t.losses)
        out.append((leaf, conv, thread, [t for t, _ in mine]))
    stray = [t for ti, t in enumerate(tools) if ti not in claimed]
    if out:
        for t in stray:
            what = "its result" if t.result is not None else "it"
            out[-1][1].losses.append(f"{t.where}: tool {t.name!r} answers no tool call of the conversation; {what} is not carried over")
    return out


def tool_metadata(runs: list[ToolRun]) -> dict[str, Any]:
    """``tool_durations_s`` (in order) and ``tool_runs`` (name, id, duration, the call answered)."""
    if not runs:
        return {}
    detail = []
    for t in runs:
        d: dict[str, Any] = {"name": t.name, "id": t.ref}
        if t.duration_s is not None:
            d["duration_s"] = t.duration_s
        if t.call_id:
            d["tool_call_id"] = t.call_id
        if t.error:
            d["error"] = t.error
        detail.append(d)
    return {"tool_durations_s": [t.duration_s for t in runs], "tool_runs": detail}


# ---- LangSmith runs -----------------------------------------------------------------------------

RUN_TYPES = ("llm", "chain", "tool", "retriever", "prompt", "parser", "embedding")


def _looks_like_run(r: Any) -> bool:
    return isinstance(r, dict) and "id" in r and (
        isinstance(r.get("run_type"), str) or ("dotted_order" in r and "trace_id" in r)
    )


def _time(v: Any) -> float | None:
    """Seconds since the epoch of an ISO time (or a number of seconds / milliseconds)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v / 1000 if v > 1e11 else float(v)
    if isinstance(v, str) and v:
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00") if v.endswith("Z") else v).timestamp()
        except ValueError:
            return None
    return None


@dataclass
class _Run:
    d: dict[str, Any]
    n: int
    place: str  # "line 3" / "line 3 child_runs[1]"

    @property
    def id(self) -> str:
        return str(self.d.get("id"))

    @property
    def type(self) -> str:
        return str(self.d.get("run_type") or "")

    @property
    def name(self) -> str:
        return str(self.d.get("name") or "")

    @property
    def where(self) -> str:
        return f"{self.place} run {self.id} ({self.type or 'run'} {self.name!r})"

    @property
    def start(self) -> float | None:
        return _time(self.d.get("start_time"))

    @property
    def end(self) -> float | None:
        return _time(self.d.get("end_time"))


def _unit(ctx: Any) -> str:
    path = getattr(ctx, "path", None) or ""
    return "row" if path.endswith(".parquet") else "record" if path.endswith(".json") else "line"


def _merge(base: dict[str, Any], new: dict[str, Any]) -> None:
    """A later operation on the same run (a patch: outputs, end time, error)."""
    for k, v in new.items():
        if v is None or k == "child_runs":
            continue
        if k == "extra" and isinstance(v, dict) and isinstance(base.get("extra"), dict):
            base["extra"] = {**base["extra"], **v}
        else:
            base[k] = v


def _root_of_dotted(dotted: Any) -> str | None:
    if isinstance(dotted, str) and "Z" in dotted:
        first = dotted.split(".", 1)[0]
        return first.split("Z", 1)[1] or None
    return None


def _runtime(runs: list[_Run]) -> dict[str, Any]:
    for r in runs:
        extra = r.d.get("extra")
        rt = extra.get("runtime") if isinstance(extra, dict) else None
        if isinstance(rt, dict) and rt:
            return rt
    return {}


def _tool_run(r: _Run) -> ToolRun:
    d = r.d
    extra = d.get("extra") if isinstance(d.get("extra"), dict) else {}
    outputs = d.get("outputs")
    call_id = extra.get("tool_call_id") if isinstance(extra.get("tool_call_id"), str) else None
    if call_id is None and isinstance(outputs, dict):
        o = outputs.get("output", outputs)
        if isinstance(o, dict):
            kw = o.get("kwargs") if isinstance(o.get("kwargs"), dict) else o
            if isinstance(kw.get("tool_call_id"), str):
                call_id = kw["tool_call_id"]
    inputs = d.get("inputs")
    args: Any = inputs
    if isinstance(inputs, dict) and set(inputs) == {"input"}:  # LangChain: the call's input as text
        raw = inputs["input"]
        if isinstance(raw, str):
            try:
                args = json.loads(raw)
            except json.JSONDecodeError:
                args = raw
    result = tool_result_text(outputs) if outputs not in (None, {}) else None
    error = d.get("error") if isinstance(d.get("error"), str) and d.get("error") else None
    if result is None and error is not None:
        result = error
    start, end = r.start, r.end
    return ToolRun(name=r.name, args=args, result=result, duration_s=(end - start) if start is not None and end is not None else None,
                   ref=r.id, where=r.where, call_id=call_id, start=start, error=error)


def _llm_call(r: _Run) -> ChatCall:
    d = r.d
    extra = d.get("extra") if isinstance(d.get("extra"), dict) else {}
    inv = extra.get("invocation_params") if isinstance(extra.get("invocation_params"), dict) else {}
    inputs = d.get("inputs")
    tools = None
    if not (isinstance(inputs, dict) and (inputs.get("tools") is not None or inputs.get("functions") is not None)):
        tools = inv.get("tools") if inv.get("tools") is not None else inv.get("functions")
    try:
        call = chat_call(inputs, d.get("outputs"), "inputs", tools=tools, out_where="outputs",
                         tools_where="extra.invocation_params.tools" if tools is not None else None)
    except RecordError as e:
        raise RecordError(f"{r.where}: {e}") from None
    call.losses = [f"{r.where}: {x}" for x in call.losses]
    md = extra.get("metadata") if isinstance(extra.get("metadata"), dict) else {}
    if "model" not in call.info:
        for v in (md.get("ls_model_name"), inv.get("model"), inv.get("model_name"), inputs.get("model") if isinstance(inputs, dict) else None):
            if isinstance(v, str) and v:
                call.info["model"] = v
                break
    if "usage" not in call.info and isinstance(md.get("usage_metadata"), dict):
        call.info["usage"] = md["usage_metadata"]
    call.ref, call.n, call.start = r.id, r.n, r.start
    if isinstance(d.get("error"), str) and d["error"]:
        call.error = d["error"]
    return call


class _Trace:
    def __init__(self, tid: str) -> None:
        self.id = tid
        self.runs: list[_Run] = []


def _flatten(n: int, rec: Any, place: str, out: list[_Run], problems: list[LoadProblem], parent: dict[str, Any] | None = None) -> None:
    if isinstance(rec, dict) and not _looks_like_run(rec) and (isinstance(rec.get("post"), list) or isinstance(rec.get("patch"), list)):
        for op in ("post", "patch"):
            for i, r in enumerate(rec.get(op) or []):
                _flatten(n, r, f"{place} {op}[{i}]", out, problems)
        return
    if not isinstance(rec, dict):
        problems.append(LoadProblem(n, f"{place}: a LangSmith run must be an object, got {type(rec).__name__}"))
        return
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        problems.append(LoadProblem(n, f"{place}: LangSmith run has no id"))
        return
    if rec.get("run_type") is not None and not isinstance(rec.get("run_type"), str):
        problems.append(LoadProblem(n, f"{place} run {rid}: run_type must be a string"))
        return
    d = {k: v for k, v in rec.items() if k != "child_runs"}
    if parent is not None:
        d.setdefault("parent_run_id", parent.get("id"))
        if parent.get("trace_id") and not d.get("trace_id"):
            d["trace_id"] = parent["trace_id"]
    out.append(_Run(d, n, place))
    kids = rec.get("child_runs")
    if kids is None:
        return
    if not isinstance(kids, list):
        problems.append(LoadProblem(n, f"{place} run {rid}: child_runs must be a list"))
        return
    for i, c in enumerate(kids):
        _flatten(n, c, f"{place} child_runs[{i}]" if place else f"child_runs[{i}]", out, problems, d)


@register
class LangSmithImporter(Importer):
    name = "langsmith"
    label = "LangSmith"
    description = ("LangSmith runs (one per line, nested run trees with child_runs, or batch-ingest post/patch bodies), "
                   "grouped by trace: the last llm run's messages + output, tool runs' durations and results")
    grouped = True

    def sniff(self, record: Any) -> Any:
        if not isinstance(record, dict):
            return None
        rt = record.get("run_type")
        if isinstance(rt, str) and "id" in record and any(
            k in record for k in ("dotted_order", "trace_id", "parent_run_id", "child_runs", "child_run_ids", "session_name", "inputs")
        ):
            return f"a LangSmith run (run_type {rt})"
        if "id" in record and isinstance(record.get("dotted_order"), str) and "trace_id" in record:
            return "a LangSmith run update (dotted_order)"
        for op in ("post", "patch"):
            v = record.get(op)
            if isinstance(v, list) and v and _looks_like_run(v[0]):
                return "a LangSmith batch-ingest body (post/patch runs)"
        return None

    def convert(self, record: Any, ctx: Any) -> list[Any]:
        return [item for _, item in self.convert_group([(1, record)], ctx) if not isinstance(item, LoadProblem)]

    def convert_group(self, records: list[tuple[int, Any]], ctx: Any) -> Iterator[tuple[int, Any]]:
        unit = _unit(ctx)
        by_id: dict[str, _Run] = {}
        order: list[str] = []
        for n, rec in records:
            flat: list[_Run] = []
            problems: list[LoadProblem] = []
            _flatten(n, rec, f"{unit} {n}", flat, problems)
            for p in problems:
                yield p.line, p
            for r in flat:
                if r.id in by_id:
                    _merge(by_id[r.id].d, r.d)
                else:
                    by_id[r.id] = r
                    order.append(r.id)
        # trace of each run: trace_id, else dotted_order's root, else the parent chain's root
        traces: dict[str, _Trace] = {}

        def trace_of(r: _Run, seen: int = 0) -> str:
            tid = r.d.get("trace_id") or _root_of_dotted(r.d.get("dotted_order"))
            if tid:
                return str(tid)
            parent = r.d.get("parent_run_id")
            if parent and parent in by_id and seen < 1000:
                return trace_of(by_id[parent], seen + 1)
            return str(parent or r.id)

        for rid in order:
            r = by_id[rid]
            tid = trace_of(r)
            traces.setdefault(tid, _Trace(tid)).runs.append(r)
        for tr in traces.values():
            yield from self._trace(tr, unit)

    def _trace(self, tr: _Trace, unit: str) -> Iterator[tuple[int, Any]]:
        n0 = min(r.n for r in tr.runs)
        llm_runs = [r for r in tr.runs if r.type == "llm"]
        if not llm_runs:
            kinds = ", ".join(f"{r.type or 'run'} {r.name!r}" for r in tr.runs[:4]) + (" ..." if len(tr.runs) > 4 else "")
            yield n0, LoadProblem(n0, f"trace {tr.id}: no llm run among its {len(tr.runs)} run(s) ({kinds}): no conversation to import")
            return
        try:
            calls = [_llm_call(r) for r in llm_runs]
        except RecordError as e:
            yield n0, LoadProblem(n0, f"trace {tr.id}: {e}")
            return
        tool_runs = [_tool_run(r) for r in tr.runs if r.type == "tool"]
        got = assemble(calls, tool_runs)
        runtime = _runtime(llm_runs) or _runtime(tr.runs)
        starts = [s for s in (r.start for r in tr.runs) if s is not None]
        ends = [e for e in (r.end for r in tr.runs) if e is not None]
        roots = [r for r in tr.runs if not r.d.get("parent_run_id")]
        counts: dict[str, int] = {}
        for r in tr.runs:
            counts[r.type or "run"] = counts.get(r.type or "run", 0) + 1
        for k, (leaf, conv, thread, tools) in enumerate(got):
            conv.id = tr.id if len(got) == 1 else f"{tr.id}-{k}"
            md = conv.metadata
            if len(roots) == 1 and roots[0].start is not None and roots[0].end is not None:
                md["duration_s"] = max(0.0, roots[0].end - roots[0].start)
            elif starts and ends:
                md["duration_s"] = max(0.0, max(ends) - min(starts))
            md.update(leaf.info)
            if leaf.finish_reason:
                md["finish_reason"] = leaf.finish_reason
            md["runs"] = counts
            md["llm_calls"] = len(thread)
            md.update(tool_metadata(tools))
            errors = [{"run_id": r.id, "name": r.name, "error": r.d["error"]} for r in tr.runs if isinstance(r.d.get("error"), str) and r.d["error"]]
            if errors:
                md["errors"] = errors
            names = [r.name for r in roots if r.name]
            if names:
                md["name"] = names[0]
            prov: dict[str, Any] = {"library": "langsmith"}
            if isinstance(runtime.get("sdk_version"), str):
                prov["version"] = runtime["sdk_version"]
            if isinstance(runtime.get("sdk"), str):
                prov["sdk"] = runtime["sdk"]
            lib = runtime.get("library")
            if isinstance(lib, str) and lib and lib != "langsmith":
                prov["traced_by"] = lib + (f" {runtime['library_version']}" if isinstance(runtime.get("library_version"), str) else "")
            prov["trace_id"] = tr.id
            prov["run_id"] = leaf.ref
            prov["run_ids"] = [c.ref for c in thread] + [t.ref for t in tools]
            project = next((r.d.get("session_name") for r in tr.runs if isinstance(r.d.get("session_name"), str)), None)
            if project:
                prov["project"] = project
            conv.provenance = prov
            yield leaf.n, conv


__all__ = [
    "ChatCall", "LangSmithImporter", "ToolRun", "assemble", "chat_call", "chat_messages", "is_lc_message", "lc_message",
    "tool_metadata", "tool_result_text",
]
