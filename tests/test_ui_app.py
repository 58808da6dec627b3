"""The app in-process: build_app constructs, and the handlers behind each tab work with the
scripted backend and the shipped sample traces (no browser, no model)."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pandas as pd
import pytest
from playground_support import fresh, run_all, settings

import app as app_module
import ui
from backend.importers import load_any
from backend.trace import Trace
from ui import chat, inspector, playground, template_lab, trace_files
from ui.context import SAMPLE_DIR, AppContext, ModelOptions, ModelService, UserError, load_samples


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


# ---- app construction ------------------------------------------------------------------------


def test_samples_cover_the_scenarios(ctx):
    ids = {t.id for _, t in ctx.samples}
    assert {"sample-weather-seattle", "sample-parallel-calls", "sample-malformed-call", "sample-truncated-response",
            "sample-hunyuan-format", "sample-thinking-multiturn-turn1", "sample-thinking-multiturn-turn2",
            "sample-legacy-tool-turns"} <= ids
    total = sum(p.stat().st_size for p in SAMPLE_DIR.glob("*.jsonl"))
    assert total < 1_000_000
    by_id = {t.id: t for _, t in ctx.samples}
    w = by_id["sample-weather-seattle"]
    assert len(w.prompt_ids) == 178 and inspector.mask_runs(w.response_mask) == [(1, 25), (0, 29), (1, 16)]
    legacy = by_id["sample-legacy-tool-turns"]  # the seed's own numbers: verl < 0.9's tool turns
    assert inspector.mask_runs(legacy.response_mask) == [(1, 25), (0, 28), (1, 16)] and legacy.config["tool_turns"] == "legacy"
    assert by_id["sample-malformed-call"].termination_reason == "malformed_tool_call"
    assert by_id["sample-hunyuan-format"].metadata["parser"] == "hunyuan"
    assert any(r.truncated for s in by_id["sample-truncated-response"].steps for r in s.tool_results)
    assert len(by_id["sample-parallel-calls"].steps[1].tool_calls) == 3
    assert "<think>" in by_id["sample-thinking-multiturn-turn1"].steps[1].text


def test_sample_files_are_reproducible():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_samples", os.path.join(os.path.dirname(__file__), "..", "scripts", "make_sample_traces.py"))
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["make_samples"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_build_app_constructs(ctx):
    demo = ui.build_app(ctx)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    for needed in ("pg-chat", "pg-send", "pg-stop", "insp-tokens", "insp-steps", "tf-upload", "tf-table", "lab-render"):
        assert needed in ids
    assert "pg-code-tools" not in ids  # code tools are off by default


def test_build_app_with_code_tools_and_cli_flags(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps(["hello"]))
    args = app_module.parse_args(["--backend", "scripted", "--script", str(script), "--enable-code-tools", "--concurrency-limit", "2"])
    c = app_module.build_context(args)
    assert c.default_script == ["hello"] and c.enable_code_tools and c.concurrency_limit == 2 and not c.model.available
    demo = ui.build_app(c)
    assert "pg-code-tools" in {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    args = app_module.parse_args(["--backend", "vllm", "--model", "m", "--max-model-len", "2048", "--enforce-eager"])
    c = app_module.build_context(args)
    assert c.model.available and c.model.options.engine_opts == {"max_model_len": 2048, "enforce_eager": True}
    assert c.model.generator is None  # lazy: nothing started


def _header(demo) -> str:
    (h,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "ali-header"]
    return h.value


def test_header_names_the_model_without_a_state_that_goes_stale(ctx):
    """The header is rendered once per page: it used to say "Model: not started ...; it starts
    on the first playground run" for ever, also after the model had loaded."""
    args = app_module.parse_args(["--backend", "vllm", "--model", "my/model_x"])
    c = app_module.build_context(args)
    head = _header(ui.build_app(c))
    assert "vllm · my/model\\_x" in head and "not started" not in head and "starts on" not in head
    assert "none" in _header(ui.build_app(ctx))  # no model backend: says so


def test_script_box_is_open_only_for_the_scripted_backend(ctx):
    def script_box(c):
        (acc,) = [b for b in ui.build_app(c).blocks.values() if getattr(b, "elem_id", None) == "pg-script-box"]
        return acc

    assert script_box(ctx).open  # scripted: the script is what runs
    c = app_module.build_context(app_module.parse_args(["--backend", "vllm", "--model", "m"]))
    assert c.default_backend_choice == "vllm" and not script_box(c).open


def test_session_state_is_per_user(ctx):
    a, b = fresh(ctx), fresh(ctx)
    a.add("mine", ctx.samples[0][1])
    assert "mine" not in b.traces
    import copy

    c = copy.deepcopy(a)  # gr.State copies its initial value per session
    c.add("other", ctx.samples[0][1])
    assert "other" not in a.traces


