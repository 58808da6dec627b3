"""Importers of RL agent frameworks' rollout files, tested on files the libraries wrote:

* Agent Lightning (agentlightning 1.0.2's own server, store, proxy and ``?format=triplet`` export,
  tests/fixtures_gen/gen_agentlightning.py);
* rLLM (rLLM's own ``Episode``/``Trajectory``/``Step`` types, advantage pipeline and
  ``EvalEpisodeStore``, installed from its source, tests/fixtures_gen/gen_rllm.py);
* OpenPipe ART (ART 0.3.11's own ``Trajectory``/``TrajectoryGroup`` and serialisers, from its
  source, tests/fixtures_gen/gen_art.py).

The oracle is the raw files read here with ``json`` (and ART's YAML log with PyYAML): ids, masks,
logprobs, rewards and advantages must equal what the library wrote."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest
import yaml

from backend.importers import detect, import_file
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
AGL = os.path.join(DATA, "agentlightning")
RLLM = os.path.join(DATA, "rllm")
ART = os.path.join(DATA, "art")
ART_STEP = os.path.join(ART, "trajectories", "train", "0003.json")
ART_YAML = os.path.join(ART, "trajectories", "train", "0003.yaml")  # as ART's serialize_trajectory_groups wrote it


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write(tmp_path, name, records, *, lines=True):
    p = tmp_path / name
    with open(p, "w", encoding="utf-8") as f:
        if lines:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        else:
            json.dump(records, f, ensure_ascii=False)
    return str(p)


def gen_logprobs(trace):
    """The rollout logprobs the trace's generated steps carry, in order, one list per step."""
    return [s.logprobs for s in trace.steps if s.mask == 1]


# ---- Agent Lightning ------------------------------------------------------------------------------


def agl_calls(events):
    """(prompt ids, response ids, logprobs) of the successful model calls, read from the raw events
    (full events: the model server's response; triplet: the trimmed fields)."""
    out = []
    for e in events:
        if e["event_type"] != "model_request":
            continue
        d = e["data"]
        if "response" in d:
            r = d["response"]
            if d["http_status"] >= 400:
                continue
            out.append((r["prompt_token_ids"], r["choices"][0]["token_ids"], [x["logprob"] for x in r["choices"][0]["logprobs"]["content"]]))
        elif d["status"] == "ok":
            out.append((d["prompt_token_ids"], d["response_token_ids"], d["response_log_probs"]))
    return out


@pytest.mark.parametrize("view", ["events", "triplet"])
@pytest.mark.parametrize("rid", ["ro-w-0", "ro-w-1", "ro-m-0", "ro-m-1"])
def test_agentlightning_ids_logprobs_rewards_as_written(qwen3, view, rid):
    path = os.path.join(AGL, view, f"{rid}.json")
    events = load(path)
    assert detect(path) == "agentlightning"
    res = import_file(path, bundle=qwen3)
    assert not res.problems and res.formats == {"agentlightning": 1}
    (t,) = res.traces
    calls = agl_calls(events)
    assert t.id == rid and t.metadata["ids"] == "given"
    assert t.prompt_ids == calls[0][0]
    expect_ids, expect_mask = [], []
    context = list(calls[0][0])
    for prompt, response, _ in calls:
        gap = prompt[len(context):]
        assert prompt[: len(context)] == context  # the calls continue each other in this scenario
        expect_ids += gap + response
        expect_mask += [0] * len(gap) + [1] * len(response)
        context = prompt + response
    assert t.response_ids == expect_ids and t.response_mask == expect_mask
    assert gen_logprobs(t) == [lp for _, _, lp in calls]
    rewards = [e["data"]["value"] for e in events if e["event_type"] == "reward"]
    assert t.metadata["score"] == rewards[-1] and t.metadata["rewards"] == {"agent": rewards[-1]}
    assert t.metadata["provenance"]["view"] == view and t.metadata["provenance"]["library"] == "agentlightning"
    if view == "events":  # the request's tools come with the full events
        assert [x["function"]["name"] for x in t.tools] == (["get_weather"] if rid.startswith("ro-w") else [])


