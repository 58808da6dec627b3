"""The logprob lens (issue 14) in the Inspector: the rollout's token logprobs against the
trainer's, for the selected trace.

* **Score with trainer view**: a teacher-forced transformers forward pass over the trace's ids
  (:mod:`backend.checks.logprobs`) with *the model that served it*, when this app has that model: the
  embedded default model or the operator's ``--model`` (in local mode also a local model folder
  the trace names). A model id or path that comes from a trace file is visitor input: on a
  public server it is only ever *compared* with the app's own model, never loaded. The scored
  trace (a new :class:`Trace`) replaces the session's, so the token view and the findings show it.
* Bounds: at most :data:`MAX_SCORE_TOKENS` tokens per trace (the forward pass keeps one
  vocabulary-wide row of logits per response token: 192 KiB per token for SmolLM2 in float32,
  so ~0.8 GB at the bound, plus the log-softmax's copy), one scoring at a time in the app (a
  second is refused while one runs), in a worker thread, and the page waits at most
  :data:`SCORE_TIMEOUT_S` seconds.
* One card with vLLM (:func:`shares_card_with_vllm`): the engine comes first. A scoring asked for
  before the first Playground run starts the engine (it takes its ``gpu_memory_utilization`` share
  of the card); the scorer then goes on the GPU only when the memory left holds it (weights at the
  dtype asked, plus the logits of a longest trace), else the visitor is told the numbers. A scorer
  never takes the memory the engine needs to start.
* The numbers (:func:`numbers_html`): per trace and per step, mean / max |Δ|, verl's
  ``rollout_probs_diff_max/mean/std``, the share of tokens whose ratio is outside [1/C, C] and
  the k3 KL, over **mask-1 tokens only** (:func:`backend.checks.logprobs.compare`).
* Charts (plotly): rollout vs trainer logprob (mask-1 tokens), the ratio histogram, mean |Δ| per
  step. The worst tokens, listed and clickable: a click selects the token's step if needed and
  dispatches ``tv-select`` on the token view (``ui/token_view.py``'s shared interface).
* Traces imported with verl's ``rollout_log_probs`` and ``old_log_probs`` show both at once.
"""

from __future__ import annotations

import asyncio
import html
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from backend.checks.logprobs import DEFAULT_CAP, Comparison, compare, has_logprob_pairs, rollout_temperature
from backend.errors import UserError
from backend.runtime import zerogpu
from backend.trace import Trace
from ui import assets
from ui.theme import CHART

