"""The GRPO group view of the Trace files tab (ui/grpo_groups.py), in process: a TRL completion log
(written by ``trl.GRPOTrainer``, tests/fixtures_gen/gen_trl.py) uploaded as a visitor does; the
groups, ranks, rewards and advantages come from the Parquet file's own columns (read here with
pandas), the departure token from the trace's ids; filters by step and reward; the aligned view of
two samples; text from traces escaped; a link's group and sample; a trace set's groups."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import pytest

from backend.trace import Trace, write_jsonl
from ui import grpo_groups as gv
from ui import trace_files
from ui.context import AppContext, Session, load_samples
from ui.inspector import link_tab

ROOT = Path(__file__).resolve().parent.parent
TRL_STEP1 = ROOT / "tests" / "data" / "import" / "trl" / "completions" / "completions_00001.parquet"


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


def _upload(ctx: AppContext, path: Path) -> Session:
    sess = Session()
    status, _ = trace_files.load_file(ctx, sess, str(path), "auto", "qwen3")
    assert "ali-ok" in status, status
    return sess


def _view(ctx, sess, step=None, reward=None, group=None, a=None, b=None, note=""):
    return gv.view(ctx, sess, trace_files.audit_source, step, reward, group, a, b, note)


def test_a_trl_log_groups_by_prompt_ranked_by_reward(ctx):
    sess = _upload(ctx, TRL_STEP1)
    df = pd.read_parquet(TRL_STEP1)
    v = _view(ctx, sess)
    groups, first = v["groups"]
    assert len(groups) == 2 and first == groups[0][1]
    assert v["steps"] == (["(all)", str(int(df["step"].iloc[0]))], "(all)")
    users = [p[-1]["content"] for p in df["prompt"]]
    for _, key in groups:
        w = _view(ctx, sess, group=key)
        table = w["table"]
        assert len(table) == 2 and list(table["rank"]) == [1, 2]
        rows = [int(i) for i in table["#"]]
        assert len({users[i] for i in rows}) == 1  # one prompt per group
        rewards = [float(df[["right_answer", "brevity"]].iloc[i].sum()) for i in rows]
        assert rewards == sorted(rewards, reverse=True)
        assert [float(x) for x in table["reward"]] == pytest.approx(rewards, abs=1e-3)
        assert [float(x) for x in table["advantage"]] == pytest.approx([float(df["advantage"].iloc[i]) for i in rows], abs=1e-3)
        assert table["departs at"].iloc[0] == "" and table["departs at"].iloc[1].startswith("token ")
        # the pair: best and worst by default, side by side, the first difference framed
        pairs, a, b = w["pair"]
        assert (a, b) == ("1", "2")
        t_a, t_b = (trace_files.file_trace(sess, i) for i in rows)
        n = next(i for i, (x, y) in enumerate(zip(t_a.response_ids, t_b.response_ids)) if x != y)
        assert f'data-departs="{n}" data-unit="token"' in w["aligned"]
        assert w["aligned"].count("gv-at") == 3  # the legend's and each side's
        assert html.escape(users[rows[0]]) in w["note"] and "link to this group" in w["note"]
        assert f"group={key.replace('/', '%2F')}" in w["note"]


def test_filters_by_step_and_reward(ctx, tmp_path):
    def t(tid, prompt, score, step):
        return Trace(id=tid, messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": tid}],
                     metadata={"training_step": step, "score": score})

    traces = [t("a1", "A", 1.0, 1), t("a2", "A", 0.0, 1), t("b1", "B", 0.5, 1), t("b2", "B", 0.5, 1),
              t("c1", "A", 1.0, 2), t("c2", "A", 1.0, 2)]
    path = tmp_path / "run.jsonl"
    write_jsonl(traces, str(path))
    sess = _upload(ctx, path)
    assert len(_view(ctx, sess)["groups"][0]) == 3
    assert [label for label, _ in _view(ctx, sess, step="2")["groups"][0]] == ["step 2 · A · 2 samples, mean 1 · no signal"]
    flat = _view(ctx, sess, reward=gv.NO_SIGNAL)
    assert len(flat["groups"][0]) == 2 and "no learning signal" in flat["note"]
    sig = _view(ctx, sess, reward=gv.SIGNAL)
    assert len(sig["groups"][0]) == 1 and list(sig["table"]["id"]) == ["a1", "a2"]
    # a step that is not there falls back to all; text (no token ids) is compared by character
    assert _view(ctx, sess, step="99")["steps"][1] == "(all)"
    assert 'data-departs="1" data-unit="char"' in sig["aligned"]


def test_text_from_traces_is_escaped(ctx, tmp_path):
    bad = '<img src=x onerror="alert(1)">'
    traces = [Trace(id=f"{bad}{i}", messages=[{"role": "user", "content": bad}, {"role": "assistant", "content": bad + str(i)}],
                    metadata={"group": bad, "score": float(i)}) for i in range(2)]
    path = tmp_path / "x.jsonl"
    write_jsonl(traces, str(path))
    sess = _upload(ctx, path)
    v = _view(ctx, sess)
    for part in (v["note"], v["aligned"]):
        assert "<img" not in part and "&lt;img" in part


def test_a_link_names_a_group_and_a_sample(ctx, tmp_path):
    sess = _upload(ctx, TRL_STEP1)
    groups = _view(ctx, sess)["groups"][0]
    key = groups[1][1]
    worst = _view(ctx, sess, group=key)["table"]["id"].iloc[1]
    g, tid = gv.link_params({"group": key, "trace": worst})
    a = gv.rank_of(sess, trace_files.audit_source, g, tid)
    assert a == "2"
    v = _view(ctx, sess, group=g, a=a)
    assert v["groups"][1] == key and v["pair"][1:] == ("2", "2")
    assert link_tab({"group": key}, True) == "files" and link_tab({"trace": "x"}, True) == "inspector"
    assert gv.rank_of(sess, trace_files.audit_source, "no/such", tid) is None
    # the address once the Inspector has shown that trace (ui/assets/inspector_request.js): the
    # trace named by its label, the tab by the Inspector, group= kept: the same group and sample
    row = next(i for i in range(len(sess.file_traces)) if trace_files.file_trace(sess, i).id == worst)
    label = trace_files.open_file_row(sess, row)  # as the Inspector opens it
    assert label != worst
    rewritten = {"tab": "inspector", "group": key, "trace": label, "step": "1"}
    assert link_tab(rewritten, True) == "inspector"
    g2, t2 = gv.link_params(rewritten)
    assert g2 == key and gv.rank_of(sess, trace_files.audit_source, g2, t2) == "2"


def test_the_groups_are_kept_until_the_tab_shows_other_traces(ctx, tmp_path):
    sess = _upload(ctx, TRL_STEP1)
    _view(ctx, sess)
    held = sess.groups
    _view(ctx, sess, reward=gv.SIGNAL)
    assert sess.groups is held
    other = tmp_path / "one.jsonl"
    write_jsonl([Trace(id="solo", messages=[{"role": "user", "content": "q"}])], str(other))
    trace_files.load_file(ctx, sess, str(other))
    v = _view(ctx, sess)
    assert sess.groups is not held and list(v["table"]["id"]) == ["solo"]


def test_a_trace_set_is_grouped(ctx, tmp_path):
    from backend.importers import import_file
    from backend.trace.catalog import SetRegistry

    res = import_file(str(TRL_STEP1), "trl", tokenizer="qwen3")
    d = tmp_path / "run"
    d.mkdir()
    write_jsonl(res.traces, str(d / "1.jsonl"))
    sess = Session(set_spec=str(d), set_registry=SetRegistry())
    v = _view(ctx, sess)
    assert len(v["groups"][0]) == 2 and len(v["table"]) == 2
    assert json.loads(json.dumps(list(v["table"]["id"])))[0] in {t.id for t in res.traces}


def test_grouping_is_bounded_and_says_so(ctx, monkeypatch):
    """At most MAX_READ_TOKENS response tokens are read: past them the rest is not grouped, and the
    note says how many of how many traces were."""
    sess = _upload(ctx, TRL_STEP1)
    first = trace_files.file_trace(sess, 0)
    monkeypatch.setattr(gv, "MAX_READ_TOKENS", len(first.response_ids))  # the first trace uses it up
    v = _view(ctx, sess)
    assert list(v["table"]["id"]) == [first.id]
    assert "of the first 1 of 4 traces" in v["note"]
