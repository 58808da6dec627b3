"""Playground tab: run the agent loop live.

A run is one :class:`backend.engine.AgentLoop` run over the conversation so far plus the new
user message. Events from the engine stream into the chatbot (the turn being generated shows
the raw model output; finished turns show content, tool calls and tool results as collapsible
messages). Stop sets the run's cancel event: the engine aborts the generation and ends the run
with ``cancelled``, keeping what was generated. Everything per user lives in the session
(``gr.State``); the model backend is shared and starts on the first run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import gradio as gr

from backend import lifecycle
from backend.labels import OK_CODES, termination_label
from backend.trace import Trace
from ui.chat import message_to_chat, pending_message, trace_to_chat
from ui.context import AppContext, Session, UserError, short_error, trace_file_name

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_temperature",
            "description": "Get current temperature at a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The location to get the temperature for, in the format \"City, State, Country\"."}
                },
                "required": ["city"],
            },
        },
        "mock": {"template": {"temperature": 72, "city": "{city}"}},
    }
]
WEATHER_SCRIPT = [
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>',
    "The current temperature in Seattle, WA, USA is 72°F.",
]
EXAMPLE_CODE_TOOLS = '''def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location, as "City, State, Country".
    """
    return {"temperature": 72, "city": city}
'''
TRUNCATE_SIDES = ["middle", "left", "right"]
# tool_choice presets; any tool name, or a comma-separated list (one per assistant turn, the last
# repeats), is accepted too. "X, then auto" forces X on the first turn only: a forced choice that
# repeats (required, a tool's name) makes every turn a call, so the run can end only on a limit.
THEN_AUTO = ", then auto"
TOOL_CHOICE_DEFAULT_EMBEDDED = "required" + THEN_AUTO
TOOL_CHOICES = ["auto", "required", "none", TOOL_CHOICE_DEFAULT_EMBEDDED]


def tool_choice_choices(tool_names: list[str]) -> list[str]:
    """The dropdown's choices: the plain choices and tool names first, then the "X, then auto"
    presets. Gradio's dropdown picks the first option containing the typed text, so each choice
    comes before the longer ones that contain it: typing ``required`` selects ``required``."""
    names = [n for n in dict.fromkeys(tool_names) if n and n not in TOOL_CHOICES]
    return ["auto", "required", "none", *names, TOOL_CHOICE_DEFAULT_EMBEDDED, *[n + THEN_AUTO for n in names]]


def _tool_names(tools_json: str | None) -> list[str] | None:
    """Tool names in the tools box; None while it is not valid JSON (the run reports that)."""
    try:
        schemas = json.loads(tools_json or "[]")
    except (json.JSONDecodeError, TypeError):
        return None
    out = []
    for t in schemas if isinstance(schemas, list) else []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn["name"])
    return out


@dataclass
class PlaygroundUI:
    backend: gr.Radio
    model_status: gr.HTML
    script: gr.Code
    token_delay: gr.Slider
    tokenizer: gr.Dropdown
    template: gr.Textbox
    parser: gr.Dropdown
    system: gr.Textbox
    tools: gr.Code
    code_tools: gr.Code | None
    temperature: gr.Slider
    top_p: gr.Slider
    max_tokens: gr.Number
    seed: gr.Number
    response_length: gr.Number
    max_assistant_turns: gr.Number
    max_user_turns: gr.Number
    max_parallel_calls: gr.Number
    max_tool_response_length: gr.Number
    truncate_side: gr.Dropdown
    tool_timeout: gr.Number
    on_tool_error: gr.Radio
    template_kwargs: gr.Textbox
    tool_choice: gr.Dropdown
    chat: gr.Chatbot
    message: gr.Textbox
    send: gr.Button
    stop: gr.Button
    reset: gr.Button
    save: gr.DownloadButton
    status: gr.HTML
    tool_choice_note: gr.HTML | None = None  # says when a tool_choice forces a call on every turn

    def settings(self) -> list[Any]:
        comps = [self.backend, self.script, self.token_delay, self.tokenizer, self.template, self.parser, self.system, self.tools,
                 self.temperature, self.top_p, self.max_tokens, self.seed, self.response_length, self.max_assistant_turns,
                 self.max_user_turns, self.max_parallel_calls, self.max_tool_response_length, self.truncate_side, self.tool_timeout,
                 self.on_tool_error, self.template_kwargs, self.tool_choice]
        if self.code_tools is not None:
            comps.append(self.code_tools)
        return comps


@dataclass
class RunSettings:
    backend: str = "scripted"
    script: str = ""
    token_delay: float = 0.0
    tokenizer: str = "qwen3"
    template: str = ""
    parser: str = "auto"
    system: str = ""
    tools: str = "[]"
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    response_length: int = 4096
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int | None = 256
    truncate_side: str = "middle"
    tool_timeout: float = 30.0
    on_tool_error: str = "feed_back"
    template_kwargs: str = "{}"
    tool_choice: str = "auto"
    code_tools: str = ""


def check_settings(ctx: AppContext, s: RunSettings) -> RunSettings:
    """Every number and text of a run as this server accepts it (:mod:`backend.trust`): the
    API bypasses the widgets, so the ranges the widgets offer are enforced here."""
    from backend.trust import VisitorInputError, check_text

    t = ctx.trust
    try:
        for name in ("script", "system", "tools", "template_kwargs", "code_tools", "template", "tool_choice"):
            check_text(getattr(s, name), name.replace("_", " "))
        return dataclasses.replace(
            s,
            token_delay=t.number("token_delay", s.token_delay, 0.0),
            temperature=t.number("temperature", s.temperature, 0.7),
            top_p=t.number("top_p", s.top_p, 1.0),
            max_tokens=t.number("max_tokens", s.max_tokens, 512),
            seed=t.number("seed", s.seed, None),
            response_length=t.number("response_length", s.response_length, 4096),
            max_assistant_turns=t.number("max_assistant_turns", s.max_assistant_turns, None),
            max_user_turns=t.number("max_user_turns", s.max_user_turns, None),
            max_parallel_calls=t.number("max_parallel_calls", s.max_parallel_calls, 1),
            max_tool_response_length=t.number("max_tool_response_length", s.max_tool_response_length, None),
            tool_timeout=t.number("tool_timeout", s.tool_timeout, 30.0),
        )
    except VisitorInputError as e:
        raise UserError(str(e)) from None


def tool_choice_policy(choice: str | None, has_tools: bool) -> Any:
    """The LoopConfig ``tool_choice`` for the playground's setting. A preset "X, then auto" is
    ``[X, "auto"]``; "required, then auto" means plain ``auto`` when no tools are defined."""
    c = (choice or "auto").strip()
    if c.endswith(THEN_AUTO) and c[: -len(THEN_AUTO)].strip():
        first = c[: -len(THEN_AUTO)].strip()
        if first == "required" and not has_tools:
            return "auto"
        return [first, "auto"]
    return c


def tool_choice_note(choice: str | None, has_tools: bool) -> tuple[str, str] | None:
    """``(kind, text)`` when the choice needs saying: a forced choice that repeats on every turn
    (the model can never answer, so the run goes on to a limit), or a preset that fell back to
    auto for want of tools. None when the choice is unremarkable."""
    from backend.tool_choice import ToolChoiceError, normalize_policy

    c = (choice or "auto").strip()
    policy = tool_choice_policy(c, has_tools)
    if c == TOOL_CHOICE_DEFAULT_EMBEDDED and policy == "auto":
        return "info", f"no tools are defined: tool_choice '{c}' fell back to auto"
    try:
        last = normalize_policy(policy)[-1]
    except ToolChoiceError:
        return None  # the run reports a bad choice
    if last in ("auto", "none"):
        return None
    what = "a tool call" if last == "required" else f"a call to {last}"
    return "warn", (f"tool_choice '{c}' forces {what} on every turn: the model can never answer, so the run goes on until "
                    f"response_length or max_assistant_turns. To force one call and then let the model answer, choose "
                    f"'{last + THEN_AUTO}'.")


def loop_config(s: RunSettings, has_tools: bool = True) -> Any:
    from backend.engine import ConfigError, LoopConfig

    try:
        kwargs = json.loads(s.template_kwargs or "{}")
    except json.JSONDecodeError as e:
        raise UserError(f"chat_template_kwargs: invalid JSON ({e.msg})") from None
    if not isinstance(kwargs, dict):
        raise UserError("chat_template_kwargs must be a JSON object")
    # s went through check_settings: numbers are in range, 0 limits are None
    sampling: dict[str, Any] = {"temperature": float(s.temperature), "top_p": float(s.top_p), "max_tokens": int(s.max_tokens or 512)}
    if s.seed not in (None, ""):
        sampling["seed"] = int(s.seed)
    try:
        return LoopConfig(
            response_length=int(s.response_length or 4096),
            max_assistant_turns=s.max_assistant_turns or None,
            max_user_turns=s.max_user_turns or None,
            max_parallel_calls=int(s.max_parallel_calls or 1),
            max_tool_response_length=s.max_tool_response_length or None,
            tool_response_truncate_side=s.truncate_side or "middle",
            apply_chat_template_kwargs=kwargs,
            parser=None if s.parser in (None, "", "auto") else s.parser,
            sampling=sampling,
            tool_timeout_s=float(s.tool_timeout or 30.0),
            on_tool_error=s.on_tool_error or "feed_back",
            tool_choice=tool_choice_policy(s.tool_choice, has_tools),
        )
    except (ConfigError, ValueError, TypeError) as e:
        raise UserError(f"loop settings: {e}") from None


def parse_script(text: str, max_token_delay_s: float | None = None) -> list[Any]:
    from backend.generators.scripted import ScriptError
    from backend.generators.scripted import parse_script as parse

    try:
        return parse(text, max_token_delay_s=max_token_delay_s)
    except ScriptError as e:
        raise UserError(f"script: {e}") from None


def build_tools(ctx: AppContext, s: RunSettings) -> Any:
    """The run's tool registry: JSON schemas with mocks, plus Python functions when the app was
    started with --enable-code-tools (run sandboxed in a subprocess)."""
    try:
        schemas = json.loads(s.tools or "[]")
    except json.JSONDecodeError as e:
        raise UserError(f"tools: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(schemas, list):
        raise UserError("tools: a JSON list of tool schemas")
    code = (s.code_tools or "").strip() if ctx.enable_code_tools else ""
    if not schemas and not code:
        return None
    try:
        from backend.tools import ToolRegistry
    except ImportError as e:
        raise UserError(f"tools are not available in this build ({e})") from None
    try:
        reg = ToolRegistry.from_schemas(schemas) if schemas else None
        if code:
            code_reg = ToolRegistry.from_python_source(code, sandboxed=True)
            reg = code_reg if reg is None else _merge(reg, code_reg)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - bad tool definitions are user errors
        raise UserError(f"tools: {short_error(e)}") from None
    return reg


def _merge(a: Any, b: Any) -> Any:
    try:
        return a + b  # ToolRegistry.__add__; a name defined twice is an error
    except Exception as e:  # noqa: BLE001
        raise UserError(f"tools: {short_error(e)}") from None


def _tmp_trace_file(trace: Trace, session: Session) -> str:
    from backend.trace import write_jsonl

    d = session.temp_dir("run")  # the session's newest only; removed when it ends, or at shutdown
    path = os.path.join(d, trace_file_name(trace))
    write_jsonl([trace], path)
    return path


def _status(kind: str, text: str) -> str:
    return f'<div class="ali-{kind}" data-status="{kind}">{html.escape(text)}</div>'


class LiveView:
    """Chatbot messages for a run in progress, built from the engine's events with the same
    helpers that render a finished trace."""

    def __init__(self, loop: Any, bundle: Any, messages: list[dict[str, Any]]):
        self.loop = loop
        self.bundle = bundle
        self.base = messages
        self.added: list[dict[str, Any]] = []  # chat messages of finished steps
        self.n_messages = len(messages)
        self.streaming: list[int] = []
        self.stream_step: int | None = None
        self.state = "pending"
        self.dirty = True
        # progress: tokens generated in finished turns, and the time spent generating them
        self.generated = 0
        self.gen_seconds = 0.0
        self.gen_started: float | None = None

    @property
    def tokens_so_far(self) -> int:
        """Generated tokens so far (finished turns and the one being generated)."""
        return self.generated + len(self.streaming)

    def tokens_per_second(self, now: float) -> float:
        t = self.gen_seconds + (now - self.gen_started if self.gen_started is not None else 0.0)
        return self.tokens_so_far / t if t > 0 else 0.0

    def progress(self, now: float) -> str:
        """What the run is doing, for the status line: ``generating · 120 tokens · 35.2 tok/s``."""
        doing = {"pending": f"rendering the prompt (template {getattr(self.bundle, 'template_name', '?')})",
                 "processing_tools": "running tools"}.get(self.state, self.state)
        if not self.tokens_so_far:
            return doing
        return f"{doing} · {self.tokens_so_far} tokens · {self.tokens_per_second(now):.1f} tok/s"

    def on_event(self, ev: Any) -> None:
        self.dirty = True
        if ev.kind == "state":
            self.state = ev.state or self.state
            if ev.state == "generating":
                self.streaming = []
                self.gen_started = time.time()
        elif ev.kind == "tokens":
            self.streaming.extend(ev.token_ids)
        elif ev.kind == "step" and ev.step is not None:
            self._step(ev.step)

    def _step(self, step: Any) -> None:
        if step.state == "generating":
            self.streaming = []
            self.generated += max(0, step.end - step.start)
            if self.gen_started is not None:
                self.gen_seconds += time.time() - self.gen_started
                self.gen_started = None
            text = step.text
            eos = self.bundle.tokenizer.eos_token
            if eos and text.endswith(eos):
                text = text[: -len(eos)]
            parsed = self.loop.parser.parse(text)
            msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.reasoning is not None:
                msg["reasoning_content"] = parsed.reasoning
            if step.tool_calls:
                msg["tool_calls"] = [c.to_message_call() for c in step.tool_calls]
            self.added += message_to_chat(msg, self.n_messages, step=step)
            self.n_messages += 1
        elif step.state == "processing_tools":
            for r in step.tool_results:
                self.added += message_to_chat({"role": "tool", "name": r.name, "content": r.content}, self.n_messages, result=r)
                self.n_messages += 1
            if step.info.not_appended:
                self.added.append({"role": "assistant", "content": html.escape(str(step.info.not_appended)),
                                   "metadata": {"title": "Tool turn not appended", "status": "done"}})

    def chat(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, m in enumerate(self.base):
            out += message_to_chat(m, i)
        out += self.added
        if self.state == "generating":
            text = self.bundle.tokenizer.decode(self.streaming, skip_special_tokens=False) if self.streaming else ""
            out.append(pending_message(text))
        elif self.state == "processing_tools":
            out.append(pending_message("running tools…", "running tools"))
        self.dirty = False
        return out


async def _waiting(task: asyncio.Future, what: str):
    """``(None, status, None)`` every half second until ``task`` is done: what the run waits for
    (a tokenizer, a template, the model) and for how long, so a slow load is not a frozen page."""
    t0 = time.time()
    while not task.done():
        yield None, _status("info", f"{what}… {time.time() - t0:.1f} s"), None
        await asyncio.wait({task}, timeout=0.5)


async def run_turn(ctx: AppContext, session: Session, user_text: str, s: RunSettings):
    """Async generator of ``(chat, status html, trace or None)`` for one user message."""
    from backend.engine import AgentLoop
    from backend.generators.scripted import ScriptedGenerator

    user_text = (user_text or "").strip()
    if not user_text:
        raise UserError("type a message first")
    s = check_settings(ctx, s)
    try:
        from backend.trust import check_text

        check_text(user_text, "the message")
    except ValueError as e:
        raise UserError(str(e)) from None
    tools = build_tools(ctx, s)
    has_tools = bool(tools is not None and tools.names)
    cfg = loop_config(s, has_tools=has_tools)
    note = tool_choice_note(s.tool_choice, has_tools)  # a forced call on every turn, or a fallback to auto
    note_text = f" · {note[1]}" if note else ""
    if s.backend == "scripted":
        script = parse_script(s.script, ctx.trust.ranges["token_delay"].hi)
        if session.script_cursor >= len(script):
            raise UserError(f"the script's {len(script)} turn(s) are used up; press Reset or add entries")
        template = (s.template or "").strip() or None
        load = asyncio.ensure_future(asyncio.to_thread(ctx.visitor_bundle, s.tokenizer or "qwen3", template))
        async for item in _waiting(load, f"loading tokenizer {s.tokenizer or 'qwen3'}" + (" and the template override" if template else "")):
            yield item
        try:
            bundle = load.result()
        except Exception as e:  # noqa: BLE001
            raise UserError(f"tokenizer: {short_error(e)}") from None
        gen = ScriptedGenerator(bundle.tokenizer, script[session.script_cursor :], token_delay_s=float(s.token_delay or 0.0))
    else:
        start = asyncio.ensure_future(ctx.model.get())
        what = "connecting to the model" if ctx.model.generator is not None else (
            f"starting the model ({ctx.model.options.describe() if ctx.model.options else '?'}), this can take a minute the first time")
        async for item in _waiting(start, what):
            yield item
        gen, bundle = start.result()
        if (s.template or "").strip():
            load = asyncio.ensure_future(asyncio.to_thread(ctx.visitor_bundle, bundle.name, s.template.strip()))
            async for item in _waiting(load, "loading the template override"):
                yield item
            try:
                bundle = load.result()
            except Exception as e:  # noqa: BLE001
                raise UserError(f"template: {short_error(e)}") from None

    messages: list[dict[str, Any]] = []
    if (s.system or "").strip():
        messages.append({"role": "system", "content": s.system.strip()})
    messages += session.history
    messages.append({"role": "user", "content": user_text})

    try:
        loop = AgentLoop(gen, bundle, tools=tools, config=cfg)
    except ValueError as e:  # e.g. tool_choice names a tool that is not defined, or no parser for the format
        raise UserError(short_error(e)) from None
    view = LiveView(loop, bundle, messages)
    cancel = asyncio.Event()
    unregister_run = lifecycle.register_run(cancel)  # a shutdown (SIGTERM) cancels the run too
    session.cancel = cancel
    session.running = True
    t0 = time.time()
    task = asyncio.ensure_future(loop.run(messages, on_event=view.on_event, cancel=cancel, metadata={"source": "playground"},
                                          time_limit_s=ctx.trust.run_timeout_s, conversation_key=session.conversation_id))
    try:
        last = 0.0
        stopping = False
        while not task.done():
            await asyncio.wait({task}, timeout=0.08)
            now = time.time()
            # Stop only sets the cancel event; "stopping" is reported here, in this run's own
            # stream of updates, so it can never arrive after (and hide) the run's final status
            # a new event, Stop, or half a second of nothing new (a slow render keeps its clock running)
            if (view.dirty or (cancel.is_set() and not stopping) or now - last >= 0.5) and (now - last >= 0.08 or task.done()):
                last = now
                if cancel.is_set():
                    stopping = True
                    status = _status("warn", f"stopping: the generation is being aborted… · {now - t0:.1f} s")
                else:
                    status = _status("warn" if note and note[0] == "warn" else "info",
                                     f"running · {view.progress(now)} · {now - t0:.1f} s{note_text}")
                yield (view.chat() if view.dirty else None), status, None
        trace = task.result()
    finally:
        if not task.done():  # the browser went away: abort the generation
            cancel.set()
            task.cancel()
        session.running = False
        session.cancel = None
        unregister_run()
    if s.backend == "scripted":
        session.script_cursor += getattr(gen, "calls", 0)
    session.history = [m for m in trace.messages if m.get("role") != "system"]
    session.runs += 1
    label = session.add(f"run {session.runs} · {user_text[:40]}", trace)
    session.last_run = label
    session.current = label
    kind = "ok" if trace.termination_reason in OK_CODES else "warn"
    why = (f" (this server stops a run after {ctx.trust.run_timeout_s:g} s)"
           if trace.termination_reason == "time_limit" and ctx.trust.run_timeout_s else "")
    rate = f" at {view.tokens_per_second(time.time()):.1f} tok/s" if view.tokens_so_far else ""
    yield trace_to_chat(trace), _status(kind, f"run {session.runs} ended: {termination_label(trace.termination_reason)}{why} · "
                                              f"{len(trace.response_ids)} response tokens ({view.tokens_so_far} generated{rate}) · "
                                              f"{time.time() - t0:.2f} s (open the Inspector tab for every token){note_text}"), trace


def _bounds(r: Any) -> dict[str, Any]:
    """A number widget's minimum/maximum from the trust policy's range (0 stays allowed where
    it means "no limit")."""
    return {"minimum": 0 if r.zero_means_none else r.lo, "maximum": r.hi}


def build(ctx: AppContext) -> PlaygroundUI:
    from backend.parsers import available_parsers
    from ui.template_lab import tokenizer_choices

    R = ctx.trust.ranges
    backends = ["scripted"] + ([ctx.model.options.backend] if ctx.model.available else [])
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            backend = gr.Radio(backends, value=ctx.default_backend_choice, label="Backend", elem_id="pg-backend",
                               info="scripted replays the script below (no model needed)")
            model_status = gr.HTML(_status("info", "model: " + ctx.model.status()), elem_id="pg-model-status")
            # open while the scripted backend is chosen: a model backend does not read the script
            with gr.Accordion("Script (scripted backend)", open=ctx.default_backend_choice == "scripted",
                              elem_id="pg-script-box") as script_box:
                script = gr.Code(json.dumps(ctx.default_script or WEATHER_SCRIPT, ensure_ascii=False, indent=2), language="json",
                                 label="model outputs, one per assistant turn (JSON list)", lines=6, max_lines=20, elem_id="pg-script")
                token_delay = gr.Slider(R["token_delay"].lo, R["token_delay"].hi, value=0.02, step=0.01, label="delay per token (s)", elem_id="pg-delay")
            with gr.Accordion("Tokenizer, template, parser", open=False):
                public = ctx.trust.public
                tokenizer = gr.Dropdown(tokenizer_choices(ctx), value=ctx.default_tokenizer, allow_custom_value=not public,
                                        label="tokenizer (scripted backend; a model uses its own)", elem_id="pg-tokenizer")
                template = gr.Textbox(label="template override (trl name" + ("" if public else ", file") +
                                      " or Jinja text; empty = default)", lines=1, elem_id="pg-template")
                parser = gr.Dropdown(["auto", *available_parsers()], value="auto", label="tool-call parser", elem_id="pg-parser")
                template_kwargs = gr.Textbox("{}", label="chat_template_kwargs (JSON)", elem_id="pg-kwargs")
            backend.input(lambda b: gr.Accordion(open=b == "scripted"), backend, script_box, queue=False,
                          api_visibility="private")
            system = gr.Textbox(label="System prompt", lines=2, elem_id="pg-system")
            with gr.Accordion("Tools", open=True):
                tools = gr.Code(json.dumps(WEATHER_TOOLS, indent=2), language="json", lines=10, max_lines=30,
                                label='tool schemas (JSON list); "mock": the result, else a marked placeholder', elem_id="pg-tools")
                tool_choice = gr.Dropdown(
                    tool_choice_choices(_tool_names(json.dumps(WEATHER_TOOLS)) or []), value=ctx.default_tool_choice, allow_custom_value=True,
                    label="tool_choice", elem_id="pg-tool-choice",
                    info="enforced by constrained decoding. 'X, then auto': X on the first turn, then the model decides; "
                         "required (tool calls) or a tool's name alone: on EVERY turn, so the run ends only on a limit; "
                         "none: no call; comma-separated: one per assistant turn (last repeats)")
                choice_note = gr.HTML(tool_choice_note_html(ctx.default_tool_choice, True), elem_id="pg-tool-choice-note")
                code_tools = None
                if ctx.enable_code_tools:
                    code_tools = gr.Code(EXAMPLE_CODE_TOOLS, language="python", lines=10, max_lines=40, elem_id="pg-code-tools",
                                         label="Python tools (documented functions; run in a sandboxed subprocess)")
            with gr.Accordion("Sampling", open=False):
                temperature = gr.Slider(R["temperature"].lo, R["temperature"].hi, value=0.7, step=0.05, label="temperature", elem_id="pg-temperature")
                top_p = gr.Slider(R["top_p"].lo, R["top_p"].hi, value=1.0, step=0.05, label="top_p", elem_id="pg-top-p")
                max_tokens = gr.Number(512, precision=0, **_bounds(R["max_tokens"]), label="max_tokens per turn", elem_id="pg-max-tokens")
                seed = gr.Number(None, precision=0, **_bounds(R["seed"]), label="seed (empty: random)", elem_id="pg-seed")
            with gr.Accordion("Loop limits (LoopConfig)", open=False):
                response_length = gr.Number(4096, precision=0, **_bounds(R["response_length"]), label="response_length (all response tokens)", elem_id="pg-response-length")
                max_assistant_turns = gr.Number(0, precision=0, **_bounds(R["max_assistant_turns"]), label="max_assistant_turns (0 = no limit)", elem_id="pg-max-assistant")
                max_user_turns = gr.Number(0, precision=0, **_bounds(R["max_user_turns"]), label="max_user_turns (0 = no limit)", elem_id="pg-max-user")
                max_parallel_calls = gr.Number(1, precision=0, **_bounds(R["max_parallel_calls"]), label="max_parallel_calls", elem_id="pg-parallel")
                max_tool_response_length = gr.Number(256, precision=0, **_bounds(R["max_tool_response_length"]), label="max_tool_response_length (chars, 0 = no limit)",
                                                     elem_id="pg-max-tool-len")
                truncate_side = gr.Dropdown(TRUNCATE_SIDES, value="middle", label="tool_response_truncate_side", elem_id="pg-trunc")
                tool_timeout = gr.Number(30, **_bounds(R["tool_timeout"]), label="tool_timeout_s", elem_id="pg-tool-timeout")
                on_tool_error = gr.Radio(["feed_back", "terminate"], value="feed_back", label="on_tool_error", elem_id="pg-on-error")
        with gr.Column(scale=3):
            chat = gr.Chatbot(label="Agent loop", elem_id="pg-chat", height=520, feedback_options=None, sanitize_html=True,
                              group_consecutive_messages=False, buttons=["copy"],
                              placeholder="Send a message to start a run. With the scripted backend the model's turns come from the script.")
            with gr.Row():
                message = gr.Textbox(value="What's the weather in Seattle?", label="User message", lines=1, scale=5, elem_id="pg-message")
                send = gr.Button("Send", variant="primary", scale=1, elem_id="pg-send")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", elem_id="pg-stop")
                reset = gr.Button("Reset", elem_id="pg-reset")
                save = gr.DownloadButton("Save trace (JSONL)", interactive=False, elem_id="pg-save")
            status = gr.HTML(elem_id="pg-status")
    return PlaygroundUI(backend, model_status, script, token_delay, tokenizer, template, parser, system, tools, code_tools,
                        temperature, top_p, max_tokens, seed, response_length, max_assistant_turns, max_user_turns,
                        max_parallel_calls, max_tool_response_length, truncate_side, tool_timeout, on_tool_error,
                        template_kwargs, tool_choice, chat, message, send, stop, reset, save, status, choice_note)


def wire(ctx: AppContext, ui: PlaygroundUI, session: gr.State, after_run) -> None:
    """Events. ``after_run`` is ``(fn, inputs, outputs)`` refreshing the Inspector with the run."""
    names = list(RunSettings.__dataclass_fields__)
    if ui.code_tools is None:
        names.remove("code_tools")

    async def on_send(sess: Session, text: str, *values: Any):
        s = RunSettings(**dict(zip(names, values)))
        if sess.running:
            yield sess, gr.update(), _status("warn", "a run is in progress: press Stop first"), gr.update(), gr.update(), gr.update()
            return
        # the message box is emptied with the first update of an accepted message, then left alone:
        # what the user types while the run goes on is theirs (the end of the run must not wipe
        # it); a message refused before its run started goes back into the box
        cleared = False

        def box() -> Any:
            nonlocal cleared
            if cleared:
                return gr.update()
            cleared = True
            return ""

        try:
            async for chat, status, trace in run_turn(ctx, sess, text, s):
                if trace is None:
                    yield sess, (chat if chat is not None else gr.update()), status, box(), gr.update(), _model_status(ctx)
                else:
                    yield sess, chat, status, box(), gr.update(value=_tmp_trace_file(trace, sess), interactive=True), _model_status(ctx)
        except UserError as e:
            # run_turn raises these only before the loop starts (a bad setting, a load that failed)
            yield sess, gr.update(), _status("err", str(e)), (text if cleared else gr.update()), gr.update(), _model_status(ctx)
        except Exception as e:  # noqa: BLE001 - never a traceback in the UI
            import traceback

            traceback.print_exc()
            yield sess, gr.update(), _status("err", f"the run failed: {short_error(e)}"), gr.update(), gr.update(), _model_status(ctx)

    async def on_stop(sess: Session):
        if sess.cancel is not None and not sess.cancel.is_set():
            sess.cancel.set()
            # no status from here: this reply races the run's last update and could overwrite
            # "run N ended: cancelled" with a "stopping" that never goes away; the run says it
            return gr.update()
        if sess.running:
            return gr.update()  # already stopping
        return _status("info", "nothing is running")

    async def on_reset(sess: Session):
        if sess.cancel is not None:
            sess.cancel.set()
        sess.history = []
        sess.script_cursor = 0
        sess.last_run = None
        sess.conversation_id = uuid.uuid4().hex  # a new conversation: routed afresh
        return sess, [], _status("info", "conversation cleared (past runs stay in the Inspector's trace list)"), gr.update(
            value=None, interactive=False)

    fn, inputs, outputs = after_run
    outs = [session, ui.chat, ui.status, ui.message, ui.save, ui.model_status]
    ev_args = dict(concurrency_limit=ctx.concurrency_limit, concurrency_id="agent_run")
    # API names, kept stable (gradio_client scripts and tests/adversarial/test_load_isolation.py
    # call them; each client is its own session, so a call only ever sees that session's state):
    #   /playground_run   (message, *RunSettings fields in order, without code_tools unless
    #                      --enable-code-tools) -> chat, status, message box, trace file, model status
    #   /playground_stop  () -> status          /playground_reset () -> chat, status, trace file
    # Enter in the message box runs the same handler (/playground_run_enter, callable, not listed).
    run_inputs = [session, ui.message, *ui.settings()]
    ui.send.click(on_send, run_inputs, outs, api_name="playground_run", **ev_args).then(fn, inputs, outputs)
    ui.message.submit(on_send, run_inputs, outs, api_name="playground_run_enter", api_visibility="undocumented",
                      **ev_args).then(fn, inputs, outputs)
    ui.stop.click(on_stop, [session], [ui.status], queue=False, api_name="playground_stop")
    if ui.tool_choice_note is not None:
        # the dropdown offers the tools' names and "<name>, then auto"; the note says when a choice
        # forces a call on every turn (or fell back to auto for want of tools)
        code_in = [ui.code_tools] if ui.code_tools is not None else []

        def has_tools(tools_json: str, code: str = "") -> bool:
            names = _tool_names(tools_json)
            return names is None or bool(names) or bool((code or "").strip())  # unreadable: say nothing yet

        def on_choice(choice: str, tools_json: str, *code: str):
            return tool_choice_note_html(choice, has_tools(tools_json, *code))

        def on_tools(choice: str, tools_json: str, *code: str):
            names = _tool_names(tools_json)
            return (gr.update() if names is None else gr.update(choices=tool_choice_choices(names)),
                    tool_choice_note_html(choice, has_tools(tools_json, *code)))

        note_args = dict(queue=False, api_visibility="private", trigger_mode="always_last")
        ui.tool_choice.change(on_choice, [ui.tool_choice, ui.tools, *code_in], [ui.tool_choice_note], **note_args)
        for comp in (ui.tools, *code_in):
            comp.change(on_tools, [ui.tool_choice, ui.tools, *code_in], [ui.tool_choice, ui.tool_choice_note], **note_args)
    ui.reset.click(on_reset, [session], [session, ui.chat, ui.status, ui.save], queue=False, api_name="playground_reset")


def tool_choice_note_html(choice: str | None, has_tools: bool) -> str:
    """The note under the tool_choice dropdown (empty when there is nothing to say)."""
    note = tool_choice_note(choice, has_tools)
    return _status(*note) if note else ""


def _model_status(ctx: AppContext) -> str:
    kind = "err" if ctx.model.error else "info"
    return _status(kind, "model: " + ctx.model.status())