def test_agentlightning_run_file_groups_failed_call_and_restart(qwen3):
    path = os.path.join(AGL, "run.jsonl")
    res = import_file(path, bundle=qwen3)
    assert not res.problems
    by_id = {t.id: t for t in res.traces}
    assert sorted(by_id) == ["ro-m-0", "ro-m-1", "ro-s-0", "ro-s-0/2", "ro-w-0", "ro-w-1"]
    rollouts = {r["rollout_id"]: r for r in load(os.path.join(AGL, "rollouts.json"))}
    for tid, t in by_id.items():
        assert t.metadata["group"] == rollouts[tid.split("/")[0]]["input"]["data_id"]
    # the refused call (HTTP 400) is no turn, and the import says so
    assert len(res.losses) == 1 and "HTTP 400" in res.losses[0].reason and "ro-w-1" in res.losses[0].reason
    assert by_id["ro-w-1"].metadata["extra"]["failed_requests"][0]["data"]["http_status"] == 400
    # the agent that started a new conversation: two traces, each with its own call's ids
    calls = agl_calls(load(os.path.join(AGL, "events", "ro-s-0.json")))
    assert len(calls) == 2 and calls[1][0][: len(calls[0][0])] != calls[0][0]
    for t, (prompt, response, lp) in zip((by_id["ro-s-0"], by_id["ro-s-0/2"]), calls):
        assert (t.prompt_ids, t.response_ids, gen_logprobs(t)) == (prompt, response, [lp])
        assert t.metadata["score"] == 0.5
    assert by_id["ro-s-0"].metadata["extra"]["events"][0]["event_type"] == "agent_note"


def test_agentlightning_rollout_records_alone_are_reported(qwen3):
    res = import_file(os.path.join(AGL, "rollouts.json"), bundle=qwen3)
    assert not res.traces and len(res.problems) == 5
    assert all("no events of it in this file" in p.reason for p in res.problems)


def _agl_events(rid="ro-w-0"):
    return load(os.path.join(AGL, "events", f"{rid}.json"))


