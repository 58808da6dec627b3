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
from cli_inprocess import run_cli

from backend.engine import LoopConfig
from backend.generators.base import Generation, Generator
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.rollout import (
    SHARD_RE,
    Progress,
    RolloutError,
    RolloutItem,
    RolloutStats,
    done_ids,
    is_shard_dir,
    load_prompts,
    repair_partial_tail,
    run_rollouts,
)
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


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bar_on_a_terminal(tmp_path, qwen3, tools):
    """tqdm redraws in place (carriage returns) with done/total, items/s, tok/s, errors, ETA."""
    buf = _Stream(tty=True)
    stats = RolloutStats()
    prog = Progress(stats, stream=buf, interval_s=0.0)
    run(run_rollouts(items(3), bundle=qwen3, out_path=str(tmp_path / "t.jsonl"), make_generator=scripted(qwen3), tools=tools, progress=prog, stats=stats))
    text = buf.getvalue()
    assert "\r" in text and text.endswith("\n")
    last = text.rstrip("\n").split("\r")[-1]
    assert "3/3" in last and "item/s" in last and "tok/s" in last and "errors 0" in last and "<00:00" in last  # elapsed<ETA
    assert text.count("\r") >= 4  # a redraw per item


def test_progress_off_a_terminal_is_sparse_plain_lines(tmp_path, qwen3, tools):
    buf = _Stream(tty=False)
    stats = RolloutStats()
    prog = Progress(stats, stream=buf, plain_interval_s=3600)
    run(run_rollouts(items(5), bundle=qwen3, out_path=str(tmp_path / "t.jsonl"), make_generator=scripted(qwen3, delay=0.001), tools=tools,
                     progress=prog, stats=stats))
    text = buf.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text and len(lines) == 2  # the start and the end only
    assert "0/5" in lines[0] and "5/5" in lines[1] and "tok/s" in lines[1] and "errors 0" in lines[1]
    # no interval: a line at every redraw (tokens streamed, items finished), never redrawn in place
    buf = _Stream(tty=False)
    stats = RolloutStats()
    run(run_rollouts(items(4), bundle=qwen3, out_path=str(tmp_path / "t2.jsonl"), make_generator=scripted(qwen3), tools=tools,
                     progress=Progress(stats, stream=buf, plain_interval_s=0.0), stats=stats))
    lines = buf.getvalue().splitlines()
    assert len(lines) > 6 and all(line.startswith("rollout:") and "/4 [" in line for line in lines) and "4/4" in lines[-1]
    assert "\r" not in buf.getvalue()
    # disabled (tqdm's disable): nothing at all
    buf = _Stream(tty=True)
    stats = RolloutStats()
    run(run_rollouts(items(2), bundle=qwen3, out_path=str(tmp_path / "t3.jsonl"), make_generator=scripted(qwen3), tools=tools,
                     progress=Progress(stats, stream=buf, enabled=False), stats=stats))
    assert buf.getvalue() == ""


def test_bad_arguments(tmp_path, qwen3):
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "t.jsonl"), make_generator=scripted(qwen3), concurrency=0))
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "no" / "t.jsonl"), make_generator=scripted(qwen3)))
    with pytest.raises(RolloutError):
        run(run_rollouts(items(1), bundle=qwen3, out_path=str(tmp_path / "t.jsonl")))


