"""Export traces as OpenTelemetry GenAI spans in OTLP JSON (``python -m backend export --to otel``).

The spans follow the GenAI semantic conventions as they stand now (the experimental ones an
instrumentation emits under ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``), so a
Playground run, a rollout shard or a filtered set opens in Phoenix, Langfuse or Jaeger, or any
OTLP collector. Per trace:

* one root ``invoke_agent {agent}: {label}`` span (INTERNAL), the label telling runs apart in
  a trace list: the trace's ``metadata.title`` (an import's ``trace_name``), else the question
  it answered (60 characters at most), else its id. ``gen_ai.agent.name`` (the trace's
  ``metadata.agent_name`` / ``agent`` where it names one, else ``agent-loop``), the trace's id
  (``agent_loop_inspector.trace_id``), termination reason (status ERROR for a failure, its
  message the error the run ended on), tokenizer, the model (see below); the agent's input
  messages (those the run started from, as the model was shown them: reasoning the prompt did
  not hold is left out, and ``agent_loop_inspector.input.reasoning_not_shown`` /
  ``..._text`` give those messages' indices and that reasoning, which the ``otel`` import puts
  back), its last generated message, the system instructions and tool definitions (a trace with
  no generated turn: all its messages); and the summary a trace list shows (OpenInference's
  ``input.value`` / ``output.value``, which Phoenix reads, ``text/plain``): the last user
  message the run started from, and its output — every run has one: the text of its final
  answer, else (a failed run) the error it ended on (``"malformed tool call
  (malformed_tool_call): …"``), else how it ended and the last turn's calls;
* one ``chat {model}`` span (CLIENT) per generating step: ``gen_ai.input.messages`` (the
  conversation before the step, as the model was shown it: an earlier turn's reasoning that
  the rendered prompt does not hold — a template that drops it — is left out, and
  ``agent_loop_inspector.input.reasoning_not_shown`` lists those messages' indices),
  ``gen_ai.output.messages`` (the step's assistant message with its ``finish_reason``),
  ``gen_ai.system_instructions`` (the leading system message(s), not repeated in the input
  messages), ``gen_ai.tool.definitions``, token usage from the trace's token positions (input =
  the tokens before the step, output = the tokens it generated; also as OpenInference's
  ``llm.token_count.prompt`` / ``completion`` / ``total``), the finish reason; what a viewer's
  span table shows (``input.value``: the messages as the model was shown them, as JSON in the
  trace's own message shape, system prompt included, ``application/json``; ``output.value``:
  the text the step generated, token for token as decoded — a malformed call's text is where its
  parse error points); status ERROR with ``error.type`` for a generation error, and for a tool
  call the parser could not read (``malformed_tool_call``, each parse error also an event); the
  message attributes are JSON strings, as the conventions allow on spans and as the viewers
  read them;
* one ``execute_tool {name}`` span (INTERNAL) per tool call a tools step ran: name, call id,
  arguments, result (also as ``input.value`` / ``output.value``, ``application/json`` where
  they are a JSON object or array, else ``text/plain``); status ERROR with ``error.type`` when
  the tool failed.

The model (``gen_ai.request.model``, ``gen_ai.response.model``, and OpenInference's
``llm.model_name`` on chat spans: Phoenix's model and cost columns): ``metadata.generator.model``,
else ``metadata.model`` (what importers record), else a step's ``info.model``; a run that names
none (the scripted backend's) gets the tokenizer its ids are of (a profile name or hub id; a
local folder's last part) and ``agent_loop_inspector.model_source = "tokenizer"``, which the
``otel`` import does not take for a model.

Every span is a child of the root and carries ``gen_ai.conversation.id``: the conversation the
run was a turn of (``metadata.conversation_id``, which the engine records from its
``conversation_key``: a Playground chat's turns share it), else a conversation / session /
thread id an import carried, else the trace's id. Times are the steps' recorded
``started_at`` / ``duration_s``. A trace that did not record them, or whose
``metadata.timings`` says they are made up (the samples'), gets synthetic times, and every one
of its spans says so (``agent_loop_inspector.synthetic_time = true``): the first such trace of
an export starts at the export's ``synthetic_start`` (Unix seconds; by default one hour before
the export, so a viewer's "last 7 days" shows it and an export of up to an hour of synthetic time
(3.6 M tokens) stays in the past), each next one 1 ms after the previous one
ends (turn 2 after turn 1); made-up recorded times keep their durations, a trace without any
lasts 1 ms per token. Ids are derived from the trace id: a SHA-256 of it, never all-zero; a
trace id met again in one export gets ids of its own. Exporting twice with the same
``synthetic_start`` writes the same bytes.

OTLP/JSON encoding (the protocol's JSON mapping): lowerCamelCase keys, ``traceId`` / ``spanId``
as lowercase hex (not base64), 64-bit integers as decimal strings (``startTimeUnixNano``,
``intValue``), AnyValue wrappers, ``kind`` and ``status.code`` as enum numbers.

* :func:`traces_to_otlp` — one ``ExportTraceServiceRequest`` object for all the traces.
* :func:`write_otlp_jsonl` — the collector file exporter's layout: one request per line, one
  trace per line, written as the traces come (an iterator is never held whole).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from backend.trace import StepState, Trace, write_lines
from backend.trace.model import TerminationReason

SCOPE_NAME = "agent_loop_inspector"
DEFAULT_SERVICE_NAME = "agent-loop-inspector"

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_CODE_ERROR = 2

# Synthetic times (a trace that recorded no step times, or whose metadata.timings says its times
# are synthetic, as the samples' do): the first such trace of an export starts at the export's
# anchor (its ``synthetic_start``, by default SYNTHETIC_LEAD_S before the export), each next one 1 ms after
# the previous one ends; synthetic steps last 1 ms per token (at least 1 ms)
_SYNTHETIC_NS_PER_TOKEN = 1_000_000
# how far before the export the default anchor sits: the traces laid out from it end before the
# export's moment unless they hold more than an hour of synthetic time (a viewer's time window
# ends at "now" and would hide spans dated in the future)
SYNTHETIC_LEAD_S = 3600.0
_SYNTHETIC_GAP_NS = 1_000_000
DEFAULT_AGENT_NAME = "agent-loop"

# generator backend (metadata.generator.backend) → gen_ai.provider.name
_PROVIDERS = {"vllm": "vllm", "vllm-server": "vllm", "transformers": "transformers", "scripted": "scripted"}
# LoopConfig.sampling key → gen_ai.request.* attribute
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}


@lru_cache(maxsize=1)
def scope_version() -> str | None:
    """The project's version (the installed distribution's, else ``pyproject.toml``'s)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("agent-loop-inspector")
    except PackageNotFoundError:
        pass
    except Exception:  # pragma: no cover - a broken metadata install
        pass
    try:
        import tomllib

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "pyproject.toml"), "rb") as f:
            v = tomllib.load(f).get("project", {}).get("version")
        return v if isinstance(v, str) else None
    except (OSError, ValueError):
        return None


