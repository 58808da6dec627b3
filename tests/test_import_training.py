"""Importers of training frameworks' logs: TRL GRPO completion logs (Parquet written by TRL's own
``GRPOTrainer``, tests/fixtures_gen/gen_trl.py) and SkyRL eval dumps / generator outputs (written by
skyrl-train's own ``evaluate`` + ``dump_per_dataset_eval_results``, tests/fixtures_gen/gen_skyrl.py).

The expected conversations restate the generators' scenarios; rewards, advantages, steps and the
message texts are read from the files themselves (pandas / json) as the oracle."""

from __future__ import annotations

import glob
import json
import math
import os
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
from trl_masks import generated_mask, trl_assistant_mask

from backend.importers import detect, detect_why, import_file
from backend.loading.tokenizers import load_tokenizer
from backend.trace.index import _score, training_step_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
TRL_CHAT = sorted(glob.glob(os.path.join(DATA, "trl", "completions", "completions_*.parquet")))
TRL_PLAIN = sorted(glob.glob(os.path.join(DATA, "trl", "plain", "completions", "completions_*.parquet")))
SKY_EVALS = os.path.join(DATA, "skyrl", "dumped_evals", "eval_only")
SKY_TOOLS = os.path.join(SKY_EVALS, "weather_tools.jsonl")
SKY_GSM8K = os.path.join(SKY_EVALS, "openai_gsm8k.jsonl")
SKY_AGG = os.path.join(SKY_EVALS, "aggregated_results.jsonl")
SKY_GO = os.path.join(DATA, "skyrl", "generator_output.json")

# ---- the scenarios (as the generators script them) ---------------------------------------------

SYSTEM = "You are a terse assistant. Use the tools when they help."
WEATHER_Q = "What is the weather in Zürich and in 東京?"
NOTE_Q = "Save a note about the trip, then read it back."
TIME_Q = "What time is it in UTC?"
CAPITAL_Q = "What is the capital of France?"
CITY_Q = "Is it raining in Zürich?"
NOTE_PATH = 'notes/a "quoted" \\ path\n.txt'
NOTE_TAGS = [{"name": "trip", "weight": 2}, {"name": "東京", "weight": 1}]
WEATHER_CALLS = [("get_weather", {"city": "Zürich"}), ("get_weather", {"city": "東京"})]
WEATHER_RESULTS = ["Zürich: 18°C, light rain", "東京: 24°C, sunny"]
WEATHER_ANSWER = "Zürich has light rain at 18°C; 東京 is sunny at 24°C."
NOTE_ROUNDS = [([("save_note", {"path": NOTE_PATH, "tags": NOTE_TAGS})], ["saved 2 tags"]),
               ([("read_note", {"path": NOTE_PATH})], ["trip (2), 東京 (1)"])]
NOTE_ANSWER = "Saved and read back: trip, 東京."
# TRL's parsed messages carry no call ids; the importer numbers them call_1, call_2 ...


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def calls_of(m):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]


def assert_tool_rounds(msgs, rounds, answer):
    """assistant(calls) → tool results linked by id, one round after another, then the answer."""
    i = 0
    for calls, results in rounds:
        a = msgs[i]
        assert a["role"] == "assistant" and calls_of(a) == calls
        ids = [c["id"] for c in a["tool_calls"]]
        assert len(set(ids)) == len(ids)
        for k, r in enumerate(results):
            t = msgs[i + 1 + k]
            assert t["role"] == "tool" and t["content"] == r
            assert t["tool_call_id"] == ids[k] and t["name"] == calls[k][0]
        i += 1 + len(results)
    assert msgs[i] == {"role": "assistant", "content": answer}
    assert len(msgs) == i + 1


