"""The NeMo-RL, NeMo-Gym and slime importers (issue 30), and the pickle reader slime's files need.

The fixtures (tests/data/import/nemo_rl, nemo_gym, slime) were written offline by
tests/fixtures_gen/gen_nemo_rl.py, gen_nemo_gym.py and gen_slime.py:

* NeMo-RL ``train_data_step3.jsonl``: NeMo-RL does not install here (PyPI has a placeholder only),
  so its writer's code path (message logs → masks → ``batched_message_log_to_flat_message`` →
  ``log_batched_dict_as_jsonl``) is reproduced with torch, from NVIDIA-NeMo/RL's source;
* NeMo-Gym ``rollouts.jsonl``: written with nemo-gym 0.7.0's own pydantic models
  (``nemo_gym.openai_utils``; the package needs Python 3.13, its models import on 3.11) and orjson,
  as ``rollout_collection.py`` writes a result;
* slime ``rollout_7.pt``: slime does not install here; ``torch.save`` of what its
  ``save_debug_rollout_data`` saves (``Sample.to_dict()`` of each sample), from THUDM/slime's source.

Every expected value below is read from the file itself (JSON, or ``torch.load(weights_only=True)``
in this test process), never from the importers' output.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest

from backend.importers import detect, import_file, load_any
from backend.safety.pickle_guard import PicklePool, PickleRefused, globals_of, looks_like_pickle, read_pickle
from backend.safety.trust import LOCAL, Mode, TrustPolicy, VisitorInputError
from backend.trace.model import StepState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
NEMO_RL = os.path.join(DATA, "nemo_rl", "train_data_step3.jsonl")
GYM = os.path.join(DATA, "nemo_gym", "rollouts.jsonl")
SLIME = os.path.join(DATA, "slime", "rollout_7.pt")
FORBIDDEN = os.path.join(DATA, "slime", "forbidden_global.pt")
SPECIAL_BIG_ID = 10**7  # past Qwen's vocabulary (151,669 ids)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def write_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def generated(t):
    return [s for s in t.steps if s.state == StepState.GENERATING]


def response_steps(t):
    p = len(t.prompt_ids)
    return [s for s in t.steps if s.end > s.start and s.start >= p]


def test_the_fixtures_are_there_and_detected():
    assert detect(NEMO_RL) == "nemo-rl"
    assert detect(GYM) == "nemo-gym"
    assert looks_like_pickle(SLIME) and looks_like_pickle(FORBIDDEN)
    assert not looks_like_pickle(NEMO_RL) and not looks_like_pickle(GYM)
    assert detect(SLIME) == "slime"


# ---- NeMo-RL --------------------------------------------------------------------------------------


def test_nemo_rl_keeps_ids_mask_logprobs_and_rewards_as_written():
    raw = lines(NEMO_RL)
    res = import_file(NEMO_RL)
    assert res.complete and res.formats == {"nemo-rl": len(raw)}
    for rec, t in zip(raw, res.traces):
        ids, mask = rec["token_ids"][0], rec["token_loss_mask"][0]
        n = rec["input_lengths"][0]
        p = mask.index(1)
        gen, prev, adv = rec["generation_logprobs"][0], rec["prev_logprobs"][0], rec["advantages"][0]
        assert t.prompt_ids + t.response_ids == ids[:n]
        assert len(t.prompt_ids) == p
        assert t.response_mask == mask[p:n]
        assert [x for s in generated(t) for x in s.logprobs] == [gen[i] for i in range(p, n) if mask[i] == 1]
        assert [x for s in response_steps(t) for x in s.info.trainer_logprobs] == prev[p:n]
        assert t.scorer.kind == "NeMo-RL prev_logprobs"
        md = t.metadata
        assert md["ids"] == "given" and md["source"] == "nemo-rl"
        assert md["training_step"] == 3
        assert md["score"] == rec["rewards"][0] and md["rewards"] == {"rewards": rec["rewards"][0]}
        assert md["advantage"] == adv[0] and set(adv) == {adv[0]}
        assert md["extra"]["prev_logprobs_prompt"] == prev[:p]
        assert md["extra"]["content"] == rec["content"][0]
        assert md["extra"]["sample_loss_mask"] == rec["sample_loss_mask"][0]
        assert md["extra"]["padding"] == len(ids) - n
        assert md["provenance"]["idx"] == rec["idx"]
        assert t.id == f"step3-{rec['idx']}"
    # the multi-turn sample: two generated turns, the tool's answer between them masked 0
    t0 = res.traces[0]
    assert [s.state for s in t0.steps if s.end > s.start][1:] == [StepState.GENERATING, StepState.PROCESSING_TOOLS,
                                                                  StepState.GENERATING]
    assert [m["role"] for m in t0.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert t0.messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"


def _nemo_rl_bad(tmp_path, edit, expect):
    raw = lines(NEMO_RL)
    edit(raw[1])
    res = import_file(write_lines(tmp_path / "train_data_step9.jsonl", raw))
    assert len(res.traces) == len(raw) - 1
    assert [p.line for p in res.problems] == [2]
    assert expect in res.problems[0].reason, res.problems[0].reason
    assert all(t.metadata["training_step"] == 9 for t in res.traces)


@pytest.mark.parametrize("edit,expect", [
    (lambda r: r["token_loss_mask"][0].pop(), "token_loss_mask has"),
    (lambda r: r["generation_logprobs"][0].pop(), "generation_logprobs has"),
    (lambda r: r["prev_logprobs"][0].append(-1.0), "prev_logprobs has"),
    (lambda r: r["token_ids"][0].__setitem__(3, SPECIAL_BIG_ID), "vocab"),
    (lambda r: r["input_lengths"].__setitem__(0, 10**6), "input_lengths"),
    (lambda r: r["token_loss_mask"][0].__setitem__(-1, 1), "padding"),
    (lambda r: r.__setitem__("token_ids", [r["token_ids"][0], r["token_ids"][0]]), "batch of one"),
], ids=["mask-short", "logprobs-short", "trainer-logprobs-long", "id-outside-vocab", "length", "mask-in-padding", "two-samples"])
def test_nemo_rl_bad_lines_are_reported(tmp_path, edit, expect):
    _nemo_rl_bad(tmp_path, edit, expect)


def test_nemo_rl_truncated_file(tmp_path):
    text = open(NEMO_RL, encoding="utf-8").read()
    p = tmp_path / "train_data_step3.jsonl"
    p.write_text(text[: len(text) - 200], encoding="utf-8")
    res = import_file(str(p))
    assert len(res.traces) == 3 and [x.line for x in res.problems] == [4]


# ---- NeMo-Gym --------------------------------------------------------------------------------------


def _trainable(rec):
    return [it for it in rec["response"]["output"] if it.get("generation_token_ids")]


def test_nemo_gym_keeps_each_calls_ids_and_logprobs():
    raw = lines(GYM)
    res = import_file(GYM)
    assert res.complete and res.formats == {"nemo-gym": len(raw)}
    for rec, t in zip(raw, res.traces):
        items = _trainable(rec)
        last = items[-1]
        assert t.prompt_ids == items[0]["prompt_token_ids"]
        assert t.prompt_ids + t.response_ids == last["prompt_token_ids"] + last["generation_token_ids"]
        assert sum(t.response_mask) == sum(len(it["generation_token_ids"]) for it in items)
        assert [s.logprobs for s in generated(t)] == [it["generation_log_probs"] for it in items]
        assert [t.prompt_ids + t.response_ids][0][generated(t)[-1].start:generated(t)[-1].end] == last["generation_token_ids"]
        md = t.metadata
        assert md["score"] == rec["reward"] and md["rewards"] == {"reward": rec["reward"]}
        assert md["group"] == str(rec["_ng_task_index"]) and md["sample"] == rec["_ng_rollout_index"]
        assert md["ids"] == "given" and md["provenance"]["library"] == "nemo-gym"
        kept = md["extra"]["response"]["output"]
        assert [it.get("id") for it in kept] == [it.get("id") for it in rec["response"]["output"]]
        assert not any("generation_token_ids" in it for it in kept)
        assert md["extra"]["responses_create_params"] == rec["responses_create_params"]
        assert [x["function"]["name"] for x in t.tools] == [x["name"] for x in rec["responses_create_params"]["tools"]]
        assert t.tools[0]["function"]["parameters"] == rec["responses_create_params"]["tools"][0]["parameters"]
    assert len(generated(res.traces[0])) == 2  # tool call, then the answer after the tool's output


@pytest.mark.parametrize("edit,expect", [
    (lambda r: _trainable(r)[-1]["generation_log_probs"].pop(), "generation_log_probs has"),
    (lambda r: _trainable(r)[-1]["prompt_token_ids"].__setitem__(5, 11), "does not continue the tokens before it: they differ at token 5"),
    (lambda r: [it.pop("generation_token_ids") for it in _trainable(r)], "no output item carries generation_token_ids"),
    (lambda r: _trainable(r)[0]["generation_token_ids"].__setitem__(0, "x"), "must be a list of token ids"),
], ids=["logprobs-short", "retokenised-history", "no-tokens", "bad-id"])
def test_nemo_gym_bad_lines_are_reported(tmp_path, edit, expect):
    raw = lines(GYM)
    edit(raw[0])
    res = import_file(write_lines(tmp_path / "rollouts.jsonl", raw), "nemo-gym")
    assert len(res.traces) == len(raw) - 1 and [p.line for p in res.problems] == [1]
    assert expect in res.problems[0].reason, res.problems[0].reason


def test_nemo_gym_truncated_line(tmp_path):
    text = open(GYM, encoding="utf-8").read().splitlines()
    p = tmp_path / "rollouts.jsonl"
    p.write_text("\n".join([text[0], text[1][:300], *text[2:]]) + "\n", encoding="utf-8")
    res = import_file(str(p))
    assert len(res.traces) == 3 and [x.line for x in res.problems] == [2]


# ---- slime (a pickle) ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slime_raw():
    import torch

    return torch.load(SLIME, weights_only=True)


def test_slime_keeps_tokens_mask_logprobs_and_rewards_as_written(slime_raw):
    res = import_file(SLIME)
    assert res.complete and res.formats == {"slime": len(slime_raw["samples"])} and res.unit == "index"
    for s, t in zip(slime_raw["samples"], res.traces):
        n = s["response_length"]
        assert t.prompt_ids + t.response_ids == s["tokens"] and len(t.response_ids) == n
        mask = s["loss_mask"] if s["loss_mask"] is not None else [1] * n
        assert t.response_mask == mask
        assert t.metadata["mask"] == ("given" if s["loss_mask"] is not None else "assumed")
        lp = s["rollout_log_probs"]
        assert [x for st in generated(t) for x in st.logprobs] == [lp[i] for i in range(n) if mask[i] == 1]
        md = t.metadata
        assert md["training_step"] == slime_raw["rollout_id"] == 7
        assert md["group"] == str(s["group_index"]) and md["stop_reason"] == s["status"]
        if isinstance(s["reward"], dict):
            assert md["rewards"] == s["reward"] and "score" not in md
        else:
            assert md["score"] == s["reward"] and md["rewards"] == {"reward": s["reward"]}
        for k in ("prompt", "response", "label", "index", "metadata", "weight_versions", "spec_info"):
            assert md["extra"][k] == s[k]
        assert t.id == f"rollout7-sample{s['index']}"
    tensors = slime_raw["samples"][3]
    assert res.traces[3].metadata["extra"]["rollout_top_p_token_ids"] == tensors["rollout_top_p_token_ids"].tolist()
    assert res.traces[2].termination_reason == "response_length"  # status "truncated"


def test_a_forbidden_global_is_refused_and_never_run(tmp_path):
    for ran in (os.path.join(ROOT, "ali-pickle-ran"), "ali-pickle-ran"):
        assert not os.path.exists(ran)
    res = import_file(FORBIDDEN)
    assert not res.traces and len(res.problems) == 1
    assert "posix.system" in res.problems[0].reason and "was not loaded" in res.problems[0].reason
    for ran in (os.path.join(ROOT, "ali-pickle-ran"), "ali-pickle-ran"):
        assert not os.path.exists(ran)

    marker = tmp_path / "ran"

    class Run:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for proto in (2, 4):  # GLOBAL, and STACK_GLOBAL (the names pushed as strings before it)
        p = tmp_path / f"bare{proto}.pkl"
        p.write_bytes(pickle.dumps([{"tokens": [1], "response_length": 1, "x": Run()}], protocol=proto))
        assert ("posix", "system") in globals_of(p.read_bytes())
        assert looks_like_pickle(str(p))
        res = import_file(str(p))
        assert not res.traces and "posix.system" in res.problems[0].reason
    assert not marker.exists()


def test_a_refusal_keeps_the_worker():
    from backend.safety import pickle_guard

    with pytest.raises(PickleRefused, match="posix.system"):
        read_pickle(FORBIDDEN, max_bytes=1 << 20)
    pids = pickle_guard.POOL.pids()
    with pytest.raises(PickleRefused, match="posix.system"):
        read_pickle(FORBIDDEN, max_bytes=1 << 20)
    assert pickle_guard.POOL.pids() == pids and len(pids) == 1


def test_a_global_named_through_the_memo_is_refused():
    """A STACK_GLOBAL whose module and name come back from the memo (not pushed right before it)
    cannot be read off the opcodes: refused, not guessed."""
    data = (b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94h\x00h\x01\x93"
            b"\x8c\x04true\x85R.")
    with pytest.raises(PickleRefused, match="cannot be read without running it"):
        globals_of(data)


def test_a_plain_pickle_of_samples_is_read(tmp_path, slime_raw):
    samples = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in s.items()} for s in slime_raw["samples"]]
    p = tmp_path / "samples.pkl"
    p.write_bytes(pickle.dumps(samples, protocol=2))
    res = import_file(str(p))
    assert res.complete and [t.prompt_ids + t.response_ids for t in res.traces] == [s["tokens"] for s in samples]
    assert "training_step" not in res.traces[0].metadata  # a bare list says no rollout id


def _save_slime(tmp_path, edit, slime_raw):
    import copy

    import torch

    doc = copy.deepcopy(slime_raw)
    edit(doc["samples"][1])
    p = tmp_path / "rollout_8.pt"
    torch.save(doc, p)
    return str(p)


@pytest.mark.parametrize("edit,expect", [
    (lambda s: s["loss_mask"].pop(), "loss_mask has"),
    (lambda s: s["rollout_log_probs"].append(-0.5), "rollout_log_probs has"),
    (lambda s: s.__setitem__("response_length", 10**6), "response_length"),
    (lambda s: s["tokens"].__setitem__(0, SPECIAL_BIG_ID), "vocab"),
], ids=["mask-short", "logprobs-long", "response-length", "id-outside-vocab"])
def test_slime_bad_samples_are_reported(tmp_path, slime_raw, edit, expect):
    res = import_file(_save_slime(tmp_path, edit, slime_raw))
    assert len(res.traces) == 3 and [p.line for p in res.problems] == [2]
    assert expect in res.problems[0].reason, res.problems[0].reason


def test_a_truncated_pt_file_is_reported(tmp_path):
    data = open(SLIME, "rb").read()
    p = tmp_path / "rollout_7.pt"
    p.write_bytes(data[: len(data) // 2])
    assert looks_like_pickle(str(p))  # the zip's listing (at its end) is gone: still read as a damaged torch file
    res = import_file(str(p))
    assert not res.traces and "not a readable pickle" in res.problems[0].reason, res.problems


def test_a_truncated_bare_pickle_is_reported(tmp_path):
    p = tmp_path / "samples.pkl"
    p.write_bytes(pickle.dumps([{"tokens": [1, 2], "response_length": 1}], protocol=2)[:-6])
    res = import_file(str(p))
    assert not res.traces and "not a readable pickle" in res.problems[0].reason


def test_the_pickle_worker_has_a_time_limit(tmp_path):
    """A read that takes seconds (2 M opcodes to list and load) against a 0.05 s limit: with the
    small fixture a loaded machine could deschedule this process long enough for the worker to
    answer first (it did once in CI)."""
    import pickle

    slow = tmp_path / "slow.pkl"
    slow.write_bytes(pickle.dumps(list(range(2_000_000)), protocol=4))
    pool = PicklePool(timeout_s=0.05)
    try:
        pool.start()
        with pytest.raises(PickleRefused, match="ALI_PICKLE_TIMEOUT_S"):
            read_pickle(str(slow), max_bytes=1 << 20, pool=pool)
    finally:
        pool.close()


def test_what_comes_back_is_bounded():
    with pytest.raises(PickleRefused, match="the limit is 100"):
        read_pickle(SLIME, max_bytes=100)


def test_load_any_imports_a_pt_only_when_asked(tmp_path):
    res = load_any(SLIME)
    assert not res.traces and "python -m backend import" in res.problems[0].reason
    assert len(load_any(SLIME, import_foreign=True).traces) == 4


# ---- public mode ------------------------------------------------------------------------------------


def test_a_public_server_refuses_pickles_before_reading_them(tmp_path, monkeypatch):
    import backend.safety.pickle_guard as guard
    from ui import trace_files
    from ui.context import AppContext, Session

    with pytest.raises(VisitorInputError, match="does not read pickles"):
        TrustPolicy(Mode.PUBLIC, "test").check_pickle("rollout_7.pt")
    LOCAL.check_pickle("rollout_7.pt")  # local mode: read (in the worker)

    calls = []
    monkeypatch.setattr(guard, "read_pickle", lambda *a, **k: calls.append(a))
    up = tmp_path / "rollout_7.pt"
    shutil.copy(SLIME, up)
    status, _ = trace_files.load_file(AppContext(trust=TrustPolicy(Mode.PUBLIC, "test")), Session(), str(up))
    assert "does not read pickles" in status and calls == []


def test_the_import_command_reads_a_pt_and_numbers_its_samples(tmp_path, capsys):
    from backend.cli import main

    out = tmp_path / "traces.jsonl"
    main(["import", SLIME, "--out", str(out)])
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4
    capsys.readouterr()
    rc = main(["import", FORBIDDEN, "--out", str(tmp_path / "none.jsonl")])
    said = "".join(capsys.readouterr())
    assert rc != 0 and "index 1: forbidden_global.pt not read: the pickle asks for posix.system" in said


def test_a_local_upload_of_a_pt_is_imported(tmp_path):
    from ui import trace_files
    from ui.context import AppContext, Session

    up = tmp_path / "rollout_7.pt"
    shutil.copy(SLIME, up)
    sess = Session()
    status, probs = trace_files.load_file(AppContext(), sess, str(up))
    assert "4 trace(s) imported from <b>slime</b>" in status and probs.empty, status
