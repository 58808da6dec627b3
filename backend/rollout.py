"""Batch rollouts: many agent loops at once through one engine, written as they finish.

* One :class:`~backend.engine.AgentLoop` per item, all sharing one generator (a vLLM server
  client balances several base URLs) — or one generator per item from a factory (the scripted
  backend keeps per-run state).
* Prompts: JSONL rows ``{"id": ..., "messages": [...]}`` or ``{"id": ..., "prompt": "text"}``
  (a user message); extra keys go to the trace's ``metadata.prompt``. Rows without an id get
  ``line-N``. ``samples > 1`` runs each prompt that many times (ids ``ID#0``, ``ID#1``, ...).
* Output: our trace JSONL, appended one line per finished item and flushed, so a crash loses at
  most the items in flight. A partial last line (a crash mid-write) is cut off on resume.
* Resume: ids already in the output are skipped (with ``retry_errors``, items whose trace ended
  in ``error``/``generation_error`` run again and the new trace is appended after the old one).
* Failures never stop the batch: a bad prompt row or an exception escaping the loop becomes a
  trace with ``termination_reason = "error"`` and ``metadata.error`` (a model, tool or template
  failure is already a normal trace with its own termination reason).
* Progress on stderr: items done/total, items/s, generated tokens/s (counted live from the
  token stream), errors, ETA.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from backend.errors import UserError
from backend.trace import Trace
from backend.trace.model import TerminationReason

ERROR = TerminationReason.ERROR
RETRYABLE = (ERROR, TerminationReason.GENERATION_ERROR)


class RolloutError(UserError):
    """A problem with the whole batch (unreadable prompts file, bad output path)."""


@dataclass
class RolloutItem:
    id: str
    messages: list[dict[str, Any]] | None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a prompt row that could not be read


def _item_from_row(row: Any, line: int) -> RolloutItem:
    if not isinstance(row, dict):
        return RolloutItem(id=f"line-{line}", messages=None, error=f"line {line}: a prompt row must be a JSON object")
    rid = row.get("id")
    rid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) else f"line-{line}"
    extra = {k: v for k, v in row.items() if k not in ("id", "messages", "prompt")}
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            return RolloutItem(id=rid, messages=None, metadata=extra, error=f"line {line}: 'messages' must be a non-empty list of {{role, content}} objects")
        return RolloutItem(id=rid, messages=msgs, metadata=extra)
    if isinstance(row.get("prompt"), str):
        return RolloutItem(id=rid, messages=[{"role": "user", "content": row["prompt"]}], metadata=extra)
    return RolloutItem(id=rid, messages=None, metadata=extra, error=f"line {line}: expected 'messages' (a list) or 'prompt' (text)")


def load_prompts(path: str, samples: int = 1) -> list[RolloutItem]:
    """Read the prompts file. Unreadable lines become items with ``error`` set (they are
    recorded as error traces, not silently dropped); duplicate ids get ``~2``, ``~3`` suffixes."""
    from backend.trace import LoadProblem, iter_jsonl_records

    if not os.path.exists(path):
        raise RolloutError(f"prompts file not found: {path}")
    if samples < 1:
        raise RolloutError("samples must be at least 1")
    items: list[RolloutItem] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        for line, rec in iter_jsonl_records(f):
            it = RolloutItem(id=f"line-{line}", messages=None, error=f"line {line}: {rec.reason}") if isinstance(rec, LoadProblem) else _item_from_row(rec, line)
            if it.id in seen:
                seen[it.id] += 1
                it.id = f"{it.id}~{seen[it.id]}"
            else:
                seen[it.id] = 1
            if samples == 1:
                items.append(it)
            else:
                for k in range(samples):
                    items.append(RolloutItem(id=f"{it.id}#{k}", messages=it.messages, metadata={**it.metadata, "sample": k}, error=it.error))
    return items


def repair_partial_tail(path: str) -> int:
    """Cut a partial last line (no trailing newline) left by a crash; returns bytes removed."""
    if not os.path.exists(path):
        return 0
    size = os.path.getsize(path)
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # find the last newline
        pos = size - 1
        chunk = 1 << 16
        cut = 0
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            k = buf.rfind(b"\n")
            if k >= 0:
                cut = start + k + 1
                break
            pos = start
        f.truncate(cut)
        return size - cut


def done_ids(path: str, retry_errors: bool = False) -> set[str]:
    """Ids of the traces already in ``path`` (only the ``id`` and ``termination_reason`` of each
    line are read). With ``retry_errors`` an id counts as done only if its last trace did not
    end in an error."""
    last: dict[str, str | None] = {}
    if not os.path.exists(path):
        return set()
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                d = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(d, dict) and isinstance(d.get("id"), str):
                last[d["id"]] = d.get("termination_reason")
    if not retry_errors:
        return set(last)
    return {k for k, v in last.items() if v not in RETRYABLE}


@dataclass
class RolloutStats:
    total: int = 0  # items in the prompts file (x samples)
    skipped: int = 0  # already in the output
    done: int = 0  # finished in this run
    errors: int = 0  # finished with termination_reason error / generation_error
    generated_tokens: int = 0
    response_tokens: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    termination: dict[str, int] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return (self.finished or time.time()) - self.started

    def to_dict(self) -> dict[str, Any]:
        el = max(self.elapsed, 1e-9)
        return {
            "total": self.total,
            "skipped": self.skipped,
            "done": self.done,
            "errors": self.errors,
            "generated_tokens": self.generated_tokens,
            "elapsed_s": round(self.elapsed, 3),
            "items_per_s": round(self.done / el, 3),
            "tokens_per_s": round(self.generated_tokens / el, 1),
            "termination": dict(self.termination),
        }


class Progress:
    """A one-line progress bar on a stream (stderr): redrawn in place on a terminal, a plain
    line every ``interval_s`` otherwise."""

    def __init__(self, stats: RolloutStats, stream: TextIO | None = None, interval_s: float = 0.2, enabled: bool = True):
        self.stats = stats
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval_s if self.tty else max(interval_s, 5.0)
        self.enabled = enabled
        self._last = 0.0

    def line(self) -> str:
        s = self.stats
        todo = s.total - s.skipped
        el = max(s.elapsed, 1e-9)
        ips = s.done / el
        tps = s.generated_tokens / el
        width = 24
        frac = s.done / todo if todo else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta = (todo - s.done) / ips if ips > 0 else None
        eta_s = f"{int(eta // 60)}m{int(eta % 60):02d}s" if eta is not None else "?"
        skipped = f" (+{s.skipped} skipped)" if s.skipped else ""
        return f"[{bar}] {s.done}/{todo}{skipped} items | {ips:.2f} items/s | {tps:.1f} tok/s | errors {s.errors} | eta {eta_s}"

    def update(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.time()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r" + self.line() + "\x1b[K")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.update(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def error_trace(item: RolloutItem, error: str, *, bundle: Any = None, config: Any = None, detail: str | None = None) -> Trace:
    meta: dict[str, Any] = {"source": "rollout", "error": error, "prompt_id": item.id}
    if item.metadata:
        meta["prompt"] = item.metadata
    if detail:
        meta["error_detail"] = detail
    kw: dict[str, Any] = {}
    if bundle is not None:
        kw["tokenizer"] = bundle.info()
    if config is not None:
        kw["config"] = config.to_dict()
    return Trace(id=item.id, messages=list(item.messages or []), termination_reason=ERROR, metadata=meta, **kw)


async def run_rollouts(
    items: list[RolloutItem],
    *,
    bundle: Any,
    out_path: str,
    generator: Any = None,
    make_generator: Callable[[RolloutItem], Any] | None = None,
    tools: Any = None,
    config: Any = None,
    concurrency: int = 8,
    resume: bool = True,
    retry_errors: bool = False,
    progress: Progress | None = None,
    stats: RolloutStats | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> RolloutStats:
    """Run ``items`` (skipping ids already in ``out_path`` when ``resume``) with at most
    ``concurrency`` loops in flight; append each trace to ``out_path`` as it finishes."""
    from backend.engine import AgentLoop, LoopConfig

    if (generator is None) == (make_generator is None):
        raise RolloutError("give exactly one of generator (shared) or make_generator (one per item)")
    if concurrency < 1:
        raise RolloutError("concurrency must be at least 1")
    config = config or LoopConfig()
    stats = stats or RolloutStats()
    stats.total = len(items)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise RolloutError(f"output folder does not exist: {out_dir}")
    if resume:
        repair_partial_tail(out_path)
        done = done_ids(out_path, retry_errors=retry_errors)
    else:
        done = set()
        open(out_path, "w").close()
    todo = [it for it in items if it.id not in done]
    stats.skipped = len(items) - len(todo)
    progress = progress or Progress(stats, enabled=False)
    progress.update(force=True)

    out = open(out_path, "a", encoding="utf-8")
    sem = asyncio.Semaphore(concurrency)

    def write(trace: Trace) -> None:
        out.write(trace.to_json())
        out.write("\n")
        out.flush()
        stats.done += 1
        stats.response_tokens += len(trace.response_ids)
        tr = trace.termination_reason or "none"
        stats.termination[tr] = stats.termination.get(tr, 0) + 1
        if trace.termination_reason in RETRYABLE:
            stats.errors += 1
        if on_trace is not None:
            on_trace(trace)
        progress.update()

    async def one(item: RolloutItem) -> None:
        async with sem:
            if item.error is not None or item.messages is None:
                write(error_trace(item, item.error or "no messages", bundle=bundle, config=config))
                return
            gen = None
            streamed = [0]

            def on_event(ev) -> None:
                if ev.kind == "tokens":
                    streamed[0] += len(ev.token_ids)
                    stats.generated_tokens += len(ev.token_ids)
                    progress.update()

            try:
                gen = generator if generator is not None else make_generator(item)
                loop = AgentLoop(gen, bundle, tools=tools, config=config)
                meta = {"prompt_id": item.id, "source": "rollout"}
                if item.metadata:
                    meta["prompt"] = item.metadata
                trace = await loop.run(item.messages, trace_id=item.id, metadata=meta, on_event=on_event)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug or a bad item must not stop the batch
                trace = error_trace(item, f"{type(e).__name__}: {e}", bundle=bundle, config=config, detail=traceback.format_exc(limit=8))
            finally:
                if make_generator is not None and gen is not None:
                    try:
                        await gen.close()
                    except Exception:
                        pass
            # generators that do not stream: count the generated (mask 1) tokens at the end
            stats.generated_tokens += max(0, sum(trace.response_mask) - streamed[0])
            write(trace)

    try:
        await asyncio.gather(*(one(it) for it in todo))
    finally:
        out.close()
        stats.finished = time.time()
        progress.close()
    return stats
