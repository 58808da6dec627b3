#!/usr/bin/env bash
# Set up everything (Python packages and Debian's chromium), lint (ruff, configured in
# pyproject.toml; any finding fails the run) and run the whole test suite: what CI runs (.ci/run).
#   bash scripts/test.sh [PYTEST_ARGS...]          everything
#   bash scripts/test.sh --fast [PYTEST_ARGS...]   the edit loop: no chromium install, and only the
#       tests marked neither slow, vllm nor browser (pytest.ini); a -m of yours replaces that one
# Both run on ALI_TEST_WORKERS pytest-xdist workers (default 2; 0 runs one process).
#   bash scripts/test.sh --fast --cov [...]    the edit loop with line coverage of backend/, ui/ and
#       app.py (.cache/coverage.json; scripts/coverage_zero.py lists the modules left at 0 %)
#   bash scripts/test.sh --changed [--fast] [...]  only the test files that reach what changed since
#       main, committed or not (scripts/changed_tests.py --explain says why each is picked)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
changed=0
cov=0
args=()
for a in "$@"; do
  case "$a" in
    --fast) fast=1 ;;
    --changed) changed=1 ;;
    --cov) cov=1 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$fast" = 1 ]; then
  bash scripts/setup.sh
  args=(-m "not slow and not vllm and not browser" ${args[@]+"${args[@]}"})
  # tests with a volume knob run their short form (the parser fuzzing: a fifth of its seeded cases)
  export ALI_TEST_FAST=1
else
  bash scripts/setup.sh --browser
fi
# tests never use the Hugging Face Hub
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# bytecode is cached in __pycache__ (git ignores it), whatever the caller's environment says:
# with PYTHONDONTWRITEBYTECODE set (these machines set it) pytest rewrote the asserts of every
# test module in each worker on every run (collection 25 s instead of 11 s, both workers), and
# every process the tests start compiled again what it imported
unset PYTHONDONTWRITEBYTECODE
# one CPU thread for torch (and MKL) in each process the tests start, unless the caller says
# otherwise: the workers already keep every core busy, and a second intra-op thread only adds
# its spinning and syncing (the torch-heavy files: 16 % less CPU time for the same wall time,
# docs/benchmarks.md). vLLM's CPU engine runs one thread here either way.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
.venv/bin/python -m ruff check backend ui app.py tests bench scripts
if [ "$changed" = 1 ]; then
  mapfile -t picked < <(.venv/bin/python scripts/changed_tests.py)
  if [ "${#picked[@]}" = 0 ]; then
    echo "nothing changed since ${BASE:-main}: no tests to run"
    exit 0
  fi
  echo "running ${#picked[@]} test file(s) that reach the change (scripts/changed_tests.py --explain says why)"
  args+=("${picked[@]}")
fi
# ALI_TEST_WORKERS pytest-xdist workers (default 2; 0: one process). A test file runs on one
# worker, and the files with vLLM tests on one worker together (tests/conftest.py)
workers=${ALI_TEST_WORKERS:-2}
if [ "$workers" != 0 ]; then
  # the groups in the order tests/conftest.py gives them (costliest first), not xdist's (largest count first)
  args=(-n "$workers" --dist loadgroup --no-loadscope-reorder ${args[@]+"${args[@]}"})
fi
if [ "$cov" = 1 ]; then
  mkdir -p .cache
  .venv/bin/python -m pytest --cov=backend --cov=ui --cov=app --cov-report=json:.cache/coverage.json \
    ${args[@]+"${args[@]}"}
  exec .venv/bin/python scripts/coverage_zero.py .cache/coverage.json
fi
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
