"""Tool-call parser scaling: time per byte on 128 KB vs 1 MB of broken tags, and a 1 MB argument.

Each native parser reads text full of malformed calls (thousands of errors to report) at two
sizes; the figure that matters is the ratio of time per byte (1 MB / 128 KB): ~1 for a linear
parser, ~8 for a quadratic one. Both sizes run in this process, interleaved, best of ``--reps``.

    .venv/bin/python bench/bench_parsers.py [--reps 5] [--parsers hermes,glm45] [--sweep] [--json]
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
    # added 2026-11-25: each unit opens a call it never closes, so a parser that looks ahead for
    # the closing tag from every opening one would be quadratic
    "qwen3_xml": "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n",
    "harmony": "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{",
    "glm45": "<tool_call>f\n<arg_key>a",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{",
    "pythonic": "<|python_start|>[f(a=null)]",
    "granite": "<|tool_call|>[{",
    "phi4_mini_json": "functools[{",
}
# what comes before the one call with a 1 MB argument (default "Before. "): the text a model writes
# before its calls in that format (pythonic and Phi-4 calls start the turn; Harmony's text is a message)
ARG_PREFIX = {
    "llama3_json": "Before. <|python_tag|>",
    "pythonic": "",
    "phi4_mini_json": "",
    "harmony": "<|channel|>analysis<|message|>Before.<|end|><|start|>assistant",
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
    ap.add_argument("--parsers", default="", help="comma-separated parsers (default: all of UNITS)")
    ap.add_argument("--sweep", action="store_true", help="also time each unit at 2^15 ... 2^20 bytes (best of --reps)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    wanted = [f.strip() for f in args.parsers.split(",") if f.strip()] or list(UNITS)
    if set(wanted) - set(UNITS):
        ap.error(f"no unit for {sorted(set(wanted) - set(UNITS))}; units: {', '.join(UNITS)}")
    out: dict = {}
    for fmt, unit in ((f, UNITS[f]) for f in wanted):
        p = get_parser(fmt)
        small = unit * ((1 << 17) // len(unit))
        big = unit * ((1 << 20) // len(unit))
        ts, tb = float("inf"), float("inf")
        for _ in range(args.reps):  # interleaved, so drift on a noisy machine hits both sizes
            ts = min(ts, best_of(lambda: p.parse(small), 1))
            tb = min(tb, best_of(lambda: p.parse(big), 1))
        errors = len(p.parse(big).errors)
        arg_text = ARG_PREFIX.get(fmt, "Before. ") + p.format_calls(
            [{"name": "f", "arguments": {"blob": "x" * (1 << 20), "nested": {"s": '"}{][' * 1000}}}])
        ta = best_of(lambda: p.parse(arg_text), args.reps)
        read = p.parse(arg_text)  # the call must be read, or the figure times nothing
        arg_ok = len(read.tool_calls) == 1 and not read.errors and len(read.tool_calls[0].arguments.get("blob", "")) == 1 << 20
        out[fmt] = {
            "us_per_byte_128k": round(ts / len(small) * 1e6, 3),
            "us_per_byte_1m": round(tb / len(big) * 1e6, 3),
            "ratio_per_byte_1m_vs_128k": round((tb / len(big)) / (ts / len(small)), 2),
            "errors_in_1m": errors,
            "one_mb_argument_ms": round(ta * 1e3, 1),
            "one_mb_argument_read": arg_ok,
        }
        if args.sweep:
            sweep = {}
            for e in range(15, 21):
                t = unit * ((1 << e) // len(unit))
                sweep[f"2^{e}"] = round(best_of(lambda: p.parse(t), args.reps) / len(t) * 1e6, 3)
            out[fmt]["sweep_us_per_byte"] = sweep
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'parser':14} {'us/B 128K':>10} {'us/B 1M':>9} {'ratio':>6} {'errors':>7} {'1MB arg ms':>11}")
        for fmt, r in out.items():
            print(f"{fmt:14} {r['us_per_byte_128k']:>10} {r['us_per_byte_1m']:>9} {r['ratio_per_byte_1m_vs_128k']:>6} "
                  f"{r['errors_in_1m']:>7} {r['one_mb_argument_ms']:>11}{'' if r['one_mb_argument_read'] else '  (call not read!)'}")
            if "sweep_us_per_byte" in r:
                print("    us/byte at " + ", ".join(f"{k}: {v}" for k, v in r["sweep_us_per_byte"].items()))
        print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return out


if __name__ == "__main__":
    main()
