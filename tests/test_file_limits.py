"""Token, list-value and text limits on trace files (``ALI_MAX_TRACE_TOKENS``, ``ALI_MAX_FILE_VALUES``,
``ALI_MAX_TRACE_TEXT_BYTES``, ``ALI_MAX_FILE_TEXT_BYTES``).

A Parquet file of a few KB can hold one row with 5·10⁷ token ids (reading it used to raise the
process's peak memory by 2.7 GB), or one 300 MB string (~1.2 GB), or a large dictionary entry that
every row refers to (one copy per row once decoded). These tests write such files with pyarrow and
load them the way the app does, in a child process that reports its own peak memory (VmHWM) before
and after (the decoding happens in the Parquet worker, backend/trace/parquet_guard.py: its own
memory is under its cap, tested at the end with a small cap, a small time limit, a worker killed,
and the app's shutdown)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backend.importers import import_file, load_any
from backend.trace import (
    Trace,
    TraceFileError,
    human_bytes,
    max_file_text_bytes,
    max_file_values,
    max_trace_text_bytes,
    max_trace_tokens,
    write_jsonl,
    write_parquet,
)
from backend.trace.parquet_guard import ParquetPool, iter_parquet_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERL_ROWS = os.path.join(ROOT, "tests", "data", "import", "verl_agent_loop.jsonl")
HUGE = 50_000_000  # token ids in the one bad row
MAX_GROWTH_MB = 300
MAX_TEXT_GROWTH_MB = 200  # a file refused for its text: what reading the rest of it may cost
LIMIT_VARS = ("ALI_MAX_TRACE_TOKENS", "ALI_MAX_FILE_VALUES", "ALI_MAX_TRACE_TEXT_BYTES", "ALI_MAX_FILE_TEXT_BYTES",
              "ALI_MAX_TRACE_LINE_BYTES")

# Loads a file the way the app does and prints its peak memory (VmHWM) before and after. pyarrow
# and (for an import) the tokenizer are loaded first: their memory is not the file's.
CHILD = r"""
import json, sys

def hwm_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

import pyarrow.compute, pyarrow.parquet  # noqa: F401
from backend.importers import load_any

bundle = None
if sys.argv[2] == "import":
    from backend.loading.tokenizers import load_tokenizer
    bundle = load_tokenizer("qwen3")
before = hwm_kb()
res = load_any(sys.argv[1], import_foreign=bundle is not None, bundle=bundle)
after = hwm_kb()
print(json.dumps({"before_kb": before, "after_kb": after, "traces": [t.id for t in res.traces], "lines": res.lines,
                  "problems": [[p.line, p.reason] for p in res.problems]}))
