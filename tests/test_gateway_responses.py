"""The capture gateway's Responses dialect (``POST /v1/responses``), driven by clients we did not
write: the ``openai`` SDK's ``client.responses`` (plain, ``create(stream=True)`` and the
``responses.stream`` helper with its final-response accumulation) and ``openai-agents``' Runner
with its Responses model, against a scripted model on qwen3, qwen3.5 and llama3.

The harness feeds back the SDK's own output items (``response.output``) and
``function_call_output`` items, as a Responses harness does. Each session must stay one branch,
equal id for id and mask bit for mask bit to verl 0.9.1's Continuous Token builder fed the
conversation (written here in chat form from the items the harness sent) and the generated ids.
The input mapping itself is checked against vLLM's own (``construct_input_messages``).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from gateway_support import generated_ids, read_capture, scripted_gateway, serving, verl_session
from test_families import ANSWER, CALL, answer_text, call_text
from test_gateway import CALL_ZURICH, FOLLOW_UP, SCHEMAS, script_for, tool_result
from test_gateway_clients import branch_equals_verl
from verl_oracle import VERL_FAMILY

from backend.gateway import responses
from backend.gateway.core import GatewayError, GatewayLimits
from backend.loading.tokenizers import load_tokenizer

PROFILES = ["qwen3", "qwen3.5", "llama3"]
INSTRUCTIONS = "You are a weather assistant."
QUESTION = "What's the weather in Seattle?"
# the chat tests' tool as a Responses function tool (flat, with strict as the SDKs send it)
TOOLS = [{"type": "function", "name": s["function"]["name"], "description": s["function"]["description"],
          "parameters": s["function"]["parameters"], "strict": False} for s in SCHEMAS]


@pytest.fixture(scope="module", params=PROFILES)
def family(request):
    return request.param, load_tokenizer(request.param)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def qwen35():
    return load_tokenizer("qwen3.5")


def ask(client, items, mode: str, **kw):
    """One turn through the SDK: the ``Response`` as the client holds it at the end."""
    args = {"model": "weather-model", "instructions": INSTRUCTIONS, "input": items, "tools": TOOLS, **kw}
    if mode == "plain":
        return client.responses.create(**args)
    if mode == "create_stream":
        events = list(client.responses.create(stream=True, **args))
        numbers = [e.sequence_number for e in events]
        assert numbers == list(range(len(events)))
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type in ("response.completed", "response.incomplete")
        added = [e for e in events if e.type == "response.output_item.added"]
        done = [e for e in events if e.type == "response.output_item.done"]
        assert [e.output_index for e in added] == [e.output_index for e in done] == list(range(len(done)))
        final = events[-1].response
        assert [i.id for i in final.output] == [e.item.id for e in done]
        return final
    with client.responses.stream(**args) as s:
        for _ in s:
            pass
        return s.get_final_response()


def chat_form(items: list, instructions: str | None = None) -> list[dict]:
    """The conversation the harness sent, written out here in Hugging Face chat form for the
    oracle: each echoed output turn (reasoning, message, calls) one assistant message, call
    arguments decoded, each function_call_output a tool message."""
    out = [{"role": "system", "content": instructions}] if instructions else []
    turn: dict | None = None
    for it in items:
        it = it if isinstance(it, dict) else it.model_dump()
        kind = it.get("type", "message")
        if kind == "message" and it["role"] != "assistant":
            out.append({"role": it["role"], "content": it["content"]})
            turn = None
            continue
        if kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
            turn = None
            continue
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
        if kind == "reasoning":
            turn["reasoning_content"] = it["content"][0]["text"]
        elif kind == "message":
            turn["content"] = it["content"][0]["text"]
        else:
            turn.setdefault("tool_calls", []).append({"id": it["call_id"], "type": "function", "function": {
                "name": it["name"], "arguments": json.loads(it["arguments"])}})
    return out


def call_output(call) -> dict:
    return {"type": "function_call_output", "call_id": call.call_id, "output": tool_result(call.arguments)}


@pytest.mark.parametrize("mode", ["plain", "create_stream", "stream_helper"])
def test_openai_sdk_responses_session_equals_verls_builder(family, mode, tmp_path):
    """Two rounds of calls, an answer, a follow-up question and its answer through
    ``client.responses``, the harness sending back ``response.output`` and its call outputs: one
    branch, equal to verl's builder fed the same conversation and generated ids."""
    profile, bundle = family
    script = script_for(profile, bundle)
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/linear/v1", api_key="not-a-key", max_retries=0)
        items: list = [{"role": "user", "content": QUESTION}]
        first = chat_form(items, INSTRUCTIONS)
        turns = []
        for expect in ("Seattle", "Zürich"):
            r = ask(client, items, mode)
            assert r.status == "completed" and r.id.startswith("resp_") and r.object == "response"
            (call,) = [o for o in r.output if o.type == "function_call"]
            assert call.name == CALL["name"] and json.loads(call.arguments) == {"city": expect}
            assert call.status == "completed" and call.id.startswith("fc_") and call.call_id
            assert [o.type for o in r.output] == (["reasoning"] if profile == "qwen3.5" else []) + ["function_call"]
            assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
            assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
            new = [*r.output, call_output(call)]
            turns.append(new)
            items = [*items, *new]
        r = ask(client, items, mode)
        assert r.output_text == ANSWER and not [o for o in r.output if o.type == "function_call"]
        (msg,) = [o for o in r.output if o.type == "message"]
        assert msg.content[0].annotations == [] and msg.status == "completed"
        follow = {"role": "user", "content": FOLLOW_UP}
        turns.append([*r.output, follow])
        items = [*items, *r.output, follow]
        r = ask(client, items, mode)
        assert r.output_text == ANSWER and r.status == "completed"
    (branch,) = read_capture(tmp_path, "linear")
    assert branch["metadata"]["branch"] == {"id": "b0", "parent": None, "fork_at": None, "cause": None}
    assert branch["metadata"]["dialects"] == ["responses"] and branch["termination_reason"] == "no_tool_calls"
    gen_steps = [s for s in branch["steps"] if s["state"] == "generating"]
    ids = branch["prompt_ids"] + branch["response_ids"]
    outputs = [generated_ids(bundle, text) for text in script]
    assert [ids[s["start"]:s["end"]] for s in gen_steps] == outputs
    verl_turns = [(out, chat_form(new)) for out, new in zip(outputs, [*turns, []])]
    chat_tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}} for t in TOOLS]
    prompt, response, mask = verl_session(bundle, VERL_FAMILY[profile], first, chat_tools, verl_turns)
    assert branch["prompt_ids"] == prompt
    assert branch["response_ids"] == response
    assert branch["response_mask"] == mask


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("profile", PROFILES)
def test_agents_sdk_runner_responses_model(profile, streamed, tmp_path):
    """The Agents SDK's Runner on its Responses model (the SDK's default), two rounds of calls and an
    answer: it finishes, and the session is one branch equal to verl's builder (on qwen3.5 the
    Runner sends the model's reasoning items back too)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    bundle = load_tokenizer(profile)
    seen: list[str] = []

    @function_tool
    def get_current_temperature(city: str) -> str:
        """Get current temperature at a location.

        Args:
            city: The location to get the temperature for.
        """
        seen.append(city)
        return json.dumps({"temperature": 72, "city": city})

    script = [call_text(profile, bundle, [CALL]), call_text(profile, bundle, [CALL_ZURICH]), answer_text(profile)]
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        async def main():
            client = openai.AsyncOpenAI(base_url=f"{url}/s/agents/v1", api_key="k", max_retries=0)
            agent = Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_current_temperature],
                          model=OpenAIResponsesModel(model="weather-model", openai_client=client),
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
    assert all(g["info"]["gateway"]["dialect"] == "responses" for g in gens)
    branch_equals_verl(bundle, profile, branch, [generated_ids(bundle, t) for t in script])


def test_text_and_parallel_calls_echoed_are_one_turn(qwen3, tmp_path):
    """A turn with text and two calls comes back as a message item and two function_call items
    (then both outputs): one assistant message again, the branch extended, equal to verl's builder."""
    script = ["Let me check both.\n" + call_text("qwen3", qwen3, [CALL, CALL_ZURICH]), ANSWER]
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/par/v1", api_key="k", max_retries=0)
        items: list = [{"role": "user", "content": "Seattle and Zürich?"}]
        r = client.responses.create(model="m", input=items, tools=TOOLS, parallel_tool_calls=True)
        assert [o.type for o in r.output] == ["message", "function_call", "function_call"]
        assert r.output[0].content[0].text.strip() == "Let me check both." and r.parallel_tool_calls is True
        items = [*items, *r.output, *(call_output(c) for c in r.output[1:])]
        assert client.responses.create(model="m", input=items, tools=TOOLS).output_text == ANSWER
    (branch,) = read_capture(tmp_path, "par")
    assert branch["metadata"]["branch"]["cause"] is None
    turn = branch["messages"][1]
    assert [c["function"]["arguments"]["city"] for c in turn["tool_calls"]] == ["Seattle", "Zürich"]
    branch_equals_verl(qwen3, "qwen3", branch, [generated_ids(qwen3, t) for t in script])


