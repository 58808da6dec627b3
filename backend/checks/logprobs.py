"""The logprob lens: the rollout's token logprobs against the trainer's, token by token.

* :class:`TransformersScorer` / :func:`score_trace`: the trainer's view. A teacher-forced
  forward pass over the trace's ids with transformers (same weights; float32 or bfloat16), the
  logits divided by the rollout temperature (as verl's actor and TRL do), a log-softmax in
  float32, and the logprob of each response token. Every step with response tokens is scored
  (mask-0 steps for information); the result goes to ``StepInfo.trainer_logprobs`` and the
  scorer's description to ``Trace.scorer``.
* :class:`VLLMPromptScorer`: the second scorer, vLLM's ``prompt_logprobs`` over the same ids
  from an in-process engine (raw logprobs: temperature 1 only; another is refused).
* :func:`compare`: per token Δ = trainer − rollout and the importance ratio exp(Δ); per step and
  per trace: mean / max |Δ|, verl's ``rollout_probs_diff_max/mean/std`` (|exp(rollout) −
  exp(trainer)| over the response mask; std is torch's unbiased one), the share of tokens whose
  ratio is outside [1/C, C], and the k3 KL estimate mean(exp(Δ) − Δ − 1) (KL(rollout ‖ trainer),
  verl's ``low_var_kl``). **Only mask-1 tokens** enter these statistics: mask-0 tokens (tool
  output, template text) are not the policy's.

Rollout logprobs come from ``Step.logprobs`` (recorded by the engine, or imported as verl's
``rollout_log_probs`` / ``response_logprobs``); trainer logprobs from
``StepInfo.trainer_logprobs`` (scored here, or imported as verl's ``old_log_probs``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.errors import UserError
from backend.trace import Trace
from backend.trace.model import Scorer

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_CAP = 2.0


class ScoreError(UserError):
    """A trace or a setting the scorer cannot work with."""


# ---- the trainer's view ------------------------------------------------------------------------


def rollout_temperature(trace: Trace) -> float:
    """The temperature the rollout sampled at: the recorded semantics of its first generated
    step, else ``config.sampling.temperature``, else 1. Greedy (≤ 0) reads as 1: there is no
    temperature to divide by."""
    t: Any = None
    for s in trace.steps:
        sem = s.info.logprob_semantics
        if sem is not None:
            t = sem.temperature if not isinstance(sem, dict) else sem.get("temperature")
            break
    if t is None:
        sampling = trace.config.get("sampling") if isinstance(trace.config, dict) else None
        if isinstance(sampling, dict):
            t = sampling.get("temperature")
    try:
        t = float(t) if t is not None else 1.0
    except (TypeError, ValueError):
        t = 1.0
    return t if t > 0 and math.isfinite(t) else 1.0


class TransformersScorer:
    """A causal LM loaded once; :meth:`token_logprobs` scores one sequence."""

    kind = "transformers"

    def __init__(self, model: str, dtype: str = "float32", device: str = "cpu", model_obj: Any = None) -> None:
        if dtype not in DTYPES:
            raise ScoreError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        import torch

        self.model_name = model
        self.dtype = dtype
        self.device = device
        self.torch_dtype = getattr(torch, dtype)
        if model_obj is None:
            from transformers import AutoModelForCausalLM

            try:
                model_obj = AutoModelForCausalLM.from_pretrained(model, dtype=self.torch_dtype)
            except OSError as e:
                raise ScoreError(f"cannot load model {model!r}: {str(e).splitlines()[0]}") from e
        else:
            model_obj = model_obj.to(self.torch_dtype)
        from backend.runtime import zerogpu

        self.model = zerogpu.to_device(model_obj, device).eval()  # on ZeroGPU from any thread

    def forward_logits(self, ids: list[int], keep: int) -> Any:
        """The logits of the last ``keep`` positions (the model's dtype): the plain forward pass."""
        import torch

        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            try:
                out = self.model(input_ids=x, logits_to_keep=keep)
            except TypeError:  # a model without logits_to_keep
                out = self.model(input_ids=x)
        return out.logits[0, -keep:]

    def token_logprobs(self, ids: list[int], start: int, temperature: float = 1.0) -> list[float]:
        """log p(ids[i] | ids[:i]) for i in [start, len(ids)), with the logits divided by
        ``temperature`` (in the model's dtype, as verl does in place) and the log-softmax in
        float32."""
        import torch

        n = len(ids) - start
        if n <= 0:
            return []
        if start < 1:
            raise ScoreError("the first token of a sequence has no context to be scored from")
        logits = self.forward_logits(ids, n + 1)[:-1]  # position i-1 predicts token i
        if temperature != 1.0:
            logits = logits / temperature
        lp = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(ids[start:], dtype=torch.long, device=lp.device)
        return lp.gather(1, target[:, None])[:, 0].tolist()

    def describe(self, temperature: float) -> Scorer:
        return Scorer(kind=self.kind, model=self.model_name, dtype=self.dtype, temperature=temperature)


class VLLMPromptScorer:
    """The second scorer: vLLM's ``prompt_logprobs`` of the trace's ids from a
    :class:`~backend.generators.vllm_engine.VLLMEngineGenerator` (its weights, its dtype, its
    kernels). vLLM's prompt logprobs are taken before any temperature, so this scorer stands for
    a trainer only at temperature 1: another temperature is refused, not approximated."""

    kind = "vllm prompt_logprobs"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model_name = str(getattr(engine, "model", ""))
        self.dtype = str(getattr(engine, "dtype", "auto"))

    def token_logprobs(self, ids: list[int], start: int, temperature: float = 1.0) -> list[float]:
        import asyncio

        if abs(temperature - 1.0) > 1e-9:
            raise ScoreError(f"vLLM prompt_logprobs are raw (no temperature); the rollout sampled at temperature {temperature:g}: "
                             "use --scorer transformers")
        if len(ids) - start <= 0:
            return []
        lps = asyncio.run(self.engine.prompt_logprobs(list(ids)))  # lps[i - 1] scores ids[i]
        return [float(x) for x in lps[start - 1 :]]

    def describe(self, temperature: float) -> Scorer:
        return Scorer(kind=self.kind, model=self.model_name, dtype=self.dtype, temperature=temperature)


def score_trace(trace: Trace, scorer: TransformersScorer | VLLMPromptScorer, temperature: float | None = None) -> Trace:
    """A copy of ``trace`` whose response steps carry ``info.trainer_logprobs`` and whose
    ``scorer`` says how they were computed. ``temperature``: the rollout's when None."""
    t = rollout_temperature(trace) if temperature is None else float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ScoreError(f"temperature must be a positive number, got {temperature}")
    out = trace.model_copy(deep=True)
    p = len(out.prompt_ids)
    ids = out.input_ids
    if not out.response_ids:
        out.scorer = scorer.describe(t)
        return out
    lps = scorer.token_logprobs(ids, max(p, 1), t)
    if p == 0:  # the first response token has no context
        lps = [float("nan"), *lps]
    for s in out.steps:
        if s.end > s.start and s.start >= p:
            s.info.trainer_logprobs = lps[s.start - p : s.end - p]
    out.scorer = scorer.describe(t)
    return out


# ---- the comparison ------------------------------------------------------------------------------


@dataclass
class TokenDelta:
    """One response token with both logprobs."""

    pos: int  # position in prompt_ids + response_ids
    step: int
    mask: int
    rollout: float
    trainer: float

    @property
    def delta(self) -> float:
        return self.trainer - self.rollout

    @property
    def ratio(self) -> float:
        return math.exp(min(self.delta, 700.0))


@dataclass
class LogprobStats:
    """Statistics over the mask-1 tokens that have both logprobs (finite)."""

    tokens: int = 0
    mean_abs_delta: float = 0.0
    max_abs_delta: float = 0.0
    max_at: int | None = None  # the token position of the largest |Δ|
    rollout_probs_diff_max: float = 0.0
    rollout_probs_diff_mean: float = 0.0
    rollout_probs_diff_std: float = 0.0
    cap: float = DEFAULT_CAP
    outside_cap: float = 0.0  # share of tokens with ratio outside [1/cap, cap]
    kl_k3: float = 0.0
    skipped_mask0: int = 0  # mask-0 tokens with both logprobs, left out of the statistics
    nonfinite: int = 0  # mask-1 tokens left out: a logprob that is NaN or infinite

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    trace: LogprobStats
    steps: dict[int, LogprobStats] = field(default_factory=dict)
    tokens: list[TokenDelta] = field(default_factory=list)  # every token with both logprobs, mask 0 included

    def worst(self, n: int = 10) -> list[TokenDelta]:
        """The mask-1 tokens with the largest |Δ|."""
        pol = [t for t in self.tokens if t.mask == 1 and math.isfinite(t.delta)]
        return sorted(pol, key=lambda t: -abs(t.delta))[:n]


def _stats(tokens: list[TokenDelta], cap: float) -> LogprobStats:
    st = LogprobStats(cap=cap)
    pol: list[TokenDelta] = []
    for t in tokens:
        if t.mask != 1:
            st.skipped_mask0 += 1
        elif math.isfinite(t.rollout) and math.isfinite(t.trainer):
            pol.append(t)
        else:
            st.nonfinite += 1
    n = len(pol)
    st.tokens = n
    if not n:
        return st
    absd = [abs(t.delta) for t in pol]
    st.mean_abs_delta = sum(absd) / n
    i = max(range(n), key=absd.__getitem__)
    st.max_abs_delta, st.max_at = absd[i], pol[i].pos
    pd = [abs(math.exp(t.rollout) - math.exp(t.trainer)) for t in pol]
    st.rollout_probs_diff_max = max(pd)
    mean = sum(pd) / n
    st.rollout_probs_diff_mean = mean
    st.rollout_probs_diff_std = math.sqrt(sum((x - mean) ** 2 for x in pd) / (n - 1)) if n > 1 else float("nan")
    lo = 1.0 / cap
    st.outside_cap = sum(1 for t in pol if not (lo <= t.ratio <= cap)) / n
    st.kl_k3 = sum(math.exp(min(t.delta, 700.0)) - t.delta - 1.0 for t in pol) / n
    return st


def token_deltas(trace: Trace) -> list[TokenDelta]:
    """Every response token that has a rollout and a trainer logprob."""
    p = len(trace.prompt_ids)
    mask = trace.response_mask
    out: list[TokenDelta] = []
    for s in trace.steps:
        n = s.end - s.start
        if n <= 0 or s.start < p:
            continue
        ro, tr = s.logprobs, s.info.trainer_logprobs
        if ro is None or tr is None or len(ro) != n or len(tr) != n:
            continue
        for k in range(n):
            pos = s.start + k
            out.append(TokenDelta(pos, s.index, mask[pos - p], float(ro[k]), float(tr[k])))
    return out


def compare(trace: Trace, cap: float = DEFAULT_CAP) -> Comparison:
    """Δ per token; statistics per step and for the trace over mask-1 tokens only."""
    if not cap > 1.0:
        raise ScoreError(f"the truncation cap must be above 1, got {cap}")
    tokens = token_deltas(trace)
    by_step: dict[int, list[TokenDelta]] = {}
    for t in tokens:
        by_step.setdefault(t.step, []).append(t)
    return Comparison(_stats(tokens, cap), {i: _stats(ts, cap) for i, ts in by_step.items()}, tokens)


def has_logprob_pairs(trace: Trace) -> bool:
    """Whether any step has both a rollout and a trainer logprob list."""
    return any(s.logprobs is not None and s.info.trainer_logprobs is not None for s in trace.steps)


def semantics_problem(sem: Any) -> str | None:
    """Why logprobs with these semantics cannot match a trainer's, or None: raw logprobs
    (before temperature / top-k / top-p) of a run sampled with temperature ≠ 1 or with top-k /
    top-p; any logprobs a decoding constraint masked (renormalised over the allowed tokens)."""
    if sem is None:
        return None
    if getattr(sem, "constrained", False):
        return "a decoding constraint (the grammar renormalised them over the tokens it allowed; a trainer does not)"
    if getattr(sem, "mode", None) != "raw":
        return None
    why = []
    if sem.temperature > 0 and abs(sem.temperature - 1.0) > 1e-9:
        why.append(f"temperature {sem.temperature:g} (a trainer divides the logits by it; raw logprobs are taken before)")
    if sem.top_k is not None and sem.top_k > 0:
        why.append(f"top_k {sem.top_k}")
    if sem.top_p < 1.0:
        why.append(f"top_p {sem.top_p:g}")
    return "; ".join(why) or None


__all__ = [
    "DEFAULT_CAP", "DTYPES", "Comparison", "LogprobStats", "ScoreError", "TokenDelta", "TransformersScorer",
    "VLLMPromptScorer", "compare", "has_logprob_pairs", "rollout_temperature", "score_trace", "semantics_problem", "token_deltas",
]


# ---- per position (the token view) ---------------------------------------------------------------


def position_logprobs(trace: Trace) -> tuple[list[float | None], list[float | None]]:
    """``(rollout, trainer)``: one entry per position of ``prompt_ids + response_ids``, None where
    absent. Rollout logprobs come from ``Step.logprobs``, trainer logprobs from
    ``StepInfo.trainer_logprobs``; a step's list counts only when it has one value per token of
    its span (a list of another length cannot be placed and is left out). Non-finite values (a
    scorer's NaN for a token without context) read as None."""
    n = len(trace.prompt_ids) + len(trace.response_ids)
    rollout: list[float | None] = [None] * n
    trainer: list[float | None] = [None] * n
    for s in trace.steps:
        a, b = s.start, s.end
        if b <= a or a < 0 or b > n:
            continue
        for src, dst in ((s.logprobs, rollout), (s.info.trainer_logprobs, trainer)):
            if src is None or len(src) != b - a:
                continue
            for k, v in enumerate(src):
                if v is not None:
                    f = float(v)
                    dst[a + k] = f if math.isfinite(f) else None
    return rollout, trainer


__all__ += ["position_logprobs"]
