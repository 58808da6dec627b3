"""SkyRL eval dumps written by SkyRL itself (skyrl-train 0.3.1), offline.

Run (from the repository root; the venv is described in requirements-skyrl.txt):

    /work/fixenv/skyrl/bin/python tests/fixtures_gen/gen_skyrl.py

It runs SkyRL's own evaluation, ``skyrl_train.evaluate.evaluate``, with SkyRL's own
``SkyRLGymGenerator`` (the multi-turn agent loop, token in / token out, with
``use_conversation_multi_turn``), skyrl-gym environments (the built-in ``gsm8k`` one and a
small tool-calling one registered here) and ``trainer.dump_eval_results=True``, so the files are
written by SkyRL's ``dump_per_dataset_eval_results`` (one JSONL per data source, keys
``input_prompt``, ``output_response``, ``score``, ``stop_reason``, ``env_class``, ``env_extras``,
``data_source``, plus ``aggregated_results.jsonl`` with the metrics):

* ``tests/data/import/skyrl/dumped_evals/eval_only/weather_tools.jsonl`` — a system prompt
  holding Hermes ``<tools>`` (SkyRL passes no ``tools=`` to the chat template: the data carry
  them), one tool call, parallel calls with unicode, a call with escaped and nested arguments,
  two tool rounds; ``score`` is SkyRL's token-level reward list.
* ``.../openai_gsm8k.jsonl`` — plain answers scored by skyrl-gym's ``gsm8k`` env.
* ``.../aggregated_results.jsonl`` — the metrics line (no conversation).
* ``tests/data/import/skyrl/generator_output.json`` — the ``GeneratorOutput`` the generator
  returned to ``evaluate`` (``prompt_token_ids``, ``response_ids``, ``loss_masks``, ``rewards``,
  ``stop_reasons``, ``rollout_logprobs``, ``rollout_metrics``...), captured and written with
  ``json.dump``. SkyRL has no writer of its own for token-level data (``trainer.dump_data_batch``
  pickles a tensor batch): this is the dict as SkyRL builds it, one JSON document.

What is not SkyRL's: the inference engine. vLLM is replaced by a scripted client
(:class:`ScriptedEngine`, the ``generate`` of ``InferenceEngineClient``: replies from
:data:`SCRIPT`, token ids of the text plus the EOS, as vLLM returns them, and made-up logprobs).
The Qwen3 tokenizer is the one the app builds offline (saved by the app's venv into a temp
folder, with its ``qwen3_instruct_2507`` chat template).

Notes on the venv: skyrl-train 0.3.1 declares ``Requires-Python ==3.12.*`` while the CPU torch
wheel on this machine is for 3.11, so it is installed with ``--no-deps --ignore-requires-python``
and only the packages its import chain needs (no vLLM, no flash-attn)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "skyrl")
APP_PY = os.path.join(ROOT, ".venv", "bin", "python")

# ---- the scenario ---------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "save_note", "description": "Save a note with tags.",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"},
                                          "tags": {"type": "array", "items": {"type": "object"}}},
                                          "required": ["path", "tags"]}}},
    {"type": "function", "function": {"name": "read_note", "description": "Read a saved note.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]
SYSTEM_HEAD = "You are a terse assistant. Use the tools when they help."
# the tools as Qwen's template writes them into the system prompt (SkyRL's data carry them)
SYSTEM = (
    SYSTEM_HEAD + "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + "\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)
WEATHER_Q = "What is the weather in Zürich and in 東京?"
NOTE_Q = "Save a note about the trip, then read it back."
CITY_Q = "Is it raining in Zürich?"
MATH_OK_Q = "What is 2 + 3? End with #### and the number."
MATH_BAD_Q = "What is 6 * 7? End with #### and the number."

NOTE_PATH = 'notes/a "quoted" \\ path\n.txt'
NOTE_TAGS = [{"name": "trip", "weight": 2}, {"name": "東京", "weight": 1}]
WEATHER = {"Zürich": "Zürich: 18°C, light rain", "東京": "東京: 24°C, sunny"}
NOTE_SAVED = "saved 2 tags"
NOTE_READ = "trip (2), 東京 (1)"


def call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# the eval set: (uid, prompt, env_class, env_extras)
ROWS = [
    ("w1", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_Q}], "weather_tools",
     {"data_source": "weather_tools", "reward_spec": {"ground_truth": "rain"}}),
    ("w2", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": NOTE_Q}], "weather_tools",
     {"data_source": "weather_tools", "reward_spec": {"ground_truth": "trip"}}),
    ("w3", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CITY_Q}], "weather_tools",
     {"data_source": "weather_tools", "reward_spec": {"ground_truth": "rain"}}),
    ("m1", [{"role": "user", "content": MATH_OK_Q}], "gsm8k", {"data_source": "openai/gsm8k", "reward_spec": {"ground_truth": "5"}}),
    ("m2", [{"role": "user", "content": MATH_BAD_Q}], "gsm8k", {"data_source": "openai/gsm8k", "reward_spec": {"ground_truth": "42"}}),
]
# the model's turns for each user text (a turn after tool results is the next item)
SCRIPT: dict[str, list[str]] = {
    WEATHER_Q: [call("get_weather", {"city": "Zürich"}) + "\n" + call("get_weather", {"city": "東京"}),
                "Zürich has light rain at 18°C; 東京 is sunny at 24°C."],
    NOTE_Q: [call("save_note", {"path": NOTE_PATH, "tags": NOTE_TAGS}), call("read_note", {"path": NOTE_PATH}),
             "Saved and read back: trip, 東京."],
    CITY_Q: ["Let me check.\n" + call("get_weather", {"city": "Zürich"}), "Yes, light rain."],
    MATH_OK_Q: ["2 + 3 = 5.\n#### 5"],
    MATH_BAD_Q: ["6 * 7 = 48.\n#### 48"],
}
TOOL_RESULTS = {
    "get_weather": lambda a: WEATHER.get(a.get("city"), "unknown"),
    "save_note": lambda a: NOTE_SAVED,
    "read_note": lambda a: NOTE_READ,
}

# ---- SkyRL --------------------------------------------------------------------------------------


def qwen3_tokenizer_dir(tmp: str) -> str:
    """The app's offline Qwen3 tokenizer with its default chat template, saved by the app's venv."""
    code = (
        "import sys; from backend.loading.tokenizers import load_tokenizer; b = load_tokenizer('qwen3'); "
        "t = b.tokenizer; t.chat_template = b.chat_template; t.save_pretrained(sys.argv[1])"
    )
    subprocess.run([APP_PY, "-c", code, tmp], check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return tmp


def load_tokenizer(folder: str):
    """The saved tokenizer in this venv's transformers 4 (the folder is written by transformers 5)."""
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        conf = json.load(f)
    template = conf.get("chat_template")
    if template is None:
        with open(os.path.join(folder, "chat_template.jinja"), encoding="utf-8") as f:
            template = f.read()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = template
    return tok


