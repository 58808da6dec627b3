"""Logprob lens costs (issue 14), ratios in one process:

1. **Recording**: a transformers-backend generation of N tokens with ``logprobs=0`` against
   the same generation without (same seed, same tokens), interleaved rounds.
2. **Rescoring**: ``TransformersScorer.token_logprobs`` over a sequence against a plain forward
   pass of the same ids (``model(input_ids, logits_to_keep=n)``, the floor), per 1k tokens.

    .venv/bin/python bench/bench_logprobs.py [--model PATH] [--gen-tokens 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--score-tokens", type=int, nargs="*", default=[1024, 4096], help="none: the recording part only")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    import torch

    from backend.checks.logprobs import TransformersScorer
    from backend.generators.base import SamplingParams
    from backend.generators.transformers_local import TransformersGenerator
    from backend.loading import models

    model = a.model or str(models.default_model_path())
    torch.manual_seed(0)
    gen = TransformersGenerator(model).load()
    prompt = gen.tokenizer.apply_chat_template([{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
    base = SamplingParams(temperature=1.0, max_tokens=a.gen_tokens, seed=1, ignore_eos=True)

    lengths: set[int] = set()

    async def one(lp: bool) -> float:
        t0 = time.perf_counter()
        g = await gen.generate(prompt, base.replace(logprobs=0 if lp else None))
        lengths.add(len(g.token_ids))  # the same seed: the same tokens with and without logprobs
        return time.perf_counter() - t0

    asyncio.run(one(True))  # warm-up
    off, on = [], []
    for _ in range(a.rounds):
        off.append(asyncio.run(one(False)))
        on.append(asyncio.run(one(True)))
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"record: {sorted(lengths)} tokens, median off {mo * 1000:.0f} ms, on {mn * 1000:.0f} ms, on/off {mn / mo:.3f} "
          f"(per-round ratios {', '.join(f'{y / x:.3f}' for x, y in zip(off, on, strict=True))})")

    for dtype in ("float32", "bfloat16"):
        sc = TransformersScorer(model, dtype)
        for n in a.score_tokens:
            ids = [int(x) for x in torch.randint(100, 40000, (n + 1,))]
            sc.token_logprobs(ids, 1)  # warm-up
            plain, score = [], []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                sc.forward_logits(ids, n + 1)
                plain.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sc.token_logprobs(ids, 1, temperature=0.7)
                score.append(time.perf_counter() - t0)
            mp, ms = statistics.median(plain), statistics.median(score)
            print(f"rescore {dtype} {n} tokens: plain forward {mp * 1000 / n * 1000:.0f} ms/1k tok, "
                  f"scoring {ms * 1000 / n * 1000:.0f} ms/1k tok, ratio {ms / mp:.3f}")


if __name__ == "__main__":
    main()
