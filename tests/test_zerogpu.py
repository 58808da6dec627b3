"""ZeroGPU (backend.runtime.zerogpu): the transformers generation and the lens's scoring inside
``@spaces.GPU``. The cases that run a call the way ZeroGPU does (arguments pickled, the function
in a process forked for the call, its output streamed back; quota and queue) are in
``tests/zerogpu_fork_cases.py`` and run here in a fresh Python process (why: its docstring). The
real ``spaces`` package is checked for what it must do off ZeroGPU (nothing) and, in a process of
its own with CPU torch dressed as a CUDA build (``tests/zerogpu_sim.py``), for its thread-local
CUDA emulation in the app's process, which the fork cases' stand-in does not model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import types

import pytest

from backend.generators import transformers_local as tl
from backend.runtime import zerogpu

CASES = os.path.join(os.path.dirname(__file__), "zerogpu_fork_cases.py")


def _run_fork_cases(marker: str) -> str:
    """pytest on the fork cases selected by ``marker``, in a fresh process; their report on failure.

    One CPU thread for torch in that process (OMP_NUM_THREADS / MKL_NUM_THREADS): the stand-in
    computes on the CPU, and the CPU math libraries are not fork-safe once their thread pools
    exist. The forked task hung inside a Linear's forward for 100 s, twice (CI, and a coverage
    run), after the in-process generation had used the pool, and limiting torch to one thread in
    the forked task alone did not stop it: the pool must never exist in the parent. ZeroGPU's
    task computes on CUDA, so this leaves what is tested (pickling, the fork, streaming, leases,
    errors) as ZeroGPU does it.

    It hung again with one thread (the edit loop, and here 1 run in 4 under two CPU burners): gdb
    on the forked process showed the generation thread spinning in MKL's own allocator
    (``mkl_serv_allocate`` -> ``mm_account_ptr_by_tid``, from ``sgemm``), whose per-thread buffer
    book the fork copied from a parent whose generation thread had used it. MKL_DISABLE_FAST_MM=1
    (MKL's documented switch) makes MKL allocate with malloc instead: 9 runs of 9 passed under the
    same load. It still hung in 3 runs of 11 under two burners, and the hang caught with the
    threads listed had a Python thread that was joined but not yet exited at the fork (the one
    likely explanation, not a proof): the stand-in now waits for such a
    thread to be gone before it forks (``_settle`` in the cases file, which says why); 12 runs of
    12 passed under the same load."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MKL_DISABLE_FAST_MM="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
           "-m", marker, CASES]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=800, env=env, cwd=os.path.dirname(os.path.dirname(CASES)))
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return r.stdout


@pytest.mark.slow  # 15-18 s in the edit loop (a fresh pytest process): in CI's full run
def test_the_gpu_process_cases_pass_in_a_fresh_process():
    """Generation in the forked GPU process equals in-process, streams, keeps its error message,
    waits in the queue without losing turn time, and a spent quota is a clear message."""
    out = _run_fork_cases("not slow")
    assert re.search(r"^4 passed, 1 deselected in ", out, re.M), out[-2000:]


@pytest.mark.slow
def test_the_lens_gpu_process_case_passes_in_a_fresh_process():
    """The lens's scoring in the forked GPU process equals in-process scoring (SmolLM2)."""
    out = _run_fork_cases("slow")
    assert re.search(r"^1 passed, 4 deselected in ", out, re.M), out[-2000:]


def test_off_zerogpu_nothing_is_wrapped(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)

    def f():
        return 1

    assert zerogpu.gpu_task(f, duration=lambda: 5) is f
    assert tl._gpu_stream is tl._stream_task  # imported off ZeroGPU: the plain function


