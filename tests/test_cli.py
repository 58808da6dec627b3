"""``python -m backend`` render / parse / run on real files: in this process (tests/cli_inprocess.py),
and as a user runs them (a subprocess) once per kind of run: a run, a one-line error, ``--help``, and
vLLM's first run, whose logs must not reach stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from cli_inprocess import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_process(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m backend ARGS`` in a process of its own, as the user runs it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # tests never touch the Hub
    p = subprocess.run([sys.executable, "-m", "backend", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The same command in this process (tests/cli_inprocess.py): what a process adds is held by
    the cli_process runs of this file (a run, an error, --help, vLLM's stdout)."""
    p = run_cli(*args)
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
    p = cli_process("run", "--tokenizer", "qwen3", "--generator", "scripted", "--script", str(seed_files / "script.json"),
                    "--tools", str(seed_files / "tools.py"), "--messages", str(seed_files / "messages.json"),
                    "--config", str(seed_files / "config.json"), "--out", str(out), "--json")
    summary = json.loads(p.stdout)
    # continuous tokens (the default): verl >= 0.9's 25/29/16; the seed's 25/28/16 is --tool-turns legacy
    assert summary["prompt_tokens"] == 178 and summary["mask_runs"] == [[1, 25], [0, 29], [1, 16]]
    assert summary["termination_reason"] == "no_tool_calls"
    from backend.trace import load_traces

    res = load_traces(str(out))
    assert not res.problems and len(res.traces) == 1
    t = res.traces[0]
    assert t.response_mask == [1] * 25 + [0] * 29 + [1] * 16
    assert t.config["max_parallel_calls"] == 3


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_render_matches_prompt_of_run(seed_files):
    p = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"),
            "--tools", str(seed_files / "tools.py"), "--json")
    d = json.loads(p.stdout)
    assert d["num_tokens"] == 178 and len(d["tokens"]) == 178
    assert d["text"].endswith("<|im_start|>assistant\n")
    assert d["tokenizer"]["template"] == "qwen3_instruct_2507"
    p2 = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"), "--no-generation-prompt", "--json")
    assert not json.loads(p2.stdout)["text"].endswith("assistant\n")


