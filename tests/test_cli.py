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


# ---- tool_choice ---------------------------------------------------------------------------------


def test_tool_choice_flag_is_enforced_on_the_scripted_backend(seed_files, tmp_path):
    """The scripted backend checks its script against the choice: a script that calls a tool is
    refused under --tool-choice none (a real backend could not have produced it)."""
    base = ["run", "--tokenizer", "qwen3", "--generator", "scripted", "--script", str(seed_files / "script.json"),
            "--tools", str(seed_files / "tools.py"), "--messages", str(seed_files / "messages.json"), "--json"]
    ok = json.loads(cli(*base, "--out", str(tmp_path / "a.jsonl"), "--tool-choice", "required,auto").stdout)
    assert ok["termination_reason"] == "no_tool_calls"
    from backend.trace import load_traces

    steps = load_traces(str(tmp_path / "a.jsonl")).traces[0].steps
    assert [s.constraint and s.constraint["tool_choice"] for s in steps if s.state == "generating"] == ["required", None]
    refused = json.loads(cli(*base, "--out", str(tmp_path / "b.jsonl"), "--tool-choice", "none").stdout)
    assert refused["termination_reason"] == "generation_error"
    p = cli(*base, "--out", str(tmp_path / "c.jsonl"), "--tool-choice", "get_wether", check=False)
    assert p.returncode == 2 and "get_wether" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_default_tool_choice_policy():
    import argparse

    from backend.cli import apply_tool_choice
    from backend.engine import LoopConfig

    none = argparse.Namespace(tool_choice=None)
    cfg = LoopConfig()
    assert apply_tool_choice(cfg, none, config_has_choice=False, embedded_model=True, has_tools=True).tool_choice == ["required", "auto"]
    assert apply_tool_choice(cfg, none, config_has_choice=False, embedded_model=True, has_tools=False).tool_choice == ["auto"]
    assert apply_tool_choice(cfg, none, config_has_choice=False, embedded_model=False, has_tools=True).tool_choice == ["auto"]
    given = LoopConfig(tool_choice="none")
    assert apply_tool_choice(given, none, config_has_choice=True, embedded_model=True, has_tools=True).tool_choice == "none"
    flag = argparse.Namespace(tool_choice="get_weather")
    assert apply_tool_choice(given, flag, config_has_choice=True, embedded_model=True, has_tools=True).tool_choice == "get_weather"


@pytest.mark.vllm
@pytest.mark.slow
def test_embedded_default_on_vllm_calls_the_tool_then_answers(seed_files, tmp_path):
    """The newcomer's first run from the CLI: no --model, no --tool-choice, real vLLM on CPU,
    the embedded SmolLM2-135M. The first turn is forced to a call (required), which ends with
    EOS; the tool result goes back; the second turn is free and answers in prose."""
    out = tmp_path / "t.jsonl"
    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": "What's the weather in Paris?"}]))
    (tmp_path / "cfg.json").write_text(json.dumps({"sampling": {"temperature": 0.0, "max_tokens": 64}}))
    p = cli("run", "--backend", "vllm", "--tools", str(seed_files / "tools.py"), "--messages", str(tmp_path / "m.json"),
            "--config", str(tmp_path / "cfg.json"), "--max-model-len", "2048", "--out", str(out), "--json")
    s = json.loads(p.stdout)
    from backend.trace import load_traces

    t = load_traces(str(out)).traces[0]
    assert s["termination_reason"] == "no_tool_calls", s
    gens = [x for x in t.steps if x.state == "generating"]
    assert len(gens) == 2
    first, second = gens
    assert first.constraint["tool_choice"] == "required" and second.constraint is None
    assert [c.name for c in first.tool_calls] == ["get_current_temperature"] and not first.parse_errors
    assert first.tool_calls[0].arguments.get("city")
    n0 = len(t.prompt_ids)
    assert first.finish_reason == "stop" and t.response_ids[first.end - n0 - 1] == t.tokenizer.eos_token_id  # ended with EOS
    tool_step = next(x for x in t.steps if x.state == "processing_tools")
    assert tool_step.tool_results[0].ok and "72" in tool_step.tool_results[0].content
    assert not second.tool_calls and second.text.strip()
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    # constrained tokens are generated tokens: mask 1; the tool turn is mask 0
    assert set(t.response_mask[first.start - n0:first.end - n0]) == {1}
    assert set(t.response_mask[tool_step.start - n0:tool_step.end - n0]) == {0}
