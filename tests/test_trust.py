"""The trust boundary in-process (backend/safety/trust.py and the UI paths that use it): which mode a
server is in, what visitor input may name in each mode, where a template's trust comes from,
the number ranges, the run time limit, the bounded tokenizer cache. The same attacks against a
real app subprocess over HTTP are in tests/adversarial/test_public_visitor.py."""

from __future__ import annotations

import asyncio
import json
import os
import secrets

import pytest
from playground_support import fresh, run_all, settings

import app as app_module
from backend.engine import AgentLoop, LoopConfig
from backend.generators.scripted import ScriptedGenerator, ScriptError, check_script
from backend.loading.tokenizers import load_tokenizer, read_trl_template
from backend.safety.trust import LOCAL, RANGES, Mode, TrustPolicy, VisitorInputError, decide_mode, is_loopback
from backend.trace import Trace
from backend.trace.model import TerminationReason
from ui import inspector, template_lab
from ui.context import AppContext, ModelOptions, ModelService, UserError, new_session

PUBLIC = TrustPolicy(Mode.PUBLIC, "test")


@pytest.fixture()
def canaries(tmp_path):
    """Files a visitor must never get the server to read: one named like a trl template, one
    with Jinja in it, a folder that looks like a tokenizer."""
    secret = "CANARY-" + secrets.token_hex(8)
    (tmp_path / "qwen3").write_text(f"{secret} {{{{ messages[0].content }}}}", encoding="utf-8")
    (tmp_path / "canary.jinja").write_text(f"{secret} {{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}", encoding="utf-8")
    (tmp_path / "plain.txt").write_text(secret, encoding="utf-8")
    tok = tmp_path / "tokdir"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text(json.dumps({"chat_template": secret}), encoding="utf-8")
    return tmp_path, secret


# ---- mode ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host, share, env, forced, mode", [
    ("127.0.0.1", False, {}, None, Mode.LOCAL),
    ("localhost", False, {}, None, Mode.LOCAL),
    ("::1", False, {}, None, Mode.LOCAL),
    ("127.0.0.2", False, {}, None, Mode.LOCAL),
    ("0.0.0.0", False, {}, None, Mode.PUBLIC),
    ("::", False, {}, None, Mode.PUBLIC),
    ("192.168.1.5", False, {}, None, Mode.PUBLIC),
    ("myhost.example", False, {}, None, Mode.PUBLIC),
    ("127.0.0.1", True, {}, None, Mode.PUBLIC),
    ("127.0.0.1", False, {"SPACE_ID": "me/space"}, None, Mode.PUBLIC),
    ("0.0.0.0", False, {}, "local", Mode.LOCAL),
    ("127.0.0.1", False, {}, "public", Mode.PUBLIC),
])
def test_mode_follows_who_can_reach_the_server(host, share, env, forced, mode):
    assert decide_mode(host, share, forced, env)[0] is mode


def test_loopback_names():
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("") and not is_loopback("10.0.0.1")


def test_app_flags_and_environment_choose_the_mode():
    env = {"SPACE_ID": "someone/space"}
    args = app_module.parse_args(["--backend", "scripted"], environ=env)
    t = app_module.trust_policy(args, environ=env)
    assert t.public and t.run_timeout_s == app_module.PUBLIC_RUN_TIMEOUT_S
    args = app_module.parse_args(["--backend", "scripted", "--local", "--host", "0.0.0.0"], environ={})
    assert not app_module.trust_policy(args, environ={}).public
    args = app_module.parse_args(["--backend", "scripted"], environ={"ALI_MODE": "public", "ALI_RUN_TIMEOUT_S": "7"})
    t = app_module.trust_policy(args, environ={"ALI_MODE": "public"})
    assert t.public and t.run_timeout_s == 7
    assert app_module.trust_policy(app_module.parse_args([], environ={}), environ={}).run_timeout_s is None


def test_every_flag_has_an_environment_variable():
    env = {"ALI_BACKEND": "scripted", "ALI_CONCURRENCY_LIMIT": "3", "ALI_ENABLE_CODE_TOOLS": "1", "ALI_SERVER_URL": "http://a,http://b",
           "ALI_MAX_UPLOAD_MB": "5", "ALI_PORT": "7999", "ALI_NO_MODEL": "true"}
    a = app_module.parse_args([], environ=env)
    assert (a.backend, a.concurrency_limit, a.enable_code_tools, a.server_url, a.max_upload_mb, a.port, a.no_model) == (
        "scripted", 3, True, ["http://a", "http://b"], 5.0, 7999, True)
    assert app_module.parse_args(["--concurrency-limit", "9"], environ=env).concurrency_limit == 9  # the flag wins
    with pytest.raises(SystemExit):
        app_module.parse_args([], environ={"ALI_CONCURRENCY_LIMIT": "many"})
    # every option but --public/--local (ALI_MODE) names its variable in --help
    for flags, var, *_ in app_module.OPTIONS:
        assert var or flags[0] in ("--public", "--local")


# ---- what visitor input may name -----------------------------------------------------------------