def assert_rendered(t, bundle):
    """Rendered ids = the template's render of the messages; mask = trl's training-template mask,
    except the separator after each end-of-turn token (0: no generation has it)."""
    tok = bundle.tokenizer
    full = tok.apply_chat_template(t.messages, tools=t.tools or None, tokenize=True, return_dict=False,
                                   chat_template=bundle.chat_template)
    assert t.input_ids == list(full)
    assert t.metadata["ids"] == "rendered"
    ids, trl_mask = trl_assistant_mask(bundle, t.messages, t.tools or None)
    assert ids == t.input_ids
    assert t.full_mask == generated_mask(bundle, ids, trl_mask)


# ---- TRL ---------------------------------------------------------------------------------------


def _by_user(res):
    out = {}
    for t in res.traces:
        user = next(m["content"] for m in t.messages if m["role"] == "user")
        out.setdefault(user, []).append(t)
    return out


def test_trl_files_exist_as_trl_wrote_them():
    assert [os.path.basename(p) for p in TRL_CHAT] == ["completions_00001.parquet", "completions_00002.parquet"]
    assert [os.path.basename(p) for p in TRL_PLAIN] == ["completions_00001.parquet", "completions_00002.parquet"]
    for p in TRL_CHAT + TRL_PLAIN:
        assert os.path.getsize(p) < 200_000
        assert list(pd.read_parquet(p).columns) == ["step", "prompt", "completion", "right_answer", "brevity", "judge_note", "advantage"]


@pytest.mark.parametrize("path", TRL_CHAT + TRL_PLAIN, ids=lambda p: os.path.relpath(p, DATA))
def test_trl_rows_match_the_parquet_columns(path, qwen3):
    df = pd.read_parquet(path)  # the oracle
    res = import_file(path, "auto", tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"trl": len(df)}
    assert [t.metadata["import"]["row"] for t in res.traces] == list(range(1, len(df) + 1))
    assert len({t.id for t in res.traces}) == len(df)
    for (_, row), t in zip(df.iterrows(), res.traces):
        md = t.metadata
        assert md["training_step"] == row["step"] and training_step_of(md) == row["step"]
        assert md["rewards"] == {"right_answer": row["right_answer"], "brevity": row["brevity"]}
        assert md["score"] == pytest.approx(row["right_answer"] + row["brevity"])
        assert _score(md) == pytest.approx(row["right_answer"] + row["brevity"])
        assert md["advantage"] == row["advantage"]
        assert md["extra"] == {"judge_note": row["judge_note"]}
        assert md["provenance"] == {"format": "TRL", "library": "trl"}
        assert md["source"] == "trl"
        assert_rendered(t, qwen3)
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, str):
            assert md["conversational"] is False
            assert t.messages[0] == {"role": "user", "content": prompt}
            a = t.messages[1]
            assert len(t.messages) == 2 and a["role"] == "assistant"
            if "<tool_call>" in completion:  # the plain completion with a Hermes call in its text
                assert calls_of(a) == [("get_weather", {"city": "Zürich"})] and a["content"] == ""
            else:
                assert a == {"role": "assistant", "content": completion}
        else:
            assert md["conversational"] is True
            prompt, completion = list(prompt), list(completion)
            assert [(m["role"], m["content"]) for m in t.messages[: len(prompt)]] == [(m["role"], m["content"]) for m in prompt]
            rest = t.messages[len(prompt):]
            assert [(m["role"], m["content"]) for m in rest] == [(m["role"], m["content"]) for m in completion]