# ---- playground -------------------------------------------------------------------------------


async def test_playground_scripted_run_is_the_seed_trace(ctx):
    sess = fresh(ctx)
    out = await run_all(ctx, sess, "What's the weather in Seattle?", settings())
    chat_msgs, status, trace = out[-1]
    assert isinstance(trace, Trace)
    assert len(trace.prompt_ids) == 178
    assert inspector.mask_runs(trace.response_mask) == [(1, 25), (0, 29), (1, 16)]  # continuous tokens, the default
    assert trace.termination_reason == "no_tool_calls"
    titles = [m.get("metadata", {}).get("title", "") for m in chat_msgs]
    assert any("Tool call · get_current_temperature" in t for t in titles)
    assert any("Tool result · get_current_temperature" in t for t in titles)
    assert 'data-status="ok"' in status
    assert sess.current == sess.last_run and sess.traces[sess.current] is trace
    assert sess.script_cursor == 2 and [m["role"] for m in sess.history] == ["user", "assistant", "tool", "assistant"]


async def test_playground_streams_partial_output(ctx):
    sess = fresh(ctx)
    out = await run_all(ctx, sess, "What's the weather in Seattle?", settings(token_delay=0.01))
    pending = [c for c, _, t in out if c and t is None and any(m.get("metadata", {}).get("status") == "pending" for m in c)]
    assert pending, "no streaming update with a pending (generating) message"
    live = [m for m in pending[0] if m.get("metadata", {}).get("status") == "pending"][0]
    assert live["content"].startswith("```")


async def test_playground_stop_cancels_a_slow_run(ctx):
    sess = fresh(ctx)
    s = settings(script=json.dumps(["x " * 400]), token_delay=0.02)
    gen = playground.run_turn(ctx, sess, "go", s)
    t0 = asyncio.get_running_loop().time()
    items = []
    async for item in gen:
        items.append(item)
        # once tokens stream (a chat update; under load the tokenizer's "loading…" lines come first)
        streamed = sum(1 for it in items if it[0] is not None)
        if sess.cancel is not None and streamed >= 2 and not sess.cancel.is_set():
            sess.cancel.set()  # what the Stop button does
    trace = items[-1][2]
    assert trace.termination_reason == "cancelled"
    assert 0 < len(trace.response_ids) < 400
    assert asyncio.get_running_loop().time() - t0 < 5
    assert sess.cancel is None and not sess.running


async def test_playground_multi_turn_continues_the_script(ctx):
    sess = fresh(ctx)
    s = settings(script=json.dumps(["Hi there.", "Still here."]), tools="[]")
    t1 = (await run_all(ctx, sess, "hello", s))[-1][2]
    t2 = (await run_all(ctx, sess, "again?", s))[-1][2]
    assert t1.messages[-1]["content"] == "Hi there." and t2.messages[-1]["content"] == "Still here."
    assert [m["role"] for m in t2.messages] == ["user", "assistant", "user", "assistant"]
    with pytest.raises(UserError, match="used up"):
        await run_all(ctx, sess, "more", s)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(script="[not json"), "script: invalid JSON"),
        (dict(tools="{}"), "tools: a JSON list"),
        (dict(apply_chat_template_kwargs="[1]"), "chat_template_kwargs must be a JSON object"),
        (dict(response_length=-5), "response_length must be between 1 and"),
        (dict(tokenizer="no/such-tokenizer-here"), "tokenizer"),
    ],
)
async def test_playground_bad_input_is_a_user_error(ctx, kw, needle):
    with pytest.raises(UserError, match=needle):
        await run_all(ctx, fresh(ctx), "hi", settings(**kw))


async def test_model_load_failure_is_a_clear_message(ctx):
    c = AppContext(model=ModelService(ModelOptions(backend="vllm-server", server_urls=[])), samples=ctx.samples)
    sess = fresh(c)
    with pytest.raises(UserError, match="could not load the model"):
        await run_all(c, sess, "hi", settings(backend="vllm-server"))
    assert "failed to load" in c.model.status()


async def test_send_handler_shows_errors_not_tracebacks(ctx):
    """The event handler itself (what Gradio calls) turns failures into a status line."""
    demo = ui.build_app(AppContext(model=ModelService(ModelOptions(backend="vllm-server", server_urls=[])), samples=ctx.samples))
    fn = next(d.fn for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "on_send")
    vals = {"backend": "vllm-server", "script": "[]", "tools": "[]"}
    outs = [o async for o in fn(fresh(ctx), "hi", vals)]
    status = outs[-1][2]
    assert 'data-status="err"' in status and "could not load the model" in status and "Traceback" not in status