def test_public_tokenizer_names_only_profiles_and_the_operators(canaries):
    folder, _ = canaries
    pol = TrustPolicy(Mode.PUBLIC, "t", operator_tokenizers=("Org/The-Model",))
    assert pol.tokenizer("qwen3") == "qwen3" and pol.tokenizer("Org/The-Model") == "Org/The-Model"
    for bad in ("openai-community/gpt2", str(folder / "tokdir"), "/etc", "https://example.com/tok", "../../x"):
        with pytest.raises(VisitorInputError, match="hub ids and paths are not loaded"):
            pol.tokenizer(bad)
    assert LOCAL.tokenizer(str(folder / "tokdir")) == str(folder / "tokdir")


def test_public_template_is_a_trl_name_or_jinja_and_says_the_same_for_any_path(canaries):
    folder, _ = canaries
    assert PUBLIC.template("qwen3").kind == "trl" and PUBLIC.template("qwen3.jinja").trusted
    assert PUBLIC.template("{{ 1 }}").kind == "inline" and not PUBLIC.template("{{ 1 }}").trusted
    messages = set()
    for path in (str(folder / "canary.jinja"), str(folder / "no-such-file.jinja"), "/etc/passwd", "/etc/no-such-file",
                 str(folder / "qwen3"), "/proc/self/environ"):
        with pytest.raises(VisitorInputError) as e:
            PUBLIC.template(path)
        messages.add(str(e.value))
    assert len(messages) == 1, f"the answer must not depend on whether the path exists: {messages}"
    assert LOCAL.template(str(folder / "canary.jinja")).kind == "file"


def test_a_file_named_like_a_trl_template_is_never_trusted(canaries, monkeypatch):
    """Trust comes from where the template was read: a file called ``qwen3`` in the working
    directory does not shadow trl's template, and read by its path it is untrusted (guarded)."""
    folder, secret = canaries
    monkeypatch.chdir(folder)
    b = load_tokenizer("qwen3")
    by_name = b.with_template("qwen3")
    assert by_name.chat_template == read_trl_template("qwen3") and not by_name.untrusted_template
    by_path = b.with_template(str(folder / "qwen3"))
    assert secret in by_path.chat_template and by_path.untrusted_template
    with pytest.raises(Exception, match="files are not read here"):
        b.with_template(str(folder / "qwen3x"), allow_files=False)


def _ctx(trust: TrustPolicy, **kw) -> AppContext:
    return AppContext(trust=trust, **kw)


def test_template_lab_in_public_mode_reads_no_file_and_loads_no_folder(canaries):
    folder, secret = canaries
    ctx = _ctx(PUBLIC)
    msgs = [{"role": "user", "content": "hi"}]
    outs = []
    for tok, tpl, custom in [
        ("qwen3", template_lab.CUSTOM, str(folder / "canary.jinja")),
        ("qwen3", template_lab.CUSTOM, str(folder / "qwen3")),
        ("qwen3", str(folder / "canary.jinja"), ""),
        ("qwen3", "/proc/self/environ", ""),
        (str(folder / "tokdir"), template_lab.OWN, ""),
        ("openai-community/gpt2", template_lab.OWN, ""),
    ]:
        summary, text, toks, r = template_lab.render_one(ctx, tok, tpl, custom, msgs, [], False, {}, "t")
        outs.append(summary + text + toks)
        assert r is None and "ali-err" in summary
    assert not any(secret in o for o in outs)
    # inline Jinja still renders, in the guarded worker
    summary, text, _, r = template_lab.render_one(ctx, "qwen3", template_lab.CUSTOM, "X{{ messages[0].content }}Y", msgs, [],
                                                   False, {}, "t")
    assert r is not None and "XhiY" in r.text


def test_template_lab_in_local_mode_still_reads_a_typed_file(canaries):
    folder, secret = canaries
    summary, text, _, r = template_lab.render_one(_ctx(LOCAL), "qwen3", template_lab.CUSTOM, str(folder / "canary.jinja"),
                                                   [{"role": "user", "content": "hi"}], [], False, {}, "t")
    assert r is not None and secret in r.text


def test_a_trace_file_cannot_make_a_public_server_load_a_folder_or_a_template_path(canaries):
    """A trace's tokenizer and template names come from a file: visitor input too."""
    folder, secret = canaries
    base = load_tokenizer("qwen3")
    t = Trace(messages=[{"role": "user", "content": "x"}], prompt_ids=[9707, 1879])
    t = t.model_copy(update={"tokenizer": t.tokenizer.model_copy(update={
        "name": str(folder / "tokdir"), "template": str(folder / "canary.jinja"), "template_sha256": "0" * 64})})
    bundle, note = _ctx(PUBLIC).trace_bundle(t)
    assert bundle is None and "not available offline" in note
    t2 = t.model_copy(update={"tokenizer": t.tokenizer.model_copy(update={"name": "qwen3"})})
    bundle, _ = _ctx(PUBLIC).trace_bundle(t2)
    assert bundle is not None and secret not in bundle.chat_template and bundle.chat_template == base.chat_template


