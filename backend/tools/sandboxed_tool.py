"""User-typed code as tools, never run in this process: a discovery subprocess describes the
code's documented public functions (their schemas are rebuilt here by
:mod:`backend.tools.schema_stub`), and every call runs in a fresh limited subprocess
(:mod:`backend.tools.sandbox`). This module also reads what those subprocesses send back."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

from backend.tools._runtime import clean_text
from backend.tools.base import Tool, ToolLoadError
from backend.tools.deadline import timeout_arg
from backend.tools.outcome import MAX_DETAIL_CHARS, MAX_MESSAGE_CHARS, CallOptions, Outcome, safe_str, timeout_outcome
from backend.tools.sandbox import SandboxLimits, run_child
from backend.tools.schema_stub import schema_from_description

MAX_SOURCE_CHARS = 1_000_000

# discovery results by (sha256 of the code, filename, limits): the UI reloads the same code often
_DISCOVERED: dict[tuple, dict[str, Any]] = {}
_DISCOVERED_LOCK = threading.Lock()


class SandboxedTool(Tool):
    """A function from user-typed code, run in a fresh limited subprocess per call."""

    kind = "sandboxed"

    def __init__(self, schema: Any, code: str, function: str, limits: Any, *, filename: str = "<tools>",
                 source: str | None = None):
        super().__init__(schema, source=source)
        self.code = code
        self.function = function
        self.limits = limits
        self.filename = filename

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        timeout = timeout_arg(options.timeout_s)
        timeout = 3600.0 if timeout is None else timeout  # a child never runs unbounded
        request = {
            "mode": "call", "code": self.code, "filename": self.filename, "function": self.function,
            "arguments": arguments, "max_response_length": options.max_response_length,
            "truncate_side": options.truncate_side,
        }
        try:
            run = await run_child(request, self.limits, timeout)
        except OSError as e:
            return Outcome(content=f"Error: tool '{self.name}' could not be started", error="crashed",
                           detail=f"starting the sandbox failed: {e}")
        return outcome_from_child(self.name, run, timeout, self.limits)


def outcome_from_child(name: str, run: Any, timeout_s: float, limits: Any) -> Outcome:
    """Turn a sandbox :class:`~backend.tools.sandbox.ChildRun` into an Outcome."""
    stdout = run.stdout if run.stdout_bytes else None
    stderr_tail = run.stderr[-4000:] if run.stderr else ""
    extra = {"sandbox": {"returncode": run.returncode, "duration_s": round(run.duration_s, 4)}}

    def done(out: Outcome) -> Outcome:
        out.stdout = stdout
        out.extra = extra
        return out

    if run.timed_out:
        if run.notes:
            return done(Outcome(content=f"Error: tool '{name}' could not be started in time", error="crashed",
                                detail="; ".join(run.notes) + "; the sandbox process was killed"))
        return done(timeout_outcome(name, timeout_s, "; the sandbox process was killed"))
    if run.result_too_big:
        return done(Outcome(
            content=f"Error: tool '{name}' returned a result larger than the {limits.max_result_bytes} byte limit",
            error="bad_result", detail=f"the sandbox result pipe carried more than {limits.max_result_bytes} bytes; the process was killed",
        ))
    p = run.payload
    if p is None:
        if run.payload_error:
            return done(Outcome(content=f"Error: tool '{name}' sent back an unreadable result", error="bad_result",
                                detail=run.payload_error + ("\n" + stderr_tail if stderr_tail else "")))
        sig = run.signal_name
        if sig == "SIGXCPU":
            why = f"it used up its CPU time limit ({limits.child_limits(timeout_s)['cpu_s']:g} s)"
        elif sig == "SIGKILL":
            why = "it was killed (SIGKILL), most likely by the CPU time or memory limit"
        elif sig == "SIGSEGV":
            why = "it crashed (segmentation fault)"
        elif sig:
            why = f"it was killed by {sig}"
        else:
            why = f"the process exited with code {run.returncode} without returning a result"
        return done(Outcome(content=f"Error: tool '{name}' crashed: {why}", error="crashed",
                            detail=(why + ("\nstderr:\n" + stderr_tail if stderr_tail else ""))))
    status = p.get("status")
    if status == "ok":
        content = p.get("content")
        if not isinstance(content, str):
            return done(Outcome(content=f"Error: tool '{name}' sent back an unreadable result", error="bad_result",
                                detail="the result document has no text content"))
        note = p.get("note") if isinstance(p.get("note"), str) else None
        truncated = bool(p.get("truncated"))
        original = p.get("original_length") if isinstance(p.get("original_length"), int) else None
        out = Outcome(content=clean_text(content)[0], note=note)
        if truncated and original is not None and original >= len(content) - 20:
            out.truncated, out.original_length = True, original
        return done(out)
    if status in ("exception", "load_error", "bad_result"):
        etype = safe_str(p.get("type") or "Exception", 200)
        msg = safe_str(p.get("message") or "", MAX_MESSAGE_CHARS)
        tb = safe_str(p.get("traceback") or "", MAX_DETAIL_CHARS)
        if etype == "SystemExit":
            code = p.get("exit_code")
            content = f"Error: tool '{name}' called sys.exit({'' if code is None else safe_str(code, 200)})"
        elif status == "load_error":
            line = p.get("line")
            content = (f"Error: tool '{name}': the tool code failed while loading"
                       + (f" (line {line})" if isinstance(line, int) else "") + f": {etype}" + (f": {msg}" if msg else ""))
        elif status == "bad_result":
            return done(Outcome(content=f"Error: tool '{name}' returned a result that cannot be turned into text ({etype}: {msg})",
                                error="bad_result", detail=tb))
        else:
            content = f"Error: tool '{name}' raised {etype}" + (f": {msg}" if msg else "")
        if etype == "MemoryError" and limits.memory_mb:
            content += f" (out of memory: the sandbox allows {limits.memory_mb} MB)"
        return done(Outcome(content=content, error="exception", detail=tb))
    if status == "syntax_error":
        return done(Outcome(content=f"Error: tool '{name}': the tool code has a syntax error", error="exception",
                            detail=safe_str(p.get("message"), 500)))
    return done(Outcome(content=f"Error: tool '{name}' failed in the sandbox", error="crashed",
                        detail=safe_str(p.get("message") or p, 2000)))


# ---- discovery ---------------------------------------------------------------------------------


def discover_tools(code: str, filename: str, limits: SandboxLimits) -> tuple[list[SandboxedTool], list[dict[str, str]]]:
    """The documented public functions of ``code`` as sandboxed tools, and the functions left
    out (``{"name", "reason"}``). Blocks for the discovery run (one subprocess, typically
    0.1-0.3 s); its result is cached by the code's hash."""
    if len(code) > MAX_SOURCE_CHARS:
        raise ToolLoadError(f"the tool code is {len(code)} characters; the limit is {MAX_SOURCE_CHARS}")
    key = (hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest(), filename, limits)
    with _DISCOVERED_LOCK:
        p = _DISCOVERED.get(key)
    if p is None:
        p = run_discovery(code, filename, limits)
        with _DISCOVERED_LOCK:
            _DISCOVERED[key] = p
            while len(_DISCOVERED) > 32:
                _DISCOVERED.pop(next(iter(_DISCOVERED)))
    tools = []
    for desc in p.get("functions") or []:
        schema = schema_from_description(desc)
        tools.append(SandboxedTool(schema, code, desc["name"], limits, filename=filename,
                                   source=f"{filename}:{desc.get('line')}"))
    return tools, list(p.get("skipped") or [])


