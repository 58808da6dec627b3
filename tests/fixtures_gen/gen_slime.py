"""A slime rollout dump (``--save-debug-rollout-data``) for the slime importer (tests/data/import/slime/), offline.

Run (from the repository root; the venv is described in requirements-slime.txt):

    /work/fixenv/nemo/bin/python tests/fixtures_gen/gen_slime.py

slime is not on PyPI and needs Megatron, SGLang and a GPU, so it is not installed here. This script
writes what its ``save_debug_rollout_data`` (``slime/observability/rollout_data_utils.py``, THUDM/slime
at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515) writes: ``torch.save({"rollout_id": N,
"samples": [sample.to_dict() for sample in data]}, path)``, each sample as ``Sample.to_dict()``
(``slime/utils/types.py``) leaves it: every dataclass field by name, ``status`` as its enum's value,
``spec_info`` and ``prefix_cache_info`` as their own ``to_dict()``. :func:`sample_dict` below builds
that dict with the same field names and defaults (slime's dataclass is not copied; the field list
was read from that file). ``tokens`` is prompt + response, ``response_length`` the response's
tokens, ``loss_mask`` and ``rollout_log_probs`` one per response token (0 on the tool's tokens of a
multi-turn sample), as slime's multi-turn rollouts fill them. One sample has a dict reward (a
reward model with several scores), one no loss mask (slime then trains on the whole response), and
one the SGLang top-p replay tensors (int32 tensors, as ``_merge_rollout_top_p_token_data`` keeps
them), so the file holds tensors as well as plain containers.

Also written: ``forbidden_global.pt``, a torch-format file whose pickle asks for ``os.system`` (the importer
must refuse it, naming the global, without running it), by the pickle module directly.
"""

from __future__ import annotations

import os
import pickle
import sys
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_scenario import GROUP_SIZE, ROOT, SAMPLES, logprob, tokenized  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "import", "slime")
ROLLOUT_ID = 7


def sample_dict(**kw) -> dict:
    """``Sample(**kw).to_dict()`` as slime's dataclass gives it (field names and defaults of slime/utils/types.py)."""
    d = {"group_index": None, "index": None, "rollout_id": None, "prompt": "", "tokens": [], "multimodal_inputs": None,
         "multimodal_train_inputs": None, "multimodal_train_input_id": None, "apply_chat_template_kwargs": {},
         "response": "", "response_length": 0, "label": None, "reward": None, "loss_mask": None, "weight_versions": [],
         "rollout_log_probs": None, "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None,
         "rollout_routed_experts": None, "remove_sample": False, "teacher_log_probs": None, "status": "pending",
         "metadata": {}, "generate_function_path": None, "custom_rm_path": None, "train_metadata": None,
         "session_id": None, "non_generation_time": 0.0,
         "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0, "completion_token_num": 0},
         "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0}}
    unknown = set(kw) - set(d)
    assert not unknown, unknown
    d.update(kw)
    return d


def samples() -> list[dict]:
    out = []
    for n, (segs, spec) in enumerate(zip(tokenized(), SAMPLES)):
        prompt_ids = segs[0][2]
        resp, mask = [], []
        for kind, _, ids in segs[1:]:
            resp += ids
            mask += [1 if kind == "gen" else 0] * len(ids)
        lps = [logprob(i, salt=n) if m else 0.0 for i, m in enumerate(mask)]
        text = "".join(t for _, t, _ in segs[1:])
        kw = dict(group_index=n // GROUP_SIZE, index=n, prompt=segs[0][1], tokens=prompt_ids + resp, response=text,
                  response_length=len(resp), label="21" if n < 2 else "42", reward=spec["reward"], loss_mask=mask,
                  rollout_log_probs=lps, status="completed", weight_versions=["3"],
                  metadata={"turns": sum(k == "gen" for k, _, _ in segs)},
                  prefix_cache_info={"cached_tokens": 0, "total_prompt_tokens": len(prompt_ids)})
        if n == 1:
            kw["reward"] = {"accuracy": 0.0, "format": 1.0}
        if n == 2:
            kw["loss_mask"] = None
            kw["status"] = "truncated"
        if n == 3:
            kw["rollout_top_p_token_ids"] = torch.tensor(resp[:3], dtype=torch.int32)
            kw["rollout_top_p_token_offsets"] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
        out.append(sample_dict(**kw))
    return out


class _System:
    """Pickles as a call of os.system: what a malicious .pt file asks the loader to do."""

    def __reduce__(self):
        return (os.system, ("touch ali-pickle-ran",))


def write_forbidden(path: str) -> None:
    data = pickle.dumps({"rollout_id": 0, "samples": [_System()]}, protocol=2)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:  # torch's layout: <name>/data.pkl, <name>/version
        z.writestr("forbidden_global/data.pkl", data)
        z.writestr("forbidden_global/version", "3\n")
        z.writestr("forbidden_global/byteorder", "little")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"rollout_{ROLLOUT_ID}.pt")
    torch.save({"rollout_id": ROLLOUT_ID, "samples": samples()}, path)  # save_debug_rollout_data
    write_forbidden(os.path.join(OUT, "forbidden_global.pt"))
    print("wrote", path)


if __name__ == "__main__":
    main()
