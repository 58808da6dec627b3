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
from test_families import ANSWER, CALL, call_text
from test_gateway import CALL_ZURICH
from verl_oracle import VERL_FAMILY

from backend.gateway.core import FORK_CAUSES
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def branch_equals_verl(bundle, profile: str, branch: dict, outputs: list[list[int]]) -> None:
    """``branch`` (one linear branch) against verl's builder fed its messages as captured and ``outputs``."""
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
    prompt, response, mask = verl_session(bundle, VERL_FAMILY[profile], first, branch["tools"], turns)
    assert (branch["prompt_ids"], branch["response_ids"], branch["response_mask"]) == (prompt, response, mask)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_runner_chat_completions_model(qwen3, streamed, tmp_path):
    """The Agents SDK's Runner, two rounds of calls and an answer, on its Chat Completions model:
    one linear branch, equal to verl's builder."""
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

    script = [call_text("qwen3", qwen3, [CALL]), call_text("qwen3", qwen3, [CALL_ZURICH]), ANSWER]
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url:
        async def main():
            client = openai.AsyncOpenAI(base_url=f"{url}/s/agents/v1", api_key="k", max_retries=0)
            agent = Agent(name="weather", instructions="You are a weather assistant.", tools=[get_current_temperature],
                          model=OpenAIChatCompletionsModel(model="weather-model", openai_client=client),
                          model_settings=ModelSettings(temperature=0.7))
            if streamed:
                run = Runner.run_streamed(agent, "What's the weather in Seattle, then Zürich?")
                async for _ in run.stream_events():
                    pass
                return run.final_output
            return (await Runner.run(agent, "What's the weather in Seattle, then Zürich?")).final_output

        final = asyncio.run(main())
    assert final == ANSWER and seen == ["Seattle", "Zürich"]
    (branch,) = read_capture(tmp_path, "agents")
    assert branch["metadata"]["branch"]["cause"] is None and branch["termination_reason"] == "no_tool_calls"
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert [g["info"]["gateway"]["sampling"]["temperature"] for g in gens] == [0.7] * 3
    branch_equals_verl(qwen3, "qwen3", branch, [generated_ids(qwen3, t) for t in script])


def test_smolagents_tool_calling_agent(qwen3, tmp_path):
    """smolagents' ToolCallingAgent (tool_choice required, a final_answer tool) through
    OpenAIServerModel: the run answers; smolagents sends the model's turns back in its own words,
    so each later request forks, with a named cause and only its own sampled ids at mask 1."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def get_current_temperature(city: str) -> str:
        """Get current temperature at a location.

        Args:
            city: The location to get the temperature for.
        """
        return json.dumps({"temperature": 72, "city": city})

    final = {"name": "final_answer", "arguments": {"answer": ANSWER}}
    script = [call_text("qwen3", qwen3, [CALL]), call_text("qwen3", qwen3, [final])]
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url:
        model = OpenAIServerModel(model_id="weather-model", api_base=f"{url}/s/smol/v1", api_key="k")
        agent = ToolCallingAgent(tools=[get_current_temperature], model=model, max_steps=3, verbosity_level=0)
        out = agent.run("What's the weather in Seattle?")
    assert out == ANSWER
    branches = read_capture(tmp_path, "smol")
    assert branches[0]["metadata"]["branch"]["parent"] is None
    outputs = [generated_ids(qwen3, t) for t in script]
    sampled = []
    for b in branches:
        meta = b["metadata"]["branch"]
        if meta["parent"] is not None:
            assert meta["cause"] in FORK_CAUSES and isinstance(meta["fork_at"], int)
        gens = [s for s in b["steps"] if s["state"] == "generating"]
        ones = sum(s["end"] - s["start"] for s in gens)
        assert b["response_mask"].count(1) == ones  # nothing re-rendered is at mask 1
        ids = b["prompt_ids"] + b["response_ids"]
        sampled += [ids[s["start"]:s["end"]] for s in gens]
    assert sampled == outputs  # each sampled turn trained once, in one branch


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
