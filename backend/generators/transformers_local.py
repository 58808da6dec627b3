"""Local transformers generation: ``model.generate`` in a worker thread, ids streamed back.

The generation is one generator function of plain data (:func:`_stream_task`: a registry key,
the prompt ids, the sampling parameters, the constraint) that yields the new ids as they come and
then the result, so that on a ZeroGPU Space it can run inside ``@spaces.GPU`` in the process
forked for the call (:mod:`backend.runtime.zerogpu`), and anywhere else in a thread of this one: the same
code either way.

One generation runs at a time per loaded model (a lock), so seeds are reproducible and a small
machine is not oversubscribed. Cancelling the calling task sets a flag that a stopping criterion
checks at every step; the worker stops after the current step and ``CancelledError`` is re-raised.
Constraints (regex, JSON schema, EBNF/Lark grammar, structural tag) are enforced by an xgrammar
token mask when ``xgrammar`` is installed (it comes with vLLM).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from backend.generators.base import Generation, GenerationError, Generator, Request, SamplingParams, first_line
from backend.runtime import zerogpu


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def _resolve_dtype(dtype: Any, device: str) -> Any:
    import torch

    if dtype in (None, "auto"):
        # CPUs without bf16 units run float32 much faster, and it is the exact reference.
        return torch.float32 if device == "cpu" else "auto"
    if isinstance(dtype, str):
        try:
            return getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}.get(dtype, dtype))
        except AttributeError as e:
            raise ValueError(f"unknown dtype {dtype!r}") from e
    return dtype


class _IdStreamer:
    """A transformers streamer that queues the new ids (not text) of each step."""

    def __init__(self, out: queue.SimpleQueue) -> None:
        self.out = out
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # the first call carries the prompt
            self._prompt_seen = True
            return
        ids = [int(x) for x in value.reshape(-1).tolist()]
        if ids:
            self.out.put(("ids", ids))

    def end(self) -> None:
        pass


class XGrammarLogitsProcessor:
    """Masks logits to the tokens an xgrammar matcher allows next (batch size 1)."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = compiled.tokenizer_info.vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        self._started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self._started:
            last = int(input_ids[0, -1])
            if not self.matcher.is_terminated() and not self.matcher.accept_token(last):
                raise GenerationError(f"constrained decoding: token {last} was not allowed by the grammar")
        self._started = True
        if self.matcher.is_terminated():
            return scores
        if self.matcher.fill_next_token_bitmask(self.bitmask, 0):
            device = scores.device
            # a copy: generate() hands the processors the very tensor it keeps as the raw logits
            # (output_logits), and masking it in place made "raw" logprobs the grammar's
            s = scores.clone() if device.type in ("cpu", "cuda") else scores.to("cpu")
            width = min(s.shape[-1], self.vocab_size)
            view = s[..., :width]
            self._xgr.apply_token_bitmask_inplace(view, self.bitmask.to(s.device), vocab_size=width)
            if s.shape[-1] > width:
                s[..., width:] = float("-inf")
            scores = s if s is scores else s.to(device)
        return scores


