"""An anonymous visitor against the real app in public mode: nothing on the server's disk, in its
environment or on the Hub can be reached through any endpoint, and no visitor can hold the
server's memory, run slots or disk.

The real ``app.py`` runs in a subprocess (``--backend scripted --public --host 127.0.0.1``, a free
port) and is driven over HTTP exactly as a visitor would: gradio's ``/gradio_api/call/<name>``
route (each call a fresh session, payloads exactly as sent, a file parameter given a *server*
path without uploading anything), ``gradio_client`` for uploads and concurrent runs, and a raw
multipart POST to gradio's upload route.

* **Endpoint sweep with canaries.** A folder holds canary files carrying a random secret:
  ``canary.txt``, a file named exactly ``qwen3`` (a trl template name) and ``qwen3.jinja`` and
  ``canary.jinja`` (Jinja that would render the secret), a folder that looks like a tokenizer
  (``tokenizer_config.json``, ``chat_template.jinja``, and a real ``tokenizer.json`` so that it
  would load). The app's endpoints come from its own API description (``view_api`` and gradio's
  ``info?all_endpoints=True``, so undocumented ones too, and any endpoint added later): every
  str-typed parameter of every endpoint gets every canary path (absolute, ``file://``, with
  ``..`` segments, relative to the app's working directory), ``/proc/self/environ``, Jinja that
  tries ``{% include %}`` / ``{% extends %}`` of a canary, and a Hub repo id, while the other
  parameters keep their defaults (where a free-text field is only read when a dropdown says
  "custom", that dropdown is set too). Every reply (outputs, streamed updates, errors, and every
  file a reply points to, fetched over HTTP) must not contain the secret, nor the value of an
  environment variable set only on the app process. File parameters get a canary's server path
  as a FileData and as a plain string. An endpoint wired to exactly the same components as one
  already swept (the message box's Enter and the Send button) gets the absolute paths only.
* **No existence oracle.** For the tokenizer / template fields the reply for an existing path and
  for a missing one must be the same (after replacing the path itself).
* **No Hub requests.** The app runs with ``HF_ENDPOINT`` pointing at a local recorder and without
  ``HF_HUB_OFFLINE``; after the sweep sent ``openai-community/gpt2-canary-<random>`` to every
  str parameter, no recorded request names that repo.
* **Parquet bomb.** A ~30 KB zstd Parquet file in ``backend.exporters.export.write_parquet``'s layout whose
  one row holds 5·10⁷ response ids: uploading it raises the server's peak memory (``VmHWM``) by
  under 1 GB, and the status says the row was refused and why.
* **Upload size.** A 250 MB upload to ``/gradio_api/upload`` is refused (413) and nothing of that
  size is left in the app's temp dirs.
* **Run time limit / slots.** A run that would take minutes at the largest delay the UI offers
  ends at ``ALI_RUN_TIMEOUT_S`` (and a second run in the same session meanwhile is refused); four
  runs from four sessions with absurd delays (the slider's ``1e9``, a script entry's own
  ``token_delay_s: 1e9``) cannot hold the four run slots: a fifth visitor's run finishes within
  3x the run limit, and each absurd run ended with a status that says why.
* **Local mode** (``--local``): the same sweep (fewer values, over the endpoints that take a
  tokenizer or template) does find the secret, e.g. the Template lab renders ``canary.jinja``
  when its path is typed as the custom template: proof that the sweep sees a leak when there is one.
"""

from __future__ import annotations

import html
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # the real app in public mode, started per module: minutes (scripts/test_durations.py); CI runs it

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "sample_traces"

STARTUP_TIMEOUT_S = 240  # the app's first start on a busy 2-core machine
CALL_TIMEOUT_S = 120  # any one API call: a bound on a hang, not a measurement
RUN_TIMEOUT_S = 15  # ALI_RUN_TIMEOUT_S of the public app
SWEEP_THREADS = 6
MAX_FETCH_BYTES = 64 << 20  # a file a reply points to is read up to this size
BOMB_IDS = 50_000_000
BIG_UPLOAD_BYTES = 250 << 20
RUN_STATUS_TIMEOUT_RE = re.compile(r"time[_ ]limit|timed? ?out|timeout|wall-clock", re.I)

# parameters whose value names a tokenizer or a template: the existence-oracle check looks at them
LOCATOR_LABEL_RE = re.compile(r"tokeni[sz]er|template|decode", re.I)


