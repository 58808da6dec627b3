"""The capture gateway's Chat Completions dialect, driven by clients we did not write (the ``openai``
SDK, ``openai-agents``' Runner) against a scripted model on qwen3, qwen3.5 and llama3.

Each linear session's captured branch must equal, id for id and mask bit for mask bit, what verl
0.9.1's Continuous Token builder of that family gives for the messages the harness sent and the
ids the model generated (tests/gateway_support.py). History rewrites fork with the right cause,
their prompt is transformers' own render of the request (so no re-rendered id is at mask 1), and
a retried body is answered from the record with no second turn.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from gateway_support import generated_ids, read_capture, scripted_gateway, serving, verl_session
from test_engine import get_current_temperature
from test_families import ANSWER, CALL, answer_text, call_text
from verl_oracle import VERL_FAMILY

from backend.checks.diagnostics import check
from backend.gateway.core import FORK_CAUSES, Gateway, GatewayError, session_name
from backend.generators.base import GenerationError
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import Trace

PROFILES = ["qwen3", "qwen3.5", "llama3"]
CALL_ZURICH = {"name": CALL["name"], "arguments": {"city": "Zürich"}}
SCHEMAS = list(ToolRegistry.from_functions([get_current_temperature]).schemas)
SYSTEM = {"role": "system", "content": "You are a weather assistant."}
USER = {"role": "user", "content": "What's the weather in Seattle?"}
FOLLOW_UP = "Thanks! And in Zürich?"


@pytest.fixture(scope="module", params=PROFILES)
def family(request):
    return request.param, load_tokenizer(request.param)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def qwen35():
    return load_tokenizer("qwen3.5")


def script_for(profile: str, bundle) -> list[str]:
    """Two rounds of one call each, an answer, and an answer to a follow-up question."""
    return [call_text(profile, bundle, [CALL]), call_text(profile, bundle, [CALL_ZURICH]), answer_text(profile),
            answer_text(profile)]


def tool_result(arguments: str) -> str:
    return json.dumps(get_current_temperature(**json.loads(arguments)), ensure_ascii=False)


def echo(message) -> dict:
    """The assistant message as a client sends it back: the SDK's model, dumped."""
    return message.model_dump(exclude_none=True)


def oracle_message(m: dict) -> dict:
    """A message the harness sent, in Hugging Face chat format, written out here for the oracle:
    content null as "", call arguments decoded from their JSON string."""
    out = {"role": m["role"], "content": m.get("content") or ""}
    for k in ("tool_call_id", "reasoning_content"):
        if k in m:
            out[k] = m[k]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                             for c in m["tool_calls"]]
    return out


