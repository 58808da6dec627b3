"""The Trace files tab's GRPO group and reward filters over a trace set (issue 30, item 5), in
process: a prime-rl run folder (verifiers episodes and trainer token exports, written by the real
code, tests/fixtures_gen/gen_verifiers.py) as the app's ``--traces``; the rows a group keeps (by its
id, or the group view's ``<step>/<id>`` key) and the rows a reward filter keeps, against the
episodes' ``group.id`` and rewards read here with json; the filters' events as the page sends them."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

import backend.importers  # noqa: F401 - registers other tools' readers with the trace-set catalogue
from backend.safety.trust import Mode, TrustPolicy
from ui import trace_sets as sets
from ui.context import AppContext, new_session

RUN = Path(__file__).resolve().parent / "data" / "import" / "verifiers" / "run"


def _episodes() -> list[dict]:
    return [json.loads(line) for p in sorted(glob.glob(str(RUN / "rollouts" / "**" / "traces.jsonl"), recursive=True))
            for line in open(p, encoding="utf-8")]


def _reward(tr: dict) -> float:
    return sum(r["score"] * r.get("weight", 1.0) for r in tr["rewards"].values())


@pytest.fixture
def sess(tmp_path, monkeypatch):
    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))
    s = new_session(AppContext(traces=str(RUN), trust=TrustPolicy(mode=Mode.LOCAL)))
    assert sets.in_set_mode(s)
    return s


def _shown(sess) -> list[str]:
    return sorted(sets.set_outputs(sess)[3]["id"])


def test_a_group_filter_keeps_that_groups_samples(sess):
    eps = _episodes()
    by_group: dict[str, list[str]] = {}
    for ep in eps:
        by_group.setdefault(ep["group"]["id"], []).extend(tr["id"] for tr in ep["traces"])
    assert len(by_group) >= 2
    view = sess.set_view if isinstance(sess.set_view, sets.SetView) else sets.SetView()
    sess.set_view = view
    everything = _shown(sess)
    for gid, ids in by_group.items():
        view.group = gid
        assert _shown(sess) == sorted(ids)
    # the group view's key names the step too
    ep = eps[0]
    view.group = f"{ep['run']['work']['step']}/{ep['group']['id']}"
    want = sorted(tr["id"] for e in eps if e["group"]["id"] == ep["group"]["id"] and e["run"]["work"]["step"] == ep["run"]["work"]["step"]
                  for tr in e["traces"])
    assert _shown(sess) == want
    view.group = "<b>no such group</b>"
    assert _shown(sess) == []
    view.group = ""
    assert _shown(sess) == everything


def test_a_reward_filter_keeps_the_rows_with_that_reward(sess):
    rewards = {tr["id"]: _reward(tr) for ep in _episodes() for tr in ep["traces"]}
    view = sets.SetView()
    sess.set_view = view
    ts, _ = sets.session_set(sess)
    no_reward = sorted(set(ts.df["id"]) - set(rewards))  # the token exports state no reward
    view.reward = "reward > 0"
    assert _shown(sess) == sorted(k for k, v in rewards.items() if v > 0)
    view.reward = "reward = 0"
    assert _shown(sess) == sorted(k for k, v in rewards.items() if v == 0)
    view.reward = "no reward"
    assert _shown(sess) == no_reward and no_reward
    assert {"reward > 0", "reward = 0", "reward < 0", "no reward"} <= set(sets.REWARD_CHOICES)


def test_the_tab_has_the_filters_beside_the_step_and_they_list_again(tmp_path, monkeypatch):
    import ui

    monkeypatch.setenv("ALI_TRACE_INDEX_CACHE", str(tmp_path / "cache"))
    demo = ui.build_app(AppContext(traces=str(RUN), trust=TrustPolicy(mode=Mode.LOCAL)))
    by_elem = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    group, reward, table = by_elem["tf-group"], by_elem["tf-reward"], by_elem["tf-table"]
    assert list(reward.choices) in (sets.REWARD_CHOICES, [(c, c) for c in sets.REWARD_CHOICES])
    # a typed group (Enter or leaving the box) and a picked reward list the table again, with both filters as inputs
    for comp, event in ((group, "submit"), (group, "blur"), (reward, "input")):
        fns = [f for f in demo.fns.values() if (comp._id, event) in [(t[0], t[1]) for t in f.targets]]
        assert fns, (comp.elem_id, event)
        assert any(group in f.inputs and reward in f.inputs and table in f.outputs for f in fns), (comp.elem_id, event)
    # the handler as the page calls it: the typed group is kept in the session's view, the table is its samples
    (f,) = [f for f in demo.fns.values() if (group._id, "submit") in [(t[0], t[1]) for t in f.targets]]
    sess = new_session(AppContext(traces=str(RUN), trust=TrustPolicy(mode=Mode.LOCAL)))
    ep = _episodes()[0]
    out = f.fn(sess, sets.ALL, sets.ALL, "", sets.ALL, 1, True, f"  {ep['group']['id']} ", "reward > 0")
    assert (sess.set_view.group, sess.set_view.reward) == (ep["group"]["id"], "reward > 0")
    ids = sorted(tr["id"] for e in _episodes() if e["group"]["id"] == ep["group"]["id"] for tr in e["traces"] if _reward(tr) > 0)
    assert ids and sorted(out[3]["id"]) == ids
