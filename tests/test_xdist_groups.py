"""The test workers' grouping (tests/conftest.py): under ``scripts/test.sh`` (``-n 2 --dist loadgroup``)
a test file runs on one worker, so its module fixtures (an app, a browser, a Space venv) are built
once. pytest-xdist 3.8.0 writes the group into the test's id, which pytest 9.2 no longer lets it do
(pytest-xdist#1386): every group was split over both workers, and the costliest module fixtures
were built twice, with nothing failing. requirements-dev.txt pins pytest 9.1.1 until that is fixed;
this test fails if the grouping is lost again."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import _test_seconds, group_weights

ROOT = Path(__file__).resolve().parents[1]

THIS_FILE = "tests/test_xdist_groups.py"


def test_this_file_is_one_group_and_a_worker_sees_it_in_the_test_id(request: pytest.FixtureRequest):
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == (THIS_FILE,), marker
    if os.environ.get("PYTEST_XDIST_WORKER") and getattr(request.config.option, "loadgroup", False):
        # what the scheduler reads: the group after the last "@" of the id the worker reports
        assert request.node.nodeid == f"{THIS_FILE}::{request.node.name}@{THIS_FILE}", request.node.nodeid


def test_the_workers_start_with_the_costliest_groups(request: pytest.FixtureRequest):
    """tests/test_seconds.json names the costly tests (the Space build, the vLLM files'); on a
    worker the session's tests come in groups ordered by their selected tests' measured seconds,
    costliest first."""
    seconds = _test_seconds()
    per_file: dict[str, float] = {}
    for test_id, s in seconds.items():
        f = test_id.split("::")[0]
        per_file[f] = per_file.get(f, 0.0) + s
    assert per_file.get("tests/test_space_build.py", 0) > 60 and per_file.get("tests/test_backends_vllm.py", 0) > 30, per_file
    if not (os.environ.get("PYTEST_XDIST_WORKER") and getattr(request.config.option, "loadgroup", False)):
        return
    items = request.session.items
    weight = group_weights(items, lambda item: item.nodeid.rsplit("@", 1)[-1])
    order: list[str] = []
    for item in items:
        group = item.nodeid.rsplit("@", 1)[-1]
        if not order or order[-1] != group:
            order.append(group)
    assert len(order) == len(set(order)), "a group's tests are not together"
    weights = [weight[g] for g in order]
    assert weights == sorted(weights, reverse=True), list(zip(order, weights))[:10]


def test_the_browser_files_on_the_shared_app_are_one_group(request: pytest.FixtureRequest):
    """The browser files that use tests/conftest.py's ``app_url`` run on one worker, which starts
    that app once for all of them; a file with an app of its own (the MCP
    tests' ``app_url``, the lens app) keeps its own group. Checked over this session's tests: in
    the full run (CI, scripts/test.sh) every file is there."""
    groups: dict[str, set[str]] = {}
    for item in request.session.items:
        marker = item.get_closest_marker("xdist_group")
        if marker is not None:
            groups.setdefault(item.nodeid.split("::")[0], set()).add(str(marker.args[0]))
    if "tests/test_browser.py" not in groups:
        pytest.skip("only meaningful with the browser files collected (the full run)")
    shared = {f for f, g in groups.items() if g == {"browser-app"}}
    assert {"tests/test_browser.py", "tests/test_browser_inspector.py", "tests/test_browser_playground.py"} <= shared, groups
    assert "tests/test_mcp.py" not in shared and "tests/test_browser_logprob_lens.py" not in shared, shared


def _durations_script():
    """scripts/test_durations.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("test_durations_script", ROOT / "scripts" / "test_durations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_durations_json_sums_each_tests_phases_and_drops_the_cheap_ones(tmp_path, capsys):
    """scripts/test_durations.py --json, what tests/test_seconds.json is written with: a test's
    set-up, call and tear-down together, by its id without xdist's group; below 0.3 s left out."""
    mod = _durations_script()
    log = tmp_path / "run.log"
    log.write_text("12.50s setup    tests/test_a.py::test_x[p @ 1]@tests/test_a.py\n"
                   "2.00s call     tests/test_a.py::test_x[p @ 1]@tests/test_a.py\n"
                   "0.50s teardown tests/test_a.py::test_x[p @ 1]@tests/test_a.py\n"
                   "0.20s call     tests/test_b.py::test_y@vllm\n"
                   "1.00s call     tests/test_b.py::test_z\n")
    assert mod.main([str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"tests/test_a.py::test_x[p @ 1]": 15.0, "tests/test_b.py::test_z": 1.0}


def _own_pytest(tmp_path, name: str, source: str, env: dict[str, str] | None = None):
    """``source`` as ``tmp_path/name``, run by a pytest of its own with this conftest, not as an
    xdist worker (the worker's variables are left out); the finished process."""
    import shutil
    import subprocess
    import sys

    shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / name).write_text(source)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    run_env.update(env or {})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", name],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=run_env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_a_test_run_again_says_why_it_failed_the_first_time(tmp_path):
    """pytest-rerunfailures names a rerun test in its summary and drops its failure: a flake a rerun
    hides left nothing to diagnose (CI: the lens browser test, twice). tests/conftest.py prints each
    rerun's first failure at the end. Checked in a pytest run of its own with this conftest."""
    r = _own_pytest(
        tmp_path, "test_once.py",
        "import os, pytest\n"
        "@pytest.mark.flaky(reruns=1)\n"
        "def test_fails_once(tmp_path_factory):\n"
        "    mark = os.path.join(os.path.dirname(__file__), 'failed-once')\n"
        "    if not os.path.exists(mark):\n"
        "        open(mark, 'w').close()\n"
        "        assert 'the first' == 'the second', 'WHY-IT-FAILED'\n"
        "def test_passes():\n"
        "    pass\n")
    out = r.stdout
    assert "2 passed, 1 rerun" in out, out[-3000:]
    assert "why test_once.py::test_fails_once ran again (call)" in out, out[-3000:]
    assert "WHY-IT-FAILED" in out.split("ran again", 1)[1] and "test_passes ran again" not in out, out[-3000:]


def test_the_cpu_log_counts_what_a_test_and_its_children_cost_and_not_its_waiting(tmp_path):
    """ALI_TEST_CPU_LOG (tests/conftest.py): a test whose child process spins ~1 s is charged that
    CPU; a test that sleeps 1 s is charged its wall time but almost no CPU; then
    ``scripts/test_durations.py --cpu`` sums them by file. Run in a pytest of its own with this
    conftest, not as an xdist worker (that one writes cpu.jsonl.gwN: caught by a fresh-clone run)."""
    log = tmp_path / "cpu.jsonl"
    _own_pytest(
        tmp_path, "test_cost.py",
        "import subprocess, sys, time\n"
        "def test_child_spins():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 1.0: pass'], check=True)\n"
        "def test_sleeps():\n"
        "    time.sleep(1.0)\n",
        env={"ALI_TEST_CPU_LOG": str(log)})
    rows = {row["id"]: row for row in map(json.loads, log.read_text().splitlines())}
    spin, sleep = rows["test_cost.py::test_child_spins"], rows["test_cost.py::test_sleeps"]
    assert spin["cpu"] >= 0.9, spin  # the child's CPU, reaped: RUSAGE_CHILDREN
    assert sleep["wall"] >= 1.0 and sleep["cpu"] < 0.3, sleep
    mod = _durations_script()
    report = mod.cpu_report(mod.cpu_rows(str(log)), top=10)
    assert "2 tests:" in report and "| `test_cost.py` | 2 |" in report, report
    # the waiting list gives each test's wall and CPU seconds (its order depends on the load: the
    # spinning child waits for a core too when the machine is busy)
    waited = {line.split("`")[1]: [float(x) for x in line.split("|")[2:4]]
              for line in report.split("waited longest", 1)[1].splitlines() if line.startswith("| `")}
    assert waited["test_cost.py::test_sleeps"][0] >= 1.0 > 0.3 > waited["test_cost.py::test_sleeps"][1], report
    assert waited["test_cost.py::test_child_spins"][1] >= 0.9, report
