"""OpenPipe ART trajectory groups written by ART's own types and serialisers, offline.

The PyPI releases of ``openpipe-art`` (0.5.x) need Python >= 3.12, which this machine does not have.
The source snapshot read here (github.com/OpenPipe/ART at 779559fd0c68ce073cbd041447f88aacf1d9f585,
2025-06-14, version 0.3.11, Requires-Python >=3.10) runs on 3.11: it is installed from that source
without its dependencies (see requirements-art.txt), and ``art/__init__`` (which imports torch,
unsloth, vLLM) is bypassed by registering the ``art`` and ``art.utils`` packages by their folders
before importing ``art.trajectories`` and ``art.utils.trajectory_logging``. Run:

    /work/fixenv/art/bin/python tests/fixtures_gen/gen_art.py

The trajectories are ART's ``Trajectory`` / ``TrajectoryGroup`` (``messages_and_choices``: message
dicts, not trained on, and openai ``Choice`` objects, the model's trainable turns, with their
logprobs; ``reward``, ``metrics``, ``metadata``, ``logs``; ``tools``). Files, in
``tests/data/import/art/``:

* ``trajectories/train/0003.yaml`` — ``serialize_trajectory_groups`` (what ``LocalBackend._log``
  writes to ``<model dir>/trajectories/<split>/<step:04d>.yaml``; the app reads it as it is, and the
  tests read it with PyYAML's own ``safe_load`` as the oracle);
* ``trajectories/train/0003.json`` — the same groups, ``trajectory_group_to_dict`` (ART's own dict
  form of that file: choices without logprobs) as JSON;
* ``model_dump.json`` — ``[group.model_dump(mode="json") ...]``, the ``trajectory_groups`` ART's
  client posts to its backend (``Backend._train_model`` / ``_log``), choices with logprobs;
* ``for_logging.jsonl`` — ``Trajectory.for_logging()`` of each trajectory: messages with
  ART's ``trainable`` flag (a Choice: true), the tools, reward, metrics, metadata, logs.

What is not ART's: the model. The choices are built by hand (text, tool calls and made-up
logprobs), as an OpenAI-compatible server would return them."""

from __future__ import annotations

import json
import os
import shutil
import sys

from bypass_init import register_packages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "art")

TOOLS = [{"type": "function", "function": {
    "name": "search_inbox", "description": "Search the inbox.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
SYSTEM = "You answer questions about the user's email. Use search_inbox."
QUESTION = "When is the 東京 offsite?"
FEW_SHOT_Q = "Who sent the budget?"
FEW_SHOT_A = "Dana sent the budget on Monday."


def load_art():
    """ART's trajectories and trajectory_logging modules, without art/__init__ (torch, unsloth)."""
    register_packages("art", "utils")
    import art.trajectories as trajectories

    sys.modules["art"].Trajectory = trajectories.Trajectory
    sys.modules["art"].TrajectoryGroup = trajectories.TrajectoryGroup
    import art.utils.trajectory_logging as logging_mod

    return trajectories, logging_mod


def choice(text: str | None, calls: list[tuple[str, str, dict]] | None = None, finish: str = "stop", seed: int = 0):
    """An openai ``Choice`` as the model server returns it (logprobs per token, made up)."""
    from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
    from openai.types.chat.chat_completion_message import ChatCompletionMessage
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

    msg: dict = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
                             for cid, n, a in calls]
    words = (text or "x").split()
    lps = ChoiceLogprobs(content=[ChatCompletionTokenLogprob(token=w, logprob=round(-0.1 * ((i + seed) % 5) - 0.01, 4),
                                                             bytes=list(w.encode()), top_logprobs=[]) for i, w in enumerate(words)])
    return Choice(finish_reason=finish, index=0, message=ChatCompletionMessage(**msg), logprobs=lps)


def main() -> None:
    T, L = load_art()
    head = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": FEW_SHOT_Q}, {"role": "assistant", "content": FEW_SHOT_A},  # few-shot: not trained on
            {"role": "user", "content": QUESTION}]
    call = [("call_a1", "search_inbox", {"query": "offsite 東京"})]
    result = {"role": "tool", "tool_call_id": "call_a1", "content": "From: Kim — The 東京 offsite is on 12 March."}
    good = T.Trajectory(messages_and_choices=[*head, choice(None, call, "tool_calls", 1), result,
                                              choice("The 東京 offsite is on 12 March.", seed=2)],
                        tools=TOOLS, reward=1.0, metrics={"correct": True, "turns": 2}, metadata={"scenario": "offsite-1"},
                        logs=["searched once"])
    bad = T.Trajectory(messages_and_choices=[*head, choice("It is in April, I think.", seed=3)],
                       tools=TOOLS, reward=-0.5, metrics={"correct": False, "turns": 1}, metadata={"scenario": "offsite-1"})
    plain = T.Trajectory(messages_and_choices=[{"role": "user", "content": "Say hi in French."}, choice("Bonjour !", seed=4)],
                         reward=0.25, metrics={}, metadata={"scenario": "greeting", "step": 3})
    groups = [T.TrajectoryGroup([good, bad], metadata={"batch": 0}), T.TrajectoryGroup([plain])]

    shutil.rmtree(OUT, ignore_errors=True)
    split = os.path.join(OUT, "trajectories", "train")
    os.makedirs(split)
    with open(os.path.join(split, "0003.yaml"), "w") as f:  # as LocalBackend._log writes it
        f.write(L.serialize_trajectory_groups(groups))
    with open(os.path.join(split, "0003.json"), "w", encoding="utf-8") as f:
        json.dump([L.trajectory_group_to_dict(g) for g in groups], f, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "model_dump.json"), "w", encoding="utf-8") as f:
        json.dump([g.model_dump(mode="json") for g in groups], f, ensure_ascii=False)
    with open(os.path.join(OUT, "for_logging.jsonl"), "w", encoding="utf-8") as f:
        for g in groups:
            for t in g.trajectories:
                f.write(json.dumps(t.for_logging(), ensure_ascii=False) + "\n")
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    sys.exit(main())
