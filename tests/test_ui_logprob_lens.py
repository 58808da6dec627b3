"""The Inspector's logprob lens (ui/logprob_lens.py) in-process, on real components: a trace the
embedded SmolLM2-135M-Instruct generated with the transformers backend (rollout logprobs
recorded, a tool turn so that mask-0 tokens exist), scored by the lens as the app does it (the
app's own model, a worker thread), its numbers, charts and worst tokens checked against
backend.checks.logprobs.compare; mask-0 tokens kept out of everything shown; which models may score a
trace (public mode never loads one a trace names); verl imports shown without scoring.

Tolerance: the float32 rescoring of a float32 transformers run, see tests/test_logprobs.py
(measured max |Δ| ~3e-5 nats; asserted below 1e-3)."""

from __future__ import annotations

import asyncio
import json
import os
import re

import gradio as gr
import pytest
from cli_inprocess import run_cli

from backend.checks.logprobs import compare
from backend.config import LoopConfig
from backend.engine import AgentLoop
from backend.loading.tokenizers import load_tokenizer
from backend.safety.trust import Mode, TrustPolicy
from backend.trace import Trace
from backend.trace.model import StepState
from ui import inspector
from ui import logprob_lens as L
from ui.context import AppContext, ModelOptions, ModelService, Session

FLOAT32_TOL = 1e-3
PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]


def get_current_temperature(city: str):
    """Get current temperature at a location.

    Args:
        city: The location to get the temperature for.
    """
    return {"temperature": 72, "city": city}


@pytest.fixture(scope="module")
def bundle():
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def weather(smollm2_model_dir, bundle) -> Trace:
    """A sampled run of the embedded model with logprobs recorded and a tool turn (mask 0)."""
    from backend.generators.transformers_local import TransformersGenerator
    from backend.tools import ToolRegistry

    gen = TransformersGenerator(smollm2_model_dir).load()
    cfg = LoopConfig(sampling={"temperature": 1.0, "seed": 3, "max_tokens": 40, "logprobs": 0},
                     tool_choice=["required", "auto"], max_assistant_turns=2)
    reg = ToolRegistry.from_functions([get_current_temperature])
    return asyncio.run(AgentLoop(gen, bundle, tools=reg, config=cfg).run(PARIS))


def app_ctx(mode: Mode = Mode.LOCAL, backend: str | None = "transformers", model: str | None = None) -> AppContext:
    opts = ModelOptions(backend=backend, model=model) if backend else None
    return AppContext(model=ModelService(opts), trust=TrustPolicy(mode, "test"))


@pytest.fixture(scope="module")
def scored(weather) -> Trace:
    """Scored by the lens as the app's button does: the embedded model, in a worker thread."""
    return asyncio.run(L.score(app_ctx(), weather, "float32"))


def policy_tokens(t: Trace) -> int:
    return sum(len(s.logprobs) for s in t.steps if s.logprobs is not None and s.mask == 1)


def cell(html_text: str, metric: str) -> float:
    m = re.search(rf'<tr data-metric="{metric}"><th[^>]*>[^<]*</th><td data-value="([^"]+)"', html_text)
    assert m, metric
    return float(m.group(1))


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_the_button_scores_with_the_traces_own_model(weather, scored):
    assert L.trace_model(weather) == weather.metadata["generator"]["model"]
    assert scored is not weather and weather.scorer is None  # a new Trace; the session's old one untouched
    assert scored.scorer.kind == "transformers" and scored.scorer.dtype == "float32" and scored.scorer.temperature == 1.0
    c = compare(scored).trace
    assert c.tokens == policy_tokens(weather) > 0
    assert c.max_abs_delta < FLOAT32_TOL, c
    view = L.lens_view(scored)
    assert 'data-status="ok"' in view.status
    for k, _, _ in L.METRICS:  # every number shown is compare()'s, unrounded in data-value
        assert cell(view.numbers, k) == pytest.approx(getattr(c, k), rel=1e-12, abs=0), k
    assert "rollout_probs_diff_max" in view.numbers and "ratio outside [1/C, C]" in view.numbers and "KL (k3)" in view.numbers
    # per step: one row per step with mask-1 tokens, with that step's numbers
    steps = compare(scored).steps
    rows = re.findall(r'<tr data-step="(\d+)">', view.numbers)
    assert [int(r) for r in rows] == [i for i in sorted(steps) if steps[i].tokens]


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_charts_plot_the_mask1_tokens(scored):
    cmp = compare(scored)
    n = cmp.trace.tokens
    view = L.lens_view(scored)
    pts = view.scatter.data[1]
    assert len(pts.x) == n and list(pts.x) == [t.rollout for t in cmp.tokens if t.mask == 1]
    assert list(pts.y) == [t.trainer for t in cmp.tokens if t.mask == 1]
    assert len(view.ratios.data[0].x) == n
    assert {s.x0 for s in view.ratios.layout.shapes} == {0.5, 2.0}  # the cap's lines at 1/C and C
    bars = view.per_step.data[0]
    assert list(bars.x) == [str(i) for i, s in sorted(cmp.steps.items()) if s.tokens]
    assert list(bars.y) == [s.mean_abs_delta for _, s in sorted(cmp.steps.items()) if s.tokens]
    json.dumps(view.scatter.to_plotly_json(), default=str)  # plotly can serialise them


