"""SkyRL 0.4's training-batch dumps (``trainer.dump_data_batch``, issue 30), and the pickle reader's
stand-ins for SkyRL's batch classes.

The fixtures (tests/data/import/skyrl/dumped_data/) were written offline by
tests/fixtures_gen/gen_skyrl04.py with skyrl-train 0.4.0's own code, imported from its source (tag
``skyrl_train-v0.4.0``; 0.4.0 is not on PyPI): ``RayPPOTrainer.convert_to_training_input`` (SkyRL's
padding), ``fwd_logprobs_values_reward`` (the models' forward scripted), ``compute_advantages_and_returns``
(GRPO) and ``dump_data`` (``TrainingInputBatch.save``). ``skyrl04_inputs.json`` is what was handed to
SkyRL before it padded the rows.

Expected values come from that JSON and from the pickles themselves, read here by :func:`raw_batch`
(a test-only reader: SkyRL's class as a bare holder of its state, tensors decoded with numpy), never
from the importer's output.
"""

from __future__ import annotations

import copyreg
import json
import os
import pickle
import shutil
import sys
import types

import numpy as np
import pytest

from backend.importers import detect, import_file
from backend.safety.pickle_guard import PickleRefused, globals_of, looks_like_pickle, read_pickle
from backend.safety.trust import LOCAL, Mode, TrustPolicy, VisitorInputError
from backend.trace.model import StepState
from tests.test_import_rl_nemo_slime import generated, response_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKY = os.path.join(ROOT, "tests", "data", "import", "skyrl")
STEP3 = os.path.join(SKY, "dumped_data", "global_step_3_training_input.pkl")
STEP4 = os.path.join(SKY, "dumped_data", "global_step_4_training_input.pkl")
MASK_SHORT = os.path.join(SKY, "dumped_data", "bad_mask_short.pkl")
LOGPROBS_LONG = os.path.join(SKY, "dumped_data", "bad_logprobs_long.pkl")
SKYRL_MODULE = "skyrl_train.training_batch"


def inputs(step):
    with open(os.path.join(SKY, "skyrl04_inputs.json"), encoding="utf-8") as f:
        return json.load(f)[f"global_step_{step}"]


class _Holder(dict):
    def __setitem__(self, k, v):  # the items' tensors: the state has them again
        pass

    def __setstate__(self, state):
        self.state = state


class _RawReader(pickle.Unpickler):
    def find_class(self, module, name):
        if module == SKYRL_MODULE:
            return _Holder
        if (module, name) in (("torch.storage", "_load_from_bytes"), ("torch._utils", "_rebuild_tensor_v2")):
            return lambda *a: None
        if (module, name) == ("torch", "device"):
            return lambda *a: str(a[0])
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        raise AssertionError(f"the fixture names {module}.{name}")


def raw_batch(path):
    """``(tensors as nested lists, metadata, batch_size)`` of a SkyRL dump, decoded with numpy."""
    with open(path, "rb") as f:
        state = _RawReader(f).load().state
    tensors = {k: (None if v is None else np.frombuffer(v["data"], dtype=np.dtype(v["dtype"])).reshape(v["shape"]).tolist())
               for k, v in state["batch_dict"].items()}
    return tensors, state["metadata"], state["batch_size"]


# ---- what SkyRL 0.4 wrote ------------------------------------------------------------------------


def test_the_dumps_are_detected_as_skyrl_pickles():
    for p in (STEP3, STEP4, MASK_SHORT, LOGPROBS_LONG):
        assert looks_like_pickle(p) and detect(p) == "skyrl"
        assert (SKYRL_MODULE, "TrainingInputBatch") in globals_of(open(p, "rb").read())


def test_skyrl_pads_prompts_left_and_responses_right():
    """What the importer undoes, read off the file: the prompt columns' attention mask is zeros then
    ones, the response mask ones then zeros, and the prompt/response split is ``response_length``."""
    t, meta, n = raw_batch(STEP3)
    r = meta["response_length"]
    assert n == 4 and len(t["response_mask"][0]) == r and sorted(t) == [
        "action_log_probs", "advantages", "attention_mask", "base_action_log_probs", "is_last_step", "loss_mask",
        "response_mask", "returns", "rollout_logprobs", "sequences", "values"]
    assert t["values"] is None and t["is_last_step"] is None  # no critic; not step-wise
    assert "uids" not in meta and "rewards" not in t  # SkyRL drops both before it dumps
    att = t["attention_mask"]
    assert att[0][0] == 0 and att[2][0] == 1  # the weather prompts are shorter than the maths ones
    assert any(m[-1] == 0 for m in t["response_mask"])


