"""Where the test suite's time goes, from a pytest run's ``--durations=0`` lines.

    PYTEST_ADDOPTS=--durations=0 bash scripts/test.sh > run.log 2>&1
    .venv/bin/python scripts/test_durations.py run.log [--top 30] [--markdown]
    .venv/bin/python scripts/test_durations.py run.log --json > tests/test_seconds.json

Groups the ``12.34s setup tests/x.py::test`` lines by test file (set-up, call and tear-down apart:
a file's set-up is mostly its fixtures, the first test of a module or session paying for them)
and lists the slowest set-ups on their own, which name the expensive fixtures' first users.
``--cpu`` reads instead the per-test CPU log that ``ALI_TEST_CPU_LOG=FILE`` makes tests/conftest.py
write (``FILE`` or ``FILE.gw0``, ``FILE.gw1``... under xdist) and sets each file's wall seconds beside
the CPU seconds its tests cost (this process and every process below it): on a machine whose cores
the run keeps busy, CPU is what a test costs; wall time well above its CPU is waiting (a timeout, a
sleep, the network), which a busy machine does not make longer.
``--json`` writes each test's seconds (set-up, call and tear-down together; those under
:data:`JSON_MIN_S` left out): ``tests/test_seconds.json``, which tests/conftest.py reads to hand the
costliest groups of the tests selected to the workers first (a group weighs what its selected tests
do, so the edit loop's selection is weighed as well as the full run; regenerate it when the suite's
shape changes; a test it does not list counts as cheap).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict

JSON_MIN_S = 0.3  # a test below this is left out of --json (tests/conftest.py counts it as cheap)

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?)::(\S.*?)(?:@\S+)?$")  # @group: xdist's


def parse(lines) -> list[tuple[float, str, str, str]]:
    """(seconds, phase, file, test) for every duration line."""
    out = []
    for line in lines:
        m = LINE.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()))
    return out


def by_file(rows) -> list[tuple[str, dict[str, float], int]]:
    """(file, {phase: seconds, "total": seconds}, tests) sorted by total, largest first."""
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tests: dict[str, set[str]] = defaultdict(set)
    for s, phase, f, t in rows:
        acc[f][phase] += s
        acc[f]["total"] += s
        tests[f].add(t)
    return sorted(((f, dict(v), len(tests[f])) for f, v in acc.items()), key=lambda r: -r[1]["total"])


def cpu_rows(path: str) -> list[dict]:
    """The rows of ``path`` and of its per-worker files (``path.gw0``...), malformed lines skipped."""
    import glob
    import os

    rows = []
    for name in ([path] if os.path.isfile(path) else []) + sorted(glob.glob(glob.escape(path) + ".gw*")):
        with open(name, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                    rows.append({"id": str(row["id"]), "wall": float(row["wall"]), "cpu": float(row["cpu"])})
                except (ValueError, KeyError, TypeError):
                    continue
    return rows


def cpu_report(rows: list[dict], top: int) -> str:
    """Files by CPU seconds, then the tests that waited longest (wall minus CPU)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        a = acc[r["id"].split("::")[0]]
        a[0] += r["wall"]
        a[1] += r["cpu"]
        a[2] += 1
    wall, cpu = sum(r["wall"] for r in rows), sum(r["cpu"] for r in rows)
    out = [f"{len(rows)} tests: {wall:.0f} s wall, {cpu:.0f} s CPU (this process and every process below it)", "",
           "| file | tests | wall s | CPU s | CPU share | waiting s |", "|---|---|---|---|---|---|"]
    for f, (w, c, n) in sorted(acc.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"| `{f}` | {n} | {w:.0f} | {c:.0f} | {100 * c / cpu if cpu else 0:.1f} % | {max(0.0, w - c):.0f} |")
    out += ["", "| waited longest (wall minus CPU) | wall s | CPU s |", "|---|---|---|"]
    for r in sorted(rows, key=lambda r: -(r["wall"] - r["cpu"]))[: top // 2]:
        out.append(f"| `{r['id']}` | {r['wall']:.1f} | {r['cpu']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a pytest log with --durations=0 output ('-' for stdin); with --cpu, ALI_TEST_CPU_LOG's file")
    ap.add_argument("--cpu", action="store_true", help="the log is ALI_TEST_CPU_LOG's: wall and CPU seconds by file")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    ap.add_argument("--json", action="store_true", help="each test's seconds as JSON (tests/test_seconds.json)")
    args = ap.parse_args(argv)
    if args.cpu:
        crows = cpu_rows(args.log)
        if not crows:
            print(f"no CPU rows in {args.log} or {args.log}.gw*: run the tests with ALI_TEST_CPU_LOG={args.log}", file=sys.stderr)
            return 1
        print(cpu_report(crows, args.top))
        return 0
    lines = sys.stdin if args.log == "-" else open(args.log, encoding="utf-8", errors="replace")
    rows = parse(lines)
    if not rows:
        print("no duration lines found: run pytest with --durations=0", file=sys.stderr)
        return 1
    total = sum(r[0] for r in rows)
    files = by_file(rows)
    if args.json:
        per: dict[str, float] = defaultdict(float)
        for sec, _, f, t in rows:
            per[f"{f}::{t}"] += sec
        kept = sorted(((k, round(v, 1)) for k, v in per.items() if v >= JSON_MIN_S), key=lambda kv: -kv[1])
        print(json.dumps(dict(kept), indent=0))
    elif args.markdown:
        print("| file | tests | total s | share | set-up s | call s | tear-down s |\n|---|---|---|---|---|---|---|")
        for f, v, n in files[: args.top]:
            print(f"| `{f}` | {n} | {v['total']:.0f} | {100 * v['total'] / total:.1f} % | {v.get('setup', 0):.0f} | "
                  f"{v.get('call', 0):.0f} | {v.get('teardown', 0):.0f} |")
        print(f"\nAll {len(files)} files: {total:.0f} s.\n\n| slowest set-ups (fixtures' first users) | s |\n|---|---|")
        for s, _, f, t in sorted((r for r in rows if r[1] == "setup"), key=lambda r: -r[0])[: args.top // 2]:
            print(f"| `{f}::{t}` | {s:.1f} |")
    else:
        print(f"{'file':60} {'tests':>5} {'total':>8} {'share':>6} {'setup':>7} {'call':>7} {'teardown':>8}")
        for f, v, n in files[: args.top]:
            print(f"{f:60} {n:5d} {v['total']:8.1f} {100 * v['total'] / total:5.1f}% {v.get('setup', 0):7.1f} "
                  f"{v.get('call', 0):7.1f} {v.get('teardown', 0):8.1f}")
        print(f"all {len(files)} files: {total:.0f} s")
        print("\nslowest set-ups:")
        for s, _, f, t in sorted((r for r in rows if r[1] == "setup"), key=lambda r: -r[0])[: args.top // 2]:
            print(f"{s:8.1f}  {f}::{t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
