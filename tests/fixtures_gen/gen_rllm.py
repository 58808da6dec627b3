"""rLLM episodes written by rLLM's own types and writers, offline.

rLLM is not on PyPI: it is installed from its source (github.com/rllm-org/rllm, commit
9beb6e0f676a46d38858991fd79ac5f8e0b16d4c, 2026-08-15, version 0.3.0.pre) without its
dependencies; see requirements-rllm.txt. Run (from the repository root):

    /work/fixenv/rllm/bin/python tests/fixtures_gen/gen_rllm.py

The episodes are rLLM's own pydantic types (``rllm.types.Episode`` / ``Trajectory`` / ``Step``,
each step made by ``Step.from_model_output`` from an ``rllm.engine.rollout.rollout_engine.ModelOutput``
holding the call's ``prompt_ids``, ``completion_ids`` and ``logprobs``), with rewards on the steps
and trajectories, ``is_correct`` and a ``TerminationReason``. rLLM's trainer pipeline then groups
them and computes the advantages: ``transform_episodes_to_trajectory_groups`` and
``collect_reward_and_advantage_from_trajectory_groups`` (GRPO, broadcast to the steps). Files:

* ``tests/data/import/rllm/episodes/episode_00000N_<task>.json`` — rLLM's ``EvalEpisodeStore.write``
  (``Episode.model_dump(mode="json")`` plus ``eval_idx``), one file per episode, as ``rllm eval``
  saves them;
* ``tests/data/import/rllm/episodes_to_dict.jsonl`` — ``Episode.to_dict()`` of each episode (rLLM's
  other serialisation, the one ``Episode.from_dict`` reads), one per line.

Episode ids are rLLM's ``<task_id>:<rollout_idx>``. ``w`` — a tool call then an answer, two
rollouts (the second step's prompt extends the first's prompt + response); ``m`` — one-step
answers, two rollouts; ``j`` — a solver and a judge (two trajectories in one episode, as rLLM's
solver-judge flow writes them).

What is not rLLM's: the model. The replies are scripted; their ids are the text's plus the EOS
(the Qwen3 tokenizer the app builds offline, saved by the app's venv), the logprobs made up."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from gen_skyrl import call, qwen3_tokenizer_dir  # the same offline tokenizer and Hermes call text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "rllm")

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]
QUESTIONS = {"w": "What is 123 * 45? Use the calculator.", "m": "What is 9 + 10?", "j": "Name a prime number above 20."}
ANSWERS = {"w": "5535", "m": "19", "j": "23"}




# (task, rollout) -> the solver's turns
SCRIPT = {
    ("w", 0): [call("calculator", {"expr": "123 * 45"}), "123 × 45 = 5535."],
    ("w", 1): ["I think it is 5525.\n" + call("calculator", {"expr": "123*45"}), "It is 5525."],
    ("m", 0): ["19"],
    ("m", 1): ["21"],
    ("j", 0): ["23"],
}
JUDGE = "The answer 23 is prime: correct."




def model_call(tok, messages, tools, reply: str, seed: int):
    """What a vLLM rollout engine gives rLLM for one call: a ModelOutput with ids and logprobs."""
    from rllm.engine.rollout.rollout_engine import ModelOutput

    prompt_ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
    lps = [round(-0.03 * ((5 * k + seed) % 13) - 0.0002 * k, 6) for k in range(len(ids))]
    content = reply.split("<tool_call>")[0].strip() if "<tool_call>" in reply else reply
    return ModelOutput(text=tok.decode(ids, skip_special_tokens=True), content=content, reasoning="", tool_calls=None,
                       prompt_ids=list(prompt_ids), completion_ids=ids, logprobs=lps, prompt_length=len(prompt_ids),
                       completion_length=len(ids), finish_reason="stop", weight_version=7)


def solver(tok, task: str, rollout: int):
    from rllm.types import Action, Step, Trajectory

    tools = TOOLS if task == "w" else None
    messages = [{"role": "user", "content": QUESTIONS[task]}]
    steps = []
    for turn, reply in enumerate(SCRIPT[(task, rollout)]):
        mo = model_call(tok, messages, tools, reply, seed=len(steps) + 3 * rollout)
        step = Step.from_model_output(mo, messages, action=Action(action=reply))
        steps.append(step)
        messages = messages + [{"role": "assistant", "content": reply}]
        if "<tool_call>" in reply:
            messages.append({"role": "tool", "content": "5535"})
            step.observation = "5535"
    correct = ANSWERS[task] in SCRIPT[(task, rollout)][-1]
    steps[-1].reward = 1.0 if correct else 0.0
    steps[-1].done = True
    return Trajectory(name="solver", steps=steps, reward=steps[-1].reward, task={"question": QUESTIONS[task]}), correct, messages


def main() -> None:
    from rllm.eval.episode_store import EvalEpisodeStore
    from rllm.trainer.algorithms.advantage import collect_reward_and_advantage_from_trajectory_groups
    from rllm.trainer.algorithms.config import AlgorithmConfig, TransformConfig
    from rllm.trainer.algorithms.transform import transform_episodes_to_trajectory_groups
    from rllm.types import Episode, Step, Trajectory
    from rllm.workflows.workflow import TerminationReason
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir(os.path.join(tmp, "tok")))
        episodes = []
        for task, rollout in SCRIPT:
            traj, correct, messages = solver(tok, task, rollout)
            trajs = [traj]
            if task == "j":
                judge_msgs = [{"role": "user", "content": f"Question: {QUESTIONS[task]}\nAnswer: {messages[-1]['content']}\nIs it correct?"}]
                mo = model_call(tok, judge_msgs, None, JUDGE, seed=11)
                step = Step.from_model_output(mo, judge_msgs)
                step.reward, step.done = 1.0, True
                trajs.append(Trajectory(name="judge", steps=[step], reward=1.0, task={"question": QUESTIONS[task]}))
            episodes.append(Episode(id=f"{task}:{rollout}", task={"question": QUESTIONS[task], "ground_truth": ANSWERS[task]},
                                    termination_reason=TerminationReason.ENV_DONE, is_correct=correct, trajectories=trajs,
                                    metrics={"solver_acc": float(correct)}))
        groups, _ = transform_episodes_to_trajectory_groups(episodes, TransformConfig())
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig())

        shutil.rmtree(OUT, ignore_errors=True)
        store = EvalEpisodeStore(OUT)
        for i, ep in enumerate(episodes):
            print("wrote", store.write(i, ep))
        with open(os.path.join(OUT, "episodes_to_dict.jsonl"), "w", encoding="utf-8") as f:
            for ep in episodes:
                f.write(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
