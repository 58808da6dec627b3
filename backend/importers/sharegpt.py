"""ShareGPT-style datasets and plain HF ``messages`` rows → traces.

* ``{"conversations": [{"from": ..., "value": ...}, ...], "tools": ...}``. Roles: ``human``/``user``
  → user, ``gpt``/``assistant``/``model`` → assistant, ``system``, ``tool``/``observation``/
  ``function_response``/``ipython`` → tool, ``function_call`` → an assistant tool call (its value is
  a JSON ``{"name", "arguments"}`` object or a list of them; LLaMA-Factory style).
* Hermes function-calling rows: assistant values hold ``<tool_call>`` blocks (read with the
  hermes parser; ``<think>`` becomes ``reasoning_content``), tool values hold ``<tool_response>``
  blocks (one tool message per block, the wrapper removed because the template writes it;
  a ``{"name", "content"}`` JSON body gives the tool's name and content). When the tools are
  only written in the system prompt between ``<tools>`` tags, they are read from there into
  ``trace.tools`` and not rendered a second time (``metadata.tools_in_system_prompt``).
* Plain ``{"messages": [...], "tools": [...]}`` rows (JSONL or Parquet, where nested columns may
  be JSON strings); assistant content with ``<tool_call>`` text and no ``tool_calls`` is parsed.
"""

from __future__ import annotations

import json
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import (
    Conversation,
    RecordError,
    check_messages,
    fill_tool_message_names,
    normalize_tools,
    record_id,
    tool_responses_in,
    tools_from_text,
)
from backend.trace import ParseError
from backend.trace.messages import assistant_message, decode_arguments

ROLE_MAP = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
    "chatgpt": "assistant", "bot": "assistant", "system": "system", "tool": "tool", "observation": "tool",
    "function_response": "tool", "ipython": "tool", "function": "tool", "function_call": "function_call",
}


def _maybe_json(v: Any, where: str) -> Any:
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise RecordError(f"{where} is a string that is not valid JSON ({e.msg})") from None
    if hasattr(v, "tolist"):  # numpy arrays from Parquet
        return v.tolist()
    return v


class _Builder:
    def __init__(self, parser: Any):
        self.parser = parser
        self.messages: list[dict[str, Any]] = []
        self.errors: dict[int, list[ParseError]] = {}
        self.n_calls = 0

    def _pending_calls(self) -> list[dict[str, Any]]:
        """Calls of the last assistant message not yet answered."""
        answered = 0
        for m in reversed(self.messages):
            if m["role"] == "tool":
                answered += 1
            elif m["role"] == "assistant":
                return (m.get("tool_calls") or [])[answered:]
            else:
                return []
        return []

    def _call(self, name: str, args: Any) -> dict[str, Any]:
        self.n_calls += 1
        return {"id": f"call_{self.n_calls}", "type": "function", "function": {"name": name, "arguments": args}}

    def assistant(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            value = "" if value is None else json.dumps(value, ensure_ascii=False)
        res = self.parser.parse(value) if "<tool_call>" in value or "<think>" in value else None
        if res is None:
            self.messages.append({"role": "assistant", "content": value})
            return
        msg = assistant_message(res, text=value, calls=[self._call(c.name, c.arguments) for c in res.tool_calls])
        if res.errors:
            self.errors[len(self.messages)] = list(res.errors)
        self.messages.append(msg)

    def function_call(self, value: Any, where: str) -> None:
        v = value
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as e:
                raise RecordError(f"{where}: function_call value is not JSON ({e.msg})") from None
        calls = v if isinstance(v, list) else [v]
        out = []
        errs = []
        for j, c in enumerate(calls):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise RecordError(f"{where}: function_call {j} has no name")
            args, err = decode_arguments(c.get("arguments", c.get("parameters")))
            out.append(self._call(c["name"], args))
            if err:
                errs.append(ParseError(message=f"tool call {j} ({c['name']!r}): {err}"))
        # a function_call right after an assistant text turn belongs to that turn
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
            last["tool_calls"] = out
            idx = len(self.messages) - 1
        else:
            self.messages.append({"role": "assistant", "content": "", "tool_calls": out})
            idx = len(self.messages) - 1
        if errs:
            self.errors.setdefault(idx, []).extend(errs)

    def tool(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False)
        bodies = tool_responses_in(value) or [value]
        for body in bodies:
            name = None
            content = body
            try:
                obj = json.loads(body)
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("name"), str) and "content" in obj and len(obj) <= 3:
                name = obj["name"]
                c = obj["content"]
                content = c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)
            msg: dict[str, Any] = {"role": "tool", "content": content}
            pending = self._pending_calls()
            if pending:
                call = pending[0]
                msg["tool_call_id"] = call["id"]
                msg.setdefault("name", call["function"]["name"])
            if name:
                msg["name"] = name
            self.messages.append(msg)


