"""The limits that bound what a trace file may cost, and the problems a file's records report.

Kept apart from :mod:`backend.trace.io` so that :mod:`backend.trace.parquet_guard` (which
:mod:`backend.trace.io` reads Parquet through) can use them without an import cycle. Everything
here is re-exported by :mod:`backend.trace.io` and :mod:`backend.trace`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from backend.errors import UserError
from backend.trace.model import Trace

# ---- files ---------------------------------------------------------------------------------
DEFAULT_MAX_FILE_BYTES = int(os.environ.get("ALI_MAX_TRACE_FILE_BYTES", 1 << 30))  # 1 GiB
DEFAULT_MAX_LINE_BYTES = int(os.environ.get("ALI_MAX_TRACE_LINE_BYTES", 64 << 20))  # 64 MiB

# Byte limits do not bound a Parquet file: its list columns are compressed, and a 16 KB file can
# hold a list of 5·10⁷ token ids (2.7 GB of peak memory once read). These two count values
# instead (backend/trace/parquet_guard.py checks them from the footer and in its capped worker,
# before any row reaches this process); both are read from the
# environment at each call (max_trace_tokens / max_file_values), as are the text limits below.
#
# ALI_MAX_TRACE_TOKENS: token ids in one trace (prompt_ids + response_ids). 4,000,000 is four times
# a 1M-token context window; one such trace is ~250 MB once loaded (see below).
DEFAULT_MAX_TRACE_TOKENS = 4_000_000
# ALI_MAX_FILE_VALUES: list elements (token ids, mask bits, logprobs, the items of other tools'
# list columns) decoded from one Parquet file in total. A loaded token id costs its list slot
# (8 bytes) and, above 256, its own int object (32 bytes), plus what the allocators keep of the
# decoding: measured on our layout, 8.2M distinct ids (prompt only, the worst case) raise the peak
# by 0.51 GB, and 16M elements of 8k-prompt/4k-response traces (mask bits are shared small ints)
# by 0.65 GB, so 16M could reach ~1 GB. 8,000,000 keeps a file at ~0.5 GB at worst (~500 traces
# of 8k + 4k tokens); the decoding itself is 8 bytes a value, one row group at a time.
DEFAULT_MAX_FILE_VALUES = 8_000_000
# The bytes of string and binary columns (our layout's JSON columns) are bounded the same way: a
# 300 MB JSON string compresses to a 14 KB Parquet file, and a dictionary page holding one large
# value that every row refers to is decoded into one copy per row. parquet_guard counts the text
# its rows decode to (strings read as dictionaries, in its capped worker) before sending them.
#
# ALI_MAX_TRACE_TEXT_BYTES: the text of one trace (all its string columns together). The default
# is the JSONL line limit (ALI_MAX_TRACE_LINE_BYTES, 64 MiB): a trace too long for one line of a
# JSONL file is too long for one row of a Parquet file.
# ALI_MAX_FILE_TEXT_BYTES: the text decoded from one Parquet file in total (string and binary
# values). Loaded, a byte of text costs about two (the Python strings and what is parsed from the
# JSON): measured on our layout, 55,000 traces of ~4.4 KB (240 MB of text) raise the peak by
# 0.50 GB, so 256 MiB keeps a file's traces at ~0.55 GB, well under 1 GB. Text with one character
# outside the BMP is stored by Python in 4 bytes a character (measured: 2.3 bytes more a byte), and
# JSON of tiny objects expands far more, as in a JSONL file: this bounds the text, not what JSON
# parses it into.
DEFAULT_MAX_FILE_TEXT_BYTES = 256 << 20


def _env_count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TraceFileError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise TraceFileError(f"{name}={raw!r}: the limit must be at least 1")
    return value


def max_trace_tokens() -> int:
    """Most token ids (prompt_ids + response_ids) one trace read from a file may have:
    ``ALI_MAX_TRACE_TOKENS``, default :data:`DEFAULT_MAX_TRACE_TOKENS`."""
    return _env_count("ALI_MAX_TRACE_TOKENS", DEFAULT_MAX_TRACE_TOKENS)


def max_file_values() -> int:
    """Most list elements decoded from one Parquet file: ``ALI_MAX_FILE_VALUES``, default
    :data:`DEFAULT_MAX_FILE_VALUES`."""
    return _env_count("ALI_MAX_FILE_VALUES", DEFAULT_MAX_FILE_VALUES)


def max_trace_text_bytes() -> int:
    """Most bytes of text (string and binary values) one trace read from a Parquet file may have:
    ``ALI_MAX_TRACE_TEXT_BYTES``, default the JSONL line limit (:data:`DEFAULT_MAX_LINE_BYTES`)."""
    return _env_count("ALI_MAX_TRACE_TEXT_BYTES", DEFAULT_MAX_LINE_BYTES)


def max_file_text_bytes() -> int:
    """Most bytes of text decoded from one Parquet file: ``ALI_MAX_FILE_TEXT_BYTES``, default
    :data:`DEFAULT_MAX_FILE_TEXT_BYTES`."""
    return _env_count("ALI_MAX_FILE_TEXT_BYTES", DEFAULT_MAX_FILE_TEXT_BYTES)


# A minimal trace line ({"format_version": 1, "id": "x"}) is 30 bytes of JSON and ~2 KB as a
# Trace: a 200 MB upload of them would be ~13 GB. At most this many traces are read from one
# file (~200 MB for minimal ones; a real trace's memory is bounded by its bytes and tokens)
DEFAULT_MAX_TRACES_PER_FILE = 100_000
# bad records listed one by one; past this they are counted (a file of 10^8 bad lines must not
# become 10^8 problem objects)
DEFAULT_MAX_LISTED_PROBLEMS = 10_000


def max_traces_per_file() -> int:
    """Most traces read from one file: ``ALI_MAX_TRACES_PER_FILE``, default
    :data:`DEFAULT_MAX_TRACES_PER_FILE`; the rest of the file is reported as not read."""
    return _env_count("ALI_MAX_TRACES_PER_FILE", DEFAULT_MAX_TRACES_PER_FILE)


def max_listed_problems() -> int:
    """Most bad records listed one by one: ``ALI_MAX_LISTED_PROBLEMS``, default
    :data:`DEFAULT_MAX_LISTED_PROBLEMS`; the others are counted."""
    return _env_count("ALI_MAX_LISTED_PROBLEMS", DEFAULT_MAX_LISTED_PROBLEMS)


# A trace set (backend/trace/catalog.py: a folder or glob indexed, its traces never held) is bounded
# by rows and files instead of the two limits above. A row of the index costs ~0.5 KB in memory
# (its summary: id, preview of up to 200 characters, counts; measured in bench/bench_trace_index.py),
# so 4,000,000 rows (~10 GB of typical traces) stay near 2 GB.
DEFAULT_MAX_INDEX_ROWS = 4_000_000
DEFAULT_MAX_INDEX_FILES = 100_000


def max_index_rows() -> int:
    """Most traces one trace set indexes: ``ALI_MAX_INDEX_ROWS``, default :data:`DEFAULT_MAX_INDEX_ROWS`;
    the rest is reported as not indexed."""
    return _env_count("ALI_MAX_INDEX_ROWS", DEFAULT_MAX_INDEX_ROWS)


def max_index_files() -> int:
    """Most files one trace set indexes: ``ALI_MAX_INDEX_FILES``, default :data:`DEFAULT_MAX_INDEX_FILES`."""
    return _env_count("ALI_MAX_INDEX_FILES", DEFAULT_MAX_INDEX_FILES)


def too_many_tokens(n: int, where: str = "prompt_ids + response_ids") -> str | None:
    """The reason a trace of ``n`` token ids is refused, or None when it is within
    :func:`max_trace_tokens`."""
    limit = max_trace_tokens()
    if n <= limit:
        return None
    return f"{n:,} token ids in {where}; the limit is {limit:,} (ALI_MAX_TRACE_TOKENS)"


def record_tokens_problem(rec: Any) -> str | None:
    """:func:`too_many_tokens` for a parsed record (a dict with ``prompt_ids`` / ``response_ids``
    lists), checked before it becomes a :class:`Trace`."""
    if not isinstance(rec, dict):
        return None
    n = 0
    for key in ("prompt_ids", "response_ids"):
        v = rec.get(key)
        if isinstance(v, list):
            n += len(v)
    return too_many_tokens(n)


def not_read(at: int, unit: str, max_traces: int) -> LoadProblem:
    """The problem that says the rest of a file, from record ``at`` on, is not read (the trace limit)."""
    return LoadProblem(at, f"{unit} {at:,} and after not read: at most {max_traces:,} traces are read from one file "
                           "(ALI_MAX_TRACES_PER_FILE)")


@dataclass
class LoadProblem:
    line: int  # 1-based line number (or record index for JSON lists)
    reason: str


class ProblemList(list):
    """Bad records: the first :func:`max_listed_problems` listed, the rest only counted
    (``unlisted``), so a file of millions of bad lines stays small in memory."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cap = max_listed_problems()
        self.unlisted = 0

    def append(self, p: LoadProblem, *, force: bool = False) -> None:  # type: ignore[override]
        if force or len(self) < self.cap:
            super().append(p)
        else:
            self.unlisted += 1

    @property
    def total(self) -> int:
        return len(self) + self.unlisted


