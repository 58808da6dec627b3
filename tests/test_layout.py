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
- no import cycle among the benchmarks (``bench/*.py``; what they share is in ``bench/common.py``);
- ``backend/`` is a map (issue 41): at most 10 modules at its top level, everything else in
  packages, each with a docstring; :data:`MAP` lists the parts (packages and top-level modules)
  bottom up with the parts each may import, every import between parts follows it, and
  docs/architecture.md opens with the same list.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from functools import lru_cache

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
    return list(_read_imports(mod, path or MODULES[mod]))


@lru_cache(maxsize=None)
def _read_imports(mod: str, path: str) -> tuple[tuple[str, str | None, int], ...]:
    """:func:`_imports`, read once per file (most checks walk every module)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
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
    return tuple(found)


def _edges(planted: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the product modules it imports. ``planted`` (module name -> file) reads those
    modules from other files (a checker's test plants a violation so)."""
    planted = planted or {}
    graph: dict[str, set[str]] = defaultdict(set)
    for mod in {**MODULES, **planted}:
        for target, name, _ in _imports(mod, planted.get(mod)):
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


# ---- the map of backend/ (issue 41) ------------------------------------------------------------------

# backend/'s parts in layer order, bottom up: a package (backend/NAME/) or a module at the top
# (backend/NAME.py), and the parts it may import (imports inside a part are its own business). A
# part may import only parts listed above it (test_the_map_is_layered), so there is no cycle
# between parts and no arrow back up. docs/architecture.md opens with the same list, one line each.
# A new package is one row here, below every part it imports (and one line in the docs' map).
MAP: list[tuple[str, set[str]]] = [
    ("errors", set()),
    ("constraints", set()),
    ("runtime", set()),
    ("trace", {"errors", "runtime"}),
    ("tokens", {"errors", "runtime", "trace"}),
    ("families", {"errors", "runtime", "trace", "tokens"}),
    ("parsers", {"errors", "trace"}),
    ("tools", {"errors", "trace"}),
    ("loading", {"errors", "runtime", "trace", "tokens", "families", "parsers"}),
    ("tool_choice", {"errors", "constraints", "parsers", "tools"}),
    ("generators", {"errors", "constraints", "runtime", "loading", "tool_choice"}),
    ("config", {"errors", "generators", "tool_choice"}),
    ("engine", {"trace", "tokens", "families", "parsers", "loading", "tool_choice", "generators", "config"}),
    ("rollout", {"errors", "trace", "engine"}),
    ("gateway", {"errors", "trace", "tokens", "families", "parsers", "tool_choice", "generators", "engine"}),
    ("checks", {"errors", "runtime", "trace", "tokens", "families", "tools", "loading"}),
    ("safety", {"errors", "runtime", "tokens", "families", "loading", "config"}),
    ("importers", {"errors", "trace", "tokens", "parsers", "loading", "safety"}),
    ("exporters", {"errors", "trace"}),
    ("deploy", {"runtime", "generators"}),
    ("cli", {"errors", "trace", "tokens", "families", "parsers", "tools", "loading", "tool_choice", "generators",
             "config", "engine", "rollout", "gateway", "checks", "importers", "exporters"}),
    ("__main__", {"cli"}),
]

MAX_TOP_LEVEL_MODULES = 10

# packages whose __init__ is more than its docstring: a registry of their modules or the package's
# API re-exported; every other package's __init__ is its docstring only (importing one of its
# modules then runs nothing else, and no __init__ can close an import cycle)
INIT_WITH_CODE = {"cli", "families", "generators", "importers", "parsers", "tools", "trace"}

BACKEND = os.path.join(ROOT, "backend")


def _parts(folder: str = BACKEND) -> dict[str, str]:
    """The parts found in ``folder``: name -> ``"package"`` (a folder with an ``__init__.py``) or
    ``"module"`` (a ``.py`` file other than ``__init__.py``). A folder without one (``templates/``)
    holds data, not code."""
    out = {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
            out[entry] = "package"
        elif entry.endswith(".py") and entry != "__init__.py":
            out[entry[:-3]] = "module"
    return out


def _part(mod: str) -> str | None:
    """The part a module belongs to (``backend.tokens.vocab`` -> ``tokens``, ``backend.engine`` ->
    ``engine``); None outside backend/ and for backend/__init__ itself (empty)."""
    names = mod.split(".")
    return names[1] if names[0] == "backend" and len(names) > 1 else None


def _table_problems(table: list[tuple[str, set[str]]]) -> list[str]:
    """What makes ``table`` not a layering: a part named twice, or allowed to import itself, a part
    not listed above it, or one not in the table at all."""
    out, seen = [], []
    for name, allowed in table:
        if name in seen:
            out.append(f"{name} is listed twice")
        for dep in sorted(allowed):
            if dep == name:
                out.append(f"{name} lists itself")
            elif dep not in seen:
                where = "below it" if dep in dict(table) else "not in the map"
                out.append(f"{name} may import {dep}, which is {where}")
        seen.append(name)
    return out


def _map_violations(edges: dict[str, set[str]], table: list[tuple[str, set[str]]] = MAP) -> list[str]:
    """``"module imports target: part may not import part"`` for each import between two parts of
    backend/ that ``table`` does not allow (a part the table does not list may import nothing)."""
    allowed = dict(table)
    out = []
    for mod in sorted(edges):
        src = _part(mod)
        for target in sorted(edges[mod]):
            dst = _part(target)
            if src is None or dst is None or dst == src or dst in allowed.get(src, set()):
                continue
            out.append(f"{mod} imports {target}: {src} may not import {dst}")
    return out


def test_backend_has_at_most_ten_top_level_modules():
    top = [n for n, kind in _parts().items() if kind == "module"]
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_every_part_of_backend_is_in_the_map():
    assert sorted(_parts()) == sorted(name for name, _ in MAP)


def test_the_map_is_layered():
    assert _table_problems(MAP) == []


def test_every_import_between_parts_is_one_the_map_allows():
    assert _map_violations(_edges()) == []


def test_every_package_says_what_belongs_there():
    """Each package's __init__ opens with a docstring (what belongs there, what does not), and is
    nothing else unless the package is a registry or re-exports its API (INIT_WITH_CODE)."""
    bad = []
    for name, kind in _parts().items():
        if kind != "package":
            continue
        tree = ast.parse(open(os.path.join(BACKEND, name, "__init__.py"), encoding="utf-8").read())
        if not (ast.get_docstring(tree) or "").strip():
            bad.append(f"{name}: no docstring")
        elif name not in INIT_WITH_CODE and len(tree.body) > 1:
            bad.append(f"{name}: __init__ is more than its docstring")
    assert bad == []


def test_the_map_checks_find_planted_violations(tmp_path):
    """The checkers themselves: an arrow back up planted in a copy of a real module (rendering
    importing the loading layer, as it once imported the tokenizer layer), an import from a part
    the map does not list, a table that allows an import upwards, and an eleventh top-level
    module are all found."""
    src = open(MODULES["backend.tokens.rendering"], encoding="utf-8").read()
    p = tmp_path / "rendering.py"
    p.write_text(src + "\n\ndef _bundle():\n    from backend.loading.tokenizers import TokenizerBundle\n", encoding="utf-8")
    assert _map_violations(_edges({"backend.tokens.rendering": str(p)})) == [
        "backend.tokens.rendering imports backend.loading.tokenizers: tokens may not import loading"]
    assert _map_violations({"backend.newpart.x": {"backend.trace.model"}}) == [
        "backend.newpart.x imports backend.trace.model: newpart may not import trace"]
    assert _table_problems([("errors", set()), ("trace", {"errors", "checks"}), ("checks", {"trace"}), ("ui", {"app"})]) == [
        "trace may import checks, which is below it", "ui may import app, which is not in the map"]
    for i in range(MAX_TOP_LEVEL_MODULES + 1):
        (tmp_path / f"m{i}.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""A package."""\n', encoding="utf-8")
    (tmp_path / "data").mkdir()
    parts = _parts(str(tmp_path))
    assert len([n for n, kind in parts.items() if kind == "module"]) == MAX_TOP_LEVEL_MODULES + 2  # rendering.py too
    assert parts["pkg"] == "package" and "data" not in parts


# ---- docs/architecture.md opens with the map ----------------------------------------------------------

ARCHITECTURE_DOC = os.path.join(ROOT, "docs", "architecture.md")


def _doc_map(text: str) -> list[str]:
    """The lines of the map docs/architecture.md opens with: the fenced block of its first ``## ``
    section, which must be the map's."""
    section = text.split("\n## ", 1)[1] if "\n## " in text else ""
    if not section.startswith("The map"):
        return []
    block = section.split("```", 2)
    return [line for line in block[1].splitlines()[1:] if line.strip()] if len(block) == 3 else []


def _doc_map_problems(lines: list[str], table: list[tuple[str, set[str]]] = MAP, folder: str = BACKEND) -> list[str]:
    """Where the docs' map and the code part: the parts in another order, a package written as a
    module or the other way round, a package whose line lists its modules (``a, b, c: ...``) with
    other modules than the folder has."""
    out = []
    written = [line.split()[0] for line in lines]
    names = [w.removesuffix("/").removesuffix(".py") for w in written]
    if names != [name for name, _ in table]:
        out.append(f"the docs list {names}, the map {[name for name, _ in table]}")
    parts = _parts(folder)
    for w, name, line in zip(written, names, lines):
        kind = "package" if w.endswith("/") else "module" if w.endswith(".py") else "?"
        if parts.get(name) != kind:
            out.append(f"{w}: backend/ has {name} as {parts.get(name)}")
            continue
        head = line[len(w):].strip().split(":", 1)[0]
        listed = [m.strip() for m in head.split(",")]
        if kind == "package" and ":" in line and all(m.isidentifier() for m in listed):
            modules = sorted(f[:-3] for f in os.listdir(os.path.join(folder, name)) if f.endswith(".py") and f != "__init__.py")
            if sorted(listed) != modules:
                out.append(f"{w} lists {sorted(listed)}, the folder has {modules}")
    return out


def test_the_docs_open_with_the_map():
    lines = _doc_map(open(ARCHITECTURE_DOC, encoding="utf-8").read())
    assert lines, "docs/architecture.md's first section is not the map"
    assert _doc_map_problems(lines) == []


def test_the_docs_map_check_finds_a_map_out_of_step():
    lines = _doc_map(open(ARCHITECTURE_DOC, encoding="utf-8").read())
    swapped = [lines[1], lines[0], *lines[2:]]
    assert _doc_map_problems(swapped)[0].startswith("the docs list ['constraints', 'errors', ")
    tokens = next(i for i, line in enumerate(lines) if line.startswith("tokens/"))
    fewer = [*lines[:tokens], lines[tokens].replace("bpe, ", ""), *lines[tokens + 1:]]
    assert _doc_map_problems(fewer) == [
        "tokens/ lists ['rendering', 'template_errors', 'template_guard', 'trl_templates', 'vocab'], the folder has "
        "['bpe', 'rendering', 'template_errors', 'template_guard', 'trl_templates', 'vocab']"]
    as_module = [line.replace("runtime/ ", "runtime.py", 1) if line.startswith("runtime/") else line for line in lines]
    assert _doc_map_problems(as_module) == ["runtime.py: backend/ has runtime as package"]
    assert _doc_map("# Architecture\n\n## Engine\n```\nerrors.py\n```\n") == []


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