@pytest.mark.parametrize("how", ["omitted", "encrypted_only"])
def test_reasoning_the_harness_drops_follows_the_chat_policy(qwen35, how, tmp_path):
    """qwen3.5's template renders the reasoning of turns after the last user message and drops it
    before. A harness that leaves the reasoning items out (or sends them with encrypted_content
    only, which nothing here can read) forks in the first case, and extends the branch in the second."""
    bundle = qwen35
    script = [call_text("qwen3.5", bundle, [CALL]), answer_text("qwen3.5"), answer_text("qwen3.5")]

    def without_reasoning(output) -> list:
        if how == "omitted":
            return [o for o in output if o.type != "reasoning"]
        return [{"type": "reasoning", "id": o.id, "summary": [], "encrypted_content": "gAAAAB-opaque"}
                if o.type == "reasoning" else o for o in output]

    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/think/v1", api_key="k", max_retries=0)
        user = {"role": "user", "content": QUESTION}
        r = client.responses.create(model="m", input=[user], tools=TOOLS)
        assert r.output[0].type == "reasoning" and r.output[0].content[0].text.strip() == "I should look it up."
        (call,) = [o for o in r.output if o.type == "function_call"]
        items = [user, *without_reasoning(r.output), call_output(call)]
        a = client.responses.create(model="m", input=items, tools=TOOLS)
        assert a.output_text == ANSWER
        assert [b["metadata"]["branch"]["cause"] for b in read_capture(tmp_path, "think")] == [None, "reasoning_dropped"]
        # the answer's reasoning, dropped too, sits before the next user message: the template drops it as well
        items = [*items, *without_reasoning(a.output), {"role": "user", "content": FOLLOW_UP}]
        assert client.responses.create(model="m", input=items, tools=TOOLS).output_text == ANSWER
    branches = read_capture(tmp_path, "think")
    assert len(branches) == 2, [b["metadata"]["branch"] for b in branches]
    fork = branches[1]
    assert [s["state"] for s in fork["steps"]] == ["pending", "generating", "processing_tools", "generating", "terminated"]
    assert fork["response_mask"].count(1) == 2 * len(generated_ids(bundle, answer_text("qwen3.5")))


