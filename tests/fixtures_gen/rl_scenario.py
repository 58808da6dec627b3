"""The conversations the NeMo-RL, NeMo-Gym and slime fixture generators write (gen_nemo_rl.py,
gen_nemo_gym.py, gen_slime.py), as ChatML segments, and their token ids.

The ids come from the app's offline Qwen3 tokenizer (the ``qwen3`` profile), run in the app's venv
(``.venv``) by :func:`encode`: the generators' own venvs hold the trainers' packages, not ours.
Each conversation is a list of ``(kind, text)``: ``ctx`` segments are prompt or environment text
(loss mask 0), ``gen`` segments what the model generated (loss mask 1). Rewards are per sample;
samples 0-1 and 2-3 are GRPO groups (one prompt each)."""

from __future__ import annotations

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP_PY = os.path.join(ROOT, ".venv", "bin", "python")

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
WEATHER_Q = SYSTEM + "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
RESULT = '\n<|im_start|>user\n<tool_response>\n{"temp_c": 21, "sky": "clear"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
MATH_Q = SYSTEM + "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n"

SAMPLES: list[dict] = [
    {"segments": [("ctx", WEATHER_Q), ("gen", CALL), ("ctx", RESULT), ("gen", "It is 21 °C and clear in Paris.<|im_end|>")],
     "reward": 1.0},
    {"segments": [("ctx", WEATHER_Q), ("gen", "I cannot look that up.<|im_end|>")], "reward": 0.0},
    {"segments": [("ctx", MATH_Q), ("gen", "17 + 25 = 42.<|im_end|>")], "reward": 1.0},
    {"segments": [("ctx", MATH_Q), ("gen", "<think>\n17 + 25 is 32\n</think>\n\n32<|im_end|>")], "reward": 0.0},
]
GROUP_SIZE = 2


def encode(texts: list[str]) -> list[list[int]]:
    """Each text's token ids (special tokens as their ids), by the app's ``qwen3`` tokenizer."""
    code = ("import json,sys; from backend.loading.tokenizers import load_tokenizer; t=load_tokenizer('qwen3').tokenizer; "
            "print(json.dumps([t.encode(s, add_special_tokens=False) for s in json.load(sys.stdin)]))")
    out = subprocess.run([APP_PY, "-c", code], input=json.dumps(texts), capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tokenized() -> list[list[tuple[str, str, list[int]]]]:
    """Per sample: ``(kind, text, ids)`` of each segment."""
    flat = [text for s in SAMPLES for _, text in s["segments"]]
    ids = iter(encode(flat))
    return [[(kind, text, next(ids)) for kind, text in s["segments"]] for s in SAMPLES]


def logprob(i: int, salt: int = 0) -> float:
    """A made-up logprob for the ``i``-th generated token (the engine is not run)."""
    return -round(((i * 37 + salt * 11) % 97) / 61.0, 6)
