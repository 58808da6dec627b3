"""The MCP server (ui/mcp_server.py): the real app (app.py's context, ui.build_app) launched on a
free loopback port in public mode with the MCP endpoint mounted the way app.py mounts it, driven by the
real MCP client (``mcp.client.streamable_http.streamable_http_client`` + ``ClientSession``).

Expected values come from outside the code under test: token ids from transformers'
``apply_chat_template`` with the template file read from trl's package, and the prompt ids recorded in a
sample trace; tool calls written by hand; findings that the sample trace is named for, and the CLI's
``check --json``. One test starts ``app.py --mcp`` itself in a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path

import httpx
import pytest
from cli_inprocess import run_cli
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
WEATHER = json.loads((SAMPLES / "01_weather.jsonl").read_text(encoding="utf-8").splitlines()[0])
MALFORMED_LINE = (SAMPLES / "03_malformed_tool_call.jsonl").read_text(encoding="utf-8").splitlines()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    """The app (``--backend scripted --public``: no model) on a free port, with the MCP endpoint
    mounted through ``mcp_server.launch_kwargs`` as app.py does for ``--mcp``."""
    import app as app_module
    import ui
    from ui import mcp_server

    args = app_module.parse_args(["--backend", "scripted", "--public", "--host", "127.0.0.1"])
    ctx = app_module.build_context(args)
    assert ctx.trust.public
    demo = ui.build_app(ctx)
    kw = ui.launch_kwargs(ctx)
    kw.update(mcp_server.launch_kwargs(ctx, host=args.host))
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kw)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.close()


@contextlib.asynccontextmanager
async def mcp_session(base: str):
    async with streamable_http_client(base + "/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(base: str, tool: str, args: dict):
    async with mcp_session(base) as s:
        return await s.call_tool(tool, args)


def error_text(res) -> str:
    assert res.is_error, res.structured_content
    return " ".join(c.text for c in res.content)


def qwen3_reference(messages, tools, add_generation_prompt=True):
    """transformers' own rendering with the Qwen3 vocabulary and the template file from trl's package."""
    import trl

    from backend.loading.tokenizers import load_tokenizer

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3_instruct_2507.jinja").read_text(encoding="utf-8")
    tok = load_tokenizer("qwen3").tokenizer
    kw = dict(tools=tools, add_generation_prompt=add_generation_prompt, chat_template=template)
    return tok.apply_chat_template(messages, tokenize=False, **kw), list(tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)), tok


# ---- the tools -----------------------------------------------------------------------------------


async def test_lists_render_parse_check_as_read_only_tools(app_url):
    async with mcp_session(app_url) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert set(tools) == {"render", "parse", "check"}
    assert tools["render"].input_schema["required"] == ["messages"]
    assert tools["parse"].input_schema["required"] == ["text"]
    assert "required" not in tools["check"].input_schema  # a trace or messages, neither one alone required
    for t in tools.values():
        assert t.annotations.read_only_hint is True and t.annotations.destructive_hint is False
        assert t.output_schema and t.output_schema["type"] == "object"
    assert {"token_ids", "num_tokens", "tokenizer", "truncated"} <= set(tools["render"].output_schema["properties"])


async def test_render_qwen3_gives_the_ids_of_apply_chat_template(app_url):
    msgs = WEATHER["messages"]
    res = await call(app_url, "render", {"messages": msgs, "tools": WEATHER["tools"], "profile": "qwen3"})
    assert not res.is_error, res.content
    out = res.structured_content
    text, ids, tok = qwen3_reference(msgs, WEATHER["tools"])
    assert out["text"] == text
    assert out["token_ids"] == ids and out["num_tokens"] == len(ids) and not out["truncated"]
    assert out["tokens"] == tok.convert_ids_to_tokens(ids)
    assert out["tokenizer"]["name"] == "qwen3" and out["tokenizer"]["vocab_size"] == 151669
    assert out["tokenizer"]["template"] == "qwen3_instruct_2507" and out["tokenizer"]["parser"] == "hermes"
    assert out["tokenizer"]["template_warnings"] == []


async def test_render_of_the_first_turn_is_the_prompt_the_sample_trace_recorded(app_url):
    res = await call(app_url, "render", {"messages": WEATHER["messages"][:1], "tools": WEATHER["tools"]})
    out = res.structured_content
    assert out["token_ids"] == WEATHER["prompt_ids"] and out["num_tokens"] == 178
    # bounded: the first max_ids ids, the full count
    res = await call(app_url, "render", {"messages": WEATHER["messages"][:1], "tools": WEATHER["tools"], "max_ids": 10})
    out = res.structured_content
    assert out["token_ids"] == WEATHER["prompt_ids"][:10] and len(out["tokens"]) == 10
    assert out["num_tokens"] == 178 and out["truncated"] is True


FAMILY_FIRST_TOKENS = {  # how each family's prompt opens (its own special tokens, not pieces of them)
    "qwen3": ["<|im_start|>", "system"], "qwen3-thinking": ["<|im_start|>", "system"], "qwen2.5": ["<|im_start|>", "system"],
    "qwen3.5": ["<|im_start|>", "system"], "smollm2": ["<|im_start|>", "system"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "system", "<|end_header_id|>"],
    "gpt-oss": ["<|start|>", "system", "<|message|>"], "gpt-oss-harmony": ["<|start|>", "system", "<|message|>"],
    "deepseek-v3": ["<｜begin▁of▁sentence｜>"], "mistral": ["<s>", "[AVAILABLE_TOOLS]"],
    "glm4.5": ["[gMASK]", "<sop>", "<|system|>"], "glm5": ["[gMASK]", "<sop>", "<|system|>"],
    "minimax-m2": ["]~!b[", "]~b]", "system"],
    "gemma3": ["<bos>", "<start_of_turn>", "user"], "gemma2": ["<bos>", "<start_of_turn>", "user"],
}


async def test_every_offline_profile_renders_with_its_own_special_tokens(app_url):
    from backend.families import PROFILES

    assert set(FAMILY_FIRST_TOKENS) == set(PROFILES)
    async with mcp_session(app_url) as s:
        for profile, first in FAMILY_FIRST_TOKENS.items():
            res = await s.call_tool("render", {"messages": WEATHER["messages"][:1], "tools": WEATHER["tools"], "profile": profile,
                                               "max_ids": len(first)})
            assert not res.is_error, (profile, res.content)
            out = res.structured_content
            assert out["tokens"] == first, profile
            assert out["tokenizer"]["name"] == profile and out["tokenizer"]["template_warnings"] == []
            assert out["num_tokens"] > len(first)
            # trl's deepseekv3 templates write the tools only into a system message, and this conversation has
            # none; Google's Gemma templates (trl gemma3 / gemma) write no tools at all
            assert ("get_current_temperature" in out["text"]) is (profile not in ("deepseek-v3", "gemma3", "gemma2")), profile
            # ... and the answer says so
            assert any("wrote nothing of the 1 tool schema(s)" in w for w in out["warnings"]) is (
                profile in ("deepseek-v3", "gemma3", "gemma2")), (profile, out["warnings"])


async def test_render_with_a_trl_template_name_and_with_inline_jinja(app_url):
    msgs = [{"role": "user", "content": "Hello there"}]
    res = await call(app_url, "render", {"messages": msgs, "template": "qwen2_5", "add_generation_prompt": False})
    out = res.structured_content
    assert out["tokenizer"]["template"] == "qwen2_5"
    assert out["text"].startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")  # Qwen2.5's default system prompt
    # inline Jinja renders in the guarded worker; the ids are the vocabulary's encoding of the text
    res = await call(app_url, "render", {"messages": msgs, "template": "{{ messages[0].content | upper }}<|im_end|>"})
    out = res.structured_content
    _, _, tok = qwen3_reference(msgs, None)
    assert out["text"] == "HELLO THERE<|im_end|>"
    assert out["token_ids"] == tok.encode("HELLO THERE<|im_end|>", add_special_tokens=False)
    assert out["token_ids"][-1] == 151645 and out["tokenizer"]["template"] == "custom"


async def test_parse_hermes_tool_calls_and_a_malformed_one(app_url):
    good = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    text = f"Let me check.\n<tool_call>\n{good}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": }}\n</tool_call>"
    res = await call(app_url, "parse", {"text": text, "profile": "qwen3"})
    out = res.structured_content
    assert out["parser"] == "hermes" and out["content"] == "Let me check."
    assert [(c["name"], c["arguments"]) for c in out["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    start, end = out["tool_calls"][0]["span"]
    assert text[start:end] == f"<tool_call>\n{good}\n</tool_call>"
    assert len(out["errors"]) == 1 and out["errors"][0]["severity"] == "error"
    s, e = out["errors"][0]["span"]
    assert text[s:e].startswith("<tool_call>") and '"city": }' in text[s:e]


async def test_parse_uses_the_profiles_own_format(app_url):
    xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    res = await call(app_url, "parse", {"text": xml, "profile": "qwen3.5"})
    out = res.structured_content
    assert out["parser"] == "qwen3_xml"
    assert [(c["name"], c["arguments"]) for c in out["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    res = await call(app_url, "parse", {"text": xml, "format": "hermes"})  # the wrong parser finds no call
    assert res.structured_content["tool_calls"] == []


async def test_check_a_trace_with_a_malformed_call_as_the_cli_does(app_url, tmp_path):
    res = await call(app_url, "check", {"trace": MALFORMED_LINE})
    out = res.structured_content
    assert out["id"] == "sample-malformed-call"
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["location"]["step"]) for f in errors] == [("malformed_tool_call", 1)]
    assert out["counts"]["error"] == 1 and out["tokenizer"]["name"] == "qwen3"
    # the same record as a JSON object
    again = (await call(app_url, "check", {"trace": json.loads(MALFORMED_LINE)})).structured_content
    assert again["findings"] == out["findings"]
    # what `python -m backend check --json` says about the same file
    cli = run_cli("check", str(SAMPLES / "03_malformed_tool_call.jsonl"), "--json")
    assert cli.returncode == 0, cli.stderr
    ref = json.loads(cli.stdout)["traces"][0]
    assert out["findings"] == ref["findings"] and out["counts"] == ref["counts"]


async def test_check_token_level_checks_follow_the_profile(app_url):
    rec = json.loads(MALFORMED_LINE)
    rec["tokenizer"]["name"] = "some-org/private-model"  # a name from a file: never loaded
    out = (await call(app_url, "check", {"trace": rec})).structured_content
    assert out["tokenizer"] is None
    skipped = [f for f in out["findings"] if f["code"] == "check_skipped"]
    assert len(skipped) == 1 and "'some-org/private-model'" in skipped[0]["message"] and "pass profile" in skipped[0]["message"]
    assert not {"retokenization_drift", "mask_mismatch"} & {f["code"] for f in out["findings"]}
    named = (await call(app_url, "check", {"trace": rec, "profile": "qwen3"})).structured_content
    assert named["tokenizer"]["name"] == "qwen3"
    assert {"retokenization_drift", "mask_mismatch"} <= {f["code"] for f in named["findings"]}
    structural = (await call(app_url, "check", {"trace": MALFORMED_LINE, "token_checks": False})).structured_content
    assert structural["tokenizer"] is None
    assert [f["code"] for f in structural["findings"]] == ["malformed_tool_call", "empty_response"]


async def test_check_messages_finds_an_orphan_tool_message(app_url):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "tool", "content": "22", "tool_call_id": "call_9"},
            {"role": "assistant", "content": "It is 22 degrees."}]
    res = await call(app_url, "check", {"messages": msgs})
    out = res.structured_content
    codes = {(f["code"], f["severity"], f["location"]["message"]) for f in out["findings"]}
    assert ("orphan_tool_message", "error", 1) in codes
    assert out["counts"]["error"] >= 1
    # a well-formed exchange has no error
    fine = [msgs[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22", "tool_call_id": "call_9"}, msgs[2]]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    res = await call(app_url, "check", {"messages": fine, "tools": tools})
    assert res.structured_content["counts"]["error"] == 0, res.structured_content["findings"]
    # and no warning, nor does a plain user/assistant exchange get one (issue 42: the mask audit
    # warned on the '\n' after each <|im_end|>, which the import of the messages had at 1)
    assert res.structured_content["counts"]["warning"] == 0, res.structured_content["findings"]
    plain = (await call(app_url, "check", {"messages": [msgs[0], msgs[2]]})).structured_content
    assert plain["counts"]["warning"] == 0 and plain["counts"]["error"] == 0, plain["findings"]


# ---- bad input: a tool error with a clear message, and the server goes on answering ------------------


def _bad_cases():
    from backend.safety.trust import MAX_FIELD_CHARS

    hi = [{"role": "user", "content": "hi"}]
    return [
        ("broken-jinja", "render", {"messages": hi, "template": "{% for m in messages %}{{ m.content }"},
         ["TemplateSyntaxError", "line 1"]),
        ("endless-template", "render",
         {"messages": hi, "template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"},
         ["did not finish rendering within"]),
        ("unknown-profile", "render", {"messages": hi, "profile": "no-such-profile"}, ["offline profiles", "qwen3"]),
        ("hub-id", "render", {"messages": hi, "profile": "Qwen/Qwen3-4B-Instruct-2507"}, ["hub ids and paths are not loaded"]),
        ("path-profile", "render", {"messages": hi, "profile": str(ROOT)}, ["hub ids and paths are not loaded"]),
        ("path-template", "render", {"messages": hi, "template": "/etc/passwd"}, ["does not read files"]),
        ("path-in-check", "check", {"messages": hi, "profile": "/tmp"}, ["hub ids and paths are not loaded"]),
        ("oversize-text", "parse", {"text": "x" * (MAX_FIELD_CHARS + 1)}, [f"at most {MAX_FIELD_CHARS:,}"]),
        ("oversize-messages", "render", {"messages": [{"role": "user", "content": "y" * MAX_FIELD_CHARS}]},
         ["messages is", f"at most {MAX_FIELD_CHARS:,}"]),
        ("max-ids", "render", {"messages": hi, "max_ids": 10**9}, ["max_ids must be between 0 and 131072"]),
        ("unknown-format", "parse", {"text": "hi", "format": "vllm:hermes"}, ["unknown tool-call format", "hermes, "]),
        ("not-a-trace", "check", {"trace": {"messages": hi}}, ["not a trace"]),
        ("bad-trace-json", "check", {"trace": "{not json"}, ["trace: invalid JSON"]),
        ("trace-and-messages", "check", {"trace": MALFORMED_LINE, "messages": hi}, ["either trace or messages, not both"]),
        ("neither-trace-nor-messages", "check", {"profile": "qwen3"}, ["give trace", "or messages (a conversation)"]),
        ("message-without-role", "render", {"messages": [{"foo": 1}]}, ["messages[0] has no role", "'foo'", "role: system |"]),
        ("message-with-bad-content", "render", {"messages": [{"role": "user", "content": 3}]}, ["messages[0].content is int"]),
        ("unknown-template-name", "render", {"messages": hi, "template": "qwen3-instruct"},
         ["'qwen3-instruct' is not one of trl's", "closest: qwen3_instruct_2507"]),
        ("control-character-json", "check", {"trace": '{"id": "a' + chr(1) + '"}'},
         ["trace: invalid JSON: Invalid control character at column"]),
        ("wrong-type", "render", {"messages": "hello"}, ["messages must be a list, not text (\"hello\")"]),
        ("bad-role", "check", {"messages": [{"role": "robot", "content": "beep"}]}, ["messages", "'robot'"]),
        # issue 42, item 5: our words, not pydantic's; booleans are no numbers; unknown arguments are said
        ("bool-for-number", "render", {"messages": hi, "max_ids": True}, ["max_ids must be a whole number, not a boolean (true)"]),
        ("text-for-bool", "render", {"messages": hi, "add_generation_prompt": "yes"},
         ['add_generation_prompt must be true or false, not text ("yes")']),
        ("number-for-bool", "check", {"messages": hi, "token_checks": 0}, ["token_checks must be true or false, not the number 0"]),
        ("number-for-list", "render", {"messages": 5}, ["messages must be a list, not the number 5"]),
        ("number-for-text", "parse", {"text": 5}, ["text must be text (a JSON string), not the number 5"]),
        ("float-for-int", "render", {"messages": hi, "max_ids": 2.5}, ["max_ids must be a whole number, not the number 2.5"]),
        ("list-item", "render", {"messages": ["hi"]}, ['messages[0] must be a JSON object, not text ("hi")']),
        ("unknown-argument", "render", {"messages": hi, "max_id": 3},
         ["unknown argument 'max_id' (did you mean 'max_ids'?); render takes messages, tools, profile"]),
        ("unknown-arguments", "parse", {"text": "x", "foo": 1, "bar": 2}, ["unknown arguments 'foo', 'bar'; parse takes text"]),
        ("missing-argument", "parse", {"profile": "qwen3"}, ["parse needs text (one turn of model output"]),
        # issue 42, items 2 and 4: where the input is wrong, said before anything renders it
        ("malformed-call", "render", {"messages": [hi[0], {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather"}}]}], "profile": "gpt-oss"},
         ["messages[1].tool_calls[0].function.arguments is missing (call 'get_weather')"]),
        ("call-without-name", "render", {"messages": [hi[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"arguments": {}}}]}]}, ["messages[1].tool_calls[0].function.name is missing"]),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
async def test_bad_input_is_a_tool_error_and_the_server_still_answers(app_url, case):
    _, tool, args, needles = case
    async with mcp_session(app_url) as s:
        res = await s.call_tool(tool, args)
        text = error_text(res)
        for needle in needles:
            assert needle in text, text
        assert "Traceback" not in text and str(ROOT) not in text and " at at " not in text
        assert "pydantic" not in text and "http" not in text and "Undefined" not in text and "validation error" not in text
        ok = await s.call_tool("parse", {"text": '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'})
        assert not ok.is_error and ok.structured_content["tool_calls"][0]["name"] == "f"


async def test_a_body_over_the_limit_is_refused_before_it_is_read(app_url):
    from ui.mcp_server import max_request_bytes

    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "parse", "arguments": {"text": "' + \
        b"z" * max_request_bytes() + b'"}}}'
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(app_url + "/mcp", content=body, headers={"content-type": "application/json",
                                                                   "accept": "application/json, text/event-stream"})
    assert r.status_code == 413
    res = await call(app_url, "parse", {"text": "plain answer"})
    assert res.structured_content["content"] == "plain answer"


async def test_the_app_is_still_served_beside_the_endpoint(app_url):
    async with httpx.AsyncClient(timeout=30) as c:
        page = await c.get(app_url + "/")
        info = await c.get(app_url + "/gradio_api/info")
        landing = await c.get(app_url + "/mcp", headers={"accept": "text/html"})
    assert page.status_code == 200 and "Agent Loop Inspector" in page.text
    assert info.status_code == 200 and "/template_lab_render" in info.json()["named_endpoints"]
    assert landing.status_code == 200 and "MCP server" in landing.text


# ---- the trust boundary in local mode, and mount() on a running app ---------------------------------


def test_local_mode_tools_still_take_no_paths_or_hub_ids(tmp_path):
    from backend.safety.trust import LOCAL, VisitorInputError
    from ui.context import AppContext
    from ui.mcp_server import do_parse, do_render

    ctx = AppContext(trust=LOCAL)
    assert not ctx.trust.public
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ messages[0].content }}", encoding="utf-8")
    with pytest.raises(VisitorInputError, match="hub ids and paths are not loaded") as e:
        do_render(ctx, [{"role": "user", "content": "hi"}], profile=str(tmp_path))
    # a local app is no public server: the refusal names who refuses
    assert "the MCP endpoint loads only its offline profiles" in str(e.value) and "public server" not in str(e.value)
    with pytest.raises(VisitorInputError, match="does not read files") as e:
        do_render(ctx, [{"role": "user", "content": "hi"}], template=str(tpl))
    assert "(the MCP endpoint does not read files)" in str(e.value) and "public server" not in str(e.value)
    with pytest.raises(VisitorInputError, match="hub ids and paths"):
        do_parse(ctx, "hi", profile="Qwen/Qwen3-4B")
    assert do_render(ctx, [{"role": "user", "content": "hi"}], template="{{ messages[0].content }}").text == "hi"


def test_mount_on_a_running_app_and_dns_rebinding_guard_in_local_mode():
    """mount() on a launched Blocks (its server app) of a local-mode app on loopback: a request
    naming another Host is refused; one naming 127.0.0.1 is served."""
    import gradio as gr

    from backend.safety.trust import LOCAL
    from ui import mcp_server
    from ui.context import AppContext

    ctx = AppContext(trust=LOCAL)
    with gr.Blocks() as demo:
        gr.Markdown("x")
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        assert mcp_server.mount(demo, ctx, host="127.0.0.1") == "/mcp"
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        url = f"http://127.0.0.1:{port}/mcp"
        with httpx.Client(timeout=30) as c:
            evil = c.post(url, json=init, headers={**headers, "host": "attacker.example"})
            good = c.post(url, json=init, headers=headers)
        assert evil.status_code == 421
        assert good.status_code == 200 and good.json()["result"]["serverInfo"]["name"] == "agent-loop-inspector"
    finally:
        demo.close()


# ---- app.py --mcp ----------------------------------------------------------------------------------


def _offline_env() -> dict[str, str]:
    import os

    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
async def test_app_py_serves_mcp_with_the_flag(tmp_path):
    from test_browser import running_app

    with running_app(["--backend", "scripted", "--mcp"], tmp_path / "app.log") as url:
        base = url.rstrip("/")
        async with mcp_session(base) as s:
            names = {t.name for t in (await s.list_tools()).tools}
            res = await s.call_tool("parse", {"text": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'})
            bad = await s.call_tool("render", {"messages": [{"role": "user", "content": "hi"}], "template": "{{ broken"})
        assert names == {"render", "parse", "check"}
        assert res.structured_content["tool_calls"][0]["arguments"] == {"a": 1}
        assert "TemplateSyntaxError" in error_text(bad)
    assert "MCP server" in (tmp_path / "app.log").read_text()


# app.py without --mcp serves no endpoint: tests/test_api.py's app (no flag) checks it


# ---- issue 31, items 9-13: one check rule, bounded answers, fair lanes, validation, schemas ----------

HUNYUAN = SAMPLES / "05_hunyuan_format.jsonl"


def _cli_check(path: Path, *extra: str) -> dict:
    cli = run_cli("check", str(path), "--json", *extra)
    assert cli.returncode == 0, cli.stderr
    return json.loads(cli.stdout)["traces"][0]


async def test_check_gives_the_clis_findings_on_a_trace_with_its_own_template(app_url):
    """The hunyuan sample carries its template text (metadata.chat_template, template 'custom'): the
    tool and `check --json` both re-render with it, and give the same findings."""
    line = HUNYUAN.read_text(encoding="utf-8").splitlines()[0]
    rec = json.loads(line)
    out = (await call(app_url, "check", {"trace": line})).structured_content
    ref = _cli_check(HUNYUAN)
    assert out["findings"] == ref["findings"] and out["counts"] == ref["counts"]
    # the template used is the one the trace was made with, by its hash
    assert out["tokenizer"]["template"] == "custom"
    assert out["tokenizer"]["template_sha256"] == rec["tokenizer"]["template_sha256"]
    assert not any(f["code"] == "retokenization_drift" for f in out["findings"])


async def test_check_says_when_the_traces_own_template_is_not_used(app_url, tmp_path):
    rec = json.loads(HUNYUAN.read_text(encoding="utf-8").splitlines()[0])
    rec["metadata"].pop("chat_template")
    tpl = tmp_path / "hunyuan.jinja"
    tpl.write_text(json.loads(HUNYUAN.read_text(encoding="utf-8").splitlines()[0])["metadata"]["chat_template"], encoding="utf-8")
    rec["tokenizer"]["template"] = str(tpl)  # a path in a file: never read by the MCP tools
    out = (await call(app_url, "check", {"trace": rec})).structured_content
    notes = [f for f in out["findings"] if f["code"] == "check_skipped" and f["details"].get("check") == "template"]
    assert len(notes) == 1, out["findings"]
    assert "not used:" in notes[0]["message"] and "a file a trace names is not read here" in notes[0]["message"]
    assert str(tmp_path) not in json.dumps(out["tokenizer"])
    assert out["tokenizer"]["template"] == "qwen3_instruct_2507"  # the profile's own, said above
    # the CLI (an operator's machine) reads the file the trace names, and so re-renders with the trace's template
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    assert not [f for f in _cli_check(path)["findings"] if f["details"].get("check") == "template"]
    # a trace that carries neither its text nor a name: said so, by both
    rec["tokenizer"]["template"] = "custom"
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    out = (await call(app_url, "check", {"trace": rec})).structured_content
    ref = _cli_check(path)
    assert out["findings"] == ref["findings"]
    assert any("does not carry its template text" in f["message"] for f in out["findings"])


async def test_parse_answer_is_bounded_and_says_what_was_left_out(app_url):
    from ui.mcp_server import MAX_ITEMS

    text = "<tool_call>\n" * 150_000  # 1.8 MB: one unclosed call per line
    async with mcp_session(app_url) as s:
        res = await s.call_tool("parse", {"text": text})
    out = res.structured_content
    assert len(out["errors"]) == MAX_ITEMS and out["left_out"] == {"errors": 150_000 - MAX_ITEMS}
    assert out["errors"][0]["span"] == [0, 11]
    # the text is a short summary, not the structured content a second time
    summary = " ".join(c.text for c in res.content)
    assert len(summary) < 1000 and "150000 parse error(s)" in summary and f"{150_000 - MAX_ITEMS} errors" in summary
    assert len(json.dumps(out)) < 100_000


async def test_answers_text_is_a_summary_of_the_structured_content(app_url):
    res = await call(app_url, "render", {"messages": WEATHER["messages"][:1], "tools": WEATHER["tools"]})
    out = res.structured_content
    text = " ".join(c.text for c in res.content)
    assert len(res.content) == 1 and "rendered 178 tokens" in text and "qwen3_instruct_2507" in text
    assert out["text"] not in text and len(text) < 500
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


async def test_cheap_calls_do_not_wait_behind_slow_ones_and_the_wait_is_bounded():
    """The lanes themselves (ui.mcp_server._Calls), with work that holds its thread until released:
    4 slots, 16 waiting per tool; a parse passes 20 held renders; the 21st render is refused."""
    import threading

    from mcp.server.mcpserver.exceptions import ToolError

    from ui.mcp_server import ParseOutput, _Calls

    calls = _Calls(4)
    release = threading.Event()

    def slow():
        release.wait(30)
        return ParseOutput(parser="hermes", content="slow", tool_calls=[], errors=[])

    held = [asyncio.ensure_future(calls.run("render", slow)) for _ in range(20)]
    await asyncio.sleep(0.2)
    refused = []
    for _ in range(30):
        with pytest.raises(ToolError) as e:
            await calls.run("render", slow)
        refused.append(str(e.value))
    assert all("4 render calls running, 16 waiting" in r for r in refused), refused[0]
    try:
        quick = await asyncio.wait_for(calls.run("parse", lambda: ParseOutput(parser="hermes", content="quick", tool_calls=[],
                                                                              errors=[])), 5)
        assert quick.structured_content["content"] == "quick"
        assert not any(h.done() for h in held)
    finally:
        release.set()
        done = await asyncio.gather(*held)
    assert [d.structured_content["content"] for d in done] == ["slow"] * 20


@pytest.mark.slow  # ≥ 10 s here: held renders
async def test_a_parse_answers_while_renders_hold_the_template_workers(app_url):
    """Over MCP: four renders of a template that loops until the guard stops it (5 s each, two workers:
    two run and two wait, as many as the template lane admits) hold the template workers; a parse
    sent after them answers at once."""
    import time

    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    hi = [{"role": "user", "content": "hi"}]

    async def one(tool, args):
        async with mcp_session(app_url) as s:
            return await s.call_tool(tool, args), time.monotonic()

    start = time.monotonic()
    renders = [asyncio.ensure_future(one("render", {"messages": hi, "template": endless})) for _ in range(4)]
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    res, t1 = await one("parse", {"text": "plain"})
    assert res.structured_content["content"] == "plain"
    # one lane for every tool made it wait for the first render to be stopped (≥ 5 s after it started)
    assert t1 - t0 < 2.5 and t1 - start < 4.5 and not any(r.done() for r in renders), (t1 - t0, t1 - start)
    for r in await asyncio.gather(*renders):
        assert r[0].is_error


async def test_render_reports_what_the_template_or_encoder_leaves_out(app_url):
    tools = WEATHER["tools"]
    name = tools[0]["function"]["name"]
    after_tool = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "22"}]
    out = (await call(app_url, "render", {"messages": after_tool, "tools": tools, "profile": "deepseek-v3"})).structured_content
    # what trl's deepseekv3_training template does, by transformers: no tool schema, no generation prompt after a tool turn
    import trl

    from backend.loading.tokenizers import load_tokenizer

    tpl = (Path(trl.__file__).parent / "chat_templates" / "deepseekv3_training.jinja").read_text(encoding="utf-8")
    tok = load_tokenizer("deepseek-v3").tokenizer
    with_gp = tok.apply_chat_template(after_tool, tools=tools, chat_template=tpl, add_generation_prompt=True, tokenize=False)
    assert out["text"] == with_gp and '"description"' not in with_gp
    assert with_gp == tok.apply_chat_template(after_tool, tools=tools, chat_template=tpl, add_generation_prompt=False, tokenize=False)
    warnings = " | ".join(out["warnings"])
    assert "the template wrote nothing of the 1 tool schema(s) given" in warnings
    assert "add_generation_prompt added nothing" in warnings and "'tool'" in warnings
    # Mistral: the call id rewritten to mistral-common's 9 characters, and no generation prompt to leave out
    out = (await call(app_url, "render", {"messages": after_tool, "tools": tools, "profile": "mistral",
                                          "add_generation_prompt": False})).structured_content
    mapped = [w for w in out["warnings"] if "'call_1'->" in w]
    assert len(mapped) == 1
    new_id = mapped[0].split("'call_1'->'")[1].split("'")[0]
    assert len(new_id) == 9 and new_id in out["text"] and "call_1" not in out["text"]
    assert any("writes no generation prompt" in w for w in out["warnings"])
    # a template that writes the tools and the prompt: no warning
    out = (await call(app_url, "render", {"messages": after_tool, "tools": tools})).structured_content
    assert out["warnings"] == []


async def test_template_hash_is_of_what_renders_or_null_for_an_encoder(app_url):
    import hashlib

    import trl

    hi = [{"role": "user", "content": "hi"}]
    text = (Path(trl.__file__).parent / "chat_templates" / "qwen3_instruct_2507.jinja").read_text(encoding="utf-8")
    out = (await call(app_url, "render", {"messages": hi})).structured_content
    assert out["tokenizer"]["template_sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert out["tokenizer"]["encoder"] is None
    from importlib import metadata

    for profile, encoder in (("mistral", f"mistral-common {metadata.version('mistral-common')}"), ("gpt-oss-harmony", "openai-harmony")):
        out = (await call(app_url, "render", {"messages": hi, "profile": profile})).structured_content
        assert out["tokenizer"]["template_sha256"] is None, profile
        assert out["tokenizer"]["encoder"].startswith(encoder), out["tokenizer"]


@pytest.mark.parametrize(("fmt", "text", "stop"), [
    ("hermes", "It is 22 degrees.<|im_end|>", "<|im_end|>"),
    ("llama3_json", "It is 22 degrees.<|eot_id|>", "<|eot_id|>"),
    ("mistral", "It is 22 degrees.</s>", "</s>"),
    ("harmony", "<|channel|>final<|message|>It is 22 degrees.<|return|>", "<|return|>"),
])
async def test_parse_takes_off_the_final_stop_token_in_every_format(app_url, fmt, text, stop):
    out = (await call(app_url, "parse", {"text": text, "format": fmt})).structured_content
    assert out["content"] == "It is 22 degrees." and out["stop_token"] == stop
    plain = (await call(app_url, "parse", {"text": text[: -len(stop)], "format": fmt})).structured_content
    assert plain["content"] == "It is 22 degrees." and plain["stop_token"] is None


async def test_parse_with_a_profile_uses_its_stop_tokens(app_url):
    call_text = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    out = (await call(app_url, "parse", {"text": call_text, "profile": "gpt-oss"})).structured_content
    assert out["stop_token"] == "<|call|>" and out["tool_calls"][0]["arguments"] == {"city": "Paris"}
    out = (await call(app_url, "parse", {"text": "Hi<|eom_id|>", "profile": "llama3"})).structured_content
    assert out["content"] == "Hi" and out["stop_token"] == "<|eom_id|>"


def _descriptions(schema: dict):
    for key, value in schema.items():
        if key == "description" and isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            yield from _descriptions(value)
        elif isinstance(value, list):
            for v in value:
                if isinstance(v, dict):
                    yield from _descriptions(v)


async def test_schemas_carry_the_limits_and_the_words_are_clean(app_url):
    import tomllib

    from backend.safety.trust import MAX_FIELD_CHARS

    async with streamable_http_client(app_url + "/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert init.server_info.name == "agent-loop-inspector" and init.server_info.version == version
    for t in tools.values():
        texts = [t.description, *_descriptions(t.input_schema), *_descriptions(t.output_schema)]
        for d in texts:
            assert "\n" not in d and "  " not in d, (t.name, d)
    render, parse, check = tools["render"].input_schema, tools["parse"].input_schema, tools["check"].input_schema
    assert (render["properties"]["max_ids"]["minimum"], render["properties"]["max_ids"]["maximum"]) == (0, 131072)
    assert parse["properties"]["text"]["maxLength"] == MAX_FIELD_CHARS
    items = render["properties"]["messages"]["items"]
    assert items["required"] == ["role"] and "user" in items["properties"]["role"]["enum"]
    assert render["properties"]["messages"]["minItems"] == 1
    # exactly one of trace and messages
    import jsonschema

    v = jsonschema.Draft202012Validator(check)
    assert v.is_valid({"trace": "{}"}) and v.is_valid({"messages": [{"role": "user", "content": "hi"}]})
    assert not v.is_valid({}) and not v.is_valid({"trace": "{}", "messages": []})
    # a tool call's arguments have a type: an object, or the text when it did not decode
    call_schema = tools["parse"].output_schema["$defs"]["ToolCallOut"]["properties"]["arguments"]
    assert {a.get("type") for a in call_schema["anyOf"]} == {"object", "string"}
    assert tools["render"].output_schema["$defs"]["TokenizerUsed"]["properties"]["template_sha256"]["anyOf"][1] == {"type": "null"}


# ---- issue 42, items 2-7: the MCP edge as outside clients found it ----------------------------------


async def raw_call(base: str, tool: str, arguments: dict | None = None, *, body: bytes | None = None) -> httpx.Response:
    """One tools/call written as a client that writes its own JSON: ``json.dumps``' default, every
    character outside ASCII as a \\u escape (a lone surrogate too, which the MCP SDK's own client
    cannot send)."""
    if body is None:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": tool, "arguments": arguments}}).encode("ascii")
    async with httpx.AsyncClient(timeout=300) as c:
        return await c.post(base + "/mcp", content=body, headers={"content-type": "application/json",
                                                                  "accept": "application/json, text/event-stream"})


async def test_parse_of_lone_surrogates_answers_them_escaped_never_a_500(app_url):
    """A model wrote the JSON escape of half a UTF-16 pair: the parser decodes it to a lone
    surrogate, which UTF-8 JSON cannot carry (HTTP 500, PydanticSerializationError, before)."""
    text = '<tool_call>\n{"name": "f\\ud800", "arguments": {"a": "\\udc00", "\\ud801": 1}}\n</tool_call>'
    res = await call(app_url, "parse", {"text": text})
    assert not res.is_error, res.content
    c = res.structured_content["tool_calls"][0]
    assert c["name"] == "f\\ud800" and c["arguments"] == {"a": "\\udc00", "\\ud801": 1}  # the six characters of each escape
    assert text[c["span"][0]:c["span"][1]] == text  # spans stay positions in the text sent
    summary = " ".join(x.text for x in res.content)
    assert "3 lone surrogate(s)" in summary and "f\\ud800" in summary
    # the surrogate itself in the request: the transport's JSON reader refuses it (a JSON-RPC parse error, not a 500)
    r = await raw_call(app_url, "parse", {"text": "before \ud800 after"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700
    # a trace given as its text may hold the escape: what is rendered or checked cannot hold one, said with where
    rec = json.loads(MALFORMED_LINE)
    rec["messages"][0]["content"] += "\udc00"
    res = await call(app_url, "check", {"trace": json.dumps(rec)})
    assert "trace.messages[0].content holds a lone surrogate (U+DC00, at character" in error_text(res)
    assert "internal error" not in error_text(res)
    assert (await call(app_url, "parse", {"text": "still answering"})).structured_content["content"] == "still answering"


def served_as_text_model(messages):
    """The messages as transformers' server hands them to a text model's template."""
    from transformers.cli.serving.utils import BaseHandler, Modality

    return BaseHandler.get_processor_inputs_from_messages(messages, Modality.LLM)


async def test_content_parts_render_as_text_and_a_part_not_rendered_is_said(app_url):
    from backend.loading.tokenizers import load_tokenizer

    parts = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    out = (await call(app_url, "render", {"messages": parts})).structured_content
    text, ids, _ = qwen3_reference(served_as_text_model(parts), None)
    assert out["text"] == text and out["token_ids"] == ids and "hello there" in text  # an empty turn before
    assert out["warnings"] == []
    llama = load_tokenizer("llama3")
    out = (await call(app_url, "render", {"messages": parts, "profile": "llama3"})).structured_content
    assert out["text"] == llama.tokenizer.apply_chat_template(served_as_text_model(parts), chat_template=llama.chat_template,
                                                              tokenize=False, add_generation_prompt=True)
    assert "[{'type'" not in out["text"]  # the list's Python repr before
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "http://192.0.2.1/a.png"}}]}]
    for profile, how in (("qwen3", "takes text only"), ("mistral", "encodes text only")):
        res = await call(app_url, "render", {"messages": image, "profile": profile})
        assert not res.is_error, (profile, res.content)  # mistral-common fetched the URL before (an error here)
        warned = [w for w in res.structured_content["warnings"] if w.startswith("messages[0].content[1] (image_url) is not rendered")]
        assert len(warned) == 1 and how in warned[0], res.structured_content["warnings"]
        assert "what is this?" in res.structured_content["text"]


async def test_gpt_oss_renders_a_call_with_content_null(app_url):
    from backend.loading.tokenizers import load_tokenizer

    tools = WEATHER["tools"]
    name = tools[0]["function"]["name"]
    call_msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": name, "arguments": {"city": "Paris"}}}]}
    msgs = [{"role": "user", "content": "Weather in Paris?"}, call_msg, {"role": "tool", "tool_call_id": "call_1", "content": "22"}]
    res = await call(app_url, "render", {"messages": msgs, "tools": tools, "profile": "gpt-oss"})
    assert not res.is_error, res.content  # TypeError at template line 264 before
    b = load_tokenizer("gpt-oss")
    empty = [msgs[0], {**call_msg, "content": ""}, msgs[2]]
    assert res.structured_content["text"] == b.tokenizer.apply_chat_template(
        empty, tools=tools, chat_template=b.chat_template, tokenize=False, add_generation_prompt=True)
    assert f"to=functions.{name}" in res.structured_content["text"]


async def test_arguments_are_checked_and_the_schema_says_so(app_url):
    async with mcp_session(app_url) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        # a list sent as its JSON text is still read (the MCP SDK reads it so; Claude Desktop sends lists so)
        res = await s.call_tool("render", {"messages": json.dumps([{"role": "user", "content": "hi"}]), "max_ids": 0})
        # max_ids: true was taken as 1
        bad = await s.call_tool("render", {"messages": [{"role": "user", "content": "hi"}], "max_ids": True})
    assert all(t.input_schema.get("additionalProperties") is False for t in tools.values())
    assert not res.is_error and res.structured_content["token_ids"] == [] and res.structured_content["num_tokens"] > 0
    assert bad.is_error and "not a boolean (true)" in error_text(bad)


async def test_a_body_of_escaped_emoji_under_the_character_limit_is_read(app_url):
    """1,000,000 emoji (half the 2,000,000-character limit) written as \\u escapes, 12 bytes each:
    a 12 MB body, refused with 413 before (the body limit was 4 bytes a character)."""
    from backend.safety.trust import MAX_FIELD_CHARS
    from ui.mcp_server import max_request_bytes

    text = "\U0001F600" * 1_000_000
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "parse", "arguments": {
        "text": text}}}).encode("ascii")
    assert len(body) > 12_000_000 and len(text) < MAX_FIELD_CHARS
    r = await raw_call(app_url, "parse", body=body)
    assert r.status_code == 200, r.text[:300]
    out = r.json()["result"]
    assert out.get("isError") is not True and out["structuredContent"]["content"] == text
    # a body over the limit is refused with the limit in bytes, and why it is what it is
    r = await raw_call(app_url, "parse", body=b'{"text": "' + b"z" * max_request_bytes() + b'"}')
    assert r.status_code == 413
    assert f"at most {max_request_bytes():,} bytes" in r.text and f"{MAX_FIELD_CHARS:,} characters" in r.text
    assert "12 bytes a character" in r.text


async def test_inline_template_calls_beyond_the_template_workers_are_refused_at_admission():
    """The lanes themselves (ui.mcp_server._Calls), with work that holds its thread until released:
    two template workers, so two calls with an inline template run and two wait; the fifth is
    refused at once (it was queued behind 4 running and 16 waiting renders, each of which could
    wait 30 s more for a worker: answers after ~105 s); a render without one is not held up."""
    import threading

    from mcp.server.mcpserver.exceptions import ToolError

    from ui.mcp_server import ParseOutput, _Calls

    calls = _Calls(4, template_workers=2, template_wait_s=600)
    release = threading.Event()

    def held():
        release.wait(60)
        return ParseOutput(parser="hermes", content="held", tool_calls=[], errors=[])

    admitted = [asyncio.ensure_future(calls.run("render", held, template=True)) for _ in range(4)]
    await asyncio.sleep(0.2)
    try:
        for tool in ("render", "check"):
            with pytest.raises(ToolError) as e:
                await calls.run(tool, held, template=True)
            assert "2 calls with an inline template running, as many as there are template workers, 2 waiting" in str(e.value)
        quick = await calls.run("render", lambda: ParseOutput(parser="hermes", content="quick", tool_calls=[], errors=[]))
        assert quick.structured_content["content"] == "quick" and not any(a.done() for a in admitted)
    finally:
        release.set()
    assert [d.structured_content["content"] for d in await asyncio.gather(*admitted)] == ["held"] * 4


async def test_a_call_waits_for_a_template_worker_no_longer_than_its_bound():
    """A call admitted to wait for a template worker is refused once its bound (counted from its
    admission) has passed, while the call ahead of it still holds the worker; the work of every
    call runs with the wait budget the template pool reads."""
    import threading

    from mcp.server.mcpserver.exceptions import ToolError

    from backend.tokens import template_guard
    from ui.mcp_server import ParseOutput, _Calls

    calls = _Calls(4, template_workers=1, template_wait_s=0.5)
    release = threading.Event()
    seen = []

    def held():
        seen.append(template_guard._BUDGET.get())
        release.wait(60)
        return ParseOutput(parser="hermes", content="held", tool_calls=[], errors=[])

    first = asyncio.ensure_future(calls.run("render", held, template=True))
    await asyncio.sleep(0.2)  # it holds the one slot
    try:
        with pytest.raises(ToolError) as e:
            await calls.run("render", held, template=True)
        assert "for a template worker, the most a call waits; try again" in str(e.value)
        assert not first.done()
    finally:
        release.set()
    assert (await first).structured_content["content"] == "held"
    # each call's work sees its budget; a call outside the template lane gets a whole one from its start
    assert len(seen) == 1 and isinstance(seen[0], template_guard.WaitBudget) and seen[0].left <= 0.5
    await calls.run("check", lambda: seen.append(template_guard._BUDGET.get()) or ParseOutput(
        parser="hermes", content="", tool_calls=[], errors=[]))
    assert seen[1] is not seen[0] and seen[1].left == 0.5
    # a free slot is taken with no time left to wait for one (ALI_TEMPLATE_QUEUE_TIMEOUT_S=0)
    none_left = _Calls(4, template_workers=1, template_wait_s=0)
    done = await none_left.run("render", lambda: ParseOutput(parser="hermes", content="at once", tool_calls=[], errors=[]),
                               template=True)
    assert done.structured_content["content"] == "at once"


@pytest.mark.slow  # ≥ 10 s here: renders held for the guard's 5 s, twice
async def test_renders_of_an_endless_inline_template_are_refused_at_admission_not_after_minutes(app_url):
    """Over MCP, the issue's case: many renders of an inline template that loops until the guard stops
    it (5 s), with the app's two template workers. Each answer is either the guard stopping the
    template or the refusal at admission; none waits for a worker and is refused after it
    (before: 10 refused at once, the rest answered up to 112 s later, 1-2 of them "all 2 template
    workers are busy" after 50-70 s)."""
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    hi = [{"role": "user", "content": "hi"}]
    sessions = contextlib.AsyncExitStack()
    async with sessions:
        opened = [await sessions.enter_async_context(mcp_session(app_url)) for _ in range(10)]
        answers = await asyncio.gather(*[s.call_tool("render", {"messages": hi, "template": endless}) for s in opened])
    texts = [error_text(a) for a in answers]
    stopped = [t for t in texts if "did not finish rendering within 5 s" in t]
    refused = [t for t in texts if "calls with an inline template running, as many as there are template workers" in t]
    assert len(stopped) + len(refused) == len(texts), texts
    assert len(stopped) >= 2 and len(refused) >= 1 and not any("template workers are busy" in t for t in texts)