class _Stop:
    """Stopping criterion: the cancel flag."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


class TransformersGenerator(Generator):
    """A Hugging Face causal LM (local folder or hub id), generated with ``model.generate``."""

    name = "transformers"
    label = "transformers"
    raw_logprobs_see_constraint = False  # output_logits are taken before the processors (a copy is masked)

    def __init__(self, model_or_path: str, *, device: str = "auto", dtype: Any = "auto", logprobs_mode: str = "raw_logprobs",
                 zerogpu: bool = False) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        # raw_logprobs: log-softmax of the model's logits (generate's output_logits), before
        # temperature / top-k / top-p; processed_logprobs: of the scores the token was sampled
        # from (output_scores: after the logits processors, the decoding constraint included)
        self.logprobs_mode = logprobs_mode
        self.model_name = model_or_path
        self.device_request = device
        self.dtype_request = dtype
        self.model: Any = None
        self.tokenizer: Any = None
        self.device: str | None = None
        self.load_seconds: float | None = None
        self._load_lock = threading.Lock()
        self._gen_lock = threading.Lock()
        self._grammar_compiler: Any = None
        # on ZeroGPU every generation runs inside @spaces.GPU (backend.runtime.zerogpu), leased for its size
        self.zerogpu = bool(zerogpu)
        self._key = next(_KEYS)
        _LIVE[self._key] = self

    # ---- loading ------------------------------------------------------------------------------

    def load(self) -> TransformersGenerator:
        """Load the model and tokenizer (blocking; idempotent)."""
        with self._load_lock:
            if self.model is not None:
                return self
            from transformers import AutoModelForCausalLM, AutoTokenizer

            t0 = time.perf_counter()
            device = _resolve_device(self.device_request)
            dtype = _resolve_dtype(self.dtype_request, device)
            try:
                tok = AutoTokenizer.from_pretrained(self.model_name)
                model = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=dtype)
            except Exception as e:  # OSError / ValueError / hub errors
                raise GenerationError(f"cannot load model {self.model_name!r} with transformers: {first_line(e)}") from e
            model = zerogpu.to_device(model, device)  # on ZeroGPU from any thread (see there)
            model.eval()
            self.tokenizer, self.model, self.device = tok, model, device
            self.load_seconds = time.perf_counter() - t0
        return self

    async def start(self) -> TransformersGenerator:
        await asyncio.get_running_loop().run_in_executor(None, self.load)
        return self

    def eos_token_ids(self) -> list[int]:
        ids: list[int] = []
        for src in (getattr(self.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if src is None:
                continue
            for i in src if isinstance(src, (list, tuple)) else [src]:
                if int(i) not in ids:
                    ids.append(int(i))
        return ids

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "model": self.model_name}
        if self.zerogpu:
            d["zerogpu"] = True
        if self.model is not None:
            d["device"] = self.device
            d["dtype"] = str(self.model.dtype).replace("torch.", "")
            try:
                import transformers

                d["transformers_version"] = transformers.__version__
            except Exception:  # pragma: no cover
                pass
        return d

    async def close(self) -> None:
        _LIVE.pop(self._key, None)
        self.model = None
        self.tokenizer = None
        self._grammar_compiler = None

    # ---- constraints --------------------------------------------------------------------------

    def _logits_processor(self, kind: str | None, structured: tuple[str, Any] | None) -> Any:
        """An xgrammar logits processor for ``structured`` (``(field, spec)``, see
        :func:`~backend.constraints.normalize_constraint`); None for no constraint."""
        if structured is None:
            return None
        try:
            import xgrammar as xgr
        except ImportError as e:
            raise NotImplementedError(
                f"constraint {kind!r} with the transformers backend needs xgrammar (pip install xgrammar)"
            ) from e
        if self._grammar_compiler is None:
            vocab = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab, stop_token_ids=self.eos_token_ids() or None)
            self._grammar_compiler = xgr.GrammarCompiler(info)
        comp = self._grammar_compiler
        field, spec = structured
        try:
            if field == "regex":
                compiled = comp.compile_regex(spec)
            elif field == "json":
                compiled = comp.compile_json_schema(spec)
            elif field == "grammar":
                compiled = comp.compile_grammar(spec) if "::=" in spec else comp.compile_lark(spec)
            else:
                compiled = comp.compile_structural_tag(spec)
        except Exception as e:
            raise GenerationError(f"invalid {kind} constraint: {e}") from e
        return XGrammarLogitsProcessor(compiled)

    # ---- generation ---------------------------------------------------------------------------

    def _generate_blocking(self, prompt_ids: list[int], params: SamplingParams, kind: str | None,
                           structured: tuple[str, Any] | None, streamer: _IdStreamer, cancel: threading.Event,
                           max_time: float | None) -> dict[str, Any]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        with self._gen_lock:
            if cancel.is_set():
                return {"ids": [], "cancelled": True}
            model, tok = self.model, self.tokenizer
            if model is None:
                raise GenerationError("the model was closed")
            eos = self.eos_token_ids()
            greedy = params.temperature is None or params.temperature <= 0
            pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
            cfg = GenerationConfig(
                max_new_tokens=params.max_tokens,
                do_sample=not greedy,
                temperature=None if greedy else params.temperature,
                top_p=None if greedy or params.top_p >= 1.0 else params.top_p,
                # 0, not None: None means transformers' default top_k of 50, a filter nobody asked for
                top_k=None if greedy else (params.top_k if params.top_k and params.top_k > 0 else 0),
                repetition_penalty=None if params.repetition_penalty == 1.0 else params.repetition_penalty,
                eos_token_id=None if params.ignore_eos else (eos or None),
                pad_token_id=pad,
                bos_token_id=None,
                output_logits=params.logprobs is not None and self.logprobs_mode == "raw_logprobs",
                output_scores=params.logprobs is not None and self.logprobs_mode == "processed_logprobs",
                return_dict_in_generate=True,
                stop_strings=list(params.stop) or None,
                max_time=max_time,  # ZeroGPU: end the turn before the GPU lease does
            )
            processors = LogitsProcessorList()
            lp = self._logits_processor(kind, structured)
            if lp is not None:
                processors.append(lp)
            if params.seed is not None:
                torch.manual_seed(params.seed)
            input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
            kwargs: dict[str, Any] = {}
            if params.stop:
                kwargs["tokenizer"] = tok
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=cfg,
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([_Stop(cancel)]),
                    streamer=streamer,
                    **kwargs,
                )
            elapsed = time.perf_counter() - t0
            ids = [int(x) for x in out.sequences[0, input_ids.shape[1] :].tolist()]
            logprobs = None
            per_token = out.logits if self.logprobs_mode == "raw_logprobs" else out.scores
            if params.logprobs is not None and per_token is not None:
                logprobs = []
                for step, tid in zip(per_token, ids, strict=False):
                    logprobs.append(float(torch.log_softmax(step[0].float(), dim=-1)[tid]))
            timed_out = max_time is not None and elapsed >= max_time and not (ids and ids[-1] in eos)
            return {"ids": ids, "logprobs": logprobs, "elapsed_s": elapsed, "eos": eos, "cancelled": cancel.is_set(),
                    "time_limit_s": max_time if timed_out else None}

    def stream(self, prompt_ids: list[int], params: SamplingParams, kind: str | None, structured: tuple[str, Any] | None,
               max_time: float | None = None) -> Iterator[tuple[str, Any]]:
        """Generate, yielding ``("ids", [new ids])`` per step, then ``("done", result)`` or
        ``("error", message)`` (data, not an exception: on ZeroGPU it crosses a process
        boundary, where an exception would arrive as its class name only). Closing the iterator
        stops the generation after the current step."""
        out: queue.SimpleQueue = queue.SimpleQueue()
        cancel = threading.Event()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result.update(self._generate_blocking(prompt_ids, params, kind, structured, _IdStreamer(out), cancel, max_time))
            except GenerationError as e:
                result["error"] = str(e)
            except Exception as e:  # noqa: BLE001 - reported to the caller as data (see above)
                result["error"] = f"transformers generation failed: {type(e).__name__}: {first_line(e)}"
            finally:
                out.put(None)

        worker = threading.Thread(target=work, name="ali-transformers-generate", daemon=True)
        worker.start()
        try:
            while (item := out.get()) is not None:
                yield item
        finally:
            cancel.set()  # a no-op when the generation ended; else it stops after this step
            worker.join()
        yield ("error", result["error"]) if "error" in result else ("done", result)

    def _consume(self, prompt_ids: list[int], params: SamplingParams, request: Request, relay: Any,
                 cancel: threading.Event) -> dict[str, Any]:
        """Run :func:`_gpu_stream` (on the lent GPU on ZeroGPU, here otherwise), forwarding the
        new ids to ``relay``; ``cancel`` closes it after the current step."""
        kind = request.constraint and request.constraint.kind
        # the lease's size only: its deadline is set by the GPU task when it starts (ZeroGPU
        # schedules it on the first next() and may queue it first)
        lease = zerogpu.duration_s(params.max_tokens, len(prompt_ids)) if self.zerogpu else None
        got: list[int] = []
        it = _gpu_stream(self._key, list(prompt_ids), params, kind, request.structured, lease)
        try:
            for tag, value in it:
                if tag == "ids":
                    got.extend(value)
                    relay(value)
                elif tag == "error":
                    raise GenerationError(value)
                else:
                    if self.zerogpu and value.get("elapsed_s"):
                        zerogpu.SPEED.record(len(value["ids"]), value["elapsed_s"])
                    return value
                if cancel.is_set():
                    break
        except GenerationError:
            raise
        except Exception as e:
            msg = zerogpu.gpu_error(e)
            if msg is None:
                raise
            raise GenerationError(msg) from None
        finally:
            it.close()
        return {"ids": got, "cancelled": True}

    async def _generate(self, request: Request) -> Generation:
        params = request.params
        await self.start()
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def relay(ids: list[int]) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, ids)
            except RuntimeError:  # the loop is closed
                pass

        # the caller's context goes with the call: ZeroGPU reads the gradio request from it
        ctx = contextvars.copy_context()
        fut = loop.run_in_executor(None, ctx.run, self._consume, list(request.prompt_ids), params, request, relay, cancel)
        try:
            while True:
                getter = asyncio.ensure_future(q.get())
                done, _ = await asyncio.wait({getter, fut}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    request.emit(getter.result())
                    continue
                getter.cancel()
                break
            res = fut.result()  # raises the worker's exception
            # deltas queued before the worker finished
            while not q.empty():
                request.emit(q.get_nowait())
        except BaseException:
            cancel.set()
            if not fut.done():
                try:
                    await asyncio.shield(fut)
                except BaseException:
                    pass
            raise
        ids = res["ids"]
        if res.get("cancelled"):
            finish = "abort"
        elif ids and not params.ignore_eos and ids[-1] in res.get("eos", []):
            finish = "stop"
        elif (params.max_tokens is not None and len(ids) >= params.max_tokens) or res.get("time_limit_s"):
            finish = "length"
        else:
            finish = "stop"  # a stop string
        info: dict[str, Any] = {"elapsed_s": res.get("elapsed_s")}
        if res.get("time_limit_s"):
            info["time_limit_s"] = res["time_limit_s"]  # ZeroGPU: stopped before the GPU lease ended
        return Generation(ids, finish, res.get("logprobs"), info)


# ---- the GPU task ---------------------------------------------------------------------------------

_LIVE: weakref.WeakValueDictionary[int, TransformersGenerator] = weakref.WeakValueDictionary()  # by key: a process forked for a ZeroGPU call finds its model here
_KEYS = itertools.count(1)


def _stream_task(key: int, prompt_ids: list[int], params: SamplingParams, kind: str | None,
                 structured: tuple[str, Any] | None, lease_s: float | None) -> Iterator[tuple[str, Any]]:
    """One generation by the model registered under ``key`` (see :meth:`TransformersGenerator.stream`).
    With a lease (ZeroGPU), it ends a margin before ``lease_s`` seconds from now: the task's own
    start, after ZeroGPU's queue, not the moment the lease was asked for."""
    deadline = zerogpu.lease_deadline(lease_s) if lease_s else None
    gen = _LIVE.get(key)
    if gen is None or gen.model is None:
        yield ("error", "the model is not loaded in this process (it was closed, or loaded after the GPU worker started)")
        return
    yield from gen.stream(prompt_ids, params, kind, structured, zerogpu.time_left(deadline))


def _lease(key: int, prompt_ids: list[int], params: SamplingParams, kind: str | None, structured: Any,
           lease_s: float | None) -> float:
    """ZeroGPU's ``duration`` for :func:`_stream_task` (sized by the caller: the last argument)."""
    return lease_s or zerogpu.duration_s(params.max_tokens, len(prompt_ids))


_gpu_stream = zerogpu.gpu_task(_stream_task, duration=_lease)
