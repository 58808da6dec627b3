#!/usr/bin/env bash
# Set up everything (Python packages and Debian's chromium), lint (ruff, configured in
# pyproject.toml; any finding fails the run) and run the whole test suite: what CI runs (.ci/run).
#   bash scripts/test.sh [PYTEST_ARGS...]          everything
#   bash scripts/test.sh --fast [PYTEST_ARGS...]   the edit loop: no chromium install, and only the
#       tests marked neither slow, vllm nor browser (pytest.ini); a -m of yours replaces that one
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
args=()
for a in "$@"; do
  if [ "$a" = --fast ]; then fast=1; else args+=("$a"); fi
done
if [ "$fast" = 1 ]; then
  bash scripts/setup.sh
  args=(-m "not slow and not vllm and not browser" ${args[@]+"${args[@]}"})
else
  bash scripts/setup.sh --browser
fi
# tests never use the Hugging Face Hub
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m ruff check backend ui app.py tests bench scripts
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
