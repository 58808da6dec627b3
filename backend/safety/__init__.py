"""The boundary between operator and visitor input, and the reading of files that are programs.
:mod:`~backend.safety.trust` decides what a visitor may name in public mode and clamps every
number a visitor sends; :mod:`~backend.safety.pickle_guard` reads a torch ``.pt`` or pickle of
unknown origin in a capped worker with an allow-list of globals, using the inert stand-ins of
:mod:`~backend.safety.pickle_standins`. The worker pool itself is :mod:`backend.runtime.worker_pool`
(the template and Parquet guards use it too, from below this package), and a guard that is part of
how a layer reads or renders stays in that layer (``tokens/template_guard``,
``trace/parquet_guard``); what the app does with a decision (widgets, API checks) is the UI's.
"""