def _cli(*args):
    return run_cli(*args)


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
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
    assert "item/s" in r.stderr and "tok/s" in r.stderr and "\r" not in r.stderr  # the progress bar: plain lines off a terminal
    assert len(r.stderr.splitlines()) == 2 and not r.stdout.count("\n") > 1  # --json alone on stdout
    r = _cli(*args)
    assert json.loads(r.stdout)["skipped"] == 6
    r = _cli("rollout", "--prompts", str(tmp_path / "nope.jsonl"), "--backend", "scripted", "--script", str(script), "--out", str(out))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = _cli("rollout", "--prompts", str(prompts), "--backend", "vllm-server", "--out", str(out))
    assert r.returncode == 2 and "--server-url" in r.stderr
    # shards: --shard-size on an existing file is refused; a folder of Parquet shards, --no-progress
    r = _cli(*args, "--shard-size", "2")
    assert r.returncode == 2 and r.stderr.startswith("error:") and "is a file" in r.stderr and "Traceback" not in r.stderr
    r = _cli(*args[:-3], "--out", str(tmp_path / "pq") + "/", "--format", "parquet", "--shard-size", "4", "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["done"] == 6 and [os.path.basename(f) for f in s["files"]] == ["part-00000.parquet", "part-00001.parquet"]
    assert "item/s" not in r.stderr
    assert sorted(folder_ids(tmp_path / "pq")) == sorted([f"q{i}" for i in range(5)] + ["line-6"])
    r = _cli(*args[:-3], "--out", str(tmp_path / "pq"), "--format", "parquet", "--shard-size", "0")
    assert r.returncode == 2 and "--shard-size" in r.stderr


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


# ---- shards: a folder of JSONL or Parquet parts, crash-safe ----------------------------------------


def shard_files(folder):
    return sorted(os.listdir(folder))


def folder_ids(folder):
    """Every trace id in the folder's shards (each file loaded by load_any, as the Trace files tab
    does; none may have a problem), in shard order."""
    from backend.importers import load_any

    ids = []
    for fn in shard_files(folder):
        assert SHARD_RE.match(fn), fn  # no temporary file, nothing else
        res = load_any(os.path.join(folder, fn))
        assert not res.problems, (fn, res.problems)
        ids += [t.id for t in res.traces]
    return ids


def test_jsonl_shards_numbering_and_resume(tmp_path, qwen3, tools):
    out = tmp_path / "run"
    st = run(run_rollouts(items(7), bundle=qwen3, out_path=str(out) + "/", make_generator=scripted(qwen3), tools=tools, shard_size=3))
    assert shard_files(out) == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    assert [len(load_traces(str(out / f)).traces) for f in shard_files(out)] == [3, 3, 1]
    assert st.files == [str(out / f) for f in shard_files(out)]
    # resume (an existing folder is a folder without the slash): the last shard, not full, continues
    with open(out / "part-00002.jsonl", "a") as f:
        f.write('{"format_version":1,"id":"p7","mess')  # a crash mid-write
    st = run(run_rollouts(items(11), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=3))
    assert st.skipped == 7 and st.done == 4
    assert shard_files(out) == [f"part-0000{i}.jsonl" for i in range(4)]
    assert sorted(folder_ids(out)) == sorted(f"p{i}" for i in range(11))
    assert [len(load_traces(str(out / f)).traces) for f in shard_files(out)] == [3, 3, 3, 2]
    # --no-resume: the shards are removed, other files kept
    (out / "notes.txt").write_text("mine")
    st = run(run_rollouts(items(2), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, resume=False))
    assert sorted(os.listdir(out)) == ["notes.txt", "part-00000.jsonl"] and st.done == 2


def test_parquet_shards_are_trace_parquet_readable_everywhere(tmp_path, qwen3, tools):
    from backend.trace import TraceIndex, is_trace_parquet

    out = tmp_path / "pq"
    st = run(run_rollouts(items(10), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=4, fmt="parquet"))
    assert shard_files(out) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"] and st.done == 10
    assert all(is_trace_parquet(str(out / f)) for f in shard_files(out))
    assert sorted(folder_ids(out)) == sorted(f"p{i}" for i in range(10))
    idx = TraceIndex.build([str(out / f) for f in shard_files(out)])  # the Trace files tab
    assert len(idx) == 10 and idx.open("p3").termination_reason == "no_tool_calls"
    # resume with more items: numbering continues (a finished Parquet shard is never reopened)
    st = run(run_rollouts(items(13), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=4, fmt="parquet"))
    assert st.skipped == 10 and st.done == 3 and shard_files(out)[-1] == "part-00003.parquet"
    assert sorted(folder_ids(out)) == sorted(f"p{i}" for i in range(13))


def test_full_parquet_shards_convert_off_the_event_loop_and_close_waits(tmp_path, qwen3, tools, monkeypatch):
    """A full shard's conversion runs on a worker thread (the loop keeps generating meanwhile);
    the run ends only once every shard is Parquet; a conversion that fails fails the run."""
    import threading

    import backend.rollout as ro

    real = ro.convert_journal
    threads = []

    def spy(journal, target, keep=None):
        threads.append(threading.current_thread().name)
        return real(journal, target, keep)

    monkeypatch.setattr(ro, "convert_journal", spy)
    out = tmp_path / "pq"
    st = run(run_rollouts(items(9), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=4, fmt="parquet"))
    assert st.done == 9 and shard_files(out) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert sorted(folder_ids(out)) == sorted(f"p{i}" for i in range(9))
    # the two full shards on the converter thread, the last (partial) one at close
    assert sorted(t.startswith("shard-convert") for t in threads) == [False, True, True], threads

    def broken(journal, target, keep=None):
        raise OSError("disk full")

    monkeypatch.setattr(ro, "convert_journal", broken)
    out2 = tmp_path / "pq2"
    with pytest.raises(OSError, match="disk full"):
        run(run_rollouts(items(5), bundle=qwen3, out_path=str(out2), make_generator=scripted(qwen3), tools=tools, shard_size=4, fmt="parquet"))
    # nothing lost: the journals are still there for a resume to convert
    monkeypatch.setattr(ro, "convert_journal", real)
    st = run(run_rollouts(items(5), bundle=qwen3, out_path=str(out2), make_generator=scripted(qwen3), tools=tools, shard_size=4, fmt="parquet"))
    assert st.skipped == 5 and sorted(folder_ids(out2)) == sorted(f"p{i}" for i in range(5))


def test_retry_errors_across_shards(tmp_path, qwen3, tools):
    out = tmp_path / "r"

    def flaky(item):
        if item.id in ("p1", "p4"):
            return ScriptedGenerator(qwen3.tokenizer, [CALL])  # no second turn: generation_error
        return ScriptedGenerator(qwen3.tokenizer, [CALL, ANSWER])

    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=flaky, tools=tools, shard_size=2, fmt="parquet", concurrency=1))
    assert st.errors == 2
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=2, fmt="parquet"))
    assert st.done == 0  # without --retry-errors an error trace counts as done
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=2, fmt="parquet",
                          retry_errors=True))
    assert st.skipped == 4 and st.done == 2 and st.errors == 0
    ids = folder_ids(out)
    assert len(ids) == 8 and ids[-2:] in (["p1", "p4"], ["p4", "p1"])  # the retries follow the old traces
    st = run(run_rollouts(items(6), bundle=qwen3, out_path=str(out), make_generator=scripted(qwen3), tools=tools, shard_size=2, fmt="parquet",
                          retry_errors=True))
    assert st.done == 0