def test_render_joins_text_parts_says_what_it_leaves_out_and_names_a_malformed_call(tmp_path):
    """Issue 42, items 3-4, on the command line (the rendering it shares with the lab and the MCP tools)."""
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"},
                                                             {"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]))
    p = cli("render", "--tokenizer", "llama3", "--messages", str(msgs), "--json")
    d = json.loads(p.stdout)
    assert d["text"].endswith("<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|><|start_header_id|>assistant"
                              "<|end_header_id|>\n\n")
    assert d["notes"] == ["messages[0].content[2] (input_audio) is not rendered: the template 'llama3_1' takes text only (the "
                          "text parts are joined with a space)"]
    assert "warning: messages[0].content[2] (input_audio) is not rendered" in p.stderr
    msgs.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}, {"type": "function", "function": {"arguments": {}}}]}]))
    p = cli("render", "--tokenizer", "qwen3", "--messages", str(msgs), check=False)
    assert p.returncode != 0 and "messages[1].tool_calls[1].function.name is missing" in p.stderr and "Undefined" not in p.stderr


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
    p = (cli_process if "no-such-profile-xyz" in args else cli)(*args, check=False)  # one as a process
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


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
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
    p = cli_process("run", "--backend", "vllm", "--tools", str(seed_files / "tools.py"), "--messages", str(tmp_path / "m.json"),
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


# ---- tools as people have them (issue 12): plain OpenAI lists, [], catalogue types ---------------

PLAIN_TOOLS = [{"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}]
CATALOGUE_TOOLS = [{"type": "function", "function": {
    "name": "calculate_triangle_area", "description": "Calculate the area of a triangle.",
    "parameters": {"type": "dict", "properties": {"base": {"type": "float"}, "height": {"type": "long"},
                                                  "unit": {"type": "String"}, "extra": {"type": "any"}, "dims": {"type": "tuple", "items": {"type": "float"}}},
                   "required": ["base", "height"]}}}]


def _reference(tools, messages):
    from backend.loading.tokenizers import load_tokenizer

    b = load_tokenizer("qwen3")
    return b.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                           chat_template=b.chat_template, **b.chat_template_kwargs)


@pytest.mark.parametrize("tools", [PLAIN_TOOLS, [], CATALOGUE_TOOLS], ids=["plain-openai-list", "empty-list", "catalogue-types"])
def test_render_takes_plain_schemas_an_empty_list_and_catalogue_types(tmp_path, seed_files, tools):
    """`render --tools tools.json` with a plain OpenAI list (no "mock") failed with "has no mock
    result", `[]` with "defines no tools", catalogue types with "not valid under any of the given
    schemas". Each now renders exactly as transformers' apply_chat_template does."""
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    msgs = json.loads((seed_files / "messages.json").read_text())
    p = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"), "--tools", str(tmp_path / "tools.json"), "--json")
    d = json.loads(p.stdout)
    assert d["text"] == _reference(tools, msgs)
    if tools is CATALOGUE_TOOLS:
        assert [(m["path"], m["given"], m["used"]) for m in d["tool_type_mappings"]] == [
            ("parameters/type", "dict", "object"), ("parameters/properties/base/type", "float", "number"),
            ("parameters/properties/height/type", "long", "integer"), ("parameters/properties/unit/type", "String", "string"),
            ("parameters/properties/extra/type", "any", None), ("parameters/properties/dims/type", "tuple", "array"),
            ("parameters/properties/dims/items/type", "float", "number")]
        assert p.stderr.startswith("note: 7 parameter type name(s) in 1 tool(s) are not JSON Schema")
    else:
        assert d["tool_type_mappings"] == [] and p.stderr == ""
    text = cli("render", "--tokenizer", "qwen3", "--messages", str(seed_files / "messages.json"), "--tools", str(tmp_path / "tools.json"))
    assert text.stdout.startswith(_reference(tools, msgs))


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_run_with_a_plain_list_gives_a_marked_placeholder(tmp_path, seed_files):
    """A run that calls a tool with no "mock": the tool message is a placeholder that says so,
    the ToolResult records mock=default, the trace's metadata lists the tool, the summary counts
    the placeholder results and a note on stderr says so at load time."""
    (tmp_path / "tools.json").write_text(json.dumps(CATALOGUE_TOOLS))
    (tmp_path / "script.json").write_text(json.dumps([
        '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"height": 5, "base": 10.0, "extra": [1]}}\n</tool_call>', "25."]))
    out = tmp_path / "t.jsonl"
    p = cli("run", "--tokenizer", "qwen3", "--script", str(tmp_path / "script.json"), "--tools", str(tmp_path / "tools.json"),
            "--messages", str(seed_files / "messages.json"), "--tool-choice", "required,auto", "--out", str(out), "--json")
    s = json.loads(p.stdout)
    assert s["termination_reason"] == "no_tool_calls" and s["placeholder_results"] == 1 and len(s["tool_type_mappings"]) == 7
    assert 'note: 1 tool(s) have no "mock" result (calculate_triangle_area)' in p.stderr
    assert "note: 7 parameter type name(s)" in p.stderr
    from backend.trace import load_traces

    t = load_traces(str(out)).traces[0]
    r = t.steps[2].tool_results[0]
    assert r.ok and r.mock == "default" and r.content == "[placeholder result: no \"mock\" is defined for tool 'calculate_triangle_area']"
    assert t.messages[2]["content"] == r.content and t.metadata["default_mock_tools"] == ["calculate_triangle_area"]
    assert t.tools == CATALOGUE_TOOLS  # rendered as given
    text = cli("run", "--tokenizer", "qwen3", "--script", str(tmp_path / "script.json"), "--tools", str(tmp_path / "tools.json"),
               "--messages", str(seed_files / "messages.json"), "--out", str(out))
    assert "1 tool call(s) got a placeholder result" in text.stdout
    help_text = cli_process("run", "--help").stdout
    assert "placeholder" in help_text and "mock=default" in help_text


def test_parse_llama3_json_reports_the_missing_parameters_repair():
    """`parse --format llama3_json` read {"name": "f"} as a call with {} and said nothing."""
    d = json.loads(cli("parse", "--format", "llama3_json", "--text", '{"name": "f"}', "--json").stdout)
    assert d["tool_calls"] == [{"name": "f", "arguments": {}, "span": [0, 13]}]
    assert d["errors"] == [{"message": 'tool call \'f\' has no "parameters": read as {} (no arguments); the model did not write them',
                            "span": [0, 13], "severity": "warning"}]


# ---- import / export / check: empty input and bad records are not success ----------------------------


@pytest.fixture
def trace_files(tmp_path):
    good = (
        open(os.path.join(ROOT, "sample_traces", "01_weather.jsonl"), encoding="utf-8").read().strip(),
        open(os.path.join(ROOT, "sample_traces", "02_parallel_calls.jsonl"), encoding="utf-8").read().strip(),
    )
    files = {
        "empty": "", "blank": "\n  \n",
        "good": good[0] + "\n",
        "mixed": good[0] + "\n" + '{"neither": 1}\n' + "not json\n" + good[1] + "\n",
        "bad": '{"neither": 1}\nnot json\n',
    }
    for k, v in files.items():
        (tmp_path / f"{k}.jsonl").write_text(v)
    return tmp_path


@pytest.mark.parametrize("name", ["empty", "blank"])
def test_an_empty_input_is_an_error_everywhere(trace_files, name):
    f = str(trace_files / f"{name}.jsonl")
    out = trace_files / "out.jsonl"
    for args, word in ((["import", f, "--out", str(out)], "nothing to import"), (["check", f, "--no-tokens"], "nothing to check"),
                       (["export", f, "--to", "jsonl", "--out", str(out)], "nothing to export")):
        p = cli(*args, check=False)
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout, p.stderr)
        assert p.stderr.startswith("error: ") and word in p.stderr and len(p.stderr.strip().splitlines()) == 1
        assert not out.exists()


def test_import_with_bad_lines_writes_the_good_ones_and_exits_1(trace_files):
    out = trace_files / "out.jsonl"
    p = cli("import", str(trace_files / "mixed.jsonl"), "--out", str(out), "--json", check=False)
    assert p.returncode == 1
    s = json.loads(p.stdout)
    assert s["traces"] == 2 and [x["line"] for x in s["problems"]] == [2, 3]
    assert p.stderr.startswith("error: 2 of 4 record(s) in ") and "the other 2 were written to" in p.stderr
    from backend.trace import load_traces

    assert [t.id for t in load_traces(str(out)).traces] == ["sample-weather-seattle", "sample-parallel-calls"]
    assert cli("import", str(trace_files / "good.jsonl"), "--out", str(out)).returncode == 0
    # nothing readable: exit 2, the summary still lists every record, --out is left as it was
    before = out.read_bytes()
    p = cli("import", str(trace_files / "bad.jsonl"), "--out", str(out), "--json", check=False)
    assert p.returncode == 2 and [x["line"] for x in json.loads(p.stdout)["problems"]] == [1, 2]
    assert "none of the 2 record(s)" in p.stderr and "nothing was written" in p.stderr
    assert out.read_bytes() == before


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_import_of_another_tools_file_lists_what_it_did_not_carry_and_exits_1(tmp_path):
    """An Anthropic file (written by the anthropic SDK, tests/fixtures_gen/gen_anthropic.py) imports
    completely (exit 0); with an image block added, the traces are written, the image is listed
    with its line and place, and the exit status is 1."""
    src = os.path.join(ROOT, "tests", "data", "import", "anthropic", "messages.jsonl")
    out = tmp_path / "out.jsonl"
    p = cli("import", src, "--out", str(out), "--json")
    s = json.loads(p.stdout)
    n = sum(1 for line in open(src, encoding="utf-8") if line.strip())
    assert s["traces"] == n and s["formats"] == {"anthropic": n} and s["not_carried_over"] == [] and s["problems"] == []
    recs = [json.loads(line) for line in open(src, encoding="utf-8") if line.strip()]
    recs[1]["messages"][0]["content"] = [{"type": "text", "text": "Look:"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]
    bad = tmp_path / "with_image.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in recs) + "\n", encoding="utf-8")
    p = cli("import", str(bad), "--out", str(out), "--json", check=False)
    assert p.returncode == 1, p.stderr
    s = json.loads(p.stdout)
    assert s["traces"] == n and [(x["line"], "image" in x["what"] and "messages[0]" in x["what"]) for x in s["not_carried_over"]] == [(2, True)]
    assert "1 thing(s) in" in p.stderr and "are not in the written traces" in p.stderr and "line 2" in p.stderr
    p = cli("import", str(bad), "--out", str(out), check=False)
    assert "1 thing(s) not carried over into the traces" in p.stdout and "  line 2, trace " in p.stdout


def test_check_with_bad_lines_or_a_missing_id_exits_1(trace_files):
    p = cli("check", str(trace_files / "mixed.jsonl"), "--no-tokens", "--json", check=False)
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert len(d["traces"]) == 2 and [x["line"] for x in d["problems"]] == [2, 3]
    assert "2 record(s) are not traces" in p.stderr and "2 trace(s) were checked" in p.stderr
    assert cli("check", str(trace_files / "good.jsonl"), "--no-tokens").returncode == 0  # findings do not matter
    p = cli("check", str(trace_files / "good.jsonl"), "--no-tokens", "--id", "nope", check=False)
    assert p.returncode == 2 and "no trace in" in p.stderr and "'nope'" in p.stderr
    p = cli("check", str(trace_files / "mixed.jsonl"), "--no-tokens", "--id", "sample-weather-seattle", "--id", "nope", "--json", check=False)
    assert p.returncode == 1 and json.loads(p.stdout)["missing_ids"] == ["nope"] and "no trace has the id 'nope'" in p.stderr
    p = cli("check", str(trace_files / "bad.jsonl"), "--no-tokens", check=False)
    assert p.returncode == 2 and "nothing was checked" in p.stderr


def test_export_takes_several_files_and_exits_1_on_bad_records(trace_files):
    from backend.trace import load_traces

    out = trace_files / "all.jsonl"
    p = cli("export", str(trace_files / "good.jsonl"), str(trace_files / "mixed.jsonl"), "--to", "jsonl", "--out", str(out), "--json", check=False)
    assert p.returncode == 1
    s = json.loads(p.stdout)
    assert s["traces"] == 3 and s["inputs"] == [str(trace_files / "good.jsonl"), str(trace_files / "mixed.jsonl")]
    assert [(os.path.basename(x["file"]), x["line"]) for x in s["skipped"]] == [("mixed.jsonl", 2), ("mixed.jsonl", 3)]
    assert p.stderr.startswith("error: skipped 2 bad record(s)")
    assert [t.id for t in load_traces(str(out)).traces] == ["sample-weather-seattle", "sample-weather-seattle", "sample-parallel-calls"]
    p = cli("export", str(trace_files / "good.jsonl"), os.path.join(ROOT, "sample_traces", "02_parallel_calls.jsonl"),
            "--to", "verl", "--out", str(trace_files / "rows.parquet"), "--json")
    assert json.loads(p.stdout)["traces"] == 2 and p.stderr == ""
    # an empty file among several is reported, the rest exported
    p = cli("export", str(trace_files / "good.jsonl"), str(trace_files / "empty.jsonl"), "--to", "jsonl", "--out", str(out), "--json", check=False)
    assert p.returncode == 1 and json.loads(p.stdout)["skipped"] == [{"file": str(trace_files / "empty.jsonl"), "line": None, "reason": "the file is empty"}]
    p = cli("export", str(trace_files / "good.jsonl"), "--to", "jsonl", "--out", str(trace_files / "good.jsonl"), check=False)
    assert p.returncode == 2 and "--out must not be an input file" in p.stderr
    p = cli("export", str(trace_files / "bad.jsonl"), "--to", "jsonl", "--out", str(trace_files / "x.jsonl"), check=False)
    assert p.returncode == 2 and "no trace could be read" in p.stderr and "and 1 more bad record" in p.stderr


def test_python_m_backend_is_the_cli(capsys, monkeypatch):
    """``backend/__main__.py`` (what ``python -m backend`` runs) hands its arguments to main() and
    exits with its status; run here with runpy, as the interpreter runs it."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["backend", "profiles", "--json"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("backend", run_name="__main__", alter_sys=True)
    assert e.value.code == 0
    assert "qwen3" in [r["name"] for r in json.loads(capsys.readouterr().out)]