def test_worst_tokens_listed_with_both_logprobs(scored, bundle):
    cmp = compare(scored)
    view = L.lens_view(scored, bundle.tokenizer)
    buttons = re.findall(r'data-pos="(\d+)" data-step="(\d+)"', view.worst)
    worst = cmp.worst(L.WORST_N)
    assert [(int(p), int(s)) for p, s in buttons] == [(t.pos, t.step) for t in worst]
    first = worst[0]
    row = view.worst.split("</tr>")[1]
    assert f"{first.rollout:.4f}" in row and f"{first.trainer:.4f}" in row
    text = bundle.tokenizer.decode([scored.input_ids[first.pos]])
    assert repr(text)[1:-1].replace("&", "&amp;").replace("<", "&lt;") in row


def test_mask0_tokens_never_reach_what_the_lens_shows(scored, bundle):
    """Give every tool-turn token (mask 0) a rollout logprob far from the trainer's, as a verl row
    pads them: the numbers, the charts and the worst list must not change."""
    clean = L.lens_view(scored, bundle.tokenizer)
    dirty_trace = scored.model_copy(deep=True)
    tool = [s for s in dirty_trace.steps if s.state == StepState.PROCESSING_TOOLS and s.end > s.start]
    assert tool and all(s.mask == 0 for s in tool) and all(s.info.trainer_logprobs is not None for s in tool)
    for s in tool:
        s.logprobs = [0.0] * (s.end - s.start)
    cmp = compare(dirty_trace)
    n0 = sum(s.end - s.start for s in tool)
    assert sum(1 for t in cmp.tokens if t.mask == 0) == n0  # they are compared ...
    assert max(abs(t.delta) for t in cmp.tokens if t.mask == 0) > 1.0  # ... far off: they would dominate
    dirty = L.lens_view(dirty_trace, bundle.tokenizer)
    for k, _, _ in L.METRICS:
        assert cell(dirty.numbers, k) == cell(clean.numbers, k), k
    assert f"mask-0 tokens with both logprobs, left out of every number: {n0:,}" in dirty.numbers
    assert 'data-skipped-mask0="0"' in clean.numbers and f'data-skipped-mask0="{n0}"' in dirty.numbers

    def same(h: str) -> str:  # all but the count of mask-0 tokens left out
        return re.sub(r'left out of every number: [\d,]+|data-skipped-mask0="\d+"', "", h)

    assert same(dirty.numbers) == same(clean.numbers)
    assert dirty.worst == clean.worst
    assert list(dirty.scatter.data[1].x) == list(clean.scatter.data[1].x)
    assert list(dirty.ratios.data[0].x) == list(clean.ratios.data[0].x)
    assert list(dirty.per_step.data[0].y) == list(clean.per_step.data[0].y)
    tool_pos = {p for s in tool for p in range(s.start, s.end)}
    assert not tool_pos & {int(p) for p in re.findall(r'data-pos="(\d+)"', dirty.worst)}


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_bfloat16_scoring_shows_a_larger_mismatch(weather, scored):
    b16 = L.score_sync(app_ctx(), weather, "bfloat16")
    assert b16.scorer.dtype == "bfloat16"
    a, b = compare(scored).trace, compare(b16).trace
    assert b.tokens == a.tokens and b.mean_abs_delta > 10 * a.mean_abs_delta and b.mean_abs_delta > FLOAT32_TOL
    with pytest.raises(L.LensError, match="dtype"):
        L.score_sync(app_ctx(), weather, "float8")


