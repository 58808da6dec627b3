"""The modules a coverage run left untouched, and the coverage of each layer.

    python scripts/coverage_zero.py [COVERAGE_JSON]      (default .cache/coverage.json)

Reads the JSON report pytest-cov writes (``bash scripts/test.sh --fast --cov`` makes it) and
prints each top-level package's line coverage, the 15 least covered modules, and every module at
0 %: the exit status is 1 when there is one (a module the edit loop never imports or runs is a
module a change can break unseen)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Modules that only run where coverage cannot follow, and the tests that hold them instead.
NOT_MEASURABLE = {
    # runs as `python -I` (no PYTHON* variables, no site hooks) under rlimits and another uid:
    # coverage cannot start there by design; tests/test_tools.py runs it for real
    "backend/tools/_sandbox_child.py": "the sandboxed child process (tests/test_tools.py runs it)",
}


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / ".cache" / "coverage.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    files = data["files"]
    by_pkg: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rows = []
    for name, f in sorted(files.items()):
        s = f["summary"]
        n, hit = s["num_statements"], s["covered_lines"]
        pkg = name.split("/", 1)[0] if "/" in name else name
        by_pkg[pkg][0] += hit
        by_pkg[pkg][1] += n
        if n:
            rows.append((hit / n, name, hit, n))
    total = data["totals"]
    print(f"line coverage: {total['percent_covered']:.1f} % ({total['covered_lines']} of {total['num_statements']} statements, {len(files)} files)")
    for pkg, (hit, n) in sorted(by_pkg.items()):
        print(f"  {pkg:<12} {100 * hit / max(n, 1):5.1f} %  ({hit}/{n})")
    print("least covered:")
    for frac, name, hit, n in sorted(rows)[:15]:
        print(f"  {100 * frac:5.1f} %  {name}  ({hit}/{n})")
    zero = [name for frac, name, _, _ in rows if frac == 0 and name not in NOT_MEASURABLE]
    for name, why in NOT_MEASURABLE.items():
        if name in files and not files[name]["summary"]["covered_lines"]:
            print(f"not measurable here: {name}: {why}")
    if zero:
        print("modules at 0 %: " + ", ".join(zero))
        return 1
    print("no module at 0 %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
