"""Agent-loop overhead on a real vLLM engine: N concurrent 3-turn agent loops vs raw vLLM.

1. N agent loops (AgentLoop + VLLMEngineGenerator, greedy, fixed max_tokens) run concurrently on
   the embedded default model (SmolLM2-135M-Instruct): tool_choice forces a ``get_weather``
   call on turns 1 and 2, turn 3 is free (``auto``), ``max_assistant_turns=3``.
2. Raw vLLM replays exactly the same requests on the same engine in the same process: for each
   conversation, its turns in order, each with the prompt ids the loop sent, the same decoding
   constraint, ``max_tokens`` = the length the loop got and ``ignore_eos`` (so the generated
   lengths are identical by construction), ``FINAL_ONLY`` output and no detokenization (the
   cheapest way to drive vLLM). The N conversations run concurrently, as the loops did.
   vLLM's prefix cache is reset before each phase so both prefill the same tokens.

The ratio loop/raw is everything the inspector adds on top of vLLM: rendering and tokenizing
tool turns, parsing calls, running tools, streaming deltas across threads, building the
trace. Target: <= 1.05. Phases alternate for ``--reps`` repetitions; medians are reported.

    .venv/bin/python bench/bench_vllm_loop.py [--loops 32] [--max-tokens 48] [--reps 3] [--json out.json]
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
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

CITIES = [
    "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul", "Dakar", "Hanoi", "Rome", "Delhi",
    "Berlin", "Madrid", "Nairobi", "Denver", "Boston", "Dublin", "Lisbon", "Vienna", "Prague", "Athens", "Havana", "Manila",
    "Jakarta", "Sydney", "Toronto", "Chicago", "Houston", "Phoenix", "Austin", "Seattle",
]


def get_weather(city: str):
    """Get the current weather for a city.

    Args:
        city: The city name.
    """
    return {"city": city, "temperature_c": 10 + len(city), "conditions": "clear"}


async def run_loops(loop_factory, conversations):
    t0 = time.perf_counter()
    traces = await asyncio.gather(*[loop_factory().run(m) for m in conversations])
    return time.perf_counter() - t0, traces


def requests_from_traces(traces):
    """Per conversation, the (prompt ids, constraint, generated ids) of each generated turn."""
    from backend.generators.base import Constraint

    convs = []
    for tr in traces:
        full = list(tr.prompt_ids) + list(tr.response_ids)
        turns = []
        for st in tr.steps:
            if st.state != "generating":
                continue
            c = st.constraint
            constraint = Constraint(kind=c["kind"], spec=c["spec"]) if c else None
            turns.append((full[: st.start], constraint, full[st.start : st.end]))
        convs.append(turns)
    return convs


async def run_raw(gen, convs):
    """The same requests straight into AsyncLLM on the engine's own loop."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from backend.generators.vllm_engine import structured_outputs_params

    async def one_conv(engine, turns):
        outs = []
        for prompt, constraint, ids in turns:
            sp = VSamplingParams(
                temperature=0.0, max_tokens=len(ids), ignore_eos=True, detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY, structured_outputs=structured_outputs_params(constraint),
            )
            final = None
            async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), sp, f"raw-{uuid.uuid4().hex}"):
                final = out
            outs.append(list(final.outputs[0].token_ids))
        return outs

    async def all_convs(engine):
        t0 = time.perf_counter()
        res = await asyncio.gather(*[one_conv(engine, t) for t in convs])
        return time.perf_counter() - t0, res

    return await gen.run_on_engine(all_convs)


async def reset_prefix_cache(gen) -> None:
    """Both phases must prefill the same tokens: without this the second phase finds every
    prompt of the first in vLLM's prefix cache."""

    async def reset(engine):
        await engine.reset_prefix_cache()

    await gen.run_on_engine(reset)