# ---- OTLP JSON values ---------------------------------------------------------------------------


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def any_value(v: Any) -> dict[str, Any]:
    """A Python value as an OTLP ``AnyValue`` (JSON mapping)."""
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if math.isfinite(v):
            return {"doubleValue": v}
        return {"doubleValue": "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": str(k), "value": any_value(x)} for k, x in v.items()]}}
    if v is None:
        return {}
    return {"stringValue": str(v)}


def _attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in attrs.items() if v is not None]


def _ns(t: float) -> int:
    # unix seconds → ns, to the microsecond: a float of ~1.7e9 s holds no finer time, and the
    # product in ns (1.7e18) is past 2**53, where the float's own digits would show
    return round(t * 1_000_000) * 1000


def _dur_ns(s: float | None) -> int:
    return max(0, round(s * 1e9)) if isinstance(s, (int, float)) and math.isfinite(s) else 0


# ---- ids ----------------------------------------------------------------------------------------


class _Ids:
    """What one export keeps across its traces. Ids: derived from the trace id; a trace id met
    again in the same export is told apart by its occurrence number (kept: one string per trace).
    Synthetic times: ``cursor_ns``, where the next trace with synthetic times starts (the
    export's anchor at first, then the end of the previous such trace plus a millisecond)."""

    def __init__(self, synthetic_start: float | None = None) -> None:
        self._seen: dict[str, int] = {}
        start = synthetic_start if synthetic_start is not None else time.time() - SYNTHETIC_LEAD_S
        if not isinstance(start, (int, float)) or isinstance(start, bool) or not math.isfinite(start) or start < 0:
            raise ValueError(f"synthetic_start must be a time in Unix seconds (a finite number ≥ 0), not {synthetic_start!r}")
        self.cursor_ns = _ns(float(start))

    def trace_key(self, trace_id: str) -> str:
        k = self._seen.get(trace_id, 0)
        self._seen[trace_id] = k + 1
        return trace_id if k == 0 else f"{trace_id}\x00{k}"


