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
trace. Target: <= 1.05 (issue 3), <= 1.03 (issue 24).

Repetitions are **paired and alternating** (``--reps`` pairs, 6 by default): pair 1 runs loop
then raw, pair 2 raw then loop, and so on (the raw phase replays the latest loop phase's
requests). Each pair gives one ratio loop / raw; the figure is the **median of the paired
ratios**, with their min and max (the ratio of the two phases' medians is printed beside it, as
earlier versions reported it). Whichever phase runs second in a pair may be favoured or not
(a machine's load changes, the engine's state after the first), so an even number of pairs
runs both orders equally often; the medians per order and the geometric mean of each
loop-first pair with the raw-first pair after it (an order-balanced ratio) are reported too.

Every turn whose generated ids differ from raw vLLM's is explained. The loop's generator is
wrapped (a subclass that records, per vLLM request id, the prompt ids handed to
``AsyncLLM.generate``, the decoding constraint and the ids vLLM returned; the cost is one dict
entry per request and one extra call per streamed delta), and each differing turn is one of:

* ``numerics``: the loop sent vLLM the same prompt ids and constraint as the raw replay, and the
  trace holds exactly what vLLM returned to the loop; greedy decoding diverged because the two
  phases batched requests differently (batch-dependent numerics of a CPU engine). Each such turn
  is also run alone afterwards (prefix cache reset) to show which side a batch of one agrees with.
* ``prompt``: the loop sent other prompt ids than its trace says (a real difference in the ids the
  loop sends): the first differing position and the decoded tokens around it are printed.
* ``trace``: the trace holds other generated ids than vLLM returned to the loop.
* ``constraint``: the loop's decoding constraint differs from the one the replay rebuilt from the
  trace.

Anything but ``numerics`` is a bug.