async def main(args) -> dict:
    from backend import models
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.vllm_engine import VLLMEngineGenerator
    from backend.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry

    t0 = time.perf_counter()
    built = models.default_model_built()
    model = models.resolve_model(args.model)
    convert_s = None if built else time.perf_counter() - t0
    bundle = load_tokenizer("smollm2") if args.model in (None, "default", "smollm2") else load_tokenizer(model)
    gen = VLLMEngineGenerator(model, max_model_len=4096, dtype=args.dtype)
    t0 = time.perf_counter()
    await gen.start()
    start_s = time.perf_counter() - t0
    desc = gen.describe()
    registry = ToolRegistry.from_functions([get_weather])
    config = LoopConfig(
        sampling={"temperature": 0.0, "max_tokens": args.max_tokens},
        tool_choice=["get_weather", "get_weather", "auto"],
        max_assistant_turns=3,
    )

    def make_loop():
        return AgentLoop(generator=gen, tokenizer=bundle, tools=registry, config=config)

    conversations = [[{"role": "user", "content": f"What's the weather in {CITIES[i % len(CITIES)]}?"}] for i in range(args.loops)]
    # warm-up (first requests compile / allocate; constrained decoding compiles grammars)
    await run_loops(make_loop, conversations[:2])
    _, warm = await run_loops(make_loop, conversations[:2])
    await run_raw(gen, requests_from_traces(warm))

    loop_times, raw_times, match, total_turns, gen_tokens = [], [], 0, 0, 0
    turns_per_loop, reasons = [], {}
    convs = None
    nondeterministic = 0  # reps whose loops generated other ids than rep 1 (batch-dependent numerics)
    for rep in range(args.reps):
        # alternate which phase goes first (the raw phase needs the loop's requests once)
        if rep % 2 == 1 and convs is not None:
            await reset_prefix_cache(gen)
            rt, raw_out = await run_raw(gen, convs)
            await reset_prefix_cache(gen)
            lt, traces = await run_loops(make_loop, conversations)
            if requests_from_traces(traces) != convs:
                nondeterministic += 1
        else:
            await reset_prefix_cache(gen)
            lt, traces = await run_loops(make_loop, conversations)
            convs = requests_from_traces(traces)
            await reset_prefix_cache(gen)
            rt, raw_out = await run_raw(gen, convs)
        loop_times.append(lt)
        raw_times.append(rt)
        if rep == 0:
            for turns, outs in zip(convs, raw_out, strict=True):
                for (_, _, ids), raw_ids in zip(turns, outs, strict=True):
                    total_turns += 1
                    gen_tokens += len(ids)
                    match += ids == raw_ids
            turns_per_loop = [len(t) for t in convs]
            for tr in traces:
                reasons[tr.termination_reason] = reasons.get(tr.termination_reason, 0) + 1
        print(f"rep {rep + 1}: loops {lt:.2f} s, raw {rt:.2f} s, ratio {lt / rt:.3f}", flush=True)
    await gen.close()

    lt, rt = statistics.median(loop_times), statistics.median(raw_times)
    result = {
        "device": desc.get("device"),
        "model": desc.get("model"),
        "dtype": desc.get("dtype"),
        "vllm_version": desc.get("vllm_version"),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_avg_1m": os.getloadavg()[0],
        "loops": args.loops,
        "max_tokens": args.max_tokens,
        "turns_per_loop": sorted(set(turns_per_loop)),
        "termination": reasons,
        "generated_tokens": gen_tokens,
        "turns_identical_to_raw": f"{match}/{total_turns}",
        "reps_differing_from_rep1": nondeterministic,
        "engine_start_s": round(start_s, 2),
        "default_model_conversion_s": None if convert_s is None else round(convert_s, 1),
        "loop_s": [round(x, 3) for x in loop_times],
        "raw_s": [round(x, 3) for x in raw_times],
        "ratio_median": round(lt / rt, 4),
        "loop_tokens_per_s": round(gen_tokens / lt, 1),
        "raw_tokens_per_s": round(gen_tokens / rt, 1),
        "target": "ratio <= 1.05",
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":  # vLLM's CPU engine core is spawned: keep this guard
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="model folder or hub id (default: embedded SmolLM2-135M)")
    ap.add_argument("--loops", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", default=None, help="also write the result here")
    asyncio.run(main(ap.parse_args()))
