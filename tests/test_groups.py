"""GRPO groups (backend/checks/groups.py): hand-built traces, and TRL's own completion logs
(tests/data/import/trl, written by ``trl.GRPOTrainer``: tests/fixtures_gen/gen_trl.py), whose
``advantage`` column is TRL's ``(r − mean) / (std + 1e-4)`` over each group: the oracle for the
grouping and the group statistics."""

from __future__ import annotations

import glob
import json
import math
import os

import pandas as pd
import pytest
from cli_inprocess import run_cli

from backend.checks.groups import departure, find_group, group_traces
from backend.importers import import_file
from backend.trace import Trace
from backend.trace.model import Step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL = os.path.join(ROOT, "tests", "data", "import", "trl")
TRL_FILES = sorted(glob.glob(os.path.join(TRL, "completions", "completions_*.parquet"))
                   + glob.glob(os.path.join(TRL, "plain", "completions", "completions_*.parquet")))


def make(tid, prompt, answer, *, meta=None, ids=None, end=None, finish=None):
    steps = []
    if finish is not None:
        steps = [Step(index=0, state="generating", finish_reason=finish)]
    return Trace(id=tid, messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                 response_ids=ids or [], response_mask=[1] * len(ids or []), metadata=meta or {},
                 termination_reason=end, steps=steps)


def test_departure():
    assert departure([1, 2, 3], [1, 2, 3]) is None
    assert departure([1, 2, 3], [1, 5, 3]) == 1
    assert departure([1, 2], [1, 2, 3]) == 2
    assert departure([], [7]) == 0
    assert departure("abc", "abd") == 2


def test_grouped_by_prompt_and_step_ranked_by_reward():
    traces = [
        make("a", "2+2?", "4", meta={"training_step": 1, "score": 1.0}, ids=[10, 11, 12], end="no_tool_calls"),
        make("b", "2+2?", "5", meta={"training_step": 1, "score": 0.0, "advantage": -0.7}, ids=[10, 13], finish="length"),
        make("c", "3+3?", "6", meta={"training_step": 1, "score": 0.5}),
        make("d", "2+2?", "four", meta={"training_step": 1, "score": 2.0, "advantage": 0.7}, ids=[10, 11, 14, 15]),
        make("e", "2+2?", "4", meta={"training_step": 2, "score": 1.0}),  # same prompt, another step
        make("f", "2+2?", "x", meta={"training_step": 1}),  # no reward: ranked last
    ]
    groups = group_traces(traces)
    assert [(g.step, len(g.samples)) for g in groups] == [(1, 4), (1, 1), (2, 1)]
    g = groups[0]
    assert g.by == "prompt" and g.key.startswith("1/p-") and g.prompt == "2+2?"
    assert [s.id for s in g.samples] == ["d", "a", "b", "f"]
    assert [s.rank for s in g.samples] == [1, 2, 3, 4]
    d, a, b, f = g.samples
    assert (a.tokens, a.generated, a.end, a.end_label) == (3, 3, "no_tool_calls", "answered (no_tool_calls)")
    assert (b.end, b.advantage, d.advantage) == ("length", -0.7, 0.7)
    # departs from the best sample (d: ids 10 11 14 15): a at token 2, b at token 1; f has no ids: by text
    assert (d.departs, a.departs, a.departs_unit, b.departs) == (None, 2, "token", 1)
    assert (f.departs, f.departs_unit) == (0, "char")  # "x" vs "four"
    assert g.mean == pytest.approx(1.0) and g.std == pytest.approx(1.0)  # rewards 2, 1, 0 (f has none)
    assert not g.all_equal  # f has no reward
    assert groups[1].std is None and not groups[1].all_equal  # one sample
    assert find_group(groups, g.key) is g and find_group(groups, "nope") is None
    # a group id alone finds the group when one step has it
    assert find_group(groups, groups[1].group) is groups[1]