def test_trl_conversational_tool_rounds():
    res = import_file(TRL_CHAT[0], "trl", tokenizer="qwen3")
    by = _by_user(res)
    tools_first, plain_second = by[WEATHER_Q]
    assert tools_first.messages[0] == {"role": "system", "content": SYSTEM}
    assert_tool_rounds(tools_first.messages[2:], [(WEATHER_CALLS, WEATHER_RESULTS)], WEATHER_ANSWER)
    assert [c["id"] for c in tools_first.messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert plain_second.messages[2:] == [{"role": "assistant", "content": "I cannot look that up."}]
    note = by[NOTE_Q][0]
    assert_tool_rounds(note.messages[1:], NOTE_ROUNDS, NOTE_ANSWER)
    # Parquet merged every call's arguments into one struct: the null keys are not the model's
    assert note.messages[1]["tool_calls"][0]["function"]["arguments"] == {"path": NOTE_PATH, "tags": NOTE_TAGS}
    steps = [s for s in note.steps if s.state == "generating"]
    assert [[c.name for c in s.tool_calls] for s in steps] == [["save_note"], ["read_note"], []]
    step2 = _by_user(import_file(TRL_CHAT[1], "auto", tokenizer="qwen3"))
    assert_tool_rounds(step2[TIME_Q][0].messages[1:], [([("clock", {"zone": "UTC"})], ["2026-11-25T12:00:00Z"])], "It is 12:00 UTC.")
    assert [t.messages[1:] for t in step2[CAPITAL_Q]] == [[{"role": "assistant", "content": "Paris."}],
                                                          [{"role": "assistant", "content": "The capital of France is Paris."}]]


def _write_parquet(path, rows):
    pd.DataFrame(rows).to_parquet(path)  # as GRPOTrainer.log writes it


def _jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")


def test_trl_bad_rows_are_reported_with_row_numbers(tmp_path):
    ok = {"step": 3, "prompt": "Q: 1 + 1 =", "completion": " 2", "acc": 1.0, "advantage": 0.5}
    p = tmp_path / "completions_00003.parquet"
    _write_parquet(p, [ok, {**ok, "completion": None}, {**ok, "prompt": None}])
    res = import_file(str(p), "auto", tokenizer="qwen3")
    assert len(res.traces) == 1 and res.traces[0].messages[1]["content"] == " 2"
    assert res.problem_lines() == ["row 2: TRL completion row without 'completion'", "row 3: TRL completion row without 'prompt'"]

    j = tmp_path / "trl.jsonl"
    _jsonl(j, [
        ok,
        {**ok, "completion": 5},
        {**ok, "completion": ["plain text"]},
        {**ok, "prompt": [{"role": "narrator", "content": "x"}]},
        {**ok, "step": "three"},
        {**ok, "advantage": "high"},
        {**ok, "completion": []},
        '{"step": 3, "prompt": "cut',
    ])
    res = import_file(str(j), "auto", tokenizer="qwen3")
    assert len(res.traces) == 1
    lines = res.problem_lines()
    assert lines[:6] == [
        "line 2: completion must be text or a list of messages, got a number",
        "line 3: completion[0] is a string, not a message object",
        "line 4: prompt[0] has role 'narrator'; expected one of system, user, assistant, tool",
        "line 5: step must be an integer, got a string 'three'",
        "line 6: advantage must be a number, got a string",
        "line 7: completion is an empty list of messages",
    ]
    assert lines[6].startswith("line 8: ")


def test_trl_losses_nan_rewards_and_bad_arguments(tmp_path):
    row = {
        "step": 4,
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        "completion": [
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": '{"x": '}}]},
            {"role": "tool", "name": "look", "content": "a cat"},
            {"role": "tool", "name": "zoom", "content": "no such call"},
            {"role": "assistant", "content": "A cat.", "thinking": "hmm", "audio": {"id": "a1"}},
        ],
        "format_ok": float("nan"),
        "acc": 1.0,
        "advantage": 0.25,
    }
    j = tmp_path / "trl.jsonl"
    with open(j, "w", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")  # NaN as Python's json writes it
    res = import_file(str(j), "auto", tokenizer="qwen3")
    assert not res.problems and len(res.traces) == 1
    t = res.traces[0]
    assert t.metadata["rewards"] == {"format_ok": None, "acc": 1.0}
    assert t.metadata["score"] == 1.0
    assert t.messages[0] == {"role": "user", "content": "What is this?"}
    assert t.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": '  # kept raw
    assert t.messages[2]["tool_call_id"] == t.messages[1]["tool_calls"][0]["id"]
    assert t.messages[4] == {"role": "assistant", "content": "A cat.", "reasoning_content": "hmm"}  # gpt-oss's key
    gen = [s for s in t.steps if s.state == "generating"]
    assert gen[0].parse_errors and "arguments are not valid JSON" in gen[0].parse_errors[0].message
    assert [x.reason for x in res.losses] == [
        f"trace {t.id}: prompt[0].content: content part 0 (image) not carried over: it has no text",
        f"trace {t.id}: completion[3].audio: message field not carried over",
        f"trace {t.id}: completion[2]: tool result of 'zoom' answers no tool call in the row",
    ]
    assert not res.complete


# ---- SkyRL -------------------------------------------------------------------------------------


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def test_skyrl_eval_dump_tool_conversations(qwen3):
    rows = _lines(SKY_TOOLS)  # the oracle: what SkyRL's writer put in the file
    res = import_file(SKY_TOOLS, "auto", tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"skyrl": 3}
    for row, t in zip(rows, res.traces):
        md = t.metadata
        assert md["score"] == sum(row["score"]) == 1.0 and _score(md) == 1.0
        assert md["token_rewards"] == [[i, x] for i, x in enumerate(row["score"]) if x]
        assert (md["stop_reason"], md["env_class"], md["data_source"], md["env_extras"]) == (
            row["stop_reason"], row["env_class"], row["data_source"], row["env_extras"])
        assert md["input_prompt"] == row["input_prompt"] and md["output_response"] == row["output_response"]
        assert md["provenance"] == {"format": "SkyRL", "library": "skyrl-train", "data_source": "weather_tools"}
        assert md["recovered_from"] == "chatml" and "training_step" not in md  # eval_only: no step
        assert [x["function"]["name"] for x in t.tools] == ["get_weather", "save_note", "read_note"]
        assert t.messages[0] == {"role": "system", "content": SYSTEM}
        assert_rendered(t, qwen3)
    w, n, c = res.traces
    assert w.messages[1] == {"role": "user", "content": WEATHER_Q}
    assert_tool_rounds(w.messages[2:], [(WEATHER_CALLS, WEATHER_RESULTS)], WEATHER_ANSWER)
    assert_tool_rounds(n.messages[2:], NOTE_ROUNDS, NOTE_ANSWER)
    assert c.messages[2]["content"] == "Let me check."
    assert_tool_rounds(c.messages[2:], [([("get_weather", {"city": "Zürich"})], [WEATHER_RESULTS[0]])], "Yes, light rain.")


def test_skyrl_eval_dump_plain_answers_and_metrics_line():
    rows = _lines(SKY_GSM8K)
    res = import_file(SKY_GSM8K, "skyrl", tokenizer="qwen3")
    assert res.complete
    assert [t.metadata["score"] for t in res.traces] == [sum(r["score"]) for r in rows] == [1.0, 0.0]
    assert [t.messages for t in res.traces] == [
        [{"role": "user", "content": "What is 2 + 3? End with #### and the number."}, {"role": "assistant", "content": "2 + 3 = 5.\n#### 5"}],
        [{"role": "user", "content": "What is 6 * 7? End with #### and the number."}, {"role": "assistant", "content": "6 * 7 = 48.\n#### 48"}],
    ]
    assert res.traces[0].metadata["provenance"]["data_source"] == "openai/gsm8k"
    agg = import_file(SKY_AGG, "auto", tokenizer="qwen3")
    assert detect(SKY_AGG) == "skyrl" and not agg.traces
    assert agg.problem_lines() == ["line 1: SkyRL aggregated eval metrics (aggregated_results.jsonl): metrics only, no conversation to import"]


def test_skyrl_eval_dump_step_from_folder(tmp_path):
    d = tmp_path / "dumped_evals" / "global_step_7_evals"
    d.mkdir(parents=True)
    shutil.copy(SKY_GSM8K, d / "openai_gsm8k.jsonl")
    res = import_file(str(d / "openai_gsm8k.jsonl"), "auto", tokenizer="qwen3")
    assert [training_step_of(t.metadata) for t in res.traces] == [7, 7]


def test_skyrl_generator_output_keeps_ids(qwen3):
    with open(SKY_GO, encoding="utf-8") as f:
        go = json.load(f)
    res = import_file(SKY_GO, "auto", tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"skyrl": 5}
    for i, t in enumerate(res.traces):
        assert t.prompt_ids == go["prompt_token_ids"][i]
        assert t.response_ids == go["response_ids"][i]
        assert t.response_mask == go["loss_masks"][i]
        assert t.metadata["ids"] == "given" and t.metadata["mask"] == "given"
        assert t.metadata["score"] == sum(go["rewards"][i])
        assert t.metadata["stop_reason"] == go["stop_reasons"][i]
        p = len(t.prompt_ids)
        for s in t.steps:
            if s.state == "generating":
                assert s.logprobs == go["rollout_logprobs"][i][s.start - p : s.end - p]
    w = res.traces[0]
    assert w.messages[:2] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_Q}]
    assert_tool_rounds(w.messages[2:], [(WEATHER_CALLS, WEATHER_RESULTS)], WEATHER_ANSWER)
    assert_tool_rounds(res.traces[1].messages[2:], NOTE_ROUNDS, NOTE_ANSWER)
    assert res.traces[3].messages[-1] == {"role": "assistant", "content": "2 + 3 = 5.\n#### 5"}
    assert [x["function"]["name"] for x in w.tools] == ["get_weather", "save_note", "read_note"]


