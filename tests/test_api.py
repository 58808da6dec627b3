"""API parity (issue 23): every endpoint's defaults are the page's.

What a visitor gets by pressing a button without touching a widget, an API client gets by calling
the endpoint with only its required parameters. For /playground_run that is ONE settings object
whose documented default is the widgets' initial values, and ``settings={}`` (or a settings
object naming some fields) fills the rest with them.

* In-process, for each app configuration (``--backend scripted --script FILE``, ``--no-model``,
  the embedded model's default backend, ``vllm-server`` with ``ALI_VLLM_LOGPROBS_MODE``,
  ``--enable-code-tools``): /playground_run's documented default settings equal the Playground
  widgets' initial values, field by field, and hold the values this configuration must give.
* The real app (``app.py --backend scripted --script FILE``) on a free port, through
  gradio_client: one turn with ``settings={}`` answers from the script file and its trace file
  downloads (messages, token ids, response mask); no arguments at all runs the page's default
  message; a settings object naming one field keeps every other default (the trace's LoopConfig
  says so); unknown or malformed fields are clear messages; every endpoint view_api lists, called
  with its documented defaults, does what the page does, and the app logs no traceback.
* Slow: the real app with the embedded model (no arguments): ``settings={}`` gets an answer from
  the model after the forced tool call, as the page's Send does.
"""

from __future__ import annotations

import glob
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from test_browser import running_app

ROOT = Path(__file__).resolve().parent.parent
CALL_TIMEOUT_S = 120

# the --script file of the app under test: a tool call, then the answer
SCRIPT = [
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Paris, France"}}\n</tool_call>',
    "It is 72°F in Paris, France.",
]
PAGE_MESSAGE = "What's the weather in Seattle?"  # the page's user message box, before anyone types
QWEN_IM_END = 151645  # <|im_end|> in the Qwen3 vocabulary: every generated turn of the qwen3 profile ends with it

# the Playground's own widgets (elem_id) for each field of /playground_run's settings object; the
# loop settings' widgets are named by their LoopConfig field (backend.config.FIELDS)
OWN_WIDGETS = {
    "backend": "pg-backend", "script": "pg-script", "token_delay": "pg-delay", "tokenizer": "pg-tokenizer",
    "template": "pg-template", "system": "pg-system", "tools": "pg-tools", "temperature": "pg-temperature",
    "top_p": "pg-top-p", "max_tokens": "pg-max-tokens", "seed": "pg-seed", "logprobs": "pg-logprobs",
}
# the defaults every configuration shares (the loop settings as the widgets write them: 0 = no limit)
COMMON = {
    "token_delay": 0.02, "tokenizer": "qwen3", "template": "", "system": "", "temperature": 0.7, "top_p": 1.0,
    "max_tokens": 512, "seed": None, "logprobs": False, "response_length": 4096, "max_assistant_turns": 0,
    "max_user_turns": 0, "max_parallel_calls": 1, "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
    "apply_chat_template_kwargs": "{}", "parser": "auto", "tool_timeout_s": 30.0, "on_tool_error": "feed_back",
}
# the trace's LoopConfig after a run with every default but temperature 0
DEFAULT_LOOP_CONFIG = {
    "response_length": 4096, "max_assistant_turns": None, "max_user_turns": None, "max_parallel_calls": 1,
    "max_tool_response_length": 256, "tool_response_truncate_side": "middle", "apply_chat_template_kwargs": {}, "parser": None,
    "tool_timeout_s": 30.0, "on_tool_error": "feed_back", "tool_choice": "auto", "vllm_logprobs_mode": "raw",
    "tool_turns": "continuous",
}


