"""Sticky routing vs per-turn balancing across two real vLLM CPU servers (issue 16).

Two ``python -m vllm.entrypoints.openai.api_server`` processes on the embedded default model
(SmolLM2-135M-Instruct), each with prefix caching on, a small KV cache and ``max_model_len``,
each bound to one core. 16 agent loops run concurrently through our engine with the
``vllm-server`` backend given both URLs: tool_choice forces a ``get_weather`` call on turns 1
and 2, turn 3 is free, ``max_assistant_turns=3`` (every conversation has 3 assistant turns).
Each conversation opens with its own case file (a few hundred tokens of its own text), as an
agent's task does, so its prefix is its own and not only the shared template/tool header.

* phase ``sticky``: ``routing="sticky"`` (consistent hashing on the conversation: every turn on
  one server);
* phase ``balanced``: ``routing="least_outstanding"`` (every request to the server with the
  fewest in flight, ties in turn: per-turn balancing).

Before each phase both servers' prefix caches are reset (``POST /reset_prefix_cache``, vLLM's
dev-mode endpoint, ``VLLM_SERVER_DEV_MODE=1``). Phases alternate for ``--reps`` repetitions.

How turn 2+ is isolated: the loops' second turns wait at a barrier until every loop's first
turn has finished; at the barrier the bench reads both servers' ``/metrics`` (Prometheus
counters ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``: prompt
tokens looked up in the prefix cache and tokens found there, counted when a request is first
scheduled). The counters' increase from the barrier to the end of the phase is therefore
exactly the turn-2+ requests' prompt tokens and cache hits; the bench checks that the queries
delta equals the turn-2+ prompt tokens it sent (from the traces). Hit rate = hits / queries.
The barrier costs both phases the same (the slowest first turn); wall clock is timed from the
start of the loops to the last one's end.

    .venv/bin/python bench/bench_routing.py [--loops 16] [--reps 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import urllib.request
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul", "Dakar", "Hanoi", "Rome", "Delhi",
          "Berlin", "Madrid", "Nairobi", "Denver"]
TOPICS = ["a delayed shipment of bicycle parts", "a broken office heater", "a late library book", "a lost train ticket",
          "a noisy neighbour's dog", "a missing museum painting", "a flooded basement", "a stolen garden gnome",
          "a mislabelled wine crate", "a cancelled concert", "a leaking roof", "a jammed printer",
          "a runaway balloon", "a wrong pizza order", "a stuck elevator", "a misplaced passport"]
METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


# the city is an enum: the forced call's arguments are bounded, so no turn runs out of max_tokens
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}}, "required": ["city"]}},
    "mock": {"template": "{city}: 14 C, clear sky, wind 3 m/s from the west"}}


def case_file(i: int) -> str:
    """Conversation i's own opening text (~300 tokens, nothing shared with the others but the wording)."""
    city, topic = CITIES[i % len(CITIES)], TOPICS[i % len(TOPICS)]
    lines = [f"Case {1000 + i}: {topic} in {city}."]
    for j in range(12):
        lines.append(f"Note {j + 1} of case {1000 + i}: witness {chr(65 + (i + j) % 26)}{(i * 7 + j * 13) % 97} reported "
                     f"{topic} near {city} street {(i * 31 + j * 17) % 200}, at {(i + j) % 24:02d}:{(i * j) % 60:02d}.")
    lines.append(f"First check the weather in {city}, then once more, then summarise the case.")
    return "\n".join(lines)


def read_metrics(url: str) -> dict[str, float]:
    """The prefix-cache counters of one server (summed over its label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = dict.fromkeys(METRICS, 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


def reset_cache(url: str) -> None:
    for _ in range(50):
        req = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=30) as r:
            if json.loads(r.read() or b"{}").get("success", True):
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url}: prefix cache reset kept failing")


def make_generator(urls, routing, n_loops, snapshots):
    """A VLLMServerGenerator whose second turns wait until all first turns are done; the
    servers' counters are read at that moment (``snapshots["turn1"]``)."""
    from backend.generators.base import conversation_key
    from backend.generators.vllm_server import VLLMServerGenerator

    class BarrierGenerator(VLLMServerGenerator):
        def __init__(self) -> None:
            super().__init__(urls, routing=routing, timeout_s=600)
            self.turn_of: Counter[str] = Counter()
            self.first_done = 0
            self.released = asyncio.Event()

        async def _generate(self, request):
            key = conversation_key.get()
            turn = self.turn_of[key]
            self.turn_of[key] += 1
            if turn >= 1:
                await self.released.wait()
            try:
                return await super()._generate(request)
            finally:
                if turn == 0:
                    self.first_done += 1
                    if self.first_done == n_loops:
                        snapshots["turn1"] = {u: await asyncio.to_thread(read_metrics, u) for u in urls}
                        self.released.set()

    return BarrierGenerator()


