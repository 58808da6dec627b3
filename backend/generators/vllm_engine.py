"""In-process vLLM engine (v1 ``AsyncLLM``): token ids in, token ids out.

The engine lives on its own event loop in a private daemon thread, so one engine can serve any
number of caller event loops (Gradio's, a CLI's ``asyncio.run``, pytest's) without being tied to
the loop that happened to start it. Deltas are relayed to the caller's loop and ``on_tokens`` is
called there, in the calling task.

CPU hosts (vLLM's CPU build, no CUDA): ``dtype="auto"`` becomes ``float32`` on x86 CPUs without
native bf16, the process environment gets vLLM's CPU settings (both:
:mod:`backend.generators.vllm_cpu`) and ``enforce_eager`` defaults to True. Nothing is changed
on GPU hosts: the same code runs with the official ``vllm`` package.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from backend.constraints import structured_outputs
from backend.generators.base import Constraint, Generation, GenerationError, Generator, Request, SamplingParams, Stopwatch
from backend.generators.vllm_cpu import configure_cpu_env, cpu_auto_dtype, on_cpu

log = logging.getLogger(__name__)


def _max_model_len(engine: Any) -> int | None:
    """The context length the engine runs with (after vLLM fitted it to memory, for -1)."""
    mc = getattr(engine, "model_config", None)
    return getattr(mc, "max_model_len", None)


def to_vllm_sampling_params(params: SamplingParams, constraint: Constraint | None = None, **extra: Any):
    """Our sampling parameters (+ constraint) as ``vllm.SamplingParams`` (DELTA streaming)."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.sampling_params import SamplingParams as VSamplingParams

    kw: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k and params.top_k > 0 else 0,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
        "repetition_penalty": params.repetition_penalty,
        "ignore_eos": params.ignore_eos,
        "output_kind": RequestOutputKind.DELTA,
    }
    if params.stop:
        kw["stop"] = list(params.stop)
    else:
        kw["detokenize"] = False  # ids only; text is the caller's business
    if params.logprobs is not None:
        kw["logprobs"] = params.logprobs
    so = structured_outputs_params(constraint)
    if so is not None:
        kw["structured_outputs"] = so
    kw.update(extra)
    return VSamplingParams(**kw)


def structured_outputs_params(constraint: Constraint | None):
    """A :class:`Constraint` as ``vllm.sampling_params.StructuredOutputsParams`` (None: none)."""
    so = structured_outputs(constraint)
    if so is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**so)


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The logprob of each sampled token from vLLM's per-position logprobs."""
    out: list[float] = []
    if logprobs is None:
        return out
    for tid, pos in zip(token_ids, logprobs, strict=False):
        lp = pos.get(tid) if pos is not None else None
        out.append(float(lp.logprob) if lp is not None else float("nan"))
    return out


