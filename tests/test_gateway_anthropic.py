"""The capture gateway's Anthropic Messages dialect, driven by the ``anthropic`` SDK (a client we did
not write) against a scripted model on qwen3, qwen3.5 and llama3.

A Claude-Code-style session: ``count_tokens`` first (equal to transformers' own render of the same
chat messages with the generation prompt), two rounds of ``tool_use`` / ``tool_result``, an answer,
a user follow-up and its answer, the harness echoing the SDK's own ``response.content`` blocks.
Each session is one branch, equal id for id and mask bit for mask bit to what verl 0.9.1's
Continuous Token builder of the family gives for the same messages and generated ids. Bad requests
are refused in Anthropic's error shape (the SDK raises its typed errors) and the next call works.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from gateway_support import generated_ids, read_capture, scripted_gateway, serving, verl_session
from test_families import ANSWER, CALL, answer_text, call_text
from test_gateway import CALL_ZURICH, FOLLOW_UP, PROFILES, SCHEMAS, tool_result
from verl_oracle import VERL_FAMILY

from backend.gateway.core import GatewayLimits, session_name
from backend.loading.tokenizers import load_tokenizer

SYSTEM = "You are a weather assistant."
QUESTION = "What's the weather in Seattle?"
# the tools as an Anthropic client declares them (the same functions as the chat tests' SCHEMAS)
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in SCHEMAS]


@pytest.fixture(scope="module", params=PROFILES)
def family(request):
    return request.param, load_tokenizer(request.param)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def qwen35():
    return load_tokenizer("qwen3.5")


def client_for(url: str, session: str | None = None, key: str = "not-a-key") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{url}/s/{session}" if session else url, api_key=key, max_retries=0)


def ask(client: anthropic.Anthropic, messages: list, stream: bool, **kw):
    """One turn through the SDK: the Message (with ``stream``, the helper's final message)."""
    args = {"model": "claude-weather", "max_tokens": 1024, "system": SYSTEM, "messages": messages, "tools": TOOLS, **kw}
    if stream:
        with client.messages.stream(**args) as s:
            text = "".join(s.text_stream)
            msg = s.get_final_message()
        assert text == "".join(b.text for b in msg.content if b.type == "text")
        return msg
    return client.messages.create(**args)


def oracle_assistant(content) -> dict:
    """The model's turn as the harness sent it back, in Hugging Face chat format, written out here
    for the oracle: text as content, thinking as reasoning_content, tool_use as tool_calls."""
    out = {"role": "assistant", "content": "".join(b.text for b in content if b.type == "text")}
    thinking = [b.thinking for b in content if b.type == "thinking"]
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
             for b in content if b.type == "tool_use"]
    if calls:
        out["tool_calls"] = calls
    return out


