"""``python -m backend ARGS`` run in the test's own process: the same ``main(argv)`` that
``backend/__main__.py`` calls, with stdout and stderr captured and the exit status returned as a
:class:`subprocess.CompletedProcess`, so a test reads it exactly as it read a subprocess.

Why: a subprocess pays Python's start and the imports of transformers and the backend (~4 s on a
quiet machine, twice that under the suite's load) before the command does anything, and the suite
ran ~150 of them. What stays a subprocess, by design: what only a process can show (exit on a
signal, a kill mid-run and resume, vLLM writing to the process's stdout, ``--help`` of the real
entry point); those tests call ``subprocess`` themselves. ``tests/test_cli.py`` keeps one
subprocess run of each command as the user runs it, to hold the in-process runs to the real one.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from backend.cli import main


def _set_env(values: dict[str, str | None]) -> None:
    """Set each variable of VALUES in ``os.environ``; a value of None removes it."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _env(extra: dict[str, str | None]):
    """``os.environ`` with EXTRA set (a value of None removes the variable), restored after."""
    saved = {k: os.environ.get(k) for k in extra}
    try:
        _set_env(extra)
        yield
    finally:
        _set_env(saved)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``main(ARGS)`` with stdout/stderr captured; argparse's exits (usage errors, --help) become
    the exit status as they would in a process. ENV: variables set for this call only."""
    out, err = io.StringIO(), io.StringIO()
    argv = [str(a) for a in args]
    with _env({"HF_HUB_OFFLINE": "1", **(env or {})}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=err)
    return subprocess.CompletedProcess(["python", "-m", "backend", *argv], code, out.getvalue(), err.getvalue())