class _EngineThread:
    """A daemon thread running a private asyncio loop (the engine's home)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="ali-vllm-engine", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()


_DONE = object()


class VLLMEngineGenerator(Generator):
    """vLLM's in-process ``AsyncLLM`` behind the :class:`Generator` interface.

    The engine starts on first use or on ``await start()``. ``enforce_eager=None`` means True on
    CPU, False on GPU. ``extra_engine_args`` go to ``AsyncEngineArgs`` unchanged.
    """

    name = "vllm"
    label = "vLLM"
    _ids = itertools.count()

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        extra_engine_args: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.seed = seed
        self.extra_engine_args = dict(extra_engine_args or {})
        # vLLM's own default when the engine args do not name one
        self.logprobs_mode = str(self.extra_engine_args.get("logprobs_mode", "raw_logprobs"))
        self.engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self.start_seconds: float | None = None
        self.env_set: dict[str, str] = {}
        self._thread: _EngineThread | None = None
        self._start_future: concurrent.futures.Future | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._device = "cpu"
        self._prefix = f"ali-{os.getpid()}-{next(self._ids)}-"
        self._finalizer = weakref.finalize(self, VLLMEngineGenerator._finalize, self.__dict__)

    # ---- lifecycle ----------------------------------------------------------------------------

    def _create_engine(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cpu = on_cpu()
        self._device = "cpu" if cpu else "gpu"
        if cpu:
            self.env_set = configure_cpu_env()
        eager = self.enforce_eager if self.enforce_eager is not None else cpu
        dtype = self.dtype
        if cpu and dtype == "auto":
            dtype = cpu_auto_dtype() or "auto"
        kw: dict[str, Any] = dict(
            model=self.model,
            dtype=dtype,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            enforce_eager=eager,
            seed=self.seed,
            disable_log_stats=True,
        )
        kw.update(self.extra_engine_args)
        t0 = time.perf_counter()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        self.start_seconds = time.perf_counter() - t0
        if kw.get("max_model_len") == -1:  # fit to memory (backend.deploy.hardware's default on a GPU)
            log.info("vLLM: max_model_len -1 (fit to memory): %s tokens", _max_model_len(engine))
        return engine

    async def _create_on_loop(self) -> Any:
        return self._create_engine()

    def _ensure_started_future(self) -> concurrent.futures.Future:
        with self._lock:
            if self._closed:
                raise GenerationError("this vLLM engine generator is closed")
            if self._start_future is None:
                self._thread = _EngineThread()
                fut = self._thread.submit(self._create_on_loop())
                self._start_future = fut

                def _done(f: concurrent.futures.Future) -> None:
                    if not f.cancelled() and f.exception() is None:
                        self.engine = f.result()
                        self.__dict__["_engine_for_finalizer"] = self.engine

                fut.add_done_callback(_done)
            return self._start_future

    async def start(self) -> VLLMEngineGenerator:
        """Start the engine (idempotent; concurrent callers share one start)."""
        fut = self._ensure_started_future()
        try:
            await asyncio.wrap_future(fut)
        except Exception as e:
            raise GenerationError(f"cannot start vLLM engine for {self.model}: {type(e).__name__}: {e}") from e
        return self

    def start_sync(self) -> VLLMEngineGenerator:
        """Blocking :meth:`start` for code outside any event loop."""
        fut = self._ensure_started_future()
        try:
            fut.result()
        except Exception as e:
            raise GenerationError(f"cannot start vLLM engine for {self.model}: {type(e).__name__}: {e}") from e
        return self

    @staticmethod
    def _finalize(state: dict[str, Any]) -> None:
        engine = state.get("_engine_for_finalizer")
        thread = state.get("_thread")
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                pass
        if thread is not None:
            thread.stop()

    def shutdown(self) -> None:
        """Blocking close: shut the engine down and stop its thread."""
        with self._lock:
            self._closed = True
            fut, thread = self._start_future, self._thread
        if fut is None or thread is None:
            return
        try:
            fut.result()
        except Exception:
            pass
        engine = self.engine
        if engine is not None:

            async def _shutdown() -> None:
                engine.shutdown()

            try:
                thread.submit(_shutdown()).result(timeout=60)
            except Exception:
                pass
        thread.stop()
        self.engine = None
        self.__dict__.pop("_engine_for_finalizer", None)
        self._finalizer.detach()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown)

    # ---- helpers for tests and benchmarks -----------------------------------------------------

    async def run_on_engine(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``fn(engine)`` (a coroutine function) on the engine's loop; for raw-vLLM
        comparisons in tests and benchmarks."""
        await self.start()
        assert self._thread is not None
        return await asyncio.wrap_future(self._thread.submit(fn(self.engine)))

    def num_unfinished_requests(self) -> int:
        return 0 if self.engine is None else int(self.engine.get_num_unfinished_requests())

    def context_length(self) -> int | None:
        if self.engine is not None:
            try:
                return _max_model_len(self.engine)
            except Exception:  # pragma: no cover - an engine without a model config
                return None
        return self.max_model_len if isinstance(self.max_model_len, int) and self.max_model_len > 0 else None

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "model": self.model, "dtype": self.dtype}
        try:
            import vllm

            d["vllm_version"] = vllm.__version__
        except Exception:  # pragma: no cover
            pass
        if self.engine is not None:
            d["device"] = self._device
            try:
                mc = self.engine.model_config
                d["max_model_len"] = _max_model_len(self.engine)
                d["dtype"] = str(mc.dtype).replace("torch.", "")
            except Exception:  # pragma: no cover
                pass
            if self.start_seconds is not None:
                d["engine_start_s"] = round(self.start_seconds, 2)
        return d

    # ---- generation ---------------------------------------------------------------------------

    async def _produce(
        self,
        request_id: str,
        prompt_ids: list[int],
        vparams: Any,
        push: Callable[[Any], None],
    ) -> None:
        """Runs on the engine loop: stream deltas to ``push``; push a final dict or exception."""
        from vllm.inputs import TokensPrompt

        ids: list[int] = []
        logprobs: list[float] = []
        prompt_lps: list[float] | None = None
        finish_reason = None
        stop_reason = None
        num_cached = None
        clock = Stopwatch()
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), vparams, request_id):
                if num_cached is None:
                    num_cached = getattr(out, "num_cached_tokens", None)
                if prompt_lps is None and getattr(out, "prompt_logprobs", None) is not None:
                    prompt_lps = sampled_logprobs(list(prompt_ids)[1:], out.prompt_logprobs[1:])
                if not out.outputs:
                    continue
                c = out.outputs[0]
                delta = list(c.token_ids)
                if delta:
                    clock.tokens_arrived()
                    ids.extend(delta)
                    if vparams.logprobs is not None:
                        logprobs.extend(sampled_logprobs(delta, c.logprobs))
                    push(delta)
                if c.finish_reason is not None:
                    finish_reason, stop_reason = c.finish_reason, c.stop_reason
            push(
                {
                    "ids": ids,
                    "finish_reason": finish_reason or "abort",
                    "stop_reason": stop_reason,
                    "logprobs": logprobs if vparams.logprobs is not None else None,
                    "ttft_s": clock.ttft_s,
                    "elapsed_s": clock.elapsed_s,
                    "num_cached_tokens": num_cached,
                    "prompt_logprobs": prompt_lps,
                }
            )
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - relayed to the caller
            push(e)

    async def _abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def _generate(self, request: Request) -> Generation:
        await self.start()
        try:
            vparams = to_vllm_sampling_params(request.params, request.constraint)
        except ValueError as e:
            raise GenerationError(f"invalid request for vLLM: {e}") from e
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def push(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is gone; nothing is waiting
                pass

        request_id = f"{self._prefix}{uuid.uuid4().hex[:12]}"
        assert self._thread is not None
        fut = self._thread.submit(self._produce(request_id, list(request.prompt_ids), vparams, push))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, list):
                    request.emit(item)
                    continue
                if isinstance(item, BaseException):
                    raise item
                info = {
                    "request_id": request_id,
                    "stop_reason": item["stop_reason"],
                    "ttft_s": item["ttft_s"],
                    "elapsed_s": item["elapsed_s"],
                    "num_cached_tokens": item["num_cached_tokens"],
                }
                return Generation(item["ids"], item["finish_reason"], item["logprobs"], info)
        except BaseException:
            # Cancelled, on_tokens raised, or the engine failed: make sure the request is gone
            # from the engine before the exception leaves (abort is idempotent).
            if not fut.done():
                fut.cancel()
            try:
                await asyncio.wrap_future(self._thread.submit(self._abort(request_id)))
            except Exception:
                pass
            raise

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's ``prompt_logprobs`` of ``ids``: log p(ids[i] | ids[:i]) for i >= 1, in this
        engine's ``logprobs_mode`` (raw by default: no temperature). One token is generated and
        dropped."""
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VSamplingParams

        await self.start()
        vparams = VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                  output_kind=RequestOutputKind.FINAL_ONLY)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def push(item: Any) -> None:
            if isinstance(item, list):
                return
            def settle() -> None:
                if not done.done():
                    done.set_result(item)
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass

        request_id = f"{self._prefix}score-{uuid.uuid4().hex[:12]}"
        assert self._thread is not None
        self._thread.submit(self._produce(request_id, list(ids), vparams, push))
        item = await done
        if isinstance(item, BaseException):
            raise self._failure(item) if isinstance(item, Exception) else item
        lps = item.get("prompt_logprobs")
        if lps is None or len(lps) != len(ids) - 1:
            raise GenerationError("vLLM returned no prompt logprobs for the request")
        return lps

    def _failure(self, e: Exception) -> GenerationError:
        # vLLM wraps what went wrong in an EngineGenerateError: report the cause
        cause = e.__cause__ if type(e).__name__ == "EngineGenerateError" and e.__cause__ else e
        return super()._failure(cause)  # type: ignore[arg-type]
