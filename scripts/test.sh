#!/usr/bin/env bash
# Set up everything (Python packages and Debian's chromium) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
exec .venv/bin/python -m pytest "$@"
