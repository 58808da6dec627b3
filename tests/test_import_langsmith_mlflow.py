"""LangSmith run trees and MLflow traces: files written by the real libraries (langsmith 0.15.1
with wrap_openai / @traceable and LangChain's tracer, mlflow-skinny 3.17.2 with openai autolog)
against a loopback server (tests/fixtures_gen/gen_langsmith.py, gen_mlflow.py), and bad input.

The expected values re-state the generators' scenario (tests/fixtures_gen/
scenario_langsmith_mlflow.py): user text, scripted replies, the tools' results."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest

from backend.importers import detect, detect_why, import_file
from backend.loading.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "import")
LS = os.path.join(DATA, "langsmith")
ML = os.path.join(DATA, "mlflow")

SYSTEM = "You are a concise travel assistant. Use the tools when they help."
MODEL = "gpt-4o-mini-2024-07-18"
NOTES = 'notes/a "quoted" \\ path\n.txt'
TOOL_NAMES = ["get_weather", "read_file", "plan_trip"]


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def tool(id_, name, content):
    return {"role": "tool", "tool_call_id": id_, "name": name, "content": content}


ONE_CALL = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What's the weather in Zürich right now?"},
    {"role": "assistant", "content": "", "tool_calls": [call("call_w1", "get_weather", {"city": "Zürich"})]},
    tool("call_w1", "get_weather", '{"city": "Zürich", "temp": 7, "unit": "c", "sky": "cloudy"}'),
    {"role": "assistant", "content": "It is 7 °C and cloudy in Zürich."},
]
PARALLEL = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Plan 2 days in Zürich, then 3 in 東京. Check 東京's weather and read my notes first."},
    {"role": "assistant", "content": "", "tool_calls": [
        call("call_p1", "get_weather", {"city": "東京", "unit": "c"}),
        call("call_p2", "read_file", {"path": NOTES}),
        call("call_p3", "plan_trip", {"stops": [{"city": "Zürich", "days": 2}, {"city": "東京", "days": 3}]})]},
    tool("call_p1", "get_weather", '{"city": "東京", "temp": 18, "unit": "c", "sky": "clear"}'),
    tool("call_p2", "read_file", NOTES + ": pack an umbrella; 東京 hotel is booked"),
    tool("call_p3", "plan_trip", '{"route": "Zürich → 東京", "days": 5}'),
    {"role": "assistant", "content": "", "tool_calls": [call("call_p4", "get_weather", {"city": "Zürich", "unit": "f"})]},
    tool("call_p4", "get_weather", '{"city": "Zürich", "temp": 7, "unit": "f", "sky": "cloudy"}'),
    {"role": "assistant", "content": "Zürich → 東京 over 5 days: 東京 is clear at 18 °C, Zürich cloudy; pack an umbrella."},
]
# the agent stopped at its call limit after running the tool: the result is only in the tool's run / span
STOPPED = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Read my todo notes."},
    {"role": "assistant", "content": "", "tool_calls": [call("call_s1", "read_file", {"path": "notes/todo.txt"})]},
    tool("call_s1", "read_file", "notes/todo.txt: pack an umbrella; 東京 hotel is booked"),
]
PLAIN = [{"role": "user", "content": "Say hello in Japanese, one word."}, {"role": "assistant", "content": "こんにちは"}]
# conversation -> (messages, model calls, tool runs, finish reason of the last call)
SCENARIO = {
    "one_call": (ONE_CALL, 2, 1, "stop"),
    "parallel": (PARALLEL, 3, 4, "stop"),
    "stopped": (STOPPED, 1, 1, "tool_calls"),
    "plain": (PLAIN, 1, 0, "stop"),
}
ORDER = ["one_call", "parallel", "stopped", "plain"]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def norm(messages):
    """Messages with keys in a fixed order (the importers may order a tool message's keys differently)."""
    return [dict(sorted(m.items())) for m in messages]


def check_conversation(t, name):
    msgs, llm_calls, tool_runs, finish = SCENARIO[name]
    assert norm(t.messages) == norm(msgs)
    assert t.metadata["llm_calls"] == llm_calls
    assert len(t.metadata.get("tool_durations_s", [])) == tool_runs
    assert all(isinstance(d, float) and d >= 0 for d in t.metadata.get("tool_durations_s", []))
    assert t.metadata["finish_reason"] == finish
    assert t.metadata["model"] == MODEL
    assert t.metadata["duration_s"] > 0
    if name == "plain":
        assert t.tools == []
    else:
        assert [x["function"]["name"] for x in t.tools] == TOOL_NAMES
        plan = t.tools[2]["function"]["parameters"]
        assert plan["properties"]["stops"]["items"]["properties"]["days"] == {"type": "integer"}
    assert t.metadata["ids"] == "rendered" and t.input_ids


def rewrite(src, dst, edit):
    """Copy a JSONL fixture with ``edit(list of records)`` applied."""
    with open(src, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    recs = edit(recs) or recs
    with open(dst, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(dst)


# ---- LangSmith ----------------------------------------------------------------------------------

LS_FILES = ["runs.jsonl", "run_trees.jsonl", "langchain_runs.jsonl"]


@pytest.mark.parametrize("fmt", ["auto", "langsmith"])
@pytest.mark.parametrize("fname", LS_FILES)
def test_langsmith_files(fname, fmt, qwen3):
    path = os.path.join(LS, fname)
    assert detect(path) == "langsmith"
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"langsmith": 4} and not res.notes
    assert len(res.traces) == 4
    for t, name in zip(res.traces, ORDER):
        check_conversation(t, name)
        prov = t.metadata["provenance"]
        assert prov["format"] == "LangSmith" and prov["library"] == "langsmith" and prov["version"] == "0.15.1"
        assert prov["sdk"] == "langsmith-py"
        assert prov["trace_id"] == t.id and prov["run_id"] in prov["run_ids"]
        assert len(prov["run_ids"]) == SCENARIO[name][1] + SCENARIO[name][2]  # the llm runs and tool runs used
        if fname == "langchain_runs.jsonl":  # LangChain's tracer says who traced
            assert prov["traced_by"] == "langchain-core 1.8.3"
            assert t.metadata["name"] == "travel_agent_langchain"
        else:
            assert "traced_by" not in prov
            assert t.metadata["name"] == "travel_agent"
        assert t.metadata["runs"]["chain"] == 1


def test_langsmith_tool_runs_carry_durations_and_ids(qwen3):
    """LangChain tool runs name the call they answer; @traceable ones are matched by name and
    arguments: both give the call id in metadata.tool_runs."""
    for fname in ("runs.jsonl", "langchain_runs.jsonl"):
        t = import_file(os.path.join(LS, fname), "langsmith", bundle=qwen3).traces[1]
        runs = t.metadata["tool_runs"]
        assert [r["name"] for r in runs] == ["get_weather", "read_file", "plan_trip", "get_weather"]
        assert [r["tool_call_id"] for r in runs] == ["call_p1", "call_p2", "call_p3", "call_p4"]
        assert [r["duration_s"] for r in runs] == t.metadata["tool_durations_s"]


def test_langsmith_badge(qwen3):
    from ui.inspector import imported_from

    t = import_file(os.path.join(LS, "runs.jsonl"), "auto", tokenizer="qwen3").traces[0]
    assert imported_from(t) == "imported from LangSmith (langsmith 0.15.1)"


def _split_post_patch(recs):
    """Each run as the SDK sends it without batching: a post (inputs, start) and a patch (outputs, end)."""
    out = []
    for r in recs:
        post = {k: v for k, v in r.items() if k not in ("outputs", "end_time")}
        patch = {k: r[k] for k in ("id", "trace_id", "dotted_order", "parent_run_id", "outputs", "end_time") if k in r}
        out += [post, patch]
    return out


def test_langsmith_post_and_patch_lines_merge(tmp_path, qwen3):
    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "ops.jsonl", _split_post_patch)
    res = import_file(path, "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    for t, name in zip(res.traces, ORDER):
        check_conversation(t, name)


def test_langsmith_batch_ingest_bodies(tmp_path, qwen3):
    def batches(recs):
        ops = _split_post_patch(recs)
        return [{"post": ops[0::2][:9], "patch": ops[1::2][:9]}, {"post": ops[0::2][9:], "patch": ops[1::2][9:]}]

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "batch.jsonl", batches)
    assert detect_why(json.loads(open(path, encoding="utf-8").readline()))[:2] == (
        "langsmith", "a LangSmith batch-ingest body (post/patch runs)")
    res = import_file(path, "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert [t.messages[-1]["content"] for t in res.traces] == [SCENARIO[n][0][-1]["content"] for n in ORDER]


def test_langsmith_json_list_of_runs(tmp_path, qwen3):
    recs = [json.loads(x) for x in open(os.path.join(LS, "runs.jsonl"), encoding="utf-8")]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(recs, ensure_ascii=False), encoding="utf-8")
    res = import_file(str(path), "auto", bundle=qwen3)
    assert res.complete and len(res.traces) == 4


def _llm_runs(recs, user):
    return [r for r in recs if r.get("run_type") == "llm" and user in json.dumps(r["inputs"], ensure_ascii=False)]


def test_langsmith_malformed_run_is_a_problem_others_import(tmp_path, qwen3):
    def edit(recs):
        last = _llm_runs(recs, "Zürich right now")[-1]
        last["inputs"]["messages"][1]["role"] = "wizard"
        recs.append({"run_type": "llm", "name": "no id", "inputs": {"messages": []}})

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "bad.jsonl", edit)
    res = import_file(path, "langsmith", bundle=qwen3)
    assert len(res.traces) == 3  # the other conversations
    lines = res.problem_lines()
    assert any("run has no id" in p and p.startswith(f"line {len(open(path).readlines())}:") for p in lines), lines
    bad = [p for p in lines if "wizard" in p]
    assert len(bad) == 1 and "inputs.messages[1] has role 'wizard'" in bad[0] and "(llm 'ChatOpenAI')" in bad[0]