# ---- inspector -----------------------------------------------------------------------------------


def test_inspector_outputs_for_each_sample(ctx):
    for label, t in ctx.samples:
        sess = fresh(ctx)
        out = inspector.show_trace(ctx, sess, label, "auto")
        dd, summary, steps, step_dd, chat_msgs, tokens = out[:6]
        assert dd["value"] == label
        assert isinstance(steps, pd.DataFrame) and len(steps) == len(t.steps)
        assert tokens.count("<span class=") + tokens.count('<span class="') >= len(t.input_ids)
        assert chat_msgs
        header, text, step_tokens, calls, results = out[-5:]
        assert json.loads(calls)["tool_calls"] is not None and json.loads(results) is not None


def test_inspector_malformed_call_shows_parse_error(ctx):
    sess = fresh(ctx)
    label = next(lb for lb, t in ctx.samples if t.id == "sample-malformed-call")
    out = inspector.show_trace(ctx, sess, label, "auto")
    steps: pd.DataFrame = out[2]
    assert "parse:" in steps.iloc[1]["errors"]
    header, text, toks, calls, results = out[-5:]
    assert json.loads(calls)["parse_errors"] and "parse error" in header
    diags: pd.DataFrame = out[8]
    assert "malformed_tool_call" in set(diags["code"])


def test_inspector_unknown_tokenizer_falls_back_to_ids(ctx):
    t = ctx.samples[0][1].model_copy(deep=True)
    t.tokenizer.name = "some-org/not-available"
    sess = fresh(ctx)
    sess.add("x", t)
    out = inspector.show_trace(ctx, sess, "x", "auto")
    assert "not available offline" in out[1]
    assert "⟨" in out[5]
    out = inspector.show_trace(ctx, sess, "x", "qwen3")  # decode with a chosen profile
    assert "⟨" not in out[5] and ">weather<" in out[5].replace("<i class=ws> </i>", "")


def test_step_rows_and_choices(ctx):
    t = ctx.samples[0][1]
    df = inspector.step_rows(t)
    # the tool turn's junction edit (continuous tokens: the '\n' after <|im_end|>) is named on its row
    assert list(df["state"]) == ["pending", "generating", "processing_tools · +1 inserted", "generating", "terminated"]
    assert list(df["added"]) == [178, 25, 29, 16, 0]
    assert inspector.default_step(t) == 1
    assert [v for _, v in inspector.step_choices(t)] == [0, 1, 2, 3, 4]


# ---- chat rendering ---------------------------------------------------------------------------


def test_chat_escapes_markup():
    evil = "<script>alert(1)</script><img src=x onerror=alert(1)>"
    msgs = chat.message_to_chat({"role": "user", "content": evil}, 0)
    assert "<script" not in msgs[0]["content"] and "&lt;script&gt;" in msgs[0]["content"]
    tool = chat.message_to_chat({"role": "tool", "name": evil, "content": "```\n" + evil}, 1)
    assert "<" not in tool[0]["metadata"]["title"]
    body = tool[0]["content"]
    assert body.startswith("````") and body.endswith("````")  # fence longer than the content's
    call = chat.message_to_chat({"role": "assistant", "content": evil, "tool_calls": [{"function": {"name": evil, "arguments": {}}}]}, 2)
    assert all("<" not in m["metadata"].get("title", "") for m in call if m.get("metadata"))
    assert "<img" not in call[0]["content"]


# ---- trace files ------------------------------------------------------------------------------


def test_trace_file_with_bad_lines(ctx, tmp_path):
    good = (SAMPLE_DIR / "01_weather.jsonl").read_text().strip()
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([good, "{not json", '{"response_ids": [1], "response_mask": []}', good.replace("sample-weather-seattle", "w2")]) + "\n")
    sess = fresh(ctx)
    status, probs = trace_files.load_file(ctx, sess, str(f))
    assert "2 trace(s) loaded" in status and "2 bad record(s)" in status
    assert list(probs["line"]) == [2, 3]
    out = trace_files.table_outputs(sess)
    df = out[2]
    assert list(df["id"]) == ["sample-weather-seattle", "w2"]
    assert sess.current == sess.file_traces[0]


