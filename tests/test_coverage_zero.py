"""scripts/coverage_zero.py: the modules a coverage run left untouched fail it, by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "coverage_zero.py"


def report(files: dict[str, tuple[int, int]]) -> dict:
    cov = sum(h for h, _ in files.values())
    n = sum(t for _, t in files.values())
    return {"files": {k: {"summary": {"num_statements": t, "covered_lines": h}} for k, (h, t) in files.items()},
            "totals": {"percent_covered": 100 * cov / n, "covered_lines": cov, "num_statements": n}}


def run(tmp_path, files):
    p = tmp_path / "coverage.json"
    p.write_text(json.dumps(report(files)))
    return subprocess.run([sys.executable, str(SCRIPT), str(p)], capture_output=True, text=True)


def test_a_module_at_zero_fails_the_run_and_is_named(tmp_path):
    r = run(tmp_path, {"backend/a.py": (10, 20), "backend/dead.py": (0, 7), "ui/x.py": (3, 3), "backend/__init__.py": (0, 0)})
    assert r.returncode == 1
    assert "modules at 0 %: backend/dead.py" in r.stdout
    lines = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines()[1:3]}
    assert lines == {"backend": ["37.0", "%", "(10/27)"], "ui": ["100.0", "%", "(3/3)"]}  # 10 of 7 + 20 statements


def test_no_module_at_zero_passes(tmp_path):
    r = run(tmp_path, {"backend/a.py": (1, 20), "app.py": (5, 5)})
    assert r.returncode == 0 and "no module at 0 %" in r.stdout
