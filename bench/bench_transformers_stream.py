"""The transformers backend's generation path vs a bare ``model.generate`` on the same model.

Since issue 23 a transformers generation is a generator of plain data (``stream``: a worker
thread runs ``model.generate``, ids come back through a queue, the caller's thread relays them to
the event loop) so that on ZeroGPU the same code runs inside ``@spaces.GPU`` in a forked process.
This measures what that path costs per token where there is no ZeroGPU:

* baseline: ``model.generate`` on the loaded model, greedy, ``max_new_tokens=N``, ``ignore_eos``
  (no EOS), a streamer that only counts, in a worker thread as ours runs it (torch in the main
  thread behaves differently on a loaded machine: its OpenMP team there was 10x slower here);
* ours: ``TransformersGenerator.generate`` (the same loaded model and settings) with an
  ``on_tokens`` callback, from an event loop, as the engine calls it.

Both generate exactly N tokens from the same prompt (checked: the same ids). Repetitions
alternate the order; the medians and the paired ratios ours / baseline are reported.

    .venv/bin/python bench/bench_transformers_stream.py [--tokens 128] [--reps 7] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import paired_report, uptime  # noqa: E402


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def put(self, value) -> None:
        self.n += 1

    def end(self) -> None:
        pass


def baseline(gen, prompt: list[int], n: int) -> tuple[float, list[int]]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        return ex.submit(_baseline, gen, prompt, n).result()


def _baseline(gen, prompt: list[int], n: int) -> tuple[float, list[int]]:
    import torch
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None,
                           return_dict_in_generate=True)
    x = torch.tensor([prompt], dtype=torch.long)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = gen.model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg, streamer=_Count())
    dt = time.perf_counter() - t0
    return dt, [int(i) for i in out.sequences[0, len(prompt):].tolist()]


async def ours(gen, prompt: list[int], n: int) -> tuple[float, list[int]]:
    from backend.generators.base import SamplingParams

    got: list[int] = []
    t0 = time.perf_counter()
    g = await gen.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), on_tokens=got.extend)
    dt = time.perf_counter() - t0
    assert got == g.token_ids, "streamed ids differ from the result"
    return dt, g.token_ids


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from backend.generators.transformers_local import TransformersGenerator
    from backend.loading import models
    from backend.loading.tokenizers import load_tokenizer

    gen = TransformersGenerator(models.default_model_path()).load()
    tok = load_tokenizer("smollm2")
    prompt = tok.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about Paris."}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
    load_before = uptime()
    loop = asyncio.new_event_loop()
    baseline(gen, prompt, 8)
    loop.run_until_complete(ours(gen, prompt, 8))  # warm both
    base_t, ours_t, ratios = [], [], []
    for r in range(a.reps):
        if r % 2 == 0:
            bt, bids = baseline(gen, prompt, a.tokens)
            ot, oids = loop.run_until_complete(ours(gen, prompt, a.tokens))
        else:
            ot, oids = loop.run_until_complete(ours(gen, prompt, a.tokens))
            bt, bids = baseline(gen, prompt, a.tokens)
        assert bids == oids and len(oids) == a.tokens, "the two paths generated different ids"
        base_t.append(bt)
        ours_t.append(ot)
        ratios.append(ot / bt)
    return paired_report({
        "model": "SmolLM2-135M-Instruct (transformers, float32, CPU)", "tokens": a.tokens, "reps": a.reps,
        "baseline_ms_per_token": round(1000 * statistics.median(base_t) / a.tokens, 2),
        "ours_ms_per_token": round(1000 * statistics.median(ours_t) / a.tokens, 2),
    }, ratios, load_before, a.json)


if __name__ == "__main__":
    main()