def _digest(data: str, n: int) -> str:
    b = hashlib.sha256(data.encode("utf-8")).digest()[:n]
    if not any(b):  # an all-zero id is invalid in OTLP
        b = b[:-1] + b"\x01"
    return b.hex()


def otel_trace_id(key: str) -> str:
    """The 16-byte OTel trace id (32 hex digits) of a trace id."""
    return _digest("agent-loop-inspector/trace\x00" + key, 16)


def _span_id(key: str, label: str) -> str:
    return _digest(f"agent-loop-inspector/span\x00{key}\x00{label}", 8)


# ---- messages in the GenAI conventions' JSON shape ----------------------------------------------


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append({"type": "text", "content": p})
            elif isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append({"type": "text", "content": p["text"]})
            elif isinstance(p, dict) and p.get("type") == "image_url":
                url = p.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                parts.append({"type": "uri", "modality": "image", "uri": url})
            elif isinstance(p, dict) and isinstance(p.get("type"), str):
                parts.append(dict(p))  # a generic part: its own type and fields
            else:
                parts.append({"type": "text", "content": _dumps(p)})
        return parts
    return [{"type": "text", "content": _dumps(content)}]


def _tool_call_part(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    fn = fn if isinstance(fn, dict) else (call if isinstance(call, dict) else {})
    part: dict[str, Any] = {"type": "tool_call"}
    if isinstance(call, dict) and call.get("id") is not None:
        part["id"] = call["id"]
    part["name"] = fn.get("name")
    part["arguments"] = fn.get("arguments")
    return part


def genai_message(m: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One chat message (HF / OpenAI shape) as a GenAI ``{"role", "parts": [...]}`` message."""
    role = m.get("role")
    parts: list[dict[str, Any]] = []
    for key in ("reasoning_content", "reasoning", "thinking"):
        r = m.get(key)
        if isinstance(r, str) and r:
            parts.append({"type": "reasoning", "content": r})
            break
    if role == "tool":
        c = m.get("content")
        resp: dict[str, Any] = {"type": "tool_call_response"}
        if m.get("tool_call_id") is not None:
            resp["id"] = m["tool_call_id"]
        resp["response"] = c if isinstance(c, str) or c is None else (
            "".join(p.get("content", "") for p in _content_parts(c) if p.get("type") == "text"))
        parts.append(resp)
    else:
        parts += _content_parts(m.get("content"))
    for call in m.get("tool_calls") or []:
        parts.append(_tool_call_part(call))
    if not parts:  # an empty turn stays a message with its (empty) text
        parts.append({"type": "text", "content": ""})
    out: dict[str, Any] = {"role": role, "parts": parts}
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if finish_reason is not None:
        out["finish_reason"] = finish_reason
    return out


def genai_tool_definition(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool schema (``{"type": "function", "function": {...}}``) in the conventions'
    flat shape (``{"type": "function", "name", "description", "parameters"}``)."""
    fn = tool.get("function")
    if not isinstance(fn, dict):
        return {k: v for k, v in tool.items() if k != "mock"}
    d: dict[str, Any] = {"type": tool.get("type", "function")}
    d.update(fn)
    return d


def _finish_reason(step: Any) -> str:
    fr = step.finish_reason
    if fr == "stop" and step.tool_calls:
        return "tool_call"
    if fr:
        return fr
    return "error" if step.error else ("tool_call" if step.tool_calls else "stop")


# ---- one trace → its spans ----------------------------------------------------------------------


def _timed(t: Trace) -> bool:
    return all(s.started_at is not None and math.isfinite(s.started_at) for s in t.steps
               if s.state in (StepState.GENERATING, StepState.PROCESSING_TOOLS))


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _declared_synthetic(t: Trace) -> bool:
    """The trace's ``metadata.timings`` says its recorded times are made up (the samples')."""
    v = t.metadata.get("timings") if isinstance(t.metadata, dict) else None
    return isinstance(v, str) and v.lstrip().lower().startswith("synthetic")


def _step_times(t: Trace, cursor_ns: int) -> tuple[list[tuple[int, int]], bool]:
    """``([(start_ns, end_ns) per step], synthetic)``; a tools step lasts at least as long as
    its longest call. Recorded times are kept; times the trace declares synthetic keep their
    durations and gaps but start at ``cursor_ns``; a trace without times gets synthetic ones from
    its recorded start (``metadata.started_at``), else from ``cursor_ns``."""
    out: list[tuple[int, int]] = []
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    declared = _declared_synthetic(t)
    if t.steps and _timed(t):
        for s in t.steps:
            if s.started_at is None or not math.isfinite(s.started_at):
                out.append((-1, -1))  # a pending / terminated step without a time: no span of its own
                continue
            a = _ns(s.started_at)
            d = max([_dur_ns(s.duration_s)] + [_dur_ns(r.duration_s) for r in s.tool_results])
            out.append((a, a + d))
        if not declared:
            return out, False
        shift = cursor_ns - min((a for a, _ in out if a >= 0), default=cursor_ns)
        return [(a + shift, b + shift) if a >= 0 else (a, b) for a, b in out], True
    started = None if declared else _number(meta.get("started_at"))
    cursor = _ns(started) if started is not None else cursor_ns
    for s in t.steps:
        if s.state in (StepState.GENERATING, StepState.PROCESSING_TOOLS):
            d = max([_dur_ns(s.duration_s), max(1, s.end - s.start) * _SYNTHETIC_NS_PER_TOKEN]
                    + [_dur_ns(r.duration_s) for r in s.tool_results])
        else:
            d = _dur_ns(s.duration_s)
        out.append((cursor, cursor + d))
        cursor += d
    return out, True


def _span(trace_hex: str, span_hex: str, parent_hex: str | None, name: str, kind: int, start: int, end: int,
          attrs: dict[str, Any], *, error: str | None = None, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    sp: dict[str, Any] = {"traceId": trace_hex, "spanId": span_hex}
    if parent_hex:
        sp["parentSpanId"] = parent_hex
    sp.update({"name": name, "kind": kind, "startTimeUnixNano": str(start), "endTimeUnixNano": str(max(start, end)),
               "attributes": _attributes(attrs)})
    if events:
        sp["events"] = events
    if error is not None:
        sp["status"] = {"code": STATUS_CODE_ERROR, "message": error}
    return sp


_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def _reasoning_of(m: Any) -> str | None:
    if not isinstance(m, dict):
        return None
    return next((m[k] for k in _REASONING_KEYS if isinstance(m.get(k), str) and m[k]), None)


def _without_reasoning(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k not in _REASONING_KEYS}


def unshown_reasoning(t: Trace) -> list[int]:
    """The messages whose reasoning the model was not shown: messages rendered into the run's
    prompt (the pending step's ``messages_added``; its ``text`` is the rendered prompt) whose
    reasoning that text does not hold — a template that drops earlier turns' reasoning, as
    Qwen3's does before the last user message. A trace that did not record its prompt text
    gives none (nothing to tell; the reasoning is kept). The turns the run generated were in
    the token stream as generated, reasoning included."""
    out: list[int] = []
    for s in t.steps:
        if s.state != StepState.PENDING or not isinstance(s.text, str) or not s.text:
            continue
        for i in s.messages_added:
            if 0 <= i < len(t.messages) and isinstance(t.messages[i], dict) and t.messages[i].get("role") == "assistant":
                r = _reasoning_of(t.messages[i])
                if r and r.strip() and r.strip() not in s.text:
                    out.append(i)
    return sorted(set(out))


def _str(d: dict[str, Any], *keys: str) -> str | None:
    return next((d[k].strip() for k in keys if isinstance(d.get(k), str) and d[k].strip()), None)


def conversation_id(t: Trace) -> str:
    """The conversation a trace belongs to (``gen_ai.conversation.id``): the one the run
    recorded (``metadata.conversation_id``: the turns of one Playground chat share it), else an
    id the import carried (a conversation, session or thread id), else the trace's own id."""
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    prov = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    keys = ("conversation_id", "session_id", "thread_id")
    return _str(meta, *keys) or _str(prov, *keys) or t.id


def agent_name(t: Trace) -> str:
    """The agent's name (``gen_ai.agent.name``): the trace's metadata where it names one
    (``agent_name``, ``agent``, also in ``provenance``), else :data:`DEFAULT_AGENT_NAME`."""
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    prov = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    return _str(meta, "agent_name", "agent") or _str(prov, "agent_name", "agent") or DEFAULT_AGENT_NAME


def _plain_text(m: Any) -> str | None:
    """A message's text (its text parts joined), None when it has none."""
    if not isinstance(m, dict):
        return None
    text = "".join(p.get("content") or "" for p in _content_parts(m.get("content")) if p.get("type") == "text")
    return text if text.strip() else None


def _mime(text: str) -> str:
    """``application/json`` for text that is a JSON object or array (a viewer shows it as a tree),
    else ``text/plain``."""
    t = text.lstrip()
    if t[:1] in ("{", "["):
        try:
            json.loads(text)
            return "application/json"
        except (ValueError, RecursionError):
            pass
    return "text/plain"


def _value_attrs(kind: str, text: Any, mime: str | None = None) -> dict[str, Any]:
    """OpenInference's ``{kind}.value`` / ``{kind}.mime_type`` for a text (none for no text)."""
    if not isinstance(text, str):
        return {}
    return {f"{kind}.value": text, f"{kind}.mime_type": mime or _mime(text)}


def model_of(t: Trace) -> tuple[str | None, str | None]:
    """``(model, where from)``: the model the run called (``metadata.generator.model``, else
    ``metadata.model`` — what importers record —, else a generating step's ``info.model``), where
    from None; else — a run with no model of its own, the scripted backend's — the tokenizer the
    trace's ids are of (its profile or hub id; a local path's last part), ``"tokenizer"``."""
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    gen = meta.get("generator") if isinstance(meta.get("generator"), dict) else {}
    if isinstance(gen.get("model"), str) and gen["model"].strip():
        return gen["model"], None
    m = _str(meta, "model")
    if m:
        return m, None
    for s in t.steps:
        m = getattr(s.info, "model", None)
        if s.state == StepState.GENERATING and isinstance(m, str) and m.strip():
            return m, None
    name = t.tokenizer.name if isinstance(t.tokenizer.name, str) else ""
    name = name.strip().rstrip("/\\")
    if name.startswith(("/", ".", "~")) or "\\" in name or os.path.isabs(name):
        name = os.path.basename(name.replace("\\", "/"))
    return (name, "tokenizer") if name else (None, None)


_NAME_CHARS = 60  # of a question or title in the root span's name


def _short(text: str, n: int = _NAME_CHARS) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1].rstrip() + "…"


def run_label(t: Trace, question: str | None) -> str:
    """What tells a run apart in a trace list (the root span's name after the agent's): the
    run's own title where it has one (``metadata.title``, an import's ``trace_name``), else the
    question it answered, else its id."""
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    title = _str(meta, "title", "trace_name")
    if title:
        return _short(title)
    if question:
        return _short(question)
    return t.id


def _call_text(call: Any) -> str:
    args = call.arguments if isinstance(call.arguments, str) else _dumps(call.arguments)
    return f"{call.name}({args})"


def trace_spans(t: Trace, ids: _Ids | None = None) -> list[dict[str, Any]]:
    """The OTLP JSON spans of one trace: the root ``invoke_agent`` span first, then its
    ``chat`` and ``execute_tool`` children in step order."""
    ids = ids or _Ids()
    key = ids.trace_key(t.id)
    tid = otel_trace_id(key)
    root_id = _span_id(key, "root")
    meta = t.metadata if isinstance(t.metadata, dict) else {}
    gen = meta.get("generator") if isinstance(meta.get("generator"), dict) else {}
    model, model_from = model_of(t)
    provider = meta.get("provider") if isinstance(meta.get("provider"), str) else _PROVIDERS.get(gen.get("backend"))
    has_tokens = bool(t.prompt_ids or t.response_ids)
    times, synthetic = _step_times(t, ids.cursor_ns)
    common: dict[str, Any] = {"gen_ai.provider.name": provider, "gen_ai.conversation.id": conversation_id(t)}
    if synthetic:
        common["agent_loop_inspector.synthetic_time"] = True
    sampling = t.config.get("sampling") if isinstance(t.config.get("sampling"), dict) else {}
    request_attrs = {f"gen_ai.request.{v}": sampling[k] for k, v in _SAMPLING.items()
                     if isinstance(sampling.get(k), (int, float)) and not isinstance(sampling.get(k), bool)}

    # the messages once each, as JSON; leading system messages are the system instructions
    msgs = [genai_message(m) if isinstance(m, dict) else {"role": None, "parts": []} for m in t.messages]
    n_sys = 0
    while n_sys < len(t.messages) and isinstance(t.messages[n_sys], dict) and t.messages[n_sys].get("role") == "system":
        n_sys += 1
    # what the model was shown: reasoning its rendered prompt does not hold is left out of every
    # span's input (the root names it, with its text, for the otel import to put back)
    unshown = unshown_reasoning(t)
    shown_json = [_dumps(m) for m in msgs]
    for i in unshown:
        shown_json[i] = _dumps(genai_message(_without_reasoning(t.messages[i])))
    # the same messages in the trace's own (OpenAI / HF) shape: a chat span's input.value
    unshown_set = set(unshown)
    shown_raw = [_dumps(_without_reasoning(m) if i in unshown_set else m) if isinstance(m, dict) else "null"
                 for i, m in enumerate(t.messages)]
    system_json = _dumps([p for m in msgs[:n_sys] for p in m["parts"]]) if n_sys else None
    tools_json = _dumps([genai_tool_definition(x) for x in t.tools if isinstance(x, dict)]) if t.tools else None
    tool_desc = {}
    for x in t.tools:
        fn = x.get("function") if isinstance(x, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("description"), str):
            tool_desc[fn["name"]] = fn["description"]

    children: list[dict[str, Any]] = []
    calls_by_id: dict[str, Any] = {}
    last_calls: list[Any] = []
    known = 0  # messages the trace had before the current step
    first_upto: int | None = None  # the messages the run started from (before its first turn)
    last_out: list[dict[str, Any]] = []  # the run's last generated message
    last_out_msg: Any = None
    last_calls_made: list[Any] = []  # the tool calls of the run's last generated turn
    failures: list[str] = []  # what went wrong, in step order (the last one ended a failed run)
    for s, (a, b) in zip(t.steps, times):
        if s.error and s.state != StepState.GENERATING:
            failures.append(s.error)
        if s.state == StepState.GENERATING:
            upto = min(s.messages_added) if s.messages_added else known
            upto = max(n_sys, min(upto, len(msgs)))
            if first_upto is None:
                first_upto = upto
            fr = _finish_reason(s)
            added = [t.messages[i] for i in s.messages_added if 0 <= i < len(t.messages) and isinstance(t.messages[i], dict)]
            out_msgs = [genai_message(m, fr) for m in added]
            if out_msgs:
                last_out, last_out_msg = out_msgs[-1:], added[-1]
            response_model = s.info.model if isinstance(getattr(s.info, "model", None), str) else model
            attrs = {
                "gen_ai.operation.name": "chat",
                "openinference.span.kind": "LLM",  # what Phoenix files the span under
                **common,
                "gen_ai.request.model": model,
                "gen_ai.response.model": response_model,
                "llm.model_name": response_model,  # OpenInference's: Phoenix's model and cost columns
                **request_attrs,
                "gen_ai.request.max_tokens": s.info.max_tokens,
                "gen_ai.response.finish_reasons": [fr],
            }
            if has_tokens:
                attrs["gen_ai.usage.input_tokens"] = s.start
                attrs["gen_ai.usage.output_tokens"] = s.end - s.start
                attrs["llm.token_count.prompt"] = s.start
                attrs["llm.token_count.completion"] = s.end - s.start
                attrs["llm.token_count.total"] = s.end
            # what viewers show as the span's input and output (OpenInference's input.value /
            # output.value): the messages as the model was shown them, and the text it generated
            # (a malformed call's text included: where its parse error points)
            generated = s.text if isinstance(s.text, str) and s.text else (_plain_text(added[-1]) if added else None)
            hidden = [i for i in unshown if n_sys <= i < upto]
            attrs.update({
                "gen_ai.system_instructions": system_json,
                "gen_ai.input.messages": "[" + ",".join(shown_json[n_sys:upto]) + "]",
                "gen_ai.output.messages": _dumps(out_msgs),
                "gen_ai.tool.definitions": tools_json,
                "agent_loop_inspector.step": s.index,
                "agent_loop_inspector.token_span": [s.start, s.end] if has_tokens else None,
                # the trace's message indices whose reasoning the prompt did not show (left out above)
                "agent_loop_inspector.input.reasoning_not_shown": hidden or None,
                **_value_attrs("input", "[" + ",".join(shown_raw[:upto]) + "]", "application/json"),
                **_value_attrs("output", generated, "text/plain"),
                "agent_loop_inspector.model_source": model_from,
            })
            error = s.error or None
            malformed = [e for e in s.parse_errors if e.severity == "error"]
            if s.error:
                attrs["error.type"] = "generation_error"
            elif malformed:  # a tool call the parser could not read: this call is where the run failed
                attrs["error.type"] = str(TerminationReason.MALFORMED_TOOL_CALL)
                error = f"malformed tool call: {malformed[0].message}" + (
                    f" (and {len(malformed) - 1} more)" if len(malformed) > 1 else "")
            if error:
                failures.append(error)
            events = [{"timeUnixNano": str(b), "name": "agent_loop_inspector.parse_error",
                       "attributes": _attributes({"message": e.message, "severity": e.severity, "raw": e.raw})}
                      for e in s.parse_errors]
            name = f"chat {response_model or model}" if (response_model or model) else "chat"
            children.append(_span(tid, _span_id(key, f"step/{s.index}"), root_id, name, SPAN_KIND_CLIENT, a, b, attrs,
                                  error=error, events=events))
            for c in s.tool_calls:
                if c.id is not None:
                    calls_by_id[c.id] = c
            last_calls = list(s.tool_calls)
            last_calls_made = list(s.tool_calls)
        elif s.state == StepState.PROCESSING_TOOLS:
            for j, r in enumerate(s.tool_results):
                call = calls_by_id.get(r.call_id) if r.call_id is not None else None
                if call is None and r.call_id is None and j < len(last_calls):
                    call = last_calls[j]  # results answer the calls in order
                args = None
                if call is not None:
                    args = call.arguments if isinstance(call.arguments, str) else _dumps(call.arguments)
                name = r.name or (call.name if call is not None else "") or "tool"
                attrs = {
                    "gen_ai.operation.name": "execute_tool",
                    "openinference.span.kind": "TOOL",  # what Phoenix files the span under
                    **common,
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.id": r.call_id,
                    "gen_ai.tool.description": tool_desc.get(name),
                    "gen_ai.tool.call.arguments": args,
                    "gen_ai.tool.call.result": r.content,
                    # what viewers show as the span's input and output: the arguments, the result
                    **_value_attrs("input", args),
                    **_value_attrs("output", r.content),
                    "agent_loop_inspector.step": s.index,
                }
                if r.truncated:
                    attrs["agent_loop_inspector.tool.truncated"] = True
                    attrs["agent_loop_inspector.tool.original_length"] = r.original_length
                if s.info.not_appended:
                    attrs["agent_loop_inspector.tool.not_appended"] = s.info.not_appended
                err = None
                if not r.ok:
                    attrs["error.type"] = r.error or "tool_error"
                    err = r.error_detail or r.error or "tool error"
                    failures.append(f"tool {name}: {err}")
                d = _dur_ns(r.duration_s) or (b - a if synthetic else 0)
                children.append(_span(tid, _span_id(key, f"step/{s.index}/tool/{j}"), root_id, f"execute_tool {name}",
                                      SPAN_KIND_INTERNAL, a, a + d, attrs, error=err))
        if s.messages_added:
            known = max(known, max(s.messages_added) + 1)

    # the root spans the run: its recorded start and duration, and every child
    starts = [a for a, _ in times if a >= 0]
    ends = [b for _, b in times if b >= 0] + [int(c["endTimeUnixNano"]) for c in children]
    started = _number(meta.get("started_at"))
    root_start = _ns(started) if started is not None and not synthetic else (min(starts) if starts else ids.cursor_ns)
    if starts:
        root_start = min(root_start, min(starts))
    root_end = max([root_start] + ends)
    dur = _number(meta.get("duration_s"))
    if dur is not None and not synthetic:
        root_end = max(root_end, root_start + _dur_ns(dur))
    if synthetic:  # the next trace with synthetic times starts after this one
        ids.cursor_ns = max(ids.cursor_ns, root_end + _SYNTHETIC_GAP_NS)
    reason = t.termination_reason
    if isinstance(reason, str) and not isinstance(reason, TerminationReason) and reason in TerminationReason._value2member_map_:
        reason = TerminationReason(reason)  # set as a plain string (not through the model's validation)
    outcome = reason.outcome if isinstance(reason, TerminationReason) else None
    # the summary viewers show in a trace list (OpenInference's input.value / output.value,
    # which Phoenix reads): the user's question the run answered and its final answer's text
    inputs = t.messages[:len(t.messages) if first_upto is None else first_upto]
    question = next((_plain_text(m) for m in reversed(inputs) if isinstance(m, dict) and m.get("role") == "user"), None)
    answer = _plain_text(last_out_msg)
    agent = agent_name(t)
    # every run has an output: its answer, else (a failure) the error it ended on, else how it ended
    error = None
    if outcome == "failure":
        detail = failures[-1] if failures else _str(meta, "error")
        error = f"{reason.words} ({reason})" + (f": {detail}" if detail else "")
        result = error
    elif answer is not None:
        result = answer
    else:
        how = f"{reason.words} ({reason})" if isinstance(reason, TerminationReason) else (str(reason) if reason else "ended")
        calls = "; ".join(_call_text(c) for c in last_calls_made)
        result = f"{how}; the last turn called {calls}" if calls else f"{how} without an answer"
    root_in = n_sys, (len(msgs) if first_upto is None else first_upto)
    hidden_root = [i for i in unshown if root_in[0] <= i < root_in[1]]
    root_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "openinference.span.kind": "AGENT",  # what Phoenix files the span under
        **common,
        "gen_ai.agent.name": agent,
        "gen_ai.request.model": model,
        **_value_attrs("input", question, "text/plain"),
        **_value_attrs("output", result, "text/plain"),
        "agent_loop_inspector.trace_id": t.id,
        "agent_loop_inspector.termination_reason": str(reason) if reason is not None else None,
        "agent_loop_inspector.outcome": outcome,
        "agent_loop_inspector.tokenizer": t.tokenizer.name,
        "agent_loop_inspector.template": t.tokenizer.template,
        "agent_loop_inspector.source": meta.get("source") if isinstance(meta.get("source"), str) else None,
        "agent_loop_inspector.prompt_tokens": len(t.prompt_ids) if has_tokens else None,
        "agent_loop_inspector.response_tokens": len(t.response_ids) if has_tokens else None,
        # the agent's input (the messages the run started from, as the model was shown them) and
        # its last answer; a trace with no generated turn keeps its whole conversation here
        "gen_ai.system_instructions": system_json,
        "gen_ai.input.messages": "[" + ",".join(shown_json[root_in[0]:root_in[1]]) + "]",
        "gen_ai.output.messages": _dumps(last_out) if last_out else None,
        "gen_ai.tool.definitions": tools_json,
        # the reasoning left out of the input above (the model was not shown it): which messages,
        # and its text (for the otel import to put back)
        "agent_loop_inspector.input.reasoning_not_shown": hidden_root or None,
        "agent_loop_inspector.input.reasoning_not_shown_text": [_reasoning_of(t.messages[i]) or "" for i in hidden_root] or None,
        "agent_loop_inspector.model_source": model_from,
    }
    if error is not None:
        root_attrs["error.type"] = str(reason)
    name = f"invoke_agent {agent}: {run_label(t, question)}"
    root = _span(tid, root_id, None, name, SPAN_KIND_INTERNAL, root_start, root_end, root_attrs, error=error)
    return [root, *children]


def _request(spans: list[dict[str, Any]], service_name: str) -> dict[str, Any]:
    scope: dict[str, Any] = {"name": SCOPE_NAME}
    v = scope_version()
    if v:
        scope["version"] = v
    return {"resourceSpans": [{
        "resource": {"attributes": _attributes({"service.name": service_name})},
        "scopeSpans": [{"scope": scope, "spans": spans}],
    }]}


def traces_to_otlp(traces: Iterable[Trace], *, service_name: str = DEFAULT_SERVICE_NAME,
                   synthetic_start: float | None = None) -> dict[str, Any]:
    """One OTLP ``ExportTraceServiceRequest`` (JSON mapping) holding the spans of every trace.
    ``synthetic_start`` (Unix seconds): where synthetic times begin, by default an hour before now."""
    ids = _Ids(synthetic_start)
    spans: list[dict[str, Any]] = []
    for t in traces:
        spans += trace_spans(t, ids)
    return _request(spans, service_name)


def otlp_lines(traces: Iterable[Trace], *, service_name: str = DEFAULT_SERVICE_NAME,
               synthetic_start: float | None = None) -> Iterator[str]:
    """One request per trace, as JSON lines (lazy: a trace at a time)."""
    ids = _Ids(synthetic_start)
    for t in traces:
        yield _dumps(_request(trace_spans(t, ids), service_name))


def write_otlp_jsonl(traces: Iterable[Trace], path: str, *, service_name: str = DEFAULT_SERVICE_NAME,
                     synthetic_start: float | None = None) -> int:
    """The collector file exporter's layout: one ``ExportTraceServiceRequest`` per line, one
    trace per line; returns how many traces were written. The same traces with the same
    ``synthetic_start`` give the same bytes."""
    return write_lines(otlp_lines(traces, service_name=service_name, synthetic_start=synthetic_start), path)
