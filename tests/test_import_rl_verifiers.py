"""verifiers episodes and prime-rl token exports.

The fixtures (tests/fixtures_gen/gen_verifiers.py) were written by verifiers 0.4.0 itself: its
message graph and renderer client (``TrainClient``) built the traces against a scripted engine,
and its trace store (``write_episode``) and ``Episode.to_record()`` wrote them. The prime-rl token
exports are written as prime-rl's ``token_export.py`` writes them (built from prime-rl's source:
prime-rl needs a GPU stack), from verifiers' own training samples of the same episodes.

Every expected id, mask bit, logprob, reward, advantage and step is read from the files with
``json`` here, never taken from the importer's output."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from backend.checks.logprobs import compare, position_logprobs
from backend.importers import detect, detect_why, import_file
from backend.importers.rollout_fields import run_path_fields
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import", "verifiers")
STORE = os.path.join(DATA, "traces.jsonl")
RUN = os.path.join(DATA, "run")
ROLLOUTS = sorted(glob.glob(os.path.join(RUN, "rollouts", "step_*", "train", "all", "traces.jsonl")))
EXPORTS = sorted(glob.glob(os.path.join(RUN, "token_exports", "step_*", "rank_*.jsonl")))

WEATHER_Q = "What is the weather in Zürich and in 東京?"
NOTE_PATH = 'notes/a "quoted" \\ path\n.txt'
NOTE_TAGS = [{"name": "trip", "weight": 2}, {"name": "東京", "weight": 1}]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def write_lines(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")


def branch(trace_rec):
    """The raw nodes of a linear trace's one branch, checked to be one root-to-leaf path."""
    nodes = trace_rec["nodes"]
    assert [n.get("parent") for n in nodes] == [None, *range(len(nodes) - 1)]
    return nodes


def gen_steps(t):
    return [s for s in t.steps if s.state == "generating"]


