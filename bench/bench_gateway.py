"""The capture gateway's cost: per turn against calling the same generator directly, and how a
turn's cost grows with the conversation.

``--part overhead``: sessions of ``--turns`` turns (a call, its result, ... an answer) through the
gateway's HTTP endpoint with the ``openai`` SDK (``AsyncOpenAI``, one asyncio loop), at 1, 16 and
64 concurrent sessions, against the baseline in the same process: the same generator asked
directly for the same turns (each turn's prompt ids precomputed), at the same concurrency. The
generator is the scripted one with a per-token delay standing in for a model's decode time
(``--token-delay-ms``), or with ``--vllm`` the embedded SmolLM2 on the in-process vLLM engine
(greedy; the direct baseline then generates from the prompts the gateway built). Ratio =
gateway wall time / direct wall time, alternating reps.

``--part growth``: the gateway's own work per turn (``Gateway.turn`` in process: match the
request to the session's branch, append the new messages with the family's rule, parse, record
the capture file) with a zero-latency generator over a 40-turn session, per family (qwen3,
qwen3.5, llama3): turn 2, turn 40 and their ratio; beside it the naive cost per turn, a full
``apply_chat_template`` of the conversation, tokenized.

    .venv/bin/python bench/bench_gateway.py --part growth [--turns 40] [--repeats 5]
    .venv/bin/python bench/bench_gateway.py --part overhead [--sessions 1,16,64] [--reps 3]
    .venv/bin/python bench/bench_gateway.py --part overhead --vllm --sessions 1,16 --turns 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402

from backend.gateway.core import Gateway, TurnRequest  # noqa: E402
from backend.generators.base import Generation, Generator  # noqa: E402
from backend.generators.scripted import ScriptedGenerator  # noqa: E402
from backend.loading.tokenizers import load_tokenizer  # noqa: E402
from backend.parsers import get_parser  # noqa: E402
from backend.tokens.rendering import render_ids  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}]
SYSTEM = {"role": "system", "content": "You are a weather assistant. Look each city up before you answer."}


def call_text(bundle, city: str) -> str:
    text = get_parser(bundle.parser).format_calls([{"name": "get_current_temperature", "arguments": {"city": city}}])
    return ("I should look it up.\n</think>\n\n" + text) if bundle.name == "qwen3.5" else text


def script(bundle, turns: int) -> list[str]:
    answer = "It is 22 degrees everywhere I looked."
    return [call_text(bundle, f"City {k}") for k in range(turns - 1)] + [
        ("Done.\n</think>\n\n" + answer) if bundle.name == "qwen3.5" else answer]


class Instant(Generator):
    """Pre-encoded turns, returned at once (the gateway's own cost is what is left)."""

    name = "instant"
    decodes = False

    def __init__(self, outputs: list[list[int]]):
        self.outputs, self.k = outputs, 0

    async def generate(self, prompt_ids, params, *, on_tokens=None, constraint=None) -> Generation:
        out = self.outputs[self.k % len(self.outputs)]
        self.k += 1
        return Generation(list(out), "stop")


def assistant_echo(result) -> dict:
    m = {"role": "assistant", "content": result.content or None}
    if result.reasoning is not None:
        m["reasoning_content"] = result.reasoning
    if result.tool_calls:
        m["tool_calls"] = [{"id": c["id"], "type": "function",
                            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in result.tool_calls]
    return m


def normalized(m: dict) -> dict:
    """A message as the chat dialect hands it to the gateway (arguments decoded)."""
    from backend.gateway.chat import chat_message

    return chat_message(m, 0)


# ---- growth: the gateway's own work per turn -------------------------------------------------------


async def one_session(bundle, outputs, turns: int, folder: str, name: str, renderer: Any = None) -> tuple[list[Any], ...]:
    """One session through ``Gateway.turn``: per turn its wall and CPU time, the naive full
    render's time, and with ``renderer`` (renderers' for the family) the time of its
    ``bridge_to_next_turn`` from the previous turn's prompt and completion to this turn's prompt,
    and whether the bridge's ids equal the gateway's prompt."""
    gw = Gateway(bundle, lambda s: Instant(outputs), capture_dir=folder, served_model="bench")
    msgs = [SYSTEM, {"role": "user", "content": "Weather in 40 cities, one by one?"}]
    ours, naive, cpu, bridge, same = [], [], [], [], []
    prev, added = None, []
    for k in range(turns):
        req = TurnRequest("chat", "m", [normalized(m) for m in msgs], TOOLS, digest=f"{name}-{k}")
        t0, c0 = time.perf_counter(), time.process_time()
        r = await gw.turn(name, req)
        ours.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        render_ids(bundle, req.messages, TOOLS, add_generation_prompt=True)
        naive.append(time.perf_counter() - t0)
        if renderer is not None and prev is not None:
            t0 = time.perf_counter()
            out = renderer.bridge_to_next_turn(prev.prompt_ids, prev.token_ids, added, tools=TOOLS)
            bridge.append(time.perf_counter() - t0)
            same.append(out is not None and list(out.token_ids) == r.prompt_ids)
        prev = r
        msgs = [*msgs, assistant_echo(r)]
        added = []
        if r.tool_calls:
            added = [{"role": "tool", "tool_call_id": r.tool_calls[0]["id"], "content": json.dumps({"temperature": 22})}]
            msgs += added
    assert len(gw.sessions[name].branches) == 1, "a linear session must not fork"
    return ours, naive, cpu, bridge, same


# renderers' class for each family (renderers 0.1.12: https://pypi.org/project/renderers/)
RENDERERS = {"qwen3": "Qwen3Renderer", "qwen3.5": "Qwen35Renderer", "llama3": "Llama3Renderer"}


def renderer_for(bundle, path: str | None) -> Any:
    """renderers' renderer for ``bundle``'s family, or None when the package is not importable
    (it is not one of ours: ``pip install --no-deps --target DIR renderers==0.1.12
    prime-pydantic-config``, then ``--renderers DIR``)."""
    if path:
        sys.path.insert(0, path)
    try:
        import renderers
    except ImportError:
        return None
    name = RENDERERS.get(bundle.name)
    return getattr(renderers, name)(bundle.tokenizer) if name else None


def growth(profiles: list[str], turns: int, repeats: int, renderers_path: str | None = None) -> dict:
    out = {}
    for profile in profiles:
        bundle = load_tokenizer(profile)
        renderer = renderer_for(bundle, renderers_path)
        bridge_turn: list[list[float]] = [[] for _ in range(turns)]
        agree: list[bool] = []
        outputs = [bundle.encode_generated(t) + [bundle.tokenizer.eos_token_id] for t in script(bundle, turns)]
        per_turn: list[list[float]] = [[] for _ in range(turns)]
        naive_turn: list[list[float]] = [[] for _ in range(turns)]
        cpu_turn: list[list[float]] = [[] for _ in range(turns)]
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(one_session(bundle, outputs, turns, folder, "warm", renderer))
            for rep in range(repeats):
                ours, naive, cpu, bridge, same = asyncio.run(one_session(bundle, outputs, turns, folder, f"s{rep}", renderer))
                for k in range(turns):
                    per_turn[k].append(ours[k])
                    naive_turn[k].append(naive[k])
                    cpu_turn[k].append(cpu[k])
                for k, v in enumerate(bridge, start=1):
                    bridge_turn[k].append(v)
                agree += same
        med = [statistics.median(x) * 1000 for x in per_turn]
        nmed = [statistics.median(x) * 1000 for x in naive_turn]
        # a turn is ~3 ms: single turns are noisy on a shared machine, so each end is a window of 5
        # turns (2-6 and the last 5), every sample of them pooled
        early = statistics.median(v for k in range(1, 6) for v in per_turn[k]) * 1000
        late = statistics.median(v for k in range(turns - 5, turns) for v in per_turn[k]) * 1000
        # the same in CPU time (the process's), steadier than wall time on a loaded machine: every
        # part of a turn here runs in the process (small writes and renders on the event loop)
        cpu_early = statistics.median(v for k in range(1, 6) for v in cpu_turn[k]) * 1000
        cpu_late = statistics.median(v for k in range(turns - 5, turns) for v in cpu_turn[k]) * 1000
        out[profile] = {"turn_2_ms": round(med[1], 3), f"turn_{turns}_ms": round(med[-1], 3),
                        "turns_2_6_ms": round(early, 3), f"turns_{turns - 4}_{turns}_ms": round(late, 3),
                        "ratio": round(late / early, 3), "median_ms": round(statistics.median(med), 3),
                        "cpu_turns_2_6_ms": round(cpu_early, 3), f"cpu_turns_{turns - 4}_{turns}_ms": round(cpu_late, 3),
                        "cpu_ratio": round(cpu_late / cpu_early, 3),
                        f"naive_turn_{turns}_ms": round(nmed[-1], 3), "naive_ratio": round(nmed[-1] / nmed[1], 2)}
        if renderer is not None:
            b_early = statistics.median(v for k in range(1, 6) for v in bridge_turn[k]) * 1000
            b_late = statistics.median(v for k in range(turns - 5, turns) for v in bridge_turn[k]) * 1000
            out[profile]["renderers_bridge"] = {
                "turns_2_6_ms": round(b_early, 3), f"turns_{turns - 4}_{turns}_ms": round(b_late, 3),
                "ratio": round(b_late / b_early, 3), "equal_to_gateway_prompt": f"{sum(agree)}/{len(agree)}"}
    return out


# ---- overhead: through HTTP against the generator called directly ---------------------------------


def serve(gw):
    import uvicorn

    from backend.gateway.server import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(gw), host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    return server, th, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


async def client_sessions(url: str, n: int, turns: int, tag: str, max_tokens: int | None,
                          force: bool = False) -> list[list[int]]:
    """n sessions of ``turns`` turns through the SDK; each turn's prompt ids and tool_choice (for
    the baseline). ``force``: tool_choice required until the last turn (a model that calls no tool
    on its own), else auto."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=3600)
    prompts: list[list[int]] = []

    async def one(k: int) -> None:
        c = openai.AsyncOpenAI(base_url=f"{url}/s/{tag}-{k}/v1", api_key="bench", max_retries=0, timeout=3600)
        msgs = [SYSTEM, {"role": "user", "content": f"Weather in city {k}?"}]
        for t in range(turns):
            extra = {"return_token_ids": True}
            kw = {"max_tokens": max_tokens} if max_tokens else {}
            choice = ("required" if t < turns - 1 else "none") if force else "auto"
            r = await c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice=choice, temperature=0,
                                                extra_body=extra, **kw)
            prompts.append([choice, r.model_extra["prompt_token_ids"]])
            m = r.choices[0].message.model_dump(exclude_none=True)
            msgs.append(m)
            for tc in m.get("tool_calls") or []:
                msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": json.dumps({"temperature": 22})})
            if not m.get("tool_calls"):
                break
        await c.close()

    await asyncio.gather(*(one(k) for k in range(n)))
    await client.close()
    return prompts


class Timed(Generator):
    """The generator, each request's wall time recorded (the baseline: the generator called directly)."""

    def __init__(self, inner: Generator, spent: list[float]):
        self.inner, self.spent = inner, spent
        self.name, self.decodes = inner.name, inner.decodes

    async def generate(self, prompt_ids, params, *, on_tokens=None, constraint=None) -> Generation:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(prompt_ids, params, on_tokens=on_tokens, constraint=constraint)
        finally:
            self.spent.append(time.perf_counter() - t0)

    def context_length(self):
        return self.inner.context_length()


class TimedGateway(Gateway):
    """The gateway, each turn's wall time recorded (from the request reaching the core to its answer)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.turn_s: list[float] = []

    async def turn(self, session_name, req):
        t0 = time.perf_counter()
        try:
            return await super().turn(session_name, req)
        finally:
            self.turn_s.append(time.perf_counter() - t0)


def client_process(url: str, n: int, turns: int, tag: str, max_tokens: int, force: bool) -> tuple[float, list]:
    """The harness in a process of its own (its SDK's work is not the gateway's, and must not share
    the gateway's interpreter lock): its wall time over the sessions, and each turn's prompt ids."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", url, "--sessions", str(n), "--turns",
                          str(turns), "--tag", tag, "--max-tokens", str(max_tokens), *(["--vllm"] if force else [])],
                         capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    return d["wall_s"], d["prompts"]


def overhead(sessions: list[int], turns: int, reps: int, delay_ms: float, use_vllm: bool, max_tokens: int) -> dict:
    """Per turn: the gateway's wall time for the turn (match, append, generate, parse, write the
    capture) against the generator's own wall time inside it; the harness drives it from a process
    of its own."""
    bundle = load_tokenizer("smollm2" if use_vllm else "qwen3")
    spent: list[float] = []
    if use_vllm:
        from backend.generators.vllm_engine import VLLMEngineGenerator
        from backend.loading.models import default_model_path

        engine = VLLMEngineGenerator(default_model_path(), dtype="float32", max_model_len=4096, seed=0)
        engine.start_sync()
        shared = Timed(engine, spent)

        def gen_for(name):
            return shared
    else:
        text = script(bundle, turns)

        def gen_for(name):
            return Timed(ScriptedGenerator(bundle.tokenizer, text, token_delay_s=delay_ms / 1000,
                                           stop_token_ids=bundle.stop_token_ids, encode=bundle.encode_generated), spent)
    out = {}
    folder = tempfile.mkdtemp(prefix="bench-gateway-")
    gw = TimedGateway(bundle, gen_for, capture_dir=folder, served_model="bench", max_tokens=max_tokens, owns_generators=False)
    server, th, url = serve(gw)
    try:
        client_process(url, 1, turns, "warm", max_tokens, use_vllm)  # first compile, caches
        for n in sessions:
            ratios, walls = [], []
            for rep in range(reps):
                gw.turn_s.clear()
                spent.clear()
                wall, prompts = client_process(url, n, turns, f"n{n}r{rep}", max_tokens, use_vllm)
                assert len(gw.turn_s) == len(spent) == len(prompts), (len(gw.turn_s), len(spent), len(prompts))
                ratios.append(sum(gw.turn_s) / sum(spent))
                walls.append(wall)
            own_ms = statistics.median(t - g for t, g in zip(gw.turn_s, spent)) * 1000
            out[f"{n} sessions"] = {"turns": len(prompts), "harness_wall_s": [round(x, 3) for x in walls],
                                    "ratios": [round(r, 4) for r in ratios], "median_ratio": round(statistics.median(ratios), 4),
                                    "gateway_ms_per_turn": round(own_ms, 2),
                                    "generate_ms_per_turn": round(statistics.median(spent) * 1000, 1)}
    finally:
        server.should_exit = True
        th.join(30)
        if use_vllm:
            engine.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("growth", "overhead"), default="growth")
    p.add_argument("--profiles", default="qwen3,qwen3.5,llama3")
    p.add_argument("--turns", type=int, default=None, help="turns per session (growth: 40; overhead: 4)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sessions", default="1,16,64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--token-delay-ms", type=float, default=5.0, help="the scripted model's decode time per token")
    p.add_argument("--vllm", action="store_true", help="the embedded model on the in-process vLLM engine")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--json", action="store_true")
    p.add_argument("--renderers", help="growth: a folder holding renderers 0.1.12 (pip install --no-deps --target DIR "
                                       "renderers==0.1.12 prime-pydantic-config): its bridge_to_next_turn timed beside")
    p.add_argument("--client", help=argparse.SUPPRESS)  # internal: run the harness against this URL
    p.add_argument("--tag", default="s", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.client:
        import httpx
        import openai  # noqa: F401 - imported before the clock starts

        httpx.get(f"{a.client}/v1/models")  # the server is up and answering
        t0 = time.perf_counter()
        prompts = asyncio.run(client_sessions(a.client, int(a.sessions), a.turns or 4, a.tag, a.max_tokens, a.vllm))
        print(json.dumps({"wall_s": time.perf_counter() - t0, "prompts": prompts}))
        return
    load = common.uptime()
    if a.part == "growth":
        res = {"part": "growth", "load_before": load,
               "figures": growth(a.profiles.split(","), a.turns or 40, a.repeats, a.renderers)}
    else:
        res = {"part": "overhead", "backend": "vllm (SmolLM2-135M, float32)" if a.vllm else f"scripted, {a.token_delay_ms} ms/token",
               "load_before": load,
               "figures": overhead([int(x) for x in a.sessions.split(",")], a.turns or 4, a.reps, a.token_delay_ms, a.vllm,
                                   a.max_tokens)}
    res["load_after"] = common.uptime()
    print(json.dumps(res, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