"""


def load_in_child(path, mode: str = "ours") -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for k in LIMIT_VARS:
        env.pop(k, None)  # the defaults
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["growth_mb"] = (out["after_kb"] - out["before_kb"]) / 1024
    return out


def zeros_list(n: int, list_type: pa.DataType) -> pa.Array:
    """One row: a list of ``n`` zeros (cheap to build, a few KB once compressed)."""
    values = pa.array(np.zeros(n, dtype=list_type.value_type.to_pandas_dtype()))
    return pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), values, type=list_type)


def small_trace(i, prompt: int = 5, response: int = 5) -> Trace:
    return Trace(id=f"t{i}", prompt_ids=[300 + i] * prompt, response_ids=[400 + i] * response, response_mask=[1] * response,
                 messages=[{"role": "user", "content": f"question {i}"}])


def write_groups(path, groups: list[list[Trace]]) -> None:
    """Our Parquet layout (write_parquet's schema), one row group per list of traces."""
    tables = []
    for k, traces in enumerate(groups):
        part = f"{path}.part{k}"
        write_parquet(traces, part)
        tables.append(pq.read_table(part))
        os.remove(part)
    with pq.ParquetWriter(str(path), tables[0].schema, compression="zstd") as w:
        for t in tables:
            w.write_table(t)
    assert pq.ParquetFile(str(path)).metadata.num_row_groups == len(groups)


# ---- one huge row: reported from the footer, never decoded ---------------------------------------


def test_huge_row_in_our_parquet_is_reported_and_memory_stays_bounded(tmp_path):
    path = tmp_path / "huge.parquet"
    write_groups(path, [[small_trace(1)]])
    good = pq.read_table(str(path))
    schema = good.schema
    cols = {name: good.column(name) for name in schema.names}
    cols["id"] = pa.array(["huge"])
    # a valid trace (ids and mask bits in range, mask as long as the response), only too long
    cols["response_ids"] = zeros_list(HUGE, schema.field("response_ids").type)
    cols["response_mask"] = zeros_list(HUGE, schema.field("response_mask").type)
    huge = pa.Table.from_arrays([cols[n] for n in schema.names], schema=schema)
    del cols
    with pq.ParquetWriter(str(path), schema, compression="zstd") as w:
        w.write_table(good)
        w.write_table(huge)
        w.write_table(good.set_column(schema.get_field_index("id"), schema.field("id"), pa.array(["after"])))
    del huge
    assert os.path.getsize(path) < 100_000  # the whole file is a few KB

    out = load_in_child(path)
    assert out["traces"] == ["t1", "after"] and out["lines"] == [1, 3]
    assert out["problems"] == [[2, "50,000,000 token ids in column response_ids; the limit is 4,000,000 (ALI_MAX_TRACE_TOKENS)"]]
    assert out["growth_mb"] < MAX_GROWTH_MB, out  # was 2.7 GB


def test_huge_row_in_foreign_parquet_is_reported_and_memory_stays_bounded(tmp_path):
    """A verl agent-loop dump (prompt_ids / response_ids / response_mask rows) with one row of
    5·10⁷ response ids, imported as the upload handler imports it."""
    row = json.loads(open(VERL_ROWS).readline())
    ids = pa.list_(pa.int64())
    schema = pa.schema([("id", pa.string()), ("prompt_ids", ids), ("response_ids", ids), ("response_mask", ids)])

    def table(rid, prompt, response, mask):
        return pa.Table.from_arrays([pa.array([rid]), prompt, response, mask], schema=schema)

    def given(key):
        return pa.array([row[key]], ids)

    path = tmp_path / "verl_dump.parquet"
    with pq.ParquetWriter(str(path), schema, compression="zstd") as w:
        w.write_table(table("first", given("prompt_ids"), given("response_ids"), given("response_mask")))
        w.write_table(table("huge", given("prompt_ids"), zeros_list(HUGE, ids), pa.array([None], ids)))
        w.write_table(table("last", given("prompt_ids"), given("response_ids"), given("response_mask")))
    assert os.path.getsize(path) < 100_000

    out = load_in_child(path, "import")
    assert out["traces"] == ["first", "last"] and out["lines"] == [1, 3]
    assert out["problems"] == [[2, "50,000,000 token ids in column response_ids; the limit is 4,000,000 (ALI_MAX_TRACE_TOKENS)"]]
    assert out["growth_mb"] < MAX_GROWTH_MB, out


def write_understated(path, n: int, claimed: int, after: bool = False) -> None:
    """Our layout: row 1 a small trace, row 2 (a row group of its own) ``n`` response ids and mask
    bits whose footer says ``claimed``, and with ``after`` row 3 a small trace again."""
    write_groups(path, [[small_trace(1)]])
    good = pq.read_table(str(path))
    schema = good.schema
    cols = {name: good.column(name) for name in schema.names}
    cols["id"] = pa.array(["liar"])
    cols["response_ids"] = zeros_list(n, schema.field("response_ids").type)
    cols["response_mask"] = zeros_list(n, schema.field("response_mask").type)
    with pq.ParquetWriter(str(path), schema, compression="zstd") as w:
        w.write_table(good)
        w.write_table(pa.Table.from_arrays([cols[c] for c in schema.names], schema=schema))
        if after:
            w.write_table(good.set_column(schema.get_field_index("id"), schema.field("id"), pa.array(["after"])))
    del cols

    def varint(v: int) -> bytes:  # Thrift compact i64: zigzag varint
        v, out = 2 * v, bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    data = path.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    assert len(varint(n)) == len(varint(claimed)) and data.count(varint(n), footer) >= 1
    path.write_bytes(data[:footer] + data[footer:].replace(varint(n), varint(claimed)))
    assert pq.ParquetFile(str(path)).metadata.row_group(1).column(schema.get_field_index("response_ids")).num_values == claimed


def test_footer_that_understates_a_column_is_not_trusted(tmp_path):
    """pyarrow decodes what a column's pages hold, whatever the footer says: a footer edited to
    claim fewer values than the pages hold must not get a huge row past the limit (the worker
    compares what it decoded with the footer's claim before it sends anything back)."""
    path = tmp_path / "lie.parquet"
    write_understated(path, 5_000_000, 3_000_000)
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1"]
    assert [p.line for p in res.problems] == [2]
    assert "footer says 3,000,000 values, its pages hold 5,000,000" in res.problems[0].reason


# ---- limits over row groups of several rows ----------------------------------------------------


def test_row_group_over_the_file_budget_stops_reading(tmp_path, monkeypatch):
    """Rows 1-2 (30 list values) load; the row group of rows 3-5 (330) holds more than the whole budget,
    so it is not decoded at all and one problem says what was not read."""
    monkeypatch.setenv("ALI_MAX_FILE_VALUES", "60")
    path = tmp_path / "budget.parquet"
    write_groups(path, [[small_trace(1), small_trace(2)], [small_trace(3), small_trace(4, 100, 100), small_trace(5)]])
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t2"]
    assert [(p.line, p.reason) for p in res.problems] == [
        (3, "rows 3–5 (3 of 5) not read: at most 60 list values are read from one file (ALI_MAX_FILE_VALUES); "
            "rows 3–5 (one row group: read whole or not at all) hold 330 and 30 are left")]


def test_file_budget_counts_decoded_row_groups(tmp_path, monkeypatch):
    """Row groups are read while they fit in what is left of the budget; the rest is one problem,
    in the import path as well."""
    monkeypatch.setenv("ALI_MAX_FILE_VALUES", "100")
    path = tmp_path / "many.parquet"
    write_groups(path, [[small_trace(2 * k + 1), small_trace(2 * k + 2)] for k in range(5)])  # 30 values a group
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert len(res.problems) == 1 and res.problems[0].line == 7
    assert res.problems[0].reason.startswith("rows 7–10 (4 of 10) not read: at most 100 list values are read from one file")
    monkeypatch.setenv("ALI_MAX_FILE_VALUES", "300")
    assert len(load_any(str(path)).traces) == 10


@pytest.mark.parametrize("rows_per_group", [1, 3])
def test_row_over_the_token_limit_among_others(tmp_path, monkeypatch, rows_per_group):
    """The same verdicts whether a row is alone in its row group (checked from the footer, not
    decoded) or shares it (checked from the decoded offsets, before any Python list is made)."""
    monkeypatch.setenv("ALI_MAX_TRACE_TOKENS", "20")
    traces = [small_trace(1), small_trace(2, 15, 15), small_trace(3), small_trace(4, 1, 25), small_trace(5, 20, 0)]
    path = tmp_path / "tokens.parquet"
    write_groups(path, [traces[i : i + rows_per_group] for i in range(0, len(traces), rows_per_group)])
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t3", "t5"] and res.lines == [1, 3, 5]
    assert [(p.line, p.reason) for p in res.problems] == [
        (2, "30 token ids in columns prompt_ids + response_ids; the limit is 20 (ALI_MAX_TRACE_TOKENS)"),
        (4, "25 token ids in column response_ids; the limit is 20 (ALI_MAX_TRACE_TOKENS)"),
    ]


def parquet_rows(path: str) -> list:
    """``(row number, row or LoadProblem)`` of a Parquet file, as every reader reads it."""
    from backend.trace import iter_records, sniff

    return [(n, rec) for n, _, rec in iter_records(sniff(path))]


@pytest.mark.parametrize("rows_per_group", [1, 3])
def test_nested_list_column_of_foreign_rows(tmp_path, monkeypatch, rows_per_group):
    """HF ``messages`` rows (a list of structs): a row with more messages than the limit is a bad
    record by its row number; it is counted per message, not per leaf."""
    monkeypatch.setenv("ALI_MAX_TRACE_TOKENS", "10")
    convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 3
    convs[1] = [{"role": "user", "content": str(i)} for i in range(50)]
    table = pa.table({"messages": convs})
    path = tmp_path / "hf.parquet"
    pq.write_table(table, str(path), row_group_size=rows_per_group)
    rows = parquet_rows(str(path))
    assert [n for n, _ in rows] == [1, 2, 3]
    assert rows[0][1] == {"messages": convs[0]} and rows[2][1] == {"messages": convs[2]}
    assert rows[1][1].reason == "50 values in column messages; the limit is 10 (ALI_MAX_TRACE_TOKENS)"


# ---- text: string and binary columns --------------------------------------------------------------


def our_table(tmp_path, traces: list[Trace]) -> pa.Table:
    """``traces`` as a table in our Parquet layout (write_parquet's schema and columns)."""
    part = tmp_path / "part.parquet"
    write_parquet(traces, str(part))
    table = pq.read_table(str(part))
    part.unlink()
    return table


def with_column(table: pa.Table, name: str, values: pa.Array, field: pa.Field | None = None) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, field or table.schema.field(name), values)


