"""Batch rollouts: concurrency, append-as-they-finish, resume, failures recorded as traces,
progress; with the scripted backend, and for real against the CPU vLLM OpenAI server fixture
(tiny random model; tool_choice ["required", "auto"] makes it call the tool on turn 1)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest

from backend.engine import LoopConfig
from backend.generators.base import Generation, Generator
from backend.generators.scripted import ScriptedGenerator
from backend.rollout import (
    Progress,
    RolloutError,
    RolloutItem,
    RolloutStats,
    done_ids,
    load_prompts,
    repair_partial_tail,
    run_rollouts,
)
from backend.tokenizers import load_tokenizer
from backend.trace import load_traces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
ANSWER = "It is 72°F."
WEATHER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get current temperature at a location.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]},
    },
    "mock": {"template": {"temperature": 72, "city": "{city}"}},
}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def tools():
    from backend.tools import ToolRegistry

    return ToolRegistry.from_schemas([WEATHER_SCHEMA])


def items(n, start=0):
    return [RolloutItem(id=f"p{i}", messages=[{"role": "user", "content": f"Weather #{i} in Seattle?"}]) for i in range(start, start + n)]


def run(coro):
    return asyncio.run(coro)


def scripted(bundle, script=(CALL, ANSWER), delay=0.0):
    return lambda item: ScriptedGenerator(bundle.tokenizer, list(script), token_delay_s=delay)


# ---- prompts file -------------------------------------------------------------------------------


def test_load_prompts(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}], "tag": "x"}),
                json.dumps({"prompt": "plain text"}),
                "{oops",
                json.dumps({"id": "a", "prompt": "dup id"}),
                json.dumps({"id": "b", "messages": "not a list"}),
                "",
                json.dumps([1, 2]),
            ]
        )
        + "\n"
    )
    its = load_prompts(str(p))
    assert [i.id for i in its] == ["a", "line-2", "line-3", "a~2", "b", "line-7"]
    assert its[0].metadata == {"tag": "x"} and its[1].messages == [{"role": "user", "content": "plain text"}]
    assert [i.error is not None for i in its] == [False, False, True, False, True, True]
    assert "invalid JSON" in its[2].error
    s = load_prompts(str(p), samples=2)
    assert [i.id for i in s[:4]] == ["a#0", "a#1", "line-2#0", "line-2#1"] and s[1].metadata["sample"] == 1
    with pytest.raises(RolloutError):
        load_prompts(str(tmp_path / "missing.jsonl"))


# ---- scripted backend: semantics ---------------------------------------------------------------


def test_batch_writes_every_item(tmp_path, qwen3, tools):
    out = tmp_path / "t.jsonl"
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, concurrency=3))
    res = load_traces(str(out))
    assert sorted(t.id for t in res.traces) == [f"p{i}" for i in range(6)] and not res.problems
    t = res.traces[0]
    assert t.termination_reason == "no_tool_calls" and t.metadata["source"] == "rollout" and t.metadata["prompt_id"] == t.id
    assert [s.state for s in t.steps] == ["pending", "generating", "processing_tools", "generating", "terminated"]
    d = st.to_dict()
    assert d["done"] == 6 and d["errors"] == 0 and d["termination"] == {"no_tool_calls": 6}
    assert d["generated_tokens"] == sum(sum(t.response_mask) for t in res.traces) and d["tokens_per_s"] > 0


def test_loops_really_run_concurrently_through_a_shared_generator(tmp_path, qwen3, tools):
    class Counting(Generator):
        name = "counting"

        def __init__(self):
            self.inflight = 0
            self.peak = 0
            self.eos = qwen3.tokenizer.eos_token_id

        async def generate(self, prompt_ids, params, *, on_tokens=None, constraint=None):
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            try:
                await asyncio.sleep(0.05)
                ids = qwen3.tokenizer.encode("Done.", add_special_tokens=False) + [self.eos]
                if on_tokens:
                    on_tokens(ids)
                return Generation(token_ids=ids, finish_reason="stop")
            finally:
                self.inflight -= 1

    gen = Counting()
    out = tmp_path / "t.jsonl"
    run(run_rollouts(items(12), bundle=qwen3, out_path=str(out), generator=gen, tools=tools, concurrency=4))
    assert gen.peak == 4
    assert len(load_traces(str(out)).traces) == 12


def test_traces_are_appended_as_they_finish(tmp_path, qwen3, tools):
    """A slow item does not hold back the fast ones: each trace is on disk when it finishes."""
    out = tmp_path / "t.jsonl"
    seen_on_disk = []

    def on_trace(t):
        seen_on_disk.append(sum(1 for _ in open(out)))

    def make(item):
        delay = 0.02 if item.id == "p0" else 0.0
        return ScriptedGenerator(qwen3.tokenizer, [CALL, ANSWER], token_delay_s=delay)

    run(run_rollouts(items(4), bundle=qwen3, out_path=str(out), make_generator=make, tools=tools, concurrency=4, on_trace=on_trace))
    assert seen_on_disk == [1, 2, 3, 4]  # flushed line by line
    assert [t.id for t in load_traces(str(out)).traces][-1] == "p0"


def test_resume_skips_done_ids_and_repairs_a_partial_line(tmp_path, qwen3, tools):
    out = tmp_path / "t.jsonl"
    run(run_rollouts(items(3), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, concurrency=2))
    with open(out, "a") as f:
        f.write('{"format_version":1,"id":"p3","messa')  # a crash mid-write
    assert done_ids(str(out)) == {"p0", "p1", "p2"}
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, concurrency=2))
    assert st.skipped == 3 and st.done == 3
    res = load_traces(str(out))
    assert not res.problems and sorted(t.id for t in res.traces) == [f"p{i}" for i in range(6)]
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools))
    assert st.skipped == 6 and st.done == 0
    st = run(run_rollouts(items(2), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, resume=False))
    assert st.done == 2 and len(load_traces(str(out)).traces) == 2
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    assert repair_partial_tail(str(p)) == 3 and p.read_bytes() == b""


def test_failures_become_error_traces_and_do_not_stop_the_batch(tmp_path, qwen3, tools):
    out = tmp_path / "t.jsonl"
    its = items(4) + [RolloutItem(id="bad-row", messages=None, error="line 9: invalid JSON")]

    def make(item):
        if item.id == "p1":
            raise RuntimeError("cannot build a generator for p1")
        if item.id == "p2":
            return ScriptedGenerator(qwen3.tokenizer, [CALL])  # no second turn: a generation error
        return ScriptedGenerator(qwen3.tokenizer, [CALL, ANSWER])

    st = run(run_rollouts(its, bundle=qwen3, out_path=str(out), make_generator=make, tools=tools, concurrency=2))
    by = {t.id: t for t in load_traces(str(out)).traces}
    assert set(by) == {"p0", "p1", "p2", "p3", "bad-row"}
    assert by["p1"].termination_reason == "error" and "cannot build a generator" in by["p1"].metadata["error"]
    assert "RuntimeError" in by["p1"].metadata["error_detail"] and by["p1"].messages == its[1].messages
    assert by["p2"].termination_reason == "generation_error"
    assert by["bad-row"].termination_reason == "error" and by["bad-row"].metadata["error"] == "line 9: invalid JSON"
    assert by["p0"].termination_reason == "no_tool_calls" and st.errors == 3
    # resume with retry_errors runs the three failed items again (the new trace follows the old)
    assert done_ids(str(out), retry_errors=True) == {"p0", "p3"}
    st2 = run(run_rollouts(its, bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, retry_errors=True))
    assert st2.skipped == 2 and st2.done == 3
    from backend.trace import TraceIndex

    tbl = TraceIndex.build([str(out)])
    assert tbl.open("p1").termination_reason == "no_tool_calls"  # the newest trace of an id


def test_progress_line(tmp_path, qwen3, tools):
    buf = io.StringIO()
    stats = RolloutStats()
    prog = Progress(stats, stream=buf, interval_s=0.0)
    run(run_rollouts(items(3), bundle=qwen3, out_path=str(tmp_path / "t.jsonl"), make_generator=scripted(qwen3), tools=tools, progress=prog, stats=stats))
    last = buf.getvalue().strip().splitlines()[-1]
    assert "3/3 items" in last and "items/s" in last and "tok/s" in last and "errors 0" in last


def test_bad_arguments(tmp_path, qwen3):
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "t.jsonl"), make_generator=scripted(qwen3), concurrency=0))
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "no" / "t.jsonl"), make_generator=scripted(qwen3)))
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "t.jsonl")))


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_cli_scripted(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"Weather {i}?"}) for i in range(5)) + "\n{bad\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([CALL, ANSWER]))
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([WEATHER_SCHEMA]))
    out = tmp_path / "out.jsonl"
    args = ["rollout", "--prompts", str(prompts), "--tools", str(tools_file), "--backend", "scripted", "--script", str(script),
            "--concurrency", "3", "--out", str(out), "--json"]
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["done"] == 6 and s["errors"] == 1 and s["termination"] == {"no_tool_calls": 5, "error": 1}
    assert "items/s" in r.stderr and "tok/s" in r.stderr  # the progress bar
    r = _cli(*args)
    assert json.loads(r.stdout)["skipped"] == 6
    r = _cli("rollout", "--prompts", str(tmp_path / "nope.jsonl"), "--backend", "scripted", "--script", str(script), "--out", str(out))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = _cli("rollout", "--prompts", str(prompts), "--backend", "vllm-server", "--out", str(out))
    assert r.returncode == 2 and "--server-url" in r.stderr


# ---- the real CPU vLLM OpenAI server -----------------------------------------------------------

# The server runs a tiny RANDOM model: forced by the grammar it would write a random city string
# of any length; an enum keeps the forced call within max_tokens, so the call always completes.
SERVER_SCHEMA = {**WEATHER_SCHEMA, "function": {**WEATHER_SCHEMA["function"], "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Oslo"]}}, "required": ["city"]}}}

SERVER_CFG = {
    "response_length": 320,
    "max_assistant_turns": 2,
    "tool_choice": ["required", "auto"],
    # a random model under the grammar picks short tokens: the 90-character call takes ~50-90
    "sampling": {"temperature": 0.0, "max_tokens": 128, "seed": 0},
}


@pytest.mark.vllm
@pytest.mark.slow
def test_rollout_against_the_vllm_server(vllm_server, tmp_path):
    from backend.generators.vllm_server import VLLMServerGenerator
    from backend.tools import ToolRegistry

    tools = ToolRegistry.from_schemas([SERVER_SCHEMA])
    bundle = load_tokenizer("smollm2")
    out = tmp_path / "t.jsonl"
    gen = VLLMServerGenerator([vllm_server.url])
    its = [RolloutItem(id=f"s{i}", messages=[{"role": "user", "content": f"What's the weather in city number {i}?"}]) for i in range(6)]

    async def go():
        try:
            return await run_rollouts(its, bundle=bundle, out_path=str(out), generator=gen, tools=tools, config=LoopConfig(**SERVER_CFG), concurrency=4)
        finally:
            await gen.close()

    st = run(go())
    res = load_traces(str(out))
    assert len(res.traces) == 6 and st.errors == 0, [t.metadata.get("error") for t in res.traces]
    for t in res.traces:
        gen1 = t.steps[1]
        assert gen1.state == "generating" and gen1.info.server_url == vllm_server.url
        assert gen1.tool_calls and gen1.tool_calls[0].name == "get_current_temperature"  # forced by tool_choice "required"
        assert t.steps[2].state == "processing_tools" and t.steps[2].tool_results[0].ok
        assert set(t.response_mask) == {0, 1}
    assert st.generated_tokens > 0 and st.to_dict()["tokens_per_s"] > 0


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_rollout_against_the_vllm_server_with_resume(vllm_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Weather in town {i}?"}]}) for i in range(4)) + "\n")
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([SERVER_SCHEMA]))
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(SERVER_CFG))
    out = tmp_path / "out.jsonl"
    base = ["rollout", "--prompts", str(prompts), "--tools", str(tools_file), "--backend", "vllm-server", "--server-url", vllm_server.url,
            "--tokenizer", "smollm2", "--config", str(cfg), "--concurrency", "2", "--out", str(out), "--json"]
    r = _cli(*base)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["done"] == 4 and s["errors"] == 0 and s["tokens_per_s"] > 0
    ids = [t.id for t in load_traces(str(out)).traces]
    assert sorted(ids) == ["c0", "c1", "c2", "c3"]
    prompts.write_text(prompts.read_text() + json.dumps({"id": "c4", "prompt": "Weather in Oslo?"}) + "\n")
    r = _cli(*base)
    s = json.loads(r.stdout)
    assert s["skipped"] == 4 and s["done"] == 1
    assert len(load_traces(str(out)).traces) == 5
