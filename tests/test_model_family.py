"""A model the operator names (ALI_MODEL) gets its family's profile (backend.loading.tokenizers
.family_profile / load_model_tokenizer): the hub ids below are the families' published names;
the tokenizer folders are written offline with transformers' own save_pretrained."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backend.loading.tokenizers import family_profile, load_model_tokenizer, load_tokenizer, same_vocabulary


@pytest.mark.parametrize("model,profile", [
    ("Qwen/Qwen3-4B-Instruct-2507", "qwen3"),
    ("Qwen/Qwen3-8B", "qwen3"),
    ("Qwen/Qwen3.6-35B-A3B", "qwen3.5"),
    ("Qwen/Qwen3.5-9B", "qwen3.5"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama3"),
    ("openai/gpt-oss-20b", "gpt-oss-harmony"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("mistralai/Devstral-Small-2507", "mistral"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
    ("zai-org/GLM-4.5", "glm4.5"),
    ("zai-org/GLM-4.5-Air", "glm4.5"),
    ("zai-org/GLM-4.6", "glm4.5"),
    ("zai-org/GLM-4.7", "glm4.5"),
    ("zai-org/GLM-4.7-Flash", "glm5"),  # the 154k vocabulary, not GLM-4.7's
    ("zai-org/GLM-5", "glm5"),
    ("zai-org/GLM-5.1", "glm5"),
    ("THUDM/glm-4-9b-chat", None),  # GLM-4's own (older) vocabulary
    ("zai-org/GLM-4-32B-0414", None),
    ("MiniMaxAI/MiniMax-M2", "minimax-m2"),
    ("MiniMaxAI/MiniMax-M2.5", "minimax-m2"),
    ("MiniMaxAI/MiniMax-M1-80k", None),
    ("MiniMaxAI/MiniMax-Text-01", None),
    ("/data/models/llama-3-8b-sft/", "llama3"),
    ("google/gemma-3-4b-it", "gemma3"),
    ("google/gemma-3-27b-it", "gemma3"),
    ("google/gemma-3-1b-it", "gemma3"),
    ("google/gemma-2-9b-it", "gemma2"),
    ("google/gemma-2-2b-it", "gemma2"),
    ("google/gemma-2b-it", None),  # Gemma 1 (the 2B), not Gemma 2
    ("google/gemma-7b", None),
    ("google/gemma-3n-E4B-it", None),  # Gemma 3n: another vocabulary size
    ("google/paligemma2-3b-pt-224", None),
    ("google/codegemma-7b-it", None),
    ("google/gemma-4-E2B-it", None),
    ("/srv/ckpt/global_step_100/actor", None),
    ("", None),
])
def test_family_from_the_models_name(model, profile):
    assert family_profile(model) == profile


def folder(tmp_path: Path, name: str, tokenizer, template: str | None = None) -> str:
    d = tmp_path / name
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(d))
    return str(d)


def test_gpt_oss_model_renders_with_harmony_when_the_vocabulary_is_the_models(tmp_path):
    ref = load_tokenizer("gpt-oss-harmony")
    own = load_tokenizer("gpt-oss")  # o200k_harmony with trl's gptoss template, as a hub folder holds it
    path = folder(tmp_path, "gpt-oss-20b", own.tokenizer, own.chat_template)
    bundle, note = load_model_tokenizer(path)
    assert bundle.renderer is not None and bundle.template_name == ref.template_name and bundle.parser == "harmony"
    assert "vocabulary is the model's" in note
    # the same vocabulary, so the ids of a plain text agree with the folder's own tokenizer
    assert same_vocabulary(bundle.tokenizer, own.tokenizer)


def test_a_name_that_lies_about_the_vocabulary_keeps_the_models_own_template(tmp_path, smollm2_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model_dir)
    path = folder(tmp_path, "gpt-oss-finetune", tok)
    bundle, note = load_model_tokenizer(path)
    assert bundle.renderer is None and len(bundle.tokenizer) == len(tok)
    assert "not profile gpt-oss-harmony's" in note
    assert not same_vocabulary(tok, load_tokenizer("gpt-oss-harmony").tokenizer)


def test_own_template_without_a_tool_format_takes_the_familys(tmp_path, smollm2_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model_dir)
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    bundle, note = load_model_tokenizer(folder(tmp_path, "Llama-3-custom", tok, plain))
    assert bundle.parser == "llama3_json" and "family llama3" in note  # the profile's format
    assert set(load_tokenizer("llama3").stop_tokens) <= set(bundle.stop_tokens)
    # a template that shows its format keeps it
    bundle, _ = load_model_tokenizer(str(Path(shutil.copytree(smollm2_model_dir, tmp_path / "llama-3-hermes-sft"))))
    assert bundle.parser == "hermes"


def test_unknown_family_is_the_models_own(tmp_path, smollm2_model_dir):
    path = str(Path(shutil.copytree(smollm2_model_dir, tmp_path / "my-finetune")))
    bundle, note = load_model_tokenizer(path)
    assert bundle.parser == "hermes" and "no known family" in note


def test_a_glm_folder_gets_the_familys_stop_tokens_and_rule(tmp_path):
    """A GLM-4.6 checkpoint folder (the model's tokenizer and template, saved by transformers): its
    own tokenizer and template render, with GLM's <|user|> / <|observation|> stop tokens and the
    glm continuation rule."""
    from backend.families import rule_for

    own = load_tokenizer("glm4.5")
    bundle, note = load_model_tokenizer(folder(tmp_path, "GLM-4.6", own.tokenizer, own.chat_template))
    assert "family glm4.5" in note and bundle.parser == "glm45" and bundle.renderer is None
    assert set(own.stop_tokens) <= set(bundle.stop_tokens)
    ids = bundle.tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|user|>", "<|observation|>"])
    assert set(bundle.stop_token_ids) == set(ids) and bundle.template_warnings() == []
    assert rule_for(bundle).name == "glm"