def text_trace(i: int, content: int, meta: int = 0, seed: int | None = None) -> Trace:
    """A trace whose message holds ``content`` characters of distinct text (and ``meta`` in its metadata)."""
    rng = random.Random(i if seed is None else seed)
    words = ("tool", "call", "result", "the", "agent", "reads", "a", "file", "and", "writes", "json", "ok")
    text = " ".join(rng.choice(words) for _ in range(content // 4 + 1))[:content]
    t = small_trace(i)
    t.messages = [{"role": "user", "content": text}]
    if meta:
        t.metadata = {"note": "m" * meta}
    return t


def row_text(t: Trace) -> int:
    """The bytes of a trace's row in our layout's string columns."""
    from backend.trace import parquet_row

    return sum(len(v.encode()) for v in parquet_row(t).values() if isinstance(v, str))


def test_huge_string_row_is_reported_and_memory_stays_bounded(tmp_path):
    """One row whose messages column is a 300 MB JSON string (a file of ~13 KB): it is refused from
    the footer's sizes, never decoded; the rows around it load."""
    path = tmp_path / "huge_text.parquet"
    good = our_table(tmp_path, [small_trace(1)])
    messages = json.dumps([{"role": "user", "content": "a" * 300_000_000}])
    n = len(messages)
    huge = with_column(with_column(good, "id", pa.array(["huge"])), "messages", pa.array([messages]))
    del messages
    with pq.ParquetWriter(str(path), good.schema, compression="zstd", write_statistics=False) as w:
        w.write_table(good)
        w.write_table(huge)
        w.write_table(with_column(good, "id", pa.array(["after"])))
    del huge
    assert os.path.getsize(path) < 100_000

    out = load_in_child(path)
    print(f"300 MB string row: peak memory +{out['growth_mb']:.0f} MB")
    assert out["traces"] == ["t1", "after"] and out["lines"] == [1, 3]
    assert out["problems"] == [[2, f"{human_bytes(n)} of text in column messages; the limit is 67.1 MB (ALI_MAX_TRACE_TEXT_BYTES)"]]
    assert out["growth_mb"] < MAX_TEXT_GROWTH_MB, out  # was ~1.2 GB


def test_dictionary_entry_shared_by_many_rows_is_not_expanded(tmp_path):
    """A dictionary-encoded metadata column whose one 20 MB entry is referred to by 100 rows: decoding
    makes one copy per row (2 GB as Arrow strings, again as Python strings). The worker reads it as
    a dictionary and counts the text its rows refer to (2.0 GB): the row group is refused, never
    expanded nor sent; the row group before it loads."""
    path = tmp_path / "shared.parquet"
    first = our_table(tmp_path, [small_trace(1)])
    rows = our_table(tmp_path, [small_trace(k) for k in range(2, 102)])
    meta = json.dumps({"note": "m" * 20_000_000})
    schema = first.schema
    i = schema.get_field_index("metadata")
    dict_field = pa.field("metadata", pa.dictionary(pa.int32(), pa.string()))
    dict_schema = schema.set(i, dict_field)
    shared = pa.DictionaryArray.from_arrays(pa.array(np.zeros(100, np.int32)), pa.array([meta]))
    del meta
    # store_schema=False: read back as a plain string column, as another tool's file would be
    with pq.ParquetWriter(str(path), dict_schema, compression="zstd", store_schema=False, write_statistics=False) as w:
        w.write_table(first.cast(dict_schema))
        w.write_table(with_column(rows.cast(dict_schema), "metadata", shared, dict_field))
        w.add_key_value_metadata(schema.metadata)
    del shared
    pf = pq.ParquetFile(str(path))
    col = pf.metadata.row_group(1).column(i)
    assert pf.schema_arrow.field("metadata").type == pa.string()
    assert col.has_dictionary_page and "RLE_DICTIONARY" in col.encodings and col.num_values == 100
    assert os.path.getsize(path) < 1_000_000

    out = load_in_child(path)
    print(f"20 MB dictionary entry x 100 rows: peak memory +{out['growth_mb']:.0f} MB")
    assert out["traces"] == ["t1"] and out["lines"] == [1]
    assert out["problems"] == [[2, "rows 2–101 (100 of 101) not read: at most 268 MB of text are read from one file "
                                   "(ALI_MAX_FILE_TEXT_BYTES); rows 2–101 (one row group: read whole or not at all) "
                                   "hold 2.0 GB and 268 MB are left"]]
    assert out["growth_mb"] < MAX_TEXT_GROWTH_MB, out


def test_realistic_file_loads_completely(tmp_path):
    """2,000 traces of distinct ~4 KB messages, as write_parquet writes them (row groups of 512,
    messages dictionary-encoded): nothing is refused."""
    traces = [text_trace(i, 4000) for i in range(2000)]
    path = tmp_path / "real.parquet"
    write_parquet(traces, str(path))
    pf = pq.ParquetFile(str(path))
    assert pf.metadata.num_row_groups == 4
    assert pf.metadata.row_group(0).column(pf.schema_arrow.get_field_index("messages")).has_dictionary_page
    res = load_any(str(path))
    assert not res.problems
    assert [t.id for t in res.traces] == [t.id for t in traces] and res.traces[1999].messages == traces[1999].messages


@pytest.mark.parametrize("compression", ["zstd", "snappy", "gzip", "brotli", "lz4", "none"])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_dictionary_bound_is_the_values_it_encodes(tmp_path, monkeypatch, compression, page_version):
    """Mostly short messages and one long one in a dictionary-encoded column: the text bound is the
    length of each value the pages refer to, not every value times the longest (which would be
    200 × 60 KB = 12 MB here, over the 1 MB budget)."""
    traces = [text_trace(i, 1000) for i in range(200)]
    traces[5] = text_trace(5, 60_000)
    table = our_table(tmp_path, traces)
    path = tmp_path / "skewed.parquet"
    pq.write_table(table, str(path), compression=compression, data_page_version=page_version)
    col = pq.ParquetFile(str(path)).metadata.row_group(0).column(table.schema.get_field_index("messages"))
    assert col.has_dictionary_page and "RLE_DICTIONARY" in col.encodings
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(1 << 20))
    res = load_any(str(path))
    assert not res.problems and len(res.traces) == 200
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(200_000))  # and the budget still holds
    res = load_any(str(path))
    assert not res.traces and len(res.problems) == 1
    assert res.problems[0].reason.startswith("rows 1–200 (200 of 200) not read: at most 200 KB of text are read from one file")


