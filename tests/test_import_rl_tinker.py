"""The tinker-cookbook importer, tested on the files tinker-cookbook 0.5.8 wrote itself
(tests/fixtures_gen/gen_tinker.py: ``rl.train``'s logtree scope around ``rl.rollouts.do_group_rollout``
over ``ProblemEnv`` groups, then ``serialize_rollout_summaries`` + ``TrainingRunStore.write_rollouts``;
the sampler is a scripted ``TokenCompleter``, no Tinker service).

No tinker-cookbook RL file holds token ids or logprobs: the logtree JSON holds the envs'
conversations as text, so the traces are re-rendered. The oracles are the raw logtree read here with
``json`` (the conversations' messages) and the rollout summaries tinker wrote beside it (each
trajectory's reward and its observation / action token counts, which tinker counted on its own
tokens)."""

from __future__ import annotations

import copy
import json
import os

import pytest

from backend.importers import detect, detect_why, import_file
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITER = os.path.join(ROOT, "tests", "data", "import", "tinker", "iteration_000003")
LOGTREE = os.path.join(ITER, "train_logtree.json")
SUMMARIES = os.path.join(ITER, "train_rollout_summaries.jsonl")


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def imported(qwen3):
    return import_file(LOGTREE, bundle=qwen3)


def load(path=LOGTREE):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def summaries():
    with open(SUMMARIES, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def header(section):
    return "".join(c for h in section["children"] if isinstance(h, dict) and h["tag"].startswith("h") for c in h["children"])


def raw_groups(doc):
    """Per Group Rollout section: the (prompt, response) message lists its data nodes hold, in order."""
    out = []
    for sec in doc["root"]["children"]:
        if isinstance(sec, dict) and sec["tag"] == "section" and header(sec) == "Group Rollout":
            convs = []

            def walk(n, title):
                if not isinstance(n, dict):
                    return
                if n["tag"] == "section":
                    title = header(n)
                    if title == "Trajectory Details":
                        return
                if "data" in n:
                    convs.append((title, n["data"]["messages"]))
                for c in n["children"]:
                    walk(c, title)

            walk(sec, "")
            pairs, prompt = [], None
            for title, msgs in convs:
                if title == "Prompt":
                    prompt = msgs
                else:
                    pairs.append((prompt, msgs))
            out.append(pairs)
    return out


def write(tmp_path, doc, name="train_logtree.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc), encoding="utf-8")
    return str(p)


def test_detected_as_tinker_alone():
    fmt, why, others = detect_why(load())
    assert (fmt, others) == ("tinker", []) and "logtree" in why
    assert detect(LOGTREE) == "tinker" and detect(SUMMARIES) == "tinker"
    assert detect_why(summaries()[0])[2] == []


def test_each_logged_response_is_one_rendered_trace_of_its_group(imported):
    groups = raw_groups(load())
    assert [len(g) for g in groups] == [2, 2, 2]
    res = imported
    assert not res.problems and not res.losses and res.formats == {"tinker": 6}
    # the one unparsed tool call tinker logged is kept as written, with a parse error on its turn
    assert len(res.unreadable) == 1 and "#2/1" in res.unreadable[0].reason
    traces = iter(res.traces)
    for g, pairs in enumerate(groups):
        for k, (prompt, response) in enumerate(pairs):
            t = next(traces)
            assert t.id == f"RL Iteration 3 #{g}/{k}"
            assert t.metadata["ids"] == "rendered" and t.metadata["source"] == "tinker"
            assert t.metadata["group"] == f"RL Iteration 3 #{g}" and t.metadata["training_step"] == 3
            assert "sample" not in t.metadata  # the log order is not the trajectory index
            assert t.metadata["extra"]["logged"] == k
            assert t.metadata["provenance"]["library"] == "tinker-cookbook"
            assert [m["role"] for m in t.messages] == [m["role"] for m in prompt + response]
            assert [m["content"] for m in t.messages[: len(prompt)]] == [m["content"] for m in prompt]
            last = response[-1]
            if isinstance(last["content"], str):
                assert t.messages[-1]["content"] == last["content"]
            for c in last.get("tool_calls") or []:
                got = t.messages[-1]["tool_calls"][0]["function"]
                assert got["name"] == c["function"]["name"] and got["arguments"] == json.loads(c["function"]["arguments"])
            # the mask: 1 exactly on the assistant turn, which decodes to its text
            gen = [s for s in t.steps if s.mask == 1]
            assert len(gen) == 1 and sum(t.response_mask) == gen[0].end - gen[0].start


def test_rewards_and_lengths_agree_with_tinkers_rollout_summaries(imported):
    """Per group, the scores are the trajectories' total rewards tinker summarised, and (for the
    groups rendered by tinker's qwen3_instruct renderer, the app's qwen3 template) the re-rendered
    prompt and response are tinker's ob_len and ac_len tokens — the response one more: the template
    writes a newline after <|im_end|>, where sampling stopped."""
    by_group: dict[int, list[dict]] = {}
    for s in summaries():
        by_group.setdefault(s["group_idx"], []).append(s)
    for g, rows in by_group.items():
        traces = [t for t in imported.traces if t.metadata["group"] == f"RL Iteration 3 #{g}"]
        assert sorted(t.metadata["score"] for t in traces) == pytest.approx(sorted(r["total_reward"] for r in rows))
        for t in traces:
            assert t.metadata["rewards"]["reward"] == t.metadata["score"]
            assert set(t.metadata["rewards"]) == {"reward", "format_valid", "correct"}
        if g < 2:
            got = sorted((len(t.prompt_ids), len(t.response_ids) - 1) for t in traces)
            assert got == sorted((r["steps"][0]["ob_len"], r["steps"][0]["ac_len"]) for r in rows)


def test_trajectory_details_are_kept_by_index(imported):
    rows = summaries()
    for t in imported.traces:
        g = int(t.metadata["group"].rsplit("#", 1)[1])
        trajs = t.metadata["extra"]["trajectories"]
        mine = [r for r in rows if r["group_idx"] == g]
        assert [x["index"] for x in trajs] == [r["traj_idx"] for r in mine]
        for x, r in zip(trajs, mine):
            (turn,) = x["turns"]
            stats = turn["Step stats"]
            assert (int(stats["ob_len"]), int(stats["ac_len"])) == (r["steps"][0]["ob_len"], r["steps"][0]["ac_len"])
            assert float(stats["step_reward"]) == pytest.approx(r["steps"][0]["reward"], abs=5e-4)
            assert {k: float(v) for k, v in turn["Metrics emitted by env.step"].items()} == r["steps"][0]["metrics"]
            assert float(x["totals"]["total_return"]) == pytest.approx(r["total_reward"], abs=5e-4)
        reward_table = t.metadata["extra"]["reward_table"]
        assert set(reward_table) == {"reference_answer", "format_valid", "correct", "format_coef", "reward"}


def test_thinking_and_unparsed_tool_call(imported):
    (_, thought), (_, unparsed) = raw_groups(load())[2]
    t0, t1 = [t for t in imported.traces if t.metadata["group"] == "RL Iteration 3 #2"]
    parts = {p["type"]: p for p in thought[0]["content"]}
    assert t0.messages[-1]["reasoning_content"] == parts["thinking"]["thinking"]
    assert t0.messages[-1]["content"] == parts["text"]["text"]
    raw = unparsed[0]["unparsed_tool_calls"][0]["raw_text"]
    assert t1.messages[-1]["content"] == raw and "tool_calls" not in t1.messages[-1]
    (gen,) = [s for s in t1.steps if s.mask == 1]
    assert gen.parse_errors and gen.parse_errors[0].raw.strip() == raw.strip()


def test_rollout_summaries_are_refused_with_the_file_to_import(qwen3):
    res = import_file(SUMMARIES, bundle=qwen3)
    assert not res.traces and len(res.problems) == len(summaries()) == 6
    assert all("no text and no token ids" in p.reason and "train_logtree.json" in p.reason for p in res.problems)


def _response_data(doc, g=0):
    sec = [s for s in doc["root"]["children"] if isinstance(s, dict) and s["tag"] == "section"][g]
    body = sec["children"][1]
    return body


def _set_messages(doc, value):
    body = _response_data(doc)
    resp = [s for s in body["children"] if header(s) == "Policy Response"][0]
    resp["children"][1]["children"][0]["data"]["messages"] = value


def _drop_turn(doc):
    body = _response_data(doc)
    details = [s for s in body["children"] if header(s) == "Trajectory Details"][0]
    episode = details["children"][1]["children"][0]["children"][1]["children"][0]["children"][1]
    episode["children"] = [c for c in episode["children"] if not (isinstance(c, dict) and c["tag"] == "section")]


@pytest.mark.parametrize("damage, why", [
    (lambda d: _set_messages(d, {"role": "assistant"}), "conversation's messages are an object, not a list"),
    (lambda d: _set_messages(d, [{"role": "narrator", "content": "hi"}]), "has role 'narrator'"),
    (lambda d: _set_messages(d, ["hi"]), "is a string, not a message object"),
    (lambda d: _set_messages(d, [{"role": "assistant", "content": [7]}]), "is a number, not a content part"),
    (_drop_turn, "says num_turns 1 but logs 0 turn(s)"),
    (lambda d: d["root"].__setitem__("children", d["root"]["children"][:3]), "has no Group Rollout section"),
])
def test_damaged_logtrees_are_reported(qwen3, tmp_path, damage, why):
    doc = copy.deepcopy(load())
    damage(doc)
    res = import_file(write(tmp_path, doc), "tinker", bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_image_part_is_a_loss_not_silent(qwen3, tmp_path):
    doc = copy.deepcopy(load())
    _set_messages(doc, [{"role": "assistant", "content": [{"type": "image", "image": "data:..."}, {"type": "text", "text": "A cat."}]}])
    res = import_file(write(tmp_path, doc), bundle=qwen3)
    assert len(res.traces) == 6 and res.traces[0].messages[-1]["content"] == "A cat."
    assert len(res.losses) == 1 and "'image' not carried over" in res.losses[0].reason


def test_truncated_logtree_is_reported(qwen3, tmp_path):
    text = open(LOGTREE, encoding="utf-8").read()
    p = tmp_path / "train_logtree.json"
    kept = text[: len(text) // 2]
    p.write_text(kept, encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    # one problem where the file ends (not one "invalid JSON" per line of the pretty-printed tree)
    line, col = kept.count("\n") + 1, len(kept) - kept.rfind("\n")
    assert not res.traces and [(x.line, x.reason) for x in res.problems] == [
        (line, f"the JSON document ends early at line {line}, column {col}: truncated?")]


def test_not_tinker_is_not_read_as_tinker(qwen3, tmp_path):
    """A JSON object with a title and a root that is not a node tree, and an object with
    none of the summary's keys, are not tinker's; forcing the format says why."""
    for rec in ({"title": "x", "started_at": "now", "root": "<body>"}, {"group_idx": 0, "traj_idx": 1}):
        assert detect_why(rec)[0] != "tinker"
        res = import_file(write(tmp_path, rec, "x.json"), "tinker", bundle=qwen3)
        assert not res.traces and "not a tinker-cookbook logtree" in res.problems[0].reason


def _nest(doc, depth):
    deep = {"tag": "div", "attrs": {}, "children": []}
    cur = deep
    for _ in range(depth):
        nxt = {"tag": "div", "attrs": {}, "children": []}
        cur["children"].append(nxt)
        cur = nxt
    cur["children"].append("deep text")
    _response_data(doc)["children"].append(deep)
    return doc


def test_deep_trees_are_walked_or_refused_whole(qwen3, tmp_path):
    """Nodes nested 400 deep (800 JSON levels) are read; far deeper, the reader
    refuses the document with the reason, before any walk."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # for json.dumps of the test inputs only
    try:
        ok, deep = write(tmp_path, _nest(load(), 400), "ok.json"), write(tmp_path, _nest(load(), 5000), "deep.json")
    finally:
        sys.setrecursionlimit(old)
    res = import_file(ok, bundle=qwen3)
    assert len(res.traces) == 6 and not res.problems
    assert {"section": "", "text": "deep text"} in res.traces[1].metadata["extra"]["logs"]
    res = import_file(deep, bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and "nested too deeply" in res.problems[0].reason


def test_an_upload_of_the_logtree_is_imported(qwen3):
    """What the app does with an uploaded file (load_any): refused as a trace file with the import
    command, imported when foreign files are imported."""
    from backend.importers import load_any

    plain = load_any(LOGTREE)
    assert not plain.traces and "--from tinker" in plain.problems[0].reason
    res = load_any(LOGTREE, import_foreign=True, bundle=qwen3)
    assert [t.id for t in res.traces] == [t.id for t in import_file(LOGTREE, bundle=qwen3).traces]


# ---- capture/sample.jsonl: each sampling call's ids and logprobs ------------------------------------

CAPTURE = os.path.join(ROOT, "tests", "data", "import", "tinker", "capture", "sample.jsonl")


def capture_records():
    with open(CAPTURE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_capture_keeps_each_calls_ids_and_logprobs(qwen3):
    recs = capture_records()
    assert detect(CAPTURE) == "tinker" and detect_why(recs[0])[2] == []
    res = import_file(CAPTURE, bundle=qwen3)
    assert not res.problems and not res.losses and len(res.traces) == len(recs) == 6
    for t, r in zip(res.traces, recs):
        (s,) = r["samples"]
        assert t.id == f"toy-rl:{r['seq_id']}" and t.metadata["ids"] == "given"
        assert t.prompt_ids == r["prompt_tokens"] and t.response_ids == s["tokens"] and t.response_mask == [1] * len(s["tokens"])
        (gen,) = [x for x in t.steps if x.mask == 1]
        assert gen.logprobs == s["logprobs"]
        assert t.metadata["training_step"] == r["scope"]["iteration"] == 3
        assert t.metadata["group"] == f"toy-rl/3/{r['scope']['group_idx']}" and "sample" not in t.metadata
        assert t.metadata["extra"]["scope"] == r["scope"] and t.metadata["extra"]["stop_reason"] == s["stop_reason"]


def test_capture_lengths_are_tinkers_ob_and_ac_lengths():
    """The captured calls of a group are its trajectories' turns: tinker's rollout summaries count
    the same observation and action tokens."""
    by_group: dict[int, list] = {}
    for r in capture_records():
        by_group.setdefault(r["scope"]["group_idx"], []).append((len(r["prompt_tokens"]), len(r["samples"][0]["tokens"])))
    want: dict[int, list] = {}
    for s in summaries():
        want.setdefault(s["group_idx"], []).append((s["steps"][0]["ob_len"], s["steps"][0]["ac_len"]))
    assert {g: sorted(v) for g, v in by_group.items()} == {g: sorted(v) for g, v in want.items()}


def test_capture_and_logtree_hold_the_same_responses(qwen3, imported):
    """The ids a call captured decode to the response its env logged (the instruct groups' plain text)."""
    got = import_file(CAPTURE, bundle=qwen3).traces
    for cap, logged in zip(got[:4], imported.traces[:4]):
        text = qwen3.tokenizer.decode(cap.response_ids, skip_special_tokens=True)
        last = logged.messages[-1]
        if last.get("tool_calls"):
            assert last["tool_calls"][0]["function"]["name"] in text
        else:
            assert text == last["content"]


def _capture_with(tmp_path, change):
    rec = copy.deepcopy(capture_records()[0])
    change(rec)
    p = tmp_path / "sample.jsonl"
    p.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    return str(p)


@pytest.mark.parametrize("change, why", [
    (lambda r: r["samples"][0]["logprobs"].pop(), "samples[0].logprobs has 21 values for 22 response token ids"),
    (lambda r: r.__setitem__("prompt_length", 35), "prompt_length is 35 but prompt_tokens holds 36 ids"),
    (lambda r: r["samples"][0]["tokens"].__setitem__(3, 10**7), "samples[0].tokens[3] = 10000000 is outside the vocabulary"),
    (lambda r: r.update(status="error", error="RuntimeError('boom')", samples=None), "status is 'error': RuntimeError('boom')"),
    (lambda r: r.pop("prompt_tokens"), "prompt was not captured as token ids"),
    (lambda r: r.__setitem__("num_samples", 2), "num_samples is 2 but the record holds 1 sample(s)"),
    (lambda r: r.update(kind="train_op", op="forward_backward"), "a training call (forward_backward)"),
])
def test_damaged_capture_records_are_reported(qwen3, tmp_path, change, why):
    res = import_file(_capture_with(tmp_path, change), bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_capture_truncated_line_loses_only_its_record(qwen3, tmp_path):
    lines = open(CAPTURE, encoding="utf-8").read().splitlines(keepends=True)
    p = tmp_path / "sample.jsonl"
    p.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2], encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert len(res.traces) == 3 and len(res.problems) == 1 and res.problems[0].line == 4


def test_a_call_of_several_samples_is_a_group(qwen3, tmp_path):
    rec = copy.deepcopy(capture_records()[0])
    rec["scope"] = {"run_id": "r"}
    rec["samples"].append(copy.deepcopy(rec["samples"][0]))
    rec["num_samples"] = 2
    p = tmp_path / "sample.jsonl"
    p.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert [(t.id, t.metadata["group"], t.metadata["sample"]) for t in res.traces] == [("r:1/0", "r:1", 0), ("r:1/1", "r:1", 1)]


def test_trace_sets_index_and_open_the_capture_file(qwen3, tmp_path):
    """A folder holding a capture file is a trace set: a row per sampled sequence, with its step and
    group, each opening to the trace the import gives."""
    from backend.trace.catalog import TraceSet

    (tmp_path / "sample.jsonl").write_bytes(open(CAPTURE, "rb").read())
    ts = TraceSet(str(tmp_path), final=True, cache=False, import_bundle=lambda: qwen3)
    ts.refresh()
    want = {t.id: t for t in import_file(CAPTURE, bundle=qwen3).traces}
    assert sorted(ts.df["id"]) == sorted(want) and not ts.problem_rows()
    assert sorted(zip(ts.df["id"], ts.df["group"], ts.df["training_step"])) == sorted(
        (t.id, t.metadata["group"], 3) for t in want.values())
    for k in range(len(ts)):
        t = ts.read(k)
        w = want[t.id]
        assert (t.prompt_ids, t.response_ids, t.response_mask) == (w.prompt_ids, w.response_ids, w.response_mask)
        assert [s.logprobs for s in t.steps] == [s.logprobs for s in w.steps]


@pytest.mark.parametrize("title, folder, step", [
    ("Running evaluation gsm8k 7", "x", 7),  # train.py's eval logtree
    ("my run", "iteration_000005", 5),  # no iteration in the title: the store's folder
    ("my run", "x", None),
])
def test_training_step_from_the_title_else_the_folder(qwen3, tmp_path, title, folder, step):
    doc = load()
    doc["title"] = title
    (tmp_path / folder).mkdir()
    res = import_file(write(tmp_path / folder, doc), bundle=qwen3)
    assert len(res.traces) == 6
    assert {t.metadata.get("training_step") for t in res.traces} == {step}
    assert res.traces[0].metadata["group"] == f"{title} #0"
