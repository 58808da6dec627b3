"""Tool-call parser scaling: time per byte on 128 KB vs 1 MB of broken tags, and a 1 MB argument.

Each native parser reads text full of malformed calls (thousands of errors to report) at two
sizes; the figure that matters is the ratio of time per byte (1 MB / 128 KB): ~1 for a linear
parser, ~8 for a quadratic one. Both sizes run in this process, interleaved, best of ``--reps``.

    .venv/bin/python bench/bench_parsers.py [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.parsers import get_parser  # noqa: E402

UNITS = {
    "hermes": "<tool_call>{",
    "hunyuan": "<tool_calls>[{",
    "mistral": "[TOOL_CALLS]f[ARGS]{",
    "llama3_json": '{"name": "a", "parameters": {; ',
}


def best_of(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict = {}
    for fmt, unit in UNITS.items():
        p = get_parser(fmt)
        small = unit * ((1 << 17) // len(unit))
        big = unit * ((1 << 20) // len(unit))
        ts, tb = float("inf"), float("inf")
        for _ in range(args.reps):  # interleaved, so drift on a noisy machine hits both sizes
            ts = min(ts, best_of(lambda: p.parse(small), 1))
            tb = min(tb, best_of(lambda: p.parse(big), 1))
        errors = len(p.parse(big).errors)
        arg_text = "Before. " + ("<|python_tag|>" if fmt == "llama3_json" else "") + p.format_calls(
            [{"name": "f", "arguments": {"blob": "x" * (1 << 20), "nested": {"s": '"}{][' * 1000}}}])
        ta = best_of(lambda: p.parse(arg_text), args.reps)
        out[fmt] = {
            "us_per_byte_128k": round(ts / len(small) * 1e6, 3),
            "us_per_byte_1m": round(tb / len(big) * 1e6, 3),
            "ratio_per_byte_1m_vs_128k": round((tb / len(big)) / (ts / len(small)), 2),
            "errors_in_1m": errors,
            "one_mb_argument_ms": round(ta * 1e3, 1),
        }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'parser':12} {'us/B 128K':>10} {'us/B 1M':>9} {'ratio':>6} {'errors':>7} {'1MB arg ms':>11}")
        for fmt, r in out.items():
            print(f"{fmt:12} {r['us_per_byte_128k']:>10} {r['us_per_byte_1m']:>9} {r['ratio_per_byte_1m_vs_128k']:>6} "
                  f"{r['errors_in_1m']:>7} {r['one_mb_argument_ms']:>11}")
    return out


if __name__ == "__main__":
    main()