def rendered_length(bundle, messages: list[dict]) -> int:
    return len(bundle.tokenizer.apply_chat_template(messages, tools=SCHEMAS, chat_template=bundle.chat_template,
                                                    add_generation_prompt=True, tokenize=True, return_dict=False,
                                                    **bundle.chat_template_kwargs))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_anthropic_sdk_session_equals_verls_builder(family, stream, tmp_path):
    profile, bundle = family
    script = [call_text(profile, bundle, [CALL]), call_text(profile, bundle, [CALL_ZURICH]), answer_text(profile),
              answer_text(profile)]
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = client_for(url, "claude")
        msgs = [{"role": "user", "content": QUESTION}]
        count = client.messages.count_tokens(model="claude-weather", system=SYSTEM, messages=msgs, tools=TOOLS)
        assert count.input_tokens == rendered_length(bundle, first)
        assert not (tmp_path / "claude.jsonl").exists()  # count_tokens is no turn
        turns = []
        for city in ("Seattle", "Zürich"):
            r = ask(client, msgs, stream)
            assert r.stop_reason == "tool_use" and r.role == "assistant" and r.id.startswith("msg_")
            assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
            (use,) = [b for b in r.content if b.type == "tool_use"]
            assert use.name == CALL["name"] and use.input == {"city": city}
            if profile == "qwen3.5":
                assert r.content[0].type == "thinking" and r.content[0].signature
            result = tool_result(json.dumps(use.input))
            msgs = [*msgs, {"role": "assistant", "content": r.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
            turns.append([oracle_assistant(r.content), {"role": "tool", "tool_call_id": use.id, "content": result}])
        r = ask(client, msgs, stream)
        assert r.stop_reason == "end_turn" and r.content[-1].type == "text" and r.content[-1].text == ANSWER
        msgs = [*msgs, {"role": "assistant", "content": r.content}, {"role": "user", "content": FOLLOW_UP}]
        turns.append([oracle_assistant(r.content), {"role": "user", "content": FOLLOW_UP}])
        r = ask(client, msgs, stream)
        assert r.stop_reason == "end_turn" and r.content[-1].text == ANSWER
    (branch,) = read_capture(tmp_path, "claude")
    assert branch["metadata"]["branch"] == {"id": "b0", "parent": None, "fork_at": None, "cause": None}
    assert branch["metadata"]["dialects"] == ["anthropic"] and branch["termination_reason"] == "no_tool_calls"
    assert branch["tools"] == SCHEMAS
    outputs = [generated_ids(bundle, text) for text in script]
    ids = branch["prompt_ids"] + branch["response_ids"]
    assert [ids[s["start"]:s["end"]] for s in branch["steps"] if s["state"] == "generating"] == outputs
    prompt, response, mask = verl_session(bundle, VERL_FAMILY[profile], first, SCHEMAS,
                                          list(zip(outputs, [*turns, []])))
    assert branch["prompt_ids"] == prompt
    assert branch["response_ids"] == response
    assert branch["response_mask"] == mask


def test_tool_results_come_before_the_users_text_and_system_blocks_join(qwen3, tmp_path):
    """A user message holding text, then two tool results, then more text becomes the tool messages
    in order, then one user message with the texts (as vLLM orders them); system text blocks are
    joined with nothing between them, Claude Code's billing-header block left out and recorded,
    cache_control ignored; is_error is recorded as ignored."""
    two = call_text("qwen3", qwen3, [CALL, CALL_ZURICH])
    with serving(scripted_gateway(qwen3, [two, ANSWER], tmp_path)) as url:
        client = client_for(url, "order")
        system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
                  {"type": "text", "text": "You are a weather assistant.", "cache_control": {"type": "ephemeral"}},
                  {"type": "text", "text": " Be brief."}]
        msgs = [{"role": "user", "content": QUESTION}]
        r = client.messages.create(model="m", max_tokens=64, system=system, messages=msgs, tools=TOOLS)
        a, b = [x for x in r.content if x.type == "tool_use"]
        msgs += [{"role": "assistant", "content": r.content},
                 {"role": "user", "content": [{"type": "text", "text": "Here you go."},
                                              {"type": "tool_result", "tool_use_id": a.id, "content": "72"},
                                              {"type": "tool_result", "tool_use_id": b.id, "is_error": True,
                                               "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "data"}]},
                                              {"type": "text", "text": "Thanks."}]}]
        r = client.messages.create(model="m", max_tokens=64, system=system, messages=msgs, tools=TOOLS)
        assert r.content[0].text == ANSWER
    (branch,) = read_capture(tmp_path, "order")
    assert branch["messages"][0] == {"role": "system", "content": "You are a weather assistant. Be brief."}
    assert branch["messages"][3:] == [
        {"role": "tool", "content": "72", "tool_call_id": a.id},
        {"role": "tool", "content": "no\ndata", "tool_call_id": b.id},
        {"role": "user", "content": "Here you go.\nThanks."}, branch["messages"][-1]]
    gens = [s for s in branch["steps"] if s["state"] == "generating"]
    assert gens[0]["info"]["gateway"]["ignored"]["system_billing_header"].startswith("x-anthropic-billing-header")
    assert gens[1]["info"]["gateway"]["ignored"]["tool_result_is_error"] == [b.id]


def test_thinking_the_harness_drops_follows_the_chat_policy(qwen35, tmp_path):
    """A client that strips thinking blocks from the turns it sends back: on qwen3.5 the template
    renders the reasoning of turns after the last user message, so the first strip forks
    (reasoning_dropped); the answer's stripped thinking sits before the next user message, where
    the template drops it anyway: no second fork."""
    bundle = qwen35
    script = [call_text("qwen3.5", bundle, [CALL]), answer_text("qwen3.5"), answer_text("qwen3.5")]

    def strip(content):
        return [b for b in content if b.type != "thinking"]

    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = client_for(url, "strip")
        msgs = [{"role": "user", "content": QUESTION}]
        r = client.messages.create(model="m", max_tokens=256, messages=msgs, tools=TOOLS)
        assert r.content[0].type == "thinking" and r.content[0].thinking.strip() == "I should look it up."
        use = r.content[-1]
        msgs += [{"role": "assistant", "content": strip(r.content)},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "72"}]}]
        r = client.messages.create(model="m", max_tokens=256, messages=msgs, tools=TOOLS)
        assert [b["metadata"]["branch"]["cause"] for b in read_capture(tmp_path, "strip")] == [None, "reasoning_dropped"]
        msgs += [{"role": "assistant", "content": strip(r.content)}, {"role": "user", "content": FOLLOW_UP}]
        client.messages.create(model="m", max_tokens=256, messages=msgs, tools=TOOLS)
    branches = read_capture(tmp_path, "strip")
    assert len(branches) == 2, [b["metadata"]["branch"] for b in branches]
    assert [s["state"] for s in branches[1]["steps"]] == ["pending", "generating", "processing_tools", "generating",
                                                         "terminated"]


