"""What the commands that read trace files and write one (``import``, ``export``) share: their
parser with its exit statuses, and the checks on the input and output paths."""

from __future__ import annotations

import argparse
import os

from backend.cli import CLIError


def add_file_command(sub, name: str, help: str, what: str, ok: str, some_bad: str, nothing: str) -> argparse.ArgumentParser:
    """The sub-command's parser; its description ends with the three exit statuses (0 ``ok``,
    1 ``some_bad``, 2 ``nothing``), which every file command keeps."""
    return sub.add_parser(name, help=help, description=f"{what} Exit status: 0 {ok}; 1 {some_bad}; 2 {nothing}.")


def check_paths(inputs: list[str], out: str, *, missing: str, same: str) -> None:
    """Every input exists (else ``"<missing>: <path>"``) and none is the output (else ``same``)."""
    for path in inputs:
        if not os.path.exists(path):
            raise CLIError(f"{missing}: {path}")
        if os.path.abspath(path) == os.path.abspath(out):
            raise CLIError(same)
