#!/usr/bin/env bash
# Set up everything (Python packages and Debian's chromium), lint (ruff, configured in
# pyproject.toml; any finding fails the run) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
# tests never use the Hugging Face Hub
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m ruff check backend ui app.py tests bench scripts
exec .venv/bin/python -m pytest "$@"