def _journal_of(folder, n, traces):
    from backend.trace import write_jsonl

    write_jsonl(traces, str(folder / f"part-{n:05d}.journal.jsonl"))


def _parquet_traces(path):
    from backend.trace import read_parquet_traces

    return read_parquet_traces(str(path)).traces


@pytest.mark.parametrize("state", ["temp-files", "parquet-and-journal", "torn-parquet", "parquet-missing-some", "full-journal",
                                   "journal-resumed-as-jsonl", "empty-journal", "partial-journal-line"])
def test_interrupted_conversion_is_resolved_without_loss_or_duplicates(tmp_path, qwen3, tools, state):
    """Each state a crash can leave in a Parquet shard folder (during or after a conversion, or
    mid-line in the journal), then a resume: every id exactly once, every file loads."""
    from backend.trace import write_parquet

    out = tmp_path / "pq"
    kw = {"bundle": qwen3, "make_generator": scripted(qwen3), "tools": tools, "shard_size": 4, "fmt": "parquet"}
    run(run_rollouts(items(10), out_path=str(out), **kw))  # part-00000 (4), part-00001 (4), part-00002 (2)
    last = out / "part-00002.parquet"
    two = _parquet_traces(last)
    fmt = "parquet"
    if state == "temp-files":  # killed while writing the Parquet: the journal is all there is
        last.rename(out / "part-00002.parquet.tmp")
        (out / "part-00002.parquet.tmp.tmp").write_bytes(b"PAR1 half a file")
        _journal_of(out, 2, two)
    elif state == "parquet-and-journal":  # killed after the rename, before the journal was removed
        _journal_of(out, 2, two)
    elif state == "torn-parquet":  # a Parquet that is not whole (no fsync, power loss)
        _journal_of(out, 2, two)
        last.write_bytes(last.read_bytes()[:100])
    elif state == "parquet-missing-some":  # cannot come from our writer; merged anyway
        write_parquet(two[:1], str(last))
        _journal_of(out, 2, two)
    elif state == "full-journal":  # killed between the shard's last line and its conversion
        p1 = out / "part-00001.parquet"
        four = _parquet_traces(p1)
        last.unlink()
        p1.unlink()
        _journal_of(out, 1, four)  # the last shard, full
    elif state == "journal-resumed-as-jsonl":  # a crashed Parquet run, resumed with the JSONL format
        last.unlink()
        _journal_of(out, 2, two)
        fmt = "jsonl"
    elif state == "empty-journal":  # killed between opening the journal and its first line
        (out / "part-00003.journal.jsonl").write_bytes(b"")
    elif state == "partial-journal-line":
        last.unlink()
        _journal_of(out, 2, two)
        with open(out / "part-00002.journal.jsonl", "a") as f:
            f.write(two[0].to_json()[:50])
    st = run(run_rollouts(items(12), out_path=str(out), **{**kw, "fmt": fmt}))
    ids = folder_ids(out)
    assert sorted(ids) == sorted(f"p{i}" for i in range(12)), ids  # each exactly once
    assert st.skipped == (8 if state == "full-journal" else 10)
    files = shard_files(out)
    assert not any(f.endswith(".journal.jsonl") for f in files)
    if state == "full-journal":
        assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    elif state == "journal-resumed-as-jsonl":
        assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet", "part-00003.jsonl"]
    elif state in ("temp-files", "torn-parquet", "partial-journal-line"):  # the journal (2 traces) is the open shard: continued
        assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
        assert len(_parquet_traces(out / "part-00002.parquet")) == 4
    else:
        assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet", "part-00003.parquet"]