def test_the_real_spaces_package_is_a_no_op_off_zerogpu(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    import spaces

    def f(x):
        return x + 1

    assert spaces.GPU(duration=30)(f) is f and spaces.GPU(f) is f


def test_lease_is_sized_to_the_request(monkeypatch):
    monkeypatch.delenv("ALI_ZEROGPU_MAX_DURATION_S", raising=False)
    short = zerogpu.duration_s(32, 100, tokens_per_s=40)
    longer = zerogpu.duration_s(1024, 100, tokens_per_s=40)
    assert zerogpu.MIN_DURATION_S <= short < longer <= zerogpu.MAX_DURATION_S
    # 1024 tokens at half of 40 tok/s = 51 s of decoding, plus start-up
    assert longer >= 1024 / 20
    assert zerogpu.duration_s(100_000, 0, tokens_per_s=40) == zerogpu.MAX_DURATION_S
    monkeypatch.setenv("ALI_ZEROGPU_MAX_DURATION_S", "45")
    assert zerogpu.duration_s(100_000, 0) == 45
    import time

    assert 0 < zerogpu.lease_deadline(45) - time.time() < 45
    assert zerogpu.time_left(None) is None and zerogpu.time_left(time.time() - 5) == 0.5
    assert zerogpu.scoring_duration_s(4000) >= zerogpu.MIN_DURATION_S


def test_measured_speed_shortens_later_leases():
    speed = zerogpu._Speed()
    assert speed.get() == zerogpu.FALLBACK_TOKENS_PER_S
    speed.record(400, 2.0)  # 200 tok/s
    assert speed.get() == pytest.approx(200)
    assert zerogpu.duration_s(512, 0, tokens_per_s=speed.get()) < zerogpu.duration_s(512, 0)


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_preload_loads_the_model_before_the_server_starts(tiny_model_dir, tmp_path):
    """On ZeroGPU the app loads the model before launch (the weights on the GPU at start are the
    ones moved to each lent slice); a failure is kept as the model's status, the app opens."""
    import asyncio

    from ui.context import ModelOptions, ModelService

    svc = ModelService(ModelOptions(backend="transformers", model=tiny_model_dir, tokenizer="smollm2"))
    svc.preload()
    assert svc.generator is not None and svc.generator.model is not None and svc.status().startswith("ready")
    gen, _ = asyncio.run(svc.get())
    assert gen is svc.generator  # the first run uses it, nothing loads again
    bad = ModelService(ModelOptions(backend="transformers", model=str(tmp_path / "missing"), tokenizer="smollm2"))
    bad.preload()
    assert bad.generator is None and bad.status().startswith("failed to load")


@pytest.mark.slow  # a fresh process importing gradio, torch and the real `spaces`
def test_models_load_on_cuda_from_worker_threads_under_the_real_spaces_patching(tiny_model_dir):
    """The real ``spaces`` 0.51.3 in the app's process (tests/zerogpu_sim.py): a move to "cuda" in
    any thread but the importing one reaches its raising ``_cuda_init``. The lens's scorer (loaded
    in a worker thread by ``score``) and a model loaded lazily by the first run (the event loop's
    executor) must load all the same, into spaces' emulated device."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    script = os.path.join(os.path.dirname(__file__), "zerogpu_sim.py")
    r = subprocess.run([sys.executable, script, tiny_model_dir], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # the simulation is faithful: the trap is there for code that does nothing about it
    assert got["plain_thread"].startswith("RuntimeError: Low-level CUDA init (`torch._C._cuda_init`) reached")
    assert got["generator"] == "ok cuda:0", got["generator"]
    assert got["scorer"] == "ok cuda:0", got["scorer"]


def test_off_zerogpu_and_in_a_gpu_worker_models_move_in_the_calling_thread(monkeypatch):
    """No ``spaces`` patching in this process (off ZeroGPU, or the worker ZeroGPU forked for a
    call, where spaces has restored torch): to_device is a plain ``.to`` in the caller's thread."""
    import torch

    seen = []

    class M(torch.nn.Linear):
        def to(self, *a, **k):  # no CUDA here: where the move would run is what is checked
            seen.append(threading.current_thread().name)
            return self

    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    zerogpu.to_device(M(2, 2), "cuda")  # off ZeroGPU
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setitem(sys.modules, "spaces.zero.torch", types.SimpleNamespace(enter_mode=lambda: None))
    zerogpu.to_device(M(2, 2), "cuda")  # ZeroGPU, but torch not patched by spaces in this process
    monkeypatch.setitem(sys.modules, "spaces.zero.wrappers", types.SimpleNamespace(forked=True))
    zerogpu.to_device(M(2, 2), "cuda")  # the worker forked for a call
    assert seen == [threading.current_thread().name] * 3


@pytest.mark.slow  # 15 s in the edit loop (the whole app built in a fresh process): in CI's full run
def test_zerogpu_hardware_with_cpu_torch_starts_without_importing_spaces():
    """The cpu files on ZeroGPU hardware: ``import spaces`` reads ``torch.version.cuda`` (None for
    the CPU build) and raised before the app could say anything. This machine has that torch: the
    app's start-up, up to launch, must run, say why in one line, and leave `spaces` alone. The
    queue it builds has an explicit size (gradio makes it 1 on ZeroGPU when none is given)."""
    code = (
        "import sys, json, gradio as gr\n"
        "from backend.deploy import lifecycle\n"
        "seen = {}\n"
        "def launch(self, **kw):\n"
        "    seen['max_size'] = self._queue.max_size\n"
        "gr.Blocks.launch = launch\n"
        "lifecycle.wait_for_shutdown = lambda *a, **k: None\n"
        "import app\n"
        "app.main(['--no-model', '--port', '7999'])\n"
        "seen['spaces_imported'] = 'spaces.zero.wrappers' in sys.modules\n"
        "print('RESULT ' + json.dumps(seen), flush=True)\n"
    )
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9", HF_HUB_OFFLINE="1",
               GRADIO_ANALYTICS_ENABLED="False")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    assert got["max_size"] is not None and got["max_size"] > 1
    assert not got["spaces_imported"]
    warn = [x for x in r.stderr.splitlines() if "ZeroGPU hardware but torch" in x]
    assert len(warn) == 1 and "CPU build" in warn[0] and "space_variant.py zerogpu" in warn[0]


def test_the_queue_has_an_explicit_size_on_zerogpu(monkeypatch):
    """gradio (blocks.py) sets max_size=1 on a ZeroGPU Space when none is given; ours is explicit.
    GPU events wait in their own concurrency groups, apart from the CPU-only ones."""
    import ui
    from ui.context import AppContext

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.delenv("ALI_QUEUE_MAX_SIZE", raising=False)
    demo = ui.build_app(AppContext())
    assert demo._queue.max_size == ui.QUEUE_MAX_SIZE > 1
    fn_name = {d.concurrency_id: [] for d in demo.fns.values()}
    for d in demo.fns.values():
        fn_name[d.concurrency_id].append(getattr(d.fn, "__name__", None))
    by_api = {d.api_name: d.concurrency_id for d in demo.fns.values()}
    # the agent runs (the API and the widgets' Send) and the lens's scoring: no CPU-only event with them
    assert set(fn_name[by_api["playground_run"]]) == {"on_send", "on_send_widgets"}
    assert set(fn_name[by_api["inspector_score"]]) == {"on_score"}
    assert by_api["playground_run"] != by_api["inspector_score"]
    monkeypatch.setenv("ALI_QUEUE_MAX_SIZE", "7")
    assert ui.queue_max_size() == 7 and ui.queue_max_size({"ALI_QUEUE_MAX_SIZE": "x"}) == ui.QUEUE_MAX_SIZE