DTYPE_CHOICES = ("float32", "bfloat16")
MAX_SCORE_TOKENS = 4096  # prompt + response tokens of one scored trace
SCORE_TIMEOUT_S = 180.0  # how long the page waits for one scoring
WORST_N = 20
SCATTER_MAX_POINTS = 5000  # the scatter keeps the largest |Δ| beyond this (the histogram counts all)
_LAYOUT = dict(margin=dict(l=50, r=10, t=40, b=45), height=320, template="plotly_white", showlegend=False,
               paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")


class LensError(UserError):
    """Why a trace cannot be scored here (shown to the visitor as it is)."""


# ---- which model may score a trace ----------------------------------------------------------------


def trace_model(trace: Trace) -> str | None:
    """The model the trace says produced it (our engine's ``metadata.generator.model``, else a
    log's ``model``): data from a file, never loaded as such on a public server."""
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    gen = md.get("generator")
    for v in ((gen or {}).get("model") if isinstance(gen, dict) else None, md.get("model")):
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def _same_model(recorded: str, app_names: list[str]) -> bool:
    rec = recorded.rstrip("/")
    for n in app_names:
        n = n.rstrip("/")
        if rec == n:
            return True
        # the embedded model's folder in another machine's cache: the same build, the same weights
        if os.path.isabs(rec) and os.path.isabs(n) and os.path.basename(rec) == os.path.basename(n):
            return True
    return False


def app_model(ctx: Any) -> tuple[list[str], Any] | None:
    """``(names the app's model goes by, a resolver to its loadable path)``, or None when the app
    has no model it can load with transformers."""
    o = ctx.model.options
    if o is None:
        return None
    from backend.loading.models import DEFAULT_MODEL_ALIASES, default_model_path, resolve_model

    if o.backend in ("vllm", "transformers"):
        if not o.model or o.model in DEFAULT_MODEL_ALIASES:
            names = list(DEFAULT_MODEL_ALIASES)
            try:
                names.append(default_model_path())  # built already when the app runs it
            except Exception:  # noqa: BLE001 - not built: the aliases still name it
                pass
            return names, default_model_path
        return [o.model], lambda: resolve_model(o.model)
    if o.backend == "vllm-server" and o.model:  # the operator named the served model
        return [o.model], lambda: o.model
    return None


def scoring_model(ctx: Any, trace: Trace) -> str:
    """What to load to score ``trace`` (a path or the operator's model id), or :class:`LensError`
    saying why not. Only the app's own model; in local mode also a local model folder the trace
    names (the user's own disk). Never a hub id or a path from the trace on a public server."""
    recorded = trace_model(trace)
    if not recorded:
        raise LensError("this trace does not say which model produced it (no metadata.generator.model): "
                        "it cannot be scored with the model that served it")
    own = app_model(ctx)
    if own is not None and _same_model(recorded, own[0]):
        return own[1]()
    if not ctx.trust.public and os.path.isabs(recorded) and os.path.isfile(os.path.join(recorded, "config.json")):
        return recorded
    shown = recorded if len(recorded) <= 120 else recorded[:119] + "…"
    have = "no model" if own is None else ("the embedded SmolLM2-135M-Instruct" if "default" in own[0] else repr(own[0][0]))
    where = "this public server scores only with its own model" if ctx.trust.public else "this app has"
    raise LensError(f"the model that produced this trace ({shown!r}) is not available here: {where} ({have}); "
                    "score it where that model is, e.g. python -m backend score TRACE.jsonl --model MODEL")


def check_scorable(trace: Trace) -> None:
    n = len(trace.prompt_ids) + len(trace.response_ids)
    if not trace.response_ids:
        raise LensError("this trace has no response tokens to score")
    if n > MAX_SCORE_TOKENS:
        raise LensError(f"this trace has {n:,} tokens; the app scores at most {MAX_SCORE_TOKENS:,} "
                        "(memory of one forward pass); use python -m backend score for longer traces")


# ---- scoring --------------------------------------------------------------------------------------


class _Scorers:
    """Loaded scorers by (model, dtype, device): at most two kept (a model in float32 and bfloat16)."""

    def __init__(self, max_entries: int = 2) -> None:
        self._items: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, model: str, dtype: str, device: str = "cpu") -> Any:
        from backend.checks.logprobs import TransformersScorer

        key = (model, dtype, device)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        scorer = TransformersScorer(model, dtype, device=device)
        with self._lock:
            self._items[key] = scorer
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return scorer

    def keys(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return list(self._items)


SCORERS = _Scorers()
_BUSY = threading.Lock()  # one scoring at a time in the app


def scorer_device(ctx: Any) -> str:
    """Where the lens's forward pass runs: the GPU the app's model was planned for (a vLLM
    engine's card, a transformers model's, a ZeroGPU slice), else the CPU."""
    options = getattr(getattr(ctx, "model", None), "options", None)
    return getattr(options, "scorer_device", None) or "cpu"


def shares_card_with_vllm(ctx: Any) -> bool:
    """Whether the lens's scorer would sit on the GPU that the app's vLLM engine runs on."""
    options = getattr(getattr(ctx, "model", None), "options", None)
    return getattr(options, "backend", None) == "vllm" and scorer_device(ctx) == "cuda"


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _local_model_folder(model: str) -> str | None:
    """``model`` itself when it is a folder; for a hub id, its snapshot in the local Hugging Face
    cache when one is there (the vLLM engine that starts before the scorer on a shared card has
    put it there), found without any request; else None."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id (HFValidationError), or no hub library: not local
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def scorer_bytes(model: str, dtype: str) -> int | None:
    """GPU memory a scorer of ``model`` (a local folder, or a hub id already in the local cache) in
    ``dtype`` needs, estimated: its weights (the parameters counted from the safetensors headers)
    and the logits of a longest trace (one float32 row per token, and the log-softmax's copy).
    None when the files are not on this machine."""
    import glob
    import json

    folder = _local_model_folder(model)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors"))) if folder else []
    if not files:
        return None
    model = folder
    from safetensors import safe_open

    params = 0
    for f in files:
        with safe_open(f, framework="pt") as st:
            for name in st.keys():
                n = 1
                for d in st.get_slice(name).get_shape():
                    n *= int(d)
                params += n
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            vocab = int(json.load(f).get("vocab_size") or 0)
    except (OSError, ValueError):
        vocab = 0
    return params * _DTYPE_BYTES.get(dtype, 4) + 2 * MAX_SCORE_TOKENS * vocab * 4


def gpu_free_bytes() -> int | None:
    """Free memory on the current CUDA device (None when it cannot be read)."""
    try:
        import torch

        return int(torch.cuda.mem_get_info()[0])
    except Exception:  # noqa: BLE001 - no CUDA here
        return None


def check_fits_beside_vllm(model: str, dtype: str, free: int | None) -> None:
    """:class:`LensError` when the scorer would not fit in the memory vLLM left on the card."""
    need = scorer_bytes(model, dtype)
    if need is None or free is None or need <= free:
        return
    gib = 1 << 30
    alt = " (bfloat16 halves the weights)" if dtype == "float32" else ""
    raise LensError(f"the {dtype} scorer of this model needs about {need / gib:.1f} GiB of GPU memory; {free / gib:.1f} GiB "
                    f"is free beside the vLLM engine{alt}; score it elsewhere: python -m backend score TRACE.jsonl --model MODEL")


def _score_task(model: str, dtype: str, device: str, trace: Trace, lease_s: float | None) -> tuple[str, Any]:
    """Load (once per process) and run the scorer: ``("ok", scored trace)`` or ``("error",
    message)``, data either way (on ZeroGPU this runs in the process forked for the call, and an
    exception would arrive as its class name only)."""
    from backend.checks.logprobs import ScoreError, score_trace

    try:
        scorer = SCORERS.get(model, dtype, device)
        vocab = getattr(getattr(scorer.model, "config", None), "vocab_size", None)
        top = max(trace.input_ids)
        if isinstance(vocab, int) and top >= vocab:
            return "error", f"token id {top} is outside the model's vocabulary ({vocab}): the trace's ids are not this model's"
        return "ok", score_trace(trace, scorer)
    except (ScoreError, UserError) as e:
        return "error", str(e)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
        msg = out_of_memory_message(e, dtype)
        if msg is None:
            raise
        return "error", msg


def out_of_memory_message(e: BaseException, dtype: str) -> str | None:
    """The lens's message for a GPU out of memory while loading or running the scorer (None for
    any other error). The cached blocks are given back, so the card's other user (a vLLM engine)
    and the next try find what this one freed."""
    if type(e).__name__ != "OutOfMemoryError" and "out of memory" not in str(e).lower():
        return None
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - nothing to give back
        pass
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    alt = "; bfloat16 halves the weights" if dtype == "float32" else ""
    return (f"the GPU ran out of memory for the {dtype} scorer ({first[:200]}){alt}; score it elsewhere: "
            "python -m backend score TRACE.jsonl --model MODEL")


def _score_lease(model: str, dtype: str, device: str, trace: Trace, lease_s: float | None) -> float:
    return lease_s or zerogpu.scoring_duration_s(len(trace.input_ids))


_score_on_gpu = zerogpu.gpu_task(_score_task, duration=_score_lease)


def score_sync(ctx: Any, trace: Trace, dtype: str) -> Trace:
    """Score ``trace`` with its model (checks first; see :func:`scoring_model`). Blocking: run it
    in a worker thread (with the request's context: ZeroGPU reads the visitor from it)."""
    if dtype not in DTYPE_CHOICES:
        raise LensError(f"dtype: choose one of {', '.join(DTYPE_CHOICES)}")
    check_scorable(trace)
    model = scoring_model(ctx, trace)
    if not _BUSY.acquire(blocking=False):
        raise LensError("another trace is being scored on this server; try again when it is done")
    try:
        from backend.checks.logprobs import ScoreError

        device = scorer_device(ctx)
        if device == "cuda" and shares_card_with_vllm(ctx) and (model, dtype, device) not in SCORERS.keys():
            check_fits_beside_vllm(model, dtype, gpu_free_bytes())
        try:
            # loaded here first: a GPU process forked after this finds it (on ZeroGPU the weights
            # go to the lent slice with the call); one forked before loads its own
            SCORERS.get(model, dtype, device)
        except ScoreError as e:
            raise LensError(str(e)) from None
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError: the card is fuller than estimated
            msg = out_of_memory_message(e, dtype)
            if msg is None:
                raise
            raise LensError(msg) from None
        lease = zerogpu.scoring_duration_s(len(trace.input_ids)) if zerogpu.usable() else None
        try:
            tag, value = _score_on_gpu(model, dtype, device, trace, lease)
        except Exception as e:
            msg = zerogpu.gpu_error(e)
            if msg is None:
                raise
            raise LensError(msg) from None
        if tag == "error":
            raise LensError(value)
        return value
    finally:
        _BUSY.release()


async def score(ctx: Any, trace: Trace, dtype: str, timeout_s: float = SCORE_TIMEOUT_S) -> Trace:
    """:func:`score_sync` in a worker thread, off the event loop, waited for at most ``timeout_s``
    (a forward pass cannot be interrupted: a late one finishes in its thread, unused, and holds
    the one scoring slot until then). With vLLM on the same card, the engine starts first."""
    if shares_card_with_vllm(ctx):  # returns at once when the engine is up
        try:
            await asyncio.wait_for(ctx.model.get(), timeout_s)
        except asyncio.TimeoutError:
            raise LensError(f"the vLLM engine, which starts before the scorer on this card, took longer than {timeout_s:g} s") from None
        except UserError as e:
            raise LensError(f"the vLLM engine, which starts before the scorer on this card, did not start: {e}") from None
    try:
        return await asyncio.wait_for(asyncio.to_thread(score_sync, ctx, trace, dtype), timeout_s)
    except asyncio.TimeoutError:
        raise LensError(f"scoring took longer than {timeout_s:g} s and was given up") from None


# ---- the numbers ----------------------------------------------------------------------------------

# (key of LogprobStats, label, what it is)
METRICS: list[tuple[str, str, str]] = [
    ("tokens", "tokens", "mask-1 tokens with both logprobs (the policy's)"),
    ("mean_abs_delta", "mean |Δ|", "Δ = trainer − rollout logprob (nats)"),
    ("max_abs_delta", "max |Δ|", "the largest |Δ| (nats)"),
    ("rollout_probs_diff_max", "rollout_probs_diff_max", "verl: max |exp(rollout) − exp(trainer)|"),
    ("rollout_probs_diff_mean", "rollout_probs_diff_mean", "verl: mean of the same"),
    ("rollout_probs_diff_std", "rollout_probs_diff_std", "verl: its std (unbiased)"),
    ("outside_cap", "ratio outside [1/C, C]", "share of tokens whose exp(Δ) a truncated IS would clip"),
    ("kl_k3", "KL (k3)", "mean(exp(Δ) − Δ − 1): KL(rollout ‖ trainer), verl's low_var_kl"),
]


def fmt(key: str, v: Any) -> str:
    if v is None:
        return "–"
    if key in ("tokens", "skipped_mask0", "nonfinite"):
        return f"{int(v):,}"
    v = float(v)
    if math.isnan(v):
        return "–"
    if key == "outside_cap":
        return f"{100 * v:.2f} %"
    return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def source_line(trace: Trace) -> str:
    """Where the two logprob columns come from."""
    sc = trace.scorer
    sem = next((s.info.logprob_semantics for s in trace.steps if s.info.logprob_semantics is not None), None)
    ro = "rollout: " + (f"{sem.backend} {sem.mode} logprobs, temperature {sem.temperature:g}" if sem is not None
                        else "recorded / imported logprobs")
    if sc is None:
        return ro
    tr = f"trainer: {sc.kind}"
    if sc.model:
        tr += f" · {os.path.basename(str(sc.model).rstrip('/')) or sc.model}"
    if sc.dtype:
        tr += f" · {sc.dtype}"
    if sc.temperature is not None:
        tr += f" · logits / {sc.temperature:g}"
    return f"{ro} — {tr}"


def numbers_html(trace: Trace, cmp: Comparison) -> str:
    """The per-trace numbers (with verl's names) and a per-step table; every number is over
    mask-1 tokens only (the mask-0 count left out is said)."""
    e = html.escape
    st = cmp.trace
    cells = "".join(
        f'<tr data-metric="{k}"><th title="{e(why)}">{e(label)}</th><td data-value="{getattr(st, k)!r}">{e(fmt(k, getattr(st, k)))}</td>'
        f'<td class="ali-lens-why">{e(why)}</td></tr>'
        for k, label, why in METRICS
    )
    extra = f"C = {st.cap:g}"
    if st.max_at is not None:
        extra += f" · max |Δ| at token #{st.max_at}"
    extra += f" · mask-0 tokens with both logprobs, left out of every number: {st.skipped_mask0:,}"
    if st.nonfinite:
        extra += f" · non-finite logprobs left out: {st.nonfinite:,}"
    head = "".join(f"<th>{e(label)}</th>" for _, label, _ in METRICS)
    rows = []
    for i in sorted(cmp.steps):
        s = cmp.steps[i]
        if not s.tokens:
            continue
        tds = "".join(f'<td data-value="{getattr(s, k)!r}">{e(fmt(k, getattr(s, k)))}</td>' for k, _, _ in METRICS)
        rows.append(f'<tr data-step="{int(i)}"><th>{int(i)}</th>{tds}</tr>')
    steps = (f'<table class="ali-lens-steps"><thead><tr><th>step</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
             if rows else "")
    return (f'<div class="ali-lens"><div class="ali-lens-src">{e(source_line(trace))}</div>'
            f'<table class="ali-lens-trace" data-tokens="{st.tokens}" data-skipped-mask0="{st.skipped_mask0}">'
            f'<tbody>{cells}</tbody></table><div class="ali-lens-extra">{e(extra)}</div>'
            f'<details class="ali-lens-per-step" open><summary>per step (mask-1 tokens)</summary>{steps}</details></div>')


def _signed(v: float) -> str:
    return f"{v:+.4f}" if abs(v) >= 1e-3 or v == 0 else f"{v:+.2e}"


def _token_text(tokenizer: Any, tid: int) -> str:
    if tokenizer is None:
        return f"⟨{tid}⟩"
    try:
        return tokenizer.decode([tid])
    except Exception:  # noqa: BLE001 - an id the tokenizer does not know
        return f"⟨{tid}⟩"


def worst_html(trace: Trace, cmp: Comparison, tokenizer: Any = None, n: int = WORST_N) -> str:
    """The ``n`` mask-1 tokens with the largest |Δ|, each a button that selects it in the token
    view (:data:`JS`)."""
    worst = cmp.worst(n)
    if not worst:
        return '<div class="ali-lens-worst ali-info">no mask-1 token has both logprobs</div>'
    e = html.escape
    ids = trace.input_ids
    rows = []
    for t in worst:
        text = _token_text(tokenizer, ids[t.pos]) if 0 <= t.pos < len(ids) else ""
        shown = repr(text)[1:-1] if text else ""
        rows.append(
            f'<tr><td><button type="button" class="ali-lens-tok" data-pos="{int(t.pos)}" data-step="{int(t.step)}" '
            f'title="select token #{int(t.pos)} in the token view">#{int(t.pos)}</button></td>'
            f"<td>{int(t.step)}</td><td class=\"ali-lens-text\">{e(shown)}</td><td>{t.rollout:.4f}</td><td>{t.trainer:.4f}</td>"
            f"<td>{_signed(t.delta)}</td><td>{t.ratio:.4f}</td></tr>"
        )
    return ('<div class="ali-lens-worst"><table><thead><tr><th>token</th><th>step</th><th>text</th><th>rollout</th>'
            '<th>trainer</th><th>Δ</th><th>ratio</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table></div>")


# ---- charts ---------------------------------------------------------------------------------------


def _empty(title: str, note: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, **_LAYOUT)
    fig.add_annotation(text=html.escape(note, quote=False), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def scatter_figure(cmp: Comparison) -> go.Figure:
    pol = [t for t in cmp.tokens if t.mask == 1 and math.isfinite(t.rollout) and math.isfinite(t.trainer)]
    title = "rollout vs trainer logprob (mask-1 tokens)"
    if not pol:
        return _empty(title, "no mask-1 token has both logprobs")
    if len(pol) > SCATTER_MAX_POINTS:
        pol = sorted(pol, key=lambda t: -abs(t.delta))[:SCATTER_MAX_POINTS]
        title += f" · the {SCATTER_MAX_POINTS:,} largest |Δ|"
    xs, ys = [t.rollout for t in pol], [t.trainer for t in pol]
    lo, hi = min(min(xs), min(ys)), max(max(xs), max(ys), 0.0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color=CHART["prompt"], dash="dot", width=1),
                             hoverinfo="skip", name="trainer = rollout"))
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", marker=dict(color=CHART["generated"], size=6, opacity=0.75), name="tokens",
        customdata=[[t.pos, t.step, t.delta] for t in pol],
        hovertemplate="token #%{customdata[0]} (step %{customdata[1]})<br>rollout %{x:.4f}<br>trainer %{y:.4f}"
                      "<br>Δ %{customdata[2]:+.4f}<extra></extra>",
    ))
    fig.update_layout(title=title, **_LAYOUT)
    fig.update_xaxes(title="rollout logprob")
    fig.update_yaxes(title="trainer logprob")
    return fig


