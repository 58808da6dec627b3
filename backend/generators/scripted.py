"""Replay a script of model outputs, token-exact, with no model.

Each entry is the exact text the model outputs on that turn (``"<tool_call>...</tool_call>"``),
or a dict ``{"text": ..., "token_delay_s": 0.01}`` / ``{"token_ids": [...]}``. Text is encoded
with the tokenizer, and the EOS id is appended unless the text already ends with it, as a real
engine returns it. ``max_tokens`` is honoured (finish_reason "length", no EOS).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.errors import UserError
from backend.generators.base import Generation, GenerationError, Generator, Request


class ScriptError(UserError):
    """A script that cannot be replayed; the message says which entry and why."""


def load_script(path: str) -> list[Any]:
    """A JSON list of entries, or JSONL with one entry per line."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ScriptError(f"{path}:{i}: invalid JSON ({e.msg})") from None
    try:
        return check_script(data)
    except ScriptError as e:
        raise ScriptError(f"{path}: {e}") from None


def parse_script(text: str, *, max_token_delay_s: float | None = None) -> list[Any]:
    """A script typed as JSON text (the playground's box): a list, or ``{"script": [...]}``."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError as e:
        raise ScriptError(f"invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    return check_script(data, max_token_delay_s=max_token_delay_s)


def check_script(data: Any, *, max_token_delay_s: float | None = None) -> list[Any]:
    """The entries of a script (a list, or ``{"script": [...]}``), each checked; an entry's own
    ``token_delay_s`` must be a number in ``0..max_token_delay_s`` when a maximum is given (a
    public server's: a visitor's delay must not hold a run slot for ever)."""
    if isinstance(data, dict) and "script" in data:
        data = data["script"]
    if not isinstance(data, list) or not data:
        raise ScriptError("a script is a non-empty JSON list of model outputs (one per assistant turn)")
    for i, e in enumerate(data):
        check_entry(i, e, max_token_delay_s)
    return data


def check_entry(i: int, e: Any, max_token_delay_s: float | None = None) -> None:
    """Raise :class:`ScriptError` unless script entry ``i`` is a string, or an object with
    ``text`` or ``token_ids`` (and a ``token_delay_s`` within ``0..max_token_delay_s``)."""
    if isinstance(e, str):
        return
    if isinstance(e, dict) and (isinstance(e.get("text"), str) or isinstance(e.get("token_ids"), list)):
        if "token_delay_s" in e:
            d = e["token_delay_s"]
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not (d >= 0) or d == float("inf"):
                raise ScriptError(f"script entry {i}: token_delay_s must be a number of seconds >= 0")
            if max_token_delay_s is not None and d > max_token_delay_s:
                raise ScriptError(f"script entry {i}: token_delay_s {d:g} is over this server's limit of {max_token_delay_s:g} s")
        return
    raise ScriptError(f"script entry {i} must be a string or an object with 'text' or 'token_ids'")


class ScriptedGenerator(Generator):
    name = "scripted"
    label = "scripted"
    decodes = False  # it replays given text, checked against the constraint here

    def __init__(self, tokenizer: Any, script: list[Any], *, token_delay_s: float = 0.0,
                 stop_token_ids: tuple[int, ...] | list[int] | None = None,
                 encode: Callable[[str], list[int]] | None = None):
        for i, e in enumerate(script):
            check_entry(i, e)
        self.tokenizer = tokenizer
        self.script = list(script)
        self.token_delay_s = token_delay_s
        self.calls = 0
        self.eos_id = tokenizer.eos_token_id
        # how a script's text becomes the ids the model generated (TokenizerBundle.encode_generated:
        # Mistral's control tokens are not produced by encoding text)
        self._encode = encode or (lambda text: tokenizer.encode(text, add_special_tokens=False))
        # a script's text that already ends with one of these (gpt-oss's <|call|>, Llama's
        # <|eom_id|>) ended its turn there: no EOS is added after it
        self.stop_ids = tuple(stop_token_ids) if stop_token_ids else ((self.eos_id,) if self.eos_id is not None else ())

    def _ids(self, entry: Any) -> list[int]:
        if isinstance(entry, dict) and "token_ids" in entry:
            return [int(t) for t in entry["token_ids"]]
        text = entry if isinstance(entry, str) else entry["text"]
        ids = self._encode(text)
        if self.eos_id is not None and (not ids or ids[-1] not in self.stop_ids):
            ids.append(self.eos_id)
        return ids

    async def _generate(self, request: Request) -> Generation:
        params, constraint = request.params, request.constraint
        turn = self.calls
        if turn >= len(self.script):
            raise GenerationError(f"the script has {len(self.script)} entries; turn {turn + 1} has none")
        self.calls += 1
        entry = self.script[turn]
        ids = self._ids(entry)
        if constraint is not None:
            # a real backend would have been forced to obey; a script that does not is a bad
            # script. A script is given text: checked by what the schema accepts (any key order,
            # JSON whitespace, unlisted keys the schema allows), not by the generation grammar.
            from backend.tool_choice import check_given

            why = check_given(constraint, self.tokenizer, ids, stop_ids=self.stop_ids)
            if why:
                raise GenerationError(f"script entry {turn} does not obey the decoding constraint: {why}")
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids = ids[: params.max_tokens]
            finish = "length"
        delay = entry.get("token_delay_s", self.token_delay_s) if isinstance(entry, dict) else self.token_delay_s
        if request.on_tokens is not None or delay:
            for t in ids:
                if delay:
                    await asyncio.sleep(delay)
                request.emit([t])
        return Generation(token_ids=ids, finish_reason=finish, info={"script_turn": turn})

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "script_entries": len(self.script)}
