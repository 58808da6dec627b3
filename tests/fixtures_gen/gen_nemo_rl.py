"""NeMo-RL's ``train_data_step{N}.jsonl`` for the NeMo-RL importer (tests/data/import/nemo_rl/), offline.

Run (from the repository root; the venv is described in requirements-nemo-rl.txt):

    /work/fixenv/nemo/bin/python tests/fixtures_gen/gen_nemo_rl.py

NeMo-RL itself cannot run here: PyPI has only a placeholder ``nemo-rl`` 0.0.0, and its training
loop needs Ray, Megatron or DTensor workers and a GPU. So this script reproduces, with torch,
the code path that writes the file, read from NeMo-RL's source (NVIDIA-NeMo/RL at commit
7ea279abfbeb698b092856d0dab61e7cf39bc909):

* ``add_grpo_token_loss_masks_and_generation_logprobs`` (``nemo_rl/algorithms/grpo.py``): a
  generated assistant message gets ``token_loss_mask`` ones, every other message zeros and zero
  ``generation_logprobs``;
* ``batched_message_log_to_flat_message`` (``nemo_rl/data/llm_message_utils.py``): each sample's
  messages concatenated per key, tensors right-padded to the batch's longest (rounded up to
  ``make_sequence_length_divisible_by``; ``token_ids`` padded with the pad id, the rest with 0),
  ``content`` a list of the messages' texts, ``input_lengths`` the unpadded lengths;
* the GRPO step's ``log_data`` (``grpo.py``: ``content``, ``rewards``, ``input_lengths``,
  ``token_ids``, ``token_loss_mask``, ``sample_loss_mask``, ``advantages``,
  ``generation_logprobs``, ``prev_logprobs``), advantages as ``GRPOAdvantageEstimator`` makes them
  (``(reward - group mean) / (group std + eps)``, expanded over the row);
* ``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py``) with
  ``BatchedDataDict.make_microbatch_iterator(1)`` / ``slice`` (``nemo_rl/distributed/batched_data_dict.py``):
  one line per sample, each key its batch-of-one slice, tensors through ``tolist()``,
  ``json.dumps({**sample, "idx": i}, default=str)``.

Not NeMo-RL's: the generation (token ids of the scenario's text, rl_scenario.py, and made-up
logprobs) and the policy's ``prev_logprobs`` (the rollout's plus a small made-up drift, the
prompt's made up too; position 0 is 0 as NeMo-RL's ``get_logprobs`` leaves it).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_scenario import GROUP_SIZE, ROOT, SAMPLES, logprob, tokenized  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "import", "nemo_rl")
PAD_ID = 151643  # Qwen's <|endoftext|>, the tokenizer's pad token
DIVISIBLE_BY = 8
STEP = 3


def message_logs() -> list[list[dict]]:
    logs = []
    for sample in tokenized():
        log, k = [], 0
        for kind, text, ids in sample:
            msg = {"role": "assistant" if kind == "gen" else "user", "content": text, "token_ids": torch.tensor(ids)}
            if kind == "gen":
                msg["generation_logprobs"] = torch.tensor([logprob(k + j) for j in range(len(ids))], dtype=torch.float32)
                k += len(ids)
            log.append(msg)
        logs.append(log)
    return logs


def add_masks(logs: list[list[dict]]) -> None:  # add_grpo_token_loss_masks_and_generation_logprobs
    for log in logs:
        for m in log:
            if m["role"] == "assistant" and "generation_logprobs" in m:
                m["token_loss_mask"] = torch.ones_like(m["token_ids"])
            else:
                m["token_loss_mask"] = torch.zeros_like(m["token_ids"])
            if "generation_logprobs" not in m:
                m["generation_logprobs"] = torch.zeros_like(m["token_ids"], dtype=torch.float32)


def flatten(logs: list[list[dict]]) -> tuple[dict, torch.Tensor]:  # batched_message_log_to_flat_message
    flat = []
    for log in logs:
        keys = {k for m in log for k in m}
        d = {k: [m[k] for m in log if k in m] for k in keys}
        flat.append({k: torch.cat(v) if isinstance(v[0], torch.Tensor) else v for k, v in d.items()})
    max_len = max(v.size(0) for f in flat for v in f.values() if isinstance(v, torch.Tensor))
    if max_len % DIVISIBLE_BY:
        max_len = (max_len // DIVISIBLE_BY + 1) * DIVISIBLE_BY
    lengths = torch.tensor([max(v.size(0) for v in f.values() if isinstance(v, torch.Tensor)) for f in flat], dtype=torch.int32)
    out = {}
    for key in flat[0]:
        vals = [f[key] for f in flat]
        if not isinstance(vals[0], torch.Tensor):
            out[key] = vals
            continue
        pad = PAD_ID if key == "token_ids" else 0
        out[key] = torch.stack([torch.cat([t, torch.full((max_len - t.size(0),), pad, dtype=t.dtype)]) for t in vals])
    return out, lengths


def main() -> None:
    logs = message_logs()
    add_masks(logs)
    flat, input_lengths = flatten(logs)
    rewards = torch.tensor([s["reward"] for s in SAMPLES])
    grouped = rewards.view(-1, GROUP_SIZE)
    adv = ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-6)).view(-1, 1)
    mask = flat["token_loss_mask"]
    gen = flat["generation_logprobs"]
    drift = torch.tensor([[((i * 13 + b * 7) % 11 - 5) / 1000.0 for i in range(mask.size(1))] for b in range(mask.size(0))])
    prompt_lp = torch.tensor([[-((i * 29 + b) % 53) / 17.0 for i in range(mask.size(1))] for b in range(mask.size(0))])
    prev = torch.where(mask.bool(), gen + drift, prompt_lp).to(torch.float32)
    prev[:, 0] = 0.0
    positions = torch.arange(mask.size(1)).unsqueeze(0)
    prev = torch.where(positions < input_lengths.unsqueeze(1), prev, torch.zeros_like(prev))
    log_data = {
        "content": flat["content"],
        "rewards": rewards.tolist(),
        "input_lengths": input_lengths.tolist(),
        "token_ids": flat["token_ids"].tolist(),
        "token_loss_mask": mask.tolist(),
        "sample_loss_mask": torch.ones(len(SAMPLES)).tolist(),
        "advantages": adv.expand(mask.shape).tolist(),
        "generation_logprobs": gen.tolist(),
        "prev_logprobs": prev.tolist(),
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"train_data_step{STEP}.jsonl")
    with open(path, "w") as f:  # log_batched_dict_as_jsonl: make_microbatch_iterator(1) → slice(i, i + 1)
        for i in range(len(SAMPLES)):
            sample = {k: v[i : i + 1] for k, v in log_data.items()}
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
