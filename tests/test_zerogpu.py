"""ZeroGPU (backend.zerogpu): the transformers generation and the lens's scoring inside
``@spaces.GPU``. There is no ZeroGPU here, so the device is faked at its edge: a stand-in for the
``spaces`` package that does what ZeroGPU does to a call and nothing more — pickles the
arguments, runs the function in a process forked for the call, streams what it yields back, and
refuses a call whose lease exceeds the visitor's quota with the error ZeroGPU raises, and can make
the visitor wait in ZeroGPU's queue first (a clock moved forward). The model, the tokenizer, the
generation and the scorer are real (the tiny random Llama, on the CPU). The real ``spaces``
package is checked for what it must do off ZeroGPU (nothing) and, in a process of its own with
CPU torch dressed as a CUDA build (``tests/zerogpu_sim.py``), for its thread-local CUDA emulation
in the app's process, which our stand-in does not model."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
import types

import gradio as gr
import pytest

from backend import zerogpu
from backend.generators import transformers_local as tl
from backend.generators.base import Constraint, GenerationError, SamplingParams
from backend.generators.transformers_local import TransformersGenerator

FORK_TIMEOUT_S = 120  # a GPU task that never answers fails the test instead of hanging it


class FakeZeroGPU:
    """The ZeroGPU edge: ``spaces.GPU(duration=…)`` for generator and plain functions."""

    def __init__(self, quota_s: float | None = None) -> None:
        self.quota_s = quota_s
        self.leases: list[float] = []
        self.queue_s = 0.0  # how long a call waits in ZeroGPU's queue (the clock below moves on)
        self.clock_offset = 0.0

    def time(self) -> float:
        """backend.zerogpu's clock: the wall clock plus the queue waits so far."""
        return time.time() + self.clock_offset

    def GPU(self, task=None, *, duration=None, size=None):  # noqa: N802 - the package's name
        if task is None:
            return lambda fn: self.GPU(fn, duration=duration, size=size)
        import inspect

        fake = self

        def schedule(args, kwargs) -> None:
            lease = duration(*args, **kwargs) if callable(duration) else duration
            fake.leases.append(lease)
            fake.clock_offset += fake.queue_s  # scheduled on the first next(), after the wait
            if fake.quota_s is not None and lease > fake.quota_s:
                raise gr.Error(f"You have exceeded your free ZeroGPU quota ({lease:g}s requested vs. {fake.quota_s:g}s left). "
                               "Try again in 0:12:00.", title="ZeroGPU quota exceeded", print_exception=False)
            pickle.dumps((args, kwargs))  # ZeroGPU sends them to the forked worker

        def child(q, args, kwargs, gen):
            def work():
                try:
                    if gen:
                        for item in task(*args, **kwargs):
                            q.put(("item", pickle.dumps(item)))
                    else:
                        q.put(("item", pickle.dumps(task(*args, **kwargs))))
                except Exception as e:  # ZeroGPU sends the class name only
                    q.put(("exc", type(e).__name__))
                q.put(("end", None))

            # as ZeroGPU's worker does: the task runs in a fresh thread of the forked process (the
            # forking thread's OpenMP team does not survive a fork: torch there would hang)
            t = threading.Thread(target=work)
            t.start()
            t.join()

        def run(args, kwargs, gen):
            schedule(args, kwargs)
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q, args, kwargs, gen), daemon=True)
            p.start()
            try:
                while True:
                    kind, value = q.get(timeout=FORK_TIMEOUT_S)
                    if kind == "end":
                        return
                    if kind == "exc":
                        raise gr.Error(value, title="ZeroGPU worker error")
                    yield pickle.loads(value)
            finally:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()

        if inspect.isgeneratorfunction(task):
            def handler(*args, **kwargs):
                yield from run(args, kwargs, True)
        else:
            def handler(*args, **kwargs):
                return next(run(args, kwargs, False))
        return handler


@pytest.fixture
def fake_zerogpu(monkeypatch):
    fake = FakeZeroGPU()
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(zerogpu, "cpu_torch", lambda: None)  # the ZeroGPU Space has the CUDA build of torch
    monkeypatch.setattr(zerogpu, "time", types.SimpleNamespace(time=fake.time))
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=fake.GPU))
    fake.wrap = lambda: monkeypatch.setattr(tl, "_gpu_stream", zerogpu.gpu_task(tl._stream_task, duration=tl._lease))
    return fake


@pytest.fixture(scope="module")
def tiny_gen(tiny_model_dir):
    return TransformersGenerator(tiny_model_dir).load()


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


async def test_generation_in_a_forked_gpu_process_matches_in_process(tiny_gen, fake_zerogpu):
    prompt = [1, 5, 9, 42, 7]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    tiny_gen.zerogpu = False
    here = await tiny_gen.generate(prompt, params)  # in this process, unwrapped
    fake_zerogpu.wrap()
    tiny_gen.zerogpu = True
    try:
        streamed: list[list[int]] = []
        there = await tiny_gen.generate(prompt, params, on_tokens=streamed.append)
    finally:
        tiny_gen.zerogpu = False
    assert there.token_ids == here.token_ids and len(there.token_ids) == 12
    assert there.logprobs == pytest.approx(here.logprobs, abs=1e-5)
    assert there.finish_reason == here.finish_reason == "length"
    assert sum(streamed, []) == there.token_ids and len(streamed) > 1  # streamed across the process boundary
    assert fake_zerogpu.leases == [zerogpu.duration_s(12, len(prompt))]


