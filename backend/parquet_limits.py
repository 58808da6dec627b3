"""Rows of a Parquet file of unknown origin, decoded with bounded memory.

Every reader of Parquet rows goes through :func:`iter_parquet_rows`: our own layout
(:func:`backend.trace.io.read_parquet_traces`) and other tools' files
(:mod:`backend.importers`).

Why: list columns are compressed, so a 16 KB file can hold one row with 5·10⁷ token ids, and
reading it with ``iter_batches`` + ``to_pylist`` raised the process's peak memory by 2.7 GB. The
byte limits on files do not see that. So the values are counted before anything is decoded:

* For each row group and each leaf column, the values that decoding would produce are read from
  the column chunk's page headers (a few bytes each, read with a small Thrift reader below; page
  bodies are skipped, except for the bounds on strings below) and must agree with the footer's
  ``num_values`` (and a dictionary may not hold more entries than the values it encodes, except a
  string column's: pyarrow writes an Arrow dictionary whole, and its bytes count as text). The
  footer alone is a claim: pyarrow decodes what the pages hold (measured: a footer edited to say
  3,000,000 values over a page of 5·10⁷ still decodes all 5·10⁷, ~1 GB). A row group that fails
  these checks is reported and skipped; after :data:`MAX_PAGES` page headers the rest of the file is.
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

The bytes of string and binary columns (the JSON columns of our layout) are bounded the same way,
with :func:`~backend.trace.max_trace_text_bytes` per row and
:func:`~backend.trace.max_file_text_bytes` per file. Measured before: one 300 MB JSON string (a
13 KB file) raised the peak by 1.5 GB when read; a dictionary page holding one 20 MB value that 100
rows refer to is decoded into one copy per row (+5 GB). Now both are refused undecoded (+45 MB).

For each BYTE_ARRAY (and FIXED_LEN_BYTE_ARRAY) column chunk, the bytes that decoding produces are
bounded from its page headers, reading a page body only where a header is not enough:

* PLAIN and DELTA_LENGTH_BYTE_ARRAY data pages: their ``uncompressed_page_size`` (the bytes are all
  there, with a length each: a few bytes a value above the text).
* Dictionary-encoded data pages: ``num_values`` × the longest dictionary entry, and when that is
  more than :data:`EXACT_ABOVE`, the lengths of the entries that the page's indices refer to,
  summed (a column whose values differ in length must not count each as the longest: 512 rows of
  2 KB messages and one of 600 KB would count 300 MB). The dictionary page is decompressed for its
  entries' lengths only when its ``uncompressed_page_size`` fits in what is left of the budget; a
  dictionary of one entry is not read (its length is the page's size less 4).
* DELTA_BYTE_ARRAY data pages (Spark's and parquet-mr's v2 writers; each value is a prefix of the
  one before plus a suffix, so a few bytes can repeat a long value in every row): the prefix
  lengths, decoded and summed, plus the page's bytes.
* FIXED_LEN_BYTE_ARRAY: ``num_values`` × the type's length.
* A chunk's bound is at least its dictionary page's bytes (pyarrow decodes the whole dictionary).

Where a page body cannot be read here (a codec pyarrow lacks, damaged bytes) or the work of reading
them passes :data:`MAX_CHECK_BYTES` / :data:`MAX_CHECK_STEPS` for the file, the bound that needs no
body is used (``num_values`` × the largest size the headers allow): always safe, only looser, so a
file may then be refused that would have fit. A one-row row group over the per-row limit is
reported and not decoded; a row group is decoded only if its bound fits in what is left of the
file's budget (which is then charged with the bound); rows of a decoded row group are checked one
by one against the per-row limit from the Arrow offsets, before any Python string is made.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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
# Page headers are read in Python, so their work is bounded per file (a few seconds at most;
# crafted footers can point many column chunks at the same bytes). Real files are far below:
# a 1 GB file has a few thousand pages of ~20 Thrift fields each.
MAX_PAGE_HEADER_BYTES = 16 << 20  # pyarrow's own limit on one page header
MAX_PAGES = 100_000  # page headers read from one file
MAX_HEADER_FIELDS = 5_000_000  # Thrift fields and list items in them, all headers together (~2 s)
MAX_HEADER_READ = 256 << 20  # bytes read to find the headers, all together
# The bounds on strings that read page bodies (dictionary pages, the indices of dictionary-encoded
# pages, DELTA_BYTE_ARRAY prefix lengths) cost work, bounded per file; past these limits the bounds
# that need no page body are used instead (safe, only looser). A data page whose header-only bound
# is at most EXACT_ABOVE keeps it: small, as the slack adds up over the pages of a file (a row
# group of two 10 KB messages would count 40 KB).
EXACT_ABOVE = 1 << 10
MAX_CHECK_BYTES = 1 << 30  # page bytes read and decompressed for these bounds (one page at a time)
# Python work, in steps of ~0.14 µs: a dictionary entry is 1, a run of indices 8, a slice of
# bit-packed values (up to 4,096) or a miniblock of prefix lengths 80 (measured; ~3 s in all)
MAX_CHECK_STEPS = 20_000_000
_RUN, _UNPACK = 8, 80


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


# PageHeader: 1 type, 2 uncompressed_page_size, 3 compressed_page_size, 5 data_page_header,
# 7 dictionary_page_header, 8 data_page_header_v2; each of these three has num_values as its field 1.
# DataPageHeader: 2 encoding, 3 definition_level_encoding, 4 repetition_level_encoding.
# DictionaryPageHeader: 2 encoding. DataPageHeaderV2: 2 num_nulls, 4 encoding,
# 5 definition_levels_byte_length, 6 repetition_levels_byte_length, 7 is_compressed (default true).
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_NUM_VALUES_OF = {_DATA_PAGE: 5, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}
# encodings
_PLAIN, _PLAIN_DICTIONARY, _RLE, _BIT_PACKED, _DELTA_LENGTH_BYTE_ARRAY, _DELTA_BYTE_ARRAY, _RLE_DICTIONARY = 0, 2, 3, 4, 6, 7, 8


@dataclass
class _Header:
    type: int
    uncompressed: int
    compressed: int
    num_values: int
    length: int  # of the header itself
    encoding: int = _PLAIN
    def_encoding: int = _RLE
    rep_encoding: int = _RLE
    num_nulls: int = 0  # v2 only
    def_bytes: int = 0  # v2: the levels' bytes, stored uncompressed before the values
    rep_bytes: int = 0
    is_compressed: bool = True


def _read_header(buf: bytes, scan: _Scan | None = None) -> _Header:
    r = _Compact(buf, scan)
    top: dict[int, int] = {}
    subs: dict[int, dict[int, int]] = {}
    for fid, ftype in r.fields():
        if fid in (1, 2, 3) and ftype == 5:
            top[fid] = r.int()
        elif fid in (5, 7, 8) and ftype == 12:
            sub = subs.setdefault(fid, {})
            for sid, stype in r.fields():
                if stype == 5 and sid <= 6:
                    sub[sid] = r.int()
                elif fid == 8 and sid == 7 and stype in (1, 2):  # a bool: its value is its type
                    sub[7] = int(stype == 1)
                else:
                    r.skip(stype, 1)
        else:
            r.skip(ftype)
    page_type, uncompressed, size = top.get(1), top.get(2), top.get(3)
    if page_type is None or size is None or size < 0 or uncompressed is None or uncompressed < 0:
        raise _Unreadable("a page header without its type or size")
    want = _NUM_VALUES_OF.get(page_type)
    sub = subs.get(want, {}) if want is not None else {}
    n = sub.get(1, -1) if want is not None else 0
    if n < 0:
        raise _Unreadable("a page header without its number of values")
    h = _Header(page_type, uncompressed, size, n, r.pos)
    if page_type == _DATA_PAGE:
        h.encoding, h.def_encoding, h.rep_encoding = sub.get(2, -1), sub.get(3, _RLE), sub.get(4, _RLE)
    elif page_type == _DICTIONARY_PAGE:
        h.encoding = sub.get(2, _PLAIN)
    elif page_type == _DATA_PAGE_V2:
        h.encoding, h.num_nulls, h.def_bytes, h.rep_bytes = sub.get(4, -1), sub.get(2, 0), sub.get(5, 0), sub.get(6, 0)
        h.is_compressed = bool(sub.get(7, 1))
        if h.def_bytes < 0 or h.rep_bytes < 0:
            raise _Unreadable("a page header with negative level lengths")
    return h


def _page_header(buf: bytes, scan: _Scan | None = None) -> tuple[int, int, int, int]:
    """``(page type, compressed size, num_values, header length)`` of the header at ``buf[0]``."""
    h = _read_header(buf, scan)
    return h.type, h.compressed, h.num_values, h.length


@dataclass
class _Scan:
    f: Any
    size: int
    pages: int = 0
    fields: int = 0
    read: int = 0
    checked: int = 0  # page bytes read and decompressed for text bounds
    steps: int = 0  # and the Python work on them

    def may_check(self, nbytes: int) -> bool:
        if self.checked + nbytes > MAX_CHECK_BYTES:
            return False
        self.checked += nbytes
        return True

    def step(self, n: int = 1) -> bool:
        self.steps += n
        return self.steps <= MAX_CHECK_STEPS


_NOT_TEXT, _BYTES, _FIXED = 0, 1, 2


@dataclass
class _Leaf:
    """What the bounds need to know of a leaf column."""

    text: int = _NOT_TEXT  # BYTE_ARRAY (_BYTES) or FIXED_LEN_BYTE_ARRAY (_FIXED)
    type_length: int = 0
    max_rep: int = 0
    max_def: int = 0


def _leaf(c: Any) -> _Leaf:
    """The :class:`_Leaf` of a pyarrow ColumnSchema."""
    kind = {"BYTE_ARRAY": _BYTES, "FIXED_LEN_BYTE_ARRAY": _FIXED}.get(c.physical_type, _NOT_TEXT)
    return _Leaf(kind, max(int(c.length or 0), 0) if kind == _FIXED else 0, c.max_repetition_level, c.max_definition_level)


# ---- page bodies: only what the bounds on strings need -----------------------------------------


class _BadBody(Exception):
    """A page body that this reader does not follow: the bound that needs no body is used."""


_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd", "LZ4": "lz4_raw", "LZ4_RAW": "lz4_raw"}


def _decompress(raw: bytes, size: int, codec: str) -> Any:
    if codec == "UNCOMPRESSED":
        if len(raw) != size:
            raise _BadBody
        return memoryview(raw)
    name = _CODECS.get(codec)
    if name is None:  # LZO, or a codec pyarrow was built without: no exact bound, no failure
        raise _BadBody
    import pyarrow as pa

    try:
        out = pa.decompress(raw, decompressed_size=size, codec=name)
    except Exception:
        raise _BadBody from None
    if out.size != size:
        raise _BadBody
    return memoryview(out).cast("B")  # pyarrow's buffers are signed chars


def _body(scan: _Scan, at: int, h: _Header, codec: str) -> Any:
    """The bytes of the page whose body starts at ``at``, decompressed: all of a dictionary page or
    a v1 data page (its levels, then its values), the values of a v2 data page."""
    if h.compressed > h.uncompressed + (h.uncompressed >> 2) + 4096:  # more than any codec adds: not read
        raise _BadBody
    if at + h.compressed > scan.size or not scan.may_check(h.compressed + h.uncompressed):
        raise _BadBody
    scan.f.seek(at)
    raw = scan.f.read(h.compressed)
    if len(raw) != h.compressed:
        raise _BadBody
    if h.type != _DATA_PAGE_V2:
        return _decompress(raw, h.uncompressed, codec)
    levels = h.rep_bytes + h.def_bytes
    if levels > min(len(raw), h.uncompressed):
        raise _BadBody
    if h.is_compressed:
        return _decompress(raw[levels:], h.uncompressed - levels, codec)
    return memoryview(raw)[levels:]


def _uleb(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _BadBody
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _unpack(buf: Any, width: int, count: int) -> Any:
    """``count`` unsigned ints of ``width`` bits (at most 32), bit-packed little-endian (Parquet's
    RLE / bit-packed hybrid and DELTA_BINARY_PACKED), as numpy int64."""
    import numpy as np

    if width == 0:
        return np.zeros(count, np.int64)
    nbytes = (count * width + 7) // 8
    if len(buf) < nbytes:
        raise _BadBody
    bits = np.unpackbits(np.frombuffer(buf, np.uint8, count=nbytes), bitorder="little")[: count * width]
    return bits.reshape(count, width).astype(np.int64) @ (np.int64(1) << np.arange(width, dtype=np.int64))


_SLICE = 4096  # values unpacked at a time (a multiple of 8: slices start on a byte)


def _hybrid(buf: Any, width: int, n: int, scan: _Scan) -> Iterator[tuple[int, int, Any]]:
    """The runs of an RLE / bit-packed hybrid stream (levels, dictionary indices), at most ``n``
    values: ``(value, count, None)`` for a repeated value, ``(0, count, values)`` for bit-packed
    ones. Ends where the bytes do."""
    got, pos, end, w = 0, 0, len(buf), (width + 7) // 8
    while got < n and pos < end:
        if not scan.step(_RUN):
            raise _BadBody
        header, pos = _uleb(buf, pos)
        if header & 1:
            groups = header >> 1
            count = min(groups * 8, n - got, (end - pos) * 8 // width if width else n)
            for s in range(0, count, _SLICE):
                if not scan.step(_UNPACK):
                    raise _BadBody
                k = min(_SLICE, count - s)
                yield 0, k, _unpack(buf[pos + s * width // 8 :], width, k)
            got += count
            pos += groups * width
        else:
            if pos + w > end:
                return
            value = int.from_bytes(buf[pos : pos + w], "little")
            pos += w
            k = min(header >> 1, n - got)
            yield value, k, None
            got += k


def _levels(body: Any, h: _Header, leaf: _Leaf, scan: _Scan) -> tuple[int, int]:
    """``(where the values start, how many values are not null)`` in the body of a data page."""
    n = h.num_values
    if h.type == _DATA_PAGE_V2:  # levels are not in the body; the header counts the nulls
        return 0, max(n - max(h.num_nulls, 0), 0)
    pos, present = 0, n
    for max_level, enc, is_def in ((leaf.max_rep, h.rep_encoding, False), (leaf.max_def, h.def_encoding, True)):
        if max_level <= 0:
            continue
        width = max_level.bit_length()
        if enc == _RLE:
            if pos + 4 > len(body):
                raise _BadBody
            size = int.from_bytes(body[pos : pos + 4], "little")
            if is_def:  # values are stored for the levels that reach the leaf
                got = present = 0
                for value, count, values in _hybrid(body[pos + 4 : pos + 4 + size], width, n, scan):
                    got += count
                    present += count * (value == max_level) if values is None else int((values == max_level).sum())
                present += n - got  # levels the stream lacks: counted as values (pyarrow refuses the page)
            pos += 4 + size
        elif enc == _BIT_PACKED:  # deprecated: no length prefix; its values are not read here
            pos += (n * width + 7) // 8
        else:
            raise _BadBody
    if pos > len(body):
        raise _BadBody
    return pos, present


def _dictionary_lengths(body: Any, n: int, scan: _Scan) -> Any:
    """The lengths of the ``n`` entries of a PLAIN dictionary of byte arrays (4-byte length, bytes)."""
    import numpy as np

    if not scan.step(n):
        raise _BadBody
    unpack = struct.Struct("<i").unpack_from
    lengths, pos, end = [], 0, len(body)
    for _ in range(n):
        if pos + 4 > end:
            raise _BadBody
        (k,) = unpack(body, pos)
        pos += 4 + k
        if k < 0 or pos > end:
            raise _BadBody
        lengths.append(k)
    return np.array(lengths, dtype=np.int64)


def _indices_text(values: Any, n: int, lengths: Any, scan: _Scan) -> int:
    """The bytes of the dictionary entries that ``n`` indices (RLE_DICTIONARY: a bit width, then an
    RLE / bit-packed hybrid stream) refer to. An index past the dictionary counts 0 (pyarrow
    refuses it); indices the stream lacks count as the longest entry."""
    import numpy as np

    if n == 0:
        return 0
    if not len(values) or values[0] > 32:
        raise _BadBody
    ext = np.append(lengths, 0)
    size = len(lengths)
    total = got = 0
    for value, count, idx in _hybrid(values[1:], values[0], n, scan):
        got += count
        if idx is None:
            total += count * int(ext[min(value, size)])
        else:
            total += int(ext[np.minimum(idx, size)].sum())
    return total + (n - got) * (int(lengths.max()) if size else 0)


def _delta_prefixes(values: Any, n: int, scan: _Scan) -> tuple[int, int]:
    """``(sum of the prefix lengths, where the suffixes start)`` of a DELTA_BYTE_ARRAY page: its
    prefix lengths are a DELTA_BINARY_PACKED stream of int32 (a header; then blocks of a min delta,
    a bit width per miniblock and the miniblocks)."""
    import numpy as np

    block, pos = _uleb(values, 0)
    per_block, pos = _uleb(values, pos)
    count, pos = _uleb(values, pos)
    first, pos = _uleb(values, pos)
    if not block or block % 128 or not per_block or block % per_block or (block // per_block) % 32 or count > n:
        raise _BadBody
    per_mini = block // per_block

    def int32(v: Any) -> Any:  # pyarrow adds in 32 bits, wrapping; a negative length is refused
        return ((v + (1 << 31)) % (1 << 32)) - (1 << 31)

    if count == 0:
        return 0, pos
    first = (first >> 1) ^ -(first & 1)
    if not -(1 << 31) <= first < 1 << 31:  # pyarrow reads an int32
        raise _BadBody
    total, got, last = max(first, 0), 1, first
    while got < count:
        min_delta, pos = _uleb(values, pos)
        min_delta = (min_delta >> 1) ^ -(min_delta & 1)
        widths = bytes(values[pos : pos + per_block])
        pos += per_block
        if len(widths) < per_block or not -(1 << 31) <= min_delta < 1 << 31:
            raise _BadBody
        for width in widths:
            if got >= count:
                break
            if width > 32:
                raise _BadBody
            k = min(per_mini, count - got)
            for s in range(0, k, _SLICE):
                if not scan.step(_UNPACK):
                    raise _BadBody
                m = min(_SLICE, k - s)
                v = int32(last + np.cumsum(_unpack(values[pos + s * width // 8 :], width, m) + min_delta))
                total += int(np.maximum(v, 0).sum())
                last = int(v[-1])
            got += k
            pos += per_mini * width // 8
    if pos > len(values):
        raise _BadBody
    return total, pos


@dataclass
class _Chunk:
    data: int = 0  # values in its data pages
    dictionary: int = 0  # entries in its dictionary pages
    text: int = 0  # a bound on the bytes of strings it decodes to


class _Dictionary:
    """A column chunk's dictionary of strings: where its page is, and its entries' lengths once read."""

    def __init__(self, at: int, h: _Header) -> None:
        self.at, self.h = at, h
        self.lengths: Any = None  # numpy array once read; False when it cannot be
        self.longest = max(h.uncompressed - 4 * h.num_values, 0)  # the entries together: a bound until read
        if h.num_values == 1:  # one entry: its length is the page's bytes less 4, nothing to read
            import numpy as np

            self.lengths = np.array([self.longest], dtype=np.int64)

    def read(self, scan: _Scan, codec: str, left: int) -> bool:
        """Read the entries' lengths (only when the page's bytes fit in what is left of the budget)."""
        if self.lengths is None:
            self.lengths = False
            if self.h.uncompressed <= left:
                try:
                    self.lengths = _dictionary_lengths(_body(scan, self.at, self.h, codec), self.h.num_values, scan)
                except _BadBody:
                    pass
            if self.lengths is not False:
                self.longest = int(self.lengths.max()) if len(self.lengths) else 0
        return self.lengths is not False


def _page_text(scan: _Scan, at: int, h: _Header, leaf: _Leaf, codec: str, dictionary: _Dictionary | None, left: int) -> int:
    """A bound on the bytes of strings the data page whose body starts at ``at`` decodes to."""
    n, enc = h.num_values, h.encoding
    if leaf.text == _FIXED:
        return n * leaf.type_length
    if enc in (_PLAIN, _DELTA_LENGTH_BYTE_ARRAY):  # the bytes are all there
        return h.uncompressed
    if enc in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
        if dictionary is None:
            raise _Unreadable("dictionary-encoded strings without a dictionary page")
        bound = n * dictionary.longest
        if bound <= EXACT_ABOVE or not dictionary.read(scan, codec, left):
            return bound
        bound = n * dictionary.longest  # again: read() replaced the page-size bound by the exact longest entry
        if bound <= EXACT_ABOVE or h.uncompressed > left:
            return bound
        try:
            body = _body(scan, at, h, codec)
            start, present = _levels(body, h, leaf, scan)
            return min(bound, _indices_text(body[start:], present, dictionary.lengths, scan))
        except _BadBody:
            return bound
    if enc == _DELTA_BYTE_ARRAY:  # a value is at most the page's bytes (its prefix is of the value before)
        bound = n * h.uncompressed
        if bound <= EXACT_ABOVE or h.uncompressed > left:
            return bound
        try:
            body = _body(scan, at, h, codec)
            start, present = _levels(body, h, leaf, scan)
            prefixes, suffixes = _delta_prefixes(body[start:], present, scan)
            return min(bound, prefixes + len(body) - start - suffixes)
        except _BadBody:
            return bound
    raise _Unreadable(f"strings in an encoding pyarrow does not read ({enc})")


def _chunk_values(scan: _Scan, col: Any, leaf: _Leaf | None = None, left: int = 0) -> _Chunk:
    """The values that decoding the column chunk ``col`` (pyarrow's ColumnChunkMetaData) produces,
    from its page headers, and for a string column a bound on their bytes (see the module's
    docstring); ``left`` is what is left of the file's text budget."""
    leaf = leaf or _Leaf()
    start = col.data_page_offset
    if col.has_dictionary_page and 0 < (col.dictionary_page_offset or 0) < start:
        start = col.dictionary_page_offset
    end = min(start + col.total_compressed_size, scan.size)
    if start < 0 or col.total_compressed_size < 0:
        raise _Unreadable("a column chunk at a negative offset")
    codec = col.compression if leaf.text else ""
    out = _Chunk()
    dictionary: _Dictionary | None = None
    dictionary_bytes = 0
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
                h = _read_header(buf, scan)
                break
            except _Short:
                if len(buf) < window or window >= MAX_PAGE_HEADER_BYTES:
                    raise _Unreadable("a page header runs past its column chunk") from None
                window = min(window * 16, MAX_PAGE_HEADER_BYTES)
        at = pos + h.length
        if h.type in (_DATA_PAGE, _DATA_PAGE_V2):
            out.data += h.num_values
            if leaf.text:
                out.text += _page_text(scan, at, h, leaf, codec, dictionary, left)
        elif h.type == _DICTIONARY_PAGE:
            out.dictionary += h.num_values
            if leaf.text == _BYTES:
                dictionary = _Dictionary(at, h)
                dictionary_bytes = max(dictionary_bytes, h.uncompressed)
        pos = at + h.compressed
    # pyarrow decodes the whole dictionary first: its entries and their offsets (the 4 bytes that
    # each has on the page), which may be more than the values refer to (an Arrow dictionary)
    out.text = max(out.text, dictionary_bytes)
    return out


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


def _row_text(arr: Any) -> Any:
    """Per row of an Arrow array, the bytes of the strings (and binary values) in it, as a numpy
    int64 array. Read from the offsets and lengths: no copy of the values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_dictionary(t):  # e.g. a pandas categorical, stored with its Arrow type
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
        arr = pa.ListArray.from_arrays(arr.offsets, arr.values)
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


def _rows(a: int, b: int) -> str:
    return f"row {a:,}" if a == b else f"rows {a:,}–{b:,}"


# ---- reading --------------------------------------------------------------------------------------


def iter_parquet_rows(
    pf: Any, path: str, *, token_columns: Sequence[str] = TOKEN_COLUMNS, batch_rows: int = BATCH_ROWS
) -> Iterator[tuple[int, dict[str, Any] | LoadProblem]]:
    """``(row number, row as a dict)`` for each row of the open ``pyarrow.parquet.ParquetFile``
    ``pf`` (at ``path``), or ``(row number, LoadProblem)`` for a row (or, once, for the rest of the
    file) that is not read. Row numbers are 1-based. Memory stays bounded by
    :func:`~backend.trace.max_trace_tokens` and :func:`~backend.trace.max_trace_text_bytes` per row,
    :func:`~backend.trace.max_file_values` and :func:`~backend.trace.max_file_text_bytes` per file
    (see the module's docstring)."""
    import numpy as np
    import pyarrow as pa

    md = pf.metadata
    owners = _leaf_owners(pf)
    repeated = [pf.schema.column(j).max_repetition_level > 0 for j in range(md.num_columns)]
    leaves = [_leaf(pf.schema.column(j)) for j in range(md.num_columns)]
    text_columns = list(dict.fromkeys(o for o, leaf in zip(owners, leaves) if leaf.text))
    list_columns = list(dict.fromkeys(o for o, r in zip(owners, repeated) if r))
    # token columns are counted in ids (an empty list is 0); other list columns in Parquet values
    token_lists = [c for c in token_columns if c in list_columns and _flat_list(pf.schema_arrow.field(c).type)]
    total_rows = sum(max(md.row_group(g).num_rows, 0) for g in range(md.num_row_groups))  # what the row numbers count
    budget = max_file_values()
    left = budget
    text_budget = max_file_text_bytes()
    text_left = text_budget
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
                text_per_column: dict[str, int] = {}
                cost = text_cost = 0
                for j in range(rg.num_columns):
                    col = rg.column(j)
                    chunk = _chunk_values(scan, col, leaves[j], text_left - text_cost)
                    data, dictionary = chunk.data, chunk.dictionary
                    if data != col.num_values or (not repeated[j] and data != nrows):
                        claimed = col.num_values if data != col.num_values else nrows
                        raise _Unreadable(f"column {owners[j]}: the file's footer says {claimed:,} values, its pages hold "
                                          f"{data:,} (a damaged or crafted file)")
                    # a dictionary holds values that occur in its chunk: never more, except a string
                    # column's (pyarrow writes an Arrow dictionary whole, e.g. a pandas categorical's),
                    # whose bytes count as text
                    if dictionary > data and leaves[j].text != _BYTES:
                        raise _Unreadable(f"column {owners[j]}: a dictionary of {dictionary:,} values for {data:,} values "
                                          "(a damaged or crafted file)")
                    if repeated[j]:
                        cost += data
                        per_column[owners[j]] = max(per_column.get(owners[j], 0), data)
                    if chunk.text:
                        text_cost += chunk.text
                        text_per_column[owners[j]] = text_per_column.get(owners[j], 0) + chunk.text
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
                why = _row_too_big(counts, token_lists) or _text_too_big(text_per_column)
                if why:  # the row is refused from the page headers: not decoded
                    yield first, LoadProblem(first, why)
                    first = last + 1
                    continue
            for over, spent, remaining, what in (
                (cost > left, f"{cost:,}", f"{left:,}", f"{budget:,} list values are read from one file (ALI_MAX_FILE_VALUES)"),
                (text_cost > text_left, human_bytes(text_cost), human_bytes(text_left),
                 f"{human_bytes(text_budget)} of text are read from one file (ALI_MAX_FILE_TEXT_BYTES)"),
            ):
                if over:  # the rest of the file is not read: one problem says how much and why
                    unread = total_rows - first + 1
                    held = (f"row {first:,} holds" if nrows == 1
                            else f"{_rows(first, last)} (one row group: read whole or not at all) hold")
                    yield first, LoadProblem(first, f"{_rows(first, max(total_rows, last))} ({unread:,} of {total_rows:,}) "
                                                    f"not read: at most {what}; {held} {spent} and {remaining} are left")
                    return
            left -= cost
            text_left -= text_cost
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
                    texts = {c: _row_text(batch.column(c)) for c in text_columns if c in batch.schema.names}
                    if texts:
                        for i in np.flatnonzero(sum(texts.values()) > max_trace_text_bytes()).tolist():
                            if i not in refused:
                                refused[i] = _text_too_big({c: int(v[i]) for c, v in texts.items()}) or ""
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
