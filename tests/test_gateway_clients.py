"""The capture gateway driven by agent harnesses we did not write: ``openai-agents``' Runner with its
Chat Completions model (plain and streamed), smolagents' ``ToolCallingAgent`` with
``OpenAIServerModel``, and ``python -m backend gateway`` as a process.

Each run must finish as the harness expects; each captured branch must equal verl 0.9.1's builder
for the messages the harness sent (as the capture records them) and the ids the model generated;
where a harness rewrites the model's turns in the history it sends (smolagents), every fork names
its cause and holds no re-rendered id at mask 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from gateway_support import generated_ids, read_capture, scripted_gateway, serving, verl_session
from test_families import ANSWER, CALL, REASONING_OPEN, answer_text, call_text
from test_gateway import CALL_ZURICH
from verl_oracle import VERL_FAMILY

from backend.gateway.core import FORK_CAUSES
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = ["qwen3", "qwen3.5", "llama3"]


def branch_equals_verl(bundle, profile: str, branch: dict, outputs: list[list[int]], family: str | None = None) -> None:
    """``branch`` (one linear branch) against verl's builder (``family``, else the profile's) fed its
    messages as captured and ``outputs``."""
    steps = branch["steps"]
    first = [branch["messages"][i] for i in steps[0]["messages_added"]]
    gen = [k for k, s in enumerate(steps) if s["state"] == "generating"]
    ids = branch["prompt_ids"] + branch["response_ids"]
    assert [ids[steps[k]["start"]:steps[k]["end"]] for k in gen] == outputs
    turns = []
    for k in gen:
        (assistant,) = [branch["messages"][i] for i in steps[k]["messages_added"]]
        nxt = steps[k + 1] if steps[k + 1]["state"] == "processing_tools" else None
        added = [branch["messages"][i] for i in nxt["messages_added"]] if nxt else []
        turns.append((ids[steps[k]["start"]:steps[k]["end"]], [assistant, *added] if added else []))
    prompt, response, mask = verl_session(bundle, family or VERL_FAMILY[profile], first, branch["tools"], turns)
    assert (branch["prompt_ids"], branch["response_ids"], branch["response_mask"]) == (prompt, response, mask)


def run_chat_agent(url: str, streamed: bool, **model_kw) -> tuple[str, list[str]]:
    """The Agents SDK's Runner on its Chat Completions model against ``url``'s session ``agents``,
    asked for two cities: its final output and the cities its tool was called with."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_current_temperature(city: str) -> str:
        """Get current temperature at a location.

        Args:
            city: The location to get the temperature for.
        """
        seen.append(city)
        return json.dumps({"temperature": 72, "city": city})

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{url}/s/agents/v1", api_key="k", max_retries=0)
        agent = Agent(name="weather", instructions="You are a weather assistant.", tools=[get_current_temperature],
                      model=OpenAIChatCompletionsModel(model="weather-model", openai_client=client, **model_kw),
                      model_settings=ModelSettings(temperature=0.7))
        if streamed:
            run = Runner.run_streamed(agent, "What's the weather in Seattle, then Zürich?")
            async for _ in run.stream_events():
                pass
            return run.final_output
        return (await Runner.run(agent, "What's the weather in Seattle, then Zürich?")).final_output

    return asyncio.run(main()), seen


def replay_reasoning(_context) -> bool:
    """The Agents SDK's ``should_replay_reasoning_content`` hook, answering yes: send every
    reasoning item back as the next request's ``reasoning_content``."""
    return True


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("profile", PROFILES)
def test_agents_sdk_runner_chat_completions_model(profile, streamed, tmp_path):
    """The Agents SDK's Runner, two rounds of calls and an answer, on its Chat Completions model:
    one linear branch, equal to verl's builder. On qwen3.5 the harness sends the model's reasoning
    back (the SDK's ``should_replay_reasoning_content`` hook; by default it does so only for
    DeepSeek models, next test)."""
    bundle = load_tokenizer(profile)
    script = [call_text(profile, bundle, [CALL]), call_text(profile, bundle, [CALL_ZURICH]), answer_text(profile)]
    model_kw = {"should_replay_reasoning_content": replay_reasoning} if profile == "qwen3.5" else {}
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        final, seen = run_chat_agent(url, streamed, **model_kw)
    assert final == ANSWER and seen == ["Seattle", "Zürich"]
    (branch,) = read_capture(tmp_path, "agents")
    assert branch["metadata"]["branch"]["cause"] is None and branch["termination_reason"] == "no_tool_calls"
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert [g["info"]["gateway"]["sampling"]["temperature"] for g in gens] == [0.7] * 3
    assert all(g["info"]["gateway"]["dialect"] == "chat" for g in gens)
    if profile == "qwen3.5":  # the reasoning came back and is in the branch's messages
        assert [m.get("reasoning_content") for m in branch["messages"] if m["role"] == "assistant"][:2] == [
            "I should look it up."] * 2
    branch_equals_verl(bundle, profile, branch, [generated_ids(bundle, t) for t in script])