def register_env() -> None:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    call_re = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)

    class WeatherToolsEnv(BaseTextEnv):
        """Runs the Hermes tool calls of each turn; the reward: the ground truth in the final answer."""

        def __init__(self, env_config=None, extras=None):
            super().__init__()
            extras = extras or {}
            self.max_turns = extras.get("max_turns", 4)
            self.ground_truth = extras["reward_spec"]["ground_truth"]

        def step(self, action: str) -> BaseTextEnvStepOutput:
            self.turns += 1
            calls = [json.loads(m) for m in call_re.findall(action)]
            if calls and self.turns < self.max_turns:
                obs = [{"role": "tool", "content": TOOL_RESULTS[c["name"]](c["arguments"])} for c in calls]
                return BaseTextEnvStepOutput(observations=obs, reward=0.0, done=False, metadata={})
            reward = 1.0 if self.ground_truth in action else 0.0
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})

    skyrl_gym.register(id="weather_tools", entry_point=WeatherToolsEnv)


class ScriptedEngine:
    """Stands in for ``InferenceEngineClient.generate``: vLLM's output for a prompt is the scripted
    turn's text (special tokens skipped, as vLLM detokenizes) and its ids with the EOS."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    async def generate(self, engine_input):
        out = {"responses": [], "response_ids": [], "stop_reasons": [], "response_logprobs": []}
        for ids in engine_input["prompt_token_ids"]:
            text = self.tok.decode(ids)
            user = next(q for q in SCRIPT if q in text)
            turn = text.count("<|im_start|>assistant") - 1
            reply = SCRIPT[user][turn]
            rid = self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id]
            out["responses"].append(reply)
            out["response_ids"].append(rid)
            out["stop_reasons"].append("stop")
            out["response_logprobs"].append([round(-0.01 * (k % 7) - 0.001, 4) for k in range(len(rid))])
        return out


def main() -> None:
    from omegaconf import OmegaConf
    from skyrl_train.evaluate import evaluate
    from skyrl_train.generators.skyrl_gym_generator import SkyRLGymGenerator

    register_env()
    with tempfile.TemporaryDirectory() as tmp:
        tok = load_tokenizer(qwen3_tokenizer_dir(os.path.join(tmp, "tok")))
        export = os.path.join(tmp, "export")
        cfg = OmegaConf.create({
            "trainer": {"dump_eval_results": True, "export_path": export},
            "environment": {"env_class": "gsm8k", "skyrl_gym": {"max_env_workers": 0}},
            "generator": {
                "backend": "vllm", "batched": False, "max_turns": 4, "use_conversation_multi_turn": True,
                "chat_template": {"source": "name", "name_or_path": None}, "chat_template_kwargs": {},
                "step_wise_trajectories": False, "max_input_length": 4096,
                "append_eos_token_after_stop_str_in_multi_turn": True, "zero_reward_on_non_stop": False,
                "apply_overlong_filtering": False, "eval_n_samples_per_prompt": 1,
                "sampling_params": {"max_generate_length": 256, "logprobs": 0},
                "eval_sampling_params": {"max_generate_length": 256, "repetition_penalty": 1.0, "temperature": 0.0,
                                         "top_p": 1.0, "min_p": 0.0, "top_k": -1, "logprobs": 0, "stop": None},
            },
        })
        generator = SkyRLGymGenerator(cfg.generator, cfg.environment.skyrl_gym, ScriptedEngine(tok), tok, "scripted")
        captured = []
        real_generate = generator.generate

        async def generate(batch, **kw):
            out = await real_generate(batch, disable_tqdm=True)
            captured.append(out)
            return out

        generator.generate = generate
        batches = [[{"prompt": p, "env_class": e, "env_extras": x, "uid": u} for u, p, e, x in ROWS[:3]],
                   [{"prompt": p, "env_class": e, "env_extras": x, "uid": u} for u, p, e, x in ROWS[3:]]]
        metrics = asyncio.run(evaluate(batches, generator, cfg, None, tok))
        print("metrics:", metrics)

        src = os.path.join(export, "dumped_evals", "eval_only")
        dest = os.path.join(OUT, "dumped_evals", "eval_only")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for f in sorted(os.listdir(src)):
            shutil.copyfile(os.path.join(src, f), os.path.join(dest, f))  # the bytes SkyRL wrote
            print("wrote", os.path.join(dest, f))

        from skyrl_train.generators.utils import concatenate_generator_outputs

        go = concatenate_generator_outputs(captured)
        with open(os.path.join(OUT, "generator_output.json"), "w", encoding="utf-8") as f:
            json.dump(go, f, ensure_ascii=False, default=float)
            f.write("\n")
        print("wrote", os.path.join(OUT, "generator_output.json"))


if __name__ == "__main__":
    sys.exit(main())