@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_delta_byte_array_columns(tmp_path, monkeypatch, page_version):
    """DELTA_BYTE_ARRAY (Spark's and parquet-mr's v2 writers): a value is a prefix of the one before
    plus a suffix, so a page of a few bytes can repeat one long value in every row. The worker
    counts the decoded text: distinct values load under a tight budget, a long value repeated in
    every row is refused and never sent (pyarrow cannot keep these as dictionaries: decoding them
    is bounded by the worker's cap)."""
    traces = [text_trace(i, 2000) for i in range(300)]
    table = our_table(tmp_path, traces)
    path = tmp_path / "delta.parquet"
    text_columns = [f.name for f in table.schema if f.type == pa.string()]
    pq.write_table(table, str(path), use_dictionary=False, column_encoding={c: "DELTA_BYTE_ARRAY" for c in text_columns},
                   data_page_version=page_version, compression="zstd")
    col = pq.ParquetFile(str(path)).metadata.row_group(0).column(table.schema.get_field_index("messages"))
    assert "DELTA_BYTE_ARRAY" in col.encodings
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(sum(row_text(t) for t in traces) + 100_000))
    res = load_any(str(path))
    assert not res.problems and len(res.traces) == 300

    same = with_column(table, "metadata", pa.array([json.dumps({"note": "m" * 100_000})] * 300))
    bomb = tmp_path / "delta_bomb.parquet"
    pq.write_table(same, str(bomb), use_dictionary=False, column_encoding={c: "DELTA_BYTE_ARRAY" for c in text_columns},
                   data_page_version=page_version, compression="zstd")
    assert os.path.getsize(bomb) < 1_000_000  # 30 MB of metadata
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(10_000_000))
    res = load_any(str(bomb))
    assert not res.traces and len(res.problems) == 1
    assert res.problems[0].reason.startswith("rows 1–300 (300 of 300) not read: at most 10.0 MB of text are read from one "
                                             "file (ALI_MAX_FILE_TEXT_BYTES); rows 1–300 (one row group: read whole or "
                                             "not at all) hold 30.")


