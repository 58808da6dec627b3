"""vLLM on a CPU host: how to tell, which dtype ``auto`` should mean, and the environment vLLM's
CPU build needs. Shared by the in-process engine (:mod:`backend.generators.vllm_engine`) and
anything that starts a vLLM server process.

Unless already set, :func:`configure_cpu_env` gives the process ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``TORCHINDUCTOR_CACHE_DIR`` (a persistent dir in our cache)
and ``VLLM_RPC_BASE_PATH`` + ``TMPDIR`` (a private temp dir, removed at exit, so vLLM's IPC
sockets don't litter /tmp). Nothing is changed on GPU hosts.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

_ENV_SET_BY_US: dict[str, str] = {}
_ENV_LOCK = threading.Lock()
_RPC_DIR: str | None = None


def on_cpu() -> bool:
    """Whether vLLM (or, without it, torch) runs on the CPU here."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # pragma: no cover - fall back to torch
        import torch

        return not torch.cuda.is_available()


def cpu_auto_dtype() -> str | None:
    """What ``dtype="auto"`` should mean on this CPU: ``float32`` on x86 CPUs without native
    bf16 (no AVX512-BF16/AMX), where vLLM's bf16 kernels are emulated and several times slower
    (SmolLM2-135M, 2-core AVX2, batch 32: 16 tok/s bf16 vs 75 tok/s float32); None otherwise."""
    try:
        import platform

        import torch

        if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
            return None
        native = torch.cpu._is_avx512_bf16_supported() or (
            hasattr(torch.cpu, "_is_amx_tile_supported") and torch.cpu._is_amx_tile_supported()
        )
        return None if native else "float32"
    except Exception:  # pragma: no cover - private torch API moved
        return None


def _cleanup_rpc_dir() -> None:
    if _RPC_DIR and os.path.isdir(_RPC_DIR):
        shutil.rmtree(_RPC_DIR, ignore_errors=True)


def configure_cpu_env() -> dict[str, str]:
    """Set vLLM's CPU environment variables that are not already set; returns what was set.

    Idempotent; does nothing on GPU hosts."""
    global _RPC_DIR
    with _ENV_LOCK:
        if _ENV_SET_BY_US or not on_cpu():
            return dict(_ENV_SET_BY_US)
        from backend.runtime.cache import cache_root

        wanted: dict[str, str] = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(cache_root() / "torchinductor"),
        }
        if "VLLM_RPC_BASE_PATH" not in os.environ or "TMPDIR" not in os.environ:
            # Short path: unix socket paths are limited to ~107 bytes.
            _RPC_DIR = tempfile.mkdtemp(prefix="ali-vllm-")
            atexit.register(_cleanup_rpc_dir)
            wanted["VLLM_RPC_BASE_PATH"] = _RPC_DIR
            wanted["TMPDIR"] = _RPC_DIR
        for k, v in wanted.items():
            if k not in os.environ:
                os.environ[k] = v
                _ENV_SET_BY_US[k] = v
        return dict(_ENV_SET_BY_US)