class Streamed:
    """A streamed chat completion put back together from its chunks (what a client does)."""

    def __init__(self, chunks):
        self.content, self.reasoning, self.calls, self.finish, self.usage = "", "", {}, None, None
        for ch in chunks:
            if ch.usage is not None:
                self.usage = ch.usage
            for c in ch.choices:
                d = c.delta
                self.content += d.content or ""
                self.reasoning += (d.model_extra or {}).get("reasoning_content") or ""
                for tc in d.tool_calls or []:
                    slot = self.calls.setdefault(tc.index, {"id": None, "type": "function",
                                                            "function": {"name": "", "arguments": ""}})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function is not None:
                        slot["function"]["name"] += tc.function.name or ""
                        slot["function"]["arguments"] += tc.function.arguments or ""
                self.finish = c.finish_reason or self.finish

    def message(self) -> dict:
        m = {"role": "assistant", "content": self.content or None}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.calls:
            m["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {k: v for k, v in m.items() if v is not None}


def ask(client, messages, stream: bool, **kw) -> tuple[dict, str]:
    """One turn: (the assistant message as the client would send it back, finish_reason)."""
    if stream:
        s = Streamed(client.chat.completions.create(model="weather-model", messages=messages, tools=SCHEMAS, stream=True,
                                                    stream_options={"include_usage": True}, **kw))
        assert s.usage is not None and s.usage.completion_tokens > 0
        return s.message(), s.finish
    r = client.chat.completions.create(model="weather-model", messages=messages, tools=SCHEMAS, **kw)
    return echo(r.choices[0].message), r.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_sdk_session_equals_verls_builder(family, stream, tmp_path):
    """Two rounds of calls, an answer, a follow-up question and its answer, through the openai SDK:
    one branch, equal to verl's builder fed the same messages and generated ids."""
    profile, bundle = family
    script = script_for(profile, bundle)
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/linear/v1", api_key="not-a-key", max_retries=0)
        msgs = [SYSTEM, USER]
        first = [dict(m) for m in msgs]
        turns = []
        for expect in ("Seattle", "Zürich"):
            m, finish = ask(client, msgs, stream)
            assert finish == "tool_calls"
            (call,) = m["tool_calls"]
            assert call["function"]["name"] == CALL["name"] and json.loads(call["function"]["arguments"]) == {"city": expect}
            result = {"role": "tool", "tool_call_id": call["id"], "content": tool_result(call["function"]["arguments"])}
            turns.append([m, result])
            msgs = [*msgs, m, result]
        m, finish = ask(client, msgs, stream)
        assert finish == "stop" and m["content"] == ANSWER and "tool_calls" not in m
        follow = {"role": "user", "content": FOLLOW_UP}
        turns.append([m, follow])
        msgs = [*msgs, m, follow]
        m, finish = ask(client, msgs, stream)
        assert finish == "stop" and m["content"] == ANSWER
    (branch,) = read_capture(tmp_path, "linear")
    assert branch["metadata"]["branch"] == {"id": "b0", "parent": None, "fork_at": None, "cause": None}
    assert branch["metadata"]["session"] == "linear" and branch["metadata"]["dialects"] == ["chat"]
    assert branch["termination_reason"] == "no_tool_calls"
    gen_steps = [s for s in branch["steps"] if s["state"] == "generating"]
    ids = branch["prompt_ids"] + branch["response_ids"]
    outputs = [generated_ids(bundle, text) for text in script]
    assert [ids[s["start"]:s["end"]] for s in gen_steps] == outputs
    verl_turns = [(out, [oracle_message(x) for x in new]) for out, new in zip(outputs, [*turns, []])]
    prompt, response, mask = verl_session(bundle, VERL_FAMILY[profile], first, SCHEMAS, verl_turns)
    assert branch["prompt_ids"] == prompt
    assert branch["response_ids"] == response
    assert branch["response_mask"] == mask
    # check reads a captured branch as any trace. The mask audit finds nothing on any family. On
    # qwen3.5 a full re-render drops the reasoning of the turns before the follow-up question
    # (drift and thinking_stripped: true, a re-rendered sample would lose what the model generated),
    # and trl's qwen3_6_training counts the <think> its generation prompt opens as assistant
    # (mask_mismatch, as on the agent loop's own qwen3.5 traces)
    found = [f for f in check(Trace.from_dict(branch), bundle) if f.severity != "info"]
    expected = {"retokenization_drift", "thinking_stripped", "mask_mismatch"} if profile == "qwen3.5" else set()
    assert {f.code for f in found} == expected, [(f.code, f.message) for f in found]
    drift = [f for f in found if f.code == "retokenization_drift"]
    assert all(set(f.details["causes"]) == {"reasoning_stripped"} for f in drift)


def test_fork_causes_and_masks(qwen3, tmp_path):
    """Each kind of history rewrite forks from the branch it departs from, with its cause; the fork's
    prompt is transformers' own render of the request (all context), its fork_at the first id where
    it departs from the parent, and only the ids it sampled itself are mask 1."""
    bundle = qwen3
    call = call_text("qwen3", bundle, [CALL])
    script = [call, ANSWER] + [ANSWER] * 8
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/forks/v1", api_key="k", max_retries=0)
        base = [SYSTEM, USER]
        m, _ = ask(client, base, False)
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": tool_result('{"city": "Seattle"}')}
        linear = [*base, m, tool]
        answer, _ = ask(client, linear, False)
        assert len(read_capture(tmp_path, "forks")) == 1  # linear so far

        other_args = json.loads(json.dumps(m))
        other_args["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
        more_tools = [*SCHEMAS, {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                                                  "parameters": {"type": "object", "properties": {}}}}]
        cases = [
            ("message_edited", [*base, m, {**tool, "content": '{"temperature": 60}'}], SCHEMAS),
            ("history_rewritten", [*base, {"role": "user", "content": "Summary so far: Seattle is 72 degrees. Go on."}], SCHEMAS),
            ("tools_changed", linear, more_tools),
            ("system_prompt_changed", [{"role": "system", "content": "You are terse."}, USER, m, tool], SCHEMAS),
            ("arguments_reserialized", [*base, other_args, tool], SCHEMAS),
            ("resampled", base, SCHEMAS),
        ]
        for cause, messages, tools in cases:
            r = client.chat.completions.create(model="weather-model", messages=messages, tools=tools, temperature=0.5)
            assert r.choices[0].message.content == ANSWER
    branches = read_capture(tmp_path, "forks")
    assert [b["metadata"]["branch"]["cause"] for b in branches] == [None] + [c for c, _, _ in cases]
    root = branches[0]
    assert root["metadata"]["branch"]["parent"] is None
    root_ids = root["prompt_ids"] + root["response_ids"]
    for b, (cause, messages, tools) in zip(branches[1:], cases):
        meta = b["metadata"]["branch"]
        assert meta["parent"] == "b0", cause
        rendered = bundle.tokenizer.apply_chat_template(
            [oracle_message(x) for x in messages], tools=tools, chat_template=bundle.chat_template,
            add_generation_prompt=True, tokenize=True, return_dict=False, **bundle.chat_template_kwargs)
        assert b["prompt_ids"] == list(rendered), cause
        first_diff = next(k for k, (x, y) in enumerate(zip(root_ids, rendered)) if x != y) if cause != "resampled" else None
        assert meta["fork_at"] == (first_diff if first_diff is not None else len(rendered)), cause
        assert b["response_ids"] == generated_ids(bundle, ANSWER) and b["response_mask"] == [1] * len(b["response_ids"])
        assert cause in FORK_CAUSES
    # the root kept its own two turns and nothing of the forks
    assert root["response_mask"].count(1) == len(generated_ids(bundle, call)) + len(generated_ids(bundle, ANSWER))


def test_reasoning_dropped_forks_only_where_the_template_renders_it(qwen35, tmp_path):
    """qwen3.5's template renders the reasoning of turns after the last user message and drops it
    before: a client that sends turns back without reasoning forks in the first case (the model was
    shown reasoning the harness no longer sends), and extends the branch in the second."""
    bundle = qwen35
    script = [call_text("qwen3.5", bundle, [CALL]), answer_text("qwen3.5"), answer_text("qwen3.5")]
    with serving(scripted_gateway(bundle, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/think/v1", api_key="k", max_retries=0)
        m, _ = ask(client, [USER], False)
        assert m["reasoning_content"].strip() == "I should look it up."
        dropped = {k: v for k, v in m.items() if k != "reasoning_content"}
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": tool_result('{"city": "Seattle"}')}
        msgs = [USER, dropped, tool]
        a, _ = ask(client, msgs, False)
        branches = read_capture(tmp_path, "think")
        assert [b["metadata"]["branch"]["cause"] for b in branches] == [None, "reasoning_dropped"]
        # the answer's reasoning, dropped too, sits before the next user message: the template drops it as well
        msgs = [*msgs, {k: v for k, v in a.items() if k != "reasoning_content"}, {"role": "user", "content": FOLLOW_UP}]
        ask(client, msgs, False)
    branches = read_capture(tmp_path, "think")
    assert len(branches) == 2, [b["metadata"]["branch"] for b in branches]
    fork = branches[1]
    assert [s["state"] for s in fork["steps"]] == ["pending", "generating", "processing_tools", "generating", "terminated"]
    assert fork["response_mask"].count(1) == 2 * len(generated_ids(bundle, answer_text("qwen3.5")))


def test_retried_body_gets_the_same_answer_and_no_second_turn(qwen3, tmp_path):
    script = [call_text("qwen3", qwen3, [CALL]), ANSWER]
    body = json.dumps({"model": "m", "messages": [USER], "tools": SCHEMAS}).encode()
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url:
        with httpx.Client(base_url=url) as h:
            first = h.post("/s/retry/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            again = h.post("/s/retry/v1/chat/completions", content=body,
                           headers={"content-type": "application/json", "x-stainless-retry-count": "1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["x-ali-replayed"] == "true"
    (branch,) = read_capture(tmp_path, "retry")
    assert [s["state"] for s in branch["steps"]].count("generating") == 1


def test_calls_without_tools_are_their_own_roots(qwen3, tmp_path):
    """A title generator's call (no tools) beside the agent's: a root of its own, not a fork."""
    script = [call_text("qwen3", qwen3, [CALL]), "Weather in Seattle", ANSWER]
    with serving(scripted_gateway(qwen3, script, tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/title/v1", api_key="k", max_retries=0)
        m, _ = ask(client, [USER], False)
        title = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Title for: " + USER["content"]}])
        assert title.choices[0].message.content == "Weather in Seattle"
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "72"}
        ask(client, [USER, m, tool], False)
    branches = read_capture(tmp_path, "title")
    assert [(b["metadata"]["branch"]["parent"], b["metadata"]["branch"]["cause"]) for b in branches] == [(None, None)] * 2
    assert [len(b["tools"]) for b in branches] == [1, 0]


def test_sessions_by_route_key_and_header(qwen3, tmp_path):
    """A session is named by the route, else x-session-id, else the API key's digest (the key is
    never written anywhere), else "default"."""
    key = "sk-secret-value-1234"
    with serving(scripted_gateway(qwen3, [ANSWER], tmp_path)) as url:
        for base, headers in [(f"{url}/s/named/v1", {}), (f"{url}/v1", {"x-session-id": "opencode-1"}), (f"{url}/v1", {})]:
            c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, default_headers=headers)
            assert c.chat.completions.create(model="m", messages=[USER]).choices[0].message.content == ANSWER
    digest = session_name(None, key)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["named.jsonl", "opencode-1.jsonl", f"{digest}.jsonl"])
    for p in tmp_path.iterdir():
        assert key not in p.read_text() and key not in p.name
    assert session_name(None, None) == "default"


def test_sixty_four_concurrent_sessions_keep_to_themselves(qwen3, tmp_path):
    """64 sessions at once, turns interleaved (a slow scripted model), each retried once: every
    capture holds its own city only, one branch, and no turn twice."""
    call = call_text("qwen3", qwen3, [CALL])
    gw = scripted_gateway(qwen3, [call, ANSWER], tmp_path, token_delay_s=0.002)

    async def one(url: str, k: int) -> None:
        client = openai.AsyncOpenAI(base_url=f"{url}/s/s{k}/v1", api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": f"Weather in city {k}?"}]
        r = await client.chat.completions.create(model="m", messages=msgs, tools=SCHEMAS)
        m = echo(r.choices[0].message)
        msgs = [*msgs, m, {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": f"city {k}: 72"}]
        a, b = await asyncio.gather(*(client.chat.completions.create(model="m", messages=msgs, tools=SCHEMAS) for _ in range(2)))
        assert a.choices[0].message.content == b.choices[0].message.content == ANSWER
        await client.close()

    with serving(gw) as url:
        async def main():
            await asyncio.gather(*(one(url, k) for k in range(64)))
        asyncio.run(main())
    for k in range(64):
        (branch,) = read_capture(tmp_path, f"s{k}")
        text = json.dumps(branch["messages"])
        assert f"city {k}?" in text and f"city {k}: 72" in text
        assert not any(f"city {j}:" in text for j in range(64) if j != k)
        assert [s["state"] for s in branch["steps"]].count("generating") == 2


BAD = [
    ("not json", b"{nope", 400),
    ("empty body", b"", 400),
    ("not an object", b"[1, 2]", 400),
    ("no messages", {"model": "m"}, 400),
    ("empty messages", {"model": "m", "messages": []}, 400),
    ("messages not a list", {"model": "m", "messages": "hi"}, 400),
    ("bad role", {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("message not an object", {"model": "m", "messages": ["hi"]}, 400),
    ("n > 1", {"model": "m", "messages": [USER], "n": 2}, 400),
    ("max_tokens 0", {"model": "m", "messages": [USER], "max_tokens": 0}, 400),
    ("max_tokens true", {"model": "m", "messages": [USER], "max_tokens": True}, 400),
    ("temperature text", {"model": "m", "messages": [USER], "temperature": "hot"}, 400),
    ("too many stops", {"model": "m", "messages": [USER], "stop": ["x"] * 17}, 400),
    ("tools not a list", {"model": "m", "messages": [USER], "tools": {"a": 1}}, 400),
    ("tool without a name", {"model": "m", "messages": [USER], "tools": [{"type": "function", "function": {}}]}, 400),
    ("bad tool_choice", {"model": "m", "messages": [USER], "tools": SCHEMAS, "tool_choice": 7}, 400),
    ("tool_choice names an unknown tool", {"model": "m", "messages": [USER], "tools": SCHEMAS,
                                           "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400),
    ("image part", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}]}]}, 400),
    ("lone surrogate", b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}', 400),
    ("json schema output", {"model": "m", "messages": [USER], "response_format": {"type": "json_schema"}}, 400),
    ("stream not a boolean", {"model": "m", "messages": [USER], "stream": "yes"}, 400),
    ("negative temperature", {"model": "m", "messages": [USER], "temperature": -1}, 400),
    ("top_p 0", {"model": "m", "messages": [USER], "top_p": 0}, 400),
    ("NaN top_p", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}', 400),
    ("malformed tool call", {"model": "m", "messages": [USER, {"role": "assistant", "tool_calls": [{"function": 3}]}]}, 400),
    ("body over the limit", {"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]}, 413),
]


def test_bad_requests_are_refused_in_openais_shape_and_the_next_call_works(qwen3, tmp_path):
    from backend.gateway.core import GatewayLimits

    gw = scripted_gateway(qwen3, [ANSWER], tmp_path, limits=GatewayLimits(max_body_bytes=200_000))
    with serving(gw, key="gw-key") as url, httpx.Client(base_url=url, timeout=30) as h:
        auth = {"authorization": "Bearer gw-key", "content-type": "application/json"}

        def good(k: int) -> None:
            r = h.post(f"/s/good{k}/v1/chat/completions", headers=auth, json={"model": "m", "messages": [USER]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER

        for k, (what, body, status) in enumerate(BAD):
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = h.post("/s/bad/v1/chat/completions", headers=auth, content=raw)
            assert r.status_code == status, (what, r.text)
            err = r.json()["error"]
            assert err["message"] and err["type"] and "Traceback" not in r.text, what
            good(k)
        for what, req in [
            ("no key", h.build_request("POST", "/v1/chat/completions", json={"model": "m", "messages": [USER]})),
            ("wrong key", h.build_request("POST", "/v1/chat/completions", json={"model": "m", "messages": [USER]},
                                          headers={"authorization": "Bearer nope"})),
        ]:
            r = h.send(req)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", what
        for path in ("/v1/embeddings", "/v1/nothing/here", "/s/x/v1/completions", "/elsewhere"):
            r = h.post(path, headers=auth, json={})
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path
        r = h.post("/s/bad name/v1/chat/completions", headers=auth, json={"model": "m", "messages": [USER]})
        assert r.status_code in (400, 404) and "error" in r.json()
        assert h.get("/v1/models", headers=auth).json()["data"][0]["id"] == "scripted"
        good(len(BAD))
    assert not (tmp_path / "bad.jsonl").exists()


def test_a_malformed_call_is_answered_as_content_and_recorded(qwen3, tmp_path):
    bad = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle"\n</tool_call>'
    with serving(scripted_gateway(qwen3, [bad], tmp_path)) as url:
        r = openai.OpenAI(base_url=f"{url}/s/bad/v1", api_key="k").chat.completions.create(
            model="m", messages=[USER], tools=SCHEMAS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls and '"city": "Seattle"' in msg.content
    (branch,) = read_capture(tmp_path, "bad")
    (gen,) = [s for s in branch["steps"] if s["state"] == "generating"]
    assert gen["parse_errors"] and branch["termination_reason"] == "malformed_tool_call"


def test_max_tokens_is_clamped_and_recorded(qwen3, tmp_path):
    gw = scripted_gateway(qwen3, [ANSWER], tmp_path, max_tokens=3)
    with serving(gw) as url:
        r = openai.OpenAI(base_url=f"{url}/s/cap/v1", api_key="k").chat.completions.create(
            model="m", messages=[USER], max_tokens=32000)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    (branch,) = read_capture(tmp_path, "cap")
    (gen,) = [s for s in branch["steps"] if s["state"] == "generating"]
    assert gen["info"]["max_tokens"] == 3 and gen["info"]["gateway"]["sampling"]["max_tokens"] == 32000
    assert branch["termination_reason"] == "response_length"


def test_session_names_are_checked():
    with pytest.raises(GatewayError):
        session_name("../etc", None)
    with pytest.raises(GatewayError):
        session_name("x" * 65, None)
    assert session_name("ok-1.a_b", None) == "ok-1.a_b"
    assert Gateway  # the class the app and the CLI build


def test_the_capture_line_built_turn_by_turn_is_the_branchs_trace(qwen35, tmp_path):
    """The capture file's lines are assembled from parts serialised once each: they must read back
    as exactly the trace the branch is (its every field), forks and a reasoning turn included; a
    branch's line is kept while the branch does not change, and written anew when it does (the
    first branch goes on after the fork)."""
    from backend.trace import Trace

    script = [call_text("qwen3.5", qwen35, [CALL]), answer_text("qwen3.5"), answer_text("qwen3.5"), answer_text("qwen3.5")]
    gw = scripted_gateway(qwen35, script, tmp_path)

    def lines_are_the_branches() -> None:
        s = gw.sessions["parts"]
        lines = (tmp_path / "parts.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(s.branches)
        for line, b in zip(lines, s.branches):
            assert Trace.from_dict(json.loads(line)).to_dict() == gw.trace(s, b).to_dict()

    with serving(gw) as url:
        client = openai.OpenAI(base_url=f"{url}/s/parts/v1", api_key="k", max_retries=0)
        m, _ = ask(client, [USER], False)
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "72 \u00b0F \u2014 \"quoted\""}
        m2, _ = ask(client, [USER, m, tool], False)
        ask(client, [USER, m, {**tool, "content": "edited"}], False)
        lines_are_the_branches()
        before = [b.builder.total for b in gw.sessions["parts"].branches]
        ask(client, [USER, m, tool, m2, {"role": "user", "content": "And tomorrow?"}], False)
        after = [b.builder.total for b in gw.sessions["parts"].branches]
        assert after[0] > before[0] and after[1] == before[1]  # the first branch went on, the fork did not
        lines_are_the_branches()
    assert len(gw.sessions["parts"].branches) == 2


class FailsOnce(ScriptedGenerator):
    """The scripted model, failing its ``fail_at``-th request once (an engine error mid-session)."""

    def __init__(self, *args, fail_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.requests = fail_at, 0

    async def _generate(self, request):
        self.requests += 1
        if self.requests == self.fail_at:
            raise GenerationError("the engine fell over")
        return await super()._generate(request)


def test_a_failed_turn_is_retried_on_the_same_branch(qwen3, tmp_path):
    """The engine fails the turn after a tool result (502 to the client); the SDK's retry, the same
    body, continues the same branch: no fork, the tool result appended once."""
    script = [call_text("qwen3", qwen3, [CALL]), ANSWER]
    gw = Gateway(qwen3, lambda s: FailsOnce(qwen3.tokenizer, script, stop_token_ids=qwen3.stop_token_ids,
                                            encode=qwen3.encode_generated, fail_at=2), capture_dir=str(tmp_path))
    with serving(gw) as url:
        client = openai.OpenAI(base_url=f"{url}/s/flaky/v1", api_key="k", max_retries=0)
        m, _ = ask(client, [USER], False)
        msgs = [USER, m, {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "72"}]
        with pytest.raises(openai.APIStatusError) as e:
            ask(client, msgs, False)
        assert e.value.status_code == 502 and "the engine fell over" in str(e.value)
        a, finish = ask(client, msgs, False)
    assert a["content"] == ANSWER and finish == "stop"
    (branch,) = read_capture(tmp_path, "flaky")
    assert [s["state"] for s in branch["steps"]] == ["pending", "generating", "processing_tools", "generating", "terminated"]


def test_a_capture_that_cannot_be_written_is_said_and_the_retry_writes_it(qwen3, tmp_path):
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    blocker = tmp_path / "w.jsonl.tmp"
    blocker.mkdir()  # the temporary file's name taken by a folder: the write fails
    with serving(scripted_gateway(qwen3, [ANSWER], tmp_path)) as url, httpx.Client(base_url=url) as h:
        r = h.post("/s/w/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 500 and "capture file could not be written" in r.json()["error"]["message"]
        blocker.rmdir()
        r = h.post("/s/w/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.headers["x-ali-replayed"] == "true"
    (branch,) = read_capture(tmp_path, "w")
    assert [s["state"] for s in branch["steps"]].count("generating") == 1


def test_a_session_past_its_token_limit_is_refused(qwen3, tmp_path):
    from backend.gateway.core import GatewayLimits

    gw = scripted_gateway(qwen3, [ANSWER] * 3, tmp_path, limits=GatewayLimits(max_session_tokens=15))
    with serving(gw) as url, httpx.Client(base_url=url) as h:
        first = h.post("/s/big/v1/chat/completions", json={"model": "m", "messages": [USER]})
        again = h.post("/s/big/v1/chat/completions", json={"model": "m", "messages": [USER], "temperature": 0.1})
        other = h.post("/s/other/v1/chat/completions", json={"model": "m", "messages": [USER]})
    assert first.status_code == 200 and other.status_code == 200
    assert again.status_code == 413 and "start a new session" in again.json()["error"]["message"]


def test_captured_branches_export_as_any_trace(qwen3, tmp_path):
    """``export --to verl`` and ``--to otel`` read a capture file as they read any trace file: one
    verl row per branch with the branch's own ids and mask, one OTel trace per branch."""
    from cli_inprocess import run_cli

    script = [call_text("qwen3", qwen3, [CALL]), ANSWER, ANSWER]
    cap = tmp_path / "cap"
    with serving(scripted_gateway(qwen3, script, cap)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/exp/v1", api_key="k", max_retries=0)
        m, _ = ask(client, [USER], False)
        tool = {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "72"}
        ask(client, [USER, m, tool], False)
        ask(client, [USER, m, {**tool, "content": "10"}], False)
    branches = read_capture(cap, "exp")
    r = run_cli("export", str(cap / "exp.jsonl"), "--to", "verl", "--out", str(tmp_path / "rows.jsonl"), "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == len(branches) == 2
    for row, b in zip(rows, branches):
        assert (row["prompt_ids"], row["response_ids"], row["response_mask"]) == (
            b["prompt_ids"], b["response_ids"], b["response_mask"])
    r = run_cli("export", str(cap / "exp.jsonl"), "--to", "otel", "--out", str(tmp_path / "spans.jsonl"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["traces"] == 2