def test_trace_file_listing_is_the_files_index(ctx, tmp_path):
    """The tab lists the uploaded file's TraceIndex (rows, summary columns, byte locations), and
    a row of that index opens by reading only its own bytes: with every other line of the file
    corrupted after the upload, the indexed row still opens to the trace the tab loaded."""
    from backend.trace import TraceFormatError, TraceIndex

    lines = [ln for p in sorted(SAMPLE_DIR.glob("*.jsonl")) for ln in p.read_bytes().splitlines() if ln.strip()][:4]
    f = tmp_path / "four.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    sess = fresh(ctx)
    trace_files.load_file(ctx, sess, str(f))
    ix = sess.file_index
    assert isinstance(ix, TraceIndex) and len(ix) == len(sess.file_traces) == 4 and ix.traces is None
    df = trace_files.table_outputs(sess)[2]
    for c in ("id", "turns", "tokens", "errors"):
        assert list(df[c]) == ix.cols[c], c
    loaded = [trace_files.file_trace(sess, i) for i in range(4)]
    assert list(df["preview"]) == [trace_files.preview(t) for t in loaded]
    assert ix.cols["offset"] == [sum(len(x) + 1 for x in lines[:i]) for i in range(4)]
    # corrupt lines 1, 2 and 4 in place (same lengths): row 3 still opens, the others are refused
    raw = bytearray(f.read_bytes())
    for i in (0, 1, 3):
        off, n = ix.cols["offset"][i], ix.cols["length"][i]
        raw[off:off + n - 1] = b"x" * (n - 1)
    f.write_bytes(bytes(raw))
    assert ix.open(2) == loaded[2]
    for i in (0, 1, 3):
        with pytest.raises(TraceFormatError, match=rf"^line {i + 1}: invalid JSON"):
            ix.open(i)
    # the listing did not re-read the file
    assert list(trace_files.table_outputs(sess)[2]["id"]) == list(df["id"])


def _sample_lines() -> list[bytes]:
    return [ln for p in sorted(SAMPLE_DIR.glob("*.jsonl")) for ln in p.read_bytes().splitlines() if ln.strip()]


def test_an_upload_of_our_traces_is_listed_not_held(ctx, tmp_path, monkeypatch):
    """An upload of our own traces is listed from its index and opened row by row: the session
    holds the one trace the Inspector shows (at most MAX_OPENED opened ones), its own link to the
    file (gradio deletes its copy after an hour), and the table's filters, search, charts and
    export give what they give for the same traces held in memory."""
    from backend.checks.labels import trace_termination_label
    from backend.trace import load_traces

    monkeypatch.setattr(trace_files, "MAX_OPENED", 3)
    lines = _sample_lines()
    f = tmp_path / "all.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    want = load_traces(str(f)).traces
    sess = fresh(ctx)
    status, probs = trace_files.load_file(ctx, sess, str(f))
    assert f"{len(want)} trace(s) loaded" in status and probs.empty
    assert isinstance(sess.file_rows, trace_files.FileRows) and len(sess.file_traces) == len(want)
    held = [x for x in sess.traces if x.startswith("file · ")]
    assert held == [sess.current] == [sess.file_traces[0]] and sess.traces[sess.current] == want[0]
    os.remove(f)  # gradio's copy goes; the session's link stays
    assert [trace_files.file_trace(sess, i) for i in range(len(want))] == want
    assert [x for x in sess.traces if x.startswith("file · ")] == held  # reading for export keeps nothing
    # the table and its filters, as for the traces held (the samples' own labels and search text)
    df = trace_files.table_outputs(sess)[2]
    assert list(df["termination"]) == [trace_termination_label(t) for t in want]
    for reason, query in (("malformed_tool_call", ""), (trace_files.ALL, "paris"), (trace_files.ALL, "get_weather"),
                          (trace_files.ALL, "no such text anywhere")):
        got = trace_files.table_outputs(sess, reason, trace_files.ALL, query)[2]
        expect = [t.id for t in want if (reason == trace_files.ALL or t.termination_reason == reason)
                  and query in trace_files._haystack(t)]
        assert list(got["id"]) == expect, (reason, query)
    fig = trace_files.table_outputs(sess)[3]
    ref = trace_files.charts.file_distributions(want)
    assert [list(d.x) for d in fig.data] == [list(d.x) for d in ref.data]
    # opening rows: each is read when selected; past MAX_OPENED the oldest (not the shown one) is let go
    opened = [trace_files.open_file_row(sess, i) for i in range(1, 6)]
    assert opened == sess.file_traces[1:6]
    file_labels = [x for x in sess.traces if x.startswith("file · ")]
    assert file_labels == [sess.current, *opened[-2:]]  # 3: the shown one and the two newest
    assert [sess.traces[x] for x in opened[-2:]] == want[4:6]
    assert trace_files.open_file_row(sess, 1) == sess.file_traces[1] and sess.traces[sess.file_traces[1]] == want[1]
    # export of the filtered rows, read one at a time from the kept file
    out = trace_files.export_filtered(sess, trace_files.table_outputs(sess, trace_files.ALL, trace_files.ALL, "seattle")[2], "jsonl")
    assert [t.id for t in load_any(out).traces] == [t.id for t in want if "seattle" in trace_files._haystack(t)]
    sess.remove_temp_dirs()
    assert not os.path.exists(sess.file_rows.path)  # the session's link goes with it