@pytest.mark.parametrize("rows_per_group", [1, 3])
def test_row_over_the_text_limit_among_others(tmp_path, monkeypatch, rows_per_group):
    """The same verdicts whether a row is alone in its row group or shares it (checked from the
    decoded Arrow offsets, before any Python string is made). A row's text is that of all its string
    columns."""
    monkeypatch.setenv("ALI_MAX_TRACE_TEXT_BYTES", "20000")
    traces = [text_trace(1, 100), text_trace(2, 50_000), text_trace(3, 100), text_trace(4, 12_000, meta=12_000),
              text_trace(5, 18_000)]
    path = tmp_path / "text.parquet"
    write_groups(path, [traces[i : i + rows_per_group] for i in range(0, len(traces), rows_per_group)])
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t3", "t5"] and res.lines == [1, 3, 5]
    assert [p.line for p in res.problems] == [2, 4]
    # counted by the worker from the decoded offsets: exactly (the reason's figure is in KB)
    for p, t, where in zip(res.problems, (traces[1], traces[3]), ("column messages", "columns messages + metadata")):
        kb, rest = p.reason.split(" KB of text in ", 1)
        assert abs(float(kb) * 1000 - row_text(t)) <= 200, (p.reason, row_text(t))
        assert rest == f"{where}; the limit is 20.0 KB (ALI_MAX_TRACE_TEXT_BYTES)"


def test_file_text_budget_counts_decoded_row_groups(tmp_path, monkeypatch):
    """Row groups are read while their text fits in what is left of ALI_MAX_FILE_TEXT_BYTES; the
    rest is one problem."""
    traces = [text_trace(i, 10_000) for i in range(1, 11)]
    per_group = row_text(traces[0]) + row_text(traces[1])
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(int(3.5 * per_group)))
    path = tmp_path / "text_budget.parquet"
    write_groups(path, [traces[k : k + 2] for k in range(0, 10, 2)])
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert len(res.problems) == 1 and res.problems[0].line == 7
    assert res.problems[0].reason.startswith(f"rows 7–10 (4 of 10) not read: at most {human_bytes(int(3.5 * per_group))} of "
                                             "text are read from one file (ALI_MAX_FILE_TEXT_BYTES); rows 7–8 (one row "
                                             "group: read whole or not at all) hold ")
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(6 * per_group))
    assert len(load_any(str(path)).traces) == 10


@pytest.mark.parametrize("rows_per_group", [1, 3])
def test_text_in_foreign_columns(tmp_path, monkeypatch, rows_per_group):
    """Other tools' files: strings inside lists of structs (HF messages), fixed-size binary values, and
    a column stored as an Arrow dictionary (a pandas categorical) count as text too."""
    monkeypatch.setenv("ALI_MAX_TRACE_TEXT_BYTES", "3000")
    convs = [[{"role": "user", "content": "hi"}]] * 3
    convs[1] = [{"role": "user", "content": "x" * 1000} for _ in range(4)]
    blobs = pa.array([[b"a" * 500], [b"b" * 500] * 2, [b"c" * 500] * 7], pa.list_(pa.binary(500)))
    labels = pa.array(["short", "short", "short"]).dictionary_encode()
    table = pa.table({"messages": convs, "blobs": blobs, "label": labels})
    path = tmp_path / "foreign.parquet"
    pq.write_table(table, str(path), row_group_size=rows_per_group)
    rows = parquet_rows(str(path))
    assert [n for n, _ in rows] == [1, 2, 3]
    assert rows[0][1] == {"messages": convs[0], "blobs": [b"a" * 500], "label": "short"}
    assert rows[1][1].reason.endswith("of text in columns messages + blobs; the limit is 3.0 KB (ALI_MAX_TRACE_TEXT_BYTES)")
    assert rows[2][1].reason.endswith("of text in column blobs; the limit is 3.0 KB (ALI_MAX_TRACE_TEXT_BYTES)")

    # pyarrow writes an Arrow dictionary whole in each row group, entries no row refers to included
    big_label = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["short", "l" * 5000, "unused"]))
    pq.write_table(pa.table({"label": big_label}), str(path), row_group_size=rows_per_group)
    assert pq.ParquetFile(str(path)).schema_arrow.field("label").type == big_label.type
    rows = parquet_rows(str(path))
    if rows_per_group == 1:  # each row group's dictionary holds the 5 KB entry (decoded whole): none is sent
        assert [r.reason for _, r in rows] == ["5.0 KB of text in column label; the limit is 3.0 KB (ALI_MAX_TRACE_TEXT_BYTES)"] * 3
    else:
        assert rows[0][1] == {"label": "short"} and rows[2][1] == {"label": "short"}
        assert rows[1][1].reason == "5.0 KB of text in column label; the limit is 3.0 KB (ALI_MAX_TRACE_TEXT_BYTES)"


def test_damaged_string_pages_are_problems_not_crashes(tmp_path, monkeypatch):
    """Bytes of a dictionary page and of the data pages after it overwritten at random: each load
    ends with traces and problems, never an exception, and no more text than the budget."""
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", "400000")
    traces = [text_trace(i, 1000) for i in range(100)]
    traces[3] = text_trace(3, 30_000)
    table = our_table(tmp_path, traces)
    clean = tmp_path / "clean.parquet"
    for compression in ("none", "zstd"):
        pq.write_table(table, str(clean), compression=compression)
        col = pq.ParquetFile(str(clean)).metadata.row_group(0).column(table.schema.get_field_index("messages"))
        start = col.dictionary_page_offset
        end = start + col.total_compressed_size
        data = clean.read_bytes()
        rng = random.Random(1)
        path = tmp_path / "damaged.parquet"
        for _ in range(150):
            b = bytearray(data)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(start + 20, end)] = rng.randrange(256)
            path.write_bytes(bytes(b))
            res = load_any(str(path))
            assert len(res.traces) + len(res.problems) >= 1
            assert sum(row_text(t) for t in res.traces) <= 400_000


