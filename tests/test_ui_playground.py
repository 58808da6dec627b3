"""What the inspector says (issue 12), in-process: end-state labels (playground status, chat,
trace table), a Stop inside a tool call, forced tool_choice warnings and presets, progress while
a run or a load is under way, the trace table's preview and match count. The same behaviour in a
real browser: ``tests/test_browser_playground.py``."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest
from playground_support import fresh, run_all, settings

from backend import engine
from backend.checks.labels import TERMINATION_WORDS, termination_label, trace_termination_label
from backend.trace import Trace
from ui import playground, trace_files
from ui.context import AppContext, load_samples


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


def plain(html_text: str) -> str:
    return re.sub(r"<[^>]+>", "", html_text).replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&")


# ---- labels -------------------------------------------------------------------------------------


def test_every_engine_end_state_has_a_label_with_its_code():
    codes = [v for k, v in vars(engine.R).items() if k.isupper() and isinstance(v, str) and k in (
        "NO_TOOL_CALLS", "RESPONSE_LENGTH", "MAX_ASSISTANT_TURNS", "MAX_USER_TURNS", "MALFORMED_TOOL_CALL", "TOOL_ERROR",
        "GENERATION_ERROR", "RENDER_ERROR", "CANCELLED", "TIME_LIMIT")]
    assert len(codes) == 10
    for c in codes:
        assert c in TERMINATION_WORDS, c
        assert termination_label(c) == f"{TERMINATION_WORDS[c]} ({c})"
    assert termination_label("no_tool_calls") == "answered (no_tool_calls)"
    assert termination_label("cancelled") == "stopped by user (cancelled)"
    assert termination_label("time_limit") == "stopped at the server's time limit (time_limit)"
    assert termination_label("render_error") == "template error (render_error)"
    assert termination_label("response_length") == "hit response_length (response_length)"
    assert termination_label("someone_elses_reason") == "someone_elses_reason"  # unknown: the code as it is
    assert termination_label(None) == termination_label("") == "no end state"


def test_an_import_without_an_end_state_says_so(ctx):
    from backend.importers import import_records
    from backend.loading.tokenizers import load_tokenizer

    res = import_records([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}],
                         "openai-chat", bundle=load_tokenizer("qwen3"))
    t = res.traces[0]
    assert t.termination_reason is None
    assert trace_termination_label(t) == "imported (no end state)"
    assert trace_termination_label(Trace()) == "no end state"
    assert trace_termination_label(ctx.samples[0][1]) == "answered (no_tool_calls)"


# ---- playground status and chat -------------------------------------------------------------------


async def test_a_normal_run_ends_answered_with_the_code_beside_it(ctx):
    out = await run_all(ctx, fresh(ctx), "What's the weather in Seattle?", settings())
    msgs, status, trace = out[-1]
    assert trace.termination_reason == "no_tool_calls"  # the data keeps verl's code
    assert "run 1 ended: answered (no_tool_calls)" in plain(status)
    end = msgs[-1]
    assert end["metadata"]["title"] == "Run ended · answered (no_tool_calls)"
    assert end["content"] == "Run ended: **answered (no_tool_calls)**"


async def test_stop_inside_a_tool_call_is_shown_as_stopped_not_malformed(ctx):
    """The chat of a run stopped while the model wrote a call: 'stopped by user', the unfinished
    call as such (not 'Malformed tool call'), no error counted in the trace table."""
    script = ['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "' + "Seattle " * 200 + '"}}\n</tool_call>']
    sess = fresh(ctx)
    items = []
    async for item in playground.run_turn(ctx, sess, "go", settings(script=json.dumps(script), token_delay=0.005)):
        items.append(item)
        live = item[0] or []
        if sess.cancel is not None and not sess.cancel.is_set() and any(
                "Seattle Seattle" in m.get("content", "") for m in live if m.get("metadata", {}).get("status") == "pending"):
            sess.cancel.set()  # Stop, once the call's arguments are being written
    msgs, status, trace = items[-1]
    assert trace.termination_reason == "cancelled"
    assert "stopped by user (cancelled)" in plain(status)
    titles = [m.get("metadata", {}).get("title", "") for m in msgs]
    assert not any("Malformed" in t for t in titles), titles
    assert any(t.startswith("Unfinished tool call") for t in titles), titles
    assert trace.step_errors() == 0
    df = trace_files.traces_frame(["x"], {"x": trace})
    assert df.iloc[0]["errors"] == 0 and df.iloc[0]["termination"] == "stopped by user (cancelled)"


# ---- tool_choice ----------------------------------------------------------------------------------


def test_tool_choice_presets_put_exact_choices_before_the_ones_containing_them():
    """Gradio's dropdown selects the first option that contains the typed text: typing
    'required' must find 'required' before 'required, then auto'; a tool's name before its preset."""
    choices = playground.tool_choice_choices(["get_current_temperature", "search"])
    assert choices[:3] == ["auto", "required", "none"]
    assert "required, then auto" in choices and "get_current_temperature, then auto" in choices
    for typed in ("auto", "required", "none", "get_current_temperature", "search"):
        first = next(c for c in choices if typed in c)
        assert first == typed, (typed, first)