def run_discovery(code: str, filename: str, limits: Any) -> dict[str, Any]:
    """Run the discovery child; its payload, or ToolLoadError."""
    request = {"mode": "discover", "code": code, "filename": filename}
    try:
        run = run_sync(run_child(request, limits, limits.discover_timeout_s))
    except OSError as e:
        raise ToolLoadError(f"could not start the sandbox: {e}") from None
    p = run.payload
    if run.timed_out:
        raise ToolLoadError(f"loading the tool code took longer than {limits.discover_timeout_s:g} s; the process was killed")
    if p is None:
        sig = run.signal_name
        why = f"killed by {sig}" if sig else f"exited with code {run.returncode}"
        tail = run.stderr.strip().splitlines()[-3:] if run.stderr else []
        raise ToolLoadError(f"loading the tool code failed: the process {why} without a result" + (": " + " | ".join(tail) if tail else ""))
    status = p.get("status")
    if status == "syntax_error":
        line = p.get("lineno")
        text = p.get("text")
        raise ToolLoadError(
            "syntax error in the tool code" + (f" at line {line}" if line else "") + f": {p.get('message')}"
            + (f"\n    {text}" if text else "")
        )
    if status == "load_error":
        line = p.get("line")
        raise ToolLoadError(
            f"the tool code raised {safe_str(p.get('type'), 100)}" + (f" at line {line}" if isinstance(line, int) else "")
            + f" while loading: {safe_str(p.get('message'), 1000)}"
        )
    if status != "ok":
        raise ToolLoadError(f"loading the tool code failed: {safe_str(p.get('message') or p, 1000)}")
    if p.get("errors"):
        raise ToolLoadError("; ".join(
            f"cannot build a schema for function '{e.get('name')}' (line {e.get('line')}): {e.get('message')}" for e in p["errors"]
        ))
    return p


def run_sync(coro) -> Any:
    """Run a coroutine to completion from synchronous code, on a helper thread with its own
    loop: works inside a running event loop too, and leaves this thread's loop alone."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-load") as ex:
        return ex.submit(asyncio.run, coro).result()
