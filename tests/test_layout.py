"""The code's layout rules (issue 13), read from the source with ``ast``:

- no import cycles between the product's modules (``backend``, ``ui``, ``app``), counting imports
  inside functions too: a deferred import hides a cycle from Python, not from a reader;
- no module imports another package's private (``_name``) module or name; a package's own
  ``_helpers`` are for that package only;
- ``backend`` never imports ``ui``;
- no arrow back up (issue 24): the trace layer (every ``backend.trace`` module) imports nothing of
  the importers, the Parquet guard, the generators, the engine or the UI (the importers give the
  trace-set catalogue a hook instead); ``Constraint`` is a leaf (``backend.constraints``) below
  both ``backend.tool_choice`` and the generators, and tool_choice imports no generator (issue 32);
- the families sit under the tokenizer layer (issue 29): no ``backend.families`` module imports the
  tokenizer layer, the models, the generators, the engine or the UI, and what the families build
  on (rendering, the vocabulary machinery, the build cache) imports no family and not the
  tokenizer layer: it takes what it needs as arguments;
- no import cycle among the benchmarks (``bench/*.py``; what they share is in ``bench/common.py``).
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


def _imports(mod: str, path: str | None = None) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``mod``'s file (or the
    file at ``path``), those inside functions too."""
    tree = ast.parse(open(path or MODULES[mod], encoding="utf-8").read())
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
        pa = _package(a) if os.path.basename(MODULES.get(a, "")) == "__init__.py" else None
        pb = _package(b) if os.path.basename(MODULES.get(b, "")) == "__init__.py" else None
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

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_the_module_list_is_the_product():
    assert {"app", "backend.engine", "backend.trace.model", "backend.trace.io", "ui.playground"} <= set(MODULES)


def test_no_import_cycles():
    assert _cycles(_edges()) == []


def test_the_cycle_check_finds_a_cycle():
    """The checker itself: a two-module cycle and a three-module cycle are found."""
    g = {"backend.engine": {"backend.tokens.rendering"}, "backend.tokens.rendering": {"backend.engine"},
         "backend.checks.diagnostics": {"backend.checks.labels"}, "backend.checks.labels": {"backend.checks.seqdiff"}, "backend.checks.seqdiff": {"backend.checks.diagnostics"}}
    assert sorted(_cycles(g)) == [["backend.checks.diagnostics", "backend.checks.labels", "backend.checks.seqdiff"], ["backend.engine", "backend.tokens.rendering"]]


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


# ---- no arrow back up (issue 24) ------------------------------------------------------------------

# what the trace layer sits under: it may be imported by them, never import them
ABOVE_THE_TRACE_LAYER = ("backend.importers", "backend.parquet_limits", "backend.generators", "backend.engine", "ui")


def _names(target: str, name: str | None) -> list[str]:
    """What an import names: the module, and ``module.name`` (``from backend import importers``)."""
    return [target] + ([f"{target}.{name}"] if name else [])


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def _upward(mod: str, path: str | None = None, above: tuple[str, ...] = ABOVE_THE_TRACE_LAYER) -> list[str]:
    """``"mod:line imports what"`` for each import of ``mod`` that names something in ``above``
    (by default: above the trace layer)."""
    out = []
    for target, name, line in _imports(mod, path):
        bad = [n for n in _names(target, name) if _under(n, above)]
        if bad:
            out.append(f"{mod}:{line} imports {bad[0]}")
    return out


def test_the_trace_layer_imports_nothing_above_it():
    trace = [m for m in MODULES if m == "backend.trace" or m.startswith("backend.trace.")]
    assert {"backend.trace.io", "backend.trace.index", "backend.trace.catalog"} <= set(trace)
    assert [bad for m in trace for bad in _upward(m)] == []


def test_the_upward_check_finds_deferred_imports(tmp_path):
    """The checker itself: the imports the catalogue had before its hook (inside functions) and
    the reader's import of the Parquet guard are found; the trace layer's own are not."""
    p = tmp_path / "old_catalog.py"
    p.write_text("from backend.trace.io import read_lines\n"
                 "def _verl_importer():\n    from backend.importers import get_importer\n\n"
                 "def _span_groups():\n    from backend.importers.index import SpanGroups\n\n"
                 "def rows():\n    from backend.parquet_limits import iter_parquet_rows\n\n"
                 "def g():\n    from backend import importers, engine\n", encoding="utf-8")
    found = [x.split(" imports ")[1] for x in _upward("backend.trace.catalog", str(p))]
    assert found == ["backend.importers", "backend.importers.index", "backend.parquet_limits", "backend.importers", "backend.engine"]