@pytest.mark.parametrize("damage, why", [
    (lambda ev: ev[0]["data"]["response"]["choices"][0]["logprobs"]["content"].pop(), "logprobs has 25 values for 26"),
    (lambda ev: ev[0]["data"]["response"]["choices"][0]["token_ids"].__setitem__(0, 10**7), "outside the vocabulary"),
    (lambda ev: ev[1]["data"]["response"]["choices"][0]["message"].__setitem__("content", "No, it is dry."), "disagree with the response text"),
    (lambda ev: ev[0]["data"]["response"].__setitem__("prompt_token_ids", "151644"), "must be a list of token ids"),
])
def test_agentlightning_bad_events_are_reported(qwen3, tmp_path, damage, why):
    events = _agl_events()
    damage(events)
    res = import_file(write(tmp_path, "ev.json", events, lines=False), bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_agentlightning_truncated_line_loses_only_its_record(qwen3, tmp_path):
    lines = open(os.path.join(AGL, "run.jsonl"), encoding="utf-8").read().splitlines()
    m0 = next(i for i, line in enumerate(lines) if '"rollout_id": "ro-m-0"' in line and "model_request" in line)
    lines[m0] = lines[m0][: len(lines[m0]) // 2]
    p = tmp_path / "run.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert any(pr.line == m0 + 1 for pr in res.problems)  # the cut line, by its number
    # ro-m-0 lost its only call: reported, not imported empty
    assert any("ro-m-0" in pr.reason and "no successful model_request" in pr.reason for pr in res.problems)
    assert {t.id for t in res.traces} == {"ro-m-1", "ro-s-0", "ro-s-0/2", "ro-w-0", "ro-w-1"}


# ---- rLLM -----------------------------------------------------------------------------------------

RLLM_FILES = sorted(glob.glob(os.path.join(RLLM, "episodes", "episode_*.json")))


def test_rllm_fixture_files_exist():
    assert len(RLLM_FILES) == 5


@pytest.mark.parametrize("path", RLLM_FILES, ids=os.path.basename)
def test_rllm_episode_ids_logprobs_rewards_as_written(qwen3, path):
    ep = load(path)
    assert detect(path) == "rllm"
    res = import_file(path, bundle=qwen3)
    assert not res.problems and not res.losses
    assert len(res.traces) == len(ep["trajectories"])
    task_id, rollout = ep["id"].split(":")
    for t, traj in zip(res.traces, ep["trajectories"]):
        steps = traj["steps"]
        assert t.metadata["ids"] == "given" and t.prompt_ids == steps[0]["prompt_ids"]
        ids, mask = [], []
        context = steps[0]["prompt_ids"]
        for s in steps:
            gap = s["prompt_ids"][len(context):]
            assert s["prompt_ids"][: len(context)] == context
            ids += gap + s["response_ids"]
            mask += [0] * len(gap) + [1] * len(s["response_ids"])
            context = s["prompt_ids"] + s["response_ids"]
        assert t.response_ids == ids and t.response_mask == mask
        assert gen_logprobs(t) == [s["logprobs"] for s in steps]
        assert t.metadata["group"] == f"{task_id}:{traj['name']}" and t.metadata["sample"] == int(rollout)
        assert t.metadata["score"] == traj["reward"] and t.metadata["rewards"] == {"trajectory": traj["reward"]}
        assert t.metadata["advantage"] == steps[0]["advantage"]
        assert [x["reward"] for x in t.metadata["extra"]["steps"]] == [s["reward"] for s in steps]
        assert [x["advantage"] for x in t.metadata["extra"]["steps"]] == [s["advantage"] for s in steps]
        assert t.metadata["extra"]["episode"]["is_correct"] == ep["is_correct"]
        assert t.metadata["extra"]["steps"][-1]["chat_completions"] == steps[-1]["chat_completions"]


def test_rllm_grpo_advantages_are_rllms():
    """The advantages rLLM's own GRPO computed: + for the correct rollout, - for the wrong one."""
    advs = {load(p)["id"]: load(p)["trajectories"][0]["steps"][0]["advantage"] for p in RLLM_FILES}
    assert advs["w:0"] > 0 > advs["w:1"] and advs["m:0"] > 0 > advs["m:1"]


def test_rllm_to_dict_form_imports_the_same(qwen3):
    a = import_file(os.path.join(RLLM, "episodes_to_dict.jsonl"), bundle=qwen3)
    b = [t for p in RLLM_FILES for t in import_file(p, bundle=qwen3).traces]
    assert not a.problems and len(a.traces) == len(b) == 6
    for x, y in zip(a.traces, b):
        assert (x.id, x.prompt_ids, x.response_ids, x.response_mask, gen_logprobs(x), x.metadata["score"], x.metadata["advantage"]) == \
               (y.id, y.prompt_ids, y.response_ids, y.response_mask, gen_logprobs(y), y.metadata["score"], y.metadata["advantage"])


def _rllm_ep():
    return load(RLLM_FILES[0])


@pytest.mark.parametrize("damage, why", [
    (lambda ep: ep["trajectories"][0]["steps"][0]["logprobs"].pop(), "logprobs has 24 values for 25"),
    (lambda ep: ep["trajectories"][0]["steps"][1]["response_ids"].__setitem__(0, -3), "outside the vocabulary"),
    (lambda ep: ep["trajectories"][0]["steps"][1]["model_output"].__setitem__("text", "123 × 45 = 5536."), "disagree with model_output.text"),
    (lambda ep: ep["trajectories"][0]["steps"][0]["model_output"]["completion_ids"].pop(), "completion_ids differ"),
    (lambda ep: ep["trajectories"][0]["steps"][0].__setitem__("response_ids", []), "no response_ids"),
    (lambda ep: ep["trajectories"][0]["steps"][0].__setitem__("prompt_ids", None), "must be a list of token ids"),
])
def test_rllm_bad_episodes_are_reported(qwen3, tmp_path, damage, why):
    ep = _rllm_ep()
    damage(ep)
    res = import_file(write(tmp_path, "ep.jsonl", [ep]), bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_rllm_truncated_episode_file_is_reported(qwen3, tmp_path):
    text = open(RLLM_FILES[0], encoding="utf-8").read()
    p = tmp_path / "episode_000000_w_0.json"
    p.write_text(text[: len(text) // 2], encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert not res.traces and res.problems


# ---- OpenPipe ART ---------------------------------------------------------------------------------


def art_items(traj):
    """(message, trainable) of a trajectory as ART wrote it (a Choice — with "message" — is trainable)."""
    if "messages" in traj:
        return [({k: v for k, v in m.items() if k != "trainable"}, m["trainable"]) for m in traj["messages"]]
    return [(x["message"], True) if "message" in x else (x, False) for x in traj["messages_and_choices"]]


def test_art_json_log_is_arts_yaml_log():
    """The JSON file holds what ART's serialize_trajectory_groups wrote to the YAML log."""
    with open(ART_STEP[:-5] + ".yaml", encoding="utf-8") as f:
        assert yaml.safe_load(f) == load(ART_STEP)


@pytest.mark.parametrize("path", [ART_YAML, ART_STEP, os.path.join(ART, "model_dump.json"), os.path.join(ART, "for_logging.jsonl")],
                         ids=["yaml-log", "yaml-log-as-json", "model-dump", "for-logging"])
def test_art_rendered_with_trainable_mask(qwen3, path):
    if path.endswith(".jsonl"):
        groups = [{"trajectories": [json.loads(line) for line in open(path, encoding="utf-8")]}]
    elif path.endswith(".yaml"):
        with open(path, encoding="utf-8") as f:
            groups = yaml.safe_load(f)
    else:
        groups = load(path)
    trajs = [(g, i, t) for g in groups for i, t in enumerate(g["trajectories"])]
    assert detect(path) == "art"
    res = import_file(path, bundle=qwen3)
    assert not res.problems and not res.losses and len(res.traces) == len(trajs) == 3
    for trace, (_g, i, traj) in zip(res.traces, trajs):
        assert trace.metadata["ids"] == "rendered"
        assert trace.metadata["score"] == traj["reward"] and trace.metadata["rewards"] == {"reward": traj["reward"]}
        items = art_items(traj)
        assert trace.metadata["extra"]["trainable"] == [f for _, f in items]
        # each assistant message: its tokens are 1 exactly when ART trains on it
        p = len(trace.prompt_ids)
        seen = 0
        for s in trace.steps:
            for k in s.messages_added:
                msg, trainable = items[k]
                if msg["role"] != "assistant":
                    continue
                seen += 1
                bits = set(trace.response_mask[s.start - p : s.end - p])
                assert bits == ({1} if trainable else {0}), (k, msg)
                text = qwen3.tokenizer.decode((trace.prompt_ids + trace.response_ids)[s.start : s.end])
                if msg.get("content"):
                    assert msg["content"] in text
                for c in msg.get("tool_calls") or []:
                    assert c["function"]["name"] in text
        assert seen == sum(1 for m, _ in items if m["role"] == "assistant")
        if "messages" not in traj:
            assert trace.metadata["sample"] == i and trace.metadata["group"].startswith("art-")
    if path in (ART_STEP, ART_YAML):  # trajectories/<split>/<step>.yaml|json: the step from the name
        assert {t.metadata["training_step"] for t in res.traces} == {3}
    # the few-shot assistant answer in the prompt is not trained on: a mask-0 run in the response
    first = res.traces[0]
    assert first.response_mask[0] == 0 and "Dana sent the budget" in qwen3.tokenizer.decode(first.response_ids[:12])


def test_art_keeps_tools_and_choice_logprobs(qwen3):
    res = import_file(os.path.join(ART, "model_dump.json"), bundle=qwen3)
    raw = load(os.path.join(ART, "model_dump.json"))[0]["trajectories"][0]
    t = res.traces[0]
    assert [x["function"]["name"] for x in t.tools] == [x["function"]["name"] for x in raw["tools"]]
    choices = [x for x in raw["messages_and_choices"] if "message" in x]
    assert [c["logprobs"] for c in t.metadata["extra"]["choices"]] == [c["logprobs"] for c in choices]


@pytest.mark.parametrize("damage, why", [
    (lambda r: r["messages"][1].__setitem__("trainable", True), "marked trainable but its role is 'user'"),
    (lambda r: r.__setitem__("reward", "high"), "reward must be a finite number"),
    (lambda r: r["messages"][2].pop("trainable"), "trainable must be true or false"),
    (lambda r: r["messages"][1].__setitem__("role", "narrator"), "has role 'narrator'"),
])
def test_art_bad_trajectories_are_reported(qwen3, tmp_path, damage, why):
    rec = json.loads(open(os.path.join(ART, "for_logging.jsonl"), encoding="utf-8").readline())
    damage(rec)
    res = import_file(write(tmp_path, "t.jsonl", [rec]), "art", bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_art_truncated_log_is_reported(qwen3, tmp_path):
    text = open(ART_STEP, encoding="utf-8").read()
    p = tmp_path / "0003.json"
    p.write_text(text[: len(text) // 2], encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert not res.traces and res.problems


def test_art_yaml_log_imports_as_its_json_form(qwen3):
    """ART's YAML log, read as written, gives the traces its JSON form gives (ids, mask, metadata)."""
    a, b = import_file(ART_YAML, bundle=qwen3), import_file(ART_STEP, bundle=qwen3)
    assert a.unit == "index" and not a.problems and not a.losses and a.formats == {"art": 3}
    assert [(t.prompt_ids, t.response_ids, t.response_mask, t.metadata["extra"], t.metadata["group"]) for t in a.traces] == \
           [(t.prompt_ids, t.response_ids, t.response_mask, t.metadata["extra"], t.metadata["group"]) for t in b.traces]


def _bomb(levels: int) -> str:
    """An ART-looking log whose one trajectory's logs are a "billion laughs": 10**levels strings."""
    lines = ["- metadata:", "    a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    lines += ["  trajectories:", "  - logs: *a%d" % (levels - 1), "    messages_and_choices:", "    - content: hi", "      role: user",
              "    - finish_reason: stop", "      index: 0", "      message:", "        content: hello", "        role: assistant",
              "    reward: 1.0"]
    return "\n".join(lines) + "\n"


def test_art_yaml_alias_bomb_is_refused_before_it_expands(qwen3, tmp_path):
    import time

    small = tmp_path / "0001.yaml"  # 10**3 strings: read, and the trajectory's logs are all there
    small.write_text(_bomb(3), encoding="utf-8")
    res = import_file(str(small), bundle=qwen3)
    assert len(res.traces) == 1 and json.dumps(res.traces[0].metadata["extra"]["logs"]).count('"lol"') == 1000
    p = tmp_path / "0002.yaml"  # 10**12 strings (~5 TB as JSON) in a file of under 1 KB
    p.write_text(_bomb(12), encoding="utf-8")
    assert p.stat().st_size < 1024
    t0 = time.perf_counter()
    res = import_file(str(p), bundle=qwen3)
    assert time.perf_counter() - t0 < 5
    assert not res.traces and len(res.problems) == 1
    assert "aliases expand it to over 8,000,000 values" in res.problems[0].reason, res.problem_lines()
    assert detect(str(p)) is None


@pytest.mark.parametrize("text, why", [
    ("- &a [*a]\n", "not defined before it"),  # recursive
    ("[" * 100000 + "]" * 100000 + "\n", "nested over 64 levels"),  # libyaml's composer recurses in C: a crash
    ("a: &d [[[[[[[[[[1]]]]]]]]]]\n" + "".join(f"b{i}: &d [[[[[[[[[[*d]]]]]]]]]]\n" for i in range(7)), "nested over 64 levels"),
    ("- a\n---\n- b\n", "several YAML documents"),
    ("- !!binary aGk=\n", "!!binary"),
    ("- !!python/object/apply:os.system [echo hi]\n", "not valid YAML"),
    ("- {a: [1, 2\n", "not valid YAML"),
])
def test_yaml_files_that_are_refused(tmp_path, text, why):
    from backend.trace.yaml_guard import YamlRefused, read_yaml

    p = tmp_path / "x.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(YamlRefused, match=why.replace("!", "[!]")):
        read_yaml(str(p))
    res = import_file(str(p), tokenizer="qwen3")
    assert not res.traces and len(res.problems) == 1 and "x.yaml not read" in res.problems[0].reason


def test_art_truncated_yaml_is_reported(qwen3, tmp_path):
    text = open(ART_YAML, encoding="utf-8").read()
    # cut inside a line: refused as a whole (the writer ends its last line)
    p = tmp_path / "0003.yaml"
    p.write_text(text[: len(text) // 2], encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and "truncated" in res.problems[0].reason
    # cut at a line boundary inside the first group (before its second trajectory's reward): still YAML, but
    # that group is refused, not imported short; the cut drops the second group, which nothing can know of
    lines = text.splitlines(keepends=True)
    cut = [i for i, line in enumerate(lines) if line.strip().startswith("reward:")][1]
    p.write_text("".join(lines[:cut]), encoding="utf-8")
    res = import_file(str(p), "art", bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and "not an ART trajectory" in res.problems[0].reason


def test_yaml_that_is_not_arts_is_not_imported(tmp_path):
    from backend.importers import load_any

    p = tmp_path / "config.yaml"
    p.write_text("model: qwen3\nlr: 1.0e-6\nsteps: [1, 2]\n", encoding="utf-8")
    assert detect(str(p)) is None
    res = import_file(str(p), tokenizer="qwen3")
    assert not res.traces and len(res.problems) == 1
    # load_any (the UI, the CLI's view) never reads YAML as a trace file: it says to import it
    res = load_any(ART_YAML)
    assert not res.traces and "0003.yaml is YAML, not a trace; import it" in res.problems[0].reason
    assert len(load_any(ART_YAML, import_foreign=True).traces) == 3


def test_detection_keeps_other_formats(tmp_path):
    """The new formats take only their own records."""
    grp = copy.deepcopy(load(ART_STEP)[0])
    assert detect(grp) == "art"
    assert detect({"messages": [{"role": "user", "content": "hi"}]}) == "openai-chat"
    assert detect(load(RLLM_FILES[0])) == "rllm"
    assert detect(_agl_events()[0]) == "agentlightning"
    assert detect({"prompt_ids": [1], "response_ids": [2]}) == "verl"


def test_trace_sets_index_and_open_rllm_and_art_rows(qwen3, tmp_path):
    """A folder of rLLM episode lines and ART records is a trace set: a row per trajectory, each
    opening to the trace the import gives; Agent Lightning's events (a rollout spread over many
    records) are refused there with the import command to use."""
    from backend.trace.catalog import TraceSet

    for src in (os.path.join(RLLM, "episodes_to_dict.jsonl"), os.path.join(ART, "for_logging.jsonl"), os.path.join(AGL, "run.jsonl")):
        (tmp_path / os.path.basename(src)).write_bytes(open(src, "rb").read())
    ts = TraceSet(str(tmp_path), final=True, cache=False, import_bundle=lambda: qwen3)
    ts.refresh()
    imported = {t.id: t for src in ("episodes_to_dict.jsonl", "for_logging.jsonl")
                for t in import_file(str(tmp_path / src), bundle=qwen3).traces}
    assert sorted(ts.df["id"]) == sorted(imported)
    for k in range(len(ts)):
        t = ts.read(k)
        assert (t.prompt_ids, t.response_ids, t.response_mask) == (imported[t.id].prompt_ids, imported[t.id].response_ids,
                                                                   imported[t.id].response_mask)
    problems = [p for p in ts.problem_rows() if p[0].endswith("run.jsonl")]
    assert problems and all("python -m backend import" in p[2] for p in problems)


# ---- AReaL ----------------------------------------------------------------------------------------

AREAL_FILES = sorted(glob.glob(os.path.join(DATA, "areal", "rollout", "*", "*.jsonl")))


def lines_of(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.mark.parametrize("path", AREAL_FILES, ids=lambda p: os.path.relpath(p, DATA))
def test_areal_dump_recovered_and_rendered(qwen3, path):
    rows = lines_of(path)
    assert detect(path) == "areal"
    res = import_file(path, bundle=qwen3)
    assert not res.problems and not res.losses and len(res.traces) == len(rows) == 2
    version = int(os.path.basename(os.path.dirname(path)))
    for t, row in zip(res.traces, rows):
        assert t.metadata["ids"] == "rendered" and t.metadata["messages"] == "recovered"
        assert t.metadata["score"] == row["reward"] and t.metadata["rewards"] == {"reward": row["reward"]}
        assert t.metadata["group"] == str(row["task_id"]) and t.metadata["sample"] == row["sample_idx"]
        assert t.metadata["training_step"] == row["tail_version"] == version
        assert (t.metadata["prompt"], t.metadata["completion"]) == (row["prompt"], row["completion"])
        # the last assistant turn is the completion's last turn, as AReaL decoded it
        last = (row["prompt"] + row["completion"]).rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>")
        assert t.messages[-1] == {"role": "assistant", "content": last}
        assert qwen3.tokenizer.decode(t.response_ids).count(last) == 1


def test_areal_multi_turn_prompt_len_is_not_the_turn_boundary(qwen3):
    """AReaL's prompt_len is seqlen minus the loss mask's ones: in a two-turn sample its "prompt"
    holds the first generated turn; the import recovers the turns from both texts joined."""
    path = os.path.join(DATA, "areal", "rollout", "4", "0.jsonl")
    row = lines_of(path)[0]
    assert "<tool_call>" in row["prompt"] and row["completion"].startswith("<tool_response>")
    (t, _) = import_file(path, bundle=qwen3).traces
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"word": "Fernweh"}}
    assert t.messages[2]["content"] == "Fernweh (German): a longing for far-off places."
    the_call = '{"name": "lookup", "arguments": {"word": "Fernweh"}}'
    assert the_call in row["prompt"]  # AReaL's "prompt" holds the generated call ...
    assert the_call not in qwen3.tokenizer.decode(t.prompt_ids)  # ... the trace's prompt ends before it
    assert t.prompt_ids[-3:] == qwen3.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert the_call in qwen3.tokenizer.decode(t.response_ids)
    assert [x["function"]["name"] for x in t.tools] == ["lookup"]  # from the <tools> block AReaL's text keeps


@pytest.mark.parametrize("damage, why", [
    (lambda r: r.__setitem__("prompt_len", r["seqlen"]), "is not below seqlen"),
    (lambda r: r.__setitem__("reward", "1.0"), "reward must be a finite number"),
    (lambda r: r.__setitem__("prompt", None), "'prompt' must be text"),
    (lambda r: r.__setitem__("seqlen", 25.0), "'seqlen' must be an integer"),
])
def test_areal_bad_lines_are_reported(qwen3, tmp_path, damage, why):
    row = lines_of(AREAL_FILES[1])[0]
    damage(row)
    res = import_file(write(tmp_path, "1.jsonl", [row]), "areal", bundle=qwen3)
    assert not res.traces and len(res.problems) == 1 and why in res.problems[0].reason, res.problem_lines()


def test_areal_text_that_does_not_give_the_files_token_counts_is_said(qwen3, tmp_path):
    rows = lines_of(AREAL_FILES[1])
    rows[0]["prompt_len"] -= 1  # as if another tokenizer had written it
    res = import_file(write(tmp_path, "1.jsonl", rows), bundle=qwen3)
    assert len(res.traces) == 2 and len(res.losses) == 1
    assert "token counts" in res.losses[0].reason and "the file says 15 + 10" in res.losses[0].reason


def test_areal_truncated_line_loses_only_its_record(qwen3, tmp_path):
    text = open(AREAL_FILES[0], encoding="utf-8").read().splitlines()
    p = tmp_path / "0.jsonl"
    p.write_text(text[0] + "\n" + text[1][:40] + "\n", encoding="utf-8")
    res = import_file(str(p), bundle=qwen3)
    assert len(res.traces) == 1 and len(res.problems) == 1 and res.problems[0].line == 2


def test_yaml_over_its_size_limit_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "0003.yaml"
    p.write_bytes(open(ART_YAML, "rb").read())
    monkeypatch.setenv("ALI_MAX_YAML_BYTES", "1000")  # the fixture is 1,904 bytes
    res = import_file(str(p), tokenizer="qwen3")
    assert not res.traces and len(res.problems) == 1 and "over the 1.0 KB limit for a YAML file" in res.problems[0].reason


def test_an_upload_of_arts_yaml_is_imported_and_a_bomb_says_why(tmp_path):
    """The Trace files tab (public mode): ART's YAML log is imported; a refused YAML says why, once."""
    from backend.safety.trust import Mode, TrustPolicy
    from ui import trace_files
    from ui.context import AppContext, Session

    ctx = AppContext(trust=TrustPolicy(Mode.PUBLIC, "test"))
    up = tmp_path / "0003.yaml"
    up.write_bytes(open(ART_YAML, "rb").read())
    status, probs = trace_files.load_file(ctx, Session(), str(up))
    assert "3 trace(s) imported from <b>art</b>" in status and probs.empty, status
    bomb = tmp_path / "0004.yaml"
    bomb.write_text(_bomb(12), encoding="utf-8")
    status, probs = trace_files.load_file(ctx, Session(), str(bomb))
    assert "0 trace(s) loaded, <b>1 bad record(s)</b>" in status, status
    assert probs.to_dict("records") == [{"line": 1, "problem": "0004.yaml not read: its aliases expand it to over 8,000,000 values "
                                                               "(the limit, ALI_MAX_FILE_VALUES)"}]


def test_yaml_aliases_stay_shared_and_values_are_json(tmp_path):
    from backend.trace.yaml_guard import read_yaml

    p = tmp_path / "x.yaml"
    p.write_text("a: &x {n: [1, 2]}\nb: *x\nwhen: 2026-11-28\n1: one\n", encoding="utf-8")
    doc = read_yaml(str(p))
    assert doc == {"a": {"n": [1, 2]}, "b": {"n": [1, 2]}, "when": "2026-11-28", "1": "one"}
    assert doc["a"] is doc["b"]  # converted once, as the constructor built it once: no expansion in memory