def conversation_from_sharegpt(turns: Any, parser: Any, where: str = "conversations") -> tuple[list[dict[str, Any]], dict[int, list[ParseError]]]:
    turns = _maybe_json(turns, where)
    if not isinstance(turns, list) or not turns:
        raise RecordError(f"{where} must be a non-empty list of turns")
    b = _Builder(parser)
    for i, t in enumerate(turns):
        w = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise RecordError(f"{w} is {type(t).__name__}, not an object")
        frm = t.get("from", t.get("role"))
        role = ROLE_MAP.get(str(frm).lower()) if frm is not None else None
        if role is None:
            raise RecordError(f"{w} has unknown speaker {frm!r}")
        value = t.get("value", t.get("content"))
        if role == "assistant":
            b.assistant(value, w)
        elif role == "function_call":
            b.function_call(value, w)
        elif role == "tool":
            b.tool(value, w)
        else:
            b.messages.append({"role": role, "content": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)})
    fill_tool_message_names(b.messages)
    return b.messages, b.errors


def conversation_from_messages(msgs: Any, parser: Any, where: str = "messages") -> tuple[list[dict[str, Any]], dict[int, list[ParseError]]]:
    """HF ``messages`` rows; ``from``/``value`` keys are accepted too. Structured ``tool_calls``
    are kept (arguments decoded when they are strings); ``<tool_call>`` text is parsed."""
    from backend.importers.openai_chat import normalize_messages

    msgs = _maybe_json(msgs, where)
    if not isinstance(msgs, list) or not msgs:
        raise RecordError(f"{where} must be a non-empty list of messages")
    if all(isinstance(m, dict) and "from" in m and "role" not in m for m in msgs):
        return conversation_from_sharegpt(msgs, parser, where)
    fixed = []
    for m in msgs:
        if isinstance(m, dict):
            m = {k: _maybe_json(v, where) if k == "tool_calls" else (v.tolist() if hasattr(v, "tolist") else v) for k, v in m.items() if v is not None or k == "content"}
        fixed.append(m)
    out, errors = normalize_messages(fixed, where)
    b = _Builder(parser)
    for i, m in enumerate(out):
        if m["role"] == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str) and ("<tool_call>" in m["content"] or "<think>" in m["content"]):
            b.messages = out[:i]
            b.errors = {}
            b.assistant(m["content"], f"{where}[{i}]")
            new = b.messages[-1]
            if "reasoning_content" in m and "reasoning_content" not in new:
                new["reasoning_content"] = m["reasoning_content"]
            out[i] = new
            if b.errors.get(i):
                errors.setdefault(i, []).extend(b.errors[i])
        elif m["role"] == "tool" and isinstance(m.get("content"), str) and "<tool_response>" in m["content"]:
            trs = tool_responses_in(m["content"])
            if trs and len(trs) == 1:
                m["content"] = trs[0]
    fill_tool_message_names(out)
    return out, errors


@register
class ShareGPTImporter(Importer):
    name = "sharegpt"
    label = "ShareGPT"
    description = "ShareGPT conversations (from/value, Hermes <tool_call> text) and HF messages+tools rows (JSONL/Parquet)"

    def sniff(self, record: Any) -> bool:
        if not isinstance(record, dict):
            return False
        if "conversations" in record:
            return True
        msgs = record.get("messages")
        if isinstance(msgs, str):
            return True  # Parquet/CSV rows with JSON-string columns
        if isinstance(msgs, list):
            for m in msgs:
                if not isinstance(m, dict):
                    continue
                if "from" in m and "value" in m:
                    return True
                c = m.get("content") if "content" in m else m.get("value")
                if isinstance(c, str) and ("<tool_call>" in c or "<tool_response>" in c):
                    return True
        return False

    def convert(self, record: Any, ctx) -> list[Conversation]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        parser = ctx.parser
        if "conversations" in record:
            messages, errors = conversation_from_sharegpt(record["conversations"], parser)
        elif "messages" in record:
            messages, errors = conversation_from_messages(record["messages"], parser)
        else:
            raise RecordError("expected a 'conversations' or 'messages' field")
        check_messages(messages)
        tools_raw = _maybe_json(record.get("tools"), "tools")
        tools = normalize_tools(tools_raw, "tools")
        render_tools = True
        if not tools:
            for m in messages:
                if m["role"] == "system" and isinstance(m.get("content"), str):
                    found = tools_from_text(m["content"])
                    if found:
                        tools = found
                        render_tools = False
                    break
        meta: dict[str, Any] = {}
        for k in ("category", "subcategory", "task", "source", "dataset"):
            if isinstance(record.get(k), (str, int, float)):
                meta.setdefault("record", {})[k if k != "source" else "dataset_source"] = record[k]
        return [Conversation(messages=messages, tools=tools, metadata=meta, id=record_id(record), parse_errors=errors, render_tools=render_tools)]