# ---- the app in a subprocess ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    """``app.py`` in its own process group (it starts template workers); log in a file, waits
    bounded, killed on stop."""

    def __init__(self, name: str, args: list[str], workdir: Path, env_set: dict[str, str] | None = None,
                 env_drop: tuple[str, ...] = ()) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.workdir = workdir
        self.gradio_tmp = workdir / "gradio"
        self.tmp = workdir / "tmp"
        self.gradio_tmp.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "app.log"
        env = {k: v for k, v in os.environ.items() if k not in env_drop}
        env.update({"GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", "GRADIO_TEMP_DIR": str(self.gradio_tmp),
                    "TMPDIR": str(self.tmp), **(env_set or {})})
        self.cmd = [sys.executable, "app.py", "--backend", "scripted", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name}: `{' '.join(self.cmd[1:])}` exited with {self.proc.returncode} "
                                     f"(does app.py know these flags?):\n{self.log_tail()}")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: app.py did not answer within {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def proc_status(self, pid: int | None = None) -> dict[str, int]:
        """VmHWM / VmRSS (bytes) of the app process (or ``pid``)."""
        out: dict[str, int] = {}
        with open(f"/proc/{pid or self.proc.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    out[k] = int(v.split()[0]) * 1024
        return out

    def descendants(self) -> list[int]:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.proc.pid]
        while todo:
            for c in kids.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    def reset_peak(self, pids: list[int]) -> bool:
        """Reset VmHWM (``/proc/PID/clear_refs`` 5) so the next reading is the peak from now on."""
        ok = True
        for pid in pids:
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                ok = False
        return ok

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this test started (app + its workers)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
        try:  # template workers left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.log.close()


def started(request, app: AppProcess):
    """Wait for ``app``; yield it; stop it, printing its log tail if a test failed meanwhile."""
    failed_before = request.session.testsfailed
    try:
        app.wait_ready()
        yield app
    finally:
        app.stop()
        if request.session.testsfailed > failed_before:
            print(f"\n---- {app.name}: app.py log tail ({app.log_path}) ----\n{app.log_tail(80)}\n----")


# ---- a recorder standing in for the Hugging Face Hub ------------------------------------------------


class HubRecorder:
    """A loopback HTTP server that records every request line and answers 404."""

    MAX_RECORDS = 10_000

    def __init__(self) -> None:
        self.requests: list[str] = []
        lock = threading.Lock()
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with lock:
                    if len(rec.requests) < rec.MAX_RECORDS:
                        rec.requests.append(f"{self.command} {self.path}")
                n = int(self.headers.get("Content-Length") or 0)
                if 0 < n <= 1 << 20:
                    self.rfile.read(n)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = _answer

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- canaries ----------------------------------------------------------------------------------------


@dataclass
class Canaries:
    folder: Path
    secret: str  # in every canary file's content, never in a path
    env_secret: str  # the value of ALI_TEST_ENV_SECRET, set only on the app process
    repo_id: str  # a Hub repo a visitor types
    files: dict[str, Path] = field(default_factory=dict)  # what -> path (existing)
    missing: dict[str, Path] = field(default_factory=dict)  # what -> a path that does not exist, beside it

    def needles(self) -> list[str]:
        return [self.secret, self.secret[:12], self.env_secret]


def make_canaries(folder: Path) -> Canaries:
    c = Canaries(folder, secret="cnry" + secrets.token_hex(8), env_secret="envsecret" + secrets.token_hex(8),
                 repo_id=f"openai-community/gpt2-canary-{secrets.token_hex(4)}")
    s = c.secret
    jinja = f"{s} {{{{ 1 + 1 }}}} {{% for m in messages %}}{{{{ m['content'] }}}}{{% endfor %}}"
    (folder / "canary.txt").write_text(f"{s} plain text\n")
    (folder / "qwen3").write_text(jinja)  # named exactly as trl's qwen3 template
    (folder / "qwen3.jinja").write_text(jinja)
    (folder / "canary.jinja").write_text(jinja)
    tok = folder / "tokdir"
    tok.mkdir()
    (tok / "chat_template.jinja").write_text(jinja)
    (tok / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": jinja, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "canary": s}))
    # a real tokenizer.json, so the folder would load as a tokenizer if the server read it
    from backend.families.qwen import qwen_tokenizer_dir

    shutil.copy(qwen_tokenizer_dir() / "tokenizer.json", tok / "tokenizer.json")
    (folder / "sub").mkdir()  # for paths with '..' segments
    c.files = {"canary.txt": folder / "canary.txt", "qwen3 file": folder / "qwen3", "qwen3.jinja": folder / "qwen3.jinja",
               "canary.jinja": folder / "canary.jinja", "tokenizer folder": tok,
               "tokenizer_config.json": tok / "tokenizer_config.json"}
    c.missing = {"canary.jinja": folder / "canarx.jinja", "qwen3 file": folder / "nosuchdir" / "qwen3",
                 "tokenizer folder": folder / "tokdix", "/etc/passwd": Path("/etc/passwx-ali-missing")}
    return c


def sweep_values(c: Canaries, full: bool = True) -> list[str]:
    """Every str value a visitor sends to every str parameter."""
    vals = [str(p) for p in c.files.values()]
    if not full:
        return vals
    vals += ["file://" + str(c.files[k]) for k in ("canary.jinja", "qwen3 file", "tokenizer folder")]
    vals += [
        str(c.folder / "sub" / ".." / "qwen3"),
        os.path.relpath(c.folder / "canary.jinja", ROOT),  # relative to the app's working directory, with '..'
        "/proc/self/environ",
        "file:///proc/self/environ",
        "../" * 16 + "proc/self/environ",
        "{% include '" + str(c.files["canary.jinja"]) + "' %}",
        "{% extends '" + str(c.files["canary.txt"]) + "' %}",
        c.repo_id,
    ]
    return vals


# ---- the visitor's HTTP calls ------------------------------------------------------------------------


@dataclass
class Param:
    index: int
    name: str
    label: str
    component: str
    pytype: str
    default: Any
    enum: list[Any] | None
    arg: int = -1  # the argument's position in the call (index: this Param's position in the list)
    key: str | None = None  # a key of the JSON object the argument is (/playground_run's settings)

    @property
    def is_str(self) -> bool:
        return self.pytype == "str" or self.pytype.startswith("Literal[")

    @property
    def is_file(self) -> bool:
        return self.pytype == "filepath" or self.component in ("File", "Uploadbutton")


def api_endpoints(url: str, signatures: dict[str, tuple] | None = None) -> dict[str, list[Param]]:
    """Every endpoint a visitor can call, from the app's own API description: gradio_client's
    ``view_api`` and gradio's ``info?all_endpoints=True`` (which adds the undocumented ones).
    ``signatures`` is filled with each endpoint's (input ids, output ids) from the app's config."""
    signatures = {} if signatures is None else signatures
    import httpx
    from gradio_client import Client

    cl = Client(url, verbose=False, download_files=False)
    api = cl.view_api(return_format="dict", print_info=False)
    info = dict(api["named_endpoints"])
    full = httpx.get(url + "gradio_api/info?all_endpoints=True", timeout=60).json()
    for k, v in full.get("named_endpoints", {}).items():
        info.setdefault(k, v)
    out: dict[str, list[Param]] = {}
    signatures.clear()
    for d in cl.config.get("dependencies", []):
        if d.get("api_name"):
            signatures["/" + str(d["api_name"]).lstrip("/")] = (tuple(d.get("inputs") or ()), tuple(d.get("outputs") or ()))
    for name, ep in info.items():
        ps = []
        for i, p in enumerate(ep["parameters"]):
            t = p.get("type") or {}
            ps.append(Param(i, p.get("parameter_name") or f"param_{i}", str(p.get("label") or ""), str(p.get("component") or ""),
                            str((p.get("python_type") or {}).get("type") or ""),
                            p.get("parameter_default") if p.get("parameter_has_default") else None,
                            t.get("enum") if isinstance(t, dict) else None, i))
        out[name] = expand_settings(name, ps)
    return out


def expand_settings(endpoint: str, ps: list[Param]) -> list[Param]:
    """/playground_run takes its settings as one JSON object: each of its keys (RunSettings'
    fields, code_tools aside) becomes a Param of its own, labelled by the key, swept like any
    other; :func:`call_args` puts them back into the object."""
    if endpoint != "/playground_run":
        return ps
    from ui.playground import RunSettings

    out: list[Param] = []
    for p in ps:
        if p.component.lower() != "json":
            out.append(Param(len(out), p.name, p.label, p.component, p.pytype, p.default, p.enum, p.arg))
            continue
        for k, v in RunSettings().__dict__.items():
            if k == "code_tools":
                continue
            pytype = "str" if isinstance(v, str) else type(v).__name__ if isinstance(v, (int, float)) else ""
            out.append(Param(len(out), f"{p.name}.{k}", k.replace("_", " "), "Json", pytype, v, None, p.arg, k))
    return out


def call_args(params: list[Param], data: list[Any]) -> list[Any]:
    """The call's arguments for one value per Param (keyed Params gathered into their object)."""
    by_arg: dict[int, Any] = {}
    for p, v in zip(params, data):
        if p.key is None:
            by_arg[p.arg] = v
        else:
            by_arg.setdefault(p.arg, {})[p.key] = v
    return [by_arg[i] for i in sorted(by_arg)]


