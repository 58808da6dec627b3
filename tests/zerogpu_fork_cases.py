"""The ZeroGPU cases that fork (run by tests/test_zerogpu.py in a fresh Python process, never in
the suite's own: see ``test_the_gpu_process_cases_pass_in_a_fresh_process`` there).

There is no ZeroGPU here, so the device is faked at its edge: a stand-in for the ``spaces``
package that does what ZeroGPU does to a call and nothing more — pickles the arguments, runs the
function in a process forked for the call, streams what it yields back, refuses a call whose
lease exceeds the visitor's quota with the error ZeroGPU raises, and can make the visitor wait in
ZeroGPU's queue first (a clock moved forward). The model, the tokenizer, the generation and the
scorer are real (the tiny random Llama and SmolLM2, on the CPU).

Why a process of their own: ``fork`` copies one thread and every lock as it stood. In a long-lived
test worker, threads left by earlier tests (engines, servers, generation threads) may hold a lock
at the moment of the fork, and the forked GPU process then waits on it forever (seen once in CI:
the task never answered within 120 s). A ZeroGPU Space forks from its app process, whose threads
are its own; a fresh process here is the faithful parent."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import sys
import threading
import time
import types

import gradio as gr
import pytest

from backend.generators import transformers_local as tl
from backend.generators.base import Constraint, GenerationError, SamplingParams
from backend.generators.transformers_local import TransformersGenerator
from backend.runtime import zerogpu

FORK_TIMEOUT_S = 120  # a GPU task that never answers fails the test instead of hanging it
SETTLE_S = 2.0  # how long a fork waits for threads that were joined but have not yet exited


def _os_threads_without_python() -> set[int]:
    """This process's OS threads that are not live Python threads: native ones (jemalloc's,
    tokenizers') and Python threads that were joined but are still exiting."""
    try:
        tasks = {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # not Linux: nothing to wait for
        return set()
    return tasks - {t.native_id for t in threading.enumerate()}


def _settle(known: set[int]) -> None:
    """Wait (at most SETTLE_S) until no thread but ``known`` ones is outside Python's view.

    Thread.join() returns when the Python thread state is gone, before the OS thread has run its
    thread-local destructors; the in-process generation's thread, just joined, can be inside MKL's
    buffer release then, holding MKL's allocator lock. A fork at that moment copies the lock held,
    and the forked task's first sgemm spins on it for ever (gdb: ``mm_account_ptr_by_tid``; seen
    as a 100 s hang in a Linear's forward, in CI and here 3 runs in 11 under two CPU burners,
    and the one hang caught with the threads listed had such a thread at the fork; the
    gdb stack is the earlier one). ZeroGPU's task computes on CUDA, not MKL:
    this is the CPU stand-in's hazard, so the stand-in waits for the thread to be gone. A native
    thread that a test starts and keeps (a scorer's pool) just ends the wait at SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while _os_threads_without_python() - known and time.monotonic() < deadline:
        time.sleep(0.005)


class FakeZeroGPU:
    """The ZeroGPU edge: ``spaces.GPU(duration=…)`` for generator and plain functions."""

    def __init__(self, quota_s: float | None = None) -> None:
        self.quota_s = quota_s
        self.leases: list[float] = []
        self.queue_s = 0.0  # how long a call waits in ZeroGPU's queue (the clock below moves on)
        self.clock_offset = 0.0
        self.native_threads = _os_threads_without_python()  # the ones a fork need not wait for

    def time(self) -> float:
        """backend.runtime.zerogpu's clock: the wall clock plus the queue waits so far."""
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
            faulthandler.dump_traceback_later(FORK_TIMEOUT_S - 20, exit=True)  # a hang names its stack
            t = threading.Thread(target=work)
            t.start()
            t.join()
            faulthandler.cancel_dump_traceback_later()

        def run(args, kwargs, gen):
            schedule(args, kwargs)
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q, args, kwargs, gen), daemon=True)
            _settle(fake.native_threads)
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
    # the lease is sized from the decode speed the earlier cases measured in this process: a fixed
    # 12 s quota was more than the lease on a fast machine (CI here: "DID NOT RAISE"). The quota is
    # set just under what this request asks for, whatever the speed.
    lease = zerogpu.duration_s(2000, 3)
    fake_zerogpu.quota_s = lease - 1
    fake_zerogpu.wrap()
    tiny_gen.zerogpu = True
    try:
        with pytest.raises(GenerationError) as e:
            await tiny_gen.generate([1, 2, 3], SamplingParams(max_tokens=2000))
    finally:
        tiny_gen.zerogpu = False
    msg = str(e.value)
    assert fake_zerogpu.leases[-1] == lease, fake_zerogpu.leases
    assert msg.startswith("ZeroGPU quota exceeded: You have exceeded your free ZeroGPU quota")
    assert "smaller Max tokens" in msg and "Trace files" in msg
    assert zerogpu.gpu_error(gr.Error("some other failure")) is None and zerogpu.gpu_error(ValueError("x")) is None


@pytest.mark.slow
def test_lens_scoring_in_a_forked_gpu_process(monkeypatch, smollm2_model_dir):
    """The lens's scoring in the GPU process: the scorer loaded in the app's process before the
    call (the forked process inherits it, as ZeroGPU's worker does), numbers equal to in-process."""
    import asyncio

    from backend.checks.logprobs import TransformersScorer, score_trace
    from backend.config import LoopConfig
    from backend.engine import AgentLoop
    from backend.loading.tokenizers import load_tokenizer
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