def forked_session_equals_verl(bundle, profile: str, branches: list[dict], outputs: list[list[int]] | None,
                               causes: set[str], family: str | None = None) -> list[list[int]]:
    """A session the harness made fork: the root has no parent; every fork names a cause in
    ``causes`` and where it departs; nothing re-rendered is at mask 1; each sampled turn is at
    mask 1 in exactly one branch, in order; and every branch (linear from its fork) equals verl's
    builder fed its own messages as captured and its own generated ids. ``outputs`` None: the
    sampled turns are not known beforehand (a real engine); they are returned."""
    assert branches[0]["metadata"]["branch"]["parent"] is None
    ids_of = {b["metadata"]["branch"]["id"] for b in branches}
    sampled = []
    for b in branches:
        meta = b["metadata"]["branch"]
        if meta["parent"] is not None:
            assert meta["cause"] in FORK_CAUSES and meta["cause"] in causes, meta
            assert meta["parent"] in ids_of and isinstance(meta["fork_at"], int)
        gens = [s for s in b["steps"] if s["state"] == "generating"]
        ones = sum(s["end"] - s["start"] for s in gens)
        assert b["response_mask"].count(1) == ones  # nothing re-rendered is at mask 1
        ids = b["prompt_ids"] + b["response_ids"]
        own = [ids[s["start"]:s["end"]] for s in gens]
        sampled += own
        branch_equals_verl(bundle, profile, b, own, family)
    if outputs is not None:
        assert sampled == outputs  # each sampled turn trained once, in one branch
    return sampled


def test_agents_sdk_chat_model_drops_reasoning_by_default(tmp_path):
    """By default the Agents SDK's Chat Completions model (0.24) sends no reasoning back (it
    replays ``reasoning_content`` for DeepSeek models only). qwen3.5's template shows the
    reasoning of the turns after the last user message, so each later request departs from what
    the model was shown: each forks, cause ``reasoning_dropped``, and each branch equals verl's
    builder for its own messages."""
    bundle = load_tokenizer("qwen3.5")
    script = [call_text("qwen3.5", bundle, [CALL]), call_text("qwen3.5", bundle, [CALL_ZURICH]), answer_text("qwen3.5")]
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        final, seen = run_chat_agent(url, False)
    assert final == ANSWER and seen == ["Seattle", "Zürich"]
    branches = read_capture(tmp_path, "agents")
    assert [b["metadata"]["branch"]["cause"] for b in branches] == [None, "reasoning_dropped", "reasoning_dropped"]
    assert not any(m.get("reasoning_content") for b in branches for m in b["messages"][:-1])
    forked_session_equals_verl(bundle, "qwen3.5", branches, [generated_ids(bundle, t) for t in script],
                               {"reasoning_dropped"})


def required_call_text(profile: str, bundle, calls: list[dict]) -> str:
    """A call turn as ``tool_choice: required`` lets the model write it: the calls only. On
    qwen3.5 the generation prompt opens ``<think>`` and the required grammar admits no reasoning
    before the calls (a known limit, docs/architecture.md), so the turn starts at the calls."""
    return call_text(profile, bundle, calls).removeprefix(REASONING_OPEN.get(profile, ""))


@pytest.mark.parametrize("profile", PROFILES)
def test_smolagents_tool_calling_agent(profile, tmp_path):
    """smolagents' ToolCallingAgent (tool_choice required, a final_answer tool) through
    OpenAIServerModel: the run answers; smolagents sends the model's turns back in its own words,
    so each later request forks, with a named cause and only its own sampled ids at mask 1, and
    each branch equals verl's builder for the messages smolagents sent."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    bundle = load_tokenizer(profile)

    @tool
    def get_current_temperature(city: str) -> str:
        """Get current temperature at a location.

        Args:
            city: The location to get the temperature for.
        """
        return json.dumps({"temperature": 72, "city": city})

    final = {"name": "final_answer", "arguments": {"answer": ANSWER}}
    script = [required_call_text(profile, bundle, [CALL]), required_call_text(profile, bundle, [final])]
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        model = OpenAIServerModel(model_id="weather-model", api_base=f"{url}/s/smol/v1", api_key="k")
        agent = ToolCallingAgent(tools=[get_current_temperature], model=model, max_steps=3, verbosity_level=0)
        out = agent.run("What's the weather in Seattle?")
    assert out == ANSWER
    branches = read_capture(tmp_path, "smol")
    assert len(branches) == 2 and branches[1]["metadata"]["branch"]["cause"] == "message_edited"
    forked_session_equals_verl(bundle, profile, branches, [generated_ids(bundle, t) for t in script],
                               {"message_edited"})


def test_gateway_command_serves_and_captures(tmp_path):
    """``python -m backend gateway`` as a process: it prints where it serves, answers the openai
    SDK, writes the capture, and a bad request does not stop it."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([ANSWER, ANSWER]))
    cap = tmp_path / "cap"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "backend", "gateway", "--port", "0", "--capture-dir", str(cap),
                             "--script", str(script), "--tokenizer", "qwen3", "--key", "k1"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            if line.startswith("gateway: serving "):
                url = line.split()[2]
        assert url, "the gateway did not say where it serves"
        r = httpx.post(f"{url}/chat/completions", content=b"{", headers={"authorization": "Bearer k1"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        client = openai.OpenAI(base_url=url.replace("/v1", "/s/cli/v1"), api_key="k1", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert r.choices[0].message.content == ANSWER
        (branch,) = read_capture(cap, "cli")
        assert branch["metadata"]["source"] == "gateway" and branch["response_mask"] == [1] * len(branch["response_ids"])
    finally:
        proc.terminate()
        proc.wait(30)
