"""tinker-cookbook RL logs written by tinker-cookbook itself (0.5.8), offline.

Run (from the repository root; the venv is described in requirements-tinker.txt):

    /work/fixenv/tinker/bin/python tests/fixtures_gen/gen_tinker.py

What an RL run of tinker-cookbook writes per iteration (``tinker_cookbook.rl.train``) is
``<log_path>/iteration_NNNNNN/``: ``train_logtree.json`` (the logtree, ``logtree.Trace.to_dict``,
written by ``TrainingRunStore.write_logtree``; the env's ``Prompt`` / ``Policy Response``
conversations as structured ``data``, its reward table, the rollout's per-trajectory tables),
``train.html`` (the same tree as HTML) and ``train_rollout_summaries.jsonl``
(``serialize_rollout_summaries``: per trajectory its group and index, rewards, metrics and each
step's observation / action lengths, no text and no token ids). No file of an RL run holds the
token ids or logprobs of the rollouts.

This script runs that code: ``rl.train._get_logtree_scope`` (the context manager ``train.py``
wraps its sampling in, which writes the HTML and, through a ``TrainingRunStore`` over
``LocalStorage``, the JSON), ``rl.rollouts.do_group_rollout`` over ``ProblemGroupBuilder`` groups
of ``ProblemEnv`` envs (the cookbook's single-turn env, subclassed as its docstring shows), with
the cookbook's ``qwen3_instruct`` and ``qwen3`` renderers, then ``serialize_rollout_summaries`` +
``store.write_rollouts`` as ``train.py`` does; the policy is the cookbook's ``TinkerTokenCompleter``
over a tinker SDK ``SamplingClient`` instrumented by ``instrument_tinker`` with a ``CaptureExporter``
/ ``JsonlFileSink``, each group run inside ``capture(run_id=..., split=..., iteration=..., group_idx=...)``.
Output: ``tests/data/import/tinker/iteration_000003/`` (``train_logtree.json``,
``train_rollout_summaries.jsonl``; the ``train.html`` it also writes is removed: not read) and
``tests/data/import/tinker/capture/sample.jsonl``.

What is not tinker's: the sampler. No Tinker service is called: the ``SamplingClient`` is made
without connecting (``object.__new__``) and its ``sample`` answers from :data:`SCRIPT` with what the
SDK's would return, a ``tinker.SampleResponse`` of one ``SampledSequence`` (the text's token ids
plus ``<|im_end|>``, made-up float32 logprobs). The Qwen3 tokenizer is the one the app builds
offline (saved by the app's venv into a temp folder, see gen_skyrl.py).

What tinker takes from the clock or a random draw is replaced afterwards by fixed values so the
files do not change from run to run: the logtree's ``started_at`` and "Generated" line, its
``path`` (an absolute path here), and each capture record's ``created_at``, ``latency_sec`` and ``seq_id``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_skyrl import load_tokenizer, qwen3_tokenizer_dir  # noqa: E402 - the shared offline tokenizer helpers

ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "import", "tinker")
ITERATION = 3

# one group each: (the cookbook renderer, question, reference answer, the scripted responses of the group's samples)
SCRIPT: list[tuple[str, str, str, list[str]]] = [
    ("qwen3_instruct", "What is 17 + 25? Put the answer in \\boxed{}.", "42",
     ["17 + 25 = 42, so the answer is \\boxed{42}.", "I think it is \\boxed{32}."]),
    ("qwen3_instruct", "What's the weather in Zürich? Use get_weather.", "get_weather",
     ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
      "I cannot check the weather."]),
    # the thinking renderer: a reasoning part, and a tool call whose JSON does not parse (an unparsed_tool_call)
    ("qwen3", "What is 6 * 7?", "42",
     ["<think>\n6 * 7 = 42.\n</think>\n\n\\boxed{42}",
      '<think>\nUse the calculator.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}\n</tool_call>']),
]


def main() -> None:
    import numpy as np
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.capture import CaptureExporter, JsonlFileSink, capture, instrument_tinker, uninstrument_tinker
    from tinker_cookbook.completers import TinkerTokenCompleter
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
    from tinker_cookbook.rl.rollout_logging import serialize_rollout_summaries
    from tinker_cookbook.rl.rollouts import do_group_rollout
    from tinker_cookbook.rl.train import _get_logtree_scope
    from tinker_cookbook.stores.storage import LocalStorage
    from tinker_cookbook.stores.training_store import TrainingRunStore
    from tinker_cookbook.utils import logtree

    tmp = tempfile.mkdtemp(prefix="gen_tinker_")
    tok = load_tokenizer(qwen3_tokenizer_dir(os.path.join(tmp, "tok")))
    made = {name: renderers.get_renderer(name, tok) for name in {row[0] for row in SCRIPT}}
    end = tok.convert_tokens_to_ids("<|im_end|>")

    class AnswerEnv(ProblemEnv):
        def __init__(self, renderer_name: str, question: str, answer: str):
            super().__init__(made[renderer_name], convo_prefix=[{"role": "system", "content": "You are a careful assistant."}])
            self.question, self.answer = question, answer

        def get_question(self) -> str:
            return self.question

        def check_answer(self, sample_str: str) -> bool:
            return self.answer in sample_str

        def check_format(self, sample_str: str) -> bool:
            return sample_str.strip() != ""

        def get_reference_answer(self) -> str:
            return self.answer

    script: list[str] = []  # the texts the group's sampling calls answer, in order
    calls = [0]

    def scripted_sample(prompt, num_samples, sampling_params, *args, **kwargs):
        """What the SDK's ``SamplingClient.sample`` returns (an awaitable ``SampleResponse``), from
        :data:`SCRIPT` instead of a Tinker server: the text's ids + ``<|im_end|>``, float32 logprobs."""
        async def response():
            ids = tok.encode(script.pop(0), add_special_tokens=False) + [end]
            calls[0] += 1
            lp = np.array([-((i * 37 + calls[0] * 11) % 97) / 61.0 for i in range(len(ids))], dtype=np.float32)
            return tinker.SampleResponse(sequences=[tinker.SampledSequence(
                stop_reason="stop", sequence_id=f"seq-{calls[0]}", tokens_np=np.array(ids, dtype=np.int32), logprobs_np=lp)])
        return response()

    client = object.__new__(tinker.SamplingClient)  # no service behind it: its sample() is the script's
    client.sample = scripted_sample
    policy = TinkerTokenCompleter(client, max_tokens=256)

    shutil.rmtree(OUT, ignore_errors=True)  # the sink and the store append: start from nothing
    out_dir = os.path.join(OUT, f"iteration_{ITERATION:06d}")
    os.makedirs(out_dir, exist_ok=True)
    store = TrainingRunStore(LocalStorage(OUT))
    exporter = CaptureExporter(JsonlFileSink(LocalStorage(OUT)))
    instrument_tinker(exporter)

    async def run() -> list:
        groups = []
        with _get_logtree_scope(output_dir=Path(out_dir), num_groups_to_log=len(SCRIPT),
                                f_name="train", scope_name=f"RL Iteration {ITERATION}", iteration=ITERATION, store=store):
            for g, (rname, question, answer, texts) in enumerate(SCRIPT):
                builder = ProblemGroupBuilder(env_thunk=lambda r=rname, q=question, a=answer: AnswerEnv(r, q, a),
                                              num_envs=len(texts), dataset_name="toy")
                script[:] = texts
                with logtree.optional_enable_logging(enable=True), capture(run_id="toy-rl", split="train", iteration=ITERATION, group_idx=g):
                    groups.append((await do_group_rollout(builder, policy), builder.logging_tags()))
        return groups

    groups = asyncio.run(run())
    uninstrument_tinker()
    exporter.wait_pending(timeout=5.0)
    exporter.shutdown()
    records = serialize_rollout_summaries(split="train", iteration=ITERATION, trajectory_groups_P=[g for g, _ in groups],
                                          taglist_P=[t for _, t in groups], sampling_client_steps_P=[ITERATION] * len(groups))
    store.write_rollouts(ITERATION, records, base_name="train")
    _fix_volatile(out_dir)
    os.remove(os.path.join(out_dir, "train.html"))  # the same tree as HTML: the importer does not read it
    _fix_capture(os.path.join(OUT, "capture", "sample.jsonl"))
    shutil.rmtree(tmp)
    for folder in (out_dir, os.path.join(OUT, "capture")):
        for name in sorted(os.listdir(folder)):
            print(os.path.join(folder, name), os.path.getsize(os.path.join(folder, name)))


_STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")


def _fix_volatile(out_dir: str) -> None:
    """Fixed values for the timestamps and the absolute output path the logtree holds."""
    path = os.path.join(out_dir, "train_logtree.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["path"] = f"iteration_{ITERATION:06d}/train.html"
    with open(path, "w", encoding="utf-8") as f:
        f.write(_STAMP.sub("2026-11-28T12:00:00", json.dumps(doc, indent=2)))


def _fix_capture(path: str) -> None:
    """Fixed values for what the capture records take from the clock (``created_at``,
    ``latency_sec``) and the random per-call ``seq_id``: the record's number."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for i, r in enumerate(records):
        r["created_at"], r["latency_sec"], r["seq_id"] = 1795867200.0 + i, 0.25, i + 1
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