@pytest.mark.parametrize("choice, has_tools, policy", [
    ("required, then auto", True, ["required", "auto"]),
    ("get_current_temperature, then auto", True, ["get_current_temperature", "auto"]),
    ("required, then auto", False, "auto"),
    ("required", True, "required"),
    ("auto", True, "auto"),
])
def test_tool_choice_policy_of_each_preset(choice, has_tools, policy):
    assert playground.tool_choice_policy(choice, has_tools) == policy


def test_tool_choice_note_warns_when_every_turn_must_call_a_tool():
    for choice in ("required", "get_current_temperature", "auto,required", "get_current_temperature, required"):
        kind, text = playground.tool_choice_note(choice, has_tools=True)
        assert kind == "warn" and "every turn" in text and "response_length" in text, choice
    for choice in ("auto", "none", "required, then auto", "get_current_temperature, then auto", "required,auto"):
        assert playground.tool_choice_note(choice, has_tools=True) is None, choice
    kind, text = playground.tool_choice_note("required, then auto", has_tools=False)
    assert kind == "info" and "fell back to auto" in text


async def test_a_forced_choice_says_so_in_the_status(ctx):
    script = json.dumps(['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "X"}}\n</tool_call>'] * 3)
    out = await run_all(ctx, fresh(ctx), "go", settings(script=script, tool_choice="required", max_assistant_turns=3))
    running = [plain(s) for _, s, t in out if t is None]
    assert any("every turn" in s for s in running), running
    msgs, status, trace = out[-1]
    assert trace.termination_reason == "max_assistant_turns"
    assert "hit max_assistant_turns (max_assistant_turns)" in plain(status) and "every turn" in plain(status)


async def test_required_then_auto_without_tools_says_it_fell_back(ctx):
    out = await run_all(ctx, fresh(ctx), "hi", settings(script=json.dumps(["Hello."]), tools="[]",
                                                          tool_choice="required, then auto"))
    assert out[-1][2].termination_reason == "no_tool_calls"
    assert "fell back to auto" in plain(out[-1][1])


# ---- progress -------------------------------------------------------------------------------------


async def test_a_run_shows_tokens_so_far_and_tokens_per_second(ctx):
    out = await run_all(ctx, fresh(ctx), "go", settings(script=json.dumps(["word " * 60]), tools="[]", token_delay=0.005))
    running = [plain(s) for _, s, t in out if t is None and "running" in s]
    counts = [int(m.group(1)) for s in running if (m := re.search(r"· (\d+) tokens · [\d.]+ tok/s", s))]
    assert counts and counts[-1] > counts[0] > 0, running[:5]


async def test_a_slow_tokenizer_load_shows_what_it_waits_for(ctx):
    """While the tokenizer loads, the status says what is loading and for how long, more than
    once (condition-based: the load is held until two such updates have arrived)."""
    release = threading.Event()

    class SlowCtx(AppContext):
        def visitor_bundle(self, tokenizer, template=None):
            release.wait(60)
            return super().visitor_bundle(tokenizer, template)

    slow = SlowCtx(samples=ctx.samples)
    gen = playground.run_turn(slow, fresh(slow), "hi", settings(script=json.dumps(["Hello."]), tools="[]"))
    seen = []
    try:
        while len(seen) < 2:
            _, status, _ = await asyncio.wait_for(gen.__anext__(), timeout=30)
            if "loading tokenizer qwen3" in status:
                seen.append(plain(status))
    finally:
        release.set()
    assert seen[0] != seen[1] and re.search(r"\d+\.\d s", seen[1]), seen
    rest = [item async for item in gen]
    assert rest[-1][2].termination_reason == "no_tool_calls"


# ---- message box ----------------------------------------------------------------------------------


async def test_send_clears_the_message_box_once_the_run_starts_and_keeps_what_is_typed_next(ctx):
    import ui

    demo = ui.build_app(ctx)
    fn = next(d.fn for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "on_send")
    vals = {**settings().__dict__}
    outs = [o async for o in fn(fresh(ctx), "What's the weather in Seattle?", vals)]
    boxes = [o[3] for o in outs]
    assert boxes[0] == ""  # cleared with the first update of an accepted run
    assert all(b == {"__type__": "update"} for b in boxes[1:]), boxes  # then left to the user
    # a message refused before the run starts stays in the box
    bad = {**vals, "tools": "{"}
    outs = [o async for o in fn(fresh(ctx), "keep me", bad)]
    assert 'data-status="err"' in outs[-1][2] and all(o[3] in ({"__type__": "update"}, "keep me") for o in outs)


# ---- trace table ----------------------------------------------------------------------------------