def test_step3_rows_keep_ids_masks_logprobs_and_advantages_as_written():
    t, meta, n = raw_batch(STEP3)
    given = inputs(3)
    res = import_file(STEP3)
    assert res.complete and res.formats == {"skyrl": 4} and res.unit == "index" and len(res.traces) == n
    for i, tr in enumerate(res.traces):
        k = len(given["response_ids"][i])
        assert tr.prompt_ids == given["prompt_token_ids"][i] and tr.response_ids == given["response_ids"][i]
        assert tr.response_mask == given["loss_masks"][i]
        md = tr.metadata
        assert md["ids"] == "given" and md["training_step"] == 3 and tr.id == f"step3-row{i}"
        assert "group" not in md  # SkyRL dropped the uids: the view groups by prompt
        lp = t["rollout_logprobs"][i]
        assert [x for s in generated(tr) for x in s.logprobs] == [lp[j] for j in range(k) if given["loss_masks"][i][j]]
        assert [x for s in response_steps(tr) for x in s.info.trainer_logprobs] == t["action_log_probs"][i][:k]
        assert tr.scorer.kind == "skyrl action_log_probs"
        assert md["advantage"] == t["advantages"][i][0] and set(t["advantages"][i][:k]) == {md["advantage"]}
        ex = md["extra"]
        assert ex["base_action_log_probs"] == t["base_action_log_probs"][i][:k] and ex["returns"] == t["returns"][i][:k]
        assert ex["row"] == i and "padding_row" not in ex and "is_last_step" not in ex  # None: not step-wise
        assert ex["batch"] == meta and "values" not in ex  # no critic: values is None in the file
        assert md["provenance"] == {"format": "SkyRL", "library": "skyrl-train", "class": "TrainingInputBatch", "row": i}
    # the multi-turn sample: the tool's response is masked 0 and is a tool step
    states = [s.state for s in res.traces[0].steps]
    assert StepState.PROCESSING_TOOLS in states and len(generated(res.traces[0])) == 2
    assert [x.metadata["advantage"] > 0 for x in res.traces] == [True, False, True, False]  # reward 1, 0 in each group


def test_step_wise_rows_keep_trajectory_groups_and_the_padding_row():
    t, meta, n = raw_batch(STEP4)
    given = inputs(4)
    res = import_file(STEP4)
    assert res.complete and len(res.traces) == n == len(given["uids"]) + meta["pad_size"] == 6
    for i, tr in enumerate(res.traces[:5]):
        assert tr.prompt_ids == given["prompt_token_ids"][i] and tr.response_ids == given["response_ids"][i]
        md = tr.metadata
        uid, rep = given["trajectory_ids"][i].rsplit("_", 1)
        assert (md["group"], md["sample"]) == (given["uids"][i], int(rep)) and uid == given["uids"][i]
        assert md["extra"]["trajectory_id"] == meta["trajectory_ids"][i]
        assert md["extra"]["is_last_step"] == given["is_last_step"][i] == t["is_last_step"][i]
        k = len(given["response_ids"][i])
        adv = t["advantages"][i][:k]
        assert md["advantage"] == (adv[0] if len(set(adv)) == 1 else adv)
    # SkyRL 0.4's step-wise advantage: the last step's row, masked by the LAST step's response length
    first = res.traces[0].metadata["advantage"]
    assert isinstance(first, list) and first.count(0.0) == len(first) - len(given["response_ids"][1])
    pad = res.traces[5]
    assert pad.metadata["extra"]["padding_row"] is True and pad.metadata["group"] == "pad0"
    assert pad.prompt_ids + pad.response_ids == res.traces[0].prompt_ids + res.traces[0].response_ids
    assert pad.response_mask == [0] * len(pad.response_ids) == [int(x) for x in t["loss_mask"][5][: len(pad.response_ids)]]


# ---- bad files ---------------------------------------------------------------------------------------


def test_a_mask_shorter_than_the_sequences_is_reported():
    t, _, n = raw_batch(MASK_SHORT)
    res = import_file(MASK_SHORT)
    assert not res.traces and [p.line for p in res.problems] == list(range(1, n + 1))
    want = f"attention_mask has {len(t['attention_mask'][0])} values for {len(t['sequences'][0])} token ids"
    assert all(want in p.reason for p in res.problems), res.problems


def test_logprobs_of_the_wrong_length_are_reported():
    t, meta, n = raw_batch(LOGPROBS_LONG)
    res = import_file(LOGPROBS_LONG)
    assert not res.traces and len(res.problems) == n
    want = f"rollout_logprobs has {meta['response_length'] + 1} values for {meta['response_length']} tokens"
    assert all(want in p.reason for p in res.problems), res.problems


