"""Per-turn latency of constrained (tool_choice=required / a named tool) vs unconstrained generation.

On the embedded default model (SmolLM2-135M-Instruct), greedy, one request at a time (the
playground's case), for each backend asked for (vLLM in-process, transformers):

* ``required``: the first turn of "What's the weather in Paris?" under the ``required`` grammar
  (one hermes call to one of two tools, then EOS) -> n tokens, time T_c;
* unconstrained: the same prompt, ``max_tokens=n`` and ``ignore_eos`` (the same number of
  generated tokens), no constraint -> T_u;
* ``named``: the same with the named-tool grammar.

The ratio T_c / T_u is what the grammar costs per turn (mask computation per token, plus the
grammar compile on first use, reported separately as ``first_request_s``). Repetitions alternate
constrained and unconstrained; medians are reported.

    .venv/bin/python bench/bench_tool_choice.py [--backends vllm,transformers] [--reps 5] [--json]
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_temperature", "description": "Get current temperature at a location.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_local_time", "description": "Get the local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
MESSAGES = [{"role": "user", "content": "What's the weather in Paris?"}]


async def timed(gen, ids, sp, constraint=None):
    t0 = time.perf_counter()
    out = await gen.generate(ids, sp, constraint=constraint)
    return time.perf_counter() - t0, out


async def bench_backend(name: str, reps: int) -> dict:
    from backend.generators.base import SamplingParams
    from backend.generators.factory import create_generator
    from backend.loading import models
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import render
    from backend.tool_choice import build_constraint

    bundle = load_tokenizer("smollm2")
    path = models.default_model_path()
    opts = {"max_model_len": 2048, "seed": 0} if name == "vllm" else {}
    t0 = time.perf_counter()
    gen = create_generator(name, model=path, tokenizer=bundle, **opts)
    start = getattr(gen, "start", None)
    if callable(start):
        r = start()
        if asyncio.iscoroutine(r):
            await r
    start_s = time.perf_counter() - t0
    ids = render(bundle, MESSAGES, tools=TOOLS, add_generation_prompt=True).token_ids
    required = build_constraint("required", "hermes", TOOLS, max_calls=1)
    named = build_constraint("get_current_temperature", "hermes", TOOLS)
    greedy = SamplingParams(temperature=0.0, max_tokens=96)
    try:
        # a plain warm-up request (engine/kernels), then the first constrained request: compile + run
        await timed(gen, ids, SamplingParams(temperature=0.0, max_tokens=8))
        first_s, first = await timed(gen, ids, greedy, required)
        n = len(first.token_ids)
        free = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        rows = {"required": [], "named": [], "unconstrained": []}
        for rep in range(reps):
            order = [("required", required), ("named", named), ("unconstrained", None)]
            if rep % 2:
                order.reverse()
            for label, c in order:
                dt, out = await timed(gen, ids, greedy if c is not None else free, c)
                rows[label].append((dt, len(out.token_ids)))
        med = {k: statistics.median(d for d, _ in v) for k, v in rows.items()}
        toks = {k: v[0][1] for k, v in rows.items()}
        return {
            "backend": name,
            "engine_start_s": round(start_s, 1),
            "first_constrained_request_s": round(first_s, 3),
            "tokens": toks,
            "median_turn_ms": {k: round(v * 1e3, 1) for k, v in med.items()},
            "ms_per_token": {k: round(med[k] * 1e3 / max(toks[k], 1), 2) for k in med},
            "ratio_required_vs_unconstrained": round(med["required"] / med["unconstrained"], 3),
            "ratio_named_vs_unconstrained": round((med["named"] / max(toks["named"], 1)) / (med["unconstrained"] / max(toks["unconstrained"], 1)), 3),
            "forced_call_text": bundle.tokenizer.decode(first.token_ids, skip_special_tokens=False),
        }
    finally:
        await gen.close()


async def main(args) -> dict:
    out = {"machine": f"{platform.machine()} · {os.cpu_count()} cores · {platform.python_version()}", "reps": args.reps, "results": []}
    for b in args.backends.split(","):
        out["results"].append(await bench_backend(b.strip(), args.reps))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="vllm,transformers")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = asyncio.run(main(a))
    print(json.dumps(res, indent=2, ensure_ascii=False))
