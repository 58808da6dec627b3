"""TRL GRPO completion logs (``log_completions=True``) written by TRL itself, offline.

Run (from the repository root, with the app's own venv: it pins trl, transformers and the CPU
torch; nothing else to install, see requirements-trl.txt):

    HF_HUB_OFFLINE=1 .venv/bin/python tests/fixtures_gen/gen_trl.py

Two real ``trl.GRPOTrainer`` runs of 2 steps each on CPU, with a tiny randomly initialised
``Qwen3ForCausalLM`` (2 layers, hidden size 32) and the Qwen3 tokenizer that the app builds
offline (``backend.loading.tokenizers.load_tokenizer("qwen3")``, chat template ``qwen3_instruct_2507``
from the trl wheel):

* ``tests/data/import/trl/completions/completions_0000{1,2}.parquet`` — a conversational
  dataset (prompts are message lists, one with a system prompt) and TRL's tool support
  (``GRPOTrainer(tools=[...])``): TRL parses the completions into messages with its response
  parser, calls the tools, appends ``{"role": "tool", "name", "content"}`` messages and
  generates again. Covers: one tool call; parallel calls with unicode ("Zürich", "東京"); a call
  with escaped and nested arguments (objects in an array); two tool rounds; plain answers.
* ``tests/data/import/trl/plain/completions/completions_0000{1,2}.parquet`` — a plain-text
  dataset (prompts and completions are strings); one completion holds a Hermes ``<tool_call>``.

Both runs use two reward functions (their columns: ``right_answer``, ``brevity``) and
``log_extra`` (a string column ``judge_note``), 4 prompts, 2 generations each, 2 prompts a step.

A randomly initialised model writes noise, so the model's ``generate`` is replaced by a script
(:data:`SCRIPT`: the reply for each prompt and turn, as token ids of the text a model would
write). Everything else is TRL's own: prompt rendering, response parsing, tool execution, the
reward and advantage computation, the training step (a real forward/backward over the tiny
model) and the Parquet writer (``pandas.DataFrame.to_parquet`` in ``GRPOTrainer.log``).

The tests re-state the scenario below (user texts, calls, tool results, rewards are read from
the Parquet files' own columns)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "tests", "data", "import", "trl")

# ---- the scenario ---------------------------------------------------------------------------

SYSTEM = "You are a terse assistant. Use the tools when they help."
WEATHER_Q = "What is the weather in Zürich and in 東京?"
NOTE_Q = "Save a note about the trip, then read it back."
TIME_Q = "What time is it in UTC?"
CAPITAL_Q = "What is the capital of France?"

NOTE_PATH = 'notes/a "quoted" \\ path\n.txt'
NOTE_TAGS = [{"name": "trip", "weight": 2}, {"name": "東京", "weight": 1}]

WEATHER = {"Zürich": "Zürich: 18°C, light rain", "東京": "東京: 24°C, sunny"}
NOTE_SAVED = "saved 2 tags"
NOTE_READ = "trip (2), 東京 (1)"
TIME_NOW = "2026-11-25T12:00:00Z"


def call(name: str, arguments: dict) -> str:
    """The text a Qwen3 model writes for one call (Hermes format)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# conversational prompts (each row: prompt messages, the expected answer word for the reward)
CHAT_ROWS = [
    {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_Q}], "answer": "rain"},
    {"prompt": [{"role": "user", "content": NOTE_Q}], "answer": "trip"},
    {"prompt": [{"role": "user", "content": TIME_Q}], "answer": "12:00"},
    {"prompt": [{"role": "user", "content": CAPITAL_Q}], "answer": "Paris"},
]
# the replies: user text -> [first generation's turns, second generation's turns]; a turn after a
# tool result is the next item of the same list (the second generation never calls a tool)
SCRIPT: dict[str, list[list[str]]] = {
    WEATHER_Q: [
        [call("get_weather", {"city": "Zürich"}) + "\n" + call("get_weather", {"city": "東京"}),
         "Zürich has light rain at 18°C; 東京 is sunny at 24°C."],
        ["I cannot look that up."],
    ],
    NOTE_Q: [
        [call("save_note", {"path": NOTE_PATH, "tags": NOTE_TAGS}),
         call("read_note", {"path": NOTE_PATH}),
         "Saved and read back: trip, 東京."],
        ["Done."],
    ],
    TIME_Q: [
        [call("clock", {"zone": "UTC"}), "It is 12:00 UTC."],
        ["Around noon."],
    ],
    CAPITAL_Q: [["Paris."], ["The capital of France is Paris."]],
}