def test_trace_table_preview_labels_and_filters(ctx):
    sess = fresh(ctx)
    full = trace_files.traces_frame(sess.file_traces, sess.traces)
    assert "preview" in full.columns
    row = full[full["id"] == "sample-weather-seattle"].iloc[0]
    assert row["preview"] == "What's the weather in Seattle?"
    assert row["termination"] == "answered (no_tool_calls)"
    # filtering by the label or by the code
    reasons, _ = trace_files.filter_choices(full)
    assert "malformed tool call (malformed_tool_call)" in reasons
    for r in ("malformed tool call (malformed_tool_call)", "malformed_tool_call"):
        got = trace_files.filter_frame(full, sess.file_traces, sess.traces, r, trace_files.ALL, "")
        assert list(got["id"]) == ["sample-malformed-call"]


def test_trace_table_match_count(ctx):
    sess = fresh(ctx)
    out = trace_files.table_outputs(sess, query="seattle")
    df = out[2]
    assert 0 < len(df) < len(sess.file_traces)
    assert trace_files.match_count(sess, df) == f'<div class="ali-info" data-count="{len(df)}">{len(df)} of {len(sess.file_traces)} shown</div>'
    assert "8 of 8 shown" in trace_files.match_count(sess, trace_files.table_outputs(sess)[2])


def test_an_imported_trace_without_an_end_state_is_labelled_in_the_table(ctx, tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "Hello there, " + "x" * 200},
                                          {"role": "assistant", "content": "Hi."}]}) + "\n")
    sess = fresh(ctx)
    status, _ = trace_files.load_file(ctx, sess, str(f))
    assert "imported" in status
    df = trace_files.table_outputs(sess)[2]
    assert list(df["termination"]) == ["imported (no end state)"]
    assert df.iloc[0]["preview"].startswith("Hello there, xxx") and len(df.iloc[0]["preview"]) <= 80


# ---- template errors carry the template's line --------------------------------------------------


BAD_SYNTAX = "{% for m in messages %}\n{{ m.content }}\n{{ m.content + }}\n{% endfor %}"
BAD_AT_RUN = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n{{ raise_exception('no tools here') }}"
BAD_IN_MACRO = "{% macro f(x) %}\n{{ x.nope.deeper }}\n{% endmacro %}\n\n{{ f(messages[0]) }}"


@pytest.mark.parametrize("template, line, words", [
    (BAD_SYNTAX, 3, "TemplateSyntaxError"),
    (BAD_AT_RUN, 4, "no tools here"),
    (BAD_IN_MACRO, 2, "UndefinedError"),
])
def test_a_user_template_error_names_its_line(template, line, words):
    """Inline Jinja renders in the guarded worker: its error still says where it failed."""
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import RenderError, render_text

    bundle = load_tokenizer("qwen3").with_template(template)
    assert bundle.untrusted_template
    with pytest.raises(RenderError) as ei:
        render_text(bundle, [{"role": "user", "content": "hi"}])
    assert f"at template line {line}" in str(ei.value) and words in str(ei.value), str(ei.value)


def test_a_trusted_template_error_names_its_line():
    """The operator's templates render in-process (apply_chat_template): same words."""
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import RenderError, render_text

    bundle = load_tokenizer("qwen3").with_template("gemma")  # a trl template: trusted, one line long
    assert not bundle.untrusted_template
    with pytest.raises(RenderError) as ei:
        render_text(bundle, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert "TemplateError at template line 1: Conversation roles must alternate" in str(ei.value)


async def test_the_playground_status_shows_the_template_line(ctx):
    out = await run_all(ctx, fresh(ctx), "hi", settings(template=BAD_AT_RUN, script=json.dumps(["Hello."]), tools="[]"))
    msgs, status, trace = out[-1]
    assert trace.termination_reason == "render_error"
    assert "template error (render_error)" in plain(status)
    assert "at template line 4" in trace.steps[0].error
    assert any("at template line 4" in m["content"] for m in msgs), msgs


async def test_a_slow_prompt_render_keeps_the_status_ticking(ctx):
    """A render that takes long (a template worker starting, a big conversation) is not a frozen
    status: it says it is rendering the prompt, with the time so far, more than once."""
    import dataclasses

    release = threading.Event()

    class Held:  # the tokenizer, whose chat template render waits until the test lets it go
        def __init__(self, tok):
            self._tok = tok

        def apply_chat_template(self, *a, **kw):
            release.wait(60)
            return self._tok.apply_chat_template(*a, **kw)

        def __call__(self, *a, **kw):
            return self._tok(*a, **kw)

        def __len__(self):
            return len(self._tok)

        def __getattr__(self, name):
            return getattr(self._tok, name)

    class SlowRenderCtx(AppContext):
        def visitor_bundle(self, tokenizer, template=None):
            b = super().visitor_bundle(tokenizer, template)
            return dataclasses.replace(b, tokenizer=Held(b.tokenizer))

    slow = SlowRenderCtx(samples=ctx.samples)
    gen = playground.run_turn(slow, fresh(slow), "hi", settings(script=json.dumps(["Hello."]), tools="[]"))
    seen = []
    try:
        while len(seen) < 2:
            _, status, _ = await asyncio.wait_for(gen.__anext__(), timeout=30)
            if "rendering the prompt" in status:
                seen.append(plain(status))
    finally:
        release.set()
    assert seen[0] != seen[1], seen
    rest = [item async for item in gen]
    assert rest[-1][2].termination_reason == "no_tool_calls"