def test_skyrl_bad_rows(tmp_path, qwen3):
    good = _lines(SKY_GSM8K)[0]
    tok = qwen3.tokenizer
    pid = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    rid = tok.encode("hello<|im_end|>")
    j = tmp_path / "mixed.jsonl"
    _jsonl(j, [
        good,
        {**good, "input_prompt": 12},
        {**good, "score": "high"},
        {**good, "stop_reason": ["stop"]},
        {"prompt_token_ids": pid, "response_ids": rid, "loss_masks": [1], "rewards": 1.0},
        {"prompt_token_ids": [pid, pid], "response_ids": [rid, rid], "loss_masks": [[1] * len(rid)] * 2, "rewards": [1.0]},
        {"prompt_token_ids": pid, "response_ids": ["a"], "loss_masks": [1]},
        {"prompt_token_ids": pid, "response_ids": rid, "loss_mask": [1] * len(rid), "reward": 0.5, "stop_reason": "length",
         "trajectory_id": {"instance_id": "q7", "repetition_id": 2}},
        '{"input_prompt": "<|im_start|>user\\nhi',
    ])
    res = import_file(str(j), "auto", tokenizer="qwen3")
    assert res.formats == {"skyrl": 2}  # traces counted; the 7 bad records are problems
    assert [t.metadata["import"]["line"] for t in res.traces] == [1, 8]
    assert res.problem_lines()[:6] == [
        "line 2: eval dump row: 'input_prompt' must be text, got a number",
        "line 3: score must be a number or a list of numbers, got a string",
        "line 4: stop_reason must be text, got an array",
        f"line 5: loss_masks has 1 values for {len(rid)} response ids",
        "line 6: generator output: 'rewards' has 1 entries for 2 prompts",
        "line 7: response_ids must be a list of token ids (integers)",
    ]
    assert res.problem_lines()[6].startswith("line 9: ")
    last = res.traces[1]
    assert last.id == "q7_2" and last.termination_reason == "response_length" and last.metadata["score"] == 0.5
    assert last.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_skyrl_losses_outside_turns_and_unanswered_results(tmp_path):
    row = {
        "input_prompt": "BOS?<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n",
        "output_response": "Checking.<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\nSunny.<|im_end|>",
        "score": 1.0, "stop_reason": "stop", "env_class": "x", "env_extras": {}, "data_source": "d",
    }
    j = tmp_path / "d.jsonl"
    _jsonl(j, [row])
    res = import_file(str(j), "auto", tokenizer="qwen3")
    t = res.traces[0]
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert [x.reason for x in res.losses] == [
        f"trace {t.id}: input_prompt: text outside the chat turns not carried over ('BOS?')",
        f"trace {t.id}: messages[2]: tool result answers no tool call",
    ]


