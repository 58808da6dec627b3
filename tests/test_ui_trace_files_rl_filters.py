"""The Trace files tab's training step, GRPO group and reward filters on an UPLOADED file (issue 30,
item 5), in process: a TRL completion log (written by ``trl.GRPOTrainer``,
tests/fixtures_gen/gen_trl.py) and a prime-rl run's two steps (verifiers episodes written by the
real code, tests/fixtures_gen/gen_verifiers.py; the two steps' ``traces.jsonl`` uploaded as one
file, as ``cat`` joins them). What each filter keeps is read here from the files with pandas and
json: the TRL rows' reward (the sum of the reward columns) and prompt (the samples of one prompt
are one group: TRL names no group), the episodes' step, ``group.id`` and rewards. Export exports
what the filters keep; the controls say when a file has nothing to filter on."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from backend.safety.trust import Mode, TrustPolicy
from ui import trace_files as tf
from ui.context import AppContext, Session, load_samples
from ui.trace_sets import ALL, REWARD_CHOICES

ROOT = Path(__file__).resolve().parent.parent
TRL = ROOT / "tests" / "data" / "import" / "trl" / "completions" / "completions_00001.parquet"
RUN = ROOT / "tests" / "data" / "import" / "verifiers" / "run" / "rollouts"
STEPS = sorted(RUN.glob("step_*/train/all/traces.jsonl"))


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    return AppContext(trust=TrustPolicy(mode=Mode.LOCAL))


def _load(ctx: AppContext, path: Path) -> Session:
    sess = Session()
    status, _ = tf.load_file(ctx, sess, str(path))
    assert "ali-err" not in status, status
    return sess


def _kept(sess: Session, step: str = ALL, group: str = "", reward: str = ALL) -> pd.DataFrame:
    return tf.table_outputs(sess, ALL, ALL, "", step, group, reward)[2]


# ---- TRL: a completion log, one step, groups by prompt --------------------------------------------


@pytest.fixture(scope="module")
def trl_rows() -> pd.DataFrame:
    df = pd.read_parquet(TRL)
    out = pd.DataFrame({"reward": df[["right_answer", "brevity"]].sum(axis=1),
                        "prompt": [json.dumps(list(p), default=str) for p in df["prompt"]], "step": df["step"]})
    assert out["reward"].gt(0).any() and out["reward"].lt(0).any() and out["prompt"].nunique() >= 2
    return out


def test_a_trl_log_filters_by_reward(ctx, trl_rows):
    sess = _load(ctx, TRL)
    assert len(_kept(sess)) == len(trl_rows)
    for choice, want in (("reward > 0", trl_rows["reward"] > 0), ("reward < 0", trl_rows["reward"] < 0),
                         ("reward = 0", trl_rows["reward"] == 0), ("no reward", trl_rows["reward"].isna())):
        assert sorted(_kept(sess, reward=choice)["#"]) == sorted(trl_rows.index[want]), choice


def test_a_trl_log_filters_by_group_and_step(ctx, trl_rows):
    """A TRL log names no group: the group view groups its rows by prompt, and the filter takes the
    group view's ids and keys (``<step>/<id>``); each keeps exactly the rows of one prompt."""
    from ui import grpo_groups as gv

    sess = _load(ctx, TRL)
    v = gv.view(None, sess, tf.audit_source, gv.ALL, gv.ALL, None, None, None)
    keys = [k for _, k in v["groups"][0]]
    by_prompt = sorted(sorted(ix) for ix in trl_rows.groupby("prompt").groups.values())
    assert sorted(sorted(_kept(sess, group=k)["#"]) for k in keys) == by_prompt
    step = str(int(trl_rows["step"].iloc[0]))
    assert all(k.startswith(f"{step}/") for k in keys)
    ids = [k.split("/", 1)[1] for k in keys]  # the id alone: the same rows
    assert sorted(sorted(_kept(sess, group=g)["#"]) for g in ids) == by_prompt
    # with the reward filter: the group's rows with that reward
    first = sorted(_kept(sess, group=keys[0])["#"])
    assert sorted(_kept(sess, group=keys[0], reward="reward > 0")["#"]) == [i for i in first if trl_rows["reward"][i] > 0]
    assert sorted(_kept(sess, step=step)["#"]) == list(trl_rows.index)
    assert len(_kept(sess, step="999")) == len(trl_rows)
    assert _kept(sess, group="<b>no such group</b>").empty


