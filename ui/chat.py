"""Trace messages → ``gr.Chatbot`` messages.

Tool calls, tool results, reasoning and parse errors become collapsible assistant messages with
``metadata`` (Gradio 6). Everything from a trace is shown as literal text: prose is HTML-escaped
(the chatbot renders Markdown; escaped ``<`` shows as ``<``), JSON and raw model output go in
fenced code blocks whose fence is longer than any backtick run inside. The chatbot's own HTML
sanitiser stays on as a second line of defence.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from backend.checks.labels import termination_label
from backend.trace import Step, ToolResult, Trace
from backend.trace.model import StepState as S

# A Markdown link or image, inline (``[a](javascript:...)``) or as a reference definition
# (``[a]: data:...``), whose target has a scheme other than http(s)/mailto. The chatbot's
# sanitiser removes such a href, and the target text with it; these are shown literally instead.
_SCHEME = r"\s*(?!(?:https?|mailto):)[A-Za-z][A-Za-z0-9+.\-]*:"
_UNSAFE_INLINE_LINK = re.compile(r"\]\((?=" + _SCHEME + ")")
_UNSAFE_LINK_DEF = re.compile(r"(?m)^( {0,3})\[(?=[^\]\n]*\]:" + _SCHEME + ")")


def esc(text: Any) -> str:
    """Plain text for a Markdown message: HTML-escaped, Markdown punctuation backslashed at line
    starts only where it would change the layout (headings, lists, quotes), and links to
    anything but http(s)/mailto neutralised so they show as the text they are."""
    s = html.escape("" if text is None else str(text), quote=False)
    s = _UNSAFE_INLINE_LINK.sub("]\\(", s)
    s = _UNSAFE_LINK_DEF.sub(lambda m: m.group(1) + "\\[", s)
    return re.sub(r"(?m)^(\s*)([#>+\-*]|\d+\.)", lambda m: m.group(1) + "\\" + m.group(2), s)


def title_text(text: Any, limit: int = 120) -> str:
    """A metadata title/log: one line, no markup characters at all."""
    s = "" if text is None else str(text)
    s = " ".join(s.split())
    s = s.replace("<", "‹").replace(">", "›").replace("&", "＆").replace("`", "'")
    return s if len(s) <= limit else s[: limit - 1] + "…"


_TITLE_MD = re.compile(r"[\\*\[\]~$|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_title(text: Any, limit: int = 120) -> str:
    """A metadata title: :func:`title_text`, with the Markdown punctuation that would format
    one line (emphasis, links, strikethrough, math) backslashed: Gradio renders titles as
    Markdown, and ``[a](javascript:...)`` in a tool name would otherwise show as just ``a``.
    Underscores inside words (``get_current_temperature``) stay as they are."""
    return _TITLE_MD.sub(lambda m: "\\" + m.group(0), title_text(text, limit))


def code_block(text: Any, lang: str = "") -> str:
    s = "" if text is None else str(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{s}\n{fence}"


def _json(v: Any) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, indent=2)
    except (TypeError, ValueError):
        return str(v)


def _content_text(content: Any) -> str:
    """Message content as text (strings, or lists of {type: text} parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text", p.get("content", "")) if p.get("type", "text") == "text" else f"[{p.get('type')}]"))
            else:
                parts.append(str(p))
        return "\n".join(parts)
    return str(content)


def _call_parts(call: Any) -> tuple[str, Any, str | None]:
    if isinstance(call, dict):
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        return str(fn.get("name", "?")), fn.get("arguments", {}), call.get("id")
    return "?", call, None


def _result_by_call(trace: Trace | None) -> dict[str, tuple[Step, ToolResult]]:
    out: dict[str, tuple[Step, ToolResult]] = {}
    if trace is None:
        return out
    for s in trace.steps:
        for r in s.tool_results:
            if r.call_id:
                out[r.call_id] = (s, r)
    return out


def _step_of_message(trace: Trace | None) -> dict[int, Step]:
    out: dict[int, Step] = {}
    if trace is None:
        return out
    for s in trace.steps:
        if s.state in (S.GENERATING, S.PROCESSING_TOOLS):
            for i in s.messages_added:
                out[i] = s
    return out


def message_to_chat(
    msg: dict[str, Any], index: int, *, step: Step | None = None, result: ToolResult | None = None
) -> list[dict[str, Any]]:
    """Chatbot messages for one HF chat message (``index`` into the trace's messages)."""
    role = msg.get("role")
    content = _content_text(msg.get("content"))
    out: list[dict[str, Any]] = []
    if role == "system":
        out.append({"role": "assistant", "content": esc(content) or "(empty)",
                    "metadata": {"title": "System prompt", "status": "done", "id": f"m{index}"}})
    elif role == "user":
        out.append({"role": "user", "content": esc(content) or "(empty)"})
    elif role == "assistant":
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            out.append({"role": "assistant", "content": esc(reasoning),
                        "metadata": {"title": "Thinking", "status": "done", "id": f"m{index}r"}})
        if content.strip():
            out.append({"role": "assistant", "content": esc(content)})
        for j, call in enumerate(msg.get("tool_calls") or []):
            name, args, cid = _call_parts(call)
            meta: dict[str, Any] = {"title": f"Tool call · {md_title(name, 60)}", "status": "done", "id": f"m{index}c{j}"}
            if cid:
                meta["log"] = title_text(cid, 40)
            out.append({"role": "assistant", "content": code_block(_json({"name": name, "arguments": args}), "json"), "metadata": meta})
        if step is not None:
            for j, err in enumerate(step.parse_errors):
                body = esc(err.message)
                if err.raw:
                    body += "\n\n" + code_block(err.raw)
                title = "Repaired tool call (kept)" if getattr(err, "severity", "error") == "warning" else "Malformed tool call"
                out.append({"role": "assistant", "content": body,
                            "metadata": {"title": title, "status": "done", "id": f"m{index}e{j}"}})
            for j, cut in enumerate(_cut_calls(step)):
                # a call Stop (or the time limit) cut while the model wrote it: not a malformed one
                out.append({"role": "assistant", "content": "The turn was stopped while the model was writing this call; "
                            "it was not run.\n\n" + code_block(cut.get("raw") or ""),
                            "metadata": {"title": "Unfinished tool call · stopped, not run", "status": "done",
                                         "id": f"m{index}u{j}"}})
            if step.error:
                out.append({"role": "assistant", "content": esc(step.error),
                            "metadata": {"title": "Generation error", "status": "done", "id": f"m{index}g"}})
        if not out:
            out.append({"role": "assistant", "content": "*(empty turn)*"})
    elif role == "tool":
        name = msg.get("name") or (result.name if result else "tool")
        meta = {"title": f"Tool result · {md_title(name, 60)}", "status": "done", "id": f"m{index}"}
        logs = []
        if result is not None:
            meta["duration"] = round(float(result.duration_s), 3)
            if not result.ok:
                logs.append(f"error: {result.error}")
            if result.truncated:
                logs.append(f"truncated from {result.original_length} chars")
        if logs:
            meta["log"] = title_text("; ".join(logs), 80)
        out.append({"role": "assistant", "content": code_block(content), "metadata": meta})
    else:
        out.append({"role": "assistant", "content": esc(content),
                    "metadata": {"title": f"{md_title(role, 30)} message", "status": "done", "id": f"m{index}"}})
    return out


def trace_to_chat(trace: Trace | None) -> list[dict[str, Any]]:
    if trace is None:
        return []
    results = _result_by_call(trace)
    steps = _step_of_message(trace)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(trace.messages):
        if not isinstance(m, dict):
            continue
        res = results.get(m.get("tool_call_id") or "", (None, None))[1] if m.get("role") == "tool" else None
        out.extend(message_to_chat(m, i, step=steps.get(i), result=res))
    # steps that added no message (a failed generation, a dropped tool turn) still deserve a line
    for s in trace.steps:
        if s.state == S.PROCESSING_TOOLS and not s.messages_added and s.info.not_appended:
            out.append({"role": "assistant", "content": esc(s.info.not_appended),
                        "metadata": {"title": "Tool turn not appended", "status": "done", "id": f"s{s.index}"}})
        if s.state == S.PENDING and s.error:  # the prompt did not render (a template error, with its line)
            out.append({"role": "assistant", "content": esc(s.error),
                        "metadata": {"title": "Template error", "status": "done", "id": f"s{s.index}"}})
        if s.state == S.GENERATING and not s.messages_added and s.error:
            out.append({"role": "assistant", "content": esc(s.error),
                        "metadata": {"title": "Generation error", "status": "done", "id": f"s{s.index}"}})
    if trace.termination_reason:
        label = termination_label(trace.termination_reason)  # "answered (no_tool_calls)": words, then verl's code
        out.append({"role": "assistant", "content": f"Run ended: **{esc(label)}**",
                    "metadata": {"title": f"Run ended · {md_title(label, 80)}", "status": "done", "id": "end"}})
    return out


def _cut_calls(step: Step) -> list[dict[str, Any]]:
    """The unfinished tool call(s) of a turn cut by Stop / the time limit (``info.cut_tool_call``,
    recorded by the engine)."""
    cut = step.info.cut_tool_call
    return [c for c in cut if isinstance(c, dict)] if isinstance(cut, list) else []


def pending_message(text: str, state: str = S.GENERATING) -> dict[str, Any]:
    """The streaming view of the turn being generated: the raw model output so far."""
    return {"role": "assistant", "content": code_block(text or " "),
            "metadata": {"title": "generating…" if state == S.GENERATING else f"{state}…", "status": "pending", "id": "live"}}