@pytest.fixture(scope="module")
def script_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("api-script") / "script.json"
    p.write_text(json.dumps(SCRIPT), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def scripted_app(tmp_path_factory, script_file):
    """``app.py --backend scripted --script FILE`` on a free loopback port (its log must end with
    no traceback: running_app checks)."""
    with running_app(["--backend", "scripted", "--script", str(script_file)], tmp_path_factory.mktemp("api-app") / "app.log") as url:
        yield url


def test_app_py_without_the_mcp_flag_serves_no_mcp_endpoint(scripted_app):
    """The MCP endpoint is opt-in (``--mcp``, tests/test_mcp.py starts app.py with it): this app.py
    has no flag, and a JSON-RPC POST to /mcp is not served."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(scripted_app + "mcp", data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
                                 headers={"content-type": "application/json", "accept": "application/json, text/event-stream"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code in (404, 405)


def client(url: str, downloads: Path | None = None):
    """A gradio_client Client: a session of its own; files downloaded into ``downloads``."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=str(downloads) if downloads else False,
                  httpx_kwargs={"timeout": CALL_TIMEOUT_S})


def weather_tool_names(tools_json: str) -> list[str]:
    return [t["function"]["name"] for t in json.loads(tools_json)]


def read_trace(path: str) -> dict[str, Any]:
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return json.loads(lines[0])


def mask_runs(mask: list[int]) -> list[int]:
    """The values of the mask's runs: [1, 0, 1] for 1 1 0 0 0 1."""
    out: list[int] = []
    for m in mask:
        if not out or out[-1] != m:
            out.append(m)
    return out


def status_of(out: Any) -> str:
    return str(out[1])


# ---- in-process: the documented defaults are the widgets' initial values, per configuration ----------


def _configs(script_file: Path) -> list[tuple[list[str], dict[str, str], dict[str, Any]]]:
    embedded_backend = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    return [
        (["--backend", "scripted", "--script", str(script_file)], {},
         {"backend": "scripted", "script": SCRIPT, "tool_choice": "auto", "vllm_logprobs_mode": "raw"}),
        (["--no-model"], {},
         {"backend": "scripted", "script": "weather", "tool_choice": "auto", "vllm_logprobs_mode": "raw"}),
        # the embedded default model never calls a tool on its own: the page forces the first call
        ([], {}, {"backend": embedded_backend, "script": "weather", "tool_choice": "required, then auto", "vllm_logprobs_mode": "raw"}),
        (["--backend", "vllm-server", "--server-url", "http://127.0.0.1:9"], {"ALI_VLLM_LOGPROBS_MODE": "processed"},
         {"backend": "vllm-server", "script": "weather", "tool_choice": "auto", "vllm_logprobs_mode": "processed"}),
        (["--backend", "scripted", "--enable-code-tools"], {},
         {"backend": "scripted", "script": "weather", "tool_choice": "auto", "vllm_logprobs_mode": "raw", "code_tools": True}),
    ]