def test_an_uploads_kept_link_is_named_inside_the_sessions_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    folder = tmp_path / "kept"
    folder.mkdir()
    for name in ("..jsonl", ".hidden.jsonl", "a b;$(x).jsonl", "é.jsonl", "..."):
        p = src / name
        p.write_text("x\n")
        out = trace_files.keep_upload(str(p), str(folder))
        assert os.path.dirname(out) == str(folder) and not os.path.basename(out).startswith(".")
        assert open(out).read() == "x\n"
        os.remove(out)


def test_a_new_upload_replaces_the_last_and_a_failed_one_keeps_it(ctx, tmp_path):
    lines = _sample_lines()
    a, b, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "bad.parquet"
    a.write_bytes(b"\n".join(lines[:3]) + b"\n")
    b.write_bytes(b"\n".join(lines[3:5]) + b"\n")
    bad.write_bytes(b"not parquet")
    sess = fresh(ctx)
    trace_files.load_file(ctx, sess, str(a))
    first_a = sess.current
    trace_files.open_file_row(sess, 1)
    status, _ = trace_files.load_file(ctx, sess, str(bad))
    assert "Could not read" in status
    assert sess.file_name == "a.jsonl" and trace_files.file_trace(sess, 2).id == json.loads(lines[2])["id"]
    kept_a = sess.file_rows.path
    trace_files.load_file(ctx, sess, str(b))
    assert not os.path.exists(kept_a)  # the last upload's link is removed with it
    file_labels = [x for x in sess.traces if x.startswith("file · ")]
    assert first_a not in file_labels and file_labels == [sess.current] == [sess.file_traces[0]]
    assert len(sess.file_traces) == 2 and trace_files.file_trace(sess, 1).id == json.loads(lines[4])["id"]
    # the same file twice: new labels, each row opens its own trace
    trace_files.load_file(ctx, sess, str(b))
    assert [trace_files.file_trace(sess, i).id for i in range(2)] == [json.loads(x)["id"] for x in lines[3:5]]


def test_a_reader_of_the_last_upload_still_reads_it_while_a_new_one_replaces_it(ctx, tmp_path):
    """A row clicked (or exported, or audited) from the last upload while a re-read replaces it
    reads the rows it was given: their folder goes once nothing reads them (CI: a tokenizer
    change's re-read removed it under a row click, "No such file or directory")."""
    import gc

    lines = _sample_lines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"\n".join(lines[:3]) + b"\n")
    b.write_bytes(b"\n".join(lines[3:5]) + b"\n")
    sess = fresh(ctx)
    trace_files.load_file(ctx, sess, str(a))
    in_flight = sess.file_rows  # what a handler running meanwhile holds
    trace_files.load_file(ctx, sess, str(b))
    assert sess.file_name == "b.jsonl" and os.path.exists(in_flight.path)
    assert in_flight.index.open(2).id == json.loads(lines[2])["id"]
    kept_a = in_flight.path
    del in_flight
    gc.collect()
    assert not os.path.exists(kept_a)  # and then it goes


def test_a_reread_that_ends_after_a_newer_one_is_dropped(ctx, monkeypatch):
    """Two reads of one session at once (a tokenizer changed, then another, while the first reads):
    the one asked for last is shown whatever order they end in, and the other's copy is removed."""
    import concurrent.futures
    import gc
    import threading

    path = os.path.join(IMPORT_DATA, "sharegpt.jsonl")
    real, gate, entered, dirs = trace_files.read_upload, threading.Event(), threading.Event(), {}

    def slow_first(ctx, path, fmt="auto", tokenizer=None, *, keep_in):
        dirs[tokenizer] = keep_in
        if tokenizer == "qwen3":
            entered.set()
            assert gate.wait(60)
        return real(ctx, path, fmt, tokenizer, keep_in=keep_in)

    monkeypatch.setattr(trace_files, "read_upload", slow_first)
    sess = fresh(ctx)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(trace_files.load_file, ctx, sess, path, "auto", "qwen3")
        assert entered.wait(60)
        status, _ = trace_files.load_file(ctx, sess, path, "auto", "qwen2.5")
        gate.set()
        assert first.result(120) is None  # superseded: nothing of it is shown
    gc.collect()
    assert "rendered and decoded with qwen2.5" in status
    assert sess.file_rows.tokenizer == "qwen2.5" and trace_files.file_trace(sess, 0).tokenizer.name == "qwen2.5"
    assert not os.path.exists(dirs["qwen3"]) and os.path.exists(dirs["qwen2.5"])


