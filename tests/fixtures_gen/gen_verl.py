"""verl 0.9.1 rollout and validation dumps, written by verl's own writer, offline.

verl's trainer (``RayPPOTrainer``, verl/trainer/ppo/ray_trainer.py) dumps samples when
``trainer.rollout_data_dir`` (each training step, ``_log_rollout_data``) or
``trainer.validation_data_dir`` (each validation, ``_validate``) is set: ``_dump_generations``
hands the columns to ``_write_generations`` (a static method, run in a background thread), which
writes ``<dir>/<global_steps>.jsonl``. Importing that module needs torch, Ray, torchdata and a GPU
stack; so this script installs nothing of verl's dependencies: ``pip install --no-deps verl==0.9.1``
into a venv of its own (see requirements-verl.txt), and pass its ``verl`` package folder:

    python tests/fixtures_gen/gen_verl.py <venv>/lib/python3.11/site-packages/verl

The script reads ``ray_trainer.py`` from that folder, takes the ``_write_generations`` function out
of ``RayPPOTrainer`` with :mod:`ast` (unchanged, compiled alone with the ``json`` and ``os`` it
uses) and calls it with the columns its two callers compute in verl 0.9.1:

* ``inputs`` / ``outputs``: ``tokenizer.batch_decode(prompts | responses, skip_special_tokens=True)``
  of the left-padded prompt ids and right-padded response ids (the app's offline Qwen3 tokenizer,
  run with this script's interpreter: the app's venv); a tool round's response holds the tool
  result as verl's ``ToolAgentLoop`` appends it (the template's user turn around
  ``<tool_response>``);
* ``scores``: ``token_level_scores.sum(-1).tolist()``; ``gts``: each row's ``reward_model.ground_truth``;
* ``reward_extra_infos_dict``: the reward manager's extra columns (``acc``, ``pred``) and, in the
  training dump, ``request_id`` (added when the batch carries it); the validation dump's dict also
  holds ``reward`` (``_validate`` puts the scores there).

Files, in ``tests/data/import/verl/``: ``rollout/5.jsonl`` (training step 5, GRPO n=2 over two
prompts) and ``validation/5.jsonl``. What is not verl's: the model (the token ids are made from
hand-written answers) and the reward values.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "verl")
sys.path.insert(0, ROOT)

TOOLS = [{"type": "function", "function": {"name": "get_current_temperature", "description": "Get current temperature at a location.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MATH = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 17 * 3? Answer with the number."}]
WEATHER = [{"role": "user", "content": "What's the temperature in Zürich?"}]


def write_generations(verl_dir: str):
    """verl's own ``RayPPOTrainer._write_generations``, compiled from its source file alone."""
    path = os.path.join(verl_dir, "trainer", "ppo", "ray_trainer.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    fn.decorator_list = []  # @staticmethod: called as a plain function
    ns: dict = {"json": json, "os": os}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
    return ns["_write_generations"]


def tokenizer():
    from backend.loading.tokenizers import load_tokenizer

    b = load_tokenizer("qwen3")
    b.tokenizer.chat_template = b.chat_template
    return b.tokenizer


def batch(tok, rows):
    """(inputs, outputs) as ``_log_rollout_data`` decodes them: prompts left-padded, responses right-padded."""
    prompts = [tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True) for msgs, tools, _ in rows]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    responses = [tok.encode(text, add_special_tokens=False) for _, _, text in rows]
    pad = tok.pad_token_id
    lp, lr = max(map(len, prompts)), max(map(len, responses))
    prompts = [[pad] * (lp - len(p)) + p for p in prompts]
    responses = [r + [pad] * (lr - len(r)) for r in responses]
    return tok.batch_decode(prompts, skip_special_tokens=True), tok.batch_decode(responses, skip_special_tokens=True)


def main() -> None:
    write = write_generations(sys.argv[1])
    tok = tokenizer()
    call = json.dumps({"name": "get_current_temperature", "arguments": {"city": "Zürich"}}, ensure_ascii=False)
    tool_round = (f"<tool_call>\n{call}\n</tool_call><|im_end|>"
                  "<|im_start|>user\n<tool_response>\n{\"temperature\": 14, \"unit\": \"celsius\"}\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n")
    rows = [(MATH, None, "17 * 3 = 51.\n\n51<|im_end|>"), (MATH, None, "17 * 3 = 41.\n\n41<|im_end|>"),
            (WEATHER, TOOLS, tool_round + "It is 14 °C in Zürich.<|im_end|>"), (WEATHER, TOOLS, "I cannot check the weather.<|im_end|>")]
    inputs, outputs = batch(tok, rows)
    gts = ["51", "51", "14", "14"]
    scores = [1.0, 0.0, 1.0, -0.5]
    shutil.rmtree(OUT, ignore_errors=True)
    # _log_rollout_data: the reward manager's extras, then request_id from the batch's non-tensor columns
    extras = {"acc": [True, False, True, False], "pred": ["51", "41", "14", None],
              "request_id": ["req-0a", "req-0b", "req-1a", "req-1b"]}
    write(inputs, outputs, gts, scores, extras, os.path.join(OUT, "rollout"), 5)
    # _validate: reward_extra_infos_dict["reward"] holds the scores; one sample per prompt (val_kwargs.n = 1)
    val = {"reward": [scores[0], scores[3]], "acc": [True, False], "pred": ["51", None]}
    write([inputs[0], inputs[3]], [outputs[0], outputs[3]], [gts[0], gts[3]], [scores[0], scores[3]], val, os.path.join(OUT, "validation"), 5)
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    sys.exit(main())