def test_tool_choice_and_sampling_are_mapped_and_recorded(qwen3, tmp_path):
    """tool_choice tool / none become the tool's name (enforced by the grammar) / none,
    disable_parallel_tool_use allows one call; temperature, top_p, top_k (no longer parameters of
    the SDK's create: sent as a client that still sends them does), stop_sequences are applied;
    metadata and thinking are recorded as ignored."""
    call = call_text("qwen3", qwen3, [CALL])
    with serving(scripted_gateway(qwen3, [call, ANSWER], tmp_path)) as url:
        client = client_for(url, "choice")
        msgs = [{"role": "user", "content": QUESTION}]
        r = client.messages.create(model="m", max_tokens=64, messages=msgs, tools=TOOLS, stop_sequences=["###"],
                                   metadata={"user_id": "u1"}, extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20},
                                   tool_choice={"type": "tool", "name": CALL["name"], "disable_parallel_tool_use": True},
                                   thinking={"type": "enabled", "budget_tokens": 1024})
        assert r.stop_reason == "tool_use"
        msgs += [{"role": "assistant", "content": r.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[-1].id, "content": "72"}]}]
        r = client.messages.create(model="m", max_tokens=64, messages=msgs, tools=TOOLS, tool_choice={"type": "none"})
        assert r.stop_reason == "end_turn"
    (branch,) = read_capture(tmp_path, "choice")
    first, second = [s["info"] for s in branch["steps"] if s["state"] == "generating"]
    g = first["gateway"]
    assert g["tool_choice"] == CALL["name"]
    assert g["sampling"] == {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop": ["###"], "max_tokens": 64}
    assert g["ignored"] == {"metadata": {"user_id": "u1"}, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert second["gateway"]["tool_choice"] == "none"
    # "any" is enforced: a scripted answer without a call breaks the constraint (the engine's error: api_error)
    with serving(scripted_gateway(qwen3, [ANSWER], tmp_path)) as url:
        with pytest.raises(anthropic.InternalServerError) as e:
            client_for(url, "any").messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": QUESTION}],
                                                   tools=TOOLS, tool_choice={"type": "any"})
    assert e.value.status_code == 502 and e.value.body["error"]["type"] == "api_error"
    assert "constraint" in e.value.body["error"]["message"]


def test_a_malformed_call_is_answered_as_text_and_recorded(qwen3, tmp_path):
    bad = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle"\n</tool_call>'
    with serving(scripted_gateway(qwen3, [bad], tmp_path)) as url:
        r = client_for(url, "bad").messages.create(model="m", max_tokens=64, messages=[
            {"role": "user", "content": QUESTION}], tools=TOOLS)
    assert r.stop_reason == "end_turn" and [b.type for b in r.content] == ["text"]
    assert '"city": "Seattle"' in r.content[0].text
    (branch,) = read_capture(tmp_path, "bad")
    (gen,) = [s for s in branch["steps"] if s["state"] == "generating"]
    assert gen["parse_errors"] and branch["termination_reason"] == "malformed_tool_call"


def test_max_tokens_stop_reason_and_the_key_names_the_session(qwen3, tmp_path):
    """A turn cut at max_tokens says so; without a route the session is the x-api-key's digest (the
    key is written nowhere); an anthropic-beta header is accepted."""
    key = "sk-ant-secret-5678"
    with serving(scripted_gateway(qwen3, [ANSWER], tmp_path)) as url:
        r = client_for(url, key=key).messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "Hi"}],
                                                     extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    digest = session_name(None, key)
    assert [p.name for p in tmp_path.iterdir()] == [f"{digest}.jsonl"]
    assert key not in (tmp_path / f"{digest}.jsonl").read_text()


def _role_system(body):
    return {**body, "messages": [{"role": "system", "content": "x"}, *body["messages"]]}


