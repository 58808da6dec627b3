"""The test files that exercise what changed: ``bash scripts/test.sh --changed`` runs these.

What changed: the files that differ from ``BASE`` (default ``main``; the merge base when on a
branch), committed or not, plus untracked files git does not ignore. A test file is selected when

- it changed itself, or a file under ``tests/`` it imports changed (``conftest.py``: every test);
- it imports, directly or through other product modules (imports inside functions counted), a
  changed module of ``backend/``, ``ui/`` or ``app.py``;
- a changed file that is not Python (a template, a sample trace, a doc, a requirements file) is
  named in it by its path or its file name. A changed non-Python file that no test names selects
  everything: nothing says what it touches.

Prints one test path per line (none when nothing changed); ``--explain`` adds why, after a tab.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("backend", "ui")


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def changed_files(base: str) -> list[str]:
    """Paths (relative to the repository) that differ from ``base``'s merge base, or are new."""
    try:
        fork = _git("merge-base", "HEAD", base)[0]
    except (subprocess.CalledProcessError, IndexError):
        fork = "HEAD"
    files = set(_git("diff", "--name-only", fork)) | set(_git("ls-files", "--others", "--exclude-standard"))
    return sorted(files)


def _module_name(rel: str) -> str | None:
    if not rel.endswith(".py"):
        return None
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _python_files() -> dict[str, Path]:
    """module name -> file, for the product (backend/, ui/, app.py) and tests/."""
    out = {"app": ROOT / "app.py"}
    for top in (*PRODUCT, "tests"):
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                out[_module_name(path.relative_to(ROOT).as_posix())] = path
    return out


def _imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """The known modules ``mod`` imports (``from pkg import sub`` counted; relative imports and
    the ``tests`` folder's own bare imports, ``from playground_support import ...``, resolved)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return set()
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known and not mod.startswith("tests"):
            names = [node.value]  # a module named in a table ("backend.parsers.glm45"), imported on use
        for n in names:
            for cand in (n, f"tests.{n}"):  # tests import their helpers by bare name
                # a module, or the nearest package above a name inside it
                while cand and cand not in known:
                    cand = cand.rpartition(".")[0]
                if cand and cand != mod:
                    found.add(cand)
                    break
    return found


@lru_cache(maxsize=1)
def _graph() -> tuple[dict[str, Path], dict[str, set[str]]]:
    """(module -> file, module -> the modules that import it)."""
    files = _python_files()
    known = set(files)
    importers: dict[str, set[str]] = defaultdict(set)
    for mod, path in files.items():
        for t in _imports(mod, path, known):
            importers[t].add(mod)
    return files, importers


def select(changed: list[str]) -> tuple[list[str], dict[str, str]]:
    """(test files to run, why each), from the changed paths."""
    files, importers = _graph()
    tests = {m: p for m, p in files.items() if m.startswith("tests.") and p.name.startswith("test_")}
    why: dict[str, str] = {}

    def pick(mod: str, reason: str) -> None:
        rel = files[mod].relative_to(ROOT).as_posix()
        why.setdefault(rel, reason)

    def closure(mod: str, rel: str) -> None:
        """Pick every test that reaches ``mod`` through imports."""
        seen, todo = {mod}, [mod]
        while todo:
            for up in importers[todo.pop()]:
                if up not in seen:
                    seen.add(up)
                    todo.append(up)
        for m in seen & set(tests):
            pick(m, "changed" if m == mod else f"imports {rel}")

    everything = False
    for rel in changed:
        mod = _module_name(rel)
        if rel == "tests/conftest.py" or rel in ("requirements.txt", "constraints.txt", "pytest.ini", "scripts/setup.sh"):
            everything = True
            continue
        if mod in files:
            closure(mod, rel)
            continue
        if mod is not None and rel.startswith(("backend/", "ui/", "tests/")) and not (ROOT / rel).exists():
            everything = True  # a deleted module: whatever imported it is not in the graph any more
            continue
        # any other file (a template, a sample trace, a doc, a benchmark, a script): the tests that
        # name it, and, inside the product, the tests that reach a module naming it or its folder
        name, folder = os.path.basename(rel), os.path.basename(os.path.dirname(rel))
        hits = [m for m, p in tests.items() if rel in (text := p.read_text(encoding="utf-8", errors="replace")) or name in text]
        for m in hits:
            pick(m, f"names {rel}")
        if rel.startswith(("backend/", "ui/")):
            readers = [m for m, p in files.items() if not m.startswith("tests")
                       and any(k in p.read_text(encoding="utf-8", errors="replace") for k in (name, f'"{folder}"'))]
            for m in readers:
                closure(m, rel)
            hits += readers
        if not hits and not rel.startswith(("docs/", "bench/", "scripts/", ".ci/")) and not rel.endswith((".md", ".py")):
            everything = True
    if everything:
        return ["tests"], {"tests": "a change every test depends on (conftest, requirements, pytest.ini) or one no test names"}
    if any(r.endswith(".md") for r in changed) and "tests.test_docs" in tests:
        pick("tests.test_docs", "a document changed")
    return sorted(why), why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=os.environ.get("BASE", "main"), help="compare with this ref (default: main)")
    ap.add_argument("--explain", action="store_true", help="say why each test file was picked (after a tab)")
    args = ap.parse_args(argv)
    picked, why = select(changed_files(args.base))
    for p in picked:
        print(f"{p}\t{why[p]}" if args.explain else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