def test_the_controls_follow_the_file(ctx, trl_rows):
    sess = _load(ctx, TRL)
    step, group, reward = tf.rl_filter_updates(sess)
    assert step["choices"] == [ALL, str(int(trl_rows["step"].iloc[0]))] and step["interactive"] is True
    assert group["interactive"] is True and reward["interactive"] is True
    # a usable control clears the "no step / no reward" text an earlier file left: "" (Gradio keeps
    # the old info on None; a TRL upload read "these traces state no reward" under a working filter)
    assert (step["info"], group["info"], reward["info"]) == ("", "", "")
    # the filters applied are what the controls show again (a reload of the table keeps them)
    _kept(sess, group="  1/x ", reward="reward > 0")
    step, group, reward = tf.rl_filter_updates(sess)
    assert (step["value"], group["value"], reward["value"]) == (ALL, "1/x", "reward > 0")


def test_a_file_with_no_step_and_no_reward_disables_those_filters_saying_why(ctx, tmp_path):
    src = ROOT / "sample_traces" / "01_weather.jsonl"
    sess = _load(ctx, src)
    step, group, reward = tf.rl_filter_updates(sess)
    assert step["interactive"] is False and "no training step" in step["info"]
    assert reward["interactive"] is False and "no reward" in reward["info"]
    assert group["interactive"] is True  # grouped by prompt
    # over the API a reward filter on such a file keeps nothing, "no reward" every row
    n = sum(1 for line in src.read_text(encoding="utf-8").splitlines() if line.strip())
    assert _kept(sess, reward="reward > 0").empty and len(_kept(sess, reward="no reward")) == n


def test_the_samples_in_memory_filter_too():
    """The samples a new session holds (traces in memory, no index of an upload) filter the same way."""
    samples, problems = load_samples()
    assert not problems
    sess = Session(traces=dict(samples), file_traces=[label for label, _ in samples], file_name="sample_traces")
    everything = _kept(sess)
    assert len(everything) == len(samples)
    assert _kept(sess, reward="reward > 0").empty and len(_kept(sess, reward="no reward")) == len(samples)


# ---- prime-rl: two steps, groups named by the file -----------------------------------------------