def import_ok(path, qwen3):
    res = import_file(path, "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    return res


# ---- the files -------------------------------------------------------------------------------------


def test_files_are_as_verifiers_and_prime_rl_write_them():
    eps = lines(STORE)
    assert len(eps) == 7
    for e in eps:
        assert set(e) >= {"id", "env", "task", "group", "run", "traces"}
        (t,) = e["traces"]
        assert t["verifiers"]["version"] == "0.4.0"
        for n in t["nodes"]:
            assert len(n["mask"]) == len(n["token_ids"]) and len(n.get("logprobs", [])) == sum(n["mask"])
    assert [os.path.relpath(p, RUN) for p in ROLLOUTS] == ["rollouts/step_3/train/all/traces.jsonl", "rollouts/step_4/train/all/traces.jsonl"]
    assert [os.path.relpath(p, RUN) for p in EXPORTS] == ["token_exports/step_3/rank_0.jsonl", "token_exports/step_3/rank_1.jsonl",
                                                          "token_exports/step_4/rank_0.jsonl"]
    for p in EXPORTS:
        for r in lines(p):
            n = len(r["token_ids"])
            assert r["schema_version"] == 1
            assert all(len(v) == n for v in r.values() if isinstance(v, list))


def test_detection():
    assert detect(STORE) == "verifiers"
    for p in ROLLOUTS:
        assert detect(p) == "verifiers"
    for p in EXPORTS:
        assert detect(p) == "prime-rl"
    fmt, why, others = detect_why(lines(STORE)[0])
    assert (fmt, others) == ("verifiers", []) and "episode" in why
    fmt, why, others = detect_why(lines(EXPORTS[0])[0])
    assert (fmt, others) == ("prime-rl", []) and "token export" in why
    for p in glob.glob(os.path.join(ROOT, "tests", "data", "import", "**", "*.*"), recursive=True):
        if os.path.isfile(p) and not p.startswith(DATA) and p.endswith((".json", ".jsonl", ".parquet")):
            assert detect(p) not in ("verifiers", "prime-rl"), p


# ---- verifiers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [STORE, *ROLLOUTS], ids=lambda p: os.path.relpath(p, DATA))
def test_verifiers_ids_masks_logprobs_rewards_as_written(path, qwen3):
    eps = lines(path)
    res = import_ok(path, qwen3)
    assert res.formats == {"verifiers": len(eps)}
    for e, t in zip(eps, res.traces):
        (tr,) = e["traces"]
        nodes = branch(tr)
        ids = [x for n in nodes for x in n["token_ids"]]
        mask = [m for n in nodes for m in n["mask"]]
        p = mask.index(True)
        assert t.id == tr["id"]
        assert t.prompt_ids == ids[:p] and t.response_ids == ids[p:]
        assert t.response_mask == [int(m) for m in mask[p:]]
        assert t.metadata["ids"] == "given" and t.metadata["source"] == "verifiers"
        sampled = [n for n in nodes if any(n["mask"])]
        steps = gen_steps(t)
        assert len(steps) == len(sampled)
        for s, n in zip(steps, sampled):
            assert t.input_ids[s.start : s.end] == [x for x, m in zip(n["token_ids"], n["mask"]) if m]
            assert s.logprobs == n["logprobs"]
            assert s.info.trainer_logprobs == n["reference_logprobs"]
            assert s.info.model_extra["advantages"] == n["advantages"]
        assert t.scorer.kind == "verifiers reference_logprobs"
        md = t.metadata
        assert md["rewards"] == {k: r["score"] for k, r in tr["rewards"].items()}
        assert md["score"] == sum(r["score"] * r["weight"] for r in tr["rewards"].values())
        assert md["group"] == e["group"]["id"]
        assert md["training_step"] == e["run"]["work"]["step"]
        assert md["advantage"] == sampled[0]["advantages"][0]
        assert md["extra"]["stop_condition"] == tr["stop_condition"] and md["extra"]["metrics"] == tr["metrics"]
        assert md["extra"]["task"] == tr["task"] and md["extra"]["calls"] == tr["calls"]
        assert md["extra"]["episode"] == {k: v for k, v in e.items() if k != "traces"}
        assert md["provenance"] == {"format": "verifiers", "library": "verifiers", "version": "0.4.0", "trace_id": tr["id"],
                                    "episode_id": e["id"], **({"commit": tr["verifiers"]["commit"]} if "commit" in tr["verifiers"] else {})}
        # the lens compares the two without rescoring: one delta per sampled token
        assert len(compare(t).tokens) == sum(mask)


def _by_user(res):
    return {next(m["content"] for m in t.messages if m["role"] == "user"): t for t in res.traces}


def test_verifiers_messages_tool_rounds(qwen3):
    res = import_ok(STORE, qwen3)
    eps = lines(STORE)
    for e, t in zip(eps, res.traces):  # the messages are the nodes' own
        nodes = e["traces"][0]["nodes"]
        assert [m["role"] for m in t.messages] == [n["message"]["role"] for n in nodes]
        for m, n in zip(t.messages, nodes):
            assert m["content"] == (n["message"].get("content") or "")
            raw_calls = n["message"].get("tool_calls") or []
            assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])] == [
                (c["id"], c["name"], json.loads(c["arguments"])) for c in raw_calls]
            if m["role"] == "tool":
                assert m["tool_call_id"] == n["message"]["tool_call_id"]
    by = _by_user(res)
    w = by[WEATHER_Q]  # parallel calls, answered in order, one processing step for both results
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in w.messages[2]["tool_calls"]] == [
        ("get_weather", {"city": "Zürich"}), ("get_weather", {"city": "東京"})]
    tool_steps = [s for s in w.steps if s.state == "processing_tools"]
    assert len(tool_steps) == 1 and [r.content for r in tool_steps[0].tool_results] == ["Zürich: 18°C, light rain", "東京: 24°C, sunny"]
    note = by["Save a note about the trip, then read it back."]  # two rounds
    assert [s.state for s in note.steps] == ["pending", "generating", "processing_tools", "generating", "processing_tools", "generating", "terminated"]
    assert note.steps[1].tool_calls[0].arguments == {"path": NOTE_PATH, "tags": NOTE_TAGS}
    city = by["Is it raining in Zürich?"]  # one call, with text before it
    assert city.messages[2]["content"] == "Let me check." and len(city.messages[2]["tool_calls"]) == 1
    assert city.termination_reason == "no_tool_calls"
    assert w.tools and [x["function"]["name"] for x in w.tools] == ["get_weather", "save_note", "read_note"]