def test_group_ids_from_metadata_and_zero_signal():
    traces = [make(f"t{i}", f"prompt {i}", "same", meta={"group": "g7", "training_step": 3, "score": 0.25}) for i in range(3)]
    traces.append(make("v", "whatever", "y", meta={"uid": "u1", "step": 3, "reward_score": 1}))  # verl's keys
    groups = group_traces(traces)
    g7, u1 = groups
    assert (g7.key, g7.by, len(g7.samples)) == ("3/g7", "group", 3)  # different prompts, one group id
    assert g7.all_equal and g7.std == 0.0 and g7.mean == 0.25
    assert all(s.departs is None for s in g7.samples)  # the same text throughout
    assert (u1.key, u1.samples[0].reward) == ("3/uid-u1", 1.0)


def test_token_level_advantage_is_kept_as_a_list():
    t = make("a", "p", "r", meta={"advantage": [0.5, None, 1.5]})
    s = group_traces([t])[0].samples[0]
    assert s.advantage == [0.5, None, 1.5] and s.advantage_value == 1.0


@pytest.fixture(scope="module")
def trl_traces():
    return {p: import_file(p, "trl", tokenizer="qwen3").traces for p in TRL_FILES}


def test_trl_groups_reproduce_trls_advantages(trl_traces):
    """TRL logs no group id: grouped by prompt, each group's mean and std (n − 1) give back the
    advantage TRL wrote for every sample (scale_rewards="group", the default)."""
    assert len(TRL_FILES) == 4
    for path, traces in trl_traces.items():
        df = pd.read_parquet(path)
        groups = group_traces(traces)
        assert len(groups) == 2, path  # 2 prompts a step, 2 generations each
        for g in groups:
            assert len(g.samples) == 2 and g.step == int(df["step"].iloc[0]) and g.by == "prompt"
            for s in g.samples:
                want = float(df["advantage"].iloc[s.row])
                rewards = df[["right_answer", "brevity"]].iloc[s.row]
                assert s.reward == pytest.approx(float(rewards.sum()))
                assert (s.reward - g.mean) / (g.std + 1e-4) == pytest.approx(want, abs=1e-4)
                assert s.advantage == pytest.approx(want)
            assert g.samples[0].reward >= g.samples[1].reward
            assert g.samples[0].advantage > 0 > g.samples[1].advantage
            # the departure from the best sample, from the rendered response ids
            best, other = (traces[s.row] for s in g.samples)
            n = next(i for i, (x, y) in enumerate(zip(best.response_ids, other.response_ids)) if x != y)
            assert g.samples[1].departs == n and g.samples[1].departs_unit == "token"
            assert g.samples[0].tokens == len(best.response_ids)


def test_trl_prompts_group_the_rows_that_share_them(trl_traces):
    traces = trl_traces[TRL_FILES[0]]
    for g in group_traces(traces):
        prompts = {json.dumps(traces[s.row].messages[0], sort_keys=True) for s in g.samples}
        assert len(prompts) == 1


@pytest.mark.slow  # ≥ 10 s here (three CLI runs): out of the edit loop, in CI
def test_cli_groups_table_and_json():
    path = TRL_FILES[0]
    r = run_cli("groups", path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [g["n"] for g in out["groups"]] == [2, 2]
    df = pd.read_parquet(path)
    assert len(out_ids(out)) == len(df) and out["problems"] == []
    rewards = sorted(round(float(x), 6) for x in df[["right_answer", "brevity"]].sum(axis=1))
    assert sorted(round(s["reward"], 6) for g in out["groups"] for s in g["samples"]) == rewards
    r = run_cli("groups", path)
    assert r.returncode == 0, r.stderr
    assert "rank" in r.stdout and "What is the weather in Zürich" in r.stdout
    bad = run_cli("groups", os.path.join(ROOT, "no-such-file.jsonl"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def out_ids(out):
    return [s["id"] for g in out["groups"] for s in g["samples"]]


def test_nan_score_is_no_reward():
    t = make("a", "p", "r", meta={"score": math.nan})
    assert group_traces([t])[0].samples[0].reward is None
