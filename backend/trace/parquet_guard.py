"""Rows of a Parquet file of unknown origin: its footer checked here, its pages decoded in a worker
process under a memory cap and a time limit.

Every reader of Parquet rows goes through :func:`iter_parquet_rows`: our own layout
(:func:`backend.trace.io.read_parquet_traces`) and other tools' files (:mod:`backend.importers`),
as :func:`backend.trace.io.iter_records` reads them.

Why: list and string columns are compressed, and Parquet's encodings repeat values. A 655-byte file
holds one row of 5·10⁷ token ids (reading a 16 KB one with ``iter_batches`` + ``to_pylist`` raised
the process's peak memory by 2.7 GB), a 13 KB file one 300 MB string (+1.5 GB once read), a
dictionary page one 20 MB value that 100 rows refer to (decoded into one copy per row: +5 GB). The
byte limits on files do not see that, and a footer is only a claim: pyarrow decodes what the pages
hold (a footer edited to say 3,000,000 values over a page of 5·10⁷ still decodes all 5·10⁷, ~1 GB).

**1. The footer, in this process** (pyarrow's metadata: row groups, each column chunk's
``num_values`` and sizes; nothing is decoded). An honest footer is exact about list values, so
these verdicts are the ones decoding would give, without the cost:

* a row group whose footer contradicts itself (a column that is not a list, with a number of values
  other than its rows) is reported and skipped;
* a one-row row group with more values in a list column than :func:`~backend.trace.max_trace_tokens`
  (or more token ids in ``prompt_ids`` + ``response_ids``; a token list of 2+ values holds that many
  ids, one value is 0 or 1 id) is reported with its row number and not decoded; the other rows load;
* each row group's list values are charged to :func:`~backend.trace.max_file_values` for the file; a
  row group that does not fit in what is left stops the reading, and one problem says which rows were
  not read and why. Rows of one row group cannot be measured one by one without decoding them all
  (pyarrow cannot read only a list column's lengths: ``iter_batches(batch_size=1)`` over a row of
  5·10⁷ ids costs 1.1 GB), so a row group is the unit that is read or not;
* text (string and binary columns): a column chunk's uncompressed size is about its text in an honest
  file (a few bytes a value above it for PLAIN pages, below it where a dictionary repeats values).
  Where that passes :data:`FOOTER_TEXT_BYTES` and what is left of
  :func:`~backend.trace.max_trace_text_bytes` (one-row row groups) or of
  :func:`~backend.trace.max_file_text_bytes` (the file), the rows are refused from the footer, so a
  huge honest row is not decoded at all; below it the worker counts the text exactly (2.).

**2. The worker** (a pool of ``ALI_PARQUET_WORKERS`` processes, :class:`backend.runtime.worker_pool.WorkerPool`,
as :mod:`backend.tokens.template_guard` renders templates) decodes one row group at a time:

* strings are read as dictionaries (pyarrow's ``read_dictionary``; not those of DELTA encodings,
  which pyarrow cannot read so, and which the cap then bounds), so a value the pages repeat is held
  once; a row's text is the bytes of the values it refers to (what its Python strings will
  cost) and a row group's is at least its dictionaries' (pyarrow decodes a dictionary whole: an
  Arrow dictionary written with entries no row refers to counts too, and so does a one-row row
  group's row);
* the footer is checked against what was decoded: a list column whose pages hold more values than
  its footer said is a problem for those rows (``the file's footer says 3,000,000 values, its pages
  hold 5,000,000``), so the file's budget above, charged from the footer, holds;
* a row group whose text passes what is left of :func:`~backend.trace.max_file_text_bytes` stops the
  reading as in 1.; then each row is checked against the per-trace limits from the Arrow offsets and
  lengths, before any Python object is made; the file's budget is charged with the row group's text;
* the rows that pass come back as Arrow IPC (one stream per row group, batches of
  :data:`BATCH_ROWS` rows, strings still as dictionaries: less to copy), and this process makes
  the Python rows of one batch at a time, their strings decoded first (bounded: counted as such).
  The next row group is decoded while this process hands out the rows of the one before.

A footer can lie, and then what bounds the decoding is the worker's cap: an address space of
``ALI_PARQUET_MEMORY_BYTES`` (default 2 GiB; ``RLIMIT_AS``, about 0.35 GiB of it taken by Python
and pyarrow) and ``ALI_PARQUET_TIMEOUT_S`` seconds (default 30) for each row group, counted while
this process waits for it. A worker that passes the cap (``ArrowMemoryError``, or killed) makes one
problem for that row group's rows (``rows 2–101 not read: decoding row group 2 (of 3) needs more than
the 2,048 MiB memory limit of the Parquet worker (ALI_PARQUET_MEMORY_BYTES)``) and is replaced; one
that overruns its time is killed and replaced; pyarrow's error on damaged bytes is a problem for
those rows, and a crash of pyarrow is the worker's, not the app's (a worker that dies is replaced
and the row group tried once more: it may have died before it was asked). The rest of the file still loads,
until :data:`MAX_FAILURES` row groups of one file have failed so (each costs a worker's start).
Raising ``ALI_MAX_FILE_TEXT_BYTES`` or ``ALI_MAX_FILE_VALUES`` far above their defaults may need a
larger cap: a row group is decoded whole, then written out for this process.

Settings (environment, read at import as :mod:`backend.tokens.template_guard`'s): ``ALI_PARQUET_MEMORY_BYTES``
(default 2 GiB), ``ALI_PARQUET_TIMEOUT_S`` (30), ``ALI_PARQUET_WORKERS`` (2: files read at once;
a file holds a worker while one of its row groups is decoded and handed out),
``ALI_PARQUET_START_TIMEOUT_S`` (60: a worker's start-up, not charged to
a file), ``ALI_PARQUET_QUEUE_TIMEOUT_S`` (30: how long a file waits for a free worker before it is
refused: "all 2 Parquet workers are busy; try again"). A worker starts with the first Parquet file
read (not at import), another when every one is busy, and they are closed with the app (:func:`backend.runtime.worker_pool.close_all`). They
are started with ``spawn``: a script that reads Parquet files keeps its top-level code under
``if __name__ == "__main__":``, as every multiprocessing program must.

Where ``RLIMIT_AS`` is not enforced (macOS) the worker watches its own peak resident memory every
50 ms and ends itself past the cap (:mod:`backend.runtime.worker_pool`): the cap holds, give or take what it
allocates between two looks, and such a row group is reported as over the memory limit. Without
Python's ``resource`` module (Windows) there is no memory cap; the time limit still applies.

Why every file is decoded in the worker, even a small one of our own: no figure of the footer bounds
what decoding costs. The file's byte size is the one thing a footer cannot lie about, but encodings
multiply it without bound: one run of the RLE / bit-packed hybrid repeats a dictionary index (or a
level) 2³¹ times in a few bytes, DELTA_BYTE_ARRAY repeats a prefix, and a codec multiplies again (the
655-byte file above is 400 MB of int64 once decoded). A safe bound needs the page headers and bodies
read, which is what the hand-written Thrift and page reader this module replaced did (957 lines),
and pyarrow has no memory pool with a cap to decode under in this process. What the worker costs on
our own files (measured on 2 shared cores at load 4-8, ``load_any`` of 1,947 engine-made traces and of
4,000 traces of 20 KB messages, old and new alternated 11 times): this process's CPU time 10-20 %
lower (it no longer decodes), the worker's 0.07 / 0.25 s on top, wall time within the noise (median
of the paired ratios 1.01 / 1.04), this process's peak memory 68 MiB lower; the first file also waits
for a worker's start (~1.5 s: Python, pyarrow and a warm-up). The row groups come back through an
anonymous memory file on Linux (:func:`backend.runtime.worker_pool.send_raw`): 100 MB received through the
pipe cost this process 80 ms of CPU (60 ms read straight into a buffer), mapped 6 ms.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from backend.runtime.worker_pool import OVER_MEMORY_EXIT, Lost, Overrun, WorkerPool, send_raw
from backend.trace.limits import (
    LoadProblem,
    TraceFileError,
    human_bytes,
    max_file_text_bytes,
    max_file_values,
    max_trace_text_bytes,
    max_trace_tokens,
    too_many_tokens,
)

TOKEN_COLUMNS = ("prompt_ids", "response_ids")  # the token ids of a trace, in our layout and in verl's
BATCH_ROWS = 256
# Text the footer's sizes refuse without decoding (above the limits): below this the worker decodes
# it and counts it exactly, above it a decode is large and the footer's figure close enough
FOOTER_TEXT_BYTES = 64 << 20
MAX_FAILURES = 3  # row groups of one file over the worker's memory or time, or crashing it

MEMORY_BYTES = int(os.environ.get("ALI_PARQUET_MEMORY_BYTES", str(2 << 30)))
TIMEOUT_S = float(os.environ.get("ALI_PARQUET_TIMEOUT_S", "30"))
WORKERS = max(1, int(os.environ.get("ALI_PARQUET_WORKERS", "2")))
START_TIMEOUT_S = float(os.environ.get("ALI_PARQUET_START_TIMEOUT_S", "60"))
QUEUE_TIMEOUT_S = float(os.environ.get("ALI_PARQUET_QUEUE_TIMEOUT_S", "30"))

_SIGKILL = -9


class ParquetWorkerError(RuntimeError):
    """No Parquet worker could be had: none started, all busy, or the pool was shut down."""


# ---- Arrow arrays, measured from their offsets and lengths (in the worker) --------------------------


def _leaves(t: Any) -> int:
    """How many Parquet leaf columns an Arrow type is stored as."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(t.value_type)
    return 1


