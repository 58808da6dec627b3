"""tinker-cookbook's logtree as HTML (``train.html``), written by tinker-cookbook itself (0.5.8), offline.

Run (from the repository root; the venv is described in requirements-tinker.txt):

    /work/fixenv/tinker/bin/python tests/fixtures_gen/gen_tinker_html.py

An RL iteration of tinker-cookbook writes its logtree twice: ``train_logtree.json`` (read by the
tinker importer; gen_tinker.py) and ``train.html`` beside it. The HTML is no trace file: the
reader refuses it with one problem that names the JSON twin (tests/adversarial/test_damaged_documents.py).
This script writes a small logtree with ``logtree.init_trace`` (which writes the HTML page on
exit: the doctype, the default style, the tree) and a header and a line of text as the
cookbook's ``rl.train`` logs them. The "Generated <time>" line is fixed afterwards so the file does
not change from run to run. Output: ``tests/data/import/tinker/html/train.html``."""

from __future__ import annotations

import os
import re
import sys
import tempfile

from tinker_cookbook.utils import logtree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "tinker", "html", "train.html")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.html")
        with logtree.init_trace("RL Iteration 3", path=path):
            with logtree.scope_header("Group Rollout"):
                logtree.log_text("What is 17 + 25? Put the answer in \\boxed{}.")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    text = re.sub(r"Generated \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", "Generated 2026-11-28T12:00:00", text)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT} ({len(text)} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