def test_a_turn_cut_by_max_output_tokens_is_incomplete(qwen3, tmp_path):
    """max_output_tokens bounds the turn: the response is incomplete (reason max_output_tokens), in
    the plain answer and as the stream's last event."""
    with serving(scripted_gateway(qwen3, [ANSWER, ANSWER], tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/cut/v1", api_key="k", max_retries=0)
        r = client.responses.create(model="m", input=QUESTION, max_output_tokens=3)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == 3 and r.max_output_tokens == 3 and r.output[0].status == "incomplete"
        events = list(client.responses.create(model="m", input="Another question?", max_output_tokens=3, stream=True))
        assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"
    gens = [s for b in read_capture(tmp_path, "cut") for s in b["steps"] if s["state"] == "generating"]
    assert [g["info"]["max_tokens"] for g in gens] == [3, 3]


def test_a_retried_body_gets_the_same_response(qwen3, tmp_path):
    script = [call_text("qwen3", qwen3, [CALL]), ANSWER]
    body = json.dumps({"model": "m", "input": QUESTION, "tools": TOOLS}).encode()
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url, httpx.Client(base_url=url) as h:
        first = h.post("/s/retry/v1/responses", content=body, headers={"content-type": "application/json"})
        again = h.post("/s/retry/v1/responses", content=body, headers={"content-type": "application/json"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["x-ali-replayed"] == "true"
    (branch,) = read_capture(tmp_path, "retry")
    assert [s["state"] for s in branch["steps"]].count("generating") == 1


USER = {"role": "user", "content": QUESTION}
BAD = [
    ("not json", b"{nope", 400, None),
    ("not an object", b'["hi"]', 400, None),
    ("no input", {"model": "m"}, 400, "input"),
    ("input a number", {"model": "m", "input": 7}, 400, "input"),
    ("input an empty list", {"model": "m", "input": []}, 400, "input"),
    ("input item not an object", {"model": "m", "input": ["hi"]}, 400, "input"),
    ("unknown item type", {"model": "m", "input": [USER, {"type": "web_search_call", "id": "ws_1", "status": "completed"}]},
     400, "input"),
    ("item_reference", {"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input"),
    ("item without type or role", {"model": "m", "input": [{"content": "hi"}]}, 400, "input"),
    ("bad role", {"model": "m", "input": [{"role": "tool", "content": "hi"}]}, 400, "input"),
    ("function_call_output without call_id", {"model": "m", "input": [USER, {"type": "function_call_output",
                                                                             "output": "72"}]}, 400, "input"),
    ("function_call without name", {"model": "m", "input": [USER, {"type": "function_call", "call_id": "c1",
                                                                   "arguments": "{}"}]}, 400, "input"),
    ("function_call arguments an object", {"model": "m", "input": [USER, {"type": "function_call", "call_id": "c1",
                                                                          "name": "f", "arguments": {"a": 1}}]}, 400, "input"),
    ("a non-function tool", {"model": "m", "input": QUESTION, "tools": [{"type": "web_search"}]}, 400, "tools"),
    ("a tool without a name", {"model": "m", "input": QUESTION, "tools": [{"type": "function", "parameters": {}}]},
     400, "tools"),
    ("a chat-style tool", {"model": "m", "input": QUESTION, "tools": SCHEMAS}, 400, "tools"),
    ("text.format json_schema", {"model": "m", "input": QUESTION, "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "object"}}}}, 400, "text.format"),
    ("previous_response_id", {"model": "m", "input": QUESTION, "previous_response_id": "resp_123"}, 400,
     "previous_response_id"),
    ("conversation", {"model": "m", "input": QUESTION, "conversation": "conv_1"}, 400, "conversation"),
    ("background", {"model": "m", "input": QUESTION, "background": True}, 400, "background"),
    ("n > 1", {"model": "m", "input": QUESTION, "n": 2}, 400, "n"),
    ("temperature out of range", {"model": "m", "input": QUESTION, "temperature": -0.5}, 400, "temperature"),
    ("top_p 0", {"model": "m", "input": QUESTION, "top_p": 0}, 400, "top_p"),
    ("max_output_tokens 0", {"model": "m", "input": QUESTION, "max_output_tokens": 0}, 400, "max_output_tokens"),
    ("instructions a list", {"model": "m", "input": QUESTION, "instructions": [USER]}, 400, "instructions"),
    ("an image part", {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://169.254.169.254/x.png"}]}]}, 400, "input"),
    ("a file part", {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_file", "file_url": "http://169.254.169.254/x.pdf"}]}]}, 400, "input"),
    ("bad tool_choice", {"model": "m", "input": QUESTION, "tools": TOOLS, "tool_choice": {"type": "web_search"}}, 400,
     "tool_choice"),
    ("tool_choice names an unknown tool", {"model": "m", "input": QUESTION, "tools": TOOLS,
                                           "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
    ("stream not a boolean", {"model": "m", "input": QUESTION, "stream": "yes"}, 400, "stream"),
    ("lone surrogate", b'{"model": "m", "input": "a\\ud800b"}', 400, None),
    ("body over the limit", {"model": "m", "input": "x" * 300_000}, 413, None),
]


def test_bad_requests_are_refused_in_openais_shape_and_the_next_call_works(qwen3, tmp_path):
    gw = scripted_gateway(qwen3, [ANSWER], tmp_path, limits=GatewayLimits(max_body_bytes=200_000))
    with serving(gw, key="gw-key") as url, httpx.Client(base_url=url, timeout=30) as h:
        auth = {"authorization": "Bearer gw-key", "content-type": "application/json"}

        def good(k: int) -> None:
            r = h.post(f"/s/good{k}/v1/responses", headers=auth, json={"model": "m", "input": QUESTION})
            assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == ANSWER

        for k, (what, body, status, param) in enumerate(BAD):
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = h.post("/s/bad/v1/responses", headers=auth, content=raw)
            assert r.status_code == status, (what, r.text)
            err = r.json()["error"]
            assert err["message"] and err["type"] and err["code"] == status and "Traceback" not in r.text, what
            if param is not None:
                assert err["param"] == param, (what, err)
            good(k)
        r = h.post("/v1/responses", json={"model": "m", "input": QUESTION})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = h.get("/v1/responses/resp_123", headers=auth)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        good(len(BAD))
    assert not (tmp_path / "bad.jsonl").exists()
    msg = {what: m for what, m in [(w, _refusal(b)) for w, b, _, _ in BAD if isinstance(b, dict)]}
    assert "send the whole conversation as input" in msg["previous_response_id"]
    assert "web_search" in msg["a non-function tool"] and "never fetched" in msg["an image part"]


def _refusal(body: dict) -> str:
    try:
        responses.parse_request(body, "m")
    except GatewayError as e:
        return str(e)
    return ""


# ---- the input mapping, against vLLM's own ------------------------------------------------------

ECHOED_TURN = [
    {"role": "user", "content": QUESTION},
    {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed",
     "content": [{"type": "reasoning_text", "text": "I should look it up."}]},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_current_temperature",
     "arguments": '{"city": "Seattle"}', "status": "completed"},
    {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "get_current_temperature",
     "arguments": '{"city": "Zürich"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_a", "output": "72"},
    {"type": "function_call_output", "call_id": "call_b", "output": "60"},
    {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Both known."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]},
    {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}, {"type": "input_text", "text": "Cite."}]},
    {"type": "message", "role": "user", "content": FOLLOW_UP},
    {"type": "function_call", "call_id": "call_c", "name": "get_current_temperature", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_c", "output": [{"type": "input_text", "text": "55"}]},
    {"role": "assistant", "content": "Plain."},
]


def _as_chat(m: dict) -> dict:
    """vLLM's message in the chat form this gateway records: ``reasoning`` as ``reasoning_content``,
    no content as "", text parts joined with newlines (as vLLM's chat parser joins them),
    developer as system, call arguments decoded."""
    out: dict = {"role": "system" if m["role"] == "developer" else m["role"]}
    content = m.get("content")
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content)
    out["content"] = content or ""
    if m.get("reasoning") is not None:
        out["reasoning_content"] = m["reasoning"]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}} for c in m["tool_calls"]]
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    return out


def test_input_items_map_as_vllms_responses_server_maps_them():
    """The request's items become the messages vLLM's Responses server builds from them
    (``construct_input_messages`` on its parsed request): an echoed turn's reasoning, message and
    calls one assistant message, call outputs tool messages in order, instructions first."""
    pytest.importorskip("vllm", reason="vLLM is not installed: the parity test needs its Responses server")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    body = {"model": "m", "instructions": INSTRUCTIONS, "input": ECHOED_TURN, "tools": TOOLS}
    req, _ = responses.parse_request(json.loads(json.dumps(body)), "m")
    vreq = ResponsesRequest(**json.loads(json.dumps(body)))
    theirs = construct_input_messages(request_instructions=vreq.instructions, request_input=vreq.input)
    assert req.messages == [_as_chat(dict(m)) for m in theirs]
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "system",
                                                 "user", "assistant", "tool", "assistant"]
    # tools: the chat form vLLM renders (strict is an API option, not shown to the model)
    assert req.tools == [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
                         for t in TOOLS]
    # a string input is one user message
    req, _ = responses.parse_request({"input": "Hi", "instructions": "Sys"}, "m")
    vreq = ResponsesRequest(model="m", input="Hi", instructions="Sys")
    assert req.messages == [_as_chat(dict(m)) for m in construct_input_messages(
        request_instructions=vreq.instructions, request_input=vreq.input)]
