"""Byte-level BPE tokenizers from tiktoken-style ranks: the builder every rank-based offline
vocabulary uses (the recipes in :mod:`backend.families`: Qwen2/3, Qwen3.5, Llama 3, o200k_harmony),
and the loader of the folders it writes. A leaf: it imports nothing from the project but errors.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.errors import ModelBuildError


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """tiktoken's text format: one ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def tiktoken_text(ranks: dict[bytes, int]) -> bytes:
    """The ranks in tiktoken's text format, byte for byte as ``tiktoken.load.dump_tiktoken_bpe``."""
    return b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """tiktoken stores ranks only; the merge for each token is what BPE over the lower ranks
    leaves as the last two parts (tokens BPE cannot reach in two parts get no merge)."""
    merges: list[tuple[bytes, bytes, int]] = []
    get = ranks.get
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_i, best_r = -1, rank
            for i in range(len(parts) - 1):
                r = get(parts[i] + parts[i + 1])
                if r is not None and r < best_r:
                    best_i, best_r = i, r
            if best_i < 0:
                break
            parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1], rank))
    merges.sort(key=lambda m: m[2])
    return [(a, b) for a, b, _ in merges]


def build_bpe_files(
    out: Path,
    ranks: dict[bytes, int],
    pattern: str,
    added: Sequence[tuple[int, str, bool]],
    *,
    eos: str,
    pad: str | None = None,
    bos: str | None = None,
    nfc: bool = False,
    model_max_length: int,
    ignore_merges: bool = False,
    bos_template: bool = False,
) -> None:
    """Write a Hugging Face tokenizer folder for a tiktoken-style vocabulary: byte-level BPE with
    merges recovered from ``ranks``, a ``Split`` pre-tokenizer on ``pattern`` (then ByteLevel
    without its own regex), optional NFC, and ``added`` = (id, content, special) in id order.

    ``ignore_merges`` takes a pre-token that is itself in the vocabulary as one token, as
    tiktoken does. ``bos_template`` makes ``encode(add_special_tokens=True)`` prepend ``bos``
    (Llama 3's post-processor)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers import models as tk_models
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    PreTrainedTokenizerFast = _fast_tokenizer_class()  # noqa: N806 - the class

    byte_enc = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_enc[x] for x in b)

    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in recover_merges(ranks)]
    tok = Tokenizer(tk_models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for tid, content, special in added:
        at = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        got = tok.token_to_id(content)
        if got != tid:
            raise ModelBuildError(f"added token {content!r} got id {got}, expected {tid}")
    if bos_template:
        if bos is None:
            raise ModelBuildError("bos_template needs a bos token")
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    kwargs: dict[str, Any] = {"eos_token": eos}
    if bos is not None:
        kwargs["bos_token"] = bos
    if pad is not None:
        kwargs["pad_token"] = pad
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, model_max_length=model_max_length, **kwargs
    )
    fast.save_pretrained(str(out))




_TRANSFORMERS_IMPORT = threading.Lock()


def _fast_tokenizer_class() -> Any:
    """transformers' ``PreTrainedTokenizerFast``, imported under a lock: while one thread is still
    importing it through transformers' lazy module, another thread's import of it fails with
    ImportError (3 of 4 concurrent first tokenizer loads of a fresh process did: the first MCP
    calls to a server that had not loaded one yet)."""
    with _TRANSFORMERS_IMPORT:
        from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast


@lru_cache(maxsize=32)
def load_folder_tokenizer(folder: str):
    """A tokenizer folder a family's recipe wrote (with this module's builder, or a tokenizer.json
    copied as is), constructed straight from its tokenizer.json: much faster than AutoTokenizer
    (which imports torch and re-checks the vocabulary). Cached per folder, with room for every
    family's vocabulary (12 today): with fewer slots than vocabularies, a pass over every profile
    evicted each one before its next use and re-read 10-33 MB files over and over."""
    PreTrainedTokenizerFast = _fast_tokenizer_class()  # noqa: N806 - the class

    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    kwargs = {k: cfg[k] for k in ("eos_token", "pad_token", "bos_token", "unk_token", "model_max_length") if cfg.get(k)}
    # the file itself, not a Tokenizer object: transformers deep-copies an object it is given
    # (a serialise and a parse again: 2 s of Gemma's 4 s load, its 262k vocabulary)
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    return PreTrainedTokenizerFast(tokenizer_file=path, clean_up_tokenization_spaces=False, **kwargs)