@dataclass
class Reply:
    endpoint: str
    param: str
    label: str
    value: str
    ok: bool
    events: list[Any]  # every (event, data) of the stream
    error: str | None
    fetched: dict[str, str] = field(default_factory=dict)  # url -> content of files the reply points to
    seconds: float = 0.0

    def seen(self) -> str:
        """Everything this reply showed the visitor, as one string."""
        return json.dumps(self.events, ensure_ascii=False) + "\n" + (self.error or "") + "\n" + "\n".join(self.fetched.values())

    def where(self) -> str:
        return f"{self.endpoint} {self.param} ({self.label!r}) = {self.value!r}"


FILE_URL_RE = re.compile(r"(?:https?://[^\s\"'<>]+)?/gradio_api/file=[^\s\"'<>)]+")


class Visitor:
    """One anonymous visitor speaking gradio's HTTP API (each call a fresh session)."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url
        self.http = httpx.Client(timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=10))

    def close(self) -> None:
        self.http.close()

    def call(self, api: str, data: list[Any], timeout: float = CALL_TIMEOUT_S) -> tuple[bool, list[Any], str | None]:
        r = self.http.post(f"{self.url}gradio_api/call{api}", json={"data": data})
        if r.status_code != 200:
            return False, [], f"HTTP {r.status_code}: {r.text}"
        event_id = r.json()["event_id"]
        events: list[Any] = []
        deadline = time.monotonic() + timeout
        with self.http.stream("GET", f"{self.url}gradio_api/call{api}/{event_id}") as s:
            ev = None
            for line in s.iter_lines():
                if time.monotonic() > deadline:
                    raise AssertionError(f"{api} did not answer within {timeout} s (data {json.dumps(data)[:300]})")
                if line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:"):
                    try:
                        payload = json.loads(line[5:].strip())
                    except json.JSONDecodeError:
                        payload = line[5:].strip()
                    if ev != "heartbeat":
                        events.append([ev, payload])
                    if ev == "complete":
                        return True, events, None
                    if ev == "error":
                        return False, events, json.dumps(payload, ensure_ascii=False)
        return False, events, "the event stream ended without a result"

    def fetch_files(self, obj: Any) -> dict[str, str]:
        """The content of every file a reply points to (FileData dicts, /gradio_api/file= links),
        fetched over HTTP as a visitor would."""
        urls: set[str] = set()

        def walk(o: Any) -> None:
            if isinstance(o, dict):
                u, p = o.get("url"), o.get("path")
                if isinstance(u, str) and u:
                    urls.add(u)
                elif isinstance(p, str) and p and (o.get("meta") or {}).get("_type") == "gradio.FileData":
                    urls.add(f"{self.url}gradio_api/file={p}")
                for v in o.values():
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
            elif isinstance(o, str):
                for m in FILE_URL_RE.findall(html.unescape(o)):
                    urls.add(m if m.startswith("http") else self.url.rstrip("/") + m)

        walk(obj)
        out: dict[str, str] = {}
        for u in sorted(urls):
            if not u.startswith(self.url.rstrip("/")):
                continue  # a reply pointing elsewhere: nothing of this server to read there
            try:
                with self.http.stream("GET", u) as r:
                    buf = b""
                    for chunk in r.iter_bytes():
                        buf += chunk
                        if len(buf) >= MAX_FETCH_BYTES:
                            break
                    out[u] = f"[HTTP {r.status_code}] " + buf.decode("utf-8", "replace")
            except Exception as e:  # noqa: BLE001 - a file that cannot be fetched shows nothing
                out[u] = f"[fetch failed: {e!r}]"
        return out


TAG_RE = re.compile(r"<[^>]*>")


def found(needles: list[str], text: str) -> list[str]:
    """The needles in ``text``: as is, and with HTML tags stripped and entities decoded (a token
    view splits text into one element per token)."""
    variants = [text, html.unescape(TAG_RE.sub("", text))]
    return [n for n in needles if any(n in v for v in variants)]


# ---- the sweep ----------------------------------------------------------------------------------------


@dataclass
class Sweep:
    endpoints: dict[str, list[Param]]
    replies: list[Reply]
    seconds: float
    calls: int

    def leaks(self, needles: list[str]) -> list[tuple[Reply, list[str]]]:
        out = []
        for r in self.replies:
            hit = found(needles, r.seen())
            if hit:
                out.append((r, hit))
        return out


DELAY_LABEL_RE = re.compile(r"delay", re.I)
SCRIPT_LABEL_RE = re.compile(r"model outputs|script", re.I)


def baselines(params: list[Param], sweeping: Param) -> list[list[Any]]:
    """The other parameters' values while ``sweeping`` gets the canaries: their defaults (the
    playground's token delay 0 and a one-turn script, so each run is quick); and where the swept
    field is a 'custom' text read only when a dropdown says custom, also with that dropdown set."""
    base = [p.default for p in params]
    for p in params:
        if p is sweeping:
            continue
        if DELAY_LABEL_RE.search(p.label) and p.pytype in ("float", "int"):
            base[p.index] = 0
        elif SCRIPT_LABEL_RE.search(p.label) and p.pytype == "str" and not p.enum:
            base[p.index] = json.dumps(["ok"])
    out = [base]
    if "custom" in sweeping.label.lower():
        v = list(base)
        for p in params:
            customs = [e for e in (p.enum or []) if isinstance(e, str) and "custom" in e.lower()]
            if p is not sweeping and customs:
                v[p.index] = customs[0]
        if v != base:
            out.append(v)
    return out


def run_sweep(url: str, c: Canaries, full: bool = True, locators_only: bool = False) -> Sweep:
    """Every endpoint the app describes, each str parameter given every value (``full``: and the
    missing paths; else the values only), on SWEEP_THREADS visitors. ``locators_only``: only the
    endpoints with a tokenizer / template / decode parameter (LOCATOR_LABEL_RE), where a typed
    path is read at all."""
    sigs: dict[str, tuple] = {}
    eps = api_endpoints(url, sigs)
    if locators_only:
        eps = {name: params for name, params in eps.items()
               if any(p.is_str and LOCATOR_LABEL_RE.search(p.label) for p in params)}
    tasks: list[tuple[str, Param | None, Any, list[Any]]] = []
    seen_sigs: set[tuple] = set()
    for name, params in eps.items():
        # an endpoint wired to exactly the same components as one already swept (Enter and the
        # Send button; one filter per widget) gets the absolute paths only: every endpoint is
        # still probed, in a third of the time
        sig = sigs.get(name)
        twin = sig is not None and sig in seen_sigs
        if sig is not None:
            seen_sigs.add(sig)
        values = sweep_values(c, full and not twin)
        swept = False
        for p in params:
            if p.is_file:
                for f in [*c.files.values(), Path("/proc/self/environ")]:
                    for v in ({"path": str(f), "orig_name": "upload.jsonl", "meta": {"_type": "gradio.FileData"}}, str(f)):
                        data = baselines(params, p)[0]
                        data[p.index] = v
                        tasks.append((name, p, v, data))
                swept = True
            elif p.is_str:
                vals = list(values)
                if full and not twin and LOCATOR_LABEL_RE.search(p.label):  # existing vs missing, for the oracle check
                    vals += [str(x) for x in c.missing.values()] + ["/etc/passwd"]
                for v in vals:
                    for data in baselines(params, p):
                        data = list(data)
                        data[p.index] = v
                        tasks.append((name, p, v, data))
                swept = True
        if not swept:  # no str parameter: still called once, its reply checked too
            tasks.append((name, None, None, [p.default for p in params]))

    local = threading.local()
    visitors: list[Visitor] = []
    lock = threading.Lock()

    def one(task: tuple[str, Param | None, Any, list[Any]]) -> Reply:
        if not hasattr(local, "v"):
            local.v = Visitor(url)
            with lock:
                visitors.append(local.v)
        name, p, v, data = task
        t = time.monotonic()
        ok, events, err = local.v.call(name, call_args(eps[name], data))
        r = Reply(name, p.name if p else "-", p.label if p else "", v if isinstance(v, str) else json.dumps(v), ok, events, err)
        r.fetched = local.v.fetch_files(events)
        r.seconds = time.monotonic() - t
        return r

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(SWEEP_THREADS) as pool:
            replies = list(pool.map(one, tasks))
    finally:
        for v in visitors:
            v.close()
    return Sweep(eps, replies, time.monotonic() - t0, len(tasks))


def describe_leaks(leaks: list[tuple[Reply, list[str]]], c: Canaries, limit: int = 12) -> str:
    lines = []
    for r, hit in leaks[:limit]:
        what = ["the canary secret" if h.startswith(c.secret[:12]) else "the app's env secret" for h in hit]
        text = r.seen()
        i = min((text.find(h) for h in hit if h in text), default=-1)
        ctx = text[max(0, i - 150): i + 150].replace("\n", " ") if i >= 0 else "(found after stripping HTML tags)"
        lines.append(f"  {r.where()}: {', '.join(sorted(set(what)))} came back{' (error reply)' if not r.ok else ''}: …{ctx}…")
    more = f"\n  … and {len(leaks) - limit} more" if len(leaks) > limit else ""
    return "\n".join(lines) + more


# ---- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def canaries(tmp_path_factory) -> Canaries:
    return make_canaries(tmp_path_factory.mktemp("canaries"))


@pytest.fixture(scope="module")
def hub():
    rec = HubRecorder()
    try:
        yield rec
    finally:
        rec.stop()


OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


@pytest.fixture(scope="module")
def public_app(request, tmp_path_factory, canaries, hub):
    """The app in public mode, as an anonymous visitor meets it; online as far as it knows (no
    offline variables) with the 'Hub' being the recorder; runs limited to RUN_TIMEOUT_S."""
    app = AppProcess("public app", ["--public"], tmp_path_factory.mktemp("public-app"), env_drop=OFFLINE_VARS,
                     env_set={"HF_ENDPOINT": hub.url, "ALI_RUN_TIMEOUT_S": str(RUN_TIMEOUT_S),
                              "ALI_TEST_ENV_SECRET": canaries.env_secret})
    yield from started(request, app)


@pytest.fixture(scope="module")
def public_sweep(public_app, canaries) -> Sweep:
    sw = run_sweep(public_app.url, canaries)
    print(f"\npublic sweep: {sw.calls} calls over {len(sw.endpoints)} endpoints in {sw.seconds:.1f} s")
    per: dict[str, list[float]] = {}
    for r in sw.replies:
        per.setdefault(r.endpoint, []).append(r.seconds)
    print("  " + ", ".join(f"{k} {len(v)}x {sum(v):.1f}s" for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))))
    return sw


# ---- 1. the sweep ----------------------------------------------------------------------------------------


def test_public_sweep_reaches_every_endpoint(public_sweep):
    """The sweep is not vacuous: it covered every endpoint the app describes, including the
    undocumented ones and those that read tokenizer/template names, and most calls got a reply."""
    names = set(public_sweep.endpoints)
    for must in ("/playground_run", "/trace_files_upload", "/inspector_open", "/app_load"):
        assert must in names, f"{must} missing from the app's API description: {sorted(names)}"
    called = {r.endpoint for r in public_sweep.replies}
    assert called == names, f"endpoints never called: {sorted(names - called)}"
    locator = {(r.endpoint, r.param) for r in public_sweep.replies if LOCATOR_LABEL_RE.search(r.label)}
    assert len(locator) >= 4, f"too few tokenizer/template parameters found by label: {locator}"
    # a str field the app really reads: the playground's template override (a free-text field)
    # must have reached the handler (its answer is a completed event, not gradio's refusal)
    assert any(r.endpoint == "/playground_run" and "template" in r.label.lower() and r.ok for r in public_sweep.replies), \
        "no canary sent to the playground's template override reached the run handler"
    broken = [r for r in public_sweep.replies if (r.error or "").startswith(("HTTP 5", "the event stream ended"))]
    assert len(broken) <= public_sweep.calls // 20, \
        f"{len(broken)} calls got no answer from the app: " + "; ".join(f"{r.where()}: {r.error}" for r in broken[:5])


def test_public_sweep_never_returns_a_canary_or_the_environment(public_sweep, canaries):
    leaks = public_sweep.leaks(canaries.needles())
    assert not leaks, (f"{len(leaks)} of {public_sweep.calls} visitor calls got server secrets back (file contents under "
                       f"{canaries.folder} or the app's environment):\n{describe_leaks(leaks, canaries)}")


def test_public_template_and_tokenizer_fields_are_no_existence_oracle(public_sweep, canaries):
    """The reply for an existing path equals the reply for a missing one (the path itself and
    timings/ids masked)."""
    pairs = [(str(canaries.files[k]), str(canaries.missing[k])) for k in ("canary.jinja", "qwen3 file", "tokenizer folder")]
    pairs.append(("/etc/passwd", str(canaries.missing["/etc/passwd"])))
    # group replies: (endpoint, param, value) -> list of replies (one per baseline variant, in order)
    groups: dict[tuple[str, str, str], list[Reply]] = {}
    for r in public_sweep.replies:
        groups.setdefault((r.endpoint, r.param, r.value), []).append(r)
    differ = []
    checked = 0
    for (ep, param, value), rs in groups.items():
        for have, miss in pairs:
            if value != have or (ep, param, miss) not in groups:
                continue
            for ra, rb in zip(rs, groups[(ep, param, miss)]):
                checked += 1
                a, b = normalise(ra, have), normalise(rb, miss)
                if a != b:
                    differ.append(f"  {ep} {param} ({ra.label!r}): {have!r} → {short_diff(a, b)} ; {miss!r} → {short_diff(b, a)}")
    assert checked, "no existing/missing pair was swept: the oracle check saw nothing"
    assert not differ, ("the server answers differently for a path that exists and one that does not "
                        f"({len(differ)} of {checked} pairs):\n" + "\n".join(differ[:12]))


def normalise(r: Reply, path: str) -> str:
    def strip_files(o: Any) -> Any:
        if isinstance(o, dict):
            if (o.get("meta") or {}).get("_type") == "gradio.FileData":
                return "<FILE>"
            return {k: strip_files(v) for k, v in o.items()}
        if isinstance(o, list):
            return [strip_files(v) for v in o]
        return o

    # the final answer only: how many progress updates a run streams depends on timing
    s = html.unescape(json.dumps(strip_files(r.events[-1:]), ensure_ascii=False) + (r.error or ""))
    for form in (path, path.replace("/", "\\/"), os.path.basename(path), os.path.dirname(path)):
        if form and form != "/":
            s = s.replace(form, "<PATH>")
    s = re.sub(r"\d+(\.\d+)? ?s\b", "<T>", s)  # durations
    s = re.sub(r"[0-9a-f]{8,}", "<HEX>", s)  # ids, hashes, temp names
    return s


def short_diff(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return "…" + a[max(0, i - 60): i + 140] + "…"


# ---- 2. no Hub requests -----------------------------------------------------------------------------------


def test_public_visitor_typed_repo_id_never_reaches_the_hub(public_sweep, hub, canaries):
    assert any(r.value == canaries.repo_id for r in public_sweep.replies), "the repo id was never sent"
    name = canaries.repo_id.split("/", 1)[1]
    named = [req for req in hub.requests if name in urllib.parse.unquote(req)]
    print(f"\nHub recorder: {len(hub.requests)} request(s) in all, {len(named)} naming the typed repo; first: {hub.requests[:5]}")
    assert not named, (f"the server asked the Hub (HF_ENDPOINT={hub.url}) for the visitor-typed repo {canaries.repo_id!r} "
                       f"{len(named)} time(s): {named[:8]}")


# ---- 3. Parquet bomb ----------------------------------------------------------------------------------------


def make_parquet_bomb(path: Path, n: int = BOMB_IDS) -> None:
    """One trace row in write_parquet's layout whose response_ids (and mask) hold ``n`` entries."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from backend.trace import load_traces, write_parquet

    small = path.with_suffix(".small.parquet")
    write_parquet([load_traces(str(SAMPLE_DIR / "01_weather.jsonl")).traces[0]], str(small))
    tbl = pq.read_table(small)
    meta = tbl.schema.metadata
    offsets = pa.array([0, n], pa.int32())
    for col, values in (("response_ids", np.full(n, 9707, dtype=np.int64)), ("response_mask", np.ones(n, dtype=np.int8))):
        i = tbl.schema.get_field_index(col)
        tbl = tbl.set_column(i, tbl.schema.field(i), pa.ListArray.from_arrays(offsets, pa.array(values)))
    tbl = tbl.replace_schema_metadata(meta)
    pq.write_table(tbl, str(path), compression="zstd")
    small.unlink()