def test_verifiers_group_with_different_rewards_and_a_truncated_sample(qwen3):
    eps = lines(STORE)
    res = import_ok(STORE, qwen3)
    group = [(e, t) for e, t in zip(eps, res.traces) if e["group"]["id"] == "g-math"]
    assert len(group) == 3
    assert [t.metadata["score"] for _, t in group] == [e["traces"][0]["rewards"]["correct"]["score"] for e, _ in group] == [1.0, 0.0, 0.0]
    assert [t.metadata["advantage"] for _, t in group] == [e["traces"][0]["nodes"][2]["advantages"][0] for e, _ in group]
    assert len({t.metadata["advantage"] for _, t in group}) == 2
    e, cut = group[2]
    assert e["traces"][0]["stop_condition"] == "max_output_tokens" and e["traces"][0]["calls"][-1]["finish_reason"] == "length"
    assert cut.termination_reason == "response_length"
    assert gen_steps(cut)[-1].finish_reason == "length"
    assert cut.response_ids[-1] != qwen3.tokenizer.convert_tokens_to_ids("<|im_end|>")  # cut, no end of turn
    assert [t.termination_reason for _, t in group[:2]] == ["no_tool_calls", "no_tool_calls"]


# ---- prime-rl token exports --------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: os.path.relpath(p, RUN))
def test_prime_rl_exports_as_written(path, qwen3):
    recs = lines(path)
    res = import_ok(path, qwen3)
    assert res.formats == {"prime-rl": len(recs)}
    for r, t in zip(recs, res.traces):
        p = r["loss_mask"].index(True)
        assert t.prompt_ids + t.response_ids == r["token_ids"] and len(t.prompt_ids) == p
        assert t.response_mask == [int(m) for m in r["loss_mask"][p:]]
        rollout, trainer = position_logprobs(t)
        assert trainer == r["trainer_logprobs"]  # every position, prompt included
        assert [x for x, m in zip(rollout, r["loss_mask"]) if m] == [x for x, m in zip(r["inference_logprobs"], r["loss_mask"]) if m]
        assert all(x is None for x, m in zip(rollout, [False] * p + r["loss_mask"][p:]) if not m)
        assert t.scorer.kind == "prime-rl trainer_logprobs"
        md = t.metadata
        assert (md["training_step"], md["rank"]) == (r["step"], r["rank"])
        assert md["advantage"] == next(a for a, m in zip(r["advantages"], r["loss_mask"]) if m)
        cols = md["extra"]["columns"]
        for k in ("mismatch_kl", "is_masked", "importance_ratio", "entropy", "prob_delta", "advantages"):
            assert cols[k] == r[k]
        on = [x for x, m in zip(r["mismatch_kl"], r["loss_mask"]) if m]
        assert md["extra"]["mismatch_kl"]["mean"] == pytest.approx(sum(on) / len(on), rel=1e-12)
        assert md["extra"]["null_columns"] == ["ce_weights", "ref_kl_weights", "rl_weights"]
        assert md["extra"]["env_name"] == r["env_name"] and md["provenance"]["library"] == "prime-rl"
        assert t.id == f"prime-rl-s{r['step']}-r{r['rank']}-{r['export_sequence_idx']}"
        # the lens: one delta per loss-mask token, from the file's two columns
        deltas = compare(t).tokens
        assert len(deltas) == sum(r["loss_mask"])
        assert [d.trainer - d.rollout for d in deltas] == pytest.approx(
            [a - b for a, b, m in zip(r["trainer_logprobs"], r["inference_logprobs"], r["loss_mask"]) if m])