def _offsets(arr: Any) -> Any:
    import numpy as np

    return arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)


def _entries(arr: Any) -> Any:
    """A map array as the list array of its entries (structs of key and value)."""
    import pyarrow as pa

    return pa.ListArray.from_arrays(arr.offsets, arr.values)


def _list_lengths(arr: Any) -> Any:
    """Per row of a list array: its length (0 for a null list)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_fixed_size_list(arr.type):
        return np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, arr.type.list_size)
    lengths = np.diff(_offsets(arr))
    if arr.null_count:
        lengths[arr.is_null().to_numpy(zero_copy_only=False)] = 0
    return lengths


def _row_values(arr: Any) -> Any:
    """Per row of an Arrow array, its values as the per-trace limit counts them (the longest of its
    Parquet leaves; an empty or null list is one value), as a numpy int64 array."""
    import numpy as np
    import pyarrow as pa

    t = arr.type
    if pa.types.is_map(t):
        arr = _entries(arr)
        t = arr.type
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        if not pa.types.is_nested(t.value_type):
            return np.full(len(arr), max(size, 1), dtype=np.int64)
        inner = _row_values(arr.values.slice(arr.offset * size, len(arr) * size))
        return np.maximum(inner.reshape(len(arr), size).sum(axis=1), 1)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = _offsets(arr)
        if pa.types.is_nested(t.value_type):
            inner = np.concatenate(([0], np.cumsum(_row_values(arr.values))))
            sums = inner[offsets[1:]] - inner[offsets[:-1]]
        else:
            sums = np.diff(offsets)
        return np.maximum(sums, 1)
    if pa.types.is_struct(t) and t.num_fields:
        return np.maximum.reduce([_row_values(c) for c in arr.flatten()])
    return np.ones(len(arr), dtype=np.int64)


def _slots(arr: Any) -> Any:
    """Per row of an Arrow array, the values all its Parquet leaves hold for it together (what the
    footer's ``num_values`` count: an empty or null list holds one in each leaf under it)."""
    import numpy as np
    import pyarrow as pa

    t = arr.type
    if pa.types.is_map(t):
        arr = _entries(arr)
        t = arr.type
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        inner = _slots(arr.values.slice(arr.offset * size, len(arr) * size))
        sums = inner.reshape(len(arr), size).sum(axis=1) if size else np.zeros(len(arr), np.int64)
        return np.where(_list_lengths(arr) > 0, sums, _leaves(t.value_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = _list_lengths(arr)
        if not pa.types.is_nested(t.value_type):  # one leaf, a value an element
            return np.maximum(lengths, 1)
        offsets = _offsets(arr)
        inner = np.concatenate(([0], np.cumsum(_slots(arr.values))))
        return np.where(lengths > 0, inner[offsets[1:]] - inner[offsets[:-1]], _leaves(t.value_type))
    if pa.types.is_struct(t):
        if not t.num_fields:
            return np.zeros(len(arr), dtype=np.int64)
        return np.sum([_slots(c) for c in arr.flatten()], axis=0).astype(np.int64)
    return np.ones(len(arr), dtype=np.int64)


def _row_text(arr: Any) -> Any:
    """Per row of an Arrow array, the bytes of the strings (and binary values) in it, as a numpy
    int64 array (a dictionary's values counted where rows refer to them). Read from the offsets
    and lengths: no copy of the values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_dictionary(t):
        lengths = np.append(_row_text(arr.dictionary), 0)
        idx = pc.fill_null(arr.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        out = lengths[np.clip(idx, 0, len(lengths) - 1)]
        if arr.null_count:
            out[arr.is_null().to_numpy(zero_copy_only=False)] = 0
        return out
    if pa.types.is_fixed_size_binary(t):
        return np.where(arr.is_valid().to_numpy(zero_copy_only=False), t.byte_width, 0).astype(np.int64)
    if (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_string_view(t) or pa.types.is_binary_view(t)):
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_map(t):
        arr = _entries(arr)
        t = arr.type
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        inner = _row_text(arr.values.slice(arr.offset * size, len(arr) * size))
        return inner.reshape(len(arr), size).sum(axis=1) if size else np.zeros(len(arr), np.int64)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        sums = np.concatenate(([0], np.cumsum(_row_text(arr.values))))
        offsets = _offsets(arr)
        return sums[offsets[1:]] - sums[offsets[:-1]]
    if pa.types.is_struct(t) and t.num_fields:
        return np.sum([_row_text(c) for c in arr.flatten()], axis=0).astype(np.int64)
    return np.zeros(len(arr), dtype=np.int64)


def _dictionary_text(arr: Any) -> int:
    """The bytes of the dictionaries in an Arrow array (decoded whole, whichever entries rows use)."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_dictionary(t):
        return int(_row_text(arr.dictionary).sum())
    if pa.types.is_struct(t):
        return sum(_dictionary_text(arr.field(i)) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _dictionary_text(_entries(arr).values)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _dictionary_text(arr.values)
    return 0


def _per_row(measure: Any, column: Any) -> Any:
    """``measure`` (one of the above) over the chunks of a column, as one numpy array."""
    import numpy as np

    parts = [measure(chunk) for chunk in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---- the worker -----------------------------------------------------------------------------------


@dataclass
class _File:
    """What a worker keeps of a file between its row groups (not the open file: an upload's
    temporary file must be freed when it is deleted)."""

    metadata: Any
    schema: Any  # the Arrow schema as pyarrow reads the file
    strings: list[tuple[int, str]]  # the string leaves: (column index, path)


def _setup() -> Any:  # in the worker, before it says ready
    import pyarrow as pa
    import pyarrow.parquet as pq

    # warm-up: a small file through every step, so that the first file's time limit covers only
    # its own work (the codecs' and kernels' first use costs ~0.3 s)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"s": ["a", "b", "a"], "ids": [[1, 2], [], None]}), sink, compression="zstd")
    with pq.ParquetFile(pa.BufferReader(sink.getvalue()), read_dictionary=["s"]) as pf:
        table = pf.read_row_group(0, use_threads=False)
    _per_row(_row_text, table.column("s")), _per_row(_slots, table.column("ids")), _dictionary_text(table.column("s").chunk(0))
    with pa.ipc.new_stream(pa.BufferOutputStream(), table.schema) as w:
        w.write_table(table)
    return functools.partial(_answer, files={})


def _answer(conn: Any, req: dict[str, Any], files: dict[tuple, _File]) -> None:
    try:
        head, body = _decode(req, files)
    except MemoryError:  # ArrowMemoryError too: over the cap
        files.clear()
        conn.send(("memory",))
        return
    except Exception as e:  # noqa: BLE001 - damaged bytes: pyarrow's error goes back as text
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        conn.send(("error", msg[:400]))
        return
    if body is None:
        conn.send(head)
    else:
        conn.send((*head, body.size))
        send_raw(conn, body)


def _file(path: str, stamp: tuple[int, int], files: dict[tuple, _File]) -> _File:
    import pyarrow.parquet as pq

    key = (path, stamp)
    if key in files:
        return files[key]
    st = os.stat(path)
    if (st.st_size, st.st_mtime_ns) != stamp:
        raise ValueError("the file changed while it was read")
    with pq.ParquetFile(path) as pf:
        schema = pf.schema
        strings = [(j, schema.column(j).path) for j in range(len(schema)) if schema.column(j).physical_type == "BYTE_ARRAY"
                   and schema.column(j).logical_type.type in ("STRING", "NONE", "ENUM")]
        f = _File(pf.metadata, pf.schema_arrow, strings)
    while len(files) >= 4:
        files.pop(next(iter(files)))
    files[key] = f
    return f


_NO_DICTIONARY = {"DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"}  # pyarrow cannot read these as dictionaries


def _read(path: str, f: _File, g: int) -> Any:
    """Row group ``g``, its strings as dictionaries where pyarrow can read them so."""
    import pyarrow.parquet as pq

    rg = f.metadata.row_group(g)
    leaves = [p for j, p in f.strings if not _NO_DICTIONARY & set(rg.column(j).encodings)]
    if leaves:
        try:
            with pq.ParquetFile(path, metadata=f.metadata, read_dictionary=leaves) as pf:
                return pf.read_row_group(g, use_threads=False)
        except OSError as e:  # an encoding the footer did not list
            if not str(e).startswith("Not yet implemented"):
                raise
    with pq.ParquetFile(path, metadata=f.metadata) as pf:
        return pf.read_row_group(g, use_threads=False)


def _plain(table: Any, schema: Any) -> Any:
    """The columns the worker read as dictionaries, back to the types pyarrow reads (bounded: their
    text was counted as it is once decoded)."""
    for i, want in enumerate(schema):
        if i < table.num_columns and table.schema.field(i).type != want.type:
            try:
                table = table.set_column(i, want, table.column(i).cast(want.type))
            except Exception:  # noqa: BLE001 - a type pyarrow does not cast: sent as it is (same Python values)
                pass
    return table


def _decode(req: dict[str, Any], files: dict[tuple, _File]) -> tuple[tuple, Any]:
    """Row group ``req["g"]`` of the file: checked (the footer's claims, the file's text budget, each
    row's limits), then the rows that pass as one Arrow IPC stream."""
    import numpy as np
    import pyarrow as pa

    f = _file(req["path"], req["stamp"], files)
    table = _read(req["path"], f, req["g"])
    nrows = table.num_rows
    names = set(table.column_names)
    for owner, claimed in req["claims"].items():
        got = int(_per_row(_slots, table.column(owner)).sum()) if owner in names else 0
        if got > claimed:
            return ("lie", owner, claimed, got), None
    texts = {c: _per_row(_row_text, table.column(c)) for c in req["text_columns"] if c in names}
    floors = {c: sum(_dictionary_text(chunk) for chunk in table.column(c).chunks) for c in texts}
    charged = sum(max(int(v.sum()), floors[c]) for c, v in texts.items())
    if charged > req["text_left"]:
        return ("over", charged), None
    if nrows == 1:  # its row is decoded with its dictionaries whole
        texts = {c: np.array([max(int(v.sum()), floors[c])], dtype=np.int64) for c, v in texts.items()}
    token_lists = req["token_lists"]
    counts = {c: _per_row(_list_lengths if c in token_lists else _row_values, table.column(c))
              for c in req["list_columns"] if c in names}
    over = np.zeros(nrows, dtype=bool)
    if counts:
        over |= np.maximum.reduce(list(counts.values())) > req["row_tokens"]
        if any(c in counts for c in token_lists):
            over |= sum(counts[c] for c in token_lists if c in counts) > req["row_tokens"]
    if texts:
        over |= sum(texts.values()) > req["row_text"]
    refused = [(i, {c: int(v[i]) for c, v in counts.items()}, {c: int(v[i]) for c, v in texts.items()})
               for i in np.flatnonzero(over).tolist()]
    kept = table.filter(pa.array(~over)) if refused else table
    del table
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, kept.schema) as w:
        w.write_table(kept, max_chunksize=req["batch_rows"])
    return ("rows", refused, charged), sink.getvalue()


class ParquetPool(WorkerPool):
    """The Parquet workers (:class:`backend.runtime.worker_pool.WorkerPool`; settings in the module's docstring)."""

    def __init__(self, size: int = WORKERS, *, timeout_s: float = TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S, memory_bytes: int = MEMORY_BYTES) -> None:
        super().__init__(size, kind="parquet", noun="Parquet worker", service="Parquet reader", error=ParquetWorkerError,
                         setup=_setup, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                         queue_timeout_s=queue_timeout_s, memory_bytes=memory_bytes, lazy=True)


POOL = ParquetPool()  # started by the first file read; closed at exit and at the app's shutdown


# ---- this process: the footer, and the rows handed out ----------------------------------------------


def _leaf_owners(pf: Any) -> list[str]:
    """The top-level column each leaf column (in file order) belongs to."""
    schema = pf.schema_arrow
    owners: list[str] = []
    for field in schema:
        owners += [field.name] * _leaves(field.type)
    if len(owners) == pf.metadata.num_columns:
        return owners
    names = schema.names  # an Arrow type stored unusually: the first name the leaf's path starts with
    out = []
    for j in range(pf.metadata.num_columns):
        path = pf.schema.column(j).path
        out.append(next((n for n in names if path == n or path.startswith(n + ".")), path.split(".")[0]))
    return out


def _flat_list(t: Any) -> bool:
    import pyarrow as pa

    listy = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return listy and not pa.types.is_nested(t.value_type)


def _row_too_big(counts: dict[str, int], token_columns: Sequence[str]) -> str | None:
    """Why a row with ``counts`` values per list column is refused, or None."""
    limit = max_trace_tokens()
    for name, n in sorted(counts.items(), key=lambda kv: (kv[0] not in token_columns, -kv[1])):
        if n > limit:
            what = "token ids" if name in token_columns else "values"
            return f"{n:,} {what} in column {name}; the limit is {limit:,} (ALI_MAX_TRACE_TOKENS)"
    present = [c for c in token_columns if c in counts]
    if len(present) > 1:
        return too_many_tokens(sum(counts[c] for c in present), "columns " + " + ".join(present))
    return None


def _text_too_big(per_column: dict[str, int]) -> str | None:
    """Why a row with ``per_column`` bytes of text per column is refused, or None. The columns
    named are the largest that hold nine tenths of it (three at most)."""
    limit = max_trace_text_bytes()
    total = sum(per_column.values())
    if total <= limit:
        return None
    names: list[str] = []
    held = 0
    for name, n in sorted(per_column.items(), key=lambda kv: -kv[1]):
        if held >= 0.9 * total:
            break
        if len(names) == 3:
            names.append("…")
            break
        names.append(name)
        held += n
    where = f"column {names[0]}" if len(names) == 1 else "columns " + " + ".join(names)
    return f"{human_bytes(total)} of text in {where}; the limit is {human_bytes(limit)} (ALI_MAX_TRACE_TEXT_BYTES)"


def _rows(a: int, b: int) -> str:
    return f"row {a:,}" if a == b else f"rows {a:,}–{b:,}"


@dataclass
class _Columns:
    """What the footer says of the file's columns."""

    owners: list[str]  # per leaf column: its top-level column
    repeated: list[bool]  # per leaf: under a list
    text: list[bool]  # per leaf: strings or bytes
    list_columns: list[str]
    text_columns: list[str]
    token_lists: list[str]  # token columns counted in ids (an empty list is 0), not in Parquet values
    total_rows: int  # what the row numbers count


def _columns(pf: Any, token_columns: Sequence[str]) -> _Columns:
    md, schema = pf.metadata, pf.schema
    owners = _leaf_owners(pf)
    repeated = [schema.column(j).max_repetition_level > 0 for j in range(md.num_columns)]
    text = [schema.column(j).physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY") for j in range(md.num_columns)]
    list_columns = list(dict.fromkeys(o for o, r in zip(owners, repeated) if r))
    token_lists = [c for c in token_columns if c in list_columns and _flat_list(pf.schema_arrow.field(c).type)]
    return _Columns(owners, repeated, text, list_columns, list(dict.fromkeys(o for o, t in zip(owners, text) if t)),
                    token_lists, sum(max(md.row_group(g).num_rows, 0) for g in range(md.num_row_groups)))


class _Budget:
    """The file's budgets (values, text) and the limits per row, read once per file."""

    def __init__(self) -> None:
        self.values = self.values_left = max_file_values()
        self.text = self.text_left = max_file_text_bytes()
        self.row_tokens = max_trace_tokens()
        self.row_text = max_trace_text_bytes()

    def stop(self, first: int, last: int, nrows: int, total_rows: int, text: bool, spent: int) -> LoadProblem:
        """The one problem that says the rest of the file, from row ``first`` on, is not read."""
        if text:
            what = f"{human_bytes(self.text)} of text are read from one file (ALI_MAX_FILE_TEXT_BYTES)"
            spent_s, left_s = human_bytes(spent), human_bytes(self.text_left)
        else:
            what = f"{self.values:,} list values are read from one file (ALI_MAX_FILE_VALUES)"
            spent_s, left_s = f"{spent:,}", f"{self.values_left:,}"
        held = f"row {first:,} holds" if nrows == 1 else f"{_rows(first, last)} (one row group: read whole or not at all) hold"
        return LoadProblem(first, f"{_rows(first, max(total_rows, last))} ({total_rows - first + 1:,} of {total_rows:,}) "
                                  f"not read: at most {what}; {held} {spent_s} and {left_s} are left")


def _footer_check(rg: Any, first: int, cols: _Columns, budget: _Budget) -> tuple[str, Any]:
    """What the footer says of one row group: ``("decode", (values, claims))``, or ``("problem", p)``
    (its rows are not read), or ``("stop", p)`` (nor the rest of the file)."""
    nrows = rg.num_rows
    last = first + nrows - 1
    per_column: dict[str, int] = {}
    claims: dict[str, int] = {}
    text: dict[str, int] = {}
    cost = 0
    for j in range(rg.num_columns):
        col = rg.column(j)
        n, owner = col.num_values, cols.owners[j]
        if n < 0 or (not cols.repeated[j] and n != nrows):
            return "problem", LoadProblem(first, f"{_rows(first, last)} not read: column {owner}: the file's footer says "
                                                 f"{n:,} values in {nrows:,} rows (a damaged or crafted file)")
        if cols.repeated[j]:
            cost += n
            per_column[owner] = max(per_column.get(owner, 0), n)
            claims[owner] = claims.get(owner, 0) + n
        if cols.text[j]:
            text[owner] = text.get(owner, 0) + max(col.total_uncompressed_size or 0, 0)
    sure = sum(text.values()) > FOOTER_TEXT_BYTES  # large enough to refuse from the footer's sizes
    if nrows == 1:
        # one row: its values are the chunk's. A token list of 2+ values holds exactly that many ids;
        # one value is 0 or 1 id, so 0 here and the exact count once decoded
        counts = {c: (0 if c in cols.token_lists and n < 2 else n) for c, n in per_column.items()}
        why = _row_too_big(counts, cols.token_lists) or (_text_too_big(text) if sure else None)
        if why:
            return "problem", LoadProblem(first, why)
    if cost > budget.values_left:
        return "stop", budget.stop(first, last, nrows, cols.total_rows, False, cost)
    if sure and sum(text.values()) > budget.text_left:
        return "stop", budget.stop(first, last, nrows, cols.total_rows, True, sum(text.values()))
    return "decode", (cost, claims)


class _Worker:
    """This file's side of the pool: at most one row group in flight."""

    def __init__(self, pool: WorkerPool, path: str) -> None:
        self.pool = pool
        self.path = path
        self.lease: Any = None

    def send(self, req: dict[str, Any]) -> Lost | None:
        try:
            lease = self.pool.lease()
        except ParquetWorkerError as e:
            raise TraceFileError(f"{os.path.basename(self.path)} could not be read: {e}") from None
        try:
            lease.send(req)
        except Lost as e:  # died between two requests
            return e
        self.lease = lease
        return None

    def receive(self) -> tuple[Any, ...]:
        """The answer to the request in flight: the worker's message (and the rows' bytes), or
        ``("overrun",)`` / ``("lost", Lost)``."""
        lease, self.lease = self.lease, None
        with lease:
            try:
                head = lease.recv()
                if head[0] == "rows":
                    import pyarrow as pa

                    return (*head[:-1], pa.py_buffer(lease.recv_raw(head[-1])))
            except Overrun:
                return ("overrun",)
            except Lost as e:
                return ("lost", e)
            if head[0] == "memory":  # its heap is suspect: a fresh worker for what follows
                lease.kill()
            return head

    def close(self) -> None:
        """The reading stopped with a row group in flight (the caller stopped early): its answer is
        awaited (within the time limit) and dropped, so the worker goes back to the pool."""
        if self.lease is not None:
            self.receive()


def _failure(res: tuple[Any, ...], g: int, groups: int, pool: WorkerPool, path: str) -> str:
    which = f"row group {g + 1:,} (of {groups:,})"
    over_memory = (f"decoding {which} needs more than the {pool.memory_bytes >> 20:,} MiB memory limit of the Parquet "
                   "worker (ALI_PARQUET_MEMORY_BYTES)")
    if res[0] == "memory":
        return over_memory
    if res[0] == "overrun":
        return (f"decoding {which} took longer than the {pool.timeout_s:g} s time limit of the Parquet worker; it was "
                "stopped (ALI_PARQUET_TIMEOUT_S)")
    lost: Lost = res[1]
    if lost.closed:
        raise TraceFileError(f"{os.path.basename(path)} could not be read: the Parquet reader was shut down; try again")
    if lost.exitcode == OVER_MEMORY_EXIT:
        return over_memory
    if lost.exitcode == _SIGKILL:
        return f"the Parquet worker was killed while decoding {which} (out of memory?)"
    return f"the Parquet worker crashed while decoding {which} (exit code {lost.exitcode})"


def _hand_out(first: int, nrows: int, refused: list, body: Any, cols: _Columns, schema: Any) -> Iterator[tuple[int, Any]]:
    """The rows of a decoded row group, in order, with the problems of those the worker refused
    (``schema``: the file's, as pyarrow reads it)."""
    import pyarrow as pa

    reasons = {i: _row_too_big(counts, cols.token_lists) or _text_too_big(texts) or "" for i, counts, texts in refused}
    i = 0
    for batch in pa.ipc.open_stream(body):
        try:
            rows = _plain(pa.Table.from_batches([batch]), schema).to_pylist()
        except (pa.ArrowException, ValueError, TypeError, IndexError) as e:  # damaged values (not UTF-8 ...)
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            yield first + i, LoadProblem(first + i, f"{_rows(first + i, first + nrows - 1)} not read: {msg}"[:500])
            return
        rows.reverse()  # popped one by one: a row's lists are freed once its trace is made
        while rows:
            while i in reasons:
                yield first + i, LoadProblem(first + i, reasons[i])
                i += 1
            yield first + i, rows.pop()
            i += 1
    while i < nrows:
        yield first + i, LoadProblem(first + i, reasons.get(i) or "not read")
        i += 1


def iter_parquet_rows(
    pf: Any, path: str, *, token_columns: Sequence[str] = TOKEN_COLUMNS, batch_rows: int = BATCH_ROWS,
    pool: WorkerPool | None = None,
) -> Iterator[tuple[int, dict[str, Any] | LoadProblem]]:
    """``(row number, row as a dict)`` for each row of the open ``pyarrow.parquet.ParquetFile``
    ``pf`` (at ``path``), or ``(row number, LoadProblem)`` for a row (or, once, for the rest of the
    file) that is not read. Row numbers are 1-based. Memory stays bounded by
    :func:`~backend.trace.max_trace_tokens` and :func:`~backend.trace.max_trace_text_bytes` per row,
    :func:`~backend.trace.max_file_values` and :func:`~backend.trace.max_file_text_bytes` per file,
    and the decoding by the worker's cap (see the module's docstring; ``pool``: another pool than
    the module's :data:`POOL`). Raises :class:`TraceFileError` when no worker can be had."""
    pool = POOL if pool is None else pool
    md, schema = pf.metadata, pf.schema_arrow
    cols = _columns(pf, token_columns)
    budget = _Budget()
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise TraceFileError(f"{os.path.basename(path)} could not be read: {e}") from None
    base = {"path": path, "stamp": (st.st_size, st.st_mtime_ns), "list_columns": cols.list_columns,
            "text_columns": cols.text_columns, "token_lists": cols.token_lists, "row_tokens": budget.row_tokens,
            "row_text": budget.row_text, "batch_rows": batch_rows}
    worker = _Worker(pool, path)
    pending: tuple | None = None  # a row group decoded, its rows not handed out yet
    failures = 0
    first = 1  # row number of the row group's first row
    try:
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            nrows = rg.num_rows
            if nrows <= 0:
                continue  # nothing to read (and its values are not counted)
            last = first + nrows - 1
            verdict, x = _footer_check(rg, first, cols, budget)
            if verdict == "decode" and failures >= MAX_FAILURES:
                verdict, x = "stop", LoadProblem(first, f"{_rows(first, max(cols.total_rows, last))} "
                                                        f"({cols.total_rows - first + 1:,} of {cols.total_rows:,}) not read: "
                                                        f"the Parquet worker failed on {failures} row groups of this file")
            if verdict != "decode":
                if pending:
                    yield from _hand_out(*pending)
                    pending = None
                yield first, x
                if verdict == "stop":
                    return
                first = last + 1
                continue
            cost, claims = x
            budget.values_left -= cost
            try:
                lost = worker.send({**base, "g": g, "claims": claims, "text_left": budget.text_left})
            except TraceFileError:  # no worker to be had: what was read is handed out first
                if pending:
                    yield from _hand_out(*pending)
                raise
            if pending:  # handed out while the worker decodes this row group
                yield from _hand_out(*pending)
                pending = None
            res = ("lost", lost) if lost is not None else worker.receive()
            if res[0] == "lost" and not res[1].closed:  # it died (maybe before this request): once more
                lost = worker.send({**base, "g": g, "claims": claims, "text_left": budget.text_left})
                res = ("lost", lost) if lost is not None else worker.receive()
            if res[0] == "rows":
                _, refused, charged, body = res
                budget.text_left -= charged
                pending = (first, nrows, refused, body, cols, schema)
            elif res[0] == "over":
                yield first, budget.stop(first, last, nrows, cols.total_rows, True, res[1])
                return
            elif res[0] == "lie":
                _, owner, claimed, got = res
                yield first, LoadProblem(first, f"{_rows(first, last)} not read: column {owner}: the file's footer says "
                                                f"{claimed:,} values, its pages hold {got:,} (a damaged or crafted file)")
            elif res[0] == "error":
                yield first, LoadProblem(first, f"{_rows(first, last)} not read: {res[1]}"[:500])
            else:
                failures += 1
                yield first, LoadProblem(first, f"{_rows(first, last)} not read: {_failure(res, g, md.num_row_groups, pool, path)}")
            first = last + 1
        if pending:
            yield from _hand_out(*pending)
    finally:
        worker.close()