def test_public_parquet_bomb_is_refused_from_its_metadata(public_app, tmp_path):
    from gradio_client import Client, handle_file

    bomb = tmp_path / "bomb.parquet"
    make_parquet_bomb(bomb)
    size = bomb.stat().st_size
    assert size < 1 << 20, f"the bomb should be small on disk, it is {size} bytes"

    pids = [public_app.proc.pid, *public_app.descendants()]
    reset = public_app.reset_peak(pids)
    before = {p: public_app.proc_status(p) for p in pids}
    c = Client(public_app.url, verbose=False, download_files=False, httpx_kwargs={"timeout": CALL_TIMEOUT_S})
    t0 = time.monotonic()
    job = c.submit(handle_file(str(bomb)), api_name="/trace_files_upload")
    out = job.result(timeout=CALL_TIMEOUT_S)
    dt = time.monotonic() - t0
    after = public_app.proc_status()
    base = before[public_app.proc.pid]["VmRSS" if reset else "VmHWM"]
    growth = after["VmHWM"] - base
    kids = {p: public_app.proc_status(p)["VmHWM"] - before[p]["VmRSS" if reset else "VmHWM"]
            for p in pids[1:] if os.path.exists(f"/proc/{p}/status")}
    status = html.unescape(TAG_RE.sub("", str(out[0])))
    problems = json.dumps(out[1], ensure_ascii=False)
    print(f"\nparquet bomb ({size} bytes, {BOMB_IDS:,} ids): app VmHWM +{growth / 2**20:.0f} MiB "
          f"(peak reset: {reset}), children {({p: round(g / 2**20) for p, g in kids.items()})}, {dt:.1f} s; status: {status}; "
          f"bad records: {problems[:300]}")
    assert growth < 1 << 30, (f"a {size}-byte Parquet upload of {BOMB_IDS:,} token ids raised the server's peak memory by "
                              f"{growth / 2**30:.2f} GiB (status: {status})")
    assert all(g < 1 << 30 for g in kids.values()), f"a child process of the app grew by over 1 GiB: {kids}"
    assert "0 trace(s)" in status or "not" in status.lower() or "refus" in status.lower(), \
        f"the bomb row was not refused: status {status!r}, bad records {problems}"
    reason = status + " " + problems
    assert re.search(r"token", reason, re.I) and re.search(r"limit|at most|too many|over|exceed|[0-9],?000,?000", reason, re.I), \
        f"the refusal does not say why (token ids over a limit): status {status!r}, bad records {problems}"