def ratio_figure(cmp: Comparison) -> go.Figure:
    cap = cmp.trace.cap
    pol = [t for t in cmp.tokens if t.mask == 1 and math.isfinite(t.delta)]
    title = f"importance ratio exp(Δ) (mask-1 tokens), C = {cap:g}"
    if not pol:
        return _empty(title, "no mask-1 token has both logprobs")
    top = 2 * cap
    ratios = [min(t.ratio, top) for t in pol]
    # fixed bins over [0, 2C] (a bin edge at 1: ratios just below and above it are told apart)
    fig = go.Figure(go.Histogram(x=ratios, xbins=dict(start=0.0, end=top * (1 + 1e-9), size=top / 60), marker=dict(color=CHART["render"]),
                                 hovertemplate="ratio %{x}<br>%{y} tokens<extra></extra>"))
    for x in (1.0 / cap, cap):
        fig.add_vline(x=x, line=dict(color=CHART["injected"], dash="dash", width=1))
    fig.update_layout(title=title, bargap=0.05, **_LAYOUT)
    fig.update_xaxes(title=f"ratio (values above {top:g} shown at {top:g})")
    # log scale past 50 tokens (one bin holds most of them); ticks at powers of ten only
    fig.update_yaxes(title="tokens", type="log" if len(pol) > 50 else "linear", dtick=1 if len(pol) > 50 else None)
    return fig


