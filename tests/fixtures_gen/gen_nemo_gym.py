"""NeMo-Gym ``rollouts.jsonl`` lines for the NeMo-Gym importer (tests/data/import/nemo_gym/), offline.

Run (from the repository root; the venv is described in requirements-nemo-gym.txt):

    /work/fixenv/nemo/bin/python tests/fixtures_gen/gen_nemo_gym.py

nemo-gym 0.7.0 declares Python >= 3.13 and this machine has 3.11, so its servers and
``ng_collect_rollouts`` do not run here; its models do: it is installed with ``--no-deps
--ignore-requires-python`` and the output items are built with its own pydantic classes
(``nemo_gym.openai_utils``: ``NeMoGymResponse``, ``NeMoGymResponseFunctionToolCallForTraining``,
``NeMoGymResponseOutputMessageForTraining`` — the ``TokenIDLogProbMixin`` ones that carry
``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs`` — and
``NeMoGymFunctionCallOutput``), dumped with ``model_dump(mode="json")`` and written with
``orjson.dumps`` one line each, as ``rollout_collection.py`` writes a result: the input row's
``responses_create_params``, ``agent_ref``, ``_ng_task_index``, ``_ng_rollout_index``, the
``response`` and the environment's ``reward``. The model calls are not made: their token ids are
the scenario's text tokenised (rl_scenario.py) and their logprobs made up. Each call's
``prompt_token_ids`` is everything before it, as the vLLM model server returns it.
"""

from __future__ import annotations

import json
import os
import sys

import orjson
from nemo_gym.openai_utils import (
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputText,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_scenario import GROUP_SIZE, ROOT, SAMPLES, logprob, tokenized  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "import", "nemo_gym")
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city.", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}


def user_text(text: str) -> str:
    return text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def rollout(n: int, sample: list[tuple[str, str, list[int]]], reward: float) -> dict:
    seen: list[int] = []
    items = []
    k = 0
    for j, (kind, text, ids) in enumerate(sample):
        if kind == "ctx":
            seen += ids
            if j:  # the tool's answer, as the agent sent it back
                items.append(NeMoGymFunctionCallOutput(call_id=f"call_{n}_0", output='{"temp_c": 21, "sky": "clear"}'))
            continue
        token_fields = {"prompt_token_ids": list(seen), "generation_token_ids": ids,
                        "generation_log_probs": [logprob(k + i, salt=n) for i in range(len(ids))]}
        k += len(ids)
        if text.startswith("<tool_call>"):
            items.append(NeMoGymResponseFunctionToolCallForTraining(
                arguments=json.dumps({"city": "Paris"}), call_id=f"call_{n}_0", name="get_weather", id=f"fc_{n}_0",
                status="completed", **token_fields))
        else:
            items.append(NeMoGymResponseOutputMessageForTraining(
                id=f"msg_{n}_{j}", content=[NeMoGymResponseOutputText(annotations=[], text=text.removesuffix("<|im_end|>"))],
                role="assistant", status="completed", type="message", **token_fields))
        seen += ids
    question = user_text(sample[0][1])
    params = NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": question}], tools=[TOOL])
    resp = NeMoGymResponse(id=f"resp_{n}", created_at=1767225600.0 + n, model="Qwen/Qwen3-4B-Instruct-2507", object="response",
                           output=items, parallel_tool_calls=True, tool_choice="auto", tools=[TOOL])
    return {"responses_create_params": params.model_dump(mode="json", exclude_none=True),
            "response": resp.model_dump(mode="json"), "reward": reward, "agent_ref": {"name": "simple_agent"},
            "_ng_task_index": n // GROUP_SIZE, "_ng_rollout_index": n % GROUP_SIZE}


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "rollouts.jsonl")
    with open(path, "wb") as f:
        for n, (sample, spec) in enumerate(zip(tokenized(), SAMPLES)):
            f.write(orjson.dumps(rollout(n, sample, spec["reward"])) + b"\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
