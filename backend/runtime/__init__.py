"""Process machinery every layer may use: where built artefacts live and how each is built once
(:mod:`~backend.runtime.cache`), long-lived worker processes under a memory cap and a time limit for
untrusted work (:mod:`~backend.runtime.worker_pool`), and GPU work inside a ZeroGPU lease
(:mod:`~backend.runtime.zerogpu`). Its modules import nothing of the project (standard library
only), so the trace layer, the token core, the families, the generators and the checks all build on
them. What knows about traces, templates, models or visitors does not belong here: the guarded
readers and renders that use the worker pool live beside what they read (``trace/parquet_guard``,
``tokens/template_guard``, ``safety/pickle_guard``), and the app's own start-up and shutdown are in
:mod:`backend.deploy`.
"""
