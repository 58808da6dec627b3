"""AReaL rollout dumps written by AReaL's own dump code (areal 1.0.4), offline.

Run (from the repository root; the venv is described in requirements-areal.txt):

    /work/fixenv/areal/bin/python tests/fixtures_gen/gen_areal.py

AReaL writes these files from ``WorkflowExecutor._dump_trajectory`` (``rollout.dump_to_file``):
one JSON line per sample of a rollout task, under ``<log path>/rollout/<tail_version>/<task_id>.jsonl``.
That method is called here as AReaL calls it, on the trajectory dict a workflow returns (padded
``input_ids``, ``loss_mask``, ``attention_mask``, ``rewards``, ``versions`` tensors), with the
executor's config (``fileroot``, ``experiment_name``, ``trial_name``, ``tokenizer_path``) — the
executor itself (its dispatcher, inference engine and threads) is not started: the method is bound
to a namespace holding what it reads (``config``, ``logger``, and AReaL's own ``_get_dump_dir`` and
``_get_tokenizer``). ``areal/__init__`` and ``areal/infra/__init__`` (Ray, schedulers, launchers)
are bypassed by registering those packages by their folders.

Files: ``tests/data/import/areal/rollout/<version>/<task_id>.jsonl`` — task 0: a tool call, the tool
turn and the answer (AReaL's multi-turn loss mask: 0 on the tool turn, so its ``prompt_len`` counts
the first turn as prompt), two samples; task 1: one-turn answers, two samples, one of them a later
policy version.

What is not AReaL's: the model. The token ids are the Qwen3 tokenizer's (the app's offline one,
saved by the app's venv) for scripted replies; the rewards are made up."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
import threading
import types

from bypass_init import register_packages
from gen_skyrl import call, qwen3_tokenizer_dir  # the same offline tokenizer and Hermes call text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "areal")

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]
Q_TOOL = "What does 'Fernweh' mean? Look it up."
Q_MATH = "What is 3 * 7?"
# task id -> (question, tools, [(turns of the sample, reward, version)])
TASKS = {
    0: (Q_TOOL, TOOLS, [([call("lookup", {"word": "Fernweh"}), "Fernweh: a longing for far-off places."], 1.0, 4),
                        ([call("lookup", {"word": "Fernweh"}), "It means homesickness."], 0.0, 4)]),
    1: (Q_MATH, None, [(["3 * 7 = 21"], 1.0, 4), (["3 * 7 = 24"], 0.0, 5)]),
}
TOOL_RESULT = "Fernweh (German): a longing for far-off places."


def load_executor():
    register_packages("areal", "infra")
    from areal.infra.workflow_executor import WorkflowExecutor

    return WorkflowExecutor


def sample(tok, question, tools, turns, version):
    """ids, loss mask and versions of one sample, as AReaL's multi-turn workflow builds them."""
    messages = [{"role": "user", "content": question}]
    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    mask = [0] * len(ids)
    for k, reply in enumerate(turns):
        if k:
            messages += [{"role": "tool", "content": TOOL_RESULT}]
            full = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
            assert full[: len(ids)] == ids
            mask += [0] * (len(full) - len(ids))
            ids = full
        out = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        ids, mask = ids + out, mask + [1] * len(out)
        messages.append({"role": "assistant", "content": reply})
    return ids, mask, [version if m else -1 for m in mask]


def main() -> None:
    import torch
    from transformers import AutoTokenizer

    WorkflowExecutor = load_executor()
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = qwen3_tokenizer_dir(os.path.join(tmp, "tok"))
        tok = AutoTokenizer.from_pretrained(tok_dir)
        config = types.SimpleNamespace(fileroot=os.path.join(tmp, "root"), experiment_name="exp", trial_name="trial",
                                       tokenizer_path=tok_dir)
        ex = types.SimpleNamespace(config=config, logger=logging.getLogger("areal-gen"), _tokenizer=None)
        ex._tokenizer_lock = threading.Lock()
        ex._get_dump_dir = WorkflowExecutor._get_dump_dir.__get__(ex)
        ex._get_tokenizer = WorkflowExecutor._get_tokenizer.__get__(ex)
        for task_id, (question, tools, samples) in TASKS.items():
            rows = [sample(tok, question, tools, turns, v) for turns, _, v in samples]
            width = max(len(r[0]) for r in rows)
            pad = tok.pad_token_id

            def padded(vals, fill):
                return torch.tensor([v + [fill] * (width - len(v)) for v in vals])

            traj = {
                "input_ids": padded([r[0] for r in rows], pad),
                "loss_mask": padded([r[1] for r in rows], 0),
                "attention_mask": padded([[1] * len(r[0]) for r in rows], 0),
                "versions": padded([r[2] for r in rows], -1),
                "rewards": torch.tensor([float(rw) for _, rw, _ in samples]),
            }
            ok, why = asyncio.run(WorkflowExecutor._dump_trajectory(ex, traj, task_id, False))
            assert ok, why
        src = os.path.join(ex._get_dump_dir(False))
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(src, os.path.join(OUT, "rollout"))  # the files AReaL wrote
        for dirpath, _, files in os.walk(OUT):
            for f in files:
                print("wrote", os.path.join(dirpath, f))


if __name__ == "__main__":
    sys.exit(main())
