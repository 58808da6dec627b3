"""SkyRL 0.4 training-batch dumps (``trainer.dump_data_batch=true``), written by SkyRL's own code, offline.

Run (from the repository root; the venv is described in requirements-skyrl04.txt):

    /work/fixenv/skyrl/bin/python tests/fixtures_gen/gen_skyrl04.py SKYRL_TRAIN_DIR

``SKYRL_TRAIN_DIR`` is the ``skyrl-train`` folder of a copy of NovaSky-AI/SkyRL at the tag
``skyrl_train-v0.4.0`` (commit 332c7cbcc4f4fad20ca71d94c5bb33d84035da09), outside this repository
(e.g. ``git archive skyrl_train-v0.4.0 skyrl-train | tar -x -C /tmp/skyrl``): skyrl-train 0.4.0 is
not on PyPI (0.3.1 is its last release there), so its source is imported from that folder, unmodified.

What runs is SkyRL's: ``RayPPOTrainer.convert_to_training_input`` (SkyRL's padding,
``convert_prompts_responses_to_batch_tensors``: prompts padded on the LEFT, responses on the RIGHT,
and ``pad_batch`` for the data-parallel split), ``fwd_logprobs_values_reward``,
``compute_advantages_and_returns`` (GRPO, ``ppo_utils``) and ``dump_data`` (``TrainingInputBatch.save``:
a pickle of the batch, whose ``__getstate__`` stores each tensor as numpy bytes), on a trainer object
made without ``__init__`` (no Ray cluster, no GPU). Between the last two, the three lines of
``RayPPOTrainer.train`` that drop ``rewards`` and ``metadata["uids"]`` before the dump are repeated
here (they are inline in ``train``): SkyRL's dumps hold neither.

What is not SkyRL's: the models. The policy's and the reference model's forward (``dispatch.forward``)
are scripted (made-up logprobs), and the generator's output is built from
tests/fixtures_gen/rl_scenario.py (Qwen3 ids from the app's tokenizer; rollout logprobs made up).

Files (tests/data/import/skyrl/dumped_data/):

* ``global_step_3_training_input.pkl``: the 4 samples of rl_scenario (2 prompts x 2 samples, one
  multi-turn with a tool response masked 0), GRPO advantages, rollout logprobs, policy
  (``action_log_probs``) and reference (``base_action_log_probs``) logprobs, ``dp_size`` 1.
* ``global_step_4_training_input.pkl``: the same run with ``step_wise_trajectories``: one row per
  turn (5 rows), ``is_last_step``, ``metadata["trajectory_ids"]`` (``<uid>_<repetition>``), and
  ``dp_size`` 2, so ``pad_batch`` adds one padding row (a copy of row 0, uid ``pad0``).
* ``../skyrl04_inputs.json``: the generator output handed to SkyRL for each file, before SkyRL
  padded it (per row: prompt ids, response ids, loss mask, rollout logprobs, rewards, uid).
* ``bad_mask_short.pkl``, ``bad_logprobs_long.pkl``: SkyRL's ``TrainingInputBatch`` (its own
  consistency checks pass) with an ``attention_mask`` one column shorter than ``sequences``, and
  ``rollout_logprobs`` one column longer than the response: the importer must report both.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_scenario import GROUP_SIZE, ROOT, SAMPLES, logprob, tokenized  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "import", "skyrl", "dumped_data")
PAD_ID = 151643  # Qwen3's pad token, <|endoftext|>


def scripted_logprobs(batch, salt: int):
    """Stands in for a model's forward (``dispatch.forward``): one made-up logprob per response column."""
    import torch

    n, r = batch["sequences"].shape[0], batch.metadata["response_length"]
    return torch.tensor([[logprob(j, salt=i + salt) for j in range(r)] for i in range(n)], dtype=torch.float32)


def trainer(step_wise: bool, dp_size: int):
    from omegaconf import OmegaConf
    from skyrl_train.trainer import RayPPOTrainer

    cfg = OmegaConf.load(os.path.join(sys.argv[1], "skyrl_train", "config", "ppo_base_config.yaml"))
    cfg.generator.step_wise_trajectories = step_wise
    t = RayPPOTrainer.__new__(RayPPOTrainer)  # the methods below need only these attributes
    t.cfg = cfg
    t.tokenizer = SimpleNamespace(pad_token_id=PAD_ID)
    t.all_metrics, t.all_timings = {}, {}
    t.ref_model = "scripted"  # not None: the reference forward runs (has_critic: no critic model path in the config)
    t.dispatch = SimpleNamespace(
        get_lcm_dp_size=lambda: dp_size,
        forward=lambda role, data: {"output": scripted_logprobs(data, salt=3 if role == "ref" else 0)},
        empty_cache=lambda *a: None,
    )
    return t