def test_prime_rl_sequences_are_verifiers_training_samples():
    """Each exported sequence is a verifiers branch's ids and sampled mask (what prime-rl trains on)."""
    samples = {}
    for p in ROLLOUTS:
        for e in lines(p):
            nodes = branch(e["traces"][0])
            samples.setdefault(e["run"]["work"]["step"], []).append(
                ([x for n in nodes for x in n["token_ids"]], [m for n in nodes for m in n["mask"]]))
    for p in EXPORTS:
        for r in lines(p):
            assert (r["token_ids"], r["loss_mask"]) in samples[r["step"]]


# ---- run folders -------------------------------------------------------------------------------------


def test_run_path_fields():
    assert run_path_fields("/x/run/token_exports/step_12/rank_3.jsonl") == {"rank": 3, "training_step": 12}
    assert run_path_fields("/x/run/rollouts/step_5/eval/effective/traces.jsonl") == {"training_step": 5, "kind": "eval", "subset": "effective"}
    assert run_path_fields("/x/step_a/rank_x.jsonl") == {} and run_path_fields(None) == {}


def test_step_and_rank_from_the_path_when_the_record_lacks_them(tmp_path, qwen3):
    rec = {k: v for k, v in lines(EXPORTS[0])[0].items() if k not in ("step", "rank")}
    exp = tmp_path / "run" / "token_exports" / "step_7" / "rank_2.jsonl"
    write_lines(str(exp), [rec])
    ep = {k: v for k, v in lines(STORE)[0].items() if k != "run"}
    roll = tmp_path / "run" / "rollouts" / "step_5" / "eval" / "all" / "traces.jsonl"
    write_lines(str(roll), [ep])
    t = import_ok(str(exp), qwen3).traces[0]
    assert (t.metadata["training_step"], t.metadata["rank"]) == (7, 2)
    v = import_ok(str(roll), qwen3).traces[0]
    assert v.metadata["training_step"] == 5 and v.metadata["extra"]["kind"] == "eval"

    from backend.trace.catalog import TraceSet

    ts = TraceSet.open_set(str(tmp_path / "run"), final=True, cache=False, import_bundle=lambda: qwen3)
    assert not ts.problem_rows()
    assert sorted(ts.df["training_step"].tolist()) == [5, 7]
    opened = {ts.open(i).metadata["source"]: ts.open(i) for i in range(len(ts))}
    assert (opened["prime-rl"].metadata["training_step"], opened["prime-rl"].metadata["rank"]) == (7, 2)
    assert opened["verifiers"].metadata["training_step"] == 5


def test_a_run_folder_is_a_trace_set(qwen3):
    from backend.trace.catalog import TraceSet

    ts = TraceSet.open_set(RUN, final=True, cache=False, import_bundle=lambda: qwen3)
    assert not ts.problem_rows()
    want = [(e["traces"][0]["id"], "verifiers", e["run"]["work"]["step"]) for p in ROLLOUTS for e in lines(p)]
    want += [(f"prime-rl-s{r['step']}-r{r['rank']}-{r['export_sequence_idx']}", "prime-rl", r["step"]) for p in EXPORTS for r in lines(p)]
    assert sorted(zip(ts.df["id"], ts.df["source"], ts.df["training_step"])) == sorted(want)
    row = ts.row_of(want[-1][0])
    t = ts.open(row)
    assert t.id == want[-1][0] and t.metadata["rank"] == lines(EXPORTS[-1])[-1]["rank"]


# ---- what is refused ---------------------------------------------------------------------------------