def test_trace_file_filters_search_and_export(ctx, tmp_path):
    sess = fresh(ctx)
    full = trace_files.traces_frame(sess.file_traces, sess.traces)
    assert set(full.columns) == set(trace_files.COLUMNS)
    mal = trace_files.filter_frame(full, sess.file_traces, sess.traces, "malformed_tool_call", trace_files.ALL, "")
    assert list(mal["id"]) == ["sample-malformed-call"]
    paris = trace_files.filter_frame(full, sess.file_traces, sess.traces, trace_files.ALL, trace_files.ALL, "paris")
    assert list(paris["id"]) == ["sample-hunyuan-format"]
    reasons, sources = trace_files.filter_choices(full)
    assert "malformed tool call (malformed_tool_call)" in reasons and "sample" in sources
    for fmt in ("jsonl", "parquet"):
        path = trace_files.export_filtered(sess, paris, fmt)
        res = load_any(path)
        assert [t.id for t in res.traces] == ["sample-hunyuan-format"] and not res.problems
        assert res.traces[0] == sess.traces[sess.file_traces[int(paris.iloc[0]["#"])]]
    # OpenTelemetry: the same conversation comes back through the otel importer
    path = trace_files.export_filtered(sess, paris, "otel")
    assert path.endswith("-filtered.otlp.jsonl")
    from backend.importers import import_file

    back = import_file(path, "auto")
    want = sess.traces[sess.file_traces[int(paris.iloc[0]["#"])]]
    assert back.formats == {"otel": 1} and not back.problems
    assert [(m["role"], m.get("content")) for m in back.traces[0].messages] == [(m["role"], m.get("content")) for m in want.messages]


def test_trace_file_unreadable(ctx, tmp_path):
    f = tmp_path / "x.parquet"
    f.write_bytes(b"not parquet at all")
    status, probs = trace_files.load_file(ctx, fresh(ctx), str(f))
    assert "Could not read" in status and "Traceback" not in status


IMPORT_DATA = os.path.join(os.path.dirname(__file__), "data", "import")


@pytest.mark.parametrize("name,fmt", [
    ("agents_sdk_run.json", "agents-sdk"), ("agents_sdk_items.json", "agents-sdk"), ("verl_rollout_dump.jsonl", "verl"),
    ("verl_agent_loop.jsonl", "verl"), ("openai_chat.jsonl", "openai-chat"), ("sharegpt.jsonl", "sharegpt"),
])
def test_trace_file_upload_imports_other_tools_formats(ctx, name, fmt):
    """The Trace files tab takes what other tools write (it used to refuse such a file with a
    hint to run the CLI): the upload equals the importer's own result, shown as a trace table."""
    from backend.importers import import_file

    path = os.path.join(IMPORT_DATA, name)
    want = import_file(path, fmt, tokenizer="qwen3")
    assert want.traces
    sess = fresh(ctx)
    status, probs = trace_files.load_file(ctx, sess, path)
    assert f"{len(want.traces)} trace(s) imported from <b>{fmt}</b>" in status, status
    got = [trace_files.file_trace(sess, i) for i in range(len(sess.file_traces))]  # read from the converted copy
    assert [x for x in sess.traces if x.startswith("file · ")] == [sess.current]  # an import is not held either
    assert isinstance(sess.file_rows, trace_files.FileRows) and sess.file_rows.path.endswith(".jsonl")
    assert [(t.id, t.prompt_ids, t.response_ids, t.response_mask, t.messages) for t in got] == \
        [(t.id, t.prompt_ids, t.response_ids, t.response_mask, t.messages) for t in want.traces]
    # listed: bad records, then what was not carried over, then calls kept as written (unreadable)
    assert list(probs["line"]) == [p.line for p in want.problems + want.losses + want.unreadable]
    df = trace_files.table_outputs(sess)[2]
    assert len(df) == len(want.traces) and set(df["source"]) == {fmt}
    given = sum(1 for t in want.traces if t.metadata.get("ids") == "given")
    assert (f"token ids as given for {given}" in status) == bool(given)