# ---- detection ---------------------------------------------------------------------------------


def test_detection_keeps_formats_apart():
    for p in TRL_CHAT + TRL_PLAIN:
        assert detect(p) == "trl"
        row = pq.read_table(p).slice(0, 1).to_pylist()[0]
        fmt, why, others = detect_why(row)
        assert (fmt, others) == ("trl", []) and "completion" in why
    for p in (SKY_TOOLS, SKY_GSM8K, SKY_GO):
        assert detect(p) == "skyrl"
    fmt, why, others = detect_why(_lines(SKY_TOOLS)[0])
    assert (fmt, others) == ("skyrl", []) and "input_prompt" in why
    with open(SKY_GO, encoding="utf-8") as f:
        assert detect_why(json.load(f))[::2] == ("skyrl", [])
    # verl's files keep their format, and their rows match neither TRL nor SkyRL
    for name in ("verl_agent_loop.jsonl", "verl_rollout_dump.jsonl"):
        p = os.path.join(DATA, name)
        assert detect(p) == "verl"
        for rec in _lines(p):
            fmt, _, others = detect_why(rec)  # (verl_rollout_dump.jsonl's line 3 is a broken row: no format)
            assert fmt in ("verl", None) and "trl" not in others and "skyrl" not in others
    # no other fixture file is read as TRL or SkyRL
    for p in glob.glob(os.path.join(DATA, "**", "*.*"), recursive=True):
        if os.path.isfile(p) and "/trl/" not in p and "/skyrl/" not in p and p.endswith((".json", ".jsonl", ".parquet")):
            assert detect(p) not in ("trl", "skyrl"), p
    # a prompt/completion dataset row (SFT) is not a GRPO log; verl's look-alikes are verl's
    assert detect_why({"prompt": "a", "completion": "b"})[0] is None
    assert detect_why({"input": "a", "output": "b", "score": 1.0, "step": 2})[0] == "verl"
    assert detect_why({"prompt_ids": [1], "response_ids": [2], "response_mask": [1]})[0] == "verl"