# ---- 4. upload size ---------------------------------------------------------------------------------------------


def big_files(*folders: Path, at_least: int = 100 << 20) -> list[tuple[str, int]]:
    out = []
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for n in names:
                p = os.path.join(dirpath, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                if st.st_size >= at_least or st.st_blocks * 512 >= at_least:
                    out.append((p, st.st_size))
    return out


def test_public_oversized_upload_is_refused_before_it_is_stored(public_app, tmp_path):
    import httpx

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(BIG_UPLOAD_BYTES)  # sparse: costs no disk here
    try:
        t0 = time.monotonic()
        try:
            with open(big, "rb") as f:
                r = httpx.post(f"{public_app.url}gradio_api/upload", files={"files": ("big.jsonl", f, "application/octet-stream")},
                               timeout=CALL_TIMEOUT_S)
            answer = f"HTTP {r.status_code}: {r.text[:300]}"
            refused = r.status_code >= 400
        except httpx.TransportError as e:  # the server closed the connection on the oversized body
            answer, refused = f"connection closed: {e!r}", True
        dt = time.monotonic() - t0
        time.sleep(1.0)  # let a background move into the cache finish, if any
        left = big_files(public_app.gradio_tmp, public_app.tmp)
        print(f"\n250 MB upload: {answer[:120]} after {dt:.1f} s; large files left: {left}")
        assert refused, f"a {BIG_UPLOAD_BYTES >> 20} MB upload was accepted by {public_app.url}gradio_api/upload: {answer}"
        assert not left, f"a refused {BIG_UPLOAD_BYTES >> 20} MB upload left large files on the server's disk: {left}"
    finally:
        big.unlink(missing_ok=True)
        for p, _ in big_files(public_app.gradio_tmp, public_app.tmp):
            os.unlink(p)  # our test's own temp dirs


# ---- 5. run time limit and run slots ------------------------------------------------------------------------


_PLAYGROUND_PARAMS: dict[str, list[Param]] = {}


def playground_args(url: str, **by_label: Any) -> list[Any]:
    """/playground_run's arguments (the message included) in the order the app describes them:
    defaults, then values given by a regex on the parameter's label (``user_message=...``,
    ``delay=...``, ``script=...``; ``_`` stands for a space)."""
    if url not in _PLAYGROUND_PARAMS:
        _PLAYGROUND_PARAMS[url] = api_endpoints(url)["/playground_run"]
    params = _PLAYGROUND_PARAMS[url]
    args = [p.default for p in params]
    for pattern, v in by_label.items():
        hits = [p for p in params if re.search(pattern.replace("_", " "), p.label, re.I)]
        assert len(hits) == 1, f"/playground_run: label /{pattern}/ matches {[p.label for p in hits]} of {[p.label for p in params]}"
        args[hits[0].index] = v
    return call_args(params, args)


def client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, httpx_kwargs={"timeout": CALL_TIMEOUT_S})


