"""Converting the embedded model's GGUF: ``models.read_gguf_llama`` vs transformers' own loader.

The embedded default model (SmolLM2-135M-Instruct) ships as a Q4_1 GGUF and is dequantized once
into a plain Hugging Face folder, on the first run of the app, on every cold start of a Space
without persistent storage, and twice in CI. This measures the read + dequantize step both ways
on the same file, in the same process, imports done beforehand:

* baseline: ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., dtype=float32)``, what
  the build used until 2026-11-29;
* ours: ``models.read_gguf_llama`` (one GGUFReader, one tensor-name map, the same dequantizer and
  llama tensor processor).

Each repetition checks that both give the same float32 tensors. Repetitions alternate the order;
the medians and the paired ratios ours / baseline are reported, with the load average.

    .venv/bin/python bench/bench_gguf.py [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-tensor progress bar

from bench.common import paired_report, uptime  # noqa: E402


def baseline(path) -> tuple[float, dict]:
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    dt = time.perf_counter() - t0
    return dt, model.state_dict()


def ours(path) -> tuple[float, dict]:
    from backend.loading import models

    t0 = time.perf_counter()
    _, state = models.read_gguf_llama(path)
    return time.perf_counter() - t0, state


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import torch
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401 - imports outside the timings
    from transformers import logging as hf_logging

    from backend.families.smollm2 import smollm2_gguf_path

    hf_logging.set_verbosity_error()
    path = smollm2_gguf_path()
    load_before = uptime()
    base_t, ours_t, ratios = [], [], []
    for r in range(a.reps):
        if r % 2 == 0:
            bt, ref = baseline(path)
            ot, got = ours(path)
        else:
            ot, got = ours(path)
            bt, ref = baseline(path)
        assert all(torch.equal(v, ref[k]) for k, v in got.items()) and set(ref) - set(got) == {"lm_head.weight"}, \
            "the two loaders gave different tensors"
        base_t.append(bt)
        ours_t.append(ot)
        ratios.append(ot / bt)
    return paired_report({
        "file": f"{path.name} ({path.stat().st_size / 1e6:.0f} MB, {len(got)} tensors)", "reps": a.reps,
        "baseline_s": round(statistics.median(base_t), 2), "ours_s": round(statistics.median(ours_t), 2),
    }, ratios, load_before, a.json)


if __name__ == "__main__":
    main()
