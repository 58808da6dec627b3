"""verifiers rollout files written by verifiers itself (verifiers 0.4.0), and prime-rl token exports
built from the same episodes, offline.

Run (from the repository root; the venv is described in requirements-verifiers.txt):

    /work/fixenv/verifiers/bin/python tests/fixtures_gen/gen_verifiers.py

What is verifiers' own code here: the message graph (``verifiers.v1.graph.prepare_turn`` and
``PendingTurn.commit``, as the interception server calls them for each model request), its
``TrainClient`` (the renderer client prime-rl trains with: it renders the prompt with the
``renderers`` package's Qwen3 renderer, bridges each new turn onto the previous tokens, calls a
vLLM ``/inference/v1/generate`` endpoint and parses the reply into tool calls), ``Trace`` /
``Episode`` / ``GroupInfo`` / ``TrainRunInfo``, ``Trace.record_reward`` and two writers:

* ``tests/data/import/verifiers/traces.jsonl`` — ``verifiers.v1.utils.trace_store.write_episode``
  (the trace store of ``vf-eval`` runs: every digit kept, ``exclude_none``).
* ``tests/data/import/verifiers/run/rollouts/step_N/train/all/traces.jsonl`` — ``Episode.to_record()``
  serialised with orjson, as prime-rl's ``FileMonitor.log_episodes`` writes its run folder
  (``src/prime_rl/monitors/file.py`` at prime-rl commit 559b4477, read from source: prime-rl
  needs a GPU stack and is not installed here; the three lines that write are restated in
  :func:`write_prime_rl_rollouts`). Per-token floats rounded to 4 decimals by verifiers.

``tests/data/import/verifiers/run/token_exports/step_N/rank_R.jsonl`` are prime-rl trainer token
exports, written as ``prime_rl/trainer/rl/token_export.py`` (same commit) writes them: one record
per trained sequence with ``schema_version``, ``step``, ``rank``, ``micro_step``,
``micro_sequence_idx``, ``export_sequence_idx``, ``env_name`` and the per-token columns
(``token_ids``, ``position_ids``, ``loss_mask`` bools, ``advantages``, ``inference_logprobs``,
``trainer_logprobs``, ``entropy``, ``mismatch_kl``, ``log_importance_ratio``,
``importance_ratio``, ``prob_delta``, ``is_masked``/``_high``/``_low``, ``rl_weights``,
``ce_weights``, ``ref_kl_weights``: None columns as ``[null] * len``), ``json.dumps(...,
separators=(",", ":"), allow_nan=False)``. The sequences are verifiers' own training samples
(``Branch.token_ids``, ``Branch.sampled_mask``, ``Branch.logprobs``, ``Branch.advantages``, as
prime-rl's orchestrator takes them); the trainer's forward pass is not run (no GPU): its
logprobs are the rollout logprobs plus a small made-up drift (position 0 gets ``log(1/vocab)``,
as prime-rl's right shift pads it) and the derived columns are computed with prime-rl's formulas
in float32 (``compute_importance_ratio_and_mismatch_kl``; ``is_masked`` with the default
``dppo_mask_high``/``low`` of 0.2).

What is not verifiers': the inference engine. A loopback HTTP server (127.0.0.1, a random port)
answers ``/inference/v1/generate`` as vLLM does (completion token ids, ``logprobs.content`` with
``token_id:N`` entries, ``finish_reason``) from :data:`SCRIPT`: the reply's ids are the Qwen3
tokenizer's encoding plus ``<|im_end|>``, the logprobs made up. The tokenizer is the app's
offline Qwen3 one, saved into a temp folder by the app's venv (as gen_skyrl.py does). The tools
run here, and the rewards are this script's (exact-match on the final answer).

Scenarios (one training step, 3, on two ranks; plus a step 4 with one sample):
* ``city``: one tool call, then the answer;
* ``weather``: two parallel calls (unicode arguments and results), then the answer;
* ``note``: two tool rounds (escaped, nested arguments);
* ``math``: a group of three samples of one prompt with different rewards (1.0 / 0.0), the third
  cut by the token limit (``finish_reason`` ``length``, ``stop_condition`` ``max_output_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gen_skyrl import qwen3_tokenizer_dir  # the app's offline Qwen3 tokenizer, saved by the app's venv (this folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "verifiers")
MODEL = "Qwen/Qwen3-4B-Instruct-2507"

# ---- the scenario ---------------------------------------------------------------------------

TOOLS = [
    {"name": "get_weather", "description": "Current weather of a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "save_note", "description": "Save a note with tags.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                     "tags": {"type": "array", "items": {"type": "object"}}},
                    "required": ["path", "tags"]}},
    {"name": "read_note", "description": "Read a saved note.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
]
SYSTEM = "You are a terse assistant. Use the tools when they help."
WEATHER_Q = "What is the weather in Zürich and in 東京?"
NOTE_Q = "Save a note about the trip, then read it back."
CITY_Q = "Is it raining in Zürich?"
MATH_Q = "What is 2 + 3? End with #### and the number."
NOTE_PATH = 'notes/a "quoted" \\ path\n.txt'
NOTE_TAGS = [{"name": "trip", "weight": 2}, {"name": "東京", "weight": 1}]
WEATHER = {"Zürich": "Zürich: 18°C, light rain", "東京": "東京: 24°C, sunny"}
TOOL_RESULTS = {
    "get_weather": lambda a: WEATHER.get(a.get("city"), "unknown"),
    "save_note": lambda a: "saved 2 tags",
    "read_note": lambda a: "trip (2), 東京 (1)",
}


def call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# the model's turns per (user text, sample): a turn after tool results is the next item; a turn
# given as (text, "length") is cut there by the engine (no end-of-turn token)
SCRIPT: dict[tuple[str, int], list] = {
    (CITY_Q, 0): ["Let me check.\n" + call("get_weather", {"city": "Zürich"}), "Yes, light rain."],
    (WEATHER_Q, 0): [call("get_weather", {"city": "Zürich"}) + "\n" + call("get_weather", {"city": "東京"}),
                     "Zürich has light rain at 18°C; 東京 is sunny at 24°C."],
    (NOTE_Q, 0): [call("save_note", {"path": NOTE_PATH, "tags": NOTE_TAGS}), call("read_note", {"path": NOTE_PATH}),
                  "Saved and read back: trip, 東京."],
    (MATH_Q, 0): ["2 + 3 = 5.\n#### 5"],
    (MATH_Q, 1): ["2 + 3 = 6.\n#### 6"],
    (MATH_Q, 2): [("Let me think step by step about adding two and three", "length")],
}
# (episode name, user text, group id, sample index, ground truth, training step, rank)
EPISODES = [
    ("city", CITY_Q, "g-city", 0, "rain", 3, 0),
    ("weather", WEATHER_Q, "g-weather", 0, "sunny", 3, 0),
    ("note", NOTE_Q, "g-note", 0, "trip", 3, 1),
    ("math-0", MATH_Q, "g-math", 0, "#### 5", 3, 1),
    ("math-1", MATH_Q, "g-math", 1, "#### 5", 3, 1),
    ("math-2", MATH_Q, "g-math", 2, "#### 5", 3, 1),
    ("city-4", CITY_Q, "g-city-4", 0, "rain", 4, 0),
]


def made_up_logprob(k: int) -> float:
    return -0.013 * (k % 7) - 0.0001 * k - 0.00123456789


# ---- the scripted engine (vLLM's /inference/v1/generate) -------------------------------------


class Engine:
    """Which scripted reply a prompt gets: by the user text in it and the sample being run."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.sample: dict[str, int] = {}  # session id (the trace id) -> sample index

    def reply(self, prompt_ids: list[int], session: str) -> dict:
        text = self.tok.decode(prompt_ids)
        user = next(q for q, _ in SCRIPT if q in text)
        turn = text.count("<|im_start|>assistant") - 1
        item = SCRIPT[(user, self.sample[session])][turn]
        reply, finish = (item, "stop") if isinstance(item, str) else item
        ids = self.tok.encode(reply, add_special_tokens=False)
        if finish == "stop":
            ids.append(self.tok.convert_tokens_to_ids("<|im_end|>"))
        content = [{"token": f"token_id:{t}", "logprob": made_up_logprob(k)} for k, t in enumerate(ids)]
        return {"request_id": f"req-{session[:8]}-{turn}", "prompt_token_ids": prompt_ids,
                "choices": [{"token_ids": ids, "logprobs": {"content": content}, "finish_reason": finish}]}


