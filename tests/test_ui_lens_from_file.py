"""The logprob lens on files that store both sides (issue 30, item 4), in process: a prime-rl token
export and a verifiers ``traces.jsonl`` (both written by the real libraries,
tests/fixtures_gen/gen_verifiers.py) uploaded as a visitor does, opened as the Inspector opens them,
and shown by the lens with no scoring and no model: the status says "from the file", the numbers
equal what the file itself says (prime-rl's own per-token ``mismatch_kl``, averaged over its
``loss_mask``; the verifiers nodes' ``logprobs`` and ``reference_logprobs``, read here with json),
the worst token is the file's largest |trainer − inference|. A file with rollout logprobs only
(NeMo-Gym's rollouts) is offered the scoring, as before. /inspector_lens over the API: tests/test_api.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ui import logprob_lens as L
from ui import trace_files
from ui.context import AppContext, Session, load_samples

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "import"
PRIME_RL = DATA / "verifiers" / "run" / "token_exports" / "step_3" / "rank_0.jsonl"
VERIFIERS = DATA / "verifiers" / "traces.jsonl"
NEMO_GYM = DATA / "nemo_gym" / "rollouts.jsonl"


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


def metric(numbers: str, name: str) -> float:
    m = re.search(rf'<tr data-metric="{name}"><th[^>]*>[^<]*</th><td data-value="([^"]+)"', numbers)
    assert m, name
    return float(m.group(1))


def opened(ctx: AppContext, path: Path) -> tuple[Session, list]:
    """The file uploaded, each row opened as the Inspector opens it (the session's trace)."""
    sess = Session()
    status, _ = trace_files.load_file(ctx, sess, str(path), "auto", "qwen3")
    assert "ali-ok" in status, status
    return sess, [sess.get(trace_files.open_file_row(sess, i)) for i in range(len(sess.file_traces))]


def prime_rl_rows() -> list[dict]:
    return [json.loads(line) for line in PRIME_RL.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_a_prime_rl_token_export_shows_its_own_mismatch_kl(ctx):
    rows = prime_rl_rows()
    _, traces = opened(ctx, PRIME_RL)
    assert len(traces) == len(rows) == 2
    for row, t in zip(rows, traces):
        v = L.lens_view(t)
        assert 'data-status="ok"' in v.status and "from the file" in v.status and "prime-rl trainer_logprobs" in v.status
        on = [i for i, m in enumerate(row["loss_mask"]) if m]
        assert metric(v.numbers, "tokens") == len(on)
        # prime-rl computed mismatch_kl = exp(Δ) − Δ − 1 per token in float32: its mean over the loss mask
        assert metric(v.numbers, "kl_k3") == pytest.approx(sum(row["mismatch_kl"][i] for i in on) / len(on), rel=1e-2)
        d = {i: row["trainer_logprobs"][i] - row["inference_logprobs"][i] for i in on}
        assert metric(v.numbers, "max_abs_delta") == pytest.approx(max(abs(x) for x in d.values()), rel=1e-6)
        assert metric(v.numbers, "mean_abs_delta") == pytest.approx(sum(abs(x) for x in d.values()) / len(on), rel=1e-6)
        # the tokens that dominate it: the first worst token is the file's largest |Δ| (position = index in token_ids)
        shown = [int(x) for x in re.findall(r'class="ali-lens-tok" data-pos="(\d+)"', v.worst)]
        assert shown and abs(d[shown[0]]) == pytest.approx(max(abs(x) for x in d.values()), rel=1e-6)
        assert [abs(d[i]) for i in shown] == sorted((abs(d[i]) for i in shown), reverse=True)
        assert len(v.scatter.data[1].x) == len(on)  # one point per loss-mask token


def test_a_verifiers_trace_shows_its_reference_logprobs(ctx):
    recs = [json.loads(line) for line in VERIFIERS.read_text(encoding="utf-8").splitlines() if line.strip()]
    _, traces = opened(ctx, VERIFIERS)
    assert len(traces) == len(recs)
    by_id = {t.id: t for t in traces}
    for rec in recs:
        for tr in rec["traces"]:
            pairs = [(lp, ref) for n in tr["nodes"] if n.get("sampled") and n.get("reference_logprobs") is not None
                     for lp, ref in zip(n["logprobs"], n["reference_logprobs"])]
            v = L.lens_view(by_id[tr["id"]])
            assert "from the file" in v.status and "verifiers reference_logprobs" in v.status
            assert metric(v.numbers, "tokens") == len(pairs) > 0
            ds = [ref - lp for lp, ref in pairs]
            assert metric(v.numbers, "max_abs_delta") == pytest.approx(max(abs(x) for x in ds), rel=1e-9)
            assert metric(v.numbers, "kl_k3") == pytest.approx(sum(math.exp(x) - x - 1 for x in ds) / len(ds), rel=1e-6, abs=1e-12)


def test_rollout_logprobs_only_are_offered_the_scoring(ctx):
    _, traces = opened(ctx, NEMO_GYM)
    t = traces[0]
    assert L.has_rollout_logprobs(t) and not L.has_logprob_pairs(t) and not L.from_file(t)
    v = L.lens_view(t)
    assert "Score with trainer view" in v.status and v.numbers == ""