def steps_figure(cmp: Comparison) -> go.Figure:
    title = "mean |Δ| per step (mask-1 tokens)"
    steps = [(i, s) for i, s in sorted(cmp.steps.items()) if s.tokens]
    if not steps:
        return _empty(title, "no step has mask-1 tokens with both logprobs")
    fig = go.Figure(go.Bar(
        x=[str(i) for i, _ in steps], y=[s.mean_abs_delta for _, s in steps], marker=dict(color=CHART["generated"]),
        customdata=[[s.max_abs_delta, s.tokens] for _, s in steps],
        hovertemplate="step %{x}<br>mean |Δ| %{y:.3g}<br>max |Δ| %{customdata[0]:.3g}<br>%{customdata[1]} tokens<extra></extra>",
    ))
    fig.update_layout(title=title, **_LAYOUT)
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="mean |Δ| (nats)", exponentformat="e")
    return fig


# ---- the lens's outputs ---------------------------------------------------------------------------


@dataclass
class LensView:
    status: str
    numbers: str
    scatter: go.Figure | None
    ratios: go.Figure | None
    per_step: go.Figure | None
    worst: str

    def values(self) -> list[Any]:
        return [self.status, self.numbers, self.scatter, self.ratios, self.per_step, self.worst]


def status_html(kind: str, text: str) -> str:
    """A status line: kind ok / warn / err / info (``data-status``)."""
    cls = {"ok": "ali-ok", "warn": "ali-warn", "err": "ali-err", "info": "ali-info"}[kind]
    return f'<div class="{cls} ali-lens-status" data-status="{kind}">{html.escape(text)}</div>'


