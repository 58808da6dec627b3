"""Traces out to other tools' formats, beside :mod:`backend.importers` (which reads them in):
``python -m backend export --to ...`` (:mod:`~backend.exporters.export`: JSONL, Parquet, HF chat
rows, verl rows) and OpenTelemetry GenAI spans as OTLP JSON (:mod:`~backend.exporters.export_otel`).
An exporter reads a :class:`~backend.trace.Trace` and writes a file; it never re-tokenizes or
checks. Our own trace format's reader and writers belong to :mod:`backend.trace.io`, a new
foreign format's writer here as one more module.
"""
