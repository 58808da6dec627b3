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
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import gradio as gr

from backend.checks.labels import OK_CODES, termination_label
from backend.config import (
    DEFAULTS,
    FIELDS,
    THEN_AUTO,
    ConfigError,
    LoopConfig,
    default_tool_choice,
    env_defaults,
    tool_choice_policy,
)
from backend.deploy import lifecycle
from backend.trace import Trace
from ui.chat import message_to_chat, pending_message, trace_to_chat
from ui.context import AppContext, Session, UserError, short_error, trace_file_name

log = logging.getLogger(__name__)

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
# The example Python tool (--enable-code-tools): a name of its own, so that it and the schema tools
# above can be defined together (a name defined twice is refused): the default run works as is
EXAMPLE_CODE_TOOLS = '''def fahrenheit_to_celsius(fahrenheit: float):
    """Convert a temperature from degrees Fahrenheit to degrees Celsius.

    Args:
        fahrenheit: The temperature in degrees Fahrenheit.
    """
    return {"celsius": round((fahrenheit - 32) * 5 / 9, 1)}'''  # no final newline: the code box drops it
# The user message box's initial text (/playground_run's default message)
DEFAULT_MESSAGE = "What's the weather in Seattle?"
# tool_choice presets (backend.config); any tool name, or a comma-separated list (one per assistant
# turn, the last repeats), is accepted too. The embedded model's default ("required, then auto")
# forces a call on the first turn only.
TOOL_CHOICE_DEFAULT_EMBEDDED = default_tool_choice(embedded_model=True)
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


# The loop settings the Playground shows a widget for: every LoopConfig field but those it sets
# from widgets of its own (sampling: temperature, top_p, max_tokens, seed)
LOOP_WIDGETS = [name for name, k in FIELDS.items() if k.widget]


@dataclass
class PlaygroundUI:
    backend: gr.Radio
    model_status: gr.HTML
    script: gr.Code
    token_delay: gr.Slider
    tokenizer: gr.Dropdown
    template: gr.Textbox
    system: gr.Textbox
    tools: gr.Code
    code_tools: gr.Code | None
    temperature: gr.Slider
    top_p: gr.Slider
    max_tokens: gr.Number
    seed: gr.Number
    logprobs: gr.Checkbox  # record the sampled tokens' logprobs (sampling logprobs=0), for the logprob lens
    loop: dict[str, Any]  # LoopConfig field name → its widget (built from backend.config.FIELDS)
    chat: gr.Chatbot
    message: gr.Textbox
    send: gr.Button
    stop: gr.Button
    reset: gr.Button
    save: gr.DownloadButton
    status: gr.HTML
    settings_json: gr.JSON  # /playground_run's one settings object (the API's input; hidden)
    run_api: gr.Button  # hidden: carries /playground_run
    tool_choice_note: gr.HTML | None = None  # says when a tool_choice forces a call on every turn
    defaults: Any = None  # default_settings(ctx): the widgets' initial values, /playground_run's defaults

    @property
    def tool_choice(self) -> gr.Dropdown:
        return self.loop["tool_choice"]

    def settings(self) -> list[Any]:
        """The widgets of every :class:`RunSettings` field, in its order."""
        return [self.loop[n] if n in self.loop else getattr(self, n) for n in setting_names(self.code_tools is not None)]


# The Playground's own settings (before the LoopConfig ones): name, default. These defaults, with
# the LoopConfig fields' below, are what a visitor of an app with no model gets: the widgets'
# initial values (build) and what /playground_run uses for a field its settings object leaves out
# both come from default_settings(ctx), which starts from them. Nothing else spells a default.
_OWN_SETTINGS: list[tuple[str, Any]] = [
    ("backend", "scripted"), ("script", json.dumps(WEATHER_SCRIPT, ensure_ascii=False, indent=2)), ("token_delay", 0.02),
    ("tokenizer", "qwen3"), ("template", ""), ("system", ""), ("tools", json.dumps(WEATHER_TOOLS, indent=2)),
    ("temperature", 0.7), ("top_p", 1.0), ("max_tokens", 512), ("seed", None), ("logprobs", False),
]
_TEXT_SETTINGS = ("script", "system", "tools", "code_tools", "template")  # size-checked like the message
_JSON_TEXT_SETTINGS = ("script", "tools")  # JSON text in a box; the API takes the JSON value itself too