def serve(engine: Engine) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # /v1/models: vLLM's model card with max_model_len
            self._send({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 8192}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(engine.reply(body["token_ids"], self.headers.get("X-Session-ID", "")))

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


# ---- verifiers -----------------------------------------------------------------------------


async def run_episode(client, engine: Engine, name: str, user: str, group: str, sample: int, truth: str, step: int):
    from verifiers.v1 import graph
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.dialects.chat import ChatDialect
    from verifiers.v1.episode import EnvInfo, Episode, GroupInfo, PolicySpan, TrainRunInfo, TrainWorkInfo
    from verifiers.v1.state import State
    from verifiers.v1.task import TaskData
    from verifiers.v1.trace import AgentInfo, ModelCall, TimeSpan, Trace, TraceTask
    from verifiers.v1.types import AssistantMessage, SamplingConfig, SystemMessage, Tool, ToolMessage, UserMessage

    class ToolTaskData(TaskData):
        question: str
        answer: str

    Data = ToolTaskData
    task = TraceTask[Data](type="ToolTask", data=Data(id=name, question=user, answer=truth), key=group)
    trace = Trace[Data, State, AgentConfig](task=task, agent=AgentInfo(config=AgentConfig(model=MODEL, max_output_tokens=12)))
    engine.sample[trace.id] = sample
    tools = [Tool(**t) for t in TOOLS]
    messages = [SystemMessage(content=SYSTEM), UserMessage(content=user)]
    sampling = SamplingConfig(temperature=1.0, max_tokens=12 if sample == 2 else 256)
    for _ in range(4):
        turn = graph.prepare_turn(trace, messages, tools)
        t0 = 1_780_000_000.0 + len(trace.calls)
        response = await client.get_response(ChatDialect(), {"model": MODEL, "messages": []}, sampling,
                                             session_id=trace.id, turn=turn)
        node = turn.commit(response)
        trace.calls.append(ModelCall(node=node, model=MODEL, endpoint="/inference/v1/generate",
                                     finish_reason=response.finish_reason, usage=response.usage,
                                     time=TimeSpan(start=t0, end=t0 + 0.25)))
        msg: AssistantMessage = response.message
        messages.append(msg)
        if response.finish_reason == "length":
            trace.stop("max_output_tokens")
            break
        if not msg.tool_calls:
            trace.stop("agent_completed")
            break
        for tc in msg.tool_calls:
            result = TOOL_RESULTS[tc.name](json.loads(tc.arguments))
            messages.append(ToolMessage(tool_call_id=tc.id, content=result, name=tc.name))
    final = messages[-1].content or "" if isinstance(messages[-1], AssistantMessage) else ""
    trace.record_reward("correct", 1.0 if truth in final else 0.0)
    trace.record_metric("num_tool_calls", sum(len(m.tool_calls or []) for m in messages if isinstance(m, AssistantMessage)))
    trace.ok = trace.stop_condition == "agent_completed"
    trace.is_completed = True
    episode = Episode[Data, State, AgentConfig](env=EnvInfo(id="weather-tools", name="weather"), task=task, group=GroupInfo(id=group),
                      run=TrainRunInfo(id="run-fixture", name="fixture",
                                       work=TrainWorkInfo(step=step, policy=PolicySpan(start=step - 1, end=step))),
                      ok=trace.ok, traces=[trace])
    return episode


def stamp_training(episodes) -> None:
    """What prime-rl's orchestrator stamps on the nodes before training (group-relative
    advantages on each sampled token) and a reference model's logprobs (made up)."""
    groups: dict[str, list] = {}
    for ep in episodes:
        groups.setdefault(ep.group.id, []).append(ep)
    for eps in groups.values():
        mean = sum(ep.traces[0].reward for ep in eps) / len(eps)
        for ep in eps:
            adv = ep.traces[0].reward - mean
            for node in ep.traces[0].nodes:
                if node.sampled:
                    n = sum(node.mask)
                    node.advantages = [adv] * n
                    node.reference_logprobs = [lp - 0.0021 * (k % 3) for k, lp in enumerate(node.logprobs)]


def write_prime_rl_rollouts(run_dir: str, episodes, step: int) -> None:
    """prime-rl's ``FileMonitor.log_episodes`` (src/prime_rl/monitors/file.py): the episodes'
    ``to_record()`` appended with orjson to ``rollouts/step_<step>/<kind>/<subset>/traces.jsonl``."""
    import orjson

    path = os.path.join(run_dir, "rollouts", f"step_{step}", "train", "all", "traces.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
    with open(path, "ab") as f:
        for episode in episodes:
            f.write(orjson.dumps(episode.to_record(), default=str, option=opts))


# ---- prime-rl's trainer token export (from source) ------------------------------------------


def _f32(values):
    import numpy as np

    return np.asarray(values, dtype=np.float32)


def _floats(arr) -> list:
    # _tensor_to_floats: float32 values as Python floats, non-finite as None
    return [float(v) if math.isfinite(float(v)) else None for v in arr.tolist()]


def token_export_record(branch, *, step: int, rank: int, micro_step: int, micro_sequence_idx: int,
                        export_sequence_idx: int, env_name: str, vocab: int) -> dict:
    import numpy as np

    ids = branch.token_ids
    mask = branch.sampled_mask
    n = len(ids)
    inf_lp = _f32(branch.logprobs)
    # the trainer's recompute (made up: the rollout's plus a drift), shifted right with log(1/vocab) at 0
    drift = np.array([0.0 if not m else 0.004 * ((k % 5) - 2) for k, m in enumerate(mask)], dtype=np.float32)
    trainer = inf_lp + drift
    trainer[0] = np.float32(math.log(1.0 / vocab))
    for k in range(1, n):
        if not mask[k]:
            trainer[k] = np.float32(-0.5 - 0.01 * (k % 9))  # prompt / tool tokens: the model's own view
    log_ratio = trainer - inf_lp
    ratio = np.exp(log_ratio)
    mismatch_kl = ratio - log_ratio - 1
    prob_delta = np.exp(trainer) - np.exp(inf_lp)
    adv = _f32(branch.advantages or [0.0] * n)
    loss_mask = np.array(mask, dtype=bool)
    invalid = np.where(adv > 0, prob_delta > 0.2, prob_delta < -0.2)
    entropy = _f32([0.1 + 0.01 * (k % 11) for k in range(n)])
    return {
        "schema_version": 1, "step": step, "rank": rank, "micro_step": micro_step,
        "micro_sequence_idx": micro_sequence_idx, "export_sequence_idx": export_sequence_idx, "env_name": env_name,
        "token_ids": [int(t) for t in ids], "position_ids": list(range(n)), "loss_mask": [bool(m) for m in mask],
        "advantages": _floats(adv), "inference_logprobs": _floats(inf_lp), "trainer_logprobs": _floats(trainer),
        "entropy": _floats(entropy), "mismatch_kl": _floats(mismatch_kl), "log_importance_ratio": _floats(log_ratio),
        "importance_ratio": _floats(ratio), "prob_delta": _floats(prob_delta),
        "is_masked": [bool(v) for v in (loss_mask & invalid)],
        "is_masked_high": [bool(v) for v in (loss_mask & (adv > 0) & (prob_delta > 0.2))],
        "is_masked_low": [bool(v) for v in (loss_mask & (adv < 0) & (prob_delta < -0.2))],
        "rl_weights": [None] * n, "ce_weights": [None] * n, "ref_kl_weights": [None] * n,
    }


def write_token_exports(run_dir: str, episodes_by_rank: dict[tuple[int, int], list], vocab: int) -> None:
    for (step, rank), eps in sorted(episodes_by_rank.items()):
        d = os.path.join(run_dir, "token_exports", f"step_{step}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"rank_{rank}.jsonl"), "w", encoding="utf-8") as f:
            for k, ep in enumerate(eps):
                branch = ep.traces[0].branches[-1]
                rec = token_export_record(branch, step=step, rank=rank, micro_step=k // 2, micro_sequence_idx=k % 2,
                                          export_sequence_idx=k, env_name=ep.env.name, vocab=vocab)
                f.write(json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n")
        with open(os.path.join(d, "STABLE"), "w"):
            pass


async def main_async() -> None:
    from renderers import Qwen3RendererConfig
    from renderers.base import load_tokenizer
    from verifiers.v1.clients.train import TrainClient
    from verifiers.v1.configs.client import TrainClientConfig
    from verifiers.v1.utils.trace_store import write_episode

    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = qwen3_tokenizer_dir(os.path.join(tmp, "tok"))
        tok = load_tokenizer(tok_dir)
        engine = Engine(tok)
        httpd = serve(engine)
        os.environ["VF_FIXTURE_KEY"] = "unused"
        client = TrainClient(TrainClientConfig(base_url=f"http://127.0.0.1:{httpd.server_port}/v1",
                                               api_key_var="VF_FIXTURE_KEY", renderer=Qwen3RendererConfig(),
                                               renderer_model_name=tok_dir))
        episodes = []
        for name, user, group, sample, truth, step, _rank in EPISODES:
            episodes.append(await run_episode(client, engine, name, user, group, sample, truth, step))
        await client.close()
        httpd.shutdown()
        stamp_training(episodes)

        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        for ep in episodes:
            write_episode(__import__("pathlib").Path(OUT), ep)  # verifiers' trace store
        run_dir = os.path.join(OUT, "run")
        for step in sorted({e[5] for e in EPISODES}):
            write_prime_rl_rollouts(run_dir, [ep for ep, e in zip(episodes, EPISODES) if e[5] == step], step)
        by_rank: dict[tuple[int, int], list] = {}
        for ep, e in zip(episodes, EPISODES):
            by_rank.setdefault((e[5], e[6]), []).append(ep)
        write_token_exports(run_dir, by_rank, len(tok))
    for dirpath, _, files in sorted(os.walk(OUT)):
        for f in sorted(files):
            print("wrote", os.path.relpath(os.path.join(dirpath, f), ROOT))


def main() -> None:
    asyncio.run(main_async())


if __name__ == "__main__":
    sys.exit(main())