@pytest.mark.parametrize("encoding", ["dictionary", "DELTA_BYTE_ARRAY", "PLAIN"])
def test_garbage_in_page_bodies_is_a_problem_not_a_crash(tmp_path, monkeypatch, encoding):
    """Random bytes in the pages of every column (dictionary pages, levels, dictionary indices,
    DELTA_BYTE_ARRAY prefix lengths, values): each load ends with traces and problems, never an
    exception, and no more text than the budget (what pyarrow makes of them is decoded in the worker)."""
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", "200000")
    traces = [text_trace(i, 1000) for i in range(40)]
    traces[3] = text_trace(3, 30_000)
    table = our_table(tmp_path, traces)
    clean = tmp_path / "clean.parquet"
    strings = [f.name for f in table.schema if f.type == pa.string()]
    options = {"dictionary": {}, "PLAIN": {"use_dictionary": False},
               "DELTA_BYTE_ARRAY": {"use_dictionary": False, "column_encoding": {c: "DELTA_BYTE_ARRAY" for c in strings},
                                    "data_page_version": "2.0"}}[encoding]
    pq.write_table(table, str(clean), compression="none", **options)
    md = pq.ParquetFile(str(clean)).metadata.row_group(0)
    chunks = [(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset, c.total_compressed_size)
              for c in (md.column(j) for j in range(md.num_columns))]
    data = clean.read_bytes()
    rng = random.Random(2)
    path = tmp_path / "damaged.parquet"
    for _ in range(40):
        b = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            start, size = rng.choice(chunks)
            b[start + rng.randrange(min(16, size - 1), size)] = rng.randrange(256)  # past most of the page header
        path.write_bytes(bytes(b))
        res = load_any(str(path))
        assert len(res.traces) + len(res.problems) >= 1
        assert sum(row_text(t) for t in res.traces) <= 200_000


def test_text_budget_is_exact(tmp_path, monkeypatch):
    """The text charged to ALI_MAX_FILE_TEXT_BYTES is what the rows decode to, counted in the worker
    (a dictionary-encoded column is not counted as every value times the longest): a budget of
    exactly the file's text reads it all, one byte less refuses its row group."""
    traces = [text_trace(i, 1000) for i in range(200)]
    traces[5] = text_trace(5, 60_000)
    path = tmp_path / "skewed.parquet"
    write_parquet(traces, str(path))
    total = sum(row_text(t) for t in traces)
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(total))
    res = load_any(str(path))
    assert len(res.traces) == 200 and not res.problems
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", str(total - 1))
    res = load_any(str(path))
    assert not res.traces and [(p.line, p.reason) for p in res.problems] == [
        (1, f"rows 1–200 (200 of 200) not read: at most {human_bytes(total - 1)} of text are read from one file "
            f"(ALI_MAX_FILE_TEXT_BYTES); rows 1–200 (one row group: read whole or not at all) hold {human_bytes(total)} "
            f"and {human_bytes(total - 1)} are left")]


def test_text_limits_read_from_the_environment_at_call_time(monkeypatch):
    for k in ("ALI_MAX_TRACE_TEXT_BYTES", "ALI_MAX_FILE_TEXT_BYTES"):
        monkeypatch.delenv(k, raising=False)
    assert (max_trace_text_bytes(), max_file_text_bytes()) == (64 << 20, 256 << 20)
    monkeypatch.setenv("ALI_MAX_TRACE_TEXT_BYTES", "123")
    monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", "456")
    assert (max_trace_text_bytes(), max_file_text_bytes()) == (123, 456)
    for bad in ("lots", "0", "-5"):
        monkeypatch.setenv("ALI_MAX_FILE_TEXT_BYTES", bad)
        with pytest.raises(TraceFileError, match="ALI_MAX_FILE_TEXT_BYTES"):
            max_file_text_bytes()


# ---- JSON / JSONL ----------------------------------------------------------------------------------


def test_jsonl_and_json_traces_over_the_token_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("ALI_MAX_TRACE_TOKENS", "20")
    traces = [small_trace(1), small_trace(2, 15, 15), small_trace(3)]
    jsonl = tmp_path / "t.jsonl"
    write_jsonl(traces, str(jsonl))
    res = load_any(str(jsonl))
    assert [t.id for t in res.traces] == ["t1", "t3"] and res.lines == [1, 3]
    assert [(p.line, p.reason) for p in res.problems] == [(2, "30 token ids in prompt_ids + response_ids; the limit is 20 (ALI_MAX_TRACE_TOKENS)")]
    whole = tmp_path / "t.json"
    whole.write_text(json.dumps([t.to_dict() for t in traces]))
    res = load_any(str(whole))
    assert [t.id for t in res.traces] == ["t1", "t3"] and [p.line for p in res.problems] == [2]
    # our trace records met by the importer, and a verl record with too many ids: refused before
    # anything is rendered or copied
    verl = tmp_path / "verl.jsonl"
    verl.write_text(json.dumps({"id": "v", "prompt_ids": [1] * 12, "response_ids": [2] * 12}) + "\n"
                    + json.dumps(traces[1].to_dict()) + "\n")
    res = import_file(str(verl), "auto")
    assert not res.traces
    assert [(p.line, p.reason.split(";")[0]) for p in res.problems] == [(1, "24 token ids in prompt_ids + response_ids"),
                                                                        (2, "30 token ids in prompt_ids + response_ids")]