def final_status(job) -> str:
    """The status line of a /playground_run job's last update (or the error it ended with)."""
    outs = job.outputs()
    if outs:
        return html.unescape(TAG_RE.sub("", str(outs[-1][1])))
    if job.done():
        try:
            job.result(timeout=0)
        except Exception as e:  # noqa: BLE001
            return f"(the call failed: {e})"
    return "(no output)"


def wait_done(jobs: list, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(j.done() for j in jobs):
            return True
        time.sleep(0.1)
    return all(j.done() for j in jobs)


def stop_all(clients: list) -> None:
    for c in clients:
        try:
            c.predict(api_name="/playground_stop")
        except Exception:  # noqa: BLE001 - best effort, the app is killed at the end anyway
            pass


LONG_TEXT = " ".join(f"word{i}" for i in range(400))  # ~800 tokens


def test_public_run_ends_at_the_wall_clock_limit_and_one_run_per_session(public_app):
    """Allowed values (the largest delay the UI offers) that would take minutes: the run ends at
    ALI_RUN_TIMEOUT_S with a status saying so; meanwhile the same session cannot start another."""
    c = client(public_app.url)
    args = playground_args(public_app.url, user_message="a long answer please", delay=0.5, script=json.dumps([LONG_TEXT]))
    t0 = time.monotonic()
    job = c.submit(*args, api_name="/playground_run")
    try:
        while not is_running(job) and not job.done():
            assert time.monotonic() - t0 < 60, f"the run did not start: {final_status(job)}"
            time.sleep(0.1)
        second = c.submit(*playground_args(public_app.url, user_message="and another one", delay=0, script='["x"]'),
                          api_name="/playground_run")
        second_out = second.result(timeout=30)
        second_status = html.unescape(TAG_RE.sub("", str(second_out[1])))
        ended = wait_done([job], RUN_TIMEOUT_S + 20)
        dt = time.monotonic() - t0
        status = final_status(job)
        print(f"\nlong run: {status!r} after {dt:.1f} s; second run in the same session: {second_status!r}")
        assert ended, (f"a run at 0.5 s/token over ~800 tokens was still going {dt:.0f} s after it started "
                       f"(ALI_RUN_TIMEOUT_S={RUN_TIMEOUT_S}): {status!r}")
        assert RUN_STATUS_TIMEOUT_RE.search(status), f"the run ended but its status does not name the time limit: {status!r}"
        assert dt < RUN_TIMEOUT_S + 15, f"the run ended only after {dt:.1f} s (limit {RUN_TIMEOUT_S} s)"
        assert re.search(r"in progress|already|one run", second_status, re.I), \
            f"a second run in the same session was not refused while the first ran: {second_status!r}"
    finally:
        if not job.done():
            stop_all([c])


def test_public_absurd_delays_cannot_hold_the_run_slots(public_app):
    """Four sessions (as many as the app's run slots) send absurd delays: two through the
    slider (1e9 s per token), two through a script entry's own ``token_delay_s: 1e9``. Each such
    run must end by itself, refused or stopped by the run limit, with a status saying which. A
    session whose run was refused then does the worst it is allowed (0.5 s per token over ~800
    tokens), so the four slots are surely held. A fifth visitor's ordinary run must finish
    within 3x ALI_RUN_TIMEOUT_S, and the four hogs must have ended at the limit."""
    long_script = json.dumps([{"text": LONG_TEXT, "token_delay_s": 1e9}])
    kinds = [("slider delay 1e9", dict(delay=1e9, script=json.dumps([LONG_TEXT]))),
             ("slider delay 1e9", dict(delay=1e9, script=json.dumps([LONG_TEXT]))),
             ("script token_delay_s 1e9", dict(delay=0.02, script=long_script)),
             ("script token_delay_s 1e9", dict(delay=0.02, script=long_script))]
    worst_allowed = dict(delay=0.5, script=json.dumps([LONG_TEXT]))
    hogs = [client(public_app.url) for _ in kinds]
    bound = 3 * RUN_TIMEOUT_S
    t_start = time.monotonic()
    jobs = [c.submit(*playground_args(public_app.url, user_message="hold a slot", **kw), api_name="/playground_run")
            for c, (_, kw) in zip(hogs, kinds)]
    try:
        # every absurd run is running (holding a slot) or already over
        deadline = time.monotonic() + 60
        while not all(j.done() or is_running(j) for j in jobs):
            assert time.monotonic() < deadline, f"the absurd runs neither started nor ended: {[final_status(j) for j in jobs]}"
            time.sleep(0.1)
        first: list[str] = []
        for i, ((k, _), c, j) in enumerate(zip(kinds, hogs, jobs)):
            if not j.done():
                first.append(f"{k}: running (not refused)")
                continue
            st = final_status(j)
            first.append(f"{k}: {st}")
            assert RUN_STATUS_TIMEOUT_RE.search(st) or re.search(r"delay|token_delay_s|between|at most|maximum", st, re.I), \
                f"the absurd run ({k}) ended without saying why (a refused delay or the time limit): {st!r}"
            jobs[i] = c.submit(*playground_args(public_app.url, user_message="hold a slot, within the rules", **worst_allowed),
                               api_name="/playground_run")
        deadline = time.monotonic() + 60
        while not all(j.done() or is_running(j) for j in jobs):
            assert time.monotonic() < deadline, f"the slot-holding runs did not start: {[final_status(j) for j in jobs]}"
            time.sleep(0.1)
        fifth = client(public_app.url)
        t0 = time.monotonic()
        job5 = fifth.submit(*playground_args(public_app.url, user_message="an ordinary question", delay=0.01,
                                             script='["A short answer."]'),
                            api_name="/playground_run")
        done5 = wait_done([job5], bound)
        latency = time.monotonic() - t0
        status5 = final_status(job5)
        hogs_done = wait_done(jobs, max(1.0, bound - (time.monotonic() - t_start)))
        statuses = [f"{k}: {'ended' if j.done() else 'STILL RUNNING'} after {time.monotonic() - t_start:.0f} s · {final_status(j)}"
                    for (k, _), j in zip(kinds, jobs)]
        print(f"\nfifth run: {latency:.1f} s · {status5!r}\nabsurd runs, first answer:\n  " + "\n  ".join(first)
              + "\nslot holders:\n  " + "\n  ".join(statuses))
        assert done5 and re.search(r"ended", status5), (
            f"a fifth visitor's ordinary run did not finish within {bound} s (3x ALI_RUN_TIMEOUT_S={RUN_TIMEOUT_S}) while four "
            f"sessions held the run slots: its status {status5!r}; the four:\n  " + "\n  ".join(statuses))
        assert hogs_done, f"runs still hold run slots {bound} s after they started:\n  " + "\n  ".join(statuses)
        for (k, _), j in zip(kinds, jobs):
            st = final_status(j)
            assert RUN_STATUS_TIMEOUT_RE.search(st), f"a slot-holding run ({k}) ended without naming the time limit: {st!r}"
    finally:
        stop_all([c for c, j in zip(hogs, jobs) if not j.done()])


def is_running(job) -> bool:
    return any("running" in str(o[1]) for o in job.outputs())


# ---- 6. local mode: the sweep does see a leak ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_app(request, tmp_path_factory, canaries):
    app = AppProcess("local app", ["--local"], tmp_path_factory.mktemp("local-app"),
                     env_set={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "ALI_TEST_ENV_SECRET": canaries.env_secret})
    yield from started(request, app)


def test_local_mode_sweep_finds_the_typed_template_file(local_app, canaries):
    """On a local server typed paths keep working: the Template lab renders ``canary.jinja``
    when its path is the custom template, so the same sweep reports the secret (it would see a
    leak in public mode too). Over the endpoints that take a tokenizer or template (where a path
    is read at all): the whole local sweep cost 16 s of CPU for the same proof."""
    sw = run_sweep(local_app.url, canaries, full=False, locators_only=True)
    assert len(sw.endpoints) >= 3, f"too few endpoints take a tokenizer or template: {sorted(sw.endpoints)}"
    leaks = sw.leaks([canaries.secret])
    where = sorted({(r.endpoint, r.label) for r, _ in leaks})
    print(f"\nlocal sweep: {sw.calls} calls in {sw.seconds:.1f} s; the secret came back through: {where}")
    lab = [r for r, _ in leaks if "custom template" in r.label.lower() and r.value == str(canaries.files["canary.jinja"])]
    assert lab, ("in local mode the Template lab's custom template field given the path of canary.jinja did not render it: "
                 "the sweep cannot tell a leak. Replies for that path: "
                 + "; ".join(f"{r.where()}: {r.seen()[:300]}" for r in sw.replies
                             if "custom template" in r.label.lower() and r.value == str(canaries.files["canary.jinja"])))