# One run's settings: the Playground's own, then one per LoopConfig widget (named and defaulted as
# the field is, in the widget's terms: 0 for "no limit", JSON text for an object), then code_tools.
RunSettings = dataclasses.make_dataclass(
    "RunSettings",
    [(n, Any, dataclasses.field(default=d)) for n, d in _OWN_SETTINGS]
    + [(n, Any, dataclasses.field(default=FIELDS[n].widget_value(DEFAULTS[n]))) for n in LOOP_WIDGETS]
    + [("code_tools", str, dataclasses.field(default=""))],
    namespace={"__module__": __name__, "__doc__": "The settings of one Playground run (what /playground_run takes)."},
)


def setting_names(code_tools: bool = True) -> list[str]:
    """RunSettings' fields, in order (without code_tools when the app has no code tools)."""
    return [f.name for f in dataclasses.fields(RunSettings) if code_tools or f.name != "code_tools"]


def env_loop_settings(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The loop settings the operator gave by ``ALI_*`` variables (:func:`backend.config.env_defaults`,
    e.g. ``ALI_VLLM_LOGPROBS_MODE``), in the widgets' terms; a value the field refuses is logged
    and left out (the field keeps its default)."""
    out: dict[str, Any] = {}
    try:
        given = env_defaults(environ)
    except ConfigError as e:
        log.warning("ignored an ALI_* loop setting: %s", e)
        return out
    for name, v in given.items():
        if name not in LOOP_WIDGETS:
            continue
        k = FIELDS[name]
        try:
            k.check(name, v)
        except ConfigError as e:
            log.warning("ignored %s: %s", k.env, e)
            continue
        out[name] = k.widget_value(v)
    return out


def default_settings(ctx: AppContext, environ: dict[str, str] | None = None) -> Any:
    """The run a visitor gets by pressing Send without touching a widget, as :class:`RunSettings`:
    the widgets' initial values (:func:`build`) and /playground_run's defaults (any field its
    settings object leaves out), for this app: its model backend unless a --script was given, its
    --script, its tokenizer, the embedded model's tool_choice, the operator's ``ALI_*`` loop
    settings, and the example Python tool when code tools are enabled."""
    app = {
        "backend": ctx.default_backend_choice,
        "tokenizer": ctx.default_tokenizer,
        "tool_choice": ctx.default_tool_choice,
        "code_tools": EXAMPLE_CODE_TOOLS if ctx.enable_code_tools else "",
    }
    if ctx.default_script:
        app["script"] = json.dumps(ctx.default_script, ensure_ascii=False, indent=2)
    return dataclasses.replace(RunSettings(), **{**app, **env_loop_settings(environ)})


def settings_dict(s: Any, code_tools: bool = True) -> dict[str, Any]:
    """A :class:`RunSettings` as /playground_run's settings object (without code_tools when the
    app has no code tools)."""
    return {n: getattr(s, n) for n in setting_names(code_tools)}


def settings_from_dict(d: Any, defaults: Any = None) -> Any:
    """A /playground_run settings object (a JSON object of RunSettings fields, or its JSON text)
    as :class:`RunSettings`: the fields it leaves out or sets to null (all of them for ``{}`` or null) keep
    ``defaults`` (:func:`default_settings`: the app's, as the widgets show them; without it the
    dataclass's); unknown keys are refused. ``script`` and ``tools`` may be JSON values (a list)
    instead of JSON text, ``apply_chat_template_kwargs`` an object, ``tool_choice`` a list."""
    if d is None:
        d = {}
    if isinstance(d, str):
        try:
            d = json.loads(d) if d.strip() else {}
        except json.JSONDecodeError as e:
            raise UserError(f"settings: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(d, dict):
        raise UserError("settings: a JSON object of run settings (null or {} for the defaults)")
    known = setting_names()
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise UserError(f"settings: unknown key(s) {', '.join(unknown)[:200]}; known: {', '.join(known)}")
    given = {k: _setting_value(k, v) for k, v in d.items() if v is not None}  # null: the default
    return dataclasses.replace(defaults if defaults is not None else RunSettings(), **given)


def _setting_value(name: str, v: Any) -> Any:
    """One field of a settings object in the widgets' terms, or a UserError naming the field."""
    k = FIELDS.get(name)
    if name in _JSON_TEXT_SETTINGS and isinstance(v, (list, dict)):
        return json.dumps(v, ensure_ascii=False)
    if k is not None and k.kind == "object" and isinstance(v, dict):
        return json.dumps(v, ensure_ascii=False)
    if name == "tool_choice" and isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return ", ".join(v)
    text = name in (*_TEXT_SETTINGS, "backend", "tokenizer") or (k is not None and k.widget in ("text", "dropdown", "radio"))
    if text and v is not None and not isinstance(v, str):
        raise UserError(f"settings: {name} must be text, not {type(v).__name__}")
    if name == "logprobs" and v not in (None, True, False):
        raise UserError("settings: logprobs must be true or false")
    if not text and name != "logprobs" and (isinstance(v, (bool, list, dict))):
        raise UserError(f"settings: {name} must be a number or null, not {json.dumps(v)[:40]}")
    return v


def check_settings(ctx: AppContext, s: Any) -> Any:
    """Every number and text of a run as this server accepts it (:mod:`backend.safety.trust`): the
    API bypasses the widgets, so the ranges the widgets offer are enforced here (an empty number
    takes the app's default)."""
    from backend.safety.trust import check_text

    t = ctx.trust
    texts = [*_TEXT_SETTINGS, *(n for n in LOOP_WIDGETS if FIELDS[n].widget in ("text", "dropdown"))]
    for name in texts:
        check_text(getattr(s, name), name.replace("_", " "))
    defaults = default_settings(ctx)
    return dataclasses.replace(s, **{n: t.number(n, getattr(s, n), getattr(defaults, n))
                                     for n in setting_names() if n in t.ranges})


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


def loop_config(s: Any, has_tools: bool = True) -> LoopConfig:
    """The run's LoopConfig: each widget's value read by its field's Knob, and the sampling
    widgets (``s`` went through :func:`check_settings`: numbers are in range)."""
    sampling: dict[str, Any] = {"temperature": float(s.temperature), "top_p": float(s.top_p), "max_tokens": int(s.max_tokens or 512)}
    if s.seed not in (None, ""):
        sampling["seed"] = int(s.seed)
    if s.logprobs not in (None, False, "", 0):
        if s.logprobs is not True:
            raise UserError("logprobs: true or false")
        sampling["logprobs"] = 0  # the sampled token's logprob, for the Inspector's logprob lens
    values = {n: FIELDS[n].parse(getattr(s, n), has_tools=has_tools) for n in LOOP_WIDGETS}
    try:
        return LoopConfig(**values, sampling=sampling)
    except (ConfigError, TypeError) as e:
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
    helpers that render a finished trace: a finished step's ``Step`` and the messages it appended
    (``LoopEvent.messages``), nothing parsed again."""

    def __init__(self, bundle: Any, messages: list[dict[str, Any]]):
        self.bundle = bundle
        self.base = messages
        self.added: list[dict[str, Any]] = []  # chat messages of finished steps
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

    def on_event(self, ev: Any, at: float | None = None) -> None:
        """Apply one engine event; ``at``: when the engine emitted it (default: now)."""
        at = time.time() if at is None else at
        self.dirty = True
        if ev.kind == "state":
            self.state = ev.state or self.state
            if ev.state == "generating":
                self.streaming = []
                self.gen_started = at
        elif ev.kind == "tokens":
            self.streaming.extend(ev.token_ids)
        elif ev.kind == "step" and ev.step is not None:
            self._step(ev.step, ev.messages, at)

    def _step(self, step: Any, messages: list[dict[str, Any]], at: float) -> None:
        if step.state == "generating":
            self.streaming = []
            self.generated += max(0, step.end - step.start)
            if self.gen_started is not None:
                self.gen_seconds += at - self.gen_started
                self.gen_started = None
        results = {r.call_id: r for r in step.tool_results if r.call_id}
        for i, msg in zip(step.messages_added, messages):
            res = results.get(msg.get("tool_call_id") or "") if msg.get("role") == "tool" else None
            self.added += message_to_chat(msg, i, step=step, result=res)
        if step.state == "processing_tools":
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


_DONE = object()  # the run's task ended
_STOP = object()  # Stop (the cancel event) was set
RENDER_MIN_S = 0.08  # the live view re-renders at most this often
IDLE_S = 0.5  # with nothing new, the status line (its clock) is refreshed this often


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
        from backend.safety.trust import check_text

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
        gen = ScriptedGenerator(bundle.tokenizer, script[session.script_cursor :], token_delay_s=float(s.token_delay or 0.0),
                                stop_token_ids=bundle.stop_token_ids, encode=bundle.encode_generated)
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
    view = LiveView(bundle, messages)
    cancel = asyncio.Event()
    unregister_run = lifecycle.register_run(cancel)  # a shutdown (SIGTERM) cancels the run too
    session.cancel = cancel
    session.running = True
    t0 = time.time()
    # the engine's events, Stop and the run's end all arrive on one queue; the page is re-rendered
    # when something arrived (at most every RENDER_MIN_S) or the status clock is IDLE_S old
    events: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(loop.run(messages, on_event=lambda ev: events.put_nowait((time.time(), ev)), cancel=cancel, metadata={"source": "playground"},
                                          time_limit_s=ctx.trust.run_timeout_s, conversation_key=session.conversation_id))
    task.add_done_callback(lambda _: events.put_nowait(_DONE))
    stop_watch = asyncio.ensure_future(cancel.wait())
    stop_watch.add_done_callback(lambda f: f.cancelled() or events.put_nowait(_STOP))
    try:
        last = 0.0
        done = False
        while not done:
            try:
                first = await asyncio.wait_for(events.get(), timeout=max(0.0, last + IDLE_S - time.time()))
            except asyncio.TimeoutError:
                first = None  # nothing new: the status clock moves on
            if first is not None and time.time() - last < RENDER_MIN_S:
                await asyncio.sleep(RENDER_MIN_S - (time.time() - last))  # throttle: gather what else arrives
            batch = [first] if first is not None else []
            while not events.empty():
                batch.append(events.get_nowait())
            for ev in batch:
                if ev is _DONE:
                    done = True
                elif ev is not _STOP:
                    view.on_event(ev[1], at=ev[0])
            if done and _STOP not in batch:
                break  # (a Stop that came with the end is still said once, before the final status)
            now = time.time()
            last = now
            # Stop only sets the cancel event; "stopping" is reported here, in this run's own
            # stream of updates, so it can never arrive after (and hide) the run's final status
            if cancel.is_set():
                status = _status("warn", f"stopping: the generation is being aborted… · {now - t0:.1f} s")
            else:
                status = _status("warn" if note and note[0] == "warn" else "info",
                                 f"running · {view.progress(now)} · {now - t0:.1f} s{note_text}")
            yield (view.chat() if view.dirty else None), status, None
        trace = task.result()
    finally:
        stop_watch.cancel()
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


def loop_widget(ctx: AppContext, name: str, defaults: Any = None) -> Any:
    """The widget of a LoopConfig field, from its Knob (backend.config.FIELDS): a number box with
    this server's range, a dropdown or radio of its choices, a text box for a JSON object; its
    value from ``defaults`` (:func:`default_settings`)."""
    from backend.parsers import available_parsers

    k = FIELDS[name]
    d = defaults if defaults is not None else default_settings(ctx)
    value = getattr(d, name)
    common = dict(label=k.label, elem_id=k.elem_id or f"pg-{name.replace('_', '-')}")
    if k.widget == "number":
        r = ctx.trust.ranges.get(name)
        bounds = _bounds(r) if r is not None else {}
        return gr.Number(value, precision=0 if k.kind == "int" else None, **bounds, **common)
    if k.kind == "parser":
        return gr.Dropdown(["auto", *available_parsers()], value=value, **common)
    if k.kind == "tool_choice":
        return gr.Dropdown(tool_choice_choices(_tool_names(d.tools) or []), value=value,
                           allow_custom_value=True, **common,
                           info="enforced by constrained decoding. 'X, then auto': X on the first turn, then the model decides; "
                                "required (tool calls) or a tool's name alone: on EVERY turn, so the run ends only on a limit; "
                                "none: no call; comma-separated: one per assistant turn (last repeats)")
    if k.widget == "dropdown":
        return gr.Dropdown(list(k.choices), value=value, **common)
    if k.widget == "radio":
        return gr.Radio(list(k.choices), value=value, **common)
    return gr.Textbox(value, **common)


def build(ctx: AppContext) -> PlaygroundUI:
    from backend.loading.tokenizers import families_line
    from ui.template_lab import tokenizer_choices

    R = ctx.trust.ranges
    d = default_settings(ctx)  # every widget's initial value, and /playground_run's defaults
    loop: dict[str, Any] = {}

    def loop_widgets(group: str) -> None:
        for name in LOOP_WIDGETS:
            if FIELDS[name].group == group:
                loop[name] = loop_widget(ctx, name, d)
    backends = ["scripted"] + ([ctx.model.options.backend] if ctx.model.available else [])
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            backend = gr.Radio(backends, value=d.backend, label="Backend", elem_id="pg-backend",
                               info="scripted replays the script below (no model needed)")
            model_status = gr.HTML(_status("info", "model: " + ctx.model.status()), elem_id="pg-model-status")
            # open while the scripted backend is chosen: a model backend does not read the script
            with gr.Accordion("Script (scripted backend)", open=d.backend == "scripted",
                              elem_id="pg-script-box") as script_box:
                script = gr.Code(d.script, language="json",
                                 label="model outputs, one per assistant turn (JSON list)", lines=6, max_lines=20, elem_id="pg-script")
                token_delay = gr.Slider(R["token_delay"].lo, R["token_delay"].hi, value=d.token_delay, step=0.01, label="delay per token (s)", elem_id="pg-delay")
            with gr.Accordion("Tokenizer, template, parser", open=False):
                public = ctx.trust.public
                tokenizer = gr.Dropdown(tokenizer_choices(ctx), value=d.tokenizer, allow_custom_value=not public,
                                        label="tokenizer (scripted backend; a model uses its own)", elem_id="pg-tokenizer",
                                        info="profiles by family: " + families_line())
                template = gr.Textbox(d.template, label="template override (trl name" + ("" if public else ", file") +
                                      " or Jinja text; empty = default)", lines=1, elem_id="pg-template")
                loop_widgets("format")
            backend.input(lambda b: gr.Accordion(open=b == "scripted"), backend, script_box, queue=False,
                          api_visibility="private")
            system = gr.Textbox(d.system, label="System prompt", lines=2, elem_id="pg-system")
            with gr.Accordion("Tools", open=True):
                tools = gr.Code(d.tools, language="json", lines=10, max_lines=30,
                                label='tool schemas (JSON list); "mock": the result, else a marked placeholder', elem_id="pg-tools")
                loop_widgets("tools")
                choice_note = gr.HTML(tool_choice_note_html(d.tool_choice, bool(_tool_names(d.tools)) or bool(d.code_tools.strip())),
                                      elem_id="pg-tool-choice-note")
                code_tools = None
                if ctx.enable_code_tools:
                    code_tools = gr.Code(d.code_tools, language="python", lines=10, max_lines=40, elem_id="pg-code-tools",
                                         label="Python tools (documented functions; run in a sandboxed subprocess)")
            with gr.Accordion("Sampling", open=False):
                temperature = gr.Slider(R["temperature"].lo, R["temperature"].hi, value=d.temperature, step=0.05, label="temperature", elem_id="pg-temperature")
                top_p = gr.Slider(R["top_p"].lo, R["top_p"].hi, value=d.top_p, step=0.05, label="top_p", elem_id="pg-top-p")
                max_tokens = gr.Number(d.max_tokens, precision=0, **_bounds(R["max_tokens"]), label="max_tokens per turn", elem_id="pg-max-tokens")
                seed = gr.Number(d.seed, precision=0, **_bounds(R["seed"]), label="seed (empty: random)", elem_id="pg-seed")
                logprobs = gr.Checkbox(d.logprobs, label="record logprobs (for the Inspector's logprob lens)", elem_id="pg-logprobs")
            with gr.Accordion("Loop limits (LoopConfig)", open=False):
                loop_widgets("limits")
        with gr.Column(scale=3):
            chat = gr.Chatbot(label="Agent loop", elem_id="pg-chat", height=520, feedback_options=None, sanitize_html=True,
                              group_consecutive_messages=False, buttons=["copy"],
                              placeholder="Send a message to start a run. With the scripted backend the model's turns come from the script.")
            with gr.Row():
                message = gr.Textbox(value=DEFAULT_MESSAGE, label="User message", lines=1, scale=5, elem_id="pg-message")
                send = gr.Button("Send", variant="primary", scale=1, elem_id="pg-send")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", elem_id="pg-stop")
                reset = gr.Button("Reset", elem_id="pg-reset")
                save = gr.DownloadButton("Save trace (JSONL)", interactive=False, elem_id="pg-save")
            status = gr.HTML(elem_id="pg-status")
            # /playground_run: the message and ONE settings object (a JSON object of RunSettings
            # fields); the Send button and Enter call the same handler with the widgets' values.
            # Its value, which the API documents as the default, is the widgets' initial values
            settings_json = gr.JSON(settings_dict(d, ctx.enable_code_tools), visible=False, label="settings")
            run_api = gr.Button(visible=False, elem_id="pg-run-api")
    return PlaygroundUI(backend, model_status, script, token_delay, tokenizer, template, system, tools, code_tools,
                        temperature, top_p, max_tokens, seed, logprobs, loop, chat, message, send, stop, reset, save, status,
                        settings_json, run_api, choice_note, d)


def wire(ctx: AppContext, ui: PlaygroundUI, session: gr.State, after_run) -> None:
    """Events. ``after_run`` is ``(fn, inputs, outputs)`` refreshing the Inspector with the run."""
    names = setting_names(ui.code_tools is not None)
    defaults = ui.defaults if ui.defaults is not None else default_settings(ctx)

    async def on_send(sess: Session, text: str, settings: dict[str, Any] | None = None):
        """/playground_run: one user message, with ONE settings object (RunSettings fields; those
        left out keep the app's defaults: what the widgets show before anyone touches them)."""
        try:
            d = dict(settings) if isinstance(settings, dict) else settings
            if isinstance(d, dict) and ui.code_tools is None:
                d.pop("code_tools", None)  # the app runs no code tools: ignored, as the widget is absent
            s = settings_from_dict(d, defaults)
        except UserError as e:
            yield sess, gr.update(), _status("err", str(e)), gr.update(), gr.update(), _model_status(ctx)
            return
        async for out in _send(sess, text, s):
            yield out

    async def on_send_widgets(sess: Session, text: str, *values: Any):
        """The Send button and Enter: the widgets' values, in RunSettings' order."""
        async for out in _send(sess, text, RunSettings(**dict(zip(names, values)))):
            yield out

    from ui import queue_max_size
    from ui.run_gate import RunGate

    # runs at once and runs waiting: the app's own line, not gradio's queue (ui/run_gate.py), so
    # that a run past it is told in words what happened and when to come back
    gate = ctx.run_gate = RunGate(ctx.concurrency_limit, queue_max_size())

    async def _send(sess: Session, text: str, s: Any):
        if sess.running:
            yield sess, gr.update(), _status("warn", "a run is in progress: press Stop first"), gr.update(), gr.update(), gr.update()
            return
        ticket = gate.join()
        if ticket is None:  # the line is full: said at once, the message stays in the box
            log.info("playground: a run refused, the server is busy (%d running, %d waiting; %d refused so far)",
                     gate.running, len(gate.line), gate.refused)
            yield sess, gr.update(), _status("warn", gate.busy_text()), gr.update(), gr.update(), gr.update()
            return
        try:
            if not ticket.admitted:
                # waiting in line: Stop leaves it; the status says the place and about how long
                since = time.monotonic()
                sess.running, sess.cancel = True, asyncio.Event()
                try:
                    while not await gate.wait(ticket, 1.0):
                        if sess.cancel.is_set():
                            yield sess, gr.update(), _status("info", "left the line: the run was not started"), gr.update(), gr.update(), gr.update()
                            return
                        yield sess, gr.update(), _status("info", gate.waiting_text(ticket, since)), gr.update(), gr.update(), gr.update()
                finally:
                    sess.running, sess.cancel = False, None
            async for out in _run(sess, text, s):
                yield out
        finally:
            gate.leave(ticket)

    async def _run(sess: Session, text: str, s: Any):
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
        except Exception as e:  # noqa: BLE001 - never a traceback in the UI (it goes to the log)
            log.exception("the playground run failed")
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
    # no limit of gradio's for the runs' group: a run goes straight to _send, where the app's own
    # line (RunGate) holds it or says the server is busy; gradio's queue bound is left to the rest
    ev_args = dict(concurrency_limit=None, concurrency_id="agent_run")
    # API names, kept stable (gradio_client scripts and tests/adversarial/test_load_isolation.py
    # call them; each client is its own session, so a call only ever sees that session's state):
    #   /playground_run   (message, settings: a JSON object of RunSettings fields, any left out
    #                      keep the app's defaults, default_settings) -> chat, status, message box,
    #                      trace file, model status (docs/api.md)
    #   /playground_stop  () -> status          /playground_reset () -> chat, status, trace file
    # The Send button and Enter run the same turn from the widgets (private events).
    ui.run_api.click(on_send, [session, ui.message, ui.settings_json], outs, api_name="playground_run",
                     **ev_args).then(fn, inputs, outputs)
    run_inputs = [session, ui.message, *ui.settings()]
    ui.send.click(on_send_widgets, run_inputs, outs, api_visibility="private", **ev_args).then(
        fn, inputs, outputs, api_visibility="private")
    ui.message.submit(on_send_widgets, run_inputs, outs, api_visibility="private", **ev_args).then(
        fn, inputs, outputs, api_visibility="private")
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