def test_limits_read_from_the_environment_at_call_time(monkeypatch):
    monkeypatch.delenv("ALI_MAX_TRACE_TOKENS", raising=False)
    monkeypatch.delenv("ALI_MAX_FILE_VALUES", raising=False)
    assert (max_trace_tokens(), max_file_values()) == (4_000_000, 8_000_000)
    monkeypatch.setenv("ALI_MAX_TRACE_TOKENS", "123")
    monkeypatch.setenv("ALI_MAX_FILE_VALUES", "456")
    assert (max_trace_tokens(), max_file_values()) == (123, 456)
    for bad in ("lots", "0", "-5", "1.5"):
        monkeypatch.setenv("ALI_MAX_FILE_VALUES", bad)
        with pytest.raises(TraceFileError, match="ALI_MAX_FILE_VALUES"):
            max_file_values()


# ---- damaged page headers ---------------------------------------------------------------------------


def test_damaged_page_headers_are_problems_not_crashes(tmp_path):
    """Bytes overwritten at random where the page headers of the middle row group are: that row
    group loads or is one problem, the others always load, and nothing raises."""
    path = tmp_path / "clean.parquet"
    write_groups(path, [[small_trace(1)], [small_trace(2)], [small_trace(3)]])
    md = pq.ParquetFile(str(path)).metadata.row_group(1)
    starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
              for c in (md.column(j) for j in range(md.num_columns))]
    data = path.read_bytes()
    rng = random.Random(0)
    damaged = tmp_path / "damaged.parquet"
    for _ in range(40):
        b = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            b[rng.choice(starts) + rng.randrange(0, 24)] = rng.randrange(256)
        damaged.write_bytes(bytes(b))
        res = load_any(str(damaged))
        assert {"t1", "t3"} <= {t.id for t in res.traces}
        assert {p.line for p in res.problems} <= {2}


def test_damaged_column_chunk_is_a_problem_not_a_crash(tmp_path):
    """Page headers overwritten with garbage: that row group is reported, the others load."""
    path = tmp_path / "damaged.parquet"
    write_groups(path, [[small_trace(1)], [small_trace(2)], [small_trace(3)]])
    md = pq.ParquetFile(str(path)).metadata.row_group(1).column(5)  # response_ids of row 2
    start = md.dictionary_page_offset if md.has_dictionary_page else md.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 4] = b"\x00\x00\x00\x00"  # a header that ends before saying anything
    path.write_bytes(bytes(data))
    res = load_any(str(path))
    assert [t.id for t in res.traces] == ["t1", "t3"]
    assert [p.line for p in res.problems] == [2] and res.problems[0].reason.startswith("row 2 not read: ")


def test_many_small_pages_load(tmp_path):
    """Pages of a few values each (the page-header reader this replaced stopped after 100,000
    headers read in Python): pyarrow reads them in the worker, and the file loads whole."""
    traces = [small_trace(k, 40, 40) for k in range(1, 301)]
    path = tmp_path / "pages.parquet"
    pq.write_table(our_table(tmp_path, traces), str(path), data_page_size=16, row_group_size=100, write_batch_size=1)
    res = load_any(str(path))
    assert [t.id for t in res.traces] == [t.id for t in traces] and not res.problems
    assert res.traces[-1].prompt_ids == traces[-1].prompt_ids


# ---- how many traces and problems one file may produce --------------------------------------------


def test_minimal_traces_stop_at_the_per_file_limit(tmp_path, monkeypatch):
    """A 30-byte line is a ~2 KB Trace: a 200 MB upload of them was ~13 GB. At most
    ALI_MAX_TRACES_PER_FILE traces are read; the rest is reported once, by line, row or record."""
    monkeypatch.setenv("ALI_MAX_TRACES_PER_FILE", "10")
    p = tmp_path / "many.jsonl"
    p.write_text("".join(json.dumps({"format_version": 1, "id": f"t{i}"}) + "\n" for i in range(50)), encoding="utf-8")
    res = load_any(str(p))
    assert [t.id for t in res.traces] == [f"t{i}" for i in range(10)]
    (prob,) = res.problems
    assert prob.line == 11 and "at most 10 traces" in prob.reason and "ALI_MAX_TRACES_PER_FILE" in prob.reason
    j = tmp_path / "many.json"
    j.write_text(json.dumps([{"format_version": 1, "id": f"t{i}"} for i in range(50)]), encoding="utf-8")
    res = load_any(str(j))
    assert len(res.traces) == 10 and res.problems[-1].line == 11
    pq_path = tmp_path / "many.parquet"
    write_parquet([small_trace(i) for i in range(30)], str(pq_path))
    res = load_any(str(pq_path))
    assert len(res.traces) == 10 and res.problems[-1].line == 11 and "row 11 and after" in res.problems[-1].reason
    # exactly at the limit: nothing is reported
    p.write_text("".join(json.dumps({"format_version": 1, "id": f"t{i}"}) + "\n" for i in range(10)), encoding="utf-8")
    res = load_any(str(p))
    assert len(res.traces) == 10 and not res.problems


def test_bad_records_past_the_listed_limit_are_counted_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ALI_MAX_LISTED_PROBLEMS", "100")
    p = tmp_path / "bad.jsonl"
    good = json.dumps({"format_version": 1, "id": "ok"})
    p.write_text("1\n" * 5000 + good + "\n", encoding="utf-8")
    res = load_any(str(p))
    assert [t.id for t in res.traces] == ["ok"]
    assert len(res.problems) == 100 and res.problem_count == 5000
    assert [x.line for x in res.problems] == list(range(1, 101))
    assert "5000 bad record(s) (100 listed)" in res.summary()
    # the app says how many there were and how many it lists
    from ui import trace_files
    from ui.context import AppContext, Session

    status, probs = trace_files.load_file(AppContext(), Session(), str(p))
    assert "5000 bad record(s)" in status and "the first 100 listed below" in status and len(probs) == 100