def has_rollout_logprobs(trace: Trace) -> bool:
    return any(s.logprobs is not None for s in trace.steps)


def from_file(trace: Trace) -> bool:
    """Whether the trainer-side logprobs came with the file (an importer named their field as the
    scorer, with no model: ``set_trainer_logprobs``), not from a scoring in this app."""
    sc = trace.scorer
    return sc is not None and not sc.model and any(s.info.trainer_logprobs is not None for s in trace.steps)


def idle_status(trace: Trace | None) -> str:
    if trace is None:
        return status_html("info", "no trace")
    if has_logprob_pairs(trace):
        sc = trace.scorer
        if sc is not None and str(sc.kind).startswith("verl"):
            return status_html("ok", "both logprobs imported from verl (rollout_log_probs, old_log_probs): nothing to compute")
        if from_file(trace):
            return status_html("ok", f"both logprobs from the file (trainer side: {sc.kind}): nothing to compute, no model loaded")
        return status_html("ok", "scored: trainer-view logprobs against the rollout's")
    if not has_rollout_logprobs(trace):
        return status_html("info", "this trace has no rollout logprobs: record them (sampling logprobs: 0, e.g. "
                                   "python -m backend run --sampling '{\"logprobs\": 0}') or import verl rows with "
                                   "rollout_log_probs; scoring adds the trainer's side only")
    return status_html("info", f"rollout logprobs recorded (temperature {rollout_temperature(trace):g}); press "
                               "“Score with trainer view” to recompute them as a trainer would")