@dataclass
class LoadResult:
    traces: list[Trace] = field(default_factory=list)
    problems: list[LoadProblem] = field(default_factory=ProblemList)
    lines: list[int] = field(default_factory=list)  # source line of each trace
    max_traces: int = field(default_factory=max_traces_per_file, repr=False)

    @property
    def problem_count(self) -> int:
        """Every bad record, listed or not."""
        return len(self.problems) + getattr(self.problems, "unlisted", 0)

    @property
    def full(self) -> bool:
        return len(self.traces) >= self.max_traces

    def stop_reading(self, at: int, unit: str = "line") -> None:
        """Report that the rest of the file, from ``at`` on, is not read (the trace limit)."""
        p = not_read(at, unit, self.max_traces)
        if isinstance(self.problems, ProblemList):
            self.problems.append(p, force=True)
        else:
            self.problems.append(p)

    def take(self, n: int, item: Trace | LoadProblem, unit: str = "line") -> bool:
        """Add one record's trace or problem; False (and the rest of the file reported as not
        read, from ``n`` on) once :attr:`full`."""
        if self.full:
            self.stop_reading(n, unit)
            return False
        if isinstance(item, LoadProblem):
            self.problems.append(item)
        else:
            self.traces.append(item)
            self.lines.append(n)
        return True

    def summary(self) -> str:
        s = f"{len(self.traces)} trace(s) loaded"
        n = self.problem_count
        if n:
            s += f", {n} bad record(s)"
            if n > len(self.problems):
                s += f" ({len(self.problems)} listed)"
        return s


class TraceFileError(UserError):
    """The file as a whole cannot be read (too big, not text, ...)."""


def human_bytes(n: int) -> str:
    """``1536`` → ``"1.5 KB"``; exact below 1 KB (a small configured limit reads as what it is)."""
    if n < 1000:
        return f"{n} bytes"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n} bytes"  # pragma: no cover


def line_too_long(n: int, max_line_bytes: int) -> str:
    return (f"line is longer than the {human_bytes(max_line_bytes)} line limit ({human_bytes(n)}); skipped "
            "(set ALI_MAX_TRACE_LINE_BYTES to raise it)")


def check_file_size(path: str, max_bytes: int) -> int:
    size = os.path.getsize(path)
    if size > max_bytes:
        raise TraceFileError(
            f"{os.path.basename(path)} is {human_bytes(size)}, over the {human_bytes(max_bytes)} limit for trace files "
            "(set ALI_MAX_TRACE_FILE_BYTES to raise it)"
        )
    return size