# ---- the Parquet worker: its memory cap, its time limit, its replacement, the app's shutdown -------


@pytest.fixture
def make_pool():
    pools: list[ParquetPool] = []

    def make(**kw) -> ParquetPool:
        kw.setdefault("start_timeout_s", 120)  # generous: start-up is not what these tests time
        pool = ParquetPool(**kw)
        pools.append(pool)
        return pool

    yield make
    for p in pools:
        p.close()


def rows_with(pool: ParquetPool, path) -> list:
    """``(row number, row or LoadProblem)`` of a Parquet file, read with ``pool``'s workers."""
    return list(iter_parquet_rows(pq.ParquetFile(str(path)), str(path), pool=pool))


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(pred, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_decode_over_the_memory_cap_is_refused_and_the_rest_loads(tmp_path, make_pool):
    """A footer that says 3,000,000 values over pages of 5·10⁷ passes the footer's checks; decoding
    those pages (400 MB of ids) passes a worker's cap of 768 MiB. That row group is one problem with
    the reason, the worker is replaced, the rows around it load, and this process never held them."""
    path = tmp_path / "lie.parquet"
    write_understated(path, HUGE, 3_000_000, after=True)
    pool = make_pool(size=1, memory_bytes=768 << 20)
    assert pool.start() == 1
    (pid,) = pool.pids()
    rows = rows_with(pool, path)
    assert [n for n, _ in rows] == [1, 2, 3]
    assert rows[0][1]["id"] == "t1" and rows[2][1]["id"] == "after"
    assert rows[1][1].reason == ("row 2 not read: decoding row group 2 (of 3) needs more than the 768 MiB memory limit "
                                 "of the Parquet worker (ALI_PARQUET_MEMORY_BYTES)")
    wait_for(lambda: not alive(pid))  # the worker that failed is gone, another took its place
    assert pool.pids() and pid not in pool.pids()


def test_a_decode_over_the_time_limit_is_stopped_and_the_worker_replaced(tmp_path, make_pool):
    """A time limit no decode can meet (0 s: the answer is awaited once, at once): each row group is
    stopped, its worker killed and replaced; after three, the rest of the file is one problem. The
    same pool then reads the file whole under a real limit."""
    rng = np.random.default_rng(0)
    path = tmp_path / "slow.parquet"
    with pq.ParquetWriter(str(path), pa.schema([("x", pa.int64())]), compression="none") as w:
        for _ in range(5):  # 0.8 MB of random ints a row group: milliseconds to decode and send
            w.write_table(pa.table({"x": rng.integers(0, 2**62, 100_000)}))
    pool = make_pool(size=1, timeout_s=0)
    assert pool.start() == 1
    (pid,) = pool.pids()
    rows = rows_with(pool, path)
    assert [(n, r.reason) for n, r in rows] == [
        *[(1 + g * 100_000, f"rows {1 + g * 100_000:,}–{(g + 1) * 100_000:,} not read: decoding row group {g + 1} "
                            "(of 5) took longer than the 0 s time limit of the Parquet worker; it was stopped "
                            "(ALI_PARQUET_TIMEOUT_S)") for g in range(3)],
        (300_001, "rows 300,001–500,000 (200,000 of 500,000) not read: the Parquet worker failed on 3 row groups of "
                  "this file"),
    ]
    wait_for(lambda: not alive(pid))
    pool.timeout_s = 120
    read = iter_parquet_rows(pq.ParquetFile(str(path)), str(path), pool=pool)
    assert sum(isinstance(r, dict) for _, r in read) == 500_000
    assert pid not in pool.pids()


def test_the_pool_comes_back_after_a_worker_dies(tmp_path, make_pool):
    """A worker killed while idle (out of memory, an operator's kill): the next file is read by its
    replacement, whole."""
    path = tmp_path / "three.parquet"
    write_groups(path, [[small_trace(1)], [small_trace(2), small_trace(3)]])
    pool = make_pool(size=1)
    assert pool.start() == 1
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid))
    rows = rows_with(pool, path)
    assert [(n, r["id"]) for n, r in rows] == [(1, "t1"), (2, "t2"), (3, "t3")]
    assert pool.pids() and pid not in pool.pids()


SHUTDOWN_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from backend.deploy import lifecycle
from backend.importers import load_any
from backend.trace import parquet_guard

lifecycle.install_app()  # as app.py does: the closers and the signal handlers
res = load_any(sys.argv[2])  # starts the Parquet workers
pids = parquet_guard.POOL.pids()
report = lifecycle.shutdown(20)
print(json.dumps({"traces": len(res.traces), "pids": pids, "left": [p for p in pids if os.path.exists(f"/proc/{p}")],
                  "report": report}))
"""


def test_the_apps_shutdown_closes_the_parquet_workers(tmp_path):
    """The app's shutdown (SIGTERM: backend.deploy.lifecycle) closes the Parquet workers as it closes the
    template workers: none is left for the final sweep to kill, and the shutdown is clean."""
    path = tmp_path / "t.parquet"
    write_parquet([small_trace(1), small_trace(2)], str(path))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", SHUTDOWN_SCRIPT, ROOT, str(path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["traces"] == 2 and out["pids"] and out["left"] == []
    report = out["report"]
    assert {"name": "worker pools", "status": "ok"} == {k: v for k, v in
                                                         next(c for c in report["closers"] if c["name"] == "worker pools").items()
                                                         if k in ("name", "status")}
    assert report["killed"] == [] and report["clean"], report