Each phase also reports its CPU seconds (user + system) in this process (the agent loops on the
main thread, vLLM's output handling on the engine's thread) and in vLLM's engine-core process
(scheduling, forward passes): on a machine with few cores, the loop's own work competes with
the engine for them. And the mean number of requests in vLLM while it ran (sampled every 0.1 s):
fewer requests in flight means smaller batches, so more engine steps for the same tokens.

    .venv/bin/python bench/bench_vllm_loop.py [--loops 32] [--max-tokens 48] [--reps 6] [--kv-gib 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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


def recording_generator(model: str, **kw):
    """A VLLMEngineGenerator that records what the loop hands to vLLM and what comes back:
    ``sent[request_id] = {"prompt": ids, "so": constraint fields, "out": ids vLLM returned}``."""
    from backend.generators.vllm_engine import VLLMEngineGenerator

    class Recording(VLLMEngineGenerator):
        sent: dict[str, dict] = {}

        async def _produce(self, request_id, prompt_ids, vparams, push):
            rec = self.sent[request_id] = {"prompt": prompt_ids, "so": so_fields(vparams.structured_outputs), "out": None}

            def tap(item):
                if isinstance(item, dict):
                    rec["out"] = item["ids"]
                push(item)

            await super()._produce(request_id, prompt_ids, vparams, tap)

    gen = Recording(model, **kw)
    gen.sent = {}
    return gen


def so_fields(so) -> dict | None:
    """The public fields of a ``StructuredOutputsParams`` (vLLM sets private ones while it runs)."""
    if so is None:
        return None
    return {f.name: getattr(so, f.name) for f in dataclasses.fields(so) if not f.name.startswith("_")}


async def run_loops(loop_factory, conversations):
    t0 = time.perf_counter()
    traces = await asyncio.gather(*[loop_factory().run(m) for m in conversations])
    return time.perf_counter() - t0, traces


@dataclasses.dataclass
class Turn:
    prompt: list[int]  # the prompt the trace says the loop sent (what the raw replay sends)
    constraint: object  # backend.generators.base.Constraint or None
    ids: list[int]  # the ids the trace holds for the turn
    request_id: str | None  # the loop's vLLM request id (StepInfo.request_id)


def requests_from_traces(traces) -> list[list[Turn]]:
    """Per conversation, its generated turns."""
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
            turns.append(Turn(full[: st.start], constraint, full[st.start : st.end], getattr(st.info, "request_id", None)))
        convs.append(turns)
    return convs


def same_requests(a: list[list[Turn]], b: list[list[Turn]]) -> bool:
    return [[(t.prompt, t.ids) for t in c] for c in a] == [[(t.prompt, t.ids) for t in c] for c in b]


async def run_raw(gen, convs, *, alone: bool = False):
    """The same requests straight into AsyncLLM on the engine's own loop (all conversations
    concurrently; with ``alone``, one request at a time)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from backend.generators.vllm_engine import structured_outputs_params

    async def one(engine, turn: Turn):
        sp = VSamplingParams(
            temperature=0.0, max_tokens=len(turn.ids), ignore_eos=True, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY, structured_outputs=structured_outputs_params(turn.constraint),
        )
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=turn.prompt), sp, f"raw-{uuid.uuid4().hex}"):
            final = out
        return list(final.outputs[0].token_ids)

    async def one_conv(engine, turns):
        return [await one(engine, t) for t in turns]

    async def all_convs(engine):
        t0 = time.perf_counter()
        if alone:
            res = [await one_conv(engine, t) for t in convs]
        else:
            res = await asyncio.gather(*[one_conv(engine, t) for t in convs])
        return time.perf_counter() - t0, res

    return await gen.run_on_engine(all_convs)


async def reset_prefix_cache(gen) -> None:
    """Both phases must prefill the same tokens: without this the second phase finds every
    prompt of the first in vLLM's prefix cache."""

    async def reset(engine):
        await engine.reset_prefix_cache()

    await gen.run_on_engine(reset)


def cpu_seconds() -> tuple[float, float]:
    """CPU time (user + system) so far of this process (the agent loops, the engine's thread) and
    of its children (vLLM's engine core: scheduler and forward passes)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    kids = 0.0
    for c in me.children(recursive=True):
        try:
            ct = c.cpu_times()
            kids += ct.user + ct.system
        except psutil.Error:
            pass
    return t.user + t.system, kids


async def timed_cpu(gen, coro):
    """(result of ``coro``, CPU seconds it took in this process, in the engine core, the mean
    number of requests in vLLM while it ran: sampled every 0.1 s)."""
    counts: list[int] = []

    async def sample():
        while True:
            counts.append(gen.num_unfinished_requests())
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    a = cpu_seconds()
    try:
        res = await coro
    finally:
        sampler.cancel()
    b = cpu_seconds()
    return res, round(b[0] - a[0], 2), round(b[1] - a[1], 2), round(statistics.fmean(counts), 1) if counts else None


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def around(tok, ids: list[int], i: int, width: int = 6) -> str:
    """The decoded tokens around position ``i``, the one at ``i`` in brackets."""
    lo, hi = max(0, i - width), min(len(ids), i + width + 1)
    parts = [tok.decode([t], skip_special_tokens=False) for t in ids[lo:hi]]
    if lo <= i < hi:
        parts[i - lo] = "⟦" + parts[i - lo] + "⟧"
    return repr("".join(parts))


def classify(turn: Turn, raw_out: list[int], sent: dict, raw_so: dict | None, tok) -> dict:
    """Why the loop's ids for ``turn`` differ from the raw replay's ``raw_out``."""
    rec = sent.get(turn.request_id)
    d: dict = {"tokens": len(turn.ids)}
    if rec is None:
        return {**d, "kind": "unrecorded", "detail": f"no request {turn.request_id!r} recorded for this turn"}
    p = first_diff(list(rec["prompt"]), turn.prompt)
    if p is not None:
        return {**d, "kind": "prompt", "prompt_tokens": [len(rec["prompt"]), len(turn.prompt)], "first_diff": p,
                "loop_sent": around(tok, list(rec["prompt"]), p), "trace_says": around(tok, turn.prompt, p)}
    if rec["out"] != turn.ids:
        q = first_diff(rec["out"] or [], turn.ids)
        return {**d, "kind": "trace", "first_diff": q, "vllm_returned": around(tok, rec["out"] or [], q),
                "trace_holds": around(tok, turn.ids, q)}
    if rec["so"] != raw_so:
        return {**d, "kind": "constraint", "loop": repr(rec["so"])[:300], "raw": repr(raw_so)[:300]}
    q = first_diff(turn.ids, raw_out)
    return {**d, "kind": "numerics", "first_diff": q, "loop": around(tok, turn.ids, q), "raw": around(tok, raw_out, q)}


async def main(args) -> dict:
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.vllm_engine import structured_outputs_params
    from backend.loading import models
    from backend.loading.tokenizers import load_tokenizer
    from backend.tools import ToolRegistry

    load_start = os.getloadavg()
    t0 = time.perf_counter()
    built = models.default_model_built()
    model = models.resolve_model(args.model)
    convert_s = None if built else time.perf_counter() - t0
    bundle = load_tokenizer("smollm2") if args.model in (None, "default", "smollm2") else load_tokenizer(model)
    tok = bundle.tokenizer
    gen = recording_generator(model, max_model_len=4096, dtype=args.dtype)
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

    cpu: dict[str, list] = {"loop": [], "raw": []}  # per phase: (this process, engine core) CPU seconds
    in_flight: dict[str, list] = {"loop": [], "raw": []}  # per phase: mean requests in vLLM

    async def loop_phase():
        gen.sent = {}
        await reset_prefix_cache(gen)
        (lt, traces), mine, core, n = await timed_cpu(gen, run_loops(make_loop, conversations))
        cpu["loop"].append([mine, core])
        in_flight["loop"].append(n)
        return lt, traces, requests_from_traces(traces), gen.sent

    async def raw_phase(convs):
        await reset_prefix_cache(gen)
        res, mine, core, n = await timed_cpu(gen, run_raw(gen, convs))
        cpu["raw"].append([mine, core])
        in_flight["raw"].append(n)
        return res

    pairs, first = [], None
    diffs: list[dict] = []  # one per differing turn per pair
    reasons: dict = {}
    for p in range(args.reps):
        load0 = os.getloadavg()[0]
        if p % 2 == 0:  # loop, raw
            lt, traces, convs, sent = await loop_phase()
            rt, raw_out = await raw_phase(convs)
            order = "loop,raw"
        else:  # raw (replays the latest loop phase), loop
            rt, raw_out = await raw_phase(convs)
            replayed, replayed_sent = convs, sent
            lt, traces, convs, sent = await loop_phase()
            order = "raw,loop"
        if p % 2 == 0:
            replayed, replayed_sent = convs, sent
        if first is None:
            first = convs
            for tr in traces:
                reasons[tr.termination_reason] = reasons.get(tr.termination_reason, 0) + 1
        n_turns = sum(len(c) for c in replayed)
        n_diff = 0
        for ci, (turns, outs) in enumerate(zip(replayed, raw_out, strict=True)):
            for ti, (turn, raw_ids) in enumerate(zip(turns, outs, strict=True)):
                if turn.ids != raw_ids:
                    n_diff += 1
                    raw_so = so_fields(structured_outputs_params(turn.constraint))
                    diffs.append({"pair": p + 1, "conversation": ci, "turn": ti + 1,
                                  **classify(turn, raw_ids, replayed_sent, raw_so, tok), "_turn": turn, "_raw": raw_ids})
        pair = {"order": order, "loop_s": round(lt, 3), "raw_s": round(rt, 3), "ratio": round(lt / rt, 4),
                "cpu_s_loop": cpu["loop"][-1], "cpu_s_raw": cpu["raw"][-1],
                "mean_in_flight_loop": in_flight["loop"][-1], "mean_in_flight_raw": in_flight["raw"][-1],
                "turns_identical": f"{n_turns - n_diff}/{n_turns}", "loop_same_ids_as_pair1": same_requests(convs, first),
                "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        pairs.append(pair)
        print(f"pair {p + 1} ({order}): loop {lt:.2f} s, raw {rt:.2f} s, ratio {lt / rt:.3f}, "
              f"CPU s (this process / engine core) loop {pair['cpu_s_loop']} raw {pair['cpu_s_raw']}, "
              f"mean requests in vLLM loop {pair['mean_in_flight_loop']} raw {pair['mean_in_flight_raw']}, "
              f"identical turns {pair['turns_identical']}, load {pair['load_1m'][0]} -> {pair['load_1m'][1]}", flush=True)

    # each differing turn (its first occurrence) once more, alone: which side does a batch of one agree with?
    seen, solo = set(), []
    for d in diffs:
        key = (d["conversation"], d["turn"])
        if d["kind"] == "numerics" and key not in seen and len(seen) < args.solo:
            seen.add(key)
            solo.append(d)
    for d in solo:
        await reset_prefix_cache(gen)
        _, (out,) = await run_raw(gen, [[d["_turn"]]], alone=True)
        alone = out[0]
        d["alone_agrees_with"] = ("both" if alone == d["_turn"].ids == d["_raw"] else "loop" if alone == d["_turn"].ids
                                  else "raw" if alone == d["_raw"] else "neither")
    await gen.close()

    gen_tokens = sum(len(t.ids) for c in first for t in c)
    ratios = [x["ratio"] for x in pairs]
    loop_times, raw_times = [x["loop_s"] for x in pairs], [x["raw_s"] for x in pairs]
    kinds: dict = {}
    for d in diffs:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    total = sum(int(x["turns_identical"].split("/")[1]) for x in pairs)
    result = {
        "device": desc.get("device"),
        "model": desc.get("model"),
        "dtype": desc.get("dtype"),
        "vllm_version": desc.get("vllm_version"),
        "env_set": gen.env_set,
        "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "loops": args.loops,
        "max_tokens": args.max_tokens,
        "turns_per_loop": sorted({len(t) for t in first}),
        "termination": reasons,
        "generated_tokens": gen_tokens,
        "engine_start_s": round(start_s, 2),
        "default_model_conversion_s": None if convert_s is None else round(convert_s, 1),
        "pairs": pairs,
        "ratio_median_of_pairs": round(statistics.median(ratios), 4),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_of_medians": round(statistics.median(loop_times) / statistics.median(raw_times), 4),
        "ratio_median_loop_first": round(statistics.median(ratios[0::2]), 4),
        "ratio_median_raw_first": round(statistics.median(ratios[1::2]), 4) if len(ratios) > 1 else None,
        # each loop-first pair with the raw-first pair after it: the order effect cancels
        "ratio_order_balanced": [round((a * b) ** 0.5, 4) for a, b in zip(ratios[0::2], ratios[1::2])],
        "cpu_s_median": {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in cpu.items()},
        "loop_tokens_per_s": round(gen_tokens / statistics.median(loop_times), 1),
        "raw_tokens_per_s": round(gen_tokens / statistics.median(raw_times), 1),
        "turns_identical_to_raw": f"{total - len(diffs)}/{total}",
        "differing_turns_by_kind": kinds,
        "differing_turns": [{k: v for k, v in d.items() if not k.startswith("_")} for d in diffs],
        "loop_pairs_with_other_ids_than_pair1": sum(not x["loop_same_ids_as_pair1"] for x in pairs),
        "target": "median of paired ratios <= 1.03 (issue 24; <= 1.05, issue 3)",
    }
    for d in result["differing_turns"]:
        print(f"differs: pair {d['pair']}, conversation {d['conversation']}, turn {d['turn']}: {d['kind']} "
              + ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("pair", "conversation", "turn", "kind")), flush=True)
    print(f"differing turns by kind: {kinds or 'none'}")
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
    ap.add_argument("--reps", type=int, default=6, help="paired repetitions (loop/raw, then raw/loop, ...)")
    ap.add_argument("--solo", type=int, default=8, help="differing turns re-run alone (batch of one), at most")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-gib", type=int, default=None,
                    help="VLLM_CPU_KVCACHE_SPACE (GiB; the product sets 1 when unset: 46,592 tokens in bf16, less "
                    "than 128 loops' conversations; 4 holds them all)")
    ap.add_argument("--json", default=None, help="also write the result here")
    parsed = ap.parse_args()
    if parsed.kv_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(parsed.kv_gib)
    asyncio.run(main(parsed))