async def run_phase(urls, routing, bundle, registry, config, conversations, tag):
    from backend.engine import AgentLoop

    for u in urls:
        await asyncio.to_thread(reset_cache, u)
    snapshots = {"start": {u: await asyncio.to_thread(read_metrics, u) for u in urls}}
    load_before = os.getloadavg()[0]
    gen = make_generator(urls, routing, len(conversations), snapshots)
    t0 = time.perf_counter()
    try:
        traces = await asyncio.gather(*[
            AgentLoop(generator=gen, tokenizer=bundle, tools=registry, config=config).run(m, trace_id=f"{tag}-conv-{i}")
            for i, m in enumerate(conversations)])
    finally:
        wall = time.perf_counter() - t0
        await gen.close()
    snapshots["end"] = {u: await asyncio.to_thread(read_metrics, u) for u in urls}
    q, h = METRICS

    def delta(a, b, name):
        return sum(snapshots[b][u][name] - snapshots[a][u][name] for u in urls)

    turns = [[s for s in t.steps if s.state == "generating"] for t in traces]
    errors = [s.error for ts in turns for s in ts if s.error]
    later_prompt_tokens = sum(s.start for ts in turns for s in ts[1:])
    same_server = sum(s.info.server_url == ts[0].info.server_url for ts in turns for s in ts[1:])
    res = {
        "routing": routing,
        "wall_s": round(wall, 3),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after
        "turns_per_loop": sorted(Counter(len(ts) for ts in turns).items()),
        "termination": dict(Counter(str(t.termination_reason) for t in traces)),
        "finish_reasons": dict(Counter(str(s.finish_reason) for ts in turns for s in ts)),
        "errors": errors[:3],
        "turn1_queries": delta("start", "turn1", q),
        "turn1_hits": delta("start", "turn1", h),
        "turn2plus_queries": delta("turn1", "end", q),
        "turn2plus_hits": delta("turn1", "end", h),
        "turn2plus_prompt_tokens_sent": later_prompt_tokens,
        "turn2plus_same_server_as_turn1": f"{same_server}/{sum(len(ts) - 1 for ts in turns)}",
        "requests_per_server": dict(Counter(s.info.server_url for ts in turns for s in ts)),
        "generated_tokens": sum(s.end - s.start for ts in turns for s in ts),
    }
    res["turn2plus_hit_rate"] = round(res["turn2plus_hits"] / res["turn2plus_queries"], 4) if res["turn2plus_queries"] else None
    res["turn1_hit_rate"] = round(res["turn1_hits"] / res["turn1_queries"], 4) if res["turn1_queries"] else None
    return res, traces


async def main(args) -> dict:
    from vllm_servers import LocalVLLMServer

    from backend.engine import LoopConfig
    from backend.loading import models
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry

    model = models.resolve_model(None)
    bundle = load_tokenizer("smollm2")
    registry = ToolRegistry.from_schemas([WEATHER])
    config = LoopConfig(sampling={"temperature": 0.0, "max_tokens": args.max_tokens},
                        tool_choice=["get_weather", "get_weather", "auto"], max_assistant_turns=3)
    conversations = [[{"role": "user", "content": case_file(i)}] for i in range(args.loops)]

    server_args = ["--max-model-len", str(args.max_model_len), "--enable-prefix-caching", "--block-size", str(args.block_size),
                   "--seed", "0", "--max-num-seqs", str(args.loops)]
    cores = sorted(os.sched_getaffinity(0))
    servers = [LocalVLLMServer(model, extra_args=server_args, env={
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": str(cores[i % len(cores)])}) for i in range(2)]
    t0 = time.perf_counter()
    try:
        for s in servers:  # one after the other: two starting at once on 2 cores thrash
            s.start(timeout_s=600)
        start_s = time.perf_counter() - t0
        urls = [s.url for s in servers]
        print(f"servers ready in {start_s:.1f} s: {urls}", flush=True)
        # warm-up: grammars compiled, buffers allocated, on both servers
        await run_phase(urls, "least_outstanding", bundle, registry, config, conversations[:4], "warm")
        phases: dict[str, list[dict]] = {"sticky": [], "least_outstanding": []}
        for rep in range(args.reps):
            order = ["sticky", "least_outstanding"] if rep % 2 == 0 else ["least_outstanding", "sticky"]
            for routing in order:
                res, _ = await run_phase(urls, routing, bundle, registry, config, conversations, f"r{rep}")
                phases[routing].append(res)
                print(f"rep {rep + 1} {routing}: {json.dumps(res)}", flush=True)
    finally:
        for s in servers:
            s.stop()
    st, bal = phases["sticky"], phases["least_outstanding"]
    ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(st, bal, strict=True)]
    return {
        "model": os.path.basename(model),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "loops": args.loops,
        "server_args": server_args,
        "kv_cache_gib_per_server": args.kv_gib,
        "server_start_s": round(start_s, 1),
        "uptime_after": os.popen("uptime").read().strip(),
        "sticky_turn2plus_hit_rate": [r["turn2plus_hit_rate"] for r in st],
        "balanced_turn2plus_hit_rate": [r["turn2plus_hit_rate"] for r in bal],
        "sticky_turn2plus_tokens_recomputed": [r["turn2plus_queries"] - r["turn2plus_hits"] for r in st],
        "balanced_turn2plus_tokens_recomputed": [r["turn2plus_queries"] - r["turn2plus_hits"] for r in bal],
        "sticky_wall_s": [r["wall_s"] for r in st],
        "balanced_wall_s": [r["wall_s"] for r in bal],
        "wall_ratio_sticky_over_balanced": [round(x, 3) for x in ratios],
        "wall_ratio_median": round(statistics.median(ratios), 3),
        "phases": phases,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=32, help="KV block size (vLLM CPU default 128)")
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per server")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = asyncio.run(main(a))
    print(json.dumps({k: v for k, v in out.items() if k != "phases"}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