def generator_output(step_wise: bool):
    """The GeneratorOutput SkyRL's generator would return for rl_scenario's samples (rewards on the
    last token, as SkyRL's token-level rewards are), and the uids of their prompts."""
    from skyrl_train.generators.base import TrajectoryID

    go = {"prompt_token_ids": [], "response_ids": [], "rewards": [], "loss_masks": [], "rollout_logprobs": [],
          "stop_reasons": [], "rollout_metrics": None}
    uids, traj, last = [], [], []
    for n, (segs, spec) in enumerate(zip(tokenized(), SAMPLES)):
        uid, rep = f"prompt{n // GROUP_SIZE}", n % GROUP_SIZE
        if step_wise:  # one row per generated turn: the context so far, then the turn
            ctx: list[int] = []
            turns = []
            for kind, _, ids in segs:
                if kind == "gen":
                    turns.append((list(ctx), ids))
                ctx += ids
            rows = [(p, r, [1] * len(r)) for p, r in turns]
        else:
            resp, mask = [], []
            for kind, _, ids in segs[1:]:
                resp += ids
                mask += [1 if kind == "gen" else 0] * len(ids)
            rows = [(segs[0][2], resp, mask)]
        for k, (p, r, m) in enumerate(rows):
            is_last = k == len(rows) - 1
            go["prompt_token_ids"].append(p)
            go["response_ids"].append(r)
            go["loss_masks"].append(m)
            go["rewards"].append([0.0] * (len(r) - 1) + [spec["reward"] if is_last else 0.0])
            go["rollout_logprobs"].append([logprob(j, salt=n) if x else 0.0 for j, x in enumerate(m)])
            go["stop_reasons"].append("stop")
            uids.append(uid)
            traj.append(TrajectoryID(instance_id=uid, repetition_id=rep))
            last.append(is_last)
    if step_wise:
        go["trajectory_ids"] = traj
        go["is_last_step"] = last
    return go, uids


def dump(step: int, step_wise: bool, dp_size: int, inputs: dict) -> None:
    t = trainer(step_wise, dp_size)
    t.global_step = step
    go, uids = generator_output(step_wise)
    inputs[f"global_step_{step}"] = {**{k: v for k, v in go.items() if k != "trajectory_ids"}, "uids": uids,
                                     "trajectory_ids": [x.to_string() for x in go.get("trajectory_ids") or []]}
    batch = t.convert_to_training_input(go, uids)
    batch = t.fwd_logprobs_values_reward(batch)
    batch = t.compute_advantages_and_returns(batch)
    for key in ["rewards"]:  # RayPPOTrainer.train, right after compute_advantages_and_returns
        batch.pop(key)
    batch.metadata.pop("uids")
    t.cfg.trainer.export_path = os.path.dirname(OUT)
    t.dump_data(batch, file_name=f"global_step_{step}_training_input")  # -> dumped_data/<file_name>.pkl
    print("wrote", os.path.join(OUT, f"global_step_{step}_training_input.pkl"), "keys:", sorted(batch),
          "metadata:", sorted(batch.metadata))


def bad_files() -> None:
    import torch
    from skyrl_train.training_batch import TrainingInputBatch

    go, _ = generator_output(False)
    from skyrl_train.dataset.preprocess import convert_prompts_responses_to_batch_tensors

    seq, att, resp_mask, _, loss, lps = convert_prompts_responses_to_batch_tensors(
        SimpleNamespace(pad_token_id=PAD_ID), go["prompt_token_ids"], go["response_ids"], go["rewards"],
        go["loss_masks"], go["rollout_logprobs"])
    meta = {"response_length": resp_mask.shape[1]}
    for name, tensors in (
        ("bad_mask_short", {"attention_mask": att[:, 1:]}),
        ("bad_logprobs_long", {"rollout_logprobs": torch.cat([lps, torch.full((lps.shape[0], 1), -0.5)], dim=1)}),
    ):
        b = TrainingInputBatch({"sequences": seq, "attention_mask": att, "response_mask": resp_mask, "loss_mask": loss,
                                "rollout_logprobs": lps, **tensors})
        b.metadata = dict(meta)
        b.save(os.path.join(OUT, f"{name}.pkl"))
        print("wrote", os.path.join(OUT, f"{name}.pkl"))


def main() -> None:
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "skyrl_train", "training_batch.py")):
        sys.exit(__doc__)
    sys.path.insert(0, os.path.abspath(sys.argv[1]))
    os.makedirs(OUT, exist_ok=True)
    inputs: dict = {}
    dump(3, step_wise=False, dp_size=1, inputs=inputs)
    dump(4, step_wise=True, dp_size=2, inputs=inputs)
    bad_files()
    with open(os.path.join(os.path.dirname(OUT), "skyrl04_inputs.json"), "w", encoding="utf-8") as f:
        json.dump(inputs, f)  # what was handed to SkyRL, before its padding: the tests' oracle for the unpadding
        f.write("\n")


if __name__ == "__main__":
    main()