def test_trace_file_import_tokenizer_and_format_choice(ctx, tmp_path):
    path = os.path.join(IMPORT_DATA, "sharegpt.jsonl")
    sess = fresh(ctx)
    status, _ = trace_files.load_file(ctx, sess, path, "auto", "qwen2.5")
    assert "rendered and decoded with qwen2.5" in status
    first = trace_files.file_trace(sess, 0)
    assert first.tokenizer.name == "qwen2.5"
    assert first.prompt_ids + first.response_ids == ctx.tokenizers.get("qwen2.5").tokenizer.encode(
        ctx.tokenizers.get("qwen2.5").tokenizer.decode(first.prompt_ids + first.response_ids), add_special_tokens=False)
    # a tokenizer outside the offline profiles is refused (a visitor must not make the server fetch one)
    status, probs = trace_files.load_file(ctx, fresh(ctx), path, "auto", "someone/their-model")
    assert "Could not read" in status and "not one this app imports with" in status and probs.empty
    # a format forced onto records of another kind: each record refused with its line, nothing loaded
    sess = fresh(ctx)
    status, probs = trace_files.load_file(ctx, sess, path, "agents-sdk")
    assert "0 trace(s) imported from <b>agents-sdk</b>" in status and "4 bad record(s)" in status
    assert list(probs["line"]) == [1, 2, 3, 4] and all("run items" in p for p in probs["problem"])
    assert sess.file_traces == []
    # our trace lines carry verl's agent-loop fields: forced to verl they keep their ids exactly
    ours = str(SAMPLE_DIR / "01_weather.jsonl")
    sess = fresh(ctx)
    status, _ = trace_files.load_file(ctx, sess, ours, "verl")
    (t,) = [trace_files.file_trace(sess, i) for i in range(len(sess.file_traces))]
    assert "token ids as given for 1" in status and len(t.prompt_ids) == 178 and inspector.mask_runs(t.response_mask) == [(1, 25), (0, 29), (1, 16)]
    # our own traces under auto: loaded as they are, not imported
    status, _ = trace_files.load_file(ctx, fresh(ctx), ours)
    assert "1 trace(s) loaded" in status and "imported" not in status


def test_trace_file_upload_imports_another_tools_parquet(ctx, tmp_path):
    """HF messages rows in Parquet (a training set): the file is not ours, so load_any refuses
    it; the upload imports it row by row and reports the damaged row by number."""
    conv = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'},
            {"role": "tool", "content": "3C"}, {"role": "assistant", "content": "It is 3C."}]
    p = tmp_path / "rows.parquet"
    pd.DataFrame({"messages": [json.dumps(conv), "[not json", json.dumps(conv)]}).to_parquet(p)
    with pytest.raises(Exception):
        load_any(str(p))
    sess = fresh(ctx)
    status, probs = trace_files.load_file(ctx, sess, str(p))
    assert "2 trace(s) imported from <b>sharegpt</b>" in status and "listed below with their row numbers" in status
    assert list(probs["line"]) == [2]
    t = trace_files.file_trace(sess, 0)
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"] and 1 in t.response_mask


# ---- template lab -----------------------------------------------------------------------------


def test_template_lab_compare(ctx):
    msgs = json.dumps(template_lab.EXAMPLE_MESSAGES)
    tools = json.dumps(template_lab.EXAMPLE_TOOLS)
    out = template_lab.run_lab(ctx, msgs, tools, False, '{"enable_thinking": false}', True,
                               "qwen3", template_lab.OWN, "", "qwen3-thinking", template_lab.OWN, "")
    ls, lt, lk, rs, rt, rk, diff = out
    assert 'data-count="tokens"' in ls and 'data-count="tokens"' in rs
    assert "d-del" in diff or "d-add" in diff
    assert "&lt;|im_start|&gt;" in lt


def test_template_lab_custom_template_and_errors(ctx):
    msgs = json.dumps([{"role": "user", "content": "<b>hi</b>"}])
    out = template_lab.run_lab(ctx, msgs, "[]", False, "{}", False, "qwen3", template_lab.CUSTOM,
                               "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", "", "", "")
    assert "[user] &lt;b&gt;hi&lt;/b&gt;" in out[1]
    out = template_lab.run_lab(ctx, "[oops", "[]", False, "{}", False, "qwen3", template_lab.OWN, "", "", "", "")
    assert "invalid JSON" in out[0]
    out = template_lab.run_lab(ctx, msgs, "[]", False, "{}", False, "qwen3", template_lab.CUSTOM, "{% if %}", "", "", "")
    assert "ali-err" in out[0]