def test_public_mode_never_loads_a_model_a_trace_names(weather, tiny_model_dir):
    """A trace naming a model folder that exists on the server (the tiny random Llama, whose
    vocabulary fits the trace's ids): a local app scores with it, a public one refuses it, and
    neither ever loads a hub id from a trace."""
    foreign = weather.model_copy(deep=True)
    foreign.metadata["generator"]["model"] = tiny_model_dir
    before = L.SCORERS.keys()
    with pytest.raises(L.LensError, match="not available here: this public server scores only with its own model") as e:
        L.score_sync(app_ctx(Mode.PUBLIC), foreign, "float32")
    assert "embedded SmolLM2" in str(e.value)
    assert all(k[0] != tiny_model_dir for k in L.SCORERS.keys()) and L.SCORERS.keys() == before
    # the same file on a local app: the user's own disk, scored with that model
    local = L.score_sync(app_ctx(Mode.LOCAL), foreign, "float32")
    assert local.scorer.model == tiny_model_dir
    for mode in (Mode.PUBLIC, Mode.LOCAL):
        hub = weather.model_copy(deep=True)
        hub.metadata["generator"]["model"] = "some-org/some-model"
        with pytest.raises(L.LensError, match="'some-org/some-model'.*not available"):
            L.score_sync(app_ctx(mode), hub, "float32")
    # a public app's own model (the embedded one) scores the trace it served
    assert L.scoring_model(app_ctx(Mode.PUBLIC), weather) == weather.metadata["generator"]["model"]
    # no model at all, and a trace that names none
    with pytest.raises(L.LensError, match="no model"):
        L.score_sync(app_ctx(Mode.PUBLIC, backend=None), weather, "float32")
    anon = weather.model_copy(deep=True)
    anon.metadata.pop("generator")
    with pytest.raises(L.LensError, match="does not say which model"):
        L.score_sync(app_ctx(), anon, "float32")