def lens_view(trace: Trace | None, tokenizer: Any = None, cap: float = DEFAULT_CAP, status: str | None = None) -> LensView:
    """Everything the lens shows for ``trace`` (``status``: a line to show instead of the idle one)."""
    st = status if status is not None else idle_status(trace)
    if trace is None or not has_logprob_pairs(trace):
        return LensView(st, "", None, None, None, "")
    try:
        cmp = compare(trace, cap)
    except UserError as e:  # a bad cap
        return LensView(status_html("err", str(e)), "", None, None, None, "")
    return LensView(st, numbers_html(trace, cmp), scatter_figure(cmp), ratio_figure(cmp), steps_figure(cmp),
                    worst_html(trace, cmp, tokenizer))


def valid_cap(value: Any) -> float:
    """The truncation cap C a visitor typed: a number above 1 (≤ 1e6), else :class:`LensError`."""
    try:
        c = float(value)
    except (TypeError, ValueError):
        raise LensError("the cap C must be a number above 1") from None
    if not (math.isfinite(c) and 1.0 < c <= 1e6):
        raise LensError("the cap C must be a number above 1 (and at most 1e6)")
    return c


# ---- browser side ---------------------------------------------------------------------------------

# The worst tokens' buttons (ui/assets/logprob_lens.js): a click selects the token in the token
# view. ``{{VIEW}}``: the elem_id of that view's gr.HTML (filled with ui.assets.fill, as
# ui/inspector.py does).
JS = assets.read("logprob_lens.js")
CSS = assets.read("logprob_lens.css")

HELP = ("**Logprob lens.** Does the trainer see the probabilities the rollout sampled with? *Score with trainer view* "
        "recomputes every response token's logprob with a teacher-forced forward pass of the model that served the "
        "trace (transformers, logits divided by the rollout temperature, as verl's actor and TRL do) and compares: "
        "Δ = trainer − rollout, ratio = exp(Δ). The numbers use verl's names (`rollout_probs_diff_max/mean/std`) and "
        "count **mask-1 tokens only**. Click a worst token to find it in the token view. "
        f"At most {MAX_SCORE_TOKENS:,} tokens per trace, one scoring at a time, {SCORE_TIMEOUT_S:g} s.")
