"""For the generators that import a library's writer without its package ``__init__`` (which pulls
torch, Ray, vLLM ... that the writer does not need): register the package and the named
subpackages as empty modules whose ``__path__`` is their folder, so their submodules import alone."""

from __future__ import annotations

import importlib.util
import os
import sys
import types


def register_packages(top: str, *subpackages: str) -> None:
    """``top`` and ``top.<sub>`` for each of ``subpackages`` as bare packages of the installed folder."""
    root = os.path.dirname(importlib.util.find_spec(top).origin)
    for name, path in ((top, root), *((f"{top}.{s}", os.path.join(root, s)) for s in subpackages)):
        m = types.ModuleType(name)
        m.__path__ = [path]
        sys.modules[name] = m