def test_tokenizer_cache_is_bounded():
    ctx = _ctx(PUBLIC)
    for i in range(ctx.tokenizers.max_entries + 20):
        ctx.visitor_bundle("qwen3", "{{ '%d' }}" % i + "x" * 300)
    assert len(ctx.tokenizers) <= ctx.tokenizers.max_entries


# ---- numbers, scripts, run time limit ------------------------------------------------------------


@pytest.mark.parametrize("kw, needle", [
    (dict(token_delay=1e9), "delay per token"),
    (dict(script=json.dumps([{"text": "hi", "token_delay_s": 1e9}])), "over this server's limit"),
    (dict(script=json.dumps([{"text": "hi", "token_delay_s": "slow"}])), "token_delay_s must be a number"),
    (dict(max_tokens=10**9), "max_tokens per turn must be between"),
    (dict(response_length=10**9), "response_length must be between"),
    (dict(max_parallel_calls=10**6), "max_parallel_calls must be between"),
    (dict(tool_timeout_s=1e9), "tool_timeout_s must be between"),
    (dict(max_assistant_turns=10**6), "max_assistant_turns must be between"),
    (dict(temperature=float("nan")), "finite"),
    (dict(system="x" * 3_000_000), "characters; this server accepts at most"),
])
async def test_numbers_and_sizes_beyond_the_ui_ranges_are_refused(kw, needle):
    ctx = _ctx(PUBLIC)
    with pytest.raises(UserError, match=needle):
        await run_all(ctx, fresh(ctx), "hi", settings(**kw))


def test_widgets_offer_the_ranges_the_server_checks():
    import ui

    demo = ui.build_app(_ctx(PUBLIC))
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    for elem, key in [("pg-max-tokens", "max_tokens"), ("pg-response-length", "response_length"), ("pg-delay", "token_delay"),
                      ("pg-parallel", "max_parallel_calls"), ("pg-tool-timeout", "tool_timeout_s")]:
        assert by_id[elem].maximum == RANGES[key].hi, elem
    assert by_id["pg-tokenizer"].allow_custom_value is False and by_id["labA-tok"].allow_custom_value is False


def test_check_script_bounds_entry_delays():
    assert check_script([{"text": "a", "token_delay_s": 0.5}], max_token_delay_s=0.5)
    with pytest.raises(ScriptError):
        check_script([{"text": "a", "token_delay_s": float("inf")}])
    with pytest.raises(ScriptError):
        check_script([])


async def test_engine_time_limit_ends_the_run_and_keeps_what_was_generated():
    b = load_tokenizer("qwen3")
    gen = ScriptedGenerator(b.tokenizer, ["one two three four five six seven eight nine ten " * 20], token_delay_s=0.01)
    loop = AgentLoop(gen, b, config=LoopConfig())
    t = await loop.run([{"role": "user", "content": "hi"}], time_limit_s=0.3)
    assert t.termination_reason == TerminationReason.TIME_LIMIT
    assert 0 < len(t.response_ids) < len(b.tokenizer.encode("one two three four five six seven eight nine ten " * 20))
    assert t.response_mask == [1] * len(t.response_ids) and t.steps[-1].state == "terminated"
    # a user's cancel is still a cancel, with the limit set
    gen = ScriptedGenerator(b.tokenizer, ["a b c d e f g " * 40], token_delay_s=0.01)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, cancel.set)
    t = await AgentLoop(gen, b, config=LoopConfig()).run([{"role": "user", "content": "hi"}], cancel=cancel, time_limit_s=60)
    assert t.termination_reason == "cancelled"


async def test_playground_run_stops_at_the_servers_time_limit():
    ctx = _ctx(TrustPolicy(Mode.PUBLIC, "t", run_timeout_s=0.5))
    out = await run_all(ctx, fresh(ctx), "hi", settings(script=json.dumps(["word " * 400]), tools="[]", token_delay=0.02))
    trace, status = out[-1][2], out[-1][1]
    assert trace.termination_reason == TerminationReason.TIME_LIMIT and "stops a run after 0.5 s" in status


async def test_model_backend_template_override_is_checked_too(canaries):
    """With a model backend the template override goes through the same policy."""
    folder, _ = canaries
    ctx = _ctx(PUBLIC, model=ModelService(ModelOptions(backend="vllm-server", server_urls=[])))
    with pytest.raises(UserError):
        await run_all(ctx, fresh(ctx), "hi", settings(backend="vllm-server", template=str(folder / "canary.jinja")))


def test_inspector_decode_with_a_path_loads_nothing(canaries):
    folder, _ = canaries
    ctx = _ctx(PUBLIC)
    from ui.context import load_samples

    samples, _ = load_samples()
    ctx.samples = samples
    sess = new_session(ctx)
    out = inspector.show_trace(ctx, sess, samples[0][0], str(folder / "tokdir"))
    assert "not available offline" in json.dumps(out, default=str)
    assert not os.path.exists(os.path.join(folder, "tokdir", "tokenizer.json"))
