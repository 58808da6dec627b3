"""``python -m backend`` render / parse / run, as a user runs them (subprocess, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # tests never touch the Hub
    p = subprocess.run([sys.executable, "-m", "backend", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


@pytest.fixture(scope="module")
def seed_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed")
    (d / "messages.json").write_text(json.dumps([{"role": "user", "content": "What's the weather in Seattle?"}]))
    (d / "tools.py").write_text(textwrap.dedent('''
        def get_current_temperature(city: str):
            """Get current temperature at a location.

            Args:
                city: The location to get the temperature for, in the format "City, State, Country".

            Returns:
                the temperature, the location, and the unit in a dict
            """
            return {"temperature": 72, "city": city}
    '''))
    (d / "script.json").write_text(json.dumps([
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>',
        "The current temperature in Seattle, WA, USA is 72°F.",
    ]))
    (d / "config.json").write_text(json.dumps({"apply_chat_template_kwargs": {"enable_thinking": False}, "max_parallel_calls": 3}))
    return d


def test_run_seed_scenario_writes_trace_with_seed_mask(seed_files, tmp_path):
    out = tmp_path / "trace.jsonl"
    p = cli("run", "--tokenizer", "qwen3", "--generator", "scripted", "--script", str(seed_files / "script.json"),
            "--tools", str(seed_files / "tools.py"), "--messages", str(seed_files / "messages.json"),
            "--config", str(seed_files / "config.json"), "--out", str(out), "--json")
    summary = json.loads(p.stdout)
    assert summary["prompt_tokens"] == 178 and summary["mask_runs"] == [[1, 25], [0, 28], [1, 16]]
    assert summary["termination_reason"] == "no_tool_calls"
    from backend.trace import load_traces

    res = load_traces(str(out))
    assert not res.problems and len(res.traces) == 1
    t = res.traces[0]
    assert t.response_mask == [1] * 25 + [0] * 28 + [1] * 16
    assert t.config["max_parallel_calls"] == 3


def test_render_matches_prompt_of_run(seed_files):
    p = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"),
            "--tools", str(seed_files / "tools.py"), "--json")
    d = json.loads(p.stdout)
    assert d["num_tokens"] == 178 and len(d["tokens"]) == 178
    assert d["text"].endswith("<|im_start|>assistant\n")
    assert d["tokenizer"]["template"] == "qwen3_instruct_2507"
    p2 = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"), "--no-generation-prompt", "--json")
    assert not json.loads(p2.stdout)["text"].endswith("assistant\n")


def test_parse_reports_calls_and_errors():
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {\n</tool_call>'
    d = json.loads(cli("parse", "--format", "hermes", "--text", text, "--json").stdout)
    assert [c["name"] for c in d["tool_calls"]] == ["a"] and d["tool_calls"][0]["arguments"] == {"x": 1}
    assert len(d["errors"]) == 1
    s, e = d["errors"][0]["span"]
    assert text[s:e].startswith("<tool_call>") and "b" in text[s:e]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["render", "--tokenizer", "qwen3", "--messages", "/no/such/file.json"], "messages file not found"),
        (["render", "--tokenizer", "no-such-profile-xyz", "--messages", "/dev/null"], "cannot load tokenizer"),
        (["parse", "--format", "nope", "--text", "x"], "nope"),
        (["run", "--generator", "scripted", "--messages", os.path.join(ROOT, "tests", "data", "cli_messages.json"), "--out", "/tmp/x.jsonl"], "--script"),
    ],
)
def test_errors_are_one_line_without_traceback(args, needle):
    p = cli(*args, check=False)
    assert p.returncode != 0
    assert needle in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_bad_json_inputs_name_the_file_and_position(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('[{"role": "user", "content": "hi"')
    p = cli("render", "--messages", str(bad), check=False)
    assert p.returncode == 2 and "not valid JSON" in p.stderr and "line 1" in p.stderr
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_turns": 3}))
    (tmp_path / "s.json").write_text('["hi"]')
    (tmp_path / "msg.json").write_text('[{"role": "user", "content": "hi"}]')
    p = cli("run", "--script", str(tmp_path / "s.json"), "--messages", str(tmp_path / "msg.json"), "--config", str(cfg), "--out", str(tmp_path / "o.jsonl"), check=False)
    assert p.returncode == 2 and "unknown loop config key" in p.stderr