def test_bounds_busy_and_timeout(weather):
    big = weather.model_copy(update={"prompt_ids": weather.prompt_ids * (L.MAX_SCORE_TOKENS // len(weather.prompt_ids) + 1)})
    with pytest.raises(L.LensError, match=f"at most {L.MAX_SCORE_TOKENS:,}"):
        L.score_sync(app_ctx(), big, "float32")
    assert L._BUSY.acquire(blocking=False)  # another scoring holds the app's one slot
    try:
        with pytest.raises(L.LensError, match="another trace is being scored"):
            asyncio.run(L.score(app_ctx(), weather, "float32"))
    finally:
        L._BUSY.release()
    with pytest.raises(L.LensError, match="longer than 0.001 s"):
        asyncio.run(L.score(app_ctx(), weather, "float32", timeout_s=0.001))
    assert L._BUSY.acquire(timeout=300)  # the late one finishes in its thread and frees the slot
    L._BUSY.release()


def test_cap_and_idle_states(weather, scored, ctx_samples):
    assert L.valid_cap("3") == 3.0
    for bad in ("abc", 1, 0.5, float("nan"), float("inf"), None, 1e9):
        with pytest.raises(L.LensError, match="cap C"):
            L.valid_cap(bad)
    tight = L.lens_view(scored, cap=1.000001)
    assert cell(tight.numbers, "outside_cap") == compare(scored, 1.000001).trace.outside_cap
    assert "C = 1" in tight.numbers
    # a trace with rollout logprobs only: the lens says to press the button; nothing plotted
    v = L.lens_view(weather)
    assert "Score with trainer view" in v.status and v.numbers == "" and v.scatter is None
    # a scripted sample: no logprobs at all
    v = L.lens_view(ctx_samples[0][1])
    assert "no rollout logprobs" in v.status and v.worst == ""
    assert 'data-status="info"' in L.lens_view(None).status


def test_verl_rows_show_both_logprobs_without_scoring(scored, tmp_path):
    from backend.exporters.export import verl_row
    from backend.importers import import_file

    path = tmp_path / "verl.jsonl"
    path.write_text(json.dumps(verl_row(scored)) + "\n")
    (t,) = import_file(str(path), tokenizer="smollm2").traces
    v = L.lens_view(t)
    assert "imported from verl" in v.status
    assert cell(v.numbers, "mean_abs_delta") == pytest.approx(compare(scored).trace.mean_abs_delta, rel=1e-9)
    assert len(v.scatter.data[1].x) == compare(scored).trace.tokens


def test_token_text_in_the_worst_list_is_escaped(scored, bundle):
    t = scored.model_copy(deep=True)
    worst = compare(t).worst(1)[0]
    p = len(t.prompt_ids)
    (lt,) = bundle.tokenizer.encode("<", add_special_tokens=False)
    ids = list(t.response_ids)
    ids[worst.pos - p] = lt
    t.response_ids = ids
    html_text = L.lens_view(t, bundle.tokenizer).worst
    assert '<td class="ali-lens-text">&lt;</td>' in html_text


def test_the_inspector_shows_the_lens_for_the_sessions_trace(scored, ctx_samples):
    ctx = AppContext(samples=ctx_samples)
    sess = Session()
    label = sess.add("scored", scored)
    sess.current = label
    with gr.Blocks():
        ui = inspector.build(ctx, gr.State(sess))
    # the trace views keep their positions (API clients index them); the lens has its own outputs
    assert len(inspector.show_trace(ctx, sess, label, "auto")) == len(ui.trace_outputs())
    assert not set(map(id, ui.lens.outputs())) & set(map(id, ui.trace_outputs()))
    out = inspector.show_lens(ctx, sess, "auto")
    assert len(out) == len(ui.lens.outputs())
    i = ui.lens.outputs().index(ui.lens.numbers)
    assert out[i] == L.lens_view(scored, None, sess.lens_cap).numbers
    assert 'data-status="ok"' in out[ui.lens.outputs().index(ui.lens.status)]
    sess.lens_cap = 3.0
    assert "C = 3" in inspector.show_lens(ctx, sess, "auto")[i]


@pytest.fixture(scope="module")
def ctx_samples():
    from ui.context import load_samples

    samples, problems = load_samples()
    assert not problems and samples
    return samples


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_score_cli_end_to_end_matches_the_lens(weather, scored, tmp_path):
    """``python -m backend score --scorer transformers`` on a small trace file (no --model: the
    embedded model): the file it writes shows in the lens with the numbers the CLI printed, and
    the same trainer logprobs as the app's button (float32; another scorer instance, possibly
    another thread count: equal to float32 noise, not bit for bit)."""

    from backend.trace import load_traces, write_jsonl

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl([weather], str(src))
    r = run_cli("score", str(src), "--out", str(out), "--scorer", "transformers", "--dtype", "float32", "--json",
                env={"TRANSFORMERS_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["scored"] == 1 and summary["dtype"] == "float32" and "score" in r.stderr  # the progress bar
    (t,) = load_traces(str(out)).traces
    assert t.id == weather.id and t.scorer.kind == "transformers" and t.scorer.dtype == "float32"
    view = L.lens_view(t)
    (row,) = summary["traces"]
    assert cell(view.numbers, "tokens") == row["tokens"] == policy_tokens(weather)
    for k in ("mean_abs_delta", "max_abs_delta", "rollout_probs_diff_max", "kl_k3"):
        assert cell(view.numbers, k) == pytest.approx(row[k], rel=1e-12, abs=0), k
    app_side = {x.pos: x.trainer for x in compare(scored).tokens}
    cli_side = {x.pos: x.trainer for x in compare(t).tokens}
    assert app_side.keys() == cli_side.keys()
    assert max(abs(app_side[p] - cli_side[p]) for p in app_side) < 1e-4


def test_the_playground_records_logprobs_when_asked_and_the_lens_scores_that_run():
    """The Playground's "record logprobs" box: off, a run of the embedded model has no
    logprobs; on, every generated step has one per generated token and the lens can score it."""
    from playground_support import fresh, run_all, settings

    from backend.errors import UserError
    from ui import playground

    ctx = app_ctx()
    off = playground.loop_config(settings(backend="transformers"))
    assert "logprobs" not in off.sampling
    with pytest.raises(UserError, match="logprobs"):
        playground.loop_config(settings(backend="transformers", logprobs="yes"))
    runs = {}
    for flag in (False, True):
        sess = fresh(ctx)
        s = settings(backend="transformers", logprobs=flag, temperature=1.0, seed=5, max_tokens=24, tools="[]")
        asyncio.run(run_all(ctx, sess, "Say hello.", s))
        runs[flag] = sess.get(sess.current)
    gen = [st for st in runs[False].steps if st.state == "generating"]
    assert gen and all(st.logprobs is None for st in gen)
    gen = [st for st in runs[True].steps if st.state == "generating"]
    assert gen and all(st.logprobs is not None and len(st.logprobs) == st.end - st.start for st in gen)
    assert all(lp <= 0.0 for st in gen for lp in st.logprobs)
    scored = asyncio.run(L.score(ctx, runs[True], "float32"))
    from backend.checks.logprobs import compare

    assert compare(scored).trace.tokens == sum(st.end - st.start for st in gen)


class _EngineFirst(ModelService):
    """The app's model service with vLLM on the card the lens would score on (no GPU here: the
    engine's start is recorded, not run), and the order of what happens."""

    def __init__(self, events: list) -> None:
        super().__init__(ModelOptions(backend="vllm", scorer_device="cuda"))
        self.events = events

    async def get(self):
        self.events.append(("engine start", [k for k in L.SCORERS.keys() if k[2] == "cuda"]))
        self.generator = self.generator or object()
        return self.generator, None


def test_on_a_card_shared_with_vllm_the_engine_starts_first_and_the_scorer_only_takes_what_is_left(
        weather, scored, smollm2_model_dir, monkeypatch):
    """Issue 31 (7): a float32 scorer loaded before the first Playground run took the card and
    vLLM (0.85 of the free memory) could no longer start. Policy: the engine starts first; the
    scorer goes on the GPU only if the memory left holds it, else the visitor gets the numbers."""
    events: list = []
    ctx = AppContext(model=_EngineFirst(events), trust=TrustPolicy(Mode.LOCAL, "test"))
    assert L.shares_card_with_vllm(ctx) and not L.shares_card_with_vllm(app_ctx())

    def free() -> int:
        events.append(("free memory read", None))
        return 64 << 20

    monkeypatch.setattr(L, "gpu_free_bytes", free)
    with pytest.raises(L.LensError, match=r"float32 scorer of this model needs about [\d.]+ GiB of GPU memory; 0\.1 GiB "
                                          r"is free beside the vLLM engine \(bfloat16 halves the weights\)"):
        asyncio.run(L.score(ctx, weather, "float32"))
    assert events == [("engine start", []), ("free memory read", None)]  # the engine first, nothing on the card before
    assert not [k for k in L.SCORERS.keys() if k[2] == "cuda"]
    # the estimate: the weights (parameters as torch counts them) at 4 bytes, and two float32
    # logits rows per token of a longest trace
    cpu = L.SCORERS.get(smollm2_model_dir, "float32", "cpu")  # loaded by the `scored` fixture
    params = sum(p.numel() for p in cpu.model.parameters())
    vocab = cpu.model.config.vocab_size
    assert L.scorer_bytes(smollm2_model_dir, "float32") == params * 4 + 2 * L.MAX_SCORE_TOKENS * vocab * 4
    assert L.scorer_bytes(smollm2_model_dir, "bfloat16") == params * 2 + 2 * L.MAX_SCORE_TOKENS * vocab * 4
    assert L.scorer_bytes("some-org/some-model", "float32") is None  # not local: not refused on a guess
    L.check_fits_beside_vllm(smollm2_model_dir, "float32", 80 << 30)  # an 80 GB card's leftover holds it


def test_a_hub_model_already_in_the_local_cache_is_sized_from_its_snapshot(smollm2_model_dir, tmp_path, monkeypatch):
    """Issue 31 (7), the gap left: the Space's default model is a hub id (vLLM downloads it into the
    Hugging Face cache before the scorer is considered), and a hub id was never sized, so the
    scorer went onto a full card unchecked. The id's snapshot in the local cache is sized as its
    folder is; huggingface_hub's own cache lookup finds it (no request); an id not in the cache
    and a string that is no hub id stay unsized."""
    import shutil

    import huggingface_hub.constants as hub_constants

    cache = tmp_path / "hub"
    repo = cache / "models--some-org--smol"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for name in os.listdir(smollm2_model_dir):
        if name.endswith((".json", ".safetensors")):
            shutil.copy(os.path.join(smollm2_model_dir, name), snap / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert L.scorer_bytes("some-org/smol", "float32") == L.scorer_bytes(smollm2_model_dir, "float32") > 0
    assert L.scorer_bytes("some-org/other", "float32") is None
    assert L.scorer_bytes("../../etc", "float32") is None
    with pytest.raises(L.LensError, match="needs about"):
        L.check_fits_beside_vllm("some-org/smol", "float32", 64 << 20)


def test_a_gpu_out_of_memory_while_loading_or_scoring_is_a_lens_message(weather, monkeypatch):
    """Issue 31 (7): the card can hold less than estimated (another process, fragmentation): torch's
    CUDA out-of-memory error, at the scorer's load or in its forward pass, reaches the visitor as
    the lens's message (with what to do), not as an app error; any other RuntimeError is not
    swallowed."""
    import torch

    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.6 GiB")

    def full(*a, **k):
        raise oom

    monkeypatch.setattr(L.SCORERS, "get", full)
    tag, msg = L._score_task("m", "float32", "cuda", weather, None)
    assert tag == "error" and "ran out of memory for the float32 scorer" in msg and "Tried to allocate 2.00 GiB" in msg, msg
    assert "bfloat16 halves the weights" in msg and "python -m backend score" in msg
    ctx = app_ctx()
    with pytest.raises(L.LensError, match="ran out of memory for the bfloat16 scorer"):
        L.score_sync(ctx, weather, "bfloat16")  # the load before the GPU call
    monkeypatch.setattr(L.SCORERS, "get", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        L._score_task("m", "float32", "cuda", weather, None)
