"""The code's layout rules (issue 13), read from the source with ``ast``:

- no import cycles between the product's modules (``backend``, ``ui``, ``app``), counting imports
  inside functions too: a deferred import hides a cycle from Python, not from a reader;
- no module imports another package's private (``_name``) module or name; a package's own
  ``_helpers`` are for that package only;
- ``backend`` never imports ``ui``.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules() -> dict[str, str]:
    """module name -> file path, for backend/, ui/ and app.py."""
    out = {"app": os.path.join(ROOT, "app.py")}
    for top in ("backend", "ui"):
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _package(mod: str) -> str:
    return mod if os.path.basename(MODULES[mod]) == "__init__.py" else mod.rpartition(".")[0]


def _imports(mod: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``mod``'s file."""
    tree = ast.parse(open(MODULES[mod], encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = _package(mod).split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            found += [(base, a.name, node.lineno) for a in node.names]
    return found


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES:
        for target, name, _ in _imports(mod):
            if name and f"{target}.{name}" in MODULES:
                graph[mod].add(f"{target}.{name}")  # from pkg import submodule
            if target in MODULES and target != mod:
                graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring the edges from a
    package's ``__init__`` to its own submodules (re-exports) and back (a submodule importing a
    sibling through the package)."""
    def internal(a: str, b: str) -> bool:
        pa = _package(a) if os.path.basename(MODULES[a]) == "__init__.py" else None
        pb = _package(b) if os.path.basename(MODULES[b]) == "__init__.py" else None
        return (pa is not None and b.startswith(pa + ".")) or (pb is not None and a.startswith(pb + "."))

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if internal(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return out


def test_the_module_list_is_the_product():
    assert {"app", "backend.engine", "backend.trace.model", "backend.trace.io", "ui.playground"} <= set(MODULES)


def test_no_import_cycles():
    assert _cycles(_edges()) == []


def test_the_cycle_check_finds_a_cycle():
    """The checker itself: a two-module cycle and a three-module cycle are found."""
    g = {"backend.engine": {"backend.rendering"}, "backend.rendering": {"backend.engine"},
         "backend.diagnostics": {"backend.labels"}, "backend.labels": {"backend.seqdiff"}, "backend.seqdiff": {"backend.diagnostics"}}
    assert sorted(_cycles(g)) == [["backend.diagnostics", "backend.labels", "backend.seqdiff"], ["backend.engine", "backend.rendering"]]


def test_no_private_names_across_packages():
    bad = []
    for mod in MODULES:
        own = _package(mod)
        for target, name, line in _imports(mod):
            if not (target.startswith("backend") or target.startswith("ui")):
                continue
            parts = target.split(".") + ([name] if name else [])
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])  # the package the private part belongs to
                    if own != owner and not own.startswith(owner + "."):
                        bad.append(f"{mod}:{line} imports {'.'.join(parts)}")
                    break
    assert bad == []


def test_backend_never_imports_ui():
    bad = [f"{m}:{line}" for m in MODULES if m.startswith("backend")
           for target, _, line in _imports(m) if target == "ui" or target.startswith("ui.")]
    assert bad == []
