"""Helpers for the capture gateway's tests (a helper module, not a test file): a gateway served
in-process by uvicorn on a free loopback port, and verl 0.9.1's Continuous Token builder replaying
a captured branch from the messages the harness sent and the ids the model generated."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from verl_oracle import verl_builder

from backend.gateway.core import Gateway
from backend.gateway.server import create_app
from backend.generators.scripted import ScriptedGenerator


def scripted_gateway(bundle, script: list[Any], capture_dir: str | Path, **kw: Any) -> Gateway:
    """A gateway whose sessions each replay ``script`` from the start."""
    token_delay_s = kw.pop("token_delay_s", 0.0)

    def generator_for(session: str) -> ScriptedGenerator:
        return ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                                 encode=bundle.encode_generated, token_delay_s=token_delay_s)

    return Gateway(bundle, generator_for, capture_dir=str(capture_dir), served_model="scripted", **kw)


@contextlib.contextmanager
def serving(gateway: Gateway, *, key: str | None = None) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of ``gateway``'s app, served by uvicorn in a thread until the block ends."""
    server = uvicorn.Server(uvicorn.Config(create_app(gateway, key=key), host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def read_capture(capture_dir: str | Path, session: str) -> list[dict[str, Any]]:
    """The branches of ``session``'s capture file (JSON, one per line)."""
    with open(Path(capture_dir) / f"{session}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def generated_ids(bundle, text: str) -> list[int]:
    """What the scripted model returns for ``text``: its encoding, then EOS unless it ended on a stop token."""
    ids = bundle.encode_generated(text)
    return ids if ids and ids[-1] in bundle.stop_token_ids else [*ids, bundle.tokenizer.eos_token_id]


def verl_session(bundle, family: str, first: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 turns: list[tuple[list[int], list[dict[str, Any]]]]) -> tuple[list[int], list[int], list[int]]:
    """verl 0.9.1's builder over one linear session: ``first`` (the first request's messages)
    rendered by ``build_initial_tokens``; then for each turn the ids the model generated
    (``merge_assistant_tokens``) and the messages the harness's next request added after them
    (``merge_context_tokens``, the previous messages being the harness's own, as it sent them).
    Each turn's ``new`` is ``(assistant message as the harness sent it back, then the new
    messages)``; the last turn's is ``[]``. Returns ``(prompt_ids, response_ids, response_mask)``
    split as verl splits them."""
    builder = verl_builder(bundle, family)
    schemas = list(tools or [])
    messages = [copy.deepcopy(m) for m in first]
    ids = builder.build_initial_tokens(messages, tools=schemas)
    mask: list[int] = []
    for generated, new in turns:
        merge = builder.merge_assistant_tokens(ids, list(generated))
        mask, _ = builder.align_response_metadata(merge, mask, None)
        ids = merge.token_ids
        if not new:
            continue
        assistant, *added = new
        previous = [*messages, copy.deepcopy(assistant)]
        messages = previous + [copy.deepcopy(m) for m in added]
        merge = builder.merge_context_tokens(previous, messages, ids, tools=schemas)
        mask, _ = builder.align_response_metadata(merge, mask, None)
        ids = merge.token_ids
    response = ids[len(ids) - len(mask):]
    return list(ids[: len(ids) - len(mask)]), list(response), list(mask)