async def test_time_waited_in_zerogpus_queue_is_not_taken_from_the_turn(tiny_gen, fake_zerogpu):
    """ZeroGPU schedules a generator task on its first next() and may queue it (up to 60 s): the
    deadline must run from the task's start. Here the queue takes ten minutes of the clock; the
    400-token turn must still end on max_tokens, not on the time limit."""
    fake_zerogpu.queue_s = 600.0
    fake_zerogpu.wrap()
    tiny_gen.zerogpu = True
    try:
        g = await tiny_gen.generate([1, 5, 9], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    finally:
        tiny_gen.zerogpu = False
    assert "time_limit_s" not in g.info, g.info
    assert len(g.token_ids) == 400 and g.finish_reason == "length"
    assert fake_zerogpu.leases and fake_zerogpu.clock_offset == 600.0


async def test_an_error_inside_the_gpu_process_keeps_its_message(tiny_gen, fake_zerogpu):
    fake_zerogpu.wrap()
    tiny_gen.zerogpu = True
    try:
        with pytest.raises(GenerationError, match="invalid regex constraint"):
            await tiny_gen.generate([1, 2, 3], SamplingParams(max_tokens=4), constraint=Constraint("regex", "(unclosed"))
    finally:
        tiny_gen.zerogpu = False


async def test_spent_quota_is_a_clear_message(tiny_gen, fake_zerogpu):
    fake_zerogpu.quota_s = 12
    fake_zerogpu.wrap()
    tiny_gen.zerogpu = True
    try:
        with pytest.raises(GenerationError) as e:
            await tiny_gen.generate([1, 2, 3], SamplingParams(max_tokens=2000))
    finally:
        tiny_gen.zerogpu = False
    msg = str(e.value)
    assert msg.startswith("ZeroGPU quota exceeded: You have exceeded your free ZeroGPU quota")
    assert "smaller Max tokens" in msg and "Trace files" in msg
    assert zerogpu.gpu_error(gr.Error("some other failure")) is None and zerogpu.gpu_error(ValueError("x")) is None


@pytest.mark.slow
def test_lens_scoring_in_a_forked_gpu_process(monkeypatch, smollm2_model_dir):
    """The lens's scoring in the GPU process: the scorer loaded in the app's process before the
    call (the forked process inherits it, as ZeroGPU's worker does), numbers equal to in-process."""
    import asyncio

    from backend.config import LoopConfig
    from backend.engine import AgentLoop
    from backend.logprobs import TransformersScorer, score_trace
    from backend.tokenizers import load_tokenizer
    from ui import logprob_lens as L
    from ui.context import AppContext, ModelOptions, ModelService

    gen = TransformersGenerator(smollm2_model_dir).load()
    cfg = LoopConfig(sampling={"temperature": 1.0, "seed": 3, "max_tokens": 12, "logprobs": 0}, max_assistant_turns=1)
    trace = asyncio.run(AgentLoop(gen, load_tokenizer("smollm2"), config=cfg).run([{"role": "user", "content": "Hi!"}]))
    ctx = AppContext(model=ModelService(ModelOptions(backend="transformers")))

    fake = FakeZeroGPU()
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(zerogpu, "cpu_torch", lambda: None)
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=fake.GPU))
    monkeypatch.setattr(L, "_score_on_gpu", zerogpu.gpu_task(L._score_task, duration=L._score_lease))
    monkeypatch.setattr(L, "SCORERS", L._Scorers())
    # this thread runs torch before the fork (as a long-lived app or test process has): the GPU
    # process must still work (ZeroGPU runs the task in a fresh thread of the forked process)
    expected = score_trace(trace, TransformersScorer(smollm2_model_dir, "float32"))
    scored = L.score_sync(ctx, trace, "float32")
    assert L.SCORERS.keys() == [(smollm2_model_dir, "float32", "cpu")]
    got = [s.info.trainer_logprobs for s in scored.steps]
    want = [s.info.trainer_logprobs for s in expected.steps]
    assert any(got) and got == want
    assert fake.leases == [zerogpu.scoring_duration_s(len(trace.input_ids))]
    fake.quota_s = 1
    with pytest.raises(L.LensError, match="ZeroGPU quota exceeded"):
        L.score_sync(ctx, trace, "float32")


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


def test_zerogpu_hardware_with_cpu_torch_starts_without_importing_spaces():
    """The cpu files on ZeroGPU hardware: ``import spaces`` reads ``torch.version.cuda`` (None for
    the CPU build) and raised before the app could say anything. This machine has that torch: the
    app's start-up, up to launch, must run, say why in one line, and leave `spaces` alone. The
    queue it builds has an explicit size (gradio makes it 1 on ZeroGPU when none is given)."""
    code = (
        "import sys, json, gradio as gr\n"
        "from backend import lifecycle\n"
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