def test_template_lab_renders_content_parts_and_says_what_it_does_not_render(ctx):
    """Issue 42, items 3-4, in the lab (the rendering it shares with the MCP tools and the CLI):
    text parts render as their text on Qwen3 (an empty turn before), a part without text is said
    in a warning (escaped), gpt-oss renders a call with content null, and a malformed call is
    named."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello <b>there</b>"},
                                          {"type": "<img>", "url": "http://192.0.2.1/a.png"}]}]
    ls, lt, *_ = template_lab.run_lab(ctx, json.dumps(parts), "[]", True, "{}", False, "qwen3", template_lab.OWN, "", "", "", "")
    assert "ali-err" not in ls and "hello &lt;b&gt;there&lt;/b&gt;" in lt
    assert 'data-warning="content-part"' in ls and "messages[0].content[1] (&lt;img&gt;) is not rendered" in ls and "<img>" not in ls
    call = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "Paris"}}}]}]
    ls, lt, *_ = template_lab.run_lab(ctx, json.dumps(call), "[]", False, "{}", False, "gpt-oss", template_lab.OWN, "", "", "", "")
    assert "ali-err" not in ls and "to=functions.get_current_temperature" in lt
    del call[1]["tool_calls"][0]["function"]["arguments"]
    ls, *_ = template_lab.run_lab(ctx, json.dumps(call), "[]", False, "{}", False, "gpt-oss", template_lab.OWN, "", "", "", "")
    assert "ali-err" in ls and "messages[1].tool_calls[0].function.arguments is missing (call &#x27;get_current_temperature&#x27;)" in ls


def test_diff_html_escapes():
    d = template_lab.diff_html("<a>\nsame\n", "<b>\nsame\n")
    assert "<a>" not in d and "&lt;<mark>a</mark>&gt;" in d and "<mark>b</mark>" in d


def test_diff_html_of_huge_renders_marks_only_what_differs():
    """A 400 KB line differing in one character (a tool schema pasted into the lab), inside
    20,000 lines that repeat: the diff comes back (character diffs of long lines used to align
    every repeated character: minutes) and marks just that character and that line."""
    line = '{"type": "function", "function": {"name": "f", "description": "' + "ab" * 200_000 + '"}}\n'
    body = "".join(f"<|im_start|>user\nsame {i % 7}\n<|im_end|>\n" for i in range(5000))
    a = body + line + body
    b = body + line.replace("abab", "abXb", 1)[::-1][::-1] + body
    d = template_lab.diff_html(a, b)
    assert d.count('<div class="d-del">') == 1 and d.count('<div class="d-add">') == 1
    assert d.count("<mark>") == 2 and "<mark>a</mark>" in d and "<mark>X</mark>" in d
    assert "unchanged lines" in d


@pytest.mark.parametrize("name", ["qwen3.5", "llama3", "gpt-oss", "deepseek-v3", "mistral", "glm4.5", "glm5", "minimax-m2"])
def test_template_lab_renders_every_family_and_warns_on_a_misfit(ctx, name):
    """Every profile renders in the lab with its own vocabulary and no warning; a Llama template
    over the Qwen vocabulary shows the fit warning beside its (wrong) token count."""
    msgs = json.dumps(template_lab.EXAMPLE_MESSAGES)
    tools = json.dumps(template_lab.EXAMPLE_TOOLS)
    # the example ends with the assistant's answer: no generation prompt (mistral-common refuses one there)
    ls, lt, lk, *_ = template_lab.run_lab(ctx, msgs, tools, False, "{}", False, name, template_lab.OWN, "", "", "", "")
    assert 'data-count="tokens"' in ls and "ali-err" not in ls, ls
    assert 'data-warning="template-fit"' not in ls
    assert name in template_lab.tokenizer_choices(ctx)
    specials = int(re.search(r'data-count="special">(\d+)<', lk).group(1))
    assert specials >= 4, "a family's control tokens are counted and framed as special tokens"
    ls, *_ = template_lab.run_lab(ctx, msgs, tools, True, "{}", False, "qwen3", "llama3_1", "", "", "", "")
    assert 'data-warning="template-fit"' in ls and "&lt;|start_header_id|&gt;" in ls


def test_template_lab_puts_trls_gptoss_beside_openai_harmony(ctx):
    """gpt-oss (trl's template) left, gpt-oss-harmony (openai-harmony's reference renderer) right:
    the diff shows where they differ, e.g. the call header and the tool result's quoting."""
    msgs = json.dumps(template_lab.EXAMPLE_MESSAGES[:4])  # up to the tool result
    tools = json.dumps(template_lab.EXAMPLE_TOOLS)
    ls, lt, lk, rs, rt, rk, diff = template_lab.run_lab(ctx, msgs, tools, True, "{}", True, "gpt-oss", template_lab.OWN,
                                                        "", "gpt-oss-harmony", template_lab.OWN, "")
    assert "ali-err" not in ls + rs, (ls, rs)
    assert "gptoss" in ls and "openai-harmony" in rs
    assert "d-del" in diff or "d-add" in diff
    sp = '<mark class="tv-sp">&lt;|{}|&gt;</mark>'.format
    # trl's call header, then openai-harmony's
    assert f"to=functions.get_current_temperature{sp('channel')}commentary json{sp('message')}" in lt
    assert f"{sp('channel')}commentary to=functions.get_current_temperature {sp('constrain')}json{sp('message')}" in rt
