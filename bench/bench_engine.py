"""Per-turn engine overhead vs re-rendering the whole conversation every turn.

A zero-latency generator (pre-tokenized script) drives a 40-turn tool-calling conversation.
For each turn we time the engine's own work: the generating step (parse + message bookkeeping)
plus the processing-tools step (tool call + incremental tokenization of the tool turn). The
baseline is what the "Tool Use, Unified" blog does each turn: apply_chat_template over the
whole conversation so far, tokenized. Both run in this process; ratios are what we report.

    .venv/bin/python bench/bench_engine.py [--turns 40] [--repeats 15] [--tokenizer PROFILE]

Every offline profile works (``--tokenizer llama3``, ``gpt-oss``, ...): its own format's turns.
``--tool-turns legacy`` times verl < 0.9's method (``verl`` where verl's way agrees with the
conversation's suffix and is then used alone; ``suffix`` where it does not, which re-renders the
conversation each tool turn); the default, ``continuous``, renders only the new messages after a
small synthetic context. The method the engine used is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from backend.engine import AgentLoop, LoopConfig  # noqa: E402
from backend.generators.base import Generation, Generator, SamplingParams  # noqa: E402
from backend.loading.tokenizers import load_tokenizer  # noqa: E402
from backend.tokens.rendering import render_ids  # noqa: E402
from backend.tools import ToolRegistry  # noqa: E402


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The city.
    """
    return {"temperature": 72, "city": city}


class PreTokenized(Generator):
    """Returns pre-computed ids instantly: the generator costs nothing."""

    name = "pretokenized"

    def __init__(self, turns: list[list[int]]):
        self.turns = turns
        self.i = 0

    async def generate(self, prompt_ids, params: SamplingParams, *, on_tokens=None, constraint=None) -> Generation:
        ids = self.turns[self.i]
        self.i += 1
        return Generation(token_ids=list(ids), finish_reason="stop")


def turn_texts(n: int, fmt: str = "hermes", bundle=None) -> list[str]:
    """``n`` tool-calling turns and a final answer, in the profile's native format (its parser's
    ``format_calls``; Harmony turns carry their channel headers and end on ``<|call|>``)."""
    from backend.parsers import get_parser

    parser = get_parser(fmt)
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul"]
    out = []
    for i in range(n):
        args = {"city": f"{cities[i % len(cities)]} {i}"}
        if bundle is not None and bundle.renderer is not None:  # Mistral v3: the model writes a 9-character id
            call = bundle.renderer.format_text_calls([{"name": "get_current_temperature", "arguments": args, "id": f"c{i:08d}"}])
        else:
            call = parser.format_calls([{"name": "get_current_temperature", "arguments": args}])
        if fmt == "harmony":
            out.append("<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant" + call + "<|call|>")
        elif fmt == "hermes":
            out.append("Let me check.\n" + call)
        else:
            out.append(call)
    out.append("<|channel|>final<|message|>All done." if fmt == "harmony" else "All done.")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--tool-turns", choices=["continuous", "legacy"], default="continuous",
                    help="the loop's tool_turns: continuous (the default; the new messages rendered in a synthetic "
                         "context) or legacy (verl < 0.9: verl's render-alone method or the conversation's suffix)")
    ap.add_argument("--tool", choices=["mock", "function"], default="mock",
                    help="mock: a JSON-schema tool with a fixed result (pure engine overhead); "
                         "function: a Python function (adds the tool runner's thread dispatch)")
    args = ap.parse_args()

    bundle = load_tokenizer(args.tokenizer)
    tok = bundle.tokenizer
    texts = turn_texts(args.turns, bundle.parser, bundle)
    stops = set(bundle.stop_token_ids)
    ids = []
    for t in texts:
        turn = bundle.encode_generated(t)
        ids.append(turn if turn[-1] in stops else [*turn, tok.eos_token_id])
    if args.tool == "mock":
        tools = ToolRegistry.from_schemas([{
            "type": "function",
            "function": {"name": "get_current_temperature", "description": "Get current temperature at a location.",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "mock": {"value": {"temperature": 72}},
        }])
    else:
        tools = ToolRegistry.from_functions([get_current_temperature])
    cfg = LoopConfig(response_length=1_000_000, max_tool_response_length=None, max_parallel_calls=1,
                     tool_turns=args.tool_turns)
    messages = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in many cities, one by one."}]

    per_turn: dict[int, list[float]] = {k: [] for k in range(1, args.turns + 1)}
    last_trace = None
    for _ in range(args.repeats):
        loop = AgentLoop(PreTokenized(ids), bundle, tools=tools, config=cfg)
        trace = asyncio.run(loop.run(messages))
        last_trace = trace
        gen_steps = [s for s in trace.steps if s.state == "generating"]
        tool_steps = [s for s in trace.steps if s.state == "processing_tools"]
        for k in range(1, args.turns + 1):
            per_turn[k].append(gen_steps[k - 1].duration_s + tool_steps[k - 1].duration_s)
    assert last_trace is not None and last_trace.termination_reason == "no_tool_calls"

    # baseline: re-render + tokenize the whole conversation before each turn
    final_msgs = last_trace.messages
    assistant_idx = [i for i, m in enumerate(final_msgs) if m["role"] == "assistant"]
    base: dict[int, list[float]] = {k: [] for k in range(1, args.turns + 1)}
    for _ in range(args.repeats):
        for k in range(1, args.turns + 1):
            upto = final_msgs[: assistant_idx[k - 1] + 2]  # conversation after turn k's tool result
            t0 = time.perf_counter()
            if bundle.renderer is not None:  # Mistral: mistral-common's encoder is the whole render
                render_ids(bundle, upto, tools.schemas, add_generation_prompt=True)
            else:
                tok.apply_chat_template(upto, tools=tools.schemas, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, chat_template=bundle.chat_template)
            base[k].append(time.perf_counter() - t0)

    med = {k: statistics.median(v) for k, v in per_turn.items()}
    bmed = {k: statistics.median(v) for k, v in base.items()}
    n = args.turns
    all_turns = statistics.median([x for v in per_turn.values() for x in v])
    res = {
        "tokenizer": args.tokenizer,
        "tool": args.tool,
        "tool_turns": args.tool_turns,
        "turns": n,
        "repeats": args.repeats,
        "final_tokens": len(last_trace.input_ids),
        "tool_turn_methods": sorted({str(s.info.method) for s in last_trace.steps if s.state == "processing_tools"}),
        "engine_median_ms_all_turns": round(all_turns * 1e3, 3),
        "engine_turn2_ms": round(med[2] * 1e3, 3),
        f"engine_turn{n}_ms": round(med[n] * 1e3, 3),
        f"engine_turn{n}_over_turn2": round(med[n] / med[2], 2),
        "baseline_turn2_ms": round(bmed[2] * 1e3, 3),
        f"baseline_turn{n}_ms": round(bmed[n] * 1e3, 3),
        f"baseline_over_engine_at_turn{n}": round(bmed[n] / med[n], 1),
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