GOOD = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
BAD = [
    ("no max_tokens", {k: v for k, v in GOOD.items() if k != "max_tokens"}, 400),
    ("max_tokens 0", {**GOOD, "max_tokens": 0}, 400),
    ("messages not a list", {**GOOD, "messages": "Hi"}, 400),
    ("empty messages", {**GOOD, "messages": []}, 400),
    ("role system inside messages", _role_system(GOOD), 400),
    ("tool_result without tool_use_id", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "72"}]}]}, 400),
    ("unknown block type", {**GOOD, "messages": [{"role": "user", "content": [{"type": "hologram", "text": "x"}]}]}, 400),
    ("image block", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/x.png"}}]}]}, 400),
    ("document block", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "http://169.254.169.254/x.pdf"}}]}]}, 400),
    ("server tool", {**GOOD, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400),
    ("bash tool", {**GOOD, "tools": [{"type": "bash_20250124", "name": "bash"}]}, 400),
    ("tool without input_schema", {**GOOD, "tools": [{"name": "f"}]}, 400),
    ("temperature out of range", {**GOOD, "temperature": 1.5}, 400),
    ("top_k zero", {**GOOD, "top_k": 0}, 400),
    ("bad tool_choice", {**GOOD, "tools": TOOLS, "tool_choice": {"type": "sometimes"}}, 400),
    ("tool_choice names an unknown tool", {**GOOD, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400),
    ("redacted thinking", {**GOOD, "messages": [*GOOD["messages"], {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "abc"}]}, {"role": "user", "content": "Go on"}]}, 400),
    ("prefill", {**GOOD, "messages": [*GOOD["messages"], {"role": "assistant", "content": "The weather is"}]}, 400),
    ("mcp servers", {**GOOD, "mcp_servers": [{"type": "url", "url": "http://169.254.169.254/", "name": "x"}]}, 400),
    ("stop_sequences not a list", {**GOOD, "stop_sequences": "###"}, 400),
    ("system an image", {**GOOD, "system": [{"type": "image", "source": {}}]}, 400),
]


def test_bad_requests_are_refused_in_anthropics_shape_and_the_next_call_works(qwen3, tmp_path):
    gw = scripted_gateway(qwen3, [ANSWER], tmp_path, limits=GatewayLimits(max_body_bytes=200_000))
    with serving(gw, key="gw-key") as url:
        client = client_for(url, "bad", key="gw-key")
        raw = httpx.Client(base_url=url, headers={"x-api-key": "gw-key", "anthropic-version": "2023-06-01",
                                                  "content-type": "application/json"}, timeout=30)

        def good(k: int) -> None:
            r = client_for(url, f"good{k}", key="gw-key").messages.create(**GOOD)
            assert r.content[0].text == ANSWER

        for k, (what, body, status) in enumerate(BAD):
            with pytest.raises(anthropic.BadRequestError) as e:  # the SDK's own request path (it checks no fields)
                client.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
            assert e.value.status_code == status and e.value.body["type"] == "error", what
            err = e.value.body["error"]
            assert err["type"] == "invalid_request_error" and err["message"] and "Traceback" not in err["message"], what
            good(k)
        # not JSON, a body over the limit: sent raw (the SDK would not send them)
        r = raw.post("/s/bad/v1/messages", content=b"{nope")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "JSON" in r.text
        good(100)
        with pytest.raises(anthropic.APIStatusError) as e:
            client.messages.create(**{**GOOD, "messages": [{"role": "user", "content": "x" * 300_000}]})
        assert e.value.status_code == 413 and e.value.body["error"]["type"] == "request_too_large"
        good(101)
        with pytest.raises(anthropic.BadRequestError):  # count_tokens is bounded and checked as a turn is
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": [{"type": "image"}]}])
        with pytest.raises(anthropic.APIStatusError) as e:
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x" * 300_000}])
        assert e.value.status_code == 413
        assert client.messages.count_tokens(model="m", messages=GOOD["messages"]).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(**GOOD)
        assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
        r = httpx.post(f"{url}/v1/messages", json=GOOD, headers={"anthropic-version": "2023-06-01"})  # no key at all
        assert r.status_code == 401 and r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
        for path in ("/v1/messages/batches", "/s/x/v1/messages/nothing", "/v1/messages/count_tokens/x"):
            r = raw.post(path, json={})
            assert r.status_code == 404 and r.json() == {"type": "error", "error": {
                "type": "not_found_error", "message": r.json()["error"]["message"]}}, path
        r = raw.get("/v1/messages")
        assert r.status_code in (404, 405) and r.json()["type"] == "error"
        good(102)
        # the model list in Anthropic's shape for an Anthropic client (the SDK's own page type reads it)
        (model,) = client.models.list().data
        assert model.id == "scripted" and model.type == "model"
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert "object" in httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer gw-key"}).json()  # OpenAI's otherwise
        raw.close()
    assert not (tmp_path / "bad.jsonl").exists()