@pytest.mark.parametrize("i", range(5), ids=["scripted-script", "no-model", "embedded", "vllm-server-env", "code-tools"])
def test_playground_run_defaults_are_the_widgets_initial_values(i, script_file, monkeypatch):
    import app
    import ui
    from backend.config import FIELDS

    argv, env, want = _configs(script_file)[i]
    monkeypatch.delenv("ALI_VLLM_LOGPROBS_MODE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    demo = ui.build_app(app.build_context(app.parse_args(argv)))

    params = {p["parameter_name"]: p for p in demo.get_api_info()["named_endpoints"]["/playground_run"]["parameters"]}
    assert set(params) == {"text", "settings"}
    assert params["text"]["parameter_has_default"] and params["text"]["parameter_default"] == PAGE_MESSAGE
    assert params["settings"]["parameter_has_default"]
    api = params["settings"]["parameter_default"]

    widgets = {c["props"].get("elem_id"): c["props"].get("value") for c in demo.get_config_file()["components"]}
    by_field = {**OWN_WIDGETS, **{n: k.elem_id for n, k in FIELDS.items() if k.widget}}
    if want.get("code_tools"):
        by_field["code_tools"] = "pg-code-tools"
    assert set(api) == set(by_field), "a settings field without its widget, or a widget missing from the settings"
    for name, elem_id in by_field.items():
        assert api[name] == widgets[elem_id], f"{name}: the API's default {api[name]!r} is not the page's {widgets[elem_id]!r}"
    assert widgets["pg-message"] == PAGE_MESSAGE

    # and they are this configuration's
    for name, v in COMMON.items():
        assert api[name] == v, name
    assert (api["backend"], api["tool_choice"], api["vllm_logprobs_mode"]) == (want["backend"], want["tool_choice"], want["vllm_logprobs_mode"])
    script = json.loads(api["script"])
    if want["script"] == "weather":
        assert len(script) == 2 and script[0].startswith("<tool_call>") and "get_current_temperature" in script[0]
    else:
        assert script == want["script"]
    assert weather_tool_names(api["tools"]) == ["get_current_temperature"]
    if want.get("code_tools"):
        assert "def " in api["code_tools"] and "get_current_temperature" not in api["code_tools"]  # no name clash with the schema


def test_settings_object_fills_what_it_leaves_out_and_refuses_unknown_fields():
    from ui.context import AppContext, UserError
    from ui.playground import default_settings, settings_from_dict

    defaults = default_settings(AppContext())
    assert settings_from_dict({}, defaults) == defaults and settings_from_dict(None, defaults) == defaults
    s = settings_from_dict({"temperature": 0, "seed": None, "tools": [{"type": "function", "function": {"name": "f"}}],
                            "apply_chat_template_kwargs": {"enable_thinking": False}, "tool_choice": ["required", "auto"]}, defaults)
    assert s.temperature == 0 and s.seed is None and s.max_tokens == 512 and s.script == defaults.script
    assert json.loads(s.tools) == [{"type": "function", "function": {"name": "f"}}]
    assert json.loads(s.apply_chat_template_kwargs) == {"enable_thinking": False} and s.tool_choice == "required, auto"
    assert settings_from_dict('{"system": "be brief"}', defaults).system == "be brief"
    for bad, needle in [({"temprature": 0.5}, "unknown key(s) temprature"), ([1, 2], "a JSON object"), ("{oops", "invalid JSON"),
                        ({"tools": 5}, "tools must be text"), ({"backend": ["vllm"]}, "backend must be text"),
                        ({"max_tokens": True}, "max_tokens must be a number"), ({"logprobs": "yes"}, "logprobs must be true or false")]:
        with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            settings_from_dict(bad, defaults)


# ---- the real app through gradio_client --------------------------------------------------------------


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_empty_settings_run_the_pages_default_turn_and_its_trace_downloads(scripted_app, tmp_path):
    chat, status, box, trace_file, model = client(scripted_app, tmp_path).predict(
        "What's the weather in Paris?", {}, api_name="/playground_run")
    assert "run 1 ended: answered" in status and 'data-status="ok"' in status, status
    assert "no model" in model
    assert any("It is 72°F in Paris, France." in json.dumps(m, ensure_ascii=False) for m in chat)

    path = trace_file["value"]
    assert Path(path).is_file() and Path(path).resolve().is_relative_to(tmp_path.resolve()), path  # downloaded here
    t = read_trace(path)
    assert [m["role"] for m in t["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert t["messages"][0]["content"] == "What's the weather in Paris?"
    call = t["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "get_current_temperature" and call["arguments"] == {"city": "Paris, France"}
    assert json.loads(t["messages"][2]["content"]) == {"temperature": 72, "city": "Paris, France"}  # the default tool's mock
    assert t["messages"][3]["content"] == "It is 72°F in Paris, France."
    assert t["termination_reason"] == "no_tool_calls" and t["tokenizer"]["name"] == "qwen3"
    assert [x["function"]["name"] for x in t["tools"]] == ["get_current_temperature"]
    # token level: generated (1), injected tool turn (0), generated (1); each generated turn ends with <|im_end|>
    assert len(t["response_mask"]) == len(t["response_ids"]) > 0 and t["prompt_ids"]
    assert mask_runs(t["response_mask"]) == [1, 0, 1]
    ends = [i for i in range(len(t["response_mask"])) if t["response_mask"][i] == 1
            and (i + 1 == len(t["response_mask"]) or t["response_mask"][i + 1] == 0)]
    assert len(ends) == 2 and all(t["response_ids"][i] == QWEN_IM_END for i in ends)
    assert t["config"] == {**DEFAULT_LOOP_CONFIG, "sampling": {"temperature": 0.7, "top_p": 1.0, "max_tokens": 512}}


def test_no_arguments_at_all_is_the_pages_send(scripted_app, tmp_path):
    c = client(scripted_app, tmp_path)
    out = c.predict(api_name="/playground_run")
    assert "run 1 ended: answered" in status_of(out), status_of(out)
    t = read_trace(out[3]["value"])
    assert t["messages"][0] == {"role": "user", "content": PAGE_MESSAGE}
    assert t["messages"][-1]["content"] == "It is 72°F in Paris, France."
    # as on the page, the next Send goes on in the script (used up), and Reset starts again
    again = c.predict(api_name="/playground_run")
    assert "turn(s) are used up" in status_of(again) and 'data-status="err"' in status_of(again)
    assert "conversation cleared" in str(c.predict(api_name="/playground_reset")[1])
    assert "run 2 ended: answered" in status_of(c.predict(api_name="/playground_run"))


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_a_settings_object_naming_some_fields_keeps_every_other_default(scripted_app, tmp_path):
    out = client(scripted_app, tmp_path).predict("What's the weather in Paris?", {"temperature": 0, "system": "Be brief."},
                                                 api_name="/playground_run")
    assert "run 1 ended: answered" in status_of(out), status_of(out)
    t = read_trace(out[3]["value"])
    assert [m["role"] for m in t["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert t["messages"][0]["content"] == "Be brief." and t["messages"][-1]["content"] == "It is 72°F in Paris, France."
    assert [x["function"]["name"] for x in t["tools"]] == ["get_current_temperature"]
    assert t["config"] == {**DEFAULT_LOOP_CONFIG, "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 512}}


@pytest.mark.parametrize("settings, needle", [
    ({"temprature": 0.5}, "unknown key(s) temprature; known: backend, script"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"max_tokens": 10**9}, "max_tokens per turn must be between 1 and 8192"),
    ({"tools": 5}, "tools must be text"),
    ("not json", "settings: invalid JSON"),
    (["a", "list"], "settings: a JSON object of run settings"),
], ids=["unknown-field", "not-a-number", "out-of-range", "wrong-type", "not-json", "not-an-object"])
def test_a_bad_settings_field_is_a_clear_message(scripted_app, tmp_path, settings, needle):
    c = client(scripted_app, tmp_path)
    out = c.predict("What's the weather in Paris?", settings, api_name="/playground_run")
    assert 'data-status="err"' in status_of(out) and needle in status_of(out).replace("&#x27;", "'"), status_of(out)
    assert "Traceback" not in json.dumps(out)
    assert not (isinstance(out[3], dict) and out[3].get("value"))  # no trace
    # the session is unharmed: the next call with the defaults runs
    assert "run 1 ended: answered" in status_of(c.predict("What's the weather in Paris?", {}, api_name="/playground_run"))


def _sample_ids() -> list[str]:
    ids = []
    for f in sorted(glob.glob(str(ROOT / "sample_traces" / "*.jsonl"))):
        ids += [json.loads(line)["id"] for line in Path(f).read_text(encoding="utf-8").splitlines() if line.strip()]
    return ids


FIRST_SAMPLE = "sample · 01_weather · weather in Seattle (seed 001)"  # the page opens on the first sample


def _check_endpoint(name: str, out: Any, downloads: Path) -> None:
    """What the page shows when its button is pressed untouched (a fresh session: the samples)."""
    text = json.dumps(out, ensure_ascii=False)
    if name in ("/app_load", "/inspector_open", "/refresh_inspector"):
        assert out[0]["value"] == FIRST_SAMPLE, out[0]
        assert "sample-weather-seattle" in out[1] and "25×1 29×0 16×1" in out[1]  # the summary: id and mask runs
        assert 'data-step="1"' in out[10]  # the default step: the first generated turn
        if name == "/app_load":
            table = out[17]
            assert [row[table["headers"].index("id")] for row in table["data"]] == _sample_ids()
    elif name == "/on_step":
        assert 'data-step="1"' in out[0] and "generating" in out[0]
    elif name == "/inspector_score":  # a trace that names no model cannot be scored: said in the lens's status
        assert "not scored" in text and 'data-status=\\"err\\"' in text
    elif name == "/inspector_lens":  # the first sample has no rollout logprobs: the status says so, no numbers
        assert 'data-status="info"' in out[0] and "no rollout logprobs" in out[0] and out[1] == "", out[:2]
    elif name == "/template_lab_render":
        assert 'class=\\"ali-ok\\"' in json.dumps(out[0]) and 'class=\\"ali-ok\\"' in json.dumps(out[3])
        assert "tokens" in out[0] and out[6]
    elif name == "/trace_files_upload":
        assert "01_weather.jsonl: 1 trace(s) loaded" in out[0], out[0]
        assert [row[out[4]["headers"].index("id")] for row in out[4]["data"]] == ["sample-weather-seattle"]
    elif name == "/trace_files_filter":  # no filter: every trace of the table (a fresh session: the samples)
        table = out[2]
        assert [row[table["headers"].index("id")] for row in table["data"]] == _sample_ids()
    elif name == "/trace_groups":  # the samples' GRPO groups (by prompt: they carry no group id), the first shown
        table = out[4]
        ids = [row[table["headers"].index("id")] for row in table["data"]]
        ranks = [int(row[table["headers"].index("rank")]) for row in table["data"]]
        assert ids and set(ids) <= set(_sample_ids()) and ranks == list(range(1, len(ids) + 1)), table
        assert 'class="gv-grid"' in out[7] and "A: rank 1" in out[7] and f"B: rank {len(ids)}" in out[7]
    elif name == "/on_export":  # "Export filtered" with no filter: every trace the table lists, as JSONL
        path = out["value"]
        assert Path(path).resolve().is_relative_to(downloads.resolve())
        rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        assert [r["id"] for r in rows] == _sample_ids()
    elif name == "/playground_run":
        assert "run 1 ended: answered" in out[1], out[1]
        assert read_trace(out[3]["value"])["messages"][0]["content"] == PAGE_MESSAGE
    elif name == "/playground_stop":
        assert "nothing is running" in out
    elif name == "/playground_reset":
        assert out[0] == [] and "conversation cleared" in out[1]


def test_every_endpoint_called_with_its_documented_defaults_does_what_the_page_does(scripted_app, tmp_path):
    from gradio_client import handle_file

    api = client(scripted_app).view_api(return_format="dict", print_info=False)
    named = api["named_endpoints"]
    stable = {"/app_load", "/playground_run", "/playground_stop", "/playground_reset", "/inspector_open", "/inspector_score",
              "/inspector_lens", "/template_lab_render", "/trace_files_upload", "/trace_files_filter", "/trace_groups"}
    assert stable <= set(named), sorted(named)
    required = {n: [p["parameter_name"] for p in ep["parameters"] if not p["parameter_has_default"]] for n, ep in named.items()}
    # a file upload needs its file; every other parameter of the stable endpoints has its default
    assert {n: r for n, r in required.items() if r and n in stable} == {"/trace_files_upload": ["path"]}
    checked = []
    for name, ep in named.items():
        args = {}
        for p in ep["parameters"]:
            if p["parameter_has_default"]:
                continue
            if p["component"] == "File":
                args[p["parameter_name"]] = handle_file(str(ROOT / "sample_traces" / "01_weather.jsonl"))
            else:  # an endpoint added later with a parameter the page has no default for: its documented example
                args[p["parameter_name"]] = p["example_input"]
        downloads = tmp_path / name.strip("/")
        downloads.mkdir()
        try:
            out = client(scripted_app, downloads).predict(**args, api_name=name)  # a fresh session per endpoint
        except Exception as e:  # noqa: BLE001 - reported with the endpoint's name
            pytest.fail(f"{name} called with its defaults ({sorted(args)} given) failed: {type(e).__name__}: {e}")
        _check_endpoint(name, out, downloads)
        checked.append(name)
    assert stable <= set(checked)


PRIME_RL_EXPORT = ROOT / "tests" / "data" / "import" / "verifiers" / "run" / "token_exports" / "step_3" / "rank_0.jsonl"


def test_the_lens_of_a_file_with_both_logprobs_over_the_api(scripted_app, tmp_path):
    """A prime-rl token export (written by the real library, tests/fixtures_gen/gen_verifiers.py)
    uploaded, its first trace opened: /inspector_lens gives the lens's numbers from the file's
    own logprobs, no scoring and no model (the app is scripted): the loss-mask token count, the
    largest |trainer − inference| and prime-rl's own mismatch_kl averaged over the loss mask."""
    import re

    from gradio_client import handle_file

    row = json.loads(PRIME_RL_EXPORT.read_text(encoding="utf-8").splitlines()[0])
    on = [i for i, m in enumerate(row["loss_mask"]) if m]
    c = client(scripted_app, tmp_path)
    up = c.predict(handle_file(str(PRIME_RL_EXPORT)), api_name="/trace_files_upload")
    assert "imported from <b>prime-rl</b>" in up[0], up[0]
    views = c.predict(api_name="/inspector_open")
    assert "prime-rl-s3-r0-0" in views[1]  # the summary names the file's first trace
    status, numbers, scatter, _, _, worst = c.predict(api_name="/inspector_lens")
    assert 'data-status="ok"' in status and "from the file" in status, status

    def metric(name: str) -> float:
        m = re.search(rf'<tr data-metric="{name}"><th[^>]*>[^<]*</th><td data-value="([^"]+)"', numbers)
        assert m, (name, numbers[:500])
        return float(m.group(1))

    assert metric("tokens") == len(on)
    d = [row["trainer_logprobs"][i] - row["inference_logprobs"][i] for i in on]
    assert metric("max_abs_delta") == pytest.approx(max(map(abs, d)), rel=1e-6)
    assert metric("kl_k3") == pytest.approx(sum(row["mismatch_kl"][i] for i in on) / len(on), rel=1e-2)
    assert 'class="ali-lens-tok"' in worst and scatter


def test_export_with_no_rows_is_what_the_table_lists_and_an_emptied_table_exports_nothing(tmp_path):
    """/on_export's default table has no rows: it exports what the session's table lists (every
    sample trace, for a fresh session); after a search that matches nothing the page's table is
    empty and so is the export (a message, not every trace)."""
    import gradio as gr
    import pandas as pd

    from ui import trace_files
    from ui.context import AppContext, load_samples, new_session

    samples, _ = load_samples()
    ctx = AppContext(samples=samples)
    sess = new_session(ctx)
    sess.file_traces = [label for label, _ in ctx.samples]
    empty = pd.DataFrame([], columns=trace_files.COLUMNS)
    path = trace_files.export_filtered(sess, empty, "jsonl")
    assert [json.loads(line)["id"] for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()] == _sample_ids()
    shown = trace_files.table_outputs(sess, trace_files.ALL, trace_files.ALL, "no trace says this")[2]
    assert shown.empty
    with pytest.raises(gr.Error, match="nothing to export"):
        trace_files.export_filtered(sess, shown, "jsonl")
    blank_row = pd.DataFrame([[""] * len(trace_files.COLUMNS)], columns=trace_files.COLUMNS)  # what the page may send
    with pytest.raises(gr.Error, match="nothing to export"):
        trace_files.export_filtered(sess, blank_row, "jsonl")
    sess.remove_temp_dirs()
