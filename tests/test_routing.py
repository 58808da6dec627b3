"""Sticky routing across vLLM servers: the hash ring alone, the conversation key the engine
sets, and agent loops against the real vLLM server fixture (every turn on one server; failover
from a dead URL to the next one on the ring, remembered for the later turns)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from vllm_servers import free_port

from backend.engine import AgentLoop, LoopConfig
from backend.generators.base import Generation, Generator, conversation_key
from backend.generators.routing import LRU, HashRing
from backend.generators.vllm_server import VLLMServerGenerator
from backend.loading.tokenizers import load_tokenizer

URLS = ["http://gpu1:8000", "http://gpu2:8000", "http://gpu3:8000"]
KEYS = [f"conversation-{i}" for i in range(3000)]


# ---- the hash ring ---------------------------------------------------------------------------------


def test_ring_is_deterministic_and_prefers_every_node_once():
    a, b, c = HashRing(URLS), HashRing(list(reversed(URLS))), HashRing(URLS)
    for k in KEYS[:200]:
        assert a.node(k) == b.node(k) == c.node(k)  # same in every instance, whatever the URLs' order
        pref = a.preference(k)
        assert pref[0] == a.node(k) and sorted(pref) == sorted(URLS)
    # and in every process (blake2b, not Python's salted hash): a resumed rollout routes as before
    assert [a.node(f"conversation-{i}") for i in range(4)] == [URLS[2], URLS[2], URLS[0], URLS[2]]


def test_ring_spreads_keys_evenly():
    ring = HashRing(URLS)
    counts = Counter(ring.node(k) for k in KEYS)
    assert set(counts) == set(URLS)
    for url, n in counts.items():
        assert abs(n - 1000) <= 150, counts  # within ±15 % of an even share


def test_removing_or_adding_a_url_moves_only_its_keys():
    full, without = HashRing(URLS), HashRing(URLS[:2])
    moved = 0
    for k in KEYS:
        if full.node(k) == URLS[2]:
            moved += 1
            # the key goes where it would have failed over to: the next server on the ring
            assert without.node(k) == full.preference(k)[1]
        else:
            assert without.node(k) == full.node(k)
    assert 0 < moved < len(KEYS) / 2
    grown = HashRing(URLS + ["http://gpu4:8000"])
    for k in KEYS:
        assert grown.node(k) in (full.node(k), "http://gpu4:8000")


def test_failover_memory_is_bounded():
    lru = LRU(2)
    lru.set("a", "x")
    lru.set("b", "y")
    assert lru.get("a") == "x"  # a is now the most recently used
    lru.set("c", "z")
    assert "b" not in lru and lru.get("a") == "x" and lru.get("c") == "z" and len(lru) == 2


# ---- the conversation key ------------------------------------------------------------------------------


class _KeyRecorder(Generator):
    """Answers every turn with EOS and records the conversation key it saw."""

    name = "key-recorder"

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.keys: list[str | None] = []

    async def generate(self, prompt_ids, params, *, on_tokens=None, constraint=None):
        self.keys.append(conversation_key.get())
        return Generation([self.eos], "stop")


async def test_the_engine_keys_each_run_by_its_trace_id():
    bundle = load_tokenizer("qwen3")
    gen = _KeyRecorder(bundle.eos_token_id)
    loop = AgentLoop(gen, bundle)
    t1 = await loop.run([{"role": "user", "content": "hi"}], trace_id="item-7#0")
    t2 = await loop.run([{"role": "user", "content": "hi"}])
    assert gen.keys == ["item-7#0", t2.id] and t1.id == "item-7#0" and t2.id != t1.id
    assert conversation_key.get() is None  # reset when the run ends


async def test_a_playground_chat_is_one_conversation_until_reset(monkeypatch):
    """Every message of a playground chat is a run of its own (its own trace id) but the same
    conversation: all go to one server; Reset starts a new one. A run given a key uses it."""
    import json

    import ui
    from backend.generators import scripted
    from ui import playground
    from ui.context import AppContext, new_session

    bundle = load_tokenizer("qwen3")
    gen = _KeyRecorder(bundle.eos_token_id)
    t = await AgentLoop(gen, bundle).run([{"role": "user", "content": "hi"}], conversation_key="chat-1")
    assert gen.keys == ["chat-1"] and t.id != "chat-1"

    seen: list[str | None] = []
    real = scripted.ScriptedGenerator.generate

    async def spy(self, *a, **kw):  # the key each of the playground's generations runs under
        seen.append(conversation_key.get())
        return await real(self, *a, **kw)

    monkeypatch.setattr(scripted.ScriptedGenerator, "generate", spy)
    ctx = AppContext()
    sess = new_session(ctx)
    settings = playground.RunSettings(script=json.dumps(["a", "b", "c"]), tools="[]", token_delay=0.0)
    runs = []
    for text in ("one", "two"):
        runs.append([x async for x in playground.run_turn(ctx, sess, text, settings)][-1][2])
    first = sess.conversation_id
    reset = next(d.fn for d in ui.build_app(ctx).fns.values() if getattr(d.fn, "__name__", "") == "on_reset")
    await reset(sess)
    runs.append([x async for x in playground.run_turn(ctx, sess, "three", settings)][-1][2])
    assert seen[0] == seen[1] == first and seen[2] == sess.conversation_id != first
    assert len({r.id for r in runs}) == 3  # each message is still its own trace


def test_routing_is_an_option_of_the_cli_and_the_app():
    import app as app_module
    from backend.cli import build_parser, engine_options

    args = build_parser().parse_args(["run", "--messages", "m.json", "--out", "o.jsonl", "--routing", "least_outstanding"])
    assert engine_options(args, "vllm-server") == {"routing": "least_outstanding"} and engine_options(args, "vllm") == {}
    a = app_module.parse_args(["--backend", "vllm-server"], environ={"ALI_ROUTING": "least_outstanding"})
    assert app_module.engine_options(a) == {"routing": "least_outstanding"}
    with pytest.raises(SystemExit):
        app_module.parse_args([], environ={"ALI_ROUTING": "random"})
    with pytest.raises(ValueError, match="unknown routing"):
        VLLMServerGenerator(["http://127.0.0.1:1"], routing="random")


def test_vllm_logprobs_mode_is_a_loop_setting_of_the_cli_and_the_environment():
    """What a vLLM server's logprobs are cannot be asked over HTTP: the loop config says it
    (``vllm_logprobs_mode``; the real-server test is in test_logprobs_vllm.py)."""
    from backend.cli import build_parser, loop_config
    from backend.config import ConfigError, env_defaults

    assert LoopConfig().vllm_logprobs_mode == "raw"  # vLLM's default, raw_logprobs
    args = build_parser().parse_args(["run", "--messages", "m.json", "--out", "o.jsonl", "--vllm-logprobs-mode", "processed"])
    cfg, given = loop_config(args)
    assert cfg.vllm_logprobs_mode == "processed" and given["vllm_logprobs_mode"] == "processed"
    assert env_defaults({"ALI_VLLM_LOGPROBS_MODE": "processed"}) == {"vllm_logprobs_mode": "processed"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--messages", "m.json", "--out", "o.jsonl", "--vllm-logprobs-mode", "processed_logits"])
    with pytest.raises(ConfigError, match="vllm_logprobs_mode must be one of raw, processed"):
        LoopConfig.from_dict({"vllm_logprobs_mode": "processed_logprobs"})
    assert LoopConfig.from_dict(LoopConfig(vllm_logprobs_mode="processed").to_dict()).vllm_logprobs_mode == "processed"


# ---- against the real vLLM server ----------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Oslo"]}}, "required": ["city"]}},
    "mock": {"template": "sunny in {city}"}}
# three assistant turns, each forced to call the tool (a random model under the grammar)
THREE_TURNS = LoopConfig(response_length=640, max_assistant_turns=3, tool_choice=["required"],
                         sampling={"temperature": 0.0, "max_tokens": 128, "seed": 0})


def _key_on(gen: VLLMServerGenerator, url: str) -> str:
    return next(k for k in (f"route-{i}" for i in itertools.count()) if gen.ring.node(k) == url)


async def _three_turns(gen: VLLMServerGenerator, trace_id: str):
    from backend.tools import ToolRegistry

    loop = AgentLoop(gen, load_tokenizer("smollm2"), tools=ToolRegistry.from_schemas([WEATHER]), config=THREE_TURNS)
    trace = await loop.run([{"role": "user", "content": "Weather in Paris, then Tokyo, then Oslo?"}], trace_id=trace_id)
    turns = [s for s in trace.steps if s.state == "generating"]
    assert len(turns) == 3 and not any(s.error for s in turns), [s.error for s in turns]
    return turns


@pytest.mark.vllm
async def test_every_turn_of_a_run_goes_to_one_server(vllm_server):
    real, alias = vllm_server.url, f"http://localhost:{vllm_server.port}"  # two URLs, one server
    gen = VLLMServerGenerator([real, alias])
    try:
        turns = await _three_turns(gen, _key_on(gen, real))
        assert [s.info.server_url for s in turns] == [real] * 3
        assert all(s.info.routing == "sticky" and s.info.failover_from is None for s in turns)
    finally:
        await gen.close()
    # per-request balancing, for contrast: the same run's turns alternate between the two URLs
    gen = VLLMServerGenerator([real, alias], routing="least_outstanding")
    try:
        turns = await _three_turns(gen, "any")
        assert len({s.info.server_url for s in turns}) == 2
    finally:
        await gen.close()


@pytest.mark.vllm
async def test_a_dead_server_fails_over_once_and_the_run_stays_on_the_next(vllm_server):
    dead, real = f"http://127.0.0.1:{free_port()}", vllm_server.url
    gen = VLLMServerGenerator([dead, real], backoff_s=0.05)
    tried: list[str] = []
    once = gen._generate_once

    async def spy(url, *a, **kw):
        tried.append(url)
        return await once(url, *a, **kw)

    gen._generate_once = spy
    key = _key_on(gen, dead)
    try:
        turns = await _three_turns(gen, key)
    finally:
        await gen.close()
    assert [s.info.server_url for s in turns] == [real] * 3
    assert turns[0].info.failover_from == dead and "Connect" in turns[0].info.failover_reason
    assert all(s.info.failover_from is None for s in turns[1:])  # later turns went straight to the real server
    assert tried == [dead, real, real, real]
    assert gen.failovers.get(key) == real
