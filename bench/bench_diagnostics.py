"""Benchmark: token-level diagnostics (retokenization drift, mask mismatch) on long traces.

Both checks align the loop's token ids with a re-render of the final messages. Measured, in the
same process, for engine-made traces (scripted model, qwen3 profile, token-exact) of growing
length:

* ``check``: :func:`backend.checks.diagnostics.check` as the app and ``python -m backend check`` run it
  (alignment by :mod:`backend.checks.seqdiff`: lines and turns first, then token by token);
* baseline: the same ``check`` with the alignment done by ``difflib.SequenceMatcher`` over the
  whole sequences (``autojunk=False``), what the diagnostics did before ``seqdiff``.

Also reported: whether both give the same findings (they must: the loop differs from the
re-render only by one missing ``\\n`` per turn, which any correct alignment finds). The
baseline is skipped above ``--baseline-max-tokens`` (it grows with the square of the
repetitions). Usage::

    python bench/bench_diagnostics.py [--turns 5 20 60] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = ["weather", "Seattle", "the", "of", "temperature", "東京", "😀", "x = f(y)", "{", "}", "é", "data", "a\tb"]


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for.
    """
    return {"temperature": 72, "city": city}


def make_trace(bundle, turns: int, seed: int = 3):
    """A run of ``turns`` tool turns plus a final answer, each turn 20-40 lines of mixed text."""
    from backend.engine import AgentLoop, LoopConfig
    from backend.generators.scripted import ScriptedGenerator
    from backend.tools import ToolRegistry

    rng = random.Random(seed)

    def body() -> str:
        return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 18))) for _ in range(rng.randrange(20, 40)))

    def call(i: int) -> str:
        return "<tool_call>\n" + json.dumps({"name": "get_current_temperature", "arguments": {"city": f"City {i}"}}) + "\n</tool_call>"

    script = [body() + "\n" + call(i) for i in range(turns)] + [body()]
    loop = AgentLoop(
        ScriptedGenerator(bundle.tokenizer, script),
        bundle,
        tools=ToolRegistry.from_functions([get_current_temperature]),
        config=LoopConfig(response_length=1_000_000, max_assistant_turns=turns + 5, sampling={"max_tokens": 8192}),
    )
    return asyncio.run(loop.run([{"role": "user", "content": "What's the weather in Seattle?"}]))


def _difflib_opcodes(tok, a, b):
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()


def _summary(findings) -> list[tuple]:
    return [(f.code, f.severity, f.message) for f in findings]


def _time(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, nargs="+", default=[5, 20, 60])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline-max-tokens", type=int, default=60_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from backend.checks import diagnostics
    from backend.loading.tokenizers import load_tokenizer

    bundle = load_tokenizer("qwen3")
    ours = diagnostics._opcodes
    rows = []
    for turns in args.turns:
        tr = make_trace(bundle, turns)
        diagnostics._opcodes = ours
        t_ours, f_ours = _time(lambda: diagnostics.check(tr, bundle), args.reps)
        row = {"turns": turns, "tokens": len(tr.input_ids), "check_s": t_ours, "findings": len(f_ours)}
        if len(tr.input_ids) <= args.baseline_max_tokens:
            diagnostics._opcodes = _difflib_opcodes
            try:
                t_base, f_base = _time(lambda: diagnostics.check(tr, bundle), max(1, min(args.reps, 2)))
            finally:
                diagnostics._opcodes = ours
            row.update(baseline_s=t_base, ratio=t_base / t_ours, same_findings=_summary(f_ours) == _summary(f_base))
        rows.append(row)
        if not args.json:
            base = f"difflib {row['baseline_s']:.2f} s, {row['ratio']:.0f}x, same findings: {row['same_findings']}" if "baseline_s" in row else "difflib skipped"
            print(f"{turns:3d} turns, {row['tokens']:6d} tokens: check {t_ours * 1000:8.1f} ms | {base}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