def test_trl_parquet_of_messages_with_nested_nulls(tmp_path):
    """Two rows whose calls have different argument keys: pyarrow writes one struct with both,
    nulls where a row lacks one; the importer drops them."""
    msgs = [
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": {"x": 1}}}]},
         {"role": "tool", "name": "a", "content": "1"}],
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "b", "arguments": {"y": [{"z": "é"}]}}}]},
         {"role": "tool", "name": "b", "content": "2"}],
    ]
    p = tmp_path / "completions_00009.parquet"
    # as GRPOTrainer.log writes it: pandas turns the NaN of a reward function's None into a null
    pd.DataFrame({"step": [9, 9], "prompt": [[{"role": "user", "content": "go"}]] * 2, "completion": msgs,
                  "r": [0.5, math.nan], "advantage": [1.0, -1.0]}).to_parquet(p)
    assert pq.read_table(p).column("r").null_count == 1
    res = import_file(str(p), "auto", tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert [calls_of(t.messages[1]) for t in res.traces] == [[("a", {"x": 1})], [("b", {"y": [{"z": "é"}]})]]
    assert [t.metadata.get("score") for t in res.traces] == [0.5, None]
    assert res.traces[1].metadata["rewards"] == {"r": None}


# ---- verl 0.9.1 rollout / validation dumps ------------------------------------------------------

VERL_ROLLOUT = os.path.join(DATA, "verl", "rollout", "5.jsonl")  # verl 0.9.1's own _write_generations (gen_verl.py)
VERL_VAL = os.path.join(DATA, "verl", "validation", "5.jsonl")


@pytest.mark.parametrize("path", [VERL_ROLLOUT, VERL_VAL], ids=["rollout", "validation"])
def test_verl_091_dump_imports_with_everything_kept(qwen3, path):
    rows = _lines(path)  # the oracle: what verl's writer put in the file
    assert detect(path) == "verl"
    res = import_file(path, "auto", tokenizer="qwen3")
    assert res.complete, res.problem_lines()
    assert res.formats == {"verl": len(rows)}
    for row, t in zip(rows, res.traces):
        md = t.metadata
        assert md["training_step"] == row["step"] == 5 == training_step_of(md)
        assert md["score"] == row["score"] == _score(md)
        want = {"score": row["score"], **({"reward": row["reward"]} if "reward" in row else {})}
        assert md["rewards"] == want
        assert (md["input"], md["output"], md["gts"], md["acc"]) == (row["input"], row["output"], row["gts"], row["acc"])
        assert md["record"]["pred"] == row["pred"]
        if "request_id" in row:  # the trace is named by it, and it is kept
            assert t.id == md["request_id"] == row["request_id"]
        assert "group" not in md  # verl 0.9.1 writes no uid: the group view groups by prompt
        assert md["ids"] == "rendered" and md["messages"] == "recovered"
        assert_rendered(t, qwen3)
        answer = row["output"].rsplit("assistant\n", 1)[-1]
        assert t.messages[-1] == {"role": "assistant", "content": answer}
        assert answer in qwen3.tokenizer.decode(t.response_ids)
        if "Zürich" in row["input"]:
            assert [x["function"]["name"] for x in t.tools] == ["get_current_temperature"]
    if path == VERL_ROLLOUT:
        tool = res.traces[2]
        assert [m["role"] for m in tool.messages] == ["user", "assistant", "tool", "assistant"]
        assert calls_of(tool.messages[1]) == [("get_current_temperature", {"city": "Zürich"})]
        assert json.loads(tool.messages[2]["content"]) == {"temperature": 14, "unit": "celsius"}


def test_verl_dump_uid_column_is_the_group(tmp_path):
    """A dump with a ``uid`` column (a trainer that adds it to the reward extras): the GRPO group."""
    rows = _lines(VERL_ROLLOUT)
    for i, r in enumerate(rows):
        r["uid"] = f"prompt-{i // 2}"
    p = tmp_path / "5.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    res = import_file(str(p), "verl", tokenizer="qwen3")
    assert res.complete and [t.metadata["group"] for t in res.traces] == ["prompt-0", "prompt-0", "prompt-1", "prompt-1"]


@pytest.mark.parametrize("damage, why", [
    (lambda r: r.__setitem__("score", "high"), "score must be a finite number"),
    (lambda r: r.__setitem__("step", "five"), "step must be a training step"),
    (lambda r: r.__setitem__("output", None), "needs string 'input' and 'output'"),
])
def test_verl_dump_bad_rows_are_reported(tmp_path, damage, why):
    rows = _lines(VERL_ROLLOUT)
    damage(rows[1])
    p = tmp_path / "5.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    res = import_file(str(p), "verl", tokenizer="qwen3")
    assert len(res.traces) == 3 and len(res.problems) == 1 and res.problems[0].line == 2
    assert why in res.problems[0].reason, res.problem_lines()


def test_verl_dump_truncated_line_loses_only_its_row(tmp_path):
    text = open(VERL_ROLLOUT, encoding="utf-8").read()
    p = tmp_path / "5.jsonl"
    p.write_text(text[: len(text) - 40], encoding="utf-8")  # the writer died inside the last line
    res = import_file(str(p), "auto", tokenizer="qwen3")
    assert [t.metadata["request_id"] for t in res.traces] == ["req-0a", "req-0b", "req-1a"]
    assert len(res.problems) == 1 and res.problems[0].line == 4