def test_shard_arguments(tmp_path, qwen3):
    f = tmp_path / "file.jsonl"
    f.write_text("")
    kw = {"bundle": qwen3, "make_generator": scripted(qwen3)}
    with pytest.raises(RolloutError, match="is a file"):
        run(run_rollouts(items(1), out_path=str(f), shard_size=10, **kw))
    with pytest.raises(RolloutError, match="does not exist"):
        run(run_rollouts(items(1), out_path=str(tmp_path / "no" / "run") + "/", **kw))
    with pytest.raises(RolloutError, match="at least 1"):
        run(run_rollouts(items(1), out_path=str(tmp_path / "run"), shard_size=0, **kw))
    with pytest.raises(RolloutError, match="format"):
        run(run_rollouts(items(1), out_path=str(tmp_path / "run"), fmt="csv", **kw))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(RolloutError, match="cannot be read"):
        run(run_rollouts(items(1), out_path=str(bad), **kw))
    assert is_shard_dir("x/") and is_shard_dir(str(tmp_path)) and is_shard_dir("x", 5) and is_shard_dir("x", fmt="parquet")
    assert not is_shard_dir("x.jsonl")


def _finished_on_disk(folder):
    """Traces on disk in a folder being written (lines of JSONL shards and journals, rows of
    Parquet shards); files may vanish under us (a conversion)."""
    import pyarrow.parquet as pq

    n = 0
    for fn in os.listdir(folder) if os.path.isdir(folder) else []:
        p = os.path.join(folder, fn)
        try:
            if fn.endswith(".parquet"):
                n += pq.ParquetFile(p).metadata.num_rows
            elif fn.endswith(".jsonl"):
                with open(p, "rb") as f:
                    n += f.read().count(b"\n")
        except (OSError, ValueError):
            pass
    return n


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_has_every_id_exactly_once(tmp_path):
    """A real `rollout` subprocess (scripted backend, a token delay so it is mid-run) killed with
    SIGKILL at several points, resumed each time, then run to the end. Parquet only: a shard cut
    short there is a journal to finish, the harder case; JSONL's resume (a partial last line
    repaired, numbering continued) is test_resume_skips_done_ids_and_repairs_a_partial_line and
    test_jsonl_shards_numbering_and_resume, in-process (this end-to-end variant cost 24-28 s)."""
    import signal
    import time

    fmt = "parquet"
    n_items = 40
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"k{i}", "prompt": f"Weather {i}?"}) + "\n" for i in range(n_items)))
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": CALL, "token_delay_s": 0.004}, ANSWER]))
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([WEATHER_SCHEMA]))
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "backend", "rollout", "--prompts", str(prompts), "--tools", str(tools_file), "--backend", "scripted",
           "--script", str(script), "--tokenizer", "qwen3", "--concurrency", "3", "--out", str(out) + "/", "--shard-size", "3",
           "--format", fmt, "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    kills = 0
    for target in (2, 9, 16, 24):  # kill once this many traces are on disk (each run starts where the last stopped)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while _finished_on_disk(out) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    assert kills >= 3  # really killed mid-run
    assert _finished_on_disk(out) < n_items
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["skipped"] + s["done"] == n_items and s["done"] > 0
    ids = folder_ids(out)
    assert sorted(ids) == sorted(f"k{i}" for i in range(n_items))  # every id exactly once, every line/row loads
    files = shard_files(out)
    assert all(f.endswith("." + fmt) and ".journal." not in f for f in files)
    assert files == [f"part-{i:05d}.{fmt}" for i in range(len(files))]  # numbering continued, no gaps
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert json.loads(r.stdout)["skipped"] == n_items