# plain-text prompts (no chat template); one completion holds a Hermes tool call as text
PLAIN_ROWS = [
    {"prompt": "Q: 2 + 3 = ?\nA:", "answer": "5"},
    {"prompt": "Translate 'cat' to German:", "answer": "Katze"},
    {"prompt": "Weather in Zürich? Answer with a tool call.", "answer": "get_weather"},
    {"prompt": "Name a prime number:", "answer": "7"},
]
PLAIN_SCRIPT: dict[str, list[str]] = {
    "Q: 2 + 3 = ?\nA:": [" 5", " 6"],
    "Translate 'cat' to German:": [" Katze", " Hund"],
    "Weather in Zürich? Answer with a tool call.": [" " + call("get_weather", {"city": "Zürich"}), " It is sunny."],
    "Name a prime number:": [" 7", " 9"],
}


# the tools (TRL builds their schemas from the signatures and docstrings)
def get_weather(city: str) -> str:
    """Current weather of a city.

    Args:
        city: The city name.
    """
    return WEATHER.get(city, f"{city}: unknown")


def save_note(path: str, tags: list[dict]) -> str:
    """Save a note with tags.

    Args:
        path: Where to save it.
        tags: The tags, each an object with a name and a weight.
    """
    return NOTE_SAVED


def read_note(path: str) -> str:
    """Read a saved note.

    Args:
        path: Where it was saved.
    """
    return NOTE_READ


def clock(zone: str) -> str:
    """The current time in a time zone.

    Args:
        zone: The time zone, e.g. UTC.
    """
    return TIME_NOW


# the rewards (two functions: two columns of the log; log_extra adds a string column)
def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return " ".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def right_answer(prompts, completions, answer, log_extra=None, **kwargs):
    scores = [1.0 if a in _text(c) else 0.0 for c, a in zip(completions, answer)]
    if log_extra is not None:
        log_extra("judge_note", ["found " + a if s else "missing " + a for s, a in zip(scores, answer)])
    return scores


def brevity(prompts, completions, **kwargs):
    return [round(-len(_text(c)) / 100.0, 2) for c in completions]


# ---- the scripted model ---------------------------------------------------------------------


def scripted_model(tokenizer, plain: bool):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    eos = tokenizer.eos_token

    class Scripted(Qwen3ForCausalLM):
        def generate(self, input_ids=None, attention_mask=None, **kwargs):
            seen: dict[str, int] = {}
            replies = []
            for row, mask in zip(input_ids.tolist(), attention_mask.tolist()):
                text = tokenizer.decode([t for t, m in zip(row, mask) if m])
                if plain:
                    k = seen[text] = seen.get(text, -1) + 1
                    replies.append(PLAIN_SCRIPT[text][k] + eos)
                    continue
                user = next(q for q in SCRIPT if q in text)
                turn = text.count("<|im_start|>assistant") - 1  # the assistant turns already written
                if turn == 0:
                    k = seen[user] = seen.get(user, -1) + 1
                    replies.append(SCRIPT[user][k][0] + eos)
                else:  # after a tool result: only the first generation calls tools
                    replies.append(SCRIPT[user][0][turn] + eos)
            ids = [tokenizer.encode(r, add_special_tokens=False) for r in replies]
            width = max(len(x) for x in ids)
            pad = tokenizer.pad_token_id
            out = torch.tensor([x + [pad] * (width - len(x)) for x in ids], dtype=input_ids.dtype)
            return torch.cat([input_ids, out], dim=1)

    torch.manual_seed(0)
    return Scripted(cfg)


def run(plain: bool, dest: str) -> list[str]:
    import datasets
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from backend.loading.tokenizers import load_tokenizer

    bundle = load_tokenizer("qwen3")
    tok = bundle.tokenizer
    tok.chat_template = bundle.chat_template
    torch.manual_seed(0)
    rows = PLAIN_ROWS if plain else CHAT_ROWS
    ds = datasets.Dataset.from_list(rows)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=4, num_generations=2, max_completion_length=160,
            max_steps=2, logging_steps=1, log_completions=True, num_completions_to_print=0, report_to=[],
            save_strategy="no", use_cpu=True, seed=0, learning_rate=1e-3, bf16=False,
            beta=0.0, shuffle_dataset=False, disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=scripted_model(tok, plain), reward_funcs=[right_answer, brevity], args=args, train_dataset=ds,
            processing_class=tok, tools=None if plain else [get_weather, save_note, read_note, clock],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        src = os.path.join(tmp, "completions")
        os.makedirs(dest, exist_ok=True)
        for f in os.listdir(dest):
            if f.endswith(".parquet"):
                os.remove(os.path.join(dest, f))
        names = sorted(os.listdir(src))
        for f in names:
            shutil.copyfile(os.path.join(src, f), os.path.join(dest, f))  # the bytes TRL wrote
        return names


def main() -> None:
    import trl

    print("trl", trl.__version__)
    print("chat:", run(False, os.path.join(OUT, "completions")))
    print("plain:", run(True, os.path.join(OUT, "plain", "completions")))


if __name__ == "__main__":
    main()