def test_constraint_sits_below_tool_choice_and_the_generators():
    """``Constraint`` is a leaf (``backend.constraints`` imports nothing of the product), so
    ``backend.tool_choice`` imports nothing of the generators: importing any
    ``backend.generators.*`` module runs the package's ``__init__`` and with it the generator
    interface; the generators may import tool_choice (the scripted replay checks a given turn), not
    the other way round (issue 32)."""
    assert [t for t, _, _ in _imports("backend.constraints") if t == "backend" or t.startswith(("backend.", "ui"))] == []
    assert _upward("backend.tool_choice", above=("backend.generators", "backend.engine", "ui")) == []


def test_the_constraint_check_finds_the_old_arrow(tmp_path):
    p = tmp_path / "old_tool_choice.py"
    p.write_text("from backend.generators.constraints import Constraint\n", encoding="utf-8")
    assert _upward("backend.tool_choice", str(p), above=("backend.generators",)) == [
        "backend.tool_choice:1 imports backend.generators.constraints"]


# ---- the families (issue 29) ------------------------------------------------------------------------

# what the family modules sit under: the tokenizer layer reads their tables, the models are built
# on their tokenizers, the engine and the UI use both
ABOVE_THE_FAMILIES = ("backend.loading.tokenizers", "backend.loading.models", "backend.generators", "backend.engine", "ui")


def test_the_families_import_nothing_above_them():
    fams = [m for m in MODULES if m == "backend.families" or m.startswith("backend.families.")]
    assert {"backend.families", "backend.families.qwen", "backend.families.gpt_oss", "backend.families.mistral"} <= set(fams)
    assert [bad for m in fams for bad in _upward(m, above=ABOVE_THE_FAMILIES)] == []


def test_what_the_families_build_on_imports_no_family():
    """Rendering (the rules render through it), the vocabulary machinery and the build cache (the
    recipes build with them) take the bundle or the vocabulary as an argument."""
    under = ["backend.tokens.rendering", "backend.tokens.vocab", "backend.runtime.cache", "backend.tokens.bpe", "backend.tokens.trl_templates"]
    assert [bad for m in under for bad in _upward(m, above=("backend.families", "backend.loading.tokenizers", "backend.loading.models"))] == []


def test_the_family_check_finds_the_old_arrows(tmp_path):
    """The checker itself, on the imports rendering had before the families were split out (the
    bundle type from the tokenizer layer; Mistral's decoder, inside a function)."""
    p = tmp_path / "old_rendering.py"
    p.write_text("from backend.loading.tokenizers import TokenizerBundle\n"
                 "def render():\n    from backend.families.mistral import decode_with_offsets\n", encoding="utf-8")
    found = [x.split(" imports ")[1] for x in _upward("backend.tokens.rendering", str(p),
                                                       above=("backend.families", "backend.loading.tokenizers"))]
    assert found == ["backend.loading.tokenizers", "backend.families.mistral"]


BENCH = os.path.join(ROOT, "bench")


def _bench_edges(folder: str = BENCH) -> dict[str, set[str]]:
    """bench module -> the bench modules it imports (a bench runs with its folder on ``sys.path``,
    so ``from common import ...`` / ``import bench_x`` name its siblings), inside functions too."""
    names = {f[:-3]: os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in names.items():
        for target, name, _ in _imports(mod, path):
            for n in _names(target, name):
                n = n.removeprefix("bench.")
                if n in names and n != mod:
                    graph[mod].add(n)
    return graph


def test_no_import_cycles_among_the_benchmarks():
    graph = _bench_edges()
    assert graph, "no bench imports found"
    assert _cycles(graph) == []


def test_the_bench_cycle_check_finds_the_old_cycle(tmp_path):
    """The checker itself, on the imports bench_trace_index and bench_trace_load had (each inside a
    function), and bench_otel_set's of bench_trace_index."""
    (tmp_path / "bench_trace_index.py").write_text("def generate():\n    from bench_trace_load import make_traces\n")
    (tmp_path / "bench_trace_load.py").write_text("def main():\n    from bench_trace_index import Peak\n")
    (tmp_path / "bench_otel_set.py").write_text("from bench_trace_index import Peak, cpu, uptime\n")
    assert _cycles(_bench_edges(str(tmp_path))) == [["bench_trace_index", "bench_trace_load"]]
