"""Batch rollouts: many agent loops at once through one engine, written as they finish.

* One :class:`~backend.engine.AgentLoop` per item, all sharing one generator (a vLLM server
  client balances several base URLs) — or one generator per item from a factory (the scripted
  backend keeps per-run state).
* Prompts: JSONL rows ``{"id": ..., "messages": [...]}`` or ``{"id": ..., "prompt": "text"}``
  (a user message); extra keys go to the trace's ``metadata.prompt``. Rows without an id get
  ``line-N``. ``samples > 1`` runs each prompt that many times (ids ``ID#0``, ``ID#1``, ...).
* Output: our trace JSONL, appended one line per finished item and flushed, so a crash loses at
  most the items in flight. A partial last line (a crash mid-write) is cut off on resume. Or a
  folder of shards (:class:`ShardSink`): ``part-00000.jsonl``, ``part-00001.jsonl``, ... of at
  most ``shard_size`` traces, or Parquet shards in our trace layout, each written as a JSONL
  journal and converted atomically when full and at the end (:func:`convert_journal`).
* Resume: ids already in the output (every shard, and the journal) are skipped (with
  ``retry_errors``, items whose trace ended in ``error``/``generation_error`` run again and the
  new trace is written after the old one); an interrupted conversion is resolved without loss or
  duplicates.
* Failures never stop the batch: a bad prompt row or an exception escaping the loop becomes a
  trace with ``termination_reason = "error"`` and ``metadata.error`` (a model, tool or template
  failure is already a normal trace with its own termination reason).
* Progress on stderr (``tqdm``): items done/total, items/s, generated tokens/s (counted live from
  the token stream), errors, ETA; sparse plain lines when stderr is not a terminal.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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


def _last_reasons(path: str, last: dict[str, str | None]) -> int:
    """Record in ``last`` the termination reason of each id in the JSONL file ``path`` (in file
    order: a later line wins); returns the number of trace lines."""
    n = 0
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
                n += 1
    return n


def _done(last: dict[str, str | None], retry_errors: bool) -> set[str]:
    if not retry_errors:
        return set(last)
    return {k for k, v in last.items() if v not in RETRYABLE}


def done_ids(path: str, retry_errors: bool = False) -> set[str]:
    """Ids of the traces already in ``path`` (only the ``id`` and ``termination_reason`` of each
    line are read). With ``retry_errors`` an id counts as done only if its last trace did not
    end in an error."""
    last: dict[str, str | None] = {}
    if os.path.exists(path):
        _last_reasons(path, last)
    return _done(last, retry_errors)


# ---- output: one JSONL file, or a folder of shards ---------------------------------------------------

FORMATS = ("jsonl", "parquet")
DEFAULT_SHARD_SIZE = 1000
SHARD_RE = re.compile(r"^part-(\d{5,})\.(jsonl|parquet|journal\.jsonl)$")
TMP_RE = re.compile(r"^part-\d{5,}\..*\.tmp$")


def is_shard_dir(out: str, shard_size: int | None = None, fmt: str = "jsonl") -> bool:
    """Whether ``out`` names a folder of shards: it ends with a path separator, is a folder, or
    shards were asked for (``shard_size``, or the Parquet format, which only comes in shards)."""
    return out.endswith(("/", os.sep)) or os.path.isdir(out) or shard_size is not None or fmt == "parquet"


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - not every platform opens folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _parquet_last_reasons(path: str, last: dict[str, str | None]) -> int:
    """Like :func:`_last_reasons` for one of our Parquet shards (two columns read); raises
    :class:`RolloutError` when it cannot be read."""
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path, columns=["id", "termination_reason"])
    except Exception as e:
        raise RolloutError(f"shard {path} cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                           "move it out of the folder to run its items again") from None
    ids = t.column("id").to_pylist()
    for i, r in zip(ids, t.column("termination_reason").to_pylist(), strict=True):
        if isinstance(i, str):
            last[i] = r
    return len(ids)


def _journal_traces(path: str) -> list[Trace]:
    """Every trace of a journal (no size limits: these are our own lines). A line that does not
    parse cannot come from a crash (a partial last line is cut off first): it stops the run
    rather than being dropped."""
    out: list[Trace] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                out.append(Trace.from_dict(json.loads(raw)))
            except Exception as e:
                raise RolloutError(f"{path}, line {n}: not a trace ({type(e).__name__}: {e}); fix or remove the line and resume") from None
    return out


def _parquet_readable(path: str) -> list[Trace] | None:
    """The traces of a Parquet shard, or None when it is not a complete, readable trace Parquet."""
    import pyarrow.parquet as pq

    from backend.trace.io import PARQUET_KIND, trace_from_row

    try:
        t = pq.read_table(path)
        if (t.schema.metadata or {}).get(b"kind") != PARQUET_KIND:
            return None
        return [trace_from_row(r) for r in t.to_pylist()]
    except Exception:
        return None


def convert_journal(journal: str, target: str, keep: list[Trace] | None = None) -> int:
    """Turn a JSONL journal into the Parquet shard ``target``, atomically: write a temporary
    file, fsync it, rename it over ``target``, fsync the folder, then remove the journal. A crash
    at any point leaves either the journal (and maybe a temporary file, removed on resume) or the
    finished Parquet (and maybe the journal, removed on resume): nothing lost, nothing twice.
    ``keep``: traces already in ``target`` to write first (a journal found beside its Parquet)."""
    from backend.trace import write_parquet

    traces = list(keep or [])
    have = {t.id for t in traces}
    traces += [t for t in _journal_traces(journal) if t.id not in have]
    tmp = target + ".tmp"
    n = write_parquet(traces, tmp)  # itself through tmp + ".tmp", renamed onto tmp
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, target)
    folder = os.path.dirname(os.path.abspath(target))
    _fsync_dir(folder)
    os.remove(journal)
    _fsync_dir(folder)
    return n


class JsonlSink:
    """One JSONL file, appended one line per trace (flushed)."""

    def __init__(self, path: str):
        self.path = path
        self.f: TextIO | None = None
        self.files: list[str] = [path]

    def open(self, resume: bool, retry_errors: bool) -> set[str]:
        out_dir = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(out_dir):
            raise RolloutError(f"output folder does not exist: {out_dir}")
        if os.path.isdir(self.path):
            raise RolloutError(f"{self.path} is a folder")
        if resume:
            repair_partial_tail(self.path)
            return done_ids(self.path, retry_errors=retry_errors)
        open(self.path, "w").close()
        return set()

    def write(self, trace: Trace) -> None:
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")
        self.f.write(trace.to_json() + "\n")
        self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class ShardSink:
    """A folder of shards ``part-00000.jsonl``, ``part-00001.jsonl``, ... of at most
    ``shard_size`` traces each; with ``fmt="parquet"`` the open shard is a JSONL journal
    (``part-NNNNN.journal.jsonl``) converted to ``part-NNNNN.parquet`` when full and at the end
    (:func:`convert_journal`).

    On resume every shard (JSONL, Parquet, journal) is read: a partial last line is cut off,
    temporary files of an interrupted conversion are removed, a journal beside its finished
    Parquet is removed (its traces merged in if any were missing), a journal that will not be
    continued is converted; numbering continues, and the last shard is continued when it is
    still open (a JSONL shard not full, or a journal)."""

    def __init__(self, folder: str, shard_size: int = DEFAULT_SHARD_SIZE, fmt: str = "jsonl"):
        if fmt not in FORMATS:
            raise RolloutError(f"unknown output format {fmt!r} (choose {' or '.join(FORMATS)})")
        if shard_size < 1:
            raise RolloutError("shard size must be at least 1")
        self.folder = folder.rstrip("/" + os.sep) or folder
        self.shard_size = shard_size
        self.fmt = fmt
        self.index = 0  # the open shard's number
        self.count = 0  # traces in it
        self.f: TextIO | None = None
        self.files: list[str] = []  # shards written to in this run
        # Full Parquet shards are converted on one worker thread, in order, so the event loop
        # that writes traces is not blocked (~0.6 s per 1,000 traces); close() waits for them.
        self._converter: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def name(self, index: int, kind: str) -> str:
        return os.path.join(self.folder, f"part-{index:05d}.{kind}")

    def scan(self) -> dict[int, set[str]]:
        """Shard number -> the kinds present (``jsonl``, ``parquet``, ``journal.jsonl``)."""
        found: dict[int, set[str]] = {}
        for fn in os.listdir(self.folder):
            m = SHARD_RE.match(fn)
            if m:
                found.setdefault(int(m.group(1)), set()).add(m.group(2))
        return found

    def _remove_temps(self) -> None:
        for fn in os.listdir(self.folder):
            if TMP_RE.match(fn):
                os.remove(os.path.join(self.folder, fn))

    def recover(self) -> dict[int, set[str]]:
        """Resolve what a crash can leave (see the class doc); returns the shards after it."""
        self._remove_temps()
        found = self.scan()
        last = max(found, default=-1)
        for i, kinds in sorted(found.items()):
            if "jsonl" in kinds:
                repair_partial_tail(self.name(i, "jsonl"))
            if "journal.jsonl" not in kinds:
                continue
            journal = self.name(i, "journal.jsonl")
            repair_partial_tail(journal)
            if os.path.getsize(journal) == 0:  # opened, nothing written yet
                os.remove(journal)
                kinds.discard("journal.jsonl")
                continue
            if "parquet" in kinds:
                have = _parquet_readable(self.name(i, "parquet"))
                if have is None:  # a Parquet that did not finish: the journal is the truth
                    os.remove(self.name(i, "parquet"))
                    kinds.discard("parquet")
                else:
                    ids = {t.id for t in have}
                    if all(t.id in ids for t in _journal_traces(journal)):
                        os.remove(journal)  # converted; only the journal's removal was missed
                    else:
                        convert_journal(journal, self.name(i, "parquet"), keep=have)
                    kinds.discard("journal.jsonl")
                    continue
            if not (self.fmt == "parquet" and i == last and _last_reasons(journal, {}) < self.shard_size):
                # not the shard this run continues (another format, an earlier shard, or full: the
                # crash came between its last line and its conversion)
                convert_journal(journal, self.name(i, "parquet"))
                kinds.discard("journal.jsonl")
                kinds.add("parquet")
        return found

    def open(self, resume: bool, retry_errors: bool) -> set[str]:
        parent = os.path.dirname(os.path.abspath(self.folder))
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise RolloutError(f"--out {self.folder} is a file; shards go to a folder (give a new folder name, ending with /)")
        if not os.path.isdir(parent):
            raise RolloutError(f"output folder does not exist: {parent}")
        os.makedirs(self.folder, exist_ok=True)
        if not resume:
            self._remove_temps()
            for fn in os.listdir(self.folder):
                if SHARD_RE.match(fn):
                    os.remove(os.path.join(self.folder, fn))
            return set()
        found = {i: kinds for i, kinds in self.recover().items() if kinds}
        last: dict[str, str | None] = {}
        counts: dict[tuple[int, str], int] = {}
        for i, kinds in sorted(found.items()):
            for kind in sorted(kinds, key=lambda k: k != "parquet"):  # a shard's Parquet before its journal
                path = self.name(i, kind)
                counts[(i, kind)] = _parquet_last_reasons(path, last) if kind == "parquet" else _last_reasons(path, last)
        if found:
            i = max(found)
            kinds = found[i]
            open_kind = "journal.jsonl" if self.fmt == "parquet" else "jsonl"
            if kinds == {open_kind} and counts[(i, open_kind)] < self.shard_size:
                self.index, self.count = i, counts[(i, open_kind)]
            else:
                self.index, self.count = i + 1, 0
        return _done(last, retry_errors)

    def _path(self) -> str:
        return self.name(self.index, "journal.jsonl" if self.fmt == "parquet" else "jsonl")

    def write(self, trace: Trace) -> None:
        if self.f is None:
            self.f = open(self._path(), "a", encoding="utf-8")
            final = self.name(self.index, self.fmt)
            if final not in self.files:
                self.files.append(final)
        self.f.write(trace.to_json() + "\n")
        self.f.flush()
        self.count += 1
        if self.count >= self.shard_size:
            self._finish_shard()
            self.index += 1
            self.count = 0

    def _finish_shard(self, wait: bool = False) -> None:
        if self.f is None:
            return
        self.f.close()
        self.f = None
        if self.fmt != "parquet":
            return
        journal, target = self._path(), self.name(self.index, "parquet")
        if wait:
            convert_journal(journal, target)
            return
        if self._converter is None:
            self._converter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-convert")
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._check_pending()
        self._pending.append(self._converter.submit(convert_journal, journal, target))

    def _check_pending(self) -> None:
        for f in self._pending:
            if f.done() and f.exception() is not None:
                raise f.exception()  # a failed conversion stops the run (its journal is kept for resume)

    def close(self) -> None:
        try:
            self._finish_shard(wait=True)
        finally:
            if self._converter is not None:
                self._converter.shutdown(wait=True)
                self._converter = None
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()


def open_output(out: str, *, shard_size: int | None = None, fmt: str = "jsonl") -> JsonlSink | ShardSink:
    """The sink for ``--out``: one JSONL file, or a folder of shards (:func:`is_shard_dir`)."""
    if fmt not in FORMATS:
        raise RolloutError(f"unknown output format {fmt!r} (choose {' or '.join(FORMATS)})")
    if is_shard_dir(out, shard_size, fmt):
        return ShardSink(out, DEFAULT_SHARD_SIZE if shard_size is None else shard_size, fmt)
    return JsonlSink(out)


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
    files: list[str] = field(default_factory=list)  # the files written to (shards: their final names)

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


class _PlainLines:
    """A stream for tqdm off a terminal: each redraw (``\\r`` + status + padding) becomes one plain
    line, so a log file gets sparse readable lines instead of one line of carriage returns."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").rstrip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """The progress bar on a stream (stderr), drawn by ``tqdm``: items done/total, items/s,
    generated tokens/s, errors, ETA. On a terminal it is redrawn in place at most every
    ``interval_s``; otherwise (a log file, a pipe) it is a plain line at most every
    ``plain_interval_s`` (tqdm's ``mininterval``) and at the end. ``enabled=False`` draws nothing
    (tqdm's ``disable``)."""

    def __init__(self, stats: RolloutStats, stream: TextIO | None = None, interval_s: float = 0.2, enabled: bool = True,
                 plain_interval_s: float = 30.0, tty: bool | None = None):
        self.stats = stats
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.interval = interval_s if self.tty else plain_interval_s
        self.enabled = enabled
        self.bar: Any = None
        self._last = 0.0

    def start(self) -> None:
        from tqdm import tqdm

        s = self.stats
        self.bar = tqdm(
            total=s.total - s.skipped, unit="item", desc="rollout", file=self.stream if self.tty else _PlainLines(self.stream),
            mininterval=self.interval, miniters=1, disable=not self.enabled, dynamic_ncols=self.tty, ascii=not self.tty,
            leave=True, smoothing=0.1, postfix=self._postfix_text(),
        )  # drawn once here
        self._last = time.monotonic()

    def _postfix_text(self) -> str:
        s = self.stats
        el = max(s.elapsed, 1e-9)
        skipped = f", {s.skipped} done before" if s.skipped else ""
        return f"{s.generated_tokens / el:.1f} tok/s, errors {s.errors}{skipped}"

    def _postfix(self) -> None:
        self.bar.set_postfix_str(self._postfix_text(), refresh=False)

    def item_done(self) -> None:
        """One more item finished (stats already counted)."""
        if self.bar is None:
            self.start()
        if not self.enabled:
            return
        self._postfix()
        before = self.bar.last_print_n
        self.bar.update(1)  # redraws when mininterval has passed
        if self.bar.last_print_n != before:
            self._last = time.monotonic()

    def tick(self) -> None:
        """Tokens streamed (no item finished): redraw when the interval has passed, so a batch
        of long items still shows its token rate."""
        if not self.enabled or self.bar is None:
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self._postfix()
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is None:
            self.start()
        if self.enabled:
            self._postfix()
        self.bar.close()


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
    shard_size: int | None = None,
    fmt: str = "jsonl",
) -> RolloutStats:
    """Run ``items`` (skipping ids already in the output when ``resume``) with at most
    ``concurrency`` loops in flight; write each trace as it finishes: appended to the JSONL file
    ``out_path``, or to the shards in the folder ``out_path`` (:func:`open_output`)."""
    from backend.engine import AgentLoop, LoopConfig

    if (generator is None) == (make_generator is None):
        raise RolloutError("give exactly one of generator (shared) or make_generator (one per item)")
    if concurrency < 1:
        raise RolloutError("concurrency must be at least 1")
    config = config or LoopConfig()
    stats = stats or RolloutStats()
    stats.total = len(items)
    sink = open_output(out_path, shard_size=shard_size, fmt=fmt)
    done = sink.open(resume, retry_errors)
    todo = [it for it in items if it.id not in done]
    stats.skipped = len(items) - len(todo)
    stats.files = sink.files
    progress = progress or Progress(stats, enabled=False)
    progress.start()

    sem = asyncio.Semaphore(concurrency)

    def write(trace: Trace) -> None:
        sink.write(trace)
        stats.done += 1
        stats.response_tokens += len(trace.response_ids)
        tr = trace.termination_reason or "none"
        stats.termination[tr] = stats.termination.get(tr, 0) + 1
        if trace.termination_reason in RETRYABLE:
            stats.errors += 1
        if on_trace is not None:
            on_trace(trace)
        progress.item_done()

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
                    progress.tick()

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
        sink.close()
        stats.finished = time.time()
        progress.close()
    return stats
