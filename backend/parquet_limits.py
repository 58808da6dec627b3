"""Rows of a Parquet file of unknown origin, decoded with bounded memory.

Every reader of Parquet rows goes through :func:`iter_parquet_rows`: our own layout
(:func:`backend.export.read_parquet_traces`) and other tools' files
(:mod:`backend.importers`).

Why: list columns are compressed, so a 16 KB file can hold one row with 5·10⁷ token ids, and
reading it with ``iter_batches`` + ``to_pylist`` raised the process's peak memory by 2.7 GB. The
byte limits on files do not see that. So the values are counted before anything is decoded:

* For each row group and each leaf column, the values that decoding would produce are read from
  the column chunk's page headers (a few bytes each, read with a small Thrift reader below; page
  bodies are skipped, nothing is decompressed) and must agree with the footer's ``num_values``
  (and a dictionary may not hold more entries than the values it encodes). The footer alone is a
  claim: pyarrow decodes what the pages hold (measured: a footer edited to say 3,000,000 values
  over a page of 5·10⁷ still decodes all 5·10⁷, ~1 GB). A row group that fails these checks is
  reported and skipped; after :data:`MAX_PAGES` page headers the rest of the file is.
* A one-row row group with more values in a list column than :func:`~backend.trace.max_trace_tokens`
  (or more token ids in ``prompt_ids`` + ``response_ids``) is reported with its row number and
  not decoded; the other rows load.
* A row group is decoded only if its list values fit in what is left of
  :func:`~backend.trace.max_file_values` for the file; decoded rows are then checked one by one
  against the per-trace limit (from the Arrow offsets, before any Python object is made).
  Otherwise reading stops, and one problem says which rows were not read and why. Rows of one
  row group cannot be measured one by one without decoding them all: pyarrow has no way to read
  only a list column's lengths (measured: ``iter_batches(batch_size=1)`` over a row of 5·10⁷ ids
  costs 1.1 GB), so a row group is the unit that is read or not.

Not bounded here: the bytes of string columns (the JSON columns of our layout). One 300 MB string
compresses to a 14 KB file and peaks at ~1.2 GB when read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from backend.trace import LoadProblem, TraceFileError, max_file_values, max_trace_tokens, too_many_tokens

TOKEN_COLUMNS = ("prompt_ids", "response_ids")  # the token ids of a trace, in our layout and in verl's

BATCH_ROWS = 256
# Page headers are read in Python, so their work is bounded per file (a few seconds at most;
# crafted footers can point many column chunks at the same bytes). Real files are far below:
# a 1 GB file has a few thousand pages of ~20 Thrift fields each.
MAX_PAGE_HEADER_BYTES = 16 << 20  # pyarrow's own limit on one page header
MAX_PAGES = 100_000  # page headers read from one file
MAX_HEADER_FIELDS = 5_000_000  # Thrift fields and list items in them, all headers together (~2 s)
MAX_HEADER_READ = 256 << 20  # bytes read to find the headers, all together


class _Unreadable(Exception):
    """A column chunk whose page headers cannot be read or do not agree with the footer."""


class _TooMuchToCheck(Exception):
    """Past one of the limits on the work of reading page headers: the rest of the file is not read."""


class _Short(Exception):
    """The bytes read end inside a page header."""


# ---- Thrift compact protocol: just enough of it to read a page header -----------------------------


class _Compact:
    def __init__(self, buf: bytes, scan: _Scan | None = None) -> None:
        self.buf = buf
        self.pos = 0
        self.scan = scan if scan is not None else _Scan(None, 0)

    def tick(self) -> None:
        self.scan.fields += 1
        if self.scan.fields > MAX_HEADER_FIELDS:
            raise _TooMuchToCheck(f"more than {MAX_HEADER_FIELDS:,} fields in its page headers")

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _Short
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise _Unreadable("a negative length in a page header")
        if self.pos + n > len(self.buf):
            raise _Short
        self.pos += n

    def varint(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise _Unreadable("a malformed number in a page header")

    def int(self) -> int:  # i16 / i32 / i64: zigzag varint
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def fields(self) -> Iterator[tuple[int, int]]:
        """``(field id, type)`` of each field of a struct; the caller reads or skips each value."""
        last = 0
        while True:
            h = self.byte()
            if h == 0:  # STOP
                return
            self.tick()
            delta, ftype = h >> 4, h & 0x0F
            last = last + delta if delta else self.int()
            yield last, ftype

    def skip(self, ftype: int, depth: int = 0) -> None:
        if depth > 64:
            raise _Unreadable("a page header nested too deeply")
        if ftype in (1, 2):  # a bool field: the value is in the field header
            return
        if ftype == 3:
            self.byte()
        elif ftype in (4, 5, 6):
            self.varint()
        elif ftype == 7:
            self.skip_bytes(8)
        elif ftype == 8:
            self.skip_bytes(self.varint())
        elif ftype in (9, 10):  # list, set; every element takes at least one byte, so this ends
            h = self.byte()
            size, etype = h >> 4, h & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.tick()
                self.byte() if etype in (1, 2) else self.skip(etype, depth + 1)
        elif ftype == 11:  # map
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.tick()
                    for t in (kv >> 4, kv & 0x0F):
                        self.byte() if t in (1, 2) else self.skip(t, depth + 1)
        elif ftype == 12:
            for _, t in self.fields():
                self.skip(t, depth + 1)
        else:
            raise _Unreadable(f"unknown Thrift type {ftype} in a page header")


# PageHeader: 1 type, 3 compressed_page_size, 5 data_page_header, 7 dictionary_page_header,
# 8 data_page_header_v2; each of these three has num_values as its field 1
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_NUM_VALUES_OF = {_DATA_PAGE: 5, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}


def _page_header(buf: bytes, scan: _Scan | None = None) -> tuple[int, int, int, int]:
    """``(page type, compressed size, num_values, header length)`` of the header at ``buf[0]``."""
    r = _Compact(buf, scan)
    page_type = size = None
    num_values: dict[int, int] = {}
    for fid, ftype in r.fields():
        if fid in (1, 3) and ftype == 5:
            v = r.int()
            if fid == 1:
                page_type = v
            else:
                size = v
        elif fid in (5, 7, 8) and ftype == 12:
            for sub, stype in r.fields():
                if sub == 1 and stype == 5:
                    num_values[fid] = r.int()
                else:
                    r.skip(stype, 1)
        else:
            r.skip(ftype)
    if page_type is None or size is None or size < 0:
        raise _Unreadable("a page header without its type or size")
    want = _NUM_VALUES_OF.get(page_type)
    n = num_values.get(want, -1) if want is not None else 0
    if n < 0:
        raise _Unreadable("a page header without its number of values")
    return page_type, size, n, r.pos


@dataclass
class _Scan:
    f: Any
    size: int
    pages: int = 0
    fields: int = 0
    read: int = 0


def _chunk_values(scan: _Scan, col: Any) -> tuple[int, int]:
    """``(data values, dictionary entries)`` that decoding the column chunk ``col`` (pyarrow's
    ColumnChunkMetaData) produces, from its page headers."""
    start = col.data_page_offset
    if col.has_dictionary_page and 0 < (col.dictionary_page_offset or 0) < start:
        start = col.dictionary_page_offset
    end = min(start + col.total_compressed_size, scan.size)
    if start < 0 or col.total_compressed_size < 0:
        raise _Unreadable("a column chunk at a negative offset")
    data = dictionary = 0
    pos = start
    while pos < end:
        scan.pages += 1
        if scan.pages > MAX_PAGES:
            raise _TooMuchToCheck(f"more than {MAX_PAGES:,} pages")
        window = 512
        while True:
            scan.f.seek(pos)
            buf = scan.f.read(min(window, end - pos))
            scan.read += len(buf)
            if scan.read > MAX_HEADER_READ:
                raise _TooMuchToCheck(f"page headers of more than {MAX_HEADER_READ >> 20} MiB")
            try:
                page_type, length, n, header = _page_header(buf, scan)
                break
            except _Short:
                if len(buf) < window or window >= MAX_PAGE_HEADER_BYTES:
                    raise _Unreadable("a page header runs past its column chunk") from None
                window = min(window * 16, MAX_PAGE_HEADER_BYTES)
        if page_type in (_DATA_PAGE, _DATA_PAGE_V2):
            data += n
        elif page_type == _DICTIONARY_PAGE:
            dictionary += n
        pos += header + length
    return data, dictionary


# ---- the file's columns ----------------------------------------------------------------------------


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


def _row_values(arr: Any) -> Any:
    """Per row of an Arrow array, the values its Parquet leaves hold for it (what the page headers
    count: an empty or null list is one value), as a numpy int64 array. Read from the offsets: no
    copy of the values."""
    import numpy as np
    import pyarrow as pa

    t = arr.type
    if pa.types.is_map(t):
        arr = pa.ListArray.from_arrays(arr.offsets, arr.values)
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


def _flat_list(t: Any) -> bool:
    import pyarrow as pa

    listy = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return listy and not pa.types.is_nested(t.value_type)


def _offsets(arr: Any) -> Any:
    import numpy as np

    return arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)


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


def _rows(a: int, b: int) -> str:
    return f"row {a:,}" if a == b else f"rows {a:,}–{b:,}"


# ---- reading --------------------------------------------------------------------------------------


def iter_parquet_rows(
    pf: Any, path: str, *, token_columns: Sequence[str] = TOKEN_COLUMNS, batch_rows: int = BATCH_ROWS
) -> Iterator[tuple[int, dict[str, Any] | LoadProblem]]:
    """``(row number, row as a dict)`` for each row of the open ``pyarrow.parquet.ParquetFile``
    ``pf`` (at ``path``), or ``(row number, LoadProblem)`` for a row (or, once, for the rest of the
    file) that is not read. Row numbers are 1-based. Memory stays bounded by
    :func:`~backend.trace.max_trace_tokens` per row and :func:`~backend.trace.max_file_values` per
    file (see the module's docstring)."""
    import numpy as np
    import pyarrow as pa

    md = pf.metadata
    owners = _leaf_owners(pf)
    repeated = [pf.schema.column(j).max_repetition_level > 0 for j in range(md.num_columns)]
    list_columns = list(dict.fromkeys(o for o, r in zip(owners, repeated) if r))
    # token columns are counted in ids (an empty list is 0); other list columns in Parquet values
    token_lists = [c for c in token_columns if c in list_columns and _flat_list(pf.schema_arrow.field(c).type)]
    total_rows = sum(max(md.row_group(g).num_rows, 0) for g in range(md.num_row_groups))  # what the row numbers count
    budget = max_file_values()
    left = budget
    first = 1  # row number of the row group's first row
    with open(path, "rb") as f:
        scan = _Scan(f, os.fstat(f.fileno()).st_size)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            nrows = rg.num_rows
            if nrows <= 0:
                continue  # nothing to read (and its values are not counted)
            last = first + nrows - 1
            try:
                per_column: dict[str, int] = {}
                cost = 0
                for j in range(rg.num_columns):
                    col = rg.column(j)
                    data, dictionary = _chunk_values(scan, col)
                    if data != col.num_values or (not repeated[j] and data != nrows):
                        claimed = col.num_values if data != col.num_values else nrows
                        raise _Unreadable(f"column {owners[j]}: the file's footer says {claimed:,} values, its pages hold "
                                          f"{data:,} (a damaged or crafted file)")
                    if dictionary > data:  # a dictionary holds values that occur in its chunk: never more
                        raise _Unreadable(f"column {owners[j]}: a dictionary of {dictionary:,} values for {data:,} values "
                                          "(a damaged or crafted file)")
                    if repeated[j]:
                        cost += data
                        per_column[owners[j]] = max(per_column.get(owners[j], 0), data)
            except _Unreadable as e:
                yield first, LoadProblem(first, f"{_rows(first, last)} not read: {e}")
                first = last + 1
                continue
            except _TooMuchToCheck as e:
                yield first, LoadProblem(first, f"{_rows(first, max(total_rows, last))} not read: the file has {e} "
                                                "to check (very small row groups?)")
                return
            except OSError as e:
                raise TraceFileError(f"{os.path.basename(path)} could not be read: {e}") from None
            if nrows == 1:
                # one row: its values are the chunk's. A token list of 2+ values holds exactly that
                # many ids; one value is 0 or 1 id, so 0 here and the exact count once decoded
                counts = {c: (0 if c in token_lists and n < 2 else n) for c, n in per_column.items()}
                why = _row_too_big(counts, token_lists)
                if why:  # the row is refused from the page headers: not decoded
                    yield first, LoadProblem(first, why)
                    first = last + 1
                    continue
            if cost > left:
                unread = total_rows - first + 1
                why = (f"{_rows(first, max(total_rows, last))} ({unread:,} of {total_rows:,}) not read: at most {budget:,} "
                       f"list values are read from one file (ALI_MAX_FILE_VALUES); ")
                if nrows == 1:
                    why += f"row {first:,} holds {cost:,} and {left:,} are left"
                else:
                    why += f"{_rows(first, last)} (one row group: read whole or not at all) hold {cost:,} and {left:,} are left"
                yield first, LoadProblem(first, why)
                return
            left -= cost
            n = first
            try:
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], use_threads=False):
                    counts = {c: (_list_lengths if c in token_lists else _row_values)(batch.column(c))
                              for c in list_columns if c in batch.schema.names}
                    refused: dict[int, str] = {}
                    if counts:
                        limit = max_trace_tokens()
                        over = np.maximum.reduce(list(counts.values())) > limit
                        if token_lists:
                            over |= sum(counts[c] for c in token_lists if c in counts) > limit
                        for i in np.flatnonzero(over).tolist():
                            refused[i] = _row_too_big({c: int(v[i]) for c, v in counts.items()}, token_lists) or ""
                    if refused:
                        keep = [i not in refused for i in range(batch.num_rows)]
                        rows = iter(batch.filter(pa.array(keep)).to_pylist())
                        for i in range(batch.num_rows):
                            yield n + i, LoadProblem(n + i, refused[i]) if i in refused else next(rows)
                    else:
                        rows_list = batch.to_pylist()
                        rows_list.reverse()  # popped one by one: a row's lists are freed once its trace is made
                        for i in range(batch.num_rows):
                            yield n + i, rows_list.pop()
                    n += batch.num_rows
            except (pa.ArrowException, OSError, ValueError, TypeError, IndexError) as e:  # a damaged row group
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                yield n, LoadProblem(n, f"{_rows(n, last)} not read: {msg}"[:500])
            first = last + 1