def test_langsmith_truncated_line_is_a_problem_with_its_number(tmp_path, qwen3):
    src = os.path.join(LS, "run_trees.jsonl")
    lines = open(src, encoding="utf-8").read().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = import_file(str(path), "auto", bundle=qwen3)
    assert [p.line for p in res.problems] == [2]
    users = [next(m["content"] for m in t.messages if m["role"] == "user") for t in res.traces]
    assert users == [ONE_CALL[1]["content"], STOPPED[1]["content"], PLAIN[0]["content"]]


def test_langsmith_image_part_is_a_loss(tmp_path, qwen3):
    def edit(recs):
        for r in _llm_runs(recs, "Japanese"):
            r["inputs"]["messages"][0]["content"] = [
                {"type": "text", "text": "Say hello in Japanese, one word."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "image.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems and len(res.traces) == 4 and not res.complete
    (loss,) = [x.reason for x in res.losses]
    assert "inputs.messages[0]: content part 1 (image_url) not carried over" in loss and "(llm 'ChatOpenAI')" in loss
    assert norm(res.traces[3].messages) == norm(PLAIN)


def test_langsmith_dangling_tool_result_is_a_loss(tmp_path, qwen3):
    def edit(recs):
        last = _llm_runs(recs, "Zürich right now")[-1]
        last["inputs"]["messages"][3]["tool_call_id"] = "call_nope"

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "dangling.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems
    assert any("call_nope" in x.reason and "answers no tool call" in x.reason for x in res.losses)
    # the tool's own run still gives the answer to call_w1
    t = res.traces[0]
    assert tool("call_w1", "get_weather", ONE_CALL[3]["content"]) in t.messages


def test_langsmith_stray_tool_run_and_unknown_output_are_losses(tmp_path, qwen3):
    def edit(recs):
        root = next(r for r in recs if r.get("run_type") == "chain" and "Japanese" in json.dumps(r["inputs"], ensure_ascii=False))
        stray = {k: root[k] for k in ("trace_id", "start_time", "end_time", "session_name")}
        recs.append({**stray, "id": "00000000-0000-0000-0000-00000000abcd", "parent_run_id": root["id"], "run_type": "tool",
                     "name": "book_hotel", "inputs": {"city": "東京"}, "outputs": {"output": "booked"}})
        _llm_runs(recs, "todo notes")[-1]["outputs"] = {"weird": 1}

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "stray.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems and len(res.traces) == 4
    reasons = [x.reason for x in res.losses]
    assert any("run 00000000-0000-0000-0000-00000000abcd (tool 'book_hotel')" in r and "answers no tool call" in r for r in reasons), reasons
    assert any("outputs: not a chat model output (keys: weird)" in r for r in reasons), reasons


def test_langsmith_trace_without_llm_run_is_a_problem(tmp_path, qwen3):
    def edit(recs):
        return [r for r in recs if not (r.get("run_type") == "llm" and "Japanese" in json.dumps(r["inputs"], ensure_ascii=False))]

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "nollm.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert len(res.traces) == 3
    (p,) = res.problems
    assert "no llm run among its 1 run(s) (chain 'travel_agent')" in p.reason


def test_langsmith_invalid_tool_call_is_a_parse_error(tmp_path, qwen3):
    """LangChain keeps arguments that did not parse in ``invalid_tool_calls``: the raw string
    stays, the turn gets a parse error."""
    def edit(recs):
        first, last = _llm_runs(recs, "Zürich right now")
        for ai in (first["outputs"]["generations"][0][0]["message"]["kwargs"], last["inputs"]["messages"][0][2]["kwargs"]):
            c = ai["tool_calls"].pop()
            ai["invalid_tool_calls"] = [{"name": c["name"], "args": '{"city": "Zür', "id": c["id"], "error": "bad json",
                                         "type": "invalid_tool_call"}]

    path = rewrite(os.path.join(LS, "langchain_runs.jsonl"), tmp_path / "invalid.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems
    t = res.traces[0]
    assert t.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Zür'
    gen = [s for s in t.steps if s.state == "generating"][0]
    assert gen.parse_errors and "not valid JSON" in gen.parse_errors[0].message


def test_langsmith_two_independent_llm_runs_in_one_trace(tmp_path, qwen3):
    """A trace whose llm runs are not one growing conversation (a side call to another model)
    gives a conversation for each."""
    def edit(recs):
        side = copy.deepcopy(_llm_runs(recs, "Japanese")[-1])
        main = _llm_runs(recs, "Zürich right now")[-1]
        side.update(id="00000000-0000-0000-0000-0000000000aa", trace_id=main["trace_id"], parent_run_id=main["parent_run_id"],
                    dotted_order=main["dotted_order"].split(".")[0] + ".20200101T000000000000Z00000000-0000-0000-0000-0000000000aa")
        recs.append(side)

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "two.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    first = [t for t in res.traces if t.id.endswith(("-0", "-1"))]
    assert len(first) == 2 and len(res.traces) == 5
    assert {first[0].messages[-1]["content"], first[1].messages[-1]["content"]} == {"こんにちは", ONE_CALL[-1]["content"]}


# ---- a generic tool wrapper (LangSmith and MLflow) -----------------------------------------------

WRAPPED = ["one_call", "parallel", "stopped"]  # the scenario's conversations with tools


@pytest.mark.parametrize("path", [os.path.join(LS, "wrapped_tools.jsonl"), os.path.join(ML, "wrapped_tools.jsonl")])
def test_generic_tool_wrapper_runs_answer_the_calls_they_name(path, qwen3):
    """gen_langsmith.py / gen_mlflow.py ``wrapped_tools``: every tool runs through one
    ``call_tool(name, arguments)`` run / span. Matched by the name and arguments its inputs
    give, each answers its call: no false loss, and the stopped run's result (only in the
    tool's run) is carried over."""
    res = import_file(path, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert len(res.traces) == 3
    for t, name in zip(res.traces, WRAPPED):
        msgs, llm_calls, tool_runs, finish = SCENARIO[name]
        assert norm(t.messages) == norm(msgs), name
        assert t.metadata["llm_calls"] == llm_calls and len(t.metadata["tool_durations_s"]) == tool_runs
    runs = res.traces[1].metadata["tool_runs"]
    assert [r["name"] for r in runs] == ["call_tool"] * 4  # the runs as the source names them
    assert [r["tool_call_id"] for r in runs] == ["call_p1", "call_p2", "call_p3", "call_p4"]


def _positional(inputs):
    """``call_tool(name, arguments)``'s keyword inputs in the positional form (issue 42 item 12):
    ``{"args": [name, arguments], "kwargs": {}}``, as Langfuse's ``@observe`` records a call made
    positionally (and as a ``*args`` wrapper's inputs read)."""
    return {"args": [inputs["name"], inputs["arguments"]], "kwargs": {}}


@pytest.mark.parametrize("src", ["langsmith", "mlflow"])
def test_a_wrapper_called_positionally_answers_the_calls_it_names(src, tmp_path, qwen3):
    """The wrapper's positional form matches as its keyword form does (issue 42 item 12). The
    real libraries' ``wrapped_tools`` files (keyword inputs) with each ``call_tool`` input
    rewritten into the positional form: langsmith and mlflow-skinny are not in the test
    environment, and their decorators bind a positional call to the parameter names, so only a
    ``*args`` wrapper writes this form there; Langfuse's own positional file is in
    test_import_openinference_langfuse.py."""
    seen = []

    def edit(recs):
        for r in recs:
            if src == "langsmith":
                if r.get("name") == "call_tool" and isinstance(r.get("inputs"), dict) and "name" in r["inputs"]:
                    r["inputs"] = _positional(r["inputs"])
                    seen.append(r["inputs"])
                continue
            for sp in r["data"]["spans"]:
                a = sp.get("attributes") or {}
                if sp.get("name") == "call_tool" and isinstance(a.get("mlflow.spanInputs"), str):
                    a["mlflow.spanInputs"] = json.dumps(_positional(json.loads(a["mlflow.spanInputs"])), ensure_ascii=False)
                    seen.append(a["mlflow.spanInputs"])

    path = rewrite(os.path.join(LS if src == "langsmith" else ML, "wrapped_tools.jsonl"), tmp_path / "positional.jsonl", edit)
    assert len(seen) == 6  # one_call 1, parallel 4, stopped 1
    res = import_file(path, bundle=qwen3)
    assert res.complete, res.problem_lines()
    for t, name in zip(res.traces, WRAPPED):
        msgs, llm_calls, tool_runs, finish = SCENARIO[name]
        assert norm(t.messages) == norm(msgs), name
        assert len(t.metadata["tool_durations_s"]) == tool_runs
    runs = res.traces[1].metadata["tool_runs"]
    assert [r["tool_call_id"] for r in runs] == ["call_p1", "call_p2", "call_p3", "call_p4"]


def test_tool_run_calls_reads_both_forms_of_a_wrapper():
    from backend.importers.common import tool_run_calls

    args = {"city": "Paris"}
    for form in ({"name": "get_weather", "arguments": args}, {"args": ["get_weather", args], "kwargs": {}},
                 {"args": ["get_weather"], "kwargs": {"arguments": args}}, {"args": ["get_weather", json.dumps(args)], "kwargs": {}},
                 {"args": ["get_weather"], "kwargs": {"city": "Paris"}}, ["get_weather", args]):
        assert ("get_weather", args) in tool_run_calls("call_tool", form), form
    # the tool's own run, and what is no wrapper's: only itself
    assert tool_run_calls("get_weather", {"args": [], "kwargs": {}}) == [("get_weather", {"args": [], "kwargs": {}})]
    assert tool_run_calls("add", {"args": [1, 2], "kwargs": {}}) == [("add", {"args": [1, 2], "kwargs": {}})]
    assert tool_run_calls("f", {"args": ["x", {"a": 1}, 3], "kwargs": {}}) == [("f", {"args": ["x", {"a": 1}, 3], "kwargs": {}})]


def test_a_wrapper_run_that_names_no_call_is_still_a_loss(tmp_path, qwen3):
    """Only a result that truly answers no call is a loss: a call_tool run whose inputs name a
    tool the model never called."""
    def edit(recs):
        (run,) = [r for r in recs if r.get("name") == "call_tool" and isinstance(r.get("inputs"), dict)
                  and r["inputs"].get("arguments") == {"city": "Zürich"}]
        run["inputs"]["name"] = "get_time"

    path = rewrite(os.path.join(LS, "wrapped_tools.jsonl"), tmp_path / "stray.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems
    (loss,) = res.losses
    assert "tool 'call_tool' answers no tool call of the conversation" in loss.reason
    assert norm(res.traces[0].messages) == norm(ONE_CALL)  # the conversation itself holds the result


# ---- MLflow -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "mlflow"])
def test_mlflow_traces_jsonl(fmt, qwen3):
    path = os.path.join(ML, "traces.jsonl")
    assert detect(path) == "mlflow"
    res = import_file(path, fmt, bundle=qwen3)
    assert res.complete, res.problem_lines()
    assert res.formats == {"mlflow": 4} and not res.notes
    for t, name in zip(res.traces, ORDER):
        check_conversation(t, name)
        prov = t.metadata["provenance"]
        assert prov["format"] == "MLflow" and prov["library"] == "mlflow" and prov["version"] == "trace schema 3"
        assert prov["trace_id"] == t.id and t.id.startswith("tr-") and prov["otel_trace_id"] == t.id[3:]
        assert len(prov["span_ids"]) == SCENARIO[name][1] + SCENARIO[name][2]
        assert all(len(s) == 16 and int(s, 16) >= 0 for s in prov["span_ids"])
        assert prov["source"] == "tests/fixtures_gen/gen_mlflow.py"
        assert t.metadata["state"] == "OK" and t.metadata["name"] == "travel_agent"
        assert t.metadata["spans"]["AGENT"] == 1 and t.metadata["spans"]["CHAT_MODEL"] == SCENARIO[name][1]


def test_mlflow_whole_json_file_is_one_trace(qwen3):
    path = os.path.join(ML, "trace_parallel.json")
    assert detect(path) == "mlflow"
    res = import_file(path, "auto", tokenizer="qwen3")
    assert res.complete and len(res.traces) == 1
    check_conversation(res.traces[0], "parallel")
    assert [r["tool_call_id"] for r in res.traces[0].metadata["tool_runs"]] == ["call_p1", "call_p2", "call_p3", "call_p4"]
    from ui.inspector import imported_from

    assert imported_from(res.traces[0]) == "imported from MLflow (mlflow trace schema 3)"


def test_mlflow_responses_api_span(qwen3):
    res = import_file(os.path.join(ML, "responses.jsonl"), "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    assert norm(t.messages) == norm(ONE_CALL)
    assert [x["function"]["name"] for x in t.tools] == TOOL_NAMES
    assert t.metadata["llm_calls"] == 2 and len(t.metadata["tool_durations_s"]) == 1


def _load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _attr(span, key):
    return json.loads(span["attributes"][key])


def _set_attr(span, key, value):
    span["attributes"][key] = json.dumps(value, ensure_ascii=False)


def test_mlflow_v2_schema(tmp_path, qwen3):
    """MLflow 2 wrote ``context``/``0x`` hex ids, ``start_time``/``end_time`` and ``request_id``."""
    doc = _load_json(os.path.join(ML, "trace_parallel.json"))
    import base64

    def hx(v):
        return "0x" + base64.b64decode(v).hex() if v else None

    info = doc["info"]
    v2 = {"info": {"request_id": info["trace_id"], "experiment_id": "0", "timestamp_ms": 1764000000000,
                   "execution_time_ms": info["execution_duration_ms"], "status": "OK",
                   "request_metadata": {"mlflow.trace_schema.version": "2"}, "tags": info["tags"]},
          "data": {"spans": [{"name": s["name"], "context": {"trace_id": hx(s["trace_id"]), "span_id": hx(s["span_id"])},
                              "parent_id": hx(s["parent_span_id"]), "start_time": s["start_time_unix_nano"],
                              "end_time": s["end_time_unix_nano"], "status_code": "OK", "status_message": "",
                              "attributes": s["attributes"], "events": []} for s in doc["data"]["spans"]]}}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(v2), encoding="utf-8")
    res = import_file(str(path), "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    check_conversation(res.traces[0], "parallel")
    prov = res.traces[0].metadata["provenance"]
    assert prov["version"] == "trace schema 2" and prov["trace_id"] == info["trace_id"]
    assert prov["span_ids"] == import_file(os.path.join(ML, "trace_parallel.json"), "mlflow", bundle=qwen3).traces[0].metadata["provenance"]["span_ids"]


def test_mlflow_hex_ids_and_bare_span_list(tmp_path, qwen3):
    doc = _load_json(os.path.join(ML, "trace_parallel.json"))
    import base64

    spans = doc["data"]["spans"]
    for s in spans:  # MLflow 3.5.0 wrote hex ids (the trace id as tr-...)
        s["trace_id"] = "tr-" + base64.b64decode(s["trace_id"]).hex()
        s["span_id"] = base64.b64decode(s["span_id"]).hex()
        s["parent_span_id"] = base64.b64decode(s["parent_span_id"]).hex() if s["parent_span_id"] else None
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(spans), encoding="utf-8")  # a bare list of span dicts: one trace
    assert detect(str(path)) == "mlflow"
    res = import_file(str(path), "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    (t,) = res.traces
    check_conversation(t, "parallel")
    assert t.id == doc["info"]["trace_id"]  # from the spans' mlflow.traceRequestId


def test_mlflow_chat_messages_attribute(tmp_path, qwen3):
    """Older MLflow put the whole exchange in ``mlflow.chat.messages``."""
    doc = _load_json(os.path.join(ML, "trace_parallel.json"))
    chat = [s for s in doc["data"]["spans"] if _attr(s, "mlflow.spanType") == "CHAT_MODEL"][-1]
    inputs, outputs = _attr(chat, "mlflow.spanInputs"), _attr(chat, "mlflow.spanOutputs")
    _set_attr(chat, "mlflow.chat.messages", inputs["messages"] + [outputs["choices"][0]["message"]])
    _set_attr(chat, "mlflow.spanInputs", {**inputs, "messages": "not read: mlflow.chat.messages has them"})
    path = tmp_path / "chat_messages.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    res = import_file(str(path), "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    check_conversation(res.traces[0], "parallel")


def _edit_line(src, dst, k, edit):
    lines = open(src, encoding="utf-8").read().splitlines()
    doc = json.loads(lines[k])
    edit(doc)
    lines[k] = json.dumps(doc, ensure_ascii=False)
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(dst)


def _spans(doc, typ):
    return [s for s in doc["data"]["spans"] if _attr(s, "mlflow.spanType") == typ]


def test_mlflow_malformed_chat_attribute_is_a_problem(tmp_path, qwen3):
    def edit(doc):
        _spans(doc, "CHAT_MODEL")[-1]["attributes"]["mlflow.spanInputs"] = '{"messages": [{"role": "user", "content": "cut'

    path = _edit_line(os.path.join(ML, "traces.jsonl"), tmp_path / "bad.jsonl", 1, edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert len(res.traces) == 3
    (p,) = res.problems
    assert p.line == 2 and "data.spans[7].attributes['mlflow.spanInputs']: not valid JSON" in p.reason


def test_mlflow_malformed_tool_attribute_is_a_loss(tmp_path, qwen3):
    def edit(doc):
        _spans(doc, "TOOL")[0]["attributes"]["mlflow.spanOutputs"] = '"notes/todo.txt: pack an umbr'

    path = _edit_line(os.path.join(ML, "traces.jsonl"), tmp_path / "badtool.jsonl", 2, edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems and len(res.traces) == 4
    (loss,) = res.losses
    assert loss.line == 3 and "data.spans[2].attributes['mlflow.spanOutputs']: not valid JSON" in loss.reason
    assert res.traces[2].messages[-1]["content"] == '"notes/todo.txt: pack an umbr'  # the raw text is kept


def test_mlflow_unknown_part_and_dangling_result_are_losses(tmp_path, qwen3):
    def edit(doc):
        chat = _spans(doc, "CHAT_MODEL")[-1]
        inputs = _attr(chat, "mlflow.spanInputs")
        inputs["messages"][1]["content"] = [{"type": "text", "text": ONE_CALL[1]["content"]}, {"type": "input_audio", "input_audio": {}}]
        inputs["messages"][3]["tool_call_id"] = "call_nope"
        _set_attr(chat, "mlflow.spanInputs", inputs)

    path = _edit_line(os.path.join(ML, "traces.jsonl"), tmp_path / "parts.jsonl", 0, edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert not res.problems and len(res.traces) == 4
    reasons = [x.reason for x in res.losses]
    assert any("attributes['mlflow.spanInputs'].messages[1]: content part 1 (input_audio) not carried over" in r for r in reasons), reasons
    assert any("call_nope" in r and "answers no tool call" in r for r in reasons), reasons
    assert res.traces[0].messages[1]["content"] == ONE_CALL[1]["content"]


def test_mlflow_truncated_line_and_no_chat_span(tmp_path, qwen3):
    lines = open(os.path.join(ML, "traces.jsonl"), encoding="utf-8").read().splitlines()
    lines[0] = lines[0][:500]
    doc = json.loads(lines[3])
    doc["data"]["spans"] = [s for s in doc["data"]["spans"] if _attr(s, "mlflow.spanType") != "CHAT_MODEL"]
    lines[3] = json.dumps(doc)
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = import_file(str(path), "mlflow", bundle=qwen3)
    assert len(res.traces) == 2
    assert [p.line for p in res.problems] == [1, 4]
    assert "no chat span (CHAT_MODEL / LLM) among its 1 span(s) (AGENT 'travel_agent')" in res.problems[1].reason


# ---- detection ----------------------------------------------------------------------------------


def _records(path):
    if path.endswith(".json"):
        doc = _load_json(path)
        return [doc] if isinstance(doc, dict) else doc
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(LS, "*"))) + sorted(glob.glob(os.path.join(ML, "*"))))
def test_our_records_are_ours_alone(path):
    want = "langsmith" if os.sep + "langsmith" + os.sep in path else "mlflow"
    recs = _records(path) if not path.endswith("trace_parallel.json") else [_load_json(path)]
    for rec in recs:
        fmt, why, others = detect_why(rec)
        assert fmt == want and why and others == [], (fmt, why, others)


def test_other_files_keep_their_formats():
    from backend.importers import get_importer

    others = [p for p in glob.glob(os.path.join(DATA, "**", "*"), recursive=True)
              if os.path.isfile(p) and os.sep + "langsmith" + os.sep not in p and os.sep + "mlflow" + os.sep not in p]
    assert others
    for p in others:
        assert detect(p) not in ("langsmith", "mlflow"), p
        if p.endswith((".json", ".jsonl")):
            try:
                recs = _records(p)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            for rec in recs[:20]:
                assert not get_importer("langsmith").sniff(rec) and not get_importer("mlflow").sniff(rec), p
    assert get_importer("mlflow").whole_file([{"role": "user", "content": "hi"}]) is False


def test_langsmith_failed_llm_run_ends_the_conversation(tmp_path, qwen3):
    """The model call raised: the run has an error and no outputs; the conversation is what it was sent."""
    def edit(recs):
        last = _llm_runs(recs, "Zürich right now")[-1]
        last["outputs"] = None
        last["error"] = "RateLimitError: 429 Too Many Requests"

    path = rewrite(os.path.join(LS, "runs.jsonl"), tmp_path / "failed.jsonl", edit)
    res = import_file(path, "auto", bundle=qwen3)
    assert res.complete, res.problem_lines()
    t = res.traces[0]
    assert norm(t.messages) == norm(ONE_CALL[:-1])
    assert t.termination_reason == "generation_error"
    assert t.metadata["errors"][0]["error"] == "RateLimitError: 429 Too Many Requests"