def _episodes() -> list[dict]:
    return [json.loads(line) for p in STEPS for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def _reward(tr: dict) -> float:
    return sum(r["score"] * r.get("weight", 1.0) for r in tr["rewards"].values())


@pytest.fixture(scope="module")
def run_rows() -> list[dict]:
    """One row per sample of the episodes: id, step, group id, reward."""
    rows = [{"id": tr["id"], "step": ep["run"]["work"]["step"], "group": ep["group"]["id"], "reward": _reward(tr)}
            for ep in _episodes() for tr in ep["traces"]]
    assert len({r["step"] for r in rows}) >= 2 and len({r["group"] for r in rows}) >= 2
    return rows


@pytest.fixture
def run_file(tmp_path) -> Path:
    assert len(STEPS) >= 2
    out = tmp_path / "traces.jsonl"
    out.write_bytes(b"".join(p.read_bytes() for p in STEPS))
    return out


def _ids(df: pd.DataFrame) -> list[str]:
    return sorted(df["id"])


def test_a_two_step_run_filters_by_step_group_and_reward(ctx, run_rows, run_file):
    sess = _load(ctx, run_file)
    assert _ids(_kept(sess)) == sorted(r["id"] for r in run_rows)
    steps = sorted({r["step"] for r in run_rows})
    assert tf.rl_filter_updates(sess)[0]["choices"] == [ALL, *map(str, steps)]
    for st in steps:
        assert _ids(_kept(sess, step=str(st))) == sorted(r["id"] for r in run_rows if r["step"] == st)
    for g in {r["group"] for r in run_rows}:
        assert _ids(_kept(sess, group=g)) == sorted(r["id"] for r in run_rows if r["group"] == g)  # every step
        for st in steps:  # the group view's key: that step only
            want = sorted(r["id"] for r in run_rows if r["group"] == g and r["step"] == st)
            assert _ids(_kept(sess, group=f"{st}/{g}")) == want
            assert _ids(_kept(sess, step=str(st), group=g)) == want
    for choice, keep in (("reward > 0", lambda x: x > 0), ("reward = 0", lambda x: x == 0), ("reward < 0", lambda x: x < 0)):
        assert _ids(_kept(sess, reward=choice)) == sorted(r["id"] for r in run_rows if keep(r["reward"])), choice
    assert set(REWARD_CHOICES) == {ALL, "reward > 0", "reward = 0", "reward < 0", "no reward"}


def test_export_exports_what_the_filters_keep(ctx, run_rows, run_file):
    sess = _load(ctx, run_file)
    st = max(r["step"] for r in run_rows)
    want = sorted(r["id"] for r in run_rows if r["step"] == st and r["reward"] > 0)
    assert want
    shown = _kept(sess, step=str(st), reward="reward > 0")
    for df in (shown, None):  # the table's rows, or none given: what the session's table lists now
        path = tf.export_filtered(sess, df, "jsonl")
        got = [json.loads(line)["id"] for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        assert sorted(got) == want


def test_the_tab_wires_the_filters_for_an_upload_and_the_api(tmp_path, monkeypatch):
    """In public mode without a trace set (no set controls), the step, group and reward filters are
    on the tab and list the upload again; /trace_files_filter takes them after the three others."""
    import ui

    demo = ui.build_app(AppContext(trust=TrustPolicy(mode=Mode.PUBLIC)))
    by_elem = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    step, group, reward, table = by_elem["tf-step"], by_elem["tf-group"], by_elem["tf-reward"], by_elem["tf-table"]
    assert "tf-page" not in by_elem
    for comp, event in ((step, "input"), (group, "submit"), (group, "blur"), (reward, "input")):
        fns = [f for f in demo.fns.values() if (comp._id, event) in [(t[0], t[1]) for t in f.targets]]
        assert any(step in f.inputs and group in f.inputs and reward in f.inputs and table in f.outputs for f in fns), (comp.elem_id, event)
    (api,) = [f for f in demo.fns.values() if f.api_name == "trace_files_filter"]
    assert [getattr(c, "elem_id", None) for c in api.inputs[1:]] == ["tf-reason", "tf-source", "tf-search", "tf-step", "tf-group", "tf-reward"]


def test_a_group_id_is_data(ctx, tmp_path):
    """A group id from the file is only ever compared and shown escaped: a markup id filters like
    any other, and the group view's note (and its link, which the page writes into the address)
    carries it escaped."""
    import html

    from backend.trace import load_traces, write_jsonl
    from ui import grpo_groups as gv

    hostile = '<img src=x onerror="alert(1)">&amp;'
    traces = load_traces(str(ROOT / "sample_traces" / "01_weather.jsonl")).traces
    assert traces
    for i, t in enumerate(traces):
        t.metadata["group"] = hostile
        t.metadata["score"] = float(i)
    path = tmp_path / "hostile.jsonl"
    write_jsonl(traces, str(path))
    sess = _load(ctx, path)
    assert len(_kept(sess, group=hostile)) == len(traces)
    assert _kept(sess, group=html.escape(hostile)).empty
    note = gv.view(None, sess, tf.audit_source, gv.ALL, gv.ALL, hostile, None, None)["note"]
    assert hostile not in note and html.escape(hostile) in note and "<img" not in note