def test_a_truncated_dump_is_reported(tmp_path):
    data = open(STEP3, "rb").read()
    p = tmp_path / "global_step_3_training_input.pkl"
    p.write_bytes(data[: len(data) * 2 // 3])
    assert looks_like_pickle(str(p))
    res = import_file(str(p))
    assert not res.traces and len(res.problems) == 1 and "not a readable pickle" in res.problems[0].reason


# ---- the stand-ins: only SkyRL's state, nothing else -------------------------------------------------


@pytest.fixture
def fake_skyrl(monkeypatch):
    """A class pickled under SkyRL's name (``skyrl_train.training_batch.<name>``) with the state
    given, as ``TensorBatch.__getstate__`` and ``object.__reduce_ex__`` pickle it (NEWOBJ + BUILD)."""
    mod = types.ModuleType(SKYRL_MODULE)
    monkeypatch.setitem(sys.modules, "skyrl_train", types.ModuleType("skyrl_train"))
    monkeypatch.setitem(sys.modules, SKYRL_MODULE, mod)

    def make(state, name="TrainingInputBatch", reduce=None):
        cls = type(name, (dict,), {"__module__": SKYRL_MODULE,
                                   "__reduce_ex__": lambda self, proto: reduce or (copyreg.__newobj__, (type(self),), state)})
        setattr(mod, name, cls)
        return cls()

    return make


def _state(batch_dict, metadata=None, n=1):
    return {"batch_dict": batch_dict, "batch_size": n, "device": None, "metadata": metadata or {}}


def test_a_skyrl_pickle_that_asks_for_another_global_is_refused_and_never_run(tmp_path, fake_skyrl):
    marker = tmp_path / "ran"

    class Run:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    p = tmp_path / "global_step_1_training_input.pkl"
    p.write_bytes(pickle.dumps(fake_skyrl(_state({}, {"x": Run()})), protocol=4))
    assert (SKYRL_MODULE, "TrainingInputBatch") in globals_of(p.read_bytes())
    res = import_file(str(p))
    assert not res.traces and "posix.system" in res.problems[0].reason and "was not loaded" in res.problems[0].reason
    assert not marker.exists()
    # another name in SkyRL's module is not a batch class: refused too
    p.write_bytes(pickle.dumps(fake_skyrl(_state({}), name="TensorList"), protocol=4))
    with pytest.raises(PickleRefused, match="skyrl_train.training_batch.TensorList"):
        read_pickle(str(p), max_bytes=1 << 20)


def test_skyrls_helpers_are_admitted_only_in_a_skyrl_batch(tmp_path):
    import torch

    p = tmp_path / "device.pkl"
    p.write_bytes(pickle.dumps({"d": torch.device("cpu")}, protocol=4))
    with pytest.raises(PickleRefused, match="torch.device"):
        read_pickle(str(p), max_bytes=1 << 20)
    p.write_bytes(pickle.dumps({"t": torch.zeros(2)}, protocol=4))  # a bare pickle of a tensor (not torch.save)
    with pytest.raises(PickleRefused, match="_load_from_bytes"):
        read_pickle(str(p), max_bytes=1 << 20)


def test_calling_the_batch_class_is_refused(tmp_path, fake_skyrl):
    """SkyRL's pickles build the batch with NEWOBJ; a REDUCE that calls the class is not SkyRL's."""
    obj = fake_skyrl(_state({}))
    obj.__class__.__reduce_ex__ = lambda self, proto: (type(self), ({"a": 1},))
    p = tmp_path / "call.pkl"
    p.write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(PickleRefused, match="by calling it"):
        read_pickle(str(p), max_bytes=1 << 20)


@pytest.mark.parametrize("value,expect", [
    ({"format": "numpy", "data": b"\x00" * 12, "shape": (2,), "dtype": "int64"}, "holds 12 bytes"),
    ({"format": "numpy", "data": b"\x00" * 8, "shape": (1,), "dtype": "object"}, "dtype 'object'"),
    ({"format": "numpy", "data": b"\x00" * 8, "shape": (-1,), "dtype": "int64"}, "no valid shape"),
    ("not a tensor", "not a serialised tensor"),
], ids=["short-data", "dtype", "shape", "not-a-tensor"])
def test_a_bad_tensor_in_the_state_is_refused(tmp_path, fake_skyrl, value, expect):
    p = tmp_path / "bad.pkl"
    p.write_bytes(pickle.dumps(fake_skyrl(_state({"sequences": value})), protocol=4))
    with pytest.raises(PickleRefused, match=expect):
        read_pickle(str(p), max_bytes=1 << 20)


def test_torch_format_tensors_and_kept_rewards_and_uids(tmp_path, fake_skyrl):
    """A bfloat16 column (SkyRL's ``torch.save`` fallback, read by torch's restricted loader), and
    a batch saved before SkyRL drops ``rewards`` and ``uids`` (by hand): both kept."""
    import io

    import torch

    t, meta, _ = raw_batch(STEP3)
    given = inputs(3)
    rows = 2

    def numpy_col(v, dtype):
        a = np.asarray(v, dtype=dtype)
        return {"format": "numpy", "data": a.tobytes(), "shape": a.shape, "dtype": str(a.dtype)}

    buf = io.BytesIO()
    torch.save(torch.tensor(t["returns"][:rows], dtype=torch.bfloat16), buf)
    bd = {k: numpy_col(v[:rows], np.int64 if k in ("sequences", "attention_mask", "response_mask") else np.float32)
          for k, v in t.items() if k in ("sequences", "attention_mask", "response_mask", "loss_mask", "rollout_logprobs")}
    rewards = [[0.0] * (meta["response_length"] - 1) + [float(i + 1)] for i in range(rows)]
    bd["rewards"] = numpy_col(rewards, np.float32)
    bd["values"] = {"format": "torch", "data": buf.getvalue()}
    p = tmp_path / "global_step_9_training_input.pkl"
    p.write_bytes(pickle.dumps(fake_skyrl(_state(bd, {"uids": ["u0", "u1"], "response_length": meta["response_length"]},
                                                 n=rows)), protocol=4))
    res = import_file(str(p))
    assert res.complete and len(res.traces) == rows, res.problem_lines()
    for i, tr in enumerate(res.traces):
        k = len(given["response_ids"][i])
        assert tr.response_ids == given["response_ids"][i] and tr.metadata["training_step"] == 9
        assert tr.metadata["group"] == f"u{i}" and tr.metadata["score"] == sum(rewards[i][:k])
        want = torch.tensor(t["returns"][:rows], dtype=torch.bfloat16)[i][:k].float().tolist()
        assert tr.metadata["extra"]["values"] == want
        assert tr.scorer is None  # no trainer logprobs in this batch


# ---- public mode -------------------------------------------------------------------------------------


def test_a_public_server_refuses_skyrl_dumps_before_reading_them(tmp_path, monkeypatch):
    import backend.safety.pickle_guard as guard
    from ui import trace_files
    from ui.context import AppContext, Session

    name = os.path.basename(STEP3)
    with pytest.raises(VisitorInputError, match="does not read pickles"):
        TrustPolicy(Mode.PUBLIC, "test").check_pickle(name)
    LOCAL.check_pickle(name)
    calls = []
    monkeypatch.setattr(guard, "read_pickle", lambda *a, **k: calls.append(a))
    up = tmp_path / name
    shutil.copy(STEP3, up)
    status, _ = trace_files.load_file(AppContext(trust=TrustPolicy(Mode.PUBLIC, "test")), Session(), str(up))
    assert "does not read pickles" in status and calls == []
    monkeypatch.undo()
    status, probs = trace_files.load_file(AppContext(), Session(), str(up))
    assert "4 trace(s) imported from <b>skyrl</b>" in status, status
    assert probs.empty


def test_skyrl_03_state_and_ids_outside_the_vocabulary(tmp_path, fake_skyrl):
    """skyrl-train 0.3.x pickled each tensor as ``torch.save`` bytes: read by torch's restricted
    loader; an id past the tokenizer's vocabulary is reported for its row."""
    import io

    import torch

    def saved(rows):
        buf = io.BytesIO()
        torch.save(torch.tensor(rows), buf)
        return buf.getvalue()

    bd = {"sequences": saved([[0, 9707, 13, 151645], [0, 10**7, 13, 151645]]), "attention_mask": saved([[0, 1, 1, 1]] * 2),
          "response_mask": saved([[1, 1]] * 2), "loss_mask": saved([[1.0, 1.0]] * 2)}
    p = tmp_path / "global_step_2_training_input.pkl"
    p.write_bytes(pickle.dumps(fake_skyrl(_state(bd, {"response_length": 2}, n=2)), protocol=4))
    doc = read_pickle(str(p), max_bytes=1 << 20)
    assert doc["tensors"]["sequences"] == [[0, 9707, 13, 151645], [0, 10**7, 13, 151645]]
    res = import_file(str(p))
    assert [t.prompt_ids + t.response_ids for t in res.traces] == [[9707, 13, 151645]]
    assert [p.line for p in res.problems] == [2] and "vocab" in res.problems[0].reason, res.problems
