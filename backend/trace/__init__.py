"""The one trace type and its files.

- :mod:`backend.trace.model`: :class:`Trace` and its parts, and the checks a record passes.
- :mod:`backend.trace.io`: reading and writing trace files (JSONL, JSON, Parquet);
  :mod:`backend.trace.index`: the lazy :class:`TraceIndex` over them (one row per trace, each
  opened by its bytes); :mod:`backend.trace.limits`: what a file may cost.

Everything is re-exported here, so ``from backend.trace import Trace`` is the usual import.
"""

from backend.trace.index import INDEX_COLUMNS, IndexedFile, TraceIndex  # noqa: F401
from backend.trace.io import (  # noqa: F401
    PARQUET_KIND,
    Source,
    append_jsonl,
    is_trace_parquet,
    iter_jsonl_records,
    iter_records,
    iter_traces,
    load_traces,
    parquet_row,
    parquet_schema,
    read_lines,
    read_parquet_traces,
    sniff,
    trace_from_row,
    trace_of,
    trace_of_row,
    write_jsonl,
    write_lines,
    write_parquet,
)
from backend.trace.limits import (  # noqa: F401
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILE_TEXT_BYTES,
    DEFAULT_MAX_FILE_VALUES,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_LISTED_PROBLEMS,
    DEFAULT_MAX_TRACE_TOKENS,
    DEFAULT_MAX_TRACES_PER_FILE,
    LoadProblem,
    LoadResult,
    ProblemList,
    TraceFileError,
    check_file_size,
    human_bytes,
    line_too_long,
    max_file_text_bytes,
    max_file_values,
    max_listed_problems,
    max_trace_text_bytes,
    max_trace_tokens,
    max_traces_per_file,
    record_tokens_problem,
    too_many_tokens,
)
from backend.trace.model import (  # noqa: F401
    FORMAT_VERSION,
    MAX_JSON_DEPTH,
    MAX_TOKEN_ID,
    JsonFloat,
    MessageSpan,
    ParseError,
    Refused,
    Span,
    Step,
    StepState,
    TokenizerInfo,
    ToolCall,
    ToolResult,
    Trace,
    TraceFormatError,
    json_error_reason,
    json_type,
    new_trace_id,
    parse_json_record,
)