def test_bad_records_are_reported(tmp_path, qwen3):
    good_exp = lines(EXPORTS[0])[0]
    n = len(good_exp["token_ids"])
    good_ep = lines(STORE)[0]

    def ep_with(fn):
        e = json.loads(json.dumps(good_ep))
        fn(e["traces"][0]["nodes"])
        return e

    def node2(key, value):
        return ep_with(lambda nodes: nodes[2].__setitem__(key, value))

    rows = [
        json.dumps(good_exp)[: len(json.dumps(good_exp)) // 2],                              # 1 truncated line
        {**good_exp, "loss_mask": good_exp["loss_mask"][:-3]},                               # 2 mask shorter than ids
        {**good_exp, "inference_logprobs": good_exp["inference_logprobs"][:-1]},             # 3 logprobs one short
        {**good_exp, "token_ids": [*good_exp["token_ids"][:-1], 10**6]},                     # 4 id outside the vocab
        {**good_exp, "loss_mask": [False] * n},                                              # 5 nothing trained
        {**good_exp, "trainer_logprobs": ["x"] * n},                                         # 6 not numbers
        node2("mask", good_ep["traces"][0]["nodes"][2]["mask"][:-1]),                        # 7 node mask short
        node2("logprobs", good_ep["traces"][0]["nodes"][2]["logprobs"][:-2]),                # 8 node logprobs short
        ep_with(lambda nodes: nodes[2]["message"].__setitem__("content", "Something else.")),  # 9 text vs ids
        ep_with(lambda nodes: nodes[3].__setitem__("parent", 7)),                            # 10 bad parent
        {**good_ep, "traces": [], "errors": [{"type": "SandboxError", "message": "box died"}]},  # 11 no trace
        node2("reference_logprobs", [0.1]),                                                  # 12 compact column length
        good_exp,                                                                            # 13 fine
    ]
    p = tmp_path / "mixed.jsonl"
    write_lines(str(p), rows)
    res = import_file(str(p), "auto", bundle=qwen3)
    assert [t.metadata["import"]["line"] for t in res.traces] == [13]
    got = {x.line: x.reason for x in res.problems}
    assert sorted(got) == list(range(1, 13))
    assert "JSON" in got[1] or "json" in got[1]
    assert got[2] == f"loss_mask has {n - 3} values for {n} token ids"
    assert got[3] == f"inference_logprobs has {n - 1} values for {n} tokens"
    assert "1000000" in got[4] and "outside the vocabulary" in got[4]
    assert got[5] == "loss_mask has no trained token (prime-rl exports only sequences with one)"
    assert got[6] == "trainer_logprobs must be a list of numbers, found a string"
    m = len(good_ep["traces"][0]["nodes"][2]["mask"])
    assert got[7] == f"traces[0].nodes[2].mask has {m - 1} values for {m} token ids"
    c = sum(good_ep["traces"][0]["nodes"][2]["mask"])
    assert got[8] == f"traces[0].nodes[2].logprobs has {c - 2} values for {c} tokens"
    assert got[9].startswith("traces[0].nodes[2]: the assistant text 'Something else.' is not what its token ids decode to")
    assert got[10] == "traces[0].nodes[3].parent must name an earlier node, got 7"
    assert got[11] == "verifiers episode with no trace (errors: box died)"
    assert got[12] == f"traces[0].nodes[2].reference_logprobs has 1 values for {c} tokens"


def test_a_trace_without_token_ids_is_rendered_and_branches_are_samples(tmp_path, qwen3):
    e = lines(STORE)[0]
    plain = json.loads(json.dumps(e))
    for n in plain["traces"][0]["nodes"]:
        for k in ("token_ids", "mask", "logprobs", "advantages", "reference_logprobs", "is_content"):
            n.pop(k, None)
    forked = json.loads(json.dumps(e))
    nodes = forked["traces"][0]["nodes"]
    nodes.append({**nodes[2], "parent": 1})  # a second leaf after the user turn: two branches
    p = tmp_path / "t.jsonl"
    write_lines(str(p), [plain, forked])
    res = import_ok(str(p), qwen3)
    r, b0, b1 = res.traces
    assert r.metadata["ids"] == "rendered" and [m["role"] for m in r.messages] == [n["message"]["role"] for n in e["traces"][0]["nodes"]]
    tid = e["traces"][0]["id"]
    assert (b0.id, b1.id) == (f"{tid}-b0", f"{tid}-b1")
    assert b0.metadata["extra"]["branch"] == {"index": 0, "of": 2}
    assert b0.input_ids == [x for n in nodes[:5] for x in n["token_ids"]]
    assert b1.input_ids == [x for n in (nodes[0], nodes[1], nodes[5]) for x in n["token_ids"]]


def test_copying_a_run_keeps_nothing_of_the_path_but_step_and_rank(tmp_path, qwen3):
    """The same export under another folder name has no step/rank from the path; the record's own stand."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    shutil.copy(EXPORTS[1], d / "dump.jsonl")
    recs = lines(EXPORTS[1])
    res = import_ok(str(d / "dump.jsonl"), qwen3)
    assert [(t.metadata["training_step"], t.metadata["rank"]) for t in res.traces] == [(r["step"], r["rank"]) for r in recs]


def test_trainer_logprobs_win_over_reference_ones(tmp_path, qwen3):
    e = lines(STORE)[1]
    nodes = e["traces"][0]["nodes"]
    for n in nodes:
        if n.get("logprobs"):
            n["trainer_logprobs"] = [x - 0.5 for x in n["logprobs"]]
    p = tmp_path / "t.jsonl"
    write_lines(str(p), [e])
    t = import_ok(str(p), qwen3).traces[0]
    assert t.scorer.kind == "verifiers trainer_logprobs"
    sampled = [n for n in nodes if n.get("logprobs")]
    for s, n in zip(gen_steps(t), sampled):
        assert s.info.trainer_logprobs == n["trainer_logprobs"]
        assert s.info.model_extra["reference_logprobs"] == n["reference_logprobs"]


# ---- a run folder as a trace set: the light summary, following the run ------------------------------


@pytest.mark.parametrize("path", [STORE, *ROLLOUTS, *EXPORTS], ids=lambda p: os.path.relpath(p, DATA))
def test_light_summary_is_the_converted_traces_summary(path, qwen3):
    """A set summarises these rows without the tokenizer (backend.importers.index.dump_summary);
    each row's ids count, score, step, rank and group are the converted trace's, and the file's."""
    from backend.importers.index import dump_summary
    from backend.trace.index import summary_of_trace

    traces = {t.id: t for t in import_ok(path, qwen3).traces}
    with open(path, "rb") as f:
        raw = [x.rstrip(b"\n") for x in f if x.strip()]
    rows = []
    for k, (line, rec) in enumerate(zip(raw, lines(path))):
        got = dump_summary(line, path, k + 1)
        got = got if isinstance(got, list) else [got]
        assert len(got) == (len(rec["traces"]) if "traces" in rec else 1)
        rows += [(r, rec) for r in got]
    assert sorted(r["id"] for r, _ in rows) == sorted(traces)
    for r, rec in rows:
        t = traces[r["id"]]
        full = summary_of_trace(t)
        for c in ("source", "tokens", "prompt_tokens", "response_tokens", "score", "training_step"):
            assert r[c] == full[c], (r["id"], c)
        assert (r["group"], r["rank"]) == (t.metadata.get("group"), t.metadata.get("rank"))
        if "token_ids" in rec:  # prime-rl: the record's own fields
            assert (r["tokens"], r["prompt_tokens"]) == (len(rec["token_ids"]), rec["loss_mask"].index(True))
            assert (r["training_step"], r["rank"], r["group"], r["score"]) == (rec["step"], rec["rank"], None, None)
            assert r["turns"] is None  # the messages are decoded from the ids: unknown until opened
        else:
            nodes = branch(rec["traces"][0])
            mask = [m for n in nodes for m in n["mask"]]
            rw = rec["traces"][0]["rewards"]
            assert (r["tokens"], r["prompt_tokens"]) == (len(mask), mask.index(True))
            assert r["score"] == pytest.approx(sum(x["score"] * x.get("weight", 1.0) for x in rw.values()))
            assert (r["training_step"], r["group"]) == (rec["run"]["work"]["step"], rec["group"]["id"])
            assert (r["turns"], r["messages"], r["termination_reason"], r["preview"]) == (
                full["turns"], full["messages"], full["termination_reason"], full["preview"])


def test_a_run_is_indexed_without_the_tokenizer_and_opened_with_it(qwen3):
    from backend.trace.catalog import TraceSet

    asked = []
    ts = TraceSet.open_set(RUN, final=True, cache=False, import_bundle=lambda: asked.append(1) or qwen3)
    assert asked == [] and not ts.problem_rows()
    n_exports = sum(len(lines(p)) for p in EXPORTS)
    assert len(ts) == n_exports + sum(len(lines(p)) for p in ROLLOUTS)
    assert int(ts.df["tokens"].notna().sum()) == len(ts)  # ids counted for every row
    rec = lines(EXPORTS[1])[-1]
    t = ts.open(f"prime-rl-s{rec['step']}-r{rec['rank']}-{rec['export_sequence_idx']}")
    assert asked == [1] and t.prompt_ids + t.response_ids == rec["token_ids"]


def test_a_bad_row_gets_the_importers_reason_in_a_set(tmp_path):
    from backend.importers.index import dump_summary
    from backend.trace.catalog import TraceSet

    rec = lines(EXPORTS[0])[0]
    bad = dict(rec, loss_mask=rec["loss_mask"][:-3])
    p = tmp_path / "run" / "token_exports" / "step_3" / "rank_0.jsonl"
    write_lines(str(p), [rec, bad])
    assert dump_summary(json.dumps(bad).encode(), str(p), 2) is None  # not sure of it: converted in full
    ts = TraceSet.open_set(str(tmp_path / "run"), final=True, cache=False)
    assert len(ts) == 1
    ((_, line, reason),) = ts.problem_rows()
    n = len(rec["token_ids"])
    assert line == 2 and f"loss_mask has {n - 3} values for {n} token ids" in reason


def test_a_followed_run_picks_up_a_new_step(tmp_path, qwen3):
    """A run being written: a new step's rank file and rollouts appear; a line still being
    written is no row until its newline comes."""
    from backend.trace.catalog import TraceSet

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    ts = TraceSet.open_set(str(run), cache=str(tmp_path / "cache"), import_bundle=lambda: qwen3)
    before = len(ts)
    exp = [dict(r, step=5, rank=2) for r in lines(EXPORTS[1])]
    ep = lines(ROLLOUTS[0])[0]
    ep["run"]["work"]["step"] = 5
    write_lines(str(run / "token_exports" / "step_5" / "rank_2.jsonl"), exp[:-1])
    write_lines(str(run / "rollouts" / "step_5" / "train" / "all" / "traces.jsonl"), [ep])
    assert ts.refresh() == len(exp)  # every export line but the one not yet written, and the episode
    last = json.dumps(exp[-1])
    with open(run / "token_exports" / "step_5" / "rank_2.jsonl", "a", encoding="utf-8") as f:
        f.write(last[:100])
    assert ts.refresh() == 0 and not ts.problem_rows()
    with open(run / "token_exports" / "step_5" / "rank_2.jsonl", "a", encoding="utf-8") as f:
        f.write(last[100:] + "\n")
    assert ts.refresh() == 1 and len(ts) == before + len(exp) + 1 and not ts.problem_rows()
    new = ts.df[ts.df["training_step"] == 5]
    want = {f"prime-rl-s5-r2-{r['export_sequence_idx']}" for r in exp} | {ep["traces"][0]["id"]}
    assert set(new["id"]) == want
    t = ts.open(f"prime-rl-s5-r2-{exp[-1]['export_sequence_idx']}")
    assert (t.metadata["training_step"], t.metadata["rank"], t.prompt_ids + t.response_ids) == (5, 2, exp[-1]["token_ids"])
